"""The descriptor lifecycle table (cudnn_compat/_core/lifecycle.py, issue 15 item 4): every row gives a
Create and a Destroy under both spellings, as attributes of the family module, and Destroy keeps
``_core.descriptor.resolve``'s rules (NULL, destroyed twice, another type) for every row."""
import ctypes
import inspect

import pytest

import cudnn_compat as cc
from cudnn_compat._core import lifecycle as _lifecycle
from cudnn_compat._core.registry import CUPY_NAMES, LEGACY, cupy_name

BAD_PARAM = cc.CUDNN_STATUS_BAD_PARAM


def _status(fn, *args):
    with pytest.raises(cc.CuDNNError) as e:
        fn(*args)
    return e.value.status, str(e.value)


def test_every_row_is_defined_registered_and_a_module_attribute():
    assert len(_lifecycle.TABLE) == 17 and _lifecycle.undefined() == []
    for row in _lifecycle.TABLE:
        for c_name, doc in ((row.create, row.create_doc), (row.destroy, row.destroy_doc)):
            fn = LEGACY[c_name]
            assert CUPY_NAMES[cupy_name(c_name)] == c_name
            assert getattr(cc, c_name) is fn and getattr(cc, cupy_name(c_name)) is fn
            module = __import__(fn.__module__, fromlist=["x"])
            assert getattr(module, cupy_name(c_name)) is fn, c_name  # defined where the class lives
            assert inspect.unwrap(fn).__doc__ == doc and fn.__doc__.startswith(inspect.cleandoc(doc))  # + the reference
            assert "002 §" in doc or c_name == "cudnnCreateLRNDescriptor"  # its docstring gives the defaults
        assert list(inspect.signature(LEGACY[row.create]).parameters) == []
        assert list(inspect.signature(LEGACY[row.destroy]).parameters) == [row.arg]


def test_destroy_rules_for_every_row():
    handle = cc.cudnnCreate()
    for row in _lifecycle.TABLE:
        create, destroy = LEGACY[row.create], LEGACY[row.destroy]
        d = create()
        assert type(d).__name__ == row.create[len("cudnnCreate"):]
        assert destroy(**{row.arg: d}) is None  # keyword: the C header's parameter name
        status, text = _status(destroy, d)
        assert status == BAD_PARAM and "was destroyed" in text and row.arg in text
        status, text = _status(destroy, handle)
        assert status == BAD_PARAM and "is a cudnnHandle_t, not a" in text
        for null in (None, 0, ctypes.c_void_p()):
            if row.null_ok:
                assert destroy(null) is None
            else:
                assert _status(destroy, null)[0] == BAD_PARAM
        assert _status(create, 1)[0] == BAD_PARAM  # Create takes no argument
    cc.cudnnDestroy(handle)


def test_destroy_takes_exactly_its_own_type():
    f, t = cc.cudnnCreateFilterDescriptor(), cc.cudnnCreateTensorDescriptor()
    status, text = _status(cc.cudnnDestroyTensorDescriptor, f)  # FilterDescriptor derives from TensorDescriptor
    assert status == BAD_PARAM and "is a cudnnFilterDescriptor_t, not a cudnnTensorDescriptor_t" in text
    assert _status(cc.cudnnDestroyFilterDescriptor, t)[0] == BAD_PARAM
    cc.cudnnDestroyFilterDescriptor(f)
    cc.cudnnDestroyTensorDescriptor(t)
