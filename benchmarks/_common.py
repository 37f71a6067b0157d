"""Shared benchmark plumbing: CUDA-event timing, the device name and tag, run metadata, and the
JSON results file ``benchmarks/results/<prefix>_<device tag>.json``.

    from _common import cuda_time, device_name, meta, write_json   # with benchmarks/ on sys.path

``cuda_time(fn, iters, reps, warm)`` runs ``fn`` ``warm`` times, then ``reps`` times ``iters``
calls between two CUDA events on the current stream, and returns the median milliseconds per call
(with the minimum and every repetition's figure).  ``events='torch'`` uses torch's events on
torch's current stream (for work torch launches); the default uses CuPy's.

Every JSON a benchmark writes records when and from what code it ran: ``write_json_file`` adds
``"run": {"git_commit": ..., "utc": "YYYY-MM-DDTHH:MM:SSZ"}`` (``run_stamp``; the commit from
``git`` in the checkout, "-dirty" when tracked files differ from it, else from BENCH_GIT_COMMIT for
a tree shipped without .git, else "unknown").

Every script under benchmarks/ uses this module for its CUDA-event timing, the device name and
writing its JSON (``write_json`` names the file after the device; ``write_json_file`` writes a
path the script chose).  The GPU scripts import torch and CuPy in a guarded block so that
``--help`` works on any machine (tests/test_benchmarks_import.py); ``missing_gpu_stack`` is the
one line they print, with exit status 2, when run without them.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def repo_on_path() -> None:
    """Make ``cudnn_compat``, ``_backend`` and ``examples`` importable from a benchmark script."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def device_name() -> str:
    """The CUDA device's name (CuPy), or 'cpu' when there is none."""
    try:
        import cupy
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no CuPy or no device
        return "cpu"


def device_tag(name: "str | None" = None) -> str:
    """The device name as a file-name tag: 'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3'."""
    name = device_name() if name is None else name
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")


