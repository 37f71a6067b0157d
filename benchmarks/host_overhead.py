"""Host cost of a cached legacy call, every compute family (issue 14 item 3: at most 8 us per
cached call on a GPU handle; issue 5: "the cached call path is lean").

Times repeated identical calls of a tiny problem, so the plan cache always hits and the
device work is negligible; what is left is the legacy layer (descriptor resolve, key,
plan-cache lookup, binding) and, on the GPU, the engine's launch path.

  --place cpu   a no-op engine (its plans do nothing) on a CPU handle with NumPy buffers:
                the cost of the legacy and graph layers alone, measurable without a GPU
  --place emu   the GPU place without a GPU (tests/host_emu.py, kernels not run): the legacy
                layer's GPU binding, the planner and the cupy engine's launch records, and for the
                convolutions the native engine's CudnnPlan over a stand-in libcudnn (its execute and
                CUDA graph replay do nothing), host cost only.  A GPU adds the launches themselves
                (about 4.4 us per cuLaunchKernel, 1.7 us per graph launch on an H100 host:
                benchmarks/launch_paths.py); the RNN forward has no emulation (error)
  --place gpu   the default engines on a GPU handle with CuPy buffers (the native ``cudnn``
                engine for convolutions, the ``cupy`` engine's launch records for the rest),
                next to the same call on the real legacy libcudnn where libcudnn 9 still
                exports it, called from Python through ctypes (``cudnn_compat/_backend/legacy_cudnn.py``):
                the column "legacy via ctypes", which includes the cost of a ctypes call itself;
                that cost alone (a cudnnGetStream through the same path) is the "ctypes call"
                figure (``ctypes_call_us``), so legacy C's own host cost is roughly the
                difference

Families (``CASES``): conv fwd / bwd data / bwd filter / conv+bias+act, activation fwd/bwd,
add / op / reduce tensor, BN forward training / inference / backward, pooling fwd/bwd,
softmax fwd/bwd, LRN, dropout forward, RNN forward (cudnnRNNForward, LSTM, inference).
``GAPS``: calls measured and printed the same way but kept out of the target, ``mixed`` and the
max median (JSON ``gaps``), because their cost is an engine-coverage gap rather than the call path:
conv+bias+act in fp32 NCHW, a fused graph no native engine takes: it runs split (the native
convolution, then its epilogue, convolution/bias_act.py) on the Python path, the split form
having no steady recipe.

    PYTHONPATH=. python benchmarks/host_overhead.py [--place cpu|gpu] [--calls 10000]
        [--only NAME[,NAME]] [--profile [--profile-calls 2000]] [--root DIR] [--json PATH]

After the families, ``mixed``: every case called in turn, one call each per round, as a program calls
different families (each call site's code and data are cold again when it comes back), ours and
the legacy column, against the same calls repeated.

On the GPU the run first prints ``driver_launch_us`` (one bare cuLaunchKernel of an empty kernel on
this host: the driver's share of a one-launch call, below which no call path goes) and
``host_calib_us`` (the host's Python speed), since both move up to 2x between lent machines.

``--root`` imports cudnn_compat from another tree (e.g. an export of an older commit) so
before/after can be measured by one script.  Prints microseconds per call: median (per-call
perf_counter; the figure the target is on), mean (timeit) and this thread's CPU time per call;
``--profile`` adds cProfile's top functions by own time.  On the GPU the JSON goes to
``benchmarks/results/host_overhead_<device>.json`` unless ``--json`` names a path.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import device_name, driver_launch_us, host_calib_us, median_us, write_json_file  # noqa: E402

TARGET_US = 8.0
CASES = ("conv_fwd", "conv_bwd_data", "conv_bwd_filter", "conv_bias_act", "act_fwd", "act_bwd", "add_tensor",
         "op_tensor", "reduce_tensor", "bn_fwd_train", "bn_fwd_inf", "bn_bwd", "pool_fwd", "pool_bwd",
         "softmax_fwd", "softmax_bwd", "lrn_fwd", "dropout_fwd", "rnn_fwd")
GAPS = ("conv_bias_act_nchw",)  # see the module docstring


def _setup_path(root):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.abspath(root) if root else here)


def _noop_engine():
    from cudnn_compat._backend import heuristics
    from cudnn_compat._backend.engines.base import REGISTRY, Engine, ExecutionPlan

    class NoopPlan(ExecutionPlan):
        def execute(self, pack, stream=None):
            pass

    class Noop(Engine):
        name, places = "noop", ("cpu",)

        def build(self, graph, config):
            return NoopPlan(graph, config)

    REGISTRY.register(Noop())
    heuristics.ORDER["cpu"] = ("noop",)


# -- the real legacy library (GPU only) ------------------------------------------------------------

_vp, _int, _sz, _dbl = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_double
_pvp, _psz = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)
EXTRA_PROTOTYPES = {  # legacy functions legacy_cudnn.py does not declare
    "cudnnGetStream": [_vp, _pvp],  # the ctypes floor (ctypes_call_us): a call that does nothing
    "cudnnActivationBackward": [_vp] * 12,
    "cudnnPoolingBackward": [_vp] * 12,
    "cudnnSoftmaxBackward": [_vp, _int, _int] + [_vp] * 8,
    "cudnnBatchNormalizationBackward": [_vp, _int] + [_vp] * 14 + [_dbl, _vp, _vp],
    "cudnnCreateLRNDescriptor": [_pvp], "cudnnSetLRNDescriptor": [_vp, ctypes.c_uint, _dbl, _dbl, _dbl],
    "cudnnLRNCrossChannelForward": [_vp, _vp, _int] + [_vp] * 6,
    "cudnnDropoutGetReserveSpaceSize": [_vp, _psz],
    "cudnnDropoutForward": [_vp] * 7 + [_sz],
    "cudnnCreateReduceTensorDescriptor": [_pvp], "cudnnSetReduceTensorDescriptor": [_vp, _int, _int, _int, _int, _int],
    "cudnnGetReductionWorkspaceSize": [_vp, _vp, _vp, _vp, _psz],
    "cudnnReduceTensor": [_vp, _vp, _vp, _sz, _vp, _sz, _vp, _vp, _vp, _vp, _vp, _vp],
}


class Legacy:
    """The real legacy calls on the same tiny problems (buffers of their own, same shapes)."""

    def __init__(self):
        from cudnn_compat._backend import legacy_cudnn as L
        self.L = L
        self.lib = L.load()
        for name, args in EXTRA_PROTOTYPES.items():
            fn = getattr(self.lib, name, None)
            if fn is not None:
                fn.restype, fn.argtypes = _int, args
        self.h = L.Handle()
        self.D = L.Descs()
        self.one, self.zero = L.scalar_ptr(1.0, "float32"), L.scalar_ptr(0.0, "float32")

    def fn(self, name):
        f = getattr(self.lib, name)
        L = self.L

        def call(*args):
            st = f(*args)
            if st:
                raise L.LegacyError(name, st)
        return call

    def create(self, kind):
        p = ctypes.c_void_p()
        self.fn(f"cudnnCreate{kind}Descriptor")(ctypes.byref(p))
        return p.value


def ctypes_floor(calls: int, sync=None) -> float:
    """Median microseconds of the bare ctypes call through the same path as the legacy column
    (``Legacy.fn``: the function pointer, argument conversion, the status check): cudnnGetStream,
    which only reads the handle.  The "legacy via ctypes" figures include this much Python."""
    leg = Legacy()
    get, stream = leg.fn("cudnnGetStream"), ctypes.c_void_p()
    ref = ctypes.byref(stream)
    return measure(lambda: get(leg.h.ptr, ref), calls, sync)["median_us"]


def _strides(dims, layout="NCHW"):
    n = len(dims)
    order = list(range(n)) if layout == "NCHW" else [0] + list(range(2, n)) + [1]
    st, acc = [0] * n, 1
    for ax in reversed(order):
        st[ax] = acc
        acc *= dims[ax]
    return st


def make_calls(place: str, only=()):
    """{case: zero-argument callable}; on the GPU each callable has ``.legacy`` (the real legacy
    call on the same shapes, or None) and ``.engine`` (the engine our call ran on)."""
    import numpy as np
    import cudnn_compat as cc
    emu = None
    if place == "cpu":
        _noop_engine()
        xp = np
    elif place == "emu":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
        import host_emu
        emu = host_emu.Emu("noop", cudnn=True)  # convolutions: the native engine's cached path over a stand-in
        xp = np
    else:
        import cupy as xp
    h = emu.handle() if emu else cc.cudnnCreate(place)
    leg = Legacy() if place == "gpu" else None
    F32, H16 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_HALF
    NCHW, NHWC = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC
    one, zero = (leg.one, leg.zero) if leg else (None, None)
    by = ctypes.byref

    def td(dims, dt=F32, fmt=NCHW):
        d = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensor4dDescriptor(d, fmt, dt, *dims) if len(dims) == 4 else \
            cc.cudnnSetTensorNdDescriptor(d, dt, len(dims), list(dims), _strides(dims))
        return d

    def ltd(dims, dtype="float32", layout="NCHW"):
        return leg.D.tensor(dims, _strides(dims, layout), dtype)

    keep = []

    def buf(n, npdt=np.float32, fill=1.0):
        a = xp.full(n, fill, npdt)
        if place == "emu":  # device arrays of the emulated GPU place (host memory underneath)
            return host_emu.EmuArray(a)
        return a

    def ptr(a):
        return a.data.ptr if place == "gpu" else a.ctypes.data

    calls, legacy = {}, {}
    X = (1, 8, 8, 8)
    xd = td(X)
    x, y, dy, dx = buf(512), buf(512, fill=0.0), buf(512), buf(512, fill=0.0)

    # -- convolutions (fp32 NCHW 3x3 pad 1; conv+bias+act in fp16 NHWC, the layout cuDNN 9 fuses) --------
    def conv_problem(fmt, dt, npdt):
        cxd, cyd, bd = td(X, dt, fmt), td(X, dt, fmt), td((1, 8, 1, 1), dt)
        wd = cc.cudnnCreateFilterDescriptor()
        cc.cudnnSetFilter4dDescriptor(wd, dt, fmt, 8, 8, 3, 3)
        cd = cc.cudnnCreateConvolutionDescriptor()
        cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
        return cxd, wd, cyd, bd, cd, (buf(512, npdt), buf(576, npdt), buf(512, npdt, 0.0), buf(8, npdt))

    def ws_for(size):
        return (buf(size, np.uint8, 0), size) if size else (None, 0)

    cxd, wd, cyd, _bd, cd, (cx, cw, cy, _cb) = conv_problem(NCHW, F32, np.float32)
    fwd_algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    bd_algo, bf_algo = cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1
    fws, fws_n = ws_for(cc.cudnnGetConvolutionForwardWorkspaceSize(h, cxd, wd, cd, cyd, fwd_algo))
    bws, bws_n = ws_for(cc.cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, cyd, cd, cxd, bd_algo))
    gws, gws_n = ws_for(cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(h, cxd, cyd, cd, wd, bf_algo))
    cdw = buf(576, fill=0.0)
    calls["conv_fwd"] = lambda: cc.cudnnConvolutionForward(h, 1.0, cxd, cx, wd, cw, cd, fwd_algo, fws, fws_n, 0.0, cyd, cy)
    calls["conv_bwd_data"] = lambda: cc.cudnnConvolutionBackwardData(h, 1.0, wd, cw, cyd, cy, cd, bd_algo, bws, bws_n,
                                                                     0.0, cxd, cx)
    calls["conv_bwd_filter"] = lambda: cc.cudnnConvolutionBackwardFilter(h, 1.0, cxd, cx, cyd, cy, cd, bf_algo, gws,
                                                                         gws_n, 0.0, wd, cdw)
    hxd, hwd, hyd, hbd, hcd, (hx, hw, hy, hb) = conv_problem(NHWC, H16, np.float16)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    hws, hws_n = ws_for(cc.cudnnGetConvolutionForwardWorkspaceSize(h, hxd, hwd, hcd, hyd, fwd_algo))
    calls["conv_bias_act"] = lambda: cc.cudnnConvolutionBiasActivationForward(
        h, 1.0, hxd, hx, hwd, hw, hcd, fwd_algo, hws, hws_n, 0.0, hyd, hy, hbd, hb, ad, hyd, hy)
    nxd, nwd, nyd, nbd, ncd, (nx, nw, ny, nb) = conv_problem(NCHW, F32, np.float32)
    calls["conv_bias_act_nchw"] = lambda: cc.cudnnConvolutionBiasActivationForward(
        h, 1.0, nxd, nx, nwd, nw, ncd, fwd_algo, fws, fws_n, 0.0, nyd, ny, nbd, nb, ad, nyd, ny)
    if leg:
        L = leg.L
        lx, lw = ltd(X), leg.D.filter((8, 8, 3, 3), "float32")
        lc = leg.D.conv((1, 1), (1, 1), (1, 1))
        lws = {}
        for fn, algo, args in (("cudnnGetConvolutionForwardWorkspaceSize", fwd_algo, (lx, lw, lc, lx)),
                               ("cudnnGetConvolutionBackwardDataWorkspaceSize", bd_algo, (lw, lx, lc, lx)),
                               ("cudnnGetConvolutionBackwardFilterWorkspaceSize", bf_algo, (lx, lx, lc, lw))):
            n = L.workspace_size(fn, leg.h, *args, int(algo))
            lws[fn] = (xp.empty(max(n, 1), np.uint8), n)
        lcx, lcw, lcy, lcdw = buf(512), buf(576), buf(512, fill=0.0), buf(576, fill=0.0)
        (fw, fn_), (bw, bn_), (gw, gn_) = lws.values()
        cf, cb, cg = (leg.fn(n) for n in ("cudnnConvolutionForward", "cudnnConvolutionBackwardData",
                                          "cudnnConvolutionBackwardFilter"))
        legacy["conv_fwd"] = lambda: cf(leg.h.ptr, by(one), lx, ptr(lcx), lw, ptr(lcw), lc, int(fwd_algo), ptr(fw), fn_,
                                        by(zero), lx, ptr(lcy))
        legacy["conv_bwd_data"] = lambda: cb(leg.h.ptr, by(one), lw, ptr(lcw), lx, ptr(lcy), lc, int(bd_algo), ptr(bw),
                                             bn_, by(zero), lx, ptr(lcx))
        legacy["conv_bwd_filter"] = lambda: cg(leg.h.ptr, by(one), lx, ptr(lcx), lx, ptr(lcy), lc, int(bf_algo),
                                               ptr(gw), gn_, by(zero), lw, ptr(lcdw))
        lhx, lhw, lhb = ltd(X, "float16", "NHWC"), leg.D.filter((8, 8, 3, 3), "float16", nhwc=True), ltd((1, 8, 1, 1), "float16")
        la = leg.D.activation("RELU")
        n = L.workspace_size("cudnnGetConvolutionForwardWorkspaceSize", leg.h, lhx, lhw, lc, lhx, int(fwd_algo))
        lhws = xp.empty(max(n, 1), np.uint8)
        hx2, hw2, hy2, hb2 = buf(512, np.float16), buf(576, np.float16), buf(512, np.float16, 0.0), buf(8, np.float16)
        cba = leg.fn("cudnnConvolutionBiasActivationForward")
        legacy["conv_bias_act"] = lambda: cba(leg.h.ptr, by(one), lhx, ptr(hx2), lhw, ptr(hw2), lc, int(fwd_algo),
                                              ptr(lhws), n, by(zero), lhx, ptr(hy2), lhb, ptr(hb2), la, lhx, ptr(hy2))
        lb, ny2, nb2 = ltd((1, 8, 1, 1)), buf(512, fill=0.0), buf(8)
        legacy["conv_bias_act_nchw"] = lambda: cba(leg.h.ptr, by(one), lx, ptr(lcx), lw, ptr(lcw), lc, int(fwd_algo),
                                                   ptr(fw), fn_, by(zero), lx, ptr(ny2), lb, ptr(nb2), la, lx, ptr(ny2))

    # -- activation ------------------------------------------------------------------------------------------
    calls["act_fwd"] = lambda: cc.cudnnActivationForward(h, ad, 1.0, xd, x, 0.0, xd, y)
    calls["act_bwd"] = lambda: cc.cudnnActivationBackward(h, ad, 1.0, xd, y, xd, dy, xd, x, 0.0, xd, dx)
    if leg:
        lx, la = ltd(X), leg.D.activation("RELU")
        x2, y2, dy2, dx2 = buf(512), buf(512, fill=0.0), buf(512), buf(512, fill=0.0)
        af, ab = leg.fn("cudnnActivationForward"), leg.fn("cudnnActivationBackward")
        legacy["act_fwd"] = lambda: af(leg.h.ptr, la, by(one), lx, ptr(x2), by(zero), lx, ptr(y2))
        legacy["act_bwd"] = lambda: ab(leg.h.ptr, la, by(one), lx, ptr(y2), lx, ptr(dy2), lx, ptr(x2), by(zero), lx,
                                       ptr(dx2))

    # -- tensor ops --------------------------------------------------------------------------------------------
    bdesc, bias = td((1, 8, 1, 1)), buf(8)
    cbuf = buf(512)
    calls["add_tensor"] = lambda: cc.cudnnAddTensor(h, 1.0, bdesc, bias, 1.0, xd, cbuf)
    od = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(od, cc.CUDNN_OP_TENSOR_ADD, cc.CUDNN_DATA_FLOAT, cc.CUDNN_NOT_PROPAGATE_NAN)
    obuf = buf(512, fill=0.0)
    calls["op_tensor"] = lambda: cc.cudnnOpTensor(h, od, 1.0, xd, x, 1.0, xd, dy, 0.0, xd, obuf)
    rd = cc.cudnnCreateReduceTensorDescriptor()
    cc.cudnnSetReduceTensorDescriptor(rd, cc.CUDNN_REDUCE_TENSOR_ADD, cc.CUDNN_DATA_FLOAT, cc.CUDNN_NOT_PROPAGATE_NAN,
                                      cc.CUDNN_REDUCE_TENSOR_NO_INDICES, cc.CUDNN_32BIT_INDICES)
    rws, rws_n = ws_for(cc.cudnnGetReductionWorkspaceSize(h, rd, xd, bdesc))
    rbuf = buf(8, fill=0.0)
    calls["reduce_tensor"] = lambda: cc.cudnnReduceTensor(h, rd, None, 0, rws, rws_n, 1.0, xd, x, 0.0, bdesc, rbuf)
    if leg:
        lx, lb = ltd(X), ltd((1, 8, 1, 1))
        b2, c2, o2, r2 = buf(8), buf(512), buf(512, fill=0.0), buf(8, fill=0.0)
        at, ot, rt = leg.fn("cudnnAddTensor"), leg.fn("cudnnOpTensor"), leg.fn("cudnnReduceTensor")
        legacy["add_tensor"] = lambda: at(leg.h.ptr, by(one), lb, ptr(b2), by(one), lx, ptr(c2))
        lod = leg.D.op_tensor(0)
        legacy["op_tensor"] = lambda: ot(leg.h.ptr, lod, by(one), lx, ptr(x), by(one), lx, ptr(dy), by(zero), lx, ptr(o2))
        lrd = leg.create("ReduceTensor")
        leg.fn("cudnnSetReduceTensorDescriptor")(lrd, 0, 0, 0, 0, 0)
        n = ctypes.c_size_t()
        leg.fn("cudnnGetReductionWorkspaceSize")(leg.h.ptr, lrd, lx, lb, by(n))
        lrws, lrn_ = xp.empty(max(n.value, 1), np.uint8), n.value
        legacy["reduce_tensor"] = lambda: rt(leg.h.ptr, lrd, None, 0, ptr(lrws), lrn_, by(one), lx, ptr(x), by(zero), lb,
                                             ptr(r2))

    # -- batch norm (spatial) ------------------------------------------------------------------------------------
    pd_, mode = td((1, 8, 1, 1)), cc.CUDNN_BATCHNORM_SPATIAL
    scale, bnb, rm, rv, sm, si = buf(8), buf(8, fill=0.0), buf(8, fill=0.0), buf(8), buf(8, fill=0.0), buf(8, fill=1.0)
    dsc, dbi = buf(8, fill=0.0), buf(8, fill=0.0)
    calls["bn_fwd_train"] = lambda: cc.cudnnBatchNormalizationForwardTraining(h, mode, 1.0, 0.0, xd, x, xd, y, pd_, scale,
                                                                              bnb, 0.1, rm, rv, 1e-5, sm, si)
    calls["bn_fwd_inf"] = lambda: cc.cudnnBatchNormalizationForwardInference(h, mode, 1.0, 0.0, xd, x, xd, y, pd_, scale,
                                                                             bnb, rm, rv, 1e-5)
    calls["bn_bwd"] = lambda: cc.cudnnBatchNormalizationBackward(h, mode, 1.0, 0.0, 1.0, 0.0, xd, x, xd, dy, xd, dx, pd_,
                                                                 scale, dsc, dbi, 1e-5, sm, si)
    if leg:
        lx, lp = ltd(X), ltd((1, 8, 1, 1))
        x2, y2, dy2, dx2 = buf(512), buf(512, fill=0.0), buf(512), buf(512, fill=0.0)
        s2, b2, m2, v2, sm2, si2, ds2, db2 = (buf(8, fill=f) for f in (1, 0, 0, 1, 0, 1, 0, 0))
        bt, bi, bb = (leg.fn(n) for n in ("cudnnBatchNormalizationForwardTraining",
                                          "cudnnBatchNormalizationForwardInference", "cudnnBatchNormalizationBackward"))
        legacy["bn_fwd_train"] = lambda: bt(leg.h.ptr, 1, by(one), by(zero), lx, ptr(x2), lx, ptr(y2), lp, ptr(s2),
                                            ptr(b2), 0.1, ptr(m2), ptr(v2), 1e-5, ptr(sm2), ptr(si2))
        legacy["bn_fwd_inf"] = lambda: bi(leg.h.ptr, 1, by(one), by(zero), lx, ptr(x2), lx, ptr(y2), lp, ptr(s2),
                                          ptr(b2), ptr(m2), ptr(v2), 1e-5)
        legacy["bn_bwd"] = lambda: bb(leg.h.ptr, 1, by(one), by(zero), by(one), by(zero), lx, ptr(x2), lx, ptr(dy2), lx,
                                      ptr(dx2), lp, ptr(s2), ptr(ds2), ptr(db2), 1e-5, ptr(sm2), ptr(si2))

    # -- pooling (max 3x3 stride 2 pad 1), softmax (channel), LRN ----------------------------------------------
    pool = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pool, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2)
    PY = (1, 8, 4, 4)
    pyd, py, pdy = td(PY), buf(128, fill=0.0), buf(128)
    calls["pool_fwd"] = lambda: cc.cudnnPoolingForward(h, pool, 1.0, xd, x, 0.0, pyd, py)
    calls["pool_bwd"] = lambda: cc.cudnnPoolingBackward(h, pool, 1.0, pyd, py, pyd, pdy, xd, x, 0.0, xd, dx)
    acc, chan = cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL
    calls["softmax_fwd"] = lambda: cc.cudnnSoftmaxForward(h, acc, chan, 1.0, xd, x, 0.0, xd, y)
    calls["softmax_bwd"] = lambda: cc.cudnnSoftmaxBackward(h, acc, chan, 1.0, xd, y, xd, dy, 0.0, xd, dx)
    lrnd = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(lrnd, 5, 1e-4, 0.75, 2.0)
    calls["lrn_fwd"] = lambda: cc.cudnnLRNCrossChannelForward(h, lrnd, cc.CUDNN_LRN_CROSS_CHANNEL_DIM1, 1.0, xd, x, 0.0,
                                                              xd, y)
    if leg:
        lx, ly = ltd(X), ltd(PY)
        lpd = leg.D.pooling(int(cc.CUDNN_POOLING_MAX), (3, 3), (1, 1), (2, 2))
        x2, y2, dy2, dx2, py2, pdy2 = buf(512), buf(512, fill=0.0), buf(512), buf(512, fill=0.0), buf(128), buf(128)
        pf, pb = leg.fn("cudnnPoolingForward"), leg.fn("cudnnPoolingBackward")
        legacy["pool_fwd"] = lambda: pf(leg.h.ptr, lpd, by(one), lx, ptr(x2), by(zero), ly, ptr(py2))
        legacy["pool_bwd"] = lambda: pb(leg.h.ptr, lpd, by(one), ly, ptr(py2), ly, ptr(pdy2), lx, ptr(x2), by(zero), lx,
                                        ptr(dx2))
        sf, sb = leg.fn("cudnnSoftmaxForward"), leg.fn("cudnnSoftmaxBackward")
        legacy["softmax_fwd"] = lambda: sf(leg.h.ptr, int(acc), int(chan), by(one), lx, ptr(x2), by(zero), lx, ptr(y2))
        legacy["softmax_bwd"] = lambda: sb(leg.h.ptr, int(acc), int(chan), by(one), lx, ptr(y2), lx, ptr(dy2), by(zero),
                                           lx, ptr(dx2))
        llrn = leg.create("LRN")
        leg.fn("cudnnSetLRNDescriptor")(llrn, 5, 1e-4, 0.75, 2.0)
        lf = leg.fn("cudnnLRNCrossChannelForward")
        legacy["lrn_fwd"] = lambda: lf(leg.h.ptr, llrn, 0, by(one), lx, ptr(x2), by(zero), lx, ptr(y2))

    # -- dropout -----------------------------------------------------------------------------------------------
    dd = cc.cudnnCreateDropoutDescriptor()
    nstates = cc.cudnnDropoutGetStatesSize(h)
    states = buf(nstates, np.uint8, 0)
    cc.cudnnSetDropoutDescriptor(dd, h, 0.5, states, nstates, 1234)
    nres = cc.cudnnDropoutGetReserveSpaceSize(xd)
    reserve = buf(nres, np.uint8, 0)
    calls["dropout_fwd"] = lambda: cc.cudnnDropoutForward(h, dd, xd, x, xd, y, reserve, nres)
    if leg:
        lx = ltd(X)
        ldd = leg.create("Dropout")
        n = ctypes.c_size_t()
        leg.fn("cudnnDropoutGetStatesSize")(leg.h.ptr, by(n))
        lstates = xp.zeros(max(n.value, 1), np.uint8)
        leg.fn("cudnnSetDropoutDescriptor")(ldd, leg.h.ptr, 0.5, ptr(lstates), n.value, 1234)
        leg.fn("cudnnDropoutGetReserveSpaceSize")(lx, by(n))
        lres, lres_n = xp.zeros(max(n.value, 1), np.uint8), n.value
        x2, y2 = buf(512), buf(512, fill=0.0)
        df = leg.fn("cudnnDropoutForward")
        legacy["dropout_fwd"] = lambda: df(leg.h.ptr, ldd, lx, ptr(x2), lx, ptr(y2), ptr(lres), lres_n)

    # -- RNN forward (v8 API; LSTM, 1 layer, T=2, B=2, 8 -> 8, inference) -----------------------------------------
    T, B, HID = 2, 2, 8
    rnn_drop = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnSetDropoutDescriptor(rnn_drop, h, 0.0, None, 0, 0)
    rnnd = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor_v8(rnnd, cc.CUDNN_RNN_ALGO_STANDARD, cc.CUDNN_LSTM, cc.CUDNN_RNN_DOUBLE_BIAS,
                                cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_LINEAR_INPUT, F32, F32, cc.CUDNN_DEFAULT_MATH, HID, HID,
                                HID, 1, rnn_drop, cc.CUDNN_RNN_PADDED_IO_ENABLED)
    wsize = cc.cudnnGetRNNWeightSpaceSize(h, rnnd)
    rw = buf(wsize // 4, np.float32, 0.01)
    rxd, ryd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
    for d_ in (rxd, ryd):
        cc.cudnnSetRNNDataDescriptor(d_, F32, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, HID, [T] * B, None)
    rhd = td((1, B, HID))
    inf = cc.CUDNN_FWD_MODE_INFERENCE
    rws_size, _ = cc.cudnnGetRNNTempSpaceSizes(h, rnnd, inf, rxd)
    rws_ = buf(max(rws_size, 1), np.uint8, 0)
    seq = buf(B, np.int32, T)
    rx, ry, rhx, rhy, rcx, rcy = buf(T * B * HID), buf(T * B * HID, fill=0.0), *(buf(B * HID, fill=0.0) for _ in range(4))
    calls["rnn_fwd"] = lambda: cc.cudnnRNNForward(h, rnnd, inf, seq, rxd, rx, ryd, ry, rhd, rhx, rhy, rhd, rcx, rcy,
                                                  wsize, rw, rws_size, rws_, 0, None)
    if leg:
        try:
            from cudnn_compat._backend.legacy_cudnn_rnn import RealRNN
            real = RealRNN(leg.h, "LSTM", 1, 1, HID, HID, T, [T] * B)
            lrx, lry = buf(T * B * HID), buf(T * B * HID, fill=0.0)
            lh = [buf(B * HID, fill=0.0) for _ in range(4)]
            legacy["rnn_fwd"] = lambda: real.forward(False, lrx, lry, *lh)
        except Exception as e:  # noqa: BLE001 - the comparison is optional
            print(f"legacy rnn_fwd unavailable: {type(e).__name__}: {e}", flush=True)

    out = {}
    for case in CASES + GAPS:
        if only and case not in only:
            continue
        fn = calls[case]
        try:
            fn()
            fn.engine = _engines_of(cc)
        except Exception as e:  # noqa: BLE001 - report the case, measure the others
            fn.setup_error = f"{type(e).__name__}: {e}"[:300]
        fn.legacy = legacy.get(case)
        out[case] = fn
    return out


def _engines_of(cc) -> str:
    plan = cc._core.call.last_plan()
    if plan is None:
        return ""
    rec = getattr(plan, "launch_mode", None)
    return plan.engine + (f"/{rec}" if rec else "")


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
    # per call, the queue drained every 1000 calls (a full queue blocks the launch)
    return {"mean_us": mean, "median_us": median_us(fn, calls, sync, warm=0), "thread_cpu_us": cpu}


def mixed(fns: dict, rounds: int, sync=None) -> dict:
    """The cases called in turn, one call of each per round (a program's pattern: every call
    site's code and data cold again by the time it comes back), against the same calls repeated
    (``measure``'s medians): median microseconds per call over ``rounds`` rounds, ours and, over
    the cases that have one, the legacy column's."""
    def per_call(group):
        def one_round():
            for f in group:
                f()
        return median_us(one_round, rounds, sync, warm=5, every=20) / len(group)
    ours = list(fns.values())
    out = {"cases": len(ours), "rounds": rounds, "ours_us": per_call(ours)}
    legacy = [f.legacy for f in ours if getattr(f, "legacy", None) is not None]
    if legacy:
        out["legacy_cases"] = len(legacy)
        out["legacy_us"] = per_call(legacy)
        out["ours_same_cases_us"] = per_call([f for f in ours if getattr(f, "legacy", None) is not None])
    return out


def profile(fn, calls: int, top: int = 22) -> str:
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
    ap.add_argument("--place", choices=("cpu", "gpu", "emu"), default="cpu")
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-calls", type=int, default=2000)
    ap.add_argument("--no-legacy", action="store_true")
    ap.add_argument("--root", help="import cudnn_compat and _backend from this tree")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    _setup_path(args.root)
    sync = None
    only = tuple(s for s in args.only.split(",") if s)
    out = {"place": args.place, "root": args.root or "", "label": args.label, "calls": args.calls,
           "target_us": TARGET_US, "cases": {}}
    if args.place == "gpu":
        import cupy
        sync = cupy.cuda.runtime.deviceSynchronize
        out["device"] = device_name()
        # the driver's own share of a one-launch call on this host (no call path goes below it), and the
        # host's Python speed: what a case's median means on this machine
        out["driver_launch_us"], out["host_calib_us"] = driver_launch_us(), host_calib_us()
        print(f"bare cuLaunchKernel on this host: {out['driver_launch_us']:.2f} us; py_calib "
              f"{out['host_calib_us']:.2f} us", flush=True)
    floor = None
    calls_made = {}  # the cases that ran: the ``mixed`` figure calls them in turn
    if args.place == "gpu" and not args.no_legacy:
        try:
            floor = out["ctypes_call_us"] = ctypes_floor(args.calls, sync)
            print(f"ctypes call (cudnnGetStream through the legacy column's path): {floor:.2f} us", flush=True)
        except Exception as e:  # noqa: BLE001 - no libcudnn: no legacy column either
            out["ctypes_call_error"] = f"{type(e).__name__}: {e}"[:300]
    for case, fn in make_calls(args.place, only).items():
        if getattr(fn, "setup_error", None):
            out["cases"][case] = {"error": fn.setup_error}
            print(f"{args.label:8s} {args.place} {case:16s} error: {fn.setup_error}", flush=True)
            continue
        try:
            r = measure(fn, args.calls, sync)
        except Exception as e:  # noqa: BLE001 - report and go on (an older tree may lack a case)
            out["cases"][case] = {"error": f"{type(e).__name__}: {e}"[:300]}
            print(f"{args.label:8s} {args.place} {case:16s} error: {e}", flush=True)
            continue
        r["engine"] = getattr(fn, "engine", "")
        gap = case in GAPS
        if not gap:
            calls_made[case] = fn
        if fn.legacy is not None and not args.no_legacy:
            try:
                r["legacy_median_us"] = measure(fn.legacy, args.calls, sync)["median_us"]
            except Exception as e:  # noqa: BLE001
                r["legacy_error"] = f"{type(e).__name__}: {e}"[:300]
        if floor is not None and "legacy_median_us" in r:
            r["ctypes_call_us"] = floor
        if gap:
            out.setdefault("gaps", {})[case] = r
        else:
            out["cases"][case] = r
        leg = r.get("legacy_median_us")
        print(f"{args.label:8s} {args.place} {case:16s} [{r['engine']:14s}] median {r['median_us']:6.1f}  "
              f"mean {r['mean_us']:6.1f}  thread-cpu {r['thread_cpu_us']:6.1f} us"
              + (f"   legacy via ctypes {leg:5.1f} us (ctypes call {floor:4.1f})" if leg is not None
                 and floor is not None else (f"   legacy via ctypes {leg:5.1f} us" if leg is not None else ""))
              + ("   (a known gap: GAPS)" if gap else "" if r["median_us"] <= TARGET_US else "   (over target)"),
              flush=True)
        if args.profile:
            text = profile(fn, args.profile_calls)
            r["profile"] = text
            print(text, flush=True)
    if calls_made:
        out["mixed"] = mixed(calls_made, max(20, args.calls // 20), sync)
        m = out["mixed"]
        iso = [out["cases"][c]["median_us"] for c in calls_made]
        m["ours_isolated_us"] = sum(iso) / len(iso)  # the mean of the repeated calls' medians
        liso = [out["cases"][c]["legacy_median_us"] for c in calls_made if "legacy_median_us" in out["cases"][c]]
        if liso and m.get("legacy_us") is not None:
            m["legacy_isolated_us"] = sum(liso) / len(liso)
        print(f"mixed: the {m['cases']} cases called in turn (as a program calls different families): ours "
              f"{m['ours_us']:.1f} us per call against {m['ours_isolated_us']:.1f} us for the same calls repeated"
              + (f"; on the {m['legacy_cases']} cases with a legacy column ours {m['ours_same_cases_us']:.1f}, legacy "
                 f"via ctypes {m['legacy_us']:.1f} against {m['legacy_isolated_us']:.1f} us"
                 if m.get("legacy_isolated_us") is not None else ""), flush=True)
    medians = [c["median_us"] for c in out["cases"].values() if "median_us" in c]
    out["max_median_us"] = max(medians) if medians else None
    out["over_target"] = sorted(k for k, c in out["cases"].items() if c.get("median_us", 1e9) > TARGET_US)
    print(f"max median {out['max_median_us']} us; over {TARGET_US} us: {out['over_target'] or 'none'}")
    path = args.json
    if path is None and args.place == "gpu" and not args.root:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(here, "results", f"host_overhead_{out['device'].replace(' ', '_')}.json")
    if path:
        write_json_file(path, out)
        print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
