"""The ``cudnn`` engine: graphs become real cuDNN 9 backend execution plans
(docs/architecture.md "Engines and heuristics"; 000 "Graph API"; 002 ch. 9).

- ``graph``: IR -> backend spec (pure Python; declines with a reason) -> descriptors.
- ``configs``: native heuristics (modes A/B/FALLBACK = CUDNN_HEUR_MODE_A/B/FALLBACK),
  engine configs with knobs and notes, math-type and legacy-algorithm selection.
- ``autotune``: mode A times the configs that finalize (for a plain convolution every config
  of every heuristic mode and knob variants; for fusion graphs the first three) and keeps the
  fastest.  A graph planned for a call given less workspace than its plan needs
  (``workspace_limit``, _core/call.py ``fit_workspace``) takes the fastest config whose plan fits
  (configs timed before are not timed again; those known not to fit are skipped), and declines
  when none does.
- ``plan``: the ExecutionPlan and its lean per-call path.
- ``lib``: libcudnn 9 through ctypes, found with ``cuda.pathfinder``.

Importing needs neither CuPy nor libcudnn; ``available()`` says why the engine cannot
run when it cannot.  Every decision about a graph is kept for the graph object (``_STATES``,
a side table keyed weakly by the graph), so ``configs`` (heuristics) and ``build`` (plan
finalize) of one graph share the work.
"""
from __future__ import annotations

import weakref

from ..base import REGISTRY, Engine, EngineConfig, EngineDeclined
from . import autotune as _autotune
from . import configs as _configs
from . import lib as _lib
from .graph import Decline, NativeGraph, candidates

_PLACEHOLDER_NOTES = frozenset({"DECLINED", "FALLBACK"})


class _State:
    """What the engine learned about one IR graph: its candidate specs (or the reason it has
    none), the spec whose configs were returned, and native plans finalized while querying."""

    def __init__(self):
        self.candidates = []
        self.spec = None
        self.reason = None
        self.pending = {}  # (device, EngineConfig) -> (NativeGraph, plan desc, workspace, keep)
        self.autotune = None  # [(config, ms)] timed by the last mode-A query

    def __del__(self):
        for ng, _plan, _ws, keep in self.pending.values():
            for d in reversed(keep):
                d.destroy()
            ng.destroy()
        self.pending = {}


# IR graph -> its _State, for as long as the graph lives (the plans keep their graphs)
_STATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _state(graph) -> _State:
    st = _STATES.get(graph)
    if st is None:
        st = _State()
        try:
            st.candidates = candidates(graph)
            st.spec = st.candidates[0]
        except Decline as e:
            st.reason = e.reason
        _STATES[graph] = st
    return st


def _device() -> int:
    import cupy
    return cupy.cuda.runtime.getDevice()


