"""Matmul and the convolutions as GEMMs on cuBLAS through ``cupy.matmul``: a correct fallback
for every case the reference engine accepts (002 §5.2.10 ConvolutionForward, §5.2.8
BackwardData, §6.2.2 BackwardFilter; attrs in ``_backend/validate_conv.py``); the native
cuDNN engine is the fast path.

im2col: the zero-padded input viewed as (N, groups, C/g * taps, output positions) by
strides (dilation and stride folded in), copied once per batch chunk and multiplied by the
(groups, K/g, C/g * taps) filter.  BackwardData is the transposed product scattered back
tap by tap (col2im), BackwardFilter the product with the transposed columns summed over the
batch.  Half and bfloat16 are widened to float32 first, so accumulation is float32; float64
and the integer configs compute in float64 (int8 products are then exact).  CuPy keeps
TF32 off unless CUPY_TF32 is set, so float32 results are plain FMA math (allowed by every
math type).  Scratch (padded input, columns) comes from CuPy's memory pool, in batch chunks
of at most ``CHUNK_BYTES`` of columns.
"""
from __future__ import annotations

import math

from ...validate_conv import geometry
from . import runtime
from .steps import PyRun, Writer, compute_of, read

CHUNK_BYTES = 256 << 20


def supports(op) -> "str | None":
    for t in list(op.inputs.values()) + list(op.outputs.values()):
        if t.dtype in ("int64", "bool"):
            return f"{op.kind} on {t.dtype} data is not implemented"
    return None


def _oriented(cp, w, mode):
    if mode == "CONVOLUTION":
        return w[(slice(None), slice(None)) + (slice(None, None, -1),) * (w.ndim - 2)]
    return w


def _padded(cp, x, pre, post):
    n, c = x.shape[:2]
    shape = (n, c) + tuple(s + a + b for s, a, b in zip(x.shape[2:], pre, post))
    xp = cp.zeros(shape, dtype=x.dtype)
    xp[(slice(None), slice(None)) + tuple(slice(a, a + s) for a, s in zip(pre, x.shape[2:]))] = x
    return xp


def _columns(cp, xp, groups, taps, out, stride, dil):
    """(n, g, C/g * prod(taps), prod(out)) im2col matrix of the padded input chunk ``xp``."""
    as_strided = cp.lib.stride_tricks.as_strided
    n, c = xp.shape[:2]
    cg = c // groups
    st = xp.strides
    view = as_strided(xp, shape=(n, groups, cg) + tuple(taps) + tuple(out),
                      strides=(st[0], st[1] * cg, st[1]) + tuple(st[2 + i] * dil[i] for i in range(len(taps)))
                      + tuple(st[2 + i] * stride[i] for i in range(len(out))))
    return view.reshape(n, groups, cg * math.prod(taps), math.prod(out))


