"""No silent fallback from the GPU to the CPU (issue 18, item 3; docs/not_supported.md "Op kinds
without a GPU engine"): on a GPU handle a graph no GPU engine runs goes to the CPU reference engine
only with one ``CpuFallbackWarning`` per call signature (op kinds, every engine's reason), or is
CUDNN_STATUS_NOT_SUPPORTED under ``CUDNN_COMPAT_CPU_FALLBACK=0``; an engine failing at execute is
an ERROR log record with its traceback (never printed) and shows in ``explain``.

The GPU handle is the emulated one of tests/host_emu.py; its GPU engines are fakes that decline
every graph or raise at execute (``ORDER['gpu']`` patched), so the tests do not depend on which
op kinds the real engines cover."""
import logging
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat.tools import explain, replay
from cudnn_compat._backend import config, heuristics, planner
from cudnn_compat._backend.engines.base import REGISTRY, Engine, ExecutionPlan
from conftest import tdesc

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


class Decliner(Engine):
    places = ("gpu",)

    def __init__(self, name, reason):
        self.name, self.reason = name, reason

    def check_support(self, graph, place):
        return self.reason


class Crasher(Engine):
    """A GPU engine that accepts every graph and raises KeyError(15) at execute (issue 18's bug)."""
    name = "crasher"
    places = ("gpu", "cpu")

    def __init__(self):
        self.runs = 0

    def build(self, graph, config):
        eng = self

        class Plan(ExecutionPlan):
            def execute(self, pack, stream=None):
                eng.runs += 1
                raise KeyError(15)
        return Plan(graph, config)


class _View(np.ndarray):
    """A "device" view of the emulated place: host memory, with CuPy's ``get``."""

    def get(self):
        return np.asarray(self).copy()


@pytest.fixture
def gpu(monkeypatch):
    """(handle on the emulated GPU place, ND: its device-array type); two declining GPU engines."""
    import host_emu
    monkeypatch.setitem(REGISTRY.engines, "decl_a", Decliner("decl_a", "engine A has no kernel for it (test)"))
    monkeypatch.setitem(REGISTRY.engines, "decl_b", Decliner("decl_b", "engine B cannot translate it (test)"))
    monkeypatch.setitem(heuristics.ORDER, "gpu", ("decl_a", "decl_b", "reference"))
    for var in ("CUDNN_COMPAT_CPU_FALLBACK", "CUDNN_COMPAT_ENGINE"):
        monkeypatch.delenv(var, raising=False)
    config.reload()
    cc.plan_cache_clear()
    planner.forget_warnings()
    e = host_emu.Emu("noop")

    class ND(host_emu.EmuArray):
        """A device array of the emulated place that the reference engine's views also work on."""
        __slots__ = ()

        def __new__(cls, *a, **k):
            if len(a) == 1 and not k and isinstance(a[0], np.ndarray):
                return object.__new__(cls)
            return host_emu._ndarray(*a, **k).view(_View)  # cupy.ndarray(shape, dtype, memptr, strides)

    from cudnn_compat._core import data as _data
    mod = sys.modules["cupy"]
    mod.ndarray, mod.cuda = ND, host_emu.fake_cupy().cuda
    mod.cuda.runtime.deviceSynchronize = lambda: None  # cudnn_compat.trace syncs a GPU handle
    _data._CUPY_NDARRAY[:] = [ND]
    try:
        yield e.handle(), ND
    finally:
        e.restore()
        cc.plan_cache_clear()
        planner.forget_warnings()
        config.reload()


def _fallbacks(record):
    return [w for w in record if issubclass(w.category, cc.CpuFallbackWarning)]


CALLS = {  # legacy functions whose graphs the fake GPU engines decline: name -> call(h, desc, y)
    "cudnnSetTensor": lambda h, d, y: cc.cudnnSetTensor(h, d, y, 3.0),
    "cudnnScaleTensor": lambda h, d, y: cc.cudnnScaleTensor(h, d, y, 2.0),
    "cudnnAddTensor": lambda h, d, y: cc.cudnnAddTensor(h, 1.0, d, y, 1.0, d, y),
}


