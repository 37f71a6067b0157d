"""Tensor transforms, filter reordering, im2col and the folded backward-data descriptors against
formulas written here (002 §3.2.17, §3.2.32, §3.2.62, §3.2.64, §3.2.95, §3.2.99, §3.2.101,
§5.2.30-§5.2.32; inventory §2.4, §2.10)."""
import itertools

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

FOLD, UNFOLD = cc.CUDNN_TRANSFORM_FOLD, cc.CUDNN_TRANSFORM_UNFOLD
NCHW, NHWC = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC
F32, F64, F16 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_HALF
BAD, UNSUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED


# -- formulas ----------------------------------------------------------------------------

def fold_ref(x, before, after, folds):
    """pad every spatial dim (before/after, then up to a multiple of the fold), then move the
    phases into the channels: out[n, c*F + j] = padded[n, c, I*f + j] (j row-major)."""
    sp = x.ndim - 2
    padded_shape = [x.shape[0], x.shape[1]]
    for d in range(sp):
        s = x.shape[2 + d] + before[d] + after[d]
        padded_shape.append(-(-s // folds[d]) * folds[d])
    p = np.zeros(padded_shape)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for d in range(sp):
        lo, hi = max(before[d], 0), before[d] + x.shape[2 + d]
        dst.append(slice(lo, min(hi, padded_shape[2 + d])))
        src.append(slice(lo - before[d], lo - before[d] + (dst[-1].stop - dst[-1].start)))
    p[tuple(dst)] = x[tuple(src)]
    F = int(np.prod(folds))
    out = np.zeros([x.shape[0], x.shape[1] * F] + [ps // f for ps, f in zip(padded_shape[2:], folds)])
    for k, j in enumerate(itertools.product(*[range(f) for f in folds])):
        sl = tuple(slice(jj, None, f) for jj, f in zip(j, folds))
        for c in range(x.shape[1]):
            out[:, c * F + k] = p[(slice(None), c) + sl]
    return out


def unfold_ref(y, before, after, folds):
    """The inverse: depth to space, then crop before/after."""
    F = int(np.prod(folds))
    c = y.shape[1] // F
    full = np.zeros([y.shape[0], c] + [s * f for s, f in zip(y.shape[2:], folds)])
    for k, j in enumerate(itertools.product(*[range(f) for f in folds])):
        sl = tuple(slice(jj, None, f) for jj, f in zip(j, folds))
        for ci in range(c):
            full[(slice(None), ci) + sl] = y[:, ci * F + k]
    out = np.zeros(full.shape[:2] + tuple(s - b - a for s, b, a in zip(full.shape[2:], before, after)))
    for idx in np.ndindex(*out.shape[2:]):  # out[h] = full[h + before], zero outside (a negative pad)
        src = tuple(i + b for i, b in zip(idx, before))
        if all(0 <= q < s for q, s in zip(src, full.shape[2:])):
            out[(slice(None), slice(None)) + idx] = full[(slice(None), slice(None)) + src]
    return out


def nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def transform(nb, fmt, before, after, fold, direction):
    t = cc.cudnnCreateTensorTransformDescriptor()
    cc.cudnnSetTensorTransformDescriptor(t, nb, fmt, before, after, fold, direction)
    return t


# -- descriptor --------------------------------------------------------------------------

def test_descriptor_round_trip_and_null_arrays():
    t = transform(4, NHWC, [0, 0, 1, 2], [0, 0, 3, 0], [2, 4], UNFOLD)
    assert cc.cudnnGetTensorTransformDescriptor(t, 4) == (NHWC, [0, 0, 1, 2], [0, 0, 3, 0], [2, 4], UNFOLD)
    assert cc.getTensorTransformDescriptor(t, 3) == (NHWC, [0, 0, 1], [0, 0, 3], [2], UNFOLD)
    cc.setTensorTransformDescriptor(t, 5, NCHW, None, None, None, FOLD)
    assert cc.getTensorTransformDescriptor(t) == (NCHW, [0] * 5, [0] * 5, [1, 1, 1], FOLD)
    cc.cudnnDestroyTensorTransformDescriptor(t)


@pytest.mark.parametrize("args,status,arg", [
    ((2, NCHW, None, None, None, FOLD), BAD, "nbDims"),                        # rule: nbDims > 2
    ((9, NCHW, None, None, None, FOLD), UNSUP, "nbDims"),                      # rule: nbDims <= CUDNN_DIM_MAX
    ((4, cc.CUDNN_TENSOR_NCHW_VECT_C, None, None, None, FOLD), UNSUP, "destFormat"),  # rule: NCHW or NHWC
    ((4, NCHW, None, None, None, 5), BAD, "direction"),                        # rule: valid direction
    ((4, NCHW, [0, 0, 1], None, None, FOLD), BAD, "padBeforeA"),               # rule: nbDims entries
    ((4, NCHW, None, None, [2, -1], FOLD), BAD, "foldA"),                      # rule: folds >= 0
])
def test_descriptor_errors(args, status, arg):
    t = cc.cudnnCreateTensorTransformDescriptor()
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetTensorTransformDescriptor(t, *args)
    assert e.value.status == status and arg in str(e.value)
    cc.setTensorTransformDescriptor(t, 4, NCHW, None, None, None, FOLD)
    with pytest.raises(cc.CuDNNError) as e:  # rule: nbDimsRequested in [3, CUDNN_DIM_MAX]
        cc.getTensorTransformDescriptor(t, 2)
    assert e.value.status == BAD


def test_init_transform_dest():
    t = transform(4, NHWC, [0, 0, 1, 0], [0, 0, 0, 2], [2, 3], FOLD)
    d = cc.cudnnCreateTensorDescriptor()
    size = cc.cudnnInitTransformDest(t, tdesc((2, 3, 5, 4), F16), d)
    dt, nb, dims, strides = cc.getTensorNdDescriptor(d)
    # H: ceil((5+1)/2) = 3, W: ceil((4+2)/3) = 2, C: 3*6, packed NHWC, half
    assert (dt, dims, strides) == (F16, [2, 18, 3, 2], [108, 1, 36, 18]) and size == 2 * 108 * 2
    u = transform(4, NCHW, [0, 0, 1, 0], [0, 0, 0, 2], [2, 3], UNFOLD)
    assert cc.cudnnInitTransformDest(u, d, cc.cudnnCreateTensorDescriptor()) == 2 * 3 * 5 * 4 * 2
    for src, status in ((tdesc((2, 3, 5, 4, 2)), BAD),  # rule: nbDims equal the transform's
                        (tdesc((2, 5, 4, 4)), BAD)):    # rule: unfolding needs C divisible by the folds
        with pytest.raises(cc.CuDNNError) as e:
            cc.initTransformDest(u, src, cc.cudnnCreateTensorDescriptor())
        assert e.value.status == status
    t5 = transform(5, NCHW, None, None, [2, 2, 2], FOLD)
    with pytest.raises(cc.CuDNNError) as e:  # rule: 4-d only
        cc.initTransformDest(t5, tdesc((1, 1, 2, 2, 2)), cc.cudnnCreateTensorDescriptor())
    assert e.value.status == UNSUP


# -- TransformTensorEx -------------------------------------------------------------------

@pytest.mark.parametrize("shape,before,after,fold,fmt", [
    ((2, 3, 5, 4), (1, 0), (0, 2), (2, 3), NHWC),
    ((1, 2, 4, 6), (0, 0), (0, 0), (2, 2), NCHW),
    ((2, 2, 3, 3), (2, 1), (1, 0), (1, 1), NCHW),    # padding only
    ((1, 2, 4, 3), (-1, 0), (0, 1), (3, 2), NHWC),   # a negative pad crops
    ((1, 2, 3, 4, 5), (0, 1, 0), (1, 0, 1), (2, 3, 2), NCHW),  # 3 spatial dims
    ((2, 3, 7), (1,), (0,), (4,), NCHW),             # 1 spatial dim
])
def test_fold_and_unfold_against_formula(handle, rng, shape, before, after, fold, fmt):
    nb = len(shape)
    x = rng.standard_normal(shape).astype(np.float32)
    zeros = [0, 0]
    t = transform(nb, fmt, zeros + list(before), zeros + list(after), list(fold), FOLD)
    want = fold_ref(x.astype(np.float64), before, after, fold)
    yd = tdesc(want.shape, fmt=fmt if nb == 4 else NCHW)
    y = np.full(want.size, np.nan, np.float32)
    cc.cudnnTransformTensorEx(handle, t, 1.0, tdesc(shape), x, 0.0, yd, y)
    got = y.reshape(want.shape) if nb != 4 or fmt == NCHW else np.moveaxis(y.reshape(nhwc(want).shape), -1, 1)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    # unfold back, blended: dest = 2*unfold(y) - 0.5*dest
    u = transform(nb, NCHW, zeros + list(before), zeros + [(-(s + b + a)) % f + a for s, b, a, f in
                                                            zip(shape[2:], before, after, fold)], list(fold), UNFOLD)
    z0 = rng.standard_normal(shape).astype(np.float32)
    z = z0.copy()
    cc.transformTensorEx(handle, u, 2.0, yd, y, -0.5, tdesc(shape), z)
    np.testing.assert_allclose(z, 2 * unfold_ref(got.astype(np.float64), before,
                                                 [(-(s + b + a)) % f + a for s, b, a, f in
                                                  zip(shape[2:], before, after, fold)], fold) - 0.5 * z0, rtol=1e-6)
    if min(before) >= 0:
        np.testing.assert_allclose(z, 2 * x - 0.5 * z0, rtol=1e-6)


def test_fold_keeps_inf_and_nan_and_converts_types(handle):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 0], x[0, 0, 1, 3] = np.inf, np.nan
    t = transform(4, NCHW, None, None, [2, 2], FOLD)
    y = np.zeros(16, np.float16)
    cc.cudnnTransformTensorEx(handle, t, 1.0, tdesc(x.shape), x, 0.0, tdesc((1, 4, 2, 2), F16), y)
    want = fold_ref(x.astype(np.float64), (0, 0), (0, 0), (2, 2)).astype(np.float16)
    np.testing.assert_array_equal(y.reshape(1, 4, 2, 2), want)  # NaN == NaN for assert_array_equal


def test_layout_change_with_blend(handle, rng):
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    y0 = rng.standard_normal((2, 2, 2, 3)).astype(np.float32)
    y = y0.copy()
    t = transform(4, NHWC, None, None, None, FOLD)
    cc.cudnnTransformTensorEx(handle, t, 3.0, tdesc(x.shape), x, 0.5, tdesc(x.shape, fmt=NHWC), y)
    np.testing.assert_allclose(y, 3 * nhwc(x) + 0.5 * y0, rtol=1e-6)


def test_transform_tensor_ex_errors_write_nothing(handle):
    x = np.ones((1, 2, 4, 4), np.float32)
    y = np.full(32, 7, np.float32)
    t = transform(4, NCHW, None, None, [2, 2], FOLD)
    cases = [
        (dict(alpha=2.0), UNSUP, "alpha"),                          # rule: folding needs (alpha, beta) = (1, 0)
        (dict(beta=1.0), UNSUP, "beta"),
        (dict(yd=tdesc((1, 8, 2, 1))), BAD, "destDesc"),           # rule: dest dims are the transform's
        (dict(yd=tdesc((1, 8, 2, 2, 1))), BAD, "destDesc"),        # rule: equal nbDims
        (dict(t=transform(4, NCHW, [0, 1, 0, 0], None, None, FOLD)), UNSUP, "transDesc"),  # rule: spatial pads only
        (dict(y=x), BAD, "destData"),                              # rule: not in place
    ]
    for kw, status, arg in cases:
        a = dict(t=t, alpha=1.0, beta=0.0, yd=tdesc((1, 8, 2, 2)), y=y)
        a.update(kw)
        with pytest.raises(cc.CuDNNError) as e:
            cc.transformTensorEx(handle, a["t"], a["alpha"], tdesc(x.shape), x, a["beta"], a["yd"], a["y"])
        assert e.value.status == status and arg in str(e.value), (kw, str(e.value))
    assert np.all(y == 7) and np.all(x == 1)


def test_transform_filter_fold_and_type_change(handle, rng):
    w = rng.standard_normal((4, 2, 3, 5)).astype(np.float32)
    src, dst = cc.cudnnCreateFilterDescriptor(), cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(src, F32, NCHW, 4, 2, 3, 5)
    cc.cudnnSetFilter4dDescriptor(dst, F16, NHWC, 4, 8, 2, 3)
    t = transform(4, NHWC, [0, 0, 1, 0], [0, 0, 0, 1], [2, 2], FOLD)
    out = np.zeros(4 * 8 * 2 * 3, np.float16)
    cc.cudnnTransformFilter(handle, t, 1.0, src, w, 0.0, dst, out)
    want = fold_ref(w.astype(np.float64), (1, 0), (0, 1), (2, 2))
    np.testing.assert_array_equal(np.moveaxis(out.reshape(4, 2, 3, 8), -1, 1), want.astype(np.float16))


# -- ReorderFilterAndBias ----------------------------------------------------------------

def test_reorder_filter_and_bias_is_the_identity_layout(handle, rng):
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, cc.CUDNN_DATA_INT8x32, cc.CUDNN_TENSOR_NCHW_VECT_C, 2, 32, 3, 3)
    w = rng.integers(-128, 127, 2 * 32 * 9).astype(np.int8)
    b = rng.standard_normal(2).astype(np.float32)
    rw, rb = np.zeros_like(w), np.zeros(2, np.float32)
    cc.cudnnReorderFilterAndBias(handle, wd, cc.CUDNN_DEFAULT_REORDER, w, rw, 1, b, rb)
    np.testing.assert_array_equal(rw, w)
    np.testing.assert_array_equal(rb, b)
    rb2 = np.full(2, 7, np.float32)
    cc.reorderFilterAndBias(handle, wd, cc.CUDNN_NO_REORDER, w, rw, 0, b, rb2)
    assert np.all(rb2 == 7)  # reorderBias <= 0: the bias is left alone
    with pytest.raises(cc.CuDNNError) as e:  # rule: valid cudnnReorderType_t
        cc.reorderFilterAndBias(handle, wd, 5, w, rw, 0, None, None)
    assert e.value.status == BAD


# -- im2col ------------------------------------------------------------------------------

def im2col_ref(x, r, s, pad, stride, dil, flip):
    n, c, h, w = x.shape
    ho = (h + 2 * pad[0] - ((r - 1) * dil[0] + 1)) // stride[0] + 1
    wo = (w + 2 * pad[1] - ((s - 1) * dil[1] + 1)) // stride[1] + 1
    a = np.zeros((n * ho * wo, c * r * s))
    for ni, i, j, ci, ri, si in itertools.product(range(n), range(ho), range(wo), range(c), range(r), range(s)):
        rr, ss = (r - 1 - ri, s - 1 - si) if flip else (ri, si)
        hh, ww = i * stride[0] + rr * dil[0] - pad[0], j * stride[1] + ss * dil[1] - pad[1]
        if 0 <= hh < h and 0 <= ww < w:
            a[(ni * ho + i) * wo + j, (ci * r + ri) * s + si] = x[ni, ci, hh, ww]
    return a


@pytest.mark.parametrize("mode", [cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_CONVOLUTION])
def test_im2col_against_loops(handle, rng, mode):
    x = rng.standard_normal((2, 3, 6, 5))
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, F64, NCHW, 4, 3, 3, 2)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 2, 2, 1, 2, 1, mode, F64)
    want = im2col_ref(x, 3, 2, (1, 2), (2, 1), (2, 1), mode == cc.CUDNN_CONVOLUTION)
    col = np.full(want.size, np.nan)
    cc.cudnnIm2Col(handle, tdesc(x.shape, F64), x, wd, cd, col)
    np.testing.assert_array_equal(col.reshape(want.shape), want)


