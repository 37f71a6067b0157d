"""Helpers for the RNN tests: the cell equations of 002 §7.1.2.8 written as plain numpy loops
over time (one sequence at a time), and builders for descriptors and weights.  The weights
are located only through cudnnGetRNNWeightParams; the reference reads them back from there."""
import numpy as np

import cudnn_compat as cc

GATES = {cc.CUDNN_RNN_RELU: 1, cc.CUDNN_RNN_TANH: 1, cc.CUDNN_LSTM: 4, cc.CUDNN_GRU: 3}
DT = {np.float32: cc.CUDNN_DATA_FLOAT, np.float64: cc.CUDNN_DATA_DOUBLE, np.float16: cc.CUDNN_DATA_HALF}


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def cell(mode, bias, Wk, Rk, bW, bR, x, h, c, clip=None):
    """One step of one sequence; Wk/Rk/bW/bR are per-gate lists (None where absent; Wk None = skip input)."""
    g = len(Rk)
    wx = [x if Wk is None else Wk[k] @ x for k in range(g)]
    rh = [Rk[k] @ h for k in range(g)]
    bw = [bW[k] if bW is not None else 0.0 for k in range(g)]
    br = [bR[k] if bR is not None else 0.0 for k in range(g)]
    if mode == cc.CUDNN_RNN_RELU:
        return np.maximum(wx[0] + rh[0] + bw[0] + br[0], 0.0), None
    if mode == cc.CUDNN_RNN_TANH:
        return np.tanh(wx[0] + rh[0] + bw[0] + br[0]), None
    if mode == cc.CUDNN_LSTM:
        i = sigmoid(wx[0] + rh[0] + bw[0] + br[0])
        f = sigmoid(wx[1] + rh[1] + bw[1] + br[1])
        cp = np.tanh(wx[2] + rh[2] + bw[2] + br[2])
        o = sigmoid(wx[3] + rh[3] + bw[3] + br[3])
        cn = f * c + i * cp
        if clip is not None:
            cn = np.minimum(np.maximum(cn, clip[0]), clip[1])
        return o * np.tanh(cn), cn
    # GRU: i_t (update) = gate 1, r_t (reset) = gate 0, h' = gate 2; r multiplies (R_h h + b_Rh)
    r = sigmoid(wx[0] + rh[0] + bw[0] + br[0])
    z = sigmoid(wx[1] + rh[1] + bw[1] + br[1])
    hn = np.tanh(wx[2] + bw[2] + r * (rh[2] + br[2]))
    return (1 - z) * hn + z * h, None


def reference(net, xs, hx=None, cx=None, drop=None):
    """xs: list of per-sequence arrays (len_b, inputSize). Returns (ys list of (len_b, D*Hout), hy, cy).
    ``drop``: (masks, scale), masks[l][b][t] the keep mask of layer l's input vector (l >= 1)."""
    L, D, H, P, mode = net["L"], net["D"], net["H"], net["P"], net["mode"]
    B = len(xs)
    hy = np.zeros((L * D, B, P))
    cy = np.zeros((L * D, B, H))
    inputs = [np.asarray(x, np.float64) for x in xs]
    for l in range(L):
        if drop is not None and l >= 1:
            masks, scale = drop
            inputs = [x * masks[l][b][:len(x)] * scale for b, x in enumerate(inputs)]
        outs = [np.zeros((len(x), D * P)) for x in inputs]
        for d in range(D):
            p = l * D + d
            w = net["weights"][p]
            for b, x in enumerate(inputs):
                h = np.zeros(P) if hx is None else hx[p, b].astype(np.float64)
                c = np.zeros(H) if cx is None else cx[p, b].astype(np.float64)
                order = range(len(x)) if d == 0 else reversed(range(len(x)))
                for t in order:
                    hh, c2 = cell(mode, net["bias"], w["W"], w["R"], w["bW"], w["bR"], x[t], h, c, net.get("clip"))
                    if mode == cc.CUDNN_LSTM:
                        c = c2
                        if w["Wr"] is not None:
                            hh = w["Wr"] @ hh
                    h = hh
                    outs[b][t, d * P:(d + 1) * P] = h
                hy[p, b], cy[p, b] = h, c
        inputs = outs
    return inputs, hy, cy


