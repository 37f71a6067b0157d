"""Batch normalization (002 §3.2.18 cudnnDeriveBNTensorDescriptor, §3.2.3
ForwardInference, §4.1.4 ForwardTraining, §4.1.2 Backward, §4.1.5/§4.1.3 the Ex variants,
§4.1.8-§4.1.10 their workspace and reserve queries; inventory §2.7).

Each call is one graph: NormForward / NormBackward (see cudnn_compat/_backend/ops/resample_norm.py for
roles and attrs) followed by the alpha/beta blends.  epsilon and the exponential average
factor travel as by-value scalars, so calls that differ only in them share a plan.
  Inference  inv = rsqrt(estimatedVariance + eps) (two Pointwise ops), then NormForward
             INFERENCE: y = alpha*(bias + scale*(x - mean)*inv) + beta*y.
  Training   NormForward TRAINING: biased batch variance for y; running mean/var updated
             as (1-f)*running + f*new with the unbiased variance (m/(m-1)) for var; saved
             mean and inverse std 1/sqrt(var + eps).  The running tensors are read and
             written: their old values are separate input uids bound to the same buffers.
  Ex         y = alpha*act(BN(x) [+ z]) + beta*y with Pointwise ADD and the activation of
             ``activation.pointwise_attrs``.  Backward Ex applies the activation backward
             to dy through y (z is not an argument of it), writes dz (ADD_ACTIVATION) with
             alphaDataDiff/betaDataDiff, then the BN backward.  bnBias is not read.
  Backward   dx blended with alphaDataDiff/betaDataDiff, dscale and dbias with
             alphaParamDiff/betaParamDiff; saved mean/invstd used when given, else
             recomputed from x with epsilon.

Choices where 002 is silent: the Ex fast-kernel restrictions (NHWC only for the fused
activation, HALF z, SPATIAL_PERSISTENT) are not imposed, every layout and type of the
non-Ex calls runs; the workspace queries return the chosen plan's need (0 on the
reference engine) and the reserve space is 0 bytes (savedMean/savedInvVariance carry all
that the backward pass reads; any reserve buffer given is accepted).  Updating the running variance with a single value
per channel (m == 1) has no unbiased variance and is NOT_SUPPORTED.  Derived descriptors of
INT8 data are FLOAT (the only INT8 inference configuration of 002 Table 6).
"""
from __future__ import annotations

import numbers

from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, scalar as scalar_tensor, virtual
from ._core.call import ALPHA, BETA, blend, compute_dtype, plan_for, run
from ._core.uids import SHARED, Uids, prior_uid
from ._core.data import preflight, scalar
from ._core.memo import _ARRAY_TYPES, Memo, arrays, call_site, key as memo_key
from ._core.recipes import Recipe, steady
from ._core.registry import legacy
from .enums import CONSTANTS, ENUMS, is_valid, name_of
from .errors import bad_param, check, not_supported
from .handle import get_handle
from .tensor import D, F, TensorDescriptor, packed_strides, tensor_desc
from ._core.descriptor import resolve

BN = ENUMS["cudnnBatchNormMode_t"]
OPS = ENUMS["cudnnBatchNormOps_t"]
PER_ACTIVATION = BN["CUDNN_BATCHNORM_PER_ACTIVATION"]
OPS_BN, OPS_ACT, OPS_ADD_ACT = (OPS["CUDNN_BATCHNORM_OPS_BN"], OPS["CUDNN_BATCHNORM_OPS_BN_ACTIVATION"],
                                OPS["CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION"])
MIN_EPSILON = CONSTANTS["CUDNN_BN_MIN_EPSILON"]
TRAIN_DTYPES = ("float16", "float32", "float64", "bfloat16")  # 002 Tables 8-11 (+BF16)
INFER_DTYPES = TRAIN_DTYPES + ("int8",)  # 002 Table 6

# uids of the graph tensors; priors (values before the call) are prior_uid(uid)
UIDS = Uids(after=SHARED)
X, Y, SCALE, BIAS, MEAN, VAR, RMEAN, RVAR, SMEAN, SINV, Z, DY, DX, DSCALE, DBIAS, DZ = UIDS.data(16)
ALPHA_P, BETA_P, EPS, FACTOR = UIDS.scalar(4)  # alphaParamDiff, betaParamDiff, epsilon, factor
V1, V2, V3, V4 = UIDS.virtual(4)  # intermediates: each graph numbers its own from V1


# -- argument checks -----------------------------------------------------------------

_ALL_ARRAYS = _ARRAY_TYPES.issuperset  # memo.arrays()'s first test, inlined by the cached calls

def _null(p) -> bool:
    return p is None or (isinstance(p, int) and not isinstance(p, bool) and p == 0)


def _need(p, argname):
    check(not _null(p), argname, "is NULL")


def _pair(a, b, names: str) -> bool:
    """002: both NULL or both non-NULL (BAD_PARAM otherwise); True when both are given."""
    check(_null(a) == _null(b), names, "must both be NULL or both be non-NULL")
    return not _null(a)


def _check_mode(mode):
    check(is_valid("cudnnBatchNormMode_t", mode), "mode", f"{mode!r} is not a cudnnBatchNormMode_t")


def _check_ops(bnOps):
    check(is_valid("cudnnBatchNormOps_t", bnOps), "bnOps", f"{bnOps!r} is not a cudnnBatchNormOps_t")


def _check_rank(d, argname):
    check(d.nbDims in (4, 5), argname, f"is {d.nbDims}-d; only 4-d and 5-d tensors are supported")


def _check_like(d, ref, argname, refname="xDesc"):
    _check_rank(d, argname)
    check(d.dims == ref.dims, argname, f"dims {d.dims} must equal {refname}'s {ref.dims}")
    check(d.dataType == ref.dataType, argname, f"data type must equal {refname}'s")


