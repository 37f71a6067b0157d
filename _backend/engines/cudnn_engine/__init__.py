"""The ``cudnn`` engine: graphs become real cuDNN 9 backend execution plans
(architecture.md "engines/cudnn"; 000 "Graph API"; 002 ch. 9).

- ``graph``: IR -> backend spec (pure Python; declines with a reason) -> descriptors.
- ``configs``: native heuristics (modes A/B/FALLBACK = CUDNN_HEUR_MODE_A/B/FALLBACK),
  engine configs with knobs and notes, math-type and legacy-algorithm selection.
- ``plan``: the ExecutionPlan and its lean per-call path.
- ``lib``: libcudnn 9 through ctypes, found with ``cuda.pathfinder``.

Importing needs neither CuPy nor libcudnn; ``available()`` says why the engine cannot
run when it cannot.  Every decision about a graph is cached on the graph object, so
``configs`` (heuristics) and ``build`` (plan finalize) of one graph share the work.
"""
from __future__ import annotations

from ..base import REGISTRY, Engine, EngineConfig, EngineDeclined
from . import configs as _configs
from . import lib as _lib
from .graph import Decline, NativeGraph, translate

_PLACEHOLDER_NOTES = frozenset({"DECLINED", "FALLBACK"})


class _State:
    """What the engine learned about one IR graph: its spec (or the reason it has none),
    a reason no config fits, and native plans finalized during the heuristics query."""

    def __init__(self):
        self.spec = None
        self.reason = None
        self.pending = {}  # EngineConfig -> (NativeGraph, plan desc, workspace, keep)

    def __del__(self):
        for ng, _plan, _ws, keep in self.pending.values():
            for d in reversed(keep):
                d.destroy()
            ng.destroy()
        self.pending = {}


def _state(graph) -> _State:
    st = graph.__dict__.get("_cudnn_state")
    if st is None:
        st = _State()
        try:
            st.spec = translate(graph)
        except Decline as e:
            st.reason = e.reason
        graph.__dict__["_cudnn_state"] = st
    return st


def _representative(spec) -> tuple:
    """(alpha, beta) baked into the native graph used for heuristics."""
    if spec.pattern != "conv_blend":
        return (1.0, 0.0)
    return (1.0, 1.0 if (spec.beta_uid is not None or spec.beta_default) else 0.0)


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

    def check_support(self, graph, place):
        if place not in self.places:
            return f"runs on the gpu place only, not {place}"
        return _state(graph).reason

    def _placeholder(self, reason: str) -> EngineConfig:
        return EngineConfig(self.name, (("declined", reason),), _PLACEHOLDER_NOTES, -1)

    def configs(self, graph, place, mode):
        """Native engine configs in cuDNN's heuristics order (after the math-type and
        algorithm selection).  Mode A returns the first config that finalizes first."""
        st = _state(graph)
        if st.spec is None:
            return [self._placeholder(st.reason)]
        spec = st.spec
        handle = _lib.handle_for(_device(), 0)
        try:
            ng = NativeGraph(spec, handle, *_representative(spec))
        except _lib.CudnnStatusError as e:
            return [self._placeholder(f"cuDNN rejected the operation graph: {e}")]
        try:
            found = _configs.query(_lib, ng.graph, mode)
        except _lib.CudnnStatusError as e:
            ng.destroy()
            return [self._placeholder(f"cuDNN heuristics (mode {mode}) failed: {e}")]
        ws = {c: w for c, w in found if w is not None}
        cfgs = _configs.select([c for c, _ in found], spec, ws)
        if not cfgs:
            ng.destroy()
            why = (f"cuDNN heuristics (mode {mode}) returned {len(found)} engine configs, none allowed by "
                   f"math type {spec.math_type}" + (f" for {spec.algo}" if spec.algo else "")) if found else \
                f"cuDNN heuristics (mode {mode}) returned no engine config for {spec.describe()}"
            return [self._placeholder(why)]
        if mode != "A":
            ng.destroy()
            return cfgs
        errors = []
        for i, cfg in enumerate(cfgs):
            try:
                plan, wsz, keep = _configs.execution_plan(_lib, handle, ng.graph, cfg)
            except _lib.CudnnStatusError as e:
                errors.append(f"{cfg}: {e.detail or e}")
                continue
            st.pending[cfg] = (ng, plan, wsz, keep)
            return [cfg] + cfgs[i + 1:]
        ng.destroy()
        return [self._placeholder("no engine config from cuDNN's heuristics finalized: " + "; ".join(errors[:3]))]

    def build(self, graph, config):
        st = _state(graph)
        if st.spec is None:
            raise EngineDeclined(self.name, st.reason)
        if config.index < 0:
            raise EngineDeclined(self.name, config.knob("declined", "no engine config"))
        from .plan import CudnnPlan
        device = _device()
        ab = _representative(st.spec)
        pending = st.pending.pop(config, None)
        if pending is None:
            handle = _lib.handle_for(device, 0)
            try:
                ng = NativeGraph(st.spec, handle, *ab)
            except _lib.CudnnStatusError as e:
                raise EngineDeclined(self.name, f"cuDNN rejected the operation graph: {e}")
            try:
                plan, wsz, keep = _configs.execution_plan(_lib, handle, ng.graph, config)
            except _lib.CudnnStatusError as e:
                ng.destroy()
                raise EngineDeclined(self.name, f"engine config {config} did not finalize: {e}")
            pending = (ng, plan, wsz, keep)
        ng, plan, wsz, keep = pending
        return CudnnPlan(graph, config, st.spec, device, ng, plan, wsz, keep, ab)


ENGINE = REGISTRY.register(CudnnEngine())
