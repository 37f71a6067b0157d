"""The convolution descriptor of the legacy API (002 §5.2.11, §5.2.12, §5.2.17, §5.2.18,
§5.2.25-§5.2.29, §5.2.33-§5.2.37): Create/Destroy, Set/Get (2d, Nd, group count, math type,
reorder type) and the forward output dims.  The compute calls and algorithm queries are
``convolution.api``; the output-size formula is ``cudnn_compat/_backend/ops/convolution.py``'s ``output_dims``.
"""
from __future__ import annotations

import ctypes

from cudnn_compat._backend.ops.convolution import output_dims
from .._core.data import POINTER_MIN
from .._core.descriptor import Descriptor, resolve
from .._core.lifecycle import pair
from .._core.registry import legacy
from ..enums import CONSTANTS, ENUMS, is_valid, name_of
from ..errors import bad_param, check, not_supported
from ..tensor import DTYPE_NAME, VECTOR_WIDTH, FilterDescriptor, tensor_desc

DIM_MAX = CONSTANTS["CUDNN_DIM_MAX"]
D = ENUMS["cudnnDataType_t"]
MODE = ENUMS["cudnnConvolutionMode_t"]
MATH = ENUMS["cudnnMathType_t"]


# -- convolution descriptor (002 §5.2.11, §5.2.12, §5.2.17, §5.2.25-§5.2.29, §5.2.33-§5.2.37) ------

class ConvolutionDescriptor(Descriptor):
    """cudnnConvolutionDescriptor_t: padding, stride, dilation per spatial dim, mode, compute
    type, group count, math type, reorder type."""

    kind = "cudnnConvolutionDescriptor_t"

    def __init__(self):
        super().__init__()
        self.pad, self.stride, self.dilation = (), (), ()
        self.mode, self.computeType = MODE["CUDNN_CONVOLUTION"], D["CUDNN_DATA_FLOAT"]
        self.groupCount, self.mathType = 1, MATH["CUDNN_DEFAULT_MATH"]
        self.reorderType = ENUMS["cudnnReorderType_t"]["CUDNN_DEFAULT_REORDER"]

    @property
    def arrayLength(self) -> int:
        return len(self.pad)

    def _settings(self):
        return (self.pad, self.stride, self.dilation, self.mode, self.computeType, self.groupCount,
                self.mathType, self.reorderType)

    def set(self, pad, stride, dilation, mode, computeType):
        self.pad, self.stride, self.dilation = tuple(pad), tuple(stride), tuple(dilation)
        self.mode, self.computeType = int(mode), int(computeType)
        self.touched()

    def changed(self):
        """An extra setting (group count, math, reorder) changed; does not mark the geometry set."""
        super().changed()

    @property
    def compute(self) -> "str | None":
        return DTYPE_NAME.get(self.computeType) if self.computeType not in VECTOR_WIDTH else None

    def attrs(self, algo_name: "str | None", math: int) -> dict:
        """The conv op attrs of ``cudnn_compat/_backend/ops/convolution.py``."""
        return {
            "mode": name_of("cudnnConvolutionMode_t", self.mode)[len("CUDNN_"):],
            "pre_padding": self.pad, "post_padding": self.pad, "stride": self.stride,
            "dilation": self.dilation, "groups": self.groupCount, "compute_type": self.compute,
            "math_type": name_of("cudnnMathType_t", math)[len("CUDNN_"):], "algo": algo_name,
        }


def conv_desc(arg, argname: str = "convDesc", need_set: bool = True) -> ConvolutionDescriptor:
    return resolve(arg, ConvolutionDescriptor, argname, need_set)


def _int_array(value, n: int, argname: str) -> tuple:
    """``n`` ints from a sequence or from a host pointer to int32 (as CuPy 13 passed them)."""
    if isinstance(value, int) and not isinstance(value, bool):
        check(value >= POINTER_MIN, argname, "is NULL or not a host pointer")
        return tuple((ctypes.c_int * n).from_address(value))
    try:
        vals = [int(v) for v in list(value)[:n]]
    except TypeError:
        raise bad_param(argname, f"must be a sequence of ints or a host pointer, got {type(value).__name__}") from None
    check(len(vals) == n, argname, f"must hold arrayLength={n} entries, got {len(vals)}")
    return tuple(vals)


