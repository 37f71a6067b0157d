"""A handle with the default stream runs every call on CuPy's current stream, whichever engine
runs it (docs/conventions.md "Handles and descriptors"): a convolution (the cudnn engine) and an
activation (the cupy engine's launch record) made under ``with stream:`` stay in order on that
stream, and a capture the program begins on it takes both in.  Before, the cudnn engine ran such
calls on the legacy default stream while the cupy engine used the current one: unordered on a
non-blocking stream, and a captured step missed its convolutions."""
import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

pytestmark = pytest.mark.gpu

N, C, K, H, W = 2, 8, 8, 8, 8


def _problem(h, xp, x, w):
    xd, yd = tdesc((N, C, H, W)), tdesc((N, K, H, W))
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, K, C, 3, 3)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    cc.cudnnSetConvolutionMathType(cd, cc.CUDNN_FMA_MATH)  # no TF32: the numbers compare to float64 closely
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    wsn = cc.cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algo)
    ws = xp.empty(max(wsn, 1), np.uint8)
    y, z = xp.zeros((N, K, H, W), np.float32), xp.zeros((N, K, H, W), np.float32)

    def conv():
        cc.cudnnConvolutionForward(h, 1.0, xd, x, wd, w, cd, algo, ws, wsn, 0.0, yd, y)

    def step():
        conv()
        cc.cudnnActivationForward(h, ad, 1.0, yd, y, 0.0, yd, z)
    step.conv = conv
    return step, y, z


def test_default_stream_calls_follow_the_current_stream_into_a_capture():
    cupy = pytest.importorskip("cupy")
    from cudnn_compat._core.call import last_plan
    rng = np.random.default_rng(7)
    x1, x2 = (rng.uniform(-1, 1, (N, C, H, W)).astype(np.float32) for _ in range(2))
    w_host = rng.uniform(-1, 1, (K, C, 3, 3)).astype(np.float32)
    h = cc.cudnnCreate("gpu")
    x, w = cupy.asarray(x1), cupy.asarray(w_host)
    step, y, z = _problem(h, cupy, x, w)
    step.conv()
    if last_plan().engine != "cudnn":
        pytest.skip(f"the convolution ran on {last_plan().engine}, not the native engine")
    cupy.cuda.Device().synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        for _ in range(3):  # plans, launch records, variant packs and their graphs for this stream
            step()
        s.synchronize()
        s.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
        try:
            step()
        finally:
            graph = s.end_capture()
        s.synchronize()
    assert last_plan().engine == "cupy"  # the activation: a launch record
    x[...] = cupy.asarray(x2)  # new input in the same buffer: a replay must convolve it
    y[...] = np.nan
    z[...] = np.nan
    cupy.cuda.Device().synchronize()
    graph.launch(s)
    s.synchronize()
    hc = cc.cudnnCreate("cpu")  # the reference engine's numbers for x2
    ref_step, ref_y, ref_z = _problem(hc, np, x2.copy(), w_host)
    ref_step()
    np.testing.assert_allclose(y.get(), ref_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(z.get(), ref_z, rtol=1e-4, atol=1e-4)

