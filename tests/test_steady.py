"""The compiled steady path (cudnn_compat/_backend/_steady.c) against its Python twins and against
what a launch must receive, on the CPU: a stand-in array type plays CuPy's, and a recording stub
plays cuLaunchKernel (``_steady.stub``).  Skipped where the extension is not built."""
from __future__ import annotations

import ctypes
import itertools
import random
import struct
import threading

import numpy as np
import pytest

from cudnn_compat._backend import config, steady
from cudnn_compat._core import fastbind
from cudnn_compat._core.data import POINTER_MIN

_steady = pytest.importorskip("cudnn_compat._backend._steady", reason="the compiled steady path is not built")
# the tests that set a compiled object against its twin need it in use (not CUDNN_COMPAT_COMPILED=0)
in_use = pytest.mark.skipif(steady.module() is None, reason="CUDNN_COMPAT_COMPILED=0: the compiled objects are not used")

F32, F16, U8 = np.dtype("float32"), np.dtype("float16"), np.dtype("uint8")


class Mem:
    def __init__(self, ptr):
        self.ptr = ptr


class FakeND:
    """What the binders read of a CuPy array."""

    def __init__(self, ptr, dtype=F32, nbytes=64, c=True, f=False):
        self.data, self.dtype, self.nbytes, self._c_contiguous, self._f_contiguous = Mem(ptr), dtype, nbytes, c, f


class Plan:
    config = "test"


def _prog(specs):
    """A binding program as fastbind.program makes it: (uid, tensor, by value, written, need, storage, accepted)."""
    return tuple((u, None, False, False, need, F32, (U8,)) if need is not None else (u, None, True, False, 0, None, None)
                 for u, need in specs)


def _both(prog, order):
    with config.override("CUDNN_COMPAT_COMPILED", "0"):
        py = fastbind._generate(Plan(), prog, FakeND, 1000, order)
    c = fastbind._generate(Plan(), prog, FakeND, 1000, order)
    assert isinstance(c, _steady.Values) and not isinstance(py, _steady.Values)
    return py, c


BUFFERS = [FakeND(0x10000), FakeND(0x20000, nbytes=16), FakeND(0x30000, dtype=F16), FakeND(0x40000, dtype=U8),
           FakeND(0x50000, c=False), FakeND(0x60000, c=False, f=True), 0x70000, POINTER_MIN - 1, POINTER_MIN,
           2 ** 64 + 5, -8, "x", 3.5, np.zeros(4, np.float32)]


@in_use
def test_values_binder_gives_what_its_python_twin_gives_for_every_form():
    """Every buffer form (right, too small, other dtype, a byte view, F order, strided, pointer ints around
    POINTER_MIN, a huge int, other types) in each role (a given tensor, an output and its prior given or
    omitted, a prior of another span), and missing tensors and scalars."""
    prog = _prog([(1, 32), (2, 32), (1001, 32), (3, 64), (1003, 48), (7, None)])
    order = (1001, 7, 1, 3, 2, 1003)
    py, c = _both(prog, order)
    rng = random.Random(5)
    seen = set()
    for trial in range(3000):
        tensors = {}
        for u in (1, 2, 1001, 3, 1003):
            if rng.random() < 0.93 or u in (1001, 1003):
                if rng.random() < 0.25 and u in (1001, 1003):
                    continue  # the prior not given
                tensors[u] = (rng.choice(BUFFERS), "arg")
        scalars = {7: 2.5} if rng.random() < 0.95 else {}
        want, got = py(tensors, scalars), c(tensors, scalars)
        assert got == want, (tensors, scalars)
        seen.add(want is None)
    assert seen == {True, False}


@in_use
def test_values_binder_reads_the_pointer_numbers():
    prog = _prog([(1, 32), (1001, 32), (5, None)])
    _py, c = _both(prog, (1, 1001, 5))
    x = FakeND(0x1234000)
    assert c({1: (x, "y")}, {5: 0.5}) == (0x1234000, 0x1234000, 0.5)  # the omitted prior: the output's pointer
    assert c({1: (x, "y"), 1001: (FakeND(0x9990000), "y")}, {5: 1.0}) == (0x1234000, 0x9990000, 1.0)
    assert c({1: (x, "y")}, {}) is None
    assert c({1: (FakeND(0x1000, nbytes=31), "y")}, {5: 1.0}) is None


