"""Activation descriptors, cudnnActivationForward/Backward against formulas written here
(002 §3.2.1, §3.2.6, §3.2.21, §3.2.37, §3.2.76, §4.1.1)."""
import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend.dtypes import bf16_to_f32, f32_to_bf16
from cudnn_compat import activation
from conftest import tdesc

SHAPE = (2, 3, 4, 5)
SWISH_BETA = 0.7
COEF = {cc.CUDNN_ACTIVATION_CLIPPED_RELU: 0.8, cc.CUDNN_ACTIVATION_ELU: 0.6}

# forward formulas, written independently of the library
FWD = {
    cc.CUDNN_ACTIVATION_SIGMOID: lambda x, c: 1.0 / (1.0 + np.exp(-x)),
    cc.CUDNN_ACTIVATION_RELU: lambda x, c: np.maximum(x, 0.0),
    cc.CUDNN_ACTIVATION_TANH: lambda x, c: np.tanh(x),
    cc.CUDNN_ACTIVATION_CLIPPED_RELU: lambda x, c: np.minimum(np.maximum(x, 0.0), c),
    cc.CUDNN_ACTIVATION_ELU: lambda x, c: np.where(x > 0, x, c * (np.exp(x) - 1.0)),
    cc.CUDNN_ACTIVATION_SWISH: lambda x, c: x / (1.0 + np.exp(-SWISH_BETA * x)),
}
MODES = list(FWD)
READS_Y = [cc.CUDNN_ACTIVATION_SIGMOID, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_ACTIVATION_TANH,
           cc.CUDNN_ACTIVATION_CLIPPED_RELU, cc.CUDNN_ACTIVATION_ELU]


def adesc(mode, nan=cc.CUDNN_NOT_PROPAGATE_NAN):
    d = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(d, mode, nan, COEF.get(mode, 0.0))
    if mode == cc.CUDNN_ACTIVATION_SWISH:
        cc.cudnnSetActivationDescriptorSwishBeta(d, SWISH_BETA)
    return d


def sample(rng, shape=SHAPE, avoid=()):
    """Values in [-3, 3] kept 0.05 away from the kinks in ``avoid``."""
    x = rng.uniform(-3, 3, shape)
    for k in avoid:
        x = np.where(np.abs(x - k) < 0.05, k + 0.1, x)
    return x


LAYOUTS = {
    "NCHW": lambda n, c, h, w: (c * h * w, h * w, w, 1),
    "NHWC": lambda n, c, h, w: (h * w * c, 1, w * c, c),
    "padded": lambda n, c, h, w: (c * h * (w + 2) + 3, h * (w + 2), w + 2, 1),
}


def strided(values, strides, dtype):
    """(flat buffer holding ``values`` at element ``strides``, logical view of it)."""
    size = 1 + sum((d - 1) * s for d, s in zip(values.shape, strides))
    buf = np.zeros(size, dtype)
    view = np.lib.stride_tricks.as_strided(buf, values.shape, [s * buf.itemsize for s in strides])
    view[...] = values
    return buf, view


# -- descriptors ------------------------------------------------------------------------

def test_descriptor_set_get_destroy():
    d = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(d, cc.CUDNN_ACTIVATION_CLIPPED_RELU, cc.CUDNN_PROPAGATE_NAN, 6.0)
    assert cc.cudnnGetActivationDescriptor(d) == (cc.CUDNN_ACTIVATION_CLIPPED_RELU, cc.CUDNN_PROPAGATE_NAN, 6.0)
    assert cc.getActivationDescriptorSwishBeta(d) == 1.0
    cc.setActivationDescriptorSwishBeta(d, 2.5)
    assert cc.cudnnGetActivationDescriptorSwishBeta(int(d)) == 2.5
    cc.destroyActivationDescriptor(int(d))
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetActivationDescriptor(d)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM


@pytest.mark.parametrize("args, arg", [((99, 0, 0.0), "mode"), ((1, 7, 0.0), "reluNanOpt"), ((1, 0, "x"), "coef")])
def test_set_descriptor_bad_param_keeps_settings(args, arg):
    d = adesc(cc.CUDNN_ACTIVATION_ELU)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetActivationDescriptor(d, *args)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and arg in str(e.value)
    assert cc.cudnnGetActivationDescriptor(d) == (cc.CUDNN_ACTIVATION_ELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.6)


