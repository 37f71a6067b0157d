"""The CuPy 13 drop-in (issue 8): ``cudnn_compat.cupy13.shim`` registering ``cupy.cuda.cudnn``,
``cupyx.cudnn``, ``cupy.cudnn`` and ``cupy.cuda.cudnn_enabled``; the low-level module
``cudnn_compat.cupy13.cupy_cudnn`` (CuPy 13's names, pointer arguments, constants, CuDNNError,
CuDNNAlgoPerf); the high-level helpers ``cudnn_compat.cupy13.cupyx_cudnn`` on NumPy arrays (CPU place)
against formulas written here; and, on a GPU, the same calls with CuPy arrays against direct
calls, the CPU reference and the real legacy libcudnn.
"""
import ctypes
import importlib
import itertools
import math
import pickle
import sys
import types
import warnings

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat.cupy13 import cupy_cudnn as L
from cudnn_compat.cupy13 import cupyx_cudnn as X
from cudnn_compat.cupy13 import shim

BAD_PARAM, NOT_SUPPORTED = 3, 9

# CuPy 13.6's cupy_backends/cuda/libs/cudnn.pyx, every public function
CUPY13_FUNCTIONS = """
check_status get_build_version getVersion queryRuntimeError create destroy setStream getStream
createTensorDescriptor setTensor4dDescriptor setTensor4dDescriptorEx getTensor4dDescriptor setTensorNdDescriptor
destroyTensorDescriptor addTensor_v3 createOpTensorDescriptor setOpTensorDescriptor getOpTensorDescriptor
destroyOpTensorDescriptor opTensor createReduceTensorDescriptor setReduceTensorDescriptor getReduceTensorDescriptor
destroyReduceTensorDescriptor getReductionIndicesSize getReductionWorkspaceSize reduceTensor setTensor scaleTensor
createFilterDescriptor setFilter4dDescriptor_v4 setFilterNdDescriptor_v4 getFilterNdDescriptor
destroyFilterDescriptor createConvolutionDescriptor setConvolutionMathType getConvolutionMathType
setConvolutionGroupCount getConvolutionGroupCount setConvolution2dDescriptor_v4 setConvolution2dDescriptor_v5
setConvolutionNdDescriptor_v3 destroyConvolutionDescriptor findConvolutionForwardAlgorithm
findConvolutionForwardAlgorithmEx findConvolutionForwardAlgorithmEx_v7 getConvolutionForwardAlgorithm_v6
getConvolutionForwardAlgorithm_v7 getConvolutionForwardWorkspaceSize convolutionForward convolutionBackwardBias
findConvolutionBackwardFilterAlgorithm findConvolutionBackwardFilterAlgorithmEx
findConvolutionBackwardFilterAlgorithmEx_v7 getConvolutionBackwardFilterAlgorithm_v6
getConvolutionBackwardFilterAlgorithm_v7 getConvolutionBackwardFilterWorkspaceSize convolutionBackwardFilter_v3
findConvolutionBackwardDataAlgorithm findConvolutionBackwardDataAlgorithmEx findConvolutionBackwardDataAlgorithmEx_v7
getConvolutionBackwardDataAlgorithm_v6 getConvolutionBackwardDataAlgorithm_v7 getConvolutionBackwardDataWorkspaceSize
convolutionBackwardData_v3 createPoolingDescriptor setPooling2dDescriptor_v4 setPoolingNdDescriptor_v4
destroyPoolingDescriptor poolingForward poolingBackward deriveBNTensorDescriptor batchNormalizationForwardTraining
batchNormalizationForwardInference batchNormalizationBackward batchNormalizationForwardTrainingEx
getBatchNormalizationForwardTrainingExWorkspaceSize batchNormalizationBackwardEx
getBatchNormalizationBackwardExWorkspaceSize getBatchNormalizationTrainingExReserveSpaceSize
createActivationDescriptor setActivationDescriptor destroyActivationDescriptor softmaxForward softmaxBackward
activationForward_v4 activationBackward_v4 createDropoutDescriptor destroyDropoutDescriptor dropoutGetStatesSize
setDropoutDescriptor getDropoutReserveSpaceSize dropoutForward dropoutBackward createCTCLossDescriptor
destroyCTCLossDescriptor setCTCLossDescriptor getCTCLossDescriptor getCTCLossWorkspaceSize CTCLoss
createRNNDescriptor destroyRNNDescriptor createPersistentRNNPlan setPersistentRNNPlan destroyPersistentRNNPlan
setRNNDescriptor_v5 setRNNDescriptor_v6 setRNNPaddingMode getRNNPaddingMode createRNNDataDescriptor
destroyRNNDataDescriptor setRNNDataDescriptor getRNNDataDescriptor getRNNWorkspaceSize getRNNTrainingReserveSize
getRNNParamsSize getRNNLinLayerMatrixParams getRNNLinLayerBiasParams RNNForwardInference RNNForwardTraining
RNNBackwardData RNNBackwardWeights RNNForwardInferenceEx RNNForwardTrainingEx RNNBackwardDataEx RNNBackwardWeightsEx
createSpatialTransformerDescriptor destroySpatialTransformerDescriptor setSpatialTransformerDescriptor
spatialTfGridGeneratorForward spatialTfGridGeneratorBackward spatialTfSamplerForward spatialTfSamplerBackward
createFusedOpsConstParamPack destroyFusedOpsConstParamPack setFusedOpsConstParamPackAttribute
getFusedOpsConstParamPackAttribute createFusedOpsVariantParamPack destroyFusedOpsVariantParamPack
setFusedOpsVariantParamPackAttribute getFusedOpsVariantParamPackAttribute createFusedOpsPlan destroyFusedOpsPlan
makeFusedOpsPlan fusedOpsExecute
""".split()

# CuPy 13.6's cupyx/cudnn.pyx, public helpers and classes
CUPY13_HELPERS = """
get_handle reset_handles get_max_workspace_size set_max_workspace_size Descriptor get_data_type
create_tensor_descriptor create_uninitialized_tensor_descriptor create_tensor_nd_descriptor create_filter_descriptor
create_convolution_descriptor create_pooling_descriptor create_activation_descriptor create_dropout_descriptor
set_dropout_descriptor create_rnn_descriptor get_rnn_lin_layer_matrix_params get_rnn_lin_layer_bias_params
rnn_forward_inference rnn_forward_training rnn_backward_data rnn_backward_weights rnn_forward_inference_ex
rnn_forward_training_ex rnn_backward_data_ex rnn_backward_weights_ex activation_forward activation_backward
softmax_forward softmax_backward ctc_loss create_dropout_states create_spatial_transformer_descriptor add_tensor
create_op_tensor_descriptor create_reduce_tensor_descriptor is_tensor_core_available DropoutStates
convolution_forward convolution_backward_filter convolution_backward_data pooling_forward pooling_backward
batch_normalization_forward_training batch_normalization_forward_training_ex batch_normalization_forward_inference
batch_normalization_backward create_fused_ops_plan create_fused_ops_const_param_pack make_fused_ops_plan
create_fused_ops_variant_param_pack fused_ops_execute set_fused_ops_const_param_pack_attribute
get_fused_ops_const_param_pack_attribute set_fused_ops_variant_param_pack_attribute
get_fused_ops_variant_param_pack_attribute _get_algorithm_fwd _find_algorithm_fwd _get_algorithm_bwd_filter
_find_algorithm_bwd_filter _get_algorithm_bwd_data _find_algorithm_bwd_data _algorithm_fwd_cache
_get_algorithm_fwd_cache _create_tensor_descriptor _create_tensor_nd_descriptor _create_filter_descriptor
""".split()


@pytest.fixture
def cpu_place(monkeypatch):
    monkeypatch.setenv("CUDNN_COMPAT_DEVICE", "cpu")


@pytest.fixture
def shimmed():
    """The shim installed (with the stand-in namespace where CuPy is absent), undone afterwards;
    skips where the installed CuPy still has its own cuDNN modules (CuPy <= 13)."""
    shim.remove_import_hook()
    shim.install_cupy_shim(allow_stub=True)
    if sys.modules.get("cupy.cuda.cudnn") is not L:
        shim.uninstall_cupy_shim()
        pytest.skip("the installed CuPy has its own cupy.cuda.cudnn")
    yield
    shim.uninstall_cupy_shim()


@pytest.fixture
def handle():
    h = L.create("cpu")
    yield h
    L.destroy(h)


def _has_real_cupy() -> bool:
    if shim.is_stub():
        return False
    try:
        importlib.import_module("cupy")
    except ImportError:
        return False
    return True


_ALIVE = []  # the int arrays whose addresses tests pass outlive the calls, as CuPy's C++ vectors did


def ints(*v):
    a = np.array(v, np.int32)
    _ALIVE.append(a)
    return a


