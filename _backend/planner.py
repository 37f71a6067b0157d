"""From a graph to a running plan: finalize, heuristics, first engine that accepts
(000 "Engine selection"; 003: try configs in order, fall back when one cannot run),
cached by call signature.  ``run`` is the one entry point the legacy layer uses."""
from __future__ import annotations

import logging
import time

from .engines.base import EngineDeclined, VariantPack
from .heuristics import forced_engine, get_engine_configs
from .ir import GraphError
from . import config as _config
from .plan_cache import CACHE, acquire, done

log = logging.getLogger("cudnn_compat")
_clock = time.perf_counter


def make_plan(graph, place: str, mode: str = "A", exclude=(), forced=None):
    """Finalize ``graph`` and build the first plan an engine accepts.  The plan carries
    ``declines``: [(engine or config, reason)] for every engine passed over."""
    if not graph.finalized:
        graph.finalize()
    configs, declines = get_engine_configs(graph, place, mode, forced)
    declines = list(declines)
    for eng, cfg in configs:
        if eng.name in exclude:
            declines.append((str(cfg), "excluded after an execution failure"))
            continue
        reason = eng.check_support(graph, place)
        if reason is None:
            try:
                plan = eng.build(graph, cfg)
            except EngineDeclined as e:
                reason = e.reason
            else:
                plan.declines = declines
                plan.place = place
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


# CUDNN_COMPAT_ENGINE through config (two dict lookups per call while it is unchanged); while the
# variable is absent from the environment (config's own view of it, os.environ's dict) the getter is
# not called at all: one dict lookup per call
_forced_setting = _config.getter("CUDNN_COMPAT_ENGINE")
_ENV_DICT = getattr(_config, "_ENV", None)
_ENGINE_KEY = getattr(_config, "_KEYS", {}).get("CUDNN_COMPAT_ENGINE")


def get_plan(key, build_graph, place: str, mode: str = "A"):
    """Cached plan for ``key``; on a miss ``build_graph()`` makes the graph.  A forced engine
    (``CUDNN_COMPAT_ENGINE``) is part of the key, so changing it never reuses another engine's plan.
    A hit is ``PlanCache.get`` inlined (the same lock-free steps)."""
    if _ENV_DICT is None or _ENGINE_KEY is None or _ENV_DICT.get(_ENGINE_KEY) is not None:
        if _forced_setting() is not None:
            forced = forced_engine()
            if forced:
                key = key + (("engine", forced),)
    cache = CACHE
    plan = cache._d.get(key)
    if plan is not None:
        try:
            cache._d.move_to_end(key)
        except KeyError:  # evicted by another thread since the lookup: still a valid plan for this call
            pass
        next(cache._hits)
        return plan
    plan = cache.get(key)  # a miss (counted there), or a plan another thread just added
    if plan is None:
        plan = make_plan(build_graph(), place, mode)
        CACHE.put(key, plan)
    return plan


def _out_of_memory(e: BaseException) -> bool:
    return any(c.__name__ in ("OutOfMemoryError", "MemoryError") for c in type(e).__mro__)


def execute(plan, data: dict, workspace=None, workspace_size: int = 0, stream=None, key=None):
    """Run ``plan``; when its engine fails at execute time (it declines, or raises), log it,
    evict the cached plan and rebuild on the next engine in heuristics order (003: fall back
    rather than fail).  Engines must fail before writing outputs.  Running out of memory is
    CUDNN_STATUS_ALLOC_FAILED, not a fallback; the reference engine's own errors propagate.

    The cached path first: a plan with ``fast(data, stream)`` (the cupy engine's launch records)
    runs the call there when it can, with no pack, timing or pinning (such plans hold nothing a
    concurrent eviction could free under a running launch: the record the call uses stays alive
    with the call).  ``last_time`` is then the time of the plan's last general execute."""
    fast = getattr(plan, "fast", None)
    if fast is not None:
        try:
            if fast(data, stream):
                return plan
        except Exception as e:  # noqa: BLE001 - a failed launch: the general path decides (fallback, ALLOC_FAILED)
            log.warning("engine %s: launch record failed (%s: %s); executing", plan.engine, type(e).__name__, e)
    pack = VariantPack(data, workspace, workspace_size)
    tried = []
    while True:
        if not acquire(plan):  # evicted and released by another thread since the lookup: rebuild it
            plan = make_plan(plan.graph, plan.place, exclude=tried)
            if key is not None:
                CACHE.put(key, plan)
            continue
        t0 = _clock()
        try:
            plan.execute(pack, stream)
            plan.last_time = _clock() - t0
            return plan
        except EngineDeclined as e:
            reason = e.reason
            log.warning("engine %s declined at execute (%s); falling back", plan.engine, reason)
        except Exception as e:
            if _out_of_memory(e):
                raise GraphError("WORKSPACE_ALLOCATION", f"engine {plan.engine} ran out of memory: {e}", "ALLOC_FAILED") from None
            if plan.engine == "reference":
                raise
            reason = f"{type(e).__name__}: {e}"
            log.error("engine %s failed at execute (%s); falling back", plan.engine, reason, exc_info=True)
        finally:
            done(plan)
        tried.append(plan.engine)
        if key is not None:
            CACHE.evict(key)
        plan = make_plan(plan.graph, plan.place, exclude=tried)
        if key is not None:
            CACHE.put(key, plan)


def run(key, build_graph, data: dict, place: str, workspace=None, workspace_size: int = 0, stream=None):
    plan = get_plan(key, build_graph, place)
    return execute(plan, data, workspace, workspace_size, stream, key)
