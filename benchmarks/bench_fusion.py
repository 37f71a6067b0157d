"""Fusion across legacy calls (issue 9): a ResNet basic block written with seven legacy calls

    conv 3x3 -> AddTensor bias -> Activation relu -> conv 3x3 -> AddTensor bias
             -> OpTensor add residual -> Activation relu

fp16 NHWC, N=32, at each ResNet-50 stage size (C@HW: 64@56, 128@28, 256@14, 512@7), run as

  plain      our legacy calls one by one on a GPU handle (each its own graph, default heuristics)
  fused      the same calls inside ``with cudnn_compat.fuse(handle):`` (two graphs: conv+bias+relu,
             conv+bias+residual+relu, on the native cudnn engine's runtime fusion)
  legacy     the real legacy libcudnn calls (ctypes, ``_backend.legacy_cudnn``; best algorithm of
             cudnnFindConvolutionForwardAlgorithm with its workspace)
  legacy_cba the legacy API's own fused call, cudnnConvolutionBiasActivationForward twice (z = the
             residual in the second): what a hand-fused legacy program gets
  torch      F.conv2d(+bias) / relu / add, channels_last (context)

Timing as in bench_memory_bound.py: CUDA events around ``--iters`` back-to-back blocks, median of
``--reps`` (host overhead counts when it exceeds the GPU time, as it does for a real caller).  Also
kernels per block (torch.profiler, which sees every CUDA kernel of the process) and the max error
of fused and legacy against plain.  Target: fused >= 1.3x faster than plain.

    python benchmarks/bench_fusion.py [--quick] [--iters 20] [--reps 7] [--batch 32] [--out benchmarks/results]
Writes a table to stdout and JSON (with the device name) under --out.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_time, device_name, missing_gpu_stack, write_json  # noqa: E402

try:  # guarded so that --help works without a GPU stack; main() reports what is missing
    import torch  # noqa: E402  (first: its libcudnn is the one cuda.pathfinder then finds loaded)
    import torch.nn.functional as F  # noqa: E402
    import cupy  # noqa: E402
except ImportError as _e:
    torch = F = cupy = None
    _MISSING = _e

import cudnn_compat as cc  # noqa: E402
from cudnn_compat._backend import legacy_cudnn as L  # noqa: E402

STAGES = [(64, 56), (128, 28), (256, 14), (512, 7)]
ALGO = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM


def nhwc_strides(n, c, h, w):
    return [h * w * c, 1, w * c, c]


def timeit(fn, iters, reps, warm=3):
    """Microseconds per call: median over ``reps`` runs of ``iters`` calls (_common.cuda_time)."""
    return cuda_time(fn, iters, reps, warm)["ms"] * 1e3


def kernels(fn):
    """CUDA kernels (and copies) one call of ``fn`` launches."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    cupy.cuda.Device().synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        cupy.cuda.Device().synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


