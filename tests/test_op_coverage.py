"""Which op kinds each engine runs (issue 18, "Done when"): every op kind of the graph IR
(``ops.OP_SPECS``, assembled from the family modules of ``cudnn_compat/_backend/ops/``) is listed with each
engine's support; a kind that the reference engine runs and no GPU engine runs is a gap, and every
gap must be listed, with its reason and what happens, in docs/not_supported.md "Op kinds without a
GPU engine" (and nothing else may be listed there).  The declarations are checked against what the
engines do with a graph of each declined kind, and ``cudnn-compat doctor --ops`` prints them."""
import json
import pathlib
import re
from types import SimpleNamespace

import pytest

from cudnn_compat.tools import cli
from cudnn_compat._backend import heuristics
from cudnn_compat._backend.engines.base import REGISTRY
from cudnn_compat._backend.ir import Operation

ROOT = pathlib.Path(__file__).resolve().parent.parent
KINDS = heuristics.all_op_kinds()
GPU_ENGINES = [n for n in heuristics.ORDER["gpu"] if n != "reference"]


def support_table() -> dict:
    """kind -> {engine: None (runs it) | reason}, over every registered engine that declares kinds."""
    table = {k: {} for k in KINDS}
    for name in REGISTRY.engines:
        declared = heuristics.engine_op_kinds(name)
        if declared is None:
            continue
        for k in KINDS:
            table[k][name] = declared.get(k, "not declared")
    return table


def gaps() -> dict:
    """kind -> {GPU engine: reason}: the kinds no GPU engine declares."""
    table = support_table()
    return {k: {e: table[k][e] for e in GPU_ENGINES if e in table[k]} for k in KINDS
            if table[k].get("reference", "") is None and not any(table[k].get(e, "") is None for e in GPU_ENGINES)}


def documented() -> dict:
    """kind -> (reason, what happens) from docs/not_supported.md "Op kinds without a GPU engine"."""
    text = (ROOT / "docs" / "not_supported.md").read_text()
    start = text.index("## Op kinds without a GPU engine")
    section = text[start:]
    nxt = section.find("\n## ", 1)
    section = section if nxt < 0 else section[:nxt]
    rows = re.findall(r"^\| `(\w+)` \|([^|]*)\|([^|]*)\|([^|]*)\|\s*$", section, re.M)
    return {k: (reason.strip(), what.strip()) for k, _fns, reason, what in rows}


def test_every_engine_declares_every_kind():
    assert len(KINDS) >= 20 and {"CTCLoss", "SpatialTfSamplerForward", "RNNRecurrence", "Pointwise"} <= set(KINDS)
    table = support_table()
    for name in ("reference", "cupy", "cudnn"):
        assert all(name in table[k] for k in KINDS), name
    for k, row in table.items():
        for eng, why in row.items():
            assert why is None or (isinstance(why, str) and why.strip() and why != "not declared"), (k, eng, why)


def test_reference_engine_runs_every_kind():
    from cudnn_compat._backend.engines.reference import KERNELS
    assert sorted(KERNELS) == KINDS
    assert all(v is None for v in heuristics.engine_op_kinds("reference").values())


def test_doctor_ops_names_the_kinds_only_this_machine_lacks(monkeypatch):
    from cudnn_compat._backend import heuristics
    monkeypatch.setattr(heuristics, "format_op_coverage", lambda rows: [])
    rows = [{"engine": "cudnn", "places": ["gpu"], "usable": None}, {"engine": "cupy", "places": ["gpu"], "usable": "no"},
            {"engine": "reference", "places": ["cpu", "gpu"], "usable": None}]
    text = cli.format_ops({"engines": rows, "without_gpu_engine": ["Rng"], "without_gpu_engine_here": ["Rng", "Softmax"]})
    assert text.splitlines()[1:] == [
        "op kinds without a GPU engine (CPU fallback with a CpuFallbackWarning, or NOT_SUPPORTED under "
        "CUDNN_COMPAT_CPU_FALLBACK=0; docs/not_supported.md): Rng",
        "also without a usable GPU engine on this machine: Softmax"]
    text = cli.format_ops({"engines": rows, "without_gpu_engine": [], "without_gpu_engine_here": []})
    assert text.splitlines()[1].endswith(": none") and len(text.splitlines()) == 2


