"""Record every legacy call to a JSON-lines trace (docs/tools.md "Record and replay").

    CUDNN_COMPAT_TRACE=run.jsonl [CUDNN_COMPAT_TRACE_TENSORS=1] python job.py
    with cudnn_compat.trace("run.jsonl", tensors=True): ...

The first line is a header; then one line per (outermost) legacy call:

    seq, function, args        the arguments by parameter name: descriptors with their values
                               (``state``: the descriptor's settings, ``key``), scalars, shapes
                               and dtypes of array arguments, host scalars given by pointer
    status, error, time_s      CUDNN_STATUS_* name, its message, wall time of the call (GPU
                               calls are synchronized so the time covers the work)
    runs                       one entry per graph the call executed: ``sig`` (a digest of the
                               plan-cache key), engine, config, workspace, ``math_type``, ``exec_s``,
                               inputs/outputs by role {dims, strides, dtype, digest} (inputs
                               digested before the call, outputs after), scalars by name; the
                               first run of a signature in the trace also has ``graph``,
                               ``order`` (heuristics order) and ``declines`` (cudnn-compat explain)
    deferred                   true when a ``fuse()`` scope deferred the call (no runs)

With tensors (``CUDNN_COMPAT_TRACE_TENSORS=1`` or ``tensors=True``) a side ``.npz`` next to the
trace (compressed, as np.savez_compressed writes it) holds every array an executed call touched, as it was before the call
(``c<seq>.arg.<param>``: replay's inputs), and each run's outputs (``c<seq>.r<k>.<role>``:
what replay compares with), so ``cudnn-compat replay`` re-runs the trace exactly.

``cudnn_compat.trace`` is both this module and the context manager (the module is callable).
Recording uses the hook points of ``_core.registry`` (the call and its arguments) and ``_core.call.run``
(the graphs it executes); without a recorder those hooks are not installed and cost nothing.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import inspect
import json
import os
import sys
import threading
import time
import types
import zipfile

import numpy as np

from cudnn_compat._backend import config as _config
from cudnn_compat._backend.heuristics import ORDER, forced_engine
from .._core import call as _call, registry as _registry
from .._core.data import POINTER_MIN, extent_bytes, raw_address
from .._core.descriptor import Descriptor
from ..errors import CuDNNError, getErrorString
from .fuse import FLUSH_HOOKS, deferring

FORMAT = 1
SCALAR_PARAMS = ("alpha", "beta", "value")  # parameter-name prefixes of host scalars (002 "Scaling Parameters")


# -- encoding of arguments -------------------------------------------------------------------

def _is_cupy(x) -> bool:
    return type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "__cuda_array_interface__")


def _plain(v):
    """Descriptor settings as JSON values (tuples become lists; decode turns them back)."""
    if isinstance(v, Descriptor):
        return encode_value(v, "")
    if isinstance(v, (bool, str)) or v is None:
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {"dict": [[_plain(k), _plain(x)] for k, x in v.items()]}
    if isinstance(v, np.ndarray) or _is_cupy(v):
        return {"array": list(v.shape), "dtype": str(v.dtype), "unreplayable": True}
    return {"repr": repr(v)[:200], "unreplayable": True}


def descriptor_state(d: Descriptor) -> dict:
    return {k: _plain(v) for k, v in vars(d).items() if not k.startswith("_")}


def encode_value(v, name: str):
    """One argument as JSON (see the module docstring)."""
    from ..handle import Handle
    if isinstance(v, Handle):
        return {"handle": v.place, "id": int(v)}
    if isinstance(v, Descriptor):
        return {"descriptor": type(v).__name__, "module": type(v).__module__, "id": int(v),
                "state": descriptor_state(v), "key": _plain(v.key()) if v.is_set else None}
    if isinstance(v, np.ndarray):
        return {"array": list(v.shape), "dtype": str(v.dtype), "device": "host"}
    if _is_cupy(v) or hasattr(v, "__cuda_array_interface__"):
        iface = v.__cuda_array_interface__
        return {"array": list(iface["shape"]), "dtype": str(np.dtype(iface["typestr"])), "device": "gpu"}
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    addr = raw_address(v)  # a ctypes pointer (Python numbers are values: docs/conventions.md)
    if addr is not None:
        if addr >= POINTER_MIN and name.startswith(SCALAR_PARAMS):
            import ctypes
            return {"host_scalar": ctypes.string_at(addr, 8).hex()}  # float or double: replay passes the same bytes
        return {"pointer": addr, "device": "host"}
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, (list, tuple)):
        return [encode_value(x, name) for x in v]
    return {"repr": repr(v)[:200], "unreplayable": True}


# -- tensors of a run ------------------------------------------------------------------------

def host_array(handle, data, t, argname: str) -> np.ndarray:
    """The elements ``t`` describes in ``data``, as a contiguous host array of the storage dtype."""
    from .._core.data import _host_view, bind
    if isinstance(data, np.ndarray) or handle.place == "cpu":
        return np.ascontiguousarray(_host_view(data, t, argname))
    return np.ascontiguousarray(bind(handle, data, t, argname).get())


def digest(arr: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=10)
    h.update(str(arr.shape).encode())
    h.update(np.ascontiguousarray(arr).view(np.uint8).tobytes())
    return h.hexdigest()


def signature(key: tuple) -> str:
    return hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()


def run_roles(graph, tensors: dict):
    """([(role, tensor, data, argname)] of external inputs, the same of outputs) of a run: the
    role is the legacy argument name (``<name>@<uid>`` when several tensors share it)."""
    def side(ts):
        out = []
        for t in ts:
            if t.is_by_value:
                continue
            got = tensors.get(t.uid) or tensors.get(t.uid - _call.Y_PRIOR_OFFSET)
            if got is not None:
                out.append([got[1], t, got[0], got[1]])
        names = [r[0] for r in out]
        for r in out:
            if names.count(r[0]) > 1:
                r[0] = f"{r[0]}@{r[1].uid}"
        return [tuple(r) for r in out]
    return side(graph.external_inputs()), side(graph.external_outputs())


def tensor_info(t, arr: np.ndarray) -> dict:
    return {"dims": list(t.dims), "strides": list(t.strides), "dtype": t.dtype, "digest": digest(arr)}


def math_type(graph) -> "str | None":
    for op in graph.ops:
        if "math_type" in op.attrs:
            return op.attrs["math_type"]
    return None


def _address(data) -> "int | None":
    if isinstance(data, int) and not isinstance(data, bool):
        return int(data)
    if raw_address(data) is not None:  # ctypes pointers
        return raw_address(data)
    if isinstance(data, np.ndarray):
        return data.__array_interface__["data"][0]
    iface = getattr(data, "__cuda_array_interface__", None)
    return int(iface["data"][0]) if iface else None


def _nbytes(data) -> int:
    n = getattr(data, "nbytes", None)
    if n is not None:
        return int(n)
    iface = data.__cuda_array_interface__
    return int(np.prod(iface["shape"])) * np.dtype(iface["typestr"]).itemsize


def _sync(handle) -> None:
    if handle is not None and handle.place == "gpu":
        import cupy
        cupy.cuda.runtime.deviceSynchronize()


# -- the recorder ----------------------------------------------------------------------------

class _Call:
    """The call being recorded on this thread."""

    def __init__(self, entry, params: dict):
        self.entry = entry
        self.params = params  # name -> value (the call's arguments)
        self.snapped: set = set()
        self.handle = None


class Recorder:
    """Writes the trace; installed as a hook of ``_core.registry`` and of ``_core.call.run``."""

    def __init__(self, path: str, tensors: bool = False):
        self.path = os.fspath(path)
        self.tensors = bool(tensors)
        self.npz_path = os.path.splitext(self.path)[0] + ".npz" if self.tensors else None
        if self.npz_path == self.path:
            self.npz_path = self.path + ".npz"
        self._file = open(self.path, "w", encoding="utf-8")
        # compressed as np.savez_compressed writes it (deflate): tensors of a training step compress well
        self._zip = zipfile.ZipFile(self.npz_path, "w", zipfile.ZIP_DEFLATED, allowZip64=True) if self.tensors else None
        self._lock = threading.RLock()
        self._tl = threading.local()
        self._seq = 0
        self._seen: set = set()
        self._t0 = time.perf_counter()
        self.closed = False
        self._write({"trace": "cudnn-compat", "format": FORMAT, "version": _version(),
                     "tensors": os.path.basename(self.npz_path) if self.npz_path else None,
                     "started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": list(sys.argv),
                     "engine": forced_engine()})

    # -- output ---------------------------------------------------------------------------
    def _write(self, obj) -> None:
        with self._lock:
            if not self.closed:
                self._file.write(json.dumps(obj, default=str) + "\n")
                self._file.flush()

    def _save(self, name: str, arr: np.ndarray) -> None:
        with self._lock:
            if self._zip is not None:
                with self._zip.open(name + ".npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._file.close()
            if self._zip is not None:
                self._zip.close()

    # -- the registry hook: one line per outermost call -------------------------------------
    def on_call(self, proceed, c_name, args, kwargs):
        tl = self._tl
        if getattr(tl, "call", None) is not None:  # a legacy call made by a legacy call
            return proceed(args, kwargs)
        with self._lock:
            seq = self._seq
            self._seq += 1
        params = _params(c_name, args, kwargs)
        entry = {"seq": seq, "function": c_name,
                 "args": {n: encode_value(v, n) for n, v in params.items()}, "runs": []}
        call = tl.call = _Call(entry, params)
        t0 = time.perf_counter()
        status, error = "CUDNN_STATUS_SUCCESS", None
        try:
            result = proceed(args, kwargs)
            _sync(call.handle)
            if result is not None:
                entry["result"] = encode_value(result, "")
            return result
        except CuDNNError as e:
            status, error = e.status_name, str(e)
            raise
        except Exception as e:  # the registry turns GraphError into CuDNNError; others propagate
            status, error = _status_of(e), f"{type(e).__name__}: {e}"
            raise
        finally:
            tl.call = None
            entry["t"] = round(t0 - self._t0, 6)
            entry["time_s"] = time.perf_counter() - t0
            entry["status"] = status
            if error:
                entry["error"] = error
            if not entry["runs"]:
                del entry["runs"]
            self._write(entry)

    # -- the run hook: the graphs a call executes --------------------------------------------
    def on_run(self, proceed, handle, key, build, tensors, scalars, *rest):
        call = getattr(self._tl, "call", None)
        if call is None:
            return proceed(handle, key, build, tensors, scalars, *rest)
        call.handle = handle
        entry = call.entry
        k = len(entry["runs"])
        run = {}
        entry["runs"].append(run)
        if deferring():  # a fuse() block records this call: its inputs may not be computed yet
            plan = proceed(handle, key, build, tensors, scalars, *rest)
            if plan is None:
                entry["deferred"] = True
                entry["runs"].pop()
                return plan
            return self._finish_run(call, run, k, plan, handle, key, tensors, scalars)
        try:
            graph = build()
            ins, _ = run_roles(graph, tensors)
            if self.tensors:
                self._snapshot_args(call, handle, graph, tensors)
            run["inputs"] = {r: tensor_info(t, host_array(handle, d, t, a)) for r, t, d, a in ins}
        except Exception as e:  # bad buffers: the run below raises the real error
            run["inputs_error"] = f"{type(e).__name__}: {e}"
        plan = proceed(handle, key, build, tensors, scalars, *rest)
        if plan is None:  # deferred by a fuse() scope
            entry["deferred"] = True
            entry["runs"].pop()
            return plan
        return self._finish_run(call, run, k, plan, handle, key, tensors, scalars)

    def _finish_run(self, call, run, k, plan, handle, key, tensors, scalars):
        entry = call.entry
        _sync(handle)
        full = (handle.place, handle.device) + tuple(key)
        sig = signature(full)
        g = plan.graph
        run.update(sig=sig, engine=plan.engine, config=str(plan.config),
                   workspace=int(plan.workspace_size), math_type=math_type(g),
                   exec_s=getattr(plan, "last_time", None), place=handle.place)
        names = {t.uid: t.name or str(t.uid) for t in g.external_inputs() if t.is_by_value}
        run["scalars"] = {names.get(u, str(u)): float(v) for u, v in scalars.items() if u in names}
        if sig not in self._seen:
            self._seen.add(sig)
            run.update(graph=g.describe(), order=list(_order(handle.place)),
                       declines=[[n, r] for n, r in getattr(plan, "declines", [])], key=repr(full)[:2000])
        _, outs = run_roles(g, tensors)
        run["outputs"] = {}
        for r, t, d, a in outs:
            arr = host_array(handle, d, t, a)
            run["outputs"][r] = tensor_info(t, arr)
            if self.tensors:
                self._save(f"c{entry['seq']}.r{k}.{r}", arr)
        return plan

    def record_flush(self, handle, plan, key, functions: list) -> None:
        """A graph a ``fuse()`` block executed for the deferred calls ``functions`` (one line,
        ``fused: true``; replay skips it, explain shows its graph and engine choice)."""
        with self._lock:
            seq = self._seq
            self._seq += 1
        sig = signature(tuple(key))
        run = {"sig": sig, "engine": plan.engine, "config": str(plan.config), "workspace": int(plan.workspace_size),
               "math_type": math_type(plan.graph), "exec_s": getattr(plan, "last_time", None), "place": handle.place}
        if sig not in self._seen:
            self._seen.add(sig)
            run.update(graph=plan.graph.describe(), order=list(_order(handle.place)),
                       declines=[[n, r] for n, r in getattr(plan, "declines", [])], key=repr(tuple(key))[:2000])
        self._write({"seq": seq, "function": "fuse", "fused": True, "calls": functions, "runs": [run],
                     "status": "CUDNN_STATUS_SUCCESS", "t": round(time.perf_counter() - self._t0, 6),
                     "time_s": run["exec_s"]})

    def _snapshot_args(self, call, handle, graph, tensors) -> None:
        """Save, before the run writes anything, every array argument the run touches (whole) and
        the extent of every pointer argument it touches: replay's inputs."""
        spans = []  # (param, lo, hi, kind)
        for name, v in call.params.items():
            if isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__"):
                lo = _address(v)
                spans.append((name, lo, lo + _nbytes(v), "array"))
            elif isinstance(v, int) and not isinstance(v, (bool, Descriptor)) and v >= POINTER_MIN:
                spans.append((name, int(v), None, "pointer"))
            elif (raw_address(v) or 0) >= POINTER_MIN and not name.startswith(SCALAR_PARAMS):
                spans.append((name, raw_address(v), None, "pointer"))
        if not spans:
            return
        bases = {_address(d) for d, _a in tensors.values()}
        spans = [s for s in spans if s[3] == "array" or s[1] in bases]  # ints that are some tensor's address
        need: dict = {}
        by_uid = graph.tensors()
        for uid, (data, _argname) in tensors.items():
            a = _address(data)
            t = by_uid.get(uid)
            if a is None or t is None:
                continue
            end = a + extent_bytes(t)
            hit = [s for s in spans if s[3] == "array" and s[1] <= a < s[2]]
            if not hit:
                ptrs = [s for s in spans if s[3] == "pointer" and s[1] <= a]
                hit = [max(ptrs, key=lambda s: s[1])] if ptrs else []
            for s in hit:
                need[s[0]] = max(need.get(s[0], 0), end - s[1])
        for name, size in need.items():
            if name in call.snapped:
                continue
            call.snapped.add(name)
            v = call.params[name]
            ptr = v if isinstance(v, int) else raw_address(v)
            arr = _read_pointer(handle, int(ptr), size) if ptr is not None else _to_host(v)
            key = f"c{call.entry['seq']}.arg.{name}"
            self._save(key, arr)
            enc = call.entry["args"][name]
            if isinstance(enc, dict):
                enc["ref"] = key
            else:
                call.entry["args"][name] = {"pointer": int(ptr), "bytes": int(size), "ref": key,
                                            "device": handle.place}


