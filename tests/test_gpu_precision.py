"""Precision of every op kind the GPU engines run (issue 13 item 7): each case below runs on a GPU
handle in float32 and float64 and is compared with the same call on a CPU handle (the reference
engine, float64 arithmetic), with cuDNN's engine choice and with each GPU engine forced.  The
error must be at the data type's level (float32: relative 1e-5, FMA_MATH where a math type
exists; float64: 1e-12), not at fp16's or TF32's (~1e-3): an intermediate or accumulator kept
narrower than the compute type anywhere fails here.  A CPU test runs the same cases on a CPU
handle, records every graph they build and scans the CUDA sources the cupy engine generates for
them (pure Python, no GPU): no 16-bit float type or conversion may appear in a kernel of a graph
without half/bfloat16 data, nor ``float`` in a kernel of a graph whose data is all double."""
import os
import re

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat.errors import CuDNNError
from conftest import tdesc

DT = {"float32": cc.CUDNN_DATA_FLOAT, "float64": cc.CUDNN_DATA_DOUBLE}
TOL = {"float32": 1e-5, "float64": 1e-12}
DTYPES = ("float32", "float64")


class Ctx:
    """One run of a case on a handle: identical inputs on every place (one seeded generator)."""

    def __init__(self, h, dtype, seed=1234):
        self.h, self.dtype = h, dtype
        self.gpu = h.place == "gpu"
        if self.gpu:
            import cupy
            self.xp = cupy
        else:
            self.xp = np
        self.rng = np.random.default_rng(seed)
        self.np = np.float64 if dtype == "float64" else np.float32
        self.dt = DT[dtype]
        self.comp = cc.CUDNN_DATA_DOUBLE if dtype == "float64" else cc.CUDNN_DATA_FLOAT
        self.math = cc.CUDNN_DEFAULT_MATH if dtype == "float64" else cc.CUDNN_FMA_MATH

    def dev(self, host):
        return self.xp.asarray(host) if self.gpu else np.array(host)

    def arr(self, shape, scale=1.0, low=None, dtype=None):
        v = self.rng.uniform(low, low + scale, shape) if low is not None else self.rng.standard_normal(shape) * scale
        return self.dev(np.asarray(v, dtype or self.np))

    def zeros(self, shape, dtype=None):
        return self.dev(np.zeros(shape, dtype or self.np))

    def buf(self, nbytes):
        return self.dev(np.zeros(max(int(nbytes), 1), np.uint8))

    def desc(self, shape, fmt=None):
        return tdesc(tuple(shape), self.dt, fmt)

    def param(self, shape, dtype=None):
        return tdesc(tuple(shape), DT[dtype or self.dtype])


CASES = {}


def case(name, factor=1.0):
    """Register a case: fn(Ctx) -> {output name: array}; ``factor`` scales the tolerance (only for
    reductions over many elements: documented where used)."""
    def deco(fn):
        CASES[name] = (fn, factor)
        return fn
    return deco


# -- convolutions (FMA_MATH for float: TF32 is not allowed) ------------------------------------------

CONV = [  # x, w, pad, stride, dilation, groups
    ((2, 4, 9, 8), (6, 2, 3, 3), (1, 1), (1, 2), (1, 1), 2),
    ((2, 3, 9, 9), (4, 3, 3, 3), (2, 2), (1, 1), (2, 2), 1),
    ((1, 2, 5, 6, 5), (3, 2, 2, 3, 2), (1, 0, 1), (1, 2, 1), (1, 1, 2), 1),
]


def _conv(c, i):
    xs, ws, pad, st, dil, g = CONV[i]
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolutionNdDescriptor(cd, len(pad), list(pad), list(st), list(dil), cc.CUDNN_CROSS_CORRELATION, c.comp)
    if g != 1:
        cc.cudnnSetConvolutionGroupCount(cd, g)
    cc.cudnnSetConvolutionMathType(cd, c.math)
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilterNdDescriptor(wd, c.dt, cc.CUDNN_TENSOR_NCHW, len(ws), list(ws))
    xd = c.desc(xs)
    ys = tuple(cc.cudnnGetConvolutionNdForwardOutputDim(cd, xd, wd, len(xs)))
    return cd, xd, wd, c.desc(ys), xs, ws, ys


