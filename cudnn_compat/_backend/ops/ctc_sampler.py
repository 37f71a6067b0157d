"""The op kinds of the cudnn_adv families, their spec rows and rules: CTC loss and the spatial
transformer sampler (002 §8.2.3/§8.2.4 cudnnCTCLoss(_v8), §3.2.98 cudnnSpatialTfSamplerForward, §4.1.21
cudnnSpatialTfSamplerBackward).

Multi-head attention and the spatial-transformer grid generator need no kind of their own:
they are Matmul + Softmax/SoftmaxBackward + Pointwise + Reduction graphs
(cudnn_compat/attention/compute.py, cudnn_compat/spatial.py).  The two below are composites because
neither is expressible with those ops: CTC is a dynamic program over time whose transitions
depend on the label values, and the bilinear sampler gathers input pixels at data-dependent
positions (the IR has no gather).

``CTCLoss`` -- connectionist temporal classification loss and its gradient (Graves et al.,
ICML 2006), blank = label 0, in log space.
  inputs  ``probs``         [T, N, A] float: probabilities (normalization 'NONE') or
                            activations (normalization 'SOFTMAX', softmax over A inside)
          ``labels``        int32 [N, Lmax]: row n holds sample n's labels in its first
                            label_lengths[n] entries (values in [1, A)); the rest is ignored
          ``label_lengths`` int32 [N], each in [0, Lmax]
          ``input_lengths`` int32 [N], each in [1, T]
          ``gradients_prior`` (optional) [T, N, A]: the gradient buffer before the call;
                            required when grad_mode is 'PROPAGATE_NAN'
  outputs ``costs``         [N]: -log p(label_n | x_n); +inf when the label cannot be aligned
          ``gradients``     (optional) [T, N, A]: d cost_n / d u[t, n, k] with respect to the
                            unnormalized activations u (probs = softmax(u) for 'NONE'):
                            y_k - exp(logsumexp_{s: l'_s = k}(alpha_t(s) + beta_t(s)) - log p - log y_k),
                            0 for t >= input_lengths[n].
  attrs   ``normalization`` 'NONE' | 'SOFTMAX'
          ``grad_mode``     'NOT_PROPAGATE_NAN' (gradient of an unalignable sample, L + R > T,
                            is 0) | 'PROPAGATE_NAN' (that sample keeps gradients_prior)

``SpatialTfSamplerForward`` -- bilinear sampling with zero padding.
  inputs  ``x`` [N, C, Hi, Wi], ``grid`` [N, H, W, 2] (x then y, normalized to [-1, 1])
  outputs ``y`` [N, C, H, W]
  For output point (n, h, w): u = (grid[n,h,w,0] + 1) * (Wi - 1) / 2, v = (grid[n,h,w,1] + 1) * (Hi - 1) / 2,
  y = sum over the 4 integer neighbours (iv, iu) of x[n, c, iv, iu] * (1 - |v - iv|) * (1 - |u - iu|),
  a neighbour outside the image contributing 0.  (grid -1 is the first pixel's centre, +1 the last.)

``SpatialTfSamplerBackward`` -- the exact derivatives of that function.
  inputs  ``x``, ``grid``, ``dy`` [N, C, H, W]
  outputs ``dx`` [N, C, Hi, Wi] (the adjoint scatter of dy), ``dgrid`` [N, H, W, 2]
          (d/dgrid of sum(dy * y), one-sided at integer coordinates like every bilinear kernel)
"""
from __future__ import annotations

from ._common import OpSpec, fail

CTC_NORMALIZATIONS = ("NONE", "SOFTMAX")
CTC_GRAD_MODES = ("NOT_PROPAGATE_NAN", "PROPAGATE_NAN")


