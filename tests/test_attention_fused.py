"""Multi-head attention through cuDNN's fused flash attention (issue 24 item 1; 000 "Fused Flash
Attention fprop/bprop"; ``cudnn_compat.attention.fused``, ``cudnn_engine.sdpa``).

CPU: which windows form a band, which calls the fused path declines and why (the reason
recorded as the plan's first decline), the reserve-space regions, the backend op pattern of
the SDPA graphs.  GPU: the three calls through the fused path against the reference engine on
a CPU handle (fp16, padding, causal and sliding-window bands, residuals, WGRAD ADD, layouts),
asserting the engine that ran; a call outside the fused engine's reach falls back and names
the reason."""
import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat.attention import fused
from cudnn_compat.attention.descriptor import _reserve_size, fused_regions
from cudnn_compat._backend.engines.cudnn_engine import sdpa
from test_attention import B, BEAM, F16, F32, T, V, Setup
from test_attention_gpu import CONFIGS, compare, gpu, run_all  # noqa: F401 (gpu: the fixture)

BIG = 2 ** 31 - 1


def _windows(kind, tq, w=3):
    t = np.arange(tq)
    if kind == "full":
        return np.zeros(tq, np.int32), np.full(tq, BIG, np.int32)
    if kind == "causal":
        return np.zeros(tq, np.int32), (t + 1).astype(np.int32)
    return np.maximum(t - w + 1, 0).astype(np.int32), (t + 1).astype(np.int32)


BASE = dict(nh=2, sizes=(16, 16, 16), proj=(8, 8, 8, 16), nb=3, tq=12, tk=12)
CASES = {
    "full": dict(),
    "padding": dict(len_q=[12, 7, 3], len_k=[12, 5, 9]),
    "causal": dict(win="causal"),
    "padding_causal": dict(win="causal", len_q=[12, 7, 3], len_k=[10, 12, 4]),
    "sliding_window": dict(win="window", len_q=[12, 9, 4], len_k=[12, 9, 4]),
    "cross_lengths_time_major": dict(tk=20, axes=(T, B, BEAM, V), len_q=[12, 5, 1], len_k=[20, 3, 11]),
    "beams_one_to_one": dict(nb=2, nbeam=2, one_to_one=True, axes=(B, BEAM, T, V), len_q=[[12, 4], [6, 12]],
                             len_k=[[12, 3], [12, 8]]),
    "head_dims_16_no_o_proj": dict(proj=(16, 16, 16, 0)),
}


# -- CPU: the decision -------------------------------------------------------------------------------

@pytest.mark.parametrize("lo, hi, tk, want", [
    ([0, 0, 0], [BIG, BIG, BIG], 4, fused.Band()),
    ([-5, 0, 0], [4, 9, 4], 4, fused.Band()),  # clipped to [0, tk]: all full
    ([0, 0, 0], [1, 2, 3], 4, fused.Band(causal=True)),
    ([0, 0, 0, 0, 0], [1, 2, 3, 3, 3], 3, fused.Band(causal=True)),  # more queries than keys
    ([0, 0, 1, 2], [1, 2, 3, 4], 4, fused.Band(causal=True, window=2)),
    ([-1, 0, 1, 2], [1, 2, 3, 4], 4, fused.Band(causal=True, window=2)),
])
def test_band_of_bands(lo, hi, tk, want):
    assert fused.band_of(np.array(lo), np.array(hi), tk) == want


@pytest.mark.parametrize("lo, hi, words", [
    ([0, 1, 3, 2], [2, 4, 3, 5], "hiWinIdx"),  # test_attention_gpu's "windows" configuration
    ([0, 0, 0], [2, 3, 4], "hiWinIdx"),  # a band shifted right: not taken
    ([0, 1, 1], [1, 2, 3], "loWinIdx"),  # lower bounds that no window length gives
])
def test_band_of_names_what_is_not_a_band(lo, hi, words):
    why = fused.band_of(np.array(lo), np.array(hi), 4)
    assert isinstance(why, str) and words in why


