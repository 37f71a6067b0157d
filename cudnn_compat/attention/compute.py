"""Multi-head attention compute calls (002 §7.2.35 cudnnMultiHeadAttnForward, §8.2.15
BackwardData, §8.2.16 BackwardWeights).  The descriptors and the weight and buffer queries
(§7.2.15, §7.2.16) are ``attention.descriptor``.

The model (002 §7.2.43), per head i and query time step t, with W_Q,i [P x qSize] etc.:
    Qp = W_Q,i q + b_Q,i,  Kp = W_K,i K + b_K,i,  Vp = W_V,i V + b_V,i   (projection size 0: no
    projection, the input itself), A = softmax(smScaler Kp^T Qp) over the attention window,
    h_i = Vp A,  out = sum_i W_O,i h_i + b_O (oProjSize 0: out = the concatenated h_i)
    (+ residuals, which share qDesc).
Every call is one graph of Matmul, Softmax/SoftmaxBackward, Pointwise and Reduction ops
over 5-d views [batch, beam, head, time, vector] of the caller's buffers (the sequence data
layouts are strides; transposed operands are transposed views, so no copy op is needed).
Backward graphs recompute the forward in both orientations (S = Qp Kp^T and S^T = Kp Qp^T)
because the IR cannot transpose a virtual tensor.

Masks: the attention window [loWinIdx[t], hiWinIdx[t]) and the key sequence lengths give a
0/1 mask M [batch, beam, Tq, Tk] built on the host (a data input, so plans do not depend
on it; on the GPU kept on the device per window/length content); the graph forms
A = softmax(smScaler S - BIG (1 - M)) and h = (A Vp) R with R = max_k M, the same as
(A * M) Vp, so a query row with an empty window attends to nothing (h = 0, out = output bias +
residual).  Query rows at or past
the query sequence length are padding: out is written 0 there and dout there is ignored.
In training mode the forward stores M in the reserve space, because
cudnnMultiHeadAttnBackwardWeights takes no window arrays; the reserve space holds that mask
in the compute type ([batch, beam, Tq, Tk], packed), then (HALF data) the fused path's state
(``descriptor.fused_regions``).  Work space: none (0).

On a GPU handle each call first asks ``attention.fused`` whether the fused flash-attention path
takes it (issue 24); where it does not, this graph path runs and the reason is the plan's first
decline (``_run``'s ``declined``).

The weight buffer's layout is ``attention.descriptor.weight_layout``.  Unlike cuDNN 8.0,
projection biases are supported by the gradient calls too.  A non-NULL paddingFill is
NOT_SUPPORTED.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.heuristics import forced_engine
from .._core import bound_graph as bg
from .._core.call import compute_dtype, set_last_plan as _set_last
from .._core.data import preflight
from .._core.registry import legacy
from ..ctc import host_ints, on_place
from ..enums import ENUMS, is_valid, name_of
from ..errors import check
from ..handle import get_handle
from . import fused
from .descriptor import (BATCH, BEAM, TIME, VECT, WKIND, AttnDescriptor, _reserve_size, attn_desc, seq_desc,
                         weight_layout)

WGRAD = ENUMS["cudnnWgradMode_t"]
BIG = 1e30  # the masked-score offset: exp(-BIG) is 0 in every compute type


# -- the graphs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Cfg:
    """Everything a graph depends on (the plan signature)."""

    a: tuple  # attn key
    dtype: str
    ct: str
    heads: int
    sizes: tuple  # qSize, kSize, vSize
    proj: tuple  # qProjSize, kProjSize, vProjSize, oProjSize
    qk: int
    pv: int
    po: int
    biases: bool
    b: int
    bq: int
    bk: int
    tq: int
    tk: int
    strides: tuple  # ((role, (batch, beam, time) strides), ...) for roles q, k, v, o
    layout: tuple  # ((kind, offset_elems, dims), ...)
    math: str = "DEFAULT_MATH"  # the descriptor's math type, stamped on every Matmul (math_policy)


_CFGS: dict = {}  # descriptor keys -> _Cfg (a repeated call builds its signature once)


def _cfg(a: AttnDescriptor, qd, kd, vd, od, tq: int) -> _Cfg:
    key = (a.key(), qd.key(), kd.key(), vd.key(), od.key(), tq)
    got = _CFGS.get(key)
    if got is None:
        if len(_CFGS) > 256:
            _CFGS.clear()
        got = _CFGS[key] = _make_cfg(a, qd, kd, vd, od, tq)
    return got


def _make_cfg(a: AttnDescriptor, qd, kd, vd, od, tq: int) -> _Cfg:
    layout, _ = weight_layout(a)
    item = dtypes.itemsize(a.dtype)
    strides = tuple((role, tuple(d.strides()[ax] for ax in (BATCH, BEAM, TIME)))
                    for role, d in (("q", qd), ("k", kd), ("v", vd), ("o", od)))
    return _Cfg(a.key(), a.dtype, compute_dtype(a.dtype), a.nHeads, (a.qSize, a.kSize, a.vSize),
                (a.qProjSize, a.kProjSize, a.vProjSize, a.oProjSize), a.qk_size, a.v_out, a.o_size, a.biases,
                qd.dimA[BATCH], qd.dimA[BEAM], kd.dimA[BEAM], tq, kd.dimA[TIME], strides,
                tuple((k, off // item, dims) for k, (off, dims) in sorted(layout.items())),
                name_of("cudnnMathType_t", a.mathType)[len("CUDNN_"):])


class _Graph:
    """Builds the attention graph pieces on demand (a piece no output needs is never built, so
    every virtual tensor has a consumer).  Tensors are 5-d: [batch, beam, head, row, col].

    Precision: the softmax, its input and its gradient, the masks and every Reduction are in the
    compute type; the operands and products of the GEMMs (projections, scores S, probabilities A,
    heads h, their gradients) are in ``lo``, the data type for HALF data (as torch's and cuDNN's
    fp16 attention keep them), so every Matmul is fp16 x fp16 -> fp16 with fp32 accumulation
    (tensor cores under TENSOR_OP_MATH) and the big [.., Tq, Tk] tensors move half the bytes."""

    def __init__(self, name: str, c: _Cfg):
        self.c = c
        self.b = bg.GraphBuilder(name, c.ct)
        self.lo = c.dtype if c.dtype == "float16" else c.ct
        self.memo = {}
        self.weights = {k: (off, dims) for k, off, dims in c.layout}
        self.strides = dict(c.strides)

    # -- leaves -------------------------------------------------------------------------------
    def seq(self, buf, role, t, v, heads=1, transposed=False, name=None):
        """A view of sequence buffer ``buf`` laid out as descriptor ``role`` (q, k, v, o) as
        [B, beam, heads, t, v] (or [..., v, t]); heads > 1 splits the vector into heads (the
        concatenated output of oProjSize = 0)."""
        c = self.c
        sb, sbeam, st = self.strides[role]
        beams = c.bq if role in ("q", "o") else c.bk
        dims = (c.b, beams, heads, t, v)
        strides = (sb, sbeam, v, st, 1)
        if transposed:
            dims, strides = dims[:3] + (v, t), strides[:3] + (1, st)
        return self.b.ext(buf, 0, dims, strides, c.dtype, name or buf)

    def weight(self, kind, transposed=False, buf="weights", name=None):
        """W [1, 1, H, P, S] (or W^T [1, 1, H, S, P]) of weight kind ``kind``."""
        off, (h, p, s) = self.weights[WKIND[kind]]
        dims, strides = (1, 1, h, p, s), (1, 1, p * s, s, 1)
        if transposed:
            dims, strides = (1, 1, h, s, p), (1, 1, p * s, 1, s)
        return self.b.ext(buf, off, dims, strides, self.c.dtype, name or f"{buf}:{kind}")

    def bias(self, kind, column=False, buf="weights", name=None):
        """b [1, 1, H, 1, P] as a row (or [1, 1, H, P, 1] as a column)."""
        off, (h, p, _) = self.weights[WKIND[kind]]
        dims = (1, 1, h, p, 1) if column else (1, 1, h, 1, p)
        return self.b.ext(buf, off, dims, (1, 1, p, 1, 1), self.c.dtype, name or f"{buf}:{kind}")

    def has(self, kind) -> bool:
        return WKIND[kind] in self.weights

    def mask(self, transposed=False):
        c = self.c
        dims, strides = (c.b, c.bq, 1, c.tq, c.tk), (c.bq * c.tq * c.tk, c.tq * c.tk, 1, c.tk, 1)
        if transposed:
            dims, strides = (c.b, c.bq, 1, c.tk, c.tq), (c.bq * c.tq * c.tk, c.tq * c.tk, 1, 1, c.tk)
        return self.b.ext("mask", 0, dims, strides, c.ct, "maskT" if transposed else "mask")

    def rows(self, transposed=False):
        c = self.c
        dims = (c.b, c.bq, 1, 1, c.tq) if transposed else (c.b, c.bq, 1, c.tq, 1)
        return self.b.ext("rowMask", 0, dims, (c.bq * c.tq, c.tq, 1, 1, 1), c.ct, "rowMask")

    # -- ops --------------------------------------------------------------------------------------
    def get(self, key, fn):
        if key not in self.memo:
            self.memo[key] = fn()
        return self.memo[key]

    def mm(self, a, b):
        batch = tuple(max(x, y) for x, y in zip(a.dims[:-2], b.dims[:-2]))
        out = self.b.virt(batch + (a.dims[-2], b.dims[-1]), self.lo)
        self.b.op("Matmul", {"a": a, "b": b}, {"c": out}, {"math_type": self.c.math})
        return out

    def low(self, mode, x, b=None, **kw):
        """Pointwise ``mode`` whose result feeds GEMMs: a ``lo`` virtual tensor."""
        dims = x.dims if b is None else tuple(max(p, q) for p, q in zip(x.dims, b.dims))
        return self.b.pw(mode, x, b, out=self.b.virt(dims, self.lo), **kw)

    def reduce(self, x, dims, out=None):
        out = out if out is not None else self.b.virt(dims)
        self.b.op("Reduction", {"x": x}, {"y": out}, {"mode": "ADD"})
        return out

    def softmax(self, x, axis):
        y = self.b.virt(x.dims, self.lo)
        self.b.op("Softmax", {"x": x}, {"y": y}, {"algorithm": "ACCURATE", "axes": (axis,)})
        return y

    def softmax_bwd(self, y, dy, axis):
        dx = self.b.virt(y.dims)
        self.b.op("SoftmaxBackward", {"y": y, "dy": dy}, {"dx": dx}, {"algorithm": "ACCURATE", "axes": (axis,)})
        return dx

    def pw2(self, mode, x, b, alpha1=None, alpha2=None, dims=None, out=None):
        """Pointwise ``mode``(alpha1*x, alpha2*b) into ``out`` or a new virtual of ``dims``."""
        if out is None:
            out = self.b.virt(dims or tuple(max(p, q) for p, q in zip(x.dims, b.dims)))
        ins = {"x": x, "b": b}
        if alpha1 is not None:
            ins["alpha1"] = alpha1
        if alpha2 is not None:
            ins["alpha2"] = alpha2
        self.b.op("Pointwise", ins, {"y": out}, {"mode": mode})
        return out

    # -- the forward, in both orientations ------------------------------------------------------
    def proj(self, x, which, transposed):
        """Qp = X W^T (+ b) [.., T, P] or, transposed, Qp^T = W X^T (+ b^T) [.., P, T]."""
        kind = f"CUDNN_MH_ATTN_{which}_WEIGHTS"
        if not self.has(kind):
            return x
        y = self.mm(self.weight(kind), x) if transposed else self.mm(x, self.weight(kind, transposed=True))
        bkind = f"CUDNN_MH_ATTN_{which}_BIASES"
        if self.has(bkind):
            y = self.low("ADD", y, self.bias(bkind, column=transposed))
        return y

    def input(self, which, transposed=False):
        c = self.c
        size = {"Q": c.sizes[0], "K": c.sizes[1], "V": c.sizes[2]}[which]
        t = c.tq if which == "Q" else c.tk
        buf = {"Q": "queries", "K": "keys", "V": "values"}[which]
        return self.get(("in", which, transposed), lambda: self.seq(buf, which.lower(), t, size, transposed=transposed))

    def projected(self, which, transposed=False):
        return self.get(("proj", which, transposed),
                        lambda: self.proj(self.input(which, transposed), which, transposed))

    def full(self, rows, cols):
        c = self.c
        return (c.b, c.bq, c.heads, rows, cols)

    def not_mask(self, transposed):
        return self.get(("notmask", transposed), lambda: self.b.pw("NOT", self.mask(transposed)))

    def row_any(self, transposed=False):
        """R = max over keys of M: [B, beam, 1, Tq, 1] (or [.., 1, Tq]); 0 for a query row whose
        window is empty."""
        c = self.c
        dims = (c.b, c.bq, 1, 1, c.tq) if transposed else (c.b, c.bq, 1, c.tq, 1)
        return self.get(("rowany", transposed),
                        lambda: self.b.op("Reduction", {"x": self.mask(transposed)}, {"y": self.b.virt(dims)},
                                          {"mode": "MAX"})["y"])

    def probs(self, transposed=False):
        """A = softmax(smScaler S - BIG (1 - M)); S = Qp Kp^T, or S^T.  Masked keys get exactly 0
        (exp(-BIG) underflows) unless the whole row is masked; such rows are zeroed by R on the
        other GEMM operand (h = (A Vp) R, dVp = A^T (dh R)), which is the same as A * M but keeps
        the softmax free of a broadcast epilogue (so its fast row kernel applies)."""
        c = self.c

        def pre():
            if transposed:
                s = self.mm(self.projected("K"), self.projected("Q", True))
                dims, axis = self.full(c.tk, c.tq), 3
            else:
                s = self.mm(self.projected("Q"), self.projected("K", True))
                dims, axis = self.full(c.tq, c.tk), 4
            z = self.pw2("SUB", s, self.not_mask(transposed), self.b.scalar("smScaler"), self.b.scalar("big"), dims=dims)
            return self.softmax(z, axis)

        return self.get(("apre", transposed), pre)

    def heads_out(self):
        """h = A Vp  [B, beam, H, Tq, Pv]."""
        return self.get("h", lambda: self.low("MUL", self.mm(self.probs(), self.projected("V")), self.row_any()))

    def out_view(self, buf, transposed=False):
        """The output-shaped view of ``buf`` (out, residuals, dout): [B, beam, 1, Tq, Po], or the
        per-head split [B, beam, H, Tq, Pv] of the concatenation when oProjSize is 0."""
        c = self.c
        if self.has("CUDNN_MH_ATTN_O_WEIGHTS"):
            return self.seq(buf, "o", c.tq, c.po, transposed=transposed)
        return self.seq(buf, "o", c.tq, c.pv, heads=c.heads, transposed=transposed)

    def forward(self, residuals: bool):
        c = self.c
        y = self.heads_out()
        if self.has("CUDNN_MH_ATTN_O_WEIGHTS"):
            y = self.reduce(self.mm(y, self.weight("CUDNN_MH_ATTN_O_WEIGHTS", transposed=True)), (c.b, c.bq, 1, c.tq, c.po))
            if self.has("CUDNN_MH_ATTN_O_BIASES"):
                y = self.pw2("ADD", y, self.bias("CUDNN_MH_ATTN_O_BIASES"))
        if residuals:
            y = self.pw2("ADD", y, self.out_view("residuals"))
        self.pw2("MUL", y, self.rows(), out=self.out_view("out"))

    # -- backward -----------------------------------------------------------------------------------
    def d_out(self, transposed=False):
        """dY = dout * rowMask, in the output view (padding rows of dout are ignored)."""
        return self.get(("dy", transposed), lambda: self.low("MUL", self.out_view("dout", transposed), self.rows(transposed)))

    def d_heads(self, transposed=False):
        """dh = dY W_O [B, beam, H, Tq, Pv] (or dh^T = W_O^T dY^T)."""
        def fn():
            dy = self.d_out(transposed)
            if not self.has("CUDNN_MH_ATTN_O_WEIGHTS"):
                return dy
            if transposed:
                return self.mm(self.weight("CUDNN_MH_ATTN_O_WEIGHTS", transposed=True), dy)
            return self.mm(dy, self.weight("CUDNN_MH_ATTN_O_WEIGHTS"))
        return self.get(("dh", transposed), fn)

    def d_heads_rows(self, transposed=False):
        """dh R (or dh^T R^T): the gradient reaching A from h = (A Vp) R."""
        return self.get(("dhr", transposed), lambda: self.low("MUL", self.d_heads(transposed), self.row_any(transposed)))

    def d_scores(self, transposed=False):
        """dS = smScaler * softmax'(dA * M) with dA = dh Vp^T (or dS^T from dA^T = Vp dh^T)."""
        def fn():
            if transposed:
                da = self.mm(self.projected("V"), self.d_heads(True))
            else:
                da = self.mm(self.d_heads(), self.projected("V", True))
            dam = self.b.pw("MUL", da, self.mask(transposed))
            dz = self.softmax_bwd(self.probs(transposed), dam, 3 if transposed else 4)
            return self.low("IDENTITY", dz, alpha1=self.b.scalar("smScaler"))
        return self.get(("ds", transposed), fn)

    def d_projected(self, which):
        """dQp = dS Kp, dKp = dS^T Qp, dVp = A^T dh  ([.., T, P])."""
        def fn():
            if which == "Q":
                return self.mm(self.d_scores(), self.projected("K"))
            if which == "K":
                return self.mm(self.d_scores(True), self.projected("Q"))
            return self.mm(self.probs(True), self.d_heads_rows())
        return self.get(("dproj", which), fn)

    def d_projected_t(self, which):
        """dQp^T = Kp^T dS^T, dKp^T = Qp^T dS, dVp^T = dh^T A  ([.., P, T])."""
        def fn():
            if which == "Q":
                return self.mm(self.projected("K", True), self.d_scores(True))
            if which == "K":
                return self.mm(self.projected("Q", True), self.d_scores())
            return self.mm(self.d_heads_rows(True), self.probs())
        return self.get(("dprojT", which), fn)

    def backward_data(self):
        c = self.c
        for which, buf, side, t, size in (("Q", "dqueries", "q", c.tq, c.sizes[0]), ("K", "dkeys", "k", c.tk, c.sizes[1]),
                                          ("V", "dvalues", "v", c.tk, c.sizes[2])):
            g = self.d_projected(which)
            kind = f"CUDNN_MH_ATTN_{which}_WEIGHTS"
            if self.has(kind):
                g = self.mm(g, self.weight(kind))
            self.reduce(g, None, out=self.seq(buf, side, t, size))

    def backward_weights(self, add: bool):
        c = self.c

        def store(result, view, prior):
            if add:
                self.pw2("ADD", result, prior, out=view)
            else:
                self.b.pw("IDENTITY", result, out=view)

        for which in ("Q", "K", "V"):
            kind = f"CUDNN_MH_ATTN_{which}_WEIGHTS"
            if self.has(kind):
                g = self.mm(self.d_projected_t(which), self.input(which))
                h, p, s = self.weights[WKIND[kind]][1]
                store(self.reduce(g, (1, 1, h, p, s)), self.weight(kind, buf="dweights"),
                      self.weight(kind, buf="dweights", name=f"dweights_prior:{kind}") if add else None)
            bkind = f"CUDNN_MH_ATTN_{which}_BIASES"
            if self.has(bkind):
                h, p, _ = self.weights[WKIND[bkind]][1]
                store(self.reduce(self.d_projected(which), (1, 1, h, 1, p)), self.bias(bkind, buf="dweights"),
                      self.bias(bkind, buf="dweights", name=f"dweights_prior:{bkind}") if add else None)
        kind = "CUDNN_MH_ATTN_O_WEIGHTS"
        if self.has(kind):
            g = self.mm(self.d_out(True), self.heads_out())  # dY^T h  [B, beam, H, Po, Pv]
            store(self.reduce(g, (1, 1, c.heads, c.po, c.pv)), self.weight(kind, buf="dweights"),
                  self.weight(kind, buf="dweights", name=f"dweights_prior:{kind}") if add else None)
        bkind = "CUDNN_MH_ATTN_O_BIASES"
        if self.has(bkind):
            store(self.reduce(self.d_out(), (1, 1, 1, 1, c.po)), self.bias(bkind, buf="dweights"),
                  self.bias(bkind, buf="dweights", name=f"dweights_prior:{bkind}") if add else None)