def _check_dtype(xd, allowed):
    if xd.dtype not in allowed:
        raise not_supported("xDesc", f"data type {name_of('cudnnDataType_t', xd.dataType)} is not supported "
                                     f"(supported: {', '.join(allowed)})")


def axes(mode, nbDims) -> tuple:
    """Dims reduced per channel: N (per activation) or N and the spatial dims."""
    return (0,) if mode == PER_ACTIVATION else (0,) + tuple(range(2, nbDims))


def param_dims(mode, xdims) -> tuple:
    ax = axes(mode, len(xdims))
    return tuple(1 if k in ax else d for k, d in enumerate(xdims))


def param_type(xd) -> int:
    return D["CUDNN_DATA_DOUBLE"] if xd.dtype == "float64" else D["CUDNN_DATA_FLOAT"]


def _check_param(pd, xd, mode, argname):
    want = param_dims(mode, xd.dims)
    check(pd.dims == want, argname, f"dims {pd.dims} must be {want} for mode "
                                    f"{name_of('cudnnBatchNormMode_t', mode)} (see cudnnDeriveBNTensorDescriptor)")
    if pd.dataType != param_type(xd):
        raise not_supported(argname, f"data type must be {name_of('cudnnDataType_t', param_type(xd))} for "
                                     f"{name_of('cudnnDataType_t', xd.dataType)} data")


def _check_eps(epsilon) -> float:
    if type(epsilon) is float and epsilon >= MIN_EPSILON:  # the common case, no message made
        return epsilon
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise bad_param("epsilon", f"must be a number, got {epsilon!r}") from None
    check(eps >= MIN_EPSILON, "epsilon", f"{eps} is less than CUDNN_BN_MIN_EPSILON={MIN_EPSILON}")
    return eps


def _count(mode, xd) -> int:
    n = 1
    for k in axes(mode, xd.nbDims):
        n *= xd.dims[k]
    return n


def _activation(activationDesc, argname="activationDesc"):
    from .activation import activation_desc
    return activation_desc(activationDesc, argname)


def _is_identity(act) -> bool:
    return act.mode == ENUMS["cudnnActivationMode_t"]["CUDNN_ACTIVATION_IDENTITY"]


# -- graph pieces --------------------------------------------------------------------

def _prior(t: Tensor) -> Tensor:
    """The value of an in/out tensor before the call: a separate uid bound to the same buffer."""
    return Tensor(prior_uid(t.uid), t.dims, t.strides, t.dtype, name=t.name + "_prior")


def _eps():
    return scalar_tensor(EPS, "float64", "epsilon")


def _training_graph(mode, xd, pd, yd, running, saved, beta_zero, zd=None, act_attrs=None, name="BatchNormForwardTraining",
                    md=None):
    """``md``: the descriptor of the running and saved statistics when it is not ``pd``
    (cudnnNormalization* pass normMeanVarDesc apart from normScaleBiasDesc)."""
    md = pd if md is None else md
    x = xd.ir(X, "x")
    ct = compute_dtype(xd.dtype)
    ins = {"x": x, "scale": pd.ir(SCALE, "bnScale"), "bias": pd.ir(BIAS, "bnBias"), "epsilon": _eps()}
    cur = virtual(V1, xd.dims, ct, "bn")
    outs = {"y": cur}
    if running:
        rm, rv = md.ir(RMEAN, "resultRunningMean"), md.ir(RVAR, "resultRunningVariance")
        ins.update(running_mean=_prior(rm), running_var=_prior(rv), exp_avg_factor=scalar_tensor(FACTOR, "float64", "factor"))
        outs.update(next_running_mean=rm, next_running_var=rv)
    if saved:
        outs.update(saved_mean=md.ir(SMEAN, "resultSaveMean"), saved_inv_variance=md.ir(SINV, "resultSaveInvVariance"))
    ops = [Operation("NormForward", ins, outs, {"phase": "TRAINING", "axes": axes(mode, xd.nbDims)})]
    if zd is not None:
        nxt = virtual(V2, xd.dims, ct, "bn_plus_z")
        ops.append(Operation("Pointwise", {"x": cur, "b": zd.ir(Z, "z")}, {"y": nxt}, {"mode": "ADD"}))
        cur = nxt
    if act_attrs is not None:
        nxt = virtual(V3, xd.dims, ct, "activation")
        ops.append(Operation("Pointwise", {"x": cur}, {"y": nxt}, dict(act_attrs)))
        cur = nxt
    ops.append(blend(cur, yd.ir(Y, "y"), beta_zero))
    return OperationGraph(ops, name)


def _backward_graph(mode, xd, dyd, dxd, pd, saved, beta_zero_data, beta_zero_param, yd=None, dzd=None,
                    act_bwd=None, name="BatchNormBackward", md=None):
    """[activation backward through y] [-> dz], NormBackward, blends of dx, dscale, dbias.
    ``md``: the descriptor of savedMean/savedInvVariance when it is not ``pd``."""
    md = pd if md is None else md
    ct, pt = compute_dtype(xd.dtype), pd.dtype
    dy = dyd.ir(DY, "dy")
    ops = []
    if act_bwd is not None:
        pre = virtual(V1, xd.dims, ct, "dy_pre_activation")
        ops.append(Operation("Pointwise", {"x": dy, "b": yd.ir(Y, "y")}, {"y": pre}, dict(act_bwd)))
        dy = pre
    if dzd is not None:
        ops.append(blend(dy, dzd.ir(DZ, "dz"), beta_zero_data))
    ins = {"x": xd.ir(X, "x"), "dy": dy, "scale": pd.ir(SCALE, "bnScale"), "epsilon": _eps()}
    if saved:
        ins.update(saved_mean=md.ir(MEAN, "savedMean"), saved_inv_variance=md.ir(VAR, "savedInvVariance"))
    vdx, vds, vdb = virtual(V2, xd.dims, ct, "dx"), virtual(V3, pd.dims, pt, "dscale"), virtual(V4, pd.dims, pt, "dbias")
    ops.append(Operation("NormBackward", ins, {"dx": vdx, "dscale": vds, "dbias": vdb}, {"axes": axes(mode, xd.nbDims)}))
    ops.append(blend(vdx, dxd.ir(DX, "dx"), beta_zero_data))
    ops.append(blend(vds, pd.ir(DSCALE, "resultBnScaleDiff"), beta_zero_param, ALPHA_P, BETA_P))
    ops.append(blend(vdb, pd.ir(DBIAS, "resultBnBiasDiff"), beta_zero_param, ALPHA_P, BETA_P))
    return OperationGraph(ops, name)


