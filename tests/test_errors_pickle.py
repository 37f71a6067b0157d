"""Errors and descriptors across a process boundary (issue 13, item 6).

* ``cudnn_compat.CuDNNError`` and CuPy 13's ``cupy.cuda.cudnn.CuDNNError`` round-trip through
  ``pickle`` (every protocol), ``copy.copy`` and ``copy.deepcopy`` with every field (status,
  argument, rule, function, message) and every extra attribute; a worker's error reaches the
  parent of a ``ProcessPoolExecutor`` as that error, not as ``BrokenProcessPool``.
* ``str(cupy.cuda.cudnn.CuDNNError(s))`` is CuPy 13.6.0's ``'cuDNN Error: ' + cudnnGetErrorString(s)``
  (cupy_backends/cuda/libs/cudnn.pyx, class CuDNNError).
* Descriptors and handles are references to process-local state: copies are the same object;
  pickled, they come back as the same live object in the same process and as a dead one (every
  call taking it is BAD_PARAM) when destroyed meanwhile or loaded in another process.
"""
import concurrent.futures as cf
import copy
import multiprocessing
import pickle

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core import descriptor as _descriptor
from cudnn_compat.cupy13 import cupy_cudnn as L

BAD, NOT_SUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
FIELDS = ("status", "argument", "rule", "function", "message", "status_name")
PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)


def _set4d(d, *dims):
    cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, *dims)
    return d


def _raised(call):
    with pytest.raises(cc.CuDNNError) as e:
        call()
    return e.value


def _errors():
    """Errors raised by real calls (several functions and argument positions), and built by hand."""
    h = cc.cudnnCreate("cpu")
    t = _set4d(cc.cudnnCreateTensorDescriptor(), 1, 2, 3, 3)
    dead = cc.cudnnCreateTensorDescriptor()
    cc.cudnnDestroyTensorDescriptor(dead)
    a = cc.cudnnCreateActivationDescriptor()
    out = {
        "n=0": _raised(lambda: _set4d(cc.cudnnCreateTensorDescriptor(), 0, 1, 1, 1)),
        "destroyed aDesc": _raised(lambda: cc.cudnnAddTensor(h, 1.0, dead, np.zeros(18, np.float32), 0.0, t,
                                                             np.zeros(18, np.float32))),
        "unset activationDesc": _raised(lambda: cc.cudnnActivationForward(h, a, 1.0, t, np.zeros(18, np.float32), 0.0,
                                                                          t, np.zeros(18, np.float32))),
        "NULL handle": _raised(lambda: cc.cudnnGetStream(0)),
        "library property": _raised(lambda: cc.cudnnGetProperty(7)),
        "by hand": cc.CuDNNError(NOT_SUP, "mode", "is not supported here", "cudnnSomething"),
        "status only": cc.CuDNNError(BAD),
        "unknown status": cc.CuDNNError(4242, "x", "y"),
    }
    out["with extra attribute"] = cc.CuDNNError(BAD, "CUDNN_ATTR_X", "check C: no")
    out["with extra attribute"].check = "C"
    cc.cudnnDestroy(h)
    return out


ERRORS = _errors()


def _same_error(a, b):
    assert type(a) is type(b)
    for f in FIELDS:
        assert getattr(a, f) == getattr(b, f), f
    assert str(a) == str(b) and a.args == b.args and repr(a) == repr(b)
    extra = {k: v for k, v in vars(a).items()}
    assert {k: v for k, v in vars(b).items()} == extra


def test_real_errors_have_the_fields_they_are_checked_for():
    e = ERRORS["n=0"]
    assert (e.status, e.function) == (BAD, "cudnnSetTensor4dDescriptor") and e.argument and e.rule
    e = ERRORS["destroyed aDesc"]
    assert (e.status, e.function, e.argument) == (BAD, "cudnnAddTensor", "aDesc") and "destroyed" in e.rule
    e = ERRORS["unset activationDesc"]
    assert (e.status, e.function, e.argument) == (BAD, "cudnnActivationForward", "activationDesc")
    assert ERRORS["library property"].status == cc.CUDNN_STATUS_INVALID_VALUE


