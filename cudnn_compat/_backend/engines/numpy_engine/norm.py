"""``numpy`` engine kernels for NormForward / NormBackward: batch normalization, spatial and per
activation (002 §3.2.3 cudnnBatchNormalizationForwardInference, §4.1.4 ForwardTraining, §4.1.2
Backward; the cuDNN 8 normalization calls build the same graphs).  Formulas as the reference
engine's (reference/norm.py), with m the number of elements reduced per channel:
  TRAINING   mean = E[x], var = E[(x - mean)^2] (biased), inv = 1/sqrt(var + eps)
             y = (x - mean) * (scale*inv) + bias; saved_mean = mean, saved_inv_variance = inv
             next_running_mean = (1-f)*running_mean + f*mean
             next_running_var  = (1-f)*running_var + f*var*m/(m-1)
  INFERENCE  y = (x - mean) * (scale*inv_variance) + bias
  Backward   dbias = sum(dy), dscale = inv*sum(dy*(x - mean)),
             dx = scale*inv*dy - scale*inv^2*dscale/m*(x - mean) - scale*inv*dbias/m

Precision choice: full-size passes run in the compute dtype ``dt`` (float32 for float32 data);
every per-channel sum accumulates in float64 (``_sum``: a block of samples converted at a time,
or ``np.add.reduce(..., dtype=float64)`` casting in NumPy's internal buffers; never a full-size
float64 copy).  The variance is two-pass: training
writes d = x - mean_dt into y, sums d^2 blockwise, and var = E[d^2] - (mean - mean_dt)^2
corrects for mean_dt being the rounded mean; then y = d*(scale*inv) + bias in place (5 passes
over the data in all).  Per-channel scalars (inv, the dx coefficients) are formed in float64 and
rounded to dt once.  Temporaries: one block of at most max(BLOCK_ELEMENTS, one item of axis 0)
elements of dt, plus per-channel arrays (backward without saved statistics: one array of x's
size for x - mean).
"""
from __future__ import annotations

import numpy as np

from ._arrays import blocks, dest, empty_like_layout
from ._kernels import kernel

F64 = np.float64
SMALL_PLANE = 4  # ``_sum``: spatial planes of at most this many elements take the matrix-vector sums


def _scalar(op, ins, name):
    return float(ins[name]) if name in ins else float(op.attrs[name])


def _count(x, axes) -> int:
    return int(np.prod([x.shape[k] for k in axes]))


def _sum(a, axes):
    """Per-channel sums over ``axes``, accumulated in float64.  A C-contiguous spatial reduction
    (axes 0, 2, 3...: the channel axis kept) over small planes (at most SMALL_PLANE elements) runs
    as float64 matrix-vector products over blocks of samples (each block converted once,
    BLOCK_ELEMENTS at most): NumPy's multi-axis reduce with a float64 dtype walks such planes one
    by one (batch norm forward + backward at 8x512x2x2, 2-core EPYC, four in-process interleaved
    A/B runs: -26% to -32%; at 4x4 planes the runs ranged from -14% to +8%, at 8x8 and up the
    reduce is as fast or faster: those keep it)."""
    nd = a.ndim
    if nd >= 3 and a.size and a.flags.c_contiguous and axes == (0,) + tuple(range(2, nd)):
        n, c = a.shape[:2]
        plane = a.size // (n * c)
        if plane <= SMALL_PLANE:
            ones = np.ones(plane)
            acc = np.zeros(c)
            for blk in blocks(n, c * plane):
                acc += (a[blk].reshape(-1, c, plane).astype(F64) @ ones).sum(axis=0)
            return acc.reshape((1, c) + (1,) * (nd - 2))
    return np.add.reduce(a, axis=axes, dtype=F64, keepdims=True)


def _block_dot(a, b, axes, center=None):
    """sum over ``axes`` of (a - center) * b, or of a * b (float64), blockwise over axis 0."""
    acc, tmp = 0.0, None
    for blk in blocks(a.shape[0], a[:1].size):
        ab = a[blk]
        if tmp is None or tmp.shape != ab.shape:
            tmp = np.empty(ab.shape, dtype=a.dtype)
        if center is None:
            np.multiply(ab, b[blk], out=tmp)
        else:
            np.subtract(ab, center, out=tmp)
            np.multiply(tmp, b[blk], out=tmp)
        acc = acc + _sum(tmp, axes)
    return acc


