"""``cudnn-compat demo``: a small network written the legacy way, calling only the public legacy
API (architecture.md "cudnn-compat demo"):

    conv 3x3 -> AddTensor bias -> ReLU -> max pool 2x2 -> batch norm (training) -> softmax

It runs twice, on a handle of the default place (GPU when there is one; CuPy arrays there)
and on a CPU handle (the reference engine).  Each op of the first run is fed the reference's
input to that op, so the error printed is the op's own: max |device - reference| over
its outputs.  The engine column is the plan's engine (``cudnn_compat.last_engine()``);
the time is a warm call's.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

import numpy as np

import cudnn_compat as cc
from ._place import default_place

REQUIRED = (
    "cudnnCreate", "cudnnDestroy", "cudnnCreateTensorDescriptor", "cudnnSetTensor4dDescriptor",
    "cudnnCreateFilterDescriptor", "cudnnSetFilter4dDescriptor", "cudnnCreateConvolutionDescriptor",
    "cudnnSetConvolution2dDescriptor", "cudnnGetConvolution2dForwardOutputDim",
    "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward", "cudnnAddTensor",
    "cudnnCreateActivationDescriptor", "cudnnSetActivationDescriptor", "cudnnActivationForward",
    "cudnnCreatePoolingDescriptor", "cudnnSetPooling2dDescriptor", "cudnnGetPooling2dForwardOutputDim",
    "cudnnPoolingForward", "cudnnDeriveBNTensorDescriptor", "cudnnBatchNormalizationForwardTraining",
    "cudnnSoftmaxForward",
)


def missing_functions() -> list:
    """The legacy functions the demo needs that are not registered (yet)."""
    return [n for n in REQUIRED if n not in cc.LEGACY]


def _tensor(n, c, h, w):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, n, c, h, w)
    return d


class Network:
    """Descriptors and host parameters; the descriptors serve every handle."""

    def __init__(self, seed: int = 0, n: int = 2, c: int = 3, hw: int = 8, k: int = 4):
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
        self.w = (0.3 * rng.standard_normal((k, c, 3, 3))).astype(np.float32)
        self.bias = (0.1 * rng.standard_normal((1, k, 1, 1))).astype(np.float32)
        self.gamma = rng.uniform(0.5, 1.5, (1, k, 1, 1)).astype(np.float32)
        self.beta = (0.1 * rng.standard_normal((1, k, 1, 1))).astype(np.float32)

        self.xDesc = _tensor(n, c, hw, hw)
        self.wDesc = cc.cudnnCreateFilterDescriptor()
        cc.cudnnSetFilter4dDescriptor(self.wDesc, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, k, c, 3, 3)
        self.convDesc = cc.cudnnCreateConvolutionDescriptor()
        cc.cudnnSetConvolution2dDescriptor(self.convDesc, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
        self.yDesc = _tensor(*cc.cudnnGetConvolution2dForwardOutputDim(self.convDesc, self.xDesc, self.wDesc))
        self.biasDesc = _tensor(1, k, 1, 1)
        self.actDesc = cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetActivationDescriptor(self.actDesc, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
        self.poolDesc = cc.cudnnCreatePoolingDescriptor()
        cc.cudnnSetPooling2dDescriptor(self.poolDesc, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
        self.pDesc = _tensor(*cc.cudnnGetPooling2dForwardOutputDim(self.poolDesc, self.yDesc))
        self.bnDesc = cc.cudnnCreateTensorDescriptor()
        cc.cudnnDeriveBNTensorDescriptor(self.bnDesc, self.pDesc, cc.CUDNN_BATCHNORM_SPATIAL)
        self.y_shape = cc.cudnnGetTensor4dDescriptor(self.yDesc)[1:5]
        self.p_shape = cc.cudnnGetTensor4dDescriptor(self.pDesc)[1:5]


class Place:
    """A handle and the array module that goes with it."""

    def __init__(self, place: str):
        self.handle = cc.cudnnCreate(place)
        self.place = place
        if place == "gpu":
            import cupy
            self.xp = cupy
        else:
            self.xp = np

    def put(self, a):
        return self.xp.asarray(a)

    def get(self, a) -> np.ndarray:
        return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)

    def sync(self):
        if self.place == "gpu":
            self.xp.cuda.get_current_stream().synchronize()

    def timed(self, call) -> float:
        self.sync()
        t0 = time.perf_counter()
        call()
        self.sync()
        return time.perf_counter() - t0

    def close(self):
        cc.cudnnDestroy(self.handle)


# Each op: (place, network, input array on that place) -> (outputs on that place, seconds)

def conv(p: Place, net: Network, x):
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
    size = cc.cudnnGetConvolutionForwardWorkspaceSize(p.handle, net.xDesc, net.wDesc, net.convDesc, net.yDesc, algo)
    ws = p.xp.empty(size, p.xp.uint8) if size else None
    w, y = p.put(net.w), p.xp.empty(net.y_shape, p.xp.float32)
    t = p.timed(lambda: cc.cudnnConvolutionForward(p.handle, 1.0, net.xDesc, x, net.wDesc, w, net.convDesc, algo, ws, size,
                                                   0.0, net.yDesc, y))
    return [y], t


def add_bias(p: Place, net: Network, y):
    y = y.copy()
    b = p.put(net.bias)
    t = p.timed(lambda: cc.cudnnAddTensor(p.handle, 1.0, net.biasDesc, b, 1.0, net.yDesc, y))
    return [y], t


def relu(p: Place, net: Network, x):
    y = p.xp.empty_like(x)
    t = p.timed(lambda: cc.cudnnActivationForward(p.handle, net.actDesc, 1.0, net.yDesc, x, 0.0, net.yDesc, y))
    return [y], t


def max_pool(p: Place, net: Network, x):
    y = p.xp.empty(net.p_shape, p.xp.float32)
    t = p.timed(lambda: cc.cudnnPoolingForward(p.handle, net.poolDesc, 1.0, net.yDesc, x, 0.0, net.pDesc, y))
    return [y], t


def batch_norm(p: Place, net: Network, x):
    xp = p.xp
    k = net.p_shape[1]
    y = xp.empty_like(x)
    run_mean, run_var = xp.zeros((1, k, 1, 1), xp.float32), xp.ones((1, k, 1, 1), xp.float32)
    save_mean, save_inv = xp.empty((1, k, 1, 1), xp.float32), xp.empty((1, k, 1, 1), xp.float32)
    gamma, beta = p.put(net.gamma), p.put(net.beta)
    t = p.timed(lambda: cc.cudnnBatchNormalizationForwardTraining(
        p.handle, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, net.pDesc, x, net.pDesc, y, net.bnDesc, gamma, beta,
        0.1, run_mean, run_var, 1e-5, save_mean, save_inv))
    return [y, run_mean, run_var, save_mean, save_inv], t


def softmax(p: Place, net: Network, x):
    y = p.xp.empty_like(x)
    t = p.timed(lambda: cc.cudnnSoftmaxForward(p.handle, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL,
                                               1.0, net.pDesc, x, 0.0, net.pDesc, y))
    return [y], t


STAGES = (
    ("ConvolutionForward", conv), ("AddTensor (bias)", add_bias), ("ActivationForward (relu)", relu),
    ("PoolingForward (max)", max_pool), ("BatchNormalizationForwardTraining", batch_norm),
    ("SoftmaxForward", softmax),
)


@contextlib.contextmanager
def _unforced():
    """The reference run ignores CUDNN_COMPAT_ENGINE (which may force a GPU-only engine)."""
    forced = os.environ.pop("CUDNN_COMPAT_ENGINE", None)
    try:
        yield
    finally:
        if forced is not None:
            os.environ["CUDNN_COMPAT_ENGINE"] = forced


@dataclass
class Row:
    op: str
    engine: str
    error: float
    tol: float
    seconds: float
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.note and self.error <= self.tol


def run(place: "str | None" = None, seed: int = 0, rtol: float = 5e-3) -> list:
    """Run the network on ``place`` (default: the default place) and on the CPU reference;
    one Row per op.  The tolerance of an op is ``rtol * max(1, max|reference output|)``."""
    net = Network(seed)
    dev, ref = Place(place or default_place()), Place("cpu")
    rows = []
    try:
        x_ref = net.x
        for name, fn in STAGES:
            with _unforced():
                ref_out, _ = fn(ref, net, ref.put(x_ref))
            try:
                x_dev = dev.put(x_ref)
                fn(dev, net, x_dev)  # cold call: plan build
                dev_out, seconds = fn(dev, net, x_dev)
                engine = cc.last_engine() or "?"
                err = max(float(np.max(np.abs(dev.get(d).astype(np.float64) - ref.get(r)))) for d, r in zip(dev_out, ref_out))
                note = ""
            except Exception as e:  # a CuDNNError, or an engine's own failure: report it in the table
                engine, err, seconds = "-", float("inf"), 0.0
                note = str(e) if isinstance(e, cc.CuDNNError) else f"{type(e).__name__}: {e}"
            scale = max(1.0, max(float(np.max(np.abs(ref.get(r)))) for r in ref_out))
            rows.append(Row(name, engine, err, rtol * scale, seconds, note))
            x_ref = ref.get(ref_out[0])
    finally:
        dev.close()
        ref.close()
    return rows


def format_table(rows: list, place: str) -> str:
    head = f"{'op':<36} {'engine':<12} {'max abs err':>12} {'tolerance':>10} {'time ms':>9}  result"
    lines = [f"cudnn-compat demo on the {place} place, checked against the CPU reference engine", head, "-" * len(head)]
    for r in rows:
        result = "ok" if r.ok else ("ERROR: " + r.note if r.note else "FAIL")
        lines.append(f"{r.op:<36} {r.engine:<12} {r.error:>12.3e} {r.tol:>10.1e} {1e3 * r.seconds:>9.3f}  {result}")
    return "\n".join(lines)
