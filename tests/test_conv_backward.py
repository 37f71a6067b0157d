"""cudnnConvolutionBackwardData (002 §5.2.8), cudnnConvolutionBackwardFilter (§6.2.2) and
cudnnConvolutionBackwardBias (§6.2.1): adjoint identities <conv(x,w), dy> = <x, bwdData(w,dy)>
= <w, bwdFilter(x,dy)> in float64, direct-loop formulas written in the test, blending."""
import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc
from conv_util import (BF16, CONV, CROSS, DOUBLE, FLOAT, HALF, NCHW, NHWC, STORAGE, bf16_bits, bf16_values, cdesc,
                       desc_for, fdesc, layout_strides, out_shape, ref_bwd_data, ref_bwd_filter, round_bf16, strided)
from test_conv_forward import CASES, forward

DATA_ALGO_0, DATA_ALGO_1 = cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_1
FILTER_ALGO_0, FILTER_ALGO_1 = cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1


def backward_data(handle, dy, w, case, mode=CROSS, dx_layout="NCHW", dy_layout="NCHW", wfmt=NCHW, dtype=DOUBLE,
                  compute=DOUBLE, algo=DATA_ALGO_0, alpha=1.0, beta=0.0, dx0=None, enc=lambda a: a, dec=lambda a: a):
    xs, ws, pad, stride, dil, groups = case
    ys, st = dy.shape, STORAGE[dtype]
    dybuf, _ = strided(enc(dy), layout_strides(ys, dy_layout), st)
    wbuf, _ = strided(enc(w), layout_strides(ws, "NHWC" if wfmt == NHWC else "NCHW"), st)
    dxbuf, dxview = strided(enc(np.zeros(xs) if dx0 is None else dx0), layout_strides(xs, dx_layout), st)
    cc.cudnnConvolutionBackwardData(handle, alpha, fdesc(ws, dtype, wfmt), wbuf, desc_for(ys, dtype, dy_layout), dybuf,
                                    cdesc(pad, stride, dil, mode, compute, groups), algo, None, 0, beta,
                                    desc_for(xs, dtype, dx_layout), dxbuf)
    return dec(dxview.copy())


def backward_filter(handle, x, dy, case, mode=CROSS, x_layout="NCHW", dy_layout="NCHW", wfmt=NCHW, dtype=DOUBLE,
                    compute=DOUBLE, algo=FILTER_ALGO_0, alpha=1.0, beta=0.0, dw0=None, enc=lambda a: a,
                    dec=lambda a: a):
    xs, ws, pad, stride, dil, groups = case
    ys, st = dy.shape, STORAGE[dtype]
    xbuf, _ = strided(enc(x), layout_strides(xs, x_layout), st)
    dybuf, _ = strided(enc(dy), layout_strides(ys, dy_layout), st)
    dwbuf, dwview = strided(enc(np.zeros(ws) if dw0 is None else dw0),
                            layout_strides(ws, "NHWC" if wfmt == NHWC else "NCHW"), st)
    cc.cudnnConvolutionBackwardFilter(handle, alpha, desc_for(xs, dtype, x_layout), xbuf, desc_for(ys, dtype, dy_layout),
                                      dybuf, cdesc(pad, stride, dil, mode, compute, groups), algo, None, 0, beta,
                                      fdesc(ws, dtype, wfmt), dwbuf)
    return dec(dwview.copy())


# 002's ALGO_0 tables: backward data wants dy NCHW CHW-packed (dx any), backward filter wants x
# NCHW CHW-packed (dy any); the other tensor takes ``layout``.
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "padded"])
@pytest.mark.parametrize("mode", [CROSS, CONV])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_adjoint_identities(handle, rng, case, mode, layout):
    xs, ws = case[:2]
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    dy = rng.standard_normal(out_shape(xs, ws, *case[2:5]))
    y = forward(handle, x, w, case, mode, "NCHW", DOUBLE, DOUBLE)
    dx = backward_data(handle, dy, w, case, mode, dx_layout=layout)
    dw = backward_filter(handle, x, dy, case, mode, dy_layout=layout)
    lhs = np.vdot(y, dy)
    assert np.isclose(np.vdot(x, dx), lhs, rtol=1e-12, atol=1e-12)
    assert np.isclose(np.vdot(w, dw), lhs, rtol=1e-12, atol=1e-12)
    # and the direct-loop formulas
    np.testing.assert_allclose(dx, ref_bwd_data(dy, w, xs, *case[2:], mode=mode), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, ref_bwd_filter(x, dy, ws, *case[2:], mode=mode), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[4]], ids=["2d", "2d-groups", "3d"])
