"""The three worked examples of docs/porting.md (examples/*.py) run and match references written
here: direct-loop convolutions, window maxima, softmax, two-pass batch normalization, a
hand-written backward pass of the Chainer-style CNN checked by finite differences, and (GPU) a
torch computation of the same network.

CPU tests run the examples on cudnn-compat's CPU place (``CUDNN_COMPAT_DEVICE=cpu``: NumPy
arrays); the CuPy-style examples import ``cupy.cuda.cudnn`` / ``cupyx.cudnn`` through the shim,
with the stand-in ``cupy`` namespace when CuPy is not installed.
"""
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def load(name: str) -> dict:
    return runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name=f"example_{name}")


@pytest.fixture
def cpu_place(monkeypatch):
    monkeypatch.setenv("CUDNN_COMPAT_DEVICE", "cpu")


@pytest.fixture
def cupy_names():
    from cudnn_compat import install_cupy_shim, uninstall_cupy_shim
    install_cupy_shim(allow_stub=True)
    yield
    uninstall_cupy_shim()


def close(got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    assert err <= tol * scale, f"max abs error {err:.3e} > {tol:.1e} * {scale:.3g}"


# -- references, float64 ------------------------------------------------------------------------

def conv_ref(x, W, pad):
    """Cross-correlation, stride 1, by direct loops over output positions."""
    x, W = np.asarray(x, np.float64), np.asarray(W, np.float64)
    n, c, h, w = x.shape
    k, _, r, s = W.shape
    xpad = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = h + 2 * pad - r + 1, w + 2 * pad - s + 1
    y = np.zeros((n, k, ho, wo))
    for i in range(ho):
        for j in range(wo):
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", xpad[:, :, i:i + r, j:j + s], W)
    return y


def conv_bwd_ref(x, W, dy, pad):
    """(dx, dW) of conv_ref by accumulating each output position's contribution."""
    x, W, dy = (np.asarray(a, np.float64) for a in (x, W, dy))
    n, c, h, w = x.shape
    k, _, r, s = W.shape
    xpad = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    dxpad, dW = np.zeros_like(xpad), np.zeros_like(W)
    for i in range(dy.shape[2]):
        for j in range(dy.shape[3]):
            dW += np.einsum("nk,ncrs->kcrs", dy[:, :, i, j], xpad[:, :, i:i + r, j:j + s])
            dxpad[:, :, i:i + r, j:j + s] += np.einsum("nk,kcrs->ncrs", dy[:, :, i, j], W)
    return dxpad[:, :, pad:pad + h, pad:pad + w], dW


def maxpool_ref(x, k):
    n, c, h, w = x.shape
    return np.asarray(x, np.float64).reshape(n, c, h // k, k, w // k, k).max(axis=(3, 5))


def maxpool_bwd_ref(x, gy, k):
    """The gradient goes to each window's maximum (inputs here have no ties where it matters)."""
    x = np.asarray(x, np.float64)
    gx = np.zeros_like(x)
    for i in range(gy.shape[2]):
        for j in range(gy.shape[3]):
            win = x[:, :, i * k:(i + 1) * k, j * k:(j + 1) * k].reshape(x.shape[0], x.shape[1], -1)
            arg = win.argmax(axis=2)
            for n in range(x.shape[0]):
                for c in range(x.shape[1]):
                    a, b = divmod(int(arg[n, c]), k)
                    gx[n, c, i * k + a, j * k + b] += gy[n, c, i, j]
    return gx


def softmax_ref(x, axis):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# -- v7_c_style.py --------------------------------------------------------------------------------

def check_v7(out, tol):
    y = np.maximum(conv_ref(out["x"], out["w"], 1) + out["b"], 0)
    close(out["prob"], softmax_ref(maxpool_ref(y, 2), 1), tol)
    dx, dw = conv_bwd_ref(out["x"], out["w"], out["dy"], 1)
    close(out["dx"], dx, tol)
    close(out["dw"], dw, tol)
    close(out["db"], np.asarray(out["dy"], np.float64).sum(axis=(0, 2, 3)).reshape(1, -1, 1, 1), tol)


@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-5), (np.float64, 1e-11)])
def test_v7_c_style_matches_reference(cpu_place, dtype, tol):
    out = load("v7_c_style")["main"](seed=3, dtype=dtype)
    assert out["place"] == "cpu"
    check_v7(out, tol)


