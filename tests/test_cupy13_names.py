"""CuPy 13's names and runtime info (issue 13, item 9).

The expectation comes from ``tests/data/cupy13_cudnn_names.txt``, extracted from CuPy 13.6.0's
``cupy_backends/cuda/libs/cudnn.pyx`` (and the ``cpdef enum`` of its ``cudnn.pxd``) by
``tools/gen_cupy13_names.py`` -- not from our registry:

* every name exists in ``cupy.cuda.cudnn`` (``cudnn_compat.cupy13.cupy_cudnn``) with CuPy 13's value;
* every function exists at the top level of ``cudnn_compat`` with the ``cudnn`` prefix
  (``cudnnSetFilter4dDescriptor_v4``), the two Python helpers (``check_status``,
  ``get_build_version``) and every class and constant under their own names;
* the versioned names take CuPy 13's argument order (the #defines of CuPy 13's cupy_cudnn.h);
* in ``cupy.cuda.cudnn`` alpha/beta-like arguments keep CuPy's int host-pointer convention
  (and data ints on a CPU-place handle are host pointers);
* under the shim ``cupyx.get_runtime_info()`` has CuPy 13's cuDNN rows.
"""
import ctypes
import importlib.util
import pathlib
import sys
import types

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat.cupy13 import cupy_cudnn as L
from cudnn_compat.cupy13 import shim

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "cupy13_cudnn_names.txt"
HELPERS = {"check_status", "get_build_version"}  # Python-level helpers: no C function behind them
BAD, NOT_SUP = 3, 9


def _load():
    out = []
    for line in DATA.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        kind, name, *value = line.split(" ", 2)
        out.append((kind, name, eval(value[0]) if value else None))  # noqa: S307 - repr of ints/floats
    return out


NAMES = _load()
FUNCTIONS = [n for k, n, _ in NAMES if k == "function"]
CLASSES = [n for k, n, _ in NAMES if k == "class"]
CONSTANTS = [(n, v) for k, n, v in NAMES if k == "constant"]


def top_level_name(name: str) -> str:
    return name if name in HELPERS else "cudnn" + name[0].upper() + name[1:]


def test_the_list_is_cupy13s():
    assert len(FUNCTIONS) == 145 and len(set(FUNCTIONS)) == 145
    assert CLASSES == ["CuDNNAlgoPerf", "CuDNNError"]
    assert len(CONSTANTS) == 196
    for n in ("setFilter4dDescriptor_v4", "getConvolutionForwardAlgorithm_v6", "addTensor_v3", "CTCLoss",
              "RNNForwardInferenceEx", "fusedOpsExecute", "get_build_version", "check_status", "queryRuntimeError"):
        assert n in FUNCTIONS
    values = dict(CONSTANTS)
    assert values["CUDNN_DATA_HALF"] == 2 and values["CUDNN_STATUS_RUNTIME_FP_OVERFLOW"] == 13
    assert values["CUDNN_SCALAR_DOUBLE_BN_EPSILON"] == 103 and "CUDNN_BN_MIN_EPSILON" in values


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_in_cupy_cuda_cudnn(name):
    fn = getattr(L, name, None)
    assert callable(fn), name
    assert fn.__module__ == L.__name__


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_at_top_level(name):
    fn = getattr(cc, top_level_name(name), None)
    assert callable(fn), top_level_name(name)


@pytest.mark.parametrize("name", CLASSES)
def test_class(name):
    assert isinstance(getattr(L, name), type) and isinstance(getattr(cc, name), type)
    # the top level's CuDNNError is the library's; CuPy 13's is a subclass of it (both excepts catch it)
    assert issubclass(getattr(L, name), getattr(cc, name))


@pytest.mark.parametrize("name,value", CONSTANTS)
def test_constant_value(name, value):
    assert hasattr(L, name) and hasattr(cc, name), name
    if value is not None:
        assert getattr(L, name) == value and getattr(cc, name) == value, name