# -- argument checks ------------------------------------------------------------------------------

def _check_seqs(a: AttnDescriptor, q, k, v, o, names):
    """002 §7.2.35 "descriptor values ... incompatible": BAD_PARAM naming the descriptor."""
    nq, nk, nv, no = names
    for name, d in zip(names, (q, k, v, o)):
        check(d.dataType == a.dataType, name, f"data type {name_of('cudnnDataType_t', d.dataType)} must be the attention "
              f"descriptor's {name_of('cudnnDataType_t', a.dataType)}")
        check(d.axes == q.axes, name, f"layout (axes {d.axes}) must be the same in every sequence descriptor ({nq}: {q.axes})")
        check(d.dimA[BATCH] == q.dimA[BATCH], name, f"batch {d.dimA[BATCH]} must equal {nq}'s {q.dimA[BATCH]}")
        check(d.dimA[BATCH] <= a.maxBatchSize and d.dimA[BEAM] <= a.maxBeamSize, name,
              f"batch {d.dimA[BATCH]} / beam {d.dimA[BEAM]} exceed maxBatchSize {a.maxBatchSize} / maxBeamSize {a.maxBeamSize}")
    for name, d, size in ((nq, q, a.qSize), (nk, k, a.kSize), (nv, v, a.vSize), (no, o, a.o_size)):
        check(d.dimA[VECT] == size, name, f"vector length {d.dimA[VECT]} must be {size}")
    check(q.dimA[TIME] <= a.qoMaxSeqLength, nq, f"time {q.dimA[TIME]} exceeds qoMaxSeqLength {a.qoMaxSeqLength}")
    check(k.dimA[TIME] <= a.kvMaxSeqLength, nk, f"time {k.dimA[TIME]} exceeds kvMaxSeqLength {a.kvMaxSeqLength}")
    check(o.dimA[TIME] == q.dimA[TIME] and o.dimA[BEAM] == q.dimA[BEAM], no, f"time and beam must equal {nq}'s")
    check(v.dimA[TIME] == k.dimA[TIME] and v.dimA[BEAM] == k.dimA[BEAM], nv, f"time and beam must equal {nk}'s")
    want = q.dimA[BEAM] if a.one_to_one else 1
    check(k.dimA[BEAM] == want, nk, f"beam {k.dimA[BEAM]} must be {want} "
          f"({'QUERYMAP_ONE_TO_ONE: the Q beam' if a.one_to_one else 'QUERYMAP_ALL_TO_ONE: K and V have beam 1'})")
    check(np.array_equal(k.seqLengths, v.seqLengths), nv, f"sequence lengths must equal {nk}'s")
    check(np.array_equal(o.seqLengths, q.seqLengths), no, f"sequence lengths must equal {nq}'s")


