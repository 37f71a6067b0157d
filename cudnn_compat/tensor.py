"""Tensor and filter descriptors (002 §3.2.16/§3.2.10 Create, §3.2.83-§3.2.86
SetTensor4d/4dEx/Nd/NdEx, §3.2.58/§3.2.59 Get, §3.2.62 GetTensorSizeInBytes,
§3.2.80/§3.2.82 SetFilter4d/Nd, §3.2.52/§3.2.53 GetFilter4d/Nd).

Dims are kept in cuDNN's logical order (N, C, [D,] H, W for tensors; K, C, [D,] R, S
for filters) and layouts are expressed by element strides, which is what the graph
layer's tensors carry.
"""
from __future__ import annotations

import numbers

from cudnn_compat._backend.ir import Tensor
from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.registry import legacy
from .enums import CONSTANTS, ENUMS, is_valid, name_of
from .errors import bad_param, check, not_supported

DIM_MAX = CONSTANTS["CUDNN_DIM_MAX"]
D = ENUMS["cudnnDataType_t"]
F = ENUMS["cudnnTensorFormat_t"]

# cudnnDataType_t -> IR dtype name; vector types map to their scalar and a vector width.
DTYPE_NAME = {
    D["CUDNN_DATA_FLOAT"]: "float32", D["CUDNN_DATA_DOUBLE"]: "float64", D["CUDNN_DATA_HALF"]: "float16",
    D["CUDNN_DATA_BFLOAT16"]: "bfloat16", D["CUDNN_DATA_INT8"]: "int8", D["CUDNN_DATA_UINT8"]: "uint8",
    D["CUDNN_DATA_INT32"]: "int32", D["CUDNN_DATA_INT64"]: "int64",
    D["CUDNN_DATA_INT8x4"]: "int8", D["CUDNN_DATA_UINT8x4"]: "uint8", D["CUDNN_DATA_INT8x32"]: "int8",
}
VECTOR_WIDTH = {D["CUDNN_DATA_INT8x4"]: 4, D["CUDNN_DATA_UINT8x4"]: 4, D["CUDNN_DATA_INT8x32"]: 32}
MAX_ELEMENTS = 2 ** 31  # 002 §2.2: a tensor must span fewer than 2 giga-elements (libcudnn refuses 2^31)


def packed_strides(fmt: int, dims) -> list:
    """Strides of a fully packed tensor of ``dims`` (logical N, C, spatial...) in ``fmt``."""
    n = len(dims)
    if fmt == F["CUDNN_TENSOR_NHWC"]:
        order = [0] + list(range(2, n)) + [1]  # outermost to innermost: N, spatial..., C
    else:
        order = list(range(n))
    strides, acc = [0] * n, 1
    for axis in reversed(order):
        strides[axis] = acc
        acc *= dims[axis]
    return strides


def _check_dtype(dataType, argname="dataType"):
    check(is_valid("cudnnDataType_t", dataType), argname, f"{dataType!r} is not a cudnnDataType_t")


def _check_format(fmt, argname="format"):
    check(is_valid("cudnnTensorFormat_t", fmt), argname, f"{fmt!r} is not a cudnnTensorFormat_t")


def _check_vect(fmt, dataType, c):
    vect = fmt == F["CUDNN_TENSOR_NCHW_VECT_C"]
    width = VECTOR_WIDTH.get(int(dataType))
    check(vect == (width is not None), "format",
          f"CUDNN_TENSOR_NCHW_VECT_C goes with the vector types INT8x4/UINT8x4/INT8x32 only "
          f"(format {name_of('cudnnTensorFormat_t', fmt)}, dataType {name_of('cudnnDataType_t', dataType)})")
    if width:
        check(c % width == 0, "c", f"must be a multiple of the vector width {width}")


class TensorDescriptor(Descriptor):
    kind = "cudnnTensorDescriptor_t"

    def __init__(self):
        super().__init__()
        self.dataType, self.format, self.dims, self.strides = D["CUDNN_DATA_FLOAT"], F["CUDNN_TENSOR_NCHW"], (), ()

    def _settings(self):
        return (self.dataType, self.format, self.dims, self.strides)

    def set(self, dataType, fmt, dims, strides):
        self.dataType, self.format = int(dataType), int(fmt)
        self.dims, self.strides = tuple(int(d) for d in dims), tuple(int(s) for s in strides)
        self.touched()

    @property
    def dtype(self) -> str:
        return DTYPE_NAME[self.dataType]

    @property
    def nbDims(self) -> int:
        return len(self.dims)

    def ir(self, uid: int, argname: str = "desc") -> Tensor:
        """This descriptor as a graph tensor."""
        if self.dataType in VECTOR_WIDTH:
            raise not_supported(argname, "NCHW_VECT_C vector data types are not supported by the graph layer")
        return Tensor(uid, self.dims, self.strides, self.dtype, name=argname)


