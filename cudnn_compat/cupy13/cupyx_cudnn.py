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

import atexit as _atexit
import ctypes as _ctypes
import threading as _threading
import warnings as _warnings

import numpy as _numpy

from . import cupy_cudnn as cudnn
from .._core.place import default_place as _default_place

_py_cudnn = cudnn
_thread_local = _threading.local()
_handles: dict = {}  # (place, device) -> handle
_max_workspace_size = 8 * 1024 * 1024


class PerformanceWarning(RuntimeWarning):
    """CuPy's ``cupy._util.PerformanceWarning``."""


def _performance_warning():
    try:
        from cupy._util import PerformanceWarning as cupy_warning
        return cupy_warning
    except Exception:  # noqa: BLE001 - CuPy absent (or its stand-in namespace)
        return PerformanceWarning


# -- places, arrays and memory -----------------------------------------------------------------------

def _on_device(a) -> bool:
    return a is not None and type(a).__module__.split(".")[0] == "cupy"


def _xp(a):
    if _on_device(a):
        import cupy
        return cupy
    return _numpy


def _place(*arrays) -> str:
    return "gpu" if any(_on_device(a) for a in arrays) else "cpu"


def _device_id(a) -> int:
    return int(a.device.id) if _on_device(a) else -1


def _handle(place: str):
    if place == "gpu":
        import cupy
        key = ("gpu", cupy.cuda.runtime.getDevice())
    else:
        key = ("cpu", -1)
    h = _handles.get(key)
    if h is None:
        h = _handles[key] = cudnn.create(place)
    return h


def _handle_for(*arrays):
    return _handle(_place(*arrays))


def _contiguous(a):
    return a if a.flags.c_contiguous else _xp(a).ascontiguousarray(a)


def _empty(shape, dtype, like):
    return _xp(like).empty(shape, dtype)


def _d(a):
    """A data argument: the array (NULL for None or an empty array)."""
    return 0 if a is None or a.size == 0 else a


class _HostMemory:
    """The CPU place's ``cupy.cuda.MemoryPointer``: ``.ptr``, ``.mem.size`` and the NumPy buffer."""

    class _Mem:
        def __init__(self, size):
            self.size = size

    def __init__(self, size: int):
        self.array = _numpy.zeros(int(size), _numpy.uint8)
        self.mem = self._Mem(int(size))
        self.ptr = self.array.ctypes.data if size else 0


def _alloc(size: int, place: str):
    if place == "gpu":
        import cupy
        return cupy.cuda.alloc(int(size))
    return _HostMemory(size)


def _mem(m):
    """A workspace / reserve / states argument from an allocation (NULL when empty)."""
    if m is None or m.mem.size == 0:
        return 0
    return m.array if isinstance(m, _HostMemory) else m.ptr


def _mem_size(m) -> int:
    return 0 if m is None else int(m.mem.size)


def _handle_place(handle) -> str:
    from .._core.descriptor import _LIVE
    h = _LIVE.get(int(handle))
    return getattr(h, "place", _default_place())


# -- handles and workspace -------------------------------------------------------------------------

def get_handle():
    """The cuDNN handle of the default place (the current device's when CuPy sees a GPU)."""
    return _handle(_default_place())


@_atexit.register
def reset_handles():
    for h in list(_handles.values()):
        try:
            cudnn.destroy(h)
        except Exception:  # noqa: BLE001 - already gone at shutdown
            pass
    _handles.clear()


def _get_nd_tensor_cache() -> dict:
    if not hasattr(_thread_local, "cudnn_nd_tensor_cache"):
        _thread_local.cudnn_nd_tensor_cache = {}
    return _thread_local.cudnn_nd_tensor_cache


def get_max_workspace_size() -> int:
    """The workspace limit the convolution helpers pass to algorithm selection (8 MiB)."""
    return _max_workspace_size


def set_max_workspace_size(size) -> None:
    global _max_workspace_size
    _max_workspace_size = int(size)


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
    desc = Descriptor(cudnn.createTensorDescriptor(), _py_cudnn.destroyTensorDescriptor)
    _create_tensor_descriptor(desc.value, arr, format)
    return desc


def create_uninitialized_tensor_descriptor():
    """A cudnnTensorDescriptor_t not yet set (the batch normalization helpers fill it)."""
    return Descriptor(cudnn.createTensorDescriptor(), _py_cudnn.destroyTensorDescriptor)


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
    desc = Descriptor(cudnn.createTensorDescriptor(), _py_cudnn.destroyTensorDescriptor)
    _create_tensor_nd_descriptor(desc.value, arr, data_type)
    cache[key] = desc
    return desc


def create_filter_descriptor(arr, format=cudnn.CUDNN_TENSOR_NCHW):
    desc = Descriptor(cudnn.createFilterDescriptor(), _py_cudnn.destroyFilterDescriptor)
    _create_filter_descriptor(desc.value, arr, format)
    return desc