def _check_weights(a, weights, weightSizeInBytes, argname="weights"):
    total = weight_layout(a)[1]
    check(int(weightSizeInBytes) >= total, "weightSizeInBytes",
          f"{weightSizeInBytes} is less than the {total} bytes cudnnGetMultiHeadAttnBuffers reports")
    check(total == 0 or not bg.is_null(weights), argname, "is NULL")
    if total:
        bg.check_buffer(weights, argname, total)


def _check_reserve(need, reserveSpace, reserveSpaceSizeInBytes):
    check(not bg.is_null(reserveSpace), "reserveSpace", "is NULL; gradient calls need the forward's training-mode reserve space")
    check(int(reserveSpaceSizeInBytes) >= need, "reserveSpaceSizeInBytes", f"{reserveSpaceSizeInBytes} is less than the {need} bytes needed")
    bg.check_buffer(reserveSpace, "reserveSpace", need)


def _window_mask(a, q, k, lo, hi, rows, ct) -> tuple:
    """(mask [B, beam, rows, Tk], rowMask [B, beam, rows]) for the query time steps ``rows``."""
    tk = np.arange(k.dimA[TIME])
    rows = np.asarray(rows)
    win = (tk[None, :] >= lo[:, None]) & (tk[None, :] < hi[:, None])  # [rows, Tk]
    len_q = q.lengths()  # [B, beam]
    len_k = np.broadcast_to(k.lengths(), len_q.shape)  # K beam is 1 (ALL_TO_ONE) or the Q beam
    row_ok = rows[None, None, :] < len_q[:, :, None]
    mask = win[None, None] & (tk[None, None, None, :] < len_k[:, :, None, None]) & row_ok[..., None]
    npt = np.float64 if ct == "float64" else np.float32
    return mask.astype(npt), row_ok.astype(npt)