def _inference_graph(mode, xd, pd, yd, beta_zero, md=None, name="BatchNormForwardInference"):
    """inv = rsqrt(var + eps); NormForward INFERENCE; blend into y.  ``md``: the descriptor of
    the estimated mean and variance when it is not ``pd``."""
    md = pd if md is None else md
    var, pt = md.ir(VAR, "estimatedVariance"), md.dtype
    shifted, inv = virtual(V2, md.dims, pt, "var_plus_eps"), virtual(V3, md.dims, pt, "inv_std")
    ybn = virtual(V1, xd.dims, compute_dtype(xd.dtype), "bn")
    ins = {"x": xd.ir(X, "x"), "scale": pd.ir(SCALE, "bnScale"), "bias": pd.ir(BIAS, "bnBias"),
           "mean": md.ir(MEAN, "estimatedMean"), "inv_variance": inv}
    return OperationGraph([
        Operation("Pointwise", {"x": var, "b": _eps()}, {"y": shifted}, {"mode": "ADD"}),
        Operation("Pointwise", {"x": shifted}, {"y": inv}, {"mode": "RSQRT"}),
        Operation("NormForward", ins, {"y": ybn}, {"phase": "INFERENCE", "axes": axes(mode, xd.nbDims)}),
        blend(ybn, yd.ir(Y, "y"), beta_zero)], name)


# -- derived descriptor --------------------------------------------------------------

@legacy("cudnnDeriveBNTensorDescriptor")
def deriveBNTensorDescriptor(derivedBnDesc, xDesc, mode) -> None:
    """1xCx1x1 (1xCx1x1x1) for spatial modes, 1xCxHxW (1xCxDxHxW) per activation; FLOAT for
    HALF/BF16/INT8 data, else the data type (002 §3.2.18)."""
    d = resolve(derivedBnDesc, TensorDescriptor, "derivedBnDesc", need_set=False)
    xd = tensor_desc(xDesc, "xDesc")
    _check_mode(mode)
    _check_rank(xd, "xDesc")
    dims = param_dims(mode, xd.dims)
    to_float = (D["CUDNN_DATA_HALF"], D["CUDNN_DATA_BFLOAT16"], D["CUDNN_DATA_INT8"])
    dtype = D["CUDNN_DATA_FLOAT"] if xd.dataType in to_float else xd.dataType
    d.set(dtype, F["CUDNN_TENSOR_NCHW"], dims, packed_strides(F["CUDNN_TENSOR_NCHW"], dims))


# -- forward -------------------------------------------------------------------------

_INFER, _TRAIN, _BACK = Memo("cudnnBatchNormalizationForwardInference"), Memo("cudnnBatchNormalizationForwardTraining"), \
    Memo("cudnnBatchNormalizationBackward")
_INFER_SITES, _TRAIN_SITES, _BACK_SITES = Memo("cudnnBatchNormalizationForwardInference sites"), \
    Memo("cudnnBatchNormalizationForwardTraining sites"), Memo("cudnnBatchNormalizationBackward sites")
_MODES = frozenset(BN.values())


def _resolved(memo, handle, mode, descs) -> tuple:
    """A BN call site's value (``call_site``): (handle, resolved descriptors, memo entry).  The entry
    is None (the value is not remembered) on a first call of these settings, and the descriptors
    None too when ``mode`` is not a plain valid int: the call takes the general way, which checks
    the mode first and uses the descriptors resolved here."""
    h = get_handle(handle)
    if not (type(mode) is int and mode in _MODES):
        return h, None, None
    ds = tuple([tensor_desc(d, name) for d, name in descs])
    m = memo.get((mode,) + tuple([id(d._key or d.key()) for d in ds]))
    if m is None:
        _mk, m = memo.canonical((mode,), ds)
    return h, ds, m


@call_site(_INFER_SITES)
def _infer_site(handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc):
    return _resolved(_INFER, handle, mode, ((xDesc, "xDesc"), (yDesc, "yDesc"),
                                            (bnScaleBiasMeanVarDesc, "bnScaleBiasMeanVarDesc")))


@call_site(_TRAIN_SITES)
def _train_site(handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc):
    return _resolved(_TRAIN, handle, mode, ((xDesc, "xDesc"), (yDesc, "yDesc"),
                                            (bnScaleBiasMeanVarDesc, "bnScaleBiasMeanVarDesc")))


@call_site(_BACK_SITES)
def _back_site(handle, mode, xDesc, dyDesc, dxDesc, bnScaleBiasDiffDesc):
    return _resolved(_BACK, handle, mode, ((xDesc, "xDesc"), (dyDesc, "dyDesc"), (dxDesc, "dxDesc"),
                                           (bnScaleBiasDiffDesc, "bnScaleBiasDiffDesc")))


def _unresolved(mode, bufs, descs) -> tuple:
    """The general way's first checks where no call site resolved the descriptors (a NULL buffer,
    an odd mode, an Ex call): the mode, each buffer of ``bufs`` not NULL, then ``descs`` resolved."""
    _check_mode(mode)
    for p, n in bufs:
        _need(p, n)
    return tuple([tensor_desc(d, n) for d, n in descs])


