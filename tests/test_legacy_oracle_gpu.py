"""The GPU engines against the REAL legacy cuDNN functions that libcudnn 9 still exports (issue 23
item 11): activation, pooling and softmax forward and backward, LRN and divisive normalization
forward and backward (the divisive-normalization formula of docs/graph_ops.md was inferred from
002 §3.2.33 / §4.1.6 and is checked here against the library for the first time), batch
normalization training, inference and backward.  Both sides get the same float32 data, the same
alpha/beta and a prior y; our side runs on a GPU handle with the engine the heuristics choose.

cudnn_ops.h of cuDNN 9 (nvidia-cudnn-cu12 9.x) declares and libcudnn.so.9 exports every function
used here; prototypes are in cudnn_compat/_backend/legacy_cudnn.py.  None of these ops has a TF32 path on either
side (no GEMM), so the bound is the float32 class of tests/_tolerance.py (1e-5, relative to the
element and to the result's largest magnitude): both sides round each step to float32; the
transcendental functions (exp, tanh, pow) differ by a few ulp and the reductions (softmax, LRN
windows, batch-norm sums over 2*4*5 elements) by their summation order, which stays well under 1e-5.
"""
import ctypes

import numpy as np
import pytest

import cudnn_compat as cc
from _tolerance import assert_close
from conftest import tdesc
from test_fused_ops import execute

pytestmark = pytest.mark.gpu

ALPHA, BETA = 0.75, 0.25  # y = ALPHA*op + BETA*y_prior on both sides


def packed(shape):
    return [int(np.prod(shape[i + 1:])) for i in range(len(shape))]


class Real:
    """Calls of the real library on float32 CuPy arrays: descriptors, scalars, pointers."""

    def __init__(self, L, handle):
        self.L, self.h, self.ds = L, handle, L.Descs()
        self._keep = []

    def t(self, shape):
        return self.ds.tensor(shape, packed(shape), "float32")

    def f(self, v):
        c = ctypes.c_float(v)
        self._keep.append(c)
        return ctypes.addressof(c)

    def __call__(self, name, *args):
        import cupy
        cupy.cuda.runtime.deviceSynchronize()
        self.L.call(name, self.h.ptr, *[a.data.ptr if hasattr(a, "data") and hasattr(a.data, "ptr") else a
                                        for a in args])
        cupy.cuda.runtime.deviceSynchronize()

    def close(self):
        self.ds.destroy()


@pytest.fixture
def real(legacy_cudnn, legacy_handle):
    r = Real(legacy_cudnn, legacy_handle)
    yield r
    r.close()


@pytest.fixture(scope="module")
def gpu():
    h = cc.cudnnCreate("gpu")
    yield h
    cc.cudnnDestroy(h)


def data(shape, seed, lo=-2.0, hi=2.0):
    import cupy
    return cupy.asarray(np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32))


def pair(a):
    """Two device copies of ``a``: ours and the real library's."""
    return a.copy(), a.copy()


def check(ours, theirs, what):
    import cupy
    cupy.cuda.runtime.deviceSynchronize()
    assert_close(ours.get(), theirs.get(), "fp32", err_msg=f"{what}: ours ({cc.last_engine()}) vs libcudnn")


# -- activation ---------------------------------------------------------------------------------------

ACT = [("RELU", 0.0), ("SIGMOID", 0.0), ("TANH", 0.0), ("CLIPPED_RELU", 0.7), ("ELU", 0.4), ("SWISH", 0.0)]


