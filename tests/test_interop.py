"""Foreign arrays on the CPU place (issue 16 item 4, "Interop"; docs/conventions.md "Data"):
objects exposing only ``__dlpack__`` (with or without ``__dlpack_device__``), only
``__array_interface__``, and torch CPU tensors (when torch is installed) are accepted wherever a
NumPy array is, as the GPU place accepts DLPack.  Inputs are read and outputs written in place,
through the caller's own memory: every test checks the numbers in the NumPy array that owns the
memory, computed here with independent NumPy formulas.

Rules checked across several functions and both argument positions (input, output): a read-only
foreign output is BAD_PARAM naming it, a wrong dtype is BAD_PARAM naming it, and a rejected call
writes nothing.
"""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core import data as _data
from conftest import tdesc

try:  # torch CPU tensors: optional (the test that needs it skips without it)
    import torch
except Exception:  # noqa: BLE001 - not installed, or a broken install
    torch = None

BAD = cc.CUDNN_STATUS_BAD_PARAM


class DLPackOnly:
    """Exposes a NumPy array through ``__dlpack__`` and ``__dlpack_device__`` only."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class DLPackBare:
    """``__dlpack__`` alone (no ``__dlpack_device__``)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)


class ArrayInterfaceOnly:
    """Exposes a NumPy array through ``__array_interface__`` only (no buffer protocol, no __array__)."""

    def __init__(self, a):
        self._a = a

    @property
    def __array_interface__(self):
        return self._a.__array_interface__


def _torch(a):
    return torch.from_numpy(a)  # shares a's memory


WRAPPERS = {"dlpack": DLPackOnly, "dlpack_bare": DLPackBare, "array_interface": ArrayInterfaceOnly,
            "torch": _torch}
READONLY_WRAPPERS = ("dlpack", "dlpack_bare", "array_interface")  # torch has no read-only tensors


@pytest.fixture(params=list(WRAPPERS))
def wrap(request):
    if request.param == "torch" and torch is None:
        pytest.skip("torch is not installed")
    return WRAPPERS[request.param]


def _rand(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- each case: (setup(rng) -> (inputs, outputs, expected outputs), call(h, *wrapped inputs+outputs)) ----

def _activation(rng):
    x = _rand(rng, (2, 3, 4, 4))
    y = np.full_like(x, 7.0)
    return [x], [y], [np.maximum(x, 0)]


def _call_activation(h, x, y):
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    d = tdesc((2, 3, 4, 4))
    cc.cudnnActivationForward(h, ad, 1.0, d, x, 0.0, d, y)


def _add(rng):
    b, c = _rand(rng, (1, 3, 1, 1)), _rand(rng, (2, 3, 4, 4))
    return [b], [c], [2.0 * b + 0.5 * c]  # C is read (beta) and written


def _call_add(h, b, c):
    cc.cudnnAddTensor(h, 2.0, tdesc((1, 3, 1, 1)), b, 0.5, tdesc((2, 3, 4, 4)), c)


def _conv(rng):
    x, w = _rand(rng, (2, 3, 5, 5)), _rand(rng, (4, 3, 3, 3))
    y = np.zeros((2, 4, 3, 3), np.float32)
    # cross-correlation, no padding, stride 1: y[n,k,i,j] = sum_c,r,s x[n,c,i+r,j+s] w[k,c,r,s]
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(2, 3))
    return [x, w], [y], [np.einsum("ncijrs,kcrs->nkij", windows, w.astype(np.float64))]


def _call_conv(h, x, w, y):
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, 4, 3, 3, 3)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
    cc.cudnnConvolutionForward(h, 1.0, tdesc((2, 3, 5, 5)), x, wd, w, cd, algo, None, 0, 0.0, tdesc((2, 4, 3, 3)), y)


def _softmax(rng):
    x = _rand(rng, (2, 5, 3, 3))
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return [x], [np.zeros_like(x)], [e / e.sum(axis=1, keepdims=True)]


def _call_softmax(h, x, y):
    d = tdesc((2, 5, 3, 3))
    cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, d, x, 0.0, d, y)


def _pool(rng):
    x = _rand(rng, (2, 3, 4, 6))
    return [x], [np.zeros((2, 3, 2, 3), np.float32)], [x.reshape(2, 3, 2, 2, 3, 2).max(axis=(3, 5))]


def _call_pool(h, x, y):
    pd = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pd, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
    cc.cudnnPoolingForward(h, pd, 1.0, tdesc((2, 3, 4, 6)), x, 0.0, tdesc((2, 3, 2, 3)), y)


def _bn(rng):
    x = _rand(rng, (4, 3, 2, 2))
    gamma, beta = rng.uniform(0.5, 1.5, (1, 3, 1, 1)).astype(np.float32), _rand(rng, (1, 3, 1, 1))
    rmean, rvar = np.zeros((1, 3, 1, 1), np.float32), np.ones((1, 3, 1, 1), np.float32)
    smean, sinv = np.zeros_like(rmean), np.zeros_like(rmean)
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(0, 2, 3), keepdims=True), x64.var(axis=(0, 2, 3), keepdims=True)
    m, eps, f = x.size // 3, 1e-5, 0.25
    inv = 1.0 / np.sqrt(var + eps)
    want = [(x64 - mean) * inv * gamma + beta,
            (1 - f) * 0.0 + f * mean,                 # running mean (was 0)
            (1 - f) * 1.0 + f * var * m / (m - 1),    # running variance (was 1; unbiased, as cuDNN)
            mean, inv]
    return [x, gamma, beta], [np.zeros_like(x), rmean, rvar, smean, sinv], want