def test_empty_rows():
    none, win = fused.Band(), fused.Band(causal=True, window=2)
    assert fused.empty_rows(none, np.array([3, 2]), np.array([0, 2]))  # a valid row, no keys
    assert not fused.empty_rows(none, np.array([0, 2]), np.array([0, 2]))  # no valid rows there
    assert fused.empty_rows(win, np.array([5]), np.array([2]))  # row 4 sees keys 3..4, none below 2
    assert not fused.empty_rows(win, np.array([3]), np.array([2]))  # row 2 sees key 1


class _A:
    """The attention descriptor fields static_reason reads."""

    def __init__(self, dtype="float16", proj=(64, 64, 64), heads=8):
        self.dtype = dtype
        self.qProjSize, self.kProjSize, self.vProjSize = proj
        self.nHeads = heads


@pytest.mark.parametrize("a, place, forced, beams, one_step, words", [
    (_A(), "cpu", None, (1, 1), False, "CPU place"),
    (_A(), "gpu", "cupy", (1, 1), False, "forces the cupy engine"),
    (_A("float32"), "gpu", None, (1, 1), False, "float32 data"),
    (_A("float64"), "gpu", None, (1, 1), False, "float64 data"),
    (_A(proj=(0, 0, 0)), "gpu", None, (1, 1), False, "without a projection"),
    (_A(proj=(12, 12, 12)), "gpu", None, (1, 1), False, "qProjSize=12"),
    (_A(proj=(64, 64, 136)), "gpu", None, (1, 1), False, "vProjSize=136"),
    (_A(), "gpu", None, (1, 1), True, "currIdx"),
    (_A(), "gpu", None, (2, 1), False, "ALL_TO_ONE"),
])
def test_static_reason(a, place, forced, beams, one_step, words):
    why = fused.static_reason(a, place, forced, beams[0], beams[1], one_step)
    assert why is not None and words in why


def test_static_reason_takes_the_issue_shape():
    assert fused.static_reason(_A(), "gpu", None, 1, 1, False) is None
    assert fused.static_reason(_A(), "gpu", "cudnn", 2, 2, False) is None


