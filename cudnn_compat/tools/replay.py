"""Replay a recorded trace on an engine, or compare two traces (docs/tools.md "Record and replay").

    cudnn-compat replay TRACE --engine reference|cupy|cudnn|legacy|default [--tol DTYPE[:MATH]=RTOL,ATOL]
    cudnn-compat diff A B

``replay`` re-runs every call of a trace recorded with tensors (``tools/trace.py``) that executed a graph
or failed: its arguments are rebuilt (descriptors from their recorded settings, arrays and pointer
extents from the side ``.npz``, host scalars from their recorded bytes) and the function is called
again on the chosen engine: ``reference`` on a CPU handle, ``cupy``/``cudnn`` forced
(``CUDNN_COMPAT_ENGINE`` through ``config.override``; the environment is not touched) on a GPU
handle (any engine registered with a priority: on a CPU handle when it runs there), ``default`` with the recording's place and heuristics,
``legacy`` the real legacy libcudnn function through ``cudnn_compat/_backend/legacy_cudnn`` (``LEGACY_FUNCTIONS``).
Each output is compared with the recorded one: max absolute and relative error and ULP distance in
the output's data type.  A call fails when an element misses |got - want| <= atol*max(1, max|want|)
+ rtol*|want| (``TOLERANCES`` per data type and math type, ``--tol`` overrides) or when its status
differs from the recorded one.  The exit status is 1 when a call fails, 2 when the trace cannot be
replayed (no tensors), else 0.

``diff`` pairs the compute calls of two traces in order and compares function, status, outputs
(digests; numerically when both have tensors), engine and time.
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from cudnn_compat._backend import config as _config
from cudnn_compat._backend import dtypes as _dtypes
from cudnn_compat._backend.engines.base import REGISTRY
from .._core import call as _call
from .._core.descriptor import Descriptor
from ..errors import CuDNNError

SPECIAL = ("legacy", "default")  # the real libcudnn function; the recording's place and heuristics


def engines() -> tuple:
    """What ``--engine`` takes: every engine registered with a priority (most general first), then
    ``legacy`` and ``default``."""
    return REGISTRY.names() + SPECIAL


ENGINES = engines()  # ("reference", "cupy", "numpy", "cudnn", "legacy", "default") with the engines shipped

# (dtype, math type or None for any) -> (rtol, atol).  Math type from the graph's conv attrs:
# DEFAULT_MATH lets a GPU run FP32 convolutions in TF32 (cuDNN >= 8 on Ampere+), TENSOR_OP math in
# reduced precision; FMA_MATH and ops without a math type stay in FP32.
TOLERANCES = {
    ("float64", None): (1e-12, 1e-12),
    ("float32", None): (1e-5, 1e-5),
    ("float32", "DEFAULT_MATH"): (5e-3, 5e-3),
    ("float32", "TENSOR_OP_MATH"): (5e-3, 5e-3),
    ("float32", "TENSOR_OP_MATH_ALLOW_CONVERSION"): (1e-2, 1e-2),
    ("float32", "FMA_MATH"): (1e-5, 1e-5),
    ("float16", None): (1e-2, 1e-2),
    ("bfloat16", None): (4e-2, 4e-2),
}
INTEGER_TOLERANCE = (0.0, 1.0)  # integer outputs: at most one step (rounding of the scaled result)


def tolerance(dtype: str, math: "str | None", overrides: "dict | None" = None) -> tuple:
    for table in (overrides or {}, TOLERANCES):
        for k in ((dtype, math), (dtype, None)):
            if k in table:
                return table[k]
    return TOLERANCES[("float32", None)] if _dtypes.is_float(dtype) else INTEGER_TOLERANCE


def parse_tolerances(specs) -> dict:
    """``["float16=1e-3,1e-3", "float32:FMA_MATH=1e-6,1e-6"]`` -> {(dtype, math): (rtol, atol)}."""
    out = {}
    for spec in specs or ():
        try:
            lhs, rhs = spec.split("=", 1)
            dtype, _, math = lhs.partition(":")
            rtol, _, atol = rhs.partition(",")
            out[(dtype.strip(), math.strip() or None)] = (float(rtol), float(atol or rtol))
        except ValueError:
            raise ValueError(f"--tol {spec!r}: expected DTYPE[:MATH]=RTOL[,ATOL]") from None
    return out


# -- loading -----------------------------------------------------------------------------------

@dataclass
class Trace:
    path: str
    header: dict
    calls: list
    npz: "object | None" = None

    @property
    def compute_calls(self) -> list:
        """Calls that executed a graph, were deferred, or failed (descriptor calls are left out)."""
        return [c for c in self.calls if not c.get("fused") and (
            c.get("runs") or c.get("deferred") or c.get("status") not in (None, "CUDNN_STATUS_SUCCESS"))]

    def array(self, key: str) -> "np.ndarray | None":
        if self.npz is None or key not in self.npz.files:
            return None
        return self.npz[key]


def load(path) -> Trace:
    path = os.fspath(path)
    header, calls = None, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e})") from None
            if header is None and obj.get("trace") == "cudnn-compat":
                header = obj
            else:
                calls.append(obj)
    if header is None:
        raise ValueError(f"{path}: not a cudnn-compat trace (no header line)")
    npz = None
    if header.get("tensors"):
        p = os.path.join(os.path.dirname(os.path.abspath(path)), header["tensors"])
        if os.path.exists(p):
            npz = np.load(p, allow_pickle=False)
    return Trace(path, header, calls, npz)


# -- comparing arrays ----------------------------------------------------------------------------

def _ordered(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Floats as integers whose difference is the ULP distance (sign-magnitude to two's complement)."""
    bits = {"float16": (np.int16, 15), "bfloat16": (np.int16, 15), "float32": (np.int32, 31),
            "float64": (np.int64, 63)}[dtype]
    i = np.ascontiguousarray(arr).view(bits[0]).astype(np.float64 if dtype == "float64" else np.int64)
    if dtype == "float64":  # int64 bit patterns do not fit exactly in float64; compare in int64 pieces
        raw = np.ascontiguousarray(arr).view(np.int64)
        mag = raw & np.int64(0x7FFFFFFFFFFFFFFF)
        return np.where(raw < 0, -mag.astype(np.float64), mag.astype(np.float64))
    mask = (1 << bits[1]) - 1
    mag = i & mask
    return np.where(i < 0, -mag, mag)


