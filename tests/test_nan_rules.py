"""NaN rules of the backward paths (issue 23 item 11), against formulas written here from 002's
definitions, not from the engines:

* activation backward, every mode (002 §4.1.2 cudnnActivationBackward, §3.1.2.1 cudnnActivationMode_t,
  §3.1.2.18 cudnnNanPropagation_t): a NaN input element gives a NaN gradient; under NOT_PROPAGATE the
  ReLU family clipped the NaN away in the forward pass, so its gradient there is 0;
* pooling (§3.2.69 cudnnPoolingForward, §4.1.18 cudnnPoolingBackward): max pooling under PROPAGATE
  returns the NaN and routes the window's gradient to it (the first NaN of the window, row-major);
  under NOT_PROPAGATE it ignores NaNs; average modes spread dy/count whatever x holds;
* softmax (§3.2.76 / §4.1.21): one NaN in x, y or dy poisons exactly the softmax row it belongs to;
* batch norm (§4.1.5 cudnnBatchNormalizationForwardTraining): the running variance update uses the
  unbiased variance var*m/(m-1), which is NaN for one element per channel (m = 1);
* RNN (§8.2.15 cudnnRNNForward, §8.2.18 cudnnRNNBackwardData_v8, §8.2.27 cudnnRNNSetClip_v8): the
  RELU cell's gradient is NaN where its output is NaN; the LSTM cell clip returns the NaN under
  PROPAGATE_NAN and clamps it to the lower bound under NOT_PROPAGATE_NAN.

GPU tests (marked gpu) run the same scenarios on a GPU handle: the default engine choice and the
cupy engine forced (the native cudnn engine declines pointwise-only graphs, pooling, softmax and
batch norm: docs/op_coverage), against the reference engine with NaNs in the same places.
"""
import os

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

NAN = float("nan")
FLT_LOWEST = float(np.finfo(np.float32).min)
TOL = dict(rtol=1e-6, atol=1e-6)  # float32 data, float64 formulas: one float32 rounding


def host(a):
    """A host copy: CuPy arrays by ``get``, the emulated GPU place's arrays (tests/host_emu.py) by ``host``."""
    return a.get() if hasattr(a, "get") else np.array(a.host) if hasattr(a, "host") else np.asarray(a)


# -- activation -------------------------------------------------------------------------------------

def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


COEF = {"CLIPPED_RELU": 0.7, "ELU": 0.4}  # SWISH: beta 1 (cudnnSetActivationDescriptorSwishBeta unset)


