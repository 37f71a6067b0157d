"""The compiled steady path of a prepared call (issue 26 item 8): ``_steady.c``, an optional
extension module built by setup.py, and what its objects need from the running process.

Each object there has a Python twin, the same checks and launches in Python:

  ``_steady.Values``    the plan's values binder; twin: the source ``_core/fastbind.py`` generates
  ``_steady.Launcher``  a cupy plan's record launcher; twin: ``cupy_engine/records.FastPath.launcher``'s
                        closure (which it calls for what it does not do itself: the graph table)
  ``_steady.Replay``    a cudnn plan's replay of a captured call; twin: ``CudnnPlan.launch_py`` (which
                        it calls for everything else)
  ``_steady.Run``       ``_core.call.run``'s prepared-call part; twin: ``_core.call._run_py``
  ``_steady.Site``      a legacy function replaying its call sites' steady recipes; twin: the Python
                        wrapper itself (``_core/recipes.py``)

``module()`` is the extension, or None where it is not built or CUDNN_COMPAT_COMPILED=0: the twins
run then.  The launch function is cuLaunchKernel's address in the driver library CuPy loaded
(``launch_address``), and cuGraphLaunch's (``graph_launch_address``), so the extension links against
nothing but Python.
"""
from __future__ import annotations

import ctypes
import sys

from . import config

try:
    from . import _steady as _MODULE
    _NOT_BUILT = None
except ImportError as _e:  # not built (no C compiler at install, or a plain checkout): the Python twins run
    _MODULE, _NOT_BUILT = None, str(_e)

_LAUNCH: list = [None, None]  # cuLaunchKernel, cuGraphLaunch
_LIBCUDA: list = []


def libcuda() -> ctypes.CDLL:
    """The CUDA driver library through ctypes (opened once; CuPy has loaded it already): the launch
    addresses here and ``engines.graphs.Driver``'s graph queries."""
    if not _LIBCUDA:
        _LIBCUDA.append(ctypes.CDLL("libcuda.so.1"))
    return _LIBCUDA[0]


def module():
    """The extension module, or None (not built, or CUDNN_COMPAT_COMPILED=0)."""
    if _MODULE is None or not config.get("CUDNN_COMPAT_COMPILED"):
        return None
    return _MODULE


def bump() -> None:
    """Make every compiled replay's resolved prepared call (``_steady.c`` Settled) stale: called after
    each change of the prepared-call tables (``_core.call``), so that a replay looks its call up again."""
    if _MODULE is not None:
        _MODULE.bump()


def status() -> dict:
    """{"built", "used", "reason"}: whether the extension is built and used, and why not (the doctor's
    "compiled path" line)."""
    if _MODULE is None:
        return {"built": False, "used": False,
                "reason": f"not built ({_NOT_BUILT}); the Python twins run (a C compiler at install builds it)"}
    if module() is None:
        return {"built": True, "used": False, "reason": "CUDNN_COMPAT_COMPILED=0: the Python twins run"}
    return {"built": True, "used": True, "reason": None}


def graph_launch_address(runtime) -> "int | None":
    """cuGraphLaunch's address in the CUDA driver library when ``runtime``, the one CUDA graphs are
    made and launched with (``engines.graphs.Graphs.runtime()``), is CuPy's (``cupy.cuda.runtime``:
    a graphExec it instantiates is the driver's CUgraphExec); None for anything else (a test's
    stand-in: the Python twin then calls its ``graphLaunch``)."""
    if runtime is None or runtime is not sys.modules.get("cupy_backends.cuda.api.runtime"):
        return None
    if _LAUNCH[1] is None:
        _LAUNCH[1] = ctypes.cast(libcuda().cuGraphLaunch, ctypes.c_void_p).value
    return _LAUNCH[1]


def launch_address(launch) -> "int | None":
    """cuLaunchKernel's address in the CUDA driver library (loaded already by CuPy) when ``launch``,
    the function the cupy engine launches through (``runtime.launcher()``), is CuPy's own binding of
    it; None for anything else (a test's stand-in: the Python twin then calls that)."""
    driver = sys.modules.get("cupy_backends.cuda.api.driver")
    if driver is None or launch is not getattr(driver, "launchKernel", None):
        return None
    if _LAUNCH[0] is None:
        _LAUNCH[0] = ctypes.cast(libcuda().cuLaunchKernel, ctypes.c_void_p).value
    return _LAUNCH[0]