def _check_geometry(pad, stride, dilation, mode, computeType, names=("padA", "filterStrideA", "dilationA")):
    check(all(p >= 0 for p in pad), names[0], f"padding must not be negative, got {tuple(pad)}")
    check(all(s > 0 for s in stride), names[1], f"strides must be positive, got {tuple(stride)}")
    check(all(d > 0 for d in dilation), names[2], f"dilations must be positive, got {tuple(dilation)}")
    check(is_valid("cudnnConvolutionMode_t", mode), "mode", f"{mode!r} is not a cudnnConvolutionMode_t")
    check(is_valid("cudnnDataType_t", computeType), "computeType", f"{computeType!r} is not a cudnnDataType_t")


createConvolutionDescriptor, destroyConvolutionDescriptor = pair(ConvolutionDescriptor, __name__)


@legacy("cudnnSetConvolution2dDescriptor")
def setConvolution2dDescriptor(convDesc, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, computeType) -> None:
    """002 §5.2.33: u/v are the vertical/horizontal strides."""
    d = conv_desc(convDesc, need_set=False)
    pad, stride, dil = (int(pad_h), int(pad_w)), (int(u), int(v)), (int(dilation_h), int(dilation_w))
    _check_geometry(pad, stride, dil, mode, computeType, ("pad_h,pad_w", "u,v", "dilation_h,dilation_w"))
    d.set(pad, stride, dil, mode, computeType)


@legacy("cudnnGetConvolution2dDescriptor")
def getConvolution2dDescriptor(convDesc) -> tuple:
    """(pad_h, pad_w, u, v, dilation_h, dilation_w, mode, computeType)"""
    d = conv_desc(convDesc)
    check(d.arrayLength == 2, "convDesc", f"is a {d.arrayLength}-d convolution; this query needs a 2-d one")
    return d.pad + d.stride + d.dilation + (d.mode, d.computeType)


@legacy("cudnnSetConvolutionNdDescriptor")
def setConvolutionNdDescriptor(convDesc, arrayLength, padA, filterStrideA, dilationA, mode, computeType) -> None:
    """002 §5.2.36; the arrays may be sequences or host pointers to int32."""
    d = conv_desc(convDesc, need_set=False)
    check(isinstance(arrayLength, int) and arrayLength > 0, "arrayLength", f"must be a positive int, got {arrayLength!r}")
    if arrayLength > DIM_MAX:
        raise not_supported("arrayLength", f"{arrayLength} exceeds CUDNN_DIM_MAX={DIM_MAX}")
    pad = _int_array(padA, arrayLength, "padA")
    stride = _int_array(filterStrideA, arrayLength, "filterStrideA")
    dil = _int_array(dilationA, arrayLength, "dilationA")
    _check_geometry(pad, stride, dil, mode, computeType)
    d.set(pad, stride, dil, mode, computeType)


@legacy("cudnnGetConvolutionNdDescriptor")
def getConvolutionNdDescriptor(convDesc, arrayLengthRequested: int = DIM_MAX - 2) -> tuple:
    """(arrayLength, padA, filterStrideA, dilationA, mode, computeType); lists hold
    min(arrayLengthRequested, arrayLength) entries."""
    d = conv_desc(convDesc)
    check(arrayLengthRequested >= 0, "arrayLengthRequested", "must not be negative")
    if arrayLengthRequested > DIM_MAX - 2:
        raise not_supported("arrayLengthRequested", f"must be <= CUDNN_DIM_MAX-2={DIM_MAX - 2}")
    k = min(arrayLengthRequested, d.arrayLength)
    return d.arrayLength, list(d.pad[:k]), list(d.stride[:k]), list(d.dilation[:k]), d.mode, d.computeType


@legacy("cudnnSetConvolutionGroupCount")
def setConvolutionGroupCount(convDesc, groupCount: int) -> None:
    """Set the number of groups of a grouped convolution (002 §5.2.34)."""
    d = conv_desc(convDesc, need_set=False)
    check(isinstance(groupCount, int) and groupCount >= 1, "groupCount", f"must be an int >= 1, got {groupCount!r}")
    d.groupCount = int(groupCount)
    d.changed()


@legacy("cudnnGetConvolutionGroupCount")
def getConvolutionGroupCount(convDesc) -> int:
    """The group count of a convolution descriptor (002 §5.2.25)."""
    return conv_desc(convDesc, need_set=False).groupCount


