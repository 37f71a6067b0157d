"""The graph IR: tensors with UIDs, operations, operation graphs (000 "Key concepts";
002 ch. 9 CUDNN_BACKEND_TENSOR_DESCRIPTOR, CUDNN_BACKEND_OPERATION_*_DESCRIPTOR,
CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR).

A ``Tensor`` is a descriptor: uid, dims, element strides, dtype, virtual (an
intermediate that lives only inside a plan) and by-value (a host scalar such as
alpha or beta, supplied in the variant pack).  An ``Operation`` names its kind
after the backend descriptor it mirrors and binds tensors to roles.
``OperationGraph.finalize`` checks dataflow before any engine sees the graph and
raises ``GraphError`` naming the check that failed (seed 004's complaint).

Op kinds, their roles and per-kind rules are the package ``ops`` (one module per family,
assembled into ``ops.OP_SPECS``); the semantics of each kind are given in docs/graph_ops.md
and implemented by every engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .dtypes import DTYPES
from .ops import OP_SPECS, GraphError, validate_op


@dataclass(frozen=True)
class Tensor:
    """CUDNN_BACKEND_TENSOR_DESCRIPTOR: dims and strides in elements, outermost first."""

    uid: int
    dims: tuple
    strides: tuple
    dtype: str
    is_virtual: bool = False
    is_by_value: bool = False
    name: str = ""

    def __post_init__(self):
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        if self.dtype not in DTYPES:
            raise GraphError("TENSOR_DATA_TYPE", f"tensor {self.uid}: unknown data type {self.dtype!r}")
        if len(self.dims) != len(self.strides):
            raise GraphError("TENSOR_DIMENSIONS", f"tensor {self.uid}: {len(self.dims)} dims but {len(self.strides)} strides")

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def key(self) -> tuple:
        return (self.uid, self.dims, self.strides, self.dtype, self.is_virtual, self.is_by_value)


def packed_strides(dims) -> tuple:
    """Fully packed row-major strides for ``dims``."""
    strides, acc = [], 1
    for d in reversed(dims):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def virtual(uid: int, dims, dtype: str = "float32", name: str = "") -> Tensor:
    return Tensor(uid, tuple(dims), packed_strides(dims), dtype, is_virtual=True, name=name)


def scalar(uid: int, dtype: str = "float32", name: str = "") -> Tensor:
    """A by-value host scalar (alpha, beta, epsilon...) passed in the variant pack."""
    return Tensor(uid, (1,), (1,), dtype, is_by_value=True, name=name)


@dataclass
class Operation:
    kind: str
    inputs: Mapping[str, Tensor]
    outputs: Mapping[str, Tensor]
    attrs: dict = field(default_factory=dict)

    def signature(self) -> tuple:
        return (
            self.kind,
            tuple(sorted((r, t.uid) for r, t in self.inputs.items())),
            tuple(sorted((r, t.uid) for r, t in self.outputs.items())),
            tuple(sorted((k, _hashable(v)) for k, v in self.attrs.items())),
        )


def _hashable(v):
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


class OperationGraph:
    """CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: a list of operations, finalized once."""

    def __init__(self, ops, name: str = ""):
        self.ops = list(ops)
        self.name = name
        self.finalized = False
        self._signature = None

    # -- queries -------------------------------------------------------------
    def tensors(self) -> dict:
        out = {}
        for op in self.ops:
            for t in list(op.inputs.values()) + list(op.outputs.values()):
                out[t.uid] = t
        return out

    def external_inputs(self) -> list:
        produced = {t.uid for op in self.ops for t in op.outputs.values()}
        seen, res = set(), []
        for op in self.ops:
            for t in op.inputs.values():
                if t.uid not in produced and t.uid not in seen:
                    seen.add(t.uid)
                    res.append(t)
        return res

    def external_outputs(self) -> list:
        return [t for op in self.ops for t in op.outputs.values() if not t.is_virtual]

    def signature(self) -> tuple:
        if self._signature is None:
            self._signature = (
                tuple(op.signature() for op in self.ops),
                tuple(sorted(t.key for t in self.tensors().values())),
            )
        return self._signature

    # -- finalize ------------------------------------------------------------
    def finalize(self) -> "OperationGraph":
        """Dataflow checks; raises GraphError naming the failed check."""
        if not self.ops:
            raise GraphError("OPERATIONGRAPH_OPS", "the graph has no operations")
        by_uid: dict[int, Tensor] = {}
        producers: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            spec = OP_SPECS.get(op.kind)
            if spec is None:
                raise GraphError("OPERATION_KIND", f"op {i}: unknown operation kind {op.kind!r}", "NOT_SUPPORTED")
            for role in spec.required_inputs:
                if role not in op.inputs:
                    raise GraphError("OPERATION_INPUTS", f"op {i} ({op.kind}): required input {role!r} is missing")
            for role in spec.required_outputs:
                if role not in op.outputs:
                    raise GraphError("OPERATION_OUTPUTS", f"op {i} ({op.kind}): required output {role!r} is missing")
            allowed_in = set(spec.required_inputs) | set(spec.optional_inputs)
            allowed_out = set(spec.required_outputs) | set(spec.optional_outputs)
            for role in op.inputs:
                if role not in allowed_in:
                    raise GraphError("OPERATION_INPUTS", f"op {i} ({op.kind}): unknown input role {role!r}")
            for role in op.outputs:
                if role not in allowed_out:
                    raise GraphError("OPERATION_OUTPUTS", f"op {i} ({op.kind}): unknown output role {role!r}")
            read = {t.uid for t in op.inputs.values()}
            for role, t in op.outputs.items():
                if t.uid in read:
                    raise GraphError("OPERATION_READ_WRITE", f"op {i} ({op.kind}): tensor {t.uid} is both read and written")
                if t.is_by_value:
                    raise GraphError("TENSOR_BY_VALUE", f"op {i} ({op.kind}): by-value tensor {t.uid} cannot be an output")
                if t.uid in producers:
                    raise GraphError("TENSOR_SINGLE_PRODUCER", f"tensor {t.uid} is written by op {producers[t.uid]} and op {i}")
                producers[t.uid] = i
            for t in list(op.inputs.values()) + list(op.outputs.values()):
                prev = by_uid.setdefault(t.uid, t)
                if prev != t:
                    raise GraphError("TENSOR_UNIQUE_ID", f"uid {t.uid} names two different tensors")
                if any(d <= 0 for d in t.dims):
                    raise GraphError("TENSOR_DIMENSIONS", f"tensor {t.uid}: dims must be positive, got {t.dims}")
        # every virtual input must be produced by an earlier op (this also rules out cycles)
        for i, op in enumerate(self.ops):
            for role, t in op.inputs.items():
                p = producers.get(t.uid)
                if t.is_virtual and p is None:
                    raise GraphError("VIRTUAL_TENSOR_PRODUCER", f"op {i} ({op.kind}): virtual input {role} (uid {t.uid}) has no producer")
                if p is not None and p >= i:
                    raise GraphError("OPERATIONGRAPH_ORDER", f"op {i} ({op.kind}) reads tensor {t.uid} before op {p} writes it (cycle or wrong order)")
        consumed = {t.uid for op in self.ops for t in op.inputs.values()}
        for uid, i in producers.items():
            t = by_uid[uid]
            if t.is_virtual and uid not in consumed:
                raise GraphError("VIRTUAL_TENSOR_CONSUMER", f"virtual tensor {uid} written by op {i} is never read")
        for i, op in enumerate(self.ops):
            validate_op(i, op)
        self.finalized = True
        return self

    def describe(self) -> str:
        """Readable listing used by explain and error messages."""
        lines = [f"OperationGraph {self.name}".rstrip()]
        for i, op in enumerate(self.ops):
            ins = ", ".join(f"{r}={_tstr(t)}" for r, t in op.inputs.items())
            outs = ", ".join(f"{r}={_tstr(t)}" for r, t in op.outputs.items())
            attrs = ", ".join(f"{k}={v}" for k, v in op.attrs.items())
            lines.append(f"  [{i}] {op.kind}({ins}) -> {outs}" + (f" {{{attrs}}}" if attrs else ""))
        return "\n".join(lines)


def _tstr(t: Tensor) -> str:
    flag = "v" if t.is_virtual else ("s" if t.is_by_value else "")
    return f"#{t.uid}{flag}:{t.dtype}{list(t.dims)}"
