"""Every engine config the cudnn engine's autotune times computes the same numbers (issue 24 item 2).

The exhaustive autotune times every config cuDNN's heuristics list and knob variants of the first
engines: configs no heuristic ever recommended.  cuDNN checks a config when its plan finalizes; this
checks what the finalized plans compute.  ``time_plans`` is wrapped so that, before timing a batch,
every plan of the batch runs once on the same random inputs (each from the same snapshot of every
scratch buffer) and its results are compared with the first plan's (the heuristics' first choice);
the legacy call's own result is checked against the direct-loop formula of conv_util as well.
A config that finalizes and computes other numbers fails here, naming the graph and its place in
the batch."""
import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend.engines.cudnn_engine import autotune as tune
from cudnn_compat._backend.engines.cudnn_engine import lib as nlib
from conv_util import CROSS, FLOAT, HALF, NCHW, NHWC, cdesc, desc_for, fdesc, out_shape, ref_bwd_data, \
    ref_bwd_filter, ref_conv
from test_conv_gpu import dev, host

pytestmark = pytest.mark.gpu
FLOATS = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
# (direction, data type, layout, math type, x shape, w shape, pad, stride, tolerance of the class)
CASES = [
    ("fwd", HALF, "NHWC", cc.CUDNN_TENSOR_OP_MATH, (4, 32, 14, 14), (32, 32, 3, 3), (1, 1), (1, 1), 0.05),
    ("bwd_data", FLOAT, "NCHW", cc.CUDNN_FMA_MATH, (4, 16, 13, 13), (32, 16, 3, 3), (1, 1), (2, 2), 1e-3),
    ("bwd_filter", FLOAT, "NCHW", cc.CUDNN_DEFAULT_MATH, (4, 24, 11, 11), (16, 24, 3, 3), (1, 1), (1, 1), 0.02),
]


@pytest.fixture
def gpu():
    h = cc.create("gpu")
    yield h
    cc.destroy(h)


def _validating(real, seen: list):
    """``time_plans`` that first runs each plan once on the same random inputs and records, per plan
    after the first, (graph, position, error relative to the largest magnitude, NaN pattern differs)."""
    def time_plans(spec, plans, device):
        import cupy
        with cupy.cuda.Device(device):
            handle = nlib.handle_for(device, 0)
            keep, uids, ptrs = tune.scratch_bindings(spec)
            bufs = iter(keep[1:])
            typed = []
            for uid, _src, is_scalar in spec.bind:
                if is_scalar:
                    continue
                buf = next(bufs)
                dt = FLOATS.get(spec.tensors[uid].dtype)
                if dt is not None:
                    n = (buf.size - 16) // np.dtype(dt).itemsize
                    typed.append(buf[:n * np.dtype(dt).itemsize].view(dt))
            rng = cupy.random.default_rng(7)
            for v in typed:
                v[...] = rng.uniform(-1, 1, v.size).astype(v.dtype)
            snap = [v.copy() for v in typed]
            ws = cupy.zeros(max([w for _, w in plans] + [1]), cupy.uint8)
            vp = nlib.Descriptor("VARIANT_PACK")
            try:
                vp.set("VARIANT_PACK_UNIQUE_IDS", "INT64", uids)
                vp.set("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", ptrs)
                vp.set("VARIANT_PACK_WORKSPACE", "VOID_PTR", ws.data.ptr)
                vp.finalize()
                ref = None
                for i, (plan, _w) in enumerate(plans):
                    for v, s in zip(typed, snap):
                        v[...] = s
                    if nlib.load().cudnnBackendExecute(handle, plan.ptr, vp.ptr):
                        continue
                    cupy.cuda.runtime.deviceSynchronize()
                    out = [v.astype(cupy.float64) for v in typed]
                    if ref is None:
                        ref = out
                        continue
                    scale = max(float(cupy.abs(r).max()) for r in ref) or 1.0
                    err = max(float(cupy.abs(o - r).max()) for o, r in zip(out, ref))
                    nan = any(bool((cupy.isnan(o) != cupy.isnan(r)).any()) for o, r in zip(out, ref))
                    seen.append((spec.describe(), i, err / scale, nan))
            finally:
                vp.destroy()
                del keep, ws
        return real(spec, plans, device)
    return time_plans


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_timed_config_computes_the_same_numbers(gpu, rng, monkeypatch, case):
    import cupy
    direction, dtype, layout, math, xs, ws_, pad, stride, tol = case
    seen: list = []
    monkeypatch.setattr(tune, "time_plans", _validating(tune.time_plans, seen))
    monkeypatch.setattr(tune, "TIMES", {})
    monkeypatch.setattr(tune, "SIZES", {})
    monkeypatch.setattr(tune, "_MEMO", {})
    monkeypatch.delenv("CUDNN_COMPAT_PLAN_CACHE_FILE", raising=False)
    monkeypatch.delenv("CUDNN_COMPAT_CUDNN_AUTOTUNE", raising=False)
    st = {HALF: np.float16, FLOAT: np.float32}[dtype]
    ys = out_shape(xs, ws_, pad, stride, (1, 1))
    x, w, dy = (rng.uniform(-1, 1, s).astype(st).astype(np.float64) for s in (xs, ws_, ys))
    xd, yd, wd = desc_for(xs, dtype, layout), desc_for(ys, dtype, layout), fdesc(ws_, dtype, NHWC if layout == "NHWC" else NCHW)
    cd = cdesc(pad, stride, (1, 1), CROSS, FLOAT, 1, math)
    if direction == "fwd":
        algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
        size = cc.cudnnGetConvolutionForwardWorkspaceSize(gpu, xd, wd, cd, yd, algo)
        out, want = dev(np.zeros(ys), layout, st), ref_conv(x, w, pad, stride, (1, 1))
        cc.convolutionForward(gpu, 1.0, xd, dev(x, layout, st), wd, dev(w, layout, st), cd, algo,
                              cupy.empty(max(size, 1), cupy.uint8), size, 0.0, yd, out)
    elif direction == "bwd_data":
        algo = cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_1
        size = cc.cudnnGetConvolutionBackwardDataWorkspaceSize(gpu, wd, yd, cd, xd, algo)
        out, want = dev(np.zeros(xs), layout, st), ref_bwd_data(dy, w, xs, pad, stride, (1, 1))
        cc.convolutionBackwardData(gpu, 1.0, wd, dev(w, layout, st), yd, dev(dy, layout, st), cd, algo,
                                   cupy.empty(max(size, 1), cupy.uint8), size, 0.0, xd, out)
    else:
        algo = cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1
        size = cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(gpu, xd, yd, cd, wd, algo)
        out, want = dev(np.zeros(ws_), layout, st), ref_bwd_filter(x, dy, ws_, pad, stride, (1, 1))
        cc.convolutionBackwardFilter(gpu, 1.0, xd, dev(x, layout, st), yd, dev(dy, layout, st), cd, algo,
                                     cupy.empty(max(size, 1), cupy.uint8), size, 0.0, wd, out)
    assert cc._core.call.last_plan().engine == "cudnn"
    got = host(out, layout)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    assert len(seen) >= 5, f"only {len(seen)} configs were compared"  # the autotune timed a real list
    bad = [s for s in seen if s[3] or s[2] > tol]
    assert not bad, f"configs whose results differ from the heuristics' first choice (graph, place, error): {bad}"
