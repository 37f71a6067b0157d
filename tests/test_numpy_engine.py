"""The numpy engine (the CPU place's default, issue 25) against the reference engine (float64,
the oracle), op kind by op kind, on the same inputs, within the tolerances of docs/conventions.md
("The numpy engine's tolerance").  Each row builds one graph, runs it on both engines (forced),
and checks the default CPU plan is the numpy engine's.  The "kernels" rows (norms, pooling,
softmax, LRN, RNN, CTC, sampler) live in their own section below the conv/pointwise/matmul/
reduction ones."""
from __future__ import annotations

import itertools

import math

import numpy as np
import pytest

from cudnn_compat._backend import dtypes, planner
from cudnn_compat._backend.engines.base import VariantPack
from cudnn_compat._backend.engines.reference.pointwise import BINARY, UNARY
from cudnn_compat._backend.engines.reference.reduction import OPS as REDUCTION_MODES
from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides, scalar, virtual
from test_cupy_engine import POOL_CASES, layout_strides as _layout_strides  # NCHW, NHWC, strided (row gaps)

# op kind -> (rtol, atol relative to max(1, max|ref|)) for float32 data; docs/conventions.md
TOL32 = {"Pointwise": (2e-6, 1e-6), "Reduction": (1e-5, 1e-6), "Matmul": (1e-5, 1e-5),
         "ConvolutionForward": (1e-5, 1e-5), "ConvolutionBackwardData": (1e-5, 1e-5),
         "ConvolutionBackwardFilter": (1e-5, 1e-5)}
TOL64 = (1e-12, 1e-12)
# HALF / BFLOAT16 data (FLOAT compute): one rounding to the storage type apart at most
TOL_STORED = {"float16": (2.0 ** -10, 2.0 ** -10), "bfloat16": (2.0 ** -7, 2.0 ** -7)}


def T(uid, dims, dtype="float32", strides=None):
    return Tensor(uid, tuple(dims), tuple(strides or packed_strides(dims)), dtype)


def _span(dims, strides):
    return 1 + sum((d - 1) * s for d, s in zip(dims, strides))


def _view(base, dims, strides):
    """``base`` (1-d) seen with ``dims`` and element ``strides``."""
    return np.lib.stride_tricks.as_strided(base, dims, tuple(s * base.itemsize for s in strides))


def _buffer(t, rng, positive=False):
    """A NumPy view of ``t``'s storage dtype with its dims and strides over a fresh random buffer."""
    span = _span(t.dims, t.strides)
    return _view(dtypes.to_storage(rng.uniform(0.2, 2.0, span) if positive else rng.standard_normal(span), t.dtype),
                 t.dims, t.strides)


