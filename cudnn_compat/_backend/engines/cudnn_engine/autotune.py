"""Autotuning the engine configs cuDNN offers for a graph (000 "Heuristics": mode A/B lists are
ranked by prediction; the frontend's ``cudnnFindPlan`` and torch's ``cudnn.benchmark`` time them).
Used when a plan is built, so a cached legacy call runs the config that is really fastest here,
not only the predicted one.

``CUDNN_COMPAT_CUDNN_AUTOTUNE`` unset: for a plain convolution graph (pattern conv_blend) every
config is timed: mode A's list, then the configs of the FALLBACK, INSTANT and B heuristics it
lacks, then knob variants of the first engines (``configs.query(tune=True)``,
``configs.with_variants``); mode A's first ``FIRST_K`` unconditionally, the others unless
runtime-compiled (``extra_ok``: their finalize compiles, about a second each) or needing more
than ``EXTRA_WORKSPACE_CAP`` bytes of workspace.  Fusion graphs time mode A's first 3 (each
finalize compiles).  Set to N: mode A's first N finalizable configs plus N more for variety
(``extra_k``: the FALLBACK ones and one of each engine not yet timed); 1 turns timing off.

Timing runs each plan on scratch buffers of the graph's tensor sizes (zeros; by-value scalars
1.0), once to warm up, once timed and, unless that run took ``PRUNE`` times the best so far,
``REPS`` times more between CUDA events.  Each config's time is kept per graph signature
(``graph_key``: tensors and ops, not the baked alpha/beta values; ``TIMES``), so the plans of
one convolution for every legacy algorithm and both blends (beta zero or not) time each config
once and each takes the fastest of its own candidates (``search``).  The choice is remembered
per (backend graph, candidate configs) and, with ``CUDNN_COMPAT_PLAN_CACHE_FILE`` set, persisted
to that file (``_backend.plan_cache.ConfigFile``: engine global index + knob choices per
signature of device, libcudnn version, backend graph and candidates), so a new process skips the
timing.  ``STATS`` counts timing runs (and choices taken from the file) for tests and benchmarks.
A graph planned under a call's workspace limit (``Native.workspace_limit``) is another tuning
(the limit is in its memo key and signature): ``SIZES`` keeps each finalized config's workspace
per graph signature, so its search skips the timed configs that do not fit and times only new ones.
"""
from __future__ import annotations

import ctypes
import os

from ... import config as _config
from ...plan_cache import chosen_config, remember_config
from . import lib as _lib

REPS = 3
FIRST_K = 8  # exhaustive tuning: mode A's first configs, timed even when runtime-compiled
PRUNE = 2.0  # a plan whose first timed run takes this many times the best so far is not run more
EXTRA_WORKSPACE_CAP = 256 << 20  # bytes: variety picks needing more are not timed
_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int32": 4,
             "int64": 8, "bool": 1}
_MEMO: dict = {}
STATS = {"timing_runs": 0, "plans_timed": 0, "from_file": 0, "from_table": 0}
TIMES: dict = {}  # (device, graph_key) -> {EngineConfig: ms}
SIZES: dict = {}  # (device, graph_key) -> {EngineConfig: workspace bytes of its finalized plan}
_DEVICE_ID: dict = {}


def top_k(spec) -> "int | None":
    """Mode A's configs to time: None for every config (unset, plain convolution), else the number."""
    raw = str(_config.get("CUDNN_COMPAT_CUDNN_AUTOTUNE") or "")
    if raw.lstrip("-").isdigit():
        return int(raw)
    return 3 if spec.pattern == "fusion" else None


def extra_k(spec, k: "int | None") -> int:
    """How many configs beyond mode A's first ``k`` to time: every one (``k`` None), ``k`` for a
    plain convolution graph, none for fusion graphs (each finalize compiles) or with timing off."""
    if k is None:
        return 1 << 30
    return k if k > 1 and spec.pattern == "conv_blend" else 0


def graph_key(spec) -> tuple:
    """What a config's time depends on: the graph's tensors and ops (not the baked scalar values)."""
    return (repr(sorted(spec.tensors.items())), repr(spec.ops))