def act_forward(mode, x, prop):
    """y of 002 §3.1.2.1 in float64; the ReLU family's NaN is clipped to 0 under NOT_PROPAGATE."""
    c = COEF.get(mode, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        y = {"RELU": lambda: np.maximum(x, 0.0), "CLIPPED_RELU": lambda: np.minimum(np.maximum(x, 0.0), c),
             "SIGMOID": lambda: _sig(x), "TANH": lambda: np.tanh(x),
             "ELU": lambda: np.where(x > 0, x, c * np.expm1(np.minimum(x, 0.0))), "SWISH": lambda: x * _sig(x)}[mode]()
    if mode in ("RELU", "CLIPPED_RELU") and not prop:
        y = np.where(np.isnan(x), 0.0, y)
    return y


def act_backward(mode, x, dy, prop):
    c = COEF.get(mode, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        if mode in ("RELU", "CLIPPED_RELU"):
            inside = (x > 0) & ((x < c) if mode == "CLIPPED_RELU" else True)
            dx = np.where(inside, dy, 0.0)
            return np.where(np.isnan(x), NAN if prop else 0.0, dx)
        d = {"SIGMOID": lambda: _sig(x) * (1 - _sig(x)), "TANH": lambda: 1 - np.tanh(x) ** 2,
             "ELU": lambda: np.where(x > 0, 1.0, c * np.exp(np.minimum(x, 0.0))),
             "SWISH": lambda: _sig(x) + x * _sig(x) * (1 - _sig(x))}[mode]()
        return np.where(np.isnan(x), NAN, dy * d)


ACT_MODES = ["RELU", "CLIPPED_RELU", "SIGMOID", "TANH", "ELU", "SWISH"]
NANS = [cc.CUDNN_PROPAGATE_NAN, cc.CUDNN_NOT_PROPAGATE_NAN]


def activation_case(h, xp, mode, nan):
    """cudnnActivationForward then Backward on x with NaNs; returns host (x, dy, y, dx)."""
    rng = np.random.default_rng(11)
    shape = (2, 3, 4, 5)
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    x[0, 1, 2, 3] = x[1, 2, 0, 0] = x[1, 0, 3, 4] = NAN
    dy = rng.standard_normal(shape).astype(np.float32)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, getattr(cc, f"CUDNN_ACTIVATION_{mode}"), nan, COEF.get(mode, 0.0))
    d = tdesc(shape)
    xd, dyd = xp.asarray(x), xp.asarray(dy)
    y, dx = xp.full(shape, 5.0, np.float32), xp.full(shape, 5.0, np.float32)
    cc.cudnnActivationForward(h, ad, 1.0, d, xd, 0.0, d, y)
    cc.cudnnActivationBackward(h, ad, 1.0, d, y, d, dyd, d, xd, 0.0, d, dx)
    return x, dy, host(y), host(dx)


@pytest.mark.parametrize("nan", NANS, ids=["PROPAGATE", "NOT_PROPAGATE"])
@pytest.mark.parametrize("mode", ACT_MODES)
def test_activation_nan_rules(handle, mode, nan):
    x, dy, y, dx = activation_case(handle, np, mode, nan)
    prop = nan == cc.CUDNN_PROPAGATE_NAN
    np.testing.assert_allclose(y, act_forward(mode, x.astype(float), prop), equal_nan=True, **TOL)
    want = act_backward(mode, x.astype(float), dy.astype(float), prop)
    np.testing.assert_array_equal(np.isnan(dx), np.isnan(want))
    np.testing.assert_allclose(dx, want, equal_nan=True, **TOL)
    assert np.isnan(dx).sum() == (3 if prop or mode not in ("RELU", "CLIPPED_RELU") else 0)


# -- pooling ----------------------------------------------------------------------------------------

POOL_CASES = {  # name: (mode, nan, window, pad, stride)
    "max_prop": (cc.CUDNN_POOLING_MAX, cc.CUDNN_PROPAGATE_NAN, (2, 2), (0, 0), (2, 2)),
    "max_prop_overlap": (cc.CUDNN_POOLING_MAX, cc.CUDNN_PROPAGATE_NAN, (3, 3), (1, 1), (1, 1)),
    "max_noprop_overlap": (cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, (3, 3), (1, 1), (1, 1)),
    "maxdet_prop": (cc.CUDNN_POOLING_MAX_DETERMINISTIC, cc.CUDNN_PROPAGATE_NAN, (3, 3), (1, 1), (2, 2)),
    "avg_include": (cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, cc.CUDNN_PROPAGATE_NAN, (3, 3), (1, 1), (2, 2)),
    "avg_exclude": (cc.CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, cc.CUDNN_NOT_PROPAGATE_NAN, (3, 3), (1, 1), (2, 2)),
}
XS = (1, 2, 5, 6)


def pool_reference(mode, prop, window, pad, stride, x, dy):
    """y and dx by loops over every window (002 §3.2.69, §4.1.18), float64."""
    N, C, H, W = x.shape
    Ho, Wo = dy.shape[2:]
    y, dx = np.zeros(dy.shape), np.zeros(x.shape)
    for n in range(N):
        for c in range(C):
            for i in range(Ho):
                for j in range(Wo):
                    cells = [(r, s) for r in range(i * stride[0] - pad[0], i * stride[0] - pad[0] + window[0])
                             for s in range(j * stride[1] - pad[1], j * stride[1] - pad[1] + window[1])
                             if 0 <= r < H and 0 <= s < W]
                    vals = [x[n, c, r, s] for r, s in cells]
                    g = dy[n, c, i, j]
                    if mode in (cc.CUDNN_POOLING_MAX, cc.CUDNN_POOLING_MAX_DETERMINISTIC):
                        nans = [k for k, v in enumerate(vals) if np.isnan(v)]
                        if prop and nans:
                            k = nans[0]
                        else:
                            finite = [(v, -k) for k, v in enumerate(vals) if not np.isnan(v)]
                            k = -max(finite)[1]  # the first maximum in row-major window order
                        y[n, c, i, j] = vals[k]
                        dx[n, c][cells[k]] += g
                    else:
                        count = window[0] * window[1] if mode == cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING \
                            else len(cells)
                        y[n, c, i, j] = sum(vals) / count
                        for cell in cells:
                            dx[n, c][cell] += g / count
    return y, dx


def pool_data(name):
    rng = np.random.default_rng(5)
    # distinct values, so the maximum of every window is unique where no NaN is in it
    x = rng.permutation(np.arange(np.prod(XS))).reshape(XS).astype(np.float32) / 7.0 - 4.0
    x[0, 0, 1, 1] = x[0, 0, 2, 4] = x[0, 1, 4, 5] = NAN
    return x


def pooling_case(h, xp, name):
    mode, nan, window, pad, stride = POOL_CASES[name]
    x = pool_data(name)
    pd = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPoolingNdDescriptor(pd, mode, nan, 2, list(window), list(pad), list(stride))
    xd = tdesc(XS)
    oshape = tuple(cc.cudnnGetPoolingNdForwardOutputDim(pd, xd, 4))
    yd = tdesc(oshape)
    dy = np.random.default_rng(6).standard_normal(oshape).astype(np.float32)
    if mode not in (cc.CUDNN_POOLING_MAX, cc.CUDNN_POOLING_MAX_DETERMINISTIC):
        dy[0, 1, 0, 1] = NAN  # average modes: a NaN gradient spreads over its window
    xg, dyg = xp.asarray(x), xp.asarray(dy)
    y, dx = xp.full(oshape, 5.0, np.float32), xp.full(XS, 5.0, np.float32)
    cc.cudnnPoolingForward(h, pd, 1.0, xd, xg, 0.0, yd, y)
    cc.cudnnPoolingBackward(h, pd, 1.0, yd, y, yd, dyg, xd, xg, 0.0, xd, dx)
    return x, dy, host(y), host(dx)


@pytest.mark.parametrize("name", sorted(POOL_CASES))
def test_pooling_nan_rules(handle, name):
    mode, nan, window, pad, stride = POOL_CASES[name]
    x, dy, y, dx = pooling_case(handle, np, name)
    wy, wdx = pool_reference(mode, nan == cc.CUDNN_PROPAGATE_NAN, window, pad, stride, x.astype(float),
                             dy.astype(float))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(wy))
    np.testing.assert_allclose(y, wy, equal_nan=True, **TOL)
    np.testing.assert_array_equal(np.isnan(dx), np.isnan(wdx))
    np.testing.assert_allclose(dx, wdx, equal_nan=True, **TOL)
    if name.startswith("max_prop"):  # the gradient reached the NaN elements (issue 23: a mutation hid this)
        assert dx[0, 0, 1, 1] != 0 and dx[0, 0, 2, 4] != 0
    if name == "max_noprop_overlap":
        assert dx[0, 0, 1, 1] == 0 and np.isfinite(y).all()


