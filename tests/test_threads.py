"""Threads (issue 10): one handle and the plan cache shared by 8 threads.

rule_threads_match_one_thread          8 threads hammering mixed calls (convolution, softmax, pooling,
                                       batch norm, tensor ops, activation) on one handle give, bit for bit,
                                       the results of the same calls run on one thread
rule_cache_counters_add_up             hits + misses == cache lookups (one per call), misses >= the
                                       distinct signatures, and every signature ends up cached once
rule_evicted_plan_in_use_not_released  a plan evicted by one thread while another runs it is released
                                       only when that call is done (a native plan freed under a running
                                       call would crash); a released plan is never executed
rule_descriptor_ids_unique_across_threads / rule_errors_stay_in_their_call
tests/test_planner.py has the basic 8-thread AddTensor test; these extend it.
"""
import threading
import time

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import heuristics, planner
from cudnn_compat._backend.engines.base import REGISTRY, Engine, ExecutionPlan
from cudnn_compat._backend.plan_cache import PlanCache
from conftest import tdesc

THREADS = 8


def run_threads(fn, n=THREADS):
    """Start n threads on fn(k) together (a barrier), join them, re-raise the first error."""
    errors, barrier = [], threading.Barrier(n)

    def body(k):
        try:
            barrier.wait()
            fn(k)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def fdesc(k, c, r, s):
    d = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(d, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, k, c, r, s)
    return d


class Workload:
    """Mixed legacy calls with their own inputs and outputs, for one thread (``k`` varies shapes, so
    threads share some signatures and not others)."""

    def __init__(self, handle, k, rng):
        c = 2 + k % 3
        x_shape = (2, c, 5, 5)
        self.h = handle
        self.x = rng.standard_normal(x_shape).astype(np.float32)
        self.xd = tdesc(x_shape)
        self.xd_nhwc = tdesc(x_shape, fmt=cc.CUDNN_TENSOR_NHWC)
        self.w = rng.standard_normal((4, c, 3, 3)).astype(np.float32)
        self.wd = fdesc(4, c, 3, 3)
        self.conv = cc.cudnnCreateConvolutionDescriptor()
        cc.cudnnSetConvolution2dDescriptor(self.conv, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
        self.yd = tdesc((2, 4, 5, 5))
        self.pool = cc.cudnnCreatePoolingDescriptor()
        cc.cudnnSetPooling2dDescriptor(self.pool, cc.CUDNN_POOLING_MAX, 0, 2, 2, 0, 0, 2, 2)
        self.pd = tdesc((2, c, 2, 2))
        self.bn = tdesc((1, c, 1, 1))
        self.scale, self.bias = rng.random(c).astype(np.float32) + 0.5, rng.standard_normal(c).astype(np.float32)
        self.mean, self.var = rng.standard_normal(c).astype(np.float32), rng.random(c).astype(np.float32) + 0.1
        self.act = cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetActivationDescriptor(self.act, cc.CUDNN_ACTIVATION_TANH, 0, 0.0)
        self.op = cc.cudnnCreateOpTensorDescriptor()
        cc.cudnnSetOpTensorDescriptor(self.op, cc.CUDNN_OP_TENSOR_MUL, cc.CUDNN_DATA_FLOAT, 0)
        self.out = {name: np.zeros(n, np.float32) for name, n in
                    (("conv", 200), ("softmax", self.x.size), ("pool", 8 * c), ("bn", self.x.size),
                     ("bn_run_mean", c), ("bn_run_var", c), ("add", self.x.size), ("op", self.x.size),
                     ("act", self.x.size), ("nhwc", self.x.size))}
        self.out["bn_run_var"][...] = 1.0

    def calls(self):
        """[(name, thunk)]: each thunk makes exactly one legacy call (one plan-cache lookup)."""
        h, o = self.h, self.out
        return [
            ("conv", lambda: cc.cudnnConvolutionForward(h, 1.0, self.xd, self.x, self.wd, self.w, self.conv, 0, None, 0,
                                                        0.5, self.yd, o["conv"])),
            ("softmax", lambda: cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0,
                                                       self.xd, self.x, 0.0, self.xd, o["softmax"])),
            ("pool", lambda: cc.cudnnPoolingForward(h, self.pool, 1.0, self.xd, self.x, 1.0, self.pd, o["pool"])),
            ("bn", lambda: cc.cudnnBatchNormalizationForwardInference(
                h, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, self.xd, self.x, self.xd, o["bn"], self.bn, self.scale,
                self.bias, self.mean, self.var, 1e-5)),
            ("bn_train", lambda: cc.cudnnBatchNormalizationForwardTraining(
                h, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, self.xd, self.x, self.xd, o["bn"], self.bn, self.scale,
                self.bias, 0.1, o["bn_run_mean"], o["bn_run_var"], 1e-5, None, None)),
            ("add", lambda: cc.cudnnAddTensor(h, 0.25, self.bn, self.bias, 1.0, self.xd, o["add"])),
            ("op", lambda: cc.cudnnOpTensor(h, self.op, 1.0, self.xd, self.x, 2.0, self.xd, self.x, 0.0, self.xd,
                                            o["op"])),
            ("act", lambda: cc.cudnnActivationForward(h, self.act, 1.0, self.xd, self.x, 0.0, self.xd, o["act"])),
            ("nhwc", lambda: cc.cudnnTransformTensor(h, 1.0, self.xd, self.x, 1.0, self.xd_nhwc, o["nhwc"])),
        ]

    def run(self, rounds, order):
        calls = self.calls()
        for r in range(rounds):
            for i in order[r % len(order)]:
                calls[i][1]()

    def snapshot(self):
        return {k: v.copy() for k, v in self.out.items()}


