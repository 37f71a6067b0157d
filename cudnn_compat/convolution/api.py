"""The convolution family of the legacy API (002 §5.2.8-§5.2.37 cudnn_cnn_infer, §6.2.1, §6.2.2,
§6.2.9-§6.2.14 cudnn_cnn_train): ConvolutionForward, BackwardData, BackwardFilter, BackwardBias,
BiasActivationForward, and the algorithm queries (MaxCount, Get*_v7, Find*, Find*Ex,
Get*WorkspaceSize) for the three directions.  The convolution descriptor is ``convolution.descriptor``.

Every compute call is one graph (see ``cudnn_compat/_backend/ops/convolution.py`` for the conv op attrs):
    Forward        ConvolutionForward(x, w) -> c ; y = alpha*c + beta*y
    BackwardData   ConvolutionBackwardData(dy, w) -> c ; dx = alpha*c + beta*dx
    BackwardFilter ConvolutionBackwardFilter(x, dy) -> c ; dw = alpha*c + beta*dw
    BackwardBias   Reduction ADD(dy) -> c (1,K,1,1) ; db = alpha*c + beta*db
    BiasActivation ConvolutionForward -> Pointwise ADD z (alpha1, alpha2) -> Pointwise ADD bias
                   -> Pointwise RELU_FWD | IDENTITY -> y   (z is not read when alpha2 == 0)
The three conv directions share one table-driven implementation (``DIRECTIONS``); the algo
enum and the math type are part of the plan-cache key and of the op attrs.
"""
from __future__ import annotations

import functools
import operator
import time
from dataclasses import dataclass

from cudnn_compat._backend.ir import Operation, OperationGraph, virtual
from cudnn_compat._backend.ops.convolution import output_dims
from .._core import call as _call
from .._core.call import ALPHA, BETA, blend, compute_dtype
from .._core.uids import SHARED, Uids
from .algos import (CuDNNAlgoPerf, INT8_CONFIGS, Layout, MIXED_DTYPES, NON_DETERMINISTIC, PREFERENCE,
                          Problem, TABLES, TENSOR_OP, config_of, unsupported, zero_workspace_algo)
from .._core.data import extent_bytes, scalar
from .._core.descriptor import resolve
from .._core.memo import Memo, call_site
from .._core.recipes import Recipe, steady
from .._core.registry import CUPY_NAMES, legacy
from ..enums import ENUMS, name_of
from ..errors import STATUS, bad_param, check, not_supported
from ..handle import get_handle
from ..tensor import VECTOR_WIDTH, FilterDescriptor, TensorDescriptor, tensor_desc
from .descriptor import ConvolutionDescriptor, conv_desc

D = ENUMS["cudnnDataType_t"]
D_DOUBLE = D["CUDNN_DATA_DOUBLE"]
F = ENUMS["cudnnTensorFormat_t"]
MATH = ENUMS["cudnnMathType_t"]
BAD_PARAM, NOT_SUPPORTED = STATUS["CUDNN_STATUS_BAD_PARAM"], STATUS["CUDNN_STATUS_NOT_SUPPORTED"]
SUCCESS, ALLOC_FAILED = STATUS["CUDNN_STATUS_SUCCESS"], STATUS["CUDNN_STATUS_ALLOC_FAILED"]
DETERMINISTIC, NON_DET = ENUMS["cudnnDeterminism_t"]["CUDNN_DETERMINISTIC"], ENUMS["cudnnDeterminism_t"]["CUDNN_NON_DETERMINISTIC"]

UIDS = Uids(after=SHARED)  # the convolution graphs' uids (ALPHA, BETA: the output blend's)
X, W, Y, Z, BIAS = UIDS.data(5)  # the graph's external tensors
ALPHA2 = UIDS.scalar()
CONV_OUT, SUM_Z, SUM_BIAS = UIDS.virtual(3)  # virtual tensors


# -- the three directions, one table --------------------------------------------------------------

@dataclass(frozen=True)
class Direction:
    """A convolution direction.  Problems are held in forward terms (x, w, y); ``order`` gives the
    x/w/y index of the legacy arguments (first input, second input, output)."""

    name: str  # FWD | BWD_DATA | BWD_FILTER
    kind: str  # graph op kind
    enum: str  # algo enum type
    prefix: str  # algo enum name prefix
    descs: tuple  # legacy descriptor argument names for x, w, y
    datas: tuple  # legacy data argument names for x, w, y
    roles: tuple  # graph roles for x, w, y
    order: tuple  # (first input, second input, output) as x/w/y indexes
    dims_status: int  # status when the y-shaped tensor has the wrong dims
    groups_status: int  # status when K is not a multiple of groupCount

    @property
    def out(self) -> int:
        return self.order[2]

    def algos(self) -> dict:
        """short name -> enum value (the COUNT sentinel excluded); the short name is what follows
        the prefix, with ALGO_ kept for the numbered ones: IMPLICIT_GEMM, FFT, ALGO_0, ALGO_3."""
        out = {}
        for k, v in ENUMS[self.enum].items():
            short = k[len(self.prefix):]
            if short != "COUNT":
                out["ALGO_" + short if short.isdigit() else short] = v
        return out

    def enum_name(self, short: str) -> str:
        """The C enum name of a short algo name."""
        return self.prefix + (short[len("ALGO_"):] if short[len("ALGO_"):].isdigit() else short)


