"""The cached call path on a GPU handle (issue 14 item 3): launch records of the cupy engine
(cudnn_compat/_backend/engines/cupy_engine/records.py), the generated binder (cudnn_compat/_core/fastbind.py) and
the per-signature memo of the legacy functions (cudnn_compat/_core/memo.py).

On the CPU the GPU place is emulated (tests/host_emu.py): raw pointers, records and binders run
for real and kernels run on the CPU kernel emulator, so the numbers are checked against the
reference engine on a CPU handle.  What is checked: a record is made once and reused (the same
objects, no new record on later calls); results follow changed buffers (pointer slots patched in
place) and changed alpha/beta (scalar slots patched); an input overlapping a guarded output
takes the steps (they copy it); bad input is still BAD_PARAM with its message after a signature
is cached; the memo does not grow with descriptors re-created per call.  The ``gpu`` tests run
every family of the benchmark (benchmarks/host_overhead.py) twice on the device, the second time
through its record, against the reference engine.
"""
from __future__ import annotations

import dis
import sys
import threading

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

S = (2, 8, 5, 6)  # N, C, H, W
P = (2, 8, 3, 3)  # max pool 3x3 / 2, pad 1
F32 = cc.CUDNN_DATA_FLOAT


# -- the families: (inputs, outputs, call(handle, buffers, alpha, beta)) ------------------------------------

def _act(rng):
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    return ad


def case_act_fwd(rng):
    xd, ad = tdesc(S), _act(rng)
    return ({"x": rng.standard_normal(S)}, {"y": rng.standard_normal(S)},
            lambda h, b, a, be: cc.cudnnActivationForward(h, ad, a, xd, b["x"], be, xd, b["y"]))


def case_act_bwd(rng):
    xd, ad = tdesc(S), _act(rng)
    return ({"x": rng.standard_normal(S), "y": np.abs(rng.standard_normal(S)), "dy": rng.standard_normal(S)},
            {"dx": rng.standard_normal(S)},
            lambda h, b, a, be: cc.cudnnActivationBackward(h, ad, a, xd, b["y"], xd, b["dy"], xd, b["x"], be, xd, b["dx"]))


def case_add_tensor(rng):
    bd, cd = tdesc((1, 8, 1, 1)), tdesc(S)
    return ({"b": rng.standard_normal((1, 8, 1, 1))}, {"c": rng.standard_normal(S)},
            lambda h, b, a, be: cc.cudnnAddTensor(h, a, bd, b["b"], be, cd, b["c"]))


def case_op_tensor(rng):
    d = tdesc(S)
    od = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(od, cc.CUDNN_OP_TENSOR_MUL, F32, cc.CUDNN_NOT_PROPAGATE_NAN)
    return ({"a": rng.standard_normal(S), "b": rng.standard_normal(S)}, {"c": rng.standard_normal(S)},
            lambda h, b, a, be: cc.cudnnOpTensor(h, od, a, d, b["a"], 0.75, d, b["b"], be, d, b["c"]))


def case_reduce_tensor(rng):
    ad, cd = tdesc(S), tdesc((1, 8, 1, 1))
    rd = cc.cudnnCreateReduceTensorDescriptor()
    cc.cudnnSetReduceTensorDescriptor(rd, cc.CUDNN_REDUCE_TENSOR_ADD, F32, cc.CUDNN_NOT_PROPAGATE_NAN,
                                      cc.CUDNN_REDUCE_TENSOR_NO_INDICES, cc.CUDNN_32BIT_INDICES)

    def call(h, b, a, be):
        n = cc.cudnnGetReductionWorkspaceSize(h, rd, ad, cd)
        cc.cudnnReduceTensor(h, rd, None, 0, b["ws"] if n else None, n, a, ad, b["a"], be, cd, b["c"])
    return {"a": rng.standard_normal(S), "ws": np.zeros(4096, np.uint8)}, {"c": rng.standard_normal((1, 8, 1, 1))}, call


def case_softmax_fwd(rng):
    d = tdesc(S)
    return ({"x": rng.standard_normal(S)}, {"y": rng.standard_normal(S)},
            lambda h, b, a, be: cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, a,
                                                       d, b["x"], be, d, b["y"]))


def case_softmax_bwd(rng):
    d = tdesc(S)
    y = rng.uniform(0.0, 1.0, S)
    return ({"y": y, "dy": rng.standard_normal(S)}, {"dx": rng.standard_normal(S)},
            lambda h, b, a, be: cc.cudnnSoftmaxBackward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, a,
                                                        d, b["y"], d, b["dy"], be, d, b["dx"]))


def _pool():
    pd = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pd, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2)
    return pd


def case_pool_fwd(rng):
    xd, yd, pd = tdesc(S), tdesc(P), _pool()
    return ({"x": rng.standard_normal(S)}, {"y": rng.standard_normal(P)},
            lambda h, b, a, be: cc.cudnnPoolingForward(h, pd, a, xd, b["x"], be, yd, b["y"]))


def case_pool_bwd(rng):
    xd, yd, pd = tdesc(S), tdesc(P), _pool()
    x = rng.standard_normal(S).astype(np.float32)
    h0 = cc.cudnnCreate("cpu")
    y = np.zeros(P, np.float32)
    cc.cudnnPoolingForward(h0, pd, 1.0, xd, x, 0.0, yd, y)  # y consistent with x (the max positions)
    return ({"x": x, "y": y, "dy": rng.standard_normal(P)}, {"dx": rng.standard_normal(S)},
            lambda h, b, a, be: cc.cudnnPoolingBackward(h, pd, a, yd, b["y"], yd, b["dy"], xd, b["x"], be, xd, b["dx"]))


def _bn_param(rng):
    return {"scale": rng.uniform(0.5, 1.5, 8), "bias": rng.standard_normal(8)}


def case_bn_train(rng):
    xd, pd = tdesc(S), tdesc((1, 8, 1, 1))
    mode = cc.CUDNN_BATCHNORM_SPATIAL
    return ({"x": rng.standard_normal(S) * 2 + 1, **_bn_param(rng)},
            {"y": rng.standard_normal(S), "rm": rng.standard_normal(8), "rv": rng.uniform(0.5, 1.5, 8),
             "sm": np.zeros(8), "si": np.zeros(8)},
            lambda h, b, a, be: cc.cudnnBatchNormalizationForwardTraining(
                h, mode, a, be, xd, b["x"], xd, b["y"], pd, b["scale"], b["bias"], 0.25, b["rm"], b["rv"], 1e-4,
                b["sm"], b["si"]))


