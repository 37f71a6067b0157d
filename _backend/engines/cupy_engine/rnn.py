"""GPU kernels of the RNN recurrence ops and of ``Rng`` (definitions in _backend/ops/rnn.py).

``RNNRecurrence`` / ``RNNRecurrenceBackward`` become a *program* (pure Python, built once per
plan): per time step ONE cuBLAS GEMM over all gates, batched over the directions
(cublasGemmStridedBatchedEx; both directions advance in the same step, one from each end), and
ONE generated cell kernel for every (direction, sequence, unit); LSTM projection adds one GEMM
and one small kernel per step.  The recurrent state lives in scratch buffers (h in the weight
dtype, as the next GEMM's operand; c and the GEMM results in float, double for DOUBLE); a
sequence past its length is inactive and keeps its state.  Running a program: the first call
with a given set of buffer addresses runs eagerly (every kernel compiled, scratch allocated);
the next call captures the whole step loop into a CUDA graph, later calls replay it (one
launch per layer); addresses, stream and by-value scalars key the graphs
(``CUDNN_COMPAT_RNN_GRAPHS=0`` turns capture off).  A persistent kernel would save the launch
gaps too but needs the weights resident in shared memory/registers, which does not fit at
H = 512 (4 MiB of LSTM fp32 weights), so the GEMM + cell pair stays.

``Rng``: one thread per Philox4x32-10 block of 4 mask elements, exactly the reference's
counter layout and threshold (bit-identical masks); a second 1-thread kernel advances the
offset, so ``offset_out`` may alias ``offset``.

Programs are also run by the tests on the CPU (tests/test_rnn_gpu_program.py: GEMMs in NumPy,
kernels through tests/kernel_emu.py), which checks the step sequencing and every kernel's
index math against the reference engine without a GPU.
"""
from __future__ import annotations

import collections
import ctypes
import math
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from ... import config as _config
from ...math_policy import gemm_compute
from ...ops.rnn import GATES, is_padded, row_map, rows_of
from . import runtime
from .codegen import PREAMBLE, STORAGE, KernelSpec, load_expr, name_kernel, store_expr
from .steps import KernelRun, PyRun

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

@dataclass
class Gemm:
    """cuBLAS column-major C = op(A) op(B) (+ beta C), batched with element strides.
    Operands are (buffer, element offset); dtypes are IR names; ``compute`` 'float32' |
    'float64' | 'tf32'."""

    transa: bool
    transb: bool
    m: int
    n: int
    k: int
    a: tuple
    lda: int
    sa: int
    b: tuple
    ldb: int
    sb: int
    c: tuple
    ldc: int
    sc: int
    batch: int
    beta: float
    compute: str


@dataclass
class Launch:
    """A kernel launch; ``args`` per parameter: ('ref', buffer, element offset), ('int', v),
    ('scalar', role) (a by-value input, as the spec's float type)."""

    spec: KernelSpec
    args: list
    skip_if_same: tuple = ()  # (buffer, buffer): skipped when both name the same memory


@dataclass
class Program:
    buffers: dict  # name -> dtype, for roles (op tensors) and scratch
    scratch: dict  # name -> element count
    consts: dict  # name -> NumPy array (uploaded once)
    roles: dict  # name -> Tensor of the op
    scalars: tuple  # by-value roles read
    instrs: list = field(default_factory=list)

    def kernels(self) -> list:
        seen, out = set(), []
        for ins in self.instrs:
            if isinstance(ins, Launch) and ins.spec.name not in seen:
                seen.add(ins.spec.name)
                out.append(ins.spec)
        return out


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