def close(got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    assert err <= tol * max(1.0, float(np.max(np.abs(want))) if want.size else 1.0), err


# -- the shim ---------------------------------------------------------------------------------------

def test_shim_registers_the_cupy13_modules(shimmed):
    low = importlib.import_module("cupy.cuda.cudnn")
    assert low is L and importlib.import_module("cupy_backends.cuda.libs.cudnn") is L
    assert importlib.import_module("cupyx.cudnn") is X
    cupy = sys.modules["cupy"]
    assert cupy.cuda.cudnn is L and cupy.cuda.cudnn_enabled is True
    assert sys.modules["cupyx"].cudnn is X
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("cupy.cudnn")
        assert old.convolution_forward is X.convolution_forward
    assert any(issubclass(w.category, DeprecationWarning) and "cupyx.cudnn" in str(w.message) for w in caught)
    # installing twice changes nothing
    assert shim.install_cupy_shim(allow_stub=True) == []


def test_without_cupy_nothing_is_registered_unless_asked():
    if _has_real_cupy():
        pytest.skip("CuPy is installed here")
    before = {k for k in sys.modules if k.split(".")[0] in ("cupy", "cupyx", "cupy_backends")}
    with pytest.warns(shim.CupyShimWarning) as rec:  # issue 23 item 7: not silently
        assert shim.install_cupy_shim() == []
    assert len(rec) == 1 and rec[0].filename == __file__  # points at the caller
    msg = str(rec[0].message)
    for words in ("CuPy cannot be imported (ModuleNotFoundError: No module named 'cupy')", "no module was registered",
                  "pip install 'cudnn-compat[cuda12]'", "allow_stub=True", "CUDNN_COMPAT_SHIM=stub"):
        assert words in msg, (words, msg)
    assert {k for k in sys.modules if k.split(".")[0] in ("cupy", "cupyx", "cupy_backends")} == before
    shim.install_cupy_shim(allow_stub=True)
    try:
        stub = sys.modules["cupy"]
        assert shim.is_stub() and stub.cuda.is_available() is False
        with pytest.raises(AttributeError, match="stand-in"):
            stub.ndarray  # noqa: B018
    finally:
        shim.uninstall_cupy_shim()
    assert "cupy" not in sys.modules and "cupy.cuda.cudnn" not in sys.modules


def _fake_cupy(monkeypatch, own: dict):
    """A CuPy-shaped package tree in sys.modules; ``own`` maps the cuDNN module names it provides
    to their ``available`` flag.  monkeypatch restores sys.modules afterwards."""
    names = ["cupy", "cupy.cuda", "cupyx", "cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs"]
    for name in set(names) | set(shim.NAMES):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for name in names:
        mod = types.ModuleType(name)
        mod.__path__ = []
        monkeypatch.setitem(sys.modules, name, mod)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)
    for name, available in own.items():
        mod = types.ModuleType(name)
        mod.available = available
        monkeypatch.setitem(sys.modules, name, mod)
    return sys.modules


def test_cupy_that_has_its_own_cudnn_is_left_alone(monkeypatch):
    shim.remove_import_hook()
    mods = _fake_cupy(monkeypatch, {n: True for n in shim.NAMES})
    own = {n: mods[n] for n in shim.NAMES}
    assert shim.install_cupy_shim() == []
    assert all(sys.modules[n] is own[n] for n in shim.NAMES)
    assert not hasattr(mods["cupy.cuda"], "cudnn_enabled")
    shim.uninstall_cupy_shim()


def test_cupy14_without_cudnn_gets_the_modules_and_uninstall_restores(monkeypatch):
    shim.remove_import_hook()
    mods = _fake_cupy(monkeypatch, {})
    got = shim.install_cupy_shim()
    assert sorted(got) == sorted(shim.NAMES)
    assert sys.modules["cupy.cuda.cudnn"] is L and mods["cupy.cuda"].cudnn is L
    assert mods["cupy.cuda"].cudnn_enabled is True and mods["cupyx"].cudnn is X
    shim.uninstall_cupy_shim()
    assert all(n not in sys.modules for n in shim.NAMES)
    assert not hasattr(mods["cupy.cuda"], "cudnn") and not hasattr(mods["cupy.cuda"], "cudnn_enabled")


def test_cupy13_whose_libcudnn_failed_to_load_is_replaced_and_force_replaces_all(monkeypatch):
    shim.remove_import_hook()
    _fake_cupy(monkeypatch, {"cupy.cuda.cudnn": False, "cupyx.cudnn": True, "cupy.cudnn": True,
                             "cupy_backends.cuda.libs.cudnn": True})
    assert shim.install_cupy_shim() == ["cupy.cuda.cudnn"]
    assert sorted(shim.install_cupy_shim(force=True)) == sorted(shim.NAMES)
    shim.uninstall_cupy_shim()
    assert sys.modules["cupy.cuda.cudnn"].available is False  # CuPy's own module is back


def test_pth_line_installs_the_lazy_hook_only_when_opted_in(monkeypatch):
    shim.remove_import_hook()
    if _has_real_cupy() and shim._cupy_has("cupy.cuda.cudnn"):
        pytest.skip("the installed CuPy has its own cupy.cuda.cudnn")
    monkeypatch.delenv(shim.ENV, raising=False)
    exec(shim.PTH_LINE, {})
    assert not any(isinstance(f, shim._Finder) for f in sys.meta_path)
    monkeypatch.setenv(shim.ENV, "stub")
    exec(shim.PTH_LINE, {})
    try:
        assert sum(isinstance(f, shim._Finder) for f in sys.meta_path) == 1
        assert not any(n in sys.modules for n in shim.NAMES)  # lazy: nothing registered yet
        mod = importlib.import_module("cupy.cuda.cudnn")
        assert mod is L and importlib.import_module("cupyx.cudnn") is X
    finally:
        shim.remove_import_hook()
        shim.uninstall_cupy_shim()
    assert not any(n in sys.modules for n in shim.NAMES)


def test_install_shim_command_writes_and_removes_the_pth(tmp_path, capsys):
    from cudnn_compat.tools.cli import main
    assert main(["install-shim", "--dir", str(tmp_path)]) == 0
    pth = tmp_path / shim.PTH_NAME
    assert pth.read_text() == shim.PTH_LINE and shim.ENV in capsys.readouterr().out
    assert main(["install-shim", "--dir", str(tmp_path), "--remove"]) == 0
    assert not pth.exists()


def test_install_cupy_shim_is_exported():
    assert cc.install_cupy_shim is shim.install_cupy_shim


# -- the low-level module: names, constants, errors ----------------------------------------------

def test_every_cupy13_function_is_there():
    missing = [n for n in CUPY13_FUNCTIONS if not callable(getattr(L, n, None))]
    assert not missing
    assert L.available is True and L.getVersion() == L.get_build_version() == 8907


def test_every_cupy13_helper_is_there():
    assert not [n for n in CUPY13_HELPERS if not hasattr(X, n)]


@pytest.mark.parametrize("name, value", [
    ("CUDNN_DATA_HALF", 2), ("CUDNN_TENSOR_NHWC", 1), ("CUDNN_OP_TENSOR_NOT", 5), ("CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS", 8),
    ("CUDNN_8BIT_INDICES", 3), ("CUDNN_ADD_SAME_C", 2), ("CUDNN_ADD_FULL_TENSOR", 3), ("CUDNN_CROSS_CORRELATION", 1),
    ("CUDNN_CONVOLUTION_FWD_SPECIFY_WORKSPACE_LIMIT", 2), ("CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED", 7),
    ("CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED", 5), ("CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING", 3),
    ("CUDNN_SOFTMAX_LOG", 2), ("CUDNN_SOFTMAX_MODE_CHANNEL", 1), ("CUDNN_POOLING_MAX_DETERMINISTIC", 3),
    ("CUDNN_ACTIVATION_IDENTITY", 5), ("CUDNN_BATCHNORM_SPATIAL_PERSISTENT", 2), ("CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC", 1),
    ("CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION", 2), ("CUDNN_GRU", 3), ("CUDNN_RNN_ALGO_PERSIST_DYNAMIC", 2),
    ("CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED", 2), ("CUDNN_RNN_PADDED_IO_ENABLED", 1), ("CUDNN_SKIP_INPUT", 1),
    ("CUDNN_STATUS_RUNTIME_FP_OVERFLOW", 13), ("CUDNN_ERRQUERY_BLOCKING", 2),
    ("CUDNN_FUSED_DACTIVATION_FORK_DBATCHNORM", 6), ("CUDNN_PARAM_BN_DBIAS_PLACEHOLDER", 38),
    ("CUDNN_PTR_16B_ALIGNED", 2), ("CUDNN_PTR_BN_DBIAS", 23), ("CUDNN_SCALAR_DOUBLE_BN_EPSILON", 103),
    ("CUDNN_STATUS_BAD_PARAM", 3), ("CUDNN_BN_MIN_EPSILON", 0.0)])
def test_constants_have_cupy13_values(name, value):
    assert getattr(L, name) == value