def case_bn_inf(rng):
    xd, pd = tdesc(S), tdesc((1, 8, 1, 1))
    return ({"x": rng.standard_normal(S), "m": rng.standard_normal(8), "v": rng.uniform(0.5, 1.5, 8), **_bn_param(rng)},
            {"y": rng.standard_normal(S)},
            lambda h, b, a, be: cc.cudnnBatchNormalizationForwardInference(
                h, cc.CUDNN_BATCHNORM_SPATIAL, a, be, xd, b["x"], xd, b["y"], pd, b["scale"], b["bias"], b["m"],
                b["v"], 1e-5))


def case_bn_bwd(rng):
    xd, pd = tdesc(S), tdesc((1, 8, 1, 1))
    return ({"x": rng.standard_normal(S), "dy": rng.standard_normal(S), "scale": rng.uniform(0.5, 1.5, 8),
             "sm": rng.standard_normal(8) * 0.1, "si": rng.uniform(0.5, 1.5, 8)},
            {"dx": rng.standard_normal(S), "ds": rng.standard_normal(8), "db": rng.standard_normal(8)},
            lambda h, b, a, be: cc.cudnnBatchNormalizationBackward(
                h, cc.CUDNN_BATCHNORM_SPATIAL, a, be, 0.5 * a, be, xd, b["x"], xd, b["dy"], xd, b["dx"], pd, b["scale"],
                b["ds"], b["db"], 1e-5, b["sm"], b["si"]))


def case_lrn(rng):
    d = tdesc(S)
    ld = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(ld, 5, 1e-2, 0.75, 2.0)
    return ({"x": rng.standard_normal(S)}, {"y": rng.standard_normal(S)},
            lambda h, b, a, be: cc.cudnnLRNCrossChannelForward(h, ld, cc.CUDNN_LRN_CROSS_CHANNEL_DIM1, a, d, b["x"], be,
                                                               d, b["y"]))


def case_dropout(rng):
    d = tdesc(S)
    dd = cc.cudnnCreateDropoutDescriptor()
    n = int(np.prod(S))
    res = cc.cudnnDropoutGetReserveSpaceSize(d)

    def call(h, b, a, be):  # alpha/beta: none; the states advance per call (same on both sides)
        cc.cudnnRestoreDropoutDescriptor(dd, h, 0.5, b["states"], 64, 0)
        cc.cudnnDropoutForward(h, dd, d, b["x"], d, b["y"], b["res"], res)
    states = np.zeros(64, np.uint8)
    states[:16] = np.array([1234, 0, 0, 0], "<i4").view(np.uint8)
    return ({"x": rng.standard_normal(n)}, {"y": np.zeros(n), "res": np.zeros(res, np.uint8), "states": states}, call)


def case_conv_bwd_bias(rng):
    dyd, dbd = tdesc(S), tdesc((1, S[1], 1, 1))
    return ({"dy": rng.standard_normal(S)}, {"db": rng.standard_normal((1, S[1], 1, 1))},
            lambda h, b, a, be: cc.cudnnConvolutionBackwardBias(h, a, dyd, b["dy"], be, dbd, b["db"]))


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}
EMULATED = ("act_fwd", "add_tensor", "softmax_fwd", "pool_fwd", "bn_train", "dropout")


def _f32(d: dict) -> dict:
    return {k: (v if v.dtype == np.uint8 else v.astype(np.float32)) for k, v in d.items()}


def run_twice(place_call, case, rng):
    """Two calls of ``case`` with fresh buffers and other alpha/beta each time, on the CPU reference
    handle and through ``place_call(call, host buffers, alpha, beta) -> host outputs``; returns
    [(reference outputs, outputs)] per call."""
    ins, outs, call = CASES[case](rng)
    hc = cc.cudnnCreate("cpu")
    out = []
    for alpha, beta in ((1.0, 0.0), (1.5, -0.5)):
        bufs = _f32({**ins, **outs})
        bufs = {k: v * (1.0 + 0.25 * (alpha - 1.0)) if k in ins and v.dtype != np.uint8 else v for k, v in bufs.items()}
        ref = {k: v.copy() for k, v in bufs.items()}
        call(hc, ref, alpha, beta)
        got = place_call(call, {k: v.copy() for k, v in bufs.items()}, alpha, beta)
        out.append(({k: ref[k] for k in outs}, {k: got[k] for k in outs}))
    return out


def assert_close(ref: dict, got: dict, tol=2e-5):
    for k in ref:
        w, g = ref[k].astype(np.float64), got[k].astype(np.float64)
        assert np.allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max(initial=0)))), k


# -- the emulated GPU place -------------------------------------------------------------------------------

@pytest.fixture
def emu():
    import kernel_emu
    why = kernel_emu.available()
    if why:
        pytest.skip(why)
    import host_emu
    from cudnn_compat._core import memo as _memo
    cc.plan_cache_clear()
    e = host_emu.Emu("emulate")
    yield e
    e.restore()
    _memo.clear_all()
    cc._core.call.clear_prepared()


def _emu_place(e, h):
    import host_emu

    def place_call(call, bufs, alpha, beta):
        dev = {k: host_emu.EmuArray(v) for k, v in bufs.items()}
        call(h, dev, alpha, beta)
        return bufs  # the device arrays are views of these
    return place_call


@pytest.mark.parametrize("case", EMULATED)
def test_records_give_the_reference_numbers(emu, rng, case):
    """Call 1 traces (the steps run), call 2 replays the record with other buffers and alpha/beta."""
    h = emu.handle()
    for ref, got in run_twice(_emu_place(emu, h), case, rng):
        assert_close(ref, got)
    plan = cc._core.call.last_plan()
    assert plan.engine == "cupy" and plan.launch_mode == "record"
    assert len(plan._path.records) == 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_family_repeats_as_a_prepared_call(native_emu, rng, case, monkeypatch):
    """The class of "a family whose plan-cache key is made anew per call never gets a prepared
    call" (a convolution backward bias did, one call of the ResNet-50 step): from the fourth call
    with the same descriptors (the first goes the general way and fills the family's memo, the
    next two meet the memo's key object: the second of them prepares), each family's call is its
    prepared call, not the general way.  The key may be made anew per call: an equal one finds the
    prepared call by value (``_core.call._by_value``)."""
    import host_emu
    from cudnn_compat._backend import planner
    h = native_emu.handle()
    ins, outs, call = CASES[case](rng)
    dev = {k: host_emu.EmuArray(v) for k, v in _f32({**ins, **outs}).items()}
    for _ in range(3):
        call(h, dev, 1.0, 0.0)
    general = []  # the general way ends in planner.execute (a prepared call runs its plan itself)
    orig = planner.execute
    monkeypatch.setattr(planner, "execute", lambda plan, *a, **k: (general.append(plan.graph.name), orig(plan, *a, **k))[1])
    call(h, dev, 1.0, 0.0)
    assert not general, f"{case}: the call went the general way ({general})"


