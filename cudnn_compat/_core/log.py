"""cuDNN's own logging variables, mapped onto the ``cudnn_compat`` Python logger (which stays the
primary interface: every record below is an ordinary ``logging`` record of that logger or of its
child ``cudnn_compat.api``).

Legacy cuDNN 8 ("API Logging" in the cuDNN 8 Developer Guide; 002 §3.2.79 cudnnSetCallback: the
built-in callback writes to CUDNN_LOGDEST_DBG, which must be set):

==================== ====================================================================
CUDNN_LOGINFO_DBG=1  API logging: every legacy call, at INFO, as ``function cudnnXxx()
                     called: CUDNN_STATUS_...`` (its status), plus the library's other INFO
                     records (a new plan: its graph and the engine chosen)
CUDNN_LOGWARN_DBG=1  the library's warnings (an engine falling back, a fused graph run call
                     by call, a plan-cache file ignored)
CUDNN_LOGERR_DBG=1   errors: each failed legacy call's CuDNNError message, at ERROR
CUDNN_LOGDEST_DBG    ``stdout``, ``stderr`` or a file name (appended to; ``%i`` in it is the
                     process id, as in cuDNN); unset or empty: nothing is logged and nothing
                     costs anything, as in cuDNN
==================== ====================================================================

cuDNN 9 (its "Error Reporting and API Logging"): ``CUDNN_LOGLEVEL_DBG`` = 0 (off), 1 (errors),
2 (warnings and errors), 3 (also every API call, INFO); other integers are clipped to 0..3.
When it is set, it alone decides the levels (cuDNN 8's three variables are ignored); unset, the
three variables do, as in cuDNN 9's grace period for them.

The records go only where they are asked for: the destination, and the handlers the application
attached to ``cudnn_compat`` or its ancestors.  The library's logger carries a ``NullHandler``,
so no record of the library ever reaches ``logging``'s last-resort printer on stderr.

At import, when a level is enabled and CUDNN_LOGDEST_DBG is set, the library calls
``cudnnSetCallback(mask, NULL, NULL)`` with those levels' cudnnSeverity_t bits: the built-in
callback's handler (misc.py) joins the ``cudnn_compat`` logger at the enabled levels and writes
each record to the destination.  So ``cudnnGetCallback()`` reports that mask, and a later
``cudnnSetCallback`` replaces it (mask 0 turns the variables' logging off; a user callback gets
the same records instead), as in cuDNN, where the variables set the initial state of the one
callback.  Per-call records (API calls and failed calls) are produced by a call hook
(``_core.registry.HOOKS``) that is installed only while a callback mask has the INFO or ERROR bit, or
while ``log_api_calls(True)`` asks for them (for applications that attach their own ``logging``
handler to ``cudnn_compat`` instead); otherwise the call path pays nothing.

Not logged: a call rejected by the wrapper's argument conversion (a float where an int goes)
before the function starts: the hook runs after that conversion.
"""
from __future__ import annotations

import logging
import os
import threading

from cudnn_compat._backend import config as _config
from cudnn_compat._backend.ir import GraphError
from . import registry as _registry
from ..errors import CuDNNError, getErrorString

LIBRARY_LOGGER = "cudnn_compat"
API_LOGGER = "cudnn_compat.api"
_log = logging.getLogger(API_LOGGER)
# every record of the library reaches the handlers of cudnn_compat and the application's, never
# logging's last-resort stderr printer (a library must not print on its own)
logging.getLogger(LIBRARY_LOGGER).addHandler(logging.NullHandler())

# variable -> cudnnSeverity_t bit (002 §3.1.2 cudnnSeverity_t: FATAL 0, ERROR 1, WARNING 2, INFO 3)
LEVEL_VARIABLES = (("CUDNN_LOGINFO_DBG", 3), ("CUDNN_LOGWARN_DBG", 2), ("CUDNN_LOGERR_DBG", 1))
LEVEL_VARIABLE = "CUDNN_LOGLEVEL_DBG"  # cuDNN 9: nested levels
LEVEL_MASKS = {0: 0, 1: 1 << 1, 2: (1 << 1) | (1 << 2), 3: (1 << 1) | (1 << 2) | (1 << 3)}
DEST_VARIABLE = "CUDNN_LOGDEST_DBG"
_PER_CALL_BITS = (1 << 3) | (1 << 1)  # INFO (API calls) and ERROR (failed calls) need the hook

_STATE = {"explicit": False, "mask": 0}
_tls = threading.local()
_lock = threading.Lock()