def test_nhwc_filters_float32(handle, rng, case):
    """KRSC filters with NHWC HWC-packed tensors (002 tables 12/15/36/39: ALGO_1 in 2-d and 3-d)."""
    xs, ws = case[:2]
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    dy = rng.standard_normal(out_shape(xs, ws, *case[2:5]))
    kw = dict(wfmt=NHWC, dtype=FLOAT, compute=FLOAT)
    dx = backward_data(handle, dy, w, case, dx_layout="NHWC", dy_layout="NHWC", algo=DATA_ALGO_1, **kw)
    dw = backward_filter(handle, x, dy, case, x_layout="NHWC", dy_layout="NHWC", algo=FILTER_ALGO_1, **kw)
    np.testing.assert_allclose(dx, ref_bwd_data(dy, w, xs, *case[2:]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, ref_bwd_filter(x, dy, ws, *case[2:]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype, tol", [(HALF, 3e-3), (BF16, 2e-2)])
def test_reduced_precisions(handle, rng, dtype, tol):
    case = CASES[0]
    xs, ws = case[:2]
    ys = out_shape(xs, ws, *case[2:5])
    if dtype == BF16:
        x, w, dy = (round_bf16(rng.standard_normal(s)) for s in (xs, ws, ys))
        enc, dec = bf16_bits, bf16_values
    else:
        x, w, dy = (rng.standard_normal(s).astype(np.float16).astype(np.float64) for s in (xs, ws, ys))
        enc, dec = (lambda a: a), (lambda a: a.astype(np.float64))
    kw = dict(dtype=dtype, compute=FLOAT, enc=enc, dec=dec)
    dx = backward_data(handle, dy, w, case, **kw)
    dw = backward_filter(handle, x, dy, case, **kw)
    for got, want in ((dx, ref_bwd_data(dy, w, xs, *case[2:])), (dw, ref_bwd_filter(x, dy, ws, *case[2:]))):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, -1.5)])
def test_backward_blending_and_beta_zero(handle, rng, alpha, beta):
    case = CASES[1]
    xs, ws = case[:2]
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    dy = rng.standard_normal(out_shape(xs, ws, *case[2:5]))
    dx0 = np.full(xs, np.nan) if beta == 0 else rng.standard_normal(xs)
    dw0 = np.full(ws, np.nan) if beta == 0 else rng.standard_normal(ws)
    dx = backward_data(handle, dy, w, case, alpha=alpha, beta=beta, dx0=dx0)
    dw = backward_filter(handle, x, dy, case, alpha=alpha, beta=beta, dw0=dw0)
    keep_dx, keep_dw = (0.0, 0.0) if beta == 0 else (beta * dx0, beta * dw0)
    np.testing.assert_allclose(dx, alpha * ref_bwd_data(dy, w, xs, *case[2:]) + keep_dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, alpha * ref_bwd_filter(x, dy, ws, *case[2:]) + keep_dw, rtol=1e-12, atol=1e-12)


# -- BackwardBias ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, layout", [((2, 3, 4, 5), "NCHW"), ((2, 3, 4, 5), "NHWC"), ((2, 4, 2, 3, 3), "NCHW")])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_backward_bias(handle, rng, shape, layout, beta):
    dy = rng.standard_normal(shape)
    dybuf, _ = strided(dy, layout_strides(shape, layout), np.float32)
    bshape = (1, shape[1]) + (1,) * (len(shape) - 2)
    db0 = rng.standard_normal(bshape) if beta else np.full(bshape, np.nan)
    db = db0.astype(np.float32).reshape(-1).copy()
    cc.cudnnConvolutionBackwardBias(handle, 2.0, desc_for(shape, FLOAT, layout), dybuf, beta, tdesc(bshape), db)
    want = np.zeros(shape[1])
    for idx in np.ndindex(*shape):  # the sum over n and every spatial position, per channel
        want[idx[1]] += dy[idx]
    want = 2.0 * want + (beta * db0.reshape(-1) if beta else 0.0)
    np.testing.assert_allclose(db, want, rtol=1e-5, atol=1e-5)


