"""The layout rules of issue 15 ("the layout is the concept map"; docs/architecture.md "The tree"):

* no module of ``cudnn_compat/`` or ``cudnn_compat/_backend/`` is over 800 lines, except generated tables
  (``GENERATED``: each names its generator in its first line and says "do not edit");
* names say what they are: no module called ``fusion`` (``tools/fuse.py`` is the fuse() scope,
  ``fused_ops.py`` the cudnnFusedOps API, ``cupy_engine/grouping.py`` the engine's kernel grouping)
  and one thing called "backend" (the graph layer ``cudnn_compat/_backend/``; the backend API is ``graph_api/``);
* one home per family: the convolution and RNN modules, the CuPy 13 modules and the tools live in
  their subpackage, not at the top of ``cudnn_compat/``.

That ``_backend`` imports nothing of ``cudnn_compat`` and that there are no import cycles is
tests/test_import_graph.py.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cudnn_compat",)  # cudnn_compat/_backend included
MAX_LINES = 800

# generated files (path -> the generator that writes it); exempt from MAX_LINES
GENERATED = {
    "cudnn_compat/__init__.pyi": "tools/gen_stubs.py",
    "cudnn_compat/_core/signatures.py": "tools/gen_signatures.py",
    "cudnn_compat/_core/docstrings.py": "tools/gen_api_docs.py",
}


def modules() -> list:
    return sorted(p for d in PACKAGES for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".pyi")
                  and "__pycache__" not in p.parts)


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def n_lines(p: Path) -> int:
    return len(p.read_text(encoding="utf-8").splitlines())


def says_generated(p: Path) -> bool:
    head = "\n".join(p.read_text(encoding="utf-8").splitlines()[:3]).lower()
    return "generated" in head and "do not edit" in head


def test_the_walk_sees_both_packages():
    names = {rel(p) for p in modules()}
    assert {"cudnn_compat/__init__.py", "cudnn_compat/_backend/planner.py", "cudnn_compat/_core/call.py"} <= names
    assert len(names) > 80


def test_no_module_over_800_lines_except_generated_tables():
    over = {rel(p): n_lines(p) for p in modules() if rel(p) not in GENERATED and n_lines(p) > MAX_LINES}
    assert not over, "over %d lines (split by concept, or generate it): %s" % (
        MAX_LINES, ", ".join(f"{k} ({v})" for k, v in sorted(over.items())))


def test_generated_files_are_exactly_those_that_say_so():
    """The exemption list is the files whose first lines say "generated ... do not edit"."""
    assert {rel(p) for p in modules() if says_generated(p)} == set(GENERATED)


@pytest.mark.parametrize("path, generator", sorted(GENERATED.items()))
def test_each_generated_file_names_its_generator(path, generator):
    assert (ROOT / generator).is_file(), f"{path}: generator {generator} does not exist"
    first = (ROOT / path).read_text(encoding="utf-8").splitlines()[0]
    assert generator in first, f"{path}: first line does not name {generator}: {first!r}"


def test_no_module_is_called_fusion():
    """Three things were called "fusion"; each now has its own name (issue 15 item 2)."""
    bad = [rel(p) for p in modules() if p.stem == "fusion" or "fusion" in p.relative_to(ROOT).parts[:-1]]
    assert not bad, bad


def test_one_thing_is_called_backend():
    """``cudnn_compat/_backend/`` is the graph layer; nothing inside either package is named "backend"."""
    bad = sorted({"/".join(p.relative_to(ROOT).parts[:i + 1]) for p in modules()
                  for i, part in enumerate(p.relative_to(ROOT).parts)
                  if i > 0 and "backend" in part and p.relative_to(ROOT).parts[:i + 1] != ("cudnn_compat", "_backend")})
    assert not bad, bad


# where each family's modules live: a top-level module of cudnn_compat/ whose name matches is misplaced
HOMES = {
    "convolution": r"(conv|cnn)",
    "rnn": r"rnn",
    "graph_api": r"backend",
    "cupy13": r"(cupy|cupyx)_|shim$",
    "tools": r"(trace|replay|explain|fuse|fusion|diff|cli|demo)$",
}


@pytest.mark.parametrize("home, pattern", sorted(HOMES.items()))
def test_each_family_has_one_home(home, pattern):
    assert (ROOT / "cudnn_compat" / home / "__init__.py").is_file(), f"cudnn_compat/{home}/ is no package"
    misplaced = [rel(p) for p in (ROOT / "cudnn_compat").glob("*.py") if re.match(pattern, p.stem)]
    assert not misplaced, f"belong in cudnn_compat/{home}/: {misplaced}"
