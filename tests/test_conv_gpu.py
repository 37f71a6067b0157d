"""The convolution family on a GPU handle (CuPy arrays, whichever engine the heuristics pick),
against the direct-loop formulas of conv_util; skipped without a CUDA GPU."""
import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc
from conv_util import (CONV, CROSS, DOUBLE, FLOAT, HALF, NCHW, NHWC, cdesc, desc_for, fdesc, layout_strides,
                       out_shape, ref_bwd_data, ref_bwd_filter, ref_conv)

pytestmark = pytest.mark.gpu
XS, WS, PAD, STRIDE, DIL, G = (2, 4, 7, 6), (6, 2, 3, 3), (1, 1), (1, 2), (1, 1), 2
YS = out_shape(XS, WS, PAD, STRIDE, DIL)
REF = dict(pad=PAD, stride=STRIDE, dil=DIL, groups=G)


@pytest.fixture
def gpu():
    h = cc.create("gpu")
    yield h
    cc.destroy(h)


def dev(values, layout, dtype):
    """A CuPy buffer holding logical ``values`` in ``layout`` (NCHW or NHWC packed)."""
    import cupy
    if layout == "NHWC":
        values = np.moveaxis(values, 1, -1)
    return cupy.asarray(np.ascontiguousarray(values, dtype))


def host(buf, layout):
    a = buf.get().astype(np.float64)
    return np.moveaxis(a, -1, 1) if layout == "NHWC" else a


@pytest.mark.parametrize("layout, dtype, tol", [("NCHW", DOUBLE, 1e-12), ("NCHW", FLOAT, 1e-4), ("NHWC", FLOAT, 1e-4),
                                                ("NCHW", HALF, 1e-2)])
@pytest.mark.parametrize("mode", [CROSS, CONV])
def test_three_directions(gpu, rng, layout, dtype, tol, mode):
    st = {DOUBLE: np.float64, FLOAT: np.float32, HALF: np.float16}[dtype]
    x, w, dy = (rng.standard_normal(s).astype(st).astype(np.float64) for s in (XS, WS, YS))
    wfmt = NHWC if layout == "NHWC" else NCHW
    compute = DOUBLE if dtype == DOUBLE else FLOAT
    xd, yd, wd, cd = desc_for(XS, dtype, layout), desc_for(YS, dtype, layout), fdesc(WS, dtype, wfmt), \
        cdesc(PAD, STRIDE, DIL, mode, compute, G)
    xb, wb, dyb = dev(x, layout, st), dev(w, layout, st), dev(dy, layout, st)
    yb, dxb, dwb = dev(np.full(YS, np.nan), layout, st), dev(np.zeros(XS), layout, st), dev(np.zeros(WS), layout, st)
    data_algo = 1 if layout == "NHWC" else 0
    cc.convolutionForward(gpu, 1.0, xd, xb, wd, wb, cd, 0, None, 0, 0.0, yd, yb)
    cc.convolutionBackwardData(gpu, 1.0, wd, wb, yd, dyb, cd, data_algo, None, 0, 0.0, xd, dxb)
    cc.convolutionBackwardFilter(gpu, 1.0, xd, xb, yd, dyb, cd, data_algo, None, 0, 0.0, wd, dwb)
    for got, want in ((host(yb, layout), ref_conv(x, w, PAD, STRIDE, DIL, G, mode)),
                      (host(dxb, layout), ref_bwd_data(dy, w, XS, PAD, STRIDE, DIL, G, mode)),
                      (host(dwb, layout), ref_bwd_filter(x, dy, WS, PAD, STRIDE, DIL, G, mode))):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_bias_activation_and_backward_bias(gpu, rng):
    x, w, z = rng.standard_normal(XS), rng.standard_normal(WS), rng.standard_normal(YS)
    bias = rng.standard_normal(WS[0])
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    yd = tdesc(YS, DOUBLE)
    yb = dev(z, "NCHW", np.float64)  # z aliases y
    cc.cudnnConvolutionBiasActivationForward(gpu, 0.5, tdesc(XS, DOUBLE), dev(x, "NCHW", np.float64), fdesc(WS, DOUBLE),
                                             dev(w, "NCHW", np.float64), cdesc(PAD, STRIDE, DIL, CROSS, DOUBLE, G), 0,
                                             None, 0, 2.0, yd, yb, tdesc((1, WS[0], 1, 1), DOUBLE),
                                             dev(bias, "NCHW", np.float64), ad, yd, yb)
    want = np.maximum(0.5 * ref_conv(x, w, PAD, STRIDE, DIL, G) + 2.0 * z + bias.reshape(1, -1, 1, 1), 0.0)
    np.testing.assert_allclose(host(yb, "NCHW"), want, rtol=1e-12, atol=1e-12)
    db = dev(np.full((1, WS[0], 1, 1), np.nan), "NCHW", np.float64)
    cc.convolutionBackwardBias(gpu, 1.0, tdesc(YS, DOUBLE), dev(z, "NCHW", np.float64), 0.0,
                               tdesc((1, WS[0], 1, 1), DOUBLE), db)
    np.testing.assert_allclose(host(db, "NCHW").reshape(-1), z.sum(axis=(0, 2, 3)), rtol=1e-12)


