"""Dropout (002 §3.2.34, §4.1.7, §3.2.80, §3.2.73): masks against an independent scalar
Philox4x32-10 written here, Random123's published answers, determinism, keep-rate statistics,
forward/backward consistency, and every BAD_PARAM / INVALID_VALUE rule."""
import math

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

M32 = 0xFFFFFFFF


def philox_scalar(ctr, key):
    """Philox4x32-10 on Python ints (Salmon et al., SC'11; Random123)."""
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & M32, (k[1] + 0xBB67AE85) & M32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k[1]) & M32, p0 & M32]
    return c


def expected_mask(seed, offset, n, p):
    """Element i: word i%4 of block offset + i//4, kept when word >= ceil(p * 2^32)."""
    thr = math.ceil(float(np.float32(p)) * 2.0 ** 32)
    out = np.zeros(n, np.uint8)
    for i in range(n):
        blk = offset + i // 4
        w = philox_scalar((blk & M32, blk >> 32, 0, 0), (seed & M32, seed >> 32))[i % 4]
        out[i] = w >= thr
    return out


@pytest.fixture
def drop(handle):
    def make(p, seed=1234, states=True):
        d = cc.cudnnCreateDropoutDescriptor()
        size = cc.cudnnDropoutGetStatesSize(handle)
        st = np.zeros(size, np.uint8) if states else None
        cc.cudnnSetDropoutDescriptor(d, handle, p, st, size if states else 0, seed)
        return d, st
    return make


def test_philox_known_answers():
    """Random123 kat_vectors for philox4x32_10, checked on the engine's vectorized generator."""
    from cudnn_compat._backend.engines.reference.rnn import philox4x32_10
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in cases:
        assert tuple(int(v) for v in philox4x32_10(np.array([ctr], np.uint64), key)[0]) == want
        assert tuple(philox_scalar(ctr, key)) == want


@pytest.mark.parametrize("seed", [0, 7, 2 ** 40 + 12345])
def test_forward_mask_is_philox_of_seed_and_offset(handle, drop, rng, seed):
    p = 0.35
    d, st = drop(p, seed)
    shape = (2, 3, 4, 5)
    xd = tdesc(shape)
    n = math.prod(shape)
    x = (rng.standard_normal(n) + 3).astype(np.float32)
    y = np.zeros(n, np.float32)
    rs = np.full(cc.cudnnDropoutGetReserveSpaceSize(xd), 77, np.uint8)
    assert rs.size >= n
    cc.cudnnDropoutForward(handle, d, xd, x, xd, y, rs, rs.size)
    mask = expected_mask(seed, 0, n, p)
    np.testing.assert_array_equal(rs[:n], mask)
    np.testing.assert_allclose(y, x * mask / (1 - np.float32(p)), rtol=1e-6)
    # the states now hold the advanced offset: the next call uses the next blocks
    words = st[:16].view(np.int32)
    assert (int(words[0]) & M32) | ((int(words[1]) & M32) << 32) == seed
    assert int(words[2]) == math.ceil(n / 4) and int(words[3]) == 0
    cc.cudnnDropoutForward(handle, d, xd, x, xd, y, rs, rs.size)
    np.testing.assert_array_equal(rs[:n], expected_mask(seed, math.ceil(n / 4), n, p))


def test_same_seed_same_mask_and_restore(handle, drop, rng):
    xd = tdesc((1, 1, 8, 25))
    x = np.ones(200, np.float32)
    masks = []
    for _ in range(2):
        d, st = drop(0.5, seed=99)
        rs = np.zeros(cc.cudnnDropoutGetReserveSpaceSize(xd), np.uint8)
        cc.cudnnDropoutForward(handle, d, xd, x, xd, np.zeros(200, np.float32), rs, rs.size)
        masks.append(rs[:200].copy())
    np.testing.assert_array_equal(masks[0], masks[1])
    # a saved copy of the states restores the sequence exactly; the seed argument is ignored
    saved = st.copy()
    rs1 = np.zeros_like(rs)
    cc.cudnnDropoutForward(handle, d, xd, x, xd, np.zeros(200, np.float32), rs1, rs1.size)
    d2 = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnRestoreDropoutDescriptor(d2, handle, 0.5, saved, saved.size, 12345)
    rs2 = np.zeros_like(rs)
    cc.cudnnDropoutForward(handle, d2, xd, x, xd, np.zeros(200, np.float32), rs2, rs2.size)
    np.testing.assert_array_equal(rs1, rs2)
    assert not np.array_equal(rs1[:200], masks[0])
    assert cc.cudnnGetDropoutDescriptor(d2, handle)[0] == np.float32(0.5)


