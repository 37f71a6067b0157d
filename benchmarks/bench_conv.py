"""Convolution benchmark (issue 5): ResNet-50 conv layers through our legacy API on a GPU
handle (native ``cudnn`` engine) vs the real legacy libcudnn call (the fastest
cudnnFind*Algorithm result of the row's math type, its workspace) vs torch (cudnn.benchmark
on, channels_last for NHWC).  Every side runs the same math type (MATH_OF): TENSOR_OP_MATH for
fp16/bf16, DEFAULT_MATH (TF32 allowed, torch's allow_tf32) for fp32; each row records it
(``math``, and ``legacy_math``: the math type of the Find result taken).  CUDA-event timing
after warm-up; TFLOP/s.

  ours      cudnn_compat.cudnnConvolution* (the whole cached legacy call: plan-cache lookup,
            binding, variant pack, execute) with the algorithm our cudnnFind*Algorithm ranks
            fastest of the row's math type: the legacy column's rule (``ours_algo``, ``legacy_algo``)
  ours_plan the cached plan's execute alone (no legacy-layer binding): the engine's cost
  legacy    the real cudnnConvolution* through ctypes
  torch     F.conv2d / aten.convolution_backward

Also conv+bias+relu fused (ConvolutionBiasActivationForward) vs the three legacy calls
(Convolution, AddTensor, ActivationForward) vs the legacy fused call vs torch, and the host
cost of a cached tiny conv call (median microseconds per call).

    python benchmarks/bench_conv.py [--quick] [--iters 20] [--out benchmarks/results]
Writes a table to stdout and JSON (with the device name) under --out.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import conv_descriptors, cuda_time, device_name, missing_gpu_stack, strides, write_json  # noqa: E402

try:  # guarded so that --help works without a GPU stack; main() reports what is missing
    import torch  # noqa: E402  (first: its libcudnn is the one cuda.pathfinder then finds loaded)
    import cupy  # noqa: E402
except ImportError as _e:
    torch = cupy = None
    _MISSING = _e

import cudnn_compat as cc  # noqa: E402
from cudnn_compat._backend import legacy_cudnn as L  # noqa: E402

LAYERS = [  # name, C, K, HW, R, pad, stride
    ("3x3 64@56", 64, 64, 56, 3, 1, 1),
    ("1x1 256->64@56", 256, 64, 56, 1, 0, 1),
    ("3x3 128@28", 128, 128, 28, 3, 1, 1),
    ("3x3 512@7", 512, 512, 7, 3, 1, 1),
    ("1x1 1024->256@14", 1024, 256, 14, 1, 0, 1),
]
CONFIGS = [("fp16 NHWC", "float16", "NHWC"), ("bf16 NHWC", "bfloat16", "NHWC"), ("fp32 NCHW", "float32", "NCHW"),
           ("fp32 NHWC", "float32", "NHWC")]
DIRS = ("fwd", "bwd_data", "bwd_filter")
# The math type every side runs with (like with like, issue 23 item 8): tensor cores for the
# 16-bit rows (TENSOR_OP_MATH on our descriptor and on the real legacy one, whose Find result is
# the fastest of that math type; torch runs them on tensor cores anyway), DEFAULT_MATH for float32
# (TF32 allowed on every side: torch.backends.cudnn.allow_tf32).
MATH_OF = {"float16": "TENSOR_OP_MATH", "bfloat16": "TENSOR_OP_MATH", "float32": "DEFAULT_MATH"}
MATH_NAME = {v: k for k, v in L.MATH.items()}


def fastest_of_math(perf: list, math: str) -> dict:
    """The fastest Find result (they come fastest first) with the math type ``math``; else the
    fastest of any, which the row then names (legacy_math)."""
    same = [p for p in perf if p["mathType"] == L.MATH[math]]
    if not same and not perf:
        raise RuntimeError("cudnnFind*Algorithm returned no successful result")
    return min(same or perf, key=lambda p: p["time"])
KIND = {"fwd": "Forward", "bwd_data": "BackwardData", "bwd_filter": "BackwardFilter"}


def operands(direction: str, x, w, y) -> tuple:
    """A direction's three operands in its legacy call's order (two inputs, then the output), each
    given as (descriptor, array)."""
    return {"fwd": (x, w, y), "bwd_data": (w, y, x), "bwd_filter": (x, y, w)}[direction]


def timeit(fn, iters, warm=3):
    """Milliseconds per call: one run of ``iters`` calls between CUDA events (_common.cuda_time)."""
    return cuda_time(fn, iters, reps=1, warm=warm)["ms"]


def rand(n, dtype):
    v = cupy.random.standard_normal(n, dtype=cupy.float32) * 0.5
    if dtype == "bfloat16":
        return (v.view(cupy.uint32) >> 16).astype(cupy.uint16)
    return v.astype(dtype)


class Problem:
    def __init__(self, layer, dtype, layout, n):
        self.name, c, k, hw, r, pad, stride = layer
        self.dtype, self.layout, self.n = dtype, layout, n
        p = 1 + (hw + 2 * pad - r) // stride
        self.xd, self.wd, self.yd = (n, c, hw, hw), (k, c, r, r), (n, k, p, p)
        self.pad, self.stride = (pad, pad), (stride, stride)
        self.flops = 2.0 * n * k * p * p * c * r * r
        self.x, self.w, self.y = (rand(int(np.prod(d)), dtype) for d in (self.xd, self.wd, self.yd))


# -- ours ---------------------------------------------------------------------------------------

class Ours:
    def __init__(self, pb: Problem, handle):
        self.h, self.pb = handle, pb
        self.xd, self.yd, self.wd, self.cd = conv_descriptors(pb, "CUDNN_" + MATH_OF[pb.dtype])

    def args(self, direction):
        pb = self.pb
        return operands(direction, (self.xd, pb.x), (self.wd, pb.w), (self.yd, pb.y))

    def call(self, direction, algo=None):
        """(the call, its algo): by default our cudnnFind*Algorithm's fastest result of the row's math
        type (else the fastest) and its workspace size, the legacy column's rule (``Legacy.call``),
        as a ported program picks its algorithm."""
        h = self.h
        (d1, a1), (d2, a2), (d3, a3) = self.args(direction)
        k = KIND[direction]
        if algo is None:
            perf = getattr(cc, f"cudnnFindConvolution{k}Algorithm")(h, d1, d2, self.cd, d3, 16)
            ok = [dict(algo=p.algo, time=p.time, mathType=p.mathType) for p in perf
                  if p.status == cc.CUDNN_STATUS_SUCCESS]
            algo = fastest_of_math(ok, MATH_OF[self.pb.dtype])["algo"]
        ws = getattr(cc, f"cudnnGetConvolution{k}WorkspaceSize")(h, d1, d2, self.cd, d3, algo)
        buf = cupy.empty(max(ws, 1), cupy.uint8)
        fn = getattr(cc, f"cudnnConvolution{k}")
        return (lambda: fn(h, 1.0, d1, a1, d2, a2, self.cd, algo, buf, ws, 0.0, d3, a3)), algo


def last_plan():
    """The plan of this thread's last legacy call (``cudnn_compat._core.call.last_plan``)."""
    return cc._core.call.last_plan()