def compare(got: np.ndarray, want: np.ndarray, dtype: str, rtol: float, atol: float) -> dict:
    """Errors of ``got`` against ``want`` (storage-dtype arrays of one tensor)."""
    if got.shape != want.shape:
        return {"ok": False, "error": f"shape {got.shape} != recorded {want.shape}"}
    g, w = _dtypes.load(got, dtype), _dtypes.load(want, dtype)
    n = w.size
    if n == 0:
        return {"ok": True, "max_abs": 0.0, "max_rel": 0.0, "max_ulp": 0, "n": 0}
    both_nan = np.isnan(g) & np.isnan(w)
    with np.errstate(invalid="ignore", over="ignore"):
        same_inf = np.isinf(w) & (g == w)
        d = np.where(both_nan | same_inf, 0.0, np.abs(g - w))
        d = np.where(np.isnan(d), np.inf, d)
        aw = np.where(np.isfinite(w), np.abs(w), 0.0)
        rel = np.where(aw > 0, d / np.where(aw > 0, aw, 1.0), np.where(d > 0, np.inf, 0.0))
    scale = max(1.0, float(aw.max()))
    bad = d > atol * scale + rtol * aw
    res = {"max_abs": float(d.max()), "max_rel": float(rel.max()), "n": int(n), "bad": int(bad.sum()),
           "ok": not bool(bad.any())}
    if _dtypes.is_float(dtype):
        og, ow = _ordered(got, dtype), _ordered(want, dtype)
        ulp = np.where(both_nan, 0, np.abs(og - ow))
        res["max_ulp"] = int(min(ulp.max(), 2 ** 62))
    else:
        res["max_ulp"] = int(d.max()) if np.isfinite(d.max()) else None
    if bad.any():
        k = int(np.argmax(np.where(bad, d, -1.0)))
        idx = np.unravel_index(k, w.shape)
        res["worst"] = {"index": [int(v) for v in idx], "got": float(g[idx]), "want": float(w[idx])}
    return res