def _call_bn(h, x, gamma, beta, y, rmean, rvar, smean, sinv):
    d, bd = tdesc((4, 3, 2, 2)), tdesc((1, 3, 1, 1))
    cc.cudnnBatchNormalizationForwardTraining(h, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, d, x, d, y, bd, gamma, beta,
                                              0.25, rmean, rvar, 1e-5, smean, sinv)


CASES = {"ActivationForward": (_activation, _call_activation), "AddTensor": (_add, _call_add),
         "ConvolutionForward": (_conv, _call_conv), "SoftmaxForward": (_softmax, _call_softmax),
         "PoolingForward": (_pool, _call_pool), "BatchNormalizationForwardTraining": (_bn, _call_bn)}


@pytest.mark.parametrize("case", list(CASES))
def test_foreign_arrays_are_read_and_written_in_place(handle, rng, wrap, case):
    setup, call = CASES[case]
    ins, outs, want = setup(rng)
    addresses = [o.__array_interface__["data"][0] for o in outs]
    call(handle, *[wrap(a) for a in ins + outs])
    for i, (o, w) in enumerate(zip(outs, want)):
        assert o.__array_interface__["data"][0] == addresses[i]
        np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-5, err_msg=f"{case}: output {i}")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", READONLY_WRAPPERS)
def test_read_only_foreign_output_is_bad_param_and_nothing_is_written(handle, rng, case, kind):
    setup, call = CASES[case]
    ins, outs, _ = setup(rng)
    before = [o.copy() for o in outs]
    outs[-1].flags.writeable = False  # the last output (and each earlier one stays writable)
    with pytest.raises(cc.CuDNNError) as e:
        call(handle, *[WRAPPERS[kind](a) for a in ins + outs])
    assert e.value.status == BAD
    assert "read-only" in str(e.value)
    for o, b in zip(outs, before):
        assert o.tobytes() == b.tobytes()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("position", ["input", "output"])
def test_wrong_dtype_is_bad_param_naming_it(handle, rng, wrap, case, position):
    setup, call = CASES[case]
    ins, outs, _ = setup(rng)
    before = [o.copy() for o in outs]
    if position == "input":
        ins[0] = ins[0].astype(np.float64)
    else:
        outs[0] = outs[0].astype(np.float64)
        before[0] = outs[0].copy()
    with pytest.raises(cc.CuDNNError) as e:
        call(handle, *[wrap(a) for a in ins + outs])
    assert e.value.status == BAD
    assert "float64" in str(e.value) and "CUDNN_DATA_FLOAT" in str(e.value)
    for o, b in zip(outs, before):
        assert o.tobytes() == b.tobytes()


def test_in_place_through_two_foreign_views_of_one_buffer(handle, rng, wrap):
    """x and y are two different objects over the same memory: ReLU in place (002 allows it)."""
    x = _rand(rng, (2, 3, 4, 4))
    want = np.maximum(x, 0)
    _call_activation(handle, wrap(x), wrap(x))
    np.testing.assert_array_equal(x, want)


def test_address_of_a_foreign_array_is_its_memory(rng):
    a = _rand(rng, (3, 4))
    ptr = a.__array_interface__["data"][0]
    assert _data.address(DLPackOnly(a)) == ptr
    assert _data.address(ArrayInterfaceOnly(a)) == ptr
    assert _data.same_buffer(DLPackOnly(a), ArrayInterfaceOnly(a))
    assert not _data.same_buffer(DLPackOnly(a), DLPackOnly(a.copy()))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_tensors_that_cannot_be_exported_are_bad_param_with_the_reason(handle, rng):
    x = torch.from_numpy(_rand(rng, (2, 3, 4, 4)))
    y = torch.zeros((2, 3, 4, 4), requires_grad=True)  # DLPack refuses tensors that require grad
    with pytest.raises(cc.CuDNNError) as e:
        _call_activation(handle, x, y)
    assert e.value.status == BAD and e.value.argument == "y" and "DLPack" in str(e.value)
    assert float(y.detach().abs().sum()) == 0.0
    t = torch.zeros((3, 2, 4, 4)).transpose(0, 1)  # a strided view: legacy calls take a pointer
    with pytest.raises(cc.CuDNNError) as e:
        _call_activation(handle, x, t)
    assert e.value.status == BAD and "contiguous" in str(e.value)
    assert float(t.abs().sum()) == 0.0


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_results_match_torch(handle, rng):
    """The same numbers torch computes, written into torch's own tensors."""
    x = torch.from_numpy(_rand(rng, (2, 5, 3, 3)))
    y = torch.full((2, 5, 3, 3), 3.0)
    _call_softmax(handle, x, y)
    torch.testing.assert_close(y, torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)
    xs, ws = torch.from_numpy(_rand(rng, (2, 3, 5, 5))), torch.from_numpy(_rand(rng, (4, 3, 3, 3)))
    yc = torch.zeros((2, 4, 3, 3))
    _call_conv(handle, xs, ws, yc)
    torch.testing.assert_close(yc, torch.nn.functional.conv2d(xs, ws), rtol=1e-4, atol=1e-4)
