"""Algorithm queries and workspaces (002 §5.2.13-§5.2.16, §5.2.19-§5.2.24, §6.2.9-§6.2.14) and
the errors of cudnnConvolutionForward (§5.2.10 "Returns")."""
import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend.engines.base import REGISTRY
from cudnn_compat._backend.engines.reference import ReferenceEngine, ReferencePlan
from conftest import tdesc
from conv_util import CONV, DOUBLE, FLOAT, NCHW, cdesc, fdesc, out_shape, ref_bwd_data, ref_bwd_filter, ref_conv

BAD, UNSUP, OK = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED, cc.CUDNN_STATUS_SUCCESS
XS, WS, PAD = (2, 3, 6, 6), (4, 3, 3, 3), (1, 1)
YS = out_shape(XS, WS, PAD, (1, 1), (1, 1))
FWD_ALGOS = [cc.ENUMS["cudnnConvolutionFwdAlgo_t"][k] for k in cc.ENUMS["cudnnConvolutionFwdAlgo_t"] if "COUNT" not in k]


def descs(dtype=FLOAT):
    return tdesc(XS, dtype), fdesc(WS, dtype), cdesc(PAD, compute=dtype), tdesc(YS, dtype)


def test_max_counts_on_the_cpu(handle):
    """No Tensor Cores on the CPU: one entry per algorithm (002 §5.2.19/§5.2.22)."""
    assert cc.cudnnGetConvolutionForwardAlgorithmMaxCount(handle) == 8
    assert cc.cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle) == 6
    assert cc.getConvolutionBackwardFilterAlgorithmMaxCount(handle) == 7
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetConvolutionForwardAlgorithmMaxCount(0)
    assert e.value.status == BAD


def test_get_v7_ranks_every_algo_with_plan_workspace(handle):
    xd, wd, cd, yd = descs()
    perf = cc.getConvolutionForwardAlgorithm_v7(handle, xd, wd, cd, yd, 10)
    assert sorted(p.algo for p in perf) == FWD_ALGOS  # each once (no Tensor Core versions on the CPU)
    statuses = [p.status for p in perf]
    assert statuses == sorted(statuses, key=lambda s: s != OK)  # supported ones first
    by_algo = {p.algo: p for p in perf}
    assert by_algo[cc.CUDNN_CONVOLUTION_FWD_ALGO_DIRECT].status == UNSUP  # "not implemented" in 002
    for p in perf:
        assert p.mathType == cc.CUDNN_DEFAULT_MATH and p["algo"] == p.algo  # struct-like and dict-like
        if p.status == OK:
            assert p.memory == cc.getConvolutionForwardWorkspaceSize(handle, xd, wd, cd, yd, p.algo) == 0
            assert p.determinism == cc.CUDNN_DETERMINISTIC
    assert len(cc.getConvolutionForwardAlgorithm_v7(handle, xd, wd, cd, yd, 2)) == 2
    with pytest.raises(cc.CuDNNError) as e:
        cc.getConvolutionForwardAlgorithm_v7(handle, xd, wd, cd, yd, 0)
    assert e.value.status == BAD and "requestedAlgoCount" in str(e.value)


def test_get_v7_marks_what_the_tables_exclude(handle):
    """stride 2 and a 5x5 filter: FFT, WINOGRAD (3x3 only) and DIRECT cannot run it."""
    xs, ws = (1, 2, 9, 9), (2, 2, 5, 5)
    cd = cdesc((2, 2), (2, 2))
    ys = out_shape(xs, ws, (2, 2), (2, 2), (1, 1))
    perf = cc.getConvolutionForwardAlgorithm_v7(handle, tdesc(xs), fdesc(ws), cd, tdesc(ys), 8)
    bad = {p.algo for p in perf if p.status == UNSUP}
    A = cc.ENUMS["cudnnConvolutionFwdAlgo_t"]
    assert bad == {A["CUDNN_CONVOLUTION_FWD_ALGO_" + n] for n in ("DIRECT", "FFT", "WINOGRAD", "WINOGRAD_NONFUSED")}
    for algo in bad:
        with pytest.raises(cc.CuDNNError) as e:
            cc.getConvolutionForwardWorkspaceSize(handle, tdesc(xs), fdesc(ws), cd, tdesc(ys), algo)
        assert e.value.status == UNSUP and "algo" in str(e.value)