@legacy("cudnnBatchNormalizationForwardInference")
def batchNormalizationForwardInference(handle, mode, alpha, beta, xDesc, x, yDesc, y, bnScaleBiasMeanVarDesc,
                                       bnScale, bnBias, estimatedMean, estimatedVariance, epsilon) -> None:
    """y = alpha*(bnBias + bnScale*(x - mean)/sqrt(eps + var)) + beta*y (002 §3.2.3).  The
    descriptor checks run once per combination of settings (``_core.memo``)."""
    sk = (handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc)
    bufs = (x, y, bnScale, bnBias, estimatedMean, estimatedVariance)
    if _ALL_ARRAYS(map(type, bufs)) or arrays(bufs):  # arrays()'s test inline, the function on a miss
        h, ds, m = _infer_site(sk, handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc)
    else:  # a NULL buffer: the general way says which
        h, ds, m = get_handle(handle), None, None
    if m is None:  # the general way: every check in its order; the memo entry for the next call
        xd, yd, pd = ds or _unresolved(
            mode, ((x, "x"), (y, "y"), (bnScale, "bnScale"), (bnBias, "bnBias"), (estimatedMean, "estimatedMean"),
                   (estimatedVariance, "estimatedVariance")),
            ((xDesc, "xDesc"), (yDesc, "yDesc"), (bnScaleBiasMeanVarDesc, "bnScaleBiasMeanVarDesc")))
        _check_rank(xd, "xDesc")
        _check_like(yd, xd, "yDesc")
        _check_param(pd, xd, mode, "bnScaleBiasMeanVarDesc")
        eps = _check_eps(epsilon)
        _check_dtype(xd, INFER_DTYPES)
        keys = tuple(("BatchNormForwardInference", int(mode), xd.key(), yd.key(), pd.key(), bz) for bz in (False, True))
        m = _INFER.put(memo_key((int(mode),), (xd, yd, pd)), (xd.dtype == "float64", keys), (xd.key(), yd.key(), pd.key()))
    else:
        xd, yd, pd = ds
        eps = _check_eps(epsilon)
    dbl, keys = m
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        return _inference_graph(mode, xd, pd, yd, b == 0)

    run(h, keys[b == 0], build,
        {X: (x, "x"), Y: (y, "y"), SCALE: (bnScale, "bnScale"), BIAS: (bnBias, "bnBias"),
         MEAN: (estimatedMean, "estimatedMean"), VAR: (estimatedVariance, "estimatedVariance")},
        {ALPHA: a, BETA: b, EPS: eps})


_BN_SCALARS = {"alpha": ALPHA, "beta": BETA, "epsilon": EPS}
batchNormalizationForwardInference = steady(
    batchNormalizationForwardInference, _INFER_SITES, ("handle", "mode", "xDesc", "yDesc", "bnScaleBiasMeanVarDesc"),
    lambda h, ds, m: Recipe(h, m[1], {"x": X, "y": Y, "bnScale": SCALE, "bnBias": BIAS, "estimatedMean": MEAN,
                                      "estimatedVariance": VAR}, _BN_SCALARS, ("beta",), {"epsilon": MIN_EPSILON}))


def _forward_training(h, mode, bnOps, alpha, beta, xDesc, x, zDesc, z, yDesc, y, bnScaleBiasMeanVarDesc, bnScale,
                      bnBias, exponentialAverageFactor, resultRunningMean, resultRunningVariance, epsilon,
                      resultSaveMean, resultSaveInvVariance, activationDesc, workspace=None, workspace_size=0,
                      ex=False, ds=None) -> tuple:
    """The training forward's general way: every check in its order, then the run.  ``ds``: (xd,
    yd, pd) as a call site resolved them (the mode valid, no buffer NULL), else None.  Returns
    (xd, yd, pd)."""
    xd, yd, pd = ds or _unresolved(
        mode, ((x, "x"), (y, "y"), (bnScale, "bnScale"), (bnBias, "bnBias")),
        ((xDesc, "xDesc"), (yDesc, "yDesc"), (bnScaleBiasMeanVarDesc, "bnScaleBiasMeanVarDesc")))
    _check_rank(xd, "xDesc")
    _check_like(yd, xd, "yDesc")
    _check_param(pd, xd, mode, "bnScaleBiasMeanVarDesc")
    saved = _pair(resultSaveMean, resultSaveInvVariance, "resultSaveMean,resultSaveInvVariance")
    running = _pair(resultRunningMean, resultRunningVariance, "resultRunningMean,resultRunningVariance")
    eps = _check_eps(epsilon)
    if ex and bnOps == OPS_ADD_ACT:
        _need(z, "zData")
    zd, act_attrs, act_key = _ex_forward_parts(bnOps, xd, zDesc, activationDesc) if ex else (None, None, None)
    _check_dtype(xd, TRAIN_DTYPES)
    if running and _count(mode, xd) < 2:
        raise not_supported("xDesc", "updating the running variance needs at least 2 values per channel "
                                     "(the unbiased variance of one value is undefined)")
    try:
        factor = float(exponentialAverageFactor)
    except (TypeError, ValueError):
        raise bad_param("exponentialAverageFactor", f"must be a number, got {exponentialAverageFactor!r}") from None
    dbl = xd.dtype == "float64"
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        return _training_graph(mode, xd, pd, yd, running, saved, b == 0, zd, act_attrs,
                               "BatchNormForwardTrainingEx" if ex else "BatchNormForwardTraining")

    key = ("BatchNormForwardTraining", int(mode), xd.key(), yd.key(), pd.key(), running, saved, b == 0,
           zd.key() if zd is not None else None, act_key)
    tensors = {X: (x, "x"), Y: (y, "y"), SCALE: (bnScale, "bnScale"), BIAS: (bnBias, "bnBias")}
    if zd is not None:
        tensors[Z] = (z, "z")
    if running:
        tensors.update({RMEAN: (resultRunningMean, "resultRunningMean"), RVAR: (resultRunningVariance, "resultRunningVariance")})
    if saved:
        tensors.update({SMEAN: (resultSaveMean, "resultSaveMean"), SINV: (resultSaveInvVariance, "resultSaveInvVariance")})
    if ex:
        tensors = _ex_names(tensors)
    run(h, key, build, tensors, {ALPHA: a, BETA: b, EPS: eps, FACTOR: factor}, workspace, workspace_size,
        "workSpaceSizeInBytes" if ex else None)
    return xd, yd, pd


