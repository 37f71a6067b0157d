"""GPU kernels of the RNN recurrence ops and of ``Rng`` (definitions in cudnn_compat/_backend/ops/rnn.py).

``RNNRecurrence`` / ``RNNRecurrenceBackward`` become a *program* (pure Python, built once per
plan): per time step ONE cuBLAS GEMM over all gates, batched over the directions
(cublasGemmStridedBatchedEx; both directions advance in the same step, one from each end), and ONE
generated cell kernel for every (direction, sequence, unit); LSTM projection adds one GEMM and one
small kernel per step.  The forward op's ``x`` form starts with the input projection: a bias kernel
and one GEMM over every time step, batched over the directions (``_projection``). The recurrent
state lives in scratch buffers (h in the weight dtype, as the next GEMM's operand; c and the GEMM
results in float, double for DOUBLE); a sequence past its length is inactive and keeps its state.
A program runs through program.py (eager, then captured into a CUDA graph and replayed; the GEMMs
through cublas.py).  A persistent kernel would save the launch gaps too but needs the weights
resident in shared memory/registers, which does not fit at H = 512 (4 MiB of LSTM fp32 weights), so
the GEMM + cell pair stays.

``Rng``: one thread per Philox4x32-10 block of 4 mask elements, exactly the reference's
counter layout and threshold (bit-identical masks); the element-wise ops on the mask that follow
it (dropout's y = x * scale * mask, the RNN's dropped layer input) run in the same kernel as its
epilogue (``grouping.STORED_EPILOGUE_KINDS``: the mask is stored too), and the last block to
finish advances the offset (a ticket counter kept per stream), so ``offset_out`` may alias
``offset`` and a dropout forward is one launch.

Programs are also run by the tests on the CPU (tests/test_rnn_gpu_program.py: GEMMs in NumPy,
kernels through tests/kernel_emu.py), which checks the step sequencing and every kernel's
index math against the reference engine without a GPU.
"""
from __future__ import annotations

import math

import numpy as np

from ...math_policy import gemm_compute
from ...ops.rnn import GATES, is_padded, row_map, rows_of
from .codegen import (EMU_TICKETS, PREAMBLE, STORAGE, KernelSpec, _params, _scalar_env, bstrides, emit_chain, load_expr, name_kernel,
                      store_expr)
from .cublas import Gemm
from .program import Launch, Program, ProgramRun
from .steps import KernelRun, PyRun, ScratchRun

KINDS = ("RNNRecurrence", "RNNRecurrenceBackward", "Rng")
BLOCK = 256
_FLOATS = ("float16", "float32", "float64")


# -- support -------------------------------------------------------------------------------------

def supports(op) -> "str | None":
    if op.kind == "Rng":
        return None
    for role, t in {**op.inputs, **op.outputs}.items():
        if t.is_by_value:
            continue
        if t.dtype not in _FLOATS:
            return f"{op.kind}: {role} of type {t.dtype} is not supported"
        if t.strides[-1] != 1:
            return f"{op.kind}: {role} needs unit stride in its last dim"
    w = op.inputs["w_rec"]
    for role in ("wr",):
        if role in op.inputs and op.inputs[role].dtype != w.dtype:
            return f"{op.kind}: {role} and w_rec must share a data type"
    return None


# -- programs --------------------------------------------------------------------------------------


