"""The cudnn-compat command: doctor and demo (docs/tools.md "The command line")."""
import json
import os
import subprocess
import sys

import pytest

from cudnn_compat.tools import cli, demo

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


def test_doctor_says_whether_the_compiled_steady_path_runs(capsys, monkeypatch):
    import importlib.util
    monkeypatch.delenv("CUDNN_COMPAT_COMPILED", raising=False)  # its default first (a run may set it to 0)
    built = importlib.util.find_spec("cudnn_compat._backend._steady") is not None
    assert cli.main(["doctor", "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["compiled"]
    assert c == ({"built": True, "used": True, "reason": None} if built else
                 {"built": False, "used": False, "reason": c["reason"]}) and (built or "not built" in c["reason"])
    monkeypatch.setenv("CUDNN_COMPAT_COMPILED", "0")
    assert cli.main(["doctor"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("compiled path")]
    assert line == ["compiled path   " + ("CUDNN_COMPAT_COMPILED=0: the Python twins run" if built else c["reason"])]


def test_python_dash_m_runs_the_command():
    env = dict(os.environ, CUDNN_COMPAT_DEVICE="cpu")
    p = subprocess.run([sys.executable, "-m", "cudnn_compat", "doctor"], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=120)
    assert p.returncode == 0, p.stderr
    assert "reference" in p.stdout and "default place   cpu" in p.stdout


def test_no_command_is_a_usage_error(capsys):
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "doctor" in err and err.count("\n") == 1


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# issue 23 item 4: every error of the command is one line on stderr and a non-zero status
ERRORS = [
    ([], "a command is required"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["doctor", "--bogus"], "unrecognized arguments: --bogus"),
    (["demo", "--seed", "x"], "invalid int value: 'x'"),
    (["demo", "--place", "tpu"], "invalid choice: 'tpu'"),
    (["replay"], "the following arguments are required: trace"),
    (["replay", "{tmp}/none.jsonl"], "No such file or directory"),
    (["replay", "{tmp}/bad.jsonl"], ""),
    (["replay", "{tmp}/bad.jsonl", "--tol", "float32=x"], ""),
    (["explain", "{tmp}/none.jsonl"], "No such file or directory"),
    (["explain", "{tmp}"], ""),
    (["diff", "{tmp}/none.jsonl", "{tmp}/bad.jsonl"], "No such file or directory"),
    (["bench", "nothing"], "no benchmark 'nothing'"),
    (["bench", "--dir", "{tmp}", "--list"], "holds no benchmark scripts"),
    (["bench", "--dir", "no/such/benchmarks"], "holds no benchmark scripts"),
    (["bench", "--quick", "--dir"], "expected one argument"),
    (["install-shim", "--dir", "{tmp}/no/such/folder"], ""),
]


@pytest.mark.parametrize("argv, words", ERRORS, ids=[" ".join(a) or "(none)" for a, _ in ERRORS])
def test_every_error_is_one_line_and_a_nonzero_status(argv, words, tmp_path):
    """In a child process (what a user sees): no traceback, one line on stderr naming the command."""
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    env = dict(os.environ, CUDNN_COMPAT_DEVICE="cpu")
    p = subprocess.run([sys.executable, "-m", "cudnn_compat", *argv], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert p.returncode != 0, (argv, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("cudnn-compat") and words in p.stderr, p.stderr


def test_an_unexpected_failure_is_status_1_and_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "doctor_report", lambda: 1 / 0)
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert err == "cudnn-compat doctor: ZeroDivisionError: division by zero (--traceback shows where)\n"
    with pytest.raises(ZeroDivisionError):
        cli.main(["--traceback", "doctor"])


@needs_demo
def test_demo_cpu_exits_zero(capsys):
    assert cli.main(["demo", "--place", "cpu"]) == 0
    out = capsys.readouterr().out
    for name, _ in demo.STAGES:
        assert name in out
    assert out.count(" ok") == len(demo.STAGES) and " numpy " in out  # the CPU place's default engine ran it


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


# -- issue 13, item 12: rough edges -----------------------------------------------------------------

def test_demo_gpu_without_a_gpu_is_one_line_and_status_2(monkeypatch, capsys):
    import cudnn_compat._core.place as place
    monkeypatch.setattr(place, "gpu_reason", lambda: "no CUDA device (test)")
    assert cli.main(["demo", "--place", "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("cudnn-compat demo: --place gpu needs a CUDA GPU") and "no CUDA device (test)" in err
    monkeypatch.setenv("CUDNN_COMPAT_DEVICE", "gpu")  # the same through the default place
    assert cli.main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDNN_COMPAT_DEVICE=gpu" in err


def test_demo_setup_error_is_one_line(monkeypatch, capsys):
    import cudnn_compat as cc
    monkeypatch.setattr(demo, "missing_functions", lambda: [])

    def broken(*a, **k):
        raise cc.CuDNNError(cc.CUDNN_STATUS_NOT_INITIALIZED, "place", "a GPU handle needs a CUDA device", "cudnnCreate")
    monkeypatch.setattr(demo, "run", broken)
    assert cli.main(["demo", "--place", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err == ("cudnn-compat demo: cannot run on the cpu place: CUDNN_STATUS_NOT_INITIALIZED: cudnnCreate: place: "
                   "a GPU handle needs a CUDA device\n")


def test_demo_gpu_subprocess_without_gpu():
    from cudnn_compat._core.place import gpu_reason
    if gpu_reason() is None:
        pytest.skip("a GPU is present")
    p = subprocess.run([sys.executable, "-m", "cudnn_compat", "demo", "--place", "gpu"], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr


class _ClosedPipe:
    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("command", [["doctor"], ["doctor", "--json"], ["explain", "TRACE"]])
def test_broken_pipe_exits_quietly(command, monkeypatch, capsys, tmp_path):
    import cudnn_compat as cc
    import numpy as np
    path = str(tmp_path / "t.jsonl")
    h = cc.cudnnCreate("cpu")
    with cc.trace(path):
        d = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensor4dDescriptor(d, 0, 0, 1, 2, 1, 1)
        cc.cudnnAddTensor(h, 1.0, d, np.ones(2, np.float32), 1.0, d, np.ones(2, np.float32))
    cc.cudnnDestroy(h)
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert cli.main([path if a == "TRACE" else a for a in command]) == cli.EXIT_BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_explain_into_head_subprocess(tmp_path):
    """``cudnn-compat explain TRACE | head -1``: more output than a pipe holds, the reader leaves
    after one line; no traceback, the status of a process killed by SIGPIPE."""
    import cudnn_compat as cc
    import numpy as np
    path = str(tmp_path / "big.jsonl")
    h = cc.cudnnCreate("cpu")
    with cc.trace(path):
        for n in range(1, 400):  # ~160 kB of explanation
            d = cc.cudnnCreateTensorDescriptor()
            cc.cudnnSetTensor4dDescriptor(d, 0, 0, 1, n, 1, 1)
            cc.cudnnAddTensor(h, 1.0, d, np.ones(n, np.float32), 1.0, d, np.ones(n, np.float32))
            cc.cudnnDestroyTensorDescriptor(d)
    cc.cudnnDestroy(h)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.Popen([sys.executable, "-m", "cudnn_compat", "explain", path], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=root)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=120) == cli.EXIT_BROKEN_PIPE, err
    assert first.startswith(b"trace ") and err == ""


NO_WHEEL = {"numpy": "2.0", "cuda-pathfinder": "1.9.1", "nvidia-cuda-nvrtc": "13.5.37", "cuda-bindings": "13.5.0"}


def _loader_blaming_cublaslt(name):
    raise RuntimeError('Failure finding "libcublasLt.so.13 or libcublasLt.so.12": No such file\n  listdir(...)')


def _libcudnn(dists, load=_loader_blaming_cublaslt, system=lambda: None):
    return cli._libcudnn(dists, load=load, system=system)


def test_doctor_names_the_missing_cudnn_wheel_and_the_extra():
    r = _libcudnn(NO_WHEEL)
    assert r["reason"].startswith("no nvidia-cudnn wheel is installed")
    assert "libcublasLt" not in r["reason"] and "libcublasLt" in r["loader_error"]
    assert r["reason"].endswith("pip install 'cudnn-compat[cuda13]'") and r["install"] == "pip install 'cudnn-compat[cuda13]'"
    assert r["cuda_major"] == 13 and r["cudnn_wheels"] == [] and "path" not in r
    r = _libcudnn({"cupy-cuda12x": "13.6.0", "cuda-bindings": "13.5.0"})  # CuPy's CUDA decides
    assert r["cuda_major"] == 12 and "pip install 'cudnn-compat[cuda12]'" in r["reason"]
    assert "cupy-cuda12x 13.6.0" in r["reason"]
    r = cli._libcudnn({}, load=_loader_blaming_cublaslt, system=lambda: None)
    assert r["install"].startswith("pip install 'cudnn-compat[cuda12]' or 'cudnn-compat[cuda13]'")


def test_doctor_with_a_wheel_or_a_system_library():
    r = _libcudnn(dict(NO_WHEEL, **{"nvidia-cudnn-cu13": "9.10.2"}))
    assert r["reason"].startswith("nvidia-cudnn-cu13 9.10.2 is installed but libcudnn could not be loaded")
    assert "libcublasLt" in r["reason"] and "cudnn-compat[cuda13]" in r["reason"]
    r = _libcudnn(NO_WHEEL, system=lambda: "libcudnn.so.9")
    assert "system libcudnn.so.9 could not be loaded" in r["reason"] and "[cuda13]" in r["reason"]

    class Loaded:
        abs_path = None
        found_via = "site-packages"
    r = _libcudnn(NO_WHEEL, load=lambda name: Loaded())
    assert "reason" not in r and r["found_via"] == "site-packages"


@pytest.mark.parametrize("dists,major", [
    ({"cupy-cuda13x": "14.2.0", "nvidia-cublas-cu12": "12.4"}, 13),
    ({"nvidia-cublas-cu12": "12.4.5", "cuda-bindings": "13.0.0"}, 12),
    ({"nvidia-cuda-runtime": "13.0.96"}, 13),
    ({"cuda-python": "12.9.0"}, 12),
    ({"numpy": "2.0"}, None),
])
def test_cuda_major(dists, major):
    got, where = cli.cuda_major(dists, driver=lambda: None)
    assert got == major and where
    assert cli.cuda_major({"numpy": "2.0"}, driver=lambda: 12) == (12, "the NVIDIA driver (libcuda)")
    assert cli.install_hint(12) == "pip install 'cudnn-compat[cuda12]'" and cli.install_hint(13).endswith("[cuda13]'")


def test_doctor_here_names_the_cause(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    lib = json.loads(capsys.readouterr().out)["libcudnn"]
    if "reason" in lib:
        assert "libcublasLt" not in lib["reason"] and "pip install 'cudnn-compat[" in lib["reason"]


def test_driver_version_through_cupy_then_cuda_bindings(monkeypatch):
    """issue 23 item 10: the driver's CUDA version from CuPy's runtime module, else cuda-bindings;
    libcuda through ctypes only when neither package is installed."""
    import types
    rt = types.SimpleNamespace(driverGetVersion=lambda: 13010)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt)))
    monkeypatch.setattr(cli, "_driver_version_ctypes", lambda: pytest.fail("ctypes used although CuPy answers"))
    assert cli._driver_version() == 13010 and cli._driver_cuda_major() == 13
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    drv = types.ModuleType("cuda.bindings.driver")
    drv.cuDriverGetVersion = lambda: (0, 12080)
    pkg, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    bindings.driver, pkg.bindings = drv, bindings
    for name, mod in (("cuda", pkg), ("cuda.bindings", bindings), ("cuda.bindings.driver", drv)):
        monkeypatch.setitem(sys.modules, name, mod)
    assert cli._driver_cuda_major() == 12
    drv.cuDriverGetVersion = lambda: (100, 0)  # CUDA_ERROR_NO_DEVICE
    assert cli._driver_version() is None
    for name in ("cuda", "cuda.bindings", "cuda.bindings.driver"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(cli, "_driver_version_ctypes", lambda: 11080)
    assert cli._driver_cuda_major() == 11