def _record(nvars, consts, launches):
    """A record as records.Record makes one: an 8-byte-slot buffer, per launch a void*[] of slot addresses."""
    buf = (ctypes.c_uint64 * (nvars + len(consts)))()
    for j, v in enumerate(consts):
        buf[nvars + j] = v
    base = ctypes.addressof(buf)
    keep, out = [], []
    for f, slots in launches:
        arr = (ctypes.c_void_p * len(slots))(*[base + 8 * s for s in slots])
        keep.append(arr)
        out.append((f, 2, 1, 1, 128, 1, 1, 0, ctypes.addressof(arr)))
    return (buf, tuple(out), len(out), keep)


class Env:
    def __init__(self):
        self.env, self.ov = {}, []


def _launcher(records, slots, align=(), guards=(), status=0, nargs=3, fallback=None, lock=None, direct=False,
              env=None, table_always=False, cur_int=True):
    addr = _steady.stub(nargs, status)
    calls = []

    def fb(*a):
        calls.append(a)
        return "fallback"
    env = env or Env()
    counter = [0]
    la = _steady.Launcher(records, slots, align, guards, lambda: 77 if cur_int else Mem(77), counter, [direct], env.env, "K", env.ov,
                          table_always, fallback or fb, lock or threading.Lock(), addr, RuntimeError)
    return la, counter, calls


def test_launcher_patches_every_slot_and_launches_the_record():
    rec = _record(3, [0xABC], [(0x51, [0, 1, 2]), (0x52, [2, 3, 0])])
    la, counter, _ = _launcher({(9, True): rec, (77, True): rec}, ((2, "Q"), (0, "f"), (1, "d")))
    assert la((1.5, -2.25, 0x7000), 9) is True
    calls = _steady.stub_calls()
    assert [c[0] for c in calls] == [0x51, 0x52] and all(c[4] == 9 and c[1] == (2, 1, 1) for c in calls)
    q, f, d, k = struct.pack("=Q", 0x7000), struct.pack("=f", 1.5), struct.pack("=d", -2.25), struct.pack("=Q", 0xABC)
    assert [a[:4] for a in calls[0][5]] == [q[:4], f, d[:4]] and calls[0][5][0] == q and calls[0][5][2] == d
    assert calls[1][5] == (d, k, q)
    assert counter == [2]
    assert la((1.5, -2.25, 0x7000), None) is True and _steady.stub_calls()[-1][4] == 77  # no stream: cur()
    la2, _c, _ = _launcher({(77, True): rec}, ((2, "Q"), (0, "f"), (1, "d")), cur_int=False)
    assert la2((1.5, -2.25, 0x7000), None) is True and _steady.stub_calls()[-1][4] == 77  # cur() a stream: its .ptr
    assert la2((1.5, -2.25, 0x7000), Mem(77)) is True and _steady.stub_calls()[-1][4] == 77
    assert la((1.5, -2.25, 0x7000), 8) is False  # no record for stream 8


