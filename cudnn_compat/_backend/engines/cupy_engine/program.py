"""A *program*: the cuBLAS GEMMs and kernel launches of one op, built once per plan in pure Python
(rnn.py builds those of the recurrence ops), and ``ProgramRun``, which runs one inside a cupy
plan.  The first call with a given set of buffer addresses runs eagerly (every kernel compiled,
scratch allocated); the next call captures the whole step loop into a CUDA graph, later calls
replay it (one launch per layer); addresses, stream and by-value scalars key the graphs
(``CUDNN_COMPAT_RNN_GRAPHS=0`` turns capture off)."""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import numpy as np

from ... import config as _config
from . import runtime
from .. import graphs as _graphs
from ..base import current_stream_function
from .codegen import KernelSpec
from .cublas import Cublas, Gemm


@dataclass
class Launch:
    """A kernel launch; ``args`` per parameter: ('ref', buffer, element offset), ('int', v),
    ('scalar', role) (a by-value input, as the spec's float type)."""

    spec: KernelSpec
    args: list
    skip_if_same: tuple = ()  # (buffer, buffer): skipped when both name the same memory


@dataclass
class Program:
    buffers: dict  # name -> dtype, for roles (op tensors) and scratch
    scratch: dict  # name -> element count
    consts: dict  # name -> NumPy array (uploaded once)
    roles: dict  # name -> Tensor of the op
    scalars: tuple  # by-value roles read
    instrs: list = field(default_factory=list)

    def kernels(self) -> list:
        seen, out = set(), []
        for ins in self.instrs:
            if isinstance(ins, Launch) and ins.spec.name not in seen:
                seen.add(ins.spec.name)
                out.append(ins.spec)
        return out


# -- running programs on the GPU ---------------------------------------------------------------------

_SCALAR = {"float": np.float32, "double": np.float64}


class _Entry:
    __slots__ = ("steps", "scratch", "graph", "uses")

    def __init__(self, steps, scratch):
        self.steps, self.scratch, self.graph, self.uses = steps, scratch, None, 0