def _ex_forward_parts(bnOps, xd, zDesc, activationDesc):
    """(z descriptor or None, activation pointwise attrs or None, activation key) for bnOps."""
    _check_ops(bnOps)
    zd = act_attrs = act_key = None
    if bnOps == OPS_ADD_ACT:
        zd = tensor_desc(zDesc, "zDesc")
        _check_like(zd, xd, "zDesc")
    if bnOps in (OPS_ACT, OPS_ADD_ACT):
        from .activation import pointwise_attrs
        act = _activation(activationDesc)
        act_key = act.key()
        act_attrs = None if _is_identity(act) else pointwise_attrs(act)
    return zd, act_attrs, act_key


@legacy("cudnnBatchNormalizationForwardTraining")
def batchNormalizationForwardTraining(handle, mode, alpha, beta, xDesc, x, yDesc, y, bnScaleBiasMeanVarDesc, bnScale,
                                      bnBias, exponentialAverageFactor, resultRunningMean, resultRunningVariance,
                                      epsilon, resultSaveMean, resultSaveInvVariance) -> None:
    """002 §4.1.4; see the module docstring for the formulas.  The descriptor checks run once
    per combination of settings (``_core.memo``); the first call goes the general way."""
    sk = (handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc)
    bufs = (x, y, bnScale, bnBias, resultSaveMean, resultSaveInvVariance, resultRunningMean, resultRunningVariance)
    all_four = _ALL_ARRAYS(map(type, bufs)) or arrays(bufs)  # the common call: one test for every buffer
    if all_four or arrays((x, y, bnScale, bnBias)):
        h, ds, m = _train_site(sk, handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc)
    else:  # a NULL buffer: the general way says which
        h, ds, m = get_handle(handle), None, None
    if m is None:  # the general way, then the memo entry for the next call
        xd, yd, pd = _forward_training(h, mode, OPS_BN, alpha, beta, xDesc, x, None, None, yDesc, y,
                                       bnScaleBiasMeanVarDesc, bnScale, bnBias, exponentialAverageFactor,
                                       resultRunningMean, resultRunningVariance, epsilon, resultSaveMean,
                                       resultSaveInvVariance, None, ds=ds)
        keys = {(r, s_, bz): ("BatchNormForwardTraining", int(mode), xd.key(), yd.key(), pd.key(), r, s_, bz, None, None)
                for r in (False, True) for s_ in (False, True) for bz in (False, True)}
        _TRAIN.put(memo_key((int(mode),), (xd, yd, pd)), (xd.dtype == "float64", _count(mode, xd) < 2, keys),
                   (xd.key(), yd.key(), pd.key()))
        return
    xd, yd, pd = ds
    dbl, single, keys = m
    if all_four:
        saved = running = True  # all four given: both pairs complete
    else:
        saved = _pair(resultSaveMean, resultSaveInvVariance, "resultSaveMean,resultSaveInvVariance")
        running = _pair(resultRunningMean, resultRunningVariance, "resultRunningMean,resultRunningVariance")
    eps = _check_eps(epsilon)
    if running and single:
        raise not_supported("xDesc", "updating the running variance needs at least 2 values per channel "
                                     "(the unbiased variance of one value is undefined)")
    try:
        factor = float(exponentialAverageFactor)
    except (TypeError, ValueError):
        raise bad_param("exponentialAverageFactor", f"must be a number, got {exponentialAverageFactor!r}") from None
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        return _training_graph(mode, xd, pd, yd, running, saved, b == 0, None, None, "BatchNormForwardTraining")

    tensors = {X: (x, "x"), Y: (y, "y"), SCALE: (bnScale, "bnScale"), BIAS: (bnBias, "bnBias")}
    if running:
        tensors[RMEAN] = (resultRunningMean, "resultRunningMean")
        tensors[RVAR] = (resultRunningVariance, "resultRunningVariance")
    if saved:
        tensors[SMEAN] = (resultSaveMean, "resultSaveMean")
        tensors[SINV] = (resultSaveInvVariance, "resultSaveInvVariance")
    run(h, keys[(running, saved, b == 0)], build, tensors, {ALPHA: a, BETA: b, EPS: eps, FACTOR: factor})


def _train_recipe(h, ds, m):
    """The training forward's recipe: all eight buffers given (a NULL pair takes the Python path)."""
    _dbl, single, keys = m
    if single:  # every call raises NOT_SUPPORTED (the running variance of one value)
        return None
    return Recipe(h, tuple(keys[(True, True, bz)] for bz in (False, True)),
                  {"x": X, "y": Y, "bnScale": SCALE, "bnBias": BIAS, "resultRunningMean": RMEAN,
                   "resultRunningVariance": RVAR, "resultSaveMean": SMEAN, "resultSaveInvVariance": SINV},
                  dict(_BN_SCALARS, exponentialAverageFactor=FACTOR), ("beta",), {"epsilon": MIN_EPSILON})


batchNormalizationForwardTraining = steady(
    batchNormalizationForwardTraining, _TRAIN_SITES, ("handle", "mode", "xDesc", "yDesc", "bnScaleBiasMeanVarDesc"),
    _train_recipe)


