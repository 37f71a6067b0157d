"""Host cost of the ways Python can launch one small CUDA kernel (issue 14 item 3: which path the
cupy engine's launch records use).  Medians of per-call perf_counter over ``--calls`` launches of
a kernel y[i] = a * x[i] (two pointers and a float) on a 1-block grid:

  cupy_fresh     cupy Function.__call__ with a new tuple of np.uint64/np.float32 per call
  cupy_tuple     the same with one prebuilt args tuple
  cupy_arrays    Function.__call__ with the CuPy arrays themselves
  driver_launch  cupy.cuda.driver.launchKernel with a prepacked ctypes void* array (pointer
                 slots patched per call: ``.value =``)
  bindings       cuda.bindings.driver.cuLaunchKernel with the same prepacked array (if installed)
  ctypes_cu      libcuda's cuLaunchKernel through ctypes with the same array
  graph_1 / _3   cudaGraphLaunch (cupy.cuda.runtime.graphLaunch) of a captured 1- / 3-kernel graph
  stream_ptr     cupy.cuda.stream.get_current_stream_ptr() / get_current_stream().ptr alone
  py_calib       a fixed pure-Python workload (to compare host speeds between machines)

and the GPU time per launch (``gpu_us``: CUDA events around 2000 back-to-back launches of a busy
kernel, short and long, on the legacy default stream and on a non-blocking stream): ``direct``
(cuLaunchKernel), ``graph_one`` (one 1-kernel graph relaunched), ``graph_400`` (400 distinct
1-kernel graphs in turn: what per-call record graphs do in a program) and ``mixed`` (direct and
graph launches alternating), all after ``first`` (each of the 400 graphs launched once: its upload,
a one-time cost that earlier versions of this benchmark folded into ``graph_400`` on the legacy
default stream, measured first).  Per-call CUDA graphs of launch records are off by default
(CUDNN_COMPAT_CUPY_GRAPHS) because of what this shows (README).

    python benchmarks/launch_paths.py [--calls 10000] [--json PATH]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import device_name, median_us as med, missing_gpu_stack, py_calib, write_json_file  # noqa: E402

SRC = r'''extern "C" __global__ void scale(const float* x, float* y, float a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < 128) y[i] = a * x[i]; }'''


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import numpy as np
    try:
        import cupy
    except ImportError as e:
        sys.exit(missing_gpu_stack(__file__, e))
    out = {"cupy": cupy.__version__, "python": sys.version.split()[0]}
    sync = cupy.cuda.runtime.deviceSynchronize
    out["device"] = device_name()
    raw = cupy.RawModule(code=SRC).get_function("scale")  # CuPy 14: a RawKernel
    fn = getattr(raw, "kernel", raw)  # its Function on this device (.ptr: the CUfunction)
    x, y = cupy.ones(128, np.float32), cupy.zeros(128, np.float32)
    xp, yp = x.data.ptr, y.data.ptr
    res = {}
    res["rawkernel_fresh"] = med(lambda: raw((1,), (128,), (np.uint64(xp), np.uint64(yp), np.float32(2.0))),
                                 args.calls, sync)
    res["cupy_fresh"] = med(lambda: fn((1,), (128,), (np.uint64(xp), np.uint64(yp), np.float32(2.0))), args.calls, sync)
    tup = (np.uint64(xp), np.uint64(yp), np.float32(2.0))
    res["cupy_tuple"] = med(lambda: fn((1,), (128,), tup), args.calls, sync)
    res["cupy_arrays"] = med(lambda: fn((1,), (128,), (x, y, np.float32(2.0))), args.calls, sync)
    # a prepacked argument array: slots, and void* pointing at them
    s0, s1, s2 = ctypes.c_uint64(xp), ctypes.c_uint64(yp), ctypes.c_float(2.0)
    params = (ctypes.c_void_p * 3)(ctypes.addressof(s0), ctypes.addressof(s1), ctypes.addressof(s2))
    paddr = ctypes.addressof(params)
    fptr = fn.ptr
    out["has"] = {}
    try:
        from cupy.cuda import stream as _st
        gcsp = _st.get_current_stream_ptr
        out["has"]["get_current_stream_ptr"] = True
        res["stream_ptr"] = med(gcsp, args.calls, sync)
    except (ImportError, AttributeError):
        out["has"]["get_current_stream_ptr"] = False
        gcsp = lambda: cupy.cuda.get_current_stream().ptr  # noqa: E731
    res["stream_obj_ptr"] = med(lambda: cupy.cuda.get_current_stream().ptr, args.calls, sync)
    drv = cupy.cuda.driver
    out["has"]["driver.launchKernel"] = hasattr(drv, "launchKernel")
    if hasattr(drv, "launchKernel"):
        lk = drv.launchKernel

        def driver_launch():
            s0.value = xp
            s1.value = yp
            s2.value = 2.0
            lk(fptr, 1, 1, 1, 128, 1, 1, 0, gcsp(), paddr, 0)
        res["driver_launch"] = med(driver_launch, args.calls, sync)
        res["driver_launch_nopatch"] = med(lambda: lk(fptr, 1, 1, 1, 128, 1, 1, 0, 0, paddr, 0), args.calls, sync)
        y[...] = 0
        driver_launch()
        sync()
        out["driver_launch_correct"] = bool((y == 2).all())
    try:
        from cuda.bindings import driver as cbd
        out["has"]["cuda.bindings"] = True
        cf = cbd.CUfunction(fptr)

        def bindings():
            cbd.cuLaunchKernel(cf, 1, 1, 1, 128, 1, 1, 0, 0, paddr, 0)
        res["bindings"] = med(bindings, args.calls, sync)
    except Exception as e:  # noqa: BLE001
        out["has"]["cuda.bindings"] = f"{type(e).__name__}: {e}"[:200]
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        cu = libcuda.cuLaunchKernel
        cu.restype = ctypes.c_int
        cu.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                                                                  ctypes.c_void_p]
        res["ctypes_cu"] = med(lambda: cu(fptr, 1, 1, 1, 128, 1, 1, 0, 0, paddr, None), args.calls, sync)
    except Exception as e:  # noqa: BLE001
        out["has"]["ctypes_cu"] = f"{type(e).__name__}: {e}"[:200]
    # CUDA graphs of 1 and 3 kernels
    rt = cupy.cuda.runtime
    for nk in (1, 3):
        cap = cupy.cuda.Stream(non_blocking=True)
        with cap:
            cap.begin_capture()
            for _ in range(nk):
                fn((1,), (128,), tup)
            g = cap.end_capture()
        res[f"graph_{nk}"] = med(lambda: g.launch(), args.calls, sync)
        ge = getattr(g, "graphExec", None) or getattr(g, "_graph_exec", None)
        if ge is not None:
            res[f"graph_{nk}_raw"] = med(lambda: rt.graphLaunch(ge, 0), args.calls, sync)
    out["gpu_us"] = graph_gpu_time(cupy, np)
    res["py_calib"] = med(py_calib, args.calls, lambda: None)
    res["lock_with"] = med(_lock_cost(), args.calls, lambda: None)
    out["median_us"] = res
    for k, v in res.items():
        print(f"{k:24s} {v:7.2f} us")
    print(json.dumps(out["has"]))
    if args.json:
        write_json_file(args.json, out)


BUSY = r'''extern "C" __global__ void busy(float* y, int iters) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x; float v = y[i];
  for (int k = 0; k < iters; ++k) v = v * 0.999f + 0.001f;
  y[i] = v; }'''


def graph_gpu_time(cupy, np, n: int = 2000, graphs: int = 400) -> dict:
    """{iters/stream/path: [GPU us per launch, host us per launch]} (see the module docstring)."""
    rt = cupy.cuda.runtime
    k = cupy.RawModule(code=BUSY).get_function("busy")
    y = cupy.zeros(132 * 8 * 256, np.float32)
    cap = cupy.cuda.Stream(non_blocking=True)
    out = {}

    def one_graph(iters):
        rt.streamBeginCapture(cap.ptr)
        with cap:
            k((132 * 8,), (256,), (y, np.int32(iters)))
        g = rt.streamEndCapture(cap.ptr)
        try:
            return rt.graphInstantiate(g)
        finally:
            rt.graphDestroy(g)

    for iters in (200, 4000):
        execs = [one_graph(iters) for _ in range(graphs)]
        # each graph's first launch uploads it (a one-time cost, on any stream): timed apart, so the
        # paths below measure the steady state a program's call sites are in
        null = cupy.cuda.Stream.null
        null.synchronize()
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(null)
        t0 = time.perf_counter()
        for e in execs:
            rt.graphLaunch(e, null.ptr)
        host = (time.perf_counter() - t0) / graphs * 1e6
        e1.record(null)
        e1.synchronize()
        gpu = cupy.cuda.get_elapsed_time(e0, e1) / graphs * 1e3
        out[f"iters{iters}/null/graph_first"] = [round(gpu, 2), round(host, 2)]
        print(f"gpu_us iters={iters:5d} {'null':11s} {'first':10s} gpu {gpu:8.2f} us/launch  host {host:6.2f}", flush=True)
        for sname, st in (("null", cupy.cuda.Stream.null), ("nonblocking", cupy.cuda.Stream(non_blocking=True))):
            def direct(i, st=st, iters=iters):
                with st:
                    k((132 * 8,), (256,), (y, np.int32(iters)))
            paths = {"direct": direct,
                     "graph_one": lambda i, st=st: rt.graphLaunch(execs[0], st.ptr),
                     "graph_400": lambda i, st=st: rt.graphLaunch(execs[i % graphs], st.ptr),
                     "mixed": lambda i, st=st, direct=direct: rt.graphLaunch(execs[i % graphs], st.ptr) if i & 1
                     else direct(i)}
            for name, fn in paths.items():
                fn(0)
                st.synchronize()
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                e0.record(st)
                t0 = time.perf_counter()
                for i in range(n):
                    fn(i)
                host = (time.perf_counter() - t0) / n * 1e6
                e1.record(st)
                e1.synchronize()
                gpu = cupy.cuda.get_elapsed_time(e0, e1) / n * 1e3
                out[f"iters{iters}/{sname}/{name}"] = [round(gpu, 2), round(host, 2)]
                print(f"gpu_us iters={iters:5d} {sname:11s} {name:10s} gpu {gpu:8.2f} us/launch  host {host:6.2f}",
                      flush=True)
        for e in execs:
            rt.graphExecDestroy(e)
    return out


def _lock_cost():
    import threading
    lk = threading.Lock()

    def f():
        with lk:
            pass
    return f


if __name__ == "__main__":
    main()
