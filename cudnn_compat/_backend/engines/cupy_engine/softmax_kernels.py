"""Softmax forward and backward (002 §3.2.96, §4.1.19) as row-in-registers kernels (pure Python:
the sources are generated without CuPy), with the semantics of reference/softmax.py.

Fast shape: the innermost memory axis is reduced and contiguous in every element tensor (the
instance mode of a packed or row-padded tensor; the channel mode of NHWC), and a row fits
the registers of at most ``MAX_LANES`` threads (``UPT`` units of ``V`` elements each, 16-byte
loads).  ``LN`` lanes (a power of two) share a row: a sub-warp, a warp, or several warps
meeting in shared memory.  One read of x: the row stays in registers between the max, the
sum of exp(x - max) (one exp per element, kept for the output) and the scaled store through
the element epilogue (the alpha/beta blend).  Lane merges are xor butterflies: a fixed order,
deterministic.  Other shapes run through ``rowwise``'s generic row kernels.
"""
from __future__ import annotations

import math

from .codegen import (BLOCK, INT32_LIMIT, ITEMSIZE, PREAMBLE, STORAGE, KernelSpec, collapse, decompose, emit_chain,
                      load_expr, max_offset, name_kernel, offset_expr, order_axes, round_expr, store_expr,
                      tensors_compute_type)

UPT = 8  # vector units per thread at most (the row share kept in registers)
MAX_LANES = 1024  # threads of one row at most (a row longer than MAX_LANES*UPT*V: generic kernels)

EMU = r"""
#ifdef CC_EMU
static double cc_emu_x[1024];
template <typename Q> static inline Q __shfl_xor_sync(unsigned int, Q v, int m) {
  const unsigned int t = threadIdx.x; cc_emu_x[t] = (double)v; __syncthreads();
  const Q r = (Q)cc_emu_x[t ^ (unsigned int)m]; __syncthreads(); return r; }
#endif
"""


def softmax_kernels(op, epilogue, out_role: str) -> "list | None":
    """Kernel variants (16-byte vector first, then scalar) for a Softmax / SoftmaxBackward op whose
    output ``out_role`` goes through ``epilogue`` (a FusedGroup or None); None: not a fast shape."""
    out = []
    for vector in (True, False):
        k = _kernel(op, epilogue, out_role, vector)
        if k is not None:
            out.append(k)
    if not out or out[-1].aligned:
        return None
    return out


