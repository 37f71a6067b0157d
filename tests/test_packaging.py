"""Packaging (issue 16, item 1): the wheel installs nothing but ``cudnn_compat`` (its graph layer
``cudnn_compat/_backend/`` included), carries ``py.typed`` and the LICENSE, works when
installed away from the checkout; the ``cuda12``/``cuda13`` extras each resolve one CUDA major
(``pip install --dry-run --report``, skipped when the package index cannot be reached); one version
(``cudnn_compat.__version__``) seen by ``cudnn-compat --version``, the wheel and the metadata."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cudnn_compat as cc
from cudnn_compat.tools import cli

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "cudnn_compat")  # what a build reads


def _source_copy(dest: Path) -> Path:
    """The files a build reads, copied (builds write build/ and *.egg-info: not into the shared checkout)."""
    src = dest / "src"
    src.mkdir()
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    return src


def _can_build_offline() -> "str | None":
    """Why ``pip wheel --no-build-isolation`` cannot build here, or None."""
    try:
        import setuptools
    except ImportError:
        return "setuptools is not installed (the test extra brings it)"
    version = tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])
    if version < (64, 0):
        return f"setuptools {setuptools.__version__} < 64 (pyproject's build-system)"
    if version < (70, 1):  # bdist_wheel moved into setuptools in 70.1; older ones need the wheel package
        try:
            import wheel  # noqa: F401
        except ImportError:
            return f"setuptools {setuptools.__version__} without the wheel package cannot build a wheel"
    return None


@pytest.fixture(scope="module")
def wheel_file(tmp_path_factory) -> Path:
    why = _can_build_offline()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("wheel")
    src = _source_copy(tmp)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                        "--no-index", "-q", "-w", str(tmp / "dist")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = list((tmp / "dist").glob("cudnn_compat-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _names(whl: Path) -> list:
    with zipfile.ZipFile(whl) as z:
        return z.namelist()


def test_the_wheel_installs_cudnn_compat_and_nothing_else_at_top_level(wheel_file):
    names = _names(wheel_file)
    tops = {n.split("/")[0] for n in names}
    version = cc.__version__
    assert tops == {"cudnn_compat", f"cudnn_compat-{version}.dist-info"}, sorted(tops)
    assert not any(n.startswith("_backend") for n in names)


def test_the_wheel_holds_every_module_of_the_checkout_under_cudnn_compat(wheel_file):
    """The explicit package list of pyproject misses no (sub)package: every .py of cudnn_compat/
    (its graph layer cudnn_compat/_backend/ included) is in the wheel, py.typed too."""
    names = set(_names(wheel_file))
    want = {p.relative_to(ROOT).as_posix() for p in (ROOT / "cudnn_compat").rglob("*.py")}
    want |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "cudnn_compat").rglob("*.pyi")}
    want.add("cudnn_compat/py.typed")
    assert len(want) > 100
    assert {"cudnn_compat/_backend/engines/reference/__init__.py", "cudnn_compat/_backend/engines/cupy_engine/codegen.py",
            "cudnn_compat/_backend/engines/cudnn_engine/lib.py", "cudnn_compat/_backend/plan_cache.py"} <= want
    assert sorted(want - names) == []


def test_the_wheel_metadata_has_the_version_license_extras_and_command(wheel_file):
    with zipfile.ZipFile(wheel_file) as z:
        dist = f"cudnn_compat-{cc.__version__}.dist-info"
        meta = z.read(f"{dist}/METADATA").decode()
        entry = z.read(f"{dist}/entry_points.txt").decode()
        licenses = [n for n in z.namelist() if n.startswith(dist) and n.endswith("LICENSE")]
        assert licenses and z.read(licenses[0]) == (ROOT / "LICENSE").read_bytes()
    assert re.search(rf"^Version: {re.escape(cc.__version__)}$", meta, re.M)
    assert re.search(r"^License(-Expression)?: MIT$", meta, re.M)
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", meta, re.M))
    assert extras == {"cuda12", "cuda13", "test", "test-nvrtc"}, extras
    assert re.search(r"^Requires-Dist: numpy", meta, re.M)
    hard = [ln for ln in re.findall(r"^Requires-Dist: (.*)$", meta, re.M) if "extra ==" not in ln]
    assert [re.match(r"[\w.-]+", h).group(0) for h in hard] == ["numpy"]  # numpy is the only hard dependency
    assert "cudnn-compat = cudnn_compat.tools.cli:main" in entry


def test_the_installed_wheel_imports_away_from_the_checkout(wheel_file, tmp_path):
    """Unpacked alone (a pure wheel: what pip install puts in site-packages), without the
    checkout on the path, cudnn_compat imports, finds its graph layer inside
    itself, and ``python -m cudnn_compat --version`` answers."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel_file) as z:
        z.extractall(site)
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONNOUSERSITE="1")
    code = ("import sys, cudnn_compat as c, cudnn_compat._backend as b; "
            "print(c.__file__); print(b.__file__); print('_backend' in sys.modules); print(c.__version__)")
    r = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    c_file, b_file, top_backend, version = r.stdout.split("\n")[:4]
    assert Path(c_file).is_relative_to(site) and Path(b_file) == site / "cudnn_compat" / "_backend" / "__init__.py"
    assert (top_backend, version) == ("False", cc.__version__)
    r = subprocess.run([sys.executable, "-m", "cudnn_compat", "--version"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=env)
    assert (r.returncode, r.stdout.strip()) == (0, f"cudnn-compat {cc.__version__}"), r.stderr[-2000:]
    # cudnn-compat bench (issue 23 item 4): the wheel has no benchmarks: one line and status 2 away
    # from a checkout; the current directory's benchmarks/, --dir relative, the checkout pip
    # installed from (PEP 610 direct_url.json) all find them
    bench = [sys.executable, "-m", "cudnn_compat", "bench", "--list"]
    r = subprocess.run(bench, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    for cwd, extra in ((ROOT, []), (ROOT, ["--dir", "benchmarks"]), (ROOT.parent, ["--dir", f"{ROOT.name}/benchmarks"])):
        r = subprocess.run(bench + extra, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
        assert r.returncode == 0 and f"benchmarks under {ROOT / 'benchmarks'}:" in r.stdout, (extra, r.stderr)
    dist_info = next(site.glob("cudnn_compat-*.dist-info"))
    (dist_info / "direct_url.json").write_text(json.dumps({"url": ROOT.as_uri(), "dir_info": {}}))
    r = subprocess.run(bench, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0 and f"benchmarks under {ROOT / 'benchmarks'}:" in r.stdout, r.stderr


# -- one version ------------------------------------------------------------------------------------

def test_version_command_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"cudnn-compat {cc.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", cc.__version__)


def test_version_is_written_in_one_place():
    """pyproject reads the version from cudnn_compat/_version.py; it writes none of its own."""
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, re.M)
    assert re.search(r'^dynamic\s*=\s*\[\s*"version"\s*\]', project, re.M)
    assert re.search(r'^version\s*=\s*\{\s*attr\s*=\s*"cudnn_compat._version.__version__"\s*\}', text, re.M)
    script = shutil.which("cudnn-compat", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("the cudnn-compat command is not installed next to this Python")
    r = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, f"cudnn-compat {cc.__version__}"), r.stderr[-2000:]


def test_license_file_is_mit_as_pyproject_says():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the cudnn-compat authors" in text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in text
    assert re.search(r'^license\s*=\s*\{\s*text\s*=\s*"MIT"\s*\}', (ROOT / "pyproject.toml").read_text(), re.M)
    assert (ROOT / "cudnn_compat" / "py.typed").is_file()


# -- the CUDA extras resolve one CUDA major each ------------------------------------------------------

CUDA_VERSIONED = {"cuda-toolkit", "cuda-bindings", "cuda-python", "cuda-runtime"}  # version major = CUDA major


def cuda_major(name: str, version: str) -> "int | None":
    """The CUDA major version a distribution belongs to, or None when it is CUDA-neutral:
    a ``cu12``/``cuda13x`` name suffix; an ``nvidia-*`` wheel without such a suffix is CUDA 13 or
    later (NVIDIA dropped the suffix there: nvidia-cuda-nvrtc 13.x, nvidia-cufft 12.5 for CUDA 13);
    cuda-toolkit / cuda-bindings / cuda-python by their version."""
    n = re.sub(r"[-_.]+", "-", name.lower())
    m = re.search(r"(?:^|-)cu(?:da)?(\d{2})x?(?:-|$)", n)
    if m:
        return int(m.group(1))
    if n.startswith("nvidia-"):
        return 13
    if n in CUDA_VERSIONED:
        return int(version.split(".")[0])
    return None


def test_cuda_major_classifies_the_names_both_stacks_resolve_to():
    """What ``.[cuda12]`` and ``.[cuda13]`` resolved to on PyPI (2026-11), and neutral packages."""
    seen = {("cupy-cuda12x", "14.2.0"): 12, ("nvidia-cudnn-cu12", "9.28.0.42"): 12, ("nvidia-cublas-cu12", "12.9.2.10"): 12,
            ("nvidia_cuda_nvrtc_cu12", "12.9.86"): 12, ("cuda-toolkit", "12.9.2.0"): 12, ("cuda-python", "12.9.0"): 12,
            ("cupy-cuda13x", "14.2.0"): 13, ("nvidia-cudnn-cu13", "9.28.1.4"): 13, ("nvidia-cufft", "12.5.0.14"): 13,
            ("nvidia-cuda-nvrtc", "13.5.37"): 13, ("cuda-toolkit", "13.5.0"): 13, ("cuda-bindings", "13.5.0"): 13,
            ("cuda-pathfinder", "1.9.1"): None, ("cudnn-compat", "0.1.0"): None, ("numpy", "2.4.6"): None,
            ("hypothesis", "6.170.17"): None, ("mypy", "2.4.1"): None, ("pytest", "9.2.0"): None}
    assert {k: cuda_major(*k) for k in seen} == seen


def _index_reachable() -> "str | None":
    import urllib.request
    try:
        with urllib.request.urlopen("https://pypi.org/simple/cupy-cuda12x/", timeout=8):
            return None
    except Exception as e:  # offline, proxy, DNS
        return f"PyPI is not reachable ({type(e).__name__}: {e})"


@pytest.fixture(scope="module")
def resolved(request, tmp_path_factory) -> dict:
    """{extra: [(name, version), ...]} of ``pip install '.[cudaXX,test]' --dry-run --ignore-installed
    --report``, both extras resolved at once: ~25 s here, where pip fetches whole wheels (GBs) to read
    their metadata; seconds where the index serves the metadata alone (PEP 658)."""
    marks = request.config.getoption("markexpr") or ""
    if not re.search(r"(?<!not )\bslow\b", marks):
        pytest.skip("resolves both GPU stacks (25-75 s, GBs from an index without PEP 658 metadata): "
                    "run with -m slow (.ci/run does)")
    why = _index_reachable()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("resolve")
    src = _source_copy(tmp)
    runs = {}
    for extra in ("cuda12", "cuda13"):
        report = tmp / f"{extra}.json"
        cmd = [sys.executable, "-m", "pip", "install", f"{src}[{extra},test]", "--dry-run", "--ignore-installed",
               "--quiet", "--timeout", "30", "--report", str(report)]
        runs[extra] = (report, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = {}
    for extra, (report, proc) in runs.items():
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for _, p in runs.values():
                p.kill()
            pytest.skip(f"pip could not resolve .[{extra},test] within 300 s (slow index)")
        if proc.returncode != 0:
            if re.search(r"ResolutionImpossible|conflicting dependencies|No matching distribution found for "
                         r"(cupy|nvidia|cuda)", err):
                pytest.fail(f".[{extra},test] does not resolve:\n{err[-3000:]}")
            pytest.skip(f"pip could not reach the index for .[{extra},test]: {err.strip()[-500:]}")
        doc = json.loads(report.read_text())
        out[extra] = sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in doc["install"])
    return out


@pytest.mark.slow  # opt-in: `python -m pytest tests -m slow` (.ci/run runs it)
@pytest.mark.parametrize("extra,major,other", [("cuda12", 12, 13), ("cuda13", 13, 12)])
def test_a_cuda_extra_with_test_resolves_one_cuda_major(resolved, extra, major, other):
    dists = resolved[extra]
    names = {n.lower().replace("_", "-") for n, _ in dists}
    wrong = [(n, v) for n, v in dists if cuda_major(n, v) not in (None, major)]
    assert wrong == [], f".[{extra},test] pulls CUDA {other} packages"
    assert not [n for n in names if f"cu{other}" in n or f"cuda{other}" in n]
    # ... and it is a whole GPU stack of its major: CuPy, its toolkit wheels (NVRTC, runtime), cuDNN, pathfinder
    want = {f"cupy-cuda{major}x", f"nvidia-cudnn-cu{major}", "cuda-pathfinder", "cuda-toolkit", "numpy", "pytest",
            "hypothesis", "mypy"}
    assert want <= names, sorted(want - names)
    nvrtc = "nvidia-cuda-nvrtc-cu12" if major == 12 else "nvidia-cuda-nvrtc"
    runtime = "nvidia-cuda-runtime-cu12" if major == 12 else "nvidia-cuda-runtime"
    assert {nvrtc, runtime} <= names
    assert "cuda-python" not in names  # cuda-pathfinder directly, not through cuda-python
