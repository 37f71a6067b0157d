"""Reference kernels for NormForward / NormBackward: batch normalization (002 §3.2.3
cudnnBatchNormalizationForwardInference, §4.1.4 ForwardTraining, §4.1.2 Backward).

Roles and attrs are listed in ``cudnn_compat/_backend/ops/resample_norm``.  With m the number of
elements reduced per channel (the product of x's dims over ``axes``):
  TRAINING   mean = E[x], var = E[(x - mean)^2] (biased), inv = 1/sqrt(var + eps)
             y = scale*(x - mean)*inv + bias
             saved_mean = mean, saved_inv_variance = inv
             next_running_mean = (1-f)*running_mean + f*mean
             next_running_var  = (1-f)*running_var + f*var*m/(m-1)   (unbiased variance)
  INFERENCE  y = scale*(x - mean)*inv_variance + bias
  Backward   (batch statistics; saved ones when given, else recomputed with epsilon)
             xhat = (x - mean)*inv, dbias = sum(dy), dscale = sum(dy*xhat),
             dx = scale*inv*(dy - dbias/m - xhat*dscale/m)
epsilon and exp_avg_factor come from the by-value inputs of those names, else from attrs.
"""
from __future__ import annotations

import numpy as np

from ._kernels import kernel


def _scalar(op, ins, name):
    return float(ins[name]) if name in ins else float(op.attrs[name])


def _stats(x, axes, eps):
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axes, keepdims=True)
    return mean, var, 1.0 / np.sqrt(var + eps)


def _count(x, axes) -> int:
    return int(np.prod([x.shape[k] for k in axes]))


@kernel("NormForward")
def norm_forward(op, ins):
    x, axes = ins["x"], tuple(op.attrs["axes"])
    if op.attrs["phase"] == "INFERENCE":
        return {"y": ins["scale"] * (x - ins["mean"]) * ins["inv_variance"] + ins["bias"]}
    mean, var, inv = _stats(x, axes, _scalar(op, ins, "epsilon"))
    out = {"y": ins["scale"] * (x - mean) * inv + ins["bias"], "saved_mean": mean, "saved_inv_variance": inv}
    if "running_mean" in ins:
        f = _scalar(op, ins, "exp_avg_factor")
        m = _count(x, axes)
        unbiased = var * (m / (m - 1.0)) if m > 1 else np.full_like(var, np.nan)
        out["next_running_mean"] = (1.0 - f) * ins["running_mean"] + f * mean
        out["next_running_var"] = (1.0 - f) * ins["running_var"] + f * unbiased
    return out


@kernel("NormBackward")
def norm_backward(op, ins):
    x, dy, axes = ins["x"], ins["dy"], tuple(op.attrs["axes"])
    if "saved_mean" in ins:
        mean, inv = ins["saved_mean"], ins["saved_inv_variance"]
    else:
        mean, _, inv = _stats(x, axes, _scalar(op, ins, "epsilon"))
    m = _count(x, axes)
    xhat = (x - mean) * inv
    dbias = np.sum(dy, axis=axes, keepdims=True)
    dscale = np.sum(dy * xhat, axis=axes, keepdims=True)
    dx = ins["scale"] * inv * (dy - dbias / m - xhat * dscale / m)
    return {"dx": dx, "dscale": dscale, "dbias": dbias}