def _clone(buf):
    """A copy of ``buf`` with its strides, gaps included (``ndarray.copy`` would pack it in C order, and
    the layout a test chose would never reach the engine)."""
    st = [s // buf.itemsize for s in buf.strides]
    if buf.ndim == 0 or buf.size == 0 or min(st) <= 0 or any(s % buf.itemsize for s in buf.strides):
        return buf.copy()
    out = _view(np.zeros(_span(buf.shape, st), buf.dtype), buf.shape, st)
    out[...] = buf
    return out


def run_both(graph, inputs: dict, scalars: dict, kind: str, dtype="float32"):
    """Execute ``graph`` on the numpy and the reference engines from the same inputs; assert the
    default CPU plan is numpy's and the outputs agree within the kind's tolerance."""
    assert planner.make_plan(graph, "cpu").engine == "numpy"
    got = {}
    for eng in ("numpy", "reference"):
        plan = planner.make_plan(graph, "cpu", forced=eng)
        assert plan.engine == eng
        data = {uid: _clone(buf) for uid, buf in inputs.items()}
        outs = {}
        for t in graph.external_outputs():
            prior = inputs.get(t.uid)
            outs[t.uid] = data[t.uid] if prior is not None else \
                _view(dtypes.to_storage(np.full(_span(t.dims, t.strides), np.nan), t.dtype), t.dims, t.strides)
            data[t.uid] = outs[t.uid]
        data.update(scalars)
        plan.execute(VariantPack(data))
        got[eng] = {u: dtypes.load(v, t.dtype) for t in graph.external_outputs() for u, v in outs.items() if u == t.uid}
    rtol, atol = TOL32[kind] if dtype == "float32" else TOL_STORED.get(dtype, TOL64)
    for uid, ref in got["reference"].items():
        finite = np.abs(ref[np.isfinite(ref)])
        scale = max(1.0, float(finite.max(initial=0.0)))
        np.testing.assert_allclose(got["numpy"][uid], ref, rtol=rtol, atol=atol * scale, equal_nan=True,
                                   err_msg=f"{kind} output {uid}: numpy engine vs reference")
    return got


# -- Pointwise: every mode of the reference engine, with alpha scales, and the blend chains ------------
POSITIVE = {"SQRT", "LOG", "RSQRT", "POW"}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", sorted(UNARY) + sorted(BINARY))
def test_pointwise_mode(mode, dtype, rng):
    dims = (2, 3, 4, 5)
    x, y = T(1, dims, dtype), T(3, dims, dtype)
    ins = {"x": x, "alpha1": scalar(10, "float64" if dtype == "float64" else "float32")}
    data = {1: _buffer(x, rng, positive=mode in POSITIVE)}
    data[1][0, 0, 0, :2] = [0.0, np.nan]  # the NaN and zero paths (relu clips, min/max propagation)
    if mode in BINARY:
        b = T(2, (1, 3, 1, 5), dtype)  # broadcast over N and H
        ins.update(b=b, alpha2=scalar(11, ins["alpha1"].dtype))
        data[2] = _buffer(b, rng, positive=mode in POSITIVE)
    attrs = {"mode": mode}
    if mode.startswith("CLIPPED"):
        attrs["relu_upper_clip"] = 0.7
    g = OperationGraph([Operation("Pointwise", ins, {"y": y}, attrs)])
    for a1, a2 in ((1.0, 1.0), (0.5, -2.0)):
        run_both(g, data, {10: a1, 11: a2}, "Pointwise", dtype)


@pytest.mark.parametrize("prop", ["PROPAGATE", "NOT_PROPAGATE"])
@pytest.mark.parametrize("mode", ["RELU_FWD", "RELU_BWD", "MAX", "MIN"])
def test_pointwise_nan_propagation(mode, prop, rng):
    dims = (4, 6)
    x, y = T(1, dims), T(3, dims)
    ins = {"x": x}
    data = {1: _buffer(x, rng)}
    data[1][0, :3] = np.nan
    if mode in BINARY:
        ins["b"] = T(2, dims)
        data[2] = _buffer(ins["b"], rng)
        data[2][1, :2] = [np.nan, np.inf]
    g = OperationGraph([Operation("Pointwise", ins, {"y": y}, {"mode": mode, "nan_propagation": prop})])
    run_both(g, data, {}, "Pointwise")


@pytest.mark.parametrize("beta", [0.0, 0.75])
@pytest.mark.parametrize("alpha", [1.0, 0.5])
@pytest.mark.parametrize("layout", ["packed", "strided"])
def test_activation_blend_chain(alpha, beta, layout, rng):
    """relu(x) -> virtual -> y = alpha*t (+ beta*y_prior): the legacy graph, y in place of x's memory
    or not, packed or strided; the alpha == 1 IDENTITY blend is taken over by the relu."""
    dims = (2, 3, 4, 5)
    strides = None if layout == "packed" else (120, 1, 30, 3)  # NHWC-like
    x, y = T(1, dims, strides=strides), T(3, dims, strides=strides)
    tmp = virtual(20, dims)
    blend_in = {"x": tmp, "alpha1": scalar(10)}
    if beta:
        blend_in.update(b=T(4, dims, strides=strides), alpha2=scalar(11))
    g = OperationGraph([Operation("Pointwise", {"x": x}, {"y": tmp}, {"mode": "RELU_FWD"}),
                        Operation("Pointwise", blend_in, {"y": y}, {"mode": "ADD" if beta else "IDENTITY"})])
    data = {1: _buffer(x, rng), 3: _buffer(y, rng)}
    if beta:
        data[4] = data[3]  # the prior value of y: the same buffer
    run_both(g, data, {10: alpha, 11: beta}, "Pointwise")


def test_in_place_activation_writes_x(rng):
    """x and y one buffer: the kernel reads x before writing y."""
    dims = (3, 8)
    x, y, tmp = T(1, dims), T(3, dims), virtual(20, dims)
    g = OperationGraph([Operation("Pointwise", {"x": x}, {"y": tmp}, {"mode": "SIGMOID_FWD"}),
                        Operation("Pointwise", {"x": tmp, "alpha1": scalar(10)}, {"y": y}, {"mode": "IDENTITY"})])
    buf = _buffer(x, rng)
    want = 1 / (1 + np.exp(-buf.astype(np.float64)))
    plan = planner.make_plan(g, "cpu")
    plan.execute(VariantPack({1: buf, 3: buf, 10: 1.0}))
    np.testing.assert_allclose(buf, want, rtol=2e-6)


def test_an_output_over_memory_a_later_op_reads_is_stored_last(rng):
    """t = x (a virtual view of x's buffer); y2 = -w written over x's memory; y3 = t: y3 is the x of
    before the call, as the reference engine (every input loaded first) gives."""
    dims = (3, 4)
    x, w, y2, y3, t = T(1, dims), T(2, dims), T(3, dims), T(4, dims), virtual(20, dims)
    g = OperationGraph([Operation("Pointwise", {"x": x}, {"y": t}, {"mode": "IDENTITY"}),
                        Operation("Pointwise", {"x": w}, {"y": y2}, {"mode": "NEG"}),
                        Operation("Pointwise", {"x": t}, {"y": y3}, {"mode": "IDENTITY"})])
    for eng in ("numpy", "reference"):
        xb, wb = _buffer(x, rng), _buffer(w, rng)
        x0 = xb.copy()
        out3 = np.full(dims, np.nan, np.float32)
        planner.make_plan(g, "cpu", forced=eng).execute(VariantPack({1: xb, 2: wb, 3: xb, 4: out3}))
        np.testing.assert_array_equal(out3, x0, err_msg=eng)
        np.testing.assert_array_equal(xb, -wb, err_msg=eng)


# -- Reduction and Matmul ----------------------------------------------------------------------------
@pytest.mark.parametrize("ydims", [(2, 1, 4, 5), (2, 3, 1, 1), (1, 1, 1, 1)])
@pytest.mark.parametrize("mode", sorted(REDUCTION_MODES))
def test_reduction(mode, ydims, rng):
    xd = (2, 3, 4, 5)
    x, y = T(1, xd), T(3, ydims)
    outs = {"y": y}
    if mode in ("MIN", "MAX", "AMAX"):
        outs["indices"] = Tensor(4, ydims, packed_strides(ydims), "int32")
    g = OperationGraph([Operation("Reduction", {"x": x}, outs, {"mode": mode})])
    data = {1: _buffer(x, rng, positive=mode == "MUL")}
    got = run_both(g, data, {}, "Reduction")
    assert all(np.isfinite(v).all() for v in got["numpy"].values())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_broadcast(dtype, rng):
    a, b, c = T(1, (3, 1, 8, 16), dtype), T(2, (1, 2, 16, 5), dtype), T(3, (3, 2, 8, 5), dtype)
    g = OperationGraph([Operation("Matmul", {"a": a, "b": b}, {"c": c}, {})])
    run_both(g, {1: _buffer(a, rng), 2: _buffer(b, rng)}, {}, "Matmul", dtype)


# -- Convolutions: every direction over the geometry the reference engine runs ------------------------
# (x dims, w dims, pad, stride, dilation, groups, mode, layout)
CONVS = [
    ((2, 4, 9, 9), (6, 4, 3, 3), 1, 1, 1, 1, "CROSS_CORRELATION", "NCHW"),
    ((2, 4, 9, 9), (6, 4, 3, 3), 1, 2, 1, 1, "CONVOLUTION", "NCHW"),
    ((2, 4, 6, 6), (6, 4, 3, 3), 3, 1, 1, 1, "CROSS_CORRELATION", "NCHW"),  # padding beyond the filter
    ((2, 4, 10, 7), (4, 2, 3, 2), (2, 0), (1, 2), (2, 1), 2, "CROSS_CORRELATION", "NHWC"),
    ((2, 6, 8, 8), (6, 1, 3, 3), 1, 1, 1, 6, "CROSS_CORRELATION", "NCHW"),  # depthwise
    ((2, 8, 6, 6), (4, 8, 1, 1), 0, 1, 1, 1, "CROSS_CORRELATION", "NCHW"),  # 1x1: one GEMM
    ((2, 8, 6, 6), (4, 4, 1, 1), 0, 1, 1, 2, "CONVOLUTION", "NHWC"),  # 1x1 grouped, NHWC
    ((2, 8, 7, 7), (4, 8, 1, 1), 0, 2, 1, 1, "CROSS_CORRELATION", "NCHW"),  # 1x1 stride-2 downsample
    ((1, 3, 5, 6, 4), (2, 3, 3, 2, 2), 1, (1, 2, 1), 1, 1, "CONVOLUTION", "NCHW"),  # 3-D
    ((2, 3, 11), (4, 3, 4), (3,), 3, 2, 1, "CROSS_CORRELATION", "NCHW"),  # 1-D, pad > 0, dilation
    # a few pixels per sample (whole-batch GEMMs when the im2col fits: forward, backward filter)
    ((3, 16, 3, 3), (12, 16, 3, 3), 1, 1, 1, 1, "CONVOLUTION", "NCHW"),
    ((3, 16, 3, 3), (16, 8, 3, 3), 1, 1, (1, 2), 2, "CROSS_CORRELATION", "NHWC"),  # grouped, dilated
    ((4, 32, 2, 2), (16, 32, 1, 1), 0, 1, 1, 1, "CROSS_CORRELATION", "NCHW"),  # 1x1
    ((2, 12, 3, 2, 2), (8, 12, 2, 2, 1), (1, 0, 0), (2, 1, 1), 1, 1, "CONVOLUTION", "NCHW"),  # 3-D, strided
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["ConvolutionForward", "ConvolutionBackwardData", "ConvolutionBackwardFilter"])
@pytest.mark.parametrize("case", CONVS, ids=lambda c: "x" + "x".join(map(str, c[0])) + f"_g{c[5]}_{c[6][:4]}_{c[7]}")
@pytest.mark.parametrize("blocking", ["blocks", "whole"])
def test_convolution(case, kind, dtype, blocking, rng, monkeypatch):
    """Against the reference engine; ``blocks``: an im2col budget of 256 bytes (many blocks of
    samples and output rows), ``whole``: the shipped budget (these small cases take the
    whole-batch GEMMs where their rules allow)."""
    from cudnn_compat._backend.engines.numpy_engine import conv
    from cudnn_compat._backend.ops.convolution import output_dims
    if blocking == "blocks":
        monkeypatch.setattr(conv, "BLOCK_BYTES", 256)
    xd, wd, pad, stride, dil, groups, mode, layout = case
    nsp = len(xd) - 2
    tup = lambda v: tuple(v) if isinstance(v, tuple) else (v,) * nsp  # noqa: E731
    attrs = {"mode": mode, "pre_padding": tup(pad), "post_padding": tup(pad), "stride": tup(stride),
             "dilation": tup(dil), "groups": groups, "compute_type": "float64" if dtype == "float64" else "float32"}
    yd = output_dims(xd, wd, tup(pad), tup(pad), tup(stride), tup(dil))
    x, w, y = (T(u, d, dtype, _layout_strides(d, layout)) for u, d in ((1, xd), (2, wd), (3, yd)))
    roles = {"ConvolutionForward": ({"x": x, "w": w}, {"y": y}),
             "ConvolutionBackwardData": ({"dy": y, "w": w}, {"dx": x}),
             "ConvolutionBackwardFilter": ({"x": x, "dy": y}, {"dw": w})}[kind]
    g = OperationGraph([Operation(kind, roles[0], roles[1], attrs)])
    data = {t.uid: _buffer(t, rng) for t in roles[0].values()}
    run_both(g, data, {}, kind, dtype)


@pytest.mark.parametrize("kind", ["ConvolutionForward", "ConvolutionBackwardData", "ConvolutionBackwardFilter"])
def test_conv_gemm_operands_have_no_negative_strides(kind, rng, monkeypatch):
    """Every matmul a convolution kernel makes gets operands BLAS can take: a negative-stride view
    (the flipped filter of CONVOLUTION mode, and of backward data's stride-1 form in either mode)
    sends NumPy's matmul to its loop without BLAS, 2-3x slower (depthwise backward data: 17.8 ms
    against 7.6 for 8x64x56x56).  Every case of CONVS, checked by what the kernels pass."""
    seen = []
    real = np.matmul

    def matmul(*a, **kw):
        seen.extend(min(v.strides, default=0) for v in a[:2] if isinstance(v, np.ndarray))
        return real(*a, **kw)
    monkeypatch.setattr(np, "matmul", matmul)
    for case in CONVS:
        test_convolution(case, kind, "float32", "whole", rng, monkeypatch)
    assert seen and min(seen) >= 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_data_computes_in_float(dtype, rng):
    """HALF and BFLOAT16 data: FLOAT compute (the conv's compute_type), rounded once on store; the
    conv then the ADD blend of its result with a prior y (alpha 0.5, beta 2)."""
    xd, wd, yd = (2, 3, 6, 6), (4, 3, 3, 3), (2, 4, 6, 6)
    x, w, y, prior = T(1, xd, dtype), T(2, wd, dtype), T(3, yd, dtype), T(4, yd, dtype)
    tmp = virtual(20, yd)
    attrs = {"mode": "CROSS_CORRELATION", "pre_padding": (1, 1), "post_padding": (1, 1), "stride": (1, 1),
             "dilation": (1, 1), "groups": 1, "compute_type": "float32"}
    g = OperationGraph([Operation("ConvolutionForward", {"x": x, "w": w}, {"y": tmp}, attrs),
                        Operation("Pointwise", {"x": tmp, "b": prior, "alpha1": scalar(10), "alpha2": scalar(11)},
                                  {"y": y}, {"mode": "ADD"})])
    data = {1: _buffer(x, rng), 2: _buffer(w, rng), 3: _buffer(y, rng)}
    data[4] = data[3]
    run_both(g, data, {10: 0.5, 11: 2.0}, "ConvolutionForward", dtype)


def test_whole_batch_gemms_are_taken_where_their_rules_say(monkeypatch):
    """The whole-batch path runs for small outputs only: forward whenever every sample's im2col
    fits BLOCK_BYTES (and N > 1), backward filter when ``_fold_filter`` also holds; ResNet's 56x56
    layers at N=8 keep the blocked GEMMs.  Each rule is checked by what the kernels call."""
    from cudnn_compat._backend.engines.numpy_engine import conv
    f32 = np.dtype(np.float32)
    assert conv._fits_whole(8, 64, (3, 3), (4, 4), f32) and not conv._fits_whole(1, 64, (3, 3), (4, 4), f32)
    assert not conv._fits_whole(8, 64, (3, 3), (56, 56), f32)
    assert conv._fold_filter(16, 128, 256) and conv._fold_filter(4, 128, 1152)
    assert not conv._fold_filter(256, 16, 144) and not conv._fold_filter(9, 1, 9)  # 16x16 3x3; depthwise
    calls = []
    real = conv._whole_col
    monkeypatch.setattr(conv, "_whole_col", lambda *a: calls.append(a[0].shape) or real(*a))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 64, 4, 4)).astype(np.float32)
    w = rng.standard_normal((128, 64, 3, 3)).astype(np.float32)
    y = conv._forward(x, w, (1, 1), (1, 1), (1, 1), (1, 1), 1, np.empty((8, 128, 4, 4), np.float32), f32)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(np.einsum("nchw,kc->nkhw", xp[:, :, a:a + 4, b:b + 4], w[:, :, a, b].astype(np.float64))
               for a in range(3) for b in range(3))
    assert calls == [(8, 64, 3, 3, 4, 4)] and np.allclose(y, want, rtol=1e-4, atol=1e-3)
    del calls[:]
    conv._forward(rng.standard_normal((2, 64, 56, 56)).astype(np.float32), w[:8], (1, 1), (1, 1), (1, 1), (1, 1), 1,
                  np.empty((2, 8, 56, 56), np.float32), f32)  # 14 MiB of im2col: blocked
    assert not calls


