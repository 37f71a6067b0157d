"""Pooling against direct loops written here (002 §3.2.69 cudnnPoolingForward, §4.1.18
cudnnPoolingBackward, §3.2.50-§3.2.53 and §3.2.85/§3.2.86 descriptors)."""
import ctypes
import itertools

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

MAX, MAXD = cc.CUDNN_POOLING_MAX, cc.CUDNN_POOLING_MAX_DETERMINISTIC
INC, EXC = cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, cc.CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
ALL_MODES = [MAX, INC, EXC, MAXD]
NCHW, NHWC = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC
F32_LOWEST = float(np.finfo(np.float32).min)


# -- direct loops ------------------------------------------------------------------------

def _window_inputs(x, n, c, o, window, pad, stride):
    """[(input index, value)] of the window at output position o, in row-major window order."""
    out = []
    for k in itertools.product(*[range(w) for w in window]):
        i = tuple(oo * s - p + kk for oo, s, p, kk in zip(o, stride, pad, k))
        if all(0 <= ii < dim for ii, dim in zip(i, x.shape[2:])):
            out.append((i, x[(n, c) + i]))
    return out


def ref_pool(x, mode, window, pad, stride, yspatial, propagate=False, lowest=F32_LOWEST):
    N, C = x.shape[:2]
    y = np.empty((N, C) + tuple(yspatial))
    for n, c in itertools.product(range(N), range(C)):
        for o in itertools.product(*[range(d) for d in yspatial]):
            vals = [v for _, v in _window_inputs(x, n, c, o, window, pad, stride)]
            if mode in (MAX, MAXD):
                if propagate and any(np.isnan(v) for v in vals):
                    r = np.nan
                else:
                    finite = [v for v in vals if not np.isnan(v)]
                    r = max(finite) if finite else lowest
            elif mode == INC:
                r = sum(vals) / np.prod(window)
            else:
                r = sum(vals) / len(vals) if vals else 0.0
            y[(n, c) + o] = r
    return y


def ref_max_backward(x, dy, window, pad, stride):
    """Each dy goes to the first maximal input of its window (row-major window order)."""
    dx = np.zeros_like(x)
    N, C = x.shape[:2]
    for n, c in itertools.product(range(N), range(C)):
        for o in itertools.product(*[range(d) for d in dy.shape[2:]]):
            items = _window_inputs(x, n, c, o, window, pad, stride)
            if items:
                m = max(v for _, v in items)
                first = next(i for i, v in items if v == m)
                dx[(n, c) + first] += dy[(n, c) + o]
    return dx


# -- helpers -----------------------------------------------------------------------------

def to_mem(a, fmt):
    """Logical N,C,spatial array -> contiguous memory in ``fmt``."""
    if fmt == NHWC:
        return np.ascontiguousarray(np.moveaxis(a, 1, -1))
    return a.copy()


def from_mem(m, fmt):
    return np.moveaxis(m, -1, 1) if fmt == NHWC else m


def pdesc(mode, window, pad, stride, nan=cc.CUDNN_NOT_PROPAGATE_NAN):
    d = cc.cudnnCreatePoolingDescriptor()
    if len(window) == 2:
        cc.cudnnSetPooling2dDescriptor(d, mode, nan, *window, *pad, *stride)
    else:
        cc.cudnnSetPoolingNdDescriptor(d, mode, nan, len(window), list(window), list(pad), list(stride))
    return d


