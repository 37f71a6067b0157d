"""Callbacks, runtime-error queries, versions, the algorithm descriptor and performance families,
and the removed v7 convolution algorithm queries (002 §3.2.4, §3.2.7, §3.2.8, §3.2.22, §3.2.23,
§3.2.38-§3.2.42, §3.2.67, §3.2.70, §3.2.72, §3.2.74, §3.2.77-§3.2.79, §4.1.17, §7.2.1, §8.2.1,
Table 5; inventory §2.17)."""
import logging
import struct
import sys
import zlib

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

BAD, UNSUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED


# -- callbacks ---------------------------------------------------------------------------

@pytest.fixture
def restore_callback():
    log = logging.getLogger("cudnn_compat")

    def ours():  # pytest's own capture handlers come and go with its version; they are not ours
        return [h for h in log.handlers if type(h).__name__ != "LogCaptureHandler"]
    level, propagate, handlers = log.level, log.propagate, ours()
    yield
    cc.cudnnSetCallback(0, None, None)
    assert (log.level, log.propagate, ours()) == (level, propagate, handlers)


def _new_plan(handle, n):
    """A call whose signature was never seen (n distinct), so the planner logs its plan at INFO."""
    y = np.zeros(n, np.float32)
    cc.setTensor(handle, tdesc((1, n, 1, 1)), y, 1.0)
    return y


def test_callback_gets_info_messages_with_metadata(handle, restore_callback):
    got = []
    udata = object()
    cc.cudnnSetCallback(cc.CUDNN_SEV_INFO_EN, udata, lambda *a: got.append(a))
    assert cc.cudnnGetCallback()[0] == cc.CUDNN_SEV_INFO_EN and cc.getCallback()[1] is udata
    cc.plan_cache_clear()
    _new_plan(handle, 11)
    infos = [g for g in got if g[0] == cc.CUDNN_SEV_INFO]
    assert infos, "the new plan was not reported"
    sev, ud, dbg, msg = infos[-1]
    assert ud is udata and "SetTensor" in msg and dbg.cudnn_version == cc.cudnnGetVersion() and dbg.time_delta >= 0
    got.clear()
    _new_plan(handle, 11)  # a cache hit logs no plan, only the API call (002 §3.2.79: bit 3 is API logging)
    assert [g[3] for g in got if g[0] == cc.CUDNN_SEV_INFO and not g[3].startswith("function ")] == []
    assert "function cudnnSetTensor() called: CUDNN_STATUS_SUCCESS" in [g[3] for g in got]


def test_callback_mask_bits_and_fatal_always_on(handle, restore_callback):
    got = []
    log = logging.getLogger("cudnn_compat")
    cc.cudnnSetCallback(cc.CUDNN_SEV_WARNING_EN, None, lambda sev, u, d, m: got.append((sev, m)))
    cc.plan_cache_clear()
    _new_plan(handle, 12)
    log.warning("w1")
    log.critical("f1")
    assert got == [(cc.CUDNN_SEV_WARNING, "w1"), (cc.CUDNN_SEV_FATAL, "f1")]  # no INFO: bit 3 off
    got.clear()
    cc.cudnnSetCallback(0, None, lambda sev, u, d, m: got.append((sev, m)))
    log.error("e1")
    log.critical("f2")
    assert got == [(cc.CUDNN_SEV_FATAL, "f2")]


def test_callback_does_not_leak_records_to_the_application(handle, restore_callback):
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.levelno)

    root = logging.getLogger()
    catch, old = Catch(), root.level
    root.addHandler(catch)
    root.setLevel(logging.WARNING)
    try:
        cc.cudnnSetCallback(cc.CUDNN_SEV_INFO_EN, None, lambda *a: None)
        cc.plan_cache_clear()
        _new_plan(handle, 13)
        logging.getLogger("cudnn_compat").warning("still seen")
    finally:
        root.removeHandler(catch)
        root.setLevel(old)
    assert logging.INFO not in seen and logging.WARNING in seen


