"""The cuDNN backend API over the graph layer (002 §5.2.1-§5.2.7 cudnnBackendCreateDescriptor,
DestroyDescriptor, Execute, Finalize, GetAttribute, Initialize, SetAttribute; 002 ch. 9
"cuDNN Backend API"; 000 "Graph API"), so graph-API code written against cuDNN runs on our
engines, the CPU reference included.

One table-driven implementation: ``backend_attrs.DESCRIPTORS`` says, per descriptor type,
which attributes exist, their types, element counts and whether they are required;
``SetAttribute`` and ``GetAttribute`` apply it generically; ``FINALIZE[type]`` turns a
descriptor into our objects: tensors into ``_backend.ir.Tensor``, operation descriptors into
IR ``Operation``s (conv forward/backward data/backward filter with the alpha/beta blend of
002, pointwise, matmul, reduction, gen-stats), the operation graph into an
``OperationGraph``, ENGINEHEUR into ``_backend.heuristics.get_engine_configs`` results, an
ENGINECFG into an ``EngineConfig``, an EXECUTION_PLAN into an engine's ``ExecutionPlan``,
and ``cudnnBackendExecute`` binds the VARIANT_PACK and runs ``_backend.planner.execute``.

Statuses (002 §5.2, inventory §2.18): SetAttribute NOT_INITIALIZED on a finalized descriptor,
BAD_PARAM for a wrong attribute name, type, element count or value, NOT_SUPPORTED for a
placeholder attribute; GetAttribute BAD_PARAM for a wrong name/type, NOT_INITIALIZED before
finalize; Finalize BAD_PARAM for missing, invalid or inconsistent attributes, NOT_SUPPORTED
for what the graph layer cannot do.  Every Finalize error names the attribute and the check
that failed (``CuDNNError.argument`` / ``.check``), seed 004's complaint.
docs/backend_api.md documents the Python mapping and every deviation.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from _backend import planner
from _backend.engines.base import EngineDeclined
from _backend.heuristics import get_engine_configs
from _backend.ir import GraphError, Operation, OperationGraph, Tensor, scalar as scalar_tensor, virtual
from _backend.validate import validate_op
from _backend.validate_conv import ROLES as CONV_ROLES
from . import backend_attrs as A
from ._data import bind, device_pointer, scalar as host_scalar
from ._descriptor import Descriptor, resolve
from ._registry import legacy
from .enums import ENUMS, name_of
from .errors import CUDNN_STATUS_BAD_PARAM as BAD, CUDNN_STATUS_NOT_INITIALIZED, CUDNN_STATUS_NOT_SUPPORTED as NOT_SUP
from .errors import CuDNNError
from .handle import Handle
from .tensor import DTYPE_NAME, VECTOR_WIDTH

globals().update(A.ATTRIBUTE_NAMES)
globals().update(A.EXTRA_CONSTANTS)

INTERNAL_UID_BASE = 2 ** 62  # uids we add (alpha/beta scalars, blend temporaries, in-place aliases)


def fail(status: int, attr: str, check: str, message: str) -> CuDNNError:
    """The error of a failed check: ``argument`` is the attribute, ``check`` the check's name."""
    e = CuDNNError(status, attr, f"check {check}: {message}")
    e.check = check
    return e


# -- the descriptor object -------------------------------------------------------------------

class BackendDescriptor(Descriptor):
    """cudnnBackendDescriptor_t: a type, the attributes set so far, and after Finalize the
    object it stands for (``obj``)."""

    kind = "cudnnBackendDescriptor_t"

    def __init__(self, descriptor_type: int):
        super().__init__()
        self.reset(descriptor_type)
        self.touched()

    destroyed = False

    def destroy(self):
        super().destroy()
        self.destroyed = True

    def reset(self, descriptor_type: int) -> None:
        self.type = int(descriptor_type)
        self.type_name = A.DESC_NAME[self.type]
        self.values: dict = {}  # Attr.name -> list of values
        self.finalized = False
        self.obj = None

    def __repr__(self):
        state = "finalized" if getattr(self, "finalized", False) else "not finalized"
        return f"<cudnnBackendDescriptor_t CUDNN_BACKEND_{getattr(self, 'type_name', '?')}_DESCRIPTOR {int(self):#x} {state}>"

    # accessors used by the finalize functions
    def get(self, name: str, default=None):
        vals = self.values.get(name)
        return default if vals is None else vals

    def one(self, name: str, default=None):
        vals = self.values.get(name)
        return default if not vals else vals[0]

    def is_set(self, name: str) -> bool:
        return name in self.values

    def sub(self, name: str):
        """The finalized object of the descriptor stored in attribute ``name``."""
        d = self.one(name)
        return _finalized_obj(d, "CUDNN_ATTR_" + name)


def _finalized_obj(d, attr: str, what: str = ""):
    if d.destroyed:
        raise fail(BAD, attr, "DESCRIPTOR_DESTROYED", f"{what or 'the descriptor'} {int(d):#x} was destroyed")
    if not d.finalized:
        raise fail(BAD, attr, "DESCRIPTOR_NOT_FINALIZED",
                   f"{what or 'the'} CUDNN_BACKEND_{d.type_name}_DESCRIPTOR {int(d):#x} is not finalized")
    return d.obj


def _desc(arg, argname: str = "descriptor") -> BackendDescriptor:
    return resolve(arg, BackendDescriptor, argname, need_set=False)


def _attr(d: BackendDescriptor, attributeName) -> A.Attr:
    try:
        value = int(attributeName)
    except (TypeError, ValueError):
        raise fail(BAD, "attributeName", "ATTRIBUTE_NAME", f"{attributeName!r} is not a cudnnBackendAttributeName_t")
    spec = A.DESCRIPTORS[d.type_name].get(value)
    if spec is None:
        owner = A.OWNER.get(value)
        where = f"it belongs to CUDNN_BACKEND_{owner}_DESCRIPTOR" if owner else "no descriptor type has it"
        raise fail(BAD, "attributeName", "ATTRIBUTE_NAME",
                   f"{A.ATTR_NAME_OF.get(value, value)} is not an attribute of CUDNN_BACKEND_{d.type_name}_DESCRIPTOR ({where})")
    return spec


def _check_type(spec: A.Attr, attributeType) -> str:
    tname = A.TYPE_NAME.get(attributeType) if isinstance(attributeType, int) else None
    if tname not in spec.types:
        got = f"CUDNN_TYPE_{tname}" if tname else repr(attributeType)
        want = " or ".join("CUDNN_TYPE_" + t for t in spec.types)
        raise fail(BAD, spec.full, "ATTRIBUTE_TYPE", f"attributeType is {got}; this attribute takes {want}")
    return tname


# -- entry points ------------------------------------------------------------------------------

@legacy("cudnnBackendCreateDescriptor")
def backendCreateDescriptor(descriptorType) -> BackendDescriptor:
    """002 §5.2.1: a new descriptor of ``descriptorType`` (the C out-parameter is returned).
    NOT_SUPPORTED for a value that is not a cudnnBackendDescriptorType_t."""
    if isinstance(descriptorType, bool) or not isinstance(descriptorType, int) or int(descriptorType) not in A.DESC_NAME:
        raise fail(NOT_SUP, "descriptorType", "DESCRIPTOR_TYPE",
                   f"{descriptorType!r} is not a cudnnBackendDescriptorType_t this version can create (0..{max(A.DESC_NAME)})")
    return BackendDescriptor(int(descriptorType))


@legacy("cudnnBackendDestroyDescriptor")
def backendDestroyDescriptor(descriptor) -> None:
    """002 §5.2.2.  Descriptors that used this one keep what they took from it at their Finalize."""
    d = _desc(descriptor)
    d.values.clear()
    d.obj = None
    d.destroy()


