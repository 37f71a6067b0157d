"""cudnnSoftmaxForward/Backward against formulas written here (002 §3.2.96, §4.1.19)."""
import ctypes

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend.dtypes import bf16_to_f32, f32_to_bf16
from conftest import tdesc

ALGOS = [cc.CUDNN_SOFTMAX_FAST, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_LOG]
INSTANCE, CHANNEL = cc.CUDNN_SOFTMAX_MODE_INSTANCE, cc.CUDNN_SOFTMAX_MODE_CHANNEL


def ref(x, algo, mode):
    """Softmax by explicit loops over the reduced groups: per n (INSTANCE) or per n, h, w (CHANNEL)."""
    y = np.empty_like(x)
    if mode == INSTANCE:
        groups = [(n,) for n in range(x.shape[0])]
    else:
        groups = [(n, slice(None)) + rest for n in range(x.shape[0]) for rest in np.ndindex(*x.shape[2:])]
    for g in groups:
        v = x[g]
        e = np.exp(v - v.max())
        y[g] = np.log(e / e.sum()) if algo == cc.CUDNN_SOFTMAX_LOG else e / e.sum()
    return y


def strided(values, strides, dtype):
    size = 1 + sum((d - 1) * s for d, s in zip(values.shape, strides))
    buf = np.zeros(size, dtype)
    view = np.lib.stride_tricks.as_strided(buf, values.shape, [s * buf.itemsize for s in strides])
    view[...] = values
    return buf, view


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 4, 2, 3, 2)])
@pytest.mark.parametrize("mode", [INSTANCE, CHANNEL])
@pytest.mark.parametrize("algo", ALGOS)
def test_forward_matches_formula(handle, rng, algo, mode, shape):
    x = rng.standard_normal(shape).astype(np.float32) * 3
    y = np.full(shape, np.nan, np.float32)
    d = tdesc(shape)
    cc.cudnnSoftmaxForward(handle, algo, mode, 1.0, d, x, 0.0, d, y)
    np.testing.assert_allclose(y, ref(x.astype(np.float64), algo, mode), rtol=2e-6, atol=2e-6)


def test_forward_alpha_beta_and_cupy_name(handle, rng):
    shape = (2, 3, 2, 2)
    x, y0 = rng.standard_normal(shape), rng.standard_normal(shape)
    y = y0.copy()
    d = tdesc(shape, cc.CUDNN_DATA_DOUBLE)
    alpha = np.array(0.5)  # a host pointer to a double (a ctypes pointer: Python ints are values)
    cc.softmaxForward(handle, cc.CUDNN_SOFTMAX_ACCURATE, CHANNEL, ctypes.c_void_p(alpha.ctypes.data), d, x, -2.0, d, y)
    np.testing.assert_allclose(y, 0.5 * ref(x, cc.CUDNN_SOFTMAX_ACCURATE, CHANNEL) - 2.0 * y0, rtol=1e-13)


def test_accurate_and_log_do_not_overflow(handle, rng):
    shape = (2, 5, 1, 1)
    x = rng.standard_normal(shape) * 3 + 1000.0
    d = tdesc(shape, cc.CUDNN_DATA_DOUBLE)
    for algo in (cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_LOG):
        y = np.zeros(shape)
        cc.cudnnSoftmaxForward(handle, algo, INSTANCE, 1.0, d, x, 0.0, d, y)
        np.testing.assert_allclose(y, ref(x, algo, INSTANCE), rtol=1e-12, atol=1e-12)
    fast, acc = np.zeros(shape), np.zeros(shape)
    small = x - 1000.0
    cc.cudnnSoftmaxForward(handle, cc.CUDNN_SOFTMAX_FAST, INSTANCE, 1.0, d, small, 0.0, d, fast)
    cc.cudnnSoftmaxForward(handle, cc.CUDNN_SOFTMAX_ACCURATE, INSTANCE, 1.0, d, small, 0.0, d, acc)
    np.testing.assert_allclose(fast, acc, rtol=1e-13)


LAYOUTS = {  # element strides of shape (2, 3, 5, 3)
    "nchw": (45, 15, 3, 1), "nhwc": (45, 1, 9, 3), "padded": (70, 22, 4, 1),
}