def plan_only(plan, pb: Problem, direction):
    """plan.execute with a prebuilt variant pack: the engine's own per-call cost."""
    from cudnn_compat._backend.engines.base import VariantPack
    bufs = (pb.x, pb.w, pb.y)  # uids 1, 2, 3 of cudnn_compat.convolution.api graphs
    data = {}
    for t in plan.graph.external_inputs() + plan.graph.external_outputs():
        if t.is_by_value:
            data[t.uid] = 1.0 if t.uid == 9001 else 0.0
        else:
            data[t.uid] = bufs[t.uid - 1].data.ptr  # raw pointers, as the legacy layer binds them
    ws = cupy.empty(max(plan.workspace_size, 1), cupy.uint8)
    pack = VariantPack(data, ws, plan.workspace_size)
    return lambda: plan.execute(pack, None)


# -- the real legacy API ----------------------------------------------------------------------------

class Legacy:
    def __init__(self, pb: Problem, lh):
        self.pb, self.lh, self.ds = pb, lh, L.Descs()
        self.tx = self.ds.tensor(pb.xd, strides(pb.xd, pb.layout), pb.dtype)
        self.ty = self.ds.tensor(pb.yd, strides(pb.yd, pb.layout), pb.dtype)
        self.tw = self.ds.filter(pb.wd, pb.dtype, nhwc=pb.layout == "NHWC")
        self.math = MATH_OF[pb.dtype]
        self.tc = self.ds.conv(pb.pad, pb.stride, (1, 1), "CROSS_CORRELATION", "float32", 1, self.math)
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def args(self, direction):
        pb = self.pb
        return operands(direction, (self.tx, pb.x), (self.tw, pb.w), (self.ty, pb.y))

    def call(self, direction, algo=None):
        """(the call, its algo); ``self.found_math``: the math type of the Find result taken."""
        (d1, a1), (d2, a2), (d3, a3) = self.args(direction)
        k = KIND[direction]
        self.found_math = self.math
        if algo is None:
            perf = L.perf_list(f"cudnnFindConvolution{k}Algorithm", self.lh, d1, d2, self.tc, d3, 16)
            best = fastest_of_math(perf, self.math)
            algo, self.found_math = best["algo"], MATH_NAME[best["mathType"]]
        ws = L.workspace_size(f"cudnnGetConvolution{k}WorkspaceSize", self.lh, d1, d2, self.tc, d3, algo)
        buf = cupy.empty(max(ws, 1), cupy.uint8)
        fn = getattr(L.load(), f"cudnnConvolution{k}")
        args = (self.lh.ptr, ctypes.addressof(self.one), d1, a1.data.ptr, d2, a2.data.ptr, self.tc, algo,
                buf.data.ptr, ws, ctypes.addressof(self.zero), d3, a3.data.ptr)
        self._keep = buf
        return (lambda: fn(*args)), algo


