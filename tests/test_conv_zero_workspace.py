"""Every supported convolution has an algorithm that runs with no workspace (issue 13 item 8): CuPy 13's
``convolution_backward_filter`` with ``max_workspace_size=0`` raised "No available algorithm found"
for 2-D dilation 2 float32 and 3-D float16 problems.  ``convolution.algos.zero_workspace_algo`` designates
one algorithm per problem (IMPLICIT_GEMM / BWD_DATA_ALGO_0 / BWD_FILTER_ALGO_0, else the first the
002 tables support), the legacy layer marks its conv op ``zero_workspace`` and the engines honour it
(the cudnn engine takes only zero-workspace configs or declines; the cupy and reference engines need
no workspace).  So Get*_v7 and Find*Ex list it with status SUCCESS and memory 0, and calling the
convolution with it and a NULL workspace works.  CPU tests on the reference engine and the
pure-Python config selection; GPU tests through cupyx_cudnn with each engine forced."""
import itertools

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend.engines.base import EngineConfig
from cudnn_compat._backend.engines.cudnn_engine import configs as cfgsel
from cudnn_compat.convolution import algos as A
from cudnn_compat.cupy13 import cupyx_cudnn as X
from conv_util import ref_bwd_data, ref_bwd_filter, ref_conv

DT = {"float32": cc.CUDNN_DATA_FLOAT, "float64": cc.CUDNN_DATA_DOUBLE, "float16": cc.CUDNN_DATA_HALF}
NP = {"float32": np.float32, "float64": np.float64, "float16": np.float16}
TOL = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3}


# -- the designation covers every problem the tables support ------------------------------------------

