"""Batch normalization against formulas written here (002 §3.2.3, §3.2.18, §4.1.2-§4.1.5,
§4.1.8-§4.1.10; inventory §2.7): two-pass mean/variance, running averages with the
unbiased variance, saved mean/inverse std, and the backward pass against float64 finite
differences of the training forward."""
import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

PER_ACT, SPATIAL, PERSIST = (cc.CUDNN_BATCHNORM_PER_ACTIVATION, cc.CUDNN_BATCHNORM_SPATIAL,
                             cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
MODES = [PER_ACT, SPATIAL, PERSIST]
NCHW, NHWC = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC
OPS_BN, OPS_ACT, OPS_ADD = (cc.CUDNN_BATCHNORM_OPS_BN, cc.CUDNN_BATCHNORM_OPS_BN_ACTIVATION,
                            cc.CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
F32, F64, F16 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_HALF
NP = {F32: np.float32, F64: np.float64, F16: np.float16}


# -- formulas ----------------------------------------------------------------------------

def red_axes(mode, ndim):
    return (0,) if mode == PER_ACT else (0,) + tuple(range(2, ndim))


def two_pass(x, axes):
    """Mean, then the biased variance around it, and the element count per channel."""
    m = int(np.prod([x.shape[k] for k in axes]))
    mean = x.sum(axis=axes, keepdims=True) / m
    var = ((x - mean) ** 2).sum(axis=axes, keepdims=True) / m
    return mean, var, m


def pshape(mode, shape):
    ax = red_axes(mode, len(shape))
    return tuple(1 if k in ax else d for k, d in enumerate(shape))


# -- helpers -----------------------------------------------------------------------------

def to_mem(a, fmt):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1)) if fmt == NHWC else a.copy()


def from_mem(m, fmt):
    return np.moveaxis(m, -1, 1) if fmt == NHWC else m


def descs(shape, mode, dtype=F32, fmt=NCHW):
    xd = tdesc(shape, dtype, fmt)
    pd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnDeriveBNTensorDescriptor(pd, xd, mode)
    return xd, pd


class Params:
    """scale, bias, running and saved buffers in the parameter shape (float32 or float64)."""

    def __init__(self, rng, mode, shape, ptype=np.float32):
        ps = pshape(mode, shape)
        self.scale = rng.uniform(0.5, 1.5, ps).astype(ptype)
        self.bias = rng.standard_normal(ps).astype(ptype)
        self.rmean = rng.standard_normal(ps).astype(ptype)
        self.rvar = rng.uniform(0.5, 2.0, ps).astype(ptype)
        self.smean = np.full(ps, np.nan, ptype)
        self.sinv = np.full(ps, np.nan, ptype)


def train(handle, mode, x, p, xd, pd, factor=0.1, eps=1e-5, alpha=1.0, beta=0.0, y=None, running=True, saved=True):
    y = np.full(x.shape, np.nan, x.dtype) if y is None else y
    cc.cudnnBatchNormalizationForwardTraining(
        handle, mode, alpha, beta, xd, x, xd, y, pd, p.scale, p.bias, factor,
        p.rmean if running else None, p.rvar if running else None, eps,
        p.smean if saved else None, p.sinv if saved else None)
    return y


def backward(handle, mode, x, dy, scale, xd, pd, eps=1e-5, smean=None, sinv=None, ad=1.0, bd=0.0, ap=1.0, bp=0.0,
             dx=None, ds=None, db=None):
    dx = np.full(x.shape, np.nan, x.dtype) if dx is None else dx
    ds = np.full(scale.shape, np.nan, scale.dtype) if ds is None else ds
    db = np.full(scale.shape, np.nan, scale.dtype) if db is None else db
    cc.cudnnBatchNormalizationBackward(handle, mode, ad, bd, ap, bp, xd, x, xd, dy, xd, dx, pd, scale, ds, db, eps,
                                       smean, sinv)
    return dx, ds, db


