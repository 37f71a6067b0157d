"""The cudnn engine's ExecutionPlan: a finalized native EXECUTION_PLAN plus the lean
per-call path (000 "Execution plans", "Variant packs"; 002 ch. 9 VARIANT_PACK).

Per call: read the data pointers of the bound buffers, write by-value scalars into this
plan's host slots (their addresses never change), look up a cached VARIANT_PACK
descriptor keyed by (pointers, workspace), and ``cudnnBackendExecute`` on the native
handle of the device, bound to the caller's stream.  Scalars that cuDNN takes as operation
attributes (conv alpha/beta, pointwise alpha1/alpha2) are baked into the native graph, so
the plan keeps one native plan per tuple of their values (``SUBPLANS`` of them).

CUDA graph replay (``CUDNN_COMPAT_CUDNN_GRAPHS``, default on; "0" turns it off): the host
cost of cudnnBackendExecute (~10 us on an H100 host) dominates a cached call, so the second
call with the same native plan, variant pack (data pointers, workspace), stream and by-value
scalar values (a graph fixes them as captured) captures
that execute into a CUDA graph (``engines.graphs``, the engines' one capture: a side stream) and every
later such call is one cudaGraphLaunch on the caller's stream (on the legacy default stream the
graph's few kernel launches, ``CUDNN_COMPAT_GRAPH_REPLAY``: ``engines.graphs`` says why), found by the prepared call's
launcher in one lookup of (values, stream) (the replay table, emptied whenever a graph or the
scratch it used goes away).  The kernels read and write
the same buffers at run time, so results are those of the execute; calls on a stream that is
itself being captured execute directly; an execute that cannot be captured falls back to direct
execution for that (plan, pack, stream).  The native handle is shared by the plans of a
device, so binding it to a stream and executing happen under one lock per device.
"""
from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from operator import itemgetter

from ... import config as _config
from ..base import EngineDeclined, ExecutionPlan, current_stream, device_views
from .. import graphs as _graphs
from . import configs as _configs
from . import lib as _lib
from .graph import ALIGNMENT, NativeGraph

_HANDLES = _lib._handles  # device -> [native handle, stream bound]: read inline on the cached path

PACK_CACHE = 16  # variant packs kept per plan (LRU)
SUBPLANS = 8  # native plans (one per tuple of baked scalar values) kept per plan
GRAPHS = 16  # captured CUDA graphs kept per plan (LRU)
STATS = {"captures": 0, "capture_failures": 0, "graph_launches": 0}  # tests and benchmarks
_LOCKS: dict = {}  # device -> lock over "bind the shared native handle to a stream, execute"


def _graphs_enabled() -> bool:
    return _config.get("CUDNN_COMPAT_CUDNN_GRAPHS")


def _device_lock(device: int):
    lock = _LOCKS.get(device)
    if lock is None:
        lock = _LOCKS.setdefault(device, threading.RLock())
    return lock


def _ptr(buf) -> int:
    if type(buf) is int:  # a raw pointer (cudnn_compat._core.data.device_pointer)
        return buf
    try:
        return buf.data.ptr  # cupy.ndarray
    except AttributeError:
        pass
    if isinstance(buf, int):
        return int(buf)
    p = getattr(buf, "ptr", None)  # cupy MemoryPointer
    if p is not None:
        return int(p)
    return int(buf.__cuda_array_interface__["data"][0])


def _views_for_fallback(graph, data: dict) -> None:
    """Replace raw pointer ints in ``data`` by strided CuPy views (``base.device_views``)."""
    device_views(graph, data)


def _getter(uids: list):
    """data dict -> tuple of its values for ``uids`` (itemgetter, always a tuple)."""
    if not uids:
        return lambda data: ()
    get = itemgetter(*uids)
    if len(uids) == 1:
        return lambda data: (get(data),)
    return get


def _baked_key(baked: list):
    """data dict -> the tuple of baked scalar values that selects the native (sub)plan, or None
    when every baked value is fixed.  Values are hashed as given: 1 == 1.0 == np.float32(1)."""
    if all(uid is None for uid, _ in baked):
        return None
    if len(baked) == 2:
        (u0, d0), (u1, d1) = baked
        if u1 is None:
            return lambda data: (data[u0], d1)
        if u0 is None:
            return lambda data: (d0, data[u1])
        return lambda data: (data[u0], data[u1])
    if len(baked) == 1:
        u0 = baked[0][0]
        return lambda data: (data[u0],)
    return lambda data: tuple(d if u is None else data[u] for u, d in baked)


