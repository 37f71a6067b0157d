"""Every `void *` parameter of every registered function, walked from the signature table
(``_core.registry.CONVERSIONS``, roles from ``_core.data.pointer_role``) on the CPU place (issue 23
items 1, 2 and the torch bfloat16 part of 7; docs/conventions.md "Scalars" and "Data"):

* item 2: every data parameter takes the same forms (a NumPy array, ``ctypes.c_void_p``,
  ``arr.ctypes``, ``__array_interface__``, the buffer protocol, DLPack) with the numbers the array
  gives, and refuses the same ones (a plain int, a library object, a number, a list, device memory)
  with BAD_PARAM naming it and the same key words, before anything is written; the backend API's
  variant pack (data pointers and workspace) too;
* item 1: every pointer to one number (alpha, beta, fills) given as an int of magnitude >= 2^31 is
  BAD_PARAM naming it and saying "host address", nothing written; a small int is still a value;
* torch bfloat16 tensors are BFLOAT16 data through their bits.

Baseline calls: tests/param_calls.py (one valid call per function)."""
from __future__ import annotations

import ctypes
import inspect
import pathlib
import re

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core.data import pointer_role
from cudnn_compat._core.registry import CONVERSIONS, LEGACY
from conftest import tdesc
from param_calls import CALLS

BAD = cc.CUDNN_STATUS_BAD_PARAM
HERE = pathlib.Path(__file__).resolve().parent

# (function, Python parameter, C parameter, role) of every `void *` parameter of every registered function
POINTERS = [(f, p, c, pointer_role(f, c)) for f, m in sorted(CONVERSIONS.items()) for p, (c, k) in m.items()
            if k == "pointer"]
DATA = [(f, p, c) for f, p, c, role in POINTERS if role == "data"]
SCALARS = [(f, p, c) for f, p, c, role in POINTERS if role == "scalar"]


def test_the_table_gives_every_pointer_a_role():
    assert {role for *_, role in POINTERS} == {"data", "scalar", "host ints", "host bytes", "typed", "opaque"}
    assert len(DATA) >= 370 and len(SCALARS) >= 75, (len(DATA), len(SCALARS))
    assert {c for _f, _p, c in SCALARS} == {"alpha", "beta", "alpha1", "alpha2", "alphaDataDiff", "betaDataDiff",
                                            "alphaParamDiff", "betaParamDiff", "alphaDgrid", "betaDgrid", "paddingFill",
                                            "valuePtr"}


def _positions(fn) -> dict:
    return {p: i for i, p in enumerate(inspect.signature(fn).parameters)}


def _run(c_name, replace=None):
    """A fresh baseline call with ``replace`` = (parameter, form(array) -> argument): (error or None,
    outputs before, outputs after, the result)."""
    fn = LEGACY[c_name]
    h = cc.cudnnCreate("cpu")
    args, outputs = CALLS[c_name](h)
    keep = list(args)  # a pointer form does not keep its array alive (as in C): the caller does
    if replace is not None:
        i = _positions(fn)[replace[0]]
        args[i] = replace[1](args[i])
    before = [o.copy() for o in outputs]
    try:
        fn(*args)
        err = None
    except cc.CuDNNError as e:
        err = e
    del keep
    return err, before, outputs


class Iface:
    """A foreign host buffer: ``__array_interface__`` only."""

    def __init__(self, a):
        self.a = a
        self.__array_interface__ = a.__array_interface__


class DeviceArray:
    def __init__(self, a):
        self.__cuda_array_interface__ = {"data": (0xDEAD000, False), "shape": (a.nbytes,), "typestr": "|u1",
                                         "version": 3}


ACCEPTED = {
    "c_void_p": lambda a: ctypes.c_void_p(a.ctypes.data),
    "arr.ctypes": lambda a: a.ctypes,
    "__array_interface__": Iface,
    "memoryview": memoryview,
}
REJECTED = {  # form -> (argument, key words of the message)
    "int": (lambda a: a.ctypes.data, ["ctypes.c_void_p(address)"]),
    "descriptor": (lambda a: tdesc((1, 1, 1, 1)), ["not a data buffer"]),
    "number": (lambda a: 1.5, ["the number", "not a data buffer"]),
    "list": (lambda a: a.tolist(), ["must be a NumPy array", "got list"]),
    "device": (DeviceArray, ["device memory", "CPU place"]),
}
WALKED = sorted({f for f, _p, _c in DATA if f in CALLS})