def _ctc(i, op):
    a = op.attrs
    if a.get("normalization") not in CTC_NORMALIZATIONS:
        fail(i, op, "CTC_NORMALIZATION", f"normalization must be one of {CTC_NORMALIZATIONS}, got {a.get('normalization')!r}")
    if a.get("grad_mode") not in CTC_GRAD_MODES:
        fail(i, op, "CTC_GRAD_MODE", f"grad_mode must be one of {CTC_GRAD_MODES}, got {a.get('grad_mode')!r}")
    probs = op.inputs["probs"]
    if probs.ndim != 3:
        fail(i, op, "CTC_PROBS_RANK", f"probs must be [T, N, A], got dims {probs.dims}")
    t, n, _ = probs.dims
    labels = op.inputs["labels"]
    if labels.ndim != 2 or labels.dims[0] != n:
        fail(i, op, "CTC_LABELS", f"labels must be [N={n}, Lmax], got dims {labels.dims}")
    for role in ("labels", "label_lengths", "input_lengths"):
        if op.inputs[role].dtype != "int32":
            fail(i, op, "CTC_INT_INPUTS", f"{role} must be int32, got {op.inputs[role].dtype}")
    for role in ("label_lengths", "input_lengths"):
        if op.inputs[role].dims != (n,):
            fail(i, op, "CTC_LENGTHS", f"{role} must have dims ({n},), got {op.inputs[role].dims}")
    if op.outputs["costs"].dims != (n,):
        fail(i, op, "CTC_COSTS", f"costs must have dims ({n},), got {op.outputs['costs'].dims}")
    for role in ("gradients", "gradients_prior"):
        tt = op.outputs.get(role) or op.inputs.get(role)
        if tt is not None and tt.dims != probs.dims:
            fail(i, op, "CTC_GRADIENTS", f"{role} dims {tt.dims} must equal probs dims {probs.dims}")
    if a.get("grad_mode") == "PROPAGATE_NAN" and "gradients" in op.outputs and "gradients_prior" not in op.inputs:
        fail(i, op, "CTC_GRAD_MODE", "PROPAGATE_NAN keeps the prior gradients of unalignable samples: input gradients_prior is required")


def _sampler_dims(i, op):
    x, grid = op.inputs["x"], op.inputs["grid"]
    if x.ndim != 4 or grid.ndim != 4 or grid.dims[3] != 2:
        fail(i, op, "SAMPLER_RANK", f"x must be [N, C, H, W] and grid [N, H, W, 2], got {x.dims} and {grid.dims}")
    if grid.dims[0] != x.dims[0]:
        fail(i, op, "SAMPLER_BATCH", f"grid batch {grid.dims[0]} must equal x batch {x.dims[0]}")
    return (x.dims[0], x.dims[1], grid.dims[1], grid.dims[2])


def _sampler_fwd(i, op):
    want = _sampler_dims(i, op)
    if op.outputs["y"].dims != want:
        fail(i, op, "SAMPLER_OUTPUT", f"y dims {op.outputs['y'].dims} must be {want}")


def _sampler_bwd(i, op):
    want = _sampler_dims(i, op)
    if op.inputs["dy"].dims != want:
        fail(i, op, "SAMPLER_OUTPUT", f"dy dims {op.inputs['dy'].dims} must be {want}")
    for role, dims in (("dx", op.inputs["x"].dims), ("dgrid", op.inputs["grid"].dims)):
        if role in op.outputs and op.outputs[role].dims != dims:
            fail(i, op, "SAMPLER_GRADIENT", f"{role} dims {op.outputs[role].dims} must be {dims}")


KINDS = {
    "CTCLoss": OpSpec(("probs", "labels", "label_lengths", "input_lengths"), ("gradients_prior",),
                      ("costs",), ("gradients",), rule=_ctc),
    "SpatialTfSamplerForward": OpSpec(("x", "grid"), (), ("y",), rule=_sampler_fwd),
    "SpatialTfSamplerBackward": OpSpec(("x", "grid", "dy"), (), ("dx", "dgrid"), rule=_sampler_bwd),
}
