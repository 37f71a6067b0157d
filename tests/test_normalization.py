"""The 8.0 normalization API against formulas written here (002 §3.2.19, §3.2.66, §4.1.11-§4.1.16;
inventory §2.7): two-pass statistics, running averages with the unbiased variance, the fused
activation and residual add, and the backward pass against float64 finite differences of a
forward written in this file."""
import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

PER_ACT, PER_CH = cc.CUDNN_NORM_PER_ACTIVATION, cc.CUDNN_NORM_PER_CHANNEL
NORM, NORM_ACT, NORM_ADD = cc.CUDNN_NORM_OPS_NORM, cc.CUDNN_NORM_OPS_NORM_ACTIVATION, cc.CUDNN_NORM_OPS_NORM_ADD_ACTIVATION
STD, PERSIST = cc.CUDNN_NORM_ALGO_STANDARD, cc.CUDNN_NORM_ALGO_PERSIST
F32, F64, F16 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_HALF
NCHW, NHWC = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC
BAD, UNSUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED


def axes_of(mode, ndim):
    return (0,) if mode == PER_ACT else (0,) + tuple(range(2, ndim))


def stats(x, mode):
    """Per-channel (or per-activation) mean and biased variance by two passes, and the count."""
    ax = axes_of(mode, x.ndim)
    m = int(np.prod([x.shape[k] for k in ax]))
    mean = x.sum(axis=ax, keepdims=True) / m
    var = ((x - mean) ** 2).sum(axis=ax, keepdims=True) / m
    return mean, var, m


def forward(x, scale, bias, z, eps, mode, relu):
    mean, var, _ = stats(x, mode)
    t = scale * (x - mean) / np.sqrt(var + eps) + bias
    if z is not None:
        t = t + z
    return np.maximum(t, 0) if relu else t


def pshape(mode, shape):
    ax = axes_of(mode, len(shape))
    return tuple(1 if k in ax else d for k, d in enumerate(shape))


def derived(xd, mode):
    sd, md = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    cc.cudnnDeriveNormTensorDescriptor(sd, md, xd, mode, 1)
    return sd, md


def relu_desc():
    a = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(a, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    return a


def to_mem(a, fmt):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1)) if fmt == NHWC else np.ascontiguousarray(a)


def from_mem(a, fmt):
    return np.moveaxis(a, -1, 1) if fmt == NHWC else a


# -- derived descriptors -----------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 2, 4, 5)])
@pytest.mark.parametrize("mode", [PER_ACT, PER_CH])
def test_derive_dims_and_types(shape, mode):
    for dtype, want in ((F16, F32), (F32, F32), (F64, F64), (cc.CUDNN_DATA_BFLOAT16, F32)):
        sd, md = derived(tdesc(shape, dtype), mode)
        for d in (sd, md):
            t, nb, dims, _ = cc.cudnnGetTensorNdDescriptor(d, 8)
            assert t == want and tuple(dims) == pshape(mode, shape)


def test_derive_errors():
    sd, md = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    with pytest.raises(cc.CuDNNError) as e:  # rule: valid cudnnNormMode_t
        cc.deriveNormTensorDescriptor(sd, md, tdesc((2, 3, 4, 5)), 7, 1)
    assert e.value.status == BAD and "mode" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # rule: groupCnt must be 1
        cc.deriveNormTensorDescriptor(sd, md, tdesc((2, 3, 4, 5)), PER_CH, 2)
    assert e.value.status == UNSUP and "groupCnt" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # rule: 4-d or 5-d x
        cc.deriveNormTensorDescriptor(sd, md, tdesc((2, 3, 4, 5, 2, 2)), PER_CH, 1)
    assert e.value.status == BAD


