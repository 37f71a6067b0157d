"""From a graph to a running plan: finalize, heuristics, first engine that accepts
(000 "Engine selection"; 003: try configs in order, fall back when one cannot run),
cached by call signature.  ``run`` is the one entry point the legacy layer uses."""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings

from .engines.base import EngineDeclined, VariantPack, device_views
from .heuristics import forced_engine, get_engine_configs
from .ir import GraphError
from . import config as _config
from .plan_cache import CACHE, acquire, done

# a child of the ``cudnn_compat`` logger (records reach its handlers and the application's); the
# NullHandler keeps logging's last-resort printer from writing an engine failure's traceback on
# stderr when the application configured no logging (a library does not print on its own)
log = logging.getLogger("cudnn_compat.planner")
log.addHandler(logging.NullHandler())
_clock = time.perf_counter


class CpuFallbackWarning(RuntimeWarning):
    """A call on a GPU handle ran on the CPU reference engine because no GPU engine could run its
    graph (``CUDNN_COMPAT_CPU_FALLBACK``; docs/not_supported.md).  Given once per call signature."""


_cpu_fallback = _config.getter("CUDNN_COMPAT_CPU_FALLBACK")
_warned: set = set()  # call signatures already warned about
_warned_lock = threading.Lock()
_WARNED_MAX = 1 << 16


def _engine_name(name: str) -> str:
    return str(name).split("#", 1)[0].split("[", 1)[0]


def fallback_reasons(declines) -> str:
    """'engine: reason; ...' over the GPU engines of ``declines`` (reference excluded)."""
    parts = []
    for n, r in declines:
        if _engine_name(n) != "reference":
            parts.append(f"{_engine_name(n)}: {r}")
    return "; ".join(parts) or "no GPU engine is registered"


def _kinds(graph) -> str:
    return ", ".join(dict.fromkeys(op.kind for op in graph.ops))


def _check_cpu_fallback(graph, plan, declines, key) -> None:
    """The reference engine was chosen on the GPU place by the heuristics: allowed with one
    CpuFallbackWarning per call signature, or NOT_SUPPORTED under CUDNN_COMPAT_CPU_FALLBACK=0."""
    reasons = fallback_reasons(declines)
    kinds = _kinds(graph)
    if not _cpu_fallback():
        raise GraphError("CPU_FALLBACK", f"no GPU engine can run this graph (op kinds: {kinds}) on the GPU handle "
                         f"and CUDNN_COMPAT_CPU_FALLBACK=0 forbids the CPU reference engine ({reasons})",
                         "NOT_SUPPORTED")
    plan.cpu_fallback = True
    sig = key if key is not None else graph.signature()
    with _warned_lock:
        if sig in _warned:
            return
        if len(_warned) >= _WARNED_MAX:
            _warned.clear()
        _warned.add(sig)
    msg = (f"no GPU engine can run this graph (op kinds: {kinds}); it runs on the CPU reference engine, with "
           f"copies to and from the device ({reasons}). Set CUDNN_COMPAT_CPU_FALLBACK=0 to make such calls "
           f"CUDNN_STATUS_NOT_SUPPORTED; docs/not_supported.md lists the op kinds without a GPU engine")
    try:
        _warn_at_caller(msg)
    except BaseException:  # -W error: the call fails, and the next one warns (raises) again
        with _warned_lock:
            _warned.discard(sig)
        raise


# frames of the library itself, passed over to find the user's call: the graph layer's folder, and
# what the layer above registers (``library_frames``: its package folder, its generated wrappers)
_LIBRARY_DIRS: list = [os.path.dirname(os.path.abspath(__file__)) + os.sep]
_WRAPPERS: list = []  # file-name prefixes of generated wrappers whose name ends with the function's


def library_frames(directory: str, wrapper_prefix: "str | None" = None) -> None:
    """Count frames in ``directory`` (and in generated code whose file name starts with
    ``wrapper_prefix``, named after the legacy function it wraps) as the library's own: a CPU
    fallback warning points at the first frame outside them and names the function."""
    d = os.path.abspath(directory) + os.sep
    if d not in _LIBRARY_DIRS:
        _LIBRARY_DIRS.append(d)
    if wrapper_prefix and wrapper_prefix not in _WRAPPERS:
        _WRAPPERS.append(wrapper_prefix)


