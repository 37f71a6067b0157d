"""Reference kernels for Softmax and SoftmaxBackward (002 §3.2.96 cudnnSoftmaxForward,
§4.1.19 cudnnSoftmaxBackward, §3.1.2.25 cudnnSoftmaxAlgorithm_t), in float64.

attrs: ``algorithm`` ('FAST' | 'ACCURATE' | 'LOG'), ``axes`` (the dims reduced over).
- FAST: y = exp(x) / sum exp(x), straight.
- ACCURATE: the same with the per-point max subtracted first (no overflow).
- LOG: y = (x - m) - log(sum exp(x - m)), m the max.
Backward (y is the forward output): dx = y * (dy - sum(dy * y)) for FAST/ACCURATE,
dx = dy - exp(y) * sum(dy) for LOG.
"""
from __future__ import annotations

import numpy as np

from ._kernels import kernel


@kernel("Softmax")
def softmax(op, ins):
    x, axes, algo = ins["x"], tuple(op.attrs["axes"]), op.attrs["algorithm"]
    if algo == "FAST":
        e = np.exp(x)
        return {"y": e / e.sum(axis=axes, keepdims=True)}
    z = x - x.max(axis=axes, keepdims=True)
    if algo == "LOG":
        return {"y": z - np.log(np.exp(z).sum(axis=axes, keepdims=True))}
    e = np.exp(z)
    return {"y": e / e.sum(axis=axes, keepdims=True)}


@kernel("SoftmaxBackward")
def softmax_backward(op, ins):
    y, dy, axes = ins["y"], ins["dy"], tuple(op.attrs["axes"])
    if op.attrs["algorithm"] == "LOG":
        return {"dx": dy - np.exp(y) * dy.sum(axis=axes, keepdims=True)}
    return {"dx": y * (dy - (dy * y).sum(axis=axes, keepdims=True))}