@legacy("cudnnBatchNormalizationForwardTrainingEx")
def batchNormalizationForwardTrainingEx(handle, mode, bnOps, alpha, beta, xDesc, xData, zDesc, zData, yDesc, yData,
                                        bnScaleBiasMeanVarDesc, bnScaleData, bnBiasData, exponentialAverageFactor,
                                        resultRunningMeanData, resultRunningVarianceData, epsilon, saveMean,
                                        saveInvVariance, activationDesc, workspace, workSpaceSizeInBytes,
                                        reserveSpace, reserveSpaceSizeInBytes) -> None:
    """y = alpha*act(BN(x) [+ z]) + beta*y (002 §4.1.5)."""
    h = get_handle(handle)
    _check_sizes(workSpaceSizeInBytes, reserveSpaceSizeInBytes)
    unbound_buffers(h, [(reserveSpace, "reserveSpace", True)])
    _forward_training(h, mode, bnOps, alpha, beta, xDesc, xData, zDesc, zData, yDesc, yData, bnScaleBiasMeanVarDesc,
                      bnScaleData, bnBiasData, exponentialAverageFactor, resultRunningMeanData,
                      resultRunningVarianceData, epsilon, saveMean, saveInvVariance, activationDesc,
                      workspace, int(workSpaceSizeInBytes), ex=True)


# the C parameter names of the Ex calls (002 §4.1.3, §4.1.5), for messages naming the argument
_EX_NAMES = {"x": "xData", "y": "yData", "z": "zData", "dy": "dyData", "dz": "dzData", "dx": "dxData",
             "bnScale": "bnScaleData", "bnBias": "bnBiasData", "resultRunningMean": "resultRunningMeanData",
             "resultRunningVariance": "resultRunningVarianceData", "resultSaveMean": "saveMean",
             "resultSaveInvVariance": "saveInvVariance", "resultBnScaleDiff": "dBnScaleData",
             "resultBnBiasDiff": "dBnBiasData"}


def _ex_names(tensors: dict) -> dict:
    return {uid: (data, _EX_NAMES.get(name, name)) for uid, (data, name) in tensors.items()}


def unbound_buffers(h, items) -> None:
    """Buffers an Ex call takes but no graph binds (the reserve space, which this library's
    graphs do not need; bnBiasData of the backward): checked like bound ones (NULL allowed), so
    a descriptor or a CPU-place int there is BAD_PARAM before anything is written.  ``items``:
    (data, argname, written)."""
    given = [(data, (None, 0), name, written) for data, name, written in items if not _null(data)]
    if given:
        preflight(h, given)


def _check_sizes(workspace_size, reserve_size):
    for v, n in ((workspace_size, "workSpaceSizeInBytes"), (reserve_size, "reserveSpaceSizeInBytes")):
        check(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0, n, f"must be a non-negative int, got {v!r}")


# -- backward ------------------------------------------------------------------------

def _backward_descs(mode, bnOps, xDesc, yDesc, dyDesc, dzDesc, dxDesc, bnScaleBiasDiffDesc, activationDesc,
                    diff_name="bnScaleBiasDiffDesc", ex=False, ds=None):
    """Checked descriptors and the graph settings of a backward call:
    (xd, yd, dyd, dzd, dxd, pd, activation backward attrs or None, activation key).  ``ds``: (xd,
    dyd, dxd, pd) resolved by the caller after its mode check, else the mode is checked and they
    are resolved here."""
    if ds is None:
        _check_mode(mode)
        ds = _backward_resolve(xDesc, dyDesc, dxDesc, bnScaleBiasDiffDesc, diff_name)
    xd, dyd, dxd, pd = ds
    _check_rank(xd, "xDesc")
    _check_like(dyd, xd, "dyDesc")
    _check_like(dxd, xd, "dxDesc")
    _check_param(pd, xd, mode, diff_name)
    yd = dzd = act_bwd = act_key = None
    if ex:
        _check_ops(bnOps)
        if bnOps in (OPS_ACT, OPS_ADD_ACT):
            act = _activation(activationDesc)
            act_key = act.key()
            if not _is_identity(act):
                from .activation import backward_attrs
                act_bwd, reads = backward_attrs(act)
                if reads != "y":
                    raise not_supported("activationDesc", f"{name_of('cudnnActivationMode_t', act.mode)} needs the "
                                                          "activation's input for its derivative; the BN backward "
                                                          "only receives y")
                yd = tensor_desc(yDesc, "yDesc")
                _check_like(yd, xd, "yDesc")
        if bnOps == OPS_ADD_ACT:
            dzd = tensor_desc(dzDesc, "dzDesc")
            _check_like(dzd, xd, "dzDesc")
    _check_dtype(xd, TRAIN_DTYPES)
    return xd, yd, dyd, dzd, dxd, pd, act_bwd, act_key


def _backward_resolve(xDesc, dyDesc, dxDesc, bnScaleBiasDiffDesc, diff_name="bnScaleBiasDiffDesc") -> tuple:
    return (tensor_desc(xDesc, "xDesc"), tensor_desc(dyDesc, "dyDesc"), tensor_desc(dxDesc, "dxDesc"),
            tensor_desc(bnScaleBiasDiffDesc, diff_name))


def _backward_key(mode, xd, yd, dyd, dzd, dxd, pd, act_key, saved, bd0, bp0) -> tuple:
    return ("BatchNormBackward", int(mode), xd.key(), dyd.key(), dxd.key(), pd.key(), saved, bd0, bp0,
            yd.key() if yd is not None else None, dzd.key() if dzd is not None else None, act_key)


