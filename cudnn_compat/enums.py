"""Every enum type of 002 with its C values, as module constants (002 §3.1.2, §5.1.3,
§6.1.3, §7.1.2, §8.1.1; values cross-checked against the cuDNN headers).

``ENUMS[type_name]`` maps value names to ints; every value name is also a module
attribute, as CuPy 13's ``cupy.cuda.cudnn`` exposed them.  ``is_valid(type, v)``
and ``name_of(type, v)`` serve validation and messages.
"""
from __future__ import annotations

ENUMS: dict = {
    "cudnnDataType_t": {
        "CUDNN_DATA_FLOAT": 0, "CUDNN_DATA_DOUBLE": 1, "CUDNN_DATA_HALF": 2, "CUDNN_DATA_INT8": 3,
        "CUDNN_DATA_INT32": 4, "CUDNN_DATA_INT8x4": 5, "CUDNN_DATA_UINT8": 6, "CUDNN_DATA_UINT8x4": 7,
        "CUDNN_DATA_INT8x32": 8, "CUDNN_DATA_BFLOAT16": 9, "CUDNN_DATA_INT64": 10,
    },
    "cudnnTensorFormat_t": {"CUDNN_TENSOR_NCHW": 0, "CUDNN_TENSOR_NHWC": 1, "CUDNN_TENSOR_NCHW_VECT_C": 2},
    "cudnnNanPropagation_t": {"CUDNN_NOT_PROPAGATE_NAN": 0, "CUDNN_PROPAGATE_NAN": 1},
    "cudnnDeterminism_t": {"CUDNN_NON_DETERMINISTIC": 0, "CUDNN_DETERMINISTIC": 1},
    "cudnnMathType_t": {
        "CUDNN_DEFAULT_MATH": 0, "CUDNN_TENSOR_OP_MATH": 1,
        "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION": 2, "CUDNN_FMA_MATH": 3,
    },
    "libraryPropertyType": {"MAJOR_VERSION": 0, "MINOR_VERSION": 1, "PATCH_LEVEL": 2},
}

CONSTANTS = {"CUDNN_DIM_MAX": 8, "CUDNN_BN_MIN_EPSILON": 0.0}


def is_valid(type_name: str, value) -> bool:
    try:
        return int(value) in ENUMS[type_name].values()
    except (TypeError, ValueError):
        return False


def name_of(type_name: str, value) -> str:
    for k, v in ENUMS[type_name].items():
        if v == value:
            return k
    return f"<invalid {type_name} {value}>"


for _values in ENUMS.values():
    globals().update(_values)
globals().update(CONSTANTS)
