"""One valid CPU-place call per registered function that takes data or scalar pointers, for
tests/test_data_params.py: ``CALLS[c_name](h) -> (args, outputs)`` with ``args`` positional in the
function's order and ``outputs`` the arrays the call writes (each factory makes fresh buffers from a
fixed seed, so two calls of a factory give equal inputs)."""
from __future__ import annotations

import numpy as np

import cudnn_compat as cc
from conftest import tdesc
from test_data_args import _conv_descs as _conv  # x (2,3,4,4), w (2,3,3,3), pad 1, y (2,2,4,4)

F32, F64 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE
S = (2, 3, 4, 4)
N = 96
CALLS: dict = {}


def call(fn):
    CALLS["cudnn" + fn.__name__] = fn
    return fn


def _r(n, dtype=np.float32, seed=0, positive=False):
    v = np.random.default_rng(seed + n).standard_normal(n)
    return (np.abs(v) + 0.5 if positive else v).astype(dtype)


def _p(n, dtype=np.float32):
    return np.full(n, 7.0, dtype)


def _act(mode=cc.CUDNN_ACTIVATION_RELU):
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, mode, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    return ad


# -- element-wise, tensor ops, transforms -----------------------------------------------------------

@call
def ActivationForward(h):
    d, y = tdesc(S), _p(N)
    return [h, _act(), 1.0, d, _r(N), 0.0, d, y], [y]


@call
def ActivationBackward(h):
    d, dx = tdesc(S), _p(N)
    x = _r(N)
    return [h, _act(), 1.0, d, np.maximum(x, 0), d, _r(N, seed=1), d, x, 0.0, d, dx], [dx]


@call
def AddTensor(h):
    c = _r(N)
    return [h, 1.0, tdesc((1, 3, 1, 1)), _r(3), 1.0, tdesc(S), c], [c]


@call
def OpTensor(h):
    od = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(od, cc.CUDNN_OP_TENSOR_ADD, F32, cc.CUDNN_NOT_PROPAGATE_NAN)
    d, c = tdesc(S), _r(N, seed=2)
    return [h, od, 1.0, d, _r(N), 2.0, d, _r(N, seed=1), 0.5, d, c], [c]


@call
def ScaleTensor(h):
    y = _r(N)
    return [h, tdesc(S), y, 2.0], [y]


@call
def SetTensor(h):
    y = _r(N)
    return [h, tdesc(S), y, 3.0], [y]


@call
def TransformTensor(h):
    y = _r(N, seed=1)
    return [h, 1.0, tdesc(S), _r(N), 0.5, tdesc(S, fmt=cc.CUDNN_TENSOR_NHWC), y], [y]


def _trans():
    t = cc.cudnnCreateTensorTransformDescriptor()
    cc.cudnnSetTensorTransformDescriptor(t, 4, cc.CUDNN_TENSOR_NHWC, [0] * 4, [0] * 4, [1] * 4, cc.CUDNN_TRANSFORM_FOLD)
    return t


@call
def TransformTensorEx(h):
    y = _p(N)
    return [h, _trans(), 1.0, tdesc(S), _r(N), 0.0, tdesc(S, fmt=cc.CUDNN_TENSOR_NHWC), y], [y]


@call
def TransformFilter(h):
    src, dst = cc.cudnnCreateFilterDescriptor(), cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(src, F32, cc.CUDNN_TENSOR_NCHW, *S)
    cc.cudnnSetFilter4dDescriptor(dst, F32, cc.CUDNN_TENSOR_NHWC, *S)
    y = _p(N)
    return [h, _trans(), 1.0, src, _r(N), 0.0, dst, y], [y]


