"""CTC loss and the spatial-transformer sampler on the GPU (issue 18 item 2): ours (the cupy
engine's generated kernels, through the legacy calls on a GPU handle) vs torch vs the REAL legacy
functions of libcudnn 9, fp32.

  CTC       ours      cudnnCTCLoss on a GPU handle, normalization SOFTMAX, costs + gradients
            torch     torch.nn.functional.ctc_loss(reduction='none') on its cuDNN path: log-softmax
                      input, int32 targets on the CPU, blank 0, every input length = T, label
                      lengths < 256 (cudnnCTCLoss inside, with the gradient)
            real      cudnnCTCLoss via ctypes (DETERMINISTIC and NON_DETERMINISTIC)
  sampler   ours      cudnnSpatialTfSamplerForward / Backward (alpha 1, beta 0)
            torch     F.grid_sample(bilinear, zeros, align_corners=True: cuDNN's coordinates) and
                      its backward (aten.grid_sampler_2d_backward, dx and dgrid); torch_native:
                      torch.grid_sampler_2d, the native CUDA kernel (grid_sample itself may pick
                      cuDNN's sampler for these settings)
            real      cudnnSpatialTfSamplerForward / Backward via ctypes

Timing: CUDA events around ``iters`` back-to-back calls after warm-up, median of ``reps``
(_common.cuda_time), milliseconds per call.  The largest difference of ours from torch and from
the real call is recorded as a check.

    python benchmarks/bench_ctc_sampler.py [--iters 20] [--reps 5] [--quick] [--out DIR]
Writes a table to stdout and JSON (bench_ctc_sampler_<device>.json) under --out.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_time, fmt_ms, meta, missing_gpu_stack, rel_err, write_json  # noqa: E402

try:  # guarded so that --help works without a GPU stack; main() reports what is missing
    import torch  # noqa: E402  (first: its libcudnn is the one then found loaded)
    import cupy  # noqa: E402
except ImportError as _e:
    torch = cupy = None
    _MISSING = _e

import cudnn_compat as cc  # noqa: E402

# (name, T, N, A, label length range)
CTC = [("ctc T=100 N=32 A=32 L~30", 100, 32, 32, (20, 40)),
       ("ctc T=400 N=64 A=100 L~80", 400, 64, 100, (60, 100)),
       ("ctc T=200 N=16 A=5000 L~50", 200, 16, 5000, (40, 60))]
# (name, x dims, y dims)
SAMPLER = [("sampler N=32 C=64 64x64->64x64", (32, 64, 64, 64), (32, 64, 64, 64)),
           ("sampler N=8 C=32 128x128->96x96", (8, 32, 128, 128), (8, 32, 96, 96))]

_vp = ctypes.c_void_p


def legacy():
    """legacy_cudnn, loaded (its PROTOTYPES include the CTC and sampler functions)."""
    from cudnn_compat._backend import legacy_cudnn as L
    L.load()
    return L


def _ints(v):
    v = [int(x) for x in v]
    return (ctypes.c_int * max(1, len(v)))(*v)


def _ptr(a) -> int:
    return int(a.data.ptr) if hasattr(a, "data") and hasattr(a.data, "ptr") else int(a.data_ptr())


def tdesc(dims):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptorEx(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, len(dims), list(dims))
    return d


def timeit(fn, iters, reps):
    return cuda_time(fn, iters, reps, warm=3, before=torch.cuda.synchronize)["ms"]


def _torch_kernels(fn) -> list:
    """Names of the CUDA kernels ``fn`` launches (which path torch took)."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})[:12]
    except Exception as e:  # noqa: BLE001 - the profiler is only a label
        return [f"unavailable: {type(e).__name__}"]


