"""Convolution kernels of the numpy engine (002 §5.2.10 ConvolutionForward, §5.2.8
ConvolutionBackwardData, §6.2.2 ConvolutionBackwardFilter; attrs and shapes in
``cudnn_compat/_backend/ops/convolution.py``), lowered to BLAS GEMMs in the compute dtype.

With g groups, x (N, C, *S), w (K, C/g, *R), y (N, K, *O), the filter as a matrix
W (g, K/g, C/g*R) and the im2col matrix X(n) (g, C/g*R, O) of the zero-padded input
(X[c, r, o] = xp[c, o*stride + r*dilation]):

    forward          y(n)  = W @ X(n)
    backward data    dx    = col2im(W^T @ dy(n))   (each filter tap's rows added back into dxp); with
                     stride 1 instead the forward GEMM of dy padded by the dilated filter
                     extent minus the padding, with the filter flipped and transposed
    backward filter  dw    = sum_n dy(n) @ X(n)^T

CONVOLUTION mode is cross-correlation with the filter flipped in every spatial dim (dw flipped
back).  A 1x1, stride-1, unpadded convolution is one GEMM on x itself (no im2col).  Otherwise the
GEMMs run per block of samples and rows of the first output dim, so the im2col matrix of one block
stays under ``BLOCK_BYTES`` (8 MiB; one sample's row wider than that is still one block).

Small outputs (the later layers of a network, a few pixels per sample) fold the samples into the
GEMM instead: when the im2col matrix of every sample fits ``BLOCK_BYTES`` it is made once in
(C, *R, N, *O) order, and forward is one GEMM per group, W @ X with N*O columns (y written from
its (K, N, *O) result); backward filter is one GEMM per group, dy(K, N*O) @ X^T, when the per-sample
GEMMs' inner dimension O is short enough that their K x C/g*R partial results would cost more
than transposing dy (``_fold_filter``: O * (K/g + C/g*R) <= 4 * K/g * C/g*R), where summing
N partial results goes away.
Temporary memory: that block, its GEMM result (the block's share of y/dy), and a zero-padded
C-contiguous copy of x (forward, backward filter: only when x is padded or not NCHW-packed) or of
dx (backward data: when padded or not written into the caller's packed dx).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._kernels import kernel
from ...ops.convolution import geometry

BLOCK_BYTES = 8 << 20


def _oriented(w, mode):
    """The filter as cross-correlation takes it: flipped in every spatial dim for CONVOLUTION, as a
    packed copy (a negative-stride view keeps matmul off BLAS: 2-3x slower in the GEMMs)."""
    if mode == "CONVOLUTION":
        return np.ascontiguousarray(w[(slice(None), slice(None)) + (slice(None, None, -1),) * (w.ndim - 2)])
    return w


def _padded(x, pre, post, dt):
    """x as a C-contiguous (N, C, *padded) array: x itself when packed and unpadded."""
    if not any(pre) and not any(post) and x.flags.c_contiguous:
        return x
    xp = np.zeros(x.shape[:2] + tuple(s + a + b for s, a, b in zip(x.shape[2:], pre, post)), dt)
    xp[(slice(None),) * 2 + tuple(slice(a, a + s) for a, s in zip(pre, x.shape[2:]))] = x
    return xp


def _windows(xp, kdims, odims, stride, dil):
    """Read-only (N, C, *R, *O) view: xp[n, c, o*stride + r*dilation]."""
    st = xp.strides
    return as_strided(xp, xp.shape[:2] + tuple(kdims) + tuple(odims),
                      st[:2] + tuple(s * d for s, d in zip(st[2:], dil)) + tuple(s * u for s, u in zip(st[2:], stride)),
                      writeable=False)


def _blocks(n, odims, row_bytes):
    """(n0, n1, o0, o1): samples and first-output-dim rows whose im2col fits BLOCK_BYTES."""
    rows = max(1, BLOCK_BYTES // max(1, row_bytes))
    if rows >= odims[0]:
        nb = max(1, rows // odims[0])
        for n0 in range(0, n, nb):
            yield n0, min(n, n0 + nb), 0, odims[0]
    else:
        for n0 in range(n):
            for o0 in range(0, odims[0], rows):
                yield n0, n0 + 1, o0, min(odims[0], o0 + rows)


def _pointwise_1x1(kdims, pre, post, stride):
    return all(r == 1 for r in kdims) and not any(pre) and not any(post) and all(s == 1 for s in stride)


def _im2col(win, n0, n1, o0, o1, buf):
    """Copy the windows of samples n0:n1, rows o0:o1 into ``buf`` (nb, C, *R, rows, *O[1:])."""
    nsp = (win.ndim - 2) // 2
    sub = win[(slice(n0, n1), slice(None)) + (slice(None),) * nsp + (slice(o0, o1),)]
    dst = buf[:sub.size].reshape(sub.shape)
    np.copyto(dst, sub)
    return dst


def _dest(out, role, dims, dt, *ins):
    d = out.get(role)
    if d is None or any(np.may_share_memory(d, v) for v in ins):
        return np.empty(dims, dt)
    return d


def _whole_col(win, g, dt):
    """The im2col matrix of every sample, (g, C/g*R, N*O): ``win`` (N, C, *R, *O) copied into
    (C, *R, N, *O) order."""
    nsp = (win.ndim - 2) // 2
    n, c = win.shape[:2]
    col = np.empty((c,) + win.shape[2:2 + nsp] + (n,) + win.shape[2 + nsp:], dt)
    np.copyto(col.transpose((nsp + 1, 0) + tuple(range(1, nsp + 1)) + tuple(range(nsp + 2, 2 * nsp + 2))), win)
    return col.reshape(g, -1, n * math.prod(win.shape[2 + nsp:]))


def _fits_whole(n, c, kd, od, dt) -> bool:
    """Whether the im2col matrix of all ``n`` samples fits BLOCK_BYTES (and there is more than one)."""
    return n > 1 and n * c * math.prod(kd) * math.prod(od) * dt.itemsize <= BLOCK_BYTES


def _fold_filter(p: int, kg: int, crg: int) -> bool:
    """Backward filter: one GEMM over N*O columns beats N GEMMs of inner dimension ``p`` plus the
    sum of their K/g x C/g*R results (measured on ResNet layer shapes, float32, OpenBLAS)."""
    return p * (kg + crg) <= 4 * kg * crg


def _gemm_into(dst, a, b):
    """dst[...] = a @ b, through matmul's ``out`` when ``dst`` reshapes to the product's shape
    without a copy (a packed y, or a block of whole rows of it); else through a temporary."""
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    try:
        view = np.reshape(dst, shape, copy=False)
    except (ValueError, TypeError):  # the layout needs a copy (TypeError: NumPy < 2.1 has no copy=)
        dst[...] = np.matmul(a, b).reshape(dst.shape)
        return
    np.matmul(a, b, out=view)


def _forward(x, w, pre, post, stride, dil, g, y, dt):
    """y = the cross-correlation of x with w (groups g), written into ``y`` (N, K, *O)."""
    n, c, k, kd, od = x.shape[0], x.shape[1], w.shape[0], w.shape[2:], y.shape[2:]
    wg = w.reshape(g, k // g, -1)  # (g, K/g, C/g*R)
    if _pointwise_1x1(kd, pre, post, stride):
        _gemm_into(y, wg, x.reshape(n, g, c // g, -1))
        return y
    win = _windows(_padded(x, pre, post, dt), kd, od, stride, dil)
    if _fits_whole(n, c, kd, od, dt):  # one GEMM per group over every sample's columns
        np.copyto(y, np.matmul(wg, _whole_col(win, g, dt)).reshape((k, n) + tuple(od)).swapaxes(0, 1))
        return y
    rest = math.prod(od[1:])
    row = c * math.prod(kd) * rest
    buf = np.empty(min(n * od[0], max(1, BLOCK_BYTES // (row * dt.itemsize))) * row, dt)
    for n0, n1, o0, o1 in _blocks(n, od, row * dt.itemsize):
        col = _im2col(win, n0, n1, o0, o1, buf).reshape(n1 - n0, g, -1, (o1 - o0) * rest)
        _gemm_into(y[n0:n1, :, o0:o1], wg, col)
    return y


@kernel("ConvolutionForward")
def conv_forward(op, ins, dt, out):
    x, w = ins["x"], _oriented(ins["w"], op.attrs["mode"])
    pre, post, stride, dil, g = geometry(op)
    y = _dest(out, "y", op.outputs["y"].dims, dt, x, w)
    return {"y": _forward(x, w, pre, post, stride, dil, g, y, dt)}


@kernel("ConvolutionBackwardData")
def conv_backward_data(op, ins, dt, out):
    dy, w = ins["dy"], _oriented(ins["w"], op.attrs["mode"])
    pre, post, stride, dil, g = geometry(op)
    dxdims = op.outputs["dx"].dims
    n, c, k, kd, od = dxdims[0], dxdims[1], w.shape[0], w.shape[2:], dy.shape[2:]
    wt = np.swapaxes(w.reshape(g, k // g, -1), 1, 2)  # (g, C/g*R, K/g)
    dx = _dest(out, "dx", dxdims, dt, dy, w)
    if _pointwise_1x1(kd, pre, post, stride):
        _gemm_into(dx, wt, dy.reshape(n, g, k // g, -1))
        return {"dx": dx}
    span = [(r - 1) * d for r, d in zip(kd, dil)]
    if all(u == 1 for u in stride) and all(0 <= a <= e and 0 <= b <= e for a, b, e in zip(pre, post, span)):
        # stride 1: dx is the cross-correlation of dy, padded by span - padding, with the filter
        # flipped and its K and C/g swapped per group (no col2im)
        wf = _oriented(w, "CONVOLUTION").reshape((g, k // g, c // g) + tuple(kd))
        wf = np.ascontiguousarray(np.swapaxes(wf, 1, 2).reshape((c, k // g) + tuple(kd)))
        return {"dx": _forward(dy, wf, tuple(e - a for e, a in zip(span, pre)),
                               tuple(e - b for e, b in zip(span, post)), stride, dil, g, dx, dt)}
    unpadded = not any(pre) and not any(post)
    dxp = dx if unpadded and dx.flags.c_contiguous else \
        np.zeros((n, c) + tuple(s + a + b for s, a, b in zip(dxdims[2:], pre, post)), dt)
    if dxp is dx:
        dx[...] = 0
    rest = math.prod(od[1:])
    row = c * math.prod(kd) * rest
    for n0, n1, o0, o1 in _blocks(n, od, row * dt.itemsize):
        nb, rows = n1 - n0, o1 - o0
        dyb = dy[n0:n1, :, o0:o1].reshape(nb, g, k // g, rows * rest)
        col = np.matmul(wt, dyb).reshape((nb, c) + tuple(kd) + (rows,) + tuple(od[1:]))
        starts = (o0,) + (0,) * (len(od) - 1)
        counts = (rows,) + tuple(od[1:])
        for r in itertools.product(*(range(m) for m in kd)):
            sl = tuple(slice(ri * d + o * s, ri * d + (o + m - 1) * s + 1, s)
                       for ri, d, o, m, s in zip(r, dil, starts, counts, stride))
            dxp[(slice(n0, n1), slice(None)) + sl] += col[(slice(None), slice(None)) + r]
    if dxp is not dx:
        dx[...] = dxp[(slice(None),) * 2 + tuple(slice(a, a + s) for a, s in zip(pre, dxdims[2:]))]
    return {"dx": dx}


@kernel("ConvolutionBackwardFilter")
def conv_backward_filter(op, ins, dt, out):
    x, dy = ins["x"], ins["dy"]
    pre, post, stride, dil, g = geometry(op)
    dwdims = op.outputs["dw"].dims
    n, c, k, kd, od = x.shape[0], x.shape[1], dwdims[0], dwdims[2:], dy.shape[2:]
    if _fits_whole(n, c, kd, od, dt) and _fold_filter(math.prod(od), k // g, (c // g) * math.prod(kd)):
        # one GEMM per group: dy as (g, K/g, N*O) against every sample's columns
        dyt = np.ascontiguousarray(np.moveaxis(dy, 0, 1), dtype=dt).reshape(g, k // g, -1)
        if _pointwise_1x1(kd, pre, post, stride):
            col = np.ascontiguousarray(np.moveaxis(x, 0, 1), dtype=dt).reshape(g, c // g, -1)
        else:
            col = _whole_col(_windows(_padded(x, pre, post, dt), kd, od, stride, dil), g, dt)
        dw = np.matmul(dyt, np.swapaxes(col, 1, 2))
    elif _pointwise_1x1(kd, pre, post, stride):
        xg = x.reshape(n, g, c // g, -1)
        dw = np.matmul(dy.reshape(n, g, k // g, -1), np.swapaxes(xg, 2, 3)).sum(axis=0)
    else:
        win = _windows(_padded(x, pre, post, dt), kd, od, stride, dil)
        rest = math.prod(od[1:])
        row = c * math.prod(kd) * rest
        buf = np.empty(min(n * od[0], max(1, BLOCK_BYTES // (row * dt.itemsize))) * row, dt)
        dw = np.zeros((g, k // g, (c // g) * math.prod(kd)), dt)
        for n0, n1, o0, o1 in _blocks(n, od, row * dt.itemsize):
            nb, rows = n1 - n0, o1 - o0
            col = _im2col(win, n0, n1, o0, o1, buf).reshape(nb, g, -1, rows * rest)
            dyb = dy[n0:n1, :, o0:o1].reshape(nb, g, k // g, rows * rest)
            part = np.matmul(dyb, np.swapaxes(col, 2, 3))  # (nb, g, K/g, C/g*R)
            dw += part[0] if nb == 1 else part.sum(axis=0)
    return {"dw": _oriented(dw.reshape(dwdims), op.attrs["mode"])}
