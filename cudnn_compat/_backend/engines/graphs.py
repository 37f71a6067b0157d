"""CUDA-graph capture, the one implementation every engine uses (issue 26 item 3; 000 "CUDA
graphs" of the frontend guide, cudaStreamBeginCapture / cudaGraphInstantiate / cudaGraphLaunch).

Who captures what:

  cupy engine, launch records  (cupy_engine/records.py)  a record's kernel launches
  cupy engine, programs        (cupy_engine/program.py)  an RNN recurrence's GEMMs and kernels
  cudnn engine                 (cudnn_engine/plan.py)    one cudnnBackendExecute
  fused attention              (cudnn_compat/attention)  a call's GEMMs and SDPA executes

Each asks ``graphs().capture(launch_all)``: ``launch_all(stream)`` runs the work once on a side
stream of the current device under stream capture (relaxed mode: capturing runs nothing), and the
result is the instantiated graph (a graphExec handle, an int) that ``launch(exe, stream)``
replays on the caller's stream and ``destroy(exe)`` frees.  ``capturing(stream)`` says whether
the caller is itself capturing that stream (its work then goes into the caller's graph, not ours).

A captured graph of a few kernel launches may replay as those launches instead
on the legacy default stream (``capture(..., as_kernels=True)``, the cudnn engine's calls;
``CUDNN_COMPAT_GRAPH_REPLAY``): ``kernels_of`` reads its nodes once (kernel and memset nodes, an
order its edges allow, each kernel's configuration, launch attributes and parameter bytes) into a
``_steady.Kernels``, and ``launch`` calls that (cuLaunchKernelEx per kernel) rather than
cuGraphLaunch.  Why: launching distinct graphs in turn on the legacy default stream cost 29 us of
host time and 46 us of GPU time each on some hosts (benchmarks/launch_paths.py ``graph_400``; 4 us
on others) and, with a full queue, 78 us of GPU time per launch of a 43 us kernel where the kernel
launched directly took 43 (H200, this module's session), while kernel launches cost what they cost
everywhere; the ResNet-50 step at batch 1 replays 161 such graphs.  Results are bitwise those of
the graph (the step's gradients, H200).  Other streams keep the graph launch.

The CUDA runtime is CuPy's (``cupy.cuda.runtime``) unless the ``Graphs`` is made with another
``runtime`` (an object with the same calls) and ``stream`` (device -> the side stream's handle):
that is how the CPU tests' stand-ins (tests/host_emu.py, tests/test_cudnn_engine.py) put
themselves in, by setting ``GRAPHS[0]``.
"""
from __future__ import annotations

import ctypes
import logging
import threading

from .. import config as _config
from .. import steady as _steady

log = logging.getLogger("cudnn_compat.graphs")
log.addHandler(logging.NullHandler())


