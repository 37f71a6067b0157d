"""cudnnConvolutionBiasActivationForward (002 §5.2.9): y = act(alpha1*conv(x, w) + alpha2*z + bias),
act RELU or IDENTITY; z may alias y and is not read when alpha2 == 0.

One fused graph, ConvolutionForward -> Pointwise ADD z (alpha1, alpha2) -> Pointwise ADD bias ->
Pointwise RELU_FWD | IDENTITY -> y, wherever an engine runs it well.  cuDNN 9 fuses conv
epilogues for NHWC tensors only; an NCHW fused graph would go to the cupy engine, whose
convolution is the im2col fallback run through its general path (250-400 us a call on an H200
for an 8x8x8 problem, against 6 us for the fused NHWC call).  Such calls run *split*
(``_use_split``): the plain convolution on the native engine, with its own blend
y = alpha1*conv + alpha2*y when z is y (else beta 0), then one epilogue graph in place on y,
y = act(y [+ alpha2*z] + bias) (a launch record of the cupy engine).  Precision: the sum
before the bias is stored in y's data type once (in the fused graph it stays in the compute
type), a rounding of the data type's size.  z overlapping y without being it runs fused.
"""
from __future__ import annotations

from cudnn_compat._backend.ir import Operation, OperationGraph, scalar as scalar_tensor, virtual
from .._core import call as _call
from .._core.call import ALPHA, BETA, compute_dtype
from .._core.data import address, extent_bytes, preflight, same_buffer, scalar
from .._core.descriptor import resolve
from .._core.memo import Memo, call_site
from .._core.recipes import Recipe, steady
from .._core.registry import legacy
from .._core.uids import prior_uid
from ..enums import ENUMS, name_of
from ..errors import check, not_supported
from ..handle import get_handle
from ..tensor import FilterDescriptor, tensor_desc
from .algos import INT8_CONFIGS
from .api import ALPHA2, BIAS, D_DOUBLE, FWD, SUM_BIAS, SUM_Z, W, X, Y, Z, ConvCall, _algo, _call_key, _checked_call
from .descriptor import ConvolutionDescriptor

ACT = ENUMS["cudnnActivationMode_t"]


def _same_layout(a, b) -> bool:
    return a.dataType == b.dataType and a.dims == b.dims and a.strides == b.strides


_ACTIVATION_CLASS: list = []


def _activation_class():
    """The activation family's descriptor class (imported on first use: that family is optional)."""
    if not _ACTIVATION_CLASS:
        try:
            from ..activation import ActivationDescriptor
        except ImportError:  # pragma: no cover - the activation family is not installed
            raise not_supported("activationDesc", "activation descriptors are not available") from None
        _ACTIVATION_CLASS.append(ActivationDescriptor)
    return _ACTIVATION_CLASS[0]


