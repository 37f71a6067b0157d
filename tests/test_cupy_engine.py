"""The ``cupy`` engine (issue 4) on a GPU handle, forced with CUDNN_COMPAT_ENGINE=cupy, against
the reference engine on a CPU handle with identical inputs, through the public legacy API:
every op kind over a grid of shapes, layouts (NCHW, NHWC, padded strides), dtypes and
alpha/beta (beta = 0 with NaN in y); fusion (a chain is one kernel), streams, device
pointers and the kernel dump.  Skipped without a CUDA GPU."""
import os

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import packed_strides
from conftest import tdesc
from conv_util import cdesc, fdesc

pytestmark = pytest.mark.gpu

DT = {"float32": cc.CUDNN_DATA_FLOAT, "float64": cc.CUDNN_DATA_DOUBLE, "float16": cc.CUDNN_DATA_HALF,
      "bfloat16": cc.CUDNN_DATA_BFLOAT16}
TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}
FLOATS = ("float32", "float64", "float16", "bfloat16")
NAN = float("nan")


# -- harness --------------------------------------------------------------------------------

def layout_strides(shape, layout):
    n = len(shape)
    if layout == "NHWC":
        order = [0] + list(range(2, n)) + [1]
        st, acc = [0] * n, 1
        for a in reversed(order):
            st[a] = acc
            acc *= shape[a]
        return tuple(st)
    if layout == "strided":  # every row padded by 3 elements, the channel plane by 1 row
        dims = list(shape)
        st, acc = [0] * n, 1
        for a in reversed(range(n)):
            st[a] = acc
            acc *= dims[a] + (3 if a == n - 1 else 1 if a == n - 2 else 0)
        return tuple(st)
    return packed_strides(shape)


class T:
    """A tensor argument: descriptor, logical shape, strides, dtype and its host memory."""

    def __init__(self, rng, shape, dtype="float32", layout="NCHW", fill=None, scale=1.0, low=None):
        self.shape, self.dtype = tuple(shape), dtype
        self.strides = layout_strides(shape, layout)
        self.desc = tdesc(self.shape, DT[dtype], strides=self.strides)
        span = 1 + sum((d - 1) * s for d, s in zip(self.shape, self.strides))
        if fill is not None:
            vals = np.full(span, fill)
        elif low is not None:
            vals = rng.uniform(low, low + scale, span)
        else:
            vals = rng.standard_normal(span) * scale
        self.host = dtypes.to_storage(vals, dtype)

    def logical(self, mem):
        sd = dtypes.storage_dtype(self.dtype)
        view = np.ndarray(self.shape, dtype=sd, buffer=np.ascontiguousarray(mem),
                          strides=tuple(s * sd.itemsize for s in self.strides))
        return dtypes.load(view, self.dtype)


@pytest.fixture(scope="module")
def handles():
    hc, hg = cc.cudnnCreate("cpu"), cc.cudnnCreate("gpu")
    yield hc, hg
    cc.cudnnDestroy(hc)
    cc.cudnnDestroy(hg)


@pytest.fixture(autouse=True)
def fresh_plans():
    cc.plan_cache_clear()
    yield


class forced:
    """CUDNN_COMPAT_ENGINE set to ``engine`` inside the block."""

    def __init__(self, engine="cupy"):
        self.engine = engine

    def __enter__(self):
        self.old = os.environ.get("CUDNN_COMPAT_ENGINE")
        os.environ["CUDNN_COMPAT_ENGINE"] = self.engine

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("CUDNN_COMPAT_ENGINE", None)
        else:
            os.environ["CUDNN_COMPAT_ENGINE"] = self.old


def compare(handles, call, args: dict, outs, tol=None, equal_nan=True):
    """Run ``call(handle, data)`` on the CPU handle (NumPy copies) and on the GPU handle with the
    cupy engine forced (CuPy copies); compare every tensor named in ``outs``, gaps included."""
    import cupy
    hc, hg = handles
    ref = {k: v.host.copy() if isinstance(v, T) else v for k, v in args.items()}
    call(hc, ref)
    dev = {k: cupy.asarray(v.host) if isinstance(v, T) else v for k, v in args.items()}
    with forced():
        call(hg, dev)
    assert cc.last_engine() == "cupy"
    cupy.cuda.get_current_stream().synchronize()
    assert_outputs_match(args, outs, ref, {name: cupy.asnumpy(dev[name]) for name in outs}, tol)
    return ref, dev


def assert_outputs_match(args: dict, outs, ref: dict, mems: dict, tol=None):
    """Every tensor named in ``outs``: ``mems`` (host memory) against ``ref`` (the expectation) in
    NaN/inf positions, norm-relative and elementwise error within ``tol`` (default TOL of its
    dtype), and stride gaps left as they were."""
    for name in outs:
        t = args[name]
        got_mem = mems[name]
        want, got = t.logical(ref[name]), t.logical(got_mem)
        assert np.array_equal(np.isnan(want), np.isnan(got)), f"{name}: NaN positions differ"
        fin = np.isfinite(want)
        assert np.array_equal(want[~fin & ~np.isnan(want)], got[~fin & ~np.isnan(want)]), f"{name}: inf differ"
        w, g = want[fin], got[fin]
        rel = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
        eps = tol if tol is not None else TOL[t.dtype]
        assert rel <= eps, f"{name}: relative error {rel:.3g} > {eps}"
        scale = np.sqrt(np.mean(w * w)) if w.size else 0.0
        assert np.all(np.abs(g - w) <= 20 * eps * (np.abs(w) + scale) + 1e-300), f"{name}: elementwise error"
        # bytes outside the tensor (stride gaps) are untouched
        mask = np.ones(got_mem.size, bool)
        sd = dtypes.storage_dtype(t.dtype)
        idx = np.ndarray(t.shape, dtype=np.int64, buffer=np.arange(got_mem.size, dtype=np.int64),
                         strides=tuple(s * 8 for s in t.strides))
        mask[idx.ravel()] = False
        assert np.array_equal(got_mem.view(sd)[mask].view(np.uint8), t.host[mask].view(np.uint8)), f"{name}: gap written"


