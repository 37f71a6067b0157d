"""CUDA source generation for fused element-wise work (pure Python: no CuPy import, so the
sources can be generated and NVRTC-compiled on a machine without a GPU).

One ``FusedGroup`` = a chain of Pointwise ops (the prologue), an optional Reduction, and a
chain of Pointwise ops on the reduced result (the epilogue, usually the alpha/beta output
blend of 002 "Scaling Parameters").  ``group_kernels`` turns it into ONE kernel (plus, for
element-wise groups, a 16-byte-vector variant of the same kernel chosen at run time when
the pointers are aligned).  Pointwise semantics follow the reference engine
(``reference/pointwise.py``, 002 ch. 9 POINTWISE modes), reductions
``reference/reduction.py`` (002 §3.2.81, §3.1.2 cudnnReduceTensorOp_t).

Index math: dims and element strides are baked into the source as constants, so the
compiler turns divisions into multiplications; dims are permuted into the memory order of
the output and adjacent dims that are contiguous in every tensor are collapsed (a packed
tensor becomes one flat loop).  Indices are 32-bit unless an element count or offset
reaches 2^31, then 64-bit.  Values are computed in the compute type ``T``: float, or double
when any tensor of the group is float64.  Half and bfloat16 are read and written as 16-bit
storage with explicit conversions, so the sources include no header.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

BLOCK = 256  # threads per block of every generated element-wise / reduction kernel
INT32_LIMIT = 2 ** 31 - 1

# dtype -> C storage type
STORAGE = {
    "float32": "float", "float64": "double", "float16": "unsigned short", "bfloat16": "unsigned short",
    "int8": "signed char", "uint8": "unsigned char", "int32": "int", "int64": "long long", "bool": "unsigned char",
}
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int32": 4,
            "int64": 8, "bool": 1}
INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-2 ** 31, 2 ** 31 - 1),
             "int64": (-2 ** 63, 2 ** 63 - 1)}

PREAMBLE = r"""
#define CC_INF_F __int_as_float(0x7f800000)
#define CC_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define CC_NAN_F __int_as_float(0x7fc00000)
#define CC_NAN_D __longlong_as_double(0x7ff8000000000000LL)
#ifndef CC_EMU
static __device__ __forceinline__ float cc_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
static __device__ __forceinline__ unsigned short cc_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
static __device__ __forceinline__ unsigned short cc_d2h(double d) { unsigned short h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
#endif
static __device__ __forceinline__ float cc_b2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
static __device__ __forceinline__ unsigned short cc_f2b(float f) {
  unsigned int u = __float_as_uint(f);
  if (f != f) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
template <typename T> static __device__ __forceinline__ T cc_pmax(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> static __device__ __forceinline__ T cc_pmin(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> static __device__ __forceinline__ T cc_sq(T x) { return x * x; }
template <typename T> static __device__ __forceinline__ T cc_sigmoid(T x) { return T(0.5) * (T(1) + tanh(T(0.5) * x)); }
template <typename S, typename T> static __device__ __forceinline__ S cc_to_int(T v, T lo, T hi) {
  if (v != v) return (S)0;
  v = v < lo ? lo : (v > hi ? hi : v);
  return (S)rint(v);
}
"""

# the CPU kernel emulator's stand-ins (tests/kernel_emu.py: the blocks of a launch run one after
# another) for what kernels with a "last block" ticket use: bn.py's split reductions, the Rng
# kernel's offset advance (rnn.py)
EMU_TICKETS = r"""
#ifdef CC_EMU
static inline void __threadfence() {}
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { unsigned int o = *p; *p += v; return o; }
template <typename Q> static inline Q __ldcg(const Q* p) { return *p; }
#endif
"""


# -- small helpers ---------------------------------------------------------------------

def compute_type(dtypes) -> str:
    return "double" if "float64" in set(dtypes) else "float"


def tensors_compute_type(tensors) -> str:
    """double when a memory tensor is float64; by-value scalars (epsilon is float64 even for
    float data) are cast to the compute type and do not decide it."""
    return compute_type(t.dtype for t in tensors if not t.is_by_value)


def lit(v: float, T: str) -> str:
    """A C literal of type T."""
    v = float(v)
    if math.isnan(v):
        return "CC_NAN_F" if T == "float" else "CC_NAN_D"
    if math.isinf(v):
        s = "CC_INF_F" if T == "float" else "CC_INF_D"
        return s if v > 0 else f"(-{s})"
    r = repr(v)
    if "e" not in r and "." not in r:
        r += ".0"
    return f"{r}f" if T == "float" else r


def load_expr(dtype: str, ref: str, T: str) -> str:
    """Value of storage element ``ref`` (a C lvalue) as T."""
    if dtype == "float16":
        return f"(({T})cc_h2f({ref}))"
    if dtype == "bfloat16":
        return f"(({T})cc_b2f({ref}))"
    if dtype == "bool":
        return f"(({ref}) ? {T}(1) : {T}(0))"
    return f"(({T})({ref}))"


def store_expr(dtype: str, val: str, T: str) -> str:
    """Storage value for T value ``val`` (round to nearest even; integers saturate)."""
    if dtype == "float16":
        return f"cc_f2h({val})" if T == "float" else f"cc_d2h({val})"
    if dtype == "bfloat16":
        return f"cc_f2b((float)({val}))"
    if dtype in ("float32", "float64"):
        return f"(({STORAGE[dtype]})({val}))"
    if dtype == "bool":
        return f"(unsigned char)(({val}) != {T}(0))"
    lo, hi = INT_RANGE[dtype]
    return f"cc_to_int<{STORAGE[dtype]}, {T}>({val}, {T}({lo}), {T}({hi}))"


def round_expr(dtype: str, val: str, T: str) -> str:
    """``val`` rounded to ``dtype`` and back (virtual tensors narrower than T)."""
    if dtype in ("float16", "bfloat16") or (dtype == "float32" and T == "double"):
        return load_expr(dtype, store_expr(dtype, val, T), T)
    return val


def name_kernel(prefix: str, body: str) -> tuple:
    """(name, source): the kernel is named after the hash of its own source."""
    h = hashlib.sha1(body.encode()).hexdigest()[:16]
    name = f"cc_{prefix}_{h}"
    return name, body.replace("KNAME", name)


@dataclass
class KernelSpec:
    """A generated kernel: its source, parameter list and launch shape.

    ``args``: one entry per kernel parameter, ("buf", uid) for a tensor's base pointer or
    ("scalar", uid, ctype) for a by-value tensor; ``params`` the C declarations (the CPU
    emulator in the tests reads them); ``aligned``: uids whose pointers must be 16-byte
    aligned for this variant."""

    name: str
    source: str
    args: list
    params: list
    grid: tuple
    block: tuple
    shared_mem: int = 0
    aligned: tuple = ()
    family: str = ""

    @property
    def full_source(self) -> str:
        return self.source


# -- pointwise expressions (reference/pointwise.py) ------------------------------------

def _relu_bounds(a):
    return float(a.get("relu_lower_clip", 0.0)), a.get("relu_upper_clip")


def pointwise_lines(op, x: str, b: "str | None", out: str, T: str) -> list:
    """C statements computing ``T out`` from operand expressions ``x`` (alpha1 applied) and ``b``."""
    a = op.attrs
    mode = a["mode"]
    prop = a.get("nan_propagation", "PROPAGATE") == "PROPAGATE"
    mx = "cc_pmax" if prop else "fmax"
    mn = "cc_pmin" if prop else "fmin"
    L = lambda v: lit(v, T)  # noqa: E731
    pre = [f"const {T} {out}_x = {x};"]
    X = f"{out}_x"
    if b is not None:
        pre.append(f"const {T} {out}_b = {b};")
    B = f"{out}_b"
    if mode in ("RELU_FWD", "CLIPPED_RELU_FWD"):
        lo, up = _relu_bounds(a)
        e = f"{mx}<{T}>({X}, {L(lo)})" if prop else f"fmax({X}, {L(lo)})"
        if up is not None:
            e = f"{mn}<{T}>({e}, {L(up)})" if prop else f"fmin({e}, {L(up)})"
    elif mode in ("RELU_BWD", "CLIPPED_RELU_BWD"):
        lo, up = _relu_bounds(a)
        cond = f"{B} > {L(lo)}" + (f" && {B} < {L(up)}" if up is not None else "")
        e = f"(({cond}) ? {X} : {T}(0))"
        if prop:  # a NaN forward value gives NaN only under PROPAGATE
            e = f"({B} != {B}) ? {B} : {e}"
    else:
        e = _SIMPLE[mode]
        e = e.replace("{X}", X).replace("{B}", B).replace("{T}", T)
        e = e.replace("{ELU}", L(a.get("elu_alpha", 1.0))).replace("{SP}", L(a.get("softplus_beta", 1.0)))
        e = e.replace("{SW}", L(a.get("swish_beta", 1.0)))
        e = e.replace("{MAX}", f"{mx}<{T}>" if prop else "fmax").replace("{MIN}", f"{mn}<{T}>" if prop else "fmin")
    return pre + [f"const {T} {out} = {e};"]


_SIMPLE = {
    "IDENTITY": "{X}",
    "SQRT": "sqrt({X})",
    "NEG": "-{X}",
    "NOT": "{T}(1) - {X}",
    "ABS": "fabs({X})",
    "EXP": "exp({X})",
    "LOG": "log({X})",
    "RSQRT": "{T}(1) / sqrt({X})",
    "RECIPROCAL": "{T}(1) / {X}",
    "TANH_FWD": "tanh({X})",
    "SIGMOID_FWD": "cc_sigmoid<{T}>({X})",
    "ELU_FWD": "({X} > {T}(0)) ? {X} : {ELU} * expm1({X})",
    "GELU_FWD": "{T}(0.5) * {X} * ({T}(1) + erf({X} * {T}(0.70710678118654752440)))",
    "SOFTPLUS_FWD": "(fmax({SP} * {X}, {T}(0)) + log1p(exp(-fabs({SP} * {X})))) / {SP}",
    "SWISH_FWD": "{X} * cc_sigmoid<{T}>({SW} * {X})",
    "ADD": "{X} + {B}",
    "SUB": "{X} - {B}",
    "MUL": "{X} * {B}",
    "DIV": "{X} / {B}",
    "POW": "pow({X}, {B})",
    "MIN": "{MIN}({X}, {B})",
    "MAX": "{MAX}({X}, {B})",
    "CMP_GT": "({X} > {B}) ? {T}(1) : {T}(0)",
    "CMP_GE": "({X} >= {B}) ? {T}(1) : {T}(0)",
    "CMP_LT": "({X} < {B}) ? {T}(1) : {T}(0)",
    "CMP_LE": "({X} <= {B}) ? {T}(1) : {T}(0)",
    "CMP_EQ": "({X} == {B}) ? {T}(1) : {T}(0)",
    "CMP_NEQ": "({X} != {B}) ? {T}(1) : {T}(0)",
    "TANH_BWD": "{X} * ({T}(1) - tanh({B}) * tanh({B}))",
    "TANH_BWD_Y": "{X} * ({T}(1) - {B} * {B})",
    "SIGMOID_BWD": "{X} * cc_sigmoid<{T}>({B}) * ({T}(1) - cc_sigmoid<{T}>({B}))",
    "SIGMOID_BWD_Y": "{X} * {B} * ({T}(1) - {B})",
    "ELU_BWD": "{X} * (({B} > {T}(0)) ? {T}(1) : {ELU} * exp({B}))",
    "ELU_BWD_Y": "{X} * (({B} > {T}(0)) ? {T}(1) : {B} + {ELU})",
    "SWISH_BWD": "{X} * (cc_sigmoid<{T}>({SW} * {B}) + {SW} * {B} * cc_sigmoid<{T}>({SW} * {B}) * ({T}(1) - cc_sigmoid<{T}>({SW} * {B})))",
}
POINTWISE_MODES = frozenset(_SIMPLE) | {"RELU_FWD", "CLIPPED_RELU_FWD", "RELU_BWD", "CLIPPED_RELU_BWD"}


def emit_chain(ops, env: dict, T: str) -> list:
    """Statements evaluating Pointwise ``ops`` in order.  ``env``: uid -> C expression of the
    value of every tensor already known (loaded inputs, scalars, values handed in); each op's
    output is added to it."""
    lines = []
    for op in ops:
        if op.kind == "NormForward":  # INFERENCE: y = scale*(x - mean)*inv_variance + bias
            g = {r: env[t.uid] for r, t in op.inputs.items()}
            y = op.outputs["y"]
            lines.append(f"const {T} v{y.uid} = {g['scale']} * ({g['x']} - {g['mean']}) * {g['inv_variance']} + {g['bias']};")
            env[y.uid] = f"v{y.uid}"
            continue
        x = env[op.inputs["x"].uid]
        if "alpha1" in op.inputs:
            x = f"({x} * {env[op.inputs['alpha1'].uid]})"
        b = None
        if "b" in op.inputs:
            b = env[op.inputs["b"].uid]
            if "alpha2" in op.inputs:
                b = f"({b} * {env[op.inputs['alpha2'].uid]})"
        y = op.outputs["y"]
        var = f"v{y.uid}"
        lines += pointwise_lines(op, x, b, var, T)
        if y.is_virtual:
            r = round_expr(y.dtype, var, T)
            if r != var:
                lines.append(f"const {T} {var}_r = {r};")
                var = f"{var}_r"
        env[y.uid] = var
    return lines


# -- index spaces -----------------------------------------------------------------------

def bstrides(t, dims) -> tuple:
    """t's element strides over iteration ``dims`` (0 where t broadcasts)."""
    return tuple(0 if (td == 1 and d != 1) else s for td, s, d in zip(t.dims, t.strides, dims))


def order_axes(axes, lead_strides) -> list:
    """``axes`` from outermost to innermost in the memory order given by ``lead_strides``."""
    return sorted(axes, key=lambda a: (-lead_strides[a], a))


def collapse(axes, dims, strides_list) -> tuple:
    """Merge adjacent axes (outer to inner) that are contiguous in every stride vector.
    Returns (sizes, [strides per tensor]) of the collapsed axes."""
    sizes, outs = [], [[] for _ in strides_list]
    for a in axes:
        d = dims[a]
        if sizes:
            if all(o[-1] == s[a] * d for o, s in zip(outs, strides_list)):
                sizes[-1] *= d
                for o, s in zip(outs, strides_list):
                    o[-1] = s[a]
                continue
        sizes.append(d)
        for o, s in zip(outs, strides_list):
            o.append(s[a])
    return sizes, outs


def decompose(var: str, sizes, prefix: str, IDX: str) -> tuple:
    """Statements splitting linear index ``var`` (row-major over ``sizes``) into coordinates."""
    lines, names = [], []
    rem = var
    for j in range(len(sizes) - 1, -1, -1):
        c = f"{prefix}{j}"
        if j == 0:
            lines.append(f"const {IDX} {c} = {rem};")
        else:
            lines.append(f"const {IDX} {c} = {rem} % ({IDX}){sizes[j]};")
            nxt = f"{prefix}q{j}"
            lines.append(f"const {IDX} {nxt} = {rem} / ({IDX}){sizes[j]};")
            rem = nxt
        names.append(c)
    return lines, list(reversed(names))


def offset_expr(coords, strides, IDX: str) -> str:
    terms = [c if s == 1 else f"{c} * ({IDX}){s}" for c, s in zip(coords, strides) if s != 0]
    return " + ".join(terms) if terms else f"({IDX})0"


def max_offset(dims, strides) -> int:
    return sum((d - 1) * abs(s) for d, s in zip(dims, strides))


# -- fused groups --------------------------------------------------------------------------

@dataclass
class FusedGroup:
    """Prologue pointwise ops, an optional Reduction, epilogue pointwise ops.

    ``loads``: uid -> Tensor read from memory (external inputs and tensors produced by earlier
    steps); ``stores``: uid -> Tensor written to memory (external outputs and virtual tensors
    that later steps read).  Every other tensor lives in registers."""

    prologue: list
    reduction: object = None
    epilogue: list = field(default_factory=list)
    loads: dict = field(default_factory=dict)
    stores: dict = field(default_factory=dict)

    @property
    def ops(self) -> list:
        return self.prologue + ([self.reduction] if self.reduction is not None else []) + self.epilogue

    def tensors(self) -> dict:
        out = {}
        for op in self.ops:
            for t in list(op.inputs.values()) + list(op.outputs.values()):
                out[t.uid] = t
        return out

    def compute_type(self) -> str:
        return tensors_compute_type(self.tensors().values())


def _params(group: FusedGroup, T: str) -> tuple:
    """Kernel parameters: loads (const), stores, by-value scalars; and the arg spec."""
    params, args = [], []
    for uid, t in group.loads.items():
        params.append(f"const {STORAGE[t.dtype]}* p{uid}")
        args.append(("buf", uid))
    for uid, t in group.stores.items():
        params.append(f"{STORAGE[t.dtype]}* p{uid}")
        args.append(("buf", uid))
    for uid, t in sorted(group.tensors().items()):
        if t.is_by_value:
            params.append(f"const {T} s{uid}")
            args.append(("scalar", uid, T))
    return params, args


def _scalar_env(group: FusedGroup) -> dict:
    return {uid: f"s{uid}" for uid, t in group.tensors().items() if t.is_by_value}


def group_kernels(group: FusedGroup) -> list:
    """Kernel variants for a group, preferred first (the caller picks the first whose
    ``aligned`` pointers are 16-byte aligned)."""
    if group.reduction is not None:
        return [reduction_kernel(group)]
    out = []
    vec = elementwise_kernel(group, vector=True)
    if vec is not None:
        out.append(vec)
    out.append(elementwise_kernel(group, vector=False))
    return out


# -- element-wise kernel -------------------------------------------------------------------

def is_elementwise(op) -> bool:
    """Ops a fused element-wise kernel evaluates per element."""
    return op.kind == "Pointwise" or (op.kind == "NormForward" and op.attrs.get("phase") == "INFERENCE")


def space_dims(ops) -> tuple:
    """The broadcast of every op output's dims: the iteration space of an element-wise group."""
    dims = None
    for op in ops:
        d = op.outputs["y"].dims
        dims = d if dims is None else tuple(max(a, b) for a, b in zip(dims, d))
    return tuple(dims)


def _space_dims(group: FusedGroup) -> tuple:
    return space_dims(group.prologue)


def elementwise_kernel(group: FusedGroup, vector: bool) -> "KernelSpec | None":
    T = group.compute_type()
    dims = _space_dims(group)
    mem = list(group.loads.values()) + list(group.stores.values())
    strides = [bstrides(t, dims) for t in mem]
    lead = strides[len(group.loads)]  # the first store decides the iteration order
    axes = order_axes([a for a, d in enumerate(dims) if d != 1], lead)
    sizes, cstr = collapse(axes, dims, strides)
    if not sizes:
        sizes, cstr = [1], [[0] for _ in mem]
    n = 1
    for s in sizes:
        n *= s
    big = max([n] + [max_offset(t.dims, t.strides) + 1 for t in mem]) > INT32_LIMIT
    IDX = "unsigned long long" if big else "unsigned int"

    V = 1
    if vector:
        widths = {ITEMSIZE[t.dtype] for t, s in zip(mem, cstr) if s[-1] == 1}
        if len(widths) != 1 or next(iter(widths)) not in (2, 4, 8):
            return None
        V = 16 // next(iter(widths))
        inner = sizes[-1]
        if inner % V or any(s[-1] not in (0, 1) for s in cstr):
            return None
        if any(s[-1] == 0 for t, s in zip(mem, cstr) if t.uid in group.stores):
            return None
        for s in cstr:  # every vector must start on a 16-byte boundary
            if s[-1] == 1 and any(x % V for x in s[:-1]):
                return None
    units = n // V
    U = 4 if V == 1 else 2  # units per thread, loaded before any is stored
    vsizes = sizes[:-1] + [sizes[-1] // V]

    params, args = _params(group, T)
    env = _scalar_env(group)
    body = [PREAMBLE]
    for t in mem:
        if V > 1 and cstr[mem.index(t)][-1] == 1:
            body.append(f"struct __align__(16) cc_vec{t.uid} {{ {STORAGE[t.dtype]} v[{V}]; }};")
    body.append(f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params)}) {{')
    body.append(f"  const {IDX} base = ({IDX})blockIdx.x * ({IDX}){BLOCK * U} + ({IDX})threadIdx.x;")
    # offsets: one per distinct stride vector
    keys = {}
    for t, s in zip(mem, cstr):
        keys.setdefault(tuple(s), len(keys))
    okey = {t.uid: keys[tuple(s)] for t, s in zip(mem, cstr)}
    for k in keys.values():
        body.append(f"  {IDX} o{k}[{U}];")
    for t in group.loads.values():
        body.append(f"  {T} in{t.uid}[{U}][{V}];")
    body.append("  #pragma unroll")
    body.append(f"  for (int j = 0; j < {U}; ++j) {{")
    body.append(f"    const {IDX} i = base + ({IDX})j * ({IDX}){BLOCK};")
    body.append(f"    if (i < ({IDX}){units}) {{")
    dl, coords = decompose("i", vsizes, "c", IDX)
    body += ["      " + x for x in dl]
    for s, k in keys.items():
        if V > 1:
            outer = offset_expr(coords[:-1], s[:-1], IDX)
            e = f"{outer} + {coords[-1]} * ({IDX}){V}" if s[-1] == 1 else outer
        else:
            e = offset_expr(coords, s, IDX)
        body.append(f"      o{k}[j] = {e};")
    for t in group.loads.values():
        k = okey[t.uid]
        if V > 1 and cstr[mem.index(t)][-1] == 1:
            body.append(f"      const cc_vec{t.uid} q{t.uid} = *reinterpret_cast<const cc_vec{t.uid}*>(p{t.uid} + o{k}[j]);")
            body.append("      #pragma unroll")
            body.append(f"      for (int e = 0; e < {V}; ++e) in{t.uid}[j][e] = {load_expr(t.dtype, f'q{t.uid}.v[e]', T)};")
        else:
            body.append(f"      in{t.uid}[j][0] = {load_expr(t.dtype, f'p{t.uid}[o{k}[j]]', T)};")
    body.append("    }")
    body.append("  }")
    body.append("  #pragma unroll")
    body.append(f"  for (int j = 0; j < {U}; ++j) {{")
    body.append(f"    const {IDX} i = base + ({IDX})j * ({IDX}){BLOCK};")
    body.append(f"    if (i < ({IDX}){units}) {{")
    for t in group.stores.values():
        if V > 1:
            body.append(f"      cc_vec{t.uid} r{t.uid};")
    for t in group.loads.values():
        lane = "e" if (V > 1 and cstr[mem.index(t)][-1] == 1) else "0"
        env[t.uid] = f"in{t.uid}[j][{lane}]"
    ops = list(group.prologue)
    if V > 1:  # ops whose inputs are the same for the V elements of a vector run once per vector
        uniform = {uid for uid, v in env.items() if not v.endswith("[e]")}
        hoisted = []
        for op in ops:
            if all(t.uid in uniform for t in op.inputs.values()):
                hoisted.append(op)
                uniform.add(op.outputs["y"].uid)
        ops = [op for op in ops if op not in hoisted]
        body += ["      " + x for x in emit_chain(hoisted, env, T)]
    body.append("      #pragma unroll")
    body.append(f"      for (int e = 0; e < {V}; ++e) {{")
    body += ["        " + x for x in emit_chain(ops, env, T)]
    for t in group.stores.values():
        val = store_expr(t.dtype, env[t.uid], T)
        if V > 1:
            body.append(f"        r{t.uid}.v[e] = {val};")
        else:
            body.append(f"        p{t.uid}[o{okey[t.uid]}[j]] = {val};")
    body.append("      }")
    if V > 1:
        for t in group.stores.values():
            body.append(f"      *reinterpret_cast<cc_vec{t.uid}*>(p{t.uid} + o{okey[t.uid]}[j]) = r{t.uid};")
    body.append("    }")
    body.append("  }")
    body.append("}")
    name, src = name_kernel("ew" if V == 1 else f"ewv{V}", "\n".join(body) + "\n")
    threads = -(-units // U)
    grid = (max(1, -(-threads // BLOCK)), 1, 1)
    aligned = tuple(t.uid for t, s in zip(mem, cstr) if V > 1 and s[-1] == 1)
    return KernelSpec(name, src, args, params, grid, (BLOCK, 1, 1), 0, aligned, "elementwise")


# -- reduction kernel ------------------------------------------------------------------------

RED_INIT = {"ADD": 0, "AVG": 0, "NORM1": 0, "NORM2": 0, "MUL": 1, "MUL_NO_ZEROS": 1,
            "MIN": math.inf, "MAX": -math.inf, "AMAX": -math.inf}
RED_ELEM = {"ADD": "{v}", "AVG": "{v}", "MUL": "{v}", "MIN": "{v}", "MAX": "{v}", "NORM1": "fabs({v})",
            "AMAX": "fabs({v})", "NORM2": "{v} * {v}", "MUL_NO_ZEROS": "({v} == {T}(0) ? {T}(1) : {v})"}
EXTREME = ("MIN", "MAX", "AMAX")  # the modes with NaN options and indices


def _combine(mode: str, prop: bool, a: str, b: str, T: str) -> str:
    if mode in ("ADD", "AVG", "NORM1", "NORM2"):
        return f"{a} + {b}"
    if mode in ("MUL", "MUL_NO_ZEROS"):
        return f"{a} * {b}"
    if mode in ("MAX", "AMAX"):
        return f"cc_pmax<{T}>({a}, {b})" if prop else f"fmax({a}, {b})"
    return f"cc_pmin<{T}>({a}, {b})" if prop else f"fmin({a}, {b})"


def _init(mode: str, prop: bool, T: str) -> str:
    # NOT_PROPAGATE extremes start from NaN: fmax/fmin skip it, and an all-NaN slice stays NaN
    if mode in EXTREME and not prop:
        return lit(math.nan, T)
    return lit(RED_INIT[mode], T)


def _better(mode: str, prop: bool, nv: str, ni: str, cv: str, ci: str) -> str:
    """Whether candidate (nv, ni) replaces the current (cv, ci): strictly better, or equal with
    a smaller index; under PROPAGATE the first NaN wins (reference/reduction.py _indices)."""
    cmp = ">" if mode in ("MAX", "AMAX") else "<"
    plain = f"({nv} {cmp} {cv} || ({nv} == {cv} && {ni} < {ci}))"
    if not prop:
        return plain
    return f"(({nv} != {nv}) ? (({cv} == {cv}) || {ni} < {ci}) : (({cv} == {cv}) && {plain}))"


def col_rows(M: int, itemsize: int, block: int) -> int:
    """Rows (outputs) per block when threads of a warp share a row position: 32 when there are
    plenty of rows, else fewer (each warp then covers whole 32-byte sectors of several k)."""
    per_sector = max(1, 32 // max(1, itemsize))
    mb = 32
    while mb > per_sector and -(-M // mb) < 264:
        mb //= 2
    return min(mb, block)


def reduction_kernel(group: FusedGroup) -> KernelSpec:
    """Prologue chain -> Reduction -> epilogue chain, one kernel.  Row mode (the innermost
    memory axis is reduced): a warp or the whole block per output, lanes stride over the
    reduced elements.  Column mode: ``mb`` outputs per block, the other threads split k."""
    red = group.reduction
    T = group.compute_type()
    mode = red.attrs["mode"]
    prop = red.attrs.get("nan_propagation", "NOT_PROPAGATE") == "PROPAGATE"
    x_t, y_t = red.inputs["x"], red.outputs["y"]
    X, Y = x_t.dims, y_t.dims
    idx_t = red.outputs.get("indices")
    track = idx_t is not None and mode in EXTREME
    reduced = [a for a in range(len(X)) if Y[a] == 1 and X[a] != 1]
    kept = [a for a in range(len(X)) if X[a] != 1 and a not in reduced]

    pro_mem = [t for t in group.loads.values() if _reads(group.prologue, t.uid) or t.uid == x_t.uid]
    epi_mem = [t for t in group.loads.values() if _reads(group.epilogue, t.uid)] + list(group.stores.values())
    pro_str = [bstrides(t, X) for t in pro_mem]
    epi_str = [bstrides(t, Y) for t in epi_mem]
    lead = pro_str[0] if pro_str else [0] * len(X)
    kept_o = order_axes(kept, lead)
    red_o = order_axes(reduced, lead)
    ksizes, kstr = collapse(kept_o, X, pro_str + epi_str)
    if track:  # the flat index needs each reduced axis' own coordinate
        rsizes, rstr = [X[a] for a in red_o], [[s[a] for a in red_o] for s in pro_str]
    else:
        rsizes, rstr = collapse(red_o, X, pro_str)
    if not ksizes:
        ksizes, kstr = [1], [[0] for _ in pro_str + epi_str]
    if not rsizes:
        rsizes, rstr = [1], [[0] for _ in pro_str]
    M = math.prod(ksizes)
    K = math.prod(rsizes)
    all_t = pro_mem + epi_mem
    big = max([M * K] + [max_offset(t.dims, t.strides) + 1 for t in all_t]) > INT32_LIMIT
    IDX = "unsigned long long" if big else "unsigned int"

    cand = [a for a in kept + reduced if lead[a] != 0]
    innermost = min(cand, key=lambda a: lead[a]) if cand else None
    row = innermost is not None and innermost in reduced
    if row:
        lanes = BLOCK if K >= 2048 else 32
        step, per_block = 1, BLOCK // lanes
    else:
        per_block = col_rows(M, max((ITEMSIZE[t.dtype] for t in pro_mem), default=4), BLOCK)
        lanes, step = BLOCK // per_block, per_block

    params, args = _params(group, T)
    env = _scalar_env(group)
    body = [PREAMBLE, f'extern "C" __global__ void __launch_bounds__({BLOCK}) KNAME({", ".join(params)}) {{']
    body.append(f"  __shared__ {T} shv[{BLOCK}];")
    if track:
        body.append(f"  __shared__ {T} shb[{BLOCK}];")
        body.append(f"  __shared__ {IDX} shi[{BLOCK}];")
    body.append("  const unsigned int tid = threadIdx.x;")
    if row:
        body.append(f"  const unsigned int lane = tid % {lanes}u;")
        body.append(f"  const {IDX} m = ({IDX})blockIdx.x * ({IDX}){per_block} + ({IDX})(tid / {lanes}u);")
    else:
        body.append(f"  const unsigned int lane = tid / {per_block}u;")
        body.append(f"  const {IDX} m = ({IDX})blockIdx.x * ({IDX}){per_block} + ({IDX})(tid % {per_block}u);")
    fill = lit(RED_INIT[mode], T)
    body.append(f"  {T} acc = {_init(mode, prop, T)};")
    if track:
        body.append(f"  {T} bv = {fill};")
        body.append(f"  {IDX} bi = 0;")
    body.append(f"  if (m < ({IDX}){M}) {{")
    dl, mc = decompose("m", ksizes, "cm", IDX)
    body += ["    " + x for x in dl]
    for i, t in enumerate(pro_mem):
        body.append(f"    const {IDX} om{t.uid} = {offset_expr(mc, kstr[i], IDX)};")
    body.append(f"    for ({IDX} k = lane; k < ({IDX}){K}; k += ({IDX}){lanes}) {{")
    dl, kc = decompose("k", rsizes, "ck", IDX)
    body += ["      " + x for x in dl]
    for i, t in enumerate(pro_mem):
        off = f"om{t.uid} + " + offset_expr(kc, rstr[i], IDX)
        body.append(f"      const {T} in{t.uid} = {load_expr(t.dtype, f'p{t.uid}[{off}]', T)};")
        env[t.uid] = f"in{t.uid}"
    body += ["      " + x for x in emit_chain(group.prologue, env, T)]
    xv = env[x_t.uid]
    body.append(f"      const {T} e = {RED_ELEM[mode].replace('{v}', xv).replace('{T}', T)};")
    body.append(f"      acc = {_combine(mode, prop, 'acc', 'e', T)};")
    if track:
        pos = {a: j for j, a in enumerate(red_o)}
        terms, acc_stride = [], 1
        for a in sorted(reduced, reverse=True):  # row-major over the reduced axes, logical order
            terms.append(f"{kc[pos[a]]} * ({IDX}){acc_stride}")
            acc_stride *= X[a]
        flat = " + ".join(terms) if terms else f"({IDX})0"
        body.append(f"      const {IDX} ei = {flat};")
        ev = "e" if prop else "en"
        if not prop:
            body.append(f"      const {T} en = (e != e) ? {fill} : e;")
        body.append(f"      if ({_better(mode, prop, ev, 'ei', 'bv', 'bi')}) {{ bv = {ev}; bi = ei; }}")
    body.append("    }")
    body.append("  }")
    body.append("  shv[tid] = acc;")
    if track:
        body.append("  shb[tid] = bv; shi[tid] = bi;")
    body.append(f"  for (unsigned int s = {lanes // 2}u; s > 0u; s >>= 1) {{")
    body.append("    __syncthreads();")
    body.append("    if (lane < s) {")
    body.append(f"      const unsigned int o = tid + s * {step}u;")
    body.append(f"      shv[tid] = {_combine(mode, prop, 'shv[tid]', 'shv[o]', T)};")
    if track:
        body.append(f"      if ({_better(mode, prop, 'shb[o]', 'shi[o]', 'shb[tid]', 'shi[tid]')}) {{ shb[tid] = shb[o]; shi[tid] = shi[o]; }}")
    body.append("    }")
    body.append("  }")
    body.append(f"  if (lane == 0u && m < ({IDX}){M}) {{")
    fin = "shv[tid]"
    if mode == "AVG":
        fin = f"shv[tid] / {T}({K})"
    elif mode == "NORM2":
        fin = "sqrt(shv[tid])"
    body.append(f"    const {T} r = {fin};")
    dl, mc = decompose("m", ksizes, "cm", IDX)
    body += ["    " + x for x in dl]
    env[y_t.uid] = "r"
    if y_t.is_virtual:
        rr = round_expr(y_t.dtype, "r", T)
        if rr != "r":
            body.append(f"    const {T} rr = {rr};")
            env[y_t.uid] = "rr"
    index_val = "shi[tid]" if track else "0"
    if idx_t is not None:
        env[idx_t.uid] = f"(({T}){index_val})"
    npro = len(pro_mem)
    for i, t in enumerate(epi_mem):
        body.append(f"    const {IDX} oe{t.uid} = {offset_expr(mc, kstr[npro + i], IDX)};")
        if t.uid in group.loads:
            body.append(f"    const {T} in{t.uid} = {load_expr(t.dtype, f'p{t.uid}[oe{t.uid}]', T)};")
            env[t.uid] = f"in{t.uid}"
    body += ["    " + x for x in emit_chain(group.epilogue, env, T)]
    for t in group.stores.values():
        if idx_t is not None and t.uid == idx_t.uid and t.dtype not in ("float32", "float64", "float16", "bfloat16"):
            body.append(f"    p{t.uid}[oe{t.uid}] = ({STORAGE[t.dtype]}){index_val};")
        else:
            body.append(f"    p{t.uid}[oe{t.uid}] = {store_expr(t.dtype, env[t.uid], T)};")
    body.append("  }")
    body.append("}")
    name, src = name_kernel("red", "\n".join(body) + "\n")
    grid = (max(1, -(-M // per_block)), 1, 1)
    return KernelSpec(name, src, args, params, grid, (BLOCK, 1, 1), 0, (), "reduction")


def _reads(ops, uid: int) -> bool:
    return any(t.uid == uid for op in ops for t in op.inputs.values())