# -- torch ---------------------------------------------------------------------------------------

def torch_call(pb: Problem, direction):
    import torch.nn.functional as F
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[pb.dtype]
    mf = torch.channels_last if pb.layout == "NHWC" else torch.contiguous_format
    x = torch.randn(pb.xd, device="cuda", dtype=dt).to(memory_format=mf) * 0.5
    w = torch.randn(pb.wd, device="cuda", dtype=dt).to(memory_format=mf) * 0.5
    dy = torch.randn(pb.yd, device="cuda", dtype=dt).to(memory_format=mf) * 0.5
    if direction == "fwd":
        return lambda: F.conv2d(x, w, None, pb.stride, pb.pad)
    mask = [direction == "bwd_data", direction == "bwd_filter", False]
    return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, list(pb.stride), list(pb.pad), [1, 1],
                                                       False, [0, 0], 1, mask)


# -- runs -----------------------------------------------------------------------------------------

def bench_layers(args, rows):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    h, lh = cc.cudnnCreate("gpu"), L.Handle()
    configs = CONFIGS[:1] + CONFIGS[2:3] if args.quick else CONFIGS
    for cname, dtype, layout in configs:
        for layer in LAYERS:
            pb = Problem(layer, dtype, layout, args.batch)
            ours, leg = Ours(pb, h), Legacy(pb, lh)
            for d in DIRS:
                row = dict(config=cname, layer=pb.name, dir=d, n=args.batch, gflop=pb.flops / 1e9,
                           math=MATH_OF[dtype])
                try:
                    f, row["ours_algo"] = ours.call(d)
                    row["ours_ms"] = timeit(f, args.iters)
                    plan = last_plan()
                    row["ours_engine"], row["ours_config"] = plan.engine, str(plan.config)
                    row["ours_plan_ms"] = timeit(plan_only(plan, pb, d), args.iters)
                except Exception as e:  # noqa: BLE001 - report and go on
                    row["ours_error"] = f"{type(e).__name__}: {e}"[:300]
                try:
                    f, algo = leg.call(d)
                    row["legacy_ms"], row["legacy_algo"] = timeit(f, args.iters), algo
                    row["legacy_math"] = leg.found_math  # == math unless Find had none of that type
                except Exception as e:  # noqa: BLE001
                    row["legacy_error"] = f"{type(e).__name__}: {e}"[:300]
                try:
                    row["torch_ms"] = timeit(torch_call(pb, d), args.iters)
                except Exception as e:  # noqa: BLE001
                    row["torch_error"] = f"{type(e).__name__}: {e}"[:300]
                for k in ("ours", "ours_plan", "legacy", "torch"):
                    if k + "_ms" in row:
                        row[k + "_tflops"] = pb.flops / (row[k + "_ms"] * 1e-3) / 1e12
                rows.append(row)
                print(fmt_row(row), flush=True)
            leg.ds.destroy()
            cc.plan_cache_clear()
    lh.destroy()


