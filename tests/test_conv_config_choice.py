"""Which native engine configs the cudnn engine's autotune times for a convolution (issue 14 item 4).

cuDNN's "legacy" engines (wgrad_alg0_engine, dgrad_engine: what torch's cudnn.benchmark and the
legacy library pick for fp32 NCHW ResNet-50 layers) can be missing from mode A's first configs and
listed only by the FALLBACK heuristic, with a workspace.  The autotune therefore times mode A's
first k finalizable configs plus up to k more picked for variety (the FALLBACK heuristic's, then
one config of each engine not timed yet), as torch's find-plan times the INSTANT and FALLBACK lists
together.  CPU tests: the pure list rules of ``configs`` (``merge``, ``query(tune=True)``,
``tuning_order``) on fake configs, and the engine's candidate wiring with the native calls replaced
by fakes.  benchmarks/conv_configs.py shows the real lists on a device.
"""
import pytest

from cudnn_compat._backend.engines.base import EngineConfig
from cudnn_compat._backend.engines.cudnn_engine import autotune as tune
from cudnn_compat._backend.engines.cudnn_engine import configs as cfgsel
from cudnn_compat._backend.ir import OperationGraph, Tensor, packed_strides
from cudnn_compat._core.call import blended

FILTER = "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_"


def cfg(index, *notes, knobs=()):
    return EngineConfig("cudnn", tuple(knobs), frozenset(notes), index)


class Lib:
    CudnnStatusError = RuntimeError


# mode A of an fp32 problem: knob variants of two engines first; FALLBACK: the legacy engines
A = [(cfg(30, "DETERMINISTIC", knobs=(("TILE", t),)), 0) for t in range(6)] + \
    [(cfg(31, "DETERMINISTIC", knobs=(("TILE", t),)), 1024) for t in range(4)] + \
    [(cfg(40, "TENSOR_CORE", "DETERMINISTIC"), 4096), (cfg(33, "DETERMINISTIC"), 0)]
FB = [(cfg(0, "NONDETERMINISTIC", "FALLBACK"), 4 << 20), (cfg(1, "DETERMINISTIC", "FALLBACK"), 512),
      (cfg(30, "DETERMINISTIC", "FALLBACK", knobs=(("TILE", 0),)), 0), (cfg(57, "DETERMINISTIC", "FALLBACK"), 0)]
B = [(cfg(33, "DETERMINISTIC"), 0), (cfg(12, "DETERMINISTIC"), 2048)]


@pytest.fixture
def heur(monkeypatch):
    lists = {"A": A, "FALLBACK": FB, "B": B}
    monkeypatch.setattr(cfgsel, "_query", lambda lib, g, mode: list(lists[mode]))
    return lists


# -- merge / query ------------------------------------------------------------------------------------------

def test_merge_appends_what_the_first_list_lacks_by_engine_and_knobs():
    got = cfgsel.merge(A, FB, any_workspace=True)
    assert [(c.index, w) for c, w in got[len(A):]] == [(0, 4 << 20), (1, 512), (57, 0)]  # engine 30 TILE=0: a dup
    assert got[:len(A)] == A
    assert [(c.index, w) for c, w in cfgsel.merge(A, FB)[len(A):]] == [(57, 0)]  # zero workspace only
    assert cfgsel.merge([], FB, any_workspace=True) == FB
    assert cfgsel.merge(A, [], any_workspace=True) == A
    # a None (unknown) workspace is not zero
    assert cfgsel.merge([], [(cfg(3), None)]) == []
    assert cfgsel.merge([], [(cfg(3), None)], any_workspace=True) == [(cfg(3), None)]