_FORMAT_OPS = frozenset(dis.opmap[n] for n in ("FORMAT_VALUE", "BUILD_STRING", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC",
                                                 "CONVERT_VALUE") if n in dis.opmap)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cached_call_formats_no_message(native_emu, rng, case):
    """The class of "a per-call check builds its error message before it knows it fails"
    (``check(have >= need, arg, f"...")`` formats on every call: reduceTensor's workspace and
    indices sizes and the RNN calls' space sizes did): a repeated call of every family executes no
    string-formatting opcode (an f-string's FORMAT_VALUE/BUILD_STRING) in any frame."""
    import host_emu
    ins, outs, call = CASES[case](rng)
    h = native_emu.handle()
    dev = {k: host_emu.EmuArray(v) for k, v in _f32({**ins, **outs}).items()}
    for _ in range(4):
        call(h, dev, 1.0, 0.0)
    where = []

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode" and frame.f_code.co_code[frame.f_lasti] in _FORMAT_OPS:
            where.append(f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})")
        return tracer
    sys.settrace(tracer)
    try:
        call(h, dev, 1.0, 0.0)
    finally:
        sys.settrace(None)
    assert not where, f"{case}: a cached call formats strings at {sorted(set(where))}"


def test_a_record_is_made_once_and_reused(emu, rng):
    import host_emu
    from cudnn_compat._backend.engines.cupy_engine import records, runtime
    h = emu.handle()
    ins, outs, call = case_act_fwd(rng)
    bufs = _f32({**ins, **outs})
    dev = {k: host_emu.EmuArray(v) for k, v in bufs.items()}
    made = []
    orig = records.FastPath.add
    records.FastPath.add = lambda self, tracer: (made.append(tracer), orig(self, tracer))[1]
    try:
        call(h, dev, 1.0, 0.0)
        plan = cc._core.call.last_plan()
        fast, rec = plan.launch, next(iter(plan._path.records.values()))
        n0 = runtime.LAUNCHES[0]
        for i in range(5):
            call(h, dev, 1.0 + i, 0.0)
            assert cc._core.call.last_plan() is plan and plan.launch is fast
            assert next(iter(plan._path.records.values())) is rec
    finally:
        records.FastPath.add = orig
    assert len(made) == 1  # traced once: the first call
    assert runtime.LAUNCHES[0] - n0 == 5 * rec[2]  # every later call launched the record's kernels
    from cudnn_compat._core import fastbind
    binder = fastbind.values(plan)  # and bound through the plan's binder of its prepared call: compiled, or generated
    assert binder.spec if type(binder).__name__ == "Values" else binder.source
    np.testing.assert_allclose(bufs["y"], 5.0 * np.maximum(bufs["x"], 0), rtol=1e-6)


def test_repeated_calls_replay_a_cuda_graph(emu, rng, monkeypatch):
    """The same buffers and scalars again: the second such call is captured into a graph, later ones
    replay it; the graph reads the buffers' current contents; two buffer sets get a graph each."""
    monkeypatch.setenv("CUDNN_COMPAT_CUPY_GRAPHS", "1")  # off by default
    import host_emu
    h = emu.handle()
    ins, outs, call = case_act_fwd(rng)
    sets = [_f32({"x": rng.standard_normal(S), "y": np.zeros(S)}) for _ in range(2)]
    dev = [{k: host_emu.EmuArray(v) for k, v in st.items()} for st in sets]
    for i in range(6):
        for st, d in zip(sets, dev):
            st["x"][...] = rng.standard_normal(S)  # new contents, same memory
            call(h, d, 1.5, 0.0)
            np.testing.assert_allclose(st["y"], 1.5 * np.maximum(st["x"], 0), rtol=1e-6)
    plan = cc._core.call.last_plan()
    # set 1: trace (steps), note, capture, then 3 replays; set 2 (the record exists): note, capture, 4 replays
    assert emu.captures == 2 and emu.graph_launches == 3 + 4
    assert sorted(g > 0 for g in plan._path.graphs.values()) == [True, True]
    cc.plan_cache_clear()  # the plan's graphs go with it
    assert not emu.graphs


def test_a_failed_capture_is_logged_and_the_kernels_launch(emu, rng, monkeypatch, caplog):
    """A capture that raises: the key launches the record's kernels from then on (right numbers,
    no graph, no second try) and the exception is logged, not swallowed."""
    import logging
    monkeypatch.setenv("CUDNN_COMPAT_CUPY_GRAPHS", "1")  # off by default
    from cudnn_compat._backend.engines.cupy_engine import runtime
    import host_emu

    from cudnn_compat._backend.engines import graphs

    def refuse(launch_all, device=None):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(graphs.GRAPHS[0], "capture", refuse)
    h = emu.handle()
    ins, outs, call = case_act_fwd(rng)
    st = _f32({**ins, **outs})
    d = {k: host_emu.EmuArray(v) for k, v in st.items()}
    with caplog.at_level(logging.WARNING, logger="cudnn_compat.graphs"):
        for _ in range(5):
            st["y"][...] = np.nan
            call(h, d, 1.5, 0.0)
            np.testing.assert_allclose(st["y"], 1.5 * np.maximum(st["x"], 0), rtol=1e-6)
    assert emu.graph_launches == 0
    (rec,) = [r for r in caplog.records if r.name == "cudnn_compat.graphs"]
    assert rec.getMessage().startswith("launch record: CUDA graph capture failed (RuntimeError: operation not "
                                       "permitted when stream is capturing)")
    assert rec.exc_info and rec.exc_info[0] is RuntimeError


def test_graph_table_is_bounded(emu, rng, monkeypatch):
    monkeypatch.setenv("CUDNN_COMPAT_CUPY_GRAPHS", "1")  # off by default
    from cudnn_compat._backend.engines.cupy_engine import records
    import host_emu
    h = emu.handle()
    ins, outs, call = case_act_fwd(rng)
    st = _f32({**ins, **outs})
    d = {k: host_emu.EmuArray(v) for k, v in st.items()}
    for i in range(3 * records.FastPath.GRAPHS):
        for _ in range(3):
            call(h, d, 1.0 + i, 0.0)  # a new alpha: a new key, captured on its third call
    plan = cc._core.call.last_plan()
    assert len(plan._path.graphs) <= records.FastPath.GRAPHS
    assert len(emu.graphs) <= records.FastPath.GRAPHS  # dropped graphs are destroyed
    np.testing.assert_allclose(st["y"], (3.0 * records.FastPath.GRAPHS) * np.maximum(st["x"], 0), rtol=1e-6)