FWD = Direction("FWD", "ConvolutionForward", "cudnnConvolutionFwdAlgo_t", "CUDNN_CONVOLUTION_FWD_ALGO_",
                ("xDesc", "wDesc", "yDesc"), ("x", "w", "y"), ("x", "w", "y"), (0, 1, 2), NOT_SUPPORTED, BAD_PARAM)
BWD_DATA = Direction("BWD_DATA", "ConvolutionBackwardData", "cudnnConvolutionBwdDataAlgo_t",
                     "CUDNN_CONVOLUTION_BWD_DATA_ALGO_", ("dxDesc", "wDesc", "dyDesc"), ("dx", "w", "dy"),
                     ("dx", "w", "dy"), (1, 2, 0), BAD_PARAM, NOT_SUPPORTED)
BWD_FILTER = Direction("BWD_FILTER", "ConvolutionBackwardFilter", "cudnnConvolutionBwdFilterAlgo_t",
                       "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_", ("xDesc", "dwDesc", "dyDesc"), ("x", "dw", "dy"),
                       ("x", "dw", "dy"), (0, 2, 1), BAD_PARAM, BAD_PARAM)
DIRECTIONS = {d.name: d for d in (FWD, BWD_DATA, BWD_FILTER)}


def _xwy(direction: Direction, first, second, out) -> list:
    """Legacy (first input, second input, output) -> [x, w, y]."""
    res = [None, None, None]
    for i, v in zip(direction.order, (first, second, out)):
        res[i] = v
    return res


@dataclass
class ConvCall:
    """A validated convolution problem in forward terms; builds keys and graphs for an algo."""

    direction: Direction
    xd: TensorDescriptor
    wd: FilterDescriptor
    yd: TensorDescriptor
    cd: ConvolutionDescriptor
    config: str

    @property
    def double(self) -> bool:
        return self.yd.dtype == "float64"

    def problem(self) -> Problem:
        lay = [Layout(d.dims, d.strides) for d in (self.xd, self.wd, self.yd)]
        wfmt = "NHWC" if self.wd.format == F["CUDNN_TENSOR_NHWC"] else "NCHW"
        return Problem(self.config, wfmt, *lay, self.cd.pad, self.cd.stride, self.cd.dilation)

    def key(self, algo: str, math: int, beta_zero: bool) -> tuple:
        """The plan-cache key of ``algo`` (suffix) with ``math``: with convDesc's own math type the key
        the call makes (``_call_key``), so the workspace and algorithm queries size and time the plan
        the call then runs (one plan, one search)."""
        dr = self.direction
        if math == self.cd.mathType:
            return _call_key(dr, self.xd, self.wd, self.yd, self.cd, dr.algos()[algo], beta_zero)
        return (dr.kind, self.xd.key(), self.wd.key(), self.yd.key(), self.cd.key(), algo, math, beta_zero)

    def conv_op(self, algo: str, math: int):
        """(conv op writing a virtual result, the output tensor)."""
        dr = self.direction
        ts = [self.xd.ir(X, dr.descs[0]), self.wd.ir(W, dr.descs[1]), self.yd.ir(Y, dr.descs[2])]
        out = ts[dr.out]
        ins = {dr.roles[i]: ts[i] for i in range(3) if i != dr.out}
        tmp = virtual(CONV_OUT, out.dims, self.cd.compute, f"{dr.roles[dr.out]}_conv")
        attrs = self.cd.attrs(dr.enum_name(algo), math)
        attrs["zero_workspace"] = algo == zero_workspace_algo(dr.name, self.problem())  # convolution/algos.py
        return Operation(dr.kind, ins, {dr.roles[dr.out]: tmp}, attrs), out

    def builder(self, algo: str, math: int, beta_zero: bool):
        def build():
            op, out = self.conv_op(algo, math)
            return OperationGraph([op, blend(op.outputs[self.direction.roles[self.direction.out]], out, beta_zero)],
                                  self.direction.kind)
        return build

    def tensors(self, first, second, out) -> dict:
        dr = self.direction
        datas = _xwy(dr, first, second, out)
        return {uid: (datas[i], dr.datas[i]) for i, uid in enumerate((X, W, Y))}


