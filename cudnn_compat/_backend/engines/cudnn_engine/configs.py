"""Native heuristics -> our EngineConfigs (000 "Heuristics", "Engines and engine
configurations"; 002 ch. 9 ENGINEHEUR, ENGINECFG, ENGINE, KNOB_CHOICE).

``query`` asks cuDNN's heuristics for an operation graph and describes every returned
engine config as an ``EngineConfig``: engine 'cudnn', ``index`` the engine's global
index, ``knobs`` ((knob type name, value), ...), ``notes`` the numerical and behaviour
notes by their cuDNN names (TENSOR_CORE, DOWN_CONVERT_INPUTS, NONDETERMINISTIC,
RUNTIME_COMPILATION, ...) plus DETERMINISTIC when NONDETERMINISTIC is absent and
FALLBACK for configs of the fallback heuristic.

``allowed_by_math`` and ``for_algo`` are the pure-Python selection rules:
  math type (002 §3.1.2 cudnnMathType_t): FMA_MATH forbids TENSOR_CORE and
  DOWN_CONVERT_INPUTS; DEFAULT_MATH and TENSOR_OP_MATH forbid DOWN_CONVERT_INPUTS;
  TENSOR_OP_MATH_ALLOW_CONVERSION allows it.  For FLOAT data a TENSOR_CORE config without
  DOWN_CONVERT_INPUTS is TF32: allowed only when ``_backend.math_policy.allow_tf32`` says so
  (a math type other than FMA_MATH, none for an op without a math type, never under
  NVIDIA_TF32_OVERRIDE=0).  A float32 compute type forbids REDUCED_PRECISION_REDUCTION, except for
  half/bfloat16 data under TENSOR_OP_MATH(_ALLOW_CONVERSION): the legacy library runs such Tensor Core
  engines there (the NHWC stem's "image_first" kernels, which torch runs too: twice as fast as any other).
  zero workspace: a graph whose conv op is the legacy algorithm the legacy layer designated
  as needing no workspace (op attr ``zero_workspace``, e.g. BWD_FILTER_ALGO_0) takes only
  configs whose heuristics-reported workspace is 0; with none, the engine declines and the
  cupy engine (no workspace) runs it, so such an algorithm really runs with workspace 0.
  legacy algorithm: FFT algorithms take configs noted FFT, WINOGRAD ones configs noted
  WINOGRAD, the GEMM-like ones configs with neither; algorithms that legacy cuDNN
  documents as deterministic forbid NONDETERMINISTIC.  When no config has the
  algorithm's notes, the closest is the GEMM-like class with the same determinism.

``merge``, ``knob_variants`` and ``tuning_order`` are the pure candidate rules of the autotune
(``autotune``): for a plain convolution graph mode A's list is followed by every config of the
other heuristics (FALLBACK, INSTANT, B: ``TUNE_SOURCES``) it lacks, then by knob variants of the
listed engines (``knob_variants``: each knob the engine exposes, ENGINE_KNOB_INFO, moved one at a
time over its range: split-K, tile, stages...), and the autotune times every one of them (mode A's
first configs unconditionally, the rest unless runtime-compiled or over the workspace cap), as
the frontend's find-plan and torch's cudnn.benchmark time what the heuristics offer.
"""
from __future__ import annotations

from ...math_policy import allow_tf32
from ..base import EngineConfig

HEUR_MODE = {"A": "A", "B": "B", "FALLBACK": "FALLBACK", "INSTANT": "INSTANT"}

