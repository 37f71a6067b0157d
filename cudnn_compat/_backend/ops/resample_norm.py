"""The ResampleForward/Backward (pooling) and NormForward/Backward (batch norm) op kinds: spec
rows, rules and the shape function ``param_dims``
(002 §3.2.69/§4.1.18 pooling, §3.2.3/§4.1.2-§4.1.5 batch normalization; ch. 9 Finalize:
BAD_PARAM for inconsistent attributes, NOT_SUPPORTED for unsupported combinations).

ResampleForward (x -> y), ResampleBackward (dy, x, y -> dx); attrs:
  mode ('MAXPOOL' | 'AVGPOOL_INCLUDE_PADDING' | 'AVGPOOL_EXCLUDE_PADDING'),
  window (> 0), stride (> 0), pre_padding, post_padding (any sign), one entry per
  spatial dim; nan_propagation ('PROPAGATE' | 'NOT_PROPAGATE').  x and y are 4-d or 5-d
  with equal N and C; y's spatial size is free (windows past the input are padding).

NormForward / NormBackward (batch norm); attrs:
  phase ('TRAINING' | 'INFERENCE', forward only), axes (the reduced dims: (0,) per
  activation, (0, 2, 3[, 4]) spatial), epsilon and exp_avg_factor (attrs, or the by-value
  inputs of the same names, which take precedence).
  Forward TRAINING: x, scale, bias, epsilon [, running_mean, running_var, exp_avg_factor]
    -> y [, saved_mean, saved_inv_variance] [, next_running_mean, next_running_var].
  Forward INFERENCE: x, scale, bias, mean, inv_variance -> y.
  Backward: x, dy, scale [, saved_mean, saved_inv_variance | epsilon] -> dx, dscale, dbias.
  Parameter tensors have x's dims with the reduced axes set to 1.
"""
from __future__ import annotations

from ._common import NAN_PROPAGATION, OpSpec, fail

RESAMPLE_MODES = {"MAXPOOL", "AVGPOOL_INCLUDE_PADDING", "AVGPOOL_EXCLUDE_PADDING"}


def _resample_common(i, op, x, y):
    a = op.attrs
    if x.ndim not in (4, 5):
        fail(i, op, "RESAMPLE_RANK", f"x must be 4-d or 5-d (2 or 3 spatial dims), got {x.ndim}-d", "NOT_SUPPORTED")
    if y.ndim != x.ndim:
        fail(i, op, "RESAMPLE_RANK", f"x is {x.ndim}-d but y is {y.ndim}-d")
    if x.dims[:2] != y.dims[:2]:
        fail(i, op, "RESAMPLE_NC", f"N and C of x {x.dims[:2]} and y {y.dims[:2]} differ")
    if a.get("mode") not in RESAMPLE_MODES:
        fail(i, op, "RESAMPLE_MODE", f"unknown resample mode {a.get('mode')!r}", "NOT_SUPPORTED")
    if a.get("nan_propagation", "NOT_PROPAGATE") not in NAN_PROPAGATION:
        fail(i, op, "RESAMPLE_NAN", f"nan_propagation must be one of {sorted(NAN_PROPAGATION)}")
    s = x.ndim - 2
    for name in ("window", "stride", "pre_padding", "post_padding"):
        v = a.get(name)
        if v is None or len(v) != s:
            fail(i, op, "RESAMPLE_ATTR", f"{name} must have one entry per spatial dim ({s}), got {v!r}")
    if any(w <= 0 for w in a["window"]):
        fail(i, op, "RESAMPLE_WINDOW", f"window entries must be > 0, got {a['window']}")
    if any(st <= 0 for st in a["stride"]):
        fail(i, op, "RESAMPLE_STRIDE", f"stride entries must be > 0, got {a['stride']}")
    for t in (x, y):
        if t.dtype not in ("float32", "float64", "float16", "bfloat16", "int8"):
            fail(i, op, "RESAMPLE_DTYPE", f"data type {t.dtype} is not supported", "NOT_SUPPORTED")


def _resample_forward(i, op):
    _resample_common(i, op, op.inputs["x"], op.outputs["y"])


def _resample_backward(i, op):
    x, y, dy, dx = op.inputs["x"], op.inputs["y"], op.inputs["dy"], op.outputs["dx"]
    _resample_common(i, op, x, y)
    if dy.dims != y.dims:
        fail(i, op, "RESAMPLE_DY", f"dy dims {dy.dims} must equal y dims {y.dims}")
    if dx.dims != x.dims:
        fail(i, op, "RESAMPLE_DX", f"dx dims {dx.dims} must equal x dims {x.dims}")


def param_dims(xdims, axes) -> tuple:
    return tuple(1 if k in axes else d for k, d in enumerate(xdims))