def test_im2col_errors(handle):
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, F32, NCHW, 4, 1, 1, 1)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    cc.cudnnSetConvolutionGroupCount(cd, 2)
    col = np.full(8, 7, np.float32)
    with pytest.raises(cc.CuDNNError) as e:  # rule: groupCount > 1 is NOT_SUPPORTED
        cc.im2Col(handle, tdesc((1, 2, 2, 2)), np.ones(8, np.float32), wd, cd, col)
    assert e.value.status == UNSUP
    with pytest.raises(cc.CuDNNError) as e:  # rule: NULL colBuffer
        cc.im2Col(handle, tdesc((1, 2, 2, 2)), np.ones(8, np.float32), wd, cd, None)
    assert e.value.status == BAD
    i8 = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(i8, cc.CUDNN_DATA_INT8, NCHW, 4, 2, 1, 1)
    cc.cudnnSetConvolutionGroupCount(cd, 1)
    with pytest.raises(cc.CuDNNError) as e:  # rule: INT8 is NOT_SUPPORTED
        cc.im2Col(handle, tdesc((1, 2, 2, 2), cc.CUDNN_DATA_INT8), np.ones(8, np.int8), i8, cd, col)
    assert e.value.status == UNSUP
    assert np.all(col == 7)


# -- folded backward data ----------------------------------------------------------------