def _bias_act_graph(call: ConvCall, algo, ad, zd, bd, use_z: bool) -> OperationGraph:
    """Validate a ConvolutionBiasActivationForward signature (002 §5.2.9 'Returns') and build its
    graph; runs once per signature, on a plan-cache miss, before anything is written.  ``ad``: the
    resolved activation descriptor."""
    cd, yd = call.cd, call.yd
    for name, d in (("xDesc", call.xd), ("wDesc", call.wd), ("yDesc", yd), ("zDesc", zd)):
        check(d.nbDims == cd.arrayLength + 2, name,
              f"has {d.nbDims} dims; it must have convDesc arrayLength + 2 = {cd.arrayLength + 2}")
    mode, nan_opt = ad.mode, ad.reluNanOpt
    act = ENUMS["cudnnActivationMode_t"]
    if mode not in (act["CUDNN_ACTIVATION_RELU"], act["CUDNN_ACTIVATION_IDENTITY"]):
        raise not_supported("activationDesc", f"mode must be CUDNN_ACTIVATION_RELU or CUDNN_ACTIVATION_IDENTITY, got "
                            f"{name_of('cudnnActivationMode_t', mode)}")
    if nan_opt != ENUMS["cudnnNanPropagation_t"]["CUDNN_NOT_PROPAGATE_NAN"]:
        raise not_supported("activationDesc", "reluNanOpt must be CUDNN_NOT_PROPAGATE_NAN")
    name = _algo(FWD, algo, call)
    if mode == act["CUDNN_ACTIVATION_IDENTITY"] and name != "IMPLICIT_PRECOMP_GEMM":
        raise not_supported("algo", "CUDNN_ACTIVATION_IDENTITY works only with CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM")
    if not _same_layout(zd, yd):
        raise not_supported("zDesc", "must match yDesc (dims, strides and data type)")
    k = call.wd.dims[0]
    if bd.nbDims != yd.nbDims or bd.dims != (1, k) + (1,) * (yd.nbDims - 2):
        raise not_supported("biasDesc", f"must be 1x{k}" + "x1" * (yd.nbDims - 2) + f" (K of wDesc), got {bd.dims}")
    if bd.strides[1] != 1:
        raise not_supported("biasDesc", f"its second stride must be 1, got {bd.strides[1]}")
    bias_dtype = "float32" if call.config in INT8_CONFIGS else yd.dtype
    if bd.dtype != bias_dtype:
        raise not_supported("biasDesc", f"data type must be {bias_dtype} for {call.config}_CONFIG, got {bd.dtype}")
    relu = mode == act["CUDNN_ACTIVATION_RELU"]
    conv, out = call.conv_op(name, cd.mathType)
    c = conv.outputs["y"]
    ct = compute_dtype(out.dtype)
    s1, s2 = virtual(SUM_Z, out.dims, ct, "alpha1_conv_alpha2_z"), virtual(SUM_BIAS, out.dims, ct, "plus_bias")
    a1_t = scalar_tensor(ALPHA, ct, "alpha1")
    if use_z:
        add_z = Operation("Pointwise", {"x": c, "b": zd.ir(Z, "z"), "alpha1": a1_t,
                                        "alpha2": scalar_tensor(ALPHA2, ct, "alpha2")}, {"y": s1}, {"mode": "ADD"})
    else:
        add_z = Operation("Pointwise", {"x": c, "alpha1": a1_t}, {"y": s1}, {"mode": "IDENTITY"})
    add_b = Operation("Pointwise", {"x": s1, "b": bd.ir(BIAS, "bias")}, {"y": s2}, {"mode": "ADD"})
    act_op = Operation("Pointwise", {"x": s2}, {"y": out},
                       {"mode": "RELU_FWD", "nan_propagation": "NOT_PROPAGATE"} if relu else {"mode": "IDENTITY"})
    return OperationGraph([conv, add_z, add_b, act_op], "ConvolutionBiasActivationForward")


_CBA_SITES = Memo("cudnnConvolutionBiasActivationForward sites")


@legacy("cudnnConvolutionBiasActivationForward")
def convolutionBiasActivationForward(handle, alpha1, xDesc, x, wDesc, w, convDesc, algo, workSpace,
                                     workSpaceSizeInBytes, alpha2, zDesc, z, biasDesc, bias, activationDesc,
                                     yDesc, y) -> None:
    """y = act(alpha1*conv(x, w) + alpha2*z + bias) as one fused graph (002 §5.2.9), or on the GPU
    place where no native engine fuses it (NCHW) as the convolution then an epilogue graph; z may
    alias y, and is not read when alpha2 == 0.  As in ``_compute``, a cached call resolves the descriptors
    and keys on their settings; 002's rules are checked by the builder on a plan-cache miss."""
    sk = (handle, xDesc, wDesc, yDesc, zDesc, convDesc, biasDesc, activationDesc, algo)
    h, xd, wd, yd, zd, cd, bd, ad, double, keys = _cba_site(sk, handle, xDesc, wDesc, yDesc, zDesc, convDesc, biasDesc,
                                                            activationDesc, algo)
    a1, a2 = scalar(alpha1, "alpha1", double), scalar(alpha2, "alpha2", double)
    use_z = a2 != 0
    key = keys[use_z]

    def build():
        return _bias_act_graph(_checked_call(FWD, xd, wd, yd, cd), algo, ad, zd, bd, use_z)

    wsize = int(workSpaceSizeInBytes or 0)
    form = _use_split(h, key, build, xd, wd, yd, zd, cd, bd, ad, algo)
    if form is not None and _run_split(form, h, a1, a2, x, w, y, z, bias, workSpace, wsize):
        return
    tensors = {X: (x, "x"), W: (w, "w"), Y: (y, "y"), BIAS: (bias, "bias")}
    if use_z:
        tensors[Z] = (z, "z")
    _call.run(h, key, build, tensors, {ALPHA: a1, ALPHA2: a2}, workSpace, wsize, workspace_arg="workSpaceSizeInBytes")


