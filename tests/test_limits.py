"""Limits (issue 10): 2^31 elements, 2^31-element spans and strides, and byte offsets past 2^31.

rule_element_count_reaching_2_31_is_not_supported   a tensor or filter of 2^31 elements or more is
        refused when its descriptor is set: NOT_SUPPORTED, a message naming the limit, the descriptor
        keeps its previous settings (002 §2.2: "total size ... <= 2 Giga-elements")
rule_span_reaching_2_31_is_not_supported            likewise when the strides make the tensor span
        2^31 elements or more, whatever its element count
rule_stride_over_2_31_is_bad_param                 a stride of 2^31 or more (a C int cannot hold it), even
        on a dim of size 1: BAD_PARAM from the argument conversion (issue 13; before: strides like 2^70
        passed and crashed NumPy inside calls)
rule_big_byte_offsets_are_right                     byte offsets past 2^31 with fewer than 2^31 elements
        work and are right: on the CPU through a sparse 2 GiB mapping (nothing big is allocated), on
        the GPU (marked gpu) for each engine, or the call is refused with NOT_SUPPORTED, never wrong
None of the CPU tests allocates more than a few pages.
"""
import mmap

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

NS, BAD = cc.CUDNN_STATUS_NOT_SUPPORTED, cc.CUDNN_STATUS_BAD_PARAM
F32 = cc.CUDNN_DATA_FLOAT
LIMIT = 2 ** 31


def _set(how, d, dims, strides=None, dtype=F32):
    if how == "4d":
        cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, dtype, *dims)
    elif how == "4dEx":
        cc.cudnnSetTensor4dDescriptorEx(d, dtype, *dims, *strides)
    elif how == "Nd":
        cc.cudnnSetTensorNdDescriptor(d, dtype, len(dims), list(dims), list(strides))
    elif how == "NdEx":
        cc.cudnnSetTensorNdDescriptorEx(d, cc.CUDNN_TENSOR_NHWC, dtype, len(dims), list(dims))
    elif how == "filter4d":
        cc.cudnnSetFilter4dDescriptor(d, dtype, cc.CUDNN_TENSOR_NCHW, *dims)
    else:
        cc.cudnnSetFilterNdDescriptor(d, dtype, cc.CUDNN_TENSOR_NCHW, len(dims), list(dims))


def _packed(dims):
    s, acc = [], 1
    for d in reversed(dims):
        s.insert(0, acc)
        acc *= d
    return s


def _make(how):
    return cc.cudnnCreateFilterDescriptor() if how.startswith("filter") else cc.cudnnCreateTensorDescriptor()


def _get(how, d):
    if how.startswith("filter"):
        return tuple(cc.cudnnGetFilterNdDescriptor(d)[3])
    return tuple(cc.cudnnGetTensorNdDescriptor(d)[2])


HOWS = ["4d", "4dEx", "Nd", "NdEx", "filter4d", "filterNd"]
AT_LIMIT = [(2 ** 15, 2 ** 16, 1, 1), (2, 2 ** 30, 1, 1), (1, 1, 2 ** 16, 2 ** 15), (2 ** 20, 2 ** 20, 2 ** 20, 2 ** 20),
            (3, 5, 7, 2 ** 30)]