ALPHA_BETA = [(1.0, 0.0), (0.5, -0.25)]


def out_tensor(rng, shape, dtype, layout, beta):
    """The output: NaN-filled when beta == 0 (it must not be read)."""
    return T(rng, shape, dtype, layout, fill=NAN if beta == 0 else None)


# -- tensor ops -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "strided"])
@pytest.mark.parametrize("ashape", [(1, 5, 1, 1), (2, 5, 3, 4)])
@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
def test_add_tensor(handles, rng, dtype, layout, ashape, alpha, beta):
    a = T(rng, ashape, dtype, "NCHW")
    c = out_tensor(rng, (2, 5, 3, 4), dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnAddTensor(h, alpha, a.desc, d["a"], beta, c.desc, d["c"]),
            {"a": a, "c": c}, ["c"])


OPS = ["CUDNN_OP_TENSOR_ADD", "CUDNN_OP_TENSOR_MUL", "CUDNN_OP_TENSOR_MIN", "CUDNN_OP_TENSOR_MAX",
       "CUDNN_OP_TENSOR_SQRT", "CUDNN_OP_TENSOR_NOT"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype, layout", [("float32", "NCHW"), ("float64", "NHWC"), ("float16", "strided"),
                                           ("bfloat16", "NCHW")])
@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
def test_op_tensor(handles, rng, op, dtype, layout, alpha, beta):
    comp = cc.CUDNN_DATA_DOUBLE if dtype == "float64" else cc.CUDNN_DATA_FLOAT
    od = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(od, getattr(cc, op), comp, cc.CUDNN_NOT_PROPAGATE_NAN)
    low = 0.1 if op == "CUDNN_OP_TENSOR_SQRT" else None
    a = T(rng, (2, 3, 4, 5), dtype, layout, low=low)
    b = T(rng, (1, 3, 1, 5), dtype)
    c = out_tensor(rng, (2, 3, 4, 5), dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnOpTensor(h, od, alpha, a.desc, d["a"], 0.75, b.desc, d["b"], beta, c.desc, d["c"]),
            {"a": a, "b": b, "c": c}, ["c"])


@pytest.mark.parametrize("dtype", FLOATS)
def test_set_scale_transform(handles, rng, dtype):
    y = T(rng, (2, 3, 4, 5), dtype, "strided")
    compare(handles, lambda h, d: cc.cudnnSetTensor(h, y.desc, d["y"], 1.25), {"y": y}, ["y"])
    compare(handles, lambda h, d: cc.cudnnScaleTensor(h, y.desc, d["y"], -2.0), {"y": y}, ["y"])
    x = T(rng, (2, 3, 4, 5), dtype, "NCHW")
    z = T(rng, (2, 3, 4, 5), dtype, "NHWC")
    compare(handles, lambda h, d: cc.cudnnTransformTensor(h, 1.5, x.desc, d["x"], 0.5, z.desc, d["z"]),
            {"x": x, "z": z}, ["z"])


ACTS = [("CUDNN_ACTIVATION_RELU", 0.0), ("CUDNN_ACTIVATION_SIGMOID", 0.0), ("CUDNN_ACTIVATION_TANH", 0.0),
        ("CUDNN_ACTIVATION_CLIPPED_RELU", 0.7), ("CUDNN_ACTIVATION_ELU", 0.3), ("CUDNN_ACTIVATION_SWISH", 0.0)]


@pytest.mark.parametrize("mode, coef", ACTS)
@pytest.mark.parametrize("dtype, layout", [("float32", "NCHW"), ("float64", "strided"), ("float16", "NHWC"),
                                           ("bfloat16", "NCHW")])
@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
def test_activation_forward_backward(handles, rng, mode, coef, dtype, layout, alpha, beta):
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, getattr(cc, mode), cc.CUDNN_NOT_PROPAGATE_NAN, coef)
    x = T(rng, (2, 3, 4, 5), dtype, layout)
    y = out_tensor(rng, (2, 3, 4, 5), dtype, layout, beta)
    ref, _ = compare(handles, lambda h, d: cc.cudnnActivationForward(h, ad, alpha, x.desc, d["x"], beta, y.desc, d["y"]),
                     {"x": x, "y": y}, ["y"])
    yv = T(rng, (2, 3, 4, 5), dtype, layout)
    cc.cudnnActivationForward(handles[0], ad, 1.0, x.desc, x.host, 0.0, yv.desc, yv.host)
    dy = T(rng, (2, 3, 4, 5), dtype, layout)
    dx = out_tensor(rng, (2, 3, 4, 5), dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnActivationBackward(h, ad, alpha, yv.desc, d["y"], dy.desc, d["dy"], x.desc,
                                                              d["x"], beta, dx.desc, d["dx"]),
            {"y": yv, "dy": dy, "x": x, "dx": dx}, ["dx"])


