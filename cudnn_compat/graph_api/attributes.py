"""The backend API's attribute table (002 ch. 9 "Backend Descriptor Types", §5.1.3.1
cudnnBackendAttributeName_t, §9.1.1 cudnnBackendAttributeType_t; the public cuDNN 8.2.1
``cudnn_backend.h`` for the values 002 omits).

``ATTRIBUTE_NAMES`` is cudnnBackendAttributeName_t with the header's values (every name is
also a module constant).  Where 002 spells a name differently from the header (inventory
§2.19), both spellings are constants with the same value: ``CUDNN_ATTR_CONVOLUTION_MODE``
(ch. 9 text) = ``CUDNN_ATTR_CONVOLUTION_CONV_MODE``, ``..._PRE_PADDING``/``..._POST_PADDING``
(§5.1.3.1) = ``..._PRE_PADDINGS``/``..._POST_PADDINGS``, and ``CUDNN_TYPE_BOOL`` (§9.2.16) =
``CUDNN_TYPE_BOOLEAN``.  ``CUDNN_HEUR_MODE_FALLBACK`` (2) and ``CUDNN_HEUR_MODE_A`` (3) are
the values cuDNN 8.3+ headers give the modes 000 describes (8.2 has INSTANT, B only).

``DESCRIPTORS[type name]`` lists, per descriptor type, its attributes as ``Attr`` records:
accepted attribute types, element-count range, and whether the attribute is required (R),
optional (O), get-only (G) or a placeholder cuDNN does not support setting (P).
``parse_elements`` applies SetAttribute's per-type value rules (BAD_PARAM on a bad value).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from cudnn_compat._backend.attribute_names import V8, names as _attribute_names
from ..enums import CONSTANTS, ENUMS, is_valid
from .._core.data import HOST_ADDRESS_MIN

MAX_DIMS = CONSTANTS["CUDNN_DIM_MAX"]  # CUDNN_MAX_DIMS of ch. 9

# -- cudnnBackendAttributeName_t (8.2.1 header values; the table is _backend.attribute_names) ----------
ATTRIBUTE_NAMES: dict = {"CUDNN_ATTR_" + n: v for n, v in _attribute_names(V8).items()}
ATTR_NAME_OF = {v: k for k, v in ATTRIBUTE_NAMES.items()}  # value -> the header's spelling
# 002's spellings (inventory §2.19), same values; listed after the header's so name_of prefers those.
ATTRIBUTE_NAMES.update({
    "CUDNN_ATTR_CONVOLUTION_MODE": 101,
    "CUDNN_ATTR_CONVOLUTION_POST_PADDING": 104,
    "CUDNN_ATTR_CONVOLUTION_PRE_PADDING": 105,
})

TYPES = ENUMS["cudnnBackendAttributeType_t"]
TYPE_NAME = {v: k[len("CUDNN_TYPE_"):] for k, v in TYPES.items()}
DESC_TYPES = ENUMS["cudnnBackendDescriptorType_t"]
DESC_NAME = {v: k[len("CUDNN_BACKEND_"):-len("_DESCRIPTOR")] for k, v in DESC_TYPES.items()}

# cudnnBackendHeurMode_t: 8.2 INSTANT/B; FALLBACK and A as in cuDNN >= 8.3 (000 modes).
HEUR_MODES = {"CUDNN_HEUR_MODE_INSTANT": 0, "CUDNN_HEUR_MODE_B": 1, "CUDNN_HEUR_MODE_FALLBACK": 2,
              "CUDNN_HEUR_MODE_A": 3}
HEUR_MODE_PLANNER = {0: "A", 1: "B", 2: "FALLBACK", 3: "A"}  # -> _backend.heuristics modes

EXTRA_CONSTANTS = dict(HEUR_MODES, CUDNN_TYPE_BOOL=TYPES["CUDNN_TYPE_BOOLEAN"])

# attribute type -> the enum type its values belong to
ENUM_OF_TYPE = {
    "DATA_TYPE": "cudnnDataType_t", "CONVOLUTION_MODE": "cudnnConvolutionMode_t",
    "KNOB_TYPE": "cudnnBackendKnobType_t", "NAN_PROPOGATION": "cudnnNanPropagation_t",
    "NUMERICAL_NOTE": "cudnnBackendNumericalNote_t", "LAYOUT_TYPE": "cudnnBackendLayoutType_t",
    "ATTRIB_NAME": "cudnnBackendAttributeName_t", "POINTWISE_MODE": "cudnnPointwiseMode_t",
    "GENSTATS_MODE": "cudnnGenStatsMode_t", "BN_FINALIZE_STATS_MODE": "cudnnBnFinalizeStatsMode_t",
    "REDUCTION_OPERATOR_TYPE": "cudnnReduceTensorOp_t", "BEHAVIOR_NOTE": "cudnnBackendBehaviorNote_t",
}
_COUNT_SENTINELS = {"CUDNN_KNOB_TYPE_COUNTS", "CUDNN_NUMERICAL_NOTE_TYPE_COUNT", "CUDNN_LAYOUT_TYPE_COUNT",
                    "CUDNN_BEHAVIOR_NOTE_TYPE_COUNT"}


@dataclass(frozen=True)
class Attr:
    """One attribute of one descriptor type (002 ch. 9 bullet lists)."""

    name: str  # header spelling, without CUDNN_ATTR_
    types: tuple  # accepted cudnnBackendAttributeType_t names, without CUDNN_TYPE_
    count: tuple  # (min, max) element count; max None = unbounded
    need: str  # R required, O optional, G get-only, P placeholder (setting elements: NOT_SUPPORTED)
    kinds: tuple = ()  # BACKEND_DESCRIPTOR: the descriptor types allowed (DESC_NAME form)
    default: tuple = ()  # the values GetAttribute returns when an O attribute was not set
    parse: str = ""  # how values are read, when it differs from the type (002 erratum types)

    @property
    def full(self) -> str:
        return "CUDNN_ATTR_" + self.name

    @property
    def value(self) -> int:
        return ATTRIBUTE_NAMES[self.full]


def _a(name, types, count=1, need="R", kinds=(), default=(), parse=""):
    types = tuple(types.split("|"))
    count = (count, count) if isinstance(count, int) else count
    return Attr(name, types, count, need, tuple(kinds.split()) if isinstance(kinds, str) else kinds, default, parse)


BD, FD = "BACKEND_DESCRIPTOR", "FLOAT|DOUBLE"
ANY = (0, None)
DIMS = (1, MAX_DIMS)
OPS = ("OPERATION_CONVOLUTION_FORWARD OPERATION_CONVOLUTION_BACKWARD_FILTER OPERATION_CONVOLUTION_BACKWARD_DATA "
       "OPERATION_POINTWISE OPERATION_GEN_STATS OPERATION_MATMUL OPERATION_BN_FINALIZE_STATISTICS "
       "OPERATION_REDUCTION OPERATION_BN_BWD_WEIGHTS")


def _conv_op(prefix, x, w, y):
    return [_a(prefix + "ALPHA", FD, (1, None)), _a(prefix + "BETA", FD, (1, None)),
            _a(prefix + "CONV_DESC", BD, kinds="CONVOLUTION")] + \
           [_a(prefix + r, BD, kinds="TENSOR") for r in (x, w, y)]


_BN_FINALIZE_TENSORS = ("Y_SUM_DESC Y_SQ_SUM_DESC SCALE_DESC BIAS_DESC PREV_RUNNING_MEAN_DESC PREV_RUNNING_VAR_DESC "
                        "UPDATED_RUNNING_MEAN_DESC UPDATED_RUNNING_VAR_DESC SAVED_MEAN_DESC SAVED_INV_STD_DESC "
                        "EQ_SCALE_DESC EQ_BIAS_DESC ACCUM_COUNT_DESC EPSILON_DESC EXP_AVERATE_FACTOR_DESC")
_BN_BWD_TENSORS = ("MEAN_DESC INVSTD_DESC BN_SCALE_DESC X_DESC DY_DESC DBN_SCALE_DESC DBN_BIAS_DESC "
                   "EQ_DY_SCALE_DESC EQ_X_SCALE_DESC EQ_BIAS")

_TABLE = {
    "POINTWISE": [
        _a("POINTWISE_MODE", "POINTWISE_MODE"), _a("POINTWISE_MATH_PREC", "DATA_TYPE"),
        _a("POINTWISE_NAN_PROPAGATION", "NAN_PROPOGATION", need="O"),
        _a("POINTWISE_RELU_LOWER_CLIP", FD, need="O"), _a("POINTWISE_RELU_UPPER_CLIP", FD, need="O"),
        _a("POINTWISE_RELU_LOWER_CLIP_SLOPE", FD, need="O"), _a("POINTWISE_ELU_ALPHA", FD, need="O", default=(1.0,)),
        _a("POINTWISE_SOFTPLUS_BETA", FD, need="O", default=(1.0,)),
        _a("POINTWISE_SWISH_BETA", FD, need="O", default=(1.0,)),
    ],
    "CONVOLUTION": [
        _a("CONVOLUTION_COMP_TYPE", "DATA_TYPE"), _a("CONVOLUTION_CONV_MODE", "CONVOLUTION_MODE"),
        _a("CONVOLUTION_DILATIONS", "INT64", DIMS), _a("CONVOLUTION_FILTER_STRIDES", "INT64", DIMS),
        _a("CONVOLUTION_POST_PADDINGS", "INT64", DIMS), _a("CONVOLUTION_PRE_PADDINGS", "INT64", DIMS),
        # not in 002's §9.2.1 list, but its finalize rule and example use it (and 004 confirms: a count)
        _a("CONVOLUTION_SPATIAL_DIMS", "INT64", need="O"),
    ],
    "ENGINE": [
        _a("ENGINE_OPERATION_GRAPH", BD, kinds="OPERATIONGRAPH"), _a("ENGINE_GLOBAL_INDEX", "INT64"),
        _a("ENGINE_KNOB_INFO", BD, ANY, "G", kinds="KNOB_INFO"), _a("ENGINE_NUMERICAL_NOTE", "NUMERICAL_NOTE", ANY, "G"),
        _a("ENGINE_LAYOUT_INFO", BD, ANY, "G", kinds="LAYOUT_INFO"), _a("ENGINE_BEHAVIOR_NOTE", "BEHAVIOR_NOTE", ANY, "G"),
    ],
    "ENGINECFG": [
        _a("ENGINECFG_ENGINE", BD, kinds="ENGINE"),
        _a("ENGINECFG_INTERMEDIATE_INFO", BD, ANY, "G", kinds="INTERMEDIATE_INFO"),
        # "required" in 002 but may hold zero elements, and 002's own §9.3.2 never sets it
        _a("ENGINECFG_KNOB_CHOICES", BD, ANY, "O", kinds="KNOB_CHOICE"),
    ],
    "ENGINEHEUR": [
        _a("ENGINEHEUR_MODE", "HEUR_MODE"), _a("ENGINEHEUR_OPERATION_GRAPH", BD, kinds="OPERATIONGRAPH"),
        _a("ENGINEHEUR_RESULTS", BD, ANY, "G", kinds="ENGINECFG"),
    ],
    "EXECUTION_PLAN": [
        _a("EXECUTION_PLAN_HANDLE", "HANDLE"), _a("EXECUTION_PLAN_ENGINE_CONFIG", BD, kinds="ENGINECFG"),
        _a("EXECUTION_PLAN_WORKSPACE_SIZE", "INT64", 1, "G"),
        _a("EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS", "INT64", ANY, "P"),
        _a("EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS", "INT64", ANY, "P"),
    ],
    "INTERMEDIATE_INFO": [
        _a("INTERMEDIATE_INFO_UNIQUE_ID", "INT64", 1, "G"), _a("INTERMEDIATE_INFO_SIZE", "INT64", 1, "G"),
        _a("INTERMEDIATE_INFO_DEPENDENT_DATA_UIDS", "INT64", ANY, "G"),
        _a("INTERMEDIATE_INFO_DEPENDENT_ATTRIBUTES", "ATTRIB_NAME", ANY, "G"),
    ],
    "KNOB_CHOICE": [_a("KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE"), _a("KNOB_CHOICE_KNOB_VALUE", "INT64")],
    "KNOB_INFO": [_a("KNOB_INFO_TYPE", "KNOB_TYPE", 1, "G"), _a("KNOB_INFO_MAXIMUM_VALUE", "INT64", 1, "G"),
                  _a("KNOB_INFO_MINIMUM_VALUE", "INT64", 1, "G"), _a("KNOB_INFO_STRIDE", "INT64", 1, "G")],
    "LAYOUT_INFO": [_a("LAYOUT_INFO_TENSOR_UID", "INT64", 1, "G"), _a("LAYOUT_INFO_TYPES", "LAYOUT_TYPE", ANY, "G")],
    "OPERATION_CONVOLUTION_FORWARD": _conv_op("OPERATION_CONVOLUTION_FORWARD_", "X", "W", "Y"),
    "OPERATION_CONVOLUTION_BACKWARD_DATA": _conv_op("OPERATION_CONVOLUTION_BWD_DATA_", "DX", "W", "DY"),
    "OPERATION_CONVOLUTION_BACKWARD_FILTER": _conv_op("OPERATION_CONVOLUTION_BWD_FILTER_", "X", "DW", "DY"),
    "OPERATION_POINTWISE": [
        _a("OPERATION_POINTWISE_PW_DESCRIPTOR", BD, kinds="POINTWISE"),
        _a("OPERATION_POINTWISE_XDESC", BD, kinds="TENSOR"),
        _a("OPERATION_POINTWISE_BDESC", BD, need="O", kinds="TENSOR"),
        _a("OPERATION_POINTWISE_YDESC", BD, need="O", kinds="TENSOR"),
        _a("OPERATION_POINTWISE_ALPHA1", FD, need="O", default=(1.0,)),
        _a("OPERATION_POINTWISE_ALPHA2", FD, need="O", default=(1.0,)),
        _a("OPERATION_POINTWISE_DXDESC", BD, need="O", kinds="TENSOR"),
        _a("OPERATION_POINTWISE_DYDESC", BD, need="O", kinds="TENSOR"),
    ],
    "OPERATION_GEN_STATS": [
        _a("OPERATION_GENSTATS_MODE", "GENSTATS_MODE"), _a("OPERATION_GENSTATS_MATH_PREC", "DATA_TYPE"),
        _a("OPERATION_GENSTATS_XDESC", BD, kinds="TENSOR"), _a("OPERATION_GENSTATS_SUMDESC", BD, kinds="TENSOR"),
        _a("OPERATION_GENSTATS_SQSUMDESC", BD, kinds="TENSOR"),
    ],
    "OPERATIONGRAPH": [
        # 002 §9.2.15 types it CUDNN_TYPE_DATA_TYPE (erratum): accepted, the value is still a handle
        _a("OPERATIONGRAPH_HANDLE", "HANDLE|DATA_TYPE", parse="HANDLE"),
        _a("OPERATIONGRAPH_OPS", BD, (1, None), kinds=OPS),
        _a("OPERATIONGRAPH_ENGINE_GLOBAL_COUNT", "INT64", 1, "G"),
    ],
    "TENSOR": [
        _a("TENSOR_BYTE_ALIGNMENT", "INT64"), _a("TENSOR_DATA_TYPE", "DATA_TYPE"),
        _a("TENSOR_DIMENSIONS", "INT64", DIMS), _a("TENSOR_STRIDES", "INT64", DIMS),
        _a("TENSOR_VECTOR_COUNT", "INT64", need="O", default=(1,)),
        _a("TENSOR_VECTORIZED_DIMENSION", "INT64", need="O"),
        _a("TENSOR_UNIQUE_ID", "INT64"),
        _a("TENSOR_IS_VIRTUAL", "BOOLEAN", need="O", default=(False,)),
        _a("TENSOR_IS_BY_VALUE", "BOOLEAN", need="O", default=(False,)),
    ],
    "VARIANT_PACK": [
        _a("VARIANT_PACK_UNIQUE_IDS", "INT64", ANY), _a("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", ANY),
        _a("VARIANT_PACK_INTERMEDIATES", "VOID_PTR", ANY, "P"), _a("VARIANT_PACK_WORKSPACE", "VOID_PTR"),
    ],
    "MATMUL": [_a("MATMUL_COMP_TYPE", "DATA_TYPE")],
    "OPERATION_MATMUL": [
        _a("OPERATION_MATMUL_ADESC", BD, kinds="TENSOR"), _a("OPERATION_MATMUL_BDESC", BD, kinds="TENSOR"),
        _a("OPERATION_MATMUL_CDESC", BD, kinds="TENSOR"), _a("OPERATION_MATMUL_DESC", BD, kinds="MATMUL"),
        _a("OPERATION_MATMUL_IRREGULARLY_STRIDED_BATCH_COUNT", "INT64", need="O"),
    ],
    "OPERATION_BN_FINALIZE_STATISTICS": [
        _a("OPERATION_BN_FINALIZE_STATS_MODE", "BN_FINALIZE_STATS_MODE"), _a("OPERATION_BN_FINALIZE_MATH_PREC", "DATA_TYPE"),
    ] + [_a("OPERATION_BN_FINALIZE_" + n, BD, need="O", kinds="TENSOR") for n in _BN_FINALIZE_TENSORS.split()],
    "REDUCTION": [_a("REDUCTION_OPERATOR", "REDUCTION_OPERATOR_TYPE"), _a("REDUCTION_COMP_TYPE", "DATA_TYPE")],
    "OPERATION_REDUCTION": [
        _a("OPERATION_REDUCTION_XDESC", BD, kinds="TENSOR"), _a("OPERATION_REDUCTION_YDESC", BD, kinds="TENSOR"),
        _a("OPERATION_REDUCTION_DESC", BD, kinds="REDUCTION"),
    ],
    "OPERATION_BN_BWD_WEIGHTS": [_a("OPERATION_BN_BWD_WEIGHTS_MATH_PREC", "DATA_TYPE")] +
                                [_a("OPERATION_BN_BWD_WEIGHTS_" + n, BD, need="O", kinds="TENSOR") for n in _BN_BWD_TENSORS.split()],
}

# descriptor type name -> {attribute value: Attr}
DESCRIPTORS: dict = {k: {a.value: a for a in v} for k, v in _TABLE.items()}
assert set(DESCRIPTORS) == set(DESC_NAME.values()), "every descriptor type has an attribute table"
OWNER = {a.value: k for k, v in DESCRIPTORS.items() for a in v.values()}  # attribute -> its descriptor type
READ_ONLY_TYPES = ("INTERMEDIATE_INFO", "KNOB_INFO", "LAYOUT_INFO")  # users cannot set or finalize them


class BadValue(Exception):
    """A value SetAttribute must reject: ``index`` of the element and the rule broken."""

    def __init__(self, index: int, rule: str):
        super().__init__(rule)
        self.index = index
        self.rule = rule


def elements(array, count: int, type_name: str) -> list:
    """The first ``count`` elements of ``arrayOfElements`` (a sequence, or one value; for
    VOID_PTR only a list/tuple is an array, since a NumPy array is itself one data pointer)."""
    if type_name == "VOID_PTR":
        seq = list(array) if isinstance(array, (list, tuple)) else [array]
    elif isinstance(array, (list, tuple)):
        seq = list(array)
    elif isinstance(array, np.ndarray):
        seq = array.reshape(-1).tolist()
    elif array is None and count == 0:
        seq = []
    else:
        seq = [array]
    if len(seq) < count:
        raise BadValue(len(seq), f"elementCount is {count} but arrayOfElements holds {len(seq)} element(s)")
    return seq[:count]


def _int(v, i):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer)):
        raise BadValue(i, f"element {i} must be an int, got {v!r}")
    v = int(v)
    if not -2 ** 63 <= v < 2 ** 63:
        raise BadValue(i, f"element {i} ({v}) is out of the int64_t range")
    return v


def parse_value(v, i: int, type_name: str):
    """One element of SetAttribute's array as the attribute type says (002 Table 41).
    HANDLE and BACKEND_DESCRIPTOR elements are resolved by the caller."""
    if type_name == "INT64":
        return _int(v, i)
    if type_name in ("FLOAT", "DOUBLE"):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.floating, np.integer)):
            raise BadValue(i, f"element {i} must be a number, got {v!r}")
        if isinstance(v, (numbers.Integral, np.integer)) and not -HOST_ADDRESS_MIN < v < HOST_ADDRESS_MIN:
            raise BadValue(i, f"element {i} is the int {v}, which looks like a host address, not a value "
                              f"(|value| >= 2^31); pass the number itself, or a list or NumPy array of the values")
        return float(np.float32(v)) if type_name == "FLOAT" else float(v)
    if type_name == "BOOLEAN":
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, (numbers.Integral, np.integer)) and int(v) in (0, 1)):
            return bool(v)
        raise BadValue(i, f"element {i} must be a bool, got {v!r}")
    if type_name == "VOID_PTR":
        return v
    if type_name == "HEUR_MODE":
        v = _int(v, i)
        if v not in HEUR_MODES.values():
            raise BadValue(i, f"element {i} ({v}) is not a cudnnBackendHeurMode_t (INSTANT 0, B 1, FALLBACK 2, A 3)")
        return v
    enum = ENUM_OF_TYPE.get(type_name)
    if enum is not None:
        v = _int(v, i)
        names = [k for k, x in ENUMS[enum].items() if x == v and k not in _COUNT_SENTINELS]
        if not is_valid(enum, v) or not names:
            raise BadValue(i, f"element {i} ({v}) is not a valid {enum}")
        return v
    raise BadValue(i, f"attribute type {type_name} cannot be set")  # pragma: no cover


# The attribute-name enum joins the others (enums.py leaves it to this module), so
# ``cudnn_compat.CUDNN_ATTR_*`` and ``ENUMS["cudnnBackendAttributeName_t"]`` exist.
ENUMS.setdefault("cudnnBackendAttributeName_t", ATTRIBUTE_NAMES)