_MASKS: OrderedDict = OrderedDict()  # (device, inputs) -> (mask, rowMask) on the device
_MASKS_MAX = 4
_MASKS_LOCK = threading.Lock()


def _placed_masks(h, a, q, k, lo, hi, rows, ct) -> tuple:
    """``_window_mask`` where ``h`` runs.  On the GPU place the pair is kept (an LRU of
    ``_MASKS_MAX``) keyed by everything it depends on, so a repeated call neither rebuilds the
    [B, beam, Tq, Tk] mask on the host nor copies it to the device again (33 MB at batch 32,
    512 tokens: milliseconds per call)."""
    if h.place == "cpu":
        return _window_mask(a, q, k, lo, hi, rows, ct)
    key = (getattr(h, "device", 0), ct, k.dimA[TIME], lo.tobytes(), hi.tobytes(), np.asarray(rows).tobytes(),
           q.lengths().tobytes(), q.lengths().shape, k.lengths().tobytes(), k.lengths().shape)
    with _MASKS_LOCK:
        hit = _MASKS.get(key)
        if hit is not None:
            _MASKS.move_to_end(key)
            return hit
    mask, row_mask = _window_mask(a, q, k, lo, hi, rows, ct)
    hit = (on_place(h, mask), on_place(h, row_mask))
    with _MASKS_LOCK:
        _MASKS[key] = hit
        while len(_MASKS) > _MASKS_MAX:
            _MASKS.popitem(last=False)
    return hit


