"""The fused-ops API against formulas written here (002 §6.1.3, §6.2.3-§6.2.19, Tables 23-35;
inventory §2.16): each of the 7 patterns, the pack attribute round trips, and the BAD_PARAM /
NOT_SUPPORTED rules of Make and Execute."""
import ctypes

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

P = "CUDNN_PARAM_"
ELEM, ALIGN16, NULL = cc.CUDNN_PTR_ELEM_ALIGNED, cc.CUDNN_PTR_16B_ALIGNED, cc.CUDNN_PTR_NULL
SPATIAL = cc.CUDNN_BATCHNORM_SPATIAL
BAD, UNSUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
F32 = cc.CUDNN_DATA_FLOAT


# -- formulas ----------------------------------------------------------------------------

def conv2d(x, w, pad, stride):
    """Cross-correlation by direct loops over output positions."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    y = np.zeros((n, k, ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, i * stride:i * stride + r, j * stride:j * stride + s]
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", patch, w)
    return y


def wgrad(x, dy, pad, stride, r, s):
    """dw[k, c, r, s] = sum over n, i, j of dy[n, k, i, j] * x_padded[n, c, i*stride + r, j*stride + s]."""
    n, c, h, wd = x.shape
    k, ho, wo = dy.shape[1], dy.shape[2], dy.shape[3]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    dw = np.zeros((k, c, r, s))
    for a in range(r):
        for b in range(s):
            patch = xp[:, :, a:a + stride * ho:stride, b:b + stride * wo:stride]
            dw[:, :, a, b] = np.einsum("nkij,ncij->kc", dy, patch)
    return dw


def pc(v):
    return v.reshape(1, -1, 1, 1)


# -- helpers -----------------------------------------------------------------------------

def conv_desc(pad, stride):
    d = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(d, pad, pad, stride, stride, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    return d


def filt(shape):
    d = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(d, F32, cc.CUDNN_TENSOR_NCHW, *shape)
    return d


def act(mode=cc.CUDNN_ACTIVATION_RELU):
    a = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(a, mode, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    return a


def const_pack(ops, settings: dict):
    cp = cc.cudnnCreateFusedOpsConstParamPack(ops)
    for label, value in settings.items():
        cc.cudnnSetFusedOpsConstParamPackAttribute(cp, getattr(cc, P + label), value)
    return cp


def execute(handle, ops, settings: dict, pointers: dict, scalars=None, xp=np):
    """Make a plan for ``settings`` and run it on ``pointers`` (label suffix -> array); returns the
    workspace size the plan asked for (the workspace is an ``xp`` array: CuPy on a GPU handle)."""
    cp = const_pack(ops, settings)
    plan = cc.cudnnCreateFusedOpsPlan(ops)
    ws = cc.cudnnMakeFusedOpsPlan(handle, plan, cp)
    vp = cc.cudnnCreateFusedOpsVariantParamPack(ops)
    for label, value in pointers.items():
        cc.cudnnSetFusedOpsVariantParamPackAttribute(vp, getattr(cc, "CUDNN_PTR_" + label), value)
    for label, value in (scalars or {}).items():
        cc.cudnnSetFusedOpsVariantParamPackAttribute(vp, getattr(cc, "CUDNN_SCALAR_" + label), value)
    cc.cudnnSetFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES, ws)
    if ws:
        cc.cudnnSetFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_PTR_WORKSPACE, xp.zeros(ws, np.uint8))
    cc.cudnnFusedOpsExecute(handle, plan, vp)
    for d, destroy in ((vp, cc.cudnnDestroyFusedOpsVariantParamPack), (plan, cc.cudnnDestroyFusedOpsPlan),
                       (cp, cc.cudnnDestroyFusedOpsConstParamPack)):
        destroy(d)
    return ws


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- the seven patterns ------------------------------------------------------------------

@pytest.mark.parametrize("with_scale_bias,relu,stats", [(True, True, True), (False, False, True), (True, True, False)])
def test_scale_bias_activation_conv_bnstats(handle, rng, with_scale_bias, relu, stats):
    n, c, h, w_, k = 2, 3, 5, 4, 4
    x, w = f32(rng, n, c, h, w_), f32(rng, k, c, 3, 3)
    s, b = f32(rng, c), f32(rng, c)
    y = np.full((n, k, h, w_), np.nan, np.float32)
    ysum, ysq = np.full(k, np.nan, np.float32), np.full(k, np.nan, np.float32)
    settings = dict(XDESC=tdesc(x.shape), XDATA_PLACEHOLDER=ALIGN16, BN_MODE=SPATIAL, CONV_DESC=conv_desc(1, 1),
                    WDESC=filt(w.shape), WDATA_PLACEHOLDER=ELEM, YDESC=tdesc(y.shape), YDATA_PLACEHOLDER=ELEM)
    pointers = dict(XDATA=x, WDATA=w, YDATA=y)
    if with_scale_bias:
        settings.update(BN_EQSCALEBIAS_DESC=tdesc((1, c, 1, 1)), BN_EQSCALE_PLACEHOLDER=ELEM, BN_EQBIAS_PLACEHOLDER=ELEM)
        pointers.update(BN_EQSCALE=s, BN_EQBIAS=b)
    if relu:
        settings["ACTIVATION_DESC"] = act()
    if stats:
        settings.update(YSTATS_DESC=tdesc((1, k, 1, 1)), YSUM_PLACEHOLDER=ELEM, YSQSUM_PLACEHOLDER=ELEM)
        pointers.update(YSUM=ysum, YSQSUM=ysq)
    execute(handle, cc.CUDNN_FUSED_SCALE_BIAS_ACTIVATION_CONV_BNSTATS, settings, pointers)
    t = x.astype(np.float64)
    if with_scale_bias:
        t = t * pc(s) + pc(b)
    if relu:
        t = np.maximum(t, 0)
    want = conv2d(t, w.astype(np.float64), 1, 1)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    if stats:
        np.testing.assert_allclose(ysum, want.sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(ysq, (want ** 2).sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-3)
    else:
        assert np.all(np.isnan(ysum))  # a NOP: not written


def test_scale_bias_activation_wgrad(handle, rng):
    n, c, h, w_, k, stride, pad = 2, 3, 6, 5, 2, 2, 1
    x, s, b = f32(rng, n, c, h, w_), f32(rng, c), f32(rng, c)
    ho, wo = (h + 2 * pad - 3) // stride + 1, (w_ + 2 * pad - 3) // stride + 1
    dy = f32(rng, n, k, ho, wo)
    dw = np.full((k, c, 3, 3), np.nan, np.float32)
    settings = dict(XDESC=tdesc(x.shape), XDATA_PLACEHOLDER=ELEM, BN_MODE=cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
                    BN_EQSCALEBIAS_DESC=tdesc((1, c, 1, 1)), BN_EQSCALE_PLACEHOLDER=ELEM, BN_EQBIAS_PLACEHOLDER=ELEM,
                    ACTIVATION_DESC=act(), CONV_DESC=conv_desc(pad, stride), DWDESC=filt(dw.shape),
                    DWDATA_PLACEHOLDER=ELEM, DYDESC=tdesc(dy.shape), DYDATA_PLACEHOLDER=ELEM)
    execute(handle, cc.CUDNN_FUSED_SCALE_BIAS_ACTIVATION_WGRAD, settings,
            dict(XDATA=x, BN_EQSCALE=s, BN_EQBIAS=b, DWDATA=dw, DYDATA=dy))
    t = np.maximum(x.astype(np.float64) * pc(s) + pc(b), 0)
    np.testing.assert_allclose(dw, wgrad(t, dy.astype(np.float64), pad, stride, 3, 3), rtol=1e-4, atol=1e-4)


def _stats_problem(rng, c=3, m=24):
    data = rng.standard_normal((m, c)) * 2 + 1
    return data.sum(0).astype(np.float32), (data ** 2).sum(0).astype(np.float32), m


def test_bn_finalize_statistics_training(handle, rng):
    c = 3
    ysum, ysq, m = _stats_problem(rng, c)
    scale, bias = f32(rng, c), f32(rng, c)
    rm0, rv0 = f32(rng, c), rng.random(c).astype(np.float32)
    rm, rv = rm0.copy(), rv0.copy()
    smean, sinv, es, eb = (np.full(c, np.nan, np.float32) for _ in range(4))
    pd = tdesc((1, c, 1, 1))
    settings = dict(BN_MODE=SPATIAL, YSTATS_DESC=pd, YSUM_PLACEHOLDER=ELEM, YSQSUM_PLACEHOLDER=ELEM,
                    BN_SCALEBIAS_MEANVAR_DESC=pd, BN_SCALE_PLACEHOLDER=ELEM, BN_BIAS_PLACEHOLDER=ELEM,
                    BN_SAVED_MEAN_PLACEHOLDER=ELEM, BN_SAVED_INVSTD_PLACEHOLDER=ELEM, BN_RUNNING_MEAN_PLACEHOLDER=ELEM,
                    BN_RUNNING_VAR_PLACEHOLDER=ELEM, BN_EQSCALEBIAS_DESC=pd, BN_EQSCALE_PLACEHOLDER=ELEM,
                    BN_EQBIAS_PLACEHOLDER=ELEM)
    eps, f = 1e-3, 0.25
    execute(handle, cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_TRAINING, settings,
            dict(YSUM=ysum, YSQSUM=ysq, BN_SCALE=scale, BN_BIAS=bias, BN_SAVED_MEAN=smean, BN_SAVED_INVSTD=sinv,
                 BN_RUNNING_MEAN=rm, BN_RUNNING_VAR=rv, BN_EQSCALE=es, BN_EQBIAS=eb),
            dict(INT64_T_BN_ACCUMULATION_COUNT=m, DOUBLE_BN_EXP_AVG_FACTOR=f, DOUBLE_BN_EPSILON=eps))
    mean = ysum.astype(np.float64) / m
    var = ysq.astype(np.float64) / m - mean ** 2
    inv = 1 / np.sqrt(var + eps)
    np.testing.assert_allclose(smean, mean, rtol=1e-5)
    np.testing.assert_allclose(sinv, inv, rtol=1e-4)
    np.testing.assert_allclose(rm, (1 - f) * rm0 + f * mean, rtol=1e-5)
    np.testing.assert_allclose(rv, (1 - f) * rv0 + f * var * m / (m - 1), rtol=1e-4)
    np.testing.assert_allclose(es, scale * inv, rtol=1e-4)
    np.testing.assert_allclose(eb, bias - mean * scale * inv, rtol=1e-4, atol=1e-5)


def test_bn_finalize_training_only_eq_scale(handle, rng):
    """Optional outputs are NOPs: only eqScale requested, nothing else read or written."""
    c = 2
    ysum, ysq, m = _stats_problem(rng, c)
    scale = f32(rng, c)
    es = np.zeros(c, np.float32)
    pd = tdesc((1, c, 1, 1))
    execute(handle, cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_TRAINING,
            dict(BN_MODE=SPATIAL, YSTATS_DESC=pd, YSUM_PLACEHOLDER=ELEM, YSQSUM_PLACEHOLDER=ELEM,
                 BN_SCALEBIAS_MEANVAR_DESC=pd, BN_SCALE_PLACEHOLDER=ELEM, BN_EQSCALEBIAS_DESC=pd,
                 BN_EQSCALE_PLACEHOLDER=ELEM),
            dict(YSUM=ysum, YSQSUM=ysq, BN_SCALE=scale, BN_EQSCALE=es),
            dict(INT64_T_BN_ACCUMULATION_COUNT=m, DOUBLE_BN_EPSILON=0.0))
    mean = ysum.astype(np.float64) / m
    np.testing.assert_allclose(es, scale / np.sqrt(ysq / m - mean ** 2), rtol=1e-4)


def test_bn_finalize_statistics_inference(handle, rng):
    c = 4
    scale, bias, rm = f32(rng, c), f32(rng, c), f32(rng, c)
    rv = rng.random(c).astype(np.float32) + 0.1
    es, eb = np.zeros(c, np.float32), np.zeros(c, np.float32)
    pd = tdesc((1, c, 1, 1))
    execute(handle, cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE,
            dict(BN_MODE=SPATIAL, BN_SCALEBIAS_MEANVAR_DESC=pd, BN_SCALE_PLACEHOLDER=ELEM, BN_BIAS_PLACEHOLDER=ELEM,
                 BN_RUNNING_MEAN_PLACEHOLDER=ELEM, BN_RUNNING_VAR_PLACEHOLDER=ELEM, BN_EQSCALEBIAS_DESC=pd,
                 BN_EQSCALE_PLACEHOLDER=ELEM, BN_EQBIAS_PLACEHOLDER=ELEM),
            dict(BN_SCALE=scale, BN_BIAS=bias, BN_RUNNING_MEAN=rm, BN_RUNNING_VAR=rv, BN_EQSCALE=es, BN_EQBIAS=eb),
            dict(DOUBLE_BN_EPSILON=1e-4))
    inv = 1 / np.sqrt(rv.astype(np.float64) + 1e-4)
    np.testing.assert_allclose(es, scale * inv, rtol=1e-5)
    np.testing.assert_allclose(eb, bias - rm * scale * inv, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("z_terms", ["none", "z", "z_scale_bias"])
def test_conv_scale_bias_add_activation(handle, rng, z_terms):
    n, c, h, w_, k = 2, 2, 4, 4, 3
    x, w, s, b = f32(rng, n, c, h, w_), f32(rng, k, c, 1, 1), f32(rng, k), f32(rng, k)
    z, zs, zb = f32(rng, n, k, h, w_), f32(rng, k), f32(rng, k)
    y = np.zeros((n, k, h, w_), np.float32)
    settings = dict(XDESC=tdesc(x.shape), XDATA_PLACEHOLDER=ELEM, CONV_DESC=conv_desc(0, 1), WDESC=filt(w.shape),
                    WDATA_PLACEHOLDER=ELEM, BN_EQSCALEBIAS_DESC=tdesc((1, k, 1, 1)), BN_EQSCALE_PLACEHOLDER=ELEM,
                    BN_EQBIAS_PLACEHOLDER=ELEM, ACTIVATION_DESC=act(), YDESC=tdesc(y.shape), YDATA_PLACEHOLDER=ELEM)
    pointers = dict(XDATA=x, WDATA=w, BN_EQSCALE=s, BN_EQBIAS=b, YDATA=y)
    zterm = 0.0
    if z_terms != "none":
        settings.update(ZDESC=tdesc(z.shape), ZDATA_PLACEHOLDER=ELEM)
        pointers["ZDATA"] = z
        zterm = z.astype(np.float64)
    if z_terms == "z_scale_bias":
        settings.update(BN_Z_EQSCALEBIAS_DESC=tdesc((1, k, 1, 1)), BN_Z_EQSCALE_PLACEHOLDER=ELEM,
                        BN_Z_EQBIAS_PLACEHOLDER=ELEM)
        pointers.update(BN_Z_EQSCALE=zs, BN_Z_EQBIAS=zb)
        zterm = z * pc(zs) + pc(zb)
    execute(handle, cc.CUDNN_FUSED_CONV_SCALE_BIAS_ADD_ACTIVATION, settings, pointers)
    want = np.maximum(pc(s) * conv2d(x.astype(np.float64), w.astype(np.float64), 0, 1) + pc(b) + zterm, 0)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def _bn_forward(x, scale, bias, eps):
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    return scale * (x - mean) / np.sqrt(var + eps) + bias


def test_generic_add_relu_then_dactivation_fork_dbatchnorm(handle, rng):
    """Op 5 writes y and the ReLU mask; op 6 reads the mask, forks dz and back-propagates through
    batch norm (checked against finite differences of a batch-norm forward written here)."""
    n, c, h, w_ = 3, 2, 2, 3
    shape, ps = (n, c, h, w_), (1, c, 1, 1)
    x, z = rng.standard_normal(shape), rng.standard_normal(shape)
    s, b, zs, zb = (rng.standard_normal(ps) for _ in range(4))
    y = np.zeros(shape)
    mask = np.full(int(np.prod(shape)), 7, np.uint8)
    xd = tdesc(shape, cc.CUDNN_DATA_DOUBLE)
    pd = tdesc(ps, cc.CUDNN_DATA_DOUBLE)
    maskd = tdesc((int(np.prod(shape)), 1, 1, 1), cc.CUDNN_DATA_UINT8)
    execute(handle, cc.CUDNN_FUSED_SCALE_BIAS_ADD_ACTIVATION_GEN_BITMASK,
            dict(XDESC=xd, XDATA_PLACEHOLDER=ELEM, BN_EQSCALEBIAS_DESC=pd, BN_EQSCALE_PLACEHOLDER=ELEM,
                 BN_EQBIAS_PLACEHOLDER=ELEM, ZDESC=xd, ZDATA_PLACEHOLDER=ELEM, BN_Z_EQSCALEBIAS_DESC=pd,
                 BN_Z_EQSCALE_PLACEHOLDER=ELEM, BN_Z_EQBIAS_PLACEHOLDER=ELEM, ACTIVATION_DESC=act(), YDESC=xd,
                 YDATA_PLACEHOLDER=ELEM, ACTIVATION_BITMASK_DESC=maskd, ACTIVATION_BITMASK_PLACEHOLDER=ELEM),
            dict(XDATA=x, BN_EQSCALE=s, BN_EQBIAS=b, ZDATA=z, BN_Z_EQSCALE=zs, BN_Z_EQBIAS=zb, YDATA=y,
                 ACTIVATION_BITMASK=mask))
    pre = x * s + b + z * zs + zb
    np.testing.assert_allclose(y, np.maximum(pre, 0), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(mask.reshape(shape), (pre > 0).astype(np.uint8))

    # op 6 on a batch-norm input xb with the mask of op 5
    xb, scale, bias = rng.standard_normal(shape), rng.standard_normal(ps), rng.standard_normal(ps)
    dy, eps = rng.standard_normal(shape), 1e-3
    mean = xb.mean(axis=(0, 2, 3), keepdims=True)
    inv = 1 / np.sqrt(((xb - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True) + eps)
    dx, dz, ds, db = np.zeros(shape), np.zeros(shape), np.zeros(ps), np.zeros(ps)
    execute(handle, cc.CUDNN_FUSED_DACTIVATION_FORK_DBATCHNORM,
            dict(BN_MODE=SPATIAL, XDESC=xd, XDATA_PLACEHOLDER=ELEM, DYDESC=xd, DYDATA_PLACEHOLDER=ELEM, DXDESC=xd,
                 DXDATA_PLACEHOLDER=ELEM, DZDESC=xd, DZDATA_PLACEHOLDER=ELEM, BN_SCALEBIAS_MEANVAR_DESC=pd,
                 BN_SCALE_PLACEHOLDER=ELEM, BN_BIAS_PLACEHOLDER=ELEM, BN_SAVED_MEAN_PLACEHOLDER=ELEM,
                 BN_SAVED_INVSTD_PLACEHOLDER=ELEM, BN_DSCALE_PLACEHOLDER=ELEM, BN_DBIAS_PLACEHOLDER=ELEM,
                 ACTIVATION_DESC=act(), ACTIVATION_BITMASK_DESC=maskd, ACTIVATION_BITMASK_PLACEHOLDER=ELEM),
            dict(XDATA=xb, DYDATA=dy, DXDATA=dx, DZDATA=dz, BN_SCALE=scale, BN_BIAS=bias, BN_SAVED_MEAN=mean,
                 BN_SAVED_INVSTD=inv, BN_DSCALE=ds, BN_DBIAS=db, ACTIVATION_BITMASK=mask),
            dict(DOUBLE_BN_EPSILON=eps))
    g = dy * (pre > 0)
    np.testing.assert_allclose(dz, g, rtol=1e-12)

    def loss(xv, sv, bv):
        return float(np.sum(_bn_forward(xv, sv, bv, eps) * g))

    for arr, got, which in ((xb, dx, 0), (scale, ds, 1), (bias, db, 2)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(*arr.shape):
            args = [xb.copy(), scale.copy(), bias.copy()]
            args[which][idx] += 1e-6
            up = loss(*args)
            args[which][idx] -= 2e-6
            num[idx] = (up - loss(*args)) / 2e-6
        np.testing.assert_allclose(got, num, rtol=1e-5, atol=1e-6)


def test_generic_identity_activation_mask_is_ones_and_plain_add(handle, rng):
    shape = (2, 3, 2, 2)
    x, z = f32(rng, *shape), f32(rng, *shape)
    y, mask = np.zeros(shape, np.float32), np.zeros(24, np.uint8)
    xd = tdesc(shape)
    execute(handle, cc.CUDNN_FUSED_SCALE_BIAS_ADD_ACTIVATION_GEN_BITMASK,
            dict(XDESC=xd, XDATA_PLACEHOLDER=ELEM, ZDESC=xd, ZDATA_PLACEHOLDER=ELEM, YDESC=xd, YDATA_PLACEHOLDER=ELEM,
                 ACTIVATION_DESC=act(cc.CUDNN_ACTIVATION_IDENTITY), ACTIVATION_BITMASK_PLACEHOLDER=ELEM,
                 ACTIVATION_BITMASK_DESC=tdesc((6, 1, 1, 1), cc.CUDNN_DATA_INT32)),
            dict(XDATA=x, ZDATA=z, YDATA=y, ACTIVATION_BITMASK=mask))
    np.testing.assert_allclose(y, x.astype(np.float64) + z, rtol=1e-6)
    assert np.all(mask == 1)


# -- attributes --------------------------------------------------------------------------

def test_const_pack_attributes_copy_on_set_and_defaults():
    ops = cc.CUDNN_FUSED_SCALE_BIAS_ACTIVATION_CONV_BNSTATS
    cp = cc.cudnnCreateFusedOpsConstParamPack(ops)
    val, isnull = cc.cudnnGetFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_XDESC)
    assert isnull and val is None
    assert cc.getFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_BN_MODE) == (cc.CUDNN_BATCHNORM_PER_ACTIVATION, 0)
    assert cc.getFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_XDATA_PLACEHOLDER) == (NULL, 0)
    xd = tdesc((2, 3, 4, 5))
    cc.setFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_XDESC, xd)
    cc.setTensor4dDescriptor(xd, cc.CUDNN_TENSOR_NCHW, F32, 1, 1, 1, 1)  # the pack keeps its copy
    out = cc.cudnnCreateTensorDescriptor()
    got, isnull = cc.cudnnGetFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_XDESC, out)
    assert got is out and not isnull and tuple(cc.getTensorNdDescriptor(out)[2]) == (2, 3, 4, 5)
    placeholder = np.array(ALIGN16, np.int32)  # also as a host pointer to the enum (a ctypes pointer)
    cc.setFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_YDATA_PLACEHOLDER, ctypes.c_void_p(placeholder.ctypes.data))
    assert cc.getFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_YDATA_PLACEHOLDER)[0] == ALIGN16
    with pytest.raises(cc.CuDNNError) as e:  # a Python int is the value itself, never read as a pointer
        cc.setFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_YDATA_PLACEHOLDER, placeholder.ctypes.data)
    assert e.value.status == BAD
    assert cc.getFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_YDATA_PLACEHOLDER)[0] == ALIGN16
    cc.setFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_XDESC, None)
    assert cc.getFusedOpsConstParamPackAttribute(cp, cc.CUDNN_PARAM_XDESC)[1] == 1
    for label, value in ((99, 0), (cc.CUDNN_PARAM_XDATA_PLACEHOLDER, 5), (cc.CUDNN_PARAM_BN_MODE, 9),
                         (cc.CUDNN_PARAM_WDESC, xd)):  # rules: valid label, enum values, descriptor kind
        with pytest.raises(cc.CuDNNError) as e:
            cc.setFusedOpsConstParamPackAttribute(cp, label, value)
        assert e.value.status == BAD
    cc.cudnnDestroyFusedOpsConstParamPack(cp)


def test_variant_pack_attributes():
    vp = cc.cudnnCreateFusedOpsVariantParamPack(cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_TRAINING)
    assert cc.getFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_PTR_YSUM) is None
    assert cc.getFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_DOUBLE_BN_EPSILON) == 0.0
    buf = np.zeros(3, np.float32)
    cc.setFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_PTR_YSUM, buf)
    assert cc.getFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_PTR_YSUM) is buf
    eps = np.array(2.5e-3)  # a host pointer to a double (a ctypes pointer: Python numbers are values)
    cc.setFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_DOUBLE_BN_EPSILON, ctypes.c_void_p(eps.ctypes.data))
    assert cc.getFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_DOUBLE_BN_EPSILON) == 2.5e-3
    cc.setFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT, 1 << 40)
    assert cc.getFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT) == 1 << 40
    for label, value in ((77, 0), (cc.CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES, -1),
                         (cc.CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT, 1.5)):
        with pytest.raises(cc.CuDNNError) as e:
            cc.setFusedOpsVariantParamPackAttribute(vp, label, value)
        assert e.value.status == BAD
    cc.cudnnDestroyFusedOpsVariantParamPack(vp)


# -- error rules -------------------------------------------------------------------------

def test_create_errors():
    with pytest.raises(cc.CuDNNError) as e:  # rule: unsupported ops -> NOT_SUPPORTED
        cc.cudnnCreateFusedOpsConstParamPack(42)
    assert e.value.status == UNSUP
    for fn in (cc.cudnnCreateFusedOpsPlan, cc.cudnnCreateFusedOpsVariantParamPack):  # rule: invalid ops
        with pytest.raises(cc.CuDNNError) as e:
            fn(42)
        assert e.value.status == BAD
    cc.cudnnDestroyFusedOpsPlan(None)  # NULL plan: success


def _inference_setup(c=2):
    pd = tdesc((1, c, 1, 1))
    return dict(BN_MODE=SPATIAL, BN_SCALEBIAS_MEANVAR_DESC=pd, BN_SCALE_PLACEHOLDER=ELEM, BN_BIAS_PLACEHOLDER=ELEM,
                BN_RUNNING_MEAN_PLACEHOLDER=ELEM, BN_RUNNING_VAR_PLACEHOLDER=ELEM, BN_EQSCALEBIAS_DESC=pd,
                BN_EQSCALE_PLACEHOLDER=ALIGN16)


@pytest.mark.parametrize("change,status,arg", [
    (dict(BN_MODE=cc.CUDNN_BATCHNORM_PER_ACTIVATION), UNSUP, "BN_MODE"),        # rule: per-channel modes only
    (dict(BN_SCALE_PLACEHOLDER=NULL), BAD, "BN_SCALE_PLACEHOLDER"),             # rule: required pointer
    (dict(BN_SCALEBIAS_MEANVAR_DESC=None), BAD, "BN_SCALEBIAS_MEANVAR_DESC"),   # rule: required descriptor
    (dict(BN_EQSCALEBIAS_DESC="wrong"), BAD, "BN_EQSCALEBIAS_DESC"),            # rule: shapes per channel
])
def test_make_errors(handle, change, status, arg):
    settings = {**_inference_setup(), **change}
    if settings.get("BN_EQSCALEBIAS_DESC") == "wrong":
        settings["BN_EQSCALEBIAS_DESC"] = tdesc((1, 3, 1, 1))
    cp = const_pack(cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE, settings)
    plan = cc.cudnnCreateFusedOpsPlan(cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnMakeFusedOpsPlan(handle, plan, cp)
    assert e.value.status == status and arg in str(e.value), str(e.value)


def test_make_rejects_other_activations_and_mismatched_patterns(handle):
    cp = const_pack(cc.CUDNN_FUSED_SCALE_BIAS_ADD_ACTIVATION_GEN_BITMASK,
                    dict(XDESC=tdesc((1, 2, 2, 2)), XDATA_PLACEHOLDER=ELEM, YDESC=tdesc((1, 2, 2, 2)),
                         YDATA_PLACEHOLDER=ELEM, ACTIVATION_DESC=act(cc.CUDNN_ACTIVATION_TANH)))
    with pytest.raises(cc.CuDNNError) as e:  # rule: RELU or IDENTITY only
        cc.cudnnMakeFusedOpsPlan(handle, cc.cudnnCreateFusedOpsPlan(cc.CUDNN_FUSED_SCALE_BIAS_ADD_ACTIVATION_GEN_BITMASK), cp)
    assert e.value.status == UNSUP and "ACTIVATION_DESC" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # rule: the plan and the pack are for one pattern
        cc.cudnnMakeFusedOpsPlan(handle, cc.cudnnCreateFusedOpsPlan(cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE), cp)
    assert e.value.status == BAD


def test_bitmask_too_small_is_not_supported(handle):
    xd = tdesc((2, 32, 2, 2))
    cp = const_pack(cc.CUDNN_FUSED_SCALE_BIAS_ADD_ACTIVATION_GEN_BITMASK,
                    dict(XDESC=xd, XDATA_PLACEHOLDER=ELEM, YDESC=xd, YDATA_PLACEHOLDER=ELEM, ACTIVATION_DESC=act(),
                         ACTIVATION_BITMASK_DESC=tdesc((8, 1, 1, 1), cc.CUDNN_DATA_INT32),  # cuDNN's 1 bit/element
                         ACTIVATION_BITMASK_PLACEHOLDER=ELEM))
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnMakeFusedOpsPlan(handle, cc.cudnnCreateFusedOpsPlan(cc.CUDNN_FUSED_SCALE_BIAS_ADD_ACTIVATION_GEN_BITMASK), cp)
    assert e.value.status == UNSUP and "byte per element" in str(e.value)


def test_execute_errors_write_nothing(handle):
    ops = cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE
    cp = const_pack(ops, _inference_setup())
    plan = cc.cudnnCreateFusedOpsPlan(ops)
    vp = cc.cudnnCreateFusedOpsVariantParamPack(ops)
    with pytest.raises(cc.CuDNNError) as e:  # rule: the plan must be made first
        cc.cudnnFusedOpsExecute(handle, plan, vp)
    assert e.value.status == BAD and "plan" in str(e.value)
    cc.cudnnMakeFusedOpsPlan(handle, plan, cp)
    ones = [np.ones(2, np.float32) for _ in range(4)]
    raw = _aligned16(8)
    es = raw[1:3]  # 4 bytes past a 16-byte boundary
    for label, v in zip(("BN_SCALE", "BN_BIAS", "BN_RUNNING_MEAN", "BN_RUNNING_VAR"), ones):
        cc.setFusedOpsVariantParamPackAttribute(vp, getattr(cc, "CUDNN_PTR_" + label), v)
    cc.setFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_DOUBLE_BN_EPSILON, 1e-5)

    def expect(label, status=BAD):
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnFusedOpsExecute(handle, plan, vp)
        assert e.value.status == status and label in str(e.value), str(e.value)

    expect("CUDNN_PTR_BN_EQSCALE")  # rule: placeholder promised a pointer, NULL given
    cc.setFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_PTR_BN_EQSCALE, es)
    expect("CUDNN_PTR_BN_EQSCALE")  # rule: 16-byte alignment as promised
    cc.setFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_PTR_BN_EQSCALE, raw[4:6])
    cc.setFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_PTR_BN_EQBIAS, np.zeros(2, np.float32))
    expect("CUDNN_PTR_BN_EQBIAS")  # rule: CUDNN_PTR_NULL placeholder means a NULL pointer
    cc.setFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_PTR_BN_EQBIAS, None)
    cc.setFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_DOUBLE_BN_EPSILON, -1.0)
    expect("EPSILON")  # rule: epsilon >= CUDNN_BN_MIN_EPSILON
    assert np.all(raw == 0)
    other = cc.cudnnCreateFusedOpsVariantParamPack(cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_TRAINING)
    with pytest.raises(cc.CuDNNError) as e:  # rule: variant pack of the plan's pattern
        cc.cudnnFusedOpsExecute(handle, plan, other)
    assert e.value.status == BAD


def _aligned16(n):
    buf = np.zeros(n + 4, np.float32)
    off = (-buf.ctypes.data % 16) // 4
    return buf[off:off + n]


def test_repeated_execute_is_a_cache_hit(handle, rng):
    c = 2
    settings = _inference_setup(c)
    settings["BN_EQSCALE_PLACEHOLDER"] = ELEM
    ptrs = dict(BN_SCALE=np.ones(c, np.float32), BN_BIAS=np.ones(c, np.float32), BN_RUNNING_MEAN=np.ones(c, np.float32),
                BN_RUNNING_VAR=np.full(c, 3, np.float32), BN_EQSCALE=np.zeros(c, np.float32))
    execute(handle, cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE, settings, ptrs, dict(DOUBLE_BN_EPSILON=1.0))
    before = cc.plan_cache_info()
    execute(handle, cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE, settings, ptrs, dict(DOUBLE_BN_EPSILON=1.0))
    after = cc.plan_cache_info()
    assert after.misses == before.misses
    np.testing.assert_allclose(ptrs["BN_EQSCALE"], 0.5)


@pytest.mark.gpu
def test_gpu_conv_bnstats_and_finalize_match_the_formulas(rng):
    import cupy
    g = cc.cudnnCreate("gpu")
    try:
        n, c, h, w_, k = 2, 4, 6, 5, 8
        x, w, s, b = f32(rng, n, c, h, w_), f32(rng, k, c, 3, 3), f32(rng, c), f32(rng, c)
        y, ysum, ysq = cupy.zeros((n, k, h, w_), cupy.float32), cupy.zeros(k, cupy.float32), cupy.zeros(k, cupy.float32)
        execute(g, cc.CUDNN_FUSED_SCALE_BIAS_ACTIVATION_CONV_BNSTATS,
                dict(XDESC=tdesc(x.shape), XDATA_PLACEHOLDER=ALIGN16, BN_MODE=SPATIAL, CONV_DESC=conv_desc(1, 1),
                     WDESC=filt(w.shape), WDATA_PLACEHOLDER=ELEM, YDESC=tdesc(y.shape), YDATA_PLACEHOLDER=ELEM,
                     BN_EQSCALEBIAS_DESC=tdesc((1, c, 1, 1)), BN_EQSCALE_PLACEHOLDER=ELEM, BN_EQBIAS_PLACEHOLDER=ELEM,
                     ACTIVATION_DESC=act(), YSTATS_DESC=tdesc((1, k, 1, 1)), YSUM_PLACEHOLDER=ELEM,
                     YSQSUM_PLACEHOLDER=ELEM),
                dict(XDATA=cupy.asarray(x), WDATA=cupy.asarray(w), YDATA=y, BN_EQSCALE=cupy.asarray(s),
                     BN_EQBIAS=cupy.asarray(b), YSUM=ysum, YSQSUM=ysq))
        want = conv2d(np.maximum(x.astype(np.float64) * pc(s) + pc(b), 0), w.astype(np.float64), 1, 1)
        np.testing.assert_allclose(cupy.asnumpy(y), want, rtol=2e-3, atol=2e-3)  # TF32 tolerance
        np.testing.assert_allclose(cupy.asnumpy(ysum), want.sum(axis=(0, 2, 3)), rtol=2e-3, atol=2e-2)
        np.testing.assert_allclose(cupy.asnumpy(ysq), (want ** 2).sum(axis=(0, 2, 3)), rtol=2e-3, atol=2e-2)
    finally:
        cc.cudnnDestroy(g)