def make_net(handle, mode, D=1, L=1, I=3, H=4, P=None, bias=cc.CUDNN_RNN_DOUBLE_BIAS, skip=False, dtype=np.float64,
             rng=None, padded=True, dropout=None, clip=None, algo=cc.CUDNN_RNN_ALGO_STANDARD, scale=0.5, mathPrec=None):
    """An RNN descriptor set with _v8 plus a weight space filled with random values through
    cudnnGetRNNWeightParams; returns a dict with everything the reference needs."""
    rng = rng or np.random.default_rng(0)
    P = H if P is None else P
    d = cc.cudnnCreateRNNDescriptor()
    dt = DT[dtype]
    cc.cudnnSetRNNDescriptor_v8(d, algo, mode, bias, cc.CUDNN_BIDIRECTIONAL if D == 2 else cc.CUDNN_UNIDIRECTIONAL,
                                cc.CUDNN_SKIP_INPUT if skip else cc.CUDNN_LINEAR_INPUT, dt, mathPrec or
                                (cc.CUDNN_DATA_FLOAT if dt == cc.CUDNN_DATA_HALF else dt), cc.CUDNN_DEFAULT_MATH,
                                I, H, P, L, dropout, cc.CUDNN_RNN_PADDED_IO_ENABLED if padded else 0)
    if clip is not None:
        cc.cudnnRNNSetClip_v8(d, cc.CUDNN_RNN_CLIP_MINMAX, cc.CUDNN_NOT_PROPAGATE_NAN, clip[0], clip[1])
    size = cc.cudnnGetRNNWeightSpaceSize(handle, d)
    wspace = np.zeros(size, np.uint8)
    g = GATES[mode]
    md, bd = cc.cudnnCreateTensorDescriptor(), cc.cudnnCreateTensorDescriptor()
    weights = []
    for p in range(L * D):
        w = {"W": [], "R": [], "bW": [], "bR": [], "Wr": None}
        for lid in range(2 * g + (1 if mode == cc.CUDNN_LSTM else 0)):
            m, bvec = cc.cudnnGetRNNWeightParams(handle, d, p, size, wspace, lid, md, bd)
            if m is not None:
                m[...] = (rng.standard_normal(m.shape) * scale).astype(dtype)
            if bvec is not None:
                bvec[...] = (rng.standard_normal(bvec.shape) * scale).astype(dtype)
            mm = None if m is None else m[0].astype(np.float64)
            bb = None if bvec is None else bvec[0, :, 0].astype(np.float64)
            if lid == 2 * g:
                w["Wr"] = mm
            elif lid < g:
                w["W"].append(mm)
                w["bW"].append(bb)
            else:
                w["R"].append(mm)
                w["bR"].append(bb)
        for k in ("W", "bW", "bR"):
            if all(v is None for v in w[k]):
                w[k] = None
        weights.append(w)
    return {"desc": d, "mode": mode, "D": D, "L": L, "I": I, "H": H, "P": P, "bias": bias, "dtype": dtype,
            "wspace": wspace, "wsize": size, "weights": weights, "clip": clip, "dt": dt}


def data_desc(dt, layout, T, B, V, lengths, fill=None):
    d = cc.cudnnCreateRNNDataDescriptor()
    cc.cudnnSetRNNDataDescriptor(d, dt, layout, T, B, V, list(lengths), fill)
    return d


def pack(xs, layout, T, V, dtype):
    """Per-sequence arrays -> one buffer in ``layout`` (padding vectors filled with NaN)."""
    B = len(xs)
    if layout == cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED:
        rows = [xs[b][t] for t in range(T) for b in range(B) if len(xs[b]) > t]
        return np.array(rows, dtype).reshape(-1)
    buf = np.full((T, B, V) if layout == cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED else (B, T, V), np.nan, dtype)
    for b, x in enumerate(xs):
        for t in range(len(x)):
            if layout == cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED:
                buf[t, b] = x[t]
            else:
                buf[b, t] = x[t]
    return buf.reshape(-1)


def unpack(buf, layout, lengths, T, V):
    B = len(lengths)
    if layout == cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED:
        out = [np.zeros((n, V)) for n in lengths]
        r = 0
        rows = buf.reshape(-1, V)
        for t in range(T):
            for b in range(B):
                if lengths[b] > t:
                    out[b][t] = rows[r]
                    r += 1
        return out
    arr = buf.reshape((T, B, V) if layout == cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED else (B, T, V))
    if layout == cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED:
        return [arr[:n, b].astype(np.float64) for b, n in enumerate(lengths)]
    return [arr[b, :n].astype(np.float64) for b, n in enumerate(lengths)]


def state_desc(dtype, n, B, width):
    return tdesc3((n, B, width), DT[dtype])


def tdesc3(dims, dt):
    d = cc.cudnnCreateTensorDescriptor()
    strides = [dims[1] * dims[2], dims[2], 1]
    cc.cudnnSetTensorNdDescriptor(d, dt, 3, list(dims), strides)
    return d


def forward(handle, net, xs, layout, lengths, T, hx=None, cx=None, training=False, fill=None, want_c=True):
    """Run cudnnRNNForward; returns (ys per sequence, hy, cy, buffers dict for backward)."""
    dtype, dt, D, P, H, L = net["dtype"], net["dt"], net["D"], net["P"], net["H"], net["L"]
    B = len(lengths)
    xd = data_desc(dt, layout, T, B, net["I"], lengths)
    yd = data_desc(dt, layout, T, B, D * P, lengths, fill)
    x = pack(xs, layout, T, net["I"], dtype)
    ny = sum(lengths) if layout == cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED else T * B
    y = np.full(ny * D * P, -7.0, dtype)
    hdesc = state_desc(dtype, L * D, B, P)
    cdesc = state_desc(dtype, L * D, B, H)
    hy = np.full(L * D * B * P, -7.0, dtype)
    cy = np.full(L * D * B * H, -7.0, dtype)
    mode = cc.CUDNN_FWD_MODE_TRAINING if training else cc.CUDNN_FWD_MODE_INFERENCE
    ws_size, rs_size = cc.cudnnGetRNNTempSpaceSizes(handle, net["desc"], mode, xd)
    ws = np.full(ws_size, 255, np.uint8)
    rs = np.full(max(rs_size, 1), 255, np.uint8)
    seq = np.array(lengths, np.int32)
    cc.cudnnRNNForward(handle, net["desc"], mode, seq, xd, x, yd, y, hdesc, hx, hy,
                       cdesc, cx, cy if want_c else None, net["wsize"], net["wspace"], ws_size, ws, rs_size, rs)
    ys = unpack(y, layout, lengths, T, D * P)
    return ys, hy.reshape(L * D, B, P), cy.reshape(L * D, B, H), dict(
        x=x, y=y, xd=xd, yd=yd, hdesc=hdesc, cdesc=cdesc, ws=ws, rs=rs, seq=seq, ws_size=ws_size, rs_size=rs_size)
