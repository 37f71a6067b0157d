"""Resources (issue 10): memory stays flat over create/destroy cycles and repeated calls, and plans
give their resources back when the plan cache evicts them.

rule_create_destroy_cycles_leave_memory_flat   every descriptor type (and handles, algorithm
        performance structs, fused-op packs and plans): N create/destroy cycles after a warm-up grow
        the Python heap (tracemalloc) by less than a few KiB, whatever N
rule_repeated_calls_leave_memory_flat          cached calls, rejected calls and descriptor churn around
        calls do not grow the heap
rule_evicted_plans_are_released                PlanCache calls ``plan.release()`` on each evicted plan
        exactly once, never on a cached one, and drops every reference to it (weakrefs die)
rule_gpu_pool_flat (gpu)                       CuPy's memory pool stays flat over repeated GPU calls,
        and over plan-cache churn

Size: N = 2,000 cycles per type in CI; CUDNN_COMPAT_LEAK_CYCLES=100000 for the full run.
"""
import gc
import os
import tracemalloc
import weakref

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import planner
from cudnn_compat._core import memo, recipes
from cudnn_compat._backend.engines.numpy_engine import NumpyPlan  # the CPU place's default engine
from cudnn_compat._backend.plan_cache import PlanCache
from conftest import tdesc

CYCLES = int(os.environ.get("CUDNN_COMPAT_LEAK_CYCLES", "2000") or 2000)
SLACK = 16 * 1024  # bytes of heap growth tolerated (allocator noise), independent of CYCLES


@pytest.fixture(scope="module", autouse=True)
def traced():
    """Trace the heap for the whole module, from a warm-up that fills the table of recently destroyed
    ids (_descriptor keeps 4096 to name stale ones) to its steady size: memory allocated before
    tracing and freed while measuring would otherwise read as growth."""
    tracemalloc.start()
    for _ in range(12000):
        cc.cudnnDestroyTensorDescriptor(cc.cudnnCreateTensorDescriptor())
    yield
    tracemalloc.stop()


def heap_growth(cycle, n=CYCLES, warmup=100, settle=None) -> int:
    """Bytes the traced heap grew over ``n`` calls of ``cycle(i)`` after ``warmup`` calls: the smaller of
    two consecutive measurements.  tracemalloc counts every thread's allocations, and in a whole-suite run a
    thread an earlier test left behind can allocate during one window (a few hundred KB, seen in CI order
    only); a leak of the calls themselves grows the heap in both windows, so it still fails.  ``settle()``
    runs before each reading: it empties bounded tables that the cycle fills and that are cleared when
    full, whose fill at either end of a window would otherwise read as growth or shrinkage."""
    for i in range(warmup):
        cycle(i)
    grew = []
    for _ in range(2):
        if settle:
            settle()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            cycle(i)
        if settle:
            settle()
        gc.collect()
        grew.append(tracemalloc.get_traced_memory()[0] - before)
    return min(grew)


def _fused_ops():
    return cc.CUDNN_FUSED_SCALE_BIAS_ACTIVATION_CONV_BNSTATS


def _object_kinds():
    """(name, create, destroy) of every create/destroy pair of the legacy API that runs on the CPU."""
    kinds = []
    for name in sorted(cc.LEGACY):
        if not name.startswith("cudnnCreate") or name == "cudnnCreatePersistentRNNPlan":  # a GPU-only plan
            continue
        destroy = cc.LEGACY.get("cudnnDestroy" + name[len("cudnnCreate"):])
        if destroy is None:
            continue
        create = cc.LEGACY[name]
        if name == "cudnnCreate":
            kinds.append(("cudnnHandle_t", lambda c=create: c("cpu"), destroy))
        elif name.startswith("cudnnCreateFusedOps"):
            kinds.append((name, lambda c=create: c(_fused_ops()), destroy))
        elif name == "cudnnCreateAlgorithmPerformance":
            kinds.append((name, lambda c=create: c(2), destroy))
        else:
            kinds.append((name, create, destroy))
    return kinds


KINDS = _object_kinds()


def test_every_descriptor_type_is_covered():
    names = {k[0] for k in KINDS}
    for want in ("cudnnCreateTensorDescriptor", "cudnnCreateFilterDescriptor", "cudnnCreateConvolutionDescriptor",
                 "cudnnCreatePoolingDescriptor", "cudnnCreateActivationDescriptor", "cudnnCreateLRNDescriptor",
                 "cudnnCreateOpTensorDescriptor", "cudnnCreateReduceTensorDescriptor", "cudnnHandle_t"):
        assert want in names
    assert len(KINDS) >= 18


@pytest.mark.parametrize("name, create, destroy", KINDS, ids=[k[0] for k in KINDS])
def test_rule_create_destroy_cycles_leave_memory_flat(name, create, destroy):
    from cudnn_compat._core import descriptor as _descriptor
    start = _descriptor.live_count()
    grew = heap_growth(lambda i: destroy(create()))
    assert grew < SLACK, f"{name}: {CYCLES} create/destroy cycles grew the heap by {grew} bytes"
    assert _descriptor.live_count() == start
    assert len(_descriptor._DEAD) <= _descriptor._DEAD_MAX


