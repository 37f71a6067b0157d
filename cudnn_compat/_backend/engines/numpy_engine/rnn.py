"""``numpy`` engine kernels for RNNRecurrence / RNNRecurrenceBackward (002 §7.1.2.8 the cell
equations, §8.2.18 cudnnRNNBackwardData_v8): the per-step loop of one layer, every direction, in
the compute dtype ``dt``.  The definitions (roles, row maps, padding, clip and NaN rules) are in
cudnn_compat/_backend/ops/rnn.py; the step order and the row bookkeeping are the reference engine's
(reference/rnn.py ``_steps``), so both engines walk the same rows.

The input projection x W^T + b of every time step is one Matmul over the whole sequence: before the
loop (the op's ``x`` form) or a Matmul op before this one.  Per step only the recurrent GEMM h R^T
(and dG R backward) runs, on the active rows, as one BLAS call over all gates.  Gate activations
are computed in place on the step's pre-activation block (LSTM i f g o, GRU r z n), which is then
the ``acts`` row block; rows and active sequences are basic slices where they are contiguous (SEQ
and PACKED layouts, sorted lengths), else index arrays. Temporaries: per step a few arrays of
(active rows, g*H); the states (B, Ho) and (B, H).
"""
from __future__ import annotations

import numpy as np

from ..reference.rnn import _clip, _padding_rows, _steps, input_projection
from ._kernels import kernel

GATES = {"RELU": 1, "TANH": 1, "LSTM": 4, "GRU": 3}


def _compact(idx):
    """A slice for an index array that is an increasing progression, else the array."""
    n = len(idx)
    if n == 0:
        return idx
    step = int(idx[1] - idx[0]) if n > 1 else 1
    if step > 0 and (n == 1 or np.array_equal(np.diff(idx), np.full(n - 1, step))):
        return slice(int(idx[0]), int(idx[-1]) + 1, step)
    return idx


def _sigmoid_(v):
    """v = sigmoid(v) = (1 + tanh(v/2)) / 2, in place (the definition of ops/rnn.py)."""
    np.multiply(v, 0.5, out=v)
    np.tanh(v, out=v)
    np.add(v, 1.0, out=v)
    np.multiply(v, 0.5, out=v)
    return v


def _buffers(op, out, dt):
    """Result arrays: the caller's buffer when given (y as it is: every row of it is written,
    padding rows from fill or y_in first), else fresh; zeroed but for y."""
    res = {}
    for role, t in op.outputs.items():
        buf = out.get(role)
        if buf is None:
            buf = np.zeros(t.dims, dtype=dt)
        elif role != "y":
            buf.fill(0)
        res[role] = buf
    return res


def _prelude(op, ins, out, dt, may_alias=None):
    """(attrs, R, B, Ho, H, result arrays); a caller buffer sharing memory with an input (but
    ``may_alias``, read before any write) is replaced by a fresh array."""
    a, R = op.attrs, ins["w_rec"]
    reads = [v for k, v in ins.items() if k != may_alias]
    out = {k: v for k, v in out.items() if not any(np.may_share_memory(v, r) for r in reads)}
    return a, R, len(a["lengths"]), R.shape[2], R.shape[1] // GATES[a["mode"]], _buffers(op, out, dt)


def _walk(a, reverse):
    for t, idx, rows, prev, first in _steps(a, reverse):
        yield t, idx, _compact(idx), _compact(rows), prev, first


@kernel("RNNRecurrence")
def rnn_recurrence(op, ins, dt, out):
    """The forward recurrence (ops/rnn.py RNNRecurrence), one GEMM per step and direction."""
    a, R, B, Ho, H, res = _prelude(op, ins, out, dt, "y_in")
    mode, clip = a["mode"], a.get("clip")
    if "x" in ins:  # the layer's input projection first (ops/rnn.py)
        gx = res["gx"]
        gx[...] = input_projection(ins, mode, dt)
    else:
        gx = ins["gx"]
    pad = _padding_rows(a)
    if pad.size:  # before any other write: y may be y_in's memory
        res["y"][:, pad] = ins["fill"] if "fill" in ins else ins["y_in"][:, pad]
    train = "acts" in res
    for d, reverse in enumerate(a["directions"]):
        RdT = R[d].T
        h = ins["hx"][d].astype(dt, copy=True) if "hx" in ins else np.zeros((B, Ho), dt)
        c = ins["cx"][d].astype(dt, copy=True) if "cx" in ins else np.zeros((B, H), dt)
        for _, _, ix, rows, _, _ in _walk(a, reverse):
            hp = h[ix]
            rh = hp @ RdT
            if mode in ("RELU", "TANH"):
                pre = np.add(gx[d, rows], rh)
                hn = np.maximum(pre, 0, out=pre) if mode == "RELU" else np.tanh(pre, out=pre)
            elif mode == "LSTM":
                pre = np.add(gx[d, rows], rh)
                _sigmoid_(pre[:, :2 * H])
                np.tanh(pre[:, 2 * H:3 * H], out=pre[:, 2 * H:3 * H])
                _sigmoid_(pre[:, 3 * H:])
                i, f, gg, o = pre[:, :H], pre[:, H:2 * H], pre[:, 2 * H:3 * H], pre[:, 3 * H:]
                cn = f * c[ix] + i * gg
                if clip:
                    cn = _clip(cn, ins["lclip"], ins["rclip"], clip)
                hn = o * np.tanh(cn)
                if train:
                    res["acts"][d, rows] = pre
                    res["c_all"][d, rows] = cn
                    if "hpre" in res:
                        res["hpre"][d, rows] = hn
                if "wr" in ins:
                    hn = hn @ ins["wr"][d].T
                c[ix] = cn
            else:  # GRU
                grn = rh[:, 2 * H:]
                if "b_rec" in ins:
                    grn += ins["b_rec"][d]
                pre = np.array(gx[d, rows], dtype=dt)
                np.add(pre[:, :2 * H], rh[:, :2 * H], out=pre[:, :2 * H])
                _sigmoid_(pre[:, :2 * H])
                r, z, n = pre[:, :H], pre[:, H:2 * H], pre[:, 2 * H:]
                n += r * grn
                np.tanh(n, out=n)
                hn = (1 - z) * n + z * hp
                if train:
                    res["acts"][d, rows] = pre
                    res["grn"][d, rows] = grn
            h[ix] = hn
            res["y"][d, rows] = hn
        if "hy" in res:
            res["hy"][d] = h
        if "cy" in res:
            res["cy"][d] = c
    return res


