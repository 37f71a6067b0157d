"""Data and scalar arguments of legacy calls (architecture.md "Data arguments";
002 "Scaling Parameters": alpha/beta are host pointers to float, or to double
when the data type is DOUBLE).

``bind(handle, data, tensor, argname)`` makes the buffer an engine reads or writes:
a NumPy view with the descriptor's dims and strides over the caller's memory on the
CPU place, a strided CuPy array over the device memory on the GPU place.  The
caller's buffer must hold the descriptor's whole extent (BAD_PARAM otherwise, which
cuDNN itself cannot check).
"""
from __future__ import annotations

import ctypes
import numbers

import numpy as np

from _backend import dtypes
from .errors import bad_param

# Plain Python ints below this are scalar values (alpha=1, beta=0); larger ones are host
# pointers as CuPy 13 passed them (np.array(1.0).ctypes.data).  No host object lives in
# the first page of memory, so the two cannot be confused.
POINTER_MIN = 4096


def extent_bytes(tensor) -> int:
    """Bytes spanned by a tensor with non-negative strides (002 GetTensorSizeInBytes)."""
    span = 1 + sum((d - 1) * s for d, s in zip(tensor.dims, tensor.strides))
    return span * dtypes.itemsize(tensor.dtype)


def layout(tensor) -> tuple:
    """(storage dtype, bytes spanned, byte strides) of an IR tensor, computed once per tensor
    object: plans keep their tensors, so a cached call pays a dict lookup here."""
    spec = tensor.__dict__.get("_layout")
    if spec is None:
        storage = dtypes.storage_dtype(tensor.dtype)
        spec = (storage, extent_bytes(tensor), tuple(s * storage.itemsize for s in tensor.strides))
        object.__setattr__(tensor, "_layout", spec)
    return spec


def _host_view(data, tensor, argname: str) -> np.ndarray:
    storage, need, strides = layout(tensor)
    if type(data) is np.ndarray and data.flags.c_contiguous and not data.dtype.hasobject:  # the common case
        if data.nbytes < need:
            raise bad_param(argname, f"buffer holds {data.nbytes} bytes but the descriptor spans {need}")
        return np.ndarray(tensor.dims, dtype=storage, buffer=data, offset=0, strides=strides)
    if isinstance(data, np.ndarray):
        if not (data.flags.c_contiguous or data.flags.f_contiguous):
            raise bad_param(argname, "must be a contiguous buffer (legacy calls take a pointer, not a strided array)")
        if data.dtype.hasobject:  # rule: raw memory only (writing floats over object pointers crashes)
            raise bad_param(argname, f"holds Python objects (dtype {data.dtype}), not raw memory")
        if data.nbytes < need:
            raise bad_param(argname, f"buffer holds {data.nbytes} bytes but the descriptor spans {need}")
        raw = data.reshape(-1, order="A").view(np.uint8)
    elif isinstance(data, int) and not isinstance(data, bool):
        if data == 0:
            raise bad_param(argname, "is NULL")
        if data < POINTER_MIN:  # rule: a host pointer lies above the first page (negative or tiny ints crash)
            raise bad_param(argname, f"{data} is not a host pointer (below {POINTER_MIN})")
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * need).from_address(data))
    else:
        raise bad_param(argname, f"must be a NumPy array or a host pointer int on the CPU place, got {type(data).__name__}")
    return np.ndarray(tensor.dims, dtype=storage, buffer=raw, offset=0, strides=strides)


def _device_view(data, tensor, argname: str):
    import cupy
    storage, need, strides = layout(tensor)
    if isinstance(data, cupy.ndarray):
        if not (data.flags.c_contiguous or data.flags.f_contiguous):
            raise bad_param(argname, "must be a contiguous buffer")
        if data.nbytes < need:
            raise bad_param(argname, f"buffer holds {data.nbytes} bytes but the descriptor spans {need}")
        ptr, owner = data.data.ptr, data
    elif isinstance(data, int) and not isinstance(data, bool):
        if data < POINTER_MIN:  # rule: NULL, or no device address (a tiny or negative int faults the GPU)
            raise bad_param(argname, "is NULL" if data == 0 else f"{data} is not a device pointer")
        ptr, owner = data, None
    elif hasattr(data, "__cuda_array_interface__"):
        iface = data.__cuda_array_interface__
        ptr, owner = iface["data"][0], data
    elif hasattr(data, "__dlpack__"):
        arr = cupy.from_dlpack(data)
        return _device_view(arr, tensor, argname)
    else:
        raise bad_param(argname, f"must be a CuPy array, a device pointer int or a CUDA array on the GPU place, got {type(data).__name__}")
    mem = cupy.cuda.UnownedMemory(ptr, need, owner)
    return cupy.ndarray(tensor.dims, dtype=storage, memptr=cupy.cuda.MemoryPointer(mem, 0), strides=strides)


_CUPY_NDARRAY = []  # [cupy.ndarray] once CuPy is imported (device_pointer's fast path)


