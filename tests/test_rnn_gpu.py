"""RNN and dropout on a GPU handle (CuPy buffers; the recurrence runs in the cupy engine's
RNNRecurrence programs): against the REAL cudnnRNNForward of libcudnn 9 (v8 API, through
cudnn_compat/_backend/legacy_cudnn_rnn) on identical weights placed through each side's
cudnnGetRNNWeightParams, LSTM and GRU, fp32 and fp16, uni- and bidirectional, padded batches of
varied lengths; our v6-API calls against the same real v8 results; GPU backward and dropout
masks against the CPU handle (masks bit for bit).  Skipped without a CUDA GPU."""
import numpy as np
import pytest

import cudnn_compat as cc
from _tolerance import assert_close
from cudnn_compat.rnn import core as rnn_core
from cudnn_compat.rnn.desc import rnn_desc

pytestmark = pytest.mark.gpu

MODES = {"LSTM": cc.CUDNN_LSTM, "GRU": cc.CUDNN_GRU, "TANH": cc.CUDNN_RNN_TANH, "RELU": cc.CUDNN_RNN_RELU}
DT = {"float16": cc.CUDNN_DATA_HALF, "float32": cc.CUDNN_DATA_FLOAT, "float64": cc.CUDNN_DATA_DOUBLE}
NP = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
MATH = {"DEFAULT_MATH": cc.CUDNN_DEFAULT_MATH, "TENSOR_OP_MATH": cc.CUDNN_TENSOR_OP_MATH, "FMA_MATH": cc.CUDNN_FMA_MATH}
SEQ = cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED


@pytest.fixture(scope="module")
def gpu():
    h = cc.create("gpu")
    yield h
    cc.destroy(h)


@pytest.fixture(scope="module")
def cpu():
    h = cc.create("cpu")
    yield h
    cc.destroy(h)


@pytest.fixture(scope="module")
def real(legacy_handle):
    """A real handle (conftest's ``legacy_handle``: skips only where libcudnn 9 is absent)."""
    return legacy_handle


def cp():
    import cupy
    return cupy


def our_net(cpu, mode, D, L, I, H, dtype, math, rng, dropout=0.0, seed=0, scale=0.3):
    """Our descriptor (v8) and a host weight space filled through our GetRNNWeightParams; returns
    (desc, host weight space, {(pseudo, lin): (matrix, bias)})."""
    drop = cc.cudnnCreateDropoutDescriptor()
    if dropout:  # the states are (re)set per handle by the test
        cc.cudnnSetDropoutDescriptor(drop, cpu, dropout, np.zeros(64, np.uint8), 64, seed)
    else:
        cc.cudnnSetDropoutDescriptor(drop, cpu, 0.0, None, 0, 0)
    d = cc.cudnnCreateRNNDescriptor()
    prec = cc.CUDNN_DATA_DOUBLE if dtype == "float64" else cc.CUDNN_DATA_FLOAT
    cc.cudnnSetRNNDescriptor_v8(d, cc.CUDNN_RNN_ALGO_STANDARD, MODES[mode], cc.CUDNN_RNN_DOUBLE_BIAS,
                                cc.CUDNN_BIDIRECTIONAL if D == 2 else cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_LINEAR_INPUT,
                                DT[dtype], prec, MATH[math], I, H, H, L, drop, cc.CUDNN_RNN_PADDED_IO_ENABLED)
    size = cc.cudnnGetRNNWeightSpaceSize(cpu, d)
    w = np.zeros(size, np.uint8)
    md, bd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    g = {"LSTM": 4, "GRU": 3}.get(mode, 1)
    values = {}
    for p in range(L * D):
        for lid in range(2 * g):
            m, b = cc.cudnnGetRNNWeightParams(cpu, d, p, size, w, lid, md, bd)
            m[...] = (rng.uniform(-1, 1, m.shape) * scale).astype(NP[dtype])
            b[...] = (rng.uniform(-1, 1, b.shape) * scale).astype(NP[dtype])
            values[(p, lid)] = (m[0].copy(), b[0, :, 0].copy())
    return d, w, values, drop