# -- derived descriptor ------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 2, 4, 5)])
def test_derive_bn_tensor_descriptor(shape):
    for mode, want in [(PER_ACT, (1,) + shape[1:]), (SPATIAL, (1, shape[1]) + (1,) * (len(shape) - 2)),
                       (PERSIST, (1, shape[1]) + (1,) * (len(shape) - 2))]:
        for dt, pdt in [(F16, F32), (F32, F32), (F64, F64), (cc.CUDNN_DATA_BFLOAT16, F32)]:
            _, pd = descs(shape, mode, dt, NHWC)
            got = cc.cudnnGetTensorNdDescriptor(pd)
            assert got[0] == pdt and tuple(got[2]) == want


def test_derive_errors():
    pd = cc.cudnnCreateTensorDescriptor()
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnDeriveBNTensorDescriptor(pd, tdesc((2, 3, 4, 4)), 9)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "mode" in str(e.value)
    x3 = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(x3, F32, 3, [2, 3, 4], [12, 4, 1])
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnDeriveBNTensorDescriptor(pd, x3, SPATIAL)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM


# -- forward training --------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [NCHW, NHWC])
@pytest.mark.parametrize("shape", [(4, 3, 2, 5), (3, 2, 2, 3, 2)])
@pytest.mark.parametrize("mode", MODES)
def test_forward_training_matches_formula(handle, rng, mode, shape, fmt):
    x = rng.standard_normal(shape) * 2 + 0.5
    xd, pd = descs(shape, mode, F32, fmt)
    p = Params(rng, mode, shape)
    rm0, rv0 = p.rmean.astype(np.float64), p.rvar.astype(np.float64)
    y = from_mem(train(handle, mode, to_mem(x.astype(np.float32), fmt), p, xd, pd, factor=0.25, eps=1e-3), fmt)
    x32 = x.astype(np.float32).astype(np.float64)
    mean, var, m = two_pass(x32, red_axes(mode, len(shape)))
    want = p.scale * (x32 - mean) / np.sqrt(var + 1e-3) + p.bias
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(p.smean, mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.sinv, 1 / np.sqrt(var + 1e-3), rtol=1e-5)
    np.testing.assert_allclose(p.rmean, 0.75 * rm0 + 0.25 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.rvar, 0.75 * rv0 + 0.25 * var * m / (m - 1), rtol=1e-5)


def test_running_averages_over_two_calls_and_cumulative_average(handle, rng):
    shape, mode = (5, 2, 3, 2), SPATIAL
    xd, pd = descs(shape, mode, F64)
    p = Params(rng, mode, shape, np.float64)
    p.rmean[...] = 0.0
    p.rvar[...] = 0.0
    xs = [rng.standard_normal(shape) * (k + 1) + k for k in range(3)]
    means, vars_ = [], []
    for n, x in enumerate(xs):  # factor 1/(1+n): the cumulative moving average (002 §4.1.4)
        train(handle, mode, x, p, xd, pd, factor=1.0 / (1 + n))
        mean, var, m = two_pass(x, (0, 2, 3))
        means.append(mean)
        vars_.append(var * m / (m - 1))
    np.testing.assert_allclose(p.rmean, sum(means) / 3, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(p.rvar, sum(vars_) / 3, rtol=1e-12)
    # two calls with a fixed factor
    r0m, r0v = p.rmean.copy(), p.rvar.copy()
    for x in xs[:2]:
        train(handle, mode, x, p, xd, pd, factor=0.3)
        mean, var, m = two_pass(x, (0, 2, 3))
        r0m, r0v = 0.7 * r0m + 0.3 * mean, 0.7 * r0v + 0.3 * var * m / (m - 1)
    np.testing.assert_allclose(p.rmean, r0m, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(p.rvar, r0v, rtol=1e-12)


def test_training_without_running_or_saved_and_alpha_beta(handle, rng):
    shape, mode = (3, 4, 2, 2), SPATIAL
    xd, pd = descs(shape, mode, F64)
    p = Params(rng, mode, shape, np.float64)
    rm, rv = p.rmean.copy(), p.rvar.copy()
    x = rng.standard_normal(shape)
    y0 = rng.standard_normal(shape)
    y = train(handle, mode, x, p, xd, pd, alpha=-2.0, beta=0.5, y=y0.copy(), running=False, saved=False)
    mean, var, _ = two_pass(x, (0, 2, 3))
    np.testing.assert_allclose(y, -2.0 * (p.scale * (x - mean) / np.sqrt(var + 1e-5) + p.bias) + 0.5 * y0, rtol=1e-12)
    assert np.array_equal(p.rmean, rm) and np.array_equal(p.rvar, rv) and np.all(np.isnan(p.smean))


def test_fp16_data_with_float_params(handle, rng):
    shape, mode = (4, 3, 3, 3), SPATIAL
    xd, pd = descs(shape, mode, F16, NHWC)
    p = Params(rng, mode, shape)
    x16 = rng.standard_normal(shape).astype(np.float16)
    y = from_mem(train(handle, mode, to_mem(x16, NHWC), p, xd, pd), NHWC)
    assert y.dtype == np.float16
    x = x16.astype(np.float64)
    mean, var, _ = two_pass(x, (0, 2, 3))
    np.testing.assert_allclose(y.astype(np.float64), p.scale * (x - mean) / np.sqrt(var + 1e-5) + p.bias,
                               rtol=4e-3, atol=4e-3)
    np.testing.assert_allclose(p.smean, mean, rtol=1e-5, atol=1e-6)
    dy16 = rng.standard_normal(shape).astype(np.float16)
    dx, ds, db = backward(handle, mode, to_mem(x16, NHWC), to_mem(dy16, NHWC), p.scale, xd, pd,
                          smean=p.smean, sinv=p.sinv)
    dy = dy16.astype(np.float64)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3), keepdims=True), rtol=1e-5, atol=1e-4)
    xhat = (x - mean) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(ds, (dy * xhat).sum(axis=(0, 2, 3), keepdims=True), rtol=1e-4, atol=1e-4)
    m = x.size // 3
    want_dx = p.scale / np.sqrt(var + 1e-5) * (dy - dy.sum(axis=(0, 2, 3), keepdims=True) / m
                                                - xhat * (dy * xhat).sum(axis=(0, 2, 3), keepdims=True) / m)
    assert dx.dtype == np.float16
    np.testing.assert_allclose(from_mem(dx, NHWC).astype(np.float64), want_dx, rtol=5e-3, atol=5e-3)


