"""``cupyx.cudnn``'s batch normalization helpers (cudnnBatchNormalizationForwardTrainingEx
002 §4.1.5, the inference forward and cudnnBatchNormalizationBackwardEx), on the descriptor
cudnnDeriveBNTensorDescriptor derives, read with the Nd getter (5-d inputs work)."""
from __future__ import annotations

import warnings as _warnings

import numpy as _numpy

from . import cupy_cudnn as cudnn
from ._cupyx_descriptors import _create_tensor_descriptor, get_data_type
from ._cupyx_place import (_alloc, _contiguous, _empty, _handle_for, _mem, _mem_size, _performance_warning,
                           _place)


def _create_tensor_descriptor_for_bn(desc, arr, is_for_conv2d, format=cudnn.CUDNN_TENSOR_NCHW):
    assert arr.flags.c_contiguous
    if is_for_conv2d:
        _create_tensor_descriptor(desc, arr, format)
        return
    dim2 = arr.shape[-1] if arr.ndim > 0 else 1
    dim1 = arr.size // dim2
    cudnn.setTensor4dDescriptor(desc, cudnn.CUDNN_TENSOR_NCHW, get_data_type(arr.dtype), dim1, dim2, 1, 1)


def _get_dtype_of_tensor_descriptor(desc):
    cudnn_dtype = cudnn.getTensorNdDescriptor(desc, 8)[0]
    dtypes = {cudnn.CUDNN_DATA_DOUBLE: _numpy.float64, cudnn.CUDNN_DATA_FLOAT: _numpy.float32,
              cudnn.CUDNN_DATA_HALF: _numpy.float16}
    if cudnn_dtype not in dtypes:
        raise RuntimeError("Unknown cudnn data type {} ".format(cudnn_dtype))
    return _numpy.dtype(dtypes[cudnn_dtype])


def _set_bn_descriptors(x_desc, bn_desc, x, is_for_conv2d, cudnn_mode, d_layout):
    """Set x's descriptor and derive the parameters' one from it (cudnnDeriveBNTensorDescriptor,
    002 §3.2.18); the parameters' dtype."""
    _create_tensor_descriptor_for_bn(x_desc, x, is_for_conv2d, format=d_layout)
    cudnn.deriveBNTensorDescriptor(bn_desc, x_desc, cudnn_mode)
    return _get_dtype_of_tensor_descriptor(bn_desc)


def _warn_runtime_error(handle, cudnn_mode, debug):
    """``debug`` with the persistent mode: warn of what cudnnQueryRuntimeError (002 §3.2.70) reports."""
    if debug and cudnn_mode == cudnn.CUDNN_BATCHNORM_SPATIAL_PERSISTENT:
        rstatus = cudnn.queryRuntimeError(handle, cudnn.CUDNN_ERRQUERY_BLOCKING)
        if rstatus != cudnn.CUDNN_STATUS_SUCCESS:
            _warnings.warn("A numerical overflow might have happened in cuDNN batch normalization (status:{})"
                           .format(rstatus))


def _copy_into(dst, src):
    dst[...] = src


def _batch_normalization_forward_training(x, gamma, beta, running_mean, running_var, mean, inv_std, eps, decay,
                                          is_for_conv2d, cudnn_mode, debug, d_layout=cudnn.CUDNN_TENSOR_NCHW):
    workspace = reserve_space = None
    if (mean is None) != (inv_std is None):
        raise ValueError("Both mean and inv_std must be None if one is.")
    x = _contiguous(x)
    y = _empty(x.shape, x.dtype, x)
    place = _place(x)
    handle = _handle_for(x)
    x_desc, bn_desc = cudnn.createTensorDescriptor(), cudnn.createTensorDescriptor()
    try:
        dtype_param = _set_bn_descriptors(x_desc, bn_desc, x, is_for_conv2d, cudnn_mode, d_layout)
        if gamma.dtype != dtype_param:
            gamma, beta = gamma.astype(dtype_param), beta.astype(dtype_param)
            running_mean_tmp, running_var_tmp = running_mean.astype(dtype_param), running_var.astype(dtype_param)
        else:
            running_mean_tmp, running_var_tmp = running_mean, running_var
            gamma, beta = _contiguous(gamma), _contiguous(beta)
        if mean is None:
            save_mean = _empty(gamma.shape, dtype_param, x)
            save_inv_std = _empty(gamma.shape, dtype_param, x)
        else:
            save_mean, save_inv_std = mean, inv_std
        factor = 1.0 - decay  # the moving-average factor
        bn_ops = cudnn.CUDNN_BATCHNORM_OPS_BN
        if (cudnn_mode == cudnn.CUDNN_BATCHNORM_SPATIAL_PERSISTENT and x.dtype == _numpy.float16
                and d_layout == cudnn.CUDNN_TENSOR_NHWC and x.shape[3] % 4 == 0):
            # the fast NHWC kernel wants a workspace and a reserve space
            workspace = _alloc(cudnn.getBatchNormalizationForwardTrainingExWorkspaceSize(
                handle, cudnn_mode, bn_ops, x_desc, x_desc, x_desc, bn_desc, 0), place)
            reserve_space = _alloc(cudnn.getBatchNormalizationTrainingExReserveSpaceSize(
                handle, cudnn_mode, bn_ops, 0, x_desc), place)
        cudnn.batchNormalizationForwardTrainingEx(
            handle, cudnn_mode, bn_ops, 1.0, 0.0, x_desc, x, x_desc, 0, x_desc, y, bn_desc, gamma, beta, factor,
            running_mean_tmp, running_var_tmp, eps, save_mean, save_inv_std, 0,
            _mem(workspace), _mem_size(workspace), _mem(reserve_space), _mem_size(reserve_space))
        _warn_runtime_error(handle, cudnn_mode, debug)
    finally:
        cudnn.destroyTensorDescriptor(x_desc)
        cudnn.destroyTensorDescriptor(bn_desc)
    if running_mean is not running_mean_tmp:
        _copy_into(running_mean, running_mean_tmp)
        _copy_into(running_var, running_var_tmp)
    return reserve_space, y, save_mean, save_inv_std


