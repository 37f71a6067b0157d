"""Several GPUs (issue 17; docs/multi_gpu.md): a handle binds the device current at cudnnCreate
(002 §3.2.5), every call runs on it whatever device the calling thread has current, every cache
holding device state is keyed by device, cudnnSetStream takes only streams of the handle's device
(002 §3.2.89: CUDNN_STATUS_MAPPING_ERROR), and the plan-cache file is shared by concurrent
processes and keyed by kind of GPU.

CPU tests run on a fake ``cupy`` module with N devices (``FakeCupy``: the current device per
thread, ``Device`` contexts, streams with ``device_id``).  ``gpu`` tests: two handles on device 0
with interleaved calls on two streams; ``multigpu`` tests (2 GPUs, skipped with fewer): two
devices in one process, and examples/multi_gpu_data_parallel.py under torchrun against --single.
"""
import json
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core import call as _call
from cudnn_compat import handle as handle_mod
from cudnn_compat._backend import planner
from cudnn_compat._backend.plan_cache import CONFIG_FILE, FILE_ENV
from cudnn_compat.errors import CUDNN_STATUS_MAPPING_ERROR, CuDNNError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "multi_gpu_data_parallel.py"


# -- a fake CuPy with several devices --------------------------------------------------------------

class FakeCupy(types.ModuleType):
    """``cupy`` as far as the handle, the legacy call path and the per-device caches use it:
    ``n`` devices, the current one per thread (``getDevice`` calls counted), ``Device(i)``
    contexts (restore on exit), ``Stream`` (``device_id`` = the current device; ``Stream.null``:
    -1) and ``ExternalStream(ptr, device_id=-1)``, ``RawModule``, device properties."""

    def __init__(self, n: int = 2):
        super().__init__("cupy")
        self.n, self.tls, self.get_calls = n, threading.local(), 0
        fake = self

        def getDevice():
            fake.get_calls += 1
            return getattr(fake.tls, "dev", 0)

        def setDevice(i):
            assert 0 <= i < fake.n, f"no device {i}"
            fake.tls.dev = i

        class Device:
            def __init__(self, i=None):
                self.id = getDevice() if i is None else int(i)

            def __enter__(self):
                self._prev = getattr(fake.tls, "dev", 0)
                setDevice(self.id)
                return self

            def __exit__(self, *exc):
                fake.tls.dev = self._prev
                return False

            def use(self):
                setDevice(self.id)

            def synchronize(self):
                pass

        class Stream:
            _ptrs = iter(range(0x5000, 0x6000, 16))

            def __init__(self, null=False, non_blocking=False):
                self.ptr = 0 if null else next(Stream._ptrs)
                self.device_id = -1 if null else getattr(fake.tls, "dev", 0)

        Stream.null = Stream(null=True)

        class ExternalStream:
            def __init__(self, ptr, device_id=-1):
                self.ptr, self.device_id = ptr, device_id

        class RawModule:
            compiled = []

            def __init__(self, code, options=()):
                self.dev = getattr(fake.tls, "dev", 0)
                RawModule.compiled.append((self.dev, code))

            def get_function(self, name):
                return ("function", self.dev, name)

        self.ndarray = type("ndarray", (), {})
        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(
            Device=Device, Stream=Stream, ExternalStream=ExternalStream,
            runtime=types.SimpleNamespace(
                getDevice=getDevice, setDevice=setDevice, getDeviceCount=lambda: fake.n,
                getDeviceProperties=lambda i: {"name": f"Fake GPU kind {i}".encode(), "major": 9, "minor": i}))

    def current(self) -> int:
        return getattr(self.tls, "dev", 0)


@pytest.fixture
def fake_cupy(monkeypatch):
    fake = FakeCupy(2)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(handle_mod, "gpu_reason", lambda: None)
    return fake


def gpu_handle(fake, device: int):
    with fake.cuda.Device(device):
        return cc.cudnnCreate("gpu")


# -- 1. cudnnCreate binds the current device -------------------------------------------------------