def _config(dr: Direction, xd, wd, yd, cd) -> str:
    """The data-type configuration; BAD_PARAM when the tensors' types disagree, NOT_SUPPORTED when
    the combination with convDesc's compute type is not in 002's tables."""
    for dsc, name in zip((xd, wd, yd), dr.descs):
        if dsc.dataType in VECTOR_WIDTH:
            raise not_supported(name, "vector data types (INT8x4, INT8x32, NCHW_VECT_C) are not supported")
    types = (xd.dtype, wd.dtype, yd.dtype)
    if len(set(types)) != 1 and not (dr is FWD and types in MIXED_DTYPES):
        raise bad_param(",".join(dr.descs), f"data types must match, got {', '.join(types)}")
    config = config_of(*types, cd.compute or "?")
    if config is None or (dr is not FWD and config in INT8_CONFIGS):
        raise not_supported("convDesc", f"compute type {name_of('cudnnDataType_t', cd.computeType)} with data "
                            f"{'/'.join(types)} is not a supported data type configuration")
    return config


def _conv_call(dr: Direction, first, second, out, convDesc) -> ConvCall:
    """Resolve and validate a call's descriptors (002 §5.2.10/§5.2.8/§6.2.2 'Returns')."""
    args = _xwy(dr, first, second, out)
    return _checked_call(dr, tensor_desc(args[0], dr.descs[0]), resolve(args[1], FilterDescriptor, dr.descs[1]),
                         tensor_desc(args[2], dr.descs[2]), conv_desc(convDesc))


def _checked_call(dr: Direction, xd, wd, yd, cd) -> ConvCall:
    """``_conv_call`` of descriptors already resolved (a call site's, in forward terms)."""
    xn, wn, yn = dr.descs
    check(yd.nbDims == xd.nbDims, yn, f"has {yd.nbDims} dims but {xn} has {xd.nbDims}")
    check(wd.nbDims == xd.nbDims, wn, f"has {wd.nbDims} dims but {xn} has {xd.nbDims}")
    check(xd.nbDims >= 3, xn, f"needs at least 3 dims, got {xd.nbDims}")
    check(cd.arrayLength == xd.nbDims - 2, "convDesc",
          f"arrayLength {cd.arrayLength} must be {xn} nbDims - 2 = {xd.nbDims - 2}")
    if xd.nbDims not in (4, 5):
        raise not_supported(xn, f"convolutions take 4-d or 5-d tensors, got {xd.nbDims} dims")
    config = _config(dr, xd, wd, yd, cd)
    g = cd.groupCount
    check(xd.dims[1] == wd.dims[1] * g, wn,
          f"feature maps disagree: {xn} has C={xd.dims[1]}, {wn} has C={wd.dims[1]} per group x groupCount={g}")
    check(wd.dims[0] % g == 0, wn, f"K={wd.dims[0]} is not a multiple of groupCount={g}", dr.groups_status)
    for i, (s, r, p, dl) in enumerate(zip(xd.dims[2:], wd.dims[2:], cd.pad, cd.dilation)):
        check((r - 1) * dl + 1 <= s + 2 * p, wn, f"dilated filter dim {i} is larger than the padded input ({s + 2 * p})")
    want = output_dims(xd.dims, wd.dims, cd.pad, cd.pad, cd.stride, cd.dilation)
    check(yd.dims == want, yn, f"dims {yd.dims} differ from the convolution's output dims {want}", dr.dims_status)
    return ConvCall(dr, xd, wd, yd, cd, config)


def _algo(dr: Direction, algo, call: "ConvCall | None" = None) -> str:
    """The algo's name suffix; BAD_PARAM for a non-enum value, NOT_SUPPORTED when it cannot run ``call``."""
    names = {v: k for k, v in dr.algos().items()}
    try:
        value = None if isinstance(algo, bool) else operator.index(algo)
    except TypeError:
        value = None
    if value not in names:
        raise bad_param("algo", f"{algo!r} is not a {dr.enum}")
    name = names[value]
    if call is not None:
        why = unsupported(dr.name, name, call.problem())
        if why:
            raise not_supported("algo", f"{dr.enum_name(name)} {why} (002 algorithm tables)")
    return name


_SITES = Memo("convolution forward/backward data/backward filter sites")


def _call_key(dr: Direction, xd, wd, yd, cd, algo, beta_zero: bool) -> tuple:
    """The plan-cache key of a convolution call (the descriptors' settings, the algo as passed)."""
    return (dr.kind, xd.key(), wd.key(), yd.key(), cd.key(), algo if type(algo) is int else repr(algo), beta_zero)