def test_cudnn_error_is_cupys_and_ours():
    with pytest.raises(L.CuDNNError) as e:
        L.setTensor4dDescriptor(L.createTensorDescriptor(), L.CUDNN_TENSOR_NCHW, L.CUDNN_DATA_FLOAT, 0, 1, 1, 1)
    err = e.value
    assert isinstance(err, RuntimeError) and isinstance(err, cc.CuDNNError)
    assert err.status == BAD_PARAM and err.function == "cudnnSetTensor4dDescriptor"
    assert str(err).startswith("cuDNN Error: CUDNN_STATUS_BAD_PARAM")
    err.add_info("x: shape=(0, 1, 1, 1)")
    err.add_infos(["func: test"])
    assert str(err).endswith("\n  x: shape=(0, 1, 1, 1)\n  func: test")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is L.CuDNNError and back.status == BAD_PARAM and back.rule == err.rule
    with pytest.raises(L.CuDNNError) as e:
        L.check_status(NOT_SUPPORTED)
    assert e.value.status == NOT_SUPPORTED
    L.check_status(0)


def test_a_family_registered_later_is_found():
    from cudnn_compat._core.registry import CUPY_NAMES, LEGACY, legacy

    @legacy("cudnnZzShimProbe")
    def zzShimProbe(x):
        return x + 1
    try:
        assert L.zzShimProbe(1) == 2 and L.zzShimProbe.__name__ == "zzShimProbe"
    finally:
        LEGACY.pop("cudnnZzShimProbe")
        CUPY_NAMES.pop("zzShimProbe")
        L._EXPORTED.pop("zzShimProbe", None)
        vars(L).pop("zzShimProbe", None)
    with pytest.raises(AttributeError):
        L.zzShimProbe  # noqa: B018


# -- the low-level module: pointer arguments and CuPy-13 signatures -------------------------------------

def test_int_array_arguments_are_host_pointers():
    t = L.createTensorDescriptor()
    dims, strides = ints(2, 3, 4, 5), ints(60, 20, 5, 1)
    L.setTensorNdDescriptor(t, L.CUDNN_DATA_DOUBLE, 4, dims.ctypes.data, strides.ctypes.data)
    assert L.getTensor4dDescriptor(t) == (L.CUDNN_DATA_DOUBLE, 2, 3, 4, 5, 60, 20, 5, 1)
    f = L.createFilterDescriptor()
    L.setFilterNdDescriptor_v4(f, L.CUDNN_DATA_FLOAT, L.CUDNN_TENSOR_NCHW, 5, ints(8, 4, 3, 3, 3).ctypes.data)
    assert L.getFilterNdDescriptor(f, 6) == (L.CUDNN_DATA_FLOAT, L.CUDNN_TENSOR_NCHW, 5, (8, 4, 3, 3, 3, 0))
    assert L.getFilterNdDescriptor(f, 2)[3] == (8, 4)
    L.setFilter4dDescriptor_v4(f, L.CUDNN_DATA_FLOAT, L.CUDNN_TENSOR_NHWC, 7, 6, 5, 4)
    assert L.getFilterNdDescriptor(f, 4) == (L.CUDNN_DATA_FLOAT, L.CUDNN_TENSOR_NHWC, 4, (7, 6, 5, 4))
    c = L.createConvolutionDescriptor()
    L.setConvolutionNdDescriptor_v3(c, 3, ints(1, 2, 0).ctypes.data, ints(1, 1, 2).ctypes.data,
                                    ints(1, 2, 1).ctypes.data, L.CUDNN_CONVOLUTION, L.CUDNN_DATA_FLOAT)
    assert tuple(map(tuple, cc.cudnnGetConvolutionNdDescriptor(c, 3)[1:4])) == ((1, 2, 0), (1, 1, 2), (1, 2, 1))
    p = L.createPoolingDescriptor()
    L.setPoolingNdDescriptor_v4(p, L.CUDNN_POOLING_MAX, L.CUDNN_NOT_PROPAGATE_NAN, 3, ints(2, 3, 2).ctypes.data,
                                ints(0, 1, 0).ctypes.data, ints(2, 2, 1).ctypes.data)
    got = cc.cudnnGetPoolingNdDescriptor(p, 3)
    assert [tuple(v) for v in got[-3:]] == [(2, 3, 2), (0, 1, 0), (2, 2, 1)]
    st = L.createSpatialTransformerDescriptor()
    L.setSpatialTransformerDescriptor(st, L.CUDNN_SAMPLER_BILINEAR, L.CUDNN_DATA_FLOAT, 4, ints(2, 3, 5, 6).ctypes.data)
    from cudnn_compat.spatial import SpatialTransformerDescriptor
    from cudnn_compat._core.descriptor import resolve
    assert resolve(st, SpatialTransformerDescriptor, "st").dims == (2, 3, 5, 6)
    # a bad count reaches the legacy function, which rejects it
    with pytest.raises(L.CuDNNError) as e:
        L.setTensorNdDescriptor(t, L.CUDNN_DATA_FLOAT, 0, dims.ctypes.data, strides.ctypes.data)
    assert e.value.status in (BAD_PARAM, NOT_SUPPORTED)


def test_rnn_data_descriptor_out_parameters_go_through_pointers():
    d = L.createRNNDataDescriptor()
    fill = np.array(-7.5, np.float32)
    L.setRNNDataDescriptor(d, L.CUDNN_DATA_FLOAT, L.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, 5, 3, 8,
                           ints(5, 2, 4).ctypes.data, fill.ctypes.data)
    outs = [ctypes.c_int(-1) for _ in range(5)]
    lengths, pad = ints(0, 0, 0, 0), np.zeros(1, np.float32)
    assert L.getRNNDataDescriptor(d, *[ctypes.addressof(o) for o in outs], 3, lengths.ctypes.data,
                                  pad.ctypes.data) is None
    assert [o.value for o in outs] == [L.CUDNN_DATA_FLOAT, L.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, 5, 3, 8]
    assert list(lengths) == [5, 2, 4, 0] and pad[0] == -7.5


def _conv_descs(dt, x_shape, w_shape, pad):
    xd, yd, wd, cd = L.createTensorDescriptor(), L.createTensorDescriptor(), L.createFilterDescriptor(), \
        L.createConvolutionDescriptor()
    L.setTensor4dDescriptor(xd, L.CUDNN_TENSOR_NCHW, dt, *x_shape)
    L.setFilter4dDescriptor_v4(wd, dt, L.CUDNN_TENSOR_NCHW, *w_shape)
    L.setConvolution2dDescriptor_v5(cd, pad, pad, 1, 1, 1, 1, L.CUDNN_CROSS_CORRELATION, dt)
    y_shape = (x_shape[0], w_shape[0], x_shape[2] + 2 * pad - w_shape[2] + 1, x_shape[3] + 2 * pad - w_shape[3] + 1)
    L.setTensor4dDescriptor(yd, L.CUDNN_TENSOR_NCHW, dt, *y_shape)
    return xd, wd, cd, yd, y_shape