def _walk(c_name):
    """(parameter, its baseline array) of every data parameter the baseline passes a buffer for."""
    h = cc.cudnnCreate("cpu")
    args, _ = CALLS[c_name](h)
    pos = _positions(LEGACY[c_name])
    return [(p, args[pos[p]]) for f, p, _c in DATA if f == c_name and isinstance(args[pos[p]], np.ndarray)]


def test_the_walk_covers_the_table():
    """Every registered function with a data parameter has a baseline (a new one fails here until
    tests/param_calls.py has its call); the walk reaches every parameter the baselines pass a buffer
    for (the rest are optional ones the baselines leave NULL)."""
    funcs = {f for f, _p, _c in DATA}
    assert not funcs - set(CALLS), sorted(funcs - set(CALLS))
    walked = sum(len(_walk(f)) for f in WALKED)
    assert walked >= 340 and len(WALKED) >= 68, (walked, len(WALKED))


@pytest.mark.parametrize("c_name", WALKED)
def test_every_data_parameter_binds_alike(c_name):
    err, _, want = _run(c_name)
    assert err is None, err
    for p, _arr in _walk(c_name):
        for form, make in ACCEPTED.items():
            err, _, got = _run(c_name, (p, make))
            assert err is None, f"{c_name} {p} as {form}: {err}"
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w, err_msg=f"{c_name} {p} as {form}")
    # the rejected forms share one baseline: a refused call writes nothing, so its buffers stay valid
    fn, pos = LEGACY[c_name], _positions(LEGACY[c_name])
    args, outputs = CALLS[c_name](cc.cudnnCreate("cpu"))
    before = [o.copy() for o in outputs]
    for p, arr in _walk(c_name):
        c_param = CONVERSIONS[c_name][p][0]
        for form, (make, words) in REJECTED.items():
            bad = list(args)
            bad[pos[p]] = make(args[pos[p]])
            with pytest.raises(cc.CuDNNError) as e:
                fn(*bad)
            err = e.value
            assert err.status == BAD, f"{c_name} {p} as {form}: {err}"
            assert err.argument.lower() in (p.lower(), c_param.lower()), f"{c_name} {p} as {form}: {err}"  # workSpace/workspace
            assert all(w in str(err) for w in words), f"{c_name} {p} as {form}: {err}"
            for b, a in zip(before, outputs):
                assert b.tobytes() == a.tobytes(), f"{c_name} {p} as {form}: an output was written ({err})"


def test_weight_space_queries_take_every_form():
    """cudnnGetRNNWeightParams with a ctypes pointer used to raise INTERNAL_ERROR (c_void_p is not
    subscriptable) and took a plain int; now: a pointer in, a pointer out, at the array's offsets."""
    h = cc.cudnnCreate("cpu")
    args, _ = CALLS["cudnnGetRNNWeightParams"](h)
    w = args[4]
    for lid in range(8):
        args[5] = lid
        m, b = cc.cudnnGetRNNWeightParams(*args)
        for form in (ctypes.c_void_p(w.ctypes.data), w.ctypes):
            mp, bp = cc.cudnnGetRNNWeightParams(*args[:4], form, *args[5:])
            assert isinstance(mp, ctypes.c_void_p) and mp.value == m.ctypes.data
            assert bp.value == b.ctypes.data
    args[4] = w.ctypes.data
    with pytest.raises(cc.CuDNNError, match="ctypes.c_void_p") as e:
        cc.cudnnGetRNNWeightParams(*args)
    assert e.value.status == BAD and e.value.argument == "weightSpace"


# -- item 1: pointers to one number -------------------------------------------------------------------

SCALAR_CASES = [(f, p) for f, p, _c in SCALARS if f in CALLS]


def test_the_scalar_walk_covers_the_table():
    assert SCALAR_CASES == [(f, p) for f, p, _c in SCALARS] and len(SCALAR_CASES) >= 75, \
        sorted({f for f, _p, _c in SCALARS} - set(CALLS))