# -- softmax ----------------------------------------------------------------------------------------

SOFTMAX = [(algo, mode) for algo in ("ACCURATE", "LOG") for mode in ("CHANNEL", "INSTANCE")]


def softmax_case(h, xp, algo, mode):
    rng = np.random.default_rng(3)
    shape = (3, 4, 2, 3)
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 2, 1, 1] = NAN
    dy = rng.standard_normal(shape).astype(np.float32)
    dy[1, 0, 0, 2] = NAN
    a, m = getattr(cc, f"CUDNN_SOFTMAX_{algo}"), getattr(cc, f"CUDNN_SOFTMAX_MODE_{mode}")
    d = tdesc(shape)
    y, dx = xp.full(shape, 5.0, np.float32), xp.full(shape, 5.0, np.float32)
    cc.cudnnSoftmaxForward(h, a, m, 1.0, d, xp.asarray(x), 0.0, d, y)
    cc.cudnnSoftmaxBackward(h, a, m, 1.0, d, y, d, xp.asarray(dy), 0.0, d, dx)
    return x, dy, host(y), host(dx)


def softmax_reference(algo, mode, x, dy):
    """002 §3.2.76: softmax over C (CHANNEL, per n,h,w) or over C,H,W (INSTANCE, per n); backward:
    ACCURATE dx = y*(dy - sum(dy*y)), LOG dx = dy - exp(y)*sum(dy)."""
    axes = (1,) if mode == "CHANNEL" else (1, 2, 3)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - np.max(x, axis=axes, keepdims=True))
        p = e / e.sum(axis=axes, keepdims=True)
        if algo == "LOG":
            y = np.log(p)
            return y, dy - np.exp(y) * dy.sum(axis=axes, keepdims=True)
        return p, p * (dy - (dy * p).sum(axis=axes, keepdims=True))


