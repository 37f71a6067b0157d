"""A GPU handle on a machine without a GPU, for the cached-call path (tests/test_host_path.py,
``benchmarks/host_overhead.py --place emu``): the legacy layer's GPU binding (raw device
pointers), the planner and the cupy engine's launch records run for real; device memory is host
memory (NumPy arrays, their addresses as "device pointers"), and kernels either run on the CPU
kernel emulator (``tests/kernel_emu.py``, real numbers) or do nothing (``noop``: host cost only).

``Emu(mode)`` installs, until ``restore()``:
  * a NumPy-backed stand-in for the few CuPy calls the cupy engine's steps make (allocation,
    views over raw pointers, the current stream, the device id);
  * ``runtime.function`` -> an ``EmuKernel`` (``.ptr``, ``__call__`` as CuPy's RawKernel);
  * ``runtime.LAUNCH`` -> a cuLaunchKernel stand-in reading the ``void*[]`` argument array the
    records pass (the emulator's ``cc_launch`` takes exactly that);
  * the cupy engine as available and the native engine as not;
  * with ``cudnn=True``, the native ``cudnn`` engine as available over a stand-in libcudnn
    (``NativeEmu``): graphs are translated for real (``graph.candidates``) and plans are real
    ``CudnnPlan`` objects whose native handles, descriptors, cudnnBackendExecute and CUDA graph
    calls do nothing (counted): the convolutions' cached call path, host cost only.
"""
from __future__ import annotations

import ctypes
import itertools
import sys
import types

import numpy as np

import kernel_emu
from cudnn_compat._backend.engines import cupy_engine
from cudnn_compat._backend.engines.cupy_engine import runtime
from cudnn_compat._backend.engines import base as _base
from cudnn_compat._backend.engines import graphs as _graphs


class _Unowned:
    def __init__(self, ptr, size, owner=None):
        self.ptr, self.size, self.owner = int(ptr), int(size), owner


class _MemPtr:
    def __init__(self, mem, offset=0):
        self.mem, self.ptr = mem, mem.ptr + offset


class _Stream:
    ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _ndarray(shape, dtype=None, memptr=None, strides=None):
    dtype = np.dtype(dtype)
    if isinstance(memptr, _MemPtr):
        raw = (ctypes.c_uint8 * max(1, memptr.mem.size)).from_address(memptr.ptr)
        buf = np.frombuffer(raw, np.uint8)
    else:
        buf = memptr  # a NumPy array's .data (memoryview)
    return np.ndarray(tuple(shape), dtype=dtype, buffer=buf, strides=strides)


def fake_cupy():
    cuda = types.SimpleNamespace(
        UnownedMemory=_Unowned, MemoryPointer=_MemPtr, get_current_stream=lambda: _Stream(),
        ExternalStream=lambda p: _Stream(), Stream=_Stream,
        runtime=types.SimpleNamespace(getDevice=lambda: 0))
    return types.SimpleNamespace(
        cuda=cuda, ndarray=_ndarray, empty=lambda n, dtype=np.float32: np.empty(n, dtype),
        zeros=lambda n, dtype=np.float32: np.zeros(n, dtype), uint8=np.uint8, uint32=np.uint32,
        float32=np.float32, float64=np.float64, ascontiguousarray=np.ascontiguousarray)


class _Ptr:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class EmuArray:
    """A CuPy array stand-in over a NumPy array: what the legacy layer's CuPy fast paths read
    (``type(buf) is cupy.ndarray``, dtype, contiguity, nbytes, ``data.ptr``)."""

    __slots__ = ("host", "dtype", "nbytes", "data", "_c_contiguous", "_f_contiguous", "flags", "shape", "size",
                 "__weakref__")  # CuPy arrays take weak references (the compiled binder memoizes pointers by them)

    def __init__(self, host: np.ndarray):
        self.host = host
        self.dtype, self.nbytes, self.shape, self.size = host.dtype, host.nbytes, host.shape, host.size
        self.data = _Ptr(host.__array_interface__["data"][0])
        self._c_contiguous, self._f_contiguous = host.flags.c_contiguous, host.flags.f_contiguous
        self.flags = host.flags

    @property
    def __cuda_array_interface__(self):
        i = self.host.__array_interface__
        return {"shape": i["shape"], "typestr": i["typestr"], "data": i["data"], "strides": i["strides"], "version": 3}

    def reshape(self, *a, **k):
        return EmuArray(self.host.reshape(*a, **k))

    def view(self, dtype):
        return EmuArray(self.host.view(dtype))

    def __getitem__(self, i):
        return EmuArray(self.host[i])


_PTRS = itertools.count(0x1000)