def _warn_at_caller(msg: str) -> None:
    """warnings.warn_explicit at the first frame outside cudnn-compat (the user's call), with a
    registry of its own: the once-per-signature rule is ours, not the location's."""
    dirs = tuple(_LIBRARY_DIRS)
    f, function = sys._getframe(1), None
    while f is not None:
        name = f.f_code.co_filename
        prefix = next((p for p in _WRAPPERS if name.startswith(p)), None)
        if prefix is not None:  # the legacy layer's generated wrapper: it names the function
            function = name[len(prefix):].rstrip(">")
        elif not os.path.abspath(name).startswith(dirs):
            break
        f = f.f_back
    if function:
        msg = f"{function}: {msg}"
    if f is None:
        warnings.warn(msg, CpuFallbackWarning, stacklevel=2)
        return
    warnings.warn_explicit(msg, CpuFallbackWarning, f.f_code.co_filename, f.f_lineno,
                           module=f.f_globals.get("__name__", "<unknown>"), registry={},
                           module_globals=f.f_globals)


def forget_warnings() -> None:
    """Forget which call signatures were warned about (tests)."""
    with _warned_lock:
        _warned.clear()


def make_plan(graph, place: str, mode: str = "A", exclude=(), forced=None, key=None):
    """Finalize ``graph`` and build the first plan an engine accepts.  The plan carries
    ``declines``: [(engine or config, reason)] for every engine passed over.  ``exclude``: engine
    names, or (name, reason) pairs of engines that failed at execute (the reason is recorded).

    On the GPU place, the reference engine chosen by the heuristics (not forced) is a CPU
    fallback: ``CUDNN_COMPAT_CPU_FALLBACK`` allows it with one ``CpuFallbackWarning`` per call
    signature (``key``), or makes it NOT_SUPPORTED naming each engine's reason.  A graph with a
    ``workspace_limit`` (bytes: planned for a call given that much, ``_core.call.fit_workspace``)
    takes no plan needing more, and no CPU fallback on the GPU place."""
    if not graph.finalized:
        graph.finalize()
    forced = forced if forced is not None else forced_engine()
    excluded = dict(e if isinstance(e, tuple) else (e, "") for e in exclude)
    configs, declines = get_engine_configs(graph, place, mode, forced)
    # a path the caller tried before this graph (the fused attention of cudnn_compat.attention)
    declines = list(getattr(graph, "pre_declines", ())) + list(declines)
    limit = getattr(graph, "workspace_limit", None)  # planned for a call's workspace (_core/call.fit_workspace)
    for eng, cfg in configs:
        if limit is not None and place == "gpu" and eng.name == "reference" and not forced:
            declines.append((str(cfg), f"no CPU fallback for a call given {limit} bytes of workspace"))
            continue
        if eng.name in excluded:
            why = excluded[eng.name]
            if not why:
                why = "excluded after an execution failure"
            elif not why.startswith("declined at execute"):
                why = f"failed at execute ({why}; logged as an error on the cudnn_compat logger)"
            declines.append((str(cfg), why))
            continue
        reason = eng.check_support(graph, place)
        if reason is None:
            try:
                plan = eng.build(graph, cfg)
            except EngineDeclined as e:
                reason = e.reason
            else:
                if limit is not None and int(plan.workspace_size) > limit:
                    plan.release()
                    declines.append((str(cfg), f"needs {plan.workspace_size} bytes of workspace, the call gave {limit}"))
                    continue
                plan.declines = declines
                plan.place = place
                if place == "gpu" and eng.name == "reference" and not forced:
                    _check_cpu_fallback(graph, plan, declines, key)
                _log_plan(graph, plan)
                return plan
        declines.append((str(cfg), reason))
    detail = "; ".join(f"{n}: {r}" for n, r in declines) or "no engine is registered"
    raise GraphError("ENGINE_SUPPORT", f"no engine can run this graph ({detail})", "NOT_SUPPORTED")


def _log_plan(graph, plan):
    if log.isEnabledFor(logging.INFO):
        lines = [graph.describe()]
        lines += [f"  declined {n}: {r}" for n, r in plan.declines]
        lines.append(f"  chosen {plan.config} (workspace {plan.workspace_size} bytes)")
        log.info("\n".join(lines))


# CUDNN_COMPAT_ENGINE through config (two dict lookups per call while it is unchanged); while neither
# it nor CUDNN_COMPAT_CPU_FALLBACK is set or overridden (config.unset_fast: a dict lookup each) the
# getters are not called at all
_forced_setting = _config.getter("CUDNN_COMPAT_ENGINE")
DEFAULTS_APPLY = _config.unset_fast("CUDNN_COMPAT_ENGINE", "CUDNN_COMPAT_CPU_FALLBACK")
DEFAULTS_PARTS = _config.unset_parts("CUDNN_COMPAT_ENGINE", "CUDNN_COMPAT_CPU_FALLBACK")  # inlined by _core.call.run


