"""The CuPy-13-style examples without CuPy (issue 16 item 4): run as scripts, directly or through
``python -m cudnn_compat.run``, they print one line on stderr naming the extras to install and
``--allow-stub``, and exit with status 2 (no traceback); with ``--allow-stub`` they run on the CPU.

CuPy is hidden from the child interpreters by a ``cupy`` package earlier on the path whose import
fails as a missing module does (or, for the CuPy 14 case, a ``cupy`` without ``cupy.cuda.cudnn``),
so the tests mean the same on a machine that has CuPy.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {"cupy13_script": "on the cpu place", "chainer_style_cnn": "place: cpu  loss:"}

ABSENT = 'raise ModuleNotFoundError("No module named \'cupy\'", name="cupy")\n'
CUPY14 = '__version__ = "14.0.0"\n'  # a CuPy without the cuDNN modules it removed


def _run(tmp_path, fake: str, args, module_run=False):
    (tmp_path / "fake" / "cupy").mkdir(parents=True, exist_ok=True)
    (tmp_path / "fake" / "cupy" / "__init__.py").write_text(fake)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDNN_COMPAT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fake"), str(ROOT)])
    cmd = [sys.executable] + (["-m", "cudnn_compat.run"] if module_run else []) + args
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("module_run", [False, True], ids=["script", "cudnn_compat.run"])
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_without_cupy_one_line_and_status_2(tmp_path, name, module_run):
    p = _run(tmp_path, ABSENT, [str(ROOT / "examples" / f"{name}.py")], module_run)
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert line.startswith(f"{name}.py: CuPy is not installed")
    for text in ("pip install 'cudnn-compat[cuda12]'", "pip install 'cudnn-compat[cuda13]'", "--allow-stub"):
        assert text in line


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_cupy14_without_the_shim_says_how_to_run_it(tmp_path, name):
    p = _run(tmp_path, CUPY14, [str(ROOT / "examples" / f"{name}.py")])
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "CuPy 14.0.0 has no cupy.cuda.cudnn" in lines[0], p.stderr
    assert f"python -m cudnn_compat.run {name}.py" in lines[0] and "--allow-stub" in lines[0]


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_allow_stub_runs_on_the_cpu(tmp_path, name):
    p = _run(tmp_path, ABSENT, [str(ROOT / "examples" / f"{name}.py"), "--allow-stub"])
    assert p.returncode == 0, p.stderr
    assert EXAMPLES[name] in p.stdout
