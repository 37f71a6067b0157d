"""The legacy fused-ops API (002 §6.1.3 cudnnFusedOps_t and the label enums, Tables 23-35;
§6.2.3-§6.2.8 Create/Destroy of the const pack, variant pack and plan, §6.2.18/§6.2.15
Set/GetFusedOpsConstParamPackAttribute, §6.2.19/§6.2.16 Set/GetFusedOpsVariantParamPackAttribute,
§6.2.17 cudnnMakeFusedOpsPlan, §6.2.11 cudnnFusedOpsExecute; inventory §2.16).

Flow: a const pack (descriptors and pointer placeholders, copied at Set) -> MakeFusedOpsPlan
(validates, builds the op graph, returns the workspace size) -> a variant pack (device
pointers and host scalars) -> FusedOpsExecute.  Each fusion pattern is ONE op graph:

  0 SCALE_BIAS_ACTIVATION_CONV_BNSTATS  t = act(x*eqScale + eqBias); c = conv(t, w); y = c;
                                        ySum = sum(c), ySqSum = sum(c*c) over N and spatial
  1 SCALE_BIAS_ACTIVATION_WGRAD         t = act(x*eqScale + eqBias); dw = convBackwardFilter(t, dy)
  2 BN_FINALIZE_STATISTICS_TRAINING     mean = ySum/m, var = ySqSum/m - mean^2, invstd = 1/sqrt(var + eps);
                                        savedMean = mean, savedInvStd = invstd;
                                        runningMean = (1-f)*runningMean + f*mean,
                                        runningVar = (1-f)*runningVar + f*var*m/(m-1);
                                        eqScale = scale*invstd, eqBias = bias - mean*eqScale
                                        (m = CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT, f = EXP_AVG_FACTOR)
  3 BN_FINALIZE_STATISTICS_INFERENCE    invstd = 1/sqrt(runningVar + eps); eqScale = scale*invstd,
                                        eqBias = bias - runningMean*eqScale
  4 CONV_SCALE_BIAS_ADD_ACTIVATION      y = act(eqScale*conv(x, w) + eqBias + (zEqScale*z + zEqBias))
  5 SCALE_BIAS_ADD_ACTIVATION_GEN_BITMASK (002: ..._GENERIC)
                                        p = x*eqScale + eqBias + (zEqScale*z + zEqBias); y = act(p);
                                        bitmask = act'(p) (p > 0 for RELU, 1 for IDENTITY)
  6 DACTIVATION_FORK_DBATCHNORM         g = dy * bitmask (RELU) or dy; dz = g (the fork);
                                        dx, dScale, dBias = batch-norm backward of g (batchnorm's graph)

Every term in parentheses or behind a pointer placeholder is a NOP when its placeholder is
CUDNN_PTR_NULL (or its descriptor NULL); the activation is RELU or IDENTITY/NULL (NOT_SUPPORTED
otherwise).  Ops 0, 1, 2, 3 and 6 need CUDNN_PARAM_BN_MODE SPATIAL or SPATIAL_PERSISTENT (the
default PER_ACTIVATION is NOT_SUPPORTED, 002).  Scale/bias/statistics tensors are 1xCx1x1[x1] of
the tensor they apply to.  Shapes that disagree are BAD_PARAM at Make.  At Execute a pointer
must be NULL exactly when its placeholder is CUDNN_PTR_NULL and be element- or 16-byte aligned
as promised (BAD_PARAM), the workspace size must cover the plan's, epsilon >= 0 and the
accumulation count >= 1.

The activation bitmask (ops 5 -> 6) is opaque in cuDNN; here it holds one byte per element of
y (0 or 1, y's logical order, packed), so CUDNN_PARAM_ACTIVATION_BITMASK_DESC must describe at
least that many bytes (NOT_SUPPORTED otherwise: cuDNN's own bit-packed size is 8x smaller).

Python mapping of Set/Get*ParamPackAttribute (the value's kind follows the label):
  const  *_DESC          a descriptor (tensor, filter, convolution, activation; copied) or None
         *_PLACEHOLDER   a cudnnFusedOpsPointerPlaceHolder_t int
         BN_MODE         a cudnnBatchNormMode_t int
  variant CUDNN_PTR_*    a data argument (NumPy/CuPy array, pointer int) or None
         SIZE_T / INT64  an int;  DOUBLE a float (or a host pointer to a double)
getFusedOpsConstParamPackAttribute(pack, label, param=None) -> (value, isNULL): for a descriptor
label the stored copy is written into ``param`` (a descriptor of that kind) or returned as a
new descriptor.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides, scalar as scalar_tensor, virtual
from . import batchnorm as bn
from .convolution import api as cnn
from ._core.call import ALPHA, compute_dtype, plan_for, run
from ._core.uids import Uids, prior_uid
from ._core.data import POINTER_MIN, address, raw_address, scalar
from ._core.descriptor import Descriptor, resolve
from ._core.registry import legacy
from .activation import ActivationDescriptor
from .enums import ENUMS, is_valid, name_of
from .errors import check, not_supported
from .handle import get_handle
from .tensor import FilterDescriptor, TensorDescriptor

FUSED = ENUMS["cudnnFusedOps_t"]
CLABEL = ENUMS["cudnnFusedOpsConstParamLabel_t"]
VLABEL = ENUMS["cudnnFusedOpsVariantParamLabel_t"]
PLACEHOLDER = ENUMS["cudnnFusedOpsPointerPlaceHolder_t"]
PTR_NULL, PTR_ELEM_ALIGNED, PTR_16B_ALIGNED = (PLACEHOLDER["CUDNN_PTR_NULL"], PLACEHOLDER["CUDNN_PTR_ELEM_ALIGNED"],
                                               PLACEHOLDER["CUDNN_PTR_16B_ALIGNED"])
BNM = ENUMS["cudnnBatchNormMode_t"]
ACT = ENUMS["cudnnActivationMode_t"]
SPATIAL_MODES = (BNM["CUDNN_BATCHNORM_SPATIAL"], BNM["CUDNN_BATCHNORM_SPATIAL_PERSISTENT"])

# -- label kinds ---------------------------------------------------------------------

DESC_CLASS = {"CUDNN_PARAM_WDESC": FilterDescriptor, "CUDNN_PARAM_DWDESC": FilterDescriptor,
              "CUDNN_PARAM_CONV_DESC": cnn.ConvolutionDescriptor, "CUDNN_PARAM_ACTIVATION_DESC": ActivationDescriptor}


def const_kind(label: int) -> str:
    """'desc', 'placeholder' or 'bn_mode' for a cudnnFusedOpsConstParamLabel_t."""
    name = name_of("cudnnFusedOpsConstParamLabel_t", label)
    if name.endswith("_PLACEHOLDER"):
        return "placeholder"
    return "bn_mode" if name == "CUDNN_PARAM_BN_MODE" else "desc"


def desc_class(label: int):
    return DESC_CLASS.get(name_of("cudnnFusedOpsConstParamLabel_t", label), TensorDescriptor)


def variant_kind(label: int) -> str:
    """'ptr', 'size_t', 'int64' or 'double' for a cudnnFusedOpsVariantParamLabel_t."""
    name = name_of("cudnnFusedOpsVariantParamLabel_t", label)
    for kind in ("SIZE_T", "INT64", "DOUBLE"):
        if name.startswith(f"CUDNN_SCALAR_{kind}_"):
            return kind.lower() if kind != "SIZE_T" else "size_t"
    return "ptr"


# -- the tensors each pattern reads or writes ----------------------------------------

@dataclass(frozen=True)
class Slot:
    desc: str  # const label of its descriptor
    placeholder: str  # const label of its pointer placeholder
    ptr: str  # variant label of its pointer
    io: str = "in"  # 'in', 'out' or 'inout'


SLOTS = {
    "x": Slot("XDESC", "XDATA_PLACEHOLDER", "XDATA"),
    "eqscale": Slot("BN_EQSCALEBIAS_DESC", "BN_EQSCALE_PLACEHOLDER", "BN_EQSCALE"),
    "eqbias": Slot("BN_EQSCALEBIAS_DESC", "BN_EQBIAS_PLACEHOLDER", "BN_EQBIAS"),
    "w": Slot("WDESC", "WDATA_PLACEHOLDER", "WDATA"),
    "dw": Slot("DWDESC", "DWDATA_PLACEHOLDER", "DWDATA", "out"),
    "y": Slot("YDESC", "YDATA_PLACEHOLDER", "YDATA", "out"),
    "dy": Slot("DYDESC", "DYDATA_PLACEHOLDER", "DYDATA"),
    "ysum": Slot("YSTATS_DESC", "YSUM_PLACEHOLDER", "YSUM", "out"),
    "ysqsum": Slot("YSTATS_DESC", "YSQSUM_PLACEHOLDER", "YSQSUM", "out"),
    "scale": Slot("BN_SCALEBIAS_MEANVAR_DESC", "BN_SCALE_PLACEHOLDER", "BN_SCALE"),
    "bias": Slot("BN_SCALEBIAS_MEANVAR_DESC", "BN_BIAS_PLACEHOLDER", "BN_BIAS"),
    "saved_mean": Slot("BN_SCALEBIAS_MEANVAR_DESC", "BN_SAVED_MEAN_PLACEHOLDER", "BN_SAVED_MEAN", "out"),
    "saved_invstd": Slot("BN_SCALEBIAS_MEANVAR_DESC", "BN_SAVED_INVSTD_PLACEHOLDER", "BN_SAVED_INVSTD", "out"),
    "running_mean": Slot("BN_SCALEBIAS_MEANVAR_DESC", "BN_RUNNING_MEAN_PLACEHOLDER", "BN_RUNNING_MEAN", "inout"),
    "running_var": Slot("BN_SCALEBIAS_MEANVAR_DESC", "BN_RUNNING_VAR_PLACEHOLDER", "BN_RUNNING_VAR", "inout"),
    "z": Slot("ZDESC", "ZDATA_PLACEHOLDER", "ZDATA"),
    "zscale": Slot("BN_Z_EQSCALEBIAS_DESC", "BN_Z_EQSCALE_PLACEHOLDER", "BN_Z_EQSCALE"),
    "zbias": Slot("BN_Z_EQSCALEBIAS_DESC", "BN_Z_EQBIAS_PLACEHOLDER", "BN_Z_EQBIAS"),
    "bitmask": Slot("ACTIVATION_BITMASK_DESC", "ACTIVATION_BITMASK_PLACEHOLDER", "ACTIVATION_BITMASK", "out"),
    "dx": Slot("DXDESC", "DXDATA_PLACEHOLDER", "DXDATA", "out"),
    "dz": Slot("DZDESC", "DZDATA_PLACEHOLDER", "DZDATA", "out"),
    "dscale": Slot("BN_SCALEBIAS_MEANVAR_DESC", "BN_DSCALE_PLACEHOLDER", "BN_DSCALE", "out"),
    "dbias": Slot("BN_SCALEBIAS_MEANVAR_DESC", "BN_DBIAS_PLACEHOLDER", "BN_DBIAS", "out"),
}
SLOT_UID = {name: i + 1 for i, name in enumerate(SLOTS)}
# op 6 runs batchnorm's backward graph, whose uids are batchnorm's; this module's come after them
UIDS = Uids(after=bn.UIDS)
BN_UID = {"x": bn.X, "dy": bn.DY, "bitmask": bn.Y, "dz": bn.DZ, "dx": bn.DX, "scale": bn.SCALE,
          "saved_mean": bn.MEAN, "saved_invstd": bn.VAR, "dscale": bn.DSCALE, "dbias": bn.DBIAS,
          "bias": UIDS.data()}  # bias is not read by the backward: a uid of no tensor of its graph
EPS, INV_M, KEEP, FACTOR, FACTOR_UNBIASED, ONE, ZERO = UIDS.scalar(7)  # by-value scalars


@dataclass(frozen=True)
class Spec:
    required: tuple
    optional: tuple
    conv: "str | None" = None  # 'FWD' | 'BWD_FILTER'
    bn_mode: bool = False  # CUDNN_PARAM_BN_MODE must be a per-channel mode
    activation: bool = False
    scalars: tuple = ()  # variant scalar labels read at Execute


SPECS = {
    FUSED["CUDNN_FUSED_SCALE_BIAS_ACTIVATION_CONV_BNSTATS"]: Spec(
        ("x", "w", "y"), ("eqscale", "eqbias", "ysum", "ysqsum"), "FWD", True, True),
    FUSED["CUDNN_FUSED_SCALE_BIAS_ACTIVATION_WGRAD"]: Spec(
        ("x", "dy", "dw"), ("eqscale", "eqbias"), "BWD_FILTER", True, True),
    FUSED["CUDNN_FUSED_BN_FINALIZE_STATISTICS_TRAINING"]: Spec(
        ("ysum", "ysqsum"), ("scale", "bias", "saved_mean", "saved_invstd", "running_mean", "running_var", "eqscale",
                             "eqbias"), None, True, False,
        ("CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT", "CUDNN_SCALAR_DOUBLE_BN_EXP_AVG_FACTOR",
         "CUDNN_SCALAR_DOUBLE_BN_EPSILON")),
    FUSED["CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE"]: Spec(
        ("scale", "bias", "running_mean", "running_var"), ("eqscale", "eqbias"), None, True, False,
        ("CUDNN_SCALAR_DOUBLE_BN_EPSILON",)),
    FUSED["CUDNN_FUSED_CONV_SCALE_BIAS_ADD_ACTIVATION"]: Spec(
        ("x", "w", "y"), ("eqscale", "eqbias", "z", "zscale", "zbias"), "FWD", False, True),
    FUSED["CUDNN_FUSED_SCALE_BIAS_ADD_ACTIVATION_GEN_BITMASK"]: Spec(
        ("x", "y"), ("eqscale", "eqbias", "z", "zscale", "zbias", "bitmask"), None, False, True),
    FUSED["CUDNN_FUSED_DACTIVATION_FORK_DBATCHNORM"]: Spec(
        ("x", "dy", "scale", "dx", "dscale", "dbias"), ("bias", "saved_mean", "saved_invstd", "bitmask", "dz"),
        None, True, True, ("CUDNN_SCALAR_DOUBLE_BN_EPSILON",)),
}
# inputs/outputs of op 3 (running statistics are read only there)
READ_ONLY_RUNNING = FUSED["CUDNN_FUSED_BN_FINALIZE_STATISTICS_INFERENCE"]


# -- descriptor objects --------------------------------------------------------------

def _copy(obj):
    """A private copy of a descriptor (Set copies the value, 002 §6.2.18)."""
    new = type(obj).__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new._key = None
    return new


def _check_ops(ops, argname="ops", status=3) -> int:
    check(isinstance(ops, numbers.Integral) and not isinstance(ops, bool), argname, f"must be an int, got {ops!r}")
    check(is_valid("cudnnFusedOps_t", ops), argname, f"{ops!r} is not a supported cudnnFusedOps_t", status)
    return int(ops)


class FusedOpsConstParamPack(Descriptor):
    """cudnnFusedOpsConstParamPack_t: label -> descriptor copy, placeholder or BN mode."""

    kind = "cudnnFusedOpsConstParamPack_t"

    def __init__(self, ops: int):
        super().__init__()
        self.ops = ops
        self.values = {}  # label -> value (descriptor copies, ints); absent: the default
        self.touched()

    def get(self, label: int):
        kind = const_kind(label)
        default = {"desc": None, "placeholder": PTR_NULL, "bn_mode": BNM["CUDNN_BATCHNORM_PER_ACTIVATION"]}[kind]
        return self.values.get(label, default)

    def destroy(self):
        for v in self.values.values():
            if isinstance(v, Descriptor):
                v.destroy()
        super().destroy()


class FusedOpsVariantParamPack(Descriptor):
    """cudnnFusedOpsVariantParamPack_t: label -> data argument or host scalar."""

    kind = "cudnnFusedOpsVariantParamPack_t"

    def __init__(self, ops: int):
        super().__init__()
        self.ops = ops
        self.values = {}
        self.touched()

    def get(self, label: int):
        return self.values.get(label, {"ptr": None, "size_t": 0, "int64": 0, "double": 0.0}[variant_kind(label)])


class FusedOpsPlan(Descriptor):
    """cudnnFusedOpsPlan_t: the pattern, and after MakeFusedOpsPlan the validated problem."""

    kind = "cudnnFusedOpsPlan_t"

    def __init__(self, ops: int):
        super().__init__()
        self.ops = ops
        self.problem = None
        self.touched()


@legacy("cudnnCreateFusedOpsConstParamPack")
def createFusedOpsConstParamPack(ops) -> FusedOpsConstParamPack:
    """NOT_SUPPORTED when ``ops`` is not one of the 7 patterns (002 §6.2.3)."""
    return FusedOpsConstParamPack(_check_ops(ops, status=9))


@legacy("cudnnDestroyFusedOpsConstParamPack")
def destroyFusedOpsConstParamPack(constPack) -> None:
    """Free a fused-ops constant parameter pack (002 §6.2.6)."""
    resolve(constPack, FusedOpsConstParamPack, "constPack").destroy()


@legacy("cudnnCreateFusedOpsVariantParamPack")
def createFusedOpsVariantParamPack(ops) -> FusedOpsVariantParamPack:
    """Create a fused-ops variant (pointer) parameter pack (002 §6.2.5)."""
    return FusedOpsVariantParamPack(_check_ops(ops))


@legacy("cudnnDestroyFusedOpsVariantParamPack")
def destroyFusedOpsVariantParamPack(varPack) -> None:
    """Free a fused-ops variant parameter pack (002 §6.2.8)."""
    resolve(varPack, FusedOpsVariantParamPack, "varPack").destroy()


@legacy("cudnnCreateFusedOpsPlan")
def createFusedOpsPlan(ops) -> FusedOpsPlan:
    """Create a fused-ops plan for a cudnnFusedOps_t sequence (002 §6.2.4)."""
    return FusedOpsPlan(_check_ops(ops))


@legacy("cudnnDestroyFusedOpsPlan")
def destroyFusedOpsPlan(plan) -> None:
    """A NULL plan is a no-op (002 §6.2.7)."""
    if plan is None or (isinstance(plan, int) and int(plan) == 0):
        return
    resolve(plan, FusedOpsPlan, "plan").destroy()


def _int_value(param, argname: str) -> int:
    """An enum value: a Python int (always a value), a one-element NumPy array, or a ctypes pointer
    to a C int (docs/conventions.md "Scalars")."""
    if isinstance(param, np.ndarray) and param.size == 1 and param.dtype.kind in "iu":
        return int(param.reshape(-1)[0])
    addr = raw_address(param)
    if addr is not None:
        check(addr >= POINTER_MIN, argname, "is NULL or not a host pointer")
        import ctypes
        return int(ctypes.c_int.from_address(addr).value)
    check(isinstance(param, numbers.Integral) and not isinstance(param, (bool, Descriptor)), argname,
          f"must be an int or a ctypes pointer to one, got {param!r}")
    return int(param)


@legacy("cudnnSetFusedOpsConstParamPackAttribute")
def setFusedOpsConstParamPackAttribute(constPack, paramLabel, param) -> None:
    """Record ``param`` for ``paramLabel`` (its kind in the module docstring); descriptors are
    copied, None records NULL.  BAD_PARAM: invalid label, a value of the wrong kind."""
    p = resolve(constPack, FusedOpsConstParamPack, "constPack")
    check(is_valid("cudnnFusedOpsConstParamLabel_t", paramLabel), "paramLabel",
          f"{paramLabel!r} is not a cudnnFusedOpsConstParamLabel_t")
    label, kind = int(paramLabel), const_kind(paramLabel)
    name = name_of("cudnnFusedOpsConstParamLabel_t", label)
    if kind == "desc":
        value = None if param is None or (isinstance(param, int) and int(param) == 0) else \
            _copy(resolve(param, desc_class(label), name))
    else:
        value = _int_value(param, name)
        enum = "cudnnFusedOpsPointerPlaceHolder_t" if kind == "placeholder" else "cudnnBatchNormMode_t"
        check(is_valid(enum, value), name, f"{value!r} is not a {enum}")
    old = p.values.get(label)
    if isinstance(old, Descriptor):
        old.destroy()
    p.values[label] = value
    p.touched()


@legacy("cudnnGetFusedOpsConstParamPackAttribute")
def getFusedOpsConstParamPackAttribute(constPack, paramLabel, param=None) -> tuple:
    """(value, isNULL); see the module docstring for descriptor labels."""
    p = resolve(constPack, FusedOpsConstParamPack, "constPack")
    check(is_valid("cudnnFusedOpsConstParamLabel_t", paramLabel), "paramLabel",
          f"{paramLabel!r} is not a cudnnFusedOpsConstParamLabel_t")
    value = p.get(int(paramLabel))
    if const_kind(paramLabel) != "desc":
        return value, 0
    if value is None:
        return param, 1
    if param is None:
        return _copy(value), 0
    out = resolve(param, desc_class(int(paramLabel)), "param", need_set=False)
    out.__dict__.update({k: v for k, v in value.__dict__.items()})
    out._key = None
    return out, 0


@legacy("cudnnSetFusedOpsVariantParamPackAttribute")
def setFusedOpsVariantParamPackAttribute(varPack, paramLabel, ptr) -> None:
    """Record a pointer or a scalar (module docstring).  BAD_PARAM: invalid label, a scalar of
    the wrong kind or sign."""
    v = resolve(varPack, FusedOpsVariantParamPack, "varPack")
    check(is_valid("cudnnFusedOpsVariantParamLabel_t", paramLabel), "paramLabel",
          f"{paramLabel!r} is not a cudnnFusedOpsVariantParamLabel_t")
    label, kind = int(paramLabel), variant_kind(paramLabel)
    name = name_of("cudnnFusedOpsVariantParamLabel_t", label)
    if kind == "ptr":
        value = None if ptr is None or (isinstance(ptr, int) and not isinstance(ptr, bool) and ptr == 0) else ptr
    elif kind == "double":
        value = scalar(ptr, name, double=True)
    else:
        if isinstance(ptr, np.ndarray) and ptr.size == 1:
            ptr = ptr.reshape(-1)[0].item()
        check(isinstance(ptr, numbers.Integral) and not isinstance(ptr, bool), name, f"must be an int, got {ptr!r}")
        check(kind != "size_t" or ptr >= 0, name, f"must not be negative, got {ptr}")
        value = int(ptr)
    v.values[label] = value
    v.touched()


@legacy("cudnnGetFusedOpsVariantParamPackAttribute")
def getFusedOpsVariantParamPackAttribute(varPack, paramLabel):
    """The pointer or scalar recorded for ``paramLabel`` (None / 0 by default)."""
    v = resolve(varPack, FusedOpsVariantParamPack, "varPack")
    check(is_valid("cudnnFusedOpsVariantParamLabel_t", paramLabel), "paramLabel",
          f"{paramLabel!r} is not a cudnnFusedOpsVariantParamLabel_t")
    return v.get(int(paramLabel))


# -- the validated problem -----------------------------------------------------------

def _clabel(suffix: str) -> int:
    return CLABEL["CUDNN_PARAM_" + suffix]


def _vlabel(suffix: str) -> int:
    return VLABEL["CUDNN_PTR_" + suffix]


class _Bitmask:
    """The activation bitmask as a graph tensor: one uint8 per element of ``dims``, packed."""

    def __init__(self, dims):
        self.dims = tuple(dims)

    def ir(self, uid, name="bitmask"):
        return Tensor(uid, self.dims, packed_strides(self.dims), "uint8", name=name)


class Problem:
    """What MakeFusedOpsPlan validated: the active slots' descriptors, the activation, the conv."""

    def __init__(self, ops: int, pack: FusedOpsConstParamPack):
        self.ops, self.spec = ops, SPECS[ops]
        self.placeholders = {s: pack.get(_clabel(SLOTS[s].placeholder)) for s in self.spec.required + self.spec.optional}
        self.descs, self.relu, self.act, self.conv = {}, False, None, None
        self._validate(pack)

    # ---- validation ----
    def _desc(self, pack, slot: str):
        return pack.get(_clabel(SLOTS[slot].desc))

    def _validate(self, pack):
        spec = self.spec
        for s in spec.required:
            check(self.placeholders[s] != PTR_NULL, "constPack",
                  f"CUDNN_PARAM_{SLOTS[s].placeholder} must not be CUDNN_PTR_NULL: this pattern needs {s}")
            check(self._desc(pack, s) is not None, "constPack", f"CUDNN_PARAM_{SLOTS[s].desc} is NULL: this pattern needs it")
        for s in spec.required + spec.optional:
            d = self._desc(pack, s)
            if self.placeholders[s] != PTR_NULL and d is not None:
                self.descs[s] = d
        if spec.bn_mode:
            mode = pack.get(_clabel("BN_MODE"))
            if mode not in SPATIAL_MODES:
                raise not_supported("CUDNN_PARAM_BN_MODE", f"must be CUDNN_BATCHNORM_SPATIAL or SPATIAL_PERSISTENT, got "
                                                           f"{name_of('cudnnBatchNormMode_t', mode)}")
        if spec.activation:
            act = pack.get(_clabel("ACTIVATION_DESC"))
            if act is not None and act.mode not in (ACT["CUDNN_ACTIVATION_RELU"], ACT["CUDNN_ACTIVATION_IDENTITY"]):
                raise not_supported("CUDNN_PARAM_ACTIVATION_DESC", f"mode must be RELU or IDENTITY, got "
                                                                   f"{name_of('cudnnActivationMode_t', act.mode)}")
            self.relu = act is not None and act.mode == ACT["CUDNN_ACTIVATION_RELU"]
            self.act = act
        if spec.conv:
            cd = pack.get(_clabel("CONV_DESC"))
            check(cd is not None, "CUDNN_PARAM_CONV_DESC", "is NULL: this pattern convolves")
            dr = cnn.FWD if spec.conv == "FWD" else cnn.BWD_FILTER
            args = (self.descs["x"], self.descs["w"], self.descs["y"]) if spec.conv == "FWD" else \
                (self.descs["x"], self.descs["dy"], self.descs["dw"])
            self.conv = cnn._conv_call(dr, *args, cd)
        getattr(self, f"_check_{self.ops}")()
        for s, d in self.descs.items():
            if s != "bitmask" and d.dtype not in ("float32", "float64", "float16", "bfloat16"):
                raise not_supported(f"CUDNN_PARAM_{SLOTS[s].desc}", f"data type {d.dtype} is not supported")

    def _like(self, slot: str, ref: str):
        d, r = self.descs.get(slot), self.descs.get(ref)
        if d is not None and r is not None:
            check(d.dims == r.dims, f"CUDNN_PARAM_{SLOTS[slot].desc}",
                  f"dims {d.dims} must equal CUDNN_PARAM_{SLOTS[ref].desc}'s {r.dims}")
            check(d.dataType == r.dataType, f"CUDNN_PARAM_{SLOTS[slot].desc}",
                  f"data type must equal CUDNN_PARAM_{SLOTS[ref].desc}'s")

    def _per_channel(self, slots, channels: int, nb: int):
        want = (1, channels) + (1,) * (nb - 2)
        for s in slots:
            d = self.descs.get(s)
            if d is not None:
                check(d.dims == want, f"CUDNN_PARAM_{SLOTS[s].desc}", f"dims {d.dims} must be {want} (per channel)")

    def _needs(self, slot: str, *deps):
        if slot in self.descs:
            for dep in deps:
                check(dep in self.descs, "constPack", f"{slot} needs {dep} (its placeholder and descriptor)")

    def _check_0(self):
        x, y = self.descs["x"], self.descs["y"]
        self._per_channel(("eqscale", "eqbias"), x.dims[1], x.nbDims)
        self._per_channel(("ysum", "ysqsum"), y.dims[1], y.nbDims)

    def _check_1(self):
        x = self.descs["x"]
        self._per_channel(("eqscale", "eqbias"), x.dims[1], x.nbDims)

    def _check_2(self):
        ys = self.descs["ysum"]
        check(ys.nbDims in (4, 5) and ys.dims[0] == 1 and all(d == 1 for d in ys.dims[2:]), "CUDNN_PARAM_YSTATS_DESC",
              f"must be 1xCx1x1[x1], got {ys.dims}")
        self._per_channel(("scale", "bias", "saved_mean", "saved_invstd", "running_mean", "running_var", "eqscale",
                           "eqbias"), ys.dims[1], ys.nbDims)
        self._needs("eqscale", "scale")
        self._needs("eqbias", "scale", "bias")

    def _check_3(self):
        s = self.descs["scale"]
        check(s.nbDims in (4, 5) and s.dims[0] == 1 and all(d == 1 for d in s.dims[2:]),
              "CUDNN_PARAM_BN_SCALEBIAS_MEANVAR_DESC", f"must be 1xCx1x1[x1], got {s.dims}")
        self._per_channel(("eqscale", "eqbias"), s.dims[1], s.nbDims)

    def _z_terms(self, ref: str):
        self._like("z", ref)
        self._needs("zscale", "z")
        self._needs("zbias", "z")
        r = self.descs[ref]
        self._per_channel(("zscale", "zbias"), r.dims[1], r.nbDims)

    def _check_4(self):
        y = self.descs["y"]
        self._per_channel(("eqscale", "eqbias"), y.dims[1], y.nbDims)
        self._z_terms("y")

    def _check_5(self):
        x, y = self.descs["x"], self.descs["y"]
        check(x.nbDims in (4, 5), "CUDNN_PARAM_XDESC", f"must be 4-d or 5-d, got {x.nbDims} dims")
        self._like("y", "x")
        self._per_channel(("eqscale", "eqbias"), x.dims[1], x.nbDims)
        self._z_terms("x")
        self._check_bitmask(y.dims)

    def _check_6(self):
        x = self.descs["x"]
        check(x.nbDims in (4, 5), "CUDNN_PARAM_XDESC", f"must be 4-d or 5-d, got {x.nbDims} dims")
        for s in ("dy", "dx", "dz"):
            self._like(s, "x")
        self._per_channel(("scale", "bias", "saved_mean", "saved_invstd", "dscale", "dbias"), x.dims[1], x.nbDims)
        check(("saved_mean" in self.descs) == ("saved_invstd" in self.descs), "constPack",
              "saved mean and saved inverse std go together (both placeholders set or both CUDNN_PTR_NULL)")
        if self.relu:
            check("bitmask" in self.descs, "CUDNN_PARAM_ACTIVATION_BITMASK_DESC",
                  "the RELU backward reads the bitmask written by CUDNN_FUSED_SCALE_BIAS_ADD_ACTIVATION_GEN_BITMASK")
        self._check_bitmask(x.dims)
        pd = self.descs["scale"]
        if pd.dataType != bn.param_type(x):
            raise not_supported("CUDNN_PARAM_BN_SCALEBIAS_MEANVAR_DESC",
                                f"data type must be {name_of('cudnnDataType_t', bn.param_type(x))} for "
                                f"{name_of('cudnnDataType_t', x.dataType)} data")

    def _check_bitmask(self, dims):
        d = self.descs.get("bitmask")
        if d is not None:
            need = math.prod(dims)
            have = (1 + sum((n - 1) * s for n, s in zip(d.dims, d.strides))) * dtypes.itemsize(d.dtype)
            if have < need:
                raise not_supported("CUDNN_PARAM_ACTIVATION_BITMASK_DESC",
                                    f"describes {have} bytes; this library keeps one byte per element of y ({need})")
            self.bitmask = _Bitmask(dims)

    # ---- graph ----
    def uid(self, slot: str) -> int:
        return BN_UID[slot] if self.ops == FUSED["CUDNN_FUSED_DACTIVATION_FORK_DBATCHNORM"] else SLOT_UID[slot]

    def tensor(self, slot: str) -> Tensor:
        if slot == "bitmask":
            return self.bitmask.ir(self.uid(slot))
        return self.descs[slot].ir(self.uid(slot), slot)

    def key(self) -> tuple:
        return ("FusedOps", self.ops, self.relu, self.act.key() if self.act is not None else None,
                self.conv.cd.key() if self.conv is not None else None,
                tuple(sorted((s, d.key()) for s, d in self.descs.items())))

    def build(self) -> OperationGraph:
        g = _Graph()
        getattr(self, f"_build_{self.ops}")(g)
        return OperationGraph(g.ops, name_of("cudnnFusedOps_t", self.ops))

    def _scale_bias_act(self, g, src, ct):
        """src [*eqscale] [+eqbias] [relu]"""
        t = src
        if "eqscale" in self.descs:
            t = g.pw("MUL", t, self.tensor("eqscale"), dtype=ct)
        if "eqbias" in self.descs:
            t = g.pw("ADD", t, self.tensor("eqbias"), dtype=ct)
        return t

    def _relu(self, g, t, ct):
        return g.pw("RELU_FWD", t, dtype=ct, relu_lower_clip=0.0, nan_propagation="NOT_PROPAGATE") if self.relu else t

    def _z_add(self, g, t, ct):
        if "z" not in self.descs:
            return t
        z = self.tensor("z")
        if "zscale" in self.descs:
            z = g.pw("MUL", z, self.tensor("zscale"), dtype=ct)
        if "zbias" in self.descs:
            z = g.pw("ADD", z, self.tensor("zbias"), dtype=ct)
        return g.pw("ADD", t, z, dtype=ct)

    def _build_0(self, g):
        x, ct, cd = self.tensor("x"), compute_dtype(self.descs["x"].dtype), self.conv.cd
        t = self._relu(g, self._scale_bias_act(g, x, ct), ct)
        y = self.tensor("y")
        c = virtual(g.next(), y.dims, cd.compute, "conv")
        g.ops.append(Operation("ConvolutionForward", {"x": t, "w": self.tensor("w")}, {"y": c}, cd.attrs(None, cd.mathType)))
        g.pw("IDENTITY", c, out=y)
        if "ysum" in self.descs:
            g.reduce(c, self.tensor("ysum"))
        if "ysqsum" in self.descs:
            g.reduce(g.pw("MUL", c, c, dtype=cd.compute), self.tensor("ysqsum"))

    def _build_1(self, g):
        x, ct, cd = self.tensor("x"), compute_dtype(self.descs["x"].dtype), self.conv.cd
        t = self._relu(g, self._scale_bias_act(g, x, ct), ct)
        dw = self.tensor("dw")
        c = virtual(g.next(), dw.dims, cd.compute, "wgrad")
        g.ops.append(Operation("ConvolutionBackwardFilter", {"x": t, "dy": self.tensor("dy")}, {"dw": c},
                               cd.attrs(None, cd.mathType)))
        g.pw("IDENTITY", c, out=dw)

    def _build_2(self, g):
        d, pt = self.descs, compute_dtype(self.descs["ysum"].dtype)
        s = lambda uid, name: scalar_tensor(uid, "float64", name)  # noqa: E731
        vals = {}

        def mean():
            if "mean" not in vals:
                vals["mean"] = g.pw("IDENTITY", self.tensor("ysum"), alpha1=s(INV_M, "1/m"), dtype=pt)
            return vals["mean"]

        def var():
            if "var" not in vals:
                ex2 = g.pw("IDENTITY", self.tensor("ysqsum"), alpha1=s(INV_M, "1/m"), dtype=pt)
                vals["var"] = g.pw("SUB", ex2, g.pw("MUL", mean(), mean(), dtype=pt), dtype=pt)
            return vals["var"]

        def invstd():
            if "invstd" not in vals:
                vals["invstd"] = g.pw("RSQRT", g.pw("ADD", var(), s(EPS, "epsilon"), dtype=pt), dtype=pt)
            return vals["invstd"]

        def eqscale():
            if "eqscale" not in vals:
                vals["eqscale"] = g.pw("MUL", self.tensor("scale"), invstd(), dtype=pt)
            return vals["eqscale"]

        outs = []  # (slot, value producer) in a fixed order, each read once by an IDENTITY
        if "saved_mean" in d:
            outs.append(("saved_mean", mean))
        if "saved_invstd" in d:
            outs.append(("saved_invstd", invstd))
        if "eqscale" in d:
            outs.append(("eqscale", eqscale))
        if "eqbias" in d:
            outs.append(("eqbias", lambda: g.pw("SUB", self.tensor("bias"), g.pw("MUL", mean(), eqscale(), dtype=pt),
                                                dtype=pt)))
        for slot, fn in outs:
            g.pw("IDENTITY", fn(), out=self.tensor(slot))
        for slot, value, factor in (("running_mean", mean, FACTOR), ("running_var", var, FACTOR_UNBIASED)):
            if slot in d:
                cur = self.tensor(slot)
                prior = Tensor(prior_uid(cur.uid), cur.dims, cur.strides, cur.dtype, name=slot + "_prior")
                g.pw("ADD", prior, value(), out=cur, alpha1=s(KEEP, "1-f"), alpha2=s(factor, "f"))

    def _build_3(self, g):
        d, pt = self.descs, compute_dtype(self.descs["scale"].dtype)
        if "eqscale" not in d and "eqbias" not in d:
            return
        eps = scalar_tensor(EPS, "float64", "epsilon")
        invstd = g.pw("RSQRT", g.pw("ADD", self.tensor("running_var"), eps, dtype=pt), dtype=pt)
        es = g.pw("MUL", self.tensor("scale"), invstd, dtype=pt, out=self.tensor("eqscale") if "eqscale" in d else None)
        if "eqbias" in d:
            g.pw("SUB", self.tensor("bias"), g.pw("MUL", self.tensor("running_mean"), es, dtype=pt),
                 out=self.tensor("eqbias"))

    def _build_4(self, g):
        cd = self.conv.cd
        y = self.tensor("y")
        ct = compute_dtype(y.dtype)
        c = virtual(g.next(), y.dims, cd.compute, "conv")
        g.ops.append(Operation("ConvolutionForward", {"x": self.tensor("x"), "w": self.tensor("w")}, {"y": c},
                               cd.attrs(None, cd.mathType)))
        t = self._relu(g, self._z_add(g, self._scale_bias_act(g, c, ct), ct), ct)
        g.pw("IDENTITY", t, out=y)

    def _build_5(self, g):
        ct = compute_dtype(self.descs["x"].dtype)
        pre = self._z_add(g, self._scale_bias_act(g, self.tensor("x"), ct), ct)
        if "bitmask" in self.descs:
            one = scalar_tensor(ONE, "float64", "one")
            if self.relu:
                g.pw("CMP_GT", pre, scalar_tensor(ZERO, "float64", "zero"), out=self.tensor("bitmask"))
            else:
                g.pw("IDENTITY", one, out=self.tensor("bitmask"))
        g.pw("IDENTITY", self._relu(g, pre, ct), out=self.tensor("y"))

    def _build_6(self, g):
        d = self.descs
        mode = BNM["CUDNN_BATCHNORM_SPATIAL"]
        act_bwd = {"mode": "RELU_BWD", "relu_lower_clip": 0.0} if self.relu else None
        graph = bn._backward_graph(mode, d["x"], d["dy"], d["dx"], d["scale"], "saved_mean" in d, True, True,
                                   self.bitmask if self.relu else None, d.get("dz"), act_bwd,
                                   "DACTIVATION_FORK_DBATCHNORM")
        g.ops.extend(graph.ops)


