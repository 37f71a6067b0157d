"""The library handle and version queries (002 §3.2.5 cudnnCreate, §3.2.20 cudnnDestroy,
§3.2.87/§3.2.61 SetStream/GetStream, §3.2.63 GetVersion, §3.2.43 GetErrorString,
§3.2.60 GetProperty).

Devices (issue 17, docs/multi_gpu.md): cudnnCreate binds the CUDA device current at creation
(002 §3.2.5: "the handle is tied to the current device"; CuPy's ``cupy.cuda.Device(i)`` context
sets it) and records it as ``Handle.device``.  Every legacy call runs on that device: a call made
while another device is current switches to the handle's device for its duration
(``on_device``); the check is one attribute test on a single-GPU process (``Handle.switch`` is
False when the process sees one device).  ``cudnnSetStream`` takes only streams of that device."""
from __future__ import annotations

import warnings

from ._core.descriptor import Descriptor, resolve
from ._core.place import default_place, gpu_reason
from ._core.registry import legacy
from .enums import ENUMS
from .errors import CUDNN_STATUS_INVALID_VALUE, CUDNN_STATUS_MAPPING_ERROR, CUDNN_STATUS_NOT_INITIALIZED, CuDNNError
from .errors import bad_param
from .errors import getErrorString as _getErrorString

# The version old callers see (the last 8.x), and the library property triple.
COMPAT_VERSION = 8907
_PROPERTIES = (8, 9, 7)


class Handle(Descriptor):
    """cudnnHandle_t: a place ('cpu' or 'gpu'), the device id and the bound stream.

    ``device``: the CUDA device current at creation (0 on the CPU place).  ``switch``: whether
    calls must check the current device (a GPU handle in a process that sees several devices)."""

    kind = "cudnnHandle_t"

    def __init__(self, place: str):
        super().__init__()
        self.place = place
        self.device = 0
        self.switch = False
        self.stream = None  # None: the legacy default stream
        if place == "gpu":
            import cupy
            self.device = int(cupy.cuda.runtime.getDevice())
            self.switch = int(cupy.cuda.runtime.getDeviceCount()) > 1
        self.touched()

    def _settings(self):
        return (self.place, self.device)


def get_handle(handle) -> Handle:
    return resolve(handle, Handle, "handle")


def current_device() -> int:
    """The calling thread's current CUDA device (cudaGetDevice)."""
    import cupy
    return cupy.cuda.runtime.getDevice()


def on_device(handle, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with ``handle``'s device current (CuPy's ``Device`` context: the
    previous device is current again afterwards, also when ``fn`` raises).  Callers test
    ``handle.switch and handle.device != current_device()`` first, so a call already on its
    device (every call of a single-GPU process) pays one attribute test."""
    import cupy
    with cupy.cuda.Device(handle.device):
        return fn(*args, **kwargs)


def wrong_device(handle) -> bool:
    """Whether a call on ``handle`` must switch device first (see ``on_device``)."""
    return handle.switch and handle.device != current_device()


# -- the device of a raw cudaStream_t (cudnnSetStream's context rule) ----------------------------------
# CuPy has no binding of cudaStreamGetDevice; its driver module has cuStreamGetCtx, cuCtxGetCurrent,
# cuCtxSetCurrent and cuCtxGetDevice (cupy.cuda.driver): the stream's context made current for the
# query, then the caller's restored.  None when the driver cannot say (then the stream is accepted,
# as before).  STREAM_DEVICE[0] replaces the query (tests).
STREAM_DEVICE: list = [None]
_SPECIAL_STREAMS = (1, 2)  # cudaStreamLegacy, cudaStreamPerThread: the current device's own streams


def stream_device(ptr: int, driver=None) -> "int | None":
    """The device ordinal a raw stream belongs to, or None when the driver cannot say.
    ``driver``: CuPy's driver module (default ``cupy.cuda.driver``)."""
    if STREAM_DEVICE[0] is not None:
        return STREAM_DEVICE[0](ptr)
    try:
        if driver is None:
            import cupy
            driver = cupy.cuda.driver
        ctx = driver.streamGetCtx(int(ptr))
        if not ctx:
            return None
        old = driver.ctxGetCurrent()
        driver.ctxSetCurrent(ctx)
        try:
            return int(driver.ctxGetDevice())
        finally:
            driver.ctxSetCurrent(old)
    except Exception:  # noqa: BLE001 - no CuPy, not a stream of this process, a driver error: not known
        return None


def _stream_types(cupy) -> tuple:
    """CuPy's stream classes: ``Stream``, and ``ExternalStream`` (no subclass of it)."""
    ext = getattr(cupy.cuda, "ExternalStream", None)
    return (cupy.cuda.Stream,) if not isinstance(ext, type) else (cupy.cuda.Stream, ext)


def _check_stream_device(h: Handle, device: "int | None", what: str) -> None:
    """002 §3.2.89: a stream of another device than the handle's is CUDNN_STATUS_MAPPING_ERROR
    ("mismatch between the user stream and the cuDNN handle context")."""
    if device is not None and device >= 0 and device != h.device:
        raise CuDNNError(CUDNN_STATUS_MAPPING_ERROR, "streamId",
                         f"{what} belongs to device {device}, the handle to device {h.device} "
                         f"(cudnnCreate binds the current device; create one handle per device)")


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
    """Bind a stream: a ``cupy.cuda.Stream``, a raw cudaStream_t int, or 0/None for the default.

    002 §3.2.89: a stream of another device than the handle's is CUDNN_STATUS_MAPPING_ERROR;
    CuPy's null/per-thread streams (``device_id`` -1) and cudaStreamLegacy/PerThread (1, 2) are
    the default streams of whichever device is current, so of the handle's device in its calls."""
    h = get_handle(handle)
    if stream is None or (isinstance(stream, int) and stream == 0):
        h.stream = None
    elif h.place == "cpu":
        h.stream = stream  # recorded; CPU work is synchronous
    else:
        import cupy
        if isinstance(stream, _stream_types(cupy)):
            _check_stream_device(h, getattr(stream, "device_id", -1), f"the stream {stream!r}")
            h.stream = stream
        elif isinstance(stream, int):
            if int(stream) not in _SPECIAL_STREAMS:
                _check_stream_device(h, stream_device(int(stream)), f"the cudaStream_t {int(stream):#x}")
            with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream (Stream.from_external
                warnings.simplefilter("ignore", DeprecationWarning)  # takes only protocol objects)
                h.stream = cupy.cuda.ExternalStream(int(stream), h.device if int(stream) not in _SPECIAL_STREAMS else -1)
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
