"""``cupyx.cudnn``'s activation, softmax and pooling helpers (cudnnActivationForward 002 §3.2.1,
cudnnSoftmaxForward §3.2.96, cudnnPoolingForward §3.2.69 and their backward calls)."""
from __future__ import annotations

import numpy as _numpy

from . import cupy_cudnn as cudnn
from ._cupyx_descriptors import (_create_pooling_descriptor, _create_tensor_descriptor_as4darray,
                                 _create_tensor_nd_descriptor, get_data_type)
from ._cupyx_place import _contiguous, _empty, _handle_for


def activation_forward(x, mode, coef=0.0):
    x = _contiguous(x)
    y = _empty(x.shape, x.dtype, x)
    handle = _handle_for(x)
    desc = cudnn.createTensorDescriptor()
    act_desc = cudnn.createActivationDescriptor()
    try:
        _create_tensor_descriptor_as4darray(desc, x)
        cudnn.setActivationDescriptor(act_desc, mode, cudnn.CUDNN_NOT_PROPAGATE_NAN, coef)
        cudnn.activationForward_v4(handle, act_desc, 1.0, desc, x, 0.0, desc, y)
    finally:
        cudnn.destroyActivationDescriptor(act_desc)
        cudnn.destroyTensorDescriptor(desc)
    return y


def activation_backward(x, y, gy, mode, coef=0.0):
    gx = _empty(x.shape, x.dtype, x)
    x, y, gy = _contiguous(x), _contiguous(y), _contiguous(gy)
    handle = _handle_for(x)
    desc = cudnn.createTensorDescriptor()
    act_desc = cudnn.createActivationDescriptor()
    try:
        _create_tensor_descriptor_as4darray(desc, y)
        cudnn.setActivationDescriptor(act_desc, mode, cudnn.CUDNN_NOT_PROPAGATE_NAN, coef)
        cudnn.activationBackward_v4(handle, act_desc, 1.0, desc, y, desc, gy, desc, x, 0.0, desc, gx)
    finally:
        cudnn.destroyActivationDescriptor(act_desc)
        cudnn.destroyTensorDescriptor(desc)
    return gx


def _create_tensor_descriptor_for_softmax(desc, arr, axis) -> int:
    assert arr.flags.c_contiguous
    if axis < 0:
        axis += arr.ndim
    left = int(_numpy.prod(arr.shape[:axis], dtype=_numpy.int64))
    center = arr.shape[axis]
    right = int(_numpy.prod(arr.shape[axis + 1:], dtype=_numpy.int64))
    cudnn.setTensor4dDescriptor(desc, cudnn.CUDNN_TENSOR_NCHW, get_data_type(arr.dtype), left, center, right, 1)
    if center == 1 and right == 1:
        return cudnn.CUDNN_SOFTMAX_MODE_INSTANCE
    return cudnn.CUDNN_SOFTMAX_MODE_CHANNEL


def softmax_forward(x, axis, algorithm):
    x = _contiguous(x)
    y = _empty(x.shape, x.dtype, x)
    handle = _handle_for(x)
    desc = cudnn.createTensorDescriptor()
    try:
        mode = _create_tensor_descriptor_for_softmax(desc, x, axis)
        cudnn.softmaxForward(handle, algorithm, mode, 1.0, desc, x, 0.0, desc, y)
    finally:
        cudnn.destroyTensorDescriptor(desc)
    return y


def softmax_backward(y, gy, axis, algorithm):
    gx = _empty(y.shape, y.dtype, y)
    y, gy = _contiguous(y), _contiguous(gy)
    handle = _handle_for(y)
    desc = cudnn.createTensorDescriptor()
    try:
        mode = _create_tensor_descriptor_for_softmax(desc, y, axis)
        cudnn.softmaxBackward(handle, algorithm, mode, 1.0, desc, y, desc, gy, 0.0, desc, gx)
    finally:
        cudnn.destroyTensorDescriptor(desc)
    return gx


def pooling_forward(x, y, ksize, stride, pad, mode):
    x = _contiguous(x)
    if not y.flags.c_contiguous:
        raise ValueError("pooling_forward supports c-contiguous y only")
    handle = _handle_for(x)
    x_desc, y_desc = cudnn.createTensorDescriptor(), cudnn.createTensorDescriptor()
    pool_desc = cudnn.createPoolingDescriptor()
    try:
        _create_tensor_nd_descriptor(x_desc, x)
        _create_tensor_nd_descriptor(y_desc, y)
        _create_pooling_descriptor(pool_desc, ksize, stride, pad, mode)
        cudnn.poolingForward(handle, pool_desc, 1.0, x_desc, x, 0.0, y_desc, y)
    finally:
        cudnn.destroyTensorDescriptor(x_desc)
        cudnn.destroyTensorDescriptor(y_desc)
        cudnn.destroyPoolingDescriptor(pool_desc)
    return y


def pooling_backward(x, y, gy, ksize, stride, pad, mode):
    gx = _empty(x.shape, x.dtype, x)
    x, y, gy = _contiguous(x), _contiguous(y), _contiguous(gy)
    handle = _handle_for(x)
    x_desc, y_desc = cudnn.createTensorDescriptor(), cudnn.createTensorDescriptor()
    pool_desc = cudnn.createPoolingDescriptor()
    try:
        _create_tensor_nd_descriptor(x_desc, x)
        _create_tensor_nd_descriptor(y_desc, y)
        _create_pooling_descriptor(pool_desc, ksize, stride, pad, mode)
        cudnn.poolingBackward(handle, pool_desc, 1.0, y_desc, y, y_desc, gy, x_desc, x, 0.0, x_desc, gx)
    finally:
        cudnn.destroyTensorDescriptor(x_desc)
        cudnn.destroyTensorDescriptor(y_desc)
        cudnn.destroyPoolingDescriptor(pool_desc)
    return gx
