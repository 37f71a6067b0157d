"""Library-level services (002 §3.2.79 cudnnSetCallback, §3.2.41 cudnnGetCallback, §3.1.2
cudnnSeverity_t, §3.2.70 cudnnQueryRuntimeError, §3.2.42 cudnnGetCudartVersion, §3.2.67
cudnnOpsInferVersionCheck, §4.1.17 OpsTrain, §7.2.1 AdvInfer, §8.2.1 AdvTrain, and the
cnn_infer/cnn_train checks of the 8.x headers; inventory §2.17).

Callbacks.  cuDNN's log is the ``cudnn_compat`` Python logger (the planner logs each new plan at
INFO: the graph, the engines that declined and why, the config chosen).  SetCallback(mask,
udata, fptr) installs a logging handler that passes each record whose severity bit is set in
``mask`` (bit = cudnnSeverity_t: FATAL 0, ERROR 1, WARNING 2, INFO 3; logging's CRITICAL, ERROR,
WARNING, INFO/DEBUG) to ``fptr(sev, udata, dbg, msg)``; ``dbg`` is a ``CudnnDebug`` (the fields of
cudnnDebug_t), ``msg`` the message as a str.  FATAL is always delivered, as in cuDNN.  fptr None
selects the built-in logger, which writes to CUDNN_LOGDEST_DBG (stdout, stderr or a file name)
and stays silent when that variable is unset (002).  While a mask bit below the logger's level
is enabled the logger is lowered to it, and records the application would not have seen before
are kept from its other handlers.  mask 0 removes the handler and restores the logger.

QueryRuntimeError reports what an engine flagged with ``flag_runtime_error(handle, status)``
(none of ours does: their arithmetic cannot overflow the way cuDNN's integer reductions can),
else CUDNN_STATUS_SUCCESS, and clears it.  NONBLOCKING answers RUNTIME_IN_PROGRESS while the
handle's stream still has work; BLOCKING waits for it.

GetCudartVersion: the CUDA runtime version CuPy is linked against (major*1000 + minor*10), or 0
when CuPy (or a CUDA runtime) is not installed: the CPU reference engine needs none.

The version checks succeed when every family of that cuDNN sub-library, and of the ones it
depends on, was loaded from this package at this version; else CUDNN_STATUS_VERSION_MISMATCH.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

from ._core import log as _log
from ._core.descriptor import resolve
from ._core.registry import legacy
from .enums import ENUMS, is_valid
from .errors import STATUS, CuDNNError, check
from .handle import COMPAT_VERSION, Handle, get_handle

SEV = ENUMS["cudnnSeverity_t"]
FATAL, ERROR, WARNING, INFO = (SEV["CUDNN_SEV_FATAL"], SEV["CUDNN_SEV_ERROR"], SEV["CUDNN_SEV_WARNING"],
                               SEV["CUDNN_SEV_INFO"])
LOGGER = "cudnn_compat"
_START = time.time()


def severity(levelno: int) -> int:
    """cudnnSeverity_t of a logging level."""
    if levelno >= logging.CRITICAL:
        return FATAL
    if levelno >= logging.ERROR:
        return ERROR
    if levelno >= logging.WARNING:
        return WARNING
    return INFO


_LEVEL_OF = {FATAL: logging.CRITICAL, ERROR: logging.ERROR, WARNING: logging.WARNING, INFO: logging.INFO}


@dataclass(frozen=True)
class CudnnDebug:
    """cudnnDebug_t: the metadata passed with every message."""

    cudnn_version: int
    cudnnStatus: int
    time_sec: int
    time_usec: int
    time_delta: float  # seconds since the library was loaded
    handle: int
    stream: int
    pid: int
    tid: int
    cudaDeviceId: int


def _debug(record: logging.LogRecord) -> CudnnDebug:
    return CudnnDebug(COMPAT_VERSION, int(getattr(record, "cudnn_status", 0)), int(record.created),
                      int((record.created % 1) * 1e6), record.created - _START, int(getattr(record, "handle", 0)),
                      int(getattr(record, "stream", 0)), record.process or os.getpid(), record.thread or 0,
                      int(getattr(record, "device", 0)))


def _default_sink(sev, udata, dbg, msg) -> None:
    """The built-in callback: CUDNN_LOGDEST_DBG = stdout | stderr | a file name (%i: the process
    id); unset = silent."""
    dest = _log.destination()
    if dest is None:
        return
    name = {FATAL: "FATAL", ERROR: "ERROR", WARNING: "WARNING", INFO: "INFO"}[sev]
    line = f"cudnn_compat {name} (+{dbg.time_delta:.3f}s, pid {dbg.pid}): {msg}\n"
    if dest in ("stdout", "stderr"):
        getattr(sys, dest).write(line)
    else:
        with open(dest, "a") as f:
            f.write(line)


class _CallbackHandler(logging.Handler):
    def __init__(self, mask: int, udata, fptr):
        super().__init__(logging.DEBUG)
        self.mask, self.udata, self.fptr = mask, udata, fptr

    def emit(self, record):
        sev = severity(record.levelno)
        if sev == FATAL or self.mask & (1 << sev):
            try:
                (self.fptr or _default_sink)(sev, self.udata, _debug(record), record.getMessage())
            except Exception:  # a failing callback must not fail the library call
                self.handleError(record)


class _Quiet(logging.Filter):
    """Keeps records below ``floor`` from the application's own handlers."""

    def __init__(self, floor: int):
        super().__init__()
        self.floor = floor

    def filter(self, record):
        return record.levelno >= self.floor