@pytest.mark.parametrize("name", sorted(ERRORS))
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_error_pickles_with_every_field(name, protocol):
    e = ERRORS[name]
    _same_error(e, pickle.loads(pickle.dumps(e, protocol)))


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_error_copies_with_every_field(name):
    e = ERRORS[name]
    for dup in (copy.copy(e), copy.deepcopy(e)):
        _same_error(e, dup)
        assert dup is not e


def test_status_only_error():
    e = cc.CuDNNError(3)
    assert (e.status, e.argument, e.rule, e.function) == (3, "", "", "")
    assert str(e) == e.message == "CUDNN_STATUS_BAD_PARAM" and e.status_name == "CUDNN_STATUS_BAD_PARAM"
    assert str(cc.CuDNNError(9, "mode")) == "CUDNN_STATUS_NOT_SUPPORTED: mode"
    assert str(cc.CuDNNError(9, rule="r")) == "CUDNN_STATUS_NOT_SUPPORTED: r"
    assert str(cc.CuDNNError(9, "a", "r", "cudnnF")) == "CUDNN_STATUS_NOT_SUPPORTED: cudnnF: a: r"
    assert str(cc.CuDNNError(4242)) == "CUDNN_UNKNOWN_STATUS"


def test_with_function_survives_pickling():
    e = cc.CuDNNError(BAD, "x", "must be positive").with_function("cudnnF")
    back = pickle.loads(pickle.dumps(e))
    assert back.function == "cudnnF" and str(back) == "CUDNN_STATUS_BAD_PARAM: cudnnF: x: must be positive"


# -- CuPy 13's CuDNNError ------------------------------------------------------------------------

@pytest.mark.parametrize("name,status", sorted(cc.STATUS.items(), key=lambda kv: kv[1]))
def test_cupy_error_text_is_cupy13s(name, status):
    e = L.CuDNNError(status)
    assert str(e) == f"cuDNN Error: {name}"  # cupy 13.6.0: 'cuDNN Error: {}'.format(cudnnGetErrorString(status))
    assert repr(e) == f"CuDNNError('cuDNN Error: {name}')" and e.status == status
    assert isinstance(e, RuntimeError) and isinstance(e, cc.CuDNNError)


def test_cupy_error_exact_examples():
    assert str(L.CuDNNError(3)) == "cuDNN Error: CUDNN_STATUS_BAD_PARAM"
    assert str(L.CuDNNError(4242)) == "cuDNN Error: CUDNN_UNKNOWN_STATUS"
    with pytest.raises(L.CuDNNError) as e:
        L.check_status(3)
    assert str(e.value) == "cuDNN Error: CUDNN_STATUS_BAD_PARAM" and e.value.status == 3
    e = L.CuDNNError(3)
    e.add_info("x: (1, 2)")
    e.add_infos(["y: 3"])
    assert str(e) == "cuDNN Error: CUDNN_STATUS_BAD_PARAM\n  x: (1, 2)\n  y: 3"


def _cupy_errors():
    raised = _raised(lambda: L.setTensor4dDescriptor(L.createTensorDescriptor(), 0, 0, 0, 1, 1, 1))
    infos = L.CuDNNError(NOT_SUP, "algo", "no such algorithm", "cudnnConvolutionForward")
    infos.add_infos(["x: shape=(1, 2)", "w: shape=(3,)"])
    return [L.CuDNNError(3), L.CuDNNError(8), raised, infos, L.CuDNNError.of(ERRORS["with extra attribute"])]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cupy_error_round_trips(protocol):
    errors = _cupy_errors()
    assert type(errors[2]) is L.CuDNNError and errors[2].function == "cudnnSetTensor4dDescriptor"
    assert errors[-1].check == "C"
    for e in errors:
        for back in (pickle.loads(pickle.dumps(e, protocol)), copy.deepcopy(e), copy.copy(e)):
            _same_error(e, back)
    back = copy.deepcopy(errors[3])
    back.add_info("more")  # infos are copied, not shared
    assert "more" not in str(errors[3]) and str(back).endswith("\n  more")