def test_dilated_nchw_forward_takes_the_workspace_algorithms(handle, rng):
    """libcudnn 9 runs IMPLICIT_PRECOMP_GEMM and GEMM forward on a dilated NCHW problem (002's tables
    asked dilation 1; algos.py says why we follow the library): both are SUCCESS in the heuristic
    ranking, and each computes the dilated convolution of the direct-loop formula."""
    xs, ws, pad, dil = (2, 3, 11, 10), (4, 3, 3, 3), (2, 2), (2, 2)
    ys = out_shape(xs, ws, pad, (1, 1), dil)
    xd, wd, cd, yd = tdesc(xs, DOUBLE), fdesc(ws, DOUBLE), cdesc(pad, (1, 1), dil, compute=DOUBLE), tdesc(ys, DOUBLE)
    A = cc.ENUMS["cudnnConvolutionFwdAlgo_t"]
    perf = {p.algo: p for p in cc.getConvolutionForwardAlgorithm_v7(handle, xd, wd, cd, yd, 10)}
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    for name in ("IMPLICIT_PRECOMP_GEMM", "GEMM"):
        algo = A["CUDNN_CONVOLUTION_FWD_ALGO_" + name]
        assert perf[algo].status == OK, name
        y = np.full(ys, np.nan)
        n = cc.getConvolutionForwardWorkspaceSize(handle, xd, wd, cd, yd, algo)
        cc.cudnnConvolutionForward(handle, 1.0, xd, x, wd, w, cd, algo, np.zeros(max(n, 1), np.uint8), n, 0.0, yd, y)
        np.testing.assert_allclose(y, ref_conv(x, w, pad, (1, 1), dil), rtol=1e-12)
    assert perf[A["CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD"]].status == UNSUP  # still dilation 1 there


@pytest.mark.parametrize("direction", ["fwd", "data", "filter"])
def test_find_times_every_candidate(handle, direction):
    xd, wd, cd, yd = descs()
    if direction == "fwd":
        perf = cc.cudnnFindConvolutionForwardAlgorithm(handle, xd, wd, cd, yd, 20)
        n = 8
    elif direction == "data":
        perf = cc.findConvolutionBackwardDataAlgorithm(handle, wd, yd, cd, xd, 20)
        n = 6
    else:
        perf = cc.findConvolutionBackwardFilterAlgorithm(handle, xd, yd, cd, wd, 20)
        n = 7
    assert len(perf) == n and len({p.algo for p in perf}) == n
    good = [p for p in perf if p.status == OK]
    assert good and perf[:len(good)] == good  # successes first ...
    assert [p.time for p in good] == sorted(p.time for p in good)  # ... sorted by measured time
    assert all(p.time > 0 and p.memory == 0 for p in good)
    assert all(p.time == -1 for p in perf[len(good):])


def test_find_ex_writes_the_result_and_honours_the_count(handle, rng):
    xd, wd, cd, yd = descs(DOUBLE)
    x, w = rng.standard_normal(XS), rng.standard_normal(WS)
    y = np.full(YS, np.nan)
    perf = cc.cudnnFindConvolutionForwardAlgorithmEx(handle, xd, x, wd, w, cd, yd, y, 3, None, 0)
    assert len(perf) == 3 and all(p.status == OK for p in perf)
    np.testing.assert_allclose(y, ref_conv(x, w, PAD, (1, 1), (1, 1)), rtol=1e-12)
    assert cc.findConvolutionForwardAlgorithmEx_v7 is cc.cudnnFindConvolutionForwardAlgorithmEx  # CuPy 13 name
    dy = rng.standard_normal(YS)
    dx, dw = np.full(XS, np.nan), np.full(WS, np.nan)
    cc.cudnnFindConvolutionBackwardDataAlgorithmEx(handle, wd, w, yd, dy, cd, xd, dx, 1, 0, 0)
    cc.cudnnFindConvolutionBackwardFilterAlgorithmEx(handle, xd, x, yd, dy, cd, wd, dw, 1, 0, 0)
    np.testing.assert_allclose(dx, ref_bwd_data(dy, w, XS, PAD, (1, 1), (1, 1)), rtol=1e-12)
    np.testing.assert_allclose(dw, ref_bwd_filter(x, dy, WS, PAD, (1, 1), (1, 1)), rtol=1e-12)
    with pytest.raises(cc.CuDNNError) as e:  # a NULL buffer
        cc.cudnnFindConvolutionForwardAlgorithmEx(handle, xd, None, wd, w, cd, yd, y, 3, None, 0)
    assert e.value.status == BAD and ": x:" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnFindConvolutionBackwardDataAlgorithm(handle, wd, yd, cd, xd, 0)
    assert e.value.status == BAD