def batch_normalization_forward_training(x, gamma, beta, running_mean, running_var, mean, inv_std, eps, decay,
                                         is_for_conv2d, cudnn_mode, debug, d_layout=cudnn.CUDNN_TENSOR_NCHW):
    """y (and, when ``mean`` is None, the saved mean and inverse std); running_mean / running_var
    are updated in place with factor 1 - decay."""
    reserve_space, y, save_mean, save_inv_std = _batch_normalization_forward_training(
        x, gamma, beta, running_mean, running_var, mean, inv_std, eps, decay, is_for_conv2d, cudnn_mode, debug,
        d_layout)
    if reserve_space is not None:
        _warnings.warn("Could be faster by calling batch_normalization_forward_training_ex() instead of "
                       "batch_normalization_forward_training().", _performance_warning())
    if mean is None:
        return y, save_mean, save_inv_std
    return y


def batch_normalization_forward_training_ex(x, gamma, beta, running_mean, running_var, mean, inv_std, eps, decay,
                                            is_for_conv2d, cudnn_mode, debug, d_layout=cudnn.CUDNN_TENSOR_NCHW):
    reserve_space, y, save_mean, save_inv_std = _batch_normalization_forward_training(
        x, gamma, beta, running_mean, running_var, mean, inv_std, eps, decay, is_for_conv2d, cudnn_mode, debug,
        d_layout)
    if mean is None:
        return reserve_space, y, save_mean, save_inv_std
    return reserve_space, y


def batch_normalization_forward_inference(x, gamma, beta, mean, var, eps, is_for_conv2d, cudnn_mode,
                                          d_layout=cudnn.CUDNN_TENSOR_NCHW):
    x = _contiguous(x)
    y = _empty(x.shape, x.dtype, x)
    handle = _handle_for(x)
    x_desc, bn_desc = cudnn.createTensorDescriptor(), cudnn.createTensorDescriptor()
    try:
        dtype_param = _set_bn_descriptors(x_desc, bn_desc, x, is_for_conv2d, cudnn_mode, d_layout)
        if gamma.dtype != dtype_param:
            gamma, beta = gamma.astype(dtype_param), beta.astype(dtype_param)
            mean, var = mean.astype(dtype_param), var.astype(dtype_param)
        else:
            gamma, beta = _contiguous(gamma), _contiguous(beta)
            mean, var = _contiguous(mean), _contiguous(var)
        cudnn.batchNormalizationForwardInference(handle, cudnn_mode, 1.0, 0.0, x_desc, x, x_desc, y, bn_desc, gamma,
                                                 beta, mean, var, eps)
    finally:
        cudnn.destroyTensorDescriptor(x_desc)
        cudnn.destroyTensorDescriptor(bn_desc)
    return y


def batch_normalization_backward(x, gamma, gy, mean, inv_std, eps, is_for_conv2d, cudnn_mode, debug,
                                 d_layout=cudnn.CUDNN_TENSOR_NCHW, *, reserve_space=None):
    """(gx, ggamma, gbeta) from the saved mean and inverse std of the forward."""
    x, gy = _contiguous(x), _contiguous(gy)
    dtype = x.dtype
    gx = _empty(x.shape, dtype, x)
    handle = _handle_for(x)
    x_desc, bn_desc = cudnn.createTensorDescriptor(), cudnn.createTensorDescriptor()
    try:
        dtype_param = _set_bn_descriptors(x_desc, bn_desc, x, is_for_conv2d, cudnn_mode, d_layout)
        need_cast = gamma.dtype != dtype_param
        gamma = gamma.astype(dtype_param) if need_cast else _contiguous(gamma)
        ggamma = _empty(gamma.shape, dtype_param, x)
        gbeta = _empty(gamma.shape, dtype_param, x)
        bn_ops = cudnn.CUDNN_BATCHNORM_OPS_BN
        workspace = _alloc(cudnn.getBatchNormalizationBackwardExWorkspaceSize(
            handle, cudnn_mode, bn_ops, x_desc, x_desc, x_desc, x_desc, x_desc, bn_desc, 0), _place(x))
        cudnn.batchNormalizationBackwardEx(
            handle, cudnn_mode, bn_ops, 1.0, 0.0, 1.0, 0.0, x_desc, x, x_desc, 0, x_desc, gy, x_desc, 0, x_desc, gx,
            bn_desc, gamma, 0, ggamma, gbeta, eps, _contiguous(mean), _contiguous(inv_std), 0,
            _mem(workspace), _mem_size(workspace), _mem(reserve_space), _mem_size(reserve_space))
        _warn_runtime_error(handle, cudnn_mode, debug)
    finally:
        cudnn.destroyTensorDescriptor(x_desc)
        cudnn.destroyTensorDescriptor(bn_desc)
    if need_cast:
        ggamma, gbeta = ggamma.astype(dtype), gbeta.astype(dtype)
    return gx, ggamma, gbeta