def conv_ref(x, W, pad=0, stride=1, dilation=1, groups=1):
    """Cross-correlation of (N, C, *spatial) by (K, C/groups, *window), by direct loops."""
    x, W = np.asarray(x, np.float64), np.asarray(W, np.float64)
    nsp = x.ndim - 2
    pad, stride, dilation = ((v,) * nsp if np.isscalar(v) else tuple(v) for v in (pad, stride, dilation))
    xpad = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    win = W.shape[2:]
    out_sp = [(xpad.shape[2 + i] - dilation[i] * (win[i] - 1) - 1) // stride[i] + 1 for i in range(nsp)]
    k, cg = W.shape[0], W.shape[1]
    kg = k // groups
    y = np.zeros((x.shape[0], k) + tuple(out_sp))
    for pos in itertools.product(*[range(o) for o in out_sp]):
        sl = tuple(slice(pos[i] * stride[i], pos[i] * stride[i] + dilation[i] * (win[i] - 1) + 1, dilation[i])
                   for i in range(nsp))
        for g in range(groups):
            patch = xpad[(slice(None), slice(g * cg, (g + 1) * cg)) + sl]
            y[(slice(None), slice(g * kg, (g + 1) * kg)) + pos] = np.tensordot(
                patch, W[g * kg:(g + 1) * kg], axes=(list(range(1, nsp + 2)), list(range(1, nsp + 2))))
    return y


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compute_call_with_pointers_and_scaling(handle, rng, dtype):
    """CuPy 13 style: data, workspace and alpha/beta as pointer ints; y = alpha*conv + beta*y."""
    dt = L.CUDNN_DATA_FLOAT if dtype == np.float32 else L.CUDNN_DATA_DOUBLE
    xd, wd, cd, yd, y_shape = _conv_descs(dt, (2, 3, 5, 6), (4, 3, 3, 2), 1)
    x, w = rng.standard_normal((2, 3, 5, 6)).astype(dtype), rng.standard_normal((4, 3, 3, 2)).astype(dtype)
    y0 = rng.standard_normal(y_shape).astype(dtype)
    y = y0.copy()
    alpha, beta = np.array(2.0, dtype), np.array(0.5, dtype)
    perf = L.getConvolutionForwardAlgorithm_v7(handle, xd, wd, cd, yd, 8)[0]
    ws = np.zeros(max(perf.memory, 1), np.uint8)
    L.convolutionForward(handle, alpha.ctypes.data, xd, x.ctypes.data, wd, w.ctypes.data, cd, perf.algo, ws.ctypes.data,
                         perf.memory, beta.ctypes.data, yd, y.ctypes.data)
    close(y, 2.0 * conv_ref(x, w, 1) + 0.5 * y0, 1e-5 if dtype == np.float32 else 1e-12)


def test_algorithm_queries_return_cupy13_kinds(handle, rng):
    xd, wd, cd, yd, y_shape = _conv_descs(L.CUDNN_DATA_FLOAT, (1, 2, 5, 5), (3, 2, 3, 3), 0)
    x, w, y = (np.zeros(s, np.float32) for s in ((1, 2, 5, 5), (3, 2, 3, 3), y_shape))
    plain = L.findConvolutionForwardAlgorithm(handle, xd, wd, cd, yd, 2)
    assert plain and all(type(p) is dict and set(p) == {"algo", "status", "time", "memory"} for p in plain)
    ex = L.findConvolutionForwardAlgorithmEx(handle, xd, x, wd, w, cd, yd, y, 2, 0, 0)
    assert all(isinstance(p, L.CuDNNAlgoPerf) and p.determinism == -1 and p.mathType == -1 for p in ex)
    ex7 = L.findConvolutionBackwardDataAlgorithmEx_v7(handle, wd, w, yd, y, cd, xd, x, 3, 0, 0)
    assert ex7[0].status == 0 and ex7[0].determinism in (0, 1) and ex7[0]["algo"] == ex7[0].algo
    get7 = L.getConvolutionBackwardFilterAlgorithm_v7(handle, xd, yd, cd, wd, 10)
    assert len(get7) >= 1 and get7[0].status == 0
    algo = L.getConvolutionForwardAlgorithm_v6(handle, xd, wd, cd, yd, L.CUDNN_CONVOLUTION_FWD_SPECIFY_WORKSPACE_LIMIT,
                                               1 << 20)
    assert algo in range(8) and L.getConvolutionForwardWorkspaceSize(handle, xd, wd, cd, yd, algo) <= 1 << 20
    with pytest.raises(L.CuDNNError) as e:
        L.setConvolution2dDescriptor_v4(cd, 0, 0, 1, 1, 1, 1, L.CUDNN_CONVOLUTION)
    assert e.value.status == NOT_SUPPORTED


def test_errors_of_every_family_are_the_cupy_type(handle):
    with pytest.raises(L.CuDNNError) as e:
        L.poolingForward(handle, 0, 1.0, 0, 0, 0.0, 0, 0)
    assert e.value.status == BAD_PARAM
    with pytest.raises(cc.CuDNNError):  # and the cudnn_compat type catches them too
        L.destroyTensorDescriptor(12345678)


def test_fused_ops_scalars_and_labels_through_pointers():
    ops = L.CUDNN_FUSED_SCALE_BIAS_ACTIVATION_CONV_BNSTATS
    var = X.create_fused_ops_variant_param_pack(ops, [(L.CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES, 12345),
                                                      (L.CUDNN_SCALAR_DOUBLE_BN_EPSILON, 1.5e-5)])
    assert X.get_fused_ops_variant_param_pack_attribute(var.value, L.CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES) == 12345
    assert X.get_fused_ops_variant_param_pack_attribute(var.value, L.CUDNN_SCALAR_DOUBLE_BN_EPSILON) == 1.5e-5
    buf = np.zeros(4, np.float32)
    X.set_fused_ops_variant_param_pack_attribute(var, L.CUDNN_PTR_XDATA, buf)
    assert X.get_fused_ops_variant_param_pack_attribute(var.value, L.CUDNN_PTR_XDATA) == buf.ctypes.data
    const = X.create_fused_ops_const_param_pack(ops, [(L.CUDNN_PARAM_XDATA_PLACEHOLDER, L.CUDNN_PTR_16B_ALIGNED)])
    assert X.get_fused_ops_const_param_pack_attribute(const, L.CUDNN_PARAM_XDATA_PLACEHOLDER) == (L.CUDNN_PTR_16B_ALIGNED, 0)
    xdesc = X.create_tensor_descriptor(np.zeros((2, 8, 4, 4), np.float32))
    X.set_fused_ops_const_param_pack_attribute(const, L.CUDNN_PARAM_XDESC, xdesc)
    got, is_null = X.get_fused_ops_const_param_pack_attribute(const, L.CUDNN_PARAM_XDESC)
    assert is_null == 0 and L.getTensor4dDescriptor(got) == L.getTensor4dDescriptor(xdesc.value)


# -- the high-level helpers on NumPy arrays (CPU place) --------------------------------------------------

CONV_CASES = [  # x shape, W shape, pad, stride, dilation, groups
    ((2, 4, 7, 6), (6, 2, 3, 3), (1, 0), (2, 1), (1, 2), 2),
    ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), (1, 0, 1), (1, 2, 1), (1, 1, 2), 1),
]


def _out_shape(xs, ws, pad, stride, dil):
    sp = [(xs[2 + i] + 2 * pad[i] - dil[i] * (ws[2 + i] - 1) - 1) // stride[i] + 1 for i in range(len(pad))]
    return (xs[0], ws[0]) + tuple(sp)


@pytest.mark.parametrize("case", CONV_CASES, ids=["2d-groups", "3d"])
@pytest.mark.parametrize("auto_tune", [False, True])
def test_convolution_helpers_match_loops_and_adjoints(cpu_place, rng, case, auto_tune):
    xs, ws, pad, stride, dil, groups = case
    x, W, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    y = np.empty(_out_shape(xs, ws, pad, stride, dil))
    X.convolution_forward(x, W, b, y, pad, stride, dil, groups, auto_tune=auto_tune, tensor_core="auto")
    ref = conv_ref(x, W, pad, stride, dil, groups)
    close(y, ref + b.reshape((1, -1) + (1,) * (x.ndim - 2)), 1e-12)
    gy = rng.standard_normal(y.shape)
    gx, gW = np.empty_like(x), np.empty_like(W)
    X.convolution_backward_data(W, gy, None, gx, pad, stride, dil, groups, deterministic=False, auto_tune=auto_tune,
                                tensor_core="never")
    X.convolution_backward_filter(x, gy, gW, pad, stride, dil, groups, deterministic=not auto_tune,
                                  auto_tune=auto_tune, tensor_core="never")
    # <conv(x, W), gy> == <x, conv^T(gy)> == <W, dconv/dW(x, gy)>
    inner = float((ref * gy).sum())
    assert abs(float((x * gx).sum()) - inner) <= 1e-10 * max(1.0, abs(inner))
    assert abs(float((W * gW).sum()) - inner) <= 1e-10 * max(1.0, abs(inner))
    cache = X._algorithm_fwd_cache if auto_tune else X._get_algorithm_fwd_cache
    key = next(k for k in cache if k[1] == x.shape and k[2] == W.shape)
    first = cache[key]
    X.convolution_forward(x, W, None, y, pad, stride, dil, groups, auto_tune=auto_tune, tensor_core="auto")
    assert cache[key] is first  # a repeated shape is one dict lookup


def test_convolution_nhwc_layout_and_bias_in_backward_data(cpu_place, rng):
    x = rng.standard_normal((2, 5, 6, 3)).astype(np.float32)  # NHWC
    W = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)  # KRSC
    y = np.empty((2, 5, 6, 4), np.float32)
    X.convolution_forward(x, W, None, y, (1, 1), (1, 1), (1, 1), 1, auto_tune=False, tensor_core="never",
                          d_layout=L.CUDNN_TENSOR_NHWC, w_layout=L.CUDNN_TENSOR_NHWC)
    ref = conv_ref(x.transpose(0, 3, 1, 2), W.transpose(0, 3, 1, 2), 1).transpose(0, 2, 3, 1)
    close(y, ref, 1e-5)
    b = rng.standard_normal(3)
    gx = np.empty((2, 3, 5, 5))
    Wd, gy = rng.standard_normal((4, 3, 2, 2)), rng.standard_normal((2, 4, 4, 4))
    X.convolution_backward_data(Wd, gy, b, gx, (0, 0), (1, 1), (1, 1), 1, deterministic=True, auto_tune=False,
                                tensor_core="never")
    x0 = rng.standard_normal(gx.shape)
    assert abs(float(((gx - b.reshape(1, -1, 1, 1)) * x0).sum()) - float((conv_ref(x0, Wd) * gy).sum())) < 1e-10


def test_convolution_failure_carries_cupy_style_infos(cpu_place, rng):
    x, W = rng.standard_normal((1, 2, 4, 4)), rng.standard_normal((3, 2, 3, 3))
    y = np.full((1, 3, 5, 5), 7.0)  # wrong output shape for pad 0
    with pytest.raises(L.CuDNNError) as e:
        X.convolution_forward(x, W, None, y, (0, 0), (1, 1), (1, 1), 1, auto_tune=False, tensor_core="never")
    assert e.value.status in (BAD_PARAM, NOT_SUPPORTED) and "yDesc" in str(e.value)
    assert (y == 7.0).all()
    with pytest.raises(ValueError, match="NumPy"):
        X.convolution_forward(x, W, None, _FakeDeviceArray(), (0, 0), (1, 1), (1, 1), 1, auto_tune=False,
                              tensor_core="never")


