"""Reference kernels for CTCLoss, SpatialTfSamplerForward and SpatialTfSamplerBackward
(semantics and attrs in cudnn_compat/_backend/ops/ctc_sampler.py; 002 §8.2.3 cudnnCTCLoss, §3.2.98/§4.1.21
the spatial transformer sampler), in float64.
"""
from __future__ import annotations

import numpy as np

from ._kernels import kernel

NEG_INF = -np.inf


def _logsumexp(*terms):
    """Elementwise log(sum(exp(terms))) that keeps -inf when every term is -inf."""
    stack = np.stack(np.broadcast_arrays(*terms))
    m = stack.max(axis=0)
    safe = np.where(np.isfinite(m), m, 0.0)
    return safe + np.log(np.exp(stack - safe).sum(axis=0))


def _shift(a, k):
    """a moved k places towards higher indices (k < 0: lower), -inf filling the vacated ones."""
    out = np.full_like(a, NEG_INF)
    if abs(k) < a.size:
        if k >= 0:
            out[k:] = a[:a.size - k]
        else:
            out[:k] = a[-k:]
    return out


def _ctc_one(logy, label):
    """(log p, d cost / d u [T, A]) for one sample: logy [T, A] log-probabilities, label [L]."""
    t_len, a = logy.shape
    ext = np.zeros(2 * len(label) + 1, dtype=np.int64)  # l': blank, l1, blank, l2, ..., blank
    ext[1::2] = label
    s_len = ext.size
    skip = np.zeros(s_len, dtype=bool)  # s may come from s - 2: a label that differs from the one before
    skip[3::2] = ext[3::2] != ext[1:-2:2]
    ly = logy[:, ext]  # [T, S]
    alpha = np.full((t_len, s_len), NEG_INF)
    alpha[0, 0] = ly[0, 0]
    if s_len > 1:
        alpha[0, 1] = ly[0, 1]
    for t in range(1, t_len):
        prev = alpha[t - 1]
        one, two = _shift(prev, 1), np.where(skip, _shift(prev, 2), NEG_INF)
        alpha[t] = _logsumexp(prev, one, two) + ly[t]
    beta = np.full((t_len, s_len), NEG_INF)
    beta[-1, -1] = ly[-1, -1]
    if s_len > 1:
        beta[-1, -2] = ly[-1, -2]
    skip_next = np.zeros(s_len, dtype=bool)  # s + 2 may be reached from s
    skip_next[:-2] = skip[2:]
    for t in range(t_len - 2, -1, -1):
        nxt = beta[t + 1]
        one, two = _shift(nxt, -1), np.where(skip_next, _shift(nxt, -2), NEG_INF)
        beta[t] = _logsumexp(nxt, one, two) + ly[t]
    logp = _logsumexp(alpha[-1, -1], alpha[-1, -2] if s_len > 1 else NEG_INF)
    ab = alpha + beta  # log(alpha_t(s) beta_t(s)), each including y_t(l'_s) once
    occ = np.full((t_len, a), NEG_INF)
    for k in np.unique(ext):
        occ[:, k] = _logsumexp(*[ab[:, s] for s in np.nonzero(ext == k)[0]])
    visited = np.isfinite(occ)  # classes no path uses at t get no second term (and no inf - inf)
    grad = np.exp(logy) - np.where(visited, np.exp(np.where(visited, occ, 0.0) - logp - logy), 0.0)
    return float(logp), grad


def _unalignable(label, t_len) -> bool:
    """002 §8.2.26 gradMode: L + R > T, R the number of repeated consecutive labels."""
    repeats = int(np.count_nonzero(label[1:] == label[:-1])) if len(label) > 1 else 0
    return len(label) + repeats > t_len


