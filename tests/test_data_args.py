"""Data and scalar arguments of the C-named API (docs/conventions.md "Scalars" and "Data";
issue 13 items 1, 2 and 5), on the CPU place:

* item 1: a descriptor, handle or plan object where a buffer or a scalar goes is BAD_PARAM naming the
  argument, across ten functions and every data and scalar position (run in a child process: a
  regression that dereferences one crashes the child, not pytest); Python numbers are values
  (alpha=5000, 2**40); a plain int is no host pointer on the CPU place, ctypes pointers are;
* item 2: an array whose dtype disagrees with its descriptor is BAD_PARAM naming both dtypes and
  the descriptor's type, for inputs and outputs; byte views and untyped buffers are accepted;
* item 5: a rejected multi-graph call (RNN, attention, CTC, BN Ex, normalization) writes nothing:
  every other output buffer is byte-identical to its poisoned state.
"""
from __future__ import annotations

import array
import ctypes
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend.dtypes import bf16_to_f32, f32_to_bf16
from conftest import tdesc

BAD = cc.CUDNN_STATUS_BAD_PARAM
F32, F64, F16, BF16, I8 = (cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_HALF, cc.CUDNN_DATA_BFLOAT16,
                           cc.CUDNN_DATA_INT8)
HERE = pathlib.Path(__file__).resolve().parent
SHAPE = (2, 3, 4, 4)
N = 96


def _expect(status, fn, *args, untouched=(), argument=None, text=()):
    """Call fn(*args): CuDNNError with ``status`` (naming ``argument``, containing every ``text``),
    and every array of ``untouched`` byte-identical to before."""
    before = [np.array(u, copy=True) for u in untouched]
    with pytest.raises(cc.CuDNNError) as e:
        fn(*args)
    err = e.value
    assert err.status == status, err
    if argument is not None:
        assert err.argument == argument, err
    for t in text:
        assert t in str(err), err
    for u, b in zip(untouched, before):
        assert u.tobytes() == b.tobytes(), f"{err}: an output was written"
    return err


def _act(mode=cc.CUDNN_ACTIVATION_RELU):
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, mode, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    return ad


# -- the call table: ten functions, every data and scalar position -----------------------------------

def _data(rng, n=N, dtype=np.float32):
    return rng.standard_normal(n).astype(dtype)


def _poison(n=N, dtype=np.float32):
    return np.full(n, 7.0, dtype)


def call_activation_forward(h, rng):
    d, x, y = tdesc(SHAPE), _data(rng), _poison()
    return cc.cudnnActivationForward, [h, _act(), 1.0, d, x, 0.0, d, y], {"alpha": 2, "x": 4, "beta": 5, "y": 7}, [y]


def call_activation_backward(h, rng):
    d, y, dy, x, dx = tdesc(SHAPE), _data(rng), _data(rng), _data(rng), _poison()
    return (cc.cudnnActivationBackward, [h, _act(), 1.0, d, y, d, dy, d, x, 0.0, d, dx],
            {"alpha": 2, "y": 4, "dy": 6, "x": 8, "beta": 9, "dx": 11}, [dx])


def call_add_tensor(h, rng):
    d, b, a, c = tdesc(SHAPE), tdesc((1, 3, 1, 1)), _data(rng, 3), _poison()
    return cc.cudnnAddTensor, [h, 1.0, b, a, 1.0, d, c], {"alpha": 1, "A": 3, "beta": 4, "C": 6}, [c]


def call_op_tensor(h, rng):
    od = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(od, cc.CUDNN_OP_TENSOR_ADD, F32, cc.CUDNN_NOT_PROPAGATE_NAN)
    d, a, b, c = tdesc(SHAPE), _data(rng), _data(rng), _poison()
    return (cc.cudnnOpTensor, [h, od, 1.0, d, a, 1.0, d, b, 0.0, d, c],
            {"alpha1": 2, "A": 4, "alpha2": 5, "B": 7, "beta": 8, "C": 10}, [c])


def call_convolution_forward(h, rng):
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, F32, cc.CUDNN_TENSOR_NCHW, 2, 3, 3, 3)
    xd, yd = tdesc(SHAPE), tdesc((2, 2, 4, 4))
    x, w, y, ws = _data(rng), _data(rng, 54), _poison(64), np.zeros(64, np.uint8)
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
    return (cc.cudnnConvolutionForward, [h, 1.0, xd, x, wd, w, cd, algo, ws, 64, 0.0, yd, y],
            {"alpha": 1, "x": 3, "w": 5, "workSpace": 8, "beta": 10, "y": 12}, [y])


def call_pooling_forward(h, rng):
    pd = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pd, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
    xd, yd, x, y = tdesc(SHAPE), tdesc((2, 3, 2, 2)), _data(rng), _poison(24)
    return cc.cudnnPoolingForward, [h, pd, 1.0, xd, x, 0.0, yd, y], {"alpha": 2, "x": 4, "beta": 5, "y": 7}, [y]


def call_softmax_forward(h, rng):
    d, x, y = tdesc(SHAPE), _data(rng), _poison()
    return (cc.cudnnSoftmaxForward, [h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, d, x, 0.0, d, y],
            {"alpha": 3, "x": 5, "beta": 6, "y": 8}, [y])


def call_batchnorm_training(h, rng):
    d, pd = tdesc(SHAPE), tdesc((1, 3, 1, 1))
    x, y = _data(rng), _poison()
    scale, bias = np.ones(3, np.float32), np.zeros(3, np.float32)
    rm, rv, sm, si = (_poison(3) for _ in range(4))
    args = [h, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, d, x, d, y, pd, scale, bias, 0.1, rm, rv, 1e-5, sm, si]
    return (cc.cudnnBatchNormalizationForwardTraining, args,
            {"alpha": 2, "beta": 3, "x": 5, "y": 7, "bnScale": 9, "bnBias": 10, "resultRunningMean": 12,
             "resultSaveInvVariance": 16}, [y, rm, rv, sm, si])


def call_lrn_forward(h, rng):
    nd = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(nd, 3, 1e-4, 0.75, 2.0)
    d, x, y = tdesc(SHAPE), _data(rng), _poison()
    return (cc.cudnnLRNCrossChannelForward, [h, nd, cc.CUDNN_LRN_CROSS_CHANNEL_DIM1, 1.0, d, x, 0.0, d, y],
            {"alpha": 3, "x": 5, "beta": 6, "y": 8}, [y])