def table(spec, device: int) -> dict:
    """{config: ms} timed so far for ``spec``'s graph on ``device`` (``TIMES``)."""
    if len(TIMES) > 4096:
        TIMES.clear()
    return TIMES.setdefault((device, graph_key(spec)), {})


def sizes(spec, device: int) -> dict:
    """{config: workspace bytes} of the plans finalized so far for ``spec``'s graph (``SIZES``):
    a search under a caller's workspace limit skips the timed configs known not to fit."""
    if len(SIZES) > 4096:
        SIZES.clear()
    return SIZES.setdefault((device, graph_key(spec)), {})


TIMED = object()  # ``search``: a config the table already has a time for


def search(order: list, times: dict, finalize, time_plans, k: int, k_extra: int, every: bool, unfit=None):
    """The autotune over ``order`` (candidate configs, heuristics order): the configs
    ``configs.tuning_order`` picks (``k``, ``k_extra``, ``every``) are finalized (``finalize(cfg,
    extra)`` -> (plan, workspace, keep) or None) unless ``times`` has them, the new ones timed in
    one batch (``time_plans([(plan, workspace)])`` -> [ms]) into ``times``, and the fastest
    candidate that finalizes wins.  Returns (winner, its (plan, workspace, keep), [(config, ms)]
    of every candidate considered, fastest first) or None when none finalizes; the plans of the
    others are destroyed.  A single candidate with no time is not timed.  ``unfit(cfg)``: True for a
    config known not to fit the caller's workspace limit (skipped, as one that does not finalize)."""
    from .configs import tuning_order
    made: dict = {}

    def pick(c, extra):
        if unfit is not None and unfit(c):
            return None
        if c in times:
            STATS["from_table"] += 1
            return TIMED
        got = finalize(c, extra)
        if got is not None:
            made[c] = got
        return got
    chosen = [c for c, _ in tuning_order(order, k, k_extra, pick, every)]
    if not chosen:
        return None
    new = [c for c in chosen if c in made]
    if new and len(chosen) > 1:
        for c, ms in zip(new, time_plans([made[c][:2] for c in new])):
            times[c] = ms
    ranked = sorted(chosen, key=lambda c: times.get(c, float("inf")))
    win = None
    for c in ranked:
        got = made.pop(c, None) or finalize(c, False)
        if got is not None:
            win = (c, got)
            break
    for _plan, _w, keep in made.values():
        for d in reversed(keep):
            d.destroy()
    if win is None:
        return None
    return win[0], win[1], [(c, times.get(c, float("nan"))) for c in ranked]


def extra_ok(cfg) -> bool:
    """Whether a variety pick may be finalized and timed: not a RUNTIME_COMPILATION config, whose
    finalize compiles kernels (about a second each; the FALLBACK list of an fp32 convolution
    has such TENSOR_CORE configs, allowed under DEFAULT_MATH)."""
    return "RUNTIME_COMPILATION" not in cfg.notes


def memo_key(spec, cfgs) -> tuple:
    return (repr(sorted(spec.tensors.items())), repr(spec.ops), spec.representative(), tuple(cfgs),
            spec.workspace_limit)


def _device_id(device: int) -> tuple:
    """(name, compute capability, libcudnn version): what a persisted choice is valid for."""
    got = _DEVICE_ID.get(device)
    if got is None:
        import cupy
        p = cupy.cuda.runtime.getDeviceProperties(device)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        got = _DEVICE_ID[device] = (name, f"{p['major']}.{p['minor']}", _lib.info()["version"])
    return got


def signature(spec, cfgs, device: int) -> str:
    """The persisted key of a tuning: stable across processes (no hash(), no frozenset order)."""
    limit = () if spec.workspace_limit is None else (("workspace_limit", spec.workspace_limit),)
    return repr(("cudnn-autotune", _device_id(device), repr(sorted(spec.tensors.items())), repr(spec.ops),
                 spec.representative(), [str(c) for c in cfgs]) + limit)


def known(key, spec, cfgs, device: int):
    """The config chosen before for this tuning: this process's memo, else the plan-cache file.
    The memo is per device (issue 17: two GPUs of different kinds time differently)."""
    cfg = _MEMO.get((device, key))
    if cfg is None:
        cfg = chosen_config("cudnn", signature(spec, cfgs, device), cfgs)
        if cfg is not None:
            STATS["from_file"] += 1
            _remember_here((device, key), cfg)
    return cfg


