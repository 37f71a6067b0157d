"""One argument-conversion layer for every C parameter type (issue 13 items 3 and 4).

``_core.registry.legacy`` converts each legacy function's number and int-array arguments by the C type
of the parameter, from ``_core.signatures.SIGNATURES`` (generated from the cuDNN headers by
tools/gen_signatures.py):

  * the table: every registered function has its C parameters, every Python parameter maps to
    one, the checked-in table is what the headers give (when they are at hand);
  * the rule, probed broadly: for every int / enum / size_t / double / int[] parameter of 30
    functions, fractions, strings, None, complex, bools for enums and values out of the C type's
    range are BAD_PARAM naming the argument and leave the descriptor as it was; NumPy integers,
    0-d integer arrays (and integral floats for non-enum ints) are accepted and stored as the
    plain int a Get* counterpart returns;
  * the bare Python exceptions the issue lists are CuDNNError with the right status, and the
    safety net turns any other TypeError/ValueError/... into INTERNAL_ERROR naming the function;
  * a sweep calls every registered function with each argument replaced by a string, None, 1.5,
    -1, 2**63, an object, a list, a complex and NaN on a CPU handle (in a subprocess, in case
    anything crashes): only CuDNNError escapes, and never INTERNAL_ERROR;
  * plain ints and floats take the fast path (no converter runs); its host cost is measured by
    benchmarks/host_overhead.py, never asserted in a test.
"""
from __future__ import annotations

import inspect
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core import registry as reg
from cudnn_compat._core.signatures import SIGNATURES

ROOT = pathlib.Path(__file__).resolve().parent.parent
BAD, INTERNAL = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_INTERNAL_ERROR
F32, F64, NCHW, NHWC = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC
NUMBER_KINDS = ("int", "int64", "uint32", "uint64", "size_t", "double", "float", "int[]", "uint32[]")


def kind_of(c_name: str, param: str) -> "str | None":
    return reg.CONVERSIONS[c_name][param][1]


def family(kind: str) -> str:
    return "enum" if kind.startswith("enum:") else kind


# -- the table ----------------------------------------------------------------------------------

KINDS = set(NUMBER_KINDS) | {"handle", "pointer", "opaque", "out"}

# C parameters a Python function does not take: pointers whose value it returns instead
RETURNED_POINTERS = {
    ("cudnnGetFusedOpsVariantParamPackAttribute", "ptr"): "the attribute is returned",
    ("cudnnGetRNNDataDescriptor", "paddingFill"): "returned as the last tuple entry",
    ("cudnnGetSeqDataDescriptor", "paddingFill"): "returned as the last tuple entry",
}


def test_every_kind_is_in_the_closed_set():
    bad = {(fn, p, k) for fn, params in SIGNATURES.items() for p, k in params
           if k not in KINDS and not k.startswith(("enum:", "desc:", "desc[]:"))}
    assert not bad, sorted(bad)[:20]


def test_every_registered_function_has_a_signature():
    missing = [n for n in cc.LEGACY if n not in SIGNATURES and n not in reg.NO_CONVERSION]
    assert not missing, (f"no C signature for {missing}: add the header (tools/gen_signatures.py) or an alias "
                         f"(ALIASES there), or list it in _registry.NO_CONVERSION with the reason")
    assert all(reason for reason in reg.NO_CONVERSION.values())
    assert set(reg.NO_CONVERSION) <= set(cc.LEGACY)


def test_every_python_parameter_maps_to_its_c_parameter():
    """By name (case ignored) or through _registry.PARAM_ALIASES; Python-only ones are listed."""
    unmatched, dropped, order = [], [], []
    for c_name, fn in cc.LEGACY.items():
        matched = reg.match_parameters(c_name, inspect.unwrap(fn))
        if matched is None:
            continue
        for p, (c_param, kind) in matched.items():
            if c_param is None and (c_name, p) not in reg.PYTHON_ONLY:
                unmatched.append(f"{c_name}: Python parameter {p!r} has no C counterpart")
        taken = {c for c, _ in matched.values() if c}
        for c_param, kind in SIGNATURES[c_name]:
            if kind != "out" and c_param not in taken and (c_name, c_param) not in RETURNED_POINTERS:
                dropped.append(f"{c_name}: C parameter {c_param!r} ({kind}) is not a Python parameter")
        c_order = [n for n, _ in SIGNATURES[c_name]]
        idx = [c_order.index(c) for c, _ in matched.values() if c]
        if idx != sorted(idx):
            order.append(f"{c_name}: Python parameters map to C parameters out of order {idx}")
    assert not unmatched + dropped + order, "\n".join(unmatched + dropped + order)


def test_alias_and_python_only_tables_are_not_stale():
    stale = []
    for c_name, aliases in reg.PARAM_ALIASES.items():
        params = inspect.signature(inspect.unwrap(cc.LEGACY[c_name])).parameters
        c_params = {n for n, _ in SIGNATURES[c_name]}
        stale += [f"{c_name}.{p} -> {c}" for p, c in aliases.items() if p not in params or c not in c_params]
    for (c_name, p) in reg.PYTHON_ONLY:
        if p not in inspect.signature(inspect.unwrap(cc.LEGACY[c_name])).parameters:
            stale.append(f"PYTHON_ONLY {c_name}.{p}")
    assert not stale, stale