@pytest.mark.parametrize("dims", AT_LIMIT, ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("how", HOWS)
def test_rule_element_count_reaching_2_31_is_not_supported(how, dims):
    d = _make(how)
    _set(how, d, (1, 2, 3, 4), _packed((1, 2, 3, 4)))
    with pytest.raises(cc.CuDNNError) as e:
        _set(how, d, dims, _packed(dims))
    # a packed stride no C int holds is BAD_PARAM before the element count is looked at (issue 13)
    want = BAD if how in ("4dEx", "Nd") and max(_packed(dims)) >= LIMIT else NS
    assert e.value.status == want and "2^31" in str(e.value), e.value
    assert _get(how, d) == (1, 2, 3, 4), "a refused set changed the descriptor"


@pytest.mark.parametrize("how", HOWS)
def test_just_under_2_31_elements_is_accepted(how):
    dims = (1, 1, 1, LIMIT - 1)
    d = _make(how)
    _set(how, d, dims, _packed(dims), cc.CUDNN_DATA_DOUBLE)
    assert _get(how, d) == dims
    size = (cc.cudnnGetFilterSizeInBytes if how.startswith("filter") else cc.cudnnGetTensorSizeInBytes)(d)
    assert size == (LIMIT - 1) * 8  # byte sizes past 2^31 are fine


@pytest.mark.parametrize("how", ["4dEx", "Nd"])
@pytest.mark.parametrize("dims, strides", [
    ((2, 1, 1, 1), (LIMIT - 1, 1, 1, 1)),  # 2 elements spanning exactly 2^31
    ((3, 2, 1, 1), (2 ** 30, 1, 1, 1)),
    ((1, 1, 2, 2 ** 15), (1, 1, 2 ** 30, 2 ** 16)),
])
def test_rule_span_reaching_2_31_is_not_supported(how, dims, strides):
    d = cc.cudnnCreateTensorDescriptor()
    with pytest.raises(cc.CuDNNError) as e:
        _set(how, d, dims, strides)
    assert e.value.status == NS and "2^31" in str(e.value), e.value


@pytest.mark.parametrize("stride", [LIMIT, 2 ** 40, 2 ** 63, 2 ** 70])
def test_rule_stride_over_2_31_is_bad_param(handle, stride):
    """A size-1 dim with a stride no C int holds: refused at set time (before, 2^70 passed and the
    call died in NumPy with ValueError 'Maximum allowed dimension exceeded')."""
    d = cc.cudnnCreateTensorDescriptor()
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetTensorNdDescriptor(d, F32, 4, [1, 1, 1, 1], [stride, 1, 1, 1])
    assert e.value.status == BAD and e.value.argument == "strideA" and "2^31" in str(e.value)
    cc.cudnnSetTensorNdDescriptor(d, F32, 4, [1, 1, 1, 1], [LIMIT - 1, 1, 1, 1])  # the largest one is fine
    c = tdesc((1, 1, 1, 1))
    y = np.zeros(1, np.float32)
    cc.cudnnAddTensor(handle, 1.0, d, np.full(1, 2.0, np.float32), 0.0, c, y)
    assert y[0] == 2.0


def test_negative_and_overflowing_dims_are_refused():
    d = cc.cudnnCreateTensorDescriptor()
    for dims, status in [((2 ** 62, 4, 1, 1), BAD), ((2 ** 70, 1, 1, 1), BAD), ((-2 ** 31, 1, 1, 1), BAD),
                         ((1, -1, 1, 1), BAD), ((1, 0, 1, 1), BAD)]:
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, F32, *dims)
        assert e.value.status == status, (dims, e.value)


def _sparse(nbytes):
    """A zero-filled NumPy byte array of ``nbytes`` over an anonymous mapping: pages are only
    committed when touched."""
    try:
        mm = mmap.mmap(-1, nbytes)
    except (OSError, ValueError, OverflowError) as e:  # pragma: no cover - no address space
        pytest.skip(f"cannot map {nbytes} bytes: {e}")
    return mm, np.frombuffer(mm, np.uint8)


def test_rule_big_byte_offsets_are_right_on_cpu(handle):
    """x: 2x1x1x2 float32 with nStride 2^29+3, so its second image starts 2^31+12 bytes in; fewer
    than 2^31 elements, byte offsets past 2^31.  Read (TransformTensor), read-modify-write (AddTensor
    with beta), and an activation in place must all address the right bytes."""
    n_stride = 2 ** 29 + 3
    mm, buf = _sparse((n_stride + 2) * 4 + 64)
    try:
        xd = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensor4dDescriptorEx(xd, F32, 2, 1, 1, 2, n_stride, 2, 2, 1)
        assert cc.cudnnGetTensorSizeInBytes(xd) == (n_stride + 2) * 4 > LIMIT
        f = buf[:(n_stride + 2) * 4].view(np.float32)
        f[[0, 1, n_stride, n_stride + 1]] = [1.5, -2.0, 3.0, -4.0]
        yd = tdesc((2, 1, 1, 2))
        y = np.zeros(4, np.float32)
        cc.cudnnTransformTensor(handle, 2.0, xd, buf, 0.0, yd, y)
        np.testing.assert_array_equal(y, [3.0, -4.0, 6.0, -8.0])
        cc.cudnnAddTensor(handle, 1.0, yd, y, 0.5, xd, buf)  # x = y + 0.5*x, in place at the far offsets
        np.testing.assert_array_equal(f[[0, 1, n_stride, n_stride + 1]], [3.75, -5.0, 7.5, -10.0])
        act = cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetActivationDescriptor(act, cc.CUDNN_ACTIVATION_RELU, 0, 0.0)
        cc.cudnnActivationForward(handle, act, 1.0, xd, buf, 0.0, xd, buf)
        np.testing.assert_array_equal(f[[0, 1, n_stride, n_stride + 1]], [3.75, 0.0, 7.5, 0.0])
        assert not f[2:64].any() and not f[n_stride - 64:n_stride].any(), "bytes between the elements were written"
        del f
    finally:
        del buf
        mm.close()


# -- GPU: the device engines at byte offsets past 2^31 --------------------------------------------------

GPU_ENGINES = [None, "cupy", "cudnn"]