# -- a worker process's error ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def pool():
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        yield ex


def test_worker_error_reaches_the_parent(pool):
    fut = pool.submit(cc.cudnnSetTensor4dDescriptor, cc.cudnnCreateTensorDescriptor(), cc.CUDNN_TENSOR_NCHW,
                      cc.CUDNN_DATA_FLOAT, 1, 1, 1, 1)
    with pytest.raises(cc.CuDNNError) as e:  # a dead descriptor there (it was created here)
        fut.result(timeout=120)
    e = e.value
    assert type(e) is cc.CuDNNError and (e.status, e.function, e.argument) == (BAD, "cudnnSetTensor4dDescriptor", "tensorDesc")
    assert "pickled copy" in e.rule and "process-local" in e.rule

    fut = pool.submit(cc.cudnnGetStream, 0)
    with pytest.raises(cc.CuDNNError) as e:
        fut.result(timeout=120)
    assert (e.value.status, e.value.function, e.value.argument) == (BAD, "cudnnGetStream", "handle")

    fut = pool.submit(L.check_status, 8)
    with pytest.raises(L.CuDNNError) as e:
        fut.result(timeout=120)
    assert type(e.value) is L.CuDNNError and str(e.value) == "cuDNN Error: CUDNN_STATUS_EXECUTION_FAILED"

    fut = pool.submit(L.createTensorDescriptor)
    made_there = fut.result(timeout=120)  # a descriptor the worker made: dead here
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetTensor4dDescriptor(made_there)
    assert e.value.status == BAD and "pickled copy" in e.value.rule
    assert pool.submit(int, "7").result(timeout=120) == 7  # the pool is not broken


def test_worker_cupy_error_keeps_its_fields(pool):
    fut = pool.submit(L.setTensor4dDescriptor, 0, 0, 0, 1, 1, 1, 1)
    with pytest.raises(L.CuDNNError) as e:
        fut.result(timeout=120)
    e = e.value
    assert type(e) is L.CuDNNError and (e.status, e.function, e.argument) == (BAD, "cudnnSetTensor4dDescriptor", "tensorDesc")
    assert str(e).startswith("cuDNN Error: CUDNN_STATUS_BAD_PARAM: cudnnSetTensor4dDescriptor: tensorDesc: ")


# -- descriptors ---------------------------------------------------------------------------------

