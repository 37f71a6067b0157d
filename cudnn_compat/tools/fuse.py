"""Fusion across legacy calls (docs/tools.md "Fusion across calls").

    with cudnn_compat.fuse(handle):
        cudnnConvolutionForward(h, 1, xd, x, wd, w, cd, algo, ws, wss, 0, yd, y)
        cudnnAddTensor(h, 1, bd, bias, 1, yd, y)
        cudnnActivationForward(h, relu, 1, yd, y, 0, yd, y)
    # y is written here (one conv+bias+relu graph on the native cudnn engine)

Inside the block the deferrable calls (``DEFERRABLE``: convolution, AddTensor bias, activation,
BN inference, OpTensor, pooling, softmax, ...) are validated as usual (errors are raised at the
call, nothing is written) and recorded instead of run.  They are executed at the end of the block,
or at the first legacy call that may need their results (any other compute call, SetStream,
Destroy, Find...: every legacy function but descriptor and query functions), or at
``scope.flush()``: call it before reading an output from Python inside the block.

How the recorded calls become graphs:
  * Dataflow by memory: a call reading the exact buffer region (address, dims, strides, dtype) a
    recorded call wrote reads that value inside the graph.  A value whose region a later call
    overwrites exactly, and that only calls of the same graph read, is a virtual tensor (in the
    compute type); every other value is written to the caller's buffer as the unfused call would
    write it (intermediate outputs the caller can still see are written).
  * Hazards end the run of recorded calls (they are executed first): a partial overlap of a write
    with an earlier read or write, and a write over a region an earlier call read other than
    element-wise at the same index.
  * Scalars equal to 1 are folded away and copies (IDENTITY) collapse, so conv + AddTensor(bias,
    beta=1) + ActivationForward(relu) is exactly the ConvBiasAct graph of 000.
  * The run is split into the fewest graphs for which no engine is worse in heuristics order than
    the calls alone would get: on the GPU conv + bias + activation (+ residual add) goes to the
    native cudnn engine as one runtime-fusion graph, pointwise chains to the cupy engine as one
    kernel, and a second convolution starts a new graph; on the CPU the whole run is one graph.
  * Recipes (graphs + bindings) are cached by the run's signature (the calls' plan-cache keys, the
    dataflow, the scalars that are 1) and their plans live in the plan cache, so a repeated block
    costs one dict lookup and one plan execution per graph.  A graph no engine takes runs as the
    individual calls.
  * A call that ran alone in its last LONE_AFTER flushes is not deferred any more (it runs at once,
    as a non-deferrable call does; ``_run_at_once``), re-probed every REPROBE calls.
  * On the GPU place a fused scope is never slower than its calls unfused: each ``with fuse(h):``
    statement (per first call) is timed fused and plain and then runs the faster way (``_Site``).

Don't modify inputs of deferred calls from Python before the block ends (or ``flush()``).
"""
from __future__ import annotations

import itertools
import logging
import sys
import threading
from dataclasses import dataclass

import numpy as np

from cudnn_compat._backend import planner
from cudnn_compat._backend.heuristics import ORDER, engine_order, forced_engine
from cudnn_compat._backend.ir import GraphError, Operation, OperationGraph, Tensor
from .._core import call as _call, fastbind as _fastbind, registry as _registry
from .._core.data import _host_view, bind, device_pointer, dtype_ok, extent_bytes
from ..errors import CuDNNError, bad_param
from ..handle import get_handle, on_device, wrong_device

log = logging.getLogger("cudnn_compat")

DEFERRABLE = frozenset({
    "cudnnConvolutionForward", "cudnnConvolutionBiasActivationForward", "cudnnAddTensor", "cudnnOpTensor",
    "cudnnActivationForward", "cudnnBatchNormalizationForwardInference", "cudnnPoolingForward",
    "cudnnSoftmaxForward", "cudnnScaleTensor", "cudnnSetTensor",
})
_QUERY_PREFIXES = ("cudnnGet", "cudnnCreate")  # queries and object creation touch no data
NONE = 1 << 20  # rank of a graph no engine takes


def _harmless(c_name: str) -> bool:
    """Calls that cannot observe pending results: descriptor functions, queries, creation."""
    return "Descriptor" in c_name or c_name.startswith(_QUERY_PREFIXES)


