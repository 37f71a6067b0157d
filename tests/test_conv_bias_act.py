"""cudnnConvolutionBiasActivationForward (002 §5.2.9): y = act(alpha1*conv(x) + alpha2*z + bias)
as one fused graph, against the formula written here; z aliasing y; its NOT_SUPPORTED rules."""
import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend.plan_cache import CACHE
from conftest import tdesc
from conv_util import CONV, CROSS, DOUBLE, FLOAT, HALF, cdesc, fdesc, out_shape, ref_conv

BAD, UNSUP = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
RELU, IDENTITY = cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_ACTIVATION_IDENTITY
GEMM, PRECOMP = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
XS, WS, PAD, STRIDE = (2, 3, 6, 5), (4, 3, 3, 3), (1, 1), (1, 2)
YS = out_shape(XS, WS, PAD, STRIDE, (1, 1))


def adesc(mode=RELU, nan=cc.CUDNN_NOT_PROPAGATE_NAN):
    d = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(d, mode, nan, 0.0)
    return d


def formula(x, w, z, bias, a1, a2, relu, mode=CROSS):
    pre = a1 * ref_conv(x, w, PAD, STRIDE, (1, 1), mode=mode) + a2 * z + bias.reshape(1, -1, 1, 1)
    return np.maximum(pre, 0.0) if relu else pre


def run(handle, x, w, z, bias, y, a1=1.0, a2=1.0, act=RELU, algo=GEMM, dtype=FLOAT, mode=CROSS, ydesc=None,
        zdesc=None, bdesc=None, adescr=None):
    yd = ydesc or tdesc(YS, dtype)
    cc.cudnnConvolutionBiasActivationForward(
        handle, a1, tdesc(XS, dtype), x, fdesc(WS, dtype), w, cdesc(PAD, STRIDE, mode=mode, compute=FLOAT if dtype == HALF else dtype),
        algo, None, 0, a2, zdesc or yd, z, bdesc or tdesc((1, WS[0], 1, 1), dtype), bias,
        adescr if adescr is not None else adesc(act), yd, y)


@pytest.mark.parametrize("act, algo", [(RELU, GEMM), (RELU, PRECOMP), (IDENTITY, PRECOMP)])
@pytest.mark.parametrize("mode", [CROSS, CONV])
def test_matches_the_formula(handle, rng, act, algo, mode):
    x, w = rng.standard_normal(XS), rng.standard_normal(WS)
    z, bias = rng.standard_normal(YS), rng.standard_normal(WS[0])
    y = np.full(YS, np.nan)
    run(handle, x, w, z, bias, y, 0.7, -0.4, act, algo, DOUBLE, mode)
    np.testing.assert_allclose(y, formula(x, w, z, bias, 0.7, -0.4, act == RELU, mode), rtol=1e-12, atol=1e-12)
    assert act == IDENTITY or (y == 0).any()  # the ReLU clipped something


def test_one_fused_graph(handle, rng):
    x, w = rng.standard_normal(XS).astype(np.float32), rng.standard_normal(WS).astype(np.float32)
    z, bias = rng.standard_normal(YS).astype(np.float32), rng.standard_normal(WS[0]).astype(np.float32)
    y = np.zeros(YS, np.float32)
    misses = cc.plan_cache_info().misses
    run(handle, x, w, z, bias, y, mode=CONV)
    assert cc.plan_cache_info().misses == misses + 1  # one plan, not three calls
    plan = next(reversed(CACHE._d.values()))
    assert [op.kind for op in plan.graph.ops] == ["ConvolutionForward", "Pointwise", "Pointwise", "Pointwise"]
    assert [op.attrs.get("mode") for op in plan.graph.ops] == ["CONVOLUTION", "ADD", "ADD", "RELU_FWD"]
    hits = cc.plan_cache_info().hits
    run(handle, x, w, z, bias, y, mode=CONV)
    assert cc.plan_cache_info().hits == hits + 1


def test_z_may_alias_y_and_alpha2_zero_does_not_read_z(handle, rng):
    x, w, bias = rng.standard_normal(XS), rng.standard_normal(WS), rng.standard_normal(WS[0])
    y0 = rng.standard_normal(YS)
    y = y0.copy()
    run(handle, x, w, y, bias, y, 1.5, 0.5, dtype=DOUBLE)  # z is y's buffer: the residual is the old y
    np.testing.assert_allclose(y, formula(x, w, y0, bias, 1.5, 0.5, True), rtol=1e-12, atol=1e-12)
    y = np.full(YS, np.nan)
    run(handle, x, w, y, bias, y, 1.0, 0.0, dtype=DOUBLE)  # alpha2 == 0: NaN in z/y must not leak
    np.testing.assert_allclose(y, formula(x, w, np.zeros(YS), bias, 1.0, 0.0, True), rtol=1e-12, atol=1e-12)


