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

The CUDA runtime is CuPy's (``cupy.cuda.runtime``) unless the ``Graphs`` is made with another
``runtime`` (an object with the same calls) and ``stream`` (device -> the side stream's handle):
that is how the CPU tests' stand-ins (tests/host_emu.py, tests/test_cudnn_engine.py) put
themselves in, by setting ``GRAPHS[0]``.
"""
from __future__ import annotations

import logging
import threading

from .. import steady as _steady

log = logging.getLogger("cudnn_compat.graphs")
log.addHandler(logging.NullHandler())


class Graphs:
    """Capture, replay and free CUDA graphs (see the module docstring)."""

    def __init__(self, runtime=None, stream=None):
        self._rt = runtime
        self._stream = stream
        self._streams: dict = {}  # device -> the cupy Stream captures run on
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

    def capture(self, launch_all, device: "int | None" = None) -> int:
        """The graphExec of ``launch_all(stream)`` run under capture on the side stream; raises
        when the work cannot be captured (the capture is always ended)."""
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
            return rt.graphInstantiate(graph)
        finally:
            if graph:
                try:
                    rt.graphDestroy(graph)
                except Exception:  # noqa: BLE001 - the instantiated graph does not need it
                    pass

    def launch(self, exe: int, stream: int) -> None:
        self.runtime().graphLaunch(exe, stream)

    def launch_function(self):
        """``launch`` as the runtime's own call (what a replay path keeps and calls)."""
        return self.runtime().graphLaunch

    def launch_address(self) -> "int | None":
        """cuGraphLaunch's address, for compiled launchers, where ``launch`` is the CUDA driver's own
        (the runtime is CuPy's); None otherwise."""
        return _steady.graph_launch_address(self._rt if self._rt is not None else self.runtime())

    def error_type(self):
        """The exception a failed driver call raises (CuPy's CUDADriverError)."""
        import cupy
        return cupy.cuda.driver.CUDADriverError

    def destroy(self, exe: int) -> None:
        try:
            self.runtime().graphExecDestroy(exe)
        except Exception:  # noqa: BLE001 - a graph that cannot be destroyed is left to the driver
            pass

    def capturing(self, stream: int) -> bool:
        return bool(stream) and bool(self.runtime().streamIsCapturing(stream))


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