# -- inference ---------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [NCHW, NHWC])
@pytest.mark.parametrize("mode", MODES)
def test_inference_matches_formula(handle, rng, mode, fmt):
    shape = (3, 4, 2, 3)
    xd, pd = descs(shape, mode, F32, fmt)
    p = Params(rng, mode, shape)
    x = rng.standard_normal(shape).astype(np.float32)
    y0 = rng.standard_normal(shape).astype(np.float32)
    y = to_mem(y0, fmt)
    cc.cudnnBatchNormalizationForwardInference(handle, mode, 1.5, -0.5, xd, to_mem(x, fmt), xd, y, pd, p.scale, p.bias,
                                               p.rmean, p.rvar, 1e-2)
    want = 1.5 * (p.bias + p.scale * (x - p.rmean) / np.sqrt(1e-2 + p.rvar.astype(np.float64))) - 0.5 * y0
    np.testing.assert_allclose(from_mem(y, fmt), want, rtol=1e-5, atol=1e-5)


def test_inference_double_int8_and_beta_zero_never_reads_y(handle, rng):
    shape, mode = (2, 3, 2, 2), SPATIAL
    xd, pd = descs(shape, mode, F64)
    p = Params(rng, mode, shape, np.float64)
    x = rng.standard_normal(shape)
    y = np.full(shape, np.nan)
    cc.batchNormalizationForwardInference(handle, mode, 1.0, 0.0, xd, x, xd, y, pd, p.scale, p.bias, p.rmean, p.rvar, 0.0)
    np.testing.assert_allclose(y, p.bias + p.scale * (x - p.rmean) / np.sqrt(p.rvar), rtol=1e-12)
    xd8, pd8 = descs(shape, mode, cc.CUDNN_DATA_INT8)
    q = Params(rng, mode, shape)
    x8 = rng.integers(-100, 100, shape).astype(np.int8)
    y8 = np.zeros(shape, np.int8)
    cc.cudnnBatchNormalizationForwardInference(handle, mode, 1.0, 0.0, xd8, x8, xd8, y8, pd8, q.scale, q.bias,
                                               q.rmean, q.rvar, 1e-5)
    want = q.bias + q.scale * (x8 - q.rmean.astype(np.float64)) / np.sqrt(1e-5 + q.rvar.astype(np.float64))
    assert np.max(np.abs(y8 - np.clip(np.rint(want), -128, 127))) <= 1


