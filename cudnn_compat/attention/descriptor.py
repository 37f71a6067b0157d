"""Multi-head attention descriptors (002 §7.2.3/§7.2.8 Create/DestroyAttnDescriptor, §7.2.43/§7.2.14
Set/GetAttnDescriptor, §7.2.7/§7.2.12/§7.2.53/§7.2.34 the sequence data descriptor) and the
weight and buffer queries (§7.2.15 cudnnGetMultiHeadAttnBuffers, §7.2.16
cudnnGetMultiHeadAttnWeights).  The compute calls are ``attention.compute``.

Weights live in one buffer, each tensor 16-byte aligned, in the order Q, K, V, O weights then
Q, K, V, O biases; cudnnGetMultiHeadAttnWeights gives each one's address and descriptor:
weights [nHeads, projSize, origSize] packed, Q/K/V biases [nHeads, projSize, 1], the output
bias [1, oProjSize, 1] (one vector added after the sum over heads).  Dropout descriptors are
NOT_SUPPORTED (002 "Unsupported features").
"""
from __future__ import annotations

import ctypes

import numpy as np

from cudnn_compat._backend import dtypes
from .._core import bound_graph as bg
from .._core.data import address, buffer_at, scalar
from .._core.call import compute_dtype
from .._core.descriptor import Descriptor, resolve
from .._core.lifecycle import pair
from .._core.registry import legacy
from ..ctc import host_ints
from ..dropout import DropoutDescriptor
from ..enums import CONSTANTS, ENUMS, is_valid, name_of
from ..errors import bad_param, check, not_supported
from ..handle import get_handle
from ..tensor import DTYPE_NAME, TensorDescriptor

D = ENUMS["cudnnDataType_t"]
M = ENUMS["cudnnMathType_t"]
TIME, BATCH, BEAM, VECT = 0, 1, 2, 3  # cudnnSeqDataAxis_t
DIM_COUNT = CONSTANTS["CUDNN_SEQDATA_DIM_COUNT"]
QUERYMAP_ONE_TO_ONE = ENUMS["cudnnAttnQueryMap_t"]["CUDNN_ATTN_QUERYMAP_ONE_TO_ONE"]
ENABLE_PROJ_BIASES = ENUMS["cudnnAttnProjBias_t"]["CUDNN_ATTN_ENABLE_PROJ_BIASES"]
MODE_BITS = QUERYMAP_ONE_TO_ONE | ENABLE_PROJ_BIASES
WKIND = ENUMS["cudnnMultiHeadAttnWeightKind_t"]
# 002 §7.2.43 Table 40: dataType -> (computePrec, allowed mathTypes)
SUPPORTED = {
    D["CUDNN_DATA_DOUBLE"]: (D["CUDNN_DATA_DOUBLE"], {M["CUDNN_DEFAULT_MATH"]}),
    D["CUDNN_DATA_FLOAT"]: (D["CUDNN_DATA_FLOAT"], {M["CUDNN_DEFAULT_MATH"], M["CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION"]}),
    D["CUDNN_DATA_HALF"]: (D["CUDNN_DATA_HALF"], {M["CUDNN_DEFAULT_MATH"], M["CUDNN_TENSOR_OP_MATH"],
                                                 M["CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION"]}),
}
ALIGN = 16  # bytes; 002 §7.2.15: buffers are at least 16-byte aligned


# -- descriptors ------------------------------------------------------------------------------

class SeqDataDescriptor(Descriptor):
    """cudnnSeqDataDescriptor_t: data type, dimA indexed by cudnnSeqDataAxis_t, the layout
    (axes, outermost first, VECT last) and the sequence lengths in batch-major order."""

    kind = "cudnnSeqDataDescriptor_t"

    def __init__(self):
        super().__init__()
        self.dataType, self.dimA, self.axes = D["CUDNN_DATA_FLOAT"], (), ()
        self.seqLengths = np.zeros(0, np.int32)

    def _settings(self):  # sequence lengths are data (masks), not part of a plan's signature
        return (self.dataType, self.dimA, self.axes)

    @property
    def dtype(self) -> str:
        return DTYPE_NAME[self.dataType]

    def strides(self) -> dict:
        """axis -> element stride (002 §7.2.34 sample code)."""
        st, acc = {}, 1
        for ax in reversed(self.axes):
            st[ax] = acc
            acc *= self.dimA[ax]
        return st

    def lengths(self) -> np.ndarray:
        """Sequence lengths as [batch, beam]."""
        return self.seqLengths.reshape(self.dimA[BATCH], self.dimA[BEAM])