def test_pointer_slots_follow_the_buffers(emu, rng):
    """Alternating between buffer sets: each call writes only its own output."""
    import host_emu
    h = emu.handle()
    ins, outs, call = case_softmax_fwd(rng)
    sets = [_f32({"x": rng.standard_normal(S), "y": np.zeros(S)}) for _ in range(3)]
    dev = [{k: host_emu.EmuArray(v) for k, v in s.items()} for s in sets]
    hc = cc.cudnnCreate("cpu")
    for rnd in range(2):
        for i, (s, d) in enumerate(zip(sets, dev)):
            s["y"][...] = -7.0
            call(h, d, 1.0 + i, 0.0)
            ref = {"x": s["x"].copy(), "y": np.zeros_like(s["y"])}
            call(hc, ref, 1.0 + i, 0.0)
            np.testing.assert_allclose(s["y"], ref["y"], rtol=1e-5, atol=1e-6)
            for j, other in enumerate(sets):
                if j != i:
                    assert not np.any(other["y"] == ref["y"])


def test_scalar_slots_follow_alpha_and_beta(emu, rng):
    """One plan (beta != 0) called with several alpha/beta: y = alpha*relu(x) + beta*y each time."""
    import host_emu
    h = emu.handle()
    ins, outs, call = case_act_fwd(rng)
    x = rng.standard_normal(S).astype(np.float32)
    y = rng.standard_normal(S).astype(np.float32)
    dx, dy = host_emu.EmuArray(x), host_emu.EmuArray(y)
    want = y.astype(np.float64)
    for alpha, beta in ((1.0, 1.0), (2.0, -0.5), (-3.0, 0.25), (0.0, 2.0)):
        call(h, {"x": dx, "y": dy}, alpha, beta)
        want = alpha * np.maximum(x, 0) + beta * want
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert len(cc._core.call.last_plan()._path.records) == 1


def test_overlapping_guarded_buffers_take_the_steps(emu, rng):
    """Pooling reads x around each output: y written over x must not feed later outputs.  The
    record is bypassed for that call (the steps copy x first) and used again after."""
    import host_emu
    h = emu.handle()
    xd, yd, pd = tdesc(S), tdesc(P), _pool()
    hc = cc.cudnnCreate("cpu")
    x = rng.standard_normal(S).astype(np.float32)
    want = np.zeros(P, np.float32)
    cc.cudnnPoolingForward(hc, pd, 1.0, xd, x.copy(), 0.0, yd, want)
    y = np.zeros(P, np.float32)
    cc.cudnnPoolingForward(h, pd, 1.0, xd, host_emu.EmuArray(x.copy()), 0.0, yd, host_emu.EmuArray(y))  # records
    plan = cc._core.call.last_plan()
    assert plan._path.launch is not None and plan._path.guards  # x is guarded against y
    buf = x.copy()  # y written into x's own memory
    cc.cudnnPoolingForward(h, pd, 1.0, xd, host_emu.EmuArray(buf), 0.0, yd, host_emu.EmuArray(buf))
    np.testing.assert_allclose(buf.ravel()[:want.size], want.ravel(), rtol=1e-6)
    assert len(plan._path.records) == 1


def test_two_threads_share_a_record(emu, rng):
    import host_emu
    h = emu.handle()
    ins, outs, call = case_act_fwd(rng)
    call(h, {k: host_emu.EmuArray(v) for k, v in _f32({**ins, **outs}).items()}, 1.0, 0.0)  # the record
    errors = []

    def worker(k):
        r = np.random.default_rng(k)
        for i in range(40):
            x = r.standard_normal(S).astype(np.float32)
            y = np.zeros(S, np.float32)
            call(h, {"x": host_emu.EmuArray(x), "y": host_emu.EmuArray(y)}, float(k + 1), 0.0)
            if not np.allclose(y, (k + 1) * np.maximum(x, 0), rtol=1e-6):
                errors.append((k, i))
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def test_bad_input_is_still_bad_param_after_caching(emu, rng):
    import host_emu
    h = emu.handle()
    ad, xd, zd = _act(rng), tdesc(S), tdesc((2, 8, 5, 7))
    x, y = np.ones(S, np.float32), np.zeros(S, np.float32)
    cc.cudnnActivationForward(h, ad, 1.0, xd, host_emu.EmuArray(x), 0.0, xd, host_emu.EmuArray(y))
    cc.cudnnActivationForward(h, ad, 1.0, xd, host_emu.EmuArray(x), 0.0, xd, host_emu.EmuArray(y))  # the record
    cases = [
        (lambda: cc.cudnnActivationForward(h, ad, 1.0, xd, host_emu.EmuArray(x[:1]), 0.0, xd, host_emu.EmuArray(y)),
         "x", "bytes"),
        (lambda: cc.cudnnActivationForward(h, ad, 1.0, xd, host_emu.EmuArray(x.astype(np.float16)), 0.0, xd,
                                           host_emu.EmuArray(y)), "x", "dtype"),
        (lambda: cc.cudnnActivationForward(h, ad, 1.0, xd, None, 0.0, xd, host_emu.EmuArray(y)), "x", "NULL"),
        (lambda: cc.cudnnActivationForward(h, ad, 1.0, xd, host_emu.EmuArray(x), 0.0, zd, host_emu.EmuArray(y)),
         "yDesc", "dims"),
        (lambda: cc.cudnnActivationForward(h, ad, "a", xd, host_emu.EmuArray(x), 0.0, xd, host_emu.EmuArray(y)),
         "alpha", ""),
    ]
    for fn, arg, words in cases:
        with pytest.raises(cc.CuDNNError) as e:
            fn()
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM, e.value
        assert arg in str(e.value) and words in str(e.value), e.value
    # a descriptor re-set after caching is checked again; a destroyed one is BAD_PARAM
    cc.cudnnSetTensor4dDescriptor(xd, cc.CUDNN_TENSOR_NCHW, F32, 2, 8, 5, 7)
    with pytest.raises(cc.CuDNNError, match="yDesc"):
        cc.cudnnActivationForward(h, ad, 1.0, xd, host_emu.EmuArray(np.ones(560, np.float32)), 0.0, tdesc(S),
                                  host_emu.EmuArray(y))
    cc.cudnnDestroyActivationDescriptor(ad)
    with pytest.raises(cc.CuDNNError, match="destroyed"):
        cc.cudnnActivationForward(h, ad, 1.0, xd, host_emu.EmuArray(x), 0.0, xd, host_emu.EmuArray(y))


