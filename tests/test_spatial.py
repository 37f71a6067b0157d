"""Spatial transformer against formulas written here (002 §3.2.97, §3.2.98, §4.1.20, §4.1.21):
the affine grid over normalized [-1, 1] coordinates, bilinear sampling with zero padding, the
backward calls against finite differences in float64 and adjoint identities; error rules."""
import math

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

F32, F64 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE


def st_desc(dims, dtype=F32):
    d = cc.cudnnCreateSpatialTransformerDescriptor()
    cc.cudnnSetSpatialTransformerNdDescriptor(d, cc.CUDNN_SAMPLER_BILINEAR, dtype, len(dims), list(dims))
    return d


def grid_formula(theta, h, w):
    """grid[n, i, j] = theta[n] @ [x_j, y_i, 1], x_j = -1 + 2 j / (W - 1), y_i = -1 + 2 i / (H - 1)."""
    n = theta.shape[0]
    g = np.zeros((n, h, w, 2))
    for b in range(n):
        for i in range(h):
            for j in range(w):
                x = -1.0 + 2.0 * j / (w - 1) if w > 1 else -1.0
                y = -1.0 + 2.0 * i / (h - 1) if h > 1 else -1.0
                g[b, i, j] = theta[b] @ np.array([x, y, 1.0])
    return g


def sample_formula(x, grid):
    """Bilinear sample of x [N, C, H, W] at grid [N, h, w, 2], pixels outside the image being 0."""
    n, c, hi, wi = x.shape
    _, ho, wo, _ = grid.shape
    y = np.zeros((n, c, ho, wo))
    for b in range(n):
        for i in range(ho):
            for j in range(wo):
                u = (grid[b, i, j, 0] + 1) * (wi - 1) / 2
                v = (grid[b, i, j, 1] + 1) * (hi - 1) / 2
                u0, v0 = math.floor(u), math.floor(v)
                for vv in (v0, v0 + 1):
                    for uu in (u0, u0 + 1):
                        if 0 <= vv < hi and 0 <= uu < wi:
                            y[b, :, i, j] += x[b, :, vv, uu] * (1 - abs(v - vv)) * (1 - abs(u - uu))
    return y


@pytest.mark.parametrize("dims", [(2, 3, 4, 5), (1, 1, 1, 3), (3, 2, 6, 1)])
def test_grid_generator_forward(handle, rng, dims):
    n, _, h, w = dims
    theta = rng.standard_normal((n, 2, 3)).astype(np.float32)
    grid = np.zeros((n, h, w, 2), np.float32)
    cc.cudnnSpatialTfGridGeneratorForward(handle, st_desc(dims), theta, grid)
    np.testing.assert_allclose(grid, grid_formula(theta.astype(np.float64), h, w), rtol=1e-6, atol=1e-6)


def test_identity_theta_samples_the_input(handle, rng):
    """theta = [[1, 0, 0], [0, 1, 0]] with the output size of x reproduces x: grid -1..1 hits pixel centres."""
    dims = (2, 3, 4, 5)
    x = rng.standard_normal(dims).astype(np.float32)
    theta = np.tile(np.array([[1, 0, 0], [0, 1, 0]], np.float32), (2, 1, 1))
    grid = np.zeros((2, 4, 5, 2), np.float32)
    st = st_desc(dims)
    cc.cudnnSpatialTfGridGeneratorForward(handle, st, theta, grid)
    y = np.zeros(dims, np.float32)
    cc.cudnnSpatialTfSamplerForward(handle, st, 1.0, tdesc(dims), x, grid, 0.0, tdesc(dims), y)
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_sampler_forward_matches_bilinear_formula(handle, rng, beta):
    xdims, ydims = (2, 3, 5, 6), (2, 3, 4, 3)
    x = rng.standard_normal(xdims).astype(np.float32)
    grid = rng.uniform(-1.4, 1.4, (2, 4, 3, 2)).astype(np.float32)  # some points fall outside the image
    grid[0, 0, 0] = [5.0, 5.0]  # far outside: 0
    y0 = rng.standard_normal(ydims).astype(np.float32)
    y = y0.copy() if beta else np.full(ydims, np.nan, np.float32)  # beta 0 never reads y
    cc.cudnnSpatialTfSamplerForward(handle, st_desc(ydims), 2.0, tdesc(xdims), x, grid, beta, tdesc(ydims), y)
    want = 2.0 * sample_formula(x.astype(np.float64), grid.astype(np.float64)) + beta * y0
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert y[0, 0, 0, 0] == pytest.approx(beta * y0[0, 0, 0, 0])


def test_sampler_nhwc_input_and_double(handle, rng):
    xdims, ydims = (1, 2, 3, 4), (1, 2, 3, 3)
    x = rng.standard_normal(xdims)
    grid = rng.uniform(-1, 1, (1, 3, 3, 2))
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = np.zeros(ydims)
    cc.cudnnSpatialTfSamplerForward(handle, st_desc(ydims, F64), 1.0, tdesc(xdims, F64, cc.CUDNN_TENSOR_NHWC), x_nhwc,
                                    grid, 0.0, tdesc(ydims, F64), y)
    np.testing.assert_allclose(y, sample_formula(x, grid), rtol=1e-12, atol=1e-12)