# -- backward ----------------------------------------------------------------------------

@pytest.mark.parametrize("use_saved", [True, False])
@pytest.mark.parametrize("mode,shape", [(PER_ACT, (4, 2, 2, 2)), (SPATIAL, (2, 2, 2, 3)), (PERSIST, (2, 2, 1, 2, 2))])
def test_backward_matches_finite_differences(handle, rng, mode, shape, use_saved):
    """dL/dx, dL/dscale, dL/dbias of L = sum(w * y(x, scale, bias)), y the training forward."""
    xd, pd = descs(shape, mode, F64)
    p = Params(rng, mode, shape, np.float64)
    x = rng.standard_normal(shape)
    w = rng.standard_normal(shape)

    def loss(xv, scale, bias):
        q = Params(rng, mode, shape, np.float64)
        q.scale, q.bias = scale, bias
        return float(np.sum(w * train(handle, mode, xv, q, xd, pd, running=False, saved=False)))

    h = 1e-6
    num_dx = np.zeros(shape)
    for i in np.ndindex(*shape):
        e = np.zeros(shape)
        e[i] = h
        num_dx[i] = (loss(x + e, p.scale, p.bias) - loss(x - e, p.scale, p.bias)) / (2 * h)
    num_ds, num_db = np.zeros(p.scale.shape), np.zeros(p.scale.shape)
    for i in np.ndindex(*p.scale.shape):
        e = np.zeros(p.scale.shape)
        e[i] = h
        num_ds[i] = (loss(x, p.scale + e, p.bias) - loss(x, p.scale - e, p.bias)) / (2 * h)
        num_db[i] = (loss(x, p.scale, p.bias + e) - loss(x, p.scale, p.bias - e)) / (2 * h)
    if use_saved:
        train(handle, mode, x, p, xd, pd)
        dx, ds, db = backward(handle, mode, x, w, p.scale, xd, pd, smean=p.smean, sinv=p.sinv)
    else:
        dx, ds, db = backward(handle, mode, x, w, p.scale, xd, pd)
    np.testing.assert_allclose(dx, num_dx, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ds, num_ds, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(db, num_db, rtol=1e-6, atol=1e-7)


def test_backward_alpha_beta_data_and_param(handle, rng):
    shape, mode = (3, 2, 2, 2), SPATIAL
    xd, pd = descs(shape, mode, F64)
    p = Params(rng, mode, shape, np.float64)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    dx1, ds1, db1 = backward(handle, mode, x, dy, p.scale, xd, pd)  # NaN-filled outputs, beta 0
    assert np.all(np.isfinite(dx1)) and np.all(np.isfinite(ds1)) and np.all(np.isfinite(db1))
    dx0, ds0, db0 = rng.standard_normal(shape), rng.standard_normal(p.scale.shape), rng.standard_normal(p.scale.shape)
    dx, ds, db = backward(handle, mode, x, dy, p.scale, xd, pd, ad=2.0, bd=-1.0, ap=0.5, bp=3.0,
                          dx=dx0.copy(), ds=ds0.copy(), db=db0.copy())
    np.testing.assert_allclose(dx, 2.0 * dx1 - dx0, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ds, 0.5 * ds1 + 3.0 * ds0, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, 0.5 * db1 + 3.0 * db0, rtol=1e-12, atol=1e-12)
    # the parameter gradients alone accumulate (beta 1) while dx is overwritten
    dx, ds, db = backward(handle, mode, x, dy, p.scale, xd, pd, bp=1.0, dx=dx0.copy(), ds=ds1.copy(), db=db1.copy())
    np.testing.assert_allclose(ds, 2 * ds1, rtol=1e-12)
    np.testing.assert_allclose(dx, dx1, rtol=1e-12)


# -- Ex variants -------------------------------------------------------------------------

def act_desc(mode, coef=0.0):
    d = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(d, mode, cc.CUDNN_NOT_PROPAGATE_NAN, coef)
    return d


def train_ex(handle, mode, ops, x, z, p, xd, pd, act, y=None, alpha=1.0, beta=0.0, ws=None, ws_size=0):
    y = np.full(x.shape, np.nan, x.dtype) if y is None else y
    cc.cudnnBatchNormalizationForwardTrainingEx(
        handle, mode, ops, alpha, beta, xd, x, xd if z is not None else None, z, xd, y, pd, p.scale, p.bias, 0.1,
        p.rmean, p.rvar, 1e-5, p.smean, p.sinv, act, ws, ws_size, None, 0)
    return y


def backward_ex(handle, mode, ops, x, y, dy, p, xd, pd, act, with_dz, ad=1.0, bd=0.0):
    dx, dz = np.full(x.shape, np.nan), np.full(x.shape, np.nan) if with_dz else None
    ds, db = np.full(p.scale.shape, np.nan), np.full(p.scale.shape, np.nan)
    cc.cudnnBatchNormalizationBackwardEx(
        handle, mode, ops, ad, bd, 1.0, 0.0, xd, x, xd if y is not None else None, y, xd, dy,
        xd if with_dz else None, dz, xd, dx, pd, p.scale, p.bias, ds, db, 1e-5, p.smean, p.sinv, act, None, 0, None, 0)
    return dx, dz, ds, db


def test_ex_bn_only_equals_plain_call(handle, rng):
    shape, mode = (3, 2, 2, 3), PERSIST
    xd, pd = descs(shape, mode, F64)
    p, q = Params(rng, mode, shape, np.float64), None
    q = Params(rng, mode, shape, np.float64)
    q.scale, q.bias, q.rmean, q.rvar = p.scale.copy(), p.bias.copy(), p.rmean.copy(), p.rvar.copy()
    x = rng.standard_normal(shape)
    ws = np.zeros(16, np.uint8)
    y_ex = train_ex(handle, mode, OPS_BN, x, None, p, xd, pd, None, ws=ws, ws_size=16)
    y = train(handle, mode, x, q, xd, pd)
    np.testing.assert_array_equal(y_ex, y)
    for a, b in [(p.rmean, q.rmean), (p.rvar, q.rvar), (p.smean, q.smean), (p.sinv, q.sinv)]:
        np.testing.assert_array_equal(a, b)
    dy = rng.standard_normal(shape)
    got = backward_ex(handle, mode, OPS_BN, x, None, dy, p, xd, pd, None, False)
    want = backward(handle, mode, x, dy, p.scale, xd, pd, smean=q.smean, sinv=q.sinv)
    for g, w in zip((got[0], got[2], got[3]), want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("act_mode,fwd,dact", [
    (cc.CUDNN_ACTIVATION_RELU, lambda v: np.maximum(v, 0), lambda y: (y > 0).astype(float)),
    (cc.CUDNN_ACTIVATION_TANH, np.tanh, lambda y: 1 - y * y),
    (cc.CUDNN_ACTIVATION_IDENTITY, lambda v: v, lambda y: np.ones_like(y)),
])
@pytest.mark.parametrize("ops", [OPS_ACT, OPS_ADD])
def test_ex_activation_and_add(handle, rng, ops, act_mode, fwd, dact):
    shape, mode = (4, 3, 2, 2), SPATIAL
    xd, pd = descs(shape, mode, F64, NHWC)
    p = Params(rng, mode, shape, np.float64)
    x, z, dy = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape)
    act = act_desc(act_mode)
    zz = z if ops == OPS_ADD else None
    y0 = rng.standard_normal(shape)
    y = from_mem(train_ex(handle, mode, ops, to_mem(x, NHWC), None if zz is None else to_mem(zz, NHWC), p, xd, pd, act,
                          y=to_mem(y0, NHWC), alpha=1.0, beta=0.0), NHWC)
    mean, var, _ = two_pass(x, (0, 2, 3))
    bn = p.scale * (x - mean) / np.sqrt(var + 1e-5) + p.bias
    want = fwd(bn + (z if ops == OPS_ADD else 0))
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    # backward: the activation derivative read through y, dz = that, then the BN backward
    dx, dz, ds, db = backward_ex(handle, mode, ops, to_mem(x, NHWC), to_mem(y, NHWC), to_mem(dy, NHWC), p, xd, pd, act,
                                 ops == OPS_ADD, ad=0.5)
    dpre = dy * dact(y)
    if ops == OPS_ADD:
        np.testing.assert_allclose(from_mem(dz, NHWC), 0.5 * dpre, rtol=1e-12, atol=1e-12)
    want_dx, want_ds, want_db = backward(handle, mode, to_mem(x, NHWC), to_mem(dpre, NHWC), p.scale, xd, pd,
                                         smean=p.smean, sinv=p.sinv, ad=0.5)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ds, want_ds, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, want_db, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, dpre.sum(axis=(0, 2, 3), keepdims=True), rtol=1e-12, atol=1e-12)


