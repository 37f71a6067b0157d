"""The v6/v7 RNN API (002 §7.2.48, §7.2.24/25 LinLayer params, §7.2.28/§7.2.33/§8.2.14 sizes,
§7.2.37/38, §8.2.17-24 compute calls): weights filled through LinLayer pointers give the
reference equations' results, and every legacy call agrees with its v8 counterpart."""
import ctypes

import numpy as np
import pytest

import cudnn_compat as cc
from test_rnn_reference import GATES, data_desc, make_net, reference, tdesc3

D_ = cc.CUDNN_DATA_DOUBLE


def step_descs(batches, width, dt=D_):
    return [tdesc3((b, width, 1), dt) for b in batches]


def v6_net(handle, mode, D, L, H, mathPrec=D_, inputMode=cc.CUDNN_LINEAR_INPUT):
    drop = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnSetDropoutDescriptor(drop, handle, 0.0, None, 0, 0)
    d = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor_v6(handle, d, H, L, drop, inputMode, cc.CUDNN_BIDIRECTIONAL if D == 2 else
                                cc.CUDNN_UNIDIRECTIONAL, mode, cc.CUDNN_RNN_ALGO_STANDARD, mathPrec)
    return d, drop


def fill_linlayers(handle, d, mode, D, L, xd0, wdesc, w, rng):
    """Fill every matrix and bias through LinLayer pointers; returns reference weights."""
    g = GATES[mode]
    mdesc, bdesc = cc.cudnnCreateFilterDescriptor(), cc.cudnnCreateFilterDescriptor()
    weights = []
    for p in range(L * D):
        ww = {"W": [], "R": [], "bW": [], "bR": [], "Wr": None}
        for lid in range(2 * g):
            m = cc.cudnnGetRNNLinLayerMatrixParams(handle, d, p, xd0, wdesc, w, lid, mdesc)
            b = cc.cudnnGetRNNLinLayerBiasParams(handle, d, p, xd0, wdesc, w, lid, bdesc)
            _, _, nb, dims = cc.cudnnGetFilterNdDescriptor(mdesc)
            assert nb == 3 and tuple(dims) == m.shape and dims[0] == 1
            assert tuple(cc.cudnnGetFilterNdDescriptor(bdesc)[3]) == b.shape and b.shape[2] == 1
            m[...] = rng.standard_normal(m.shape) * 0.5
            b[...] = rng.standard_normal(b.shape) * 0.5
            side = "W" if lid < g else "R"
            ww[side].append(m[0].copy())
            ww["b" + side].append(b[0, :, 0].copy())
        weights.append(ww)
    return weights


def packed_to_seqs(buf, batches, V):
    rows = buf.reshape(-1, V)
    out = [[] for _ in range(batches[0])]
    r = 0
    for bt in batches:
        for b in range(bt):
            out[b].append(rows[r])
            r += 1
    return [np.array(o) for o in out]


