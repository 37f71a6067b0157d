"""Every ```python block of README.md and docs/*.md runs, and prints what the document says it
prints (issue 23 item 9; the rules are docs/conventions.md, "Code blocks in the documentation").

* The blocks of one file run in order in one namespace, as a reader runs them top to bottom, in a
  fresh interpreter on the CPU place (``CUDNN_COMPAT_DEVICE=cpu``), in an empty folder, importing
  this checkout.
* A block the CPU cannot run, or a deliberate fragment, has ``<!-- doctest: skip (the reason) -->``
  on the line before its fence; the skips are counted and may not exceed ``MAX_SKIPPED``.
* Expected output: a ```text (or bare ```) block right after the python block (only blank lines
  between), else the ``# prints: TEXT`` comments of the block, one line each, in order.  Outputs
  compare with whitespace runs (line breaks included) as one space and none next to a bracket;
  ``...`` matches any text; each number matches within ``REL_TOL`` relative or ``ABS_TOL`` absolute.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
MAX_SKIPPED = 1  # docs/porting.md: the Chainer fragment
REL_TOL, ABS_TOL = 1e-3, 1e-6

FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"^<!--\s*doctest:\s*skip\s*\((.+?)\)\s*-->\s*$", re.S)
PRINTS = re.compile(r"#\s*prints:[ \t]?(.*)$", re.M)
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|\b(?:nan|inf)\b")


def examples(path: Path) -> list:
    """[{line, code, skip, expected}] of the python blocks of ``path``: ``skip`` the reason or None,
    ``expected`` the output the document shows (a list of lines) or None."""
    text = path.read_text(encoding="utf-8")
    fences = list(FENCE.finditer(text))
    out = []
    for i, m in enumerate(fences):
        if m.group(1) != "python":
            continue
        before = text[fences[i - 1].end() if i else 0:m.start()].rstrip()
        last = before.splitlines()[-1] if before else ""
        skip = SKIP.search(last)
        expected = None
        if i + 1 < len(fences):
            nxt = fences[i + 1]
            if nxt.group(1) in ("text", "") and not text[m.end():nxt.start()].strip():
                expected = nxt.group(2).splitlines()
        if expected is None and PRINTS.search(m.group(2)):
            expected = PRINTS.findall(m.group(2))
        out.append({"line": text.count("\n", 0, m.start()) + 1, "code": m.group(2),
                    "skip": skip.group(1).strip() if skip else None, "expected": expected})
    return out


EXAMPLES = {p: examples(p) for p in DOCS}
CASES = [(p, ex) for p, exs in EXAMPLES.items() for ex in exs]


def _id(case) -> str:
    p, ex = case
    return f"{p.relative_to(ROOT).as_posix()}:{ex['line']}"


# -- running: one interpreter per file -------------------------------------------------------------

DRIVER = r"""
import contextlib, io, json, sys, traceback
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
results = []
for name, code in blocks:
    out = io.StringIO()
    error = None
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "exec"), ns)
    except BaseException:  # a block that fails, SystemExit included, is reported, not fatal
        error = traceback.format_exc()
    results.append({"stdout": out.getvalue(), "error": error})