def test_memo_does_not_grow_with_descriptors_made_per_call(rng):
    """A program that creates its descriptors per call: one memo entry per settings, not per object."""
    from cudnn_compat import activation
    from cudnn_compat._core import memo as _memo
    _memo.clear_all()
    h = cc.cudnnCreate("cpu")
    ad = _act(rng)
    x, y = np.ones(S, np.float32), np.zeros(S, np.float32)
    for _ in range(50):
        d = tdesc(S)
        cc.cudnnActivationForward(h, ad, 1.0, d, x, 0.0, d, y)
        cc.cudnnDestroyTensorDescriptor(d)
    assert len(activation._FWD) == 1


def test_memo_entries_are_per_settings(rng):
    """The same descriptor objects re-set between calls: each call is checked for its settings."""
    h = cc.cudnnCreate("cpu")
    ad, xd, yd = _act(rng), tdesc(S), tdesc(S)
    x, y = np.ones(S, np.float32), np.zeros(S, np.float32)
    cc.cudnnActivationForward(h, ad, 1.0, xd, x, 0.0, yd, y)
    cc.cudnnSetTensor4dDescriptor(yd, cc.CUDNN_TENSOR_NCHW, F32, 2, 8, 6, 5)
    with pytest.raises(cc.CuDNNError, match="must equal"):
        cc.cudnnActivationForward(h, ad, 1.0, xd, x, 0.0, yd, y)
    cc.cudnnSetTensor4dDescriptor(yd, cc.CUDNN_TENSOR_NCHW, F32, *S)
    cc.cudnnActivationForward(h, ad, 2.0, xd, x, 0.0, yd, y)
    assert np.all(y == 2.0)
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_IDENTITY, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    with pytest.raises(cc.CuDNNError, match="ConvolutionBiasActivationForward"):
        cc.cudnnActivationForward(h, ad, 1.0, xd, x, 0.0, yd, y)


# -- lanes (_call.run) and call sites (_memo): the cached path skips work, never a check ----------------------

LANED = ("act_fwd", "act_bwd", "add_tensor", "op_tensor", "softmax_fwd", "softmax_bwd", "pool_fwd", "pool_bwd",
         "bn_train", "bn_inf", "bn_bwd", "lrn")


def _dev(bufs):
    import host_emu
    return {k: host_emu.EmuArray(v) for k, v in bufs.items()}


def _count_general(monkeypatch):
    """Calls that took _call.run's general path (planner.get_plan), counted."""
    from cudnn_compat._backend import planner
    n = [0]
    orig = planner.get_plan

    def spy(*a, **k):
        n[0] += 1
        return orig(*a, **k)
    monkeypatch.setattr(planner, "get_plan", spy)
    return n


@pytest.mark.parametrize("case", LANED)
def test_lane_calls_give_the_reference_numbers(emu, rng, case, monkeypatch):
    """After a few calls with the same arguments a call takes the lane (no plan-cache lookup by key,
    no variant-pack dict); its numbers still follow new buffers and alpha/beta, and each lane call
    counts as one plan-cache hit."""
    ins, outs, call = CASES[case](rng)
    h, hc = emu.handle(), cc.cudnnCreate("cpu")
    for _ in range(3):  # trace; the memo's key seen; the lane made (BN: its first call keys the plan itself)
        call(h, _dev(_f32({**ins, **outs})), 1.0, 0.0)
    general = _count_general(monkeypatch)
    for alpha, beta in ((1.5, 0.0), (0.5, 0.0)):
        bufs = _f32({**ins, **outs})
        bufs = {k: v * 1.25 if k in ins else v for k, v in bufs.items()}
        ref = {k: v.copy() for k, v in bufs.items()}
        call(hc, ref, alpha, beta)
        hits, n = cc.plan_cache_info().hits, general[0]
        call(h, _dev(bufs), alpha, beta)
        assert cc.plan_cache_info().hits == hits + 1
        assert general[0] == n, "the lane was not taken"
        assert_close({k: ref[k] for k in outs}, {k: bufs[k] for k in outs})


@pytest.mark.parametrize("case", ["act_fwd", "softmax_fwd", "pool_fwd", "bn_inf", "add_tensor", "lrn"])
def test_lane_still_refuses_bad_buffers(emu, rng, case):
    """After the lane exists: a buffer of the wrong dtype, one too small, NULL, and a library object
    as data are BAD_PARAM naming the argument, before anything is written."""
    import host_emu
    ins, outs, call = CASES[case](rng)
    h = emu.handle()
    good = _f32({**ins, **outs})
    for _ in range(3):
        call(h, _dev(good), 1.0, 0.0)
    name = next(iter(ins))
    for bad, words in ((good[name].astype(np.float16), "dtype"), (good[name].ravel()[:3], "bytes")):
        bufs = _dev(good)
        bufs[name] = host_emu.EmuArray(bad)
        out = {k: good[k].copy() for k in outs}
        bufs.update(_dev(out))
        with pytest.raises(cc.CuDNNError) as e:
            call(h, bufs, 1.0, 0.0)
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and words in str(e.value), e.value
        for k in outs:
            np.testing.assert_array_equal(out[k], good[k])  # nothing written
    for bad in (None, cc.cudnnCreateTensorDescriptor()):
        bufs = _dev(good)
        bufs[name] = bad
        with pytest.raises(cc.CuDNNError) as e:
            call(h, bufs, 1.0, 0.0)
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM, e.value