def create_convolution_descriptor(pad, stride, dtype, mode=cudnn.CUDNN_CROSS_CORRELATION, dilation=None,
                                  use_tensor_core=False, groups=1):
    desc = Descriptor(cudnn.createConvolutionDescriptor(), _py_cudnn.destroyConvolutionDescriptor)
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
    desc = Descriptor(cudnn.createPoolingDescriptor(), _py_cudnn.destroyPoolingDescriptor)
    _create_pooling_descriptor(desc.value, ksize, stride, pad, mode)
    return desc


def create_activation_descriptor(mode, relu_nan_opt=cudnn.CUDNN_PROPAGATE_NAN, coef=0.0):
    desc = Descriptor(cudnn.createActivationDescriptor(), _py_cudnn.destroyActivationDescriptor)
    cudnn.setActivationDescriptor(desc.value, mode, relu_nan_opt, coef)
    return desc


def create_dropout_descriptor(handle, dropout, states, state_size_in_bytes, seed):
    desc = Descriptor(cudnn.createDropoutDescriptor(), _py_cudnn.destroyDropoutDescriptor)
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
    desc = Descriptor(cudnn.createCTCLossDescriptor(), _py_cudnn.destroyCTCLossDescriptor)
    cudnn.setCTCLossDescriptor(desc.value, data_type)
    return desc


def create_rnn_descriptor(hidden_size, num_layers, dropout_desc, input_mode, direction, mode, data_type, algo=None):
    desc = Descriptor(cudnn.createRNNDescriptor(), _py_cudnn.destroyRNNDescriptor)
    if algo is None:
        algo = cudnn.CUDNN_RNN_ALGO_STANDARD
    cudnn.setRNNDescriptor_v6(get_handle(), desc.value, hidden_size, num_layers, dropout_desc.value, input_mode,
                              direction, mode, algo, data_type)
    return desc


def create_spatial_transformer_descriptor(sampler_type, dtype, nb_dims, dim_A):
    desc = Descriptor(cudnn.createSpatialTransformerDescriptor(), _py_cudnn.destroySpatialTransformerDescriptor)
    cudnn.setSpatialTransformerDescriptor(desc.value, sampler_type, get_data_type(dtype), nb_dims, dim_A)
    return desc


def create_op_tensor_descriptor(op_type, dtype):
    desc = Descriptor(cudnn.createOpTensorDescriptor(), _py_cudnn.destroyOpTensorDescriptor)
    cudnn.setOpTensorDescriptor(desc.value, op_type, get_data_type(dtype), cudnn.CUDNN_NOT_PROPAGATE_NAN)
    return desc


def create_reduce_tensor_descriptor(reduce_type, dtype):
    desc = Descriptor(cudnn.createReduceTensorDescriptor(), _py_cudnn.destroyReduceTensorDescriptor)
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


# -- activation, softmax, pooling ------------------------------------------------------------------

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


# -- convolution: algorithm selection and its caches -------------------------------------------------

class _Algorithm:
    """A chosen algorithm: ``algo``, ``memory`` (workspace bytes) and ``mathType``."""

    __slots__ = ("algo", "memory", "mathType")

    def __init__(self, algo, memory, mathType=0):
        self.algo, self.memory, self.mathType = int(algo), int(memory), int(mathType)

    def __repr__(self):
        return f"_Algorithm(algo={self.algo}, memory={self.memory}, mathType={self.mathType})"


# keyed by (device, shapes, conv_param, max workspace): Find (auto_tune) and Get_v7 results
_get_algorithm_fwd_cache: dict = {}
_get_algorithm_bwd_filter_cache: dict = {}
_get_algorithm_bwd_data_cache: dict = {}
_algorithm_fwd_cache: dict = {}
_algorithm_bwd_filter_cache: dict = {}
_algorithm_bwd_data_cache: dict = {}


def _warn_tensor_core(kind, shapes, conv_param):
    _warnings.warn("Tensor Core mode is set but the selected convolution {} algorithm is not a Tensor Core "
                   "enabled algorithm. This might be due to lack of workspace memory. {}, pad:{}, stride:{}"
                   .format(kind, shapes, conv_param[0], conv_param[1]), _performance_warning())


class _Direction:
    """One row of ``_DIRECTIONS``: how CuPy 13 searches the algorithm of one convolution direction.
    Its helpers take (a, b, c, conv_param, handle, a_desc, b_desc, conv_desc, c_desc, ...): the
    three arrays and descriptors in the order the Find*Ex_v7 function takes them."""

    __slots__ = ("find", "get", "find_cache", "get_cache", "kind", "names", "shape_order", "x", "skip_warning")

    def __init__(self, find, get, find_cache, get_cache, kind, names, shape_order, x, skip_warning):
        self.find, self.get = find, get  # cudnn.find*AlgorithmEx_v7, cudnn.get*Algorithm_v7 (by name: patchable)
        self.find_cache, self.get_cache = find_cache, get_cache  # CuPy 13's two caches of the direction
        self.kind, self.names = kind, names  # the warnings' words: "forward", and the arrays' names
        self.shape_order = shape_order  # the arrays whose shapes key the caches, in CuPy 13's key order
        self.x = x  # which array is x (its device keys the caches, its place gets the Find workspace)
        self.skip_warning = skip_warning  # Get warns of a skipped faster algorithm: "always" or "tensor_core"


