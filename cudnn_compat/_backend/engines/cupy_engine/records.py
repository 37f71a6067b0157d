"""Launch records: the cached call path of cupy plans (issue 14 item 3: a cached call costs a
few microseconds of host time; nothing in it depends on the problem size).

The first execute of a plan on a stream runs its steps as usual while a ``Tracer`` watches
``runtime.launch``/``aligned``/``unalias``: every kernel launched, where each of its arguments
comes from (a caller's buffer or a by-value scalar: a *variable*; a temporary, a scratch buffer
the step keeps, a partial-state workspace: a *constant* the record keeps alive), and which
input/output pairs the steps guard against overlap.  ``Record`` turns that into one argument
buffer (8-byte slots: the plan's variables first, in ``Layout`` order, then the record's
constants, written once) and, per launch, the CUfunction, grid, block, shared memory and a
``void*[]`` of slot addresses: cuLaunchKernel's ``kernelParams``.

``FastPath.launcher`` makes the plan's ``launch(values, stream, ...)``, the engine's side of a
prepared call (``_backend/prepared.py``; a closure, no generated source): take the values in
``FastPath.order`` (device pointers as ints: what the callers' binders make of every buffer), pick the record of (stream, alignment of the pointers that choose kernel
variants), reject overlapping guarded pairs, patch every variable slot with one
``struct.pack_into`` and launch through ``runtime.LAUNCH`` (CuPy's Cython cuLaunchKernel).  No
dict is built, nothing is allocated.  It returns False (nothing launched) when there is no
record yet, a guarded input overlaps an output or a value does not pack
(a float32 scalar out of range): the plan's ordinary execute then runs (and records, for a new
stream or alignment).

Only plans whose runs are all ``TRACEABLE`` (their device work is exactly their
``runtime.launch`` calls, their buffers the caller's or kept per stream) get records; plans with
Python steps (cuBLAS GEMMs, the RNN recurrence) always execute.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from functools import partial, reduce
from operator import itemgetter, or_

from ... import config
from ... import steady as _steady
from . import runtime
from .. import graphs as _graphs
from ..base import current_stream_function

TRACEABLE = frozenset({"KernelRun", "RowRun", "BnRun"})
CODES = {"float": "f", "double": "d"}  # by-value argument C types a record patches (struct codes)
MAX_RECORDS = 8  # per plan: (stream, alignment outcome) pairs kept
PACK_ERRORS = (struct.error, OverflowError, TypeError)
# graphs on (the default): the launcher always consults the graph table (a key set to -1 by ``note``
# when the variable says 0 launches the record's kernels); a default of off: while the variable is
# unset (config.unset_fast, one dict lookup) the launcher skips the table
_GRAPHS_OFF = config.unset_fast("CUDNN_COMPAT_CUPY_GRAPHS")
_GRAPHS_PARTS = config.unset_parts("CUDNN_COMPAT_CUPY_GRAPHS")  # the same test in pieces, inlined by the launcher


def _ALWAYS_ON() -> bool:
    return False


if config.TABLE["CUDNN_COMPAT_CUPY_GRAPHS"].default:
    _GRAPHS_OFF = _ALWAYS_ON


def traceable(runs) -> bool:
    """True when a record can stand for an execute of ``runs``."""
    for r in runs:
        name = type(r).__name__
        if name not in TRACEABLE and not getattr(r, "traceable", False):
            return False
        if name == "KernelRun" and r.extra is not None:
            return False  # launch values computed per call
    return True


class Layout:
    """The plan's variables: (uid, struct code) of every caller buffer ('Q') and by-value scalar
    ('f'/'d') some kernel of the plan takes, in a fixed order; None when a kernel takes a
    by-value argument of a C type records do not patch."""

    def __init__(self, kernels, externals: dict, scalars: frozenset):
        seen = set()
        for spec in kernels:
            for a in spec.args:
                if a[0] == "buf" and a[1] in externals:
                    seen.add((a[1], "Q"))
                elif a[0] == "scalar":
                    code = CODES.get(a[2])
                    if code is None or a[1] not in scalars:
                        raise ValueError(f"kernel argument {a!r} is not a patchable scalar")
                    seen.add((a[1], code))
        self.vars = sorted(seen)
        self.index = {v: i for i, v in enumerate(self.vars)}
        self.pack = struct.Struct("=" + "".join("f4x" if c == "f" else c for _, c in self.vars)).pack_into


class Tracer:
    """Watches one execute (``runtime._TRACE.tracer``); ``why`` is set when it cannot become a record."""

    def __init__(self, layout: Layout, externals: dict, align_uids: tuple, key):
        self.layout, self.ext, self.align_uids, self.key = layout, externals, frozenset(align_uids), key
        self.launches: list = []  # (kernel, grid, block, shared mem, [("var", index) | ("const", (code, value))])
        self.guards: set = set()
        self.keep: list = []
        self.why = None

    def invalid(self, why: str) -> None:
        if self.why is None:
            self.why = why

    def launch(self, spec, env, extra, fn) -> None:
        src, index = [], self.layout.index
        for a in spec.args:
            kind = a[0]
            if kind == "buf":
                u = a[1]
                if u in self.ext:
                    src.append(("var", index[(u, "Q")]))
                else:
                    v = env[u]
                    self.keep.append(v)
                    src.append(("const", ("Q", runtime.pointer(v))))
            elif kind == "scalar":
                i = index.get((a[1], CODES.get(a[2])))
                if i is None:
                    return self.invalid(f"kernel argument {a!r} is not a patchable scalar")
                src.append(("var", i))
            elif kind == "extra" and a[2] == "ptr":
                v = extra[a[1]]
                self.keep.append(v)
                src.append(("const", ("Q", runtime.pointer(v))))
            else:
                return self.invalid(f"kernel argument {a!r} is computed per call")
        kernel = getattr(fn, "kernel", fn)  # CuPy's RawKernel: .kernel is the device's Function (.ptr)
        grid = tuple(spec.grid) + (1,) * (3 - len(spec.grid))
        block = tuple(spec.block) + (1,) * (3 - len(spec.block))
        self.launches.append((kernel, grid, block, int(spec.shared_mem or 0), src))

    def aligned(self, uids, ok: bool) -> None:
        if any(u in self.ext and u not in self.align_uids for u in uids):
            self.invalid(f"alignment of {tuple(uids)} is not in the plan's alignment set")

    def guard(self, env, guard, stored) -> None:
        for u in guard:
            for s in stored:
                if u in self.ext and s in self.ext and u != s:
                    self.guards.add((u, s))


class Record:
    """The precomputed launches of one traced execute: (argument buffer, launches, count, fires);
    ``fires``: per launch (cuLaunchKernel with everything but the stream and kernelParams bound,
    kernelParams), what the launcher calls (one C call a launch, no unpacking in Python)."""

    __slots__ = ("buf", "launches", "n", "keep", "params", "fires")

    def __init__(self, tracer: Tracer):
        nv = len(tracer.layout.vars)
        consts = []
        per_launch = []
        for _k, _g, _b, _s, src in tracer.launches:
            slots = []
            for kind, v in src:
                if kind == "var":
                    slots.append(v)
                else:
                    slots.append(nv + len(consts))
                    consts.append(v)
            per_launch.append(slots)
        self.buf = (ctypes.c_uint64 * max(1, nv + len(consts)))()  # 8-byte slots, 8-byte aligned
        base = ctypes.addressof(self.buf)
        for j, (code, value) in enumerate(consts):
            struct.pack_into("=" + code, self.buf, 8 * (nv + j), value)
        self.params, launches = [], []
        for (kernel, grid, block, shm, _src), slots in zip(tracer.launches, per_launch):
            arr = (ctypes.c_void_p * max(1, len(slots)))(*[base + 8 * i for i in slots])
            self.params.append(arr)
            launches.append((int(kernel.ptr), grid[0], grid[1], grid[2], block[0], block[1], block[2], shm,
                             ctypes.addressof(arr)))
        self.launches = tuple(launches)
        self.n = len(launches)
        lk = runtime.launcher()
        self.fires = tuple((partial(lk, *la[:8]), la[8]) for la in launches)
        self.keep = (tracer.keep, [t[0] for t in tracer.launches])  # temps, scratch; kernels (their modules)


class FastPath:
    """A plan's records, the CUDA graphs captured from them and its ``launch`` function.

    Graphs: a call whose (stream, variable values) were seen once before is captured from its
    record into a CUDA graph (``engines.graphs``, on a side stream: capture runs nothing) and every
    later such call is one graph launch (about 1.7 us of host time for a graph relaunched alone
    against about 4 us per cuLaunchKernel, but 4.5 us each for many distinct graphs in turn, as a
    program's call sites launch them, and GPU time too: benchmarks/launch_paths.py; off by
    default, CUDNN_COMPAT_CUPY_GRAPHS); a call on a stream that is itself being
    captured launches the kernels.  At most ``GRAPHS`` per plan, oldest dropped first; a capture
    that fails marks its key so the record's launches are used.  One lock per plan covers the
    argument buffers and the graph table (a dropped graph is never launched after)."""

    GRAPHS = 16
    UNSEEN = 2 * GRAPHS  # new graph keys in a row after which the plan's calls launch directly

    def __init__(self, layout: Layout, align_uids: tuple, spans: dict):
        self.layout, self.align, self.spans = layout, tuple(align_uids), spans
        self.records: dict = {}  # (stream, alignment outcome) -> (buf, launches, n, fires)
        self.graphs: dict = {}  # (stream, variable values...) -> 0 (seen once), graphExec (> 0) or -1
        self.guards: set = set()
        self.unseen = 0  # new graph keys since a key came back
        self.direct = [False]  # True: no graph table (``note``)
        self.lock = threading.Lock()
        self._owned: dict = {}  # the Record objects (their buffers and kept temps)
        # the values ``launch`` takes, in order: every caller buffer's uid, then the patched scalars'
        self.order = tuple(sorted(spans)) + tuple(sorted({u for u, c in layout.vars if c != "Q"}))
        self.launch = None  # launch(values, stream, ...) -> bool once a record exists (``launcher``)

    def add(self, tracer: Tracer) -> None:
        rec = Record(tracer)
        with self.lock:
            recs = self.records
            while len(recs) >= MAX_RECORDS:
                k = next(iter(recs))
                recs.pop(k)
                self._owned.pop(k, None)
                self._drop_graphs(lambda gk, s=k[0]: gk[0] == s)
            self._owned[tracer.key] = rec
            recs[tracer.key] = (rec.buf, rec.launches, rec.n, rec.fires)
            if self.launch is None or not tracer.guards <= self.guards:
                self.guards |= tracer.guards
                self.launch = self.launcher()

    def clear(self) -> None:
        with self.lock:
            self.records.clear()
            self._owned.clear()
            self._drop_graphs(lambda gk: True)

    def _drop_graphs(self, which) -> None:
        """Remove (and destroy) the graphs whose key ``which`` selects; the caller holds the lock."""
        for gk in [gk for gk in self.graphs if which(gk)]:
            g = self.graphs.pop(gk)
            if g > 0:
                try:
                    _graphs.graphs().destroy(g)
                except Exception:  # noqa: BLE001 - a graph that cannot be destroyed is left to the driver
                    pass

    def note(self, gk) -> None:
        """First call with ``gk``: remember it (the next one is captured); lock held.  A plan whose
        calls never come back with the same values (a scalar that changes every call: batch norm's
        cumulative average factor 1/(1+n)) stops consulting the table after ``UNSEEN`` new keys
        in a row (``direct``): its launcher then launches the record's kernels."""
        graphs = self.graphs
        graphs[gk] = 0 if config.get("CUDNN_COMPAT_CUPY_GRAPHS") else -1  # -1: launch the record's kernels
        self.unseen += 1
        if self.unseen > self.UNSEEN:
            self.direct[0] = True
            self._drop_graphs(lambda k: True)
            return
        if len(graphs) > self.GRAPHS:
            old = next(iter(graphs))
            self._drop_graphs(lambda k, o=old: k is o)

    def capture(self, gk, launches) -> int:
        """The graph of ``launches`` with the arguments as packed now (lock held); -1 on failure."""
        lk = runtime.launcher()

        def launch_all(stream):
            for f, gx, gy, gz, bx, by, bz, shm, pa in launches:
                lk(f, gx, gy, gz, bx, by, bz, shm, stream, pa, 0)
        try:
            g = _graphs.graphs().capture(launch_all)
        except Exception as e:  # noqa: BLE001 - not capturable here: this key keeps launching its kernels
            _graphs.capture_failed("launch record", e)
            g = -1
        if gk in self.graphs:
            self.graphs[gk] = g
        elif g > 0:
            _graphs.graphs().destroy(g)
        return g

    def launcher(self):
        """The plan's ``launch(values, stream, workspace=None, workspace_size=0) -> bool``, the
        values in ``self.order`` (see the module docstring): a closure over this path's tables,
        made again when a record brings new guarded pairs.  While CUDNN_COMPAT_CUPY_GRAPHS is
        absent from the environment (graphs off, the default) a call skips the graph table: lock,
        patch, launch."""
        order = self.order
        pos = {u: i for i, u in enumerate(order)}
        pack_idx = tuple(pos[u] for u, _c in self.layout.vars)
        if pack_idx == tuple(range(len(order))):
            select = None  # the values are the record's variables, in order
        elif len(pack_idx) == 1:
            only = pack_idx[0]
            select = lambda v: (v[only],)  # noqa: E731
        else:
            select = itemgetter(*pack_idx)
        align = tuple(pos[u] for u in self.align)
        # the OR of the pointers that choose kernel variants: one C call (``low & 15``: all 16-byte aligned)
        a0, pick = (align[0] if align else None), (itemgetter(*align) if len(align) > 1 else None)
        guards = tuple((pos[u], pos[s], self.spans[u], self.spans[s]) for u, s in sorted(self.guards))
        recs, pack, lk, lock, table = self.records, self.layout.pack, runtime.launcher(), self.lock, self.graphs
        cur, counter = current_stream_function(), runtime.LAUNCHES
        table_always = _GRAPHS_OFF is _ALWAYS_ON  # a default of on: the graph table, always
        genv, (gkey,), gov = _GRAPHS_PARTS  # ``_GRAPHS_OFF()`` is ``gkey not in genv and not gov``
        direct = self.direct
        gr = _graphs.graphs()
        glaunch, capturing, note, capture = gr.launch_function(), gr.capturing, self.note, self.capture

        def launch(values, stream, workspace=None, workspace_size=0):
            sptr = cur() if stream is None else (stream if type(stream) is int else stream.ptr)
            if align:
                low = values[a0] if pick is None else reduce(or_, pick(values))
                rec = recs.get((sptr, tuple([values[i] & 15 == 0 for i in align]) if low & 15 else True))
            else:
                rec = recs.get((sptr, True))
            if rec is None:
                return False
            for i, j, si, sj in guards:  # a guarded input overlapping an output: execute (it copies)
                if values[i] < values[j] + sj and values[j] < values[i] + si:
                    return False
            v = values if select is None else select(values)
            if direct[0] or (not table_always and gkey not in genv and not gov):
                with lock:
                    try:
                        pack(rec[0], 0, *v)
                    except PACK_ERRORS:
                        return False
                    for fire, pa in rec[3]:
                        fire(sptr, pa, 0)
                counter[0] += rec[2]
                return True
            gk = (sptr, v)
            with lock:
                g = table.get(gk)
                if g is not None and g > 0 and not (sptr and capturing(sptr)):
                    glaunch(g, sptr)
                    self.unseen = 0
                else:
                    buf, launches, _n, _f = rec
                    try:
                        pack(buf, 0, *v)
                    except PACK_ERRORS:
                        return False
                    for f, gx, gy, gz, bx, by, bz, shm, pa in launches:
                        lk(f, gx, gy, gz, bx, by, bz, shm, sptr, pa, 0)
                    if g is None:
                        note(gk)
                    elif g == 0:
                        self.unseen = 0  # a key came back
                        if not (sptr and capturing(sptr)):
                            capture(gk, launches)
            counter[0] += rec[2]
            return True
        compiled = _steady.module()
        address = _steady.launch_address(lk) if compiled is not None else None
        if address is None:
            return launch
        # the compiled launcher (_backend/_steady.c): the same record path; the closure above is its
        # twin and its fallback (the graph table, the lock held by another thread)
        slots = tuple((i, c) for i, (_u, c) in zip(pack_idx, self.layout.vars))
        return compiled.Launcher(recs, slots, align, guards, getattr(cur, "stream", cur), counter, direct, genv, gkey,
                                 gov, table_always, launch, lock, address, runtime.cupy().cuda.driver.CUDADriverError)