class _Forward(logging.Handler):
    """Propagation that keeps out the records below ``floor`` (those the application did not see).
    It walks the ancestors' handlers as ``Logger.callHandlers`` does, but without logging's
    last-resort printer: with no handler above, a record goes nowhere, as it would have."""

    def __init__(self, parent, floor):
        super().__init__(floor)
        self.parent = parent

    def emit(self, record):
        log = self.parent
        if log is None or log.disabled or not log.filter(record):
            return
        while log is not None:
            for h in log.handlers:
                if record.levelno >= h.level:
                    h.handle(record)
            log = log.parent if log.propagate else None


_STATE = {"mask": 0, "udata": None, "fptr": None, "installed": None}
_lock = threading.Lock()


def _uninstall(log: logging.Logger) -> None:
    inst = _STATE["installed"]
    if inst is None:
        return
    handler, forward, level, propagate, quiet = inst
    for h in (handler, forward):
        if h is not None:
            log.removeHandler(h)
    for other in log.handlers:
        other.removeFilter(quiet)
    log.setLevel(level)
    log.propagate = propagate
    _STATE["installed"] = None


@legacy("cudnnSetCallback")
def setCallback(mask, udata=None, fptr=None) -> None:
    """Route the library's log records of the severities in ``mask`` to ``fptr`` (see the module
    docstring).  BAD_PARAM: mask not an unsigned 32-bit int, fptr not callable."""
    check(isinstance(mask, int) and not isinstance(mask, bool) and 0 <= mask < 2 ** 32, "mask",
          f"must be an unsigned 32-bit int, got {mask!r}")
    check(fptr is None or callable(fptr), "fptr", f"must be callable or None, got {type(fptr).__name__}")
    log = logging.getLogger(LOGGER)
    with _lock:
        _uninstall(log)
        _STATE.update(mask=int(mask), udata=udata, fptr=fptr)
        _log.follow_mask(int(mask))  # per-call records (API calls, failed calls) while INFO or ERROR is on
        if not mask and fptr is None:
            return
        floor = log.getEffectiveLevel()
        need = min([_LEVEL_OF[s] for s in _LEVEL_OF if mask & (1 << s)] + [logging.CRITICAL])
        quiet, forward = _Quiet(floor), None
        saved = (log.level, log.propagate)
        if need < floor:
            log.setLevel(need)
            for other in log.handlers:
                other.addFilter(quiet)
            if log.propagate:
                log.propagate = False
                forward = _Forward(log.parent, floor)
                log.addHandler(forward)
        handler = _CallbackHandler(int(mask), udata, fptr)
        log.addHandler(handler)
        _STATE["installed"] = (handler, forward) + saved + (quiet,)


def configure_from_environment() -> int:
    """At import: the variables' levels (CUDNN_LOG{INFO,WARN,ERR}_DBG, CUDNN_LOGLEVEL_DBG) on the
    built-in callback when CUDNN_LOGDEST_DBG is set; returns the mask installed (0: nothing to do)."""
    mask = _log.environment_mask()
    if not mask or _log.destination() is None:
        return 0
    setCallback(mask, None, None)
    return mask


@legacy("cudnnGetCallback")
def getCallback() -> tuple:
    """(mask, udata, fptr); fptr is None for the built-in logger (002 §3.2.41)."""
    return _STATE["mask"], _STATE["udata"], _STATE["fptr"]


# -- runtime errors ------------------------------------------------------------------

_RUNTIME: dict = {}  # handle id -> flagged cudnnStatus_t
RUNTIME_STATUSES = (STATUS["CUDNN_STATUS_RUNTIME_IN_PROGRESS"], STATUS["CUDNN_STATUS_RUNTIME_FP_OVERFLOW"])


def flag_runtime_error(handle, status: int = STATUS["CUDNN_STATUS_RUNTIME_FP_OVERFLOW"]) -> None:
    """For engines: record a remote kernel error on ``handle`` for cudnnQueryRuntimeError."""
    h = resolve(handle, Handle, "handle")
    with _lock:
        _RUNTIME[int(h)] = int(status)


def _stream_busy(h) -> bool:
    if h.place != "gpu":
        return False
    import cupy
    stream = h.stream or cupy.cuda.get_current_stream()
    return not stream.done