def test_keep_rate_statistics(handle, drop):
    p, n = 0.3, 200_000
    d, _ = drop(p, seed=2024)
    xd = tdesc((1, 1, 1, n))
    rs = np.zeros(cc.cudnnDropoutGetReserveSpaceSize(xd), np.uint8)
    cc.cudnnDropoutForward(handle, d, xd, np.ones(n, np.float32), xd, np.zeros(n, np.float32), rs, rs.size)
    keep = rs[:n].mean()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(keep - (1 - p)) < 5 * sigma
    # neighbouring elements are not correlated (lag-1 and lag-4, i.e. across Philox lanes and blocks)
    m = rs[:n].astype(np.float64) - keep
    for lag in (1, 4):
        assert abs((m[:-lag] * m[lag:]).mean()) / m.var() < 0.02


def test_backward_uses_the_forward_mask(handle, drop, rng):
    p = 0.4
    d, _ = drop(p, seed=5)
    shape = (3, 2, 3, 3)
    xd = tdesc(shape)
    n = math.prod(shape)
    x = rng.uniform(1, 2, n).astype(np.float64)
    xd = tdesc(shape, cc.CUDNN_DATA_DOUBLE)
    y = np.zeros(n)
    rs = np.zeros(cc.cudnnDropoutGetReserveSpaceSize(xd), np.uint8)
    cc.cudnnDropoutForward(handle, d, xd, x, xd, y, rs, rs.size)
    dy = rng.standard_normal(n)
    dx = np.full(n, np.nan)
    cc.cudnnDropoutBackward(handle, d, xd, dy, xd, dx, rs, rs.size)
    kept = y != 0
    scale = np.float32(1) / (np.float32(1) - np.float32(p))  # cuDNN's float arithmetic
    np.testing.assert_allclose(dx, np.where(kept, dy * np.float64(scale), 0.0), rtol=1e-15)
    np.testing.assert_allclose(y, np.where(kept, x * np.float64(scale), 0.0), rtol=1e-15)
    # adjoint identity: <dropout(x), dy> == <x, dropout_bwd(dy)> with the same mask
    assert np.isclose(y @ dy, x @ dx, rtol=1e-12)


def test_strided_layouts_use_logical_order(handle, drop, rng):
    shape = (2, 3, 2, 2)
    d, _ = drop(0.5, seed=11)
    x = rng.uniform(1, 2, shape).astype(np.float32)
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = np.zeros(shape, np.float32)
    xd = tdesc(shape, fmt=cc.CUDNN_TENSOR_NHWC)
    yd = tdesc(shape)
    rs = np.zeros(cc.cudnnDropoutGetReserveSpaceSize(xd), np.uint8)
    cc.cudnnDropoutForward(handle, d, xd, x_nhwc, yd, y, rs, rs.size)
    mask = expected_mask(11, 0, x.size, 0.5).reshape(shape)
    np.testing.assert_allclose(y, x * mask * 2, rtol=1e-6)


def test_half_in_place_and_extreme_probabilities(handle, drop, rng):
    xd = tdesc((1, 2, 4, 4), cc.CUDNN_DATA_HALF)
    x = rng.uniform(1, 2, 32).astype(np.float16)
    x0 = x.copy()
    d, _ = drop(0.25, seed=3)
    rs = np.zeros(cc.cudnnDropoutGetReserveSpaceSize(xd), np.uint8)
    cc.cudnnDropoutForward(handle, d, xd, x, xd, x, rs, rs.size)  # in place, same strides: allowed
    mask = expected_mask(3, 0, 32, 0.25)
    np.testing.assert_allclose(x, (x0.astype(np.float64) * mask / 0.75).astype(np.float16), rtol=1e-3)
    for p, want in ((0.0, x0.astype(np.float32)), (1.0, np.zeros(32, np.float32))):
        dp, _ = drop(p, seed=3)
        xs = x0.astype(np.float32)
        ys = np.full(32, 9.0, np.float32)
        fd = tdesc((1, 2, 4, 4))
        cc.cudnnDropoutForward(handle, dp, fd, xs, fd, ys, rs, rs.size)
        np.testing.assert_array_equal(ys, want)


def test_descriptor_queries(handle, drop):
    d, st = drop(0.125, seed=2 ** 63 + 5)
    p, states, seed = cc.cudnnGetDropoutDescriptor(d, handle)
    assert p == 0.125 and states is st and seed == 2 ** 63 + 5
    assert cc.cudnnDropoutGetStatesSize(handle) >= 16
    assert cc.getDropoutReserveSpaceSize(tdesc((2, 3, 4, 5))) >= 120
    cc.cudnnDestroyDropoutDescriptor(d)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetDropoutDescriptor(d, handle)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM


