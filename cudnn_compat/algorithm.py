"""The algorithm descriptor and algorithm performance families, deprecated in 8.0 but present
(002 §3.2.7 cudnnCreateAlgorithmDescriptor, §3.2.77 Set, §3.2.38 Get, §3.2.4 Copy, §3.2.22
Destroy, §3.2.8 CreateAlgorithmPerformance, §3.2.78 Set, §3.2.39 Get, §3.2.23 Destroy,
§3.2.40 GetAlgorithmSpaceSize, §3.2.74 SaveAlgorithm, §3.2.72 RestoreAlgorithm).

cudnnAlgorithm_t is a union of one algorithm enum (convolution forward / backward data /
backward filter, RNN, CTC loss); in Python it is that int.  A performance object holds
(algorithm descriptor, status, time in ms, memory in bytes).  CreateAlgorithmPerformance
returns a list of ``numberToCreate`` objects; Destroy takes one object or a list.

SaveAlgorithm writes ALGO_SPACE_SIZE bytes of host metadata: magic b"CCAL", the library version
it was saved by (uint32 little endian), the algorithm (int32) and a checksum (uint32) of the
first 12 bytes.  RestoreAlgorithm rejects a wrong magic or checksum (BAD_PARAM, "metadata is
corrupted") and another version (NOT_SUPPORTED, "from a different cuDNN version").  The host
space is a writable buffer (NumPy array, bytearray) or a host pointer int.
"""
from __future__ import annotations

import ctypes
import numbers
import struct
import zlib

import numpy as np

from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.registry import legacy
from .errors import STATUS, bad_param, check, not_supported
from .handle import COMPAT_VERSION, get_handle

MAGIC = b"CCAL"
ALGO_SPACE_SIZE = 16
_LAYOUT = struct.Struct("<4sIiI")


class AlgorithmDescriptor(Descriptor):
    """cudnnAlgorithmDescriptor_t: one cudnnAlgorithm_t (an algo enum value)."""

    kind = "cudnnAlgorithmDescriptor_t"

    def __init__(self):
        super().__init__()
        self.algorithm = 0

    def _settings(self):
        return (self.algorithm,)


class AlgorithmPerformance(Descriptor):
    """cudnnAlgorithmPerformance_t: (algoDesc, status, time, memory)."""

    kind = "cudnnAlgorithmPerformance_t"

    def __init__(self):
        super().__init__()
        self.algoDesc, self.status, self.time, self.memory = None, STATUS["CUDNN_STATUS_SUCCESS"], 0.0, 0

    def _settings(self):
        return (self.algoDesc, self.status, self.time, self.memory)


def algorithm_desc(arg, argname: str = "algoDesc", need_set: bool = True) -> AlgorithmDescriptor:
    return resolve(arg, AlgorithmDescriptor, argname, need_set)


def _algorithm(value, argname="algorithm") -> int:
    check(isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value < 2 ** 31, argname,
          f"must be an algorithm enum value (a non-negative int), got {value!r}")
    return int(value)


# -- algorithm descriptor ------------------------------------------------------------

createAlgorithmDescriptor, destroyAlgorithmDescriptor = pair(AlgorithmDescriptor, __name__)


@legacy("cudnnSetAlgorithmDescriptor")
def setAlgorithmDescriptor(algorithmDesc, algorithm) -> None:
    """Set the algorithm held by an algorithm descriptor (002 §3.2.77, deprecated)."""
    d = algorithm_desc(algorithmDesc, "algorithmDesc", need_set=False)
    d.algorithm = _algorithm(algorithm)
    d.touched()


@legacy("cudnnGetAlgorithmDescriptor")
def getAlgorithmDescriptor(algoDesc) -> int:
    """The cudnnAlgorithm_t (algo enum value) the descriptor holds."""
    return algorithm_desc(algoDesc).algorithm


@legacy("cudnnCopyAlgorithmDescriptor")
def copyAlgorithmDescriptor(src, dest) -> None:
    """Copy the algorithm of src into dest (002 §3.2.4, deprecated)."""
    s = algorithm_desc(src, "src")
    d = algorithm_desc(dest, "dest", need_set=False)
    d.algorithm = s.algorithm
    d.touched()


# -- algorithm performance -----------------------------------------------------------

@legacy("cudnnCreateAlgorithmPerformance")
def createAlgorithmPerformance(numberToCreate: int = 1) -> list:
    """A list of ``numberToCreate`` performance objects (002 §3.2.8)."""
    check(isinstance(numberToCreate, numbers.Integral) and not isinstance(numberToCreate, bool) and numberToCreate >= 1,
          "numberToCreate", f"must be an int >= 1, got {numberToCreate!r}")
    return [AlgorithmPerformance() for _ in range(int(numberToCreate))]


