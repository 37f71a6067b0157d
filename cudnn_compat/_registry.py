"""One implementation, two spellings: every legacy function is registered under its C
name (``cudnnConvolutionForward``) and CuPy 13's ``cupy.cuda.cudnn`` name
(``convolutionForward``).  The wrapper turns graph-layer errors into CuDNNError and
names the function in every error message."""
from __future__ import annotations

import functools

from _backend.ir import GraphError
from .errors import STATUS, CuDNNError

LEGACY: dict = {}  # C name -> function
CUPY_NAMES: dict = {}  # CuPy name -> C name


def cupy_name(c_name: str) -> str:
    base = c_name[len("cudnn"):]
    return base[0].lower() + base[1:]


def graph_error(e: GraphError, function: str = "") -> CuDNNError:
    return CuDNNError(STATUS["CUDNN_STATUS_" + e.status], f"graph check {e.check}", str(e), function)


# -- interception point (cudnn_compat/trace.py records calls, cudnn_compat/fusion.py flushes) --------
# HOOKS holds interceptors hook(proceed, c_name, args, kwargs) -> result; each calls proceed(args,
# kwargs) to go on.  Empty in normal use: the only cost is one truth test per call.
HOOKS: list = []


def _intercepted(i: int, c_name: str, fn, args, kwargs):
    if i == len(HOOKS):
        return fn(*args, **kwargs)
    return HOOKS[i](lambda a, k: _intercepted(i + 1, c_name, fn, a, k), c_name, args, kwargs)


def legacy(c_name: str, cupy: "str | None" = None):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                if HOOKS:
                    return _intercepted(0, c_name, fn, args, kwargs)
                return fn(*args, **kwargs)
            except CuDNNError as e:
                raise e.with_function(c_name) from None
            except GraphError as e:
                raise graph_error(e, c_name) from None
        wrapper.__name__ = c_name
        wrapper.c_name = c_name
        LEGACY[c_name] = wrapper
        CUPY_NAMES[cupy or cupy_name(c_name)] = c_name
        return wrapper
    return deco


def exported() -> dict:
    """All names, both spellings -> function."""
    out = dict(LEGACY)
    out.update({k: LEGACY[v] for k, v in CUPY_NAMES.items()})
    return out