def test_half(handle, rng):
    """HALF x/w/y/z/bias with FLOAT convolution and alphas (002 table 16)."""
    x, w = (rng.standard_normal(s).astype(np.float16) for s in (XS, WS))
    z, bias = rng.standard_normal(YS).astype(np.float16), rng.standard_normal(WS[0]).astype(np.float16)
    y = np.zeros(YS, np.float16)
    run(handle, x, w, z, bias, y, 0.5, 2.0, dtype=HALF)
    want = formula(x.astype(np.float64), w.astype(np.float64), z.astype(np.float64), bias.astype(np.float64), 0.5, 2.0, True)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=3e-3, atol=3e-3 * np.abs(want).max())


# -- the split form (convolution/bias_act.py: what the GPU place runs when no native engine fuses) ----

@pytest.fixture
def split(monkeypatch):
    """Every call of the test runs in the split form: the plain convolution, then the epilogue graph."""
    from cudnn_compat._core import call as _call
    from cudnn_compat.convolution import bias_act

    def force(h, key, build, xd, wd, yd, zd, cd, bd, ad, algo):
        _call.plan_for(h, key, build)  # the fused builder's checks first, as the GPU place makes them
        form = bias_act._SPLIT[key] = bias_act._split_form(xd, wd, yd, zd, cd, bd, ad, algo)
        return form
    monkeypatch.setattr(bias_act, "_use_split", force)
    yield bias_act
    bias_act._SPLIT.clear()


def _epilogues() -> int:
    return sum("ConvolutionBiasActivationForward.epilogue" in k for k in CACHE._d)


@pytest.mark.parametrize("z_form", ["distinct", "is_y", "unread"])
@pytest.mark.parametrize("act, algo", [(RELU, GEMM), (IDENTITY, PRECOMP)])
def test_split_form_matches_the_formula(handle, rng, split, z_form, act, algo):
    """z a buffer of its own (added by the epilogue), z is y (the convolution's blend adds it),
    alpha2 == 0 (NaN in z must not leak); twice, with new x values (no replay of the first call)."""
    w, bias, z0 = rng.standard_normal(WS), rng.standard_normal(WS[0]), rng.standard_normal(YS)
    a2 = 0.0 if z_form == "unread" else -0.6
    for _ in range(2):
        x = rng.standard_normal(XS)
        y = z0.copy() if z_form == "is_y" else np.full(YS, np.nan)
        z = y if z_form == "is_y" else (z0.copy() if z_form == "distinct" else np.full(YS, np.nan))
        run(handle, x, w, z, bias, y, 0.7, a2, act, algo, DOUBLE)
        want = formula(x, w, z0 if a2 else np.zeros(YS), bias, 0.7, a2, act == RELU)
        np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    assert _epilogues() >= 1


@pytest.mark.parametrize("dtype, st, tol", [(FLOAT, np.float32, 1e-5), (HALF, np.float16, 3e-3)])
def test_split_form_reduced_precision(handle, rng, split, dtype, st, tol):
    """The sum before the bias is stored in y's type once: within the type's rounding of the fused result."""
    x, w = (rng.standard_normal(s).astype(st) for s in (XS, WS))
    z, bias = rng.standard_normal(YS).astype(st), rng.standard_normal(WS[0]).astype(st)
    y = np.zeros(YS, st)
    run(handle, x, w, z, bias, y, 0.5, 2.0, dtype=dtype)
    want = formula(*(v.astype(np.float64) for v in (x, w, z, bias)), 0.5, 2.0, True)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol * np.abs(want).max())
    assert _epilogues() >= 1


def test_split_form_checks_every_buffer_before_writing(handle, split):
    """A bias buffer too small is refused before the convolution writes y."""
    x, w, z = np.ones(XS), np.ones(WS), np.ones(YS)
    y = np.full(YS, 4.0)
    with pytest.raises(cc.CuDNNError) as e:
        run(handle, x, w, z, np.ones(WS[0] - 1), y, dtype=DOUBLE)
    assert e.value.status == BAD and "bias" in str(e.value)
    assert np.all(y == 4.0)


def test_split_form_keeps_a_z_that_overlaps_y_fused():
    """z sharing bytes with y without being it: the convolution would overwrite z before the
    epilogue reads it, so such a call runs fused (``_apart`` False)."""
    from cudnn_compat.convolution.bias_act import _apart
    buf = np.zeros(2 * int(np.prod(YS)))
    y = buf[:int(np.prod(YS))]
    d = y.nbytes  # the bytes y spans (the split form's, from yDesc)
    assert not _apart(buf[y.size - 1:], y, d) and not _apart(y, buf[y.size - 1:], d)
    assert not _apart(buf[5:5 + y.size], y, d) and not _apart(y, buf[3:], d)
    assert _apart(buf[y.size:], y, d) and _apart(y, np.zeros(YS), d)


