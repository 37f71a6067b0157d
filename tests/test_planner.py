"""The graph layer itself: finalize checks, heuristics, plan cache, engine fallback, threads."""
import threading

import numpy as np
import pytest

import cudnn_compat._backend as _backend
import cudnn_compat as cc
from cudnn_compat._backend import heuristics
from cudnn_compat._backend.engines.base import REGISTRY, Engine, EngineDeclined, ExecutionPlan
from cudnn_compat._backend.ir import GraphError, Operation, OperationGraph, Tensor, scalar, virtual
from cudnn_compat._backend.plan_cache import PlanCache
from conftest import tdesc


def t(uid, dims, **kw):
    return Tensor(uid, dims, _backend.packed_strides(dims), "float32", **kw)


def pw(x, y, mode="IDENTITY", **inputs):
    return Operation("Pointwise", {"x": x, **inputs}, {"y": y}, {"mode": mode})


@pytest.mark.parametrize("ops, check", [
    ([], "OPERATIONGRAPH_OPS"),
    ([Operation("Nope", {"x": t(1, (2,))}, {"y": t(2, (2,))})], "OPERATION_KIND"),
    ([Operation("Pointwise", {}, {"y": t(2, (2,))}, {"mode": "IDENTITY"})], "OPERATION_INPUTS"),
    ([pw(t(1, (2,)), t(1, (2,)))], "OPERATION_READ_WRITE"),
    ([pw(t(1, (2,)), t(2, (2,))), pw(t(3, (2,)), t(2, (2,)))], "TENSOR_SINGLE_PRODUCER"),
    ([pw(t(1, (2,)), t(2, (3,)))], "POINTWISE_BROADCAST"),
    ([pw(virtual(5, (2,)), t(2, (2,)))], "VIRTUAL_TENSOR_PRODUCER"),
    ([pw(t(1, (2,)), virtual(5, (2,)))], "VIRTUAL_TENSOR_CONSUMER"),
    ([pw(t(1, (2,)), t(2, (2,)), "ADD")], "POINTWISE_B"),
    ([pw(t(1, (2,)), t(2, (2,))), pw(t(1, (3,)), t(4, (3,)))], "TENSOR_UNIQUE_ID"),
    ([pw(virtual(5, (2,)), t(2, (2,))), pw(t(1, (2,)), virtual(5, (2,)))], "OPERATIONGRAPH_ORDER"),
])
def test_finalize_names_the_failed_check(ops, check):
    with pytest.raises(GraphError) as e:
        OperationGraph(ops).finalize()
    assert e.value.check == check and check in str(e.value)


def test_heuristics_modes_and_forced_engine(monkeypatch):
    g = OperationGraph([pw(t(1, (2,)), t(2, (2,)))]).finalize()
    for mode in ("A", "B", "FALLBACK"):
        cfgs, _ = heuristics.get_engine_configs(g, "cpu", mode)
        # FALLBACK mode keeps the engines noted FALLBACK: the reference engine only
        assert [e.name for e, _ in cfgs] == (["reference"] if mode == "FALLBACK" else ["numpy", "reference"])
    with pytest.raises(ValueError):
        heuristics.get_engine_configs(g, "cpu", "C")
    monkeypatch.setenv("CUDNN_COMPAT_ENGINE", "no_such_engine")
    with pytest.raises(GraphError) as e:
        _backend.make_plan(OperationGraph([pw(t(1, (2,)), t(2, (2,)))]), "cpu")
    assert e.value.status == "NOT_SUPPORTED" and "no_such_engine" in str(e.value)


def test_plan_cache_lru_and_info():
    class P(ExecutionPlan):  # the cache keeps its use counts in ExecutionPlan's declared fields
        __slots__ = ("released",)

        def __init__(self):
            super().__init__(None, None)
            self.released = False

        def release(self):
            self.released = True

    c = PlanCache(maxsize=2)
    p1, p2, p3 = P(), P(), P()
    c.put("a", p1)
    c.put("b", p2)
    assert c.get("a") is p1  # a is now most recent
    c.put("c", p3)  # evicts b
    assert c.get("b") is None and p2.released and not p1.released
    assert c.info() == (1, 1, 2, 2)
    c.evict("a")
    assert p1.released and c.info().currsize == 1


