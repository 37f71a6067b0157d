"""Reference kernels for ``Rng`` (dropout masks) and ``RNNRecurrence`` /
``RNNRecurrenceBackward`` (the per-step loop of one layer, every direction, in float64); the
exact definitions are in cudnn_compat/_backend/ops/rnn.py.

``philox4x32_10(counter, key)`` is Random123's Philox4x32-10, vectorized over counters:
``counter`` is a uint32 array of shape (n, 4), ``key`` a pair of uint32; it returns the
(n, 4) uint32 words.  Every engine must reproduce ``bernoulli_keep`` bit for bit.
"""
from __future__ import annotations

import math

import numpy as np

from ...ops.rnn import row_map
from ._kernels import kernel

PHILOX_M0, PHILOX_M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def philox4x32_10(counter: np.ndarray, key) -> np.ndarray:
    c = np.asarray(counter, dtype=np.uint64).reshape(-1, 4)
    c0, c1, c2, c3 = (c[:, j].copy() for j in range(4))
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & 0xFFFFFFFF, (k1 + PHILOX_W1) & 0xFFFFFFFF
        p0 = PHILOX_M0 * c0  # both < 2**32, the product fits in 64 bits
        p1 = PHILOX_M1 * c2
        hi0, lo0 = p0 >> _SHIFT, p0 & _MASK32
        hi1, lo1 = p1 >> _SHIFT, p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def keep_threshold(p: float) -> int:
    """An element is kept when its 32-bit word is >= ceil(p * 2**32) (p = 1 keeps none)."""
    return int(math.ceil(float(p) * 4294967296.0))