def _live():
    """(handle, tensor, activation, filter descriptor), all live and set."""
    h = cc.cudnnCreate("cpu")
    t = _set4d(cc.cudnnCreateTensorDescriptor(), 1, 2, 3, 3)
    a = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(a, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    w = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(w, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, 2, 2, 1, 1)
    return h, t, a, w


def _relu(h, a, t):
    x = np.arange(18, dtype=np.float32) - 9
    y = np.full(18, 7, np.float32)
    cc.cudnnActivationForward(h, a, 1.0, t, x, 0.0, t, y)
    return y


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
def test_live_descriptor_copies_are_the_same_live_object(how):
    objs = _live()
    dup = {"pickle": lambda o: pickle.loads(pickle.dumps(o)), "deepcopy": copy.deepcopy, "copy": copy.copy}[how]
    h, t, a, w = dup(list(objs))
    assert (h, t, a, w) == objs and all(x is y for x, y in zip((h, t, a, w), objs))
    np.testing.assert_array_equal(_relu(h, a, t), np.maximum(np.arange(18) - 9, 0))
    assert cc.cudnnGetFilter4dDescriptor(w) == (cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, 2, 2, 1, 1)
    cc.cudnnDestroy(objs[0])


def _expect_dead(call, argument, why):
    with pytest.raises(cc.CuDNNError) as e:
        call()
    assert (e.value.status, e.value.argument) == (BAD, argument), e.value
    assert why in e.value.rule, e.value


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy", "pickled before destroy"])
def test_destroyed_descriptor_stays_dead(how):
    h, t, a, w = objs = _live()
    before = pickle.dumps(list(objs))
    live_t = _set4d(cc.cudnnCreateTensorDescriptor(), 1, 2, 3, 3)
    cc.cudnnDestroyTensorDescriptor(t)
    cc.cudnnDestroyActivationDescriptor(a)
    cc.cudnnDestroyFilterDescriptor(w)
    cc.cudnnDestroy(h)
    if how == "pickled before destroy":
        dh, dt, da, dw = pickle.loads(before)
    else:
        dup = {"pickle": lambda o: pickle.loads(pickle.dumps(o)), "deepcopy": copy.deepcopy, "copy": copy.copy}[how]
        dh, dt, da, dw = dup(list(objs))
    live_count = _descriptor.live_count()
    x, y = np.zeros(18, np.float32), np.zeros(18, np.float32)
    h2 = cc.cudnnCreate("cpu")
    a2 = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(a2, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    _expect_dead(lambda: cc.cudnnGetTensor4dDescriptor(dt), "tensorDesc", "destroyed")
    _expect_dead(lambda: cc.cudnnGetFilter4dDescriptor(dw), "filterDesc", "destroyed")
    _expect_dead(lambda: cc.cudnnGetStream(dh), "handle", "destroyed")
    _expect_dead(lambda: cc.cudnnActivationForward(dh, a2, 1.0, live_t, x, 0.0, live_t, y), "handle", "destroyed")
    _expect_dead(lambda: cc.cudnnActivationForward(h2, da, 1.0, live_t, x, 0.0, live_t, y), "activationDesc", "destroyed")
    _expect_dead(lambda: cc.cudnnActivationForward(h2, a2, 1.0, dt, x, 0.0, live_t, y), "xDesc", "destroyed")
    _expect_dead(lambda: cc.cudnnActivationForward(h2, a2, 1.0, live_t, x, 0.0, dt, y), "yDesc", "destroyed")
    _expect_dead(lambda: cc.cudnnDestroyTensorDescriptor(dt), "tensorDesc", "destroyed")
    assert not y.any()  # nothing written
    assert _descriptor.live_count() == live_count + 2  # the copies did not come back to life
    assert int(dt) not in _descriptor._LIVE
    assert repr(dt).endswith(" destroyed>" if how in ("copy", "deepcopy") else " dead>")
    assert (dt is t) == (how in ("copy", "deepcopy"))
    cc.cudnnDestroy(h2)


def test_dead_copy_stays_dead_after_its_id_ages_out():
    t = _set4d(cc.cudnnCreateTensorDescriptor(), 1, 1, 1, 1)
    cc.cudnnDestroyTensorDescriptor(t)
    dup = pickle.loads(pickle.dumps(t))
    _descriptor._DEAD.pop(int(t), None)  # as if 4096 later destroys pushed it out
    _expect_dead(lambda: cc.cudnnGetTensor4dDescriptor(dup), "tensorDesc", "destroyed")


def test_descriptor_from_another_process_is_dead():
    """A pickle made by another process (here: a record claiming another pid) loads as a dead
    descriptor with a fresh id, even where that process's id is live here."""
    h, t, a, w = _live()
    for obj, fn, arg in ((t, cc.cudnnGetTensor4dDescriptor, "tensorDesc"), (h, cc.cudnnGetStream, "handle"),
                         (w, cc.cudnnGetFilter4dDescriptor, "filterDesc")):
        fn_, (cls, ident, pid, token) = obj.__reduce__()
        foreign = fn_(cls, ident, pid + 1, token)  # same id, "another process"
        assert type(foreign) is type(obj) and int(foreign) != int(obj)
        _expect_dead(lambda: fn(foreign), arg, "pickled copy")
        assert fn(obj) is not None  # the live one here is untouched
        foreign = fn_(cls, ident, pid, token ^ 1)  # same pid, another interpreter (a pid reused)
        _expect_dead(lambda: fn(foreign), arg, "process-local")
    cc.cudnnDestroy(h)
