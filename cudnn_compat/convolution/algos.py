"""Legacy convolution algorithms: which problems each one supports (002 §5.2.10 tables 17-22 for
forward, §5.2.8 tables 12-15 for backward data, §6.2.2 tables 36-39 for backward filter), their
nominal determinism, the Tensor Core ones, the data-type configurations, and the perf struct the
algorithm queries return (CuPy 13's ``CuDNNAlgoPerf``).

A problem is seen in forward terms whatever the direction: x (N,C,*S), w (K,C/g,*R), y (N,K,*O);
for backward data x is dx and y is dy, for backward filter w is dw.  ``unsupported(direction,
algo, problem)`` returns None or the reason the tables give, which the legacy layer reports as
CUDNN_STATUS_NOT_SUPPORTED.

One departure from 002, after the library it documents: 002's forward tables ask dilation 1 of
IMPLICIT_PRECOMP_GEMM and GEMM in NCHW; libcudnn 9's legacy Find runs both on a dilated problem
(dilation 2, 3x3, fp32 NCHW: algo 1 in 0.16 ms, algo 2 in 0.57 ms, bench_conv_zoo's JSON of
2026-11-28), and a caller who asks for them gets them, with the configs that need workspace
(IMPLICIT_GEMM takes zero-workspace configs only: without algo 1 a dilated fp32 convolution had
no TF32 Tensor Core config to choose and ran 6x slower than the same call on torch).
"""
from __future__ import annotations

from dataclasses import dataclass

# -- data-type configurations (002 §5.2.10 table 17, §5.2.8, §6.2.2) -----------------------------
# (x dtype, w dtype, y dtype, compute dtype) -> configuration name
CONFIGS = {
    ("float16", "float16", "float16", "float16"): "TRUE_HALF",
    ("float16", "float16", "float16", "float32"): "PSEUDO_HALF",
    ("bfloat16", "bfloat16", "bfloat16", "float32"): "PSEUDO_BFLOAT16",
    ("float32", "float32", "float32", "float32"): "FLOAT",
    ("float64", "float64", "float64", "float64"): "DOUBLE",
    ("int8", "int8", "int8", "int32"): "INT8",
    ("int8", "int8", "float32", "int32"): "INT8_EXT",
    ("uint8", "int8", "int8", "int32"): "UINT8",
    ("uint8", "int8", "float32", "int32"): "UINT8_EXT",
}
INT8_CONFIGS = frozenset({"INT8", "INT8_EXT", "UINT8", "UINT8_EXT"})
MIXED_DTYPES = frozenset((x, w, y) for (x, w, y, _), c in CONFIGS.items() if c in INT8_CONFIGS)

TH, PH, PBF, F, D = "TRUE_HALF", "PSEUDO_HALF", "PSEUDO_BFLOAT16", "FLOAT", "DOUBLE"
ALL_FLOAT = frozenset({TH, PH, PBF, F, D})


def config_of(x: str, w: str, y: str, compute: str) -> "str | None":
    return CONFIGS.get((x, w, y, compute))


# -- the problem as the tables see it ----------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    dims: tuple
    strides: tuple


@dataclass(frozen=True)
class Problem:
    config: str
    wfmt: str  # 'NCHW' (KCRS) or 'NHWC' (KRSC)
    x: Layout
    w: Layout
    y: Layout
    pad: tuple
    stride: tuple
    dilation: tuple

    @property
    def nsp(self) -> int:
        return len(self.x.dims) - 2

    @property
    def filt(self) -> tuple:
        return self.w.dims[2:]


def packed(t: Layout, axes) -> bool:
    """``axes`` (outermost first) are densely packed, innermost stride 1; size-1 dims are free."""
    acc = 1
    for ax in reversed(list(axes)):
        if t.dims[ax] != 1 and t.strides[ax] != acc:
            return False
        acc *= t.dims[ax]
    return True


# layout name -> axes that must be packed, for a rank-n tensor
LAYOUTS = {
    "NCHW CHW-packed": lambda n: range(1, n),
    "NCHW HW-packed": lambda n: range(2, n),
    "NCHW fully-packed": lambda n: range(0, n),
    "NHWC HWC-packed": lambda n: list(range(2, n)) + [1],
    "NHWC fully-packed": lambda n: [0] + list(range(2, n)) + [1],
}
CHW, HW, FULL = ("NCHW CHW-packed",), ("NCHW HW-packed",), ("NCHW fully-packed",)
HWC, NHWC_FULL = ("NHWC HWC-packed",), ("NHWC fully-packed",)