GEMM_LIKE = {"FWD": ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM"), "BWD_DATA": ("0", "1"),
             "BWD_FILTER": ("0", "1")}  # FFT and Winograd algorithms have their own (looser) error class


def _algos(direction: str, perfs) -> list:
    """The GEMM-like algorithms the tables support for the problem (status SUCCESS in Get*_v7)."""
    want = {getattr(cc, f"CUDNN_CONVOLUTION_{direction}_ALGO_{n}") for n in GEMM_LIKE[direction]}
    return sorted({p.algo for p in perfs if p.status == cc.CUDNN_STATUS_SUCCESS and p.algo in want})


def _conv_case(i):
    def fn(c):
        cd, xd, wd, yd, xs, ws, ys = _conv(c, i)
        x, w, dy = c.arr(xs), c.arr(ws), c.arr(ys)
        out = {}
        for algo in _algos("FWD", cc.cudnnGetConvolutionForwardAlgorithm_v7(c.h, xd, wd, cd, yd, 20)):
            n = cc.cudnnGetConvolutionForwardWorkspaceSize(c.h, xd, wd, cd, yd, algo)
            y = c.arr(ys)
            cc.cudnnConvolutionForward(c.h, 1.5, xd, x, wd, w, cd, algo, c.buf(n), n, 0.5, yd, y)
            out[f"y{algo}"] = y
        for algo in _algos("BWD_DATA", cc.cudnnGetConvolutionBackwardDataAlgorithm_v7(c.h, wd, yd, cd, xd, 20)):
            n = cc.cudnnGetConvolutionBackwardDataWorkspaceSize(c.h, wd, yd, cd, xd, algo)
            dx = c.zeros(xs)
            cc.cudnnConvolutionBackwardData(c.h, 1.0, wd, w, yd, dy, cd, algo, c.buf(n), n, 0.0, xd, dx)
            out[f"dx{algo}"] = dx
        for algo in _algos("BWD_FILTER", cc.cudnnGetConvolutionBackwardFilterAlgorithm_v7(c.h, xd, yd, cd, wd, 20)):
            n = cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(c.h, xd, yd, cd, wd, algo)
            dw = c.zeros(ws)
            cc.cudnnConvolutionBackwardFilter(c.h, 1.0, xd, x, yd, dy, cd, algo, c.buf(n), n, 0.0, wd, dw)
            out[f"dw{algo}"] = dw
        return out
    return fn


for _i in range(len(CONV)):
    case(f"conv{_i}")(_conv_case(_i))


@case("conv_backward_bias")
def _cbb(c):
    cd, xd, wd, yd, xs, ws, ys = _conv(c, 1)
    dy, db = c.arr(ys), c.arr((1, ys[1], 1, 1))
    cc.cudnnConvolutionBackwardBias(c.h, 1.5, yd, dy, 0.5, c.desc(db.shape), db)
    return {"db": db}


@case("conv_bias_activation")
def _cba(c):
    cd, xd, wd, yd, xs, ws, ys = _conv(c, 0)
    x, w, z, b = c.arr(xs), c.arr(ws), c.arr(ys), c.arr((1, ys[1], 1, 1))
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    n = cc.cudnnGetConvolutionForwardWorkspaceSize(c.h, xd, wd, cd, yd, algo)
    y = c.zeros(ys)
    cc.cudnnConvolutionBiasActivationForward(c.h, 0.5, xd, x, wd, w, cd, algo, c.buf(n), n, 0.25, yd, z,
                                             c.desc(b.shape), b, ad, yd, y)
    return {"y": y}