def test_create_binds_the_current_device(fake_cupy):
    h0 = cc.cudnnCreate("gpu")
    h1 = gpu_handle(fake_cupy, 1)
    assert (h0.device, h1.device) == (0, 1) and h0.switch and h1.switch
    assert fake_cupy.current() == 0  # the Device context was left
    fake_cupy.cuda.Device(1).use()
    assert cc.cudnnCreate("gpu").device == 1
    assert h0.key() != h1.key()  # the device is part of the handle's settings
    hc = cc.cudnnCreate("cpu")
    assert (hc.device, hc.switch) == (0, False)


def test_single_gpu_process_needs_no_device_check(monkeypatch):
    """One visible device: ``switch`` is False, so a call never asks for the current device."""
    fake = FakeCupy(1)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(handle_mod, "gpu_reason", lambda: None)
    h = cc.cudnnCreate("gpu")
    assert (h.device, h.switch) == (0, False)
    seen = _patch_planner(monkeypatch, fake)
    before = fake.get_calls
    for _ in range(3):
        _call.run(h, ("k",), None, {}, {})
    assert fake.get_calls == before and [d for d, _ in seen["execute"]] == [0, 0, 0]


# -- 2. every call runs on its handle's device -----------------------------------------------------

class _Plan:
    raw_pointers = False
    workspace_size = 0
    launch_order = ()

    def __init__(self):
        from cudnn_compat._core import fastbind
        self.annex = {fastbind.__name__: fastbind._Binding()}
        self.annex[fastbind.__name__].program = ()


def _patch_planner(monkeypatch, fake, fail_execute=False):
    """planner.get_plan/execute as seen by _call: record (current device, key) of each."""
    seen = {"get_plan": [], "execute": []}
    plan = _Plan()

    def get_plan(key, build, place, mode="A"):
        seen["get_plan"].append((fake.current(), key))
        return plan

    def execute(p, data, workspace=None, workspace_size=0, stream=None, key=None):
        seen["execute"].append((fake.current(), key))
        if fail_execute:
            raise RuntimeError("engine failed")
        return p

    monkeypatch.setattr(planner, "get_plan", get_plan)
    monkeypatch.setattr(planner, "execute", execute)
    return seen


@pytest.mark.parametrize("current", [0, 1])
def test_call_switches_to_the_handle_device_and_back(fake_cupy, monkeypatch, current):
    seen = _patch_planner(monkeypatch, fake_cupy)
    h0, h1 = gpu_handle(fake_cupy, 0), gpu_handle(fake_cupy, 1)
    fake_cupy.cuda.Device(current).use()
    for h in (h0, h1, h1, h0):  # interleaved
        _call.run(h, ("Op", h.device), None, {}, {})
        assert fake_cupy.current() == current  # the caller's device is current again
    assert [d for d, _ in seen["get_plan"]] == [0, 1, 1, 0]  # the plan is looked up / built on its device
    assert [d for d, _ in seen["execute"]] == [0, 1, 1, 0]
    assert [k[:2] for _, k in seen["get_plan"]] == [("gpu", 0), ("gpu", 1), ("gpu", 1), ("gpu", 0)]


def test_plan_for_builds_on_the_handle_device(fake_cupy, monkeypatch):
    """Workspace queries build the plan the next call runs: on the handle's device too."""
    seen = _patch_planner(monkeypatch, fake_cupy)
    h1 = gpu_handle(fake_cupy, 1)
    assert isinstance(_call.plan_for(h1, ("Q",), None), _Plan)
    assert seen["get_plan"] == [(1, ("gpu", 1, "Q"))] and fake_cupy.current() == 0


def test_failed_call_restores_the_callers_device(fake_cupy, monkeypatch):
    _patch_planner(monkeypatch, fake_cupy, fail_execute=True)
    h1 = gpu_handle(fake_cupy, 1)
    with pytest.raises(RuntimeError, match="engine failed"):
        _call.run(h1, ("k",), None, {}, {})
    assert fake_cupy.current() == 0


def test_hooks_run_on_the_handle_device(fake_cupy, monkeypatch):
    """Interceptors (trace, fusion's deferral) see the call on the handle's device."""
    _patch_planner(monkeypatch, fake_cupy)
    got = []

    def hook(proceed, handle, *rest):
        got.append(fake_cupy.current())
        return proceed(handle, *rest)

    monkeypatch.setattr(_call, "HOOKS", [hook])
    h1 = gpu_handle(fake_cupy, 1)
    _call.run(h1, ("k",), None, {}, {})
    assert got == [1] and fake_cupy.current() == 0


