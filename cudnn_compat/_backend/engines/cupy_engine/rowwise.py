"""Generated "reduce a row, then map the row" kernels (pure Python): the skeleton behind
softmax (002 §3.2.96, §4.1.19) and batch normalization (002 §3.2.3, §4.1.4, §4.1.2).

A row is one position of the kept axes; its elements run over the reduced ``axes``.  Pass 1
accumulates a per-thread state over the row's elements, the threads of a row merge their
states in shared memory (a fixed tree: deterministic), ``finalize`` turns the state into
row values, one thread stores the per-row outputs (saved mean, running stats, dscale/dbias
through their blend epilogues) and pass 2 maps every element (re-read, mostly from L2) to
its output, applying the element-wise epilogue (the alpha/beta blend, BN's add/activation)
before the store.

Thread layout as in ``codegen.reduction_kernel``: row mode (the innermost memory axis is
reduced) gives a row a warp or a whole block of lanes; column mode puts ``mb`` rows in a
block so a warp reads whole 32-byte sectors.  When there are too few rows to fill the GPU,
each row is split over ``S`` blocks: kernel A writes per-split partial states to scratch,
kernel B merges them (in split order) and runs pass 2 on its split: two launches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .codegen import (BLOCK, INT32_LIMIT, ITEMSIZE, PREAMBLE, STORAGE, KernelSpec, bstrides, col_rows, collapse,
                      decompose, emit_chain, lit, load_expr, max_offset, name_kernel, offset_expr, order_axes,
                      round_expr, store_expr, tensors_compute_type)

TARGET_BLOCKS = 1056  # ~8 blocks of 256 threads per SM of an H100 (132 SMs)
CHUNK = 4  # elements a thread loads before using any (memory-level parallelism)
CACHE_MAX = 16  # a row share up to this many elements per thread is kept in registers


@dataclass
class RowOut:
    """A per-row (or per-element) output: its tensor, the C expression of its value and the
    epilogue group applied to it (None: stored as is)."""

    tensor: object
    value: str
    epilogue: object = None


def epilogue_code(o: RowOut, T: str, load) -> tuple:
    """The code of ``o``'s epilogue group up to its stores, for every row and stencil kernel:
    (``pre``: the output's value rounded to a virtual tensor's type; ``body``: each loaded input,
    then the prologue chain; ``env``: uid -> C expression).  ``load(uid, tensor)`` gives the
    declaration lines and the expression of a loaded input."""
    env = {uid: f"s{uid}" for uid, t in o.epilogue.tensors().items() if t.is_by_value}
    pre, val = [], o.value
    if o.tensor.is_virtual:
        r = round_expr(o.tensor.dtype, val, T)
        if r != val:
            pre.append(f"const {T} rv{o.tensor.uid} = {r};")
            val = f"rv{o.tensor.uid}"
    env[o.tensor.uid] = val
    body = []
    for uid, t in o.epilogue.loads.items():
        decl, env[uid] = load(uid, t)
        body += decl
    body += emit_chain(o.epilogue.prologue, env, T)
    return pre, body, env


def load_into(T: str, ref):
    """``load`` for ``epilogue_code``: ``const T in<uid> = <the element at ref(uid, tensor)>``."""
    return lambda uid, t: ([f"const {T} in{uid} = {load_expr(t.dtype, ref(uid, t), T)};"], f"in{uid}")


@dataclass
class RowSpec:
    family: str
    dims: tuple  # element space
    axes: tuple  # reduced axes
    elem: dict  # name -> Tensor read per element (e_<name>)
    row: dict = field(default_factory=dict)  # name -> Tensor read per row (r_<name>)
    scalars: dict = field(default_factory=dict)  # name -> by-value Tensor (sc_<name>) or a float
    state: list = field(default_factory=list)  # [(var, init value)]
    pre: list = field(default_factory=list)  # lines before pass 1 (row values, shift)
    accumulate: list = field(default_factory=list)  # lines updating st_<var> from e_*
    merge: object = None  # fn(a: str prefix, b: str prefix) -> lines merging b into a
    finalize: list = field(default_factory=list)  # lines from st_<var> (merged) to row values
    row_outs: list = field(default_factory=list)  # [RowOut] at row coordinates
    apply: list = field(default_factory=list)  # lines computing the element value
    elem_out: "RowOut | None" = None
    apply_elems: tuple = ()  # names of elem tensors pass 2 reads (default: all)
    leader: str = ""  # elem tensor whose memory order drives the layout


def sum_merge(vars_):
    def merge(a, b):
        return [f"{a}{v} += {b}{v};" for v in vars_]
    return merge


class _Mem:
    """Unique memory tensors of a row kernel with their role in the parameter list."""

    def __init__(self):
        self.loads, self.stores = {}, {}

    def load(self, t):
        if t.uid not in self.stores:
            self.loads.setdefault(t.uid, t)

    def store(self, t):
        self.stores[t.uid] = t
        self.loads.pop(t.uid, None)


def row_kernels(spec: RowSpec) -> list:
    """One KernelSpec (no split) or two (split: partial states, then merge and map).
    A split pair carries ("extra", "ws", "ptr") for the partial-state scratch; its byte size is
    ``ws_bytes`` on the first spec."""
    X = tuple(spec.dims)
    reduced = [a for a in spec.axes if X[a] != 1]
    kept = [a for a in range(len(X)) if X[a] != 1 and a not in reduced]
    mem = _Mem()
    for t in spec.elem.values():
        mem.load(t)
    for t in spec.row.values():
        mem.load(t)
    outs = list(spec.row_outs) + ([spec.elem_out] if spec.elem_out is not None else [])
    for o in outs:
        if o.epilogue is None:
            mem.store(o.tensor)
        else:
            for t in o.epilogue.loads.values():
                mem.load(t)
            for t in o.epilogue.stores.values():
                mem.store(t)
    tensors = list(mem.loads.values()) + list(mem.stores.values())
    T = tensors_compute_type(tensors + [s for s in spec.scalars.values() if not isinstance(s, (int, float))])
    strides = {t.uid: bstrides(t, X) if len(t.dims) == len(X) else (0,) * len(X) for t in tensors}
    lead = strides[spec.elem[spec.leader or next(iter(spec.elem))].uid]
    kept_o, red_o = order_axes(kept, lead), order_axes(reduced, lead)
    uids = [t.uid for t in tensors]
    ksizes, kstr = collapse(kept_o, X, [strides[u] for u in uids])
    rsizes, rstr = collapse(red_o, X, [strides[u] for u in uids])
    if not ksizes:
        ksizes, kstr = [1], [[0] for _ in uids]
    if not rsizes:
        rsizes, rstr = [1], [[0] for _ in uids]
    kst, rst = dict(zip(uids, kstr)), dict(zip(uids, rstr))
    M, K = math.prod(ksizes), math.prod(rsizes)
    big = max([M * K] + [max_offset(t.dims, t.strides) + 1 for t in tensors]) > INT32_LIMIT
    IDX = "unsigned long long" if big else "unsigned int"

    cand = [a for a in kept + reduced if lead[a] != 0]
    innermost = min(cand, key=lambda a: lead[a]) if cand else None
    row = innermost is not None and innermost in reduced
    if row:
        lanes = BLOCK
        while lanes > 32 and lanes * 4 > K:
            lanes //= 2
        per_block, step = BLOCK // lanes, 1
    else:
        size = max((ITEMSIZE[t.dtype] for t in spec.elem.values()), default=4)
        per_block = col_rows(M, size, BLOCK)
        lanes, step = BLOCK // per_block, per_block
    mtiles = -(-M // per_block)
    splits = 1
    if mtiles < TARGET_BLOCKS // 2:
        splits = max(1, min(-(-TARGET_BLOCKS // mtiles), K // (lanes * 8)))

    ctx = _Ctx(spec, T, IDX, mem, kst, rst, ksizes, rsizes, M, K, lanes, per_block, step, row, splits)
    if splits == 1:
        return [ctx.kernel("full")]
    a, b = ctx.kernel("partial"), ctx.kernel("finish")
    a.ws_bytes = len(spec.state) * splits * M * (8 if T == "double" else 4)
    # the finishing blocks re-read x (and its row's first element) while others write y
    a.guard, a.stored = tuple(t.uid for t in spec.elem.values()), tuple(mem.stores)
    return [a, b]


def _typed(spec: RowSpec, T: str) -> RowSpec:
    """The spec's C snippets with {T} (compute type) and {NAN} filled in."""
    def sub(x):
        return x.replace("{T}", T).replace("{NAN}", lit(math.nan, T))
    merge = spec.merge
    out = RowSpec(spec.family, spec.dims, spec.axes, spec.elem, spec.row, spec.scalars, spec.state,
                  [sub(x) for x in spec.pre], [sub(x) for x in spec.accumulate],
                  lambda a, b: [sub(x) for x in merge(a, b)], [sub(x) for x in spec.finalize],
                  [RowOut(o.tensor, sub(o.value), o.epilogue) for o in spec.row_outs], [sub(x) for x in spec.apply],
                  RowOut(spec.elem_out.tensor, sub(spec.elem_out.value), spec.elem_out.epilogue) if spec.elem_out else None,
                  spec.apply_elems, spec.leader)
    return out


