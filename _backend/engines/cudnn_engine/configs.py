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
  DOWN_CONVERT_INPUTS; DEFAULT_MATH and TENSOR_OP_MATH forbid DOWN_CONVERT_INPUTS (TF32
  for float data stays allowed, as in legacy cuDNN 8+, unless NVIDIA_TF32_OVERRIDE=0);
  TENSOR_OP_MATH_ALLOW_CONVERSION allows everything.  A float32 compute type forbids
  REDUCED_PRECISION_REDUCTION.
  legacy algorithm: FFT algorithms take configs noted FFT, WINOGRAD ones configs noted
  WINOGRAD, the GEMM-like ones configs with neither; algorithms that legacy cuDNN
  documents as deterministic forbid NONDETERMINISTIC.  When no config has the
  algorithm's notes, the closest is the GEMM-like class with the same determinism.
"""
from __future__ import annotations

import os

from ..base import EngineConfig

HEUR_MODE = {"A": "A", "B": "B", "FALLBACK": "FALLBACK"}

# legacy algorithms that may be nondeterministic (002 §3.1.2.7/§3.1.2.8 determinism notes)
NONDETERMINISTIC_ALGOS = {
    "CUDNN_CONVOLUTION_BWD_DATA_ALGO_0",
    "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0",
    "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3",
}
# algorithms that use no workspace in legacy cuDNN: prefer zero-workspace configs
NO_WORKSPACE_ALGOS = {"CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM"}


def algo_class(algo: "str | None") -> "str | None":
    if algo is None:
        return None
    if "FFT" in algo:
        return "FFT"
    if "WINOGRAD" in algo:
        return "WINOGRAD"
    return "GEMM"


def allowed_by_math(notes, math_type: str, data_dtype: str, compute_type: str = "float32") -> bool:
    notes = set(notes)
    forbidden = set()
    if math_type == "FMA_MATH":
        forbidden |= {"TENSOR_CORE", "DOWN_CONVERT_INPUTS"}
    elif math_type in ("DEFAULT_MATH", "TENSOR_OP_MATH"):
        forbidden.add("DOWN_CONVERT_INPUTS")
        if (math_type == "DEFAULT_MATH" and data_dtype == "float32"
                and os.environ.get("NVIDIA_TF32_OVERRIDE", "").strip() == "0"):
            forbidden.add("TENSOR_CORE")
    if compute_type in ("float32", "float64"):
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


def for_algo(configs: list, algo: "str | None", workspace: "dict | None" = None) -> list:
    """``configs`` (heuristics order) narrowed to the legacy algorithm's numerical class."""
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
    return for_algo(ok, native.algo, workspace)


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
    try:
        nknobs = engcfg.count("ENGINECFG_KNOB_CHOICES", "BACKEND_DESCRIPTOR")
    except lib.CudnnStatusError:
        nknobs = lib.KNOB_TYPE_COUNTS
    for kc in engcfg.get_descriptors("ENGINECFG_KNOB_CHOICES", "KNOB_CHOICE", nknobs):
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


def query(lib, opgraph, mode: str):
    """[(EngineConfig, workspace or None)] from cuDNN's heuristics, fastest first."""
    heur = lib.Descriptor("ENGINEHEUR")
    try:
        heur.set("ENGINEHEUR_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", opgraph)
        heur.set("ENGINEHEUR_MODE", "HEUR_MODE", lib.HEUR_MODE[HEUR_MODE[mode]])
        heur.finalize()
        n = heur.count("ENGINEHEUR_RESULTS", "BACKEND_DESCRIPTOR")
        cfgs = heur.get_descriptors("ENGINEHEUR_RESULTS", "ENGINECFG", n)
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
