"""Batch-normalization training kernels at memory speed (pure Python: the sources are generated
without CuPy): NormForward TRAINING and NormBackward (002 §4.1.4, §4.1.2) as a statistics pass
and a map pass over a "channel" index space, with the semantics of the row specs of
``rowops`` (reference/norm.py).

The element space splits into kept axes (the channels: C for spatial mode, C,H,W per
activation) and reduced axes.  Two shapes are fast, chosen from x's memory order:

  * inner-reduced (NCHW spatial): the innermost memory axis is reduced.  A channel is one or
    more blocks (``S`` splits); a block walks tiles of ``BLOCK`` units of ``V`` contiguous
    elements (16-byte loads).
  * inner-kept (NHWC, and per-activation in any layout): the innermost memory axis is kept.
    A block is ``TX`` vector columns (``TX*V`` channels) x ``TY`` rows; ``G`` blocks share a
    column group, each walking every G-th tile of TY rows.

Pass 1 (``stats``) sums the spec's state (sum of d and d^2, d = x - x0 with x0 the channel's
first element: no cancellation when |mean| >> std; backward also dy and dy*d) per thread in
the compute type, merges the block's threads by a fixed tree in shared memory and writes one
partial per block.  The last block of a channel group to finish (an atomic ticket; the
counter resets itself) merges the partials in a fixed order -- the result does not depend on
which block came last -- runs ``finalize`` once per channel (saved mean/inverse variance,
running averages, dscale/dbias through their blend epilogues) and writes the per-channel
coefficients the map needs.  Pass 2 (``apply``) reads x (and dy) again, in the reverse tile
order of pass 1, so its first reads hit what pass 1 left in L2, and writes y (dx) through
the element epilogue (alpha/beta blend, BN Ex add/activation).  When one block per channel
group fills the GPU, or (inner-kept) a block walks its group in ``FULL_TILES`` tiles or fewer (the
layers of a batch of 1), there are no partials: one kernel does both passes (``full``).

Traffic: forward reads x twice and writes y (3 tensor sizes), backward reads x and dy twice
and writes dx (5); the partials and coefficients are a few hundred KB at most.
"""
from __future__ import annotations

import math

from .codegen import (BLOCK, EMU_TICKETS, INT32_LIMIT, ITEMSIZE, PREAMBLE, STORAGE, KernelSpec, bstrides, collapse, decompose,
                      lit, load_expr, max_offset, name_kernel, offset_expr, order_axes,
                      store_expr, tensors_compute_type)
from .rowwise import RowOut, RowSpec, _typed, epilogue_code, load_into

# Tuning knobs (module level so benchmarks can sweep them; a plan keeps what it was built with).
TARGET_BLOCKS = 264  # 2 blocks of 256 threads per SM of an H100 (132 SMs): one wave (run 1 sweep)
MIN_BLOCKS = 132  # fewer blocks than this leave the memory system under-used
COMBINE_LOADS = 32  # partial loads per thread the last block may need (its merge is a serial tail)
UNROLL = 4  # tiles whose loads a thread issues before using any
FULL_TILES = UNROLL  # inner-kept: one kernel (no partials) when a block's pass is this many tiles at most
MIN_K = 256  # inner-reduced with fewer elements per channel: the generic row kernels pack channels better