def _prev_state(src_all, init, d, prev, first, ix_arr, shape, dt):
    """The state before each active row's step: src_all[d, prev] where the step has one, else
    init[d, idx] (or 0 when init is absent)."""
    out = np.zeros(shape, dt)
    if prev is not None:
        out[~first] = src_all[d, prev[~first]]
    if init is not None:
        out[first] = init[d, ix_arr[first]]
    return out


@kernel("RNNRecurrenceBackward")
def rnn_recurrence_backward(op, ins, dt, out):
    """Gradients of the recurrence (ops/rnn.py RNNRecurrenceBackward), steps in reverse."""
    a, R, B, Ho, H, res = _prelude(op, ins, out, dt)
    mode, clip, dy = a["mode"], a.get("clip"), ins["dy"]
    for d, reverse in enumerate(a["directions"]):
        Rd = R[d]
        dh_next = ins["dhy"][d].astype(dt, copy=True) if "dhy" in ins else np.zeros((B, Ho), dt)
        dc_next = ins["dcy"][d].astype(dt, copy=True) if "dcy" in ins else np.zeros((B, H), dt)
        for _, idx, ix, rows, prev, first in reversed(list(_walk(a, reverse))):
            dh = dy[d, rows] + dh_next[ix]
            if "wr" in ins:
                res["dr"][d, rows] = dh
                dh = dh @ ins["wr"][d]
            if mode in ("RELU", "TANH"):
                hv = ins["y"][d, rows]
                if mode == "RELU":
                    grads = np.where(hv > 0, dh, 0).astype(dt) + np.where(np.isnan(hv), np.nan, 0).astype(dt)
                else:
                    grads = dh * (1 - hv * hv)
                res["dgates"][d, rows] = grads
            elif mode == "LSTM":
                act = ins["acts"][d, rows]
                i, f, gg, o = act[:, :H], act[:, H:2 * H], act[:, 2 * H:3 * H], act[:, 3 * H:]
                ct = ins["c_all"][d, rows]
                tc = np.tanh(ct)
                grads = np.empty((len(idx), 4 * H), dt)
                di, df, dg, do = grads[:, :H], grads[:, H:2 * H], grads[:, 2 * H:3 * H], grads[:, 3 * H:]
                np.multiply(dh * tc, o * (1 - o), out=do)
                dc = dh * o * (1 - tc * tc) + dc_next[ix]
                if clip:
                    dc = dc * ((ct > ins["lclip"]) & (ct < ins["rclip"]))
                np.multiply(dc * gg, i * (1 - i), out=di)
                np.multiply(dc * i, 1 - gg * gg, out=dg)
                cprev = _prev_state(ins["c_all"], ins.get("cx"), d, prev, first, idx, ct.shape, dt)
                np.multiply(dc * cprev, f * (1 - f), out=df)
                if "cx" not in ins:
                    df[first] = 0
                dc_next[ix] = dc * f
                res["dgates"][d, rows] = grads
            else:  # GRU
                act = ins["acts"][d, rows]
                r, z, n = act[:, :H], act[:, H:2 * H], act[:, 2 * H:]
                hprev = _prev_state(ins["y"], ins.get("hx"), d, prev, first, idx, n.shape, dt)
                grads = np.empty((len(idx), 3 * H), dt)
                drr, dz, dgrn = grads[:, :H], grads[:, H:2 * H], grads[:, 2 * H:]
                dpn = dh * (1 - z) * (1 - n * n)
                np.multiply(dh * (hprev - n), z * (1 - z), out=dz)
                np.multiply(dpn * ins["grn"][d, rows], r * (1 - r), out=drr)
                np.multiply(dpn, r, out=dgrn)
                gates = grads.copy()
                gates[:, 2 * H:] = dpn
                res["dgates"][d, rows] = gates
                res["dgrn"][d, rows] = dgrn
            dh_prev = grads @ Rd
            if mode == "GRU":
                dh_prev += dh * z
            dh_next[ix] = dh_prev
        if "dhx" in res:
            res["dhx"][d] = dh_next
        if "dcx" in res:
            res["dcx"][d] = dc_next
    return res