def _spec(prefix: str, params: _Params, body: str, threads: int, gy: int = 1) -> KernelSpec:
    src = PREAMBLE + f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params.decls)}) {{\n' \
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


def _program(op, g: _Geo, scratch: dict) -> Program:
    buffers = {role: t.dtype for role, t in g.roles.items() if not t.is_by_value}
    buffers.update({name: dt for name, (dt, _) in scratch.items()})
    buffers["lens"] = "int32"
    return Program(buffers, {k: n for k, (_, n) in scratch.items()},
                   {"lens": np.asarray(g.lengths, np.int32)}, dict(g.roles),
                   tuple(r for r, t in g.roles.items() if t.is_by_value))


def forward_program(op) -> Program:
    g = _Geo(op)
    R = g.roles
    D, B, H, gH, Ho, wdt, ct = g.D, g.B, g.H, g.gH, g.Ho, g.wdt, g.ct
    scratch = {"hs": (wdt, D * B * Ho), "gr": (ct, D * B * gH)}
    if g.mode == "LSTM":
        scratch["cs"] = (ct, D * B * H)
    if g.proj:
        scratch.update(hp=(wdt, D * B * H), hq=(ct, D * B * Ho))
    prog = _program(op, g, scratch)
    ins = prog.instrs
    _state_copy(g, prog, "hx" if "hx" in R else None, ("hs", wdt), Ho, True)
    if g.mode == "LSTM":
        _state_copy(g, prog, "cx" if "cx" in R else None, ("cs", ct), H, True)
    if "y_in" in R and "fill" not in R:
        spec, args = copy_spec((D, g.N, Ho), ("y_in", g.st("y_in")), ("y", g.st("y")), R["y"].dtype, R["y_in"].dtype)
        ins.append(Launch(spec, args, skip_if_same=("y_in", "y")))
    if g.padded and "fill" in R:
        spec, args = pad_spec(D, g.T, B, Ho, g.layout, ("y", g.st("y")), R["y"].dtype, "fill")
        ins.append(Launch(spec, args))
    w = R["w_rec"]
    rec = Gemm(True, False, gH, B, Ho, ("w_rec", 0), w.strides[1], w.strides[0], ("hs", 0), Ho, B * Ho,
               ("gr", 0), gH, B * gH, D, 0.0, g.compute)
    cell, cell_args = _fwd_cell(g)
    if g.proj:
        wr = R["wr"]
        pj = Gemm(True, False, Ho, B, H, ("wr", 0), wr.strides[1], wr.strides[0], ("hp", 0), H, B * H,
                  ("hq", 0), Ho, B * Ho, D, 0.0, g.compute)
        commit, commit_args = _fwd_commit(g)
    for s in range(g.T):
        ts = g.times(s, False)
        if not g.active(ts):
            continue
        ints = {"t0": ts[0], "t1": ts[-1], "r0": g.row_base(ts[0]), "r1": g.row_base(ts[-1])}
        ins.append(rec)
        ins.append(Launch(cell, _bind(cell_args, ints)))
        if g.proj:
            ins.append(pj)
            ins.append(Launch(commit, _bind(commit_args, ints)))
    if "hy" in R:
        _state_copy(g, prog, "hy", ("hs", wdt), Ho, False)
    if "cy" in R:
        _state_copy(g, prog, "cy", ("cs", ct), H, False)
    return prog


def backward_program(op) -> Program:
    g = _Geo(op)
    R = g.roles
    D, B, H, gH, Ho, wdt, ct = g.D, g.B, g.H, g.gH, g.Ho, g.wdt, g.ct
    scratch = {"dhs": (ct, D * B * Ho), "dG": (wdt, D * B * gH)}
    if g.mode == "LSTM":
        scratch["dcs"] = (ct, D * B * H)
    if g.proj:
        scratch.update(drs=(wdt, D * B * Ho), dhb=(ct, D * B * H))
    prog = _program(op, g, scratch)
    ins = prog.instrs
    _state_copy(g, prog, "dhy" if "dhy" in R else None, ("dhs", ct), Ho, True)
    if g.mode == "LSTM":
        _state_copy(g, prog, "dcy" if "dcy" in R else None, ("dcs", ct), H, True)
    if g.padded:
        spec, args = pad_spec(D, g.T, B, gH, g.layout, ("dgates", g.st("dgates")), R["dgates"].dtype, None)
        ins.append(Launch(spec, args))
    w = R["w_rec"]
    rec = Gemm(False, False, Ho, B, gH, ("w_rec", 0), w.strides[1], w.strides[0], ("dG", 0), gH, B * gH,
               ("dhs", 0), Ho, B * Ho, D, 1.0, g.compute)
    cell, cell_args = _bwd_cell(g)
    if g.proj:
        wr = R["wr"]
        pj = Gemm(False, False, H, B, Ho, ("wr", 0), wr.strides[1], wr.strides[0], ("drs", 0), Ho, B * Ho,
                  ("dhb", 0), H, B * H, D, 0.0, g.compute)
        pin, pin_args = _bwd_proj_in(g)
    for s in range(g.T):
        ts = g.times(s, True)
        if not g.active(ts):
            continue
        prev = [t + 1 if rev else t - 1 for t, rev in zip(ts, g.dirs)]
        ints = {"t0": ts[0], "t1": ts[-1], "r0": g.row_base(ts[0]), "r1": g.row_base(ts[-1]),
                "p0": g.row_base(prev[0]), "p1": g.row_base(prev[-1])}
        if g.proj:
            ins.append(Launch(pin, _bind(pin_args, ints)))
            ins.append(pj)
        ins.append(Launch(cell, _bind(cell_args, ints)))
        ins.append(rec)
    if "dhx" in R:
        _state_copy(g, prog, "dhx", ("dhs", ct), Ho, False)
    if "dcx" in R:
        _state_copy(g, prog, "dcx", ("dcs", ct), H, False)
    return prog


# -- running programs on the GPU ---------------------------------------------------------------------

CUDA_R = {"float32": 0, "float64": 1, "float16": 2}
COMPUTE = {"float32": 68, "float64": 70, "tf32": 77}  # CUBLAS_COMPUTE_32F, _64F, _32F_FAST_TF32
CUBLAS_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20


class Cublas:
    """One cuBLAS handle per device through ctypes (the C API, independent of CuPy's bindings),
    with its own workspace so GEMMs can be captured into CUDA graphs."""

    _lock = threading.Lock()
    _by_device: dict = {}
    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            cls._lib = _load_cublas()
        return cls._lib

    @classmethod
    def get(cls) -> "Cublas":
        cp = runtime.cupy()
        dev = cp.cuda.runtime.getDevice()
        with cls._lock:
            h = cls._by_device.get(dev)
            if h is None:
                h = cls._by_device[dev] = Cublas(cls.lib())
        return h

    def __init__(self, lib):
        cp = runtime.cupy()
        self.lib = lib
        handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
        _check(lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(int(self.workspace.data.ptr)),
                                         ctypes.c_size_t(WORKSPACE_BYTES)), "cublasSetWorkspace")
        self.scalars = {(dt, v): (ctypes.c_double if dt == "float64" else ctypes.c_float)(v)
                        for dt in ("float32", "float64") for v in (0.0, 1.0)}

    def set_stream(self, stream_ptr: int) -> None:
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")

    def gemm(self, gm: Gemm, a: int, adt: str, b: int, bdt: str, c: int, cdt: str) -> None:
        sdt = "float64" if gm.compute == "float64" else "float32"
        st = self.lib.cublasGemmStridedBatchedEx(
            self.handle, int(gm.transa), int(gm.transb), gm.m, gm.n, gm.k, ctypes.byref(self.scalars[(sdt, 1.0)]),
            ctypes.c_void_p(a), CUDA_R[adt], gm.lda, ctypes.c_longlong(gm.sa),
            ctypes.c_void_p(b), CUDA_R[bdt], gm.ldb, ctypes.c_longlong(gm.sb),
            ctypes.byref(self.scalars[(sdt, float(gm.beta))]),
            ctypes.c_void_p(c), CUDA_R[cdt], gm.ldc, ctypes.c_longlong(gm.sc), gm.batch, COMPUTE[gm.compute],
            CUBLAS_GEMM_DEFAULT)
        _check(st, "cublasGemmStridedBatchedEx")


def _check(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


def _load_cublas():
    names = []
    try:
        from cuda import pathfinder
        loaded = pathfinder.load_nvidia_dynamic_lib("cublas")
        if getattr(loaded, "abs_path", None):
            names.append(loaded.abs_path)
    except Exception:  # not installed / not found: try the loader
        pass
    names += ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    errors = []
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            errors.append(f"{name}: {e}")
    else:
        raise RuntimeError("libcublas not found (" + "; ".join(errors) + ")")
    vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll,
                                               i, i, i]
    for fn in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2, lib.cublasGemmStridedBatchedEx):
        fn.restype = i
    return lib