def test_repeated_forward_is_a_cache_hit(handle, drop):
    d, _ = drop(0.5)
    xd = tdesc((1, 1, 2, 8))
    rs = np.zeros(cc.cudnnDropoutGetReserveSpaceSize(xd), np.uint8)
    x, y = np.ones(16, np.float32), np.zeros(16, np.float32)
    cc.cudnnDropoutForward(handle, d, xd, x, xd, y, rs, rs.size)
    before = cc.plan_cache_info()
    cc.cudnnDropoutForward(handle, d, xd, x, xd, y, rs, rs.size)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses


def test_errors_write_nothing(handle, drop):
    d, st = drop(0.5)
    xd, yd = tdesc((2, 3, 2, 2)), tdesc((2, 3, 2, 2))
    x = np.ones(24, np.float32)
    y = np.full(24, 5.0, np.float32)
    rs = np.full(cc.cudnnDropoutGetReserveSpaceSize(xd), 7, np.uint8)
    st0 = st.copy()

    def expect(status, fn):
        with pytest.raises(cc.CuDNNError) as e:
            fn()
        assert e.value.status == status, e.value
        assert np.all(y == 5.0) and np.all(rs == 7) and np.array_equal(st, st0)
        return e.value
    bad = cc.CUDNN_STATUS_BAD_PARAM
    # element counts differ
    expect(bad, lambda: cc.cudnnDropoutForward(handle, d, xd, x, tdesc((2, 3, 2, 1)), y, rs, rs.size))
    # data types differ
    expect(bad, lambda: cc.cudnnDropoutForward(handle, d, xd, x, tdesc((2, 3, 2, 2), cc.CUDNN_DATA_DOUBLE), y, rs, rs.size))
    # in place with different strides
    e = expect(bad, lambda: cc.cudnnDropoutForward(handle, d, xd, y, tdesc((2, 3, 2, 2), fmt=cc.CUDNN_TENSOR_NHWC), y,
                                                   rs, rs.size))
    assert "in place" in str(e)
    # reserve space too small
    expect(bad, lambda: cc.cudnnDropoutForward(handle, d, xd, x, yd, y, rs, 23))
    expect(bad, lambda: cc.cudnnDropoutBackward(handle, d, xd, x, yd, y, rs, 23))
    # states never initialised (set with states NULL)
    d2, _ = drop(0.5, states=False)
    expect(bad, lambda: cc.cudnnDropoutForward(handle, d2, xd, x, yd, y, rs, rs.size))
    expect(bad, lambda: cc.cudnnDropoutBackward(handle, d2, xd, x, yd, y, rs, rs.size))
    # NULL descriptors and buffers
    expect(bad, lambda: cc.cudnnDropoutForward(handle, None, xd, x, yd, y, rs, rs.size))
    expect(bad, lambda: cc.cudnnDropoutForward(handle, d, xd, x, yd, None, rs, rs.size))
    # states buffer too small: INVALID_VALUE; probability outside [0, 1]: BAD_PARAM
    d3 = cc.cudnnCreateDropoutDescriptor()
    expect(cc.CUDNN_STATUS_INVALID_VALUE, lambda: cc.cudnnSetDropoutDescriptor(d3, handle, 0.5, st, 8, 1))
    expect(cc.CUDNN_STATUS_INVALID_VALUE, lambda: cc.cudnnRestoreDropoutDescriptor(d3, handle, 0.5, st, 8, 1))
    expect(bad, lambda: cc.cudnnSetDropoutDescriptor(d3, handle, 1.5, st, st.size, 1))
    expect(bad, lambda: cc.cudnnSetDropoutDescriptor(d3, handle, float("nan"), st, st.size, 1))


def test_null_states_change_only_the_probability(handle, drop):
    """002 §3.2.80: with states NULL only the dropout value is set; the seeded states stay attached."""
    xd = tdesc((1, 1, 1, 64))
    d, st = drop(0.5, seed=7)
    cc.cudnnSetDropoutDescriptor(d, handle, 0.25, None, 0, 0)
    p, states, seed = cc.cudnnGetDropoutDescriptor(d, handle)
    assert p == np.float32(0.25) and states is st and seed == 7
    rs = np.zeros(cc.cudnnDropoutGetReserveSpaceSize(xd), np.uint8)
    cc.cudnnDropoutForward(handle, d, xd, np.ones(64, np.float32), xd, np.zeros(64, np.float32), rs, rs.size)
    np.testing.assert_array_equal(rs[:64], expected_mask(7, 0, 64, 0.25))
