"""The ``cupy`` engine: CUDA kernels generated from the graph, compiled at run time by NVRTC
through CuPy (architecture.md "engines/cupy"; 000 "Engines": a runtime-compiled engine).

Build (pure Python, no CuPy): ``fusion.partition`` splits the graph into fused
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
from . import codegen, runtime
from .fusion import HeavyStep, partition
from .steps import group_run

# heavy op kind -> module with supports(op) -> reason | None and build(step) -> [runs]
IMPLS: dict = {}


def register(kinds, module):
    for k in kinds:
        IMPLS[k] = module


class CupyPlan(ExecutionPlan):
    def __init__(self, graph, config, runs):
        super().__init__(graph, config, workspace_size=0)
        self.runs = runs

    def kernels(self) -> list:
        return [spec for r in self.runs for spec in r.kernels()]

    def execute(self, pack, stream=None):
        env = dict(pack.data)
        ctx = {"workspace": pack.workspace, "workspace_size": pack.workspace_size}
        with runtime.on_stream(stream):
            for r in self.runs:
                r.run(env, ctx)


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
                runs += IMPLS[step.op.kind].build(step)
            else:
                runs.append(group_run(step))
        return CupyPlan(graph, config, runs)


ENGINE = REGISTRY.register(CupyEngine())

from . import gemm  # noqa: E402

register(("Matmul", "ConvolutionForward", "ConvolutionBackwardData", "ConvolutionBackwardFilter"), gemm)

from . import rowops  # noqa: E402

register(rowops.KINDS, rowops)

from . import stencil  # noqa: E402

register(stencil.KINDS, stencil)

from . import rnn  # noqa: E402  (RNN recurrence and Rng)

register(rnn.KINDS, rnn)