_SCALAR = {"float": np.float32, "double": np.float64}


class _Entry:
    __slots__ = ("steps", "scratch", "graph", "uses")

    def __init__(self, steps, scratch):
        self.steps, self.scratch, self.graph, self.uses = steps, scratch, None, 0


class ProgramRun:
    """Runs a Program inside a cupy plan: resolve addresses, then eager / capture / replay."""

    MAX_GRAPHS = 8

    def __init__(self, prog: Program, op):
        self.prog, self.op = prog, op
        self.uids = {role: t.uid for role, t in op.inputs.items()}
        self.uids.update({role: t.uid for role, t in op.outputs.items()})
        self.cache: "collections.OrderedDict" = collections.OrderedDict()
        self.consts: dict = {}
        self.lock = threading.Lock()

    def kernels(self) -> list:
        return self.prog.kernels()

    def _resolve(self, ptrs: dict, scalars: dict, scratch: dict) -> tuple:
        """Instructions -> (steps with every argument fixed, the cuBLAS handle)."""
        from ... import dtypes
        size = {name: dtypes.itemsize(dt) for name, dt in self.prog.buffers.items()}
        base = dict(ptrs)
        base.update({k: int(v.data.ptr) for k, v in scratch.items()})
        base.update({k: int(v.data.ptr) for k, v in self.consts.items()})

        def addr(ref):
            return base[ref[0]] + ref[1] * size[ref[0]]
        blas = Cublas.get()
        steps = []
        for ins in self.prog.instrs:
            if isinstance(ins, Gemm):
                bt = self.prog.buffers
                steps.append(("gemm", ins, addr(ins.a), bt[ins.a[0]], addr(ins.b), bt[ins.b[0]], addr(ins.c), bt[ins.c[0]]))
                continue
            if ins.skip_if_same and base[ins.skip_if_same[0]] == base[ins.skip_if_same[1]]:
                continue
            args = []
            for a, decl in zip(ins.args, ins.spec.params):
                if a[0] == "ref":
                    args.append(np.uint64(addr(a[1:])))
                elif a[0] == "int":
                    args.append(np.int64(a[1]))
                else:
                    args.append(_SCALAR[decl.split()[0]](float(scalars[a[1]])))
            steps.append(("kernel", runtime.function(ins.spec), ins.spec.grid, ins.spec.block, tuple(args)))
        return steps, blas

    def _execute(self, steps, blas, stream_ptr: int) -> None:
        from .gemm import _LOCK  # the cuBLAS handle is shared with the engine's matmuls
        with _LOCK:
            blas.set_stream(stream_ptr)
            for s in steps:
                if s[0] == "gemm":
                    blas.gemm(*s[1:])
                else:
                    s[1](s[2], s[3], s[4])
                    runtime.LAUNCHES[0] += 1

    def run(self, env, ctx) -> None:
        cp = runtime.cupy()
        stream = cp.cuda.get_current_stream()
        if not self.consts:
            self.consts = {k: cp.asarray(v) for k, v in self.prog.consts.items()}
        ptrs = {role: runtime.pointer(env[uid]) for role, uid in self.uids.items()
                if not self.prog.roles[role].is_by_value}
        scalars = {role: float(env[self.uids[role]]) for role in self.prog.scalars}
        key = (int(stream.ptr), tuple(sorted(ptrs.items())), tuple(sorted(scalars.items())))
        with self.lock:
            entry = self.cache.get(key)
            if entry is not None:
                self.cache.move_to_end(key)
        if entry is None:
            scratch = {k: cp.empty(n, dtype=np.dtype(_np_dtype(self.prog.buffers[k])))
                       for k, n in self.prog.scratch.items()}
            steps, blas = self._resolve(ptrs, scalars, scratch)
            entry = _Entry((steps, blas), scratch)
            with self.lock:
                self.cache[key] = entry
                while len(self.cache) > self.MAX_GRAPHS:
                    self.cache.popitem(last=False)
        steps, blas = entry.steps
        entry.uses += 1
        if entry.graph is None and entry.uses >= 2 and _graphs_enabled():
            entry.graph = self._capture(steps, blas) or False
        if entry.graph:
            entry.graph.launch(stream=stream)
        else:
            self._execute(steps, blas, int(stream.ptr))

    def _capture(self, steps, blas):
        cp = runtime.cupy()
        cap = cp.cuda.Stream(non_blocking=True)
        try:
            with cap:
                cap.begin_capture()
                try:
                    self._execute(steps, blas, int(cap.ptr))
                finally:
                    graph = cap.end_capture()
            return graph
        except Exception:  # capture unsupported here: stay eager (correct, slower)
            return None


