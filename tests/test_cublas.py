"""The cupy engine's cuBLAS calls (cudnn_compat/_backend/engines/cupy_engine/cublas.py) and the capture of the
RNN programs' GEMMs into CUDA graphs (program.py), on the CPU with stand-ins.

``FakeLib`` stands in for libcublas's C functions as the engine binds them (cublasCreate_v2,
cublasSetMathMode, cublasSetWorkspace_v2, cublasSetStream_v2, cublasGemmStridedBatchedEx with
alpha/beta as host pointers) and computes each GEMM with NumPy on host memory, or, on a stream
that is capturing, records it into that stream's graph as cuBLAS does.  A stand-in of CuPy's own
cuBLAS module refuses any call on a capturing stream, as CuPy's cublas.pyx ``setStream`` does
(NotImplementedError): the engine must not go through it, or no RNN graph is ever captured."""
from __future__ import annotations

import ctypes
import logging
import sys
import types

import numpy as np
import pytest

from cudnn_compat._backend.engines.cupy_engine import cublas, gemm, program, runtime
from cudnn_compat._backend.engines import graphs

DTYPE = {0: np.float32, 1: np.float64, 2: np.float16}  # cudaDataType_t
SCALAR = {68: np.float32, 77: np.float32, 70: np.float64}  # the compute type's scalar type
HANDLE = 0xB1A5


def _mat(ptr, dt, rows, cols, ld):
    n = (cols - 1) * ld + rows
    arr = np.frombuffer((ctypes.c_char * (n * dt.itemsize)).from_address(ptr), dtype=dt, count=n)
    return np.lib.stride_tricks.as_strided(arr, (rows, cols), (dt.itemsize, ld * dt.itemsize))


def _gemm_now(transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc,
              strideC, batchCount, computeType):
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


class FakeLib:
    """libcublas as ctypes calls it (plain ints for pointers and handles; status 0 = success)."""

    def __init__(self, streams):
        self.log, self.streams, self.stream, self.fail = [], streams, 0, {}

    def cublasCreate_v2(self, out):
        out._obj.value = HANDLE
        self.log.append(("create",))
        return 0

    def cublasSetMathMode(self, handle, mode):
        self.log.append(("setMathMode", handle, mode))
        return 0

    def cublasSetWorkspace_v2(self, handle, ptr, size):
        self.log.append(("setWorkspace", handle, ptr, size))
        return 0

    def cublasSetStream_v2(self, handle, stream):
        assert handle == HANDLE
        self.log.append(("setStream", stream))
        self.stream = stream
        return self.fail.get("setStream", 0)

    def cublasGemmStridedBatchedEx(self, handle, *args):
        assert handle == HANDLE and args[-1] == -1 and all(type(v) is int for v in args)
        self.log.append(("gemm", args[-2]))
        s = self.streams.get(self.stream)
        if s is not None and s.capturing is not None:  # captured: runs when the graph launches
            if self.fail.get("gemm in capture"):
                return self.fail["gemm in capture"]
            s.capturing.append(lambda: _gemm_now(*args[:-1]))
        else:
            _gemm_now(*args[:-1])
        return 0


class _Data:
    def __init__(self, ptr):
        self.ptr = ptr


class _Buf:
    def __init__(self, arr):
        self.arr, self.data = arr, _Data(arr.ctypes.data)


class FakeCupy:
    """What the engine's cuBLAS and ProgramRun use of CuPy: the current stream, Stream (a context
    manager that makes it current; begin_capture/end_capture -> a graph whose launch runs what was
    captured), empty, asarray."""

    def __init__(self):
        fake = self
        self.current, self.streams, self.launches = 7, {}, 0

        class Stream:
            def __init__(self, non_blocking=False):
                self.ptr, self.capturing = 0x5000 + len(fake.streams), None
                fake.streams[self.ptr] = self

            def __enter__(self):
                self.saved, fake.current = fake.current, self.ptr
                return self

            def __exit__(self, *a):
                fake.current = self.saved

            def begin_capture(self):
                self.capturing = []

            def end_capture(self):
                nodes, self.capturing = self.capturing, None
                return types.SimpleNamespace(nodes=nodes, launch=lambda stream: fake.replay(nodes))

        class ExternalStream(Stream):
            def __init__(self, ptr):
                self.ptr = ptr

        self.uint8 = np.uint8
        self.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0), Stream=Stream,
                                          ExternalStream=ExternalStream,
                                          get_current_stream=lambda: types.SimpleNamespace(ptr=self.current))
        self.graphs = {}  # graphExec -> the nodes captured

    def runtime(self):
        """cupy.cuda.runtime's capture and graph calls over these streams (for engines.graphs.Graphs)."""
        fake = self

        def end(ptr):
            nodes, fake.streams[ptr].capturing = fake.streams[ptr].capturing, None
            fake.graphs[len(fake.graphs) + 1] = nodes
            return len(fake.graphs)
        return types.SimpleNamespace(
            streamBeginCapture=lambda ptr: setattr(fake.streams[ptr], "capturing", []), streamEndCapture=end,
            graphInstantiate=lambda g: g, graphDestroy=lambda g: None, graphExecDestroy=lambda g: None,
            graphLaunch=lambda exe, stream: fake.replay(fake.graphs[exe]),
            streamIsCapturing=lambda ptr: ptr in fake.streams and fake.streams[ptr].capturing is not None)

    def replay(self, nodes):
        self.launches += 1
        for f in nodes:
            f()

    def empty(self, n, dtype):
        return _Buf(np.empty(n, dtype))

    def asarray(self, v):
        return _Buf(np.ascontiguousarray(v))