def test_conv_blocks_bound_the_im2col(monkeypatch):
    """Every block's im2col fits BLOCK_BYTES unless one output row alone is wider."""
    from cudnn_compat._backend.engines.numpy_engine import conv
    monkeypatch.setattr(conv, "BLOCK_BYTES", 1000)
    for n, od, row in itertools.product((1, 3), ((5, 4), (1,), (7, 2, 2)), (10, 100, 400, 2000)):
        blocks = list(conv._blocks(n, od, row))
        cover = sorted((n0, o) for n0, n1, o0, o1 in blocks for n0 in range(n0, n1) for o in range(o0, o1))
        assert cover == [(i, o) for i in range(n) for o in range(od[0])]
        assert all((n1 - n0) * (o1 - o0) * row <= max(1000, row) for n0, n1, o0, o1 in blocks)


# == Kernels: norms, pooling, softmax, LRN, RNN (numpy_engine/norm.py, pooling.py, softmax.py, lrn.py,
# rnn.py).  Layouts packed and NHWC-strided, alpha/beta blends (beta == 0: y starts as NaN and is
# never read), NaN inputs for the NaN rules, float32 and float64; half for pooling and softmax.
TOL32.update({"NormForward": (2e-5, 2e-6), "NormBackward": (2e-5, 2e-6), "ResampleForward": (2e-6, 1e-6),
              "ResampleBackward": (2e-6, 1e-6), "Softmax": (1e-5, 1e-6), "SoftmaxBackward": (1e-5, 1e-6),
              "LRNForward": (1e-5, 1e-6), "LRNBackward": (1e-5, 1e-6), "DivisiveNormalizationForward": (1e-5, 1e-6),
              "DivisiveNormalizationBackward": (1e-5, 1e-6), "RNNRecurrence": (1e-5, 1e-6),
              "RNNRecurrenceBackward": (1e-5, 1e-5)})