@pytest.mark.parametrize("nan", [0, 1])
@pytest.mark.parametrize("mode, coef", ACT)
def test_activation_matches_libcudnn(gpu, real, mode, coef, nan):
    shape = (2, 3, 5, 7)
    x, y0, dy = data(shape, 1), data(shape, 2), data(shape, 3)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, getattr(cc, f"CUDNN_ACTIVATION_{mode}"), nan, coef)
    rad = real.ds.activation(mode, coef, bool(nan))
    if mode == "SWISH":  # the same beta on both sides
        cc.cudnnSetActivationDescriptorSwishBeta(ad, 1.25)
        real.L.call("cudnnSetActivationDescriptorSwishBeta", rad, 1.25)
    d, rd = tdesc(shape), real.t(shape)
    yo, yr = pair(y0)
    cc.cudnnActivationForward(gpu, ad, ALPHA, d, x, BETA, d, yo)
    real("cudnnActivationForward", rad, real.f(ALPHA), rd, x, real.f(BETA), rd, yr)
    check(yo, yr, f"{mode} forward")
    # backward from the output of a plain forward (alpha 1, beta 0), blended into a prior dx
    yf = x.copy()
    cc.cudnnActivationForward(gpu, ad, 1.0, d, x, 0.0, d, yf)
    dxo, dxr = pair(data(shape, 4))
    cc.cudnnActivationBackward(gpu, ad, ALPHA, d, yf, d, dy, d, x, BETA, d, dxo)
    real("cudnnActivationBackward", rad, real.f(ALPHA), rd, yf, rd, dy, rd, x, real.f(BETA), rd, dxr)
    check(dxo, dxr, f"{mode} backward")


# -- pooling ------------------------------------------------------------------------------------------

POOL = [("MAX", (3, 3), (1, 1), (2, 2)), ("MAX", (2, 2), (0, 0), (2, 2)), ("MAX_DETERMINISTIC", (3, 2), (1, 0), (1, 2)),
        ("AVERAGE_COUNT_INCLUDE_PADDING", (3, 3), (1, 1), (2, 2)),
        ("AVERAGE_COUNT_EXCLUDE_PADDING", (3, 3), (1, 1), (2, 2)), ("AVERAGE_COUNT_EXCLUDE_PADDING", (2, 3), (0, 1), (1, 1))]


@pytest.mark.parametrize("mode, window, pad, stride", POOL)
def test_pooling_matches_libcudnn(gpu, real, mode, window, pad, stride):
    xs = (2, 3, 7, 8)
    m = getattr(cc, f"CUDNN_POOLING_{mode}")
    pd = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPoolingNdDescriptor(pd, m, cc.CUDNN_NOT_PROPAGATE_NAN, 2, list(window), list(pad), list(stride))
    rpd = real.ds.pooling(int(m), window, pad, stride)
    xd = tdesc(xs)
    ys = tuple(cc.cudnnGetPoolingNdForwardOutputDim(pd, xd, 4))
    yd, rxd, ryd = tdesc(ys), real.t(xs), real.t(ys)
    x = data(xs, 5)  # continuous values: no ties in a max window
    yo, yr = pair(data(ys, 6))
    cc.cudnnPoolingForward(gpu, pd, ALPHA, xd, x, BETA, yd, yo)
    real("cudnnPoolingForward", rpd, real.f(ALPHA), rxd, x, real.f(BETA), ryd, yr)
    check(yo, yr, f"{mode} forward")
    yf = data(ys, 0)
    cc.cudnnPoolingForward(gpu, pd, 1.0, xd, x, 0.0, yd, yf)
    dy = data(ys, 7)
    dxo, dxr = pair(data(xs, 8))
    cc.cudnnPoolingBackward(gpu, pd, ALPHA, yd, yf, yd, dy, xd, x, BETA, xd, dxo)
    real("cudnnPoolingBackward", rpd, real.f(ALPHA), ryd, yf, ryd, dy, rxd, x, real.f(BETA), rxd, dxr)
    check(dxo, dxr, f"{mode} backward")


