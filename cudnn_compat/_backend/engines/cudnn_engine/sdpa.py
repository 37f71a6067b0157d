"""cuDNN 9's fused flash attention (000 "Fused Flash Attention fprop/bprop"): the backend
operation graphs its SDPA engines recognize, built the way cudnn-frontend's SDPA nodes lower
them, and their plans.

Why a module of its own, not a translation of an IR graph: the pattern is fixed (the engines
match it op by op: Q·Kᵀ, the scale, the masks made of GEN_INDEX / CMP_* / LOGICAL_AND /
BINARY_SELECT, softmax as MAX, SUB, EXP, ADD, LOG, ADD, DIV with its statistics, ·V; the bprop
graph with the dO·O row sum, RESHAPE transposes and the three gradient matmuls), and every
op but the two matmuls runs inside one kernel, so an IR graph of the same ops would buy
nothing but a second home for the pattern.  ``Sdpa`` (pure Python, tested on the CPU) is the
problem: shapes, strides of the BHSD views (D stride 1; BSHD-interleaved allowed), the mask;
``fprop_graph``/``bprop_graph`` list the backend tensors and ops; ``SdpaPlan`` finalizes them
(heuristics mode A, then FALLBACK) and executes.  The legacy layer (``cudnn_compat.attention``)
decides which calls take this path and names the reason when one cannot.

Tensors (uids below): Q [b,h,sq,dqk], K as Kᵀ [b,h,dqk,skv], V [b,h,skv,dv], O [b,h,sq,dv]
(the I/O type), Stats [b,h,sq,1] float32 (max + log sum of exp: the bprop recomputes P from
it), per-batch lengths [b,1,1,1] int32 (padding), by-value float scale and mask value.
Bprop: dO, dQ, dK, dV like Q, K, V; softmax_sum [b,h,sq,1] float32 and dQ_accum
[b,h,sq,dqk] float32 are scratch the caller provides (dQ_accum zeroed before each run).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

from .graph import TSpec, tensor_descriptor

Q, K, V, O, STATS, SCALE, SEQ_Q, SEQ_KV, NEG, DO, DQ, DK, DV, SSUM, DQ_ACC, ONE, WIN = range(1, 18)
SCALARS = {SCALE: "scale", NEG: "neg", ONE: "one", WIN: "window"}  # by-value float scalars
REDUCE_OP = {"ADD": 0, "MAX": 3}  # cudnnReduceTensorOp_t


@dataclass(frozen=True)
class Sdpa:
    """One attention core problem.  Strides are (b, h, s, d) element strides of each tensor;
    ``causal``: key j attends query i iff j <= i (right bound 0, top-left diagonal);
    ``window``: additionally j > i - window (a sliding window of that many keys, 0: none);
    ``padding``: per-batch lengths mask rows >= seq_q[b] and columns >= seq_kv[b]."""

    b: int
    h: int
    sq: int
    skv: int
    dqk: int
    dv: int
    q: tuple
    k: tuple
    v: tuple
    o: tuple
    dtype: str = "float16"
    padding: bool = False
    causal: bool = False
    window: int = 0
    neg: float = float("-inf")  # the masked score (cudnn-frontend: lowest() before 9.1, -inf after)

    def stats_strides(self) -> tuple:
        return (self.h * self.sq, self.sq, 1, 1)


@dataclass
class NGraph:
    """Backend tensors (uid -> TSpec) and ops [(kind, {attr: uid or value})] in order."""
    tensors: dict = field(default_factory=dict)
    ops: list = field(default_factory=list)
    _next: list = field(default_factory=lambda: [100])

    def ext(self, uid, dims, strides, dtype, by_value=False):
        self.tensors[uid] = TSpec(uid, tuple(dims), tuple(strides), dtype, False, by_value)
        return uid

    def virt(self, dims, dtype="float32", strides=None):
        self._next[0] += 1
        uid = self._next[0]
        self.tensors[uid] = TSpec(uid, tuple(dims), tuple(strides or _packed(dims)), dtype, True, False)
        return uid

    def pw(self, mode, x, b=None, t=None, out=None, dtype="float32", prec="float32", axis=None, like=None):
        if out is None:
            dims = self.tensors[like if like is not None else x].dims
            out = self.virt(dims, dtype)
        self.ops.append(("pointwise", {"mode": mode, "x": x, "b": b, "t": t, "y": out, "prec": prec, "axis": axis}))
        return out

    def red(self, mode, x, out=None):
        if out is None:
            d = self.tensors[x].dims
            out = self.virt(d[:-1] + (1,))
        self.ops.append(("reduction", {"mode": mode, "x": x, "y": out}))
        return out

    def mm(self, a, b, out=None, m=None, n=None, k=None, dtype="float32"):
        if out is None:
            da, db = self.tensors[a].dims, self.tensors[b].dims
            out = self.virt(da[:-1] + (db[-1],), dtype)
        self.ops.append(("matmul", {"a": a, "b": b, "c": out, "m": m, "n": n, "k": k}))
        return out

    def reshape(self, x, dims, strides, dtype):
        out = self.virt(dims, dtype, strides)
        self.ops.append(("reshape", {"x": x, "y": out}))
        return out

    def describe(self) -> str:
        return ", ".join(f"{k}[{a['mode']}]" if "mode" in a else k for k, a in self.ops)


def _packed(dims) -> tuple:
    st, acc = [], 1
    for d in reversed(dims):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


def _t(strides) -> tuple:
    """(b, h, s, d) strides -> those of the transposed view (b, h, d, s)."""
    return (strides[0], strides[1], strides[3], strides[2])


def _inputs(g: NGraph, p: Sdpa) -> None:
    g.ext(Q, (p.b, p.h, p.sq, p.dqk), p.q, p.dtype)
    g.ext(K, (p.b, p.h, p.dqk, p.skv), _t(p.k), p.dtype)  # Kᵀ
    g.ext(SCALE, (1, 1, 1, 1), (1, 1, 1, 1), "float32", True)
    if p.padding or p.causal or p.window:
        g.ext(NEG, (1, 1, 1, 1), (1, 1, 1, 1), "float32", True)
    if p.padding:
        g.ext(SEQ_Q, (p.b, 1, 1, 1), (1, 1, 1, 1), "int32")
        g.ext(SEQ_KV, (p.b, 1, 1, 1), (1, 1, 1, 1), "int32")
    if p.window:
        g.ext(WIN, (1, 1, 1, 1), (1, 1, 1, 1), "float32", True)


def _scores(g: NGraph, p: Sdpa, stats: "int | None" = None) -> int:
    """S = scale * Q·Kᵀ with the masks applied (cudnn-frontend's padding_mask, causal_mask and
    sliding_window_mask modifiers, in its order: padding, then (bprop) S - Stats, then the band)."""
    ov = dict(m=SEQ_Q, n=SEQ_KV) if p.padding else {}
    s = g.mm(Q, K, **ov)
    s = g.pw("MUL", s, SCALE)
    if p.padding:
        row = g.pw("GEN_INDEX", s, dtype="int32", prec="int32", axis=2)
        col = g.pw("GEN_INDEX", s, dtype="int32", prec="int32", axis=3)
        rm = g.pw("CMP_LT", row, SEQ_Q, dtype="bool", prec="bool")
        cm = g.pw("CMP_LT", col, SEQ_KV, dtype="bool", prec="bool")
        m = g.pw("LOGICAL_AND", rm, cm, dtype="bool", prec="bool")
        s = g.pw("BINARY_SELECT", s, NEG, m)
    if stats is not None:
        s = g.pw("SUB", s, stats)
    if p.causal:
        row = g.pw("GEN_INDEX", s, dtype="int32", prec="int32", axis=2)
        col = g.pw("GEN_INDEX", s, dtype="int32", prec="int32", axis=3)
        keep = g.pw("CMP_GE", row, col, dtype="bool", prec="bool")
        s = g.pw("BINARY_SELECT", s, NEG, keep)
    if p.window:
        row = g.pw("GEN_INDEX", s, dtype="int32", prec="int32", axis=2)
        col = g.pw("GEN_INDEX", s, dtype="int32", prec="int32", axis=3)
        shifted = g.pw("ADD", col, WIN, dtype="float32", prec="float32")
        keep = g.pw("CMP_GT", shifted, row, dtype="bool", prec="bool")
        s = g.pw("BINARY_SELECT", s, NEG, keep)
    return s


def fprop_graph(p: Sdpa, training: bool = True) -> NGraph:
    """O = softmax(scale Q·Kᵀ + mask)·V; ``training`` also writes Stats.  libcudnn 9.19's
    heuristics list no engine for the graph without Stats, so inference runs this one too
    (Stats into scratch)."""
    g = NGraph()
    _inputs(g, p)
    g.ext(V, (p.b, p.h, p.skv, p.dv), p.v, p.dtype)
    g.ext(O, (p.b, p.h, p.sq, p.dv), p.o, p.dtype)
    s = _scores(g, p)
    mx = g.red("MAX", s)
    e = g.pw("EXP", g.pw("SUB", s, mx))
    sm = g.red("ADD", e)
    if training:
        g.ext(STATS, (p.b, p.h, p.sq, 1), p.stats_strides(), "float32")
        g.pw("ADD", mx, g.pw("LOG", sm), out=STATS)
    prob = g.pw("DIV", e, sm, dtype=p.dtype)
    g.mm(prob, V, out=O, **(dict(m=SEQ_Q, k=SEQ_KV) if p.padding else {}))
    return g


def bprop_graph(p: Sdpa) -> NGraph:
    """dQ, dK, dV from Q, K, V, O, dO and Stats: cudnn-frontend's CompositeSDPABackwardNode (MHA,
    no dropout, cuDNN >= 9: dQ through a float32 accumulator), tensor for tensor: the dO*O
    product with the frontend's strides, K re-viewed from Kᵀ as a float32 virtual, Pᵀ and dSᵀ
    in the I/O type.  The engines (eng6/eng7 on sm90, libcudnn 9.19) finalize it only with the
    knob choices the heuristics give (KERNEL_CFG; ``lib.Descriptor.all_descriptors``)."""
    g = NGraph()
    _inputs(g, p)
    g.ext(V, (p.b, p.h, p.dv, p.skv), _t(p.v), p.dtype)  # Vᵀ
    g.ext(O, (p.b, p.h, p.sq, p.dv), p.o, p.dtype)
    g.ext(DO, (p.b, p.h, p.sq, p.dv), p.o, p.dtype)
    g.ext(STATS, (p.b, p.h, p.sq, 1), p.stats_strides(), "float32")
    g.ext(DQ, (p.b, p.h, p.sq, p.dqk), p.q, p.dtype)
    g.ext(DK, (p.b, p.h, p.skv, p.dqk), p.k, p.dtype)
    g.ext(DV, (p.b, p.h, p.skv, p.dv), p.v, p.dtype)
    g.ext(ONE, (1, 1, 1, 1), (1, 1, 1, 1), "float32", True)
    g.ext(SSUM, (p.b, p.h, p.sq, 1), p.stats_strides(), "float32")
    prod = g.virt((p.b, p.h, p.sq, p.dv), "float32", (p.h * p.sq * p.dv, p.sq * p.dv, p.h * p.dv, 1))
    g.pw("MUL", DO, O, out=prod)
    g.pw("MUL", g.red("ADD", prod), ONE, out=SSUM)
    e = g.pw("EXP", _scores(g, p, STATS))
    tr = (p.b, p.h, p.skv, p.sq)
    tr_st = (p.h * p.sq * p.skv, p.sq * p.skv, 1, p.skv)
    pt = g.reshape(e, tr, tr_st, p.dtype)
    g.mm(pt, DO, out=DV, **(dict(m=SEQ_KV, k=SEQ_Q) if p.padding else {}))
    dp = g.mm(DO, V, **(dict(m=SEQ_Q, n=SEQ_KV) if p.padding else {}))
    ds = g.pw("MUL", g.pw("SUB", dp, SSUM), e)
    ds = g.pw("MUL", ds, SCALE)
    dst = g.reshape(ds, tr, tr_st, p.dtype)
    g.mm(dst, Q, out=DK, **(dict(m=SEQ_KV, k=SEQ_Q) if p.padding else {}))
    kk = g.reshape(K, (p.b, p.h, p.skv, p.dqk), p.k, "float32")
    g.ext(DQ_ACC, (p.b, p.h, p.sq, p.dqk), _packed((p.b, p.h, p.sq, p.dqk)), "float32")
    g.mm(ds, kk, out=DQ_ACC, **(dict(m=SEQ_Q, k=SEQ_KV) if p.padding else {}))
    g.pw("IDENTITY", DQ_ACC, out=DQ)
    return g


# --------------------------------------------------------------------------- native plans


class SdpaPlan:
    """A finalized backend plan of ``graph`` (an NGraph) on ``handle``; ``execute(ptrs, values,
    workspace_ptr)`` with device pointers by uid and by-value floats by uid."""

    def __init__(self, graph: NGraph, handle: int, modes=("A", "FALLBACK")):
        from . import configs as _configs
        from . import lib
        self.lib, self.descs, self.graph = lib, [], graph
        self.tried: list = []  # (config, error) of configs that did not finalize
        try:
            tds = {uid: self._tensor(t) for uid, t in graph.tensors.items()}
            ops = [self._op(kind, a, tds) for kind, a in graph.ops]
            og = self._new("OPERATIONGRAPH")
            og.set("OPERATIONGRAPH_HANDLE", "HANDLE", handle)
            og.set("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", ops)
            og.finalize()
            self.opgraph = og
            self.plan = None
            for mode in modes:
                try:
                    cfgs = _configs._query(lib, og, mode)
                except lib.CudnnStatusError as e:
                    self.tried.append((f"heuristics {mode}", str(e)))
                    continue
                for cfg, _ws in cfgs:
                    try:
                        plan, ws, keep = _configs.execution_plan(lib, handle, og, cfg)
                    except lib.CudnnStatusError as e:
                        self.tried.append((str(cfg), str(e)))
                        continue
                    self.descs.extend(keep)
                    self.plan, self.workspace, self.config = plan, ws, cfg
                    break
                if self.plan is not None:
                    break
            if self.plan is None:
                detail = "; ".join(f"{c}: {e}" for c, e in self.tried[:4]) or "the heuristics listed no engine"
                raise lib.CudnnStatusError("SDPA execution plan", lib.STATUS["NOT_SUPPORTED"], detail)
        except Exception:
            self.destroy()
            raise
        self.uids = sorted(u for u, t in graph.tensors.items() if not t.virtual)
        self._slots = {u: ctypes.c_float(0.0) for u in self.uids if graph.tensors[u].by_value}
        self._packs: dict = {}

    def _new(self, kind):
        d = self.lib.Descriptor(kind)
        self.descs.append(d)
        return d

    def _tensor(self, t: TSpec):
        return tensor_descriptor(self.lib, self._new("TENSOR"), t)

    def _op(self, kind, a, tds):
        lib = self.lib
        if kind == "matmul":
            m = self._new("MATMUL")
            m.set("MATMUL_COMP_TYPE", "DATA_TYPE", lib.DATA_TYPE["float32"])
            m.finalize()
            op = self._new("OPERATION_MATMUL")
            op.set("OPERATION_MATMUL_ADESC", "BACKEND_DESCRIPTOR", tds[a["a"]])
            op.set("OPERATION_MATMUL_BDESC", "BACKEND_DESCRIPTOR", tds[a["b"]])
            op.set("OPERATION_MATMUL_CDESC", "BACKEND_DESCRIPTOR", tds[a["c"]])
            for r in ("m", "n", "k"):
                if a[r] is not None:
                    op.set(f"OPERATION_MATMUL_GEMM_{r.upper()}_OVERRIDE_DESC", "BACKEND_DESCRIPTOR", tds[a[r]])
            op.set("OPERATION_MATMUL_DESC", "BACKEND_DESCRIPTOR", m)
            return op.finalize()
        if kind == "reduction":
            r = self._new("REDUCTION")
            r.set("REDUCTION_OPERATOR", "REDUCTION_OPERATOR_TYPE", REDUCE_OP[a["mode"]])
            r.set("REDUCTION_COMP_TYPE", "DATA_TYPE", lib.DATA_TYPE["float32"])
            r.finalize()
            op = self._new("OPERATION_REDUCTION")
            op.set("OPERATION_REDUCTION_XDESC", "BACKEND_DESCRIPTOR", tds[a["x"]])
            op.set("OPERATION_REDUCTION_YDESC", "BACKEND_DESCRIPTOR", tds[a["y"]])
            op.set("OPERATION_REDUCTION_DESC", "BACKEND_DESCRIPTOR", r)
            return op.finalize()
        if kind == "reshape":
            op = self._new("OPERATION_RESHAPE")
            op.set("OPERATION_RESHAPE_XDESC", "BACKEND_DESCRIPTOR", tds[a["x"]])
            op.set("OPERATION_RESHAPE_YDESC", "BACKEND_DESCRIPTOR", tds[a["y"]])
            return op.finalize()
        p = self._new("POINTWISE")
        p.set("POINTWISE_MODE", "POINTWISE_MODE", lib.POINTWISE_MODE[a["mode"]])
        p.set("POINTWISE_MATH_PREC", "DATA_TYPE", lib.DATA_TYPE[a["prec"]])
        if a["axis"] is not None:
            p.set("POINTWISE_AXIS", "INT64", a["axis"])
        p.finalize()
        op = self._new("OPERATION_POINTWISE")
        op.set("OPERATION_POINTWISE_PW_DESCRIPTOR", "BACKEND_DESCRIPTOR", p)
        op.set("OPERATION_POINTWISE_XDESC", "BACKEND_DESCRIPTOR", tds[a["x"]])
        if a["b"] is not None:
            op.set("OPERATION_POINTWISE_BDESC", "BACKEND_DESCRIPTOR", tds[a["b"]])
        if a["t"] is not None:
            op.set("OPERATION_POINTWISE_TDESC", "BACKEND_DESCRIPTOR", tds[a["t"]])
        op.set("OPERATION_POINTWISE_YDESC", "BACKEND_DESCRIPTOR", tds[a["y"]])
        return op.finalize()

    def execute(self, handle: int, ptrs: dict, values: dict, workspace: int = 0) -> None:
        """One cudnnBackendExecute; ``ptrs``: uid -> device address, ``values``: uid -> float."""
        lib = self.lib
        for u, slot in self._slots.items():
            slot.value = float(values[u])
        addrs = tuple(ctypes.addressof(self._slots[u]) if u in self._slots else int(ptrs[u]) for u in self.uids)
        key = (addrs, int(workspace))
        vp = self._packs.get(key)
        if vp is None:
            if len(self._packs) >= 16:
                for d in self._packs.values():
                    d.destroy()
                self._packs.clear()
            vp = lib.Descriptor("VARIANT_PACK")
            vp.set("VARIANT_PACK_UNIQUE_IDS", "INT64", list(self.uids))
            vp.set("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", list(addrs))
            vp.set("VARIANT_PACK_WORKSPACE", "VOID_PTR", int(workspace) or None)
            vp.finalize()
            self._packs[key] = vp
        lib.check("cudnnBackendExecute(SDPA)", lib.load().cudnnBackendExecute(handle, self.plan.ptr, vp.ptr))

    def destroy(self) -> None:
        for d in list(getattr(self, "_packs", {}).values()):
            d.destroy()
        self._packs = {}
        for d in reversed(self.descs):
            d.destroy()
        self.descs = []