def call_transform_tensor(h, rng):
    xd, yd = tdesc(SHAPE), tdesc(SHAPE, fmt=cc.CUDNN_TENSOR_NHWC)
    x, y = _data(rng), _poison()
    return cc.cudnnTransformTensor, [h, 1.0, xd, x, 0.0, yd, y], {"alpha": 1, "x": 3, "beta": 4, "y": 6}, [y]


def call_convolution_backward_filter(h, rng):
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, F32, cc.CUDNN_TENSOR_NCHW, 2, 3, 3, 3)
    xd, dyd = tdesc(SHAPE), tdesc((2, 2, 4, 4))
    x, dy, dw = _data(rng), _data(rng, 64), _poison(54)
    algo = cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0
    return (cc.cudnnConvolutionBackwardFilter, [h, 1.0, xd, x, dyd, dy, cd, algo, None, 0, 0.0, wd, dw],
            {"alpha": 1, "x": 3, "dy": 5, "beta": 10, "dw": 12}, [dw])


CALLS = {f.__name__[len("call_"):]: f for f in (
    call_activation_forward, call_activation_backward, call_add_tensor, call_op_tensor, call_convolution_forward,
    call_pooling_forward, call_softmax_forward, call_batchnorm_training, call_lrn_forward, call_transform_tensor,
    call_convolution_backward_filter)}


def library_objects(h) -> dict:
    """One object of each kind this library makes, none of them data."""
    return {"tensor descriptor": tdesc(SHAPE), "handle": h, "activation descriptor": _act(),
            "fused-ops plan": cc.cudnnCreateFusedOpsPlan(cc.CUDNN_FUSED_SCALE_BIAS_ACTIVATION_CONV_BNSTATS),
            "backend descriptor": cc.cudnnBackendCreateDescriptor(cc.CUDNN_BACKEND_TENSOR_DESCRIPTOR),
            "algo perf": cc.cudnnGetConvolutionForwardAlgorithm_v7(h, *_conv_descs(), 1)[0]}


def _conv_descs():
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, F32, cc.CUDNN_TENSOR_NCHW, 2, 3, 3, 3)
    return tdesc(SHAPE), wd, cd, tdesc((2, 2, 4, 4))


def object_cases():
    """(case id, call name, position name, object kind) of every library object in every position."""
    h = cc.cudnnCreate("cpu")
    kinds = list(library_objects(h))
    out = []
    for name, make in CALLS.items():
        _, _, positions, _ = make(h, np.random.default_rng(0))
        for pos in positions:
            for kind in kinds:
                out.append((f"{name}:{pos}:{kind}", name, pos, kind))
    return out


def _child_main(results_path: str) -> None:
    """Run every object case in this (child) process; one JSON line per case, flushed before the next
    case starts, so a crash leaves the last finished case on record."""
    h = cc.cudnnCreate("cpu")
    objects = library_objects(h)
    with open(results_path, "w") as out:
        for cid, name, pos, kind in object_cases():
            out.write(json.dumps({"start": cid}) + "\n")
            out.flush()
            fn, args, positions, outputs = CALLS[name](h, np.random.default_rng(0))
            args[positions[pos]] = objects[kind]
            before = [o.tobytes() for o in outputs]
            rec = {"case": cid}
            try:
                fn(*args)
                rec["status"] = "no error"
            except cc.CuDNNError as e:
                rec.update(status=e.status, argument=e.argument, text=str(e))
            except Exception as e:  # noqa: BLE001 - recorded: a bare exception is a failure of the test
                rec.update(status=type(e).__name__, text=str(e))
            rec["untouched"] = all(o.tobytes() == b for o, b in zip(outputs, before))
            out.write(json.dumps(rec) + "\n")
            out.flush()


def test_library_objects_are_bad_param_everywhere(tmp_path):
    """Item 1: a descriptor, the handle, an activation descriptor, a fused-ops plan, a backend descriptor
    or an algo-perf result as any data or scalar argument of 11 functions: BAD_PARAM naming that
    argument, nothing written.  Run in a child process: a dereferenced descriptor id crashes it."""
    results = tmp_path / "results.jsonl"
    env = dict(os.environ, CUDNN_COMPAT_DEVICE="cpu", PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]))
    code = f"import test_data_args as t; t._child_main({str(results)!r})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=HERE.parent, env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []
    done = [r for r in lines if "case" in r]
    started = [r["start"] for r in lines if "start" in r]
    assert proc.returncode == 0, (f"the child died (status {proc.returncode}) in case {started[-1] if started else None}: "
                                  f"{proc.stderr[-2000:]}")
    cases = object_cases()
    assert len(done) == len(cases) >= 300
    bad = [r for r in done if not (r["status"] == BAD and r["untouched"] and
                                   r["argument"] == r["case"].split(":")[1] and "not" in r["text"])]
    assert not bad, bad[:5]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_library_objects_in_process(handle, rng, name):
    """The same rule in this process for a descriptor and a handle in every position (the child
    process test above covers every kind of object)."""
    objects = library_objects(handle)
    for pos in CALLS[name](handle, rng)[2]:
        for kind in ("tensor descriptor", "handle"):
            fn, args, positions, outputs = CALLS[name](handle, rng)
            args[positions[pos]] = objects[kind]
            _expect(BAD, fn, *args, untouched=outputs, argument=pos)


# -- item 1: numbers are values; host pointers are ctypes pointers ------------------------------------

@pytest.mark.parametrize("alpha", [5000, 2 ** 31 - 1, -2 ** 31 + 1, np.int64(5000), np.uint32(4096), True])
def test_python_ints_are_values_never_pointers(handle, rng, alpha):
    """alpha=5000 used to be read as a host pointer (SIGSEGV); every Python or NumPy number is a value
    (ints of magnitude 2^31 or more look like host addresses: BAD_PARAM, tests/test_data_params.py)."""
    d = tdesc(SHAPE, F64)
    x, y = rng.standard_normal(N), np.full(N, np.nan)
    cc.cudnnActivationForward(handle, _act(), alpha, d, x, 0.0, d, y)
    np.testing.assert_allclose(y, float(alpha) * np.maximum(x, 0), rtol=1e-15)
    # beta too, and a float descriptor (values are exact in float32 here)
    bd, cd = tdesc((1, 3, 1, 1)), tdesc(SHAPE)
    a, c0 = np.ones(3, np.float32), np.full(N, 0.5, np.float32)
    c = c0.copy()
    cc.cudnnAddTensor(handle, 1.0, bd, a, alpha, cd, c)
    np.testing.assert_allclose(c, 1.0 + float(alpha) * 0.5, rtol=1e-6)


