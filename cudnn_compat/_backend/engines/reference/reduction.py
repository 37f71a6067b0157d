"""Reference kernel for Reduction ops (002 §3.2.71 cudnnReduceTensor, §3.1.2.21 cudnnReduceTensorOp_t;
ch. 9 CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR).

attrs: ``mode`` (ADD, MUL, MIN, MAX, AMAX, AVG, NORM1, NORM2, MUL_NO_ZEROS) and
``nan_propagation`` ('PROPAGATE' or 'NOT_PROPAGATE', default NOT_PROPAGATE; it matters for
MIN, MAX and AMAX only: NOT_PROPAGATE skips NaN, PROPAGATE returns NaN and its index).
Dims where y is 1 and x is not are reduced.  The optional ``indices`` output (MIN, MAX,
AMAX) holds, per output element, the position of the chosen element flattened row-major
over the reduced dims only, first one on ties.  MUL_NO_ZEROS multiplies the non-zero
elements; a slice of zeros gives 1 (libcudnn 9.19 does the same).
"""
from __future__ import annotations

import numpy as np

from ._kernels import kernel


def _prod_no_zeros(x, axis):
    return np.prod(np.where(x == 0, 1.0, x), axis=axis, keepdims=True)


def _extreme(prop_fn, skip_fn, absolute=False):
    def fn(x, axis, prop):
        v = np.abs(x) if absolute else x
        return (prop_fn if prop else skip_fn).reduce(v, axis=axis, keepdims=True)
    return fn


OPS = {
    "ADD": lambda x, ax, p: np.sum(x, axis=ax, keepdims=True),
    "MUL": lambda x, ax, p: np.prod(x, axis=ax, keepdims=True),
    "MIN": _extreme(np.minimum, np.fmin),
    "MAX": _extreme(np.maximum, np.fmax),
    "AMAX": _extreme(np.maximum, np.fmax, absolute=True),
    "AVG": lambda x, ax, p: np.mean(x, axis=ax, keepdims=True),
    "NORM1": lambda x, ax, p: np.sum(np.abs(x), axis=ax, keepdims=True),
    "NORM2": lambda x, ax, p: np.sqrt(np.sum(x * x, axis=ax, keepdims=True)),
    "MUL_NO_ZEROS": lambda x, ax, p: _prod_no_zeros(x, ax),
}
INDEX_MODES = ("MIN", "MAX", "AMAX")


def reduced_axes(xdims, ydims) -> tuple:
    return tuple(i for i, (xd, yd) in enumerate(zip(xdims, ydims)) if yd == 1 and xd != 1)


def _indices(x, axes, mode, prop, ydims):
    keep = [i for i in range(x.ndim) if i not in axes]
    moved = np.transpose(x, keep + list(axes)).reshape([x.shape[i] for i in keep] + [-1])
    if mode == "AMAX":
        moved = np.abs(moved)
    nan = np.isnan(moved)
    if prop:  # the first NaN wins
        idx = np.where(nan.any(axis=-1), np.argmax(nan, axis=-1), -1)
    else:
        idx = np.full(moved.shape[:-1], -1)
    fill = np.inf if mode == "MIN" else -np.inf
    best = (np.argmin if mode == "MIN" else np.argmax)(np.where(nan, fill, moved), axis=-1)
    return np.where(idx >= 0, idx, best).reshape(ydims).astype(np.float64)


@kernel("Reduction")
def reduction(op, ins):
    x = ins["x"]
    y_t = op.outputs["y"]
    axes = reduced_axes(x.shape, y_t.dims)
    prop = op.attrs.get("nan_propagation", "NOT_PROPAGATE") == "PROPAGATE"
    mode = op.attrs["mode"]
    with np.errstate(all="ignore"):
        y = OPS[mode](x, axes, prop)  # no reduced dim: the op applied elementwise (|x| for AMAX...)
    out = {"y": y}
    if "indices" in op.outputs:
        out["indices"] = _indices(x, axes, mode, prop, y_t.dims)  # MIN/MAX/AMAX only (ops/pointwise)
    return out