# -- recorded calls ----------------------------------------------------------------------------

class _Pending:
    """A recorded call."""

    __slots__ = ("name", "key", "plan", "bound", "scalars", "ones", "sources", "superseded", "workspace",
                 "workspace_size", "sig")

    def __init__(self, name, key, plan, bound, scalars, workspace, workspace_size):
        self.name = name
        self.key = key  # full plan-cache key
        self.plan = plan  # the call's own plan (its graph is the snapshot the recipe merges)
        self.bound = bound  # uid -> (data, engine buffer or device pointer, tensor, argname)
        self.scalars = scalars  # uid -> float
        self.ones = tuple(u for u, v in scalars.items() if v == 1.0)  # scalars the recipe folds away
        self.sources: dict = {}  # input uid -> (call index, output uid) read inside the run
        self.superseded: set = set()  # output uids a later call overwrites exactly
        self.workspace, self.workspace_size = workspace, workspace_size
        self.sig = None  # this call's part of the run signature (set when it is linked)


def _elementwise_reader(graph, uid: int, dims) -> bool:
    """Every op reading ``uid`` is a Pointwise op producing the same dims: it reads element i
    for output element i, so writing that region later in the same run is safe."""
    for op in graph.ops:
        for t in op.inputs.values():
            if t.uid == uid and not (op.kind == "Pointwise" and op.outputs["y"].dims == tuple(dims)):
                return False
    return True


def _static(plan) -> tuple:
    """What ``record`` needs of a plan, computed once per plan: for each external data tensor
    (uid, tensor, is input, is output, bytes spanned, layout, read element-wise only)."""
    info = plan.annex.get(__name__)
    if info is None:
        graph = plan.graph
        ins = {t.uid for t in graph.external_inputs() if not t.is_by_value}
        outs = {t.uid for t in graph.external_outputs()}
        info = tuple((uid, t, uid in ins, uid in outs, extent_bytes(t), (t.dims, t.strides, t.dtype),
                      uid not in ins or _elementwise_reader(graph, uid, t.dims))
                     for uid, t in _fastbind.externals(plan).items() if not t.is_by_value)
        plan.annex[__name__] = info
    return info


class _Hazard(Exception):
    pass


