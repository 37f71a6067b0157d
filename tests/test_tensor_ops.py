"""AddTensor, SetTensor, ScaleTensor against formulas written here (002 §3.2.2, §3.2.88, §3.2.79)."""
import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
@pytest.mark.parametrize("ashape", [(1, 3, 1, 1), (2, 3, 4, 5), (1, 1, 4, 1), (2, 1, 1, 5)])
def test_add_tensor_broadcast_blend(handle, rng, ashape, beta):
    cshape = (2, 3, 4, 5)
    A = rng.standard_normal(ashape).astype(np.float32)
    C0 = rng.standard_normal(cshape).astype(np.float32)
    C = C0.copy()
    cc.cudnnAddTensor(handle, 1.5, tdesc(ashape), A, beta, tdesc(cshape), C)
    want = np.empty(cshape)
    for idx in np.ndindex(*cshape):
        aidx = tuple(i if s > 1 else 0 for i, s in zip(idx, ashape))
        want[idx] = 1.5 * A[aidx] + beta * C0[idx]
    np.testing.assert_allclose(C, want, rtol=1e-6, atol=1e-6)


def test_beta_zero_never_reads_output(handle):
    A = np.ones((1, 2, 1, 1), np.float32)
    C = np.full((1, 2, 2, 2), np.nan, np.float32)
    cc.addTensor(handle, 1.0, tdesc((1, 2, 1, 1)), A, 0.0, tdesc((1, 2, 2, 2)), C)
    assert np.all(C == 1.0)


def test_nhwc_output_and_host_pointer_scalars(handle, rng):
    shape = (2, 3, 2, 2)
    A = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)
    C = np.zeros((2, 2, 2, 3), np.float32)  # NHWC memory
    alpha = np.array(2.0, np.float32)
    cc.addTensor(handle, alpha.ctypes.data, tdesc((1, 3, 1, 1)), A, 0, tdesc(shape, fmt=cc.CUDNN_TENSOR_NHWC), C)
    np.testing.assert_allclose(C, np.broadcast_to(2 * A.reshape(1, 1, 1, 3), C.shape), rtol=1e-6)


def test_add_tensor_errors_write_nothing(handle):
    C = np.full((2, 3, 2, 2), 5.0, np.float32)
    with pytest.raises(cc.CuDNNError) as e:  # rule: A dims equal C's or 1
        cc.addTensor(handle, 1, tdesc((2, 2, 2, 2)), np.ones(16, np.float32), 0, tdesc((2, 3, 2, 2)), C)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "aDesc" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # rule: same data type
        cc.addTensor(handle, 1, tdesc((1, 3, 1, 1), cc.CUDNN_DATA_DOUBLE), np.ones(3), 0, tdesc((2, 3, 2, 2)), C)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    with pytest.raises(cc.CuDNNError) as e:  # rule: at most 5 dims
        d6 = tdesc((1, 1, 1, 1, 1, 2))
        cc.addTensor(handle, 1, d6, np.ones(2, np.float32), 0, d6, np.ones(2, np.float32))
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED
    with pytest.raises(cc.CuDNNError) as e:  # buffer smaller than the descriptor
        cc.addTensor(handle, 1, tdesc((1, 3, 1, 1)), np.ones(2, np.float32), 0, tdesc((2, 3, 2, 2)), C)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    assert np.all(C == 5.0)


def test_set_and_scale_tensor(handle, rng):
    d = tdesc((2, 3, 2, 2), strides=(12, 1, 6, 3))
    y = rng.standard_normal(24).astype(np.float32)
    y0 = y.copy()
    cc.cudnnScaleTensor(handle, d, y, -3.0)
    np.testing.assert_allclose(y, -3.0 * y0, rtol=1e-6)
    cc.setTensor(handle, d, y, 0.25)
    assert np.all(y == 0.25)


def test_repeated_call_is_a_cache_hit(handle):
    d = tdesc((1, 4, 1, 1))
    y = np.zeros(4, np.float32)
    cc.setTensor(handle, d, y, 1.0)
    before = cc.plan_cache_info()
    cc.setTensor(handle, d, y, 2.0)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    assert np.all(y == 2.0)
