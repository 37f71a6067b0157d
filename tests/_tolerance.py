"""GPU tolerances by precision class (issue 23 item 11): one bound per way of computing, not one
loose bound for every test.

    fp64   double data and compute                           1e-12
    fp32   float32 with FMA products (no TF32): FMA_MATH, an op with no math type, pointwise,
           pooling, softmax, normalizations, or TF32 disabled by NVIDIA_TF32_OVERRIDE=0  1e-5
    fp32_approx  float32 whose activation functions run as fast approximations: libcudnn's own RNN
           cells (its FMA_MATH LSTM differs from float64 by ~3e-4 in c over 8 steps)  1e-3
    tf32   float32 data whose products may run in TF32 (DEFAULT_MATH or TENSOR_OP_MATH on
           Ampere+: cudnn_compat/_backend/math_policy.allow_tf32; 10-bit mantissa products)  2e-3
    fp16   half data (or half/float mixed), float accumulation    1e-2
    bf16   bfloat16 data, float accumulation (8-bit mantissa)     2e-2

``rtol`` is relative to each element; ``atol`` is the same fraction of the largest magnitude of the
expected result (a sum of many terms loses accuracy relative to its terms, not to itself).  Pick the
class from the way the compared sides compute: ``gemm_class(dtype, math_type)`` applies the
project's one TF32 rule (``math_policy.allow_tf32``) for convolutions, matmuls and RNN GEMMs.
"""
from __future__ import annotations

import numpy as np

RTOL = {"fp64": 1e-12, "fp32": 1e-5, "fp32_approx": 1e-3, "tf32": 2e-3, "fp16": 1e-2, "bf16": 2e-2}
_OF_DTYPE = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def dtype_class(dtype: str) -> str:
    """The class of an op that has no TF32 path (pointwise, pooling, softmax, normalizations)."""
    return _OF_DTYPE[str(np.dtype(dtype)) if dtype != "bfloat16" else dtype]


def gemm_class(dtype: str, math_type: "str | None") -> str:
    """The class of a GEMM-like op (convolution, matmul, RNN) of ``dtype`` data under ``math_type``
    ('DEFAULT_MATH', 'FMA_MATH', ... or None for an op without one): tf32 where the project's TF32
    rule allows it on this machine (an H100 is Ampere+, so the device is not consulted)."""
    from cudnn_compat._backend.math_policy import allow_tf32
    cls = dtype_class(dtype)
    if cls == "fp32" and math_type is not None and allow_tf32("float32", math_type.replace("CUDNN_", "")):
        return "tf32"
    return cls


def assert_close(got, want, cls: str, err_msg: str = "", scale=None) -> None:
    """``got`` within class ``cls`` of ``want`` (NaNs must match); ``scale``: the magnitude the
    absolute part is relative to (default: the largest finite |want|, at least 1e-30)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    rtol = RTOL[cls]
    if scale is None:
        finite = np.abs(want[np.isfinite(want)])
        scale = float(finite.max()) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(float(scale), 1e-30), equal_nan=True,
                               err_msg=f"{err_msg} [{cls}: rtol {rtol:g}]")