class _Ctx:
    def __init__(self, spec, T, IDX, mem, kst, rst, ksizes, rsizes, M, K, lanes, per_block, step, row, splits):
        spec = _typed(spec, T)
        self.spec, self.T, self.IDX, self.mem = spec, T, IDX, mem
        self.kst, self.rst, self.ksizes, self.rsizes = kst, rst, ksizes, rsizes
        self.M, self.K, self.lanes, self.per_block, self.step, self.row, self.splits = (
            M, K, lanes, per_block, step, row, splits)

    # -- pieces ----------------------------------------------------------------------
    def params(self, with_ws: bool):
        params, args = [], []
        for uid, t in self.mem.loads.items():
            params.append(f"const {STORAGE[t.dtype]}* p{uid}")
            args.append(("buf", uid))
        for uid, t in self.mem.stores.items():
            params.append(f"{STORAGE[t.dtype]}* p{uid}")
            args.append(("buf", uid))
        seen = set()
        for name, s in self.spec.scalars.items():
            if isinstance(s, (int, float)) or s.uid in seen:
                continue
            seen.add(s.uid)
            params.append(f"const {self.T} s{s.uid}")
            args.append(("scalar", s.uid, self.T))
        for o in self.spec.row_outs + ([self.spec.elem_out] if self.spec.elem_out else []):
            if o.epilogue is not None:
                for uid, t in o.epilogue.tensors().items():
                    if t.is_by_value and uid not in seen:
                        seen.add(uid)
                        params.append(f"const {self.T} s{uid}")
                        args.append(("scalar", uid, self.T))
        if with_ws:
            params.append(f"{self.T}* ws")
            args.append(("extra", "ws", "ptr"))
        return params, args

    def scalar_lines(self):
        out = []
        for name, s in self.spec.scalars.items():
            v = lit(s, self.T) if isinstance(s, (int, float)) else f"s{s.uid}"
            out.append(f"const {self.T} sc_{name} = {v};")
        return out

    def head(self, kind):
        T, IDX = self.T, self.IDX
        lines = []
        if kind != "finish":
            for v, _ in self.spec.state:
                lines.append(f"  __shared__ {T} sh_{v}[{BLOCK}];")
        lines.append("  const unsigned int tid = threadIdx.x;")
        if self.row:
            lines.append(f"  const unsigned int lane = tid % {self.lanes}u;")
            lines.append(f"  const {IDX} m = ({IDX})blockIdx.x * ({IDX}){self.per_block} + ({IDX})(tid / {self.lanes}u);")
        else:
            lines.append(f"  const unsigned int lane = tid / {self.per_block}u;")
            lines.append(f"  const {IDX} m = ({IDX})blockIdx.x * ({IDX}){self.per_block} + ({IDX})(tid % {self.per_block}u);")
        lines.append(f"  const {IDX} k0 = ({IDX})blockIdx.y * ({IDX}){self.lanes} + ({IDX})lane;")
        lines.append(f"  const {IDX} kstep = ({IDX}){self.lanes * self.splits};")
        lines.append(f"  const bool live = m < ({IDX}){self.M};")
        lines.append(f"  const {IDX} mm = live ? m : ({IDX})0;")
        lines += ["  " + x for x in self.scalar_lines()]
        dl, mc = decompose("mm", self.ksizes, "cm", IDX)
        lines += ["  " + x for x in dl]
        for uid in list(self.mem.loads) + list(self.mem.stores):
            lines.append(f"  const {IDX} om{uid} = {offset_expr(mc, self.kst[uid], IDX)};")
        for name, t in self.spec.row.items():
            lines.append(f"  const {T} r_{name} = live ? {load_expr(t.dtype, f'p{t.uid}[om{t.uid}]', T)} : {T}(0);")
        for name, t in self.spec.elem.items():  # the row's first element (a shift for sums)
            lines.append(f"  const {T} f_{name} = live ? {load_expr(t.dtype, f'p{t.uid}[om{t.uid}]', T)} : {T}(0);")
        lines += ["  " + x for x in self.spec.pre]
        return lines

    def _need(self, names, apply: bool) -> list:
        """uids whose element offsets a pass needs: the elem tensors it reads, and for the apply
        pass the output or its epilogue's tensors."""
        need = {self.spec.elem[n].uid for n in names}
        o = self.spec.elem_out
        if apply and o is not None:
            if o.epilogue is not None:
                need |= set(o.epilogue.loads) | set(o.epilogue.stores)
            else:
                need.add(o.tensor.uid)
        return sorted(need)

    def load_phase(self, names, need, U, base, declare=True):
        """Offsets and values of U elements per thread (k = base + j*kstep), every load issued
        before any is used: several loads in flight per thread."""
        T, IDX = self.T, self.IDX
        lines = []
        if declare:
            lines += [f"  {IDX} oa{uid}[{U}];" for uid in need]
            lines += [f"  {T} c_{n}[{U}];" for n in names]
        lines.append("  #pragma unroll")
        lines.append(f"  for (int j = 0; j < {U}; ++j) {{")
        lines.append(f"    const {IDX} k = {base} + ({IDX})j * kstep;")
        lines.append(f"    if (live && k < ({IDX}){self.K}) {{")
        dl, kc = decompose("k", self.rsizes, "ck", IDX)
        lines += ["      " + x for x in dl]
        for uid in need:
            lines.append(f"      oa{uid}[j] = om{uid} + {offset_expr(kc, self.rst[uid], IDX)};")
        for n in names:
            t = self.spec.elem[n]
            lines.append(f"      c_{n}[j] = {load_expr(t.dtype, f'p{t.uid}[oa{t.uid}[j]]', T)};")
        lines += ["    }", "  }"]
        return lines

    def compute_phase(self, names, need, U, base, body):
        T, IDX = self.T, self.IDX
        lines = ["  #pragma unroll", f"  for (int j = 0; j < {U}; ++j) {{",
                 f"    const {IDX} k = {base} + ({IDX})j * kstep;",
                 f"    if (live && k < ({IDX}){self.K}) {{"]
        lines += [f"      const {IDX} o{uid} = oa{uid}[j];" for uid in need]
        lines += [f"      const {T} e_{n} = c_{n}[j];" for n in names]
        if body == "accumulate":
            lines += ["      " + x for x in self.spec.accumulate]
        else:
            lines += ["      " + x for x in self.spec.apply]
            lines += ["      " + x for x in self.output(self.spec.elem_out, "o")]
        lines += ["    }", "  }"]
        return lines

    def elem_loop(self, names, body):
        """A pass over the thread's elements of its row, in chunks of CHUNK (loads first)."""
        IDX = self.IDX
        need = self._need(names, body == "apply")
        U = CHUNK
        lines = [f"  for ({IDX} kb = k0; kb < ({IDX}){self.K}; kb += kstep * ({IDX}){U}) {{"]
        lines += ["  " + x for x in self.load_phase(names, need, U, "kb")]
        lines += ["  " + x for x in self.compute_phase(names, need, U, "kb", body)]
        lines.append("  }")
        return lines

    def output(self, o: RowOut, off: str):
        """Store ``o`` (through its epilogue) at offsets ``{off}<uid>``."""
        T = self.T
        lines = []
        if o.epilogue is None:
            t = o.tensor
            lines.append(f"p{t.uid}[{off}{t.uid}] = {store_expr(t.dtype, o.value, T)};")
            return lines
        pre, body, env = epilogue_code(o, T, load_into(T, lambda uid, t: f"p{uid}[{off}{uid}]"))
        lines += pre + body
        for uid, t in o.epilogue.stores.items():
            lines.append(f"p{uid}[{off}{uid}] = {store_expr(t.dtype, env[uid], T)};")
        return lines

    def tree(self):
        T = self.T
        lines = []
        for v, _ in self.spec.state:
            lines.append(f"  sh_{v}[tid] = st_{v};")
        lines.append(f"  for (unsigned int s = {self.lanes // 2}u; s > 0u; s >>= 1) {{")
        lines.append("    __syncthreads();")
        lines.append("    if (lane < s) {")
        lines.append(f"      const unsigned int o = tid + s * {self.step}u;")
        for v, _ in self.spec.state:
            lines.append(f"      {T} a_{v} = sh_{v}[tid]; const {T} b_{v} = sh_{v}[o];")
        lines += ["      " + x for x in self.spec.merge("a_", "b_")]
        for v, _ in self.spec.state:
            lines.append(f"      sh_{v}[tid] = a_{v};")
        lines.append("    }")
        lines.append("  }")
        lines.append("  __syncthreads();")
        slot0 = "tid - lane" if self.row else f"tid % {self.per_block}u"
        for v, _ in self.spec.state:
            lines.append(f"  m_{v} = sh_{v}[{slot0}];")
        return lines

    def finish_rows(self):
        lines = []
        for v, _ in self.spec.state:
            lines.append(f"  const {self.T} st_{v} = m_{v};")
        lines += ["  " + x for x in self.spec.finalize]
        if self.spec.row_outs:
            lines.append("  if (live && lane == 0u && blockIdx.y == 0u) {")
            for o in self.spec.row_outs:
                lines += ["    " + x for x in self.output(o, "om")]
            lines.append("  }")
        return lines

    def kernel(self, kind):
        T = self.T
        params, args = self.params(kind != "full")
        body = [PREAMBLE, f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params)}) {{']
        body += self.head(kind)
        elems = list(self.spec.elem)
        per_thread = -(-self.K // (self.lanes * self.splits))
        cached = kind == "full" and per_thread <= CACHE_MAX and self.spec.elem_out is not None
        if cached:  # the thread's elements stay in registers between the passes: x is read once
            apply_names = list(self.spec.apply_elems or elems)
            need = sorted(set(self._need(elems, False)) | set(self._need(apply_names, True)))
            body += self.load_phase(elems, need, per_thread, "k0")
        if kind in ("full", "partial"):
            for v, _ in self.spec.state:
                body.append(f"  {T} m_{v};")
            body.append("  {")
            for v, init in self.spec.state:
                body.append(f"  {T} st_{v} = {lit(init, T)};")
            if cached:
                body += self.compute_phase(elems, need, per_thread, "k0", "accumulate")
            else:
                body += self.elem_loop(elems, "accumulate")
            body += self.tree()
            body.append("  }")
        if kind == "partial":
            body.append("  if (live && lane == 0u) {")
            for j, (v, _) in enumerate(self.spec.state):
                body.append(f"    ws[(({self.IDX}){j} * {self.splits}u + blockIdx.y) * ({self.IDX}){self.M} + m] = m_{v};")
            body.append("  }")
        if kind == "finish":
            for j, (v, _) in enumerate(self.spec.state):
                body.append(f"  {T} a_{v} = live ? ws[(({self.IDX}){j} * {self.splits}u) * ({self.IDX}){self.M} + mm] : {T}(0);")
            body.append(f"  for (unsigned int sp = 1u; sp < {self.splits}u; ++sp) {{")
            for j, (v, _) in enumerate(self.spec.state):
                body.append(f"    const {T} b_{v} = live ? ws[(({self.IDX}){j} * {self.splits}u + sp) * ({self.IDX}){self.M} + mm] : {T}(0);")
            body += ["    " + x for x in self.spec.merge("a_", "b_")]
            body.append("  }")
            for v, _ in self.spec.state:
                body.append(f"  const {T} m_{v} = a_{v};")  # noqa: the merged state
        if kind in ("full", "finish"):
            body += self.finish_rows()
            if cached:
                body += self.compute_phase(apply_names, need, per_thread, "k0", "apply")
            elif self.spec.elem_out is not None:
                body += self.elem_loop(list(self.spec.apply_elems or elems), "apply")
        body.append("}")
        name, src = name_kernel(f"{self.spec.family}{'' if kind == 'full' else '_' + kind[0]}", "\n".join(body) + "\n")
        grid = (-(-self.M // self.per_block), self.splits, 1)
        return KernelSpec(name, src, args, params, grid, (BLOCK, 1, 1), 0, (), self.spec.family)
