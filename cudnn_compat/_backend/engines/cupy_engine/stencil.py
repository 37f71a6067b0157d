"""Generated one-thread-per-output kernels for window ops (pure Python): pooling
(002 §3.2.69, §4.1.18), LRN (§3.2.65, §4.1.14) and divisive normalization (§3.2.33,
§4.1.6), with the reference engine's semantics (reference/pooling.py, reference/lrn.py).

Each thread owns one output element: its logical coordinates come from the linear index
taken in the output's memory order (coalesced stores), the op's body loops over its window
(window sizes are compile-time constants, so the loops unroll) and the element-wise
epilogue (the alpha/beta blend) is applied before the store.  Backward passes gather over
the outputs whose windows contain the element (deterministic, no atomics); LRN and divisive
normalization backward first write a per-element term to scratch, then gather it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...ir import Tensor, packed_strides
from .codegen import (BLOCK, INT32_LIMIT, ITEMSIZE, PREAMBLE, STORAGE, KernelSpec, bstrides, decompose, emit_chain,
                      lit, load_expr, max_offset, name_kernel, offset_expr, order_axes, round_expr, store_expr,
                      tensors_compute_type)
from .rowwise import RowOut, epilogue_code, load_into
from .steps import KernelRun

KINDS = ("ResampleForward", "ResampleBackward", "LRNForward", "LRNBackward",
         "DivisiveNormalizationForward", "DivisiveNormalizationBackward")
SCRATCH = 10 ** 9 + 10  # uids of scratch tensors


def supports(op) -> "str | None":
    return None


@dataclass
class StencilSpec:
    family: str
    out: RowOut  # the element output (through its epilogue)
    inputs: dict  # name -> Tensor the body reads with ld(name, coords)
    body: object  # fn(ctx) -> lines computing ``v`` from the coordinates c0..c{r-1}
    extra_outs: list = field(default_factory=list)  # more RowOuts at the same coordinates (values from body)
    loop_axis: "int | None" = None  # one thread walks this whole axis (``c<axis>`` is the loop variable)
    prologue: object = None  # fn(ctx) -> lines run once per thread before the walk


class _Ctx:
    def __init__(self, spec, T, IDX, coords):
        self.spec, self.T, self.IDX, self.c = spec, T, IDX, coords

    def ld(self, name, coords) -> str:
        t = self.spec.inputs[name]
        off = " + ".join(f"({c}) * ({self.IDX}){s}" for c, s in zip(coords, t.strides) if s != 0) or "0"
        return load_expr(t.dtype, f"p{t.uid}[{off}]", self.T)

    def lit(self, v) -> str:
        return lit(v, self.T)


def stencil_kernel(spec: StencilSpec) -> KernelSpec:
    outs = [spec.out] + list(spec.extra_outs)
    loads, stores = {}, {}
    for t in spec.inputs.values():
        loads.setdefault(t.uid, t)
    epi_scalars = {}
    for o in outs:
        if o.epilogue is None:
            stores[o.tensor.uid] = o.tensor
        else:
            for uid, t in o.epilogue.loads.items():
                loads.setdefault(uid, t)
            stores.update(o.epilogue.stores)
            epi_scalars.update({u: t for u, t in o.epilogue.tensors().items() if t.is_by_value})
    for uid in stores:
        loads.pop(uid, None)
    dims = spec.out.tensor.dims
    mem = list(loads.values()) + list(stores.values())
    T = tensors_compute_type(mem)
    n = math.prod(dims) // (dims[spec.loop_axis] if spec.loop_axis is not None else 1)
    big = max([n] + [max_offset(t.dims, t.strides) + 1 for t in mem]) > INT32_LIMIT
    IDX = "long long" if big else "int"  # signed: window coordinates go negative
    # iterate in the memory order of the first stored tensor
    lead = bstrides(next(iter(stores.values())), dims)
    order = order_axes([a for a in range(len(dims)) if a != spec.loop_axis], lead)
    params = [f"const {STORAGE[t.dtype]}* p{u}" for u, t in loads.items()]
    params += [f"{STORAGE[t.dtype]}* p{u}" for u, t in stores.items()]
    args = [("buf", u) for u in loads] + [("buf", u) for u in stores]
    for u in sorted(epi_scalars):
        params.append(f"const {T} s{u}")
        args.append(("scalar", u, T))
    body = [PREAMBLE, f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params)}) {{']
    body.append(f"  const {IDX} i = ({IDX})blockIdx.x * ({IDX}){BLOCK} + ({IDX})threadIdx.x;")
    body.append(f"  if (i >= ({IDX}){n}) return;")
    dl, oc = decompose("i", [dims[a] for a in order], "q", IDX)
    body += ["  " + x for x in dl]
    coords = [None] * len(dims)
    for a, c in zip(order, oc):
        coords[a] = c
    for a, c in enumerate(coords):
        if a != spec.loop_axis:
            body.append(f"  const {IDX} c{a} = {c};")
    cnames = [f"c{a}" for a in range(len(dims))]
    ctx = _Ctx(spec, T, IDX, cnames)
    pad = "  "
    if spec.loop_axis is not None:
        if spec.prologue is not None:
            body += ["  " + x for x in spec.prologue(ctx)]
        body.append(f"  for ({IDX} c{spec.loop_axis} = 0; c{spec.loop_axis} < {dims[spec.loop_axis]}; "
                    f"++c{spec.loop_axis}) {{")
        pad = "    "
    body += [pad + x for x in spec.body(ctx)]
    for o in outs:
        body += [pad + x for x in _store(o, cnames, T, IDX)]
    if spec.loop_axis is not None:
        body.append("  }")
    body.append("}")
    name, src = name_kernel(spec.family, "\n".join(body) + "\n")
    k = KernelSpec(name, src, args, params, (max(1, -(-n // BLOCK)), 1, 1), (BLOCK, 1, 1), 0, (), spec.family)
    k.guard = tuple(t.uid for t in spec.inputs.values())  # read at other positions: unalias first
    k.stored = tuple(stores)
    return k


def _store(o: RowOut, coords, T, IDX):
    def off(t):
        return offset_expr(coords, bstrides(t, o.tensor.dims), IDX)
    lines = []
    if o.epilogue is None:
        t = o.tensor
        return [f"p{t.uid}[{off(t)}] = {store_expr(t.dtype, o.value, T)};"]
    pre, body, env = epilogue_code(o, T, load_into(T, lambda uid, t: f"p{uid}[{off(t)}]"))
    lines += pre + ["{"] + ["  " + x for x in body]
    for uid, t in o.epilogue.stores.items():
        lines.append(f"  p{uid}[{off(t)}] = {store_expr(t.dtype, env[uid], T)};")
    lines.append("}")
    return lines


def _out(step, role, value):
    op = step.op
    return RowOut(op.outputs[role], value, step.epilogues.get(role)) if role in op.outputs else None


def _temps(step):
    return [t for r, t in step.op.outputs.items() if t.is_virtual and r not in step.epilogues]


def _scratch(uid, dims, T):
    return Tensor(uid, tuple(dims), packed_strides(dims), "float64" if T == "double" else "float32", is_virtual=True)


def build(step) -> list:
    fn = {"ResampleForward": _pool_forward, "ResampleBackward": _pool_backward, "LRNForward": _lrn_forward,
          "LRNBackward": _lrn_backward, "DivisiveNormalizationForward": _divnorm_forward,
          "DivisiveNormalizationBackward": _divnorm_backward}[step.op.kind]
    return fn(step)


# -- pooling ------------------------------------------------------------------------------

def _pool_forward(step):
    op = step.op
    a = op.attrs
    x = op.inputs["x"]
    sp = len(x.dims) - 2
    win, st, pad = a["window"], a["stride"], a["pre_padding"]
    mode = a["mode"]
    prop = a.get("nan_propagation", "NOT_PROPAGATE") == "PROPAGATE"

    def body(c):
        T = c.T
        lines = []
        lowest = "-3.4028234663852886e+38f" if T == "float" else "-1.7976931348623157e+308"
        if mode == "MAXPOOL":
            lines += [f"{T} acc = {T}(0); bool have = false;"]
        else:
            lines += [f"{T} acc = {T}(0); int cnt = 0;"]
        idx = []
        for d in range(sp):
            lines.append(f"for (int r{d} = 0; r{d} < {win[d]}; ++r{d}) {{")
            lines.append(f"  const {c.IDX} i{d} = c{2 + d} * {st[d]} - {pad[d]} + r{d};")
            lines.append(f"  if (i{d} < 0 || i{d} >= {x.dims[2 + d]}) continue;")
            idx.append(f"i{d}")
        v = c.ld("x", ["c0", "c1"] + idx)
        lines.append(f"  const {T} e = {v};")
        if mode == "MAXPOOL":
            if prop:
                lines.append("  acc = have ? cc_pmax(acc, e) : e; have = true;")
            else:
                lines.append("  if (e == e) { acc = have ? (e > acc ? e : acc) : e; have = true; }")
        else:
            lines.append("  acc += e; ++cnt;")
        lines += ["}"] * sp
        if mode == "MAXPOOL":
            lines.append(f"const {T} v = have ? acc : {T}({lowest});")
        elif mode == "AVGPOOL_INCLUDE_PADDING":
            lines.append(f"const {T} v = acc / {T}({math.prod(win)});")
        else:
            lines.append(f"const {T} v = cnt > 0 ? acc / {T}(cnt) : {T}(0);")
        return lines

    k = stencil_kernel(StencilSpec("poolfwd", _out(step, "y", "v"), {"x": x}, body))
    vec = _pool_forward_vec(step)
    return [KernelRun(([vec] if vec is not None else []) + [k], _temps(step))]


def _pool_forward_vec(step) -> "KernelSpec | None":
    """Pooling forward with the channel axis innermost (NHWC): one thread per output position and
    ``V`` channels, every window element one 16-byte load (the scalar kernel loads 2 bytes at a
    time in fp16).  None when the channel axis is not contiguous in every tensor, C % V != 0 or
    another stride is not a multiple of V; the pointers' 16-byte alignment is checked at run time
    (the scalar kernel is the fallback)."""
    op = step.op
    a = op.attrs
    x = op.inputs["x"]
    o = _out(step, "y", "v")
    win, st, pad = a["window"], a["stride"], a["pre_padding"]
    mode = a["mode"]
    prop = a.get("nan_propagation", "NOT_PROPAGATE") == "PROPAGATE"
    loads, stores = {x.uid: x}, {}
    if o.epilogue is None:
        stores[o.tensor.uid] = o.tensor
    else:
        for uid, t in o.epilogue.loads.items():
            loads.setdefault(uid, t)
        stores.update(o.epilogue.stores)
    for uid in stores:
        loads.pop(uid, None)
    ydims = tuple(o.tensor.dims)
    mem = list(loads.values()) + list(stores.values())
    if x.uid not in loads or any(t is not x and tuple(t.dims) != ydims for t in mem):
        return None
    C = ydims[1]
    isz = max(ITEMSIZE[t.dtype] for t in mem)
    V = 16 // isz
    if V < 2 or C % V or any(t.strides[1] != 1 for t in mem) or C == 1:
        return None
    if any(s % V for t in mem for i, s in enumerate(t.strides) if i != 1):
        return None
    T = tensors_compute_type(mem)
    n = math.prod(ydims) // V
    big = max([n * V] + [max_offset(t.dims, t.strides) + 1 for t in mem]) > INT32_LIMIT
    IDX = "long long" if big else "int"
    lead = next(iter(stores.values())).strides
    order = order_axes([d for d in range(len(ydims)) if d != 1], lead) + [1]
    sizes = [ydims[d] if d != 1 else C // V for d in order]
    sp = len(ydims) - 2
    params = [f"const {STORAGE[t.dtype]}* p{u}" for u, t in loads.items()]
    params += [f"{STORAGE[t.dtype]}* p{u}" for u, t in stores.items()]
    args = [("buf", u) for u in loads] + [("buf", u) for u in stores]
    scal = {}
    if o.epilogue is not None:
        scal = {u: t for u, t in sorted(o.epilogue.tensors().items()) if t.is_by_value}
    for u in scal:
        params.append(f"const {T} s{u}")
        args.append(("scalar", u, T))
    B = [PREAMBLE]
    for t in mem:
        B.append(f"struct __align__({V * ITEMSIZE[t.dtype]}) cc_v{t.uid} {{ {STORAGE[t.dtype]} v[{V}]; }};")
    B.append(f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params)}) {{')
    B.append(f"  const {IDX} i = ({IDX})blockIdx.x * ({IDX}){BLOCK} + ({IDX})threadIdx.x;")
    B.append(f"  if (i >= ({IDX}){n}) return;")
    dl, oc = decompose("i", sizes, "q", IDX)
    B += ["  " + x_ for x_ in dl]
    coord = dict(zip(order, oc))
    for d in range(len(ydims)):
        B.append(f"  const {IDX} c{d} = {coord[d]}{f' * {V}' if d == 1 else ''};")
    lowest = "-3.4028234663852886e+38f" if T == "float" else "-1.7976931348623157e+308"
    # max: a packed half2 max (fp16) or an IEEE max (others), NaN-skipping (NOT_PROPAGATE: the
    # accumulator starts as NaN, so it is NaN at the end exactly when no number was seen) or
    # NaN-propagating (PROPAGATE: it starts at -inf; ``have`` says whether any position was inside)
    half2 = mode == "MAXPOOL" and x.dtype == "float16" and T == "float"
    if half2:
        B[1:1] = [_HMAX2, f"struct __align__(16) cc_p{x.uid} {{ unsigned int v[{V // 2}]; }};"]
        B.append(f"  unsigned int acc2[{V // 2}];")
        B.append("  #pragma unroll")
        B.append(f"  for (int k = 0; k < {V // 2}; ++k) acc2[k] = {'0xFC00FC00u' if prop else '0x7E007E00u'};")
    else:
        init = (f"-{'CC_INF_F' if T == 'float' else 'CC_INF_D'}" if prop else f"{'CC_NAN_F' if T == 'float' else 'CC_NAN_D'}") \
            if mode == "MAXPOOL" else f"{T}(0)"
        B.append(f"  {T} acc[{V}];")
        B.append("  #pragma unroll")
        B.append(f"  for (int e = 0; e < {V}; ++e) acc[e] = {init};")
    B.append("  bool have = false;" if mode == "MAXPOOL" else "  int cnt = 0;")
    ind = "  "
    idx = []
    for d in range(sp):
        B.append(f"{ind}#pragma unroll")
        B.append(f"{ind}for (int r{d} = 0; r{d} < {win[d]}; ++r{d}) {{")
        B.append(f"{ind}  const {IDX} i{d} = c{2 + d} * {st[d]} - {pad[d]} + r{d};")
        B.append(f"{ind}  if (i{d} < 0 || i{d} >= {x.dims[2 + d]}) continue;")
        idx.append(f"i{d}")
        ind += "  "
    off = " + ".join([f"c0 * ({IDX}){x.strides[0]}", "c1"] + [f"{v} * ({IDX}){x.strides[2 + d]}" for d, v in enumerate(idx)])
    if half2:
        B.append(f"{ind}const cc_p{x.uid} q = *reinterpret_cast<const cc_p{x.uid}*>(p{x.uid} + {off});")
        B.append(f"{ind}#pragma unroll")
        B.append(f"{ind}for (int k = 0; k < {V // 2}; ++k) acc2[k] = {'cc_hmax2n' if prop else 'cc_hmax2'}(acc2[k], q.v[k]);")
    else:
        B.append(f"{ind}const cc_v{x.uid} q = *reinterpret_cast<const cc_v{x.uid}*>(p{x.uid} + {off});")
        B.append(f"{ind}#pragma unroll")
        B.append(f"{ind}for (int e = 0; e < {V}; ++e) {{")
        B.append(f"{ind}  const {T} ev = {load_expr(x.dtype, 'q.v[e]', T)};")
        if mode == "MAXPOOL":
            B.append(f"{ind}  acc[e] = {'cc_maxnan' if prop else 'fmax'}(acc[e], ev);")
            if prop:
                B[1:1] = [] if _MAXNAN in B else [_MAXNAN]
        else:
            B.append(f"{ind}  acc[e] += ev;")
        B.append(f"{ind}}}")
    B.append(f"{ind}{'have = true;' if mode == 'MAXPOOL' else '++cnt;'}")
    for d in range(sp):
        ind = ind[:-2]
        B.append(f"{ind}}}")

    def yoff(t):
        return " + ".join(f"c{d} * ({IDX}){s}" if s != 1 else f"c{d}" for d, s in enumerate(t.strides) if s != 0)
    for t in stores.values():
        B.append(f"  cc_v{t.uid} w{t.uid};")
    pre = {}
    if o.epilogue is not None:
        for uid, t in o.epilogue.loads.items():
            B.append(f"  const cc_v{uid} in{uid} = *reinterpret_cast<const cc_v{uid}*>(p{uid} + {yoff(t)});")
            pre[uid] = load_expr(t.dtype, f"in{uid}.v[e]", T)
    B.append("  #pragma unroll")
    B.append(f"  for (int e = 0; e < {V}; ++e) {{")
    if half2:
        B.append("    const unsigned short h = (unsigned short)(acc2[e / 2] >> (16 * (e % 2)));")
        got = "have" if prop else "(h & 0x7fffu) <= 0x7c00u"
        B.append(f"    const {T} v = {got} ? cc_h2f(h) : {T}({lowest});")
    elif mode == "MAXPOOL":
        got = "have" if prop else "acc[e] == acc[e]"
        B.append(f"    const {T} v = {got} ? acc[e] : {T}({lowest});")
    elif mode == "AVGPOOL_INCLUDE_PADDING":
        B.append(f"    const {T} v = acc[e] / {T}({math.prod(win)});")
    else:
        B.append(f"    const {T} v = cnt > 0 ? acc[e] / {T}(cnt) : {T}(0);")
    if o.epilogue is None:
        vals = {o.tensor.uid: "v"}
    else:
        env = {u: f"s{u}" for u in scal}
        v = "v"
        if o.tensor.is_virtual:
            r = round_expr(o.tensor.dtype, "v", T)
            if r != "v":
                B.append(f"    const {T} vr = {r};")
                v = "vr"
        env[o.tensor.uid] = v
        env.update(pre)
        B += ["    " + x_ for x_ in emit_chain(o.epilogue.prologue, env, T)]
        vals = {u: env[u] for u in stores}
    for t in stores.values():
        B.append(f"    w{t.uid}.v[e] = {store_expr(t.dtype, vals[t.uid], T)};")
    B.append("  }")
    for t in stores.values():
        B.append(f"  *reinterpret_cast<cc_v{t.uid}*>(p{t.uid} + {yoff(t)}) = w{t.uid};")
    B.append("}")
    name, src = name_kernel("poolfwd", "\n".join(B) + "\n")
    k = KernelSpec(name, src, args, params, (max(1, -(-n // BLOCK)), 1, 1), (BLOCK, 1, 1), 0,
                   tuple(t.uid for t in mem), "poolfwd")
    k.guard = (x.uid,)  # windows read other positions than the one written: unalias first
    k.stored = tuple(stores)
    return k


def _pool_backward(step):
    op = step.op
    a = op.attrs
    x, dy = op.inputs["x"], op.inputs["dy"]
    sp = len(x.dims) - 2
    win, st, pad = a["window"], a["stride"], a["pre_padding"]
    mode = a["mode"]
    prop = a.get("nan_propagation", "NOT_PROPAGATE") == "PROPAGATE"
    ydims = dy.dims

    def body(c):
        T, I = c.T, c.IDX
        lines = [f"{T} acc = {T}(0);"]
        for d in range(sp):
            # outputs o whose window [o*s - p, o*s - p + w) contains c{2+d}
            lines.append(f"{{ const {I} t = c{2 + d} + {pad[d]};")
            lines.append(f"  {I} lo = t - {win[d] - 1}; lo = lo <= 0 ? 0 : (lo + {st[d] - 1}) / {st[d]};")
            lines.append(f"  {I} hi = t < 0 ? -1 : t / {st[d]}; hi = hi < {ydims[2 + d] - 1} ? hi : {ydims[2 + d] - 1};")
            lines.append(f"  lo{d} = lo; hi{d} = hi; }}")
        decl = [f"{I} lo{d}, hi{d};" for d in range(sp)]
        lines = decl + lines
        for d in range(sp):
            lines.append(f"for ({I} o{d} = lo{d}; o{d} <= hi{d}; ++o{d}) {{")
        g = c.ld("dy", ["c0", "c1"] + [f"o{d}" for d in range(sp)])
        lines.append(f"  const {T} g = {g};")
        if mode == "MAXPOOL":
            # recompute the window's first maximal element (reference/pooling.py _max_hits)
            lines.append(f"  {T} best = {T}(0); bool have = false; bool mine = false;")
            for d in range(sp):
                lines.append(f"  for (int r{d} = 0; r{d} < {win[d]}; ++r{d}) {{")
                lines.append(f"    const {I} j{d} = o{d} * {st[d]} - {pad[d]} + r{d};")
                lines.append(f"    if (j{d} < 0 || j{d} >= {x.dims[2 + d]}) continue;")
            e = c.ld("x", ["c0", "c1"] + [f"j{d}" for d in range(sp)])
            same = " && ".join(f"j{d} == c{2 + d}" for d in range(sp))
            lines.append(f"    const {T} e = {e};")
            if prop:
                lines.append("    const bool take = !have || (e != e ? best == best : (best == best && e > best));")
            else:
                lines.append("    const bool take = (e == e) && (!have || e > best);")
            lines.append(f"    if (take) {{ best = e; have = true; mine = ({same}); }}")
            lines += ["  }"] * sp
            lines.append("  if (mine) acc += g;")
        else:
            if mode == "AVGPOOL_INCLUDE_PADDING":
                lines.append(f"  acc += g / {T}({math.prod(win)});")
            else:
                cnt = []
                for d in range(sp):
                    s0 = f"(o{d} * {st[d]} - {pad[d]})"
                    lines.append(f"  const {I} a{d} = {s0} < 0 ? 0 : {s0};")
                    lines.append(f"  const {I} b{d} = {s0} + {win[d]} > {x.dims[2 + d]} ? {x.dims[2 + d]} : {s0} + {win[d]};")
                    cnt.append(f"(b{d} - a{d})")
                lines.append(f"  acc += g / {T}({' * '.join(cnt)});")
        lines += ["}"] * sp
        lines.append(f"const {T} v = acc;")
        return lines

    k = stencil_kernel(StencilSpec("poolbwd", _out(step, "dx", "v"), {"x": x, "dy": dy}, body))
    return [KernelRun([k], _temps(step))]


_HMAX2 = r"""
static __device__ __forceinline__ unsigned int cc_hmax2_soft(unsigned int a, unsigned int b, bool nan) {
  unsigned int r = 0u;
  for (int k = 0; k < 2; ++k) {
    const unsigned short ha = (unsigned short)(a >> (16 * k)), hb = (unsigned short)(b >> (16 * k));
    const float fa = cc_h2f(ha), fb = cc_h2f(hb);
    unsigned short h;
    if (fa != fa || fb != fb) h = nan ? (unsigned short)0x7e00u : (fa != fa ? (fb != fb ? (unsigned short)0x7e00u : hb) : ha);
    else h = fb > fa ? hb : ha;
    r |= ((unsigned int)h) << (16 * k);
  }
  return r;
}
static __device__ __forceinline__ unsigned int cc_hmax2(unsigned int a, unsigned int b) {  // NaN-skipping
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned int r; asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r;
#else
  return cc_hmax2_soft(a, b, false);
#endif
}
static __device__ __forceinline__ unsigned int cc_hmax2n(unsigned int a, unsigned int b) {  // NaN-propagating
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned int r; asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r;
#else
  return cc_hmax2_soft(a, b, true);
#endif
}
"""

_MAXNAN = r"""
static __device__ __forceinline__ float cc_maxnan(float a, float b) {  // NaN-propagating max
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
#else
  return (a != a || b != b) ? CC_NAN_F : (b > a ? b : a);
#endif
}
static __device__ __forceinline__ double cc_maxnan(double a, double b) {
  return (a != a || b != b) ? CC_NAN_D : (b > a ? b : a);
}
"""


# -- LRN ----------------------------------------------------------------------------------

def _extent(n):
    lb = (n - 1) // 2
    return lb, n - lb - 1


def _lrn_d(c, x, a, ch: str):
    """Lines defining ``D_<tag>`` = k + alpha/n * sum of x^2 over the channel window of ``ch``."""
    T = c.T
    lb, la = _extent(a["n"])
    tag = ch.replace(" ", "").replace("+", "p").replace("-", "m")
    lines = [f"{T} ss_{tag} = {T}(0);",
             f"for (int q = -{lb}; q <= {la}; ++q) {{",
             f"  const {c.IDX} cc = {ch} + q;",
             f"  if (cc < 0 || cc >= {x.dims[1]}) continue;",
             f"  const {T} e = {c.ld('x', ['c0', 'cc'] + c.c[2:])};",
             "  ss_%s += e * e;" % tag, "}",
             f"const {T} D_{tag} = {c.lit(a['k'])} + {c.lit(a['alpha'] / a['n'])} * ss_{tag};"]
    return lines, f"D_{tag}"


def _pow(c, base: str, e: float) -> str:
    """base**e for base > 0: exp2(e*log2(base)) (faster than pow for float, same accuracy class)."""
    return f"exp2({c.lit(e)} * log2({base}))"


def _lrn_forward(step):
    """One thread per (n, spatial position) walks the channels: its window's elements stay in
    L1 from one channel to the next, the coordinates are computed once per thread."""
    op = step.op
    a = op.attrs
    x = op.inputs["x"]

    def body(c):
        lines, d = _lrn_d(c, x, a, "c1")
        lines.append(f"const {c.T} v = {c.ld('x', c.c)} * {_pow(c, d, -a['beta'])};")
        return lines

    k = stencil_kernel(StencilSpec("lrnfwd", _out(step, "y", "v"), {"x": x}, body, loop_axis=1))
    return [KernelRun([k], _temps(step))]


def _lrn_backward(step):
    op = step.op
    a = op.attrs
    x, y, dy = op.inputs["x"], op.inputs["y"], op.inputs["dy"]
    T = tensors_compute_type([x, y, dy, op.outputs["dx"]])
    tmp = _scratch(SCRATCH, x.dims, T)

    def body1(c):  # t_i = dy_i * y_i / D_i
        lines, d = _lrn_d(c, x, a, "c1")
        lines.append(f"const {c.T} v = {c.ld('dy', c.c)} * {c.ld('y', c.c)} / {d};")
        return lines

    lb, la = _extent(a["n"])

    def body2(c):  # dx = dy D^-beta - (2 alpha beta / n) x sum_{i in [c-la, c+lb]} t_i
        lines, d = _lrn_d(c, x, a, "c1")
        lines += [f"{c.T} acc = {c.T}(0);",
                  f"for (int q = -{la}; q <= {lb}; ++q) {{",
                  f"  const {c.IDX} cc = c1 + q;",
                  f"  if (cc < 0 || cc >= {x.dims[1]}) continue;",
                  f"  acc += {c.ld('t', ['c0', 'cc'] + c.c[2:])};", "}",
                  f"const {c.T} v = {c.ld('dy', c.c)} * {_pow(c, d, -a['beta'])} - "
                  f"{c.lit(2.0 * a['alpha'] * a['beta'] / a['n'])} * {c.ld('x', c.c)} * acc;"]
        return lines

    k1 = stencil_kernel(StencilSpec("lrnbwd1", RowOut(tmp, "v"), {"x": x, "y": y, "dy": dy}, body1))
    k2 = stencil_kernel(StencilSpec("lrnbwd2", _out(step, "dx", "v"), {"x": x, "dy": dy, "t": tmp}, body2))
    return [KernelRun([k1], [tmp]), KernelRun([k2], _temps(step))]


# -- divisive normalization -----------------------------------------------------------------

def _window_loops(c, dims, lo, hi, var):
    """Nested loops over q_d in [-lo, hi] with j_d = c_d + q_d inside dims (spatial dims 2..)."""
    lines = []
    for d in range(2, len(dims)):
        lines.append(f"for (int q{d} = -{lo}; q{d} <= {hi}; ++q{d}) {{")
        lines.append(f"  const {c.IDX} {var}{d} = c{d} + q{d};")
        lines.append(f"  if ({var}{d} < 0 || {var}{d} >= {dims[d]}) continue;")
    return lines, ["c0", "c1"] + [f"{var}{d}" for d in range(2, len(dims))], ["}"] * (len(dims) - 2)


def _divnorm_d(c, x, a, has_means):
    """Lines for D (at this element), S1 (window sum of x), CNT (window count)."""
    T = c.T
    lb, la = _extent(a["n"])
    cc = a["alpha"] / float(a["n"]) ** (len(x.dims) - 2)
    mean = c.ld("means", c.c) if has_means else f"{T}(0)"
    lines = [f"const {T} mi = {mean};", f"{T} s1 = {T}(0), s2 = {T}(0), cnt = {T}(0);"]
    open_, co, close = _window_loops(c, x.dims, lb, la, "j")
    lines += open_
    lines += [f"  const {T} e = {c.ld('x', co)};", "  s1 += e; s2 += (e - mi) * (e - mi); cnt += 1;"]
    lines += close
    lines.append(f"const {T} D = {c.lit(a['k'])} + {c.lit(cc)} * s2;")
    return lines, cc


def _divnorm_forward(step):
    op = step.op
    a = op.attrs
    x = op.inputs["x"]
    ins = {"x": x}
    if "means" in op.inputs:
        ins["means"] = op.inputs["means"]

    def body(c):
        lines, _ = _divnorm_d(c, x, a, "means" in ins)
        lines.append(f"const {c.T} v = {c.ld('x', c.c)} * {_pow(c, 'D', -a['beta'])};")
        return lines

    k = stencil_kernel(StencilSpec("divnfwd", _out(step, "y", "v"), ins, body))
    return [KernelRun([k], _temps(step))]


def _divnorm_backward(step):
    op = step.op
    a = op.attrs
    x, dy = op.inputs["x"], op.inputs["dy"]
    has_m = "means" in op.inputs
    T = tensors_compute_type([x, dy, op.outputs["dx"]])
    g_t = _scratch(SCRATCH, x.dims, T)
    ins = {"x": x, "dy": dy}
    if has_m:
        ins["means"] = op.inputs["means"]
    beta = a["beta"]

    def body1(c):  # g = dy x D^-(beta+1); dmeans = 2 c beta g (s1 - cnt m)
        lines, cc = _divnorm_d(c, x, a, has_m)
        lines.append(f"const {c.T} v = {c.ld('dy', c.c)} * {c.ld('x', c.c)} * {_pow(c, 'D', -(beta + 1.0))};")
        lines.append(f"const {c.T} dm = {c.lit(2.0 * cc * beta)} * v * (s1 - cnt * mi);")
        return lines

    extra = []
    if "dmeans" in op.outputs:
        extra.append(_out(step, "dmeans", "dm"))
    k1 = stencil_kernel(StencilSpec("divnbwd1", RowOut(g_t, "v"), ins, body1, extra))
    lb, la = _extent(a["n"])

    def body2(c):  # dx = dy D^-beta - 2 c beta (x sum g_i - sum g_i m_i), i: k in window(i)
        lines, cc = _divnorm_d(c, x, a, has_m)
        lines.append(f"{c.T} sg = {c.T}(0), sgm = {c.T}(0);")
        open_, co, close = _window_loops(c, x.dims, la, lb, "i")
        lines += open_
        lines.append(f"  const {c.T} gi = {c.ld('g', co)};")
        lines.append("  sg += gi;" + (f" sgm += gi * {c.ld('means', co)};" if has_m else ""))
        lines += close
        lines.append(f"const {c.T} v = {c.ld('dy', c.c)} * {_pow(c, 'D', -beta)} - "
                     f"{c.lit(2.0 * cc * beta)} * ({c.ld('x', c.c)} * sg - sgm);")
        return lines

    k2 = stencil_kernel(StencilSpec("divnbwd2", _out(step, "dx", "v"), dict(ins, g=g_t), body2))
    return [KernelRun([k1], [g_t] + _temps(step)), KernelRun([k2], [])]