def test_scalars_that_are_no_number_are_bad_param(handle, rng):
    d = tdesc(SHAPE)
    x, y = _data(rng), _poison()
    for alpha, text in [(10 ** 400, "out of range"), (2 ** 40, "host address"), (None, "NULL"), ("1", "must be a number"),
                        (np.array([1.0, 2.0]), "one real number"), (ctypes.c_void_p(None), "NULL"),
                        (ctypes.c_void_p(12), "not a host pointer"), (1 + 2j, "must be a number"),
                        (tdesc(SHAPE), "not a scalar")]:
        _expect(BAD, cc.cudnnActivationForward, handle, _act(), alpha, d, x, 0.0, d, y, untouched=[y], argument="alpha",
                text=[text])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_host_pointer_scalars_are_ctypes_pointers(handle, rng, dtype):
    """002 "Scaling Parameters": a pointer to a float, or to a double for DOUBLE data; ctypes spells it."""
    d = tdesc(SHAPE, F64 if dtype == np.float64 else F32)
    x = rng.standard_normal(N).astype(dtype)
    cell = np.array(0.25, dtype)
    ct = ctypes.c_double if dtype == np.float64 else ctypes.c_float
    c_value = ct(0.25)
    forms = [ctypes.c_void_p(cell.ctypes.data), cell.ctypes, ctypes.byref(c_value), ctypes.pointer(c_value),
             ctypes.cast(cell.ctypes.data, ctypes.POINTER(ct)), c_value, (ct * 1)(0.25), np.array([0.25], dtype),
             0.25, np.float32(0.25)]
    for alpha in forms:
        y = np.full(N, np.nan, dtype)
        cc.cudnnActivationForward(handle, _act(), alpha, d, x, 0.0, d, y)
        np.testing.assert_array_equal(y, (0.25 * np.maximum(x.astype(np.float64), 0)).astype(dtype), err_msg=repr(alpha))


@pytest.mark.parametrize("name", ["activation_forward", "add_tensor", "convolution_forward", "softmax_forward",
                                  "batchnorm_training"])
def test_plain_ints_are_not_host_pointers_on_the_cpu_place(handle, rng, name):
    """Data on the CPU place: an int is BAD_PARAM whose message says to pass ctypes.c_void_p(address);
    the same address as a c_void_p gives the result the arrays give."""
    fn, args, positions, outputs = CALLS[name](handle, rng)
    for pos, i in positions.items():
        if pos.startswith(("alpha", "beta")):
            continue
        bad = list(args)
        arr = args[i]
        bad[i] = arr.ctypes.data
        _expect(BAD, fn, *bad, untouched=outputs, argument=pos, text=["ctypes.c_void_p(address)"])
    want = [o.copy() for o in outputs]
    fn(*args)
    want = [o.copy() for o in outputs]
    for o in outputs:
        o[...] = 7.0
    raw = list(args)
    for pos, i in positions.items():
        if not pos.startswith(("alpha", "beta")):
            raw[i] = ctypes.c_void_p(args[i].ctypes.data)
    fn(*raw)
    for o, w in zip(outputs, want):
        np.testing.assert_array_equal(o, w)


def test_buffer_objects_on_the_cpu_place(handle, rng):
    """Buffer protocol, __array_interface__ and ctypes arrays are data; read-only ones are no output."""
    d = tdesc(SHAPE)
    x = rng.standard_normal(N).astype(np.float32)
    want = np.maximum(x, 0)

    class Iface:
        def __init__(self, a):
            self.a = a
            self.__array_interface__ = a.__array_interface__

    for make in (lambda a: array.array("f", a.tobytes()), lambda a: bytearray(a.tobytes()),
                 lambda a: memoryview(a), lambda a: (ctypes.c_float * N).from_buffer_copy(a.tobytes()),
                 lambda a: Iface(a.copy()), lambda a: ctypes.cast(a.ctypes.data, ctypes.POINTER(ctypes.c_float))):
        src = make(x)
        y = np.zeros(N, np.float32)
        out = make(np.zeros(N, np.float32))
        cc.cudnnActivationForward(handle, _act(), 1.0, d, src, 0.0, d, y)
        np.testing.assert_array_equal(y, want)
        if not isinstance(out, ctypes._Pointer):  # (a pointer to a temporary: not a place to write)
            cc.cudnnActivationForward(handle, _act(), 1.0, d, x, 0.0, d, out)
            np.testing.assert_array_equal(np.frombuffer(bytes(memoryview(getattr(out, "a", out))), np.float32), want)
    y = _poison()
    for bad, text in [(bytes(x.tobytes()), "read-only"), (array.array("d", x.astype(np.float64)), "float64"),
                      ((ctypes.c_double * N)(), "float64"), ([0.0] * N, "must be a NumPy array"),
                      ("abc", "must be a NumPy array"), (3.5, "not a data buffer")]:
        _expect(BAD, cc.cudnnActivationForward, handle, _act(), 1.0, d, x, 0.0, d, bad, argument="y", text=[text])
    _expect(BAD, cc.cudnnActivationForward, handle, _act(), 1.0, d, array.array("d", x.astype(np.float64)), 0.0, d, y,
            untouched=[y], argument="x", text=["float64"])


# -- item 2: dtypes --------------------------------------------------------------------------------

