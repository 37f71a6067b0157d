"""``cudnn-compat demo``: a small network written the legacy way, calling only the public legacy
API (docs/tools.md "The command line"):

    conv 3x3 -> AddTensor bias -> ReLU -> max pool 2x2 -> batch norm (training) -> softmax

It runs on a handle of the default place (GPU when there is one; CuPy arrays there) or the place
asked for, and checks every op against an independent NumPy formula written here in float64
(``FORMULAS``: the convolution by explicit loops over output positions, the bias sum, max(x, 0),
window maxima, batch statistics, exp-normalize), never against the library's own reference
engine.  Each op is fed the formula's input to that op, so the error printed is the op's own:
max |output - formula| over its outputs (float32 rounding shows on the CPU too).  The engine
column is the plan's engine (``cudnn_compat.last_engine()``); the time is a warm call's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

import cudnn_compat as cc
from .._core.place import default_place

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
        EXP_AVG_FACTOR, run_mean, run_var, BN_EPS, save_mean, save_inv))
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


# -- the independent formulas (float64 NumPy; the legacy semantics of 002 for each call) ---------

EXP_AVG_FACTOR, BN_EPS = 0.1, 1e-5  # what batch_norm() passes


def conv_formula(net: Network, x) -> list:
    """Cross-correlation, pad 1, stride 1 (SetConvolution2dDescriptor(1, 1, 1, 1, 1, 1)):
    y[n, k, i, j] = sum_{c, r, s} xpad[n, c, i + r, j + s] * w[k, c, r, s], by output position."""
    w = net.w.astype(np.float64)
    kk, _, r, s = w.shape
    xpad = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    n, _, hp, wp = xpad.shape
    y = np.zeros((n, kk, hp - r + 1, wp - s + 1))
    for i in range(y.shape[2]):
        for j in range(y.shape[3]):
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", xpad[:, :, i:i + r, j:j + s], w)
    return [y]


def bias_formula(net: Network, y) -> list:
    """AddTensor(alpha 1, beta 1): y + bias, broadcast over N, H, W."""
    return [np.asarray(y, np.float64) + net.bias.astype(np.float64)]


def relu_formula(net: Network, x) -> list:
    return [np.maximum(np.asarray(x, np.float64), 0.0)]


def max_pool_formula(net: Network, x) -> list:
    """2x2 windows, stride 2, no padding: the maximum of each window."""
    x = np.asarray(x, np.float64)
    n, c, h, w = x.shape
    ho, wo = h // 2, w // 2
    out = np.full((n, c, ho, wo), -np.inf)
    for dr in range(2):
        for ds in range(2):
            out = np.maximum(out, x[:, :, dr:2 * ho:2, ds:2 * wo:2])
    return [out]


def batch_norm_formula(net: Network, x) -> list:
    """Spatial batch norm, training (002 BatchNormalizationForwardTraining): per channel mean and
    biased variance over N, H, W; y = gamma (x - mean) / sqrt(var + eps) + beta; running mean and
    variance (from 0 and 1) move by the factor, the variance unbiased (m / (m - 1)); saved mean
    and inverse standard deviation."""
    x = np.asarray(x, np.float64)
    m = x.shape[0] * x.shape[2] * x.shape[3]
    mean = x.sum(axis=(0, 2, 3), keepdims=True) / m
    var = ((x - mean) ** 2).sum(axis=(0, 2, 3), keepdims=True) / m
    inv = 1.0 / np.sqrt(var + BN_EPS)
    y = net.gamma.astype(np.float64) * (x - mean) * inv + net.beta.astype(np.float64)
    f = EXP_AVG_FACTOR
    return [y, (1 - f) * 0.0 + f * mean, (1 - f) * 1.0 + f * var * m / (m - 1), mean, inv]


def softmax_formula(net: Network, x) -> list:
    """ACCURATE, MODE_CHANNEL: exp(x - max_c x) / sum_c exp(x - max_c x) at each (n, h, w)."""
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return [e / e.sum(axis=1, keepdims=True)]


FORMULAS = (conv_formula, bias_formula, relu_formula, max_pool_formula, batch_norm_formula, softmax_formula)


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


RTOL = {"cpu": 1e-5, "gpu": 5e-3}  # float32 arithmetic; on a GPU, DEFAULT_MATH convolutions may use TF32


def run(place: "str | None" = None, seed: int = 0, rtol: "float | None" = None) -> list:
    """Run the network on ``place`` (default: the default place) and check each op against its
    formula; one Row per op.  The tolerance of an op is ``rtol * max(1, max|formula output|)``,
    ``rtol`` by place (``RTOL``) unless given."""
    net = Network(seed)
    dev = Place(place or default_place())
    rtol = RTOL[dev.place] if rtol is None else rtol
    rows = []
    try:
        x = net.x  # the formula's input to each op (float32, as the network's tensors are)
        for (name, fn), formula in zip(STAGES, FORMULAS):
            want = formula(net, x)
            try:
                x_dev = dev.put(x)
                fn(dev, net, x_dev)  # cold call: plan build
                dev_out, seconds = fn(dev, net, x_dev)
                engine = cc.last_engine() or "?"
                err = max(float(np.max(np.abs(dev.get(d).astype(np.float64) - w))) for d, w in zip(dev_out, want))
                note = ""
            except Exception as e:  # a CuDNNError, or an engine's own failure: report it in the table
                engine, err, seconds = "-", float("inf"), 0.0
                note = str(e) if isinstance(e, cc.CuDNNError) else f"{type(e).__name__}: {e}"
            scale = max(1.0, max(float(np.max(np.abs(w))) for w in want))
            rows.append(Row(name, engine, err, rtol * scale, seconds, note))
            x = want[0].astype(np.float32)
    finally:
        dev.close()
    return rows


def format_table(rows: list, place: str) -> str:
    head = f"{'op':<36} {'engine':<12} {'max abs err':>12} {'tolerance':>10} {'time ms':>9}  result"
    lines = [f"cudnn-compat demo on the {place} place, checked against independent NumPy formulas (float64)", head, "-" * len(head)]
    for r in rows:
        result = "ok" if r.ok else ("ERROR: " + r.note if r.note else "FAIL")
        lines.append(f"{r.op:<36} {r.engine:<12} {r.error:>12.3e} {r.tol:>10.1e} {1e3 * r.seconds:>9.3f}  {result}")
    return "\n".join(lines)
