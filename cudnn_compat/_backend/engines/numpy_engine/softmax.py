"""``numpy`` engine kernels for Softmax and SoftmaxBackward (002 §3.2.96 cudnnSoftmaxForward,
§4.1.19 cudnnSoftmaxBackward, §3.1.2.25 cudnnSoftmaxAlgorithm_t), in the compute dtype ``dt``.
Formulas as the reference engine's (reference/softmax.py), s sums over ``axes``:
  FAST      y = exp(x) / s exp(x)
  ACCURATE  y = exp(x - m) / s exp(x - m),  m = max over axes
  LOG       y = (x - m) - log s exp(x - m)
  Backward  dx = y * (dy - s(dy*y))  (FAST/ACCURATE);  dx = dy - exp(y) * s(dy)  (LOG)
Sums of more than SHORT_SUM terms accumulate in float64 (NumPy casts in its buffers, no
full-size copy) and are rounded to dt once, shorter ones in dt (at most 128 roundings); every full-size pass is an in-place ufunc on the destination.  Temporaries: none of x's
size but one for LOG forward (exp(x - m)); per-point sums and maxima.
"""
from __future__ import annotations

import numpy as np

from ._arrays import dest
from ._kernels import kernel


SHORT_SUM = 128  # sums of at most this many terms accumulate in dt: error <= 128 * 2^-24 < 1e-5


def _sum(a, axes, dt):
    """Sums over ``axes``: in dt when short (the channel mode's C terms), else in float64."""
    count = int(np.prod([a.shape[k] for k in axes]))
    acc = dt if count <= SHORT_SUM else np.float64
    return np.add.reduce(a, axis=axes, dtype=acc, keepdims=True).astype(dt, copy=False)


@kernel("Softmax")
def softmax(op, ins, dt, out):
    """Softmax forward (002 §3.2.96); x is read before y is written, pass by pass."""
    x, axes, algo = ins["x"], tuple(op.attrs["axes"]), op.attrs["algorithm"]
    y = dest(out, "y", x, x.shape, dt)
    if algo == "FAST":
        np.exp(x, out=y)
    else:
        np.subtract(x, np.max(x, axis=axes, keepdims=True), out=y)
        if algo == "LOG":
            np.subtract(y, np.log(_sum(np.exp(y), axes, dt)), out=y)
            return {"y": y}
        np.exp(y, out=y)
    np.divide(y, _sum(y, axes, dt), out=y)
    return {"y": y}


@kernel("SoftmaxBackward")
def softmax_backward(op, ins, dt, out):
    """Softmax backward (002 §4.1.19), computed in dx's buffer (no temporaries of y's size)."""
    y, dy, axes = ins["y"], ins["dy"], tuple(op.attrs["axes"])
    dx = dest(out, "dx", y, y.shape, dt, reads=(y, dy))
    if op.attrs["algorithm"] == "LOG":
        s = _sum(dy, axes, dt)
        np.exp(y, out=dx)
        np.multiply(dx, s, out=dx)
        np.subtract(dy, dx, out=dx)
        return {"dx": dx}
    np.multiply(dy, y, out=dx)
    np.subtract(dy, _sum(dx, axes, dt), out=dx)
    np.multiply(dx, y, out=dx)
    return {"dx": dx}
