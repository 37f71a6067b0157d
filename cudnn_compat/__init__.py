"""cudnn-compat: cuDNN's legacy v7-style API on top of a graph layer.

Every legacy function is available under its C name (``cudnnConvolutionForward``)
and its CuPy 13 ``cupy.cuda.cudnn`` name (``convolutionForward``); enum values are
module constants with their C values.
"""
from __future__ import annotations

import importlib
import logging

from cudnn_compat._backend import config as _backend_config
from cudnn_compat._backend.plan_cache import CACHE as _CACHE
from cudnn_compat._backend.planner import CpuFallbackWarning  # noqa: F401 - a GPU call ran on the CPU (docs/not_supported.md)
from . import enums as _enums
from ._core.registry import LEGACY, exported
from .errors import STATUS, CuDNNArgumentError, CuDNNError, getErrorString  # noqa: F401

from ._version import __version__  # noqa: F401 - the one place it is written

# Family modules register their functions with ``_core.registry.legacy`` on import.
_FAMILIES = ["handle", "tensor", "tensor_ops", "convolution.descriptor", "convolution.api", "convolution.bias_act", "activation", "softmax",
             "pooling", "lrn", "batchnorm", "dropout", "rnn", "attention.descriptor", "attention.compute", "ctc", "spatial",
             "normalization", "fused_ops", "transform", "algorithm", "misc", "convolution.legacy", "graph_api.api"]
for _m in _FAMILIES:
    try:
        importlib.import_module(f"{__name__}.{_m}")
    except ModuleNotFoundError as _e:  # a family not written yet
        if _e.name != f"{__name__}.{_m}":
            raise

globals().update({k: v for k, v in vars(_enums).items() if k.isupper()})
globals().update({k: v for _vals in _enums.ENUMS.values() for k, v in _vals.items()})  # also CUDNN_DATA_INT8x4 & co.
globals().update(STATUS)
globals().update(exported())
from .cupy13.cupy_cudnn import c_spellings as _c_spellings  # noqa: E402 - CuPy 13 names, cudnn-prefixed (cudnnAddTensor_v3)
globals().update({k: v for k, v in _c_spellings().items() if k not in globals()})

from .cupy13.shim import install_cupy_shim, uninstall_cupy_shim  # noqa: E402,F401 - CuPy 13 cuDNN names under CuPy 14


def plan_cache_info():
    """(hits, misses, maxsize, currsize) of the plan cache."""
    return _CACHE.info()


def plan_cache_clear() -> None:
    """Empty the plan cache (the next call of each signature plans again) and what fuse() learned
    about the calls it deferred."""
    _CACHE.clear()
    from .tools import fuse as fusion
    fusion._LONE.clear()


def _configure_logging() -> None:
    """``CUDNN_COMPAT_LOG=info|debug|warning`` logs each new call signature's graph, the engines
    that declined it and why, and the config chosen (docs/tools.md "Explain")."""
    level = (_backend_config.get("CUDNN_COMPAT_LOG") or "").upper()
    if level:
        log = logging.getLogger("cudnn_compat")
        log.setLevel(getattr(logging, level, logging.INFO))
        if not [h for h in log.handlers if not isinstance(h, logging.NullHandler)]:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("cudnn_compat %(levelname)s: %(message)s"))
            log.addHandler(handler)


_backend_config.validate()  # every CUDNN_COMPAT_* value not understood warns now, once
_configure_logging()
from . import misc as _misc  # noqa: E402 - cuDNN's CUDNN_LOG{INFO,WARN,ERR}_DBG / CUDNN_LOGDEST_DBG
_misc.configure_from_environment()


def last_engine() -> "str | None":
    """The engine that ran the last legacy compute call on this thread (None before any)."""
    from ._core.call import last_plan
    plan = last_plan()
    return None if plan is None else plan.engine


# Record/replay and fusion across legacy calls (issue 9): ``cudnn_compat.trace(path)`` and
# ``cudnn_compat.fuse(handle)``; ``CUDNN_COMPAT_TRACE=path`` records the whole run.
from .tools import trace  # noqa: E402  (a callable module: trace(path, tensors=False) is its context manager)
from .tools.fuse import fuse  # noqa: E402,F401

trace.from_environment()