@pytest.mark.parametrize("how", ["exit", "flush"])
def test_fuse_scope_runs_its_calls_on_the_handle_device(fake_cupy, monkeypatch, how):
    """A fuse() block left (or flushed) while another device is current runs the recorded calls on
    the handle's device, and the caller's device is current again afterwards."""
    from cudnn_compat.tools import fuse as fusion
    got = []
    monkeypatch.setattr(fusion.Scope, "flush", lambda self: got.append(fake_cupy.current()))
    h1 = gpu_handle(fake_cupy, 1)
    with fusion.fuse(h1):
        if how == "flush":
            fusion.flush()
            assert got == [1] and fake_cupy.current() == 0
    assert got[-1] == 1 and fake_cupy.current() == 0


def test_backend_execute_runs_on_the_handle_device(fake_cupy, monkeypatch):
    """cudnnBackendExecute (002 §5.2.3) runs the plan on the handle's device; the caller's returns."""
    from cudnn_compat.graph_api import api as backend_api
    got = []
    monkeypatch.setattr(backend_api, "_execute", lambda h, plan, pack: got.append((fake_cupy.current(), plan, pack)))
    h0, h1 = gpu_handle(fake_cupy, 0), gpu_handle(fake_cupy, 1)
    for h in (h1, h0, h1):
        backend_api.backendExecute(h, "P", "V")
        assert fake_cupy.current() == 0
    assert got == [(1, "P", "V"), (0, "P", "V"), (1, "P", "V")]


