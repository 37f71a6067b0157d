"""Find on a GPU handle (issue 24 item 2): the results are sorted by measured time with real
values (time, memory = the workspace-size query, determinism and math type of the plan that ran),
the native engine timed the configs the backend offers once per graph, and the call made with the
winner reuses the plan and config Find chose (nothing timed again).  Skipped without a CUDA GPU."""
import numpy as np
import pytest

import cudnn_compat as cc
from conv_util import HALF, NHWC, cdesc, desc_for, fdesc, out_shape, ref_bwd_filter, ref_conv

pytestmark = pytest.mark.gpu
XS, WS, PAD, STRIDE, DIL = (8, 32, 14, 14), (32, 32, 3, 3), (1, 1), (1, 1), (1, 1)
YS = out_shape(XS, WS, PAD, STRIDE, DIL)


def dev(values):
    import cupy
    return cupy.asarray(np.ascontiguousarray(np.moveaxis(values, 1, -1), np.float16))


def host(buf):
    return np.moveaxis(buf.get().astype(np.float64), -1, 1)


@pytest.mark.parametrize("direction", ["fwd", "bwd_filter"])
def test_find_is_sorted_honest_and_the_call_reuses_the_tuned_winner(rng, direction):
    import cupy
    from cudnn_compat._backend.engines.cudnn_engine import autotune
    h = cc.create("gpu")
    cc.plan_cache_clear()
    xd, yd, wd = desc_for(XS, HALF, "NHWC"), desc_for(YS, HALF, "NHWC"), fdesc(WS, HALF, NHWC)
    cd = cdesc(PAD, STRIDE, DIL, math=cc.CUDNN_TENSOR_OP_MATH)
    x, w, dy = (rng.standard_normal(s).astype(np.float16).astype(np.float64) * 0.5 for s in (XS, WS, YS))
    xb, wb, yb = dev(x), dev(w), dev(dy)
    ws = cupy.zeros(64 << 20, cupy.uint8)
    runs = autotune.STATS["plans_timed"]
    if direction == "fwd":
        args, out = (xd, xb, wd, wb, cd, yd, yb), yb
        perf = cc.findConvolutionForwardAlgorithmEx(h, *args, 20, ws.data.ptr, ws.nbytes)
        size = lambda p: cc.getConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, p.algo)  # noqa: E731
    else:
        out = wb
        perf = cc.findConvolutionBackwardFilterAlgorithmEx(h, xd, xb, yd, yb, cd, wd, wb, 20, ws.data.ptr, ws.nbytes)
        size = lambda p: cc.getConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd, p.algo)  # noqa: E731
    assert autotune.STATS["plans_timed"] > runs  # the native configs were timed
    good = [p for p in perf if p.status == cc.CUDNN_STATUS_SUCCESS]
    assert good and perf[:len(good)] == good  # successes first
    times = [p.time for p in good]
    assert times == sorted(times) and all(0 < t < 1e3 for t in times)
    for p in good:
        cc.cudnnSetConvolutionMathType(cd, p.mathType)
        assert p.memory == size(p), p
        assert p.determinism in (cc.CUDNN_DETERMINISTIC, cc.CUDNN_NON_DETERMINISTIC)
        assert p.mathType in (cc.CUDNN_TENSOR_OP_MATH, cc.CUDNN_DEFAULT_MATH)
    best = good[0]
    cc.cudnnSetConvolutionMathType(cd, best.mathType)
    before = dict(autotune.STATS)
    out[...] = 0
    if direction == "fwd":
        cc.convolutionForward(h, 1.0, xd, xb, wd, wb, cd, best.algo, ws, ws.nbytes, 0.0, yd, yb)
        want = ref_conv(x, w, PAD, STRIDE, DIL)
    else:
        cc.convolutionBackwardFilter(h, 1.0, xd, xb, yd, yb, cd, best.algo, ws, ws.nbytes, 0.0, wd, wb)
        want = ref_bwd_filter(x, dy, WS, PAD, STRIDE, DIL)
    assert autotune.STATS["timing_runs"] == before["timing_runs"]  # the plan Find built and tuned, reused
    plan = cc._core.call.last_plan()
    if plan.engine == "cudnn" and plan.autotune:
        ranked = [t for _, t in plan.autotune]
        assert plan.autotune[0][0] == str(plan.config) and ranked == sorted(ranked)
        assert (best.determinism == cc.CUDNN_DETERMINISTIC) == ("DETERMINISTIC" in plan.config.notes)
    np.testing.assert_allclose(host(out), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    cc.destroy(h)