class Graphs:
    """Capture, replay and free CUDA graphs (see the module docstring)."""

    def __init__(self, runtime=None, stream=None, driver=None):
        self._rt = runtime
        self._stream = stream
        self._driver = driver  # what reads a captured graph's nodes (``Driver``), for ``as_kernels``
        self._streams: dict = {}  # device -> the cupy Stream captures run on
        self._kernels: dict = {}  # graphExec -> its launches (a _steady.Kernels), where captured as_kernels
        self._lock = threading.Lock()

    def runtime(self):
        rt = self._rt
        if rt is None:
            import cupy
            rt = self._rt = cupy.cuda.runtime
        return rt

    def capture_stream(self, device: "int | None" = None) -> int:
        """The handle of the side stream captures run on, for ``device`` (default: the current one)."""
        if self._stream is not None:
            return self._stream(device)
        import cupy
        dev = cupy.cuda.runtime.getDevice() if device is None else device
        cap = self._streams.get(dev)
        if cap is None:
            with self._lock:
                cap = self._streams.get(dev)
                if cap is None:
                    with cupy.cuda.Device(dev):
                        cap = self._streams[dev] = cupy.cuda.Stream(non_blocking=True)
        return cap.ptr

    def capture(self, launch_all, device: "int | None" = None, as_kernels: bool = False) -> int:
        """The graphExec of ``launch_all(stream)`` run under capture on the side stream; raises
        when the work cannot be captured (the capture is always ended).  ``as_kernels``: ``launch``
        replays it as its launches where ``kernels_of`` can read them (module docstring)."""
        rt = self.runtime()
        cap = self.capture_stream(device)
        graph = 0
        try:
            rt.streamBeginCapture(cap)
            try:
                launch_all(cap)
            finally:
                graph = rt.streamEndCapture(cap)
            if not graph:
                raise RuntimeError("stream capture returned no graph")
            exe = rt.graphInstantiate(graph)
            if as_kernels and _config.get("CUDNN_COMPAT_GRAPH_REPLAY") == "kernels":
                kernels = self._read_kernels(graph)
                if kernels is not None:
                    self._kernels[exe] = kernels
            return exe
        finally:
            if graph:
                try:
                    rt.graphDestroy(graph)
                except Exception:  # noqa: BLE001 - the instantiated graph does not need it
                    pass

    def driver(self) -> "Driver | None":
        """What reads captured graphs for ``as_kernels``: the one given, else the CUDA driver's own
        where graphs are CuPy's (a CUgraph is then the driver's); None: graphs replay as graphs."""
        if self._driver is None and _steady.graph_launch_address(self.runtime()) is not None:
            self._driver = Driver()
        return self._driver

    def _read_kernels(self, graph: int):
        mod = _steady.module()
        try:
            drv = self.driver() if mod is not None else None
            if drv is None:
                return None
            return kernels_of(graph, drv, mod, self.error_type())
        except Exception as e:  # noqa: BLE001 - a graph not read replays as a graph
            log.debug("captured graph not read as launches: %s: %s", type(e).__name__, e)
            return None

    def replay_form(self, exe: int, stream: int):
        """What a replay table keeps for ``exe`` replayed on ``stream``: its launches (a
        _steady.Kernels) on the legacy default stream where it was read as launches, else the graphExec."""
        return self._kernels.get(exe, exe) if stream in LEGACY_STREAMS else exe

    def launch(self, exe, stream: int) -> None:
        """Replay ``exe`` (a graphExec, or ``replay_form``'s launches) on ``stream``."""
        if type(exe) is not int:
            kernels = exe
        else:
            kernels = self._kernels.get(exe) if stream in LEGACY_STREAMS else None
        if kernels is None:
            self.runtime().graphLaunch(exe, stream)
        else:
            kernels(stream)

    def launch_function(self):
        """``launch`` as the runtime's own call (what a replay path keeps and calls)."""
        return self.runtime().graphLaunch

    def launch_address(self) -> "int | None":
        """cuGraphLaunch's address, for compiled launchers, where ``launch`` is the CUDA driver's own
        (the runtime is CuPy's); None otherwise."""
        return _steady.graph_launch_address(self._rt if self._rt is not None else self.runtime())

    def error_type(self):
        """The exception a failed driver call raises: CuPy's CUDADriverError (RuntimeError with a
        stand-in runtime)."""
        if _steady.graph_launch_address(self.runtime()) is None:
            return RuntimeError
        import cupy
        return cupy.cuda.driver.CUDADriverError

    def destroy(self, exe: int) -> None:
        self._kernels.pop(exe, None)
        try:
            self.runtime().graphExecDestroy(exe)
        except Exception:  # noqa: BLE001 - a graph that cannot be destroyed is left to the driver
            pass

    def capturing(self, stream: int) -> bool:
        return bool(stream) and bool(self.runtime().streamIsCapturing(stream))