class Scope:
    """One ``fuse()`` block: the recorded calls of a handle and the bookkeeping of their memory."""

    def __init__(self, handle):
        self.handle = handle
        self.pending: list = []
        self._writes: dict = {}  # address -> (end, layout, call index, uid): the latest value there
        self._reads: list = []  # (lo, hi, layout, element-wise)
        # statistics (tests and benchmarks): graphs executed per engine, calls deferred, flushes
        self.graphs: dict = {}
        self.deferred = 0
        self.flushes = 0
        self._engines = (ORDER.get(handle.place), forced_engine())  # the split into graphs depends on them
        # the measured choice (``_Site``): the ``with`` statement, fused or plain (None: not decided
        # before the scope's first compute call), the site on trial and the mark at that first call
        self.site = None
        self.fused = None
        self.trial = None
        self.t0 = None
        self.detached = False

    # -- recording -------------------------------------------------------------------------
    def record(self, name, handle, key, build, tensors, scalars, workspace, workspace_size, workspace_arg) -> bool:
        """Validate and record one compute call of legacy function ``name``; False when it cannot be
        deferred (run it now).  The buffer checks are those ``_core.call.run`` makes, at the call."""
        full = (handle.place, handle.device) + key
        plan = planner.get_plan(full, build, handle.place)
        if workspace_arg is not None:
            plan, full = _call.fit_workspace(handle, plan, full, build, workspace, workspace_size, workspace_arg)
        gpu = handle.place == "gpu"
        cp = _cupy_ndarray() if gpu else None
        bound, spans = {}, []
        for uid, t, is_in, is_out, ext, layout, elementwise in _static(plan):
            got = tensors.get(uid)
            data, argname = got if got is not None else tensors[uid - _call.Y_PRIOR_OFFSET]
            if gpu:
                if type(data) is cp and data.flags.c_contiguous and data.nbytes >= ext and \
                        dtype_ok(data.dtype, t.dtype, t.name):
                    addr = data.data.ptr  # the common case of device_pointer's checks
                elif isinstance(data, np.ndarray):
                    return False  # NumPy buffers on a GPU handle are staged per call
                else:
                    addr = device_pointer(data, t, argname, is_out)
                buf = addr
            else:
                if is_out and isinstance(data, np.ndarray) and not data.flags.writeable:
                    raise bad_param(argname, "is a read-only array but the call writes it")
                buf = _host_view(data, t, argname, is_out)
                addr = buf.__array_interface__["data"][0]
            bound[uid] = (data, buf, t, argname)
            spans.append((uid, addr, addr + ext, layout, is_in, elementwise))
        call = _Pending(name, full, plan, bound, scalars, workspace, int(workspace_size or 0))
        try:
            self._link(call, spans)
        except _Hazard:
            self.flush()
            self._link(call, spans)
        self.pending.append(call)
        self.deferred += 1
        return True

    def _link(self, call: _Pending, spans: list) -> None:
        """Connect the call's inputs to recorded values and register its writes (or raise _Hazard,
        changing nothing)."""
        index = len(self.pending)
        writes, sources, reads, supersede = self._writes, {}, [], []
        for uid, lo, hi, layout, is_in, elementwise in spans:
            if is_in:
                hit = writes.get(lo)
                if hit is not None and hit[0] == hi and hit[1] == layout:
                    sources[uid] = (hit[2], hit[3])
                elif writes and any(lo < end and w_lo < hi for w_lo, (end, *_r) in writes.items()):
                    raise _Hazard
                reads.append((lo, hi, layout, elementwise))
            else:
                for w_lo, (end, w_layout, j, u) in writes.items():
                    if lo < end and w_lo < hi:
                        if w_lo == lo and end == hi and w_layout == layout:
                            supersede.append((j, u))
                        else:
                            raise _Hazard
                for r_lo, r_hi, r_layout, r_elementwise in self._reads:
                    if lo < r_hi and r_lo < hi and not (r_lo == lo and r_hi == hi and r_elementwise
                                                        and r_layout == layout):
                        raise _Hazard
        call.sources = sources
        call.sig = (id(call.plan), call.ones, tuple(sources.items()), tuple(supersede))
        for j, u in supersede:
            self.pending[j].superseded.add(u)
        for uid, lo, hi, layout, is_in, _e in spans:
            if not is_in:
                writes[lo] = (hi, layout, index, uid)
        self._reads.extend(reads)

    # -- execution ---------------------------------------------------------------------------
    def flush(self) -> None:
        """Execute the recorded calls (as few graphs as the engines accept)."""
        calls, self.pending = self.pending, []
        self._writes, self._reads = {}, []
        if not calls:
            return
        self.flushes += 1
        if len(calls) == 1:
            _note_flushed(calls, (True,))
            self._run_single(calls[0])
            return
        recipe = _recipe(calls, self.handle.place, self._engines)
        _note_flushed(calls, recipe.alone)
        for seg in recipe.segments:
            if seg.graph is None:
                for i in seg.calls:
                    self._run_single(calls[i])
                continue
            try:
                plan = planner.get_plan((self.handle.place, self.handle.device, "fuse", recipe.id, seg.index),
                                        lambda: seg.graph, self.handle.place)
            except GraphError as e:
                log.warning("fuse: no engine runs the fused graph of %s (%s); running the calls one by one",
                            ", ".join(calls[i].name for i in seg.calls), e)
                seg.graph = None
                for i in seg.calls:
                    self._run_single(calls[i])
                continue
            self._execute(plan, calls, seg.buffers, seg.scalars,
                          (self.handle.place, self.handle.device, "fuse", recipe.id, seg.index),
                          names=[calls[i].name for i in seg.calls])

    def _run_single(self, call: _Pending) -> None:
        """One recorded call as it would have run (its plan again from the cache: one the cache
        evicted meanwhile was released, and is rebuilt from the same graph)."""
        plan = planner.get_plan(call.key, lambda: call.plan.graph, self.handle.place)
        self._execute(plan, [call], {u: (0, u) for u in call.bound}, {u: (0, u) for u in call.scalars},
                      call.key, call.workspace, call.workspace_size, names=[call.name])

    def _execute(self, plan, calls, buffers: dict, scalars: dict, key, workspace=None, workspace_size: int = 0,
                 names=()):
        h = self.handle
        raw = h.place == "gpu" and getattr(plan, "raw_pointers", False)
        data = {}
        for uid, t in _fastbind.externals(plan).items():
            if t.is_by_value:
                i, u = scalars[uid]
                data[uid] = calls[i].scalars[u]
            else:
                i, u = buffers[uid]
                src, buf, _t, argname = calls[i].bound[u]
                data[uid] = buf if (raw or h.place == "cpu") else bind(h, src, t, argname)
        need = int(plan.workspace_size)
        if need > 0 and (workspace is None or workspace_size < need):
            workspace, workspace_size = _workspace(h, need), need
        try:
            plan = planner.execute(plan, data, workspace, workspace_size, h.stream, key)
        except GraphError as e:
            raise _registry.graph_error(e, "fuse") from None
        _call._LAST.plan = plan
        self.graphs[plan.engine] = self.graphs.get(plan.engine, 0) + 1
        for hook in tuple(FLUSH_HOOKS):
            hook(h, plan, key, list(names))


