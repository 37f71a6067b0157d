"""A captured CUDA graph replayed as its launches (engines/graphs.py ``kernels_of``, _steady.c
``Kernels``), on the CPU: a stand-in driver describes the graph's nodes and edges as the CUDA driver
would, and the extension's recording stubs play cuLaunchKernelEx and cuMemsetD2D*Async.  On the
GPU the same path replays the ResNet-50 step's convolutions bitwise as their graphs do
(tests/test_cudnn_engine_gpu.py)."""
from __future__ import annotations

import ctypes
import itertools
import struct

import pytest

from cudnn_compat._backend.engines import graphs as graphs_mod
from test_cudnn_engine import fake_cudnn  # noqa: F401 - the fixture

_steady = pytest.importorskip("cudnn_compat._backend._steady", reason="the compiled steady path is not built")
from cudnn_compat._backend import steady as _steady_path  # noqa: E402
# a graph replays as its launches only where the compiled path is used (not CUDNN_COMPAT_COMPILED=0)
in_use = pytest.mark.skipif(_steady_path.module() is None, reason="CUDNN_COMPAT_COMPILED=0: graphs replay as graphs")

KERNEL, MEMCPY, MEMSET, EMPTY = 0, 1, 2, 5
CLUSTER = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


class FakeDriver:
    """``graphs.Driver``'s methods over a graph described here: ``node(kind, ...)`` adds a node,
    ``edge(a, b)`` a dependency; kernel parameters are 8-byte ints."""

    def __init__(self, nargs=2, status=0):
        self.kinds, self.info, self.attrs, self.edge_list = {}, {}, {}, []
        self.params, self.layouts = {}, {}
        self.nargs, self.status = nargs, status
        self._ids = itertools.count(0x5000, 0x10)

    def kernel_node(self, func=0, kern=0, grid=(1, 1, 1), block=(32, 1, 1), shm=0, args=(), attrs=None, extra=0):
        node, pid = next(self._ids), next(self._ids)
        self.params[pid] = [struct.pack("<Q", a) for a in args]
        self.layouts.setdefault(func or kern, [(8 * i, 8) for i in range(len(args))])
        self.kinds[node] = KERNEL
        self.info[node] = {"func": func, "kern": kern, "grid": grid, "block": block, "shm": shm,
                           "params": pid if args else 0, "extra": extra}
        self.attrs[node] = {a: v.ljust(64, b"\0") for a, v in (attrs or {}).items()}
        return node

    def node(self, kind, info=None):
        node = next(self._ids)
        self.kinds[node], self.info[node] = kind, info
        return node

    def edge(self, a, b, kind=0):
        self.edge_list.append((a, b, kind))

    # -- graphs.Driver ---------------------------------------------------------------------------
    def nodes(self, graph):
        return list(self.kinds)

    def edges(self, graph):
        return list(self.edge_list)

    def node_type(self, node):
        return self.kinds[node]

    def kernel(self, node):
        return dict(self.info[node])

    def attribute(self, node, attr):
        return self.attrs[node].get(attr, bytes(64))

    def memset(self, node):
        return self.info[node]

    def param_layout(self, func, kern):
        return self.layouts.get(func or kern)

    def function_of(self, kern):
        return kern + 0x10

    def read(self, params, index, size):
        return self.params[params][index][:size]

    def addresses(self):
        return _steady.kernels_stub(self.nargs, self.status)


def _cluster(x, y, z):
    return struct.pack("<3I", x, y, z)


def _q(v):
    return struct.pack("<Q", v)


def test_a_graph_replays_as_its_launches_in_dependency_order_with_what_was_captured():
    """Nodes listed out of order (a memset, then kernel A, an empty node, kernel B by its CUkernel):
    launched in the order the edges give, each with the captured grid, block, shared memory,
    parameter bytes (copied when read: a later change to the graph's own does not reach them) and
    launch attributes (A's cluster dimensions), on the stream the replay is given."""
    d = FakeDriver()
    b = d.kernel_node(kern=0xBEE0, grid=(5, 1, 1), block=(64, 1, 1), args=(0x3333, 0x4444))
    e = d.node(EMPTY)
    a = d.kernel_node(func=0xF00A, grid=(3, 2, 1), block=(128, 1, 1), shm=1024, args=(0x1111, 0x2222),
                      attrs={CLUSTER: _cluster(2, 1, 1)})
    m = d.node(MEMSET, (0xD000, 256, 7, 4, 64, 2))
    for x, y in ((m, a), (a, e), (e, b)):
        d.edge(x, y)
    k = graphs_mod.kernels_of(1, d, _steady, RuntimeError)
    assert type(k) is _steady.Kernels and k.count == 3
    d.params[d.info[a]["params"]][0] = _q(0xDEAD)
    assert k(0) is None
    assert _steady.stub_calls() == [
        (0xD000, (64, 2, 7), (4, 0, 0), 256, 0, ()),
        (0xF00A, (3, 2, 1), (128, 1, 1), 1024, 0, (_q(0x1111), _q(0x2222))),
        (0xBEF0, (5, 1, 1), (64, 1, 1), 0, 0, (_q(0x3333), _q(0x4444))),
    ]
    assert _steady.stub_attrs() == [(), ((CLUSTER, (2, 1, 1)),), ()]
    d.addresses()  # resets the log
    k(0x77)
    assert [c[4] for c in _steady.stub_calls()] == [0x77] * 3