@pytest.mark.parametrize("c_name, param", SCALAR_CASES)
def test_a_host_address_as_an_int_is_bad_param(c_name, param):
    cell = np.array(1.0, np.float32)
    fn = LEGACY[c_name]
    args, outputs = CALLS[c_name](cc.cudnnCreate("cpu"))
    before = [o.copy() for o in outputs]
    for addr in (cell.ctypes.data, 2 ** 31, -2 ** 31, np.int64(2 ** 40)):
        bad = list(args)
        bad[_positions(fn)[param]] = addr
        with pytest.raises(cc.CuDNNError) as e:
            fn(*bad)
        err = e.value
        assert err.status == BAD and err.argument == param, (c_name, param, err)
        assert "host address" in str(err) and "ctypes.c_void_p(addr)" in str(err), err
        for b, a in zip(before, outputs):
            assert b.tobytes() == a.tobytes(), f"{c_name} {param}: an output was written"
    if c_name != "cudnnSetSeqDataDescriptor":  # its paddingFill is NOT_SUPPORTED unless NULL
        for value in (1, 2 ** 31 - 1, ctypes.c_void_p(cell.ctypes.data), cell):
            err, _, _ = _run(c_name, (param, lambda a: value))
            assert err is None, (c_name, param, value, err)


def test_alpha_of_an_address_is_refused_and_a_pointer_reads_it(handle):
    """The issue's call: cudnnActivationForward(h, ad, a.ctypes.data, ...) returned SUCCESS with y = 9.5e13."""
    args, (y,) = CALLS["cudnnActivationForward"](handle)
    a, b = np.array(2.0, np.float32), np.array(0.0, np.float32)
    args[2], args[5] = a.ctypes.data, b.ctypes.data
    with pytest.raises(cc.CuDNNError, match="alpha: is the int .* looks like a host address"):
        cc.cudnnActivationForward(*args)
    assert np.all(y == 7.0)
    args[2], args[5] = ctypes.c_void_p(a.ctypes.data), ctypes.byref(ctypes.c_float(0.0))
    cc.cudnnActivationForward(*args)
    np.testing.assert_array_equal(y, 2.0 * np.maximum(args[4], 0))


def test_backend_float_attributes_and_fused_scalars_refuse_addresses():
    pw = cc.cudnnBackendCreateDescriptor(cc.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
    cell = np.array([2.0], np.float32)
    with pytest.raises(cc.CuDNNError, match="host address") as e:
        cc.cudnnBackendSetAttribute(pw, cc.CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, cc.CUDNN_TYPE_FLOAT, 1, cell.ctypes.data)
    assert e.value.status == BAD and "ALPHA1" in str(e.value)
    cc.cudnnBackendSetAttribute(pw, cc.CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, cc.CUDNN_TYPE_FLOAT, 1, 2)  # a value
    vp = cc.cudnnCreateFusedOpsVariantParamPack(cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_TRAINING)
    with pytest.raises(cc.CuDNNError, match="host address") as e:
        cc.cudnnSetFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_DOUBLE_BN_EPSILON, cell.ctypes.data)
    assert e.value.status == BAD
    # integer C parameters are not values through a pointer: a large size stays a size
    cc.cudnnSetFusedOpsVariantParamPackAttribute(vp, cc.CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES, 2 ** 40)


