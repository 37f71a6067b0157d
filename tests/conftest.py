import os
from pathlib import Path

import numpy as np
import pytest

# Python subprocesses the tests start import this checkout's cudnn_compat, installed or not
# (``python -m pytest`` from the repository root imports it from there in-process too).
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join([_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

import cudnn_compat as cc
from cudnn_compat._core.place import gpu_reason


def pytest_collection_modifyitems(config, items):
    reason = gpu_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"gpu test: {reason}")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    _skip_multigpu(items, reason)


def _skip_multigpu(items, reason) -> None:
    """``multigpu`` tests need 2 or more CUDA devices (issue 17): skipped with fewer."""
    marked = [item for item in items if "multigpu" in item.keywords]
    if not marked:
        return
    if reason is None:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
        reason = None if n >= 2 else f"{n} CUDA device(s) visible"
    if reason:
        skip = pytest.mark.skip(reason=f"multigpu test (needs 2 GPUs): {reason}")
        for item in marked:
            item.add_marker(skip)


@pytest.fixture
def handle():
    """A CPU-place handle (the reference engine)."""
    h = cc.cudnnCreate("cpu")
    yield h
    cc.cudnnDestroy(h)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def tdesc(shape, dtype=None, fmt=None, strides=None):
    """A tensor descriptor for a logical N,C,... shape: packed NCHW, NHWC via ``fmt``, or explicit strides."""
    dtype = cc.CUDNN_DATA_FLOAT if dtype is None else dtype
    d = cc.cudnnCreateTensorDescriptor()
    if strides is not None:
        cc.cudnnSetTensorNdDescriptor(d, dtype, len(shape), list(shape), list(strides))
    else:
        cc.cudnnSetTensorNdDescriptorEx(d, cc.CUDNN_TENSOR_NCHW if fmt is None else fmt, dtype, len(shape), list(shape))
    return d