def test_every_gap_is_documented_with_its_reason():
    found, doc = gaps(), documented()
    table = "\n".join(f"{k}: " + "; ".join(f"{e}: {r}" for e, r in why.items()) for k, why in found.items())
    missing = sorted(set(found) - set(doc))
    assert not missing, ("op kinds without a GPU engine must be listed in docs/not_supported.md \"Op kinds without "
                         f"a GPU engine\" with the reason and what happens: {missing}\n{table}")
    stale = sorted(set(doc) - set(found))
    assert not stale, f"docs/not_supported.md lists op kinds that a GPU engine now runs: {stale}"
    for k, (reason, what) in doc.items():
        assert len(reason) > 20, (k, reason)
        assert "CpuFallbackWarning" in what and "NOT_SUPPORTED" in what and "CUDNN_COMPAT_CPU_FALLBACK=0" in what, k
    text = (ROOT / "docs" / "not_supported.md").read_text()
    section = text[text.index("## Op kinds without a GPU engine"):]
    section = section[:section.find("\n## ", 1)]
    assert ("| op kind |" in section) == bool(found)  # no table header without rows (issue 23 item 7)
    assert ("no table" in section) == (not found)


def _graph(kind):
    return SimpleNamespace(ops=[Operation(kind, {}, {}, {})])


@pytest.mark.parametrize("kind", KINDS)
def test_declared_declines_are_what_the_engines_say(kind):
    """For each kind an engine declares it declines, the engine's own check gives that reason."""
    cupy = heuristics.engine_op_kinds("cupy")[kind]
    if cupy is not None:
        assert REGISTRY.engines["cupy"].check_support(_graph(kind), "gpu") == cupy
    cudnn = heuristics.engine_op_kinds("cudnn")[kind]
    if cudnn is not None:
        from cudnn_compat._backend.engines.cudnn_engine.graph import Decline, candidates
        with pytest.raises(Decline) as e:
            candidates(_graph(kind))
        assert e.value.reason == cudnn
    from cudnn_compat._backend.engines.cupy_engine import IMPLS
    from cudnn_compat._backend.engines.cudnn_engine.graph import MAIN_KINDS
    assert (cupy is None) == (kind in IMPLS or kind in ("Pointwise", "Reduction"))
    assert (cudnn is None) == (kind in MAIN_KINDS or kind == "Pointwise")


def test_doctor_ops_lists_kinds_per_engine(capsys):
    assert cli.main(["doctor", "--ops"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("op kinds by engine on this machine"):]
    table = support_table()
    for name in ("cudnn", "cupy", "reference"):
        line = next(ln for ln in section.splitlines() if ln.strip().startswith(name + " "))
        runs = [k for k in KINDS if table[k][name] is None]
        listed = line.rsplit(": ", 1)[1].split(", ")
        assert listed == runs, (name, line)
    for k in KINDS:
        for name in ("cudnn", "cupy"):
            if table[k][name] is not None:
                assert f"declines {k}: {table[k][name]}" in section, (name, k)
    gap_line = next(ln for ln in section.splitlines() if ln.startswith("op kinds without a GPU engine"))
    assert gap_line.rsplit(": ", 1)[1].split(", ") == sorted(gaps()) or (not gaps() and gap_line.endswith("none"))
    # issue 23 item 7: the machine's own gaps are said once, clearly, after the general line
    after = section[section.index(gap_line) + len(gap_line):].strip().splitlines()
    report = cli.op_report()
    unusable = [e for e in report["engines"] if e["engine"] in GPU_ENGINES and e["usable"]]
    if len(unusable) == len(GPU_ENGINES):
        assert len(after) == 1 and after[0].startswith("on this machine no GPU engine is usable (")
        assert after[0].endswith("): every op kind runs on the CPU reference engine")
        assert all(f"{e['engine']}: {e['usable']}" in after[0] for e in unusable)
    else:
        extra = [k for k in report["without_gpu_engine_here"] if k not in report["without_gpu_engine"]]
        assert after == ([f"also without a usable GPU engine on this machine: {', '.join(extra)}"] if extra else [])
    assert cli.main(["doctor", "--ops", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["ops"]
    assert report["kinds"] == KINDS and report["without_gpu_engine"] == sorted(gaps())
    assert {r["engine"] for r in report["engines"]} >= {"cudnn", "cupy", "reference"}
    assert cli.main(["doctor"]) == 0
    assert "op kinds by engine" not in capsys.readouterr().out  # only with --ops