def _compute(dr: Direction, handle, alpha, descs: tuple, datas: tuple, convDesc, algo, workSpace,
             workSpaceSizeInBytes, beta) -> None:
    """The lean call path; ``descs``/``datas`` are (x, w, y) in forward terms.  The key is made from
    the descriptors' settings, and the validation of 002's rules runs inside the graph builder,
    i.e. once per signature on a plan-cache miss and still before anything is written; a cached
    call resolves, keys, binds and executes."""
    sk = (handle, dr.kind, descs[0], descs[1], descs[2], convDesc, algo)
    h, xd, wd, yd, cd, double, keys = _conv_site(sk, dr, handle, descs, convDesc, algo)
    a, b = scalar(alpha, "alpha", double), scalar(beta, "beta", double)
    beta_zero = b == 0
    key = keys[beta_zero]

    def build():
        call = _checked_call(dr, xd, wd, yd, cd)  # the descriptors resolved above
        return call.builder(_algo(dr, algo, call), cd.mathType, beta_zero)()

    names = dr.datas
    _call.run(h, key, build, {X: (datas[0], names[0]), W: (datas[1], names[1]), Y: (datas[2], names[2])},
              {ALPHA: a, BETA: b}, workSpace, int(workSpaceSizeInBytes or 0), workspace_arg="workSpaceSizeInBytes")


@call_site(_SITES)
def _conv_site(dr, handle, descs, convDesc, algo):
    """_compute's descriptors resolved and its plan-cache keys (002's rules: ``_checked_call`` in the
    builder)."""
    h = get_handle(handle)
    names = dr.descs
    xd = tensor_desc(descs[0], names[0])
    wd = resolve(descs[1], FilterDescriptor, names[1])
    yd = tensor_desc(descs[2], names[2])
    cd = resolve(convDesc, ConvolutionDescriptor, "convDesc")
    double = yd.dataType == D_DOUBLE
    keys = tuple(_call_key(dr, xd, wd, yd, cd, algo, bz)
                 for bz in (False, True))  # one key object per signature: _call.run's prepared call finds it
    return h, xd, wd, yd, cd, double, keys


@legacy("cudnnConvolutionForward")
def convolutionForward(handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workSpace, workSpaceSizeInBytes,
                       beta, yDesc, y) -> None:
    """y = alpha*conv(x, w) + beta*y (002 §5.2.10)."""
    _compute(FWD, handle, alpha, (xDesc, wDesc, yDesc), (x, w, y), convDesc, algo, workSpace, workSpaceSizeInBytes,
             beta)


@legacy("cudnnConvolutionBackwardData")
def convolutionBackwardData(handle, alpha, wDesc, w, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes,
                            beta, dxDesc, dx) -> None:
    """dx = alpha*convBwdData(w, dy) + beta*dx, the adjoint of the forward in x (002 §5.2.8)."""
    _compute(BWD_DATA, handle, alpha, (dxDesc, wDesc, dyDesc), (dx, w, dy), convDesc, algo, workSpace,
             workSpaceSizeInBytes, beta)


@legacy("cudnnConvolutionBackwardFilter")
def convolutionBackwardFilter(handle, alpha, xDesc, x, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes,
                              beta, dwDesc, dw) -> None:
    """dw = alpha*convBwdFilter(x, dy) + beta*dw, the adjoint of the forward in w (002 §6.2.2)."""
    _compute(BWD_FILTER, handle, alpha, (xDesc, dwDesc, dyDesc), (x, dw, dy), convDesc, algo, workSpace,
             workSpaceSizeInBytes, beta)


def _steady(wrapper, dr: Direction):
    """``wrapper`` with the recipe of ``_compute``'s call site for direction ``dr``."""
    x, w, y = dr.datas
    return steady(wrapper, _SITES, ("handle",) + dr.descs + ("convDesc", "algo"),
                  lambda h, xd, wd, yd, cd, dbl, keys: Recipe.blend(h, keys, {x: X, w: W, y: Y},
                                                                    workspace=("workSpace", "workSpaceSizeInBytes")),
                  site_key=lambda k: (k[0], dr.kind) + k[1:])


convolutionForward = _steady(convolutionForward, FWD)
convolutionBackwardData = _steady(convolutionBackwardData, BWD_DATA)
convolutionBackwardFilter = _steady(convolutionBackwardFilter, BWD_FILTER)


# -- algorithm queries ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _tensor_cores(place: str, device: int) -> bool:
    """Whether the handle's device has Tensor Cores (compute capability >= 7.0); never on the CPU."""
    if place != "gpu":
        return False
    try:
        import cupy
        return int(cupy.cuda.Device(device).compute_capability) >= 70
    except Exception:  # pragma: no cover - no usable device
        return False