REDUCE = ["CUDNN_REDUCE_TENSOR_ADD", "CUDNN_REDUCE_TENSOR_MUL", "CUDNN_REDUCE_TENSOR_MIN", "CUDNN_REDUCE_TENSOR_MAX",
          "CUDNN_REDUCE_TENSOR_AMAX", "CUDNN_REDUCE_TENSOR_AVG", "CUDNN_REDUCE_TENSOR_NORM1",
          "CUDNN_REDUCE_TENSOR_NORM2", "CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS"]


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("cshape", [(1, 3, 1, 1), (2, 1, 4, 5), (2, 3, 4, 1), (1, 1, 1, 1)])
@pytest.mark.parametrize("dtype, layout", [("float32", "NCHW"), ("float32", "NHWC"), ("float64", "strided")])
def test_reduce_tensor(handles, rng, op, cshape, dtype, layout):
    comp = cc.CUDNN_DATA_DOUBLE if dtype == "float64" else cc.CUDNN_DATA_FLOAT
    want_idx = op in ("CUDNN_REDUCE_TENSOR_MIN", "CUDNN_REDUCE_TENSOR_MAX", "CUDNN_REDUCE_TENSOR_AMAX")
    rd = cc.cudnnCreateReduceTensorDescriptor()
    cc.cudnnSetReduceTensorDescriptor(rd, getattr(cc, op), comp, cc.CUDNN_PROPAGATE_NAN,
                                      cc.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES if want_idx else
                                      cc.CUDNN_REDUCE_TENSOR_NO_INDICES, cc.CUDNN_32BIT_INDICES)
    a = T(rng, (2, 3, 4, 5), dtype, layout, scale=0.5 if "MUL" in op else 1.0)
    c = T(rng, cshape, dtype)
    args = {"a": a, "c": c}
    outs = ["c"]
    if want_idx:
        i = T(rng, cshape, "float32", fill=0)
        i.host = np.zeros(int(np.prod(cshape)), np.int32)
        i.dtype = "int32"
        args["i"] = i
        outs.append("i")
    wsize = cc.cudnnGetReductionWorkspaceSize(handles[0], rd, a.desc, c.desc)
    isize = cc.cudnnGetReductionIndicesSize(handles[0], rd, a.desc, c.desc)

    def call(h, d):
        ws = _ws(h, wsize)[0]
        cc.cudnnReduceTensor(h, rd, d.get("i"), isize, ws, wsize, 1.5, a.desc, d["a"], 0.5, c.desc, d["c"])

    compare(handles, call, args, outs, tol=1e-5 if dtype == "float32" else 1e-12)


# -- softmax, pooling, LRN, divisive normalization ------------------------------------------------

@pytest.mark.parametrize("algo", ["CUDNN_SOFTMAX_FAST", "CUDNN_SOFTMAX_ACCURATE", "CUDNN_SOFTMAX_LOG"])
@pytest.mark.parametrize("mode", ["CUDNN_SOFTMAX_MODE_INSTANCE", "CUDNN_SOFTMAX_MODE_CHANNEL"])
@pytest.mark.parametrize("shape, dtype, layout", [((3, 40, 1, 1), "float32", "NCHW"), ((2, 20, 3, 5), "float32", "NHWC"),
                                                  ((2, 20, 3, 5), "float64", "strided"), ((2, 7, 3, 5), "float16", "NCHW"),
                                                  ((2, 7, 3, 5), "bfloat16", "NHWC"), ((64, 300, 1, 1), "float32", "NCHW")])
@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
def test_softmax(handles, rng, algo, mode, shape, dtype, layout, alpha, beta):
    x = T(rng, shape, dtype, layout)
    y = out_tensor(rng, shape, dtype, layout, beta)
    A, M = getattr(cc, algo), getattr(cc, mode)
    compare(handles, lambda h, d: cc.cudnnSoftmaxForward(h, A, M, alpha, x.desc, d["x"], beta, y.desc, d["y"]),
            {"x": x, "y": y}, ["y"])
    yv = T(rng, shape, dtype, layout)
    cc.cudnnSoftmaxForward(handles[0], A, M, 1.0, x.desc, x.host, 0.0, yv.desc, yv.host)
    dy = T(rng, shape, dtype, layout)
    dx = out_tensor(rng, shape, dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnSoftmaxBackward(h, A, M, alpha, yv.desc, d["y"], dy.desc, d["dy"], beta,
                                                           dx.desc, d["dx"]),
            {"y": yv, "dy": dy, "dx": dx}, ["dx"])


POOL = ["CUDNN_POOLING_MAX", "CUDNN_POOLING_MAX_DETERMINISTIC", "CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING",
        "CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING"]


