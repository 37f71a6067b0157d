"""``numpy`` engine kernels for ResampleForward / ResampleBackward: pooling (002 §3.2.69
cudnnPoolingForward, §4.1.18 cudnnPoolingBackward, §3.1.2.19 cudnnPoolingMode_t), any number of
spatial dims, any strides (NHWC included).  Semantics are the reference engine's
(reference/pooling.py); output o of a spatial dim covers inputs o*stride - pre_padding + k:
  MAXPOOL          max over the window's input elements (padding ignored); PROPAGATE: a NaN
                   wins; NOT_PROPAGATE: NaNs are skipped; a window with no input element (or
                   only NaNs under NOT_PROPAGATE) gives the lowest finite value of dt.
  AVGPOOL_INCLUDE  sum / window volume;  AVGPOOL_EXCLUDE  sum / count of input elements (0 if none).
  Backward         average: dy/count spread over the window's input elements; MAXPOOL: dy goes
                   to the first maximal element in row-major window order (under PROPAGATE the
                   first NaN when the window holds one), recomputed from x.

Mechanism: when the window has fewer positions than the output, one pass per window offset
(k_1, ..., k_d): the strided view of x that offset reads for the outputs whose input lies
inside x, combined with the matching block of y by an in-place ufunc (np.maximum / np.fmax /
np.add); backward adds dy into the strided view of dx with ``where=`` the first-hit mask.
Otherwise (global-style pooling) one reduction per output position over its window.
The taps and window counts of a geometry are computed once (``_geometry``, an LRU cache).
Temporaries: forward none beyond y; backward max: the raw max, one array and two bool masks of
y's size (offset loop), or one window of x (position loop); backward average: dy/count.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np

from ._arrays import dest, zeros_like_layout
from ._kernels import kernel


def _offset_ranges(a, xs, ys, d):
    """Per window offset k of spatial dim d: (output slice, input slice) of the outputs whose
    input index o*s - p + k lies in x; empty offsets are left out."""
    s, p, X, O = a["stride"][d], a["pre_padding"][d], xs[2 + d], ys[2 + d]
    res = []
    for k in range(a["window"][d]):
        lo = max(0, -((k - p) // s))  # ceil((p - k) / s)
        hi = min(O, (X - 1 + p - k) // s + 1)
        if lo < hi:
            start = lo * s - p + k
            res.append((slice(lo, hi), slice(start, start + (hi - lo - 1) * s + 1, s)))
    return res


def _window_slices(a, xs, o, d):
    """Input slice of spatial dim d covered by output index o (clipped to x; may be empty)."""
    start = o * a["stride"][d] - a["pre_padding"][d]
    return slice(max(0, start), max(0, min(xs[2 + d], start + a["window"][d])))


def _count_array(a, xs, ys):
    """Number of input elements per output window, shaped (1, 1, O_1, ..., O_d)."""
    s = len(xs) - 2
    total = np.ones((1, 1) + (1,) * s)
    for d in range(s):
        o = np.arange(ys[2 + d])
        start = o * a["stride"][d] - a["pre_padding"][d]
        c = np.maximum(0, np.minimum(xs[2 + d], start + a["window"][d]) - np.maximum(0, start))
        total = total * c.reshape((1, 1) + tuple(-1 if k == d else 1 for k in range(s)))
    return total


def _offset_list(a, xs, ys):
    """(y index, x index) per window offset in row-major window order."""
    s = len(xs) - 2
    per_dim = [_offset_ranges(a, xs, ys, d) for d in range(s)]
    for combo in itertools.product(*per_dim):
        yield (slice(None),) * 2 + tuple(c[0] for c in combo), (slice(None),) * 2 + tuple(c[1] for c in combo)


@functools.lru_cache(maxsize=256)
def _geometry(window, stride, pre_padding, xs, ys):
    """(the window taps, the counts) of one pooling geometry, computed once."""
    a = {"window": window, "stride": stride, "pre_padding": pre_padding}
    counts = _count_array(a, xs, ys)
    counts.flags.writeable = False
    return tuple(_offset_list(a, xs, ys)), counts


def _cached(a, xs, ys):
    return _geometry(tuple(a["window"]), tuple(a["stride"]), tuple(a["pre_padding"]), tuple(xs), tuple(ys))


def _offsets(a, xs, ys):
    return _cached(a, xs, ys)[0]


def _counts(a, xs, ys):
    return _cached(a, xs, ys)[1]


def _positions(a, xs, ys):
    """(y index, x index) per output position (the position loop)."""
    s = len(xs) - 2
    for o in itertools.product(*(range(ys[2 + d]) for d in range(s))):
        yield (slice(None),) * 2 + o, (slice(None),) * 2 + tuple(_window_slices(a, xs, o[d], d) for d in range(s))


def _use_offsets(a, ys) -> bool:
    return int(np.prod(a["window"])) <= int(np.prod(ys[2:]))


def _propagate(a) -> bool:
    return a.get("nan_propagation", "NOT_PROPAGATE") == "PROPAGATE"


def _raw_max(a, x, y):
    """y = the window max, NaN where a window has no eligible element (NOT_PROPAGATE) or -inf
    / NaN as the scan leaves them; the caller substitutes the lowest value."""
    prop = _propagate(a)
    spatial = tuple(range(2, x.ndim))
    if _use_offsets(a, y.shape):
        fn = np.maximum if prop else np.fmax
        # the max is order-free: seed y from taps that cover every output (no fill), then the rest
        taps = list(_offsets(a, x.shape, y.shape))
        full = [i for i, (yi, _) in enumerate(taps) if y[yi].shape == y.shape][:2]
        if len(full) == 2:
            fn(x[taps[full[0]][1]], x[taps[full[1]][1]], out=y)
        elif full:
            np.copyto(y, x[taps[full[0]][1]])
        else:
            y.fill(-np.inf if prop else np.nan)
        taps = [t for i, t in enumerate(taps) if i not in full]
        for yi, xi in taps:
            fn(y[yi], x[xi], out=y[yi])
    else:
        for yi, xi in _positions(a, x.shape, y.shape):
            win = x[xi]
            if win.size == 0:
                y[yi] = np.nan
            else:
                (np.max if prop else np.fmax.reduce)(win, axis=spatial, out=y[yi])
    return y


@kernel("ResampleForward")
def resample_forward(op, ins, dt, out):
    """Pooling forward (002 §3.2.69); see the module text."""
    a, x = op.attrs, ins["x"]
    ys = tuple(op.outputs["y"].dims)
    y = dest(out, "y", x, ys, dt, reads=(x,))
    counts = _counts(a, x.shape, ys)
    if a["mode"] == "MAXPOOL":
        _raw_max(a, x, y)
        lowest = np.finfo(dt).min
        if _propagate(a):
            if (counts == 0).any():
                np.copyto(y, lowest, where=np.broadcast_to(counts == 0, ys))
        elif np.isnan(np.max(y)):  # one read pass; the masked pass only where a window had no number
            np.copyto(y, lowest, where=np.isnan(y))
        return {"y": y}
    spatial = tuple(range(2, x.ndim))
    if _use_offsets(a, ys):
        y.fill(0)
        for yi, xi in _offsets(a, x.shape, ys):
            np.add(y[yi], x[xi], out=y[yi])
    else:
        for yi, xi in _positions(a, x.shape, ys):
            np.add.reduce(x[xi], axis=spatial, out=y[yi])
    div = float(np.prod(a["window"])) if a["mode"] == "AVGPOOL_INCLUDE_PADDING" else np.maximum(counts, 1.0)
    np.divide(y, np.asarray(div, dtype=dt), out=y)
    return {"y": y}


def _max_backward(a, x, dy, dx):
    m = _raw_max(a, x, np.empty(dy.shape, dtype=dx.dtype))
    prop = _propagate(a)
    if _use_offsets(a, dy.shape):
        mnan = np.isnan(m) if prop else None
        nan_any = bool(mnan.any()) if prop else False
        done = np.zeros(dy.shape, dtype=bool)
        hit = np.empty(dy.shape, dtype=bool)
        finite = bool(np.isfinite(dy).all())  # then dy*hit is exact and faster than where=
        tmp = np.empty(dy.shape, dtype=dx.dtype)
        for yi, xi in _offsets(a, x.shape, dy.shape):
            h, dn, xv, t = hit[yi], done[yi], x[xi], tmp[yi]
            np.equal(xv, m[yi], out=h)
            if nan_any:
                h |= np.isnan(xv) & mnan[yi]
            np.greater(h, dn, out=h)  # hit and not already routed
            dn |= h
            if finite:
                np.multiply(dy[yi], h, out=t)
            else:
                t.fill(0)
                np.copyto(t, dy[yi], where=h)
            np.add(dx[xi], t, out=dx[xi])
        return
    n, c = x.shape[:2]
    for yi, xi in _positions(a, x.shape, dy.shape):
        win = x[xi]
        if win.size == 0:
            continue
        flat = win.reshape(n, c, -1)
        mv = m[yi][..., None]
        hit = flat == mv
        if prop:
            hit |= np.isnan(flat) & np.isnan(mv)
        first = hit.argmax(axis=-1)[..., None]
        onehot = np.zeros(flat.shape, dtype=dx.dtype)
        gd = np.where(np.take_along_axis(hit, first, axis=-1), dy[yi][..., None], 0)
        np.put_along_axis(onehot, first, gd, axis=-1)
        dx[xi] += onehot.reshape(win.shape)


@kernel("ResampleBackward")
def resample_backward(op, ins, dt, out):
    """Pooling backward (002 §4.1.18); y is not read (the max is recomputed from x)."""
    a, x, dy = op.attrs, ins["x"], ins["dy"]
    dx = dest(out, "dx", x, x.shape, dt, reads=(x, dy))
    dx.fill(0)
    if a["mode"] == "MAXPOOL":
        _max_backward(a, x, dy, dx)
        return {"dx": dx}
    counts = _counts(a, x.shape, dy.shape)
    div = float(np.prod(a["window"])) if a["mode"] == "AVGPOOL_INCLUDE_PADDING" else np.maximum(counts, 1.0)
    g = np.divide(dy, np.asarray(div, dtype=dt), dtype=dt)
    if _use_offsets(a, dy.shape):
        for yi, xi in _offsets(a, x.shape, dy.shape):
            np.add(dx[xi], g[yi], out=dx[xi])
    else:
        s = x.ndim - 2
        for yi, xi in _positions(a, x.shape, dy.shape):
            dx[xi] += g[yi][(...,) + (None,) * s]
    return {"dx": dx}
