"""Host cost of a cached legacy call (issue 5: "the cached call path is lean").

Times repeated identical calls of a tiny problem, so the plan cache always hits and the
device work is negligible; what is left is the legacy layer (descriptor resolve, key,
plan-cache lookup, binding, variant pack) and, on the GPU, the engine's execute.

  --place cpu   a no-op engine (its plans do nothing) on a CPU handle with NumPy buffers:
                the cost of the legacy and graph layers alone, measurable without a GPU
  --place gpu   the native ``cudnn`` engine on a GPU handle with CuPy buffers (what
                benchmarks/bench_conv.py's host section measures for the forward call)

Cases: cudnnConvolutionForward (1x8x8x8 fp32 NCHW, 3x3 pad 1, alpha 1, beta 0) and
cudnnConvolutionBiasActivationForward (the same conv in fp16 NHWC, bias, ReLU, alpha2 0),
plus ``plan``: the cached forward plan's execute alone with a prebuilt pack (the engine's share).

    PYTHONPATH=. python benchmarks/host_overhead.py [--place cpu|gpu] [--calls 20000]
        [--profile] [--root DIR] [--json PATH]

``--root`` imports cudnn_compat from another tree (e.g. an export of an older commit) so
before/after can be measured by one script.  Prints microseconds per call: mean (timeit), median (per-call
perf_counter) and this thread's CPU time per call (not inflated by other load; on the GPU it
excludes time the driver spends blocked); ``--profile`` adds cProfile's top functions by own time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import timeit


def _setup_path(root):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.abspath(root) if root else here)


def _noop_engine():
    from _backend import heuristics
    from _backend.engines.base import REGISTRY, Engine, ExecutionPlan

    class NoopPlan(ExecutionPlan):
        def execute(self, pack, stream=None):
            pass

    class Noop(Engine):
        name, places = "noop", ("cpu",)

        def build(self, graph, config):
            return NoopPlan(graph, config)

    REGISTRY.register(Noop())
    heuristics.ORDER["cpu"] = ("noop",)


def make_calls(place: str):
    """{case: zero-argument callable} for the cached calls on ``place``."""
    import numpy as np
    import cudnn_compat as cc
    if place == "cpu":
        _noop_engine()
        xp = np
    else:
        import cupy as xp
    h = cc.cudnnCreate(place)

    def td(shape, fmt, dt):
        d = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensor4dDescriptor(d, fmt, dt, *shape)
        return d

    def problem(fmt, dt, npdt):
        xd, yd, bd = td((1, 8, 8, 8), fmt, dt), td((1, 8, 8, 8), fmt, dt), td((1, 8, 1, 1), cc.CUDNN_TENSOR_NCHW, dt)
        wd = cc.cudnnCreateFilterDescriptor()
        cc.cudnnSetFilter4dDescriptor(wd, dt, fmt, 8, 8, 3, 3)
        cd = cc.cudnnCreateConvolutionDescriptor()
        cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
        algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
        ws_size = cc.cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algo)
        ws = xp.empty(max(ws_size, 1), np.uint8) if ws_size else None
        bufs = (xp.ones(512, npdt), xp.ones(576, npdt), xp.zeros(512, npdt), xp.ones(8, npdt))
        return (xd, wd, yd, bd, cd, algo, ws, ws_size), bufs

    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    # the forward: fp32 NCHW (as benchmarks/bench_conv.py's host section); the fused call: fp16 NHWC,
    # the layout cuDNN 9 fuses epilogues in (fp32 NCHW would run on the next engine)
    (xd, wd, yd, _bd, cd, algo, ws, ws_size), (x, w, y, _b) = problem(cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT,
                                                                       np.float32)
    (xh, wh, yh, bh, ch, algo_h, wsh, wsh_size), (x16, w16, y16, b16) = problem(cc.CUDNN_TENSOR_NHWC,
                                                                               cc.CUDNN_DATA_HALF, np.float16)
    calls = {
        "conv_fwd": lambda: cc.cudnnConvolutionForward(h, 1.0, xd, x, wd, w, cd, algo, ws, ws_size, 0.0, yd, y),
        "conv_bias_act": lambda: cc.cudnnConvolutionBiasActivationForward(
            h, 1.0, xh, x16, wh, w16, ch, algo_h, wsh, wsh_size, 0.0, yh, y16, bh, b16, ad, yh, y16),
    }
    calls["conv_bias_act"]()
    calls["conv_bias_act"].engine = cc._call.last_plan().engine
    calls["conv_fwd"]()
    calls["conv_fwd"].engine = cc._call.last_plan().engine
    calls["conv_fwd_plan"] = _plan_only(cc, x, w, y, ws, ws_size)
    return calls


def _plan_only(cc, x, w, y, ws, ws_size):
    """The cached forward plan's execute with a prebuilt pack (no legacy layer)."""
    from _backend.engines.base import VariantPack
    from cudnn_compat import _data
    plan = cc._call.last_plan()
    bufs = {1: x, 2: w, 3: y}
    data = {}
    for t in plan.graph.external_inputs() + plan.graph.external_outputs():
        if t.is_by_value:
            data[t.uid] = 1.0 if t.uid == 9001 else 0.0
        elif getattr(plan, "raw_pointers", False):
            data[t.uid] = bufs[t.uid].data.ptr
        else:
            data[t.uid] = _data._host_view(bufs[t.uid], t, "x")
    pack = VariantPack(data, ws, ws_size)
    return lambda: plan.execute(pack, None)


def measure(fn, calls: int, sync=None) -> dict:
    for _ in range(200):
        fn()
    if sync:
        sync()
    mean = timeit.timeit(fn, number=calls) / calls * 1e6
    if sync:
        sync()
    # this thread's CPU time per call (time.thread_time): not inflated when other load preempts us
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    cpu = (time.thread_time() - t0) / calls * 1e6
    if sync:
        sync()
    ts, pc = [], time.perf_counter
    for _ in range(calls):
        t0 = pc()
        fn()
        ts.append(pc() - t0)
    if sync:
        sync()
    return {"mean_us": mean, "median_us": statistics.median(ts) * 1e6, "thread_cpu_us": cpu}


def profile(fn, calls: int, top: int = 18) -> str:
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--place", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--root", help="import cudnn_compat and _backend from this tree")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    _setup_path(args.root)
    sync = None
    if args.place == "gpu":
        import cupy
        sync = cupy.cuda.runtime.deviceSynchronize
    out = {"place": args.place, "root": args.root or "", "label": args.label, "calls": args.calls, "cases": {}}
    for case, fn in make_calls(args.place).items():
        try:
            r = measure(fn, args.calls, sync)
        except Exception as e:  # noqa: BLE001 - report and go on (an older tree may lack a case)
            out["cases"][case] = {"error": f"{type(e).__name__}: {e}"[:300]}
            print(f"{args.label:8s} {args.place} {case:15s} error: {e}", flush=True)
            continue
        r["engine"] = getattr(fn, "engine", "")
        out["cases"][case] = r
        print(f"{args.label:8s} {args.place} {case:15s} [{r['engine']:9s}] mean {r['mean_us']:6.1f}  median {r['median_us']:6.1f}  "
              f"thread-cpu {r['thread_cpu_us']:6.1f} us",
              flush=True)
        if args.profile and not case.endswith("_plan"):
            text = profile(fn, min(args.calls, 5000))
            out["cases"][case]["profile"] = text
            print(text, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