class EmuKernel:
    """A compiled kernel stand-in: ``ptr`` names it to the launcher; calling it as CuPy's
    RawKernel runs it (or not, in noop mode)."""

    def __init__(self, spec, emu: "Emu"):
        self.spec, self.emu, self.ptr = spec, emu, next(_PTRS)
        self.lib = kernel_emu.compile_spec(spec) if emu.mode == "emulate" else None
        emu.kernels[self.ptr] = self

    def run_params(self, params_addr: int, grid, block) -> None:
        """Run with cuLaunchKernel's ``kernelParams`` (every entry points at its value); the
        emulator takes pointer parameters by value, the rest by address."""
        self.emu.launches.append(self.spec.name)
        if self.lib is None:
            return
        n = len(self.spec.params)
        src = (ctypes.c_void_p * max(1, n)).from_address(params_addr)
        argv = (ctypes.c_void_p * max(1, n))()
        for i, decl in enumerate(self.spec.params):
            typ = decl.rpartition(" ")[0]
            argv[i] = ctypes.c_uint64.from_address(src[i]).value if "*" in typ else src[i]
        self.lib.cc_launch(argv, *[ctypes.c_uint(v) for v in grid], *[ctypes.c_uint(v) for v in block])

    def __call__(self, grid, block, args, shared_mem=0):
        slots = []
        for a in args:
            slots.append(np.array(a))  # np.uint64 pointers, np.float32 / float64 scalars
        params = (ctypes.c_void_p * max(1, len(slots)))(*[s.ctypes.data for s in slots])
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = tuple(block) + (1,) * (3 - len(block))
        self.run_params(ctypes.addressof(params), g, b)


class _NativeDesc:
    """lib.Descriptor stand-in (what the cached path makes: variant packs)."""
    _next = itertools.count(0x7000000)

    def __init__(self, kind):
        self.kind, self.ptr = kind, next(self._next) * 0x100

    def set(self, attr, attr_type, values):
        return self

    def finalize(self):
        return self

    def destroy(self):
        pass


class _NativeGraph:
    def __init__(self, spec, handle, values=None):
        self.graph = _NativeDesc("OPERATIONGRAPH")

    def destroy(self):
        pass


class NativeEmu:
    """The ``cudnn`` engine over a stand-in libcudnn (see the module docstring); ``executes`` counts
    what a GPU would have run (its CUDA graphs go through ``Emu``'s stand-in of ``engines.graphs``,
    which counts ``captures`` and ``graph_launches``)."""

    def __init__(self):
        from cudnn_compat._backend.engines.base import EngineConfig
        from cudnn_compat._backend.engines.cudnn_engine import ENGINE, lib, plan as plan_mod
        self.executes = 0
        self._saved_engine = {k: ENGINE.__dict__.get(k) for k in ("available", "configs", "build")}
        self._saved_lib = (lib.load, lib.Descriptor, lib.handle_for, dict(lib._handles))
        self._saved_plan = (plan_mod.NativeGraph, plan_mod._configs.execution_plan)
        lib_ns = types.SimpleNamespace(cudnnBackendExecute=self._execute)
        lib.load = lambda: lib_ns
        lib.Descriptor = _NativeDesc
        lib._handles[0] = [0xAB, 0]

        def handle_for(device, stream_ptr=0):
            lib._handles.setdefault(device, [0xAB, 0])[1] = stream_ptr
            return lib._handles[device][0]
        lib.handle_for = handle_for
        plan_mod.NativeGraph = _NativeGraph

        def execution_plan(lib_, handle, graph, config):  # a native plan per set of baked alpha/beta values
            d = _NativeDesc("EXECUTION_PLAN")
            return d, 0, [d]
        plan_mod._configs.execution_plan = execution_plan
        cfg = EngineConfig("cudnn", (), frozenset({"DETERMINISTIC"}), 0)

        def build(graph, config):
            from cudnn_compat._backend.engines.cudnn_engine import _state
            from cudnn_compat._backend.engines.base import EngineDeclined
            st = _state(graph)
            if not st.candidates:
                raise EngineDeclined("cudnn", st.reason)
            spec = st.spec
            base = _NativeDesc("EXECUTION_PLAN")
            return plan_mod.CudnnPlan(graph, config, spec, 0, _NativeGraph(spec, 0), base, 0, [base],
                                      spec.representative())
        ENGINE.available = lambda: None
        ENGINE.configs = lambda graph, place, mode: [cfg]
        ENGINE.build = build
        self.engine, self.lib, self.plan_mod = ENGINE, lib, plan_mod

    def _execute(self, handle, plan, vp):
        self.executes += 1
        return 0

    def restore(self):
        for k, v in self._saved_engine.items():
            if v is None:
                self.engine.__dict__.pop(k, None)
            else:
                setattr(self.engine, k, v)
        lib = self.lib
        lib.load, lib.Descriptor, lib.handle_for, handles = self._saved_lib
        lib._handles.clear()
        lib._handles.update(handles)
        pm = self.plan_mod
        pm.NativeGraph, pm._configs.execution_plan = self._saved_plan


