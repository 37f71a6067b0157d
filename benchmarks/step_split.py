"""Where the batch-1 ResNet-50 step's host time goes on a GPU machine (issue 26 item 8): the eager fp16
NHWC N=1 step of examples/resnet50_legacy.py (566 legacy calls) with every launch of the compiled
path -- cuLaunchKernel (launch records), cuLaunchKernelEx (cudnn graphs replayed as their kernels on
the legacy default stream) and cuGraphLaunch -- sent through a small C shim that times the driver's
own call and forwards it.  Per step, from an idle queue (synchronized before each step):

  issue   host ms to issue the step
  driver  ms inside the driver's launch calls, and per launch (by kind)
  rest    issue - driver: our call path, the example's script and its CuPy loss, CPython itself

then the same on a non-blocking stream (cudnnSetStream), and back-to-back steps (the eager figure).
The driver's share is what no change to our path can remove: at batch 1 it bounds the eager step.

    python benchmarks/step_split.py [--steps 40] [--out DIR]

Needs the compiled steady path (setup.py build_ext) and a C compiler (the shim is built at run time,
from SHIM below, with the compiler Python was built with); JSON step_split_<device>.json under --out.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]
from _common import RESULTS, device_name, host_calib_us, missing_gpu_stack, write_json  # noqa: E402

SHIM = r"""
#include <stdint.h>
#include <time.h>
typedef int (*lk_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
typedef int (*lke_t)(const void *, void *, void **, void **);
typedef int (*gl_t)(void *, void *);
static lk_t r_lk; static lke_t r_lke; static gl_t r_gl;
uint64_t acc[6];  /* ns and calls: cuLaunchKernel, cuLaunchKernelEx, cuGraphLaunch */
static inline uint64_t now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec; }
void set_real(void *a, void *b, void *c) { r_lk = (lk_t)a; r_lke = (lke_t)b; r_gl = (gl_t)c; }
int t_lk(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, void *s, void **p, void **e) {
    uint64_t t = now(); int r = r_lk(f, gx, gy, gz, bx, by, bz, sm, s, p, e); acc[0] += now() - t; acc[1]++; return r; }
int t_lke(const void *c, void *f, void **p, void **e) { uint64_t t = now(); int r = r_lke(c, f, p, e); acc[2] += now() - t; acc[3]++; return r; }
int t_gl(void *g, void *s) { uint64_t t = now(); int r = r_gl(g, s); acc[4] += now() - t; acc[5]++; return r; }
"""
KINDS = ("cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch")


def build_shim(folder: str):
    """The shim library (ctypes.CDLL), compiled from SHIM."""
    src, lib = os.path.join(folder, "shim.c"), os.path.join(folder, "shim.so")
    with open(src, "w") as f:
        f.write(SHIM)
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    subprocess.check_call(cc + ["-O2", "-shared", "-fPIC", "-o", lib, src])
    return ctypes.CDLL(lib)


def install(shim) -> None:
    """Every compiled launch through the shim: the launchers' and replays' driver addresses."""
    from cudnn_compat._backend import steady
    from cudnn_compat._backend.engines import graphs
    cu = steady.libcuda()
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    shim.set_real(*[ctypes.c_void_p(addr(getattr(cu, k))) for k in KINDS])
    steady._LAUNCH[0], steady._LAUNCH[1] = addr(shim.t_lk), addr(shim.t_gl)
    real = graphs.Driver.addresses
    graphs.Driver.addresses = lambda self: (addr(shim.t_lke),) + real(self)[1:]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40, help="steps per timed repetition (two repetitions)")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    try:
        import cupy
    except ImportError as e:
        return missing_gpu_stack(__file__, e)
    from cudnn_compat._backend import steady
    if steady.module() is None:
        print("step_split: skipped (the compiled steady path is not built or not used)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        try:
            shim = build_shim(tmp)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"step_split: skipped (no C compiler for the shim: {e})")
            return
        install(shim)
    acc = (ctypes.c_uint64 * 6).in_dll(shim, "acc")
    import cudnn_compat as cc
    import bench_programs
    h = cc.cudnnCreate()
    _net, _x, _labels, step = bench_programs.batch1_step(h)  # net.step(x, labels, lr=1e-3, sync=False)

    def measure(stream_name, sync):
        for _ in range(3):
            step()
        sync()
        reps = []
        for _ in range(2):
            rows = []
            for _ in range(args.steps):
                sync()
                a0, t0 = list(acc), time.perf_counter()
                step()
                t1 = time.perf_counter()
                d = [acc[i] - a0[i] for i in range(6)]
                rows.append(((t1 - t0) * 1e3, d))
            sync()
            issue, d = sorted(rows, key=lambda r: r[0])[len(rows) // 2]  # the median step
            drv = sum(d[0::2]) / 1e6
            reps.append({"issue_ms": issue, "driver_ms": drv, "rest_ms": issue - drv,
                         "launches": {k: d[2 * i + 1] for i, k in enumerate(KINDS)},
                         "driver_us_per_launch": {k: d[2 * i] / 1e3 / d[2 * i + 1] for i, k in enumerate(KINDS)
                                                  if d[2 * i + 1]}})
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        b2b = (time.perf_counter() - t0) / args.steps * 1e3
        best = min(reps, key=lambda r: r["issue_ms"])
        per = ", ".join(f"{k} {best['launches'][k]} x {u:.2f} us" for k, u in best["driver_us_per_launch"].items())
        print(f"{stream_name:12s} issue {best['issue_ms']:.3f} ms = driver {best['driver_ms']:.3f} ({per}) + rest "
              f"{best['rest_ms']:.3f}; back-to-back {b2b:.3f} ms/step", flush=True)
        return {"stream": stream_name, "reps": reps, "back_to_back_ms": b2b}

    rows = [measure("legacy", cupy.cuda.runtime.deviceSynchronize)]
    s = cupy.cuda.Stream(non_blocking=True)
    cc.cudnnSetStream(h, s.ptr)
    with s:
        rows.append(measure("non-blocking", s.synchronize))
    cc.cudnnSetStream(h, 0)
    out = {"config": "resnet50_step float16 NHWC N=1", "device": device_name(), "host_calib_us": host_calib_us(),
           "rows": rows}
    print("wrote", write_json("step_split", out, args.out))


if __name__ == "__main__":
    sys.exit(main())
