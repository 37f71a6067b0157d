"""LRN descriptors, cudnnLRNCrossChannelForward/Backward and cudnnDivisiveNormalizationForward/
Backward against formulas written here (002 §3.2.11, §3.2.26, §3.2.33, §3.2.48, §3.2.65,
§3.2.83, §4.1.6, §4.1.14)."""
import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend.dtypes import bf16_to_f32, f32_to_bf16
from conftest import tdesc

BAD, NS = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
DIM1, MEANS = cc.CUDNN_LRN_CROSS_CHANNEL_DIM1, cc.CUDNN_DIVNORM_PRECOMPUTED_MEANS
F64 = cc.CUDNN_DATA_DOUBLE


def window(p, size, n):
    """The clipped window [p - floor((n-1)/2), p + n - floor((n-1)/2) - 1] as a slice."""
    behind = (n - 1) // 2
    return slice(max(0, p - behind), min(size, p + n - behind))


def lrn_ref(x, n, alpha, beta, k):
    y = np.empty_like(x)
    for c in range(x.shape[1]):
        s = (x[:, window(c, x.shape[1], n)] ** 2).sum(axis=1)
        y[:, c] = x[:, c] / (k + alpha / n * s) ** beta
    return y


def divnorm_ref(x, m, n, alpha, beta, k):
    """y_i = x_i / (k + alpha/n^d * sum_{j in the spatial window of i} (x_j - m_i)^2)^beta."""
    sp = x.shape[2:]
    y = np.empty_like(x)
    for p in np.ndindex(*sp):
        at = (slice(None), slice(None)) + p
        block = x[(slice(None), slice(None)) + tuple(window(q, s, n) for q, s in zip(p, sp))]
        dev = block - m[at].reshape(m[at].shape + (1,) * len(sp))
        s = (dev ** 2).reshape(x.shape[0], x.shape[1], -1).sum(axis=-1)
        y[at] = x[at] / (k + alpha / n ** len(sp) * s) ** beta
    return y


def ldesc(n, alpha, beta, k):
    d = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(d, n, alpha, beta, k)
    return d


def strided(values, strides, dtype):
    size = 1 + sum((d - 1) * s for d, s in zip(values.shape, strides))
    buf = np.zeros(size, dtype)
    view = np.lib.stride_tricks.as_strided(buf, values.shape, [s * buf.itemsize for s in strides])
    view[...] = values
    return buf, view


def central_differences(loss, a, h=1e-6):
    g = np.empty_like(a)
    for i in np.ndindex(*a.shape):
        ap, am = a.copy(), a.copy()
        ap[i] += h
        am[i] -= h
        g[i] = (loss(ap) - loss(am)) / (2 * h)
    return g


# -- descriptor ------------------------------------------------------------------------

def test_descriptor_defaults_set_get_destroy():
    d = cc.cudnnCreateLRNDescriptor()
    assert cc.cudnnGetLRNDescriptor(d) == (5, 1e-4, 0.75, 2.0)
    cc.setLRNDescriptor(int(d), np.uint32(16), 3, 0.01, 1e-5)
    assert cc.getLRNDescriptor(d) == (16, 3.0, 0.01, 1e-5)
    cc.cudnnDestroyLRNDescriptor(d)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetLRNDescriptor(d)
    assert e.value.status == BAD


@pytest.mark.parametrize("args", [(0, 1e-4, 0.75, 2.0), (17, 1e-4, 0.75, 2.0), (5, 1e-4, 0.75, 9e-6),
                                  (5, 1e-4, 0.009, 2.0), (5, float("nan"), 0.75, 2.0), (2.5, 1e-4, 0.75, 2.0)])
def test_set_descriptor_range_is_bad_param(args):
    d = ldesc(3, 0.5, 1.0, 1.5)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetLRNDescriptor(d, *args)
    assert e.value.status == BAD
    assert cc.cudnnGetLRNDescriptor(d) == (3, 0.5, 1.0, 1.5)


# -- LRN ----------------------------------------------------------------------------------

