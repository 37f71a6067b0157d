"""The cupy engine's cuBLAS calls go through CuPy's bindings (issue 23 item 10;
_backend/engines/cupy_engine/cublas.py).  On the CPU, a stand-in for
``cupy_backends.cuda.libs.cublas`` with the signatures of CuPy's cublas.pyx (create, setStream,
setMathMode, setWorkspace, gemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype,
lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType,
algo), alpha/beta as host pointers) computes each GEMM with NumPy on host memory: the engine's
products (gemm_calls, every broadcast and transposed layout) must equal np.matmul."""
from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from cudnn_compat._backend.engines.cupy_engine import cublas, gemm, runtime

DTYPE = {0: np.float32, 1: np.float64, 2: np.float16}  # cudaDataType_t
SCALAR = {68: np.float32, 77: np.float32, 70: np.float64}  # the compute type's scalar type


def _mat(ptr, dt, rows, cols, ld):
    n = (cols - 1) * ld + rows
    arr = np.frombuffer((ctypes.c_char * (n * dt.itemsize)).from_address(ptr), dtype=dt, count=n)
    return np.lib.stride_tricks.as_strided(arr, (rows, cols), (dt.itemsize, ld * dt.itemsize))


class FakeCublas(types.ModuleType):
    def __init__(self):
        super().__init__("cupy_backends.cuda.libs.cublas")
        self.log = []

    def create(self):
        self.log.append(("create",))
        return 0xB1A5

    def setMathMode(self, handle, mode):
        self.log.append(("setMathMode", handle, mode))

    def setWorkspace(self, handle, workspace, size):
        self.log.append(("setWorkspace", handle, workspace, size))

    def setStream(self, handle, stream):
        self.log.append(("setStream", handle, stream))

    def gemmStridedBatchedEx(self, handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                             strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
        assert handle == 0xB1A5 and algo == -1 and all(isinstance(v, int) for v in (alpha, beta, A, B, C))
        self.log.append(("gemm", computeType))
        st = np.dtype(SCALAR[computeType])
        al = np.frombuffer((ctypes.c_char * st.itemsize).from_address(alpha), st)[0]
        be = np.frombuffer((ctypes.c_char * st.itemsize).from_address(beta), st)[0]
        ta, tb, tc = (np.dtype(DTYPE[t]) for t in (Atype, Btype, Ctype))
        for q in range(batchCount):
            a = _mat(A + q * strideA * ta.itemsize, ta, k if transa else m, m if transa else k, lda)
            b = _mat(B + q * strideB * tb.itemsize, tb, n if transb else k, k if transb else n, ldb)
            c = _mat(C + q * strideC * tc.itemsize, tc, m, n, ldc)
            res = al * ((a.T if transa else a).astype(np.float64) @ (b.T if transb else b).astype(np.float64))
            c[...] = (res + (be * c.astype(np.float64) if be else 0)).astype(tc)


class _Data:
    def __init__(self, ptr):
        self.ptr = ptr


class _Buf:
    def __init__(self, arr):
        self.arr, self.data = arr, _Data(arr.ctypes.data)


@pytest.fixture
def fake(monkeypatch):
    lib = FakeCublas()
    names = ("cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs")
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, lib.__name__, lib)
    sys.modules["cupy_backends.cuda.libs"].cublas = lib
    current = {"ptr": 7}

    class External:
        def __init__(self, ptr):
            self.ptr = ptr

        def __enter__(self):
            lib.log.append(("enter", self.ptr))
            self.saved, current["ptr"] = current["ptr"], self.ptr

        def __exit__(self, *a):
            current["ptr"] = self.saved
            lib.log.append(("exit", self.ptr))
    cp = types.SimpleNamespace(
        uint8=np.uint8, empty=lambda n, dtype: _Buf(np.empty(n, dtype)),
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0), ExternalStream=External,
                                   get_current_stream=lambda: types.SimpleNamespace(ptr=current["ptr"])))
    monkeypatch.setattr(runtime, "cupy", lambda: cp)
    monkeypatch.setattr(cublas.Cublas, "_by_device", {})
    lib.current = current
    return lib