def maxerr(a, b):
    a, b = cupy.asnumpy(a).astype(np.float64), cupy.asnumpy(b).astype(np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


class Problem:
    def __init__(self, c, hw, n, rng):
        self.c, self.hw, self.n = c, hw, n
        self.dims = (n, c, hw, hw)
        self.count = n * c * hw * hw
        self.flops = 2 * 2.0 * n * c * hw * hw * c * 9  # two 3x3 convs
        scale = 1.0 / np.sqrt(9 * c)
        self.x = cupy.asarray(rng.standard_normal(self.count).astype(np.float16))
        self.w1 = cupy.asarray((rng.standard_normal(c * c * 9) * scale).astype(np.float16))  # KRSC
        self.w2 = cupy.asarray((rng.standard_normal(c * c * 9) * scale).astype(np.float16))
        self.b1 = cupy.asarray((rng.standard_normal(c) * 0.1).astype(np.float16))
        self.b2 = cupy.asarray((rng.standard_normal(c) * 0.1).astype(np.float16))

    def out(self):
        return cupy.zeros(self.count, np.float16), cupy.zeros(self.count, np.float16)


class Ours:
    def __init__(self, pb: Problem, h):
        self.pb, self.h = pb, h
        n, c, hw, _ = pb.dims
        self.td = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensorNdDescriptor(self.td, cc.CUDNN_DATA_HALF, 4, list(pb.dims), nhwc_strides(*pb.dims))
        self.bd = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensorNdDescriptor(self.bd, cc.CUDNN_DATA_HALF, 4, [1, c, 1, 1], [c, 1, 1, 1])
        self.wd = cc.cudnnCreateFilterDescriptor()
        cc.cudnnSetFilterNdDescriptor(self.wd, cc.CUDNN_DATA_HALF, cc.CUDNN_TENSOR_NHWC, 4, [c, c, 3, 3])
        self.cd = cc.cudnnCreateConvolutionDescriptor()
        cc.cudnnSetConvolution2dDescriptor(self.cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
        cc.cudnnSetConvolutionMathType(self.cd, cc.CUDNN_TENSOR_OP_MATH)
        self.ad = cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetActivationDescriptor(self.ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
        self.od = cc.cudnnCreateOpTensorDescriptor()
        cc.cudnnSetOpTensorDescriptor(self.od, cc.CUDNN_OP_TENSOR_ADD, cc.CUDNN_DATA_FLOAT, cc.CUDNN_NOT_PROPAGATE_NAN)
        self.ws = cc.cudnnGetConvolutionForwardWorkspaceSize(h, self.td, self.wd, self.cd, self.td, ALGO)
        self.wbuf = cupy.empty(max(self.ws, 1), np.uint8)
        self.y1, self.y2 = pb.out()

    def block(self):
        h, pb, td, bd, wd, cd, ad = self.h, self.pb, self.td, self.bd, self.wd, self.cd, self.ad
        y1, y2, ws, wb = self.y1, self.y2, self.ws, self.wbuf
        cc.cudnnConvolutionForward(h, 1.0, td, pb.x, wd, pb.w1, cd, ALGO, wb, ws, 0.0, td, y1)
        cc.cudnnAddTensor(h, 1.0, bd, pb.b1, 1.0, td, y1)
        cc.cudnnActivationForward(h, ad, 1.0, td, y1, 0.0, td, y1)
        cc.cudnnConvolutionForward(h, 1.0, td, y1, wd, pb.w2, cd, ALGO, wb, ws, 0.0, td, y2)
        cc.cudnnAddTensor(h, 1.0, bd, pb.b2, 1.0, td, y2)
        cc.cudnnOpTensor(h, self.od, 1.0, td, y2, 1.0, td, pb.x, 0.0, td, y2)
        cc.cudnnActivationForward(h, ad, 1.0, td, y2, 0.0, td, y2)

    def fused(self):
        with cc.fuse(self.h) as scope:
            self.block()
        self.scope = scope


class Legacy:
    def __init__(self, pb: Problem, lh):
        self.pb, self.lh, self.ds = pb, lh, L.Descs()
        n, c, hw, _ = pb.dims
        self.td = self.ds.tensor(pb.dims, nhwc_strides(*pb.dims), "float16")
        self.bd = self.ds.tensor((1, c, 1, 1), (c, 1, 1, 1), "float16")
        self.wd = self.ds.filter((c, c, 3, 3), "float16", nhwc=True)
        self.cd = self.ds.conv((1, 1), (1, 1), (1, 1), "CROSS_CORRELATION", "float32", 1, "TENSOR_OP_MATH")
        self.ad = self.ds.activation("RELU")
        self.od = self.ds.op_tensor(cc.CUDNN_OP_TENSOR_ADD, "float32")
        perf = L.perf_list("cudnnFindConvolutionForwardAlgorithm", lh, self.td, self.wd, self.cd, self.td, 16)
        self.algo = perf[0]["algo"]
        self.ws = L.workspace_size("cudnnGetConvolutionForwardWorkspaceSize", lh, self.td, self.wd, self.cd, self.td,
                                   self.algo)
        # the fused legacy call supports IMPLICIT_PRECOMP_GEMM for RELU (002 §5.2.9)
        self.ws_cba = L.workspace_size("cudnnGetConvolutionForwardWorkspaceSize", lh, self.td, self.wd, self.cd,
                                       self.td, ALGO)
        self.wbuf = cupy.empty(max(self.ws, self.ws_cba, 1), np.uint8)
        self.y1, self.y2 = pb.out()
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        lib = L.load()
        one, zero = ctypes.addressof(self.one), ctypes.addressof(self.zero)
        p = pb
        y1, y2, wb = self.y1.data.ptr, self.y2.data.ptr, self.wbuf.data.ptr
        td, bd, wd, cd, ad, od, hp = self.td, self.bd, self.wd, self.cd, self.ad, self.od, lh.ptr
        conv, add, act, opt = lib.cudnnConvolutionForward, lib.cudnnAddTensor, lib.cudnnActivationForward, lib.cudnnOpTensor
        cba = lib.cudnnConvolutionBiasActivationForward
        a = (hp, one, td, p.x.data.ptr, wd, p.w1.data.ptr, cd, self.algo, wb, self.ws, zero, td, y1)
        b = (hp, one, bd, p.b1.data.ptr, one, td, y1)
        r1 = (hp, ad, one, td, y1, zero, td, y1)
        c2 = (hp, one, td, y1, wd, p.w2.data.ptr, cd, self.algo, wb, self.ws, zero, td, y2)
        b2 = (hp, one, bd, p.b2.data.ptr, one, td, y2)
        res = (hp, od, one, td, y2, one, td, p.x.data.ptr, zero, td, y2)
        r2 = (hp, ad, one, td, y2, zero, td, y2)
        f1 = (hp, one, td, p.x.data.ptr, wd, p.w1.data.ptr, cd, ALGO, wb, self.ws_cba, zero, td, y1, bd,
              p.b1.data.ptr, ad, td, y1)
        f2 = (hp, one, td, y1, wd, p.w2.data.ptr, cd, ALGO, wb, self.ws_cba, one, td, p.x.data.ptr, bd,
              p.b2.data.ptr, ad, td, y2)

        def block():
            for fn, args in ((conv, a), (add, b), (act, r1), (conv, c2), (add, b2), (opt, res), (act, r2)):
                st = fn(*args)
                if st:
                    raise L.LegacyError(fn.__name__, st)
        self.block = block

        def block_cba():
            for args in (f1, f2):
                st = cba(*args)
                if st:
                    raise L.LegacyError("cudnnConvolutionBiasActivationForward", st)
        self.block_cba = block_cba


def torch_block(pb: Problem):
    n, c, hw, _ = pb.dims
    x = torch.as_tensor(pb.x, device="cuda").view(n, hw, hw, c).permute(0, 3, 1, 2)
    w1 = torch.as_tensor(pb.w1, device="cuda").view(c, 3, 3, c).permute(0, 3, 1, 2)
    w2 = torch.as_tensor(pb.w2, device="cuda").view(c, 3, 3, c).permute(0, 3, 1, 2)
    b1, b2 = torch.as_tensor(pb.b1, device="cuda"), torch.as_tensor(pb.b2, device="cuda")

    def block():
        y = F.relu(F.conv2d(x, w1, b1, 1, 1))
        return F.relu(F.conv2d(y, w2, b2, 1, 1) + x)
    return block


def fmt(r):
    def us(k):
        return f"{r[k]:8.1f}" if k in r else "     n/a"

    def x(k):
        return f"{r[k]:4.2f}x" if k in r else " n/a"
    errs = "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith("_error"))
    return (f"{r['stage']:>8}  plain {us('plain_us')}  fused {us('fused_us')}  legacy {us('legacy_us')}  "
            f"legacy_cba {us('legacy_cba_us')}  torch {us('torch_us')} us | fused/plain {x('fused_over_plain')}  "
            f"fused/legacy {x('fused_over_legacy')}  kernels {r.get('plain_kernels', '?')}->{r.get('fused_kernels', '?')}"
            f"  graphs {r.get('fused_graphs', '?')}  err {r.get('fused_err', float('nan')):.1e}"
            + (f"  [{errs}]" if errs else ""))


def run_stage(args, c, hw, h, lh, rng):
    pb = Problem(c, hw, args.batch, rng)
    row = dict(stage=f"{c}@{hw}", c=c, hw=hw, n=args.batch, gflop=pb.flops / 1e9)
    ours = Ours(pb, h)
    try:
        ours.block()
        plain_y = ours.y2.copy()
        row["plain_us"] = timeit(ours.block, args.iters, args.reps)
        ours.y2.fill(0)
        ours.fused()
        row["fused_err"] = maxerr(ours.y2, plain_y)
        row["fused_us"] = timeit(ours.fused, args.iters, args.reps)
        row["fused_graphs"] = dict(ours.scope.graphs)
        row["plain_engine"] = cc.last_engine()
        row["fused_over_plain"] = row["plain_us"] / row["fused_us"]
        row["plain_kernels"] = kernels(ours.block)
        row["fused_kernels"] = kernels(ours.fused)
    except Exception as e:  # noqa: BLE001 - report and go on
        row["ours_error"] = f"{type(e).__name__}: {e}"[:400]
        plain_y = None
    try:
        leg = Legacy(pb, lh)
        leg.block()
        if plain_y is not None:
            row["legacy_err"] = maxerr(leg.y2, plain_y)
        row["legacy_algo"] = leg.algo
        row["legacy_us"] = timeit(leg.block, args.iters, args.reps)
        row["legacy_kernels"] = kernels(leg.block)
        try:
            row["legacy_cba_us"] = timeit(leg.block_cba, args.iters, args.reps)
        except Exception as e:  # noqa: BLE001
            row["legacy_cba_error"] = f"{type(e).__name__}: {e}"[:300]
        leg.ds.destroy()
    except Exception as e:  # noqa: BLE001
        row["legacy_error"] = f"{type(e).__name__}: {e}"[:400]
    try:
        row["torch_us"] = timeit(torch_block(pb), args.iters, args.reps)
    except Exception as e:  # noqa: BLE001
        row["torch_error"] = f"{type(e).__name__}: {e}"[:300]
    for k in ("legacy", "legacy_cba", "torch"):
        if "fused_us" in row and f"{k}_us" in row:
            row[f"fused_over_{k}"] = row[f"{k}_us"] / row["fused_us"]
    for k in ("plain", "fused", "legacy", "legacy_cba", "torch"):
        if f"{k}_us" in row:
            row[f"{k}_tflops"] = pb.flops / (row[f"{k}_us"] * 1e-6) / 1e12
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="the first stage (64@56) only")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    if cupy is None:
        sys.exit(missing_gpu_stack(__file__, _MISSING))
    torch.backends.cudnn.benchmark = True
    name = device_name()
    from cudnn_compat._backend.engines.cudnn_engine import lib as nlib
    meta = dict(device=name, libcudnn=nlib.info(), torch=torch.__version__, cupy=cupy.__version__, batch=args.batch,
                iters=args.iters, reps=args.reps, dtype="float16", layout="NHWC",
                time=time.strftime("%Y-%m-%d %H:%M:%S"))
    print(json.dumps(meta), flush=True)
    h, lh = cc.cudnnCreate("gpu"), L.Handle()
    rng = np.random.default_rng(0)
    rows = []
    t0 = time.time()
    for c, hw in (STAGES[:1] if args.quick else STAGES):
        row = run_stage(args, c, hw, h, lh, rng)
        rows.append(row)
        print(fmt(row), flush=True)
    lh.destroy()
    sp = [r["fused_over_plain"] for r in rows if "fused_over_plain" in r]
    summary = dict(fused_over_plain_geomean=float(np.exp(np.mean(np.log(sp)))) if sp else None,
                   fused_over_plain_min=min(sp) if sp else None, target=1.3,
                   met=bool(sp) and min(sp) >= 1.3)
    spl = [r["fused_over_legacy"] for r in rows if "fused_over_legacy" in r]
    if spl:
        summary["fused_over_legacy_geomean"] = float(np.exp(np.mean(np.log(spl))))
    print(json.dumps(summary), flush=True)
    res = dict(meta=meta, rows=rows, summary=summary, seconds=time.time() - t0)
    path = write_json("bench_fusion", res, args.out, name)
    print("wrote", path)


if __name__ == "__main__":
    main()