@legacy("cudnnBackendInitialize")
def backendInitialize(descriptor, descriptorType=None, sizeInBytes=None) -> None:
    """002 §5.2.6 (3 arguments) or the 8.2 header's 1-argument form: the descriptor is reset to
    ``descriptorType`` (its own type when omitted) with no attributes and finalized = false.
    Our descriptors need no caller memory, so any ``sizeInBytes`` >= 0 is enough."""
    d = _desc(descriptor)
    if descriptorType is None:
        descriptorType = d.type
    if isinstance(descriptorType, bool) or not isinstance(descriptorType, int) or int(descriptorType) not in A.DESC_NAME:
        raise fail(BAD, "descriptorType", "DESCRIPTOR_TYPE", f"{descriptorType!r} is not a cudnnBackendDescriptorType_t")
    if sizeInBytes is not None and (not isinstance(sizeInBytes, int) or sizeInBytes < 0):
        raise fail(BAD, "sizeInBytes", "DESCRIPTOR_SIZE", f"must be an int >= 0, got {sizeInBytes!r}")
    d.reset(int(descriptorType))


@legacy("cudnnBackendSetAttribute")
def backendSetAttribute(descriptor, attributeName, attributeType, elementCount, arrayOfElements) -> None:
    """002 §5.2.7.  ``arrayOfElements``: a sequence, or a single value (a descriptor object for
    CUDNN_TYPE_BACKEND_DESCRIPTOR, a handle for CUDNN_TYPE_HANDLE, a data pointer / array for
    CUDNN_TYPE_VOID_PTR); the first ``elementCount`` elements are read."""
    d = _desc(descriptor)
    if d.finalized:
        raise CuDNNError(CUDNN_STATUS_NOT_INITIALIZED, "descriptor",
                         f"CUDNN_BACKEND_{d.type_name}_DESCRIPTOR {int(d):#x} is already finalized; attributes cannot change")
    spec = _attr(d, attributeName)
    if spec.need == "G":
        raise fail(BAD, spec.full, "ATTRIBUTE_READ_ONLY", "is a read-only attribute (get only)")
    tname = _check_type(spec, attributeType)
    if isinstance(elementCount, bool) or not isinstance(elementCount, int) or elementCount < 0:
        raise fail(BAD, spec.full, "ELEMENT_COUNT", f"elementCount must be an int >= 0, got {elementCount!r}")
    lo, hi = spec.count
    if elementCount < lo or (hi is not None and elementCount > hi):
        rng = f"exactly {lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'n'}"
        raise fail(BAD, spec.full, "ELEMENT_COUNT", f"takes {rng} element(s), elementCount is {elementCount}")
    try:
        raw = A.elements(arrayOfElements, elementCount, tname)
        parse = spec.parse or tname
        if parse == "HANDLE":
            values = [_handle_element(v, i) for i, v in enumerate(raw)]
        elif parse == "BACKEND_DESCRIPTOR":
            values = [_descriptor_element(v, i, spec) for i, v in enumerate(raw)]
        else:
            values = [A.parse_value(v, i, parse) for i, v in enumerate(raw)]
    except A.BadValue as e:
        raise fail(BAD, spec.full, "ATTRIBUTE_VALUE", e.rule) from None
    if spec.need == "P" and values:
        raise fail(NOT_SUP, spec.full, "ATTRIBUTE_UNSUPPORTED",
                   "is a placeholder that this version does not support setting (002 ch. 9)")
    d.values[spec.name] = values


def _handle_element(v, i):
    if isinstance(v, Handle):
        return v
    try:
        return resolve(v, Handle, f"element {i}")
    except CuDNNError as e:
        raise A.BadValue(i, f"element {i} is not a live cudnnHandle_t ({e.rule})") from None


def _descriptor_element(v, i, spec):
    try:
        d = _desc(v, f"element {i}")
    except CuDNNError as e:
        raise A.BadValue(i, f"element {i} is not a live backend descriptor ({e.rule})") from None
    if d.type_name not in spec.kinds:
        want = " or ".join(f"CUDNN_BACKEND_{k}_DESCRIPTOR" for k in spec.kinds)
        raise A.BadValue(i, f"element {i} is a CUDNN_BACKEND_{d.type_name}_DESCRIPTOR; this attribute takes {want}")
    return d


@legacy("cudnnBackendGetAttribute")
def backendGetAttribute(descriptor, attributeName, attributeType, requestedElementCount, arrayOfElements=None) -> tuple:
    """002 §5.2.5: ``(elementCount, values)``: the attribute's element count and its first
    ``requestedElementCount`` values.  For CUDNN_TYPE_BACKEND_DESCRIPTOR results (ENGINEHEUR
    RESULTS, ENGINE KNOB_INFO, ...) pass the caller's descriptors in ``arrayOfElements`` to
    have them filled, as in C; without it new descriptors are returned."""
    d = _desc(descriptor)
    spec = _attr(d, attributeName)
    tname = _check_type(spec, attributeType)
    if isinstance(requestedElementCount, bool) or not isinstance(requestedElementCount, int) or requestedElementCount < 0:
        raise fail(BAD, spec.full, "ELEMENT_COUNT", f"requestedElementCount must be an int >= 0, got {requestedElementCount!r}")
    if not d.finalized:
        raise CuDNNError(CUDNN_STATUS_NOT_INITIALIZED, "descriptor",
                         f"CUDNN_BACKEND_{d.type_name}_DESCRIPTOR {int(d):#x} is not finalized; attributes are readable after cudnnBackendFinalize")
    getter = GETTERS.get(spec.name)
    if getter is not None:
        values = getter(d, requestedElementCount, arrayOfElements)
    else:
        values = list(d.values.get(spec.name, spec.default))
    if tname in ("FLOAT", "DOUBLE"):
        values = [float(v) for v in values]
    return len(values), values[:requestedElementCount]


@legacy("cudnnBackendFinalize")
def backendFinalize(descriptor) -> None:
    """002 §5.2.4 and each type's "Finalization" in ch. 9."""
    d = _desc(descriptor)
    if d.finalized:
        return
    if d.type_name in A.READ_ONLY_TYPES:
        raise fail(NOT_SUP, "descriptor", "DESCRIPTOR_READ_ONLY",
                   f"CUDNN_BACKEND_{d.type_name}_DESCRIPTOR is read-only: it is obtained finalized from GetAttribute, never finalized by the user")
    for spec in A.DESCRIPTORS[d.type_name].values():
        if spec.need == "R" and spec.name not in d.values:
            raise fail(BAD, spec.full, "ATTRIBUTE_REQUIRED", f"is required by CUDNN_BACKEND_{d.type_name}_DESCRIPTOR and was not set")
    d.obj = FINALIZE[d.type_name](d)
    d.finalized = True


@legacy("cudnnBackendExecute")
def backendExecute(handle, executionPlan, variantPack) -> None:
    """002 §5.2.3: run the finalized plan on the variant pack's data pointers and workspace."""
    h = resolve(handle, Handle, "handle")
    plan_d, pack_d = _desc(executionPlan, "executionPlan"), _desc(variantPack, "variantPack")
    for d, arg, tname in ((plan_d, "executionPlan", "EXECUTION_PLAN"), (pack_d, "variantPack", "VARIANT_PACK")):
        if d.type_name != tname:
            raise fail(BAD, arg, "DESCRIPTOR_TYPE", f"is a CUDNN_BACKEND_{d.type_name}_DESCRIPTOR, not CUDNN_BACKEND_{tname}_DESCRIPTOR")
        if not d.finalized:
            raise fail(BAD, arg, "DESCRIPTOR_NOT_FINALIZED", f"CUDNN_BACKEND_{tname}_DESCRIPTOR {int(d):#x} is not finalized")
    plan, pack = plan_d.obj, pack_d.obj
    if h.place != plan.place:
        raise fail(BAD, "handle", "HANDLE_PLACE", f"the plan was built for the {plan.place} place, the handle is on the {h.place} place")
    g = plan.graph
    ptrs = dict(zip(pack.uids, pack.pointers))
    if plan.plan.workspace_size > 0 and (pack.workspace is None or (isinstance(pack.workspace, int) and pack.workspace == 0)):
        raise fail(BAD, "CUDNN_ATTR_VARIANT_PACK_WORKSPACE", "VARIANT_PACK_WORKSPACE",
                   f"is NULL but the plan needs {plan.plan.workspace_size} bytes of workspace")
    put = device_pointer if (h.place == "gpu" and getattr(plan.plan, "raw_pointers", False)) else None
    data = {}
    for uid, t in g.externals.items():
        if uid in g.scalars:
            data[uid] = g.scalars[uid]
            continue
        user_uid = g.aliases.get(uid, uid)
        if user_uid not in ptrs:
            raise fail(BAD, "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS", "VARIANT_PACK_UID",
                       f"has no data pointer for tensor uid {user_uid}, a non-virtual tensor of the operation graph")
        ptr, argname = ptrs[user_uid], f"CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS (uid {user_uid})"
        if t.is_by_value:
            data[uid] = host_scalar(ptr, argname, t.dtype == "float64")
        else:
            data[uid] = put(ptr, t, argname) if put else bind(h, ptr, t, argname)
    plan.plan = planner.execute(plan.plan, data, pack.workspace, plan.plan.workspace_size, h.stream)


