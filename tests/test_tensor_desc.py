"""Tensor and filter descriptors: setters, getters, sizes and their error rules (002 §3.2.91-§3.2.94
SetTensor4d/4dEx/Nd/NdEx, §3.2.58/§3.2.59 Get, §3.2.61 GetTensorSizeInBytes, §3.2.81/§3.2.82
SetFilter4d/Nd, §3.2.52/§3.2.53 GetFilter4d/Nd; inventory §2.2, §2.3)."""
import numpy as np
import pytest

import cudnn_compat as cc

F, D, H = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_HALF
NCHW, NHWC, VECT = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC, cc.CUDNN_TENSOR_NCHW_VECT_C
BAD, NOTSUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED


def status_of(fn, *args):
    with pytest.raises(cc.CuDNNError) as e:
        fn(*args)
    return e.value.status


def strides_for(order, dims):
    """Packed strides of logical ``dims`` when memory runs through the axes in ``order`` (outermost first)."""
    st = [0] * len(dims)
    acc = 1
    for ax in reversed(order):
        st[ax] = acc
        acc *= dims[ax]
    return st


# -- tensor descriptors ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt,order", [(NCHW, [0, 1, 2, 3]), (NHWC, [0, 2, 3, 1])])
def test_set_get_4d(fmt, order):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, fmt, H, 2, 3, 4, 5)
    assert cc.cudnnGetTensor4dDescriptor(d) == (H, 2, 3, 4, 5, *strides_for(order, (2, 3, 4, 5)))
    assert cc.getTensorSizeInBytes(d) == 2 * 3 * 4 * 5 * 2
    cc.destroyTensorDescriptor(d)


def test_set_4d_ex_and_size_with_gaps():
    d = cc.createTensorDescriptor()
    cc.setTensor4dDescriptorEx(d, F, 2, 3, 4, 5, 200, 60, 15, 3)
    assert cc.getTensor4dDescriptor(d) == (F, 2, 3, 4, 5, 200, 60, 15, 3)
    span = 1 + (2 - 1) * 200 + (3 - 1) * 60 + (4 - 1) * 15 + (5 - 1) * 3  # last element's offset + 1
    assert cc.getTensorSizeInBytes(d) == span * 4


@pytest.mark.parametrize("nb", [3, 4, 5, 8])
def test_set_get_nd(nb):
    dims = [2, 3, 1, 4, 1, 2, 1, 3][:nb]
    strides = strides_for(list(range(nb)), dims)
    strides[0] *= 2  # a gap between images
    d = cc.createTensorDescriptor()
    cc.setTensorNdDescriptor(d, D, nb, dims, strides)
    assert cc.getTensorNdDescriptor(d) == (D, nb, dims, strides)
    k = min(2, nb)
    assert cc.getTensorNdDescriptor(d, 2) == (D, nb, dims[:k], strides[:k])  # min(requested, nbDims) entries
    assert cc.getTensorSizeInBytes(d) == (1 + sum((a - 1) * s for a, s in zip(dims, strides))) * 8


def test_set_nd_ex_nhwc_5d():
    d = cc.createTensorDescriptor()
    dims = [2, 3, 4, 5, 6]
    cc.setTensorNdDescriptorEx(d, NHWC, F, 5, dims)
    assert cc.getTensorNdDescriptor(d) == (F, 5, dims, strides_for([0, 2, 3, 4, 1], dims))


def test_vect_c_int8x4():
    d = cc.createTensorDescriptor()
    cc.setTensor4dDescriptor(d, VECT, cc.CUDNN_DATA_INT8x4, 1, 8, 2, 2)
    assert cc.getTensor4dDescriptor(d)[:5] == (cc.CUDNN_DATA_INT8x4, 1, 8, 2, 2)