def test_ex_half_with_add_relu_and_size_queries(handle, rng):
    shape, mode = (2, 4, 3, 3), PERSIST
    xd, pd = descs(shape, mode, F16, NHWC)
    p = Params(rng, mode, shape)
    act = act_desc(cc.CUDNN_ACTIVATION_RELU)
    assert cc.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, mode, OPS_ADD, xd, xd, xd, pd, act) == 0
    assert cc.cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, mode, OPS_ADD, xd, xd, xd, xd, xd, pd, act) == 0
    assert cc.cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, mode, OPS_ADD, act, xd) == 0
    x16, z16 = rng.standard_normal(shape).astype(np.float16), rng.standard_normal(shape).astype(np.float16)
    y = from_mem(train_ex(handle, mode, OPS_ADD, to_mem(x16, NHWC), to_mem(z16, NHWC), p, xd, pd, act), NHWC)
    x, z = x16.astype(np.float64), z16.astype(np.float64)
    mean, var, _ = two_pass(x, (0, 2, 3))
    want = np.maximum(p.scale * (x - mean) / np.sqrt(var + 1e-5) + p.bias + z, 0)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=4e-3, atol=4e-3)


# -- plan cache --------------------------------------------------------------------------

def test_repeat_with_other_epsilon_and_factor_is_a_cache_hit(handle, rng):
    shape, mode = (2, 3, 2, 2), SPATIAL
    xd, pd = descs(shape, mode)
    p = Params(rng, mode, shape)
    x = rng.standard_normal(shape).astype(np.float32)
    train(handle, mode, x, p, xd, pd, factor=0.1, eps=1e-5)
    before = cc.plan_cache_info()
    y = train(handle, mode, x, p, xd, pd, factor=0.5, eps=1e-2)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    mean, var, _ = two_pass(x.astype(np.float64), (0, 2, 3))
    np.testing.assert_allclose(y, p.scale * (x - mean) / np.sqrt(var + 1e-2) + p.bias, rtol=1e-5, atol=1e-5)