class Layout:
    """The analysis of a spec: pattern, collapsed sizes and strides, vector width, geometry."""


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def analyze(spec: RowSpec, coefs, vector: bool = True) -> "Layout | None":
    """The fast layout of ``spec`` or None (then the generic row kernels run it)."""
    X = tuple(spec.dims)
    reduced = [a for a in spec.axes if X[a] != 1]
    kept = [a for a in range(len(X)) if X[a] != 1 and a not in reduced]
    if not reduced or spec.elem_out is None:
        return None
    o = spec.elem_out
    e_loads = {t.uid: t for t in spec.elem.values()}
    e_stores = {}
    if o.epilogue is None:
        e_stores[o.tensor.uid] = o.tensor
    else:
        for uid, t in o.epilogue.loads.items():
            e_loads.setdefault(uid, t)
        e_stores.update(o.epilogue.stores)
    for uid in e_stores:
        e_loads.pop(uid, None)
    r_loads = {t.uid: t for t in spec.row.values()}
    r_stores = {}
    for ro in spec.row_outs:
        if ro.epilogue is None:
            r_stores[ro.tensor.uid] = ro.tensor
        else:
            for uid, t in ro.epilogue.loads.items():
                r_loads.setdefault(uid, t)
            r_stores.update(ro.epilogue.stores)
    for uid in r_stores:
        r_loads.pop(uid, None)
    elem = list(e_loads.values()) + list(e_stores.values())
    rows = list(r_loads.values()) + list(r_stores.values())
    if any(tuple(t.dims) != X for t in elem):
        return None
    for t in rows:
        if len(t.dims) != len(X) or any(t.dims[a] != 1 for a in reduced):
            return None
    if set(e_loads) & set(r_loads) or set(e_stores) & set(r_stores):
        return None
    T = tensors_compute_type(elem + rows + [s for s in spec.scalars.values() if not isinstance(s, (int, float))])
    x = spec.elem[spec.leader or next(iter(spec.elem))]
    lead = x.strides
    kept_o, red_o = order_axes(kept, lead), order_axes(reduced, lead)
    estr = [tuple(t.strides) for t in elem]
    rstr_all = [bstrides(t, X) for t in rows]
    ksizes, kstr = collapse(kept_o, X, estr + rstr_all)
    rsizes, rstr = collapse(red_o, X, estr)
    if not ksizes:
        ksizes, kstr = [1], [[0] for _ in estr + rstr_all]
    inner_axis = min(kept + reduced, key=lambda a: (lead[a], a))
    if lead[inner_axis] != 1:
        return None
    L = Layout()
    L.spec, L.coefs, L.T = spec, tuple(coefs), T
    L.e_loads, L.e_stores, L.r_loads, L.r_stores = e_loads, e_stores, r_loads, r_stores
    L.elem, L.rows = elem, rows
    L.ksizes, L.rsizes = ksizes, rsizes
    L.kst = {t.uid: kstr[i] for i, t in enumerate(elem + rows)}
    L.rst = {t.uid: rstr[i] for i, t in enumerate(elem)}
    L.M, L.K = math.prod(ksizes), math.prod(rsizes)
    big = max([L.M * L.K] + [max_offset(t.dims, t.strides) + 1 for t in elem + rows]) > INT32_LIMIT
    L.IDX = "unsigned long long" if big else "unsigned int"
    L.SIDX = "long long" if big else "int"
    L.inner = "reduced" if inner_axis in reduced else "kept"
    isz = max(ITEMSIZE[t.dtype] for t in elem)
    if L.inner == "reduced":
        if any(L.rst[t.uid][-1] != 1 for t in elem) or L.K < MIN_K:
            return None
        n_in = rsizes[-1]
        others = [s for t in elem for s in list(L.rst[t.uid][:-1]) + list(L.kst[t.uid])]
    else:
        if any(L.kst[t.uid][-1] != 1 for t in elem):
            return None
        n_in = ksizes[-1]
        others = [s for t in elem for s in list(L.kst[t.uid][:-1]) + list(L.rst[t.uid])]
    V = 1
    if vector:
        for vb in (16, 8, 4):
            v = vb // isz
            if v >= 2 and n_in % v == 0 and all(s % v == 0 for s in others):
                V = v
                break
        if V == 1:
            return None
    L.V = V
    L.nstate = len(spec.state)
    if L.inner == "reduced":
        L.LV = rsizes[-1] // V  # vector units along the inner axis
        L.NU = L.K // V
        L.NT = -(-L.NU // BLOCK)
        L.S = max(1, min(-(-TARGET_BLOCKS // L.M), L.NT))
        L.G, L.TX, L.TY, L.W = L.S, 1, BLOCK, 1
        L.grid = (L.M, L.S, 1)
        L.ngroups = L.M
    else:
        L.Cin = ksizes[-1]
        L.MO = L.M // L.Cin
        L.NC = L.Cin // V
        best = _full_geometry(L) or _split_geometry(L)
        L.TX, L.TY, L.NT, L.CGI, L.CG, L.G, L.W = best
        L.grid = (L.CG, L.G, 1)
        L.ngroups = L.CG
    L.split = L.G > 1
    L.P = max(1, BLOCK // L.W)
    return L


def _widths(L):
    """Inner-kept block shapes, widest first: (tx, ty, nt, cgi, cg, w) for tx = 32 (or the channel
    vectors' power of two, if fewer), 16, ..., 1 vector columns of ty = BLOCK / tx rows; nt tiles
    of ty rows cover K, cgi blocks cover the columns of one outer group, cg = MO * cgi, w channels."""
    tx = min(32, _pow2_at_least(L.NC))
    while tx >= 1:
        ty = BLOCK // tx
        cgi = -(-L.NC // tx)
        yield tx, ty, -(-L.K // ty), cgi, L.MO * cgi, tx * L.V
        tx //= 2


def _full_geometry(L) -> "tuple | None":
    """Inner-kept: the one-kernel geometry (tx, ty, nt, cgi, cg, 1, w) whose block walks its channel
    group in the fewest tiles, when that is ``FULL_TILES`` or fewer (each thread's share of a pass is
    one unrolled group of loads), else None.  Small problems (batch 1's layers) then take one launch,
    not a stats/apply pair: the second kernel and its launch cost more than the longer walk.  Ties go
    to the wider block (more contiguous bytes per row)."""
    best = None
    for tx, ty, nt, cgi, cg, w in _widths(L):
        if nt <= FULL_TILES and (best is None or nt < best[2]):
            best = (tx, ty, nt, cgi, cg, 1, w)
    return best


def _split_geometry(L) -> tuple:
    """Inner-kept: the geometry (tx, ty, nt, cgi, cg, g, w) whose g blocks per channel group (at most
    the tiles, the TARGET_BLOCKS share, and what the last block's merge may load) first give
    MIN_BLOCKS blocks in all or one tile each, widest block first; else the one with the most blocks."""
    best = None
    for tx, ty, nt, cgi, cg, w in _widths(L):
        p = max(1, BLOCK // w)
        g = max(1, min(-(-TARGET_BLOCKS // cg), nt, max(1, COMBINE_LOADS * p // L.nstate)))
        cand = (tx, ty, nt, cgi, cg, g, w)
        if cg * g >= MIN_BLOCKS or g == nt:
            return cand
        if best is None or cg * g > best[4] * best[5]:
            best = cand
    return best


def build_kernels(spec: RowSpec, coefs) -> "tuple | None":
    """(variants, scratch layout) for ``spec``: variants is a list of kernel lists (the 16-byte
    vector pair first when the layout allows it, then the scalar one); scratch is a dict of
    byte sizes (``cnt``: counters, ``ws``: coefficients + partials).  None: not a fast shape."""
    out = []
    lay = None
    for vector in (True, False):
        L = analyze(spec, coefs, vector)
        if L is None:
            continue
        out.append(_Gen(L).kernels())
        lay = lay or L
    if not out:
        return None
    # scratch big enough for every variant (the scalar one may split differently)
    sizes = [k[0].scratch for k in out]
    scratch = {"cnt": max(s["cnt"] for s in sizes), "ws": max(s["ws"] for s in sizes)}
    return out, scratch


class _Gen:
    def __init__(self, L: Layout):
        self.L = L
        self.spec = _typed(L.spec, L.T)
        self.T = L.T

    # -- small pieces ----------------------------------------------------------------------
    def params(self):
        L, T = self.L, self.T
        params, args = [], []
        for uid, t in list(L.e_loads.items()) + list(L.r_loads.items()):
            params.append(f"const {STORAGE[t.dtype]}* p{uid}")
            args.append(("buf", uid))
        for uid, t in list(L.e_stores.items()) + list(L.r_stores.items()):
            params.append(f"{STORAGE[t.dtype]}* p{uid}")
            args.append(("buf", uid))
        seen = set()
        for s in self.spec.scalars.values():
            if isinstance(s, (int, float)) or s.uid in seen:
                continue
            seen.add(s.uid)
            params.append(f"const {T} s{s.uid}")
            args.append(("scalar", s.uid, T))
        for o in self.spec.row_outs + [self.spec.elem_out]:
            if o.epilogue is not None:
                for uid, t in sorted(o.epilogue.tensors().items()):
                    if t.is_by_value and uid not in seen:
                        seen.add(uid)
                        params.append(f"const {T} s{uid}")
                        args.append(("scalar", uid, T))
        params += [f"{T}* ws", "unsigned int* cnt"]
        args += [("extra", "ws", "ptr"), ("extra", "cnt", "ptr")]
        return params, args

    def scalar_lines(self):
        out = []
        for name, s in self.spec.scalars.items():
            v = lit(s, self.T) if isinstance(s, (int, float)) else f"s{s.uid}"
            out.append(f"const {self.T} sc_{name} = {v};")
        return out

    def vec_types(self):
        L = self.L
        if L.V == 1:
            return []
        out = []
        for t in L.elem:
            out.append(f"struct __align__({L.V * ITEMSIZE[t.dtype]}) cc_v{t.uid} {{ {STORAGE[t.dtype]} v[{L.V}]; }};")
        return out

    def chan_offsets(self, var: str, uids, prefix: str) -> list:
        """Offsets ``{prefix}<uid>`` of channel (flat kept index) ``var`` for ``uids``."""
        L = self.L
        dl, mc = decompose(var, L.ksizes, f"{prefix}k", L.IDX)
        lines = list(dl)
        for u in uids:
            lines.append(f"const {L.IDX} {prefix}{u} = {offset_expr(mc, L.kst[u], L.IDX)};")
        return lines

    def elem_keys(self):
        """Distinct element stride vectors: key index per uid (tensors with equal strides share
        their offset arithmetic)."""
        L = self.L
        keys, of = {}, {}
        for t in L.elem:
            k = (tuple(L.kst[t.uid]), tuple(L.rst[t.uid]))
            of[t.uid] = keys.setdefault(k, len(keys))
        return keys, of

    # -- kernels ---------------------------------------------------------------------------
    def kernels(self):
        L = self.L
        nT = 8 if self.T == "double" else 4
        ncoef = len(L.coefs)
        ws_elems = ncoef * L.M + (L.nstate * L.G * L.M if L.split else 0)
        scratch = {"cnt": (L.ngroups * 4 if L.split else 0), "ws": ws_elems * nT}
        if L.split:
            ks = [self.kernel("stats"), self.kernel("apply")]
        else:
            ks = [self.kernel("full")]
        for k in ks:
            k.scratch = scratch
            k.layout = L
        return ks

    def kernel(self, kind):
        L = self.L
        params, args = self.params()
        body = [PREAMBLE + EMU_TICKETS]
        body += self.vec_types()
        body.append(f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params)}) {{')
        body += ["  " + x for x in self.head()]
        if kind in ("full", "stats"):
            body += ["  " + x for x in self.stats(kind)]
        if kind in ("full", "apply"):
            body += ["  " + x for x in self.apply(kind)]
        body.append("}")
        fam = self.spec.family
        name, src = name_kernel(fam if kind == "full" else f"{fam}_{kind[0]}", "\n".join(body) + "\n")
        k = KernelSpec(name, src, args, params, L.grid, (BLOCK, 1, 1), 0,
                       tuple(t.uid for t in L.elem) if L.V > 1 else (), fam)
        return k

    def head(self):
        L, IDX = self.L, self.L.IDX
        lines = ["const unsigned int tid = threadIdx.x;"]
        keys, of = self.elem_keys()
        self.key_of = of
        if L.inner == "reduced":
            lines.append(f"const {IDX} m = ({IDX})blockIdx.x;")
            lines.append("const unsigned int g = blockIdx.y;")
            dl, mc = decompose("m", L.ksizes, "bk", IDX)
            lines += dl
            for (ks, rs), k in keys.items():
                lines.append(f"const {IDX} ob{k} = {offset_expr(mc, ks, IDX)};")
        else:
            lines.append(f"const unsigned int tx = tid % {L.TX}u, ty = tid / {L.TX}u;")
            lines.append("const unsigned int cg = blockIdx.x, g = blockIdx.y;")
            lines.append(f"const {IDX} mo = ({IDX})(cg / {L.CGI}u);")
            lines.append(f"const {IDX} vc = ({IDX})(cg % {L.CGI}u) * ({IDX}){L.TX} + ({IDX})tx;")
            lines.append(f"const bool colok = vc < ({IDX}){L.NC};")
            lines.append(f"const {IDX} vcc = colok ? vc : ({IDX})0;")
            lines.append(f"const {IDX} mbase = mo * ({IDX}){L.Cin};  // flat channel of the group's outer coords")
            lines.append(f"const {IDX} m0 = mbase + vcc * ({IDX}){L.V};  // the thread's first channel")
            dl, mc = decompose("mo", L.ksizes[:-1] or [1], "bk", IDX)
            lines += dl
            for (ks, rs), k in keys.items():
                outer = offset_expr(mc, ks[:-1], IDX) if len(ks) > 1 else f"({IDX})0"
                lines.append(f"const {IDX} ob{k} = {outer} + vcc * ({IDX}){L.V};")
        self.keys = keys
        lines += self.scalar_lines()
        return lines

    # element offsets of one tile unit -------------------------------------------------------
    def unit_offsets(self, ti: str, j: str, ok: str) -> list:
        """Lines setting ``ok`` and the per-key offsets ``oe<k>[j]`` of tile ``ti`` for this thread."""
        L, IDX = self.L, self.L.IDX
        lines = []
        if L.inner == "reduced":
            lines.append(f"const {IDX} u = ({IDX})({ti}) * ({IDX}){BLOCK} + ({IDX})tid;")
            lines.append(f"{ok} = ({ti}) >= 0 && ({ti}) < {L.NT} && u < ({IDX}){L.NU};")
            lines.append(f"if ({ok}) {{")
            lines.append(f"  const {IDX} lv = u % ({IDX}){L.LV};")
            lines.append(f"  const {IDX} ou = u / ({IDX}){L.LV};")
            dl, oc = decompose("ou", L.rsizes[:-1] or [1], "rk", IDX)
            lines += ["  " + x for x in dl]
            for (ks, rs), k in self.keys.items():
                outer = offset_expr(oc, rs[:-1], IDX) if len(rs) > 1 else f"({IDX})0"
                lines.append(f"  oe{k}[{j}] = ob{k} + {outer} + lv * ({IDX}){L.V};")
            lines.append("}")
        else:
            lines.append(f"const {IDX} r = ({IDX})({ti}) * ({IDX}){L.TY} + ({IDX})ty;")
            lines.append(f"{ok} = colok && ({ti}) >= 0 && ({ti}) < {L.NT} && r < ({IDX}){L.K};")
            lines.append(f"if ({ok}) {{")
            dl, rc = decompose("r", L.rsizes, "rk", IDX)
            lines += ["  " + x for x in dl]
            for (ks, rs), k in self.keys.items():
                lines.append(f"  oe{k}[{j}] = ob{k} + {offset_expr(rc, rs, IDX)};")
            lines.append("}")
        return lines

    def load_elem(self, t, j: str) -> list:
        """Load tensor t's V elements at oe<key>[j] into c<uid>[j] (storage type: halves stay
        packed until used)."""
        L = self.L
        off = f"oe{self.key_of[t.uid]}[{j}]"
        if L.V == 1:
            return [f"c{t.uid}[{j}] = p{t.uid}[{off}];"]
        return [f"c{t.uid}[{j}] = *reinterpret_cast<const cc_v{t.uid}*>(p{t.uid} + {off});"]

    def elem_value(self, uid, j: str) -> str:
        """Element e of the raw tile value c<uid>[j] in the compute type."""
        t = self.L.e_loads[uid]
        ref = f"c{uid}[{j}].v[e]" if self.L.V > 1 else f"c{uid}[{j}]"
        return load_expr(t.dtype, ref, self.T)

    def tile_loop(self, names, forward: bool, inner) -> list:
        """A walk over this block's tiles, UNROLL tiles per step (every load first).  ``names``:
        elem tensors loaded (as c<uid>[j][e]); ``inner(j)``: lines run for a valid tile j."""
        L, SIDX, IDX = self.L, self.L.SIDX, self.L.IDX
        U = UNROLL
        ts = [self.L.e_loads[u] if u in self.L.e_loads else None for u in names]
        lines = [f"{IDX} oe{k}[{U}];" for k in self.keys.values()]
        lines.append(f"bool okj[{U}];")
        lines += [f"{'cc_v' + str(t.uid) if L.V > 1 else STORAGE[t.dtype]} c{t.uid}[{U}];" for t in ts]
        G = L.G
        if forward:
            lines.append(f"for ({SIDX} tb = ({SIDX})g; tb < ({SIDX}){L.NT}; tb += ({SIDX}){G * U}) {{")
            tij = f"tb + ({SIDX})j * ({SIDX}){G}"
        else:
            lines.append(f"const {SIDX} tl = ({SIDX})g < ({SIDX}){L.NT} ? ({SIDX})g + (({SIDX}){L.NT - 1} - ({SIDX})g) / ({SIDX}){G} * ({SIDX}){G} : ({SIDX})-1;")
            lines.append(f"for ({SIDX} tb = tl; tb >= 0; tb -= ({SIDX}){G * U}) {{")
            tij = f"tb - ({SIDX})j * ({SIDX}){G}"
        lines.append("  #pragma unroll")
        lines.append(f"  for (int j = 0; j < {U}; ++j) {{")
        lines.append(f"    const {SIDX} ti = {tij};")
        lines += ["    " + x for x in self.unit_offsets("ti", "j", "okj[j]")]
        lines.append("    if (okj[j]) {")
        for t in ts:
            lines += ["      " + x for x in self.load_elem(t, "j")]
        lines.append("    }")
        lines.append("  }")
        lines.append("  #pragma unroll")
        lines.append(f"  for (int j = 0; j < {U}; ++j) {{")
        lines.append("    if (okj[j]) {")
        lines += ["      " + x for x in inner("j")]
        lines.append("    }")
        lines.append("  }")
        lines.append("}")
        return lines

    # -- pass 1 ------------------------------------------------------------------------------
    def _shift_names(self):
        text = "\n".join(self.spec.accumulate + self.spec.finalize + self.spec.apply)
        return [n for n in self.spec.elem if f"f_{n}" in text]

    def stats(self, kind) -> list:
        L, T, IDX, V = self.L, self.T, self.L.IDX, self.L.V
        sp = self.spec
        st = [v for v, _ in sp.state]
        ns = len(st)
        lines = [f"__shared__ {T} sh[{ns * (V if L.inner == 'kept' else 1) * BLOCK}];",
                 f"__shared__ {T} shc[{max(1, len(L.coefs)) * L.W}];",
                 "__shared__ unsigned int sh_last;"]
        shift = self._shift_names()
        # the shift: the channel's first element (every block of the channel agrees on it)
        for n in shift:
            t = sp.elem[n]
            k = self.key_of[t.uid]
            if L.inner == "kept":
                lines.append(f"{T} f{t.uid}[{V}];")
                lines.append("#pragma unroll")
                lines.append(f"for (int e = 0; e < {V}; ++e) f{t.uid}[e] = colok ? "
                             f"{load_expr(t.dtype, f'p{t.uid}[ob{k} + ({IDX})e]', T)} : {T}(0);")
            else:
                lines.append(f"const {T} f{t.uid} = {load_expr(t.dtype, f'p{t.uid}[ob{k}]', T)};")
        for v, init in sp.state:
            if L.inner == "kept":
                lines.append(f"{T} a_{v}[{V}];")
                lines.append("#pragma unroll")
                lines.append(f"for (int e = 0; e < {V}; ++e) a_{v}[e] = {lit(init, T)};")
            else:
                lines.append(f"{T} a_{v} = {lit(init, T)};")
        names = [t.uid for t in sp.elem.values()]

        def acc(j):
            out = ["#pragma unroll", f"for (int e = 0; e < {V}; ++e) {{"]
            for n, t in sp.elem.items():
                out.append(f"  const {T} e_{n} = {self.elem_value(t.uid, j)};")
            for n in shift:
                t = sp.elem[n]
                out.append(f"  const {T} f_{n} = f{t.uid}{'[e]' if L.inner == 'kept' else ''};")
            for v in st:
                out.append(f"  {T} st_{v} = a_{v}{'[e]' if L.inner == 'kept' else ''};")
            out += ["  " + x for x in sp.accumulate]
            for v in st:
                out.append(f"  a_{v}{'[e]' if L.inner == 'kept' else ''} = st_{v};")
            out.append("}")
            return out

        lines.append("{")
        lines += ["  " + x for x in self.tile_loop(names, True, acc)]
        lines.append("}")
        # block tree (fixed order)
        if L.inner == "kept":
            lines.append("#pragma unroll")
            lines.append(f"for (int e = 0; e < {V}; ++e) {{")
            for i, v in enumerate(st):
                lines.append(f"  sh[({i * V}u + (unsigned)e) * {BLOCK}u + tid] = a_{v}[e];")
            lines.append("}")
            lines.append(f"for (unsigned int s = {L.TY // 2}u; s > 0u; s >>= 1) {{")
            lines.append("  __syncthreads();")
            lines.append("  if (ty < s) {")
            lines.append("    #pragma unroll")
            lines.append(f"    for (int e = 0; e < {V}; ++e) {{")
            for i, v in enumerate(st):
                lines.append(f"      {{ const unsigned int q = ({i * V}u + (unsigned)e) * {BLOCK}u + tid; sh[q] += sh[q + s * {L.TX}u]; }}")
            lines.append("    }")
            lines.append("  }")
            lines.append("}")
        else:
            for i, v in enumerate(st):
                lines.append(f"sh[{i * BLOCK}u + tid] = a_{v};")
            lines.append(f"for (unsigned int s = {BLOCK // 2}u; s > 0u; s >>= 1) {{")
            lines.append("  __syncthreads();")
            lines.append("  if (tid < s) {")
            for i, v in enumerate(st):
                lines.append(f"    sh[{i * BLOCK}u + tid] += sh[{i * BLOCK}u + tid + s];")
            lines.append("  }")
            lines.append("}")
        lines.append("__syncthreads();")
        # channel w of the block <-> (tx, e) and its flat index
        W = L.W
        if L.inner == "kept":
            chan = [f"const unsigned int wx = w / {V}u, we = w % {V}u;",
                    f"const {IDX} wvc = ({IDX})(cg % {L.CGI}u) * ({IDX}){L.TX} + ({IDX})wx;",
                    f"const bool wok = wvc < ({IDX}){L.NC};",
                    f"const {IDX} wm = mbase + (wok ? wvc : ({IDX})0) * ({IDX}){V} + ({IDX})we;"]

            def slot(i):
                return f"sh[({i * V}u + we) * {BLOCK}u + wx]"
        else:
            chan = ["const bool wok = true;", "const unsigned int wx = 0u, we = 0u;", f"const {IDX} wm = m;"]

            def slot(i):
                return f"sh[{i * BLOCK}u]"
        if L.split:
            # partial of this block, then the last block of the group merges them all
            npart = L.G
            lines.append(f"if (tid < {W}u) {{")
            lines.append("  const unsigned int w = tid;")
            lines += ["  " + x for x in chan]
            lines.append("  if (wok) {")
            for i, v in enumerate(st):
                lines.append(f"    ws[(({IDX}){len(L.coefs) * L.M}) + (({IDX}){i * npart} + ({IDX})g) * ({IDX}){L.M} + wm] = {slot(i)};")
            lines.append("  }")
            lines.append("}")
            lines.append("__threadfence();")
            lines.append("__syncthreads();")
            grp = "cg" if L.inner == "kept" else "m"
            lines.append(f"if (tid == 0u) sh_last = (atomicAdd(cnt + {grp}, 1u) == {npart - 1}u) ? 1u : 0u;")
            lines.append("__syncthreads();")
            lines.append("if (sh_last == 0u) return;")
            lines.append("__threadfence();")
            # merge: thread -> channel w = tid % W, part p = tid / W (P = BLOCK / W parts per
            # channel, each summing every P-th partial in order), then a fixed tree over p
            P = L.P
            lines.append("{")
            lines.append(f"  const unsigned int w = tid % {W}u, p = tid / {W}u;")
            lines += ["  " + x for x in chan]
            for v in st:
                lines.append(f"  {T} b_{v} = {T}(0);")
            lines.append("  if (wok) {")
            lines.append("    #pragma unroll 4")
            lines.append(f"    for (unsigned int q = p; q < {npart}u; q += {P}u) {{")
            for i, v in enumerate(st):
                lines.append(f"      b_{v} += __ldcg(ws + (({IDX}){len(L.coefs) * L.M}) + (({IDX}){i * npart} + ({IDX})q) * ({IDX}){L.M} + wm);")
            lines.append("    }")
            lines.append("  }")
            for i, v in enumerate(st):
                lines.append(f"  sh[({i * P}u + p) * {W}u + w] = b_{v};")
            lines.append(f"  for (unsigned int s = {P // 2}u; s > 0u; s >>= 1) {{")
            lines.append("    __syncthreads();")
            lines.append("    if (p < s) {")
            for i, v in enumerate(st):
                lines.append(f"      sh[({i * P}u + p) * {W}u + w] += sh[({i * P}u + p + s) * {W}u + w];")
            lines.append("    }")
            lines.append("  }")
            lines.append("}")
            lines.append("__syncthreads();")
        # finalize: one thread per channel of the block
        lines.append(f"if (tid < {W}u) {{")
        lines.append("  const unsigned int w = tid;")
        lines += ["  " + x for x in chan]
        if L.split:
            for i, v in enumerate(st):
                lines.append(f"  const {T} st_{v} = sh[{i * L.P * W}u + w];")
        else:
            for i, v in enumerate(st):
                lines.append(f"  const {T} st_{v} = {slot(i)};")
        lines.append("  if (wok) {")
        lines += ["    " + x for x in self.finalize_lines("wm")]
        for j, c in enumerate(L.coefs):
            if L.split:
                lines.append(f"    ws[({IDX}){j * L.M} + wm] = {c};")
            else:
                lines.append(f"    shc[{j * W}u + w] = {c};")
        lines.append("  }")
        lines.append("}")
        if L.split:
            grp = "cg" if L.inner == "kept" else "m"
            lines.append(f"if (tid == 0u) cnt[{grp}] = 0u;  // ready for the next launch")
        return lines

    def finalize_lines(self, mvar: str) -> list:
        """Row loads (r_*), shifts (f_*), the spec's finalize and the row outputs for channel mvar."""
        L, T = self.L, self.T
        sp = self.spec
        uids = list(L.r_loads) + list(L.r_stores)
        shift = self._shift_names()
        uids += [sp.elem[n].uid for n in shift if sp.elem[n].uid not in uids]
        lines = self.chan_offsets(mvar, uids, "or")
        for name, t in sp.row.items():
            lines.append(f"const {T} r_{name} = {load_expr(t.dtype, f'p{t.uid}[or{t.uid}]', T)};")
        for n in shift:
            t = sp.elem[n]
            lines.append(f"const {T} f_{n} = {load_expr(t.dtype, f'p{t.uid}[or{t.uid}]', T)};")
        lines += sp.finalize
        for o in sp.row_outs:
            lines += self.store_out(o, lambda u: f"or{u}")
        return lines

    def store_out(self, o: RowOut, off, vals=None) -> list:
        """Store ``o`` through its epilogue; ``off(uid)`` the offset expression of a tensor."""
        T = self.T
        lines = []
        if o.epilogue is None:
            t = o.tensor
            return [f"p{t.uid}[{off(t.uid)}] = {store_expr(t.dtype, o.value, T)};"]
        pre, body, env = epilogue_code(o, T, load_into(T, lambda uid, t: f"p{uid}[{off(uid)}]"))
        lines += pre + body
        for uid, t in o.epilogue.stores.items():
            lines.append(f"p{uid}[{off(uid)}] = {store_expr(t.dtype, env[uid], T)};")
        return ["{"] + ["  " + x for x in lines] + ["}"]

    # -- pass 2 ------------------------------------------------------------------------------
    def apply(self, kind) -> list:
        L, T, IDX, V = self.L, self.T, self.L.IDX, self.L.V
        sp = self.spec
        W = L.W
        lines = []
        # the thread's coefficients
        for j, c in enumerate(L.coefs):
            lines.append(f"{T} k{j}[{V}];")
        if kind == "full":
            lines.append("__syncthreads();")
            if L.inner == "kept":
                src = lambda j: f"shc[{j * W}u + tx * {V}u + (unsigned)e]"  # noqa: E731
            else:
                src = lambda j: f"shc[{j}]"  # noqa: E731
        else:
            if L.inner == "kept":
                src = lambda j: f"(colok ? ws[({IDX}){j * L.M} + m0 + ({IDX})e] : {T}(0))"  # noqa: E731
            else:
                src = lambda j: f"ws[({IDX}){j * L.M} + m]"  # noqa: E731
        lines.append("#pragma unroll")
        lines.append(f"for (int e = 0; e < {V}; ++e) {{")
        for j, c in enumerate(L.coefs):
            lines.append(f"  k{j}[e] = {src(j)};")
        lines.append("}")
        names = list(sp.apply_elems or sp.elem)
        o = sp.elem_out
        ep_loads = list(o.epilogue.loads.values()) if o.epilogue is not None else []
        uids = [sp.elem[n].uid for n in names] + [t.uid for t in ep_loads if t.uid not in [sp.elem[n].uid for n in names]]
        stores = list(L.e_stores.values())

        def body(j):
            out = []
            for t in stores:
                out.append(f"cc_v{t.uid} w{t.uid};" if V > 1 else f"{STORAGE[t.dtype]} w{t.uid};")
            out.append("#pragma unroll")
            out.append(f"for (int e = 0; e < {V}; ++e) {{")
            for n in names:
                t = sp.elem[n]
                out.append(f"  const {T} e_{n} = {self.elem_value(t.uid, j)};")
            for jj, c in enumerate(L.coefs):
                out.append(f"  const {T} {c} = k{jj}[e];")
            out += ["  " + x for x in sp.apply]
            # the element output through its epilogue, into the store vectors
            env_lines, vals = self.elem_epilogue(o, j)
            out += ["  " + x for x in env_lines]
            for t in stores:
                tgt = f"w{t.uid}.v[e]" if V > 1 else f"w{t.uid}"
                out.append(f"  {tgt} = {store_expr(t.dtype, vals[t.uid], T)};")
            out.append("}")
            for t in stores:
                off = f"oe{self.key_of[t.uid]}[{j}]"
                if V > 1:
                    out.append(f"*reinterpret_cast<cc_v{t.uid}*>(p{t.uid} + {off}) = w{t.uid};")
                else:
                    out.append(f"p{t.uid}[{off}] = w{t.uid};")
            return out

        lines.append("{")
        lines += ["  " + x for x in self.tile_loop(uids, False, body)]
        lines.append("}")
        return lines

    def elem_epilogue(self, o: RowOut, j: str):
        """Lines computing the stored values of the element output (value ``o.value`` per e) and
        {uid: expression} of each stored tensor."""
        T = self.T
        if o.epilogue is None:
            return [], {o.tensor.uid: o.value}
        pre, body, env = epilogue_code(o, T, lambda uid, t: ([], self.elem_value(uid, j)))
        return pre + body, {uid: env[uid] for uid in o.epilogue.stores}