def test_table_matches_the_headers():
    """tools/gen_signatures.py over the cuDNN 9 / 8.9 headers gives the checked-in table."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_signatures
    finally:
        sys.path.pop(0)
    v9, v8 = gen_signatures.DEFAULT_V9, gen_signatures.DEFAULT_V8
    if not (gen_signatures.header_files(v9) and gen_signatures.header_files(v8)):
        pytest.skip(f"cuDNN headers not found in {v9} / {v8} (set CUDNN_HEADERS_V9 / CUDNN_HEADERS_V8)")
    assert gen_signatures.generate(v9, v8) == (ROOT / "cudnn_compat" / "_core" / "signatures.py").read_text(), \
        "cudnn_compat/_core/signatures.py is stale: run python tools/gen_signatures.py"


def test_header_facts_the_converters_rely_on():
    sig = dict(SIGNATURES["cudnnSetConvolution2dDescriptor"])
    assert sig["pad_h"] == "int" and sig["mode"] == "enum:cudnnConvolutionMode_t"
    assert dict(SIGNATURES["cudnnSetDropoutDescriptor"])["seed"] == "uint64"
    assert dict(SIGNATURES["cudnnConvolutionForward"])["workSpaceSizeInBytes"] == "size_t"
    assert dict(SIGNATURES["cudnnSetConvolutionNdDescriptor"])["padA"] == "int[]"
    assert dict(SIGNATURES["cudnnGetTensorNdDescriptor"])["dimA"] == "out"
    assert dict(SIGNATURES["cudnnRNNForwardTraining"])["xDesc"] == "desc[]:cudnnTensorDescriptor_t"  # cuDNN 8 header
    assert dict(SIGNATURES["cudnnGetConvolutionForwardAlgorithm"])["memoryLimitInBytes"] == "size_t"  # cuDNN 7


# -- the rule, probed over many functions and argument positions --------------------------------

def _h():
    return cc.cudnnCreate("cpu")


def _tensor(shape=(2, 3, 4, 5)):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, NCHW, F32, *shape)
    return d


def _filter():
    d = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(d, F32, NCHW, 2, 3, 3, 3)
    return d


def _dropout(h):
    d = cc.cudnnCreateDropoutDescriptor()
    n = cc.cudnnDropoutGetStatesSize(h)
    cc.cudnnSetDropoutDescriptor(d, h, 0.0, np.zeros(n, np.uint8), n, 1)
    return d


def _conv_forward():
    h, x, w, y = _h(), _tensor((1, 3, 5, 5)), _filter(), _tensor((1, 2, 5, 5))
    c = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(c, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    xs, ws = np.linspace(-1, 1, 75, dtype=np.float32), np.linspace(1, -1, 54, dtype=np.float32)
    return [h, 1.0, x, xs, w, ws, c, cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, None, 0, 0.0, y,
            np.zeros(50, np.float32)]


def _softmax():
    x = _tensor((2, 3, 1, 1))
    return [_h(), cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, x,
            np.arange(6, dtype=np.float32), 0.0, x, np.zeros(6, np.float32)]


def _rnn8():
    return [cc.cudnnCreateRNNDescriptor(), cc.CUDNN_RNN_ALGO_STANDARD, cc.CUDNN_LSTM, cc.CUDNN_RNN_DOUBLE_BIAS,
            cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_LINEAR_INPUT, F32, F32, cc.CUDNN_DEFAULT_MATH, 4, 6, 6, 2, None,
            cc.CUDNN_RNN_PADDED_IO_DISABLED]


def _attn():
    return [cc.cudnnCreateAttnDescriptor(), cc.CUDNN_ATTN_QUERYMAP_ALL_TO_ONE, 2, 0.5, F32, F32,
            cc.CUDNN_DEFAULT_MATH, None, None, 8, 8, 8, 4, 4, 4, 4, 5, 6, 3, 1]


def _ret(a, r):
    return r


def _get(getter, *extra):
    return lambda a, r: getter(a[0], *extra)


# function -> (fresh baseline arguments, observe(args, result) -> what the call stored or returned)
CASES = {
    "cudnnSetTensor4dDescriptor": (lambda: [cc.cudnnCreateTensorDescriptor(), NCHW, F32, 2, 3, 4, 5],
                                   _get(cc.cudnnGetTensor4dDescriptor)),
    "cudnnSetTensor4dDescriptorEx": (lambda: [cc.cudnnCreateTensorDescriptor(), F64, 2, 3, 4, 5, 64, 20, 5, 1],
                                     _get(cc.cudnnGetTensor4dDescriptor)),
    "cudnnSetTensorNdDescriptor": (lambda: [cc.cudnnCreateTensorDescriptor(), F32, 4, [2, 3, 4, 5], [60, 20, 5, 1]],
                                   _get(cc.cudnnGetTensorNdDescriptor)),
    "cudnnSetTensorNdDescriptorEx": (lambda: [cc.cudnnCreateTensorDescriptor(), NHWC, F32, 4, [2, 3, 4, 5]],
                                     _get(cc.cudnnGetTensorNdDescriptor)),
    "cudnnGetTensorNdDescriptor": (lambda: [_tensor(), 3], _ret),
    "cudnnSetFilter4dDescriptor": (lambda: [cc.cudnnCreateFilterDescriptor(), F32, NHWC, 4, 3, 2, 2],
                                   _get(cc.cudnnGetFilter4dDescriptor)),
    "cudnnSetFilterNdDescriptor": (lambda: [cc.cudnnCreateFilterDescriptor(), F64, NCHW, 5, [4, 3, 2, 2, 2]],
                                   _get(cc.cudnnGetFilterNdDescriptor)),
    "cudnnSetConvolution2dDescriptor": (lambda: [cc.cudnnCreateConvolutionDescriptor(), 1, 2, 3, 1, 2, 1,
                                                 cc.CUDNN_CONVOLUTION, F32], _get(cc.cudnnGetConvolution2dDescriptor)),
    "cudnnSetConvolutionNdDescriptor": (lambda: [cc.cudnnCreateConvolutionDescriptor(), 3, [0, 1, 2], [1, 2, 3],
                                                 [2, 1, 1], cc.CUDNN_CROSS_CORRELATION, F64],
                                        _get(cc.cudnnGetConvolutionNdDescriptor, 3)),
    "cudnnGetConvolutionNdDescriptor": (lambda: [_conv_forward()[6], 2], _ret),
    "cudnnSetConvolutionGroupCount": (lambda: [cc.cudnnCreateConvolutionDescriptor(), 3],
                                      _get(cc.cudnnGetConvolutionGroupCount)),
    "cudnnSetConvolutionMathType": (lambda: [cc.cudnnCreateConvolutionDescriptor(), cc.CUDNN_TENSOR_OP_MATH],
                                    _get(cc.cudnnGetConvolutionMathType)),
    "cudnnGetConvolutionNdForwardOutputDim": (lambda: [_conv_forward()[6], _tensor((1, 3, 5, 5)), _filter(), 4], _ret),
    "cudnnGetConvolutionForwardWorkspaceSize": (lambda: [_h(), _tensor((1, 3, 5, 5)), _filter(), _conv_forward()[6],
                                                         _tensor((1, 2, 5, 5)), cc.CUDNN_CONVOLUTION_FWD_ALGO_GEMM], _ret),
    "cudnnConvolutionForward": (_conv_forward, lambda a, r: a[-1].tolist()),
    "cudnnSetPooling2dDescriptor": (lambda: [cc.cudnnCreatePoolingDescriptor(), cc.CUDNN_POOLING_MAX,
                                             cc.CUDNN_PROPAGATE_NAN, 3, 2, 1, 0, 2, 1],
                                    _get(cc.cudnnGetPooling2dDescriptor)),
    "cudnnSetPoolingNdDescriptor": (lambda: [cc.cudnnCreatePoolingDescriptor(), cc.CUDNN_POOLING_MAX,
                                             cc.CUDNN_NOT_PROPAGATE_NAN, 3, [2, 3, 2], [0, 1, 1], [1, 2, 2]],
                                    _get(cc.cudnnGetPoolingNdDescriptor, 3)),
    "cudnnSetActivationDescriptor": (lambda: [cc.cudnnCreateActivationDescriptor(), cc.CUDNN_ACTIVATION_CLIPPED_RELU,
                                              cc.CUDNN_PROPAGATE_NAN, 6.0], _get(cc.cudnnGetActivationDescriptor)),
    "cudnnSetLRNDescriptor": (lambda: [cc.cudnnCreateLRNDescriptor(), 5, 1e-4, 0.75, 2.0], _get(cc.cudnnGetLRNDescriptor)),
    "cudnnSetOpTensorDescriptor": (lambda: [cc.cudnnCreateOpTensorDescriptor(), cc.CUDNN_OP_TENSOR_MUL, F32,
                                            cc.CUDNN_NOT_PROPAGATE_NAN], _get(cc.cudnnGetOpTensorDescriptor)),
    "cudnnSetReduceTensorDescriptor": (lambda: [cc.cudnnCreateReduceTensorDescriptor(), cc.CUDNN_REDUCE_TENSOR_MAX, F32,
                                                cc.CUDNN_NOT_PROPAGATE_NAN, cc.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES,
                                                cc.CUDNN_32BIT_INDICES], _get(cc.cudnnGetReduceTensorDescriptor)),
    "cudnnSetSpatialTransformerNdDescriptor": (lambda: [cc.cudnnCreateSpatialTransformerDescriptor(),
                                                        cc.CUDNN_SAMPLER_BILINEAR, F32, 4, [1, 2, 3, 4]], None),
    "cudnnSetTensorTransformDescriptor": (lambda: [cc.cudnnCreateTensorTransformDescriptor(), 4, NHWC, [0, 0, 1, 1],
                                                   [0, 0, 1, 1], [1, 1], cc.CUDNN_TRANSFORM_FOLD],
                                          _get(cc.cudnnGetTensorTransformDescriptor, 4)),
    "cudnnSetDropoutDescriptor": (lambda: (lambda h: [cc.cudnnCreateDropoutDescriptor(), h, 0.25,
                                                      np.zeros(cc.cudnnDropoutGetStatesSize(h), np.uint8),
                                                      cc.cudnnDropoutGetStatesSize(h), 7])(_h()),
                                  lambda a, r: (lambda g: (g[0], g[2]))(cc.cudnnGetDropoutDescriptor(a[0], a[1]))),
    "cudnnSetCTCLossDescriptor_v8": (lambda: [cc.cudnnCreateCTCLossDescriptor(), F32,
                                              cc.CUDNN_LOSS_NORMALIZATION_SOFTMAX, cc.CUDNN_PROPAGATE_NAN, 9],
                                     _get(cc.cudnnGetCTCLossDescriptor_v8)),
    "cudnnSetRNNDescriptor_v8": (_rnn8, _get(cc.cudnnGetRNNDescriptor_v8)),
    "cudnnSetRNNDataDescriptor": (lambda: [cc.cudnnCreateRNNDataDescriptor(), F32,
                                           cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, 5, 3, 2, [5, 1, 3], None],
                                  _get(cc.cudnnGetRNNDataDescriptor, 3)),
    "cudnnSetAttnDescriptor": (_attn, _get(cc.cudnnGetAttnDescriptor)),
    "cudnnSoftmaxForward": (_softmax, lambda a, r: a[-1].tolist()),
    "cudnnGetErrorString": (lambda: [cc.CUDNN_STATUS_NOT_SUPPORTED], _ret),
}

BAD_VALUES = {
    "int": [1.5, -0.5, "2", None, 2 ** 31, -2 ** 31 - 1, 2 ** 63, 1 + 2j, [1], float("nan"), np.float64(2.5)],
    "int64": [1.5, "2", None, 2 ** 63, 1j],
    "uint32": [-1, 2 ** 32, 1.5, "2", None, 1j],
    "uint64": [-1, 2 ** 64, 1.5, "7", None, 1j],
    "size_t": [-1, 2 ** 64, 1.5, "abc", None, 1j, b"0"],
    "enum": [0.9, 1.5, 1.0, "2", None, True, np.bool_(False), 2 ** 31, 2 ** 63, 1j, np.float32(1)],
    "double": ["x", "1.0", None, 1j, [1.0], np.complex128(1)],
    "float": ["x", None, 1j, 1e39, -1e39],
    "int[]": ["abc", [1, 1.5], [1, None], [1, "2"], [2 ** 31, 1], [1, -2 ** 31 - 1], 5000, 1.5, object(),
              np.array([1.0, 2.5]), np.array([2 ** 40, 1])],
    "uint32[]": [[1, -1], [1, 2 ** 32], "ab", [0.5, 1], 7],
}


def _probes():
    out = []
    for c_name in CASES:
        for p, (_, kind) in reg.CONVERSIONS[c_name].items():
            if kind and (family(kind) in BAD_VALUES):
                out.append((c_name, p))
    return out


PROBES = _probes()


def _index(c_name, p):
    return list(inspect.signature(inspect.unwrap(cc.LEGACY[c_name])).parameters).index(p)


def test_the_probe_covers_the_class():
    """At least 15 functions and every number kind, over many argument positions."""
    fns = {c for c, _ in PROBES}
    kinds = {family(kind_of(c, p)) for c, p in PROBES}
    assert len(fns) >= 25 and len(PROBES) >= 120, (len(fns), len(PROBES))
    assert {"int", "enum", "size_t", "double", "float", "uint32", "uint64", "int[]", "uint32[]"} <= kinds


@pytest.mark.parametrize("c_name", list(CASES))
def test_baseline_calls_succeed(c_name):
    make, observe = CASES[c_name]
    args = make()
    r = cc.LEGACY[c_name](*args)
    if observe:
        observe(args, r)


@pytest.mark.parametrize("c_name,param", PROBES, ids=[f"{c}-{p}" for c, p in PROBES])
def test_bad_values_are_bad_param_naming_the_argument(c_name, param):
    make, observe = CASES[c_name]
    fn, i, kind = cc.LEGACY[c_name], _index(c_name, param), kind_of(c_name, param)
    args = make()
    r = fn(*args)
    before = observe(args, r) if observe else None
    wrong = []
    for bad in BAD_VALUES[family(kind)]:
        call = list(args)
        call[i] = bad
        for how in ("positional", "keyword"):
            try:
                if how == "positional":
                    fn(*call)
                else:
                    fn(*call[:i], **{param: bad}, **dict(zip(list(inspect.signature(fn).parameters)[i + 1:], call[i + 1:])))
            except cc.CuDNNError as e:
                if e.status != BAD or e.argument != param or e.function != c_name:
                    wrong.append(f"{bad!r} ({how}): {e.status_name} {e.function}: {e.argument}: {e.rule}")
            else:
                wrong.append(f"{bad!r} ({how}) was accepted")
        if observe and c_name.startswith("cudnnSet"):
            now = observe(args, None)
            if now != before:
                wrong.append(f"{bad!r}: a refused call changed the descriptor: {before} -> {now}")
    assert not wrong, f"{c_name} {param} ({kind}):\n" + "\n".join(wrong)


def _accepted_spellings(kind, v):
    """Other spellings of the plain value ``v`` that must mean exactly ``v``."""
    fam = family(kind)
    if fam in ("int", "int64", "uint32", "uint64", "size_t", "enum"):
        out = [np.int32(v), np.int64(v), np.array(v), np.array(v, np.int16)]
        if 0 <= v < 256:
            out += [np.uint8(v), np.uint64(v)]
        if fam != "enum":
            out += [float(v), np.float64(v)]  # integral floats: CuPy 13 (Cython 3.0) took them too
            if v in (0, 1):
                out.append(bool(v))
        return out
    if fam in ("double", "float"):
        out = [np.float64(v), np.array(v), np.float32(v)] if float(np.float32(v)) == v else [np.float64(v), np.array(v)]
        return out + ([int(v), np.int64(v)] if float(v).is_integer() else [])
    if fam in ("int[]", "uint32[]"):
        return [tuple(v), np.array(v, np.int32), np.array(v, np.int64), [np.int64(x) for x in v],
                np.array(v, np.float64), iter(v)]
    return []


@pytest.mark.parametrize("c_name,param", PROBES, ids=[f"{c}-{p}" for c, p in PROBES])
def test_numpy_integers_and_0d_arrays_are_accepted(c_name, param):
    """Stored as the plain value: the Get* counterpart (or the result) equals the baseline's."""
    make, observe = CASES[c_name]
    fn, i, kind = cc.LEGACY[c_name], _index(c_name, param), kind_of(c_name, param)
    args = make()
    want = observe(args, fn(*args)) if observe else None
    v = args[i]
    if v is None:
        pytest.skip("NULL baseline")
    wrong = []
    for other in _accepted_spellings(kind, v):
        call = make()
        call[i] = other
        try:
            r = fn(*call)
        except cc.CuDNNError as e:
            wrong.append(f"{type(other).__name__} {other!r}: {e}")
            continue
        if observe:
            got = observe(call, r)
            if got != want or repr(got) != repr(want):  # repr: np.int64(3) != 3 there
                wrong.append(f"{type(other).__name__} {other!r}: got {got!r}, want {want!r}")
    assert not wrong, f"{c_name} {param} ({kind}):\n" + "\n".join(wrong)