class FilterDescriptor(TensorDescriptor):
    kind = "cudnnFilterDescriptor_t"


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _seq(arg, n: int, argname: str) -> list:
    """The first ``n`` entries of an int[] argument; BAD_PARAM when it is not a sequence."""
    try:
        return list(arg)[:n]
    except TypeError:
        raise bad_param(argname, f"must be a sequence of ints, got {type(arg).__name__}") from None


def _check_dims(dims, argname="dimA"):
    for i, d in enumerate(dims):
        check(_is_int(d), argname, f"dimension {i} is {d!r}; dimensions must be ints")  # rule: dims are ints
        check(int(d) > 0, argname, f"dimension {i} is {d}; every dimension must be positive")
    total = 1
    for d in dims:
        total *= int(d)
    if total >= MAX_ELEMENTS:
        raise not_supported(argname, f"{total} elements exceed the 2^31 element limit")


def _check_strides(dims, strides, argname="strideA"):
    for i, s in enumerate(strides):
        check(_is_int(s), argname, f"stride {i} is {s!r}; strides must be ints")  # rule: strides are ints
        check(int(s) >= 0, argname, f"stride {i} is {s}; strides must not be negative")
        if int(s) >= MAX_ELEMENTS:  # rule: a stride is a C int below 2^31 (larger ones overflowed the views)
            raise not_supported(argname, f"stride {i} is {s}, over the 2^31 limit")
    span = 1 + sum((d - 1) * s for d, s in zip(dims, strides))
    if span >= MAX_ELEMENTS:
        raise not_supported(argname, f"the tensor spans {span} elements, over the 2^31 limit")


def tensor_desc(arg, argname: str, need_set: bool = True) -> TensorDescriptor:
    d = resolve(arg, TensorDescriptor, argname, need_set)
    if type(d) is FilterDescriptor:  # rule: a filter descriptor is not a tensor descriptor (another C type)
        raise bad_param(argname, "is a cudnnFilterDescriptor_t, not a cudnnTensorDescriptor_t")
    return d


def filter_desc(arg, argname: str) -> FilterDescriptor:
    return resolve(arg, FilterDescriptor, argname)


# -- tensor descriptors ---------------------------------------------------------------

createTensorDescriptor, destroyTensorDescriptor = pair(TensorDescriptor, __name__)


@legacy("cudnnSetTensor4dDescriptor")
def setTensor4dDescriptor(tensorDesc, format, dataType, n, c, h, w) -> None:
    """Set a packed 4-D tensor descriptor from a format (NCHW, NHWC, NCHW_VECT_C) (002 §3.2.91)."""
    d = tensor_desc(tensorDesc, "tensorDesc", need_set=False)
    _check_format(format)
    _check_dtype(dataType)
    dims = (n, c, h, w)
    _check_dims(dims, "n,c,h,w")
    _check_vect(format, dataType, c)
    d.set(dataType, format, dims, packed_strides(format, dims))


@legacy("cudnnSetTensor4dDescriptorEx")
def setTensor4dDescriptorEx(tensorDesc, dataType, n, c, h, w, nStride, cStride, hStride, wStride) -> None:
    """Set a 4-D tensor descriptor with explicit strides (002 §3.2.92)."""
    d = tensor_desc(tensorDesc, "tensorDesc", need_set=False)
    _check_dtype(dataType)
    check(int(dataType) not in VECTOR_WIDTH, "dataType", "vector types need cudnnSetTensor4dDescriptor with NCHW_VECT_C")
    dims, strides = (n, c, h, w), (nStride, cStride, hStride, wStride)
    _check_dims(dims, "n,c,h,w")
    _check_strides(dims, strides, "nStride,cStride,hStride,wStride")
    d.set(dataType, F["CUDNN_TENSOR_NCHW"], dims, strides)


def _check_nb_dims(nbDims, lo=3):
    check(_is_int(nbDims) and nbDims > 0, "nbDims", f"must be a positive int, got {nbDims!r}")
    if not lo <= nbDims <= DIM_MAX:
        raise not_supported("nbDims", f"must be in [{lo}, CUDNN_DIM_MAX={DIM_MAX}], got {nbDims}")


@legacy("cudnnSetTensorNdDescriptor")
def setTensorNdDescriptor(tensorDesc, dataType, nbDims, dimA, strideA) -> None:
    """Set an N-d tensor descriptor from dimensions and strides (002 §3.2.93)."""
    d = tensor_desc(tensorDesc, "tensorDesc", need_set=False)
    _check_dtype(dataType)
    check(int(dataType) not in VECTOR_WIDTH, "dataType", "vector types need a format (cudnnSetTensorNdDescriptorEx)")
    _check_nb_dims(nbDims)
    dims, strides = _seq(dimA, nbDims, "dimA"), _seq(strideA, nbDims, "strideA")
    check(len(dims) == nbDims and len(strides) == nbDims, "dimA/strideA", f"must hold nbDims={nbDims} entries")
    _check_dims(dims)
    _check_strides(dims, strides)
    d.set(dataType, F["CUDNN_TENSOR_NCHW"], dims, strides)