class _Graph:
    """Collects ops; ``pw`` adds a Pointwise op writing a new virtual tensor (or ``out``)."""

    def __init__(self):
        self.ops, self._uid = [], 8100

    def next(self) -> int:
        self._uid += 1
        return self._uid

    def pw(self, mode, x, b=None, out=None, alpha1=None, alpha2=None, dtype="float32", **attrs):
        if out is None:
            dims = x.dims if b is None or b.is_by_value else tuple(max(p, q) for p, q in zip(x.dims, b.dims))
            if x.is_by_value and b is None:
                raise ValueError("a by-value source needs an output tensor")
            out = virtual(self.next(), dims, dtype, mode.lower())
        ins = {"x": x}
        for role, t in (("b", b), ("alpha1", alpha1), ("alpha2", alpha2)):
            if t is not None:
                ins[role] = t
        self.ops.append(Operation("Pointwise", ins, {"y": out}, {"mode": mode, **attrs}))
        return out

    def reduce(self, x, out):
        self.ops.append(Operation("Reduction", {"x": x}, {"y": out}, {"mode": "ADD"}))


# -- plan and execution --------------------------------------------------------------

@legacy("cudnnMakeFusedOpsPlan")
def makeFusedOpsPlan(handle, plan, constPack) -> int:
    """Validate the const pack for the plan's pattern, build its op graph and return the workspace
    size in bytes (002 §6.2.17).  BAD_PARAM: NULL arguments, pack and plan of different patterns,
    missing or inconsistent descriptors; NOT_SUPPORTED: configurations the pattern does not run."""
    h = get_handle(handle)
    pl = resolve(plan, FusedOpsPlan, "plan")
    pack = resolve(constPack, FusedOpsConstParamPack, "constPack")
    check(pl.ops == pack.ops, "constPack", f"is for {name_of('cudnnFusedOps_t', pack.ops)} but the plan is for "
                                           f"{name_of('cudnnFusedOps_t', pl.ops)}")
    problem = Problem(pl.ops, pack)
    graph = problem.build()
    pl.problem, pl.empty = problem, not graph.ops
    if pl.empty:
        return 0
    return int(plan_for(h, problem.key(), problem.build).workspace_size)