def test_default_callback_writes_to_logdest(handle, restore_callback, monkeypatch, capsys):
    monkeypatch.setenv("CUDNN_LOGDEST_DBG", "stdout")
    cc.cudnnSetCallback(cc.CUDNN_SEV_INFO_EN, None, None)
    assert cc.getCallback() == (cc.CUDNN_SEV_INFO_EN, None, None)
    cc.plan_cache_clear()
    _new_plan(handle, 14)
    assert "cudnn_compat INFO" in capsys.readouterr().out


def test_callback_errors():
    with pytest.raises(cc.CuDNNError) as e:  # rule: mask is an unsigned int
        cc.setCallback(-1, None, None)
    assert e.value.status == BAD
    with pytest.raises(cc.CuDNNError) as e:  # rule: fptr callable
        cc.setCallback(8, None, "not a function")
    assert e.value.status == BAD


# -- runtime errors, versions ------------------------------------------------------------

def test_query_runtime_error(handle):
    for mode in (cc.CUDNN_ERRQUERY_RAWCODE, cc.CUDNN_ERRQUERY_NONBLOCKING, cc.CUDNN_ERRQUERY_BLOCKING):
        assert cc.cudnnQueryRuntimeError(handle, mode, None) == cc.CUDNN_STATUS_SUCCESS
    from cudnn_compat.misc import flag_runtime_error
    flag_runtime_error(handle)
    assert cc.queryRuntimeError(handle, cc.CUDNN_ERRQUERY_BLOCKING) == cc.CUDNN_STATUS_RUNTIME_FP_OVERFLOW
    assert cc.queryRuntimeError(handle, cc.CUDNN_ERRQUERY_RAWCODE) == cc.CUDNN_STATUS_SUCCESS  # auto-cleared
    with pytest.raises(cc.CuDNNError) as e:  # rule: valid cudnnErrQueryMode_t
        cc.queryRuntimeError(handle, 3)
    assert e.value.status == BAD
    with pytest.raises(cc.CuDNNError) as e:  # rule: tag must be NULL
        cc.queryRuntimeError(handle, cc.CUDNN_ERRQUERY_RAWCODE, 1234)
    assert e.value.status == BAD


def test_cudart_version():
    try:
        import cupy
        want = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:
        want = 0
    assert cc.cudnnGetCudartVersion() == want


CHECKS = ["cudnnOpsInferVersionCheck", "cudnnOpsTrainVersionCheck", "cudnnCnnInferVersionCheck",
          "cudnnCnnTrainVersionCheck", "cudnnAdvInferVersionCheck", "cudnnAdvTrainVersionCheck"]


def test_version_checks_succeed_and_detect_a_mismatch(monkeypatch):
    for name in CHECKS:
        assert getattr(cc, name)() is None
        assert getattr(cc, name[5].lower() + name[6:])() is None
    monkeypatch.setattr(sys.modules["cudnn_compat.convolution.api"], "__version__", "0.0.0-stale", raising=False)
    for name in CHECKS:
        if name.startswith("cudnnCnn"):  # the convolution family belongs to cnn_infer and cnn_train
            with pytest.raises(cc.CuDNNError) as e:
                getattr(cc, name)()
            assert e.value.status == cc.CUDNN_STATUS_VERSION_MISMATCH and "cnn" in str(e.value)
        else:
            assert getattr(cc, name)() is None


# -- algorithm descriptors and performance -----------------------------------------------

def test_algorithm_descriptor_family():
    d = cc.cudnnCreateAlgorithmDescriptor()
    with pytest.raises(cc.CuDNNError) as e:  # rule: a descriptor that was never set
        cc.getAlgorithmDescriptor(d)
    assert e.value.status == BAD
    cc.cudnnSetAlgorithmDescriptor(d, cc.CUDNN_CONVOLUTION_FWD_ALGO_FFT)
    assert cc.cudnnGetAlgorithmDescriptor(d) == cc.CUDNN_CONVOLUTION_FWD_ALGO_FFT
    d2 = cc.createAlgorithmDescriptor()
    cc.cudnnCopyAlgorithmDescriptor(d, d2)
    assert cc.getAlgorithmDescriptor(d2) == cc.CUDNN_CONVOLUTION_FWD_ALGO_FFT
    with pytest.raises(cc.CuDNNError) as e:  # rule: an algorithm enum value
        cc.setAlgorithmDescriptor(d, -1)
    assert e.value.status == BAD
    cc.cudnnDestroyAlgorithmDescriptor(d2)
    with pytest.raises(cc.CuDNNError):
        cc.getAlgorithmDescriptor(d2)


