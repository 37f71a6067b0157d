"""The REAL legacy libcudnn functions that libcudnn 9 still exports, through ctypes: the
ground truth ("legacy") side of GPU tests and benchmarks.  Not used by any engine.

Function names and argument orders are cuDNN's (002 ch. 3-6); ``call(name, *args)``
raises ``LegacyError`` on any status but SUCCESS.  Small helpers build descriptors from
IR-style dims/strides and wrap the perf-struct queries.  Pointers are ints (use
``cupy.ndarray.data.ptr``); alpha/beta are Python floats, passed as float or double
as 002 "Scaling Parameters" says (double for DOUBLE data).
"""
from __future__ import annotations

import ctypes

from .engines.cudnn_engine import lib as _lib

_vp, _int, _sz, _dbl = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_double
_pvp, _pint, _psz = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_size_t)


class AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (identical layouts)."""
    _fields_ = [("algo", _int), ("status", _int), ("time", ctypes.c_float), ("memory", _sz),
                ("determinism", _int), ("mathType", _int), ("reserved", _int * 3)]


_PERF = ctypes.POINTER(AlgoPerf)
_GET_ALGO = [_vp, _vp, _vp, _vp, _vp, _int, _pint, _PERF]
_WS = [_vp, _vp, _vp, _vp, _vp, _int, _psz]
PROTOTYPES = {
    "cudnnCreateTensorDescriptor": [_pvp], "cudnnDestroyTensorDescriptor": [_vp],
    "cudnnSetTensorNdDescriptor": [_vp, _int, _int, _pint, _pint],
    "cudnnCreateFilterDescriptor": [_pvp], "cudnnDestroyFilterDescriptor": [_vp],
    "cudnnSetFilterNdDescriptor": [_vp, _int, _int, _int, _pint],
    "cudnnCreateConvolutionDescriptor": [_pvp], "cudnnDestroyConvolutionDescriptor": [_vp],
    "cudnnSetConvolutionNdDescriptor": [_vp, _int, _pint, _pint, _pint, _int, _int],
    "cudnnSetConvolutionGroupCount": [_vp, _int], "cudnnSetConvolutionMathType": [_vp, _int],
    "cudnnGetConvolutionForwardWorkspaceSize": _WS,
    "cudnnGetConvolutionBackwardDataWorkspaceSize": _WS,
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": _WS,
    "cudnnGetConvolutionForwardAlgorithm_v7": _GET_ALGO,
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": _GET_ALGO,
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": _GET_ALGO,
    "cudnnFindConvolutionForwardAlgorithm": _GET_ALGO,
    "cudnnFindConvolutionBackwardDataAlgorithm": _GET_ALGO,
    "cudnnFindConvolutionBackwardFilterAlgorithm": _GET_ALGO,
    "cudnnConvolutionForward": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _int, _vp, _sz, _vp, _vp, _vp],
    "cudnnConvolutionBackwardData": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _int, _vp, _sz, _vp, _vp, _vp],
    "cudnnConvolutionBackwardFilter": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _int, _vp, _sz, _vp, _vp, _vp],
    "cudnnConvolutionBiasActivationForward": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _int, _vp, _sz, _vp, _vp, _vp,
                                              _vp, _vp, _vp, _vp, _vp],
    "cudnnAddTensor": [_vp, _vp, _vp, _vp, _vp, _vp, _vp],
    "cudnnCreateActivationDescriptor": [_pvp], "cudnnDestroyActivationDescriptor": [_vp],
    "cudnnSetActivationDescriptor": [_vp, _int, _int, _dbl],
    "cudnnActivationForward": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp],
    "cudnnCreatePoolingDescriptor": [_pvp], "cudnnDestroyPoolingDescriptor": [_vp],
    "cudnnSetPoolingNdDescriptor": [_vp, _int, _int, _int, _pint, _pint, _pint],
    "cudnnPoolingForward": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp],
    "cudnnSoftmaxForward": [_vp, _int, _int, _vp, _vp, _vp, _vp, _vp, _vp],
    "cudnnBatchNormalizationForwardTraining": [_vp, _int, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _dbl,
                                               _vp, _vp, _dbl, _vp, _vp],
    "cudnnBatchNormalizationForwardInference": [_vp, _int, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                                _vp, _dbl],
    # cudnn-compat replay --engine legacy (issue 9)
    "cudnnCreateOpTensorDescriptor": [_pvp], "cudnnDestroyOpTensorDescriptor": [_vp],
    "cudnnSetOpTensorDescriptor": [_vp, _int, _int, _int],
    "cudnnOpTensor": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp],
}
# the v8 RNN API and dropout (cudnn_adv.h / cudnn_ops.h of cuDNN 9, unchanged since 8.0); helpers in legacy_cudnn_rnn
_u32, _f32, _ull = ctypes.c_uint32, ctypes.c_float, ctypes.c_ulonglong
PROTOTYPES.update({
    "cudnnCreateRNNDescriptor": [_pvp], "cudnnDestroyRNNDescriptor": [_vp],
    "cudnnSetRNNDescriptor_v8": [_vp] + [_int] * 12 + [_vp, _u32],
    "cudnnCreateRNNDataDescriptor": [_pvp], "cudnnDestroyRNNDataDescriptor": [_vp],
    "cudnnSetRNNDataDescriptor": [_vp, _int, _int, _int, _int, _int, _pint, _vp],
    "cudnnGetRNNWeightSpaceSize": [_vp, _vp, _psz],
    "cudnnGetRNNTempSpaceSizes": [_vp, _vp, _int, _vp, _psz, _psz],
    "cudnnGetRNNWeightParams": [_vp, _vp, _int, _sz, _vp, _int, _vp, _pvp, _vp, _pvp],
    "cudnnRNNForward": [_vp, _vp, _int, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _sz, _vp, _sz, _vp,
                        _sz, _vp],
    "cudnnCreateDropoutDescriptor": [_pvp], "cudnnDestroyDropoutDescriptor": [_vp],
    "cudnnDropoutGetStatesSize": [_vp, _psz],
    "cudnnSetDropoutDescriptor": [_vp, _vp, _f32, _vp, _sz, _ull],
    "cudnnGetTensorNdDescriptor": [_vp, _int, _pint, _pint, _pint, _pint],
    "cudnnRNNBackwardData_v8": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _sz, _vp,
                                _sz, _vp, _sz, _vp],
    "cudnnRNNBackwardWeights_v8": [_vp, _vp, _int, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _sz, _vp, _sz, _vp, _sz, _vp],
})
# CTC loss and the spatial-transformer sampler (cudnn_adv.h / cudnn_cnn.h of cuDNN 9)
PROTOTYPES.update({
    "cudnnCreateCTCLossDescriptor": [_pvp], "cudnnDestroyCTCLossDescriptor": [_vp],
    "cudnnSetCTCLossDescriptorEx": [_vp, _int, _int, _int],
    "cudnnGetCTCLossWorkspaceSize": [_vp, _vp, _vp, _pint, _pint, _pint, _int, _vp, _psz],
    "cudnnCTCLoss": [_vp, _vp, _vp, _pint, _pint, _pint, _vp, _vp, _vp, _int, _vp, _vp, _sz],
    "cudnnCreateSpatialTransformerDescriptor": [_pvp], "cudnnDestroySpatialTransformerDescriptor": [_vp],
    "cudnnSetSpatialTransformerNdDescriptor": [_vp, _int, _int, _int, _pint],
    "cudnnSpatialTfSamplerForward": [_vp] * 9,
    "cudnnSpatialTfSamplerBackward": [_vp] * 14,
})
# backward passes and normalizations of cudnn_ops.h (cuDNN 9 still exports them): the GPU tests' oracle
_BWD12 = [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp]
PROTOTYPES.update({
    "cudnnActivationBackward": _BWD12,
    "cudnnSetActivationDescriptorSwishBeta": [_vp, _dbl],
    "cudnnPoolingBackward": _BWD12,
    "cudnnSoftmaxBackward": [_vp, _int, _int, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp],
    "cudnnCreateLRNDescriptor": [_pvp], "cudnnDestroyLRNDescriptor": [_vp],
    "cudnnSetLRNDescriptor": [_vp, ctypes.c_uint, _dbl, _dbl, _dbl],
    "cudnnLRNCrossChannelForward": [_vp, _vp, _int, _vp, _vp, _vp, _vp, _vp, _vp],
    "cudnnLRNCrossChannelBackward": [_vp, _vp, _int] + [_vp] * 10,
    "cudnnDivisiveNormalizationForward": [_vp, _vp, _int] + [_vp] * 9,
    "cudnnDivisiveNormalizationBackward": [_vp, _vp, _int] + [_vp] * 11,
    "cudnnDeriveBNTensorDescriptor": [_vp, _vp, _int],
    "cudnnBatchNormalizationBackward": [_vp, _int] + [_vp] * 14 + [_dbl, _vp, _vp],
    "cudnnDeriveNormTensorDescriptor": [_vp, _vp, _vp, _int, _int],
    "cudnnGetNormalizationForwardTrainingWorkspaceSize": [_vp, _int, _int, _int] + [_vp] * 6 + [_psz, _int],
    "cudnnGetNormalizationBackwardWorkspaceSize": [_vp, _int, _int, _int] + [_vp] * 8 + [_psz, _int],
    "cudnnGetNormalizationTrainingReserveSpaceSize": [_vp, _int, _int, _int, _vp, _vp, _psz, _int],
    "cudnnNormalizationForwardTraining": [_vp, _int, _int, _int] + [_vp] * 7 + [_dbl, _vp, _vp, _vp, _dbl]
                                         + [_vp] * 8 + [_sz, _vp, _sz, _int],
    "cudnnNormalizationForwardInference": [_vp, _int, _int, _int] + [_vp] * 15 + [_dbl, _int],
    "cudnnNormalizationBackward": [_vp, _int, _int, _int] + [_vp] * 19 + [_dbl] + [_vp] * 5 + [_sz, _vp, _sz, _int],
})
# multi-head attention (cudnn_adv.h of cuDNN 9, deprecated but exported)
PROTOTYPES.update({
    "cudnnCreateAttnDescriptor": [_pvp], "cudnnDestroyAttnDescriptor": [_vp],
    "cudnnSetAttnDescriptor": [_vp, ctypes.c_uint, _int, _dbl, _int, _int, _int, _vp, _vp] + [_int] * 11,
    "cudnnGetMultiHeadAttnBuffers": [_vp, _vp, _psz, _psz, _psz],
    "cudnnGetMultiHeadAttnWeights": [_vp, _vp, _int, _sz, _vp, _vp, _pvp],
    "cudnnCreateSeqDataDescriptor": [_pvp], "cudnnDestroySeqDataDescriptor": [_vp],
    "cudnnSetSeqDataDescriptor": [_vp, _int, _int, _pint, _pint, _sz, _pint, _vp],
    "cudnnMultiHeadAttnForward": [_vp, _vp, _int, _pint, _pint, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                  _sz, _vp, _sz, _vp, _sz, _vp],
    "cudnnMultiHeadAttnBackwardData": [_vp, _vp, _pint, _pint, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
                                       _vp, _vp, _sz, _vp, _sz, _vp, _sz, _vp],
    "cudnnMultiHeadAttnBackwardWeights": [_vp, _vp, _int, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _sz, _vp, _vp, _sz,
                                          _vp, _sz, _vp],
})
# the fused-ops API (cudnn_cnn.h of cuDNN 9): const pack attributes are pointers to the value (a descriptor
# is passed as itself), variant pack pointers are device addresses or pointers to host scalars
PROTOTYPES.update({
    "cudnnCreateFusedOpsConstParamPack": [_pvp, _int], "cudnnDestroyFusedOpsConstParamPack": [_vp],
    "cudnnSetFusedOpsConstParamPackAttribute": [_vp, _int, _vp],
    "cudnnCreateFusedOpsVariantParamPack": [_pvp, _int], "cudnnDestroyFusedOpsVariantParamPack": [_vp],
    "cudnnSetFusedOpsVariantParamPackAttribute": [_vp, _int, _vp],
    "cudnnCreateFusedOpsPlan": [_pvp, _int], "cudnnDestroyFusedOpsPlan": [_vp],
    "cudnnMakeFusedOpsPlan": [_vp, _vp, _vp, _psz],
    "cudnnFusedOpsExecute": [_vp, _vp, _vp],
})
# cudnnDataType_t of IR dtype names (identical in cuDNN 8 and 9)
DATA_TYPE = _lib.DATA_TYPE
TENSOR_NCHW, TENSOR_NHWC = 0, 1
CONVOLUTION, CROSS_CORRELATION = 0, 1
MATH = {"DEFAULT_MATH": 0, "TENSOR_OP_MATH": 1, "TENSOR_OP_MATH_ALLOW_CONVERSION": 2, "FMA_MATH": 3}
ACTIVATION = {"SIGMOID": 0, "RELU": 1, "TANH": 2, "CLIPPED_RELU": 3, "ELU": 4, "IDENTITY": 5, "SWISH": 6}
FWD_ALGOS = ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD",
             "WINOGRAD_NONFUSED")

_ready: dict = {}


class LegacyError(Exception):
    def __init__(self, func, status):
        self.func, self.status = func, status
        super().__init__(f"{func} returned {_lib.STATUS_NAME.get(status, status)}: {_lib.last_error()}")


def load():
    lib = _lib.load()
    if not _ready:
        for name, args in PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = _int, args
        _ready["ok"] = True
    return lib


def call(name: str, *args) -> None:
    st = getattr(load(), name)(*args)
    if st:
        raise LegacyError(name, st)


def _ints(vals):
    vals = [int(v) for v in vals]
    return (ctypes.c_int * len(vals))(*vals)


def _create(kind: str) -> int:
    p = ctypes.c_void_p()
    call(f"cudnnCreate{kind}Descriptor", ctypes.byref(p))
    return p.value


def scalar_ptr(value: float, dtype: str):
    """A host pointer to alpha/beta of the type 002 asks for (kept alive by the caller)."""
    return (ctypes.c_double if dtype == "float64" else ctypes.c_float)(value)


class Handle:
    """A real cudnnHandle_t (separate from the engine's), optionally bound to a stream."""

    def __init__(self, stream_ptr: int = 0):
        load()
        p = ctypes.c_void_p()
        call("cudnnCreate", ctypes.byref(p))
        self.ptr = p.value
        if stream_ptr:
            call("cudnnSetStream", self.ptr, stream_ptr)

    def destroy(self):
        if self.ptr:
            call("cudnnDestroy", self.ptr)
            self.ptr = None


class Descs:
    """Owns the legacy descriptors it makes; ``destroy()`` frees them all."""

    def __init__(self):
        self._made = []

    def tensor(self, dims, strides, dtype: str) -> int:
        d = _create("Tensor")
        self._made.append(("Tensor", d))
        call("cudnnSetTensorNdDescriptor", d, DATA_TYPE[dtype], len(dims), _ints(dims), _ints(strides))
        return d

    def filter(self, dims, dtype: str, nhwc: bool = False) -> int:
        d = _create("Filter")
        self._made.append(("Filter", d))
        call("cudnnSetFilterNdDescriptor", d, DATA_TYPE[dtype], TENSOR_NHWC if nhwc else TENSOR_NCHW, len(dims),
             _ints(dims))
        return d

    def conv(self, pad, stride, dilation, mode: str = "CROSS_CORRELATION", compute: str = "float32",
             groups: int = 1, math: str = "DEFAULT_MATH") -> int:
        d = _create("Convolution")
        self._made.append(("Convolution", d))
        call("cudnnSetConvolutionNdDescriptor", d, len(pad), _ints(pad), _ints(stride), _ints(dilation),
             CROSS_CORRELATION if mode == "CROSS_CORRELATION" else CONVOLUTION, DATA_TYPE[compute])
        call("cudnnSetConvolutionGroupCount", d, int(groups))
        call("cudnnSetConvolutionMathType", d, MATH[math])
        return d

    def activation(self, mode: str = "RELU", coef: float = 0.0, propagate_nan: bool = False) -> int:
        d = _create("Activation")
        self._made.append(("Activation", d))
        call("cudnnSetActivationDescriptor", d, ACTIVATION[mode], int(propagate_nan), float(coef))
        return d

    def pooling(self, mode: int, window, pad, stride, propagate_nan: bool = False) -> int:
        d = _create("Pooling")
        self._made.append(("Pooling", d))
        call("cudnnSetPoolingNdDescriptor", d, int(mode), int(propagate_nan), len(window), _ints(window),
             _ints(pad), _ints(stride))
        return d

    def lrn(self, n: int, alpha: float, beta: float, k: float) -> int:
        d = _create("LRN")
        self._made.append(("LRN", d))
        call("cudnnSetLRNDescriptor", d, int(n), float(alpha), float(beta), float(k))
        return d

    def op_tensor(self, op: int, compute: str = "float32", propagate_nan: bool = False) -> int:
        d = _create("OpTensor")
        self._made.append(("OpTensor", d))
        call("cudnnSetOpTensorDescriptor", d, int(op), DATA_TYPE[compute], int(propagate_nan))
        return d

    def destroy(self):
        for kind, d in reversed(self._made):
            call(f"cudnnDestroy{kind}Descriptor", d)
        self._made = []


def perf_list(func: str, handle, d1, d2, conv, d3, count: int = 16) -> list:
    """Get*Algorithm_v7 / Find*Algorithm results as dicts, best first (status SUCCESS only)."""
    arr = (AlgoPerf * count)()
    n = ctypes.c_int(0)
    call(func, handle.ptr if isinstance(handle, Handle) else handle, d1, d2, conv, d3, count, ctypes.byref(n), arr)
    return [dict(algo=p.algo, time=p.time, memory=p.memory, determinism=p.determinism, mathType=p.mathType)
            for p in arr[: n.value] if p.status == 0]


def workspace_size(func: str, handle, d1, d2, conv, d3, algo: int) -> int:
    s = ctypes.c_size_t(0)
    call(func, handle.ptr if isinstance(handle, Handle) else handle, d1, d2, conv, d3, int(algo), ctypes.byref(s))
    return int(s.value)
