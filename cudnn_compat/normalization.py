"""The cuDNN 8.0 normalization API (002 §3.2.19 cudnnDeriveNormTensorDescriptor, §3.2.66
cudnnNormalizationForwardInference, §4.1.16 ForwardTraining, §4.1.15 Backward (printed as
"cudaNormBackward"), §4.1.11-§4.1.13 the workspace and reserve queries; inventory §2.7).

The formulas are batch normalization's, and so are the graphs: each call is built by
``batchnorm``'s builders (``_inference_graph``, ``_training_graph``, ``_backward_graph``), with
normMeanVarDesc passed apart from normScaleBiasDesc.  The enums map one to one:

  cudnnNormMode_t  PER_ACTIVATION -> statistics over N          (params 1xCxHxW[xD])
                   PER_CHANNEL    -> statistics over N, spatial (params 1xCx1x1[x1])
  cudnnNormOps_t   NORM | NORM_ACTIVATION | NORM_ADD_ACTIVATION: y = alpha*act(norm(x) [+ z]) + beta*y;
                   the backward applies the activation backward through y, writes it to dz
                   (NORM_ADD_ACTIVATION) and back-propagates it through the normalization.

Rules of 002: groupCnt must be 1 (NOT_SUPPORTED for another positive count, BAD_PARAM below 1);
epsilon >= 0 (BAD_PARAM); x/y/z/dy/dx 4-d or 5-d with equal dims and types (BAD_PARAM);
parameter descriptors shaped by the mode and of equal dims and types (BAD_PARAM), FLOAT for
HALF/BFLOAT16/FLOAT data and DOUBLE for DOUBLE (NOT_SUPPORTED otherwise); NULL data pointers
and half-NULL pairs (saved, running) are BAD_PARAM; an unknown algo is NOT_SUPPORTED, as is
CUDNN_NORM_ALGO_PERSIST with PER_ACTIVATION (§3.1.2.15).  Inference runs only
CUDNN_NORM_OPS_NORM on FLOAT data (NOT_SUPPORTED otherwise, §3.2.66 "Returns").

Choices where 002 is silent (the same as batch norm's Ex calls): the NHWC-only restriction on
the fused activation is not imposed; PERSIST computes exactly as STANDARD (our engines have
no overflow-prone integer reduction); the workspace queries return the plan's need, the
reserve space is 0 bytes (savedMean/savedInvVariance carry all the backward pass reads).
"""
from __future__ import annotations

import numbers

from . import batchnorm as bn
from ._core.call import ALPHA, BETA, plan_for, run
from ._core.data import scalar
from ._core.descriptor import resolve
from ._core.registry import legacy
from .enums import ENUMS, is_valid, name_of
from .errors import bad_param, check, not_supported
from .handle import get_handle
from .tensor import D, F, TensorDescriptor, packed_strides, tensor_desc

NM = ENUMS["cudnnNormMode_t"]
NOPS = ENUMS["cudnnNormOps_t"]
NALGO = ENUMS["cudnnNormAlgo_t"]
PER_ACTIVATION, PER_CHANNEL = NM["CUDNN_NORM_PER_ACTIVATION"], NM["CUDNN_NORM_PER_CHANNEL"]
OPS_NORM, OPS_ACT, OPS_ADD_ACT = (NOPS["CUDNN_NORM_OPS_NORM"], NOPS["CUDNN_NORM_OPS_NORM_ACTIVATION"],
                                  NOPS["CUDNN_NORM_OPS_NORM_ADD_ACTIVATION"])
ALGO_PERSIST = NALGO["CUDNN_NORM_ALGO_PERSIST"]
# cudnnNormMode_t -> cudnnBatchNormMode_t, cudnnNormOps_t -> cudnnBatchNormOps_t (the builders' terms)
BN_MODE = {PER_ACTIVATION: bn.PER_ACTIVATION, PER_CHANNEL: ENUMS["cudnnBatchNormMode_t"]["CUDNN_BATCHNORM_SPATIAL"]}
BN_OPS = {OPS_NORM: bn.OPS_BN, OPS_ACT: bn.OPS_ACT, OPS_ADD_ACT: bn.OPS_ADD_ACT}
INFER_DTYPES = ("float32",)  # 002 §3.2.66: "A compute or data type other than FLOAT" is NOT_SUPPORTED