# -- errors ------------------------------------------------------------------------------

BAD, UNSUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED


def _expect(status, call, *untouched):
    before = [u.copy() for u in untouched]
    with pytest.raises(cc.CuDNNError) as e:
        call()
    assert e.value.status == status, e.value
    for u, b in zip(untouched, before):
        np.testing.assert_array_equal(u, b)
    return e.value


def test_forward_training_errors_write_nothing(handle, rng):
    shape, mode = (2, 3, 2, 2), SPATIAL
    xd, pd = descs(shape, mode)
    p = Params(rng, mode, shape)
    p.smean[...] = 5.0
    p.sinv[...] = 5.0
    x = rng.standard_normal(shape).astype(np.float32)
    y = np.full(shape, 7.0, np.float32)
    x3 = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(x3, F32, 3, [2, 3, 4], [12, 4, 1])
    pd_act = descs(shape, PER_ACT)[1]
    pd_dbl = tdesc((1, 3, 1, 1), F64)
    x1 = tdesc((1, 3, 1, 1))

    def call(mode=mode, xd=xd, yd=xd, pd=pd, x=x, y=y, scale=p.scale, rm=p.rmean, rv=p.rvar, sm=p.smean, si=p.sinv,
             eps=1e-5):
        cc.cudnnBatchNormalizationForwardTraining(handle, mode, 1.0, 0.0, xd, x, yd, y, pd, scale, p.bias, 0.1, rm, rv,
                                                  eps, sm, si)
    outs = (y, p.rmean, p.rvar, p.smean, p.sinv)
    cases = [
        (BAD, dict(mode=7)),  # invalid mode
        (BAD, dict(x=None)), (BAD, dict(y=None)), (BAD, dict(scale=None)),  # NULL pointers
        (BAD, dict(xd=x3, yd=x3)),  # nbDims not in [4, 5]
        (BAD, dict(yd=tdesc((2, 3, 2, 3)))),  # x/y dims differ
        (BAD, dict(yd=tdesc(shape, F64))),  # x/y data types differ
        (BAD, dict(pd=pd_act)),  # param dims wrong for the mode
        (BAD, dict(sm=None)),  # exactly one saved pointer NULL
        (BAD, dict(rv=None)),  # exactly one running pointer NULL
        (BAD, dict(eps=-1e-3)),  # epsilon < CUDNN_BN_MIN_EPSILON
        (UNSUP, dict(pd=pd_dbl)),  # DOUBLE params for FLOAT data
        (UNSUP, dict(xd=tdesc(shape, cc.CUDNN_DATA_INT8), yd=tdesc(shape, cc.CUDNN_DATA_INT8))),  # INT8 training
        (UNSUP, dict(xd=x1, yd=x1)),  # one value per channel: no unbiased running variance
    ]
    for status, kw in cases:
        e = _expect(status, lambda: call(**kw), *outs)
        assert "cudnnBatchNormalizationForwardTraining" in str(e)


