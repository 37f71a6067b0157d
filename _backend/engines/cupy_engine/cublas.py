"""cuBLAS through ctypes: one handle per device (``Cublas``) and the strided-batched GEMM it runs
(``Gemm``), shared by the RNN programs (rnn.py, program.py) and the engine's matmuls (gemm.py)."""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

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


CUDA_R = {"float32": 0, "float64": 1, "float16": 2}
COMPUTE = {"float32": 68, "float64": 70, "tf32": 77}  # CUBLAS_COMPUTE_32F, _64F, _32F_FAST_TF32
CUBLAS_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20


class Cublas:
    """One cuBLAS handle per device through ctypes (the C API, independent of CuPy's bindings),
    with its own workspace so GEMMs can be captured into CUDA graphs."""

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
        self.handle = handle
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
        _check(lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(int(self.workspace.data.ptr)),
                                         ctypes.c_size_t(WORKSPACE_BYTES)), "cublasSetWorkspace")
        self.scalars = {(dt, v): (ctypes.c_double if dt == "float64" else ctypes.c_float)(v)
                        for dt in ("float32", "float64") for v in (0.0, 1.0)}

    def set_stream(self, stream_ptr: int) -> None:
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")

    def gemm(self, gm: Gemm, a: int, adt: str, b: int, bdt: str, c: int, cdt: str) -> None:
        sdt = "float64" if gm.compute == "float64" else "float32"
        st = self.lib.cublasGemmStridedBatchedEx(
            self.handle, int(gm.transa), int(gm.transb), gm.m, gm.n, gm.k, ctypes.byref(self.scalars[(sdt, 1.0)]),
            ctypes.c_void_p(a), CUDA_R[adt], gm.lda, ctypes.c_longlong(gm.sa),
            ctypes.c_void_p(b), CUDA_R[bdt], gm.ldb, ctypes.c_longlong(gm.sb),
            ctypes.byref(self.scalars[(sdt, float(gm.beta))]),
            ctypes.c_void_p(c), CUDA_R[cdt], gm.ldc, ctypes.c_longlong(gm.sc), gm.batch, COMPUTE[gm.compute],
            CUBLAS_GEMM_DEFAULT)
        _check(st, "cublasGemmStridedBatchedEx")


def _check(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


def _load_cublas():
    names = []
    try:
        from cuda import pathfinder
        loaded = pathfinder.load_nvidia_dynamic_lib("cublas")
        if getattr(loaded, "abs_path", None):
            names.append(loaded.abs_path)
    except Exception:  # not installed / not found: try the loader
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
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll,
                                               i, i, i]
    for fn in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2, lib.cublasGemmStridedBatchedEx):
        fn.restype = i
    return lib