def test_threads_with_other_devices_run_on_the_handle_device(fake_cupy, monkeypatch):
    """Each thread has its own current device; a handle shared with a thread on device 0 still
    runs on device 1."""
    seen = _patch_planner(monkeypatch, fake_cupy)
    h1 = gpu_handle(fake_cupy, 1)
    errors = []

    def worker(dev):
        try:
            fake_cupy.cuda.Device(dev).use()
            for _ in range(20):
                _call.run(h1, ("k",), None, {}, {})
                assert fake_cupy.current() == dev
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(d,)) for d in (0, 1, 0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and {d for d, _ in seen["execute"]} == {1} and len(seen["execute"]) == 80


# -- 3. cudnnSetStream: streams of the handle's device only ---------------------------------------

def test_set_stream_of_another_device_is_mapping_error(fake_cupy):
    """002 §3.2.89: "Mismatch between the user stream and the cuDNN handle context" is
    CUDNN_STATUS_MAPPING_ERROR; the handle keeps its stream."""
    cuda = fake_cupy.cuda
    h0, h1 = gpu_handle(fake_cupy, 0), gpu_handle(fake_cupy, 1)
    with cuda.Device(0):
        s0 = cuda.Stream()
    with cuda.Device(1):
        s1 = cuda.Stream()
    cc.cudnnSetStream(h1, s1)
    for h, wrong in ((h1, s0), (h0, s1), (h0, cuda.ExternalStream(0x777, 1)), (h1, cuda.ExternalStream(0x778, 0))):
        before = cc.cudnnGetStream(h)
        with pytest.raises(CuDNNError) as e:
            cc.cudnnSetStream(h, wrong)
        assert e.value.status == CUDNN_STATUS_MAPPING_ERROR and e.value.argument == "streamId"
        assert f"device {wrong.device_id}" in e.value.rule and f"device {h.device}" in e.value.rule
        assert cc.cudnnGetStream(h) == before  # nothing written
    cc.cudnnSetStream(h0, s0)
    assert cc.cudnnGetStream(h0) == s0.ptr and cc.cudnnGetStream(h1) == s1.ptr
    for h in (h0, h1):  # device -1: the null stream and unknown-device external streams, any device's
        cc.cudnnSetStream(h, cuda.Stream.null)
        cc.cudnnSetStream(h, cuda.ExternalStream(0x779))
        assert cc.cudnnGetStream(h) == 0x779


def test_set_stream_raw_pointer_asks_the_driver(fake_cupy, monkeypatch):
    asked = []

    def stream_device(ptr):
        asked.append(ptr)
        return {0x100: 0, 0x101: 1}.get(ptr)

    monkeypatch.setattr(handle_mod, "STREAM_DEVICE", [stream_device])
    h0, h1 = gpu_handle(fake_cupy, 0), gpu_handle(fake_cupy, 1)
    cc.cudnnSetStream(h0, 0x100)
    cc.cudnnSetStream(h1, 0x101)
    assert (cc.cudnnGetStream(h0), cc.cudnnGetStream(h1)) == (0x100, 0x101)
    assert h1.stream.device_id == 1  # the wrapped stream records the handle's device
    for h, ptr in ((h0, 0x101), (h1, 0x100)):
        with pytest.raises(CuDNNError) as e:
            cc.cudnnSetStream(h, ptr)
        assert e.value.status == CUDNN_STATUS_MAPPING_ERROR and f"{ptr:#x}" in e.value.rule
    cc.cudnnSetStream(h0, 0x222)  # the driver cannot say: accepted
    asked.clear()
    for special in (1, 2):  # cudaStreamLegacy / cudaStreamPerThread: every device's own, not asked
        cc.cudnnSetStream(h1, special)
        assert cc.cudnnGetStream(h1) == special
    cc.cudnnSetStream(h1, 0)
    assert asked == [] and cc.cudnnGetStream(h1) == 0


def test_set_stream_of_no_stream_is_still_bad_param(fake_cupy):
    h = gpu_handle(fake_cupy, 1)
    with pytest.raises(CuDNNError) as e:
        cc.cudnnSetStream(h, "stream")
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and h.stream is None


# -- 4. caches holding device state are keyed by device -------------------------------------------

def test_compiled_kernels_are_per_device(fake_cupy, monkeypatch):
    from cudnn_compat._backend.engines.cupy_engine import runtime
    monkeypatch.setattr(runtime, "_MODULES", {})
    monkeypatch.setattr(runtime, "cupy", lambda: fake_cupy)
    fake_cupy.RawModule.compiled = []
    spec = types.SimpleNamespace(name="k_test_multi_device", source="extern \"C\" __global__ void k() {}")
    got = []
    for dev in (0, 1, 0, 1):
        with fake_cupy.cuda.Device(dev):
            got.append(runtime.function(spec))
    assert got == [("function", 0, spec.name), ("function", 1, spec.name)] * 2
    assert [d for d, _ in fake_cupy.RawModule.compiled] == [0, 1]  # compiled once per device


def test_cublas_handles_are_per_device(fake_cupy, monkeypatch):
    from cudnn_compat._backend.engines.cupy_engine import cublas, runtime
    monkeypatch.setattr(runtime, "cupy", lambda: fake_cupy)
    monkeypatch.setattr(cublas.Cublas, "_by_device", {})
    monkeypatch.setattr(cublas.Cublas, "lib", classmethod(lambda cls: "libcublas"))
    made = []
    monkeypatch.setattr(cublas.Cublas, "__init__", lambda self, lib: made.append(fake_cupy.current()))
    got = []
    for dev in (0, 1, 1, 0):
        with fake_cupy.cuda.Device(dev):
            got.append(cublas.Cublas.get())
    assert made == [0, 1] and got[0] is got[3] and got[1] is got[2] and got[0] is not got[1]


def test_native_cudnn_handles_are_per_device(fake_cupy, monkeypatch):
    """cudnn engine: one native handle per device, created with that device current (even when
    another device is current at the first use)."""
    import ctypes
    from cudnn_compat._backend.engines.cudnn_engine import lib

    class FakeLib:
        created, streams = [], []

        def cudnnCreate(self, p):
            dev = fake_cupy.current()
            FakeLib.created.append(dev)
            ctypes.cast(p, ctypes.POINTER(ctypes.c_void_p))[0] = 0x9000 + dev
            return 0

        def cudnnSetStream(self, h, s):
            FakeLib.streams.append((h, s))
            return 0

    monkeypatch.setattr(lib, "load", lambda: FakeLib())
    monkeypatch.setattr(lib, "_handles", {})
    assert lib.handle_for(1) == 0x9001 and lib.handle_for(0) == 0x9000 and lib.handle_for(1, 0x50) == 0x9001
    assert FakeLib.created == [1, 0] and FakeLib.streams == [(0x9001, 0x50)]


def _spec():
    return types.SimpleNamespace(tensors={1: "x"}, ops=["Conv"], representative=lambda: (1.0, 0.0),
                                 describe=lambda: "a convolution", workspace_limit=None)


def test_autotune_choices_are_per_device(monkeypatch, tmp_path):
    """The cudnn engine's tuned configs: the in-process memo and the plan-cache file both keep one
    per device kind; a device never takes another kind's choice."""
    from cudnn_compat._backend.engines.base import EngineConfig
    from cudnn_compat._backend.engines.cudnn_engine import autotune
    monkeypatch.setattr(autotune, "_MEMO", {})
    monkeypatch.setattr(autotune, "_DEVICE_ID", {0: ("GPU A", "9.0", 91000), 1: ("GPU B", "8.0", 91000)})
    monkeypatch.setenv(FILE_ENV, str(tmp_path / "plans.json"))
    CONFIG_FILE.forget()
    cfgs = [EngineConfig("cudnn", (), frozenset(), i) for i in (3, 7)]
    spec = _spec()
    key = autotune.memo_key(spec, cfgs)
    autotune.remember(key, spec, cfgs, 0, cfgs[1], 0.5)
    assert autotune.known(key, spec, cfgs, 0) == cfgs[1]
    assert autotune.known(key, spec, cfgs, 1) is None  # device 1 is another kind: not tuned yet
    autotune.remember(key, spec, cfgs, 1, cfgs[0], 0.7)
    assert autotune.known(key, spec, cfgs, 0) == cfgs[1] and autotune.known(key, spec, cfgs, 1) == cfgs[0]
    # a new process: from the file, per kind
    monkeypatch.setattr(autotune, "_MEMO", {})
    CONFIG_FILE.forget()
    assert autotune.known(key, spec, cfgs, 1) == cfgs[0] and autotune.known(key, spec, cfgs, 0) == cfgs[1]
    values = json.loads((tmp_path / "plans.json").read_text())["entries"]["cudnn"].values()
    assert sorted(v["device"] for v in values) == ["GPU A (sm 9.0, libcudnn 91000)", "GPU B (sm 8.0, libcudnn 91000)"]
    CONFIG_FILE.forget()


def test_cudnn_engine_pending_plans_are_per_device():
    """Native plans finalized while choosing configs are kept per (device, config)."""
    src = (ROOT / "cudnn_compat" / "_backend" / "engines" / "cudnn_engine" / "__init__.py").read_text()
    assert "st.pending[(_device(), cfg)]" in src and "st.pending.pop((device, config), None)" in src


# -- 5. the plan-cache file under several processes -------------------------------------------------

WRITER = textwrap.dedent('''
    import sys
    from cudnn_compat._backend.engines.base import EngineConfig
    from cudnn_compat._backend.engines.cudnn_engine import autotune
    w, kind, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    autotune._DEVICE_ID[0] = (kind, "9.0", 91000)  # this process's GPU (device 0 of its own view)
    spec = type("Spec", (), {})()
    spec.ops, spec.representative, spec.describe = ["Conv"], (lambda: (1.0, 0.0)), (lambda: f"writer {w}")
    spec.workspace_limit = None  # planned for no call's workspace limit
    cfgs = [EngineConfig("cudnn", (), frozenset(), j) for j in (1, 2)]
    for i in range(n):
        spec.tensors = {1: f"x{i}"}  # a graph every process tunes (one entry per GPU kind)
        autotune.remember(("k", w, i), spec, cfgs, 0, cfgs[w % 2], float(w))
        spec.tensors = {1: f"writer {w} x{i}"}  # a graph only this process tunes
        autotune.remember(("own", w, i), spec, cfgs, 0, cfgs[w % 2], float(w))
''')


@pytest.mark.parametrize("procs", [4])
def test_processes_write_the_plan_cache_file_at_once(tmp_path, procs):
    """One process per GPU, GPUs of two kinds, all writing the same signatures at once: every
    (kind, signature) entry is there afterwards, the file is valid JSON, and each kind reads its
    own choice back."""
    path = tmp_path / "plans.json"
    n = 15
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{FILE_ENV: str(path)})
    kinds = ["GPU A", "GPU B"]
    ps = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), kinds[w % 2], str(n)], env=env, cwd=str(ROOT),
                           stderr=subprocess.PIPE) for w in range(procs)]
    for p in ps:
        assert p.wait(timeout=120) == 0, p.stderr.read().decode()
    doc = json.loads(path.read_text())
    entries = doc["entries"]["cudnn"]
    # shared graphs: one entry per GPU kind (processes of one kind share theirs); own graphs: one each
    assert len(entries) == 2 * n + procs * n
    by_kind = {}
    for v in entries.values():
        by_kind.setdefault(v["device"], []).append(v["index"])
    assert sorted(by_kind) == ["GPU A (sm 9.0, libcudnn 91000)", "GPU B (sm 9.0, libcudnn 91000)"]
    assert set(by_kind["GPU A (sm 9.0, libcudnn 91000)"]) == {1} and set(by_kind["GPU B (sm 9.0, libcudnn 91000)"]) == {2}
    assert {len(v) for v in by_kind.values()} == {n + procs // 2 * n}
    assert sorted(os.listdir(tmp_path)) == ["plans.json", "plans.json.lock"]  # no temporary file left


def test_writer_merges_into_a_file_replaced_within_one_timestamp(tmp_path, monkeypatch):
    """Another process's write of the same size within the file system's timestamp granularity
    (the stamp this process cached is unchanged): the next write still keeps its entry."""
    path = tmp_path / "plans.json"
    monkeypatch.setenv(FILE_ENV, str(path))
    CONFIG_FILE.forget()
    assert CONFIG_FILE.put("e", "sig one", {"index": 1})
    st = os.stat(path)
    text = path.read_text()
    digest = next(iter(json.loads(text)["entries"]["e"]))
    other = digest[:-1] + ("0" if digest[-1] != "0" else "1")  # another process's entry, same length
    with open(path, "r+", encoding="utf-8") as f:  # same inode, same size, same mtime
        f.write(text.replace(digest, other))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert CONFIG_FILE.put("e", "sig two", {"index": 2})
    keys = set(json.loads(path.read_text())["entries"]["e"])
    assert other in keys and len(keys) == 2
    CONFIG_FILE.forget()


# -- 6. the data-parallel example on the CPU (gloo) ---------------------------------------------------

def _example_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDNN_COMPAT_")
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, args, tmp_path, timeout=300):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(_free_port()), str(EXAMPLE), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_example_env(), cwd=str(tmp_path), timeout=timeout)