_DIRECTIONS = {
    "fwd": _Direction("findConvolutionForwardAlgorithmEx_v7", "getConvolutionForwardAlgorithm_v7",
                      _algorithm_fwd_cache, _get_algorithm_fwd_cache, "forward", ("x", "W", "y"), (0, 1, 2), 0,
                      "always"),
    "bwd filter": _Direction("findConvolutionBackwardFilterAlgorithmEx_v7", "getConvolutionBackwardFilterAlgorithm_v7",
                             _algorithm_bwd_filter_cache, _get_algorithm_bwd_filter_cache, "backward filter",
                             ("x", "dy", "dW"), (0, 2, 1), 0, "tensor_core"),
    "bwd data": _Direction("findConvolutionBackwardDataAlgorithmEx_v7", "getConvolutionBackwardDataAlgorithm_v7",
                           _algorithm_bwd_data_cache, _get_algorithm_bwd_data_cache, "backward data",
                           ("W", "x", "y"), (0, 1, 2), 1, "tensor_core"),
}


def _warn_algorithm(what, arrays, conv_param):
    d = _DIRECTIONS[what]
    _warn_tensor_core(d.kind, ", ".join("{}.shape:{}".format(n, a.shape) for n, a in zip(d.names, arrays)), conv_param)


def _warn_algorithm_fwd(x, W, y, conv_param):
    _warn_algorithm("fwd", (x, W, y), conv_param)


def _warn_algorithm_bwd_filter(x, dy, dW, conv_param):
    _warn_algorithm("bwd filter", (x, dy, dW), conv_param)


def _warn_algorithm_bwd_data(W, x, y, conv_param):
    _warn_algorithm("bwd data", (W, x, y), conv_param)


def _search(what, auto_tune, arrays, conv_param, handle, descs, max_workspace_size, use_tensor_core,
            deterministic=False):
    """The algorithm of direction ``what`` (a ``_DIRECTIONS`` key) for CuPy 13's six helpers:
    ``auto_tune``: the fastest measured one (Find*Ex_v7 with a max_workspace_size workspace, cached
    in the direction's Find cache), else the heuristics' first within max_workspace_size (Get_v7,
    its Get cache).  ``arrays``: (a, b, c); ``descs``: (a_desc, b_desc, conv_desc, c_desc)."""
    d = _DIRECTIONS[what]
    x = arrays[d.x]
    key = (_device_id(x),) + tuple(arrays[i].shape for i in d.shape_order) + (conv_param, max_workspace_size)
    da, db, dconv, dc = descs
    (a, b, c) = arrays
    if auto_tune:
        algo = _find(d.find_cache, key, lambda n, ws, size: getattr(cudnn, d.find)(
            handle, da, a, db, b, dconv, dc, c, n, ws, size), max_workspace_size, _place(x), deterministic)
    else:
        algo = _get(d.get_cache, key, lambda n: getattr(cudnn, d.get)(handle, da, db, dconv, dc, n),
                    max_workspace_size, what, deterministic,
                    warn_skip=True if d.skip_warning == "always" else use_tensor_core)
    if use_tensor_core and algo.mathType != cudnn.CUDNN_TENSOR_OP_MATH:
        _warn_algorithm(what, arrays, conv_param)
    return algo


def _find(cache, key, find, max_workspace_size, place, deterministic=False):
    """auto_tune: the fastest measured algorithm (Find*Ex_v7 with a max_workspace_size workspace)."""
    algo = cache.get(key)
    if algo is not None:
        return algo
    workspace = _alloc(max_workspace_size, place)
    ret = find(10 if deterministic else 1, _mem(workspace), _mem_size(workspace))
    if deterministic:
        ret = [p for p in ret if p.determinism]
        if not ret:
            raise RuntimeError("No conv bwd filter algo available with workspace size less equal {}"
                               .format(max_workspace_size))
    perf = ret[0]
    if perf.status != cudnn.CUDNN_STATUS_SUCCESS:
        raise RuntimeError("No available algorithm found.")
    algo = cache[key] = _Algorithm(perf.algo, perf.memory, perf.mathType)
    return algo


def _get(cache, key, get_v7, max_workspace_size, what, deterministic=False, warn_skip=True):
    """Heuristics: the first Get_v7 result within max_workspace_size (and deterministic if asked)."""
    algo = cache.get(key)
    if algo is not None:
        return algo
    skip = False
    for perf in get_v7(10):
        if perf.status != cudnn.CUDNN_STATUS_SUCCESS or (deterministic and not perf.determinism):
            continue
        if perf.memory <= max_workspace_size:
            break
        skip = True
    else:
        raise RuntimeError("No conv {} algo available with workspace size less equal {}"
                           .format(what, max_workspace_size))
    if skip and warn_skip:
        _warnings.warn("The best algo of conv {} might not be selected due to lack of workspace size ({})"
                       .format(what, max_workspace_size), _performance_warning())
    algo = cache[key] = _Algorithm(perf.algo, perf.memory, perf.mathType)
    return algo


