"""cuBLAS through its C API (ctypes): one handle per device (``Cublas``) and the strided-batched
GEMM it runs (``Gemm``), shared by the RNN programs (rnn.py, program.py) and the engine's matmuls
(gemm.py).

Not through CuPy's bindings (``cupy_backends.cuda.libs.cublas``, issue 23 item 10 asked for them):
the RNN programs capture their GEMMs into CUDA graphs (program.py), which cuBLAS supports and
CuPy's bindings refuse.  Every CuPy cuBLAS wrapper, ``gemmStridedBatchedEx`` included, first calls
CuPy's ``setStream`` with CuPy's current stream, and that ``setStream`` raises
``NotImplementedError('calling cuBLAS API during stream capture is currently unsupported')``
whenever the stream is capturing (cublas.pyx, CuPy 13.0 to 15.0a1); CuPy also binds no
``cublasSetWorkspace``, through which the handle gets the workspace its captured GEMMs use.  Five
C functions are bound here, on a handle of the engine's own (its stream, set per call, and its
workspace must not change what CuPy's calls on CuPy's handle see).
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from . import runtime


@dataclass
class Gemm:
    """cuBLAS column-major C = op(A) op(B) (+ beta C), batched with element strides.
    Operands are (buffer, element offset); dtypes are IR names; ``compute`` 'float32' |
    'float64' | 'tf32'."""

    transa: bool
    transb: bool
    m: int
    n: int
    k: int
    a: tuple
    lda: int
    sa: int
    b: tuple
    ldb: int
    sb: int
    c: tuple
    ldc: int
    sc: int
    batch: int
    beta: float
    compute: str


CUDA_R = {"float32": 0, "float64": 1, "float16": 2}  # cudaDataType_t
COMPUTE = {"float32": 68, "float64": 70, "tf32": 77}  # CUBLAS_COMPUTE_32F, _64F, _32F_FAST_TF32
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_DEFAULT_MATH = 0  # the precision is the compute type's alone (no TF32 unless COMPUTE says so)
WORKSPACE_BYTES = 32 << 20


class Cublas:
    """One cuBLAS handle per device, with its own workspace so GEMMs can be captured into CUDA
    graphs; ``set_stream`` then ``gemm`` (callers hold gemm._LOCK: the handle is shared)."""

    _lock = threading.Lock()
    _by_device: dict = {}
    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            cls._lib = _load_cublas()
        return cls._lib

    @classmethod
    def get(cls) -> "Cublas":
        cp = runtime.cupy()
        dev = cp.cuda.runtime.getDevice()
        with cls._lock:
            h = cls._by_device.get(dev)
            if h is None:
                h = cls._by_device[dev] = Cublas(cls.lib())
        return h

    def __init__(self, lib):
        cp = runtime.cupy()
        self.lib = lib
        handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = int(handle.value or 0)
        _check(lib.cublasSetMathMode(self.handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode")
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
        _check(lib.cublasSetWorkspace_v2(self.handle, int(self.workspace.data.ptr), WORKSPACE_BYTES),
               "cublasSetWorkspace")
        # alpha/beta by host pointer (CUBLAS_POINTER_MODE_HOST, the default): the arrays kept alive here
        self._scalar_arrays = [np.full((), v, dtype=dt) for dt in ("float32", "float64") for v in (0.0, 1.0)]
        self.scalars = {(str(a.dtype), float(a)): int(a.ctypes.data) for a in self._scalar_arrays}

    def set_stream(self, stream_ptr: int) -> None:
        """The stream of the calls that follow (no check of its capture state: capture allowed)."""
        _check(self.lib.cublasSetStream_v2(self.handle, int(stream_ptr)), "cublasSetStream")

    def gemm(self, gm: Gemm, a: int, adt: str, b: int, bdt: str, c: int, cdt: str) -> None:
        sdt = "float64" if gm.compute == "float64" else "float32"
        st = self.lib.cublasGemmStridedBatchedEx(
            self.handle, int(gm.transa), int(gm.transb), gm.m, gm.n, gm.k, self.scalars[(sdt, 1.0)],
            int(a), CUDA_R[adt], gm.lda, gm.sa, int(b), CUDA_R[bdt], gm.ldb, gm.sb,
            self.scalars[(sdt, float(gm.beta))], int(c), CUDA_R[cdt], gm.ldc, gm.sc, gm.batch,
            COMPUTE[gm.compute], CUBLAS_GEMM_DEFAULT)
        _check(st, "cublasGemmStridedBatchedEx")


def _check(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


def _load_cublas():
    """libcublas with the argument types of the functions the engine calls."""
    names = []
    try:
        from cuda import pathfinder
        loaded = pathfinder.load_nvidia_dynamic_lib("cublas")
        if getattr(loaded, "abs_path", None):
            names.append(loaded.abs_path)
    except Exception:  # noqa: BLE001 - not installed / not found: try the loader
        pass
    names += ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    errors = []
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            errors.append(f"{name}: {e}")
    else:
        raise RuntimeError("libcublas not found (" + "; ".join(errors) + ")")
    vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    for fn, args in (("cublasCreate_v2", [ctypes.POINTER(vp)]), ("cublasSetMathMode", [vp, i]),
                     ("cublasSetStream_v2", [vp, vp]), ("cublasSetWorkspace_v2", [vp, vp, ctypes.c_size_t]),
                     ("cublasGemmStridedBatchedEx", [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i,
                                                     i, ll, i, i, i])):
        f = getattr(lib, fn)
        f.argtypes, f.restype = args, i
    return lib