def test_normalised_values_reach_the_function_as_plain_python_numbers():
    seen = {}

    def probe(a, b, c, d):
        seen.update(a=a, b=b, c=c, d=d)

    SIGNATURES["cudnnZzProbe"] = (("a", "int"), ("b", "enum:cudnnDataType_t"), ("c", "double"), ("d", "int[]"))
    try:
        f = reg.legacy("cudnnZzProbe")(probe)
        f(np.int64(3), np.array(2), np.float32(0.5), np.array([1, 2], np.uint8))
        assert seen == {"a": 3, "b": 2, "c": 0.5, "d": [1, 2]}
        assert [type(seen[k]) for k in "abc"] == [int, int, float] and all(type(x) is int for x in seen["d"])
        f(a=7.0, b=1, c=2, d=(4,))
        assert (seen["a"], type(seen["a"]), seen["c"], type(seen["c"]), seen["d"]) == (7, int, 2.0, float, [4])
    finally:
        _unregister("cudnnZzProbe")


# -- the issue's examples and its list of bare exceptions ----------------------------------------

def _status(fn, *args):
    try:
        fn(*args)
    except cc.CuDNNError as e:
        return e.status, e.argument
    return None


def test_issue_item_3_examples():
    cd = cc.cudnnCreateConvolutionDescriptor()
    assert _status(cc.cudnnSetConvolution2dDescriptor, cd, 1.7, 0, 1, 1, 1, 1, 1, F32) == (BAD, "pad_h")
    td = cc.cudnnCreateTensorDescriptor()
    assert _status(cc.cudnnSetTensor4dDescriptor, td, NCHW, 0.9, 1, 1, 1, 1) == (BAD, "dataType")
    assert _status(cc.cudnnSetTensor4dDescriptor, td, NCHW, "2", 1, 1, 1, 1) == (BAD, "dataType")
    ad = cc.cudnnCreateActivationDescriptor()
    assert _status(cc.cudnnSetActivationDescriptor, ad, 1.5, 0, 0.0) == (BAD, "mode")
    assert _status(cc.cudnnSetConvolution2dDescriptor, cd, 2 ** 63, 0, 1, 1, 1, 1, 1, F32) == (BAD, "pad_h")
    assert _status(cc.cudnnSetConvolutionNdDescriptor, cd, 2, [2 ** 63, 0], [1, 1], [1, 1], 1, F32) == (BAD, "padA")
    cc.cudnnSetConvolutionNdDescriptor(cd, np.int64(2), [1, 0], [1, 1], [1, 1], 1, F32)  # np.int64 arrayLength
    cc.cudnnSetConvolutionGroupCount(cd, np.int32(1))  # np.int32 groupCount
    assert cc.cudnnGetConvolutionNdForwardOutputDim(cd, _tensor((1, 3, 5, 5)), _filter(), 4) == [1, 2, 5, 3]