def _orders(rng, n_calls):
    return [list(rng.permutation(n_calls)) for _ in range(4)]


def test_rule_threads_match_one_thread(handle):
    """rule_threads_match_one_thread + rule_cache_counters_add_up."""
    rounds = 12
    rng = np.random.default_rng(7)
    single = [Workload(handle, k, np.random.default_rng(k)) for k in range(THREADS)]
    n_calls = len(single[0].calls())
    orders = [_orders(rng, n_calls) for _ in range(THREADS)]
    for k, w in enumerate(single):  # one thread, one workload after the other
        w.run(rounds, orders[k])
    want = [w.snapshot() for w in single]

    cc.plan_cache_clear()
    multi = [Workload(handle, k, np.random.default_rng(k)) for k in range(THREADS)]
    run_threads(lambda k: multi[k].run(rounds, orders[k]))
    for k, w in enumerate(multi):
        for name, arr in w.out.items():
            np.testing.assert_array_equal(arr, want[k][name], err_msg=f"thread {k} output {name}")
    info = cc.plan_cache_info()
    calls = THREADS * rounds * n_calls
    distinct = 3 * n_calls  # three channel counts (2, 3, 4) between the threads
    assert info.hits + info.misses == calls, info
    assert distinct <= info.misses <= distinct * THREADS, info
    assert info.currsize == distinct, info


def test_rule_cache_counters_one_lookup_per_call(handle):
    """The workload's calls each make exactly one plan-cache lookup (the premise of the count above)."""
    w = Workload(handle, 0, np.random.default_rng(0))
    for name, call in w.calls():
        call()
        before = cc.plan_cache_info()
        call()
        after = cc.plan_cache_info()
        assert (after.hits - before.hits, after.misses - before.misses) == (1, 0), name


class FragileEngine(Engine):
    """Plans that hold a (simulated) native resource: ``release`` frees it, and executing a released
    plan is counted as a use-after-free, as libcudnn would crash on it."""

    name = "fragile"
    places = ("cpu",)

    def __init__(self):
        self.use_after_release = 0
        self.released = 0
        self.lock = threading.Lock()

    def build(self, graph, config):
        eng = self
        ref = REGISTRY.engines["reference"].build(graph, config)

        class Plan(ExecutionPlan):
            dead = False

            def execute(self, pack, stream=None):
                time.sleep(0.0003)  # a window for other threads to evict this plan
                if self.dead:
                    with eng.lock:
                        eng.use_after_release += 1
                ref.execute(pack, stream)

            def release(self):
                assert not self.dead, "released twice"
                self.dead = True
                with eng.lock:
                    eng.released += 1
        return Plan(graph, config)


def test_rule_evicted_plan_in_use_not_released(monkeypatch, handle):
    """A tiny cache and 8 threads cycling through more signatures than it holds: plans are evicted
    while other threads run them; none is executed after release, each is released once, and every
    result is right."""
    eng = FragileEngine()
    monkeypatch.setitem(REGISTRY.engines, "fragile", eng)
    monkeypatch.setitem(heuristics.ORDER, "cpu", ("fragile", "reference"))
    small = PlanCache(maxsize=2)
    monkeypatch.setattr(planner, "CACHE", small)
    shapes = [(1, c, 2, 2) for c in range(1, 7)]
    descs = [tdesc(s) for s in shapes]

    def work(k):
        ys = [np.zeros(int(np.prod(s)), np.float32) for s in shapes]
        for r in range(60):
            i = (k + r) % len(shapes)
            cc.cudnnSetTensor(handle, descs[i], ys[i], float(k * 100 + r))
            assert np.all(ys[i] == k * 100 + r)

    run_threads(work)
    assert eng.use_after_release == 0
    small.clear()
    assert eng.released >= 1


def test_rule_descriptor_ids_unique_across_threads():
    from cudnn_compat._core.descriptor import live_count
    start = live_count()
    seen = [set() for _ in range(THREADS)]

    def work(k):
        keep = []
        for i in range(600):
            d = cc.cudnnCreateTensorDescriptor()
            cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 1 + k, 1, 1 + i % 3)
            keep.append(d)
            seen[k].add(int(d))
            if i % 3 == 2:
                cc.cudnnDestroyTensorDescriptor(keep.pop(0))
        for d in keep:
            assert cc.cudnnGetTensor4dDescriptor(d)[2] == 1 + k  # nobody else's settings
            cc.cudnnDestroyTensorDescriptor(d)

    run_threads(work)
    ids = [i for s in seen for i in s]
    assert len(ids) == len(set(ids)) == THREADS * 600
    assert live_count() == start


def test_rule_errors_stay_in_their_call(handle):
    """Threads making rejected calls (and destroying their own descriptors) next to threads making
    good ones: each error names its own call, the good results are untouched."""
    good = tdesc((1, 3, 2, 2))

    def work(k):
        y = np.zeros(12, np.float32)
        for r in range(100):
            if k % 2:
                d = tdesc((1, 3, 2, 2))
                cc.cudnnDestroyTensorDescriptor(d)
                with pytest.raises(cc.CuDNNError) as e:
                    cc.cudnnSetTensor(handle, d, y, 1.0)
                assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and e.value.function == "cudnnSetTensor"
                assert np.all(y == 0)
            else:
                cc.cudnnSetTensor(handle, good, y, float(r))
                assert np.all(y == r)

    run_threads(work)