def test_fallback_warns_once_per_signature_and_names_kinds_and_reasons(gpu):
    h, ND = gpu
    host = np.zeros(24, np.float32)
    y = ND(host)
    d6, d24 = tdesc((1, 6, 1, 1)), tdesc((2, 3, 2, 2))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")  # Python's own once-per-location rule must not hide a new signature
        for d in (d6, d6, d24, d24):  # one source line: a second signature still warns
            cc.cudnnSetTensor(h, d, y, 3.0)
        cc.cudnnScaleTensor(h, d24, y, 2.0)
    assert np.all(host == 6.0)  # the reference engine ran: set 3, then scaled by 2
    got = _fallbacks(rec)
    assert len(got) == 3, [str(w.message) for w in got]
    assert [str(w.message).split(":")[0] for w in got] == ["cudnnSetTensor", "cudnnSetTensor", "cudnnScaleTensor"]
    for w in got:
        msg = str(w.message)
        assert "op kinds: Pointwise" in msg
        assert "decl_a: engine A has no kernel for it (test)" in msg
        assert "decl_b: engine B cannot translate it (test)" in msg
        assert "CUDNN_COMPAT_CPU_FALLBACK=0" in msg
        assert w.filename == HERE  # points at the caller's line, not into the library
    assert cc._core.call.last_plan().engine == "reference" and cc._core.call.last_plan().cpu_fallback
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for d in (d6, d24):
            cc.cudnnSetTensor(h, d, y, 1.0)
        cc.cudnnScaleTensor(h, d24, y, 2.0)
    assert _fallbacks(rec) == []  # every signature already warned
    assert np.all(host == 2.0)


