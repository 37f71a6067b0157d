"""CTC loss against the forward algorithm written here in log space (and, tiny, against
enumerating every alignment), gradients against finite differences of that loss (002 §8.2.3,
§8.2.4, §8.2.12, §8.2.13, §8.2.25-§8.2.27); every error rule with its status."""
import itertools

import numpy as np
import pytest

import cudnn_compat as cc
from conftest import tdesc

SOFTMAX, NONE = cc.CUDNN_LOSS_NORMALIZATION_SOFTMAX, cc.CUDNN_LOSS_NORMALIZATION_NONE
DET, NONDET = cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC, cc.CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC


def log_softmax(u):
    z = u - u.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def dp_cost(logp, label):
    """-log p(label | x) by the CTC forward recursion (Graves 2006, eq. 6-8), logp [T, A]."""
    ext = [0]
    for c in label:
        ext += [c, 0]
    alpha = np.full(len(ext), -np.inf)
    alpha[0] = logp[0, 0]
    if len(ext) > 1:
        alpha[1] = logp[0, ext[1]]
    for t in range(1, logp.shape[0]):
        new = np.full(len(ext), -np.inf)
        for s in range(len(ext)):
            acc = alpha[s]
            if s >= 1:
                acc = np.logaddexp(acc, alpha[s - 1])
            if s >= 2 and ext[s] != 0 and ext[s] != ext[s - 2]:
                acc = np.logaddexp(acc, alpha[s - 2])
            new[s] = acc + logp[t, ext[s]]
        alpha = new
    end = alpha[-1] if len(ext) == 1 else np.logaddexp(alpha[-1], alpha[-2])
    return -end


def brute_cost(probs, label):
    """-log of the summed probability of every path that collapses to ``label``."""
    total = 0.0
    for path in itertools.product(range(probs.shape[1]), repeat=probs.shape[0]):
        out, prev = [], None
        for c in path:
            if c != prev and c != 0:
                out.append(c)
            prev = c
        if out == list(label):
            total += np.prod([probs[t, c] for t, c in enumerate(path)])
    return -np.log(total)


def split(labels, lengths):
    starts = np.concatenate(([0], np.cumsum(lengths)))
    return [list(labels[starts[i]:starts[i + 1]]) for i in range(len(lengths))]


def ctc_desc(norm=SOFTMAX, grad=cc.CUDNN_NOT_PROPAGATE_NAN, v8=None):
    d = cc.cudnnCreateCTCLossDescriptor()
    if v8 is None:
        cc.cudnnSetCTCLossDescriptorEx(d, cc.CUDNN_DATA_FLOAT, norm, grad)
    else:
        cc.cudnnSetCTCLossDescriptor_v8(d, cc.CUDNN_DATA_FLOAT, norm, grad, v8)
    return d


def run_ctc(handle, u, labels, lab_len, in_len, norm=SOFTMAX, algo=DET, grad_mode=cc.CUDNN_NOT_PROPAGATE_NAN,
            v8=False, gradients=None):
    pd = tdesc(u.shape)
    d = ctc_desc(norm, grad_mode, max(lab_len) if v8 else None)
    costs = np.full(u.shape[1], np.nan, np.float32)
    grads = np.full(u.shape, np.nan, np.float32) if gradients is None else gradients
    if v8:
        ws = cc.cudnnGetCTCLossWorkspaceSize_v8(handle, algo, d, pd, pd)
        cc.cudnnCTCLoss_v8(handle, algo, d, pd, u, np.asarray(labels, np.int32), np.asarray(lab_len, np.int32),
                           np.asarray(in_len, np.int32), costs, pd, grads, ws, np.zeros(ws, np.uint8))
    else:
        ws = cc.cudnnGetCTCLossWorkspaceSize(handle, pd, pd, labels, lab_len, in_len, algo, d)
        cc.cudnnCTCLoss(handle, pd, u, labels, lab_len, in_len, costs, pd, grads, algo, d, np.zeros(ws, np.uint8), ws)
    return costs, grads