@pytest.mark.parametrize("algo, mode", SOFTMAX)
def test_softmax_nan_rules(handle, algo, mode):
    x, dy, y, dx = softmax_case(handle, np, algo, mode)
    wy, wdx = softmax_reference(algo, mode, x.astype(float), dy.astype(float))
    # a NaN poisons its whole row (the x NaN through y, the dy NaN through the row's sum), nothing else
    rows = 4 * 1 if mode == "CHANNEL" else 4 * 2 * 3
    assert np.isnan(wy).sum() == rows and np.isnan(wdx).sum() == 2 * rows
    np.testing.assert_array_equal(np.isnan(y), np.isnan(wy))
    np.testing.assert_array_equal(np.isnan(dx), np.isnan(wdx))
    np.testing.assert_allclose(y, wy, equal_nan=True, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, wdx, equal_nan=True, rtol=1e-5, atol=1e-5)


# -- batch norm: the running variance with one element per channel ----------------------------------

BN_CASES = [("PER_ACTIVATION", (3, 3, 2, 2)), ("SPATIAL", (2, 3, 2, 1))]


def bn_case(h, xp, mode, shape):
    """cudnnBatchNormalizationForwardTraining with running statistics; returns host arrays."""
    rng = np.random.default_rng(8)
    m = getattr(cc, f"CUDNN_BATCHNORM_{mode}")
    xd = tdesc(shape)
    pd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnDeriveBNTensorDescriptor(pd, xd, m)
    ps = (1,) + shape[1:] if mode == "PER_ACTIVATION" else (1, shape[1], 1, 1)
    x = rng.standard_normal(shape).astype(np.float32)
    scale, bias = rng.uniform(0.5, 1.5, ps).astype(np.float32), rng.standard_normal(ps).astype(np.float32)
    rmean, rvar = rng.standard_normal(ps).astype(np.float32), rng.uniform(0.5, 2, ps).astype(np.float32)
    x[0, 1, 0, 0] = NAN  # one channel (or activation) of statistics is NaN, the others are not
    g = {k: xp.array(v) for k, v in dict(x=x, scale=scale, bias=bias, rmean=rmean, rvar=rvar).items()}
    y = xp.full(shape, 5.0, np.float32)
    cc.cudnnBatchNormalizationForwardTraining(h, m, 1.0, 0.0, xd, g["x"], xd, y, pd, g["scale"], g["bias"], 0.25,
                                              g["rmean"], g["rvar"], 1e-5, None, None)
    return dict(x=x, rmean0=rmean, rvar0=rvar, y=host(y), rmean=host(g["rmean"]), rvar=host(g["rvar"]))