POOL_CASES = [  # xshape, win, pad, stride, dtype, layout (test_numpy_engine.py's pooling grid holds these too)
    ((2, 3, 7, 9), (3, 3), (1, 1), (2, 2), "float32", "NCHW"),
    ((2, 3, 7, 9), (3, 2), (0, 1), (1, 2), "float32", "NHWC"),
    ((2, 3, 8, 8), (2, 2), (0, 0), (2, 2), "float64", "strided"),
    ((2, 3, 7, 9), (3, 3), (1, 1), (2, 2), "float16", "NHWC"),
    ((1, 2, 4, 5, 6), (2, 2, 3), (1, 0, 1), (2, 1, 2), "float32", "NCHW")]


@pytest.mark.parametrize("mode", POOL)
@pytest.mark.parametrize("xshape, win, pad, stride, dtype, layout", POOL_CASES)
@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
def test_pooling(handles, rng, mode, xshape, win, pad, stride, dtype, layout, alpha, beta):
    pd = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPoolingNdDescriptor(pd, getattr(cc, mode), cc.CUDNN_NOT_PROPAGATE_NAN, len(win), list(win), list(pad),
                                   list(stride))
    x = T(rng, xshape, dtype, layout)
    yshape = tuple(cc.cudnnGetPoolingNdForwardOutputDim(pd, x.desc, len(xshape)))
    y = out_tensor(rng, yshape, dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnPoolingForward(h, pd, alpha, x.desc, d["x"], beta, y.desc, d["y"]),
            {"x": x, "y": y}, ["y"])
    yv = T(rng, yshape, dtype, layout)
    cc.cudnnPoolingForward(handles[0], pd, 1.0, x.desc, x.host, 0.0, yv.desc, yv.host)
    dy = T(rng, yshape, dtype, layout)
    dx = out_tensor(rng, xshape, dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnPoolingBackward(h, pd, alpha, yv.desc, d["y"], dy.desc, d["dy"], x.desc,
                                                           d["x"], beta, dx.desc, d["dx"]),
            {"y": yv, "dy": dy, "x": x, "dx": dx}, ["dx"])


@pytest.mark.parametrize("n", [1, 4, 5])
@pytest.mark.parametrize("dtype, layout", [("float32", "NCHW"), ("float32", "NHWC"), ("float64", "NCHW"),
                                           ("float16", "NCHW")])
@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
def test_lrn(handles, rng, n, dtype, layout, alpha, beta):
    ld = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(ld, n, 0.5, 0.75, 2.0)
    shape = (2, 7, 3, 4)
    dim1 = cc.CUDNN_LRN_CROSS_CHANNEL_DIM1
    x = T(rng, shape, dtype, layout)
    y = out_tensor(rng, shape, dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnLRNCrossChannelForward(h, ld, dim1, alpha, x.desc, d["x"], beta, y.desc, d["y"]),
            {"x": x, "y": y}, ["y"])
    yv = T(rng, shape, dtype, layout)
    cc.cudnnLRNCrossChannelForward(handles[0], ld, dim1, 1.0, x.desc, x.host, 0.0, yv.desc, yv.host)
    dy = T(rng, shape, dtype, layout)
    dx = out_tensor(rng, shape, dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnLRNCrossChannelBackward(h, ld, dim1, alpha, yv.desc, d["y"], dy.desc, d["dy"],
                                                                   x.desc, d["x"], beta, dx.desc, d["dx"]),
            {"y": yv, "dy": dy, "x": x, "dx": dx}, ["dx"])