# -- argument checks -----------------------------------------------------------------

def _check_mode(mode) -> int:
    check(is_valid("cudnnNormMode_t", mode), "mode", f"{mode!r} is not a cudnnNormMode_t")
    return BN_MODE[int(mode)]


def _check_ops(normOps) -> int:
    check(is_valid("cudnnNormOps_t", normOps), "normOps", f"{normOps!r} is not a cudnnNormOps_t")
    return BN_OPS[int(normOps)]


def _check_algo(algo, mode) -> None:
    if not is_valid("cudnnNormAlgo_t", algo):
        raise not_supported("algo", f"{algo!r} is not a known cudnnNormAlgo_t")
    if int(algo) == ALGO_PERSIST and int(mode) != PER_CHANNEL:
        raise not_supported("algo", "CUDNN_NORM_ALGO_PERSIST supports only CUDNN_NORM_PER_CHANNEL")


def _check_group(groupCnt) -> None:
    check(isinstance(groupCnt, numbers.Integral) and not isinstance(groupCnt, bool) and groupCnt >= 1, "groupCnt",
          f"must be a positive int, got {groupCnt!r}")
    if groupCnt != 1:
        raise not_supported("groupCnt", f"only 1 is supported, got {groupCnt}")


def _check_eps(epsilon) -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise bad_param("epsilon", f"must be a number, got {epsilon!r}") from None
    check(eps >= 0.0, "epsilon", f"{eps} is less than zero")
    return eps


def _check_common(mode, normOps, algo, groupCnt) -> tuple:
    """(batch-norm mode, batch-norm ops) after the enum and groupCnt rules."""
    bn_mode = _check_mode(mode)
    bn_ops = _check_ops(normOps)
    _check_group(groupCnt)
    _check_algo(algo, mode)
    return bn_mode, bn_ops


def param_dims(mode, xdims) -> tuple:
    """1xCx1x1[x1] per channel, 1xCxHxW[xD] per activation (002 §3.2.19; its text swaps the two)."""
    return bn.param_dims(BN_MODE[int(mode)], xdims)


def _check_params(pd, md, xd, mode, pname, mname) -> None:
    want = param_dims(mode, xd.dims)
    mode_name = name_of("cudnnNormMode_t", mode)
    for d, n in ((pd, pname), (md, mname)):
        check(d.dims == want, n, f"dims {d.dims} must be {want} for {mode_name} (see cudnnDeriveNormTensorDescriptor)")
    check(md.dataType == pd.dataType, mname, f"data type must equal {pname}'s")
    want_type = bn.param_type(xd)
    if pd.dataType != want_type:
        raise not_supported(pname, f"data type must be {name_of('cudnnDataType_t', want_type)} for "
                                   f"{name_of('cudnnDataType_t', xd.dataType)} data")


def _data_descs(xDesc, yDesc, yname="yDesc"):
    xd, yd = tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, yname)
    bn._check_rank(xd, "xDesc")
    bn._check_like(yd, xd, yname)
    return xd, yd


# -- derived descriptors -------------------------------------------------------------

@legacy("cudnnDeriveNormTensorDescriptor")
def deriveNormTensorDescriptor(derivedNormScaleBiasDesc, derivedNormMeanVarDesc, xDesc, mode, groupCnt=1) -> None:
    """Both descriptors 1xCx1x1[x1] per channel, 1xCxHxW[xD] per activation, packed NCHW; FLOAT
    for HALF/BFLOAT16 data, else x's type (002 §3.2.19).  BAD_PARAM: invalid mode, x not
    4-d/5-d; NOT_SUPPORTED: groupCnt != 1."""
    sd = resolve(derivedNormScaleBiasDesc, TensorDescriptor, "derivedNormScaleBiasDesc", need_set=False)
    md = resolve(derivedNormMeanVarDesc, TensorDescriptor, "derivedNormMeanVarDesc", need_set=False)
    xd = tensor_desc(xDesc, "xDesc")
    _check_mode(mode)
    _check_group(groupCnt)
    bn._check_rank(xd, "xDesc")
    dims = param_dims(mode, xd.dims)
    dtype = D["CUDNN_DATA_FLOAT"] if xd.dataType in (D["CUDNN_DATA_HALF"], D["CUDNN_DATA_BFLOAT16"]) else xd.dataType
    for d in (sd, md):
        d.set(dtype, F["CUDNN_TENSOR_NCHW"], dims, packed_strides(F["CUDNN_TENSOR_NCHW"], dims))


