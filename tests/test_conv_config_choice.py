"""Which native engine configs the cudnn engine's autotune times for a convolution (issue 14 item 4,
issue 24 item 2: every config the backend offers).

cuDNN's "legacy" engines (wgrad_alg0_engine, dgrad_engine: what torch's cudnn.benchmark and the
legacy library pick for fp32 NCHW ResNet-50 layers) can be missing from mode A's first configs and
listed only by the FALLBACK heuristic, with a workspace.  The autotune therefore times mode A's
first k finalizable configs plus up to k more picked for variety (the FALLBACK heuristic's, then
one config of each engine not timed yet), as torch's find-plan times the INSTANT and FALLBACK lists
together.  CPU tests: the pure list rules of ``configs`` (``merge``, ``query(tune=True)``,
``tuning_order``) on fake configs, and the engine's candidate wiring with the native calls replaced
by fakes.  benchmarks/conv_configs.py shows the real lists on a device.
"""
import sys

import pytest

import cudnn_compat as cc
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
INSTANT = [(cfg(30, "DETERMINISTIC", knobs=(("TILE", 0),)), 0), (cfg(44, "DETERMINISTIC"), 256)]


@pytest.fixture
def heur(monkeypatch):
    lists = {"A": A, "FALLBACK": FB, "B": B, "INSTANT": INSTANT}
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


def test_query_for_tuning_adds_every_other_heuristic_mode_other_modes_unchanged(heur, monkeypatch):
    plain = cfgsel.query(Lib, None, "A")
    assert [c.index for c, _ in plain[len(A):]] == [57]  # as before: FALLBACK's zero-workspace ones
    tuned = cfgsel.query(Lib, None, "A", tune=True)
    # every mode: FALLBACK's, INSTANT's and B's configs mode A lacks, whatever their workspace
    assert [(c.index, w) for c, w in tuned[len(A):]] == [(0, 4 << 20), (1, 512), (57, 0), (44, 256), (12, 2048)]
    for mode in ("B", "FALLBACK", "INSTANT"):
        assert cfgsel.query(Lib, None, mode, tune=True) == heur[mode]
    monkeypatch.setattr(cfgsel, "TUNE_SOURCES", ("FALLBACK",))
    assert [c.index for c, _ in cfgsel.query(Lib, None, "A", tune=True)[len(A):]] == [0, 1, 57]

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

def _order(cfgs, k, k_extra, fails=(), refuse_extra=(), every=False):
    calls = []

    def finalize(c, extra):
        calls.append((c, extra))
        if c in fails or (extra and c in refuse_extra):
            return None
        return f"plan{len(calls)}"
    got = cfgsel.tuning_order(cfgs, k, k_extra, finalize, every)
    assert len({id(c) for c, _ in calls}) == len(calls)  # each config finalized at most once
    kept = [c for c, extra in calls if c not in fails and not (extra and c in refuse_extra)]
    assert [c for c, _ in got] == kept  # in the order finalized
    return got, calls


def test_tuning_order_times_mode_a_top_k_then_fallback_then_one_per_new_engine(heur):
    cs = [c for c, _ in cfgsel.query(Lib, None, "A", tune=True)]
    got, calls = _order(cs, 8, 8)
    idx = [c.index for c, _ in got]
    assert idx[:8] == [30] * 6 + [31] * 2  # mode A's first 8
    # then the FALLBACK configs, then the first config of each engine not timed yet
    assert idx[8:] == [0, 1, 57, 40, 33, 44, 12]
    assert [e for _, e in calls] == [False] * 8 + [True] * 7
    # every=True: every remaining config, not one per engine
    got, _ = _order(cs, 8, 100, every=True)
    assert [c for c, _ in got] == cs[:8] + [c for c in cs if "FALLBACK" in c.notes] + \
        [c for c in cs[8:] if "FALLBACK" not in c.notes]
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
    assert idx[8:] == [1, 57, 40, 33, 44, 12]
    # a refused variety pick (too much workspace) is skipped; the next config of that engine may stand in
    twin = [cfg(5, "FALLBACK"), cfg(5, knobs=(("TILE", 1),))]
    got, _ = _order([cfg(9)] + twin, 1, 4, refuse_extra={twin[0]})
    assert [str(c) for c, _ in got] == ["cudnn#9", "cudnn#5[TILE=1]"]
    assert _order([], 8, 8)[0] == []
    got, _ = _order(cs, 8, 8, fails=set(cs))
    assert got == []


