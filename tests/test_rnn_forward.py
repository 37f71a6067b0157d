"""cudnnRNNForward (002 §7.2.36) against the cell equations of 002 §7.1.2.8 written as numpy
loops in test_rnn_reference.py: every mode and direction, bias modes, layouts with padded
batches of varied lengths, projection, clipping, skip input, NULL states, padding fill."""
import numpy as np
import pytest

import cudnn_compat as cc
from test_rnn_reference import forward, make_net, reference

MODES = [cc.CUDNN_RNN_RELU, cc.CUDNN_RNN_TANH, cc.CUDNN_LSTM, cc.CUDNN_GRU]
SEQ, PACKED, BATCH = (cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED,
                      cc.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED)


def compare(net, got, want, atol):
    (ys, hy, cy), (rys, rhy, rcy) = got, want
    for a, b in zip(ys, rys):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0)
    np.testing.assert_allclose(hy, rhy, atol=atol, rtol=0)
    if net["mode"] == cc.CUDNN_LSTM:
        np.testing.assert_allclose(cy, rcy, atol=atol, rtol=0)


def run_case(handle, rng, mode, D=1, L=2, layout=SEQ, lengths=(3, 4, 1, 4), T=4, training=False, states=True,
             dtype=np.float64, atol=1e-12, **kw):
    net = make_net(handle, mode, D=D, L=L, rng=rng, dtype=dtype, **kw)
    B, I, H, P = len(lengths), net["I"], net["H"], net["P"]
    xs = [rng.standard_normal((n, I)).astype(dtype) for n in lengths]
    hx = rng.standard_normal((L * D, B, P)).astype(dtype) if states else None
    cx = rng.standard_normal((L * D, B, H)).astype(dtype) if states else None
    ys, hy, cy, _ = forward(handle, net, xs, layout, lengths, T, hx, cx, training=training)
    want = reference(net, xs, hx, cx if mode == cc.CUDNN_LSTM else None)
    compare(net, (ys, hy, cy), want, atol)
    return net, ys


@pytest.mark.parametrize("D", [1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_modes_and_directions_padded(handle, rng, mode, D):
    """Varied lengths in a padded batch (padding vectors are NaN and must never be read)."""
    run_case(handle, rng, mode, D, lengths=(3, 4, 1, 4, 4))


@pytest.mark.parametrize("layout", [PACKED, BATCH])
@pytest.mark.parametrize("mode", [cc.CUDNN_LSTM, cc.CUDNN_GRU])
def test_layouts(handle, rng, mode, layout):
    lengths = (4, 3, 3, 1) if layout == PACKED else (2, 4, 4, 1)
    run_case(handle, rng, mode, 2, layout=layout, lengths=lengths, training=True)


@pytest.mark.parametrize("bias", [cc.CUDNN_RNN_NO_BIAS, cc.CUDNN_RNN_SINGLE_INP_BIAS, cc.CUDNN_RNN_SINGLE_REC_BIAS])
@pytest.mark.parametrize("mode", MODES)
def test_bias_modes(handle, rng, mode, bias):
    """GRU single-bias modes differ: the recurrent bias sits inside r * (R h + b_R)."""
    run_case(handle, rng, mode, 1, L=1, bias=bias, lengths=(3, 3))


def test_lstm_projection_and_clipping(handle, rng):
    net, ys = run_case(handle, rng, cc.CUDNN_LSTM, 2, P=2, clip=(-0.3, 0.35), layout=PACKED, lengths=(4, 4, 2),
                       training=True, scale=1.5)
    assert net["P"] == 2 and ys[0].shape == (4, 4)


def test_clipping_changes_the_result(handle, rng):
    """With a tight clip the cell state saturates; without it the same weights give other outputs."""
    r1 = np.random.default_rng(5)
    _, clipped = run_case(handle, r1, cc.CUDNN_LSTM, 1, clip=(-0.05, 0.05), scale=2.0, lengths=(3, 3))
    r2 = np.random.default_rng(5)
    _, free = run_case(handle, r2, cc.CUDNN_LSTM, 1, scale=2.0, lengths=(3, 3))
    assert np.abs(clipped[0] - free[0]).max() > 1e-3


@pytest.mark.parametrize("mode", [cc.CUDNN_RNN_TANH, cc.CUDNN_GRU])
def test_skip_input(handle, rng, mode):
    run_case(handle, rng, mode, 2, I=4, H=4, skip=True, lengths=(3, 2))


def test_null_states_and_outputs(handle, rng):
    """hx/cx NULL mean zeros; hy/cy NULL are not written (002 §7.2.36)."""
    net = make_net(handle, cc.CUDNN_LSTM, D=2, L=2, rng=rng)
    lengths, T = (2, 3, 0), 3
    xs = [rng.standard_normal((n, 3)) for n in lengths]
    ys, hy, cy, _ = forward(handle, net, xs, SEQ, lengths, T, want_c=False)
    rys, rhy, _ = reference(net, xs)
    for a, b in zip(ys, rys):
        np.testing.assert_allclose(a, b, atol=1e-12)
    np.testing.assert_allclose(hy, rhy, atol=1e-12)  # a zero-length sequence keeps hx (= 0)
    assert np.all(cy == -7.0)


def test_training_equals_inference_and_fills_padding(handle, rng):
    net = make_net(handle, cc.CUDNN_GRU, D=2, L=3, rng=rng)
    lengths, T = (1, 3, 2), 3
    xs = [rng.standard_normal((n, 3)) for n in lengths]
    a = forward(handle, net, xs, BATCH, lengths, T, training=False, fill=0.25)
    b = forward(handle, net, xs, BATCH, lengths, T, training=True, fill=0.25)
    for u, v in zip(a[0], b[0]):
        np.testing.assert_array_equal(u, v)
    y = b[3]["y"].reshape(3, T, -1)  # batch-major
    assert np.all(y[0, 1:] == 0.25) and np.all(y[2, 2:] == 0.25) and not np.any(y[1] == 0.25)


@pytest.mark.parametrize("dtype,prec,atol", [(np.float32, None, 2e-5), (np.float16, None, 3e-2),
                                             (np.float16, cc.CUDNN_DATA_HALF, 5e-2)])
def test_reduced_precision(handle, rng, dtype, prec, atol):
    """FLOAT data computes in float; HALF data in float (mathPrec FLOAT) or half (mathPrec HALF)."""
    run_case(handle, rng, cc.CUDNN_LSTM, 2, dtype=dtype, atol=atol, lengths=(3, 2, 2), mathPrec=prec)


def test_repeated_call_hits_the_plan_cache(handle, rng):
    net = make_net(handle, cc.CUDNN_RNN_TANH, D=1, L=2, rng=rng)
    lengths = (2, 2)
    xs = [rng.standard_normal((2, 3)) for _ in lengths]
    forward(handle, net, xs, SEQ, lengths, 2)
    before = cc.plan_cache_info()
    forward(handle, net, xs, SEQ, lengths, 2)
    after = cc.plan_cache_info()
    assert after.misses == before.misses and after.hits >= before.hits + 2  # 1 graph per layer
