"""Every status rule of docs/status_rules.md has a test that proves it (issue 10).

The table in docs/status_rules.md has one row per rule: the legacy function, the status, the rule,
a *match* (text the error's "argument: rule" must contain) and the test that breaks the rule.
  * test_rule_table_names_existing_tests    (static) every row names a real function of the legacy
    API, a real status and a test function that exists in that file;
  * test_rule_table_covers_every_function   (static) every function of REQUIRED (the functions of
    inventory §2.18 and the other calls the table covers, with the statuses 002 gives each) has a
    row for each of its statuses;
  * test_rule_table_rows_are_proved         (runs the named tests in a subprocess, recording every
    CuDNNError they raise) each row's test really raises CuDNNError from that function, with that
    status, naming that argument and rule.
The rest of this file holds the tests for rules no family test file breaks yet.
"""
from __future__ import annotations

import ast
import ctypes
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "status_rules.md"
BAD, NS, INVALID = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED, cc.CUDNN_STATUS_INVALID_VALUE
B, N, I = "BAD_PARAM", "NOT_SUPPORTED", "INVALID_VALUE"

# function -> the statuses 002 (Returns sections, inventory §2.18) gives it, each needing a row
REQUIRED = {
    "cudnnSetTensor4dDescriptor": {B, N}, "cudnnSetTensor4dDescriptorEx": {B, N}, "cudnnSetTensorNdDescriptor": {B, N},
    "cudnnSetTensorNdDescriptorEx": {B, N}, "cudnnSetFilter4dDescriptor": {B, N}, "cudnnSetFilterNdDescriptor": {B, N},
    "cudnnAddTensor": {B, N}, "cudnnOpTensor": {B, N}, "cudnnReduceTensor": {B, N, I}, "cudnnTransformTensor": {B},
    "cudnnSetTensor": {B}, "cudnnScaleTensor": {B}, "cudnnSetOpTensorDescriptor": {B},
    "cudnnSetReduceTensorDescriptor": {B}, "cudnnTransformTensorEx": {B, N},
    "cudnnSetActivationDescriptor": {B}, "cudnnActivationForward": {B, N}, "cudnnActivationBackward": {B, N},
    "cudnnSoftmaxForward": {B, N}, "cudnnSoftmaxBackward": {B, N},
    "cudnnSetPooling2dDescriptor": {B}, "cudnnSetPoolingNdDescriptor": {B, N}, "cudnnPoolingForward": {B, N},
    "cudnnPoolingBackward": {B, N},
    "cudnnSetLRNDescriptor": {B}, "cudnnLRNCrossChannelForward": {B, N}, "cudnnLRNCrossChannelBackward": {B, N},
    "cudnnDivisiveNormalizationForward": {B, N}, "cudnnDivisiveNormalizationBackward": {B, N},
    "cudnnBatchNormalizationForwardInference": {B, N}, "cudnnBatchNormalizationForwardTraining": {B, N},
    "cudnnBatchNormalizationBackward": {B, N}, "cudnnDeriveBNTensorDescriptor": {B},
    "cudnnNormalizationForwardInference": {B, N}, "cudnnNormalizationForwardTraining": {B, N},
    "cudnnNormalizationBackward": {B, N},
    "cudnnSetConvolution2dDescriptor": {B}, "cudnnSetConvolutionNdDescriptor": {B, N},
    "cudnnConvolutionForward": {B, N}, "cudnnConvolutionBackwardData": {B, N}, "cudnnConvolutionBackwardFilter": {B, N},
    "cudnnConvolutionBackwardBias": {B}, "cudnnConvolutionBiasActivationForward": {B, N},
    "cudnnGetConvolutionForwardWorkspaceSize": {B, N}, "cudnnIm2Col": {B, N},
    "cudnnDropoutForward": {B}, "cudnnDropoutBackward": {B}, "cudnnSetDropoutDescriptor": {B, I},
    "cudnnSpatialTfGridGeneratorForward": {B, N}, "cudnnSpatialTfSamplerForward": {B},
    "cudnnSpatialTfSamplerBackward": {B, N},
    "cudnnRNNForward": {B, N}, "cudnnSetAttnDescriptor": {B, N}, "cudnnCTCLoss": {B, N},
    "cudnnGetProperty": {I}, "cudnnDestroy": {B},
}
ROW = re.compile(r"^\|\s*`?(cudnn\w+)`?\s*\|\s*(\w+)\s*\|(.*)\|\s*`([^`]*)`\s*\|\s*`?([^|`]+?)`?\s*\|\s*$")