class AttnDescriptor(Descriptor):
    """cudnnAttnDescriptor_t: every argument of cudnnSetAttnDescriptor."""

    kind = "cudnnAttnDescriptor_t"
    FIELDS = ("attnMode", "nHeads", "smScaler", "dataType", "computePrec", "mathType", "attnDropoutDesc",
              "postDropoutDesc", "qSize", "kSize", "vSize", "qProjSize", "kProjSize", "vProjSize", "oProjSize",
              "qoMaxSeqLength", "kvMaxSeqLength", "maxBatchSize", "maxBeamSize")

    def __init__(self):
        super().__init__()
        for f in self.FIELDS:
            setattr(self, f, 0)
        self.attnDropoutDesc = self.postDropoutDesc = None

    def _settings(self):
        return tuple(getattr(self, f) for f in self.FIELDS if not f.endswith("DropoutDesc"))

    @property
    def dtype(self) -> str:
        return DTYPE_NAME[self.dataType]

    @property
    def biases(self) -> bool:
        return bool(self.attnMode & ENABLE_PROJ_BIASES)

    @property
    def one_to_one(self) -> bool:
        return bool(self.attnMode & QUERYMAP_ONE_TO_ONE)

    @property
    def qk_size(self) -> int:
        return self.qProjSize or self.qSize

    @property
    def v_out(self) -> int:
        """Length of each head's h_i (vProjSize, or vSize when V is not projected)."""
        return self.vProjSize or self.vSize

    @property
    def o_size(self) -> int:
        return self.oProjSize or self.nHeads * self.v_out


def attn_desc(arg, argname: str = "attnDesc") -> AttnDescriptor:
    return resolve(arg, AttnDescriptor, argname)


def seq_desc(arg, argname: str) -> SeqDataDescriptor:
    return resolve(arg, SeqDataDescriptor, argname)


createAttnDescriptor, destroyAttnDescriptor = pair(AttnDescriptor, __name__)
createSeqDataDescriptor, destroySeqDataDescriptor = pair(SeqDataDescriptor, __name__)


@legacy("cudnnSetSeqDataDescriptor")
def setSeqDataDescriptor(seqDataDesc, dataType, nbDims, dimA, axes, seqLengthArraySize, seqLengthArray,
                         paddingFill=None) -> None:
    """002 §7.2.53.  BAD_PARAM: invalid dataType, nbDims <= 0, a dim <= 0, axes not a permutation
    with VECT last, seqLengthArraySize != batch*beam, a length outside [0, TIME].
    NOT_SUPPORTED: nbDims != 4, a non-NULL paddingFill, data other than HALF/FLOAT/DOUBLE."""
    d = resolve(seqDataDesc, SeqDataDescriptor, "seqDataDesc", need_set=False)
    check(is_valid("cudnnDataType_t", dataType), "dataType", f"{dataType!r} is not a cudnnDataType_t")
    check(isinstance(nbDims, (int, np.integer)) and int(nbDims) > 0, "nbDims", f"must be positive, got {nbDims!r}")
    if int(nbDims) != DIM_COUNT:
        raise not_supported("nbDims", f"must be {DIM_COUNT} (TIME, BATCH, BEAM, VECT), got {nbDims}")
    if not bg.is_null(paddingFill):
        scalar(paddingFill, "paddingFill")  # BAD_PARAM for what is no number (a host address as an int)
        raise not_supported("paddingFill", "must be NULL: output padding fill is not supported")
    if int(dataType) not in SUPPORTED:
        raise not_supported("dataType", f"{name_of('cudnnDataType_t', dataType)}: sequence data must be HALF, FLOAT or DOUBLE")
    check(dimA is not None and axes is not None, "dimA/axes", "is NULL")
    dims = tuple(int(v) for v in np.asarray(dimA).reshape(-1)[:DIM_COUNT])
    order = tuple(int(v) for v in np.asarray(axes).reshape(-1)[:DIM_COUNT])
    check(len(dims) == DIM_COUNT and all(v > 0 for v in dims), "dimA", f"must hold {DIM_COUNT} positive dims, got {dims}")
    check(sorted(order) == [TIME, BATCH, BEAM, VECT] and order[-1] == VECT, "axes",
          f"must be a permutation of TIME, BATCH, BEAM, VECT with VECT last (innermost), got {order}")
    count = dims[BATCH] * dims[BEAM]
    check(int(seqLengthArraySize) == count, "seqLengthArraySize",
          f"is {seqLengthArraySize}; it must be dimA[BATCH] * dimA[BEAM] = {count}")
    lengths = host_ints(seqLengthArray, count, "seqLengthArray")
    bad = np.nonzero((lengths < 0) | (lengths > dims[TIME]))[0]
    check(bad.size == 0, "seqLengthArray",
          f"seqLengthArray[{bad[0] if bad.size else 0}] is outside [0, dimA[TIME]={dims[TIME]}]")
    d.dataType, d.dimA, d.axes, d.seqLengths = int(dataType), dims, order, lengths
    d.touched()