# CuPy 13's six helpers (their names and signatures), each one row of _DIRECTIONS through _search
def _find_algorithm_fwd(x, W, y, conv_param, handle, x_desc, filter_desc, conv_desc, y_desc, max_workspace_size,
                        use_tensor_core):
    return _search("fwd", True, (x, W, y), conv_param, handle, (x_desc, filter_desc, conv_desc, y_desc),
                   max_workspace_size, use_tensor_core)


def _get_algorithm_fwd(x, W, y, conv_param, handle, x_desc, filter_desc, conv_desc, y_desc, max_workspace_size,
                       use_tensor_core):
    return _search("fwd", False, (x, W, y), conv_param, handle, (x_desc, filter_desc, conv_desc, y_desc),
                   max_workspace_size, use_tensor_core)


def _find_algorithm_bwd_filter(x, dy, dW, conv_param, handle, x_desc, dy_desc, conv_desc, filter_desc,
                               max_workspace_size, use_tensor_core, deterministic):
    return _search("bwd filter", True, (x, dy, dW), conv_param, handle, (x_desc, dy_desc, conv_desc, filter_desc),
                   max_workspace_size, use_tensor_core, deterministic)


def _get_algorithm_bwd_filter(x, dy, dW, conv_param, handle, x_desc, gy_desc, conv_desc, filter_desc,
                              max_workspace_size, use_tensor_core, deterministic):
    return _search("bwd filter", False, (x, dy, dW), conv_param, handle, (x_desc, gy_desc, conv_desc, filter_desc),
                   max_workspace_size, use_tensor_core, deterministic)


def _find_algorithm_bwd_data(W, x, y, conv_param, handle, filter_desc, x_desc, conv_desc, y_desc,
                             max_workspace_size, use_tensor_core, deterministic):
    return _search("bwd data", True, (W, x, y), conv_param, handle, (filter_desc, x_desc, conv_desc, y_desc),
                   max_workspace_size, use_tensor_core, deterministic)


def _get_algorithm_bwd_data(W, x, y, conv_param, handle, filter_desc, x_desc, conv_desc, y_desc,
                            max_workspace_size, use_tensor_core, deterministic):
    return _search("bwd data", False, (W, x, y), conv_param, handle, (filter_desc, x_desc, conv_desc, y_desc),
                   max_workspace_size, use_tensor_core, deterministic)


def _add_bias(handle, b, y, y_desc):
    """y += b broadcast over channel 1 (convolution_forward / _backward_data with b)."""
    shape = [1] * y.ndim
    shape[1] = -1
    b = _contiguous(b).reshape(shape)
    b_desc = cudnn.createTensorDescriptor()
    try:
        _create_tensor_nd_descriptor(b_desc, b, -1)
        cudnn.addTensor_v3(handle, 1.0, b_desc, b, 1.0, y_desc, y)
    finally:
        cudnn.destroyTensorDescriptor(b_desc)


def _check_same_place(*arrays):
    kinds = {_on_device(a) for a in arrays if a is not None}
    if len(kinds) > 1:
        raise ValueError("cupyx.cudnn: arrays must all be CuPy arrays or all NumPy arrays")
    devs = {_device_id(a) for a in arrays if a is not None}
    assert len(devs) == 1, "arrays on different devices"