def remember(key, spec, cfgs, device: int, cfg, ms: float) -> None:
    """Keep the tuned choice (memo, and the plan-cache file when configured)."""
    _remember_here((device, key), cfg)
    name, cc, version = _device_id(device)
    remember_config("cudnn", signature(spec, cfgs, device), cfg, note=spec.describe(),
                    baked=[float(v) for v in spec.representative()], workspace_limit=spec.workspace_limit,
                    device=f"{name} (sm {cc}, libcudnn {version})",
                    ms=ms if ms == ms and ms != float("inf") else None)


def _remember_here(key, cfg) -> None:
    if len(_MEMO) > 4096:
        _MEMO.clear()
    _MEMO[key] = cfg


def extent_bytes(t) -> int:
    return (1 + sum((d - 1) * s for d, s in zip(t.dims, t.strides))) * _ITEMSIZE[t.dtype]


def _workspace(cupy, sizes: list):
    """(scratch workspace, its size): the largest of ``sizes`` that can be allocated."""
    for size in sorted(set(sizes), reverse=True):
        try:
            return cupy.empty(max(size, 1), cupy.uint8), size
        except cupy.cuda.memory.OutOfMemoryError:
            continue
    return cupy.empty(1, cupy.uint8), 0


def scratch_bindings(spec) -> tuple:
    """(buffers to keep alive, uids, pointers) binding ``spec``'s graph to zeroed scratch
    buffers of its tensors' extents and by-value scalars of 1.0 (float32), on the current device."""
    import cupy
    keep, uids, ptrs = [], [], []
    nscal = sum(1 for b in spec.bind if b[2])
    scal = (ctypes.c_float * max(nscal, 1))(*([1.0] * max(nscal, 1)))
    keep.append(scal)
    slot = 0
    for uid, _src, is_scalar in spec.bind:
        uids.append(uid)
        if is_scalar:
            ptrs.append(ctypes.addressof(scal) + 4 * slot)
            slot += 1
        else:
            buf = cupy.zeros(extent_bytes(spec.tensors[uid]) + 16, cupy.uint8)
            keep.append(buf)
            ptrs.append(buf.data.ptr)
    return keep, uids, ptrs


def time_plans(spec, plans: list, device: int) -> list:
    """Milliseconds per execute of each finalized plan ((plan descriptor, workspace) pairs)
    on scratch buffers; inf for a plan that fails to execute or whose workspace cannot be
    allocated.  Each plan runs once untimed, once timed, and when that run is within ``PRUNE``
    times the best so far ``REPS`` more times (the mean of those is its figure)."""
    import cupy
    STATS["timing_runs"] += 1
    STATS["plans_timed"] += len(plans)
    with cupy.cuda.Device(device):
        handle = _lib.handle_for(device, 0)
        keep, uids, ptrs = scratch_bindings(spec)
        wbuf, have = _workspace(cupy, [w for _, w in plans] or [0])
        vp = _lib.Descriptor("VARIANT_PACK")
        out = []
        try:
            vp.set("VARIANT_PACK_UNIQUE_IDS", "INT64", uids)
            vp.set("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", ptrs)
            vp.set("VARIANT_PACK_WORKSPACE", "VOID_PTR", wbuf.data.ptr)
            vp.finalize()
            execute = _lib.load().cudnnBackendExecute
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            null = cupy.cuda.Stream.null
            best = float("inf")
            for plan, w in plans:
                if w > have or execute(handle, plan.ptr, vp.ptr):
                    out.append(float("inf"))
                    continue
                start.record(null)
                execute(handle, plan.ptr, vp.ptr)
                end.record(null)
                end.synchronize()
                ms = cupy.cuda.get_elapsed_time(start, end)
                if ms <= PRUNE * best:
                    start.record(null)
                    for _ in range(REPS):
                        execute(handle, plan.ptr, vp.ptr)
                    end.record(null)
                    end.synchronize()
                    ms = cupy.cuda.get_elapsed_time(start, end) / REPS
                best = min(best, ms)
                out.append(ms)
        finally:
            vp.destroy()
            null_sync = cupy.cuda.Stream.null
            null_sync.synchronize()
            del keep, wbuf
    return out
