"""The workspace query and the call agree (002 §5.2.24/§5.2.21/§6.2.14: a call given the size the
query returned for the same descriptors and algo runs), whatever configuration the cudnn engine's
autotune picks: the query sizes the plan the call then runs (one plan-cache key), and a call given
less than its plan needs gets the fastest configuration whose plan fits (``_core.call.fit_workspace``,
``graph.workspace_limit``), or BAD_PARAM only when none fits.

CPU tests on the emulated GPU place (tests/host_emu.py) with the cudnn engine's own search and
build over a fake native backend: three engine configs, the fastest needing 1 MiB of workspace.
"""
import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc
from conv_util import cdesc, fdesc
from cudnn_compat._backend.engines.base import EngineConfig

BIG, MID = 1 << 20, 4096
WS = {1: 0, 2: MID, 3: BIG}  # engine global index -> workspace bytes of its plan
SPEED = {1: 1.0, 2: 0.5, 3: 0.1}  # ms: the more workspace, the faster


def _cfg(index):
    return EngineConfig("cudnn", (), frozenset({"DETERMINISTIC"}), index)


@pytest.fixture
def native(monkeypatch):
    """The emulated GPU place; the cudnn engine (before the reference engine, no cupy engine) runs its
    real configs/build over fake heuristics, plans and timings.  Returns (handle, [timed batches], WS)."""
    import host_emu
    import cudnn_compat._backend.engines.cudnn_engine as ce
    from cudnn_compat._backend import heuristics
    from cudnn_compat._core import memo as _memo
    cc.plan_cache_clear()
    emu = host_emu.Emu("noop", cudnn=True)
    timed, ws = [], dict(WS)

    def execution_plan(lib, handle, graph, c):
        d = host_emu._NativeDesc("EXECUTION_PLAN")
        d.cfg = c
        return d, ws[c.index], [d]
    try:
        for k in ("configs", "build"):  # the engine's own search and build (host_emu stubs them)
            ce.ENGINE.__dict__.pop(k, None)
        ce._configs.execution_plan = execution_plan  # emu.restore() puts the real one back
        modes = {"A": [(_cfg(i), w) for i, w in sorted(WS.items())], "FALLBACK": [], "INSTANT": [], "B": []}
        monkeypatch.setattr(ce._configs, "_query", lambda lib, g, mode: list(modes[mode]))
        monkeypatch.setattr(ce._configs, "knob_space", lambda lib, g, index: [])
        monkeypatch.setattr(ce, "NativeGraph", host_emu._NativeGraph)
        monkeypatch.setattr(ce, "_device", lambda: 0)
        monkeypatch.setattr(ce._autotune, "time_plans",
                            lambda spec, plans, device: timed.append(plans) or [SPEED[p.cfg.index] for p, _ in plans])
        monkeypatch.setattr(ce._autotune, "_device_id", lambda device: ("Fake GPU", "9.0", 91900))
        for table in ("_MEMO", "TIMES", "SIZES"):
            monkeypatch.setattr(ce._autotune, table, {})
        monkeypatch.setitem(heuristics.ORDER, "gpu", ("cudnn", "reference"))
        monkeypatch.delenv("CUDNN_COMPAT_PLAN_CACHE_FILE", raising=False)
        monkeypatch.delenv("CUDNN_COMPAT_CUDNN_AUTOTUNE", raising=False)
        yield emu.handle(), timed, ws
    finally:
        emu.restore()
        _memo.clear_all()
        cc._core.call.clear_prepared()
        cc.plan_cache_clear()


XS, WSHAPE = (1, 8, 6, 6), (8, 8, 3, 3)


def _problem():
    import host_emu
    xd, yd, wd, cd = tdesc(XS), tdesc(XS), fdesc(WSHAPE), cdesc((1, 1))
    x, y, w = (host_emu.EmuArray(np.ones(s, np.float32)) for s in (XS, XS, WSHAPE))
    return (xd, wd, yd, cd), (x, w, y)