# -- softmax ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["INSTANCE", "CHANNEL"])
@pytest.mark.parametrize("algo", ["FAST", "ACCURATE", "LOG"])
def test_softmax_matches_libcudnn(gpu, real, algo, mode):
    shape = (3, 5, 4, 6)
    a, m = getattr(cc, f"CUDNN_SOFTMAX_{algo}"), getattr(cc, f"CUDNN_SOFTMAX_MODE_{mode}")
    d, rd = tdesc(shape), real.t(shape)
    x = data(shape, 9)
    yo, yr = pair(data(shape, 10))
    cc.cudnnSoftmaxForward(gpu, a, m, ALPHA, d, x, BETA, d, yo)
    real("cudnnSoftmaxForward", int(a), int(m), real.f(ALPHA), rd, x, real.f(BETA), rd, yr)
    check(yo, yr, f"{algo} {mode} forward")
    yf = data(shape, 0)
    cc.cudnnSoftmaxForward(gpu, a, m, 1.0, d, x, 0.0, d, yf)
    dy = data(shape, 11)
    dxo, dxr = pair(data(shape, 12))
    cc.cudnnSoftmaxBackward(gpu, a, m, ALPHA, d, yf, d, dy, BETA, d, dxo)
    real("cudnnSoftmaxBackward", int(a), int(m), real.f(ALPHA), rd, yf, rd, dy, real.f(BETA), rd, dxr)
    check(dxo, dxr, f"{algo} {mode} backward")


# -- LRN and divisive normalization -----------------------------------------------------------------------

LRN = [(5, 0.5, 0.75, 2.0), (3, 1e-2, 0.5, 1.0), (1, 0.3, 0.9, 1.5)]  # lrnN, alpha, beta, k


def _lrn(real, n, alpha, beta, k):
    ld = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(ld, n, alpha, beta, k)
    return ld, real.ds.lrn(n, alpha, beta, k)


@pytest.mark.parametrize("n, alpha, beta, k", LRN)
def test_lrn_cross_channel_matches_libcudnn(gpu, real, n, alpha, beta, k):
    shape = (2, 7, 4, 5)
    ld, rld = _lrn(real, n, alpha, beta, k)
    mode = cc.CUDNN_LRN_CROSS_CHANNEL_DIM1
    d, rd = tdesc(shape), real.t(shape)
    x = data(shape, 13)
    yo, yr = pair(data(shape, 14))
    cc.cudnnLRNCrossChannelForward(gpu, ld, mode, ALPHA, d, x, BETA, d, yo)
    real("cudnnLRNCrossChannelForward", rld, int(mode), real.f(ALPHA), rd, x, real.f(BETA), rd, yr)
    check(yo, yr, "LRN forward")
    yf = data(shape, 0)
    cc.cudnnLRNCrossChannelForward(gpu, ld, mode, 1.0, d, x, 0.0, d, yf)
    dy = data(shape, 15)
    dxo, dxr = pair(data(shape, 16))
    cc.cudnnLRNCrossChannelBackward(gpu, ld, mode, ALPHA, d, yf, d, dy, d, x, BETA, d, dxo)
    real("cudnnLRNCrossChannelBackward", rld, int(mode), real.f(ALPHA), rd, yf, rd, dy, rd, x, real.f(BETA), rd, dxr)
    check(dxo, dxr, "LRN backward")


@pytest.mark.parametrize("with_means", [True, False], ids=["means", "null_means"])
@pytest.mark.parametrize("n, alpha, beta, k", LRN[:2])
def test_divisive_normalization_matches_libcudnn(gpu, real, n, alpha, beta, k, with_means):
    """cudnnDivisiveNormalizationForward/Backward (002 §3.2.33, §4.1.6), PRECOMPUTED_MEANS, means given
    or NULL (zero): y, dx and dMeans against the real library."""
    import cupy
    shape = (2, 3, 6, 7)
    ld, rld = _lrn(real, n, alpha, beta, k)
    mode = cc.CUDNN_DIVNORM_PRECOMPUTED_MEANS
    d, rd = tdesc(shape), real.t(shape)
    x = data(shape, 17)
    means = data(shape, 18, -0.5, 0.5) if with_means else None
    mp = means if with_means else 0
    tmp = [cupy.zeros(shape, np.float32) for _ in range(4)]
    yo, yr = pair(data(shape, 19))
    cc.cudnnDivisiveNormalizationForward(gpu, ld, mode, ALPHA, d, x, means, tmp[0], tmp[1], BETA, d, yo)
    real("cudnnDivisiveNormalizationForward", rld, int(mode), real.f(ALPHA), rd, x, mp, tmp[2], tmp[3],
         real.f(BETA), rd, yr)
    check(yo, yr, "divisive normalization forward")
    dy = data(shape, 20)
    dxo, dxr = pair(data(shape, 21))
    dmo, dmr = pair(data(shape, 22))
    cc.cudnnDivisiveNormalizationBackward(gpu, ld, mode, ALPHA, d, x, means, dy, tmp[0], tmp[1], BETA, d, dxo, dmo)
    real("cudnnDivisiveNormalizationBackward", rld, int(mode), real.f(ALPHA), rd, x, mp, dy, tmp[2], tmp[3],
         real.f(BETA), rd, dxr, dmr)
    check(dxo, dxr, "divisive normalization backward dx")
    check(dmo, dmr, "divisive normalization backward dMeans")