NHWC4 = lambda d: _layout_strides(d, "NHWC")  # noqa: E731


def _blended(kind, ins, role, y, attrs, beta, extra_outs=None):
    """[kind -> virtual -> y = alpha*result (+ beta*y_prior)] as the legacy calls build it (uids
    10 alpha, 11 beta, 12 the prior of y)."""
    tmp = virtual(90, y.dims, "float64" if y.dtype == "float64" else "float32")
    s = "float64" if y.dtype == "float64" else "float32"
    bl = {"x": tmp, "alpha1": scalar(10, s)}
    if beta:
        bl.update(b=Tensor(12, y.dims, y.strides, y.dtype), alpha2=scalar(11, s))
    return OperationGraph([Operation(kind, ins, {role: tmp, **(extra_outs or {})}, attrs),
                           Operation("Pointwise", bl, {"y": y}, {"mode": "ADD" if beta else "IDENTITY"})])


def _run_blended(kind, ins, role, y, attrs, data, dtype, rng, extra_outs=None):
    for alpha, beta in ((1.0, 0.0), (0.5, 0.0), (2.0, 0.75)):
        g = _blended(kind, ins, role, y, attrs, beta, extra_outs)
        d = dict(data)
        if beta:
            d[12] = _buffer(y, rng)
        run_both(g, d, {10: alpha, 11: beta}, kind, dtype)


# -- NormForward / NormBackward ----------------------------------------------------------------------
def _norm_tensors(xd, axes, dtype, layout, uid0=40):
    from cudnn_compat._backend.ops.resample_norm import param_dims
    pd = param_dims(xd, axes)
    x = T(1, xd, dtype, NHWC4(xd) if layout == "NHWC" else None)
    p = lambda u: T(u, pd, dtype)  # noqa: E731
    return x, p


@pytest.mark.parametrize("xd", [(4, 3, 5, 6), (5, 3, 2, 2)], ids=["planes30", "planes4"])  # 4: norm._sum's GEMV sums
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("axes", [(0, 2, 3), (0,)], ids=["spatial", "per_activation"])
def test_norm_forward_training(axes, layout, dtype, xd, rng):
    x, p = _norm_tensors(xd, axes, dtype, layout)
    ins = {"x": x, "scale": p(2), "bias": p(3), "running_mean": p(4), "running_var": p(5)}
    outs = {"saved_mean": p(6), "saved_inv_variance": p(7), "next_running_mean": p(8), "next_running_var": p(9)}
    data = {t.uid: _buffer(t, rng, positive=r == "running_var") for r, t in ins.items()}
    data[1] = data[1] * 3 + 50  # a large mean: the two-pass variance
    data[1][0, 1, 0, 0] = np.nan if axes == (0, 2, 3) else data[1][0, 1, 0, 0]  # channel 1 turns NaN
    attrs = {"phase": "TRAINING", "axes": axes, "epsilon": 1e-5, "exp_avg_factor": 0.25}
    y = T(20, xd, dtype, x.strides)
    _run_blended("NormForward", ins, "y", y, attrs, data, dtype, rng, outs)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_norm_forward_inference_and_by_value_epsilon(layout, dtype, rng):
    xd = (2, 4, 3, 5)
    x, p = _norm_tensors(xd, (0, 2, 3), dtype, layout)
    ins = {"x": x, "scale": p(2), "bias": p(3), "mean": p(4), "inv_variance": p(5)}
    data = {t.uid: _buffer(t, rng, positive=r == "inv_variance") for r, t in ins.items()}
    _run_blended("NormForward", ins, "y", T(20, xd, dtype, x.strides), {"phase": "INFERENCE", "axes": (0, 2, 3)},
                 data, dtype, rng)
    s = "float64" if dtype == "float64" else "float32"
    tins = {"x": x, "scale": p(2), "bias": p(3), "epsilon": scalar(30, s)}
    g = OperationGraph([Operation("NormForward", tins, {"y": T(20, xd, dtype, x.strides)}, {"phase": "TRAINING", "axes": (0, 2, 3)})])
    run_both(g, {u: data[u] for u in (1, 2, 3)}, {30: 1e-3}, "NormForward", dtype)