@call_site(_CBA_SITES)
def _cba_site(handle, xDesc, wDesc, yDesc, zDesc, convDesc, biasDesc, activationDesc, algo):
    """convolutionBiasActivationForward's descriptors resolved and its plan-cache keys (002's rules:
    ``_bias_act_graph`` in the builder)."""
    h = get_handle(handle)
    xd = tensor_desc(xDesc, "xDesc")
    wd = resolve(wDesc, FilterDescriptor, "wDesc")
    yd = tensor_desc(yDesc, "yDesc")
    zd = tensor_desc(zDesc, "zDesc")
    cd = resolve(convDesc, ConvolutionDescriptor, "convDesc")
    bd = tensor_desc(biasDesc, "biasDesc")
    ad = resolve(activationDesc, _ACTIVATION_CLASS[0] if _ACTIVATION_CLASS else _activation_class(), "activationDesc")
    double = yd.dataType == D_DOUBLE
    keys = tuple(("ConvolutionBiasActivationForward", xd.key(), wd.key(), yd.key(), cd.key(), zd.key(), bd.key(),
                  ad.key(), algo if type(algo) is int else repr(algo), uz) for uz in (False, True))
    return h, xd, wd, yd, zd, cd, bd, ad, double, keys


convolutionBiasActivationForward = steady(  # keys[alpha2 != 0]; z bound always (a plan without z ignores it)
    convolutionBiasActivationForward, _CBA_SITES,
    ("handle", "xDesc", "wDesc", "yDesc", "zDesc", "convDesc", "biasDesc", "activationDesc", "algo"),
    lambda h, xd, wd, yd, zd, cd, bd, ad, dbl, keys: None if _SPLIT.get(keys[False]) or _SPLIT.get(keys[True]) else Recipe(
        h, (keys[True], keys[False]), {"x": X, "w": W, "y": Y, "bias": BIAS, "z": Z}, {"alpha1": ALPHA, "alpha2": ALPHA2},
        ("alpha2",), workspace=("workSpace", "workSpaceSizeInBytes")))




# -- the split form (module docstring) -------------------------------------------------------------

_SPLIT: dict = {}  # fused plan-cache key -> None (fused) or the split form (``_split_form``)
_SPLIT_MAX = 1024


def _split_form(xd, wd, yd, zd, cd, bd, ad, algo):
    """((the plain convolution's plan-cache key, its graph builder) by beta == 0, (the epilogue's
    plan-cache key, its graph builder) by whether it adds z, (bias's IR tensor, z's, the bytes y
    spans)); None for the INT8 configs (their y is not the convolution's result type).  Made once
    per fused key (which holds every descriptor's settings): a call only picks from it, and its
    preflight reads the IR tensors' layouts once (``data.layout`` keeps them per tensor object)."""
    call = _checked_call(FWD, xd, wd, yd, cd)
    if call.config in INT8_CONFIGS:
        return None
    name = _algo(FWD, algo, call)
    conv = tuple((_call_key(FWD, xd, wd, yd, cd, algo, bz), call.builder(name, cd.mathType, bz)) for bz in (False, True))
    keys = (yd.key(), zd.key(), bd.key(), ad.key())
    epilogue = tuple((("ConvolutionBiasActivationForward.epilogue",) + keys + (add_z,),
                      (lambda add_z=add_z: _epilogue(yd, zd, bd, ad, add_z))) for add_z in (False, True))
    return conv, epilogue, (bd.ir(BIAS, "bias"), zd.ir(Z, "z"), extent_bytes(yd.ir(Y, "y")))