def convolution_forward(x, W, b, y, pad, stride, dilation, groups, *, auto_tune, tensor_core,
                        d_layout=cudnn.CUDNN_TENSOR_NCHW, w_layout=cudnn.CUDNN_TENSOR_NCHW):
    """y = conv(x, W) (+ b over channels); y is written in place (CuPy 13 returned None)."""
    _check_same_place(x, W, y, b)
    use_tensor_core = _should_use_tensor_core(tensor_core, x.dtype)
    conv_param = (pad, stride, x.dtype, use_tensor_core)
    if use_tensor_core and any(i > 1 for i in dilation):
        use_tensor_core = False
    handle = _handle_for(x)
    x, W = _contiguous(x), _contiguous(W)
    x_desc, y_desc = cudnn.createTensorDescriptor(), cudnn.createTensorDescriptor()
    filter_desc, conv_desc = cudnn.createFilterDescriptor(), cudnn.createConvolutionDescriptor()
    max_workspace_size = get_max_workspace_size()
    try:
        _create_tensor_descriptor(x_desc, x, format=d_layout)
        _create_tensor_descriptor(y_desc, y, format=d_layout)
        _create_filter_descriptor(filter_desc, W, w_layout)
        _create_convolution_descriptor(conv_desc, pad, stride, dilation, groups, x.dtype,
                                       cudnn.CUDNN_CROSS_CORRELATION, use_tensor_core)
        pick = _find_algorithm_fwd if auto_tune else _get_algorithm_fwd
        perf = pick(x, W, y, conv_param, handle, x_desc, filter_desc, conv_desc, y_desc, max_workspace_size,
                    use_tensor_core)
        cudnn.setConvolutionMathType(conv_desc, perf.mathType)
        workspace = _alloc(perf.memory, _place(x))
        try:
            cudnn.convolutionForward(handle, 1.0, x_desc, x, filter_desc, W, conv_desc, perf.algo, _mem(workspace),
                                     perf.memory, 0.0, y_desc, y)
        except cudnn.CuDNNError as e:
            e.add_infos([
                "func: cudnnConvolutionForward",
                "x: {}".format(_get_array_info(x)), "W: {}".format(_get_array_info(W)),
                "b: {}".format(_get_array_info(b)), "y: {}".format(_get_array_info(y)),
                "pad={!r}, stride={!r}, dilation={!r}, groups={!r}".format(pad, stride, dilation, groups),
                "auto_tune={!r}, tensor_core={!r}".format(auto_tune, tensor_core),
                "d_layout={!r}, w_layout={!r}".format(d_layout, w_layout)])
            raise
        del workspace
        if b is not None:
            _add_bias(handle, b, y, y_desc)
    finally:
        cudnn.destroyTensorDescriptor(x_desc)
        cudnn.destroyTensorDescriptor(y_desc)
        cudnn.destroyFilterDescriptor(filter_desc)
        cudnn.destroyConvolutionDescriptor(conv_desc)


def convolution_backward_filter(x, gy, gW, pad, stride, dilation, groups, *, deterministic, auto_tune, tensor_core,
                                d_layout=cudnn.CUDNN_TENSOR_NCHW, w_layout=cudnn.CUDNN_TENSOR_NCHW):
    """gW = dconv/dW (x, gy); gW is written in place."""
    _check_same_place(x, gy, gW)
    use_tensor_core = not deterministic and _should_use_tensor_core(tensor_core, x.dtype)
    conv_param = (pad, stride, x.dtype, use_tensor_core, deterministic)
    handle = _handle_for(x)
    x, gy = _contiguous(x), _contiguous(gy)
    x_desc, gy_desc = cudnn.createTensorDescriptor(), cudnn.createTensorDescriptor()
    filter_desc, conv_desc = cudnn.createFilterDescriptor(), cudnn.createConvolutionDescriptor()
    max_workspace_size = get_max_workspace_size()
    try:
        _create_tensor_descriptor(x_desc, x, format=d_layout)
        _create_tensor_descriptor(gy_desc, gy, format=d_layout)
        _create_filter_descriptor(filter_desc, gW, w_layout)
        _create_convolution_descriptor(conv_desc, pad, stride, dilation, groups, x.dtype,
                                       cudnn.CUDNN_CROSS_CORRELATION, use_tensor_core)
        pick = _find_algorithm_bwd_filter if auto_tune and not deterministic else _get_algorithm_bwd_filter
        perf = pick(x, gy, gW, conv_param, handle, x_desc, gy_desc, conv_desc, filter_desc, max_workspace_size,
                    use_tensor_core, deterministic)
        cudnn.setConvolutionMathType(conv_desc, perf.mathType)
        workspace = _alloc(perf.memory, _place(x))
        cudnn.convolutionBackwardFilter_v3(handle, 1.0, x_desc, x, gy_desc, gy, conv_desc, perf.algo,
                                           _mem(workspace), perf.memory, 0.0, filter_desc, gW)
    finally:
        cudnn.destroyTensorDescriptor(x_desc)
        cudnn.destroyTensorDescriptor(gy_desc)
        cudnn.destroyFilterDescriptor(filter_desc)
        cudnn.destroyConvolutionDescriptor(conv_desc)