def test_extra_k_only_for_plain_convolutions_with_timing_on(monkeypatch):
    class Spec:
        pattern = "conv_blend"
    monkeypatch.delenv("CUDNN_COMPAT_CUDNN_AUTOTUNE", raising=False)
    assert tune.top_k(Spec) is None and tune.extra_k(Spec, None) >= 1 << 20  # unset: every config
    monkeypatch.setenv("CUDNN_COMPAT_CUDNN_AUTOTUNE", "8")
    assert tune.top_k(Spec) == 8
    assert tune.extra_k(Spec, 8) == 8 and tune.extra_k(Spec, 32) == 32
    assert tune.extra_k(Spec, 1) == 0 and tune.extra_k(Spec, 0) == 0
    Spec.pattern = "fusion"
    assert tune.extra_k(Spec, 3) == 0
    monkeypatch.delenv("CUDNN_COMPAT_CUDNN_AUTOTUNE")
    assert tune.top_k(Spec) == 3


# -- math rules: reduced-precision reduction -----------------------------------------------------------------

@pytest.mark.parametrize("math, data, compute, ok", [
    ("TENSOR_OP_MATH", "float16", "float32", True),  # what the legacy library and torch run for fp16 (stem)
    ("TENSOR_OP_MATH_ALLOW_CONVERSION", "bfloat16", "float32", True),
    ("DEFAULT_MATH", "float16", "float32", False),  # only where Tensor Core math was asked for
    ("FMA_MATH", "float16", "float32", False),
    ("TENSOR_OP_MATH", "float32", "float32", False),  # never for float data
    ("DEFAULT_MATH", "float16", "float16", True),  # TRUE_HALF: the reduction is half anyway
    (None, "float16", "float32", False),
])
def test_reduced_precision_reduction_only_for_half_data_under_tensor_op_math(math, data, compute, ok):
    notes = {"TENSOR_CORE", "REDUCED_PRECISION_REDUCTION", "DETERMINISTIC"}
    assert cfgsel.allowed_by_math(notes, math, data, compute) is ok


# -- knob variants ------------------------------------------------------------------------------------------

def test_knob_variants_move_one_knob_at_a_time_over_its_range():
    base = cfg(30, "DETERMINISTIC", "FALLBACK", knobs=(("SPLIT_K", 1), ("TILE", 2)))
    space = [("SPLIT_K", 1, 16, 1), ("TILE", 0, 3, 1), ("EDGE", 0, 1, 1), ("STAGES", 2, 2, 1)]
    got = cfgsel.knob_variants(base, space, per_knob=4, cap=100)
    keys = [dict(c.knobs) for c in got]
    assert [k["SPLIT_K"] for k in keys if k["TILE"] == 2] == [6, 11, 16]  # 1, 6, 11, 16 spread; 1 is the base
    assert [k["TILE"] for k in keys if k["SPLIT_K"] == 1] == [0, 1, 3]  # every other TILE value (4 values)
    assert all("EDGE" not in k and "STAGES" not in k for k in keys)  # a fixed knob, a one-value range
    assert all(c.index == 30 and "KNOB_VARIANT" in c.notes and "FALLBACK" not in c.notes and
               "DETERMINISTIC" in c.notes for c in got)
    assert len(cfgsel.knob_variants(base, space, per_knob=4, cap=2)) == 2
    assert cfgsel.knob_variants(base, []) == []
    # a stride: values on the knob's grid only
    got = cfgsel.knob_variants(cfg(5), [("SPLIT_K_SLC", 0, 64, 16)], per_knob=10)
    assert [dict(c.knobs)["SPLIT_K_SLC"] for c in got] == [0, 16, 32, 48, 64]


