"""cudnnRNNBackwardData_v8 and cudnnRNNBackwardWeights_v8 (002 §8.2.18, §8.2.21) against central
finite differences of the numpy reference of the cell equations, in float64 on tiny networks:
dx, dhx, dcx and every weight and bias (located through cudnnGetRNNWeightParams on dw)."""
import math

import numpy as np
import pytest

import cudnn_compat as cc
from test_dropout import expected_mask
from test_rnn_reference import GATES, forward, make_net, pack, reference, unpack

SEQ, PACKED, BATCH = (cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED,
                      cc.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED)
EPS = 1e-6


def sample(shape, rng, k=4):
    """Up to k element indices of an array: the first, the last and random ones between."""
    idx = list(np.ndindex(*shape))
    if len(idx) <= k:
        return idx
    pick = {0, len(idx) - 1} | set(rng.choice(len(idx), k - 2, replace=False).tolist())
    return [idx[i] for i in sorted(pick)]


def weight_targets(net, p, lid):
    """(matrix, bias) arrays of the reference weights for linLayerID ``lid``."""
    g = GATES[net["mode"]]
    w = net["weights"][p]
    if lid == 2 * g:
        return w["Wr"], None
    side, k = ("W", lid) if lid < g else ("R", lid - g)
    bias = w["b" + side][k] if w["b" + side] is not None else None
    return (w[side][k] if w[side] is not None else None), bias


def check_gradients(handle, rng, mode, D=1, L=2, layout=SEQ, lengths=(2, 3, 2), T=3, states=True, dropout=None,
                    **kw):
    net = make_net(handle, mode, D=D, L=L, I=kw.pop("I", 2), H=2, rng=rng, dropout=dropout, **kw)
    B, I, H, P = len(lengths), net["I"], net["H"], net["P"]
    lstm = mode == cc.CUDNN_LSTM
    xs = [rng.standard_normal((n, I)) for n in lengths]
    hx = rng.standard_normal((L * D, B, P)) if states else None
    cx = rng.standard_normal((L * D, B, H)) if states else None
    ys, hy, cy, st = forward(handle, net, xs, layout, lengths, T, hx, cx, training=True)
    drop = None
    if dropout is not None:
        # layer l's input mask: Philox over the (rows, D*P) output buffer of layer l-1 (SEQ layout:
        # row t*B + b), counters continuing from one layer to the next
        p, _, seed = cc.cudnnGetDropoutDescriptor(dropout, handle)
        n, masks = T * B * D * P, {}
        for l in range(1, L):
            m = expected_mask(seed, (l - 1) * math.ceil(n / 4), n, p).reshape(T, B, D * P)
            masks[l] = [m[:, b] for b in range(B)]
        drop = (masks, np.float64(np.float32(1) / (np.float32(1) - np.float32(p))))
    want = reference(net, xs, hx, cx if lstm else None, drop)
    for a, b in zip(ys, want[0]):
        np.testing.assert_allclose(a, b, atol=1e-12)
    wy = [rng.standard_normal(y.shape) for y in ys]
    wh, wc = rng.standard_normal(hy.shape), rng.standard_normal(cy.shape)
    dy = np.nan_to_num(pack(wy, layout, T, D * P, np.float64))
    dx = np.full(st["x"].shape, np.nan)
    dhx, dcx = np.full(hy.size, np.nan), np.full(cy.size, np.nan)
    flat = (lambda a: None if a is None else a.reshape(-1))
    cc.cudnnRNNBackwardData_v8(handle, net["desc"], st["seq"], st["yd"], st["y"], dy, st["xd"], dx, st["hdesc"], flat(hx),
                               wh.reshape(-1), dhx, st["cdesc"] if lstm else None, flat(cx) if lstm else None,
                               wc.reshape(-1) if lstm else None, dcx if lstm else None, net["wsize"], net["wspace"],
                               st["ws_size"], st["ws"], st["rs_size"], st["rs"])
    dw = np.zeros(net["wsize"], np.uint8)
    cc.cudnnRNNBackwardWeights_v8(handle, net["desc"], cc.CUDNN_WGRAD_MODE_ADD, st["seq"], st["xd"], st["x"],
                                  st["hdesc"], flat(hx), st["yd"], st["y"], net["wsize"], dw, st["ws_size"], st["ws"],
                                  st["rs_size"], st["rs"])

    def loss():
        y2, h2, c2 = reference(net, xs, hx, cx if lstm else None, drop)
        s = sum((a * b).sum() for a, b in zip(y2, wy)) + (h2 * wh).sum()
        return s + ((c2 * wc).sum() if lstm else 0.0)

    def fd(arr, idx):
        old = arr[idx]
        arr[idx] = old + EPS
        up = loss()
        arr[idx] = old - EPS
        down = loss()
        arr[idx] = old
        return (up - down) / (2 * EPS)

    gx = unpack(dx, layout, lengths, T, I)
    for b in range(B):
        for idx in np.ndindex(*xs[b].shape):
            assert abs(fd(xs[b], idx) - gx[b][idx]) < 1e-7, ("dx", b, idx)
    if states:
        for name, arr, got in (("dhx", hx, dhx), ("dcx", cx, dcx)):
            if name == "dcx" and not lstm:
                continue
            got = got.reshape(arr.shape)
            for idx in sample(arr.shape, rng, 8):
                assert abs(fd(arr, idx) - got[idx]) < 1e-7, (name, idx)
    md, bd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    g = GATES[mode]
    checked = 0
    for p in range(L * D):
        for lid in range(2 * g + (1 if lstm else 0)):
            gm, gb = cc.cudnnGetRNNWeightParams(handle, net["desc"], p, net["wsize"], dw, lid, md, bd)
            tm, tb = weight_targets(net, p, lid)
            for got, tgt in ((gm, tm), (gb, tb)):
                assert (got is None) == (tgt is None)
                if got is None:
                    continue
                got = got.reshape(tgt.shape)
                for idx in sample(tgt.shape, rng):
                    assert abs(fd(tgt, idx) - got[idx]) < 1e-7, ("dw", p, lid, idx)
                    checked += 1
    assert checked > 0
    return dx, dw