class _FakeDeviceArray:
    """An object that claims to be a CuPy array (by module) to test the mixed-place check."""
    __module__ = "cupy._core.core"


@pytest.mark.parametrize("mode", ["max", "avg_incl", "avg_excl"])
def test_pooling_helpers(cpu_place, rng, mode):
    m = {"max": L.CUDNN_POOLING_MAX, "avg_incl": L.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
         "avg_excl": L.CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING}[mode]
    x = rng.standard_normal((2, 3, 5, 6))
    k, s, p = (3, 2), (2, 2), (1, 0)
    oh, ow = (5 + 2 - 3) // 2 + 1, (6 - 2) // 2 + 1
    y = np.empty((2, 3, oh, ow))
    X.pooling_forward(x, y, k, s, p, m)
    xpad = np.pad(x, ((0, 0), (0, 0), (1, 1), (0, 0)), constant_values=np.nan)
    ref = np.empty_like(y)
    for i in range(oh):
        for j in range(ow):
            win = xpad[:, :, i * 2:i * 2 + 3, j * 2:j * 2 + 2].reshape(2, 3, -1)
            ref[:, :, i, j] = {"max": np.nanmax(win, 2), "avg_incl": np.nansum(win, 2) / 6,
                               "avg_excl": np.nanmean(win, 2)}[mode]
    close(y, ref, 1e-12)
    gy = rng.standard_normal(y.shape)
    gx = X.pooling_backward(x, y, gy, k, s, p, m)
    # pooling is linear (average) or piecewise linear (max): <pool(x'), gy> vs <x', gx> at x' = x + small step
    if mode != "max":
        x1 = rng.standard_normal(x.shape)
        y1 = np.empty_like(y)
        X.pooling_forward(x1, y1, k, s, p, m)
        assert abs(float((y1 * gy).sum()) - float((x1 * gx).sum())) < 1e-10
    else:
        eps, v = 1e-7, rng.standard_normal(x.shape)
        yp, ym = np.empty_like(y), np.empty_like(y)
        X.pooling_forward(x + eps * v, yp, k, s, p, m)
        X.pooling_forward(x - eps * v, ym, k, s, p, m)
        assert abs(float(((yp - ym) / (2 * eps) * gy).sum()) - float((gx * v).sum())) < 1e-6


@pytest.mark.parametrize("mode, coef", [("RELU", 0.0), ("SIGMOID", 0.0), ("TANH", 0.0), ("CLIPPED_RELU", 0.7),
                                        ("ELU", 0.5)])
def test_activation_helpers(cpu_place, rng, mode, coef):
    x = rng.standard_normal((3, 4, 5))
    f = {"RELU": lambda v: np.maximum(v, 0), "SIGMOID": lambda v: 1 / (1 + np.exp(-v)), "TANH": np.tanh,
         "CLIPPED_RELU": lambda v: np.clip(v, 0, coef), "ELU": lambda v: np.where(v > 0, v, coef * np.expm1(v))}[mode]
    df = {"RELU": lambda v: (v > 0) * 1.0, "SIGMOID": lambda v: f(v) * (1 - f(v)), "TANH": lambda v: 1 - np.tanh(v) ** 2,
          "CLIPPED_RELU": lambda v: ((v > 0) & (v < coef)) * 1.0,
          "ELU": lambda v: np.where(v > 0, 1.0, coef * np.exp(v))}[mode]
    m = getattr(L, "CUDNN_ACTIVATION_" + mode)
    y = X.activation_forward(x, m, coef)
    close(y, f(x), 1e-12)
    gy = rng.standard_normal(x.shape)
    close(X.activation_backward(x, y, gy, m, coef), gy * df(x), 1e-12)


@pytest.mark.parametrize("shape, axis", [((3, 5), 1), ((2, 4, 3, 2), 1), ((2, 3, 4), -1), ((4, 6), 0)])
@pytest.mark.parametrize("algo", ["ACCURATE", "LOG"])
def test_softmax_helpers(cpu_place, rng, shape, axis, algo):
    x = rng.standard_normal(shape)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    sm = e / e.sum(axis=axis, keepdims=True)
    a = getattr(L, "CUDNN_SOFTMAX_" + algo)
    y = X.softmax_forward(x, axis, a)
    close(y, np.log(sm) if algo == "LOG" else sm, 1e-12)
    gy = rng.standard_normal(shape)
    want = gy - np.exp(y) * gy.sum(axis=axis, keepdims=True) if algo == "LOG" else \
        y * (gy - (gy * y).sum(axis=axis, keepdims=True))
    close(X.softmax_backward(y, gy, axis, a), want, 1e-12)