DTYPE_CASES = [  # (call, position, wrong dtype)
    ("activation_forward", "x", np.float64), ("activation_forward", "y", np.float64),
    ("activation_backward", "dy", np.float16), ("activation_backward", "dx", np.float64),
    ("add_tensor", "A", np.float64), ("add_tensor", "C", np.int32), ("op_tensor", "B", np.float64),
    ("op_tensor", "C", np.float64), ("convolution_forward", "x", np.float64), ("convolution_forward", "w", np.int32),
    ("convolution_forward", "y", np.float64), ("pooling_forward", "x", np.float16), ("pooling_forward", "y", np.float64),
    ("softmax_forward", "y", np.float64), ("batchnorm_training", "bnScale", np.float64),
    ("batchnorm_training", "resultRunningMean", np.float64), ("lrn_forward", "x", np.float64),
    ("transform_tensor", "y", np.float64), ("convolution_backward_filter", "dw", np.float64),
]


@pytest.mark.parametrize("name, pos, wrong", DTYPE_CASES)
def test_dtype_disagreeing_with_the_descriptor_is_bad_param(handle, rng, name, pos, wrong):
    """An array of another dtype than its FLOAT descriptor (np.random's float64 is the usual one):
    BAD_PARAM naming the argument, both dtypes and CUDNN_DATA_FLOAT; nothing written."""
    fn, args, positions, outputs = CALLS[name](handle, rng)
    i = positions[pos]
    old = args[i]
    args[i] = np.resize(old.astype(wrong), max(old.size, old.nbytes // np.dtype(wrong).itemsize + 1))  # big enough
    outs = [args[i] if o is old else o for o in outputs]
    _expect(BAD, fn, *args, untouched=[o for o in outs if o is not args[i]], argument=pos,
            text=[str(np.dtype(wrong)), "float32", "CUDNN_DATA_FLOAT"])


def test_dtype_rules_for_double_half_and_bfloat16(handle, rng):
    for dt, arr, text in [(F64, np.ones(N, np.float32), "CUDNN_DATA_DOUBLE"), (F16, np.ones(N, np.float32), "CUDNN_DATA_HALF"),
                          (BF16, np.ones(N, np.float16), "CUDNN_DATA_BFLOAT16"), (I8, np.ones(N, np.int16), "CUDNN_DATA_INT8")]:
        d = tdesc(SHAPE, dt)
        y = np.zeros(N * 8, np.uint8)
        _expect(BAD, cc.cudnnTransformTensor, handle, 1.0, d, arr, 0.0, d, y, untouched=[y], argument="x",
                text=[str(arr.dtype), text])


def test_byte_views_are_accepted(handle, rng):
    """uint8 for any type, uint16 for BFLOAT16, uint8 for INT8: the same numbers as typed arrays."""
    d = tdesc(SHAPE)
    x = rng.standard_normal(N).astype(np.float32)
    y = np.full(N, np.nan, np.float32)
    cc.cudnnActivationForward(handle, _act(), 2.0, d, x.view(np.uint8), 0.0, d, y.view(np.uint8))
    np.testing.assert_array_equal(y, 2 * np.maximum(x, 0))
    bd = tdesc(SHAPE, BF16)
    a = f32_to_bf16(np.arange(N, dtype=np.float32))
    c = f32_to_bf16(np.ones(N, np.float32))
    cc.cudnnAddTensor(handle, 2.0, bd, a, 1.0, bd, c)  # uint16 arrays
    np.testing.assert_array_equal(bf16_to_f32(c), 2 * np.arange(N) + 1)
    c2 = f32_to_bf16(np.ones(N, np.float32))
    cc.cudnnAddTensor(handle, 2.0, bd, a.view(np.uint8), 1.0, bd, c2.view(np.uint8))
    np.testing.assert_array_equal(c2, c)
    i8 = tdesc(SHAPE, I8)
    xi = rng.integers(-100, 100, N).astype(np.int8)
    yi = np.zeros(N, np.int8)
    cc.cudnnTransformTensor(handle, 1.0, i8, xi.view(np.uint8), 0.0, i8, yi.view(np.uint8))
    np.testing.assert_array_equal(yi, xi)


def test_accepted_dtype_table():
    """The table docs/conventions.md lists: exactly these array dtypes per descriptor data type."""
    from cudnn_compat._core.data import ACCEPTED, dtype_ok
    want = {"float32": {"float32", "uint8"}, "float64": {"float64", "uint8"}, "float16": {"float16", "uint8"},
            "bfloat16": {"uint16", "uint8"}, "int8": {"int8", "uint8"}, "uint8": {"uint8"}, "int32": {"int32", "uint8"},
            "int64": {"int64", "uint8"}, "bool": {"bool", "uint8"}}
    every = ["float32", "float64", "float16", "uint16", "int16", "int8", "uint8", "int32", "uint32", "int64", "bool",
             "complex64"]
    for name, ok in want.items():
        assert {t for t in every if dtype_ok(np.dtype(t), name)} == ok, name
    for name in ("int8x4", "uint8x4", "int8x32"):
        assert {t for t in every if dtype_ok(np.dtype(t), name)} == {"int8", "uint8", "int32"}
    assert ACCEPTED["bfloat16"][1] == ("uint16", "bfloat16")  # ml_dtypes.bfloat16 by name
    assert dtype_ok(np.dtype("uint32"), "int32", "indices") and not dtype_ok(np.dtype("int16"), "int32", "indices")


def test_ml_dtypes_bfloat16_is_accepted(handle):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bd = tdesc(SHAPE, BF16)
    a = np.arange(N).astype(ml_dtypes.bfloat16)
    c = np.ones(N, ml_dtypes.bfloat16)
    cc.cudnnAddTensor(handle, 2.0, bd, a, 1.0, bd, c)
    np.testing.assert_array_equal(c.astype(np.float32), 2 * np.arange(N) + 1)


def test_untyped_buffers_take_any_dtype(handle, rng):
    """Workspace, reserve space and dropout states are bytes: a float64 or int16 array is as good as
    uint8, with the same result."""
    fn, args, positions, outputs = CALLS["convolution_forward"](handle, rng)
    fn(*args)
    want = outputs[0].copy()
    args[positions["workSpace"]] = np.zeros(8, np.float64)
    outputs[0][...] = 7
    fn(*args)
    np.testing.assert_array_equal(outputs[0], want)
    # dropout: states and reserve space as float64 / int16 arrays give the uint8 result
    xd = tdesc((1, 1, 1, 200))
    x = np.ones(200, np.float32)
    size = cc.cudnnDropoutGetStatesSize(handle)
    rsz = cc.cudnnDropoutGetReserveSpaceSize(xd)
    ys = []
    for st_dtype, rs_dtype in ((np.uint8, np.uint8), (np.float64, np.int16)):
        d = cc.cudnnCreateDropoutDescriptor()
        st = np.zeros(-(-size // np.dtype(st_dtype).itemsize), st_dtype)
        cc.cudnnSetDropoutDescriptor(d, handle, 0.5, st, size, 77)
        rs = np.zeros(-(-rsz // np.dtype(rs_dtype).itemsize), rs_dtype)
        y = np.zeros(200, np.float32)
        cc.cudnnDropoutForward(handle, d, xd, x, xd, y, rs, rsz)
        ys.append((y, rs.view(np.uint8)[:rsz].copy()))
    np.testing.assert_array_equal(ys[0][0], ys[1][0])
    np.testing.assert_array_equal(ys[0][1], ys[1][1])
    assert 0 < np.count_nonzero(ys[0][0]) < 200


# -- item 5: a rejected multi-graph call writes nothing -----------------------------------------------

def _rnn(handle, rng, dtype=np.float64, training=True):
    from test_rnn_reference import data_desc, make_net, pack, state_desc
    net = make_net(handle, cc.CUDNN_LSTM, D=2, L=2, rng=rng, dtype=dtype)
    lengths, T, layout = (3, 2), 3, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
    B, I, H, P, L, D = len(lengths), net["I"], net["H"], net["P"], net["L"], net["D"]
    dt = net["dt"]
    xs = [rng.standard_normal((n, I)).astype(dtype) for n in lengths]
    s = dict(net=net, xd=data_desc(dt, layout, T, B, I, lengths), yd=data_desc(dt, layout, T, B, D * P, lengths),
             x=pack(xs, layout, T, I, dtype), hd=state_desc(dtype, L * D, B, P), cd=state_desc(dtype, L * D, B, H),
             seq=np.array(lengths, np.int32))
    s["hx"], s["cx"] = rng.standard_normal(L * D * B * P).astype(dtype), rng.standard_normal(L * D * B * H).astype(dtype)
    mode = cc.CUDNN_FWD_MODE_TRAINING if training else cc.CUDNN_FWD_MODE_INFERENCE
    s["ws_size"], s["rs_size"] = cc.cudnnGetRNNTempSpaceSizes(handle, net["desc"], mode, s["xd"])
    s["mode"] = mode
    s["outs"] = dict(y=np.full(T * B * D * P, 7.0, dtype), hy=np.full(L * D * B * P, 7.0, dtype),
                     cy=np.full(L * D * B * H, 7.0, dtype), ws=np.full(s["ws_size"], 0xA5, np.uint8),
                     rs=np.full(max(s["rs_size"], 1), 0x5A, np.uint8))
    return s


def _rnn_forward(handle, s, **over):
    o = dict(s["outs"], **over)
    net = s["net"]
    cc.cudnnRNNForward(handle, net["desc"], s["mode"], s["seq"], s["xd"], s["x"], s["yd"], o["y"], s["hd"], s["hx"],
                       o["hy"], s["cd"], s["cx"], o["cy"], net["wsize"], net["wspace"], s["ws_size"], o["ws"],
                       s["rs_size"], o["rs"])


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def test_rnn_forward_rejected_output_writes_nothing(handle, rng):
    """Read-only y (written by the last graph): BAD_PARAM before hy, cy, workspace or reserve space
    are written; likewise a dtype mismatch or a descriptor in any output position."""
    s = _rnn(handle, rng)
    o = s["outs"]
    for pos, bad, text in [("y", _read_only(o["y"]), "read-only"), ("hy", _read_only(o["hy"]), "read-only"),
                           ("y", o["y"].astype(np.float32), "float32"), ("cy", o["cy"].astype(np.float32), "float32"),
                           ("rs", tdesc(SHAPE), "not a data buffer"), ("ws", o["ws"][:8], "bytes")]:
        _expect(BAD, lambda: _rnn_forward(handle, s, **{pos: bad}), untouched=[v for k, v in o.items() if k != pos],
                text=[text])
    _rnn_forward(handle, s)  # the unchanged call runs (padding rows of y stay as they were)
    assert not np.all(o["y"] == 7.0) and not np.any(o["hy"] == 7.0) and not np.any(o["cy"] == 7.0)


def test_rnn_forward_accepts_every_cpu_buffer_form(handle, rng):
    """ctypes pointers and float64 untyped buffers go through the multi-graph path with the same result."""
    s = _rnn(handle, rng)
    _rnn_forward(handle, s)
    want = {k: v.copy() for k, v in s["outs"].items()}
    s2 = dict(s, outs={k: np.full_like(v, 7) for k, v in s["outs"].items()})
    o = s2["outs"]
    ws64 = np.zeros(-(-s["ws_size"] // 8), np.float64)
    rs64 = np.zeros(-(-s["rs_size"] // 8), np.float64)
    rs64.view(np.uint8)[:] = 0x5A  # the poison of the uint8 run: bytes the call does not write stay equal
    _rnn_forward(handle, s2, y=ctypes.c_void_p(o["y"].ctypes.data), hy=o["hy"].ctypes, ws=ws64, rs=rs64)
    for k in ("y", "hy", "cy"):
        np.testing.assert_array_equal(o[k], want[k])
    np.testing.assert_array_equal(rs64.view(np.uint8)[:s["rs_size"]], want["rs"][:s["rs_size"]])


def test_rnn_backward_data_rejected_output_writes_nothing(handle, rng):
    s = _rnn(handle, rng)
    _rnn_forward(handle, s)
    o, net = s["outs"], s["net"]
    dy = np.ones_like(o["y"])
    outs = dict(dx=np.full(s["x"].size, 7.0), dhx=np.full(s["hx"].size, 7.0), dcx=np.full(s["cx"].size, 7.0),
                ws=o["ws"], rs=o["rs"])

    def call(**over):
        b = dict(outs, **over)
        cc.cudnnRNNBackwardData_v8(handle, net["desc"], s["seq"], s["yd"], o["y"], dy, s["xd"], b["dx"], s["hd"], s["hx"],
                                   None, b["dhx"], s["cd"], s["cx"], None, b["dcx"], net["wsize"], net["wspace"],
                                   s["ws_size"], b["ws"], s["rs_size"], b["rs"])
    for pos, bad, text in [("dx", _read_only(outs["dx"]), "read-only"), ("dcx", outs["dcx"].astype(np.float32), "float32"),
                           ("dhx", outs["dhx"][:3], "bytes"), ("rs", s["hd"], "not a data buffer")]:
        _expect(BAD, lambda: call(**{pos: bad}), untouched=[v for k, v in outs.items() if k != pos], argument=pos
                if pos != "rs" else "reserveSpace", text=[text])
    call()
    assert not np.any(outs["dx"] == 7.0)


def test_legacy_rnn_rejected_calls_write_nothing(handle, rng):
    """The v6/v7 calls share the check: RNNForwardTrainingEx with a float32 cy, RNNBackwardWeightsEx with
    a read-only dw."""
    s = _rnn(handle, rng)
    o, net = s["outs"], s["net"]
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wd, F64, cc.CUDNN_TENSOR_NCHW, 3, [net["wsize"] // 8, 1, 1])
    none8 = [None] * 8

    def fwd(cy):
        cc.cudnnRNNForwardTrainingEx(handle, net["desc"], s["xd"], s["x"], s["hd"], s["hx"], s["cd"], s["cx"], wd,
                                     net["wspace"], s["yd"], o["y"], s["hd"], o["hy"], s["cd"], cy, *none8, o["ws"],
                                     s["ws_size"], o["rs"], s["rs_size"])
    _expect(BAD, lambda: fwd(o["cy"].astype(np.float32)), untouched=[o["y"], o["hy"], o["ws"], o["rs"]], argument="cy",
            text=["float32", "CUDNN_DATA_DOUBLE"])
    fwd(o["cy"])
    dw = np.full(net["wsize"] // 8, 0.5)
    ws_before = o["ws"].copy()

    def bwdw(dw_arg):
        cc.cudnnRNNBackwardWeightsEx(handle, net["desc"], s["xd"], s["x"], s["hd"], s["hx"], s["yd"], o["y"], o["ws"],
                                     s["ws_size"], wd, dw_arg, o["rs"], s["rs_size"])
    _expect(BAD, lambda: bwdw(_read_only(dw)), untouched=[o["ws"], o["rs"]], argument="dw", text=["read-only"])
    assert o["ws"].tobytes() == ws_before.tobytes()
    bwdw(dw)
    assert not np.all(dw == 0.5)


def _attention(handle, rng):
    from test_attention import F64 as AF64, GRAD_CONFIGS, Setup
    return Setup(handle, rng, dtype=AF64, **GRAD_CONFIGS["all_projections_biases"])


def test_attention_rejected_outputs_write_nothing(handle, rng):
    s = _attention(handle, rng)
    out = np.full(int(np.prod(s.out_shape)), 7.0)
    reserve = np.full(s.rsize, 0x5A, np.uint8)
    _expect(BAD, lambda: s.forward(reserve=reserve, out=_read_only(out)), untouched=[reserve], argument="out",
            text=["read-only"])
    _expect(BAD, lambda: s.forward(reserve=reserve, out=out.astype(np.float32)), untouched=[reserve], argument="out",
            text=["float32", "CUDNN_DATA_DOUBLE"])
    _expect(BAD, lambda: s.forward(reserve=_read_only(reserve), out=out), untouched=[out], argument="reserveSpace")
    s.forward(reserve=reserve, out=out)
    dout = rng.standard_normal(out.size)
    dq, dk, dv = (np.full(s.bufs[n].size, 7.0) for n in "qkv")

    def bwd(dq, dk, dv):
        cc.cudnnMultiHeadAttnBackwardData(handle, s.attn, s.lo, s.hi, None, None, s.od, dout, s.qd, dq, s.bufs["q"],
                                          s.kd, dk, s.bufs["k"], s.vd, dv, s.bufs["v"], s.wsize, s.wbuf, 0, None,
                                          reserve.nbytes, reserve)
    _expect(BAD, lambda: bwd(dq, _read_only(dk), dv), untouched=[dq, dv, reserve], argument="dkeys", text=["read-only"])
    _expect(BAD, lambda: bwd(dq, dk, s.handle_like()), untouched=[dq, dk], argument="dvalues") if hasattr(s, "handle_like") \
        else _expect(BAD, lambda: bwd(dq, dk, handle), untouched=[dq, dk], argument="dvalues")
    bwd(dq, dk, dv)
    assert not np.any(dq == 7.0)
    dw = np.full_like(s.wbuf, 7.0)

    def bwdw(dw):
        cc.cudnnMultiHeadAttnBackwardWeights(handle, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, s.bufs["q"], s.kd, s.bufs["k"],
                                             s.vd, s.bufs["v"], s.od, dout, s.wsize, s.wbuf, dw, 0, None, reserve.nbytes,
                                             reserve)
    _expect(BAD, lambda: bwdw(_read_only(dw)), untouched=[reserve], argument="dweights", text=["read-only"])
    _expect(BAD, lambda: bwdw(np.resize(dw.astype(np.float32), 2 * dw.size)), untouched=[reserve], argument="dweights",
            text=["float32", "CUDNN_DATA_DOUBLE"])


def test_ctc_rejected_outputs_write_nothing(handle, rng):
    u = rng.standard_normal((6, 2, 5)).astype(np.float32)
    pd = tdesc(u.shape)
    d = cc.cudnnCreateCTCLossDescriptor()
    cc.cudnnSetCTCLossDescriptor_v8(d, F32, cc.CUDNN_LOSS_NORMALIZATION_SOFTMAX, cc.CUDNN_NOT_PROPAGATE_NAN, 3)
    algo = cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC
    ws_size = cc.cudnnGetCTCLossWorkspaceSize_v8(handle, algo, d, pd, pd)
    labels, lab_len, in_len = np.array([1, 2, 3, 4], np.int32), np.array([3, 1], np.int32), np.array([6, 5], np.int32)
    costs, grads, ws = np.full(2, 7.0, np.float32), np.full(u.size, 7.0, np.float32), np.full(max(ws_size, 1), 1, np.uint8)

    def call(costs=costs, grads=grads, ws=ws, probs=u):
        cc.cudnnCTCLoss_v8(handle, algo, d, pd, probs, labels, lab_len, in_len, costs, pd, grads, ws_size, ws)
    for kw, pos, text in [(dict(grads=_read_only(grads)), "gradients", "read-only"),
                          (dict(costs=costs.astype(np.float64)), "costs", "float64"),
                          (dict(probs=u.astype(np.float64)), "probs", "float64"),
                          (dict(ws=tdesc(SHAPE)), "workspace", "not a data buffer"),
                          (dict(grads=grads[:-1]), "gradients", "bytes")]:
        _expect(BAD, lambda: call(**kw), untouched=[costs, grads, ws], argument=pos, text=[text])
    _expect(BAD, lambda: cc.cudnnCTCLoss_v8(handle, algo, d, pd, u, pd, lab_len, in_len, costs, pd, grads, ws_size, ws),
            untouched=[costs, grads], argument="labels")
    call()
    assert not np.any(costs == 7.0) and not np.any(grads == 7.0)


def test_batchnorm_ex_rejected_outputs_write_nothing(handle, rng):
    mode, ops = cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT, cc.CUDNN_BATCHNORM_OPS_BN_ACTIVATION
    xd, pd = tdesc(SHAPE), tdesc((1, 3, 1, 1))
    x = rng.standard_normal(N).astype(np.float32)
    scale, bias = np.ones(3, np.float32), np.zeros(3, np.float32)
    y, rm, rv, sm, si = _poison(), _poison(3), _poison(3), _poison(3), _poison(3)
    act = _act()

    def fwd(y=y, si=si, reserve=None):
        cc.cudnnBatchNormalizationForwardTrainingEx(handle, mode, ops, 1.0, 0.0, xd, x, None, None, xd, y, pd, scale,
                                                    bias, 0.1, rm, rv, 1e-5, sm, si, act, None, 0, reserve, 0)
    outs = [y, rm, rv, sm, si]
    _expect(BAD, lambda: fwd(si=_read_only(si)), untouched=outs, argument="saveInvVariance", text=["read-only"])
    _expect(BAD, lambda: fwd(y=y.astype(np.float64)), untouched=outs, argument="yData", text=["float64"])
    _expect(BAD, lambda: fwd(reserve=tdesc(SHAPE)), untouched=outs, argument="reserveSpace", text=["not a data buffer"])
    _expect(BAD, lambda: fwd(reserve=np.zeros(4, np.uint8).ctypes.data), untouched=outs, argument="reserveSpace")
    fwd(reserve=np.zeros(4, np.float64))
    assert not np.any(y == 7.0)
    dy = rng.standard_normal(N).astype(np.float32)
    dx, ds, db = _poison(), _poison(3), _poison(3)

    def bwd(db=db, bias_data=bias):
        cc.cudnnBatchNormalizationBackwardEx(handle, mode, ops, 1.0, 0.0, 1.0, 0.0, xd, x, xd, y, xd, dy, None, None, xd,
                                             dx, pd, scale, bias_data, ds, db, 1e-5, sm, si, act, None, 0, None, 0)
    _expect(BAD, lambda: bwd(db=_read_only(db)), untouched=[dx, ds], argument="dBnBiasData", text=["read-only"])
    _expect(BAD, lambda: bwd(bias_data=handle), untouched=[dx, ds, db], argument="bnBiasData")
    bwd()
    assert not np.any(dx == 7.0)


def test_normalization_rejected_outputs_write_nothing(handle, rng):
    mode, ops, algo = cc.CUDNN_NORM_PER_CHANNEL, cc.CUDNN_NORM_OPS_NORM, cc.CUDNN_NORM_ALGO_STANDARD
    xd, pd = tdesc(SHAPE), tdesc((1, 3, 1, 1))
    x = rng.standard_normal(N).astype(np.float32)
    scale, bias = np.ones(3, np.float32), np.zeros(3, np.float32)
    y, rm, rv, sm, si = _poison(), _poison(3), _poison(3), _poison(3), _poison(3)

    def fwd(y=y, rm=rm, reserve=None):
        cc.cudnnNormalizationForwardTraining(handle, mode, ops, algo, 1.0, 0.0, xd, x, pd, scale, bias, 0.1, pd, rm, rv,
                                             1e-5, sm, si, None, None, None, xd, y, None, 0, reserve, 0)
    outs = [y, rm, rv, sm, si]
    _expect(BAD, lambda: fwd(rm=_read_only(rm)), untouched=outs, argument="resultRunningMean", text=["read-only"])
    _expect(BAD, lambda: fwd(reserve=handle), untouched=outs, argument="reserveSpace")
    fwd()
    assert not np.any(y == 7.0)


def test_dropout_rejected_output_writes_nothing(handle, rng):
    xd = tdesc((1, 1, 1, 200))
    size, rsz = cc.cudnnDropoutGetStatesSize(handle), cc.cudnnDropoutGetReserveSpaceSize(xd)
    d = cc.cudnnCreateDropoutDescriptor()
    st = np.zeros(size, np.uint8)
    cc.cudnnSetDropoutDescriptor(d, handle, 0.5, st, size, 5)
    x, y, rs = np.ones(200, np.float32), _poison(200), np.full(rsz, 3, np.uint8)
    states = st.copy()
    _expect(BAD, cc.cudnnDropoutForward, handle, d, xd, x, xd, _read_only(y), rs, rsz, untouched=[rs, st], argument="y")
    _expect(BAD, cc.cudnnDropoutForward, handle, d, xd, x, xd, y, _read_only(rs), rsz, untouched=[y, st],
            argument="reserveSpace")
    assert st.tobytes() == states.tobytes()


def test_deferred_calls_check_dtypes_too(handle, rng):
    """Inside cc.fuse() calls are bound when recorded: the same dtype and object rules."""
    d = tdesc(SHAPE)
    x, y = _data(rng), _poison()
    with cc.fuse(handle):
        _expect(BAD, cc.cudnnActivationForward, handle, _act(), 1.0, d, x.astype(np.float64), 0.0, d, y, argument="x",
                text=["float64", "CUDNN_DATA_FLOAT"])
        _expect(BAD, cc.cudnnActivationForward, handle, _act(), 1.0, d, x, 0.0, d, tdesc(SHAPE), argument="y")
        cc.cudnnActivationForward(handle, _act(), 1.0, d, x, 0.0, d, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0))


# -- int pointers the API still reads (CuPy 13's arrays of handles and labels): never a fault ------------

def _pointer_cases(h):
    """(case id, thunk): calls whose int or object argument used to be read as a host address."""
    rd = cc.cudnnCreateRNNDescriptor()
    dd = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnSetDropoutDescriptor(dd, h, 0.0, None, 0, 0)
    cc.cudnnSetRNNDescriptor_v6(h, rd, 3, 1, dd, cc.CUDNN_LINEAR_INPUT, cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_RNN_TANH,
                                cc.CUDNN_RNN_ALGO_STANDARD, F32)
    u = np.zeros((4, 2, 5), np.float32)
    pd = tdesc(u.shape)
    ctc = cc.cudnnCreateCTCLossDescriptor()
    cc.cudnnSetCTCLossDescriptorEx(ctc, F32, cc.CUDNN_LOSS_NORMALIZATION_SOFTMAX, cc.CUDNN_NOT_PROPAGATE_NAN)
    costs, grads = np.zeros(2, np.float32), np.zeros(u.size, np.float32)
    algo = cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC
    out = []
    for name, bad in [("int 5000", 5000), ("int 2**40", 2 ** 40), ("descriptor", tdesc((2, 3, 1))), ("handle", h),
                      ("c_void_p 5000", ctypes.c_void_p(5000 * 4096))]:
        out.append((f"GetRNNWorkspaceSize xDesc={name}", lambda bad=bad: cc.cudnnGetRNNWorkspaceSize(h, rd, 2, bad)))
        out.append((f"CTCLoss hostLabels={name}", lambda bad=bad: cc.cudnnCTCLoss(
            h, pd, u, bad, [1, 1], [4, 4], costs, pd, grads, algo, ctc, None, 0)))
        out.append((f"CTCLoss hostInputLengths={name}", lambda bad=bad: cc.cudnnCTCLoss(
            h, pd, u, [1, 2], [1, 1], bad, costs, pd, grads, algo, ctc, None, 0)))
    return out


def _child_pointers(results_path: str) -> None:
    h = cc.cudnnCreate("cpu")
    with open(results_path, "w") as out:
        for cid, thunk in _pointer_cases(h):
            out.write(json.dumps({"start": cid}) + "\n")
            out.flush()
            try:
                thunk()
                rec = {"case": cid, "status": "no error"}
            except cc.CuDNNError as e:
                rec = {"case": cid, "status": e.status, "text": str(e)}
            except Exception as e:  # noqa: BLE001
                rec = {"case": cid, "status": type(e).__name__, "text": str(e)}
            out.write(json.dumps(rec) + "\n")
            out.flush()


def test_int_pointer_arguments_never_fault(tmp_path):
    """Arrays of descriptor handles and CTC's host label arrays still take CuPy 13's host pointer ints:
    an int that points nowhere, a descriptor or the handle is BAD_PARAM (the memory is probed with
    process_vm_readv / a pipe, never dereferenced blindly).  Run in a child process."""
    results = tmp_path / "pointers.jsonl"
    env = dict(os.environ, CUDNN_COMPAT_DEVICE="cpu", PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]))
    proc = subprocess.run([sys.executable, "-c", f"import test_data_args as t; t._child_pointers({str(results)!r})"],
                          cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=120)
    lines = [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []
    started = [r["start"] for r in lines if "start" in r]
    assert proc.returncode == 0, f"the child died ({proc.returncode}) in {started[-1] if started else None}: {proc.stderr[-2000:]}"
    done = [r for r in lines if "case" in r]
    assert len(done) == 15 and all(r["status"] == BAD for r in done), [r for r in done if r["status"] != BAD]


def test_safe_host_reads():
    """Both probes read what is there and report what is not readable."""
    from cudnn_compat._core.data import _pipe_reader, _vm_reader, read_host
    cells = (ctypes.c_double * 1200)(*range(1200))
    for read in (r for r in (_vm_reader(), _pipe_reader()) if r is not None):
        assert read(ctypes.addressof(cells), ctypes.sizeof(cells)) == bytes(cells)  # over several pipe chunks
        assert read(4096 * 3, 8) is None and read(2 ** 46, 16) is None
        assert read(ctypes.addressof(cells) + 8, 8) == bytes(ctypes.c_double(1.0))
    assert read_host(5000, 8) is None and read_host(0, 8) is None


def test_host_view_is_the_array_itself_only_when_it_already_is_the_view():
    """The CPU place binds an array shaped like its descriptor (dtype, dims, strides) as itself, any
    other accepted buffer through a strided view of the descriptor's layout; the checks come first
    either way (a read-only array the call writes is BAD_PARAM)."""
    import cudnn_compat as cc
    from cudnn_compat._backend.ir import Tensor
    from cudnn_compat._core.data import host_view
    t = Tensor(7, (2, 3, 4), (12, 4, 1), "float32", name="x")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert host_view(a, t, "x") is a
    flat = np.arange(24, dtype=np.float32)
    v = host_view(flat, t, "x")
    assert v is not flat and v.shape == (2, 3, 4) and np.shares_memory(v, flat) and (v == a).all()
    bigger = np.zeros((2, 3, 5), np.float32)[..., :4].copy()  # same shape, packed: itself
    assert host_view(bigger, t, "x") is bigger
    as_bytes = a.view(np.uint8)  # an accepted byte view: a float32 view of it, never the bytes themselves
    v = host_view(as_bytes, t, "x")
    assert v.dtype == np.float32 and v.shape == (2, 3, 4) and (v == a).all()
    t2 = Tensor(8, (2, 3, 4), (1, 2, 6), "float32", name="y")  # a Fortran-order descriptor: a view
    v = host_view(a, t2, "y")
    assert v is not a and v.strides == (4, 8, 24)
    ro = a.copy()
    ro.flags.writeable = False
    assert host_view(ro, t, "x") is ro  # read, not written: fine
    with pytest.raises(cc.CuDNNError) as e:
        host_view(ro, t, "x", written=True)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "read-only" in str(e.value)