def test_pointwise_attrs_mapping_for_other_families():
    d = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(d, cc.CUDNN_ACTIVATION_ELU, cc.CUDNN_PROPAGATE_NAN, 0.3)
    assert activation.pointwise_attrs(d) == {"mode": "ELU_FWD", "elu_alpha": 0.3, "nan_propagation": "PROPAGATE"}
    assert activation.backward_attrs(int(d)) == ({"mode": "ELU_BWD_Y", "elu_alpha": 0.3, "nan_propagation": "PROPAGATE"}, "y")
    cc.cudnnSetActivationDescriptor(d, cc.CUDNN_ACTIVATION_CLIPPED_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 6.0)
    assert activation.pointwise_attrs(d) == {"mode": "RELU_FWD", "relu_lower_clip": 0.0, "relu_upper_clip": 6.0,
                                             "nan_propagation": "NOT_PROPAGATE"}
    assert activation.backward_attrs(d, "float16")[0]["relu_upper_clip"] == float(np.float16(6.0))
    cc.cudnnSetActivationDescriptor(d, cc.CUDNN_ACTIVATION_CLIPPED_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.8)
    assert activation.backward_attrs(d, "float16")[0]["relu_upper_clip"] == float(np.float16(0.8)) < 0.8
    cc.cudnnSetActivationDescriptor(d, cc.CUDNN_ACTIVATION_IDENTITY, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    assert activation.pointwise_attrs(d)["mode"] == "IDENTITY"
    with pytest.raises(cc.CuDNNError):
        activation.backward_attrs(d)


# -- forward ----------------------------------------------------------------------------

@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("mode", MODES)
def test_forward_matches_formula(handle, rng, mode, beta):
    x = sample(rng).astype(np.float32)
    y0 = rng.standard_normal(SHAPE).astype(np.float32)
    y = np.full(SHAPE, np.nan, np.float32) if beta == 0 else y0.copy()
    d = tdesc(SHAPE)
    cc.cudnnActivationForward(handle, adesc(mode), 1.5, d, x, beta, d, y)
    want = 1.5 * FWD[mode](x.astype(np.float64), COEF.get(mode)) + (beta * y0 if beta else 0.0)
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("layout", ["NHWC", "padded"])
@pytest.mark.parametrize("mode", [cc.CUDNN_ACTIVATION_ELU, cc.CUDNN_ACTIVATION_TANH])
def test_forward_layouts(handle, rng, mode, layout):
    x = sample(rng)
    xs, ys = LAYOUTS[layout](*SHAPE), LAYOUTS["NHWC" if layout == "padded" else "NCHW"](*SHAPE)
    xbuf, _ = strided(x, xs, np.float64)
    ybuf, yview = strided(np.full(SHAPE, np.nan), ys, np.float64)
    cc.activationForward_v4(handle, adesc(mode), 1.0, tdesc(SHAPE, cc.CUDNN_DATA_DOUBLE, strides=xs), xbuf, 0.0,
                            tdesc(SHAPE, cc.CUDNN_DATA_DOUBLE, strides=ys), ybuf)
    np.testing.assert_allclose(yview, FWD[mode](x, COEF.get(mode)), rtol=1e-13, atol=1e-13)


def test_forward_in_place(handle, rng):
    x = sample(rng)
    buf = x.copy()
    d = tdesc(SHAPE, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_TENSOR_NHWC)
    cc.cudnnActivationForward(handle, adesc(cc.CUDNN_ACTIVATION_SIGMOID), 1.0, d, buf, 0.0, d, buf)
    np.testing.assert_allclose(buf, 1 / (1 + np.exp(-x)), rtol=1e-14)


@pytest.mark.parametrize("mode, want_prop, want_not", [
    (cc.CUDNN_ACTIVATION_RELU, [np.nan, 0.0, 2.0], [0.0, 0.0, 2.0]),
    (cc.CUDNN_ACTIVATION_CLIPPED_RELU, [np.nan, 0.0, 0.8], [0.0, 0.0, 0.8]),
])
def test_nan_propagation_option(handle, mode, want_prop, want_not):
    d = tdesc((1, 3, 1, 1))
    x = np.array([np.nan, -1.0, 2.0], np.float32)
    for nan, want in ((cc.CUDNN_PROPAGATE_NAN, want_prop), (cc.CUDNN_NOT_PROPAGATE_NAN, want_not)):
        y = np.zeros(3, np.float32)
        cc.cudnnActivationForward(handle, adesc(mode, nan), 1.0, d, x, 0.0, d, y)
        np.testing.assert_array_equal(y, np.array(want, np.float32))


@pytest.mark.parametrize("mode", MODES)
def test_forward_half_and_bfloat16(handle, rng, mode):
    x = sample(rng).astype(np.float32)
    xh = x.astype(np.float16)
    yh = np.full(SHAPE, np.nan, np.float16)
    cc.cudnnActivationForward(handle, adesc(mode), 1.0, tdesc(SHAPE, cc.CUDNN_DATA_HALF), xh, 0.0,
                              tdesc(SHAPE, cc.CUDNN_DATA_HALF), yh)
    np.testing.assert_allclose(yh, FWD[mode](xh.astype(np.float64), COEF.get(mode)), rtol=1e-3, atol=1e-3)
    xb = f32_to_bf16(x)
    yb = np.zeros(SHAPE, np.uint16)
    d = tdesc(SHAPE, cc.CUDNN_DATA_BFLOAT16)
    cc.cudnnActivationForward(handle, adesc(mode), 1.0, d, xb, 0.0, d, yb)
    want = FWD[mode](bf16_to_f32(xb).astype(np.float64), COEF.get(mode))
    np.testing.assert_allclose(bf16_to_f32(yb), want, rtol=8e-3, atol=8e-3)


def test_forward_int8_rounds_and_saturates(handle):
    x = np.arange(-8, 8, dtype=np.int8)
    x[-2:] = [-128, 120]
    d = tdesc((1, 1, 4, 4), cc.CUDNN_DATA_INT8)
    for mode, f in ((cc.CUDNN_ACTIVATION_RELU, lambda v: np.maximum(v, 0)),
                    (cc.CUDNN_ACTIVATION_SIGMOID, lambda v: 1 / (1 + np.exp(-v)))):
        y = np.zeros(16, np.int8)
        cc.cudnnActivationForward(handle, adesc(mode), 2.5, d, x, 0.0, d, y)
        np.testing.assert_array_equal(y, np.clip(np.rint(2.5 * f(x.astype(np.float64))), -128, 127))


# -- backward ---------------------------------------------------------------------------

def _kinks(mode):
    return {cc.CUDNN_ACTIVATION_RELU: (0.0,), cc.CUDNN_ACTIVATION_CLIPPED_RELU: (0.0, 0.8),
            cc.CUDNN_ACTIVATION_ELU: (0.0,)}.get(mode, ())


@pytest.mark.parametrize("mode", MODES)
def test_backward_matches_finite_differences(handle, rng, mode):
    """dx == d/dx sum(act(x) * dy), central differences in float64 (act is elementwise)."""
    x, dy = sample(rng, avoid=_kinks(mode)), rng.standard_normal(SHAPE)
    f = FWD[mode]
    y = f(x, COEF.get(mode))
    dx = np.full(SHAPE, np.nan)
    d = tdesc(SHAPE, cc.CUDNN_DATA_DOUBLE)
    cc.cudnnActivationBackward(handle, adesc(mode), 1.0, d, y, d, dy, d, x, 0.0, d, dx)
    h = 1e-6
    fd = (f(x + h, COEF.get(mode)) - f(x - h, COEF.get(mode))) / (2 * h) * dy
    np.testing.assert_allclose(dx, fd, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
def test_backward_reads_y_except_swish(handle, rng, mode):
    """RELU, CLIPPED_RELU, SIGMOID, TANH, ELU read y (x may be NULL); SWISH reads x (y may be NULL)."""
    x, dy = sample(rng, avoid=_kinks(mode)), rng.standard_normal(SHAPE)
    y = FWD[mode](x, COEF.get(mode))
    d = tdesc(SHAPE, cc.CUDNN_DATA_DOUBLE)
    full, partial = np.zeros(SHAPE), np.zeros(SHAPE)
    cc.cudnnActivationBackward(handle, adesc(mode), 1.0, d, y, d, dy, d, x, 0.0, d, full)
    reads_y = mode in READS_Y
    cc.cudnnActivationBackward(handle, adesc(mode), 1.0, d, y if reads_y else None, d, dy, d,
                               None if reads_y else x, 0.0, d, partial)
    np.testing.assert_array_equal(partial, full)


@pytest.mark.parametrize("layout", ["NHWC", "padded"])
def test_backward_blend_and_layouts(handle, rng, layout):
    mode = cc.CUDNN_ACTIVATION_TANH
    x, dy, dx0 = sample(rng), rng.standard_normal(SHAPE), rng.standard_normal(SHAPE)
    y = np.tanh(x)
    s1, s2 = LAYOUTS[layout](*SHAPE), LAYOUTS["NCHW"](*SHAPE)
    ybuf, _ = strided(y, s1, np.float32)
    dybuf, _ = strided(dy, s1, np.float32)
    dxbuf, dxview = strided(dx0, s2, np.float32)
    d1, d2 = tdesc(SHAPE, strides=s1), tdesc(SHAPE, strides=s2)
    cc.activationBackward_v4(handle, adesc(mode), 2.0, d1, ybuf, d1, dybuf, d2, np.zeros(dxbuf.size, np.float32),
                             -0.5, d2, dxbuf)
    y32, dy32 = y.astype(np.float32).astype(np.float64), dy.astype(np.float32).astype(np.float64)
    want = 2.0 * dy32 * (1 - y32 ** 2) - 0.5 * dx0.astype(np.float32)
    np.testing.assert_allclose(dxview, want, rtol=1e-5, atol=1e-5)


def test_backward_beta_zero_never_reads_dx_and_in_place(handle, rng):
    x, dy = sample(rng, avoid=(0.0,)), rng.standard_normal(SHAPE)
    y = np.maximum(x, 0)
    d = tdesc(SHAPE, cc.CUDNN_DATA_DOUBLE)
    buf = dy.copy()  # dy == dx, in place
    cc.cudnnActivationBackward(handle, adesc(cc.CUDNN_ACTIVATION_RELU), 1.0, d, y, d, buf, d, x, 0.0, d, buf)
    np.testing.assert_array_equal(buf, np.where(x > 0, dy, 0.0))
    dx = np.full(SHAPE, np.nan)
    cc.cudnnActivationBackward(handle, adesc(cc.CUDNN_ACTIVATION_RELU), 1.0, d, y, d, dy, d, x, 0.0, d, dx)
    assert not np.isnan(dx).any()


@pytest.mark.parametrize("mode", MODES)
def test_backward_half(handle, rng, mode):
    x = sample(rng, avoid=_kinks(mode)).astype(np.float16)
    dy = rng.standard_normal(SHAPE).astype(np.float16)
    x64 = x.astype(np.float64)
    f = FWD[mode]
    y = f(x64, COEF.get(mode)).astype(np.float16)
    dx = np.zeros(SHAPE, np.float16)
    d = tdesc(SHAPE, cc.CUDNN_DATA_HALF)
    cc.cudnnActivationBackward(handle, adesc(mode), 1.0, d, y, d, dy, d, x, 0.0, d, dx)
    h = 1e-6
    want = (f(x64 + h, COEF.get(mode)) - f(x64 - h, COEF.get(mode))) / (2 * h) * dy
    np.testing.assert_allclose(dx, want, rtol=1e-2, atol=1e-2)


def test_repeated_call_is_a_cache_hit(handle, rng):
    d, a = tdesc(SHAPE), adesc(cc.CUDNN_ACTIVATION_SIGMOID)
    x, y = rng.standard_normal(SHAPE).astype(np.float32), np.zeros(SHAPE, np.float32)
    cc.cudnnActivationForward(handle, a, 1.0, d, x, 0.0, d, y)
    before = cc.plan_cache_info()
    cc.cudnnActivationForward(handle, a, 1.0, d, -x, 0.0, d, y)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    np.testing.assert_allclose(y, 1 / (1 + np.exp(x.astype(np.float64))), rtol=1e-6)


# -- errors -----------------------------------------------------------------------------

def _forward_error(handle, a, xd, x, yd, y, status, arg):
    y0 = y.copy()
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnActivationForward(handle, a, 1.0, xd, x, 0.0, yd, y)
    assert e.value.status == status and arg in str(e.value)
    np.testing.assert_array_equal(y, y0)


def test_forward_errors_write_nothing(handle):
    x, y = np.ones(120, np.float32), np.full(120, 7.0, np.float32)
    d = tdesc(SHAPE)
    relu = adesc(cc.CUDNN_ACTIVATION_RELU)
    ident = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ident, cc.CUDNN_ACTIVATION_IDENTITY, 0, 0.0)
    BAD, NS = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
    _forward_error(handle, ident, d, x, d, y, BAD, "activationDesc")  # IDENTITY is ConvBiasAct-only
    _forward_error(handle, cc.cudnnCreateActivationDescriptor(), d, x, d, y, BAD, "activationDesc")  # never set
    _forward_error(handle, relu, d, x, tdesc((2, 3, 4, 4)), y, BAD, "yDesc")  # dims differ
    _forward_error(handle, relu, d, x, tdesc(SHAPE, cc.CUDNN_DATA_HALF), y, BAD, "yDesc")  # data type differs
    _forward_error(handle, relu, d, y, tdesc(SHAPE, fmt=cc.CUDNN_TENSOR_NHWC), y, BAD, "yDesc")  # in place, strides
    i32 = tdesc(SHAPE, cc.CUDNN_DATA_INT32)
    _forward_error(handle, relu, i32, x, i32, y, NS, "xDesc")  # data type not supported
    d6 = tdesc((1, 2, 1, 1, 2, 3), strides=(12, 1, 12, 12, 6, 2))
    _forward_error(handle, relu, d6, x, d6, y, NS, "xDesc")  # > 5 dims not spatially packed
    _forward_error(handle, relu, d, x, d, np.full(10, 7.0, np.float32), BAD, "y")  # buffer too small


def test_backward_errors_write_nothing(handle):
    BAD, NS = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
    a = adesc(cc.CUDNN_ACTIVATION_TANH)
    ident = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ident, cc.CUDNN_ACTIVATION_IDENTITY, 0, 0.0)
    d, nhwc = tdesc(SHAPE), tdesc(SHAPE, fmt=cc.CUDNN_TENSOR_NHWC)
    v = np.ones(120, np.float32)
    dx = np.full(120, 3.0, np.float32)

    def err(act, yd, dyd, xd, dxd, status, arg, dy=v, out=dx):
        before = out.copy()
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnActivationBackward(handle, act, 1.0, yd, v, dyd, dy, xd, v, 0.0, dxd, out)
        assert e.value.status == status and arg in str(e.value)
        np.testing.assert_array_equal(out, before)

    err(ident, d, d, d, d, BAD, "activationDesc")
    err(a, d, nhwc, nhwc, nhwc, NS, "dyDesc")  # y/dy strides differ
    err(a, d, d, d, nhwc, NS, "dxDesc")  # x/dx strides differ
    err(a, d, d, d, tdesc((2, 3, 4, 4)), NS, "dxDesc")  # dims differ
    err(a, d, tdesc(SHAPE, cc.CUDNN_DATA_DOUBLE), d, d, NS, "dyDesc")  # data types differ
    i8 = tdesc(SHAPE, cc.CUDNN_DATA_INT8)
    err(a, i8, i8, i8, i8, NS, "yDesc")  # INT8 backward not supported
    # in place (dy == dx) with other strides: y/dy and x/dx agree, dy/dx do not
    err(a, nhwc, nhwc, d, d, BAD, "dxDesc", dy=dx, out=dx)
