"""Pointwise kernel of the numpy engine (002 ch. 9 CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
§3.2.1 activation modes, §3.2.68 OpTensor ops): y = op(alpha1*x [, alpha2*b]) in the compute
dtype, with the reference engine's formulas (``reference/pointwise.py``, docs/graph_ops.md).

The frequent modes (``FAST``: IDENTITY, the arithmetic binaries, MIN/MAX, RELU, TANH, SIGMOID,
SQRT..., RELU_BWD) run as NumPy ufuncs writing ``out['y']`` directly; alpha1/alpha2 multiply only
when != 1, and ``y = x + alpha2*b`` (the beta blend, b being y's prior value) runs as two in-place
passes.  A single ufunc may write y while reading an aliased input (NumPy's overlap rule); a
formula of several passes writes y only when no input may share y's memory, else into a fresh
array.  The other modes evaluate the reference formula in the compute dtype.
Temporary memory: at most two arrays of y's size (the scaled operands) plus a boolean mask.
"""
from __future__ import annotations

import numpy as np

from ._kernels import kernel
from ..reference.pointwise import BINARY, UNARY


def _f(a, name, default):
    v = a.get(name, default)
    return None if v is None else float(v)


def _scale(v, s):
    """v * s, skipped when the by-value scale is 1 (no temporary)."""
    if s is None or float(s) == 1.0:
        return v
    return np.multiply(v, s.astype(v.dtype))


def _relu(x, a, prop, dst):
    lo, up = _f(a, "relu_lower_clip", 0.0), _f(a, "relu_upper_clip", None)
    (np.maximum if prop else np.fmax)(x, lo, out=dst)
    if up is not None:
        (np.minimum if prop else np.fmin)(dst, up, out=dst)
    return dst


def _sigmoid(x, dst):
    """0.5*(1+tanh(x/2)) in four in-place passes."""
    np.multiply(x, 0.5, out=dst)
    np.tanh(dst, out=dst)
    np.add(dst, 1.0, out=dst)
    return np.multiply(dst, 0.5, out=dst)


def _rsqrt(x, dst):
    np.sqrt(x, out=dst)
    return np.divide(1.0, dst, out=dst)


# mode -> fn(x, attrs, prop, dst) -> dst: the first pass reads x (a single ufunc, so x may alias
# dst), the later ones read dst only
UNARY_FAST = {
    "IDENTITY": lambda x, a, p, d: (np.copyto(d, x), d)[1],
    "SQRT": lambda x, a, p, d: np.sqrt(x, out=d),
    "NEG": lambda x, a, p, d: np.negative(x, out=d),
    "NOT": lambda x, a, p, d: np.subtract(1.0, x, out=d),
    "ABS": lambda x, a, p, d: np.abs(x, out=d),
    "EXP": lambda x, a, p, d: np.exp(x, out=d),
    "LOG": lambda x, a, p, d: np.log(x, out=d),
    "RSQRT": lambda x, a, p, d: _rsqrt(x, d),  # the second pass reads d only
    "RECIPROCAL": lambda x, a, p, d: np.divide(1.0, x, out=d),
    "RELU_FWD": _relu,
    "CLIPPED_RELU_FWD": _relu,
    "TANH_FWD": lambda x, a, p, d: np.tanh(x, out=d),
    "SIGMOID_FWD": lambda x, a, p, d: _sigmoid(x, d),
}
BINARY_FAST = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide, "POW": np.power,
}
MINMAX = {"MIN": (np.minimum, np.fmin), "MAX": (np.maximum, np.fmax)}


def _relu_bwd(dy, x, a, prop, dst):
    """dy where lower < x < upper, 0 elsewhere; NaN where x is NaN under PROPAGATE.  Fast path
    dy*mask when neither dy holds inf/NaN (its sum is finite) nor x NaN; else the reference
    formula."""
    lo, up = _f(a, "relu_lower_clip", 0.0), _f(a, "relu_upper_clip", None)
    if x.size and np.isfinite(np.add.reduce(dy, axis=None)) and not (prop and np.isnan(np.min(x))):
        keep = np.greater(x, lo)
        if up is not None:
            keep &= np.less(x, up)
        return np.multiply(dy, keep, out=dst)
    return None


def _dst(y_out, shape, dt, *ins):
    """Where a formula of several passes may write: the caller's y unless an input may alias it."""
    if y_out is not None and not any(np.may_share_memory(v, y_out) for v in ins if v.ndim):
        return y_out
    return np.empty(shape, dt)


@kernel("Pointwise")
def pointwise(op, ins, dt, out):
    a = op.attrs
    mode = a["mode"]
    prop = a.get("nan_propagation", "PROPAGATE") == "PROPAGATE"
    shape = op.outputs["y"].dims
    y_out = out.get("y")
    x = ins["x"]
    alpha1 = ins.get("alpha1")
    if mode in UNARY:
        x = _scale(x, alpha1)
        fast = UNARY_FAST.get(mode)
        if fast is not None:
            if mode == "IDENTITY" and y_out is None:
                return {"y": x}
            dst = y_out if y_out is not None else np.empty(shape, dt)
            return {"y": fast(x, a, prop, dst)}
        return {"y": UNARY[mode](x, a, prop)}
    b, alpha2 = ins["b"], ins.get("alpha2")
    if mode in BINARY_FAST or mode in MINMAX:
        ufunc = BINARY_FAST.get(mode) or MINMAX[mode][0 if prop else 1]
        if (mode == "ADD" and y_out is not None and alpha2 is not None and float(alpha2) != 1.0
                and b.shape == shape and (alpha1 is None or float(alpha1) == 1.0)
                and not np.may_share_memory(x, y_out)):
            np.multiply(b, alpha2.astype(dt), out=y_out)  # the beta blend: y = beta*y_prior, then += x
            return {"y": np.add(y_out, x, out=y_out)}
        xs, bs = _scale(x, alpha1), _scale(b, alpha2)
        dst = y_out if y_out is not None else np.empty(shape, dt)
        return {"y": ufunc(xs, bs, out=dst)}
    xs, bs = _scale(x, alpha1), _scale(b, alpha2)
    if mode in ("RELU_BWD", "CLIPPED_RELU_BWD"):
        res = _relu_bwd(xs, bs, a, prop, y_out if y_out is not None else np.empty(shape, dt))
        if res is not None:
            return {"y": res}
    if mode == "TANH_BWD_Y" or mode == "SIGMOID_BWD_Y":
        dst = _dst(y_out, shape, dt, xs, bs)
        if mode == "TANH_BWD_Y":  # dy*(1 - y*y)
            np.multiply(bs, bs, out=dst)
            np.subtract(1.0, dst, out=dst)
        else:  # dy*y*(1 - y)
            np.subtract(1.0, bs, out=dst)
            np.multiply(dst, bs, out=dst)
        return {"y": np.multiply(dst, xs, out=dst)}
    return {"y": BINARY[mode](xs, bs, a, prop)}
