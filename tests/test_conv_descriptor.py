"""Convolution descriptors and output-dim queries (002 §5.2.11/§5.2.12 Create/Destroy, §5.2.33/
§5.2.17 Set/Get 2d, §5.2.36/§5.2.27 Set/Get Nd, §5.2.34/§5.2.25 group count, §5.2.35/§5.2.26 math
type, §5.2.37/§5.2.29 reorder type, §5.2.18/§5.2.28 forward output dims), with their errors."""
import ctypes

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc
from conv_util import CONV, CROSS, DOUBLE, FLOAT, HALF, cdesc, fdesc

BAD, UNSUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED


def test_2d_round_trip_and_extras():
    d = cc.cudnnCreateConvolutionDescriptor()
    assert cc.cudnnGetConvolutionGroupCount(d) == 1 and cc.cudnnGetConvolutionMathType(d) == cc.CUDNN_DEFAULT_MATH
    assert cc.cudnnGetConvolutionReorderType(d) == cc.CUDNN_DEFAULT_REORDER
    cc.cudnnSetConvolution2dDescriptor(d, 1, 2, 3, 4, 5, 6, CONV, DOUBLE)
    assert cc.cudnnGetConvolution2dDescriptor(d) == (1, 2, 3, 4, 5, 6, CONV, DOUBLE)
    assert cc.cudnnGetConvolutionNdDescriptor(d, 2) == (2, [1, 2], [3, 4], [5, 6], CONV, DOUBLE)
    cc.setConvolutionGroupCount(d, 4)
    cc.setConvolutionMathType(d, cc.CUDNN_TENSOR_OP_MATH)
    cc.setConvolutionReorderType(d, cc.CUDNN_NO_REORDER)
    assert (cc.getConvolutionGroupCount(d), cc.getConvolutionMathType(d), cc.getConvolutionReorderType(d)) == \
        (4, cc.CUDNN_TENSOR_OP_MATH, cc.CUDNN_NO_REORDER)
    cc.cudnnDestroyConvolutionDescriptor(d)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetConvolutionGroupCount(d)
    assert e.value.status == BAD


def test_nd_round_trip_lists_and_host_pointers():
    d = cc.createConvolutionDescriptor()
    pad, stride, dil = (np.array(v, np.int32) for v in ([0, 1, 2], [1, 2, 3], [2, 1, 1]))
    # CuPy 13 passed int* host pointers (setConvolutionNdDescriptor_v3); here as ctypes pointers (issue 13)
    pad, stride, dil = (a.ctypes.data_as(ctypes.c_void_p) for a in (pad, stride, dil))
    cc.setConvolutionNdDescriptor_v3(d, 3, pad, stride, dil, CROSS, FLOAT)
    assert cc.cudnnGetConvolutionNdDescriptor(d, 3) == (3, [0, 1, 2], [1, 2, 3], [2, 1, 1], CROSS, FLOAT)
    assert cc.cudnnGetConvolutionNdDescriptor(d, 1) == (3, [0], [1], [2], CROSS, FLOAT)  # min(requested, actual)
    cc.cudnnSetConvolutionNdDescriptor(d, 2, [3, 4], [1, 1], [1, 2], CONV, HALF)
    assert cc.cudnnGetConvolution2dDescriptor(d) == (3, 4, 1, 1, 1, 2, CONV, HALF)


@pytest.mark.parametrize("args, status, arg", [
    ((-1, 0, 1, 1, 1, 1, CROSS, FLOAT), BAD, "pad_h,pad_w"),
    ((0, 0, 0, 1, 1, 1, CROSS, FLOAT), BAD, "u,v"),
    ((0, 0, 1, -2, 1, 1, CROSS, FLOAT), BAD, "u,v"),
    ((0, 0, 1, 1, 0, 1, CROSS, FLOAT), BAD, "dilation_h,dilation_w"),
    ((0, 0, 1, 1, 1, 1, 7, FLOAT), BAD, "mode"),
    ((0, 0, 1, 1, 1, 1, CROSS, 99), BAD, "computeType"),
])
def test_set_2d_errors(args, status, arg):
    d = cc.cudnnCreateConvolutionDescriptor()
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetConvolution2dDescriptor(d, *args)
    assert e.value.status == status and f": {arg}:" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # nothing was set
        cc.cudnnGetConvolution2dDescriptor(d)
    assert e.value.status == BAD