def test_issue_item_4_bare_exceptions_are_bad_param_for_the_right_reason(handle):
    h = handle
    cd, pd, dd = cc.cudnnCreateConvolutionDescriptor(), cc.cudnnCreatePoolingDescriptor(), cc.cudnnCreateDropoutDescriptor()
    n = cc.cudnnDropoutGetStatesSize(h)
    states = np.zeros(n, np.uint8)
    cc.cudnnSetDropoutDescriptor(dd, h, 0.5, states, n, 1)
    x = _tensor((1, 2, 4, 4))
    xs, ys = np.ones(32, np.float32), np.zeros(32, np.float32)
    conv = _conv_forward()
    cases = [
        ((cc.cudnnSetConvolution2dDescriptor, cd, "1", 0, 1, 1, 1, 1, 1, F32), "pad_h"),
        ((cc.cudnnSetConvolution2dDescriptor, cd, None, 0, 1, 1, 1, 1, 1, F32), "pad_h"),
        ((cc.cudnnSetConvolutionNdDescriptor, cd, None, [0, 0], [1, 1], [1, 1], 1, F32), "arrayLength"),
        ((cc.cudnnSetConvolutionNdDescriptor, cd, 2, [0, "a"], [1, 1], [1, 1], 1, F32), "padA"),
        ((cc.cudnnSetConvolutionNdDescriptor, cd, 2, None, [1, 1], [1, 1], 1, F32), "padA"),
        ((cc.cudnnSetConvolutionNdDescriptor, cd, 2, [0, 0], "ab", [1, 1], 1, F32), "filterStrideA"),
        ((cc.cudnnSetPooling2dDescriptor, pd, 0, 0, "2", 2, 0, 0, 1, 1), "windowHeight"),
        ((cc.cudnnSetPooling2dDescriptor, pd, 0, 0, 2, 2, None, 0, 1, 1), "verticalPadding"),
        ((cc.cudnnSetPooling2dDescriptor, pd, 0, 0, 2, 2, 0, 0, 2 ** 63, 1), "verticalStride"),
        ((cc.cudnnSetPoolingNdDescriptor, pd, 0, 0, 2, [2, 2], [0, 0], [2 ** 63, 1]), "strideA"),
        ((cc.cudnnSetDropoutDescriptor, dd, h, 0.5, states, n, None), "seed"),
        ((cc.cudnnSetDropoutDescriptor, dd, h, None, states, n, 1), "dropout"),
        ((cc.cudnnGetTensorNdDescriptor, x, None), "nbDimsRequested"),
        ((cc.cudnnGetErrorString, None), "status"),
        ((cc.cudnnDropoutForward, h, dd, x, xs, x, ys, np.zeros(64, np.uint8), None), "reserveSpaceSizeInBytes"),
        ((cc.cudnnConvolutionForward, *conv[:9], "abc", *conv[10:]), "workSpaceSizeInBytes"),
    ]
    wrong = [f"{c[0].__name__}{c[1:]}: {_status(*c)}" for c, arg in cases if _status(*c) != (BAD, arg)]
    assert not wrong, "\n".join(wrong)
    # 002 §3.2.44: an invalid status value (one a cudnnStatus_t holds) gives CUDNN_UNKNOWN_STATUS
    assert cc.cudnnGetErrorString(np.int32(999)) == "CUDNN_UNKNOWN_STATUS"
    assert cc.cudnnGetErrorString(np.int64(3)) == "CUDNN_STATUS_BAD_PARAM"
    # the pooling descriptor kept its last good settings, so PoolingForward runs
    cc.cudnnSetPooling2dDescriptor(pd, cc.CUDNN_POOLING_MAX, 0, 2, 2, 0, 0, 2, 2)
    assert _status(cc.cudnnSetPooling2dDescriptor, pd, 0, 0, 2, 2, 0, 0, 2 ** 63, 1) == (BAD, "verticalStride")
    y = _tensor((1, 2, 2, 2))
    out = np.zeros(8, np.float32)
    cc.cudnnPoolingForward(h, pd, 1.0, x, np.arange(32, dtype=np.float32), 0.0, y, out)
    assert out.tolist() == [5, 7, 13, 15, 21, 23, 29, 31]


