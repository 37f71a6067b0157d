"""The spatial-transformer bilinear sampler on the GPU: generated kernels for
``SpatialTfSamplerForward`` / ``SpatialTfSamplerBackward`` with the reference engine's semantics
(reference/adv.py, cudnn_compat/_backend/ops/ctc_sampler.py; 002 §3.2.98, §4.1.21).

u = (grid_x + 1) (Wi - 1) / 2, v = (grid_y + 1) (Hi - 1) / 2; the four integer neighbours of
(v, u) weigh (1 - |v - iv|) (1 - |u - iu|); a neighbour outside the image, or any neighbour of a
non-finite coordinate, contributes 0.

Forward (``stfwd``, a ``stencil`` kernel): one thread per output point (n, h, w) computes the
corners and weights once, then walks the channels, y[n, c, h, w] = sum of the 4 weighted
neighbours, the output blend (alpha/beta, the storage type) applied as the epilogue.
Backward: ``stbwd``, one thread per (n, h, w) walking the channels, scatters w * dy into a
packed accumulator of dx with atomicAdd (fp32; fp64 for double data) and sums d/du, d/dv of
sum(dy * y) in registers, dgrid stored through its epilogue; ``stbwdx``, one thread per dx
element, applies dx's epilogue to the accumulator and zeroes it for the next call (the
accumulator is scratch kept per stream, zeroed once).  Every float type (the compute type is
float, double for double data), any strides.
"""
from __future__ import annotations

import math

from ...ir import packed_strides
from .codegen import (BLOCK, INT32_LIMIT, PREAMBLE, STORAGE, KernelSpec, bstrides, decompose, lit, load_expr,
                      max_offset, name_kernel, offset_expr, order_axes, store_expr, tensors_compute_type)
from .rowwise import RowOut, epilogue_code, load_into
from .stencil import StencilSpec, stencil_kernel
from .steps import KernelRun, ScratchRun

KINDS = ("SpatialTfSamplerForward", "SpatialTfSamplerBackward")
# output roles whose following element-wise ops (the legacy blend) the kernels apply themselves
EPILOGUE_ROLES = {"SpatialTfSamplerForward": ("y",), "SpatialTfSamplerBackward": ("dx", "dgrid")}
FLOATS = ("float16", "bfloat16", "float32", "float64")

_ATOMIC = r"""
#ifdef CC_EMU
template <typename A> static inline void cc_atomic_add(A* p, A v) { *p += v; }
#else
template <typename A> static __device__ __forceinline__ void cc_atomic_add(A* p, A v) { atomicAdd(p, v); }
#endif
"""


def supports(op) -> "str | None":
    for role, t in list(op.inputs.items()) + list(op.outputs.items()):
        if t.dtype not in FLOATS:
            return f"{op.kind}: {role} data type {t.dtype} is not supported (float types only)"
    return None


def build(step) -> list:
    return (_forward if step.op.kind == "SpatialTfSamplerForward" else _backward)(step)


def _out(step, role, value):
    op = step.op
    return RowOut(op.outputs[role], value, step.epilogues.get(role)) if role in op.outputs else None


def _temps(step):
    return [t for r, t in step.op.outputs.items() if t.is_virtual and r not in step.epilogues]


def _corners(ld, x_dims, T, IDX) -> list:
    """Lines computing, from the grid point's (gx, gy) loaded with ``ld(k)``, the corner indices
    iv0, iv1, iu0, iu1, their inside flags k00..k11, weights w00..w11 and fractions fu, fv."""
    hi, wi = x_dims[2], x_dims[3]
    L = lambda v: lit(v, T)  # noqa: E731
    return [f"{T} u = ({ld(0)} + {T}(1)) * {L((wi - 1) / 2.0)};",
            f"{T} v = ({ld(1)} + {T}(1)) * {L((hi - 1) / 2.0)};",
            f"if (!(u - u == {T}(0)) || !(v - v == {T}(0))) {{ u = {T}(-10); v = {T}(-10); }}",
            f"const {T} u0 = floor(u), v0 = floor(v);",
            f"const {T} fu = u - u0, fv = v - v0;",
            f"const bool ku0 = u0 >= {T}(0) && u0 <= {L(wi - 1)}, ku1 = u0 + {T}(1) >= {T}(0) && u0 + {T}(1) <= {L(wi - 1)};",
            f"const bool kv0 = v0 >= {T}(0) && v0 <= {L(hi - 1)}, kv1 = v0 + {T}(1) >= {T}(0) && v0 + {T}(1) <= {L(hi - 1)};",
            f"const {IDX} iu0 = ku0 ? ({IDX})u0 : 0, iu1 = ku1 ? ({IDX})u0 + 1 : 0;",
            f"const {IDX} iv0 = kv0 ? ({IDX})v0 : 0, iv1 = kv1 ? ({IDX})v0 + 1 : 0;",
            "const bool k00 = kv0 && ku0, k01 = kv0 && ku1, k10 = kv1 && ku0, k11 = kv1 && ku1;",
            f"const {T} w00 = ({T}(1) - fu) * ({T}(1) - fv), w01 = fu * ({T}(1) - fv), w10 = ({T}(1) - fu) * fv, w11 = fu * fv;"]