def test_algorithm_performance_family():
    perfs = cc.cudnnCreateAlgorithmPerformance(3)
    assert len(perfs) == 3
    d = cc.createAlgorithmDescriptor()
    cc.setAlgorithmDescriptor(d, 2)
    cc.cudnnSetAlgorithmPerformance(perfs[1], d, cc.CUDNN_STATUS_ALLOC_FAILED, 1.25, 4096)
    got_d, status, time, memory = cc.cudnnGetAlgorithmPerformance(perfs[1])
    assert cc.getAlgorithmDescriptor(got_d) == 2 and (status, time, memory) == (cc.CUDNN_STATUS_ALLOC_FAILED, 1.25, 4096)
    for args in ((perfs[0], d, 99, 1.0, 0), (perfs[0], d, 0, 1.0, -5)):  # rules: a cudnnStatus_t, memory >= 0
        with pytest.raises(cc.CuDNNError) as e:
            cc.setAlgorithmPerformance(*args)
        assert e.value.status == BAD
    cc.cudnnDestroyAlgorithmPerformance(perfs)
    with pytest.raises(cc.CuDNNError):
        cc.getAlgorithmPerformance(perfs[1])


def test_save_and_restore_algorithm(handle):
    d = cc.createAlgorithmDescriptor()
    cc.setAlgorithmDescriptor(d, cc.CUDNN_RNN_ALGO_PERSIST_STATIC)
    size = cc.cudnnGetAlgorithmSpaceSize(handle, d)
    space = np.zeros(size, np.uint8)
    cc.cudnnSaveAlgorithm(handle, d, space, size)
    raw = space.tobytes()
    magic, version, algo, crc = struct.unpack("<4sIiI", raw)
    assert (magic, version, algo, crc) == (b"CCAL", cc.cudnnGetVersion(), cc.CUDNN_RNN_ALGO_PERSIST_STATIC,
                                           zlib.crc32(raw[:12]))
    r = cc.createAlgorithmDescriptor()
    cc.cudnnRestoreAlgorithm(handle, space, size, r)
    assert cc.getAlgorithmDescriptor(r) == cc.CUDNN_RNN_ALGO_PERSIST_STATIC
    bad = space.copy()
    bad[8] ^= 1
    with pytest.raises(cc.CuDNNError) as e:  # rule: corrupted metadata
        cc.restoreAlgorithm(handle, bad, size, r)
    assert e.value.status == BAD
    other = bytearray(struct.pack("<4sIi", b"CCAL", 7605, 1))
    other += struct.pack("<I", zlib.crc32(bytes(other)))
    with pytest.raises(cc.CuDNNError) as e:  # rule: metadata of another version
        cc.restoreAlgorithm(handle, other, size, r)
    assert e.value.status == UNSUP
    with pytest.raises(cc.CuDNNError) as e:  # rule: the space must hold GetAlgorithmSpaceSize bytes
        cc.saveAlgorithm(handle, d, np.zeros(4, np.uint8), 4)
    assert e.value.status == BAD


# -- the removed v7 algorithm queries ----------------------------------------------------

def _conv_problem(dtype=cc.CUDNN_DATA_FLOAT):
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, dtype, cc.CUDNN_TENSOR_NCHW, 3, 2, 3, 3)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, dtype)
    return tdesc((2, 2, 5, 5), dtype), wd, cd, tdesc((2, 3, 5, 5), dtype)