@legacy("cudnnSetTensorNdDescriptorEx")
def setTensorNdDescriptorEx(tensorDesc, format, dataType, nbDims, dimA) -> None:
    """Set a packed N-d tensor descriptor from a format (002 §3.2.94)."""
    d = tensor_desc(tensorDesc, "tensorDesc", need_set=False)
    _check_format(format)
    _check_dtype(dataType)
    _check_nb_dims(nbDims)
    dims = _seq(dimA, nbDims, "dimA")
    check(len(dims) == nbDims, "dimA", f"must hold nbDims={nbDims} entries")
    _check_dims(dims)
    _check_vect(format, dataType, dims[1])
    d.set(dataType, format, dims, packed_strides(format, dims))


@legacy("cudnnGetTensor4dDescriptor")
def getTensor4dDescriptor(tensorDesc) -> tuple:
    """(dataType, n, c, h, w, nStride, cStride, hStride, wStride)"""
    d = tensor_desc(tensorDesc, "tensorDesc")
    check(d.nbDims == 4, "tensorDesc", f"is {d.nbDims}-d; cudnnGetTensor4dDescriptor needs a 4-d descriptor")
    return (d.dataType,) + d.dims + d.strides


@legacy("cudnnGetTensorNdDescriptor")
def getTensorNdDescriptor(tensorDesc, nbDimsRequested: int = DIM_MAX) -> tuple:
    """(dataType, nbDims, dimA, strideA): the first min(nbDimsRequested, nbDims) entries."""
    d = tensor_desc(tensorDesc, "tensorDesc")
    check(nbDimsRequested >= 0, "nbDimsRequested", "must not be negative")
    k = min(nbDimsRequested, d.nbDims)
    return d.dataType, d.nbDims, list(d.dims[:k]), list(d.strides[:k])


@legacy("cudnnGetTensorSizeInBytes")
def getTensorSizeInBytes(tensorDesc) -> int:
    """Bytes the tensor spans, stride gaps included."""
    from ._core.data import extent_bytes
    d = tensor_desc(tensorDesc, "tensorDesc")
    return extent_bytes(Tensor(0, d.dims, d.strides, d.dtype))


# -- filter descriptors ---------------------------------------------------------------

createFilterDescriptor, destroyFilterDescriptor = pair(FilterDescriptor, __name__)


@legacy("cudnnSetFilter4dDescriptor")
def setFilter4dDescriptor(filterDesc, dataType, format, k, c, h, w) -> None:
    """NCHW format means KCRS memory order, NHWC means KRSC (002 §3.2.80)."""
    setFilterNdDescriptor.__wrapped__(filterDesc, dataType, format, 4, (k, c, h, w))  # errors name this function


@legacy("cudnnSetFilterNdDescriptor")
def setFilterNdDescriptor(filterDesc, dataType, format, nbDims, filterDimA) -> None:
    """Set an N-d filter descriptor: data type, format and dimensions (002 §3.2.82)."""
    d = resolve(filterDesc, FilterDescriptor, "filterDesc", need_set=False)
    _check_dtype(dataType)
    _check_format(format)
    _check_nb_dims(nbDims)
    dims = _seq(filterDimA, nbDims, "filterDimA")
    check(len(dims) == nbDims, "filterDimA", f"must hold nbDims={nbDims} entries")
    _check_dims(dims, "filterDimA")
    _check_vect(format, dataType, dims[1])
    d.set(dataType, format, dims, packed_strides(format, dims))


@legacy("cudnnGetFilter4dDescriptor")
def getFilter4dDescriptor(filterDesc) -> tuple:
    """(dataType, format, k, c, h, w)"""
    d = filter_desc(filterDesc, "filterDesc")
    check(d.nbDims == 4, "filterDesc", f"is {d.nbDims}-d; cudnnGetFilter4dDescriptor needs a 4-d descriptor")
    return (d.dataType, d.format) + d.dims


@legacy("cudnnGetFilterNdDescriptor")
def getFilterNdDescriptor(filterDesc, nbDimsRequested: int = DIM_MAX) -> tuple:
    """(dataType, format, nbDims, filterDimA)"""
    d = filter_desc(filterDesc, "filterDesc")
    return d.dataType, d.format, d.nbDims, list(d.dims[:min(nbDimsRequested, d.nbDims)])


@legacy("cudnnGetFilterSizeInBytes")
def getFilterSizeInBytes(filterDesc) -> int:
    """Bytes needed to hold a filter described by the descriptor (002 §3.2.47)."""
    from ._core.data import extent_bytes
    d = filter_desc(filterDesc, "filterDesc")
    return extent_bytes(Tensor(0, d.dims, d.strides, d.dtype))