@legacy("cudnnSetAlgorithmPerformance")
def setAlgorithmPerformance(algoPerf, algoDesc, status, time, memory) -> None:
    """BAD_PARAM: status not a cudnnStatus_t, negative time or memory."""
    p = resolve(algoPerf, AlgorithmPerformance, "algoPerf", need_set=False)
    d = algorithm_desc(algoDesc)
    check(status in STATUS.values(), "status", f"{status!r} is not a cudnnStatus_t")
    check(isinstance(time, numbers.Real) and not isinstance(time, bool) and time >= 0 or time == -1, "time",
          f"must be a non-negative number of milliseconds (or -1), got {time!r}")
    check(isinstance(memory, numbers.Integral) and not isinstance(memory, bool) and memory >= 0, "memory",
          f"must be a non-negative int, got {memory!r}")
    p.algoDesc, p.status, p.time, p.memory = d, int(status), float(np.float32(time)), int(memory)
    p.touched()


@legacy("cudnnGetAlgorithmPerformance")
def getAlgorithmPerformance(algoPerf) -> tuple:
    """(algoDesc, status, time, memory)"""
    p = resolve(algoPerf, AlgorithmPerformance, "algoPerf")
    return p.algoDesc, p.status, p.time, p.memory


@legacy("cudnnDestroyAlgorithmPerformance")
def destroyAlgorithmPerformance(algoPerf, numberToDestroy: "int | None" = None) -> None:
    """Destroy one performance object or a list of them (the first ``numberToDestroy``)."""
    perfs = list(algoPerf) if isinstance(algoPerf, (list, tuple)) else [algoPerf]
    if numberToDestroy is not None:
        check(isinstance(numberToDestroy, int) and 0 <= numberToDestroy <= len(perfs), "numberToDestroy",
              f"must be in [0, {len(perfs)}], got {numberToDestroy!r}")
        perfs = perfs[:numberToDestroy]
    objs = [resolve(p, AlgorithmPerformance, "algoPerf", need_set=False) for p in perfs]
    for p in objs:
        p.destroy()


# -- save and restore ----------------------------------------------------------------

@legacy("cudnnGetAlgorithmSpaceSize")
def getAlgorithmSpaceSize(handle, algoDesc) -> int:
    """Host bytes cudnnSaveAlgorithm writes (002 §3.2.40)."""
    get_handle(handle)
    algorithm_desc(algoDesc)
    return ALGO_SPACE_SIZE


def _host_bytes(space, size: int, argname: str, writable: bool) -> memoryview:
    """``size`` bytes of a host buffer: a NumPy array, bytes/bytearray/memoryview, or a pointer int."""
    if space is None or (isinstance(space, int) and not isinstance(space, bool) and space == 0):
        raise bad_param(argname, "is NULL")
    if isinstance(space, int) and not isinstance(space, bool):
        return memoryview((ctypes.c_uint8 * size).from_address(space)).cast("B")
    if isinstance(space, np.ndarray):
        check(space.flags.c_contiguous, argname, "must be a contiguous array")
        view = memoryview(space.reshape(-1).view(np.uint8))
    else:
        try:
            view = memoryview(space).cast("B")
        except TypeError:
            raise bad_param(argname, f"must be a host buffer or pointer, got {type(space).__name__}") from None
    check(not writable or not view.readonly, argname, "must be writable")
    check(view.nbytes >= size, argname, f"holds {view.nbytes} bytes, fewer than {size}")
    return view[:size]


@legacy("cudnnSaveAlgorithm")
def saveAlgorithm(handle, algoDesc, algoSpace, algoSpaceSizeInBytes) -> None:
    """Write the descriptor's metadata to host memory (module docstring).  BAD_PARAM: NULL
    arguments, algoSpaceSizeInBytes below cudnnGetAlgorithmSpaceSize."""
    get_handle(handle)
    d = algorithm_desc(algoDesc)
    check(isinstance(algoSpaceSizeInBytes, int) and algoSpaceSizeInBytes >= ALGO_SPACE_SIZE, "algoSpaceSizeInBytes",
          f"must be at least {ALGO_SPACE_SIZE} (cudnnGetAlgorithmSpaceSize), got {algoSpaceSizeInBytes!r}")
    out = _host_bytes(algoSpace, ALGO_SPACE_SIZE, "algoSpace", writable=True)
    head = _LAYOUT.pack(MAGIC, COMPAT_VERSION, d.algorithm, 0)[:12]
    out[:] = head + struct.pack("<I", zlib.crc32(head))


@legacy("cudnnRestoreAlgorithm")
def restoreAlgorithm(handle, algoSpace, algoSpaceSizeInBytes, algoDesc) -> None:
    """Read metadata written by cudnnSaveAlgorithm into ``algoDesc`` (module docstring)."""
    get_handle(handle)
    d = algorithm_desc(algoDesc, need_set=False)
    check(isinstance(algoSpaceSizeInBytes, int) and algoSpaceSizeInBytes >= ALGO_SPACE_SIZE, "algoSpaceSizeInBytes",
          f"must be at least {ALGO_SPACE_SIZE}, got {algoSpaceSizeInBytes!r}")
    raw = bytes(_host_bytes(algoSpace, ALGO_SPACE_SIZE, "algoSpace", writable=False))
    magic, version, algorithm, crc = _LAYOUT.unpack(raw)
    check(magic == MAGIC and crc == zlib.crc32(raw[:12]), "algoSpace", "the metadata is corrupted")
    if version != COMPAT_VERSION:
        raise not_supported("algoSpace", f"the metadata is from cuDNN version {version}, this is {COMPAT_VERSION}")
    d.algorithm = int(algorithm)
    d.touched()