# -- inference ---------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [NCHW, NHWC])
@pytest.mark.parametrize("mode", [PER_ACT, PER_CH])
def test_inference_formula_blend_and_separate_meanvar_desc(handle, rng, mode, fmt):
    shape = (3, 4, 2, 3)
    ps = pshape(mode, shape)
    x = rng.standard_normal(shape)
    scale, bias = rng.standard_normal(ps), rng.standard_normal(ps)
    mean, var = rng.standard_normal(ps), rng.random(ps) + 0.5
    y0 = rng.standard_normal(shape)
    xd, sd = tdesc(shape, fmt=fmt), derived(tdesc(shape), mode)[0]
    # normMeanVarDesc with its own (padded) strides: every second float
    md = tdesc(ps, strides=tuple(2 * s for s in np.cumprod((1,) + ps[::-1])[:-1][::-1]))
    n = int(np.prod(ps))
    mean_mem, var_mem = np.zeros(2 * n, np.float32), np.zeros(2 * n, np.float32)
    mean_mem[::2], var_mem[::2] = mean.reshape(-1), var.reshape(-1)
    y = to_mem(y0, fmt).astype(np.float32)
    cc.cudnnNormalizationForwardInference(handle, mode, NORM, STD, 0.5, -1.5, xd, to_mem(x, fmt).astype(np.float32),
                                          sd, scale.astype(np.float32), bias.astype(np.float32), md, mean_mem, var_mem,
                                          None, None, None, tdesc(shape, fmt=fmt), y, 1e-3, 1)
    xr = to_mem(x, fmt).astype(np.float32).astype(np.float64)
    want = np.empty(shape)
    for idx in np.ndindex(*shape):
        p = tuple(i if s > 1 else 0 for i, s in zip(idx, ps))
        xv = from_mem(xr, fmt)[idx]
        want[idx] = 0.5 * (bias[p] + scale[p] * (xv - mean[p]) / np.sqrt(1e-3 + var[p])) - 1.5 * y0[idx]
    np.testing.assert_allclose(from_mem(y, fmt), want, rtol=2e-5, atol=2e-5)


def _infer_args(shape=(2, 3, 2, 2), mode=PER_CH, dtype=F32):
    ps = pshape(mode, shape)
    xd = tdesc(shape, dtype)
    sd, md = derived(xd, mode)
    np_t = {F32: np.float32, F64: np.float64, F16: np.float16}[dtype]
    x = np.ones(shape, np_t)
    p = np.ones(ps, np.float64 if dtype == F64 else np.float32)
    y = np.full(shape, 7, np_t)
    return dict(xd=xd, x=x, sd=sd, md=md, scale=p, bias=p.copy(), mean=p.copy(), var=p.copy(), yd=tdesc(shape, dtype), y=y)


def _infer(handle, a, mode=PER_CH, ops=NORM, algo=STD, eps=1e-5, group=1, **over):
    a = {**a, **over}
    cc.normalizationForwardInference(handle, mode, ops, algo, 1.0, 0.0, a["xd"], a["x"], a["sd"], a["scale"], a["bias"],
                                     a["md"], a["mean"], a["var"], None, None, None, a["yd"], a["y"], eps, group)


@pytest.mark.parametrize("case,status,arg", [
    (dict(ops=NORM_ACT), UNSUP, "normOps"),          # rule: inference runs NORM only
    (dict(eps=-1e-3), BAD, "epsilon"),               # rule: epsilon >= 0
    (dict(group=2), UNSUP, "groupCnt"),              # rule: groupCnt == 1
    (dict(algo=9), UNSUP, "algo"),                   # rule: known cudnnNormAlgo_t
    (dict(mode=PER_ACT, algo=PERSIST), UNSUP, "algo"),  # rule: PERSIST only per channel
    (dict(mean=None), BAD, "estimatedMean"),         # rule: NULL pointers
    (dict(mode=7), BAD, "mode"),                     # rule: valid cudnnNormMode_t
])
def test_inference_errors_write_nothing(handle, case, status, arg):
    a = _infer_args()
    mode = case.pop("mode", PER_CH)
    with pytest.raises(cc.CuDNNError) as e:
        _infer(handle, a, mode=mode, **case)
    assert e.value.status == status and arg in str(e.value)
    assert np.all(a["y"] == 7)


def test_inference_descriptor_rules(handle):
    a = _infer_args()
    with pytest.raises(cc.CuDNNError) as e:  # rule: param dims follow the mode
        _infer(handle, a, sd=tdesc((1, 3, 2, 2)))
    assert e.value.status == BAD and "normScaleBiasDesc" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # rule: x and y dims equal
        _infer(handle, a, yd=tdesc((2, 3, 2, 1)))
    assert e.value.status == BAD and "yDesc" in str(e.value)
    h = _infer_args(dtype=F16)
    with pytest.raises(cc.CuDNNError) as e:  # rule: inference is FLOAT only
        _infer(handle, h)
    assert e.value.status == UNSUP
    assert np.all(a["y"] == 7) and np.all(h["y"] == 7)


# -- training ----------------------------------------------------------------------------