# legacy algorithms that may be nondeterministic (002 §3.1.2.7/§3.1.2.8 determinism notes)
NONDETERMINISTIC_ALGOS = {
    "CUDNN_CONVOLUTION_BWD_DATA_ALGO_0",
    "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0",
    "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3",
}
# algorithms that use no workspace in legacy cuDNN: prefer zero-workspace configs
NO_WORKSPACE_ALGOS = {"CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM"}
# heuristics whose configs the mode-A autotune of a convolution also considers (``query(tune=True)``),
# in this order after mode A's own; benchmarks/conv_configs.py shows each list
TUNE_SOURCES = ("FALLBACK", "INSTANT", "B")
# knob variants (``knob_variants``): knobs never varied (they select data layouts or reorderings the
# graph fixes, not a schedule), values tried per knob, variants per engine, engines expanded
FIXED_KNOBS = frozenset({"EDGE", "USE_TEX", "IDX_MODE", "SPECFILT", "WORKSPACE"})
KNOB_VALUES = 6
VARIANTS_PER_ENGINE = 16
VARIANT_ENGINES = 4
# heuristics results read when cuDNN's element count answers 0 (``lib.Descriptor.all_descriptors``)
HEUR_RESULTS_MAX = 256


def algo_class(algo: "str | None") -> "str | None":
    if algo is None:
        return None
    if "FFT" in algo:
        return "FFT"
    if "WINOGRAD" in algo:
        return "WINOGRAD"
    return "GEMM"


def allowed_by_math(notes, math_type: "str | None", data_dtype: str, compute_type: str = "float32") -> bool:
    """Whether a config with numerical ``notes`` may run an op of ``math_type`` (None: the op
    has no math type) on ``data_dtype`` data; TF32 by ``math_policy.allow_tf32``."""
    notes = set(notes)
    forbidden = set()
    if math_type == "FMA_MATH":
        forbidden |= {"TENSOR_CORE", "DOWN_CONVERT_INPUTS"}
    elif math_type != "TENSOR_OP_MATH_ALLOW_CONVERSION":
        forbidden.add("DOWN_CONVERT_INPUTS")
    if (data_dtype == "float32" and "TENSOR_CORE" in notes and "DOWN_CONVERT_INPUTS" not in notes
            and not allow_tf32(data_dtype, math_type)):
        forbidden.add("TENSOR_CORE")  # a float32 tensor-core config is TF32
    if compute_type in ("float32", "float64") and not (
            data_dtype in ("float16", "bfloat16") and math_type in ("TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION")):
        forbidden.add("REDUCED_PRECISION_REDUCTION")
    return not (notes & forbidden)


def _in_class(cfg: EngineConfig, cls: str, deterministic: bool) -> bool:
    n = cfg.notes
    if deterministic and "NONDETERMINISTIC" in n:
        return False
    if cls == "FFT":
        return "FFT" in n
    if cls == "WINOGRAD":
        return any(x.startswith("WINOGRAD") for x in n)
    return "FFT" not in n and not any(x.startswith("WINOGRAD") for x in n)


def for_algo(configs: list, algo: "str | None", workspace: "dict | None" = None, zero_workspace: bool = False) -> list:
    """``configs`` (heuristics order) narrowed to the legacy algorithm's numerical class; with
    ``zero_workspace`` only the configs ``workspace`` (config -> bytes) reports needing none
    (possibly none at all: the engine then declines).  Among those, an algorithm 002 documents
    as deterministic (IMPLICIT_GEMM, or none named) takes deterministic configs when there are
    any; the nondeterministic ALGO_0s keep the atomics engines too, which is what the real
    library runs for them (BWD_DATA_ALGO_0 fp32 NCHW FMA at 1x1/2 256->512: 0.20 ms, the best
    deterministic zero-workspace config 0.59 ms on the H200), and the autotune takes the
    fastest; Find reports its determinism.  Deterministic callers name ALGO_1 (CuPy 13's
    ``deterministic=True``, Chainer's ``cudnn_deterministic``)."""
    if zero_workspace:
        configs = [c for c in configs if (workspace or {}).get(c) == 0]
        if algo is None or algo not in NONDETERMINISTIC_ALGOS:
            configs = [c for c in configs if "NONDETERMINISTIC" not in c.notes] or configs
    if algo is None:
        return list(configs)
    deterministic = algo not in NONDETERMINISTIC_ALGOS
    cls = algo_class(algo)
    picked = [c for c in configs if _in_class(c, cls, deterministic)]
    if not picked and cls != "GEMM":
        picked = [c for c in configs if _in_class(c, "GEMM", deterministic)]
    if not picked:
        picked = [c for c in configs if _in_class(c, "GEMM", False)] or list(configs)
    if algo in NO_WORKSPACE_ALGOS and workspace:
        picked.sort(key=lambda c: workspace.get(c, 1) > 0)  # stable: heuristics order within
    return picked


