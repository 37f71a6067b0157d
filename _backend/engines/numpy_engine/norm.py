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
every per-channel sum accumulates in float64 (``np.add.reduce(..., dtype=float64)`` casts in
NumPy's internal buffers, never a full-size float64 copy).  The variance is two-pass: the sums
of d = x - mean_dt and d^2 are taken blockwise, and var = E[d^2] - E[d]^2 corrects for mean_dt
being the rounded mean.  Per-channel scalars (inv, the dx coefficients) are formed in float64
and rounded to dt once.  Temporaries: one block of at most max(BLOCK_ELEMENTS, one item of
axis 0) elements of dt, plus per-channel arrays.
"""
from __future__ import annotations

import numpy as np

from ._arrays import blocks, dest, empty_like_layout
from ._kernels import kernel

F64 = np.float64


def _scalar(op, ins, name):
    return float(ins[name]) if name in ins else float(op.attrs[name])


def _count(x, axes) -> int:
    return int(np.prod([x.shape[k] for k in axes]))


def _sum(a, axes):
    return np.add.reduce(a, axis=axes, dtype=F64, keepdims=True)


def _centered_sums(x, axes, center, other=None):
    """Blockwise over axis 0: (sum d, sum d*d) with d = x - center, or (sum d, sum d*other)."""
    s1 = s2 = 0.0
    tmp = None
    for blk in blocks(x.shape[0], x[:1].size):
        xb = x[blk]
        if tmp is None or tmp.shape != xb.shape:
            tmp = np.empty(xb.shape, dtype=x.dtype)
        np.subtract(xb, center, out=tmp)
        s1 = s1 + _sum(tmp, axes)
        np.multiply(tmp, tmp if other is None else other[blk], out=tmp)
        s2 = s2 + _sum(tmp, axes)
    return s1, s2


def _moments(x, axes, dt):
    """(mean float64, mean in dt, biased var float64) per channel."""
    m = _count(x, axes)
    mean = _sum(x, axes) / m
    mean_dt = mean.astype(dt)
    s1, s2 = _centered_sums(x, axes, mean_dt)
    shift = s1 / m  # mean - mean_dt, up to rounding
    return mean, mean_dt, np.maximum(s2 / m - shift * shift, 0.0)


def _affine(x, center, a, bias, y):
    """y = (x - center) * a + bias in three in-place passes (x is read by the first only)."""
    np.subtract(x, center, out=y)
    np.multiply(y, a, out=y)
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
        return {"y": _affine(x, ins["mean"], a, bias, y)}
    mean, mean_dt, var = _moments(x, axes, dt)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / np.sqrt(var + _scalar(op, ins, "epsilon"))
    res = {"y": _affine(x, mean_dt, (scale * inv).astype(dt), bias, y),
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
        _, mean_dt, var = _moments(x, axes, dt)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / np.sqrt(var + _scalar(op, ins, "epsilon"))
    dbias = _sum(dy, axes)
    dscale = inv * _centered_sums(x, axes, mean_dt, dy)[1]
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
