"""The ``cupy`` engine: CUDA kernels generated from the graph, compiled at run time by NVRTC
through CuPy (docs/architecture.md "Engines and heuristics"; 000 "Engines": a runtime-compiled engine).

Build (pure Python, no CuPy): ``grouping.partition`` splits the graph into fused
element-wise/reduction groups (one kernel each, ``codegen``) and heavy ops (softmax,
pooling, batch norm, LRN, divisive normalization: generated kernels with the following
element-wise ops, usually the alpha/beta blend, applied in their epilogue; matmul and the
convolutions: cuBLAS GEMMs via CuPy).  Execute: every step on the given stream, virtual
tensors between steps from CuPy's memory pool.  Sources are inspectable with
``kernel_sources(plan)`` and ``CUDNN_COMPAT_DUMP_KERNELS=dir``.

This module imports without CuPy; ``available()`` says why the engine cannot run here.
"""
from __future__ import annotations

import functools

from ..base import REGISTRY, Engine, EngineConfig, ExecutionPlan
from . import codegen, records, runtime
from .grouping import HeavyStep, partition
from .steps import PyRun, group_run

# heavy op kind -> module with supports(op) -> reason | None and build(step) -> [runs]
IMPLS: dict = {}


def register(kinds, module):
    for k in kinds:
        IMPLS[k] = module


def _no_launch(values, stream, workspace=None, workspace_size=0) -> bool:
    return False


class CupyPlan(ExecutionPlan):
    """The runs of a graph.  ``execute`` runs them (CuPy arrays between steps).  When every run
    is ``records.TRACEABLE`` the first execute on a stream also makes a launch record, and
    ``launch`` (``records.FastPath.launcher``, a prepared call's launcher) replays it for later
    calls: patch the argument slots, launch.  Such plans take raw device pointers
    (``raw_pointers``: the legacy layer binds a caller's buffer as its address after the same
    checks).  So do plans of Python steps only (``steps.PyRun``: cuBLAS GEMMs, RNN programs): their
    execute makes the arrays the steps take, or none where every step takes addresses
    (``PyRun.pointers``: an RNN program), and the legacy layer's binding makes no view per
    tensor.  A plan of one step that brings a launcher (``PyRun.launcher``: an RNN program, whose
    launch replays the CUDA graph of a call seen before) has that as its ``launch``."""

    __slots__ = ("runs", "_ext", "_path", "raw_pointers", "launch", "launch_order", "_views")

    def __init__(self, graph, config, runs):
        super().__init__(graph, config, workspace_size=0)
        self.runs = runs
        self.launch = _no_launch  # the record's launcher once a record exists
        ext = {t.uid: t for t in list(graph.external_inputs()) + list(graph.external_outputs())}
        self._ext = {u: t for u, t in ext.items() if not t.is_by_value}
        self._path = None
        if records.traceable(runs):
            kernels = self.kernels()
            try:
                layout = records.Layout(kernels, self._ext, frozenset(u for u, t in ext.items() if t.is_by_value))
            except ValueError:
                layout = None
            if layout is not None:
                align = tuple(sorted({u for spec in kernels for u in (getattr(spec, "aligned", ()) or ())
                                      if u in self._ext}))
                self._path = records.FastPath(layout, align, {u: _span_bytes(t) for u, t in self._ext.items()})
        py_steps = bool(runs) and all(type(r) is PyRun for r in runs)
        self.raw_pointers = self._path is not None or py_steps
        self._views = not (py_steps and all(r.pointers for r in runs))  # False: ints reach the steps as they are
        self.launch_order = self._path.order if self._path is not None else ()
        if self._path is None and py_steps and len(runs) == 1 and runs[0].launcher is not None:
            # one Python step with a launcher of its own (an RNN program: replay its CUDA graph)
            self.launch_order = tuple(sorted(self._ext)) + tuple(sorted(u for u, t in ext.items() if t.is_by_value))
            self.launch = runs[0].launcher(self.launch_order)

    @property
    def launch_mode(self) -> str:
        """'record' when cached calls replay launch records, 'program' when they replay a Python
        step's own CUDA graphs (an RNN program), else 'steps' (benchmarks, explain)."""
        if self._path is not None:
            return "record"
        return "program" if self.launch_order else "steps"

    def kernels(self) -> list:
        return [spec for r in self.runs for spec in r.kernels()]

    def execute(self, pack, stream=None):
        data = pack.data
        env = dict(data)
        if self.raw_pointers and self._views:
            for u, t in self._ext.items():
                v = env.get(u)
                if type(v) is int:
                    env[u] = runtime.view(v, t)
        ctx = {"workspace": pack.workspace, "workspace_size": pack.workspace_size}
        try:
            with runtime.on_stream(stream):
                tracer = self._tracer(env) if self._path is not None else None
                if tracer is None:
                    for r in self.runs:
                        r.run(env, ctx)
                    return
                runtime._TRACE.tracer = tracer
                try:
                    for r in self.runs:
                        r.run(env, ctx)
                finally:
                    runtime._TRACE.tracer = None
                if tracer.why is None and tracer.launches:
                    self._path.add(tracer)
                    self.launch = self._path.launch
        except Exception:
            if self.raw_pointers:  # the next engine gets CuPy arrays, not raw pointers
                for u, t in self._ext.items():
                    if type(data.get(u)) is int:
                        data[u] = runtime.view(data[u], t)
            raise

    def _tracer(self, env):
        """A Tracer for this execute, or None when a record for its stream and alignment exists."""
        path = self._path
        sptr = runtime.stream_ptr(None)  # inside on_stream: the stream the steps launch on
        ptrs = [runtime.pointer(env[u]) for u in path.align]
        sig = True if not any(p & 15 for p in ptrs) else tuple(p & 15 == 0 for p in ptrs)
        if (sptr, sig) in path.records:
            return None
        return records.Tracer(path.layout, self._ext, path.align, (sptr, sig))

    def release(self) -> None:
        if self._path is not None:
            self._path.clear()
        for r in self.runs:
            free = getattr(r, "release", None)
            if free is not None:
                free()