CASES = [  # (T, A, labels, label lengths, input lengths)
    (6, 5, [1, 2, 2, 3, 4, 1], [3, 2, 1], [6, 5, 2]),  # repeated label 2 needs a blank in between
    (5, 3, [1, 1, 2], [2, 1, 0], [5, 3, 4]),  # an empty label
    (8, 6, [5, 4, 3, 2, 1, 1, 1], [5, 2], [8, 8]),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("algo", [DET, NONDET])
@pytest.mark.parametrize("v8", [False, True])
def test_costs_match_forward_algorithm(handle, rng, case, algo, v8):
    t, a, labels, lab_len, in_len = CASES[case]
    u = rng.standard_normal((t, len(lab_len), a)).astype(np.float32)
    costs, grads = run_ctc(handle, u, labels, lab_len, in_len, algo=algo, v8=v8)
    logp = log_softmax(u.astype(np.float64))
    want = [dp_cost(logp[:in_len[n], n], lab) for n, lab in enumerate(split(labels, lab_len))]
    np.testing.assert_allclose(costs, want, rtol=1e-5)
    for n, tn in enumerate(in_len):
        assert np.all(grads[tn:, n] == 0)  # steps past the input length get no gradient


def test_dp_agrees_with_enumeration(handle, rng):
    u = rng.standard_normal((4, 2, 3)).astype(np.float32)
    labels, lab_len, in_len = [1, 2, 2], [2, 1], [4, 3]
    costs, _ = run_ctc(handle, u, labels, lab_len, in_len)
    y = np.exp(log_softmax(u.astype(np.float64)))
    want = [brute_cost(y[:in_len[n], n], lab) for n, lab in enumerate(split(labels, lab_len))]
    np.testing.assert_allclose(costs, want, rtol=1e-5)


@pytest.mark.parametrize("norm", [SOFTMAX, NONE])
def test_gradients_vs_finite_differences(handle, rng, norm):
    """Both modes give d cost / d u for the unnormalized activations u: SOFTMAX takes u, NONE
    takes softmax(u) (002 §8.1.1.1)."""
    t, a, labels, lab_len, in_len = CASES[0]
    u = rng.standard_normal((t, len(lab_len), a))
    inp = u if norm == SOFTMAX else np.exp(log_softmax(u))
    costs, grads = run_ctc(handle, inp.astype(np.float32), labels, lab_len, in_len, norm=norm)
    labs = split(labels, lab_len)
    weights = np.array([1.0, -0.7, 2.0])  # distinct weights per sample: catches crossed samples

    def loss(uu):
        logp = log_softmax(uu)
        return sum(w * dp_cost(logp[:in_len[n], n], labs[n]) for n, w in enumerate(weights))

    eps = 1e-6
    fd = np.zeros_like(u)
    for idx in np.ndindex(*u.shape):
        up, down = u.copy(), u.copy()
        up[idx] += eps
        down[idx] -= eps
        fd[idx] = (loss(up) - loss(down)) / (2 * eps)
    np.testing.assert_allclose(grads * weights[None, :, None], fd, rtol=2e-4, atol=2e-5)


def test_host_pointer_labels(handle, rng):
    t, a, labels, lab_len, in_len = CASES[0]
    u = rng.standard_normal((t, len(lab_len), a)).astype(np.float32)
    want_c, want_g = run_ctc(handle, u, labels, lab_len, in_len)
    arrays = [np.asarray(x, np.int32) for x in (labels, lab_len, in_len)]
    got_c, got_g = run_ctc(handle, u, *[x.ctypes.data for x in arrays])
    np.testing.assert_array_equal(got_c, want_c)
    np.testing.assert_array_equal(got_g, want_g)


@pytest.mark.parametrize("mode", [cc.CUDNN_NOT_PROPAGATE_NAN, cc.CUDNN_PROPAGATE_NAN])
def test_grad_mode_for_unalignable_samples(handle, rng, mode):
    """Sample 1 has L + R = 2 + 1 > T = 2 (002 §8.2.26): zero gradient, or untouched with PROPAGATE_NAN."""
    u = rng.standard_normal((3, 2, 3)).astype(np.float32)
    labels, lab_len, in_len = [1, 2, 1, 1], [2, 2], [3, 2]
    prior = np.full(u.shape, 5.0, np.float32)
    costs, grads = run_ctc(handle, u, labels, lab_len, in_len, grad_mode=mode, gradients=prior)
    assert np.isinf(costs[1]) and np.isfinite(costs[0])
    expected = 5.0 if mode == cc.CUDNN_PROPAGATE_NAN else 0.0
    assert np.all(grads[:, 1] == expected)
    assert np.all(np.isfinite(grads[:, 0])) and not np.all(grads[:, 0] == 5.0)


def test_descriptor_getters_and_default_modes():
    d = cc.cudnnCreateCTCLossDescriptor()
    cc.cudnnSetCTCLossDescriptor(d, cc.CUDNN_DATA_FLOAT)
    assert cc.cudnnGetCTCLossDescriptor(d) == cc.CUDNN_DATA_FLOAT
    assert cc.cudnnGetCTCLossDescriptorEx(d) == (cc.CUDNN_DATA_FLOAT, NONE, cc.CUDNN_NOT_PROPAGATE_NAN)
    cc.cudnnSetCTCLossDescriptor_v8(d, cc.CUDNN_DATA_FLOAT, SOFTMAX, cc.CUDNN_PROPAGATE_NAN, 17)
    assert cc.cudnnGetCTCLossDescriptor_v8(d) == (cc.CUDNN_DATA_FLOAT, SOFTMAX, cc.CUDNN_PROPAGATE_NAN, 17)
    assert cc.CTCLoss is cc.cudnnCTCLoss and cc.cTCLoss is cc.cudnnCTCLoss and cc.CTCLoss_v8 is cc.cudnnCTCLoss_v8
    cc.cudnnDestroyCTCLossDescriptor(d)


@pytest.mark.parametrize("args", [(99, NONE, 0), (cc.CUDNN_DATA_FLOAT, 5, 0), (cc.CUDNN_DATA_FLOAT, NONE, 7)])
def test_set_descriptor_bad_enums(args):
    d = cc.cudnnCreateCTCLossDescriptor()
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetCTCLossDescriptorEx(d, *args)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnSetCTCLossDescriptor_v8(d, cc.CUDNN_DATA_FLOAT, NONE, cc.CUDNN_NOT_PROPAGATE_NAN, 0)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and "maxLabelLength" in str(e.value)


def _ctc_error(handle, status, argname, shape=(4, 2, 5), labels=(1, 2, 3), lab_len=(2, 1), in_len=(4, 3), gshape=None,
               dtype=None, algo=DET, desc=None, ws=None, v8=False):
    u = np.ones(shape, np.float32)
    pd = tdesc(shape, dtype)
    gd = tdesc(gshape or shape, dtype)
    d = desc or ctc_desc(v8=3 if v8 else None)
    costs = np.full(shape[1], 7.0, np.float32)
    grads = np.full(gshape or shape, 7.0, np.float32)
    need = 10 ** 6 if ws is None else ws
    with pytest.raises(cc.CuDNNError) as e:
        if v8:
            cc.cudnnCTCLoss_v8(handle, algo, d, pd, u, list(labels), list(lab_len), list(in_len), costs, gd, grads, need,
                               np.zeros(max(need, 1), np.uint8))
        else:
            cc.cudnnCTCLoss(handle, pd, u, list(labels), list(lab_len), list(in_len), costs, gd, grads, algo, d,
                            np.zeros(max(need, 1), np.uint8), need)
    assert e.value.status == status and argname in str(e.value), str(e.value)
    assert np.all(costs == 7.0) and np.all(grads == 7.0)  # nothing written


def test_ctc_errors_write_nothing(handle):
    BP, NS = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED
    _ctc_error(handle, BP, "gradientsDesc", gshape=(4, 2, 6))  # probs and gradients dims differ
    _ctc_error(handle, BP, "hostInputLengths", in_len=(5, 3))  # longer than T = 4
    _ctc_error(handle, BP, "hostInputLengths", in_len=(0, 3))
    _ctc_error(handle, BP, "workSpaceSizeInBytes", ws=64)  # too small
    _ctc_error(handle, BP, "hostLabelLengths", labels=[1] * 258, lab_len=(257, 1), shape=(600, 2, 5), in_len=(600, 3))
    _ctc_error(handle, BP, "hostLabels", labels=(1, 5, 3))  # label 5 >= A = 5
    _ctc_error(handle, BP, "hostLabels", labels=(1, 0, 3))  # the blank is not a label
    _ctc_error(handle, BP, "probsDesc", shape=(4, 2, 5, 1), gshape=(4, 2, 5, 1))  # not [T, N, A]
    _ctc_error(handle, NS, "probsDesc", dtype=cc.CUDNN_DATA_DOUBLE)  # only FLOAT data
    _ctc_error(handle, NS, "algo", algo=7)
    d = cc.cudnnCreateCTCLossDescriptor()
    cc.cudnnSetCTCLossDescriptor(d, cc.CUDNN_DATA_DOUBLE)
    _ctc_error(handle, NS, "ctcLossDesc", desc=d)  # compute type other than FLOAT
    _ctc_error(handle, BP, "ctcLossDesc", v8=True, desc=ctc_desc())  # _v8 needs a _v8 descriptor
    _ctc_error(handle, BP, "labelLengths", v8=True, labels=(1, 2, 3, 4), lab_len=(4, 0))  # > maxLabelLength 3
    big = ctc_desc(v8=300)
    _ctc_error(handle, BP, "ctcLossDesc", v8=True, desc=big)  # maxLabelLength > 256


@pytest.mark.parametrize("v8", [False, True])
@pytest.mark.parametrize("field", ["labels", "lab_len", "in_len"])
def test_int_arrays_past_a_c_int_are_rejected_not_wrapped(handle, v8, field):
    """2**32 + k would wrap to the valid value k through int32: BAD_PARAM naming the array instead."""
    good = {"labels": (1, 2, 3), "lab_len": (2, 1), "in_len": (4, 3)}
    vals = list(good[field])
    vals[0] += 2 ** 32
    names = {"labels": ("hostLabels", "labels"), "lab_len": ("hostLabelLengths", "labelLengths"),
             "in_len": ("hostInputLengths", "inputLengths")}[field]
    _ctc_error(handle, cc.CUDNN_STATUS_BAD_PARAM, names[1] if v8 else names[0], v8=v8,
               desc=ctc_desc(v8=3) if v8 else None, **{field: np.array(vals, np.int64)})


def test_workspace_queries_agree_and_check_descriptors(handle):
    pd = tdesc((4, 2, 5))
    d = ctc_desc(v8=2)
    ws8 = cc.cudnnGetCTCLossWorkspaceSize_v8(handle, DET, d, pd, pd)
    ws = cc.cudnnGetCTCLossWorkspaceSize(handle, pd, pd, [1, 2, 3], [2, 1], [4, 3], DET, d)
    assert ws == ws8 > 0
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetCTCLossWorkspaceSize_v8(handle, DET, d, pd, tdesc((4, 2, 6)))
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM
    with pytest.raises(cc.CuDNNError) as e:
        cc.cudnnGetCTCLossWorkspaceSize(handle, pd, pd, [1, 2, 3], [2, 1], [4, 3], 9, d)
    assert e.value.status == cc.CUDNN_STATUS_NOT_SUPPORTED


@pytest.mark.gpu
@pytest.mark.parametrize("v8", [False, True])
def test_gpu_place_matches_cpu(handle, rng, v8):
    import cupy
    gpu = cc.cudnnCreate("gpu")
    t, a, labels, lab_len, in_len = CASES[0]
    u = rng.standard_normal((t, len(lab_len), a)).astype(np.float32)
    want_c, want_g = run_ctc(handle, u, labels, lab_len, in_len, v8=v8)
    pd = tdesc(u.shape)
    d = ctc_desc(SOFTMAX, cc.CUDNN_NOT_PROPAGATE_NAN, max(lab_len) if v8 else None)
    costs, grads = cupy.zeros(u.shape[1], cupy.float32), cupy.zeros(u.shape, cupy.float32)
    if v8:
        ws = cc.cudnnGetCTCLossWorkspaceSize_v8(gpu, DET, d, pd, pd)
        dev = [cupy.asarray(np.asarray(x, np.int32)) for x in (labels, lab_len, in_len)]
        cc.cudnnCTCLoss_v8(gpu, DET, d, pd, cupy.asarray(u), dev[0].data.ptr, dev[1], dev[2], costs, pd, grads, ws,
                           cupy.zeros(ws, cupy.uint8))
    else:
        ws = cc.cudnnGetCTCLossWorkspaceSize(gpu, pd, pd, labels, lab_len, in_len, DET, d)
        cc.cudnnCTCLoss(gpu, pd, cupy.asarray(u), labels, lab_len, in_len, costs, pd, grads, DET, d,
                        cupy.zeros(ws, cupy.uint8), ws)
    np.testing.assert_allclose(costs.get(), want_c, rtol=1e-5)
    np.testing.assert_allclose(grads.get(), want_g, rtol=1e-5, atol=1e-6)
    cc.cudnnDestroy(gpu)
