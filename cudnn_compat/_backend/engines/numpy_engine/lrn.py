"""``numpy`` engine kernels for LRN and divisive normalization (002 §3.2.65/§4.1.14
cudnnLRNCrossChannelForward/Backward, §3.2.33/§4.1.6 cudnnDivisiveNormalizationForward/Backward,
§3.2.83 cudnnSetLRNDescriptor), in the compute dtype ``dt``.  Formulas as the reference
engine's (reference/lrn.py); the window around p is [p - lb, p + la], lb = (n-1)//2, la = n-lb-1:
  LRNForward   D = k + (alpha/n) * sum_window x^2,  y = x * D^-beta
  LRNBackward  dx = dy * D^-beta - (2*alpha*beta/n) * x * sum_{i: k in window(i)} dy_i*y_i/D_i
  DivisiveNormalization without means (zeros), c = alpha/n^d over the d dims after 1:
               D = k + c * sum_window x^2,  y = x * D^-beta
               g = dy * x * D^-(beta+1),  dx = dy*D^-beta - 2c*beta * x * sum_{i: k in window(i)} g_i
               dmeans = 2c*beta * g * sum_window x
Divisive normalization with a means input is declined (the reference engine runs it): its
sum_window (x_j - m_i)^2 expands into terms that cancel, which float32 cannot hold.
Box sums are n shifted in-place slice additions per axis.  Temporaries: LRN two arrays of x's
size in dt, divisive normalization at most five.
"""
from __future__ import annotations

import numpy as np

from ._arrays import dest, empty_like_layout
from ._kernels import kernel, supports


def _extent(n: int) -> tuple:
    behind = (n - 1) // 2
    return behind, n - behind - 1


def _box(a, ax, before, after, out):
    """out[p] = sum of a[q], q in [p - before, p + after] clipped, along axis ``ax``."""
    np.copyto(out, a)
    size = a.shape[ax]
    for s in range(-before, after + 1):
        lo, hi = max(0, -s), min(size, size - s)
        if s == 0 or lo >= hi:
            continue
        dst, src = [slice(None)] * a.ndim, [slice(None)] * a.ndim
        dst[ax], src[ax] = slice(lo, hi), slice(lo + s, hi + s)
        np.add(out[tuple(dst)], a[tuple(src)], out=out[tuple(dst)])
    return out


def _window_sum(a, axes, before, after, out, spare=None):
    """Box sum over ``axes`` into ``out`` (``spare``: a scratch array of a's size, needed when
    more than one axis)."""
    src = a
    for j, ax in enumerate(axes):
        left = len(axes) - j - 1  # passes after this one: end in out
        dst = out if left % 2 == 0 else spare
        _box(src, ax, before, after, dst)
        src = dst
    return out


def _neg_power(d, beta, out):
    """out = d ** -beta."""
    return np.power(d, -beta, out=out)


@kernel("LRNForward")
def lrn_forward(op, ins, dt, out):
    """LRN cross-channel forward (002 §3.2.65)."""
    dt = np.dtype(dt).type  # the scalar type: constants in dt
    a, x = op.attrs, ins["x"]
    lb, la = _extent(a["n"])
    sq = np.multiply(x, x)
    y = dest(out, "y", x, x.shape, dt, reads=(x,))
    _box(sq, 1, lb, la, y)
    np.multiply(y, dt(a["alpha"] / a["n"]), out=y)
    np.add(y, dt(a["k"]), out=y)
    _neg_power(y, dt(a["beta"]), y)
    np.multiply(y, x, out=y)
    return {"y": y}


@kernel("LRNBackward")
def lrn_backward(op, ins, dt, out):
    """LRN cross-channel backward (002 §4.1.14); D recomputed from x."""
    dt = np.dtype(dt).type  # the scalar type: constants in dt
    a, x, y, dy = op.attrs, ins["x"], ins["y"], ins["dy"]
    lb, la = _extent(a["n"])
    d = empty_like_layout(x, x.shape, dt)
    np.multiply(x, x, out=d)
    t = np.empty_like(d)
    _box(d, 1, lb, la, t)
    np.multiply(t, dt(a["alpha"] / a["n"]), out=d)
    np.add(d, dt(a["k"]), out=d)
    np.multiply(dy, y, out=t)
    np.divide(t, d, out=t)
    dx = dest(out, "dx", x, x.shape, dt, reads=(x, y, dy))
    _box(t, 1, la, lb, dx)  # over the windows containing each channel
    np.multiply(dx, x, out=dx)
    np.multiply(dx, dt(-2.0 * a["alpha"] * a["beta"] / a["n"]), out=dx)
    _neg_power(d, dt(a["beta"]), d)
    np.multiply(d, dy, out=d)
    np.add(dx, d, out=dx)
    return {"dx": dx}


@supports("DivisiveNormalizationForward")
@supports("DivisiveNormalizationBackward")
def _divnorm_supported(op):
    if "means" in op.inputs:
        return "divisive normalization with means needs float64 window sums (reference engine)"
    return None


def _divnorm_denominator(op, x, dt):
    """(D, c, axes, (lb, la), scratch): D = k + c * sum_window x^2 over the dims after 1."""
    a = op.attrs
    axes = tuple(range(2, x.ndim))
    lb, la = _extent(a["n"])
    c = a["alpha"] / float(a["n"]) ** len(axes)
    sq = empty_like_layout(x, x.shape, dt)
    np.multiply(x, x, out=sq)
    d = np.empty_like(sq)
    _window_sum(sq, axes, lb, la, d, spare=sq if len(axes) == 1 else np.empty_like(sq))
    np.multiply(d, dt(c), out=d)
    np.add(d, dt(a["k"]), out=d)
    return d, c, axes, (lb, la), sq


@kernel("DivisiveNormalizationForward")
def divnorm_forward(op, ins, dt, out):
    """Divisive normalization forward without means (002 §3.2.33)."""
    dt = np.dtype(dt).type  # the scalar type: constants in dt
    x = ins["x"]
    d, _, _, _, _ = _divnorm_denominator(op, x, dt)
    y = dest(out, "y", x, x.shape, dt)
    _neg_power(d, dt(op.attrs["beta"]), d)
    np.multiply(x, d, out=y)
    return {"y": y}


@kernel("DivisiveNormalizationBackward")
def divnorm_backward(op, ins, dt, out):
    """Divisive normalization backward without means (002 §4.1.6): dx and dmeans."""
    dt = np.dtype(dt).type  # the scalar type: constants in dt
    x, dy, beta = ins["x"], ins["dy"], op.attrs["beta"]
    d, c, axes, (lb, la), scratch = _divnorm_denominator(op, x, dt)
    g = np.power(d, dt(-(beta + 1.0)))  # D^-(beta+1)
    np.multiply(g, d, out=d)  # D^-beta
    np.multiply(g, dy, out=g)
    np.multiply(g, x, out=g)  # g
    res = {}
    spare = np.empty_like(d) if len(axes) > 1 else None
    if "dmeans" in op.outputs:
        s1 = _window_sum(x, axes, lb, la, np.empty_like(d), spare)
        np.multiply(s1, g, out=s1)
        np.multiply(s1, dt(2.0 * c * beta), out=s1)
        res["dmeans"] = s1
    _window_sum(g, axes, la, lb, scratch, spare)
    dx = dest(out, "dx", x, x.shape, dt, reads=(x, dy))
    np.multiply(scratch, x, out=scratch)
    np.multiply(scratch, dt(-2.0 * c * beta), out=scratch)
    np.multiply(dy, d, out=dx)
    np.add(dx, scratch, out=dx)
    res["dx"] = dx
    return res