def _pythonapi(name: str, restype, *argtypes):
    """A private prototype of the C API function ``name`` (the process-wide
    ``ctypes.pythonapi.<name>`` left as it is); PYFUNCTYPE: called with the GIL held."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


def _capsule(fn, name: bytes):
    """A PyCapsule of C function ``fn`` (a ctypes callback) named ``name``, as Cython exports one."""
    new = _pythonapi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    return new(ctypes.cast(fn, ctypes.c_void_p), name, None)


_NAMES = [ctypes.create_string_buffer(b"intptr_t (void)"), ctypes.create_string_buffer(b"int (void)")]  # outlive the capsules


def test_launcher_reads_the_current_stream_through_cupys_c_function():
    """``cur`` a capsule of CuPy's exported ``get_current_stream_ptr`` (base.current_stream_capsule):
    a call without a stream launches on what it returns, read at each call; a capsule of another
    signature raises ValueError and launches nothing."""
    rec = _record(3, [0xABC], [(0x51, [0, 1, 2])])
    now = [4096]
    fn = ctypes.CFUNCTYPE(ctypes.c_ssize_t)(lambda: now[0])
    for stream in (0, 4096, 2 ** 40):
        now[0] = stream
        la = _steady.Launcher({(stream, True): rec}, ((2, "Q"), (0, "f"), (1, "d")), (), (), _capsule(fn, _NAMES[0]),
                              [0], [False], {}, "K", [], False, lambda *a: None, threading.Lock(), _steady.stub(3),
                              RuntimeError)
        assert la((1.5, -2.25, 0x7000), None) is True and _steady.stub_calls()[-1][4] == stream
    la = _steady.Launcher({(0, True): rec}, ((2, "Q"), (0, "f"), (1, "d")), (), (), _capsule(fn, _NAMES[1]), [0],
                          [False], {}, "K", [], False, lambda *a: None, threading.Lock(), _steady.stub(3), RuntimeError)
    n = len(_steady.stub_calls())
    with pytest.raises(ValueError):
        la((1.5, -2.25, 0x7000), None)
    assert len(_steady.stub_calls()) == n


def test_current_stream_capsule_leaves_pythonapi_as_it_was(monkeypatch):
    """base.current_stream_capsule reads the capsule's name through its own prototype: the shared
    ``ctypes.pythonapi.PyCapsule_GetName``'s restype and argtypes (the process's) are as they were
    before the call.  A stand-in ``cupy_backends.cuda.stream`` exports the capsule (no CuPy needed):
    the signature it wants is returned, another gives None."""
    import sys
    import types
    from cudnn_compat._backend.engines import base
    fn = ctypes.CFUNCTYPE(ctypes.c_ssize_t)(lambda: 0)
    names = ("cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.stream")
    pkg, cuda, stream = (types.ModuleType(n) for n in names)
    pkg.cuda, cuda.stream = cuda, stream
    for m in (pkg, cuda, stream):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    shared = ctypes.pythonapi.PyCapsule_GetName
    before = shared.restype, shared.argtypes
    sentinel_res, sentinel_args = ctypes.c_uint8, [ctypes.c_void_p]  # what no caller of it would set
    try:
        shared.restype, shared.argtypes = sentinel_res, sentinel_args
        for name, want in ((_NAMES[0], True), (_NAMES[1], False)):
            cap = _capsule(fn, name)
            stream.__pyx_capi__ = {"get_current_stream_ptr": cap}
            got = base.current_stream_capsule()
            assert (got is cap) if want else (got is None)
            assert ctypes.pythonapi.PyCapsule_GetName is shared
            assert shared.restype is sentinel_res and tuple(shared.argtypes) == tuple(sentinel_args)
    finally:
        shared.restype, shared.argtypes = before


@pytest.mark.gpu
def test_cupys_current_stream_function_agrees_with_get_current_stream():
    """base.current_stream_capsule's C function gives ``cupy.cuda.get_current_stream().ptr`` on the
    null stream, inside ``with stream:`` (nested), after ``Stream.use()`` and on another thread."""
    import cupy
    from cudnn_compat._backend.engines import base
    cap = base.current_stream_capsule()
    assert cap is not None, "this CuPy exports get_current_stream_ptr as intptr_t (void)"
    get = _pythonapi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
    fn = ctypes.PYFUNCTYPE(ctypes.c_ssize_t)(get(cap, b"intptr_t (void)"))  # called with the GIL held, as C calls it
    same = lambda: fn() == cupy.cuda.get_current_stream().ptr  # noqa: E731
    a, b = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream()
    assert same() and fn() == cupy.cuda.Stream.null.ptr
    with a:
        assert same() and fn() == a.ptr
        with b:
            assert same() and fn() == b.ptr
        assert fn() == a.ptr
    assert same()
    b.use()
    try:
        assert same() and fn() == b.ptr
        seen = []
        t = threading.Thread(target=lambda: seen.append(same() and fn() == cupy.cuda.Stream.null.ptr))
        t.start()
        t.join()
        assert seen == [True]
    finally:
        cupy.cuda.Stream.null.use()
    assert same()


def test_launcher_refuses_what_does_not_pack_and_launches_nothing():
    rec = _record(2, [], [(0x51, [0, 1])])
    la, counter, _ = _launcher({(9, True): rec}, ((0, "Q"), (1, "f")), nargs=2)
    _steady.stub(2)
    for bad in [(-1, 1.0), (2 ** 64, 1.0), ("p", 1.0), (0x100, 1e39), (0x100, "x"), (0x100, None)]:
        assert la(bad, 9) is False, bad
    assert _steady.stub_calls() == [] and counter == [0]
    assert la((0x100, float("inf")), 9) is True  # as struct's "f" packs it
    assert la((np.int64(0x200), np.float32(2.0)), 9) is True
    assert _steady.stub_calls()[-1][5] == (struct.pack("=Q", 0x200), struct.pack("=f", 2.0) + b"\0" * 4)


def test_launcher_picks_the_record_of_the_alignment_and_refuses_overlapping_guards():
    aligned, odd = _record(2, [], [(0x61, [0, 1])]), _record(2, [], [(0x62, [0, 1])])
    recs = {(9, True): aligned, (9, (False, True)): odd}
    la, _c, _ = _launcher(recs, ((0, "Q"), (1, "Q")), align=(0, 1), guards=((0, 1, 64, 64),), nargs=2)
    assert la((0x1000, 0x2000), 9) and _steady.stub_calls()[-1][0] == 0x61
    assert la((0x1004, 0x2000), 9) and _steady.stub_calls()[-1][0] == 0x62
    assert la((0x2000, 0x1004), 9) is False  # (True, False): no record
    assert la((0x1000, 0x1030), 9) is False  # overlapping spans
    assert la((0x1000, 0x1040), 9) is True


def test_launcher_hands_the_graph_table_and_a_held_lock_to_its_python_twin():
    rec = _record(1, [], [(0x51, [0])])
    env = Env()
    la, _c, calls = _launcher({(9, True): rec}, ((0, "Q"),), nargs=1, env=env)
    env.env["K"] = "1"
    assert la((0x100,), 9, None, 0) == "fallback" and calls[-1] == ((0x100,), 9, None, 0)
    del env.env["K"]
    env.ov.append(1)
    assert la((0x100,), 9) == "fallback"
    env.ov.clear()
    lock = threading.Lock()
    la2, _c, calls2 = _launcher({(9, True): rec}, ((0, "Q"),), nargs=1, lock=lock)
    with lock:  # held by a thread in the Python launcher: it waits there
        assert la2((0x100,), 9) == "fallback"
    assert la2((0x100,), 9) is True and not lock.locked()
    la3, _c, calls3 = _launcher({(9, True): rec}, ((0, "Q"),), nargs=1, direct=True, env=env)
    env.env["K"] = "1"
    assert la3((0x100,), 9) is True and calls3 == []  # a direct plan: no table
    la4, _c, calls4 = _launcher({(9, True): rec}, ((0, "Q"),), nargs=1, table_always=True)
    assert la4((0x100,), 9) == "fallback"


def test_launcher_raises_the_drivers_error():
    rec = _record(1, [], [(0x51, [0])])
    lock = threading.Lock()
    la, counter, _ = _launcher({(9, True): rec}, ((0, "Q"),), nargs=1, status=700, lock=lock)
    with pytest.raises(RuntimeError, match="700"):
        la((0x100,), 9)
    assert not lock.locked() and counter == [0]


def test_launcher_follows_records_replaced_in_the_dict():
    recs = {(9, True): _record(1, [], [(0x51, [0])])}
    la, _c, _ = _launcher(recs, ((0, "Q"),), nargs=1)
    assert la((0x100,), 9) and _steady.stub_calls()[-1][0] == 0x51
    recs[(9, True)] = _record(1, [], [(0x99, [0])])
    assert la((0x100,), 9) and _steady.stub_calls()[-1][0] == 0x99
    recs.clear()
    assert la((0x100,), 9) is False


@in_use
def test_a_plan_binder_is_compiled_where_the_extension_is_built():
    assert steady.module() is _steady
    with config.override("CUDNN_COMPAT_COMPILED", "0"):
        assert steady.module() is None


class Handle:
    switch, place, device, stream = False, "gpu", 0, 5


class FakePlan:
    def __init__(self, need=0, launched=True, raises=None):
        self.retired, self.workspace_size, self.launched, self.raises, self.calls = False, need, launched, raises, []

    def launch(self, *a):
        self.calls.append(a)
        if self.raises:
            raise self.raises
        return self.launched


class FakePrep:
    def __init__(self, plan, bind=lambda t, s: (1, 2), owner=None, via_execute=False):
        self.plan, self.bind, self.owner, self.via_execute, self.device, self.calls, self.key = \
            plan, bind, owner, via_execute, 0, 0, ("full", owner)

    def __call__(self, *a):
        self.seen = a
        return getattr(self, "result", self.plan)


def _run(prep, key, **kw):
    general, failed, touched, hits = [], [], [], []
    last = threading.local()
    tables = {"cpu": {}, "gpu": {id(key): prep} if prep is not None else {}}
    r = _steady.Run(lambda *a, **k: general.append((a, k)) or "general", kw.get("hooks", []), tables,
                    {"cpu": {}, "gpu": {}}, kw.get("ov", {}), kw.get("env", {}), (b"E", b"F"), last,
                    lambda: hits.append(1), touched.append, 7, lambda plan, e: failed.append(e) or False, [])
    return r, general, failed, touched, hits, last


def test_compiled_run_binds_launches_counts_and_reports_the_plan():
    key = ("k",)
    plan = FakePlan()
    prep = FakePrep(plan, owner=key)
    r, general, failed, touched, hits, last = _run(prep, key)
    for _ in range(16):
        assert r(Handle(), key, None, {1: ("x", "x")}, {2: 1.0}) is plan
    assert general == [] and len(hits) == 16 and prep.calls == 16 and touched == [prep.key, prep.key]
    assert plan.calls[0] == ((1, 2), 5, None) and last.plan is plan
    assert r(Handle(), key, None, {}, {}, 0x5000, 64) is plan and plan.calls[-1] == ((1, 2), 5, 0x5000, 64)


@pytest.mark.parametrize("why", ["no prepared call", "another owner", "bind declines", "launch declines", "launch raises",
                                 "retired", "other device", "switch", "hooks", "override", "environment", "keyword",
                                 "small workspace", "workspace of another type", "cpu workspace"])
def test_compiled_run_takes_the_general_path_for_what_its_steady_path_does_not_take(why):
    key = ("k",)
    plan = FakePlan(need=128, launched=why != "launch declines", raises=ValueError("boom") if why == "launch raises" else None)
    prep = FakePrep(plan, owner=("other",) if why == "another owner" else key,
                    bind=(lambda t, s: None) if why == "bind declines" else (lambda t, s: (1,)))
    plan.retired = why == "retired"
    prep.device = 1 if why == "other device" else 0
    r, general, failed, _t, hits, _l = _run(None if why == "no prepared call" else prep, key,
                                            hooks=[1] if why == "hooks" else [], ov={"x": 1} if why == "override" else {},
                                            env={b"F": b"1"} if why == "environment" else {})
    h = Handle()
    h.switch = why == "switch"
    if why == "cpu workspace":
        h.place = "cpu"
    ws = {"small workspace": (0x5000, 64), "workspace of another type": (np.zeros(4), 128),
          "cpu workspace": (0x5000, 128)}.get(why, (0x5000, 128))
    args = (h, key, None, {}, {}) + ws + ("workSpaceSizeInBytes",)
    if why == "keyword":
        assert r(*args[:5], _hooked=True) == "general" and general == [(args[:5], {"_hooked": True})]
    else:
        assert r(*args) == "general" and general == [(args, {})]
    assert hits == [] and prep.calls == 0
    assert (len(failed) == 1 and str(failed[0]) == "boom") if why == "launch raises" else failed == []


def test_compiled_run_calls_a_prepared_call_without_launcher():
    key = ("k",)
    plan = FakePlan()
    prep = FakePrep(plan, owner=key, via_execute=True)
    r, general, *_ = _run(prep, key)
    assert r(Handle(), key, None, {1: 2}, {3: 4}) is plan and prep.seen == ({1: 2}, {3: 4}, 5, None) and general == []
    prep.result = None  # it did not run: the general path
    assert r(Handle(), key, None, {}, {}) == "general" and len(general) == 1


def test_compiled_run_takes_the_workspace_arguments_by_name_too():
    key = ("k",)
    plan = FakePlan(need=128)
    prep = FakePrep(plan, owner=key)
    r, general, *_ = _run(prep, key)
    assert r(Handle(), key, None, {}, {}, 0x5000, 256, workspace_arg="ws") is plan and plan.calls[-1] == ((1, 2), 5, 0x5000, 256)
    assert r(Handle(), key, None, {}, {}, workspace=0x6000, workspace_size=128) is plan and plan.calls[-1][2] == 0x6000
    assert general == []
    assert r(Handle(), key, None, {}, {}, 0x5000, 64, workspace_arg="ws") == "general"  # too small: fitted by run
    assert r(Handle(), key, None, {}, {}, 0x5000, workspace=1) == "general"  # given twice: Python's TypeError
    assert len(general) == 2


def test_compiled_objects_in_reference_cycles_are_collected():
    """A launcher's fallback closure refers back to the FastPath that holds the launcher (a replay's to its
    CudnnPlan): the collector must see through the C objects, or an evicted plan keeps its records and
    buffers alive."""
    import gc
    import weakref

    class Holder:
        pass
    for make in (lambda fb: _steady.Launcher({}, (), (), (), lambda: 0, [0], [False], {}, "K", [], False, fb,
                                             threading.Lock(), _steady.stub(0), RuntimeError),
                 lambda fb: _steady.Run(fb, [], {}, {}, {}, {}, (), threading.local(), lambda: 0, lambda k: 0, 7,
                                        lambda p, e: False, []),
                 lambda fb: _steady.Replay([{}, 0], lambda: 0, lambda s: False, {"graph_launches": 0}, fb,
                                           _steady.graph_stub(), RuntimeError, lambda w, n, need: 0)):
        h = Holder()
        h.obj = make(lambda *a, h=h: h)
        ref = weakref.ref(h)
        del h
        gc.collect()
        assert ref() is None


class CountingND(FakeND):
    """A FakeND that counts the binder's reads of what its test checks."""

    reads = 0

    def __getattribute__(self, name):
        if name in ("dtype", "_c_contiguous", "_f_contiguous", "nbytes", "data"):
            type(self).reads += 1
        return object.__getattribute__(self, name)