def rows() -> list:
    """[(function, status, rule, match, test node)] of the table in docs/status_rules.md."""
    out = []
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            fn, status, rule, match, test = m.groups()
            out.append((fn, status, rule.strip(), match, test.strip()))
    return out


def _test_functions(path: pathlib.Path) -> set:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
    return names


def test_rule_table_names_existing_tests():
    table = rows()
    assert len(table) > 150, "docs/status_rules.md table not found or too short"
    bad = []
    defined = {}
    for fn, status, rule, match, test in table:
        path, _, name = test.partition("::")
        if path not in defined:
            defined[path] = _test_functions(ROOT / path) if (ROOT / path).exists() else set()
        if fn not in cc.LEGACY:
            bad.append(f"{fn}: not a legacy function")
        if "CUDNN_STATUS_" + status not in cc.STATUS:
            bad.append(f"{fn}: {status} is not a cudnnStatus_t")
        if name.split("[")[0] not in defined[path]:
            bad.append(f"{fn} {status} '{rule}': test {test} does not exist")
        if not match:
            bad.append(f"{fn} {status} '{rule}': empty match")
    assert not bad, "\n".join(bad)


def test_rule_table_covers_every_function():
    have = {}
    for fn, status, *_ in rows():
        have.setdefault(fn, set()).add(status)
    missing = {fn: sorted(want - have.get(fn, set())) for fn, want in REQUIRED.items() if want - have.get(fn, set())}
    assert not missing, f"functions without a proving row for these statuses: {missing}"


PLUGIN = '''
import json, os
import pytest
ERRORS, CURRENT, OUT = [], [None], {}

def pytest_configure(config):
    from cudnn_compat import errors
    init = errors.CuDNNError.__init__
    def record(self, *a, **k):
        init(self, *a, **k)
        if CURRENT[0]:
            ERRORS.append(self)
    errors.CuDNNError.__init__ = record

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    CURRENT[0] = item.nodeid
    del ERRORS[:]
    yield
    CURRENT[0] = None
    OUT.setdefault(item.nodeid.split("[")[0], []).extend(
        (e.function, e.status_name, f"{e.argument}: {e.rule}") for e in ERRORS)
    del ERRORS[:]

def pytest_unconfigure(config):
    with open(os.environ["STATUS_RULES_OUT"], "w") as f:
        json.dump(OUT, f)
'''


def test_rule_table_rows_are_proved(tmp_path):
    """Run every test the table names, recording each CuDNNError raised; every row must be matched by
    an error of its function and status whose 'argument: rule' text contains the row's match."""
    table = rows()
    (tmp_path / "status_rules_trace.py").write_text(textwrap.dedent(PLUGIN))
    out = tmp_path / "errors.json"
    nodes = sorted({t.split("[")[0] for *_, t in table})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), STATUS_RULES_OUT=str(out),
               CUDNN_COMPAT_DEVICE="cpu")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "status_rules_trace",
                           "-m", "not gpu", *nodes], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads(out.read_text())
    unproved = []
    for fn, status, rule, match, test in table:
        errs = seen.get(test.split("[")[0], [])
        if not any(f == fn and s == "CUDNN_STATUS_" + status and match in text for f, s, text in errs):
            near = sorted({text for f, s, text in errs if f == fn})[:4]
            unproved.append(f"{fn} {status} '{rule}' (match '{match}') by {test}; its errors from {fn}: {near}")
    assert not unproved, f"{len(unproved)} rows not proved by their test:\n" + "\n".join(unproved)
    assert proc.returncode in (0, 1), proc.stdout[-2000:]  # 1: a named test failed; its file reports it


# == tests for rules no family test file breaks ==========================================================

def _expect(status, fn, *args, untouched=()):
    before = [u.copy() for u in untouched]
    with pytest.raises(cc.CuDNNError) as e:
        fn(*args)
    assert e.value.status == status, e.value
    assert fn.__name__ == "<lambda>" or e.value.function == fn.__name__, e.value
    for u, b in zip(untouched, before):
        assert np.array_equal(u, b), f"{fn.__name__} wrote an output on a rejected call"
    return e.value