def _layout_ok(t: Layout, allowed) -> bool:
    return allowed is None or any(packed(t, LAYOUTS[name](len(t.dims))) for name in allowed)


# -- named checks: problem -> None or the reason -----------------------------------------------
def stride1(p):
    return None if all(s == 1 for s in p.stride) else f"needs stride 1 in every dim (stride {p.stride})"


def filter_gt_pad(p):
    return None if all(r > q for r, q in zip(p.filt, p.pad)) else f"needs each filter dim > its padding (filter {p.filt}, pad {p.pad})"


def fft_limits(p):
    """FFT: padded x (dx for backward) <= 256 in each dim, stride 1, filter > padding."""
    if any(s + 2 * q > 256 for s, q in zip(p.x.dims[2:], p.pad)):
        return "needs each input dim + 2*padding <= 256"
    return stride1(p) or filter_gt_pad(p)


def fft_tiling_2d(p):
    one_d = 1 in p.filt
    if p.config == D and not one_d:
        return "DOUBLE_CONFIG needs a filter dim of 1 (1D FFT)"
    if one_d:
        if max(p.filt) > 256:
            return "needs the largest filter dim <= 256 when the other is 1"
        return stride1(p) or filter_gt_pad(p)
    if max(p.filt) > 32:
        return "needs filter dims <= 32"
    if any(s not in (1, 2) for s in p.stride):
        return f"needs stride 1 or 2 (stride {p.stride})"
    return filter_gt_pad(p)


def fft_tiling_3d(p):
    if max(p.filt) > 16:
        return "needs filter dims <= 16"
    return stride1(p) or filter_gt_pad(p)


def bwd_filter_fft_tiling(p):
    h, w = p.y.dims[2:]
    if not (h == 1 and w <= 256 or w == 1 and h <= 256):
        return "needs dy height or width 1 and the other <= 256"
    return stride1(p) or filter_gt_pad(p)


def winograd(p):
    return stride1(p) or (None if p.filt == (3, 3) else f"needs a 3x3 filter (filter {p.filt})")


def winograd_nonfused(p):
    if p.filt not in ((3, 3), (5, 5)):
        return f"needs a 3x3 or 5x5 filter (filter {p.filt})"
    if p.filt == (5, 5) and p.config == TH:
        return "a 5x5 filter is not supported with TRUE_HALF_CONFIG"
    return stride1(p)


def int8_channels(p):
    c, k = p.x.dims[1], p.w.dims[0]
    if c % 4 or (k % 4 and p.config not in ("INT8_EXT", "UINT8_EXT")):
        return f"needs input and output feature maps that are multiples of 4 (C={c}, K={k})"
    return None


@dataclass(frozen=True)
class Variant:
    """One row of a support table: spatial rank, filter format, configs, layouts, dilation, checks."""

    nsp: int
    wfmt: str
    configs: frozenset
    x: "tuple | None" = None  # allowed layouts of the x-shaped tensor (None: any except VECT_C)
    y: "tuple | None" = None
    dilation1: bool = False
    checks: tuple = ()

    def reason(self, p: Problem) -> "str | None":
        if p.config not in self.configs:
            return f"does not support {p.config}_CONFIG here (supports {', '.join(sorted(self.configs))})"
        if not _layout_ok(p.x, self.x):
            return f"needs the input-side tensor {' or '.join(self.x)}"
        if not _layout_ok(p.y, self.y):
            return f"needs the output-side tensor {' or '.join(self.y)}"
        if self.dilation1 and any(d != 1 for d in p.dilation):
            return f"needs dilation 1 (dilation {p.dilation})"
        for check in self.checks:
            why = check(p)
            if why:
                return why
        return None


V = Variant
_NOT_IMPLEMENTED = "is not implemented in cuDNN"

