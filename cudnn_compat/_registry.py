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


def legacy(c_name: str, cupy: "str | None" = None):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
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