def _conv(pad=1, groups=1):
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, pad, pad, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    cc.cudnnSetConvolutionGroupCount(cd, groups)
    return cd


def _filter(k, c, r, s, dtype=cc.CUDNN_DATA_FLOAT):
    d = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(d, dtype, cc.CUDNN_TENSOR_NCHW, k, c, r, s)
    return d


def _calls(handle):
    """name -> (call(handle, xd, yd, y), x descriptor, y descriptor, y buffer): one good call per family."""
    x = np.random.default_rng(0).standard_normal(24).astype(np.float32)
    xd, yd = tdesc((1, 2, 3, 4)), tdesc((1, 2, 3, 4))
    act = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(act, cc.CUDNN_ACTIVATION_RELU, 0, 0.0)
    pool = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pool, cc.CUDNN_POOLING_MAX, 0, 1, 1, 0, 0, 1, 1)
    lrn = cc.cudnnCreateLRNDescriptor()
    op = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(op, cc.CUDNN_OP_TENSOR_ADD, cc.CUDNN_DATA_FLOAT, 0)
    wd, cd = _filter(2, 2, 1, 1), _conv(pad=0)
    w = np.ones(4, np.float32)
    pd = tdesc((1, 2, 1, 1))
    one = np.ones(2, np.float32)
    return {
        "cudnnAddTensor": lambda h, a, b, y: cc.cudnnAddTensor(h, 1.0, a, x, 0.0, b, y),
        "cudnnTransformTensor": lambda h, a, b, y: cc.cudnnTransformTensor(h, 1.0, a, x, 0.0, b, y),
        "cudnnOpTensor": lambda h, a, b, y: cc.cudnnOpTensor(h, op, 1.0, a, x, 1.0, a, x, 0.0, b, y),
        "cudnnActivationForward": lambda h, a, b, y: cc.cudnnActivationForward(h, act, 1.0, a, x, 0.0, b, y),
        "cudnnSoftmaxForward": lambda h, a, b, y: cc.cudnnSoftmaxForward(h, 1, 1, 1.0, a, x, 0.0, b, y),
        "cudnnPoolingForward": lambda h, a, b, y: cc.cudnnPoolingForward(h, pool, 1.0, a, x, 0.0, b, y),
        "cudnnLRNCrossChannelForward": lambda h, a, b, y: cc.cudnnLRNCrossChannelForward(h, lrn, 0, 1.0, a, x, 0.0, b, y),
        "cudnnConvolutionForward": lambda h, a, b, y: cc.cudnnConvolutionForward(h, 1.0, a, x, wd, w, cd, 0, None, 0,
                                                                                 0.0, b, y),
        "cudnnBatchNormalizationForwardInference": lambda h, a, b, y: cc.cudnnBatchNormalizationForwardInference(
            h, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, a, x, b, y, pd, one, one, one, one, 1e-5),
    }, xd, yd


def test_rule_bad_handle_or_descriptor_is_bad_param(handle):
    """NULL, destroyed or wrong-kind handles and descriptors give BAD_PARAM before anything is written,
    for every family (002: "handle ... NULL", a descriptor not initialized)."""
    calls, xd, yd = _calls(handle)
    dead_h = cc.cudnnCreate("cpu")
    cc.cudnnDestroy(dead_h)
    stale = tdesc((1, 2, 3, 4))
    cc.cudnnDestroyTensorDescriptor(stale)
    filt = _filter(1, 2, 3, 4)
    for name, call in calls.items():
        y = np.full(24, 7.0, np.float32)
        call(handle, xd, yd, y)  # the good call works
        y[...] = 7.0
        for h, a, b in [(None, xd, yd), (dead_h, xd, yd), (xd, xd, yd), (handle, None, yd), (handle, stale, yd),
                        (handle, int(stale), yd), (handle, xd, filt), (handle, xd, cc.cudnnCreateTensorDescriptor())]:
            e = _expect(BAD, lambda: call(h, a, b, y), untouched=[y])
            assert e.function == name, e


