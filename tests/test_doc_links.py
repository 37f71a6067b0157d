"""Every pointer into the documentation resolves: a docstring or comment of the package (or a doc
page) that names ``docs/x.md`` or ``x.md "Section"`` points to a page that exists and to a section
heading of it; markdown links ``[text](path#anchor)`` of README.md and docs/ point to files that
exist and to headings that exist.

A quoted section matches a heading of the page when the heading (backticks dropped) starts with it:
``conventions.md "Scalars"`` finds "### Scalars (alpha, beta, value)".  Pages outside the
repository (``../shared/...``, the spec sources) are not checked.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("cudnn_compat", "tools", "benchmarks", "examples", "tests")
EXTERNAL = ("../", "/", "path/to/", "seed_inventory.md", "shared/")

# a page reference, then optionally a quoted section (possibly in a Python string, \"...\", and
# possibly after a line break inside a comment or docstring) or a numbered one (§N)
REF = re.compile(
    r"(?<![\w./-])((?:\.\./)*[\w./-]*?\b(?!self\.)([\w-]+)\.md|README)\b"
    r"(?:\)?[ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?(?:\\?\"([\w`][^\"\\\n]*(?:\n[ \t]*#?[ \t]*[^\"\\\n]+)?)\\?\""
    r"(?:\s+and\s+\\?\"([\w`][^\"\\\n]*)\\?\")?|§\s?([\d.]+\d)))?")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)


def sources() -> list:
    files = [p for d in SOURCE_DIRS for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".pyi", ".md")
             and p.name != "test_doc_links.py"]  # its docstring shows the forms
    return files + sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def page(name: str, where: Path) -> "Path | None":
    """The file a reference names: relative to the repository root, to docs/, or to the referring file."""
    for base in (ROOT, ROOT / "docs", where.parent):
        p = (base / name).resolve()
        if p.is_file():
            return p
    return None


def headings(p: Path) -> list:
    text = re.sub(r"^```.*?^```", "", p.read_text(), flags=re.M | re.S)  # no '#' comments of code blocks
    return [h.replace("`", "").strip() for h in HEADING.findall(text)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def section_ok(p: Path, section: str) -> bool:
    section = re.sub(r"\s+", " ", section).strip()
    return any(h.startswith(section) for h in headings(p))


def references() -> list:
    """[(where, name, section or None)] of every page reference in the sources."""
    out = []
    for f in sources():
        text = f.read_text()
        for m in REF.finditer(text):
            name = "README.md" if m.group(1) == "README" else m.group(1)
            if m.group(1) == "README" and not (m.group(3) or m.group(5)):
                continue  # "README" as a word
            if name.startswith(EXTERNAL) or "/shared/" in name or name.endswith("seed_inventory.md"):
                continue
            line = text.count("\n", 0, m.start()) + 1
            where = f"{f.relative_to(ROOT)}:{line}"
            sections = [s for s in (m.group(3), m.group(4)) if s]
            if m.group(5):
                sections.append(m.group(5))
            out.append((f, where, name, sections))
    return out


REFS = references()


def test_references_found():
    """The scanner sees the known references (so a broken regex cannot pass silently)."""
    names = {(n, tuple(s)) for _, _, n, s in REFS}
    assert ("docs/conventions.md", ("Scalars",)) in names or ("docs/conventions.md", ("Scalars", "Data")) in names
    assert any(n.endswith("graph_ops.md") for n, _ in names)
    assert len(REFS) > 30


@pytest.mark.parametrize("f, where, name, sections", REFS, ids=[w for _, w, _, _ in REFS])
def test_reference_resolves(f, where, name, sections):
    p = page(name, f)
    assert p is not None, f"{where}: {name} does not exist"
    for s in sections:
        assert section_ok(p, s), f"{where}: {name} has no section {s!r} (headings: {headings(p)})"


def links() -> list:
    out = []
    for f in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        text = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), f.read_text(), flags=re.M | re.S)
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            out.append((f, f"{f.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", target))
    return out


LINKS = links()


@pytest.mark.parametrize("f, where, target", LINKS, ids=[w for _, w, _ in LINKS])
def test_markdown_link_resolves(f, where, target):
    path, _, anchor = target.partition("#")
    p = (f.parent / path).resolve() if path else f
    assert p.exists(), f"{where}: {target}: {path} does not exist"
    if anchor:
        assert anchor in {slug(h) for h in headings(p)}, f"{where}: {target}: no heading with anchor #{anchor}"


# -- the docs speak to users ------------------------------------------------------------------------

PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
SOURCE_NAMES = {"002": "cuDNN 8.0 API reference", "000": "graph API developer guide", "004": "forum"}


@pytest.mark.parametrize("p", PAGES, ids=[p.name for p in PAGES])
def test_page_has_no_internal_references(p):
    """No internal issue numbers or planning words; a spec source cited by its file code (002, ...)
    is named in words on the same page."""
    text = p.read_text()
    for pattern in (r"\bissue\s+#?\d+", r"\bseed\s+\d{3}\b", r"\binventory\b", r"\bin progress\b", r"shared/"):
        m = re.search(pattern, text, re.I)
        assert not m, f"{p.name}: {m.group(0)!r} means nothing to a user"
    for code, words in SOURCE_NAMES.items():
        if re.search(rf"(?<![\w.§-]){code}(?![\w.])", text):
            assert words.lower() in re.sub(r"\s+", " ", text).lower(), f"{p.name} cites {code} without saying what it is ({words!r})"