def select(configs: list, native, workspace: "dict | None" = None) -> list:
    """Math-type filter then algorithm mapping, for the spec ``native`` (graph.Native)."""
    ok = [c for c in configs if allowed_by_math(c.notes, native.math_type, native.data_dtype, native.compute_type)]
    return for_algo(ok, native.algo, workspace, bool(getattr(native, "zero_workspace", False)))


# --------------------------------------------------------------------------- native queries


def describe(lib, engcfg, fallback: bool = False):
    """(EngineConfig, workspace bytes or None) of a finalized ENGINECFG descriptor."""
    engine = engcfg.get_descriptors("ENGINECFG_ENGINE", "ENGINE", 1)[0]
    try:
        index = int(engine.get("ENGINE_GLOBAL_INDEX", "INT64")[0])
        notes = {lib.NOTE_NAME.get(v, f"NOTE_{v}") for v in engine.get("ENGINE_NUMERICAL_NOTE", "NUMERICAL_NOTE", 16)}
        try:
            notes |= {lib.BEHAVIOR_NAME.get(v, f"BEHAVIOR_{v}")
                      for v in engine.get("ENGINE_BEHAVIOR_NOTE", "BEHAVIOR_NOTE", 16)}
        except lib.CudnnStatusError:
            pass
    finally:
        engine.destroy()
    if "NONDETERMINISTIC" not in notes:
        notes.add("DETERMINISTIC")
    if fallback:
        notes.add("FALLBACK")
    knobs = []
    for kc in engcfg.all_descriptors("ENGINECFG_KNOB_CHOICES", "KNOB_CHOICE", lib.KNOB_TYPE_COUNTS):
        try:
            ktype = kc.get("KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE")[0]
            kval = kc.get("KNOB_CHOICE_KNOB_VALUE", "INT64")[0]
            knobs.append((lib.KNOB_NAME.get(ktype, f"KNOB_{ktype}"), int(kval)))
        finally:
            kc.destroy()
    ws = None
    try:
        ws = int(engcfg.get("ENGINECFG_WORKSPACE_SIZE", "INT64")[0])
    except lib.CudnnStatusError:
        pass
    return EngineConfig("cudnn", tuple(sorted(knobs)), frozenset(notes), index), ws


def query(lib, opgraph, mode: str, tune: bool = False):
    """[(EngineConfig, workspace or None)] from cuDNN's heuristics, fastest first.  Mode A is
    followed by the FALLBACK heuristic's zero-workspace configs it lacks (last, so they are
    chosen only when nothing before them is allowed): mode A can list only configs that need a
    workspace (3-D half backward filter on libcudnn 9.19: three TENSOR_CORE engines), and a
    legacy algorithm designated to need none must still find one (``for_algo``).

    ``tune`` (mode A for the autotune): every config of the ``TUNE_SOURCES`` heuristics that mode
    A lacks is appended, whatever its workspace (``merge``), as torch's cudnn.benchmark and the
    frontend's find-plan time the INSTANT and FALLBACK lists together: cuDNN's "legacy" engines
    (wgrad_alg0_engine, dgrad_engine: what legacy Find picks for fp32 NCHW) may appear only in
    the FALLBACK list, and with a workspace; mode B ranks other engines than mode A.  A source
    that fails (mode B has no model for a graph) adds nothing."""
    out = _query(lib, opgraph, mode)
    if mode == "A":
        for src in (TUNE_SOURCES if tune else ("FALLBACK",)):
            try:
                extra = _query(lib, opgraph, src)
            except lib.CudnnStatusError:
                extra = []
            out = merge(out, extra, any_workspace=tune)
    return out


def _ckey(cfg) -> tuple:
    return (cfg.index, cfg.knobs)


