"""Reference kernels for LRN and divisive normalization (002 §3.2.65/§4.1.14
cudnnLRNCrossChannelForward/Backward, §3.2.33/§4.1.6 cudnnDivisiveNormalizationForward/
Backward, §3.2.83 cudnnSetLRNDescriptor), in float64.

attrs: ``n``, ``alpha``, ``beta``, ``k``.  The window around position p along a dim is
[p - lb, p + la] clipped to the dim, lb = floor((n-1)/2), la = n - lb - 1 (§3.2.83).

LRNForward (window over dim 1, channels):
    D = k + (alpha/n) * sum_window x^2,  y = x * D^-beta
LRNBackward (inputs x, y, dy; D recomputed from x):
    dx = dy * D^-beta - (2*alpha*beta/n) * x * sum_{i: k in window(i)} dy_i * y_i / D_i
The sum runs over the windows that contain k, so the gradient is exact for even n too.

DivisiveNormalizationForward (window over every dim after 1, d of them; means m, zeros
when absent).  002 gives only "x / max(c, sigma_x)"; the formula implemented is the
spatial analogue of LRN that 002's parameter text describes (alpha divided by
n^d, NULL means "equivalent to spatial LRN"), with the mean of position i subtracted
inside the window:
    D_i = k + (alpha/n^d) * sum_{j in window(i)} (x_j - m_i)^2,   y_i = x_i * D_i^-beta
DivisiveNormalizationBackward: the exact gradients of that formula, with the means
treated as independent inputs (§3.1.2.8):
    g = dy * x * D^-(beta+1),  c = alpha/n^d
    dx_k = dy_k D_k^-beta - 2 c beta (x_k sum_{i: k in window(i)} g_i - sum_{...} g_i m_i)
    dmeans_i = 2 c beta g_i sum_{j in window(i)} (x_j - m_i)
"""
from __future__ import annotations

import numpy as np

from ._kernels import kernel


def _extent(n: int) -> tuple:
    behind = (n - 1) // 2
    return behind, n - behind - 1


def window_sum(a: np.ndarray, axes, before: int, after: int) -> np.ndarray:
    """s[p] = sum of a[q] for q in [p - before, p + after] (clipped), box over ``axes``."""
    for ax in axes:
        size = a.shape[ax]
        out = np.zeros_like(a)
        for s in range(-before, after + 1):
            lo, hi = max(0, -s), min(size, size - s)
            if lo >= hi:
                continue
            dst, src = [slice(None)] * a.ndim, [slice(None)] * a.ndim
            dst[ax], src[ax] = slice(lo, hi), slice(lo + s, hi + s)
            out[tuple(dst)] += a[tuple(src)]
        a = out
    return a


def _lrn_denominator(op, x):
    a = op.attrs
    lb, la = _extent(a["n"])
    return a["k"] + (a["alpha"] / a["n"]) * window_sum(x * x, (1,), lb, la)


@kernel("LRNForward")
def lrn_forward(op, ins):
    x = ins["x"]
    return {"y": x * _lrn_denominator(op, x) ** -op.attrs["beta"]}


@kernel("LRNBackward")
def lrn_backward(op, ins):
    x, y, dy = ins["x"], ins["y"], ins["dy"]
    a = op.attrs
    lb, la = _extent(a["n"])
    d = _lrn_denominator(op, x)
    back = window_sum(dy * y / d, (1,), la, lb)  # over the windows containing each channel
    return {"dx": dy * d ** -a["beta"] - (2.0 * a["alpha"] * a["beta"] / a["n"]) * x * back}


def _divnorm_parts(op, ins):
    x = ins["x"]
    m = ins["means"] if "means" in ins else np.zeros_like(x)
    a = op.attrs
    axes = tuple(range(2, x.ndim))
    lb, la = _extent(a["n"])
    c = a["alpha"] / float(a["n"]) ** len(axes)
    s1 = window_sum(x, axes, lb, la)
    s2 = window_sum(x * x, axes, lb, la)
    count = window_sum(np.ones_like(x), axes, lb, la)
    var = np.maximum(s2 - 2.0 * m * s1 + count * m * m, 0.0)  # sum_window (x_j - m_i)^2
    return x, m, axes, (lb, la), c, s1, count, a["k"] + c * var


@kernel("DivisiveNormalizationForward")
def divnorm_forward(op, ins):
    x, _, _, _, _, _, _, d = _divnorm_parts(op, ins)
    return {"y": x * d ** -op.attrs["beta"]}


@kernel("DivisiveNormalizationBackward")
def divnorm_backward(op, ins):
    x, m, axes, (lb, la), c, s1, count, d = _divnorm_parts(op, ins)
    dy, beta = ins["dy"], op.attrs["beta"]
    g = dy * x * d ** -(beta + 1.0)
    dx = dy * d ** -beta - 2.0 * c * beta * (x * window_sum(g, axes, la, lb) - window_sum(g * m, axes, la, lb))
    out = {"dx": dx}
    if "dmeans" in op.outputs:
        out["dmeans"] = 2.0 * c * beta * g * (s1 - count * m)
    return out