def test_inference_and_backward_errors_write_nothing(handle, rng):
    shape, mode = (2, 3, 2, 2), SPATIAL
    xd, pd = descs(shape, mode)
    p = Params(rng, mode, shape)
    x = rng.standard_normal(shape).astype(np.float32)
    y = np.full(shape, 7.0, np.float32)

    def inf(mean=p.rmean, eps=1e-5, yd=xd, pd=pd):
        cc.cudnnBatchNormalizationForwardInference(handle, mode, 1.0, 0.0, xd, x, yd, y, pd, p.scale, p.bias, mean,
                                                   p.rvar, eps)
    for status, kw in [(BAD, dict(mean=None)), (BAD, dict(eps=-1.0)), (BAD, dict(yd=tdesc((2, 3, 2, 1)))),
                       (BAD, dict(pd=tdesc((1, 3, 2, 1)))), (UNSUP, dict(pd=tdesc((1, 3, 1, 1), F16)))]:
        _expect(status, lambda: inf(**kw), y)
    with pytest.raises(cc.CuDNNError) as e:  # alpha NULL
        cc.cudnnBatchNormalizationForwardInference(handle, mode, None, 0.0, xd, x, xd, y, pd, p.scale, p.bias,
                                                   p.rmean, p.rvar, 1e-5)
    assert e.value.status == BAD and np.all(y == 7.0)

    dx = np.full(shape, 7.0, np.float32)
    ds, db = np.full(p.scale.shape, 7.0, np.float32), np.full(p.scale.shape, 7.0, np.float32)

    def bwd(dyd=xd, dxd=xd, dx=dx, ds=ds, sm=p.rmean, si=p.rvar, eps=1e-5, pd=pd, a=1.0):
        cc.cudnnBatchNormalizationBackward(handle, mode, a, 0.0, 1.0, 0.0, xd, x, dyd, x, dxd, dx, pd, p.scale, ds, db,
                                           eps, sm, si)
    for status, kw in [(BAD, dict(dx=None)), (BAD, dict(ds=None)), (BAD, dict(a=None)),
                       (BAD, dict(dyd=tdesc((2, 3, 2, 1)))), (BAD, dict(dxd=tdesc(shape, F64))),
                       (BAD, dict(si=None)), (BAD, dict(eps=-1e-9)), (BAD, dict(pd=descs(shape, PER_ACT)[1]))]:
        _expect(status, lambda: bwd(**kw), dx, ds, db)