def test_reserve_regions_follow_the_mask_and_do_not_overlap():
    cpu = cc.cudnnCreate("cpu")
    s = Setup(cpu, np.random.default_rng(0), dtype=F16, nh=2, sizes=(16, 16, 16), proj=(8, 8, 8, 16), tq=5, tk=7)
    a = cc.attention.descriptor.attn_desc(s.attn)
    n, tq, tk = 6, 5, 7
    regions = fused_regions(a, n, tq, tk)
    assert set(regions) == {"qp", "kp", "vp", "o", "stats", "dqp", "dkp", "dvp"}
    spans = sorted((off, off + cnt * (4 if name == "stats" else 2)) for name, (off, cnt) in regions.items())
    assert spans[0][0] >= n * tq * tk * 4  # after the graph path's float mask
    assert all(e <= s2 for (_, e), (s2, _) in zip(spans, spans[1:]))
    assert all(off % 256 == 0 for off, _ in regions.values())
    assert _reserve_size(a, 2, 3, tq, tk) >= spans[-1][1]
    assert regions["qp"][1] == n * tq * 2 * 8 and regions["stats"][1] == n * 2 * tq
    f = Setup(cpu, np.random.default_rng(0), dtype=F32, nh=2, sizes=(16, 16, 16), proj=(8, 8, 8, 16), tq=5, tk=7)
    af = cc.attention.descriptor.attn_desc(f.attn)
    assert fused_regions(af, n, tq, tk) == {}  # FLOAT never runs fused: the reserve holds the mask only
    assert _reserve_size(af, 2, 3, tq, tk) == -(-(n * tq * tk * 4) // 16) * 16
    cc.cudnnDestroy(cpu)


# -- CPU: the backend graphs (cudnn-frontend's SDPA pattern) -------------------------------------------

def _sdpa(**kw):
    st = (64 * 2 * 16, 16, 2 * 16, 1)
    return sdpa.Sdpa(3, 2, 64, 64, 16, 16, st, st, st, st, **kw)


def _kinds(g):
    return [(k, a.get("mode")) for k, a in g.ops]


@pytest.mark.parametrize("padding, causal, window", [(False, False, 0), (True, False, 0), (False, True, 0),
                                                     (True, True, 4)])
def test_fprop_graph_pattern(padding, causal, window):
    g = sdpa.fprop_graph(_sdpa(padding=padding, causal=causal, window=window))
    kinds = _kinds(g)
    assert kinds[:2] == [("matmul", None), ("pointwise", "MUL")]
    assert kinds[-8:] == [("reduction", "MAX"), ("pointwise", "SUB"), ("pointwise", "EXP"), ("reduction", "ADD"),
                          ("pointwise", "LOG"), ("pointwise", "ADD"), ("pointwise", "DIV"), ("matmul", None)]
    selects = sum(1 for k in kinds if k == ("pointwise", "BINARY_SELECT"))
    assert selects == padding + causal + bool(window)
    t = g.tensors
    assert t[sdpa.K].dims == (3, 2, 16, 64) and t[sdpa.K].strides == (64 * 32, 16, 1, 32)  # Kᵀ by strides
    assert t[sdpa.STATS].dtype == "float32" and t[sdpa.STATS].dims == (3, 2, 64, 1)
    mm = [a for k, a in g.ops if k == "matmul"]
    assert (mm[0]["m"], mm[0]["n"]) == ((sdpa.SEQ_Q, sdpa.SEQ_KV) if padding else (None, None))
    for k, a in g.ops:  # every mask is made of index comparisons, and selects the masked value
        if k == "pointwise" and a["mode"] == "BINARY_SELECT":
            assert a["b"] == sdpa.NEG and t[a["t"]].dtype == "bool"
        if k == "pointwise" and a["mode"] == "GEN_INDEX":
            assert a["axis"] in (2, 3) and t[a["y"]].dtype == "int32"
    prob = [a for k, a in g.ops if a.get("mode") == "DIV"][0]["y"]
    assert t[prob].dtype == "float16"  # P feeds the second matmul in the I/O type


def test_bprop_graph_pattern():
    g = sdpa.bprop_graph(_sdpa(padding=True, causal=True))
    kinds = _kinds(g)
    assert kinds.count(("matmul", None)) == 5  # S, dV, dP, dK, dQ
    assert kinds.count(("reshape", None)) == 3  # Pᵀ, dSᵀ, K from Kᵀ
    t = g.tensors
    assert not t[sdpa.SSUM].virtual and t[sdpa.SSUM].dtype == "float32"
    outs = {a.get("c", a.get("y")) for _, a in g.ops}
    assert {sdpa.DQ, sdpa.DK, sdpa.DV, sdpa.SSUM} <= outs
    assert not t[sdpa.DQ_ACC].virtual and t[sdpa.DQ_ACC].dtype == "float32"  # dQ through the accumulator
    prod = next(a["y"] for k, a in g.ops if k == "pointwise" and a["x"] == sdpa.DO)  # dO*O: the frontend's strides
    b, h, sq, dv = t[prod].dims
    assert t[prod].strides == (h * sq * dv, sq * dv, h * dv, 1)


def test_pre_declines_lead_the_plan_declines():
    """The mechanism explain reads: a reason the caller gives the graph is the plan's first decline."""
    from cudnn_compat._backend import planner
    from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor
    x = Tensor(1, (1, 4), (4, 1), "float32")
    y = Tensor(2, (1, 4), (4, 1), "float32")
    g = OperationGraph([Operation("Pointwise", {"x": x}, {"y": y}, {"mode": "IDENTITY"})])
    g.pre_declines = ((fused.ENGINE, "why not"),)
    plan = planner.make_plan(g, "cpu")
    assert plan.declines[0] == (fused.ENGINE, "why not")


class _GpuHandle:
    place, device, stream = "gpu", 0, None


@pytest.mark.parametrize("name, kw, words", [
    ("head size 3", dict(CONFIGS["beam_all_to_one_padded"]), "qProjSize=3"),
    ("windows", dict(BASE, tq=4, tk=5, lo=[0, 1, 3, 2], hi=[2, 4, 3, 5]), "hiWinIdx"),
    ("empty row", dict(BASE, len_q=[12, 7, 3], len_k=[12, 0, 9]), "no key in its window"),
])
def test_the_calls_decision_on_real_descriptors(name, kw, words):
    """``compute._fused_core`` (what each call asks before its graph path) on a GPU-place handle:
    the reason it returns is the one ``_run`` puts first in the plan's declines."""
    from cudnn_compat.attention import compute
    cpu = cc.cudnnCreate("cpu")
    s = Setup(cpu, np.random.default_rng(3), dtype=F16, math=cc.CUDNN_TENSOR_OP_MATH, **kw)
    desc = cc.attention.descriptor
    a, q, k = desc.attn_desc(s.attn), desc.seq_desc(s.qd, "qDesc"), desc.seq_desc(s.kd, "kDesc")
    c, plan, why = compute._fused_core(_GpuHandle(), a, q, k, s.lo.astype(np.int64), s.hi.astype(np.int64), False,
                                       None)
    assert c is None and plan is None and words in why, why
    c, plan, why = compute._fused_core(_CpuHandle(), a, q, k, s.lo, s.hi, False, None)
    assert (c, plan, why) == (None, None, None)  # the CPU place never asks
    cc.cudnnDestroy(cpu)


def test_the_calls_decision_takes_the_issue_shape_class():
    from cudnn_compat.attention import compute
    cpu = cc.cudnnCreate("cpu")
    s = Setup(cpu, np.random.default_rng(3), dtype=F16, math=cc.CUDNN_TENSOR_OP_MATH,
              **dict(BASE, len_q=[12, 7, 3], len_k=[12, 5, 9]))
    desc = cc.attention.descriptor
    a, q, k = desc.attn_desc(s.attn), desc.seq_desc(s.qd, "qDesc"), desc.seq_desc(s.kd, "kDesc")
    lo, hi = _windows("causal", 12)
    c, plan, why = compute._fused_core(_GpuHandle(), a, q, k, lo.astype(np.int64), hi.astype(np.int64), False, None)
    assert why is None and c.padding and c.band == fused.Band(causal=True)
    assert (c.sdpa.b, c.sdpa.h, c.sdpa.sq, c.sdpa.dqk) == (3, 2, 12, 8)
    assert c.sdpa.q == (12 * 2 * 8, 8, 2 * 8, 1)  # heads interleaved (BSHD), as the projection GEMM writes them
    cc.cudnnDestroy(cpu)


class _CpuHandle:
    place, device, stream = "cpu", 0, None


# -- GPU ---------------------------------------------------------------------------------------------

def _setup(cpu, name, seed=11):
    kw = dict(BASE)
    kw.update(CASES[name])
    win = kw.pop("win", "full")
    kw["lo"], kw["hi"] = _windows(win, kw["tq"])
    return Setup(cpu, np.random.default_rng(seed), dtype=F16, math=cc.CUDNN_TENSOR_OP_MATH, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("residual, add", [(False, False), (True, True)])
def test_gpu_fused_three_calls_match_the_reference(gpu, name, residual, add):
    h, cupy = gpu
    cpu = cc.cudnnCreate("cpu")
    s = _setup(cpu, name)
    residual = residual and "r" in s.bufs
    want, _ = run_all(cpu, s, lambda x: x.copy(), lambda x: x, residual=residual, add=add)
    got, engines = run_all(h, s, cupy.asarray, lambda x: x.get(), residual=residual, add=add)
    assert engines == ["cudnn"] * 3, engines  # forward, BackwardData (the SDPA bprop graph), BackwardWeights
    assert cc._core.call.last_plan().config.startswith("sdpa")
    compare(got, want, F16)
    cc.cudnnDestroy(cpu)


@pytest.mark.gpu
def test_gpu_backward_data_runs_the_sdpa_bprop_graph(gpu):
    """BackwardData after a fused forward runs cuDNN's SDPA bprop engine (its plan finalizes with
    the heuristics' knob choices)."""
    h, cupy = gpu
    cpu = cc.cudnnCreate("cpu")
    s = _setup(cpu, "padding_causal")
    d = {n: cupy.asarray(x) for n, x in s.bufs.items()}
    w, res = cupy.asarray(s.wbuf), cupy.zeros(s.rsize, cupy.uint8)
    out = cupy.zeros(int(np.prod(s.out_shape)), cupy.float16)
    cc.cudnnMultiHeadAttnForward(h, s.attn, -1, s.lo, s.hi, None, None, s.qd, d["q"], None, s.kd, d["k"], s.vd, d["v"],
                                 s.od, out, s.wsize, w, 0, None, s.rsize, res)
    assert cc._core.call.last_plan().engine == "cudnn"
    g = {n: cupy.zeros(s.bufs[n].size, cupy.float16) for n in "qkv"}
    cc.cudnnMultiHeadAttnBackwardData(h, s.attn, s.lo, s.hi, None, None, s.od, out, s.qd, g["q"], d["q"], s.kd, g["k"],
                                      d["k"], s.vd, g["v"], d["v"], s.wsize, w, 0, None, s.rsize, res)
    plan = cc._core.call.last_plan()
    assert (plan.engine, plan.config[:10]) == ("cudnn", "sdpa bprop"), (plan.engine, plan.config, plan.declines)
    cc.cudnnDestroy(cpu)


@pytest.mark.gpu
def test_gpu_fused_forward_inference_and_repeat(gpu):
    h, cupy = gpu
    cpu = cc.cudnnCreate("cpu")
    s = _setup(cpu, "padding_causal")
    want = s.forward()
    d = {n: cupy.asarray(x) for n, x in s.bufs.items()}
    w = cupy.asarray(s.wbuf)
    for _ in range(2):
        out = cupy.full(want.size, np.nan, np.float16)
        cc.cudnnMultiHeadAttnForward(h, s.attn, -1, s.lo, s.hi, None, None, s.qd, d["q"], None, s.kd, d["k"], s.vd,
                                     d["v"], s.od, out, s.wsize, w, 0, None, 0, None)
        plan = cc._core.call.last_plan()
        assert (plan.engine, plan.config[:10]) == ("cudnn", "sdpa fprop")
        compare({"out": out.get()}, {"out": want}, F16)
    cc.cudnnDestroy(cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("kw, words", [
    (dict(lo=[0, 1, 3, 2], hi=[2, 4, 3, 5], tq=4, tk=5), "hiWinIdx"),
    (dict(proj=(12, 12, 12, 16)), "qProjSize=12"),
    (dict(dtype=F32), "float32 data"),
])
def test_gpu_outside_the_fused_engine_falls_back_and_names_why(gpu, kw, words):
    h, cupy = gpu
    cpu = cc.cudnnCreate("cpu")
    args = dict(BASE, math=cc.CUDNN_TENSOR_OP_MATH if kw.get("dtype", F16) == F16 else cc.CUDNN_DEFAULT_MATH)
    args.update(dtype=F16)
    args.update(kw)
    s = Setup(cpu, np.random.default_rng(3), **args)
    want, _ = run_all(cpu, s, lambda x: x.copy(), lambda x: x)
    got, engines = run_all(h, s, cupy.asarray, lambda x: x.get())
    assert engines == ["cupy"] * 3, engines
    compare(got, want, s.dtype)
    d = {n: cupy.asarray(x) for n, x in s.bufs.items()}
    out = cupy.zeros(int(np.prod(s.out_shape)), d["q"].dtype)
    cc.cudnnMultiHeadAttnForward(h, s.attn, -1, s.lo, s.hi, None, None, s.qd, d["q"], None, s.kd, d["k"], s.vd, d["v"],
                                 s.od, out, s.wsize, cupy.asarray(s.wbuf), 0, None, 0, None)
    declines = cc._core.call.last_plan().declines
    assert declines and declines[0][0] == fused.ENGINE and words in declines[0][1], declines
    cc.cudnnDestroy(cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["full", "padding_causal", "head_dims_16_no_o_proj"])
def test_gpu_repeated_calls_replay_cuda_graphs_that_read_the_current_data(gpu, name):
    """The same three calls on the same device buffers, four times, with new inputs, weights and
    dout written into those buffers before each step: the second step captures each call into a
    CUDA graph and the later ones replay it; every step matches the reference of its own data."""
    h, cupy = gpu
    cpu = cc.cudnnCreate("cpu")
    s = _setup(cpu, name)
    rng = np.random.default_rng(21)
    d = {n: cupy.asarray(x) for n, x in s.bufs.items()}
    w, res = cupy.asarray(s.wbuf), cupy.zeros(s.rsize, cupy.uint8)
    out = cupy.zeros(int(np.prod(s.out_shape)), cupy.float16)
    g = {n: cupy.zeros(s.bufs[n].size, cupy.float16) for n in "qkv"}
    dw, dd = cupy.zeros_like(w), cupy.zeros(out.size, cupy.float16)
    before = {k for k, v in fused._GRAPHS.items() if isinstance(v, fused._Graph)}
    for step in range(4):
        for n in s.bufs:
            s.bufs[n][...] = rng.standard_normal(s.bufs[n].shape).astype(s.bufs[n].dtype)
            d[n].set(s.bufs[n])
        s.wbuf[...] = (s.wbuf * rng.uniform(0.5, 1.5, s.wbuf.shape)).astype(s.wbuf.dtype)
        w.set(s.wbuf)
        dout = rng.standard_normal(out.size).astype(np.float16)
        dd.set(dout)
        want, _ = run_all(cpu, s, lambda x: x.copy(), lambda x: x, dout=dout)
        cc.cudnnMultiHeadAttnForward(h, s.attn, -1, s.lo, s.hi, None, None, s.qd, d["q"], None, s.kd, d["k"], s.vd,
                                     d["v"], s.od, out, s.wsize, w, 0, None, s.rsize, res)
        cc.cudnnMultiHeadAttnBackwardData(h, s.attn, s.lo, s.hi, None, None, s.od, dd, s.qd, g["q"], d["q"], s.kd,
                                          g["k"], d["k"], s.vd, g["v"], d["v"], s.wsize, w, 0, None, s.rsize, res)
        cc.cudnnMultiHeadAttnBackwardWeights(h, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, d["q"], s.kd, d["k"], s.vd,
                                             d["v"], s.od, dd, s.wsize, w, dw, 0, None, s.rsize, res)
        got = {"out": out.get(), "dq": g["q"].get(), "dk": g["k"].get(), "dv": g["v"].get(), "dw": dw.get()}
        compare(got, want, F16)
    graphs = {k[2] for k, v in fused._GRAPHS.items() if isinstance(v, fused._Graph) and k not in before}
    assert graphs == {"fwd", "bwd_data", "bwd_weights"}, fused._GRAPHS
    cc.cudnnDestroy(cpu)