def _ct(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def _C(dtype: str) -> str:
    return "double" if dtype == "float64" else "float"


class _Params:
    """Kernel parameters built together with the launch arguments that feed them."""

    def __init__(self):
        self.decls, self.args = [], []

    def ptr(self, ctype: str, name: str, buf: str, const: bool = False):
        self.decls.append(f"{'const ' if const else ''}{ctype}* {name}")
        self.args.append(("ref", buf, 0))

    def int(self, name: str, value=None):
        self.decls.append(f"long long {name}")
        self.args.append(("int", value))

    def scalar(self, ctype: str, name: str, role: str):
        self.decls.append(f"{ctype} {name}")
        self.args.append(("scalar", role))


def _spec(prefix: str, params: _Params, body: str, threads: int, gy: int = 1, prelude: str = "") -> KernelSpec:
    src = PREAMBLE + prelude + f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params.decls)}) {{\n' \
        + body + "}\n"
    name, src = name_kernel(prefix, src)
    grid = (max(1, -(-threads // BLOCK)), gy, 1)
    return KernelSpec(name, src, [], list(params.decls), grid, (BLOCK, 1, 1), family=prefix)


def copy_spec(dims, src, dst, dst_dtype: str, src_dtype: "str | None", value: "str | None" = None) -> tuple:
    """(spec, args) copying a 3-D strided ``src`` buffer into ``dst`` (names; strides in
    ``src``/``dst`` as (buffer, strides)); no src: zero, or by-value role ``value``."""
    D, R, W = dims
    C = _C(dst_dtype if src_dtype is None else src_dtype)
    p = _Params()
    p.ptr(STORAGE[dst_dtype], "dst", dst[0])
    if src is not None:
        p.ptr(STORAGE[src_dtype], "src", src[0], const=True)
    if value is not None:
        p.scalar(C, "val", value)
    ds, ss = dst[1], (src[1] if src is not None else None)
    v = load_expr(src_dtype, f"src[{ss[0]}LL * d + {ss[1]}LL * r + {ss[2]}LL * w]", C) if src is not None else \
        ("val" if value is not None else f"{C}(0)")
    body = f"""  const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= {D * R * W}LL) return;
  const long long w = n % {W}, r = (n / {W}) % {R}, d = n / ({W}LL * {R});
  dst[{ds[0]}LL * d + {ds[1]}LL * r + {ds[2]}LL * w] = {store_expr(dst_dtype, v, C)};
"""
    spec = _spec("rnncopy", p, body, D * R * W)
    return spec, p.args


def pad_spec(D, T, B, W, layout, dst, dst_dtype, value: "str | None") -> tuple:
    """(spec, args) setting padding rows (t >= length_b) of a (D, N, W) row buffer to 0 or ``value``."""
    C = _C(dst_dtype)
    p = _Params()
    p.ptr(STORAGE[dst_dtype], "dst", dst[0])
    p.ptr("int", "lens", "lens", const=True)
    if value is not None:
        p.scalar(C, "val", value)
    tstride, bstride = (B, 1) if layout == "SEQ" else (1, T)
    ds = dst[1]
    body = f"""  const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= {D * T * B * W}LL) return;
  const long long w = n % {W}, b = (n / {W}) % {B}, t = (n / ({W}LL * {B})) % {T}, d = n / ({W}LL * {B} * {T});
  if (t < lens[b]) return;
  const long long row = t * {tstride} + b * {bstride};
  dst[{ds[0]}LL * d + {ds[1]}LL * row + w] = {store_expr(dst_dtype, "val" if value is not None else f"{C}(0)", C)};
"""
    return _spec("rnnpad", p, body, D * T * B * W), p.args


def _clip_expr(clip: str, v: str) -> str:
    if clip == "PROPAGATE":
        return f"cc_pmin(cc_pmax({v}, lclip), rclip)"
    return f"fmin(fmax({v}, lclip), rclip)"


class _Geo:
    """Static facts of one recurrence op."""

    def __init__(self, op):
        a = op.attrs
        self.op = op
        self.mode = a["mode"]
        self.D, self.gH, self.Ho = op.inputs["w_rec"].dims
        self.g = GATES[self.mode]
        self.H = self.gH // self.g
        self.T, self.lengths, self.layout = a["T"], tuple(a["lengths"]), a["layout"]
        self.B = len(self.lengths)
        self.N = rows_of(self.layout, self.T, self.lengths)
        self.base, self.bstride = row_map(self.layout, self.T, self.lengths)
        self.dirs = tuple(a["directions"])
        self.clip = a.get("clip")
        self.wdt = op.inputs["w_rec"].dtype
        self.ct = _ct(self.wdt)
        self.C = _C(self.wdt)
        self.proj = "wr" in op.inputs
        self.padded = is_padded(self.layout, self.T, self.lengths)
        self.maxlen = max(self.lengths)
        # the op's GEMMs follow the one TF32 rule (math_policy), as its Matmuls in every engine do
        self.compute = gemm_compute(self.wdt, a.get("math_type"))
        self.roles = {**op.inputs, **op.outputs}

    def times(self, s: int, backward: bool) -> list:
        """Step index s of the run -> t per direction (the backward sweeps the forward order back)."""
        T = self.T
        return [(s if rev else T - 1 - s) if backward else (T - 1 - s if rev else s) for rev in self.dirs]

    def active(self, ts) -> bool:
        return any(t < self.maxlen for t in ts)

    def steps(self, backward: bool):
        """The per-step kernel ints of every active step in run order: t0 t1 r0 r1 (the step's t and
        row base per end direction), backward also p0 p1 (the row base of the step before)."""
        for s in range(self.T):
            ts = self.times(s, backward)
            if not self.active(ts):
                continue
            ints = {"t0": ts[0], "t1": ts[-1], "r0": self.row_base(ts[0]), "r1": self.row_base(ts[-1])}
            if backward:
                prev = [t + 1 if rev else t - 1 for t, rev in zip(ts, self.dirs)]
                ints.update(p0=self.row_base(prev[0]), p1=self.row_base(prev[-1]))
            yield ints

    def row_base(self, t: int) -> int:
        return self.base[t] if 0 <= t < self.T else 0

    def st(self, role: str) -> tuple:
        return self.roles[role].strides

    def ref(self, role: str, idx: str) -> str:
        """C expression of element (d, row, idx) of a row-addressed role (row, d in scope)."""
        s = self.st(role)
        return f"{role}[{s[0]}LL * d + {s[1]}LL * row + {idx}]"

    def prev_ref(self, role: str, idx: str) -> str:
        s = self.st(role)
        return f"{role}[{s[0]}LL * d + {s[1]}LL * prow + {idx}]"

    def state_ref(self, role: str, idx: str) -> str:
        s = self.st(role)
        return f"{role}[{s[0]}LL * d + {s[1]}LL * b + {idx}]"


def _head(g: _Geo, W: int) -> str:
    """Common kernel prologue: (d, b, j) of the thread, its step t, row, activity."""
    rev = " : ".join([f"d == {i} ? {'true' if r else 'false'}" for i, r in enumerate(g.dirs[:-1])] + [
        "true" if g.dirs[-1] else "false"])
    return f"""  const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= {g.B * W}LL) return;
  const int d = blockIdx.y;
  const long long b = n / {W}, j = n % {W};
  const long long t = d ? t1 : t0;
  const bool rev = {rev};
  const bool act = t < lens[b];
  const long long row = (d ? r1 : r0) + b * {g.bstride}LL;
  const long long sb = (long long)d * {g.B} + b;
  (void)rev; (void)row;
"""


def _step_params(p: _Params, backward: bool = False):
    p.ptr("int", "lens", "lens", const=True)
    for name in ("t0", "t1", "r0", "r1") + (("p0", "p1") if backward else ()):
        p.int(name)


def _fwd_cell(g: _Geo) -> tuple:
    """The forward cell kernel: (spec, args template with None for the per-step ints)."""
    R, C, H, gH, Ho = g.roles, g.C, g.H, g.gH, g.Ho
    train = "acts" in R
    p = _Params()
    p.ptr(STORAGE[R["gx"].dtype], "gx", "gx", const=True)
    p.ptr(C, "gr", "gr", const=True)
    p.ptr(STORAGE[g.wdt], "hs", "hs")
    if g.mode == "LSTM":
        p.ptr(C, "cs", "cs")
    if g.proj:
        p.ptr(STORAGE[g.wdt], "hp", "hp")
    else:
        p.ptr(STORAGE[R["y"].dtype], "y", "y")
    for role in ("acts", "c_all", "hpre", "grn", "b_rec"):
        if role in R:
            p.ptr(STORAGE[R[role].dtype], role, role, const=role == "b_rec")
    if g.clip:
        p.scalar(C, "lclip", "lclip")
        p.scalar(C, "rclip", "rclip")
    _step_params(p)

    def ld(role, idx):
        return load_expr(R[role].dtype, g.ref(role, idx), C)

    def sv(role, idx, val):
        return f"  {g.ref(role, idx)} = {store_expr(R[role].dtype, val, C)};\n"
    body = _head(g, H) + "  if (!act) return;\n"
    body += f"  const {C}* grr = gr + sb * {gH}LL;\n"
    if g.mode in ("RELU", "TANH"):
        body += f"  const {C} pre = {ld('gx', 'j')} + grr[j];\n"
        body += f"  const {C} h = {'cc_pmax(pre, ' + C + '(0))' if g.mode == 'RELU' else 'tanh(pre)'};\n"
    elif g.mode == "LSTM":
        for k, nm in enumerate("ifgo"):
            body += f"  const {C} p{nm} = {ld('gx', f'{k * H}LL + j')} + grr[{k * H}LL + j];\n"
        body += f"  const {C} i = cc_sigmoid(pi), f = cc_sigmoid(pf), gg = tanh(pg), o = cc_sigmoid(po);\n"
        body += f"  {C} c = f * cs[sb * {H}LL + j] + i * gg;\n"
        if g.clip:
            body += f"  c = {_clip_expr(g.clip, 'c')};\n"
        body += f"  const {C} h = o * tanh(c);\n  cs[sb * {H}LL + j] = c;\n"
        if train:
            for k, nm in enumerate(("i", "f", "gg", "o")):
                body += sv("acts", f"{k * H}LL + j", nm)
            body += sv("c_all", "j", "c")
            if "hpre" in R:
                body += sv("hpre", "j", "h")
    else:  # GRU
        bias = load_expr(R["b_rec"].dtype, f"b_rec[{R['b_rec'].strides[0]}LL * d + j]", C) if "b_rec" in R else f"{C}(0)"
        body += f"  const {C} hprev = {load_expr(g.wdt, f'hs[sb * {Ho}LL + j]', C)};\n"
        body += f"  const {C} grn_v = grr[{2 * H}LL + j] + {bias};\n"
        body += f"  const {C} r = cc_sigmoid({ld('gx', 'j')} + grr[j]);\n"
        body += f"  const {C} z = cc_sigmoid({ld('gx', f'{H}LL + j')} + grr[{H}LL + j]);\n"
        body += f"  const {C} nn = tanh({ld('gx', f'{2 * H}LL + j')} + r * grn_v);\n"
        body += f"  const {C} h = ({C}(1) - z) * nn + z * hprev;\n"
        if train:
            for k, nm in enumerate(("r", "z", "nn")):
                body += sv("acts", f"{k * H}LL + j", nm)
            body += sv("grn", "j", "grn_v")
    if g.proj:
        body += f"  hp[sb * {H}LL + j] = {store_expr(g.wdt, 'h', C)};\n"
    else:
        body += f"  hs[sb * {Ho}LL + j] = {store_expr(g.wdt, 'h', C)};\n"
        body += sv("y", "j", "h")
    return _spec(f"rnnfwd{g.mode.lower()}", p, body, g.B * H, g.D), p.args


def _fwd_commit(g: _Geo) -> tuple:
    """Projection: h = hq (the GEMM result) for active sequences, to the state and y."""
    R, C, Ho = g.roles, g.C, g.Ho
    p = _Params()
    p.ptr(C, "hq", "hq", const=True)
    p.ptr(STORAGE[g.wdt], "hs", "hs")
    p.ptr(STORAGE[R["y"].dtype], "y", "y")
    _step_params(p)
    body = _head(g, Ho) + "  if (!act) return;\n"
    body += f"  const {C} h = hq[sb * {Ho}LL + j];\n"
    body += f"  hs[sb * {Ho}LL + j] = {store_expr(g.wdt, 'h', C)};\n"
    body += f"  {g.ref('y', 'j')} = {store_expr(R['y'].dtype, 'h', C)};\n"
    return _spec("rnnfwdcommit", p, body, g.B * Ho, g.D), p.args


def _bwd_proj_in(g: _Geo) -> tuple:
    """Projection backward, before the cell: dr = dy + dh_next (saved), its GEMM operand, dh_next = 0."""
    R, C, Ho = g.roles, g.C, g.Ho
    p = _Params()
    p.ptr(STORAGE[R["dy"].dtype], "dy", "dy", const=True)
    p.ptr(C, "dhs", "dhs")
    p.ptr(STORAGE[g.wdt], "drs", "drs")
    p.ptr(STORAGE[R["dr"].dtype], "dr", "dr")
    _step_params(p, True)
    body = _head(g, Ho)
    body += f"  if (!act) {{ drs[sb * {Ho}LL + j] = {store_expr(g.wdt, f'{C}(0)', C)}; return; }}\n"
    body += f"  const {C} v = {load_expr(R['dy'].dtype, g.ref('dy', 'j'), C)} + dhs[sb * {Ho}LL + j];\n"
    body += f"  {g.ref('dr', 'j')} = {store_expr(R['dr'].dtype, 'v', C)};\n"
    body += f"  drs[sb * {Ho}LL + j] = {store_expr(g.wdt, 'v', C)};\n"
    body += f"  dhs[sb * {Ho}LL + j] = {C}(0);\n"
    return _spec("rnnbwdproj", p, body, g.B * Ho, g.D), p.args


def _bwd_cell(g: _Geo) -> tuple:
    R, C, H, gH, Ho = g.roles, g.C, g.H, g.gH, g.Ho
    p = _Params()
    if g.proj:
        p.ptr(C, "dhb", "dhb", const=True)
    else:
        p.ptr(STORAGE[R["dy"].dtype], "dy", "dy", const=True)
    p.ptr(C, "dhs", "dhs")
    if g.mode == "LSTM":
        p.ptr(C, "dcs", "dcs")
    p.ptr(STORAGE[g.wdt], "dG", "dG")
    for role in ("y", "acts", "c_all", "grn", "hx", "cx", "dgates", "dgrn"):
        if role in R:
            p.ptr(STORAGE[R[role].dtype], role, role, const=role not in ("dgates", "dgrn"))
    if g.clip:
        p.scalar(C, "lclip", "lclip")
        p.scalar(C, "rclip", "rclip")
    _step_params(p, True)

    def ld(role, idx, prev=False):
        return load_expr(R[role].dtype, (g.prev_ref if prev else g.ref)(role, idx), C)

    def sv(role, idx, val):
        return f"  {g.ref(role, idx)} = {store_expr(R[role].dtype, val, C)};\n"

    def dg(k, val):
        return f"  dG[sb * {gH}LL + {k * H}LL + j] = {store_expr(g.wdt, val, C)};\n"
    zero = "".join(dg(k, f"{C}(0)").strip() + " " for k in range(g.g))
    body = _head(g, H) + f"  if (!act) {{ {zero}return; }}\n"
    body += "  const bool first = rev ? (t == lens[b] - 1) : (t == 0);\n"
    body += "  const long long prow = (d ? p1 : p0) + b * %dLL;\n  (void)first; (void)prow;\n" % g.bstride
    if g.proj:
        body += f"  const {C} dh = dhb[sb * {H}LL + j];\n"
    else:
        body += f"  const {C} dh = {ld('dy', 'j')} + dhs[sb * {Ho}LL + j];\n"
    if g.mode in ("RELU", "TANH"):
        body += f"  const {C} hv = {ld('y', 'j')};\n"
        if g.mode == "RELU":
            body += f"  const {C} dp = (hv != hv) ? hv : (hv > {C}(0) ? dh : {C}(0));\n"
        else:
            body += f"  const {C} dp = dh * ({C}(1) - hv * hv);\n"
        body += sv("dgates", "j", "dp") + dg(0, "dp")
        body += f"  dhs[sb * {Ho}LL + j] = {C}(0);\n"
    elif g.mode == "LSTM":
        for k, nm in enumerate(("i", "f", "gg", "o")):
            body += f"  const {C} {nm} = {ld('acts', f'{k * H}LL + j')};\n"
        body += f"  const {C} c = {ld('c_all', 'j')};\n  const {C} tc = tanh(c);\n"
        body += f"  const {C} do_ = dh * tc * o * ({C}(1) - o);\n"
        body += f"  {C} dc = dh * o * ({C}(1) - tc * tc) + dcs[sb * {H}LL + j];\n"
        if g.clip:
            body += f"  dc = dc * ((c > lclip && c < rclip) ? {C}(1) : {C}(0));\n"
        body += f"  const {C} di = dc * gg * i * ({C}(1) - i);\n"
        body += f"  const {C} dgg = dc * i * ({C}(1) - gg * gg);\n"
        cx = load_expr(R["cx"].dtype, g.state_ref("cx", "j"), C) if "cx" in R else f"{C}(0)"
        body += f"  const {C} cprev = first ? {cx} : {ld('c_all', 'j', prev=True)};\n"
        if "cx" in R:
            body += f"  const {C} df = dc * cprev * f * ({C}(1) - f);\n"
        else:
            body += f"  const {C} df = first ? {C}(0) : dc * cprev * f * ({C}(1) - f);\n"
        body += f"  dcs[sb * {H}LL + j] = dc * f;\n"
        for k, nm in enumerate(("di", "df", "dgg", "do_")):
            body += sv("dgates", f"{k * H}LL + j", nm) + dg(k, nm)
        if not g.proj:
            body += f"  dhs[sb * {Ho}LL + j] = {C}(0);\n"
    else:  # GRU
        for k, nm in enumerate(("r", "z", "nn")):
            body += f"  const {C} {nm} = {ld('acts', f'{k * H}LL + j')};\n"
        hx = load_expr(R["hx"].dtype, g.state_ref("hx", "j"), C) if "hx" in R else f"{C}(0)"
        body += f"  const {C} hprev = first ? {hx} : {ld('y', 'j', prev=True)};\n"
        body += f"  const {C} dpn = dh * ({C}(1) - z) * ({C}(1) - nn * nn);\n"
        body += f"  const {C} dz = dh * (hprev - nn) * z * ({C}(1) - z);\n"
        body += f"  const {C} dgrn_v = dpn * r;\n"
        body += f"  const {C} dr_ = dpn * {ld('grn', 'j')} * r * ({C}(1) - r);\n"
        for k, nm in enumerate(("dr_", "dz", "dpn")):
            body += sv("dgates", f"{k * H}LL + j", nm)
        body += sv("dgrn", "j", "dgrn_v")
        body += dg(0, "dr_") + dg(1, "dz") + dg(2, "dgrn_v")
        body += f"  dhs[sb * {Ho}LL + j] = dh * z;\n"
    return _spec(f"rnnbwd{g.mode.lower()}", p, body, g.B * H, g.D), p.args


def _bind(args, ints: dict) -> list:
    """Fill a kernel's per-step int parameters (in order t0 t1 r0 r1 [p0 p1])."""
    out, it = [], iter(ints)
    for a in args:
        if a[0] == "int" and a[1] is None:
            out.append(("int", ints[next(it)]))
        else:
            out.append(a)
    return out


def _state_copy(g: _Geo, prog: Program, src_role, dst, width: int, to_state: bool):
    """Initial state from a role (or zero) into scratch, or scratch into a role."""
    D, B = g.D, g.B
    packed = (B * width, width, 1)
    if to_state:
        dst_name, dst_dtype = dst
        src = (src_role, g.st(src_role)) if src_role else None
        spec, args = copy_spec((D, B, width), src, (dst_name, packed), dst_dtype,
                               g.roles[src_role].dtype if src_role else None)
    else:
        src_name, src_dtype = dst
        spec, args = copy_spec((D, B, width), (src_name, packed), (src_role, g.st(src_role)),
                               g.roles[src_role].dtype, src_dtype)
    prog.instrs.append(Launch(spec, args))


# The scratch of each sweep: (name, dtype: "w" the weights' | "c" the compute type, width per
# (direction, sequence), needed: always | LSTM | proj), in allocation order.  The forward sweep
# carries h and c, the backward one their gradients.
_SCRATCH = {
    False: (("hs", "w", "Ho", None), ("gr", "c", "gH", None), ("cs", "c", "H", "LSTM"),
            ("hp", "w", "H", "proj"), ("hq", "c", "Ho", "proj")),
    True: (("dhs", "c", "Ho", None), ("dG", "w", "gH", None), ("dcs", "c", "H", "LSTM"),
           ("drs", "w", "Ho", "proj"), ("dhb", "c", "H", "proj")),
}
# The carried state per sweep: (role it starts from, scratch, role it ends in) for h (width Ho)
# and, LSTM only, c (width H); a missing start role is zero.
_STATE = {False: (("hx", "hs", "hy"), ("cx", "cs", "cy")), True: (("dhy", "dhs", "dhx"), ("dcy", "dcs", "dcx"))}


def _program(op, backward: bool) -> tuple:
    """(geometry, program) of a recurrence sweep: its scratch allocated, the state copied in."""
    g = _Geo(op)
    width, dtype = {"Ho": g.Ho, "gH": g.gH, "H": g.H}, {"w": g.wdt, "c": g.ct}
    need = {None: True, "LSTM": g.mode == "LSTM", "proj": g.proj}
    scratch = {name: (dtype[dt], g.D * g.B * width[w]) for name, dt, w, when in _SCRATCH[backward] if need[when]}
    buffers = {role: t.dtype for role, t in g.roles.items() if not t.is_by_value}
    buffers.update({name: dt for name, (dt, _) in scratch.items()})
    buffers["lens"] = "int32"
    prog = Program(buffers, {k: n for k, (_, n) in scratch.items()},
                   {"lens": np.asarray(g.lengths, np.int32)}, dict(g.roles),
                   tuple(r for r, t in g.roles.items() if t.is_by_value))
    for (src, buf, _), w, on in zip(_STATE[backward], (g.Ho, g.H), (True, g.mode == "LSTM")):
        if on:
            _state_copy(g, prog, src if src in g.roles else None, (buf, scratch[buf][0]), w, True)
    return g, prog


def _state_out(g: _Geo, prog: Program, backward: bool) -> None:
    """The carried state into the sweep's end roles the op has."""
    for (_, buf, dst), w in zip(_STATE[backward], (g.Ho, g.H)):
        if dst in g.roles:
            _state_copy(g, prog, dst, (buf, prog.buffers[buf]), w, False)


def _weight_gemm(g: _Geo, weight: str, transa: bool, src: str, k: int, dst: str, m: int, beta: float) -> Gemm:
    """Every direction's ``weight`` (op(W), m x k) times its packed (B, k) scratch ``src`` into the
    packed (B, m) scratch ``dst`` (+ beta dst), batched over the directions."""
    w = g.roles[weight]
    return Gemm(transa, False, m, g.B, k, (weight, 0), w.strides[1], w.strides[0], (src, 0), k, g.B * k,
                (dst, 0), m, g.B * m, g.D, beta, g.compute)


def bias_spec(g: _Geo, biases: tuple) -> tuple:
    """(spec, args) setting every row of gx to the sum of the ``biases`` roles (b_x, b_h: (D, 1,
    g*H); GRU: b_h of gates r and z only), before the input projection's GEMM adds x W_in^T."""
    R, gx = g.roles, g.roles["gx"]
    C = _C(gx.dtype)
    D, N, gH = g.D, g.N, g.gH
    p = _Params()
    p.ptr(STORAGE[gx.dtype], "gx", "gx")
    terms = []
    for role in biases:
        t = R[role]
        p.ptr(STORAGE[t.dtype], role, role, const=True)
        v = load_expr(t.dtype, f"{role}[{t.strides[0]}LL * d + j]", C)
        terms.append(f"(j < {2 * g.H}LL ? {v} : {C}(0))" if role == "b_h" and g.mode == "GRU" else v)
    s = gx.strides
    body = f"""  const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= {D * N * gH}LL) return;
  const long long j = n % {gH}, r = (n / {gH}) % {N}, d = n / ({gH}LL * {N});
  gx[{s[0]}LL * d + {s[1]}LL * r + j] = {store_expr(gx.dtype, " + ".join(terms), C)};
"""
    return _spec("rnnbias", p, body, D * N * gH), p.args


def _projection(g: _Geo) -> list:
    """The op's ``x`` form: gx = x W_in^T (+ b_x + b_h, filled in first: the GEMM then adds with
    beta 1), one GEMM batched over the directions (x's direction stride is 0)."""
    R = g.roles
    x, w, gx = R["x"], R["w_in"], R["gx"]
    biases = tuple(r for r in ("b_x", "b_h") if r in R)
    out = [Launch(*bias_spec(g, biases))] if biases else []
    out.append(Gemm(True, False, g.gH, g.N, w.dims[2], ("w_in", 0), w.strides[1], w.strides[0], ("x", 0), x.strides[1],
                    x.strides[0], ("gx", 0), gx.strides[1], gx.strides[0], g.D, 1.0 if biases else 0.0, g.compute))
    return out


def forward_program(op) -> Program:
    g, prog = _program(op, False)
    R = g.roles
    D, B, H, gH, Ho = g.D, g.B, g.H, g.gH, g.Ho
    ins = prog.instrs
    if "x" in R:
        ins.extend(_projection(g))
    if "y_in" in R and "fill" not in R:
        spec, args = copy_spec((D, g.N, Ho), ("y_in", g.st("y_in")), ("y", g.st("y")), R["y"].dtype, R["y_in"].dtype)
        ins.append(Launch(spec, args, skip_if_same=("y_in", "y")))
    if g.padded and "fill" in R:
        spec, args = pad_spec(D, g.T, B, Ho, g.layout, ("y", g.st("y")), R["y"].dtype, "fill")
        ins.append(Launch(spec, args))
    rec = _weight_gemm(g, "w_rec", True, "hs", Ho, "gr", gH, 0.0)
    cell, cell_args = _fwd_cell(g)
    if g.proj:
        pj = _weight_gemm(g, "wr", True, "hp", H, "hq", Ho, 0.0)
        commit, commit_args = _fwd_commit(g)
    for ints in g.steps(False):
        ins.append(rec)
        ins.append(Launch(cell, _bind(cell_args, ints)))
        if g.proj:
            ins.append(pj)
            ins.append(Launch(commit, _bind(commit_args, ints)))
    _state_out(g, prog, False)
    return prog


def backward_program(op) -> Program:
    g, prog = _program(op, True)
    R = g.roles
    ins = prog.instrs
    if g.padded:
        spec, args = pad_spec(g.D, g.T, g.B, g.gH, g.layout, ("dgates", g.st("dgates")), R["dgates"].dtype, None)
        ins.append(Launch(spec, args))
    rec = _weight_gemm(g, "w_rec", False, "dG", g.gH, "dhs", g.Ho, 1.0)
    cell, cell_args = _bwd_cell(g)
    if g.proj:
        pj = _weight_gemm(g, "wr", False, "drs", g.Ho, "dhb", g.H, 0.0)
        pin, pin_args = _bwd_proj_in(g)
    for ints in g.steps(True):
        if g.proj:
            ins.append(Launch(pin, _bind(pin_args, ints)))
            ins.append(pj)
        ins.append(Launch(cell, _bind(cell_args, ints)))
        ins.append(rec)
    _state_out(g, prog, True)
    return prog


# -- Rng --------------------------------------------------------------------------------------------

def keep_threshold(p: float) -> int:
    return int(math.ceil(float(p) * 4294967296.0))


def _mask_store(dtype: str) -> str:
    """The stored 0/1 mask value: integers directly, floats through their own type (no float
    expression in a double kernel)."""
    if dtype in ("float32", "float64", "float16", "bfloat16"):
        T = "double" if dtype == "float64" else "float"
        return store_expr(dtype, f"(keep ? {T}(1) : {T}(0))", T)
    return f"({STORAGE[dtype]})(keep ? 1 : 0)"


RNG_SCRATCH = {"cnt": (1, "uint32")}  # the mask kernel's ticket counter, per (device, stream) (steps.ScratchRun)


def rng_specs(op, epilogue=None) -> list:
    """[the mask kernel] for an Rng op.  ``epilogue``: the element-wise ops on the mask that follow
    it (a FusedGroup: dropout's y = x * scale * mask), applied per element by the mask kernel,
    which still stores the mask (one kernel for both, the same arithmetic as the element-wise
    kernel it replaces).  With ``offset_out`` (which may alias ``offset``: dropout's states
    advance in place) the kernel also advances the offset: every block reads ``offset`` first,
    then takes a ticket (``cnt``, an ``("extra", "cnt", "ptr")`` argument: a zeroed counter kept
    per stream, ``RNG_SCRATCH``); the block with the last ticket has seen every other block's
    read done, writes ``offset_out`` and sets the counter back to 0 for the next launch (work on
    one stream is ordered, so launches never share a count)."""
    a = op.attrs
    y = op.outputs["y"]
    numel = int(np.prod(y.dims))
    nblk = -(-numel // 4)
    advance = "offset_out" in op.outputs
    p = _Params()
    p.ptr("int", "seed", "seed", const=True)
    p.ptr("int", "offset", "offset", const=True)
    p.ptr(STORAGE[y.dtype], "y", "y")
    args = [("buf", op.inputs["seed"].uid), ("buf", op.inputs["offset"].uid), ("buf", y.uid)]
    coords = []  # the element's coordinates over y's dims, innermost first
    for k in range(len(y.dims) - 1, -1, -1):
        coords.append(f"      const long long i{k} = rem % {y.dims[k]}LL; rem /= {y.dims[k]}LL;")

    def offset(strides) -> str:
        return " + ".join([f"i{k} * {s}LL" for k, s in enumerate(strides) if s] or ["0LL"])
    epi = []
    if epilogue is not None:
        T = epilogue.compute_type()
        decls, more = _params(epilogue, T)  # loads, stores, by-value scalars: as an element-wise kernel's
        p.decls += decls
        args += more
        env = {y.uid: f"(keep ? {T}(1) : {T}(0))", **_scalar_env(epilogue)}
        for uid, t in epilogue.loads.items():
            epi.append(f"      const {T} l{uid} = {load_expr(t.dtype, f'p{uid}[{offset(bstrides(t, y.dims))}]', T)};")
            env[uid] = f"l{uid}"
        epi += ["      " + line for line in emit_chain(epilogue.prologue, env, T)]
        epi += [f"      p{uid}[{offset(t.strides)}] = {store_expr(t.dtype, env[uid], T)};"
                for uid, t in epilogue.stores.items()]
    tail = ""
    if advance:
        p.decls += ["int* offset_out", "unsigned int* cnt"]
        args += [("buf", op.outputs["offset_out"].uid), ("extra", "cnt", "ptr")]
        adv = int(a.get("advance", nblk))
        tail = f"""  // the offset advance: the block holding the last ticket writes it (every block read offset above)
  __syncthreads();
  if (threadIdx.x == 0) {{
    __threadfence();
    if (atomicAdd(cnt, 1u) == gridDim.x - 1u) {{
      const unsigned long long v = base + {adv}ULL;
      offset_out[0] = (int)(unsigned int)v;
      offset_out[1] = (int)(unsigned int)(v >> 32);
      cnt[0] = 0u;  // ready for the next launch
    }}
  }}
"""
    body = f"""  const long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long base = ((unsigned long long)(unsigned int)offset[1] << 32) | (unsigned int)offset[0];
  if (q < {nblk}LL) {{
    const unsigned long long blk = base + {int(a.get('block_offset', 0))}ULL + (unsigned long long)q;
    unsigned int c0 = (unsigned int)blk, c1 = (unsigned int)(blk >> 32), c2 = 0u, c3 = 0u;
    unsigned int k0 = (unsigned int)seed[0], k1 = (unsigned int)seed[1];
    for (int r = 0; r < 10; ++r) {{
      if (r) {{ k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }}
      const unsigned long long m0 = 0xD2511F53ull * (unsigned long long)c0;
      const unsigned long long m1 = 0xCD9E8D57ull * (unsigned long long)c2;
      const unsigned int n0 = (unsigned int)(m1 >> 32) ^ c1 ^ k0, n2 = (unsigned int)(m0 >> 32) ^ c3 ^ k1;
      c0 = n0; c1 = (unsigned int)m1; c2 = n2; c3 = (unsigned int)m0;
    }}
    const unsigned int words[4] = {{c0, c1, c2, c3}};
    for (int lane = 0; lane < 4; ++lane) {{
      const long long e = q * 4 + lane;
      if (e >= {numel}LL) break;
      const bool keep = (unsigned long long)words[lane] >= {keep_threshold(a['drop_probability'])}ULL;
      long long rem = e;
{chr(10).join(coords)}
      y[{offset(y.strides)}] = {_mask_store(y.dtype)};
{chr(10).join(epi)}
    }}
  }}
{tail}"""
    src_emu = EMU_TICKETS if advance else ""
    mask = _spec("rng" if epilogue is None else "rngapply", p, body, nblk, prelude=src_emu)
    mask.args = args
    return [mask]


# -- the engine's entry points ------------------------------------------------------------------------

def build(step) -> list:
    op = step.op
    if op.kind == "Rng":
        y = op.outputs["y"]
        specs = rng_specs(op, step.epilogues.get("y"))
        temps = [y] if y.is_virtual else []
        return [ScratchRun(specs, RNG_SCRATCH, temps) if "offset_out" in op.outputs else KernelRun(specs, temps)]
    prog = forward_program(op) if op.kind == "RNNRecurrence" else backward_program(op)
    runner = ProgramRun(prog, op)
    return [PyRun(runner.run, runner.kernels(), pointers=True, launcher=runner.launcher)]  # reads addresses
