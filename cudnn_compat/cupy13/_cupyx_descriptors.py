"""``cupyx.cudnn``'s descriptors: ``Descriptor`` (an owned handle), the cuDNN data type of a
dtype, and the ``create_*_descriptor`` factories with CuPy 13's ``_create_*`` setters
(cudnnSetTensorNdDescriptor 002 §3.2.93 and kin); ``add_tensor`` and the Tensor Core rule."""
from __future__ import annotations

import numpy as _numpy

from . import cupy_cudnn as cudnn
from .._core.place import default_place as _default_place
from ._cupyx_place import _get_nd_tensor_cache, _xp, get_handle


class Descriptor:
    """An owned descriptor: ``.value`` (the int), destroyed with ``destroy`` when collected."""

    def __init__(self, descriptor, destroyer):
        self.value = descriptor
        self.destroy = destroyer

    def __del__(self):
        if self.value:
            try:
                self.destroy(self.value)
            except Exception:  # noqa: BLE001 - destroyed elsewhere, or interpreter shutdown
                pass
            self.value = 0


def get_data_type(dtype) -> int:
    t = _numpy.dtype(dtype).char
    if t == "f":
        return cudnn.CUDNN_DATA_FLOAT
    if t == "d":
        return cudnn.CUDNN_DATA_DOUBLE
    if t == "e":
        return cudnn.CUDNN_DATA_HALF
    raise TypeError("Dtype {} is not supported in cuDNN".format(dtype))


def _get_byte_size(data_type: int) -> int:
    sizes = {cudnn.CUDNN_DATA_HALF: 2, cudnn.CUDNN_DATA_FLOAT: 4, cudnn.CUDNN_DATA_DOUBLE: 8}
    if data_type not in sizes:
        raise TypeError("Invalid cuDNN data type: {}".format(data_type))
    return sizes[data_type]


# -- descriptor factories ---------------------------------------------------------------------------