# -- finalize: tensors and operator descriptors ---------------------------------------------------

@dataclass(frozen=True)
class TensorObj:
    """A finalized CUDNN_BACKEND_TENSOR_DESCRIPTOR."""

    uid: int
    dims: tuple
    strides: tuple
    data_type: int
    dtype: str
    alignment: int
    is_virtual: bool
    is_by_value: bool

    def ir(self, dims=None, strides=None) -> Tensor:
        """The IR tensor (one name per uid, so every op sees the same tensor)."""
        return Tensor(self.uid, self.dims if dims is None else dims, self.strides if strides is None else strides,
                      self.dtype, self.is_virtual, self.is_by_value, f"uid{self.uid}")


def _fin_tensor(d):
    """002 §9.2.16: BAD_PARAM for non-positive dims/strides or an alignment that the data type
    size does not divide; NOT_SUPPORTED for the vector data types and vectorized tensors."""
    dims, strides = tuple(d.get("TENSOR_DIMENSIONS")), tuple(d.get("TENSOR_STRIDES"))
    dt, align = d.one("TENSOR_DATA_TYPE"), d.one("TENSOR_BYTE_ALIGNMENT")
    vec = d.one("TENSOR_VECTOR_COUNT", 1)
    virt, byval = d.one("TENSOR_IS_VIRTUAL", False), d.one("TENSOR_IS_BY_VALUE", False)
    if len(dims) != len(strides):
        raise fail(BAD, "CUDNN_ATTR_TENSOR_STRIDES", "TENSOR_STRIDES_COUNT",
                   f"has {len(strides)} elements but CUDNN_ATTR_TENSOR_DIMENSIONS has {len(dims)}")
    if any(x <= 0 for x in dims):
        raise fail(BAD, "CUDNN_ATTR_TENSOR_DIMENSIONS", "TENSOR_DIMENSIONS_POSITIVE", f"every dimension must be > 0, got {dims}")
    if any(x <= 0 for x in strides):
        raise fail(BAD, "CUDNN_ATTR_TENSOR_STRIDES", "TENSOR_STRIDES_POSITIVE", f"every stride must be > 0, got {strides}")
    if dt in VECTOR_WIDTH:
        raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_DATA_TYPE", "TENSOR_VECTOR_DATA_TYPE",
                   f"{name_of('cudnnDataType_t', dt)} is not supported; use CUDNN_DATA_INT8 with CUDNN_ATTR_TENSOR_VECTOR_COUNT")
    if dt not in DTYPE_NAME:
        raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_DATA_TYPE", "TENSOR_DATA_TYPE", f"{name_of('cudnnDataType_t', dt)} has no graph-layer type")
    dtype = DTYPE_NAME[dt]
    from _backend.dtypes import itemsize
    if align <= 0 or align % itemsize(dtype):
        raise fail(BAD, "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT", "TENSOR_ALIGNMENT",
                   f"{align} is not a positive multiple of the {itemsize(dtype)}-byte size of {name_of('cudnnDataType_t', dt)}")
    if vec != 1:
        if not d.is_set("TENSOR_VECTORIZED_DIMENSION"):
            raise fail(BAD, "CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION", "TENSOR_VECTORIZED_DIMENSION",
                       f"is required when CUDNN_ATTR_TENSOR_VECTOR_COUNT is {vec}")
        if dtype == "int8" and vec not in (4, 32):
            raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_VECTOR_COUNT", "TENSOR_VECTOR_COUNT", f"INT8 tensors take 1, 4 or 32, got {vec}")
        raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_VECTOR_COUNT", "TENSOR_VECTOR_COUNT",
                   f"vectorized tensors (count {vec}) are not supported by the graph layer")
    if virt and byval:
        raise fail(BAD, "CUDNN_ATTR_TENSOR_IS_BY_VALUE", "TENSOR_BY_VALUE", "a tensor cannot be both virtual and by-value")
    if byval and any(x != 1 for x in dims):
        raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_IS_BY_VALUE", "TENSOR_BY_VALUE", f"by-value tensors hold one element, dims are {dims}")
    return TensorObj(d.one("TENSOR_UNIQUE_ID"), dims, strides, dt, dtype, align, virt, byval)


# cudnnPointwiseMode_t -> IR Pointwise mode (docs/graph_ops.md); backward modes read (dy, x)
_PW_MODES = {v: k[len("CUDNN_POINTWISE_"):] for k, v in ENUMS["cudnnPointwiseMode_t"].items()}
_PW_BINARY = {"ADD", "MUL", "MIN", "MAX"}
_FLOAT_TYPES = {"float32", "float64", "float16", "bfloat16"}


def _compute_type(d, attr: str) -> str:
    dt = d.one(attr)
    name = DTYPE_NAME.get(dt) if dt not in VECTOR_WIDTH else None
    if name not in _FLOAT_TYPES | {"int32"}:
        raise fail(NOT_SUP, "CUDNN_ATTR_" + attr, "COMPUTE_TYPE",
                   f"{name_of('cudnnDataType_t', dt)} is not a compute type of the graph layer (FLOAT, DOUBLE, HALF, BFLOAT16, INT32)")
    return name


def _fin_pointwise(d):
    """CUDNN_BACKEND_POINTWISE_DESCRIPTOR (002 §5.1.3.1 attributes; 8.2 header for 5-8)."""
    mode = _PW_MODES[d.one("POINTWISE_MODE")]
    from _backend.validate_tensor import POINTWISE_BINARY, POINTWISE_UNARY
    if mode not in POINTWISE_UNARY | POINTWISE_BINARY:
        raise fail(NOT_SUP, "CUDNN_ATTR_POINTWISE_MODE", "POINTWISE_MODE", f"CUDNN_POINTWISE_{mode} has no graph-layer kernel")
    prec = _compute_type(d, "POINTWISE_MATH_PREC")
    attrs = {"mode": mode}
    nan = d.one("POINTWISE_NAN_PROPAGATION")
    if nan is not None:
        attrs["nan_propagation"] = "PROPAGATE" if nan == ENUMS["cudnnNanPropagation_t"]["CUDNN_PROPAGATE_NAN"] else "NOT_PROPAGATE"
    lo, up = d.one("POINTWISE_RELU_LOWER_CLIP"), d.one("POINTWISE_RELU_UPPER_CLIP")
    if lo is not None:
        attrs["relu_lower_clip"] = lo
    if up is not None:
        attrs["relu_upper_clip"] = up
    if lo is not None and up is not None and lo > up:
        raise fail(BAD, "CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP", "POINTWISE_RELU_CLIP", f"upper clip {up} is below the lower clip {lo}")
    if d.one("POINTWISE_RELU_LOWER_CLIP_SLOPE", 0.0) != 0.0:
        raise fail(NOT_SUP, "CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE", "POINTWISE_RELU_SLOPE",
                   "a leaky ReLU slope is not supported by the graph layer's pointwise op")
    for attr, key in (("POINTWISE_ELU_ALPHA", "elu_alpha"), ("POINTWISE_SOFTPLUS_BETA", "softplus_beta"),
                      ("POINTWISE_SWISH_BETA", "swish_beta")):
        if d.is_set(attr):
            attrs[key] = d.one(attr)
    return {"mode": mode, "attrs": attrs, "math_prec": prec}