# -- cupy13_script.py ----------------------------------------------------------------------------

def check_cupy13(out, tol):
    x, W, b = out["x"], out["W"], out["b"]
    y = conv_ref(x, W, 1)
    close(out["conv_nobias"], y, tol)
    yb = y + b.reshape(1, -1, 1, 1)
    close(out["conv"], yb, tol)
    gx, gW = conv_bwd_ref(x, W, out["gy"], 1)
    close(out["conv_gx"], gx, tol)
    close(out["conv_gW"], gW, tol)
    z = np.maximum(yb, 0)
    close(out["relu"], z, tol)
    close(out["old_relu"], z, tol)
    p = maxpool_ref(z, 2)
    close(out["pool"], p, tol)
    # two-pass batch normalization over (n, h, w), eps 2e-5, running stats with factor 1 - 0.9
    m = p.shape[0] * p.shape[2] * p.shape[3]
    mean = p.mean(axis=(0, 2, 3))
    var = ((p - mean.reshape(1, -1, 1, 1)) ** 2).mean(axis=(0, 2, 3))
    inv_std = 1 / np.sqrt(var + 2e-5)
    xhat = (p - mean.reshape(1, -1, 1, 1)) * inv_std.reshape(1, -1, 1, 1)
    bn = out["gamma"].reshape(1, -1, 1, 1) * xhat + out["beta"].reshape(1, -1, 1, 1)
    close(out["bn"], bn, tol)
    close(out["bn_mean"], mean, tol)
    close(out["bn_inv_std"], inv_std, tol)
    close(out["running_mean"], 0.1 * mean, tol)
    close(out["running_var"], 0.9 * 1.0 + 0.1 * var * m / (m - 1), tol)
    close(out["softmax"], softmax_ref(bn, 1), tol)
    g = np.asarray(out["bn_gy"], np.float64)
    sum_g, sum_gx = g.sum(axis=(0, 2, 3)), (g * xhat).sum(axis=(0, 2, 3))
    close(out["bn_gbeta"], sum_g, tol)
    close(out["bn_ggamma"], sum_gx, tol)
    r = lambda v: v.reshape(1, -1, 1, 1)  # noqa: E731
    gxn = r(out["gamma"] * inv_std) / m * (m * g - r(sum_g) - xhat * r(sum_gx))
    close(out["bn_gx"], gxn, tol)
    close(out["scaled"], 0.5 * yb + b.reshape(1, -1, 1, 1), tol)
    dt = 0 if out["x"].dtype == np.float32 else 1
    assert out["nd_desc"] == (dt, 2, 4, 8, 8, 256, 64, 8, 1)
    assert out["algos"] and out["algos"][0][1] == 0  # the best one runs (others may be NOT_SUPPORTED = 9)
    assert {s for _, s, _ in out["algos"]} <= {0, 9}
    assert out["error_status"] == 3  # CUDNN_STATUS_BAD_PARAM: a destroyed descriptor
    assert out["version"] == 8907


@pytest.mark.parametrize("dtype, tol", [(np.float32, 3e-5), (np.float64, 1e-10)])
def test_cupy13_script_matches_reference(cpu_place, cupy_names, dtype, tol):
    out = load("cupy13_script")["main"](seed=5, dtype=dtype)
    assert out["place"] == "cpu"
    check_cupy13(out, tol)


# -- chainer_style_cnn.py --------------------------------------------------------------------------

def cnn_forward(p):
    """Loss of the example's network in float64, written from its description."""
    h1 = conv_ref(p["x"], p["W1"], 1) + np.asarray(p["b1"], np.float64).reshape(1, -1, 1, 1)
    h3 = maxpool_ref(np.maximum(h1, 0), 2)
    logits = h3.reshape(h3.shape[0], -1) @ np.asarray(p["W2"], np.float64).T + p["b2"]
    logp = np.log(softmax_ref(logits, 1))
    return -logp[np.arange(p["t"].size), p["t"]].mean()


