"""The convolution op kinds: spec rows, rules and shape functions (``output_dims``,
``geometry``) (002 ch. 9 CUDNN_BACKEND_OPERATION_CONVOLUTION_{FORWARD,BACKWARD_DATA,
BACKWARD_FILTER}_DESCRIPTOR and CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR; the legacy shape rules of
§5.2.10, §5.2.8, §6.2.2).

Tensors use cuDNN's logical dims, whatever the memory layout (strides carry NCHW/NHWC/KRSC):
x (N, C, *S), w (K, C/groups, *R), y (N, K, *O) with, per spatial dim i,

    O[i] = 1 + (S[i] + pre_padding[i] + post_padding[i] - ((R[i]-1)*dilation[i] + 1)) // stride[i]

ConvolutionForward reads x, w and writes y; ConvolutionBackwardData reads dy (dims of y) and w
and writes dx (dims of x); ConvolutionBackwardFilter reads x and dy and writes dw (dims of w).

Attributes (every engine reads these; the legacy layer always sets all of them):
  mode          'CROSS_CORRELATION' or 'CONVOLUTION' (the filter flipped in every spatial dim).
  pre_padding   tuple of ints >= 0, zeros before each spatial dim.
  post_padding  tuple of ints >= 0, zeros after each spatial dim (legacy: == pre_padding).
  stride        tuple of ints >= 1.
  dilation      tuple of ints >= 1 (default all 1).
  groups        int >= 1; C and K split into that many independent convolutions (default 1).
  compute_type  IR dtype of the accumulation: 'float32', 'float64', 'float16' (TRUE_HALF) or
                'int32' (INT8 configs) (default 'float32').
  math_type     'DEFAULT_MATH', 'TENSOR_OP_MATH', 'TENSOR_OP_MATH_ALLOW_CONVERSION' or
                'FMA_MATH' (cudnnMathType_t without the prefix; default 'DEFAULT_MATH').
  algo          the legacy algorithm the call asked for, as its C enum name
                ('CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM', 'CUDNN_CONVOLUTION_BWD_DATA_ALGO_1',
                'CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0', ...), or None when the engine may choose.
                The legacy layer has already checked that the algorithm supports the problem.
"""
from __future__ import annotations

from ._common import OpSpec, fail

CONV_MODES = ("CONVOLUTION", "CROSS_CORRELATION")
MATH_TYPES = ("DEFAULT_MATH", "TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION", "FMA_MATH")
COMPUTE_TYPES = ("float32", "float64", "float16", "int32")

# op kind -> (role of x-shaped tensor, role of w-shaped tensor, role of y-shaped tensor)
ROLES = {
    "ConvolutionForward": ("x", "w", "y"),
    "ConvolutionBackwardData": ("dx", "w", "dy"),
    "ConvolutionBackwardFilter": ("x", "dw", "dy"),
}


def output_dims(x_dims, w_dims, pre, post, stride, dilation) -> tuple:
    """(N, K, *O) of a convolution of x_dims with w_dims (002 §5.2.28 formula)."""
    out = [x_dims[0], w_dims[0]]
    for s, r, a, b, u, d in zip(x_dims[2:], w_dims[2:], pre, post, stride, dilation):
        out.append(1 + (s + a + b - ((r - 1) * d + 1)) // u)
    return tuple(out)


def geometry(op) -> tuple:
    """(pre, post, stride, dilation, groups) with defaults filled in."""
    a = op.attrs
    x_role = ROLES[op.kind][0]
    t = op.inputs.get(x_role) or op.outputs.get(x_role)
    nsp = t.ndim - 2
    return (tuple(a["pre_padding"]), tuple(a["post_padding"]), tuple(a["stride"]),
            tuple(a.get("dilation") or (1,) * nsp), int(a.get("groups", 1)))


def _tensor(op, role):
    return op.inputs.get(role) or op.outputs[role]


def _conv_rule(i, op):
    a = op.attrs
    xr, wr, yr = ROLES[op.kind]
    x, w, y = _tensor(op, xr), _tensor(op, wr), _tensor(op, yr)
    if not (x.ndim == w.ndim == y.ndim and x.ndim >= 3):
        fail(i, op, "CONV_RANK", f"{xr}, {wr} and {yr} must have the same rank >= 3, got {x.ndim}, {w.ndim}, {y.ndim}")
    nsp = x.ndim - 2
    if a.get("mode") not in CONV_MODES:
        fail(i, op, "CONV_MODE", f"mode must be one of {CONV_MODES}, got {a.get('mode')!r}")
    for name in ("pre_padding", "post_padding", "stride"):
        if name not in a:
            fail(i, op, "CONV_ATTRS", f"attribute {name} is required")
    dilation = a.get("dilation") or (1,) * nsp
    for name, vals, lo in (("pre_padding", a["pre_padding"], 0), ("post_padding", a["post_padding"], 0),
                           ("stride", a["stride"], 1), ("dilation", dilation, 1)):
        if len(vals) != nsp:
            fail(i, op, "CONV_SPATIAL_DIMS", f"{name} has {len(vals)} entries for {nsp} spatial dims")
        if any(int(v) < lo for v in vals):
            fail(i, op, "CONV_" + name.upper(), f"{name} entries must be >= {lo}, got {tuple(vals)}")
    groups = a.get("groups", 1)
    if not isinstance(groups, int) or groups < 1:
        fail(i, op, "CONV_GROUPS", f"groups must be an int >= 1, got {groups!r}")
    if a.get("compute_type", "float32") not in COMPUTE_TYPES:
        fail(i, op, "CONV_COMPUTE_TYPE", f"compute_type must be one of {COMPUTE_TYPES}", "NOT_SUPPORTED")
    if a.get("math_type", "DEFAULT_MATH") not in MATH_TYPES:
        fail(i, op, "CONV_MATH_TYPE", f"math_type must be one of {MATH_TYPES}")
    if x.dims[1] != w.dims[1] * groups:
        fail(i, op, "CONV_CHANNELS", f"{xr} has {x.dims[1]} channels but {wr} has {w.dims[1]} per group x {groups} groups")
    if w.dims[0] % groups:
        fail(i, op, "CONV_GROUPS", f"{wr} has {w.dims[0]} output channels, not a multiple of groups={groups}")
    pre, post, stride, dil, _ = geometry(op)
    for k in range(nsp):
        if (w.dims[2 + k] - 1) * dil[k] + 1 > x.dims[2 + k] + pre[k] + post[k]:
            fail(i, op, "CONV_FILTER_SIZE", f"dilated filter dim {k} is larger than the padded input")
    want = output_dims(x.dims, w.dims, pre, post, stride, dil)
    if y.dims != want:
        fail(i, op, "CONV_OUTPUT_DIMS", f"{yr} dims {y.dims} differ from the convolution's output dims {want}")


# attrs: mode, pre_padding, post_padding, stride, dilation, groups, compute_type, math_type
KINDS = {
    "ConvolutionForward": OpSpec(("x", "w"), (), ("y",), rule=_conv_rule),
    "ConvolutionBackwardData": OpSpec(("dy", "w"), (), ("dx",), rule=_conv_rule),
    "ConvolutionBackwardFilter": OpSpec(("x", "dy"), (), ("dw",), rule=_conv_rule),
}