def run_ours(handle, d, w, dtype, D, L, I, H, T, lengths, x, hx, cx, training, outs=None, arr=None):
    """Our cudnnRNNForward; ``outs`` (y, hy, cy, workspace, reserve) reuses buffers; ``arr``: numpy
    for a CPU handle."""
    c = arr or cp()
    B = len(lengths)
    xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
    cc.cudnnSetRNNDataDescriptor(xd, DT[dtype], SEQ, T, B, I, list(lengths), None)
    cc.cudnnSetRNNDataDescriptor(yd, DT[dtype], SEQ, T, B, D * H, list(lengths), None)
    hd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(hd, DT[dtype], 3, [L * D, B, H], [B * H, H, 1])
    mode = cc.CUDNN_FWD_MODE_TRAINING if training else cc.CUDNN_FWD_MODE_INFERENCE
    ws, rs = cc.cudnnGetRNNTempSpaceSizes(handle, d, mode, xd)
    if outs is None:
        outs = (c.zeros((T, B, D * H), NP[dtype]), c.zeros_like(hx), c.zeros_like(cx), c.empty(max(ws, 1), c.uint8),
                c.empty(max(rs, 1), c.uint8))
    y, hy, cy, wsb, rsb = outs
    seq = c.asarray(np.asarray(lengths, np.int32))
    cc.cudnnRNNForward(handle, d, mode, seq, xd, x, yd, y, hd, hx, hy, hd, cx, cy, w.nbytes, w, ws, wsb, rs, rsb)
    return y, hy, cy, rsb


def run_real(rh, mode, D, L, I, H, T, lengths, dtype, math, values, x, hx, cx, training):
    from cudnn_compat._backend.legacy_cudnn_rnn import RealRNN
    c = cp()
    net = RealRNN(rh, mode, D, L, I, H, T, lengths, dtype=dtype, math=math)
    try:
        net.load_weights(values)
        y = c.zeros((T, len(lengths), D * H), NP[dtype])
        hy, cy = c.zeros_like(hx), c.zeros_like(cx)
        net.forward(training, x, y, hx, hy, cx if mode == "LSTM" else None, cy if mode == "LSTM" else None)
        c.cuda.Device().synchronize()
        return y, hy, cy
    finally:
        net.destroy()


def valid(y, lengths):
    y = y.get().astype(np.float64)
    return np.concatenate([y[:n, b] for b, n in enumerate(lengths)])


def f64_reference(cpu, mode, D, L, I, H, T, lengths, values, x, hx, cx):
    """Our forward on the CPU handle in float64 with the same weight values (the reference engine)."""
    d, w, _, _ = our_net(cpu, mode, D, L, I, H, "float64", "DEFAULT_MATH", np.random.default_rng(0))
    size = w.nbytes
    md, bd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    for (p, lid), (m, b) in values.items():
        mv, bv = cc.cudnnGetRNNWeightParams(cpu, d, p, size, w, lid, md, bd)
        mv[0] = m
        bv[0, :, 0] = b
    f64 = [np.asarray(v.get(), np.float64) for v in (x, hx, cx)]
    y, hy, cy, _ = run_ours(cpu, d, w, "float64", D, L, I, H, T, lengths, *f64, False, arr=np)
    return y, hy, cy


@pytest.mark.parametrize("D", [1, 2])
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
# precision classes (tests/_tolerance.py), relative to each element and to the array's largest magnitude:
# FMA_MATH: libcudnn's fp32 cells differ from float64 by up to ~3e-4 in c (fast activation functions),
# so ours vs libcudnn is the fp32_approx class (1e-3) while ours vs float64 is the fp32 class (1e-5; our
# fp32 LSTM is 1.2e-7 norm-wise from float64, docs/conventions.md); half data: fp16 (1e-2; a half ulp
# is 1e-3 at 1, a few ulps apart after 8 steps); DEFAULT_MATH: both sides may run TF32 GEMMs, tf32 (2e-3;
# ours measured 1.7e-4 norm-wise from float64)
@pytest.mark.parametrize("dtype, math, cls", [("float32", "FMA_MATH", "fp32_approx"),
                                              ("float16", "TENSOR_OP_MATH", "fp16"),
                                              ("float32", "DEFAULT_MATH", "tf32")])