def _cupy_ndarray():
    import cupy
    return cupy.ndarray


def _workspace(handle, need: int):
    """A device workspace of ``need`` bytes for a fused plan (the callers' workspaces were sized for
    their own plans), from CuPy's pool on the handle's stream: the pool reuses it in stream order."""
    if handle.place != "gpu":
        return None
    import cupy
    if handle.stream is None:
        return cupy.empty(need, cupy.uint8)
    with handle.stream:
        return cupy.empty(need, cupy.uint8)


# -- recipes: the graphs of a run of recorded calls ---------------------------------------------

@dataclass
class _Segment:
    index: int
    calls: list  # call indexes
    graph: "OperationGraph | None"
    buffers: dict  # merged uid -> (call index, uid in that call's graph)
    scalars: dict  # merged uid -> (call index, uid)


@dataclass
class _Recipe:
    id: int
    segments: list
    plans: list  # the calls' plans: kept alive so that their ids in the signature stay theirs
    _alone: "tuple | None" = None  # ``alone``, computed on first use

    @property
    def alone(self) -> tuple:
        """Per call: whether it runs in a segment of its own."""
        out = self._alone
        if out is None:
            seg_of = {i: seg for seg in self.segments for i in seg.calls}
            out = self._alone = tuple(len(seg_of[i].calls) == 1 for i in range(len(self.plans)))
        return out


_RECIPES: dict = {}
_RECIPES_MAX = 512

# Deferral that never pays is skipped: a call (by plan-cache key) that the last LONE_AFTER flushes
# ran alone (no neighbour merged with it) runs at once, as a non-deferrable call does, saving the
# recording and replanning (about 35 us of host time per call on an H100 host: fused ResNet
# basic block 366 us against 179 unfused, the same kernels).  Every REPROBE-th such call is
# deferred again, so a context that starts to fuse is found.  _LONE: key -> count (lone flushes
# in a row, then calls run at once); races only shift a heuristic.
LONE_AFTER, REPROBE = 3, 256
_LONE: dict = {}


def _note_flushed(calls, alone) -> None:
    """Record which calls of a flush ran alone (``alone[i]``) for the next scopes."""
    for c, lone in zip(calls, alone):
        if lone:
            _LONE[c.key] = _LONE.get(c.key, 0) + 1
        else:
            _LONE.pop(c.key, None)


def _run_at_once(full_key) -> bool:
    """True when a deferrable call with plan-cache key ``full_key`` is not worth deferring now."""
    n = _LONE.get(full_key)
    if n is None or n < LONE_AFTER:
        return False
    _LONE[full_key] = 0 if n >= LONE_AFTER + REPROBE else n + 1
    return True
_ids = itertools.count(1)
_rlock = threading.Lock()


def run_signature(calls) -> tuple:
    """Per call: its plan (by identity: a recipe keeps its plans alive), the scalars that are 1, the
    values it reads from earlier calls and those it overwrites."""
    return tuple(c.sig for c in calls)