def test_error_filter_fails_the_call_every_time(gpu):
    """Under ``-W error::cudnn_compat.CpuFallbackWarning`` each such call raises the warning."""
    h, ND = gpu
    host = np.zeros(6, np.float32)
    d = tdesc((1, 6, 1, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", cc.CpuFallbackWarning)
        for _ in range(2):
            with pytest.raises(cc.CpuFallbackWarning):
                cc.cudnnSetTensor(h, d, ND(host), 3.0)
    assert np.all(host == 0)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_cpu_fallback_off_is_not_supported_with_the_reasons(gpu, monkeypatch, name):
    h, ND = gpu
    monkeypatch.setenv("CUDNN_COMPAT_CPU_FALLBACK", "0")
    host = np.full(6, 7.0, np.float32)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(cc.CuDNNError) as e:
            CALLS[name](h, tdesc((1, 6, 1, 1)), ND(host))
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED
    msg = str(e.value)
    assert "Pointwise" in msg and "CUDNN_COMPAT_CPU_FALLBACK=0" in msg
    assert "decl_a: engine A has no kernel for it (test)" in msg and "decl_b: engine B cannot translate it (test)" in msg
    assert np.all(host == 7.0) and _fallbacks(rec) == []


def test_a_fallback_plan_is_not_reused_once_forbidden(gpu, monkeypatch):
    h, ND = gpu
    host = np.zeros(6, np.float32)
    d = tdesc((1, 6, 1, 1))
    with pytest.warns(cc.CpuFallbackWarning):
        cc.cudnnSetTensor(h, d, ND(host), 3.0)
    monkeypatch.setenv("CUDNN_COMPAT_CPU_FALLBACK", "no")
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetTensor(h, d, ND(host), 4.0)
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED and np.all(host == 3.0)
    monkeypatch.setenv("CUDNN_COMPAT_CPU_FALLBACK", "1")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cc.cudnnSetTensor(h, d, ND(host), 5.0)
    assert np.all(host == 5.0) and _fallbacks(rec) == []  # this signature was warned about already


def test_no_warning_when_the_reference_engine_is_chosen(gpu, monkeypatch, handle):
    """Forcing the reference engine on a GPU handle, and any CPU handle, is no fallback."""
    h, ND = gpu
    host = np.zeros(6, np.float32)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cc.cudnnSetTensor(handle, tdesc((1, 6, 1, 1)), host, 2.0)
        monkeypatch.setenv("CUDNN_COMPAT_ENGINE", "reference")
        monkeypatch.setenv("CUDNN_COMPAT_CPU_FALLBACK", "0")
        cc.cudnnSetTensor(h, tdesc((1, 6, 1, 1)), ND(host), 3.0)
    assert np.all(host == 3.0) and _fallbacks(rec) == []


def test_planner_level_fallback_without_a_key_warns_per_graph(monkeypatch):
    """make_plan on the GPU place (the backend API's path, no plan-cache key): keyed by the graph."""
    from test_planner import pw, t
    from cudnn_compat._backend.ir import OperationGraph
    monkeypatch.setitem(REGISTRY.engines, "decl_a", Decliner("decl_a", "declines (test)"))
    monkeypatch.setitem(heuristics.ORDER, "gpu", ("decl_a", "reference"))
    monkeypatch.delenv("CUDNN_COMPAT_CPU_FALLBACK", raising=False)
    planner.forget_warnings()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for n in (2, 2, 3):
            plan = planner.make_plan(OperationGraph([pw(t(1, (n,)), t(2, (n,)), "RELU_FWD")]), "gpu")
            assert plan.engine == "reference" and plan.declines == [("decl_a#0", "declines (test)")]
    assert len(_fallbacks(rec)) == 2
    monkeypatch.setenv("CUDNN_COMPAT_CPU_FALLBACK", "0")
    with pytest.raises(planner.GraphError) as e:
        planner.make_plan(OperationGraph([pw(t(1, (2,)), t(2, (2,)), "RELU_FWD")]), "gpu")
    assert e.value.status == "NOT_SUPPORTED" and "decl_a: declines (test)" in str(e.value)
    planner.forget_warnings()


def test_engine_failing_at_execute_is_logged_with_traceback_and_explained(gpu, monkeypatch, caplog, capfd, tmp_path):
    h, ND = gpu
    crasher = Crasher()
    monkeypatch.setitem(REGISTRY.engines, "crasher", crasher)
    monkeypatch.setitem(heuristics.ORDER, "gpu", ("crasher", "reference"))
    host = np.zeros(6, np.float32)
    path = tmp_path / "t.jsonl"
    capfd.readouterr()
    with caplog.at_level(logging.ERROR, logger="cudnn_compat"), pytest.warns(cc.CpuFallbackWarning) as rec, \
            cc.trace(str(path)):
        cc.cudnnSetTensor(h, tdesc((1, 6, 1, 1)), ND(host), 3.0)
        cc.cudnnSetTensor(h, tdesc((1, 6, 1, 1)), ND(host), 4.0)  # the cached plan: the reference one
    assert np.all(host == 4.0) and crasher.runs == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name.startswith("cudnn_compat")]
    assert len(errors) == 1
    assert "crasher" in errors[0].getMessage() and "KeyError: 15" in errors[0].getMessage()
    assert errors[0].exc_info and errors[0].exc_info[0] is KeyError
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "KeyError" not in err and "Traceback" not in out
    msgs = [str(w.message) for w in _fallbacks(rec.list)]
    assert len(msgs) == 1 and "crasher: failed at execute (KeyError: 15" in msgs[0]
    plan = cc._core.call.last_plan()
    assert plan.failures == [("crasher", "KeyError: 15")]
    text = explain.explain(replay.load(str(path)))
    assert "ENGINE FAILURE: crasher failed at execute (KeyError: 15" in text
    assert "CPU FALLBACK: no GPU engine ran op kinds Pointwise" in text
    assert "op kinds of this trace by engine" in text and "reference  [cpu, gpu] runs: Pointwise" in text


def test_execute_failure_prints_nothing_without_logging_configured(tmp_path):
    """No pytest log capture here: logging's last-resort printer must not write the traceback."""
    script = tmp_path / "crash.py"
    script.write_text(f"""
import sys, numpy as np
sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
import cudnn_compat as cc
from cudnn_compat._backend import heuristics
from cudnn_compat._backend.engines.base import REGISTRY
from test_fallback import Crasher
REGISTRY.engines["crasher"] = Crasher()
heuristics.ORDER["cpu"] = ("crasher", "reference")
from conftest import tdesc
y = np.zeros(6, np.float32)
cc.cudnnSetTensor(cc.cudnnCreate("cpu"), tdesc((1, 6, 1, 1)), y, 3.0)
print(float(y.sum()), REGISTRY.engines["crasher"].runs)
""")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for var in ("CUDNN_COMPAT_LOG", "CUDNN_LOGDEST_DBG", "CUDNN_COMPAT_ENGINE", "CUDNN_COMPAT_TRACE"):
        env.pop(var, None)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["18.0", "1"]
    assert p.stderr == "", p.stderr


def test_explain_marks_a_cpu_fallback_only_when_not_forced():
    first = {"place": "gpu", "graph": "OperationGraph\n  [0] CTCLoss(probs=#1:float32[2]) -> loss=#2:float32[1]",
             "order": ["cudnn", "cupy", "reference"], "config": "reference#0", "engine": "reference",
             "declines": [["cudnn#-1", "no translation"], ["cupy#0", "no GPU kernel for CTCLoss yet"]]}
    s = {"first": first, "calls": [(0, "cudnnCTCLoss")], "configs": {"reference#0": 1}}
    text = "\n".join(explain.explain_signature("abc", s))
    assert "CPU FALLBACK: no GPU engine ran op kinds CTCLoss" in text and "no GPU kernel for CTCLoss yet" in text
    forced = dict(first, order=["reference"], declines=[])
    assert "CPU FALLBACK" not in "\n".join(explain.explain_signature("abc", dict(s, first=forced)))
    cpu = dict(first, place="cpu", order=["reference"], declines=[])
    assert "CPU FALLBACK" not in "\n".join(explain.explain_signature("abc", dict(s, first=cpu)))


def test_decline_at_execute_is_a_reason_not_an_error(gpu, monkeypatch, caplog):
    """An engine that declines while executing (EngineDeclined) is a fallback reason, logged as a
    warning, not an engine failure."""
    from cudnn_compat._backend.engines.base import EngineDeclined
    h, ND = gpu

    class LateDecliner(Crasher):
        name = "late"

        def build(self, graph, config):
            class Plan(ExecutionPlan):
                def execute(self, pack, stream=None):
                    raise EngineDeclined("late", "alignment of y is 2 bytes (test)")
            return Plan(graph, config)
    monkeypatch.setitem(REGISTRY.engines, "late", LateDecliner())
    monkeypatch.setitem(heuristics.ORDER, "gpu", ("late", "reference"))
    host = np.zeros(6, np.float32)
    with caplog.at_level(logging.WARNING, logger="cudnn_compat"), pytest.warns(cc.CpuFallbackWarning) as rec:
        cc.cudnnSetTensor(h, tdesc((1, 6, 1, 1)), ND(host), 3.0)
    assert np.all(host == 3.0)
    (msg,) = [str(w.message) for w in _fallbacks(rec.list)]
    assert "late: declined at execute: alignment of y is 2 bytes (test)" in msg and "failed at execute" not in msg
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("alignment of y is 2 bytes" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


class RawCrasher(Engine):
    """A GPU engine whose plans take raw device pointers (as the cudnn engine's and the cupy
    engine's record plans do) and fail at execute without converting them back."""
    name = "rawcrasher"
    places = ("gpu",)

    def __init__(self):
        self.seen = []

    def build(self, graph, config):
        eng = self

        class Plan(ExecutionPlan):
            raw_pointers = True

            def execute(self, pack, stream=None):
                eng.seen.append(sorted(type(v).__name__ for v in pack.data.values()))
                raise RuntimeError("failed after binding raw pointers (test)")
        return Plan(graph, config)


@pytest.mark.parametrize("call", ["add_tensor", "activation"])
def test_raw_pointer_plan_failing_hands_the_next_engine_views(gpu, monkeypatch, caplog, call):
    """Whatever a raw-pointer plan fails with, planner.execute turns the pointers it was bound with
    into views before the next engine runs (once a GPU test found the reference engine reading an
    int as an array: 'cannot reshape array of size 1')."""
    h, ND = gpu
    raw = RawCrasher()
    monkeypatch.setitem(REGISTRY.engines, "rawcrasher", raw)
    monkeypatch.setitem(heuristics.ORDER, "gpu", ("rawcrasher", "reference"))
    rng = np.random.default_rng(5)
    a = rng.standard_normal(24).astype(np.float32)
    c = rng.standard_normal(24).astype(np.float32)
    d = tdesc((2, 3, 2, 2))
    want = 2.0 * a + 0.5 * c if call == "add_tensor" else 2.0 * np.maximum(a, 0) + 0.5 * c
    with caplog.at_level(logging.ERROR, logger="cudnn_compat"), pytest.warns(cc.CpuFallbackWarning):
        if call == "add_tensor":
            cc.cudnnAddTensor(h, 2.0, d, ND(a), 0.5, d, ND(c))
        else:
            ad = cc.cudnnCreateActivationDescriptor()
            cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
            cc.cudnnActivationForward(h, ad, 2.0, d, ND(a), 0.5, d, ND(c))
    assert raw.seen and "int" in raw.seen[0]  # it was handed raw pointers
    np.testing.assert_allclose(c, want, rtol=1e-6)
    assert cc._core.call.last_plan().engine == "reference"


# -- on the device: an engine that fails after binding raw device pointers -----------------------------------

def _conv_bwd_filter_case(rng, n=2, c=3, k=4, hw=9):
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    dy = rng.standard_normal((n, k, hw - 2, hw - 2)).astype(np.float32)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, k, c, 3, 3)
    # dw[k,c,r,s] = sum_{n,p,q} dy[n,k,p,q] x[n,c,p+r,q+s], written out here
    want = np.zeros((k, c, 3, 3))
    for r in range(3):
        for s in range(3):
            want[:, :, r, s] = np.einsum("nkpq,ncpq->kc", dy, x[:, :, r:r + hw - 2, s:s + hw - 2])
    return x, dy, (tdesc(x.shape), tdesc(dy.shape), cd, wd), want


def _bwd_filter(h, descs, x, dy, dw, ws=None, ws_size=0):
    xd, dyd, cd, wd = descs
    cc.cudnnConvolutionBackwardFilter(h, 1.0, xd, x, dyd, dy, cd, cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                                      ws, ws_size, 0.0, wd, dw)


@pytest.mark.gpu
def test_gpu_numpy_workspace_is_size_checked_then_not_used(rng):
    """A NumPy workspace on a GPU handle (NumPy data is staged there): its size is checked, the
    engine runs on device scratch, the numbers are right (a GPU fuzz case of bwd filter once made
    the cudnn engine read a host array's device address).  Less than the query's size runs a plan
    made to fit it when an engine has one (``_core.call.fit_workspace``: which configs fit depends
    on the engines' heuristics and timings), else is BAD_PARAM naming workSpaceSizeInBytes with
    nothing written."""
    from cudnn_compat._core import call as _call
    h = cc.cudnnCreate("gpu")
    x, dy, descs, want = _conv_bwd_filter_case(rng)
    need = cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(h, descs[0], descs[1], descs[2], descs[3],
                                                            cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1)
    ws = np.zeros(max(need, 256), np.uint8)
    dw = np.full(want.shape, np.nan, np.float32)
    _bwd_filter(h, descs, x, dy, dw, ws, ws.nbytes)
    np.testing.assert_allclose(dw, want, rtol=1e-4, atol=1e-4)
    assert not ws.any()
    if need:
        dw[...] = np.nan
        try:
            _bwd_filter(h, descs, x, dy, dw, ws, need - 1)
        except cc.CuDNNError as e:
            assert e.status == cc.CUDNN_STATUS_BAD_PARAM and "workSpaceSizeInBytes" in str(e), e
            assert np.isnan(dw).all(), "nothing written"
        else:
            assert int(_call.last_plan().workspace_size) <= need - 1, "a plan that fits what was given"
            np.testing.assert_allclose(dw, want, rtol=1e-4, atol=1e-4)
        assert not ws.any()


def _fail_first_execute(monkeypatch, cls, record):
    """Make ``cls.execute`` fail once per plan after the legacy layer bound its data (what the
    plan was handed is kept in ``record``)."""
    orig = cls.execute

    def failing(self, pack, stream=None):
        if id(self) not in record:
            record[id(self)] = {u: type(v) for u, v in pack.data.items()}
            raise RuntimeError("injected failure after binding (test)")
        return orig(self, pack, stream)
    monkeypatch.setattr(cls, "execute", failing)


@pytest.mark.gpu
def test_gpu_cudnn_failing_after_raw_binding_hands_the_next_engine_arrays(rng, monkeypatch, caplog):
    """The cudnn engine takes raw device pointers; when it then fails at execute, the next engine
    (cupy, then reference) gets CuPy views of the same buffers and the numbers are right."""
    import cupy
    from cudnn_compat._backend.engines.cudnn_engine.plan import CudnnPlan
    seen: dict = {}
    _fail_first_execute(monkeypatch, CudnnPlan, seen)
    cc.plan_cache_clear()
    h = cc.cudnnCreate("gpu")
    x, dy, descs, want = _conv_bwd_filter_case(rng, n=3, hw=11)
    dwg = cupy.full(want.shape, cupy.nan, cupy.float32)
    try:
        with caplog.at_level(logging.ERROR, logger="cudnn_compat"):
            _bwd_filter(h, descs, cupy.asarray(x), cupy.asarray(dy), dwg)
        assert seen and all(int in types.values() for types in seen.values())  # it was handed raw pointers
        assert cc._core.call.last_plan().engine != "cudnn"
        np.testing.assert_allclose(cupy.asnumpy(dwg), want, rtol=1e-4, atol=1e-4)
        assert any("injected failure" in r.getMessage() for r in caplog.records)
    finally:
        cc.plan_cache_clear()


@pytest.mark.gpu
def test_gpu_cupy_record_plan_failing_after_raw_binding_hands_the_reference_arrays(rng, monkeypatch, caplog):
    """The cupy engine's record plans take raw pointers too: a failure at execute falls back to the
    reference engine with views, and the numbers are right."""
    import cupy
    from cudnn_compat._backend.engines.cupy_engine import CupyPlan
    seen: dict = {}
    _fail_first_execute(monkeypatch, CupyPlan, seen)
    monkeypatch.setitem(heuristics.ORDER, "gpu", ("cupy", "reference"))
    cc.plan_cache_clear()
    h = cc.cudnnCreate("gpu")
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    x = rng.standard_normal((3, 5, 7, 9)).astype(np.float32)
    xd = tdesc(x.shape)
    y = cupy.full(x.shape, cupy.nan, cupy.float32)
    try:
        with caplog.at_level(logging.ERROR, logger="cudnn_compat"):
            cc.cudnnActivationForward(h, ad, 2.0, xd, cupy.asarray(x), 0.0, xd, y)
        assert seen and cc._core.call.last_plan().engine == "reference"
        np.testing.assert_allclose(cupy.asnumpy(y), 2.0 * np.maximum(x, 0.0), rtol=1e-6)
    finally:
        cc.plan_cache_clear()