def _to_host(v) -> np.ndarray:
    if isinstance(v, np.ndarray):
        return v.copy()
    if hasattr(v, "get"):
        return v.get()
    import cupy
    return cupy.asarray(v).get()


def _read_pointer(handle, ptr: int, size: int) -> np.ndarray:
    if handle.place == "cpu":
        import ctypes
        return np.frombuffer(ctypes.string_at(ptr, size), np.uint8).copy()
    import cupy
    mem = cupy.cuda.UnownedMemory(ptr, size, None)
    return cupy.ndarray((size,), cupy.uint8, cupy.cuda.MemoryPointer(mem, 0)).get()


def _status_of(e: Exception) -> str:
    st = getattr(e, "status", None)
    if isinstance(st, int):
        return getErrorString(st)
    if isinstance(st, str):
        return "CUDNN_STATUS_" + st
    return "EXCEPTION"


def _order(place: str) -> tuple:
    f = forced_engine()
    return (f,) if f else ORDER.get(place, ())


def _version() -> str:
    from .._version import __version__
    return __version__


_SIGS: dict = {}


def _params(c_name: str, args, kwargs) -> dict:
    """The call's arguments by parameter name (positional ones past the signature as ``argN``)."""
    sig = _SIGS.get(c_name)
    if sig is None:
        try:
            sig = inspect.signature(_registry.LEGACY[c_name])
        except (KeyError, TypeError, ValueError):
            sig = False
        _SIGS[c_name] = sig
    if sig:
        try:
            return dict(sig.bind(*args, **kwargs).arguments)
        except TypeError:
            pass
    out = {f"arg{i}": a for i, a in enumerate(args)}
    out.update(kwargs)
    return out