def test_query_for_tuning_adds_every_fallback_config_other_modes_unchanged(heur, monkeypatch):
    plain = cfgsel.query(Lib, None, "A")
    assert [c.index for c, _ in plain[len(A):]] == [57]  # as before: FALLBACK's zero-workspace ones
    tuned = cfgsel.query(Lib, None, "A", tune=True)
    assert [(c.index, w) for c, w in tuned[len(A):]] == [(0, 4 << 20), (1, 512), (57, 0)]
    for mode in ("B", "FALLBACK"):
        assert cfgsel.query(Lib, None, mode, tune=True) == heur[mode]
    monkeypatch.setattr(cfgsel, "TUNE_SOURCES", ("FALLBACK", "B"))
    assert [c.index for c, _ in cfgsel.query(Lib, None, "A", tune=True)[len(A):]] == [0, 1, 57, 12]

    def broken(lib, g, mode):
        if mode != "A":
            raise RuntimeError("heuristics failed")
        return list(A)
    monkeypatch.setattr(cfgsel, "_query", broken)
    assert cfgsel.query(Lib, None, "A", tune=True) == A  # a failing extra source costs nothing


def test_the_selection_keeps_the_fallback_engines_for_the_algorithms_that_allow_them(heur):
    found = cfgsel.query(Lib, None, "A", tune=True)
    ws = dict(found)
    cs = [c for c, _ in found]
    algo3 = cfgsel.for_algo(cs, FILTER + "3", ws)
    assert 0 in [c.index for c in algo3] and 1 in [c.index for c in algo3]
    algo1 = cfgsel.for_algo(cs, FILTER + "1", ws)  # deterministic: never the atomics engine
    assert 0 not in [c.index for c in algo1] and 1 in [c.index for c in algo1]
    algo0 = cfgsel.for_algo(cs, FILTER + "0", ws, zero_workspace=True)  # designated: workspace 0 only
    assert all(ws[c] == 0 for c in algo0) and {c.index for c in algo0} == {30, 33, 57}


# -- tuning_order -------------------------------------------------------------------------------------------

def _order(cfgs, k, k_extra, fails=(), refuse_extra=()):
    calls = []

    def finalize(c, extra):
        calls.append((c, extra))
        if c in fails or (extra and c in refuse_extra):
            return None
        return f"plan{len(calls)}"
    got = cfgsel.tuning_order(cfgs, k, k_extra, finalize)
    assert len({id(c) for c, _ in calls}) == len(calls)  # each config finalized at most once
    kept = [c for c, extra in calls if c not in fails and not (extra and c in refuse_extra)]
    assert [c for c, _ in got] == kept  # in the order finalized
    return got, calls


def test_tuning_order_times_mode_a_top_k_then_fallback_then_one_per_new_engine(heur):
    cs = [c for c, _ in cfgsel.query(Lib, None, "A", tune=True)]
    got, calls = _order(cs, 8, 8)
    idx = [c.index for c, _ in got]
    assert idx[:8] == [30] * 6 + [31] * 2  # mode A's first 8
    # then the FALLBACK configs, then the first config of each engine not timed yet (40 and 33)
    assert idx[8:] == [0, 1, 57, 40, 33]
    assert [e for _, e in calls] == [False] * 8 + [True] * 5
    # the bound holds
    got, _ = _order(cs, 8, 2)
    assert [c.index for c, _ in got][8:] == [0, 1]
    got, _ = _order(cs, 3, 0)
    assert [c.index for c, _ in got] == [30, 30, 30]
    # a remembered winner alone (k=1, no extras), even when it is a FALLBACK config
    got, calls = _order([cs[12]] + cs[:12] + cs[13:], 1, 0)
    assert [c.index for c, _ in got] == [0] and len(calls) == 1


def test_tuning_order_skips_configs_that_do_not_finalize_or_are_refused(heur):
    cs = [c for c, _ in cfgsel.query(Lib, None, "A", tune=True)]
    fails = {cs[0], cs[1], cs[12]}  # two of mode A's first, FALLBACK engine 0
    got, _ = _order(cs, 8, 8, fails=fails)
    idx = [c.index for c, _ in got]
    assert idx[:8] == [30] * 4 + [31] * 4  # k counts finalized configs
    assert idx[8:] == [1, 57, 40, 33]
    # a refused variety pick (too much workspace) is skipped; the next config of that engine may stand in
    twin = [cfg(5, "FALLBACK"), cfg(5, knobs=(("TILE", 1),))]
    got, _ = _order([cfg(9)] + twin, 1, 4, refuse_extra={twin[0]})
    assert [str(c) for c, _ in got] == ["cudnn#9", "cudnn#5[TILE=1]"]
    assert _order([], 8, 8)[0] == []
    got, _ = _order(cs, 8, 8, fails=set(cs))
    assert got == []