def _fin_convolution(d):
    """002 §9.2.1: BAD_PARAM when an array's element count differs from SPATIAL_DIMS (when
    SPATIAL_DIMS is not set, it is the arrays' common count), or a value is out of range."""
    arrays = {n: tuple(d.get(n)) for n in ("CONVOLUTION_PRE_PADDINGS", "CONVOLUTION_POST_PADDINGS",
                                           "CONVOLUTION_FILTER_STRIDES", "CONVOLUTION_DILATIONS")}
    nsp = d.one("CONVOLUTION_SPATIAL_DIMS")
    if nsp is None:
        nsp = len(arrays["CONVOLUTION_DILATIONS"])
        src = "CUDNN_ATTR_CONVOLUTION_DILATIONS's element count (CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS is not set)"
    else:
        src = "CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS"
        if not 1 <= nsp <= A.MAX_DIMS - 2:
            raise fail(BAD, "CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS", "CONV_SPATIAL_DIMS", f"must be in 1..{A.MAX_DIMS - 2}, got {nsp}")
    for n, vals in arrays.items():
        if len(vals) != nsp:
            raise fail(BAD, "CUDNN_ATTR_" + n, "CONV_SPATIAL_DIMS", f"has {len(vals)} elements but {src} is {nsp}")
    for n, lo in (("CONVOLUTION_PRE_PADDINGS", 0), ("CONVOLUTION_POST_PADDINGS", 0),
                  ("CONVOLUTION_FILTER_STRIDES", 1), ("CONVOLUTION_DILATIONS", 1)):
        if any(v < lo for v in arrays[n]):
            raise fail(BAD, "CUDNN_ATTR_" + n, "CONV_" + n.split("_", 1)[1], f"every element must be >= {lo}, got {arrays[n]}")
    mode = "CONVOLUTION" if d.one("CONVOLUTION_CONV_MODE") == ENUMS["cudnnConvolutionMode_t"]["CUDNN_CONVOLUTION"] else "CROSS_CORRELATION"
    comp = _compute_type(d, "CONVOLUTION_COMP_TYPE")
    if comp == "bfloat16":
        raise fail(NOT_SUP, "CUDNN_ATTR_CONVOLUTION_COMP_TYPE", "COMPUTE_TYPE", "BFLOAT16 is not a convolution compute type")
    return {"spatial_dims": nsp, "mode": mode, "compute_type": comp,
            "pre": arrays["CONVOLUTION_PRE_PADDINGS"], "post": arrays["CONVOLUTION_POST_PADDINGS"],
            "stride": arrays["CONVOLUTION_FILTER_STRIDES"], "dilation": arrays["CONVOLUTION_DILATIONS"]}


def _fin_matmul(d):
    return {"compute_type": _compute_type(d, "MATMUL_COMP_TYPE")}


_REDUCE_MODES = {v: k[len("CUDNN_REDUCE_TENSOR_"):] for k, v in ENUMS["cudnnReduceTensorOp_t"].items()}


def _fin_reduction(d):
    return {"mode": _REDUCE_MODES[d.one("REDUCTION_OPERATOR")], "compute_type": _compute_type(d, "REDUCTION_COMP_TYPE")}


def _fin_knob_choice(d):
    return (d.one("KNOB_CHOICE_KNOB_TYPE"), d.one("KNOB_CHOICE_KNOB_VALUE"))


# -- finalize: operations ---------------------------------------------------------------------------

class Lowering:
    """Allocates the uids a lowering adds and records their meaning: ``scalars`` (uid -> value
    of an alpha/beta by-value tensor), ``aliases`` (uid -> the user uid whose buffer it reads:
    y before a beta blend, or an in-place input)."""

    def __init__(self, base: int = INTERNAL_UID_BASE, inplace=frozenset()):
        self._uids = itertools.count(base)
        self.scalars: dict = {}
        self.aliases: dict = {}
        self.inplace = inplace
        self._read = {}

    def scalar(self, value: float, dtype: str, name: str) -> Tensor:
        t = scalar_tensor(next(self._uids), dtype, name)
        self.scalars[t.uid] = float(value)
        return t

    def virtual(self, dims, dtype: str, name: str) -> Tensor:
        return virtual(next(self._uids), dims, dtype, name)

    def alias(self, t: Tensor, name: str) -> Tensor:
        a = Tensor(next(self._uids), t.dims, t.strides, t.dtype, name=name)
        self.aliases[a.uid] = t.uid
        return a

    def read(self, t: Tensor) -> Tensor:
        """An op input: an alias of ``t`` when the single-op graph writes ``t`` in place."""
        if t.uid not in self.inplace:
            return t
        if t.uid not in self._read:
            self._read[t.uid] = self.alias(t, (t.name or "x") + "_in_place")
        return self._read[t.uid]


@dataclass
class OpNode:
    """A finalized operation descriptor: its IR tensors by attribute name, which of them it
    reads and writes, and ``lower(ctx)`` -> the IR operations."""

    type_name: str
    tensors: dict  # attribute full name -> IR Tensor
    reads: tuple  # attribute full names
    writes: tuple
    lower: object
    roles: dict = field(default_factory=dict)  # IR role -> attribute full name (for error messages)

    def uids(self, which) -> set:
        return {self.tensors[a].uid for a in which}


def _node(d, type_name, tensors, reads, writes, lower, roles):
    node = OpNode(type_name, tensors, tuple(reads), tuple(writes), lower, roles)
    ctx = Lowering()
    for i, op in enumerate(lower(ctx)):  # the per-kind rules of _backend/validate*.py, now
        try:
            validate_op(i, op)
        except GraphError as e:
            legend = ", ".join(f"{r}={a}" for r, a in roles.items())
            raise fail(NOT_SUP if e.status == "NOT_SUPPORTED" else BAD, f"CUDNN_BACKEND_{type_name}_DESCRIPTOR", e.check,
                       f"{e} (roles: {legend})") from None
    return node


def _tensor_attr(d, name):
    return d.sub(name) if d.is_set(name) else None


def _conv_group_merge(t: TensorObj, axis: int, attr: str):
    """dims/strides with dims ``axis`` (group) and ``axis+1`` merged; NOT_SUPPORTED when the group
    stride is not dims[axis+1] * strides[axis+1] (the graph layer needs packed groups)."""
    dims, st = list(t.dims), list(t.strides)
    if dims[axis] > 1 and st[axis] != dims[axis + 1] * st[axis + 1]:
        raise fail(NOT_SUP, attr, "CONV_GROUP_STRIDE",
                   f"group stride {st[axis]} is not {dims[axis + 1]}*{st[axis + 1]}: unpacked group strides are not supported by the graph layer")
    dims[axis:axis + 2] = [dims[axis] * dims[axis + 1]]
    st[axis:axis + 2] = [st[axis + 1]]
    return tuple(dims), tuple(st)


_CONV_OPS = {  # descriptor type -> (IR kind, attribute prefix, {IR role: attribute suffix})
    "OPERATION_CONVOLUTION_FORWARD": ("ConvolutionForward", "OPERATION_CONVOLUTION_FORWARD_", {"x": "X", "w": "W", "y": "Y"}),
    "OPERATION_CONVOLUTION_BACKWARD_DATA": ("ConvolutionBackwardData", "OPERATION_CONVOLUTION_BWD_DATA_",
                                            {"dx": "DX", "w": "W", "dy": "DY"}),
    "OPERATION_CONVOLUTION_BACKWARD_FILTER": ("ConvolutionBackwardFilter", "OPERATION_CONVOLUTION_BWD_FILTER_",
                                              {"x": "X", "dw": "DW", "dy": "DY"}),
}


