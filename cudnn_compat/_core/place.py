"""Where a handle runs: 'gpu' (current CUDA device through CuPy) or 'cpu' (the NumPy
reference engine).  ``CUDNN_COMPAT_DEVICE=cpu|gpu`` overrides the automatic choice."""
from __future__ import annotations

import functools

from cudnn_compat._backend import config as _config


@functools.lru_cache(maxsize=None)
def gpu_reason() -> "str | None":
    """None when CuPy sees a CUDA device, else why not."""
    try:
        import cupy
    except Exception as e:  # ImportError or a broken CUDA install
        return f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"no CUDA device ({type(e).__name__}: {e})"
    return None if n > 0 else "no CUDA device"


def default_place() -> str:
    want = _config.get("CUDNN_COMPAT_DEVICE") or ""
    if want in ("cpu", "gpu"):
        return want
    return "gpu" if gpu_reason() is None else "cpu"