def test_the_handle_is_made_and_set_up_through_cupy(fake):
    h = cublas.Cublas.get()
    assert cublas.Cublas.get() is h and h.lib is fake
    assert fake.log == [("create",), ("setMathMode", 0xB1A5, cublas.CUBLAS_DEFAULT_MATH),
                        ("setWorkspace", 0xB1A5, h.workspace.data.ptr, cublas.WORKSPACE_BYTES)]


def test_a_cupy_without_a_function_is_named(fake):
    del FakeCublas.gemmStridedBatchedEx
    try:
        with pytest.raises(RuntimeError, match="lack gemmStridedBatchedEx"):
            cublas.bindings()
    finally:
        FakeCublas.gemmStridedBatchedEx = _GEMM


_GEMM = FakeCublas.gemmStridedBatchedEx


def test_on_stream_makes_the_stream_cupys_current_one(fake):
    h = cublas.Cublas.get()
    del fake.log[:]
    with h.on_stream(7):  # already CuPy's current stream
        pass
    assert fake.log == [("setStream", 0xB1A5, 7)]
    del fake.log[:]
    with h.on_stream(9):  # another stream: CuPy's wrappers would move the handle to theirs
        assert fake.current["ptr"] == 9
    assert fake.log == [("setStream", 0xB1A5, 9), ("enter", 9), ("exit", 9)] and fake.current["ptr"] == 7


CASES = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (1, 3, 4, 2)),
         ((5, 1), (1, 6)), ((1, 7), (7, 1))]


@pytest.mark.parametrize("dtype, compute", [(np.float32, "float32"), (np.float32, "tf32"), (np.float64, "float64"),
                                            (np.float16, "float32")])
@pytest.mark.parametrize("a_shape, b_shape", CASES)
@pytest.mark.parametrize("transposed", [False, True])
def test_products_through_the_bindings_equal_numpy(fake, dtype, compute, a_shape, b_shape, transposed):
    rng = np.random.default_rng(len(a_shape) * 10 + len(b_shape))
    a = rng.standard_normal(a_shape).astype(dtype)
    b = rng.standard_normal(b_shape).astype(dtype)
    if transposed:  # a column-major operand: no copy, a transposed GEMM
        a = np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2)
    sa, sb = (tuple(s // x.itemsize for s in x.strides) for x in (a, b))
    c_shape, calls = gemm.gemm_calls(a.shape, sa, b.shape, sb, compute)
    c = np.full(c_shape, np.nan, dtype)
    base = {"A": a.ctypes.data, "B": b.ctypes.data, "C": c.ctypes.data}
    h = cublas.Cublas.get()
    dt = {np.float32: "float32", np.float64: "float64", np.float16: "float16"}[dtype]
    isz = a.itemsize
    with h.on_stream(7):
        for gm in calls:
            h.gemm(gm, base[gm.a[0]] + gm.a[1] * isz, dt, base[gm.b[0]] + gm.b[1] * isz, dt,
                   base[gm.c[0]] + gm.c[1] * isz, dt)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    tol = 1e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(c.astype(np.float64), want, rtol=tol, atol=tol)
    assert [e[1] for e in fake.log if e[0] == "gemm"] == [cublas.COMPUTE[compute]] * len(calls)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_beta_accumulates_and_zero_overwrites(fake, beta):
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(12, dtype=np.float32).reshape(3, 4)
    c0 = np.full((2, 4), 5.0, np.float32)
    c = c0.copy()
    # row-major C = A @ B as column-major C^T = B^T A^T: cuBLAS 'a' is B (4x3, ld 4), 'b' is A (3x2, ld 3)
    gm = cublas.Gemm(False, False, 4, 2, 3, ("B", 0), 4, 0, ("A", 0), 3, 0, ("C", 0), 4, 0, 1, beta, "float32")
    h = cublas.Cublas.get()
    h.gemm(gm, b.ctypes.data, "float32", a.ctypes.data, "float32", c.ctypes.data, "float32")
    np.testing.assert_array_equal(c, a @ b + beta * c0)
