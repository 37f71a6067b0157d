"""Configuration never breaks import (issue 13, item 11): ``cudnn_compat/_backend/config.py`` declares every
variable; a value that is not understood warns once (``ConfigWarning``) and the default is used;
the package reads CUDNN_COMPAT_* only through it; ``cudnn-compat doctor`` lists every variable."""
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

import pytest

import cudnn_compat as cc
from cudnn_compat._backend import config
from cudnn_compat.tools import cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBRARY_VARS = [v.name for v in config.VARIABLES if v.scope == config.LIBRARY]

# name -> (values understood and what they parse to, values not understood)
CASES = {
    "CUDNN_COMPAT_DEVICE": ({"cpu": "cpu", " GPU ": "gpu"}, ["tpu", "cuda", "0"]),
    "CUDNN_COMPAT_ENGINE": ({"cupy": "cupy", "reference": "reference"}, ["a b", "x/y", "eng;ine"]),
    "CUDNN_COMPAT_CPU_FALLBACK": ({"0": False, "on": True}, ["2", "sometimes"]),
    "CUDNN_COMPAT_PLAN_CACHE_SIZE": ({"7": 7, "0": 0, " 2048 ": 2048}, ["abc", "-1", "1.5", "1e3"]),
    "CUDNN_COMPAT_PLAN_CACHE_FILE": ({"/tmp/p.json": "/tmp/p.json"}, []),
    "CUDNN_COMPAT_LOG": ({"info": "info", "DEBUG": "debug", "Warning": "warning"}, ["verbose", "2", "loud"]),
    "CUDNN_COMPAT_TRACE": ({}, ["/no/such/folder/t.jsonl", "/"]),
    "CUDNN_COMPAT_TRACE_TENSORS": ({"1": True, "off": False, "YES": True}, ["2", "maybe"]),
    "CUDNN_COMPAT_SHIM": ({"1": "on", "stub": "stub", "no": "off"}, ["sometimes", "2"]),
    "CUDNN_COMPAT_DUMP_KERNELS": ({"/tmp/k": "/tmp/k"}, []),
    "CUDNN_COMPAT_RNN_GRAPHS": ({"0": False, "true": True}, ["2", "never"]),
    "CUDNN_COMPAT_CUPY_GRAPHS": ({"1": True, "off": False}, ["yes please"]),
    "CUDNN_COMPAT_COMPILED": ({"0": False, "1": True}, ["compiled"]),
    "CUDNN_COMPAT_CUDNN_GRAPHS": ({"off": False, "1": True}, ["-1", "fast"]),
    "CUDNN_COMPAT_GRAPH_REPLAY": ({"graph": "graph", "KERNELS": "kernels"}, ["1", "graphs"]),
    "CUDNN_COMPAT_CUDNN_AUTOTUNE": ({"4": 4, "1": 1}, ["0", "-3", "all"]),
}


@pytest.fixture(autouse=True)
def fresh_config():
    config.reload()
    yield
    config.reload()


def test_every_library_variable_has_cases():
    assert sorted(CASES) == sorted(LIBRARY_VARS)


@pytest.mark.parametrize("name", LIBRARY_VARS)
def test_good_values_parse(name, monkeypatch):
    good, _ = CASES[name]
    for raw, value in good.items():
        monkeypatch.setenv(name, raw)
        with warnings.catch_warnings():
            warnings.simplefilter("error", config.ConfigWarning)
            assert config.get(name) == value, raw
        st = config.setting(name)
        assert st.understood and st.raw == raw and st.value == value


def test_trace_path_in_an_existing_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_COMPAT_TRACE", str(tmp_path / "t.jsonl"))
    assert config.get("CUDNN_COMPAT_TRACE") == str(tmp_path / "t.jsonl")