def test_cache_size_from_environment(monkeypatch):
    monkeypatch.setenv("CUDNN_COMPAT_PLAN_CACHE_SIZE", "7")
    assert PlanCache().info().maxsize == 7


class FaultyEngine(Engine):
    """An engine that accepts every graph and fails at execute, before writing anything."""
    name = "faulty"
    places = ("cpu",)
    runs = 0

    def build(self, graph, config):
        eng = self

        class Plan(ExecutionPlan):
            def execute(self, pack, stream=None):
                eng.runs += 1
                raise EngineDeclined("faulty", "simulated execute failure")
        return Plan(graph, config)


def test_execute_failure_falls_back_and_evicts(monkeypatch, handle, caplog):
    eng = FaultyEngine()
    monkeypatch.setitem(REGISTRY.engines, "faulty", eng)
    monkeypatch.setitem(heuristics.ORDER, "cpu", ("faulty", "reference"))
    cc.plan_cache_clear()
    d = tdesc((1, 3, 2, 2))
    y = np.full(12, np.nan, np.float32)
    with caplog.at_level("WARNING", logger="cudnn_compat"):
        cc.setTensor(handle, d, y, 4.0)
    assert np.all(y == 4.0) and eng.runs == 1
    assert "simulated execute failure" in caplog.text
    cc.setTensor(handle, d, y, 5.0)  # the cached plan is now the reference one
    assert np.all(y == 5.0) and eng.runs == 1
    cc.plan_cache_clear()


def test_threads_share_handle_and_cache(handle):
    cc.plan_cache_clear()
    shapes = [(1, c, 3, 3) for c in range(1, 9)]
    descs = [(tdesc((1, s[1], 1, 1)), tdesc(s)) for s in shapes]
    calls_per_thread = 50
    results, errors = {}, []

    def work(k):
        try:
            ad, cd = descs[k]
            a = np.arange(shapes[k][1], dtype=np.float32) + k
            out = np.zeros(int(np.prod(shapes[k])), np.float32)
            for _ in range(calls_per_thread):
                cc.addTensor(handle, 1.0, ad, a, 1.0, cd, out)
            results[k] = out
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for k, s in enumerate(shapes):
        want = calls_per_thread * (np.arange(s[1], dtype=np.float32) + k)
        np.testing.assert_allclose(results[k].reshape(s), np.broadcast_to(want.reshape(1, -1, 1, 1), s))
    info = cc.plan_cache_info()
    assert info.hits + info.misses == 8 * calls_per_thread and info.misses == 8


class CrashingEngine(FaultyEngine):
    """An engine whose execute raises an arbitrary exception (a bug), or runs out of memory."""
    name = "crashing"
    exc = KeyError(19)

    def build(self, graph, config):
        eng = self

        class Plan(ExecutionPlan):
            def execute(self, pack, stream=None):
                eng.runs += 1
                raise eng.exc
        return Plan(graph, config)


def test_engine_crash_falls_back_and_oom_is_alloc_failed(monkeypatch, handle, caplog):
    eng = CrashingEngine()
    monkeypatch.setitem(REGISTRY.engines, "crashing", eng)
    monkeypatch.setitem(heuristics.ORDER, "cpu", ("crashing", "reference"))
    cc.plan_cache_clear()
    d = tdesc((1, 2, 1, 1))
    y = np.zeros(2, np.float32)
    with caplog.at_level("ERROR", logger="cudnn_compat"):
        cc.setTensor(handle, d, y, 3.0)
    assert np.all(y == 3.0) and "KeyError" in caplog.text
    cc.plan_cache_clear()

    class OutOfMemoryError(Exception):
        pass
    eng.exc = OutOfMemoryError("workspace")
    y[...] = 0
    with pytest.raises(cc.CuDNNError) as e:
        cc.setTensor(handle, d, y, 3.0)
    assert e.value.status == cc.CUDNN_STATUS_ALLOC_FAILED and np.all(y == 0)
    cc.plan_cache_clear()
