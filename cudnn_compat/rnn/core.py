"""The one RNN implementation under both API generations: geometry, weight/workspace/reserve
layouts, and the translation of forward, backward-data and backward-weights into graphs of
Matmul, Pointwise, Reduction, Rng and the composite recurrence ops (002 §7.1.2.8 cudnnRNNMode_t equations, §7.2.36 cudnnRNNForward,
§8.2.18 cudnnRNNBackwardData_v8, §8.2.21 cudnnRNNBackwardWeights_v8).

A call becomes a short sequence of graphs, each cached per signature:
  forward,  per layer l:  proj(l)  Gx = X_l W^T + biases for all time steps (one Matmul per
                                   direction; GRU: per gate, as bR_n stays out of Gx; for l >= 1
                                   in training X_l = Y_{l-1} * dropout mask from an Rng op),
                                   written to the workspace
                          rec(l)   ONE RNNRecurrence op: every step of every direction (h to y
                                   or the layer's output buffer; training also saves the gate
                                   activations, c, ...); ``fused_layer``: proj inside it, one graph
  backward data, l = top..0:  brec(l) ONE RNNRecurrenceBackward op: gate gradients dG of every
                                   step (to the reserve space, for backward weights)
                          bproj(l) dX_l = sum_dir dG W (one Matmul per direction)
  backward weights:       one graph: dW += dG^T X, dR += dG^T h_prev, biases += sum dG, as
                                   batched Matmuls over runs of time steps + Reductions.
The recurrence ops are composite (why: cudnn_compat/_backend/ops/rnn.py); their tensors are whole
buffers with a leading direction dim, rows addressed by the layout's row map, so a layer is one
op whatever T, and sequences of different lengths need no masks or padding reads: a sequence is
inactive past its length.  The projections and weight gradients read earlier results through
external tensors bound at offsets (see _bound_graph); backward weights splits the batch into
blocks of consecutive sequences with equal length and groups steps into runs.

Weight layout (weight space = legacy params buffer), per pseudo-layer p = layer*dirs + dir,
contiguous, row-major, in this order:  W  [g*H, in]  (the g gate matrices stacked; absent
for layer 0 with SKIP_INPUT),  R  [g*H, Hout],  Wr [P, H] (LSTM projection only),
bW [g*H] (SINGLE_INP/DOUBLE bias),  bR [g*H] (SINGLE_REC/DOUBLE bias).  Gate order is the
linLayerID order of 002: LSTM input, forget, new cell, output; GRU reset, update, new.
GRU bias rule (all 002 formulas but a misprint in the SINGLE_INP one): bW_k joins the input
part and bR_k the recurrent part of gate k, so h' = tanh(W_h x + bW_h + r*(R_h h + bR_h)).

Sequence buffers are N rows of vectors; vector (t, b) is row t*B + b (SEQ_MAJOR_UNPACKED),
b*T + t (BATCH_MAJOR_UNPACKED) or cum_t + b (SEQ_MAJOR_PACKED, cum_t = vectors before step t).
Inter-layer dropout (training, layers >= 1): one Rng op per layer boundary draws the mask of
layer l-1's whole output buffer (N x dirs*Hout elements, row-major in that row order) from the
dropout descriptor's states, each draw continuing the states' counter; the masks are kept in
the reserve space for the backward calls.  The reserve space also keeps the gate activations
(and LSTM c, pre-projection h, GRU R_h h + bR_h), the outputs of every layer but the last, and,
after backward data, the gate gradients that backward weights reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, partial

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import Tensor
from cudnn_compat._backend.math_policy import allow_tf32
from .._core import bound_graph as bg
from .._core.data import preflight
from ..dropout import rng_op
from ..enums import ENUMS, name_of

RNN_MODES = {v: k for k, v in {"RELU": 0, "TANH": 1, "LSTM": 2, "GRU": 3}.items()}
GATES = {"RELU": 1, "TANH": 1, "LSTM": 4, "GRU": 3}
BIAS = {0: "NONE", 1: "INP", 2: "DOUBLE", 3: "REC"}
LAYOUTS = {0: "SEQ", 1: "PACKED", 2: "BATCH"}
ALIGN = 256
_DT = ENUMS["cudnnDataType_t"]
DTYPE_OF = {_DT["CUDNN_DATA_HALF"]: "float16", _DT["CUDNN_DATA_FLOAT"]: "float32", _DT["CUDNN_DATA_DOUBLE"]: "float64"}


def _align(n: int) -> int:
    return -(-int(n) // ALIGN) * ALIGN


@dataclass(frozen=True)
class RNNConfig:
    """Everything about the network that shapes its graphs (a plan-cache key part)."""

    mode: str  # RELU, TANH, LSTM, GRU
    bias: str  # NONE, INP, DOUBLE, REC
    D: int  # directions
    skip: bool  # SKIP_INPUT
    I: int
    H: int
    P: int  # LSTM projection size, == H when disabled
    L: int  # physical layers
    dtype: str  # data / weight dtype
    cdtype: str  # compute dtype (mathPrec)
    clip: "str | None" = None  # None, or the clip NaN mode 'PROPAGATE'/'NOT_PROPAGATE' (LSTM only)
    tf32: bool = False  # _backend.math_policy.allow_tf32(dtype, mathType): the one TF32 rule, env included

    @property
    def g(self) -> int:
        return GATES[self.mode]

    @property
    def proj(self) -> bool:
        return self.P < self.H

    @property
    def Hout(self) -> int:
        return self.P

    @property
    def has_bW(self) -> bool:
        return self.bias in ("INP", "DOUBLE")

    @property
    def has_bR(self) -> bool:
        return self.bias in ("REC", "DOUBLE")

    def layer_in(self, l: int) -> int:
        return self.I if l == 0 else self.D * self.Hout

    def has_W(self, l: int) -> bool:
        return not (self.skip and l == 0)

    @property
    def pseudo_layers(self) -> int:
        return self.L * self.D


def config_of(d, dataType=None, inputSize=None) -> RNNConfig:
    """The RNNConfig of descriptor ``d``; v6 descriptors take dataType/inputSize from the call."""
    dataType = d.dataType if d.dataType is not None else dataType
    inputSize = d.inputSize if d.inputSize is not None else inputSize
    mode = RNN_MODES[d.cellMode]
    clip = None
    if mode == "LSTM" and d.clipMode == ENUMS["cudnnRNNClipMode_t"]["CUDNN_RNN_CLIP_MINMAX"]:
        clip = "PROPAGATE" if d.clipNanOpt == ENUMS["cudnnNanPropagation_t"]["CUDNN_PROPAGATE_NAN"] else "NOT_PROPAGATE"
    tf32 = allow_tf32(DTYPE_OF[dataType], name_of("cudnnMathType_t", d.mathType)[len("CUDNN_"):])  # math_policy
    return RNNConfig(mode, BIAS[d.biasMode], 2 if d.dirMode == 1 else 1, d.inputMode == 1, int(inputSize),
                     d.hiddenSize, d.projSize if mode == "LSTM" else d.hiddenSize, d.numLayers,
                     DTYPE_OF[dataType], DTYPE_OF[d.mathPrec], clip, tf32)


# -- weights -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    offset: int  # elements
    rows: int
    cols: int


def weight_layout(cfg: RNNConfig) -> tuple:
    """({(pseudo-layer, kind): Block}, total elements); kinds W, R, Wr, bW, bR (all gates)."""
    out, off = {}, 0
    gH = cfg.g * cfg.H
    for p in range(cfg.pseudo_layers):
        l = p // cfg.D
        parts = []
        if cfg.has_W(l):
            parts.append(("W", gH, cfg.layer_in(l)))
        parts.append(("R", gH, cfg.Hout))
        if cfg.proj:
            parts.append(("Wr", cfg.P, cfg.H))
        if cfg.has_bW:
            parts.append(("bW", gH, 1))
        if cfg.has_bR:
            parts.append(("bR", gH, 1))
        for kind, rows, cols in parts:
            out[(p, kind)] = Block(off, rows, cols)
            off += rows * cols
    return out, off


def weight_space_size(cfg: RNNConfig) -> int:
    return weight_layout(cfg)[1] * dtypes.itemsize(cfg.dtype)


def lin_layer(cfg: RNNConfig, p: int, lin_id: int):
    """002 linLayerID -> (matrix Block or None, bias Block or None) inside the weight space."""
    layout, _ = weight_layout(cfg)
    g, H = cfg.g, cfg.H
    l = p // cfg.D
    if cfg.mode == "LSTM" and lin_id == 2 * g:
        blk = layout.get((p, "Wr"))
        return blk, None
    side, k = ("W", lin_id) if lin_id < g else ("R", lin_id - g)
    mat = layout.get((p, side))
    if mat is not None:
        mat = Block(mat.offset + k * H * mat.cols, H, mat.cols)
    if side == "W" and not cfg.has_W(l):
        mat = None
    bias = layout.get((p, "b" + side))
    if bias is not None:
        bias = Block(bias.offset + k * H, H, 1)
    return mat, bias


# -- sequence geometry -----------------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """Where vector (t, b) of a sequence buffer lives: row(t, b), rows of ``vector`` elements."""

    layout: str  # SEQ, BATCH, PACKED
    T: int
    B: int
    lengths: tuple

    @cached_property
    def batch_at(self) -> tuple:
        return tuple(sum(1 for n in self.lengths if n > t) for t in range(self.T))

    @cached_property
    def cum(self) -> tuple:
        acc, out = 0, []
        for bt in self.batch_at:
            out.append(acc)
            acc += bt
        return tuple(out)

    @property
    def N(self) -> int:
        return sum(self.lengths) if self.layout == "PACKED" else self.T * self.B

    @property
    def bstride(self) -> int:
        return self.T if self.layout == "BATCH" else 1

    def row(self, t: int, b: int) -> int:
        if self.layout == "SEQ":
            return t * self.B + b
        if self.layout == "BATCH":
            return b * self.T + t
        return self.cum[t] + b

    @cached_property
    def blocks(self) -> tuple:
        """Runs of consecutive sequences of equal length: (first, count, length)."""
        out, b0 = [], 0
        for b in range(1, self.B + 1):
            if b == self.B or self.lengths[b] != self.lengths[b0]:
                out.append((b0, b - b0, self.lengths[b0]))
                b0 = b
        return tuple(out)

    @property
    def padded(self) -> bool:
        return self.layout != "PACKED" and any(n < self.T for n in self.lengths)

    @property
    def uniform(self) -> bool:
        return all(n == self.T for n in self.lengths)


def runs(geo: Geometry, b0: int, pairs: list) -> list:
    """Group (ta, tb) step pairs (ascending ta) into runs with constant row deltas on both sides:
    [(ra0, rb0, da, db, S)], row = r0 + i*d for the i-th step of the run (first sequence b0)."""
    out = []
    for ta, tb in pairs:
        ra, rb = geo.row(ta, b0), geo.row(tb, b0)
        if out:
            r = out[-1]
            na, nb_ = ra - (r[0] + (r[4] - 1) * r[2]), rb - (r[1] + (r[4] - 1) * r[3])
            if r[4] == 1 or (na == r[2] and nb_ == r[3]):
                out[-1] = (r[0], r[1], na, nb_, r[4] + 1)
                continue
        out.append((ra, rb, 0, 0, 1))
    return out


class Seq:
    """A sequence buffer (N rows of V elements, geometry ``geo``) at ``base`` elements of ``buf``."""

    def __init__(self, buf: str, base: int, V: int, dtype: str, geo: Geometry):
        self.buf, self.base, self.V, self.dtype, self.geo = buf, base, V, dtype, geo

    def whole(self, b, ncols=None, col=0):
        return b.ext(self.buf, self.base + col, (self.geo.N, ncols or self.V), (self.V, 1), self.dtype)

    def view3(self, b, r0, dstep, S, nb, ncols, col=0, transpose=False, collapse=False):
        """The run of S steps x nb sequences x ncols columns starting at row r0 (steps dstep rows
        apart); ``collapse``: the S*nb rows are one contiguous range, seen as (1, S*nb, ncols).
        ``transpose`` swaps the last two dims (for dG^T products)."""
        V = self.V
        if collapse:
            dims, strides = (1, S * nb, ncols), (S * nb * V, V, 1)
        else:
            dims, strides = (S, nb, ncols), (dstep * V, self.geo.bstride * V, 1)
        if transpose:
            dims, strides = (dims[0], dims[2], dims[1]), (strides[0], strides[2], strides[1])
        return b.ext(self.buf, self.base + r0 * V + col, dims, strides, self.dtype)


def _contiguous(r0, dstep, S, nb, bstride):
    """How the rows r0 + i*dstep + j*bstride (i < S steps, j < nb sequences) fill one contiguous
    range: 'A' as i*nb + j, 'B' as j*S + i, '*' either way (S or nb is 1), None when they do not."""
    if S == 1 or nb == 1:
        step = bstride if S == 1 else dstep
        return "*" if (S == 1 and nb == 1) or step == 1 else None
    if bstride == 1 and dstep == nb:
        return "A"
    if dstep == 1 and bstride == S:
        return "B"
    return None


def collapsible(geo, run, nb) -> bool:
    """Both sides of a run are one contiguous row range, paired row for row."""
    ra, rb, da, db, S = run
    oa = _contiguous(ra, da, S, nb, geo.bstride)
    ob = _contiguous(rb, db, S, nb, geo.bstride)
    return oa is not None and oa == ob


# -- workspace and reserve layouts -------------------------------------------------------------

@dataclass(frozen=True)
class Spaces:
    """Byte offsets of every region of the workspace and the reserve space."""

    ws: dict = field(default_factory=dict)
    rs: dict = field(default_factory=dict)
    ws_size: int = 0
    rs_size: int = 0


def spaces(cfg: RNNConfig, geo: Geometry) -> Spaces:
    c = dtypes.itemsize(cfg.cdtype)
    N, gH, H, Y = geo.N, cfg.g * cfg.H, cfg.H, cfg.D * cfg.Hout
    ws, off = {}, 0
    for d in range(cfg.D):
        ws[("Gx", d)] = off
        off += _align(N * gH * c)
    ws["Y"] = off  # forward (inference) layer outputs and backward dY, one layer at a time
    off += _align(N * Y * c)
    ws_size = off
    rs, off = {}, 0

    def put(key, nbytes):
        nonlocal off
        rs[key] = off
        off += _align(nbytes)
    for l in range(cfg.L):
        if l < cfg.L - 1:
            put(("Y", l), N * Y * c)
        if l >= 1:
            put(("mask", l), N * Y)
        for d in range(cfg.D):
            if cfg.mode in ("LSTM", "GRU"):
                put(("acts", l, d), N * gH * c)
            if cfg.mode == "LSTM":
                put(("c", l, d), N * H * c)
                if cfg.proj:
                    put(("hpre", l, d), N * H * c)
                    put(("dr", l, d), N * cfg.P * c)
            if cfg.mode == "GRU":
                put(("grn", l, d), N * H * c)
                put(("dgrn", l, d), N * H * c)
            put(("dpre", l, d), N * gH * c)
    return Spaces(ws, rs, ws_size, max(off, ALIGN))


# -- one call's static description ---------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    cfg: RNNConfig
    geo: Geometry
    training: bool
    present: frozenset  # names of the optional buffers given (hx, cx, hy, cy, dhy, ...)
    dropout: float = 0.0  # inter-layer dropout probability in effect (training only)
    fill: bool = False  # y padding filled with paddingFill

    @cached_property
    def sp(self) -> Spaces:
        return spaces(self.cfg, self.geo)

    @cached_property
    def wl(self) -> dict:
        return weight_layout(self.cfg)[0]

    # sequence buffers
    def X(self, l) -> Seq:
        cfg = self.cfg
        if l == 0:
            return Seq("x", 0, cfg.I, cfg.dtype, self.geo)
        return self.Y(l - 1)

    def Y(self, l) -> Seq:
        cfg, c = self.cfg, self.cfg.cdtype
        V = cfg.D * cfg.Hout
        if l == cfg.L - 1:
            return Seq("y", 0, V, cfg.dtype, self.geo)
        if self.training:
            return Seq("rs", self.sp.rs[("Y", l)] // dtypes.itemsize(c), V, c, self.geo)
        return Seq("ws", self.sp.ws["Y"] // dtypes.itemsize(c), V, c, self.geo)

    def dY(self, l) -> Seq:
        cfg, c = self.cfg, self.cfg.cdtype
        if l == cfg.L - 1:
            return Seq("dy", 0, cfg.D * cfg.Hout, cfg.dtype, self.geo)
        return Seq("ws", self.sp.ws["Y"] // dtypes.itemsize(c), cfg.D * cfg.Hout, c, self.geo)

    def region(self, space, key, V, dtype=None) -> Seq:
        dtype = dtype or self.cfg.cdtype
        offs = self.sp.ws if space == "ws" else self.sp.rs
        return Seq(space, offs[key] // dtypes.itemsize(dtype), V, dtype, self.geo)

    def mask(self, l) -> Seq:
        return self.region("rs", ("mask", l), self.cfg.D * self.cfg.Hout, "uint8")

    # weights: views into the weight space "w"
    def wmat(self, b, p, kind, k=None, transpose=False):
        blk = self.wl[(p, kind)]
        rows, cols, off = blk.rows, blk.cols, blk.offset
        if k is not None:
            rows, off = self.cfg.H, off + k * self.cfg.H * cols
        if transpose:
            return b.ext("w", off, (cols, rows), (1, cols), self.cfg.dtype)
        return b.ext("w", off, (rows, cols), (cols, 1), self.cfg.dtype)

    def bias(self, b, p, kind, k=None):
        """Bias of gate k (or of all gates) as a (1, width) row."""
        blk = self.wl[(p, kind)]
        off, width = (blk.offset, blk.rows) if k is None else (blk.offset + k * self.cfg.H, self.cfg.H)
        return b.ext("w", off, (1, width), (width, 1), self.cfg.dtype)

    def key(self, stage) -> tuple:
        return ("RNN", stage, self.cfg, self.geo, self.training, tuple(sorted(self.present)), self.dropout, self.fill)

    def builder(self, name):
        return bg.GraphBuilder(name, self.cfg.cdtype)


# -- forward -------------------------------------------------------------------------------------

def build_fwd_proj(call: Call, l: int) -> bg.GraphBuilder:
    cfg = call.cfg
    b = call.builder(f"RNNForward.proj{l}")
    H, g = cfg.H, cfg.g
    if call.geo.N == 0:
        return b
    X = call.X(l).whole(b)
    if l >= 1 and call.dropout > 0:
        mask = call.mask(l).whole(b)
        rng_op(b, mask, call.dropout)
        X = b.pw("MUL", X, mask, alpha1=b.scalar("scale"))
    for d in range(cfg.D):
        p = l * cfg.D + d
        Gx = call.region("ws", ("Gx", d), g * H)

        def biases(k=None):
            terms = []
            if cfg.has_bW:
                terms.append(call.bias(b, p, "bW", k))
            if cfg.has_bR and (cfg.mode != "GRU" or (k is not None and k < 2)):
                terms.append(call.bias(b, p, "bR", k))
            return terms
        if not cfg.has_W(l):
            for k in range(g):
                b.add_all([X] + biases(k), out=Gx.whole(b, H, k * H))
        elif cfg.mode == "GRU":
            for k in range(g):
                terms = biases(k)
                out = Gx.whole(b, H, k * H)
                if terms:
                    b.add_all([b.mm(X, call.wmat(b, p, "W", k, transpose=True))] + terms, out=out)
                else:
                    b.mm(X, call.wmat(b, p, "W", k, transpose=True), out=out)
        else:
            terms = biases()
            out = Gx.whole(b)
            if terms:
                b.add_all([b.mm(X, call.wmat(b, p, "W", transpose=True))] + terms, out=out)
            else:
                b.mm(X, call.wmat(b, p, "W", transpose=True), out=out)
    return b


def _dir_stride(first: int, second: "int | None", default: int) -> int:
    """Element distance between the direction-0 and direction-1 copies of a region."""
    return default if second is None else second - first


def rec_attrs(call: Call) -> dict:
    cfg, geo = call.cfg, call.geo
    return {"mode": cfg.mode, "layout": geo.layout, "T": geo.T, "lengths": tuple(geo.lengths),
            "directions": tuple(d == 1 for d in range(cfg.D)), "clip": cfg.clip, "math_type": math_type(cfg)}


def dir_weight(call: Call, b, l: int, kind: str, dims: tuple, col0: int = 0) -> Tensor:
    """A weight block of layer l for every direction: dims (D,) + dims, rows of blk.cols elements."""
    cfg = call.cfg
    p0 = l * cfg.D
    blk = call.wl[(p0, kind)]
    nxt = call.wl[(p0 + 1, kind)].offset if cfg.D == 2 else None
    return b.ext("w", blk.offset + col0, (cfg.D,) + dims, (_dir_stride(blk.offset, nxt, blk.rows * blk.cols), dims[1], 1),
                 cfg.dtype)


def dir_region(call: Call, b, name: str, l: int, width: int) -> Tensor:
    """Reserve-space region ``name`` of layer l, every direction: (D, N, width)."""
    c = dtypes.itemsize(call.cfg.cdtype)
    rs = call.sp.rs
    first = rs[(name, l, 0)] // c
    second = rs[(name, l, 1)] // c if call.cfg.D == 2 else None
    return b.ext("rs", first, (call.cfg.D, call.geo.N, width), (_dir_stride(first, second, call.geo.N * width), width, 1),
                 call.cfg.cdtype)


def dir_seq(b, seq: Seq, D: int, width: int) -> Tensor:
    """A sequence buffer of D*width-wide vectors seen as (D, N, width)."""
    return b.ext(seq.buf, seq.base, (D, seq.geo.N, width), (width, seq.V, 1), seq.dtype)


def dir_state(call: Call, b, name: str, l: int, width: int) -> Tensor:
    cfg, B = call.cfg, call.geo.B
    return b.ext(name, l * cfg.D * B * width, (cfg.D, B, width), (B * width, width, 1), cfg.dtype)


def fused_layer(call: Call, l: int) -> bool:
    """Layer l is one op (RNNRecurrence's ``x`` form, the input projection inside: one program, one
    CUDA graph on a GPU engine): it has input weights, no dropout mask on its input, and input
    rows of the weights' data type (a GEMM's operands share one)."""
    return call.geo.N > 0 and call.cfg.has_W(l) and not (l >= 1 and call.dropout > 0) \
        and call.X(l).dtype == call.cfg.dtype


def build_fwd_rec(call: Call, l: int, fused: bool = False) -> bg.GraphBuilder:
    """One RNNRecurrence op: every step and direction of layer l (``fused``: in its x form)."""
    cfg, geo = call.cfg, call.geo
    b = call.builder(f"RNNForward.{'layer' if fused else 'rec'}{l}")
    H, g, Ho, D = cfg.H, cfg.g, cfg.Hout, cfg.D
    if geo.N == 0:  # no step at all: the final states are the initial ones
        for name, width in (("h", Ho), ("c", H)):
            if f"{name}y" in call.present:
                src = dir_state(call, b, f"{name}x", l, width) if f"{name}x" in call.present else b.scalar("zero")
                b.pw("IDENTITY", src, out=dir_state(call, b, f"{name}y", l, width))
        return b
    c = dtypes.itemsize(cfg.cdtype)
    ws = call.sp.ws
    gx0 = ws[("Gx", 0)] // c
    gx = b.ext("ws", gx0, (D, geo.N, g * H),
               (_dir_stride(gx0, ws[("Gx", 1)] // c if D == 2 else None, geo.N * g * H), g * H, 1), cfg.cdtype)
    ins = {"w_rec": dir_weight(call, b, l, "R", (g * H, Ho))}
    if fused:
        X, I = call.X(l), cfg.layer_in(l)
        ins["x"] = b.ext(X.buf, X.base, (D, geo.N, I), (0, X.V, 1), X.dtype)
        ins["w_in"] = dir_weight(call, b, l, "W", (g * H, I))
        ins.update({role: dir_weight(call, b, l, kind, (1, g * H)) for role, kind, present in
                    (("b_x", "bW", cfg.has_bW), ("b_h", "bR", cfg.has_bR)) if present})
    else:
        ins["gx"] = gx
    if cfg.proj:
        ins["wr"] = dir_weight(call, b, l, "Wr", (cfg.P, H))
    if cfg.mode == "GRU" and cfg.has_bR:
        ins["b_rec"] = dir_weight(call, b, l, "bR", (1, H), 2 * H)
    for name, width in (("hx", Ho), ("cx", H)):
        if name in call.present and (name == "hx" or cfg.mode == "LSTM"):
            ins[name] = dir_state(call, b, name, l, width)
    Y = call.Y(l)
    y = dir_seq(b, Y, D, Ho)
    if geo.padded:
        if call.fill and l == cfg.L - 1:
            ins["fill"] = b.scalar("fill")
        else:
            ins["y_in"] = b.ext(Y.buf, Y.base, y.dims, y.strides, Y.dtype, "y_in")
    if cfg.clip:
        ins["lclip"], ins["rclip"] = b.scalar("lclip"), b.scalar("rclip")
    outs = {"y": y, "gx": gx} if fused else {"y": y}
    for name, width in (("hy", Ho), ("cy", H)):
        if name in call.present and (name == "hy" or cfg.mode == "LSTM"):
            outs[name] = dir_state(call, b, name, l, width)
    if call.training:
        saved = {"LSTM": [("acts", "acts", g * H), ("c_all", "c", H)] + ([("hpre", "hpre", H)] if cfg.proj else []),
                 "GRU": [("acts", "acts", g * H), ("grn", "grn", H)]}.get(cfg.mode, [])
        for role, region, width in saved:
            outs[role] = dir_region(call, b, region, l, width)
    b.op("RNNRecurrence", ins, outs, rec_attrs(call))
    return b


# -- backward data -------------------------------------------------------------------------------

def build_bwd_rec(call: Call, l: int) -> bg.GraphBuilder:
    """One RNNRecurrenceBackward op: gate gradients of every step and direction of layer l."""
    cfg, geo = call.cfg, call.geo
    b = call.builder(f"RNNBackwardData.rec{l}")
    H, g, Ho, D = cfg.H, cfg.g, cfg.Hout, cfg.D
    if geo.N == 0:
        for name, width in (("h", Ho), ("c", H)):
            if f"d{name}x" in call.present:
                src = dir_state(call, b, f"d{name}y", l, width) if f"d{name}y" in call.present else b.scalar("zero")
                b.pw("IDENTITY", src, out=dir_state(call, b, f"d{name}x", l, width))
        return b
    ins = {"dy": dir_seq(b, call.dY(l), D, Ho), "w_rec": dir_weight(call, b, l, "R", (g * H, Ho))}
    if cfg.mode in ("RELU", "TANH", "GRU"):
        ins["y"] = dir_seq(b, call.Y(l), D, Ho)
    if cfg.mode in ("LSTM", "GRU"):
        ins["acts"] = dir_region(call, b, "acts", l, g * H)
    if cfg.mode == "LSTM":
        ins["c_all"] = dir_region(call, b, "c", l, H)
        if "cx" in call.present:
            ins["cx"] = dir_state(call, b, "cx", l, H)
        if "dcy" in call.present:
            ins["dcy"] = dir_state(call, b, "dcy", l, H)
    if cfg.mode == "GRU":
        ins["grn"] = dir_region(call, b, "grn", l, H)
        if "hx" in call.present:
            ins["hx"] = dir_state(call, b, "hx", l, Ho)
    if "dhy" in call.present:
        ins["dhy"] = dir_state(call, b, "dhy", l, Ho)
    if cfg.proj:
        ins["wr"] = dir_weight(call, b, l, "Wr", (cfg.P, H))
    if cfg.clip:
        ins["lclip"], ins["rclip"] = b.scalar("lclip"), b.scalar("rclip")
    outs = {"dgates": dir_region(call, b, "dpre", l, g * H)}
    if cfg.mode == "GRU":
        outs["dgrn"] = dir_region(call, b, "dgrn", l, H)
    if cfg.proj:
        outs["dr"] = dir_region(call, b, "dr", l, cfg.P)
    if "dhx" in call.present:
        outs["dhx"] = dir_state(call, b, "dhx", l, Ho)
    if cfg.mode == "LSTM" and "dcx" in call.present:
        outs["dcx"] = dir_state(call, b, "dcx", l, H)
    b.op("RNNRecurrenceBackward", ins, outs, rec_attrs(call))
    return b


def build_bwd_proj(call: Call, l: int) -> bg.GraphBuilder:
    cfg = call.cfg
    b = call.builder(f"RNNBackwardData.proj{l}")
    H, g = cfg.H, cfg.g
    if call.geo.N == 0:
        return b
    terms = []
    for d in range(cfg.D):
        p = l * cfg.D + d
        dpre = call.region("rs", ("dpre", l, d), g * H)
        if not cfg.has_W(l):
            terms += [dpre.whole(b, H, k * H) for k in range(g)]
        else:
            terms.append(b.mm(dpre.whole(b), call.wmat(b, p, "W")))
    if l == 0:
        b.add_all(terms, out=Seq("dx", 0, cfg.I, cfg.dtype, call.geo).whole(b))
    elif call.dropout > 0:
        b.pw("MUL", b.add_all(terms), call.mask(l).whole(b), alpha1=b.scalar("scale"), out=call.dY(l - 1).whole(b))
    else:
        b.add_all(terms, out=call.dY(l - 1).whole(b))
    return b


# -- backward weights ----------------------------------------------------------------------------

def build_bwd_weights(call: Call) -> bg.GraphBuilder:
    cfg, geo = call.cfg, call.geo
    b = call.builder("RNNBackwardWeights")
    H, g, Ho = cfg.H, cfg.g, cfg.Hout
    acc: dict = {}  # (p, kind, first row, rows) -> [terms]

    def products(A: Seq, acol, an, Bs: Seq, bcol, bn, pairs_by_block, drop_l=None):
        """sum over valid steps of A[t]^T B[t'] -> list of (1, an, bn) terms."""
        out = []
        for (b0, nb, _), pairs in pairs_by_block:
            for run in runs(geo, b0, pairs):
                ra, rb, da, db, S = run
                flat = collapsible(geo, run, nb)
                at_ = A.view3(b, ra, da, S, nb, an, acol, transpose=True, collapse=flat)
                bt_ = Bs.view3(b, rb, db, S, nb, bn, bcol, collapse=flat)
                if drop_l is not None:
                    mt = call.mask(drop_l).view3(b, rb, db, S, nb, bn, bcol, collapse=flat)
                    bt_ = b.pw("MUL", bt_, mt, alpha1=b.scalar("scale"))
                prod = b.mm(at_, bt_)
                if prod.dims[0] > 1:
                    red = b.virt((1, an, bn))
                    b.op("Reduction", {"x": prod}, {"y": red}, {"mode": "ADD"})
                    prod = red
                out.append(prod)
        return out

    def sums(A: Seq, acol, an, pairs_by_block):
        out = []
        for (b0, nb, _), pairs in pairs_by_block:
            for ra, _, da, _, S in runs(geo, b0, pairs):
                v = A.view3(b, ra, da, S, nb, an, acol)
                red = b.virt((1, 1, an))
                b.op("Reduction", {"x": v}, {"y": red}, {"mode": "ADD"})
                out.append(red)
        return out

    same = [((b0, nb, Lb), [(t, t) for t in range(Lb)]) for b0, nb, Lb in geo.blocks]
    for l in range(cfg.L):
        X = call.X(l)
        drop_l = l if (l >= 1 and call.dropout > 0) else None
        Y = call.Y(l)
        for d in range(cfg.D):
            p = l * cfg.D + d
            dpre = call.region("rs", ("dpre", l, d), g * H)
            gru = cfg.mode == "GRU"
            dgrn = call.region("rs", ("dgrn", l, d), H) if gru else None
            prev = [((b0, nb, Lb), [(t, t - 1) for t in range(1, Lb)] if d == 0 else [(t, t + 1) for t in range(Lb - 1)])
                    for b0, nb, Lb in geo.blocks]
            # input weights
            if cfg.has_W(l):
                acc[(p, "W", 0, g * H)] = products(dpre, 0, g * H, X, 0, X.V, same, drop_l)
            # recurrent weights: gate gradients x h_prev (GRU new gate: dGr_n)
            groups = [(dpre, 0, g * H, 0)] if not gru else [(dpre, 0, 2 * H, 0), (dgrn, 0, H, 2 * H)]
            for A, acol, an, row0 in groups:
                terms = products(A, acol, an, Y, d * Ho, Ho, prev)
                if "hx" in call.present:
                    for b0, nb, Lb in geo.blocks:
                        if Lb == 0:
                            continue
                        t0 = 0 if d == 0 else Lb - 1
                        r0 = geo.row(t0, b0)
                        at_ = b.ext(A.buf, A.base + r0 * A.V + acol, (1, an, nb), (an * nb, 1, geo.bstride * A.V), A.dtype)
                        hx = b.ext("hx", (p * geo.B + b0) * Ho, (1, nb, Ho), (nb * Ho, Ho, 1), cfg.dtype)
                        terms.append(b.mm(at_, hx))
                acc[(p, "R", row0, an)] = terms
            if cfg.proj:
                acc[(p, "Wr", 0, cfg.P)] = products(call.region("rs", ("dr", l, d), cfg.P), 0, cfg.P,
                                                    call.region("rs", ("hpre", l, d), H), 0, H, same)
            if cfg.has_bW or (cfg.has_bR and not gru):
                full = sums(dpre, 0, g * H, same)
                if cfg.has_bW:
                    acc[(p, "bW", 0, g * H)] = full
                if cfg.has_bR and not gru:
                    acc[(p, "bR", 0, g * H)] = full
            if cfg.has_bR and gru:
                acc[(p, "bR", 0, 2 * H)] = sums(dpre, 0, 2 * H, same)
                acc[(p, "bR", 2 * H, H)] = sums(dgrn, 0, H, same)
    for (p, kind, row0, nrows), terms in acc.items():
        if not terms:
            continue
        blk = call.wl[(p, kind)]
        dims = (1, nrows, blk.cols) if kind in ("W", "R", "Wr") else (1, 1, nrows)
        strides = (nrows * blk.cols, blk.cols, 1) if kind in ("W", "R", "Wr") else (nrows, nrows, 1)
        off = blk.offset + row0 * blk.cols
        prior = b.ext("dw", off, dims, strides, cfg.dtype, "dw_prior")
        out = b.ext("dw", off, dims, strides, cfg.dtype, "dw")
        b.add_all([prior] + terms, out=out)
    return b


# -- running a call -------------------------------------------------------------------------------

def stages(call: Call, kind: str) -> list:
    L = call.cfg.L
    if kind == "forward":
        out = []
        for l in range(L):
            out += [(f"flayer{l}", partial(build_fwd_rec, fused=True), l)] if fused_layer(call, l) else \
                [(f"fproj{l}", build_fwd_proj, l), (f"frec{l}", build_fwd_rec, l)]
        return out
    if kind == "backward_data":
        out = []
        for l in reversed(range(L)):
            out += [(f"brec{l}", build_bwd_rec, l), (f"bproj{l}", build_bwd_proj, l)]
        return out
    return [("bweights", build_bwd_weights, None)]


def math_type(cfg: RNNConfig) -> str:
    """The Matmul math type of the call's GEMMs: FMA_MATH forbids TF32 for FLOAT data (002 cudnnMathType_t)."""
    return "FMA_MATH" if (cfg.dtype == "float32" and not cfg.tf32) else "DEFAULT_MATH"


def _stamped(builder: bg.GraphBuilder, cfg: RNNConfig) -> bg.GraphBuilder:
    for op in builder.ops:
        if op.kind == "Matmul":
            op.attrs.setdefault("math_type", math_type(cfg))
    return builder


def written_buffers(bounds) -> set:
    """Names of the caller's buffers that any of the bound graphs writes."""
    out = set()
    for bound in bounds:
        if bound is not None:
            out.update(bound.bindings[t.uid][0] for t in bound.graph.external_outputs() if t.uid in bound.bindings)
    return out


def prepare_stages(call: Call, kind: str) -> tuple:
    """(((plan-cache key, bound graph), ...) of every stage of ``kind``, names of the caller's
    buffers some stage writes): every graph built (or fetched) before anything runs.  The key
    tuples are made here once; a caller that keeps the result (rnn/v8.py's call sites) passes the
    same key objects call after call, so each stage finds its prepared call (``_core.call.run``)."""
    prepared = []
    for stage, fn, arg in stages(call, kind):
        key = call.key(stage)
        prepared.append((key, bg.prepare(key, (lambda fn=fn, arg=arg: _stamped(
            fn(call, arg) if arg is not None else fn(call), call.cfg)))))
    return tuple(prepared), written_buffers(bound for _, bound in prepared)


def run(handle, call: Call, kind: str, buffers: dict, values: dict, specs: "dict | None" = None,
        staged: "tuple | None" = None) -> None:
    """Build (or fetch) every graph of the call first (``staged``: ``prepare_stages``' result, kept
    by the caller), then check every buffer (``specs``: name -> (argname, (dtype or None, bytes));
    written = bound to an output of some graph) with ``_core.data.preflight``, then run the graphs
    in order: a rejected call writes nothing.  On the GPU place a checked CuPy array is bound by
    its address (the stages' tensors are byte offsets into the caller's buffers: an int sum, no
    view per tensor)."""
    prepared, written = staged or prepare_stages(call, kind)
    if specs is not None:
        names = list(buffers)
        buffers = dict(zip(names, preflight(handle, [(buffers[n], specs[n][1], specs[n][0], n in written)
                                                     for n in names], pointers=True)))
    for key, bound in prepared:
        bg.execute(handle, key, bound, buffers, values)