@pytest.mark.parametrize("mode,D", [(cc.CUDNN_LSTM, 2), (cc.CUDNN_GRU, 1), (cc.CUDNN_RNN_RELU, 2)])
def test_legacy_calls_match_reference_and_v8(handle, rng, mode, D):
    L, I, H = 2, 3, 4
    batches = [3, 3, 2, 1]
    T, B = len(batches), batches[0]
    d, drop = v6_net(handle, mode, D, L, H)
    xds, yds = step_descs(batches, I), step_descs(batches, D * H)
    size = cc.cudnnGetRNNParamsSize(handle, d, xds[0], D_)
    wdesc = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wdesc, D_, cc.CUDNN_TENSOR_NCHW, 3, [size // 8, 1, 1])
    w = np.zeros(size // 8)
    weights = fill_linlayers(handle, d, mode, D, L, xds[0], wdesc, w, rng)
    N = sum(batches)
    x = rng.standard_normal(N * I)
    hx = rng.standard_normal((L * D, B, H))
    cx = rng.standard_normal((L * D, B, H))
    hd = tdesc3((L * D, B, H), D_)
    ws_size = cc.cudnnGetRNNWorkspaceSize(handle, d, T, xds)
    rs_size = cc.cudnnGetRNNTrainingReserveSize(handle, d, T, xds)
    ws, rs = np.zeros(ws_size, np.uint8), np.zeros(rs_size, np.uint8)
    y, hy, cy = np.zeros(N * D * H), np.zeros(hx.size), np.zeros(cx.size)
    cc.cudnnRNNForwardTraining(handle, d, T, xds, x, hd, hx, hd, cx, wdesc, w, yds, y, hd, hy, hd, cy, ws, ws_size,
                               rs, rs_size)
    net = {"L": L, "D": D, "H": H, "P": H, "mode": mode, "bias": cc.CUDNN_RNN_DOUBLE_BIAS, "weights": weights}
    rys, rhy, rcy = reference(net, packed_to_seqs(x, batches, I), hx, cx if mode == cc.CUDNN_LSTM else None)
    for a, b in zip(packed_to_seqs(y, batches, D * H), rys):
        np.testing.assert_allclose(a, b, atol=1e-12)
    np.testing.assert_allclose(hy.reshape(rhy.shape), rhy, atol=1e-12)
    if mode == cc.CUDNN_LSTM:
        np.testing.assert_allclose(cy.reshape(rcy.shape), rcy, atol=1e-12)
    y_inf = np.zeros_like(y)
    cc.cudnnRNNForwardInference(handle, d, T, xds, x, hd, hx, hd, cx, wdesc, w, yds, y_inf, hd, None, hd, None, ws,
                                ws_size)
    np.testing.assert_array_equal(y_inf, y)

    # the same bytes as a v8 weight space
    d8 = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor_v8(d8, cc.CUDNN_RNN_ALGO_STANDARD, mode, cc.CUDNN_RNN_DOUBLE_BIAS,
                                cc.CUDNN_BIDIRECTIONAL if D == 2 else cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_LINEAR_INPUT,
                                D_, D_, cc.CUDNN_DEFAULT_MATH, I, H, H, L, drop, 0)
    assert cc.cudnnGetRNNWeightSpaceSize(handle, d8) == size
    lengths = [sum(1 for bt in batches if bt > b) for b in range(B)]
    xd8 = data_desc(D_, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, T, B, I, lengths)
    yd8 = data_desc(D_, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, T, B, D * H, lengths)
    ws8, rs8 = cc.cudnnGetRNNTempSpaceSizes(handle, d8, cc.CUDNN_FWD_MODE_TRAINING, xd8)
    w8s, r8 = np.zeros(ws8, np.uint8), np.zeros(rs8, np.uint8)
    y8 = np.zeros_like(y)
    seq = np.array(lengths, np.int32)
    cc.cudnnRNNForward(handle, d8, cc.CUDNN_FWD_MODE_TRAINING, seq, xd8, x, yd8, y8, hd, hx, None, hd, cx, None,
                       size, w, ws8, w8s, rs8, r8)
    np.testing.assert_array_equal(y8, y)

    # backward: legacy and v8 give the same numbers
    dy = rng.standard_normal(y.size)
    dhy = rng.standard_normal(hx.size)
    dcy = rng.standard_normal(cx.size)
    out_l = [np.zeros(x.size), np.zeros(hx.size), np.zeros(cx.size)]
    out_8 = [np.zeros(x.size), np.zeros(hx.size), np.zeros(cx.size)]
    cc.cudnnRNNBackwardData(handle, d, T, yds, y, yds, dy, hd, dhy, hd, dcy, wdesc, w, hd, hx, hd, cx, xds, out_l[0],
                            hd, out_l[1], hd, out_l[2], ws, ws_size, rs, rs_size)
    cc.cudnnRNNBackwardData_v8(handle, d8, seq, yd8, y, dy, xd8, out_8[0], hd, hx, dhy, out_8[1], hd, cx, dcy, out_8[2],
                               size, w, ws8, w8s, rs8, r8)
    for a, b in zip(out_l, out_8):
        np.testing.assert_array_equal(a, b)
    assert np.abs(out_l[0]).max() > 0
    dw_l, dw_8 = np.zeros_like(w), np.zeros_like(w)
    cc.cudnnRNNBackwardWeights(handle, d, T, xds, x, hd, hx, yds, y, ws, ws_size, wdesc, dw_l, rs, rs_size)
    cc.cudnnRNNBackwardWeights_v8(handle, d8, cc.CUDNN_WGRAD_MODE_ADD, seq, xd8, x, hd, hx, yd8, y, size, dw_8, ws8,
                                  w8s, rs8, r8)
    np.testing.assert_array_equal(dw_l, dw_8)
    assert np.abs(dw_l).max() > 0


def test_ex_calls_with_padded_layout_match_v8(handle, rng):
    """RNN*Ex take RNN data descriptors; unpacked layouts need the padded-IO mode."""
    net = make_net(handle, cc.CUDNN_GRU, D=2, L=2, rng=rng, padded=False)
    d = net["desc"]
    lengths, T, B = [2, 3, 1], 3, 3
    layout = cc.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
    xd = data_desc(D_, layout, T, B, 3, lengths)
    yd = data_desc(D_, layout, T, B, 8, lengths)
    wdesc = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wdesc, D_, cc.CUDNN_TENSOR_NCHW, 3, [net["wsize"] // 8, 1, 1])
    hd = tdesc3((4, B, 4), D_)
    x = rng.standard_normal(T * B * 3)
    y = np.zeros(T * B * 8)
    ws, rs = (np.zeros(n, np.uint8) for n in (1 << 16, 1 << 16))
    args = (xd, x, hd, None, None, None, wdesc, net["wspace"], yd, y, hd, None, None, None,
            None, None, None, None, None, None, None, None, ws, ws.size)
    with pytest.raises(cc.CuDNNError) as e:  # padded IO disabled
        cc.cudnnRNNForwardTrainingEx(handle, d, *args, rs, rs.size)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "PADDED_IO" in str(e.value)
    cc.cudnnSetRNNPaddingMode(d, cc.CUDNN_RNN_PADDED_IO_ENABLED)
    assert cc.cudnnGetRNNPaddingMode(d) == cc.CUDNN_RNN_PADDED_IO_ENABLED
    cc.cudnnRNNForwardTrainingEx(handle, d, *args, rs, rs.size)
    y8 = np.zeros_like(y)
    rs8 = np.zeros_like(rs)
    seq = np.array(lengths, np.int32)
    cc.cudnnRNNForward(handle, d, cc.CUDNN_FWD_MODE_TRAINING, seq, xd, x, yd, y8, hd, None, None, None, None, None,
                       net["wsize"], net["wspace"], ws.size, ws, rs8.size, rs8)
    valid = [(b * T + t) for b in range(B) for t in range(lengths[b])]
    np.testing.assert_array_equal(y.reshape(-1, 8)[valid], y8.reshape(-1, 8)[valid])
    y_inf = np.zeros_like(y)
    cc.cudnnRNNForwardInferenceEx(handle, d, *args[:9], y_inf, *args[10:])
    np.testing.assert_array_equal(y_inf.reshape(-1, 8)[valid], y8.reshape(-1, 8)[valid])
    dy = rng.standard_normal(y.size)
    dx_l, dx_8 = np.zeros(x.size), np.zeros(x.size)
    dhx_l, dhx_8 = np.zeros(4 * B * 4), np.zeros(4 * B * 4)
    cc.cudnnRNNBackwardDataEx(handle, d, yd, y, yd, dy, None, None, None, None, None, None, wdesc, net["wspace"],
                              hd, None, None, None, xd, dx_l, hd, dhx_l, None, None, None, None, ws, ws.size, rs, rs.size)
    cc.cudnnRNNBackwardData_v8(handle, d, seq, yd, y8, dy, xd, dx_8, hd, None, None, dhx_8, None, None, None, None,
                               net["wsize"], net["wspace"], ws.size, ws, rs8.size, rs8)
    np.testing.assert_array_equal(dx_l, dx_8)
    np.testing.assert_array_equal(dhx_l, dhx_8)
    dw_l, dw_8 = np.zeros(net["wsize"] // 8), np.zeros(net["wsize"] // 8)
    cc.cudnnRNNBackwardWeightsEx(handle, d, xd, x, hd, None, yd, y, ws, ws.size, wdesc, dw_l, rs, rs.size)
    cc.cudnnRNNBackwardWeights_v8(handle, d, cc.CUDNN_WGRAD_MODE_ADD, seq, xd, x, hd, None, yd, y8, net["wsize"],
                                  dw_8, ws.size, ws, rs8.size, rs8)
    np.testing.assert_array_equal(dw_l, dw_8)


def test_weight_layout_order_and_absent_blocks(handle):
    """Per pseudo-layer: W of each gate, then R of each gate, [projection,] then the biases; blocks
    tile the buffer.  Absent matrices (SKIP_INPUT layer 0, no projection) give NULL and nbDims 0."""
    d = cc.cudnnCreateRNNDescriptor()
    I = H = 4
    cc.cudnnSetRNNDescriptor_v8(d, cc.CUDNN_RNN_ALGO_STANDARD, cc.CUDNN_LSTM, cc.CUDNN_RNN_DOUBLE_BIAS,
                                cc.CUDNN_BIDIRECTIONAL, cc.CUDNN_SKIP_INPUT, cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_FLOAT,
                                cc.CUDNN_DEFAULT_MATH, I, H, H, 2, None, 0)
    size = cc.cudnnGetRNNWeightSpaceSize(handle, d)
    base = 1 << 20  # a fake address (a ctypes pointer, as on the CPU place every host pointer is): only offsets are computed
    md, bd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    spans = []
    for p in range(4):
        mats, biases = [], []
        for lid in range(9):
            m, b = cc.cudnnGetRNNWeightParams(handle, d, p, size, ctypes.c_void_p(base), lid, md, bd)
            m, b = (None if v is None else v.value for v in (m, b))
            if lid == 8 or (p < 2 and lid < 4):  # no projection; no layer-0 input matrices
                assert m is None and cc.cudnnGetTensorNdDescriptor(md)[1] == 0
            else:
                dims = cc.cudnnGetTensorNdDescriptor(md)[2]
                mats.append((m - base, dims[1] * dims[2]))
            if b is not None:
                biases.append((b - base, cc.cudnnGetTensorNdDescriptor(bd)[2][1]))
        assert [o for o, _ in mats] == sorted(o for o, _ in mats)
        assert max(o for o, _ in mats) < min(o for o, _ in biases)
        spans += mats + biases
    spans.sort()
    pos = 0
    for off, n in spans:
        assert off == pos
        pos += n * 4
    assert pos == size


def test_descriptor_settings_roundtrip(handle):
    drop = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnSetDropoutDescriptor(drop, handle, 0.0, None, 0, 0)
    d = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor(handle, d, 8, 2, drop, cc.CUDNN_LINEAR_INPUT, cc.CUDNN_BIDIRECTIONAL, cc.CUDNN_LSTM,
                             cc.CUDNN_RNN_ALGO_STANDARD, cc.CUDNN_DATA_FLOAT)  # cuDNN 7's 10-argument form
    assert cc.cudnnGetRNNDescriptor_v6(handle, d) == (8, 2, drop, cc.CUDNN_LINEAR_INPUT, cc.CUDNN_BIDIRECTIONAL,
                                                      cc.CUDNN_LSTM, cc.CUDNN_RNN_ALGO_STANDARD, cc.CUDNN_DATA_FLOAT)
    for fn in (lambda: cc.cudnnGetRNNDescriptor_v8(d), lambda: cc.cudnnGetRNNWeightSpaceSize(handle, d)):
        with pytest.raises(cc.CuDNNError) as e:
            fn()
        assert e.value.status == cc.CUDNN_STATUS_NOT_INITIALIZED
    cc.cudnnSetRNNBiasMode(d, cc.CUDNN_RNN_SINGLE_REC_BIAS)
    cc.cudnnSetRNNMatrixMathType(d, cc.CUDNN_TENSOR_OP_MATH)
    cc.cudnnSetRNNProjectionLayers(handle, d, 5, 0)
    cc.cudnnRNNSetClip(handle, d, cc.CUDNN_RNN_CLIP_MINMAX, cc.CUDNN_PROPAGATE_NAN, -1.5, 2.0)
    assert cc.cudnnGetRNNBiasMode(d) == cc.CUDNN_RNN_SINGLE_REC_BIAS
    assert cc.cudnnGetRNNMatrixMathType(d) == cc.CUDNN_TENSOR_OP_MATH
    assert cc.cudnnGetRNNProjectionLayers(handle, d) == (5, 0)
    assert cc.cudnnRNNGetClip(handle, d) == (cc.CUDNN_RNN_CLIP_MINMAX, cc.CUDNN_PROPAGATE_NAN, -1.5, 2.0)
    assert cc.cudnnRNNGetClip_v8(d) == cc.cudnnRNNGetClip(handle, d)
    # cuDNN 5's 8-argument form resets the projection and keeps the settings made by setters
    cc.cudnnSetRNNDescriptor(d, 6, 1, drop, cc.CUDNN_SKIP_INPUT, cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_GRU,
                             cc.CUDNN_DATA_DOUBLE)
    assert cc.cudnnGetRNNDescriptor(handle, d)[:3] == (6, 1, drop)
    assert cc.cudnnGetRNNProjectionLayers(handle, d) == (6, 0)
    assert cc.cudnnGetRNNBiasMode(d) == cc.CUDNN_RNN_SINGLE_REC_BIAS
    # v8 set/get
    d8 = cc.cudnnCreateRNNDescriptor()
    args = (cc.CUDNN_RNN_ALGO_PERSIST_DYNAMIC, cc.CUDNN_RNN_TANH, cc.CUDNN_RNN_DOUBLE_BIAS, cc.CUDNN_BIDIRECTIONAL,
            cc.CUDNN_LINEAR_INPUT, cc.CUDNN_DATA_HALF, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_OP_MATH, 7, 9, 9, 3, drop,
            cc.CUDNN_RNN_PADDED_IO_ENABLED)
    cc.cudnnSetRNNDescriptor_v8(d8, *args)
    assert cc.cudnnGetRNNDescriptor_v8(d8) == args
    plan = cc.cudnnCreatePersistentRNNPlan(d8, 4, cc.CUDNN_DATA_HALF)
    cc.cudnnSetPersistentRNNPlan(d8, plan)
    cc.cudnnBuildRNNDynamic(handle, d8, 4)
    cc.cudnnDestroyPersistentRNNPlan(plan)
    with pytest.raises(cc.CuDNNError) as e:  # the plan goes with PERSIST_DYNAMIC only
        cc.cudnnSetPersistentRNNPlan(d, cc.cudnnCreatePersistentRNNPlan(d8, 4, cc.CUDNN_DATA_HALF))
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    # RNN data descriptor
    rd = cc.cudnnCreateRNNDataDescriptor()
    fill = np.array(0.5)
    cc.cudnnSetRNNDataDescriptor(rd, D_, cc.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, 5, 3, 2, [5, 0, 2],
                                 ctypes.c_void_p(fill.ctypes.data))  # a host pointer (docs/conventions.md)
    assert cc.cudnnGetRNNDataDescriptor(rd, 2) == (D_, cc.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, 5, 3, 2, [5, 0],
                                                   0.5)
    cc.cudnnDestroyRNNDataDescriptor(rd)
    cc.cudnnDestroyRNNDescriptor(d)


def test_pointer_arguments_as_cupy_passed_them(handle, rng):
    """Descriptor arrays as a host pointer to handles, data as host pointers (ctypes.c_void_p on the CPU
    place: a plain int there is BAD_PARAM, docs/conventions.md "Data")."""
    mode, D, L, I, H = cc.CUDNN_RNN_TANH, 1, 1, 2, 3
    batches = [2, 1]
    d, _ = v6_net(handle, mode, D, L, H)
    xds, yds = step_descs(batches, I), step_descs(batches, H)
    xarr = (ctypes.c_size_t * 2)(*[int(v) for v in xds])
    yarr = (ctypes.c_size_t * 2)(*[int(v) for v in yds])
    size = cc.getRNNParamsSize(handle, d, xds[0], D_)
    wdesc = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wdesc, D_, cc.CUDNN_TENSOR_NCHW, 3, [size // 8, 1, 1])
    w = rng.standard_normal(size // 8)
    x = rng.standard_normal(3 * I)
    ws = np.zeros(cc.getRNNWorkspaceSize(handle, d, 2, ctypes.addressof(xarr)), np.uint8)
    y1, y2 = np.zeros(3 * H), np.zeros(3 * H)
    P = ctypes.c_void_p
    cc.RNNForwardInference(handle, d, 2, ctypes.addressof(xarr), P(x.ctypes.data), None, None, None, None, wdesc,
                           P(w.ctypes.data), ctypes.addressof(yarr), P(y1.ctypes.data), None, None, None, None,
                           P(ws.ctypes.data), ws.size)
    cc.cudnnRNNForwardInference(handle, d, 2, xds, x, None, None, None, None, wdesc, w, yds, y2, None, None, None,
                                None, ws, ws.size)
    np.testing.assert_array_equal(y1, y2)
    assert np.abs(y1).max() > 0
    with pytest.raises(cc.CuDNNError) as e:  # the int itself: BAD_PARAM on the CPU place, y untouched
        cc.RNNForwardInference(handle, d, 2, ctypes.addressof(xarr), x.ctypes.data, None, None, None, None, wdesc,
                               w, ctypes.addressof(yarr), y1, None, None, None, None, ws, ws.size)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "c_void_p" in str(e.value)
    np.testing.assert_array_equal(y1, y2)


def test_algorithm_search_runs_the_call(handle, rng):
    """The deprecated Find*AlgorithmEx run the call once and report CUDNN_RNN_ALGO_STANDARD."""
    mode, D, L, I, H = cc.CUDNN_LSTM, 1, 1, 2, 3
    batches = [2, 2]
    d, _ = v6_net(handle, mode, D, L, H)
    for fn in (cc.cudnnGetRNNForwardInferenceAlgorithmMaxCount, cc.cudnnGetRNNForwardTrainingAlgorithmMaxCount,
               cc.cudnnGetRNNBackwardDataAlgorithmMaxCount):
        assert fn(handle, d) >= 1
    xds, yds = step_descs(batches, I), step_descs(batches, H)
    size = cc.cudnnGetRNNParamsSize(handle, d, xds[0], D_)
    wdesc = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wdesc, D_, cc.CUDNN_TENSOR_NCHW, 3, [size // 8, 1, 1])
    w = rng.standard_normal(size // 8) * 0.5
    x = rng.standard_normal(4 * I)
    ws = np.zeros(cc.cudnnGetRNNWorkspaceSize(handle, d, 2, xds), np.uint8)
    rs = np.zeros(cc.cudnnGetRNNTrainingReserveSize(handle, d, 2, xds), np.uint8)
    y_find, y_ref = np.zeros(4 * H), np.zeros(4 * H)
    perfs = cc.cudnnFindRNNForwardTrainingAlgorithmEx(handle, d, 2, xds, x, None, None, None, None, wdesc, w, yds,
                                                      y_find, None, None, None, None, 1.0, 4, ws, ws.size, rs, rs.size)
    algo_desc, status, ms, memory = cc.cudnnGetAlgorithmPerformance(perfs[0])
    assert len(perfs) == 1 and status == cc.CUDNN_STATUS_SUCCESS and ms >= 0 and memory == ws.size
    assert cc.cudnnGetAlgorithmDescriptor(algo_desc) == cc.CUDNN_RNN_ALGO_STANDARD
    cc.cudnnRNNForwardInference(handle, d, 2, xds, x, None, None, None, None, wdesc, w, yds, y_ref, None, None, None,
                                None, ws, ws.size)
    np.testing.assert_array_equal(y_find, y_ref)
    cc.cudnnFindRNNForwardInferenceAlgorithmEx(handle, d, 2, xds, x, None, None, None, None, wdesc, w, yds, y_find,
                                               None, None, None, None, 0.0, 1, ws, ws.size)
    dx = np.zeros(x.size)
    cc.cudnnFindRNNBackwardDataAlgorithmEx(handle, d, 2, yds, y_ref, yds, np.ones(y_ref.size), None, None, None, None,
                                           wdesc, w, None, None, None, None, xds, dx, None, None, None, None, 1.0, 1,
                                           ws, ws.size, rs, rs.size)
    dw = np.zeros_like(w)
    cc.cudnnFindRNNBackwardWeightsAlgorithmEx(handle, d, 2, xds, x, None, None, yds, y_ref, 1.0, 1, ws, ws.size, wdesc,
                                              dw, rs, rs.size)
    assert np.abs(dx).max() > 0 and np.abs(dw).max() > 0
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnFindRNNForwardInferenceAlgorithmEx(handle, d, 2, xds, x, None, None, None, None, wdesc, w, yds, y_find,
                                                   None, None, None, None, 0.0, 0, ws, ws.size)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "cudnnFindRNNForwardInferenceAlgorithmEx" in str(e.value)
    # cudnnSetRNNAlgorithmDescriptor takes the algo from an algorithm descriptor
    ad = cc.cudnnCreateAlgorithmDescriptor()
    cc.cudnnSetAlgorithmDescriptor(ad, cc.CUDNN_RNN_ALGO_PERSIST_STATIC)
    cc.cudnnSetRNNAlgorithmDescriptor(handle, d, ad)
    assert cc.cudnnGetRNNDescriptor_v6(handle, d)[6] == cc.CUDNN_RNN_ALGO_PERSIST_STATIC
    cc.cudnnSetAlgorithmDescriptor(ad, 77)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetRNNAlgorithmDescriptor(handle, d, ad)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