def test_call_site_sees_descriptor_changes(emu, rng):
    """The call-site memo of several families: a descriptor re-set after the site is cached is checked
    again (BAD_PARAM for a mismatch, the new settings used when valid); a destroyed descriptor or
    handle is BAD_PARAM; an unhashable descriptor argument is BAD_PARAM, not an internal error."""
    h = emu.handle()
    x, y = np.ones(S, np.float32), np.zeros(S, np.float32)
    ad, pd, xd, yd = _act(rng), _pool(), tdesc(S), tdesc(S)
    calls = {
        "act": lambda yd_, yy: cc.cudnnActivationForward(h, ad, 1.0, xd, _dev({"x": x})["x"], 0.0, yd_, yy),
        "softmax": lambda yd_, yy: cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL,
                                                          1.0, xd, _dev({"x": x})["x"], 0.0, yd_, yy),
        "add": lambda yd_, yy: cc.cudnnAddTensor(h, 1.0, xd, _dev({"x": x})["x"], 0.0, yd_, yy),
    }
    for name, fn in calls.items():
        yd = tdesc(S)
        for _ in range(3):
            fn(yd, _dev({"y": y})["y"])
        cc.cudnnSetTensor4dDescriptor(yd, cc.CUDNN_TENSOR_NCHW, F32, 2, 8, 6, 5)  # other dims: checked again
        with pytest.raises(cc.CuDNNError) as e:
            fn(yd, _dev({"y": y})["y"])
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM, (name, e.value)
        cc.cudnnSetTensor4dDescriptor(yd, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_HALF, *S)  # other dtype
        with pytest.raises(cc.CuDNNError):
            fn(yd, _dev({"y": y})["y"])
        cc.cudnnSetTensor4dDescriptor(yd, cc.CUDNN_TENSOR_NCHW, F32, *S)
        out = np.full(S, -1.0, np.float32)
        fn(yd, _dev({"y": out})["y"])
        assert np.all(out == {"softmax": 0.125}.get(name, 1.0)), name  # relu(1), softmax of 8 ones, 1*x + 0*y
        cc.cudnnDestroyTensorDescriptor(yd)
        with pytest.raises(cc.CuDNNError, match="destroyed") as e:
            fn(yd, _dev({"y": y})["y"])
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
        with pytest.raises(cc.CuDNNError) as e:
            fn([1, 2], _dev({"y": y})["y"])
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM, e.value
    # the activation mode changed after caching: the new mode runs (the memo entry is per settings)
    yd = tdesc(S)
    for _ in range(3):
        cc.cudnnActivationForward(h, ad, 1.0, xd, _dev({"x": -x})["x"], 0.0, yd, _dev({"y": y})["y"])
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_SIGMOID, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    out = np.zeros(S, np.float32)
    cc.cudnnActivationForward(h, ad, 1.0, xd, _dev({"x": -x})["x"], 0.0, yd, _dev({"y": out})["y"])
    np.testing.assert_allclose(out, 1 / (1 + np.e), rtol=1e-6)
    # the pooling window changed after caching: the new window is used (as on a CPU handle)
    py, xr = tdesc(P), rng.standard_normal(S).astype(np.float32)
    for _ in range(3):
        cc.cudnnPoolingForward(h, pd, 1.0, xd, _dev({"x": xr})["x"], 0.0, py, _dev({"y": np.zeros(P, np.float32)})["y"])
    cc.cudnnSetPooling2dDescriptor(pd, cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, cc.CUDNN_NOT_PROPAGATE_NAN,
                                   2, 2, 0, 0, 1, 1)
    got, want = np.zeros(P, np.float32), np.zeros(P, np.float32)
    cc.cudnnPoolingForward(h, pd, 1.0, xd, _dev({"x": xr})["x"], 0.0, py, _dev({"y": got})["y"])
    cc.cudnnPoolingForward(cc.cudnnCreate("cpu"), pd, 1.0, xd, xr, 0.0, py, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # a destroyed activation descriptor (the site entry is stale: resolving says so)
    cc.cudnnDestroyActivationDescriptor(ad)
    with pytest.raises(cc.CuDNNError, match="destroyed"):
        cc.cudnnActivationForward(h, ad, 1.0, xd, _dev({"x": x})["x"], 0.0, yd, _dev({"y": y})["y"])


def test_call_site_helper():
    """``_core.memo.call_site``: a hit returns the remembered value without resolving; a descriptor
    change (EPOCH) resolves again; the stamp is the one read before resolving (a change while
    resolving leaves the entry stale); an unhashable argument and a value whose last item is None
    are not remembered; a resolver the wrapper cannot mirror is refused when decorated."""
    from cudnn_compat._core import descriptor, memo as _memo
    sites, calls = _memo.Memo("test sites"), []

    @_memo.call_site(sites)
    def site(a, b):
        """the resolver's doc"""
        calls.append((a, b))
        if b == "bump":  # a descriptor changed while this call resolved
            descriptor.EPOCH[0] = next(descriptor._EPOCHS)
        return a, (None if b == "forget" else b)

    assert site.__name__ == "site" and site.__doc__ == "the resolver's doc" and site.sites is sites
    assert site.__wrapped__(1, 2) == (1, 2) and calls.pop() == (1, 2)
    assert site(("k",), 1, 2) == (1, 2) and calls == [(1, 2)]
    assert site(("k",), 1, 3) == (1, 2) and calls == [(1, 2)]  # a hit: the remembered value, no resolving
    descriptor.EPOCH[0] = next(descriptor._EPOCHS)
    assert site(("k",), 1, 3) == (1, 3) and len(calls) == 2  # stale: resolved again
    assert site(("k",), 1, 4) == (1, 3) and len(calls) == 2
    site(("r",), 1, "bump")
    site(("r",), 1, "bump2")
    assert len(calls) == 4  # the entry made while resolving carried the stamp from before: stale
    for _ in range(2):
        assert site(("f",), 1, "forget") == (1, None)
        assert site(([],), 1, 5) == (1, 5)  # unhashable: resolved, no entry, no TypeError
    assert len(calls) == 8 and ("f",) not in sites and len(sites) == 2
    for bad in ("def r(a, b=1): return a, b", "def r(*a): return a", "def r(sk): return sk,",
                "def r(a, *, b): return a, b"):
        ns = {}
        exec(bad, ns)
        with pytest.raises(TypeError, match="call_site"):
            _memo.call_site(sites)(ns["r"])


def _resolve_spy(monkeypatch) -> list:
    """The argument names every descriptor or handle resolve of the package is made for, in order
    (``_core.descriptor.resolve`` replaced in each module that imported it)."""
    import sys
    from cudnn_compat._core import descriptor
    orig, seen = descriptor.resolve, []

    def spy(arg, cls, argname, need_set=True):
        seen.append(argname)
        return orig(arg, cls, argname, need_set)
    for name, mod in list(sys.modules.items()):
        if name.startswith("cudnn_compat") and getattr(mod, "resolve", None) is orig:
            monkeypatch.setattr(mod, "resolve", spy)
    return seen


@pytest.mark.parametrize("case", ["bn_train", "bn_inf", "bn_bwd", "act_fwd", "pool_bwd", "softmax_bwd", "lrn",
                                  "op_tensor"])
def test_first_call_resolves_each_descriptor_once(rng, case, monkeypatch):
    """A first call (no memo entry, no call site) resolves the handle and each descriptor argument
    once, the batch-norm calls' general way included; a call-site hit resolves none."""
    from cudnn_compat._core import memo as _memo
    ins, outs, call = CASES[case](rng)
    h = cc.cudnnCreate("cpu")
    _memo.clear_all()
    seen = _resolve_spy(monkeypatch)
    call(h, _f32({**ins, **outs}), 1.0, 0.0)
    assert seen and len(seen) == len(set(seen)), seen
    for _ in range(2):  # the second call remembers its site
        call(h, _f32({**ins, **outs}), 1.0, 0.0)
    seen.clear()
    call(h, _f32({**ins, **outs}), 1.0, 0.0)
    assert seen == []


def test_first_convolution_call_resolves_each_descriptor_once(monkeypatch):
    """The convolutions' builder (002's rules, on a plan-cache miss) checks the descriptors the call
    site resolved: a first call resolves each once (with conv + bias + activation too)."""
    from cudnn_compat._core import memo as _memo
    xd, wd, yd, cd, bufs = _conv_problem()
    h = cc.cudnnCreate("cpu")
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    bd, ad = tdesc((1, 8, 1, 1)), _act(None)
    cc.plan_cache_clear()
    _memo.clear_all()
    seen = _resolve_spy(monkeypatch)
    cc.cudnnConvolutionForward(h, 1.0, xd, bufs["x"], wd, bufs["w"], cd, algo, None, 0, 0.0, yd, bufs["y"])
    assert sorted(seen) == ["convDesc", "handle", "wDesc", "xDesc", "yDesc"], seen
    seen.clear()
    cc.cudnnConvolutionBiasActivationForward(h, 1.0, xd, bufs["x"], wd, bufs["w"], cd, algo, None, 0, 0.0, yd,
                                             bufs["y"], bd, np.zeros(8, np.float32), ad, yd, bufs["y"])
    assert sorted(seen) == ["activationDesc", "biasDesc", "convDesc", "handle", "wDesc", "xDesc", "yDesc", "zDesc"]


def test_lane_follows_the_plan_cache(emu, rng, monkeypatch):
    """A lane whose plan left the cache is not used (the call rebuilds the plan); a forced engine in the
    environment takes the general path (the engine is part of the plan key there)."""
    ins, outs, call = case_act_fwd(rng)
    h = emu.handle()
    good = _f32({**ins, **outs})
    for _ in range(3):
        call(h, _dev(good), 1.0, 0.0)
    old = cc._core.call.last_plan()
    cc.plan_cache_clear()
    for _ in range(3):
        bufs = _f32({**ins, **outs})
        call(h, _dev(bufs), 2.0, 0.0)
        np.testing.assert_allclose(bufs["y"], 2.0 * np.maximum(bufs["x"], 0), rtol=1e-6)
    assert cc._core.call.last_plan() is not old and cc.plan_cache_info().currsize == 1
    # LRU order: another signature planned after it, then the lane's plan is back at the end within
    # LANE_LRU_EVERY + 1 lane calls (the hit is counted on every call)
    from cudnn_compat._backend.plan_cache import CACHE
    ins2, outs2, call2 = case_softmax_fwd(rng)
    call2(h, _dev(_f32({**ins2, **outs2})), 1.0, 0.0)
    assert next(reversed(CACHE._d.values())) is cc._core.call.last_plan()  # the softmax plan
    act_plan = [p for p in CACHE._d.values() if p.graph.name == "ActivationForward"][0]
    from cudnn_compat._backend.prepared import TOUCH_EVERY
    for _ in range(TOUCH_EVERY + 1):
        call(h, _dev(good), 1.0, 0.0)
    assert next(reversed(CACHE._d.values())) is act_plan
    general = _count_general(monkeypatch)
    monkeypatch.setenv("CUDNN_COMPAT_ENGINE", "cupy")
    call(h, _dev(good), 1.0, 0.0)
    assert general[0] == 1
    monkeypatch.delenv("CUDNN_COMPAT_ENGINE")
    call(h, _dev(good), 1.0, 0.0)
    assert general[0] == 1  # the lane again


@pytest.fixture
def native_emu():
    """The emulated GPU place with the native cudnn engine over a stand-in libcudnn (nothing runs)."""
    import host_emu
    from cudnn_compat._core import memo as _memo
    cc.plan_cache_clear()
    e = host_emu.Emu("noop", cudnn=True)
    yield e
    e.restore()
    _memo.clear_all()
    cc._core.call.clear_prepared()
    cc.plan_cache_clear()


def _conv_problem():
    X, Wt = (1, 8, 6, 6), (8, 8, 3, 3)
    xd, yd = tdesc(X), tdesc(X)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, F32, cc.CUDNN_TENSOR_NCHW, *Wt)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    bufs = {"x": np.ones(X, np.float32), "w": np.ones(Wt, np.float32), "y": np.zeros(X, np.float32)}
    return xd, wd, yd, cd, bufs