def merge(primary: list, extra: list, any_workspace: bool = False) -> list:
    """``primary`` [(config, workspace)] followed by the configs of ``extra`` it lacks (same
    engine global index and knob choices), in ``extra``'s order; without ``any_workspace`` only
    those whose workspace is 0."""
    have = {_ckey(c) for c, _ in primary}
    out = list(primary)
    for c, w in extra:
        if _ckey(c) in have or not (any_workspace or w == 0):
            continue
        have.add(_ckey(c))
        out.append((c, w))
    return out


def knob_variants(cfg: EngineConfig, space: list, per_knob: int = KNOB_VALUES,
                  cap: int = VARIANTS_PER_ENGINE) -> list:
    """Configs of ``cfg``'s engine with one knob moved: ``space`` is the engine's knob info
    [(knob type name, minimum, maximum, stride)] (ENGINE_KNOB_INFO); each knob not in
    ``FIXED_KNOBS`` takes up to ``per_knob`` values spread over its range (both ends included),
    the others keep ``cfg``'s choices; at most ``cap`` variants, knob by knob, none equal to ``cfg``.
    Variants carry ``cfg``'s notes (same engine) plus KNOB_VARIANT."""
    base = dict(cfg.knobs)
    notes = frozenset(cfg.notes - {"FALLBACK"}) | {"KNOB_VARIANT"}
    out, seen = [], {cfg.knobs}
    for name, lo, hi, stride in space:
        if name in FIXED_KNOBS or hi < lo:
            continue
        stride = max(int(stride), 1)
        n = (hi - lo) // stride + 1
        if n <= 1:
            continue
        count = min(per_knob, n)
        steps = sorted({round(i * (n - 1) / max(count - 1, 1)) for i in range(count)})
        for s in steps:
            v = lo + s * stride
            knobs = dict(base)
            knobs[name] = v
            key = tuple(sorted(knobs.items()))
            if key in seen:
                continue
            seen.add(key)
            out.append(EngineConfig("cudnn", key, notes, cfg.index))
            if len(out) >= cap:
                return out
    return out


def with_variants(cfgs: list, spaces: dict, engines: int = VARIANT_ENGINES) -> list:
    """``cfgs`` followed by the knob variants (``knob_variants``) of the first config of each of
    the first ``engines`` engines in ``cfgs`` order; ``spaces``: engine global index -> knob info
    (engines missing there have no variants)."""
    have = {_ckey(c) for c in cfgs}
    out, done = list(cfgs), []
    for c in cfgs:
        if len(done) >= engines:
            break
        if c.index in done:
            continue
        done.append(c.index)
        for v in knob_variants(c, spaces.get(c.index, ())):
            if _ckey(v) not in have:
                have.add(_ckey(v))
                out.append(v)
    return out


def knob_space(lib, opgraph, index: int) -> list:
    """[(knob type name, minimum, maximum, stride)] of engine ``index`` on ``opgraph``
    (ENGINE_KNOB_INFO: KNOB_INFO_TYPE, _MINIMUM_VALUE, _MAXIMUM_VALUE, _STRIDE)."""
    engine = lib.Descriptor("ENGINE")
    out = []
    try:
        engine.set("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", opgraph)
        engine.set("ENGINE_GLOBAL_INDEX", "INT64", index)
        engine.finalize()
        for ki in engine.all_descriptors("ENGINE_KNOB_INFO", "KNOB_INFO", lib.KNOB_TYPE_COUNTS):
            try:
                ktype = ki.get("KNOB_INFO_TYPE", "KNOB_TYPE")[0]
                lo = int(ki.get("KNOB_INFO_MINIMUM_VALUE", "INT64")[0])
                hi = int(ki.get("KNOB_INFO_MAXIMUM_VALUE", "INT64")[0])
                st = int(ki.get("KNOB_INFO_STRIDE", "INT64")[0])
                out.append((lib.KNOB_NAME.get(ktype, f"KNOB_{ktype}"), lo, hi, st))
            finally:
                ki.destroy()
    finally:
        engine.destroy()
    return out