def convolution_backward_data(W, x, b, y, pad, stride, dilation, groups, *, deterministic, auto_tune, tensor_core,
                              d_layout=cudnn.CUDNN_TENSOR_NCHW, w_layout=cudnn.CUDNN_TENSOR_NCHW):
    """y = dconv/dx applied to x (the transposed convolution of x by W) (+ b); y is written in place."""
    _check_same_place(W, x, y, b)
    use_tensor_core = not deterministic and _should_use_tensor_core(tensor_core, x.dtype)
    conv_param = (pad, stride, x.dtype, use_tensor_core, deterministic)
    if use_tensor_core and any(i > 1 for i in dilation):
        use_tensor_core = False
    handle = _handle_for(x)
    x, W = _contiguous(x), _contiguous(W)
    x_desc, y_desc = cudnn.createTensorDescriptor(), cudnn.createTensorDescriptor()
    filter_desc, conv_desc = cudnn.createFilterDescriptor(), cudnn.createConvolutionDescriptor()
    max_workspace_size = get_max_workspace_size()
    try:
        _create_tensor_descriptor(x_desc, x, format=d_layout)
        _create_tensor_descriptor(y_desc, y, format=d_layout)
        _create_filter_descriptor(filter_desc, W, w_layout)
        _create_convolution_descriptor(conv_desc, pad, stride, dilation, groups, x.dtype,
                                       cudnn.CUDNN_CROSS_CORRELATION, use_tensor_core)
        pick = _find_algorithm_bwd_data if auto_tune and not deterministic else _get_algorithm_bwd_data
        perf = pick(W, x, y, conv_param, handle, filter_desc, x_desc, conv_desc, y_desc, max_workspace_size,
                    use_tensor_core, deterministic)
        cudnn.setConvolutionMathType(conv_desc, perf.mathType)
        workspace = _alloc(perf.memory, _place(x))
        cudnn.convolutionBackwardData_v3(handle, 1.0, filter_desc, W, x_desc, x, conv_desc, perf.algo,
                                         _mem(workspace), perf.memory, 0.0, y_desc, y)
        del workspace
        if b is not None:
            _add_bias(handle, b, y, y_desc)
    finally:
        cudnn.destroyTensorDescriptor(x_desc)
        cudnn.destroyTensorDescriptor(y_desc)
        cudnn.destroyFilterDescriptor(filter_desc)
        cudnn.destroyConvolutionDescriptor(conv_desc)


# -- batch normalization -------------------------------------------------------------------------

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
        _create_tensor_descriptor_for_bn(x_desc, x, is_for_conv2d, format=d_layout)
        cudnn.deriveBNTensorDescriptor(bn_desc, x_desc, cudnn_mode)
        dtype_param = _get_dtype_of_tensor_descriptor(bn_desc)
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
        if debug and cudnn_mode == cudnn.CUDNN_BATCHNORM_SPATIAL_PERSISTENT:
            rstatus = cudnn.queryRuntimeError(handle, cudnn.CUDNN_ERRQUERY_BLOCKING)
            if rstatus != cudnn.CUDNN_STATUS_SUCCESS:
                _warnings.warn("A numerical overflow might have happened in cuDNN batch normalization (status:{})"
                               .format(rstatus))
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
        _create_tensor_descriptor_for_bn(x_desc, x, is_for_conv2d, format=d_layout)
        cudnn.deriveBNTensorDescriptor(bn_desc, x_desc, cudnn_mode)
        dtype_param = _get_dtype_of_tensor_descriptor(bn_desc)
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
        _create_tensor_descriptor_for_bn(x_desc, x, is_for_conv2d, format=d_layout)
        cudnn.deriveBNTensorDescriptor(bn_desc, x_desc, cudnn_mode)
        dtype_param = _get_dtype_of_tensor_descriptor(bn_desc)
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
        if debug and cudnn_mode == cudnn.CUDNN_BATCHNORM_SPATIAL_PERSISTENT:
            rstatus = cudnn.queryRuntimeError(handle, cudnn.CUDNN_ERRQUERY_BLOCKING)
            if rstatus != cudnn.CUDNN_STATUS_SUCCESS:
                _warnings.warn("A numerical overflow might have happened in cuDNN batch normalization (status:{})"
                               .format(rstatus))
    finally:
        cudnn.destroyTensorDescriptor(x_desc)
        cudnn.destroyTensorDescriptor(bn_desc)
    if need_cast:
        ggamma, gbeta = ggamma.astype(dtype), gbeta.astype(dtype)
    return gx, ggamma, gbeta


# -- dropout ------------------------------------------------------------------------------------

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


# -- CTC ----------------------------------------------------------------------------------------

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


# -- RNN ----------------------------------------------------------------------------------------

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
    descs = _DescriptorArray(_py_cudnn.destroyTensorDescriptor)
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
    descs = _DescriptorArray(_py_cudnn.destroyTensorDescriptor)
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


def rnn_forward_inference(states, direction_mode, rnn_mode, hx, cx, w, xs, lengths):
    """(hy, cy, ys) of a packed batch (xs: the steps' rows stacked, ``lengths`` the batch per step)."""
    hx, cx, xs, n_units, rnn_desc = _rnn_setup(states, direction_mode, rnn_mode, hx, cx, xs)
    w, length, place = _contiguous(w), len(lengths), _place(xs)
    handle = _handle(place)
    ys = _make_rnn_result_array(direction_mode, n_units, xs)
    hy, cy = _empty(hx.shape, hx.dtype, xs), _empty(cx.shape, cx.dtype, xs)
    xs_descs, ys_descs = _make_tensor_descriptor_array(xs, lengths), _make_tensor_descriptor_array(ys, lengths)
    hx_desc, cx_desc = create_tensor_nd_descriptor(hx), create_tensor_nd_descriptor(cx)
    hy_desc, cy_desc = create_tensor_nd_descriptor(hy), create_tensor_nd_descriptor(cy)
    w_desc = create_filter_descriptor(w)
    workspace = _make_rnn_workspace(rnn_desc, length, xs_descs, place)
    cudnn.RNNForwardInference(handle, rnn_desc.value, length, xs_descs.data, xs, hx_desc.value, hx, cx_desc.value,
                              _d(cx), w_desc.value, w, ys_descs.data, ys, hy_desc.value, hy, cy_desc.value, _d(cy),
                              _mem(workspace), _mem_size(workspace))
    return hy, cy, ys