def test_extra_k_only_for_plain_convolutions_with_timing_on():
    class Spec:
        pattern = "conv_blend"
    assert tune.extra_k(Spec, 8) == 8 and tune.extra_k(Spec, 32) == 32
    assert tune.extra_k(Spec, 1) == 0 and tune.extra_k(Spec, 0) == 0
    Spec.pattern = "fusion"
    assert tune.extra_k(Spec, 3) == 0


# -- the engine's wiring, native calls replaced by fakes ------------------------------------------------------

SPEED = {0: 0.4, 1: 2.0, 30: 1.5, 31: 1.2, 33: 0.9, 40: 0.1, 57: 3.0}  # engine 40: TENSOR_CORE (TF32)


class FakeNative:
    def __init__(self, spec, handle):
        self.graph, self.spec = "opgraph", spec

    def destroy(self):
        pass


class FakeStatus(Exception):
    detail = "CUDNN_STATUS_NOT_SUPPORTED"


class FakeDesc:
    destroyed = 0

    def destroy(self):
        FakeDesc.destroyed += 1


@pytest.fixture
def engine(monkeypatch, heur):
    import cudnn_compat._backend.engines.cudnn_engine as ce
    timed = []
    finalized = []

    def execution_plan(lib, handle, g, c):
        finalized.append(c)
        if c.index == 30 and c.knob("TILE") == 1:
            raise FakeStatus("not supported")
        return c, dict(A + FB).get(c, 0) or 0, [FakeDesc()]

    def time_plans(spec, plans, device):
        timed.append([p for p, _ in plans])
        return [SPEED[p.index] + 0.01 * dict(p.knobs).get("TILE", 0) for p, _ in plans]

    monkeypatch.setattr(ce._lib, "CudnnStatusError", FakeStatus)
    monkeypatch.setattr(ce, "NativeGraph", FakeNative)
    monkeypatch.setattr(ce, "_device", lambda: 0)
    monkeypatch.setattr(ce._lib, "handle_for", lambda device, stream: 0xAB)
    monkeypatch.setattr(ce._configs, "execution_plan", execution_plan)
    monkeypatch.setattr(ce._autotune, "time_plans", time_plans)
    monkeypatch.setattr(ce._autotune, "_device_id", lambda device: ("Fake GPU", "9.0", 91900))
    monkeypatch.setattr(ce._autotune, "_MEMO", {})
    monkeypatch.delenv("CUDNN_COMPAT_PLAN_CACHE_FILE", raising=False)
    monkeypatch.delenv("CUDNN_COMPAT_CUDNN_AUTOTUNE", raising=False)
    return ce.ENGINE, timed, finalized


def wgrad_graph(algo, math="FMA_MATH", dtype="float32", zero_workspace=False):
    x, dy = (Tensor(u, (32, 64, 56, 56), packed_strides((32, 64, 56, 56)), dtype) for u in (1, 3))
    dw = Tensor(2, (64, 64, 3, 3), packed_strides((64, 64, 3, 3)), dtype)
    attrs = dict(mode="CROSS_CORRELATION", pre_padding=(1, 1), post_padding=(1, 1), stride=(1, 1),
                 dilation=(1, 1), groups=1, compute_type="float32", math_type=math, algo=FILTER + algo,
                 zero_workspace=zero_workspace)
    return OperationGraph(blended("ConvolutionBackwardFilter", {"x": x, "dy": dy}, "dw", dw, True, attrs)).finalize()