def bn_running(x, axes, rmean, rvar, f):
    """002 §4.1.5: running = (1-f)*running + f*statistic, the variance unbiased (m/(m-1))."""
    m = int(np.prod([x.shape[a] for a in axes]))
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        unbiased = var * (np.float64(m) / np.float64(m - 1))  # m = 1: 0 * inf = NaN
    return (1 - f) * rmean + f * mean, (1 - f) * rvar + f * unbiased


@pytest.mark.parametrize("mode, shape", BN_CASES)
def test_batchnorm_nan_statistics_stay_in_their_channel(handle, mode, shape):
    r = bn_case(handle, np, mode, shape)
    axes = (0,) if mode == "PER_ACTIVATION" else (0, 2, 3)
    wm, wv = bn_running(r["x"].astype(float), axes, r["rmean0"], r["rvar0"], 0.25)
    for got, want in ((r["rmean"], wm), (r["rvar"], wv)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, equal_nan=True, **TOL)
    assert 0 < np.isnan(wv).sum() < wv.size
    nan_y = np.isnan(r["y"])
    assert nan_y.any() and not nan_y.all()


def test_batchnorm_one_value_per_channel_is_refused_by_the_legacy_call(handle):
    """The legacy layer refuses a running-variance update over one value (NOT_SUPPORTED, naming xDesc)."""
    with pytest.raises(cc.CuDNNError) as e:
        bn_case(handle, np, "PER_ACTIVATION", (1, 3, 2, 2))
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED
    assert "xDesc" in str(e.value) and "at least 2 values per channel" in str(e.value)


@pytest.mark.parametrize("axes, shape", [((0,), (1, 3, 2, 2)), ((0, 2, 3), (1, 3, 1, 1))])
def test_batchnorm_running_variance_of_one_element_is_nan(axes, shape):
    """The graph API's NormForward (the reference kernel the legacy call would reach): with one
    element per channel the unbiased variance 0*1/0 is NaN, so the running variance is NaN; the
    running mean and y are finite (y = bias, since x - mean = 0)."""
    from cudnn_compat._backend.engines.reference.norm import norm_forward
    from cudnn_compat._backend.ir import Operation, Tensor, packed_strides
    rng = np.random.default_rng(12)
    ps = tuple(1 if a in axes else d for a, d in enumerate(shape))
    x = rng.standard_normal(shape)
    scale, bias, rm, rv = (rng.uniform(0.5, 1.5, ps) for _ in range(4))
    T = lambda uid, dims: Tensor(uid, dims, packed_strides(dims), "float32")  # noqa: E731
    ins = {"x": x, "scale": scale, "bias": bias, "running_mean": rm, "running_var": rv}
    op = Operation("NormForward", {k: T(i + 1, v.shape) for i, (k, v) in enumerate(ins.items())},
                   {k: T(20 + i, ps) for i, k in enumerate(("saved_mean", "saved_inv_variance", "next_running_mean",
                                                           "next_running_var"))} | {"y": T(30, shape)},
                   {"phase": "TRAINING", "axes": axes, "epsilon": 1e-5, "exp_avg_factor": 0.25})
    out = norm_forward(op, ins)
    wm, wv = bn_running(x, axes, rm, rv, 0.25)
    assert np.isnan(wv).all() and np.isnan(out["next_running_var"]).all()
    np.testing.assert_allclose(out["next_running_mean"], wm, rtol=1e-12)
    np.testing.assert_allclose(out["y"], np.broadcast_to(bias, shape), rtol=1e-12)


