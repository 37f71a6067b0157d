"""``cupyx.cudnn``'s RNN helpers: the weight-block queries, ``rnn_forward_inference`` /
``rnn_forward_training`` / ``rnn_backward_data`` / ``rnn_backward_weights`` on packed batches
(cudnnRNNForwardTraining 002 §8.2.23 and kin) and their ``_ex`` variants on padded batches
(cudnnRNNForwardTrainingEx §8.2.24 and kin)."""
from __future__ import annotations

import ctypes as _ctypes

import numpy as _numpy

from . import cupy_cudnn as cudnn
from ._cupyx_descriptors import (Descriptor, _ascontiguousarray_normalized_strides, _get_byte_size,
                                 create_filter_descriptor, create_rnn_descriptor, create_tensor_nd_descriptor,
                                 get_data_type)
from ._cupyx_place import _alloc, _contiguous, _d, _empty, _handle, _mem, _mem_size, _on_device, _place, _xp


def get_rnn_lin_layer_matrix_params(handle, rnn_desc, layer, x_desc, w_desc, w, lin_layer_id):
    return _lin_layer_params(cudnn.getRNNLinLayerMatrixParams, handle, rnn_desc, layer, x_desc, w_desc, w,
                             lin_layer_id)


def get_rnn_lin_layer_bias_params(handle, rnn_desc, layer, x_desc, w_desc, w, lin_layer_id):
    return _lin_layer_params(cudnn.getRNNLinLayerBiasParams, handle, rnn_desc, layer, x_desc, w_desc, w,
                             lin_layer_id)


def _lin_layer_params(get, handle, rnn_desc, layer, x_desc, w_desc, w, lin_layer_id):
    """The block of ``w`` (a flat view) the legacy query points at."""
    base = w.data.ptr if _on_device(w) else w.ctypes.data
    out = _ctypes.c_size_t(0)
    mat_desc = cudnn.createFilterDescriptor()
    try:
        get(handle, rnn_desc.value, layer, x_desc.value, w_desc.value, base, lin_layer_id, mat_desc,
            _ctypes.addressof(out))
        data_type, _, _, dim = cudnn.getFilterNdDescriptor(mat_desc, 3)
    finally:
        cudnn.destroyFilterDescriptor(mat_desc)
    offset = (out.value - base) // _get_byte_size(data_type)
    size = int(_numpy.prod(dim))
    return w[offset:offset + size]


class _DescriptorArray:
    """A C array of descriptor handles (``.data`` is its host address), destroyed with the array."""

    def __init__(self, destroyer):
        self._destroy = destroyer
        self._value = []
        self._c = None

    def __del__(self):
        for desc in self._value:
            try:
                self._destroy(desc)
            except Exception:  # noqa: BLE001
                pass
        self._value = []

    def append(self, desc):
        self._value.append(desc)
        self._c = None

    @property
    def data(self):
        if self._c is None:
            self._c = (_ctypes.c_size_t * max(len(self._value), 1))(*[int(d) for d in self._value])
        return _ctypes.addressof(self._c)