# direction -> algo name suffix -> variants (002 tables; the suffix follows the enum prefix)
TABLES = {
    "FWD": {
        "IMPLICIT_GEMM": (
            V(2, "NCHW", ALL_FLOAT),
            V(2, "NHWC", ALL_FLOAT, HWC, HWC + CHW),
            V(2, "NHWC", INT8_CONFIGS, NHWC_FULL, NHWC_FULL, True, (int8_channels,)),
            V(3, "NCHW", frozenset({PH, PBF, F, D})),
        ),
        "IMPLICIT_PRECOMP_GEMM": (
            V(2, "NCHW", ALL_FLOAT),  # dilation: libcudnn 9 (see the module docstring)
            V(2, "NHWC", ALL_FLOAT, HWC, HWC + CHW),
            V(2, "NHWC", INT8_CONFIGS, NHWC_FULL, NHWC_FULL, True, (int8_channels,)),
            V(3, "NCHW", frozenset({PH, PBF, F, D})),
            V(3, "NHWC", frozenset({PH, PBF, F}), HWC, HWC),
        ),
        "GEMM": (V(2, "NCHW", frozenset({PH, F, D})),),  # dilation: libcudnn 9 (the module docstring)
        "DIRECT": _NOT_IMPLEMENTED,
        "FFT": (V(2, "NCHW", frozenset({PH, F}), HW, HW, True, (fft_limits,)),),
        "FFT_TILING": (
            V(2, "NCHW", frozenset({PH, F, D}), HW, HW, True, (fft_tiling_2d,)),
            V(3, "NCHW", frozenset({PH, F, D}), HW, HW, True, (fft_tiling_3d,)),
        ),
        "WINOGRAD": (V(2, "NCHW", frozenset({PH, F}), dilation1=True, checks=(winograd,)),),
        "WINOGRAD_NONFUSED": (V(2, "NCHW", frozenset({TH, PH, PBF, F}), dilation1=True, checks=(winograd_nonfused,)),),
    },
    "BWD_DATA": {  # x = dx, y = dy
        "ALGO_0": (
            V(2, "NHWC", frozenset({TH, PH, PBF, F}), HWC, HWC),
            V(2, "NCHW", ALL_FLOAT, None, CHW),
            V(3, "NCHW", frozenset({PH, PBF, F, D}), None, CHW),
        ),
        "ALGO_1": (
            V(2, "NHWC", frozenset({TH, PH, PBF, F}), HWC, HWC),
            V(2, "NCHW", ALL_FLOAT, None, CHW),
            V(3, "NCHW", ALL_FLOAT, CHW, CHW, True),
            V(3, "NHWC", frozenset({TH, PH, PBF, F}), HWC, HWC),
        ),
        "FFT": (V(2, "NCHW", frozenset({PH, F}), HW, CHW, True, (fft_limits,)),),
        "FFT_TILING": (
            V(2, "NCHW", frozenset({PH, F, D}), HW, CHW, True, (fft_tiling_2d,)),
            V(3, "NCHW", frozenset({PH, F, D}), HW, CHW, True, (fft_tiling_3d,)),
        ),
        "WINOGRAD": (V(2, "NCHW", frozenset({PH, F}), None, CHW, True, (winograd,)),),
        "WINOGRAD_NONFUSED": (V(2, "NCHW", frozenset({TH, PH, PBF, F}), None, CHW, True, (winograd_nonfused,)),),
    },
    "BWD_FILTER": {  # w = dw
        "ALGO_0": (
            V(2, "NHWC", frozenset({PH, PBF, F}), HWC),
            V(2, "NCHW", frozenset({PH, PBF, F, D}), CHW),
            V(3, "NCHW", frozenset({PH, PBF, F, D}), CHW),
        ),
        "ALGO_1": (
            V(2, "NHWC", frozenset({PH, PBF, F}), HWC),
            V(2, "NCHW", frozenset({PH, PBF, F, D}), CHW),
            V(3, "NHWC", frozenset({TH, PH, PBF, F}), HWC, HWC),
        ),
        "FFT": (V(2, "NCHW", frozenset({PH, F}), CHW, CHW, True, (fft_limits,)),),
        "ALGO_3": (
            V(2, "NCHW", frozenset({PH, F, D}), CHW, dilation1=True),
            V(3, "NCHW", frozenset({PH, F, D}), FULL, FULL),
        ),
        "WINOGRAD": _NOT_IMPLEMENTED,
        "WINOGRAD_NONFUSED": (V(2, "NCHW", frozenset({TH, PH, PBF, F}), CHW, None, True, (winograd_nonfused,)),),
        "FFT_TILING": (V(2, "NCHW", frozenset({PH, F, D}), CHW, CHW, True, (bwd_filter_fft_tiling,)),),
    },
}