def _fd(fn, arr, eps=1e-6):
    g = np.zeros_like(arr)
    for idx in np.ndindex(*arr.shape):
        old = arr[idx]
        arr[idx] = old + eps
        up = fn()
        arr[idx] = old - eps
        down = fn()
        arr[idx] = old
        g[idx] = (up - down) / (2 * eps)
    return g


def test_sampler_backward_vs_finite_differences(handle, rng):
    xdims, ydims = (2, 2, 4, 5), (2, 2, 3, 3)
    st = st_desc(ydims, F64)
    x = rng.standard_normal(xdims)
    grid = rng.uniform(-1.2, 1.2, (2, 3, 3, 2))
    dy = rng.standard_normal(ydims)
    xd, yd = tdesc(xdims, F64), tdesc(ydims, F64)

    def loss():
        y = np.zeros(ydims)
        cc.cudnnSpatialTfSamplerForward(handle, st, 1.0, xd, x, grid, 0.0, yd, y)
        return float(np.sum(y * dy))

    dx = np.full(xdims, np.nan)
    dgrid = np.full(grid.shape, np.nan)
    cc.cudnnSpatialTfSamplerBackward(handle, st, 1.0, xd, x, 0.0, xd, dx, 1.0, yd, dy, grid, 0.0, dgrid)
    np.testing.assert_allclose(dx, _fd(loss, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dgrid, _fd(loss, grid), rtol=1e-6, atol=1e-8)
    # the blends: dx = alpha*dx_new + beta*dx, dgrid = alphaDgrid*dgrid_new + betaDgrid*dgrid
    dx2, dgrid2 = np.ones(xdims), np.ones(grid.shape)
    cc.cudnnSpatialTfSamplerBackward(handle, st, 2.0, xd, x, 0.5, xd, dx2, -1.0, yd, dy, grid, 3.0, dgrid2)
    np.testing.assert_allclose(dx2, 2.0 * dx + 0.5, rtol=1e-12)
    np.testing.assert_allclose(dgrid2, -dgrid + 3.0, rtol=1e-12)


def test_grid_generator_backward_is_the_adjoint(handle, rng):
    dims = (2, 1, 3, 4)
    st = st_desc(dims, F64)
    theta = rng.standard_normal((2, 2, 3))
    dgrid = rng.standard_normal((2, 3, 4, 2))
    grid = np.zeros((2, 3, 4, 2))
    cc.cudnnSpatialTfGridGeneratorForward(handle, st, theta, grid)
    dtheta = np.zeros((2, 2, 3))
    cc.cudnnSpatialTfGridGeneratorBackward(handle, st, dgrid, dtheta)
    assert np.sum(grid * dgrid) == pytest.approx(np.sum(theta * dtheta), rel=1e-12)
    base = np.array([[[-1 + 2 * j / 3, -1 + 2 * i / 2, 1.0] for j in range(4)] for i in range(3)])  # [H, W, 3]
    want = np.einsum("nhwi,hwk->nik", dgrid, base)
    np.testing.assert_allclose(dtheta, want, rtol=1e-12)


# -- errors ------------------------------------------------------------------------------------------

def test_set_descriptor_errors():
    d = cc.cudnnCreateSpatialTransformerDescriptor()
    for args in [(5, F32, 4, [1, 1, 2, 2]), (cc.CUDNN_SAMPLER_BILINEAR, 77, 4, [1, 1, 2, 2]),
                 (cc.CUDNN_SAMPLER_BILINEAR, F32, 4, None), (cc.CUDNN_SAMPLER_BILINEAR, F32, 4, [1, 0, 2, 2]),
                 (cc.CUDNN_SAMPLER_BILINEAR, F32, 0, [1])]:
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnSetSpatialTransformerNdDescriptor(d, *args)
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    assert cc.setSpatialTransformerDescriptor is cc.cudnnSetSpatialTransformerNdDescriptor
    assert cc.setSpatialTransformerNdDescriptor is cc.cudnnSetSpatialTransformerNdDescriptor
    cc.cudnnDestroySpatialTransformerDescriptor(d)


def test_compute_errors_write_nothing(handle, rng):
    st5 = st_desc((1, 1, 2, 2, 2))
    grid = np.full((1, 2, 2, 2), 4.0, np.float32)
    theta = np.zeros((1, 2, 3), np.float32)
    with pytest.raises(cc.CuDNNError) as e:  # only 2-d transforms
        cc.cudnnSpatialTfGridGeneratorForward(handle, st5, theta, grid)
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED
    st = st_desc((1, 1, 2, 2))
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSpatialTfGridGeneratorForward(handle, st, None, grid)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "theta" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSpatialTfGridGeneratorBackward(handle, st, grid, 0)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "dtheta" in str(e.value)
    assert np.all(grid == 4.0)
    x = np.ones((1, 1, 3, 3), np.float32)
    y = np.full((1, 1, 2, 2), 4.0, np.float32)
    with pytest.raises(cc.CuDNNError) as e:  # y dims differ from stDesc's
        cc.cudnnSpatialTfSamplerForward(handle, st, 1, tdesc((1, 1, 3, 3)), x, grid, 0, tdesc((1, 1, 2, 3)), y)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "yDesc" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # x channels differ from stDesc's
        cc.cudnnSpatialTfSamplerForward(handle, st, 1, tdesc((1, 2, 3, 3)), np.ones(18, np.float32), grid, 0,
                                        tdesc((1, 1, 2, 2)), y)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "xDesc" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSpatialTfSamplerForward(handle, st, 1, tdesc((1, 1, 3, 3)), x, None, 0, tdesc((1, 1, 2, 2)), y)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "grid" in str(e.value)
    assert np.all(y == 4.0)
    dx, dgrid = np.full(x.shape, 4.0, np.float32), np.full(grid.shape, 4.0, np.float32)
    with pytest.raises(cc.CuDNNError) as e:  # dy dims differ from stDesc's (002 §4.1.21)
        cc.cudnnSpatialTfSamplerBackward(handle, st, 1, tdesc((1, 1, 3, 3)), x, 0, tdesc((1, 1, 3, 3)), dx, 1,
                                         tdesc((1, 1, 3, 2)), np.ones(6, np.float32), grid, 0, dgrid)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "dyDesc" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSpatialTfSamplerBackward(handle, st, 1, tdesc((1, 1, 3, 3)), x, 0, tdesc((1, 1, 3, 3)), dx, 1,
                                         tdesc((1, 1, 2, 2)), np.ones(4, np.float32), grid, 0, None)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "dgrid" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # a 5-d descriptor in the sampler
        cc.cudnnSpatialTfSamplerBackward(handle, st5, 1, tdesc((1, 1, 3, 3)), x, 0, tdesc((1, 1, 3, 3)), dx, 1,
                                         tdesc((1, 1, 2, 2)), np.ones(4, np.float32), grid, 0, dgrid)
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED
    assert np.all(dx == 4.0) and np.all(dgrid == 4.0)


@pytest.mark.gpu
def test_gpu_place_matches_formulas(rng):
    import cupy
    gpu = cc.cudnnCreate("gpu")
    xdims, ydims = (2, 3, 5, 6), (2, 3, 4, 3)
    st = st_desc(ydims)
    theta = rng.standard_normal((2, 2, 3)).astype(np.float32) * 0.8
    x = rng.standard_normal(xdims).astype(np.float32)
    dy = rng.standard_normal(ydims).astype(np.float32)
    grid, y = cupy.zeros((2, 4, 3, 2), cupy.float32), cupy.zeros(ydims, cupy.float32)
    cc.cudnnSpatialTfGridGeneratorForward(gpu, st, cupy.asarray(theta), grid)
    np.testing.assert_allclose(grid.get(), grid_formula(theta.astype(np.float64), 4, 3), rtol=1e-5, atol=1e-6)
    cc.cudnnSpatialTfSamplerForward(gpu, st, 1.0, tdesc(xdims), cupy.asarray(x), grid, 0.0, tdesc(ydims), y)
    np.testing.assert_allclose(y.get(), sample_formula(x.astype(np.float64), grid.get().astype(np.float64)),
                               rtol=1e-4, atol=1e-5)
    dx, dgrid, dtheta = cupy.zeros(xdims, cupy.float32), cupy.zeros_like(grid), cupy.zeros((2, 2, 3), cupy.float32)
    cc.cudnnSpatialTfSamplerBackward(gpu, st, 1.0, tdesc(xdims), cupy.asarray(x), 0.0, tdesc(xdims), dx, 1.0,
                                     tdesc(ydims), cupy.asarray(dy), grid, 0.0, dgrid)
    cc.cudnnSpatialTfGridGeneratorBackward(gpu, st, dgrid, dtheta)
    h = cc.cudnnCreate("cpu")
    want_dx, want_dg, want_dt = np.zeros(xdims, np.float32), np.zeros((2, 4, 3, 2), np.float32), np.zeros((2, 2, 3), np.float32)
    cc.cudnnSpatialTfSamplerBackward(h, st, 1.0, tdesc(xdims), x, 0.0, tdesc(xdims), want_dx, 1.0, tdesc(ydims), dy,
                                     grid.get(), 0.0, want_dg)
    cc.cudnnSpatialTfGridGeneratorBackward(h, st, want_dg, want_dt)
    for got, want in ((dx, want_dx), (dgrid, want_dg), (dtheta, want_dt)):
        np.testing.assert_allclose(got.get(), want, rtol=1e-4, atol=1e-5)
    cc.cudnnDestroy(h)
    cc.cudnnDestroy(gpu)