def _np_dtype(name: str):
    from ... import dtypes
    return dtypes.storage_dtype(name)


def _graphs_enabled() -> bool:
    return _config.get("CUDNN_COMPAT_RNN_GRAPHS")


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


def rng_specs(op) -> list:
    """[mask kernel, offset kernel (if offset_out)] for an Rng op."""
    a = op.attrs
    y = op.outputs["y"]
    numel = int(np.prod(y.dims))
    nblk = -(-numel // 4)
    p = _Params()
    p.ptr("int", "seed", "seed", const=True)
    p.ptr("int", "offset", "offset", const=True)
    p.ptr(STORAGE[y.dtype], "y", "y")
    lines = []
    for size, stride in reversed(list(zip(y.dims, y.strides))):
        lines.append(f"    off += (rem % {size}LL) * {stride}LL; rem /= {size}LL;")
    body = f"""  const long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= {nblk}LL) return;
  const unsigned long long base = ((unsigned long long)(unsigned int)offset[1] << 32) | (unsigned int)offset[0];
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
    long long rem = e, off = 0;
{chr(10).join(lines)}
    y[off] = {_mask_store(y.dtype)};
  }}
"""
    mask = _spec("rng", p, body, nblk)
    mask.args = [("buf", op.inputs["seed"].uid), ("buf", op.inputs["offset"].uid), ("buf", y.uid)]
    specs = [mask]
    if "offset_out" in op.outputs:
        q = _Params()
        q.ptr("int", "offset", "offset", const=True)
        q.ptr("int", "offset_out", "offset_out")
        adv = int(a.get("advance", nblk))
        body = f"""  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const unsigned long long v = (((unsigned long long)(unsigned int)offset[1] << 32) | (unsigned int)offset[0]) + {adv}ULL;
  offset_out[0] = (int)(unsigned int)v;
  offset_out[1] = (int)(unsigned int)(v >> 32);
"""
        adv_spec = _spec("rngadvance", q, body, 1)
        adv_spec.args = [("buf", op.inputs["offset"].uid), ("buf", op.outputs["offset_out"].uid)]
        specs.append(adv_spec)
    return specs


# -- the engine's entry points ------------------------------------------------------------------------

def build(step) -> list:
    op = step.op
    if op.kind == "Rng":
        y = op.outputs["y"]
        specs = rng_specs(op)
        runs = [KernelRun([specs[0]], [y] if y.is_virtual else [])]
        runs += [KernelRun([s]) for s in specs[1:]]
        return runs
    prog = forward_program(op) if op.kind == "RNNRecurrence" else backward_program(op)
    runner = ProgramRun(prog, op)
    return [PyRun(runner.run, runner.kernels())]
