"""Convolution layer classes beyond ResNet-50's diet (issue 24 items 2 and 4): one row per (layer
class, direction, data type and layout), each side choosing its own algorithm the way a framework
does, on one GPU:

  ours         cudnn_compat: cudnnFind*AlgorithmEx (our API, a 256 MiB workspace), then the call
               with the fastest result's algorithm and math type (the whole cached legacy call)
  legacy       the real legacy cuDNN (libcudnn 9's exports): its cudnnFind*Algorithm, the fastest
               result of the descriptor's math type, that algorithm called with its workspace
  torch        F.conv2d / aten.convolution_backward, cudnn.benchmark on, channels_last for NHWC,
               TF32 as the row's math allows; ``torch_graph``: the same calls captured in a CUDA
               graph (its kernels alone, no host cost)
  ours_config  the native engine config our plan runs, ``ours_timed`` how many configs its
               autotune timed, ``ours_top`` the fastest three with their times

Layer classes (shapes from the networks; N=32 for fp16, N=16 for fp32): ResNet-50's 7x7/2 stem
with 3 input channels, MobileNetV2's depthwise 3x3, ResNeXt-50 32x4d's grouped 3x3 (32 groups),
DeepLabv3's dilated 3x3 (dilation 2), ResNet-50's strided 3x3 and 1x1 downsampling, its 3x3 and
1x1 layers.  Rows: fp16 NHWC (TENSOR_OP_MATH), fp32 NCHW with TF32 (DEFAULT_MATH) and with FMA
math (FMA_MATH; TF32 off in torch).  Inputs stay on the device; CUDA events, the median of
``--reps`` repetitions of ``--iters`` calls.

    python benchmarks/bench_conv_zoo.py [--budget 75] [--layers stem,grouped] [--modes fp16] [--out DIR]

Writes ``<out>/bench_conv_zoo_<device>.json`` (default benchmarks/results) after every row; rows
not reached within ``--budget`` seconds are listed as skipped.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_time, fmt_ms, git_commit, meta, missing_gpu_stack, repo_on_path, strides, write_json  # noqa: E402

repo_on_path()
try:  # guarded so that --help works without a GPU stack
    import torch  # noqa: E402  (first: its libcudnn is the one cuda.pathfinder then finds loaded)
    import cupy  # noqa: E402
except ImportError as _e:
    torch = cupy = None
    _MISSING = _e

import cudnn_compat as cc  # noqa: E402

# name: (C, K, HW, R, pad, stride, dilation, groups, where it comes from)
LAYERS = {
    "stem": (3, 64, 224, 7, 3, 2, 1, 1, "ResNet-50 conv1, 7x7/2, 3 input channels"),
    "depthwise": (144, 144, 56, 3, 1, 1, 1, 144, "MobileNetV2 block 2 depthwise 3x3 (144 groups)"),
    "grouped": (128, 128, 56, 3, 1, 1, 1, 32, "ResNeXt-50 32x4d layer1 grouped 3x3 (32 groups)"),
    "dilated": (256, 256, 28, 3, 2, 1, 2, 1, "DeepLabv3 (output stride 8) layer3 3x3, dilation 2"),
    "strided3x3": (128, 128, 56, 3, 1, 2, 1, 1, "ResNet-50 layer2.0.conv2 3x3/2"),
    "down1x1": (256, 512, 56, 1, 0, 2, 1, 1, "ResNet-50 layer2.0.downsample 1x1/2"),
    "r50_3x3": (64, 64, 56, 3, 1, 1, 1, 1, "ResNet-50 layer1 3x3"),
    "r50_1x1": (256, 64, 56, 1, 0, 1, 1, 1, "ResNet-50 layer1 1x1 256->64"),
}
MODES = {  # name: dtype, layout, our/legacy math type, torch TF32, N
    "fp16": ("float16", "NHWC", "TENSOR_OP_MATH", False, 32),
    "tf32": ("float32", "NCHW", "DEFAULT_MATH", True, 16),
    "fma": ("float32", "NCHW", "FMA_MATH", False, 16),
}
DIRS = {"fwd": "Forward", "bwd_data": "BackwardData", "bwd_filter": "BackwardFilter"}
WORKSPACE = 256 << 20


class Problem:
    def __init__(self, layer: str, mode: str):
        c, k, hw, r, pad, stride, dil, g, self.source = LAYERS[layer]
        self.dtype, self.layout, self.math, self.tf32, n = MODES[mode]
        p = 1 + (hw + 2 * pad - dil * (r - 1) - 1) // stride
        self.xd, self.wd, self.yd = (n, c, hw, hw), (k, c // g, r, r), (n, k, p, p)
        self.pad, self.stride, self.dil, self.groups = (pad, pad), (stride, stride), (dil, dil), g
        self.flops = 2.0 * n * k * p * p * (c // g) * r * r
        self.x, self.w, self.y = (self.rand(d) for d in (self.xd, self.wd, self.yd))
        self.ws = cupy.empty(WORKSPACE, cupy.uint8)

    def rand(self, dims):
        st = strides(dims, self.layout)
        size = 1 + sum((d - 1) * s for d, s in zip(dims, st))
        return (cupy.random.standard_normal(size, dtype=cupy.float32) * 0.5).astype(self.dtype)

    def args(self, direction, descs):
        """(first, second, output) (descriptor, buffer) pairs of the legacy call, in its order."""
        xd, wd, yd = descs
        return {"fwd": ((xd, self.x), (wd, self.w), (yd, self.y)),
                "bwd_data": ((wd, self.w), (yd, self.y), (xd, self.x)),
                "bwd_filter": ((xd, self.x), (yd, self.y), (wd, self.w))}[direction]


# -- ours -----------------------------------------------------------------------------------------------

def ours(pb: Problem, h, direction: str, row: dict, iters: int, reps: int):
    dt = {"float16": cc.CUDNN_DATA_HALF, "float32": cc.CUDNN_DATA_FLOAT}[pb.dtype]
    xd, yd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(xd, dt, 4, list(pb.xd), list(strides(pb.xd, pb.layout)))
    cc.cudnnSetTensorNdDescriptor(yd, dt, 4, list(pb.yd), list(strides(pb.yd, pb.layout)))
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wd, dt, cc.CUDNN_TENSOR_NHWC if pb.layout == "NHWC" else cc.CUDNN_TENSOR_NCHW, 4,
                                  list(pb.wd))
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolutionNdDescriptor(cd, 2, list(pb.pad), list(pb.stride), list(pb.dil), cc.CUDNN_CROSS_CORRELATION,
                                       cc.CUDNN_DATA_FLOAT)
    cc.cudnnSetConvolutionGroupCount(cd, pb.groups)
    cc.cudnnSetConvolutionMathType(cd, getattr(cc, "CUDNN_" + pb.math))
    (d1, a1), (d2, a2), (d3, a3) = pb.args(direction, (xd, wd, yd))
    from cudnn_compat._backend.engines.cudnn_engine import autotune
    t0, runs = time.time(), autotune.STATS["plans_timed"]
    perf = getattr(cc, f"cudnnFindConvolution{DIRS[direction]}AlgorithmEx")(h, d1, a1, d2, a2, cd, d3, a3, 20,
                                                                             pb.ws.data.ptr, WORKSPACE)
    row["ours_find_s"] = time.time() - t0
    row["ours_plans_timed_by_find"] = autotune.STATS["plans_timed"] - runs
    good = [p for p in perf if p.status == cc.CUDNN_STATUS_SUCCESS]
    best = good[0]
    row["ours_find"] = [dict(algo=p.algo, time=round(p.time, 4), memory=p.memory, determinism=p.determinism,
                             mathType=p.mathType) for p in good[:4]]
    cc.cudnnSetConvolutionMathType(cd, best.mathType)
    fn = getattr(cc, f"cudnnConvolution{DIRS[direction]}")

    def call():
        fn(h, 1.0, d1, a1, d2, a2, cd, best.algo, pb.ws, best.memory, 0.0, d3, a3)
    call()
    plan = cc._core.call.last_plan()
    row["ours_algo"], row["ours_engine"], row["ours_config"] = best.algo, plan.engine, str(plan.config)
    spec = getattr(plan, "spec", None)  # a cudnn plan: every config timed for its graph (autotune.TIMES)
    timed = sorted(autotune.table(spec, plan.device).items(), key=lambda ct: ct[1]) if spec is not None else []
    row["ours_timed"] = len(timed)
    row["ours_top"] = [(str(c), round(t, 4)) for c, t in timed[:3]]
    row["ours_ms"] = cuda_time(call, iters, reps, warm=2)["ms"]
    for d in (xd, yd):
        cc.cudnnDestroyTensorDescriptor(d)
    cc.cudnnDestroyFilterDescriptor(wd)
    cc.cudnnDestroyConvolutionDescriptor(cd)


# -- the real legacy cuDNN ----------------------------------------------------------------------------

def legacy(pb: Problem, lh, direction: str, row: dict, iters: int, reps: int):
    from cudnn_compat._backend import legacy_cudnn as L
    ds = L.Descs()
    try:
        tx = ds.tensor(pb.xd, strides(pb.xd, pb.layout), pb.dtype)
        ty = ds.tensor(pb.yd, strides(pb.yd, pb.layout), pb.dtype)
        tw = ds.filter(pb.wd, pb.dtype, nhwc=pb.layout == "NHWC")
        tc = ds.conv(pb.pad, pb.stride, pb.dil, "CROSS_CORRELATION", "float32", pb.groups, pb.math)
        (d1, a1), (d2, a2), (d3, a3) = pb.args(direction, (tx, tw, ty))
        k = DIRS[direction]
        perfs = L.perf_list(f"cudnnFindConvolution{k}Algorithm", lh, d1, d2, tc, d3, 16)
        same = [p for p in perfs if p["mathType"] == L.MATH[pb.math]]
        pick = (same or perfs)[0]
        row["legacy_find"] = [dict(algo=p["algo"], time=round(p["time"], 4), memory=p["memory"],
                                   mathType=p["mathType"]) for p in perfs[:4]]
        L.call("cudnnSetConvolutionMathType", tc, pick["mathType"])
        algo = pick["algo"]
        ws = L.workspace_size(f"cudnnGetConvolution{k}WorkspaceSize", lh, d1, d2, tc, d3, algo)
        buf = cupy.empty(max(ws, 1), cupy.uint8)
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        fn = getattr(L.load(), f"cudnnConvolution{k}")
        args = (lh.ptr, ctypes.addressof(one), d1, a1.data.ptr, d2, a2.data.ptr, tc, algo, buf.data.ptr, ws,
                ctypes.addressof(zero), d3, a3.data.ptr)
        row["legacy_algo"], row["legacy_math"] = algo, pick["mathType"]
        row["legacy_ms"] = cuda_time(lambda: fn(*args), iters, reps, warm=2)["ms"]
    finally:
        ds.destroy()


# -- torch --------------------------------------------------------------------------------------------

def torch_side(pb: Problem, direction: str, row: dict, iters: int, reps: int):
    import torch.nn.functional as F
    torch.backends.cudnn.allow_tf32 = pb.tf32
    dt = {"float16": torch.float16, "float32": torch.float32}[pb.dtype]
    mf = torch.channels_last if pb.layout == "NHWC" else torch.contiguous_format
    x, w, dy = (torch.randn(d, device="cuda", dtype=dt).to(memory_format=mf) * 0.5 for d in (pb.xd, pb.wd, pb.yd))
    if direction == "fwd":
        def fn():
            return F.conv2d(x, w, None, pb.stride, pb.pad, pb.dil, pb.groups)
    else:
        mask = [direction == "bwd_data", direction == "bwd_filter", False]

        def fn():
            return torch.ops.aten.convolution_backward(dy, x, w, None, list(pb.stride), list(pb.pad), list(pb.dil),
                                                       False, [0, 0], pb.groups, mask)
    row["torch_ms"] = cuda_time(fn, iters, reps, warm=3, events="torch")["ms"]
    try:  # its kernels alone: the calls captured in a CUDA graph
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        row["torch_graph_ms"] = cuda_time(g.replay, 1, reps, warm=1, events="torch")["ms"] / iters
        del g
    except Exception as e:  # noqa: BLE001 - report and go on
        row["torch_graph_error"] = f"{type(e).__name__}: {e}"[:200]


# -- the run --------------------------------------------------------------------------------------------

def ratios(row: dict) -> None:
    o = row.get("ours_ms")
    for k in ("legacy", "torch", "torch_graph"):
        if o and row.get(k + "_ms"):
            row[f"{k}_over_ours"] = row[k + "_ms"] / o  # >= 1: ours at least as fast


def line(row: dict) -> str:
    return (f"{row['layer']:10s} {row['dir']:10s} {row['mode']:5s} ours{fmt_ms(row.get('ours_ms'))} "
            f"legacy{fmt_ms(row.get('legacy_ms'))} torch{fmt_ms(row.get('torch_ms'))} "
            f"graph{fmt_ms(row.get('torch_graph_ms'))}  {row.get('ours_config', '')} "
            f"(timed {row.get('ours_timed', '-')}) legacy algo {row.get('legacy_algo', '-')}"
            + "".join(f"  [{k}: {v}]" for k, v in row.items() if k.endswith("_error")))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=",".join(LAYERS), help="comma list of " + ", ".join(LAYERS))
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--dirs", default=",".join(DIRS))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=float, default=75.0, help="seconds; later rows are listed as skipped")
    ap.add_argument("--tag", default="", help="appended to the JSON file's prefix")
    ap.add_argument("--commit", default=None, help="the git commit measured (default: git rev-parse of this checkout)")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    if cupy is None:
        sys.exit(missing_gpu_stack(__file__, _MISSING))
    from cudnn_compat._backend import legacy_cudnn as L
    torch.backends.cudnn.benchmark = True
    h, lh = cc.cudnnCreate("gpu"), L.Handle()
    from cudnn_compat._backend import config as _config
    res = {"meta": meta(iters=args.iters, reps=args.reps, git=args.commit or git_commit(),
                        utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), layers={k: v[-1] for k, v in LAYERS.items()},
                        modes={k: dict(zip(("dtype", "layout", "math", "torch_tf32", "N"), v)) for k, v in MODES.items()},
                        autotune=_config.get("CUDNN_COMPAT_CUDNN_AUTOTUNE")),
           "rows": [], "skipped": []}
    prefix = "bench_conv_zoo" + (f"_{args.tag}" if args.tag else "")
    t0 = time.time()
    for layer in args.layers.split(","):  # layer classes outer: a cut-off run keeps every mode of the first ones
        for mode in args.modes.split(","):
            pb = None
            for d in args.dirs.split(","):
                if time.time() - t0 > args.budget:
                    res["skipped"].append(f"{layer} {d} {mode}")
                    continue
                pb = pb or Problem(layer, mode)
                row = {"layer": layer, "dir": d, "mode": mode, "dtype": pb.dtype, "layout": pb.layout,
                       "math": pb.math, "x": pb.xd, "w": pb.wd, "pad": pb.pad[0], "stride": pb.stride[0],
                       "dilation": pb.dil[0], "groups": pb.groups, "gflop": pb.flops / 1e9}
                for side, fn in (("ours", lambda: ours(pb, h, d, row, args.iters, args.reps)),
                                 ("legacy", lambda: legacy(pb, lh, d, row, args.iters, args.reps)),
                                 ("torch", lambda: torch_side(pb, d, row, args.iters, args.reps))):
                    try:
                        fn()
                    except Exception as e:  # noqa: BLE001 - report and go on
                        row[side + "_error"] = f"{type(e).__name__}: {e}"[:300]
                ratios(row)
                row["elapsed_s"] = round(time.time() - t0, 2)
                res["rows"].append(row)
                print(line(row), flush=True)
            cc.plan_cache_clear()
            del pb
            cupy.get_default_memory_pool().free_all_blocks()
    res["seconds"] = time.time() - t0
    res["summary"] = summary(res["rows"])
    path = write_json(prefix, res, args.out)
    lh.destroy()
    cc.cudnnDestroy(h)
    print(res["summary"])
    print("wrote", path, f"({res['seconds']:.0f} s)")
    return res


def summary(rows) -> dict:
    """Counts of rows where ours is at least as fast as torch / the legacy library (2% tolerance)."""
    out = {}
    for k in ("torch", "torch_graph", "legacy"):
        have = [r for r in rows if r.get(f"{k}_over_ours")]
        out[f"ours_at_least_{k}"] = f"{sum(r[f'{k}_over_ours'] >= 0.98 for r in have)}/{len(have)}"
        out[f"slower_than_{k}"] = [f"{r['layer']} {r['dir']} {r['mode']} x{1 / r[f'{k}_over_ours']:.2f}"
                                   for r in have if r[f"{k}_over_ours"] < 0.98]
    return out


if __name__ == "__main__":
    main()