# -- inference -----------------------------------------------------------------------

@legacy("cudnnNormalizationForwardInference")
def normalizationForwardInference(handle, mode, normOps, algo, alpha, beta, xDesc, x, normScaleBiasDesc, normScale,
                                  normBias, normMeanVarDesc, estimatedMean, estimatedVariance, zDesc, z,
                                  activationDesc, yDesc, y, epsilon, groupCnt=1) -> None:
    """y = alpha*(normBias + normScale*(x - estimatedMean)/sqrt(epsilon + estimatedVariance)) + beta*y
    (002 §3.2.66); zDesc, z and activationDesc are unused (only CUDNN_NORM_OPS_NORM runs)."""
    h = get_handle(handle)
    bn_mode, _ = _check_common(mode, normOps, algo, groupCnt)
    for p, n in ((x, "x"), (y, "y"), (normScale, "normScale"),
                 (normBias, "normBias"), (estimatedMean, "estimatedMean"), (estimatedVariance, "estimatedVariance")):
        bn._need(p, n)
    xd, yd = _data_descs(xDesc, yDesc)
    pd, md = tensor_desc(normScaleBiasDesc, "normScaleBiasDesc"), tensor_desc(normMeanVarDesc, "normMeanVarDesc")
    _check_params(pd, md, xd, mode, "normScaleBiasDesc", "normMeanVarDesc")
    eps = _check_eps(epsilon)
    if int(normOps) != OPS_NORM:
        raise not_supported("normOps", f"inference runs only CUDNN_NORM_OPS_NORM, got {name_of('cudnnNormOps_t', normOps)}")
    bn._check_dtype(xd, INFER_DTYPES)
    a, b = scalar(alpha, "alpha"), scalar(beta, "beta")

    def build():
        return bn._inference_graph(bn_mode, xd, pd, yd, b == 0, md, "NormalizationForwardInference")

    run(h, ("NormalizationForwardInference", bn_mode, xd.key(), yd.key(), pd.key(), md.key(), b == 0), build,
        {bn.X: (x, "x"), bn.Y: (y, "y"), bn.SCALE: (normScale, "normScale"), bn.BIAS: (normBias, "normBias"),
         bn.MEAN: (estimatedMean, "estimatedMean"), bn.VAR: (estimatedVariance, "estimatedVariance")},
        {ALPHA: a, BETA: b, bn.EPS: eps})


# -- training ------------------------------------------------------------------------

def _forward_setup(mode, normOps, algo, xDesc, normScaleBiasDesc, normMeanVarDesc, zDesc, yDesc, activationDesc,
                   groupCnt):
    """Checked descriptors and graph settings of a training forward:
    (bn mode, xd, yd, pd, md, zd, activation attrs, activation key)."""
    bn_mode, bn_ops = _check_common(mode, normOps, algo, groupCnt)
    xd, yd = _data_descs(xDesc, yDesc)
    pd, md = tensor_desc(normScaleBiasDesc, "normScaleBiasDesc"), tensor_desc(normMeanVarDesc, "normMeanVarDesc")
    _check_params(pd, md, xd, mode, "normScaleBiasDesc", "normMeanVarDesc")
    zd, act_attrs, act_key = bn._ex_forward_parts(bn_ops, xd, zDesc, activationDesc)
    bn._check_dtype(xd, bn.TRAIN_DTYPES)
    return bn_mode, xd, yd, pd, md, zd, act_attrs, act_key


