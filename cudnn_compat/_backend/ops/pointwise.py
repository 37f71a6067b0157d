"""The Pointwise, Reduction and Matmul op kinds: spec rows and rules (002 §3.2.2 AddTensor,
§3.2.68 OpTensor, §3.2.71 ReduceTensor, §3.2.100 TransformTensor; ch. 9 POINTWISE/REDUCTION/MATMUL
descriptors).
Semantics of each kind: docs/graph_ops.md."""
from __future__ import annotations

from ._common import NAN_PROPAGATION, OpSpec, broadcastable, fail

POINTWISE_UNARY = {
    "IDENTITY", "SQRT", "NEG", "ABS", "EXP", "LOG", "RSQRT", "RECIPROCAL", "NOT",
    "RELU_FWD", "TANH_FWD", "SIGMOID_FWD", "ELU_FWD", "GELU_FWD", "SOFTPLUS_FWD", "SWISH_FWD",
    "CLIPPED_RELU_FWD",
}
POINTWISE_BINARY = {
    "ADD", "SUB", "MUL", "DIV", "MIN", "MAX", "POW",
    "CMP_GT", "CMP_GE", "CMP_LT", "CMP_LE", "CMP_EQ", "CMP_NEQ",
    # backward activations: x = dy, b = the forward input (or output for *_BWD_Y)
    "RELU_BWD", "TANH_BWD", "SIGMOID_BWD", "ELU_BWD", "CLIPPED_RELU_BWD",
    "TANH_BWD_Y", "SIGMOID_BWD_Y", "ELU_BWD_Y", "SWISH_BWD",
}
REDUCTION_MODES = {"ADD", "MUL", "MIN", "MAX", "AMAX", "AVG", "NORM1", "NORM2", "MUL_NO_ZEROS"}
INDEX_MODES = {"MIN", "MAX", "AMAX"}


def _pointwise(i, op):
    """y = mode(alpha1*x [, alpha2*b]); x and b broadcast to y.  attrs: ``mode`` (POINTWISE_UNARY
    or POINTWISE_BINARY), ``nan_propagation`` (MIN/MAX/RELU; default PROPAGATE), and per mode
    ``relu_lower_clip``, ``relu_upper_clip``, ``elu_alpha``, ``softplus_beta``, ``swish_beta``."""
    mode = op.attrs.get("mode")
    y = op.outputs["y"]
    if mode in POINTWISE_BINARY:
        if "b" not in op.inputs:
            fail(i, op, "POINTWISE_B", f"mode {mode} needs input b")
    elif mode not in POINTWISE_UNARY:
        fail(i, op, "POINTWISE_MODE", f"unknown pointwise mode {mode!r}", "NOT_SUPPORTED")
    for role in ("x", "b"):
        t = op.inputs.get(role)
        if t is not None and not t.is_by_value and not broadcastable(t.dims, y.dims):
            fail(i, op, "POINTWISE_BROADCAST", f"{role} dims {t.dims} do not broadcast to y dims {y.dims}")
    for role in ("alpha1", "alpha2"):
        t = op.inputs.get(role)
        if t is not None and not t.is_by_value:
            fail(i, op, "POINTWISE_ALPHA", f"{role} must be a by-value scalar")
    if op.attrs.get("nan_propagation", "PROPAGATE") not in NAN_PROPAGATION:
        fail(i, op, "POINTWISE_NAN_PROPAGATION", f"nan_propagation must be one of {sorted(NAN_PROPAGATION)}")


def _reduction(i, op):
    """y = mode over the dims where y is 1 and x is not.  attrs: ``mode`` (REDUCTION_MODES),
    ``nan_propagation`` (default NOT_PROPAGATE).  The optional ``indices`` output (int32, y's
    dims) exists for MIN, MAX and AMAX only."""
    x, y = op.inputs["x"], op.outputs["y"]
    if op.attrs.get("mode") not in REDUCTION_MODES:
        fail(i, op, "REDUCTION_MODE", f"unknown reduction mode {op.attrs.get('mode')!r}", "NOT_SUPPORTED")
    if not broadcastable(y.dims, x.dims):
        fail(i, op, "REDUCTION_DIMS", f"y dims {y.dims} must equal x dims {x.dims} or be 1")
    if op.attrs.get("nan_propagation", "NOT_PROPAGATE") not in NAN_PROPAGATION:
        fail(i, op, "REDUCTION_NAN_PROPAGATION", f"nan_propagation must be one of {sorted(NAN_PROPAGATION)}")
    idx = op.outputs.get("indices")
    if idx is not None:
        if idx.dims != y.dims:
            fail(i, op, "REDUCTION_INDICES", "indices must have the dims of y")
        if op.attrs.get("mode") not in INDEX_MODES:
            fail(i, op, "REDUCTION_INDICES", f"indices exist for {sorted(INDEX_MODES)} only", "NOT_SUPPORTED")
        if idx.dtype != "int32":
            fail(i, op, "REDUCTION_INDICES", f"indices are int32, not {idx.dtype}", "NOT_SUPPORTED")


def _matmul(i, op):
    """c = a @ b over the last two dims; batch dims of a and b broadcast to c's.  No attrs."""
    a, b, c = op.inputs["a"], op.inputs["b"], op.outputs["c"]
    if not (a.ndim == b.ndim == c.ndim and a.ndim >= 2):
        fail(i, op, "MATMUL_RANK", "a, b and c must have the same rank >= 2")
    if a.dims[-1] != b.dims[-2] or c.dims[-2:] != (a.dims[-2], b.dims[-1]):
        fail(i, op, "MATMUL_SHAPE", f"shapes a{a.dims} @ b{b.dims} -> c{c.dims} disagree")
    for t in (a, b):
        if not broadcastable(t.dims[:-2], c.dims[:-2]):
            fail(i, op, "MATMUL_BATCH", "batch dims must equal c's or be 1")


KINDS = {
    # y = op(alpha1 * x [, alpha2 * b]) ; x, b broadcast to y (dims of 1).  attrs: mode, ...
    "Pointwise": OpSpec(("x",), ("b", "alpha1", "alpha2"), ("y",), rule=_pointwise),
    # y = reduce_mode over the dims where y has 1 and x does not. attrs: mode, nan_propagation
    "Reduction": OpSpec(("x",), (), ("y",), ("indices",), rule=_reduction),
    "Matmul": OpSpec(("a", "b"), (), ("c",), rule=_matmul),
}