# -- batch normalization ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["SPATIAL", "PER_ACTIVATION", "SPATIAL_PERSISTENT"])
def test_batchnorm_matches_libcudnn(gpu, real, mode):
    """Training forward (y, running mean and variance, saved mean and inverse variance), inference
    forward and backward (dx, dscale, dbias; alpha/beta on data and parameters) on both sides."""
    shape = (2, 4, 4, 5)
    m = getattr(cc, f"CUDNN_BATCHNORM_{mode}")
    xd = tdesc(shape)
    pd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnDeriveBNTensorDescriptor(pd, xd, m)
    ps = tuple(cc.cudnnGetTensorNdDescriptor(pd)[2])
    rxd, rpd = real.t(shape), real.t(ps)
    x, scale, bias = data(shape, 23, -1, 3), data(ps, 24, 0.5, 1.5), data(ps, 25)
    eps, factor = 1e-4, 0.3
    yo, yr = pair(data(shape, 26))
    rmo, rmr = pair(data(ps, 27))
    rvo, rvr = pair(data(ps, 28, 0.5, 2.0))
    smo, smr = pair(data(ps, 0))
    svo, svr = pair(data(ps, 0))
    cc.cudnnBatchNormalizationForwardTraining(gpu, m, ALPHA, BETA, xd, x, xd, yo, pd, scale, bias, factor, rmo, rvo,
                                              eps, smo, svo)
    real("cudnnBatchNormalizationForwardTraining", int(m), real.f(ALPHA), real.f(BETA), rxd, x, rxd, yr, rpd, scale,
         bias, factor, rmr, rvr, eps, smr, svr)
    for what, a, b in (("y", yo, yr), ("running mean", rmo, rmr), ("running variance", rvo, rvr),
                       ("saved mean", smo, smr), ("saved inverse variance", svo, svr)):
        check(a, b, f"{mode} training {what}")
    yio, yir = pair(data(shape, 29))
    cc.cudnnBatchNormalizationForwardInference(gpu, m, ALPHA, BETA, xd, x, xd, yio, pd, scale, bias, rmo, rvo, eps)
    real("cudnnBatchNormalizationForwardInference", int(m), real.f(ALPHA), real.f(BETA), rxd, x, rxd, yir, rpd, scale,
         bias, rmr, rvr, eps)
    check(yio, yir, f"{mode} inference y")
    dy = data(shape, 30)
    dxo, dxr = pair(data(shape, 31))
    dso, dsr = pair(data(ps, 32))
    dbo, dbr = pair(data(ps, 33))
    cc.cudnnBatchNormalizationBackward(gpu, m, ALPHA, BETA, 1.0, 0.5, xd, x, xd, dy, xd, dxo, pd, scale, dso, dbo, eps,
                                       smo, svo)
    real("cudnnBatchNormalizationBackward", int(m), real.f(ALPHA), real.f(BETA), real.f(1.0), real.f(0.5), rxd, x, rxd,
         dy, rxd, dxr, rpd, scale, dsr, dbr, eps, smr, svr)
    for what, a, b in (("dx", dxo, dxr), ("dscale", dso, dsr), ("dbias", dbo, dbr)):
        check(a, b, f"{mode} backward {what}")


# -- the generalized normalization (cudnnNormalization*, 002 §3.2.64-§3.2.66, §4.1.16) ---------------------