def _unregister(c_name):
    reg.LEGACY.pop(c_name, None)
    reg.CONVERSIONS.pop(c_name, None)
    SIGNATURES.pop(c_name, None)
    reg.CUPY_NAMES.pop(reg.cupy_name(c_name), None)


@pytest.mark.parametrize("exc", [TypeError, ValueError, OverflowError, IndexError, KeyError])
def test_safety_net_reports_our_bugs_as_internal_error(exc):
    def broken(handle, n):
        raise exc("boom")

    try:
        f = reg.legacy("cudnnZzBroken")(broken)
        with pytest.raises(cc.CuDNNError) as e:
            f(1, 2)
        assert e.value.status == INTERNAL and e.value.function == "cudnnZzBroken"
        assert isinstance(e.value.__cause__, exc) and exc.__name__ in str(e.value) and "bug" in str(e.value)
        with pytest.raises(cc.CuDNNError) as e:  # a call that does not fit the signature is the caller's
            f(1, 2, 3)
        assert e.value.status == BAD and e.value.argument == "arguments" and "cudnnZzBroken(handle, n)" in e.value.rule
    finally:
        _unregister("cudnnZzBroken")


def test_wrong_arity_on_real_functions_is_bad_param(handle):
    for fn, args in [(cc.cudnnGetVersion, (1,)), (cc.cudnnOpsInferVersionCheck, ("ops_train",)),
                     (cc.cudnnSetTensor4dDescriptor, (_tensor(), NCHW, F32, 1, 2)),
                     (cc.cudnnConvolutionForward, (handle,)), (cc.cudnnGetErrorString, ())]:
        assert _status(fn, *args) == (BAD, "arguments"), fn.__name__


