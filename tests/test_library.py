"""Library functions: handles, streams, versions, error strings, properties (002 §3.2.5 cudnnCreate,
§3.2.20 cudnnDestroy, §3.2.87/§3.2.58 Set/GetStream, §3.2.63 GetVersion, §3.2.43 GetErrorString,
§3.2.54 GetProperty), descriptor ids, and the two spellings of every legacy function."""
import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core import registry as _registry
from conftest import tdesc

BAD = cc.CUDNN_STATUS_BAD_PARAM


def status_of(fn, *args):
    with pytest.raises(cc.CuDNNError) as e:
        fn(*args)
    return e.value.status


def test_create_destroy_and_ids():
    h = cc.cudnnCreate("cpu")
    assert isinstance(h, int) and int(h) != 0 and h.place == "cpu"
    assert cc.getStream(int(h)) == 0  # the int id is accepted wherever the handle is
    cc.destroy(int(h))
    e = pytest.raises(cc.CuDNNError, cc.getStream, h).value
    assert e.status == BAD and "destroyed" in str(e) and e.function == "cudnnGetStream" and e.argument == "handle"
    assert status_of(cc.cudnnDestroy, h) == BAD  # twice
    assert status_of(cc.getStream, 0) == BAD  # NULL
    assert status_of(cc.getStream, None) == BAD
    assert status_of(cc.getStream, 987654321) == BAD  # never a handle
    assert status_of(cc.create, "tpu") == BAD


def test_handles_are_independent():
    h1, h2 = cc.create("cpu"), cc.create("cpu")
    assert int(h1) != int(h2)
    cc.setStream(h1, 0x1234)
    assert cc.getStream(h1) == 0x1234 and cc.getStream(h2) == 0
    cc.setStream(h1, 0)
    assert cc.getStream(h1) == 0
    cc.setStream(h1, None)
    assert cc.getStream(h1) == 0
    cc.destroy(h1)
    cc.destroy(h2)


def test_wrong_kind_of_object_is_bad_param(handle):
    d = tdesc((1, 1, 1, 1))
    e = pytest.raises(cc.CuDNNError, cc.getStream, d).value  # a tensor descriptor is not a handle
    assert e.status == BAD and "cudnnHandle_t" in str(e)
    y = np.zeros(1, np.float32)
    assert status_of(cc.setTensor, d, d, y, 1.0) == BAD  # descriptor passed as the handle
    assert status_of(cc.setTensor, handle, handle, y, 1.0) == BAD  # handle passed as the descriptor
    assert status_of(cc.setTensor, handle, "desc", y, 1.0) == BAD  # not even an id
    assert y[0] == 0


def test_stale_descriptor_id_in_a_compute_call(handle):
    d = tdesc((1, 2, 1, 1))
    y = np.zeros(2, np.float32)
    cc.setTensor(handle, int(d), y, 3.0)  # by id
    assert np.all(y == 3.0)
    cc.destroyTensorDescriptor(d)
    e = pytest.raises(cc.CuDNNError, cc.setTensor, handle, int(d), y, 4.0).value
    assert e.status == BAD and e.argument == "yDesc" and "destroyed" in str(e)
    assert np.all(y == 3.0)


def test_get_version_and_property():
    v = cc.cudnnGetVersion()
    assert isinstance(v, int) and 8000 <= v < 9000  # what cuDNN-8-era callers check
    major, minor, patch = (cc.getProperty(t) for t in (cc.MAJOR_VERSION, cc.MINOR_VERSION, cc.PATCH_LEVEL))
    assert major * 1000 + minor * 100 + patch == v  # CUDNN_VERSION's formula in cuDNN 8
    for bad in (3, -1, 99):
        e = pytest.raises(cc.CuDNNError, cc.cudnnGetProperty, bad).value
        assert e.status == cc.CUDNN_STATUS_INVALID_VALUE and e.argument == "type"


def test_get_error_string():
    names = [k for k in dir(cc) if k.startswith("CUDNN_STATUS_")]
    assert len(names) == 15
    for name in names:
        assert cc.cudnnGetErrorString(getattr(cc, name)) == name
    assert cc.getErrorString(9999) == "CUDNN_UNKNOWN_STATUS"
    assert cc.getErrorString(-1) == "CUDNN_UNKNOWN_STATUS"


def test_error_object():
    e = pytest.raises(cc.CuDNNError, cc.cudnnGetProperty, 7).value
    assert e.status_name == "CUDNN_STATUS_INVALID_VALUE"
    assert str(e).startswith("CUDNN_STATUS_INVALID_VALUE: cudnnGetProperty: type:")


def test_every_legacy_function_has_both_spellings():
    assert len(_registry.LEGACY) > 20
    for c_name, fn in _registry.LEGACY.items():
        assert c_name.startswith("cudnn") and fn.c_name == c_name
        assert getattr(cc, c_name) is fn, c_name
        cupy = c_name[len("cudnn"):]
        cupy = cupy[0].lower() + cupy[1:]
        target = _registry.CUPY_NAMES.get(cupy)
        if target is None:  # registered under an explicit CuPy name instead
            spellings = [k for k, v in _registry.CUPY_NAMES.items() if v == c_name]
            assert spellings, f"{c_name} has no CuPy spelling"
            cupy = spellings[0]
        assert getattr(cc, cupy) is fn, (c_name, cupy)
    for cupy, c_name in _registry.CUPY_NAMES.items():
        assert getattr(cc, cupy) is _registry.LEGACY[c_name]


def test_enum_constants_are_module_attributes():
    from cudnn_compat.enums import ENUMS
    for values in ENUMS.values():
        for name, value in values.items():
            assert getattr(cc, name) == value, name


@pytest.mark.gpu
def test_gpu_handle():
    import cupy
    h = cc.create("gpu")
    assert h.place == "gpu"
    s = cupy.cuda.Stream()
    cc.setStream(h, s)
    assert cc.getStream(h) == s.ptr
    cc.setStream(h, 0)
    assert cc.getStream(h) == 0
    cc.destroy(h)