@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_lrn_forward_matches_formula(handle, rng, n, beta):
    shape = (2, 6, 3, 4)
    x, y0 = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    y = np.full(shape, np.nan, np.float32) if beta == 0 else y0.copy()
    d = tdesc(shape)
    cc.cudnnLRNCrossChannelForward(handle, ldesc(n, 2.0, 0.75, 1.5), DIM1, 1.5, d, x, beta, d, y)
    want = 1.5 * lrn_ref(x.astype(np.float64), n, 2.0, 0.75, 1.5) + (beta * y0 if beta else 0)
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("shape, xs, ys", [
    ((2, 5, 3, 2), (30, 1, 10, 5), (30, 6, 2, 1)),  # NHWC in, NCHW out
    ((2, 5, 3, 2), (40, 8, 2, 1), (30, 1, 10, 5)),  # padded NCHW in, NHWC out
    ((2, 4, 2, 3, 2), (50, 12, 6, 2, 1), (48, 12, 6, 2, 1)),  # 5-d NCDHW, DHW packed
])
def test_lrn_forward_layouts(handle, rng, shape, xs, ys):
    x = rng.standard_normal(shape)
    xb, _ = strided(x, xs, np.float64)
    yb, yv = strided(np.full(shape, np.nan), ys, np.float64)
    cc.LRNCrossChannelForward(handle, ldesc(3, 1.0, 0.6, 1.0), DIM1, 1.0, tdesc(shape, F64, strides=xs), xb, 0.0,
                              tdesc(shape, F64, strides=ys), yb)
    np.testing.assert_allclose(yv, lrn_ref(x, 3, 1.0, 0.6, 1.0), rtol=1e-13)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_lrn_backward_matches_finite_differences(handle, rng, n):
    shape = (2, 5, 2, 2)
    x, dy, dx0 = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape)
    args = (n, 1.5, 0.75, 1.0)
    y = lrn_ref(x, *args)
    d = tdesc(shape, F64)
    dx = dx0.copy()
    cc.cudnnLRNCrossChannelBackward(handle, ldesc(*args), DIM1, 2.0, d, y, d, dy, d, x, -1.0, d, dx)
    fd = central_differences(lambda a: np.sum(lrn_ref(a, *args) * dy), x)
    np.testing.assert_allclose(dx, 2.0 * fd - dx0, rtol=1e-6, atol=1e-8)
    dx = np.full(shape, np.nan)
    cc.cudnnLRNCrossChannelBackward(handle, ldesc(*args), DIM1, 1.0, d, y, d, dy, d, x, 0.0, d, dx)
    np.testing.assert_allclose(dx, fd, rtol=1e-6, atol=1e-8)


def test_lrn_half_and_bfloat16(handle, rng):
    shape = (1, 7, 2, 3)
    x = rng.standard_normal(shape).astype(np.float16)
    y = np.zeros(shape, np.float16)
    d = tdesc(shape, cc.CUDNN_DATA_HALF)
    cc.cudnnLRNCrossChannelForward(handle, ldesc(5, 1.0, 0.75, 2.0), DIM1, 1.0, d, x, 0.0, d, y)
    np.testing.assert_allclose(y, lrn_ref(x.astype(np.float64), 5, 1.0, 0.75, 2.0), rtol=2e-3, atol=2e-3)
    xb, yb = f32_to_bf16(x.astype(np.float32)), np.zeros(shape, np.uint16)
    d = tdesc(shape, cc.CUDNN_DATA_BFLOAT16)
    cc.cudnnLRNCrossChannelForward(handle, ldesc(5, 1.0, 0.75, 2.0), DIM1, 1.0, d, xb, 0.0, d, yb)
    want = lrn_ref(bf16_to_f32(xb).astype(np.float64), 5, 1.0, 0.75, 2.0)
    np.testing.assert_allclose(bf16_to_f32(yb), want, rtol=1e-2, atol=1e-2)


def test_lrn_repeated_call_is_a_cache_hit(handle, rng):
    shape = (1, 4, 2, 2)
    d, ld = tdesc(shape), cc.cudnnCreateLRNDescriptor()
    x, y = rng.standard_normal(shape).astype(np.float32), np.zeros(shape, np.float32)
    cc.cudnnLRNCrossChannelForward(handle, ld, DIM1, 1.0, d, x, 0.0, d, y)
    before = cc.plan_cache_info()
    cc.cudnnLRNCrossChannelForward(handle, ld, DIM1, 1.0, d, x, 0.0, d, y)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    np.testing.assert_allclose(y, lrn_ref(x.astype(np.float64), 5, 1e-4, 0.75, 2.0), rtol=1e-6)


