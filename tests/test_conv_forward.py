"""cudnnConvolutionForward against a direct-loop convolution written in the test (002 §5.2.10):
padding, stride, dilation, groups, both modes, NCHW/NHWC/strided tensors, KCRS/KRSC filters,
2-d and 3-d, float/double/half/bfloat16/int8 configurations, alpha/beta blending."""
import ctypes

import numpy as np
import pytest

import cudnn_compat as cc
from conv_util import (BF16, CONV, CROSS, DOUBLE, FLOAT, HALF, INT8, INT32, NCHW, NHWC, STORAGE, UINT8, bf16_bits,
                       bf16_values, cdesc, desc_for, fdesc, layout_strides, out_shape, ref_conv, round_bf16, strided)

IMPLICIT_GEMM = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
PRECOMP = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM

# (x shape, w shape, pad, stride, dilation, groups)
CASES = [
    ((2, 3, 5, 6), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((1, 4, 7, 7), (6, 2, 3, 2), (0, 2), (2, 1), (1, 1), 2),
    ((2, 2, 8, 7), (3, 2, 3, 3), (2, 1), (1, 2), (2, 3), 1),
    ((1, 6, 6, 5), (6, 1, 2, 2), (1, 0), (3, 2), (1, 1), 6),
    ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), (1, 0, 1), (1, 2, 1), (1, 1, 2), 1),
    ((2, 4, 3, 4, 5), (2, 2, 3, 1, 2), (0, 1, 1), (2, 1, 1), (1, 1, 1), 2),
]


def forward(handle, x, w, case, mode=CROSS, layout="NCHW", dtype=FLOAT, compute=FLOAT, algo=None,
            alpha=1.0, beta=0.0, y0=None, encode=lambda a: a, decode=lambda a: a):
    """Run the library on logical arrays; returns the logical y it wrote (decoded to float64)."""
    xs, ws, pad, stride, dil, groups = case
    ys = out_shape(xs, ws, pad, stride, dil)
    storage = STORAGE[dtype]
    wfmt = NHWC if layout == "NHWC" else NCHW
    if algo is None:  # an algo that 002's tables give for this layout
        algo = PRECOMP if (len(xs) == 5 and layout == "NHWC") else IMPLICIT_GEMM
    xd, yd, wd = desc_for(xs, dtype, layout), desc_for(ys, dtype, layout), fdesc(ws, dtype, wfmt)
    xbuf, _ = strided(encode(x), layout_strides(xs, layout), storage)
    wbuf, _ = strided(encode(w), layout_strides(ws, "NHWC" if wfmt == NHWC else "NCHW"), storage)
    ybuf, yview = strided(encode(np.zeros(ys) if y0 is None else y0), layout_strides(ys, layout), storage)
    cd = cdesc(pad, stride, dil, mode, compute, groups)
    cc.cudnnConvolutionForward(handle, alpha, xd, xbuf, wd, wbuf, cd, algo, None, 0, beta, yd, ybuf)
    return decode(yview.copy())


@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "padded"])
@pytest.mark.parametrize("mode", [CROSS, CONV])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_forward_matches_direct_loops(handle, rng, case, mode, layout):
    x = rng.standard_normal(case[0])
    w = rng.standard_normal(case[1])
    # 002's only 3-d algo for NHWC filters (IMPLICIT_PRECOMP_GEMM) has no DOUBLE config
    dtype, tol = (FLOAT, 1e-5) if len(case[0]) == 5 and layout == "NHWC" else (DOUBLE, 1e-12)
    got = forward(handle, x, w, case, mode, layout, dtype, dtype)
    np.testing.assert_allclose(got, ref_conv(x, w, *case[2:], mode=mode), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, compute, tol", [
    (FLOAT, FLOAT, 1e-5),
    (HALF, FLOAT, 2e-3),  # PSEUDO_HALF: inputs and output are half, the sum is float
    (HALF, HALF, 5e-3),  # TRUE_HALF
    (BF16, FLOAT, 1e-2),  # PSEUDO_BFLOAT16
])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_forward_reduced_precisions(handle, rng, dtype, compute, tol, layout):
    case = CASES[0] if layout == "NCHW" else CASES[1]
    if dtype == BF16:
        x, w = round_bf16(rng.standard_normal(case[0])), round_bf16(rng.standard_normal(case[1]))
        enc, dec = bf16_bits, bf16_values
    else:
        x = rng.standard_normal(case[0]).astype(STORAGE[dtype]).astype(np.float64)
        w = rng.standard_normal(case[1]).astype(STORAGE[dtype]).astype(np.float64)
        enc, dec = (lambda a: a), (lambda a: a.astype(np.float64))
    got = forward(handle, x, w, case, CROSS, layout, dtype, compute, encode=enc, decode=dec)
    want = ref_conv(x, w, *case[2:])
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, -1.5), (-2.0, 1.0)])
def test_forward_blending(handle, rng, alpha, beta):
    case = CASES[2]
    x, w = rng.standard_normal(case[0]), rng.standard_normal(case[1])
    y0 = rng.standard_normal(out_shape(*case[:2], *case[2:5]))
    got = forward(handle, x, w, case, dtype=DOUBLE, compute=DOUBLE, alpha=alpha, beta=beta, y0=y0)
    np.testing.assert_allclose(got, alpha * ref_conv(x, w, *case[2:]) + beta * y0, rtol=1e-12, atol=1e-12)


def test_forward_beta_zero_never_reads_y(handle, rng):
    case = CASES[0]
    x, w = rng.standard_normal(case[0]), rng.standard_normal(case[1])
    y0 = np.full(out_shape(*case[:2], *case[2:5]), np.nan)
    got = forward(handle, x, w, case, alpha=2.0, beta=0.0, y0=y0)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, 2.0 * ref_conv(x, w, *case[2:]), rtol=1e-5, atol=1e-5)