def meta(**extra) -> dict:
    """Where and with what a benchmark ran: device, libcudnn, CuPy, torch, NumPy, Python, time."""
    out = {"device": device_name(), "python": platform.python_version(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    for mod in ("numpy", "cupy", "torch"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            out[mod] = None
    try:
        repo_on_path()
        from cudnn_compat._backend.engines.cudnn_engine import lib as nlib
        out["libcudnn"] = nlib.info()
    except Exception as e:  # noqa: BLE001
        out["libcudnn"] = f"unavailable: {type(e).__name__}"
    out.update(extra)
    return out


def _events(kind: str):
    if kind == "torch":
        import torch
        return (lambda: torch.cuda.Event(enable_timing=True)), torch.cuda.synchronize, \
            (lambda a, b: a.elapsed_time(b))
    import cupy
    return cupy.cuda.Event, cupy.cuda.Device().synchronize, cupy.cuda.get_elapsed_time


def cuda_time(fn, iters: int = 10, reps: int = 5, warm: int = 2, events: str = "cupy", before=None) -> dict:
    """{'ms': median ms per call, 'min_ms', 'reps_ms': [...]} over ``reps`` runs of ``iters`` calls.
    ``before``: also called after the warm-up's device synchronize (e.g. ``torch.cuda.synchronize``)."""
    make, sync, elapsed = _events(events)
    for _ in range(warm):
        fn()
    sync()
    if before is not None:
        before()
    per = []
    for _ in range(reps):
        a, b = make(), make()
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        per.append(elapsed(a, b) / iters)
    return {"ms": statistics.median(per), "min_ms": min(per), "reps_ms": per}


def issue_time(fn, iters: int = 10, reps: int = 3, warm: int = 2, sync=None) -> float:
    """Host milliseconds per call spent issuing ``fn`` (no synchronization inside a repetition; ``sync``
    between repetitions, untimed), the median over ``reps``.  Against ``cuda_time``'s figure for the
    same calls it says whether they are bound by the host, but only while the launch queue never
    fills: once it does, a launch waits for the device and issuing takes as long as running.  For a
    call of hundreds of launches use ``iters=1`` (each call issued from an idle queue) and compare
    with ``device_floor_ms``."""
    for _ in range(warm):
        fn()
    per = []
    for _ in range(reps):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        per.append((time.perf_counter() - t0) * 1e3 / iters)
    if sync:
        sync()
    return statistics.median(per)


_SPIN = []


def device_floor_ms(fn, reps: int = 7, warm: int = 2, spin_ms: float = 60.0) -> dict:
    """What the device needs for ``fn``'s launches when the host is not the limit: a spin kernel
    (``%globaltimer``, ``spin_ms``) holds the legacy stream while ``fn`` issues everything behind it,
    and events around ``fn`` time the device's run of the queued launches (the per-launch gaps stay;
    the host's speed does not show).  {'ms': median, 'min_ms', 'host_ms': the median host time
    issuing ``fn`` behind the spin}.  ``spin_ms`` must outlast that host time (checked)."""
    import cupy
    if not _SPIN:
        _SPIN.append(cupy.RawKernel(r"""extern "C" __global__ void spin(unsigned long long ns) {
            unsigned long long t0, t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
            do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
        }""", "spin"))
    spin = _SPIN[0]
    for _ in range(warm):
        fn()
    dev, host = [], []
    for _ in range(reps):
        cupy.cuda.Device().synchronize()
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        spin((1,), (1,), (cupy.uint64(int(spin_ms * 1e6)),))
        a.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        b.record()
        b.synchronize()
        dev.append(cupy.cuda.get_elapsed_time(a, b))
    if statistics.median(host) > 0.8 * spin_ms:
        raise RuntimeError(f"device_floor_ms: issuing took {statistics.median(host):.1f} ms, the spin lasts "
                           f"{spin_ms} ms: raise spin_ms")
    return {"ms": statistics.median(dev), "min_ms": min(dev), "host_ms": statistics.median(host)}


def median_us(fn, calls: int, sync=None, warm: int = 200, every: int = 1000) -> float:
    """Median microseconds of one ``fn()`` over ``calls`` calls timed one by one, after ``warm`` calls;
    ``sync`` (if given) after the warm-up, every ``every`` calls (so a launch queue never fills) and
    at the end, untimed."""
    for _ in range(warm):
        fn()
    if sync:
        sync()
    ts, pc = [], time.perf_counter
    for i in range(calls):
        t0 = pc()
        fn()
        ts.append(pc() - t0)
        if sync and i % every == every - 1:
            sync()
    if sync:
        sync()
    return statistics.median(ts) * 1e6


def driver_launch_us(calls: int = 20000) -> float:
    """Median host microseconds of one cuLaunchKernel of an empty kernel on the legacy stream (CuPy's
    Cython binding, parameters packed once; the queue drained every 500): the driver's own cost of a
    launch on this host, which no library on it can go below (launch_paths' ``driver_launch_nopatch``)."""
    import ctypes
    import cupy
    f = cupy.RawKernel(r'extern "C" __global__ void empty(int *p) {}', "empty").kernel.ptr
    slot = ctypes.c_uint64(0)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(slot))
    lk, addr = cupy.cuda.driver.launchKernel, ctypes.addressof(params)
    return median_us(lambda: lk(f, 1, 1, 1, 32, 1, 1, 0, 0, addr, 0), calls, cupy.cuda.Device().synchronize,
                     warm=500, every=500)


def py_calib() -> int:
    """A fixed pure-Python workload: its time (``host_calib_us``) compares host speeds between machines."""
    d = {1: 2, 3: 4}
    t = (1, 2, 3)
    s = 0
    for i in range(20):
        s += d.get(i & 3, 0) + len(t)
    return s


def host_calib_us(calls: int = 20000) -> float:
    """Median microseconds of one ``py_calib`` (the host's Python speed, as launch_paths prints it)."""
    return median_us(py_calib, calls, warm=0)


def wall_time(fn, iters: int = 10, warm: int = 1, sync=None) -> float:
    """Host wall milliseconds per call (``sync`` after the loop)."""
    for _ in range(warm):
        fn()
    if sync:
        sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if sync:
        sync()
    return (time.perf_counter() - t0) * 1e3 / iters


def write_json(prefix: str, payload: dict, out_dir: "str | None" = None, device: "str | None" = None) -> str:
    """Write ``payload`` to ``<out_dir>/<prefix>_<device tag>.json`` (default benchmarks/results)."""
    out_dir = out_dir or RESULTS
    return write_json_file(os.path.join(out_dir, f"{prefix}_{device_tag(device)}.json"), payload)


def git_commit(root: str = ROOT) -> str:
    """BENCH_GIT_COMMIT when set (a copied tree: ``BENCH_GIT_COMMIT=$(git rev-parse HEAD)`` where it
    was copied from; the copy's own .git, if any, may be another commit's), else the checkout's
    commit ("<sha>-dirty" when tracked files differ), else "unknown".  A BENCH_GIT_COMMIT that names
    the copy's own HEAD while its tracked files differ (read with git on the copy, not where it was
    copied from) gets "-dirty" too: the files that ran are not that commit's."""
    import subprocess
    given = os.environ.get("BENCH_GIT_COMMIT", "").strip()
    try:
        sha = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = bool(sha) and bool(subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                                  capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", False
    if given:
        same = bool(sha) and (sha.startswith(given) or given.startswith(sha))
        return given + ("-dirty" if same and dirty and not given.endswith("-dirty") else "")
    return (sha + ("-dirty" if dirty else "")) if sha else "unknown"


_STAMP: dict = {}


def run_stamp() -> dict:
    """{"git_commit", "utc"} of this run (the time the first JSON of the process was written)."""
    if not _STAMP:
        _STAMP.update(git_commit=git_commit(), utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return dict(_STAMP)


def write_json_file(path: str, payload: dict) -> str:
    """Write ``payload`` as JSON (indent 1) to ``path``, creating its folder, with the run's commit
    and UTC time under ``"run"`` (``run_stamp``); atomic (a temporary file, then ``os.replace``).
    Returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    payload = dict(payload, run={**run_stamp(), **(payload.get("run") or {})})
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1, default=_jsonable)
    os.replace(tmp, path)
    return path


def missing_gpu_stack(script: str, error: BaseException) -> int:
    """A GPU benchmark run without torch or CuPy: one line on stderr; returns the exit status 2."""
    print(f"{os.path.basename(script)}: needs a CUDA GPU with CuPy (and torch for its comparisons) "
          f"({type(error).__name__}: {error}); install them, e.g. pip install 'cudnn-compat[cuda12]' torch",
          file=sys.stderr)
    return 2


def _jsonable(v):
    try:
        import numpy as np
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, np.ndarray):
            return v.tolist()
    except Exception:  # noqa: BLE001
        pass
    return repr(v)


def rel_err(got, want) -> float:
    """max |got - want| / max |want| over host copies (float64)."""
    import numpy as np
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    return float(np.max(np.abs(g - w)) / scale) if scale > 0 else float(np.max(np.abs(g - w)) if g.size else 0.0)


def fmt_ms(v) -> str:
    return f"{v:9.3f}" if isinstance(v, (int, float)) else f"{'-':>9s}"


__all__ = ["RESULTS", "ROOT", "repo_on_path", "device_name", "device_tag", "meta", "cuda_time", "wall_time",
           "write_json", "write_json_file", "missing_gpu_stack", "rel_err", "fmt_ms"]


# -- convolution problems (bench_conv.py, conv_configs.py) --------------------------------------------

CCDT = {"float32": "CUDNN_DATA_FLOAT", "float16": "CUDNN_DATA_HALF", "bfloat16": "CUDNN_DATA_BFLOAT16"}


def strides(dims, layout):
    """Packed strides of logical (N, C, *spatial) ``dims`` stored NCHW or NHWC."""
    n = len(dims)
    order = list(range(n)) if layout == "NCHW" else [0] + list(range(2, n)) + [1]
    st, acc = [0] * n, 1
    for ax in reversed(order):
        st[ax] = acc
        acc *= dims[ax]
    return tuple(st)


def conv_descriptors(pb, math: str = "CUDNN_DEFAULT_MATH") -> tuple:
    """(xDesc, yDesc, wDesc, convDesc) through cudnn_compat for a 2-d problem ``pb`` with fields
    xd, yd, wd (dims), pad, stride, layout, dtype; cross-correlation, float compute, ``math``."""
    import cudnn_compat as cc
    dt = getattr(cc, CCDT[pb.dtype])
    xd, yd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(xd, dt, 4, list(pb.xd), list(strides(pb.xd, pb.layout)))
    cc.cudnnSetTensorNdDescriptor(yd, dt, 4, list(pb.yd), list(strides(pb.yd, pb.layout)))
    wd = cc.cudnnCreateFilterDescriptor()
    fmt = cc.CUDNN_TENSOR_NHWC if pb.layout == "NHWC" else cc.CUDNN_TENSOR_NCHW
    cc.cudnnSetFilterNdDescriptor(wd, dt, fmt, 4, list(pb.wd))
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolutionNdDescriptor(cd, 2, list(pb.pad), list(pb.stride), [1, 1], cc.CUDNN_CROSS_CORRELATION,
                                       cc.CUDNN_DATA_FLOAT)
    cc.cudnnSetConvolutionMathType(cd, getattr(cc, math))
    return xd, yd, wd, cd