def cupy_ndarray():
    """``cupy.ndarray`` where it has the _c_contiguous/_f_contiguous attributes the fast paths read
    (else a class nothing is an instance of); imports CuPy on first use."""
    if not _CUPY_NDARRAY:
        import cupy
        # CuPy's ndarray exposes its contiguity as the attributes _c_contiguous/_f_contiguous
        # (cheaper than .flags); a CuPy without them takes the general path (_device_view)
        fast = hasattr(cupy.ndarray, "_c_contiguous") and hasattr(cupy.ndarray, "_f_contiguous")
        _CUPY_NDARRAY.append(cupy.ndarray if fast else type("_NoFastPath", (), {}))
    return _CUPY_NDARRAY[0]


def device_pointer(data, tensor, argname: str) -> int:
    """The device address of ``data`` after the checks ``bind`` makes, without building a CuPy
    array: for GPU plans that take raw pointers (``plan.raw_pointers``, the cudnn engine).
    A contiguous CuPy array costs a type test, two flag reads and a size compare."""
    if type(data) is int:
        if data < POINTER_MIN:  # rule: NULL, or no device address
            raise bad_param(argname, "is NULL" if data == 0 else f"{data} is not a device pointer")
        return data
    nd = _CUPY_NDARRAY[0] if _CUPY_NDARRAY else cupy_ndarray()
    if type(data) is nd:
        spec = tensor.__dict__.get("_layout") or layout(tensor)
        if (data._c_contiguous or data._f_contiguous) and data.nbytes >= spec[1]:
            return data.data.ptr
        if not (data._c_contiguous or data._f_contiguous):
            raise bad_param(argname, "must be a contiguous buffer")
        raise bad_param(argname, f"buffer holds {data.nbytes} bytes but the descriptor spans {spec[1]}")
    if isinstance(data, int) and not isinstance(data, bool):
        if data < POINTER_MIN:  # rule: NULL, or no device address
            raise bad_param(argname, "is NULL" if data == 0 else f"{data} is not a device pointer")
        return int(data)
    if data is None:
        raise bad_param(argname, "is NULL")
    return _device_view(data, tensor, argname).data.ptr


def host_view(data, tensor, argname: str, written: bool = False) -> np.ndarray:
    """``bind`` on the CPU place for the legacy call path: also BAD_PARAM for a read-only array
    the call writes (``written``), before anything is written."""
    if type(data) is np.ndarray:
        flags = data.flags
        if written and not flags.writeable:
            raise bad_param(argname, "is a read-only array but the call writes it")
        if flags.c_contiguous and not data.dtype.hasobject:  # the common case
            storage, need, strides = tensor.__dict__.get("_layout") or layout(tensor)
            if data.nbytes < need:
                raise bad_param(argname, f"buffer holds {data.nbytes} bytes but the descriptor spans {need}")
            return np.ndarray(tensor.dims, dtype=storage, buffer=data, offset=0, strides=strides)
    elif data is None:
        raise bad_param(argname, "is NULL")
    elif written and isinstance(data, np.ndarray) and not data.flags.writeable:
        raise bad_param(argname, "is a read-only array but the call writes it")
    return _host_view(data, tensor, argname)


def bind(handle, data, tensor, argname: str):
    """The engine-side buffer for ``data`` described by IR ``tensor``."""
    if data is None:
        raise bad_param(argname, "is NULL")
    if handle.place == "cpu":
        return _host_view(data, tensor, argname)
    return _device_view(data, tensor, argname)


def address(data) -> "int | None":
    """The address a data argument points at (None when it cannot be told)."""
    if isinstance(data, int) and not isinstance(data, bool):
        return int(data)
    if isinstance(data, np.ndarray):
        return data.__array_interface__["data"][0]
    iface = getattr(data, "__cuda_array_interface__", None)
    return iface["data"][0] if iface else None


def same_buffer(a, b) -> bool:
    """True when two data arguments are the same pointer (the in-place rules of 002)."""
    if a is None or b is None:
        return False
    return a is b or (address(a) is not None and address(a) == address(b))


def scalar(value, argname: str, double: bool = False) -> float:
    """alpha/beta and other host scalars: a number, a NumPy scalar/array, or a host pointer int
    to a float (double when ``double``)."""
    if type(value) is float:
        return value
    if value is None:
        raise bad_param(argname, "is NULL")
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int):
        if value >= POINTER_MIN:
            from ._descriptor import _LIVE
            if value in _LIVE:  # a descriptor id where a host pointer belongs: never dereference it
                raise bad_param(argname, f"is {_LIVE[value]!r}, not a host pointer to a scalar")
            ctype = ctypes.c_double if double else ctypes.c_float
            return float(ctype.from_address(value).value)
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "biuf":  # rule: a real number
        return float(value.reshape(-1)[0])
    raise bad_param(argname, f"must be a number, a NumPy scalar or a host pointer, got {type(value).__name__}")