@pytest.mark.parametrize("xd", [(3, 4, 5, 4), (6, 4, 2, 2)], ids=["planes20", "planes4"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("saved", [True, False])
@pytest.mark.parametrize("axes", [(0, 2, 3), (0,)], ids=["spatial", "per_activation"])
def test_norm_backward(axes, saved, layout, dtype, xd, rng):
    x, p = _norm_tensors(xd, axes, dtype, layout)
    ins = {"x": x, "dy": T(21, xd, dtype, x.strides), "scale": p(2)}
    data = {1: _buffer(x, rng) * 2 + 10, 21: _buffer(ins["dy"], rng), 2: _buffer(p(2), rng)}
    attrs = {"axes": axes, "epsilon": 1e-4}
    if saved:
        ins.update(saved_mean=p(6), saved_inv_variance=p(7))
        data[6] = np.mean(data[1], axis=axes, keepdims=True)
        data[7] = 1 / np.sqrt(np.var(data[1], axis=axes, keepdims=True) + 1e-4)
    outs = {"dscale": p(8), "dbias": p(9)}
    _run_blended("NormBackward", ins, "dx", T(22, xd, dtype, x.strides), attrs, data, dtype, rng, outs)


@pytest.mark.parametrize("shape", [(7, 5, 2, 2), (3, 2, 4), (2, 3, 1, 1), (70000, 2, 2)])
def test_small_plane_sums_are_float64_sums(shape, rng):
    """norm._sum over planes of at most SMALL_PLANE elements (matrix-vector products over blocks of
    samples; 70000x2x2 spans two blocks): the float64 sums of the float32 data (a float32
    accumulation of values near 1e4 would be off by far more than the tolerance)."""
    from cudnn_compat._backend.engines.numpy_engine import norm
    axes = (0,) + tuple(range(2, len(shape)))
    assert math.prod(shape[2:]) <= norm.SMALL_PLANE
    a = (rng.standard_normal(shape) * 1e3 + 1e4).astype(np.float32)
    got = norm._sum(a, axes)
    want = a.astype(np.float64).sum(axis=axes, keepdims=True)
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-13)
    a[1, 1] = np.nan
    assert np.isnan(norm._sum(a, axes)[0, 1]).all() and not np.isnan(norm._sum(a, axes)[0, 0]).any()


def test_norm_forward_in_place(rng):
    """y bound to x's memory (no blend): every statistic is read before y is written."""
    xd = (4, 3, 6, 6)
    x, p = _norm_tensors(xd, (0, 2, 3), "float32", "NHWC")
    ins = {"x": x, "scale": p(2), "bias": p(3)}
    g = OperationGraph([Operation("NormForward", ins, {"y": T(20, xd, "float32", x.strides), "saved_mean": p(6),
                                                       "saved_inv_variance": p(7)},
                                  {"phase": "TRAINING", "axes": (0, 2, 3), "epsilon": 1e-5})])
    data = {t.uid: _buffer(t, rng) for t in ins.values()}
    want = {20: np.full(xd, np.nan, np.float32), 6: np.full(p(6).dims, np.nan, np.float32), 7: np.zeros(p(7).dims, np.float32)}
    planner.make_plan(g, "cpu", forced="reference").execute(VariantPack({**data, **want}))
    buf = data[1].copy()
    mean = np.full(p(6).dims, np.nan, np.float32)
    plan = planner.make_plan(g, "cpu")
    assert plan.engine == "numpy"
    plan.execute(VariantPack({1: buf, 2: data[2], 3: data[3], 20: buf, 6: mean, 7: np.zeros(p(7).dims, np.float32)}))
    np.testing.assert_allclose(buf, want[20], rtol=2e-5, atol=2e-6 * np.abs(want[20]).max())
    np.testing.assert_allclose(mean, want[6], rtol=1e-6)


# -- ResampleForward / ResampleBackward (pooling) -----------------------------------------------------
# (x dims, window, stride, pre_padding, y spatial dims) -- y one past the nominal size: empty windows
POOLS = [
    ((2, 3, 7, 7), (3, 3), (2, 2), (1, 1), (5, 5)),
    ((2, 3, 6, 5), (2, 2), (2, 2), (0, 0), (3, 3)),
    ((2, 3, 6, 5), (3, 2), (1, 2), (2, 0), (9, 3)),
    ((2, 3, 6, 6), (5, 5), (1, 1), (-1, 1), (3, 4)),
    ((2, 3, 5, 5), (5, 5), (1, 1), (0, 0), (1, 2)),  # global: one reduction per output position
    ((1, 2, 4, 5, 4), (2, 3, 2), (2, 1, 2), (1, 1, 0), (3, 4, 2)),  # 3-D
]
POOL_MODES = [("MAXPOOL", "PROPAGATE"), ("MAXPOOL", "NOT_PROPAGATE"), ("AVGPOOL_INCLUDE_PADDING", "NOT_PROPAGATE"),
              ("AVGPOOL_EXCLUDE_PADDING", "NOT_PROPAGATE")]


def _pool_case(case, layout, dtype, rng, nan=True):
    xd, win, st, pad, ysp = case
    x = T(1, xd, dtype, _layout_strides(xd, layout))
    yd = xd[:2] + ysp
    y = T(20, yd, dtype, _layout_strides(yd, layout))
    data = {1: _buffer(x, rng)}
    xv, sp = data[1], len(xd) - 2
    xv[(0, 0) + (0,) * sp] = xv[(0, 0) + (0,) * (sp - 1) + (1,)]  # a tie: the first in window order gets dy
    if nan:
        xv[(0, -1) + (1,) * sp] = np.nan
        xv[(-1, -1) + (slice(0, 3),) * sp] = np.nan  # whole windows of NaN
        xv[(-1, 0) + (2,) * sp] = -np.inf
    return x, y, data, {"window": win, "stride": st, "pre_padding": pad, "post_padding": pad}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", POOL_MODES, ids=lambda m: f"{m[0][:7]}_{m[1][:3]}")
@pytest.mark.parametrize("case", POOLS, ids=lambda c: "x" + "x".join(map(str, c[0])) + "_w" + "".join(map(str, c[1])))
def test_pooling(case, mode, layout, dtype, rng):
    x, y, data, attrs = _pool_case(case, layout, dtype, rng)
    attrs.update(mode=mode[0], nan_propagation=mode[1])
    _run_blended("ResampleForward", {"x": x}, "y", y, attrs, data, dtype, rng)
    dy = T(21, y.dims, dtype, y.strides)
    data.update({21: _buffer(dy, rng), 22: _buffer(y, rng)})
    ins = {"dy": dy, "x": x, "y": T(22, y.dims, dtype, y.strides)}
    _run_blended("ResampleBackward", ins, "dx", T(23, x.dims, dtype, x.strides), attrs, data, dtype, rng)


# Per spatial dim (x, window, stride, pre_padding): window taps that cover every output or not (the
# max seeds y from the covering ones, in any position of the window order), windows past x,
# negative padding, a window as large as x (one reduction per output position)
POOL_DIMS = [(7, 3, 2, 1), (9, 2, 2, 1), (7, 3, 1, 0), (6, 1, 3, 0), (5, 4, 1, 2), (6, 3, 2, -1), (4, 4, 1, 0)]


def _pool_grid():
    """(x dims, window, stride, pre_padding, y spatial dims): test_cupy_engine's pooling geometries,
    every ordered pair of POOL_DIMS (y one past the nominal size in the last dim: empty windows)
    and 3-D runs of three."""
    nominal = lambda x, w, s, p: max(1, (x + 2 * p - w) // s + 1)  # noqa: E731
    grid = [(xd, win, st, pad, tuple(map(nominal, xd[2:], win, st, pad))) for xd, win, pad, st, *_ in POOL_CASES]
    for dims in [*itertools.product(POOL_DIMS, repeat=2), *(POOL_DIMS[i:i + 3] for i in range(len(POOL_DIMS) - 2))]:
        xs, win, st, pad = zip(*dims)
        ys = tuple(nominal(*d) for d in dims)
        grid.append(((2, 3) + xs, win, st, pad, ys[:-1] + (ys[-1] + 1,)))
    return grid


@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "strided"])
@pytest.mark.parametrize("mode", POOL_MODES, ids=lambda m: f"{m[0][:7]}_{m[1][:3]}")
def test_pooling_geometry_grid(mode, layout, rng):
    """Forward and backward over _pool_grid, x, y, dy and dx in ``layout``, with NaN, -inf and ties."""
    for case in _pool_grid():
        x, y, data, attrs = _pool_case(case, layout, "float32", rng)
        attrs.update(mode=mode[0], nan_propagation=mode[1])
        run_both(OperationGraph([Operation("ResampleForward", {"x": x}, {"y": y}, attrs)]), data, {}, "ResampleForward")
        dy, dx = T(21, y.dims, "float32", y.strides), T(23, x.dims, "float32", x.strides)
        data.update({21: _buffer(dy, rng), 22: _buffer(y, rng)})
        g = OperationGraph([Operation("ResampleBackward", {"dy": dy, "x": x, "y": T(22, y.dims, "float32", y.strides)},
                                      {"dx": dx}, attrs)])
        run_both(g, data, {}, "ResampleBackward")