def test_workspace_queries_for_each_direction(handle):
    xd, wd, cd, yd = descs()
    assert cc.cudnnGetConvolutionBackwardDataWorkspaceSize(handle, wd, yd, cd, xd, cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_1) == 0
    assert cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, xd, yd, cd, wd,
                                                             cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0) == 0
    with pytest.raises(cc.CuDNNError) as e:  # backward-filter WINOGRAD is not implemented in cuDNN
        cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, xd, yd, cd, wd, cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD)
    assert e.value.status == UNSUP
    with pytest.raises(cc.CuDNNError) as e:  # feature maps differ
        cc.cudnnGetConvolutionForwardWorkspaceSize(handle, tdesc((2, 2, 6, 6)), wd, cd, yd, 0)
    assert e.value.status == BAD
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetConvolutionForwardWorkspaceSize(handle, xd, wd, cd, yd, 42)
    assert e.value.status == BAD and "algo" in str(e.value)


class WorkspaceEngine(ReferenceEngine):
    """The reference engine, but its plans claim 256 bytes of workspace."""

    name = "test_workspace"

    def build(self, graph, config):
        return ReferencePlan(graph, config, workspace_size=256)


@pytest.fixture
def ws_engine(monkeypatch):
    monkeypatch.setitem(REGISTRY.engines, WorkspaceEngine.name, WorkspaceEngine())
    monkeypatch.setenv("CUDNN_COMPAT_ENGINE", WorkspaceEngine.name)
    cc.plan_cache_clear()
    yield
    cc.plan_cache_clear()


def test_workspace_is_the_plans_need(handle, rng, ws_engine):
    xd, wd, cd, yd = descs()
    assert cc.cudnnGetConvolutionForwardWorkspaceSize(handle, xd, wd, cd, yd, 0) == 256
    assert all(p.memory == 256 for p in cc.cudnnGetConvolutionForwardAlgorithm_v7(handle, xd, wd, cd, yd, 8)
               if p.status == OK)
    x, w = rng.standard_normal(XS).astype(np.float32), rng.standard_normal(WS).astype(np.float32)
    y = np.full(YS, 5.0, np.float32)
    for ws, size in [(None, 0), (np.zeros(100, np.uint8), 100)]:
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnConvolutionForward(handle, 1.0, xd, x, wd, w, cd, 0, ws, size, 0.0, yd, y)
        assert e.value.status == BAD and "workSpaceSizeInBytes" in str(e.value)
        assert np.all(y == 5.0)
    cc.cudnnConvolutionForward(handle, 1.0, xd, x, wd, w, cd, 0, np.zeros(256, np.uint8), 256, 0.0, yd, y)
    np.testing.assert_allclose(y, ref_conv(x, w, PAD, (1, 1), (1, 1)), rtol=1e-5, atol=1e-5)
    # Find*Ex: algorithms that need more than the given workspace are reported, not run
    perf = cc.cudnnFindConvolutionForwardAlgorithmEx(handle, xd, x, wd, w, cd, yd, y, 8, np.zeros(64, np.uint8), 64)
    assert {p.status for p in perf} == {cc.CUDNN_STATUS_ALLOC_FAILED, UNSUP}
    assert all(p.memory == 256 for p in perf if p.status == cc.CUDNN_STATUS_ALLOC_FAILED)
    perf = cc.cudnnFindConvolutionForwardAlgorithm(handle, xd, wd, cd, yd, 8)  # allocates what each plan needs
    assert all(p.memory == 256 and p.time > 0 for p in perf if p.status == OK) and perf[0].status == OK


# -- cudnnConvolutionForward errors (002 §5.2.10 "Returns"): status, and y untouched --------------

def _fwd(handle, xs=XS, ws=WS, ys=YS, pad=PAD, xt=FLOAT, wt=FLOAT, yt=FLOAT, ct=FLOAT, groups=1, algo=0, stride=None,
         x="buf", alpha=1.0, y=None):
    st = {FLOAT: np.float32, DOUBLE: np.float64}
    xbuf = np.ones(int(np.prod(xs)), st[xt]) if x == "buf" else x
    cc.cudnnConvolutionForward(handle, alpha, tdesc(xs, xt), xbuf, fdesc(ws, wt), np.ones(int(np.prod(ws)), st[wt]),
                               cdesc(pad, stride, compute=ct, groups=groups), algo, None, 0, 0.0, tdesc(ys, yt), y)