def rnn_forward_training(states, direction_mode, rnn_mode, hx, cx, w, xs, lengths):
    """(reserve_space, hy, cy, ys); pass reserve_space to the backward helpers."""
    hx, cx, xs, n_units, rnn_desc = _rnn_setup(states, direction_mode, rnn_mode, hx, cx, xs)
    w, length, place = _contiguous(w), len(lengths), _place(xs)
    handle = _handle(place)
    ys = _make_rnn_result_array(direction_mode, n_units, xs)
    hy, cy = _empty(hx.shape, hx.dtype, xs), _empty(cx.shape, cx.dtype, xs)
    xs_descs, ys_descs = _make_tensor_descriptor_array(xs, lengths), _make_tensor_descriptor_array(ys, lengths)
    hx_desc, cx_desc = create_tensor_nd_descriptor(hx), create_tensor_nd_descriptor(cx)
    hy_desc, cy_desc = create_tensor_nd_descriptor(hy), create_tensor_nd_descriptor(cy)
    w_desc = create_filter_descriptor(w)
    workspace = _make_rnn_workspace(rnn_desc, length, xs_descs, place)
    reserve_space = _make_rnn_reserve_space(rnn_desc, length, xs_descs, place)
    cudnn.RNNForwardTraining(handle, rnn_desc.value, length, xs_descs.data, xs, hx_desc.value, hx, cx_desc.value,
                             _d(cx), w_desc.value, w, ys_descs.data, ys, hy_desc.value, hy, cy_desc.value, _d(cy),
                             _mem(workspace), _mem_size(workspace), _mem(reserve_space), _mem_size(reserve_space))
    return reserve_space, hy, cy, ys


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
    return Descriptor(cudnn.createRNNDataDescriptor(), _py_cudnn.destroyRNNDataDescriptor)


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
    hx, cx, xs, n_units, rnn_desc = _rnn_ex_setup(states, direction_mode, rnn_mode, hx, cx, xs)
    w, place = _contiguous(w), _place(xs)
    handle = _handle(place)
    ys = _make_rnn_result_array(direction_mode, n_units, xs)
    hy, cy = _empty(hx.shape, hx.dtype, xs), _empty(cx.shape, cx.dtype, xs)
    x_data_desc, y_data_desc = _make_unpacked_rnn_data_descriptor(xs, lengths), _make_unpacked_rnn_data_descriptor(
        ys, lengths)
    hx_desc, cx_desc = create_tensor_nd_descriptor(hx), create_tensor_nd_descriptor(cx)
    hy_desc, cy_desc = create_tensor_nd_descriptor(hy), create_tensor_nd_descriptor(cy)
    w_desc = create_filter_descriptor(w)
    xs_descs = _make_tensor_descriptor_array_for_padded(xs)
    workspace = _make_rnn_workspace(rnn_desc, xs.shape[0], xs_descs, place)
    cudnn.RNNForwardInferenceEx(handle, rnn_desc.value, x_data_desc.value, xs, hx_desc.value, hx, cx_desc.value,
                                _d(cx), w_desc.value, w, y_data_desc.value, ys, hy_desc.value, hy, cy_desc.value,
                                _d(cy), 0, 0, 0, 0, 0, 0, 0, 0, _mem(workspace), _mem_size(workspace))
    return hy, cy, ys


def rnn_forward_training_ex(states, direction_mode, rnn_mode, hx, cx, w, xs, lengths):
    """(reserve_space, hy, cy, ys) of a padded batch."""
    hx, cx, xs, n_units, rnn_desc = _rnn_ex_setup(states, direction_mode, rnn_mode, hx, cx, xs)
    w, place = _contiguous(w), _place(xs)
    handle = _handle(place)
    ys = _make_rnn_result_array(direction_mode, n_units, xs)
    hy, cy = _empty(hx.shape, hx.dtype, xs), _empty(cx.shape, cx.dtype, xs)
    x_data_desc, y_data_desc = _make_unpacked_rnn_data_descriptor(xs, lengths), _make_unpacked_rnn_data_descriptor(
        ys, lengths)
    hx_desc, cx_desc = create_tensor_nd_descriptor(hx), create_tensor_nd_descriptor(cx)
    hy_desc, cy_desc = create_tensor_nd_descriptor(hy), create_tensor_nd_descriptor(cy)
    w_desc = create_filter_descriptor(w)
    xs_descs = _make_tensor_descriptor_array_for_padded(xs)
    workspace = _make_rnn_workspace(rnn_desc, xs.shape[0], xs_descs, place)
    reserve_space = _make_rnn_reserve_space(rnn_desc, xs.shape[0], xs_descs, place)
    cudnn.RNNForwardTrainingEx(handle, rnn_desc.value, x_data_desc.value, xs, hx_desc.value, hx, cx_desc.value,
                               _d(cx), w_desc.value, w, y_data_desc.value, ys, hy_desc.value, hy, cy_desc.value,
                               _d(cy), 0, 0, 0, 0, 0, 0, 0, 0, _mem(workspace), _mem_size(workspace),
                               _mem(reserve_space), _mem_size(reserve_space))
    return reserve_space, hy, cy, ys


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


