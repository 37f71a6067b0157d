"""``cupyx.cudnn``'s dropout: ``DropoutStates`` (the random states and descriptor the RNN helpers
take; cudnnDropoutForward 002 §3.2.34 and backward) and the deprecated ``create_dropout_states``."""
from __future__ import annotations

import warnings as _warnings

import numpy as _numpy

from . import cupy_cudnn as cudnn
from ._cupyx_descriptors import (_create_tensor_descriptor_as4darray, create_dropout_descriptor,
                                 set_dropout_descriptor)
from ._cupyx_place import _alloc, _contiguous, _empty, _handle_place, _mem, get_handle


class DropoutStates:
    """Random-number states and a dropout descriptor; ``forward`` returns (reserve_space, y),
    ``backward`` dx.  ``handle`` None means ``get_handle()``."""

    def __init__(self, handle, seed):
        handle = get_handle() if handle is None else handle
        place = _handle_place(handle)
        state_size = cudnn.dropoutGetStatesSize(handle)
        self._states = _alloc(state_size, place)
        self._desc = create_dropout_descriptor(handle, 0., _mem(self._states), state_size, seed)
        self._handle = handle

    def _resolve(self, handle):
        return self._handle if handle is None else handle

    def set_dropout_ratio(self, dropout_ratio):
        set_dropout_descriptor(self._desc, self._handle, dropout_ratio)

    def forward(self, handle, x, dropout_ratio):
        handle = self._resolve(handle)
        set_dropout_descriptor(self._desc, handle, dropout_ratio)
        x = _contiguous(x)
        y = _empty(x.shape, x.dtype, x)
        x_desc = cudnn.createTensorDescriptor()
        try:
            _create_tensor_descriptor_as4darray(x_desc, x)
            reserve_size = cudnn.getDropoutReserveSpaceSize(x_desc)
            reserve_space = _empty((reserve_size,), "b", x)
            cudnn.dropoutForward(handle, self._desc.value, x_desc, x, x_desc, y, reserve_space, reserve_size)
        finally:
            cudnn.destroyTensorDescriptor(x_desc)
        return reserve_space, y

    def backward(self, handle, dy, dropout_ratio, reserve_space):
        handle = self._resolve(handle)
        set_dropout_descriptor(self._desc, handle, dropout_ratio)
        dy = _contiguous(dy)
        dx = _empty(dy.shape, dy.dtype, dy)
        dy_desc = cudnn.createTensorDescriptor()
        try:
            _create_tensor_descriptor_as4darray(dy_desc, dy)
            cudnn.dropoutBackward(handle, self._desc.value, dy_desc, dy, dy_desc, dx, reserve_space,
                                  reserve_space.size)
        finally:
            cudnn.destroyTensorDescriptor(dy_desc)
        return dx


def create_dropout_states(handle):
    _warnings.warn("create_dropout_states is deprecated.Please use DropoutStates class instead.", DeprecationWarning)
    size = cudnn.dropoutGetStatesSize(handle)
    if _handle_place(handle) == "gpu":
        import cupy
        return cupy.empty((size,), "b")
    return _numpy.empty((size,), "b")