def _moments(x, axes, dt, d):
    """(mean float64, mean in dt, biased var float64) per channel; ``d`` receives x - mean_dt
    (x's own buffer is never written).  var = E[d^2] - (mean - mean_dt)^2: E[d] is that shift."""
    m = _count(x, axes)
    mean = _sum(x, axes) / m
    mean_dt = mean.astype(dt)
    np.subtract(x, mean_dt, out=d)
    shift = mean - mean_dt
    return mean, mean_dt, np.maximum(_block_dot(d, d, axes) / m - shift * shift, 0.0)


def _affine(d, a, bias, y):
    """y = d * a + bias in two in-place passes."""
    np.multiply(d, a, out=y)
    np.add(y, bias, out=y)
    return y


@kernel("NormForward")
def norm_forward(op, ins, dt, out):
    """Batch norm forward, TRAINING or INFERENCE (002 §3.2.3, §4.1.4); see the module text."""
    x, axes = ins["x"], tuple(op.attrs["axes"])
    y = dest(out, "y", x, x.shape, dt)
    scale, bias = ins["scale"], ins["bias"]
    if op.attrs["phase"] == "INFERENCE":
        a = (scale.astype(F64) * ins["inv_variance"]).astype(dt)
        np.subtract(x, ins["mean"], out=y)
        return {"y": _affine(y, a, bias, y)}
    mean, mean_dt, var = _moments(x, axes, dt, y)  # y holds x - mean from here
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / np.sqrt(var + _scalar(op, ins, "epsilon"))
    res = {"y": _affine(y, (scale * inv).astype(dt), bias, y),
           "saved_mean": mean_dt, "saved_inv_variance": inv.astype(dt)}
    if "running_mean" in ins:
        f = _scalar(op, ins, "exp_avg_factor")
        m = _count(x, axes)
        unbiased = var * (m / (m - 1.0)) if m > 1 else np.full_like(var, np.nan)
        res["next_running_mean"] = ((1.0 - f) * ins["running_mean"].astype(F64) + f * mean).astype(dt)
        res["next_running_var"] = ((1.0 - f) * ins["running_var"].astype(F64) + f * unbiased).astype(dt)
    return res


@kernel("NormBackward")
def norm_backward(op, ins, dt, out):
    """Batch norm backward (002 §4.1.2) with saved statistics, or recomputed ones with epsilon;
    dx is written blockwise over axis 0 (one block temporary)."""
    x, dy, axes = ins["x"], ins["dy"], tuple(op.attrs["axes"])
    m = _count(x, axes)
    if "saved_mean" in ins:
        mean_dt, inv = ins["saved_mean"], ins["saved_inv_variance"].astype(F64)
    else:
        _, mean_dt, var = _moments(x, axes, dt, empty_like_layout(x, x.shape, dt))
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / np.sqrt(var + _scalar(op, ins, "epsilon"))
    dbias = _sum(dy, axes)
    dscale = inv * _block_dot(x, dy, axes, mean_dt)
    k1 = ins["scale"].astype(F64) * inv
    k2 = (-k1 * inv * dscale / m).astype(dt)
    k3 = (-k1 * dbias / m).astype(dt)
    k1 = k1.astype(dt)
    dx = dest(out, "dx", x, x.shape, dt, reads=(x, dy))
    tmp = None
    for blk in blocks(x.shape[0], x[:1].size):
        d = dx[blk]
        if tmp is None or tmp.shape != d.shape:
            tmp = empty_like_layout(d, d.shape, dt)
        np.subtract(x[blk], mean_dt, out=d)
        np.multiply(d, k2, out=d)
        np.multiply(dy[blk], k1, out=tmp)
        np.add(d, tmp, out=d)
        np.add(d, k3, out=d)
    return {"dx": dx, "dscale": dscale.astype(dt), "dbias": dbias.astype(dt)}
