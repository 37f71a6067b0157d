"""Helpers of the convolution tests: descriptors, strided buffers, bfloat16 bits, and a direct-loop
convolution written here (independent of the library's kernels)."""
import itertools

import numpy as np

import cudnn_compat as cc
from conftest import tdesc

CROSS, CONV = cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_CONVOLUTION
NCHW, NHWC = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC
FLOAT, DOUBLE, HALF, BF16 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_HALF, cc.CUDNN_DATA_BFLOAT16
INT8, UINT8, INT32 = cc.CUDNN_DATA_INT8, cc.CUDNN_DATA_UINT8, cc.CUDNN_DATA_INT32
STORAGE = {FLOAT: np.float32, DOUBLE: np.float64, HALF: np.float16, BF16: np.uint16, INT8: np.int8, UINT8: np.uint8}


def cdesc(pad, stride=None, dil=None, mode=CROSS, compute=FLOAT, groups=1, math=None):
    """A convolution descriptor (2-d through Set2d, else SetNd)."""
    n = len(pad)
    stride, dil = stride or (1,) * n, dil or (1,) * n
    d = cc.cudnnCreateConvolutionDescriptor()
    if n == 2:
        cc.cudnnSetConvolution2dDescriptor(d, pad[0], pad[1], stride[0], stride[1], dil[0], dil[1], mode, compute)
    else:
        cc.cudnnSetConvolutionNdDescriptor(d, n, list(pad), list(stride), list(dil), mode, compute)
    if groups != 1:
        cc.cudnnSetConvolutionGroupCount(d, groups)
    if math is not None:
        cc.cudnnSetConvolutionMathType(d, math)
    return d


def fdesc(shape, dtype=FLOAT, fmt=NCHW):
    d = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(d, dtype, fmt, len(shape), list(shape))
    return d


def layout_strides(shape, layout):
    """Element strides of a logical N,C,spatial... shape: 'NCHW', 'NHWC' or 'padded' (gaps)."""
    n = len(shape)
    order = list(range(n)) if layout != "NHWC" else [0] + list(range(2, n)) + [1]
    strides, acc = [0] * n, 1
    for ax in reversed(order):
        strides[ax] = acc
        acc *= shape[ax] + (1 if layout == "padded" and ax == n - 1 else 0)
    return tuple(strides)


def desc_for(shape, dtype, layout):
    """Tensor descriptor for ``layout`` ('NCHW', 'NHWC' through the format, 'padded' through strides)."""
    if layout == "padded":
        return tdesc(shape, dtype, strides=layout_strides(shape, layout))
    return tdesc(shape, dtype, fmt=NHWC if layout == "NHWC" else NCHW)


def strided(values, strides, storage, fill=0):
    """(flat buffer holding ``values`` at element ``strides``, logical view of it)."""
    size = 1 + sum((d - 1) * s for d, s in zip(values.shape, strides))
    buf = np.full(size, fill, storage)
    view = np.lib.stride_tricks.as_strided(buf, values.shape, [s * buf.itemsize for s in strides])
    view[...] = values
    return buf, view


def bf16_bits(values):
    """float values that bfloat16 holds exactly -> their 16-bit patterns."""
    u = np.asarray(values, np.float32).view(np.uint32)
    assert np.all(u & 0xFFFF == 0), "values must be exactly representable in bfloat16"
    return (u >> 16).astype(np.uint16)


def bf16_values(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def round_bf16(values):
    """Truncate float values to ones bfloat16 holds exactly (test inputs)."""
    u = np.asarray(values, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return u.view(np.float32).astype(np.float64)


def ref_conv(x, w, pad, stride, dil, groups=1, mode=CROSS):
    """y[n,k,o] = sum_{c in k's group, r} x[n, c, o*stride - pad + r*dil] * w'[k, c, r]; w' is w
    flipped in every spatial dim for CUDNN_CONVOLUTION.  Loops over output positions and taps."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    sp, rs = x.shape[2:], w.shape[2:]
    if mode == CONV:
        w = w[(slice(None), slice(None)) + (slice(None, None, -1),) * len(rs)]
    out = [1 + (s + 2 * p - ((r - 1) * d + 1)) // u for s, r, p, u, d in zip(sp, rs, pad, stride, dil)]
    y = np.zeros([n, k] + out)
    kg = k // groups
    for o in itertools.product(*(range(m) for m in out)):
        for r in itertools.product(*(range(m) for m in rs)):
            pos = [oi * u - p + ri * d for oi, u, p, ri, d in zip(o, stride, pad, r, dil)]
            if not all(0 <= q < s for q, s in zip(pos, sp)):
                continue
            xv = x[(slice(None), slice(None)) + tuple(pos)].reshape(n, groups, cg)
            wv = w[(slice(None), slice(None)) + r].reshape(groups, kg, cg)
            y[(slice(None), slice(None)) + o] += np.einsum("ngc,gkc->ngk", xv, wv).reshape(n, k)
    return y


def out_shape(xshape, wshape, pad, stride, dil):
    return (xshape[0], wshape[0]) + tuple(1 + (s + 2 * p - ((r - 1) * d + 1)) // u for s, r, p, u, d in
                                           zip(xshape[2:], wshape[2:], pad, stride, dil))


def _taps(x_sp, w_sp, y_sp, pad, stride, dil):
    """(output position, tap, input position) for every in-bounds tap of every output."""
    for o in itertools.product(*(range(m) for m in y_sp)):
        for r in itertools.product(*(range(m) for m in w_sp)):
            pos = tuple(oi * u - p + ri * d for oi, u, p, ri, d in zip(o, stride, pad, r, dil))
            if all(0 <= q < s for q, s in zip(pos, x_sp)):
                yield o, r, pos


def _flip(w):
    return w[(slice(None), slice(None)) + (slice(None, None, -1),) * (w.ndim - 2)]


def ref_bwd_data(dy, w, x_shape, pad, stride, dil, groups=1, mode=CROSS):
    """dx[n, c, o*stride - pad + r*dil] += dy[n, k, o] * w'[k, c, r] (the scatter of ref_conv)."""
    dy, w = np.asarray(dy, np.float64), np.asarray(w, np.float64)
    w = _flip(w) if mode == CONV else w
    n, c = x_shape[:2]
    k, cg = w.shape[:2]
    dx = np.zeros(x_shape)
    for o, r, pos in _taps(x_shape[2:], w.shape[2:], dy.shape[2:], pad, stride, dil):
        dyv = dy[(slice(None), slice(None)) + o].reshape(n, groups, k // groups)
        wv = w[(slice(None), slice(None)) + r].reshape(groups, k // groups, cg)
        dx[(slice(None), slice(None)) + pos] += np.einsum("ngk,gkc->ngc", dyv, wv).reshape(n, c)
    return dx


def ref_bwd_filter(x, dy, w_shape, pad, stride, dil, groups=1, mode=CROSS):
    """dw'[k, c, r] = sum_{n,o} dy[n, k, o] * x[n, c, o*stride - pad + r*dil]; dw = w' flipped back."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    n = x.shape[0]
    k, cg = w_shape[:2]
    dw = np.zeros(w_shape)
    for o, r, pos in _taps(x.shape[2:], w_shape[2:], dy.shape[2:], pad, stride, dil):
        dyv = dy[(slice(None), slice(None)) + o].reshape(n, groups, k // groups)
        xv = x[(slice(None), slice(None)) + pos].reshape(n, groups, cg)
        dw[(slice(None), slice(None)) + r] += np.einsum("ngk,ngc->gkc", dyv, xv).reshape(k, cg)
    return _flip(dw) if mode == CONV else dw