# -- rebuilding arguments ------------------------------------------------------------------------

class Unreplayable(Exception):
    pass


# Module paths before issue 15 item 2 (commit 6deecaf, "cudnn_compat grouped by concept") -> now.
# Traces name a descriptor's class by ``type(v).__module__``; a path here is used when the recorded one
# no longer imports.
MOVED_MODULES = {f"cudnn_compat.{old}": f"cudnn_compat.{new}" for old, new in (
    ("_bound_graph", "_core.bound_graph"), ("_call", "_core.call"), ("_data", "_core.data"),
    ("_descriptor", "_core.descriptor"), ("_fastbind", "_core.fastbind"),
    ("_lifecycle", "_core.lifecycle"), ("_logging", "_core.log"), ("_memo", "_core.memo"),
    ("_place", "_core.place"), ("_registry", "_core.registry"), ("_signatures", "_core.signatures"),
    ("_uids", "_core.uids"),
    ("_conv_algos", "convolution.algos"), ("cnn", "convolution.api"), ("conv_legacy", "convolution.legacy"),
    ("cupy_cudnn", "cupy13.cupy_cudnn"), ("cupyx_cudnn", "cupy13.cupyx_cudnn"), ("shim", "cupy13.shim"),
    ("backend_api", "graph_api.api"), ("backend_attrs", "graph_api.attributes"),
    ("backend_ops", "graph_api.operations"),
    ("rnn_core", "rnn.core"), ("rnn_desc", "rnn.desc"), ("rnn_find", "rnn.find"),
    ("rnn_legacy", "rnn.legacy"), ("rnn_v8", "rnn.v8"), ("rnn_weights", "rnn.weights"),
    ("cli", "tools.cli"), ("demo", "tools.demo"), ("explain", "tools.explain"), ("fusion", "tools.fuse"),
    ("replay", "tools.replay"), ("trace", "tools.trace"),
    ("_backend.engines.cupy_engine.fusion", "_backend.engines.cupy_engine.grouping"))}


def descriptor_class(module: str, name: str) -> type:
    """The class a trace recorded as ``module.name``: from that module, else from its moved path
    (``MOVED_MODULES``), else the ``Descriptor`` subclass of that name defined in any
    ``cudnn_compat`` module (a module split since the recording)."""
    for path in (module, MOVED_MODULES.get(module)):
        if path is None:
            continue
        try:
            cls = getattr(importlib.import_module(path), name, None)
        except ImportError:
            continue
        if isinstance(cls, type):
            return cls
    import pkgutil
    import sys
    import cudnn_compat

    def defined_here():
        return [c for m in list(sys.modules.values()) if (getattr(m, "__name__", "") or "").startswith("cudnn_compat.")
                for c in [getattr(m, name, None)]
                if isinstance(c, type) and issubclass(c, Descriptor) and c.__module__ == m.__name__]

    found = defined_here()
    if not found:  # import the rest of the package (never __main__: it runs the command line)
        for info in pkgutil.walk_packages(cudnn_compat.__path__, "cudnn_compat.", onerror=lambda _name: None):
            if not info.name.endswith("__main__") and info.name not in sys.modules:
                try:
                    importlib.import_module(info.name)
                except Exception:  # noqa: BLE001  (an optional module, e.g. one that needs CuPy)
                    pass
        found = defined_here()
    if not found:
        raise Unreplayable(f"descriptor class {module}.{name} not found (moved or renamed)")
    return found[0]


