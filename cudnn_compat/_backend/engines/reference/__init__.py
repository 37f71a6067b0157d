"""The ``reference`` engine: NumPy on the CPU, float64 arithmetic, exact semantics.

Each op kind has a kernel ``fn(op, ins) -> {role: float64 array}`` registered with
``@kernel(kind)`` (``_kernels.py``) in a module of this package; ``ins`` maps the op's input roles to
float64 arrays (by-value tensors as 0-d arrays).  All external inputs are loaded
before any output is stored, so outputs may alias inputs (y read for beta blending).
On the GPU place the plan copies device buffers to the host and back.
"""
from __future__ import annotations

import numpy as np

from ... import dtypes
from ..base import REGISTRY, Engine, EngineConfig, ExecutionPlan
from ._kernels import KERNELS, kernel  # noqa: F401


def _to_host(buf):
    if isinstance(buf, np.ndarray):
        return buf
    get = getattr(buf, "get", None)  # CuPy array
    if get is not None:
        return get()
    return np.asarray(buf)


class ReferencePlan(ExecutionPlan):
    __slots__ = ()

    def execute(self, pack, stream=None):
        graph = self.graph
        env = {}
        for t in graph.external_inputs():
            buf = pack.data[t.uid]
            if t.is_by_value:
                env[t.uid] = np.asarray(buf, dtype=np.float64).reshape(())
            else:
                env[t.uid] = dtypes.load(_to_host(buf), t.dtype).reshape(t.dims)
        with np.errstate(all="ignore"):
            for op in graph.ops:
                ins = {role: env[t.uid] for role, t in op.inputs.items()}
                outs = KERNELS[op.kind](op, ins)
                for role, t in op.outputs.items():
                    val = np.broadcast_to(outs[role], t.dims)
                    if t.is_virtual and t.dtype != "float64":
                        # virtual tensors hold the compute type's precision, as on a GPU
                        val = dtypes.load(dtypes.to_storage(val, t.dtype), t.dtype)
                    env[t.uid] = val
        for t in graph.external_outputs():
            buf = pack.data[t.uid]
            if isinstance(buf, np.ndarray):
                dtypes.store(buf, env[t.uid], t.dtype)
            else:  # device buffer: round on the host, copy back
                host = dtypes.to_storage(np.broadcast_to(env[t.uid], t.dims), t.dtype)
                buf.set(np.ascontiguousarray(host)) if buf.flags.c_contiguous else _copy_strided(buf, host)


def _copy_strided(buf, host):
    import cupy
    buf[...] = cupy.asarray(host)


class ReferenceEngine(Engine):
    name = "reference"
    places = ("cpu", "gpu")

    def configs(self, graph, place, mode):
        return [EngineConfig(self.name, notes=frozenset({"DETERMINISTIC", "FALLBACK"}), index=0)]

    def op_kinds(self) -> dict:
        from ...ops import OP_SPECS
        return {k: None if k in KERNELS else "no reference kernel" for k in sorted(OP_SPECS)}

    def check_support(self, graph, place):
        missing = [op.kind for op in graph.ops if op.kind not in KERNELS]
        if missing:
            return f"no reference kernel for {', '.join(sorted(set(missing)))}"
        return None

    def build(self, graph, config):
        return ReferencePlan(graph, config, workspace_size=0)


REGISTRY.register(ReferenceEngine(), priority={"cpu": 100, "gpu": 100})  # the last GPU engine tried; the CPU one

from . import pointwise, reduction, matmul, conv, softmax, lrn, pooling, norm, rnn, adv  # noqa: E402,F401
