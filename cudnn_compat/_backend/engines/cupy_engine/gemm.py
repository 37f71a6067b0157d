"""Matmul and the convolutions as GEMMs on cuBLAS through ``cupy.matmul``: a correct fallback
for every case the reference engine accepts (002 §5.2.10 ConvolutionForward, §5.2.8
BackwardData, §6.2.2 BackwardFilter; attrs in ``cudnn_compat/_backend/ops/convolution.py``); the native
cuDNN engine is the fast path.

im2col: the zero-padded input viewed as (N, groups, C/g * taps, output positions) by
strides (dilation and stride folded in), copied once per batch chunk and multiplied by the
(groups, K/g, C/g * taps) filter.  BackwardData is the transposed product scattered back
tap by tap (col2im), BackwardFilter the product with the transposed columns summed over the
batch.  Half and bfloat16 are widened to float32 first, so accumulation is float32; float64
and the integer configs compute in float64 (int8 products are then exact).  Scratch (padded
input, columns) comes from CuPy's memory pool, in batch chunks of at most ``CHUNK_BYTES`` of
columns; the caller's workspace is never used, so every plan of this engine needs none.

Every product is ``matmul``: cublasGemmStridedBatchedEx through the engine's own cuBLAS handle
(``cublas.Cublas``) with the compute type of ``_backend.math_policy`` (CUBLAS_COMPUTE_32F_FAST_TF32
only where ``allow_tf32(data, math_type)``, else CUBLAS_COMPUTE_32F, or _64F for double), the
same rule as the RNN recurrence and the cudnn engine; CuPy's own matmul (whose TF32 follows
CUPY_TF32) is not used.  ``gemm_calls`` (pure Python, tested on the CPU) maps a batched,
broadcast, strided row-major product onto column-major strided-batched calls without copies
wherever the strides allow (one unit stride per matrix, batch dims that merge to one stride).
"""
from __future__ import annotations

import functools
import itertools
import math
import threading

from ...math_policy import gemm_compute
from ...ops.convolution import geometry
from . import runtime
from .steps import PyRun, Writer, compute_of, read

CHUNK_BYTES = 256 << 20
_LOCK = threading.Lock()  # set_stream + gemm on the shared cuBLAS handle


# -- batched GEMMs on cuBLAS (layout mapping: pure Python) ------------------------------------------

def _blas_view(rows: int, cols: int, sr: int, sc: int):
    """(trans, ld) such that op(stored column-major matrix) is the transpose of the logical
    row-major ``rows`` x ``cols`` matrix with element strides (sr, sc); None when the strides
    fit neither orientation (the caller copies the operand)."""
    if rows == 0 or cols == 0:
        return False, max(cols, 1)  # an empty operand: no call reads it
    if (sc == 1 or cols == 1) and (rows == 1 or sr >= max(cols, 1)):
        return False, (sr if rows > 1 else max(cols, 1))
    if (sr == 1 or rows == 1) and (cols == 1 or sc >= max(rows, 1)):
        return True, (sc if cols > 1 else max(rows, 1))
    return None


def layout_ok(shape, strides) -> bool:
    """Whether a (..., R, C) operand with element ``strides`` can be a cuBLAS operand as it is."""
    if any(s < 0 for s in strides):
        return False
    return _blas_view(shape[-2], shape[-1], strides[-2], strides[-1]) is not None


def _batch_strides(shape, strides, batch) -> tuple:
    """Per-dim element strides of an operand's batch dims aligned to ``batch`` (0: broadcast)."""
    k = len(batch)
    own = list(zip(shape[:-2], strides[:-2]))
    own = [(1, 0)] * (k - len(own)) + own
    return tuple(0 if n == 1 else s for n, s in own)


@functools.lru_cache(maxsize=4096)
def gemm_calls(a_shape, a_strides, b_shape, b_strides, compute: str) -> tuple:
    """(C shape, [cublas.Gemm]) computing the row-major C = A @ B (NumPy matmul broadcasting over the
    batch dims; C packed) as column-major calls C^T = B^T A^T: cuBLAS operand 'a' is B, 'b' is A,
    offsets in elements of ('B'|'A'|'C', offset).  Batch dims are permuted and merged so the
    fewest calls cover them (each call one strided batch; a dim an operand broadcasts has stride 0)."""
    from .cublas import Gemm
    M, K = a_shape[-2:]
    K2, N = b_shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: inner dims differ ({K} and {K2})")
    batch = tuple(max(x, y) for x, y in itertools.zip_longest(
        (1,) * (max(len(a_shape), len(b_shape)) - len(a_shape)) + tuple(a_shape[:-2]),
        (1,) * (max(len(a_shape), len(b_shape)) - len(b_shape)) + tuple(b_shape[:-2])))
    c_shape = batch + (M, N)
    if M == 0 or N == 0 or K == 0 or math.prod(batch) == 0:
        return c_shape, []  # K == 0: the caller fills C with zeros
    sa = _batch_strides(a_shape, a_strides, batch)
    sb = _batch_strides(b_shape, b_strides, batch)
    sc, acc = [0] * len(batch), M * N
    for d in reversed(range(len(batch))):
        sc[d] = acc if batch[d] > 1 else 0
        acc *= batch[d]
    ops = (sa, sb, tuple(sc))
    dims = [d for d, n in enumerate(batch) if n > 1]
    best = None
    for perm in itertools.permutations(dims):
        j = len(perm) - 1
        while j > 0 and all(st[perm[j - 1]] == st[perm[j]] * batch[perm[j]] for st in ops):
            j -= 1
        loops, run = perm[:max(j, 0)], perm[max(j, 0):]
        calls = math.prod(batch[d] for d in loops)
        if best is None or calls < best[0]:
            best = (calls, loops, run)
    _, loops, run = best if best is not None else (1, (), ())
    count = math.prod(batch[d] for d in run) if run else 1
    inner = run[-1] if run else None
    bst = [st[inner] if inner is not None else 0 for st in ops]
    tb, ldb_ = _blas_view(K, N, b_strides[-2], b_strides[-1])  # cuBLAS 'a' = B
    ta, lda_ = _blas_view(M, K, a_strides[-2], a_strides[-1])  # cuBLAS 'b' = A
    out = []
    for idx in itertools.product(*(range(batch[d]) for d in loops)):
        oa = sum(i * sa[d] for i, d in zip(idx, loops))
        ob = sum(i * sb[d] for i, d in zip(idx, loops))
        oc = sum(i * sc[d] for i, d in zip(idx, loops))
        out.append(Gemm(tb, ta, N, M, K, ("B", ob), ldb_, bst[1], ("A", oa), lda_, bst[0], ("C", oc), N, bst[2],
                        count, 0.0, compute))
    return c_shape, out


