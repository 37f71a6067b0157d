"""Rules for Pointwise, Reduction and Matmul ops (002 §3.2.2 AddTensor, §3.2.76 OpTensor,
§3.2.81 ReduceTensor; ch. 9 POINTWISE/REDUCTION/MATMUL descriptors)."""
from __future__ import annotations

from .validate import broadcastable, fail, rule

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


@rule("Pointwise")
def _pointwise(i, op):
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


@rule("Reduction")
def _reduction(i, op):
    x, y = op.inputs["x"], op.outputs["y"]
    if op.attrs.get("mode") not in REDUCTION_MODES:
        fail(i, op, "REDUCTION_MODE", f"unknown reduction mode {op.attrs.get('mode')!r}", "NOT_SUPPORTED")
    if not broadcastable(y.dims, x.dims):
        fail(i, op, "REDUCTION_DIMS", f"y dims {y.dims} must equal x dims {x.dims} or be 1")
    if "indices" in op.outputs and op.outputs["indices"].dims != y.dims:
        fail(i, op, "REDUCTION_INDICES", "indices must have the dims of y")


@rule("Matmul")
def _matmul(i, op):
    a, b, c = op.inputs["a"], op.inputs["b"], op.outputs["c"]
    if not (a.ndim == b.ndim == c.ndim and a.ndim >= 2):
        fail(i, op, "MATMUL_RANK", "a, b and c must have the same rank >= 2")
    if a.dims[-1] != b.dims[-2] or c.dims[-2:] != (a.dims[-2], b.dims[-1]):
        fail(i, op, "MATMUL_SHAPE", f"shapes a{a.dims} @ b{b.dims} -> c{c.dims} disagree")
    for t in (a, b):
        if not broadcastable(t.dims[:-2], c.dims[:-2]):
            fail(i, op, "MATMUL_BATCH", "batch dims must equal c's or be 1")