def bench_fused(args, rows):
    """conv+bias+relu: ours fused vs legacy three calls vs legacy fused vs torch (fp16 NHWC)."""
    import torch.nn.functional as F
    h, lh = cc.cudnnCreate("gpu"), L.Handle()
    dtype, layout = "float16", "NHWC"
    for layer in LAYERS:
        pb = Problem(layer, dtype, layout, args.batch)
        k = pb.wd[0]
        bias = rand(k, dtype)
        row = dict(config="fp16 NHWC", layer=pb.name, dir="conv+bias+relu", n=args.batch, gflop=pb.flops / 1e9,
                   math=MATH_OF[dtype])
        ours = Ours(pb, h)
        bd = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensorNdDescriptor(bd, cc.CUDNN_DATA_HALF, 4, [1, k, 1, 1], [k, 1, 1, 1])
        ad = cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
        algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
        try:
            ws = cc.cudnnGetConvolutionForwardWorkspaceSize(h, ours.xd, ours.wd, ours.cd, ours.yd, algo)
            buf = cupy.empty(max(ws, 1), cupy.uint8)
            f = lambda: cc.cudnnConvolutionBiasActivationForward(h, 1.0, ours.xd, pb.x, ours.wd, pb.w, ours.cd, algo,  # noqa: E731
                                                                 buf, max(ws, 1), 0.0, ours.yd, pb.y, bd, bias, ad,
                                                                 ours.yd, pb.y)
            row["ours_ms"] = timeit(f, args.iters)
            plan = last_plan()
            row["ours_engine"], row["ours_config"] = plan.engine, str(plan.config)
        except Exception as e:  # noqa: BLE001
            row["ours_error"] = f"{type(e).__name__}: {e}"[:300]
        leg = Legacy(pb, lh)
        try:
            conv, lalgo = leg.call("fwd")
            tb = leg.ds.tensor((1, k, 1, 1), (k, 1, 1, 1), dtype)
            ta = leg.ds.activation("RELU")
            lib = L.load()
            one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
            add = (leg.lh.ptr, ctypes.addressof(one), tb, bias.data.ptr, ctypes.addressof(one), leg.ty, pb.y.data.ptr)
            act = (leg.lh.ptr, ta, ctypes.addressof(one), leg.ty, pb.y.data.ptr, ctypes.addressof(zero), leg.ty,
                   pb.y.data.ptr)

            def three():
                conv()
                lib.cudnnAddTensor(*add)
                lib.cudnnActivationForward(*act)
            row["legacy3_ms"] = timeit(three, args.iters)
            fws = L.workspace_size("cudnnGetConvolutionForwardWorkspaceSize", leg.lh, leg.tx, leg.tw, leg.tc, leg.ty, 1)
            fbuf = cupy.empty(max(fws, 1), cupy.uint8)
            fused = (leg.lh.ptr, ctypes.addressof(one), leg.tx, pb.x.data.ptr, leg.tw, pb.w.data.ptr, leg.tc, 1,
                     fbuf.data.ptr, fws, ctypes.addressof(zero), leg.ty, pb.y.data.ptr, tb, bias.data.ptr, ta, leg.ty,
                     pb.y.data.ptr)
            row["legacy_fused_ms"] = timeit(lambda: lib.cudnnConvolutionBiasActivationForward(*fused), args.iters)
        except Exception as e:  # noqa: BLE001
            row["legacy_error"] = f"{type(e).__name__}: {e}"[:300]
        leg.ds.destroy()
        try:
            x = torch.randn(pb.xd, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
            w = torch.randn(pb.wd, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
            b = torch.randn(k, device="cuda", dtype=torch.float16)
            row["torch_ms"] = timeit(lambda: F.relu(F.conv2d(x, w, b, pb.stride, pb.pad)), args.iters)
        except Exception as e:  # noqa: BLE001
            row["torch_error"] = f"{type(e).__name__}: {e}"[:300]
        for key in ("ours", "legacy3", "legacy_fused", "torch"):
            if key + "_ms" in row:
                row[key + "_tflops"] = pb.flops / (row[key + "_ms"] * 1e-3) / 1e12
        rows.append(row)
        print(fmt_row(row), flush=True)
        cc.plan_cache_clear()
    lh.destroy()


def bench_host(args, out):
    """Median host microseconds per cached tiny conv call (1x8x8x8 fp32, 3x3)."""
    import torch.nn.functional as F
    n = args.host_calls
    pb = Problem(("tiny", 8, 8, 8, 3, 1, 1), "float32", "NCHW", 1)
    h, lh = cc.cudnnCreate("gpu"), L.Handle()
    ours, leg = Ours(pb, h), Legacy(pb, lh)

    def per_call(fn):
        for _ in range(50):
            fn()
        cupy.cuda.runtime.deviceSynchronize()
        ts = []
        pc = time.perf_counter
        for _ in range(n):
            t0 = pc()
            fn()
            ts.append(pc() - t0)
        cupy.cuda.runtime.deviceSynchronize()
        return statistics.median(ts) * 1e6

    x = torch.randn(pb.xd, device="cuda")
    w = torch.randn(pb.wd, device="cuda")

    def bias_act():
        """The cached tiny conv+bias+ReLU through cudnnConvolutionBiasActivationForward, in fp16 NHWC
        (the layout cuDNN 9 fuses epilogues in: one fused native plan)."""
        p16 = Problem(("tiny", 8, 8, 8, 3, 1, 1), "float16", "NHWC", 1)
        o16, k = Ours(p16, h), p16.wd[0]
        bd, ad = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetTensorNdDescriptor(bd, cc.CUDNN_DATA_HALF, 4, [1, k, 1, 1], [k, 1, 1, 1])
        cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
        algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
        ws = cc.cudnnGetConvolutionForwardWorkspaceSize(h, o16.xd, o16.wd, o16.cd, o16.yd, algo)
        buf, bias = cupy.empty(max(ws, 1), cupy.uint8), cupy.zeros(k, cupy.float16)
        f = lambda: cc.cudnnConvolutionBiasActivationForward(h, 1.0, o16.xd, p16.x, o16.wd, p16.w, o16.cd, algo,  # noqa: E731
                                                             buf, max(ws, 1), 0.0, o16.yd, p16.y, bd, bias, ad,
                                                             o16.yd, p16.y)
        f()
        out["ours_bias_act_engine"] = last_plan().engine
        return f

    makers = {"ours_us": lambda: ours.call("fwd", algo=1)[0], "ours_plan_us": lambda: plan_only(last_plan(), pb, "fwd"),
              "ours_bias_act_us": bias_act,
              "legacy_us": lambda: leg.call("fwd", algo=1)[0],
              "torch_us": lambda: (lambda: F.conv2d(x, w, None, 1, 1))}
    for key, make in makers.items():
        try:
            out[key] = per_call(make())
        except Exception as e:  # noqa: BLE001
            out[key.replace("_us", "_error")] = f"{type(e).__name__}: {e}"[:300]
    out["calls"] = n
    try:
        from cudnn_compat._backend.engines.cudnn_engine import plan as nplan
        out["cudnn_graph_stats"] = dict(nplan.STATS)
    except Exception:  # noqa: BLE001
        pass
    if args.profile:
        import cProfile
        import io
        import pstats
        f = ours.call("fwd", algo=1)[0]
        f()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            f()
        prof.disable()
        cupy.cuda.runtime.deviceSynchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        out["profile_tottime_top25"] = buf.getvalue()
        print(buf.getvalue(), flush=True)
    print(f"host cost per cached tiny conv call (median of {n}, us): "
          + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in out.items() if k.endswith("_us")), flush=True)
    leg.ds.destroy()
    lh.destroy()


def fmt_row(r):
    def t(k):
        return f"{r[k + '_tflops']:7.1f}" if k + "_tflops" in r else "    n/a"
    keys = ("ours", "ours_plan", "legacy", "torch") if "legacy3_ms" not in r and r["dir"] != "conv+bias+relu" \
        else ("ours", "legacy3", "legacy_fused", "torch")
    errs = "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith("_error"))
    if r.get("legacy_math", r.get("math")) != r.get("math"):
        errs = (errs + "; " if errs else "") + f"legacy ran {r['legacy_math']} (Find had no {r['math']} result)"
    return (f"{r['config']:10s} {r['layer']:18s} {r['dir']:15s} " + " ".join(f"{k}={t(k)}" for k in keys)
            + (f"  [{errs}]" if errs else ""))


def geomean(vals):
    vals = [v for v in vals if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


def summary(rows):
    out = {}
    for cname in sorted({r["config"] for r in rows}):
        for d in DIRS + ("conv+bias+relu",):
            sel = [r for r in rows if r["config"] == cname and r["dir"] == d]
            if not sel:
                continue
            s = {}
            for k in ("ours", "ours_plan", "legacy", "legacy3", "legacy_fused", "torch"):
                g = geomean([r.get(k + "_tflops") for r in sel])
                if not math.isnan(g):
                    s[k + "_tflops_geomean"] = g
            if "ours_tflops_geomean" in s:
                for k in ("legacy", "legacy3", "torch"):
                    if k + "_tflops_geomean" in s:
                        s[f"ours_over_{k}"] = s["ours_tflops_geomean"] / s[k + "_tflops_geomean"]
            out[f"{cname} {d}"] = s
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--host-calls", type=int, default=10000)
    ap.add_argument("--quick", action="store_true", help="fp16 NHWC and fp32 NCHW only")
    ap.add_argument("--skip", default="", help="comma list of: layers,fused,host")
    ap.add_argument("--profile", action="store_true", help="cProfile 2000 cached tiny calls through our API")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    if cupy is None:
        sys.exit(missing_gpu_stack(__file__, _MISSING))
    skip = set(filter(None, args.skip.split(",")))
    name = device_name()
    from cudnn_compat._backend.engines.cudnn_engine import lib as nlib
    meta = dict(device=name, libcudnn=nlib.info(), torch=torch.__version__, torch_cudnn=torch.backends.cudnn.version(),
                cupy=cupy.__version__, batch=args.batch, iters=args.iters, time=time.strftime("%Y-%m-%d %H:%M:%S"))
    print(json.dumps(meta), flush=True)
    rows, host = [], {}
    t0 = time.time()
    if "layers" not in skip:
        bench_layers(args, rows)
    if "fused" not in skip:
        bench_fused(args, rows)
    if "host" not in skip:
        bench_host(args, host)
    res = dict(meta=meta, rows=rows, summary=summary(rows), host=host, seconds=time.time() - t0)
    print(json.dumps(res["summary"], indent=1), flush=True)
    path = write_json("bench_conv", res, args.out, name)
    print("wrote", path)


if __name__ == "__main__":
    main()