def _backward(h, mode, bnOps, alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff, xDesc, x, yDesc, y,
              dyDesc, dy, dzDesc, dz, dxDesc, dx, bnScaleBiasDiffDesc, bnScale, resultBnScaleDiff, resultBnBiasDiff,
              epsilon, savedMean, savedInvVariance, activationDesc, workspace=None, workspace_size=0, ex=False,
              ds=None) -> tuple:
    """The backward's general way: every check in its order, then the run.  ``ds``: (xd, dyd, dxd,
    pd) as a call site resolved them (the mode valid, no buffer NULL), else None.  Returns ``ds``."""
    diff_name = "dBnScaleBiasDesc" if ex else "bnScaleBiasDiffDesc"
    if ds is None:
        _check_mode(mode)
        for p, n in ((x, "x"), (dy, "dy"), (dx, "dx"), (bnScale, "bnScale"), (resultBnScaleDiff, "resultBnScaleDiff"),
                     (resultBnBiasDiff, "resultBnBiasDiff")):
            _need(p, n)
        if ex:
            _check_ops(bnOps)
            if bnOps in (OPS_ACT, OPS_ADD_ACT):
                _need(y, "yData")
            if bnOps == OPS_ADD_ACT:
                _need(dz, "dzData")
        ds = _backward_resolve(xDesc, dyDesc, dxDesc, bnScaleBiasDiffDesc, diff_name)
    xd, yd, dyd, dzd, dxd, pd, act_bwd, act_key = _backward_descs(
        mode, bnOps, xDesc, yDesc, dyDesc, dzDesc, dxDesc, bnScaleBiasDiffDesc, activationDesc, diff_name, ex, ds)
    saved = _pair(savedMean, savedInvVariance, "savedMean,savedInvVariance")
    eps = _check_eps(epsilon)
    dbl = xd.dtype == "float64"
    ad, bd = scalar(alphaDataDiff, "alphaDataDiff", dbl), scalar(betaDataDiff, "betaDataDiff", dbl)
    ap, bp = scalar(alphaParamDiff, "alphaParamDiff", dbl), scalar(betaParamDiff, "betaParamDiff", dbl)

    def build():
        return _backward_graph(mode, xd, dyd, dxd, pd, saved, bd == 0, bp == 0, yd, dzd, act_bwd,
                               "BatchNormBackwardEx" if ex else "BatchNormBackward")

    tensors = {X: (x, "x"), DY: (dy, "dy"), DX: (dx, "dx"), SCALE: (bnScale, "bnScale"),
               DSCALE: (resultBnScaleDiff, "resultBnScaleDiff"), DBIAS: (resultBnBiasDiff, "resultBnBiasDiff")}
    if yd is not None:
        tensors[Y] = (y, "y")
    if dzd is not None:
        tensors[DZ] = (dz, "dz")
    if saved:
        tensors.update({MEAN: (savedMean, "savedMean"), VAR: (savedInvVariance, "savedInvVariance")})
    if ex:
        tensors = _ex_names(tensors)
    run(h, _backward_key(mode, xd, yd, dyd, dzd, dxd, pd, act_key, saved, bd == 0, bp == 0), build, tensors,
        {ALPHA: ad, BETA: bd, ALPHA_P: ap, BETA_P: bp, EPS: eps}, workspace, workspace_size,
        "workSpaceSizeInBytes" if ex else None)
    return ds


@legacy("cudnnBatchNormalizationBackward")
def batchNormalizationBackward(handle, mode, alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff, xDesc, x,
                               dyDesc, dy, dxDesc, dx, bnScaleBiasDiffDesc, bnScale, resultBnScaleDiff,
                               resultBnBiasDiff, epsilon, savedMean, savedInvVariance) -> None:
    """dx, dscale, dbias of the training forward (002 §4.1.2).  The descriptor checks run once
    per combination of settings (``_core.memo``); the first call goes the general way."""
    sk = (handle, mode, xDesc, dyDesc, dxDesc, bnScaleBiasDiffDesc)
    bufs = (x, dy, dx, bnScale, resultBnScaleDiff, resultBnBiasDiff, savedMean, savedInvVariance)
    both = _ALL_ARRAYS(map(type, bufs)) or arrays(bufs)
    if both or arrays((x, dy, dx, bnScale, resultBnScaleDiff, resultBnBiasDiff)):
        h, ds, m = _back_site(sk, handle, mode, xDesc, dyDesc, dxDesc, bnScaleBiasDiffDesc)
    else:  # a NULL buffer: the general way says which
        h, ds, m = get_handle(handle), None, None
    if m is None:  # the general way, then the memo entry for the next call
        xd, dyd, dxd, pd = _backward(h, mode, OPS_BN, alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff, xDesc,
                                     x, None, None, dyDesc, dy, None, None, dxDesc, dx, bnScaleBiasDiffDesc, bnScale,
                                     resultBnScaleDiff, resultBnBiasDiff, epsilon, savedMean, savedInvVariance, None,
                                     ds=ds)
        keys = {(s_, bd0, bp0): _backward_key(mode, xd, None, dyd, None, dxd, pd, None, s_, bd0, bp0)
                for s_ in (False, True) for bd0 in (False, True) for bp0 in (False, True)}
        _BACK.put(memo_key((int(mode),), (xd, dyd, dxd, pd)), (xd.dtype == "float64", keys), (xd.key(), dyd.key(), dxd.key(), pd.key()))
        return
    xd, dyd, dxd, pd = ds
    dbl, keys = m
    saved = True if both else _pair(savedMean, savedInvVariance, "savedMean,savedInvVariance")
    eps = _check_eps(epsilon)
    ad, bd = scalar(alphaDataDiff, "alphaDataDiff", dbl), scalar(betaDataDiff, "betaDataDiff", dbl)
    ap, bp = scalar(alphaParamDiff, "alphaParamDiff", dbl), scalar(betaParamDiff, "betaParamDiff", dbl)

    def build():
        return _backward_graph(mode, xd, dyd, dxd, pd, saved, bd == 0, bp == 0, None, None, None, "BatchNormBackward")

    tensors = {X: (x, "x"), DY: (dy, "dy"), DX: (dx, "dx"), SCALE: (bnScale, "bnScale"),
               DSCALE: (resultBnScaleDiff, "resultBnScaleDiff"), DBIAS: (resultBnBiasDiff, "resultBnBiasDiff")}
    if saved:
        tensors[MEAN] = (savedMean, "savedMean")
        tensors[VAR] = (savedInvVariance, "savedInvVariance")
    run(h, keys[(saved, bd == 0, bp == 0)], build, tensors, {ALPHA: ad, BETA: bd, ALPHA_P: ap, BETA_P: bp, EPS: eps})