@pytest.mark.parametrize("dtype, st, tol", [(FLOAT, np.float32, 1e-4), (HALF, np.float16, 2e-2)])
def test_bias_activation_repeated_with_other_scalars_on_the_same_buffers(gpu, rng, dtype, st, tol):
    """The steady path: the same descriptors and buffers called again and again (a prepared call, a
    CUDA graph per set of alpha1/alpha2 values), with the scalars changing and new input values
    written between calls: each call computes its own formula, never a replay of another's."""
    import cupy
    x, w, z = (rng.standard_normal(s).astype(st).astype(np.float64) for s in (XS, WS, YS))
    bias = rng.standard_normal(WS[0]).astype(st).astype(np.float64)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    xd, yd, wd = tdesc(XS, dtype), tdesc(YS, dtype), fdesc(WS, dtype)
    bd, cd = tdesc((1, WS[0], 1, 1), dtype), cdesc(PAD, STRIDE, DIL, CROSS, FLOAT, G)
    xb, wb, zb, bb = dev(x, "NCHW", st), dev(w, "NCHW", st), dev(z, "NCHW", st), dev(bias, "NCHW", st)
    yb = dev(np.zeros(YS), "NCHW", st)
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    for step, (a1, a2) in enumerate([(1.0, 1.0)] * 3 + [(0.5, -2.0)] * 3 + [(1.0, 1.0), (0.5, -2.0)] * 2):
        x = rng.standard_normal(XS).astype(st).astype(np.float64)
        xb[...] = cupy.asarray(x.astype(st))
        cc.cudnnConvolutionBiasActivationForward(gpu, a1, xd, xb, wd, wb, cd, algo, None, 0, a2, yd, zb, bd, bb, ad,
                                                 yd, yb)
        want = np.maximum(a1 * ref_conv(x, w, PAD, STRIDE, DIL, G) + a2 * z + bias.reshape(1, -1, 1, 1), 0.0)
        np.testing.assert_allclose(host(yb, "NCHW"), want, rtol=tol, atol=tol * 10, err_msg=f"step {step} ({a1}, {a2})")


def test_algorithm_queries(gpu, rng):
    import cupy
    cd = cdesc(PAD, STRIDE, DIL, groups=G, math=cc.CUDNN_TENSOR_OP_MATH)
    xd, wd, yd = tdesc(XS), fdesc(WS), tdesc(YS)
    tc = int(cupy.cuda.Device().compute_capability) >= 70
    assert cc.getConvolutionForwardAlgorithmMaxCount(gpu) == 8 + 2 * tc
    perf = cc.getConvolutionForwardAlgorithm_v7(gpu, xd, wd, cd, yd, 20)
    assert len(perf) == 8 + 2 * tc
    for p in perf:
        if p.status == cc.CUDNN_STATUS_SUCCESS:
            assert p.memory == cc.getConvolutionForwardWorkspaceSize(gpu, xd, wd, cd, yd, p.algo) or \
                p.mathType != cc.CUDNN_TENSOR_OP_MATH  # the size query uses convDesc's math type
    x, w = rng.standard_normal(XS).astype(np.float32), rng.standard_normal(WS).astype(np.float32)
    y = cupy.full(YS, np.nan, cupy.float32)
    ws = cupy.zeros(64 << 20, cupy.uint8)
    found = cc.findConvolutionForwardAlgorithmEx(gpu, xd, cupy.asarray(x), wd, cupy.asarray(w), cd, yd, y, 20,
                                                 ws.data.ptr, ws.nbytes)
    good = [p for p in found if p.status == cc.CUDNN_STATUS_SUCCESS]
    assert good and all(p.time > 0 for p in good) and [p.time for p in good] == sorted(p.time for p in good)
    np.testing.assert_allclose(y.get(), ref_conv(x, w, PAD, STRIDE, DIL, G), rtol=1e-3, atol=1e-3)
    for dr_find, args in ((cc.findConvolutionBackwardDataAlgorithm, (wd, yd, cd, xd)),
                          (cc.findConvolutionBackwardFilterAlgorithm, (xd, yd, cd, wd))):
        assert any(p.status == cc.CUDNN_STATUS_SUCCESS for p in dr_find(gpu, *args, 20))