# Heuristic order of Get*Algorithm_v7 (most generally fast first; every algo listed once).
PREFERENCE = {
    "FWD": ("IMPLICIT_PRECOMP_GEMM", "IMPLICIT_GEMM", "WINOGRAD_NONFUSED", "WINOGRAD", "GEMM",
            "FFT_TILING", "FFT", "DIRECT"),
    "BWD_DATA": ("ALGO_1", "ALGO_0", "WINOGRAD_NONFUSED", "WINOGRAD", "FFT_TILING", "FFT"),
    "BWD_FILTER": ("ALGO_1", "ALGO_0", "ALGO_3", "WINOGRAD_NONFUSED", "FFT_TILING", "FFT", "WINOGRAD"),
}
# The algorithm of each direction that needs no workspace wherever the tables let it run
# (legacy cuDNN's IMPLICIT_GEMM and the atomics-based ALGO_0s need none); where they cannot run
# a problem, the first supported algorithm of PREFERENCE takes the role (``zero_workspace_algo``).
ZERO_WORKSPACE = {"FWD": "IMPLICIT_GEMM", "BWD_DATA": "ALGO_0", "BWD_FILTER": "ALGO_0"}
# Algorithms that have Tensor Core (CUDNN_TENSOR_OP_MATH) versions.
TENSOR_OP = {
    "FWD": frozenset({"IMPLICIT_PRECOMP_GEMM", "WINOGRAD_NONFUSED"}),
    "BWD_DATA": frozenset({"ALGO_1", "WINOGRAD_NONFUSED"}),
    "BWD_FILTER": frozenset({"ALGO_1", "WINOGRAD_NONFUSED"}),
}
# Nominally non-deterministic algorithms (002 §5.2.8 and §6.2.2 tables, cudnnConvolutionBwdFilterAlgo_t).
NON_DETERMINISTIC = {
    "FWD": frozenset(),
    "BWD_DATA": frozenset({"ALGO_0"}),
    "BWD_FILTER": frozenset({"ALGO_0", "ALGO_1", "ALGO_3"}),
}


def unsupported(direction: str, algo: str, p: Problem) -> "str | None":
    """None when ``algo`` (suffix, e.g. 'FFT') can run problem ``p``, else the reason."""
    variants = TABLES[direction][algo]
    if isinstance(variants, str):
        return variants
    rows = [v for v in variants if v.nsp == p.nsp and v.wfmt == p.wfmt]
    if not rows:
        shapes = sorted({f"{v.nsp}D with {v.wfmt} filters" for v in variants})
        return f"supports only {', '.join(shapes)}"
    reasons = [v.reason(p) for v in rows]
    if None in reasons:
        return None
    return "; or ".join(dict.fromkeys(reasons))


def zero_workspace_algo(direction: str, p: Problem) -> "str | None":
    """The algorithm (suffix) that runs problem ``p`` with no workspace at all: the direction's
    ZERO_WORKSPACE algorithm when the tables support it, else the first supported algorithm in
    PREFERENCE order; None when no algorithm supports ``p``.  The legacy layer marks the conv op
    of that algorithm ``zero_workspace`` and the engines honour it (the cudnn engine takes only
    configs without workspace or declines; the cupy and reference engines never need any), so
    Get*_v7/Find* always list a SUCCESS algorithm with memory 0 for a supported problem, as
    CuPy's ``max_workspace_size=0`` callers need (issue 13 item 8)."""
    for name in (ZERO_WORKSPACE[direction],) + PREFERENCE[direction]:
        if unsupported(direction, name, p) is None:
            return name
    return None


class CuDNNAlgoPerf:
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t as CuPy 13 returned it: attributes
    algo, status, time (ms), memory (bytes), determinism, mathType; also readable by key, as
    CuPy's non-Ex Find returned the structs as dicts."""

    __slots__ = ("algo", "status", "time", "memory", "determinism", "mathType")

    def __init__(self, algo, status, time, memory, determinism, mathType):
        self.algo, self.status, self.time = int(algo), int(status), float(time)
        self.memory, self.determinism, self.mathType = int(memory), int(determinism), int(mathType)

    def __getitem__(self, name):
        if name not in self.__slots__:
            raise KeyError(name)
        return getattr(self, name)

    def keys(self):
        return self.__slots__

    def __repr__(self):
        return "CuDNNAlgoPerf(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"