def test_rule_filter_descriptor_is_not_a_tensor_descriptor(handle):
    f = _filter(1, 2, 3, 4)
    y = np.zeros(24, np.float32)
    e = _expect(BAD, cc.cudnnAddTensor, handle, 1.0, f, y, 0.0, tdesc((1, 2, 3, 4)), y)
    assert "is a cudnnFilterDescriptor_t, not a cudnnTensorDescriptor_t" in str(e)
    e = _expect(BAD, cc.cudnnSetTensor4dDescriptor, f, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 1, 1, 1)
    assert cc.cudnnGetFilter4dDescriptor(f)[2:] == (1, 2, 3, 4)


def test_rule_descriptor_arrays_hold_ints():
    d = cc.cudnnCreateTensorDescriptor()
    for dims, strides, arg in [([1, 1, 1, "a"], [1, 1, 1, 1], "dimA"), ([1, 1, 1, 1.5], [1, 1, 1, 1], "dimA"),
                               (None, [1, 1, 1, 1], "dimA"), ([1, 1, 1, 2], [2, 2, 2, float("nan")], "strideA"),
                               ([1, 1, 1, 2], 7, "strideA")]:
        e = _expect(BAD, cc.cudnnSetTensorNdDescriptor, d, cc.CUDNN_DATA_FLOAT, 4, dims, strides)
        assert e.argument == arg, e
    e = _expect(BAD, cc.cudnnSetTensor4dDescriptor, d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 1, 1, "2")
    assert "must be an integer" in str(e) and e.argument == "w"
    cc.cudnnSetTensorNdDescriptor(d, cc.CUDNN_DATA_FLOAT, np.int64(4), np.array([1, 2, 3, 4]), (24, 12, 4, 1))
    assert cc.cudnnGetTensor4dDescriptor(d)[1:5] == (1, 2, 3, 4)


def test_rule_set_and_scale_tensor_need_their_pointers(handle):
    d = tdesc((1, 2, 2, 2))
    y = np.ones(8, np.float32)
    for fn, args in [(cc.cudnnSetTensor, (handle, d, None, 1.0)), (cc.cudnnSetTensor, (handle, d, y, None)),
                     (cc.cudnnScaleTensor, (handle, d, None, 2.0)), (cc.cudnnScaleTensor, (handle, d, y, None))]:
        _expect(BAD, fn, *args, untouched=[y])


class _Foreign:
    __cuda_array_interface__ = {"data": (0xDEAD000, False), "shape": (96,), "typestr": "|u1", "version": 3}


def test_rule_buffers_are_checked_before_any_write(handle):
    """This library's own buffer rules (cuDNN takes raw pointers and cannot check them): a buffer smaller
    than its descriptor's extent, non-contiguous, holding Python objects, foreign (a CUDA array on the
    CPU place), a plain int on the CPU place (host pointers are ctypes.c_void_p), a tiny ctypes pointer,
    an array of another dtype than the descriptor's, a descriptor, or a read-only output are BAD_PARAM; so are
    scalars that are not real numbers."""
    d = tdesc((1, 2, 3, 4))
    x = np.ones(24, np.float32)
    y = np.full(24, 3.0, np.float32)
    ro = np.zeros(24, np.float32)
    ro.flags.writeable = False
    cases = [(np.ones(23, np.float32), y, "A: buffer holds"), (np.ones(48, np.float32)[::2], y, "must be a contiguous"),
             (np.zeros(24, object), y, "holds Python objects"), (_Foreign(), y, "is device memory"),
             (ctypes.c_void_p(17), y, "is not a host pointer"), (x.ctypes.data, y, "ctypes.c_void_p(address)"),
             (-5, y, "ctypes.c_void_p(address)"), (17, y, "ctypes.c_void_p(address)"), (x, ro, "is a read-only array"),
             (np.ones(24), y, "array dtype float64 does not match"), (d, y, "is a cudnnTensorDescriptor_t"),
             (x, np.full(24, 3.0), "array dtype float64 does not match")]
    for a, c, text in cases:
        e = _expect(BAD, cc.cudnnAddTensor, handle, 1.0, d, a, 1.0, d, c, untouched=[y])
        assert text in str(e), e
    for alpha in ("1", [1.0], np.array([1 + 2j]), np.array(["a"]), None):
        _expect(BAD, cc.cudnnAddTensor, handle, alpha, d, x, 1.0, d, y, untouched=[y])