class ProgramRun:
    """Runs a Program inside a cupy plan: resolve addresses, then eager / capture / replay."""

    MAX_GRAPHS = 8

    def __init__(self, prog: Program, op):
        self.prog, self.op = prog, op
        self.uids = {role: t.uid for role, t in op.inputs.items()}
        self.uids.update({role: t.uid for role, t in op.outputs.items()})
        self.cache: "collections.OrderedDict" = collections.OrderedDict()
        self.consts: dict = {}
        self.lock = threading.Lock()
        self._boxes: list = []  # the launchers' [replay table, unseen] (``launcher``)
        self.stats = {"graph_launches": 0}  # graphs launched by the launchers
        self._roles = None  # ((role, uid) of the buffers, sorted), ((role, uid) of the by-value scalars)

    def kernels(self) -> list:
        return self.prog.kernels()

    def _resolve(self, ptrs: dict, scalars: dict, scratch: dict) -> tuple:
        """Instructions -> (steps with every argument fixed, the cuBLAS handle)."""
        from ... import dtypes
        size = {name: dtypes.itemsize(dt) for name, dt in self.prog.buffers.items()}
        base = dict(ptrs)
        base.update({k: int(v.data.ptr) for k, v in scratch.items()})
        base.update({k: int(v.data.ptr) for k, v in self.consts.items()})

        def addr(ref):
            return base[ref[0]] + ref[1] * size[ref[0]]
        blas = Cublas.get()
        steps = []
        for ins in self.prog.instrs:
            if isinstance(ins, Gemm):
                bt = self.prog.buffers
                steps.append(("gemm", ins, addr(ins.a), bt[ins.a[0]], addr(ins.b), bt[ins.b[0]], addr(ins.c), bt[ins.c[0]]))
                continue
            if ins.skip_if_same and base[ins.skip_if_same[0]] == base[ins.skip_if_same[1]]:
                continue
            args = []
            for a, decl in zip(ins.args, ins.spec.params):
                if a[0] == "ref":
                    args.append(np.uint64(addr(a[1:])))
                elif a[0] == "int":
                    args.append(np.int64(a[1]))
                else:
                    args.append(_SCALAR[decl.split()[0]](float(scalars[a[1]])))
            steps.append(("kernel", runtime.function(ins.spec), ins.spec.grid, ins.spec.block, tuple(args)))
        return steps, blas

    def _execute(self, steps, blas, stream_ptr: int) -> None:
        from .gemm import _LOCK  # the cuBLAS handle is shared with the engine's matmuls
        with _LOCK:
            blas.set_stream(stream_ptr)
            for s in steps:
                if s[0] == "gemm":
                    blas.gemm(*s[1:])
                else:
                    s[1](s[2], s[3], s[4])
                    runtime.LAUNCHES[0] += 1

    def run(self, env, ctx) -> None:
        """One call: the entry of (stream, buffer addresses, scalar values), made on a miss (steps
        resolved, scratch allocated); eager the first time, then captured and replayed."""
        sptr = runtime.stream_ptr(None)  # the plan's execute runs this on the call's stream
        roles = self.roles()
        ptr = runtime.pointer
        addrs = tuple([ptr(env[u]) for _r, u in roles[0]])
        svals = tuple([float(env[u]) for _r, u in roles[1]])
        key = (sptr, addrs, svals)
        with self.lock:
            entry = self.cache.get(key)
            if entry is not None:
                self.cache.move_to_end(key)
        if entry is None:
            cp = runtime.cupy()
            if not self.consts:
                self.consts = {k: cp.asarray(v) for k, v in self.prog.consts.items()}
            scratch = {k: cp.empty(n, dtype=np.dtype(_np_dtype(self.prog.buffers[k])))
                       for k, n in self.prog.scratch.items()}
            steps, blas = self._resolve(dict(zip([r for r, _u in roles[0]], addrs)),
                                        dict(zip([r for r, _u in roles[1]], svals)), scratch)
            entry = _Entry((steps, blas), scratch)
            with self.lock:
                self.cache[key] = entry
                while len(self.cache) > self.MAX_GRAPHS:
                    self._forget()
                    _drop(self.cache.popitem(last=False)[1])
        steps, blas = entry.steps
        entry.uses += 1
        gr = _graphs.graphs()
        capturing = gr.capturing(sptr)
        if entry.graph is None and entry.uses >= 2 and not capturing and _graphs_enabled():
            entry.graph = self._capture(steps, blas, gr)
        if entry.graph and entry.graph > 0 and not capturing:
            gr.launch(entry.graph, sptr)
        else:
            self._execute(steps, blas, sptr)

    def roles(self) -> tuple:
        """((role, uid) of the buffers, by role), ((role, uid) of the by-value scalars, by role):
        the order of a call's key."""
        roles = self._roles
        if roles is None:
            roles = self._roles = (tuple(sorted((r, u) for r, u in self.uids.items()
                                                if not self.prog.roles[r].is_by_value)),
                                   tuple((r, self.uids[r]) for r in sorted(self.prog.scalars)))
        return roles

    def launcher(self, order: tuple):
        """The plan's ``launch(values, stream, workspace=None, workspace_size=0) -> bool`` (the
        engine's side of a prepared call, ``engines/base.py``), the values in ``order`` (uids):
        replay the CUDA graph of a call seen before with these addresses, scalars and stream; False
        (nothing done) when there is none yet, a value is not an address, or the stream is being
        captured: the plan's execute then runs the call (and captures it on its second time).
        The compiled replay (``graphs.replay_launcher``) answers from a replay table of
        ``(values, stream)`` that its Python twin below fills when it launches a graph (such a call
        no longer moves its entry up the LRU of graphs), and that ``_forget`` empties before a
        graph is destroyed."""
        pos = {u: i for i, u in enumerate(order)}
        roles = self.roles()
        bufs = tuple(pos[u] for _r, u in roles[0])
        scal = tuple(pos[u] for _r, u in roles[1])
        cache, lock, gr = self.cache, self.lock, _graphs.graphs()  # no runtime touched until a call
        cur, graph_launch = [], []
        box = [{}, 0]  # [replay table, unseen] (graphs.replay_launcher)
        self._boxes.append(box)
        stats = self.stats

        def launch(values, stream, workspace=None, workspace_size=0):
            if stream is None:
                if not cur:
                    cur.append(current_stream_function())
                sptr = cur[0]()
            else:
                sptr = stream if type(stream) is int else int(stream.ptr)
            addrs = tuple([values[i] for i in bufs])
            for a in addrs:
                if type(a) is not int:
                    return False
            try:
                key = (sptr, addrs, tuple([float(values[i]) for i in scal]))
            except (TypeError, ValueError):
                return False
            with lock:  # _forget and release take it too: a graph is never launched after it was destroyed
                entry = cache.get(key)
                if entry is None or entry.graph is None or entry.graph <= 0 or (sptr and gr.capturing(sptr)):
                    return False
                if len(cache) > 1:
                    cache.move_to_end(key)
                if not graph_launch:
                    graph_launch.append(gr.launch_function())
                graph_launch[0](entry.graph, sptr)
                stats["graph_launches"] += 1
                table = box[0]
                if len(table) >= 4 * self.MAX_GRAPHS:
                    table = box[0] = {}
                try:  # the compiled replay's entry for this call: the graph itself (its workspace: none)
                    table[(values, sptr)] = (gr.replay_form(entry.graph, sptr), 0, 0)
                except TypeError:  # an unhashable value: the next call comes here again
                    pass
            return True
        return _graphs.replay_launcher(box, stats, launch)

    def _forget(self) -> None:
        """Empty every launcher's replay table (a new dict), before a graph in one is destroyed; under
        ``lock``."""
        for box in self._boxes:
            box[0] = {}

    def _capture(self, steps, blas, gr) -> int:
        """The graphExec of the step loop (``engines.graphs``); -1 when it cannot be captured."""
        cp = runtime.cupy()

        def launch_all(cap: int) -> None:
            with cp.cuda.ExternalStream(cap):  # the kernels launch on the current stream
                self._execute(steps, blas, cap)
        try:
            return gr.capture(launch_all)
        except Exception as e:  # noqa: BLE001 - not capturable here: stay eager (correct, slower), logged
            _graphs.capture_failed(f"the {getattr(self.op, 'kind', '?')} program", e)
            return -1

    def release(self) -> None:
        """Free the captured graphs (the plan left the cache)."""
        with self.lock:
            self._forget()
            for entry in self.cache.values():
                _drop(entry)
            self.cache.clear()


def _drop(entry: "_Entry") -> None:
    if entry.graph and entry.graph > 0:
        _graphs.graphs().destroy(entry.graph)
    entry.graph = -1


def _np_dtype(name: str):
    from ... import dtypes
    return dtypes.storage_dtype(name)


def _graphs_enabled() -> bool:
    return _config.get("CUDNN_COMPAT_RNN_GRAPHS")