@legacy("cudnnGetSeqDataDescriptor")
def getSeqDataDescriptor(seqDataDesc, nbDimsRequested: int = DIM_COUNT, seqLengthSizeRequested: "int | None" = None) -> tuple:
    """(dataType, nbDims, dimA[:nbDimsRequested], axes[:nbDimsRequested], seqLengthArraySize,
    seqLengthArray[:seqLengthSizeRequested], paddingFill=None) (002 §7.2.34)."""
    d = seq_desc(seqDataDesc, "seqDataDesc")
    check(int(nbDimsRequested) >= 0, "nbDimsRequested", "must not be negative")
    n = len(d.seqLengths) if seqLengthSizeRequested is None else int(seqLengthSizeRequested)
    check(n >= 0, "seqLengthSizeRequested", "must not be negative")
    k = int(nbDimsRequested)
    return (d.dataType, DIM_COUNT, list(d.dimA[:k]), list(d.axes[:k]), len(d.seqLengths),
            [int(v) for v in d.seqLengths[:n]], None)


def _positive(name, v):
    check(isinstance(v, (int, np.integer)) and int(v) > 0, name, f"must be a positive int, got {v!r}")


def _non_negative(name, v):
    check(isinstance(v, (int, np.integer)) and int(v) >= 0, name, f"must be a non-negative int, got {v!r}")


@legacy("cudnnSetAttnDescriptor")
def setAttnDescriptor(attnDesc, attnMode, nHeads, smScaler, dataType, computePrec, mathType, attnDropoutDesc,
                      postDropoutDesc, qSize, kSize, vSize, qProjSize, kProjSize, vProjSize, oProjSize,
                      qoMaxSeqLength, kvMaxSeqLength, maxBatchSize, maxBeamSize) -> None:
    """002 §7.2.43.  BAD_PARAM: post-projection Q and K sizes differ; dataType/computePrec/mathType
    not a Table 40 row; nHeads, q/k/vSize, the max lengths and sizes <= 0; a projection size or
    smScaler negative; unknown attnMode bits.  NOT_SUPPORTED: a dropout descriptor (002
    "Unsupported features" 1)."""
    d = resolve(attnDesc, AttnDescriptor, "attnDesc", need_set=False)
    check(isinstance(attnMode, (int, np.integer)) and int(attnMode) & ~MODE_BITS == 0, "attnMode",
          f"{attnMode!r} has bits other than CUDNN_ATTN_QUERYMAP_ONE_TO_ONE | CUDNN_ATTN_ENABLE_PROJ_BIASES")
    for name, v in (("nHeads", nHeads), ("qSize", qSize), ("kSize", kSize), ("vSize", vSize),
                    ("qoMaxSeqLength", qoMaxSeqLength), ("kvMaxSeqLength", kvMaxSeqLength),
                    ("maxBatchSize", maxBatchSize), ("maxBeamSize", maxBeamSize)):
        _positive(name, v)
    for name, v in (("qProjSize", qProjSize), ("kProjSize", kProjSize), ("vProjSize", vProjSize), ("oProjSize", oProjSize)):
        _non_negative(name, v)
    try:
        sm = float(smScaler)
    except (TypeError, ValueError):
        raise bad_param("smScaler", f"must be a number, got {smScaler!r}") from None
    check(sm >= 0.0, "smScaler", f"must not be negative (or NaN), got {smScaler!r}")
    for name, v in (("dataType", dataType), ("computePrec", computePrec)):
        check(is_valid("cudnnDataType_t", v), name, f"{v!r} is not a cudnnDataType_t")
    check(is_valid("cudnnMathType_t", mathType), "mathType", f"{mathType!r} is not a cudnnMathType_t")
    row = SUPPORTED.get(int(dataType))
    check(row is not None and int(computePrec) == row[0] and int(mathType) in row[1], "dataType/computePrec/mathType",
          f"({name_of('cudnnDataType_t', dataType)}, {name_of('cudnnDataType_t', computePrec)}, "
          f"{name_of('cudnnMathType_t', mathType)}) is not a supported combination (002 Table 40)")
    check((int(qProjSize) or int(qSize)) == (int(kProjSize) or int(kSize)), "kProjSize",
          f"post-projection Q and K sizes must be equal (Q {int(qProjSize) or int(qSize)}, K {int(kProjSize) or int(kSize)})")
    for name, v in (("attnDropoutDesc", attnDropoutDesc), ("postDropoutDesc", postDropoutDesc)):
        if not bg.is_null(v):
            resolve(v, DropoutDescriptor, name)
            raise not_supported(name, "dropout in multi-head attention is not supported; pass NULL (002 §7.2.43)")
    values = (int(attnMode), int(nHeads), sm, int(dataType), int(computePrec), int(mathType), None, None,
              int(qSize), int(kSize), int(vSize), int(qProjSize), int(kProjSize), int(vProjSize), int(oProjSize),
              int(qoMaxSeqLength), int(kvMaxSeqLength), int(maxBatchSize), int(maxBeamSize))
    for f, v in zip(AttnDescriptor.FIELDS, values):
        setattr(d, f, v)
    d.touched()