def cnn_grads(p):
    """Backpropagation of cnn_forward, by hand."""
    x, W1, W2 = (np.asarray(p[k], np.float64) for k in ("x", "W1", "W2"))
    t, n = p["t"], p["t"].size
    h1 = conv_ref(x, W1, 1) + np.asarray(p["b1"], np.float64).reshape(1, -1, 1, 1)
    h2 = np.maximum(h1, 0)
    h3 = maxpool_ref(h2, 2)
    flat = h3.reshape(n, -1)
    prob = softmax_ref(flat @ W2.T + p["b2"], 1)
    g = prob.copy()
    g[np.arange(n), t] -= 1
    g /= n
    g_h3 = (g @ W2).reshape(h3.shape)
    g_h1 = maxpool_bwd_ref(h2, g_h3, 2) * (h1 > 0)
    gx, gW1 = conv_bwd_ref(x, W1, g_h1, 1)
    return {"gx": gx, "gW1": gW1, "gb1": g_h1.sum(axis=(0, 2, 3)), "gW2": g.T @ flat, "gb2": g.sum(axis=0)}


def test_chainer_reference_backprop_agrees_with_finite_differences(cupy_names):
    """The hand-written backward above is itself right: central differences along random directions."""
    p = load("chainer_style_cnn")["init_params"](seed=7, dtype=np.float64)
    grads, rng, eps = cnn_grads(p), np.random.default_rng(0), 1e-6
    for name, gname in (("x", "gx"), ("W1", "gW1"), ("b1", "gb1"), ("W2", "gW2"), ("b2", "gb2")):
        v = rng.standard_normal(p[name].shape)
        hi, lo = dict(p, **{name: p[name] + eps * v}), dict(p, **{name: p[name] - eps * v})
        fd = (cnn_forward(hi) - cnn_forward(lo)) / (2 * eps)
        assert abs(fd - float((grads[gname] * v).sum())) <= 1e-6 * max(1.0, abs(fd)), name


def check_chainer(out, tol):
    p = {k: out[k] for k in ("x", "t", "W1", "b1", "W2", "b2")}
    assert abs(out["loss"] - cnn_forward(p)) <= tol * max(1.0, abs(out["loss"]))
    for k, v in cnn_grads(p).items():
        close(out[k], v, tol)


@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-5), (np.float64, 1e-11)])
def test_chainer_style_cnn_matches_reference(cpu_place, cupy_names, dtype, tol):
    out = load("chainer_style_cnn")["main"](seed=7, dtype=dtype)
    assert out["place"] == "cpu"
    check_chainer(out, tol)


# -- the scripts as scripts -------------------------------------------------------------------------

def test_examples_run_as_main(cpu_place, cupy_names, capsys):
    runpy.run_path(str(EXAMPLES / "v7_c_style.py"), run_name="__main__")
    assert "ran on the cpu place" in capsys.readouterr().out
    runpy.run_path(str(EXAMPLES / "cupy13_script.py"), run_name="__main__")
    assert "on the cpu place" in capsys.readouterr().out


def test_run_module_runs_an_unedited_script(tmp_path, cupy_names):
    """``python -m cudnn_compat.run --allow-stub script.py``: a fresh interpreter, CuPy names from
    the shim (or CuPy itself), CPU place; it prints the same loss as the in-process run."""
    env = dict(os.environ, CUDNN_COMPAT_DEVICE="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.run([sys.executable, "-m", "cudnn_compat.run", "--allow-stub",
                           str(EXAMPLES / "chainer_style_cnn.py")], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "loss:" in ln)
    assert line.startswith("place: cpu")
    p = load("chainer_style_cnn")["init_params"](seed=0)
    assert abs(float(line.split("loss:")[1]) - cnn_forward(p)) < 1e-5