@pytest.mark.parametrize("name", LIBRARY_VARS)
def test_bad_values_warn_once_and_use_the_default(name, monkeypatch):
    _, bad = CASES[name]
    default = config.TABLE[name].default
    for raw in bad:
        monkeypatch.setenv(name, raw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert config.get(name) == default
            assert config.get(name) == default  # read again: no second warning
            monkeypatch.setenv(name, raw)  # set again to the same value (a new string): still once
            assert config.setting(name).value == default
        mine = [w for w in caught if issubclass(w.category, config.ConfigWarning)]
        assert len(mine) == 1, (raw, [str(w.message) for w in caught])
        text = str(mine[0].message)
        assert name in text and repr(raw) in text and "default" in text
        st = config.setting(name)
        assert (st.understood, st.raw, st.value) == (False, raw, default) and st.problem


@pytest.mark.parametrize("name", LIBRARY_VARS)
def test_unset_and_empty_are_the_default(name, monkeypatch):
    default = config.TABLE[name].default
    monkeypatch.delenv(name, raising=False)
    assert config.get(name) == default and config.setting(name).understood and not config.setting(name).is_set
    monkeypatch.setenv(name, "  ")
    assert config.get(name) == default and config.setting(name).understood


def test_values_follow_the_environment_at_run_time(monkeypatch):
    read = config.getter("CUDNN_COMPAT_ENGINE")
    monkeypatch.delenv("CUDNN_COMPAT_ENGINE", raising=False)
    assert read() is None
    monkeypatch.setenv("CUDNN_COMPAT_ENGINE", "cupy")
    assert read() == "cupy" and config.get("CUDNN_COMPAT_ENGINE") == "cupy"
    from cudnn_compat._backend.heuristics import forced_engine
    assert forced_engine() == "cupy"
    monkeypatch.setenv("CUDNN_COMPAT_ENGINE", "reference")
    assert read() == forced_engine() == "reference"
    monkeypatch.setenv("CUDNN_COMPAT_PLAN_CACHE_SIZE", "7")
    from cudnn_compat._backend.plan_cache import PlanCache
    assert PlanCache().maxsize == 7
    monkeypatch.setenv("CUDNN_COMPAT_PLAN_CACHE_SIZE", "seven")
    with pytest.warns(config.ConfigWarning, match="CUDNN_COMPAT_PLAN_CACHE_SIZE"):
        assert PlanCache().maxsize == 1024
    monkeypatch.setenv("CUDNN_COMPAT_DEVICE", "cpu")
    from cudnn_compat._core.place import default_place
    assert default_place() == "cpu"
    with pytest.raises(KeyError):
        config.getter("CUDNN_COMPAT_NOT_DECLARED")


def test_reload_warns_again(monkeypatch):
    monkeypatch.setenv("CUDNN_COMPAT_LOG", "verbose")
    with pytest.warns(config.ConfigWarning):
        config.get("CUDNN_COMPAT_LOG")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.get("CUDNN_COMPAT_LOG")  # once
    config.reload()
    with pytest.warns(config.ConfigWarning):
        config.get("CUDNN_COMPAT_LOG")


def _run(code: str, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("CUDNN_COMPAT_")}
    full.update(env, PYTHONPATH=str(ROOT), PYTHONWARNINGS="default")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=str(ROOT),
                          timeout=180)


BAD_ENV = {"CUDNN_COMPAT_PLAN_CACHE_SIZE": "abc", "CUDNN_COMPAT_TRACE": "/no/such/folder/run.jsonl",
           "CUDNN_COMPAT_DEVICE": "tpu", "CUDNN_COMPAT_LOG": "verbose", "CUDNN_COMPAT_CUDNN_AUTOTUNE": "lots",
           "CUDNN_COMPAT_RNN_GRAPHS": "sometimes"}


def test_import_with_bad_values_warns_once_each_and_uses_defaults():
    code = ("import logging, cudnn_compat as cc\n"
            "from cudnn_compat._core.place import default_place, gpu_reason\n"
            "assert cc.plan_cache_info().maxsize == 1024\n"
            "assert cc.trace.active() is None\n"
            "assert default_place() == ('gpu' if gpu_reason() is None else 'cpu')\n"
            "log = logging.getLogger('cudnn_compat')\n"
            "assert log.level == logging.NOTSET and all(type(h) is logging.NullHandler for h in log.handlers)\n"
            "h = cc.cudnnCreate(); cc.cudnnDestroy(h)\n"
            "print('imported')\n")
    p = _run(code, **BAD_ENV)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "imported"
    for name, raw in BAD_ENV.items():
        lines = [ln for ln in p.stderr.splitlines() if "ConfigWarning" in ln and f"{name}=" in ln]
        assert len(lines) == 1, (name, p.stderr)
        assert repr(raw) in lines[0]
    assert "Traceback" not in p.stderr


def test_each_bad_value_alone_never_raises_at_import():
    for name, raw in BAD_ENV.items():
        p = _run("import cudnn_compat; print('ok')", **{name: raw})
        assert p.returncode == 0 and p.stdout.strip() == "ok", (name, p.stderr)
        assert p.stderr.count("ConfigWarning") == 1, (name, p.stderr)