class _Args:
    """Decodes one call's recorded arguments for a place; owns what it creates."""

    def __init__(self, trace: Trace, place: str, handle):
        self.trace, self.place, self.handle = trace, place, handle
        self.descs: dict = {}
        self.keep: list = []

    def value(self, enc, name: str = ""):
        if isinstance(enc, list):
            return [self.value(v, name) for v in enc]
        if not isinstance(enc, dict):
            return enc
        if enc.get("unreplayable") or "repr" in enc:
            raise Unreplayable(f"argument {name} was recorded as {enc.get('repr', 'an object')} (not replayable)")
        if "handle" in enc:
            return self.handle
        if "descriptor" in enc:
            return self.descriptor(enc)
        if "host_scalar" in enc:
            buf = np.frombuffer(bytes.fromhex(enc["host_scalar"]), np.uint8).copy()
            self.keep.append(buf)
            return ctypes.c_void_p(buf.ctypes.data)  # a host pointer (Python ints are values)
        if "pointer" in enc or "array" in enc:
            return self.buffer(enc, name)
        raise Unreplayable(f"argument {name}: unknown encoding {sorted(enc)}")

    def buffer(self, enc, name: str):
        ref = enc.get("ref")
        arr = self.trace.array(ref) if ref else None
        if arr is None:
            if "pointer" in enc:
                raise Unreplayable(f"argument {name}: pointer without recorded contents")
            arr = np.zeros(enc["array"], np.dtype(enc["dtype"]))  # scratch (workspace) or never read
        arr = np.array(arr, copy=True)
        if self.place == "gpu":
            import cupy
            arr = cupy.asarray(arr)
        self.keep.append(arr)
        return arr

    def descriptor(self, enc):
        got = self.descs.get(enc["id"])
        if got is not None:
            return got
        cls = descriptor_class(enc["module"], enc["descriptor"])
        obj = cls.__new__(cls)
        try:
            obj.__init__()
        except TypeError:
            Descriptor.__init__(obj)
        for k, v in enc["state"].items():
            setattr(obj, k, self.state(v))
        obj._key = None
        self.descs[enc["id"]] = obj
        return obj

    def state(self, v):
        if isinstance(v, list):
            return tuple(self.state(x) for x in v)
        if isinstance(v, dict):
            if "descriptor" in v:
                return self.descriptor(v)
            if "dict" in v:
                return {self.state(k): self.state(x) for k, x in v["dict"]}
            raise Unreplayable(f"descriptor state {v.get('repr', v)} is not replayable")
        return v

    def release(self):
        for d in self.descs.values():
            try:
                d.destroy()
            except CuDNNError:
                pass
        self.descs = {}
        self.keep = []


# -- replay --------------------------------------------------------------------------------------

@dataclass
class CallResult:
    seq: int
    function: str
    state: str  # 'ok' | 'fail' | 'skip'
    outputs: list = field(default_factory=list)  # [(run, role, dtype, compare dict, (rtol, atol))]
    note: str = ""


class _Capture:
    """A ``_core.call.run`` hook collecting each run's outputs by role (as the recorder names them)."""

    def __init__(self):
        self.runs: list = []

    def __call__(self, proceed, handle, key, build, tensors, scalars, *rest):
        from .trace import host_array, run_roles
        plan = proceed(handle, key, build, tensors, scalars, *rest)
        if plan is not None:
            if handle.place == "gpu":
                import cupy
                cupy.cuda.runtime.deviceSynchronize()
            _, outs = run_roles(plan.graph, tensors)
            self.runs.append({r: host_array(handle, d, t, a) for r, t, d, a in outs})
        return plan


def _forced(engine: "str | None"):
    """CUDNN_COMPAT_ENGINE as ``engine`` (None: unset, the heuristics order) for the block."""
    return _config.override("CUDNN_COMPAT_ENGINE", engine or None)


def _place(trace: Trace, engine: str) -> str:
    if engine == "legacy":
        return "gpu"
    eng = REGISTRY.engines.get(engine) if engine != "default" else None
    if eng is not None:  # an engine that runs on the CPU replays there (the reference engine)
        return "cpu" if "cpu" in eng.places else "gpu"
    for c in trace.calls:
        h = c.get("args", {}).get("handle")
        if isinstance(h, dict) and "handle" in h:
            return h["handle"]
    return "cpu"