def epilogue_temps(step, runs) -> list:
    """``runs`` of a heavy step, the first with every virtual tensor its epilogues store (read by
    later steps: softmax * mask in attention) among the temps it allocates (issue 18: those were
    never allocated, a KeyError at launch)."""
    need = [t for g in step.epilogues.values() for t in g.stores.values() if t.is_virtual]
    have = {t.uid for r in runs for t in getattr(r, "temps", ())}
    missing = [t for t in need if t.uid not in have]
    if missing:
        first = next((r for r in runs if isinstance(getattr(r, "temps", None), list)), None)
        if first is None:  # pragma: no cover - every heavy run type keeps a temps list
            raise ValueError(f"{step.op.kind}: no run allocates the epilogue outputs")
        first.temps = list(first.temps) + missing
    return runs


def _span_bytes(t) -> int:
    from ... import dtypes
    return (1 + sum((d - 1) * s for d, s in zip(t.dims, t.strides))) * dtypes.itemsize(t.dtype)


def kernel_sources(plan) -> list:
    """The CUDA source of every kernel a cupy plan can launch (debugging aid)."""
    return [spec.source for spec in plan.kernels()]


@functools.lru_cache(maxsize=None)
def _unavailable() -> "str | None":
    try:
        import cupy
    except Exception as e:  # ImportError or a broken CUDA install
        return f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as e:
        return f"no CUDA device ({type(e).__name__}: {e})"
    return None


_DTYPES = set(codegen.STORAGE)


def _op_reason(op) -> "str | None":
    for t in list(op.inputs.values()) + list(op.outputs.values()):
        if t.dtype not in _DTYPES:
            return f"{op.kind}: data type {t.dtype} is not supported"
        if any(s < 0 for s in t.strides):
            return f"{op.kind}: negative strides are not supported"
    if op.kind == "Pointwise":
        if op.attrs.get("mode") not in codegen.POINTWISE_MODES:
            return f"pointwise mode {op.attrs.get('mode')} is not implemented"
        return None
    if codegen.is_elementwise(op):
        return None
    if op.kind == "Reduction":
        if op.attrs.get("mode") not in codegen.RED_INIT:
            return f"reduction mode {op.attrs.get('mode')} is not implemented"
        return None
    impl = IMPLS.get(op.kind)
    if impl is None:
        return f"no GPU kernel for {op.kind} yet"
    return impl.supports(op)


class CupyEngine(Engine):
    name = "cupy"
    places = ("gpu",)

    def available(self):
        return _unavailable()

    def configs(self, graph, place, mode):
        return [EngineConfig(self.name, notes=frozenset({"RUNTIME_COMPILATION", "DETERMINISTIC"}), index=0)]

    def op_kinds(self) -> dict:
        from ...ops import OP_SPECS
        runs = {"Pointwise", "Reduction"} | set(IMPLS)  # the element-wise and reduction codegen, then IMPLS
        return {k: None if k in runs else f"no GPU kernel for {k} yet" for k in sorted(OP_SPECS)}

    def check_support(self, graph, place):
        if place != "gpu":
            return "runs on the gpu place only"
        for op in graph.ops:
            why = _op_reason(op)
            if why:
                return why
        return None

    def build(self, graph, config):
        runs = []
        for step in partition(graph):
            if isinstance(step, HeavyStep):
                runs += epilogue_temps(step, IMPLS[step.op.kind].build(step))
            else:
                runs.append(group_run(step))
        return CupyPlan(graph, config, runs)


ENGINE = REGISTRY.register(CupyEngine(), priority={"gpu": 200})  # after cudnn, before reference

from . import gemm  # noqa: E402

register(("Matmul", "ConvolutionForward", "ConvolutionBackwardData", "ConvolutionBackwardFilter"), gemm)

from . import rowops  # noqa: E402

register(rowops.KINDS, rowops)

from . import stencil  # noqa: E402

register(stencil.KINDS, stencil)

from . import rnn  # noqa: E402  (RNN recurrence and Rng)

register(rnn.KINDS, rnn)

from . import ctc, sampler  # noqa: E402  (CTC loss; the spatial-transformer sampler)
from .grouping import EPILOGUE_ROLES  # noqa: E402

register(ctc.KINDS, ctc)
register(sampler.KINDS, sampler)
EPILOGUE_ROLES.update(sampler.EPILOGUE_ROLES)  # the sampler kernels apply the output blend themselves