def _bn_ref(x, axes, gamma, beta, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(var + eps)
    xhat = (x - mean) * inv
    return xhat * gamma + beta, mean, var, inv, xhat


@pytest.mark.parametrize("kind", ["conv2d", "conv3d", "linear"])
def test_batch_normalization_helpers(cpu_place, rng, kind):
    conv2d = kind != "linear"  # is_for_conv2d: a convolution's (N, C, spatial...) output
    if kind == "conv2d":
        x, mode, axes = rng.standard_normal((4, 3, 2, 5)), L.CUDNN_BATCHNORM_SPATIAL, (0, 2, 3)
        shape = (1, 3, 1, 1)
    elif kind == "conv3d":
        x, mode, axes = rng.standard_normal((3, 2, 2, 3, 4)), L.CUDNN_BATCHNORM_SPATIAL, (0, 2, 3, 4)
        shape = (1, 2, 1, 1, 1)
    else:  # Chainer's BatchNormalization on (N, features): per-activation over a (N, C, 1, 1) view
        x, mode, axes = rng.standard_normal((6, 5)), L.CUDNN_BATCHNORM_PER_ACTIVATION, (0,)
        shape = (1, 5)
    c = shape[1]
    gamma, beta = 1 + 0.2 * rng.standard_normal(c), 0.1 * rng.standard_normal(c)
    rm, rv = rng.standard_normal(c), 1 + rng.random(c)
    rm0, rv0 = rm.copy(), rv.copy()
    eps, decay = 1e-4, 0.8
    y, mean, inv = X.batch_normalization_forward_training(x, gamma, beta, rm, rv, None, None, eps, decay, conv2d,
                                                          mode, False)
    want, m_ref, v_ref, inv_ref, xhat = _bn_ref(x, axes, gamma.reshape(shape), beta.reshape(shape), eps)
    close(y, want, 1e-12)
    close(mean, m_ref.reshape(-1), 1e-12)
    close(inv, inv_ref.reshape(-1), 1e-12)
    m = x.size // c
    close(rm, decay * rm0 + (1 - decay) * m_ref.reshape(-1), 1e-12)
    close(rv, decay * rv0 + (1 - decay) * v_ref.reshape(-1) * m / (m - 1), 1e-12)
    # caller-provided mean / inv_std: only y is returned, the buffers are filled
    save_m, save_i = np.zeros(c), np.zeros(c)
    y2 = X.batch_normalization_forward_training(x, gamma, beta, rm, rv, save_m, save_i, eps, decay, conv2d, mode, False)
    close(y2, want, 1e-12)
    close(save_m, m_ref.reshape(-1), 1e-12)
    yi = X.batch_normalization_forward_inference(x, gamma, beta, rm0, rv0, eps, conv2d, mode)
    close(yi, (x - rm0.reshape(shape)) / np.sqrt(rv0.reshape(shape) + eps) * gamma.reshape(shape) + beta.reshape(shape),
          1e-12)
    gy = rng.standard_normal(x.shape)
    gx, gg, gb = X.batch_normalization_backward(x, gamma, gy, mean, inv, eps, conv2d, mode, False)
    sg, sgx = gy.sum(axis=axes, keepdims=True), (gy * xhat).sum(axis=axes, keepdims=True)
    close(gb, sg.reshape(-1), 1e-12)
    close(gg, sgx.reshape(-1), 1e-12)
    close(gx, gamma.reshape(shape) * inv_ref / m * (m * gy - sg - xhat * sgx), 1e-11)


def test_batch_normalization_half_data_float_parameters(cpu_place, rng):
    x = rng.standard_normal((4, 2, 3, 3)).astype(np.float16)
    gamma, beta = np.ones(2, np.float16), np.zeros(2, np.float16)
    rm, rv = np.zeros(2, np.float16), np.ones(2, np.float16)
    y, mean, inv = X.batch_normalization_forward_training(x, gamma, beta, rm, rv, None, None, 1e-5, 0.9, True,
                                                          L.CUDNN_BATCHNORM_SPATIAL, False)
    assert y.dtype == np.float16 and mean.dtype == np.float32  # parameters in float for half data
    want = _bn_ref(x.astype(np.float64), (0, 2, 3), 1.0, 0.0, 1e-5)[0]
    close(y, want, 4e-3)
    assert rm.dtype == np.float16
    close(rm, 0.1 * x.astype(np.float64).mean(axis=(0, 2, 3)), 2e-3)


def test_dropout_states(cpu_place, rng):
    states = X.DropoutStates(None, 1234)
    x = rng.standard_normal((50, 40)).astype(np.float32)
    reserve, y = states.forward(None, x, 0.3)
    kept = y != 0
    assert 0.6 < kept.mean() < 0.8
    close(y[kept], x[kept] / np.float32(0.7), 1e-6)
    gy = rng.standard_normal(x.shape).astype(np.float32)
    gx = states.backward(None, gy, 0.3, reserve)
    close(gx, np.where(kept, gy / np.float32(0.7), 0), 1e-6)
    _, y2 = states.forward(None, x, 0.3)
    assert (y2 != y).any()  # the state advanced: a new mask
    _, y0 = states.forward(None, x, 0.0)
    close(y0, x, 0)
    same = X.DropoutStates(None, 1234)
    close(same.forward(None, x, 0.3)[1], y, 0)  # the same seed gives the same first mask


def _tanh_rnn_ref(xs, lengths, h0, Wx, Rh, bx, bh):
    """Packed-sequence tanh RNN: rows of step t are the first lengths[t] sequences."""
    ys, h, row = [], h0.copy(), 0
    for n in lengths:
        h[:n] = np.tanh(xs[row:row + n] @ Wx.T + bx + h[:n] @ Rh.T + bh)
        ys.append(h[:n].copy())
        row += n
    return np.concatenate(ys), h


def test_rnn_helpers_tanh(cpu_place, rng):
    lengths, insz, H = [3, 3, 2, 1], 4, 5
    xs = rng.standard_normal((sum(lengths), insz))
    hx = rng.standard_normal((1, 3, H)) * 0.5
    states = X.DropoutStates(None, 0)
    handle = X.get_handle()
    rnn_desc = X.create_rnn_descriptor(H, 1, states._desc, L.CUDNN_LINEAR_INPUT, L.CUDNN_UNIDIRECTIONAL,
                                       L.CUDNN_RNN_TANH, L.CUDNN_DATA_DOUBLE)
    x_desc = X.create_tensor_nd_descriptor(np.empty((3, insz, 1)))
    n_w = L.getRNNParamsSize(handle, rnn_desc.value, x_desc.value, L.CUDNN_DATA_DOUBLE) // 8
    w = rng.standard_normal((n_w, 1, 1)) * 0.4
    w_desc = X.create_filter_descriptor(w)
    Wx = X.get_rnn_lin_layer_matrix_params(handle, rnn_desc, 0, x_desc, w_desc, w, 0).reshape(H, insz)
    Rh = X.get_rnn_lin_layer_matrix_params(handle, rnn_desc, 0, x_desc, w_desc, w, 1).reshape(H, H)
    bx = X.get_rnn_lin_layer_bias_params(handle, rnn_desc, 0, x_desc, w_desc, w, 0).reshape(H)
    bh = X.get_rnn_lin_layer_bias_params(handle, rnn_desc, 0, x_desc, w_desc, w, 1).reshape(H)
    assert np.shares_memory(Wx, w)  # views into the weight buffer, as CuPy 13 returned them
    ys_ref, hy_ref = _tanh_rnn_ref(xs, lengths, hx[0].copy(), Wx, Rh, bx, bh)
    hy, cy, ys = X.rnn_forward_inference(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, hx, None, w, xs, lengths)
    close(ys, ys_ref, 1e-12)
    close(hy[0], hy_ref, 1e-12)
    assert cy.size == 0
    reserve, hy2, _, ys2 = X.rnn_forward_training(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, hx, None, w, xs,
                                                  lengths)
    close(ys2, ys_ref, 1e-12)
    # backward: directional derivatives of L = <ys, gys> + <hy, ghy> by central differences
    gys, ghy = rng.standard_normal(ys.shape), rng.standard_normal(hy.shape)
    dhx, _, dxs = X.rnn_backward_data(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, hx, None, w, xs, ys2, reserve,
                                      ghy, None, gys, lengths)
    dw = X.rnn_backward_weights(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, xs, hx, ys2, w, reserve, lengths)

    def loss(xs_, hx_, w_):
        h_, _, y_ = X.rnn_forward_inference(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, hx_, None, w_, xs_,
                                            lengths)
        return float((y_ * gys).sum() + (h_ * ghy).sum())
    eps = 1e-6
    for grad, which in ((dxs, 0), (dhx, 1), (dw, 2)):
        v = rng.standard_normal(grad.shape)
        args_p, args_m = [xs, hx, w], [xs, hx, w]
        args_p[which], args_m[which] = args_p[which] + eps * v, args_m[which] - eps * v
        fd = (loss(*args_p) - loss(*args_m)) / (2 * eps)
        assert abs(fd - float((grad * v).sum())) < 1e-6 * max(1.0, abs(fd)), which


def test_rnn_ex_helpers_on_a_padded_batch(cpu_place, rng):
    """The _ex helpers (padded [T, B, n] batch, per-sequence lengths) against per-sequence recurrences."""
    lengths, insz, H, T = np.array([3, 4, 1], np.int32), 3, 4, 4
    xs = rng.standard_normal((T, 3, insz))
    hx = rng.standard_normal((1, 3, H)) * 0.5
    states = X.DropoutStates(None, 0)
    handle = X.get_handle()
    rnn_desc = X.create_rnn_descriptor(H, 1, states._desc, L.CUDNN_LINEAR_INPUT, L.CUDNN_UNIDIRECTIONAL,
                                       L.CUDNN_RNN_TANH, L.CUDNN_DATA_DOUBLE)
    x_desc = X.create_tensor_nd_descriptor(np.empty((3, insz, 1)))
    w = rng.standard_normal((L.getRNNParamsSize(handle, rnn_desc.value, x_desc.value, L.CUDNN_DATA_DOUBLE) // 8, 1,
                             1)) * 0.4
    w_desc = X.create_filter_descriptor(w)
    blk = [X.get_rnn_lin_layer_matrix_params(handle, rnn_desc, 0, x_desc, w_desc, w, i) for i in (0, 1)]
    bias = [X.get_rnn_lin_layer_bias_params(handle, rnn_desc, 0, x_desc, w_desc, w, i).reshape(H) for i in (0, 1)]
    Wx, Rh = blk[0].reshape(H, insz), blk[1].reshape(H, H)
    valid = np.arange(T)[:, None] < lengths[None, :]  # [T, B]
    ys_ref, hy_ref = np.zeros((T, 3, H)), hx[0].copy()
    for b in range(3):
        h = hx[0, b].copy()
        for t in range(lengths[b]):
            h = np.tanh(Wx @ xs[t, b] + bias[0] + Rh @ h + bias[1])
            ys_ref[t, b] = h
        hy_ref[b] = h
    hy, _, ys = X.rnn_forward_inference_ex(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, hx, None, w, xs, lengths)
    close(ys[valid], ys_ref[valid], 1e-12)
    close(hy[0], hy_ref, 1e-12)
    reserve, hy2, _, ys2 = X.rnn_forward_training_ex(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, hx, None, w, xs,
                                                     lengths)
    close(ys2[valid], ys_ref[valid], 1e-12)
    gys = rng.standard_normal(ys.shape) * valid[:, :, None]
    ghy = rng.standard_normal(hy.shape)
    dhx, _, dxs = X.rnn_backward_data_ex(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, hx, None, w, xs, ys2,
                                         reserve, ghy, None, gys, lengths)
    dw = X.rnn_backward_weights_ex(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, xs, hx, ys2, w, reserve, lengths)

    def loss(xs_, hx_, w_):
        h_, _, y_ = X.rnn_forward_inference_ex(states, L.CUDNN_UNIDIRECTIONAL, L.CUDNN_RNN_TANH, hx_, None, w_, xs_,
                                               lengths)
        return float((y_ * gys)[valid].sum() + (h_ * ghy).sum())
    eps = 1e-6
    for grad, which in ((dxs, 0), (dhx, 1), (dw, 2)):
        v = rng.standard_normal(grad.shape) * (valid[:, :, None] if which == 0 else 1)
        args_p, args_m = [xs, hx, w], [xs, hx, w]
        args_p[which], args_m[which] = args_p[which] + eps * v, args_m[which] - eps * v
        fd = (loss(*args_p) - loss(*args_m)) / (2 * eps)
        assert abs(fd - float((grad * v).sum())) < 1e-6 * max(1.0, abs(fd)), which


def test_ctc_loss_helper_against_path_enumeration(cpu_place, rng):
    T, A = 4, 3
    labels, label_len, input_len = np.array([1, 1, 2], np.int32), np.array([1, 2], np.int32), np.array([4, 3], np.int32)
    act = rng.standard_normal((T, 2, A)).astype(np.float32)
    probs = np.exp(act) / np.exp(act).sum(axis=2, keepdims=True)
    loss, grad = X.ctc_loss(probs, labels, label_len, input_len, L.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC)

    def collapse(path):
        out = [k for i, k in enumerate(path) if i == 0 or k != path[i - 1]]
        return tuple(k for k in out if k != 0)
    targets = [(1,), (1, 2)]
    for n in range(2):
        t_n = int(input_len[n])
        p = probs[:t_n, n].astype(np.float64)
        total, occ = 0.0, np.zeros((T, A))
        for path in itertools.product(range(A), repeat=t_n):
            if collapse(path) == targets[n]:
                pp = math.prod(p[t, k] for t, k in enumerate(path))
                total += pp
                for t, k in enumerate(path):
                    occ[t, k] += pp
        assert abs(loss[n] - (-math.log(total))) < 1e-5
        # CUDNN_LOSS_NORMALIZATION_NONE: the gradient is w.r.t. the unnormalized activations
        want = p - occ[:t_n] / total
        close(grad[:t_n, n], want, 1e-5)


def test_descriptor_factories_and_lifetime(cpu_place):
    x = np.zeros((2, 3, 4, 5), np.float32)
    d = X.create_tensor_descriptor(x)
    assert L.getTensor4dDescriptor(d.value) == (L.CUDNN_DATA_FLOAT, 2, 3, 4, 5, 60, 20, 5, 1)
    value = d.value
    del d  # collected: the descriptor is destroyed, its id goes stale
    with pytest.raises(L.CuDNNError, match="destroyed"):
        L.getTensor4dDescriptor(value)
    nd = X.create_tensor_nd_descriptor(np.zeros((2, 1, 3)))
    assert X.create_tensor_nd_descriptor(np.zeros((2, 1, 3))) is nd  # per-thread cache
    assert cc.cudnnGetTensorNdDescriptor(nd.value, 3)[3][1] == 3  # size-1 dim strided as c-contiguous
    assert X.create_tensor_nd_descriptor(np.zeros((0, 3, 4))).value == 0
    with pytest.raises(ValueError, match="c-contiguous"):
        X.create_tensor_descriptor(np.zeros((2, 3, 4, 5)).transpose(0, 1, 3, 2))
    with pytest.raises(TypeError):
        X.get_data_type(np.int32)
    cd = X.create_convolution_descriptor((1, 2), (2, 1), np.float16, dilation=(1, 3), groups=2)
    assert cc.cudnnGetConvolution2dDescriptor(cd.value) == (1, 2, 2, 1, 1, 3, L.CUDNN_CROSS_CORRELATION,
                                                            L.CUDNN_DATA_FLOAT)
    assert L.getConvolutionGroupCount(cd.value) == 2
    pd = X.create_pooling_descriptor((2, 2, 2), (1, 1, 1), (0, 0, 0), L.CUDNN_POOLING_MAX)
    assert cc.cudnnGetPoolingNdDescriptor(pd.value, 3)[2] == 3
    ad = X.create_activation_descriptor(L.CUDNN_ACTIVATION_CLIPPED_RELU, coef=6.0)
    assert cc.cudnnGetActivationDescriptor(ad.value) == (L.CUDNN_ACTIVATION_CLIPPED_RELU, L.CUDNN_PROPAGATE_NAN, 6.0)
    od = X.create_op_tensor_descriptor(L.CUDNN_OP_TENSOR_MUL, np.float32)
    assert L.getOpTensorDescriptor(od.value) == (L.CUDNN_OP_TENSOR_MUL, L.CUDNN_DATA_FLOAT, L.CUDNN_NOT_PROPAGATE_NAN)
    rd = X.create_reduce_tensor_descriptor(L.CUDNN_REDUCE_TENSOR_MAX, np.float64)
    assert L.getReduceTensorDescriptor(rd.value)[3] == L.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES
    assert X.is_tensor_core_available(np.float32) is False


def test_handles_are_cached_per_place(cpu_place):
    h = X.get_handle()
    assert X.get_handle() is h and L.getStream(h) == 0
    X.reset_handles()
    h2 = X.get_handle()
    assert int(h2) != int(h)
    with pytest.raises(L.CuDNNError):
        L.getStream(h)  # destroyed by reset_handles


def test_add_tensor_and_op_tensor_with_pointers(cpu_place, rng):
    handle = X.get_handle()
    y = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    b = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)
    y0 = y.copy()
    one, two, zero = np.array(1.0, np.float32), np.array(2.0, np.float32), np.array(0.0, np.float32)
    yd, bd = X.create_tensor_descriptor(y), X.create_tensor_descriptor(b)  # kept: collected ones are destroyed
    X.add_tensor(handle, two.ctypes.data, bd.value, b.ctypes.data, one.ctypes.data, yd.value, y.ctypes.data)
    close(y, y0 + 2 * b, 1e-6)
    op = X.create_op_tensor_descriptor(L.CUDNN_OP_TENSOR_MUL, np.float32)
    c = np.zeros_like(y)
    L.opTensor(handle, op.value, one.ctypes.data, yd.value, y.ctypes.data, one.ctypes.data, bd.value, b.ctypes.data,
               zero.ctypes.data, yd.value, c.ctypes.data)
    close(c, y * b, 1e-6)