def test_with_variants_expands_the_first_engines_once_without_duplicates():
    cs = [c for c, _ in A]  # engine 30 (TILE 0-5), 31, 40, 33
    spaces = {30: [("TILE", 0, 7, 1)], 31: [("SPLIT_K", 1, 2, 1)], 33: [("TILE", 0, 1, 1)]}
    got = cfgsel.with_variants(cs, spaces, engines=3)
    assert got[:len(cs)] == cs
    extra = got[len(cs):]
    # engine 30: TILE values its listed configs lack (6, 7); 31: SPLIT_K set (its config leaves it to the
    # engine); 40: no knob info; 33: not among the first 3 engines
    assert [(c.index, dict(c.knobs)) for c in extra] == [(30, {"TILE": 6}), (30, {"TILE": 7}),
                                                         (31, {"TILE": 0, "SPLIT_K": 1}), (31, {"TILE": 0, "SPLIT_K": 2})]
    assert len({(c.index, c.knobs) for c in got}) == len(got)


# -- search: every candidate timed once per graph signature -------------------------------------------------

def test_search_times_each_new_candidate_once_and_takes_the_fastest_that_finalizes():
    cs = [cfg(i) for i in range(6)]
    speed = {0: 3.0, 1: 2.0, 2: 0.5, 3: 1.0, 4: 0.1, 5: 0.7}
    finalized, timed, destroyed = [], [], []

    class Keep:
        def __init__(self, c):
            self.c = c

        def destroy(self):
            destroyed.append(self.c)

    def finalize(c, extra):
        finalized.append(c)
        return None if c.index == 4 else (c, 0, [Keep(c)])  # the fastest on paper does not finalize

    def time_plans(plans):
        timed.append([p for p, _ in plans])
        return [speed[p.index] for p, _ in plans]
    times = {}
    win, (plan, _w, keep), ranked = tune.search(cs, times, finalize, time_plans, 2, 100, True)
    assert win == cs[2] and plan == cs[2]
    assert timed == [[c for c in cs if c.index != 4]] and times == {c: speed[c.index] for c in cs if c.index != 4}
    assert [c for c, _ in ranked] == sorted((c for c in cs if c.index != 4), key=lambda c: speed[c.index])
    assert sorted(c.index for c in destroyed) == [0, 1, 3, 5]  # every plan but the winner's
    # the same graph again (another legacy algorithm, the other blend): nothing new is timed; the
    # winner among its own candidates is finalized again
    finalized.clear()
    win2, _, ranked2 = tune.search([cs[0], cs[1], cs[3]], times, finalize, time_plans, 2, 100, True)
    assert len(timed) == 1 and win2 == cs[3] and finalized == [cs[3]]
    assert [t for _, t in ranked2] == [1.0, 2.0, 3.0]
    # a single candidate: finalized, not timed
    win3, _, ranked3 = tune.search([cfg(9)], {}, finalize, time_plans, 2, 100, True)
    assert win3 == cfg(9) and len(timed) == 1 and len(ranked3) == 1
    assert tune.search([cs[4]], {}, finalize, time_plans, 2, 100, True) is None


# -- the engine's wiring, native calls replaced by fakes ------------------------------------------------------

SPEED = {0: 0.4, 1: 2.0, 12: 0.7, 30: 1.5, 31: 1.2, 33: 0.9, 40: 0.1, 44: 2.5, 57: 3.0}  # 40: TENSOR_CORE (TF32)
SPACES = {30: [("TILE", 0, 7, 1), ("SPLIT_K", 1, 4, 1)], 31: [("SPLIT_K", 1, 8, 1)]}
BONUS = {}  # (engine, knob, value) -> ms taken off


def speed(c):
    k = dict(c.knobs)
    return SPEED[c.index] + 0.01 * k.get("TILE", 0) - sum(BONUS.get((c.index, n, v), 0.0) for n, v in k.items())


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
        return c, dict(A + FB + B + INSTANT).get(c, 0) or 0, [FakeDesc()]

    def time_plans(spec, plans, device):
        timed.append([p for p, _ in plans])
        return [speed(p) for p, _ in plans]

    monkeypatch.setattr(ce._lib, "CudnnStatusError", FakeStatus)
    monkeypatch.setattr(ce, "NativeGraph", FakeNative)
    monkeypatch.setattr(ce, "_device", lambda: 0)
    monkeypatch.setattr(ce._lib, "handle_for", lambda device, stream: 0xAB)
    monkeypatch.setattr(ce._configs, "execution_plan", execution_plan)
    monkeypatch.setattr(ce._configs, "knob_space", lambda lib, g, index: list(SPACES.get(index, ())))
    monkeypatch.setattr(ce._autotune, "time_plans", time_plans)
    monkeypatch.setattr(ce._autotune, "_device_id", lambda device: ("Fake GPU", "9.0", 91900))
    monkeypatch.setattr(ce._autotune, "_MEMO", {})
    monkeypatch.setattr(ce._autotune, "TIMES", {})
    monkeypatch.setattr(sys.modules[__name__], "BONUS", {})
    monkeypatch.delenv("CUDNN_COMPAT_PLAN_CACHE_FILE", raising=False)
    monkeypatch.delenv("CUDNN_COMPAT_CUDNN_AUTOTUNE", raising=False)
    return ce.ENGINE, timed, finalized


