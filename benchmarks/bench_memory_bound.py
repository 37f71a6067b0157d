"""Memory-bound legacy calls (issue 4, issue 14 item 4): ours (the cupy engine through the legacy
API on a GPU handle, CUDNN_COMPAT_ENGINE=cupy) vs the real legacy libcudnn function (ctypes,
``_backend.legacy_cudnn``) vs torch, on the same shapes; a device-to-device copy of the same
bytes gives the bandwidth limit.

Two timings per side, CUDA events, medians over ``--reps`` of ``--iters`` back-to-back calls:
  * ``ours`` / ``legacy`` / ``torch``: the calls as a program makes them (host overhead counts
    when it exceeds the GPU time);
  * ``*_gpu``: the same calls queued behind a spinning kernel first, so the events time only the
    GPU work (kernels back to back; what the kernels cost, whatever the host path costs).

Columns: op, times in microseconds, ours/legacy (< 1: ours faster), achieved GB/s of ours (GPU
time) over the op's fewest bytes and that as a percentage of the copy's GB/s.  Fewest bytes:
each input read once and each output written once, except batch-norm training, which must see
every element before it can write any: forward reads x twice and writes y (3 tensor sizes),
backward reads x and dy twice and writes dx (5).  ``err``: max |ours - legacy| / max |legacy|.
Max pooling: torch's F.max_pool2d on CUDA also writes an int64 index tensor, so its figure (marked
``*``, the row's ``torch_note``) is more work than the call; ours is compared with legacy.

    python benchmarks/bench_memory_bound.py [--quick] [--iters 20] [--reps 7] [--out benchmarks/results]
        [--only SUBSTR] [--generic] [--profile] [--sweep]

``--generic`` adds the generic row kernels' GPU time for BN and softmax (the previous version),
``--profile`` the kernels of one call of ours (torch.profiler: names, launches, microseconds),
``--sweep`` BN GPU times over a few settings of the ``bn`` module's knobs.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["CUDNN_COMPAT_ENGINE"] = "cupy"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_time, device_name, missing_gpu_stack, write_json_file  # noqa: E402

try:  # guarded so that --help works without a GPU stack; main() reports what is missing
    import torch  # noqa: E402  (first: its libcudnn is the one cuda.pathfinder then finds loaded)
    import torch.nn.functional as F  # noqa: E402
    import cupy  # noqa: E402
except ImportError as _e:
    torch = F = cupy = None
    _MISSING = _e

import cudnn_compat as cc  # noqa: E402
from cudnn_compat._backend import legacy_cudnn as L  # noqa: E402

_vp, _int, _dbl = ctypes.c_void_p, ctypes.c_int, ctypes.c_double
EXTRA_PROTOTYPES = {  # legacy functions legacy_cudnn.py does not declare
    "cudnnCreateOpTensorDescriptor": [ctypes.POINTER(_vp)], "cudnnDestroyOpTensorDescriptor": [_vp],
    "cudnnSetOpTensorDescriptor": [_vp, _int, _int, _int],
    "cudnnOpTensor": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp],
    "cudnnCreateLRNDescriptor": [ctypes.POINTER(_vp)], "cudnnDestroyLRNDescriptor": [_vp],
    "cudnnSetLRNDescriptor": [_vp, ctypes.c_uint, _dbl, _dbl, _dbl],
    "cudnnLRNCrossChannelForward": [_vp, _vp, _int, _vp, _vp, _vp, _vp, _vp, _vp],
    "cudnnBatchNormalizationBackward": [_vp, _int] + [_vp] * 14 + [_dbl, _vp, _vp],
}
DT = {"float32": cc.CUDNN_DATA_FLOAT, "float16": cc.CUDNN_DATA_HALF}
NP = {"float32": np.float32, "float16": np.float16}
TORCH = {"float32": torch.float32, "float16": torch.float16} if torch is not None else {}


def legacy_lib():
    lib = L.load()
    for name, args in EXTRA_PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = _int, args
    return lib


def lcall(lib, name, *args):
    st = getattr(lib, name)(*args)
    if st:
        raise L.LegacyError(name, st)


def strides(dims, layout):
    n = len(dims)
    order = list(range(n)) if layout == "NCHW" else [0] + list(range(2, n)) + [1]
    st, acc = [0] * n, 1
    for ax in reversed(order):
        st[ax] = acc
        acc *= dims[ax]
    return st


def ours_desc(dims, dtype, layout="NCHW"):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(d, DT[dtype], len(dims), list(dims), strides(dims, layout))
    return d


def rand(dims, dtype, rng, low=None):
    n = int(np.prod(dims))
    v = rng.uniform(low, low + 1.0, n) if low is not None else rng.standard_normal(n)
    return cupy.asarray(v.astype(NP[dtype]))


def torch_view(buf, dims, layout):
    """A torch tensor over the same memory, with the logical NC.. dims and the layout's strides."""
    t = torch.as_tensor(buf, device="cuda")
    return t.as_strided(dims, strides(dims, layout))