def _norm_axes(i, op, x):
    axes = tuple(op.attrs.get("axes", ()))
    if x.ndim not in (4, 5):
        fail(i, op, "NORM_RANK", f"x must be 4-d or 5-d, got {x.ndim}-d")
    if not axes or 0 not in axes or 1 in axes or any(not 0 <= k < x.ndim for k in axes) or len(set(axes)) != len(axes):
        fail(i, op, "NORM_AXES", f"axes {axes} must include the batch dim 0, exclude the channel dim 1 and be distinct dims of x")
    return axes


def _check_params(i, op, x, axes, roles):
    want = param_dims(x.dims, axes)
    for role in roles:
        t = op.inputs.get(role, op.outputs.get(role))
        if t is not None and t.dims != want:
            fail(i, op, "NORM_PARAM_DIMS", f"{role} dims {t.dims} must be {want} (x dims with the reduced axes set to 1)")


def _pair(i, op, where, a, b):
    if (a in where) != (b in where):
        fail(i, op, "NORM_PAIR", f"{a} and {b} must both be given or both be absent")


def _has_scalar(op, name) -> bool:
    return name in op.inputs or name in op.attrs


def _norm_forward(i, op):
    x, y = op.inputs["x"], op.outputs["y"]
    axes = _norm_axes(i, op, x)
    if y.dims != x.dims:
        fail(i, op, "NORM_Y_DIMS", f"y dims {y.dims} must equal x dims {x.dims}")
    _check_params(i, op, x, axes, ("scale", "bias", "mean", "inv_variance", "running_mean", "running_var",
                                    "saved_mean", "saved_inv_variance", "next_running_mean", "next_running_var"))
    phase = op.attrs.get("phase")
    if phase == "INFERENCE":
        for role in ("mean", "inv_variance"):
            if role not in op.inputs:
                fail(i, op, "NORM_INFERENCE_INPUTS", f"inference needs input {role}")
        extra = [r for r in ("saved_mean", "saved_inv_variance", "next_running_mean", "next_running_var") if r in op.outputs]
        if extra:
            fail(i, op, "NORM_INFERENCE_OUTPUTS", f"inference writes no statistics, got {extra}")
    elif phase == "TRAINING":
        if not _has_scalar(op, "epsilon"):
            fail(i, op, "NORM_EPSILON", "training needs epsilon (attr or by-value input)")
        _pair(i, op, op.inputs, "running_mean", "running_var")
        _pair(i, op, op.outputs, "saved_mean", "saved_inv_variance")
        for r in ("running_mean", "running_var"):
            if (r in op.inputs) != (f"next_{r}" in op.outputs):
                fail(i, op, "NORM_RUNNING", f"input {r} and output next_{r} go together")
        if "running_mean" in op.inputs and not _has_scalar(op, "exp_avg_factor"):
            fail(i, op, "NORM_FACTOR", "running statistics need exp_avg_factor")
    else:
        fail(i, op, "NORM_PHASE", f"phase must be 'TRAINING' or 'INFERENCE', got {phase!r}")


def _norm_backward(i, op):
    x, dy, dx = op.inputs["x"], op.inputs["dy"], op.outputs["dx"]
    axes = _norm_axes(i, op, x)
    if dy.dims != x.dims or dx.dims != x.dims:
        fail(i, op, "NORM_GRAD_DIMS", f"dy {dy.dims} and dx {dx.dims} must have x's dims {x.dims}")
    _check_params(i, op, x, axes, ("scale", "saved_mean", "saved_inv_variance", "dscale", "dbias"))
    _pair(i, op, op.inputs, "saved_mean", "saved_inv_variance")
    if "saved_mean" not in op.inputs and not _has_scalar(op, "epsilon"):
        fail(i, op, "NORM_EPSILON", "without saved statistics the backward pass needs epsilon to recompute them")


KINDS = {
    # pooling; attrs: mode, window, pre_padding, post_padding, stride, nan_propagation
    "ResampleForward": OpSpec(("x",), (), ("y",), rule=_resample_forward),
    "ResampleBackward": OpSpec(("dy", "x", "y"), (), ("dx",), rule=_resample_backward),
    # batch norm; attrs: phase ('TRAINING'|'INFERENCE'), axes (dims reduced), epsilon, exp_avg_factor
    "NormForward": OpSpec(
        ("x", "scale", "bias"),
        ("mean", "inv_variance", "running_mean", "running_var", "epsilon", "exp_avg_factor"),
        ("y",),
        ("saved_mean", "saved_inv_variance", "next_running_mean", "next_running_var"),
        rule=_norm_forward,
    ),
    "NormBackward": OpSpec(("x", "dy", "scale"), ("saved_mean", "saved_inv_variance", "epsilon"),
                           ("dx",), ("dscale", "dbias"), rule=_norm_backward),
}