def _math_types(h, dr: Direction, algo: str, cd) -> list:
    """Math types tried for ``algo``: FMA_MATH alone when convDesc asks for it (every algo then runs
    FMA kernels only, and libcudnn 9's Find reports math type FMA for each); convDesc's and
    DEFAULT_MATH for Tensor Core algos on a device that has them, else DEFAULT_MATH only (002
    §5.2.15 note)."""
    default = MATH["CUDNN_DEFAULT_MATH"]
    if cd.mathType == MATH["CUDNN_FMA_MATH"]:
        return [cd.mathType]
    if algo in TENSOR_OP[dr.name] and _tensor_cores(h.place, h.device) and cd.mathType != default:
        return [cd.mathType, default]
    return [default]


def _max_count(dr: Direction, handle) -> int:
    h = get_handle(handle)
    n = len(dr.algos())
    return n + (len(TENSOR_OP[dr.name]) if _tensor_cores(h.place, h.device) else 0)


def _requested(count) -> int:
    check(isinstance(count, int) and not isinstance(count, bool) and count >= 1, "requestedAlgoCount",
          f"must be an int >= 1, got {count!r}")
    return int(count)


def _candidates(h, call: ConvCall):
    """(algo suffix, enum value, math type, reason or None) in heuristic order."""
    dr = call.direction
    values = dr.algos()
    problem = call.problem()
    for name in PREFERENCE[dr.name]:
        why = unsupported(dr.name, name, problem)
        for math in _math_types(h, dr, name, call.cd):
            yield name, values[name], math, why


def _need(h, call: ConvCall, name: str, math: int) -> tuple:
    """(workspace bytes a call with ``name``/``math`` may need, whatever its beta, the beta == 0 plan):
    both blend variants are planned, so a caller who allocates this much can pass any beta."""
    plans = [_call.plan_for(h, call.key(name, math, bz), call.builder(name, math, bz)) for bz in (True, False)]
    return max(int(p.workspace_size) for p in plans), plans[0]


def _determinism(dr: Direction, name: str, plan=None) -> int:
    """The plan's own note when there is a plan (the engine that runs it knows), else 002's table."""
    if plan is not None:
        return DETERMINISTIC if "DETERMINISTIC" in plan.config.notes else NON_DET
    return NON_DET if name in NON_DETERMINISTIC[dr.name] else DETERMINISTIC


def _get_v7(dr: Direction, handle, first_desc, second_desc, convDesc, out_desc, requestedAlgoCount) -> list:
    """Heuristic ranking: every algo (and math type), supported ones first; memory is the
    workspace of the plan that algo gets, time is -1 (nothing is run)."""
    h = get_handle(handle)
    n = _requested(requestedAlgoCount)
    call = _conv_call(dr, first_desc, second_desc, out_desc, convDesc)
    good, bad = [], []
    for name, value, math, why in _candidates(h, call):
        if why:
            bad.append(CuDNNAlgoPerf(value, NOT_SUPPORTED, -1.0, 0, _determinism(dr, name), math))
            continue
        need, plan = _need(h, call, name, math)
        good.append(CuDNNAlgoPerf(value, SUCCESS, -1.0, need, _determinism(dr, name, plan), math))
    return (good + bad)[:n]


def _scratch(h, nbytes: int):
    """A zeroed buffer of ``nbytes`` on the handle's place (Find without user buffers)."""
    if h.place == "gpu":
        import cupy
        return cupy.zeros(max(nbytes, 1), cupy.uint8)
    import numpy as np
    return np.zeros(max(nbytes, 1), np.uint8)


FIND_REPS = 3  # timed repetitions per candidate on a GPU handle, after one untimed warm-up run
FIND_CALLS = 4  # back-to-back calls per repetition: the GPU time, not the host cost of one call


def _time_ms(h, fn) -> float:
    """Milliseconds of one ``fn()`` as Find reports it.  GPU handle: one warm-up run (first-run
    costs: pack and graph creation, lazy module loads), then FIND_REPS repetitions of FIND_CALLS
    back-to-back calls between CUDA events on the handle's stream, the fastest repetition's time
    per call (as cuDNN's own Find and torch's benchmark mode time: queued calls, so the host
    cost of one call does not count as kernel time); the CPU place: one run, wall time."""
    if h.place != "gpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import cupy
    stream = h.stream or cupy.cuda.get_current_stream()
    fn()
    best = float("inf")
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(FIND_REPS):
        start.record(stream)
        for _ in range(FIND_CALLS):
            fn()
        end.record(stream)
        end.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, end) / FIND_CALLS)
    return best