def replay_launcher(box: list, stats: dict, fallback, given=None):
    """A plan's ``launch(values, stream, workspace=None, workspace_size=0) -> bool`` over its replay
    table, the one replay path of every engine that replays captured graphs (the cudnn engine's
    plans, the cupy engine's programs): the compiled ``_steady.Replay`` (one table look of
    ``(values, stream)`` and one cuGraphLaunch, or the graph's launches) where the extension is
    built and graphs launch through the CUDA driver, ``fallback`` (its Python twin, which the
    Replay calls for everything else) otherwise.

    ``box``: [table, unseen], the table ``(values, stream) -> (graphExec or replay_form's launches,
    workspace need, the caller's workspace pointer it uses or 0)``, which its owner replaces by a
    new dict before it destroys any graph in it; ``stats``: a dict whose "graph_launches" the
    Replay counts; ``given(workspace, size, need)``: the caller's workspace pointer (only asked for
    an entry that needs a workspace)."""
    mod = _steady.module()
    gr = graphs()
    address = getattr(gr, "launch_address", None)
    try:
        address = address() if mod is not None and address is not None else None
    except ImportError:  # no CuPy (a plan built on a machine without one, e.g. to check kernel source)
        address = None
    if address is None:
        return fallback
    from .base import current_stream_function
    cur = current_stream_function()
    return mod.Replay(box, getattr(cur, "stream", cur), gr.capturing, stats, fallback, address, gr.error_type(),
                      given if given is not None else _no_workspace)


def _no_workspace(workspace, size, need) -> int:
    return 0


GRAPHS: list = [None]


def graphs() -> Graphs:
    g = GRAPHS[0]
    if g is None:
        g = GRAPHS[0] = Graphs()
    return g


def capture_failed(what: str, exc: BaseException) -> None:
    """Log a capture that raised, with its traceback: the caller goes on without the graph
    (correct, slower), and a broken capture path must show."""
    log.warning("%s: CUDA graph capture failed (%s: %s); running without a graph", what,
                type(exc).__name__, exc, exc_info=exc)


# -- a captured graph as its launches --------------------------------------------------------------
# cuda.h: CUgraphNodeType, CUlaunchAttributeID, CUlaunchConfig, CUlaunchAttribute, CUDA_KERNEL_NODE_PARAMS_v2,
# CUDA_MEMSET_NODE_PARAMS, CUgraphEdgeData.

LEGACY_STREAMS = (0, 1)  # 0 and CU_STREAM_LEGACY: where a graph replays as its launches
KERNELS_MAX = 4  # launches a graph may have to replay as launches (a longer one costs less as one graph)
NODE_KERNEL, NODE_MEMSET, NODE_EMPTY = 0, 2, 5
# launch attributes a kernel node may carry that a launch takes as they are (ACCESS_POLICY_WINDOW,
# COOPERATIVE, CLUSTER_DIMENSION, CLUSTER_SCHEDULING_POLICY_PREFERENCE, PRIORITY, MEM_SYNC_DOMAIN_MAP,
# MEM_SYNC_DOMAIN, PREFERRED_CLUSTER_DIMENSION, PREFERRED_SHARED_MEMORY_CARVEOUT,
# NVLINK_UTIL_CENTRIC_SCHEDULING); one the driver does not answer for a node is not set on it
LAUNCH_ATTRIBUTES = (1, 2, 4, 5, 8, 9, 10, 11, 14, 16)
GRAPH_ONLY_ATTRIBUTES = (13,)  # DEVICE_UPDATABLE_KERNEL_NODE: such a node replays as a graph


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("shm", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("nattrs", ctypes.c_uint)]


class KernelRecord(ctypes.Structure):
    """_steady.c's kernel_record: kind 0 a kernel (config, f, params), 1/2/4 a memset of that
    element size (dst, pitch, width, height, value)."""
    _fields_ = [("kind", ctypes.c_int), ("config", LaunchConfig), ("f", ctypes.c_void_p), ("params", ctypes.c_void_p),
                ("dst", ctypes.c_ulonglong), ("pitch", ctypes.c_size_t), ("width", ctypes.c_size_t),
                ("height", ctypes.c_size_t), ("value", ctypes.c_uint)]


class _KernelNode(ctypes.Structure):
    _fields_ = [("func", ctypes.c_void_p), ("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
                ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("shm", ctypes.c_uint),
                ("params", ctypes.c_void_p), ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p),
                ("ctx", ctypes.c_void_p)]