def wgrad_graph(algo, math="FMA_MATH", dtype="float32", zero_workspace=False, beta_zero=True):
    x, dy = (Tensor(u, (32, 64, 56, 56), packed_strides((32, 64, 56, 56)), dtype) for u in (1, 3))
    dw = Tensor(2, (64, 64, 3, 3), packed_strides((64, 64, 3, 3)), dtype)
    attrs = dict(mode="CROSS_CORRELATION", pre_padding=(1, 1), post_padding=(1, 1), stride=(1, 1),
                 dilation=(1, 1), groups=1, compute_type="float32", math_type=math, algo=FILTER + algo,
                 zero_workspace=zero_workspace)
    return OperationGraph(blended("ConvolutionBackwardFilter", {"x": x, "dy": dy}, "dw", dw, beta_zero,
                                  attrs)).finalize()


def offered(algo="3"):
    """Every config the fake backend offers for an FMA-math graph of ``algo``: each heuristic mode's
    list (TENSOR_CORE engine 40 not allowed), then the knob variants of the first engines."""
    found = cfgsel.query(Lib, None, "A", tune=True)
    cs = cfgsel.for_algo([c for c, _ in found if c.index != 40], FILTER + algo, dict(found))
    return cfgsel.with_variants(cs, SPACES)


@pytest.mark.parametrize("algo", ["3", "1"])
def test_every_offered_config_is_timed_once_and_the_fastest_wins(engine, algo):
    eng, timed, finalized = engine
    got = eng.configs(wgrad_graph(algo), "gpu", "A")
    (batch,) = timed
    want = [c for c in offered(algo) if not (c.index == 30 and c.knob("TILE") == 1)]  # that one does not finalize
    assert sorted(map(str, batch)) == sorted(map(str, want)) and len(batch) == len(set(batch))
    assert any("KNOB_VARIANT" in c.notes for c in batch) and {0, 12, 44, 57} & {c.index for c in batch}
    assert got[0] == min(want, key=speed)  # engine 0 (0.4 ms) for ALGO_3; deterministic ALGO_1: engine 12
    assert got[0].index == (0 if algo == "3" else 12)
    assert set(got) == set(offered(algo))


def test_a_knob_variant_no_heuristic_lists_wins_when_it_is_fastest(engine):
    eng, timed, _ = engine
    BONUS[(31, "SPLIT_K", 8)] = 1.15  # engine 31 with SPLIT_K=8: 0.05 ms
    got = eng.configs(wgrad_graph("3"), "gpu", "A")
    assert got[0].index == 31 and got[0].knob("SPLIT_K") == 8 and "KNOB_VARIANT" in got[0].notes


def test_the_winner_is_cached_by_signature_and_times_are_shared_by_the_graph(engine, tmp_path, monkeypatch):
    eng, timed, finalized = engine
    first = eng.configs(wgrad_graph("3"), "gpu", "A")
    assert len(timed) == 1
    # the same signature: the remembered winner alone is finalized, nothing timed
    finalized.clear()
    again = eng.configs(wgrad_graph("3"), "gpu", "A")
    assert len(timed) == 1 and again[0] == first[0] and finalized == [first[0]]
    # the other blend (beta != 0) and another legacy algorithm of the same graph: no config timed twice
    eng.configs(wgrad_graph("3", beta_zero=False), "gpu", "A")
    eng.configs(wgrad_graph("1"), "gpu", "A")
    assert len(timed) == 1
    # a new process (empty memo and times) with the plan-cache file: the choice comes from the file
    monkeypatch.setenv("CUDNN_COMPAT_PLAN_CACHE_FILE", str(tmp_path / "plans.json"))
    monkeypatch.setattr(tune, "_MEMO", {})
    monkeypatch.setattr(tune, "TIMES", {})
    won = eng.configs(wgrad_graph("0"), "gpu", "A")
    assert len(timed) == 2
    monkeypatch.setattr(tune, "_MEMO", {})
    monkeypatch.setattr(tune, "TIMES", {})
    before = tune.STATS["from_file"]
    assert eng.configs(wgrad_graph("0"), "gpu", "A")[0] == won[0]
    assert len(timed) == 2 and tune.STATS["from_file"] == before + 1


