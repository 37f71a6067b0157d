"""Our host cost of the batch-1 ResNet-50 training step without a GPU (issue 26 item 8): the step of
examples/resnet50_legacy.py (N=1, 224x224, fp16 NHWC, 566 legacy calls) on the emulated GPU place
(tests/host_emu.py: the native and cupy engines' cached paths over stand-ins, no kernel runs), with
the compiled launchers pointed at ``_steady``'s recording stubs (nothing launches).  What remains
is what a GPU host spends in our call path and in the example's script, less the driver: the figure
to compare trees with on one machine, where the GPU hosts swing 2x between runs.

    python benchmarks/host_step.py [--reps 3] [--steps 200]

Prints ms per step and us per call (the step's calls counted once); JSON host_step_cpu.json under
--out.  Without the compiled extension (no C compiler at install, or CUDNN_COMPAT_COMPILED=0) the
Python twins run and the stand-ins launch in Python: the row says so (``compiled``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT, os.path.join(ROOT, "tests")]
from _common import RESULTS, host_calib_us, write_json  # noqa: E402


def emulated_step():
    """(step, calls per step, compiled): the example's N=1 fp16 step on the emulated place."""
    import numpy as np
    import host_emu
    from cudnn_compat._backend import steady
    from cudnn_compat._backend.engines import graphs
    from cudnn_compat._backend.engines.cupy_engine import runtime
    import bench_programs
    emu = host_emu.Emu("noop", cudnn=True)
    runtime.cupy().cuda.driver = types.SimpleNamespace(CUDADriverError=RuntimeError)
    mod = steady.module()
    if mod is not None:  # the compiled launchers on the recording stubs
        launch, glaunch = mod.stub(0), mod.graph_stub()
        steady.launch_address = lambda _lk: launch
        graphs.GRAPHS[0].launch_address = lambda: glaunch
        graphs.GRAPHS[0].error_type = lambda: RuntimeError
    ex = bench_programs.load_example()
    E = host_emu.EmuArray
    xp = types.SimpleNamespace(zeros=lambda s, d=np.float32: E(np.zeros(s, d)), ones=lambda s, d=np.float32: E(np.ones(s, d)),
                               empty=lambda s, d=np.float32: E(np.zeros(s, d)),
                               asarray=lambda a, *k: a if isinstance(a, E) else E(np.asarray(a)))
    init = ex.Net.__init__

    def on_emu(self, handle, *a, **k):  # build on the CPU place, then run on the emulated GPU place
        handle.place = "cpu"
        init(self, handle, *a, **k)
        handle.place = "gpu"
        self.place, self.xp = "gpu", xp
    ex.Net.__init__ = on_emu
    # the step's legacy calls: forward, backward and sgd(1e-3), without the loss, on a zero input
    _net, _x, _labels, step = bench_programs.batch1_step(emu.handle(), ex=ex, algo_search="get",
                                                         x_nchw=np.zeros((1, 3, 224, 224)), loss=False)
    calls = []
    from cudnn_compat._core import registry

    def count(proceed, c_name, args, kwargs):
        calls.append(c_name)
        return proceed(args, kwargs)
    step()
    registry.HOOKS.append(count)
    try:
        step()
    finally:
        registry.HOOKS.remove(count)
    return step, len(calls), mod is not None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200, help="steps per timed repetition")
    ap.add_argument("--quick", action="store_true", help="one repetition of 20 steps")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    reps, steps = (1, 20) if args.quick else (args.reps, args.steps)
    step, ncalls, compiled = emulated_step()
    for _ in range(5):
        step()
    ms = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        ms.append((time.perf_counter() - t0) / steps * 1e3)
    best = min(ms)
    row = {"config": "resnet50_step float16 NHWC N=1, emulated GPU place, stub launches", "calls": ncalls,
           "compiled": compiled, "ms_per_step": ms, "us_per_call": best * 1e3 / max(ncalls, 1),
           "py_calib_us": host_calib_us()}
    print(f"{row['config']}: {best:.3f} ms per step ({', '.join(f'{m:.3f}' for m in ms)}), {ncalls} calls: "
          f"{row['us_per_call']:.2f} us per call, script included (compiled: {compiled}; py_calib "
          f"{row['py_calib_us']:.2f} us)")
    print("wrote", write_json("host_step", {"device": "cpu", "rows": [row]}, args.out, device="cpu"))


if __name__ == "__main__":
    main()