@kernel("CTCLoss")
def ctc_loss(op, ins):
    probs = ins["probs"]
    t_max, n, a = probs.shape
    if op.attrs["normalization"] == "SOFTMAX":
        z = probs - probs.max(axis=2, keepdims=True)
        logy = z - np.log(np.exp(z).sum(axis=2, keepdims=True))
    else:
        logy = np.log(probs)
    labels = ins["labels"].astype(np.int64)
    lab_len = ins["label_lengths"].astype(np.int64)
    in_len = ins["input_lengths"].astype(np.int64)
    costs = np.empty(n)
    grads = np.zeros_like(probs)
    prior = ins.get("gradients_prior")
    for i in range(n):
        t_len, label = int(in_len[i]), labels[i, :int(lab_len[i])]
        if _unalignable(label, t_len):
            costs[i] = np.inf
            if op.attrs["grad_mode"] == "PROPAGATE_NAN" and prior is not None:
                grads[:, i] = prior[:, i]
            continue
        logp, g = _ctc_one(logy[:t_len, i], label)
        costs[i] = -logp
        grads[:t_len, i] = g
    out = {"costs": costs}
    if "gradients" in op.outputs:
        out["gradients"] = grads
    return out


# -- spatial transformer sampler -------------------------------------------------------------

_CORNERS = ((0, 0), (0, 1), (1, 0), (1, 1))  # (dv, du)


def _sample_points(x_shape, grid):
    """Per corner: (iv, iu, inside, weight, dweight/du, dweight/dv); plus du/dgx, dv/dgy."""
    _, _, hi, wi = x_shape
    su, sv = (wi - 1) / 2.0, (hi - 1) / 2.0
    u = (grid[..., 0] + 1.0) * su
    v = (grid[..., 1] + 1.0) * sv
    finite = np.isfinite(u) & np.isfinite(v)
    u = np.where(finite, u, -10.0)  # a non-finite coordinate samples nothing (all corners outside)
    v = np.where(finite, v, -10.0)
    u0, v0 = np.floor(u), np.floor(v)
    fu, fv = u - u0, v - v0
    corners = []
    for dv, du in _CORNERS:
        iu, iv = u0 + du, v0 + dv
        wu = fu if du else 1.0 - fu
        wv = fv if dv else 1.0 - fv
        inside = finite & (iu >= 0) & (iu <= wi - 1) & (iv >= 0) & (iv <= hi - 1)
        iu_i = np.clip(iu, 0, wi - 1).astype(np.int64)
        iv_i = np.clip(iv, 0, hi - 1).astype(np.int64)
        dwu = 1.0 if du else -1.0
        dwv = 1.0 if dv else -1.0
        corners.append((iv_i, iu_i, inside, wu * wv, dwu * wv, wu * dwv))
    return corners, su, sv


def _gather(x, iv, iu):
    """x[n, :, iv[n,h,w], iu[n,h,w]] as [N, C, H, W]."""
    nidx = np.arange(x.shape[0])[:, None, None]
    return np.moveaxis(x[nidx, :, iv, iu], -1, 1)


@kernel("SpatialTfSamplerForward")
def sampler_forward(op, ins):
    x, grid = ins["x"], ins["grid"]
    corners, _, _ = _sample_points(x.shape, grid)
    y = np.zeros((x.shape[0], x.shape[1]) + grid.shape[1:3])
    for iv, iu, inside, w, _, _ in corners:
        y += _gather(x, iv, iu) * (w * inside)[:, None]
    return {"y": y}


@kernel("SpatialTfSamplerBackward")
def sampler_backward(op, ins):
    x, grid, dy = ins["x"], ins["grid"], ins["dy"]
    n, c = x.shape[:2]
    corners, su, sv = _sample_points(x.shape, grid)
    dx = np.zeros_like(x)
    du = np.zeros(grid.shape[:3])
    dv = np.zeros(grid.shape[:3])
    nidx = np.broadcast_to(np.arange(n)[:, None, None], grid.shape[:3])
    for iv, iu, inside, w, dwu, dwv in corners:
        contrib = dy * (w * inside)[:, None]  # [N, C, H, W]
        # dx[n, :, iv, iu] += contrib[n, :, h, w] for every output point (a scatter-add)
        np.add.at(dx, (nidx[:, None], np.arange(c)[None, :, None, None], iv[:, None], iu[:, None]), contrib)
        xv = (_gather(x, iv, iu) * dy).sum(axis=1) * inside
        du += xv * dwu
        dv += xv * dwv
    dgrid = np.stack((du * su, dv * sv), axis=-1)
    return {"dx": dx, "dgrid": dgrid}