@legacy("cudnnSetConvolutionMathType")
def setConvolutionMathType(convDesc, mathType) -> None:
    """Set the math type (Tensor Core policy) of a convolution descriptor (002 §5.2.35)."""
    d = conv_desc(convDesc, need_set=False)
    check(is_valid("cudnnMathType_t", mathType), "mathType", f"{mathType!r} is not a cudnnMathType_t")
    d.mathType = int(mathType)
    d.changed()


@legacy("cudnnGetConvolutionMathType")
def getConvolutionMathType(convDesc) -> int:
    """The math type of a convolution descriptor (002 §5.2.26)."""
    return conv_desc(convDesc, need_set=False).mathType


@legacy("cudnnSetConvolutionReorderType")
def setConvolutionReorderType(convDesc, reorderType) -> None:
    """Set the filter/bias reorder type of a convolution descriptor (002 §5.2.37)."""
    d = conv_desc(convDesc, need_set=False)
    check(is_valid("cudnnReorderType_t", reorderType), "reorderType", f"{reorderType!r} is not a cudnnReorderType_t")
    d.reorderType = int(reorderType)
    d.changed()


@legacy("cudnnGetConvolutionReorderType")
def getConvolutionReorderType(convDesc) -> int:
    """The reorder type of a convolution descriptor (002 §5.2.29)."""
    return conv_desc(convDesc, need_set=False).reorderType


# -- output dims (002 §5.2.18, §5.2.28) -------------------------------------------------------------

def _output_dims(cd, xd, wd, names=("inputTensorDesc", "filterDesc")) -> tuple:
    """(N, K, *O); BAD_PARAM for rank, feature-map and filter-size mismatches."""
    xn, wn = names
    check(wd.nbDims == xd.nbDims, wn, f"has {wd.nbDims} dims but {xn} has {xd.nbDims}")
    check(xd.nbDims >= 3, xn, f"needs at least 3 dims, got {xd.nbDims}")
    check(cd.arrayLength == xd.nbDims - 2, "convDesc",
          f"is a {cd.arrayLength}-d convolution but {xn} has {xd.nbDims} dims (arrayLength must be nbDims-2)")
    g = cd.groupCount
    check(xd.dims[1] == wd.dims[1] * g, wn,
          f"feature maps disagree: {xn} has C={xd.dims[1]}, {wn} has C={wd.dims[1]} per group x groupCount={g}")
    for i, (s, r, p, dl) in enumerate(zip(xd.dims[2:], wd.dims[2:], cd.pad, cd.dilation)):
        eff = (r - 1) * dl + 1
        check(eff <= s + 2 * p, wn, f"dilated filter dim {i} ({eff}) is larger than the padded input ({s + 2 * p})")
    return output_dims(xd.dims, wd.dims, cd.pad, cd.pad, cd.stride, cd.dilation)


@legacy("cudnnGetConvolution2dForwardOutputDim")
def getConvolution2dForwardOutputDim(convDesc, inputTensorDesc, filterDesc) -> tuple:
    """(n, c, h, w) of the forward output (002 §5.2.18)."""
    cd = conv_desc(convDesc)
    xd = tensor_desc(inputTensorDesc, "inputTensorDesc")
    wd = resolve(filterDesc, FilterDescriptor, "filterDesc")
    check(xd.nbDims == 4, "inputTensorDesc", f"must be 4-d for a 2-d convolution, got {xd.nbDims} dims")
    return _output_dims(cd, xd, wd)


@legacy("cudnnGetConvolutionNdForwardOutputDim")
def getConvolutionNdForwardOutputDim(convDesc, inputTensorDesc, filterDesc, nbDims: int) -> list:
    """The first ``nbDims`` dims (N, K, *O) of the forward output (002 §5.2.28)."""
    cd = conv_desc(convDesc)
    xd = tensor_desc(inputTensorDesc, "inputTensorDesc")
    wd = resolve(filterDesc, FilterDescriptor, "filterDesc")
    check(isinstance(nbDims, int) and 0 <= nbDims <= xd.nbDims, "nbDims",
          f"must be in [0, {xd.nbDims}] (the input's dims), got {nbDims!r}")
    return list(_output_dims(cd, xd, wd)[:nbDims])
