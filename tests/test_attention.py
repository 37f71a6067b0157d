"""Multi-head attention against softmax(smScaler QK^T)V written here with loops (002 §7.2.43,
§7.2.35, §8.2.15, §8.2.16): projections, biases, windows, sequence lengths, beams, layouts,
residuals, currIdx; gradients against central differences in float64; every error rule."""
import numpy as np
import pytest

import cudnn_compat as cc

T, B, BEAM, V = 0, 1, 2, 3  # cudnnSeqDataAxis_t
F16, F32, F64 = cc.CUDNN_DATA_HALF, cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE
NP = {F16: np.float16, F32: np.float32, F64: np.float64}
KINDS = {"q": cc.CUDNN_MH_ATTN_Q_WEIGHTS, "k": cc.CUDNN_MH_ATTN_K_WEIGHTS, "v": cc.CUDNN_MH_ATTN_V_WEIGHTS,
         "o": cc.CUDNN_MH_ATTN_O_WEIGHTS, "bq": cc.CUDNN_MH_ATTN_Q_BIASES, "bk": cc.CUDNN_MH_ATTN_K_BIASES,
         "bv": cc.CUDNN_MH_ATTN_V_BIASES, "bo": cc.CUDNN_MH_ATTN_O_BIASES}


# -- the formula, written independently ------------------------------------------------------

def reference(Q, K, Vv, W, nh, sm, lo, hi, len_q, len_k, one_to_one, residual=None):
    """Q [B, beam, Tq, qS], K/V [B, beamK, Tk, *]; W: name -> array or None (weights [H, P, S],
    biases [H, P] and [Po]).  Padding rows (t >= len_q) are 0."""
    nb, nbeam, tq = Q.shape[:3]
    tk = K.shape[2]
    heads_out = []
    out = None
    for b in range(nb):
        for j in range(nbeam):
            jk = j if one_to_one else 0
            for t in range(len_q[b, j]):
                hs = []
                for i in range(nh):
                    q = Q[b, j, t] if W["q"] is None else W["q"][i] @ Q[b, j, t] + (0 if W["bq"] is None else W["bq"][i])
                    keys, vals = [], []
                    for s in range(tk):
                        if lo[t] <= s < hi[t] and s < len_k[b, jk]:
                            kk = K[b, jk, s] if W["k"] is None else W["k"][i] @ K[b, jk, s] + (0 if W["bk"] is None else W["bk"][i])
                            vv = Vv[b, jk, s] if W["v"] is None else W["v"][i] @ Vv[b, jk, s] + (0 if W["bv"] is None else W["bv"][i])
                            keys.append(kk)
                            vals.append(vv)
                    pv = Vv.shape[3] if W["v"] is None else W["v"].shape[1]
                    if keys:
                        sc = np.array([sm * np.dot(q, kk) for kk in keys])
                        p = np.exp(sc - sc.max())
                        p /= p.sum()
                        hs.append(sum(pi * vv for pi, vv in zip(p, vals)))
                    else:
                        hs.append(np.zeros(pv))
                if W["o"] is None:
                    o = np.concatenate(hs)
                else:
                    o = sum(W["o"][i] @ hs[i] for i in range(nh)) + (0 if W["bo"] is None else W["bo"])
                if residual is not None:
                    o = o + residual[b, j, t]
                if out is None:
                    out = np.zeros((nb, nbeam, tq, o.size))
                out[b, j, t] = o
    heads_out.append(out)
    return out


# -- helpers ------------------------------------------------------------------------------------

def seq_desc(dtype, tt, nb, nbeam, vec, axes, lengths):
    d = cc.cudnnCreateSeqDataDescriptor()
    dims = [0] * 4
    dims[T], dims[B], dims[BEAM], dims[V] = tt, nb, nbeam, vec
    cc.cudnnSetSeqDataDescriptor(d, dtype, 4, dims, list(axes), nb * nbeam, list(np.asarray(lengths).reshape(-1)), None)
    return d


def to_buf(x, axes, dtype):
    """Logical [B, beam, T, V] -> the flat buffer of layout ``axes`` (outermost first)."""
    by_axis = np.transpose(x, (2, 0, 1, 3))  # [T, B, beam, V], indexed by cudnnSeqDataAxis_t
    return np.ascontiguousarray(np.transpose(by_axis, axes)).astype(dtype).reshape(-1)