@pytest.mark.parametrize("esize, width", [(1, 512), (2, 256)])
def test_memsets_of_each_element_size_replay_as_such(esize, width):
    d = FakeDriver()
    d.node(MEMSET, (0xE000, 0, 0xAB, esize, width, 1))
    graphs_mod.kernels_of(1, d, _steady, RuntimeError)(0)
    assert _steady.stub_calls() == [(0xE000, (width, 1, 0xAB), (esize, 0, 0), 0, 0, ())]


def _decline(case):
    d = FakeDriver()
    a = d.kernel_node(func=0xF00A, args=(1, 2))
    b = d.kernel_node(func=0xF00B, args=(3, 4))
    if case == "programmatic edge":
        d.edge(a, b, kind=1)
    elif case == "cycle":
        d.edge(a, b)
        d.edge(b, a)
    elif case == "extra":
        d.info[b]["extra"] = 0x77
    elif case == "no parameter array":
        d.info[b]["params"] = 0
    elif case == "no function":
        d.info[b]["func"] = 0
    elif case == "graph-only attribute":
        d.attrs[a][13] = b"\x01".ljust(64, b"\0")
    elif case == "layout untold":
        d.layouts[0xF00B] = None
    elif case == "memcpy node":
        d.node(MEMCPY)
    elif case == "memset of 8-byte elements":
        d.node(MEMSET, (0xE000, 0, 0, 8, 16, 1))
    elif case == "too many launches":
        for i in range(graphs_mod.KERNELS_MAX - 1):
            d.kernel_node(func=0xF100 + i)
    elif case == "nothing to launch":
        d = FakeDriver()
        d.node(EMPTY)
    return d


@pytest.mark.parametrize("case", ["programmatic edge", "cycle", "extra", "no parameter array", "no function",
                                  "graph-only attribute", "layout untold", "memcpy node", "memset of 8-byte elements",
                                  "too many launches", "nothing to launch"])
def test_a_graph_with_anything_else_replays_as_a_graph(case):
    assert graphs_mod.kernels_of(1, _decline(case), _steady, RuntimeError) is None


def test_the_limit_itself_replays_as_launches():
    d = FakeDriver(nargs=0)
    for i in range(graphs_mod.KERNELS_MAX):
        d.kernel_node(func=0xF100 + i)
    k = graphs_mod.kernels_of(1, d, _steady, RuntimeError)
    k(0)
    assert [c[0] for c in _steady.stub_calls()] == [0xF100 + i for i in range(graphs_mod.KERNELS_MAX)]


def test_a_failed_launch_raises_the_drivers_error_and_stops():
    d = FakeDriver(status=700)
    d.kernel_node(func=0xF00A, args=(1, 2))
    k = graphs_mod.kernels_of(1, d, _steady, RuntimeError)
    with pytest.raises(RuntimeError, match="700"):
        k(0)
    assert _steady.stub_calls() == []


def test_kernels_refuses_records_it_cannot_launch_and_wrong_calls():
    launch = _steady.kernels_stub(0)
    bad = (graphs_mod.KernelRecord * 1)(graphs_mod.KernelRecord(kind=3))
    with pytest.raises(ValueError, match="kind 3"):
        _steady.Kernels(ctypes.addressof(bad), 1, bad, launch, RuntimeError)
    nofn = (graphs_mod.KernelRecord * 1)(graphs_mod.KernelRecord(kind=0))
    with pytest.raises(ValueError, match="no function"):
        _steady.Kernels(ctypes.addressof(nofn), 1, nofn, launch, RuntimeError)
    with pytest.raises(ValueError):
        _steady.Kernels(ctypes.addressof(nofn), 0, nofn, launch, RuntimeError)
    ok = (graphs_mod.KernelRecord * 1)(graphs_mod.KernelRecord(kind=0, f=0xF00A))
    k = _steady.Kernels(ctypes.addressof(ok), 1, ok, launch, RuntimeError)
    for args in ((), ("0",), (0, 1)):
        with pytest.raises(TypeError):
            k(*args)
    with pytest.raises(TypeError):
        k(stream=0)


