"""RNN benchmark (issue 6): LSTM T=100, B=64, input = hidden = 512, 2 layers, uni- and
bidirectional, fp32 (DEFAULT_MATH: TF32 permitted, as 002 says for Ampere and later) and fp16
(TENSOR_OP_MATH, float math precision), SEQ_MAJOR_UNPACKED, zero initial states given as hx/cx.

  ours_train / ours_infer  cudnn_compat.cudnnRNNForward on a GPU handle, CUDNN_FWD_MODE_TRAINING
                           / INFERENCE (the whole cached legacy call: one graph per layer, the
                           RNNRecurrence op with its input projection inside, replayed as a CUDA graph;
                           fp16's second layer reads float rows: a projection graph before it)
  cudnn_train / _infer     the real cudnnRNNForward of libcudnn 9 (ALGO_STANDARD) via ctypes
  torch_train / _infer     torch.nn.LSTM forward with grad enabled / under no_grad (cuDNN inside)

Weights are identical in ours and the real call (placed through each side's
cudnnGetRNNWeightParams); the max |y_ours - y_cudnn| is reported as a sanity check.  Timing:
CUDA events around ``iters`` back-to-back calls after ``warm`` warm-up calls, median of
``reps`` such measurements, milliseconds per call.

    python benchmarks/bench_rnn.py [--iters 20] [--reps 3] [--quick] [--out benchmarks/results]
Writes a table to stdout and JSON (with the device name) under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_time, device_name, missing_gpu_stack, write_json_file  # noqa: E402

try:  # guarded so that --help works without a GPU stack; main() reports what is missing
    import torch  # noqa: E402  (first: its libcudnn is the one cuda.pathfinder then finds loaded)
    import cupy  # noqa: E402
except ImportError as _e:
    torch = cupy = None
    _MISSING = _e

import cudnn_compat as cc  # noqa: E402
from cudnn_compat._backend import legacy_cudnn as L  # noqa: E402
from cudnn_compat._backend.legacy_cudnn_rnn import RealRNN  # noqa: E402

T, B, H, LAYERS = 100, 64, 512, 2
CONFIGS = [("LSTM fp32", "float32", "DEFAULT_MATH"), ("LSTM fp16", "float16", "TENSOR_OP_MATH")]
CCDT = {"float32": cc.CUDNN_DATA_FLOAT, "float16": cc.CUDNN_DATA_HALF}
CCMATH = {"DEFAULT_MATH": cc.CUDNN_DEFAULT_MATH, "TENSOR_OP_MATH": cc.CUDNN_TENSOR_OP_MATH}


def timeit(fn, iters, reps, warm=3):
    """Milliseconds per call: median over ``reps`` runs of ``iters`` calls (_common.cuda_time; torch
    synchronized too before timing)."""
    return cuda_time(fn, iters, reps, warm, before=torch.cuda.synchronize)["ms"]


class Ours:
    def __init__(self, handle, cpu, dtype, math, D, rng):
        self.h = handle
        st = np.dtype(dtype)
        self.drop = cc.cudnnCreateDropoutDescriptor()
        cc.cudnnSetDropoutDescriptor(self.drop, cpu, 0.0, None, 0, 0)
        self.d = cc.cudnnCreateRNNDescriptor()
        cc.cudnnSetRNNDescriptor_v8(self.d, cc.CUDNN_RNN_ALGO_STANDARD, cc.CUDNN_LSTM, cc.CUDNN_RNN_DOUBLE_BIAS,
                                    cc.CUDNN_BIDIRECTIONAL if D == 2 else cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_LINEAR_INPUT,
                                    CCDT[dtype], cc.CUDNN_DATA_FLOAT, CCMATH[math], H, H, H, LAYERS, self.drop,
                                    cc.CUDNN_RNN_PADDED_IO_ENABLED)
        size = cc.cudnnGetRNNWeightSpaceSize(cpu, self.d)
        w = np.zeros(size, np.uint8)
        md, bd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
        self.values = {}
        bound = 1.0 / np.sqrt(H)
        for p in range(LAYERS * D):
            for lid in range(8):
                m, b = cc.cudnnGetRNNWeightParams(cpu, self.d, p, size, w, lid, md, bd)
                m[...] = rng.uniform(-bound, bound, m.shape).astype(st)
                b[...] = rng.uniform(-bound, bound, b.shape).astype(st)
                self.values[(p, lid)] = (m[0].copy(), b[0, :, 0].copy())
        self.w = cupy.asarray(w)
        self.wsize = size
        self.xd, self.yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
        cc.cudnnSetRNNDataDescriptor(self.xd, CCDT[dtype], cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, H,
                                     [T] * B, None)
        cc.cudnnSetRNNDataDescriptor(self.yd, CCDT[dtype], cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, D * H,
                                     [T] * B, None)
        self.hd = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensorNdDescriptor(self.hd, CCDT[dtype], 3, [LAYERS * D, B, H], [B * H, H, 1])
        self.sizes = {m: cc.cudnnGetRNNTempSpaceSizes(handle, self.d, m, self.xd)
                      for m in (cc.CUDNN_FWD_MODE_TRAINING, cc.CUDNN_FWD_MODE_INFERENCE)}
        self.ws = cupy.empty(max(v[0] for v in self.sizes.values()), cupy.uint8)
        self.rs = cupy.empty(self.sizes[cc.CUDNN_FWD_MODE_TRAINING][1], cupy.uint8)
        self.seq = cupy.full(B, T, cupy.int32)

    def call(self, training, x, y, hx, hy, cx, cy):
        m = cc.CUDNN_FWD_MODE_TRAINING if training else cc.CUDNN_FWD_MODE_INFERENCE
        ws, rs = self.sizes[m]
        cc.cudnnRNNForward(self.h, self.d, m, self.seq, self.xd, x, self.yd, y, self.hd, hx, hy, self.hd, cx, cy,
                           self.wsize, self.w, ws, self.ws, rs, self.rs if training else None)


def run_config(name, dtype, math, D, handle, cpu, real_handle, args, rng):
    st = np.dtype(dtype)
    ours = Ours(handle, cpu, dtype, math, D, rng)
    real = RealRNN(real_handle, "LSTM", D, LAYERS, H, H, T, [T] * B, dtype=dtype, math=math)
    real.load_weights(ours.values)
    x = cupy.asarray(rng.uniform(-1, 1, (T, B, H)).astype(st))
    hx = cupy.zeros((LAYERS * D, B, H), st)
    cx = cupy.zeros_like(hx)
    y_o, y_r = cupy.zeros((T, B, D * H), st), cupy.zeros((T, B, D * H), st)
    hy_o, cy_o, hy_r, cy_r = (cupy.zeros_like(hx) for _ in range(4))
    res = {"config": name, "dtype": dtype, "math": math, "directions": D}
    t0 = time.perf_counter()
    ours.call(False, x, y_o, hx, hy_o, cx, cy_o)
    cupy.cuda.Device().synchronize()
    res["ours_first_call_s"] = round(time.perf_counter() - t0, 3)
    real.forward(False, x, y_r, hx, hy_r, cx, cy_r)
    cupy.cuda.Device().synchronize()
    res["max_abs_diff_y"] = float(cupy.abs(y_o.astype(cupy.float32) - y_r.astype(cupy.float32)).max())
    lstm = torch.nn.LSTM(H, H, LAYERS, bidirectional=D == 2).cuda().to(getattr(torch, dtype))
    xt = torch.as_tensor(x, device="cuda")
    it, reps = args.iters, args.reps
    for training in (True, False):
        tag = "train" if training else "infer"
        res[f"ours_{tag}_ms"] = timeit(lambda: ours.call(training, x, y_o, hx, hy_o, cx, cy_o), it, reps)
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(it):
            ours.call(training, x, y_o, hx, hy_o, cx, cy_o)
        res[f"ours_{tag}_host_ms"] = (time.perf_counter() - t0) * 1e3 / it  # submission cost per call
        cupy.cuda.Device().synchronize()
        res[f"cudnn_{tag}_ms"] = timeit(lambda: real.forward(training, x, y_r, hx, hy_r, cx, cy_r), it, reps)
        if training:
            lstm.train()

            def tfn():
                with torch.enable_grad():
                    lstm(xt)
        else:
            lstm.eval()

            def tfn():
                with torch.no_grad():
                    lstm(xt)
        res[f"torch_{tag}_ms"] = timeit(tfn, it, reps)
        res[f"ratio_{tag}"] = res[f"ours_{tag}_ms"] / res[f"cudnn_{tag}_ms"]
    real.destroy()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="unidirectional fp32 only")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    if cupy is None:
        sys.exit(missing_gpu_stack(__file__, _MISSING))
    rng = np.random.default_rng(0)
    handle, cpu = cc.create("gpu"), cc.create("cpu")
    real_handle = L.Handle()
    dev = device_name()
    meta = {"device": dev, "torch": torch.__version__, "torch_cudnn": torch.backends.cudnn.version(),
            "cupy": cupy.__version__, "shape": {"T": T, "B": B, "input": H, "hidden": H, "layers": LAYERS},
            "iters": args.iters, "reps": args.reps, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        from cudnn_compat._backend.engines.cudnn_engine import lib as cl
        meta["libcudnn_version"] = int(cl.load().cudnnGetVersion())
    except Exception as e:  # report, do not fail the benchmark
        meta["libcudnn_version"] = f"unknown ({e})"
    print(json.dumps(meta))
    rows = []
    configs = CONFIGS[:1] if args.quick else CONFIGS
    for name, dtype, math in configs:
        for D in ((1,) if args.quick else (1, 2)):
            r = run_config(name, dtype, math, D, handle, cpu, real_handle, args, rng)
            rows.append(r)
            print(f"{name:10s} {'bi ' if D == 2 else 'uni'}  "
                  f"train: ours={r['ours_train_ms']:7.3f} cudnn={r['cudnn_train_ms']:7.3f} torch={r['torch_train_ms']:7.3f}"
                  f" ratio={r['ratio_train']:5.2f} | infer: ours={r['ours_infer_ms']:7.3f} "
                  f"cudnn={r['cudnn_infer_ms']:7.3f} torch={r['torch_infer_ms']:7.3f} ratio={r['ratio_infer']:5.2f}"
                  f" | max|dy|={r['max_abs_diff_y']:.2e} first call {r['ours_first_call_s']}s", flush=True)
    path = write_json_file(os.path.join(args.out, f"bench_rnn_{dev.replace(' ', '_')}.json"),
                           {"meta": meta, "results": rows})
    print("wrote", path)
    real_handle.destroy()


if __name__ == "__main__":
    main()