SETTERS = {
    "Tensor": (cc.cudnnCreateTensorDescriptor, cc.cudnnDestroyTensorDescriptor,
               lambda d, i: cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 2, 3, 1 + i % 5)),
    "Filter": (cc.cudnnCreateFilterDescriptor, cc.cudnnDestroyFilterDescriptor,
               lambda d, i: cc.cudnnSetFilter4dDescriptor(d, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, 2, 2, 3, 3)),
    "Convolution": (cc.cudnnCreateConvolutionDescriptor, cc.cudnnDestroyConvolutionDescriptor,
                    lambda d, i: cc.cudnnSetConvolution2dDescriptor(d, i % 3, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION,
                                                                    cc.CUDNN_DATA_FLOAT)),
    "Pooling": (cc.cudnnCreatePoolingDescriptor, cc.cudnnDestroyPoolingDescriptor,
                lambda d, i: cc.cudnnSetPoolingNdDescriptor(d, cc.CUDNN_POOLING_MAX, 0, 2, [2, 2], [0, i % 2], [1, 1])),
    "Activation": (cc.cudnnCreateActivationDescriptor, cc.cudnnDestroyActivationDescriptor,
                   lambda d, i: cc.cudnnSetActivationDescriptor(d, cc.CUDNN_ACTIVATION_CLIPPED_RELU, 0, 1.0 + i % 4)),
    "LRN": (cc.cudnnCreateLRNDescriptor, cc.cudnnDestroyLRNDescriptor,
            lambda d, i: cc.cudnnSetLRNDescriptor(d, 1 + i % 7, 1e-4, 0.75, 2.0)),
}


@pytest.mark.parametrize("kind", sorted(SETTERS))
def test_rule_create_set_destroy_cycles_leave_memory_flat(kind):
    create, destroy, setter = SETTERS[kind]

    def cycle(i):
        d = create()
        setter(d, i)
        destroy(d)

    grew = heap_growth(cycle)
    assert grew < SLACK, f"{kind}: {CYCLES} create/set/destroy cycles grew the heap by {grew} bytes"


def test_rule_repeated_calls_leave_memory_flat(handle):
    """Cached compute calls through fresh descriptors of the same settings, and rejected calls
    (exceptions with their messages), over and over."""
    x = np.random.default_rng(0).standard_normal(24).astype(np.float32)
    y = np.zeros(24, np.float32)
    act = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(act, cc.CUDNN_ACTIVATION_RELU, 0, 0.0)
    stale = tdesc((1, 2, 3, 4))
    cc.cudnnDestroyTensorDescriptor(stale)

    def cycle(i):
        d = tdesc((1, 2, 3, 4))
        cc.cudnnActivationForward(handle, act, 1.0, d, x, 0.0, d, y)
        cc.cudnnAddTensor(handle, 1.0, d, x, 1.0, d, y)
        cc.cudnnDestroyTensorDescriptor(d)
        try:
            cc.cudnnAddTensor(handle, 1.0, stale, x, 1.0, stale, y)
        except cc.CuDNNError:
            pass

    def settle():
        """A fresh descriptor adds an entry to each function's call-site memo and recipe table (bounded,
        cleared when full, filled to any point by earlier tests): both emptied at each reading, after
        checking they kept their bounds."""
        assert all(len(m) <= memo.MAXSIZE for m in memo.MEMOS)
        memo.clear_all()
        for name in ("cudnnActivationForward", "cudnnAddTensor"):
            table = getattr(cc.LEGACY[name], "recipes", None)  # a compiled Site's table (none: the wrapper)
            if table is not None:
                assert len(table) <= recipes.MAXSIZE, name
                table.clear()

    grew = heap_growth(cycle, warmup=200, settle=settle)
    assert grew < SLACK, f"{CYCLES} rounds of calls grew the heap by {grew} bytes"


@pytest.fixture
def small_cache(monkeypatch):
    cache = PlanCache(maxsize=4)
    monkeypatch.setattr(planner, "CACHE", cache)
    return cache


def test_rule_evicted_plans_are_released(monkeypatch, handle, small_cache):
    released, made = [], []
    orig_release = NumpyPlan.release

    def spy(self):
        released.append(self)
        orig_release(self)

    monkeypatch.setattr(NumpyPlan, "release", spy)
    descs = [tdesc((1, c, 1, 1)) for c in range(1, 21)]
    for c, d in enumerate(descs, 1):
        y = np.zeros(c, np.float32)
        cc.cudnnSetTensor(handle, d, y, 1.0)
        made.append(weakref.ref(cc._core.call.last_plan()))
        assert np.all(y == 1.0)
    cached = set(map(id, small_cache._d.values()))
    assert small_cache.info().currsize == 4
    assert len(released) == 16 and len(set(map(id, released))) == 16, "each evicted plan released once"
    assert not cached & set(map(id, released)), "a cached plan was released"
    released.clear()  # drop the spy's own references
    gc.collect()
    alive = [r for r in made[:16] if r() is not None]
    assert not alive, f"{len(alive)} evicted plans are still referenced"
    small_cache.clear()


