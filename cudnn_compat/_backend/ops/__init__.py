"""The op kinds of the graph IR, one module per family (000 "Supported graph patterns";
002 ch. 9 CUDNN_BACKEND_OPERATION_*_DESCRIPTOR; the semantics of every kind are in
docs/graph_ops.md).  Each family module holds its kinds' spec rows (``KINDS``), attributes,
finalize rules and shape functions:

    pointwise       Pointwise, Reduction, Matmul
    convolution     ConvolutionForward, ConvolutionBackwardData, ConvolutionBackwardFilter
    resample_norm   ResampleForward/Backward (pooling), NormForward/Backward (batch norm)
    softmax_lrn     Softmax[Backward], LRNForward/Backward, DivisiveNormalizationForward/Backward
    rnn             Rng (dropout masks), RNNRecurrence[Backward]
    ctc_sampler     CTCLoss, SpatialTfSamplerForward/Backward

Kinds are named after the backend operation descriptors where one exists; the legacy-only ones
(Softmax, LRN, ...) keep their legacy names.  Roles are the tensor attributes of the descriptor,
lower-cased.  ``OP_SPECS`` (kind -> ``OpSpec``) is assembled here from those tables and is read-only: a new
kind is a row in its family's ``KINDS`` (and a family module in ``FAMILIES``).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from . import convolution, ctc_sampler, pointwise, resample_norm, rnn, softmax_lrn
from ._common import GraphError, OpSpec, broadcastable, fail  # noqa: F401

if TYPE_CHECKING:
    from ..ir import Operation

FAMILIES = (pointwise, convolution, resample_norm, softmax_lrn, rnn, ctc_sampler)


def _assemble(families) -> Mapping[str, OpSpec]:
    table: dict = {}
    for family in families:
        for kind, spec in family.KINDS.items():
            if kind in table:
                raise RuntimeError(f"op kind {kind!r} is defined twice ({family.__name__})")
            table[kind] = spec
    return MappingProxyType(table)


OP_SPECS: Mapping[str, OpSpec] = _assemble(FAMILIES)


def validate_op(index: int, op: "Operation") -> None:
    """Run the per-kind shape and attribute rule of ``op`` (finalize, after the dataflow checks)."""
    spec = OP_SPECS.get(op.kind)
    if spec is not None and spec.rule is not None:
        spec.rule(index, op)