# -- GPU: CuPy arrays through the shim --------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_low_level_calls_with_device_pointers_match_direct_calls(shimmed, rng):
    import cupy
    from cudnn_compat.handle import get_handle as handle_object
    low = importlib.import_module("cupy.cuda.cudnn")
    h = low.create()
    assert handle_object(h).place == "gpu"
    xd, wd, cd, yd, y_shape = _conv_descs_via(low, low.CUDNN_DATA_FLOAT, (2, 3, 9, 8), (4, 3, 3, 3), 1)
    x = cupy.asarray(rng.standard_normal((2, 3, 9, 8)).astype(np.float32))
    w = cupy.asarray(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    y_shim, y_direct = cupy.zeros(y_shape, cupy.float32), cupy.zeros(y_shape, cupy.float32)
    perf = low.getConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 8)[0]
    ws = cupy.empty(max(perf.memory, 1), cupy.uint8)
    one, zero = np.array(1, np.float32), np.array(0, np.float32)
    low.convolutionForward(h, one.ctypes.data, xd, x.data.ptr, wd, w.data.ptr, cd, perf.algo, ws.data.ptr,
                           perf.memory, zero.ctypes.data, yd, y_shim.data.ptr)
    cc.cudnnConvolutionForward(h, 1.0, xd, x, wd, w, cd, perf.algo, ws, perf.memory, 0.0, yd, y_direct)
    # activation in place and softmax on the result, both ways
    ad = low.createActivationDescriptor()
    low.setActivationDescriptor(ad, low.CUDNN_ACTIVATION_TANH, low.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    low.activationForward_v4(h, ad, one.ctypes.data, yd, y_shim.data.ptr, zero.ctypes.data, yd, y_shim.data.ptr)
    cc.cudnnActivationForward(h, ad, 1.0, yd, y_direct, 0.0, yd, y_direct)
    s_shim, s_direct = cupy.empty_like(y_shim), cupy.empty_like(y_direct)
    low.softmaxForward(h, low.CUDNN_SOFTMAX_ACCURATE, low.CUDNN_SOFTMAX_MODE_CHANNEL, one.ctypes.data, yd,
                       y_shim.data.ptr, zero.ctypes.data, yd, s_shim.data.ptr)
    cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, yd, y_direct, 0.0, yd,
                           s_direct)
    cupy.cuda.runtime.deviceSynchronize()
    close(y_shim.get(), y_direct.get(), 1e-6)
    close(s_shim.get(), s_direct.get(), 1e-6)
    ref = np.tanh(conv_ref(x.get(), w.get(), 1))
    close(y_shim.get(), ref, 1e-2)  # TF32-level tolerance for float32 convolution on the GPU
    low.destroy(h)


def _conv_descs_via(low, dt, x_shape, w_shape, pad):
    xd, yd, wd, cd = low.createTensorDescriptor(), low.createTensorDescriptor(), low.createFilterDescriptor(), \
        low.createConvolutionDescriptor()
    low.setTensorNdDescriptor(xd, dt, 4, ints(*x_shape).ctypes.data,
                              ints(*[int(np.prod(x_shape[i + 1:])) for i in range(4)]).ctypes.data)
    low.setFilterNdDescriptor_v4(wd, dt, low.CUDNN_TENSOR_NCHW, 4, ints(*w_shape).ctypes.data)
    low.setConvolutionNdDescriptor_v3(cd, 2, ints(pad, pad).ctypes.data, ints(1, 1).ctypes.data, ints(1, 1).ctypes.data,
                                      low.CUDNN_CROSS_CORRELATION, dt)
    y_shape = (x_shape[0], w_shape[0], x_shape[2] + 2 * pad - w_shape[2] + 1, x_shape[3] + 2 * pad - w_shape[3] + 1)
    low.setTensor4dDescriptor(yd, low.CUDNN_TENSOR_NCHW, dt, *y_shape)
    return xd, wd, cd, yd, y_shape