def bench_ctc(h, L, real, name, T, N, A, lrange, iters, reps):
    rng = np.random.default_rng(T + N)
    lab_len = rng.integers(lrange[0], lrange[1] + 1, N).astype(np.int32)
    labels = rng.integers(1, A, int(lab_len.sum())).astype(np.int32)
    in_len = np.full(N, T, np.int32)
    u = torch.randn(T, N, A, device="cuda") * 2
    logp = torch.log_softmax(u, dim=2).contiguous()
    x = cupy.asarray(logp)
    row = {"case": name, "T": T, "N": N, "A": A, "mean_label": float(lab_len.mean())}
    # ours
    pd = tdesc((T, N, A))
    d = cc.cudnnCreateCTCLossDescriptor()
    cc.cudnnSetCTCLossDescriptorEx(d, cc.CUDNN_DATA_FLOAT, cc.CUDNN_LOSS_NORMALIZATION_SOFTMAX, cc.CUDNN_NOT_PROPAGATE_NAN)
    algo = cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC
    ws = cc.cudnnGetCTCLossWorkspaceSize(h, pd, pd, labels, lab_len, in_len, algo, d)
    work, costs, grads = cupy.zeros(ws, cupy.uint8), cupy.zeros(N, cupy.float32), cupy.zeros((T, N, A), cupy.float32)

    def ours():
        cc.cudnnCTCLoss(h, pd, x, labels, lab_len, in_len, costs, pd, grads, algo, d, work, ws)
    ours()
    row["ours_engine"] = cc._core.call.last_plan().engine
    row["ours_ms"] = timeit(ours, iters, reps)
    # torch (cuDNN path)
    tl, il = torch.from_numpy(labels), [T] * N
    ll = [int(v) for v in lab_len]

    def tch():
        return torch.nn.functional.ctc_loss(logp, tl, il, ll, blank=0, reduction="none")
    want = tch()
    row["torch_ms"] = timeit(tch, iters, reps)
    row["torch_kernels"] = _torch_kernels(tch)
    row["err_vs_torch"] = rel_err(costs.get(), want.cpu().numpy())
    # the real legacy call
    if real is not None:
        descs = L.Descs()
        rpd = descs.tensor((T, N, A), (N * A, A, 1), "float32")
        rd = _vp()
        L.call("cudnnCreateCTCLossDescriptor", ctypes.byref(rd))
        L.call("cudnnSetCTCLossDescriptorEx", rd, L.DATA_TYPE["float32"], int(cc.CUDNN_LOSS_NORMALIZATION_SOFTMAX),
               int(cc.CUDNN_NOT_PROPAGATE_NAN))
        rl, rll, ril = _ints(labels), _ints(lab_len), _ints(in_len)
        rc, rg = cupy.zeros(N, cupy.float32), cupy.zeros((T, N, A), cupy.float32)
        for key, ralgo in (("real_det_ms", cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC),
                           ("real_nondet_ms", cc.CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC)):
            rws = ctypes.c_size_t(0)
            L.call("cudnnGetCTCLossWorkspaceSize", real.ptr, rpd, rpd, rl, rll, ril, int(ralgo), rd, ctypes.byref(rws))
            rwork = cupy.zeros(max(1, rws.value), cupy.uint8)

            def rcall(ralgo=ralgo, rws=rws, rwork=rwork):
                L.call("cudnnCTCLoss", real.ptr, rpd, _ptr(x), rl, rll, ril, _ptr(rc), rpd, _ptr(rg), int(ralgo), rd,
                       _ptr(rwork), rws.value)
            try:
                rcall()
                row[key] = timeit(rcall, iters, reps)
            except Exception as e:  # noqa: BLE001 - an algorithm the library declines
                row[key] = f"{type(e).__name__}: {e}"
        row["err_vs_real_costs"] = rel_err(costs.get(), rc.get())
        row["err_vs_real_grads"] = rel_err(grads.get(), rg.get())
        L.call("cudnnDestroyCTCLossDescriptor", rd)
        descs.destroy()
    cc.cudnnDestroyCTCLossDescriptor(d)
    return row