@pytest.mark.parametrize("means", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
def test_divisive_normalization(handles, rng, means, dtype, alpha, beta):
    ld = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(ld, 3, 0.5, 0.75, 2.0)
    shape = (2, 3, 5, 6)
    mode = cc.CUDNN_DIVNORM_PRECOMPUTED_MEANS
    x, dy = T(rng, shape, dtype), T(rng, shape, dtype)
    m = T(rng, shape, dtype, scale=0.3) if means else None
    y = out_tensor(rng, shape, dtype, "NCHW", beta)
    tmp = {k: T(rng, shape, dtype) for k in ("t1", "t2")}
    args = {"x": x, "y": y, **tmp}
    if means:
        args["m"] = m
    compare(handles, lambda h, d: cc.cudnnDivisiveNormalizationForward(h, ld, mode, alpha, x.desc, d["x"], d.get("m"),
                                                                        d["t1"], d["t2"], beta, y.desc, d["y"]),
            args, ["y"])
    dx, dm = out_tensor(rng, shape, dtype, "NCHW", beta), out_tensor(rng, shape, dtype, "NCHW", beta)
    args = {"x": x, "dy": dy, "dx": dx, "dm": dm, **tmp}
    if means:
        args["m"] = m
    compare(handles, lambda h, d: cc.cudnnDivisiveNormalizationBackward(h, ld, mode, alpha, x.desc, d["x"], d.get("m"),
                                                                         d["dy"], d["t1"], d["t2"], beta, x.desc,
                                                                         d["dx"], d["dm"]),
            args, ["dx", "dm"] if means else ["dx"])


# -- batch normalization --------------------------------------------------------------------------

BN_CASES = [("CUDNN_BATCHNORM_SPATIAL", (4, 3, 5, 6), "float32", "NCHW"),
            ("CUDNN_BATCHNORM_SPATIAL", (4, 3, 5, 6), "float32", "NHWC"),
            ("CUDNN_BATCHNORM_SPATIAL_PERSISTENT", (32, 8, 16, 16), "float32", "NHWC"),
            ("CUDNN_BATCHNORM_PER_ACTIVATION", (4, 3, 5, 6), "float32", "NCHW"),
            ("CUDNN_BATCHNORM_SPATIAL", (4, 3, 5, 6), "float64", "strided"),
            ("CUDNN_BATCHNORM_SPATIAL", (4, 3, 2, 5, 6), "float16", "NCHW"),
            ("CUDNN_BATCHNORM_SPATIAL", (64, 16, 32, 32), "float32", "NCHW")]


def _bn_params(rng, mode, shape, dtype):
    pd = cc.cudnnCreateTensorDescriptor()
    xd = tdesc(shape, DT[dtype])
    cc.cudnnDeriveBNTensorDescriptor(pd, xd, mode)
    ps = tuple(cc.cudnnGetTensorNdDescriptor(pd)[2])
    pt = "float64" if dtype == "float64" else "float32"
    mk = lambda **kw: T(rng, ps, pt, **kw)  # noqa: E731
    return ps, pt, mk


@pytest.mark.parametrize("mode, shape, dtype, layout", BN_CASES)
@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
def test_batchnorm_training_and_inference(handles, rng, mode, shape, dtype, layout, alpha, beta):
    mode = getattr(cc, mode)
    ps, pt, mk = _bn_params(rng, mode, shape, dtype)
    x = T(rng, shape, dtype, layout, scale=2.0, low=None)
    x.host = dtypes.to_storage(dtypes.load(x.host, dtype) + 3.0, dtype)  # |mean| > std: the shifted sums matter
    y = out_tensor(rng, shape, dtype, layout, beta)
    scale, bias = mk(low=0.5), mk()
    rm, rv, sm, si = mk(), mk(low=0.5), mk(fill=NAN), mk(fill=NAN)
    compare(handles, lambda h, d: cc.cudnnBatchNormalizationForwardTraining(
        h, mode, alpha, beta, x.desc, d["x"], y.desc, d["y"], scale.desc, d["scale"], d["bias"], 0.1, d["rm"], d["rv"],
        1e-4, d["sm"], d["si"]), {"x": x, "y": y, "scale": scale, "bias": bias, "rm": rm, "rv": rv, "sm": sm, "si": si},
        ["y", "rm", "rv", "sm", "si"], tol=1e-4 if dtype == "float32" else None)
    y2 = out_tensor(rng, shape, dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnBatchNormalizationForwardInference(
        h, mode, alpha, beta, x.desc, d["x"], y2.desc, d["y"], scale.desc, d["scale"], d["bias"], d["rm"], d["rv"], 1e-4),
        {"x": x, "y": y2, "scale": scale, "bias": bias, "rm": rm, "rv": rv}, ["y"])


@pytest.mark.parametrize("mode, shape, dtype, layout", BN_CASES)
@pytest.mark.parametrize("saved", [True, False])
def test_batchnorm_backward(handles, rng, mode, shape, dtype, layout, saved):
    mode = getattr(cc, mode)
    ps, pt, mk = _bn_params(rng, mode, shape, dtype)
    x, dy = T(rng, shape, dtype, layout), T(rng, shape, dtype, layout)
    scale = mk(low=0.5)
    sm, si = mk(), mk()
    ysc, yb = T(rng, shape, dtype, layout), mk()
    cc.cudnnBatchNormalizationForwardTraining(handles[0], mode, 1.0, 0.0, x.desc, x.host, ysc.desc, ysc.host, scale.desc,
                                              scale.host, yb.host, 0.1, None, None, 1e-4, sm.host, si.host)
    dx, ds, db = T(rng, shape, dtype, layout), mk(), mk()
    args = {"x": x, "dy": dy, "dx": dx, "scale": scale, "ds": ds, "db": db, "sm": sm, "si": si}
    compare(handles, lambda h, d: cc.cudnnBatchNormalizationBackward(
        h, mode, 0.5, 0.25, 2.0, -0.5, x.desc, d["x"], dy.desc, d["dy"], dx.desc, d["dx"], scale.desc, d["scale"],
        d["ds"], d["db"], 1e-4, d["sm"] if saved else None, d["si"] if saved else None),
        args, ["dx", "ds", "db"], tol=1e-4 if dtype == "float32" else None)


@pytest.mark.parametrize("ops", ["CUDNN_BATCHNORM_OPS_BN_ACTIVATION", "CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION"])
def test_batchnorm_ex_add_relu(handles, rng, ops):
    mode, bn_ops = cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT, getattr(cc, ops)
    shape, dtype, layout = (8, 4, 6, 6), "float16", "NHWC"
    ps, pt, mk = _bn_params(rng, mode, shape, dtype)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    x, z, y = T(rng, shape, dtype, layout), T(rng, shape, dtype, layout), T(rng, shape, dtype, layout, fill=NAN)
    scale, bias, rm, rv, sm, si = mk(low=0.5), mk(), mk(), mk(low=0.5), mk(), mk()
    add = bn_ops == cc.CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
    zd = z.desc if add else None

    def fwd(h, d):
        wsz = cc.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, mode, bn_ops, x.desc, zd, y.desc,
                                                                          scale.desc, ad)
        rsz = cc.cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, mode, bn_ops, ad, x.desc)
        alloc = (lambda n: np.zeros(max(n, 1), np.uint8)) if h.place == "cpu" else (lambda n: __import__("cupy").zeros(max(n, 1), np.uint8))
        cc.cudnnBatchNormalizationForwardTrainingEx(h, mode, bn_ops, 1.0, 0.0, x.desc, d["x"], zd, d["z"] if add else None,
                                                    y.desc, d["y"], scale.desc, d["scale"], d["bias"], 0.1, d["rm"],
                                                    d["rv"], 1e-4, d["sm"], d["si"], ad, alloc(wsz), wsz, alloc(rsz), rsz)

    compare(handles, fwd, {"x": x, "z": z, "y": y, "scale": scale, "bias": bias, "rm": rm, "rv": rv, "sm": sm, "si": si},
            ["y", "rm", "rv", "sm", "si"])


