"""Data types of the graph layer and their host storage (002 §3.1.2 cudnnDataType_t).

Every tensor of the IR carries a dtype name from DTYPES.  On the host a tensor's
bytes live in a NumPy array of the *storage* dtype; bfloat16 has no NumPy dtype,
so it is stored as uint16 (its bits).  The reference engine loads every tensor to
float64 (``load``) and rounds back on the way out (``store``).

bfloat16 conversions (``bf16_to_f32``, ``f32_to_bf16``: round to nearest even, a NaN stays a
quiet NaN with its sign and upper payload) use ``ml_dtypes`` where it is installed (the GPU
extras bring it) and the uint16 bit arithmetic below otherwise; tests/test_dtypes_bf16.py
checks the two bit-exact against each other over every bfloat16 and the rounding boundaries
of float32.  The storage stays uint16 either way: it is also the device dtype
(cupy_engine/runtime.py, rnn.py build CuPy arrays of ``storage_dtype``; CuPy has no bfloat16
dtype and the kernels convert bits, codegen.py), legacy callers hand bfloat16 data as uint16
bits (the C ABI), and numpy stays the only required dependency.  Arrays of
``ml_dtypes.bfloat16`` are accepted as BFLOAT16 data, by dtype name
(cudnn_compat/_core/data.py; tests/test_data_args.py runs it when installed).
"""
from __future__ import annotations

import numpy as np

# name -> (storage dtype, itemsize, kind) ; kind: 'f' float, 'i' integer
DTYPES = {
    "float32": (np.dtype(np.float32), 4, "f"),
    "float64": (np.dtype(np.float64), 8, "f"),
    "float16": (np.dtype(np.float16), 2, "f"),
    "bfloat16": (np.dtype(np.uint16), 2, "f"),
    "int8": (np.dtype(np.int8), 1, "i"),
    "uint8": (np.dtype(np.uint8), 1, "i"),
    "int32": (np.dtype(np.int32), 4, "i"),
    "int64": (np.dtype(np.int64), 8, "i"),
    "bool": (np.dtype(np.bool_), 1, "i"),
}


def storage_dtype(name: str) -> np.dtype:
    return DTYPES[name][0]


def itemsize(name: str) -> int:
    return DTYPES[name][1]


def is_float(name: str) -> bool:
    return DTYPES[name][2] == "f"


try:  # optional: the GPU extras install it
    import ml_dtypes as _ml_dtypes
    BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:
    BF16 = None


def bits_bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float32 (exact: the bits are float32's upper half); no ml_dtypes."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _nan_bits(u: np.ndarray) -> np.ndarray:
    """A float32 NaN's bfloat16: its sign and upper payload, quiet bit set."""
    return ((u >> 16) | 0x40).astype(np.uint16)


def bits_f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even; NaN stays NaN; no ml_dtypes."""
    f = np.asarray(values, dtype=np.float32)
    u = np.ascontiguousarray(f).reshape(f.shape).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, _nan_bits(u), rounded)
    return rounded.reshape(np.shape(values))  # ascontiguousarray made a 0-d input 1-d


def ml_bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float32 through ml_dtypes."""
    return np.asarray(u16, dtype=np.uint16).view(BF16).astype(np.float32)


def ml_f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits through ml_dtypes (its rounding: nearest even); a NaN gets the
    rule of ``bits_f32_to_bf16`` (ml_dtypes makes every NaN the canonical one)."""
    f = np.asarray(values, dtype=np.float32)
    rounded = f.astype(BF16).view(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, _nan_bits(np.ascontiguousarray(f).reshape(f.shape).view(np.uint32)), rounded)
    return rounded.reshape(np.shape(values))


bf16_to_f32 = bits_bf16_to_f32 if BF16 is None else ml_bf16_to_f32
f32_to_bf16 = bits_f32_to_bf16 if BF16 is None else ml_f32_to_bf16


def load(view: np.ndarray, name: str) -> np.ndarray:
    """Host tensor (storage dtype) -> float64 values (int64 for integers)."""
    if name == "bfloat16":
        return bf16_to_f32(view).astype(np.float64)
    if is_float(name):
        return np.asarray(view, dtype=np.float64)
    return np.asarray(view, dtype=np.float64)


def to_storage(values, name: str) -> np.ndarray:
    """float64 values -> storage dtype, rounding as the GPU would (RNE; ints saturate)."""
    values = np.asarray(values, dtype=np.float64)
    if name == "bfloat16":
        with np.errstate(over="ignore", invalid="ignore"):
            return f32_to_bf16(values.astype(np.float32))
    if is_float(name):
        with np.errstate(over="ignore", invalid="ignore"):
            return values.astype(DTYPES[name][0])
    if name == "bool":
        return values != 0
    info = np.iinfo(DTYPES[name][0])
    with np.errstate(invalid="ignore"):
        r = np.clip(np.rint(np.nan_to_num(values)), info.min, info.max)
    return r.astype(DTYPES[name][0])


def store(view: np.ndarray, values, name: str) -> None:
    """Write float64 ``values`` (broadcast to the view's shape) into ``view``."""
    view[...] = to_storage(np.broadcast_to(values, view.shape), name)