@in_use
def test_graphs_replay_as_launches_only_on_the_legacy_stream_and_where_asked(monkeypatch):
    """``Graphs.capture(as_kernels=True)`` reads the graph; ``launch`` and ``replay_form`` use the
    launches on the legacy default stream (0 and CU_STREAM_LEGACY) only; other streams, a capture
    not asked to, and CUDNN_COMPAT_GRAPH_REPLAY=graph keep the graph launch; ``destroy`` forgets."""
    from test_cudnn_engine import _FakeRuntime
    rt = _FakeRuntime()
    d = FakeDriver(nargs=0)
    d.kernel_node(func=0xF00A)
    gr = graphs_mod.Graphs(runtime=rt, stream=lambda device: 0xCA97, driver=d)
    exe = gr.capture(lambda s: None, 0, as_kernels=True)
    plain = gr.capture(lambda s: None, 0)
    k = gr.replay_form(exe, 0)
    assert type(k) is _steady.Kernels and gr.replay_form(exe, 1) is k
    assert gr.replay_form(exe, 0x5150) == exe and gr.replay_form(plain, 0) == plain
    d.addresses()
    for form, stream in ((exe, 0), (k, 0), (exe, 1), (exe, 0x5150), (plain, 0)):
        gr.launch(form, stream)
    assert [(c[0], c[4]) for c in _steady.stub_calls()] == [(0xF00A, 0), (0xF00A, 0), (0xF00A, 1)]
    assert rt.launches == [(exe, 0x5150), (plain, 0)]
    gr.destroy(exe)
    assert gr.replay_form(exe, 0) == exe
    monkeypatch.setenv("CUDNN_COMPAT_GRAPH_REPLAY", "graph")
    exe2 = gr.capture(lambda s: None, 0, as_kernels=True)
    assert gr.replay_form(exe2, 0) == exe2


def test_a_driver_that_fails_leaves_the_graph_a_graph():
    from test_cudnn_engine import _FakeRuntime

    class Broken(FakeDriver):
        def nodes(self, graph):
            raise RuntimeError("cuGraphGetNodes returned CUresult 999")
    gr = graphs_mod.Graphs(runtime=_FakeRuntime(), stream=lambda device: 0xCA97, driver=Broken())
    exe = gr.capture(lambda s: None, 0, as_kernels=True)
    assert gr.replay_form(exe, 0) == exe


@in_use
@pytest.mark.parametrize("which", ["twin", "compiled"])
def test_a_cudnn_plans_replay_on_the_legacy_stream_is_the_graphs_kernel_launch(which, fake_cudnn, monkeypatch):
    """Through a CudnnPlan (twin and compiled launcher): the second call on the legacy stream
    captures and replays the graph as its one kernel launch, and so does every later call from the
    replay table; the same call on another stream replays the graph itself."""
    from test_cudnn_engine import _pack, _values, types_stream
    plan, executes, _ = fake_cudnn
    gr = graphs_mod.graphs()
    d = FakeDriver(nargs=1)
    d.kernel_node(func=0xF00A, grid=(7, 1, 1), args=(0x1234,))
    monkeypatch.setattr(gr, "_driver", d)
    if which == "compiled":
        monkeypatch.setattr(gr, "launch_address", lambda: _steady.graph_stub(), raising=False)
        monkeypatch.setattr(gr, "error_type", lambda: RuntimeError, raising=False)
        plan.launch = plan._launcher()
        assert type(plan.launch) is _steady.Replay
    v = _values(plan, 0x1000, 0x2000, 0x3000)
    plan.execute(_pack(0x1000, 0x2000, 0x3000), None)
    plan.execute(_pack(0x1000, 0x2000, 0x3000), None)  # captured: read as launches, launched
    entry = plan._replay[(v, 0)][0]
    assert type(entry) is _steady.Kernels
    for _ in range(3):
        assert plan.launch(v, None)
    assert _steady.stub_calls() == [(0xF00A, (7, 1, 1), (32, 1, 1), 0, 0, (_q(0x1234),))] * 4
    assert len(executes) == 1 and plan.rt.launches == []
    plan.execute(_pack(0x1000, 0x2000, 0x3000), types_stream(0x5150))
    plan.execute(_pack(0x1000, 0x2000, 0x3000), types_stream(0x5150))
    assert plan.launch(v, 0x5150)
    g = plan._replay[(v, 0x5150)][0]
    assert type(g) is int
    graph_launches = plan.rt.launches + [(c[0], c[4]) for c in _steady.stub_calls() if c[0] != 0xF00A]
    assert graph_launches == [(g, 0x5150)] * 2
    plan.release()