@pytest.mark.parametrize("mode", ["PER_ACTIVATION", "PER_CHANNEL"])
def test_normalization_matches_libcudnn(gpu, real, mode):
    """CUDNN_NORM_OPS_NORM, CUDNN_NORM_ALGO_STANDARD, groupCnt 1: training forward (y, running and
    saved statistics), inference forward and backward (dx, dscale, dbias) on both sides, each with
    the workspace and reserve sizes it asks for."""
    import cupy
    shape = (2, 4, 4, 5)
    m, ops, algo = getattr(cc, f"CUDNN_NORM_{mode}"), cc.CUDNN_NORM_OPS_NORM, cc.CUDNN_NORM_ALGO_STANDARD
    xd = tdesc(shape)
    sd, md = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    cc.cudnnDeriveNormTensorDescriptor(sd, md, xd, m, 1)
    ps = tuple(cc.cudnnGetTensorNdDescriptor(sd)[2])
    rxd, rsd, rmd = real.t(shape), real.t(ps), real.t(ps)
    x, scale, bias = data(shape, 34, -1, 3), data(ps, 35, 0.5, 1.5), data(ps, 36)
    eps, factor = 1e-4, 0.3
    ws = cc.cudnnGetNormalizationForwardTrainingWorkspaceSize(gpu, m, ops, algo, xd, None, xd, sd, None, md, 1)
    rs = cc.cudnnGetNormalizationTrainingReserveSpaceSize(gpu, m, ops, algo, None, xd, 1)
    rws, rrs = ctypes.c_size_t(), ctypes.c_size_t()
    real("cudnnGetNormalizationForwardTrainingWorkspaceSize", int(m), int(ops), int(algo), rxd, None, rxd, rsd, None,
         rmd, ctypes.byref(rws), 1)
    real("cudnnGetNormalizationTrainingReserveSpaceSize", int(m), int(ops), int(algo), None, rxd, ctypes.byref(rrs), 1)
    work, reserve = cupy.zeros(max(ws, 1), cupy.uint8), cupy.zeros(max(rs, 1), cupy.uint8)
    rwork, rreserve = cupy.zeros(max(rws.value, 1), cupy.uint8), cupy.zeros(max(rrs.value, 1), cupy.uint8)
    yo, yr = pair(data(shape, 37))
    rmo, rmr = pair(data(ps, 38))
    rvo, rvr = pair(data(ps, 39, 0.5, 2.0))
    smo, smr = pair(data(ps, 0))
    svo, svr = pair(data(ps, 0))
    cc.cudnnNormalizationForwardTraining(gpu, m, ops, algo, ALPHA, BETA, xd, x, sd, scale, bias, factor, md, rmo, rvo,
                                         eps, smo, svo, None, None, None, xd, yo, work, ws, reserve, rs, 1)
    try:
        real("cudnnNormalizationForwardTraining", int(m), int(ops), int(algo), real.f(ALPHA), real.f(BETA), rxd, x,
             rsd, scale, bias, factor, rmd, rmr, rvr, eps, smr, svr, None, None, None, rxd, yr, rwork, rws.value,
             rreserve, rrs.value, 1)
    except real.L.LegacyError as e:  # the real library cannot run this configuration: nothing to compare
        if "NOT_SUPPORTED" not in str(e):
            raise
        pytest.xfail(f"the real cudnnNormalizationForwardTraining refuses it: {e}")
    for what, a, b in (("y", yo, yr), ("running mean", rmo, rmr), ("running variance", rvo, rvr),
                       ("saved mean", smo, smr), ("saved inverse variance", svo, svr)):
        check(a, b, f"{mode} training {what}")
    yio, yir = pair(data(shape, 40))
    cc.cudnnNormalizationForwardInference(gpu, m, ops, algo, ALPHA, BETA, xd, x, sd, scale, bias, md, rmo, rvo, None,
                                          None, None, xd, yio, eps, 1)
    real("cudnnNormalizationForwardInference", int(m), int(ops), int(algo), real.f(ALPHA), real.f(BETA), rxd, x, rsd,
         scale, bias, rmd, rmr, rvr, None, None, None, rxd, yir, eps, 1)
    check(yio, yir, f"{mode} inference y")
    bws = cc.cudnnGetNormalizationBackwardWorkspaceSize(gpu, m, ops, algo, xd, xd, xd, None, xd, sd, None, md, 1)
    rbws = ctypes.c_size_t()
    real("cudnnGetNormalizationBackwardWorkspaceSize", int(m), int(ops), int(algo), rxd, rxd, rxd, None, rxd, rsd, None,
         rmd, ctypes.byref(rbws), 1)
    bwork, rbwork = cupy.zeros(max(bws, 1), cupy.uint8), cupy.zeros(max(rbws.value, 1), cupy.uint8)
    dy = data(shape, 41)
    dxo, dxr = pair(data(shape, 42))
    dso, dsr = pair(data(ps, 43))
    dbo, dbr = pair(data(ps, 44))
    cc.cudnnNormalizationBackward(gpu, m, ops, algo, ALPHA, BETA, 1.0, 0.5, xd, x, xd, yo, xd, dy, None, None, xd, dxo,
                                  sd, scale, bias, dso, dbo, eps, md, smo, svo, None, bwork, bws, reserve, rs, 1)
    real("cudnnNormalizationBackward", int(m), int(ops), int(algo), real.f(ALPHA), real.f(BETA), real.f(1.0),
         real.f(0.5), rxd, x, rxd, yr, rxd, dy, None, None, rxd, dxr, rsd, scale, bias, dsr, dbr, eps, rmd, smr, svr,
         None, rbwork, rbws.value, rreserve, rrs.value, 1)
    for what, a, b in (("dx", dxo, dxr), ("dscale", dso, dsr), ("dbias", dbo, dbr)):
        check(a, b, f"{mode} backward {what}")