@pytest.mark.parametrize("math, tol", [(cc.CUDNN_DEFAULT_MATH, 2e-3), (cc.CUDNN_FMA_MATH, 1e-5)])
@pytest.mark.parametrize("algo_name", ["IMPLICIT_PRECOMP_GEMM", "GEMM", "IMPLICIT_GEMM"])
def test_dilated_nchw_forward_every_workspace_algorithm(gpu, rng, algo_name, math, tol):
    """The dilated fp32 NCHW forward through the algorithms libcudnn 9 runs on it (algos.py: 002 asked
    dilation 1 of PRECOMP and GEMM), with the workspace each one asks for, against the direct loop:
    the configs these algorithms bring (TF32 Tensor Core ones under DEFAULT_MATH) compute the dilated
    convolution."""
    import cupy
    xs, ws, pad, dil = (4, 32, 14, 13), (32, 32, 3, 3), (2, 2), (2, 2)
    ys = out_shape(xs, ws, pad, (1, 1), dil)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    xd, wd, yd = desc_for(xs, FLOAT, "NCHW"), fdesc(ws, FLOAT, NCHW), desc_for(ys, FLOAT, "NCHW")
    cd = cdesc(pad, (1, 1), dil, CROSS, FLOAT, 1, math)
    algo = cc.ENUMS["cudnnConvolutionFwdAlgo_t"]["CUDNN_CONVOLUTION_FWD_ALGO_" + algo_name]
    n = cc.cudnnGetConvolutionForwardWorkspaceSize(gpu, xd, wd, cd, yd, algo)
    ws_buf = cupy.zeros(max(n, 1), cupy.uint8)
    yb = cupy.full(ys, np.nan, np.float32)
    cc.cudnnConvolutionForward(gpu, 1.0, xd, cupy.asarray(x), wd, cupy.asarray(w), cd, algo, ws_buf, n, 0.0, yd, yb)
    want = ref_conv(x.astype(np.float64), w.astype(np.float64), pad, (1, 1), dil)
    np.testing.assert_allclose(yb.get(), want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("replay", ["kernels", "graph"])
@pytest.mark.parametrize("layout, dtype, st, tol", [("NHWC", HALF, np.float16, 2e-2), ("NCHW", FLOAT, np.float32, 1e-4)])
def test_repeated_calls_on_the_legacy_stream_replay_what_was_captured(gpu, rng, monkeypatch, replay, layout, dtype,
                                                                       st, tol):
    """The three directions called again and again on the same buffers on the legacy default stream,
    new input values written between calls, beta 0 and then 1 (the prior output read): from the
    second call on, a call replays what that call captured (CUDNN_COMPAT_GRAPH_REPLAY: the graph's
    kernel launches, or the graph), and every call computes its own formula."""
    import cupy
    from cudnn_compat._backend.engines import graphs as graphs_mod
    from cudnn_compat._backend.engines.cudnn_engine.plan import STATS
    monkeypatch.setenv("CUDNN_COMPAT_GRAPH_REPLAY", replay)
    xs, ws, pad, stride = (2, 8, 9, 10), (16, 8, 3, 3), (1, 1), (1, 1)
    ys = out_shape(xs, ws, pad, stride, (1, 1))
    wfmt = NHWC if layout == "NHWC" else NCHW
    xd, yd, wd = desc_for(xs, dtype, layout), desc_for(ys, dtype, layout), fdesc(ws, dtype, wfmt)
    cd = cdesc(pad, stride, (1, 1), CROSS, FLOAT, 1)
    bufs = [dev(np.zeros(s), layout, st) for s in (xs, ws, ys, ys, xs, ws)]
    xb, wb, dyb, yb, dxb, dwb = bufs
    algo = 1 if layout == "NHWC" else 0
    kernels0, launches0 = len(graphs_mod.graphs()._kernels), STATS["graph_launches"]
    prior = [np.zeros(ys), np.zeros(xs), np.zeros(ws)]
    for step in range(6):
        x, w, dy = (rng.standard_normal(s).astype(st).astype(np.float64) for s in (xs, ws, ys))
        for b, v in ((xb, x), (wb, w), (dyb, dy)):
            b[...] = dev(v, layout, st)
        beta = 0.0 if step < 4 else 1.0
        cc.convolutionForward(gpu, 1.0, xd, xb, wd, wb, cd, algo, None, 0, beta, yd, yb)
        cc.convolutionBackwardData(gpu, 1.0, wd, wb, yd, dyb, cd, algo, None, 0, beta, xd, dxb)
        cc.convolutionBackwardFilter(gpu, 1.0, xd, xb, yd, dyb, cd, algo, None, 0, beta, wd, dwb)
        wants = [ref_conv(x, w, pad, stride, (1, 1), 1), ref_bwd_data(dy, w, xs, pad, stride, (1, 1), 1),
                 ref_bwd_filter(x, dy, ws, pad, stride, (1, 1), 1)]
        for i, (got, want) in enumerate(zip((host(yb, layout), host(dxb, layout), host(dwb, layout)), wants)):
            want = want + beta * prior[i]
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=f"step {step} {i}")
            prior[i] = got
    cupy.cuda.runtime.deviceSynchronize()
    assert STATS["graph_launches"] - launches0 >= 3 * 4  # steps 1-3 and 5 at least replay (4 is a new beta)
    read = len(graphs_mod.graphs()._kernels) - kernels0
    assert read > 0 if replay == "kernels" else read == 0