def get_plan(key, build_graph, place: str, mode: str = "A"):
    """Cached plan for ``key``; on a miss ``build_graph()`` makes the graph.  A forced engine
    (``CUDNN_COMPAT_ENGINE``) is part of the key, so changing it never reuses another engine's plan.
    So is ``CUDNN_COMPAT_CPU_FALLBACK=0``: a CPU-fallback plan cached while it was allowed is not
    reused once it is forbidden."""
    if not DEFAULTS_APPLY():
        if _forced_setting() is not None:
            forced = forced_engine()
            if forced:
                key = key + (("engine", forced),)
        if not _cpu_fallback():
            key = key + (("cpu_fallback", False),)
    plan = CACHE.get(key)  # a hit (made most recently used) or a miss, counted there
    if plan is None:
        plan = make_plan(build_graph(), place, mode, key=key)
        CACHE.put(key, plan)
    return plan


def _out_of_memory(e: BaseException) -> bool:
    return any(c.__name__ in ("OutOfMemoryError", "MemoryError") for c in type(e).__mro__)


def launch_failed(plan, e: BaseException) -> bool:
    """What a launcher that raised (``plan.launch``, the cached path of ``execute`` and of a
    prepared call) comes to: logged, and False: nothing ran, the caller's general path decides
    (fallback, ALLOC_FAILED)."""
    log.warning("engine %s: cached launch failed (%s: %s); executing", plan.engine, type(e).__name__, e)
    return False


def execute(plan, data: dict, workspace=None, workspace_size: int = 0, stream=None, key=None):
    """Run ``plan``; when its engine fails at execute time (it declines, or raises), log it,
    evict the cached plan and rebuild on the next engine in heuristics order (003: fall back
    rather than fail).  Engines must fail before writing outputs.  Running out of memory is
    CUDNN_STATUS_ALLOC_FAILED, not a fallback; the reference engine's own errors propagate.

    The cached path first: a plan with a launcher (``launch_order``: the cupy engine's launch
    records, the cudnn engine's cached packs) runs the call there when it can, with no pack,
    timing or pinning (the launcher keeps what it uses alive, or holds the plan's lock against
    its release).  ``last_time`` is then the time of the plan's last general execute."""
    order = plan.launch_order
    if order and plan.raw_pointers:
        try:
            if plan.launch(tuple([data[u] for u in order]), stream, workspace, workspace_size):
                return plan
        except Exception as e:  # noqa: BLE001 - the general path decides
            launch_failed(plan, e)
    pack = VariantPack(data, workspace, workspace_size)
    tried = []  # (engine, reason) of the engines that failed at execute
    while True:
        if not acquire(plan):  # evicted and released by another thread since the lookup: rebuild it
            plan = _replan(plan, tried, key)
            continue
        t0 = _clock()
        try:
            plan.execute(pack, stream)
            plan.last_time = _clock() - t0
            return plan
        except EngineDeclined as e:
            reason = f"declined at execute: {e.reason}"
            log.warning("engine %s declined at execute (%s); falling back", plan.engine, e.reason)
        except Exception as e:
            if _out_of_memory(e):
                raise GraphError("WORKSPACE_ALLOCATION", f"engine {plan.engine} ran out of memory: {e}", "ALLOC_FAILED") from None
            if plan.engine == "reference":
                raise
            reason = f"{type(e).__name__}: {e}"
            # a bug in the engine: an ERROR record with the traceback (exc_info), never printed by us
            log.error("engine %s (%s) failed at execute (%s); falling back to the next engine",
                      plan.engine, plan.config, reason, exc_info=True)
        finally:
            done(plan)
        tried.append((plan.engine, reason))
        if key is not None:
            CACHE.evict(key)
        if getattr(plan, "raw_pointers", False):  # however it failed, the next engine gets arrays
            device_views(plan.graph, pack.data)
        plan = _replan(plan, tried, key)


def _replan(plan, tried, key):
    """The next engine's plan for ``plan``'s graph, ``tried`` excluded; it records the failures
    (``failures``: [(engine, reason)], shown by explain through its declines)."""
    new = make_plan(plan.graph, plan.place, exclude=tried, key=key)
    new.failures = list(tried)
    if key is not None:
        CACHE.put(key, new)
    return new


def run(key, build_graph, data: dict, place: str, workspace=None, workspace_size: int = 0, stream=None):
    plan = get_plan(key, build_graph, place)
    return execute(plan, data, workspace, workspace_size, stream, key)