# -- element-wise, tensor ops, reductions -----------------------------------------------------------

SHAPE = (2, 5, 6, 7)


@case("activation")
def _act(c):
    out = {}
    x, dy = c.arr(SHAPE), c.arr(SHAPE)
    xd = c.desc(SHAPE)
    for mode, coef in (("RELU", 0.0), ("SIGMOID", 0.0), ("TANH", 0.0), ("CLIPPED_RELU", 0.7), ("ELU", 0.3),
                       ("SWISH", 0.0)):
        ad = cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetActivationDescriptor(ad, getattr(cc, f"CUDNN_ACTIVATION_{mode}"), cc.CUDNN_NOT_PROPAGATE_NAN, coef)
        y = c.arr(SHAPE)
        cc.cudnnActivationForward(c.h, ad, 1.5, xd, x, 0.5, xd, y)
        yv = c.zeros(SHAPE)
        cc.cudnnActivationForward(c.h, ad, 1.0, xd, x, 0.0, xd, yv)
        dx = c.arr(SHAPE)
        cc.cudnnActivationBackward(c.h, ad, 1.0, xd, yv, xd, dy, xd, x, -0.5, xd, dx)
        out[f"y_{mode}"], out[f"dx_{mode}"] = y, dx
    return out


@case("add_op_set_scale_transform")
def _tensor_ops(c):
    out = {}
    a, cb = c.arr((1, 5, 1, 7)), c.arr(SHAPE)
    cc.cudnnAddTensor(c.h, 1.25, c.desc(a.shape), a, 0.75, c.desc(SHAPE), cb)
    out["add"] = cb
    for op in ("ADD", "MUL", "MIN", "MAX", "SQRT", "NOT"):
        od = cc.cudnnCreateOpTensorDescriptor()
        cc.cudnnSetOpTensorDescriptor(od, getattr(cc, f"CUDNN_OP_TENSOR_{op}"), c.comp, cc.CUDNN_NOT_PROPAGATE_NAN)
        A = c.arr(SHAPE, low=0.1) if op == "SQRT" else c.arr(SHAPE)
        B, C = c.arr((1, 5, 1, 7)), c.arr(SHAPE)
        cc.cudnnOpTensor(c.h, od, 1.5, c.desc(SHAPE), A, 0.75, c.desc(B.shape), B, -0.5, c.desc(SHAPE), C)
        out[f"op_{op}"] = C
    y = c.arr(SHAPE)
    cc.cudnnScaleTensor(c.h, c.desc(SHAPE), y, -1.7)
    out["scale"] = y
    s = c.arr(SHAPE)
    cc.cudnnSetTensor(c.h, c.desc(SHAPE), s, 1.0 / 3.0)
    out["set"] = s
    x, z = c.arr(SHAPE), c.arr(SHAPE)
    cc.cudnnTransformTensor(c.h, 1.5, c.desc(SHAPE), x, 0.5, c.desc(SHAPE, cc.CUDNN_TENSOR_NHWC), z)
    out["transform"] = z
    return out


@case("reduce_tensor")
def _reduce(c):
    out = {}
    a = c.arr(SHAPE, scale=0.5)
    for op in ("ADD", "MUL", "MIN", "MAX", "AMAX", "AVG", "NORM1", "NORM2", "MUL_NO_ZEROS"):
        for cshape in ((1, 5, 1, 1), (2, 1, 6, 7)):
            rd = cc.cudnnCreateReduceTensorDescriptor()
            cc.cudnnSetReduceTensorDescriptor(rd, getattr(cc, f"CUDNN_REDUCE_TENSOR_{op}"), c.comp,
                                              cc.CUDNN_PROPAGATE_NAN, cc.CUDNN_REDUCE_TENSOR_NO_INDICES,
                                              cc.CUDNN_32BIT_INDICES)
            ad, cd = c.desc(SHAPE), c.desc(cshape)
            n = cc.cudnnGetReductionWorkspaceSize(c.h, rd, ad, cd)
            C = c.arr(cshape)
            cc.cudnnReduceTensor(c.h, rd, None, 0, c.buf(n), n, 1.5, ad, a, 0.5, cd, C)
            out[f"{op}{cshape}"] = C
    return out