@pytest.mark.parametrize("mode", POOL_MODES, ids=lambda m: f"{m[0][:7]}_{m[1][:3]}")
def test_pooling_half(mode, rng):
    xd, yd = (2, 3, 7, 7), (2, 3, 4, 4)
    attrs = {"window": (3, 3), "stride": (2, 2), "pre_padding": (1, 1), "post_padding": (1, 1),
             "mode": mode[0], "nan_propagation": mode[1]}
    x, dy, dx = T(1, xd, "float16"), T(2, yd, "float16"), T(4, xd, "float16")
    xs = rng.standard_normal(xd).astype(np.float16)
    xs[0, 0, 1, 1] = np.nan
    run_both(OperationGraph([Operation("ResampleForward", {"x": x}, {"y": T(3, yd, "float16")}, attrs)]), {1: xs}, {},
             "ResampleForward", "float16")
    g = OperationGraph([Operation("ResampleBackward", {"dy": dy, "x": x, "y": T(5, yd, "float16")}, {"dx": dx}, attrs)])
    run_both(g, {1: xs, 2: rng.standard_normal(yd).astype(np.float16), 5: np.zeros(yd, np.float16)}, {},
             "ResampleBackward", "float16")


def test_max_pooling_backward_routes_to_the_nan():
    """PROPAGATE: a window holding a NaN gives NaN, and its gradient goes to the (first) NaN; NOT_PROPAGATE:
    the max of the other elements gets it; an all-NaN window gives the lowest float and routes nothing."""
    xd, yd = (1, 1, 2, 4), (1, 1, 1, 2)
    x = np.array([[[[1.0, np.nan, 5.0, np.nan], [3.0, np.nan, np.nan, np.nan]]]], np.float32)
    for prop, want_y, want_dx in (
            ("PROPAGATE", [np.nan, np.nan], [[0, 2, 0, 3], [0, 0, 0, 0]]),
            ("NOT_PROPAGATE", [3.0, 5.0], [[0, 0, 3, 0], [2, 0, 0, 0]])):
        attrs = {"mode": "MAXPOOL", "window": (2, 2), "stride": (2, 2), "pre_padding": (0, 0), "post_padding": (0, 0),
                 "nan_propagation": prop}
        for eng in ("numpy", "reference"):
            y = np.zeros(yd, np.float32)
            planner.make_plan(OperationGraph([Operation("ResampleForward", {"x": T(1, xd)}, {"y": T(2, yd)}, attrs)]),
                              "cpu", forced=eng).execute(VariantPack({1: x, 2: y}))
            np.testing.assert_array_equal(y.reshape(-1), want_y)
            dx = np.full(xd, np.nan, np.float32)
            g = OperationGraph([Operation("ResampleBackward", {"dy": T(3, yd), "x": T(1, xd), "y": T(2, yd)},
                                          {"dx": T(4, xd)}, attrs)])
            planner.make_plan(g, "cpu", forced=eng).execute(VariantPack({1: x, 2: y, 3: np.array([[[[2.0, 3.0]]]], np.float32), 4: dx}))
            np.testing.assert_array_equal(dx.reshape(2, 4), want_dx)
    lowest = np.zeros(yd, np.float32)
    xn = np.full(xd, np.nan, np.float32)
    attrs["nan_propagation"] = "NOT_PROPAGATE"
    planner.make_plan(OperationGraph([Operation("ResampleForward", {"x": T(1, xd)}, {"y": T(2, yd)}, attrs)]),
                      "cpu").execute(VariantPack({1: xn, 2: lowest}))
    assert (lowest == np.finfo(np.float32).min).all()