def _aligned(data, placeholder: int, itemsize: int) -> bool:
    addr = address(data)
    if addr is None:
        return True
    return addr % (16 if placeholder == PTR_16B_ALIGNED else itemsize) == 0


@legacy("cudnnFusedOpsExecute")
def fusedOpsExecute(handle, plan, varPack) -> None:
    """Run the made plan on the variant pack's pointers and scalars (002 §6.2.11; the checks in
    the module docstring)."""
    h = get_handle(handle)
    pl = resolve(plan, FusedOpsPlan, "plan")
    var = resolve(varPack, FusedOpsVariantParamPack, "varPack")
    check(pl.problem is not None, "plan", "was not made (call cudnnMakeFusedOpsPlan first)")
    check(var.ops == pl.ops, "varPack", f"is for {name_of('cudnnFusedOps_t', var.ops)} but the plan is for "
                                        f"{name_of('cudnnFusedOps_t', pl.ops)}")
    pr = pl.problem
    tensors = {}
    for slot, ph in pr.placeholders.items():
        data = var.get(_vlabel(SLOTS[slot].ptr))
        label = "CUDNN_PTR_" + SLOTS[slot].ptr
        if ph == PTR_NULL:
            check(data is None, label, f"must be NULL: CUDNN_PARAM_{SLOTS[slot].placeholder} is CUDNN_PTR_NULL")
            continue
        check(data is not None, label, f"is NULL but CUDNN_PARAM_{SLOTS[slot].placeholder} promised a pointer")
        if slot in pr.descs:
            item = 1 if slot == "bitmask" else dtypes.itemsize(pr.descs[slot].dtype)
            check(_aligned(data, ph, item), label, f"is not {'16-byte' if ph == PTR_16B_ALIGNED else 'element'} aligned")
            tensors[pr.uid(slot)] = (data, label)
    scalars = _scalars(pr, var)
    ws_size = var.get(VLABEL["CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES"])
    workspace = var.get(_vlabel("WORKSPACE"))
    if pl.empty:
        return
    run(h, pr.key(), pr.build, tensors, scalars, workspace, ws_size, "CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES")