def _windows(loWinIdx, hiWinIdx, rows):
    n = int(max(rows)) + 1
    lo, hi = host_ints(loWinIdx, n, "loWinIdx"), host_ints(hiWinIdx, n, "hiWinIdx")
    if len(rows) == n:  # every step (rows = 0 .. n-1)
        return lo[:n].astype(np.int64), hi[:n].astype(np.int64)
    return lo[rows].astype(np.int64), hi[rows].astype(np.int64)


def _seq_spec(a, d) -> tuple:
    """(dtype, bytes) a sequence-data buffer described by ``d`` must hold."""
    n = 1
    for v in d.dimA:
        n *= int(v)
    return a.dtype, n * dtypes.itemsize(a.dtype)


def _checked(h, a, seqs, weights=(), reserve=None, workspace=None) -> list:
    """``_core.data.preflight`` of every buffer of an attention call, before its graph runs (a rejected
    call writes nothing): ``seqs`` (data, descriptor, argname, written); ``weights`` (data,
    argname, written) of the weight layout's size; the reserve space and workspace are untyped
    (reserve: (data, bytes, written)); NULL workspace is skipped.  Returns the checked buffers
    in that order (the reserve space last, as bytes, when given)."""
    total = weight_layout(a)[1]
    items = [(data, _seq_spec(a, d), name, w) for data, d, name, w in seqs]
    items += [(data, (a.dtype, total), name, w) for data, name, w in weights if total]
    if reserve is not None:
        items.append((reserve[0], (None, reserve[1]), "reserveSpace", reserve[2]))
    if not bg.is_null(workspace):
        items.append((workspace, (None, 0), "workSpace", True))
    out = preflight(h, items)
    if not total:  # no weights: the (unused) weight buffers stay as given
        out[len(seqs):len(seqs)] = [data for data, _n, _w in weights]
    return out


