"""``cupyx.cudnn``'s convolutions: ``convolution_forward``, ``convolution_backward_filter`` and
``convolution_backward_data`` (cudnnConvolutionForward 002 §5.2.10, cudnnConvolutionBackwardData
§5.2.8, cudnnConvolutionBackwardFilter §6.2.2), one body for the three directions, each a row of
``_cupyx_algorithm._DIRECTIONS``; the algorithm comes from that module's search and caches."""
from __future__ import annotations

from . import cupy_cudnn as cudnn
from ._cupyx_algorithm import _DIRECTIONS, _search
from ._cupyx_descriptors import (_create_convolution_descriptor, _create_filter_descriptor, _create_tensor_descriptor,
                                 _create_tensor_nd_descriptor, _get_array_info, _should_use_tensor_core)
from ._cupyx_place import (_alloc, _contiguous, _device_id, _handle_for, _mem, _on_device, _place,
                           get_max_workspace_size)


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


def _convolution(what, a, b, c, bias, pad, stride, dilation, groups, deterministic, auto_tune, tensor_core,
                 d_layout, w_layout, error_infos=None):
    """Direction ``what`` of CuPy 13's three helpers: c = op(a, b) (+ bias over channels), c written
    in place, the arrays in the order of the direction's cudnnConvolution* call.  ``deterministic``
    None: the forward, which takes no such flag (nor keys its caches by it).  ``error_infos()``:
    lines added to a CuDNNError of the call (the forward's)."""
    d = _DIRECTIONS[what]
    _check_same_place(a, b, c, bias)
    x = (a, b, c)[d.x]
    use_tensor_core = not deterministic and _should_use_tensor_core(tensor_core, x.dtype)
    conv_param = (pad, stride, x.dtype, use_tensor_core) + (() if deterministic is None else (deterministic,))
    if d.dilation_drops_tensor_core and use_tensor_core and any(i > 1 for i in dilation):
        use_tensor_core = False
    handle = _handle_for(x)
    a, b = _contiguous(a), _contiguous(b)
    arrays = (a, b, c)
    descs = [cudnn.createFilterDescriptor() if i == d.w else cudnn.createTensorDescriptor() for i in range(3)]
    conv_desc = cudnn.createConvolutionDescriptor()
    max_workspace_size = get_max_workspace_size()
    try:
        for i in sorted(range(3), key=lambda i: i == d.w):  # the two tensors, then the filter (as CuPy 13)
            if i == d.w:
                _create_filter_descriptor(descs[i], arrays[i], w_layout)
            else:
                _create_tensor_descriptor(descs[i], arrays[i], format=d_layout)
        _create_convolution_descriptor(conv_desc, pad, stride, dilation, groups, x.dtype,
                                       cudnn.CUDNN_CROSS_CORRELATION, use_tensor_core)
        da, db, dc = descs
        perf = _search(what, auto_tune and not deterministic, arrays, conv_param, handle, (da, db, conv_desc, dc),
                       max_workspace_size, use_tensor_core, bool(deterministic))
        cudnn.setConvolutionMathType(conv_desc, perf.mathType)
        workspace = _alloc(perf.memory, _place(x))
        try:
            getattr(cudnn, d.run)(handle, 1.0, da, a, db, b, conv_desc, perf.algo, _mem(workspace), perf.memory,
                                  0.0, dc, c)
        except cudnn.CuDNNError as e:
            if error_infos is not None:
                e.add_infos(error_infos())
            raise
        del workspace
        if bias is not None:
            _add_bias(handle, bias, c, dc)
    finally:
        for i, desc in enumerate(descs):
            (cudnn.destroyFilterDescriptor if i == d.w else cudnn.destroyTensorDescriptor)(desc)
        cudnn.destroyConvolutionDescriptor(conv_desc)


def convolution_forward(x, W, b, y, pad, stride, dilation, groups, *, auto_tune, tensor_core,
                        d_layout=cudnn.CUDNN_TENSOR_NCHW, w_layout=cudnn.CUDNN_TENSOR_NCHW):
    """y = conv(x, W) (+ b over channels); y is written in place (CuPy 13 returned None)."""
    def infos():
        return ["func: cudnnConvolutionForward",
                "x: {}".format(_get_array_info(x)), "W: {}".format(_get_array_info(W)),
                "b: {}".format(_get_array_info(b)), "y: {}".format(_get_array_info(y)),
                "pad={!r}, stride={!r}, dilation={!r}, groups={!r}".format(pad, stride, dilation, groups),
                "auto_tune={!r}, tensor_core={!r}".format(auto_tune, tensor_core),
                "d_layout={!r}, w_layout={!r}".format(d_layout, w_layout)]
    _convolution("fwd", x, W, y, b, pad, stride, dilation, groups, None, auto_tune, tensor_core, d_layout,
                 w_layout, infos)


def convolution_backward_filter(x, gy, gW, pad, stride, dilation, groups, *, deterministic, auto_tune, tensor_core,
                                d_layout=cudnn.CUDNN_TENSOR_NCHW, w_layout=cudnn.CUDNN_TENSOR_NCHW):
    """gW = dconv/dW (x, gy); gW is written in place."""
    _convolution("bwd filter", x, gy, gW, None, pad, stride, dilation, groups, deterministic, auto_tune,
                 tensor_core, d_layout, w_layout)


def convolution_backward_data(W, x, b, y, pad, stride, dilation, groups, *, deterministic, auto_tune, tensor_core,
                              d_layout=cudnn.CUDNN_TENSOR_NCHW, w_layout=cudnn.CUDNN_TENSOR_NCHW):
    """y = dconv/dx applied to x (the transposed convolution of x by W) (+ b); y is written in place."""
    _convolution("bwd data", W, x, y, b, pad, stride, dilation, groups, deterministic, auto_tune, tensor_core,
                 d_layout, w_layout)