def _refusing_cupy_cublas(cp):
    """CuPy's cuBLAS module as its cublas.pyx behaves: each wrapper sets the handle's stream to
    CuPy's current one first, refused while that stream is capturing."""
    mod = types.ModuleType("cupy_backends.cuda.libs.cublas")

    def setStream(handle, stream):
        s = cp.streams.get(stream)
        if s is not None and s.capturing is not None:
            raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")

    def gemmStridedBatchedEx(handle, *args):
        setStream(handle, cp.current)
        _gemm_now(*args[:-1])
    mod.create, mod.setStream, mod.gemmStridedBatchedEx = (lambda: HANDLE), setStream, gemmStridedBatchedEx
    mod.setMathMode = lambda handle, mode: None
    return mod


@pytest.fixture
def fake(monkeypatch):
    cp = FakeCupy()
    lib = FakeLib(cp.streams)
    for name in ("cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.cublas", _refusing_cupy_cublas(cp))
    monkeypatch.setattr(runtime, "cupy", lambda: cp)
    from cudnn_compat._backend.engines import base
    monkeypatch.setattr(base, "STREAM_PTR", [lambda: cp.current])  # a call's stream when its handle has none
    cap = cp.cuda.Stream()  # the side stream captures run on (engines.graphs)
    monkeypatch.setattr(graphs, "GRAPHS", [graphs.Graphs(runtime=cp.runtime(), stream=lambda device: cap.ptr)])
    monkeypatch.setattr(cublas.Cublas, "_by_device", {})
    monkeypatch.setattr(cublas.Cublas, "_lib", lib)
    lib.cp = cp
    return lib


def test_the_handle_is_made_with_its_own_workspace(fake):
    h = cublas.Cublas.get()
    assert cublas.Cublas.get() is h and h.lib is fake and h.handle == HANDLE
    assert fake.log == [("create",), ("setMathMode", HANDLE, cublas.CUBLAS_DEFAULT_MATH),
                        ("setWorkspace", HANDLE, h.workspace.data.ptr, cublas.WORKSPACE_BYTES)]


def test_a_failed_call_names_the_function_and_status(fake):
    h = cublas.Cublas.get()
    fake.fail["setStream"] = 7
    with pytest.raises(RuntimeError, match="cublasSetStream failed with cuBLAS status 7"):
        h.set_stream(9)


CASES = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (1, 3, 4, 2)),
         ((5, 1), (1, 6)), ((1, 7), (7, 1))]


@pytest.mark.parametrize("dtype, compute", [(np.float32, "float32"), (np.float32, "tf32"), (np.float64, "float64"),
                                            (np.float16, "float32")])
@pytest.mark.parametrize("a_shape, b_shape", CASES)
@pytest.mark.parametrize("transposed", [False, True])
def test_products_equal_numpy(fake, dtype, compute, a_shape, b_shape, transposed):
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
    h.set_stream(7)
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


# -- ProgramRun: eager, then captured, then replayed ---------------------------------------------------

class _T:
    def __init__(self, uid):
        self.uid, self.is_by_value = uid, False


def _two_gemm_program():
    """y = (x @ w1) @ w2 (row-major, 3x4 @ 4x5 @ 5x2) through a scratch buffer: two GEMMs."""
    g1 = cublas.Gemm(False, False, 5, 3, 4, ("w1", 0), 5, 0, ("x", 0), 4, 0, ("t", 0), 5, 0, 1, 0.0, "float32")
    g2 = cublas.Gemm(False, False, 2, 3, 5, ("w2", 0), 2, 0, ("t", 0), 5, 0, ("y", 0), 2, 0, 1, 0.0, "float32")
    roles = {"x": _T(1), "w1": _T(2), "w2": _T(3), "y": _T(4)}
    prog = program.Program(buffers={"x": "float32", "w1": "float32", "w2": "float32", "y": "float32",
                                    "t": "float32"}, scratch={"t": 15}, consts={}, roles=roles, scalars=(),
                           instrs=[g1, g2])
    op = types.SimpleNamespace(kind="RNN_FORWARD", inputs={r: roles[r] for r in ("x", "w1", "w2")},
                               outputs={"y": roles["y"]})
    return prog, op


def _run_three_times(monkeypatch, rng):
    monkeypatch.setattr(program, "_graphs_enabled", lambda: True)
    prog, op = _two_gemm_program()
    run = program.ProgramRun(prog, op)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (4, 5), (5, 2)))
    y = np.empty((3, 2), np.float32)
    env = {1: x.ctypes.data, 2: w1.ctypes.data, 3: w2.ctypes.data, 4: y.ctypes.data}
    got = []
    for _ in range(3):
        y[...] = np.nan
        x[...] = rng.standard_normal(x.shape)  # new contents, same memory: a replay reads them
        run.run(env, None)
        got.append((y.copy(), (x.astype(np.float64) @ w1) @ w2))
    run.test_buffers = (x, w1, w2, y)  # alive while the graph's addresses may be launched
    return run, got