def test_forward_matches_real_cudnn_v8(gpu, cpu, real, rng, mode, D, dtype, math, cls):
    """y, hy, cy of cudnnRNNForward, training and inference, on identical weights; padded batch.
    With FMA_MATH our fp32 result is also held to the float64 reference (fp32 class)."""
    if math == "DEFAULT_MATH" and (mode != "LSTM" or D != 2):
        pytest.skip("DEFAULT_MATH (TF32) checked once")
    c = cp()
    L, I, H, T = 2, 24, 32, 8
    lengths = (8, 8, 5, 8, 3, 8)
    B = len(lengths)
    d, w, values, _ = our_net(cpu, mode, D, L, I, H, dtype, math, rng)
    x = c.asarray(rng.uniform(-1, 1, (T, B, I)).astype(NP[dtype]))
    hx = c.asarray(rng.uniform(-1, 1, (L * D, B, H)).astype(NP[dtype]))
    cx = c.asarray(rng.uniform(-1, 1, (L * D, B, H)).astype(NP[dtype]))
    wd = c.asarray(w)
    exact = f64_reference(cpu, mode, D, L, I, H, T, lengths, values, x, hx, cx) if math == "FMA_MATH" else None
    for training in (False, True):
        y, hy, cy, _ = run_ours(gpu, d, wd, dtype, D, L, I, H, T, lengths, x, hx, cx, training)
        ry, rhy, rcy = run_real(real, mode, D, L, I, H, T, lengths, dtype, math, values, x, hx, cx, training)
        pairs = [("y", valid(y, lengths), valid(ry, lengths)), ("hy", hy.get(), rhy.get())]
        if mode == "LSTM":
            pairs.append(("cy", cy.get(), rcy.get()))
        for name, a, b in pairs:
            assert_close(a.astype(float), b.astype(float), cls, err_msg=f"{name} vs libcudnn")
        if exact is not None:
            ey, ehy, ecy = exact
            got = [("y", valid(y, lengths), valid(c.asarray(ey), lengths)), ("hy", hy.get(), ehy)]
            if mode == "LSTM":
                got.append(("cy", cy.get(), ecy))
            for name, a, b in got:
                assert_close(a.astype(float), b, "fp32", err_msg=f"{name} vs float64")