@pytest.mark.parametrize("kw, status, arg", [
    (dict(act=cc.CUDNN_ACTIVATION_SIGMOID), UNSUP, "activationDesc"),
    (dict(adescr="propagate"), UNSUP, "activationDesc"),  # reluNanOpt must be NOT_PROPAGATE_NAN
    (dict(act=IDENTITY, algo=GEMM), UNSUP, "algo"),  # IDENTITY only with IMPLICIT_PRECOMP_GEMM
    (dict(bdesc="wide"), UNSUP, "biasDesc"),  # bias not 1xKx1x1
    (dict(bdesc="strided"), UNSUP, "biasDesc"),  # second stride of bias not 1
    (dict(bdesc="double"), UNSUP, "biasDesc"),  # bias type not y's
    (dict(zdesc="nhwc"), UNSUP, "zDesc"),  # zDesc must equal yDesc
    (dict(zdesc="5d"), BAD, "zDesc"),  # nbDims != arrayLength + 2
    (dict(adescr=0), BAD, "activationDesc"),  # NULL
    (dict(ydesc="wrong"), UNSUP, "yDesc"),  # the forward's own rules apply
])
def test_errors_write_nothing(handle, kw, status, arg):
    special = {
        "propagate": lambda: adesc(RELU, cc.CUDNN_PROPAGATE_NAN),
        "wide": lambda: tdesc((1, WS[0] + 1, 1, 1)),
        "strided": lambda: tdesc((1, WS[0], 1, 1), strides=(8, 2, 1, 1)),
        "double": lambda: tdesc((1, WS[0], 1, 1), DOUBLE),
        "nhwc": lambda: tdesc(YS, fmt=cc.CUDNN_TENSOR_NHWC),
        "5d": lambda: tdesc(YS + (1,)),
        "wrong": lambda: tdesc((2, 4, 6, 4)),
    }
    kw = {k: (special[v]() if isinstance(v, str) else v) for k, v in kw.items()}
    x, w = np.ones(XS, np.float32), np.ones(WS, np.float32)
    z, bias = np.ones(YS, np.float32), np.ones(2 * WS[0], np.float32)
    y = np.full(YS, 4.0, np.float32)
    with pytest.raises(cc.CuDNNError) as e:
        run(handle, x, w, z, bias, y, **kw)
    assert e.value.status == status and f"cudnnConvolutionBiasActivationForward: {arg}:" in str(e.value), str(e.value)
    assert np.all(y == 4.0)


@pytest.mark.parametrize("ytype", [cc.CUDNN_DATA_INT8, FLOAT])
def test_int8_config(handle, rng, ytype):
    """INT8 x/w with INT32 convolution, FLOAT bias and alphas, y and z INT8 or FLOAT (002 table 16)."""
    from conv_util import INT8, INT32, NHWC, STORAGE, desc_for, layout_strides, strided
    xs, ws = (1, 4, 5, 5), (8, 4, 3, 3)
    ys = out_shape(xs, ws, (1, 1), (1, 1), (1, 1))
    x, w = rng.integers(-20, 20, xs).astype(np.float64), rng.integers(-5, 5, ws).astype(np.float64)
    z, bias = rng.integers(-9, 9, ys).astype(np.float64), rng.standard_normal(ws[0]).astype(np.float32)
    xbuf, _ = strided(x, layout_strides(xs, "NHWC"), np.int8)
    wbuf, _ = strided(w, layout_strides(ws, "NHWC"), np.int8)
    zbuf, _ = strided(z, layout_strides(ys, "NHWC"), STORAGE[ytype])
    ybuf, yview = strided(np.zeros(ys), layout_strides(ys, "NHWC"), STORAGE[ytype])
    yd = desc_for(ys, ytype, "NHWC")
    cc.cudnnConvolutionBiasActivationForward(handle, 1 / 3, desc_for(xs, INT8, "NHWC"), xbuf, fdesc(ws, INT8, NHWC), wbuf,
                                             cdesc((1, 1), compute=INT32), PRECOMP, None, 0, 0.5, yd, zbuf,
                                             tdesc((1, ws[0], 1, 1)), bias, adesc(), yd, ybuf)
    want = np.maximum(ref_conv(x, w, (1, 1), (1, 1), (1, 1)) / 3 + 0.5 * z + bias.reshape(1, -1, 1, 1), 0.0)
    if ytype == cc.CUDNN_DATA_INT8:
        want = np.clip(np.rint(want), -128, 127)
    np.testing.assert_allclose(yview.astype(np.float64), want, rtol=1e-5, atol=1e-4)