def _make_tensor_descriptor_array(xs, lengths):
    """One 3-d descriptor (length_t, vector, 1) per step of a packed sequence batch."""
    descs = _DescriptorArray(cudnn.destroyTensorDescriptor)
    data_type = get_data_type(xs.dtype)
    strides = [s // xs.itemsize for s in xs.strides] + [1] * (3 - xs.ndim)
    shape = list(xs.shape) + [1] * (3 - xs.ndim)
    for length in lengths:
        shape[0] = int(length)
        desc = cudnn.createTensorDescriptor()
        descs.append(desc)
        cudnn.setTensorNdDescriptor(desc, data_type, 3, list(shape), list(strides))
    return descs


def _make_tensor_descriptor_array_for_padded(xs):
    assert xs.ndim == 3
    descs = _DescriptorArray(cudnn.destroyTensorDescriptor)
    data_type = get_data_type(xs.dtype)
    shape = [xs.shape[1], xs.shape[2], 1]
    strides = [xs.strides[1] // xs.itemsize, xs.strides[2] // xs.itemsize, 1]
    for _ in range(xs.shape[0]):
        desc = cudnn.createTensorDescriptor()
        descs.append(desc)
        cudnn.setTensorNdDescriptor(desc, data_type, 3, shape, strides)
    return descs


def _make_rnn_workspace(rnn_desc, length, descs, place):
    return _alloc(cudnn.getRNNWorkspaceSize(_handle(place), rnn_desc.value, length, descs.data), place)


def _make_rnn_reserve_space(rnn_desc, length, descs, place):
    return _alloc(cudnn.getRNNTrainingReserveSize(_handle(place), rnn_desc.value, length, descs.data), place)


def _get_n_layers(direction_mode, hx):
    return hx.shape[0] // 2 if direction_mode == cudnn.CUDNN_BIDIRECTIONAL else hx.shape[0]


def _make_rnn_result_array(direction_mode, n_units, xs):
    out = n_units * 2 if direction_mode == cudnn.CUDNN_BIDIRECTIONAL else n_units
    return _empty(xs.shape[:-1] + (out,), xs.dtype, xs)


def _rnn_setup(states, direction_mode, rnn_mode, hx, cx, xs, padded=False):
    hx = _contiguous(hx)
    cx = None if cx is None else _contiguous(cx)
    xs = _contiguous(xs)
    n_layers, n_units = _get_n_layers(direction_mode, hx), hx.shape[2]
    rnn_desc = create_rnn_descriptor(n_units, n_layers, states._desc, cudnn.CUDNN_LINEAR_INPUT, direction_mode,
                                     rnn_mode, get_data_type(xs.dtype))
    if padded:
        cudnn.setRNNPaddingMode(rnn_desc.value, cudnn.CUDNN_RNN_PADDED_IO_ENABLED)
    if cx is None:
        cx = _empty(0, xs.dtype, xs)
    return hx, cx, xs, n_units, rnn_desc


def _rnn_forward(padded, training, states, direction_mode, rnn_mode, hx, cx, w, xs, lengths):
    """The four forward helpers in one: a packed batch (``lengths`` the batch per step; the steps'
    descriptor arrays, cudnnRNNForwardInference / cudnnRNNForwardTraining 002 §8.2.23) or a padded
    one (``lengths`` per sequence; RNN data descriptors, the Ex calls 002 §8.2.24), with a reserve
    space when ``training``.  (reserve_space or None, hy, cy, ys)."""
    hx, cx, xs, n_units, rnn_desc = _rnn_setup(states, direction_mode, rnn_mode, hx, cx, xs, padded=padded)
    w, place = _contiguous(w), _place(xs)
    handle = _handle(place)
    ys = _make_rnn_result_array(direction_mode, n_units, xs)
    hy, cy = _empty(hx.shape, hx.dtype, xs), _empty(cx.shape, cx.dtype, xs)
    make = _make_unpacked_rnn_data_descriptor if padded else _make_tensor_descriptor_array
    x_descs, y_descs = make(xs, lengths), make(ys, lengths)
    hx_desc, cx_desc = create_tensor_nd_descriptor(hx), create_tensor_nd_descriptor(cx)
    hy_desc, cy_desc = create_tensor_nd_descriptor(hy), create_tensor_nd_descriptor(cy)
    w_desc = create_filter_descriptor(w)
    if padded:
        length, xs_descs = xs.shape[0], _make_tensor_descriptor_array_for_padded(xs)
        x_args, y_args, no_padding_args = (x_descs.value, xs), (y_descs.value, ys), (0,) * 8
    else:
        length, xs_descs = len(lengths), x_descs
        x_args, y_args, no_padding_args = (length, x_descs.data, xs), (y_descs.data, ys), ()
    workspace = _make_rnn_workspace(rnn_desc, length, xs_descs, place)
    spaces = (_mem(workspace), _mem_size(workspace))
    reserve_space = None
    if training:
        reserve_space = _make_rnn_reserve_space(rnn_desc, length, xs_descs, place)
        spaces += (_mem(reserve_space), _mem_size(reserve_space))
    run = getattr(cudnn, "RNNForward" + ("Training" if training else "Inference") + ("Ex" if padded else ""))
    run(handle, rnn_desc.value, *x_args, hx_desc.value, hx, cx_desc.value, _d(cx), w_desc.value, w, *y_args,
        hy_desc.value, hy, cy_desc.value, _d(cy), *no_padding_args, *spaces)
    return reserve_space, hy, cy, ys


def rnn_forward_inference(states, direction_mode, rnn_mode, hx, cx, w, xs, lengths):
    """(hy, cy, ys) of a packed batch (xs: the steps' rows stacked, ``lengths`` the batch per step)."""
    return _rnn_forward(False, False, states, direction_mode, rnn_mode, hx, cx, w, xs, lengths)[1:]


def rnn_forward_training(states, direction_mode, rnn_mode, hx, cx, w, xs, lengths):
    """(reserve_space, hy, cy, ys); pass reserve_space to the backward helpers."""
    return _rnn_forward(False, True, states, direction_mode, rnn_mode, hx, cx, w, xs, lengths)


def rnn_backward_data(states, direction_mode, rnn_mode, hx, cx, w, xs, ys, reserve_space, dhy, dcy, dys, lengths):
    """(dhx, dcx, dxs)."""
    no_cell = cx is None
    hx, cx, xs, n_units, rnn_desc = _rnn_setup(states, direction_mode, rnn_mode, hx, cx, xs)
    w, length, place = _contiguous(w), len(lengths), _place(xs)
    handle = _handle(place)
    ys, dys = _ascontiguousarray_normalized_strides(ys), _ascontiguousarray_normalized_strides(dys)
    dhy = _contiguous(dhy)
    dcy = cx if no_cell or dcy is None else _contiguous(dcy)
    dxs, dhx, dcx = _empty(xs.shape, xs.dtype, xs), _empty(hx.shape, hx.dtype, xs), _empty(cx.shape, cx.dtype, xs)
    ys_descs, dys_descs = _make_tensor_descriptor_array(ys, lengths), _make_tensor_descriptor_array(dys, lengths)
    dxs_descs, xs_descs = _make_tensor_descriptor_array(dxs, lengths), _make_tensor_descriptor_array(xs, lengths)
    dhy_desc, dcy_desc = create_tensor_nd_descriptor(dhy), create_tensor_nd_descriptor(dcy)
    hx_desc, cx_desc = create_tensor_nd_descriptor(hx), create_tensor_nd_descriptor(cx)
    dhx_desc, dcx_desc = create_tensor_nd_descriptor(dhx), create_tensor_nd_descriptor(dcx)
    w_desc = create_filter_descriptor(w)
    workspace = _make_rnn_workspace(rnn_desc, length, xs_descs, place)
    cudnn.RNNBackwardData(handle, rnn_desc.value, length, ys_descs.data, ys, dys_descs.data, dys, dhy_desc.value, dhy,
                          dcy_desc.value, _d(dcy), w_desc.value, w, hx_desc.value, hx, cx_desc.value, _d(cx),
                          dxs_descs.data, dxs, dhx_desc.value, dhx, dcx_desc.value, _d(dcx),
                          _mem(workspace), _mem_size(workspace), _mem(reserve_space), _mem_size(reserve_space))
    return dhx, dcx, dxs


def rnn_backward_weights(states, direction_mode, rnn_mode, xs, hx, ys, w, reserve_space, lengths):
    """dw (gradients of the flat weight buffer)."""
    hx, _, xs, n_units, rnn_desc = _rnn_setup(states, direction_mode, rnn_mode, hx, None, xs)
    ys, w, length, place = _contiguous(ys), _contiguous(w), len(lengths), _place(xs)
    handle = _handle(place)
    xs_descs, ys_descs = _make_tensor_descriptor_array(xs, lengths), _make_tensor_descriptor_array(ys, lengths)
    hx_desc = create_tensor_nd_descriptor(hx)
    workspace = _make_rnn_workspace(rnn_desc, length, xs_descs, place)
    dw = _xp(w).zeros(w.shape, w.dtype)
    dw_desc = create_filter_descriptor(dw)
    cudnn.RNNBackwardWeights(handle, rnn_desc.value, length, xs_descs.data, xs, hx_desc.value, hx, ys_descs.data, ys,
                             _mem(workspace), _mem_size(workspace), dw_desc.value, dw, _mem(reserve_space),
                             _mem_size(reserve_space))
    return dw


def _create_rnn_data_descriptor():
    return Descriptor(cudnn.createRNNDataDescriptor(), cudnn.destroyRNNDataDescriptor)


def _make_unpacked_rnn_data_descriptor(xs, lengths):
    desc = _create_rnn_data_descriptor()
    max_length, batch, n_dim = xs.shape
    lengths = _numpy.ascontiguousarray(lengths, _numpy.int32)
    cudnn.setRNNDataDescriptor(desc.value, get_data_type(xs.dtype), cudnn.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
                               max_length, batch, n_dim, lengths.ctypes.data, 0)
    return desc


def _rnn_ex_setup(states, direction_mode, rnn_mode, hx, cx, xs):
    return _rnn_setup(states, direction_mode, rnn_mode, hx, cx, xs, padded=True)


def rnn_forward_inference_ex(states, direction_mode, rnn_mode, hx, cx, w, xs, lengths):
    """(hy, cy, ys) of a padded (max_length, batch, n) batch with per-sequence ``lengths``."""
    return _rnn_forward(True, False, states, direction_mode, rnn_mode, hx, cx, w, xs, lengths)[1:]


def rnn_forward_training_ex(states, direction_mode, rnn_mode, hx, cx, w, xs, lengths):
    """(reserve_space, hy, cy, ys) of a padded batch."""
    return _rnn_forward(True, True, states, direction_mode, rnn_mode, hx, cx, w, xs, lengths)


def rnn_backward_data_ex(states, direction_mode, rnn_mode, hx, cx, w, xs, ys, reserve_space, dhy, dcy, dys, lengths):
    """(dhx, dcx, dxs) of a padded batch."""
    hx, cx, xs, n_units, rnn_desc = _rnn_ex_setup(states, direction_mode, rnn_mode, hx, cx, xs)
    w, place = _contiguous(w), _place(xs)
    handle = _handle(place)
    ys, dys, dhy = _contiguous(ys), _contiguous(dys), _contiguous(dhy)
    dcy = cx if cx.size == 0 or dcy is None else _contiguous(dcy)
    dxs, dhx, dcx = _empty(xs.shape, xs.dtype, xs), _empty(hx.shape, hx.dtype, xs), _empty(cx.shape, cx.dtype, xs)
    y_data_desc, dy_data_desc = _make_unpacked_rnn_data_descriptor(ys, lengths), _make_unpacked_rnn_data_descriptor(
        dys, lengths)
    dx_data_desc = _make_unpacked_rnn_data_descriptor(dxs, lengths)
    dhy_desc, dcy_desc = create_tensor_nd_descriptor(dhy), create_tensor_nd_descriptor(dcy)
    hx_desc, cx_desc = create_tensor_nd_descriptor(hx), create_tensor_nd_descriptor(cx)
    dhx_desc, dcx_desc = create_tensor_nd_descriptor(dhx), create_tensor_nd_descriptor(dcx)
    w_desc = create_filter_descriptor(w)
    xs_descs = _make_tensor_descriptor_array_for_padded(xs)
    workspace = _make_rnn_workspace(rnn_desc, xs.shape[0], xs_descs, place)
    cudnn.RNNBackwardDataEx(handle, rnn_desc.value, y_data_desc.value, ys, dy_data_desc.value, dys, 0, 0,
                            dhy_desc.value, dhy, dcy_desc.value, _d(dcy), w_desc.value, w, hx_desc.value, hx,
                            cx_desc.value, _d(cx), dx_data_desc.value, dxs, dhx_desc.value, dhx, dcx_desc.value,
                            _d(dcx), 0, 0, _mem(workspace), _mem_size(workspace), _mem(reserve_space),
                            _mem_size(reserve_space))
    return dhx, dcx, dxs


def rnn_backward_weights_ex(states, direction_mode, rnn_mode, xs, hx, ys, w, reserve_space, lengths):
    """dw of a padded batch."""
    hx, _, xs, n_units, rnn_desc = _rnn_ex_setup(states, direction_mode, rnn_mode, hx, None, xs)
    ys, w, place = _contiguous(ys), _contiguous(w), _place(xs)
    handle = _handle(place)
    x_data_desc, y_data_desc = _make_unpacked_rnn_data_descriptor(xs, lengths), _make_unpacked_rnn_data_descriptor(
        ys, lengths)
    hx_desc = create_tensor_nd_descriptor(hx)
    xs_descs = _make_tensor_descriptor_array_for_padded(xs)
    workspace = _make_rnn_workspace(rnn_desc, xs.shape[0], xs_descs, place)
    dw = _xp(w).zeros(w.shape, w.dtype)
    dw_desc = create_filter_descriptor(dw)
    cudnn.RNNBackwardWeightsEx(handle, rnn_desc.value, x_data_desc.value, xs, hx_desc.value, hx, y_data_desc.value,
                               ys, _mem(workspace), _mem_size(workspace), dw_desc.value, dw, _mem(reserve_space),
                               _mem_size(reserve_space))
    return dw