def _find(dr: Direction, h, call: ConvCall, n: int, datas, workspace=None, workspace_size=None) -> list:
    """Time every supported (algo, math type) through the plan path (``_time_ms``), alpha=1, beta=0 into the
    output buffer; sorted by measured time, failures last.  Algorithms whose plans run the same native
    engine config (the cudnn engine's autotune gave them the same winner) are timed once.  ``workspace_size`` None: allocate each
    plan's workspace (non-Ex); else algos needing more than it report ALLOC_FAILED."""
    tensors = call.tensors(*datas)
    good, bad = [], []
    timed: dict = {}  # native config -> ms: algorithms whose plans run the same cudnn engine config
    for name, value, math, why in _candidates(h, call):
        if why:
            bad.append(CuDNNAlgoPerf(value, NOT_SUPPORTED, -1.0, 0, _determinism(dr, name), math))
            continue
        key, build = call.key(name, math, True), call.builder(name, math, True)
        need, plan = _need(h, call, name, math)
        if workspace_size is not None and need > workspace_size:
            bad.append(CuDNNAlgoPerf(value, ALLOC_FAILED, -1.0, need, _determinism(dr, name, plan), math))
            continue
        ws, ws_size = (workspace, workspace_size) if workspace_size is not None else (
            (_scratch(h, need), need) if need else (None, 0))
        same = (plan.engine, plan.config) if plan.engine == "cudnn" else None
        ms = timed.get(same) if same else None
        if ms is None:
            ms = _time_ms(h, lambda: _call.run(h, key, build, tensors, {ALPHA: 1.0, BETA: 0.0}, ws, ws_size))
            if same:
                timed[same] = ms
        good.append(CuDNNAlgoPerf(value, SUCCESS, ms, need, _determinism(dr, name, plan), math))
    good.sort(key=lambda p: p.time)
    return (good + bad)[:n]


def _find_alloc(dr: Direction, handle, first_desc, second_desc, convDesc, out_desc, requestedAlgoCount) -> list:
    """Find* without user buffers: scratch tensors of the descriptors' extents (002 §5.2.15)."""
    h = get_handle(handle)
    n = _requested(requestedAlgoCount)
    call = _conv_call(dr, first_desc, second_desc, out_desc, convDesc)
    bufs = [_scratch(h, extent_bytes(d.ir(0))) for d in (call.xd, call.wd, call.yd)]
    first, second, out = (bufs[i] for i in dr.order)
    return _find(dr, h, call, n, (first, second, out))


def _find_ex(dr: Direction, handle, first_desc, first, second_desc, second, convDesc, out_desc, out,
             requestedAlgoCount, workSpace, workSpaceSizeInBytes) -> list:
    """Find*Ex: the caller's buffers (the output is overwritten) and workspace (002 §5.2.16)."""
    h = get_handle(handle)
    n = _requested(requestedAlgoCount)
    call = _conv_call(dr, first_desc, second_desc, out_desc, convDesc)
    for data, i in zip((first, second, out), dr.order):
        check(data is not None and not (isinstance(data, int) and data == 0), dr.datas[i], "is NULL")
    null_ws = workSpace is None or (isinstance(workSpace, int) and workSpace == 0)
    size = 0 if null_ws else int(workSpaceSizeInBytes or 0)
    return _find(dr, h, call, n, (first, second, out), workSpace, size)


def _workspace_size(dr: Direction, handle, first_desc, second_desc, convDesc, out_desc, algo) -> int:
    """Bytes of workspace the plans for ``algo`` need (beta zero or not)."""
    h = get_handle(handle)
    call = _conv_call(dr, first_desc, second_desc, out_desc, convDesc)
    name = _algo(dr, algo, call)
    return _need(h, call, name, call.cd.mathType)[0]


@legacy("cudnnGetConvolutionForwardAlgorithmMaxCount")
def getConvolutionForwardAlgorithmMaxCount(handle) -> int:
    """The largest number of results the forward algorithm queries return (002 §5.2.22)."""
    return _max_count(FWD, handle)


@legacy("cudnnGetConvolutionBackwardDataAlgorithmMaxCount")
def getConvolutionBackwardDataAlgorithmMaxCount(handle) -> int:
    """The largest number of results the backward-data algorithm queries return (002 §5.2.19)."""
    return _max_count(BWD_DATA, handle)


@legacy("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount")
def getConvolutionBackwardFilterAlgorithmMaxCount(handle) -> int:
    """The largest number of results the backward-filter algorithm queries return (002 §6.2.12)."""
    return _max_count(BWD_FILTER, handle)