def test_rule_plan_churn_leaves_memory_flat(handle, small_cache):
    """Calls cycling through 40 signatures with room for 4: every call builds a plan and evicts one;
    the heap stays flat."""
    descs = [tdesc((1, c, 1, 1)) for c in range(1, 41)]
    ys = [np.zeros(c, np.float32) for c in range(1, 41)]

    def cycle(i):
        cc.cudnnSetTensor(handle, descs[i % 40], ys[i % 40], float(i))

    grew = heap_growth(cycle, n=min(CYCLES, 4000), warmup=400)
    assert grew < 4 * SLACK, f"plan churn grew the heap by {grew} bytes"
    small_cache.clear()


# -- GPU -----------------------------------------------------------------------------------------------

def _gpu_calls(cp, h):
    """Thunks of repeated GPU calls (convolution, softmax, pooling, batch norm, AddTensor) on CuPy arrays."""
    x = cp.random.standard_normal((2, 4, 8, 8), dtype=cp.float32)
    xd, yd = tdesc((2, 4, 8, 8)), tdesc((2, 8, 8, 8))
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, 8, 4, 3, 3)
    w = cp.random.standard_normal((8, 4, 3, 3), dtype=cp.float32)
    conv = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    ws_size = cc.cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, conv, yd, 0)
    ws = cp.empty(max(ws_size, 1), cp.uint8)
    y = cp.zeros((2, 8, 8, 8), cp.float32)
    s = cp.zeros_like(x)
    pool = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pool, cc.CUDNN_POOLING_MAX, 0, 2, 2, 0, 0, 2, 2)
    pd, p = tdesc((2, 4, 4, 4)), cp.zeros((2, 4, 4, 4), cp.float32)
    bd = tdesc((1, 4, 1, 1))
    scale, bias = cp.ones(4, cp.float32), cp.zeros(4, cp.float32)
    mean, var = cp.zeros(4, cp.float32), cp.ones(4, cp.float32)
    bn = cp.zeros_like(x)
    return [
        lambda: cc.cudnnConvolutionForward(h, 1.0, xd, x, wd, w, conv, 0, ws, ws.nbytes, 0.0, yd, y),
        lambda: cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, xd, x, 0.0, xd, s),
        lambda: cc.cudnnPoolingForward(h, pool, 1.0, xd, x, 0.0, pd, p),
        lambda: cc.cudnnBatchNormalizationForwardInference(h, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, xd, x, xd, bn, bd,
                                                           scale, bias, mean, var, 1e-5),
        lambda: cc.cudnnAddTensor(h, 1.0, bd, bias, 1.0, xd, s),
    ]


@pytest.mark.gpu
def test_rule_gpu_pool_flat_over_repeated_calls():
    import cupy as cp
    h = cc.cudnnCreate("gpu")
    pool = cp.get_default_memory_pool()
    try:
        calls = _gpu_calls(cp, h)

        def rounds(n):
            for _ in range(n):
                for c in calls:
                    c()
            cp.cuda.Device().synchronize()
            return pool.used_bytes(), pool.total_bytes()

        rounds(3)  # warm-up: plans, compiled kernels, workspaces
        used, total = rounds(50)  # anything allocated once, lazily, is in by now
        used2, total2 = rounds(200)
        assert used2 == used, f"used bytes {used} -> {used2} over 200 more rounds"
        assert total2 <= total, f"pool grew {total} -> {total2} over 200 more rounds"
    finally:
        cc.cudnnDestroy(h)


@pytest.mark.gpu
def test_rule_gpu_pool_flat_over_plan_churn(monkeypatch):
    """GPU plans evicted from a 4-plan cache give their memory back: the pool stays flat while calls
    cycle through 24 signatures."""
    import cupy as cp
    monkeypatch.setattr(planner, "CACHE", PlanCache(maxsize=4))
    h = cc.cudnnCreate("gpu")
    pool = cp.get_default_memory_pool()
    try:
        descs = [tdesc((2, c, 4, 4)) for c in range(1, 25)]
        xs = [cp.random.standard_normal((2, c, 4, 4), dtype=cp.float32) for c in range(1, 25)]
        ys = [cp.zeros_like(x) for x in xs]

        def round_():
            for d, x, y in zip(descs, xs, ys):
                cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_INSTANCE, 1.0, d, x, 0.0, d, y)
            cp.cuda.Device().synchronize()

        for _ in range(3):
            round_()
        used = pool.used_bytes()
        for _ in range(20):
            round_()
        assert pool.used_bytes() <= used, f"used bytes {used} -> {pool.used_bytes()} over plan churn"
    finally:
        planner.CACHE.clear()
        cc.cudnnDestroy(h)
