"""The one TF32 rule of every engine and every GEMM-like path (convolutions, matmuls, RNN
GEMMs; cuBLAS and the native cuDNN engine alike): 002 §3.1.2.x cudnnMathType_t.

    allow_tf32(data_type, math_type) is True exactly when
      * the data (and so the compute) type is FLOAT (float32): TF32 replaces FP32 products
        only; half/bfloat16 data use their own tensor-core path, double never changes;
      * the op has a math type and it is not CUDNN_FMA_MATH: DEFAULT_MATH "permits TF32
        Tensor Core operation" on Ampere and newer (002 cudnnMathType_t), TENSOR_OP_MATH and
        TENSOR_OP_MATH_ALLOW_CONVERSION permit it too; FMA_MATH "is restricted to only kernels
        that use FMA instructions".  An op with no math type (legacy functions that have no
        mathType argument: the spatial transformer grid generator, backend API matmuls; attention's
        GEMMs carry the attention descriptor's math type) computes in full FP32, as those legacy routines did;
      * NVIDIA_TF32_OVERRIDE is not "0": 002 "The TF32 behavior for CUDNN_DEFAULT_MATH can be
        explicitly disabled by the environment variable NVIDIA_TF32_OVERRIDE=0"; libcudnn and
        cuBLAS read it process-wide, so here it disables TF32 for every math type and path;
      * the device, when given, is Ampere or newer (compute capability >= 8.0): older devices
        have no TF32, and the permission has no effect there.

Engines apply it as: cudnn engine, a float32 config noted TENSOR_CORE (without
DOWN_CONVERT_INPUTS: that is the fp16 conversion ALLOW_CONVERSION asks for) only when allowed;
cupy engine, cuBLAS compute type CUBLAS_COMPUTE_32F_FAST_TF32 when allowed, else
CUBLAS_COMPUTE_32F (CUBLAS_COMPUTE_64F for double), for matmuls, convolution GEMMs and the RNN
recurrence alike.  docs/conventions.md "Math policy" has the measured errors.
"""
from __future__ import annotations

from . import config as _config

MATH_TYPES = ("DEFAULT_MATH", "TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION", "FMA_MATH")
OVERRIDE_VAR = "NVIDIA_TF32_OVERRIDE"


_override = _config.getter(OVERRIDE_VAR)


def tf32_disabled() -> bool:
    """NVIDIA_TF32_OVERRIDE=0 is set (read through ``config`` at each call: cheap, and tests may change it)."""
    return _override() == "0"


def allow_tf32(data_type: str, math_type: "str | None", compute_capability: "int | None" = None) -> bool:
    """Whether TF32 tensor-core math may replace FP32 math for an op on ``data_type`` data
    (IR dtype name) with ``math_type`` (cudnnMathType_t name without CUDNN_, or None for an op
    that has none); ``compute_capability`` as 80 for sm_80, None when not known."""
    if data_type != "float32" or math_type is None or math_type == "FMA_MATH":
        return False
    if math_type not in MATH_TYPES:
        raise ValueError(f"math type {math_type!r} is not one of {MATH_TYPES}")
    if compute_capability is not None and int(compute_capability) < 80:
        return False
    return not tf32_disabled()


def gemm_compute(data_type: str, math_type: "str | None") -> str:
    """The GEMM compute class for an op: 'float64' for double data, 'tf32' when
    ``allow_tf32``, else 'float32' (half/bfloat16 data accumulate in float32)."""
    if data_type == "float64":
        return "float64"
    return "tf32" if allow_tf32(data_type, math_type) else "float32"