def _fin_conv_op(d):
    """002 §9.2.10-§9.2.12: out = alpha * conv(...) + beta * out.  Tensors have SPATIAL_DIMS+2
    dims ([N, G*C, ...], [G*K, C, ...], [N, G*K, ...]) or SPATIAL_DIMS+3 dims ([N, G, C, ...],
    [G, K, C, ...], [N, G, K, ...]); n, g, c, k must agree (BAD_PARAM naming the tensor)."""
    kind, prefix, role_attr = _CONV_OPS[d.type_name]
    xr, wr, yr = CONV_ROLES[kind]
    out_role = {"ConvolutionForward": "y", "ConvolutionBackwardData": "dx", "ConvolutionBackwardFilter": "dw"}[kind]
    full = {r: "CUDNN_ATTR_" + prefix + s for r, s in role_attr.items()}
    conv = d.sub(prefix + "CONV_DESC")
    t = {r: d.sub(prefix + s) for r, s in role_attr.items()}
    nsp = conv["spatial_dims"]
    rank = len(t[xr].dims)
    for r in (xr, wr, yr):
        n = len(t[r].dims)
        if n not in (nsp + 2, nsp + 3):
            raise fail(BAD, full[r], "CONV_TENSOR_RANK",
                       f"has {n} dims; with CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS {nsp} conv tensors have {nsp + 2} or {nsp + 3}")
        if n != rank:
            raise fail(BAD, full[r], "CONV_TENSOR_RANK", f"has {n} dims but {full[xr]} has {rank}")
    X, W, Y = t[xr], t[wr], t[yr]
    if rank == nsp + 3:  # [N, G, C, ...], [G, K, C, ...], [N, G, K, ...]
        (n, g, c), (gw, k, cw), (ny, gy, ky) = X.dims[:3], W.dims[:3], Y.dims[:3]
        for ok, r, what in ((gw == g, wr, f"group count {gw} differs from {full[xr]}'s {g}"),
                            (cw == c, wr, f"per-group input channels {cw} differ from {full[xr]}'s {c}"),
                            (ny == n, yr, f"batch {ny} differs from {full[xr]}'s {n}"),
                            (gy == g, yr, f"group count {gy} differs from {full[xr]}'s {g}"),
                            (ky == k, yr, f"per-group output channels {ky} differ from {full[wr]}'s {k}")):
            if not ok:
                raise fail(BAD, full[r], "CONV_GROUP_DIMS", what)
        groups = g
        ir_dims = {xr: _conv_group_merge(X, 1, full[xr]), wr: _conv_group_merge(W, 0, full[wr]), yr: _conv_group_merge(Y, 1, full[yr])}
    else:  # [N, G*C, ...], [G*K, C, ...], [N, G*K, ...]
        if X.dims[1] % W.dims[1]:
            raise fail(BAD, full[xr], "CONV_CHANNELS",
                       f"has {X.dims[1]} channels, not a multiple of {full[wr]}'s {W.dims[1]} channels per group")
        groups = X.dims[1] // W.dims[1]
        if W.dims[0] % groups:
            raise fail(BAD, full[wr], "CONV_GROUPS", f"has {W.dims[0]} output channels, not a multiple of the {groups} groups "
                                                     f"that {full[xr]}'s {X.dims[1]} channels imply")
        if Y.dims[1] != W.dims[0]:
            raise fail(BAD, full[yr], "CONV_OUTPUT_CHANNELS", f"has {Y.dims[1]} channels but {full[wr]} has {W.dims[0]} filters")
        if Y.dims[0] != X.dims[0]:
            raise fail(BAD, full[yr], "CONV_BATCH", f"batch {Y.dims[0]} differs from {full[xr]}'s {X.dims[0]}")
        ir_dims = {r: (t[r].dims, t[r].strides) for r in (xr, wr, yr)}
    xs, ws, ys = ir_dims[xr][0][2:], ir_dims[wr][0][2:], ir_dims[yr][0][2:]
    want = []
    for i in range(nsp):
        span = (ws[i] - 1) * conv["dilation"][i] + 1
        padded = xs[i] + conv["pre"][i] + conv["post"][i]
        if span > padded:
            raise fail(BAD, full[wr], "CONV_FILTER_SIZE", f"dilated filter extent {span} in spatial dim {i} exceeds the padded input {padded}")
        want.append(1 + (padded - span) // conv["stride"][i])
    if tuple(want) != tuple(ys):
        raise fail(BAD, full[yr], "CONV_OUTPUT_DIMS",
                   f"spatial dims {tuple(ys)} differ from the convolution's {tuple(want)} "
                   f"(1 + (input + pre + post - dilated filter) // stride)")
    if X.dtype != W.dtype:
        raise fail(BAD, full[wr], "CONV_DATA_TYPE", f"data type {W.dtype} differs from {full[xr]}'s {X.dtype}")
    alpha, beta = d.one(prefix + "ALPHA"), d.one(prefix + "BETA")
    out = t[out_role]
    if beta != 0 and out.is_virtual:
        raise fail(NOT_SUP, "CUDNN_ATTR_" + prefix + "BETA", "CONV_BETA_VIRTUAL",
                   f"beta is {beta} but {full[out_role]} is virtual: there is no prior output to blend")
    attrs = {"mode": conv["mode"], "pre_padding": conv["pre"], "post_padding": conv["post"], "stride": conv["stride"],
             "dilation": conv["dilation"], "groups": groups, "compute_type": conv["compute_type"],
             "math_type": "DEFAULT_MATH", "algo": None}
    tensors = {full[r]: t[r].ir(*ir_dims[r]) for r in (xr, wr, yr)}
    ins = [r for r in (xr, wr, yr) if r != out_role]

    def lower(ctx):
        inputs = {r: ctx.read(tensors[full[r]]) for r in ins}
        y = tensors[full[out_role]]
        if alpha == 1 and beta == 0:
            return [Operation(kind, inputs, {out_role: y}, attrs)]
        ct = "float64" if y.dtype == "float64" else "float32"
        tmp = ctx.virtual(y.dims, ct, out_role + "_result")
        blend_in = {"x": tmp, "alpha1": ctx.scalar(alpha, ct, "alpha")}
        if beta != 0:
            blend_in.update(b=ctx.alias(y, out_role + "_prior"), alpha2=ctx.scalar(beta, ct, "beta"))
        return [Operation(kind, inputs, {out_role: tmp}, attrs),
                Operation("Pointwise", blend_in, {"y": y}, {"mode": "ADD" if beta != 0 else "IDENTITY"})]

    return _node(d, d.type_name, tensors, [full[r] for r in ins], [full[out_role]], lower,
                 {r: full[r] for r in (xr, wr, yr)})


def _check_rank_broadcast(out: TensorObj, out_attr: str, inputs: dict, check: str):
    """Inputs have the output's rank and each dim equal to it or 1 (002 §9.2.14 broadcasting)."""
    for attr, tt in inputs.items():
        if tt.is_by_value:
            continue
        if len(tt.dims) != len(out.dims):
            raise fail(BAD, attr, check + "_RANK", f"has {len(tt.dims)} dims but {out_attr} has {len(out.dims)}")
        if any(a not in (b, 1) for a, b in zip(tt.dims, out.dims)):
            raise fail(BAD, attr, check + "_BROADCAST", f"dims {tt.dims} neither equal nor broadcast (1) to {out_attr}'s {out.dims}")


def _fin_pointwise_op(d):
    """002 §9.2.14: y = op(alpha1 * x [, alpha2 * b]); backward activation modes (8.2) compute
    dx from dy (DYDESC) and the forward input (XDESC)."""
    P = "OPERATION_POINTWISE_"
    full = {k: "CUDNN_ATTR_" + P + k for k in ("XDESC", "BDESC", "YDESC", "DXDESC", "DYDESC", "ALPHA2")}
    pw = d.sub(P + "PW_DESCRIPTOR")
    mode = pw["mode"]
    bwd = mode.endswith("_BWD")
    need = ("XDESC", "DYDESC", "DXDESC") if bwd else (("XDESC", "BDESC", "YDESC") if mode in _PW_BINARY else ("XDESC", "YDESC"))
    for k in need:
        if not d.is_set(P + k):
            raise fail(BAD, full[k], "POINTWISE_TENSORS", f"is required for CUDNN_POINTWISE_{mode}")
    for k in ("XDESC", "BDESC", "YDESC", "DXDESC", "DYDESC", "ALPHA2"):
        if k not in need and d.is_set(P + k) and not (k == "ALPHA2" and mode in _PW_BINARY):
            raise fail(BAD, full[k], "POINTWISE_TENSORS", f"must not be set for CUDNN_POINTWISE_{mode}")
    tt = {k: d.sub(P + k) for k in need}
    out_k = "DXDESC" if bwd else "YDESC"
    in_ks = [k for k in need if k != out_k]
    _check_rank_broadcast(tt[out_k], full[out_k], {full[k]: tt[k] for k in in_ks}, "POINTWISE")
    tensors = {full[k]: tt[k].ir() for k in need}
    role_of = {"DYDESC": "x", "XDESC": "b"} if bwd else {"XDESC": "x", "BDESC": "b"}
    alpha1, alpha2 = d.one(P + "ALPHA1", 1.0), d.one(P + "ALPHA2", 1.0)

    def lower(ctx):
        ins = {role_of[k]: ctx.read(tensors[full[k]]) for k in in_ks}
        ct = "float64" if pw["math_prec"] == "float64" else "float32"
        if alpha1 != 1:
            ins["alpha1"] = ctx.scalar(alpha1, ct, "alpha1")
        if alpha2 != 1 and "b" in ins:
            ins["alpha2"] = ctx.scalar(alpha2, ct, "alpha2")
        return [Operation("Pointwise", ins, {"y": tensors[full[out_k]]}, dict(pw["attrs"]))]

    roles = {role_of[k]: full[k] for k in in_ks}
    roles["y"] = full[out_k]
    return _node(d, d.type_name, tensors, [full[k] for k in in_ks], [full[out_k]], lower, roles)


def _fin_matmul_op(d):
    """C = A @ B over the last two dims, batch dims broadcast (000 MatMul; 8.2 header attributes)."""
    P = "OPERATION_MATMUL_"
    full = {k: "CUDNN_ATTR_" + P + k for k in ("ADESC", "BDESC", "CDESC")}
    d.sub(P + "DESC")
    if d.is_set(P + "IRREGULARLY_STRIDED_BATCH_COUNT"):
        raise fail(NOT_SUP, "CUDNN_ATTR_" + P + "IRREGULARLY_STRIDED_BATCH_COUNT", "MATMUL_IRREGULAR_BATCH",
                   "irregularly strided batches are not supported by the graph layer")
    a, b, c = (d.sub(P + k) for k in ("ADESC", "BDESC", "CDESC"))
    for k, tt in (("ADESC", a), ("BDESC", b), ("CDESC", c)):
        if len(tt.dims) < 2 or len(tt.dims) != len(c.dims):
            raise fail(BAD, full[k], "MATMUL_RANK", f"has {len(tt.dims)} dims; A, B and C need the same rank >= 2")
    if a.dims[-1] != b.dims[-2]:
        raise fail(BAD, full["BDESC"], "MATMUL_SHAPE", f"has {b.dims[-2]} rows but A has {a.dims[-1]} columns")
    if c.dims[-2:] != (a.dims[-2], b.dims[-1]):
        raise fail(BAD, full["CDESC"], "MATMUL_SHAPE", f"is {c.dims[-2:]} per batch but A @ B is {(a.dims[-2], b.dims[-1])}")
    for k, tt in (("ADESC", a), ("BDESC", b)):
        if any(x not in (y, 1) for x, y in zip(tt.dims[:-2], c.dims[:-2])):
            raise fail(BAD, full[k], "MATMUL_BATCH", f"batch dims {tt.dims[:-2]} neither equal nor broadcast to C's {c.dims[:-2]}")
    tensors = {full[k]: tt.ir() for k, tt in (("ADESC", a), ("BDESC", b), ("CDESC", c))}

    def lower(ctx):
        return [Operation("Matmul", {"a": ctx.read(tensors[full["ADESC"]]), "b": ctx.read(tensors[full["BDESC"]])},
                          {"c": tensors[full["CDESC"]]})]

    return _node(d, d.type_name, tensors, [full["ADESC"], full["BDESC"]], [full["CDESC"]], lower,
                 {"a": full["ADESC"], "b": full["BDESC"], "c": full["CDESC"]})


def _fin_reduction_op(d):
    """y = reduce(x) over the dims where y is 1 (8.2 header REDUCTION attributes; IR Reduction)."""
    P = "OPERATION_REDUCTION_"
    xa, ya = "CUDNN_ATTR_" + P + "XDESC", "CUDNN_ATTR_" + P + "YDESC"
    red = d.sub(P + "DESC")
    x, y = d.sub(P + "XDESC"), d.sub(P + "YDESC")
    if len(x.dims) != len(y.dims):
        raise fail(BAD, ya, "REDUCTION_RANK", f"has {len(y.dims)} dims but the input has {len(x.dims)}")
    if any(b not in (a, 1) for a, b in zip(x.dims, y.dims)):
        raise fail(BAD, ya, "REDUCTION_DIMS", f"dims {y.dims} must equal the input's {x.dims} or be 1")
    tensors = {xa: x.ir(), ya: y.ir()}

    def lower(ctx):
        return [Operation("Reduction", {"x": ctx.read(tensors[xa])}, {"y": tensors[ya]}, {"mode": red["mode"]})]

    return _node(d, d.type_name, tensors, [xa], [ya], lower, {"x": xa, "y": ya})


def _fin_genstats_op(d):
    """002 §9.2.13 CUDNN_GENSTATS_SUM_SQSUM: per-channel sum and sum of squares of x; outputs
    are 1 in every dim but C, which equals x's.  Lowered to Reduction ADD of x and of x*x."""
    P = "OPERATION_GENSTATS_"
    xa, sa, qa = ("CUDNN_ATTR_" + P + k for k in ("XDESC", "SUMDESC", "SQSUMDESC"))
    _compute_type(d, P + "MATH_PREC")
    x, s, q = d.sub(P + "XDESC"), d.sub(P + "SUMDESC"), d.sub(P + "SQSUMDESC")
    for attr, tt in ((sa, s), (qa, q)):
        if len(tt.dims) != len(x.dims):
            raise fail(BAD, attr, "GENSTATS_RANK", f"has {len(tt.dims)} dims but {xa} has {len(x.dims)}")
        want = tuple(x.dims[1] if i == 1 else 1 for i in range(len(x.dims)))
        if tt.dims != want:
            raise fail(BAD, attr, "GENSTATS_DIMS", f"dims {tt.dims} must be {want}: 1 except C, which equals the input's")
    tensors = {xa: x.ir(), sa: s.ir(), qa: q.ir()}

    def lower(ctx):
        xi = ctx.read(tensors[xa])
        sq = ctx.virtual(x.dims, "float32", "x_squared")
        return [Operation("Reduction", {"x": xi}, {"y": tensors[sa]}, {"mode": "ADD"}),
                Operation("Pointwise", {"x": xi, "b": xi}, {"y": sq}, {"mode": "MUL"}),
                Operation("Reduction", {"x": sq}, {"y": tensors[qa]}, {"mode": "ADD"})]

    return _node(d, d.type_name, tensors, [xa], [sa, qa], lower, {"x": xa, "sum": sa, "sqsum": qa})


def _fin_unlowered_op(d):
    """BN_FINALIZE_STATISTICS and BN_BWD_WEIGHTS (8.2 header): their semantics are not
    specified in the seeds, so the graph layer has no lowering for them."""
    raise fail(NOT_SUP, f"CUDNN_BACKEND_{d.type_name}_DESCRIPTOR", "OPERATION_KIND",
               "this operation has no graph-layer lowering (its formulas are not specified in 002)")


# -- finalize: operation graph, engines, plans -----------------------------------------------------

@dataclass
class GraphObj:
    """A finalized operation graph: the IR graph, its handle and place, the uids added by the
    lowering, and the engine list that ENGINE_GLOBAL_INDEX counts (built on first use)."""

    handle: Handle
    ir: OperationGraph
    externals: dict  # uid -> IR tensor the variant pack must bind (or a scalar uid)
    scalars: dict
    aliases: dict
    _engines: list = None
    unusable: list = field(default_factory=list)

    @property
    def place(self) -> str:
        return self.handle.place

    def engines(self) -> list:
        """[(engine, config)]: every config heuristics mode B knows for this graph, in order;
        configs other modes return are appended when first seen."""
        if self._engines is None:
            cfgs, self.unusable = get_engine_configs(self.ir, self.place, "B")
            self._engines = list(cfgs)
        return self._engines

    def index_of(self, eng, cfg) -> int:
        lst = self.engines()
        for i, (e, c) in enumerate(lst):
            if e.name == eng.name and c == cfg:
                return i
        lst.append((eng, cfg))
        return len(lst) - 1


def _fin_graph(d):
    """002 §9.2.15 and 000 "Finalizing the operation graph": BAD_PARAM for an op that is not
    finalized, an invalid handle, a uid naming two different tensors or written twice;
    NOT_SUPPORTED for in-place ops in a multi-op graph or a cycle.  The op order of OPS does not
    matter (000): ops are sorted by dataflow.  Then the IR graph's own checks run."""
    attr = "CUDNN_ATTR_OPERATIONGRAPH_OPS"
    try:
        handle = resolve(d.one("OPERATIONGRAPH_HANDLE"), Handle, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE")
    except CuDNNError as e:
        raise fail(BAD, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE", "GRAPH_HANDLE", e.rule) from None
    nodes = [_finalized_obj(op, attr, f"OPS[{i}]") for i, op in enumerate(d.get("OPERATIONGRAPH_OPS"))]
    seen, producer = {}, {}
    for i, n in enumerate(nodes):
        for a, t in n.tensors.items():
            prev = seen.setdefault(t.uid, (i, a, t))
            if prev[2].key != t.key:
                raise fail(BAD, attr, "TENSOR_UNIQUE_ID",
                           f"uid {t.uid} names different tensors in OPS[{prev[0]}] ({prev[1]}, dims {prev[2].dims}) "
                           f"and OPS[{i}] ({a}, dims {t.dims})")
        for uid in n.uids(n.writes):
            if uid in producer:
                raise fail(BAD, attr, "TENSOR_SINGLE_PRODUCER", f"tensor uid {uid} is written by OPS[{producer[uid]}] and OPS[{i}]")
            producer[uid] = i
    inplace = [i for i, n in enumerate(nodes) if n.uids(n.reads) & n.uids(n.writes)]
    if inplace and len(nodes) > 1:
        raise fail(NOT_SUP, attr, "OPERATIONGRAPH_IN_PLACE",
                   f"OPS[{inplace[0]}] reads and writes the same uid; in-place ops are supported in single-op graphs only (000)")
    order, done, pending = [], set(), list(range(len(nodes)))
    while pending:  # Kahn: an op is ready when every op producing one of its inputs has run
        ready = [i for i in pending
                 if all(producer.get(u) in (None, i) or producer[u] in done for u in nodes[i].uids(nodes[i].reads))]
        if not ready:
            raise fail(NOT_SUP, attr, "OPERATIONGRAPH_CYCLE", f"OPS{sorted(pending)} depend on each other in a cycle")
        order += ready
        done.update(ready)
        pending = [i for i in pending if i not in done]
    user_uids = [t.uid for n in nodes for t in n.tensors.values()]
    ctx = Lowering(max(INTERNAL_UID_BASE, max(user_uids) + 1), frozenset(nodes[0].uids(nodes[0].reads) & nodes[0].uids(nodes[0].writes))
                   if inplace else frozenset())
    ops = [op for i in order for op in nodes[i].lower(ctx)]
    g = OperationGraph(ops, "backend")
    try:
        g.finalize()
    except GraphError as e:
        raise fail(NOT_SUP if e.status == "NOT_SUPPORTED" else BAD, attr, e.check, str(e)) from None
    externals = {t.uid: t for t in g.external_inputs()}
    externals.update({t.uid: t for t in g.external_outputs()})
    return GraphObj(handle, g, externals, ctx.scalars, ctx.aliases)


@dataclass
class EngineObj:
    graph_desc: BackendDescriptor
    graph: GraphObj
    index: int
    engine: object
    config: object


def _fin_engine(d):
    """002 §9.2.2: BAD_PARAM when the graph is not finalized, NOT_SUPPORTED when GLOBAL_INDEX is
    out of range or the engine cannot run the graph (the reason is in the message)."""
    gd = d.one("ENGINE_OPERATION_GRAPH")
    g = _finalized_obj(gd, "CUDNN_ATTR_ENGINE_OPERATION_GRAPH", "the operation graph")
    idx, lst = d.one("ENGINE_GLOBAL_INDEX"), g.engines()
    if not 0 <= idx < len(lst):
        extra = "; unusable here: " + "; ".join(f"{n}: {r}" for n, r in g.unusable) if g.unusable else ""
        raise fail(NOT_SUP, "CUDNN_ATTR_ENGINE_GLOBAL_INDEX", "ENGINE_GLOBAL_INDEX",
                   f"{idx} is outside 0..{len(lst) - 1} (CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT is {len(lst)}){extra}")
    eng, cfg = lst[idx]
    why = eng.check_support(g.ir, g.place)
    if why:
        raise fail(NOT_SUP, "CUDNN_ATTR_ENGINE_GLOBAL_INDEX", "ENGINE_SUPPORT", f"engine {idx} ({cfg}) cannot run this graph: {why}")
    return EngineObj(gd, g, idx, eng, cfg)


_KNOB_TYPES = ENUMS["cudnnBackendKnobType_t"]


def _knob_enum(name: str):
    v = _KNOB_TYPES.get("CUDNN_KNOB_TYPE_" + name)
    return None if v is None or name == "COUNTS" else v


@dataclass
class CfgObj:
    engine_desc: BackendDescriptor
    engine: EngineObj
    config: object


def _fin_enginecfg(d):
    """002 §9.2.3: the engine plus knob choices; NOT_SUPPORTED for a knob the engine does not
    have or a value outside its KNOB_INFO range (ours: the config's own value)."""
    ed = d.one("ENGINECFG_ENGINE")
    e = _finalized_obj(ed, "CUDNN_ATTR_ENGINECFG_ENGINE", "the engine")
    attr = "CUDNN_ATTR_ENGINECFG_KNOB_CHOICES"
    have = {_knob_enum(n): (n, v) for n, v in e.config.knobs if _knob_enum(n) is not None}
    chosen = set()
    for i, kd in enumerate(d.get("ENGINECFG_KNOB_CHOICES", [])):
        ktype, kval = _finalized_obj(kd, attr, f"KNOB_CHOICES[{i}]")
        kname = name_of("cudnnBackendKnobType_t", ktype)
        if ktype in chosen:
            raise fail(BAD, attr, "KNOB_CHOICE_DUPLICATE", f"{kname} is chosen twice")
        chosen.add(ktype)
        if ktype not in have:
            raise fail(NOT_SUP, attr, "KNOB_CHOICE_TYPE", f"engine {e.index} ({e.config}) has no knob {kname}")
        if kval != have[ktype][1]:
            raise fail(NOT_SUP, attr, "KNOB_CHOICE_VALUE",
                       f"{kname} = {kval} is outside engine {e.index}'s range [{have[ktype][1]}, {have[ktype][1]}]")
    return CfgObj(ed, e, e.config)


@dataclass
class PlanObj:
    handle: Handle
    cfg: CfgObj
    plan: object

    @property
    def graph(self) -> GraphObj:
        return self.cfg.engine.graph

    @property
    def place(self) -> str:
        return self.handle.place


def _fin_plan(d):
    """002 §9.2.5: configuring the engine builds the plan (000); NOT_SUPPORTED with the engine's
    reason when it declines."""
    try:
        h = resolve(d.one("EXECUTION_PLAN_HANDLE"), Handle, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE")
    except CuDNNError as e:
        raise fail(BAD, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE", "PLAN_HANDLE", e.rule) from None
    attr = "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG"
    c = _finalized_obj(d.one("EXECUTION_PLAN_ENGINE_CONFIG"), attr, "the engine config")
    g, eng = c.engine.graph, c.engine.engine
    if h.place != g.place:
        raise fail(NOT_SUP, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE", "PLAN_HANDLE_PLACE",
                   f"the handle runs on the {h.place} place but the operation graph's handle on the {g.place} place")
    why = eng.check_support(g.ir, g.place)
    if why is None:
        try:
            plan = eng.build(g.ir, c.config)
        except EngineDeclined as e:
            why = e.reason
    if why is not None:
        raise fail(NOT_SUP, attr, "ENGINE_SUPPORT", f"engine {c.engine.index} ({c.config}) declined the graph: {why}")
    plan.place, plan.declines = g.place, []
    return PlanObj(h, c, plan)


@dataclass
class HeurObj:
    graph_desc: BackendDescriptor
    graph: GraphObj
    results: list  # [(global index, engine, config)]


def _fin_heur(d):
    """002 §9.2.4 / 000 "Heuristics": INSTANT and A -> mode A, B -> B, FALLBACK -> FALLBACK."""
    gd = d.one("ENGINEHEUR_OPERATION_GRAPH")
    g = _finalized_obj(gd, "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH", "the operation graph")
    cfgs, _unusable = get_engine_configs(g.ir, g.place, A.HEUR_MODE_PLANNER[d.one("ENGINEHEUR_MODE")])
    return HeurObj(gd, g, [(g.index_of(e, c), e, c) for e, c in cfgs])


@dataclass
class PackObj:
    uids: list
    pointers: list
    workspace: object


def _fin_variant_pack(d):
    """002 §9.2.17: one data pointer per uid, uids distinct."""
    uids, ptrs = d.get("VARIANT_PACK_UNIQUE_IDS"), d.get("VARIANT_PACK_DATA_POINTERS")
    if len(uids) != len(ptrs):
        raise fail(BAD, "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS", "VARIANT_PACK_COUNT",
                   f"has {len(ptrs)} pointers but CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS has {len(uids)} uids")
    dup = sorted({u for u in uids if uids.count(u) > 1})
    if dup:
        raise fail(BAD, "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS", "VARIANT_PACK_UID_UNIQUE", f"uid(s) {dup} appear more than once")
    return PackObj(list(uids), list(ptrs), d.one("VARIANT_PACK_WORKSPACE"))


FINALIZE = {
    "TENSOR": _fin_tensor, "POINTWISE": _fin_pointwise, "CONVOLUTION": _fin_convolution, "MATMUL": _fin_matmul,
    "REDUCTION": _fin_reduction, "KNOB_CHOICE": _fin_knob_choice,
    "OPERATION_CONVOLUTION_FORWARD": _fin_conv_op, "OPERATION_CONVOLUTION_BACKWARD_DATA": _fin_conv_op,
    "OPERATION_CONVOLUTION_BACKWARD_FILTER": _fin_conv_op, "OPERATION_POINTWISE": _fin_pointwise_op,
    "OPERATION_MATMUL": _fin_matmul_op, "OPERATION_REDUCTION": _fin_reduction_op, "OPERATION_GEN_STATS": _fin_genstats_op,
    "OPERATION_BN_FINALIZE_STATISTICS": _fin_unlowered_op, "OPERATION_BN_BWD_WEIGHTS": _fin_unlowered_op,
    "OPERATIONGRAPH": _fin_graph, "ENGINE": _fin_engine, "ENGINECFG": _fin_enginecfg, "EXECUTION_PLAN": _fin_plan,
    "ENGINEHEUR": _fin_heur, "VARIANT_PACK": _fin_variant_pack,
}
assert set(FINALIZE) | set(A.READ_ONLY_TYPES) == set(A.DESCRIPTORS)


# -- get-only attributes ------------------------------------------------------------------------------

def _made(type_name: str, values: dict, obj, targets, i: int) -> BackendDescriptor:
    """A finalized descriptor holding ``values``: the caller's ``targets[i]`` when given (as C
    fills a caller-created array), else a new one."""
    t = A.DESC_TYPES[f"CUDNN_BACKEND_{type_name}_DESCRIPTOR"]
    if targets is not None and i < len(targets):
        d = _desc(targets[i], f"arrayOfElements[{i}]")
        if d.type_name != type_name:
            raise fail(BAD, "arrayOfElements", "DESCRIPTOR_TYPE",
                       f"element {i} is a CUDNN_BACKEND_{d.type_name}_DESCRIPTOR, not CUDNN_BACKEND_{type_name}_DESCRIPTOR")
        d.reset(t)
    else:
        d = BackendDescriptor(t)
    d.values.update(values)
    d.obj, d.finalized = obj, True
    return d


def _heur_results(d, n, targets):
    h, out = d.obj, []
    for i, (idx, eng, cfg) in enumerate(h.results[:n]):
        ed = _made("ENGINE", {"ENGINE_OPERATION_GRAPH": [h.graph_desc], "ENGINE_GLOBAL_INDEX": [idx]},
                   EngineObj(h.graph_desc, h.graph, idx, eng, cfg), None, 0)
        knobs = [_made("KNOB_CHOICE", {"KNOB_CHOICE_KNOB_TYPE": [_knob_enum(k)], "KNOB_CHOICE_KNOB_VALUE": [v]},
                       (_knob_enum(k), v), None, 0) for k, v in cfg.knobs if _knob_enum(k) is not None]
        out.append(_made("ENGINECFG", {"ENGINECFG_ENGINE": [ed], "ENGINECFG_KNOB_CHOICES": knobs},
                         CfgObj(ed, ed.obj, cfg), targets, i))
    return out + [None] * (len(h.results) - len(out))  # the count is the full number of results


_NOTES = ENUMS["cudnnBackendNumericalNote_t"]


def _numerical_notes(d, n, targets):
    notes = d.obj.config.notes
    out = [v for k, v in _NOTES.items() if k != "CUDNN_NUMERICAL_NOTE_TYPE_COUNT" and k[len("CUDNN_NUMERICAL_NOTE_"):] in notes]
    if _NOTES["CUDNN_NUMERICAL_NOTE_WINOGRAD"] not in out and any(s.startswith("WINOGRAD") for s in notes):
        out.append(_NOTES["CUDNN_NUMERICAL_NOTE_WINOGRAD"])
    return out


def _behavior_notes(d, n, targets):
    rc = ENUMS["cudnnBackendBehaviorNote_t"]["CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION"]
    return [rc] if "RUNTIME_COMPILATION" in d.obj.config.notes else []


def _knob_infos(d, n, targets):
    knobs = [(k, v) for k, v in d.obj.config.knobs if _knob_enum(k) is not None]
    out = []
    for i, (k, v) in enumerate(knobs[:n]):
        vals = {"KNOB_INFO_TYPE": [_knob_enum(k)], "KNOB_INFO_MAXIMUM_VALUE": [v], "KNOB_INFO_MINIMUM_VALUE": [v],
                "KNOB_INFO_STRIDE": [1]}
        out.append(_made("KNOB_INFO", vals, (k, v), targets, i))
    return out + [None] * (len(knobs) - len(out))


GETTERS = {
    "OPERATIONGRAPH_ENGINE_GLOBAL_COUNT": lambda d, n, t: [len(d.obj.engines())],
    "ENGINEHEUR_RESULTS": _heur_results,
    "ENGINE_NUMERICAL_NOTE": _numerical_notes,
    "ENGINE_BEHAVIOR_NOTE": _behavior_notes,
    "ENGINE_KNOB_INFO": _knob_infos,
    "ENGINE_LAYOUT_INFO": lambda d, n, t: [],  # no layout preference: every engine takes any strides
    "ENGINECFG_INTERMEDIATE_INFO": lambda d, n, t: [],  # 002: placeholder
    "EXECUTION_PLAN_WORKSPACE_SIZE": lambda d, n, t: [int(d.obj.plan.workspace_size)],
    "CONVOLUTION_SPATIAL_DIMS": lambda d, n, t: [d.obj["spatial_dims"]],
}