@pytest.mark.parametrize("kw, status, arg", [
    (dict(x=None), BAD, "x"),  # NULL data
    (dict(alpha=None), BAD, "alpha"),
    (dict(ys=(2, 4, 6, 6, 1)), BAD, "yDesc"),  # x/y nbDims differ
    (dict(ws=(4, 3, 3, 3, 1)), BAD, "wDesc"),  # x/w nbDims differ
    (dict(pad=(1, 1, 1)), BAD, "convDesc"),  # nbDims != arrayLength + 2
    (dict(ws=(4, 2, 3, 3)), BAD, "wDesc"),  # input feature maps differ
    (dict(ws=(3, 1, 3, 3), groups=3, ys=(2, 3, 6, 6)), OK, None),  # depthwise is fine ...
    (dict(ws=(4, 1, 3, 3), groups=3, ys=(2, 4, 6, 6)), BAD, "wDesc"),  # ... K=4 not a multiple of 3 groups
    (dict(xt=DOUBLE), BAD, "xDesc,wDesc,yDesc"),  # data types differ
    (dict(ws=(4, 3, 9, 3)), BAD, "wDesc"),  # filter larger than the padded input
    (dict(algo=3), UNSUP, "algo"),  # DIRECT: not implemented
    (dict(algo=4, stride=(2, 2), ys=(2, 4, 3, 3)), UNSUP, "algo"),  # FFT needs stride 1
    (dict(algo=-1), BAD, "algo"),
    (dict(ys=(2, 4, 5, 6)), UNSUP, "yDesc"),  # y dims are not the output dims
    (dict(ys=(2, 3, 6, 6)), UNSUP, "yDesc"),  # y channels are not K
    (dict(ct=cc.CUDNN_DATA_HALF), UNSUP, "convDesc"),  # float data with half compute: no such config
    (dict(xs=(2, 3, 6), ws=(4, 3, 3), ys=(2, 4, 6), pad=(1,)), UNSUP, "xDesc"),  # 3-d tensors
])
def test_forward_errors_write_nothing(handle, kw, status, arg):
    ys = kw.get("ys", YS)
    y = np.full(int(np.prod(ys)), 9.0, np.float32)
    if status == OK:
        _fwd(handle, y=y, **kw)
        assert not np.all(y == 9.0)
        return
    with pytest.raises(cc.CuDNNError) as e:
        _fwd(handle, y=y, **kw)
    assert e.value.status == status and f"cudnnConvolutionForward: {arg}:" in str(e.value), str(e.value)
    assert np.all(y == 9.0)


def test_tensor_core_math_type_runs_and_is_reported_honestly(handle, rng):
    """TENSOR_OP_MATH on the CPU: the call runs (math type in the plan key and attrs); Find reports
    DEFAULT_MATH, since no algorithm has a Tensor Core version here (002 §5.2.15 note)."""
    x, w = rng.standard_normal(XS).astype(np.float32), rng.standard_normal(WS).astype(np.float32)
    y = np.zeros(YS, np.float32)
    cd = cdesc(PAD, mode=CONV, math=cc.CUDNN_TENSOR_OP_MATH)
    cc.convolutionForward(handle, 1.0, tdesc(XS), x, fdesc(WS), w, cd, 1, None, 0, 0.0, tdesc(YS), y)
    np.testing.assert_allclose(y, ref_conv(x, w, PAD, (1, 1), (1, 1), mode=CONV), rtol=1e-5, atol=1e-5)
    perf = cc.findConvolutionForwardAlgorithm(handle, tdesc(XS), fdesc(WS), cd, tdesc(YS), 8)
    assert {p.mathType for p in perf} == {cc.CUDNN_DEFAULT_MATH}


@pytest.mark.parametrize("query", ["find", "get_v7", "find_bwd_filter", "find_bwd_data"])
def test_fma_math_descriptor_gives_every_algo_fma_math(handle, query):
    """convDesc with FMA_MATH: every algorithm is tried and reported with FMA_MATH (libcudnn 9 does
    the same), so a caller keeping only results of its descriptor's math type finds all of them."""
    cd = cdesc(PAD, mode=CONV, math=cc.CUDNN_FMA_MATH)
    xd, wd, yd = tdesc(XS), fdesc(WS), tdesc(YS)
    fn = {"find": lambda: cc.findConvolutionForwardAlgorithm(handle, xd, wd, cd, yd, 16),
          "get_v7": lambda: cc.getConvolutionForwardAlgorithm_v7(handle, xd, wd, cd, yd, 16),
          "find_bwd_filter": lambda: cc.findConvolutionBackwardFilterAlgorithm(handle, xd, yd, cd, wd, 16),
          "find_bwd_data": lambda: cc.findConvolutionBackwardDataAlgorithm(handle, wd, yd, cd, xd, 16)}[query]
    perf = fn()
    assert len(perf) >= 4 and {p.mathType for p in perf} == {cc.CUDNN_FMA_MATH}
    assert any(p.status == OK for p in perf)
