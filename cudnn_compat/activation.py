"""Activation descriptors and activation forward/backward (002 §3.1.2.1 cudnnActivationMode_t,
§3.2.6 cudnnCreateActivationDescriptor, §3.2.76 cudnnSetActivationDescriptor, §3.2.37
cudnnGetActivationDescriptor, §3.2.21 cudnnDestroyActivationDescriptor, §3.2.1
cudnnActivationForward, §4.1.1 cudnnActivationBackward; cuDNN 8.2's SWISH mode and
cudnnSet/GetActivationDescriptorSwishBeta, which 002 lacks).

Every activation is one graph Pointwise op.  ``MODES`` is the one table from
cudnnActivationMode_t to (forward pointwise mode, backward pointwise mode, which forward
tensor the derivative reads, the pointwise attribute that carries ``coef``):

  SIGMOID       y = 1/(1+e^-x)               dx = dy*y*(1-y)              reads y
  RELU          y = max(x, 0)                dx = dy where y > 0          reads y
  TANH          y = tanh(x)                  dx = dy*(1-y^2)              reads y
  CLIPPED_RELU  y = min(max(x, 0), coef)     dx = dy where 0 < y < coef'  reads y
  ELU           y = x > 0 ? x : coef*(e^x-1) dx = dy*(y > 0 ? 1 : y+coef) reads y
  SWISH         y = x*sigmoid(swish_beta*x)  dx = dy*(s + b*x*s*(1-s))    reads x
  IDENTITY      y = x (ConvolutionBiasActivationForward only; BAD_PARAM here)

Backward reads y wherever the derivative can be written with it, as cuDNN does (callers
such as Caffe2 pass y in place of x for ELU, sigmoid and tanh, Chainer for ReLU); swish
cannot, so it reads x.  The tensor a mode does not read may be NULL.  For clipped ReLU
coef' is coef rounded to y's data type, the value a saturated y holds (0.8 is 0.7998 in
half precision, and y < 0.8 would let the gradient through).  RELU ignores coef (002
§3.2.76 calls it an "upper bound", which cuDNN never applied).  ``reluNanOpt`` maps to the pointwise
``nan_propagation`` attribute: under NOT_PROPAGATE a NaN input to (clipped) ReLU gives 0.

``pointwise_attrs(desc)`` / ``backward_attrs(desc)`` are the mapping other families use
(ConvolutionBiasActivationForward, batch norm Ex) to put an activation into their graphs.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import OperationGraph
from ._core.call import ALPHA, BETA, blended, run
from ._core.data import same_buffer, scalar, unread
from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.memo import Memo, call_site
from ._core.recipes import Recipe, steady
from ._core.registry import CUPY_NAMES, legacy
from .enums import ENUMS, is_valid, name_of
from .errors import check, not_supported
from .handle import get_handle
from .tensor import tensor_desc
from ._core.uids import SHARED, Uids

A = ENUMS["cudnnActivationMode_t"]
NAN = ENUMS["cudnnNanPropagation_t"]
NOT_SUPPORTED = 9  # CUDNN_STATUS_NOT_SUPPORTED

# data types the activation calls run on (INT8 activation is rounded and saturated on store)
FORWARD_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8")
BACKWARD_DTYPES = ("float32", "float64", "float16", "bfloat16")


@dataclass(frozen=True)
class Act:
    forward: str  # pointwise mode of y = act(x)
    backward: "str | None"  # pointwise mode of dx: x = dy, b = the tensor named by ``reads``
    reads: str  # 'y' or 'x'
    coef: "str | None" = None  # pointwise attribute that carries the descriptor's coef
    legacy: bool = True  # allowed in cudnnActivationForward/Backward


MODES = {
    A["CUDNN_ACTIVATION_SIGMOID"]: Act("SIGMOID_FWD", "SIGMOID_BWD_Y", "y"),
    A["CUDNN_ACTIVATION_RELU"]: Act("RELU_FWD", "RELU_BWD", "y"),
    A["CUDNN_ACTIVATION_TANH"]: Act("TANH_FWD", "TANH_BWD_Y", "y"),
    A["CUDNN_ACTIVATION_CLIPPED_RELU"]: Act("RELU_FWD", "RELU_BWD", "y", "relu_upper_clip"),
    A["CUDNN_ACTIVATION_ELU"]: Act("ELU_FWD", "ELU_BWD_Y", "y", "elu_alpha"),
    A["CUDNN_ACTIVATION_IDENTITY"]: Act("IDENTITY", None, "y", legacy=False),
    A["CUDNN_ACTIVATION_SWISH"]: Act("SWISH_FWD", "SWISH_BWD", "x"),
}


class ActivationDescriptor(Descriptor):
    kind = "cudnnActivationDescriptor_t"

    def __init__(self):
        super().__init__()
        self.mode, self.reluNanOpt, self.coef = A["CUDNN_ACTIVATION_RELU"], NAN["CUDNN_NOT_PROPAGATE_NAN"], 0.0
        self.swish_beta = 1.0

    def _settings(self):
        return (self.mode, self.reluNanOpt, self.coef, self.swish_beta)


def activation_desc(arg, argname: str = "activationDesc") -> ActivationDescriptor:
    return resolve(arg, ActivationDescriptor, argname)


def _attrs(d: ActivationDescriptor, mode: str, y_dtype: "str | None" = None) -> dict:
    act = MODES[d.mode]
    attrs = {"mode": mode, "nan_propagation": "PROPAGATE" if d.reluNanOpt == NAN["CUDNN_PROPAGATE_NAN"] else "NOT_PROPAGATE"}
    if act.forward == "RELU_FWD":
        attrs["relu_lower_clip"] = 0.0
    if act.coef:
        attrs[act.coef] = d.coef
        if act.coef == "relu_upper_clip" and y_dtype is not None:  # the clip as a saturated y holds it
            attrs[act.coef] = float(dtypes.load(dtypes.to_storage(np.array(d.coef), y_dtype), y_dtype))
    if act.forward == "SWISH_FWD":
        attrs["swish_beta"] = d.swish_beta
    return attrs


def pointwise_attrs(desc) -> dict:
    """The Pointwise op attributes of y = act(x) for an activation descriptor (object or id)."""
    d = activation_desc(desc)
    return _attrs(d, MODES[d.mode].forward)


def backward_attrs(desc, y_dtype: "str | None" = None) -> tuple:
    """(Pointwise attributes of dx = act'(.) * dy, 'x' or 'y': the forward tensor input b must be).
    ``y_dtype`` (IR name of y's data type) rounds the clipped-ReLU clip as y stores it.
    BAD_PARAM for IDENTITY, which has no legacy backward."""
    d = activation_desc(desc)
    act = MODES[d.mode]
    check(act.backward is not None, "activationDesc", f"mode {name_of('cudnnActivationMode_t', d.mode)} has no backward")
    return _attrs(d, act.backward, y_dtype if act.reads == "y" else None), act.reads


# -- descriptor functions -------------------------------------------------------------

createActivationDescriptor, destroyActivationDescriptor = pair(ActivationDescriptor, __name__)


@legacy("cudnnSetActivationDescriptor")
def setActivationDescriptor(activationDesc, mode, reluNanOpt, coef) -> None:
    """BAD_PARAM when mode or reluNanOpt is not a valid enumerant (002 §3.2.76)."""
    d = resolve(activationDesc, ActivationDescriptor, "activationDesc", need_set=False)
    check(is_valid("cudnnActivationMode_t", mode), "mode", f"{mode!r} is not a cudnnActivationMode_t")
    check(is_valid("cudnnNanPropagation_t", reluNanOpt), "reluNanOpt", f"{reluNanOpt!r} is not a cudnnNanPropagation_t")
    check(_is_number(coef), "coef", f"must be a number, got {coef!r}")
    d.mode, d.reluNanOpt, d.coef = int(mode), int(reluNanOpt), float(coef)
    d.touched()


@legacy("cudnnGetActivationDescriptor")
def getActivationDescriptor(activationDesc) -> tuple:
    """(mode, reluNanOpt, coef)"""
    d = activation_desc(activationDesc)
    return d.mode, d.reluNanOpt, d.coef


@legacy("cudnnSetActivationDescriptorSwishBeta")
def setActivationDescriptorSwishBeta(activationDesc, swish_beta) -> None:
    """The beta of SWISH mode, y = x*sigmoid(beta*x) (cuDNN 8.2; default 1.0)."""
    d = resolve(activationDesc, ActivationDescriptor, "activationDesc", need_set=False)
    check(_is_number(swish_beta), "swish_beta", f"must be a number, got {swish_beta!r}")
    d.swish_beta = float(swish_beta)
    d.changed()


@legacy("cudnnGetActivationDescriptorSwishBeta")
def getActivationDescriptorSwishBeta(activationDesc) -> float:
    """The swish beta of an activation descriptor (cuDNN 8.2+, not in 002; see §3.2.62 for the descriptor)."""
    return resolve(activationDesc, ActivationDescriptor, "activationDesc", need_set=False).swish_beta


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


# -- compute --------------------------------------------------------------------------

UIDS = Uids(after=SHARED)  # this family's graph uids (ALPHA, BETA: the output blend's)
X, Y, DY, DX = UIDS.data(4)


def _legacy_mode(d: ActivationDescriptor) -> Act:
    act = MODES[d.mode]
    check(act.legacy, "activationDesc",
          f"mode {name_of('cudnnActivationMode_t', d.mode)} only works with cudnnConvolutionBiasActivationForward")
    return act


def require_dtype(desc, argname: str, allowed: tuple) -> None:
    """NOT_SUPPORTED unless the descriptor's data type is one of ``allowed`` (IR names)."""
    if desc.dtype not in allowed:
        raise not_supported(argname, f"data type {name_of('cudnnDataType_t', desc.dataType)} is not supported "
                                     f"(supported: {', '.join(allowed)})")


def require_spatial_packed(desc, argname: str) -> None:
    """NOT_SUPPORTED above 5 dims unless packed in the spatial dims (002 §3.2.1, §3.2.96)."""
    if desc.nbDims > 5:
        dims, strides = desc.dims, desc.strides
        packed = strides[-1] == 1 and all(strides[i] == strides[i + 1] * dims[i + 1] for i in range(2, desc.nbDims - 1))
        if not packed:
            raise not_supported(argname, f"tensors over 5 dims must be packed in their spatial dims (strides {strides})")


_FWD, _BWD = Memo("cudnnActivationForward"), Memo("cudnnActivationBackward")
_FWD_SITES, _BWD_SITES = Memo("cudnnActivationForward sites"), Memo("cudnnActivationBackward sites")


@legacy("cudnnActivationForward", cupy="activationForward_v4")
def activationForward(handle, activationDesc, alpha, xDesc, x, beta, yDesc, y) -> None:
    """y = alpha*act(x) + beta*y (002 §3.2.1).  BAD_PARAM: invalid mode (IDENTITY included),
    x/y dims or data type differ, in-place (x == y) with different strides.  The descriptor
    checks run once per combination of settings (``_core.memo``)."""
    sk = (handle, activationDesc, xDesc, yDesc)
    h, d, xd, yd, m = _fwd_site(sk, handle, activationDesc, xDesc, x, yDesc, y)
    dbl, attrs, same_strides, keys = m
    if not same_strides:
        _in_place(x, y, xd, yd, "x", "y", "yDesc")
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        return OperationGraph(blended("Pointwise", {"x": xd.ir(X, "x")}, "y", yd.ir(Y, "y"), b == 0, dict(attrs)),
                              "ActivationForward")

    run(h, keys[b == 0], build, {X: (x, "x"), Y: (y, "y")}, {ALPHA: a, BETA: b})


@call_site(_FWD_SITES)
def _fwd_site(handle, activationDesc, xDesc, x, yDesc, y):
    """activationForward's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    d = activation_desc(activationDesc)
    if not MODES[d.mode].legacy:
        _legacy_mode(d)
    xd, yd = tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, "yDesc")
    mk, m = _FWD.lookup((), (d, xd, yd))
    if m is None:
        check(xd.dims == yd.dims, "yDesc", f"dims {yd.dims} must equal xDesc's {xd.dims}")
        check(xd.dataType == yd.dataType, "yDesc", "data type must equal xDesc's")
        _in_place(x, y, xd, yd, "x", "y", "yDesc")
        require_dtype(xd, "xDesc", FORWARD_DTYPES)
        require_spatial_packed(xd, "xDesc")
        require_spatial_packed(yd, "yDesc")
        attrs = _attrs(d, MODES[d.mode].forward)
        keys = tuple(("ActivationForward", d.key(), xd.key(), yd.key(), bz) for bz in (False, True))
        m = _FWD.put(mk, (xd.dtype == "float64", attrs, xd.strides == yd.strides, keys), (d.key(), xd.key(), yd.key()))
    return h, d, xd, yd, m


activationForward = steady(  # the recipe: no per-call check left when x and y have equal strides
    activationForward, _FWD_SITES, ("handle", "activationDesc", "xDesc", "yDesc"),
    lambda h, d, xd, yd, m: Recipe.blend(h, m[3], {"x": X, "y": Y}) if m[2] else None)


def _in_place(a, b, ad, bd, an: str, bn: str, argname: str) -> None:
    """BAD_PARAM when ``a`` and ``b`` are one buffer but their descriptors' strides differ."""
    check(not same_buffer(a, b) or ad.strides == bd.strides, argname,
          f"in-place ({an} == {bn}) needs equal strides ({an} {ad.strides}, {bn} {bd.strides})")


@legacy("cudnnActivationBackward", cupy="activationBackward_v4")
def activationBackward(handle, activationDesc, alpha, yDesc, y, dyDesc, dy, xDesc, x, beta, dxDesc, dx) -> None:
    """dx = alpha*act'(.)*dy + beta*dx (002 §4.1.1); see the module table for which of x, y
    each mode reads.  BAD_PARAM: invalid mode (IDENTITY included); in-place (dy == dx) with
    different strides.  NOT_SUPPORTED: dims or data types of y, dy, x, dx differ; y/dy or
    x/dx strides differ."""
    sk = (handle, activationDesc, yDesc, dyDesc, xDesc, dxDesc)
    h, yd, dyd, xd, dxd, m = _bwd_site(sk, handle, activationDesc, yDesc, dyDesc, dy, xDesc, dxDesc, dx)
    dbl, attrs, reads, same_strides, keys = m
    if not same_strides:
        _in_place(dy, dx, dyd, dxd, "dy", "dx", "dxDesc")
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)
    src_uid, src_desc, src_data = (Y, yd, y) if reads == "y" else (X, xd, x)
    unread(h, x if reads == "y" else y, "x" if reads == "y" else "y")  # the unread one: still a buffer

    def build():
        ins = {"x": dyd.ir(DY, "dy"), "b": src_desc.ir(src_uid, reads)}
        return OperationGraph(blended("Pointwise", ins, "y", dxd.ir(DX, "dx"), b == 0, dict(attrs)), "ActivationBackward")

    run(h, keys[b == 0], build, {DY: (dy, "dy"), src_uid: (src_data, reads), DX: (dx, "dx")}, {ALPHA: a, BETA: b})


@call_site(_BWD_SITES)
def _bwd_site(handle, activationDesc, yDesc, dyDesc, dy, xDesc, dxDesc, dx):
    """activationBackward's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    d = activation_desc(activationDesc)
    act = MODES[d.mode]
    if not act.legacy:
        _legacy_mode(d)
    yd, dyd = tensor_desc(yDesc, "yDesc"), tensor_desc(dyDesc, "dyDesc")
    xd, dxd = tensor_desc(xDesc, "xDesc"), tensor_desc(dxDesc, "dxDesc")
    mk, m = _BWD.lookup((), (d, yd, dyd, xd, dxd))
    if m is None:
        _in_place(dy, dx, dyd, dxd, "dy", "dx", "dxDesc")
        for name, t in (("dyDesc", dyd), ("xDesc", xd), ("dxDesc", dxd)):
            check(t.dims == yd.dims, name, f"dims {t.dims} must equal yDesc's {yd.dims}", NOT_SUPPORTED)
            check(t.dataType == yd.dataType, name, "data type must equal yDesc's", NOT_SUPPORTED)
        check(yd.strides == dyd.strides, "dyDesc", f"strides {dyd.strides} must equal yDesc's {yd.strides}", NOT_SUPPORTED)
        check(xd.strides == dxd.strides, "dxDesc", f"strides {dxd.strides} must equal xDesc's {xd.strides}", NOT_SUPPORTED)
        require_dtype(yd, "yDesc", BACKWARD_DTYPES)
        for name, t in (("yDesc", yd), ("dxDesc", dxd)):
            require_spatial_packed(t, name)
        attrs = _attrs(d, act.backward, yd.dtype if act.reads == "y" else None)
        keys = tuple(("ActivationBackward", d.key(), yd.key(), dyd.key(), xd.key(), dxd.key(), bz) for bz in (False, True))
        m = _BWD.put(mk, (yd.dtype == "float64", attrs, act.reads, dyd.strides == dxd.strides, keys),
                     (d.key(), yd.key(), dyd.key(), xd.key(), dxd.key()))
    return h, yd, dyd, xd, dxd, m


def _bwd_recipe(h, yd, dyd, xd, dxd, m):
    """activationBackward's recipe: dy, the tensor the mode reads, dx; the other one unread."""
    _dbl, _attrs, reads, same_strides, keys = m
    if not same_strides:
        return None
    src, other = (("y", Y), "x") if reads == "y" else (("x", X), "y")
    return Recipe.blend(h, keys, {"dy": DY, src[0]: src[1], "dx": DX}, unread=(other,))


activationBackward = steady(activationBackward, _BWD_SITES,
                            ("handle", "activationDesc", "yDesc", "dyDesc", "xDesc", "dxDesc"), _bwd_recipe)


# CuPy 13 spelled these activationForward_v4/activationBackward_v4; the plain names also work.
CUPY_NAMES["activationForward"] = "cudnnActivationForward"
CUPY_NAMES["activationBackward"] = "cudnnActivationBackward"