def _run(h, a, name, cfg, build, buffers, extra_key=(), declined=None):
    """The graph path; ``declined``: why the fused path (``attention.fused``) did not run, kept
    as the first decline of the plan (explain, CUDNN_COMPAT_LOG=info)."""
    key = ("MultiHeadAttn" + name, cfg) + tuple(extra_key) + ((("declined", declined),) if declined else ())
    bound = bg.prepare(key, build)
    if declined and bound is not None:
        bound.graph.pre_declines = ((fused.ENGINE, declined),)
    bg.execute(h, key, bound, buffers, {"smScaler": a.smScaler, "big": BIG})


def _fused_core(h, a, q, k, lo, hi, one_step, which):
    """(Core, SdpaPlan or None, None) when the call runs fused, else (None, None, reason); the
    CPU place gives (None, None, None)."""
    if h.place != "gpu":
        return None, None, None
    c = fused.core(h, a, q, k, lo, hi, one_step)
    if isinstance(c, str):
        return None, None, c
    if which is None:
        return c, None, None
    plan = fused.plan_for(h.device, which, c.sdpa)
    if isinstance(plan, str):
        return None, None, plan
    return c, plan, None


def _on_host(buffers) -> "str | None":
    if any(isinstance(b, np.ndarray) for b in buffers):
        return "host (NumPy) buffers on a GPU handle"
    return None


# -- the compute calls ---------------------------------------------------------------------------