def _refused_or(call):
    """Run ``call``; True when refused with NOT_SUPPORTED (allowed: 'refused, never wrong')."""
    try:
        call()
    except cc.CuDNNError as e:
        assert e.status == NS, e
        return True
    return False


@pytest.mark.gpu
@pytest.mark.parametrize("engine", GPU_ENGINES, ids=lambda e: e or "default")
def test_rule_big_byte_offsets_are_right_on_gpu_packed(monkeypatch, engine):
    """float32 1x1x(2^14+8)x2^15: 2^29+2^18 elements (under 2^31), 2^31+2^20 bytes.  ReLU, a broadcast
    AddTensor and a 2x2 max pooling, each compared on the device with CuPy over the whole tensor."""
    import cupy as cp
    if engine:
        monkeypatch.setenv("CUDNN_COMPAT_ENGINE", engine)
    h = cc.cudnnCreate("gpu")
    try:
        H, W = 2 ** 14 + 8, 2 ** 15
        x = (cp.arange(H * W, dtype=cp.int64) % 7 - 3).astype(cp.float32).reshape(1, 1, H, W)
        assert x.nbytes > LIMIT and x.size < LIMIT
        xd = tdesc((1, 1, H, W))
        y = cp.full_like(x, cp.nan)
        act = cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetActivationDescriptor(act, cc.CUDNN_ACTIVATION_RELU, 0, 0.0)
        if not _refused_or(lambda: cc.cudnnActivationForward(h, act, 1.0, xd, x, 0.0, xd, y)):
            cp.cuda.Device().synchronize()
            assert bool(cp.all(y == cp.maximum(x, 0))), "ReLU wrong past 2^31 bytes"
        b = cp.arange(W, dtype=cp.float32).reshape(1, 1, 1, W)
        y[...] = x
        if not _refused_or(lambda: cc.cudnnAddTensor(h, 1.0, tdesc((1, 1, 1, W)), b, 1.0, xd, y)):
            cp.cuda.Device().synchronize()
            assert bool(cp.all(y == x + b)), "AddTensor wrong past 2^31 bytes"
        y = None  # free 2 GiB before the pooling output
        pool = cc.cudnnCreatePoolingDescriptor()
        cc.cudnnSetPooling2dDescriptor(pool, cc.CUDNN_POOLING_MAX, 0, 2, 2, 0, 0, 2, 2)
        p = cp.full((1, 1, H // 2, W // 2), cp.nan, cp.float32)
        if not _refused_or(lambda: cc.cudnnPoolingForward(h, pool, 1.0, xd, x, 0.0, tdesc(p.shape), p)):
            cp.cuda.Device().synchronize()
            want = x.reshape(H // 2, 2, W // 2, 2).max(axis=(1, 3))
            assert bool(cp.all(p[0, 0] == want)), "pooling wrong past 2^31 bytes"
    finally:
        cc.cudnnDestroy(h)
        cp.get_default_memory_pool().free_all_blocks()


@pytest.mark.gpu
@pytest.mark.parametrize("engine", GPU_ENGINES, ids=lambda e: e or "default")
def test_rule_big_byte_offsets_are_right_on_gpu_strided(monkeypatch, engine):
    """Four float32 elements, the last two 2^31+12 bytes into the buffer (nStride 2^29+3)."""
    import cupy as cp
    if engine:
        monkeypatch.setenv("CUDNN_COMPAT_ENGINE", engine)
    h = cc.cudnnCreate("gpu")
    try:
        n_stride = 2 ** 29 + 3
        buf = cp.zeros(n_stride + 2, cp.float32)
        buf[cp.array([0, 1, n_stride, n_stride + 1])] = cp.array([1.5, -2.0, 3.0, -4.0], cp.float32)
        xd = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensor4dDescriptorEx(xd, F32, 2, 1, 1, 2, n_stride, 2, 2, 1)
        yd = tdesc((2, 1, 1, 2))
        y = cp.zeros(4, cp.float32)
        if not _refused_or(lambda: cc.cudnnTransformTensor(h, 2.0, xd, buf, 0.0, yd, y)):
            assert y.get().tolist() == [3.0, -4.0, 6.0, -8.0]
        y[...] = cp.array([3.0, -4.0, 6.0, -8.0], cp.float32)
        if not _refused_or(lambda: cc.cudnnAddTensor(h, 1.0, yd, y, 0.5, xd, buf)):
            got = buf[cp.array([0, 1, n_stride, n_stride + 1])].get().tolist()
            assert got == [3.75, -5.0, 7.5, -10.0]
            assert not bool(buf[2:n_stride].any()), "bytes between the elements were written"
    finally:
        cc.cudnnDestroy(h)
        cp.get_default_memory_pool().free_all_blocks()