def _forward_key(bn_mode, xd, yd, pd, md, zd, act_key, running, saved, beta_zero) -> tuple:
    return ("NormalizationForwardTraining", bn_mode, xd.key(), yd.key(), pd.key(), md.key(), running, saved,
            beta_zero, zd.key() if zd is not None else None, act_key)


def _check_sizes(*pairs) -> int:
    for v, n in pairs:
        check(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0, n,
              f"must be a non-negative int, got {v!r}")
    return int(pairs[0][0])


@legacy("cudnnNormalizationForwardTraining")
def normalizationForwardTraining(handle, mode, normOps, algo, alpha, beta, xDesc, xData, normScaleBiasDesc, normScale,
                                 normBias, exponentialAverageFactor, normMeanVarDesc, resultRunningMean,
                                 resultRunningVariance, epsilon, resultSaveMean, resultSaveInvVariance,
                                 activationDesc, zDesc, zData, yDesc, yData, workspace, workSpaceSizeInBytes,
                                 reserveSpace, reserveSpaceSizeInBytes, groupCnt=1) -> None:
    """y = alpha*act(norm(x) [+ z]) + beta*y with batch statistics; running mean/variance updated
    as (1-f)*running + f*batch (unbiased variance), saved mean and inverse std (002 §4.1.16)."""
    h = get_handle(handle)
    ws_size = _check_sizes((workSpaceSizeInBytes, "workSpaceSizeInBytes"),
                           (reserveSpaceSizeInBytes, "reserveSpaceSizeInBytes"))
    for p, n in ((xData, "xData"), (yData, "yData"), (normScale, "normScale"), (normBias, "normBias")):
        bn._need(p, n)
    bn.unbound_buffers(h, [(reserveSpace, "reserveSpace", True)])
    bn_mode, xd, yd, pd, md, zd, act_attrs, act_key = _forward_setup(
        mode, normOps, algo, xDesc, normScaleBiasDesc, normMeanVarDesc, zDesc, yDesc, activationDesc, groupCnt)
    if zd is not None:
        bn._need(zData, "zData")
    saved = bn._pair(resultSaveMean, resultSaveInvVariance, "resultSaveMean,resultSaveInvVariance")
    running = bn._pair(resultRunningMean, resultRunningVariance, "resultRunningMean,resultRunningVariance")
    eps = _check_eps(epsilon)
    try:
        factor = float(exponentialAverageFactor)
    except (TypeError, ValueError):
        raise bad_param("exponentialAverageFactor", f"must be a number, got {exponentialAverageFactor!r}") from None
    if running and bn._count(bn_mode, xd) < 2:
        raise not_supported("xDesc", "updating the running variance needs at least 2 values per channel "
                                     "(the unbiased variance of one value is undefined)")
    dbl = xd.dtype == "float64"
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        return bn._training_graph(bn_mode, xd, pd, yd, running, saved, b == 0, zd, act_attrs,
                                  "NormalizationForwardTraining", md)

    tensors = {bn.X: (xData, "xData"), bn.Y: (yData, "yData"), bn.SCALE: (normScale, "normScale"),
               bn.BIAS: (normBias, "normBias")}
    if zd is not None:
        tensors[bn.Z] = (zData, "zData")
    if running:
        tensors.update({bn.RMEAN: (resultRunningMean, "resultRunningMean"),
                        bn.RVAR: (resultRunningVariance, "resultRunningVariance")})
    if saved:
        tensors.update({bn.SMEAN: (resultSaveMean, "resultSaveMean"),
                        bn.SINV: (resultSaveInvVariance, "resultSaveInvVariance")})
    run(h, _forward_key(bn_mode, xd, yd, pd, md, zd, act_key, running, saved, b == 0), build, tensors,
        {ALPHA: a, BETA: b, bn.EPS: eps, bn.FACTOR: factor}, workspace, ws_size, "workSpaceSizeInBytes")


# -- backward ------------------------------------------------------------------------