@case("softmax")
def _softmax(c):
    out = {}
    x, dy = c.arr(SHAPE, scale=3.0), c.arr(SHAPE)
    xd = c.desc(SHAPE)
    for algo in ("FAST", "ACCURATE", "LOG"):
        for mode in ("INSTANCE", "CHANNEL"):
            A, M = getattr(cc, f"CUDNN_SOFTMAX_{algo}"), getattr(cc, f"CUDNN_SOFTMAX_MODE_{mode}")
            y = c.zeros(SHAPE)
            cc.cudnnSoftmaxForward(c.h, A, M, 1.0, xd, x, 0.0, xd, y)
            dx = c.arr(SHAPE)
            cc.cudnnSoftmaxBackward(c.h, A, M, 1.5, xd, y, xd, dy, 0.5, xd, dx)
            out[f"y_{algo}_{mode}"], out[f"dx_{algo}_{mode}"] = y, dx
    return out


@case("pooling")
def _pool(c):
    out = {}
    xs = (2, 3, 9, 8)
    x = c.arr(xs)
    for mode in ("MAX", "MAX_DETERMINISTIC", "AVERAGE_COUNT_INCLUDE_PADDING", "AVERAGE_COUNT_EXCLUDE_PADDING"):
        pd = cc.cudnnCreatePoolingDescriptor()
        cc.cudnnSetPoolingNdDescriptor(pd, getattr(cc, f"CUDNN_POOLING_{mode}"), cc.CUDNN_NOT_PROPAGATE_NAN, 2,
                                       [3, 3], [1, 1], [2, 2])
        xd = c.desc(xs)
        ys = tuple(cc.cudnnGetPoolingNdForwardOutputDim(pd, xd, 4))
        yd = c.desc(ys)
        y = c.zeros(ys)
        cc.cudnnPoolingForward(c.h, pd, 1.0, xd, x, 0.0, yd, y)
        dy, dx = c.arr(ys), c.arr(xs)
        cc.cudnnPoolingBackward(c.h, pd, 1.5, yd, y, yd, dy, xd, x, 0.5, xd, dx)
        out[f"y_{mode}"], out[f"dx_{mode}"] = y, dx
    return out


@case("lrn")
def _lrn(c):
    ld = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(ld, 5, 0.5, 0.75, 2.0)
    x, dy = c.arr(SHAPE), c.arr(SHAPE)
    xd = c.desc(SHAPE)
    y = c.zeros(SHAPE)
    dim1 = cc.CUDNN_LRN_CROSS_CHANNEL_DIM1
    cc.cudnnLRNCrossChannelForward(c.h, ld, dim1, 1.0, xd, x, 0.0, xd, y)
    dx = c.arr(SHAPE)
    cc.cudnnLRNCrossChannelBackward(c.h, ld, dim1, 1.5, xd, y, xd, dy, xd, x, 0.5, xd, dx)
    return {"y": y, "dx": dx}


@case("divisive_normalization")
def _divnorm(c):
    ld = cc.cudnnCreateLRNDescriptor()
    cc.cudnnSetLRNDescriptor(ld, 3, 0.5, 0.75, 2.0)
    shape = (2, 3, 6, 7)
    x, dy, m = c.arr(shape), c.arr(shape), c.arr(shape, scale=0.3)
    xd = c.desc(shape)
    mode = cc.CUDNN_DIVNORM_PRECOMPUTED_MEANS
    y, t1, t2 = c.zeros(shape), c.zeros(shape), c.zeros(shape)
    cc.cudnnDivisiveNormalizationForward(c.h, ld, mode, 1.0, xd, x, m, t1, t2, 0.0, xd, y)
    dx, dm = c.zeros(shape), c.zeros(shape)
    cc.cudnnDivisiveNormalizationBackward(c.h, ld, mode, 1.0, xd, x, m, dy, t1, t2, 0.0, xd, dx, dm)
    return {"y": y, "dx": dx, "dm": dm}