def _given_workspace(w, size, need: int) -> int:
    """The pointer of the caller's workspace when it is one of at least ``need`` bytes, else 0 (the
    plan's own scratch then serves)."""
    if w is not None and not (isinstance(w, int) and w == 0) and int(size or 0) >= need:
        return _ptr(w)
    return 0


class CudnnPlan(ExecutionPlan):
    __slots__ = ("spec", "device", "_graphs", "_keep", "_execute", "_subplans", "_base_key", "_plan_ptr", "_baked",
                 "_key_of", "_scalars", "_binding", "_uids", "_data_srcs", "_nptr", "_nbuf", "_scalar_at", "_same_at",
                 "_packs", "_pack_descs", "_ws", "_sub_owned", "sub_configs", "autotune", "_lock", "_cuda_graphs",
                 "_box", "launch_order", "launch")

    def __init__(self, graph, config, spec, device: int, native_graph: NativeGraph, plan_desc, workspace: int,
                 keep: list, values: tuple):
        super().__init__(graph, config, workspace)
        self.spec, self.device = spec, device
        self._graphs = [native_graph]
        self._keep = list(keep)
        self._execute = _lib.load().cudnnBackendExecute
        self._subplans = OrderedDict({values: (plan_desc.ptr, workspace)})
        self._base_key = values
        self._plan_ptr = plan_desc.ptr
        self._baked = [(uid, default) for uid, default in spec.baked]
        self._key_of = _baked_key(self._baked)
        nscalar = sum(1 for b in spec.bind if b[2])
        self._scalars = (ctypes.c_float * max(nscalar, 1))()
        base = ctypes.addressof(self._scalars)
        self._binding, slot = [], 0
        for _native_uid, src, is_scalar in spec.bind:
            if is_scalar:
                self._binding.append((src, slot, base + 4 * slot))
                slot += 1
            else:
                self._binding.append((src, None, 0))
        self._uids = [b[0] for b in spec.bind]
        # the values of a call (``launch_order``): the data tensors' pointers (bind order), then the
        # by-value scalars, then the baked scalars (what picks the native plan)
        self._data_srcs = [src for src, slot, _ in self._binding if slot is None]
        scalar_srcs = [src for src, slot, _ in self._binding if slot is not None]
        order = list(dict.fromkeys(self._data_srcs))
        if len(order) != len(self._data_srcs):
            raise EngineDeclined("cudnn", "a tensor is bound twice")  # never made by graph.py
        self._nptr = len(order)  # the pointers of the VARIANT_PACK, then those of the prior outputs
        order += [u for u in dict.fromkeys(u for pair in spec.same_memory for u in pair) if u not in order]
        self._nbuf = len(order)
        order += [u for u in dict.fromkeys(scalar_srcs + [uid for uid, _ in self._baked if uid is not None])
                  if u not in order]
        self.launch_order = tuple(order)
        at = {u: i for i, u in enumerate(order)}
        self._scalar_at = tuple((at[src], slot) for src, slot, _ in self._binding if slot is not None)
        self._same_at = tuple((at[a], at[b]) for a, b in spec.same_memory)
        self._key_of = _baked_key([(None if uid is None else at[uid], default) for uid, default in self._baked])
        self._packs: OrderedDict = OrderedDict()  # (native plan key, data pointers, workspace) -> VARIANT_PACK pointer
        self._pack_descs: dict = {}  # VARIANT_PACK pointer -> its Descriptor (destroyed on eviction)
        self._ws: dict = {}
        self._sub_owned: dict = {}  # key -> (NativeGraph, descriptors) of plans added per call
        self.sub_configs: dict = {}  # key -> config, where the plan's own config rejected the values
        self.autotune = None  # [(config, ms)] when the config was chosen by timing
        self._lock = _device_lock(device)
        # (baked-scalar key, pack key, stream, by-value scalar values) -> 0 (executed once), graphExec (> 0)
        # or -1 (not capturable); None: no graph replay for this plan (turned off).  A graph fixes the
        # by-value scalars' values as they were captured, so their values are part of its key.
        self._cuda_graphs = OrderedDict() if _graphs_enabled() else None
        # [the replay table, unseen] (``_replay``, ``_unseen``), shared with the compiled launcher
        self._box = [{}, 0]
        self.launch = self._launcher()

    # (values, stream) -> (graphExec or its launches (``Graphs.replay_form``), workspace need, the caller's
    # workspace pointer it uses or 0): the launcher's first look (``launch``).  Replaced by a new dict
    # (``_forget``) before a graph in it or the plan's own scratch goes away, so that an entry of the
    # plan's table is never a destroyed graph.
    _replay = property(lambda self: self._box[0])

    def _get_unseen(self) -> int:
        return self._box[1]

    def _set_unseen(self, n: int) -> None:
        self._box[1] = n

    # graph keys seen once since one came back (2 * GRAPHS of them: no more graphs)
    _unseen = property(_get_unseen, _set_unseen)

    def _launcher(self):
        """``launch``: the compiled replay (``graphs.replay_launcher``: a captured call is one table
        look and one cuGraphLaunch, ``launch_py`` for everything else), or ``launch_py``."""
        return _graphs.replay_launcher(self._box, STATS, self.launch_py, _given_workspace)

    raw_pointers = True  # the legacy layer may bind device pointers as plain ints

    # -- per call -------------------------------------------------------------------------
    def execute(self, pack, stream=None) -> None:
        """A call from a variant pack (the general path): its values in ``launch_order``, then
        ``_run`` making whatever the call needs (a native plan for new baked scalars, a workspace,
        a VARIANT_PACK, checked for alignment when first seen)."""
        data = pack.data
        try:
            n = self._nbuf
            values = tuple([data[u] if i >= n or type(data[u]) is int else _ptr(data[u])
                            for i, u in enumerate(self.launch_order)])
            sptr = current_stream() if stream is None else int(getattr(stream, "ptr", stream) or 0)
            self._run(values, sptr, pack.workspace, pack.workspace_size, True)
        except BaseException:  # declined or failed: the next engine (planner.execute) gets CuPy arrays
            _views_for_fallback(self.graph, data)
            raise

    def launch_py(self, values: tuple, stream, workspace=None, workspace_size: int = 0) -> bool:
        """A prepared call's launcher (``launch``; this is its Python twin): a call whose graph was
        captured (the same values, stream and workspace) is one graph launch from the replay table;
        else ``_run`` from what earlier calls made (the native plan of the baked scalars, the
        workspace, the VARIANT_PACK); False when something is missing."""
        sptr = current_stream() if stream is None else (stream if type(stream) is int else int(stream.ptr or 0))
        box = self._box
        replay = box[0]
        try:
            hit = replay.get((values, sptr)) if replay else None
            if hit is not None and (not hit[1] or _given_workspace(workspace, workspace_size, hit[1]) == hit[2]):
                # a call seen before, its graph captured: the values picked the native plan and the
                # pack (checked when made), and the workspace is the one the graph was captured with
                gr = _graphs.graphs()
                if not (sptr and gr.capturing(sptr)):
                    with self._lock:
                        if box[0] is replay and not self._released:
                            gr.launch(hit[0], sptr)
                            STATS["graph_launches"] += 1
                            box[1] = 0
                            return True
            return self._run(values, sptr, workspace, workspace_size, False)
        except TypeError:  # a value that is no pointer (an array from a fallback's views), or unhashable: execute
            return False

    def _run(self, values: tuple, sptr: int, workspace, workspace_size: int, make: bool) -> bool:
        """The baked scalars pick the native plan, the data pointers (with the workspace) pick a
        cached VARIANT_PACK (LRU of ``PACK_CACHE``), then one cudnnBackendExecute, or the launch
        of the CUDA graph captured from it.  ``make``: make what is missing (and raise
        EngineDeclined when the call cannot run); else return False.  No allocation but the key
        tuples, no logging.  Under the device lock, which ``release`` takes too: a plan evicted
        by another thread is never freed under a running call."""
        svals = None
        if self._scalar_at:
            scalars = self._scalars
            for i, slot in self._scalar_at:
                scalars[slot] = float(values[i])
            svals = tuple([scalars[slot] for _i, slot in self._scalar_at])  # as the native plan reads them
        for i, j in self._same_at:
            if values[i] != values[j]:
                if not make:
                    return False
                raise EngineDeclined("cudnn", f"the blend's prior output (uid {self.launch_order[i]}) is not the "
                                              f"output buffer (uid {self.launch_order[j]})")
        if self._key_of is None:
            key, plan_ptr, need = None, self._plan_ptr, self.workspace_size
        else:
            key = self._key_of(values)
            try:
                sub = self._subplans.get(key)
            except TypeError:  # an unhashable scalar (a 0-d array): its float value
                key = tuple(float(v) for v in key)
                sub = self._subplans.get(key)
            if sub is None:
                if not make:
                    return False
                sub = self._add_subplan(key)
            plan_ptr, need = sub
        ws = given = 0
        if need:
            given = _given_workspace(workspace, workspace_size, need)
            if given:
                ws = given
            else:
                mem = self._ws.get(sptr)
                if mem is None or mem.mem.size < need:
                    if not make:
                        return False
                    mem = self._scratch(sptr, need)
                ws = mem.ptr
        # one VARIANT_PACK per native plan (``key``: its baked scalars) and pointers: a pack once
        # executed with one native plan of a convolution gave that plan's alpha/beta to the others
        # it was executed with (libcudnn 9, H200: alpha 2 computed alpha 1 after an alpha-1 call)
        pkey = (key, values[:self._nptr], ws)
        with self._lock:
            if self._released:
                return False
            graphs = self._cuda_graphs
            gr = _graphs.graphs() if graphs is not None else None
            if graphs:  # a graph of this (plan, pack, stream): launch it (its pack was made, and checked, before)
                gkey = (key, pkey, sptr, svals)
                g = graphs.get(gkey)
                if g is not None and g > 0 and not gr.capturing(sptr):
                    graphs.move_to_end(gkey)
                    gr.launch(g, sptr)
                    STATS["graph_launches"] += 1
                    self._unseen = 0
                    return True
            vp = self._packs.get(pkey)
            if vp is None:
                if not make:
                    return False
                vp = self._make_pack(pkey)
            else:
                self._packs.move_to_end(pkey)
            if graphs is not None:
                gkey = (key, pkey, sptr, svals)
                g = graphs.get(gkey)
                if g is None:
                    graphs[gkey] = 0
                    self._unseen += 1
                    if self._unseen > 2 * GRAPHS:  # calls that never come back (a scalar changing per call)
                        self._forget()
                        for old in graphs.values():
                            self._drop_graph(old)
                        graphs.clear()
                        self._cuda_graphs = None  # execute directly from now on
                    if len(graphs) > GRAPHS:
                        self._forget()
                        while len(graphs) > GRAPHS:
                            self._drop_graph(graphs.popitem(last=False)[1])
                elif g != -1 and not gr.capturing(sptr):
                    self._unseen = 0
                    if g == 0:
                        g = graphs[gkey] = self._capture(plan_ptr, vp)
                    if g > 0:
                        graphs.move_to_end(gkey)
                        gr.launch(g, sptr)
                        STATS["graph_launches"] += 1
                        try:
                            self._replay[(values, sptr)] = (gr.replay_form(g, sptr), need, given)
                        except TypeError:  # an unhashable value (a 0-d array scalar): no replay entry
                            pass
                        return True
            h = _HANDLES.get(self.device)
            handle = h[0] if h is not None and h[1] == sptr else _lib.handle_for(self.device, sptr)
            st = self._execute(handle, plan_ptr, vp)
        if st:
            if not make:
                return False
            raise EngineDeclined("cudnn", f"cudnnBackendExecute returned {_lib.STATUS_NAME.get(st, st)}: "
                                          f"{_lib.last_error()}")
        return True

    def _capture(self, plan_ptr: int, vp: int) -> int:
        """A CUDA graph (its graphExec) of one execute of ``plan_ptr`` with ``vp``, captured on a
        side stream (``engines.graphs``: capturing runs nothing); -1 when it cannot be captured."""
        def launch_all(cap: int) -> None:
            with self._lock:
                st = self._execute(_lib.handle_for(self.device, cap), plan_ptr, vp)
            if st:
                raise RuntimeError(f"cudnnBackendExecute returned {_lib.STATUS_NAME.get(st, st)} under capture")
        try:
            exe = _graphs.graphs().capture(launch_all, self.device, as_kernels=True)
        except Exception:  # noqa: BLE001 - anything at all: this (plan, pack, stream) executes directly
            STATS["capture_failures"] += 1
            return -1
        STATS["captures"] += 1
        return exe

    def _forget(self) -> None:
        """Empty the replay table (a graph or the scratch it used is going away): a new dict, so a
        launcher that read the old one sees, under the lock, that it is no longer current.  Called
        before the graph goes: the compiled launcher reads the table without the lock."""
        self._box[0] = {}

    @staticmethod
    def _drop_graph(g) -> None:
        if g > 0:
            _graphs.graphs().destroy(g)

    def _make_pack(self, pkey) -> int:
        """A finalized VARIANT_PACK for (data pointers, workspace), cached; checks alignment."""
        _key, ptrs, ws = pkey
        for src, p in zip(self._data_srcs, ptrs):
            if p % ALIGNMENT:
                raise EngineDeclined("cudnn", f"buffer of tensor {src} at {p:#x} is not {ALIGNMENT}-byte aligned")
        it = iter(ptrs)
        all_ptrs = [next(it) if slot is None else addr for _src, slot, addr in self._binding]
        vp = _lib.Descriptor("VARIANT_PACK")
        try:
            vp.set("VARIANT_PACK_UNIQUE_IDS", "INT64", self._uids)
            vp.set("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", all_ptrs)
            vp.set("VARIANT_PACK_WORKSPACE", "VOID_PTR", ws or None)
            vp.finalize()
        except _lib.CudnnStatusError as e:
            vp.destroy()
            raise EngineDeclined("cudnn", str(e))
        self._packs[pkey] = vp.ptr
        self._pack_descs[vp.ptr] = vp
        while len(self._packs) > PACK_CACHE:
            self._pack_descs.pop(self._packs.popitem(last=False)[1]).destroy()
        return vp.ptr

    def _scratch(self, sptr: int, need: int):
        """This plan's device scratch for calls on stream ``sptr`` that gave too little workspace."""
        import cupy
        s = cupy.cuda.ExternalStream(sptr) if sptr else cupy.cuda.Stream.null
        with cupy.cuda.Device(self.device), s:
            mem = cupy.cuda.alloc(need)
        self._forget()  # graphs captured with the old scratch are not replayed from the table
        self._ws[sptr] = mem
        return mem

    def _add_subplan(self, key):
        """A native plan of the same engine config with other scalar values baked in."""
        handle = _lib.handle_for(self.device, 0)
        try:
            ng = NativeGraph(self.spec, handle, key)
        except _lib.CudnnStatusError as e:
            raise EngineDeclined("cudnn", f"alpha/beta {key}: {e}")
        try:
            plan, ws, keep = _configs.execution_plan(_lib, handle, ng.graph, self.config)
        except _lib.CudnnStatusError as e:
            # this config does not take these values: the first config the heuristics give
            # for the graph with these values (same math-type/algorithm selection)
            plan = None
            errors = [f"{self.config}: {e.detail or e}"]
            try:
                found = _configs.query(_lib, ng.graph, "A")
                cands = _configs.select([c for c, _ in found], self.spec, {c: w for c, w in found if w is not None})
            except _lib.CudnnStatusError as e2:
                cands, errors = [], errors + [str(e2)]
            for cfg in cands:
                try:
                    plan, ws, keep = _configs.execution_plan(_lib, handle, ng.graph, cfg)
                    self.sub_configs[key] = cfg
                    break
                except _lib.CudnnStatusError as e3:
                    errors.append(f"{cfg}: {e3.detail or e3}")
            if plan is None:
                ng.destroy()
                raise EngineDeclined("cudnn", f"scalars {key}: no engine config finalized ({'; '.join(errors[:2])})")
        self._sub_owned[key] = (ng, keep)
        self._subplans[key] = (plan.ptr, ws)
        while len(self._subplans) > SUBPLANS:
            old = next(k for k in self._subplans if k != self._base_key)
            del self._subplans[old]
            if self._cuda_graphs:
                self._forget()
                for gk in [gk for gk in self._cuda_graphs if gk[0] == old]:
                    self._drop_graph(self._cuda_graphs.pop(gk))
            old_ng, old_keep = self._sub_owned.pop(old)
            for d in reversed(old_keep):
                d.destroy()
            old_ng.destroy()
        return self._subplans[key]

    # -- lifetime -------------------------------------------------------------------------
    def release(self) -> None:
        with self._lock:
            self._release()

    def _release(self) -> None:
        self._forget()
        if self._cuda_graphs:
            for g in self._cuda_graphs.values():
                self._drop_graph(g)
            self._cuda_graphs.clear()
        for vp in self._pack_descs.values():
            vp.destroy()
        self._pack_descs.clear()
        self._packs.clear()
        for ng, keep in self._sub_owned.values():
            for d in reversed(keep):
                d.destroy()
            ng.destroy()
        self._sub_owned.clear()
        for d in reversed(self._keep):
            d.destroy()
        self._keep = []
        for g in self._graphs:
            g.destroy()
        self._graphs = []
        self._subplans.clear()
        self._ws.clear()
