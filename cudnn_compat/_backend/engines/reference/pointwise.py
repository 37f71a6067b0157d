"""Reference kernel for Pointwise ops (002 ch. 9 CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
§3.2.1 activation modes, §3.2.68 OpTensor ops).  y = op(alpha1*x [, alpha2*b]).

attrs: ``mode`` (a key of UNARY or BINARY), ``nan_propagation`` ('PROPAGATE' default: MIN/MAX
return NaN when either side is; 'NOT_PROPAGATE': the other side, as fmin/fmax; ReLU clips a
NaN), ``relu_lower_clip``/``relu_upper_clip``, ``elu_alpha``, ``softplus_beta``, ``swish_beta``.
NOT is 1 - x (what libcudnn's CUDNN_OP_TENSOR_NOT computes; docs/graph_ops.md has the evidence),
not a logical not.  docs/graph_ops.md lists every mode's formula."""
from __future__ import annotations

import math

import numpy as np

from ._kernels import kernel

_erf = np.frompyfunc(math.erf, 1, 1)


def _max(a, b, propagate):
    return np.maximum(a, b) if propagate else np.fmax(a, b)


def _min(a, b, propagate):
    return np.minimum(a, b) if propagate else np.fmin(a, b)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _relu(x, a, prop):
    lo = a.get("relu_lower_clip", 0.0)
    up = a.get("relu_upper_clip")
    y = _max(x, lo, prop)
    if up is not None:
        y = _min(y, up, prop)
    return y


def _relu_bwd(dy, x, a, prop=True):
    """dy where lower < x < upper; ``x`` may be the forward input or output (same mask).
    A NaN x gives NaN only under PROPAGATE (under NOT_PROPAGATE it was clipped away)."""
    lo = a.get("relu_lower_clip", 0.0)
    up = a.get("relu_upper_clip")
    mask = x > lo
    if up is not None:
        mask &= x < up
    return np.where(mask, dy, 0.0) + (np.where(np.isnan(x), np.nan, 0.0) if prop else 0.0)


def _swish_bwd(dy, x, a):
    """d/dx x*sigmoid(beta*x) = s + beta*x*s*(1-s), s = sigmoid(beta*x)."""
    bx = a.get("swish_beta", 1.0) * x
    s = _sigmoid(bx)
    return dy * (s + bx * s * (1.0 - s))


UNARY = {
    "IDENTITY": lambda x, a, p: x,
    "SQRT": lambda x, a, p: np.sqrt(x),
    "NEG": lambda x, a, p: -x,
    "NOT": lambda x, a, p: 1.0 - x,
    "ABS": lambda x, a, p: np.abs(x),
    "EXP": lambda x, a, p: np.exp(x),
    "LOG": lambda x, a, p: np.log(x),
    "RSQRT": lambda x, a, p: 1.0 / np.sqrt(x),
    "RECIPROCAL": lambda x, a, p: 1.0 / x,
    "RELU_FWD": _relu,
    "CLIPPED_RELU_FWD": _relu,
    "TANH_FWD": lambda x, a, p: np.tanh(x),
    "SIGMOID_FWD": lambda x, a, p: _sigmoid(x),
    "ELU_FWD": lambda x, a, p: np.where(x > 0, x, a.get("elu_alpha", 1.0) * np.expm1(np.minimum(x, 0))),
    "GELU_FWD": lambda x, a, p: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64)),
    "SOFTPLUS_FWD": lambda x, a, p: np.logaddexp(0.0, a.get("softplus_beta", 1.0) * x) / a.get("softplus_beta", 1.0),
    "SWISH_FWD": lambda x, a, p: x * _sigmoid(a.get("swish_beta", 1.0) * x),
}

BINARY = {
    "ADD": lambda x, b, a, p: x + b,
    "SUB": lambda x, b, a, p: x - b,
    "MUL": lambda x, b, a, p: x * b,
    "DIV": lambda x, b, a, p: x / b,
    "POW": lambda x, b, a, p: np.power(x, b),
    "MIN": lambda x, b, a, p: _min(x, b, p),
    "MAX": lambda x, b, a, p: _max(x, b, p),
    "CMP_GT": lambda x, b, a, p: (x > b).astype(np.float64),
    "CMP_GE": lambda x, b, a, p: (x >= b).astype(np.float64),
    "CMP_LT": lambda x, b, a, p: (x < b).astype(np.float64),
    "CMP_LE": lambda x, b, a, p: (x <= b).astype(np.float64),
    "CMP_EQ": lambda x, b, a, p: (x == b).astype(np.float64),
    "CMP_NEQ": lambda x, b, a, p: (x != b).astype(np.float64),
    # backward activations: x is dy, b is the forward input (or the forward output for *_Y)
    "RELU_BWD": lambda dy, x, a, p: _relu_bwd(dy, x, a, p),
    "CLIPPED_RELU_BWD": lambda dy, x, a, p: _relu_bwd(dy, x, a, p),
    "TANH_BWD": lambda dy, x, a, p: dy * (1.0 - np.tanh(x) ** 2),
    "TANH_BWD_Y": lambda dy, y, a, p: dy * (1.0 - y * y),
    "SIGMOID_BWD": lambda dy, x, a, p: dy * _sigmoid(x) * (1.0 - _sigmoid(x)),
    "SIGMOID_BWD_Y": lambda dy, y, a, p: dy * y * (1.0 - y),
    "ELU_BWD": lambda dy, x, a, p: dy * np.where(x > 0, 1.0, a.get("elu_alpha", 1.0) * np.exp(np.minimum(x, 0))),
    "ELU_BWD_Y": lambda dy, y, a, p: dy * np.where(y > 0, 1.0, y + a.get("elu_alpha", 1.0)),
    "SWISH_BWD": lambda dy, x, a, p: _swish_bwd(dy, x, a),
}


@kernel("Pointwise")
def pointwise(op, ins):
    a = op.attrs
    prop = a.get("nan_propagation", "PROPAGATE") == "PROPAGATE"
    x = ins["x"] * ins["alpha1"] if "alpha1" in ins else ins["x"]
    mode = a["mode"]
    if mode in UNARY:
        return {"y": UNARY[mode](x, a, prop)}
    b = ins["b"] * ins["alpha2"] if "alpha2" in ins else ins["b"]
    return {"y": BINARY[mode](x, b, a, prop)}
