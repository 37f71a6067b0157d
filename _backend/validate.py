"""Per-kind shape and attribute rules run by ``OperationGraph.finalize`` (002 ch. 9
"Finalize" errors: BAD_PARAM for inconsistent attributes, NOT_SUPPORTED for
unsupported combinations).  Each family registers its rules with ``@rule(kind)``
in a module of its own (validate_*.py), imported at the end of this file.
"""
from __future__ import annotations

from .ir import GraphError, Operation

RULES: dict = {}


def rule(kind: str):
    def deco(fn):
        RULES[kind] = fn
        return fn
    return deco


def validate_op(index: int, op: Operation) -> None:
    fn = RULES.get(op.kind)
    if fn is not None:
        fn(index, op)


def fail(index: int, op: Operation, check: str, message: str, status: str = "BAD_PARAM"):
    raise GraphError(check, f"op {index} ({op.kind}): {message}", status)


def broadcastable(src: tuple, dst: tuple) -> bool:
    """Every dim of src equals dst's or is 1 (the AddTensor/OpTensor broadcast rule)."""
    return len(src) == len(dst) and all(s == d or s == 1 for s, d in zip(src, dst))


from . import validate_tensor, validate_conv, validate_ops, validate_pool_norm, validate_rnn, validate_adv  # noqa: E402,F401  (registration)