def test_generator_rules(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_cupy13_names", ROOT / "tools" / "gen_cupy13_names.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    pyx = "\n".join([
        "cdef extern from 'x.h' nogil:", "    int cudnnFoo(int a)",
        "cpdef size_t createThing() except? 0:", "    pass",
        "cpdef inline check_status(int status):", "cpdef list findAlgo_v7(", "        intptr_t handle):",
        "cpdef int getAlgo_v6(intptr_t h) except? -1:", "def get_build_version():",
        "cdef _setStream(intptr_t handle):", "cdef class CuDNNAlgoPerf:", "class CuDNNError(RuntimeError):",
        "CUDNN_BN_MIN_EPSILON = _CUDNN_BN_MIN_EPSILON", "cpdef _private():", "    x = 1",
    ])
    pxd = "\n".join(["cpdef enum:", "    CUDNN_DATA_FLOAT = 0", "    CUDNN_DATA_HALF = 2  # c", "",
                     "    CUDNN_ALIAS = CUDNN_DATA_HALF", "cdef class CuDNNAlgoPerf:", "    cdef:", "        int algo = 3"])
    got = gen.public_names(pyx, pxd)
    assert got == [("function", "check_status", None), ("function", "createThing", None),
                   ("function", "findAlgo_v7", None), ("function", "getAlgo_v6", None),
                   ("function", "get_build_version", None), ("class", "CuDNNAlgoPerf", None),
                   ("class", "CuDNNError", None), ("constant", "CUDNN_ALIAS", 2), ("constant", "CUDNN_BN_MIN_EPSILON", None),
                   ("constant", "CUDNN_DATA_FLOAT", 0), ("constant", "CUDNN_DATA_HALF", 2)]
    (tmp_path / "a.pyx").write_text(pyx)
    (tmp_path / "a.pxd").write_text(pxd)
    out = tmp_path / "out.txt"
    import subprocess
    text = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_cupy13_names.py"), str(tmp_path / "a.pyx"),
                           str(tmp_path / "a.pxd")], capture_output=True, text=True, check=True).stdout
    out.write_text(text)
    assert "function findAlgo_v7\n" in text and "constant CUDNN_DATA_HALF 2\n" in text
    assert "_setStream" not in text and "cudnnFoo" not in text and "_private" not in text


# -- the versioned names: CuPy 13's argument order ---------------------------------------------------

@pytest.fixture
def h():
    handle = cc.cudnnCreate("cpu")
    yield handle
    cc.cudnnDestroy(handle)


_KEEP = []


def ptr(value, dtype=np.float32) -> int:
    """A host pointer int to ``value``, as CuPy callers made them (np.array(v).ctypes.data)."""
    a = np.array(value, dtype)
    _KEEP.append(a)
    return a.ctypes.data


def iptr(*v) -> int:
    return ptr(list(v), np.int32)


def _t(*dims, dt=cc.CUDNN_DATA_FLOAT):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, dt, *dims)
    return d


def test_set_filter_v4_order():
    f = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor_v4(f, cc.CUDNN_DATA_HALF, cc.CUDNN_TENSOR_NHWC, 8, 3, 5, 7)
    assert cc.cudnnGetFilter4dDescriptor(f) == (cc.CUDNN_DATA_HALF, cc.CUDNN_TENSOR_NHWC, 8, 3, 5, 7)
    L.setFilter4dDescriptor_v4(f, L.CUDNN_DATA_DOUBLE, L.CUDNN_TENSOR_NCHW, 2, 4, 1, 3)
    assert cc.cudnnGetFilter4dDescriptor(f) == (cc.CUDNN_DATA_DOUBLE, cc.CUDNN_TENSOR_NCHW, 2, 4, 1, 3)
    cc.cudnnSetFilterNdDescriptor_v4(f, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, 5, [4, 2, 3, 3, 1])
    dt, fmt, nb, dims = cc.cudnnGetFilterNdDescriptor(f, 5)
    assert (dt, fmt, nb, tuple(dims)) == (cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, 5, (4, 2, 3, 3, 1))
    L.setFilterNdDescriptor_v4(f, L.CUDNN_DATA_FLOAT, L.CUDNN_TENSOR_NCHW, 4, iptr(6, 5, 4, 3))
    assert L.getFilterNdDescriptor(f, 4) == (L.CUDNN_DATA_FLOAT, L.CUDNN_TENSOR_NCHW, 4, (6, 5, 4, 3))