EMU_BN = [("PER_ACTIVATION", (3, 3, 2, 2), "BnRun"), ("SPATIAL", (2, 3, 2, 1), "RowRun"),
          ("SPATIAL", (2, 3, 16, 24), "BnRun")]  # bn.py channels innermost / reduced innermost; row kernels


@pytest.mark.parametrize("mode, shape, run", EMU_BN)
def test_batchnorm_nan_rules_of_the_gpu_kernels_on_the_emulator(monkeypatch, mode, shape, run):
    """The GPU scenarios below on the emulated GPU place (tests/host_emu.py: the cupy engine's
    generated kernels run on the CPU): the NaN channel's running variance is NaN as in the
    reference (a ``var > 0 ? var : 0`` clamp once made it finite), through both patterns of the
    memory-speed kernels (bn.py) and the generic row kernels."""
    import kernel_emu
    if kernel_emu.available():
        pytest.skip(kernel_emu.available())
    import host_emu
    monkeypatch.setenv("CUDNN_COMPAT_CPU_FALLBACK", "0")
    emu, cpu = host_emu.Emu("emulate"), cc.cudnnCreate("cpu")
    try:
        ref = bn_case(cpu, np, mode, shape)
        cc.plan_cache_clear()
        xp = type("xp", (), {"array": staticmethod(lambda v: host_emu.EmuArray(np.array(v))),
                             "full": staticmethod(lambda s, v, dt: host_emu.EmuArray(np.full(s, v, dt)))})
        got = bn_case(emu.handle(), xp, mode, shape)
        plan = cc._core.call.last_plan()
    finally:
        emu.restore()
        cc.cudnnDestroy(cpu)
    assert plan.engine == "cupy" and [type(r).__name__ for r in plan.runs] == [run]
    assert np.isnan(ref["rvar"]).any() and not np.isnan(ref["rvar"]).all()
    for k in ref:
        np.testing.assert_array_equal(np.isnan(got[k]), np.isnan(ref[k]), err_msg=f"NaN places of {k}")
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, equal_nan=True, err_msg=k)


# -- RNN (CPU: the reference engine; the RNN GPU suite compares engines on finite data) ---------------

SEQ = cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED


def test_rnn_relu_backward_is_nan_where_the_output_is(handle):
    """A NaN input element at (t0, b0) makes that step's output NaN for every unit, and every later
    step of b0 (the recurrence carries it); the RELU cell's gradient there is NaN, so dx of b0 is
    NaN at t <= t0 (the gradient flows back through R) and finite for the other sequences."""
    from test_rnn_reference import forward, make_net
    net = make_net(handle, cc.CUDNN_RNN_RELU, I=3, H=4, rng=np.random.default_rng(2))
    T, lengths, t0, b0 = 4, (4, 4, 3), 2, 1
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((n, 3)) for n in lengths]
    xs[b0][t0, 0] = NAN
    ys, _, _, st = forward(handle, net, xs, SEQ, lengths, T, training=True)
    assert np.isnan(ys[b0][t0:]).all() and np.isfinite(ys[b0][:t0]).all()
    dy = rng.standard_normal(st["y"].shape)
    dx = np.full(st["x"].shape, 7.0)
    cc.cudnnRNNBackwardData_v8(handle, net["desc"], st["seq"], st["yd"], st["y"], dy, st["xd"], dx, st["hdesc"], None,
                               None, None, None, None, None, None, net["wsize"], net["wspace"], st["ws_size"], st["ws"],
                               st["rs_size"], st["rs"])
    dx = dx.reshape(T, len(lengths), 3)
    assert np.isnan(dx[: t0 + 1, b0]).all()
    assert np.isfinite(dx[:, [b for b in range(len(lengths)) if b != b0]][:3]).all()