def _script(args, tmp_path, timeout=300):
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=_example_env(),
                          cwd=str(tmp_path), timeout=timeout)


def _same_run(a: Path, b: Path, rtol=1e-4, atol=1e-5) -> None:
    ra, rb = np.load(a), np.load(b)
    assert sorted(ra.files) == sorted(rb.files) == sorted(["losses", "conv1.w", "bn.scale", "bn.bias", "fc.w", "fc.b"])
    for k in ra.files:
        np.testing.assert_allclose(ra[k], rb[k], rtol=rtol, atol=atol, err_msg=k)


TINY = ["--batch", "8", "--size", "8", "--steps", "3"]


def test_example_single_process_learns_on_the_cpu(tmp_path):
    """World size 1 without a launcher (no torch needed); the loss falls; --single with one shard
    is the same run."""
    p = _script(["--place", "cpu", *TINY, "--steps", "6", "--save", "a.npz"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    losses = np.load(tmp_path / "a.npz")["losses"]
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0], losses
    p = _script(["--place", "cpu", *TINY, "--steps", "6", "--single", "--save", "b.npz"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    _same_run(tmp_path / "a.npz", tmp_path / "b.npz", rtol=0, atol=0)


def test_example_shards_change_only_batch_norm_statistics(tmp_path):
    """--shards 2 differs from one pass over the global batch (per-shard batch norm), so the
    distributed check below compares against the sharded run, not a vacuous one."""
    for shards in ("1", "2"):
        p = _script(["--place", "cpu", *TINY, "--single", "--shards", shards, "--save", f"s{shards}.npz"], tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
    a, b = np.load(tmp_path / "s1.npz"), np.load(tmp_path / "s2.npz")
    assert abs(float(a["losses"][0]) - float(b["losses"][0])) > 1e-4


@pytest.mark.parametrize("nproc", [1, 2])
def test_example_under_torchrun_on_the_cpu_equals_single(tmp_path, nproc):
    """torchrun with the gloo backend on the CPU place: the all-reduce through DLPack views of the
    NumPy gradient buffer gives the single-process result of the same global batch."""
    pytest.importorskip("torch.distributed")
    p = _torchrun(nproc, ["--place", "cpu", *TINY, "--check", "--save", "ddp.npz"], tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"{nproc} process(es), gloo" in p.stdout and "agree" in p.stdout, p.stdout
    p = _script(["--place", "cpu", *TINY, "--single", "--shards", str(nproc), "--save", "single.npz"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    _same_run(tmp_path / "ddp.npz", tmp_path / "single.npz")


# -- GPU: two handles on device 0, two streams --------------------------------------------------------

def _conv_relu_softmax(h, xp, x, w):
    """conv 3x3 pad 1 -> ReLU -> channel softmax, in legacy calls on ``h`` (arrays of ``xp``)."""
    n, c, hh, ww = x.shape
    k = w.shape[0]
    xd, yd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(xd, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, n, c, hh, ww)
    cc.cudnnSetTensor4dDescriptor(yd, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, n, k, hh, ww)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, k, c, 3, 3)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    cc.cudnnSetConvolutionMathType(cd, cc.CUDNN_FMA_MATH)  # FP32 products (no TF32 on the GPU)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
    wss = cc.cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algo)
    ws = xp.empty(max(wss, 1), np.uint8)
    y, r, s = (xp.zeros((n, k, hh, ww), np.float32) for _ in range(3))

    def step():
        cc.cudnnConvolutionForward(h, 1.0, xd, x, wd, w, cd, algo, ws, wss, 0.0, yd, y)
        cc.cudnnActivationForward(h, ad, 1.0, yd, y, 0.0, yd, r)
        cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, yd, r, 0.0, yd, s)
        return s
    return step


def _reference(x, w):
    h = cc.cudnnCreate("cpu")
    try:
        return _conv_relu_softmax(h, np, x, w)().copy()
    finally:
        cc.cudnnDestroy(h)


def _problem(seed, n=2, c=3, k=4, size=9):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, c, size, size)).astype(np.float32),
            rng.standard_normal((k, c, 3, 3)).astype(np.float32))


@pytest.mark.gpu
def test_two_handles_on_device_0_with_interleaved_calls_on_two_streams():
    import cupy
    probs = [_problem(1), _problem(2, n=3, size=7)]
    refs = [_reference(x, w) for x, w in probs]
    with cupy.cuda.Device(0):
        streams = [cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)]
        hs = [cc.cudnnCreate("gpu") for _ in range(2)]
        try:
            steps = []
            for h, st, (x, w) in zip(hs, streams, probs):
                assert h.device == 0
                cc.cudnnSetStream(h, st)
                assert cc.cudnnGetStream(h) == st.ptr
                with st:  # inputs made on the stream that reads them
                    steps.append(_conv_relu_softmax(h, cupy, cupy.asarray(x), cupy.asarray(w)))
                st.synchronize()
            for _ in range(5):  # interleaved: plans cached, each call on its handle's stream
                outs = [steps[0](), steps[1]()]
            for st in streams:
                st.synchronize()
            for out, ref in zip(outs, refs):
                np.testing.assert_allclose(cupy.asnumpy(out), ref, rtol=1e-4, atol=1e-6)
            # a raw pointer of a device-0 stream: the driver says device 0, accepted
            assert handle_mod.stream_device(streams[1].ptr) in (0, None)
            cc.cudnnSetStream(hs[0], streams[1].ptr)
            assert cc.cudnnGetStream(hs[0]) == streams[1].ptr
        finally:
            for h in hs:
                cc.cudnnDestroy(h)