def _use_split(h, key, build, xd, wd, yd, zd, cd, bd, ad, algo):
    """``_split_form`` for a call that runs split, else None (fused): on the GPU place, when the fused
    graph's plan is not the native engine's but the plain convolution's is.  Decided once per
    fused key, after the fused plan is built (its builder checks 002's rules)."""
    if key in _SPLIT:
        return _SPLIT[key]
    form = None
    if h.place == "gpu" and _call.plan_for(h, key, build).engine != "cudnn":
        form = _split_form(xd, wd, yd, zd, cd, bd, ad, algo)
        if form is not None and _call.plan_for(h, *form[0][True]).engine != "cudnn":
            form = None
    if len(_SPLIT) >= _SPLIT_MAX:
        _SPLIT.clear()
    _SPLIT[key] = form
    return form


def _epilogue(yd, zd, bd, ad, add_z: bool) -> OperationGraph:
    """y = act(y_prior [+ alpha2*z] + bias), in place on y (y_prior: y's buffer, the convolution's result)."""
    y = yd.ir(Y, "y")
    ct = compute_dtype(y.dtype)
    cur = type(y)(prior_uid(Y), y.dims, y.strides, y.dtype, name="y_conv")
    ops = []
    if add_z:
        s1 = virtual(SUM_Z, y.dims, ct, "conv_plus_alpha2_z")
        ops.append(Operation("Pointwise", {"x": cur, "b": zd.ir(Z, "z"), "alpha2": scalar_tensor(ALPHA2, ct, "alpha2")},
                             {"y": s1}, {"mode": "ADD"}))
        cur = s1
    s2 = virtual(SUM_BIAS, y.dims, ct, "plus_bias")
    ops.append(Operation("Pointwise", {"x": cur, "b": bd.ir(BIAS, "bias")}, {"y": s2}, {"mode": "ADD"}))
    ops.append(Operation("Pointwise", {"x": s2}, {"y": y}, {"mode": "RELU_FWD", "nan_propagation": "NOT_PROPAGATE"}
                         if ad.mode == ACT["CUDNN_ACTIVATION_RELU"] else {"mode": "IDENTITY"}))
    return OperationGraph(ops, "ConvolutionBiasActivationForward.epilogue")


def _apart(z, y, n: int) -> bool:
    """z and y are buffers that share no byte of y's extent (``n`` bytes; False when that cannot be told)."""
    az, ay = address(z), address(y)
    if az is None or ay is None:
        return False
    return az >= ay + n or ay >= az + n


def _run_split(form, h, a1, a2, x, w, y, z, bias, workSpace, wsize) -> bool:
    """The split form of one call (module docstring); False (nothing run) when z overlaps y without
    being it: the fused graph runs then."""
    conv, epilogue, (bias_ir, z_ir, y_bytes) = form
    add_z = a2 != 0 and not same_buffer(z, y)
    if add_z and not _apart(z, y, y_bytes):
        return False
    items = [(bias, bias_ir, "bias", False)] + ([(z, z_ir, "z", False)] if add_z else [])
    preflight(h, items, pointers=True)  # the epilogue's buffers, before the convolution writes y
    beta = 0.0 if add_z else a2
    _call.run(h, *conv[beta == 0], {X: (x, "x"), W: (w, "w"), Y: (y, "y")}, {ALPHA: a1, BETA: beta},
              workSpace, wsize, workspace_arg="workSpaceSizeInBytes")
    tensors = {Y: (y, "y"), BIAS: (bias, "bias")}
    if add_z:
        tensors[Z] = (z, "z")
    _call.run(h, *epilogue[add_z], tensors, {ALPHA2: a2})
    return True
