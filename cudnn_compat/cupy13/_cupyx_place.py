"""``cupyx.cudnn``'s places, arrays and memory, and its handles: CuPy arrays run on the GPU
(a handle per device, as CuPy 13 kept), NumPy arrays on the CPU reference engine (a CPU handle);
``get_handle`` / ``reset_handles`` (cudnnCreate / cudnnDestroy, 002 §3.2.5, §3.2.20), the
workspace limit of algorithm selection and the per-thread cache of Nd tensor descriptors."""
from __future__ import annotations

import atexit as _atexit
import threading as _threading

import numpy as _numpy

from . import cupy_cudnn as cudnn
from .._core.place import default_place as _default_place

_thread_local = _threading.local()
_handles: dict = {}  # (place, device) -> handle
_max_workspace_size = 8 * 1024 * 1024


class PerformanceWarning(RuntimeWarning):
    """CuPy's ``cupy._util.PerformanceWarning``."""


def _performance_warning():
    try:
        from cupy._util import PerformanceWarning as cupy_warning
        return cupy_warning
    except Exception:  # noqa: BLE001 - CuPy absent (or its stand-in namespace)
        return PerformanceWarning


# -- places, arrays and memory -----------------------------------------------------------------------

def _on_device(a) -> bool:
    return a is not None and type(a).__module__.split(".")[0] == "cupy"


def _xp(a):
    if _on_device(a):
        import cupy
        return cupy
    return _numpy


def _place(*arrays) -> str:
    return "gpu" if any(_on_device(a) for a in arrays) else "cpu"


def _device_id(a) -> int:
    return int(a.device.id) if _on_device(a) else -1


def _handle(place: str):
    if place == "gpu":
        import cupy
        key = ("gpu", cupy.cuda.runtime.getDevice())
    else:
        key = ("cpu", -1)
    h = _handles.get(key)
    if h is None:
        h = _handles[key] = cudnn.create(place)
    return h


def _handle_for(*arrays):
    return _handle(_place(*arrays))


def _contiguous(a):
    return a if a.flags.c_contiguous else _xp(a).ascontiguousarray(a)


def _empty(shape, dtype, like):
    return _xp(like).empty(shape, dtype)


def _d(a):
    """A data argument: the array (NULL for None or an empty array)."""
    return 0 if a is None or a.size == 0 else a


class _HostMemory:
    """The CPU place's ``cupy.cuda.MemoryPointer``: ``.ptr``, ``.mem.size`` and the NumPy buffer."""

    class _Mem:
        def __init__(self, size):
            self.size = size

    def __init__(self, size: int):
        self.array = _numpy.zeros(int(size), _numpy.uint8)
        self.mem = self._Mem(int(size))
        self.ptr = self.array.ctypes.data if size else 0


def _alloc(size: int, place: str):
    if place == "gpu":
        import cupy
        return cupy.cuda.alloc(int(size))
    return _HostMemory(size)


def _mem(m):
    """A workspace / reserve / states argument from an allocation (NULL when empty)."""
    if m is None or m.mem.size == 0:
        return 0
    return m.array if isinstance(m, _HostMemory) else m.ptr


def _mem_size(m) -> int:
    return 0 if m is None else int(m.mem.size)


def _handle_place(handle) -> str:
    from .._core.descriptor import _LIVE
    h = _LIVE.get(int(handle))
    return getattr(h, "place", _default_place())


# -- handles and workspace -------------------------------------------------------------------------

def get_handle():
    """The cuDNN handle of the default place (the current device's when CuPy sees a GPU)."""
    return _handle(_default_place())


@_atexit.register
def reset_handles():
    for h in list(_handles.values()):
        try:
            cudnn.destroy(h)
        except Exception:  # noqa: BLE001 - already gone at shutdown
            pass
    _handles.clear()


def _get_nd_tensor_cache() -> dict:
    if not hasattr(_thread_local, "cudnn_nd_tensor_cache"):
        _thread_local.cudnn_nd_tensor_cache = {}
    return _thread_local.cudnn_nd_tensor_cache


def get_max_workspace_size() -> int:
    """The workspace limit the convolution helpers pass to algorithm selection (8 MiB)."""
    return _max_workspace_size


def set_max_workspace_size(size) -> None:
    global _max_workspace_size
    _max_workspace_size = int(size)