@pytest.mark.parametrize("ops", [NORM, NORM_ACT, NORM_ADD])
@pytest.mark.parametrize("mode,shape", [(PER_CH, (3, 2, 3, 4)), (PER_ACT, (5, 2, 2, 3)), (PER_CH, (2, 3, 2, 2, 3))])
def test_training_formulas(handle, rng, mode, shape, ops):
    ps = pshape(mode, shape)
    x = rng.standard_normal(shape).astype(np.float32)
    z = rng.standard_normal(shape).astype(np.float32)
    scale, bias = rng.standard_normal(ps).astype(np.float32), rng.standard_normal(ps).astype(np.float32)
    rmean0, rvar0 = rng.standard_normal(ps).astype(np.float32), rng.random(ps).astype(np.float32)
    rmean, rvar = rmean0.copy(), rvar0.copy()
    smean, sinv = np.zeros(ps, np.float32), np.zeros(ps, np.float32)
    y = np.full(shape, np.nan, np.float32)
    xd = tdesc(shape)
    sd, md = derived(xd, mode)
    act = relu_desc() if ops != NORM else None
    zd, zz = (tdesc(shape), z) if ops == NORM_ADD else (None, None)
    eps, f = 1e-4, 0.3
    ws = cc.cudnnGetNormalizationForwardTrainingWorkspaceSize(handle, mode, ops, STD, xd, zd, xd, sd, act, md, 1)
    rs = cc.cudnnGetNormalizationTrainingReserveSpaceSize(handle, mode, ops, STD, act, xd, 1)
    assert ws >= 0 and rs == 0
    cc.cudnnNormalizationForwardTraining(handle, mode, ops, STD, 1.0, 0.0, xd, x, sd, scale, bias, f, md, rmean, rvar,
                                         eps, smean, sinv, act, zd, zz, xd, y, None, 0, None, 0, 1)
    x64 = x.astype(np.float64)
    mean, var, m = stats(x64, mode)
    want = forward(x64, scale, bias, z if ops == NORM_ADD else None, eps, mode, ops != NORM)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(smean, mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sinv, 1 / np.sqrt(var + eps), rtol=1e-4)
    np.testing.assert_allclose(rmean, (1 - f) * rmean0 + f * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rvar, (1 - f) * rvar0 + f * var * m / (m - 1), rtol=1e-5, atol=1e-6)


def test_training_half_data_nhwc_without_optional_outputs(handle, rng):
    shape = (4, 3, 2, 2)
    x = rng.standard_normal(shape).astype(np.float16)
    xd = tdesc(shape, F16, NHWC)
    sd, md = derived(xd, PER_CH)
    scale, bias = np.full((1, 3, 1, 1), 2.0, np.float32), np.full((1, 3, 1, 1), 0.5, np.float32)
    y = np.zeros((4, 2, 2, 3), np.float16)
    cc.normalizationForwardTraining(handle, PER_CH, NORM, PERSIST, 1.0, 0.0, xd, to_mem(x, NHWC), sd, scale, bias, 0.1,
                                    md, None, None, 0.0, None, None, None, None, None, xd, y, None, 0, None, 0, 1)
    want = forward(x.astype(np.float64), 2.0, 0.5, None, 0.0, PER_CH, False)
    np.testing.assert_allclose(from_mem(y, NHWC).astype(np.float64), want, rtol=3e-3, atol=3e-3)


def test_training_errors_write_nothing(handle):
    shape = (2, 3, 2, 2)
    xd = tdesc(shape)
    sd, md = derived(xd, PER_CH)
    p = [np.ones((1, 3, 1, 1), np.float32) for _ in range(6)]
    x, y = np.ones(shape, np.float32), np.full(shape, 7, np.float32)

    def call(**kw):
        a = dict(mode=PER_CH, ops=NORM, eps=1e-5, rm=p[2], rv=p[3], sm=p[4], si=p[5], act=None, zd=None, z=None,
                 md=md, group=1)
        a.update(kw)
        cc.normalizationForwardTraining(handle, a["mode"], a["ops"], STD, 1.0, 0.0, xd, x, sd, p[0], p[1], 0.1, a["md"],
                                        a["rm"], a["rv"], a["eps"], a["sm"], a["si"], a["act"], a["zd"], a["z"], xd, y,
                                        None, 0, None, 0, a["group"])
    for kw, status, arg in [(dict(rm=None), BAD, "resultRunningMean"),           # rule: running pair both or none
                            (dict(si=None), BAD, "resultSaveMean"),              # rule: saved pair both or none
                            (dict(eps=-1.0), BAD, "epsilon"),                    # rule: epsilon >= 0
                            (dict(ops=NORM_ADD, act=relu_desc()), BAD, "zDesc"),  # rule: z for ADD_ACTIVATION
                            (dict(md=tdesc((1, 3, 1, 1), F64)), BAD, "normMeanVarDesc"),  # rule: param types equal
                            (dict(group=0), BAD, "groupCnt")]:                   # rule: positive groupCnt
        with pytest.raises(cc.CuDNNError) as e:
            call(**kw)
        assert e.value.status == status and arg in str(e.value), (kw, str(e.value))
    assert np.all(y == 7) and all(np.all(q == 1) for q in p)