def replay(trace: Trace, engine: str, overrides: "dict | None" = None) -> list:
    """Replay ``trace`` on ``engine``; a CallResult per compute call."""
    known = engines()
    if engine not in known:
        raise ValueError(f"engine must be one of {', '.join(known)}, got {engine!r}")
    import cudnn_compat as cc
    place = _place(trace, engine)
    if place == "gpu":
        from .._core.place import gpu_reason
        why = gpu_reason()
        if why:
            raise RuntimeError(f"engine {engine} needs a GPU: {why}")
    results = []
    if engine == "legacy":
        with LegacySession() as sess:
            for c in trace.compute_calls:
                results.append(_one_legacy(trace, c, sess, overrides))
        return results
    handle = cc.cudnnCreate(place)
    cap = _Capture()
    forced = None if engine == "default" else engine
    _call.HOOKS.append(cap)
    try:
        with _forced(forced):
            for c in trace.compute_calls:
                results.append(_one(trace, c, handle, place, cap, overrides))
    finally:
        _call.HOOKS.remove(cap)
        cc.cudnnDestroy(handle)
    return results


def _call_fn(fn, kwargs: dict):
    pos = [kwargs.pop(k) for k in sorted((k for k in kwargs if k.startswith("arg") and k[3:].isdigit()),
                                         key=lambda k: int(k[3:]))]
    return fn(*pos, **kwargs)


def _one(trace, c, handle, place, cap, overrides) -> CallResult:
    from .._core.registry import LEGACY
    seq, name = c["seq"], c["function"]
    if c.get("deferred"):
        return CallResult(seq, name, "skip", note="deferred by fuse() when recorded (no outputs in the trace)")
    fn = LEGACY.get(name)
    if fn is None:
        return CallResult(seq, name, "skip", note="function not registered")
    args = _Args(trace, place, handle)
    cap.runs = []
    try:
        kwargs = {k: args.value(v, k) for k, v in c["args"].items()}
    except Unreplayable as e:
        args.release()
        return CallResult(seq, name, "skip", note=str(e))
    status = "CUDNN_STATUS_SUCCESS"
    try:
        _call_fn(fn, kwargs)
    except CuDNNError as e:
        status, msg = e.status_name, str(e)
    finally:
        args.release()
    want = c.get("status", "CUDNN_STATUS_SUCCESS")
    if status != want:
        note = f"status {status}" + (f" ({msg})" if status != "CUDNN_STATUS_SUCCESS" else "") + f", recorded {want}"
        engine_refusal = status == "CUDNN_STATUS_NOT_SUPPORTED" and want == "CUDNN_STATUS_SUCCESS"
        return CallResult(seq, name, "skip" if engine_refusal else "fail", note=note)
    if status != "CUDNN_STATUS_SUCCESS":
        return CallResult(seq, name, "ok", note=f"{status} as recorded")
    return _check_outputs(trace, c, cap.runs, overrides)


def _check_outputs(trace, c, got_runs: list, overrides) -> CallResult:
    seq, name = c["seq"], c["function"]
    runs = c.get("runs", [])
    res = CallResult(seq, name, "ok")
    if len(got_runs) != len(runs):
        res.state, res.note = "fail", f"ran {len(got_runs)} graph(s), recorded {len(runs)}"
        return res
    missing = 0
    for k, (run, got) in enumerate(zip(runs, got_runs)):
        math = run.get("math_type")
        for role, info in run.get("outputs", {}).items():
            want = trace.array(f"c{seq}.r{k}.{role}")
            if want is None:
                missing += 1
                continue
            if role not in got:
                res.outputs.append((k, role, info["dtype"], {"ok": False, "error": "not written"}, None))
                res.state = "fail"
                continue
            tol = tolerance(info["dtype"], math, overrides)
            cmp = compare(got[role], want, info["dtype"], *tol)
            res.outputs.append((k, role, info["dtype"], cmp, tol))
            if not cmp["ok"]:
                res.state = "fail"
    if missing and not res.outputs:
        res.state, res.note = "skip", "no recorded output tensors"
    return res