class Emu:
    """Install the stand-ins; ``mode``: 'emulate' (kernels run on the CPU) or 'noop'; ``cudnn``: the
    native engine over a stand-in libcudnn too (``NativeEmu``; nothing runs)."""

    def __init__(self, mode: str = "emulate", cudnn: bool = False):
        self.mode = mode
        self.native = NativeEmu() if cudnn else None
        self.kernels: dict = {}
        self.launches: list = []
        self._fns: dict = {}
        self._saved = (runtime.cupy, runtime.function, list(runtime.LAUNCH), list(_base.STREAM_PTR),
                       cupy_engine._unavailable, list(_graphs.GRAPHS))
        self._capture = None
        self.graphs: dict = {}
        self.captures = self.graph_launches = 0
        _graphs.GRAPHS[0] = types.SimpleNamespace(capture=self.capture, launch=self.glaunch, destroy=self.gdestroy,
                                                  capturing=lambda s: False, capture_stream=lambda device=None: -7,
                                                  launch_function=lambda: self.glaunch,
                                                  replay_form=lambda exe, stream: exe)
        cp = fake_cupy()
        runtime.cupy = lambda: cp
        runtime.function = self.function
        runtime.LAUNCH[0] = self.launch
        _base.STREAM_PTR[0] = lambda: 0
        cupy_engine._unavailable = lambda: None
        from cudnn_compat._core import data as _data
        self._nd_saved = list(_data._CUPY_NDARRAY)
        nd = EmuArray  # device arrays of the emulated GPU place
        _data._CUPY_NDARRAY[:] = [nd]
        # ``import cupy`` inside the legacy layer's GPU checks finds this stand-in (restored after)
        mod = types.ModuleType("cupy")
        mod.ndarray, mod.uint8 = nd, np.uint8
        mod.from_dlpack = lambda x: (_ for _ in ()).throw(TypeError("no DLPack on the emulated GPU"))
        self._mod_saved = sys.modules.get("cupy")
        sys.modules["cupy"] = mod

    def function(self, spec):
        k = self._fns.get(spec.name)
        if k is None:
            k = self._fns[spec.name] = EmuKernel(spec, self)
        return k

    def launch(self, f, gx, gy, gz, bx, by, bz, shm, stream, params, extra):
        if self._capture is not None:  # a graph node: the argument values as they are now
            k = self.kernels[f]
            n = max(1, len(k.spec.params))
            src = (ctypes.c_void_p * n).from_address(params)
            vals = (ctypes.c_uint64 * n)(*[ctypes.c_uint64.from_address(src[i]).value for i in range(n)])
            arr = (ctypes.c_void_p * n)(*[ctypes.addressof(vals) + 8 * i for i in range(n)])
            self._capture.append((f, (gx, gy, gz), (bx, by, bz), vals, arr))
            return
        self.kernels[f].run_params(params, (gx, gy, gz), (bx, by, bz))

    # -- CUDA graphs (engines.graphs) -----------------------------------------------------------------
    def capture(self, launch_all, device=None, as_kernels=False) -> int:  # as_kernels: graphs replay as graphs
        self._capture = []
        try:
            launch_all(-7)
            nodes = self._capture
        finally:
            self._capture = None
        gid = next(_PTRS)
        self.graphs[gid] = nodes
        self.captures += 1
        return gid

    def glaunch(self, exe, stream) -> None:
        self.graph_launches += 1
        for f, grid, block, _vals, arr in self.graphs[exe]:
            self.kernels[f].run_params(ctypes.addressof(arr), grid, block)

    def gdestroy(self, exe) -> None:
        del self.graphs[exe]

    def handle(self):
        """A handle of the GPU place (device 0) without CUDA."""
        import cudnn_compat as cc
        h = cc.cudnnCreate("cpu")
        h.place = "gpu"
        h.touched()
        return h

    def restore(self):
        if self.native is not None:
            self.native.restore()
        (runtime.cupy, runtime.function, launch, stream, cupy_engine._unavailable, graphs) = self._saved
        _graphs.GRAPHS[:] = graphs
        runtime.LAUNCH[:] = launch
        _base.STREAM_PTR[:] = stream
        from cudnn_compat._core import data as _data
        _data._CUPY_NDARRAY[:] = self._nd_saved
        if self._mod_saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = self._mod_saved
        from cudnn_compat._backend.plan_cache import CACHE
        CACHE.clear()


def ptr(a: np.ndarray) -> int:
    """A NumPy array's address, the "device pointer" of the emulated GPU place."""
    return a.__array_interface__["data"][0]