@pytest.mark.gpu
def test_example_world_size_one_under_torchrun_on_gpu(tmp_path):
    """One process under torchrun (NCCL, world size 1) equals --single on the same GPU."""
    pytest.importorskip("torch.distributed")
    p = _torchrun(1, ["--place", "gpu", "--check", "--save", "ddp.npz"], tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 process(es), nccl" in p.stdout and "agree" in p.stdout, p.stdout
    p = _script(["--place", "gpu", "--single", "--save", "single.npz"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    _same_run(tmp_path / "ddp.npz", tmp_path / "single.npz")


# -- multigpu: two devices -----------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.multigpu
def test_two_devices_in_one_process_with_interleaved_calls():
    """Handles on devices 0 and 1, their data on their devices; calls interleaved and made while
    the *other* device is current: each runs on its own device, with the reference numbers."""
    import cupy
    probs = [_problem(3), _problem(4, n=3, k=5)]
    refs = [_reference(x, w) for x, w in probs]
    hs, steps, streams = [], [], []
    try:
        for dev, (x, w) in enumerate(probs):
            with cupy.cuda.Device(dev):
                h = cc.cudnnCreate("gpu")
                hs.append(h)
                assert h.device == dev and h.switch
                st = cupy.cuda.Stream(non_blocking=True)
                streams.append(st)
                cc.cudnnSetStream(h, st)
                with st:
                    steps.append(_conv_relu_softmax(h, cupy, cupy.asarray(x), cupy.asarray(w)))
                st.synchronize()
        for _ in range(4):
            outs = []
            for dev in (0, 1):
                with cupy.cuda.Device(1 - dev):  # the other device is current
                    outs.append(steps[dev]())
                    assert cupy.cuda.runtime.getDevice() == 1 - dev
        for dev, (out, ref) in enumerate(zip(outs, refs)):
            assert out.device.id == dev
            streams[dev].synchronize()
            np.testing.assert_allclose(cupy.asnumpy(out), ref, rtol=1e-4, atol=1e-6)
        # streams of the other device: MAPPING_ERROR (a cupy Stream and its raw pointer)
        for dev in (0, 1):
            for wrong in (streams[1 - dev], streams[1 - dev].ptr):
                if isinstance(wrong, int) and handle_mod.stream_device(wrong) is None:
                    continue  # the driver cannot say (no cuStreamGetDevice/cuStreamGetCtx)
                with pytest.raises(CuDNNError) as e:
                    cc.cudnnSetStream(hs[dev], wrong)
                assert e.value.status == CUDNN_STATUS_MAPPING_ERROR
        assert handle_mod.stream_device(streams[1].ptr) == 1
    finally:
        for h in hs:
            cc.cudnnDestroy(h)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_example_two_processes_under_torchrun_equal_single(tmp_path):
    """examples/multi_gpu_data_parallel.py: 2 processes (NCCL all-reduce of the CuPy gradient
    buffer through DLPack) against one GPU running the same global batch as 2 shards."""
    pytest.importorskip("torch.distributed")
    p = _torchrun(2, ["--place", "gpu", "--check", "--save", "ddp.npz"], tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 process(es), nccl" in p.stdout and "agree" in p.stdout, p.stdout
    p = _script(["--place", "gpu", "--single", "--shards", "2", "--save", "single.npz"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    _same_run(tmp_path / "ddp.npz", tmp_path / "single.npz")


class _FakeDriver:
    """CuPy's driver module (cupy.cuda.driver) as stream_device uses it: two contexts, devices 0 and 1."""

    def __init__(self):
        self.current, self.calls = 100, []

    def streamGetCtx(self, ptr):
        self.calls.append(("streamGetCtx", ptr))
        if ptr == 666:
            raise RuntimeError("CUDA_ERROR_INVALID_HANDLE")
        return 101 if ptr >= 5000 else 100

    def ctxGetCurrent(self):
        return self.current

    def ctxSetCurrent(self, ctx):
        self.calls.append(("ctxSetCurrent", ctx))
        self.current = ctx

    def ctxGetDevice(self):
        return self.current - 100


def test_stream_device_asks_cupys_driver_and_restores_the_context():
    """issue 23 item 10: the driver through CuPy's bindings, not ctypes.CDLL('libcuda.so.1')."""
    drv = _FakeDriver()
    assert handle_mod.stream_device(5001, driver=drv) == 1 and drv.current == 100
    assert drv.calls == [("streamGetCtx", 5001), ("ctxSetCurrent", 101), ("ctxSetCurrent", 100)]
    assert handle_mod.stream_device(42, driver=drv) == 0 and drv.current == 100
    assert handle_mod.stream_device(666, driver=drv) is None  # a driver error: not known, accepted as before
    import inspect
    assert "CDLL" not in inspect.getsource(handle_mod)