# -- fused ops ----------------------------------------------------------------------------------

def _is_scalar_const_label(label) -> bool:
    from ..fused_ops import const_kind
    return const_kind(label) != "desc"


def create_fused_ops_plan(ops):
    return Descriptor(cudnn.createFusedOpsPlan(ops), _py_cudnn.destroyFusedOpsPlan)


def create_fused_ops_const_param_pack(ops, list_attr_param):
    const_pack = Descriptor(cudnn.createFusedOpsConstParamPack(ops), _py_cudnn.destroyFusedOpsConstParamPack)
    for attr, param in list_attr_param:
        set_fused_ops_const_param_pack_attribute(const_pack, attr, param)
    return const_pack


def make_fused_ops_plan(plan, const_pack):
    return cudnn.makeFusedOpsPlan(get_handle(), plan.value, const_pack.value)


def create_fused_ops_variant_param_pack(ops, list_attr_param):
    var_pack = Descriptor(cudnn.createFusedOpsVariantParamPack(ops), _py_cudnn.destroyFusedOpsVariantParamPack)
    for attr, param in list_attr_param:
        set_fused_ops_variant_param_pack_attribute(var_pack, attr, param)
    return var_pack


def fused_ops_execute(plan, var_pack):
    cudnn.fusedOpsExecute(get_handle(), plan.value, var_pack.value)


def set_fused_ops_const_param_pack_attribute(const_pack, param_label, desc_or_scalar):
    if _is_scalar_const_label(param_label):
        scalar = _ctypes.c_int(int(desc_or_scalar))
        cudnn.setFusedOpsConstParamPackAttribute(const_pack.value, param_label, _ctypes.addressof(scalar))
    else:
        cudnn.setFusedOpsConstParamPackAttribute(const_pack.value, param_label, desc_or_scalar.value)


def get_fused_ops_const_param_pack_attribute(const_pack, param_label):
    """(int value, isNULL) for a scalar label, (a new descriptor filled from the pack, isNULL) else."""
    if _is_scalar_const_label(param_label):
        out = _ctypes.c_int(0)
        is_null = cudnn.getFusedOpsConstParamPackAttribute(const_pack.value, param_label, _ctypes.addressof(out))
        return out.value, is_null
    name = next((k for k, v in vars(cudnn).items() if k.startswith("CUDNN_PARAM_") and v == param_label), "")
    if name == "CUDNN_PARAM_ACTIVATION_DESC":
        desc = cudnn.createActivationDescriptor()
    elif name == "CUDNN_PARAM_CONV_DESC":
        desc = cudnn.createConvolutionDescriptor()
    elif name in ("CUDNN_PARAM_WDESC", "CUDNN_PARAM_DWDESC"):
        desc = cudnn.createFilterDescriptor()
    else:
        desc = cudnn.createTensorDescriptor()
    is_null = cudnn.getFusedOpsConstParamPackAttribute(const_pack.value, param_label, desc)
    return desc, is_null


_VARIANT_SCALARS = {"CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES": _ctypes.c_size_t,
                    "CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT": _ctypes.c_int64,
                    "CUDNN_SCALAR_DOUBLE_BN_EPSILON": _ctypes.c_double,
                    "CUDNN_SCALAR_DOUBLE_BN_EXP_AVG_FACTOR": _ctypes.c_double}


def _variant_scalar_ctype(label):
    for name, ctype in _VARIANT_SCALARS.items():
        if getattr(cudnn, name) == label:
            return ctype
    return None


def set_fused_ops_variant_param_pack_attribute(var_pack, param_label, arr_or_scaler):
    ctype = _variant_scalar_ctype(param_label)
    if ctype is not None:
        value = ctype(arr_or_scaler)
        cudnn.setFusedOpsVariantParamPackAttribute(var_pack.value, param_label, _ctypes.addressof(value))
    else:
        ptr = arr_or_scaler.data.ptr if _on_device(arr_or_scaler) else arr_or_scaler
        cudnn.setFusedOpsVariantParamPackAttribute(var_pack.value, param_label, ptr)


def get_fused_ops_variant_param_pack_attribute(var_pack, param_label):
    ctype = _variant_scalar_ctype(param_label) or _ctypes.c_size_t
    out = ctype(0)
    cudnn.getFusedOpsVariantParamPackAttribute(var_pack, param_label, _ctypes.addressof(out))
    return out.value