def _one_legacy(trace, c, sess, overrides) -> CallResult:
    seq, name = c["seq"], c["function"]
    if c.get("status", "CUDNN_STATUS_SUCCESS") != "CUDNN_STATUS_SUCCESS" or c.get("deferred"):
        return CallResult(seq, name, "skip", note="failed or deferred when recorded")
    if name not in LEGACY_FUNCTIONS:
        return CallResult(seq, name, "skip", note="no legacy libcudnn translation for this function")
    args = _Args(trace, "gpu", None)
    try:
        kwargs = {k: args.value(v, k) for k, v in c["args"].items()}
        outs = sess.call(name, kwargs, c.get("runs", [{}])[0].get("outputs", {}))
    except (Unreplayable, LegacyUnavailable) as e:
        return CallResult(seq, name, "skip", note=str(e))
    finally:
        args.release()
    return _check_outputs(trace, c, [outs], overrides)


# -- reports -------------------------------------------------------------------------------------

def _fmt(v, width=10):
    if v is None:
        return f"{'-':>{width}}"
    if isinstance(v, int):
        return f"{v:>{width}d}"
    return f"{v:>{width}.3e}"


def format_replay(results: list, engine: str) -> str:
    lines = [f"{'call':>6} {'function':<40} {'out':<10} {'dtype':<9} {'max_abs':>10} {'max_rel':>10} "
             f"{'max_ulp':>10}  result"]
    for r in results:
        if not r.outputs:
            lines.append(f"{'#' + str(r.seq):>6} {r.function:<40} {'':<10} {'':<9} {'':>10} {'':>10} {'':>10}  "
                         f"{r.state}" + (f": {r.note}" if r.note else ""))
        for k, role, dtype, cmp, tol in r.outputs:
            label = role if k == 0 else f"{role}[{k}]"
            verdict = "ok" if cmp.get("ok") else "FAIL"
            extra = cmp.get("error", "")
            if tol and not cmp.get("ok") and "worst" in cmp:
                w = cmp["worst"]
                extra = f"{cmp['bad']} of {cmp['n']} over rtol={tol[0]:g},atol={tol[1]:g}; worst {w['index']}: " \
                        f"got {w['got']:.6g}, recorded {w['want']:.6g}"
            lines.append(f"{'#' + str(r.seq):>6} {r.function:<40} {label:<10} {dtype:<9} {_fmt(cmp.get('max_abs'))} "
                         f"{_fmt(cmp.get('max_rel'))} {_fmt(cmp.get('max_ulp'))}  {verdict}"
                         + (f" ({extra})" if extra else ""))
    lines.append(summary(results, engine))
    return "\n".join(lines)


def summary(results: list, engine: str) -> str:
    n = {s: sum(r.state == s for r in results) for s in ("ok", "fail", "skip")}
    worst = None
    for r in results:
        for k, role, dtype, cmp, tol in r.outputs:
            if cmp.get("max_abs") is not None and (worst is None or cmp["max_abs"] > worst[0]):
                worst = (cmp["max_abs"], r, role, cmp)
    text = f"replayed {len(results)} call(s) on {engine}: {n['ok']} ok, {n['fail']} over tolerance or different, " \
           f"{n['skip']} skipped"
    if worst:
        text += f"; largest error {worst[0]:.3e} (call #{worst[1].seq} {worst[1].function} {worst[2]}, " \
                f"{worst[3].get('max_ulp')} ulp)"
    failed = [f"#{r.seq} {r.function}" for r in results if r.state == "fail"]
    if failed:
        text += "\nfailed: " + ", ".join(failed)
    return text


def exit_code(results: list) -> int:
    return 1 if any(r.state == "fail" for r in results) else 0


# -- diff ----------------------------------------------------------------------------------------