# -- GPU: CuPy arrays, and torch ---------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-2), (np.float64, 1e-9)])
def test_examples_on_gpu_match_references(monkeypatch, cupy_names, dtype, tol):
    """The same scripts with CuPy arrays on the device (float32 allows TF32-level error)."""
    monkeypatch.delenv("CUDNN_COMPAT_DEVICE", raising=False)
    out = load("v7_c_style")["main"](seed=3, dtype=dtype)
    assert out["place"] == "gpu"
    check_v7(out, tol)
    out = load("cupy13_script")["main"](seed=5, dtype=dtype)
    assert out["place"] == "gpu"
    check_cupy13(out, tol)
    out = load("chainer_style_cnn")["main"](seed=7, dtype=dtype)
    assert out["place"] == "gpu"
    check_chainer(out, tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-2), (np.float64, 1e-9)])
def test_chainer_style_cnn_matches_torch(monkeypatch, cupy_names, dtype, tol):
    """Loss and every gradient of the example on the GPU against torch autograd (float64)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    monkeypatch.delenv("CUDNN_COMPAT_DEVICE", raising=False)
    out = load("chainer_style_cnn")["main"](seed=11, dtype=dtype)
    assert out["place"] == "gpu"
    p = {k: torch.tensor(np.asarray(out[k], np.float64), requires_grad=True) for k in ("x", "W1", "b1", "W2", "b2")}
    t = torch.tensor(out["t"].astype(np.int64))
    h = F.max_pool2d(F.relu(F.conv2d(p["x"], p["W1"], p["b1"], padding=1)), 2)
    loss = F.cross_entropy(F.linear(h.reshape(h.shape[0], -1), p["W2"], p["b2"]), t)
    loss.backward()
    assert abs(out["loss"] - loss.item()) <= tol * max(1.0, abs(loss.item()))
    for name, gname in (("x", "gx"), ("W1", "gW1"), ("b1", "gb1"), ("W2", "gW2"), ("b2", "gb2")):
        close(out[gname], p[name].grad.numpy(), tol)


# -- every example as a user runs it: a fresh interpreter, the CPU place -------------------------------

# examples/<name> -> (arguments, a line its output must contain).  The CuPy-style scripts take
# --allow-stub (cudnn-compat's stand-in cupy modules when CuPy is not installed).
EXAMPLE_COMMANDS = {
    "v7_c_style.py": ([], "ran on the cpu place"),
    "cupy13_script.py": (["--allow-stub"], "on the cpu place"),
    "chainer_style_cnn.py": (["--allow-stub"], "place: cpu"),
    "multi_gpu_data_parallel.py": (["--place", "cpu", "--batch", "4", "--size", "8", "--steps", "2"], "step 2: loss"),
    "resnet50_legacy.py": (["--place", "cpu", "--batch", "2", "--size", "32", "--width", "0.0625", "--steps", "2",
                            "--blocks", "1"], "step 1: loss"),
}
NEEDS_CUPY = ("cupy13_script.py", "chainer_style_cnn.py")


def _script_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDNN_COMPAT_")}
    env.update(CUDNN_COMPAT_DEVICE="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return env


def _run_script(name, args, tmp_path):
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          env=_script_env(), cwd=str(tmp_path), timeout=300)


def test_every_example_has_a_cpu_command():
    """A new example must say here how it runs on the CPU (so the test below runs it)."""
    assert set(EXAMPLE_COMMANDS) == {p.name for p in EXAMPLES.glob("*.py")}


@pytest.mark.parametrize("name", sorted(EXAMPLE_COMMANDS))
def test_example_runs_as_a_script_on_the_cpu(tmp_path, name):
    args, expect = EXAMPLE_COMMANDS[name]
    p = _run_script(name, args, tmp_path)
    assert p.returncode == 0, f"python examples/{name} {' '.join(args)}:\n{p.stdout}\n{p.stderr}"
    assert expect in p.stdout, p.stdout
    assert "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("name", NEEDS_CUPY)
def test_cupy_example_without_cupy_says_what_to_do_in_one_line(tmp_path, name):
    """Without CuPy and without --allow-stub: exit status 2 and one line on stderr naming the CUDA
    extras and --allow-stub, no traceback."""
    import importlib.util
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    p = _run_script(name, [], tmp_path)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"{name}: ") and "--allow-stub" in lines[0], lines[0]
    assert "cudnn-compat[cuda12]" in lines[0] and "cudnn-compat[cuda13]" in lines[0], lines[0]
    assert p.stdout == ""