def _problems():
    for nsp, wfmt, config, dil, stride, filt in itertools.product(
            (2, 3), ("NCHW", "NHWC"), sorted(A.ALL_FLOAT), (1, 2), (1, 2), ("3", "5", "1k")):
        r = {"3": (3,) * nsp, "5": (5,) * nsp, "1k": (1,) * (nsp - 1) + (4,)}[filt]
        for lay in ("NCHW", "NHWC"):
            xs, ws = (2, 8) + (12,) * nsp, (8, 8) + r
            ys = (2, 8) + tuple(1 + (12 + 2 - ((q - 1) * dil + 1)) // stride for q in r)

            def layout(dims):
                order = list(range(len(dims))) if lay == "NCHW" else [0] + list(range(2, len(dims))) + [1]
                st, acc = [0] * len(dims), 1
                for ax in reversed(order):
                    st[ax] = acc
                    acc *= dims[ax]
                return A.Layout(dims, tuple(st))
            yield A.Problem(config, wfmt, layout(xs), layout(ws), layout(ys), (1,) * nsp, (stride,) * nsp, (dil,) * nsp)


def test_every_problem_an_algorithm_supports_has_a_zero_workspace_algorithm():
    count = 0
    for p in _problems():
        for direction in ("FWD", "BWD_DATA", "BWD_FILTER"):
            any_ok = [a for a in A.PREFERENCE[direction] if A.unsupported(direction, a, p) is None]
            z = A.zero_workspace_algo(direction, p)
            if any_ok:
                count += 1
                assert z is not None and A.unsupported(direction, z, p) is None, (direction, p)
                if A.unsupported(direction, A.ZERO_WORKSPACE[direction], p) is None:
                    assert z == A.ZERO_WORKSPACE[direction]
            else:
                assert z is None
    assert count > 500


def test_the_two_reported_classes_designate_the_algo_0s():
    for p in _problems():
        two_d_dil = p.nsp == 2 and p.wfmt == "NCHW" and p.config == "FLOAT" and p.dilation == (2, 2) and \
            p.x.strides[-1] == 1
        three_d_half = p.nsp == 3 and p.wfmt == "NCHW" and p.config == "PSEUDO_HALF" and p.x.strides[-1] == 1
        if two_d_dil or three_d_half:
            assert A.zero_workspace_algo("BWD_FILTER", p) == "ALGO_0"
            assert A.zero_workspace_algo("BWD_DATA", p) == "ALGO_0"
            assert A.zero_workspace_algo("FWD", p) == "IMPLICIT_GEMM"


# -- the native config selection -------------------------------------------------------------------------

def cfg(index, *notes):
    return EngineConfig("cudnn", (), frozenset(notes), index)


def test_native_selection_of_a_zero_workspace_algorithm():
    cs = [cfg(7, "NONDETERMINISTIC"), cfg(1), cfg(4, "NONDETERMINISTIC"), cfg(0)]
    ws = {cs[0]: 4096, cs[1]: 1 << 20, cs[2]: 0, cs[3]: 0}
    algo = "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0"
    # zero-workspace configs only; a nondeterministic ALGO_0 keeps the atomics engines (the autotune picks)
    assert [c.index for c in cfgsel.for_algo(cs, algo, ws, zero_workspace=True)] == [4, 0]
    assert [c.index for c in cfgsel.for_algo(cs[:3], algo, ws, zero_workspace=True)] == [4]
    # a deterministic algorithm (IMPLICIT_GEMM): deterministic configs when there are any
    fwd = "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM"
    assert [c.index for c in cfgsel.for_algo(cs, fwd, ws, zero_workspace=True)] == [0]
    # unknown workspace counts as needing some; none left: the engine declines (the cupy engine runs it)
    assert cfgsel.for_algo(cs[:2], algo, ws, zero_workspace=True) == []
    assert cfgsel.for_algo(cs, algo, {}, zero_workspace=True) == []
    # without the designation the heuristics order is kept
    assert [c.index for c in cfgsel.for_algo(cs, algo, ws)] == [7, 1, 4, 0]


def test_mode_a_heuristics_are_followed_by_the_fallback_zero_workspace_configs(monkeypatch):
    """libcudnn 9.19's mode A lists only workspace-hungry TENSOR_CORE engines for a 3-D half backward
    filter; the FALLBACK heuristic's zero-workspace configs come after them, so the designated
    algorithm still has a native config (measured on the H100: engine 0, workspace 0)."""
    a = [(cfg(39, "TENSOR_CORE"), 15551), (cfg(10, "TENSOR_CORE"), 84895)]
    fb = [(cfg(1, "FALLBACK"), 312), (cfg(20, "FALLBACK", "NONDETERMINISTIC"), 0), (cfg(0, "FALLBACK"), 0),
          (cfg(39, "FALLBACK"), 0)]
    monkeypatch.setattr(cfgsel, "_query", lambda lib, g, mode: list(fb if mode == "FALLBACK" else a))

    class Lib:
        CudnnStatusError = RuntimeError
    got = cfgsel.query(Lib, None, "A")
    assert [(c.index, w) for c, w in got] == [(39, 15551), (10, 84895), (20, 0), (0, 0)]
    assert [(c.index, w) for c, w in cfgsel.query(Lib, None, "B")] == [(39, 15551), (10, 84895)]
    ws = dict(got)
    picked = cfgsel.for_algo([c for c, _ in got], "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0", ws, zero_workspace=True)
    assert [c.index for c in picked] == [20, 0]  # both zero-workspace engines (ALGO_0 may be nondeterministic)


# -- through the legacy API on the CPU place ---------------------------------------------------------------

CASES = [  # xshape, wshape, pad, stride, dilation, groups, dtype, compute
    ((2, 3, 9, 9), (4, 3, 3, 3), (2, 2), (1, 1), (2, 2), 1, "float32", "float32"),
    ((1, 2, 5, 6, 5), (3, 2, 2, 3, 2), (1, 0, 1), (1, 2, 1), (1, 1, 1), 1, "float16", "float32"),
    ((2, 4, 7, 6), (6, 2, 3, 3), (1, 1), (1, 2), (1, 1), 2, "float64", "float64"),
    ((2, 4, 8, 8), (4, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, "float16", "float16"),  # TRUE_HALF
]


def _setup(h, case, rng, xp=np):
    xs, ws, pad, st, dil, g, dtype, comp = case
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolutionNdDescriptor(cd, len(pad), list(pad), list(st), list(dil), cc.CUDNN_CROSS_CORRELATION,
                                       DT[comp])
    if g != 1:
        cc.cudnnSetConvolutionGroupCount(cd, g)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wd, DT[dtype], cc.CUDNN_TENSOR_NCHW, len(ws), list(ws))
    xd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptorEx(xd, cc.CUDNN_TENSOR_NCHW, DT[dtype], len(xs), list(xs))
    ys = tuple(cc.cudnnGetConvolutionNdForwardOutputDim(cd, xd, wd, len(xs)))
    yd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptorEx(yd, cc.CUDNN_TENSOR_NCHW, DT[dtype], len(ys), list(ys))
    x = rng.standard_normal(xs).astype(NP[dtype])
    w = rng.standard_normal(ws).astype(NP[dtype])
    dy = rng.standard_normal(ys).astype(NP[dtype])
    return cd, xd, wd, yd, x, w, dy, ys


def _zero(perfs):
    """The first SUCCESS result with memory 0 (Get/Find order)."""
    ok = [p for p in perfs if p.status == cc.CUDNN_STATUS_SUCCESS and p.memory == 0]
    assert ok, [(p.algo, p.status, p.memory) for p in perfs]
    return ok[0]


def _close(got, want, dtype, tol=None):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    tol = tol or TOL[dtype] * (20 if dtype == "float16" else 1)
    assert np.linalg.norm(got - want) <= tol * np.linalg.norm(want), np.abs(got - want).max()


@pytest.mark.parametrize("case", CASES, ids=["2d-dil2-fp32", "3d-fp16", "2d-groups-fp64", "2d-true-half"])
def test_get_and_find_list_a_zero_workspace_algorithm_that_runs_with_null_workspace(handle, rng, case):
    cd, xd, wd, yd, x, w, dy, ys = _setup(handle, case, rng)
    xs, ws, pad, st, dil, g, dtype, _ = case
    ref_y = ref_conv(x, w, pad, st, dil, g)
    ref_dx = ref_bwd_data(dy, w, xs, pad, st, dil, g)
    ref_dw = ref_bwd_filter(x, dy, ws, pad, st, dil, g)
    got = []
    # forward
    y = np.zeros(ys, NP[dtype])
    for perfs in (cc.cudnnGetConvolutionForwardAlgorithm_v7(handle, xd, wd, cd, yd, 20),
                  cc.cudnnFindConvolutionForwardAlgorithmEx(handle, xd, x, wd, w, cd, yd, y, 20, None, 0)):
        p = _zero(perfs)
        y[...] = np.nan
        cc.cudnnConvolutionForward(handle, 1.0, xd, x, wd, w, cd, p.algo, None, 0, 0.0, yd, y)
        _close(y, ref_y, dtype)
        got.append(p.algo)
    dx = np.zeros(xs, NP[dtype])
    for perfs in (cc.cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, wd, yd, cd, xd, 20),
                  cc.cudnnFindConvolutionBackwardDataAlgorithmEx(handle, wd, w, yd, dy, cd, xd, dx, 20, None, 0)):
        p = _zero(perfs)
        dx[...] = np.nan
        cc.cudnnConvolutionBackwardData(handle, 1.0, wd, w, yd, dy, cd, p.algo, None, 0, 0.0, xd, dx)
        _close(dx, ref_dx, dtype)
    dw = np.zeros(ws, NP[dtype])
    for perfs in (cc.cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, xd, yd, cd, wd, 20),
                  cc.cudnnFindConvolutionBackwardFilterAlgorithmEx(handle, xd, x, yd, dy, cd, wd, dw, 20, None, 0)):
        p = _zero(perfs)
        assert p.status == cc.CUDNN_STATUS_SUCCESS == perfs[0].status  # Find*Ex: a SUCCESS result comes first
        dw[...] = np.nan
        cc.cudnnConvolutionBackwardFilter(handle, 1.0, xd, x, yd, dy, cd, p.algo, None, 0, 0.0, wd, dw)
        _close(dw, ref_dw, dtype)
        assert cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, xd, yd, cd, wd, p.algo) == 0