def _create_tensor_nd_descriptor(desc, arr, data_type=-1):
    if data_type == -1:
        data_type = get_data_type(arr.dtype)
    shape = list(arr.shape)
    strides = [s // arr.itemsize for s in arr.strides]
    next_stride = 1  # "c-contiguous stride" with the next axis where ambiguous
    for i in reversed(range(len(shape))):
        if shape[i] <= 1:
            strides[i] = next_stride
        else:
            next_stride = shape[i] * strides[i]
    cudnn.setTensorNdDescriptor(desc, data_type, arr.ndim, shape, strides)


def _create_tensor_descriptor(desc, arr, format=cudnn.CUDNN_TENSOR_NCHW):
    if not arr.flags.c_contiguous:
        raise ValueError("cupyx.cudnn supports c-contiguous arrays only")
    if arr.ndim == 4:
        data_type = get_data_type(arr.dtype)
        if format == cudnn.CUDNN_TENSOR_NCHW:
            n, c, h, w = arr.shape
        elif format == cudnn.CUDNN_TENSOR_NHWC:
            n, h, w, c = arr.shape
        else:
            raise ValueError("unknown cudnnTensorFormat: {}".format(format))
        cudnn.setTensor4dDescriptor(desc, format, data_type, n, c, h, w)
    else:
        _create_tensor_nd_descriptor(desc, arr)


def _create_tensor_descriptor_as4darray(desc, arr):
    assert arr.flags.c_contiguous
    dim1 = arr.shape[0] if arr.ndim > 0 else 1
    dim2 = arr.size // dim1
    cudnn.setTensor4dDescriptor(desc, cudnn.CUDNN_TENSOR_NCHW, get_data_type(arr.dtype), dim1, dim2, 1, 1)


def _create_filter_descriptor(desc, arr, format=cudnn.CUDNN_TENSOR_NCHW):
    data_type = get_data_type(arr.dtype)
    if arr.ndim == 4:
        if format == cudnn.CUDNN_TENSOR_NCHW:
            k, c, h, w = arr.shape
        elif format == cudnn.CUDNN_TENSOR_NHWC:
            k, h, w, c = arr.shape
        else:
            raise ValueError("unknown cudnnTensorFormat: {}".format(format))
        cudnn.setFilter4dDescriptor_v4(desc, data_type, format, k, c, h, w)
    else:
        cudnn.setFilterNdDescriptor_v4(desc, data_type, format, arr.ndim, list(arr.shape))


def _create_convolution_descriptor(desc, pad, stride, dilation, groups, dtype, mode, use_tensor_core):
    ndim = len(pad)
    if ndim != len(stride):
        raise ValueError("pad and stride must be of same length")
    compute_type = get_data_type(dtype)
    if compute_type == cudnn.CUDNN_DATA_HALF:  # CuPy 13: FP32 arithmetic for FP16 storage
        compute_type = cudnn.CUDNN_DATA_FLOAT
    if ndim != 2:
        dil = [1] * ndim if dilation is None else list(dilation)
        cudnn.setConvolutionNdDescriptor_v3(desc, ndim, list(pad), list(stride), dil, mode, compute_type)
    else:
        d0, d1 = (1, 1) if dilation is None else dilation
        p0, p1 = pad
        s0, s1 = stride
        cudnn.setConvolution2dDescriptor_v5(desc, p0, p1, s0, s1, d0, d1, mode, compute_type)
    if use_tensor_core:
        cudnn.setConvolutionMathType(desc, cudnn.CUDNN_TENSOR_OP_MATH)
    if groups > 1:
        cudnn.setConvolutionGroupCount(desc, groups)


def _ascontiguousarray_normalized_strides(a):
    return a.copy() if a.flags.c_contiguous else _xp(a).ascontiguousarray(a)


def create_tensor_descriptor(arr, format=cudnn.CUDNN_TENSOR_NCHW):
    desc = Descriptor(cudnn.createTensorDescriptor(), cudnn.destroyTensorDescriptor)
    _create_tensor_descriptor(desc.value, arr, format)
    return desc


def create_uninitialized_tensor_descriptor():
    """A cudnnTensorDescriptor_t not yet set (the batch normalization helpers fill it)."""
    return Descriptor(cudnn.createTensorDescriptor(), cudnn.destroyTensorDescriptor)


def create_tensor_nd_descriptor(arr):
    if arr.size == 0:
        return Descriptor(0, None)
    if not arr.flags.c_contiguous:
        raise ValueError("cupyx.cudnn supports c-contiguous arrays only")
    data_type = get_data_type(arr.dtype)
    key = (data_type, tuple(arr.shape))
    cache = _get_nd_tensor_cache()
    if key in cache:
        return cache[key]
    desc = Descriptor(cudnn.createTensorDescriptor(), cudnn.destroyTensorDescriptor)
    _create_tensor_nd_descriptor(desc.value, arr, data_type)
    cache[key] = desc
    return desc


def create_filter_descriptor(arr, format=cudnn.CUDNN_TENSOR_NCHW):
    desc = Descriptor(cudnn.createFilterDescriptor(), cudnn.destroyFilterDescriptor)
    _create_filter_descriptor(desc.value, arr, format)
    return desc


def create_convolution_descriptor(pad, stride, dtype, mode=cudnn.CUDNN_CROSS_CORRELATION, dilation=None,
                                  use_tensor_core=False, groups=1):
    desc = Descriptor(cudnn.createConvolutionDescriptor(), cudnn.destroyConvolutionDescriptor)
    _create_convolution_descriptor(desc.value, pad, stride, dilation, groups, dtype, mode, use_tensor_core)
    return desc


def _create_pooling_descriptor(desc, ksize, stride, pad, mode):
    ndim = len(ksize)
    if ndim != len(stride) or ndim != len(pad):
        raise ValueError("ksize, stride, and pad must be of same length")
    if ndim == 2:
        cudnn.setPooling2dDescriptor_v4(desc, mode, cudnn.CUDNN_NOT_PROPAGATE_NAN, ksize[0], ksize[1], pad[0],
                                        pad[1], stride[0], stride[1])
    else:
        cudnn.setPoolingNdDescriptor_v4(desc, mode, cudnn.CUDNN_NOT_PROPAGATE_NAN, ndim, list(ksize), list(pad),
                                        list(stride))
    return desc


def create_pooling_descriptor(ksize, stride, pad, mode):
    desc = Descriptor(cudnn.createPoolingDescriptor(), cudnn.destroyPoolingDescriptor)
    _create_pooling_descriptor(desc.value, ksize, stride, pad, mode)
    return desc


def create_activation_descriptor(mode, relu_nan_opt=cudnn.CUDNN_PROPAGATE_NAN, coef=0.0):
    desc = Descriptor(cudnn.createActivationDescriptor(), cudnn.destroyActivationDescriptor)
    cudnn.setActivationDescriptor(desc.value, mode, relu_nan_opt, coef)
    return desc


def create_dropout_descriptor(handle, dropout, states, state_size_in_bytes, seed):
    desc = Descriptor(cudnn.createDropoutDescriptor(), cudnn.destroyDropoutDescriptor)
    cudnn.setDropoutDescriptor(desc.value, handle, dropout, states, state_size_in_bytes, seed)
    return desc


def set_dropout_descriptor(desc, handle, dropout):
    """Change the probability only, keeping the random state (CuPy 13 passed NULL states, which
    002 §3.2.80 defines as "only the dropout value will be set"); done with
    cudnnRestoreDropoutDescriptor on the attached states, which does not re-seed them."""
    _, states, seed = cudnn.getDropoutDescriptor(desc.value, handle)
    if states is None or (isinstance(states, int) and states == 0):
        cudnn.setDropoutDescriptor(desc.value, handle, dropout, 0, 0, 0)
    else:
        cudnn.restoreDropoutDescriptor(desc.value, handle, dropout, states, cudnn.dropoutGetStatesSize(handle), seed)


def _create_ctc_loss_descriptor(data_type):
    desc = Descriptor(cudnn.createCTCLossDescriptor(), cudnn.destroyCTCLossDescriptor)
    cudnn.setCTCLossDescriptor(desc.value, data_type)
    return desc


def create_rnn_descriptor(hidden_size, num_layers, dropout_desc, input_mode, direction, mode, data_type, algo=None):
    desc = Descriptor(cudnn.createRNNDescriptor(), cudnn.destroyRNNDescriptor)
    if algo is None:
        algo = cudnn.CUDNN_RNN_ALGO_STANDARD
    cudnn.setRNNDescriptor_v6(get_handle(), desc.value, hidden_size, num_layers, dropout_desc.value, input_mode,
                              direction, mode, algo, data_type)
    return desc


def create_spatial_transformer_descriptor(sampler_type, dtype, nb_dims, dim_A):
    desc = Descriptor(cudnn.createSpatialTransformerDescriptor(), cudnn.destroySpatialTransformerDescriptor)
    cudnn.setSpatialTransformerDescriptor(desc.value, sampler_type, get_data_type(dtype), nb_dims, dim_A)
    return desc


def create_op_tensor_descriptor(op_type, dtype):
    desc = Descriptor(cudnn.createOpTensorDescriptor(), cudnn.destroyOpTensorDescriptor)
    cudnn.setOpTensorDescriptor(desc.value, op_type, get_data_type(dtype), cudnn.CUDNN_NOT_PROPAGATE_NAN)
    return desc


def create_reduce_tensor_descriptor(reduce_type, dtype):
    desc = Descriptor(cudnn.createReduceTensorDescriptor(), cudnn.destroyReduceTensorDescriptor)
    if reduce_type in (cudnn.CUDNN_REDUCE_TENSOR_MIN, cudnn.CUDNN_REDUCE_TENSOR_MAX):
        indices = cudnn.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES
    else:
        indices = cudnn.CUDNN_REDUCE_TENSOR_NO_INDICES
    cudnn.setReduceTensorDescriptor(desc.value, reduce_type, get_data_type(dtype), cudnn.CUDNN_NOT_PROPAGATE_NAN,
                                    indices, cudnn.CUDNN_32BIT_INDICES)
    return desc


def add_tensor(handle, alpha, biasDesc, biasData, beta, srcDestDesc, srcDestData):
    cudnn.addTensor_v3(handle, alpha, biasDesc, biasData, beta, srcDestDesc, srcDestData)


def is_tensor_core_available(dtype) -> bool:
    """CuPy 13's rule: half data on a compute-capability-7.0 GPU."""
    if _numpy.dtype(dtype).char != "e" or _default_place() != "gpu":
        return False
    import cupy
    return int(cupy.cuda.Device().compute_capability) == 70


def _should_use_tensor_core(tensor_core_mode, dtype) -> bool:
    if tensor_core_mode in ("auto", "always"):
        return is_tensor_core_available(dtype)
    if tensor_core_mode == "never":
        return False
    raise ValueError('tensor_code_mode must be either of "always", "auto", or "never".')


def _get_array_info(arr):
    if arr is None:
        return "None"
    return "shape={!r}, dtype={}, strides={!r}".format(arr.shape, arr.dtype.name, arr.strides)