def _stream_wait(h) -> None:
    if h.place == "gpu":
        import cupy
        (h.stream or cupy.cuda.get_current_stream()).synchronize()


@legacy("cudnnQueryRuntimeError")
def queryRuntimeError(handle, mode, tag=None) -> int:
    """rstatus: SUCCESS, RUNTIME_IN_PROGRESS or RUNTIME_FP_OVERFLOW (002 §3.2.70); a reported error
    is cleared.  BAD_PARAM: invalid mode, tag not NULL.  INTERNAL_ERROR: the stream query failed."""
    h = get_handle(handle)
    check(is_valid("cudnnErrQueryMode_t", mode), "mode", f"{mode!r} is not a cudnnErrQueryMode_t")
    check(tag is None or (isinstance(tag, int) and tag == 0), "tag", "must be NULL")
    modes = ENUMS["cudnnErrQueryMode_t"]
    try:
        if int(mode) == modes["CUDNN_ERRQUERY_NONBLOCKING"] and _stream_busy(h):
            return STATUS["CUDNN_STATUS_RUNTIME_IN_PROGRESS"]
        if int(mode) == modes["CUDNN_ERRQUERY_BLOCKING"]:
            _stream_wait(h)
    except Exception as e:  # pragma: no cover - needs a failing device
        raise CuDNNError(STATUS["CUDNN_STATUS_INTERNAL_ERROR"], "handle", f"stream query failed: {e}") from None
    with _lock:
        return _RUNTIME.pop(int(h), STATUS["CUDNN_STATUS_SUCCESS"])


# -- versions ------------------------------------------------------------------------

@legacy("cudnnGetCudartVersion")
def getCudartVersion() -> int:
    """The CUDA runtime version of CuPy (e.g. 12040), or 0 without CuPy/CUDA (module docstring)."""
    try:
        import cupy
        return int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:
        return 0


# cuDNN 8 sub-library -> (the families it holds, the sub-libraries it depends on)
SUBLIBRARIES = {
    "ops_infer": (("handle", "tensor", "tensor_ops", "activation", "softmax", "pooling", "lrn", "batchnorm",
                   "dropout", "normalization", "transform", "algorithm", "misc"), ()),
    "ops_train": (("activation", "batchnorm", "normalization", "pooling", "softmax", "lrn", "dropout"), ("ops_infer",)),
    "cnn_infer": (("convolution.descriptor", "convolution.api", "convolution.legacy"), ("ops_infer",)),
    "cnn_train": (("convolution.descriptor", "convolution.api", "fused_ops"), ("ops_infer", "ops_train", "cnn_infer")),
    "adv_infer": (("rnn",), ("ops_infer",)),
    "adv_train": (("rnn",), ("ops_infer", "ops_train", "adv_infer")),
}


def _version_check(sub: str, seen=None) -> None:
    from ._version import __version__ as ours
    seen = set() if seen is None else seen
    if sub in seen:
        return
    seen.add(sub)
    families, deps = SUBLIBRARIES[sub]
    home = os.path.dirname(os.path.abspath(__file__))  # the package's folder (misc.py is in it)
    for fam in families:
        mod = sys.modules.get(f"{__package__}.{fam}")
        if mod is None:
            continue  # a family not shipped in this build is not a mismatch
        where = os.path.dirname(os.path.abspath(getattr(mod, "__file__", home)))
        version = getattr(mod, "__version__", ours)
        if os.path.commonpath([where, home]) != home or version != ours:
            raise CuDNNError(STATUS["CUDNN_STATUS_VERSION_MISMATCH"], sub,
                             f"family {fam} ({version}, {where}) does not match cudnn_compat {ours} ({home})")
    for dep in deps:
        _version_check(dep, seen)


def _register_version_checks() -> None:
    for sub, c_name in (("ops_infer", "cudnnOpsInferVersionCheck"), ("ops_train", "cudnnOpsTrainVersionCheck"),
                        ("cnn_infer", "cudnnCnnInferVersionCheck"), ("cnn_train", "cudnnCnnTrainVersionCheck"),
                        ("adv_infer", "cudnnAdvInferVersionCheck"), ("adv_train", "cudnnAdvTrainVersionCheck")):
        legacy(c_name)(_version_check_fn(sub, c_name))


def _version_check_fn(sub: str, c_name: str):
    """The C function takes no argument (void): ``sub`` is bound here, not a Python default that
    a caller could override (a call with an argument is BAD_PARAM, issue 13)."""
    def check_fn() -> None:
        """Succeeds (None) when the sub-library and its dependencies are consistent; else
        CuDNNError(CUDNN_STATUS_VERSION_MISMATCH) naming the family that differs."""
        _version_check(sub)
    check_fn.__doc__ = f"{c_name}: " + check_fn.__doc__
    return check_fn


_register_version_checks()

__all__ = ["CudnnDebug", "flag_runtime_error", "severity"]