def _recipe(calls, place: str, engines: tuple) -> _Recipe:
    sig = (engines, run_signature(calls))
    r = _RECIPES.get(sig)
    if r is None:
        r = _Recipe(next(_ids), _segments(calls, place), [c.plan for c in calls])
        with _rlock:
            if len(_RECIPES) >= _RECIPES_MAX:
                _RECIPES.clear()
            _RECIPES[sig] = r
    return r


def _segments(calls, place: str) -> list:
    """Greedy: extend the current graph by the next call while no engine gets worse."""
    n = len(calls)
    stride = 1 + max(t.uid for c in calls for t in c.plan.graph.tensors().values())
    groups, start = [], 0
    alone = [_rank(_build(calls, [i], stride)[0], place) for i in range(n)]
    cur = alone[0]
    for i in range(1, n):
        g = _build(calls, list(range(start, i + 1)), stride)[0]
        r = _rank(g, place)
        if r <= cur and r <= alone[i] and r < NONE:
            cur = r
            continue
        groups.append(list(range(start, i)))
        start, cur = i, alone[i]
    groups.append(list(range(start, n)))
    segs = []
    for k, idx in enumerate(groups):
        if len(idx) == 1:  # a call alone runs its own (already built) plan
            segs.append(_Segment(k, idx, None, {}, {}))
            continue
        g, bufs, scal = _build(calls, idx, stride)
        if g is not None:
            try:
                g.finalize()
            except GraphError as e:
                log.warning("fuse: merged graph failed %s; running its calls one by one", e.check)
                g = None
        segs.append(_Segment(k, idx, g, bufs, scal))
    return segs


def _rank(graph, place: str) -> int:
    """Heuristics position of the first engine that takes ``graph`` (NONE when none does)."""
    try:
        graph.finalize()
    except GraphError:
        return NONE
    for i, eng in enumerate(engine_order(place)):
        if place not in eng.places or eng.available():
            continue
        try:
            if eng.check_support(graph, place) is None:
                return i
        except Exception:  # noqa: BLE001 - an engine's probe failing means it does not take the graph
            continue
    return NONE