def bwd_data_ref(w, dy, pad, stride, hw):
    """dx[n, c, i, j] = sum of dy[n, k, o, p] * w[k, c, r, s] over o*u + r - pad = i (cross-correlation)."""
    n, k, ho, wo = dy.shape
    _, c, r, s = w.shape
    dxp = np.zeros((n, c, hw[0] + 2 * pad[0], hw[1] + 2 * pad[1]))
    for o, p in itertools.product(range(ho), range(wo)):
        dxp[:, :, o * stride[0]:o * stride[0] + r, p * stride[1]:p * stride[1] + s] += np.einsum("nk,kcrs->ncrs",
                                                                                                 dy[:, :, o, p], w)
    return dxp[:, :, pad[0]:pad[0] + hw[0], pad[1]:pad[1] + hw[1]]


@pytest.mark.parametrize("case", [
    dict(n=2, c=3, k=4, hw=(7, 6), rs=(3, 2), stride=(2, 3), pad=(1, 2), fmt=NCHW, dtype=F64),
    dict(n=1, c=2, k=3, hw=(9, 8), rs=(5, 4), stride=(3, 2), pad=(0, 3), fmt=NHWC, dtype=F32),
    dict(n=1, c=2, k=3, hw=(5, 5), rs=(1, 1), stride=(2, 2), pad=(0, 0), fmt=NCHW, dtype=F64),
])
def test_folded_backward_data_equals_the_strided_one(handle, rng, case):
    dt = np.float64 if case["dtype"] == F64 else np.float32
    (r, s), (u, v), (ph, pw), (h, w_) = case["rs"], case["stride"], case["pad"], case["hw"]
    n, c, k = case["n"], case["c"], case["k"]
    wdesc = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wdesc, case["dtype"], NCHW, k, c, r, s)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, ph, pw, u, v, 1, 1, cc.CUDNN_CROSS_CORRELATION, case["dtype"])
    xd = tdesc((n, c, h, w_), case["dtype"])
    out = cc.cudnnGetConvolution2dForwardOutputDim(cd, xd, wdesc)
    w, dy = rng.standard_normal((k, c, r, s)).astype(dt), rng.standard_normal(out).astype(dt)
    dyd = tdesc(out, case["dtype"])
    ff, pdd, fg = cc.cudnnCreateFilterDescriptor(), cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    fc = cc.cudnnCreateConvolutionDescriptor()
    trans = [cc.cudnnCreateTensorTransformDescriptor() for _ in range(4)]
    cc.cudnnGetFoldedConvBackwardDataDescriptors(handle, wdesc, dyd, cd, xd, case["fmt"], ff, pdd, fc, fg, *trans)
    assert cc.getConvolutionNdDescriptor(fc)[2] == [1, 1]  # the folded convolution has stride 1
    assert cc.getFilterNdDescriptor(ff)[3][1] == c * u * v and cc.getTensorNdDescriptor(fg)[2][1] == c * u * v
    wf = np.zeros(cc.cudnnGetFilterSizeInBytes(ff) // np.dtype(dt).itemsize, dt)
    cc.cudnnTransformFilter(handle, trans[0], 1.0, wdesc, w, 0.0, ff, wf)
    dyp = np.zeros(cc.cudnnGetTensorSizeInBytes(pdd) // np.dtype(dt).itemsize, dt)
    cc.cudnnTransformTensorEx(handle, trans[1], 1.0, dyd, dy, 0.0, pdd, dyp)
    dxf = np.zeros(cc.cudnnGetTensorSizeInBytes(fg) // np.dtype(dt).itemsize, dt)
    algo = cc.cudnnGetConvolutionBackwardDataAlgorithm(handle, ff, pdd, fc, fg, cc.CUDNN_CONVOLUTION_BWD_DATA_PREFER_FASTEST, 0)
    cc.cudnnConvolutionBackwardData(handle, 1.0, ff, wf, pdd, dyp, fc, algo, None, 0, 0.0, fg, dxf)
    dx = np.zeros((n, c, h, w_), dt)
    cc.cudnnTransformTensorEx(handle, trans[3], 1.0, fg, dxf, 0.0, xd, dx)
    want = bwd_data_ref(w.astype(np.float64), dy.astype(np.float64), (ph, pw), (u, v), (h, w_))
    np.testing.assert_allclose(dx, want, rtol=1e-5 if dt == np.float32 else 1e-12, atol=1e-5 if dt == np.float32 else 1e-12)
    # the grad fold transform is the inverse of the unfold one
    refold = np.zeros_like(dxf)
    cc.cudnnTransformTensorEx(handle, trans[2], 1.0, xd, dx, 0.0, fg, refold)
    dx2 = np.zeros_like(dx)
    cc.cudnnTransformTensorEx(handle, trans[3], 1.0, fg, refold, 0.0, xd, dx2)
    np.testing.assert_array_equal(dx2, dx)


def test_folded_descriptor_errors(handle):
    wdesc = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wdesc, F32, NCHW, 2, 2, 3, 3)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 2, 2, 2, 2, cc.CUDNN_CROSS_CORRELATION, F32)
    xd = tdesc((1, 2, 8, 8))
    out = cc.cudnnGetConvolution2dForwardOutputDim(cd, xd, wdesc)
    outs = [cc.cudnnCreateFilterDescriptor(), cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateConvolutionDescriptor(),
            cc.cudnnCreateTensorDescriptor()] + [cc.cudnnCreateTensorTransformDescriptor() for _ in range(4)]
    with pytest.raises(cc.CuDNNError) as e:  # rule: dilation 1
        cc.getFoldedConvBackwardDataDescriptors(handle, wdesc, tdesc(out), cd, xd, NCHW, *outs)
    assert e.value.status == UNSUP and "dilation" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # rule: more than 4 dims is BAD_PARAM
        cc.getFoldedConvBackwardDataDescriptors(handle, wdesc, tdesc((1, 2, 2, 2, 2)), cd, xd, NCHW, *outs)
    assert e.value.status == BAD
    with pytest.raises(cc.CuDNNError) as e:  # rule: NULL outputs
        cc.getFoldedConvBackwardDataDescriptors(handle, wdesc, tdesc(out), cd, xd, NCHW, None, *outs[1:])
    assert e.value.status == BAD


@pytest.mark.gpu
def test_gpu_fold_unfold_and_im2col_match_the_cpu(handle, rng):
    import cupy
    g = cc.cudnnCreate("gpu")
    try:
        x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
        t = transform(4, NHWC, [0, 0, 1, 0], [0, 0, 0, 2], [2, 3], FOLD)
        yd = cc.cudnnCreateTensorDescriptor()
        n = cc.cudnnInitTransformDest(t, tdesc(x.shape), yd) // 4
        y_cpu, y_gpu = np.zeros(n, np.float32), cupy.zeros(n, cupy.float32)
        cc.transformTensorEx(handle, t, 1.0, tdesc(x.shape), x, 0.0, yd, y_cpu)
        cc.transformTensorEx(g, t, 1.0, tdesc(x.shape), cupy.asarray(x), 0.0, yd, y_gpu)
        np.testing.assert_array_equal(cupy.asnumpy(y_gpu), y_cpu)
        u = transform(4, NCHW, [0, 0, 1, 0], [0, 0, 0, 2], [2, 3], UNFOLD)
        z = cupy.zeros(x.shape, cupy.float32)
        cc.transformTensorEx(g, u, 1.0, yd, y_gpu, 0.0, tdesc(x.shape), z)
        np.testing.assert_array_equal(cupy.asnumpy(z), x)
        wd = cc.cudnnCreateFilterDescriptor()
        cc.cudnnSetFilter4dDescriptor(wd, F32, NCHW, 2, 3, 3, 3)
        cd = cc.cudnnCreateConvolutionDescriptor()
        cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 2, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
        want = im2col_ref(x.astype(np.float64), 3, 3, (1, 1), (2, 1), (1, 1), False)
        col = cupy.zeros(want.size, cupy.float32)
        cc.im2Col(g, tdesc(x.shape), cupy.asarray(x), wd, cd, col)
        np.testing.assert_allclose(cupy.asnumpy(col).reshape(want.shape), want, rtol=1e-6)
    finally:
        cc.cudnnDestroy(g)