def bernoulli_keep(seed: int, block: int, numel: int, p: float) -> np.ndarray:
    """The keep mask (bool, length ``numel``) for elements 0..numel-1 starting at ``block``."""
    nblocks = -(-numel // 4)
    blocks = (np.arange(nblocks, dtype=np.uint64) + np.uint64(block & 0xFFFFFFFFFFFFFFFF))
    ctr = np.zeros((nblocks, 4), dtype=np.uint64)
    ctr[:, 0] = blocks & _MASK32
    ctr[:, 1] = blocks >> _SHIFT
    threshold = keep_threshold(p)
    if threshold >= 2 ** 32:
        return np.zeros(numel, bool)
    words = philox4x32_10(ctr, (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)).reshape(-1)[:numel]
    return words >= np.uint32(threshold)


def _word_pair(v) -> int:
    """int32 words [lo, hi] (as loaded, float64) -> the unsigned 64-bit value."""
    lo, hi = (int(x) & 0xFFFFFFFF for x in np.asarray(v).reshape(-1)[:2])
    return lo | (hi << 32)


def _to_words(value: int) -> np.ndarray:
    """unsigned 64-bit value -> int32 words [lo, hi] in two's complement (as float64 for the store)."""
    value &= 0xFFFFFFFFFFFFFFFF
    words = np.array([value & 0xFFFFFFFF, value >> 32], dtype=np.uint64).astype(np.uint32).view(np.int32)
    return words.astype(np.float64)


@kernel("Rng")
def rng(op, ins):
    a = op.attrs
    y = op.outputs["y"]
    numel = int(np.prod(y.dims))
    seed, offset = _word_pair(ins["seed"]), _word_pair(ins["offset"])
    keep = bernoulli_keep(seed, offset + int(a.get("block_offset", 0)), numel, float(a["drop_probability"]))
    out = {"y": keep.astype(np.float64).reshape(y.dims)}
    if "offset_out" in op.outputs:
        out["offset_out"] = _to_words(offset + int(a.get("advance", -(-numel // 4))))
    return out


# -- RNN recurrence (definitions in cudnn_compat/_backend/ops/rnn.py) ---------------------------------------

def _sigmoid(v):
    return 0.5 * (1.0 + np.tanh(0.5 * v))


def _clip(c, lo, hi, mode):
    if mode == "PROPAGATE":
        return np.minimum(np.maximum(c, lo), hi)
    return np.fmin(np.fmax(c, lo), hi)


def _steps(a, reverse: bool):
    """(t, active sequence indices, their rows, their rows at the step before in the forward order
    of this direction or None, mask of sequences for which t is that first step), in the order
    the forward pass runs (``reverse``: the direction's reversal) -- the backward walks it back."""
    T, lengths = a["T"], np.asarray(a["lengths"])
    base, bs = row_map(a["layout"], T, a["lengths"])
    for t in (reversed(range(T)) if reverse else range(T)):
        idx = np.nonzero(lengths > t)[0]
        if not idx.size:
            continue
        first = (t == lengths[idx] - 1) if reverse else np.full(idx.size, t == 0)
        tp = t + 1 if reverse else t - 1
        prev = base[tp] + idx * bs if 0 <= tp < T else None
        yield t, idx, base[t] + idx * bs, prev, first


def _padding_rows(a):
    T, lengths = a["T"], a["lengths"]
    if a["layout"] == "PACKED":
        return np.zeros(0, int)
    base, bs = row_map(a["layout"], T, lengths)
    return np.array([base[t] + b * bs for b, n in enumerate(lengths) for t in range(n, T)], int)


def input_projection(ins, mode: str, dt=np.float64) -> np.ndarray:
    """An RNNRecurrence's gx from its ``x`` (ops/rnn.py): gx = x W_in^T + b_x + b_h, GRU: b_h of
    gates r and z only (its gate n is inside r * (R_n h + bR_n)); every direction, in ``dt``."""
    gx = np.matmul(np.asarray(ins["x"], dt), np.swapaxes(np.asarray(ins["w_in"], dt), 1, 2))
    if "b_x" in ins:
        gx += ins["b_x"]
    if "b_h" in ins:
        cols = 2 * gx.shape[2] // 3 if mode == "GRU" else gx.shape[2]
        gx[..., :cols] += ins["b_h"][..., :cols]
    return gx


@kernel("RNNRecurrence")
def rnn_recurrence(op, ins):
    """The per-step loop, all directions; float64 throughout.  With ``x``: gx = input_projection first."""
    a, outs = op.attrs, op.outputs
    mode, clip = a["mode"], a.get("clip")
    gx, R = input_projection(ins, mode) if "x" in ins else ins["gx"], ins["w_rec"]
    D, N, gH = gx.shape
    Ho = R.shape[2]
    B = len(a["lengths"])
    g = {"RELU": 1, "TANH": 1, "LSTM": 4, "GRU": 3}[mode]
    H = gH // g
    res = {role: gx if role == "gx" else np.zeros(t.dims) for role, t in outs.items()}  # gx: an output with x
    pad = _padding_rows(a)
    if pad.size:
        if "fill" in ins:
            res["y"][:, pad] = ins["fill"]
        elif "y_in" in ins:
            res["y"][:, pad] = ins["y_in"][:, pad]
    train = "acts" in outs
    for d, reverse in enumerate(a["directions"]):
        Rd = R[d]
        h = ins["hx"][d].copy() if "hx" in ins else np.zeros((B, Ho))
        c = ins["cx"][d].copy() if "cx" in ins else np.zeros((B, H))
        for t, idx, rows, _, _ in _steps(a, reverse):
            pre = gx[d, rows] + (h[idx] @ Rd.T if mode != "GRU" else 0.0)
            if mode in ("RELU", "TANH"):
                hn = np.maximum(pre, 0.0) if mode == "RELU" else np.tanh(pre)
            elif mode == "LSTM":
                i, f, o = _sigmoid(pre[:, :H]), _sigmoid(pre[:, H:2 * H]), _sigmoid(pre[:, 3 * H:])
                gg = np.tanh(pre[:, 2 * H:3 * H])
                cn = f * c[idx] + i * gg
                if clip:
                    cn = _clip(cn, ins["lclip"], ins["rclip"], clip)
                hn = o * np.tanh(cn)
                if train:
                    res["acts"][d, rows] = np.concatenate([i, f, gg, o], axis=1)
                    res["c_all"][d, rows] = cn
                    if "hpre" in res:
                        res["hpre"][d, rows] = hn
                if "wr" in ins:
                    hn = hn @ ins["wr"][d].T
                c[idx] = cn
            else:  # GRU
                rh = h[idx] @ Rd.T
                grn = rh[:, 2 * H:] + (ins["b_rec"][d] if "b_rec" in ins else 0.0)
                r = _sigmoid(pre[:, :H] + rh[:, :H])
                z = _sigmoid(pre[:, H:2 * H] + rh[:, H:2 * H])
                n = np.tanh(pre[:, 2 * H:] + r * grn)
                hn = (1.0 - z) * n + z * h[idx]
                if train:
                    res["acts"][d, rows] = np.concatenate([r, z, n], axis=1)
                    res["grn"][d, rows] = grn
            h[idx] = hn
            res["y"][d, rows] = hn
        if "hy" in res:
            res["hy"][d] = h
        if "cy" in res:
            res["cy"][d] = c
    return res


@kernel("RNNRecurrenceBackward")
def rnn_recurrence_backward(op, ins):
    a, outs = op.attrs, op.outputs
    mode, clip = a["mode"], a.get("clip")
    dy, R = ins["dy"], ins["w_rec"]
    D, gH, Ho = R.shape
    B = len(a["lengths"])
    g = {"RELU": 1, "TANH": 1, "LSTM": 4, "GRU": 3}[mode]
    H = gH // g
    res = {role: np.zeros(t.dims) for role, t in outs.items()}
    for d, reverse in enumerate(a["directions"]):
        Rd = R[d]
        dh_next = ins["dhy"][d].copy() if "dhy" in ins else np.zeros((B, Ho))
        dc_next = ins["dcy"][d].copy() if "dcy" in ins else np.zeros((B, H))
        for t, idx, rows, prev, fwd_first in reversed(list(_steps(a, reverse))):
            if "wr" in ins:
                dr = dy[d, rows] + dh_next[idx]
                res["dr"][d, rows] = dr
                dh = dr @ ins["wr"][d]
            else:
                dh = dy[d, rows] + dh_next[idx]
            if mode in ("RELU", "TANH"):
                hv = ins["y"][d, rows]
                if mode == "RELU":
                    dp = np.where(hv > 0.0, dh, 0.0) + np.where(np.isnan(hv), np.nan, 0.0)
                else:
                    dp = dh * (1.0 - hv * hv)
                grads = dp
                res["dgates"][d, rows] = dp
            elif mode == "LSTM":
                act = ins["acts"][d, rows]
                i, f, gg, o = act[:, :H], act[:, H:2 * H], act[:, 2 * H:3 * H], act[:, 3 * H:]
                ct = ins["c_all"][d, rows]
                tc = np.tanh(ct)
                do = dh * tc * o * (1.0 - o)
                dc = dh * o * (1.0 - tc * tc) + dc_next[idx]
                if clip:
                    dc = dc * ((ct > ins["lclip"]) & (ct < ins["rclip"]))
                di = dc * gg * i * (1.0 - i)
                dg = dc * i * (1.0 - gg * gg)
                cprev = np.zeros_like(ct)
                if prev is not None:
                    cprev[~fwd_first] = ins["c_all"][d, prev[~fwd_first]]
                if "cx" in ins:
                    cprev[fwd_first] = ins["cx"][d, idx[fwd_first]]
                df = dc * cprev * f * (1.0 - f)
                if "cx" not in ins:
                    df[fwd_first] = 0.0
                dc_next[idx] = dc * f
                grads = np.concatenate([di, df, dg, do], axis=1)
                res["dgates"][d, rows] = grads
            else:  # GRU
                act = ins["acts"][d, rows]
                r, z, n = act[:, :H], act[:, H:2 * H], act[:, 2 * H:]
                hprev = np.zeros_like(n)
                if prev is not None:
                    hprev[~fwd_first] = ins["y"][d, prev[~fwd_first]]
                if "hx" in ins:
                    hprev[fwd_first] = ins["hx"][d, idx[fwd_first]]
                dpn = dh * (1.0 - z) * (1.0 - n * n)
                dz = dh * (hprev - n) * z * (1.0 - z)
                dgrn = dpn * r
                drr = dpn * ins["grn"][d, rows] * r * (1.0 - r)
                res["dgates"][d, rows] = np.concatenate([drr, dz, dpn], axis=1)
                res["dgrn"][d, rows] = dgrn
                grads = np.concatenate([drr, dz, dgrn], axis=1)
            dh_prev = grads @ Rd
            if mode == "GRU":
                dh_prev = dh_prev + dh * z
            dh_next[idx] = dh_prev
        if "dhx" in res:
            res["dhx"][d] = dh_next
        if "dcx" in res:
            res["dcx"][d] = dc_next
    return res
