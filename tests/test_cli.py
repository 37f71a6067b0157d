"""The cudnn-compat command: doctor and demo (architecture.md "cudnn-compat doctor / demo")."""
import json
import os
import subprocess
import sys

import pytest

from cudnn_compat import cli, demo

MISSING = demo.missing_functions()
needs_demo = pytest.mark.skipif(bool(MISSING), reason=f"demo needs legacy functions not registered yet: {MISSING}")


def test_doctor_json_lists_reference_engine_usable(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ref = [e for e in report["engines"] if e["engine"] == "reference"]
    assert ref and ref[0]["usable"] and ref[0]["reason"] is None
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert report["numpy"]["version"]
    for part in ("cupy", "gpu"):  # either a version/name or the reason it is absent
        assert bool(report[part].get("version") or report[part].get("name")) != bool(report[part]["reason"])
    assert ("path" in report["libcudnn"]) != ("reason" in report["libcudnn"])
    assert report["default_place"] in ("cpu", "gpu")
    for e in report["engines"]:
        assert e["usable"] == (e["reason"] is None)


def test_doctor_text(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "usable" in out and "libcudnn" in out and "python" in out


def test_python_dash_m_runs_the_command():
    env = dict(os.environ, CUDNN_COMPAT_DEVICE="cpu")
    p = subprocess.run([sys.executable, "-m", "cudnn_compat", "doctor"], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=120)
    assert p.returncode == 0, p.stderr
    assert "reference" in p.stdout and "default place   cpu" in p.stdout


def test_no_command_is_a_usage_error(capsys):
    assert cli.main([]) == 2
    assert "doctor" in capsys.readouterr().err


@needs_demo
def test_demo_cpu_exits_zero(capsys):
    assert cli.main(["demo", "--place", "cpu"]) == 0
    out = capsys.readouterr().out
    for name, _ in demo.STAGES:
        assert name in out
    assert out.count(" ok") == len(demo.STAGES) and "reference" in out


@needs_demo
def test_demo_exits_one_when_an_op_is_off(capsys):
    assert cli.main(["demo", "--place", "cpu", "--rtol", "-1"]) == 1  # no error can be below a negative tolerance
    assert "off the reference" in capsys.readouterr().err


def test_demo_fails_clearly_without_its_functions(monkeypatch, capsys):
    monkeypatch.setattr(demo, "REQUIRED", demo.REQUIRED + ("cudnnNotAFunction",))
    assert cli.main(["demo"]) == 2
    assert "cudnnNotAFunction" in capsys.readouterr().err


@needs_demo
@pytest.mark.gpu
def test_demo_gpu(capsys):
    assert cli.main(["demo", "--place", "gpu"]) == 0, capsys.readouterr()