def test_native_lane_binds_and_checks_convolutions(native_emu, monkeypatch):
    """Convolutions on the native engine: after the first calls a call takes the lane (its binder, then
    planner.execute: the engine's CUDA graph replay); a wrong buffer, a re-set descriptor and a destroyed
    one are still refused (BAD_PARAM; the output dims rule is NOT_SUPPORTED, as on a first call)."""
    import host_emu
    xd, wd, yd, cd, bufs = _conv_problem()
    h = native_emu.handle()
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    dev = _dev(bufs)

    def fwd(d=dev, y_desc=yd):
        cc.cudnnConvolutionForward(h, 1.0, xd, d["x"], wd, d["w"], cd, algo, None, 0, 0.0, y_desc, d["y"])
    for _ in range(4):
        fwd()
    plan = cc._core.call.last_plan()
    assert plan.engine == "cudnn"
    general = _count_general(monkeypatch)
    launches = native_emu.graph_launches
    hits = cc.plan_cache_info().hits
    for _ in range(3):
        fwd()
    assert general[0] == 0 and cc.plan_cache_info().hits == hits + 3
    assert native_emu.graph_launches == launches + 3 and cc._core.call.last_plan() is plan
    bad = dict(dev, x=host_emu.EmuArray(bufs["x"].astype(np.float16)))
    with pytest.raises(cc.CuDNNError) as e:
        fwd(bad)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "x" in str(e.value), e.value
    bad = dict(dev, y=host_emu.EmuArray(bufs["y"].ravel()[:10]))
    with pytest.raises(cc.CuDNNError) as e:
        fwd(bad)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "bytes" in str(e.value), e.value
    cc.cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)  # y is now 4x4
    with pytest.raises(cc.CuDNNError) as e:
        fwd()
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED and "yDesc" in str(e.value), e.value  # 002 §5.2.10 dims rule
    fwd(_dev({"x": bufs["x"], "w": bufs["w"], "y": np.zeros((1, 8, 4, 4), np.float32)}), tdesc((1, 8, 4, 4)))
    cc.cudnnDestroyFilterDescriptor(wd)
    with pytest.raises(cc.CuDNNError, match="destroyed") as e:
        fwd()
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM


# -- the device ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_cached_calls_give_the_reference_numbers(case, rng):
    """Every family of the host-cost benchmark, twice on the device (the second call through its
    launch record where the plan has one), against the reference engine."""
    import cupy
    h = cc.cudnnCreate("gpu")

    def place_call(call, bufs, alpha, beta):
        dev = {k: cupy.asarray(v) for k, v in bufs.items()}
        call(h, dev, alpha, beta)
        cupy.cuda.get_current_stream().synchronize()
        return {k: cupy.asnumpy(v) for k, v in dev.items()}
    for ref, got in run_twice(place_call, case, rng):
        assert_close(ref, got, tol=1e-4)
    plan = cc._core.call.last_plan()
    if plan.engine == "cupy" and plan.launch_mode == "record":
        assert len(plan._path.records) == 1 and plan._path.launch is not None