def _tensor_error_cases():
    return [
        ("4d zero dim", cc.setTensor4dDescriptor, (NCHW, F, 1, 0, 2, 2), BAD),
        ("4d negative dim", cc.setTensor4dDescriptor, (NCHW, F, 1, -3, 2, 2), BAD),
        ("4d bad format", cc.setTensor4dDescriptor, (7, F, 1, 2, 2, 2), BAD),
        ("4d bad data type", cc.setTensor4dDescriptor, (NCHW, 99, 1, 2, 2, 2), BAD),
        ("4d VECT_C with float", cc.setTensor4dDescriptor, (VECT, F, 1, 4, 2, 2), BAD),
        ("4d INT8x4 with c not a multiple of 4", cc.setTensor4dDescriptor, (VECT, cc.CUDNN_DATA_INT8x4, 1, 3, 2, 2), BAD),
        ("4d over 2^31 elements", cc.setTensor4dDescriptor, (NCHW, F, 2, 1024, 1024, 1025), NOTSUP),
        ("4dEx negative stride", cc.setTensor4dDescriptorEx, (F, 1, 2, 2, 2, 8, 4, 2, -1), BAD),
        ("4dEx negative dim", cc.setTensor4dDescriptorEx, (F, 1, -2, 2, 2, 8, 4, 2, 1), BAD),
        ("4dEx span over 2^31", cc.setTensor4dDescriptorEx, (F, 2, 1, 1, 1, 2 ** 31 - 1, 1, 1, 1), NOTSUP),  # a C int stride
        ("Nd zero dim", cc.setTensorNdDescriptor, (F, 4, [1, 2, 0, 2], [8, 4, 2, 1]), BAD),
        ("Nd negative stride", cc.setTensorNdDescriptor, (F, 4, [1, 2, 2, 2], [8, 4, -2, 1]), BAD),
        ("Nd bad data type", cc.setTensorNdDescriptor, (-1, 4, [1, 2, 2, 2], [8, 4, 2, 1]), BAD),
        ("Nd nbDims 9", cc.setTensorNdDescriptor, (F, 9, [1] * 9, [1] * 9), NOTSUP),
        ("Nd nbDims 2", cc.setTensorNdDescriptor, (F, 2, [2, 2], [2, 1]), NOTSUP),
        ("Nd nbDims 0", cc.setTensorNdDescriptor, (F, 0, [], []), BAD),
        ("Nd over 2^31 elements", cc.setTensorNdDescriptor, (F, 4, [1, 2, 32768, 32769], [1, 32768 * 32769, 32769, 1]), NOTSUP),
        ("NdEx nbDims 9", cc.setTensorNdDescriptorEx, (NCHW, F, 9, [1] * 9), NOTSUP),
        ("NdEx bad format", cc.setTensorNdDescriptorEx, (5, F, 4, [1, 2, 2, 2]), BAD),
        ("NdEx negative dim", cc.setTensorNdDescriptorEx, (NHWC, F, 4, [1, 2, -2, 2]), BAD),
    ]


@pytest.mark.parametrize("rule,fn,args,status", _tensor_error_cases(), ids=[c[0] for c in _tensor_error_cases()])
def test_tensor_setter_errors_keep_the_descriptor(rule, fn, args, status):
    d = cc.createTensorDescriptor()
    cc.setTensor4dDescriptor(d, NCHW, F, 1, 2, 3, 4)
    with pytest.raises(cc.CuDNNError) as e:
        fn(d, *args)
    assert e.value.status == status, rule
    assert fn.__name__ in str(e.value)  # the message names the function
    assert cc.getTensor4dDescriptor(d) == (F, 1, 2, 3, 4, 24, 12, 4, 1)  # unchanged


def test_tensor_getter_rules():
    d = cc.createTensorDescriptor()
    assert status_of(cc.getTensor4dDescriptor, d) == BAD  # created but never set
    cc.setTensorNdDescriptorEx(d, NCHW, F, 5, [1, 2, 3, 4, 5])
    assert status_of(cc.getTensor4dDescriptor, d) == BAD  # a 5-d descriptor
    assert status_of(cc.getTensorNdDescriptor, d, -1) == BAD
    cc.destroyTensorDescriptor(d)
    e = pytest.raises(cc.CuDNNError, cc.getTensorNdDescriptor, int(d)).value
    assert e.status == BAD and "destroyed" in str(e)
    assert status_of(cc.destroyTensorDescriptor, d) == BAD  # twice