batchNormalizationBackward = steady(  # the recipe: all eight buffers given (no saved pair: the Python path)
    batchNormalizationBackward, _BACK_SITES, ("handle", "mode", "xDesc", "dyDesc", "dxDesc", "bnScaleBiasDiffDesc"),
    lambda h, ds, m: Recipe(
        h, tuple(m[1][(True, bool(i & 1), bool(i & 2))] for i in range(4)),
        {"x": X, "dy": DY, "dx": DX, "bnScale": SCALE, "resultBnScaleDiff": DSCALE, "resultBnBiasDiff": DBIAS,
         "savedMean": MEAN, "savedInvVariance": VAR},
        {"alphaDataDiff": ALPHA, "betaDataDiff": BETA, "alphaParamDiff": ALPHA_P, "betaParamDiff": BETA_P,
         "epsilon": EPS}, ("betaDataDiff", "betaParamDiff"), {"epsilon": MIN_EPSILON}))


@legacy("cudnnBatchNormalizationBackwardEx")
def batchNormalizationBackwardEx(handle, mode, bnOps, alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff,
                                 xDesc, xData, yDesc, yData, dyDesc, dyData, dzDesc, dzData, dxDesc, dxData,
                                 dBnScaleBiasDesc, bnScaleData, bnBiasData, dBnScaleData, dBnBiasData, epsilon,
                                 savedMean, savedInvVariance, activationDesc, workspace, workSpaceSizeInBytes,
                                 reserveSpace, reserveSpaceSizeInBytes) -> None:
    """002 §4.1.3: the activation backward through y, dz (ADD_ACTIVATION), then the BN backward."""
    h = get_handle(handle)
    _check_sizes(workSpaceSizeInBytes, reserveSpaceSizeInBytes)
    unbound_buffers(h, [(reserveSpace, "reserveSpace", False), (bnBiasData, "bnBiasData", False)])
    _backward(h, mode, bnOps, alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff, xDesc, xData, yDesc, yData,
              dyDesc, dyData, dzDesc, dzData, dxDesc, dxData, dBnScaleBiasDesc, bnScaleData, dBnScaleData, dBnBiasData,
              epsilon, savedMean, savedInvVariance, activationDesc, workspace, int(workSpaceSizeInBytes), ex=True)


# -- workspace and reserve queries ---------------------------------------------------

@legacy("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize")
def getBatchNormalizationForwardTrainingExWorkspaceSize(handle, mode, bnOps, xDesc, zDesc, yDesc,
                                                        bnScaleBiasMeanVarDesc, activationDesc) -> int:
    """Bytes of workspace the ForwardTrainingEx plan needs (002 §4.1.9)."""
    h = get_handle(handle)
    _check_mode(mode)
    xd, yd = tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, "yDesc")
    pd = tensor_desc(bnScaleBiasMeanVarDesc, "bnScaleBiasMeanVarDesc")
    _check_rank(xd, "xDesc")
    _check_like(yd, xd, "yDesc")
    _check_param(pd, xd, mode, "bnScaleBiasMeanVarDesc")
    zd, act_attrs, act_key = _ex_forward_parts(bnOps, xd, zDesc, activationDesc)
    _check_dtype(xd, TRAIN_DTYPES)
    key = ("BatchNormForwardTraining", int(mode), xd.key(), yd.key(), pd.key(), True, True, True,
           zd.key() if zd is not None else None, act_key)
    plan = plan_for(h, key, lambda: _training_graph(mode, xd, pd, yd, True, True, True, zd, act_attrs,
                                                    "BatchNormForwardTrainingEx"))
    return int(plan.workspace_size)


@legacy("cudnnGetBatchNormalizationBackwardExWorkspaceSize")
def getBatchNormalizationBackwardExWorkspaceSize(handle, mode, bnOps, xDesc, yDesc, dyDesc, dzDesc, dxDesc,
                                                 dBnScaleBiasDesc, activationDesc) -> int:
    """Bytes of workspace the BackwardEx plan needs (002 §4.1.8)."""
    h = get_handle(handle)
    xd, yd, dyd, dzd, dxd, pd, act_bwd, act_key = _backward_descs(
        mode, bnOps, xDesc, yDesc, dyDesc, dzDesc, dxDesc, dBnScaleBiasDesc, activationDesc, "dBnScaleBiasDesc", True)
    plan = plan_for(h, _backward_key(mode, xd, yd, dyd, dzd, dxd, pd, act_key, True, True, True),
                    lambda: _backward_graph(mode, xd, dyd, dxd, pd, True, True, True, yd, dzd, act_bwd,
                                            "BatchNormBackwardEx"))
    return int(plan.workspace_size)


@legacy("cudnnGetBatchNormalizationTrainingExReserveSpaceSize")
def getBatchNormalizationTrainingExReserveSpaceSize(handle, mode, bnOps, activationDesc, xDesc) -> int:
    """0: the Ex plans pass nothing between forward and backward beyond savedMean and
    savedInvVariance (002 §4.1.10).  BAD_PARAM unless xDesc is 4-d or 5-d."""
    get_handle(handle)
    _check_mode(mode)
    _check_ops(bnOps)
    xd = tensor_desc(xDesc, "xDesc")
    _check_rank(xd, "xDesc")
    if bnOps in (OPS_ACT, OPS_ADD_ACT):
        _activation(activationDesc)
    return 0