def diff(a: Trace, b: Trace, overrides: "dict | None" = None) -> tuple:
    """(report text, exit status): 0 when the traces agree within tolerance, 1 otherwise."""
    ca, cb = a.compute_calls, b.compute_calls
    lines, bad = [], 0
    ta = sum(c.get("time_s", 0.0) for c in ca)
    tb = sum(c.get("time_s", 0.0) for c in cb)
    for i, (x, y) in enumerate(zip(ca, cb)):
        tag = f"call {i} (A #{x['seq']}, B #{y['seq']})"
        if x["function"] != y["function"]:
            lines.append(f"{tag}: the traces diverge: A calls {x['function']}, B calls {y['function']}")
            bad += 1
            break
        name = x["function"]
        if x.get("status") != y.get("status"):
            lines.append(f"{tag} {name}: status A {x.get('status')}, B {y.get('status')}")
            bad += 1
            continue
        rx, ry = x.get("runs", []), y.get("runs", [])
        if len(rx) != len(ry):
            lines.append(f"{tag} {name}: A ran {len(rx)} graph(s), B {len(ry)}")
            bad += 1
            continue
        for k, (p, q) in enumerate(zip(rx, ry)):
            if (p.get("engine"), p.get("config")) != (q.get("engine"), q.get("config")):
                lines.append(f"{tag} {name}: engine A {p.get('config')}, B {q.get('config')}")
            for role, info in p.get("outputs", {}).items():
                other = q.get("outputs", {}).get(role)
                if other is None:
                    lines.append(f"{tag} {name} {role}: only A has this output")
                    bad += 1
                    continue
                wa, wb = a.array(f"c{x['seq']}.r{k}.{role}"), b.array(f"c{y['seq']}.r{k}.{role}")
                if wa is None or wb is None:
                    if info.get("digest") == other.get("digest"):
                        continue
                    lines.append(f"{tag} {name} {role}: contents differ (digest {info.get('digest')} vs "
                                 f"{other.get('digest')}; record with tensors for errors)")
                    bad += 1
                    continue
                tol = tolerance(info["dtype"], p.get("math_type"), overrides)
                cmp = compare(wb, wa, info["dtype"], *tol)
                if cmp.get("max_abs") == 0.0 and cmp.get("max_ulp") == 0:
                    continue
                state = "within tolerance" if cmp.get("ok") else "OVER tolerance"
                lines.append(f"{tag} {name} {role}: max_abs {cmp.get('max_abs', float('nan')):.3e} max_rel "
                             f"{cmp.get('max_rel', float('nan')):.3e} max_ulp {cmp.get('max_ulp')} ({state})")
                if not cmp.get("ok"):
                    bad += 1
    if len(ca) != len(cb):
        lines.append(f"A has {len(ca)} compute calls, B has {len(cb)}")
        bad += 1
    lines.append(f"compared {min(len(ca), len(cb))} compute call(s): {bad} difference(s) over tolerance; "
                 f"time A {ta * 1e3:.3f} ms, B {tb * 1e3:.3f} ms")
    return "\n".join(lines), (1 if bad else 0)


# -- the real legacy functions (replay --engine legacy) -------------------------------------------

class LegacyUnavailable(Exception):
    pass


# function -> (workspace-size query, its descriptor parameters) or None (no workspace).  The C
# argument order is the Python one, so arguments translate one by one.
LEGACY_FUNCTIONS = {
    "cudnnConvolutionForward": ("cudnnGetConvolutionForwardWorkspaceSize", ("xDesc", "wDesc", "convDesc", "yDesc")),
    "cudnnConvolutionBiasActivationForward": ("cudnnGetConvolutionForwardWorkspaceSize",
                                              ("xDesc", "wDesc", "convDesc", "yDesc")),
    "cudnnConvolutionBackwardData": ("cudnnGetConvolutionBackwardDataWorkspaceSize",
                                     ("wDesc", "dyDesc", "convDesc", "dxDesc")),
    "cudnnConvolutionBackwardFilter": ("cudnnGetConvolutionBackwardFilterWorkspaceSize",
                                       ("xDesc", "dyDesc", "convDesc", "dwDesc")),
    "cudnnAddTensor": None, "cudnnOpTensor": None, "cudnnActivationForward": None, "cudnnPoolingForward": None,
    "cudnnSoftmaxForward": None, "cudnnBatchNormalizationForwardInference": None,
}
_WORKSPACE = ("workSpace", "workSpaceSizeInBytes")