def test_lrn_forward_errors_write_nothing(handle):
    shape = (2, 3, 2, 2)
    d, ld = tdesc(shape), cc.cudnnCreateLRNDescriptor()
    x, y = np.ones(48, np.float32), np.full(48, 7.0, np.float32)

    def err(xd, yd, status, arg, mode=DIM1, xx=x, desc=ld):
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnLRNCrossChannelForward(handle, desc, mode, 1.0, xd, xx, 0.0, yd, y)
        assert e.value.status == status and arg in str(e.value)
        assert np.all(y == 7.0)

    err(d, d, BAD, "lrnMode", mode=1)
    err(d, d, BAD, "x", xx=None)
    err(d, d, BAD, "normDesc", desc=cc.cudnnCreateActivationDescriptor())
    ndhwc = tdesc((1, 2, 2, 2, 3), fmt=cc.CUDNN_TENSOR_NHWC)
    err(ndhwc, ndhwc, BAD, "xDesc")  # 5-d not NCDHW DHW-packed
    err(d, tdesc(shape, cc.CUDNN_DATA_HALF), NS, "yDesc")  # data types differ
    err(d, tdesc((2, 3, 2, 1)), NS, "yDesc")  # dims differ
    d3 = tdesc((2, 3, 4))
    err(d3, d3, NS, "xDesc")  # only 4-d and 5-d
    d0 = tdesc(shape, strides=(0, 1, 3, 0))
    err(d0, d0, NS, "xDesc")  # overlapping
    i8 = tdesc(shape, cc.CUDNN_DATA_INT8)
    err(i8, i8, NS, "xDesc")


def test_lrn_backward_errors_write_nothing(handle):
    shape = (2, 3, 2, 2)
    d, ld = tdesc(shape), cc.cudnnCreateLRNDescriptor()
    v, dx = np.ones(24, np.float32), np.full(24, 7.0, np.float32)

    def err(yd, dyd, xd, dxd, status, arg, y=v, mode=DIM1):
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnLRNCrossChannelBackward(handle, ld, mode, 1.0, yd, y, dyd, v, xd, v, 0.0, dxd, dx)
        assert e.value.status == status and arg in str(e.value)
        assert np.all(dx == 7.0)

    err(d, d, d, d, BAD, "y", y=None)
    err(d, d, d, d, BAD, "lrnMode", mode=-1)
    err(d, tdesc((2, 3, 1, 2)), d, d, NS, "dyDesc")
    err(d, d, d, tdesc(shape, F64), NS, "dxDesc")


# -- divisive normalization ----------------------------------------------------------------

def _temps(shape, dtype=np.float64):
    return np.zeros(shape, dtype), np.zeros(shape, dtype)


@pytest.mark.parametrize("use_means", [True, False])
@pytest.mark.parametrize("shape", [(2, 2, 4, 5), (1, 2, 3, 3, 4)])
@pytest.mark.parametrize("n", [3, 4])
def test_divnorm_forward_matches_formula(handle, rng, n, shape, use_means):
    x, m, y0 = rng.standard_normal(shape), 0.3 * rng.standard_normal(shape), rng.standard_normal(shape)
    args = (n, 2.0, 0.75, 1.5)
    y = y0.copy()
    d = tdesc(shape, F64)
    cc.cudnnDivisiveNormalizationForward(handle, ldesc(*args), MEANS, 1.5, d, x, m if use_means else None,
                                         *_temps(shape), 0.5, d, y)
    want = 1.5 * divnorm_ref(x, m if use_means else np.zeros(shape), *args) + 0.5 * y0
    np.testing.assert_allclose(y, want, rtol=1e-13, atol=1e-13)