@pytest.mark.gpu
def test_gpu_record_launches_on_the_handle_stream(rng):
    import cupy
    from cudnn_compat._backend.engines.cupy_engine import runtime
    h = cc.cudnnCreate("gpu")
    ins, outs, call = case_softmax_fwd(rng)
    s = cupy.cuda.Stream(non_blocking=True)
    cc.cudnnSetStream(h, s)
    bufs = _f32({**ins, **outs})
    dev = {k: cupy.asarray(v) for k, v in bufs.items()}
    cupy.cuda.Device().synchronize()
    for i in range(3):
        call(h, dev, 1.0, 0.0)
    plan = cc._core.call.last_plan()
    # the plan is cached across tests: earlier ones may have left records for other streams
    assert plan.launch_mode == "record" and any(k[0] == s.ptr for k in plan._path.records)
    n0 = runtime.LAUNCHES[0]
    call(h, dev, 2.0, 0.0)
    assert runtime.LAUNCHES[0] > n0
    s.synchronize()
    ref = {k: v.copy() for k, v in bufs.items()}
    call(cc.cudnnCreate("cpu"), ref, 2.0, 0.0)
    np.testing.assert_allclose(cupy.asnumpy(dev["y"]), ref["y"], rtol=1e-5, atol=1e-6)


def test_a_record_whose_calls_never_repeat_stops_keying_graphs(emu, rng, monkeypatch):
    """A scalar new on every call (batch norm's 1/(1+n) factor does this): after 2 * GRAPHS keys seen
    once the plan's calls launch the record's kernels without the graph table; numbers stay right."""
    monkeypatch.setenv("CUDNN_COMPAT_CUPY_GRAPHS", "1")
    import host_emu
    from cudnn_compat._backend.engines.cupy_engine import records
    h = emu.handle()
    ins, outs, call = case_act_fwd(rng)
    st = _f32({**ins, **outs})
    d = {k: host_emu.EmuArray(v) for k, v in st.items()}
    for k in range(2 * records.FastPath.GRAPHS + 6):
        alpha = 1.0 + k / 64
        call(h, d, alpha, 0.0)
        np.testing.assert_allclose(st["y"], alpha * np.maximum(st["x"], 0), rtol=1e-6)
    path = cc._core.call.last_plan()._path
    assert path.direct[0] and not path.graphs and emu.graph_launches == 0


def test_the_plan_cache_counts_from_zero_after_a_clear():
    """A prepared call counts its hit through the counter's own method, kept across ``clear`` (which
    makes the counts start again from zero rather than replacing the counter a prepared call holds)."""
    from cudnn_compat._backend import plan_cache, prepared
    class Plan:  # what the cache asks of a plan it retires
        _released, _users, retired = False, 0, False

        def release(self):
            pass
    c, plan = plan_cache.PlanCache(4), Plan()
    c.put(("k",), plan)
    hit = c.hit  # what a prepared call keeps
    assert c.get(("k",)) is plan and c.get(("other",)) is None
    hit()
    assert (c.hits, c.misses) == (2, 1)
    c.clear()
    assert (c.hits, c.misses) == (0, 0)
    hit()
    c.get(("k",))
    assert (c.hits, c.misses) == (1, 1)
    assert prepared._HIT == plan_cache.CACHE.hit  # the shared cache's counter, as the prepared calls count it


def test_a_binder_gives_none_for_a_tensor_or_scalar_the_call_lacks(emu, rng):
    """The generated binders index the tensors a plan needs; a call that lacks one (or a scalar)
    gets None, and the general binding then says what is wrong (not a KeyError from generated code)."""
    from cudnn_compat._core import fastbind
    h = emu.handle()
    ins, outs, call = case_act_fwd(rng)
    dev = _dev(_f32({**ins, **outs}))
    for _ in range(3):
        call(h, dev, 1.0, 0.0)
    plan = cc._core.call.last_plan()
    ext = plan.graph.external_inputs() + plan.graph.external_outputs()
    tensors = {t.uid: (dev[t.name], t.name) for t in ext if not t.is_by_value}
    scalars = {t.uid: 1.0 for t in ext if t.is_by_value}
    assert sorted(name for _, name in tensors.values()) == ["x", "y"] and len(scalars) == 1
    for bind in (fastbind.values(plan), fastbind.binder(plan)):
        assert bind(tensors, scalars) is not None  # everything given: the values
        for uid in list(tensors) + list(scalars):
            assert bind({u: v for u, v in tensors.items() if u != uid},
                        {u: v for u, v in scalars.items() if u != uid}) is None, uid


def test_preflight_pointer_form_matches_the_general_loop(native_emu):
    """``preflight(..., pointers=True)`` on the GPU place takes every buffer in one loop when all are
    in a common form (``data._pointers``: the RNN calls' nine buffers); it must give the general
    loop's addresses, and leave every other case to that loop with its errors."""
    import host_emu
    from cudnn_compat._core import data as _data
    h = native_emu.handle()
    f32, u8 = np.zeros(64, np.float32), np.zeros(300, np.uint8)
    a, b = host_emu.EmuArray(f32), host_emu.EmuArray(u8)
    items = [(a, ("float32", 256), "x", False), (b, (None, 300), "ws", True), (a.data.ptr + 64, ("float32", 8), "hx", False)]
    fast = _data._pointers(items)
    general = [_data._device_checked(d, n, need, arg, w, True) for d, (n, need), arg, w in items]
    assert fast == general == [a.data.ptr, b.data.ptr, a.data.ptr + 64]
    assert _data.preflight(h, items, pointers=True) == fast
    bad = [
        ((a, ("float32", 260), "x", False), "260 are needed"),  # too small
        ((host_emu.EmuArray(np.zeros(64, np.float64)), ("float32", 256), "x", False), "dtype"),  # wrong dtype
        ((host_emu.EmuArray(np.zeros((8, 8), np.float32)[:, ::2]), ("float32", 128), "x", False), "contiguous"),
        ((None, ("float32", 4), "x", False), "NULL"),
        ((16, ("float32", 4), "x", False), "pointer"),  # an int below POINTER_MIN
    ]
    for item, words in bad:
        assert _data._pointers([items[0], item]) is None  # the general loop decides
        with pytest.raises(cc.CuDNNError) as e:
            _data.preflight(h, [items[0], item], pointers=True)
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and words in str(e.value), str(e.value)
