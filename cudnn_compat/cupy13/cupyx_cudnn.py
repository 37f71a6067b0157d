"""CuPy 13's high-level cuDNN helpers (``cupyx.cudnn``, formerly ``cupy.cudnn``; source
``cupyx/cudnn.pyx``) on cudnn-compat: what ``install_cupy_shim()`` registers as ``cupyx.cudnn``
and ``cupy.cudnn``.

Same functions, arguments and results as CuPy 13: ``get_handle``, the descriptor factories
(``create_tensor_descriptor`` ... ``create_rnn_descriptor``), ``convolution_forward`` /
``convolution_backward_data`` / ``convolution_backward_filter`` with ``auto_tune`` (Find, timed)
or heuristics (Get_v7) and their per-shape algorithm caches, ``pooling_*``, ``activation_*``,
``softmax_*``, ``batch_normalization_*``, ``DropoutStates``, ``ctc_loss``, the RNN helpers
(``rnn_forward_training`` ...), the op-tensor / reduce / spatial-transformer / fused-ops
factories.  Every call goes through the CuPy-13 low-level module (``cupy13.cupy_cudnn``), as CuPy's did.

This module is the one the shim installs; its names live by concept in the ``_cupyx_*`` modules
beside it (places and handles, descriptors, the convolution algorithm search and caches,
convolutions, activation / softmax / pooling, batch normalization, dropout, CTC, RNN, fused ops)
and are re-exported here, CuPy 13's private helpers included.

Arrays decide the place: CuPy arrays run on the GPU (a handle per device, as CuPy 13 kept),
NumPy arrays on the CPU reference engine (a CPU handle) -- so the same code runs without a GPU.
Results are arrays of the same kind.  ``get_handle()`` (no arrays) is the default place's handle
(the current device's when CuPy sees a GPU; ``CUDNN_COMPAT_DEVICE=cpu`` makes it the CPU one).

Differences from CuPy 13: the heuristic algorithm choice skips results whose status is not
SUCCESS (CuPy 13 did not look at it); a scalar fused-ops attribute of type double is returned as
a float (CuPy 13 truncated it to an int); ``set_dropout_descriptor`` keeps the random state with
cudnnRestoreDropoutDescriptor rather than relying on NULL states; the BN helpers read the derived
descriptor's type with the Nd getter, so 5-d (3-d spatial) inputs work.
"""
from __future__ import annotations

import atexit as _atexit  # noqa: F401 - the module aliases CuPy 13's cupyx.cudnn has
import threading as _threading  # noqa: F401
import warnings as _warnings  # noqa: F401

import numpy as _numpy  # noqa: F401

from . import cupy_cudnn as cudnn
from ._cupyx_place import (  # noqa: F401
    _alloc, _contiguous, _d, _device_id, _empty, get_handle, get_max_workspace_size, _get_nd_tensor_cache, _handle,
    _handle_for, _handle_place, _handles, _HostMemory, _mem, _mem_size, _on_device, _performance_warning,
    PerformanceWarning, _place, reset_handles, set_max_workspace_size, _thread_local, _xp)
from ._cupyx_descriptors import (  # noqa: F401
    add_tensor, _ascontiguousarray_normalized_strides, create_activation_descriptor, _create_convolution_descriptor,
    create_convolution_descriptor, _create_ctc_loss_descriptor, create_dropout_descriptor,
    _create_filter_descriptor, create_filter_descriptor, create_op_tensor_descriptor, _create_pooling_descriptor,
    create_pooling_descriptor, create_reduce_tensor_descriptor, create_rnn_descriptor,
    create_spatial_transformer_descriptor, _create_tensor_descriptor, create_tensor_descriptor,
    _create_tensor_descriptor_as4darray, _create_tensor_nd_descriptor, create_tensor_nd_descriptor,
    create_uninitialized_tensor_descriptor, Descriptor, _get_array_info, _get_byte_size, get_data_type,
    is_tensor_core_available, set_dropout_descriptor, _should_use_tensor_core)
from ._cupyx_algorithm import (  # noqa: F401
    _Algorithm, _algorithm_bwd_data_cache, _algorithm_bwd_filter_cache, _algorithm_fwd_cache, _Direction,
    _DIRECTIONS, _find, _find_algorithm_bwd_data, _find_algorithm_bwd_filter, _find_algorithm_fwd, _get,
    _get_algorithm_bwd_data, _get_algorithm_bwd_data_cache, _get_algorithm_bwd_filter,
    _get_algorithm_bwd_filter_cache, _get_algorithm_fwd, _get_algorithm_fwd_cache, _search, _warn_algorithm,
    _warn_algorithm_bwd_data, _warn_algorithm_bwd_filter, _warn_algorithm_fwd, _warn_tensor_core)
from ._cupyx_convolution import (  # noqa: F401
    _add_bias, _check_same_place, convolution_backward_data, convolution_backward_filter, convolution_forward)
from ._cupyx_activation import (  # noqa: F401
    activation_backward, activation_forward, _create_tensor_descriptor_for_softmax, pooling_backward,
    pooling_forward, softmax_backward, softmax_forward)
from ._cupyx_batchnorm import (  # noqa: F401
    batch_normalization_backward, batch_normalization_forward_inference, _batch_normalization_forward_training,
    batch_normalization_forward_training, batch_normalization_forward_training_ex, _copy_into,
    _create_tensor_descriptor_for_bn, _get_dtype_of_tensor_descriptor)
from ._cupyx_dropout import (  # noqa: F401
    create_dropout_states, DropoutStates)
from ._cupyx_ctc import (  # noqa: F401
    ctc_loss)
from ._cupyx_rnn import (  # noqa: F401
    _create_rnn_data_descriptor, _DescriptorArray, _get_n_layers, get_rnn_lin_layer_bias_params,
    get_rnn_lin_layer_matrix_params, _lin_layer_params, _make_rnn_reserve_space, _make_rnn_result_array,
    _make_rnn_workspace, _make_tensor_descriptor_array, _make_tensor_descriptor_array_for_padded,
    _make_unpacked_rnn_data_descriptor, rnn_backward_data, rnn_backward_data_ex, rnn_backward_weights,
    rnn_backward_weights_ex, _rnn_ex_setup, rnn_forward_inference, rnn_forward_inference_ex, rnn_forward_training,
    rnn_forward_training_ex, _rnn_setup)
from ._cupyx_fused_ops import (  # noqa: F401
    create_fused_ops_const_param_pack, create_fused_ops_plan, create_fused_ops_variant_param_pack,
    fused_ops_execute, get_fused_ops_const_param_pack_attribute, get_fused_ops_variant_param_pack_attribute,
    _is_scalar_const_label, make_fused_ops_plan, set_fused_ops_const_param_pack_attribute,
    set_fused_ops_variant_param_pack_attribute, _variant_scalar_ctype, _VARIANT_SCALARS)

_py_cudnn = cudnn  # CuPy 13's name of the low-level module (cupy.cuda.cudnn)