def test_the_designated_conv_op_is_marked_and_no_other(handle, rng):
    from cudnn_compat._backend import planner
    case = CASES[0]
    cd, xd, wd, yd, x, w, dy, ys = _setup(handle, case, rng)
    graphs, orig = [], planner.make_plan

    def spy(graph, *a, **k):
        graphs.append(graph)
        return orig(graph, *a, **k)
    planner.make_plan = spy
    cc.plan_cache_clear()
    try:
        dw = np.zeros(case[1], np.float32)
        for algo in (cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1):
            cc.cudnnConvolutionBackwardFilter(handle, 1.0, xd, x, yd, dy, cd, algo, None, 0, 0.0, wd, dw)
    finally:
        planner.make_plan = orig
    marks = {op.attrs["algo"]: op.attrs["zero_workspace"] for g in graphs for op in g.ops
             if op.kind == "ConvolutionBackwardFilter"}
    assert marks == {"CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0": True, "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1": False}


# -- CuPy 13's helpers with max_workspace_size=0 ------------------------------------------------------------

HELPER_CASES = [  # the two classes of CuPy 13.6.0's failing cases
    ((2, 3, 9, 9), (4, 3, 3, 3), (2, 2), (1, 1), (2, 2), "float32"),
    ((2, 2, 5, 6, 5), (3, 2, 2, 3, 2), (1, 0, 1), (1, 1, 1), (1, 1, 1), "float16"),
]


