import os
import shutil
from pathlib import Path

import numpy as np
import pytest

# Python subprocesses the tests start import this checkout's cudnn_compat, installed or not
# (``python -m pytest`` from the repository root imports it from there in-process too).
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join([_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def _build_steady() -> None:
    """The compiled steady path in this checkout, as an install builds it (setup.py; up to date: no
    work), so that the suite tests what an install runs; where it does not build, the Python twins run
    and tests/test_steady.py skips."""
    import subprocess
    import sys
    if os.environ.get("CUDNN_COMPAT_COMPILED") == "0" or not shutil.which(os.environ.get("CC", "gcc")):
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller built it before starting the workers: no
        return  # concurrent builds writing the same module in place
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=_ROOT, capture_output=True,
                   timeout=300)


_build_steady()
import cudnn_compat as cc  # noqa: E402
from cudnn_compat._core.place import gpu_reason  # noqa: E402


def gpu_machine() -> "str | None":
    """What says this machine has an NVIDIA GPU (the driver's device node or nvidia-smi), or None."""
    if os.path.exists("/dev/nvidia0"):
        return "/dev/nvidia0 exists"
    if shutil.which("nvidia-smi"):
        return "nvidia-smi is on PATH"
    return None


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests skip where there is no GPU; on a machine that has one but where CuPy cannot
    import or see it, they fail (a broken install must not pass a GPU run with exit 0)."""
    reason = gpu_reason()
    if reason:
        where = gpu_machine()
        mark = (pytest.mark.gpu_broken(reason=f"{where} but {reason}") if where
                else pytest.mark.skip(reason=f"gpu test: {reason}"))
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(mark)
    _skip_multigpu(items, reason)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu_broken(reason): set by conftest on a GPU machine whose CuPy is broken")


def pytest_runtest_setup(item):
    broken = item.get_closest_marker("gpu_broken")
    if broken is not None:
        pytest.fail(f"GPU machine ({broken.kwargs['reason']}): the GPU tests cannot run", pytrace=False)


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


@pytest.fixture(scope="session")
def legacy_cudnn():
    """``_backend.legacy_cudnn``, loaded: the real legacy libcudnn of GPU tests.  Skips only when
    libcudnn 9 is absent (``CudnnUnavailable``); anything else (a missing symbol, a wrong
    prototype) is an error that fails the test."""
    from cudnn_compat._backend import legacy_cudnn as L
    from cudnn_compat._backend.engines.cudnn_engine.lib import CudnnUnavailable
    try:
        L.load()
    except CudnnUnavailable as e:
        pytest.skip(f"the real libcudnn 9 is absent: {e}")
    return L


@pytest.fixture(scope="session")
def legacy_handle(legacy_cudnn):
    """A real cudnnHandle_t (``legacy_cudnn.Handle``) shared by the session."""
    h = legacy_cudnn.Handle()
    yield h
    h.destroy()


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