def test_backward_bias_errors_write_nothing(handle):
    dy = np.ones(2 * 3 * 4 * 4, np.float32)
    db = np.full(6, 7.0, np.float32)
    dyd = tdesc((2, 3, 4, 4))
    for bad, why in [(tdesc((2, 3, 1, 1)), "n must be 1"), (tdesc((1, 3, 2, 1)), "spatial dims 1"),
                     (tdesc((1, 2, 1, 1)), "C differs"), (tdesc((1, 3, 1, 1), DOUBLE), "data type differs")]:
        with pytest.raises(cc.CuDNNError) as e:
            cc.cudnnConvolutionBackwardBias(handle, 1.0, dyd, dy, 0.0, bad, db)
        assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM, why
        assert "dbDesc" in str(e.value)
    assert np.all(db == 7.0)


# -- errors of the backward convolutions (002 §5.2.8 and §6.2.2 "Returns") ----------------------

def _bwd_data_call(handle, xs=(1, 4, 5, 5), ws=(4, 2, 3, 3), ys=None, groups=2, algo=DATA_ALGO_0, dtype=FLOAT,
                   compute=FLOAT, dx=None):
    ys = ys or out_shape(xs, ws, (1, 1), (1, 1), (1, 1))
    dx = np.full(int(np.prod(xs)), 3.0, np.float32) if dx is None else dx
    cc.cudnnConvolutionBackwardData(handle, 1.0, fdesc(ws, dtype), np.ones(int(np.prod(ws)), STORAGE[dtype]),
                                    tdesc(ys, dtype), np.ones(int(np.prod(ys)), STORAGE[dtype]),
                                    cdesc((1, 1), compute=compute, groups=groups), algo, None, 0, 0.0, tdesc(xs, dtype), dx)
    return dx


@pytest.mark.parametrize("kw, status, arg", [
    (dict(ws=(3, 2, 3, 3)), cc.CUDNN_STATUS_NOT_SUPPORTED, "wDesc"),  # K not a multiple of groupCount
    (dict(ws=(4, 3, 3, 3)), cc.CUDNN_STATUS_BAD_PARAM, "wDesc"),  # C per group disagrees
    (dict(ys=(1, 4, 4, 5)), cc.CUDNN_STATUS_BAD_PARAM, "dyDesc"),  # dy dims not the forward output's
    (dict(algo=cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD, ws=(4, 2, 5, 5)), cc.CUDNN_STATUS_NOT_SUPPORTED, "algo"),
    (dict(algo=6), cc.CUDNN_STATUS_BAD_PARAM, "algo"),  # the COUNT sentinel is no algorithm
    (dict(compute=cc.CUDNN_DATA_HALF), cc.CUDNN_STATUS_NOT_SUPPORTED, "convDesc"),  # float data, half compute
])
def test_backward_data_errors_write_nothing(handle, kw, status, arg):
    dx = np.full(100, 3.0, np.float32)
    with pytest.raises(cc.CuDNNError) as e:
        _bwd_data_call(handle, dx=dx, **kw)
    assert e.value.status == status and f": {arg}:" in str(e.value), str(e.value)
    assert np.all(dx == 3.0)


@pytest.mark.parametrize("xs, ys, dwfmt, status, arg", [
    ((1, 4, 5, 5), (1, 4, 5, 6), NCHW, cc.CUDNN_STATUS_BAD_PARAM, "dyDesc"),  # dy dims wrong
    ((1, 6, 5, 5), (1, 4, 5, 5), NCHW, cc.CUDNN_STATUS_BAD_PARAM, "dwDesc"),  # channels per group wrong
    ((1, 4, 5, 5), (1, 4, 5, 5), NHWC, cc.CUDNN_STATUS_NOT_SUPPORTED, "algo"),  # KRSC dw needs NHWC x for ALGO_0
    ((1, 4, 5), (1, 4, 5), NCHW, cc.CUDNN_STATUS_NOT_SUPPORTED, "xDesc"),  # 3-d tensors
])
def test_backward_filter_errors_write_nothing(handle, xs, ys, dwfmt, status, arg):
    nsp = len(xs) - 2
    ws = (4, 2) + (3,) * nsp
    dw = np.full(int(np.prod(ws)), 3.0, np.float32)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnConvolutionBackwardFilter(handle, 1.0, tdesc(xs), np.ones(int(np.prod(xs)), np.float32), tdesc(ys),
                                          np.ones(int(np.prod(ys)), np.float32), cdesc((1,) * nsp, groups=2),
                                          FILTER_ALGO_0, None, 0, 0.0, fdesc(ws, fmt=dwfmt), dw)
    assert e.value.status == status and f": {arg}:" in str(e.value), str(e.value)
    assert np.all(dw == 3.0)