def _bias_act(descs, bufs):
    import host_emu
    bd = tdesc((1, WSHAPE[0], 1, 1))
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    return bd, host_emu.EmuArray(np.zeros(WSHAPE[0], np.float32)), ad


# (query, call) per direction: query(h, descs, algo) -> bytes; call(h, descs, bufs, algo, ws, size)
DIRECTIONS = {
    "FWD": (cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
            lambda h, d, a: cc.cudnnGetConvolutionForwardWorkspaceSize(h, d[0], d[1], d[3], d[2], a),
            lambda h, d, b, a, ws, n: cc.cudnnConvolutionForward(h, 1.0, d[0], b[0], d[1], b[1], d[3], a, ws, n, 0.0,
                                                                 d[2], b[2])),
    "BWD_DATA": (cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
                 lambda h, d, a: cc.cudnnGetConvolutionBackwardDataWorkspaceSize(h, d[1], d[2], d[3], d[0], a),
                 lambda h, d, b, a, ws, n: cc.cudnnConvolutionBackwardData(h, 1.0, d[1], b[1], d[2], b[2], d[3], a, ws,
                                                                           n, 0.0, d[0], b[0])),
    "BWD_FILTER": (cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                   lambda h, d, a: cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d[0], d[2], d[3], d[1], a),
                   lambda h, d, b, a, ws, n: cc.cudnnConvolutionBackwardFilter(h, 1.0, d[0], b[0], d[2], b[2], d[3], a,
                                                                               ws, n, 0.0, d[1], b[1])),
    # the fused call: the forward query's size (the plain convolution's plan), the fused graph's own search
    "BIAS_ACT": (cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                 lambda h, d, a: cc.cudnnGetConvolutionForwardWorkspaceSize(h, d[0], d[1], d[3], d[2], a),
                 lambda h, d, b, a, ws, n: cc.cudnnConvolutionBiasActivationForward(
                     h, 1.0, d[0], b[0], d[1], b[1], d[3], a, ws, n, 0.0, d[2], b[2], *_BA[0][:2], _BA[0][2], d[2], b[2])),
}
_BA: list = []


def _workspace(n):
    import host_emu
    return host_emu.EmuArray(np.zeros(max(n, 1), np.uint8))


def _ran():
    plan = cc._core.call.last_plan()
    return plan.engine, plan.config.index, int(plan.workspace_size)


@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_a_call_given_the_queried_workspace_runs_and_less_gets_the_fastest_config_that_fits(native, direction):
    h, timed, ws = native
    algo, query, call = DIRECTIONS[direction]
    descs, bufs = _problem()
    _BA[:] = [_bias_act(descs, bufs)]
    n = query(h, descs, algo)
    assert n == BIG  # the fastest config's workspace: what the call will run
    call(h, descs, bufs, algo, _workspace(n), n)
    assert _ran() == ("cudnn", 3, BIG)
    if direction != "BIAS_ACT":  # the query planned the call's own plan (and the beta != 0 one): one timing batch
        from cudnn_compat._backend.plan_cache import CACHE
        assert len(timed) == 1 and len(CACHE._d) == 2
    batches = len(timed)
    for given, want in ((BIG - 1, 2), (MID, 2), (MID - 1, 1), (0, 1)):  # the fastest config that fits
        call(h, descs, bufs, algo, _workspace(given) if given else None, given)
        assert _ran() == ("cudnn", want, WS[want]), given
        call(h, descs, bufs, algo, _workspace(n), n)  # the full workspace: the fastest config again
        assert _ran() == ("cudnn", 3, BIG)
    assert len(timed) == batches  # the configs' times are shared: none timed again
    # no config fits (engine 1 now needs 64 bytes; no CPU fallback is planned for a workspace): BAD_PARAM
    ws[1] = 64
    with pytest.raises(cc.CuDNNError) as e:
        call(h, descs, bufs, algo, _workspace(32), 32)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    assert f"workSpaceSizeInBytes: the plan needs {BIG} bytes of workspace, 32 were given" in str(e.value)