def _backward_setup(mode, normOps, algo, xDesc, yDesc, dyDesc, dzDesc, dxDesc, dNormScaleBiasDesc, activationDesc,
                    normMeanVarDesc, groupCnt):
    """(bn mode, xd, yd, dyd, dzd, dxd, pd, md, activation backward attrs, activation key)."""
    bn_mode, bn_ops = _check_common(mode, normOps, algo, groupCnt)
    xd = tensor_desc(xDesc, "xDesc")
    bn._check_rank(xd, "xDesc")
    pd, md = tensor_desc(dNormScaleBiasDesc, "dNormScaleBiasDesc"), tensor_desc(normMeanVarDesc, "normMeanVarDesc")
    _check_params(pd, md, xd, mode, "dNormScaleBiasDesc", "normMeanVarDesc")
    ds = (xd, tensor_desc(dyDesc, "dyDesc"), tensor_desc(dxDesc, "dxDesc"), pd)  # x and the params resolved once
    xd, yd, dyd, dzd, dxd, pd, act_bwd, act_key = bn._backward_descs(
        bn_mode, bn_ops, xDesc, yDesc, dyDesc, dzDesc, dxDesc, dNormScaleBiasDesc, activationDesc,
        "dNormScaleBiasDesc", ex=True, ds=ds)
    return bn_mode, xd, yd, dyd, dzd, dxd, pd, md, act_bwd, act_key


def _backward_key(bn_mode, xd, yd, dyd, dzd, dxd, pd, md, act_key, saved, bd0, bp0) -> tuple:
    return ("NormalizationBackward", bn._backward_key(bn_mode, xd, yd, dyd, dzd, dxd, pd, act_key, saved, bd0, bp0),
            md.key())


@legacy("cudnnNormalizationBackward")
def normalizationBackward(handle, mode, normOps, algo, alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff,
                          xDesc, xData, yDesc, yData, dyDesc, dyData, dzDesc, dzData, dxDesc, dxData,
                          dNormScaleBiasDesc, normScaleData, normBiasData, dNormScaleData, dNormBiasData, epsilon,
                          normMeanVarDesc, savedMean, savedInvVariance, activationDesc, workSpace,
                          workSpaceSizeInBytes, reserveSpace, reserveSpaceSizeInBytes, groupCnt=1) -> None:
    """dx (alphaDataDiff/betaDataDiff), dNormScale and dNormBias (alphaParamDiff/betaParamDiff) of the
    training forward; with an activation, dy goes through its backward (at y) first, and
    NORM_ADD_ACTIVATION writes that gradient to dz (002 §4.1.15).  normBiasData is not read."""
    h = get_handle(handle)
    ws_size = _check_sizes((workSpaceSizeInBytes, "workSpaceSizeInBytes"),
                           (reserveSpaceSizeInBytes, "reserveSpaceSizeInBytes"))
    for p, n in ((xData, "xData"), (dyData, "dyData"), (dxData, "dxData"), (normScaleData, "normScaleData"),
                 (dNormScaleData, "dNormScaleData"), (dNormBiasData, "dNormBiasData")):
        bn._need(p, n)
    bn.unbound_buffers(h, [(reserveSpace, "reserveSpace", False), (normBiasData, "normBiasData", False)])
    bn_mode, xd, yd, dyd, dzd, dxd, pd, md, act_bwd, act_key = _backward_setup(
        mode, normOps, algo, xDesc, yDesc, dyDesc, dzDesc, dxDesc, dNormScaleBiasDesc, activationDesc,
        normMeanVarDesc, groupCnt)
    if yd is not None:
        bn._need(yData, "yData")
    if dzd is not None:
        bn._need(dzData, "dzData")
    saved = bn._pair(savedMean, savedInvVariance, "savedMean,savedInvVariance")
    eps = _check_eps(epsilon)
    dbl = xd.dtype == "float64"
    ad, bd = scalar(alphaDataDiff, "alphaDataDiff", dbl), scalar(betaDataDiff, "betaDataDiff", dbl)
    ap, bp = scalar(alphaParamDiff, "alphaParamDiff", dbl), scalar(betaParamDiff, "betaParamDiff", dbl)

    def build():
        return bn._backward_graph(bn_mode, xd, dyd, dxd, pd, saved, bd == 0, bp == 0, yd, dzd, act_bwd,
                                  "NormalizationBackward", md)

    tensors = {bn.X: (xData, "xData"), bn.DY: (dyData, "dyData"), bn.DX: (dxData, "dxData"),
               bn.SCALE: (normScaleData, "normScaleData"), bn.DSCALE: (dNormScaleData, "dNormScaleData"),
               bn.DBIAS: (dNormBiasData, "dNormBiasData")}
    if yd is not None:
        tensors[bn.Y] = (yData, "yData")
    if dzd is not None:
        tensors[bn.DZ] = (dzData, "dzData")
    if saved:
        tensors.update({bn.MEAN: (savedMean, "savedMean"), bn.VAR: (savedInvVariance, "savedInvVariance")})
    run(h, _backward_key(bn_mode, xd, yd, dyd, dzd, dxd, pd, md, act_key, saved, bd == 0, bp == 0), build, tensors,
        {ALPHA: ad, BETA: bd, bn.ALPHA_P: ap, bn.BETA_P: bp, bn.EPS: eps}, workSpace, ws_size, "workSpaceSizeInBytes")