# -- Softmax / SoftmaxBackward -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("axes", [(1,), (1, 2, 3)], ids=["channel", "instance"])
@pytest.mark.parametrize("algo", ["FAST", "ACCURATE", "LOG"])
def test_softmax(algo, axes, layout, dtype, rng):
    xd = (3, 5, 4, 6)
    x = T(1, xd, dtype, _layout_strides(xd, layout))
    data = {1: _buffer(x, rng) * 4}
    data[1][0, 1, 2, 3] = np.nan
    data[1][1, :, 0, 0] = -np.inf  # every channel -inf: NaN, as exp(x - max) = exp(NaN)
    attrs = {"algorithm": algo, "axes": axes}
    _run_blended("Softmax", {"x": x}, "y", T(20, xd, dtype, x.strides), attrs, data, dtype, rng)
    y, dy = T(2, xd, dtype, x.strides), T(3, xd, dtype, x.strides)
    with np.errstate(all="ignore"):
        sm = np.exp(data[1] - np.nanmax(data[1], axis=axes, keepdims=True))
        sm = sm / np.nansum(sm, axis=axes, keepdims=True)
        data = {2: np.log(sm) if algo == "LOG" else sm, 3: _buffer(dy, rng)}
    _run_blended("SoftmaxBackward", {"y": y, "dy": dy}, "dx", T(21, xd, dtype, x.strides), attrs, data, dtype, rng)


def test_softmax_half_and_in_place_backward(rng):
    xd = (2, 7, 3, 3)
    attrs = {"algorithm": "ACCURATE", "axes": (1,)}
    xs = (rng.standard_normal(xd) * 3).astype(np.float16)
    run_both(OperationGraph([Operation("Softmax", {"x": T(1, xd, "float16")}, {"y": T(2, xd, "float16")}, attrs)]), {1: xs},
             {}, "Softmax", "float16")
    y = np.exp(xs.astype(np.float32))
    y = (y / y.sum(axis=1, keepdims=True)).astype(np.float32)
    dy = rng.standard_normal(xd).astype(np.float32)
    want = y * (dy - (dy * y).sum(axis=1, keepdims=True))
    g = OperationGraph([Operation("SoftmaxBackward", {"y": T(1, xd), "dy": T(2, xd)}, {"dx": T(3, xd)}, attrs)])
    plan = planner.make_plan(g, "cpu")
    assert plan.engine == "numpy"
    plan.execute(VariantPack({1: y, 2: dy, 3: dy}))  # dx in dy's memory
    np.testing.assert_allclose(dy, want, rtol=1e-5, atol=1e-6)


# -- LRN and divisive normalization ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_lrn(n, layout, dtype, rng):
    xd = (2, 7, 4, 5)
    x = T(1, xd, dtype, _layout_strides(xd, layout))
    data = {1: _buffer(x, rng)}
    data[1][0, 3, 1, 1] = np.nan
    attrs = {"n": n, "alpha": 1e-2 * n, "beta": 0.75, "k": 2.0}
    _run_blended("LRNForward", {"x": x}, "y", T(20, xd, dtype, x.strides), attrs, data, dtype, rng)
    _run_blended("DivisiveNormalizationForward", {"x": x}, "y", T(20, xd, dtype, x.strides), attrs, data, dtype, rng)
    y, dy = T(2, xd, dtype, x.strides), T(3, xd, dtype, x.strides)
    data.update({2: _buffer(y, rng), 3: _buffer(dy, rng)})
    _run_blended("LRNBackward", {"x": x, "y": y, "dy": dy}, "dx", T(21, xd, dtype, x.strides), attrs, data, dtype, rng)
    _run_blended("DivisiveNormalizationBackward", {"x": x, "dy": dy}, "dx", T(21, xd, dtype, x.strides), attrs, data,
                 dtype, rng, {"dmeans": T(22, xd, dtype, x.strides)})


def test_divisive_normalization_3d_and_means_declined(rng):
    xd = (2, 3, 4, 5, 3)
    attrs = {"n": 3, "alpha": 0.1, "beta": 0.6, "k": 1.5}
    x, dy = T(1, xd), T(3, xd)
    data = {1: _buffer(x, rng), 3: _buffer(dy, rng)}
    g = OperationGraph([Operation("DivisiveNormalizationBackward", {"x": x, "dy": dy}, {"dx": T(4, xd), "dmeans": T(5, xd)}, attrs)])
    run_both(g, data, {}, "DivisiveNormalizationBackward")
    g = OperationGraph([Operation("DivisiveNormalizationForward", {"x": x, "means": T(2, xd)}, {"y": T(4, xd)}, attrs)])
    assert planner.make_plan(g, "cpu").engine == "reference"


# -- RNNRecurrence / RNNRecurrenceBackward --------------------------------------------------------------
RNN_LAYOUTS = {"SEQ": (3, 1, 2), "BATCH": (2, 3, 0), "PACKED": (3, 2, 2)}  # padded SEQ/BATCH, a 0-length one


