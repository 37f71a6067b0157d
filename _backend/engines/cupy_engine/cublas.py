"""cuBLAS through CuPy's bindings (``cupy_backends.cuda.libs.cublas``, imported as
``cupy.cuda.cublas``): one handle per device (``Cublas``) and the strided-batched GEMM it runs
(``Gemm``), shared by the RNN programs (rnn.py, program.py) and the engine's matmuls (gemm.py).

The handle is the engine's own (``cublas.create()``), not CuPy's shared one
(``cupy.cuda.device.get_cublas_handle()``): the engine sets its stream and a workspace of its own
(``setWorkspace``: CUDA-graph capture of the GEMMs), which must not change what CuPy's own calls on
that handle see.  CuPy's GEMM wrappers set the handle's stream to CuPy's current stream before each
call once any stream has been made current, so ``Cublas.on_stream`` makes the engine's stream
CuPy's current one for the calls it runs.
"""
from __future__ import annotations

import contextlib
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
FUNCTIONS = ("create", "setStream", "setMathMode", "gemmStridedBatchedEx")  # what the engine needs of CuPy


def bindings():
    """CuPy's cuBLAS module; RuntimeError naming what is missing when this CuPy lacks a function
    the engine calls (``setWorkspace`` is optional: without it cuBLAS uses its own pool)."""
    from cupy_backends.cuda.libs import cublas
    missing = [f for f in FUNCTIONS if not hasattr(cublas, f)]
    if missing:
        raise RuntimeError(f"CuPy's cuBLAS bindings lack {', '.join(missing)} (CuPy >= 13 has them)")
    return cublas


class Cublas:
    """One cuBLAS handle per device, made and driven through CuPy's bindings, with its own
    workspace so GEMMs can be captured into CUDA graphs."""

    _lock = threading.Lock()
    _by_device: dict = {}

    @classmethod
    def lib(cls):
        return bindings()

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
        self.handle = lib.create()
        lib.setMathMode(self.handle, CUBLAS_DEFAULT_MATH)
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
        if hasattr(lib, "setWorkspace"):
            lib.setWorkspace(self.handle, int(self.workspace.data.ptr), WORKSPACE_BYTES)
        # alpha/beta by host pointer (CUBLAS_POINTER_MODE_HOST, the default): kept alive here
        self.scalars = {(dt, v): np.full((), v, dtype=dt) for dt in ("float32", "float64") for v in (0.0, 1.0)}
        self.stream_ptr = None

    def set_stream(self, stream_ptr: int) -> None:
        self.lib.setStream(self.handle, int(stream_ptr))
        self.stream_ptr = int(stream_ptr)

    @contextlib.contextmanager
    def on_stream(self, stream_ptr: int):
        """The handle on ``stream_ptr`` for the calls inside, which also run with it as CuPy's
        current stream (CuPy's wrappers would otherwise move the handle to theirs)."""
        cp = runtime.cupy()
        self.set_stream(stream_ptr)
        if int(cp.cuda.get_current_stream().ptr) == int(stream_ptr):
            yield self
        else:
            with cp.cuda.ExternalStream(int(stream_ptr)):
                yield self

    def gemm(self, gm: Gemm, a: int, adt: str, b: int, bdt: str, c: int, cdt: str) -> None:
        sdt = "float64" if gm.compute == "float64" else "float32"
        alpha, beta = self.scalars[(sdt, 1.0)], self.scalars[(sdt, float(gm.beta))]
        self.lib.gemmStridedBatchedEx(
            self.handle, int(gm.transa), int(gm.transb), gm.m, gm.n, gm.k, alpha.ctypes.data,
            int(a), CUDA_R[adt], gm.lda, gm.sa, int(b), CUDA_R[bdt], gm.ldb, gm.sb,
            beta.ctypes.data, int(c), CUDA_R[cdt], gm.ldc, gm.sc, gm.batch, COMPUTE[gm.compute],
            CUBLAS_GEMM_DEFAULT)