def _scalars(pr: Problem, var: FusedOpsVariantParamPack) -> dict:
    """The by-value inputs of the pattern's graph from the variant pack's scalars."""
    out = {ALPHA: 1.0, bn.ALPHA_P: 1.0, ONE: 1.0, ZERO: 0.0}
    if "CUDNN_SCALAR_DOUBLE_BN_EPSILON" in pr.spec.scalars:
        eps = var.get(VLABEL["CUDNN_SCALAR_DOUBLE_BN_EPSILON"])
        check(eps >= 0.0, "CUDNN_SCALAR_DOUBLE_BN_EPSILON", f"{eps} is less than CUDNN_BN_MIN_EPSILON (0)")
        out[EPS] = out[bn.EPS] = eps
    if "CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT" in pr.spec.scalars:
        m = var.get(VLABEL["CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT"])
        check(m >= 1, "CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT", f"must be >= 1, got {m}")
        f = var.get(VLABEL["CUDNN_SCALAR_DOUBLE_BN_EXP_AVG_FACTOR"])
        if "running_var" in pr.descs and m < 2:
            raise not_supported("CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT",
                                "updating the running variance needs at least 2 values per channel")
        out.update({INV_M: 1.0 / m, KEEP: 1.0 - f, FACTOR: f, FACTOR_UNBIASED: f * m / (m - 1) if m > 1 else 0.0})
    return out


__all__ = ["SPECS", "SLOTS", "const_kind", "variant_kind"]
