"""Coverage of the cuDNN 8.0 legacy surface (issue 7): every function of tests/seed_functions.txt
(the 258 function sections of 002 plus the 5 removed in 8.0 that v7 code still calls; generated
by tools/gen_seed_functions.py) must exist in ``cudnn_compat`` under its C name and its CuPy 13
name, and be called by at least one test file under tests/ other than this one.

Names in tests/coverage_pending.txt (families still being written) are exempt; a pending name
that is already covered is reported as a warning so the list can be emptied.  Run this file as
a script for the counts:  python tests/test_coverage.py
"""
from __future__ import annotations

import pathlib
import re
import sys
import warnings

if __name__ == "__main__":  # run as a script from anywhere
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import cudnn_compat as cc  # noqa: E402
from cudnn_compat._core.registry import CUPY_NAMES, cupy_name  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


def _names(path: pathlib.Path) -> list:
    return [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines() if ln.split("#", 1)[0].strip()]


SEED = _names(HERE / "seed_functions.txt")
PENDING = set(_names(HERE / "coverage_pending.txt"))


def spellings(c_name: str) -> list:
    """The C name and its CuPy 13 names: those registered for it (CuPy spelled some its own way,
    RNNForwardInference, activationForward_v4), else the derived one (cudnnAddTensor -> addTensor)."""
    names = sorted(k for k, v in CUPY_NAMES.items() if v == c_name)
    return [c_name] + (names or [cupy_name(c_name)])


def _test_sources() -> str:
    files = [p for p in HERE.rglob("*.py") if p.name != pathlib.Path(__file__).name]
    return "\n".join(p.read_text(errors="replace") for p in files)


def _called(c_name: str, text: str) -> bool:
    """The C name anywhere as a word, or a CuPy spelling used as an attribute (``cc.setTensor``)."""
    if re.search(rf"\b{re.escape(c_name)}\b", text):
        return True
    return any(re.search(rf"\.{re.escape(n)}\b", text) for n in spellings(c_name)[1:])


def missing_spellings() -> dict:
    return {n: [s for s in spellings(n) if not callable(getattr(cc, s, None))] for n in SEED}


def uncovered() -> list:
    text = _test_sources()
    return [n for n in SEED if not _called(n, text)]


def test_seed_list_is_complete():
    assert len(SEED) == 263 and len(set(SEED)) == 263


def test_pending_names_are_seed_functions():
    stray = sorted(PENDING - set(SEED))
    assert not stray, f"coverage_pending.txt names functions outside the seed list: {stray}"


def test_every_function_exists_under_both_spellings():
    missing = {n: m for n, m in missing_spellings().items() if m and n not in PENDING}
    assert not missing, f"{len(missing)} functions lack a spelling: {missing}"


def test_every_function_is_called_by_a_test():
    bare = [n for n in uncovered() if n not in PENDING]
    assert not bare, f"{len(bare)} functions are called by no test: {bare}"


def test_report_pending_names_that_have_landed():
    spelled = {n for n, m in missing_spellings().items() if not m}
    done = sorted(PENDING & spelled - set(uncovered()))
    if done:
        warnings.warn(f"coverage_pending.txt lists {len(done)} functions that now exist and are tested: {done}")


def report() -> str:
    spelled = sum(1 for m in missing_spellings().values() if not m)
    bare = set(uncovered())
    tested = sum(1 for n in SEED if n not in bare)
    both = sum(1 for n, m in missing_spellings().items() if not m and n not in bare)
    return (f"{len(SEED)} seed functions: {spelled} under both spellings, {tested} called by a test, "
            f"{both} both; {len(PENDING)} pending")


if __name__ == "__main__":
    print(report())
    for name in sorted(set(uncovered()) | {n for n, m in missing_spellings().items() if m}):
        print(("pending  " if name in PENDING else "MISSING  ") + name)