json.dump(results, open(sys.argv[2], "w"))
"""

_RESULTS: dict = {}


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("CUDNN_COMPAT_", "CUDNN_LOG"))}
    e.update(CUDNN_COMPAT_DEVICE="cpu", PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return e


def results(path: Path, tmp_dir: Path) -> list:
    """The stdout and error of each block of ``path`` that is not skipped, run once per session."""
    if path not in _RESULTS:
        run = [ex for ex in EXAMPLES[path] if not ex["skip"]]
        work = tmp_dir / path.stem
        work.mkdir(parents=True, exist_ok=True)
        (work / ".blocks.json").write_text(json.dumps([[f"{path.name}:{ex['line']}", ex["code"]] for ex in run]))
        p = subprocess.run([sys.executable, "-c", DRIVER, ".blocks.json", ".results.json"], cwd=str(work), env=env(),
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"the driver failed on {path.name}:\n{p.stdout}\n{p.stderr}"
        got = json.loads((work / ".results.json").read_text())
        _RESULTS[path] = {ex["line"]: r for ex, r in zip(run, got)}
    return _RESULTS[path]


# -- comparing ---------------------------------------------------------------------------------------

def _clean(lines) -> str:
    """Whitespace runs (line breaks included) as one space, none next to a bracket (NumPy pads
    and wraps arrays by the width of their longest element)."""
    return re.sub(r" ?([\[\]()]) ?", r"\1", " ".join(" ".join(lines).split()))


def output_matches(expected, actual: str) -> "str | None":
    """None when ``actual`` is what ``expected`` shows (the rules above), else why not."""
    want, got = _clean(expected), _clean(actual.splitlines())
    pattern, numbers, pos = [], [], 0
    for m in re.finditer(r"\.\.\.|" + NUMBER.pattern, want):
        pattern.append(re.escape(want[pos:m.start()]))
        if m.group(0) == "...":
            pattern.append(".*?")
        else:
            pattern.append(f"({NUMBER.pattern})")
            numbers.append(m.group(0))
        pos = m.end()
    pattern.append(re.escape(want[pos:]))
    m = re.fullmatch("".join(pattern), got, re.S)
    if m is None:
        return "the text differs"
    for w, g in zip(numbers, m.groups()):
        a, b = float(w), float(g)
        if not (a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= max(REL_TOL * abs(a), ABS_TOL)):
            return f"{g} where the document shows {w}"
    return None


def test_output_rules():
    assert output_matches(["y (1, 3), error: 2.4e-07"], "y (1, 3), error: 2.5e-07\n") is None
    assert output_matches(["[0.2 0.8]   1.7"], "[0.20000005 0.8 ]\n1.7") is None
    assert output_matches(["a ... b 3"], "a anything at all\nb 3") is None
    assert output_matches(["y 2.0"], "y 2.1") == "2.1 where the document shows 2.0"
    assert output_matches(["y (1, 3)"], "y (1, 4)") == "4 where the document shows 3"
    assert output_matches(["CUDNN_STATUS_BAD_PARAM 3"], "CUDNN_STATUS_NOT_SUPPORTED 9") == "the text differs"
    assert output_matches(["a"], "a\nb") == "the text differs"


# -- the tests ---------------------------------------------------------------------------------------

def test_the_documents_have_examples_and_skips_stay_few():
    assert len(CASES) >= 6, [(_id(c)) for c in CASES]
    skipped = [(_id(c), c[1]["skip"]) for c in CASES if c[1]["skip"]]
    assert len(skipped) <= MAX_SKIPPED, f"more skipped blocks than MAX_SKIPPED = {MAX_SKIPPED}: {skipped}"
    assert all(reason for _, reason in skipped), "every skip gives its reason"
    assert sum(1 for _, ex in CASES if ex["expected"] is not None) >= 2, "outputs shown and checked"


def test_skip_markers_precede_python_blocks():
    """A marker anywhere else would silently skip nothing (a typo or a moved block)."""
    for p in DOCS:
        text = p.read_text(encoding="utf-8")
        marked = sum(1 for _ in re.finditer(r"^<!--\s*doctest:", text, re.M))
        assert marked == sum(1 for ex in EXAMPLES[p] if ex["skip"]), p.name


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_doc_block(case, tmp_path_factory):
    path, ex = case
    if ex["skip"]:
        pytest.skip(ex["skip"])
    r = results(path, tmp_path_factory.getbasetemp() / "doc_examples")[ex["line"]]
    where = _id(case)
    assert r["error"] is None, f"{where} raised:\n{r['error']}\nprinted:\n{r['stdout']}"
    if ex["expected"] is not None:
        why = output_matches(ex["expected"], r["stdout"])
        assert why is None, (f"{where} printed something else ({why}):\n{r['stdout']}\nthe document shows:\n"
                             + "\n".join(ex["expected"]))