class CudnnEngine(Engine):
    name = "cudnn"
    places = ("gpu",)

    def __init__(self):
        self._why = ()

    def available(self):
        if self._why != ():
            return self._why
        why = None
        try:
            import cupy
            if cupy.cuda.runtime.getDeviceCount() < 1:
                why = "no CUDA device"
        except Exception as e:
            why = f"CuPy or a CUDA device is not usable ({type(e).__name__}: {e})"
        if why is None:
            try:
                _lib.load()
            except _lib.CudnnUnavailable as e:
                why = str(e)
        self._why = why
        return why

    def op_kinds(self) -> dict:
        from ...ops import OP_SPECS
        from . import graph as g
        return {k: None if k in g.MAIN_KINDS or k == "Pointwise"
                else g.DECLINED_KINDS.get(k, f"no cuDNN backend translation for operation kind {k}")
                for k in sorted(OP_SPECS)}

    def check_support(self, graph, place):
        if place not in self.places:
            return f"runs on the gpu place only, not {place}"
        return _state(graph).reason

    def _placeholder(self, reason: str) -> EngineConfig:
        return EngineConfig(self.name, (("declined", reason),), _PLACEHOLDER_NOTES, -1)

    def configs(self, graph, place, mode):
        """Native engine configs in cuDNN's heuristics order (after the math-type and
        algorithm selection) for the first candidate spec that has any.  Mode A returns
        the first config that finalizes first (its plan is kept for ``build``)."""
        st = _state(graph)
        if not st.candidates:
            return [self._placeholder(st.reason)]
        handle = _lib.handle_for(_device(), 0)
        why = []
        for spec in st.candidates:
            got = self._configs_for(st, spec, handle, mode, why)
            if got:
                st.spec = spec
                return got
        return [self._placeholder("; ".join(why))]

    def _configs_for(self, st, spec, handle, mode, why) -> list:
        tag = spec.describe()
        try:
            ng = NativeGraph(spec, handle)
        except _lib.CudnnStatusError as e:
            why.append(f"{tag}: cuDNN rejected the operation graph ({e})")
            return []
        k = _autotune.top_k(spec)
        tune = mode == "A" and _autotune.extra_k(spec, k) > 0  # plain conv: + the other heuristics' lists
        try:
            found = _configs.query(_lib, ng.graph, mode, tune=tune)
        except _lib.CudnnStatusError as e:
            ng.destroy()
            why.append(f"{tag}: cuDNN heuristics (mode {mode}) failed ({e})")
            return []
        ws = {c: w for c, w in found if w is not None}
        cfgs = _configs.select([c for c, _ in found], spec, ws)
        if not cfgs:
            ng.destroy()
            why.append(f"{tag}: cuDNN heuristics (mode {mode}) returned {len(found)} engine configs, none allowed "
                       f"by math type {spec.math_type}" + (f" for {spec.algo}" if spec.algo else "") if found else
                       f"{tag}: cuDNN heuristics (mode {mode}) returned no engine config")
            return []
        if mode != "A":
            ng.destroy()
            return cfgs
        if tune and k is None and not spec.zero_workspace:  # every config: + knob variants of the first engines
            cfgs = _configs.with_variants(cfgs, self._knob_spaces(ng.graph, cfgs))
        key = _autotune.memo_key(spec, cfgs) if k is None or k > 1 else None
        known = _autotune.known(key, spec, cfgs, _device()) if key else None
        order = [known] + [c for c in cfgs if c != known] if known else cfgs
        errors = []
        limit = spec.workspace_limit
        sizes = _autotune.sizes(spec, _device())

        def finalize(cfg, extra):
            if extra and not _autotune.extra_ok(cfg):
                return None
            try:
                plan, wsz, keep = _configs.execution_plan(_lib, handle, ng.graph, cfg)
            except _lib.CudnnStatusError as e:
                errors.append(f"{cfg}: {e.detail or e}")
                return None
            sizes[cfg] = wsz
            if (extra and wsz > _autotune.EXTRA_WORKSPACE_CAP) or (limit is not None and wsz > limit):
                if limit is not None and wsz > limit:
                    errors.append(f"{cfg}: needs {wsz} bytes of workspace, the call gave {limit}")
                for d in reversed(keep):
                    d.destroy()
                return None
            return plan, wsz, keep

        # a remembered winner alone; else every config (k None) or mode A's first k and k_extra more
        if known or (k is not None and k <= 1):
            k_main, k_extra = 1, 0
        elif k is None:
            k_main, k_extra = _autotune.FIRST_K, len(order)
        else:
            k_main, k_extra = k, _autotune.extra_k(spec, k)
        times = _autotune.table(spec, _device())
        unfit = None if limit is None else (lambda c: sizes.get(c, 0) > limit)  # known not to fit: skipped
        got = _autotune.search(order, times, finalize, lambda plans: _autotune.time_plans(spec, plans, _device()),
                               k_main, k_extra, every=k is None, unfit=unfit)
        if got is None:
            ng.destroy()
            within = "" if limit is None else f" within the call's {limit} bytes of workspace"
            why.append(f"{tag}: no engine config finalized{within} ({'; '.join(e[:300] for e in errors[:3])})")
            return []
        cfg, (plan, wsz, keep), ranked = got
        st.autotune = [(str(c), t) for c, t in ranked] if len(ranked) > 1 else None
        if len(ranked) > 1:
            _autotune.remember(key, spec, cfgs, _device(), cfg, times.get(cfg, float("nan")))
        st.pending[(_device(), cfg)] = (ng, plan, wsz, keep)  # native objects of this device (issue 17)
        return [cfg] + [c for c in cfgs if c != cfg]

    @staticmethod
    def _knob_spaces(opgraph, cfgs) -> dict:
        """Engine global index -> its knob info (``configs.knob_space``) for the engines
        ``configs.with_variants`` expands; an engine whose info cannot be read has none."""
        out = {}
        for c in cfgs:
            if len(out) >= _configs.VARIANT_ENGINES:
                break
            if c.index not in out:
                try:
                    out[c.index] = _configs.knob_space(_lib, opgraph, c.index)
                except _lib.CudnnStatusError:
                    out[c.index] = []
        return out

    def build(self, graph, config):
        st = _state(graph)
        if not st.candidates:
            raise EngineDeclined(self.name, st.reason)
        if config.index < 0:
            raise EngineDeclined(self.name, config.knob("declined", "no engine config"))
        from .plan import CudnnPlan
        device = _device()
        spec = st.spec
        pending = st.pending.pop((device, config), None)
        if pending is None:
            handle = _lib.handle_for(device, 0)
            try:
                ng = NativeGraph(spec, handle)
            except _lib.CudnnStatusError as e:
                raise EngineDeclined(self.name, f"cuDNN rejected the operation graph: {e}")
            try:
                plan, wsz, keep = _configs.execution_plan(_lib, handle, ng.graph, config)
            except _lib.CudnnStatusError as e:
                ng.destroy()
                raise EngineDeclined(self.name, f"engine config {config} did not finalize: {e}")
            if spec.workspace_limit is not None and wsz > spec.workspace_limit:
                for d in reversed(keep):
                    d.destroy()
                ng.destroy()
                raise EngineDeclined(self.name, f"engine config {config} needs {wsz} bytes of workspace, "
                                                f"the call gave {spec.workspace_limit}")
            pending = (ng, plan, wsz, keep)
        ng, plan, wsz, keep = pending
        out = CudnnPlan(graph, config, spec, device, ng, plan, wsz, keep, spec.representative())
        out.autotune = st.autotune
        return out


ENGINE = REGISTRY.register(CudnnEngine(), priority={"gpu": 300})  # first on the GPU place