MODES = [cc.CUDNN_RNN_RELU, cc.CUDNN_RNN_TANH, cc.CUDNN_LSTM, cc.CUDNN_GRU]


@pytest.mark.parametrize("D", [1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_padded_batch(handle, rng, mode, D):
    check_gradients(handle, rng, mode, D, layout=SEQ, lengths=(2, 3, 1))


@pytest.mark.parametrize("mode", [cc.CUDNN_LSTM, cc.CUDNN_GRU])
def test_gradients_packed_and_batch_major(handle, rng, mode):
    check_gradients(handle, rng, mode, 2, layout=PACKED, lengths=(3, 2, 2))
    check_gradients(handle, rng, mode, 1, layout=BATCH, lengths=(2, 3, 3))


def test_gradients_projection_clipping_no_states(handle, rng):
    check_gradients(handle, rng, cc.CUDNN_LSTM, 2, P=1, clip=(-0.4, 0.45), scale=1.2)
    check_gradients(handle, rng, cc.CUDNN_LSTM, 1, states=False, lengths=(3, 3))


@pytest.mark.parametrize("bias", [cc.CUDNN_RNN_NO_BIAS, cc.CUDNN_RNN_SINGLE_INP_BIAS, cc.CUDNN_RNN_SINGLE_REC_BIAS])
def test_gradients_gru_bias_modes(handle, rng, bias):
    check_gradients(handle, rng, cc.CUDNN_GRU, 1, L=1, bias=bias, layout=BATCH)


def test_gradients_skip_input(handle, rng):
    check_gradients(handle, rng, cc.CUDNN_GRU, 2, skip=True, I=2)


def test_gradients_with_interlayer_dropout(handle, rng):
    """Training-mode dropout between layers: the mask is Philox of the dropout states, over layer
    0's output buffer in the data layout; backward uses the mask saved in the reserve space."""
    d = cc.cudnnCreateDropoutDescriptor()
    st = np.zeros(cc.cudnnDropoutGetStatesSize(handle), np.uint8)
    cc.cudnnSetDropoutDescriptor(d, handle, 0.5, st, st.size, 77)
    check_gradients(handle, rng, cc.CUDNN_LSTM, 2, L=3, layout=SEQ, lengths=(2, 2), T=2, dropout=d)
    assert int(st[8:12].view(np.int32)[0]) == 2 * math.ceil(2 * 2 * 2 * 2 / 4)  # two masks drawn


def test_weight_gradients_accumulate(handle, rng):
    """CUDNN_WGRAD_MODE_ADD: a second call adds the same gradient again."""
    net = make_net(handle, cc.CUDNN_GRU, D=1, L=1, rng=rng)
    lengths = (2, 2)
    xs = [rng.standard_normal((2, 3)) for _ in lengths]
    _, _, _, st = forward(handle, net, xs, SEQ, lengths, 2, training=True)
    dy = rng.standard_normal(st["y"].size)
    dx = np.zeros(st["x"].size)
    cc.cudnnRNNBackwardData_v8(handle, net["desc"], st["seq"], st["yd"], st["y"], dy, st["xd"], dx, None, None, None,
                               None, None, None, None, None, net["wsize"], net["wspace"], st["ws_size"], st["ws"],
                               st["rs_size"], st["rs"])
    dw = np.zeros(net["wsize"] // 8)
    for _ in range(2):
        cc.cudnnRNNBackwardWeights_v8(handle, net["desc"], cc.CUDNN_WGRAD_MODE_ADD, st["seq"], st["xd"], st["x"], None,
                                      None, st["yd"], st["y"], net["wsize"], dw, st["ws_size"], st["ws"], st["rs_size"],
                                      st["rs"])
        if _ == 0:
            once = dw.copy()
    np.testing.assert_allclose(dw, 2 * once, rtol=1e-14)
    assert np.abs(once).max() > 0