@legacy("cudnnGetConvolutionForwardAlgorithm_v7")
def getConvolutionForwardAlgorithm_v7(handle, srcDesc, filterDesc, convDesc, destDesc, requestedAlgoCount) -> list:
    """[CuDNNAlgoPerf] in heuristic order (002 §5.2.23)."""
    return _get_v7(FWD, handle, srcDesc, filterDesc, convDesc, destDesc, requestedAlgoCount)


@legacy("cudnnGetConvolutionBackwardDataAlgorithm_v7")
def getConvolutionBackwardDataAlgorithm_v7(handle, filterDesc, diffDesc, convDesc, gradDesc, requestedAlgoCount) -> list:
    """[CuDNNAlgoPerf] in heuristic order (002 §5.2.20)."""
    return _get_v7(BWD_DATA, handle, filterDesc, diffDesc, convDesc, gradDesc, requestedAlgoCount)


@legacy("cudnnGetConvolutionBackwardFilterAlgorithm_v7")
def getConvolutionBackwardFilterAlgorithm_v7(handle, srcDesc, diffDesc, convDesc, gradDesc, requestedAlgoCount) -> list:
    """[CuDNNAlgoPerf] in heuristic order (002 §6.2.13)."""
    return _get_v7(BWD_FILTER, handle, srcDesc, diffDesc, convDesc, gradDesc, requestedAlgoCount)


@legacy("cudnnFindConvolutionForwardAlgorithm")
def findConvolutionForwardAlgorithm(handle, xDesc, wDesc, convDesc, yDesc, requestedAlgoCount) -> list:
    """[CuDNNAlgoPerf] sorted by measured time (002 §5.2.15)."""
    return _find_alloc(FWD, handle, xDesc, wDesc, convDesc, yDesc, requestedAlgoCount)


@legacy("cudnnFindConvolutionBackwardDataAlgorithm")
def findConvolutionBackwardDataAlgorithm(handle, wDesc, dyDesc, convDesc, dxDesc, requestedAlgoCount) -> list:
    """[CuDNNAlgoPerf] sorted by measured time (002 §5.2.13)."""
    return _find_alloc(BWD_DATA, handle, wDesc, dyDesc, convDesc, dxDesc, requestedAlgoCount)


@legacy("cudnnFindConvolutionBackwardFilterAlgorithm")
def findConvolutionBackwardFilterAlgorithm(handle, xDesc, dyDesc, convDesc, dwDesc, requestedAlgoCount) -> list:
    """[CuDNNAlgoPerf] sorted by measured time (002 §6.2.9)."""
    return _find_alloc(BWD_FILTER, handle, xDesc, dyDesc, convDesc, dwDesc, requestedAlgoCount)


@legacy("cudnnFindConvolutionForwardAlgorithmEx")
def findConvolutionForwardAlgorithmEx(handle, xDesc, x, wDesc, w, convDesc, yDesc, y, requestedAlgoCount,
                                      workSpace, workSpaceSizeInBytes) -> list:
    """[CuDNNAlgoPerf] sorted by measured time; y is overwritten (002 §5.2.16)."""
    return _find_ex(FWD, handle, xDesc, x, wDesc, w, convDesc, yDesc, y, requestedAlgoCount,
                    workSpace, workSpaceSizeInBytes)


@legacy("cudnnFindConvolutionBackwardDataAlgorithmEx")
def findConvolutionBackwardDataAlgorithmEx(handle, wDesc, w, dyDesc, dy, convDesc, dxDesc, dx, requestedAlgoCount,
                                           workSpace, workSpaceSizeInBytes) -> list:
    """[CuDNNAlgoPerf] sorted by measured time; dx is overwritten (002 §5.2.14)."""
    return _find_ex(BWD_DATA, handle, wDesc, w, dyDesc, dy, convDesc, dxDesc, dx, requestedAlgoCount,
                    workSpace, workSpaceSizeInBytes)


@legacy("cudnnFindConvolutionBackwardFilterAlgorithmEx")
def findConvolutionBackwardFilterAlgorithmEx(handle, xDesc, x, dyDesc, dy, convDesc, dwDesc, dw, requestedAlgoCount,
                                             workSpace, workSpaceSizeInBytes) -> list:
    """[CuDNNAlgoPerf] sorted by measured time; dw is overwritten (002 §6.2.10)."""
    return _find_ex(BWD_FILTER, handle, xDesc, x, dyDesc, dy, convDesc, dwDesc, dw, requestedAlgoCount,
                    workSpace, workSpaceSizeInBytes)