# -- the fused-ops API: batch-norm finalize (002 §6.2.x, Tables 27-28) ---------------------------------------

FINALIZE_TRAINING = dict(BN_MODE="mode", YSTATS_DESC="desc", YSUM_PLACEHOLDER="ptr", YSQSUM_PLACEHOLDER="ptr",
                         BN_SCALEBIAS_MEANVAR_DESC="desc", BN_SCALE_PLACEHOLDER="ptr", BN_BIAS_PLACEHOLDER="ptr",
                         BN_SAVED_MEAN_PLACEHOLDER="ptr", BN_SAVED_INVSTD_PLACEHOLDER="ptr",
                         BN_RUNNING_MEAN_PLACEHOLDER="ptr", BN_RUNNING_VAR_PLACEHOLDER="ptr", BN_EQSCALEBIAS_DESC="desc",
                         BN_EQSCALE_PLACEHOLDER="ptr", BN_EQBIAS_PLACEHOLDER="ptr")
FINALIZE_INFERENCE = {k: v for k, v in FINALIZE_TRAINING.items()
                      if k not in ("YSTATS_DESC", "YSUM_PLACEHOLDER", "YSQSUM_PLACEHOLDER", "BN_SAVED_MEAN_PLACEHOLDER",
                                   "BN_SAVED_INVSTD_PLACEHOLDER")}