def test_porting_guide_example_one_runs():
    """docs/porting.md's first worked example, as written, gives the convolution's numbers."""
    text = (HERE.parent / "docs" / "porting.md").read_text()
    section = text.split("## Worked example 1", 1)[1].split("## Worked example 2", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert ".ctypes.data" not in code.replace("ctypes.c_void_p(alpha.ctypes.data)", "")
    ns: dict = {}
    exec(compile(code, "docs/porting.md", "exec"), ns)
    x, w, y = ns["x"], ns["w"], ns["y"]
    want = np.zeros_like(y)
    for k in range(want.shape[1]):
        for i in range(want.shape[2]):
            for j in range(want.shape[3]):
                want[:, k, i, j] = np.einsum("ncij,cij->n", x[:, :, i:i + 3, j:j + 3], w[k])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


# -- the backend API's variant pack ------------------------------------------------------------------

def _pointwise_plan(h):
    from test_backend_api import graph, plan_for, pointwise, tensor
    x, y = tensor(1, (1, 4, 1, 1)), tensor(2, (1, 4, 1, 1))
    return plan_for(h, graph(h, [pointwise(cc.CUDNN_POINTWISE_RELU_FWD, x, y)]))


def _pack_execute(h, plan, xa, ya, ws=None):
    from test_backend_api import execute
    execute(h, plan, {1: xa, 2: ya}, ws)


def test_variant_pack_pointers_bind_alike(handle):
    plan = _pointwise_plan(handle)
    src = np.array([1.5, -2.0, 3.0, -4.0], np.float32)
    for form, make in ACCEPTED.items():
        y = np.full(4, 7.0, np.float32)
        _pack_execute(handle, plan, make(src.copy()), make(y) if form != "ndarray" else y)
        np.testing.assert_array_equal(y, np.maximum(src, 0), err_msg=form)
    for form, (make, words) in REJECTED.items():
        for slot in ("x", "y", "workspace"):
            y = np.full(4, 7.0, np.float32)
            args = {"x": src, "y": y, "workspace": None}
            args[slot] = make(np.zeros(4, np.float32))
            with pytest.raises(cc.CuDNNError) as e:
                _pack_execute(handle, plan, args["x"], args["y"], args["workspace"])
            assert e.value.status == BAD and "VARIANT_PACK" in e.value.argument, (form, slot, e.value)
            if slot != "workspace" or form not in ("number",):
                assert all(w in str(e.value) for w in words), (form, slot, e.value)
            assert np.all(y == 7.0)


# -- torch bfloat16 (item 7) ----------------------------------------------------------------------------

def test_torch_bfloat16_is_bfloat16_data(handle):
    torch = pytest.importorskip("torch")
    d = tdesc((1, 1, 2, 2), cc.CUDNN_DATA_BFLOAT16)
    x = torch.tensor([1.5, -2.0, 3.25, -0.5], dtype=torch.bfloat16)
    y = torch.full((4,), 7.0, dtype=torch.bfloat16)
    args, _ = CALLS["cudnnActivationForward"](handle)
    cc.cudnnActivationForward(handle, args[1], 1.0, d, x, 0.0, d, y)
    assert y.tolist() == [1.5, 0.0, 3.25, 0.0]
    f = tdesc((1, 1, 2, 2))
    try:  # messages name bfloat16 with ml_dtypes installed, its uint16 bits without (pyproject.toml)
        import ml_dtypes  # noqa: F401
        name = "bfloat16"
    except ImportError:
        name = "uint16"
    with pytest.raises(cc.CuDNNError, match=f"x: array dtype {name} does not match .* CUDNN_DATA_FLOAT") as e:
        cc.cudnnActivationForward(handle, args[1], 1.0, f, x, 0.0, f, np.zeros(4, np.float32))
    assert e.value.status == BAD


# -- the fused-ops variant pack --------------------------------------------------------------------------

def _fused_inference(h, pointers):
    from test_fused_ops import ELEM, SPATIAL as FSPATIAL, execute
    pd = tdesc((1, 4, 1, 1))
    settings = dict(BN_MODE=FSPATIAL, BN_SCALEBIAS_MEANVAR_DESC=pd, BN_SCALE_PLACEHOLDER=ELEM, BN_BIAS_PLACEHOLDER=ELEM,
                    BN_RUNNING_MEAN_PLACEHOLDER=ELEM, BN_RUNNING_VAR_PLACEHOLDER=ELEM, BN_EQSCALEBIAS_DESC=pd,
                    BN_EQSCALE_PLACEHOLDER=ELEM, BN_EQBIAS_PLACEHOLDER=ELEM)
    execute(h, cc.CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE, settings, pointers, dict(DOUBLE_BN_EPSILON=1e-4))


def _fused_buffers():
    ins = {k: np.random.default_rng(i).random(4).astype(np.float32) + 0.1
           for i, k in enumerate(("BN_SCALE", "BN_BIAS", "BN_RUNNING_MEAN", "BN_RUNNING_VAR"))}
    return dict(ins, BN_EQSCALE=np.full(4, 7.0, np.float32), BN_EQBIAS=np.full(4, 7.0, np.float32))


def test_fused_ops_variant_pointers_bind_alike(handle):
    """Each CUDNN_PTR_* of a fused-ops variant pack, bound at cudnnFusedOpsExecute: the same forms and errors."""
    want = _fused_buffers()
    _fused_inference(handle, want)
    for label in want:
        for form, make in ACCEPTED.items():
            bufs = _fused_buffers()
            _fused_inference(handle, dict(bufs, **{label: make(bufs[label])}))
            for k in ("BN_EQSCALE", "BN_EQBIAS"):
                np.testing.assert_array_equal(bufs[k], want[k], err_msg=f"{label} as {form}")
        for form, (make, words) in REJECTED.items():
            bufs = _fused_buffers()
            with pytest.raises(cc.CuDNNError) as e:
                _fused_inference(handle, dict(bufs, **{label: make(bufs[label])}))
            assert e.value.status == BAD and e.value.argument == "CUDNN_PTR_" + label, (label, form, e.value)
            assert all(w in str(e.value) for w in words), (label, form, e.value)
            assert np.all(bufs["BN_EQSCALE"] == 7.0) and np.all(bufs["BN_EQBIAS"] == 7.0), (label, form)