# -- convolutions ---------------------------------------------------------------------------------

CONV_CASES = [  # xshape, wshape, pad, stride, dil, groups, dtype, layout, mode
    ((2, 4, 7, 6), (6, 2, 3, 3), (1, 1), (1, 2), (1, 1), 2, "float32", "NCHW", "CUDNN_CROSS_CORRELATION"),
    ((2, 4, 7, 6), (6, 4, 3, 3), (1, 1), (2, 1), (2, 1), 1, "float32", "NHWC", "CUDNN_CONVOLUTION"),
    ((2, 3, 6, 5), (4, 3, 2, 3), (0, 1), (1, 1), (1, 1), 1, "float64", "NCHW", "CUDNN_CROSS_CORRELATION"),
    ((2, 4, 6, 6), (4, 2, 3, 3), (1, 1), (1, 1), (1, 1), 2, "float16", "NHWC", "CUDNN_CROSS_CORRELATION"),
    ((2, 4, 6, 6), (4, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, "bfloat16", "NCHW", "CUDNN_CROSS_CORRELATION"),
    ((1, 2, 4, 5, 6), (3, 2, 2, 3, 2), (1, 0, 1), (1, 2, 1), (1, 1, 2), 1, "float32", "NCHW", "CUDNN_CROSS_CORRELATION"),
]


def _conv_setup(rng, xs, ws, pad, stride, dil, groups, dtype, layout, mode):
    comp = cc.CUDNN_DATA_DOUBLE if dtype == "float64" else cc.CUDNN_DATA_FLOAT
    cd = cdesc(pad, stride, dil, mode=getattr(cc, mode), compute=comp, groups=groups, math=cc.CUDNN_FMA_MATH)
    wfmt = cc.CUDNN_TENSOR_NHWC if layout == "NHWC" else cc.CUDNN_TENSOR_NCHW
    w = T(rng, ws, dtype, layout)
    w.desc = fdesc(ws, DT[dtype], wfmt)
    x = T(rng, xs, dtype, layout)
    ys = tuple(cc.cudnnGetConvolutionNdForwardOutputDim(cd, x.desc, w.desc, len(xs)))
    return cd, x, w, ys


def _ws(h, n):
    """A workspace of n bytes (at least 1) on the handle's place, and n."""
    xp = np if h.place == "cpu" else __import__("cupy")
    return xp.zeros(max(n, 1), np.uint8), n


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
def test_convolution_three_directions(handles, rng, case, alpha, beta):
    cd, x, w, ys = _conv_setup(rng, *case)
    dtype, layout = case[6], case[7]
    y = out_tensor(rng, ys, dtype, layout, beta)
    tol = 1e-5 if dtype == "float32" else None
    fwd = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM

    def f(h, d):
        buf, n = _ws(h, cc.cudnnGetConvolutionForwardWorkspaceSize(h, x.desc, w.desc, cd, y.desc, fwd))
        cc.cudnnConvolutionForward(h, alpha, x.desc, d["x"], w.desc, d["w"], cd, fwd, buf, n, beta, y.desc, d["y"])
    compare(handles, f, {"x": x, "w": w, "y": y}, ["y"], tol=tol)
    dy = T(rng, ys, dtype, layout)
    dx = out_tensor(rng, x.shape, dtype, layout, beta)
    bwd = cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_0  # ALGO_0 and filter ALGO_0 accept dilation

    def bd(h, d):
        buf, n = _ws(h, cc.cudnnGetConvolutionBackwardDataWorkspaceSize(h, w.desc, dy.desc, cd, dx.desc, bwd))
        cc.cudnnConvolutionBackwardData(h, alpha, w.desc, d["w"], dy.desc, d["dy"], cd, bwd, buf, n, beta, dx.desc, d["dx"])
    compare(handles, bd, {"w": w, "dy": dy, "dx": dx}, ["dx"], tol=tol)
    dw = out_tensor(rng, w.shape, dtype, layout, beta)
    dw.desc = w.desc
    bf = cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0

    def bfn(h, d):
        buf, n = _ws(h, cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x.desc, dy.desc, cd, dw.desc, bf))
        cc.cudnnConvolutionBackwardFilter(h, alpha, x.desc, d["x"], dy.desc, d["dy"], cd, bf, buf, n, beta, dw.desc, d["dw"])
    compare(handles, bfn, {"x": x, "dy": dy, "dw": dw}, ["dw"], tol=tol)
    if len(ys) == 4:
        db = out_tensor(rng, (1, ys[1], 1, 1), dtype, "NCHW", beta)
        compare(handles, lambda h, d: cc.cudnnConvolutionBackwardBias(h, alpha, dy.desc, d["dy"], beta, db.desc, d["db"]),
                {"dy": dy, "db": db}, ["db"], tol=tol)