@legacy("cudnnGetAttnDescriptor")
def getAttnDescriptor(attnDesc) -> tuple:
    """(attnMode, nHeads, smScaler, dataType, computePrec, mathType, attnDropoutDesc,
    postDropoutDesc, qSize, kSize, vSize, qProjSize, kProjSize, vProjSize, oProjSize,
    qoMaxSeqLength, kvMaxSeqLength, maxBatchSize, maxBeamSize) (002 §7.2.14)."""
    d = attn_desc(attnDesc)
    return tuple(getattr(d, f) for f in AttnDescriptor.FIELDS)


# -- weights and buffer sizes -------------------------------------------------------------------

_LAYOUTS: dict = {}  # attention descriptor key -> weight_layout (every compute call asks, several times)


def weight_layout(a: AttnDescriptor) -> tuple:
    """({wKind: (byte offset, dims)}, total bytes): present tensors only, 16-byte aligned."""
    key = a.key()
    got = _LAYOUTS.get(key)
    if got is None:
        if len(_LAYOUTS) > 256:
            _LAYOUTS.clear()
        got = _LAYOUTS[key] = _weight_layout(a)
    return got


def _weight_layout(a: AttnDescriptor) -> tuple:
    h = a.nHeads
    shapes = {
        WKIND["CUDNN_MH_ATTN_Q_WEIGHTS"]: (h, a.qProjSize, a.qSize) if a.qProjSize else None,
        WKIND["CUDNN_MH_ATTN_K_WEIGHTS"]: (h, a.kProjSize, a.kSize) if a.kProjSize else None,
        WKIND["CUDNN_MH_ATTN_V_WEIGHTS"]: (h, a.vProjSize, a.vSize) if a.vProjSize else None,
        WKIND["CUDNN_MH_ATTN_O_WEIGHTS"]: (h, a.oProjSize, a.v_out) if a.oProjSize else None,
        WKIND["CUDNN_MH_ATTN_Q_BIASES"]: (h, a.qProjSize, 1) if a.qProjSize and a.biases else None,
        WKIND["CUDNN_MH_ATTN_K_BIASES"]: (h, a.kProjSize, 1) if a.kProjSize and a.biases else None,
        WKIND["CUDNN_MH_ATTN_V_BIASES"]: (h, a.vProjSize, 1) if a.vProjSize and a.biases else None,
        WKIND["CUDNN_MH_ATTN_O_BIASES"]: (1, a.oProjSize, 1) if a.oProjSize and a.biases else None,
    }
    item = dtypes.itemsize(a.dtype)
    layout, off = {}, 0
    for kind in sorted(shapes):
        dims = shapes[kind]
        if dims is not None:
            layout[kind] = (off, dims)
            off += -(-int(np.prod(dims)) * item // ALIGN) * ALIGN
    return layout, off


FUSED_ALIGN = 256  # bytes; each region of the fused path's reserve space


def _mask_bytes(a: AttnDescriptor, n: int, tq: int, tk: int) -> int:
    return -(-(n * tq * tk * dtypes.itemsize(compute_dtype(a.dtype))) // FUSED_ALIGN) * FUSED_ALIGN


def fused_regions(a: AttnDescriptor, n: int, tq: int, tk: int) -> dict:
    """{name: (byte offset, elements)} of what the fused path (``attention.fused``) keeps in the
    reserve space after the window mask, for ``n`` = batch * beam sequences: the projections
    qp, kp, vp and the heads o (fp16, [n, time, heads * size]), the softmax statistics (fp32,
    [n, heads, tq]) and the projection gradients dqp, dkp, dvp.  Empty unless HALF data with
    Q, K and V projections (the only case that runs fused)."""
    if a.dtype != "float16" or not (a.qProjSize and a.kProjSize and a.vProjSize):
        return {}
    h = a.nHeads
    sizes = (("qp", n * tq * h * a.qProjSize, 2), ("kp", n * tk * h * a.kProjSize, 2), ("vp", n * tk * h * a.vProjSize, 2),
             ("o", n * tq * h * a.vProjSize, 2), ("stats", n * h * tq, 4), ("dqp", n * tq * h * a.qProjSize, 2),
             ("dkp", n * tk * h * a.kProjSize, 2), ("dvp", n * tk * h * a.vProjSize, 2))
    out, off = {}, _mask_bytes(a, n, tq, tk)
    for name, count, item in sizes:
        out[name] = (off, count)
        off += -(-(count * item) // FUSED_ALIGN) * FUSED_ALIGN
    return out


def _reserve_size(a: AttnDescriptor, b: int, beam: int, tq: int, tk: int) -> int:
    """The window mask ([b * beam, tq, tk] in the compute type), then ``fused_regions``."""
    regions = fused_regions(a, b * beam, tq, tk)
    if not regions:
        n = b * beam * tq * tk * dtypes.itemsize(compute_dtype(a.dtype))
        return -(-n // ALIGN) * ALIGN
    off, count = regions["dvp"]
    return off + -(-(count * 2) // FUSED_ALIGN) * FUSED_ALIGN


@legacy("cudnnGetMultiHeadAttnBuffers")
def getMultiHeadAttnBuffers(handle, attnDesc) -> tuple:
    """(weightSizeInBytes, workSpaceSizeInBytes, reserveSpaceSizeInBytes) (002 §7.2.15): the
    reserve holds the window mask for the largest sequences the descriptor allows, and for HALF
    data the fused path's projections, statistics and gradients (``fused_regions``); pass a
    reserve of 0 bytes / NULL for inference."""
    get_handle(handle)
    a = attn_desc(attnDesc)
    return (weight_layout(a)[1], 0,
            _reserve_size(a, a.maxBatchSize, a.maxBeamSize, a.qoMaxSeqLength, a.kvMaxSeqLength))


@legacy("cudnnGetMultiHeadAttnWeights")
def getMultiHeadAttnWeights(handle, attnDesc, wKind, weightSizeInBytes, weights, wDesc) -> int:
    """Sets ``wDesc`` to the tensor's [nHeads, projSize, origSize] (biases [nHeads, projSize, 1])
    dims and packed strides and returns its address in ``weights`` (a pointer int); an absent
    tensor gives address 0 and a zeroed descriptor, with SUCCESS (002 §7.2.16)."""
    h = get_handle(handle)
    a = attn_desc(attnDesc)
    check(is_valid("cudnnMultiHeadAttnWeightKind_t", wKind), "wKind", f"{wKind!r} is not a cudnnMultiHeadAttnWeightKind_t")
    layout, total = weight_layout(a)
    check(int(weightSizeInBytes) >= total, "weightSizeInBytes",
          f"{weightSizeInBytes} is less than the {total} bytes cudnnGetMultiHeadAttnBuffers reports")
    desc = resolve(wDesc, TensorDescriptor, "wDesc", need_set=False)
    entry = layout.get(int(wKind))
    if entry is None:
        desc.set(a.dataType, 0, (), ())
        return 0
    check(not bg.is_null(weights), "weights", "is NULL")
    off, dims = entry
    block = buffer_at(h, weights, "weights", total, off, dims, DTYPE_NAME[a.dataType])  # every data argument's checks
    strides = (dims[1] * dims[2], dims[2], 1)
    desc.set(a.dataType, 0, dims, strides)
    if type(block) is int or isinstance(block, ctypes.c_void_p):
        return block
    return address(block)