@pytest.mark.parametrize("nan", NANS, ids=["PROPAGATE", "NOT_PROPAGATE"])
def test_lstm_cell_clip_nan_option(handle, nan):
    """A NaN initial cell state of sequence 1, unit 2 makes c_1 = f*c_0 + i*g NaN there; the MINMAX clip
    (002 §8.2.27) returns it under PROPAGATE_NAN and clamps it to lclip under NOT_PROPAGATE_NAN, so
    cy there is lclip and hy = o*tanh(lclip) with o the output gate, computed here from the weights."""
    from test_rnn_reference import forward, make_net
    lclip, rclip = -0.6, 0.8
    net = make_net(handle, cc.CUDNN_LSTM, I=3, H=4, rng=np.random.default_rng(9), clip=(lclip, rclip))
    cc.cudnnRNNSetClip_v8(net["desc"], cc.CUDNN_RNN_CLIP_MINMAX, nan, lclip, rclip)
    rng = np.random.default_rng(10)
    xs = [rng.standard_normal((1, 3)) for _ in range(2)]
    hx, cx = rng.standard_normal((1, 2, 4)), rng.uniform(-0.2, 0.2, (1, 2, 4))
    cx[0, 1, 2] = NAN
    ys, hy, cy, _ = forward(handle, net, xs, SEQ, (1, 1), 1, hx, cx)
    w = net["weights"][0]
    pre_o = w["W"][3] @ xs[1][0] + w["R"][3] @ hx[0, 1] + w["bW"][3] + w["bR"][3]
    o = 1.0 / (1.0 + np.exp(-pre_o[2]))
    if nan == cc.CUDNN_PROPAGATE_NAN:
        assert np.isnan(cy[0, 1, 2]) and np.isnan(hy[0, 1, 2])
    else:
        assert cy[0, 1, 2] == pytest.approx(lclip, abs=1e-12)
        assert hy[0, 1, 2] == pytest.approx(o * np.tanh(lclip), abs=1e-12)
    others = np.ones(cy.shape, bool)
    others[0, 1, 2] = False
    assert np.isfinite(cy[others]).all() and np.isfinite(hy[others]).all() and np.isfinite(ys[0]).all()


# -- GPU: the same scenarios on a GPU handle against the reference engine -------------------------------

class _engine:
    """Force one engine (``CUDNN_COMPAT_ENGINE``) or leave the choice to the heuristics (None)."""

    def __init__(self, name):
        self.name, self.old = name, None

    def __enter__(self):
        self.old = os.environ.get("CUDNN_COMPAT_ENGINE")
        if self.name:
            os.environ["CUDNN_COMPAT_ENGINE"] = self.name

    def __exit__(self, *exc):
        os.environ.pop("CUDNN_COMPAT_ENGINE", None)
        if self.old is not None:
            os.environ["CUDNN_COMPAT_ENGINE"] = self.old