class _MemsetNode(ctypes.Structure):
    _fields_ = [("dst", ctypes.c_ulonglong), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("esize", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


class _Edge(ctypes.Structure):
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


class Driver:
    """The CUDA driver calls that read a captured graph (libcuda through ctypes); the CPU tests give
    ``Graphs`` a stand-in with the same methods."""

    def __init__(self):
        self._cu = cu = _steady.libcuda()
        self._param_info = (getattr(cu, "cuFuncGetParamInfo", None), getattr(cu, "cuKernelGetParamInfo", None))

    def _ok(self, status: int, what: str) -> None:
        if status:
            raise RuntimeError(f"{what} returned CUresult {status}")

    def nodes(self, graph: int) -> list:
        n = ctypes.c_size_t(0)
        self._ok(self._cu.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(n)), "cuGraphGetNodes")
        arr = (ctypes.c_void_p * max(n.value, 1))()
        self._ok(self._cu.cuGraphGetNodes(ctypes.c_void_p(graph), arr, ctypes.byref(n)), "cuGraphGetNodes")
        return [arr[i] for i in range(n.value)]

    def edges(self, graph: int) -> list:
        """[(from node, to node, edge type)] (type 0: the default, full dependency)."""
        n = ctypes.c_size_t(0)
        self._ok(self._cu.cuGraphGetEdges_v2(ctypes.c_void_p(graph), None, None, None, ctypes.byref(n)),
                 "cuGraphGetEdges_v2")
        k = max(n.value, 1)
        a, b, d = (ctypes.c_void_p * k)(), (ctypes.c_void_p * k)(), (_Edge * k)()
        if n.value:
            self._ok(self._cu.cuGraphGetEdges_v2(ctypes.c_void_p(graph), a, b, d, ctypes.byref(n)),
                     "cuGraphGetEdges_v2")
        return [(a[i], b[i], d[i].type) for i in range(n.value)]

    def node_type(self, node: int) -> int:
        t = ctypes.c_int()
        self._ok(self._cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t)), "cuGraphNodeGetType")
        return t.value

    def kernel(self, node: int) -> dict:
        p = _KernelNode()
        self._ok(self._cu.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)),
                 "cuGraphKernelNodeGetParams_v2")
        return {"func": p.func or 0, "kern": p.kern or 0, "grid": (p.gx, p.gy, p.gz), "block": (p.bx, p.by, p.bz),
                "shm": p.shm, "params": p.params or 0, "extra": p.extra or 0}

    def attribute(self, node: int, attr: int) -> "bytes | None":
        v = (ctypes.c_ubyte * 64)()
        if self._cu.cuGraphKernelNodeGetAttribute(ctypes.c_void_p(node), ctypes.c_int(attr), ctypes.byref(v)):
            return None
        return bytes(v)

    def memset(self, node: int) -> tuple:
        m = _MemsetNode()
        self._ok(self._cu.cuGraphMemsetNodeGetParams(ctypes.c_void_p(node), ctypes.byref(m)),
                 "cuGraphMemsetNodeGetParams")
        return m.dst, m.pitch, m.value, m.esize, m.width, m.height

    def param_layout(self, func: int, kern: int) -> "list | None":
        """[(offset, size)] of the kernel's parameters; None where the driver cannot tell (before 12.4)."""
        fn = self._param_info[0] if func else self._param_info[1]
        if fn is None:
            return None
        out = []
        while True:
            off, size = ctypes.c_size_t(), ctypes.c_size_t()
            st = fn(ctypes.c_void_p(func or kern), ctypes.c_size_t(len(out)), ctypes.byref(off), ctypes.byref(size))
            if st == 1:  # CUDA_ERROR_INVALID_VALUE: past the last parameter
                return out
            if st:
                return None
            out.append((off.value, size.value))

    def function_of(self, kern: int) -> int:
        f = ctypes.c_void_p()
        self._ok(self._cu.cuKernelGetFunction(ctypes.byref(f), ctypes.c_void_p(kern)), "cuKernelGetFunction")
        return f.value

    def read(self, params: int, index: int, size: int) -> bytes:
        """``size`` bytes of parameter ``index`` of a kernelParams array (void **) at ``params``."""
        return ctypes.string_at(ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[index], size)

    def addresses(self) -> tuple:
        """(cuLaunchKernelEx, cuMemsetD2D8Async, cuMemsetD2D16Async, cuMemsetD2D32Async): the legacy-stream forms."""
        cu = self._cu
        return tuple(ctypes.cast(getattr(cu, n), ctypes.c_void_p).value for n in
                     ("cuLaunchKernelEx", "cuMemsetD2D8Async", "cuMemsetD2D16Async", "cuMemsetD2D32Async"))