# -- starting and stopping -------------------------------------------------------------------

_STACK: list = []
_lock = threading.Lock()


def start(path, tensors: bool = False) -> Recorder:
    """Begin recording every legacy call to ``path`` (replacing the active recorder until ``stop``)."""
    rec = Recorder(path, tensors)
    with _lock:
        if _STACK:
            _uninstall(_STACK[-1])
        _STACK.append(rec)
        _registry.HOOKS.insert(0, rec.on_call)  # outermost: it sees what fusion decides
        _call.HOOKS.insert(0, rec.on_run)
        FLUSH_HOOKS.insert(0, rec.record_flush)
    return rec


def stop(rec: "Recorder | None" = None) -> None:
    with _lock:
        if not _STACK:
            return
        rec = rec or _STACK[-1]
        if rec in _STACK:
            if rec is _STACK[-1]:
                _uninstall(rec)
                _STACK.pop()
                if _STACK:
                    _registry.HOOKS.insert(0, _STACK[-1].on_call)
                    _call.HOOKS.insert(0, _STACK[-1].on_run)
                    FLUSH_HOOKS.insert(0, _STACK[-1].record_flush)
            else:
                _STACK.remove(rec)
    rec.close()


def _uninstall(rec: Recorder) -> None:
    for hooks, fn in ((_registry.HOOKS, rec.on_call), (_call.HOOKS, rec.on_run), (FLUSH_HOOKS, rec.record_flush)):
        if fn in hooks:
            hooks.remove(fn)


def active() -> "Recorder | None":
    return _STACK[-1] if _STACK else None


@contextlib.contextmanager
def trace(path, tensors: bool = False):
    """``with cudnn_compat.trace("run.jsonl", tensors=True):`` records the calls made inside."""
    rec = start(path, tensors)
    try:
        yield rec
    finally:
        stop(rec)


def from_environment() -> "Recorder | None":
    """Start the recorder ``CUDNN_COMPAT_TRACE`` asks for (tensors with ``CUDNN_COMPAT_TRACE_TENSORS=1``)."""
    path = _config.get("CUDNN_COMPAT_TRACE") or ""
    if not path or active() is not None:
        return None
    tensors = _config.get("CUDNN_COMPAT_TRACE_TENSORS")
    rec = start(path, tensors)
    atexit.register(stop, rec)
    return rec


class _CallableModule(types.ModuleType):
    """``cudnn_compat.trace(path)`` is the context manager; ``cudnn_compat.trace.start`` & co. the module."""

    def __call__(self, path, tensors: bool = False):
        return trace(path, tensors)


sys.modules[__name__].__class__ = _CallableModule