def test_the_second_run_is_captured_and_the_third_replays(fake, monkeypatch):
    run, got = _run_three_times(monkeypatch, np.random.default_rng(5))
    for y, want in got:
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    (entry,) = run.cache.values()
    assert entry.graph > 0 and len(fake.cp.graphs[entry.graph]) == 2, "no CUDA graph was captured"
    assert fake.cp.launches == 2  # calls 2 (just captured) and 3 launched the graph
    cap = next(iter(fake.cp.streams))
    assert [e for e in fake.log if e[0] == "setStream"] == [("setStream", 7), ("setStream", cap)]


@pytest.mark.parametrize("form", ["twin", "compiled"])
def test_the_launcher_replays_captured_calls_and_never_a_dropped_graph(fake, monkeypatch, form):
    """``ProgramRun.launcher``: a call whose graph was captured (same addresses, scalars, stream)
    launches it, numbers as computed eagerly; other addresses, a stream being captured, or an
    unhashable value decline (nothing launched).  ``compiled``: the launcher is the extension's
    ``Replay`` (graphs.replay_launcher over the recording graph-launch stub, as cuGraphLaunch's
    address on a GPU); its table, filled by the twin's first launch, takes the next calls, and is
    emptied before a graph is destroyed (the LRU's eviction, ``release``)."""
    from cudnn_compat._backend import steady as steady_mod
    ext = steady_mod.module()
    gr = graphs.graphs()
    if form == "compiled":
        if ext is None:
            pytest.skip("the compiled steady path is not built")
        monkeypatch.setattr(gr, "launch_address", lambda: ext.graph_stub(), raising=False)
        monkeypatch.setattr(gr, "error_type", lambda: RuntimeError, raising=False)
    run, got = _run_three_times(monkeypatch, np.random.default_rng(7))
    (entry,) = run.cache.values()
    launch = run.launcher((1, 2, 3, 4))
    assert (type(launch) is ext.Replay) == (form == "compiled")
    sptr, addrs, _scalars = next(iter(run.cache))
    env = {u: a for (_role, u), a in zip(run.roles()[0], addrs)}  # the addresses captured with, by uid
    assert sptr == 7 and sorted(env) == [1, 2, 3, 4]
    values = tuple(env[u] for u in (1, 2, 3, 4))
    stubbed = (lambda: [(f, s) for f, _g, _b, _shm, s, _a in ext.stub_calls()]) if form == "compiled" else list
    before = fake.cp.launches
    assert launch(values, None)  # the twin: the graph, and (compiled) its table entry
    assert fake.cp.launches == before + 1 and run.stats["graph_launches"] == 1
    for _ in range(3):
        assert launch(values, None)
    if form == "compiled":  # from the table: the stub's launches of that graph on the current stream
        assert stubbed() == [(entry.graph, 7)] * 3 and fake.cp.launches == before + 1
        assert run.stats["graph_launches"] == 4
    else:
        assert fake.cp.launches == before + 4
    n = fake.cp.launches + len(stubbed())
    assert not launch((values[0] + 4,) + values[1:], None)  # another x: no graph for it
    assert not launch(values[:3] + ([values[3]],), None)  # an unhashable value
    cap = fake.cp.cuda.Stream()
    cap.begin_capture()  # the caller capturing that stream: declined (its execute goes into that capture)
    assert not launch(values, cap.ptr)
    assert fake.cp.launches + len(stubbed()) == n
    # evicted graphs empty the table first: a dropped graph is never launched again
    run.release()
    assert entry.graph == -1 and not launch(values, None)
    assert fake.cp.launches + len(stubbed()) == n
    x, w1, w2, y = run.test_buffers  # the launches computed y from x as it was last
    np.testing.assert_allclose(y, (x.astype(np.float64) @ w1) @ w2, rtol=1e-5, atol=1e-5)
    for y, want in got:
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_a_failed_capture_is_logged_and_the_run_stays_eager(fake, monkeypatch, caplog):
    fake.fail["gemm in capture"] = 14  # CUBLAS_STATUS_INTERNAL_ERROR
    with caplog.at_level(logging.WARNING, logger="cudnn_compat.graphs"):
        run, got = _run_three_times(monkeypatch, np.random.default_rng(6))
    for y, want in got:
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    (entry,) = run.cache.values()
    assert entry.graph == -1 and fake.cp.launches == 0  # tried once, not again
    (rec,) = [r for r in caplog.records if r.name == "cudnn_compat.graphs"]
    assert rec.levelno == logging.WARNING
    assert ("the RNN_FORWARD program: CUDA graph capture failed (RuntimeError: cublasGemmStridedBatchedEx failed "
            "with cuBLAS status 14)") in rec.getMessage()
    assert rec.exc_info and rec.exc_info[0] is RuntimeError