def test_divnorm_forward_nhwc_in_place_and_float(handle, rng):
    shape = (2, 3, 4, 3)
    x = rng.standard_normal(shape).astype(np.float32)
    buf = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    d = tdesc(shape, fmt=cc.CUDNN_TENSOR_NHWC)
    cc.divisiveNormalizationForward(handle, ldesc(3, 1.0, 0.5, 1.0), MEANS, 1.0, d, buf, 0, *_temps(shape, np.float32),
                                    0.0, d, buf)
    want = divnorm_ref(x.astype(np.float64), np.zeros(shape), 3, 1.0, 0.5, 1.0)
    np.testing.assert_allclose(buf, want.transpose(0, 2, 3, 1), rtol=1e-6, atol=1e-6)
    h = x.astype(np.float16)
    yh = np.full(shape, np.nan, np.float16)
    dh = tdesc(shape, cc.CUDNN_DATA_HALF)
    cc.cudnnDivisiveNormalizationForward(handle, ldesc(3, 1.0, 0.5, 1.0), MEANS, 1.0, dh, h, None,
                                         *_temps(shape, np.float16), 0.0, dh, yh)
    np.testing.assert_allclose(yh, divnorm_ref(h.astype(np.float64), np.zeros(shape), 3, 1.0, 0.5, 1.0),
                               rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("shape", [(1, 2, 4, 5), (1, 1, 3, 2, 3)])
@pytest.mark.parametrize("n", [3, 4])
def test_divnorm_backward_matches_finite_differences(handle, rng, n, shape):
    x, m, dy = rng.standard_normal(shape), 0.3 * rng.standard_normal(shape), rng.standard_normal(shape)
    dx0, dm0 = rng.standard_normal(shape), rng.standard_normal(shape)
    args = (n, 1.5, 0.75, 1.0)
    d = tdesc(shape, F64)
    dx, dm = dx0.copy(), dm0.copy()
    cc.cudnnDivisiveNormalizationBackward(handle, ldesc(*args), MEANS, 2.0, d, x, m, dy, *_temps(shape), -0.5, d,
                                          dx, dm)
    fdx = central_differences(lambda a: np.sum(divnorm_ref(a, m, *args) * dy), x)
    fdm = central_differences(lambda a: np.sum(divnorm_ref(x, a, *args) * dy), m)
    np.testing.assert_allclose(dx, 2.0 * fdx - 0.5 * dx0, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dm, 2.0 * fdm - 0.5 * dm0, rtol=1e-6, atol=1e-8)
    # dMeans NULL: dx alone; means NULL: zeros; beta 0 never reads dx
    only = np.full(shape, np.nan)
    cc.cudnnDivisiveNormalizationBackward(handle, ldesc(*args), MEANS, 1.0, d, x, m, dy, *_temps(shape), 0.0, d,
                                          only, None)
    np.testing.assert_allclose(only, fdx, rtol=1e-6, atol=1e-8)
    cc.cudnnDivisiveNormalizationBackward(handle, ldesc(*args), MEANS, 1.0, d, x, None, dy, *_temps(shape), 0.0, d,
                                          only, None)
    fd0 = central_differences(lambda a: np.sum(divnorm_ref(a, np.zeros(shape), *args) * dy), x)
    np.testing.assert_allclose(only, fd0, rtol=1e-6, atol=1e-8)


def test_divnorm_forward_errors_write_nothing(handle):
    shape = (1, 2, 3, 3)
    d, ld = tdesc(shape, F64), cc.cudnnCreateLRNDescriptor()
    x, y = np.ones(18), np.full(18, 7.0)
    t1, t2 = _temps(18)

    def err(xd, yd, status, arg, mode=MEANS, xx=x, temp=t1, temp2=t2, alpha=1.0):
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnDivisiveNormalizationForward(handle, ld, mode, alpha, xd, xx, None, temp, temp2, 0.0, yd, y)
        assert e.value.status == status and arg in str(e.value)
        assert np.all(y == 7.0)

    err(d, d, BAD, "mode", mode=1)
    err(d, d, BAD, "temp", temp=None)
    err(d, d, BAD, "temp2", temp2=0)
    err(d, d, BAD, "x", xx=None)
    err(d, d, BAD, "alpha", alpha=None)
    d3 = tdesc((2, 3, 3), F64)
    err(d3, d3, BAD, "xDesc")  # nbDims outside [4, 5]
    d6 = tdesc((1, 1, 2, 1, 3, 3), F64)
    err(d6, d6, BAD, "xDesc")
    err(d, tdesc((1, 2, 3, 2), F64), BAD, "yDesc")  # dims differ
    nhwc = tdesc(shape, F64, cc.CUDNN_TENSOR_NHWC)
    err(d, nhwc, BAD, "yDesc", xx=y)  # in place (x == y) with other strides
    err(d, nhwc, NS, "yDesc")  # strides differ between x and y
    err(d, tdesc(shape), NS, "yDesc")  # data types differ


def test_divnorm_backward_errors_write_nothing(handle):
    shape = (1, 2, 3, 3)
    d, ld = tdesc(shape, F64), cc.cudnnCreateLRNDescriptor()
    v, dx, dm = np.ones(18), np.full(18, 7.0), np.full(18, 7.0)
    t1, t2 = _temps(18)

    def err(xd, dxd, status, arg, dy=v, out=dx, temp=t1):
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnDivisiveNormalizationBackward(handle, ld, MEANS, 1.0, xd, v, v, dy, temp, t2, 0.0, dxd, out, dm)
        assert e.value.status == status and arg in str(e.value)
        assert np.all(dx == 7.0) and np.all(dm == 7.0)

    err(d, d, BAD, "dy", dy=None)
    err(d, d, BAD, "dx", out=None)
    err(d, d, BAD, "temp", temp=None)
    err(d, tdesc((1, 2, 3, 2), F64), BAD, "dXdMeansDesc")
    err(d, tdesc(shape, F64, cc.CUDNN_TENSOR_NHWC), NS, "dXdMeansDesc")
