"""What every op family shares: the spec row of a kind, the finalize error and the generic
tensor checks (002 ch. 9 "Finalize" errors: BAD_PARAM for inconsistent attributes,
NOT_SUPPORTED for unsupported combinations).

This module imports only ``cudnn_compat/_backend/rules`` (which imports nothing): ``ir`` and every family
module build on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ..rules import require

if TYPE_CHECKING:
    from ..ir import Operation


class GraphError(Exception):
    """A graph that fails a finalize check.  ``status`` is 'BAD_PARAM' or 'NOT_SUPPORTED'."""

    def __init__(self, check: str, message: str, status: str = "BAD_PARAM"):
        require(check, status)  # the closed set of check names (cudnn_compat/_backend/rules.py)
        super().__init__(f"{check}: {message}")
        self.check = check
        self.status = status


@dataclass(frozen=True)
class OpSpec:
    """One op kind: its tensor roles (the descriptor's tensor attributes, lower-cased) and
    ``rule(index, op)``, the kind's shape and attribute checks run by ``OperationGraph.finalize``
    after the dataflow checks."""

    required_inputs: tuple
    optional_inputs: tuple = ()
    required_outputs: tuple = ()
    optional_outputs: tuple = ()
    rule: Optional[Callable] = None


def fail(index: int, op: "Operation", check: str, message: str, status: str = "BAD_PARAM"):
    raise GraphError(check, f"op {index} ({op.kind}): {message}", status)


def broadcastable(src: tuple, dst: tuple) -> bool:
    """Every dim of src equals dst's or is 1 (the AddTensor/OpTensor broadcast rule)."""
    return len(src) == len(dst) and all(s == d or s == 1 for s, d in zip(src, dst))


NAN_PROPAGATION = {"PROPAGATE", "NOT_PROPAGATE"}  # cudnnNanPropagation_t without the prefix