def _compute(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def _build(calls, idx: list, stride: int):
    """The merged graph of calls ``idx`` (a contiguous range), its buffer and scalar bindings."""
    inside = set(idx)
    readers: dict = {}  # (call, uid) -> set of reading calls
    for i, c in enumerate(calls):
        for src in c.sources.values():
            readers.setdefault(src, set()).add(i)
    merged: dict = {}  # (call, uid) -> merged Tensor
    buffers, scalars = {}, {}
    ops = []

    def value_tensor(i, t):
        """The merged tensor of output ``t`` of call ``i``: virtual when nobody outside reads it and a
        later call overwrites its region."""
        key = (i, t.uid)
        rd = readers.get(key, set())
        uid = (i + 1) * stride + t.uid
        if t.uid in calls[i].superseded and rd and rd <= inside:
            m = Tensor(uid, t.dims, t.strides, _compute(t.dtype), is_virtual=True, name=t.name)
        else:
            m = Tensor(uid, t.dims, t.strides, t.dtype, name=t.name)
            buffers[uid] = key
        merged[key] = m
        return m

    for i in idx:
        c = calls[i]
        g = c.plan.graph
        local: dict = {}
        for t in g.external_inputs():
            uid = (i + 1) * stride + t.uid
            if t.is_by_value:
                local[t.uid] = Tensor(uid, t.dims, t.strides, t.dtype, is_by_value=True, name=t.name)
                scalars[uid] = (i, t.uid)
            elif t.uid in c.sources:
                j, u = c.sources[t.uid]
                if j in inside:
                    local[t.uid] = merged[(j, u)]
                else:  # produced by an earlier graph: read from its buffer
                    src = calls[j].bound[u][2]
                    m = Tensor((j + 1) * stride + u, src.dims, src.strides, src.dtype, name=src.name)
                    buffers[m.uid] = (j, u)
                    local[t.uid] = m
            else:
                local[t.uid] = Tensor(uid, t.dims, t.strides, t.dtype, name=t.name)
                buffers[uid] = (i, t.uid)
        outs = {t.uid for t in g.external_outputs()}
        for op in g.ops:
            ins = {}
            for role, t in op.inputs.items():
                if t.uid not in local:
                    local[t.uid] = Tensor((i + 1) * stride + t.uid, t.dims, t.strides, t.dtype, t.is_virtual,
                                          t.is_by_value, t.name)
                ins[role] = local[t.uid]
            o = {}
            for role, t in op.outputs.items():
                if t.uid in outs:
                    local[t.uid] = value_tensor(i, t)
                elif t.uid not in local:
                    local[t.uid] = Tensor((i + 1) * stride + t.uid, t.dims, t.strides, t.dtype, t.is_virtual,
                                          t.is_by_value, t.name)
                o[role] = local[t.uid]
            ops.append(Operation(op.kind, ins, o, dict(op.attrs)))
    ones = {uid for uid, (i, u) in scalars.items() if calls[i].scalars.get(u) == 1.0}
    ops = _simplify(ops, ones)
    used = {t.uid for op in ops for t in list(op.inputs.values()) + list(op.outputs.values())}
    buffers = {u: v for u, v in buffers.items() if u in used}
    scalars = {u: v for u, v in scalars.items() if u in used}
    name = "+".join(op.kind for op in ops if op.kind != "Pointwise") or "Pointwise"
    return OperationGraph(ops, f"fused {name}"), buffers, scalars


def _simplify(ops: list, ones: set) -> list:
    """Fold by-value scalars equal to 1 out of Pointwise ops; drop IDENTITY copies into virtual
    tensors (consumers read the source) and IDENTITY copies out of virtual tensors read once
    (the producer writes the destination)."""
    out = []
    for op in ops:
        if op.kind == "Pointwise":
            ins = {r: t for r, t in op.inputs.items() if not (r in ("alpha1", "alpha2") and t.uid in ones)}
            op = Operation(op.kind, ins, op.outputs, op.attrs)
        out.append(op)
    ops = out
    changed = True
    while changed:
        changed = False
        reads: dict = {}
        for k, op in enumerate(ops):
            for t in op.inputs.values():
                reads.setdefault(t.uid, []).append(k)
        producer = {t.uid: k for k, op in enumerate(ops) for t in op.outputs.values()}
        for k, op in enumerate(ops):
            if not (op.kind == "Pointwise" and op.attrs.get("mode") == "IDENTITY" and set(op.inputs) == {"x"}):
                continue
            x, y = op.inputs["x"], op.outputs["y"]
            if x.dims != y.dims:
                continue
            if y.is_virtual and (x.dtype == y.dtype or (x.dtype in ("float16", "bfloat16") and y.dtype == "float32")):
                ops = [_replace(o, y, x) for j, o in enumerate(ops) if j != k]
                changed = True
                break
            p = producer.get(x.uid)
            if x.is_virtual and p is not None and reads.get(x.uid) == [k] and len(ops[p].outputs) == 1:
                prod = ops[p]
                role = next(iter(prod.outputs))
                ops[p] = Operation(prod.kind, prod.inputs, {role: y}, prod.attrs)
                del ops[k]
                changed = True
                break
    return ops


def _replace(op, old: Tensor, new: Tensor):
    if not any(t.uid == old.uid for t in op.inputs.values()):
        return op
    return Operation(op.kind, {r: (new if t.uid == old.uid else t) for r, t in op.inputs.items()}, op.outputs, op.attrs)


# -- the measured choice: a fused scope is never slower than its calls unfused (issue 14 item 5) ---
# Fusing pays where it saves kernels and costs host time (recording, dataflow, replanning) where it
# does not: a host-bound block of one-kernel calls runs slower fused.  So on the GPU place each
# ``with fuse(h):`` statement is on trial per first compute call (the block's shape): TRIAL_WARM
# fused runs (recipes, plans, CUDA graphs built), then TRIAL_RUNS timed runs of each mode,
# alternating; the faster median wins for the rest of the process (a tie goes to plain).  A run is
# timed from its first call to the end of the block between CUDA events on the handle's stream:
# the stream's time, max(host, GPU) as the program sees it, as torch's benchmark mode times.
# A plain scope leaves at its first call (hooks removed): its calls run exactly as without fuse().
MEASURE = True  # False: always fused (tests of the fusion mechanics)
TRIAL_WARM, TRIAL_RUNS = 2, 3
_SITES: dict = {}  # (code, line, place, device, first call key) -> _Site
# (code, line, place, device) -> the _Sites of that with-statement, and whether all of them chose
# plain: then its later scopes run plain from the start, with no hooks at all (a block of that
# statement whose first call was never tried runs plain too: never slower than unfused)
_STATEMENTS: dict = {}


class _Site:
    """One ``with fuse(h):`` statement with one first call: its trial, then its choice."""

    __slots__ = ("n", "runs", "fused")

    def __init__(self):
        self.n = 0
        self.runs: list = []  # (fused, start mark, end mark) of the timed runs
        self.fused = None  # the choice, once made

    def next(self) -> tuple:
        """(fused, timed) for the next run of this site."""
        if self.fused is not None:
            return self.fused, False
        i, self.n = self.n, self.n + 1
        if i < TRIAL_WARM:
            return True, False
        return (i - TRIAL_WARM) % 2 == 1, True  # plain, fused, plain, ...

    def done(self, scope, ok: bool) -> None:
        """The end of a timed run (``ok``: the block did not raise); decide after the last one."""
        clock = _clock(scope.handle)
        if ok and clock is not None:
            self.runs.append((scope.fused, scope.t0, clock.mark(scope.handle)))
        if len(self.runs) < 2 * TRIAL_RUNS or self.fused is not None:
            return
        ms = {True: [], False: []}
        for fused, t0, t1 in self.runs:
            ms[fused].append(clock.elapsed_ms(t0, t1))
        med = {k: sorted(v)[len(v) // 2] for k, v in ms.items()}
        self.fused = bool(ms[True] and ms[False] and med[True] < med[False])
        self.runs = []
        stmt = _STATEMENTS[scope.site + (scope.handle.place, scope.handle.device)]
        stmt[1] = all(s.fused is False for s in stmt[0])
        log.info("fuse: %s:%d runs %s (median %.4f ms fused, %.4f ms plain)", scope.site[0].co_filename,
                 scope.site[1], "fused" if self.fused else "plain", med[True], med[False])


class _EventClock:
    """CUDA events on the handle's stream (the GPU place)."""

    def __init__(self, cupy):
        self.cupy = cupy

    def mark(self, handle):
        ev = self.cupy.cuda.Event()
        ev.record(handle.stream or self.cupy.cuda.get_current_stream())
        return ev

    def elapsed_ms(self, t0, t1) -> float:
        t1.synchronize()
        return float(self.cupy.cuda.get_elapsed_time(t0, t1))


_CLOCK: list = []


def _clock(handle):
    """The trial clock of ``handle``'s place: CUDA events on the GPU place, None elsewhere (the CPU
    place always fuses: its run is one reference graph)."""
    if handle.place != "gpu":
        return None
    if not _CLOCK:
        import cupy
        _CLOCK.append(_EventClock(cupy) if hasattr(getattr(cupy, "cuda", None), "Event") else None)
    return _CLOCK[0]


def _choose(scope, key) -> bool:
    """At the scope's first compute call on its handle: fused (True) or plain (False: the caller
    runs the call, then the scope leaves and every later call runs as made)."""
    handle = scope.handle
    clock = _clock(handle) if MEASURE else None
    if clock is None or scope.site is None:
        scope.fused = True
        return True
    sk = scope.site + (handle.place, handle.device) + key
    site = _SITES.get(sk)
    if site is None:
        site = _SITES[sk] = _Site()
        stmt = _STATEMENTS.setdefault(scope.site + (handle.place, handle.device), [[], False])
        stmt[0].append(site)
        stmt[1] = False
    scope.fused, timed = site.next()
    if timed:
        scope.trial, scope.t0 = site, clock.mark(handle)
    return scope.fused


# -- hooks and the public context manager --------------------------------------------------------

class _State(threading.local):
    def __init__(self):
        self.scopes: list = []
        self.depth = 0
        self.deferring = None  # the deferrable legacy function being called


_TL = _State()
_installed = [0]
_ilock = threading.Lock()
# observers hook(handle, plan, key, functions) of every fused graph a flush runs: the active
# trace recorder's record_flush (tools/trace.py installs it while it records)
FLUSH_HOOKS: list = []


def _on_call(proceed, c_name, args, kwargs):
    st = _TL
    if not st.scopes or st.depth:
        return proceed(args, kwargs)
    if c_name in DEFERRABLE:
        st.deferring = c_name
    elif not _harmless(c_name):
        st.scopes[-1].flush()
    st.depth += 1
    try:
        return proceed(args, kwargs)
    finally:
        st.depth -= 1
        st.deferring = None


def _on_run(proceed, handle, key, build, tensors, scalars, workspace, workspace_size, workspace_arg):
    st = _TL
    if not st.scopes:
        return proceed(handle, key, build, tensors, scalars, workspace, workspace_size, workspace_arg)
    scope = st.scopes[-1]
    if scope.fused is None and handle is scope.handle and not _choose(scope, key):
        try:
            return proceed(handle, key, build, tensors, scalars, workspace, workspace_size, workspace_arg)
        finally:  # plain: the scope leaves once this call is through the hook chain
            _TL.scopes.remove(scope)
            _uninstall()
            scope.detached = True
    if st.deferring and handle is scope.handle and not _run_at_once((handle.place, handle.device) + key):
        if scope.record(st.deferring, handle, key, build, tensors, scalars, workspace, workspace_size, workspace_arg):
            return None
    scope.flush()  # a compute call that is not deferred may read pending results
    return proceed(handle, key, build, tensors, scalars, workspace, workspace_size, workspace_arg)


def _install() -> None:
    with _ilock:
        if _installed[0] == 0:
            _registry.HOOKS.append(_on_call)
            _call.HOOKS.append(_on_run)
        _installed[0] += 1


def _uninstall() -> None:
    with _ilock:
        _installed[0] -= 1
        if _installed[0] == 0:
            _registry.HOOKS.remove(_on_call)
            _call.HOOKS.remove(_on_run)


class fuse:
    """``with cudnn_compat.fuse(handle) as scope:`` defers the deferrable legacy calls made on
    ``handle`` inside the block and runs them as few fused graphs at its end (see the module
    docstring).  ``scope`` is the ``Scope``: ``flush()``, and statistics (``graphs`` executed per
    engine, calls ``deferred``, ``flushes``)."""

    def __init__(self, handle):
        self.scope = Scope(get_handle(handle))
        f = sys._getframe(1)
        self.scope.site = (f.f_code, f.f_lineno)  # the measured choice is per with-statement and first call

    def __enter__(self) -> Scope:
        scope = self.scope
        if MEASURE:
            stmt = _STATEMENTS.get(scope.site + (scope.handle.place, scope.handle.device))
            if stmt is not None and stmt[1]:  # every block of this statement chose plain
                scope.fused, scope.detached = False, True
                return scope
        _install()
        _TL.scopes.append(scope)
        return scope

    def __exit__(self, exc_type, exc, tb):
        scope = self.scope
        if scope.detached:  # plain: the calls ran as they were made
            scope.trial and scope.trial.done(scope, exc_type is None)
            return False
        _TL.scopes.remove(scope)
        try:
            _flush_on_device(scope)  # the recorded calls run even when the block raised
        except CuDNNError:
            if exc_type is None:
                raise
        finally:
            _uninstall()
        scope.trial and scope.trial.done(scope, exc_type is None)
        return False


def flush() -> None:
    """Execute what the innermost ``fuse()`` block of this thread has recorded so far."""
    if _TL.scopes:
        _flush_on_device(_TL.scopes[-1])


def _flush_on_device(scope) -> None:
    """``scope.flush()`` with the scope handle's device current (issue 17: a block left, or flushed,
    while another device is current still runs its calls on the handle's device)."""
    if wrong_device(scope.handle):
        on_device(scope.handle, scope.flush)
    else:
        scope.flush()


def deferring() -> bool:
    """True inside a deferrable call that a ``fuse()`` block of this thread may record."""
    return bool(_TL.scopes and _TL.deferring)


def pending() -> int:
    """Number of calls the innermost ``fuse()`` block of this thread holds."""
    return len(_TL.scopes[-1].pending) if _TL.scopes else 0


__all__ = ["fuse", "flush", "pending", "deferring", "Scope", "DEFERRABLE"]