def test_unhashable_descriptor_arguments_are_bad_param(handle):
    for bad in ([], {}, np.zeros(2)):
        assert _status(cc.cudnnGetTensor4dDescriptor, bad) == (BAD, "tensorDesc")
        assert _status(cc.cudnnDestroy, bad) == (BAD, "handle")


# -- every function, every argument position -----------------------------------------------------

SWEEP_VALUES = ("'x'", "None", "1.5", "-1", "2 ** 63", "object()", "[]", "1j", "float('nan')")


def _sweep() -> dict:
    """Call every registered function on a CPU handle with each argument replaced by each of
    SWEEP_VALUES (the others plausible: a set descriptor of the parameter's type, a small array,
    1, 0, 1.0); record what escapes other than CuDNNError, and every INTERNAL_ERROR."""
    setters = {
        "TensorDescriptor": lambda d: cc.cudnnSetTensor4dDescriptor(d, NCHW, F32, 1, 2, 4, 4),
        "FilterDescriptor": lambda d: cc.cudnnSetFilter4dDescriptor(d, F32, NCHW, 2, 2, 3, 3),
        "ConvolutionDescriptor": lambda d: cc.cudnnSetConvolution2dDescriptor(d, 1, 1, 1, 1, 1, 1, 1, F32),
        "PoolingDescriptor": lambda d: cc.cudnnSetPooling2dDescriptor(d, 0, 0, 2, 2, 0, 0, 2, 2),
        "ActivationDescriptor": lambda d: cc.cudnnSetActivationDescriptor(d, 1, 0, 0.0),
        "LRNDescriptor": lambda d: cc.cudnnSetLRNDescriptor(d, 5, 1e-4, 0.75, 2.0),
        "OpTensorDescriptor": lambda d: cc.cudnnSetOpTensorDescriptor(d, 0, F32, 0),
        "ReduceTensorDescriptor": lambda d: cc.cudnnSetReduceTensorDescriptor(d, 0, F32, 0, 0, 0),
        "SpatialTransformerDescriptor": lambda d: cc.cudnnSetSpatialTransformerNdDescriptor(d, 0, F32, 4, [1, 2, 4, 4]),
        "CTCLossDescriptor": lambda d: cc.cudnnSetCTCLossDescriptor(d, F32),
    }

    def make(typename):
        base = typename[len("cudnn"):-len("_t")]
        if base == "Handle":
            return cc.cudnnCreate("cpu")
        create = cc.LEGACY.get("cudnnCreate" + base)
        if create is None or not base.endswith("Descriptor"):
            return None
        d = create()
        if base in setters:
            setters[base](d)
        return d

    def default(kind, name):
        if kind is None or kind in ("out", "opaque", "stream"):
            return None
        if kind == "handle":
            return cc.cudnnCreate("cpu")
        if kind.startswith("desc:"):
            return make(kind[5:])
        if kind.startswith("desc[]:"):
            return [make(kind[7:])]
        if kind in ("double", "float"):
            return 1.0
        if kind in ("int[]", "uint32[]"):
            return [1, 1, 1, 1]
        if kind == "pointer":
            return 1.0 if name.lower().startswith(("alpha", "beta")) else np.zeros(256, np.float32)
        return 0 if kind.startswith("enum:") or kind == "size_t" else 1

    values = [eval(v) for v in SWEEP_VALUES]  # noqa: S307 - our own literals
    escapes, internal, calls = [], [], 0
    for c_name in sorted(cc.LEGACY):
        fn = cc.LEGACY[c_name]
        conv = reg.CONVERSIONS.get(c_name) or {}
        params = list(inspect.signature(fn).parameters.values())
        if any(p.kind == p.VAR_POSITIONAL for p in params):
            params = [inspect.Parameter(f"arg{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(10)]
        for i in [-1] + list(range(len(params))):
            for bad in (values if i >= 0 else [None]):
                if c_name == "cudnnCreate":
                    args = ["cpu"]
                else:
                    args = [default(conv.get(p.name, (None, None))[1], p.name) for p in params]
                if i >= 0:
                    args[i] = bad
                calls += 1
                where = (c_name, params[i].name if i >= 0 else "-", repr(bad))
                try:
                    fn(*args)
                except cc.CuDNNError as e:
                    if e.status == INTERNAL:
                        internal.append(where + (str(e)[:300],))
                except BaseException as e:  # noqa: BLE001 - exactly what the sweep looks for
                    escapes.append(where + (f"{type(e).__name__}: {e}"[:300],))
                finally:
                    if c_name == "cudnnSetCallback":
                        cc.cudnnSetCallback(0, None, None)
    return {"calls": calls, "escapes": escapes, "internal": internal}


def test_sweep_every_function_every_argument_only_cudnn_error_escapes():
    env = dict(os.environ, CUDNN_COMPAT_DEVICE="cpu")
    p = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--sweep"], capture_output=True, text=True,
                       timeout=600, cwd=str(ROOT / "tests"), env=env)
    assert p.returncode == 0, f"the sweep died (rc {p.returncode}):\n{p.stderr[-3000:]}"
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["calls"] > 10000, r["calls"]
    assert not r["escapes"], "bare exceptions escaped:\n" + "\n".join(map(str, r["escapes"][:40]))
    assert not r["internal"], "INTERNAL_ERROR (bugs the safety net caught):\n" + "\n".join(map(str, r["internal"][:40]))


# -- the fast path (its host cost is measured by benchmarks/host_overhead.py, not here) --------------

def test_fast_path_skips_conversion(monkeypatch, handle):
    """Plain ints / floats in range never reach the converters (the wrapper's inlined test); any
    other spelling, a missing trailing argument or a keyword takes the slow path."""
    calls = []
    real = reg._convert
    monkeypatch.setattr(reg, "_convert", lambda *a: calls.append(a[2]) or real(*a))
    args = _conv_forward()
    cc.cudnnConvolutionForward(*args)
    cc.cudnnSetConvolution2dDescriptor(args[6], 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    cc.cudnnSetActivationDescriptor(cc.cudnnCreateActivationDescriptor(), 1, 0, 2.5)
    assert calls == []
    args[9] = np.int64(0)
    cc.cudnnConvolutionForward(*args)
    cc.cudnnGetTensorNdDescriptor(args[2])
    cc.cudnnSetConvolutionGroupCount(convDesc=args[6], groupCount=1)
    assert len(calls) == 3


if __name__ == "__main__" and sys.argv[1:] == ["--sweep"]:
    print(json.dumps(_sweep()))


def test_positional_wrappers_bind_like_the_function():
    """A function with plain parameters gets the positional-only wrapper (registry._POSITIONAL: no
    ``*args`` tuple per call): by position, by keyword, mixed, with values to convert, each call
    binds as the function would, and a hook sees the arguments as given."""
    from cudnn_compat._core import generated, registry
    src = generated.SOURCES["<legacy wrapper cudnnSetTensor4dDescriptor>"]
    assert "/, *extra, **kwargs" in src
    nchw, f32 = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT
    calls = [lambda d: cc.cudnnSetTensor4dDescriptor(d, nchw, f32, 2, 3, 4, 5),
             lambda d: cc.cudnnSetTensor4dDescriptor(tensorDesc=d, format=nchw, dataType=f32, n=2, c=3, h=4, w=5),
             lambda d: cc.cudnnSetTensor4dDescriptor(d, nchw, f32, 2, 3, h=4, w=5),
             lambda d: cc.cudnnSetTensor4dDescriptor(d, nchw, f32, np.int32(2), 3, 4, np.int64(5))]
    for call in calls:
        d = cc.cudnnCreateTensorDescriptor()
        call(d)
        assert tuple(cc.cudnnGetTensor4dDescriptor(d)) == (f32, 2, 3, 4, 5, 60, 20, 5, 1)
        cc.cudnnDestroyTensorDescriptor(d)
    seen = []
    registry.HOOKS.append(lambda proceed, c_name, args, kwargs: (seen.append((c_name, args, kwargs)), proceed(args, kwargs))[1])
    try:
        d = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensor4dDescriptor(d, nchw, f32, 1, 2, 3, 4)
    finally:
        registry.HOOKS.pop()
    assert ("cudnnSetTensor4dDescriptor", (d, nchw, f32, 1, 2, 3, 4), {}) in seen
    assert tuple(cc.cudnnGetTensor4dDescriptor(d))[:5] == (f32, 1, 2, 3, 4)
    # a parameter named like a builtin the fast test uses is renamed in the wrapper, not shadowed
    assert "type=_MISSING" not in generated.SOURCES["<legacy wrapper cudnnGetProperty>"]
    assert cc.cudnnGetProperty(cc.MAJOR_VERSION) == cc.cudnnGetVersion() // 1000