def test_forward_scalars_as_host_pointers(handle, rng):
    case = CASES[0]
    x, w = rng.standard_normal(case[0]), rng.standard_normal(case[1])
    y0 = rng.standard_normal(out_shape(*case[:2], *case[2:5]))
    a, b = np.array(0.25, np.float64), np.array(2.0, np.float64)  # DOUBLE data: alpha/beta are double*
    got = forward(handle, x, w, case, dtype=DOUBLE, compute=DOUBLE, alpha=ctypes.c_void_p(a.ctypes.data),
                  beta=ctypes.c_void_p(b.ctypes.data), y0=y0)
    np.testing.assert_allclose(got, 0.25 * ref_conv(x, w, *case[2:]) + 2.0 * y0, rtol=1e-12)


@pytest.mark.parametrize("xtype, ytype", [(INT8, INT8), (INT8, FLOAT), (UINT8, INT8), (UINT8, FLOAT)])
def test_forward_int8_configs(handle, rng, xtype, ytype):
    """INT8/UINT8 x, INT8 w, INT32 compute, y INT8 (rounded, saturated) or FLOAT; NHWC packed."""
    xs, ws, pad = (1, 4, 5, 5), (8, 4, 3, 3), (1, 1)
    lo = 0 if xtype == UINT8 else -20
    x = rng.integers(lo, 20, xs).astype(np.float64)
    w = rng.integers(-5, 5, ws).astype(np.float64)
    ys = out_shape(xs, ws, pad, (1, 1), (1, 1))
    xbuf, _ = strided(x, layout_strides(xs, "NHWC"), STORAGE[xtype])
    wbuf, _ = strided(w, layout_strides(ws, "NHWC"), np.int8)
    ybuf, yview = strided(np.zeros(ys), layout_strides(ys, "NHWC"), STORAGE[ytype])
    cd = cdesc(pad, compute=INT32)
    cc.cudnnConvolutionForward(handle, 1 / 3, desc_for(xs, xtype, "NHWC"), xbuf, fdesc(ws, INT8, NHWC), wbuf, cd,
                               IMPLICIT_GEMM, None, 0, 0.0, desc_for(ys, ytype, "NHWC"), ybuf)
    want = ref_conv(x, w, pad, (1, 1), (1, 1)) / 3  # a third: never a tie for rounding
    if ytype == INT8:
        assert (np.abs(want) > 128).any()  # saturation is exercised
        want = np.clip(np.rint(want), -128, 127)
    np.testing.assert_allclose(yview.astype(np.float64), want, rtol=1e-6, atol=1e-6)


def test_int8_needs_nhwc_and_multiples_of_4(handle):
    xs, ws = (1, 4, 5, 5), (6, 4, 3, 3)  # K=6 is not a multiple of 4: only the _EXT (float y) config allows it
    x, w, y = np.ones(100, np.int8), np.ones(216, np.int8), np.zeros(150, np.int8)
    ys = out_shape(xs, ws, (1, 1), (1, 1), (1, 1))
    args = (desc_for(xs, INT8, "NHWC"), x, fdesc(ws, INT8, NHWC), w, cdesc((1, 1), compute=INT32), IMPLICIT_GEMM,
            None, 0, 0.0, desc_for(ys, INT8, "NHWC"), y)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnConvolutionForward(handle, 1.0, *args)
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED and "multiples of 4" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # NCHW int8 tensors: not in 002's tables
        cc.cudnnConvolutionForward(handle, 1.0, desc_for(xs, INT8, "NCHW"), x, fdesc((8, 4, 3, 3), INT8, NCHW),
                                   np.ones(288, np.int8), cdesc((1, 1), compute=INT32), IMPLICIT_GEMM, None, 0, 0.0,
                                   desc_for((1, 8, 5, 5), INT8, "NCHW"), np.zeros(200, np.int8))
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED
    assert not y.any()


def test_repeated_forward_is_a_cache_hit_and_algo_is_in_the_key(handle, rng):
    case = CASES[0]
    x, w = rng.standard_normal(case[0]), rng.standard_normal(case[1])
    forward(handle, x, w, case, algo=IMPLICIT_GEMM)
    before = cc.plan_cache_info()
    got = forward(handle, x, w, case, algo=IMPLICIT_GEMM)
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    np.testing.assert_allclose(got, ref_conv(x, w, *case[2:]), rtol=1e-5, atol=1e-5)
    forward(handle, x, w, case, algo=cc.CUDNN_CONVOLUTION_FWD_ALGO_GEMM)  # another algo: another plan
    assert cc.plan_cache_info().misses == after.misses + 1


def test_conv_op_attrs_record_the_call(handle, rng):
    from cudnn_compat._backend.plan_cache import CACHE
    case = ((1, 4, 6, 6), (4, 2, 3, 3), (1, 2), (2, 1), (1, 2), 2)
    forward(handle, rng.standard_normal(case[0]), rng.standard_normal(case[1]), case, CONV, algo=IMPLICIT_GEMM)
    ops = [p.graph.ops[0] for p in CACHE._d.values()
           if p.graph.ops[0].kind == "ConvolutionForward" and p.graph.ops[0].inputs["x"].dims == case[0]]
    assert ops and ops[-1].attrs == {
        "mode": "CONVOLUTION", "pre_padding": (1, 2), "post_padding": (1, 2), "stride": (2, 1), "dilation": (1, 2),
        "groups": 2, "compute_type": "float32", "math_type": "DEFAULT_MATH",
        "algo": "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM", "zero_workspace": True}  # _conv_algos.zero_workspace_algo