def test_rule_convolution_backward_group_and_type_rules(handle):
    """002 §6.2.2 BackwardFilter: K not a multiple of groupCount and data types that differ are
    BAD_PARAM; §5.2.8 BackwardData: data types that differ are BAD_PARAM."""
    x, dy, out = np.ones(64, np.float32), np.ones(64, np.float32), np.full(64, 5.0, np.float32)
    xd, dyd = tdesc((1, 4, 4, 4)), tdesc((1, 3, 4, 4))
    e = _expect(BAD, cc.cudnnConvolutionBackwardFilter, handle, 1.0, xd, x, dyd, dy, _conv(groups=2), 0, None, 0, 0.0,
                _filter(3, 2, 3, 3), out, untouched=[out])
    assert "not a multiple of groupCount" in str(e)
    e = _expect(BAD, cc.cudnnConvolutionBackwardFilter, handle, 1.0, xd, x, tdesc((1, 4, 4, 4)), dy, _conv(), 0, None, 0,
                0.0, _filter(4, 4, 3, 3, cc.CUDNN_DATA_DOUBLE), out, untouched=[out])
    assert "data types must match" in str(e)
    e = _expect(BAD, cc.cudnnConvolutionBackwardData, handle, 1.0, _filter(4, 4, 3, 3, cc.CUDNN_DATA_DOUBLE), x,
                tdesc((1, 4, 4, 4)), dy, _conv(), 0, None, 0, 0.0, xd, out, untouched=[out])
    assert "data types must match" in str(e)


def test_rule_batchnorm_backward_not_supported_configs(handle):
    """002 §4.1.2: configurations outside Tables 8-11 are NOT_SUPPORTED: INT8 data, parameters of the
    wrong type."""
    mode = cc.CUDNN_BATCHNORM_SPATIAL
    one = np.ones(3, np.float32)
    dx = np.full(24, 9.0, np.float32)
    i8 = tdesc((2, 3, 2, 2), cc.CUDNN_DATA_INT8)
    e = _expect(NS, cc.cudnnBatchNormalizationBackward, handle, mode, 1.0, 0.0, 1.0, 0.0, i8, np.ones(24, np.int8), i8,
                np.ones(24, np.int8), i8, dx.view(np.int8), tdesc((1, 3, 1, 1)), one, one.copy(), one.copy(), 1e-5, None,
                None, untouched=[dx])
    assert "INT8" in str(e)
    xd = tdesc((2, 3, 2, 2))
    e = _expect(NS, cc.cudnnBatchNormalizationBackward, handle, mode, 1.0, 0.0, 1.0, 0.0, xd, np.ones(24, np.float32),
                xd, np.ones(24, np.float32), xd, dx, tdesc((1, 3, 1, 1), cc.CUDNN_DATA_DOUBLE), np.ones(3),
                np.ones(3), np.ones(3), 1e-5, None, None, untouched=[dx])
    assert "data type must be CUDNN_DATA_FLOAT" in str(e)


def test_rule_normalization_backward_not_supported_configs(handle):
    """002 §4.1.15 cudnnNormalizationBackward: an unknown algo or groupCnt other than 1 is NOT_SUPPORTED."""
    xd, pd = tdesc((2, 3, 2, 2)), tdesc((1, 3, 1, 1))
    x, dy, dx = np.ones(24, np.float32), np.ones(24, np.float32), np.full(24, 4.0, np.float32)
    ds, db = np.zeros(3, np.float32), np.zeros(3, np.float32)
    mode, ops = cc.CUDNN_NORM_PER_CHANNEL, cc.CUDNN_NORM_OPS_NORM

    def call(algo, groups):
        return (handle, mode, ops, algo, 1.0, 0.0, 1.0, 0.0, xd, x, None, None, xd, dy, None, None, xd, dx, pd,
                np.ones(3, np.float32), None, ds, db, 1e-5, pd, None, None, None, None, 0, None, 0, groups)

    e = _expect(NS, cc.cudnnNormalizationBackward, *call(9, 1), untouched=[dx, ds, db])
    assert "algo" in str(e)
    e = _expect(NS, cc.cudnnNormalizationBackward, *call(cc.CUDNN_NORM_ALGO_STANDARD, 2), untouched=[dx, ds, db])
    assert "groupCnt" in str(e)