def test_pooling_and_convolution_setters_v3_v4_v5():
    p = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor_v4(p, cc.CUDNN_POOLING_MAX, cc.CUDNN_PROPAGATE_NAN, 3, 2, 1, 0, 2, 1)
    assert tuple(cc.cudnnGetPooling2dDescriptor(p)) == (cc.CUDNN_POOLING_MAX, cc.CUDNN_PROPAGATE_NAN, 3, 2, 1, 0, 2, 1)
    cc.cudnnSetPoolingNdDescriptor_v4(p, cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, cc.CUDNN_NOT_PROPAGATE_NAN,
                                      2, [2, 3], [1, 0], [1, 2])
    assert tuple(cc.cudnnGetPooling2dDescriptor(p)) == (cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                                                        cc.CUDNN_NOT_PROPAGATE_NAN, 2, 3, 1, 0, 1, 2)
    c = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor_v5(c, 1, 2, 3, 4, 1, 2, cc.CUDNN_CONVOLUTION, cc.CUDNN_DATA_DOUBLE)
    assert tuple(cc.cudnnGetConvolution2dDescriptor(c)) == (1, 2, 3, 4, 1, 2, cc.CUDNN_CONVOLUTION, cc.CUDNN_DATA_DOUBLE)
    cc.cudnnSetConvolutionNdDescriptor_v3(c, 3, [0, 1, 2], [1, 2, 1], [2, 1, 1], cc.CUDNN_CROSS_CORRELATION,
                                          cc.CUDNN_DATA_FLOAT)
    nb, pads, strides, dil, mode, dt = cc.cudnnGetConvolutionNdDescriptor(c, 3)
    assert (nb, tuple(pads), tuple(strides), tuple(dil), mode, dt) == (
        3, (0, 1, 2), (1, 2, 1), (2, 1, 1), cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    for fn in (cc.cudnnSetConvolution2dDescriptor_v4, L.setConvolution2dDescriptor_v4):  # CuPy 13 on cuDNN >= 7
        with pytest.raises(cc.CuDNNError) as e:
            fn(c, 1, 1, 1, 1, 1, 1, cc.CUDNN_CONVOLUTION)
        assert e.value.status == NOT_SUP and "cudnnSetConvolution2dDescriptor_v4" in str(e.value)


def _conv_problem():
    x, y = _t(2, 3, 6, 6), _t(2, 4, 6, 6)
    w = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(w, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, 4, 3, 3, 3)
    c = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(c, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    return x, w, c, y


@pytest.mark.parametrize("pref", [0, 1])
def test_get_algorithm_v6_is_the_cudnn7_heuristic(h, pref):
    x, w, c, y = _conv_problem()
    cases = [
        (cc.cudnnGetConvolutionForwardAlgorithm_v6, L.getConvolutionForwardAlgorithm_v6,
         cc.cudnnGetConvolutionForwardAlgorithm, (x, w, c, y), cc.cudnnGetConvolutionForwardWorkspaceSize),
        (cc.cudnnGetConvolutionBackwardDataAlgorithm_v6, L.getConvolutionBackwardDataAlgorithm_v6,
         cc.cudnnGetConvolutionBackwardDataAlgorithm, (w, y, c, x), cc.cudnnGetConvolutionBackwardDataWorkspaceSize),
        (cc.cudnnGetConvolutionBackwardFilterAlgorithm_v6, L.getConvolutionBackwardFilterAlgorithm_v6,
         cc.cudnnGetConvolutionBackwardFilterAlgorithm, (x, y, c, w), cc.cudnnGetConvolutionBackwardFilterWorkspaceSize),
    ]
    for v6, cupy_v6, v7, descs, ws in cases:
        algo = v6(h, *descs, pref, 0)
        assert algo == cupy_v6(h, *descs, pref, 0) == v7(h, *descs, pref, 0)
        assert 0 <= algo < 8
        if pref == 0:  # NO_WORKSPACE
            assert ws(h, *descs, algo) == 0
    with pytest.raises(cc.CuDNNError) as e:  # the preference is the 6th argument, as in CuPy 13
        cc.cudnnGetConvolutionForwardAlgorithm_v6(h, x, w, c, y, 7, 0)
    assert e.value.status == BAD and e.value.argument == "preference"
    with pytest.raises(cc.CuDNNError) as e:  # and descriptors in CuPy's order: (src, filter, conv, dest)
        cc.cudnnGetConvolutionForwardAlgorithm_v6(h, w, x, c, y, 0, 0)
    assert e.value.status == BAD


def test_find_ex_v7_and_dropout_size(h):
    x, w, c, y = _conv_problem()
    xs, ws, ys = np.ones((2, 3, 6, 6), np.float32), np.ones((4, 3, 3, 3), np.float32), np.zeros((2, 4, 6, 6), np.float32)
    perf = cc.cudnnFindConvolutionForwardAlgorithmEx_v7(h, x, xs, w, ws, c, y, ys, 3, None, 0)
    assert perf and perf[0].status == 0 and perf[0].memory == 0
    np.testing.assert_allclose(ys[0, 0, 2, 2], 27.0)
    lperf = L.findConvolutionForwardAlgorithmEx_v7(h, x, xs.ctypes.data, w, ws.ctypes.data, c, y, ys.ctypes.data, 3, 0, 0)
    assert len(lperf) == len(perf) == 3  # the 3 fastest: which ones may differ between two timings
    assert all(p.status == 0 and p.memory == 0 and p.mathType == perf[0].mathType for p in lperf)
    assert cc.cudnnGetDropoutReserveSpaceSize(x) == cc.cudnnDropoutGetReserveSpaceSize(x) == L.getDropoutReserveSpaceSize(x) > 0


def test_compute_names_v3_v4(h):
    t = _t(1, 2, 2, 3)
    a = np.arange(12, dtype=np.float32) - 6
    c = np.ones(12, np.float32)
    cc.cudnnAddTensor_v3(h, 2.0, t, a, 0.5, t, c)
    np.testing.assert_allclose(c, 2 * a + 0.5)
    y = np.full(12, 9, np.float32)
    act = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(act, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    cc.cudnnActivationForward_v4(h, act, 1.0, t, a, 0.0, t, y)
    np.testing.assert_array_equal(y, np.maximum(a, 0))
    dx = np.zeros(12, np.float32)
    cc.cudnnActivationBackward_v4(h, act, 1.0, t, y, t, np.ones(12, np.float32), t, a, 0.0, t, dx)
    np.testing.assert_array_equal(dx, (a > 0).astype(np.float32))
    assert cc.check_status(0) is None and cc.get_build_version() == L.get_build_version() == 8907
    with pytest.raises(L.CuDNNError) as e:
        cc.check_status(BAD)
    assert str(e.value) == "cuDNN Error: CUDNN_STATUS_BAD_PARAM"


# -- alpha/beta: CuPy's int host pointers in cupy.cuda.cudnn ---------------------------------------

@pytest.mark.parametrize("dt,np_dt", [(cc.CUDNN_DATA_FLOAT, np.float32), (cc.CUDNN_DATA_DOUBLE, np.float64)])
def test_scalar_pointers_in_several_functions(h, dt, np_dt):
    """alpha/beta as host pointer ints (to float; to double for double data) in several functions
    and argument positions; small ints are values (alpha=1, beta=0), as before."""
    t = _t(1, 2, 2, 3, dt=dt)
    x = (np.arange(12) - 6).astype(np_dt)
    two, half, zero = ptr(2.0, np_dt), ptr(0.5, np_dt), ptr(0.0, np_dt)
    # addTensor_v3(handle, alpha, aDesc, A, beta, cDesc, C)
    c = np.ones(12, np_dt)
    L.addTensor_v3(h, two, t, x.ctypes.data, half, t, c.ctypes.data)
    np.testing.assert_allclose(c, 2 * x + 0.5)
    c = np.ones(12, np_dt)
    L.addTensor_v3(h, 1, t, x, 0, t, c)  # plain small ints: values
    np.testing.assert_allclose(c, x)
    # scaleTensor(handle, yDesc, y, alpha) and setTensor(handle, yDesc, y, valuePtr)
    y = x.copy()
    L.scaleTensor(h, t, y.ctypes.data, two)
    np.testing.assert_allclose(y, 2 * x)
    L.setTensor(h, t, y.ctypes.data, ptr(3.25, np_dt))
    np.testing.assert_allclose(y, 3.25)
    # opTensor(handle, desc, alpha1, aDesc, A, alpha2, bDesc, B, beta, cDesc, C)
    op = L.createOpTensorDescriptor()
    L.setOpTensorDescriptor(op, L.CUDNN_OP_TENSOR_ADD, dt, L.CUDNN_NOT_PROPAGATE_NAN)
    c = np.ones(12, np_dt)
    L.opTensor(h, op, two, t, x.ctypes.data, half, t, x.ctypes.data, two, t, c.ctypes.data)
    np.testing.assert_allclose(c, 2 * x + 0.5 * x + 2)
    # activationForward_v4(handle, desc, alpha, xDesc, x, beta, yDesc, y)
    act = L.createActivationDescriptor()
    L.setActivationDescriptor(act, L.CUDNN_ACTIVATION_RELU, L.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    y = np.full(12, 5, np_dt)
    L.activationForward_v4(h, act, two, t, x.ctypes.data, zero, t, y.ctypes.data)
    np.testing.assert_allclose(y, 2 * np.maximum(x, 0))
    # softmaxForward(handle, algo, mode, alpha, xDesc, x, beta, yDesc, y)
    y = np.full(12, 5, np_dt)
    L.softmaxForward(h, L.CUDNN_SOFTMAX_ACCURATE, L.CUDNN_SOFTMAX_MODE_INSTANCE, half, t, x.ctypes.data, zero, t,
                     y.ctypes.data)
    e = np.exp(x - x.max())
    np.testing.assert_allclose(y, 0.5 * e / e.sum(), rtol=1e-5)
    # batchNormalizationBackward(handle, mode, alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff, ...)
    bn = _t(1, 2, 1, 1, dt=dt)
    xx = np.random.default_rng(0).standard_normal(12).astype(np_dt)
    dy = np.random.default_rng(1).standard_normal(12).astype(np_dt)
    scale, dscale, dbias = np.ones(2, np_dt), np.zeros(2, np_dt), np.zeros(2, np_dt)
    dx1, dx2 = np.zeros(12, np_dt), np.zeros(12, np_dt)
    L.batchNormalizationBackward(h, L.CUDNN_BATCHNORM_SPATIAL, 1, 0, 1, 0, t, xx.ctypes.data, t, dy.ctypes.data, t,
                                 dx1.ctypes.data, bn, scale.ctypes.data, dscale.ctypes.data, dbias.ctypes.data, 1e-5, 0, 0)
    d1, b1 = dscale.copy(), dbias.copy()
    L.batchNormalizationBackward(h, L.CUDNN_BATCHNORM_SPATIAL, two, zero, half, zero, t, xx.ctypes.data, t,
                                 dy.ctypes.data, t, dx2.ctypes.data, bn, scale.ctypes.data, dscale.ctypes.data,
                                 dbias.ctypes.data, 1e-5, 0, 0)
    tol = 1e-5 if np_dt is np.float32 else 1e-12
    np.testing.assert_allclose(dx2, 2 * dx1, rtol=tol, atol=tol)
    np.testing.assert_allclose(dscale, 0.5 * d1, rtol=tol, atol=tol)
    np.testing.assert_allclose(dbias, 0.5 * b1, rtol=tol, atol=tol)


def test_keyword_scalar_pointer(h):
    t = _t(1, 1, 1, 4)
    x, y = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    L.addTensor_v3(h, alpha=ptr(3.0), aDesc=t, A_data=x, beta=0, cDesc=t, C_data=y)
    np.testing.assert_allclose(y, 3 * x)


def test_which_parameters_convert():
    """The scalar positions come from the parameter names, the data positions from the C kinds."""
    for name, scalars in (("convolutionForward", (1, 10)), ("addTensor_v3", (1, 4)), ("opTensor", (2, 5, 8)),
                          ("batchNormalizationBackward", (2, 3, 4, 5)), ("setTensor", (3,)), ("scaleTensor", (3,)),
                          ("spatialTfSamplerBackward", (2, 5, 8, 12)),
                          ("convolutionBiasActivationForward", (1, 10))):
        c_name = L._target(name)
        plan = L._pointer_params(c_name, cc.LEGACY[c_name])
        assert plan[0] == scalars, name
    plan = L._pointer_params("cudnnConvolutionForward", cc.LEGACY["cudnnConvolutionForward"])
    assert plan[1] == (3, 5, 8, 12) and plan[2] == 0  # x, w, workSpace, y; the handle first
    plan = L._pointer_params("cudnnCTCLoss", cc.LEGACY["cudnnCTCLoss"])
    assert plan[1] == (2, 6, 8, 11)  # probs, costs, gradients, workspace; host label arrays stay ints
    assert L._pointer_params("cudnnSetLRNDescriptor", cc.LEGACY["cudnnSetLRNDescriptor"]) is None  # lrnAlpha: a double


def test_data_ints_convert_on_cpu_handles_only(h):
    plan = L._pointer_params("cudnnAddTensor", cc.LEGACY["cudnnAddTensor"])
    convert = L._converter(plan)
    p = ptr(1.0)
    args, _ = convert((h, p, 7, p, 0, 7, p), {})
    assert [type(a).__name__ for a in args] == ["Handle", "c_void_p", "int", "c_void_p", "int", "int", "c_void_p"]
    assert args[1].value == p and args[4] == 0
    fake_gpu = types.SimpleNamespace()  # not a CPU handle: data ints stay (device pointers), scalars convert
    args, _ = convert((fake_gpu, p, 7, p, 0, 7, p), {})
    assert [type(a).__name__ for a in args] == ["SimpleNamespace", "c_void_p", "int", "int", "int", "int", "int"]


def test_rnn_data_padding_fill_is_read_by_data_type():
    d = L.createRNNDataDescriptor()
    for dt, np_dt in ((L.CUDNN_DATA_FLOAT, np.float32), (L.CUDNN_DATA_DOUBLE, np.float64), (L.CUDNN_DATA_HALF, np.float16)):
        L.setRNNDataDescriptor(d, dt, L.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, 4, 2, 3, iptr(4, 2), ptr(-2.5, np_dt))
        assert cc.cudnnGetRNNDataDescriptor(d, 2)[-1] == -2.5
    L.setRNNDataDescriptor(d, L.CUDNN_DATA_FLOAT, L.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, 4, 2, 3, iptr(4, 2), 0)
    assert cc.cudnnGetRNNDataDescriptor(d, 2)[-1] in (None, 0, 0.0)


# -- cupyx.get_runtime_info() ---------------------------------------------------------------------

@pytest.fixture
def shimmed():
    shim.remove_import_hook()
    shim.install_cupy_shim(allow_stub=True)
    if sys.modules.get("cupy.cuda.cudnn") is not L:
        shim.uninstall_cupy_shim()
        pytest.skip("the installed CuPy has its own cupy.cuda.cudnn")
    yield
    shim.uninstall_cupy_shim()


def _rows(text):
    return {ln.split(":", 1)[0].rstrip(): ln.split(": ", 1)[1] for ln in text.splitlines() if ": " in ln}


def test_runtime_info_has_cupy13s_cudnn_rows(shimmed):
    import cupyx
    info = cupyx.get_runtime_info()
    assert info.cudnn_build_version == 8907 and info.cudnn_version == 8907
    text = str(info)
    rows = _rows(text)
    assert rows["cuDNN Build Version"] == "8907" and rows["cuDNN Version"] == "8907"
    widths = {ln.index(": ") for ln in text.splitlines() if ": " in ln}
    assert len(widths) == 1  # aligned as CuPy aligns its records


def test_runtime_info_shows_the_error_of_get_version(shimmed, monkeypatch):
    import cupyx

    def broken():
        raise L.CuDNNError(L.CUDNN_STATUS_NOT_INITIALIZED)
    monkeypatch.setattr(L, "getVersion", broken)
    info = cupyx.get_runtime_info()
    assert info.cudnn_version == "CuDNNError('cuDNN Error: CUDNN_STATUS_NOT_INITIALIZED')"  # CuPy 13: repr(e)
    assert _rows(str(info))["cuDNN Version"] == "CuDNNError('cuDNN Error: CUDNN_STATUS_NOT_INITIALIZED')"
    assert info.cudnn_build_version == 8907


class _Cupy14RuntimeInfo:
    """What CuPy 14's cupyx/_runtime.py prints: records '{:width}: {}' and no cuDNN rows."""

    def __init__(self, *, full=True):
        self.full = full

    def __str__(self):
        records = [("OS", "Linux"), ("CuPy Version", "14.2.0"), ("Cython Runtime Version", None),
                   ("Jitify Build Version", "x"), ("NCCL Build Version", None), ("NCCL Runtime Version", None),
                   ("cuTENSOR Version", None), ("Device 0 Name", "H100")]
        width = max(len(r[0]) for r in records) + 2
        return "".join(("{:" + str(width) + "}: {}\n").format(k, v) for k, v in records)


def test_cupy14_runtime_module_is_patched_and_restored(monkeypatch):
    rt = types.ModuleType("cupyx._runtime")
    rt._RuntimeInfo = _Cupy14RuntimeInfo
    rt.get_runtime_info = lambda *, full=True: rt._RuntimeInfo(full=full)
    monkeypatch.setitem(sys.modules, "cupyx._runtime", rt)
    shim.remove_import_hook()
    shim.install_cupy_shim(allow_stub=True)
    try:
        if sys.modules.get("cupy.cuda.cudnn") is not L:
            pytest.skip("the installed CuPy has its own cupy.cuda.cudnn")
        assert rt._RuntimeInfo is not _Cupy14RuntimeInfo and issubclass(rt._RuntimeInfo, _Cupy14RuntimeInfo)
        info = rt.get_runtime_info(full=False)
        assert info.full is False and info.cudnn_build_version == 8907
        lines = str(info).splitlines()
        labels = [ln.split(":")[0].rstrip() for ln in lines]
        i = labels.index("NCCL Build Version")
        assert labels[i - 2:i] == ["cuDNN Build Version", "cuDNN Version"]  # where CuPy 13 printed them
        assert lines[i - 2] == f"{'cuDNN Build Version':24}: 8907" and lines[i - 1] == f"{'cuDNN Version':24}: 8907"
    finally:
        shim.uninstall_cupy_shim()
    assert rt._RuntimeInfo is _Cupy14RuntimeInfo
    assert "cuDNN" not in str(rt.get_runtime_info())


def test_insert_rows_keeps_existing_rows():
    text = "OS            : x\ncuDNN Version : 1\n"
    assert shim.insert_rows(text, [("cuDNN Version", 2)]) == text
    assert shim.insert_rows("A : 1\n", [("cuDNN Version", 2)]) == "A              : 1\ncuDNN Version  : 2\n"