@pytest.mark.parametrize("args, status, arg", [
    ((0, [], [], []), BAD, "arrayLength"),
    ((-1, [], [], []), BAD, "arrayLength"),
    ((9, [0] * 9, [1] * 9, [1] * 9), UNSUP, "arrayLength"),  # > CUDNN_DIM_MAX
    ((2, [0], [1, 1], [1, 1]), BAD, "padA"),  # too few entries
    ((2, [0, -1], [1, 1], [1, 1]), BAD, "padA"),
    ((2, [0, 0], [1, 0], [1, 1]), BAD, "filterStrideA"),
    ((2, [0, 0], [1, 1], [-1, 1]), BAD, "dilationA"),
])
def test_set_nd_errors(args, status, arg):
    d = cc.cudnnCreateConvolutionDescriptor()
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetConvolutionNdDescriptor(d, *args, CROSS, FLOAT)
    assert e.value.status == status and f": {arg}:" in str(e.value)


def test_getter_and_extra_setter_errors():
    d = cdesc((1, 1, 1))
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetConvolution2dDescriptor(d)  # a 3-d descriptor
    assert e.value.status == BAD
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetConvolutionNdDescriptor(d, -1)
    assert e.value.status == BAD
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetConvolutionNdDescriptor(d, cc.CUDNN_DIM_MAX - 1)
    assert e.value.status == UNSUP
    for fn, bad in [(cc.cudnnSetConvolutionGroupCount, 0), (cc.cudnnSetConvolutionMathType, 9),
                    (cc.cudnnSetConvolutionReorderType, 5)]:
        with pytest.raises(cc.CuDNNError) as e:
            fn(d, bad)
        assert e.value.status == BAD
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetConvolutionGroupCount(0, 2)  # NULL descriptor
    assert e.value.status == BAD and "convDesc" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetConvolutionGroupCount(tdesc((1, 1, 1, 1)), 2)  # not a convolution descriptor
    assert e.value.status == BAD


@pytest.mark.parametrize("xs, ws, pad, stride, dil, groups", [
    ((2, 3, 7, 9), (5, 3, 3, 2), (1, 0), (2, 3), (1, 2), 1),
    ((1, 8, 10, 4), (6, 2, 4, 1), (0, 3), (1, 1), (3, 1), 4),
    ((3, 2, 5, 6, 7), (4, 2, 2, 3, 1), (1, 1, 0), (2, 1, 3), (2, 1, 1), 1),
])
def test_forward_output_dims(xs, ws, pad, stride, dil, groups):
    cd = cdesc(pad, stride, dil, groups=groups)
    want = [xs[0], ws[0]] + [1 + (s + 2 * p - ((r - 1) * d + 1)) // u
                             for s, r, p, u, d in zip(xs[2:], ws[2:], pad, stride, dil)]
    assert cc.cudnnGetConvolutionNdForwardOutputDim(cd, tdesc(xs), fdesc(ws), len(xs)) == want
    assert cc.cudnnGetConvolutionNdForwardOutputDim(cd, tdesc(xs), fdesc(ws), 2) == want[:2]
    if len(xs) == 4:
        assert cc.getConvolution2dForwardOutputDim(cd, tdesc(xs), fdesc(ws)) == tuple(want)


@pytest.mark.parametrize("xs, ws, pad, nb, arg", [
    ((1, 4, 5, 5), (2, 3, 3, 3), (1, 1), 4, "filterDesc"),  # feature maps differ
    ((1, 3, 5, 5), (2, 3, 8, 3), (1, 1), 4, "filterDesc"),  # filter larger than the padded input
    ((1, 3, 5, 5), (2, 3, 3, 3), (1, 1, 1), 4, "convDesc"),  # arrayLength != nbDims - 2
    ((1, 3, 5, 5), (2, 3, 3, 3, 3), (1, 1), 4, "filterDesc"),  # rank differs
    ((1, 3, 5, 5), (2, 3, 3, 3), (1, 1), 5, "nbDims"),  # more dims than the input has
])
def test_output_dims_errors(xs, ws, pad, nb, arg):
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetConvolutionNdForwardOutputDim(cdesc(pad), tdesc(xs), fdesc(ws), nb)
    assert e.value.status == BAD and f": {arg}:" in str(e.value), str(e.value)