# -- workspace and reserve queries ---------------------------------------------------

@legacy("cudnnGetNormalizationForwardTrainingWorkspaceSize")
def getNormalizationForwardTrainingWorkspaceSize(handle, mode, normOps, algo, xDesc, zDesc, yDesc, normScaleBiasDesc,
                                                 activationDesc, normMeanVarDesc, groupCnt=1) -> int:
    """Bytes of workspace the ForwardTraining plan needs (002 §4.1.12)."""
    h = get_handle(handle)
    bn_mode, xd, yd, pd, md, zd, act_attrs, act_key = _forward_setup(
        mode, normOps, algo, xDesc, normScaleBiasDesc, normMeanVarDesc, zDesc, yDesc, activationDesc, groupCnt)
    plan = plan_for(h, _forward_key(bn_mode, xd, yd, pd, md, zd, act_key, True, True, True),
                    lambda: bn._training_graph(bn_mode, xd, pd, yd, True, True, True, zd, act_attrs,
                                               "NormalizationForwardTraining", md))
    return int(plan.workspace_size)


@legacy("cudnnGetNormalizationBackwardWorkspaceSize")
def getNormalizationBackwardWorkspaceSize(handle, mode, normOps, algo, xDesc, yDesc, dyDesc, dzDesc, dxDesc,
                                          dNormScaleBiasDesc, activationDesc, normMeanVarDesc, groupCnt=1) -> int:
    """Bytes of workspace the Backward plan needs (002 §4.1.11)."""
    h = get_handle(handle)
    bn_mode, xd, yd, dyd, dzd, dxd, pd, md, act_bwd, act_key = _backward_setup(
        mode, normOps, algo, xDesc, yDesc, dyDesc, dzDesc, dxDesc, dNormScaleBiasDesc, activationDesc,
        normMeanVarDesc, groupCnt)
    plan = plan_for(h, _backward_key(bn_mode, xd, yd, dyd, dzd, dxd, pd, md, act_key, True, True, True),
                    lambda: bn._backward_graph(bn_mode, xd, dyd, dxd, pd, True, True, True, yd, dzd, act_bwd,
                                               "NormalizationBackward", md))
    return int(plan.workspace_size)


@legacy("cudnnGetNormalizationTrainingReserveSpaceSize")
def getNormalizationTrainingReserveSpaceSize(handle, mode, normOps, algo, activationDesc, xDesc, groupCnt=1) -> int:
    """0: nothing passes from forward to backward beyond savedMean/savedInvVariance (002 §4.1.13).
    BAD_PARAM unless xDesc is 4-d or 5-d."""
    get_handle(handle)
    _, bn_ops = _check_common(mode, normOps, algo, groupCnt)
    xd = tensor_desc(xDesc, "xDesc")
    bn._check_rank(xd, "xDesc")
    if bn_ops in (bn.OPS_ACT, bn.OPS_ADD_ACT):
        bn._activation(activationDesc)
    return 0