def test_doctor_runs_and_lists_every_variable(monkeypatch, capsys):
    for k, v in BAD_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CUDNN_COMPAT_PLAN_CACHE_FILE", "/tmp/plans.json")
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {c["name"]: c for c in report["configuration"]}
    assert list(rows) == [v.name for v in config.VARIABLES]
    for name, raw in BAD_ENV.items():
        assert rows[name]["raw"] == raw and rows[name]["understood"] is False and rows[name]["note"]
        assert rows[name]["value"] == config.TABLE[name].default
    assert rows["CUDNN_COMPAT_PLAN_CACHE_FILE"]["understood"] is True
    assert rows["CUDNN_COMPAT_PLAN_CACHE_FILE"]["value"] == "/tmp/plans.json"
    assert rows["CUDNN_COMPAT_SHIM"] == {**rows["CUDNN_COMPAT_SHIM"], "set": False, "understood": True, "value": "off"}
    assert report["CUDNN_COMPAT_DEVICE"] == "tpu"
    assert cli.main(["doctor"]) == 0
    text = capsys.readouterr().out
    for name, raw in BAD_ENV.items():
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(name + " "))
        assert "NOT UNDERSTOOD" in line and repr(raw) in line
    assert "CUDNN_COMPAT_PLAN_CACHE_FILE   '/tmp/plans.json' -> '/tmp/plans.json'" in text
    assert "not understood (the default is used): " in text


def test_doctor_command_runs_with_bad_values():
    env = dict(BAD_ENV, CUDNN_COMPAT_ENGINE="tpu")
    p = _run("import sys; from cudnn_compat.tools.cli import main; sys.exit(main(['doctor']))", **env)
    assert p.returncode == 0, p.stderr
    assert "CUDNN_COMPAT_PLAN_CACHE_SIZE   'abc' NOT UNDERSTOOD" in p.stdout
    assert "no engine named 'tpu'" in p.stdout


# -- one table, read only through it --------------------------------------------------------------

_ALLOWED_RAW = {  # file -> why it touches os.environ for a CUDNN_COMPAT_* variable
    "cudnn_compat/tools/replay.py": "sets CUDNN_COMPAT_ENGINE around a replay and restores it (a write)",
    "cudnn_compat/tools/demo.py": "unsets CUDNN_COMPAT_ENGINE around the reference run and restores it (a write)",
    "cudnn_compat/cupy13/shim.py": "the .pth start-up gate (one lookup before importing anything; then config parses)",
}


def _sources():
    for pkg in ("cudnn_compat",):  # the graph layer is cudnn_compat/_backend
        for p in sorted((ROOT / pkg).rglob("*.py")):
            yield p.relative_to(ROOT).as_posix(), p.read_text()


def test_no_direct_environment_reads_of_our_variables():
    offenders = []
    for rel, text in _sources():
        if rel == "cudnn_compat/_backend/config.py":
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if re.search(r"(os\.environ|getenv)", line) and "CUDNN_COMPAT_" in line and rel not in _ALLOWED_RAW:
                offenders.append(f"{rel}:{i}: {line.strip()}")
            if re.search(r"os\.environ\._data|encodekey", line):
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "read these through _backend.config:\n" + "\n".join(offenders)


def test_every_variable_named_in_the_package_is_declared():
    named = set()
    for rel, text in _sources():
        named |= set(re.findall(r"\bCUDNN_COMPAT_[A-Z0-9_]*[A-Z0-9]\b", text))
    for text in (p.read_text() for p in (ROOT / "tests").glob("*.py")):
        named |= {n for n in re.findall(r"os\.environ\.get\(\s*\"(CUDNN_COMPAT_[A-Z0-9_]+)\"", text)}
    named -= {"CUDNN_COMPAT_NOT_DECLARED"}
    assert named <= set(config.TABLE), sorted(named - set(config.TABLE))


def test_readme_environment_table_lists_every_variable():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Environment"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| `([A-Z0-9_]+)(?:=[^`]*)?` \|", section, re.M)
    assert sorted(rows) == sorted(config.TABLE), sorted(set(config.TABLE) ^ set(rows))


def test_graph_layer_imports_nothing_of_cudnn_compat():
    """``_backend`` (installed as ``cudnn_compat._backend``) imports only itself, relatively: the
    layering rule of docs/architecture.md, config.py included."""
    offenders = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}" for p in sorted((ROOT / "cudnn_compat" / "_backend").rglob("*.py"))
                 for m in re.finditer(r"^\s*(from|import)\s+(cudnn_compat|_backend)\b.*$", p.read_text(), re.M)]
    assert not offenders, offenders


def test_log_level_configures_the_logger():
    p = _run("import logging, cudnn_compat; print(logging.getLogger('cudnn_compat').level)", CUDNN_COMPAT_LOG="debug")
    assert p.returncode == 0 and p.stdout.strip() == str(10), p.stderr