def from_buf(buf, shape, axes):
    """Flat buffer of layout ``axes`` -> logical [B, beam, T, V] (shape is that logical shape)."""
    nb, nbeam, tt, vec = shape
    by_axis_dims = {T: tt, B: nb, BEAM: nbeam, V: vec}
    arr = buf.reshape([by_axis_dims[a] for a in axes])
    by_axis = np.transpose(arr, np.argsort(axes))  # [T, B, beam, V]
    return np.transpose(by_axis, (1, 2, 0, 3))


class Setup:
    """One attention configuration with random data, weights placed through GetMultiHeadAttnWeights."""

    def __init__(self, handle, rng, dtype=F32, nh=2, sizes=(4, 3, 5), proj=(3, 3, 2, 6), biases=True, nb=2, nbeam=1,
                 one_to_one=False, tq=3, tk=4, axes=(B, BEAM, T, V), sm=0.7, len_q=None, len_k=None, lo=None, hi=None,
                 math=cc.CUDNN_DEFAULT_MATH):
        self.h, self.dtype, self.nh, self.sm, self.axes = handle, dtype, nh, sm, axes
        qs, ks, vs = sizes
        qp, kp, vp, op = proj
        mode = (cc.CUDNN_ATTN_ENABLE_PROJ_BIASES if biases else 0) | (cc.CUDNN_ATTN_QUERYMAP_ONE_TO_ONE if one_to_one else 0)
        self.attn = cc.cudnnCreateAttnDescriptor()
        cc.cudnnSetAttnDescriptor(self.attn, mode, nh, sm, dtype, dtype, math, None, None,
                                  qs, ks, vs, qp, kp, vp, op, tq + 1, tk + 2, nb + 1, nbeam + 1)
        nbk = nbeam if one_to_one else 1
        self.one_to_one = one_to_one
        self.len_q = np.full((nb, nbeam), tq) if len_q is None else np.asarray(len_q).reshape(nb, nbeam)
        self.len_k = np.full((nb, nbk), tk) if len_k is None else np.asarray(len_k).reshape(nb, nbk)
        self.lo = np.zeros(tq, np.int32) if lo is None else np.asarray(lo, np.int32)
        self.hi = np.full(tq, 2 ** 31 - 1, np.int32) if hi is None else np.asarray(hi, np.int32)
        osize = op or nh * (vp or vs)
        self.osize = osize
        npt = NP[dtype]
        self.Q = rng.standard_normal((nb, nbeam, tq, qs))
        self.K = rng.standard_normal((nb, nbk, tk, ks))
        self.Vv = rng.standard_normal((nb, nbk, tk, vs))
        self.R = rng.standard_normal((nb, nbeam, tq, osize)) if qs == osize else None
        self.qd = seq_desc(dtype, tq, nb, nbeam, qs, axes, self.len_q)
        self.od = seq_desc(dtype, tq, nb, nbeam, osize, axes, self.len_q)
        self.kd = seq_desc(dtype, tk, nb, nbk, ks, axes, self.len_k)
        self.vd = seq_desc(dtype, tk, nb, nbk, vs, axes, self.len_k)
        self.wsize, self.wssize, self.rsize = cc.cudnnGetMultiHeadAttnBuffers(handle, self.attn)
        self.wbuf = np.zeros(max(self.wsize // npt().itemsize, 1), npt)
        self.W = {}
        desc = cc.cudnnCreateTensorDescriptor()
        for name, kind in KINDS.items():
            addr = cc.cudnnGetMultiHeadAttnWeights(handle, self.attn, kind, self.wsize, self.wbuf, desc)
            if addr == 0:
                self.W[name] = None
                continue
            _, nd, dims, strides = cc.cudnnGetTensorNdDescriptor(desc, 3)
            off = (addr - self.wbuf.ctypes.data) // npt().itemsize
            view = np.lib.stride_tricks.as_strided(self.wbuf[off:], dims, [s * npt().itemsize for s in strides])
            view[...] = rng.standard_normal(dims) * 0.6
            w = view.astype(np.float64)
            self.W[name] = w if name in "qkvo" else (w[:, :, 0] if name != "bo" else w[0, :, 0])
        self.bufs = {n: to_buf(x, axes, npt) for n, x in (("q", self.Q), ("k", self.K), ("v", self.Vv))}
        if self.R is not None:
            self.bufs["r"] = to_buf(self.R, axes, npt)
        self.out_shape = (nb, nbeam, tq, osize)

    def expected(self, residual=False):
        return reference(self.Q, self.K, self.Vv, self.W, self.nh, self.sm, self.lo, self.hi, self.len_q, self.len_k,
                         self.one_to_one, self.R if residual else None)

    def forward(self, residual=False, reserve=None, curr=-1, out=None, q=None, k=None, v=None, w=None):
        npt = NP[self.dtype]
        out = np.zeros(int(np.prod(self.out_shape)), npt) if out is None else out
        rsv = 0 if reserve is None else reserve.nbytes
        cc.cudnnMultiHeadAttnForward(self.h, self.attn, curr, self.lo, self.hi, None, None, self.qd,
                                     self.bufs["q"] if q is None else q, self.bufs["r"] if residual else None,
                                     self.kd, self.bufs["k"] if k is None else k, self.vd, self.bufs["v"] if v is None else v,
                                     self.od, out, self.wsize, self.wbuf if w is None else w, 0, None, rsv, reserve)
        return out

    def logical(self, out):
        return from_buf(out, self.out_shape, self.axes)


# -- forward -------------------------------------------------------------------------------------

CONFIGS = {
    "all_projections_biases": dict(),
    "no_projections_concat": dict(nh=2, sizes=(4, 4, 2), proj=(0, 0, 0, 0), biases=False, axes=(T, B, BEAM, V)),
    "kv_only_o_proj": dict(nh=3, sizes=(2, 2, 3), proj=(0, 0, 2, 2), biases=True, axes=(BEAM, T, B, V)),
    "beam_one_to_one": dict(nbeam=2, one_to_one=True, axes=(B, T, BEAM, V), len_q=[[3, 2], [1, 3]], len_k=[[4, 2], [3, 1]]),
    "beam_all_to_one": dict(nbeam=2, one_to_one=False, axes=(T, BEAM, B, V), len_q=[[2, 3], [3, 0]], len_k=[[3], [4]]),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_matches_formula(handle, rng, name):
    s = Setup(handle, rng, **CONFIGS[name])
    got = s.logical(s.forward())
    np.testing.assert_allclose(got, s.expected(), rtol=2e-5, atol=2e-5)


def test_half_data(handle, rng):
    s = Setup(handle, rng, dtype=F16)
    s.Q, s.K, s.Vv = (from_buf(s.bufs[n].astype(np.float64), x.shape, s.axes) for n, x in
                      (("q", s.Q), ("k", s.K), ("v", s.Vv)))  # the formula sees the half-rounded inputs
    got = s.logical(s.forward()).astype(np.float64)
    np.testing.assert_allclose(got, s.expected(), rtol=1e-2, atol=1e-2)


def test_causal_window_and_lengths(handle, rng):
    # row 0 has an empty window (lo = hi = 0): it attends to nothing; row 2 starts at key 1
    s = Setup(handle, rng, lo=[0, 0, 1], hi=[0, 2, 4], len_q=[3, 2], len_k=[4, 3])
    got = s.logical(s.forward())
    want = s.expected()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    assert np.all(got[1, 0, 2] == 0)  # padding row of batch 1 (len_q 2)
    assert np.allclose(got[0, 0, 0], s.W["bo"])  # empty window: only the output bias


@pytest.mark.parametrize("name", ["no_projections_concat", "kv_only_o_proj"])
def test_residuals(handle, rng, name):
    s = Setup(handle, rng, **CONFIGS[name])
    assert s.R is not None
    got = s.logical(s.forward(residual=True))
    np.testing.assert_allclose(got, s.expected(residual=True), rtol=2e-5, atol=2e-5)


def test_curr_idx_one_step_at_a_time(handle, rng):
    s = Setup(handle, rng, lo=[0, 0, 0], hi=[1, 2, 3])
    full = s.logical(s.forward())
    out = np.full(int(np.prod(s.out_shape)), 7.0, np.float32)
    for t in range(3):
        s.forward(curr=t, out=out)
        got = s.logical(out)
        np.testing.assert_allclose(got[:, :, :t + 1], full[:, :, :t + 1], rtol=1e-5, atol=1e-6)
        assert np.all(got[:, :, t + 1:] == 7.0)  # later steps not written yet


def test_double_and_cache_hit(handle, rng):
    s = Setup(handle, rng, dtype=F64)
    s.forward()
    before = cc.plan_cache_info()
    got = s.logical(s.forward())
    after = cc.plan_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    np.testing.assert_allclose(got, s.expected(), rtol=1e-12, atol=1e-12)


def test_training_forward_matches_inference(handle, rng):
    s = Setup(handle, rng)
    reserve = np.zeros(s.rsize, np.uint8)
    np.testing.assert_allclose(s.forward(reserve=reserve), s.forward(), rtol=0, atol=0)


# -- backward vs finite differences (float64) ----------------------------------------------------------

def _fd(fn, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in range(x.size):
        old = x.flat[i]
        x.flat[i] = old + eps
        up = fn()
        x.flat[i] = old - eps
        down = fn()
        x.flat[i] = old
        g.flat[i] = (up - down) / (2 * eps)
    return g


GRAD_CONFIGS = {
    "all_projections_biases": dict(nb=1, nbeam=2, one_to_one=False, tq=3, tk=3, sizes=(3, 2, 2), proj=(2, 2, 2, 3),
                                   lo=[0, 0, 1], hi=[1, 3, 3], len_q=[3, 2], len_k=[3]),
    "no_projections": dict(nb=2, nbeam=1, tq=2, tk=3, sizes=(2, 2, 1), proj=(0, 0, 0, 0), biases=False,
                           axes=(T, B, BEAM, V), len_q=[2, 1], len_k=[3, 2]),
    "one_to_one_v_o": dict(nb=1, nbeam=2, one_to_one=True, tq=2, tk=2, sizes=(2, 2, 2), proj=(0, 0, 2, 2),
                           axes=(BEAM, T, B, V), len_q=[2, 2], len_k=[2, 1]),
}


@pytest.mark.parametrize("name", sorted(GRAD_CONFIGS))
def test_backward_data_and_weights_vs_finite_differences(handle, rng, name):
    s = Setup(handle, rng, dtype=F64, **GRAD_CONFIGS[name])
    reserve = np.zeros(s.rsize, np.uint8)
    dout = rng.standard_normal(int(np.prod(s.out_shape)))

    def loss():
        return float(np.dot(s.forward(), dout))

    s.forward(reserve=reserve)
    dq, dk, dv = (np.full(s.bufs[n].size, np.nan) for n in "qkv")
    cc.cudnnMultiHeadAttnBackwardData(handle, s.attn, s.lo, s.hi, None, None, s.od, dout, s.qd, dq, s.bufs["q"],
                                      s.kd, dk, s.bufs["k"], s.vd, dv, s.bufs["v"], s.wsize, s.wbuf, 0, None,
                                      reserve.nbytes, reserve)
    for n, got in (("q", dq), ("k", dk), ("v", dv)):
        np.testing.assert_allclose(got, _fd(loss, s.bufs[n]), rtol=1e-6, atol=1e-7, err_msg=f"d{n}")
    if s.wsize:
        dw = np.full_like(s.wbuf, np.nan)
        cc.cudnnMultiHeadAttnBackwardWeights(handle, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, s.bufs["q"], s.kd, s.bufs["k"],
                                             s.vd, s.bufs["v"], s.od, dout, s.wsize, s.wbuf, dw, 0, None,
                                             reserve.nbytes, reserve)
        want = _fd(loss, s.wbuf)
        used = ~np.isnan(dw)  # alignment gaps between tensors are not written
        np.testing.assert_allclose(dw[used], want[used], rtol=1e-6, atol=1e-7)
        assert np.all(want[~used] == 0)
        prior = np.where(used, 0.5, np.nan)
        dw2 = prior.copy()
        cc.cudnnMultiHeadAttnBackwardWeights(handle, s.attn, cc.CUDNN_WGRAD_MODE_ADD, s.qd, s.bufs["q"], s.kd, s.bufs["k"],
                                             s.vd, s.bufs["v"], s.od, dout, s.wsize, s.wbuf, dw2, 0, None,
                                             reserve.nbytes, reserve)
        np.testing.assert_allclose(dw2[used], dw[used] + 0.5, rtol=1e-12)


def test_backward_weights_uses_the_forward_window(handle, rng):
    """BackwardWeights has no window arguments: the training forward's reserve space carries it."""
    cfg = dict(GRAD_CONFIGS["all_projections_biases"])
    s = Setup(handle, rng, dtype=F64, **cfg)
    dout = rng.standard_normal(int(np.prod(s.out_shape)))
    res_a, res_b = np.zeros(s.rsize, np.uint8), np.zeros(s.rsize, np.uint8)
    s.forward(reserve=res_a)
    s.lo, s.hi = np.zeros(3, np.int32), np.full(3, 3, np.int32)  # a different (full) window
    s.forward(reserve=res_b)
    dws = []
    for res in (res_a, res_b):
        dw = np.zeros_like(s.wbuf)
        cc.cudnnMultiHeadAttnBackwardWeights(handle, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, s.bufs["q"], s.kd, s.bufs["k"],
                                             s.vd, s.bufs["v"], s.od, dout, s.wsize, s.wbuf, dw, 0, None, res.nbytes, res)
        dws.append(dw)
    want_b = _fd(lambda: float(np.dot(s.forward(), dout)), s.wbuf)
    np.testing.assert_allclose(dws[1], want_b, rtol=1e-6, atol=1e-7)
    assert not np.allclose(dws[0], dws[1])


# -- descriptors -----------------------------------------------------------------------------------

def test_descriptor_getters_round_trip(handle, rng):
    s = Setup(handle, rng)
    got = cc.cudnnGetAttnDescriptor(s.attn)
    assert got == (cc.CUDNN_ATTN_ENABLE_PROJ_BIASES, 2, 0.7, F32, F32, cc.CUDNN_DEFAULT_MATH, None, None,
                   4, 3, 5, 3, 3, 2, 6, 4, 6, 3, 2)
    dt, nd, dims, axes, n, lengths, fill = cc.getSeqDataDescriptor(s.kd)
    assert (dt, nd, dims, axes, n, lengths, fill) == (F32, 4, [4, 2, 1, 3], [B, BEAM, T, V], 2, [4, 4], None)
    assert cc.getSeqDataDescriptor(s.kd, 2, 1)[2:6] == ([4, 2], [B, BEAM], 2, [4])
    # weights: [nHeads, projSize, origSize], biases [nHeads, projSize, 1], the output bias [1, oProjSize, 1]
    desc = cc.cudnnCreateTensorDescriptor()
    shapes = {}
    addrs = []
    for name, kind in KINDS.items():
        addr = cc.cudnnGetMultiHeadAttnWeights(handle, s.attn, kind, s.wsize, s.wbuf, desc)
        shapes[name] = cc.cudnnGetTensorNdDescriptor(desc, 3)[2]
        assert addr % 16 == 0
        addrs.append(addr)
    assert shapes == {"q": [2, 3, 4], "k": [2, 3, 3], "v": [2, 2, 5], "o": [2, 6, 2],
                      "bq": [2, 3, 1], "bk": [2, 3, 1], "bv": [2, 2, 1], "bo": [1, 6, 1]}
    assert len(set(addrs)) == 8 and max(addrs) < s.wbuf.ctypes.data + s.wsize
    cc.cudnnDestroyAttnDescriptor(None)  # NULL is a no-op
    cc.cudnnDestroySeqDataDescriptor(0)


def test_absent_weights_give_null(handle, rng):
    s = Setup(handle, rng, **CONFIGS["no_projections_concat"])
    assert s.wsize == 0 and all(w is None for w in s.W.values())


# -- errors ------------------------------------------------------------------------------------------

def _attn_args(**kw):
    args = dict(attnMode=0, nHeads=2, smScaler=1.0, dataType=F32, computePrec=F32, mathType=cc.CUDNN_DEFAULT_MATH,
                attnDropoutDesc=None, postDropoutDesc=None, qSize=4, kSize=4, vSize=4, qProjSize=2, kProjSize=2,
                vProjSize=2, oProjSize=4, qoMaxSeqLength=3, kvMaxSeqLength=3, maxBatchSize=2, maxBeamSize=1)
    args.update(kw)
    return args


@pytest.mark.parametrize("kw,status", [
    (dict(qProjSize=3), cc.CUDNN_STATUS_BAD_PARAM),  # post-projection Q and K sizes differ
    (dict(qProjSize=0), cc.CUDNN_STATUS_BAD_PARAM),  # Q unprojected (4) vs K projected (2)
    (dict(nHeads=0), cc.CUDNN_STATUS_BAD_PARAM),
    (dict(vSize=-1), cc.CUDNN_STATUS_BAD_PARAM),
    (dict(maxBeamSize=0), cc.CUDNN_STATUS_BAD_PARAM),
    (dict(oProjSize=-2), cc.CUDNN_STATUS_BAD_PARAM),
    (dict(smScaler=-0.5), cc.CUDNN_STATUS_BAD_PARAM),
    (dict(computePrec=F64), cc.CUDNN_STATUS_BAD_PARAM),  # not a Table 40 row
    (dict(mathType=cc.CUDNN_TENSOR_OP_MATH), cc.CUDNN_STATUS_BAD_PARAM),  # FLOAT allows DEFAULT / ALLOW_CONVERSION
    (dict(dataType=cc.CUDNN_DATA_INT8, computePrec=cc.CUDNN_DATA_INT8), cc.CUDNN_STATUS_BAD_PARAM),
    (dict(attnMode=4), cc.CUDNN_STATUS_BAD_PARAM),
])
def test_set_attn_descriptor_errors(kw, status):
    d = cc.cudnnCreateAttnDescriptor()
    cc.cudnnSetAttnDescriptor(d, *_attn_args().values())
    before = cc.cudnnGetAttnDescriptor(d)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetAttnDescriptor(d, *_attn_args(**kw).values())
    assert e.value.status == status
    assert cc.cudnnGetAttnDescriptor(d) == before  # unchanged


def test_set_attn_descriptor_dropout_not_supported(handle):
    drop = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnSetDropoutDescriptor(drop, handle, 0.1, None, 0, 1)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetAttnDescriptor(cc.cudnnCreateAttnDescriptor(), *_attn_args(attnDropoutDesc=drop).values())
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED and "attnDropoutDesc" in str(e.value)


@pytest.mark.parametrize("args,status", [
    ((F32, 3, [2, 1, 1, 4], [T, B, BEAM, V], 1, [2], None), cc.CUDNN_STATUS_NOT_SUPPORTED),  # nbDims != 4
    ((F32, 0, [2, 1, 1, 4], [T, B, BEAM, V], 1, [2], None), cc.CUDNN_STATUS_BAD_PARAM),  # nbDims <= 0
    ((F32, 4, [2, 1, 1, 4], [T, B, BEAM, V], 1, [2], 12345), cc.CUDNN_STATUS_NOT_SUPPORTED),
    ((99, 4, [2, 1, 1, 4], [T, B, BEAM, V], 1, [2], None), cc.CUDNN_STATUS_BAD_PARAM),  # invalid dataType
    ((cc.CUDNN_DATA_INT32, 4, [2, 1, 1, 4], [T, B, BEAM, V], 1, [2], None), cc.CUDNN_STATUS_NOT_SUPPORTED),
    ((F32, 4, [2, 2, 1, 4], [T, B, BEAM, V], 1, [2], None), cc.CUDNN_STATUS_BAD_PARAM),  # size != batch*beam
    ((F32, 4, [2, 1, 1, 4], [T, B, BEAM, V], 1, [3], None), cc.CUDNN_STATUS_BAD_PARAM),  # length > TIME
    ((F32, 4, [2, 1, 1, 4], [T, B, BEAM, V], 1, [-1], None), cc.CUDNN_STATUS_BAD_PARAM),
    ((F32, 4, [2, 1, 1, 4], [T, V, BEAM, B], 1, [2], None), cc.CUDNN_STATUS_BAD_PARAM),  # VECT not innermost
    ((F32, 4, [2, 1, 1, 4], [T, T, BEAM, V], 1, [2], None), cc.CUDNN_STATUS_BAD_PARAM),  # not a permutation
    ((F32, 4, [2, 0, 1, 4], [T, B, BEAM, V], 0, [], None), cc.CUDNN_STATUS_BAD_PARAM),  # zero dim
])
def test_set_seq_data_descriptor_errors(args, status):
    d = cc.cudnnCreateSeqDataDescriptor()
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetSeqDataDescriptor(d, *args)
    assert e.value.status == status


def _fwd_error(s, status, argname, **kw):
    out = np.full(int(np.prod(s.out_shape)), 3.0, np.float32)
    args = dict(handle=s.h, attnDesc=s.attn, currIdx=-1, loWinIdx=s.lo, hiWinIdx=s.hi, devSeqLengthsQO=None,
                devSeqLengthsKV=None, qDesc=s.qd, queries=s.bufs["q"], residuals=None, kDesc=s.kd, keys=s.bufs["k"],
                vDesc=s.vd, values=s.bufs["v"], oDesc=s.od, out=out, weightSizeInBytes=s.wsize, weights=s.wbuf,
                workSpaceSizeInBytes=0, workSpace=None, reserveSpaceSizeInBytes=0, reserveSpace=None)
    args.update(kw)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnMultiHeadAttnForward(*args.values())
    assert e.value.status == status and argname in str(e.value), str(e.value)
    assert np.all(out == 3.0)  # nothing written
    return e.value


def test_forward_errors_write_nothing(handle, rng):
    s = Setup(handle, rng)
    BP = cc.CUDNN_STATUS_BAD_PARAM
    _fwd_error(s, BP, "currIdx", currIdx=3)  # out of bound
    _fwd_error(s, BP, "currIdx", currIdx=1, reserveSpace=np.zeros(s.rsize, np.uint8), reserveSpaceSizeInBytes=s.rsize)
    _fwd_error(s, BP, "queries", queries=None)
    _fwd_error(s, BP, "keys", keys=0)
    _fwd_error(s, BP, "weightSizeInBytes", weightSizeInBytes=s.wsize - 16)
    _fwd_error(s, BP, "weights", weights=None)
    _fwd_error(s, BP, "residuals", residuals=s.bufs["q"])  # qSize 4 != the output length 6
    _fwd_error(s, BP, "reserveSpace", reserveSpace=np.zeros(8, np.uint8), reserveSpaceSizeInBytes=8)
    _fwd_error(s, BP, "reserveSpace", reserveSpaceSizeInBytes=s.rsize)  # size without a buffer
    _fwd_error(s, BP, "loWinIdx", loWinIdx=[0])  # fewer than Tq entries
    _fwd_error(s, BP, "kDesc", kDesc=s.vd)  # vector length 5 != kSize 3
    _fwd_error(s, BP, "oDesc", oDesc=s.qd)  # vector length 4 != the output length 6
    f64 = seq_desc(F64, 3, 2, 1, 4, s.axes, s.len_q)
    _fwd_error(s, BP, "qDesc", qDesc=f64)  # data type
    other_layout = seq_desc(F32, 4, 2, 1, 3, (T, B, BEAM, V), s.len_k)
    _fwd_error(s, BP, "kDesc", kDesc=other_layout)  # layouts must agree
    too_long = seq_desc(F32, 7, 2, 1, 3, s.axes, [7, 7])
    _fwd_error(s, BP, "kDesc", kDesc=too_long)  # time > kvMaxSeqLength
    wrong_len = seq_desc(F32, 4, 2, 1, 5, s.axes, [4, 3])
    _fwd_error(s, BP, "vDesc", vDesc=wrong_len)  # lengths differ from K's


def test_forward_beam_rules(handle, rng):
    s = Setup(handle, rng, nbeam=2, one_to_one=False)
    kd2 = seq_desc(F32, 4, 2, 2, 3, s.axes, [[4, 4], [4, 4]])
    vd2 = seq_desc(F32, 4, 2, 2, 5, s.axes, [[4, 4], [4, 4]])
    _fwd_error(s, cc.CUDNN_STATUS_BAD_PARAM, "kDesc", kDesc=kd2, vDesc=vd2,
               keys=np.zeros(48, np.float32), values=np.zeros(80, np.float32))  # ALL_TO_ONE: K beam must be 1


def test_backward_errors_write_nothing(handle, rng):
    s = Setup(handle, rng, dtype=F64, **GRAD_CONFIGS["all_projections_biases"])
    dout = rng.standard_normal(int(np.prod(s.out_shape)))
    dq, dk, dv = (np.full(s.bufs[n].size, 9.0) for n in "qkv")
    with pytest.raises(cc.CuDNNError) as e:  # no reserve space: gradients need a training forward
        cc.cudnnMultiHeadAttnBackwardData(handle, s.attn, s.lo, s.hi, None, None, s.od, dout, s.qd, dq, s.bufs["q"],
                                          s.kd, dk, s.bufs["k"], s.vd, dv, s.bufs["v"], s.wsize, s.wbuf, 0, None, 0, None)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "reserveSpace" in str(e.value)
    reserve = np.zeros(s.rsize, np.uint8)
    with pytest.raises(cc.CuDNNError) as e:  # dout descriptor of the wrong vector length
        cc.cudnnMultiHeadAttnBackwardData(handle, s.attn, s.lo, s.hi, None, None, s.kd, dout, s.qd, dq, s.bufs["q"],
                                          s.kd, dk, s.bufs["k"], s.vd, dv, s.bufs["v"], s.wsize, s.wbuf, 0, None,
                                          reserve.nbytes, reserve)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "doDesc" in str(e.value)
    assert np.all(dq == 9.0) and np.all(dk == 9.0) and np.all(dv == 9.0)
    dw = np.full_like(s.wbuf, 9.0)
    with pytest.raises(cc.CuDNNError) as e:  # invalid addGrad
        cc.cudnnMultiHeadAttnBackwardWeights(handle, s.attn, 7, s.qd, s.bufs["q"], s.kd, s.bufs["k"], s.vd, s.bufs["v"],
                                             s.od, dout, s.wsize, s.wbuf, dw, 0, None, reserve.nbytes, reserve)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "addGrad" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # dweights NULL
        cc.cudnnMultiHeadAttnBackwardWeights(handle, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, s.bufs["q"], s.kd, s.bufs["k"],
                                             s.vd, s.bufs["v"], s.od, dout, s.wsize, s.wbuf, None, 0, None,
                                             reserve.nbytes, reserve)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "dweights" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:  # reserve too small
        cc.cudnnMultiHeadAttnBackwardWeights(handle, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, s.bufs["q"], s.kd, s.bufs["k"],
                                             s.vd, s.bufs["v"], s.od, dout, s.wsize, s.wbuf, dw, 0, None, 16, reserve[:16])
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "reserveSpace" in str(e.value)
    assert np.all(dw == 9.0)


def test_get_weights_errors(handle, rng):
    s = Setup(handle, rng)
    desc = cc.cudnnCreateTensorDescriptor()
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetMultiHeadAttnWeights(handle, s.attn, 8, s.wsize, s.wbuf, desc)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "wKind" in str(e.value)
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetMultiHeadAttnWeights(handle, s.attn, cc.CUDNN_MH_ATTN_Q_WEIGHTS, s.wsize - 1, s.wbuf, desc)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "weightSizeInBytes" in str(e.value)


def test_both_spellings():
    for c_name in ("cudnnCreateAttnDescriptor", "cudnnSetAttnDescriptor", "cudnnGetAttnDescriptor",
                   "cudnnDestroyAttnDescriptor", "cudnnCreateSeqDataDescriptor", "cudnnSetSeqDataDescriptor",
                   "cudnnGetSeqDataDescriptor", "cudnnDestroySeqDataDescriptor", "cudnnGetMultiHeadAttnBuffers",
                   "cudnnGetMultiHeadAttnWeights", "cudnnMultiHeadAttnForward", "cudnnMultiHeadAttnBackwardData",
                   "cudnnMultiHeadAttnBackwardWeights"):
        cupy_name = c_name[5].lower() + c_name[6:]
        assert getattr(cc, c_name) is getattr(cc, cupy_name)


# -- GPU place (CuPy buffers, whichever engine the heuristics pick) against the CPU place -----------------

@pytest.mark.gpu
def test_gpu_place_matches_cpu(handle, rng):
    import cupy
    gpu = cc.cudnnCreate("gpu")
    s = Setup(handle, rng, **GRAD_CONFIGS["all_projections_biases"])
    dout = rng.standard_normal(int(np.prod(s.out_shape))).astype(np.float32)
    reserve = np.zeros(s.rsize, np.uint8)
    want_out = s.forward(reserve=reserve)
    want = [np.zeros_like(s.bufs[n]) for n in "qkv"]
    cc.cudnnMultiHeadAttnBackwardData(handle, s.attn, s.lo, s.hi, None, None, s.od, dout, s.qd, want[0], s.bufs["q"],
                                      s.kd, want[1], s.bufs["k"], s.vd, want[2], s.bufs["v"], s.wsize, s.wbuf, 0, None,
                                      reserve.nbytes, reserve)
    want_dw = np.zeros_like(s.wbuf)
    cc.cudnnMultiHeadAttnBackwardWeights(handle, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, s.bufs["q"], s.kd, s.bufs["k"],
                                         s.vd, s.bufs["v"], s.od, dout, s.wsize, s.wbuf, want_dw, 0, None,
                                         reserve.nbytes, reserve)
    d = {n: cupy.asarray(s.bufs[n]) for n in "qkv"}
    w, res, dd = cupy.asarray(s.wbuf), cupy.zeros(s.rsize, cupy.uint8), cupy.asarray(dout)
    out = cupy.zeros(want_out.size, cupy.float32)
    cc.cudnnMultiHeadAttnForward(gpu, s.attn, -1, s.lo, s.hi, None, None, s.qd, d["q"], None, s.kd, d["k"], s.vd, d["v"],
                                 s.od, out, s.wsize, w, 0, None, s.rsize, res)
    got = [cupy.zeros(s.bufs[n].size, cupy.float32) for n in "qkv"]
    cc.cudnnMultiHeadAttnBackwardData(gpu, s.attn, s.lo, s.hi, None, None, s.od, dd, s.qd, got[0], d["q"], s.kd, got[1],
                                      d["k"], s.vd, got[2], d["v"], s.wsize, w, 0, None, s.rsize, res)
    dw = cupy.zeros_like(w)
    cc.cudnnMultiHeadAttnBackwardWeights(gpu, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, d["q"], s.kd, d["k"], s.vd, d["v"],
                                         s.od, dd, s.wsize, w, dw, 0, None, s.rsize, res)
    np.testing.assert_allclose(out.get(), want_out, rtol=1e-4, atol=1e-5)
    for g, wnt in zip(got, want):
        np.testing.assert_allclose(g.get(), wnt, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw.get(), want_dw, rtol=1e-4, atol=1e-5)
    cc.cudnnDestroy(gpu)