@pytest.mark.parametrize("D", [1, 2])
@pytest.mark.parametrize("mode", ["LSTM", "GRU", "TANH", "RELU"])
def test_backward_matches_real_cudnn_v8(gpu, cpu, real, rng, mode, D):
    """cudnnRNNBackwardData_v8 (dx, dhx, dcx) and cudnnRNNBackwardWeights_v8 (every matrix and bias of
    dw, CUDNN_WGRAD_MODE_ADD onto zeros) against the real functions, after a training forward on
    identical weights; padded batch, FMA_MATH float32: the fp32_approx class (libcudnn's cells use fast
    activation functions, ~3e-4 from float64; its gradients inherit that error)."""
    from cudnn_compat._backend.legacy_cudnn_rnn import RealRNN
    c = cp()
    L, I, H, T = 2, 12, 16, 6
    lengths = (6, 4, 6, 2, 5)
    B, dtype, lstm = len(lengths), "float32", mode == "LSTM"
    d, w, values, _ = our_net(cpu, mode, D, L, I, H, dtype, "FMA_MATH", rng)
    x = c.asarray(rng.uniform(-1, 1, (T, B, I)).astype(np.float32))
    hx, cx = (c.asarray(rng.uniform(-1, 1, (L * D, B, H)).astype(np.float32)) for _ in range(2))
    dy_host = rng.uniform(-1, 1, (T, B, D * H)).astype(np.float32)
    dy_host[np.arange(T)[:, None] >= np.asarray(lengths)[None, :]] = 0  # no gradient at padding positions
    dy = c.asarray(dy_host)
    dhy, dcy = (c.asarray(rng.uniform(-1, 1, (L * D, B, H)).astype(np.float32)) for _ in range(2))
    # ours
    wd = c.asarray(w)
    y, _, _, rsb = run_ours(gpu, d, wd, dtype, D, L, I, H, T, lengths, x, hx, cx, True)
    xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
    cc.cudnnSetRNNDataDescriptor(xd, DT[dtype], SEQ, T, B, I, list(lengths), None)
    cc.cudnnSetRNNDataDescriptor(yd, DT[dtype], SEQ, T, B, D * H, list(lengths), None)
    hd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(hd, DT[dtype], 3, [L * D, B, H], [B * H, H, 1])
    ws, rs = cc.cudnnGetRNNTempSpaceSizes(gpu, d, cc.CUDNN_FWD_MODE_TRAINING, xd)
    wsb, seq = c.empty(max(ws, 1), c.uint8), c.asarray(np.asarray(lengths, np.int32))
    dx, dhx, dcx = c.zeros_like(x), c.zeros_like(hx), c.zeros_like(cx)
    cc.cudnnRNNBackwardData_v8(gpu, d, seq, yd, y, dy, xd, dx, hd, hx, dhy, dhx, hd if lstm else None,
                               cx if lstm else None, dcy if lstm else None, dcx if lstm else None, w.nbytes, wd, ws, wsb,
                               rs, rsb)
    dw = c.zeros(w.nbytes, c.uint8)
    cc.cudnnRNNBackwardWeights_v8(gpu, d, cc.CUDNN_WGRAD_MODE_ADD, seq, xd, x, hd, hx, yd, y, w.nbytes, dw, ws, wsb,
                                  rs, rsb)
    md, bd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    dw_host = dw.get()
    ours = {}
    for key in values:
        m, b = cc.cudnnGetRNNWeightParams(cpu, d, key[0], w.nbytes, dw_host, key[1], md, bd)
        ours[key] = (m[0].astype(np.float64), b[0, :, 0].astype(np.float64))
    # the real library
    net = RealRNN(real, mode, D, L, I, H, T, lengths, dtype=dtype, math="FMA_MATH")
    try:
        net.load_weights(values)
        ry, rhy, rcy = c.zeros_like(y), c.zeros_like(hx), c.zeros_like(cx)
        net.forward(True, x, ry, hx, rhy, cx if lstm else None, rcy if lstm else None)
        rdx, rdhx, rdcx = c.zeros_like(x), c.zeros_like(hx), c.zeros_like(cx)
        net.backward_data(ry, dy, rdx, hx, dhy, rdhx, cx if lstm else None, dcy if lstm else None,
                          rdcx if lstm else None)
        rdw = c.zeros(max(net.wsize, 1), c.uint8)
        net.backward_weights(x, ry, rdw, hx)
        c.cuda.Device().synchronize()
        theirs = net.read_params(rdw)
    finally:
        net.destroy()
    pairs = [("dx", valid(dx, lengths), valid(rdx, lengths)), ("dhx", dhx.get(), rdhx.get())]
    if lstm:
        pairs.append(("dcx", dcx.get(), rdcx.get()))
    for name, a, b in pairs:
        assert_close(a.astype(float), b.astype(float), "fp32_approx", err_msg=f"{mode} D={D} {name} vs libcudnn")
    for key, (m, b) in ours.items():
        rm, rb = theirs[key]
        assert_close(m, rm, "fp32_approx", err_msg=f"{mode} D={D} dw matrix {key} vs libcudnn")
        assert_close(b, rb, "fp32_approx", err_msg=f"{mode} D={D} dw bias {key} vs libcudnn")