class NotLaunches(Exception):
    """A captured graph that replays as a graph (its reason)."""


def _order(nodes: list, edges: list) -> list:
    """The nodes in an order the edges allow (one stream runs them in turn: every dependency kept)."""
    at = {n: i for i, n in enumerate(nodes)}
    indeg, succ = [0] * len(nodes), [[] for _ in nodes]
    for a, b, kind in edges:
        if kind:
            raise NotLaunches(f"an edge of type {kind} (programmatic)")
        succ[at[a]].append(at[b])
        indeg[at[b]] += 1
    ready = [i for i, d in enumerate(indeg) if d == 0]
    out = []
    while ready:
        i = ready.pop(0)
        out.append(nodes[i])
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(out) != len(nodes):
        raise NotLaunches("a cycle")
    return out


def _kernel_record(drv, node: int, keep: list) -> KernelRecord:
    k = drv.kernel(node)
    if k["extra"]:
        raise NotLaunches("a kernel given its parameters by 'extra'")
    if not (k["func"] or k["kern"]):
        raise NotLaunches("a kernel node without its function")
    layout = drv.param_layout(k["func"], k["kern"])
    if layout is None:
        raise NotLaunches("the driver does not tell the kernel's parameter layout")
    if layout and not k["params"]:
        raise NotLaunches("a kernel node without its parameters")
    buf = (ctypes.c_ubyte * max([o + s for o, s in layout] or [1]))()
    ptrs = (ctypes.c_void_p * max(len(layout), 1))()
    for i, (off, size) in enumerate(layout):
        data = drv.read(k["params"], i, size)
        ctypes.memmove(ctypes.addressof(buf) + off, data, size)
        ptrs[i] = ctypes.addressof(buf) + off
    attrs = []
    for a in GRAPH_ONLY_ATTRIBUTES + LAUNCH_ATTRIBUTES:
        v = drv.attribute(node, a)
        if v is None or not any(v):
            continue
        if a in GRAPH_ONLY_ATTRIBUTES:
            raise NotLaunches(f"launch attribute {a} is a graph node's only")
        la = LaunchAttribute(id=a)
        ctypes.memmove(la.value, v, 64)
        attrs.append(la)
    arr = (LaunchAttribute * len(attrs))(*attrs) if attrs else None
    keep += [buf, ptrs, arr]
    cfg = LaunchConfig(*k["grid"], *k["block"], k["shm"], None, ctypes.addressof(arr) if attrs else None, len(attrs))
    return KernelRecord(kind=0, config=cfg, f=k["func"] or drv.function_of(k["kern"]), params=ctypes.addressof(ptrs))


def kernels_of(graph: int, drv, mod, error):
    """A captured graph's launches as a ``_steady.Kernels`` (``mod``: the extension), or None where
    it replays as a graph: a node that is not a kernel, a memset or empty, a non-default edge, a
    kernel with parameters given by 'extra' or of a layout the driver does not tell, a graph-only
    attribute, more than KERNELS_MAX launches."""
    try:
        nodes = drv.nodes(graph)
        recs, keep = [], []
        for node in _order(nodes, drv.edges(graph)):
            t = drv.node_type(node)
            if t == NODE_EMPTY:
                continue
            if len(recs) == KERNELS_MAX:
                raise NotLaunches(f"more than {KERNELS_MAX} launches")
            if t == NODE_KERNEL:
                recs.append(_kernel_record(drv, node, keep))
            elif t == NODE_MEMSET:
                dst, pitch, value, esize, width, height = drv.memset(node)
                if esize not in (1, 2, 4):
                    raise NotLaunches(f"a memset of element size {esize}")
                recs.append(KernelRecord(kind=esize, dst=dst, pitch=pitch, width=width, height=height, value=value))
            else:
                raise NotLaunches(f"a node of type {t}")
        if not recs:
            raise NotLaunches("no launches")
    except NotLaunches as e:
        log.debug("captured graph replays as a graph: %s", e)
        return None
    table = (KernelRecord * len(recs))(*recs)
    keep.append(table)
    return mod.Kernels(ctypes.addressof(table), len(recs), keep, drv.addresses(), error)