def test_the_engine_times_mode_a_top_k_and_the_fallback_engines_and_keeps_the_fastest(engine):
    eng, timed, _ = engine
    got = eng.configs(wgrad_graph("3"), "gpu", "A")
    (batch,) = timed
    idx = [c.index for c in batch]
    # FMA math: engine 40 (TENSOR_CORE) is not allowed; engine 30 TILE=1 does not finalize
    assert 40 not in idx and idx[:8] == [30] * 5 + [31] * 3
    assert set(idx[8:]) == {0, 1, 57, 33}
    assert got[0].index == 0 and "FALLBACK" in got[0].notes  # the legacy engine, 0.4 ms, wins
    assert len(got) == len(set(got)) == len([c for c in cfgsel.query(Lib, None, "A", tune=True)
                                             if c[0].index != 40])
    # remembered per (graph, candidates): the next query times nothing and gives the same winner
    again = eng.configs(wgrad_graph("3"), "gpu", "A")
    assert len(timed) == 1 and again[0] == got[0]


@pytest.mark.parametrize("algo, zero_ws, winner", [("1", False, 33), ("0", True, 33)])
def test_the_algorithm_rules_still_bound_what_is_timed(engine, algo, zero_ws, winner):
    eng, timed, _ = engine
    got = eng.configs(wgrad_graph(algo, zero_workspace=zero_ws), "gpu", "A")
    idx = {c.index for c in timed[0]}
    assert 0 not in idx  # nondeterministic (ALGO_1) / needs a workspace (ALGO_0, designated zero-workspace)
    assert got[0].index == winner


def test_timing_off_keeps_the_old_candidates(engine, monkeypatch):
    eng, timed, finalized = engine
    monkeypatch.setenv("CUDNN_COMPAT_CUDNN_AUTOTUNE", "1")
    got = eng.configs(wgrad_graph("3"), "gpu", "A")
    assert timed == [] and len(finalized) == 1 and got[0] == A[0][0]
    assert [c.index for c in got if "FALLBACK" in c.notes] == [57]  # FALLBACK's zero-workspace configs only


def test_variety_picks_skip_runtime_compiled_and_huge_workspace_configs(engine, heur, monkeypatch):
    """A runtime-compiled FALLBACK config (its finalize compiles: seconds) and one needing more than
    EXTRA_WORKSPACE_CAP are not finalized as variety picks; mode A's own first k still are."""
    eng, timed, finalized = engine
    rtc = cfg(78, "DETERMINISTIC", "FALLBACK", "RUNTIME_COMPILATION")
    huge = cfg(18, "DETERMINISTIC", "FALLBACK")
    heur["FALLBACK"] = [(rtc, 0), (huge, 0)] + FB
    monkeypatch.setattr(tune, "EXTRA_WORKSPACE_CAP", 32 << 20)
    SPEED.update({78: 0.05, 18: 0.05})
    try:
        import cudnn_compat._backend.engines.cudnn_engine as ce
        real = ce._configs.execution_plan

        def plan(lib, handle, g, c):
            p, w, keep = real(lib, handle, g, c)
            return p, (64 << 20 if c.index == 18 else w), keep
        monkeypatch.setattr(ce._configs, "execution_plan", plan)
        got = eng.configs(wgrad_graph("3"), "gpu", "A")
        idx = [c.index for c in timed[0]]
        assert 78 not in idx and 78 not in [c.index for c in finalized]  # never finalized
        assert 18 in [c.index for c in finalized] and 18 not in idx  # finalized, over the cap, released
        assert 0 in idx and got[0].index == 0
        assert tune.extra_ok(cfg(5, "TENSOR_CORE")) and not tune.extra_ok(rtc)
        # runtime-compiled configs in mode A's first k are timed as before
        heur["A"] = [(rtc, 0)] + A
        timed.clear()
        eng.configs(wgrad_graph("3"), "gpu", "A")
        assert timed[0][0].index == 78
    finally:
        del SPEED[78], SPEED[18]