def _helpers(xp, case, rng, auto_tune, deterministic):
    xs, ws, pad, st, dil, dtype = case
    x = xp.asarray(rng.standard_normal(xs).astype(NP[dtype]))
    W = xp.asarray(rng.standard_normal(ws).astype(NP[dtype]))
    ys = (xs[0], ws[0]) + tuple(1 + (s + 2 * p - ((r - 1) * d + 1)) // u
                                for s, r, p, u, d in zip(xs[2:], ws[2:], pad, st, dil))
    gy = xp.asarray(rng.standard_normal(ys).astype(NP[dtype]))
    y, gx, gW = xp.zeros(ys, NP[dtype]), xp.zeros(xs, NP[dtype]), xp.zeros(ws, NP[dtype])
    old = X.get_max_workspace_size()
    X.set_max_workspace_size(0)
    try:
        X.convolution_backward_filter(x, gy, gW, pad, st, dil, 1, deterministic=deterministic, auto_tune=auto_tune,
                                      tensor_core="auto")
        X.convolution_forward(x, W, None, y, pad, st, dil, 1, auto_tune=auto_tune, tensor_core="auto")
        X.convolution_backward_data(W, gy, None, gx, pad, st, dil, 1, deterministic=deterministic,
                                    auto_tune=auto_tune, tensor_core="auto")
    finally:
        X.set_max_workspace_size(old)
    host = (lambda a: a) if xp is np else (lambda a: a.get())
    x, W, gy = host(x), host(W), host(gy)
    return {"gW": (host(gW), ref_bwd_filter(x, gy, ws, pad, st, dil)), "y": (host(y), ref_conv(x, W, pad, st, dil)),
            "gx": (host(gx), ref_bwd_data(gy, W, xs, pad, st, dil))}


@pytest.fixture
def fresh_algorithm_caches():
    for c in (X._get_algorithm_fwd_cache, X._get_algorithm_bwd_filter_cache, X._get_algorithm_bwd_data_cache,
              X._algorithm_fwd_cache, X._algorithm_bwd_filter_cache, X._algorithm_bwd_data_cache):
        c.clear()
    cc.plan_cache_clear()
    yield
    cc.plan_cache_clear()


@pytest.mark.parametrize("case", HELPER_CASES, ids=["2d-dil2-fp32", "3d-fp16"])
@pytest.mark.parametrize("auto_tune, deterministic", [(False, False), (True, False), (False, True)])
def test_cupy13_helpers_with_no_workspace_on_the_cpu(monkeypatch, fresh_algorithm_caches, rng, case, auto_tune,
                                                     deterministic):
    monkeypatch.setenv("CUDNN_COMPAT_DEVICE", "cpu")
    for name, (got, want) in _helpers(np, case, rng, auto_tune, deterministic).items():
        _close(got, want, case[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("engine", [None, "cudnn", "cupy"], ids=["auto", "cudnn", "cupy"])
@pytest.mark.parametrize("case", HELPER_CASES, ids=["2d-dil2-fp32", "3d-fp16"])
@pytest.mark.parametrize("auto_tune, deterministic", [(False, False), (True, False), (False, True)])
def test_cupy13_helpers_with_no_workspace_on_the_gpu(monkeypatch, fresh_algorithm_caches, rng, case, auto_tune,
                                                     deterministic, engine):
    """CuPy 13.6.0's failing classes, through the helpers its tests call, with each engine forced:
    the cudnn engine must find a zero-workspace config for the designated algorithm."""
    import cupy
    monkeypatch.delenv("CUDNN_COMPAT_DEVICE", raising=False)
    if engine:
        monkeypatch.setenv("CUDNN_COMPAT_ENGINE", engine)
    res = _helpers(cupy, case, rng, auto_tune, deterministic)
    for name, (got, want) in res.items():  # DEFAULT_MATH: TF32 is permitted for float32 (math_policy)
        _close(got, want, case[-1], tol=5e-3 if case[-1] == "float32" else None)
