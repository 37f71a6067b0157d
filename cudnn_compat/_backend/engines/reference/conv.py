"""Reference kernels for the convolution ops (002 §5.2.10 ConvolutionForward, §5.2.8
ConvolutionBackwardData, §6.2.2 ConvolutionBackwardFilter; attrs as documented in
``cudnn_compat/_backend/ops/convolution.py``).

One loop over the filter taps (R*S[*T] iterations); each tap is a batched matmul over the
groups of a strided slice of the zero-padded input, so memory stays at the input's size.
Everything is float64; CONVOLUTION mode is cross-correlation with the filter flipped.
BackwardData and BackwardFilter are the exact adjoints of Forward in x and in w.
"""
from __future__ import annotations

import itertools

import numpy as np

from ._kernels import kernel
from ...ops.convolution import geometry


def _taps(w_spatial, y_spatial, stride, dilation):
    """(tap index, slice of the padded input that the tap reads for every output position)."""
    for r in itertools.product(*(range(n) for n in w_spatial)):
        yield r, tuple(slice(ri * d, ri * d + (o - 1) * s + 1, s)
                       for ri, d, o, s in zip(r, dilation, y_spatial, stride))


def _oriented(w, mode):
    """The filter as cross-correlation weights (flipped for CONVOLUTION)."""
    if mode == "CONVOLUTION":
        return w[(slice(None), slice(None)) + (slice(None, None, -1),) * (w.ndim - 2)]
    return w


def _grouped(a, groups):
    """(N, C, *sp) -> (N, g, C/g, prod(sp))"""
    n, c = a.shape[:2]
    return a.reshape(n, groups, c // groups, -1)


@kernel("ConvolutionForward")
def conv_forward(op, ins):
    x, w = ins["x"], _oriented(ins["w"], op.attrs["mode"])
    pre, post, stride, dil, g = geometry(op)
    y_dims = op.outputs["y"].dims
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(pre, post)))
    wg = w.reshape(g, w.shape[0] // g, w.shape[1], *w.shape[2:])  # (g, K/g, C/g, *R)
    y = np.zeros((x.shape[0], g, w.shape[0] // g, int(np.prod(y_dims[2:]))))
    for r, sl in _taps(w.shape[2:], y_dims[2:], stride, dil):
        xs = _grouped(xp[(slice(None), slice(None)) + sl], g)  # (N, g, C/g, O)
        y += np.matmul(wg[(Ellipsis,) + r], xs)  # (g, K/g, C/g) @ (N, g, C/g, O)
    return {"y": y.reshape(y_dims)}


@kernel("ConvolutionBackwardData")
def conv_backward_data(op, ins):
    dy, w = ins["dy"], _oriented(ins["w"], op.attrs["mode"])
    pre, post, stride, dil, g = geometry(op)
    dx_dims = op.outputs["dx"].dims
    n, c = dx_dims[:2]
    padded = [s + a + b for s, a, b in zip(dx_dims[2:], pre, post)]
    dxp = np.zeros((n, c) + tuple(padded))
    wt = np.swapaxes(w.reshape(g, w.shape[0] // g, w.shape[1], *w.shape[2:]), 1, 2)  # (g, C/g, K/g, *R)
    dyg = _grouped(dy, g)  # (N, g, K/g, O)
    for r, sl in _taps(w.shape[2:], dy.shape[2:], stride, dil):
        dxp[(slice(None), slice(None)) + sl] += np.matmul(wt[(Ellipsis,) + r], dyg).reshape((n, c) + dy.shape[2:])
    crop = tuple(slice(a, a + s) for a, s in zip(pre, dx_dims[2:]))
    return {"dx": dxp[(slice(None), slice(None)) + crop]}


@kernel("ConvolutionBackwardFilter")
def conv_backward_filter(op, ins):
    x, dy = ins["x"], ins["dy"]
    pre, post, stride, dil, g = geometry(op)
    dw_dims = op.outputs["dw"].dims
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(pre, post)))
    dyg = _grouped(dy, g)  # (N, g, K/g, O)
    dw = np.zeros((g, dw_dims[0] // g, dw_dims[1]) + tuple(dw_dims[2:]))
    for r, sl in _taps(dw_dims[2:], dy.shape[2:], stride, dil):
        xs = _grouped(xp[(slice(None), slice(None)) + sl], g)  # (N, g, C/g, O)
        dw[(Ellipsis,) + r] = np.matmul(dyg, np.swapaxes(xs, -1, -2)).sum(axis=0)  # (g, K/g, C/g)
    return {"dw": _oriented(dw.reshape(dw_dims), op.attrs["mode"])}