def test_capped_autotune_times_mode_a_top_k_and_the_other_modes_engines(engine, monkeypatch):
    eng, timed, _ = engine
    monkeypatch.setenv("CUDNN_COMPAT_CUDNN_AUTOTUNE", "8")
    got = eng.configs(wgrad_graph("3"), "gpu", "A")
    (batch,) = timed
    idx = [c.index for c in batch]
    # FMA math: engine 40 (TENSOR_CORE) is not allowed; engine 30 TILE=1 does not finalize
    assert 40 not in idx and idx[:8] == [30] * 5 + [31] * 3
    assert set(idx[8:]) == {0, 1, 57, 33, 44, 12}  # one of each other engine, no knob variants
    assert not any("KNOB_VARIANT" in c.notes for c in batch)
    assert got[0].index == 0 and "FALLBACK" in got[0].notes  # the legacy engine, 0.4 ms, wins


@pytest.mark.parametrize("algo, zero_ws, winner", [("1", False, 12), ("0", True, 33)])
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
    EXTRA_WORKSPACE_CAP are not finalized beyond mode A's first configs; mode A's own first ones are."""
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
        # runtime-compiled configs in mode A's first ones are timed as before
        heur["A"] = [(rtc, 0)] + A
        timed.clear()
        monkeypatch.setattr(tune, "TIMES", {})
        eng.configs(wgrad_graph("1"), "gpu", "A")
        assert timed[0][0].index == 78
    finally:
        del SPEED[78], SPEED[18]


# -- Find's perf results on a fake cudnn backend ---------------------------------------------------------------

class FakePlan:
    def __init__(self, engine, config, workspace):
        self.engine, self.config, self.workspace_size = engine, config, workspace


@pytest.mark.parametrize("query", ["fwd", "bwd_filter"])
def test_find_reports_each_plans_own_time_memory_determinism_and_math_type(handle, monkeypatch, query):
    """Find through the legacy layer with the plans replaced by fake cudnn plans: every supported
    algorithm is reported with its plan's measured time (sorted), its workspace, the determinism its
    config's notes say and the math type it ran with; algorithms whose plans got the same native
    config are timed once (the autotune gave them the same winner)."""
    from cudnn_compat.convolution import api
    from conv_util import cdesc, fdesc
    from conftest import tdesc
    xs, ws_, ys = (2, 3, 6, 6), (4, 3, 3, 3), (2, 4, 6, 6)
    xd, wd, yd, cd = tdesc(xs), fdesc(ws_), tdesc(ys), cdesc((1, 1))
    fast = cfg(45, "DETERMINISTIC", "TENSOR_CORE")
    atomics = cfg(0, "NONDETERMINISTIC", "FALLBACK")
    other = cfg(12, "DETERMINISTIC")
    by_algo = {"IMPLICIT_GEMM": (other, 0), "IMPLICIT_PRECOMP_GEMM": (fast, 4096), "GEMM": (fast, 4096),
               "ALGO_0": (atomics, 512), "ALGO_1": (fast, 4096), "ALGO_3": (atomics, 512)}
    speed = {45: 0.25, 0: 0.5, 12: 1.5}

    def need(h, call, name, math):
        c, w = by_algo.get(name, (other, 0))
        return w, FakePlan("cudnn", c, w)
    timed, current = [], [None]

    def time_ms(h, fn):  # the time of the plan _need gave last
        timed.append(current[0])
        return speed[current[0].index]

    def need_and_note(h, call, name, math):
        got = need(h, call, name, math)
        current[0] = got[1].config
        return got
    monkeypatch.setattr(api, "_need", need_and_note)
    monkeypatch.setattr(api, "_time_ms", time_ms)
    if query == "fwd":
        perf = cc.findConvolutionForwardAlgorithm(handle, xd, wd, cd, yd, 20)
    else:
        perf = cc.findConvolutionBackwardFilterAlgorithm(handle, xd, yd, cd, wd, 20)
    good = [p for p in perf if p.status == cc.CUDNN_STATUS_SUCCESS]
    assert good and [p.time for p in good] == sorted(p.time for p in good)
    assert len(timed) == len(set(timed))  # one timing per native config
    names = {v: k for k, v in (api.FWD if query == "fwd" else api.BWD_FILTER).algos().items()}
    for p in good:
        c, w = by_algo.get(names[p.algo], (other, 0))
        assert p.time == speed[c.index] and p.memory == w
        assert p.determinism == (cc.CUDNN_NON_DETERMINISTIC if "NONDETERMINISTIC" in c.notes else cc.CUDNN_DETERMINISTIC)
        assert p.mathType == cc.CUDNN_DEFAULT_MATH  # convDesc's (no Tensor Cores on the CPU place)


# -- a call's workspace limit (graph.workspace_limit, _core/call.fit_workspace) ---------------------------------

WS = dict(A + FB + B + INSTANT)  # the fake plans' workspace (knob variants: 0)


def limited(graph, limit):
    graph.workspace_limit = limit
    return graph


def test_under_a_workspace_limit_the_fastest_config_that_fits_wins_and_nothing_is_timed_again(engine):
    eng, timed, finalized = engine
    assert eng.configs(wgrad_graph("3"), "gpu", "A")[0].index == 0  # 0.4 ms, 4 MiB of workspace
    for limit, winner in ((4 << 20, 0), (4096, 12), (2047, 33), (0, 33)):  # 12: 0.7 ms, 2048 bytes; 33: 0.9, 0
        finalized.clear()
        got = eng.configs(limited(wgrad_graph("3"), limit), "gpu", "A")
        assert got[0].index == winner and WS.get(got[0], 0) <= limit, limit
        assert len(timed) == 1  # the graph's times are shared: no config timed twice
        assert got[0] in finalized and all(WS.get(c, 0) <= limit for c in finalized)  # the unfit: not finalized
        # the limit is part of the remembered choice: the same limit again finalizes the winner alone
        finalized.clear()
        assert eng.configs(limited(wgrad_graph("3"), limit), "gpu", "A")[0] == got[0] and finalized == [got[0]]
    # the call's own plan (no limit) still gets the fastest of all
    assert eng.configs(wgrad_graph("3"), "gpu", "A")[0].index == 0


def test_a_limited_search_first_times_only_what_fits_and_the_full_search_times_the_rest(engine):
    eng, timed, _ = engine
    got = eng.configs(limited(wgrad_graph("3"), 1000), "gpu", "A")
    assert got[0].index == 33
    (batch,) = timed
    assert batch and all(WS.get(c, 0) <= 1000 for c in batch) and {0, 12} & {c.index for c in batch} == set()
    assert eng.configs(wgrad_graph("3"), "gpu", "A")[0].index == 0
    assert len(timed) == 2 and timed[1] and all(WS.get(c, 0) > 1000 for c in timed[1])


def test_when_no_config_fits_the_engine_declines_naming_the_workspace(engine, monkeypatch):
    import cudnn_compat._backend.engines.cudnn_engine as ce
    from cudnn_compat._backend.engines.base import EngineDeclined
    eng, _, _ = engine
    real = ce._configs.execution_plan

    def plus_100(lib, handle, g, c):  # every plan needs 100 bytes more
        p, w, keep = real(lib, handle, g, c)
        return p, w + 100, keep
    monkeypatch.setattr(ce._configs, "execution_plan", plus_100)
    got = eng.configs(limited(wgrad_graph("3"), 50), "gpu", "A")
    assert len(got) == 1 and got[0].index < 0
    assert "no engine config finalized within the call's 50 bytes of workspace" in got[0].knob("declined")
    with pytest.raises(EngineDeclined, match="needs 100 bytes of workspace, the call gave 50"):
        eng.build(limited(wgrad_graph("3"), 50), cfg(33, "DETERMINISTIC"))