def timeit(fn, iters, reps, warm=3):
    """Microseconds per call: median over ``reps`` runs of ``iters`` calls (_common.cuda_time)."""
    return cuda_time(fn, iters, reps, warm)["ms"] * 1e3


_SPIN = None


def _spin(us):
    """Queue a kernel that keeps the GPU busy for ``us`` microseconds (globaltimer)."""
    global _SPIN
    if _SPIN is None:
        _SPIN = cupy.RawKernel(r"""
extern "C" __global__ void cc_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}""", "cc_spin")
    _SPIN((1,), (1,), (np.uint64(int(us * 1000)),))


def gpu_timeit(fn, iters, reps, warm=3):
    """GPU time per call: the calls are queued behind a spinning kernel, so the events bracket
    back-to-back GPU work only (the spin is sized from a host timing of the same calls)."""
    for _ in range(warm):
        fn()
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host_us = (time.perf_counter() - t0) * 1e6
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        _spin(2 * host_us + 2000)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b) * 1e3 / iters)
    return statistics.median(times)


def profile_one(fn, calls=3):
    """Kernels launched by ``calls`` calls of fn: [{name, launches per call, us per launch}]."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            d = out.setdefault(e.name, [0, 0.0])
            d[0] += 1
            d[1] += e.device_time
    return [{"kernel": k[:80], "per_call": v[0] / calls, "us": v[1] / v[0]} for k, v in out.items()]


def relerr(a, b):
    a, b = cupy.asnumpy(a).astype(np.float64), cupy.asnumpy(b).astype(np.float64)
    fin = np.isfinite(b)
    return float(np.max(np.abs(a[fin] - b[fin])) / max(np.max(np.abs(b[fin])), 1e-30))


# -- cases: each returns dict(ours=fn, legacy=fn, torch=fn, bytes=int, check=(ours_out, legacy_out)) --

def case_add_tensor(h, lh, lib, rng, dtype="float32", dims=(32, 256, 56, 56)):
    bdims = (1, dims[1], 1, 1)
    b, c = rand(bdims, dtype, rng), rand(dims, dtype, rng)
    c2 = c.copy()
    bd, cd = ours_desc(bdims, dtype), ours_desc(dims, dtype)
    D = L.Descs()
    lb, lc = D.tensor(bdims, strides(bdims, "NCHW"), dtype), D.tensor(dims, strides(dims, "NCHW"), dtype)
    alpha, beta = L.scalar_ptr(1.0, dtype), L.scalar_ptr(1.0, dtype)  # C = bias + C
    tb, tc = torch_view(b, bdims, "NCHW"), torch_view(c2.copy(), dims, "NCHW")
    return dict(
        ours=lambda: cc.cudnnAddTensor(h, 1.0, bd, b, 1.0, cd, c),
        legacy=lambda: lcall(lib, "cudnnAddTensor", lh.ptr, ctypes.byref(alpha), lb, b.data.ptr, ctypes.byref(beta), lc,
                             c2.data.ptr),
        torch=lambda: tc.add_(tb), bytes=2 * c.nbytes + b.nbytes, check=(c, c2))


def case_relu(h, lh, lib, rng, dtype="float32", dims=(32, 256, 56, 56)):
    x, y, y2 = rand(dims, dtype, rng), cupy.empty(int(np.prod(dims)), NP[dtype]), cupy.empty(int(np.prod(dims)), NP[dtype])
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    xd = ours_desc(dims, dtype)
    D = L.Descs()
    lx, la = D.tensor(dims, strides(dims, "NCHW"), dtype), D.activation("RELU")
    one, zero = L.scalar_ptr(1.0, dtype), L.scalar_ptr(0.0, dtype)
    tx, ty = torch_view(x, dims, "NCHW"), torch_view(cupy.empty_like(y), dims, "NCHW")
    return dict(
        ours=lambda: cc.cudnnActivationForward(h, ad, 1.0, xd, x, 0.0, xd, y),
        legacy=lambda: lcall(lib, "cudnnActivationForward", lh.ptr, la, ctypes.byref(one), lx, x.data.ptr,
                             ctypes.byref(zero), lx, y2.data.ptr),
        torch=lambda: torch.clamp_min(tx, 0, out=ty), bytes=2 * x.nbytes, check=(y, y2))


def case_op_tensor(h, lh, lib, rng, dtype="float32", dims=(32, 256, 56, 56)):
    a, b = rand(dims, dtype, rng), rand(dims, dtype, rng)
    c, c2 = cupy.empty_like(a), cupy.empty_like(a)
    od = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(od, cc.CUDNN_OP_TENSOR_ADD, cc.CUDNN_DATA_FLOAT, cc.CUDNN_NOT_PROPAGATE_NAN)
    d = ours_desc(dims, dtype)
    D = L.Descs()
    ld = D.tensor(dims, strides(dims, "NCHW"), dtype)
    p = ctypes.c_void_p()
    lcall(lib, "cudnnCreateOpTensorDescriptor", ctypes.byref(p))
    lod = p.value
    lcall(lib, "cudnnSetOpTensorDescriptor", lod, 0, L.DATA_TYPE["float32"], 0)
    one, zero = L.scalar_ptr(1.0, "float32"), L.scalar_ptr(0.0, "float32")
    ta, tb, tc = (torch_view(v, dims, "NCHW") for v in (a, b, cupy.empty_like(a)))
    return dict(
        ours=lambda: cc.cudnnOpTensor(h, od, 1.0, d, a, 1.0, d, b, 0.0, d, c),
        legacy=lambda: lcall(lib, "cudnnOpTensor", lh.ptr, lod, ctypes.byref(one), ld, a.data.ptr, ctypes.byref(one),
                             ld, b.data.ptr, ctypes.byref(zero), ld, c2.data.ptr),
        torch=lambda: torch.add(ta, tb, out=tc), bytes=3 * a.nbytes, check=(c, c2))


def _bn_setup(rng, dtype, dims, layout):
    pdims = (1, dims[1], 1, 1)
    x = rand(dims, dtype, rng)
    y, y2 = cupy.empty_like(x), cupy.empty_like(x)
    scale, bias = rand(pdims, "float32", rng, low=0.5), rand(pdims, "float32", rng)
    rm, rv = rand(pdims, "float32", rng), rand(pdims, "float32", rng, low=0.5)
    return pdims, x, y, y2, scale, bias, rm, rv


def case_bn_inference(h, lh, lib, rng, dtype="float32", dims=(32, 256, 56, 56), layout="NCHW"):
    pdims, x, y, y2, scale, bias, rm, rv = _bn_setup(rng, dtype, dims, layout)
    xd, pd = ours_desc(dims, dtype, layout), ours_desc(pdims, "float32")
    mode = cc.CUDNN_BATCHNORM_SPATIAL
    D = L.Descs()
    lx, lp = D.tensor(dims, strides(dims, layout), dtype), D.tensor(pdims, strides(pdims, "NCHW"), "float32")
    one, zero = L.scalar_ptr(1.0, "float32"), L.scalar_ptr(0.0, "float32")
    tx = torch_view(x, dims, layout)
    ts, tb, tm, tv = (torch.as_tensor(v, device="cuda") for v in (scale, bias, rm, rv))
    return dict(
        ours=lambda: cc.cudnnBatchNormalizationForwardInference(h, mode, 1.0, 0.0, xd, x, xd, y, pd, scale, bias, rm, rv,
                                                                1e-5),
        legacy=lambda: lcall(lib, "cudnnBatchNormalizationForwardInference", lh.ptr, 1, ctypes.byref(one),
                             ctypes.byref(zero), lx, x.data.ptr, lx, y2.data.ptr, lp, scale.data.ptr, bias.data.ptr,
                             rm.data.ptr, rv.data.ptr, 1e-5),
        torch=lambda: F.batch_norm(tx, tm, tv, ts, tb, training=False, eps=1e-5), bytes=2 * x.nbytes, check=(y, y2))


def case_bn_training(h, lh, lib, rng, dtype="float32", dims=(32, 256, 56, 56), layout="NCHW"):
    pdims, x, y, y2, scale, bias, rm, rv = _bn_setup(rng, dtype, dims, layout)
    rm2, rv2 = rm.copy(), rv.copy()
    sm, si, sm2, si2 = (cupy.empty(dims[1], np.float32) for _ in range(4))
    xd, pd = ours_desc(dims, dtype, layout), ours_desc(pdims, "float32")
    mode = cc.CUDNN_BATCHNORM_SPATIAL
    D = L.Descs()
    lx, lp = D.tensor(dims, strides(dims, layout), dtype), D.tensor(pdims, strides(pdims, "NCHW"), "float32")
    one, zero = L.scalar_ptr(1.0, "float32"), L.scalar_ptr(0.0, "float32")
    tx = torch_view(x, dims, layout)
    ts, tb, tm, tv = (torch.as_tensor(v.copy(), device="cuda") for v in (scale, bias, rm, rv))
    return dict(
        ours=lambda: cc.cudnnBatchNormalizationForwardTraining(h, mode, 1.0, 0.0, xd, x, xd, y, pd, scale, bias, 0.1, rm,
                                                               rv, 1e-5, sm, si),
        legacy=lambda: lcall(lib, "cudnnBatchNormalizationForwardTraining", lh.ptr, 1, ctypes.byref(one),
                             ctypes.byref(zero), lx, x.data.ptr, lx, y2.data.ptr, lp, scale.data.ptr, bias.data.ptr,
                             0.1, rm2.data.ptr, rv2.data.ptr, 1e-5, sm2.data.ptr, si2.data.ptr),
        torch=lambda: F.batch_norm(tx, tm, tv, ts, tb, training=True, momentum=0.1, eps=1e-5),
        bytes=3 * x.nbytes, check=(y, y2))


def case_bn_backward(h, lh, lib, rng, dtype="float32", dims=(32, 256, 56, 56), layout="NCHW"):
    pdims, x, dx, dx2, scale, bias, rm, rv = _bn_setup(rng, dtype, dims, layout)
    dy = rand(dims, dtype, rng)
    tx = torch_view(x, dims, layout).float()
    mean = tx.mean(dim=(0, 2, 3))
    var = tx.var(dim=(0, 2, 3), unbiased=False)
    sm = cupy.asarray(mean.cpu().numpy().astype(np.float32))
    si = cupy.asarray((1.0 / torch.sqrt(var + 1e-5)).cpu().numpy().astype(np.float32))
    ds, db, ds2, db2 = (cupy.empty(dims[1], np.float32) for _ in range(4))
    xd, pd = ours_desc(dims, dtype, layout), ours_desc(pdims, "float32")
    mode = cc.CUDNN_BATCHNORM_SPATIAL
    D = L.Descs()
    lx, lp = D.tensor(dims, strides(dims, layout), dtype), D.tensor(pdims, strides(pdims, "NCHW"), "float32")
    one, zero = L.scalar_ptr(1.0, "float32"), L.scalar_ptr(0.0, "float32")
    txg = torch_view(x, dims, layout).detach().clone().requires_grad_(True)
    tw = torch.as_tensor(scale.copy(), device="cuda").requires_grad_(True)
    tbb = torch.as_tensor(bias.copy(), device="cuda").requires_grad_(True)
    ty = F.batch_norm(txg, None, None, tw, tbb, training=True, eps=1e-5)
    tdy = torch_view(dy, dims, layout)
    return dict(
        ours=lambda: cc.cudnnBatchNormalizationBackward(h, mode, 1.0, 0.0, 1.0, 0.0, xd, x, xd, dy, xd, dx, pd, scale,
                                                        ds, db, 1e-5, sm, si),
        legacy=lambda: lcall(lib, "cudnnBatchNormalizationBackward", lh.ptr, 1, ctypes.byref(one), ctypes.byref(zero),
                             ctypes.byref(one), ctypes.byref(zero), lx, x.data.ptr, lx, dy.data.ptr, lx, dx2.data.ptr,
                             lp, scale.data.ptr, ds2.data.ptr, db2.data.ptr, 1e-5, sm.data.ptr, si.data.ptr),
        torch=lambda: torch.autograd.grad(ty, (txg, tw, tbb), tdy, retain_graph=True),
        bytes=5 * x.nbytes, check=(dx, dx2))


def case_pool(h, lh, lib, rng, mode="max", dtype="float32", dims=(32, 64, 112, 112), layout="NCHW"):
    ydims = (dims[0], dims[1], (dims[2] + 2 - 3) // 2 + 1, (dims[3] + 2 - 3) // 2 + 1)
    x = rand(dims, dtype, rng)
    y, y2 = cupy.empty(int(np.prod(ydims)), NP[dtype]), cupy.empty(int(np.prod(ydims)), NP[dtype])
    cmode = cc.CUDNN_POOLING_MAX if mode == "max" else cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
    pd = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pd, cmode, cc.CUDNN_NOT_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2)
    xd, yd = ours_desc(dims, dtype, layout), ours_desc(ydims, dtype, layout)
    D = L.Descs()
    lx, ly = D.tensor(dims, strides(dims, layout), dtype), D.tensor(ydims, strides(ydims, layout), dtype)
    lpd = D.pooling(int(cmode), (3, 3), (1, 1), (2, 2))
    one, zero = L.scalar_ptr(1.0, "float32"), L.scalar_ptr(0.0, "float32")
    tx = torch_view(x, dims, layout)
    tfn = (lambda: F.max_pool2d(tx, 3, 2, 1)) if mode == "max" else (lambda: F.avg_pool2d(tx, 3, 2, 1))
    return dict(
        ours=lambda: cc.cudnnPoolingForward(h, pd, 1.0, xd, x, 0.0, yd, y),
        legacy=lambda: lcall(lib, "cudnnPoolingForward", lh.ptr, lpd, ctypes.byref(one), lx, x.data.ptr,
                             ctypes.byref(zero), ly, y2.data.ptr),
        torch=tfn, bytes=x.nbytes + y.nbytes, check=(y, y2),
        # unequal work: compare ours with legacy (the same call); torch's figure is not like for like
        torch_note=("torch's F.max_pool2d on CUDA also writes an int64 index per output element "
                    f"(+{int(np.prod(ydims)) * 8 / 1e6:.0f} MB)") if mode == "max" else None)


def case_softmax(h, lh, lib, rng, mode="instance", dtype="float32", dims=(8192, 1000, 1, 1)):
    x = rand(dims, dtype, rng)
    y, y2 = cupy.empty_like(x), cupy.empty_like(x)
    cmode = cc.CUDNN_SOFTMAX_MODE_INSTANCE if mode == "instance" else cc.CUDNN_SOFTMAX_MODE_CHANNEL
    xd = ours_desc(dims, dtype)
    D = L.Descs()
    lx = D.tensor(dims, strides(dims, "NCHW"), dtype)
    one, zero = L.scalar_ptr(1.0, "float32"), L.scalar_ptr(0.0, "float32")
    tx = torch_view(x, dims, "NCHW")
    acc = cc.CUDNN_SOFTMAX_ACCURATE
    return dict(
        ours=lambda: cc.cudnnSoftmaxForward(h, acc, cmode, 1.0, xd, x, 0.0, xd, y),
        legacy=lambda: lcall(lib, "cudnnSoftmaxForward", lh.ptr, int(acc), int(cmode), ctypes.byref(one), lx, x.data.ptr,
                             ctypes.byref(zero), lx, y2.data.ptr),
        torch=lambda: torch.softmax(tx, dim=1), bytes=2 * x.nbytes, check=(y, y2))


def case_lrn(h, lh, lib, rng, dtype="float32", dims=(32, 64, 56, 56)):
    x = rand(dims, dtype, rng)
    y, y2 = cupy.empty_like(x), cupy.empty_like(x)
    ld = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(ld, 5, 1e-4, 0.75, 2.0)
    xd = ours_desc(dims, dtype)
    D = L.Descs()
    lx = D.tensor(dims, strides(dims, "NCHW"), dtype)
    p = ctypes.c_void_p()
    lcall(lib, "cudnnCreateLRNDescriptor", ctypes.byref(p))
    lld = p.value
    lcall(lib, "cudnnSetLRNDescriptor", lld, 5, 1e-4, 0.75, 2.0)
    one, zero = L.scalar_ptr(1.0, "float32"), L.scalar_ptr(0.0, "float32")
    tx = torch_view(x, dims, "NCHW")
    dim1 = cc.CUDNN_LRN_CROSS_CHANNEL_DIM1
    return dict(
        ours=lambda: cc.cudnnLRNCrossChannelForward(h, ld, dim1, 1.0, xd, x, 0.0, xd, y),
        legacy=lambda: lcall(lib, "cudnnLRNCrossChannelForward", lh.ptr, lld, 0, ctypes.byref(one), lx, x.data.ptr,
                             ctypes.byref(zero), lx, y2.data.ptr),
        torch=lambda: F.local_response_norm(tx, 5, 1e-4, 0.75, 2.0), bytes=2 * x.nbytes, check=(y, y2))


BN = (case_bn_training, case_bn_backward)
CASES = [
    ("AddTensor bias fp32 32x256x56x56", case_add_tensor, {}),
    ("ReLU fp32 32x256x56x56", case_relu, {}),
    ("ReLU fp16 32x256x56x56", case_relu, {"dtype": "float16"}),
    ("OpTensor add fp32 32x256x56x56", case_op_tensor, {}),
    ("BN inference fp32 NCHW", case_bn_inference, {}),
    ("BN training fp32 NCHW", case_bn_training, {}),
    ("BN training fp32 NHWC", case_bn_training, {"layout": "NHWC"}),
    ("BN training fp16 NCHW", case_bn_training, {"dtype": "float16"}),
    ("BN training fp16 NHWC", case_bn_training, {"dtype": "float16", "layout": "NHWC"}),
    ("BN backward fp32 NCHW", case_bn_backward, {}),
    ("BN backward fp32 NHWC", case_bn_backward, {"layout": "NHWC"}),
    ("BN backward fp16 NCHW", case_bn_backward, {"dtype": "float16"}),
    ("BN backward fp16 NHWC", case_bn_backward, {"dtype": "float16", "layout": "NHWC"}),
    ("maxpool 3x3 s2 fp32 NCHW 32x64x112x112", case_pool, {"mode": "max"}),
    ("maxpool 3x3 s2 fp16 NCHW 32x64x112x112", case_pool, {"mode": "max", "dtype": "float16"}),
    ("maxpool 3x3 s2 fp16 NHWC 32x64x112x112", case_pool, {"mode": "max", "dtype": "float16", "layout": "NHWC"}),
    ("maxpool 3x3 s2 fp32 NHWC 32x64x112x112", case_pool, {"mode": "max", "layout": "NHWC"}),
    ("avgpool 3x3 s2 fp32 NCHW 32x64x112x112", case_pool, {"mode": "avg"}),
    ("softmax instance fp32 8192x1000", case_softmax, {}),
    ("softmax instance fp16 8192x1000", case_softmax, {"dtype": "float16"}),
    ("softmax channel fp32 32x1000x7x7", case_softmax, {"mode": "channel", "dims": (32, 1000, 7, 7)}),
    ("LRN n=5 32x64x56x56", case_lrn, {}),
]
SWEEP = [dict(TARGET_BLOCKS=t, MIN_BLOCKS=m, UNROLL=u, COMBINE_LOADS=c)
         for t, m, u, c in ((264, 132, 4, 32), (264, 132, 2, 32), (396, 132, 4, 32), (264, 132, 4, 64),
                            (528, 264, 2, 32))]


def copy_time(nbytes, iters, reps):
    src, dst = cupy.empty(nbytes // 4, np.float32), cupy.empty(nbytes // 4, np.float32)
    src[...] = 1.0
    return timeit(lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, 3, 0), iters, reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--generic", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    if cupy is None:
        sys.exit(missing_gpu_stack(__file__, _MISSING))
    if args.quick:
        args.iters, args.reps = 5, 3
    from cudnn_compat._backend.engines.cupy_engine import bn, rowops
    rng = np.random.default_rng(0)
    h = cc.cudnnCreate("gpu")
    lh = L.Handle()
    lib = legacy_lib()
    dev = device_name()
    # the copy ceiling: reading and writing 2 x 103 MB (the size of the big activations)
    copy_bytes = 32 * 256 * 56 * 56 * 4
    t_copy = copy_time(copy_bytes, args.iters, args.reps)
    copy_gbs = 2 * copy_bytes / (t_copy * 1e-6) / 1e9
    print(f"device: {dev}; copy of {copy_bytes / 1e6:.0f} MB: {t_copy:.1f} us, {copy_gbs:.0f} GB/s (read + write)")
    rows = []
    for name, fn, kw in CASES:
        if args.only and not any(o.strip() and o.strip() in name for o in args.only.split(",")):
            continue
        try:
            c = fn(h, lh, lib, rng, **kw)
        except Exception as e:  # report and go on with the other cases
            print(f"  {name}: setup failed: {type(e).__name__}: {e}", flush=True)
            rows.append({"op": name, "ours": None, "legacy": None, "torch": None, "err": None,
                         "setup_error": f"{type(e).__name__}: {e}"[:300]})
            continue
        row = {"op": name, "bytes": c["bytes"]}
        if c.get("torch_note"):
            row["torch_note"] = c["torch_note"]
        for side in ("ours", "legacy", "torch"):
            try:
                row[side] = timeit(c[side], args.iters, args.reps)
                row[side + "_gpu"] = gpu_timeit(c[side], args.iters, args.reps)
            except Exception as e:  # a baseline that cannot run this case
                row[side] = row.get(side)
                row[side + "_error"] = f"{type(e).__name__}: {e}"[:300]
        cupy.cuda.Device().synchronize()
        try:
            row["err"] = relerr(*c["check"])
        except Exception as e:
            row["err"] = None
            row["check_error"] = str(e)[:200]
        generic = fn in BN or fn is case_softmax
        if args.generic and generic:
            rowops.FAST_BN = rowops.FAST_SOFTMAX = False
            cc.plan_cache_clear()
            try:
                row["ours_generic_gpu"] = gpu_timeit(c["ours"], args.iters, args.reps)
            finally:
                rowops.FAST_BN = rowops.FAST_SOFTMAX = True
                cc.plan_cache_clear()
        if args.sweep and fn in BN:
            saved = {k: getattr(bn, k) for k in SWEEP[0]}
            row["sweep"] = []
            for knobs in SWEEP:
                for k, v in knobs.items():
                    setattr(bn, k, v)
                cc.plan_cache_clear()
                try:
                    row["sweep"].append(dict(knobs, gpu_us=gpu_timeit(c["ours"], args.iters, args.reps)))
                except Exception as e:
                    row["sweep"].append(dict(knobs, error=str(e)[:200]))
            for k, v in saved.items():
                setattr(bn, k, v)
            cc.plan_cache_clear()
            print(f"    sweep: " + ", ".join(f"{d.get('TARGET_BLOCKS')}/{d.get('MIN_BLOCKS')}/{d.get('UNROLL')}/"
                                              f"{d.get('COMBINE_LOADS')}: {d.get('gpu_us', -1):.1f}" for d in row["sweep"]))
        if args.profile:
            try:
                row["profile"] = profile_one(c["ours"])
            except Exception as e:
                row["profile_error"] = str(e)[:200]
        t = row.get("ours_gpu") or row.get("ours")
        if t:
            gbs = c["bytes"] / (t * 1e-6) / 1e9
            row["gbs"], row["pct_copy"] = gbs, 100 * gbs / copy_gbs
        if row.get("ours") and row.get("legacy"):
            row["ours_over_legacy"] = row["ours"] / row["legacy"]
        if row.get("ours_gpu") and row.get("legacy_gpu"):
            row["ours_over_legacy_gpu"] = row["ours_gpu"] / row["legacy_gpu"]
        rows.append(row)
        print(f"  {name}: ours {row.get('ours')}, legacy {row.get('legacy')}, torch {row.get('torch')}; gpu: ours "
              f"{row.get('ours_gpu')}, legacy {row.get('legacy_gpu')}, torch {row.get('torch_gpu')}, generic "
              f"{row.get('ours_generic_gpu')}", flush=True)
        for p in row.get("profile", []):
            print(f"      {p['kernel']:60s} x{p['per_call']:.0f} {p['us']:8.1f} us")
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)  # noqa: E731
    print()
    for r in rows:
        if r.get("torch_note"):
            print(f"  ({r['op']}: torch* = {r['torch_note']})")
        for k in ("ours_error", "legacy_error", "torch_error", "setup_error"):
            if r.get(k):
                print(f"  ({r['op']}: {k}: {r[k]})")
    print(f"{'op':40s} {'ours':>7s} {'legacy':>7s} {'torch':>7s} | {'ours':>6s} {'legacy':>7s} {'torch':>6s} "
          f"{'generic':>7s} {'GB/s':>5s} {'%copy':>5s} {'err':>7s}")
    print(f"{'':40s} {'(us, as called)':>23s} | {'(us, GPU only)':>29s}")
    for r in rows:
        star = "*" if r.get("torch_note") else ""  # torch did more work than the call (see the note)
        print(f"{r['op'][:40]:40s} {fmt(r.get('ours')):>7s} {fmt(r.get('legacy')):>7s} "
              f"{fmt(r.get('torch')) + star:>7s} | "
              f"{fmt(r.get('ours_gpu')):>6s} {fmt(r.get('legacy_gpu')):>7s} {fmt(r.get('torch_gpu')) + star:>6s} "
              f"{fmt(r.get('ours_generic_gpu')):>7s} {fmt(r.get('gbs'), '{:.0f}'):>5s} "
              f"{fmt(r.get('pct_copy'), '{:.0f}'):>5s} {fmt(r.get('err'), '{:.1e}'):>7s}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(args.out, f"memory_bound-{dev.replace(' ', '_')}-{stamp}.json")
    write_json_file(path, {"device": dev, "copy_us": t_copy, "copy_gbs": copy_gbs, "copy_bytes": copy_bytes,
                           "iters": args.iters, "reps": args.reps, "torch": torch.__version__,
                           "cupy": cupy.__version__, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