# -- forward ----------------------------------------------------------------------------------

def _forward(step) -> list:
    op = step.op
    x, grid = op.inputs["x"], op.inputs["grid"]

    def prologue(c):
        return _corners(lambda k: c.ld("grid", ["c0", "c2", "c3", str(k)]), x.dims, c.T, c.IDX)

    def body(c):
        T = c.T
        lines = [f"{T} acc = {T}(0);"]
        for k, iv, iu in (("00", "iv0", "iu0"), ("01", "iv0", "iu1"), ("10", "iv1", "iu0"), ("11", "iv1", "iu1")):
            lines.append(f"if (k{k}) acc += w{k} * {c.ld('x', ['c0', 'c1', iv, iu])};")
        lines.append(f"const {T} v = acc;")
        return lines

    k = stencil_kernel(StencilSpec("stfwd", _out(step, "y", "v"), {"x": x, "grid": grid}, body, loop_axis=1,
                                   prologue=prologue))
    return [KernelRun([k], _temps(step))]


# -- backward ---------------------------------------------------------------------------------

def _store(o: RowOut, coords, T, IDX) -> list:
    """Store ``o.value`` at ``coords`` (its epilogue applied), in a block of its own."""
    def off(t):
        return offset_expr(coords, bstrides(t, o.tensor.dims), IDX)
    if o.epilogue is None:
        t = o.tensor
        return [f"p{t.uid}[{off(t)}] = {store_expr(t.dtype, o.value, T)};"]
    pre, body, env = epilogue_code(o, T, load_into(T, lambda uid, t: f"p{uid}[{off(t)}]"))
    lines = ["{"] + ["  " + x for x in pre + body]
    for uid, t in o.epilogue.stores.items():
        lines.append(f"  p{uid}[{off(t)}] = {store_expr(t.dtype, env[uid], T)};")
    return lines + ["}"]


def _mem(outs):
    """(loads, stores, by-value scalars) of the outputs' epilogues (or the outputs themselves)."""
    loads, stores, scal = {}, {}, {}
    for o in outs:
        if o.epilogue is None:
            stores[o.tensor.uid] = o.tensor
        else:
            loads.update(o.epilogue.loads)
            stores.update(o.epilogue.stores)
            scal.update({u: t for u, t in o.epilogue.tensors().items() if t.is_by_value})
    for u in stores:
        loads.pop(u, None)
    return loads, stores, scal