@legacy("cudnnMultiHeadAttnForward")
def multiHeadAttnForward(handle, attnDesc, currIdx, loWinIdx, hiWinIdx, devSeqLengthsQO, devSeqLengthsKV, qDesc, queries,
                         residuals, kDesc, keys, vDesc, values, oDesc, out, weightSizeInBytes, weights,
                         workSpaceSizeInBytes, workSpace, reserveSpaceSizeInBytes, reserveSpace) -> None:
    """002 §7.2.35.  currIdx < 0: every query time step; currIdx >= 0: that step only (inference).
    reserveSpace NULL and 0 bytes: inference, else training (the window mask is kept there).
    devSeqLengthsQO/KV are not read (002: not validated; the descriptors' lengths are used).
    BAD_PARAM: a NULL queries/keys/values/out, currIdx out of bound or with a reserve space,
    incompatible descriptors, residuals with qSize != the output length, buffers too small."""
    h = get_handle(handle)
    a = attn_desc(attnDesc)
    q, k, v, o = (seq_desc(x, n) for x, n in ((qDesc, "qDesc"), (kDesc, "kDesc"), (vDesc, "vDesc"), (oDesc, "oDesc")))
    _check_seqs(a, q, k, v, o, ("qDesc", "kDesc", "vDesc", "oDesc"))
    for argname, buf in (("queries", queries), ("keys", keys), ("values", values), ("out", out)):
        check(not bg.is_null(buf), argname, "is NULL")
    with_res = not bg.is_null(residuals)
    check(not with_res or a.qSize == a.o_size, "residuals",
          f"residual connections need the Q vector length ({a.qSize}) to equal the output's ({a.o_size})")
    training = not (bg.is_null(reserveSpace) and int(reserveSpaceSizeInBytes) == 0)
    check(isinstance(currIdx, (int, np.integer)), "currIdx", f"must be an int, got {currIdx!r}")
    tq_all = q.dimA[TIME]
    check(int(currIdx) < tq_all, "currIdx", f"{currIdx} is out of bound: qDesc has {tq_all} time steps")
    one_step = int(currIdx) >= 0
    check(not (one_step and training), "currIdx", "a single time step (currIdx >= 0) is for inference only (reserveSpace must be NULL)")
    _check_weights(a, weights, weightSizeInBytes)
    rows = [int(currIdx)] if one_step else list(range(tq_all))
    lo, hi = _windows(loWinIdx, hiWinIdx, rows)
    cfg = _cfg(a, q, k, v, o, len(rows))
    if training:
        need = _reserve_size(a, cfg.b, cfg.bq, cfg.tq, cfg.tk)
        _check_reserve(need, reserveSpace, reserveSpaceSizeInBytes)
    c, splan, declined = _fused_core(h, a, q, k, lo, hi, one_step, "fprop")
    mask = row_mask = None  # the fused inference needs no window mask
    if c is None or training:
        mask, row_mask = _placed_masks(h, a, q, k, lo, hi, np.array(rows), cfg.ct)
    seqs = [(queries, q, "queries", False), (keys, k, "keys", False), (values, v, "values", False), (out, o, "out", True)]
    if with_res:
        seqs.append((residuals, q, "residuals", False))
    checked = _checked(h, a, seqs, [(weights, "weights", False)], (reserveSpace, need, True) if training else None,
                       workSpace)
    queries, keys, values, out = checked[:4]
    residuals = checked[4] if with_res else residuals
    weights = checked[len(seqs)]
    if training:
        reserveSpace = checked[len(seqs) + 1]
    if c is not None:
        declined = _on_host(checked)
    if c is not None and declined is None:
        sig = fused.signature(a, c, q, k, lo, hi)
        _set_last(fused.forward(h, a, c, splan, q, k, v, o, queries, keys, values, out, residuals if with_res else None,
                                weights, reserveSpace if training else None, mask, sig))
        return
    if training and h.place == "gpu":
        fused.forget(h, reserveSpace)
    if mask is None:
        mask, row_mask = _placed_masks(h, a, q, k, lo, hi, np.array(rows), cfg.ct)

    def build():
        g = _Graph("MultiHeadAttnForward", cfg)
        g.forward(with_res)
        if training:
            c = cfg
            g.b.pw("IDENTITY", g.mask(), out=g.b.ext("reserveSpace", 0, (c.b, c.bq, 1, c.tq, c.tk), None, c.ct))
        return g.b

    item = dtypes.itemsize(a.dtype) * max(int(currIdx), 0)  # currIdx >= 0: views start at that time step
    step, o_step = q.strides()[TIME] * item, o.strides()[TIME] * item
    buffers = {"queries": bg.at(queries, step), "keys": keys, "values": values, "out": bg.at(out, o_step),
               "weights": weights, "mask": mask, "rowMask": row_mask, "reserveSpace": reserveSpace}
    if with_res:
        buffers["residuals"] = bg.at(residuals, step)
    _run(h, a, "Forward", cfg, build, buffers, (with_res, training), declined)


@legacy("cudnnMultiHeadAttnBackwardData")
def multiHeadAttnBackwardData(handle, attnDesc, loWinIdx, hiWinIdx, devSeqLengthsDQDO, devSeqLengthsDKDV, doDesc, dout,
                              dqDesc, dqueries, queries, dkDesc, dkeys, keys, dvDesc, dvalues, values, weightSizeInBytes,
                              weights, workSpaceSizeInBytes, workSpace, reserveSpaceSizeInBytes, reserveSpace) -> None:
    """dqueries, dkeys, dvalues = the exact gradients of the forward's out with respect to Q, K, V
    contracted with dout (002 §8.2.15); no residual term (add dout to dqueries yourself).
    BAD_PARAM: NULL buffers or reserve space, incompatible descriptors, buffers too small."""
    h = get_handle(handle)
    a = attn_desc(attnDesc)
    q, k, v, o = (seq_desc(x, n) for x, n in ((dqDesc, "dqDesc"), (dkDesc, "dkDesc"), (dvDesc, "dvDesc"), (doDesc, "doDesc")))
    _check_seqs(a, q, k, v, o, ("dqDesc", "dkDesc", "dvDesc", "doDesc"))
    for argname, buf in (("dout", dout), ("dqueries", dqueries), ("queries", queries), ("dkeys", dkeys), ("keys", keys),
                         ("dvalues", dvalues), ("values", values)):
        check(not bg.is_null(buf), argname, "is NULL")
    _check_weights(a, weights, weightSizeInBytes)
    rows = list(range(q.dimA[TIME]))
    lo, hi = _windows(loWinIdx, hiWinIdx, rows)
    cfg = _cfg(a, q, k, v, o, len(rows))
    need = _reserve_size(a, cfg.b, cfg.bq, cfg.tq, cfg.tk)
    _check_reserve(need, reserveSpace, reserveSpaceSizeInBytes)
    c, splan, declined = _fused_core(h, a, q, k, lo, hi, False, "bprop")
    mask, row_mask = _placed_masks(h, a, q, k, lo, hi, np.array(rows), cfg.ct)
    dout, dqueries, queries, dkeys, keys, dvalues, values, weights, _rs = _checked(
        h, a, [(dout, o, "dout", False), (dqueries, q, "dqueries", True), (queries, q, "queries", False),
               (dkeys, k, "dkeys", True), (keys, k, "keys", False), (dvalues, v, "dvalues", True),
               (values, v, "values", False)], [(weights, "weights", False)], (reserveSpace, need, False), workSpace)[:9]
    if c is not None:
        declined = _on_host((dout, dqueries, queries, dkeys, keys, dvalues, values, weights, _rs))
    if c is not None and declined is None:
        state = fused.reserve_state(h, _rs, fused.signature(a, c, q, k, lo, hi))
        if isinstance(state, str):
            declined = state
        else:
            _set_last(fused.backward_data(h, a, c, splan, q, k, v, o, dout, dqueries, dkeys, dvalues, weights, _rs))
            return

    def build():
        g = _Graph("MultiHeadAttnBackwardData", cfg)
        g.backward_data()
        return g.b

    buffers = {"dout": dout, "dqueries": dqueries, "queries": queries, "dkeys": dkeys, "keys": keys, "dvalues": dvalues,
               "values": values, "weights": weights, "mask": mask, "rowMask": row_mask}
    _run(h, a, "BackwardData", cfg, build, buffers, (), declined)