@pytest.mark.parametrize("xl, yl", [("nhwc", "nchw"), ("padded", "nhwc")])
@pytest.mark.parametrize("mode", [INSTANCE, CHANNEL])
def test_forward_layouts(handle, rng, mode, xl, yl):
    shape = (2, 3, 5, 3)
    x = rng.standard_normal(shape)
    xb, _ = strided(x, LAYOUTS[xl], np.float32)
    yb, yv = strided(np.full(shape, np.nan), LAYOUTS[yl], np.float32)
    cc.cudnnSoftmaxForward(handle, cc.CUDNN_SOFTMAX_LOG, mode, 1.0, tdesc(shape, strides=LAYOUTS[xl]), xb, 0.0,
                           tdesc(shape, strides=LAYOUTS[yl]), yb)
    np.testing.assert_allclose(yv, ref(x.astype(np.float32).astype(np.float64), cc.CUDNN_SOFTMAX_LOG, mode),
                               rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("mode", [INSTANCE, CHANNEL])
@pytest.mark.parametrize("algo", ALGOS)
def test_backward_matches_finite_differences(handle, rng, algo, mode):
    """dx == d/dx sum(softmax(x) * dy), central differences in float64."""
    shape = (2, 3, 2, 3)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    y = ref(x, algo, mode)
    dx = np.full(shape, np.nan)
    d = tdesc(shape, cc.CUDNN_DATA_DOUBLE)
    cc.cudnnSoftmaxBackward(handle, algo, mode, 1.0, d, y, d, dy, 0.0, d, dx)
    fd, h = np.empty(shape), 1e-6
    for i in np.ndindex(*shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        fd[i] = (np.sum(ref(xp, algo, mode) * dy) - np.sum(ref(xm, algo, mode) * dy)) / (2 * h)
    np.testing.assert_allclose(dx, fd, rtol=1e-6, atol=1e-8)


def test_backward_blend_in_place_and_nhwc(handle, rng):
    shape = (2, 4, 3, 2)
    x, dy, dx0 = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape)
    y = ref(x, cc.CUDNN_SOFTMAX_ACCURATE, CHANNEL)
    want = y * (dy - (dy * y).sum(axis=1, keepdims=True))
    d = tdesc(shape, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_TENSOR_NHWC)
    nhwc = lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))  # noqa: E731
    dx = nhwc(dx0)
    cc.cudnnSoftmaxBackward(handle, cc.CUDNN_SOFTMAX_ACCURATE, CHANNEL, 3.0, d, nhwc(y), d, nhwc(dy), 0.5, d, dx)
    np.testing.assert_allclose(dx, nhwc(3.0 * want + 0.5 * dx0), rtol=1e-12, atol=1e-12)
    buf = nhwc(dy)  # dy == dx
    cc.softmaxBackward(handle, cc.CUDNN_SOFTMAX_ACCURATE, CHANNEL, 1.0, d, nhwc(y), d, buf, 0.0, d, buf)
    np.testing.assert_allclose(buf, nhwc(want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("algo", ALGOS)
def test_half_and_bfloat16(handle, rng, algo):
    shape = (2, 6, 2, 2)
    x = rng.standard_normal(shape).astype(np.float32)
    xh, yh = x.astype(np.float16), np.zeros(shape, np.float16)
    d = tdesc(shape, cc.CUDNN_DATA_HALF)
    cc.cudnnSoftmaxForward(handle, algo, CHANNEL, 1.0, d, xh, 0.0, d, yh)
    np.testing.assert_allclose(yh, ref(xh.astype(np.float64), algo, CHANNEL), rtol=2e-3, atol=2e-3)
    xb, yb = f32_to_bf16(x), np.zeros(shape, np.uint16)
    d = tdesc(shape, cc.CUDNN_DATA_BFLOAT16)
    cc.cudnnSoftmaxForward(handle, algo, INSTANCE, 1.0, d, xb, 0.0, d, yb)
    want = ref(bf16_to_f32(xb).astype(np.float64), algo, INSTANCE)
    np.testing.assert_allclose(bf16_to_f32(yb), want, rtol=1e-2, atol=1e-2)
    dy, dx = rng.standard_normal(shape).astype(np.float16), np.zeros(shape, np.float16)
    y64 = yh.astype(np.float64)
    d = tdesc(shape, cc.CUDNN_DATA_HALF)
    cc.cudnnSoftmaxBackward(handle, algo, CHANNEL, 1.0, d, yh, d, dy, 0.0, d, dx)
    dy64 = dy.astype(np.float64)
    if algo == cc.CUDNN_SOFTMAX_LOG:
        want = dy64 - np.exp(y64) * dy64.sum(axis=1, keepdims=True)
    else:
        want = y64 * (dy64 - (dy64 * y64).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(dx, want, rtol=5e-3, atol=5e-3)


def test_repeated_call_is_a_cache_hit(handle, rng):
    shape = (2, 3, 2, 2)
    d = tdesc(shape)
    x, y = rng.standard_normal(shape).astype(np.float32), np.zeros(shape, np.float32)
    cc.cudnnSoftmaxForward(handle, cc.CUDNN_SOFTMAX_FAST, INSTANCE, 1.0, d, x, 0.0, d, y)
    before = cc.plan_cache_info()
    cc.cudnnSoftmaxForward(handle, cc.CUDNN_SOFTMAX_FAST, INSTANCE, 1.0, d, 2 * x, 0.0, d, y)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    np.testing.assert_allclose(y, ref(2 * x.astype(np.float64), cc.CUDNN_SOFTMAX_FAST, INSTANCE), rtol=1e-6)


def test_forward_errors_write_nothing(handle):
    BAD, NS = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
    shape = (2, 3, 2, 2)
    d = tdesc(shape)
    x, y = np.ones(24, np.float32), np.full(24, 7.0, np.float32)

    def err(algo, mode, xd, yd, status, arg, xx=x):
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnSoftmaxForward(handle, algo, mode, 1.0, xd, xx, 0.0, yd, y)
        assert e.value.status == status and arg in str(e.value)
        assert np.all(y == 7.0)

    err(3, INSTANCE, d, d, BAD, "algorithm")
    err(cc.CUDNN_SOFTMAX_FAST, 2, d, d, BAD, "mode")
    err(cc.CUDNN_SOFTMAX_FAST, INSTANCE, d, tdesc((2, 3, 2, 1)), BAD, "yDesc")  # dims differ
    err(cc.CUDNN_SOFTMAX_FAST, INSTANCE, d, tdesc(shape, cc.CUDNN_DATA_DOUBLE), BAD, "yDesc")  # types differ
    err(cc.CUDNN_SOFTMAX_FAST, INSTANCE, d, tdesc(shape, fmt=cc.CUDNN_TENSOR_NHWC), BAD, "yDesc", xx=y)  # in place
    i8 = tdesc(shape, cc.CUDNN_DATA_INT8)
    err(cc.CUDNN_SOFTMAX_FAST, INSTANCE, i8, i8, NS, "xDesc")
    d6 = tdesc((1, 2, 1, 1, 2, 3), strides=(12, 1, 12, 12, 6, 2))
    err(cc.CUDNN_SOFTMAX_LOG, CHANNEL, d6, d6, NS, "xDesc")


def test_backward_errors_write_nothing(handle):
    BAD, NS = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
    shape = (2, 3, 2, 2)
    d, nhwc = tdesc(shape), tdesc(shape, fmt=cc.CUDNN_TENSOR_NHWC)
    v, dx = np.ones(24, np.float32), np.full(24, 7.0, np.float32)

    def err(yd, dyd, dxd, status, arg, algo=cc.CUDNN_SOFTMAX_ACCURATE, mode=CHANNEL, dy=v):
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnSoftmaxBackward(handle, algo, mode, 1.0, yd, v, dyd, dy, 0.0, dxd, dx)
        assert e.value.status == status and arg in str(e.value)
        assert np.all(dx == 7.0)

    err(d, d, d, BAD, "algorithm", algo=-1)
    err(d, d, d, BAD, "mode", mode=5)
    err(d, tdesc((2, 3, 2, 1)), d, BAD, "dyDesc")  # dims differ
    err(d, d, tdesc((2, 3, 1, 2)), BAD, "dxDesc")
    err(d, nhwc, d, BAD, "dyDesc")  # y/dy strides differ
    err(d, d, tdesc(shape, cc.CUDNN_DATA_HALF), BAD, "dxDesc")  # types differ
    err(d, d, nhwc, BAD, "dxDesc", dy=dx)  # in place with other strides
    i8 = tdesc(shape, cc.CUDNN_DATA_INT8)
    err(i8, i8, i8, NS, "yDesc")