def test_ex_errors_write_nothing(handle, rng):
    shape, mode = (2, 3, 2, 2), SPATIAL
    xd, pd = descs(shape, mode, F64)
    p = Params(rng, mode, shape, np.float64)
    x = rng.standard_normal(shape)
    y = np.full(shape, 7.0)
    relu, swish = act_desc(cc.CUDNN_ACTIVATION_RELU), act_desc(cc.CUDNN_ACTIVATION_SWISH)

    def fwd(ops=OPS_ADD, zd=xd, z=x, act=relu, ws_size=0):
        cc.cudnnBatchNormalizationForwardTrainingEx(handle, mode, ops, 1.0, 0.0, xd, x, zd, z, xd, y, pd, p.scale,
                                                    p.bias, 0.1, p.rmean, p.rvar, 1e-5, p.smean, p.sinv, act, None,
                                                    ws_size, None, 0)
    for status, kw in [(BAD, dict(ops=5)), (BAD, dict(act=None)), (BAD, dict(z=None)),
                       (BAD, dict(zd=tdesc((2, 3, 2, 1), F64))), (BAD, dict(ws_size=-1))]:
        _expect(status, lambda: fwd(**kw), y, p.rmean, p.rvar)
    dx, dz = np.full(shape, 7.0), np.full(shape, 7.0)
    ds, db = np.full(p.scale.shape, 7.0), np.full(p.scale.shape, 7.0)

    def bwd(ops=OPS_ADD, yv=y, dzv=dz, act=relu):
        cc.cudnnBatchNormalizationBackwardEx(handle, mode, ops, 1.0, 0.0, 1.0, 0.0, xd, x, xd, yv, xd, x, xd, dzv, xd,
                                             dx, pd, p.scale, p.bias, ds, db, 1e-5, None, None, act, None, 0, None, 0)
    for status, kw in [(BAD, dict(yv=None)), (BAD, dict(dzv=None)), (BAD, dict(act=None)), (BAD, dict(ops=-1)),
                       (UNSUP, dict(act=swish))]:  # swish's derivative needs x, not y
        _expect(status, lambda: bwd(**kw), dx, dz, ds, db)
    x3 = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(x3, F32, 3, [2, 3, 4], [12, 4, 1])
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, mode, OPS_BN, None, x3)
    assert e.value.status == BAD
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, mode, OPS_BN, xd, None,
                                                                    tdesc((2, 3, 2, 1), F64), pd, None)
    assert e.value.status == BAD


def test_graph_rules_for_norm_ops():
    """The NormForward/NormBackward finalize rules (cudnn_compat/_backend/ops/resample_norm.py)."""
    from cudnn_compat._backend.ir import GraphError, Operation, OperationGraph, Tensor, packed_strides, scalar

    def t(uid, dims):
        return Tensor(uid, dims, packed_strides(dims), "float32")

    x, y, s, b = t(1, (2, 3, 2, 2)), t(2, (2, 3, 2, 2)), t(3, (1, 3, 1, 1)), t(4, (1, 3, 1, 1))
    eps = scalar(90, "float64")
    attrs = {"phase": "TRAINING", "axes": (0, 2, 3)}
    OperationGraph([Operation("NormForward", {"x": x, "scale": s, "bias": b, "epsilon": eps}, {"y": y}, attrs)]).finalize()
    cases = [
        (Operation("NormForward", {"x": x, "scale": s, "bias": b}, {"y": y}, attrs), "NORM_EPSILON"),
        (Operation("NormForward", {"x": x, "scale": t(3, (1, 3, 2, 2)), "bias": b, "epsilon": eps}, {"y": y}, attrs),
         "NORM_PARAM_DIMS"),
        (Operation("NormForward", {"x": x, "scale": s, "bias": b, "epsilon": eps}, {"y": y, "saved_mean": t(5, s.dims)},
                   attrs), "NORM_PAIR"),
        (Operation("NormForward", {"x": x, "scale": s, "bias": b, "epsilon": eps}, {"y": y},
                   {"phase": "TRAINING", "axes": (1, 2)}), "NORM_AXES"),
        (Operation("NormForward", {"x": x, "scale": s, "bias": b}, {"y": y}, {"phase": "INFERENCE", "axes": (0, 2, 3)}),
         "NORM_INFERENCE_INPUTS"),
        (Operation("NormBackward", {"x": x, "dy": y, "scale": s}, {"dx": t(6, x.dims)}, {"axes": (0, 2, 3)}),
         "NORM_EPSILON"),
    ]
    for op, check in cases:
        with pytest.raises(GraphError) as e:
            OperationGraph([op]).finalize()
        assert e.value.check == check and e.value.status == "BAD_PARAM"