class LegacySession:
    """A real cudnnHandle_t and the translation of our descriptors into legacy ones."""

    def __enter__(self):
        try:
            from cudnn_compat._backend import legacy_cudnn as L
            L.load()
        except Exception as e:  # noqa: BLE001 - no libcudnn, no CUDA
            raise RuntimeError(f"engine legacy needs libcudnn: {type(e).__name__}: {e}") from None
        self.L = L
        self.lh = L.Handle()
        return self

    def __exit__(self, *exc):
        self.lh.destroy()

    def _desc(self, d, ds):
        from ..enums import ENUMS, name_of
        L = self.L
        n = type(d).__name__
        prop = lambda v: v == ENUMS["cudnnNanPropagation_t"]["CUDNN_PROPAGATE_NAN"]  # noqa: E731
        if n == "TensorDescriptor":
            return ds.tensor(d.dims, d.strides, d.dtype)
        if n == "FilterDescriptor":
            return ds.filter(d.dims, d.dtype, nhwc=d.format == ENUMS["cudnnTensorFormat_t"]["CUDNN_TENSOR_NHWC"])
        if n == "ConvolutionDescriptor":
            mode = name_of("cudnnConvolutionMode_t", d.mode)[len("CUDNN_"):]
            return ds.conv(d.pad, d.stride, d.dilation, mode, d.compute or "float32", d.groupCount,
                           name_of("cudnnMathType_t", d.mathType)[len("CUDNN_"):])
        if n == "ActivationDescriptor":
            act = {v: k for k, v in L.ACTIVATION.items()}
            return ds.activation(act[d.mode], d.coef, prop(d.reluNanOpt))
        if n == "PoolingDescriptor":
            return ds.pooling(d.mode, d.window, d.padding, d.stride, prop(d.nanOpt))
        if n == "OpTensorDescriptor":
            return ds.op_tensor(d.op, d.comp_dtype, prop(d.nanOpt))
        raise LegacyUnavailable(f"no legacy translation for a {n}")

    def call(self, name: str, kwargs: dict, outputs: dict) -> dict:
        """Run the legacy ``name`` on the decoded arguments; the recorded output roles as host arrays."""
        import cupy
        from .._core.data import scalar
        L = self.L
        ds = L.Descs()
        keep = []
        try:
            double = any(getattr(v, "dtype", None) == "float64" for v in kwargs.values() if isinstance(v, Descriptor)) \
                or any(getattr(v, "comp_dtype", None) == "float64" for v in kwargs.values())
            cargs, ptrs = [], {}
            for p, v in kwargs.items():
                if p == "handle":
                    cargs.append(self.lh.ptr)
                elif isinstance(v, Descriptor):
                    ptrs[p] = self._desc(v, ds)
                    cargs.append(ptrs[p])
                elif p in _WORKSPACE:
                    cargs.append(None)
                elif p.startswith(("alpha", "beta")):
                    c = (ctypes.c_double if double else ctypes.c_float)(scalar(v, p, double))
                    keep.append(c)
                    cargs.append(ctypes.addressof(c))
                elif isinstance(v, cupy.ndarray):
                    cargs.append(v.data.ptr)
                else:
                    cargs.append(v)
            ws = LEGACY_FUNCTIONS.get(name)
            if ws:
                query, names = ws
                size = L.workspace_size(query, self.lh, *(ptrs[n] for n in names), int(kwargs["algo"]))
                buf = cupy.empty(max(size, 1), cupy.uint8)
                keep.append(buf)
                params = list(kwargs)
                cargs[params.index("workSpace")] = buf.data.ptr
                cargs[params.index("workSpaceSizeInBytes")] = size
            L.call(name, *cargs)
            cupy.cuda.runtime.deviceSynchronize()
        except L.LegacyError as e:
            raise LegacyUnavailable(f"legacy {name} failed: {e}") from None
        finally:
            ds.destroy()
        out = {}
        for role, info in outputs.items():
            param = role if role in kwargs else role + "_data"
            buf = kwargs.get(param)
            if buf is None:
                continue
            raw = buf.get().reshape(-1).view(np.uint8)
            st = _dtypes.storage_dtype(info["dtype"])
            out[role] = np.ascontiguousarray(np.ndarray(tuple(info["dims"]), st, raw, 0,
                                                        tuple(s * st.itemsize for s in info["strides"])))
        return out


__all__ = ["load", "replay", "diff", "compare", "tolerance", "parse_tolerances", "format_replay", "exit_code",
           "TOLERANCES", "ENGINES", "LEGACY_FUNCTIONS", "Trace", "CallResult"]
