"""Reference kernel for Reduction ops (002 §3.2.81 cudnnReduceTensor, §3.1.2 cudnnReduceTensorOp_t;
ch. 9 CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR).  Dims where y is 1 and x is not are reduced;
``indices`` are flattened over the reduced dims (MIN/MAX only)."""
from __future__ import annotations

import numpy as np

from . import kernel


def _prod_no_zeros(x, axis):
    return np.prod(np.where(x == 0, 1.0, x), axis=axis, keepdims=True)


def _minmax(fn_prop, fn_ignore):
    return lambda x, axis, p: (fn_prop if p else fn_ignore)(x, axis=axis, keepdims=True)


OPS = {
    "ADD": lambda x, ax, p: np.sum(x, axis=ax, keepdims=True),
    "MUL": lambda x, ax, p: np.prod(x, axis=ax, keepdims=True),
    "MIN": _minmax(np.min, np.nanmin),
    "MAX": _minmax(np.max, np.nanmax),
    "AMAX": lambda x, ax, p: (np.max if p else np.nanmax)(np.abs(x), axis=ax, keepdims=True),
    "AVG": lambda x, ax, p: np.mean(x, axis=ax, keepdims=True),
    "NORM1": lambda x, ax, p: np.sum(np.abs(x), axis=ax, keepdims=True),
    "NORM2": lambda x, ax, p: np.sqrt(np.sum(x * x, axis=ax, keepdims=True)),
    "MUL_NO_ZEROS": lambda x, ax, p: _prod_no_zeros(x, ax),
}


def reduced_axes(xdims, ydims) -> tuple:
    return tuple(i for i, (xd, yd) in enumerate(zip(xdims, ydims)) if yd == 1 and xd != 1)


@kernel("Reduction")
def reduction(op, ins):
    x = ins["x"]
    y_t = op.outputs["y"]
    axes = reduced_axes(x.shape, y_t.dims)
    prop = op.attrs.get("nan_propagation", "NOT_PROPAGATE") == "PROPAGATE"
    mode = op.attrs["mode"]
    with np.errstate(all="ignore"):
        y = OPS[mode](x, axes, prop) if axes else x.copy()
    out = {"y": y}
    if "indices" in op.outputs:
        keep = [i for i in range(x.ndim) if i not in axes]
        moved = np.transpose(x, keep + list(axes)).reshape([x.shape[i] for i in keep] + [-1])
        if not prop:
            fill = np.inf if mode == "MIN" else -np.inf
            moved = np.where(np.isnan(moved), fill, moved)
        idx = (np.argmin if mode == "MIN" else np.argmax)(moved, axis=-1)
        out["indices"] = idx.reshape(y_t.dims).astype(np.float64)
    return out