def _elem_strides(x) -> tuple:
    return tuple(s // x.itemsize for s in x.strides) if all(s % x.itemsize == 0 for s in x.strides) else None


def matmul(a, b, compute: str, out=None):
    """C = a @ b (CuPy arrays of one float dtype, NumPy broadcasting; C a new packed array, or
    ``out`` when it is a C-contiguous array of C's shape and dtype) on cuBLAS with ``compute``
    'float32' | 'tf32' | 'float64' (math_policy.gemm_compute)."""
    cp = runtime.cupy()
    from .cublas import Cublas
    ops = []
    for x in (a, b):
        st = _elem_strides(x)
        if st is None or not layout_ok(x.shape, st) or x.ndim < 2:
            x = cp.ascontiguousarray(x)
            if x.ndim < 2:
                raise ValueError("matmul operands need 2 or more dims")
            st = _elem_strides(x)
        ops.append((x, st))
    (a, sa), (b, sb) = ops
    c_shape, calls = gemm_calls(tuple(a.shape), tuple(sa), tuple(b.shape), tuple(sb), compute)
    fits = out is not None and out.shape == tuple(c_shape) and out.dtype == a.dtype and out.flags.c_contiguous
    if not calls:
        if fits:
            out.fill(0)
            return out
        return cp.zeros(c_shape, dtype=a.dtype)
    c = out if fits else cp.empty(c_shape, dtype=a.dtype)
    dt = "float64" if a.dtype == cp.float64 else ("float16" if a.dtype == cp.float16 else "float32")
    isz = a.itemsize
    base = {"A": int(a.data.ptr), "B": int(b.data.ptr), "C": int(c.data.ptr)}
    blas = Cublas.get()
    stream = int(cp.cuda.get_current_stream().ptr)
    with _LOCK:
        blas.set_stream(stream)
        for gm in calls:
            blas.gemm(gm, base[gm.a[0]] + gm.a[1] * isz, dt, base[gm.b[0]] + gm.b[1] * isz, dt,
                      base[gm.c[0]] + gm.c[1] * isz, dt)
    if out is not None and c is not out:
        out[...] = c
        return out
    return c


def _compute(op, ct: str, tensors) -> str:
    """cuBLAS compute class of an op's GEMMs: the one TF32 rule (math_policy)."""
    if ct == "float64":
        return "float64"
    data = "float32" if all(t.dtype == "float32" for t in tensors) else "other"
    return gemm_compute(data, op.attrs.get("math_type"))


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


TENSOR_OP = ("TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION")


def half_direct(op) -> bool:
    """fp16 a, b and c under a TENSOR_OP math type: cuBLAS takes the half operands as they are
    (fp16 x fp16 -> fp16, fp32 accumulation: tensor cores); else half is widened to float32 and
    the product runs as FP32 math (math_policy: half data use tensor cores only when allowed)."""
    return (all(t.dtype == "float16" for t in (op.inputs["a"], op.inputs["b"], op.outputs["c"]))
            and op.attrs.get("math_type") in TENSOR_OP)


def _matmul(op):
    a_t, b_t, c_t = op.inputs["a"], op.inputs["b"], op.outputs["c"]
    ct = "float16" if half_direct(op) else compute_of(a_t, b_t, c_t)
    write = Writer(c_t, ct)
    comp = "float32" if ct == "float16" else _compute(op, ct, (a_t, b_t, c_t))

    def fn(env, ctx):
        write(env, matmul(read(env, a_t, ct), read(env, b_t, ct), comp))

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
    comp = _compute(op, ct, (x_t, w_t, out_t))

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
            y[s:s + step] = matmul(wg, cols, comp)
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
            cols = matmul(wt, dyg, comp).reshape((m, c) + tuple(taps) + tuple(out))
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
            dw += matmul(dyg, cols.transpose(0, 1, 3, 2), comp).sum(axis=0)
        write(env, cp.ascontiguousarray(_oriented(cp, dw.reshape(out_t.dims), mode)))

    fn = {"ConvolutionForward": forward, "ConvolutionBackwardData": backward_data,
          "ConvolutionBackwardFilter": backward_filter}[kind]
    return PyRun(fn, write.kernels)


def _tap_indices(taps):
    import itertools
    return list(itertools.product(*(range(t) for t in taps)))