# -- batch normalization ----------------------------------------------------------------------------

@case("batchnorm")
def _bn(c):
    out = {}
    shape = (4, 3, 6, 7)
    for mode in ("SPATIAL", "PER_ACTIVATION"):
        M = getattr(cc, f"CUDNN_BATCHNORM_{mode}")
        xd = c.desc(shape)
        pd = cc.cudnnCreateTensorDescriptor()
        cc.cudnnDeriveBNTensorDescriptor(pd, xd, M)
        ps = tuple(cc.cudnnGetTensorNdDescriptor(pd)[2])
        x = c.dev(np.asarray(c.rng.standard_normal(shape) * 2.0 + 3.0, c.np))  # |mean| > std
        scale, bias = c.arr(ps, low=0.5), c.arr(ps)
        rm, rv = c.arr(ps), c.arr(ps, low=0.5)
        sm, si, y = c.zeros(ps), c.zeros(ps), c.zeros(shape)
        cc.cudnnBatchNormalizationForwardTraining(c.h, M, 1.0, 0.0, xd, x, xd, y, pd, scale, bias, 0.1, rm, rv, 1e-4,
                                                  sm, si)
        yi = c.arr(shape)
        cc.cudnnBatchNormalizationForwardInference(c.h, M, 1.5, 0.5, xd, x, xd, yi, pd, scale, bias, rm, rv, 1e-4)
        dy = c.arr(shape)
        dx, ds, db = c.zeros(shape), c.zeros(ps), c.zeros(ps)
        cc.cudnnBatchNormalizationBackward(c.h, M, 1.0, 0.0, 1.0, 0.0, xd, x, xd, dy, xd, dx, pd, scale, ds, db, 1e-4,
                                           sm, si)
        dx2, ds2, db2 = c.arr(shape), c.arr(ps), c.arr(ps)
        cc.cudnnBatchNormalizationBackward(c.h, M, 0.5, 0.25, 2.0, -0.5, xd, x, xd, dy, xd, dx2, pd, scale, ds2, db2,
                                           1e-4, None, None)
        out.update({f"{mode}_{k}": v for k, v in dict(y=y, rm=rm, rv=rv, sm=sm, si=si, yi=yi, dx=dx, ds=ds, db=db,
                                                       dx2=dx2, ds2=ds2, db2=db2).items()})
    return out


# -- dropout ----------------------------------------------------------------------------------------

@case("dropout")
def _dropout(c):
    shape = (4, 3, 17, 5)
    xd = c.desc(shape)
    drop = cc.cudnnCreateDropoutDescriptor()
    states = c.buf(cc.cudnnDropoutGetStatesSize(c.h))
    cc.cudnnSetDropoutDescriptor(drop, c.h, 0.35, states, states.nbytes, 0x1234567890AB)
    n = cc.cudnnDropoutGetReserveSpaceSize(xd)
    x, dy = c.arr(shape), c.arr(shape)
    y, dx, rs = c.zeros(shape), c.zeros(shape), c.buf(n)
    cc.cudnnDropoutForward(c.h, drop, xd, x, xd, y, rs, n)
    cc.cudnnDropoutBackward(c.h, drop, xd, dy, xd, dx, rs, n)
    return {"y": y, "dx": dx}


# -- spatial transformer ------------------------------------------------------------------------------