def _chunk(n, per_sample_bytes) -> int:
    return max(1, min(n, CHUNK_BYTES // max(1, per_sample_bytes)))


def build(step) -> list:
    op = step.op
    kind = op.kind
    if kind == "Matmul":
        return [_matmul(op)]
    return [_conv(op)]


def _matmul(op):
    a_t, b_t, c_t = op.inputs["a"], op.inputs["b"], op.outputs["c"]
    ct = compute_of(a_t, b_t, c_t)
    write = Writer(c_t, ct)

    def fn(env, ctx):
        cp = runtime.cupy()
        write(env, cp.matmul(read(env, a_t, ct), read(env, b_t, ct)))

    return PyRun(fn, write.kernels)


def _conv(op):
    kind = op.kind
    pre, post, stride, dil, g = geometry(op)
    mode = op.attrs["mode"]
    if kind == "ConvolutionForward":
        x_t, w_t, out_t = op.inputs["x"], op.inputs["w"], op.outputs["y"]
    elif kind == "ConvolutionBackwardData":
        x_t, w_t, out_t = op.inputs["dy"], op.inputs["w"], op.outputs["dx"]
    else:
        x_t, w_t, out_t = op.inputs["x"], op.inputs["dy"], op.outputs["dw"]
    ct = compute_of(x_t, w_t, out_t)
    write = Writer(out_t, ct)
    size = 8 if ct == "float64" else 4

    def forward(env, ctx):
        cp = runtime.cupy()
        x, w = read(env, x_t, ct), _oriented(cp, read(env, w_t, ct), mode)
        n, c = x.shape[:2]
        k = w.shape[0]
        taps, out = w.shape[2:], out_t.dims[2:]
        wg = cp.ascontiguousarray(w).reshape(1, g, k // g, -1)
        y = cp.empty((n, g, k // g, math.prod(out)), dtype=ct)
        step = _chunk(n, c * math.prod(taps) * math.prod(out) * size)
        for s in range(0, n, step):
            xp = _padded(cp, x[s:s + step], pre, post)
            cols = _columns(cp, xp, g, taps, out, stride, dil)
            y[s:s + step] = cp.matmul(wg, cols)
        write(env, y.reshape(out_t.dims))

    def backward_data(env, ctx):
        cp = runtime.cupy()
        dy, w = read(env, x_t, ct), _oriented(cp, read(env, w_t, ct), mode)
        n, k = dy.shape[:2]
        c = out_t.dims[1]
        taps, out, sp = w.shape[2:], dy.shape[2:], out_t.dims[2:]
        wt = cp.ascontiguousarray(w).reshape(g, k // g, -1).transpose(0, 2, 1)[None]  # (1, g, C/g*taps, K/g)
        padded = tuple(s + a + b for s, a, b in zip(sp, pre, post))
        dx = cp.empty((n, c) + tuple(sp), dtype=ct)
        step = _chunk(n, c * math.prod(taps) * math.prod(out) * size)
        crop = tuple(slice(a, a + s) for a, s in zip(pre, sp))
        for s in range(0, n, step):
            m = min(step, n - s)
            dyg = dy[s:s + m].reshape(m, g, k // g, -1)
            cols = cp.matmul(wt, dyg).reshape((m, c) + tuple(taps) + tuple(out))
            dxp = cp.zeros((m, c) + padded, dtype=ct)
            for r in _tap_indices(taps):
                sl = tuple(slice(ri * d, ri * d + (o - 1) * st + 1, st) for ri, d, o, st in zip(r, dil, out, stride))
                dxp[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + r]
            dx[s:s + m] = dxp[(slice(None), slice(None)) + crop]
        write(env, dx)

    def backward_filter(env, ctx):
        cp = runtime.cupy()
        x, dy = read(env, x_t, ct), read(env, w_t, ct)
        n, c = x.shape[:2]
        k = dy.shape[1]
        taps, out = out_t.dims[2:], dy.shape[2:]
        dw = cp.zeros((g, k // g, (c // g) * math.prod(taps)), dtype=ct)
        step = _chunk(n, c * math.prod(taps) * math.prod(out) * size)
        for s in range(0, n, step):
            m = min(step, n - s)
            xp = _padded(cp, x[s:s + m], pre, post)
            cols = _columns(cp, xp, g, taps, out, stride, dil)  # (m, g, C/g*taps, P)
            dyg = dy[s:s + m].reshape(m, g, k // g, -1)
            dw += cp.matmul(dyg, cols.transpose(0, 1, 3, 2)).sum(axis=0)
        write(env, cp.ascontiguousarray(_oriented(cp, dw.reshape(out_t.dims), mode)))

    fn = {"ConvolutionForward": forward, "ConvolutionBackwardData": backward_data,
          "ConvolutionBackwardFilter": backward_filter}[kind]
    return PyRun(fn, write.kernels)


def _tap_indices(taps):
    import itertools
    return list(itertools.product(*(range(t) for t in taps)))