@in_use
def test_values_binder_remembers_the_arrays_that_passed_while_they_live():
    """The compiled binder's memo (``_steady.c`` MEMO_MAX): a C-contiguous array that passed an entry
    passes it again without a read of its attributes, with the same pointer; an F-ordered one is
    read every call; an array made after one died (whatever its address) is read in full, and
    takes its own pointer; a memo over MEMO_MAX arrays starts again, and still gives what the
    twin gives."""
    import gc
    prog = _prog([(1, 32), (2, 32)])
    with config.override("CUDNN_COMPAT_COMPILED", "0"):
        py = fastbind._generate(Plan(), prog, CountingND, 1000, (1, 2))
    c = fastbind._generate(Plan(), prog, CountingND, 1000, (1, 2))
    assert isinstance(c, _steady.Values)
    x, w = CountingND(0x10000), CountingND(0x20000, c=False, f=True)
    assert c({1: (x, "x"), 2: (w, "w")}, {}) == (0x10000, 0x20000)
    CountingND.reads = 0
    for _ in range(5):
        assert c({1: (x, "x"), 2: (w, "w")}, {}) == (0x10000, 0x20000)
    assert CountingND.reads == 5 * 5  # w (F order): dtype, c, f, nbytes, data; x: none
    for k in range(200):  # arrays dying and made again at reused addresses, each with its own pointer
        a = CountingND(0x100000 + 0x1000 * k, nbytes=64 if k % 3 else 16)
        want = py({1: (a, "x"), 2: (w, "w")}, {})
        assert c({1: (a, "x"), 2: (w, "w")}, {}) == want and (want is None) == (k % 3 == 0)
        del a
        gc.collect()
    # the memo holds no array: the last one is gone
    import weakref
    a = CountingND(0x5000000)
    ref = weakref.ref(a)
    assert c({1: (a, "x"), 2: (w, "w")}, {}) == (0x5000000, 0x20000)
    del a
    gc.collect()
    assert ref() is None


def test_thread_last_keeps_one_plan_per_thread():
    """``_core.call._LAST`` compiled (``_steady.ThreadLast``): ``plan`` per thread, unset reads as no
    attribute (``last_plan()`` None), other attributes are not there."""
    mod = steady.module()
    if mod is None:
        pytest.skip("the compiled steady path is not built")
    last, other = mod.ThreadLast(), mod.ThreadLast()
    assert getattr(last, "plan", None) is None
    plan = object()
    last.plan = plan
    assert last.plan is plan and getattr(other, "plan", None) is None
    seen = []

    def worker():
        seen.append(getattr(last, "plan", None))
        last.plan = 7
        seen.append(last.plan)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [None, 7] and last.plan is plan
    del last.plan
    assert getattr(last, "plan", None) is None
    with pytest.raises(AttributeError):
        del last.plan
    with pytest.raises(AttributeError):
        last.other = 1
    from cudnn_compat._core import call
    assert type(call._LAST) is mod.ThreadLast