@pytest.mark.gpu
def test_gpu_low_level_matches_the_real_legacy_libcudnn(shimmed, rng, legacy_cudnn):
    import cupy
    Lg = legacy_cudnn
    low = importlib.import_module("cupy.cuda.cudnn")
    h = low.create()
    xd, wd, cd, yd, y_shape = _conv_descs_via(low, low.CUDNN_DATA_FLOAT, (2, 4, 7, 7), (5, 4, 3, 3), 1)
    x = cupy.asarray(rng.standard_normal((2, 4, 7, 7)).astype(np.float32))
    w = cupy.asarray(rng.standard_normal((5, 4, 3, 3)).astype(np.float32))
    y_shim, y_real = cupy.zeros(y_shape, cupy.float32), cupy.zeros(y_shape, cupy.float32)
    one, zero = np.array(1, np.float32), np.array(0, np.float32)
    perf = low.getConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 8)[0]
    ws = cupy.empty(max(perf.memory, 1), cupy.uint8)
    low.convolutionForward(h, one.ctypes.data, xd, x.data.ptr, wd, w.data.ptr, cd, perf.algo, ws.data.ptr,
                           perf.memory, zero.ctypes.data, yd, y_shim.data.ptr)
    p_shim = cupy.empty((2, 5, 3, 3), cupy.float32)
    pool = low.createPoolingDescriptor()
    low.setPooling2dDescriptor_v4(pool, low.CUDNN_POOLING_MAX, low.CUDNN_NOT_PROPAGATE_NAN, 3, 3, 0, 0, 2, 2)
    pd = low.createTensorDescriptor()
    low.setTensor4dDescriptor(pd, low.CUDNN_TENSOR_NCHW, low.CUDNN_DATA_FLOAT, 2, 5, 3, 3)
    low.poolingForward(h, pool, one.ctypes.data, yd, y_shim.data.ptr, zero.ctypes.data, pd, p_shim.data.ptr)

    lh, ds = Lg.Handle(), Lg.Descs()
    try:
        tx = ds.tensor((2, 4, 7, 7), (196, 49, 7, 1), "float32")
        ty = ds.tensor(y_shape, (5 * 49, 49, 7, 1), "float32")
        tw = ds.filter((5, 4, 3, 3), "float32")
        tc = ds.conv((1, 1), (1, 1), (1, 1), "CROSS_CORRELATION", "float32", 1, "DEFAULT_MATH")
        algo = Lg.perf_list("cudnnGetConvolutionForwardAlgorithm_v7", lh, tx, tw, tc, ty)[0]["algo"]
        size = Lg.workspace_size("cudnnGetConvolutionForwardWorkspaceSize", lh, tx, tw, tc, ty, algo)
        rws = cupy.empty(max(size, 1), cupy.uint8)
        a, b = Lg.scalar_ptr(1.0, "float32"), Lg.scalar_ptr(0.0, "float32")
        Lg.call("cudnnConvolutionForward", lh.ptr, ctypes.addressof(a), tx, x.data.ptr, tw, w.data.ptr, tc, algo,
                rws.data.ptr, size, ctypes.addressof(b), ty, y_real.data.ptr)
        tp = ds.tensor((2, 5, 3, 3), (45, 9, 3, 1), "float32")
        rpool = ds.pooling(low.CUDNN_POOLING_MAX, (3, 3), (0, 0), (2, 2))
        p_real = cupy.empty((2, 5, 3, 3), cupy.float32)
        Lg.call("cudnnPoolingForward", lh.ptr, rpool, ctypes.addressof(a), ty, y_real.data.ptr, ctypes.addressof(b), tp,
                p_real.data.ptr)
        cupy.cuda.runtime.deviceSynchronize()
    finally:
        ds.destroy()
        lh.destroy()
    close(y_shim.get(), y_real.get(), 1e-2)
    close(p_shim.get(), p_real.get(), 1e-2)
    low.destroy(h)


@pytest.mark.gpu
def test_gpu_compute_calls_bind_the_current_stream(shimmed):
    import cupy
    low = importlib.import_module("cupy.cuda.cudnn")
    h = low.create()
    x = cupy.arange(-2, 2, dtype=cupy.float32).reshape(1, 1, 2, 2)
    y = cupy.empty_like(x)
    d = low.createTensorDescriptor()
    low.setTensor4dDescriptor(d, low.CUDNN_TENSOR_NCHW, low.CUDNN_DATA_FLOAT, 1, 1, 2, 2)
    a = low.createActivationDescriptor()
    low.setActivationDescriptor(a, low.CUDNN_ACTIVATION_RELU, low.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    cupy.cuda.runtime.deviceSynchronize()  # x is ready before a non-blocking stream reads it
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        low.activationForward_v4(h, a, 1.0, d, x.data.ptr, 0.0, d, y.data.ptr)
        assert low.getStream(h) == s.ptr
    s.synchronize()
    assert (y.get() == np.maximum(x.get(), 0)).all()
    low.activationForward_v4(h, a, 1.0, d, x.data.ptr, 0.0, d, y.data.ptr)
    assert low.getStream(h) == cupy.cuda.get_current_stream().ptr
    low.destroy(h)


@pytest.mark.gpu
def test_gpu_helpers_on_cupy_arrays_match_the_cpu_reference(shimmed, rng):
    """cupyx.cudnn helpers on CuPy arrays (GPU) against the same helpers on NumPy arrays (CPU
    reference engine), in float64 so the engines must agree closely."""
    import cupy
    helpers = importlib.import_module("cupyx.cudnn")
    g = cupy.asarray
    x, W, b = rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    for auto_tune in (False, True):
        y_c, y_g = np.empty((2, 4, 6, 5)), cupy.empty((2, 4, 6, 5))
        helpers.convolution_forward(x, W, b, y_c, (1, 1), (1, 1), (1, 1), 1, auto_tune=auto_tune, tensor_core="auto")
        helpers.convolution_forward(g(x), g(W), g(b), y_g, (1, 1), (1, 1), (1, 1), 1, auto_tune=auto_tune,
                                    tensor_core="auto")
        close(y_g.get(), y_c, 1e-9)
    gy = rng.standard_normal(y_c.shape)
    gx_c, gx_g = np.empty_like(x), cupy.empty(x.shape)
    helpers.convolution_backward_data(W, gy, None, gx_c, (1, 1), (1, 1), (1, 1), 1, deterministic=False,
                                      auto_tune=False, tensor_core="never")
    helpers.convolution_backward_data(g(W), g(gy), None, gx_g, (1, 1), (1, 1), (1, 1), 1, deterministic=False,
                                      auto_tune=False, tensor_core="never")
    close(gx_g.get(), gx_c, 1e-9)
    gW_c, gW_g = np.empty_like(W), cupy.empty(W.shape)
    helpers.convolution_backward_filter(x, gy, gW_c, (1, 1), (1, 1), (1, 1), 1, deterministic=True, auto_tune=False,
                                        tensor_core="never")
    helpers.convolution_backward_filter(g(x), g(gy), gW_g, (1, 1), (1, 1), (1, 1), 1, deterministic=True,
                                        auto_tune=False, tensor_core="never")
    close(gW_g.get(), gW_c, 1e-9)
    p_c, p_g = np.empty((2, 4, 3, 2)), cupy.empty((2, 4, 3, 2))
    helpers.pooling_forward(y_c, p_c, (2, 2), (2, 2), (0, 0), L.CUDNN_POOLING_MAX)
    helpers.pooling_forward(g(y_c), p_g, (2, 2), (2, 2), (0, 0), L.CUDNN_POOLING_MAX)
    close(p_g.get(), p_c, 1e-12)
    close(helpers.activation_forward(g(y_c), L.CUDNN_ACTIVATION_TANH).get(),
          helpers.activation_forward(y_c, L.CUDNN_ACTIVATION_TANH), 1e-12)
    close(helpers.softmax_forward(g(y_c), 1, L.CUDNN_SOFTMAX_LOG).get(),
          helpers.softmax_forward(y_c, 1, L.CUDNN_SOFTMAX_LOG), 1e-12)
    gamma, beta = 1 + rng.standard_normal(4) * 0.1, rng.standard_normal(4) * 0.1
    rm_c, rv_c, rm_g, rv_g = np.zeros(4), np.ones(4), cupy.zeros(4), cupy.ones(4)
    bn_c = helpers.batch_normalization_forward_training(y_c, gamma, beta, rm_c, rv_c, None, None, 1e-5, 0.9, True,
                                                        L.CUDNN_BATCHNORM_SPATIAL, False)
    bn_g = helpers.batch_normalization_forward_training(g(y_c), g(gamma), g(beta), rm_g, rv_g, None, None, 1e-5, 0.9,
                                                        True, L.CUDNN_BATCHNORM_SPATIAL, False)
    for a, c in zip(bn_g, bn_c):
        close(a.get(), c, 1e-10)
    close(rv_g.get(), rv_c, 1e-10)
    gb_c = helpers.batch_normalization_backward(y_c, gamma, gy, bn_c[1], bn_c[2], 1e-5, True,
                                                L.CUDNN_BATCHNORM_SPATIAL, False)
    gb_g = helpers.batch_normalization_backward(g(y_c), g(gamma), g(gy), bn_g[1], bn_g[2], 1e-5, True,
                                                L.CUDNN_BATCHNORM_SPATIAL, False)
    for a, c in zip(gb_g, gb_c):
        close(a.get(), c, 1e-9)
    # dropout masks are a function of (seed, offset) on every engine
    st_c = helpers.DropoutStates(cc.cudnnCreate("cpu"), 99)
    st_g = helpers.DropoutStates(None, 99)
    xd = rng.standard_normal((8, 16)).astype(np.float32)
    close(st_g.forward(None, g(xd), 0.25)[1].get(), st_c.forward(None, xd, 0.25)[1], 1e-6)