def _rnn_ops(mode, layout, dirs, dtype, proj=False, clip=None, x_form=()):
    from cudnn_compat._backend.ops.rnn import GATES, rows_of
    lengths, H, T_ = RNN_LAYOUTS[layout], 3, 3
    D, B, g = len(dirs), len(lengths), GATES[mode]
    Ho = 2 if proj else H
    N = rows_of(layout, T_, lengths)
    attrs = {"mode": mode, "layout": layout, "T": T_, "lengths": lengths, "directions": dirs, "clip": clip}
    s = "float64" if dtype == "float64" else "float32"
    t = lambda uid, *dims: T(uid, dims, dtype)  # noqa: E731
    fi = {"gx": t(1, D, N, g * H), "w_rec": t(2, D, g * H, Ho), "hx": t(3, D, B, Ho)}
    fo = {"y": t(20, D, N, Ho), "hy": t(21, D, B, Ho), "acts": t(22, D, N, g * H)}
    if x_form is not None and x_form != ():  # the op's x form: gx computed from x (I = 4), written out
        fo["gx"] = fi.pop("gx")
        fi.update(x=T(10, (D, N, 4), dtype, (0, 5, 1)), w_in=t(11, D, g * H, 4))
        fi.update({role: t(uid, D, 1, g * H) for role, uid in (("b_x", 12), ("b_h", 13)) if role in x_form})
    bi = {"dy": t(40, D, N, Ho), "w_rec": fi["w_rec"], "dhy": t(41, D, B, Ho)}
    bo = {"dgates": t(50, D, N, g * H), "dhx": t(51, D, B, Ho)}
    if mode in ("RELU", "TANH"):
        fo.pop("acts")
        bi["y"] = t(42, D, N, Ho)
    if layout != "PACKED":
        fi["fill"] = scalar(5, s)
    if mode == "LSTM":
        fi["cx"] = t(4, D, B, H)
        fo.update(cy=t(23, D, B, H), c_all=t(24, D, N, H))
        bi.update(acts=t(43, D, N, g * H), c_all=t(44, D, N, H), cx=fi["cx"], dcy=t(45, D, B, H))
        bo["dcx"] = t(52, D, B, H)
        if proj:
            fi["wr"] = bi["wr"] = t(6, D, Ho, H)
            fo["hpre"] = t(25, D, N, H)
            bo["dr"] = t(53, D, N, Ho)
        if clip:
            fi.update(lclip=scalar(7, s), rclip=scalar(8, s))
            bi.update(lclip=fi["lclip"], rclip=fi["rclip"])
    if mode == "GRU":
        fi["b_rec"] = t(9, D, 1, H)
        fo["grn"] = t(26, D, N, H)
        bi.update(acts=t(43, D, N, g * H), grn=t(46, D, N, H), y=t(42, D, N, Ho), hx=fi["hx"])
        bo["dgrn"] = t(54, D, N, H)
    return (OperationGraph([Operation("RNNRecurrence", fi, fo, attrs)]),
            OperationGraph([Operation("RNNRecurrenceBackward", bi, bo, attrs)]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dirs", [(False,), (False, True)], ids=["uni", "bi"])
@pytest.mark.parametrize("layout", sorted(RNN_LAYOUTS))
@pytest.mark.parametrize("mode", ["RELU", "TANH", "LSTM", "GRU"])
def test_rnn_recurrence(mode, layout, dirs, dtype, rng):
    fwd, bwd = _rnn_ops(mode, layout, dirs, dtype)
    data = {t.uid: _buffer(t, rng) for g in (fwd, bwd) for t in g.external_inputs() if not t.is_by_value}
    run_both(fwd, data, {5: -7.0}, "RNNRecurrence", dtype)
    run_both(bwd, data, {}, "RNNRecurrenceBackward", dtype)


@pytest.mark.parametrize("biases", [("b_x", "b_h"), ("b_h",), ("none",)], ids=["both", "b_h", "none"])
@pytest.mark.parametrize("layout", ["SEQ", "PACKED"])
@pytest.mark.parametrize("mode", ["TANH", "LSTM", "GRU"])
def test_rnn_recurrence_x_form(mode, layout, biases, rng):
    """The input projection inside the op (gx = x W_in^T + b_x + b_h, GRU: b_h of gates r, z):
    gx and every output against the reference engine; x one buffer for both directions."""
    fwd, _ = _rnn_ops(mode, layout, (False, True), "float32", x_form=biases)
    data = {t.uid: _buffer(t, rng) for t in fwd.external_inputs() if not t.is_by_value}
    run_both(fwd, data, {5: -7.0}, "RNNRecurrence")


@pytest.mark.parametrize("clip", [None, "PROPAGATE", "NOT_PROPAGATE"])
def test_lstm_projection_and_clip(clip, rng):
    fwd, bwd = _rnn_ops("LSTM", "SEQ", (True, False), "float32", proj=True, clip=clip)
    data = {t.uid: _buffer(t, rng) * 2 for g in (fwd, bwd) for t in g.external_inputs() if not t.is_by_value}
    data[1][0, 2, :] = np.nan  # a NaN pre-activation: the clip's NaN rule
    run_both(fwd, data, {5: 0.0, 7: -0.5, 8: 0.4}, "RNNRecurrence")
    run_both(bwd, data, {7: -0.5, 8: 0.4}, "RNNRecurrenceBackward")


# -- Rng (dropout masks): bit for bit ---------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_rng_mask_and_offset_in_place(p):
    """The keep mask and the advanced offset, with offset_out bound to the offset's memory."""
    i32 = lambda uid: Tensor(uid, (2,), (1,), "int32")  # noqa: E731
    g = OperationGraph([Operation("Rng", {"seed": i32(1), "offset": i32(2)}, {"y": T(3, (3, 5, 7)), "offset_out": i32(4)},
                                  {"distribution": "BERNOULLI", "drop_probability": p, "block_offset": 3})])
    got = {}
    for eng in ("numpy", "reference"):
        plan = planner.make_plan(g, "cpu", forced=eng)
        offset, y = np.array([-5, 7], np.int32), np.full((3, 5, 7), np.nan, np.float32)
        plan.execute(VariantPack({1: np.array([-123456789, 2 ** 31 - 1], np.int32), 2: offset, 3: y, 4: offset}))
        got[eng] = (y, offset)
    assert planner.make_plan(g, "cpu").engine == "numpy"
    np.testing.assert_array_equal(got["numpy"][0], got["reference"][0])
    np.testing.assert_array_equal(got["numpy"][1], got["reference"][1])
    assert set(np.unique(got["numpy"][0])) <= {0.0, 1.0} and got["numpy"][1][0] == -5 + 27
