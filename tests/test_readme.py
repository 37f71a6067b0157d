"""The documentation runs (every ```python block of README.md and docs/*.md, with the output it
shows: tests/test_doc_examples.py): here the README's quickstart output quoted in its prose, the
worked session of docs/tools.md (its ```console blocks: each ``$ command`` is run and its output must have
the shape of the output pasted under it).  Also the README's install section names the exact
commands for CUDA 12, CUDA 13 and CPU only, and the environment table gives every variable's
default as ``cudnn_compat/_backend/config.py`` declares it.

Everything runs in a fresh interpreter on the CPU place (``CUDNN_COMPAT_DEVICE=cpu``) in an
empty folder, importing this checkout.  ``python tests/test_readme.py --update`` re-runs the
session of docs/tools.md and pastes the real output into it.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TOOLS = ROOT / "docs" / "tools.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
FILE_HEADER = re.compile(r"#\s*([\w.-]+\.py)\b")


def blocks(path: Path, lang: str) -> list:
    """[(line number, code)] of the fenced blocks of ``lang`` in ``path``."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == lang]


def env(tmp_path: Path) -> dict:
    """CPU place, this checkout first on the path, and ``python`` / ``cudnn-compat`` on PATH."""
    bindir = tmp_path / ".bin"
    bindir.mkdir(exist_ok=True)
    for name, cmd in (("python", f'exec "{sys.executable}" "$@"'),
                      ("cudnn-compat", f'exec "{sys.executable}" -m cudnn_compat "$@"')):
        p = bindir / name
        p.write_text(f"#!/bin/sh\n{cmd}\n")
        p.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if not k.startswith("CUDNN_COMPAT_") and not k.startswith("CUDNN_LOG")}
    e.update(CUDNN_COMPAT_DEVICE="cpu", PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
             PATH=os.pathsep.join([str(bindir), os.environ.get("PATH", "")]), COLUMNS="100")
    return e


def run_python(code: str, cwd: Path, args=()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=str(cwd), env=env(cwd), capture_output=True,
                          text=True, timeout=300)


# -- README ---------------------------------------------------------------------------------------

README_BLOCKS = blocks(README, "python")


def test_readme_has_a_runnable_quickstart():
    assert README_BLOCKS, "README.md has no ```python block"
    for line, code in README_BLOCKS:
        assert "..." not in code, f"README.md:{line}: a code block with '...' cannot run"


def readme_commands() -> list:
    """The commands of the README's ```bash blocks with the installs dropped (they need the network;
    the test suite runs on the installed checkout) and the test-suite run itself left out."""
    out = []
    for line, code in blocks(README, "bash"):
        for cmd in code.splitlines():
            parts = [c.strip() for c in cmd.split("&&")]
            parts = [c for c in parts if c and not c.startswith("python -m pip install")
                     and not c.startswith("python -m pytest")]
            out.extend((line, c) for c in parts)
    return out


