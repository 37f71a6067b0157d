"""Reduction kernel of the numpy engine (002 §3.2.71 cudnnReduceTensor; ch. 9
CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR): the reference engine's formulas
(``reference/reduction.py``: modes, NaN propagation, the indices output) evaluated in the compute
dtype (NumPy's pairwise summation keeps float32 sums within float32 rounding of the float64 ones).
Temporary memory: at most one array of x's size (|x|, x*x or the zero-masked x of NORM1, NORM2,
AMAX, MUL_NO_ZEROS; the moved copy of the indices output)."""
from __future__ import annotations

import numpy as np

from ._kernels import kernel
from ..reference.reduction import OPS, _indices, reduced_axes


@kernel("Reduction")
def reduction(op, ins, dt, out):
    x = ins["x"]
    y_t = op.outputs["y"]
    axes = reduced_axes(x.shape, y_t.dims)
    prop = op.attrs.get("nan_propagation", "NOT_PROPAGATE") == "PROPAGATE"
    mode = op.attrs["mode"]
    res = {"y": OPS[mode](x, axes, prop)}
    if "indices" in op.outputs:
        res["indices"] = _indices(x, axes, mode, prop, y_t.dims)
    return res