def test_preference_constants_keep_their_v7_values():
    for prefix in ("FWD", "BWD_DATA", "BWD_FILTER"):
        for name, value in (("NO_WORKSPACE", 0), ("PREFER_FASTEST", 1), ("SPECIFY_WORKSPACE_LIMIT", 2)):
            assert getattr(cc, f"CUDNN_CONVOLUTION_{prefix}_{name}") == value
            assert getattr(cc.convolution.legacy, f"CUDNN_CONVOLUTION_{prefix}_{name}") == value


@pytest.mark.parametrize("direction", ["FWD", "BWD_DATA", "BWD_FILTER"])
def test_v7_get_algorithm_follows_the_preferences(handle, rng, direction):
    xd, wd, cd, yd = _conv_problem()
    get, ranked, ws = {
        "FWD": (cc.cudnnGetConvolutionForwardAlgorithm, cc.cudnnGetConvolutionForwardAlgorithm_v7,
                cc.cudnnGetConvolutionForwardWorkspaceSize),
        "BWD_DATA": (cc.cudnnGetConvolutionBackwardDataAlgorithm, cc.cudnnGetConvolutionBackwardDataAlgorithm_v7,
                     cc.cudnnGetConvolutionBackwardDataWorkspaceSize),
        "BWD_FILTER": (cc.cudnnGetConvolutionBackwardFilterAlgorithm, cc.cudnnGetConvolutionBackwardFilterAlgorithm_v7,
                       cc.cudnnGetConvolutionBackwardFilterWorkspaceSize)}[direction]
    descs = {"FWD": (xd, wd, cd, yd), "BWD_DATA": (wd, yd, cd, xd), "BWD_FILTER": (xd, yd, cd, wd)}[direction]
    pref = lambda n: getattr(cc, f"CUDNN_CONVOLUTION_{direction}_{n}")  # noqa: E731
    first_ok = next(p.algo for p in ranked(handle, *descs, 100) if p.status == cc.CUDNN_STATUS_SUCCESS)
    assert get(handle, *descs, pref("PREFER_FASTEST"), 0) == first_ok
    assert ws(handle, *descs, get(handle, *descs, pref("NO_WORKSPACE"), 0)) == 0
    assert ws(handle, *descs, get(handle, *descs, pref("SPECIFY_WORKSPACE_LIMIT"), 1 << 20)) <= 1 << 20
    with pytest.raises(cc.CuDNNError) as e:  # rule: a valid preference
        get(handle, *descs, 7, 0)
    assert e.value.status == BAD and "preference" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # rule: a non-negative memory limit
        get(handle, *descs, pref("SPECIFY_WORKSPACE_LIMIT"), -1)
    assert e.value.status == BAD


def test_v7_forward_algorithm_runs_and_computes(handle, rng):
    xd, wd, cd, yd = _conv_problem()
    x, w = rng.standard_normal((2, 2, 5, 5)).astype(np.float32), rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    algo = cc.getConvolutionForwardAlgorithm(handle, xd, wd, cd, yd, cc.CUDNN_CONVOLUTION_FWD_NO_WORKSPACE, 0)
    y = np.zeros((2, 3, 5, 5), np.float32)
    cc.cudnnConvolutionForward(handle, 1.0, xd, x, wd, w, cd, algo, None, 0, 0.0, yd, y)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros(y.shape)
    for i in range(5):
        for j in range(5):
            want[:, :, i, j] = np.einsum("ncrs,kcrs->nk", xp[:, :, i:i + 3, j:j + 3], w)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_v7_no_qualifying_algorithm_is_not_supported(handle):
    """NHWC double filters: no backward-data algorithm of 002's tables runs them."""
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_TENSOR_NHWC, 3, 2, 3, 3)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_DOUBLE)
    dxd, dyd = tdesc((1, 2, 4, 4), cc.CUDNN_DATA_DOUBLE), tdesc((1, 3, 4, 4), cc.CUDNN_DATA_DOUBLE)
    with pytest.raises(cc.CuDNNError) as e:
        cc.getConvolutionBackwardDataAlgorithm(handle, wd, dyd, cd, dxd, cc.CUDNN_CONVOLUTION_BWD_DATA_PREFER_FASTEST, 0)
    assert e.value.status == UNSUP
