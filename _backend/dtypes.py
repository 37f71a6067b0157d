"""Data types of the graph layer and their host storage (002 §3.1.2 cudnnDataType_t).

Every tensor of the IR carries a dtype name from DTYPES.  On the host a tensor's
bytes live in a NumPy array of the *storage* dtype; bfloat16 has no NumPy dtype,
so it is stored as uint16 and converted here with round-to-nearest-even, without
depending on ml_dtypes.  The reference engine loads every tensor to float64
(``load``) and rounds back on the way out (``store``).

Why not ``ml_dtypes.bfloat16`` as the storage dtype (issue 16 asked): it would remove the two
converters below (~15 lines) but not the uint16 path, so it removes no code overall:
  - the storage dtype is also the device one (cupy_engine/runtime.py, rnn.py build CuPy arrays
    of ``storage_dtype``), and CuPy has no bfloat16 dtype: device buffers stay uint16 and the
    kernels convert bits (codegen.py), so uint16 storage and the bit conversions stay anyway;
  - legacy callers hand bfloat16 data as uint16 bits (the C ABI), which must keep working;
  - it would make ml_dtypes a hard dependency (numpy is the only one) for one dtype.
Arrays of ``ml_dtypes.bfloat16`` are still accepted as BFLOAT16 data, by dtype name, without
importing ml_dtypes (cudnn_compat/_core/data.py; tests/test_data_args.py runs it when installed).
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


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even), NaN stays NaN."""
    f = np.asarray(values, dtype=np.float32)
    u = np.ascontiguousarray(f).reshape(f.shape).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded.reshape(np.shape(values))  # ascontiguousarray made a 0-d input 1-d


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
