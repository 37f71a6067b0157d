"""Matmul kernel of the numpy engine (002 ch. 9 / 000 CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR):
c = a @ b in the compute dtype on NumPy's BLAS, batch dims broadcast, written into the caller's c
when it has c's dims and dtype.  Temporary memory: none beyond BLAS's own packing buffers (a
non-contiguous output is computed into a fresh array of c's size)."""
from __future__ import annotations

import numpy as np

from ._kernels import kernel


@kernel("Matmul")
def matmul(op, ins, dt, out):
    a, b = ins["a"], ins["b"]
    c = out.get("c")
    if c is not None and not (np.may_share_memory(a, c) or np.may_share_memory(b, c)):
        return {"c": np.matmul(a, b, out=c)}
    return {"c": np.matmul(a, b)}