@call
def ReduceTensor(h):
    rd = cc.cudnnCreateReduceTensorDescriptor()
    cc.cudnnSetReduceTensorDescriptor(rd, cc.CUDNN_REDUCE_TENSOR_MAX, F32, cc.CUDNN_NOT_PROPAGATE_NAN,
                                      cc.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES, cc.CUDNN_32BIT_INDICES)
    ad, cd = tdesc(S), tdesc((2, 3, 1, 1))
    isz, wsz = cc.cudnnGetReductionIndicesSize(h, rd, ad, cd), cc.cudnnGetReductionWorkspaceSize(h, rd, ad, cd)
    idx, ws, c = np.zeros(max(isz // 4, 1), np.int32), np.zeros(max(wsz, 1), np.uint8), _p(6)
    return [h, rd, idx, isz, ws, wsz, 1.0, ad, _r(N), 0.0, cd, c], [idx, c]


@call
def SoftmaxForward(h):
    d, y = tdesc(S), _p(N)
    return [h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, d, _r(N), 0.0, d, y], [y]


@call
def SoftmaxBackward(h):
    d, dx = tdesc(S), _p(N)
    return [h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, d, _r(N), d, _r(N, seed=1), 0.0, d,
            dx], [dx]


def _pool():
    pd = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pd, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
    return pd


@call
def PoolingForward(h):
    y = _p(24)
    return [h, _pool(), 1.0, tdesc(S), _r(N), 0.0, tdesc((2, 3, 2, 2)), y], [y]


@call
def PoolingBackward(h):
    pd, xd, yd, x = _pool(), tdesc(S), tdesc((2, 3, 2, 2)), _r(N)
    y = _p(24)
    cc.cudnnPoolingForward(h, pd, 1.0, xd, x, 0.0, yd, y)
    dx = _p(N)
    return [h, pd, 1.0, yd, y, yd, _r(24, seed=1), xd, x, 0.0, xd, dx], [dx]


def _lrn():
    n = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(n, 3, 1e-3, 0.75, 2.0)
    return n


@call
def LRNCrossChannelForward(h):
    d, y = tdesc(S), _p(N)
    return [h, _lrn(), cc.CUDNN_LRN_CROSS_CHANNEL_DIM1, 1.0, d, _r(N), 0.0, d, y], [y]


@call
def LRNCrossChannelBackward(h):
    d, x, y, dx = tdesc(S), _r(N), _p(N), _p(N)
    n = _lrn()
    cc.cudnnLRNCrossChannelForward(h, n, cc.CUDNN_LRN_CROSS_CHANNEL_DIM1, 1.0, d, x, 0.0, d, y)
    return [h, n, cc.CUDNN_LRN_CROSS_CHANNEL_DIM1, 1.0, d, y, d, _r(N, seed=1), d, x, 0.0, d, dx], [dx]


@call
def DivisiveNormalizationForward(h):
    d, y = tdesc(S), _p(N)
    return [h, _lrn(), cc.CUDNN_DIVNORM_PRECOMPUTED_MEANS, 1.0, d, _r(N), _r(N, seed=1), _p(N), _p(N), 0.0, d, y], [y]


@call
def DivisiveNormalizationBackward(h):
    d, dx, dm = tdesc(S), _p(N), _p(N)
    return [h, _lrn(), cc.CUDNN_DIVNORM_PRECOMPUTED_MEANS, 1.0, d, _r(N), _r(N, seed=1), _r(N, seed=2), _p(N), _p(N),
            0.0, d, dx, dm], [dx, dm]


# -- convolution -----------------------------------------------------------------------------------

FWD, BWD_D, BWD_F = (cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
                     cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0)


@call
def ConvolutionForward(h):
    xd, wd, cd, yd = _conv()
    y = _p(64)
    return [h, 1.0, xd, _r(N), wd, _r(54), cd, FWD, np.zeros(64, np.uint8), 64, 0.0, yd, y], [y]


@call
def ConvolutionBackwardData(h):
    xd, wd, cd, yd = _conv()
    dx = _p(N)
    return [h, 1.0, wd, _r(54), yd, _r(64), cd, BWD_D, np.zeros(64, np.uint8), 64, 0.0, xd, dx], [dx]


@call
def ConvolutionBackwardFilter(h):
    xd, wd, cd, yd = _conv()
    dw = _p(54)
    return [h, 1.0, xd, _r(N), yd, _r(64), cd, BWD_F, np.zeros(64, np.uint8), 64, 0.0, wd, dw], [dw]


@call
def ConvolutionBackwardBias(h):
    db = _p(2)
    return [h, 1.0, tdesc((2, 2, 4, 4)), _r(64), 0.0, tdesc((1, 2, 1, 1)), db], [db]


@call
def ConvolutionBiasActivationForward(h):
    xd, wd, cd, yd = _conv()
    y = _p(64)
    return [h, 1.0, xd, _r(N), wd, _r(54), cd, FWD, np.zeros(64, np.uint8), 64, 0.5, yd, _r(64, seed=3),
            tdesc((1, 2, 1, 1)), _r(2), _act(), yd, y], [y]


@call
def FindConvolutionForwardAlgorithmEx(h):
    xd, wd, cd, yd = _conv()
    y = _p(64)
    return [h, xd, _r(N), wd, _r(54), cd, yd, y, 1, np.zeros(64, np.uint8), 64], []


@call
def FindConvolutionBackwardDataAlgorithmEx(h):
    xd, wd, cd, yd = _conv()
    return [h, wd, _r(54), yd, _r(64), cd, xd, _p(N), 1, np.zeros(64, np.uint8), 64], []


@call
def FindConvolutionBackwardFilterAlgorithmEx(h):
    xd, wd, cd, yd = _conv()
    return [h, xd, _r(N), yd, _r(64), cd, wd, _p(54), 1, np.zeros(64, np.uint8), 64], []


@call
def Im2Col(h):
    xd, wd, cd, _ = _conv()
    col = _p(2 * 27 * 16)
    return [h, xd, _r(N), wd, cd, col], [col]


# -- batch norm and normalization ------------------------------------------------------------------

SPATIAL = cc.CUDNN_BATCHNORM_SPATIAL


@call
def BatchNormalizationForwardInference(h):
    y = _p(N)
    return [h, SPATIAL, 1.0, 0.0, tdesc(S), _r(N), tdesc(S), y, tdesc((1, 3, 1, 1)), _r(3), _r(3, seed=1),
            _r(3, seed=2), _r(3, positive=True), 1e-5], [y]


@call
def BatchNormalizationForwardTraining(h):
    y, rm, rv, sm, si = _p(N), _r(3), _r(3, positive=True), _p(3), _p(3)
    return [h, SPATIAL, 1.0, 0.0, tdesc(S), _r(N), tdesc(S), y, tdesc((1, 3, 1, 1)), _r(3, seed=1), _r(3, seed=2), 0.1,
            rm, rv, 1e-5, sm, si], [y, rm, rv, sm, si]


@call
def BatchNormalizationBackward(h):
    dx, ds, db = _p(N), _p(3), _p(3)
    return [h, SPATIAL, 1.0, 0.0, 1.0, 0.0, tdesc(S), _r(N), tdesc(S), _r(N, seed=1), tdesc(S), dx, tdesc((1, 3, 1, 1)),
            _r(3), ds, db, 1e-5, _r(3, seed=2), _r(3, positive=True)], [dx, ds, db]


PERSIST, BN_ACT = cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT, cc.CUDNN_BATCHNORM_OPS_BN_ACTIVATION


@call
def BatchNormalizationForwardTrainingEx(h):
    y, rm, rv, sm, si = _p(N), _r(3), _r(3, positive=True), _p(3), _p(3)
    return [h, PERSIST, BN_ACT, 1.0, 0.0, tdesc(S), _r(N), None, None, tdesc(S), y, tdesc((1, 3, 1, 1)), _r(3, seed=1),
            _r(3, seed=2), 0.1, rm, rv, 1e-5, sm, si, _act(), np.zeros(8, np.uint8), 8, np.zeros(8, np.uint8), 8], \
        [y, rm, rv, sm, si]


@call
def BatchNormalizationBackwardEx(h):
    dx, ds, db = _p(N), _p(3), _p(3)
    return [h, PERSIST, BN_ACT, 1.0, 0.0, 1.0, 0.0, tdesc(S), _r(N), tdesc(S), _r(N, positive=True), tdesc(S),
            _r(N, seed=1), None, None, tdesc(S), dx, tdesc((1, 3, 1, 1)), _r(3), _r(3, seed=1), ds, db, 1e-5,
            _r(3, seed=2), _r(3, positive=True), _act(), np.zeros(8, np.uint8), 8, np.zeros(8, np.uint8), 8], [dx, ds, db]


NORM = (cc.CUDNN_NORM_PER_CHANNEL, cc.CUDNN_NORM_OPS_NORM, cc.CUDNN_NORM_ALGO_STANDARD)


@call
def NormalizationForwardInference(h):
    y, pd = _p(N), tdesc((1, 3, 1, 1))
    return [h, *NORM, 1.0, 0.0, tdesc(S), _r(N), pd, _r(3), _r(3, seed=1), pd, _r(3, seed=2), _r(3, positive=True),
            None, None, None, tdesc(S), y, 1e-5, 1], [y]


@call
def NormalizationForwardTraining(h):
    y, rm, rv, sm, si, pd = _p(N), _r(3), _r(3, positive=True), _p(3), _p(3), tdesc((1, 3, 1, 1))
    return [h, *NORM, 1.0, 0.0, tdesc(S), _r(N), pd, _r(3, seed=1), _r(3, seed=2), 0.1, pd, rm, rv, 1e-5, sm, si,
            None, None, None, tdesc(S), y, np.zeros(8, np.uint8), 8, np.zeros(8, np.uint8), 8, 1], [y, rm, rv, sm, si]


@call
def NormalizationBackward(h):
    dx, ds, db, pd = _p(N), _p(3), _p(3), tdesc((1, 3, 1, 1))
    return [h, *NORM, 1.0, 0.0, 1.0, 0.0, tdesc(S), _r(N), None, None, tdesc(S), _r(N, seed=1), None, None, tdesc(S), dx,
            pd, _r(3), _r(3, seed=1), ds, db, 1e-5, pd, _r(3, seed=2), _r(3, positive=True), None,
            np.zeros(8, np.uint8), 8, np.zeros(8, np.uint8), 8, 1], [dx, ds, db]


# -- dropout, spatial transformer ------------------------------------------------------------------

def _dropout(h):
    size = cc.cudnnDropoutGetStatesSize(h)
    d, st = cc.cudnnCreateDropoutDescriptor(), np.zeros(size, np.uint8)
    cc.cudnnSetDropoutDescriptor(d, h, 0.5, st, size, 5)
    return d, st, size


@call
def SetDropoutDescriptor(h):
    size = cc.cudnnDropoutGetStatesSize(h)
    st = np.zeros(size, np.uint8)
    return [cc.cudnnCreateDropoutDescriptor(), h, 0.5, st, size, 5], [st]


@call
def RestoreDropoutDescriptor(h):
    d, st, size = _dropout(h)
    return [cc.cudnnCreateDropoutDescriptor(), h, 0.5, st, size, 5], []


@call
def DropoutForward(h):
    d, _st, _ = _dropout(h)
    xd = tdesc((1, 1, 1, 64))
    rsz = cc.cudnnDropoutGetReserveSpaceSize(xd)
    y, rs = _p(64), np.zeros(rsz, np.uint8)
    return [h, d, xd, _r(64), xd, y, rs, rsz], [y, rs]


@call
def DropoutBackward(h):
    d, _st, _ = _dropout(h)
    xd = tdesc((1, 1, 1, 64))
    rsz = cc.cudnnDropoutGetReserveSpaceSize(xd)
    rs = np.zeros(rsz, np.uint8)
    cc.cudnnDropoutForward(h, d, xd, _r(64), xd, _p(64), rs, rsz)
    dx = _p(64)
    return [h, d, xd, _r(64, seed=1), xd, dx, rs, rsz], [dx]


def _st():
    d = cc.cudnnCreateSpatialTransformerDescriptor()
    cc.cudnnSetSpatialTransformerNdDescriptor(d, cc.CUDNN_SAMPLER_BILINEAR, F32, 4, list(S))
    return d


@call
def SpatialTfGridGeneratorForward(h):
    grid = _p(2 * 4 * 4 * 2)
    return [h, _st(), _r(12), grid], [grid]


@call
def SpatialTfGridGeneratorBackward(h):
    dt = _p(12)
    return [h, _st(), _r(64), dt], [dt]


@call
def SpatialTfSamplerForward(h):
    y = _p(N)
    return [h, _st(), 1.0, tdesc(S), _r(N), _r(64) * 0.5, 0.0, tdesc(S), y], [y]


@call
def SpatialTfSamplerBackward(h):
    dx, dg = _p(N), _p(64)
    return [h, _st(), 1.0, tdesc(S), _r(N), 0.0, tdesc(S), dx, 1.0, tdesc(S), _r(N, seed=1), _r(64) * 0.5, 0.0, dg], \
        [dx, dg]


# -- RNN ---------------------------------------------------------------------------------------------

def _rnn(h):
    from test_rnn_reference import data_desc, make_net, pack, state_desc
    rng = np.random.default_rng(5)
    net = make_net(h, cc.CUDNN_LSTM, D=1, L=1, rng=rng, dtype=np.float64)
    lengths, T, layout = (3, 2), 3, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
    B, I, H, P = len(lengths), net["I"], net["H"], net["P"]
    xs = [rng.standard_normal((n, I)) for n in lengths]
    s = dict(net=net, xd=data_desc(net["dt"], layout, T, B, I, lengths), yd=data_desc(net["dt"], layout, T, B, P, lengths),
             x=pack(xs, layout, T, I, np.float64), hd=state_desc(np.float64, 1, B, P), cd=state_desc(np.float64, 1, B, H),
             seq=np.array(lengths, np.int32), hx=rng.standard_normal(B * P), cx=rng.standard_normal(B * H), T=T)
    s["ws"], s["rs"] = cc.cudnnGetRNNTempSpaceSizes(h, net["desc"], cc.CUDNN_FWD_MODE_TRAINING, s["xd"])
    s["y"], s["hy"], s["cy"] = _p(T * B * P, np.float64), _p(B * P, np.float64), _p(B * H, np.float64)
    s["wsb"], s["rsb"] = np.zeros(s["ws"], np.uint8), np.zeros(max(s["rs"], 1), np.uint8)
    return s


def _rnn_forward_args(h, s):
    n = s["net"]
    return [h, n["desc"], cc.CUDNN_FWD_MODE_TRAINING, s["seq"], s["xd"], s["x"], s["yd"], s["y"], s["hd"], s["hx"],
            s["hy"], s["cd"], s["cx"], s["cy"], n["wsize"], n["wspace"], s["ws"], s["wsb"], s["rs"], s["rsb"]]


@call
def RNNForward(h):
    s = _rnn(h)
    return _rnn_forward_args(h, s), [s["y"], s["hy"], s["cy"]]


def _rnn_after_forward(h):
    s = _rnn(h)
    cc.cudnnRNNForward(*_rnn_forward_args(h, s))
    return s


@call
def RNNBackwardData_v8(h):
    s, n = _rnn_after_forward(h), None
    n = s["net"]
    dx, dhx, dcx = _p(s["x"].size, np.float64), _p(s["hx"].size, np.float64), _p(s["cx"].size, np.float64)
    return [h, n["desc"], s["seq"], s["yd"], s["y"], np.ones_like(s["y"]), s["xd"], dx, s["hd"], s["hx"], None, dhx,
            s["cd"], s["cx"], None, dcx, n["wsize"], n["wspace"], s["ws"], s["wsb"], s["rs"], s["rsb"]], [dx, dhx, dcx]


@call
def RNNBackwardWeights_v8(h):
    s = _rnn_after_forward(h)
    n = s["net"]
    dw = np.zeros(n["wsize"] // 8)
    return [h, n["desc"], cc.CUDNN_WGRAD_MODE_ADD, s["seq"], s["xd"], s["x"], s["hd"], s["hx"], s["yd"], s["y"],
            n["wsize"], dw, s["ws"], s["wsb"], s["rs"], s["rsb"]], [dw]


@call
def GetRNNWeightParams(h):
    s = _rnn(h)
    n = s["net"]
    return [h, n["desc"], 0, n["wsize"], n["wspace"], 0, cc.cudnnCreateTensorDescriptor(),
            cc.cudnnCreateTensorDescriptor()], []


def _legacy_rnn(h):
    s = _rnn(h)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wd, F64, cc.CUDNN_TENSOR_NCHW, 3, [s["net"]["wsize"] // 8, 1, 1])
    s["wd"] = wd
    return s


def _legacy_forward_args(h, s):
    n = s["net"]
    return [h, n["desc"], s["xd"], s["x"], s["hd"], s["hx"], s["cd"], s["cx"], s["wd"], n["wspace"], s["yd"], s["y"],
            s["hd"], s["hy"], s["cd"], s["cy"]] + [None] * 8


@call
def RNNForwardTrainingEx(h):
    s = _legacy_rnn(h)
    return _legacy_forward_args(h, s) + [s["wsb"], s["ws"], s["rsb"], s["rs"]], [s["y"], s["hy"], s["cy"]]


@call
def RNNForwardInferenceEx(h):
    s = _legacy_rnn(h)
    return _legacy_forward_args(h, s) + [s["wsb"], s["ws"]], [s["y"], s["hy"], s["cy"]]


@call
def RNNBackwardWeightsEx(h):
    s = _legacy_rnn(h)
    cc.cudnnRNNForwardTrainingEx(*_legacy_forward_args(h, s), s["wsb"], s["ws"], s["rsb"], s["rs"])
    dw = np.zeros(s["net"]["wsize"] // 8)
    return [h, s["net"]["desc"], s["xd"], s["x"], s["hd"], s["hx"], s["yd"], s["y"], s["wsb"], s["ws"], s["wd"], dw,
            s["rsb"], s["rs"]], [dw]


def _lin(h, bias):
    s = _legacy_rnn(h)
    from test_rnn_reference import tdesc3
    return [h, s["net"]["desc"], 0, tdesc3((2, s["net"]["I"], 1), F64), s["wd"], s["net"]["wspace"], 0,
            cc.cudnnCreateFilterDescriptor()], []


@call
def GetRNNLinLayerMatrixParams(h):
    return _lin(h, False)


@call
def GetRNNLinLayerBiasParams(h):
    return _lin(h, True)


# -- attention, CTC ----------------------------------------------------------------------------------

def _attention(h):
    from test_attention import F64 as AF64, GRAD_CONFIGS, Setup
    return Setup(h, np.random.default_rng(3), dtype=AF64, **GRAD_CONFIGS["all_projections_biases"])


def _attn_forward_args(h, s, out, reserve):
    return [h, s.attn, -1, s.lo, s.hi, None, None, s.qd, s.bufs["q"], None, s.kd, s.bufs["k"], s.vd, s.bufs["v"], s.od,
            out, s.wsize, s.wbuf, 0, None, reserve.nbytes, reserve]


@call
def MultiHeadAttnForward(h):
    s = _attention(h)
    out, reserve = _p(int(np.prod(s.out_shape)), np.float64), np.zeros(s.rsize, np.uint8)
    return _attn_forward_args(h, s, out, reserve), [out]


def _attn_after_forward(h):
    s = _attention(h)
    out, reserve = _p(int(np.prod(s.out_shape)), np.float64), np.zeros(s.rsize, np.uint8)
    cc.cudnnMultiHeadAttnForward(*_attn_forward_args(h, s, out, reserve))
    return s, out, reserve


@call
def MultiHeadAttnBackwardData(h):
    s, out, reserve = _attn_after_forward(h)
    dq, dk, dv = (_p(s.bufs[n].size, np.float64) for n in "qkv")
    return [h, s.attn, s.lo, s.hi, None, None, s.od, np.ones_like(out), s.qd, dq, s.bufs["q"], s.kd, dk, s.bufs["k"],
            s.vd, dv, s.bufs["v"], s.wsize, s.wbuf, 0, None, reserve.nbytes, reserve], [dq, dk, dv]


@call
def MultiHeadAttnBackwardWeights(h):
    s, out, reserve = _attn_after_forward(h)
    dw = np.zeros_like(s.wbuf)
    return [h, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, s.bufs["q"], s.kd, s.bufs["k"], s.vd, s.bufs["v"], s.od,
            np.ones_like(out), s.wsize, s.wbuf, dw, 0, None, reserve.nbytes, reserve], [dw]


@call
def GetMultiHeadAttnWeights(h):
    s = _attention(h)
    return [h, s.attn, cc.CUDNN_MH_ATTN_Q_WEIGHTS, s.wsize, s.wbuf, cc.cudnnCreateTensorDescriptor()], []


def _ctc(h):
    u = _r(60).reshape(6, 2, 5)
    pd = tdesc(u.shape)
    d = cc.cudnnCreateCTCLossDescriptor()
    cc.cudnnSetCTCLossDescriptor_v8(d, F32, cc.CUDNN_LOSS_NORMALIZATION_SOFTMAX, cc.CUDNN_NOT_PROPAGATE_NAN, 3)
    return u, pd, d, np.array([1, 2, 3, 4], np.int32), np.array([3, 1], np.int32), np.array([6, 5], np.int32)


@call
def CTCLoss_v8(h):
    u, pd, d, lab, lab_len, in_len = _ctc(h)
    algo = cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC
    ws = cc.cudnnGetCTCLossWorkspaceSize_v8(h, algo, d, pd, pd)
    costs, grads = _p(2), _p(u.size)
    return [h, algo, d, pd, u, lab, lab_len, in_len, costs, pd, grads, ws, np.zeros(max(ws, 1), np.uint8)], [costs, grads]


@call
def CTCLoss(h):
    u, pd, d, lab, lab_len, in_len = _ctc(h)
    algo = cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC
    ws = cc.cudnnGetCTCLossWorkspaceSize(h, pd, pd, lab, lab_len, in_len, algo, d)
    costs, grads = _p(2), _p(u.size)
    return [h, pd, u, lab, lab_len, in_len, costs, pd, grads, algo, d, np.zeros(max(ws, 1), np.uint8), ws], [costs, grads]


# -- descriptors with a fill value -------------------------------------------------------------------

@call
def SetRNNDataDescriptor(h):
    return [cc.cudnnCreateRNNDataDescriptor(), F32, cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, 3, 2, 4, [3, 2],
            0.5], []


@call
def SetSeqDataDescriptor(h):
    return [cc.cudnnCreateSeqDataDescriptor(), F32, 4, [3, 2, 1, 4],
            [cc.CUDNN_SEQDATA_TIME_DIM, cc.CUDNN_SEQDATA_BATCH_DIM, cc.CUDNN_SEQDATA_BEAM_DIM, cc.CUDNN_SEQDATA_VECT_DIM],
            2, [3, 2], None], []


# -- the v6/v7 RNN calls over arrays of per-step descriptors -----------------------------------------

def _v6(h):
    from test_rnn_legacy import step_descs, v6_net
    from test_rnn_reference import tdesc3
    batches, I, H = [2, 2, 1], 3, 4
    d, _drop = v6_net(h, cc.CUDNN_LSTM, 1, 1, H)
    xds, yds = step_descs(batches, I), step_descs(batches, H)
    size = cc.cudnnGetRNNParamsSize(h, d, xds[0], F64)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wd, F64, cc.CUDNN_TENSOR_NCHW, 3, [size // 8, 1, 1])
    T, n = len(batches), sum(batches)
    s = dict(d=d, T=T, xds=xds, yds=yds, wd=wd, w=_r(size // 8, np.float64) * 0.3, hd=tdesc3((1, 2, H), F64),
             x=_r(n * I, np.float64), hx=_r(2 * H, np.float64, 1), cx=_r(2 * H, np.float64, 2), y=_p(n * H, np.float64),
             hy=_p(2 * H, np.float64), cy=_p(2 * H, np.float64), n=n, I=I, H=H)
    s["wss"], s["rss"] = cc.cudnnGetRNNWorkspaceSize(h, d, T, xds), cc.cudnnGetRNNTrainingReserveSize(h, d, T, xds)
    s["ws"], s["rs"] = np.zeros(s["wss"], np.uint8), np.zeros(s["rss"], np.uint8)
    return s


def _v6_fwd(h, s):
    return [h, s["d"], s["T"], s["xds"], s["x"], s["hd"], s["hx"], s["hd"], s["cx"], s["wd"], s["w"], s["yds"], s["y"],
            s["hd"], s["hy"], s["hd"], s["cy"]]


@call
def RNNForwardTraining(h):
    s = _v6(h)
    return _v6_fwd(h, s) + [s["ws"], s["wss"], s["rs"], s["rss"]], [s["y"], s["hy"], s["cy"]]


@call
def RNNForwardInference(h):
    s = _v6(h)
    return _v6_fwd(h, s) + [s["ws"], s["wss"]], [s["y"], s["hy"], s["cy"]]


@call
def FindRNNForwardTrainingAlgorithmEx(h):
    s = _v6(h)
    return _v6_fwd(h, s) + [0.0, 1, s["ws"], s["wss"], s["rs"], s["rss"]], []


@call
def FindRNNForwardInferenceAlgorithmEx(h):
    s = _v6(h)
    return _v6_fwd(h, s) + [0.0, 1, s["ws"], s["wss"]], []


def _v6_trained(h):
    s = _v6(h)
    cc.cudnnRNNForwardTraining(*_v6_fwd(h, s), s["ws"], s["wss"], s["rs"], s["rss"])
    H = s["H"]
    s.update(dy=_r(s["n"] * H, np.float64, 3), dhy=_r(2 * H, np.float64, 4), dcy=_r(2 * H, np.float64, 5),
             dx=_p(s["n"] * s["I"], np.float64), dhx=_p(2 * H, np.float64), dcx=_p(2 * H, np.float64))
    return s


def _v6_bwd(h, s):
    return [h, s["d"], s["T"], s["yds"], s["y"], s["yds"], s["dy"], s["hd"], s["dhy"], s["hd"], s["dcy"], s["wd"], s["w"],
            s["hd"], s["hx"], s["hd"], s["cx"], s["xds"], s["dx"], s["hd"], s["dhx"], s["hd"], s["dcx"]]


@call
def RNNBackwardData(h):
    s = _v6_trained(h)
    return _v6_bwd(h, s) + [s["ws"], s["wss"], s["rs"], s["rss"]], [s["dx"], s["dhx"], s["dcx"]]


@call
def FindRNNBackwardDataAlgorithmEx(h):
    s = _v6_trained(h)
    return _v6_bwd(h, s) + [0.0, 1, s["ws"], s["wss"], s["rs"], s["rss"]], []


@call
def RNNBackwardWeights(h):
    s = _v6_trained(h)
    dw = np.zeros_like(s["w"])
    return [h, s["d"], s["T"], s["xds"], s["x"], s["hd"], s["hx"], s["yds"], s["y"], s["ws"], s["wss"], s["wd"], dw,
            s["rs"], s["rss"]], [dw]


@call
def FindRNNBackwardWeightsAlgorithmEx(h):
    s = _v6_trained(h)
    return [h, s["d"], s["T"], s["xds"], s["x"], s["hd"], s["hx"], s["yds"], s["y"], 0.0, 1, s["ws"], s["wss"], s["wd"],
            np.zeros_like(s["w"]), s["rs"], s["rss"]], []


@call
def RNNBackwardDataEx(h):
    s = _legacy_rnn(h)
    cc.cudnnRNNForwardTrainingEx(*_legacy_forward_args(h, s), s["wsb"], s["ws"], s["rsb"], s["rs"])
    dx, dhx, dcx = _p(s["x"].size, np.float64), _p(s["hx"].size, np.float64), _p(s["cx"].size, np.float64)
    return [h, s["net"]["desc"], s["yd"], s["y"], s["yd"], np.ones_like(s["y"]), None, None, s["hd"], None, s["cd"],
            None, s["wd"], s["net"]["wspace"], s["hd"], s["hx"], s["cd"], s["cx"], s["xd"], dx, s["hd"], dhx, s["cd"],
            dcx, None, None, s["wsb"], s["ws"], s["rsb"], s["rs"]], [dx, dhx, dcx]


@call
def ReorderFilterAndBias(h):
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, cc.CUDNN_DATA_INT8x32, cc.CUDNN_TENSOR_NCHW_VECT_C, 2, 32, 3, 3)
    w = (np.arange(2 * 32 * 9) % 200 - 100).astype(np.int8)
    rw, rb = np.zeros_like(w), np.zeros(2, np.float32)
    return [h, wd, cc.CUDNN_DEFAULT_REORDER, w, rw, 1, _r(2), rb], [rw, rb]