@case("spatial_transformer")
def _spatial(c):
    xdims, ydims = (2, 3, 5, 6), (2, 3, 4, 3)
    st = cc.cudnnCreateSpatialTransformerDescriptor()
    cc.cudnnSetSpatialTransformerNdDescriptor(st, cc.CUDNN_SAMPLER_BILINEAR, c.dt, 4, list(ydims))
    theta = c.arr((2, 2, 3), scale=0.8)
    grid = c.zeros((2, 4, 3, 2))
    cc.cudnnSpatialTfGridGeneratorForward(c.h, st, theta, grid)
    x, dy = c.arr(xdims), c.arr(ydims)
    y = c.zeros(ydims)
    cc.cudnnSpatialTfSamplerForward(c.h, st, 1.0, c.desc(xdims), x, grid, 0.0, c.desc(ydims), y)
    dx, dgrid, dtheta = c.zeros(xdims), c.zeros((2, 4, 3, 2)), c.zeros((2, 2, 3))
    cc.cudnnSpatialTfSamplerBackward(c.h, st, 1.0, c.desc(xdims), x, 0.0, c.desc(xdims), dx, 1.0, c.desc(ydims), dy,
                                     grid, 0.0, dgrid)
    cc.cudnnSpatialTfGridGeneratorBackward(c.h, st, dgrid, dtheta)
    return {"grid": grid, "y": y, "dx": dx, "dgrid": dgrid, "dtheta": dtheta}


# -- RNN (v8 API; FMA_MATH for float) -------------------------------------------------------------------

RNN = [("LSTM", 1), ("LSTM", 2), ("GRU", 1), ("RNN_TANH", 2)]


def _rnn_case(mode, D):
    def fn(c):
        L, I, H, T = 2, 6, 8, 5
        lengths = (5, 5, 5)
        B = len(lengths)
        drop = cc.cudnnCreateDropoutDescriptor()
        cc.cudnnSetDropoutDescriptor(drop, c.h, 0.0, None, 0, 0)
        d = cc.cudnnCreateRNNDescriptor()
        cc.cudnnSetRNNDescriptor_v8(d, cc.CUDNN_RNN_ALGO_STANDARD, getattr(cc, f"CUDNN_{mode}"), cc.CUDNN_RNN_DOUBLE_BIAS,
                                    cc.CUDNN_BIDIRECTIONAL if D == 2 else cc.CUDNN_UNIDIRECTIONAL,
                                    cc.CUDNN_LINEAR_INPUT, c.dt, c.comp, c.math, I, H, H, L, drop,
                                    cc.CUDNN_RNN_PADDED_IO_ENABLED)
        seq = cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
        xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
        cc.cudnnSetRNNDataDescriptor(xd, c.dt, seq, T, B, I, list(lengths), None)
        cc.cudnnSetRNNDataDescriptor(yd, c.dt, seq, T, B, D * H, list(lengths), None)
        hd = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensorNdDescriptor(hd, c.dt, 3, [L * D, B, H], [B * H, H, 1])
        size = cc.cudnnGetRNNWeightSpaceSize(c.h, d)
        w = c.arr(size // np.dtype(c.np).itemsize, scale=0.3)
        x, hx, cx = c.arr((T, B, I)), c.arr((L * D, B, H)), c.arr((L * D, B, H))
        dy, dhy, dcy = c.arr((T, B, D * H)), c.arr((L * D, B, H)), c.arr((L * D, B, H))
        ws, rs = cc.cudnnGetRNNTempSpaceSizes(c.h, d, cc.CUDNN_FWD_MODE_TRAINING, xd)
        wsb, rsb = c.buf(ws), c.buf(rs)
        lens = c.dev(np.asarray(lengths, np.int32))
        y, hy, cy = c.zeros((T, B, D * H)), c.zeros(hx.shape), c.zeros(cx.shape)
        lstm = mode == "LSTM"
        cc.cudnnRNNForward(c.h, d, cc.CUDNN_FWD_MODE_TRAINING, lens, xd, x, yd, y, hd, hx, hy, hd if lstm else None,
                           cx if lstm else None, cy if lstm else None, size, w, ws, wsb, rs, rsb)
        dx, dhx, dcx = c.zeros(x.shape), c.zeros(hx.shape), c.zeros(cx.shape)
        cc.cudnnRNNBackwardData_v8(c.h, d, lens, yd, y, dy, xd, dx, hd, hx, dhy, dhx, hd if lstm else None,
                                   cx if lstm else None, dcy if lstm else None, dcx if lstm else None, size, w, ws, wsb,
                                   rs, rsb)
        dw = c.zeros(w.shape)
        cc.cudnnRNNBackwardWeights_v8(c.h, d, cc.CUDNN_WGRAD_MODE_ADD, lens, xd, x, hd, hx, yd, y, size, dw, ws, wsb, rs,
                                      rsb)
        out = {"y": y, "hy": hy, "dx": dx, "dhx": dhx, "dw": dw}
        if lstm:
            out.update(cy=cy, dcx=dcx)
        return out
    return fn


for _m, _d in RNN:
    case(f"rnn_{_m.lower()}_{'bi' if _d == 2 else 'uni'}")(_rnn_case(_m, _d))


# -- comparing -------------------------------------------------------------------------------------------

def host(a) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        a = a.get()
    return np.asarray(a, np.float64)


def rel_error(got, want) -> float:
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got)), "non-finite values differ"
    w, g = want[fin], got[fin]
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-300))