@pytest.mark.parametrize("dtype, layout", [("float32", "NCHW"), ("float16", "NHWC"), ("float64", "NCHW")])
def test_conv_bias_activation(handles, rng, dtype, layout):
    cd, x, w, ys = _conv_setup(rng, (2, 4, 7, 6), (6, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, dtype, layout,
                               "CUDNN_CROSS_CORRELATION")
    y, z = T(rng, ys, dtype, layout), T(rng, ys, dtype, layout)
    b = T(rng, (1, ys[1], 1, 1), dtype)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM

    def f(h, d):
        buf, n = _ws(h, cc.cudnnGetConvolutionForwardWorkspaceSize(h, x.desc, w.desc, cd, y.desc, algo))
        cc.cudnnConvolutionBiasActivationForward(h, 0.5, x.desc, d["x"], w.desc, d["w"], cd, algo, buf, n, 0.25, z.desc,
                                                 d["z"], b.desc, d["b"], ad, y.desc, d["y"])
    compare(handles, f, {"x": x, "w": w, "y": y, "z": z, "b": b}, ["y"], tol=1e-5 if dtype == "float32" else None)


# -- engine behaviour -----------------------------------------------------------------------------

def _plan_of_last_call():
    from cudnn_compat._core.call import last_plan
    return last_plan()


def test_fused_chain_is_one_kernel(handles, rng):
    """Activation + blend, ReduceTensor + blend, ConvBiasAct's scale/add/bias/relu: one kernel each."""
    import cupy
    from cudnn_compat._backend.engines.cupy_engine import kernel_sources, runtime
    hc, hg = handles
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_TANH, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    x = T(rng, (2, 3, 4, 5))
    y = T(rng, (2, 3, 4, 5))
    dx, dy = cupy.asarray(x.host), cupy.asarray(y.host)
    with forced():
        cc.cudnnActivationForward(hg, ad, 2.0, x.desc, dx, 0.5, y.desc, dy)  # compiles
        n0 = runtime.LAUNCHES[0]
        cc.cudnnActivationForward(hg, ad, 2.0, x.desc, dx, 0.5, y.desc, dy)
        assert runtime.LAUNCHES[0] - n0 == 1
        plan = _plan_of_last_call()
        srcs = kernel_sources(plan)
        assert len(plan.graph.ops) == 2 and len(plan.runs) == 1 and "tanh" in srcs[0]
        rd = cc.cudnnCreateReduceTensorDescriptor()
        cc.cudnnSetReduceTensorDescriptor(rd, cc.CUDNN_REDUCE_TENSOR_NORM2, cc.CUDNN_DATA_FLOAT, cc.CUDNN_NOT_PROPAGATE_NAN,
                                          cc.CUDNN_REDUCE_TENSOR_NO_INDICES, cc.CUDNN_32BIT_INDICES)
        c = T(rng, (1, 3, 1, 1))
        dc = cupy.asarray(c.host)
        ws = cupy.zeros(1 << 16, np.uint8)
        cc.cudnnReduceTensor(hg, rd, None, 0, ws, 1 << 16, 1.0, x.desc, dx, 0.5, c.desc, dc)
        n0 = runtime.LAUNCHES[0]
        cc.cudnnReduceTensor(hg, rd, None, 0, ws, 1 << 16, 1.0, x.desc, dx, 0.5, c.desc, dc)
        assert runtime.LAUNCHES[0] - n0 == 1
        plan = _plan_of_last_call()
        assert [op.kind for op in plan.graph.ops] == ["Reduction", "Pointwise"] and len(plan.kernels()) == 1


def test_streams_are_honoured(handles, rng):
    """Work goes on the handle's stream: queued behind a kernel that waits for the host on a
    non-blocking stream, the result is not visible from another stream until the host releases it.
    The kernel spins on a flag in pinned host memory (bounded: about 20 s of clock), not for a fixed
    time: under a loaded host (pytest-xdist workers compiling) a timed spin could end before the
    check, and the test would fail although the call waited (issue 26's note on a flaky run)."""
    import cupy
    hc, hg = handles
    gate = cupy.RawKernel(r'''extern "C" __global__ void gate(volatile int *flag, long long limit) {
        long long s = clock64(); while (*flag == 0 && clock64() - s < limit) {} }''', "gate")
    mem = cupy.cuda.alloc_pinned_memory(4)
    flag = np.frombuffer(mem, np.int32, 1)
    for raw in (False, True):
        owner = cupy.cuda.Stream(non_blocking=True)
        s = owner.ptr if raw else owner  # a raw cudaStream_t int, or the Stream object
        stream = owner
        a, c = T(rng, (1, 3, 1, 1)), T(rng, (2, 3, 64, 64), fill=0.0)
        da, dc = cupy.asarray(a.host), cupy.asarray(c.host)
        cupy.cuda.Device().synchronize()
        with forced():
            cc.cudnnSetStream(hg, s)
            cc.cudnnAddTensor(hg, 1.0, a.desc, da, 0.0, c.desc, dc)  # compile and warm
            stream.synchronize()
            dc.fill(0)
            cupy.cuda.Device().synchronize()
            flag[0] = 0
            with stream:
                gate((1,), (1,), (mem.ptr, np.int64(40_000_000_000)))
            cc.cudnnAddTensor(hg, 1.0, a.desc, da, 0.0, c.desc, dc)
            other = cupy.cuda.Stream(non_blocking=True)
            with other:
                early = dc.get(stream=other)
            flag[0] = 1  # release the stream
            assert np.all(early == 0), "the call did not wait for its stream"
            stream.synchronize()
            assert np.allclose(dc.get().reshape(c.shape), np.broadcast_to(a.host.reshape(1, 3, 1, 1), c.shape))
            cc.cudnnSetStream(hg, 0)
    cupy.cuda.Device().synchronize()


def test_device_pointers_and_kernel_dump(handles, rng, tmp_path, monkeypatch):
    import cupy
    hc, hg = handles
    monkeypatch.setenv("CUDNN_COMPAT_DUMP_KERNELS", str(tmp_path))
    a, c = T(rng, (1, 3, 1, 1), "float32"), T(rng, (2, 3, 4, 5), "float32")
    da, dc = cupy.asarray(a.host), cupy.asarray(c.host)
    want = a.logical(a.host) * 2.0 + c.logical(c.host) * 0.5
    with forced():
        cc.cudnnAddTensor(hg, 2.0, a.desc, da.data.ptr, 0.5, c.desc, dc.data.ptr)
    got = c.logical(dc.get())
    np.testing.assert_allclose(got, want, rtol=1e-6)
    files = list(tmp_path.glob("*.cu"))
    assert files and all('extern "C" __global__' in f.read_text() for f in files)


def test_deterministic_bitwise(handles, rng):
    """Same inputs twice: bit-identical outputs (fixed reduction trees, no atomics)."""
    import cupy
    hc, hg = handles
    mode = cc.CUDNN_BATCHNORM_SPATIAL
    shape = (16, 8, 32, 32)
    ps, pt, mk = _bn_params(rng, mode, shape, "float32")
    x = T(rng, shape, "float32", "NHWC")
    scale, bias = mk(low=0.5), mk()
    outs = []
    for _ in range(2):
        y = cupy.zeros(x.host.size, np.float32)
        sm, si = cupy.zeros(scale.host.size, np.float32), cupy.zeros(scale.host.size, np.float32)
        with forced():
            cc.cudnnBatchNormalizationForwardTraining(hg, mode, 1.0, 0.0, x.desc, cupy.asarray(x.host), x.desc, y,
                                                      scale.desc, cupy.asarray(scale.host), cupy.asarray(bias.host),
                                                      0.1, None, None, 1e-5, sm, si)
        outs.append((y.get(), sm.get(), si.get()))
    for a, b in zip(*outs):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_engine_declines_are_not_supported_when_forced(handles, rng):
    """The cupy engine on the CPU place: forced, a graph it cannot run is NOT_SUPPORTED."""
    hc, hg = handles
    a, c = T(rng, (1, 3, 1, 1)), T(rng, (2, 3, 4, 5))
    with forced():
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnAddTensor(hc, 1.0, a.desc, a.host, 0.0, c.desc, c.host)
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED


@pytest.mark.parametrize("shape, layout", [((3, 40, 1, 1), "NCHW"), ((64, 8, 32, 32), "NHWC")])
def test_in_place_calls(handles, rng, shape, layout):
    """x == y: softmax (row kernels, split and cached), LRN and divisive normalization (window
    kernels read neighbours of what they write: the input is copied first) and BN training."""
    x = T(rng, shape, "float32", layout)
    acc, inst = cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL
    compare(handles, lambda h, d: cc.cudnnSoftmaxForward(h, acc, inst, 1.0, x.desc, d["x"], 0.5, x.desc, d["x"]),
            {"x": x}, ["x"])
    ld = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(ld, 5, 0.5, 0.75, 2.0)
    compare(handles, lambda h, d: cc.cudnnLRNCrossChannelForward(h, ld, cc.CUDNN_LRN_CROSS_CHANNEL_DIM1, 1.0, x.desc,
                                                                  d["x"], 0.0, x.desc, d["x"]), {"x": x}, ["x"])
    if layout == "NCHW":
        tmp = {k: T(rng, shape, "float32") for k in ("t1", "t2")}
        compare(handles, lambda h, d: cc.cudnnDivisiveNormalizationForward(
            h, ld, cc.CUDNN_DIVNORM_PRECOMPUTED_MEANS, 1.0, x.desc, d["x"], None, d["t1"], d["t2"], 0.0, x.desc, d["x"]),
            {"x": x, **tmp}, ["x"])
    mode = cc.CUDNN_BATCHNORM_SPATIAL
    ps, pt, mk = _bn_params(rng, mode, shape, "float32")
    scale, bias = mk(low=0.5), mk()
    compare(handles, lambda h, d: cc.cudnnBatchNormalizationForwardTraining(
        h, mode, 1.0, 0.0, x.desc, d["x"], x.desc, d["x"], scale.desc, d["scale"], d["bias"], 0.1, None, None, 1e-4,
        None, None), {"x": x, "scale": scale, "bias": bias}, ["x"], tol=1e-4)
