"""The library handle and version queries (002 §3.2.5 cudnnCreate, §3.2.20 cudnnDestroy,
§3.2.87/§3.2.61 SetStream/GetStream, §3.2.63 GetVersion, §3.2.43 GetErrorString,
§3.2.60 GetProperty)."""
from __future__ import annotations

from ._descriptor import Descriptor, resolve
from ._place import default_place, gpu_reason
from ._registry import legacy
from .enums import ENUMS
from .errors import CUDNN_STATUS_INVALID_VALUE, CUDNN_STATUS_NOT_INITIALIZED, CuDNNError, bad_param
from .errors import getErrorString as _getErrorString

# The version old callers see (the last 8.x), and the library property triple.
COMPAT_VERSION = 8907
_PROPERTIES = (8, 9, 7)


class Handle(Descriptor):
    """cudnnHandle_t: a place ('cpu' or 'gpu'), the device id and the bound stream."""

    kind = "cudnnHandle_t"

    def __init__(self, place: str):
        super().__init__()
        self.place = place
        self.device = 0
        self.stream = None  # None: the legacy default stream
        if place == "gpu":
            import cupy
            self.device = cupy.cuda.runtime.getDevice()
        self.touched()

    def _settings(self):
        return (self.place, self.device)


def get_handle(handle) -> Handle:
    return resolve(handle, Handle, "handle")


@legacy("cudnnCreate")
def create(place: "str | None" = None) -> Handle:
    """002 §3.2.5.  ``place`` ('cpu'/'gpu') is an extension; by default the best available."""
    place = place or default_place()
    if place not in ("cpu", "gpu"):
        raise bad_param("place", f"must be 'cpu' or 'gpu', got {place!r}")
    if place == "gpu" and gpu_reason():
        raise CuDNNError(CUDNN_STATUS_NOT_INITIALIZED, "place", f"a GPU handle needs a CUDA device: {gpu_reason()}")
    return Handle(place)


@legacy("cudnnDestroy")
def destroy(handle) -> None:
    """Release the handle (002 §3.2.20)."""
    h = get_handle(handle)
    if h.place == "gpu":
        import cupy
        cupy.cuda.Device(h.device).synchronize()
    h.destroy()


@legacy("cudnnSetStream")
def setStream(handle, stream) -> None:
    """Bind a stream: a ``cupy.cuda.Stream``, a raw cudaStream_t int, or 0/None for the default."""
    h = get_handle(handle)
    if stream is None or (isinstance(stream, int) and stream == 0):
        h.stream = None
    elif h.place == "cpu":
        h.stream = stream  # recorded; CPU work is synchronous
    else:
        import cupy
        if isinstance(stream, cupy.cuda.Stream):
            h.stream = stream
        elif isinstance(stream, int):
            h.stream = cupy.cuda.ExternalStream(stream)
        else:
            raise bad_param("streamId", f"must be a cupy.cuda.Stream or a cudaStream_t int, got {type(stream).__name__}")


@legacy("cudnnGetStream")
def getStream(handle) -> int:
    """The bound stream as a raw cudaStream_t int (0 for the default stream)."""
    h = get_handle(handle)
    s = h.stream
    if s is None:
        return 0
    return int(getattr(s, "ptr", s))


@legacy("cudnnGetVersion")
def getVersion() -> int:
    """CUDNN_VERSION as legacy callers expect it (8.x); see ``real_cudnn_version`` for libcudnn's."""
    return COMPAT_VERSION


@legacy("cudnnGetErrorString")
def getErrorString(status: int) -> str:
    """The name of a status code; CUDNN_UNKNOWN_STATUS for an unknown one (002 §3.2.44)."""
    return _getErrorString(status)


@legacy("cudnnGetProperty")
def getProperty(type: int) -> int:
    """MAJOR_VERSION, MINOR_VERSION or PATCH_LEVEL of the library (002 §3.2.54)."""
    if type not in ENUMS["libraryPropertyType"].values():
        raise CuDNNError(CUDNN_STATUS_INVALID_VALUE, "type", f"must be a libraryPropertyType (0, 1 or 2), got {type!r}")
    return _PROPERTIES[int(type)]
