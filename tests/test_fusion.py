"""fuse(): legacy calls deferred and run as few fused graphs (docs/tools.md "Fusion across calls"), against
formulas written here and against the same calls unfused; dataflow hazards, flush points, errors
at the call, visible intermediates; the split into graphs the engines take (a fake conv+pointwise
engine on the CPU); on the GPU the same results with fewer kernels."""
import contextlib

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import heuristics
from cudnn_compat._backend.engines.base import REGISTRY
from cudnn_compat._backend.engines.reference import ReferenceEngine
from cudnn_compat._core import call as _call, registry as _registry
from cudnn_compat.tools import fuse as fusion
from conftest import tdesc
from conv_util import ref_conv

F32, F16, F64 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_HALF, cc.CUDNN_DATA_DOUBLE
NP = {F32: np.float32, F16: np.float16, F64: np.float64}
ALGO = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM


def relu(v):
    return np.maximum(v, 0.0)


def maxpool2(v):
    n, c, h, w = v.shape
    return v.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


class Block:
    """Descriptors and buffers of a ResNet basic block and of conv+bias+relu+pool, NCHW, on the CPU
    (``xp`` NumPy) or the GPU (``xp`` CuPy)."""

    def __init__(self, rng, dtype=F32, n=2, c=4, hw=6, fmt=cc.CUDNN_TENSOR_NCHW, xp=np):
        self.xp, self.dtype, self.shape = xp, dtype, (n, c, hw, hw)
        st = NP[dtype]
        self.xd, self.bd = tdesc(self.shape, dtype, fmt=fmt), tdesc((1, c, 1, 1), dtype)
        self.pd_out = tdesc((n, c, hw // 2, hw // 2), dtype, fmt=fmt)
        self.wd = cc.cudnnCreateFilterDescriptor()
        cc.cudnnSetFilter4dDescriptor(self.wd, dtype, fmt, c, c, 3, 3)
        self.cd = cc.cudnnCreateConvolutionDescriptor()
        cc.cudnnSetConvolution2dDescriptor(self.cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION,
                                           F64 if dtype == F64 else F32)
        if dtype == F16:
            cc.cudnnSetConvolutionMathType(self.cd, cc.CUDNN_TENSOR_OP_MATH)
        self.ad = cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetActivationDescriptor(self.ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
        self.od = cc.cudnnCreateOpTensorDescriptor()
        cc.cudnnSetOpTensorDescriptor(self.od, cc.CUDNN_OP_TENSOR_ADD, F64 if dtype == F64 else F32,
                                      cc.CUDNN_NOT_PROPAGATE_NAN)
        self.pool = cc.cudnnCreatePoolingDescriptor()
        cc.cudnnSetPooling2dDescriptor(self.pool, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
        self.nhwc = fmt == cc.CUDNN_TENSOR_NHWC
        # logical (N, C, H, W) values, small enough for float16
        self.x = rng.uniform(-1, 1, self.shape).astype(st).astype(np.float64)
        self.w1 = (rng.uniform(-1, 1, (c, c, 3, 3)) / 6).astype(st).astype(np.float64)
        self.w2 = (rng.uniform(-1, 1, (c, c, 3, 3)) / 6).astype(st).astype(np.float64)
        self.b1 = rng.uniform(-0.5, 0.5, c).astype(st).astype(np.float64)
        self.b2 = rng.uniform(-0.5, 0.5, c).astype(st).astype(np.float64)
        self.dev = {k: self.put(getattr(self, k), k.startswith("w") or k.startswith("b"))
                    for k in ("x", "w1", "w2", "b1", "b2")}

    def put(self, v, flat_as_is=False):
        """Memory of a logical value: NCHW order, or NHWC (KRSC for filters) with ``fmt`` NHWC."""
        if self.nhwc and v.ndim == 4:
            v = v.transpose(0, 2, 3, 1)
        return self.xp.asarray(np.ascontiguousarray(v).astype(NP[self.dtype]).reshape(-1))

    def get(self, buf, shape=None):
        shape = shape or self.shape
        h = buf.get() if hasattr(buf, "get") and not isinstance(buf, np.ndarray) else buf
        h = np.asarray(h, np.float64)
        if self.nhwc:
            n, c, hh, ww = shape
            return h.reshape(n, hh, ww, c).transpose(0, 3, 1, 2)
        return h.reshape(shape)

    def empty(self, shape=None):
        return self.xp.full(int(np.prod(shape or self.shape)), np.nan, NP[self.dtype])

    # -- legacy-call sequences ------------------------------------------------------------
    def workspace(self, h):
        """(buffer, size) the convolution's plan needs on ``h`` (none on the CPU)."""
        ws = getattr(self, "_ws", None)
        if ws is None:
            size = cc.cudnnGetConvolutionForwardWorkspaceSize(h, self.xd, self.wd, self.cd, self.xd, ALGO)
            ws = self._ws = (self.xp.empty(size, np.uint8) if size else None, size)
        return ws

    def conv(self, h, x, w, y):
        ws, size = self.workspace(h)
        cc.cudnnConvolutionForward(h, 1.0, self.xd, x, self.wd, w, self.cd, ALGO, ws, size, 0.0, self.xd, y)

    def conv_bias_relu(self, h, x, w, b, y):
        d = self.dev
        self.conv(h, x, d[w], y)
        cc.cudnnAddTensor(h, 1.0, self.bd, d[b], 1.0, self.xd, y)
        cc.cudnnActivationForward(h, self.ad, 1.0, self.xd, y, 0.0, self.xd, y)

    def basic_block(self, h, y1, y2):
        """conv, bias, relu, conv, bias, add residual (OpTensor), relu."""
        d = self.dev
        self.conv_bias_relu(h, d["x"], "w1", "b1", y1)
        self.conv(h, y1, d["w2"], y2)
        cc.cudnnAddTensor(h, 1.0, self.bd, d["b2"], 1.0, self.xd, y2)
        cc.cudnnOpTensor(h, self.od, 1.0, self.xd, y2, 1.0, self.xd, d["x"], 0.0, self.xd, y2)
        cc.cudnnActivationForward(h, self.ad, 1.0, self.xd, y2, 0.0, self.xd, y2)

    def pool_block(self, h, y, p):
        self.conv_bias_relu(h, self.dev["x"], "w1", "b1", y)
        cc.cudnnPoolingForward(h, self.pool, 1.0, self.xd, y, 0.0, self.pd_out, p)

    # -- formulas ---------------------------------------------------------------------------
    def f_layer(self, x, w, b):
        return relu(ref_conv(x, w, (1, 1), (1, 1), (1, 1)) + b.reshape(1, -1, 1, 1))

    def f_block(self):
        r1 = self.f_layer(self.x, self.w1, self.b1)
        return r1, relu(ref_conv(r1, self.w2, (1, 1), (1, 1), (1, 1)) + self.b2.reshape(1, -1, 1, 1) + self.x)


@pytest.fixture(autouse=True)
def _fresh_deferral_history():
    """fuse() learns which calls run alone (fusion._LONE); each test starts without that history."""
    fusion._LONE.clear()
    yield
    fusion._LONE.clear()


def both(block, handle, fn, *shapes):
    """Run ``fn`` unfused and inside fuse(); (unfused buffers, fused buffers, scope)."""
    plain = [block.empty(s) for s in shapes]
    fn(handle, *plain)
    fused = [block.empty(s) for s in shapes]
    with cc.fuse(handle) as scope:
        fn(handle, *fused)
        assert fusion.pending() > 0  # deferred, not run
    return plain, fused, scope


def test_basic_block_matches_formula_and_unfused_as_one_graph(handle, rng):
    b = Block(rng)
    (p1, p2), (f1, f2), scope = both(b, handle, b.basic_block, None, None)
    r1, r2 = b.f_block()
    np.testing.assert_allclose(b.get(f2), r2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.get(f1), r1, rtol=1e-5, atol=1e-5)  # y1 stays visible: written
    np.testing.assert_array_equal(f2, p2)
    np.testing.assert_array_equal(f1, p1)
    assert scope.deferred == 7 and scope.flushes == 1 and scope.graphs == {"numpy": 1}


def test_conv_bias_relu_pool_matches_unfused(handle, rng):
    b = Block(rng)
    (py, pp), (fy, fp), scope = both(b, handle, b.pool_block, None, (2, 4, 3, 3))
    want_y = b.f_layer(b.x, b.w1, b.b1)
    np.testing.assert_allclose(b.get(fp, (2, 4, 3, 3)), maxpool2(want_y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.get(fy), want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(fp, pp)
    assert sum(scope.graphs.values()) == 1
    plan = _call.last_plan()
    kinds = [op.kind for op in plan.graph.ops]
    assert kinds == ["ConvolutionForward", "Pointwise", "Pointwise", "ResampleForward"]  # scalars of 1 folded
    assert [op.attrs.get("mode") for op in plan.graph.ops[1:3]] == ["ADD", "RELU_FWD"]


def test_float16_nhwc_within_tolerance(handle, rng):
    b = Block(rng, dtype=F16, fmt=cc.CUDNN_TENSOR_NHWC)
    (p1, p2), (f1, f2), _scope = both(b, handle, b.basic_block, None, None)
    _r1, r2 = b.f_block()
    # fused intermediates stay in float32 (unfused rounds them to half): both within half precision
    np.testing.assert_allclose(b.get(f2), r2, rtol=4e-3, atol=4e-3)
    np.testing.assert_allclose(b.get(f2), b.get(p2), rtol=4e-3, atol=4e-3)


def test_bn_inference_softmax_and_scale_chain(handle, rng):
    n, c, hw = 2, 3, 4
    shape = (n, c, hw, hw)
    xd, pdsc = tdesc(shape), tdesc((1, c, 1, 1))
    x = rng.standard_normal(shape).astype(np.float32)
    scale, bias = rng.uniform(0.5, 2, c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    mean, var = rng.standard_normal(c).astype(np.float32), rng.uniform(0.5, 2, c).astype(np.float32)
    eps = 1e-5

    def chain(h, y, s):
        cc.cudnnBatchNormalizationForwardInference(h, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, xd, x, xd, y, pdsc,
                                                   scale, bias, mean, var, eps)
        cc.cudnnScaleTensor(h, xd, y, 0.5)
        cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, xd, y, 0.0, xd, s)

    plain = [np.zeros(shape, np.float32) for _ in range(2)]
    chain(handle, *plain)
    fused = [np.zeros(shape, np.float32) for _ in range(2)]
    with cc.fuse(handle) as scope:
        chain(handle, *fused)
    bn = 0.5 * ((x.astype(np.float64) - mean.reshape(1, -1, 1, 1)) / np.sqrt(var.reshape(1, -1, 1, 1) + eps)
                * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1))
    e = np.exp(bn - bn.max(axis=1, keepdims=True))
    np.testing.assert_allclose(fused[0], bn, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fused[1], e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fused[1], plain[1], rtol=1e-6, atol=1e-7)
    assert sum(scope.graphs.values()) == 1 and scope.deferred == 3


def test_repeated_block_reuses_recipe_and_plan(handle, rng):
    b = Block(rng)
    y1, y2 = b.empty(), b.empty()
    with cc.fuse(handle):
        b.basic_block(handle, y1, y2)
    recipes, hits = len(fusion._RECIPES), cc.plan_cache_info().hits
    for _ in range(3):
        with cc.fuse(handle):
            b.basic_block(handle, y1, y2)
    assert len(fusion._RECIPES) == recipes and cc.plan_cache_info().hits > hits
    assert _registry.HOOKS == [] and _call.HOOKS == []  # hooks leave with the last block


def test_flush_before_a_call_that_reads_results(handle, rng):
    b = Block(rng)
    y = b.empty()
    db = np.full(4, np.nan, np.float32)
    with cc.fuse(handle) as scope:
        b.conv_bias_relu(handle, b.dev["x"], "w1", "b1", y)
        assert fusion.pending() == 3 and np.isnan(y).all()
        cc.cudnnConvolutionBackwardBias(handle, 1.0, b.xd, y, 0.0, b.bd, db)  # not deferrable: reads y
        assert fusion.pending() == 0
        cc.cudnnGetTensor4dDescriptor(b.xd)  # a query: nothing to flush
        cc.cudnnAddTensor(handle, 1.0, b.bd, b.dev["b2"], 1.0, b.xd, y)
        scope.flush()
        assert fusion.pending() == 0
    want = b.f_layer(b.x, b.w1, b.b1)
    np.testing.assert_allclose(db, want.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.reshape(b.shape), want + b.b2.reshape(1, -1, 1, 1), rtol=1e-5, atol=1e-5)
    assert scope.flushes == 2


def test_write_over_a_region_read_by_a_convolution_is_a_hazard(handle, rng):
    """The conv reads x at other positions than it writes; overwriting x later must not reach it."""
    b = Block(rng)

    def seq(h, x, y):
        x[...] = b.dev["x"]
        b.conv(h, x, b.dev["w1"], y)
        cc.cudnnAddTensor(h, 1.0, b.bd, b.dev["b1"], 1.0, b.xd, x)  # writes x after the conv read it
        cc.cudnnActivationForward(h, b.ad, 1.0, b.xd, x, 0.0, b.xd, x)
    (px, py), (fx, fy), scope = both(b, handle, seq, None, None)
    np.testing.assert_allclose(b.get(fy), ref_conv(b.x, b.w1, (1, 1), (1, 1), (1, 1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.get(fx), relu(b.x + b.b1.reshape(1, -1, 1, 1)), rtol=1e-6)
    np.testing.assert_array_equal(fy, py)
    assert sum(scope.graphs.values()) == 2  # split at the hazard: conv, then the in-place add + relu


def test_partial_overlap_and_other_layout_are_hazards(handle, rng):
    b = Block(rng)
    n, c, hw, _ = b.shape
    flat = tdesc((n * c, 1, hw, hw))  # the same memory described differently

    def seq(h, y, z):
        b.conv_bias_relu(h, b.dev["x"], "w1", "b1", y)
        cc.cudnnActivationForward(h, b.ad, 1.0, flat, y, 0.0, flat, z)  # reads y through another descriptor
        half = y[y.size // 2:]  # a region overlapping y's second half
        cc.cudnnScaleTensor(h, tdesc((1, 1, 1, y.size // 2)), half, 2.0)
    (py, pz), (fy, fz), scope = both(b, handle, seq, None, None)
    want = b.f_layer(b.x, b.w1, b.b1).reshape(-1)
    np.testing.assert_allclose(fz, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fy, np.concatenate([want[: want.size // 2], 2 * want[want.size // 2:]]), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(fy, py)
    assert scope.flushes == 3


def test_errors_raise_at_the_call_and_pending_calls_still_run(handle, rng):
    b = Block(rng)
    y = b.empty()
    bad = np.full(3, 7.0, np.float32)
    with cc.fuse(handle) as scope:
        b.conv_bias_relu(handle, b.dev["x"], "w1", "b1", y)
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnAddTensor(handle, 1.0, tdesc((1, 3, 1, 1)), bad, 1.0, b.xd, y)  # C=3 vs 4: BAD_PARAM
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnActivationForward(handle, b.ad, 1.0, tdesc((1, 1, 1, 3)), bad, 0.0, tdesc((1, 1, 1, 3)), bad[:2])
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM  # a too-small buffer, caught at the call
        assert fusion.pending() == 3 and np.all(bad == 7.0)
    assert scope.deferred == 3
    np.testing.assert_allclose(b.get(y), b.f_layer(b.x, b.w1, b.b1), rtol=1e-5, atol=1e-5)


def test_exception_in_block_still_runs_recorded_calls(handle, rng):
    b = Block(rng)
    y = b.empty()
    with pytest.raises(KeyError):
        with cc.fuse(handle):
            b.conv_bias_relu(handle, b.dev["x"], "w1", "b1", y)
            raise KeyError("user code")
    np.testing.assert_allclose(b.get(y), b.f_layer(b.x, b.w1, b.b1), rtol=1e-5, atol=1e-5)
    assert _registry.HOOKS == [] and _call.HOOKS == []


def test_dead_store_and_other_handle(handle, rng):
    """A value overwritten unread is still a valid graph; a call on another handle flushes first."""
    d = tdesc((1, 2, 2, 2))
    y = np.zeros(8, np.float32)
    other = cc.cudnnCreate("cpu")
    try:
        with cc.fuse(handle) as scope:
            cc.cudnnSetTensor(handle, d, y, 5.0)
            cc.cudnnSetTensor(handle, d, y, 7.0)
            cc.cudnnScaleTensor(other, d, y, 3.0)  # another handle: not deferred, runs after a flush
            assert fusion.pending() == 0
        assert np.all(y == 21.0) and scope.deferred == 2
    finally:
        cc.cudnnDestroy(other)


class ConvEpilogue(ReferenceEngine):
    """A fake engine taking what the native cudnn engine takes: one convolution first, then
    Pointwise ops (it runs them with the reference kernels)."""
    name = "convepilogue"
    places = ("cpu",)

    def check_support(self, graph, place):
        kinds = [op.kind for op in graph.ops]
        if kinds[0] != "ConvolutionForward" or any(k != "Pointwise" for k in kinds[1:]):
            return "takes one ConvolutionForward followed by Pointwise ops"
        return None


def test_split_into_the_fewest_graphs_the_engines_take(monkeypatch, handle, rng):
    monkeypatch.setitem(REGISTRY.engines, "convepilogue", ConvEpilogue())
    monkeypatch.setitem(heuristics.ORDER, "cpu", ("convepilogue", "reference"))
    cc.plan_cache_clear()
    b = Block(rng)
    (_p1, p2), (_f1, f2), scope = both(b, handle, b.basic_block, None, None)
    np.testing.assert_array_equal(f2, p2)
    assert scope.graphs == {"convepilogue": 2}  # conv+bias+relu | conv+bias+residual+relu
    (_py, pp), (_fy, fp), scope = both(b, handle, b.pool_block, None, (2, 4, 3, 3))
    np.testing.assert_array_equal(fp, pp)
    assert scope.graphs == {"convepilogue": 1, "reference": 1}  # the pooling does not join the conv graph
    cc.plan_cache_clear()


def test_read_only_output_rejected_at_the_call(handle):
    d = tdesc((1, 1, 1, 4))
    y = np.zeros(4, np.float32)
    y.flags.writeable = False
    with cc.fuse(handle):
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnSetTensor(handle, d, y, 1.0)
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and fusion.pending() == 0


# -- GPU -----------------------------------------------------------------------------------------

def _cuda_kernels(fn):
    """CUDA kernels launched by ``fn`` (torch.profiler sees every kernel of the process), or None."""
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch.autograd import DeviceType
    except Exception:  # noqa: BLE001 - no torch: the caller counts graphs instead
        return None
    import cupy
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        cupy.cuda.runtime.deviceSynchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, fmt", [(F32, cc.CUDNN_TENSOR_NCHW), (F16, cc.CUDNN_TENSOR_NHWC)])
def test_gpu_fusion_matches_and_runs_fewer_kernels(rng, dtype, fmt):
    import cupy
    h = cc.cudnnCreate("gpu")
    b = Block(rng, dtype=dtype, n=4, c=16, hw=8, fmt=fmt, xp=cupy)
    y1, y2, f1, f2 = (b.empty() for _ in range(4))
    yp, pp, fy, fp = b.empty(), b.empty((4, 16, 4, 4)), b.empty(), b.empty((4, 16, 4, 4))

    def plain():
        b.basic_block(h, y1, y2)
        b.pool_block(h, yp, pp)

    def fused():
        with cc.fuse(h) as scope:
            b.basic_block(h, f1, f2)
        with cc.fuse(h) as scope2:
            b.pool_block(h, fy, fp)
        return scope, scope2

    plain()
    s1, s2 = fused()  # plans built (and autotuned) here, outside the kernel count
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == F16 else dict(rtol=5e-3, atol=5e-3)  # TF32 on DEFAULT_MATH
    _r1, r2 = b.f_block()
    np.testing.assert_allclose(b.get(f2), r2, **tol)
    np.testing.assert_allclose(b.get(f2), b.get(y2), **tol)
    np.testing.assert_allclose(b.get(f1), b.get(y1), **tol)
    np.testing.assert_allclose(b.get(fp, (4, 16, 4, 4)), b.get(pp, (4, 16, 4, 4)), **tol)
    assert sum(s1.graphs.values()) == 2, s1.graphs  # 7 calls -> conv+bias+relu | conv+bias+residual+relu
    assert sum(s2.graphs.values()) == 2, s2.graphs  # conv+bias+relu | pooling
    if dtype == F16:  # runtime fusion of the native engine (fp16 NHWC, tensor cores)
        assert s1.graphs == {"cudnn": 2}, s1.graphs
    if s1.graphs.get("cudnn") == 2:
        k_plain, k_fused = _cuda_kernels(plain), _cuda_kernels(fused)
        if k_plain is not None:
            assert k_fused < k_plain, (k_fused, k_plain)
    cc.cudnnDestroy(h)


def test_tiny_plan_cache_evicting_plans_between_record_and_flush(monkeypatch, handle, rng):
    """Plans evicted (and released) while their calls wait are rebuilt from the same graphs."""
    from cudnn_compat._backend.plan_cache import CACHE
    monkeypatch.setattr(CACHE, "maxsize", 1)
    b = Block(rng)
    y1, y2 = b.empty(), b.empty()
    with cc.fuse(handle) as scope:
        b.basic_block(handle, y1, y2)
        b.pool_block(handle, b.empty(), b.empty((2, 4, 3, 3)))
    _r1, r2 = b.f_block()
    np.testing.assert_allclose(b.get(y2), r2, rtol=1e-5, atol=1e-5)
    assert scope.deferred == 11
    cc.plan_cache_clear()


@pytest.mark.skipif(__import__("cudnn_compat._core.place", fromlist=["gpu_reason"]).gpu_reason() is None,
                    reason="checks the message of a machine without a GPU")
def test_bench_command_fails_clearly_without_gpu(capsys):
    from cudnn_compat.tools import cli
    assert cli.main(["bench"]) == 2
    assert "need a CUDA GPU" in capsys.readouterr().err


def test_a_call_that_always_runs_alone_stops_being_deferred(handle, rng, monkeypatch):
    """A deferrable call that LONE_AFTER flushes ran alone runs at once in later scopes (no recording,
    same numbers); every REPROBE-th call is deferred again; a pair that fuses stays deferred."""
    monkeypatch.setattr(fusion, "REPROBE", 2)
    b = Block(rng)
    d = b.dev
    want = relu(ref_conv(b.x, b.w1, (1, 1), (1, 1), (1, 1)))
    deferred = []
    for _ in range(fusion.LONE_AFTER + 4):
        y = b.empty()
        with cc.fuse(handle) as scope:
            b.conv(handle, d["x"], d["w1"], y)
            cc.cudnnActivationForward(handle, b.ad, 1.0, b.xd, y, 0.0, b.xd, y)
            scope.flush()  # conv+relu merge on the CPU place: flush each alone instead
        deferred.append(scope.deferred)
        np.testing.assert_allclose(b.get(y), want, rtol=1e-5, atol=1e-6)
    assert deferred == [2] * len(deferred)  # conv+relu merge into one graph: always worth deferring

    lone = []
    for _ in range(fusion.LONE_AFTER + 4):
        y = b.empty()
        with cc.fuse(handle) as scope:
            b.conv(handle, d["x"], d["w1"], y)
            scope.flush()
            cc.cudnnActivationForward(handle, b.ad, 1.0, b.xd, y, 0.0, b.xd, y)
        lone.append(scope.deferred)
        np.testing.assert_allclose(b.get(y), want, rtol=1e-5, atol=1e-6)
    # each flushed alone: LONE_AFTER scopes defer both, then REPROBE + 1 run them at once, then a re-probe
    n = fusion.LONE_AFTER
    assert lone == [2] * n + [0] * (fusion.REPROBE + 1) + [2], lone


# -- the measured choice: fused or plain per with-statement (issue 14 item 5) ----------------------

class _FakeClock:
    """Marks are a counter the block advances: 1 ms when it ran fused (calls pending at its end),
    ``plain_ms`` when it ran plain (the scope left at its first call, nothing pending)."""

    def __init__(self):
        self.now = 0.0

    def mark(self, handle):
        return self.now

    def elapsed_ms(self, t0, t1):
        return t1 - t0


@pytest.mark.parametrize("plain_ms, want_fused", [(2.0, True), (0.5, False), (1.0, False)])
def test_each_with_statement_runs_the_faster_mode(monkeypatch, handle, rng, plain_ms, want_fused):
    """TRIAL_WARM fused runs, then TRIAL_RUNS timed runs of each mode alternating (plain first);
    the faster median wins (a tie goes to plain) and stays; plain runs leave at their first call
    (no hooks, nothing recorded) and give the same numbers."""
    clock = _FakeClock()
    monkeypatch.setattr(fusion, "_clock", lambda h: clock)
    monkeypatch.setattr(fusion, "_SITES", {})
    monkeypatch.setattr(fusion, "_STATEMENTS", {})
    b = Block(rng)
    d = b.dev
    want = relu(ref_conv(b.x, b.w1, (1, 1), (1, 1), (1, 1)))
    modes = []

    def block():
        y = b.empty()
        with cc.fuse(handle) as scope:
            b.conv(handle, d["x"], d["w1"], y)
            cc.cudnnActivationForward(handle, b.ad, 1.0, b.xd, y, 0.0, b.xd, y)
            ran_fused = fusion.pending() > 0
            assert ran_fused == (_call.HOOKS != [])  # a plain scope has left: no hooks
            clock.now += 1.0 if ran_fused else plain_ms
        assert scope.deferred == (2 if ran_fused else 0) and ran_fused == scope.fused
        np.testing.assert_allclose(b.get(y), want, rtol=1e-5, atol=1e-6)
        return scope

    for _ in range(fusion.TRIAL_WARM + 2 * fusion.TRIAL_RUNS + 3):
        modes.append(block().fused)
    trial = [True] * fusion.TRIAL_WARM + [False, True] * fusion.TRIAL_RUNS
    assert modes == trial + [want_fused] * 3, modes
    assert _registry.HOOKS == [] and _call.HOOKS == []
    (site,) = fusion._SITES.values()
    assert site.fused is want_fused
    # once every block of the statement chose plain, its scopes install no hooks at all
    installs = []
    real_install = fusion._install
    monkeypatch.setattr(fusion, "_install", lambda: (installs.append(1), real_install()))
    assert block().fused is want_fused
    assert installs == ([1] if want_fused else [])


def test_a_raising_block_is_not_timed(monkeypatch, handle, rng):
    clock = _FakeClock()
    monkeypatch.setattr(fusion, "_clock", lambda h: clock)
    monkeypatch.setattr(fusion, "_SITES", {})
    monkeypatch.setattr(fusion, "_STATEMENTS", {})
    b = Block(rng)
    for i in range(fusion.TRIAL_WARM + 2 * fusion.TRIAL_RUNS):
        y = b.empty()
        with pytest.raises(ZeroDivisionError) if i == fusion.TRIAL_WARM else contextlib.nullcontext():
            with cc.fuse(handle):
                b.conv(handle, b.dev["x"], b.dev["w1"], y)
                if i == fusion.TRIAL_WARM:
                    1 / 0
    (site,) = fusion._SITES.values()
    assert site.fused is None and len(site.runs) == 2 * fusion.TRIAL_RUNS - 1  # one run short: undecided


def test_the_cpu_place_always_fuses(handle, rng):
    """No clock on the CPU place (its run is one reference graph): every scope fuses."""
    assert fusion._clock(handle) is None
    b = Block(rng)
    for _ in range(fusion.TRIAL_WARM + 2 * fusion.TRIAL_RUNS + 1):
        y = b.empty()
        with cc.fuse(handle) as scope:
            b.conv(handle, b.dev["x"], b.dev["w1"], y)
            cc.cudnnActivationForward(handle, b.ad, 1.0, b.xd, y, 0.0, b.xd, y)
        assert scope.fused is True and scope.deferred == 2


@pytest.mark.gpu
def test_gpu_with_statement_is_timed_and_decided(monkeypatch, rng):
    """On the GPU the trial runs on CUDA events and decides; every run gives the unfused numbers."""
    import cupy
    monkeypatch.setattr(fusion, "_SITES", {})
    monkeypatch.setattr(fusion, "_STATEMENTS", {})
    h = cc.cudnnCreate("gpu")
    b = Block(rng, dtype=F32, n=4, c=16, hw=8, fmt=cc.CUDNN_TENSOR_NCHW, xp=cupy)
    y1, y2 = b.empty(), b.empty()
    b.basic_block(h, y1, y2)
    want = b.get(y2)
    for _ in range(fusion.TRIAL_WARM + 2 * fusion.TRIAL_RUNS + 2):
        f1, f2 = b.empty(), b.empty()
        with cc.fuse(h):
            b.basic_block(h, f1, f2)
        np.testing.assert_allclose(b.get(f2), want, rtol=5e-3, atol=5e-3)
    (site,) = fusion._SITES.values()
    assert site.fused in (True, False) and site.runs == []
    assert _registry.HOOKS == [] and _call.HOOKS == []
    cc.cudnnDestroy(h)