# -- filter descriptors ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt,order", [(NCHW, [0, 1, 2, 3]), (NHWC, [0, 2, 3, 1])])
def test_filter_4d(fmt, order):
    w = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(w, H, fmt, 8, 3, 5, 7)  # note: dataType before format here
    assert cc.getFilter4dDescriptor(w) == (H, fmt, 8, 3, 5, 7)
    assert cc.getFilterNdDescriptor(w) == (H, fmt, 4, [8, 3, 5, 7])
    assert w.strides == tuple(strides_for(order, (8, 3, 5, 7)))  # KCRS or KRSC memory
    assert cc.getFilterSizeInBytes(w) == 8 * 3 * 5 * 7 * 2
    cc.destroyFilterDescriptor(w)


def test_filter_nd_5d_nhwc_is_kdrsc():
    w = cc.createFilterDescriptor()
    dims = [4, 3, 2, 5, 6]
    cc.setFilterNdDescriptor(w, F, NHWC, 5, dims)
    assert cc.getFilterNdDescriptor(w, 3) == (F, NHWC, 5, dims[:3])
    assert w.strides == tuple(strides_for([0, 2, 3, 4, 1], dims))


def _filter_error_cases():
    return [
        ("4d negative k", cc.setFilter4dDescriptor, (F, NCHW, -1, 3, 3, 3), BAD),
        ("4d zero c", cc.setFilter4dDescriptor, (F, NCHW, 2, 0, 3, 3), BAD),
        ("4d bad data type", cc.setFilter4dDescriptor, (99, NCHW, 2, 3, 3, 3), BAD),
        ("4d bad format", cc.setFilter4dDescriptor, (F, 3, 2, 3, 3, 3), BAD),
        ("Nd negative dim", cc.setFilterNdDescriptor, (F, NCHW, 4, [2, 3, -3, 3]), BAD),
        ("Nd nbDims 9", cc.setFilterNdDescriptor, (F, NCHW, 9, [1] * 9), NOTSUP),
        ("Nd VECT_C with float", cc.setFilterNdDescriptor, (F, VECT, 4, [2, 4, 3, 3]), BAD),
    ]


@pytest.mark.parametrize("rule,fn,args,status", _filter_error_cases(), ids=[c[0] for c in _filter_error_cases()])
def test_filter_setter_errors_keep_the_descriptor(rule, fn, args, status):
    w = cc.createFilterDescriptor()
    cc.setFilter4dDescriptor(w, F, NCHW, 2, 3, 4, 5)
    assert status_of(fn, w, *args) == status, rule
    assert cc.getFilter4dDescriptor(w) == (F, NCHW, 2, 3, 4, 5)


def test_descriptor_kinds_are_checked():
    t = cc.createTensorDescriptor()
    cc.setTensor4dDescriptor(t, NCHW, F, 1, 1, 1, 1)
    e = pytest.raises(cc.CuDNNError, cc.getFilter4dDescriptor, t).value  # a tensor where a filter is wanted
    assert e.status == BAD and "filterDesc" in str(e)
    w = cc.createFilterDescriptor()
    assert status_of(cc.setFilter4dDescriptor, int(t), F, NCHW, 1, 1, 1, 1) == BAD  # by id, still the wrong kind
    assert status_of(cc.getFilter4dDescriptor, w) == BAD  # never set
    assert status_of(cc.setTensor4dDescriptor, 0, NCHW, F, 1, 1, 1, 1) == BAD  # NULL
    assert status_of(cc.setTensor4dDescriptor, 12345678, NCHW, F, 1, 1, 1, 1) == BAD  # never existed


def test_descriptor_key_follows_settings():
    d = cc.createTensorDescriptor()
    cc.setTensor4dDescriptor(d, NCHW, F, 1, 2, 3, 4)
    k1 = d.key()
    cc.setTensor4dDescriptor(d, NHWC, F, 1, 2, 3, 4)
    assert d.key() != k1
    cc.setTensor4dDescriptor(d, NCHW, F, 1, 2, 3, 4)
    assert d.key() == k1
    assert np.dtype(int).type(int(d)) == int(d)  # usable as a plain int id