@legacy("cudnnMultiHeadAttnBackwardWeights")
def multiHeadAttnBackwardWeights(handle, attnDesc, addGrad, qDesc, queries, kDesc, keys, vDesc, values, doDesc, dout,
                                 weightSizeInBytes, weights, dweights, workSpaceSizeInBytes, workSpace,
                                 reserveSpaceSizeInBytes, reserveSpace) -> None:
    """dweights (same layout as weights) = the gradients with respect to every projection weight
    and bias, added to dweights (CUDNN_WGRAD_MODE_ADD) or written over it (SET) (002 §8.2.16).
    The attention window comes from the reserve space the training-mode forward filled."""
    h = get_handle(handle)
    a = attn_desc(attnDesc)
    check(is_valid("cudnnWgradMode_t", addGrad), "addGrad", f"{addGrad!r} is not a cudnnWgradMode_t")
    q, k, v, o = (seq_desc(x, n) for x, n in ((qDesc, "qDesc"), (kDesc, "kDesc"), (vDesc, "vDesc"), (doDesc, "doDesc")))
    _check_seqs(a, q, k, v, o, ("qDesc", "kDesc", "vDesc", "doDesc"))
    for argname, buf in (("queries", queries), ("keys", keys), ("values", values), ("dout", dout)):
        check(not bg.is_null(buf), argname, "is NULL")
    _check_weights(a, weights, weightSizeInBytes)
    total = weight_layout(a)[1]
    if total:
        _check_weights(a, dweights, weightSizeInBytes, "dweights")
    cfg = _cfg(a, q, k, v, o, q.dimA[TIME])
    need = _reserve_size(a, cfg.b, cfg.bq, cfg.tq, cfg.tk)
    _check_reserve(need, reserveSpace, reserveSpaceSizeInBytes)
    queries, keys, values, dout, weights, dweights, reserveSpace = _checked(
        h, a, [(queries, q, "queries", False), (keys, k, "keys", False), (values, v, "values", False),
               (dout, o, "dout", False)], [(weights, "weights", False), (dweights, "dweights", True)],
        (reserveSpace, need, False), workSpace)[:7]
    if total == 0:
        return  # no projections: nothing is trainable
    add = int(addGrad) == WGRAD["CUDNN_WGRAD_MODE_ADD"]
    declined = None
    if h.place == "gpu":
        declined = fused.static_reason(a, h.place, forced_engine(), q.dimA[BEAM], k.dimA[BEAM], False) or \
            _on_host((queries, keys, values, dout, weights, dweights, reserveSpace))
        if declined is None:
            c = fused.reserve_state(h, reserveSpace, (a.key(),), weights=True)
            if isinstance(c, str):
                declined = c
            elif (c.b, c.tq, c.tk, c.lengths) != (cfg.b * cfg.bq, cfg.tq, cfg.tk, fused.lengths_key(q, k)):
                declined = "the descriptors' sizes or sequence lengths differ from the fused forward's"
            else:
                _set_last(fused.backward_weights(h, a, c, q, k, v, o, queries, keys, values, dout, dweights, reserveSpace,
                                                 add))
                return
    row_mask = (np.arange(cfg.tq)[None, None, :] < q.lengths()[:, :, None]).astype(
        np.float64 if cfg.ct == "float64" else np.float32)

    def build():
        g = _Graph("MultiHeadAttnBackwardWeights", cfg)
        g.backward_weights(add)
        return g.b

    buffers = {"dout": dout, "queries": queries, "keys": keys, "values": values, "weights": weights, "dweights": dweights,
               "mask": reserveSpace, "rowMask": on_place(h, row_mask)}
    _run(h, a, "BackwardWeights", cfg, build, buffers, (add,), declined)
