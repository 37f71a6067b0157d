"""Reference kernels for ResampleForward / ResampleBackward: pooling (002 §3.2.69
cudnnPoolingForward, §4.1.18 cudnnPoolingBackward, §3.1.2.19 cudnnPoolingMode_t).

Attrs (validated in ``ops/resample_norm``):
  mode             'MAXPOOL' | 'AVGPOOL_INCLUDE_PADDING' | 'AVGPOOL_EXCLUDE_PADDING'
  window, stride   per spatial dim, > 0
  pre_padding      per spatial dim, may be negative (002 §3.2.86); output index o of a
                   spatial dim covers input indices o*stride - pre_padding + k, k < window
  post_padding     per spatial dim; it only bounds the nominal output size.  y may be
                   smaller or larger than that size (002 §3.2.69): every window position
                   outside the input is padding
  nan_propagation  'PROPAGATE' | 'NOT_PROPAGATE' (max modes)

Semantics:
  MAXPOOL          max over the window's input elements, padding ignored; a window with no
                   input element (or only NaNs under NOT_PROPAGATE) gives the lowest finite
                   value of the compute type (-FLT_MAX, or -DBL_MAX for double), as cuDNN does.
  AVGPOOL_INCLUDE  sum of the window's input elements / window volume (padding counts as 0).
  AVGPOOL_EXCLUDE  sum / number of input elements in the window; 0 for an empty window.
Backward: average modes spread dy/count over the window's input elements; MAXPOOL routes
each dy to the first maximal input element of its window in row-major window order (the
first max in a left-to-right, top-to-bottom scan), recomputed from x; cuDNN's legacy kernel
locates the same element from x and y.  Overlapping windows accumulate.
"""
from __future__ import annotations

import numpy as np

from ._kernels import kernel


def _windows(op, xshape, yshape):
    """Input index and validity per (output position, window position).

    Returns (flat_idx, valid) of shape (prod(y spatial), prod(window)): the row-major flat
    index into x's spatial block (clipped where invalid) and whether it lies inside x."""
    a = op.attrs
    s = len(xshape) - 2
    idx_parts, valid_parts = [], []
    for d in range(s):
        o = np.arange(yshape[2 + d])[:, None]
        k = np.arange(a["window"][d])[None, :]
        i = o * a["stride"][d] - a["pre_padding"][d] + k
        idx_parts.append(i)
        valid_parts.append((i >= 0) & (i < xshape[2 + d]))
    # combine dims: axes (O1, K1, O2, K2, ...) -> (O1, O2, ..., K1, K2, ...)
    flat = np.zeros((1,) * (2 * s), dtype=np.int64)
    valid = np.ones((1,) * (2 * s), dtype=bool)
    for d in range(s):
        shape = [1] * (2 * s)
        shape[2 * d], shape[2 * d + 1] = idx_parts[d].shape
        inner = int(np.prod(xshape[3 + d:], dtype=np.int64))
        clipped = np.clip(idx_parts[d], 0, xshape[2 + d] - 1)
        flat = flat + (clipped * inner).reshape(shape)
        valid = valid & valid_parts[d].reshape(shape)
    order = [2 * d for d in range(s)] + [2 * d + 1 for d in range(s)]
    n_out = int(np.prod(yshape[2:]))
    n_win = int(np.prod(a["window"]))
    return flat.transpose(order).reshape(n_out, n_win), valid.transpose(order).reshape(n_out, n_win)


def _lowest(op) -> float:
    return float(np.finfo(np.float64 if op.inputs["x"].dtype == "float64" else np.float32).min)


def _gather(x, flat):
    """x (N, C, spatial...) -> (N, C, n_out, n_win) window values."""
    n, c = x.shape[:2]
    return x.reshape(n, c, -1)[:, :, flat]


def _max_hits(op, win, valid):
    """(result, hit): the window max and a one-hot mask of the element it routes to."""
    eligible = valid if op.attrs.get("nan_propagation", "NOT_PROPAGATE") == "PROPAGATE" else valid & ~np.isnan(win)
    vals = np.where(eligible, win, -np.inf)
    m = np.max(vals, axis=-1, keepdims=True)  # NaN when an eligible NaN is present
    hit = eligible & ((win == m) | (np.isnan(win) & np.isnan(m)))
    first = np.argmax(hit, axis=-1)[..., None]
    any_hit = np.take_along_axis(hit, first, axis=-1)
    onehot = (np.arange(win.shape[-1]) == first) & any_hit
    result = np.where(eligible.any(axis=-1, keepdims=True), m, _lowest(op))[..., 0]
    return result, onehot


def _avg_weights(op, valid):
    """Per (output, window position) weight 1/count, 0 outside the input."""
    if op.attrs["mode"] == "AVGPOOL_INCLUDE_PADDING":
        count = np.full((valid.shape[0], 1), valid.shape[1], dtype=np.float64)
    else:
        count = valid.sum(axis=-1, keepdims=True).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(valid & (count > 0), 1.0 / np.maximum(count, 1.0), 0.0)


@kernel("ResampleForward")
def resample_forward(op, ins):
    x = ins["x"]
    yd = op.outputs["y"].dims
    flat, valid = _windows(op, x.shape, yd)
    win = _gather(x, flat)
    if op.attrs["mode"] == "MAXPOOL":
        y, _ = _max_hits(op, win, valid)
    else:
        y = np.sum(np.where(valid, win, 0.0) * _avg_weights(op, valid), axis=-1)
    return {"y": y.reshape(yd)}


@kernel("ResampleBackward")
def resample_backward(op, ins):
    x, dy = ins["x"], ins["dy"]
    flat, valid = _windows(op, x.shape, dy.shape)
    n, c = x.shape[:2]
    dyf = dy.reshape(n, c, -1, 1)
    if op.attrs["mode"] == "MAXPOOL":
        _, onehot = _max_hits(op, _gather(x, flat), valid)
        contrib = np.where(onehot, dyf, 0.0)  # (N, C, n_out, n_win)
    else:
        contrib = dyf * _avg_weights(op, valid)
    keep = valid.reshape(-1)
    idx = flat.reshape(-1)[keep]
    vals = contrib.reshape(n * c, -1)[:, keep]
    dx = np.zeros((int(np.prod(x.shape[2:])), n * c))
    np.add.at(dx, idx, vals.T)
    return {"dx": dx.T.reshape(x.shape)}