def _kernel(op, epilogue, out_role, vector):
    X = tuple(op.inputs["x" if op.kind == "Softmax" else "y"].dims)
    axes = tuple(op.attrs["axes"])
    reduced = [a for a in axes if X[a] != 1]
    kept = [a for a in range(len(X)) if X[a] != 1 and a not in reduced]
    if not reduced:
        return None
    algo = op.attrs["algorithm"]
    elem = {"x": op.inputs["x"]} if op.kind == "Softmax" else {"y": op.inputs["y"], "dy": op.inputs["dy"]}
    o = op.outputs[out_role]
    loads = {t.uid: t for t in elem.values()}
    stores = {}
    if epilogue is None:
        stores[o.uid] = o
    else:
        for uid, t in epilogue.loads.items():
            loads.setdefault(uid, t)
        stores.update(epilogue.stores)
    for uid in stores:
        loads.pop(uid, None)
    mem = list(loads.values()) + list(stores.values())
    if any(tuple(t.dims) != X for t in mem):
        return None
    T = tensors_compute_type(mem)
    lead = next(iter(elem.values())).strides
    cand = kept + reduced
    inner = min(cand, key=lambda a: (lead[a], a))
    if inner not in reduced or lead[inner] != 1:
        return None
    strides = [tuple(t.strides) for t in mem]
    ksizes, kstr = collapse(order_axes(kept, lead), X, strides)
    rsizes, rstr = collapse(order_axes(reduced, lead), X, strides)
    if not ksizes:
        ksizes, kstr = [1], [[0] for _ in mem]
    if any(s[-1] != 1 for s in rstr):
        return None
    M, K = math.prod(ksizes), math.prod(rsizes)
    isz = max(ITEMSIZE[t.dtype] for t in mem)
    V = 1
    if vector:
        others = [x for s in rstr for x in s[:-1]] + [x for s in kstr for x in s]
        for vb in (16, 8, 4):
            v = vb // isz
            if v >= 2 and rsizes[-1] % v == 0 and all(x % v == 0 for x in others):
                V = v
                break
        if V == 1:
            return None
    KV = K // V
    LN = 1
    while LN * UPT < KV:
        LN *= 2
    if LN > MAX_LANES:
        return None
    NB = max(BLOCK, LN)  # threads per block
    U = -(-KV // LN)
    RPB = NB // LN
    big = max([M * K] + [max_offset(t.dims, t.strides) + 1 for t in mem]) > INT32_LIMIT
    IDX = "unsigned long long" if big else "unsigned int"
    keys, key_of = {}, {}
    for t, ks, rs in zip(mem, kstr, rstr):
        key_of[t.uid] = keys.setdefault((tuple(ks), tuple(rs)), len(keys))

    params = [f"const {STORAGE[t.dtype]}* p{u}" for u, t in loads.items()]
    params += [f"{STORAGE[t.dtype]}* p{u}" for u, t in stores.items()]
    args = [("buf", u) for u in loads] + [("buf", u) for u in stores]
    scal = {}
    if epilogue is not None:
        scal = {u: t for u, t in sorted(epilogue.tensors().items()) if t.is_by_value}
    for u in scal:
        params.append(f"const {T} s{u}")
        args.append(("scalar", u, T))

    def raw(t):
        return f"cc_v{t.uid}" if V > 1 else STORAGE[t.dtype]

    def val(t, j):
        ref = f"c{t.uid}[{j}].v[e]" if V > 1 else f"c{t.uid}[{j}]"
        return load_expr(t.dtype, ref, T)

    body = [PREAMBLE + EMU]
    if V > 1:
        for t in mem:
            body.append(f"struct __align__({V * ITEMSIZE[t.dtype]}) cc_v{t.uid} {{ {STORAGE[t.dtype]} v[{V}]; }};")
    body.append(f'extern "C" __global__ void __launch_bounds__({NB}) KNAME({", ".join(params)}) {{')
    B = []
    if LN > 32:
        B.append(f"__shared__ {T} shw[{NB // 32}];")
    B.append("const unsigned int tid = threadIdx.x;")
    B.append(f"const unsigned int lane = tid % {LN}u;")
    B.append(f"const {IDX} row = ({IDX})blockIdx.x * ({IDX}){RPB} + ({IDX})(tid / {LN}u);")
    B.append(f"const bool live = row < ({IDX}){M};")
    B.append(f"const {IDX} rr = live ? row : ({IDX})0;")
    dl, mc = decompose("rr", ksizes, "k", IDX)
    B += dl
    for (ks, rs), k in keys.items():
        B.append(f"const {IDX} ob{k} = {offset_expr(mc, ks, IDX)};")
    B += [f"{IDX} oe{k}[{U}];" for k in keys.values()]
    B.append(f"bool ok[{U}];")
    B += [f"{raw(t)} c{t.uid}[{U}];" for t in loads.values()]
    B.append("#pragma unroll")
    B.append(f"for (int j = 0; j < {U}; ++j) {{")
    B.append(f"  const {IDX} u = ({IDX})lane + ({IDX})j * ({IDX}){LN};")
    B.append(f"  ok[j] = live && u < ({IDX}){KV};")
    B.append("  if (ok[j]) {")
    B.append(f"    const {IDX} lv = u % ({IDX}){rsizes[-1] // V};")
    B.append(f"    const {IDX} ou = u / ({IDX}){rsizes[-1] // V};")
    dl, oc = decompose("ou", rsizes[:-1] or [1], "r", IDX)
    B += ["    " + x for x in dl]
    for (ks, rs), k in keys.items():
        outer = offset_expr(oc, rs[:-1], IDX) if len(rs) > 1 else f"({IDX})0"
        B.append(f"    oe{k}[j] = ob{k} + {outer} + lv * ({IDX}){V};")
    for t in loads.values():
        off = f"oe{key_of[t.uid]}[j]"
        if V > 1:
            B.append(f"    c{t.uid}[j] = *reinterpret_cast<const cc_v{t.uid}*>(p{t.uid} + {off});")
        else:
            B.append(f"    c{t.uid}[j] = p{t.uid}[{off}];")
    B.append("  }")
    B.append("}")

    def lanes_reduce(var, how):
        """Merge ``var`` over the row's LN lanes (xor butterfly, then shared memory across warps)."""
        comb = {"sum": f"{var} = {var} + o;", "max": f"{var} = (o > {var}) ? o : {var};"}[how]
        out = []
        w = min(LN, 32)
        if w > 1:
            out += ["#pragma unroll", f"for (int m = 1; m < {w}; m <<= 1) {{",
                    f"  const {T} o = __shfl_xor_sync(0xffffffffu, {var}, m);", f"  {comb}", "}"]
        if LN > 32:
            nw = LN // 32
            out += ["__syncthreads();", f"if (tid % 32u == 0u) shw[tid / 32u] = {var};", "__syncthreads();",
                    "{", f"  const unsigned int w0 = (tid / {LN}u) * {nw}u;", f"  {var} = shw[w0];",
                    f"  for (unsigned int q = 1u; q < {nw}u; ++q) {{", f"    const {T} o = shw[w0 + q];",
                    f"    {comb}", "  }", "}"]
        return out

    if op.kind == "Softmax":
        x = elem["x"]
        if algo != "FAST":
            B.append(f"{T} mx = -{'CC_INF_F' if T == 'float' else 'CC_INF_D'};")
            B += ["#pragma unroll", f"for (int j = 0; j < {U}; ++j) {{", "  if (ok[j]) {", "    #pragma unroll",
                  f"    for (int e = 0; e < {V}; ++e) {{ const {T} v = {val(x, 'j')}; mx = (v > mx) ? v : mx; }}",
                  "  }", "}"]
            B += lanes_reduce("mx", "max")
            shift = " - mx"
        else:
            shift = ""
        keep = algo != "LOG"
        if keep:
            B.append(f"{T} ex[{U}][{V}];")
        B.append(f"{T} s = {T}(0);")
        B += ["#pragma unroll", f"for (int j = 0; j < {U}; ++j) {{", "  #pragma unroll", f"  for (int e = 0; e < {V}; ++e) {{",
              f"    const {T} q = ok[j] ? exp({val(x, 'j')}{shift}) : {T}(0);"]
        if keep:
            B.append("    ex[j][e] = q;")
        B += ["    s += q;", "  }", "}"]
        B += lanes_reduce("s", "sum")
        if algo == "LOG":
            B.append(f"const {T} ls = log(s);")
            value = f"({val(x, 'j')}{shift}) - ls"
        else:
            B.append(f"const {T} rs = {T}(1) / s;")
            value = "ex[j][e] * rs"
    else:
        y, dy = elem["y"], elem["dy"]
        B.append(f"{T} s = {T}(0);")
        term = val(dy, "j") if algo == "LOG" else f"{val(dy, 'j')} * {val(y, 'j')}"
        B += ["#pragma unroll", f"for (int j = 0; j < {U}; ++j) {{", "  if (ok[j]) {", "    #pragma unroll",
              f"    for (int e = 0; e < {V}; ++e) s += {term};", "  }", "}"]
        B += lanes_reduce("s", "sum")
        if algo == "LOG":
            value = f"{val(dy, 'j')} - exp({val(y, 'j')}) * s"
        else:
            value = f"{val(y, 'j')} * ({val(dy, 'j')} - s)"
    # the output through its epilogue
    B += ["#pragma unroll", f"for (int j = 0; j < {U}; ++j) {{", "  if (ok[j]) {"]
    for t in stores.values():
        B.append(f"    {raw(t)} w{t.uid};")
    B += ["    #pragma unroll", f"    for (int e = 0; e < {V}; ++e) {{", f"      const {T} v = {value};"]
    if epilogue is None:
        vals = {o.uid: "v"}
    else:
        env = {u: f"s{u}" for u in scal}
        v = "v"
        if o.is_virtual:
            r = round_expr(o.dtype, "v", T)
            if r != "v":
                B.append(f"      const {T} vr = {r};")
                v = "vr"
        env[o.uid] = v
        for uid, t in epilogue.loads.items():
            env[uid] = val(t, "j")
        B += ["      " + x for x in emit_chain(epilogue.prologue, env, T)]
        vals = {u: env[u] for u in stores}
    for t in stores.values():
        tgt = f"w{t.uid}.v[e]" if V > 1 else f"w{t.uid}"
        B.append(f"      {tgt} = {store_expr(t.dtype, vals[t.uid], T)};")
    B.append("    }")
    for t in stores.values():
        off = f"oe{key_of[t.uid]}[j]"
        if V > 1:
            B.append(f"    *reinterpret_cast<cc_v{t.uid}*>(p{t.uid} + {off}) = w{t.uid};")
        else:
            B.append(f"    p{t.uid}[{off}] = w{t.uid};")
    B += ["  }", "}"]
    body += ["  " + x for x in B]
    body.append("}")
    fam = "softmax" if op.kind == "Softmax" else "softmaxbwd"
    name, src = name_kernel(fam, "\n".join(body) + "\n")
    aligned = tuple(t.uid for t in mem) if V > 1 else ()
    return KernelSpec(name, src, args, params, (max(1, -(-M // RPB)), 1, 1), (NB, 1, 1), 0, aligned, fam)