def _backward(step) -> list:
    op = step.op
    x, grid, dy = op.inputs["x"], op.inputs["grid"], op.inputs["dy"]
    o_dx, o_dg = _out(step, "dx", "v"), _out(step, "dgrid", None)
    N, C, Hi, Wi = x.dims
    H, W = grid.dims[1], grid.dims[2]
    loads, stores, scal = _mem([o for o in (o_dx, o_dg) if o is not None])
    mem = [x, grid, dy] + list(loads.values()) + list(stores.values())
    T = tensors_compute_type(mem)
    A = "double" if T == "double" else "float"
    acc_n = math.prod(x.dims)
    big = max([acc_n, N * H * W * C] + [max_offset(t.dims, t.strides) + 1 for t in mem]) > INT32_LIMIT
    IDX = "long long" if big else "int"
    acc_st = packed_strides(x.dims)
    specs = []

    # kernel 1: scatter into the accumulator, dgrid
    ins = {x.uid: x, grid.uid: grid, dy.uid: dy}
    dg_loads, dg_stores, dg_scal = _mem([o_dg]) if o_dg is not None else ({}, {}, {})
    k_loads = dict(ins)
    for u, t in dg_loads.items():
        k_loads.setdefault(u, t)
    for u in dg_stores:
        k_loads.pop(u, None)
    params = [f"const {STORAGE[t.dtype]}* p{u}" for u, t in k_loads.items()]
    params += [f"{STORAGE[t.dtype]}* p{u}" for u, t in dg_stores.items()]
    args = [("buf", u) for u in k_loads] + [("buf", u) for u in dg_stores]
    for u in sorted(dg_scal):
        params.append(f"const {T} s{u}")
        args.append(("scalar", u, T))
    if o_dx is not None:
        params.append(f"{A}* acc")
        args.append(("extra", "acc", "ptr"))
    npts = N * H * W
    order = order_axes([0, 1, 2], tuple(dy.strides[i] for i in (0, 2, 3)))  # (n, h, w) in dy's memory order
    sizes = [(N, H, W)[a] for a in order]

    def ld(t, coords):
        return load_expr(t.dtype, f"p{t.uid}[{offset_expr(coords, t.strides, IDX)}]", T)

    B = [PREAMBLE, _ATOMIC, f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params)}) {{',
         f"  const {IDX} i = ({IDX})blockIdx.x * ({IDX}){BLOCK} + ({IDX})threadIdx.x;",
         f"  if (i >= ({IDX}){npts}) return;"]
    dl, oc = decompose("i", sizes, "q", IDX)
    B += ["  " + s for s in dl]
    cmap = dict(zip(order, oc))
    B += [f"  const {IDX} c0 = {cmap[0]};", f"  const {IDX} c2 = {cmap[1]};", f"  const {IDX} c3 = {cmap[2]};"]
    B += ["  " + s for s in _corners(lambda k: ld(grid, ["c0", "c2", "c3", str(k)]), x.dims, T, IDX)]
    B += [f"  {T} du = {T}(0), dv = {T}(0);",
          f"  for ({IDX} c1 = 0; c1 < {C}; ++c1) {{",
          f"    const {T} g = {ld(dy, ['c0', 'c1', 'c2', 'c3'])};"]
    for k, iv, iu in (("00", "iv0", "iu0"), ("01", "iv0", "iu1"), ("10", "iv1", "iu0"), ("11", "iv1", "iu1")):
        B.append(f"    const {T} x{k} = k{k} ? {ld(x, ['c0', 'c1', iv, iu])} : {T}(0);")
        if o_dx is not None:
            B.append(f"    if (k{k}) cc_atomic_add<{A}>(acc + {offset_expr(['c0', 'c1', iv, iu], acc_st, IDX)}, ({A})(w{k} * g));")
    B += [f"    du += g * ((x01 - x00) * ({T}(1) - fv) + (x11 - x10) * fv);",
          f"    dv += g * ((x10 - x00) * ({T}(1) - fu) + (x11 - x01) * fu);",
          "  }"]
    if o_dg is not None:
        for k, val in ((0, f"du * {lit((Wi - 1) / 2.0, T)}"), (1, f"dv * {lit((Hi - 1) / 2.0, T)}")):
            o = RowOut(o_dg.tensor, f"dg{k}", o_dg.epilogue)
            B.append(f"  {{ const {T} dg{k} = {val};")
            B += ["    " + s for s in _store(o, ["c0", "c2", "c3", str(k)], T, IDX)]
            B.append("  }")
    B.append("}")
    name, src = name_kernel("stbwd", "\n".join(B) + "\n")
    k1 = KernelSpec(name, src, args, params, (max(1, -(-npts // BLOCK)), 1, 1), (BLOCK, 1, 1), 0, (), "stbwd")
    specs.append(k1)

    # kernel 2: dx = epilogue(accumulator); the accumulator back to 0
    if o_dx is not None:
        l2, s2, sc2 = _mem([o_dx])
        params = [f"const {STORAGE[t.dtype]}* p{u}" for u, t in l2.items()]
        params += [f"{STORAGE[t.dtype]}* p{u}" for u, t in s2.items()]
        args = [("buf", u) for u in l2] + [("buf", u) for u in s2]
        for u in sorted(sc2):
            params.append(f"const {T} s{u}")
            args.append(("scalar", u, T))
        params.append(f"{A}* acc")
        args.append(("extra", "acc", "ptr"))
        lead = bstrides(next(iter(s2.values())), x.dims)
        order = order_axes(range(4), lead)
        B = [PREAMBLE, f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params)}) {{',
             f"  const {IDX} i = ({IDX})blockIdx.x * ({IDX}){BLOCK} + ({IDX})threadIdx.x;",
             f"  if (i >= ({IDX}){acc_n}) return;"]
        dl, oc = decompose("i", [x.dims[a] for a in order], "q", IDX)
        B += ["  " + s for s in dl]
        cmap = dict(zip(order, oc))
        coords = [f"c{a}" for a in range(4)]
        B += [f"  const {IDX} c{a} = {cmap[a]};" for a in range(4)]
        aoff = offset_expr(coords, acc_st, IDX)
        B += [f"  const {T} v = ({T})acc[{aoff}];", f"  acc[{aoff}] = ({A})0;"]
        B += ["  " + s for s in _store(o_dx, coords, T, IDX)]
        B.append("}")
        name, src = name_kernel("stbwdx", "\n".join(B) + "\n")
        specs.append(KernelSpec(name, src, args, params, (max(1, -(-acc_n // BLOCK)), 1, 1), (BLOCK, 1, 1), 0, (),
                                "stbwdx"))
    wdt = "float64" if A == "double" else "float32"
    guard = (x.uid, grid.uid, dy.uid)
    return [ScratchRun(specs, {"acc": (acc_n if o_dx is not None else 1, wdt)}, _temps(step), guard,
                       tuple(dg_stores))]