def test_readme_shell_commands_run(tmp_path):
    """``cudnn-compat demo`` of the first command (the pip installs and the pytest run are what this
    suite itself is); each other command of a ```bash block exits 0."""
    cmds = readme_commands()
    assert any(c == "cudnn-compat demo" for _, c in cmds), cmds
    for line, cmd in cmds:
        p = subprocess.run(["bash", "-c", cmd], cwd=str(tmp_path), env=env(tmp_path), capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, f"README.md:{line}: `{cmd}` exited {p.returncode}:\n{p.stdout}\n{p.stderr}"


def test_quickstart_prints_what_the_readme_says(tmp_path):
    """The sentence after the quickstart quotes its output: the numbers must be the real ones."""
    text = README.read_text()
    quoted = re.search(r"It prints `([^`]+)` and\s+`([^`]+)`", text)
    assert quoted, "README.md: the quickstart's output is not quoted after it"
    out = run_python(README_BLOCKS[0][1], tmp_path).stdout.splitlines()
    assert out[:2] == [quoted.group(1), quoted.group(2)]


def _install_section() -> str:
    text = README.read_text()
    return text[text.index("## Install"):text.index("\n## ", text.index("## Install") + 1)]


def test_readme_install_commands_per_cuda_version():
    s = _install_section()
    for cmd in ("python -m pip install 'cudnn-compat[cuda12]'", "python -m pip install '.[cuda12]'",
                "python -m pip install 'cudnn-compat[cuda13]'", "python -m pip install '.[cuda13]'",
                "python -m pip install .`", "python -m pip install '.[cuda12,test]'"):
        assert cmd in s, cmd
    top = README.read_text().split("\n## ", 1)[0]
    assert "python -m pip install . && cudnn-compat demo" in top
    assert "python -m pip install '.[test]' && python -m pytest tests" in top


def test_readme_extras_table_matches_pyproject():
    """Every extra of pyproject.toml is in the README's table with the packages it installs."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    rows = dict(re.findall(r"^\| `([\w-]+)` \| (.*) \|$", _install_section(), re.M))
    assert set(extras) <= set(rows), sorted(set(extras) - set(rows))
    for name in ("cuda12", "cuda13"):
        for req in extras.get(name, []):
            dist = re.match(r"[A-Za-z0-9_.-]+(\[[^\]]*\])?", req).group(0)
            assert dist in rows[name], f"README extras table, {name}: {dist} missing"


def _default_cell(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{int(value)}`"
    return "unset" if value == "off" else f"`{value}`"


def test_readme_environment_table_gives_each_default():
    """The 'default' column starts with what cudnn_compat/_backend/config.py declares (unset, or the value)."""
    from cudnn_compat._backend import config
    text = README.read_text()
    section = text[text.index("## Environment"):]
    section = section[:section.index("\n## ", 1)]
    header = re.search(r"^\| variable \| values \| default \| effect \|$", section, re.M)
    assert header, "README environment table: columns must be variable | values | default | effect"
    rows = {}
    for line in re.findall(r"^\| `[A-Z0-9_]+` \|.*$", section, re.M):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 4, f"README environment table: 4 cells expected: {line}"
        rows[cells[0].strip("`")] = cells[2]
    for name, var in config.TABLE.items():
        if name in rows:  # that every variable has a row: tests/test_config.py
            assert rows[name].startswith(_default_cell(var.default)), (name, rows[name], var.default)


# -- docs/tools.md ----------------------------------------------------------------------------------

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|\binf\b|\bnan\b")
HEX = re.compile(r"\b[0-9a-f]{16}\b")


def normalize(line: str) -> str:
    """The shape of an output line: numbers (times, errors, counts) and digests abstracted away."""
    line = HEX.sub("H", line)
    line = NUMBER.sub("#", line)
    return re.sub(r"\s+", " ", line).strip()


def session(path: Path) -> list:
    """[(line, command, expected output lines)] of the ```console blocks of ``path``."""
    out = []
    for line, code in blocks(path, "console"):
        cur = None
        for ln in code.splitlines():
            if ln.startswith("$ "):
                cur = [line, ln[2:], []]
                out.append(cur)
            elif cur is not None:
                cur[2].append(ln)
    return out


def run_session(path: Path, cwd: Path) -> list:
    """Write the named python blocks (first line ``# name.py``) to ``cwd``, run the unnamed ones,
    then run each console command there.  [(line, command, returncode, output lines)]."""
    for line, code in blocks(path, "python"):
        m = FILE_HEADER.match(code)
        if m:
            (cwd / m.group(1)).write_text(code)
    results = []
    for line, cmd, _ in session(path):
        p = subprocess.run(["bash", "-c", cmd + " 2>&1"], cwd=str(cwd), env=env(cwd), capture_output=True,
                           text=True, timeout=300)
        lines = [ln for ln in p.stdout.splitlines() if not ln.startswith(".bin")]
        results.append((line, cmd, p.returncode, lines))
    return results


def test_tools_worked_session_output_is_real(tmp_path):
    """Each command of the worked session succeeds (diff: exit 1, it finds the difference) and
    prints lines of the shape docs/tools.md shows: same text, numbers and digests aside."""
    expected = session(TOOLS)
    assert len(expected) >= 8, "docs/tools.md: the worked session is missing"
    got = run_session(TOOLS, tmp_path)
    for (line, cmd, want), (_, _, rc, lines) in zip(expected, got):
        want_rc = 1 if cmd.startswith("cudnn-compat diff") else 0
        assert rc == want_rc, f"docs/tools.md:{line}: `{cmd}` exited {rc}:\n" + "\n".join(lines)
        if cmd == "ls":
            assert set(lines) >= {w for w in want}, (cmd, lines)
            continue
        assert [normalize(x) for x in lines] == [normalize(x) for x in want], (
            f"docs/tools.md:{line}: `{cmd}` printed\n" + "\n".join(lines) + "\n(run python tests/test_readme.py --update)")


def update_tools_session() -> None:
    """Re-run the worked session of docs/tools.md and paste each command's real output under it."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        got = run_session(TOOLS, Path(d))
    outputs = iter(got)
    text = TOOLS.read_text()

    def fill(m):
        if m.group(1) != "console":
            return m.group(0)
        body = []
        for ln in m.group(2).splitlines():
            if ln.startswith("$ "):
                _, cmd, rc, lines = next(outputs)
                body.append(ln)
                body.extend(lines)
        return "```console\n" + "\n".join(body) + "\n```"

    TOOLS.write_text(FENCE.sub(fill, text))


if __name__ == "__main__":
    if "--update" in sys.argv:
        update_tools_session()
        print(f"updated {TOOLS}")