def environment_mask() -> int:
    """The cudnnSeverity_t mask the variables enable: CUDNN_LOGLEVEL_DBG's when it is set, else
    cuDNN 8's CUDNN_LOG{INFO,WARN,ERR}_DBG (0 when none is set to 1)."""
    level = _config.get(LEVEL_VARIABLE)
    if level is not None:
        return LEVEL_MASKS[level]
    mask = 0
    for name, bit in LEVEL_VARIABLES:
        if _config.get(name):
            mask |= 1 << bit
    return mask


def destination() -> "str | None":
    """CUDNN_LOGDEST_DBG as the built-in callback uses it: ``stdout``, ``stderr`` or a file name
    with each ``%i`` replaced by the process id (None: unset or empty, nothing is written)."""
    dest = (_config.get(DEST_VARIABLE) or "").strip()
    if not dest:
        return None
    return dest if dest in ("stdout", "stderr") else dest.replace("%i", str(os.getpid()))


def log_api_calls(on: bool = True) -> None:
    """Log every legacy call (INFO, logger ``cudnn_compat.api``) and each failed call's message
    (ERROR) whatever the callback mask; ``False`` leaves it to the mask again."""
    with _lock:
        _STATE["explicit"] = bool(on)
        _sync()


def follow_mask(mask: int) -> None:
    """Called by cudnnSetCallback with its new mask: per-call records while INFO or ERROR is on."""
    with _lock:
        _STATE["mask"] = int(mask)
        _sync()


def api_logging() -> bool:
    """True while the per-call hook is installed."""
    return _hook in _registry.HOOKS


def _sync() -> None:
    want = _STATE["explicit"] or bool(_STATE["mask"] & _PER_CALL_BITS)
    have = _hook in _registry.HOOKS
    if want and not have:
        _registry.HOOKS.append(_hook)  # innermost: it sees the call as the function runs it
        _registry.REJECTED.append(_rejected)  # calls refused before the hooks: bad argument values
    elif have and not want:
        _registry.HOOKS.remove(_hook)
        _registry.REJECTED.remove(_rejected)


def _error_of(e: Exception, c_name: str, args, kwargs) -> "CuDNNError | None":
    """The CuDNNError the legacy wrapper turns ``e`` into (None: not a cuDNN failure)."""
    if isinstance(e, CuDNNError):
        return e.with_function(c_name)
    if isinstance(e, GraphError):
        return _registry.graph_error(e, c_name)
    if isinstance(e, _registry._BARE):
        fn = _registry.LEGACY.get(c_name)
        return _registry._bare_error(e, c_name, getattr(fn, "__wrapped__", fn), args, kwargs)
    return None


def _extra(status: int, args, result=None) -> dict:
    """cudnnDebug_t's status and handle: the call's handle argument (or the one cudnnCreate made)."""
    first = args[0] if args else None
    if getattr(first, "kind", None) != "cudnnHandle_t":
        first = result
    handle = int(first) if getattr(first, "kind", None) == "cudnnHandle_t" else 0
    return {"cudnn_status": status, "handle": handle}


def _rejected(c_name: str, err: CuDNNError, args, kwargs) -> None:
    """A call refused while its arguments were converted: the records a failed call gets."""
    if getattr(_tls, "busy", False):  # inside another legacy call: that outer call is the API call
        return
    extra = _extra(err.status, args)
    _log.info("function %s() called: %s", c_name, err.status_name, extra=extra)
    _log.error("function %s() failed: %s", c_name, err.message, extra=extra)


def _hook(proceed, c_name: str, args, kwargs):
    """The per-call hook: one INFO record per outermost legacy call (a legacy function that calls
    another is one API call), one ERROR record with the message of a failed one."""
    if getattr(_tls, "busy", False):
        return proceed(args, kwargs)
    _tls.busy = True
    try:
        result = proceed(args, kwargs)
    except Exception as e:
        err = _error_of(e, c_name, args, kwargs)
        if err is not None:
            extra = _extra(err.status, args)
            _log.info("function %s() called: %s", c_name, err.status_name, extra=extra)
            _log.error("function %s() failed: %s", c_name, err.message, extra=extra)
        raise
    finally:
        _tls.busy = False
    _log.info("function %s() called: %s", c_name, getErrorString(0), extra=_extra(0, args, result))
    return result


__all__ = ["API_LOGGER", "LIBRARY_LOGGER", "LEVEL_VARIABLES", "LEVEL_VARIABLE", "destination", "environment_mask", "log_api_calls",
           "follow_mask", "api_logging"]