def rnn_case(h, xp, mode, nan):
    """cudnnRNNForward (training) and cudnnRNNBackwardData_v8 with a NaN: in x for RELU (NaN outputs, NaN
    gradients; returns host y, hy, dx), in cx for LSTM with a MINMAX cell clip under option ``nan``
    (returns host y, hy, cy)."""
    from test_rnn_gpu import DT, SEQ as SEQ_, our_net, run_ours
    L, I, H, T, lengths, dtype = 1, 3, 4, 4, (4, 4, 3), "float32"
    B = len(lengths)
    cpu = cc.cudnnCreate("cpu")
    d, w, _, _ = our_net(cpu, mode, 1, L, I, H, dtype, "FMA_MATH", np.random.default_rng(9))
    cc.cudnnDestroy(cpu)
    if mode == "LSTM":
        cc.cudnnRNNSetClip_v8(d, cc.CUDNN_RNN_CLIP_MINMAX, nan, -0.6, 0.8)
    rng = np.random.default_rng(10)
    x, hx, cx = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((T, B, I), (L, B, H), (L, B, H)))
    (x if mode == "RELU" else cx)[(2, 1, 0) if mode == "RELU" else (0, 1, 2)] = NAN
    dy = rng.uniform(-1, 1, (T, B, H)).astype(np.float32)
    dy[np.arange(T)[:, None] >= np.asarray(lengths)[None, :]] = 0
    g = {k: xp.asarray(v) for k, v in dict(x=x, hx=hx, cx=cx, dy=dy, w=w).items()}
    y, hy, cy, rsb = run_ours(h, d, g["w"], dtype, 1, L, I, H, T, lengths, g["x"], g["hx"], g["cx"], True,
                              arr=np if xp is np else None)
    xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
    cc.cudnnSetRNNDataDescriptor(xd, DT[dtype], SEQ_, T, B, I, list(lengths), None)
    cc.cudnnSetRNNDataDescriptor(yd, DT[dtype], SEQ_, T, B, H, list(lengths), None)
    hd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(hd, DT[dtype], 3, [L, B, H], [B * H, H, 1])
    ws, rs = cc.cudnnGetRNNTempSpaceSizes(h, d, cc.CUDNN_FWD_MODE_TRAINING, xd)
    dx = xp.zeros_like(g["x"])
    cc.cudnnRNNBackwardData_v8(h, d, xp.asarray(np.asarray(lengths, np.int32)), yd, y, g["dy"], xd, dx, hd, g["hx"],
                               None, None, hd, g["cx"], None, None, w.nbytes, g["w"], ws, xp.zeros(max(ws, 1), np.uint8),
                               rs, rsb)
    valid = np.arange(T)[:, None] < np.asarray(lengths)[None, :]
    if mode == "LSTM":  # dx: d c_1/d f = c_0 is NaN even where the clip saturated (0 * NaN), a rule 002 leaves open
        return host(y)[valid], host(hy), host(cy)
    return host(y)[valid], host(hy), host(dx)[valid]


GPU_SCENARIOS = ([("activation", (m, n)) for m in ACT_MODES for n in NANS]
                 + [("pooling", (name,)) for name in sorted(POOL_CASES)]
                 + [("softmax", am) for am in SOFTMAX]
                 + [("bn", mc) for mc in BN_CASES]
                 + [("rnn", ("RELU", cc.CUDNN_PROPAGATE_NAN))] + [("rnn", ("LSTM", n)) for n in NANS])
RUN = {"activation": activation_case, "pooling": pooling_case, "softmax": softmax_case, "bn": bn_case, "rnn": rnn_case}


@pytest.mark.gpu
@pytest.mark.parametrize("engine", [None, "cupy"], ids=["default", "cupy"])
@pytest.mark.parametrize("family, args", GPU_SCENARIOS, ids=[f"{f}-{'-'.join(map(str, a))}" for f, a in GPU_SCENARIOS])
def test_gpu_nan_rules_match_the_reference(family, args, engine):
    """NaNs in the same places, other values within float32 rounding (the GPU kernels compute in
    float32 where the reference computes in float64: a few ulp for exp/tanh/log, so 1e-5 relative)."""
    import cupy
    hc, hg = cc.cudnnCreate("cpu"), cc.cudnnCreate("gpu")
    try:
        ref = RUN[family](hc, np, *args)
        with _engine(engine):
            cc.plan_cache_clear()
            got = RUN[family](hg, cupy, *args)
            used = cc.last_engine()
        cupy.cuda.runtime.deviceSynchronize()
    finally:
        cc.cudnnDestroy(hc)
        cc.cudnnDestroy(hg)
    assert used != "reference", "the GPU handle ran the reference engine"
    pairs = zip(ref.values(), got.values()) if isinstance(ref, dict) else zip(ref, got)
    for i, (a, b) in enumerate(pairs):
        np.testing.assert_array_equal(np.isnan(b), np.isnan(a), err_msg=f"NaN places of output {i} ({used})")
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, equal_nan=True, err_msg=f"output {i} ({used})")