@legacy("cudnnGetConvolutionForwardWorkspaceSize")
def getConvolutionForwardWorkspaceSize(handle, xDesc, wDesc, convDesc, yDesc, algo) -> int:
    """Bytes of workspace cudnnConvolutionForward needs with ``algo`` (002 §5.2.24)."""
    return _workspace_size(FWD, handle, xDesc, wDesc, convDesc, yDesc, algo)


@legacy("cudnnGetConvolutionBackwardDataWorkspaceSize")
def getConvolutionBackwardDataWorkspaceSize(handle, wDesc, dyDesc, convDesc, dxDesc, algo) -> int:
    """Bytes of workspace cudnnConvolutionBackwardData needs with ``algo`` (002 §5.2.21)."""
    return _workspace_size(BWD_DATA, handle, wDesc, dyDesc, convDesc, dxDesc, algo)


@legacy("cudnnGetConvolutionBackwardFilterWorkspaceSize")
def getConvolutionBackwardFilterWorkspaceSize(handle, xDesc, dyDesc, convDesc, dwDesc, algo) -> int:
    """Bytes of workspace cudnnConvolutionBackwardFilter needs with ``algo`` (002 §6.2.14)."""
    return _workspace_size(BWD_FILTER, handle, xDesc, dyDesc, convDesc, dwDesc, algo)


# -- BackwardBias (002 §6.2.1; BiasActivationForward, §5.2.9, is convolution/bias_act.py) ----------

@legacy("cudnnConvolutionBackwardBias")
def convolutionBackwardBias(handle, alpha, dyDesc, dy, beta, dbDesc, db) -> None:
    """db[k] = alpha * sum over n and spatial of dy[n, k, ...] + beta*db[k]; db is 1xKx1x1[x1]."""
    h, dyd, dbd, (dbl, keys) = _bias_site((handle, dyDesc, dbDesc), handle, dyDesc, dbDesc)
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        dy_t, db_t = dyd.ir(X, "dy"), dbd.ir(Y, "db")
        tmp = virtual(CONV_OUT, db_t.dims, compute_dtype(db_t.dtype), "db_sum")
        return OperationGraph([Operation("Reduction", {"x": dy_t}, {"y": tmp}, {"mode": "ADD", "nan_propagation": "PROPAGATE"}),
                               blend(tmp, db_t, b == 0)], "ConvolutionBackwardBias")

    _call.run(h, keys[b == 0], build, {X: (dy, "dy"), Y: (db, "db")}, {ALPHA: a, BETA: b})


@call_site(Memo("cudnnConvolutionBackwardBias sites"))
def _bias_site(handle, dyDesc, dbDesc):
    """convolutionBackwardBias's descriptor resolving and checks, once per call site and settings:
    (handle, dyDesc, dbDesc, (double, plan keys for beta != 0 and beta == 0))."""
    h = get_handle(handle)
    dyd = tensor_desc(dyDesc, "dyDesc")
    dbd = tensor_desc(dbDesc, "dbDesc")
    check(dbd.dataType == dyd.dataType, "dbDesc", "data type must equal dyDesc's")
    check(dyd.nbDims >= 3, "dyDesc", f"needs at least 3 dims, got {dyd.nbDims}")
    want = (1, dyd.dims[1]) + (1,) * (dyd.nbDims - 2)
    check(dbd.dims == want, "dbDesc", f"must be {'x'.join(map(str, want))} (n and spatial dims 1, C of dyDesc), got {dbd.dims}")
    for name, dsc in (("dyDesc", dyd), ("dbDesc", dbd)):
        if dsc.dataType in VECTOR_WIDTH or dsc.dtype not in ("float32", "float64", "float16", "bfloat16"):
            raise not_supported(name, f"data type {name_of('cudnnDataType_t', dsc.dataType)} is not supported")
    keys = tuple(("ConvolutionBackwardBias", dyd.key(), dbd.key(), bz) for bz in (False, True))
    return h, dyd, dbd, (dyd.dtype == "float64", keys)


# CuPy 13 spellings that name the same functions (cupy_backends/cuda/cupy_cudnn.h macros).
CUPY_NAMES.update({
    "setConvolution2dDescriptor_v5": "cudnnSetConvolution2dDescriptor",
    "setConvolutionNdDescriptor_v3": "cudnnSetConvolutionNdDescriptor",
    "convolutionBackwardData_v3": "cudnnConvolutionBackwardData",
    "convolutionBackwardFilter_v3": "cudnnConvolutionBackwardFilter",
    "findConvolutionForwardAlgorithmEx_v7": "cudnnFindConvolutionForwardAlgorithmEx",
    "findConvolutionBackwardDataAlgorithmEx_v7": "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "findConvolutionBackwardFilterAlgorithmEx_v7": "cudnnFindConvolutionBackwardFilterAlgorithmEx",
})