def _fused_real(real, ops, const: dict, ptrs: dict, scalars: dict):
    """Make and execute a fused-ops plan on the real library; ``const``: label -> value (int or
    descriptor), ``ptrs``: label -> device array, ``scalars``: label -> (ctypes type, value)."""
    import cupy
    L, keep, made = real.L, [], []

    def create(kind):
        p = ctypes.c_void_p()
        L.call(f"cudnnCreateFusedOps{kind}", ctypes.byref(p), int(ops))
        made.append((kind, p.value))
        return p.value
    cp_, vp = create("ConstParamPack"), create("VariantParamPack")
    for label, value in const.items():
        if label.endswith("_DESC"):
            arg = value
        else:
            keep.append(ctypes.c_int(int(value)))
            arg = ctypes.addressof(keep[-1])
        L.call("cudnnSetFusedOpsConstParamPackAttribute", cp_, int(getattr(cc, "CUDNN_PARAM_" + label)), arg)
    plan = create("Plan")
    ws = ctypes.c_size_t()
    L.call("cudnnMakeFusedOpsPlan", real.h.ptr, plan, cp_, ctypes.byref(ws))
    work = cupy.zeros(max(ws.value, 1), cupy.uint8)
    for label, arr in ptrs.items():
        L.call("cudnnSetFusedOpsVariantParamPackAttribute", vp, int(getattr(cc, "CUDNN_PTR_" + label)), arr.data.ptr)
    scalars = dict(scalars, SIZE_T_WORKSPACE_SIZE_IN_BYTES=(ctypes.c_size_t, ws.value))
    for label, (ctype, value) in scalars.items():
        keep.append(ctype(value))
        L.call("cudnnSetFusedOpsVariantParamPackAttribute", vp, int(getattr(cc, "CUDNN_SCALAR_" + label)),
               ctypes.addressof(keep[-1]))
    if ws.value:
        L.call("cudnnSetFusedOpsVariantParamPackAttribute", vp, int(cc.CUDNN_PTR_WORKSPACE), work.data.ptr)
    cupy.cuda.runtime.deviceSynchronize()
    L.call("cudnnFusedOpsExecute", real.h.ptr, plan, vp)
    cupy.cuda.runtime.deviceSynchronize()
    for kind, p in reversed(made):
        L.call(f"cudnnDestroyFusedOps{kind}", p)


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_fused_bn_finalize_matches_libcudnn(gpu, real, training):
    """CUDNN_FUSED_BN_FINALIZE_STATISTICS_TRAINING / _INFERENCE through cudnnFusedOpsExecute on both sides:
    eqScale, eqBias, saved mean and inverse std, running statistics (float32 per channel)."""
    c, m = 16, 40
    ops = cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_TRAINING if training else cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE
    labels = FINALIZE_TRAINING if training else FINALIZE_INFERENCE
    ps = (1, c, 1, 1)
    pd, rpd = tdesc(ps), real.t(ps)
    rows = np.random.default_rng(45).standard_normal((m, c)) * 2 + 1
    inputs = dict(YSUM=rows.sum(0), YSQSUM=(rows ** 2).sum(0), BN_SCALE=data(ps, 46, 0.5, 1.5).get(),
                  BN_BIAS=data(ps, 47).get(), BN_RUNNING_MEAN=data(ps, 48).get(),
                  BN_RUNNING_VAR=data(ps, 49, 0.5, 2.0).get(), BN_SAVED_MEAN=np.zeros(c), BN_SAVED_INVSTD=np.zeros(c),
                  BN_EQSCALE=np.zeros(c), BN_EQBIAS=np.zeros(c))
    names = [k[:-len("_PLACEHOLDER")] for k in labels if k.endswith("_PLACEHOLDER")]
    scalars = {"DOUBLE_BN_EPSILON": (ctypes.c_double, 1e-4)}
    if training:
        scalars.update(INT64_T_BN_ACCUMULATION_COUNT=(ctypes.c_int64, m), DOUBLE_BN_EXP_AVG_FACTOR=(ctypes.c_double, 0.3))
    bufs = {}
    for side, desc in (("ours", pd), ("real", rpd)):
        import cupy
        ptrs = {n: cupy.asarray(np.asarray(inputs[n], np.float32).reshape(-1)) for n in names}
        const = {k: (desc if v == "desc" else cc.CUDNN_BATCHNORM_SPATIAL if v == "mode" else cc.CUDNN_PTR_ELEM_ALIGNED)
                 for k, v in labels.items()}
        if side == "ours":
            execute(gpu, ops, const, ptrs, {k: v for k, (_, v) in scalars.items()}, xp=cupy)
        else:
            _fused_real(real, ops, const, ptrs, scalars)
        bufs[side] = ptrs
    for n in names:
        check(bufs["ours"][n], bufs["real"][n], f"fused BN finalize {'training' if training else 'inference'} {n}")
