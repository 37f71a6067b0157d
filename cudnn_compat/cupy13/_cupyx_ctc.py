"""``cupyx.cudnn``'s ``ctc_loss`` (cudnnCTCLoss, 002 §8.2.3)."""
from __future__ import annotations

import numpy as _numpy

from . import cupy_cudnn as cudnn
from ._cupyx_descriptors import _create_ctc_loss_descriptor, create_tensor_descriptor, get_data_type
from ._cupyx_place import _d, _empty, _handle_for


def ctc_loss(probs, labels, label_length, input_length, algo):
    """(loss [batch], gradients like probs); labels and lengths are host (NumPy) int32 arrays."""
    batch_size = probs.shape[1]
    labels, label_length, input_length = (_numpy.ascontiguousarray(a, _numpy.int32)
                                          for a in (labels, label_length, input_length))
    handle = _handle_for(probs)
    ctc_desc = _create_ctc_loss_descriptor(get_data_type(probs.dtype))
    gradients = _empty(probs.shape, probs.dtype, probs)
    loss = _empty((batch_size,), "f", probs)
    probs_desc = create_tensor_descriptor(probs)
    gradients_desc = create_tensor_descriptor(gradients)
    work_size = cudnn.getCTCLossWorkspaceSize(handle, probs_desc.value, gradients_desc.value, labels.ctypes.data,
                                              label_length.ctypes.data, input_length.ctypes.data, algo,
                                              ctc_desc.value)
    workspace = _empty((work_size,), "b", probs)
    cudnn.CTCLoss(handle, probs_desc.value, probs, labels.ctypes.data, label_length.ctypes.data,
                  input_length.ctypes.data, loss, gradients_desc.value, gradients, algo, ctc_desc.value,
                  _d(workspace), work_size)
    return loss, gradients