def bench_sampler(h, L, real, name, xdims, ydims, iters, reps):
    n, c, ho, wo = ydims
    torch.manual_seed(0)
    xt = torch.randn(xdims, device="cuda")
    gt = (torch.rand(n, ho, wo, 2, device="cuda") * 2 - 1) * 1.05
    dyt = torch.randn(ydims, device="cuda")
    x, grid, dy = cupy.asarray(xt), cupy.asarray(gt), cupy.asarray(dyt)
    row = {"case": name, "x": list(xdims), "y": list(ydims)}
    st = cc.cudnnCreateSpatialTransformerDescriptor()
    cc.cudnnSetSpatialTransformerNdDescriptor(st, cc.CUDNN_SAMPLER_BILINEAR, cc.CUDNN_DATA_FLOAT, 4, list(ydims))
    xd, yd = tdesc(xdims), tdesc(ydims)
    y, dx, dgrid = cupy.zeros(ydims, cupy.float32), cupy.zeros(xdims, cupy.float32), cupy.zeros(grid.shape, cupy.float32)

    def fwd():
        cc.cudnnSpatialTfSamplerForward(h, st, 1.0, xd, x, grid, 0.0, yd, y)

    def bwd():
        cc.cudnnSpatialTfSamplerBackward(h, st, 1.0, xd, x, 0.0, xd, dx, 1.0, yd, dy, grid, 0.0, dgrid)
    fwd()
    row["ours_fwd_engine"] = cc._core.call.last_plan().engine
    bwd()
    row["ours_bwd_engine"] = cc._core.call.last_plan().engine
    row["ours_fwd_ms"] = timeit(fwd, iters, reps)
    row["ours_bwd_ms"] = timeit(bwd, iters, reps)
    F = torch.nn.functional

    def tf():
        return F.grid_sample(xt, gt, mode="bilinear", padding_mode="zeros", align_corners=True)

    def tn():
        return torch.grid_sampler_2d(xt, gt, 0, 0, True)

    def tb():
        return torch.ops.aten.grid_sampler_2d_backward(dyt, xt, gt, 0, 0, True, [True, True])
    want = tf()
    row["torch_fwd_ms"] = timeit(tf, iters, reps)
    row["torch_fwd_kernels"] = _torch_kernels(tf)
    row["torch_native_fwd_ms"] = timeit(tn, iters, reps)
    row["torch_bwd_ms"] = timeit(tb, iters, reps)
    tdx, tdg = tb()
    row["err_vs_torch"] = {"y": rel_err(y.get(), want.cpu().numpy()), "dx": rel_err(dx.get(), tdx.cpu().numpy()),
                           "dgrid": rel_err(dgrid.get(), tdg.cpu().numpy())}
    if real is not None:
        rs = _vp()
        L.call("cudnnCreateSpatialTransformerDescriptor", ctypes.byref(rs))
        L.call("cudnnSetSpatialTransformerNdDescriptor", rs, int(cc.CUDNN_SAMPLER_BILINEAR), L.DATA_TYPE["float32"], 4,
               _ints(ydims))
        descs = L.Descs()
        rxd = descs.tensor(xdims, (int(np.prod(xdims[1:])), int(np.prod(xdims[2:])), xdims[3], 1), "float32")
        ryd = descs.tensor(ydims, (int(np.prod(ydims[1:])), int(np.prod(ydims[2:])), ydims[3], 1), "float32")
        ry, rdx, rdg = cupy.zeros_like(y), cupy.zeros_like(dx), cupy.zeros_like(dgrid)
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        a1, a0 = ctypes.addressof(one), ctypes.addressof(zero)

        def rf():
            L.call("cudnnSpatialTfSamplerForward", real.ptr, rs, a1, rxd, _ptr(x), _ptr(grid), a0, ryd, _ptr(ry))

        def rb():
            L.call("cudnnSpatialTfSamplerBackward", real.ptr, rs, a1, rxd, _ptr(x), a0, rxd, _ptr(rdx), a1, ryd, _ptr(dy),
                   _ptr(grid), a0, _ptr(rdg))
        rf()
        rb()
        row["real_fwd_ms"] = timeit(rf, iters, reps)
        row["real_bwd_ms"] = timeit(rb, iters, reps)
        row["err_vs_real"] = {"y": rel_err(y.get(), ry.get()), "dx": rel_err(dx.get(), rdx.get()),
                              "dgrid": rel_err(dgrid.get(), rdg.get())}
        descs.destroy()
        L.call("cudnnDestroySpatialTransformerDescriptor", rs)
    cc.cudnnDestroySpatialTransformerDescriptor(st)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_ctc_sampler.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the first CTC and sampler problem only, fewer repetitions")
    ap.add_argument("--out", default=None, help="folder of the JSON (default benchmarks/results)")
    args = ap.parse_args(argv)
    if torch is None or cupy is None:
        return missing_gpu_stack(__file__, _MISSING)
    if args.quick:
        args.iters, args.reps = min(args.iters, 5), min(args.reps, 3)
    os.environ.setdefault("CUDNN_COMPAT_CPU_FALLBACK", "0")
    h = cc.cudnnCreate("gpu")
    try:
        L = legacy()
        from cudnn_compat._backend import legacy_cudnn
        real = legacy_cudnn.Handle()
    except Exception as e:  # noqa: BLE001 - the real library is only a comparison
        print(f"real legacy libcudnn unavailable: {e}", file=sys.stderr)
        L = real = None
    rows = []
    for name, T, N, A, lr in CTC[:1] if args.quick else CTC:
        rows.append(bench_ctc(h, L, real, name, T, N, A, lr, args.iters, args.reps))
    for name, xd, yd in SAMPLER[:1] if args.quick else SAMPLER:
        rows.append(bench_sampler(h, L, real, name, xd, yd, args.iters, args.reps))
    print(f"{'case':36s} {'ours':>9s} {'torch':>9s} {'real':>9s}  (ms per call)")
    for r in rows:
        if "T" in r:
            print(f"{r['case']:36s} {fmt_ms(r['ours_ms'])} {fmt_ms(r['torch_ms'])} {fmt_ms(r.get('real_det_ms'))}"
                  f"  nondet {fmt_ms(r.get('real_nondet_ms'))}  [{r['ours_engine']}] err {r['err_vs_torch']:.1e}")
        else:
            for k in ("fwd", "bwd"):
                print(f"{r['case'] + ' ' + k:36s} {fmt_ms(r[f'ours_{k}_ms'])} {fmt_ms(r[f'torch_{k}_ms'])} "
                      f"{fmt_ms(r.get(f'real_{k}_ms'))}" + (f"  native {fmt_ms(r['torch_native_fwd_ms'])}" if k == "fwd" else "")
                      + f"  [{r[f'ours_{k}_engine']}]")
            print(f"{'':36s} err vs torch {r['err_vs_torch']}  vs real {r.get('err_vs_real')}")
    path = write_json("bench_ctc_sampler", {"meta": meta(quick=args.quick, iters=args.iters, reps=args.reps),
                                            "rows": rows}, args.out)
    print(f"wrote {path}")
    if real is not None:
        real.destroy()
    cc.cudnnDestroy(h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
