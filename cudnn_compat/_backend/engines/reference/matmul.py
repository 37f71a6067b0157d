"""Reference kernel for Matmul (002 ch. 9 / 000 CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR): c = a @ b,
batch dims broadcast."""
from __future__ import annotations

import numpy as np

from ._kernels import kernel


@kernel("Matmul")
def matmul(op, ins):
    return {"c": np.matmul(ins["a"], ins["b"])}