def out_dims(xshape, window, pad, stride):
    return tuple(1 + (i + 2 * p - w) // s for i, w, p, s in zip(xshape[2:], window, pad, stride))


GEOMS = [  # (x shape, window, pad, stride)
    ((2, 3, 5, 6), (2, 2), (0, 0), (2, 2)),
    ((1, 2, 7, 6), (3, 2), (1, 1), (2, 1)),
    ((2, 2, 6, 5), (3, 3), (2, 1), (1, 2)),
    ((1, 2, 4, 5, 4), (2, 3, 2), (1, 0, 1), (2, 1, 2)),
]


# -- forward -----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [NCHW, NHWC])
@pytest.mark.parametrize("geom", GEOMS, ids=["2d", "2d-pad", "2d-pad2", "3d"])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_forward_matches_loops(handle, rng, mode, geom, fmt):
    xshape, window, pad, stride = geom
    ysp = out_dims(xshape, window, pad, stride)
    yshape = xshape[:2] + ysp
    x = rng.standard_normal(xshape).astype(np.float32)
    y = np.full(to_mem(np.zeros(yshape), fmt).shape, np.nan, np.float32)
    cc.cudnnPoolingForward(handle, pdesc(mode, window, pad, stride), 1.0, tdesc(xshape, fmt=fmt), to_mem(x, fmt),
                           0.0, tdesc(yshape, fmt=fmt), y)
    want = ref_pool(x.astype(np.float64), mode, window, pad, stride, ysp)
    np.testing.assert_allclose(from_mem(y, fmt), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", [MAX, INC, EXC])
def test_forward_alpha_beta_double_and_strided(handle, rng, mode):
    xshape, window, pad, stride = (2, 3, 6, 5), (3, 2), (1, 1), (2, 2)
    ysp = out_dims(xshape, window, pad, stride)
    yshape = xshape[:2] + ysp
    x = rng.standard_normal(xshape)
    xbuf = np.zeros(2 * 3 * 6 * 8)  # W padded to 8: strides (144, 48, 8, 1)
    xv = np.lib.stride_tricks.as_strided(xbuf, xshape, (144 * 8, 48 * 8, 64, 8))
    xv[...] = x
    y0 = rng.standard_normal(yshape)
    y = y0.copy()
    xd = tdesc(xshape, cc.CUDNN_DATA_DOUBLE, strides=(144, 48, 8, 1))
    cc.poolingForward(handle, pdesc(mode, window, pad, stride), -0.5, xd, xbuf, 2.0, tdesc(yshape, cc.CUDNN_DATA_DOUBLE), y)
    want = -0.5 * ref_pool(x, mode, window, pad, stride, ysp, lowest=float(np.finfo(np.float64).min)) + 2.0 * y0
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("delta", [-2, 3])
def test_output_smaller_or_larger_than_advised(handle, rng, mode, delta):
    """002 §3.2.69: yDesc may differ from the advised size; windows past the input are padding."""
    xshape, window, pad, stride = (1, 2, 6, 6), (3, 3), (1, 1), (2, 2)
    adv = out_dims(xshape, window, pad, stride)
    ysp = (adv[0] + delta, adv[1] + max(delta, 0))
    x = rng.standard_normal(xshape).astype(np.float32)
    y = np.full((1, 2) + ysp, np.nan, np.float32)
    cc.cudnnPoolingForward(handle, pdesc(mode, window, pad, stride), 1.0, tdesc(xshape), x, 0.0, tdesc((1, 2) + ysp), y)
    want = ref_pool(x.astype(np.float64), mode, window, pad, stride, ysp)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    if delta > 0 and mode in (MAX, MAXD):
        assert y[0, 0, -1, -1] == np.float32(F32_LOWEST)  # an all-padding window


@pytest.mark.parametrize("mode", [MAX, INC, EXC])
def test_negative_padding_nd(handle, rng, mode):
    xshape, window, pad, stride = (1, 2, 7, 6), (2, 2), (-1, 0), (2, 1)
    ysp = out_dims(xshape, window, pad, stride)
    d = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPoolingNdDescriptor(d, mode, cc.CUDNN_NOT_PROPAGATE_NAN, 2, window, pad, stride)
    assert cc.cudnnGetPoolingNdForwardOutputDim(d, tdesc(xshape), 4) == list(xshape[:2] + ysp)
    x = rng.standard_normal(xshape).astype(np.float32)
    y = np.zeros((1, 2) + ysp, np.float32)
    cc.cudnnPoolingForward(handle, d, 1.0, tdesc(xshape), x, 0.0, tdesc((1, 2) + ysp), y)
    np.testing.assert_allclose(y, ref_pool(x.astype(np.float64), mode, window, pad, stride, ysp), rtol=1e-6)


@pytest.mark.parametrize("nan", [cc.CUDNN_PROPAGATE_NAN, cc.CUDNN_NOT_PROPAGATE_NAN])
def test_max_nan_propagation(handle, rng, nan):
    x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    x[0, 0, 0, 1] = np.nan
    x[0, 0, 2:, 2:] = np.nan  # a window of NaNs only
    y = np.zeros((1, 1, 2, 2), np.float32)
    cc.cudnnPoolingForward(handle, pdesc(MAX, (2, 2), (0, 0), (2, 2), nan), 1.0, tdesc((1, 1, 4, 4)), x, 0.0,
                           tdesc((1, 1, 2, 2)), y)
    prop = nan == cc.CUDNN_PROPAGATE_NAN
    np.testing.assert_array_equal(y, ref_pool(x.astype(np.float64), MAX, (2, 2), (0, 0), (2, 2), (2, 2), prop))
    assert np.isnan(y[0, 0, 0, 0]) == prop and not np.isnan(y[0, 0, 0, 1])


@pytest.mark.parametrize("mode", [MAX, INC, EXC])
def test_half_and_bfloat16_and_int8(handle, rng, mode):
    geom = ((2, 2, 5, 5), (3, 3), (1, 1), (2, 2))
    xshape, window, pad, stride = geom
    ysp = out_dims(xshape, window, pad, stride)
    x16 = rng.standard_normal(xshape).astype(np.float16)
    y16 = np.zeros(xshape[:2] + ysp, np.float16)
    pd = pdesc(mode, window, pad, stride)
    cc.cudnnPoolingForward(handle, pd, 1.0, tdesc(xshape, cc.CUDNN_DATA_HALF), x16, 0.0,
                           tdesc(y16.shape, cc.CUDNN_DATA_HALF), y16)
    want = ref_pool(x16.astype(np.float64), mode, window, pad, stride, ysp)
    np.testing.assert_allclose(y16.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    # bfloat16 stored as the top 16 bits of a float32
    xb = (rng.standard_normal(xshape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    yb = np.zeros(xshape[:2] + ysp, np.uint16)
    cc.cudnnPoolingForward(handle, pd, 1.0, tdesc(xshape, cc.CUDNN_DATA_BFLOAT16), xb, 0.0,
                           tdesc(yb.shape, cc.CUDNN_DATA_BFLOAT16), yb)
    as_f = lambda u: (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # noqa: E731
    np.testing.assert_allclose(as_f(yb), ref_pool(as_f(xb), mode, window, pad, stride, ysp), rtol=1e-2, atol=1e-2)
    # int8: average computed in float, rounded to nearest even and clamped (002 §3.2.69)
    x8 = rng.integers(-128, 128, xshape).astype(np.int8)
    y8 = np.zeros(xshape[:2] + ysp, np.int8)
    cc.cudnnPoolingForward(handle, pd, 2.0, tdesc(xshape, cc.CUDNN_DATA_INT8), x8, 0.0,
                           tdesc(y8.shape, cc.CUDNN_DATA_INT8), y8)
    want8 = np.clip(np.rint(2.0 * ref_pool(x8.astype(np.float64), mode, window, pad, stride, ysp)), -128, 127)
    np.testing.assert_array_equal(y8, want8)


# -- backward ----------------------------------------------------------------------------

def _run_backward(handle, pd, x, y, dy, fmt=NCHW, alpha=1.0, beta=0.0, dx0=None, dtype=cc.CUDNN_DATA_FLOAT):
    np_t = np.float64 if dtype == cc.CUDNN_DATA_DOUBLE else np.float32
    dx = to_mem(np.zeros(x.shape) if dx0 is None else dx0, fmt).astype(np_t)
    if dx0 is None:
        dx[...] = np.nan  # beta == 0 never reads dx
    xd, yd = tdesc(x.shape, dtype, fmt), tdesc(y.shape, dtype, fmt)
    cc.cudnnPoolingBackward(handle, pd, alpha, yd, to_mem(y, fmt).astype(np_t), yd, to_mem(dy, fmt).astype(np_t),
                            xd, to_mem(x, fmt).astype(np_t), beta, xd, dx)
    return from_mem(dx, fmt).astype(np.float64)


def _forward(handle, pd, x, ysp, fmt=NCHW, dtype=cc.CUDNN_DATA_FLOAT):
    np_t = np.float64 if dtype == cc.CUDNN_DATA_DOUBLE else np.float32
    y = to_mem(np.zeros(x.shape[:2] + ysp), fmt).astype(np_t)
    cc.cudnnPoolingForward(handle, pd, 1.0, tdesc(x.shape, dtype, fmt), to_mem(x, fmt).astype(np_t), 0.0,
                           tdesc(x.shape[:2] + ysp, dtype, fmt), y)
    return from_mem(y, fmt).astype(np.float64)


@pytest.mark.parametrize("fmt", [NCHW, NHWC])
@pytest.mark.parametrize("geom", GEOMS, ids=["2d", "2d-pad", "2d-pad2", "3d"])
@pytest.mark.parametrize("mode", [INC, EXC])
def test_average_backward_adjoint(handle, rng, mode, geom, fmt):
    """Average pooling is linear: <pool(x), dy> == <x, poolBackward(dy)>."""
    xshape, window, pad, stride = geom
    ysp = out_dims(xshape, window, pad, stride)
    pd = pdesc(mode, window, pad, stride)
    x = rng.standard_normal(xshape)
    dy = rng.standard_normal(xshape[:2] + ysp)
    y = _forward(handle, pd, x, ysp, fmt, cc.CUDNN_DATA_DOUBLE)
    dx = _run_backward(handle, pd, x, y, dy, fmt, dtype=cc.CUDNN_DATA_DOUBLE)
    assert np.isclose(np.vdot(y, dy), np.vdot(x, dx), rtol=1e-12)
    assert np.all(np.isfinite(dx))


@pytest.mark.parametrize("fmt", [NCHW, NHWC])
@pytest.mark.parametrize("geom", GEOMS, ids=["2d", "2d-pad", "2d-pad2", "3d"])
@pytest.mark.parametrize("mode", [MAX, MAXD])
def test_max_backward_matches_loop_with_ties(handle, rng, mode, geom, fmt):
    xshape, window, pad, stride = geom
    ysp = out_dims(xshape, window, pad, stride)
    pd = pdesc(mode, window, pad, stride)
    x = rng.integers(-2, 3, xshape).astype(np.float64)  # many ties
    dy = rng.standard_normal(xshape[:2] + ysp)
    y = _forward(handle, pd, x, ysp, fmt)
    dx = _run_backward(handle, pd, x, y, dy, fmt)
    np.testing.assert_allclose(dx, ref_max_backward(x, dy.astype(np.float32).astype(np.float64), window, pad, stride),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", [MAX, INC])
def test_backward_alpha_beta(handle, rng, mode):
    xshape, window, pad, stride = (2, 2, 5, 4), (2, 2), (1, 0), (1, 2)
    ysp = out_dims(xshape, window, pad, stride)
    pd = pdesc(mode, window, pad, stride)
    x = rng.standard_normal(xshape)
    dy = rng.standard_normal(xshape[:2] + ysp)
    y = _forward(handle, pd, x, ysp, dtype=cc.CUDNN_DATA_DOUBLE)
    base = _run_backward(handle, pd, x, y, dy, dtype=cc.CUDNN_DATA_DOUBLE)
    dx0 = rng.standard_normal(xshape)
    got = _run_backward(handle, pd, x, y, dy, alpha=0.5, beta=-1.5, dx0=dx0, dtype=cc.CUDNN_DATA_DOUBLE)
    np.testing.assert_allclose(got, 0.5 * base - 1.5 * dx0, rtol=1e-12, atol=1e-12)
    if mode == MAX:
        np.testing.assert_allclose(base, ref_max_backward(x, dy, window, pad, stride), rtol=1e-12)


# -- descriptors -------------------------------------------------------------------------

def test_descriptor_round_trips_and_output_dims():
    d = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(d, EXC, cc.CUDNN_PROPAGATE_NAN, 3, 2, 1, 0, 2, 1)
    assert cc.cudnnGetPooling2dDescriptor(d) == (EXC, cc.CUDNN_PROPAGATE_NAN, 3, 2, 1, 0, 2, 1)
    assert cc.cudnnGetPoolingNdDescriptor(d, 8) == (EXC, cc.CUDNN_PROPAGATE_NAN, 2, [3, 2], [1, 0], [2, 1])
    assert cc.cudnnGetPoolingNdDescriptor(d, 1)[3:] == ([3], [1], [2])
    assert cc.cudnnGetPooling2dForwardOutputDim(d, tdesc((2, 3, 9, 7))) == (2, 3, 1 + (9 + 2 - 3) // 2, 1 + (7 - 2) // 1)
    # CuPy 13 spelling with host pointers to int arrays (ctypes pointers: a plain int is a number, issue 13)
    win, pad, st = (np.array(v, np.int32) for v in ([2, 3, 2], [0, -1, 1], [1, 2, 2]))
    win, pad, st = (a.ctypes.data_as(ctypes.c_void_p) for a in (win, pad, st))
    cc.setPoolingNdDescriptor_v4(d, MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 3, win, pad, st)
    assert cc.getPoolingNdDescriptor(d, 3) == (MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 3, [2, 3, 2], [0, -1, 1], [1, 2, 2])
    assert cc.cudnnGetPoolingNdForwardOutputDim(d, tdesc((1, 2, 4, 8, 5)), 5) == [1, 2, 3, 1 + (8 - 2 - 3) // 2, 3]
    cc.destroyPoolingDescriptor(d)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetPooling2dDescriptor(d)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM


def test_descriptor_errors():
    d = cc.cudnnCreatePoolingDescriptor()
    cases = [  # (call, status)
        (lambda: cc.cudnnSetPooling2dDescriptor(d, 7, 0, 2, 2, 0, 0, 1, 1), cc.CUDNN_STATUS_BAD_PARAM),  # bad mode
        (lambda: cc.cudnnSetPooling2dDescriptor(d, MAX, 5, 2, 2, 0, 0, 1, 1), cc.CUDNN_STATUS_BAD_PARAM),  # bad nan
        (lambda: cc.cudnnSetPooling2dDescriptor(d, MAX, 0, -2, 2, 0, 0, 1, 1), cc.CUDNN_STATUS_BAD_PARAM),  # window < 0
        (lambda: cc.cudnnSetPooling2dDescriptor(d, MAX, 0, 2, 2, 0, 0, 1, -1), cc.CUDNN_STATUS_BAD_PARAM),  # stride < 0
        (lambda: cc.cudnnSetPoolingNdDescriptor(d, MAX, 0, 7, [1] * 7, [0] * 7, [1] * 7), cc.CUDNN_STATUS_NOT_SUPPORTED),
        (lambda: cc.cudnnSetPoolingNdDescriptor(d, MAX, 0, 0, [], [], []), cc.CUDNN_STATUS_BAD_PARAM),  # nbDims <= 0
        (lambda: cc.cudnnSetPoolingNdDescriptor(d, MAX, 0, 2, [2, 0], [0, 0], [1, 1]), cc.CUDNN_STATUS_BAD_PARAM),
        (lambda: cc.cudnnSetPoolingNdDescriptor(d, MAX, 0, 2, [2, 2], [0, 0], [1, -1]), cc.CUDNN_STATUS_BAD_PARAM),
        (lambda: cc.cudnnSetPoolingNdDescriptor(d, MAX, 0, 2, [2], [0], [1]), cc.CUDNN_STATUS_BAD_PARAM),  # short array
        (lambda: cc.cudnnGetPooling2dDescriptor(d), cc.CUDNN_STATUS_BAD_PARAM),  # never set
    ]
    for call, status in cases:
        with pytest.raises(cc.CuDNNError) as e:
            call()
        assert e.value.status == status, e.value
    cc.cudnnSetPoolingNdDescriptor(d, MAX, 0, 3, [2, 2, 2], [0, 0, 0], [1, 1, 1])
    for call, status in [
        (lambda: cc.cudnnGetPoolingNdDescriptor(d, 9), cc.CUDNN_STATUS_NOT_SUPPORTED),
        (lambda: cc.cudnnGetPooling2dDescriptor(d), cc.CUDNN_STATUS_BAD_PARAM),  # a 3-d descriptor
        (lambda: cc.cudnnGetPooling2dForwardOutputDim(d, tdesc((1, 1, 4, 4, 4))), cc.CUDNN_STATUS_BAD_PARAM),
        (lambda: cc.cudnnGetPoolingNdForwardOutputDim(d, tdesc((1, 1, 4, 4)), 4), cc.CUDNN_STATUS_BAD_PARAM),
        (lambda: cc.cudnnGetPoolingNdForwardOutputDim(d, tdesc((1, 1, 4, 4, 4)), 4), cc.CUDNN_STATUS_BAD_PARAM),
        (lambda: cc.cudnnGetPoolingNdForwardOutputDim(d, tdesc((1, 1, 1, 4, 4)), 5), cc.CUDNN_STATUS_BAD_PARAM),
    ]:
        with pytest.raises(cc.CuDNNError) as e:
            call()
        assert e.value.status == status, e.value
    assert cc.cudnnGetPoolingNdDescriptor(d)[2] == 3  # failed setters left the descriptor as it was


# -- errors of the compute calls ---------------------------------------------------------

def test_forward_errors_write_nothing(handle):
    pd = pdesc(MAX, (2, 2), (0, 0), (2, 2))
    x = np.ones((2, 3, 4, 4), np.float32)
    y = np.full((2, 3, 2, 2), 7.0, np.float32)
    xd = tdesc((2, 3, 4, 4))
    pd3 = pdesc(MAX, (2, 2, 2), (0, 0, 0), (1, 1, 1))
    pd1 = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPoolingNdDescriptor(pd1, MAX, 0, 1, [2], [0], [1])
    cases = [
        (pd, xd, tdesc((2, 2, 2, 2)), cc.CUDNN_STATUS_BAD_PARAM),  # c differs
        (pd, xd, tdesc((1, 3, 2, 2)), cc.CUDNN_STATUS_BAD_PARAM),  # n differs
        (pd, xd, tdesc((2, 3, 2, 2), cc.CUDNN_DATA_DOUBLE), cc.CUDNN_STATUS_BAD_PARAM),  # dtype differs
        (pd, xd, tdesc((2, 3, 2, 2, 1)), cc.CUDNN_STATUS_BAD_PARAM),  # rank differs
        (pd3, xd, tdesc((2, 3, 2, 2)), cc.CUDNN_STATUS_BAD_PARAM),  # pooling dims vs tensor rank
        (pd1, tdesc((2, 3, 4)), tdesc((2, 3, 2)), cc.CUDNN_STATUS_NOT_SUPPORTED),  # 1 spatial dim
        (pd, tdesc((2, 3, 4, 4), cc.CUDNN_DATA_INT32), tdesc((2, 3, 2, 2), cc.CUDNN_DATA_INT32), cc.CUDNN_STATUS_NOT_SUPPORTED),
    ]
    for p, a, b, status in cases:
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnPoolingForward(handle, p, 1.0, a, x, 0.0, b, y)
        assert e.value.status == status, e.value
        assert "cudnnPoolingForward" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # NULL y
        cc.cudnnPoolingForward(handle, pd, 1.0, xd, x, 0.0, tdesc((2, 3, 2, 2)), None)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    with pytest.raises(cc.CuDNNError) as e:  # destroyed descriptor
        d = pdesc(MAX, (2, 2), (0, 0), (2, 2))
        cc.cudnnDestroyPoolingDescriptor(d)
        cc.cudnnPoolingForward(handle, d, 1.0, xd, x, 0.0, tdesc((2, 3, 2, 2)), y)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    assert np.all(y == 7.0)


def test_backward_errors_write_nothing(handle):
    pd = pdesc(MAX, (2, 2), (0, 0), (2, 2))
    x = np.ones((2, 3, 4, 4), np.float32)
    y = np.ones((2, 3, 2, 2), np.float32)
    dx = np.full(x.shape, 7.0, np.float32)
    xd, yd = tdesc((2, 3, 4, 4)), tdesc((2, 3, 2, 2))
    yd_nhwc, xd_nhwc = tdesc((2, 3, 2, 2), fmt=NHWC), tdesc((2, 3, 4, 4), fmt=NHWC)
    dbl = cc.CUDNN_DATA_DOUBLE
    cases = [  # (yDesc, dyDesc, xDesc, dxDesc, status)
        (yd, tdesc((2, 3, 2, 1)), xd, xd, cc.CUDNN_STATUS_BAD_PARAM),  # y/dy dims differ
        (yd, yd_nhwc, xd, xd, cc.CUDNN_STATUS_BAD_PARAM),  # y/dy strides differ
        (yd, yd, xd, tdesc((2, 3, 4, 3)), cc.CUDNN_STATUS_BAD_PARAM),  # x/dx dims differ
        (yd, yd, xd, xd_nhwc, cc.CUDNN_STATUS_BAD_PARAM),  # x/dx strides differ
        (yd, yd, xd, tdesc((2, 3, 4, 4), dbl), cc.CUDNN_STATUS_BAD_PARAM),  # dtypes differ
        (tdesc((2, 2, 2, 2)), tdesc((2, 2, 2, 2)), xd, xd, cc.CUDNN_STATUS_BAD_PARAM),  # c differs
        (yd, yd, tdesc((2, 3, 4, 4), strides=(96, 32, 8, 2)), tdesc((2, 3, 4, 4), strides=(96, 32, 8, 2)),
         cc.CUDNN_STATUS_NOT_SUPPORTED),  # innermost stride 2 (002: "wStride is not 1")
        (tdesc((2, 3, 2, 2), cc.CUDNN_DATA_INT8),) * 2 + (tdesc((2, 3, 4, 4), cc.CUDNN_DATA_INT8),) * 2
        + (cc.CUDNN_STATUS_NOT_SUPPORTED,),
    ]
    big = np.ones(2 * 3 * 4 * 8, np.float32)
    for a, b, c, d, status in cases:
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnPoolingBackward(handle, pd, 1.0, a, y, b, y, c, big, 0.0, d, dx)
        assert e.value.status == status, e.value
    assert np.all(dx == 7.0)


def test_nhwc_backward_is_supported_and_repeat_is_a_cache_hit(handle, rng):
    pd = pdesc(MAX, (2, 2), (0, 0), (2, 2))
    x = rng.standard_normal((1, 2, 4, 4))
    y = _forward(handle, pd, x, (2, 2), NHWC)
    dy = rng.standard_normal((1, 2, 2, 2))
    _run_backward(handle, pd, x, y, dy, NHWC)
    before = cc.plan_cache_info()
    dx = _run_backward(handle, pd, x, y, dy, NHWC)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    np.testing.assert_allclose(dx, ref_max_backward(x.astype(np.float32).astype(np.float64),
                                                    dy.astype(np.float32).astype(np.float64), (2, 2), (0, 0), (2, 2)),
                               rtol=1e-6)


def test_window_larger_than_padded_input_is_bad_param():
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetPooling2dForwardOutputDim(pdesc(MAX, (5, 2), (1, 0), (1, 1)), tdesc((1, 1, 2, 4)))
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "window" in str(e.value)


def test_graph_rules_for_resample_ops():
    """The ResampleForward/Backward finalize rules (cudnn_compat/_backend/ops/resample_norm.py)."""
    from cudnn_compat._backend.ir import GraphError, Operation, OperationGraph, Tensor, packed_strides

    def t(uid, dims, dtype="float32"):
        return Tensor(uid, dims, packed_strides(dims), dtype)

    good = dict(mode="MAXPOOL", window=(2, 2), stride=(2, 2), pre_padding=(0, 0), post_padding=(0, 0))
    OperationGraph([Operation("ResampleForward", {"x": t(1, (1, 2, 4, 4))}, {"y": t(2, (1, 2, 2, 2))}, good)]).finalize()
    cases = [  # (x dims, y dims, attr changes, check, status)
        ((1, 2, 4, 4), (1, 2, 2, 2), dict(window=(0, 2)), "RESAMPLE_WINDOW", "BAD_PARAM"),
        ((1, 2, 4, 4), (1, 2, 2, 2), dict(stride=(1,)), "RESAMPLE_ATTR", "BAD_PARAM"),
        ((1, 2, 4, 4), (1, 2, 2, 2), dict(mode="NEAREST"), "RESAMPLE_MODE", "NOT_SUPPORTED"),
        ((1, 2, 4, 4), (1, 3, 2, 2), {}, "RESAMPLE_NC", "BAD_PARAM"),
        ((1, 2, 4), (1, 2, 2), dict(window=(2,), stride=(2,), pre_padding=(0,), post_padding=(0,)),
         "RESAMPLE_RANK", "NOT_SUPPORTED"),
    ]
    for xdims, ydims, change, check, status in cases:
        op = Operation("ResampleForward", {"x": t(1, xdims)}, {"y": t(2, ydims)}, {**good, **change})
        with pytest.raises(GraphError) as e:
            OperationGraph([op]).finalize()
        assert e.value.check == check and e.value.status == status
    bwd = Operation("ResampleBackward", {"dy": t(3, (1, 2, 2, 3)), "x": t(1, (1, 2, 4, 4)), "y": t(2, (1, 2, 2, 2))},
                    {"dx": t(4, (1, 2, 4, 4))}, good)
    with pytest.raises(GraphError) as e:
        OperationGraph([bwd]).finalize()
    assert e.value.check == "RESAMPLE_DY"
