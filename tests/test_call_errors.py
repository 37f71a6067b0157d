"""Python-level call mistakes (issue 23 item 6): a call that does not fit a legacy function's Python
signature raises ``CuDNNArgumentError`` -- status BAD_PARAM, a ``CuDNNError`` and a ``TypeError`` --
whose message names the unknown keyword (or says how many arguments were expected) and shows the
signature.  Walked over every registered function, enumerated from the registry."""
import inspect
import pickle

import pytest

import cudnn_compat as cc
from cudnn_compat._core.registry import LEGACY

BAD = cc.CUDNN_STATUS_BAD_PARAM
FUNCTIONS = sorted(LEGACY)


def _params(c_name):
    return inspect.signature(inspect.unwrap(LEGACY[c_name])).parameters


def _raises(fn, *args, **kwargs) -> cc.CuDNNArgumentError:
    with pytest.raises(TypeError) as e:  # catchable as Python's own call error ...
        fn(*args, **kwargs)
    err = e.value
    assert isinstance(err, cc.CuDNNError) and type(err) is cc.CuDNNArgumentError, repr(err)  # ... and as cuDNN's
    assert err.status == BAD and err.argument == "arguments", err
    return err


def _shows_signature(c_name, err):
    """The message shows ``c_name(p1, p2, ...)`` with every named parameter of the function."""
    text = str(err)
    assert f"{c_name}(" in text.split("signature is", 1)[-1], text
    for name, p in _params(c_name).items():
        assert p.kind is p.VAR_POSITIONAL or name in text, (name, text)


def test_the_error_class():
    assert issubclass(cc.CuDNNArgumentError, cc.CuDNNError) and issubclass(cc.CuDNNArgumentError, TypeError)
    err = cc.CuDNNArgumentError(BAD, "arguments", "unknown keyword argument 'width'", "cudnnX")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cc.CuDNNArgumentError and str(back) == str(err) == \
        "CUDNN_STATUS_BAD_PARAM: cudnnX: arguments: unknown keyword argument 'width'"


@pytest.mark.parametrize("c_name", FUNCTIONS)
def test_unknown_keyword_is_named(c_name):
    err = _raises(LEGACY[c_name], zzNotAParameter=4)
    assert "unknown keyword argument 'zzNotAParameter'" in str(err), err
    _shows_signature(c_name, err)


@pytest.mark.parametrize("c_name", FUNCTIONS)
def test_too_many_positional_arguments(c_name):
    params = _params(c_name)
    n = 10 if c_name == "cudnnSetRNNDescriptor" else len(params)  # *args: 8 or 10
    err = _raises(LEGACY[c_name], *[0] * (n + 1))
    assert f"but {n + 1} w" in str(err), err  # "takes N ... but N+1 were given"
    _shows_signature(c_name, err)


@pytest.mark.parametrize("c_name", [c for c in FUNCTIONS
                                    if any(p.default is p.empty for p in _params(c).values())])
def test_too_few_arguments(c_name):
    err = _raises(LEGACY[c_name])
    if c_name == "cudnnSetRNNDescriptor":
        assert "but 0 were given" in str(err), err
    else:
        required = [n for n, p in _params(c_name).items() if p.default is p.empty]
        assert f"missing {len(required)} required argument" in str(err), err
        for name in required:
            assert repr(name) in str(err).split(";")[0], (name, err)
    _shows_signature(c_name, err)


def test_the_issue_example():
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 5, 6, 7, 8)
    try:
        err = _raises(cc.cudnnSetTensor4dDescriptor, d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 2, 3, width=4)
        assert str(err) == ("CUDNN_STATUS_BAD_PARAM: cudnnSetTensor4dDescriptor: arguments: unknown keyword "
                            "argument 'width'; the signature is cudnnSetTensor4dDescriptor(tensorDesc, format, "
                            "dataType, n, c, h, w)")
        err = _raises(cc.cudnnSetTensor4dDescriptor, d, 0, 0, 1, 2, 3, 4, hh=4)  # a near miss gets a hint
        assert "'hh' (did you mean 'h'?)" in str(err), err
        err = _raises(cc.cudnnSetTensor4dDescriptor, d, 0, 0, 1, 2, 3, n=4)
        assert "multiple values for argument 'n'" in str(err), err
        assert cc.cudnnGetTensor4dDescriptor(d)[:5] == (cc.CUDNN_DATA_FLOAT, 5, 6, 7, 8)  # nothing written
    finally:
        cc.cudnnDestroyTensorDescriptor(d)