def test_training_single_value_per_channel_cannot_update_running_variance(handle):
    xd = tdesc((1, 2, 1, 1))
    sd, md = derived(xd, PER_CH)
    p = [np.ones((1, 2, 1, 1), np.float32) for _ in range(4)]
    with pytest.raises(cc.CuDNNError) as e:
        cc.normalizationForwardTraining(handle, PER_CH, NORM, STD, 1.0, 0.0, xd, np.ones(2, np.float32), sd, p[0], p[1],
                                        0.5, md, p[2], p[3], 1e-5, None, None, None, None, None, xd,
                                        np.zeros(2, np.float32), None, 0, None, 0, 1)
    assert e.value.status == UNSUP


# -- backward ----------------------------------------------------------------------------

def _loss(x, scale, bias, z, g, eps, mode, relu):
    return float(np.sum(forward(x, scale, bias, z, eps, mode, relu) * g))


def _numgrad(f, a, h=1e-6):
    out = np.zeros_like(a)
    for idx in np.ndindex(*a.shape):
        old = a[idx]
        a[idx] = old + h
        up = f()
        a[idx] = old - h
        dn = f()
        a[idx] = old
        out[idx] = (up - dn) / (2 * h)
    return out


@pytest.mark.parametrize("ops,saved", [(NORM, True), (NORM, False), (NORM_ACT, True), (NORM_ADD, True)])
@pytest.mark.parametrize("mode,shape", [(PER_CH, (3, 2, 2, 2)), (PER_ACT, (4, 2, 1, 2))])
def test_backward_against_finite_differences(handle, rng, mode, shape, ops, saved):
    ps = pshape(mode, shape)
    x = rng.standard_normal(shape)
    z = rng.standard_normal(shape) if ops == NORM_ADD else None
    scale, bias = rng.standard_normal(ps), rng.standard_normal(ps)
    g = rng.standard_normal(shape)  # dy = dL/dy for L = sum(y*g)
    eps, relu = 1e-3, ops != NORM
    xd = tdesc(shape, F64)
    sd, md = derived(xd, mode)
    act = relu_desc() if relu else None
    y = forward(x, scale, bias, z, eps, mode, relu)
    mean, var, _ = stats(x, mode)
    smean, sinv = (mean, 1 / np.sqrt(var + eps)) if saved else (None, None)
    dx0, ds0, db0 = rng.standard_normal(shape), rng.standard_normal(ps), rng.standard_normal(ps)
    dx, ds, db = dx0.copy(), ds0.copy(), db0.copy()
    dz0 = rng.standard_normal(shape)
    dz = dz0.copy() if ops == NORM_ADD else None  # blended with alphaDataDiff/betaDataDiff too
    cc.cudnnNormalizationBackward(handle, mode, ops, STD, 1.0, 0.5, 2.0, -1.0, xd, x, xd if relu else None,
                                  y if relu else None, xd, g, xd if ops == NORM_ADD else None, dz, xd, dx, sd, scale,
                                  bias, ds, db, eps, md, smean, sinv, act, None, 0, None, 0, 1)
    xv, sv, bv = x.copy(), scale.copy(), bias.copy()
    gx = _numgrad(lambda: _loss(xv, scale, bias, z, g, eps, mode, relu), xv)
    gs = _numgrad(lambda: _loss(x, sv, bias, z, g, eps, mode, relu), sv)
    gb = _numgrad(lambda: _loss(x, scale, bv, z, g, eps, mode, relu), bv)
    np.testing.assert_allclose(dx, gx + 0.5 * dx0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ds, 2.0 * gs - ds0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(db, 2.0 * gb - db0, rtol=1e-5, atol=1e-6)
    if ops == NORM_ADD:
        zv = z.copy()
        gz = _numgrad(lambda: _loss(x, scale, bias, zv, g, eps, mode, relu), zv)
        np.testing.assert_allclose(dz, gz + 0.5 * dz0, rtol=1e-5, atol=1e-6)
    ws = cc.cudnnGetNormalizationBackwardWorkspaceSize(handle, mode, ops, STD, xd, xd if relu else None, xd,
                                                       xd if ops == NORM_ADD else None, xd, sd, act, md, 1)
    assert isinstance(ws, int) and ws >= 0


def test_backward_errors_write_nothing(handle):
    shape = (2, 3, 2, 2)
    xd = tdesc(shape)
    sd, md = derived(xd, PER_CH)
    x, dy, dx = np.ones(shape, np.float32), np.ones(shape, np.float32), np.full(shape, 7, np.float32)
    ds, db = np.full((1, 3, 1, 1), 7, np.float32), np.full((1, 3, 1, 1), 7, np.float32)
    sc = np.ones((1, 3, 1, 1), np.float32)

    def call(**kw):
        a = dict(ops=NORM, smean=sc, sinv=None, eps=1e-5, dxd=xd, md=md, yd=None, y=None, act=None)
        a.update(kw)
        cc.normalizationBackward(handle, PER_CH, a["ops"], STD, 1, 0, 1, 0, xd, x, a["yd"], a["y"], xd, dy, None, None,
                                 a["dxd"], dx, sd, sc, sc, ds, db, a["eps"], a["md"], a["smean"], a["sinv"], a["act"],
                                 None, 0, None, 0, 1)
    for kw, status, arg in [(dict(), BAD, "savedMean"),                               # rule: saved pair
                            (dict(smean=None, eps=-1), BAD, "epsilon"),              # rule: epsilon >= 0
                            (dict(smean=None, dxd=tdesc((2, 3, 2, 1))), BAD, "dxDesc"),  # rule: dims match
                            (dict(smean=None, md=tdesc((1, 2, 1, 1))), BAD, "normMeanVarDesc"),  # rule: param dims
                            (dict(smean=None, ops=NORM_ACT, act=relu_desc()), BAD, "yDesc")]:  # rule: y for act
        with pytest.raises(cc.CuDNNError) as e:
            call(**kw)
        assert e.value.status == status and arg in str(e.value), (kw, str(e.value))
    assert np.all(dx == 7) and np.all(ds == 7) and np.all(db == 7)


@pytest.mark.gpu
def test_gpu_training_and_backward_match_the_cpu(handle, rng):
    import cupy
    g = cc.cudnnCreate("gpu")
    try:
        shape, mode = (4, 3, 5, 6), PER_CH
        xd = tdesc(shape, fmt=NHWC)
        sd, md = derived(xd, mode)
        x = rng.standard_normal((4, 5, 6, 3)).astype(np.float32)
        z = rng.standard_normal((4, 5, 6, 3)).astype(np.float32)
        p = [rng.standard_normal((1, 3, 1, 1)).astype(np.float32) for _ in range(2)]
        outs = {}
        for name, hh, xp in (("cpu", handle, np), ("gpu", g, cupy)):
            y, sm, si = xp.zeros(x.shape, xp.float32), xp.zeros((1, 3, 1, 1), xp.float32), xp.zeros((1, 3, 1, 1), xp.float32)
            cc.normalizationForwardTraining(hh, mode, NORM_ADD, STD, 1.0, 0.0, xd, xp.asarray(x), sd, xp.asarray(p[0]),
                                            xp.asarray(p[1]), 0.1, md, None, None, 1e-4, sm, si, relu_desc(), xd,
                                            xp.asarray(z), xd, y, None, 0, None, 0, 1)
            dx, dz = xp.zeros(x.shape, xp.float32), xp.zeros(x.shape, xp.float32)
            ds, db = xp.zeros((1, 3, 1, 1), xp.float32), xp.zeros((1, 3, 1, 1), xp.float32)
            cc.normalizationBackward(hh, mode, NORM_ADD, STD, 1, 0, 1, 0, xd, xp.asarray(x), xd, y, xd, xp.asarray(z), xd,
                                     dz, xd, dx, sd, xp.asarray(p[0]), xp.asarray(p[1]), ds, db, 1e-4, md, sm, si,
                                     relu_desc(), None, 0, None, 0, 1)
            outs[name] = [a if xp is np else cupy.asnumpy(a) for a in (y, sm, si, dx, dz, ds, db)]
        for a, b in zip(outs["cpu"], outs["gpu"]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    finally:
        cc.cudnnDestroy(g)