def test_v6_api_matches_real_v8(gpu, cpu, real, rng):
    """cudnnRNNForwardInference/Training (v6 descriptor, per-step descriptors, the same params
    bytes as the v8 weight space) agree with the real v8 cudnnRNNForward."""
    c = cp()
    mode, D, L, I, H, T, B = "LSTM", 2, 2, 16, 32, 6, 5
    F = cc.CUDNN_DATA_FLOAT
    _, w, values, drop = our_net(cpu, mode, D, L, I, H, "float32", "FMA_MATH", rng)
    d6 = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor_v6(cpu, d6, H, L, drop, cc.CUDNN_LINEAR_INPUT, cc.CUDNN_BIDIRECTIONAL, cc.CUDNN_LSTM,
                                cc.CUDNN_RNN_ALGO_STANDARD, F)
    cc.cudnnSetRNNMatrixMathType(d6, cc.CUDNN_FMA_MATH)

    def step(width):
        out = []
        for _ in range(T):
            t = cc.cudnnCreateTensorDescriptor()
            cc.cudnnSetTensorNdDescriptor(t, F, 3, [B, width, 1], [width, 1, 1])
            out.append(t)
        return out
    xds, yds = step(I), step(D * H)
    size = cc.cudnnGetRNNParamsSize(gpu, d6, xds[0], F)
    assert size == w.nbytes
    wdesc = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wdesc, F, cc.CUDNN_TENSOR_NCHW, 3, [size // 4, 1, 1])
    hd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(hd, F, 3, [L * D, B, H], [B * H, H, 1])
    x = c.asarray(rng.uniform(-1, 1, (T, B, I)).astype(np.float32))
    hx = c.asarray(rng.uniform(-1, 1, (L * D, B, H)).astype(np.float32))
    cx = c.asarray(rng.uniform(-1, 1, (L * D, B, H)).astype(np.float32))
    wd = c.asarray(w)
    ws_size = cc.cudnnGetRNNWorkspaceSize(gpu, d6, T, xds)
    rs_size = cc.cudnnGetRNNTrainingReserveSize(gpu, d6, T, xds)
    ws, rs = c.empty(ws_size, c.uint8), c.empty(rs_size, c.uint8)
    ry, rhy, rcy = run_real(real, mode, D, L, I, H, T, [T] * B, "float32", "FMA_MATH", values, x, hx, cx, False)
    for training in (False, True):
        y, hy, cy = c.zeros((T, B, D * H), c.float32), c.zeros_like(hx), c.zeros_like(cx)
        if training:
            cc.cudnnRNNForwardTraining(gpu, d6, T, xds, x, hd, hx, hd, cx, wdesc, wd, yds, y, hd, hy, hd, cy, ws,
                                       ws_size, rs, rs_size)
        else:
            cc.cudnnRNNForwardInference(gpu, d6, T, xds, x, hd, hx, hd, cx, wdesc, wd, yds, y, hd, hy, hd, cy, ws,
                                        ws_size)
        for a, b in ((y, ry), (hy, rhy), (cy, rcy)):
            np.testing.assert_allclose(a.get(), b.get(), atol=2e-4, rtol=2e-4)


def test_dropout_masks_on_gpu_bit_identical_to_cpu(gpu, cpu, rng):
    c = cp()
    shape = (4, 3, 17, 5)
    x = rng.standard_normal(shape).astype(np.float32)
    xd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptorEx(xd, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 4, list(shape))
    size = cc.cudnnDropoutGetReserveSpaceSize(xd)
    out = {}
    for name, h, arr in (("cpu", cpu, np), ("gpu", gpu, c)):
        drop = cc.cudnnCreateDropoutDescriptor()
        states = arr.zeros(cc.cudnnDropoutGetStatesSize(h), arr.uint8)
        cc.cudnnSetDropoutDescriptor(drop, h, 0.35, states, states.nbytes, 0x1234567890AB)
        ys, masks = [], []
        for _ in range(2):  # the second draw continues the states' counter
            y, rs = arr.zeros(shape, arr.float32), arr.zeros(size, arr.uint8)
            cc.cudnnDropoutForward(h, drop, xd, arr.asarray(x), xd, y, rs, size)
            ys.append(y if arr is np else y.get())
            masks.append(rs if arr is np else rs.get())
        out[name] = (ys, masks, states if arr is np else states.get())
    for a, b in zip(out["cpu"][1], out["gpu"][1]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(out["cpu"][0], out["gpu"][0]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(out["cpu"][2], out["gpu"][2])
    assert not np.array_equal(out["cpu"][1][0], out["cpu"][1][1])


def test_rnn_training_with_dropout_and_backward_on_gpu_match_cpu(gpu, cpu, rng):
    """float64 LSTM with inter-layer dropout: forward (masks in the reserve space bit for bit),
    backward data and weights on the GPU handle equal the CPU handle's."""
    c = cp()
    mode, D, L, I, H, T = "LSTM", 2, 2, 5, 6, 5
    lengths = (5, 3, 5, 1)
    B = len(lengths)
    d, w, _, drop = our_net(cpu, mode, D, L, I, H, "float64", "DEFAULT_MATH", rng, dropout=0.4, seed=77, scale=0.6)
    xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
    cc.cudnnSetRNNDataDescriptor(xd, DT["float64"], SEQ, T, B, I, list(lengths), None)
    cc.cudnnSetRNNDataDescriptor(yd, DT["float64"], SEQ, T, B, D * H, list(lengths), None)
    hd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(hd, DT["float64"], 3, [L * D, B, H], [B * H, H, 1])
    x = rng.standard_normal((T, B, I))
    hx, cx = rng.standard_normal((L * D, B, H)), rng.standard_normal((L * D, B, H))
    dy = rng.standard_normal((T, B, D * H))
    dhy, dcy = rng.standard_normal(hx.shape), rng.standard_normal(cx.shape)
    results = {}
    for name, h, arr in (("cpu", cpu, np), ("gpu", gpu, c)):
        states = arr.zeros(64, arr.uint8)
        cc.cudnnSetDropoutDescriptor(drop, h, 0.4, states, 64, 77)
        ws, rs = cc.cudnnGetRNNTempSpaceSizes(h, d, cc.CUDNN_FWD_MODE_TRAINING, xd)
        wsb, rsb = arr.zeros(ws, arr.uint8), arr.zeros(rs, arr.uint8)
        seq = arr.asarray(np.asarray(lengths, np.int32))
        wb = arr.asarray(w)
        y, hy, cy = arr.zeros((T, B, D * H)), arr.zeros(hx.shape), arr.zeros(cx.shape)
        xb, hxb, cxb = arr.asarray(x), arr.asarray(hx), arr.asarray(cx)
        cc.cudnnRNNForward(h, d, cc.CUDNN_FWD_MODE_TRAINING, seq, xd, xb, yd, y, hd, hxb, hy, hd, cxb, cy, w.nbytes, wb,
                           ws, wsb, rs, rsb)
        dx, dhx, dcx = arr.zeros(x.shape), arr.zeros(hx.shape), arr.zeros(cx.shape)
        cc.cudnnRNNBackwardData_v8(h, d, seq, yd, y, arr.asarray(dy), xd, dx, hd, hxb, arr.asarray(dhy), dhx, hd, cxb,
                                   arr.asarray(dcy), dcx, w.nbytes, wb, ws, wsb, rs, rsb)
        dw = arr.zeros(w.size // 8)
        cc.cudnnRNNBackwardWeights_v8(h, d, cc.CUDNN_WGRAD_MODE_ADD, seq, xd, xb, hd, hxb, yd, y, w.nbytes, dw, ws, wsb,
                                      rs, rsb)
        get = (lambda a: a) if arr is np else (lambda a: a.get())
        results[name] = {k: get(v) for k, v in dict(y=y, hy=hy, cy=cy, dx=dx, dhx=dhx, dcx=dcx, dw=dw, rs=rsb).items()}
    cfg = rnn_core.config_of(rnn_desc(d))
    geo = rnn_core.Geometry("SEQ", T, B, lengths)
    sp = rnn_core.spaces(cfg, geo)
    a, b = results["cpu"], results["gpu"]
    off = sp.rs[("mask", 1)]
    nmask = geo.N * D * H
    np.testing.assert_array_equal(a["rs"][off:off + nmask], b["rs"][off:off + nmask])
    assert 0 < a["rs"][off:off + nmask].mean() < 1
    for k in ("hy", "cy", "dhx", "dcx", "dw"):
        np.testing.assert_allclose(b[k], a[k], rtol=1e-9, atol=1e-9, err_msg=k)
    for k in ("y", "dx"):
        for bb, n in enumerate(lengths):
            np.testing.assert_allclose(b[k][:n, bb], a[k][:n, bb], rtol=1e-9, atol=1e-9, err_msg=k)


@pytest.mark.parametrize("mode", ["GRU", "RELU"])
def test_backward_other_modes_on_gpu_match_cpu(gpu, cpu, rng, mode):
    c = cp()
    D, L, I, H, T = 2, 1, 4, 5, 4
    lengths = (4, 2, 3)
    B = len(lengths)
    d, w, _, _ = our_net(cpu, mode, D, L, I, H, "float64", "DEFAULT_MATH", rng, scale=0.6)
    xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
    cc.cudnnSetRNNDataDescriptor(xd, DT["float64"], SEQ, T, B, I, list(lengths), None)
    cc.cudnnSetRNNDataDescriptor(yd, DT["float64"], SEQ, T, B, D * H, list(lengths), None)
    hd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(hd, DT["float64"], 3, [L * D, B, H], [B * H, H, 1])
    x, hx = rng.standard_normal((T, B, I)), rng.standard_normal((L * D, B, H))
    dy, dhy = rng.standard_normal((T, B, D * H)), rng.standard_normal(hx.shape)
    res = {}
    for name, h, arr in (("cpu", cpu, np), ("gpu", gpu, c)):
        ws, rs = cc.cudnnGetRNNTempSpaceSizes(h, d, cc.CUDNN_FWD_MODE_TRAINING, xd)
        wsb, rsb = arr.zeros(ws, arr.uint8), arr.zeros(rs, arr.uint8)
        seq, wb, xb, hxb = (arr.asarray(v) for v in (np.asarray(lengths, np.int32), w, x, hx))
        y, hy = arr.zeros((T, B, D * H)), arr.zeros(hx.shape)
        cc.cudnnRNNForward(h, d, cc.CUDNN_FWD_MODE_TRAINING, seq, xd, xb, yd, y, hd, hxb, hy, None, None, None,
                           w.nbytes, wb, ws, wsb, rs, rsb)
        dx, dhx = arr.zeros(x.shape), arr.zeros(hx.shape)
        cc.cudnnRNNBackwardData_v8(h, d, seq, yd, y, arr.asarray(dy), xd, dx, hd, hxb, arr.asarray(dhy), dhx, None,
                                   None, None, None, w.nbytes, wb, ws, wsb, rs, rsb)
        get = (lambda a: a) if arr is np else (lambda a: a.get())
        res[name] = [get(v) for v in (hy, dhx, dx)]
    for a, b in zip(res["cpu"], res["gpu"]):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9)


def test_repeated_forward_is_captured_and_replayed(gpu, cpu, rng):
    """Call 1 runs eagerly, call 2 captures a CUDA graph, call 3 replays it: the same numbers."""
    from cudnn_compat._backend.engines.cupy_engine.program import ProgramRun
    c = cp()
    mode, D, L, I, H, T = "LSTM", 2, 1, 8, 16, 6
    lengths = (6,) * 4
    d, w, _, _ = our_net(cpu, mode, D, L, I, H, "float32", "FMA_MATH", rng)
    x = c.asarray(rng.uniform(-1, 1, (T, 4, I)).astype(np.float32))
    hx = c.asarray(rng.uniform(-1, 1, (L * D, 4, H)).astype(np.float32))
    cx = c.zeros_like(hx)
    wd = c.asarray(w)
    bufs = (c.zeros((T, 4, D * H), c.float32), c.zeros_like(hx), c.zeros_like(cx), c.empty(1 << 20, c.uint8),
            c.empty(1, c.uint8))
    got = []
    for _ in range(3):
        bufs[0][...] = np.nan
        run_ours(gpu, d, wd, "float32", D, L, I, H, T, lengths, x, hx, cx, False, outs=bufs)
        got.append((bufs[0].get(), bufs[1].get()))
    for y, hy in got[1:]:
        np.testing.assert_array_equal(y, got[0][0])
        np.testing.assert_array_equal(hy, got[0][1])
    assert not np.isnan(got[0][0]).any()
    from cudnn_compat._core.call import last_plan
    plan = last_plan()
    runners = [r.fn.__self__ for r in getattr(plan, "runs", ())
               if isinstance(getattr(r, "fn", None), object) and isinstance(getattr(r.fn, "__self__", None), ProgramRun)]
    assert runners, f"the recurrence did not run in the cupy engine ({plan.engine})"
    assert any(e.graph for rr in runners for e in rr.cache.values()), "no CUDA graph was captured"


def test_repeated_forward_replays_through_the_prepared_launch(gpu, cpu, rng, monkeypatch):
    """The same call on the same buffers, after its graph was captured: the plan's launcher (the
    prepared call of the recurrence stage, ``ProgramRun.launcher``) replays it, so the program's
    execute (``ProgramRun.run``) is not reached, and the numbers are those of the first call."""
    from cudnn_compat._backend.engines.cupy_engine.program import ProgramRun
    from cudnn_compat._core.call import last_plan
    c = cp()
    mode, D, L, I, H, T = "LSTM", 1, 1, 8, 16, 5
    B = 3
    d, w, _, _ = our_net(cpu, mode, D, L, I, H, "float32", "FMA_MATH", rng)
    xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
    cc.cudnnSetRNNDataDescriptor(xd, DT["float32"], SEQ, T, B, I, [T] * B, None)
    cc.cudnnSetRNNDataDescriptor(yd, DT["float32"], SEQ, T, B, D * H, [T] * B, None)
    hd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(hd, DT["float32"], 3, [L * D, B, H], [B * H, H, 1])
    inf = cc.CUDNN_FWD_MODE_INFERENCE
    ws, _rs = cc.cudnnGetRNNTempSpaceSizes(gpu, d, inf, xd)
    x = c.asarray(rng.uniform(-1, 1, (T, B, I)).astype(np.float32))
    hx = c.asarray(rng.uniform(-1, 1, (L * D, B, H)).astype(np.float32))
    cx = c.asarray(rng.uniform(-1, 1, (L * D, B, H)).astype(np.float32))
    y, hy, cy = c.zeros((T, B, D * H), c.float32), c.zeros_like(hx), c.zeros_like(cx)
    wd, wsb, seq = c.asarray(w), c.empty(max(ws, 1), c.uint8), c.asarray(np.full(B, T, np.int32))

    def call():
        y[...] = np.nan
        cc.cudnnRNNForward(gpu, d, inf, seq, xd, x, yd, y, hd, hx, hy, hd, cx, cy, wd.nbytes, wd, ws, wsb, 0, None)
        return y.get(), hy.get(), cy.get()
    first = call()
    call()
    call()  # eager, captured, replayed: the graph exists now
    runs = []
    orig = ProgramRun.run
    monkeypatch.setattr(ProgramRun, "run", lambda self, env, ctx: (runs.append(1), orig(self, env, ctx))[1])
    last = call()
    assert not runs, "the recurrence went through the plan's execute, not its launcher"
    plan = last_plan()
    assert plan.engine == "cupy" and plan.launch_mode == "program", (plan.engine, plan.config)
    for a, b in zip(first, last):
        np.testing.assert_array_equal(a, b)
    assert not np.isnan(first[0]).any()