def tuning_order(cfgs: list, k: int, k_extra: int, finalize, every: bool = False) -> list:
    """The configs the autotune times, as [(config, finalize(config))]: the first ``k`` of
    ``cfgs`` (heuristics order) whose ``finalize`` returns something other than None, then up to
    ``k_extra`` more, chosen for variety: first the configs of the FALLBACK heuristic (noted
    FALLBACK), then the first config of each engine (global index) not represented yet, each in
    ``cfgs`` order.  A mode-A list's top entries are often knob variants of one or two engines; the
    fast engine of a problem can sit lower, or only in the FALLBACK list.  ``finalize(config,
    extra)`` (``extra``: one of the variety picks) is called at most once per config, in the
    order returned; it returns None for a config that is not to be timed.  ``every``: after the
    FALLBACK picks, every remaining config in order (up to ``k_extra``), not one per engine."""
    got, tried = [], set()

    def attempt(c, extra=False):
        tried.add(c)
        v = finalize(c, extra)
        if v is not None:
            got.append((c, v))
        return v is not None

    n = 0
    for c in cfgs:
        if n >= k:
            break
        n += attempt(c)
    extra = 0
    for c in cfgs:
        if extra >= k_extra:
            break
        if c not in tried and "FALLBACK" in c.notes:
            extra += attempt(c, True)
    for c in cfgs:
        if extra >= k_extra:
            break
        if c not in tried and (every or c.index not in {g.index for g, _ in got}):
            extra += attempt(c, True)
    return got


def _query(lib, opgraph, mode: str):
    heur = lib.Descriptor("ENGINEHEUR")
    try:
        heur.set("ENGINEHEUR_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", opgraph)
        heur.set("ENGINEHEUR_MODE", "HEUR_MODE", lib.HEUR_MODE[HEUR_MODE[mode]])
        heur.finalize()
        cfgs = heur.all_descriptors("ENGINEHEUR_RESULTS", "ENGINECFG", HEUR_RESULTS_MAX)
    finally:
        heur.destroy()
    out, seen = [], set()
    for c in cfgs:
        try:
            cfg, ws = describe(lib, c, fallback=(mode == "FALLBACK"))
        except lib.CudnnStatusError:
            continue
        finally:
            c.destroy()
        if cfg not in seen:
            seen.add(cfg)
            out.append((cfg, ws))
    return out


def engine_config(lib, opgraph, cfg: EngineConfig, keep: list):
    """A finalized ENGINECFG for our ``cfg`` (engine global index + knob choices); the
    descriptors made are appended to ``keep`` (the caller destroys them)."""
    engine = lib.Descriptor("ENGINE")
    keep.append(engine)
    engine.set("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", opgraph)
    engine.set("ENGINE_GLOBAL_INDEX", "INT64", cfg.index)
    engine.finalize()
    choices = []
    for name, value in cfg.knobs:
        kc = lib.Descriptor("KNOB_CHOICE")
        keep.append(kc)
        kc.set("KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE", lib.KNOB_TYPE[name])
        kc.set("KNOB_CHOICE_KNOB_VALUE", "INT64", value)
        choices.append(kc.finalize())
    ec = lib.Descriptor("ENGINECFG")
    keep.append(ec)
    ec.set("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", engine)
    if choices:
        ec.set("ENGINECFG_KNOB_CHOICES", "BACKEND_DESCRIPTOR", choices)
    return ec.finalize()


def execution_plan(lib, handle: int, opgraph, cfg: EngineConfig):
    """(finalized EXECUTION_PLAN descriptor, workspace bytes, [descriptors to destroy])."""
    keep: list = []
    try:
        ec = engine_config(lib, opgraph, cfg, keep)
        plan = lib.Descriptor("EXECUTION_PLAN")
        keep.append(plan)
        plan.set("EXECUTION_PLAN_HANDLE", "HANDLE", handle)
        plan.set("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", ec)
        plan.finalize()
        ws = int(plan.get("EXECUTION_PLAN_WORKSPACE_SIZE", "INT64")[0])
    except Exception:
        for d in reversed(keep):
            d.destroy()
        raise
    return plan, ws, keep