def check(got: dict, want: dict, dtype: str, factor: float, label: str) -> dict:
    """Every output's norm-wise relative error within the dtype's tolerance (elementwise within 50x
    of it against the output's scale); returns {name: error} for the report."""
    tol = TOL[dtype] * factor
    errors = {}
    assert set(got) == set(want)
    for name in sorted(want):
        g, w = host(got[name]), host(want[name])
        err = rel_error(g, w)
        errors[name] = err
        assert err <= tol, f"{label} {name}: relative error {err:.3g} > {tol:.1g} (float16 would be ~5e-4, TF32 ~1e-3)"
        fin = np.isfinite(w)
        scale = np.sqrt(np.mean(w[fin] ** 2)) if fin.any() else 0.0
        assert np.all(np.abs(g[fin] - w[fin]) <= 50 * tol * (np.abs(w[fin]) + scale) + 1e-300), f"{label} {name}: elementwise"
    return errors


@pytest.fixture(scope="module")
def handles():
    hc, hg = cc.cudnnCreate("cpu"), cc.cudnnCreate("gpu")
    yield hc, hg
    cc.cudnnDestroy(hc)
    cc.cudnnDestroy(hg)


REPORT: dict = {}


@pytest.mark.gpu
@pytest.mark.parametrize("engine", [None, "cupy", "cudnn"], ids=["auto", "cupy", "cudnn"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_cpu_reference_at_the_dtypes_precision(handles, monkeypatch, name, dtype, engine):
    fn, factor = CASES[name]
    hc, hg = handles
    want = fn(Ctx(hc, dtype))
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    if engine:
        monkeypatch.setenv("CUDNN_COMPAT_ENGINE", engine)
    try:
        got = fn(Ctx(hg, dtype))
    except CuDNNError as e:
        if engine and e.status == cc.CUDNN_STATUS_NOT_SUPPORTED:
            pytest.skip(f"the {engine} engine declines part of {name}: {str(e)[:200]}")
        raise
    import cupy
    cupy.cuda.Device().synchronize()
    errs = check(got, want, dtype, factor, f"{name} {dtype} engine={engine or 'auto'}")
    REPORT[(name, dtype, engine or "auto")] = max(errs.values())
    out = os.environ.get("CC_PRECISION_REPORT")
    if out:
        with open(out, "a") as f:
            f.write(f"{name}\t{dtype}\t{engine or 'auto'}\t{max(errs.values()):.3e}\n")


# -- kernel sources of fp32/fp64 graphs (CPU) ---------------------------------------------------------------

NARROW = re.compile(r"\b(__half|half|__nv_bfloat16|bfloat16|nv_bfloat16)\b|cc_h2f\(|cc_f2h\(|cc_d2h\(|cc_b2f\(|"
                    r"cc_f2b\(|\bunsigned short\b|__float2half|__half2float")
NOT_DOUBLE = re.compile(r"\bfloat\b|cc_h2f\(|cc_f2h\(|cc_d2h\(|cc_b2f\(|cc_f2b\(")


def _body(src: str) -> str:
    """The kernel's own code: the shared preamble (conversion helpers for every type) cut off."""
    from cudnn_compat._backend.engines.cupy_engine.codegen import PREAMBLE
    return src[len(PREAMBLE):] if src.startswith(PREAMBLE) else src


def recorded_graphs(dtype: str) -> list:
    """Every graph the cases build for ``dtype`` data (run on a CPU handle; the graphs a GPU handle
    builds are the same: graph building does not depend on the place)."""
    from cudnn_compat._backend import planner
    graphs = []
    orig = planner.make_plan

    def spy(graph, *a, **k):
        graphs.append(graph)
        return orig(graph, *a, **k)
    planner.make_plan = spy
    cc.plan_cache_clear()
    h = cc.cudnnCreate("cpu")
    try:
        for fn, _ in CASES.values():
            fn(Ctx(h, dtype))
    finally:
        planner.make_plan = orig
        cc.cudnnDestroy(h)
        cc.plan_cache_clear()
    return graphs


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_narrow_type_in_any_kernel_of_a_float_or_double_graph(dtype):
    from cudnn_compat._backend.engines.base import EngineConfig
    from cudnn_compat._backend.engines.cupy_engine import ENGINE, kernel_sources
    graphs = recorded_graphs(dtype)
    kinds, scanned, bad = set(), 0, []
    for g in graphs:
        ts = [t for op in g.ops for t in list(op.inputs.values()) + list(op.outputs.values()) if not t.is_by_value]
        if any(t.dtype in ("float16", "bfloat16") for t in ts):
            continue
        if ENGINE.check_support(g, "gpu") is not None:
            continue
        floats = {t.dtype for t in ts if t.dtype.startswith("float")}
        for src in kernel_sources(ENGINE.build(g, EngineConfig("cupy"))):
            body = _body(src)
            scanned += 1
            kinds |= {op.kind for op in g.ops}
            m = NARROW.search(body)
            if m:
                bad.append(f"{g.name}: {m.group(0)!r}")
            if floats == {"float64"}:
                m = NOT_DOUBLE.search(body)
                if m:
                    bad.append(f"{g.name} (all double): {m.group(0)!r} in\n{body[max(0, m.start() - 300):m.end() + 100]}")
    assert not bad, "\n".join(bad[:10])
    # the scan saw the kinds that matter (a case that stopped building graphs would shrink it)
    want = {"ConvolutionForward", "ConvolutionBackwardData", "ConvolutionBackwardFilter", "Pointwise", "Reduction",
            "Softmax", "SoftmaxBackward", "ResampleForward", "ResampleBackward", "LRNForward", "LRNBackward",
            "DivisiveNormalizationForward", "DivisiveNormalizationBackward", "NormForward", "NormBackward", "Rng",
            "RNNRecurrence", "RNNRecurrenceBackward", "Matmul"}
    assert want <= kinds, want - kinds
    assert scanned > 50


def test_the_scan_catches_a_narrow_intermediate():
    """The patterns above can fail: a half conversion or a float variable in a double kernel."""
    assert NARROW.search("const float v = cc_h2f(p[i]);")
    assert NARROW.search("__half t = __float2half(v);")
    assert NOT_DOUBLE.search("const float acc = 0;") and not NOT_DOUBLE.search("const double acc = 1.0f;")
