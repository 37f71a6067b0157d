"""Tensor transforms: fold, unfold, pad and layout conversion (002 §3.2.17
cudnnCreateTensorTransformDescriptor, §3.2.95 Set, §3.2.62 Get, §3.2.32 Destroy, §3.2.64
cudnnInitTransformDest, §3.2.101 cudnnTransformTensorEx, §3.2.99 cudnnTransformFilter, §5.2.32
cudnnReorderFilterAndBias; inventory §2.10).

002 names the operations without defining them; here (dims in logical order N, C, spatial...):

  FOLD    dest = fold(pad(src)).  pad adds padBeforeA[i] / padAfterA[i] zeros to spatial dim i
          (negative amounts crop); fold moves foldA = (f1, f2, ...) phases of the spatial dims
          into the channels (space to depth):
              dest[n, c*F + j, I...] = padded[n, c, I1*f1 + j1, I2*f2 + j2, ...]
          with F = f1*f2*..., j = (j1, j2, ...) numbered row-major, and each padded spatial size
          rounded up to a multiple of its fold with zeros.  dest spatial = ceil((S + before + after) / f).
  UNFOLD  the inverse: depth to space, then the padding removed:
              dest[n, c, h...] = src[n, c*F + j, I...] where h + before = I*f + j.
          dest spatial = S*f - before - after.
Folds of 0 or 1 do nothing.  destFormat is the layout cudnnInitTransformDest gives the
destination (packed NCHW or NHWC); TransformTensorEx and TransformFilter follow whatever
strides the destination descriptor has, so a plain layout change is a transform with no pad
and no fold.  Padding applies to spatial dims only (NOT_SUPPORTED on N or C).  The data type
may change (values are rounded as the destination stores them).

Each call is one graph with one ResampleForward per phase j (window 1, stride f, pre-padding
before - j: a strided, shifted copy with zeros outside the source, exact for every value
including Inf and NaN) reading or writing the phase as a strided view of the folded tensor at
a channel offset, then the alpha/beta blend where allowed: folding or padding needs
(alpha, beta) = (1, 0) (NOT_SUPPORTED otherwise), unfolding takes any.  A transform without
pad or fold is one blended Pointwise copy.

ReorderFilterAndBias: our engines read filters in their plain layout whatever the descriptor's
reorder type, so the reordered layout is the plain one and the call copies the filter (and,
with reorderBias > 0, the K bias values: FLOAT for integer filters, else the filter's type).
"""
from __future__ import annotations

import itertools
import math
import numbers

import numpy as np

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, virtual
from ._core.bound_graph import at as _at
from ._core.call import ALPHA, BETA, blend, compute_dtype, run
from ._core.data import POINTER_MIN, bind, extent_bytes, same_buffer, scalar
from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.registry import legacy
from .enums import CONSTANTS, ENUMS, is_valid, name_of
from .errors import bad_param, check, not_supported
from .handle import get_handle
from .tensor import F, FilterDescriptor, TensorDescriptor, VECTOR_WIDTH, packed_strides
from ._core.uids import SHARED, Uids

DIM_MAX = CONSTANTS["CUDNN_DIM_MAX"]
FOLD = ENUMS["cudnnFoldingDirection_t"]["CUDNN_TRANSFORM_FOLD"]
UNFOLD = ENUMS["cudnnFoldingDirection_t"]["CUDNN_TRANSFORM_UNFOLD"]
DEST_FORMATS = (F["CUDNN_TENSOR_NCHW"], F["CUDNN_TENSOR_NHWC"])
UIDS = Uids(after=SHARED)  # the transform graphs' uids (ALPHA, BETA: the output blend's)
SRC, DST = UIDS.data(2)  # the whole tensors (plain copy)
# phase k's views of src and dest and its intermediate (the numbers they always had, persisted
# autotune keys): room for 900 UNFOLD phases and 2001 FOLD ones (dest views only)
SRC_PHASE, DST_PHASE, TMP_PHASE = UIDS.data(900, at=100), UIDS.data(2001, at=1000), UIDS.virtual(900, at=8100)


class TensorTransformDescriptor(Descriptor):
    """cudnnTensorTransformDescriptor_t: nbDims, destFormat, padBefore/padAfter per dim, fold per
    spatial dim, direction."""

    kind = "cudnnTensorTransformDescriptor_t"

    def __init__(self):
        super().__init__()
        self.nbDims, self.destFormat, self.direction = 0, F["CUDNN_TENSOR_NCHW"], FOLD
        self.padBefore, self.padAfter, self.fold = (), (), ()

    def _settings(self):
        return (self.nbDims, self.destFormat, self.padBefore, self.padAfter, self.fold, self.direction)

    @property
    def folds(self) -> tuple:
        """Effective fold per spatial dim (0 and 1 both mean none)."""
        return tuple(max(f, 1) for f in self.fold)

    @property
    def folding(self) -> bool:
        return any(f > 1 for f in self.fold)

    @property
    def padding(self) -> bool:
        return any(self.padBefore) or any(self.padAfter)


def transform_desc(arg, argname: str = "transDesc") -> TensorTransformDescriptor:
    return resolve(arg, TensorTransformDescriptor, argname)


def _ints(values, n: int, argname: str, default: int, lo=None) -> tuple:
    """``n`` ints from a sequence, a host pointer to int32, or None (all ``default``)."""
    if values is None or (isinstance(values, int) and not isinstance(values, bool) and values == 0):
        return (default,) * n
    if isinstance(values, int) and not isinstance(values, bool):
        import ctypes
        check(values >= POINTER_MIN, argname, "is not a host pointer")
        vals = tuple(int(v) for v in (ctypes.c_int32 * n).from_address(values))
    else:
        try:
            vals = tuple(int(v) for v in list(values)[:n])
        except (TypeError, ValueError):
            raise bad_param(argname, f"must be a sequence of ints, got {values!r}") from None
    check(len(vals) == n, argname, f"must hold {n} entries, got {len(vals)}")
    if lo is not None:
        check(all(v >= lo for v in vals), argname, f"entries must be >= {lo}, got {vals}")
    return vals


# -- descriptor ----------------------------------------------------------------------

createTensorTransformDescriptor, destroyTensorTransformDescriptor = pair(TensorTransformDescriptor, __name__)


@legacy("cudnnSetTensorTransformDescriptor")
def setTensorTransformDescriptor(transformDesc, nbDims, destFormat, padBeforeA, padAfterA, foldA, direction) -> None:
    """002 §3.2.95.  BAD_PARAM: nbDims <= 2, invalid direction, negative folds, arrays of the
    wrong length.  NOT_SUPPORTED: nbDims > CUDNN_DIM_MAX, destFormat not NCHW or NHWC.  NULL
    pads mean none, a NULL foldA no folding."""
    d = resolve(transformDesc, TensorTransformDescriptor, "transformDesc", need_set=False)
    check(isinstance(nbDims, numbers.Integral) and not isinstance(nbDims, bool) and nbDims > 2, "nbDims",
          f"must be an int greater than 2, got {nbDims!r}")
    if nbDims > DIM_MAX:
        raise not_supported("nbDims", f"{nbDims} exceeds CUDNN_DIM_MAX={DIM_MAX}")
    check(is_valid("cudnnFoldingDirection_t", direction), "direction", f"{direction!r} is not a cudnnFoldingDirection_t")
    if destFormat not in DEST_FORMATS:
        raise not_supported("destFormat", f"must be CUDNN_TENSOR_NCHW or CUDNN_TENSOR_NHWC, got "
                                          f"{name_of('cudnnTensorFormat_t', destFormat)}")
    before = _ints(padBeforeA, nbDims, "padBeforeA", 0)
    after = _ints(padAfterA, nbDims, "padAfterA", 0)
    fold = _ints(foldA, nbDims - 2, "foldA", 1, lo=0)
    d.nbDims, d.destFormat, d.direction = int(nbDims), int(destFormat), int(direction)
    d.padBefore, d.padAfter, d.fold = before, after, fold
    d.touched()


@legacy("cudnnGetTensorTransformDescriptor")
def getTensorTransformDescriptor(transformDesc, nbDimsRequested: "int | None" = None) -> tuple:
    """(destFormat, padBeforeA, padAfterA, foldA, direction); the pads hold nbDimsRequested entries,
    foldA nbDimsRequested-2 (at most what was set).  BAD_PARAM: nbDimsRequested < 3 or > DIM_MAX."""
    d = transform_desc(transformDesc, "transformDesc")
    n = d.nbDims if nbDimsRequested is None else nbDimsRequested
    check(isinstance(n, numbers.Integral) and 3 <= n <= DIM_MAX, "nbDimsRequested",
          f"must be in [3, CUDNN_DIM_MAX={DIM_MAX}], got {nbDimsRequested!r}")
    k = min(n, d.nbDims)
    return d.destFormat, list(d.padBefore[:k]), list(d.padAfter[:k]), list(d.fold[:k - 2]), d.direction


# -- geometry ------------------------------------------------------------------------

def _check_pads(td) -> None:
    if td.padBefore[:2] != (0, 0) or td.padAfter[:2] != (0, 0):
        raise not_supported("transDesc", f"padding applies to spatial dims only, got padBeforeA {list(td.padBefore)}, "
                                         f"padAfterA {list(td.padAfter)}")


def dest_dims(td, dims, argname: str = "srcDesc") -> tuple:
    """The dims ``td`` turns ``dims`` into (module docstring); BAD_PARAM when it cannot."""
    check(len(dims) == td.nbDims, argname, f"has {len(dims)} dims but the transform has nbDims={td.nbDims}")
    _check_pads(td)
    F_ = math.prod(td.folds)
    sp = list(zip(dims[2:], td.padBefore[2:], td.padAfter[2:], td.folds))
    if td.direction == FOLD:
        out = [dims[0], dims[1] * F_]
        for s, b, a, f in sp:
            check(s + b + a > 0, argname, f"padding {b}/{a} leaves nothing of a spatial dim of {s}")
            out.append(-(-(s + b + a) // f))
    else:
        check(dims[1] % F_ == 0, argname, f"C={dims[1]} is not a multiple of the fold product {F_}")
        out = [dims[0], dims[1] // F_]
        for s, b, a, f in sp:
            check(s * f - b - a > 0, argname, f"unfolding {s} by {f} and removing {b}+{a} leaves nothing")
            out.append(s * f - b - a)
    return tuple(out)


def _as_2d(dims, strides, td):
    """Tensors of 1 spatial dim get a unit second one (Resample needs 2 or 3): (dims, strides, before,
    after, folds) over the spatial dims."""
    before, after, folds = list(td.padBefore[2:]), list(td.padAfter[2:]), list(td.folds)
    dims, strides = list(dims), list(strides)
    if len(dims) == 3:
        dims.append(1)
        strides.append(1)
        before, after, folds = before + [0], after + [0], folds + [1]
    return dims, strides, before, after, folds


def _phases(folds) -> list:
    """(phase index, phase tuple j) in row-major order."""
    return list(enumerate(itertools.product(*[range(f) for f in folds])))


def shifted(data, nbytes: int):
    """The data argument ``nbytes`` further on (a strided view that starts inside a buffer), in every
    form a data argument takes (``_core.bound_graph.at``: ctypes pointers and buffer objects too)."""
    return data if isinstance(data, int) and not data else _at(data, nbytes)  # NULL stays NULL


def _resample(x, y, pre, stride) -> Operation:
    nsp = len(pre)
    return Operation("ResampleForward", {"x": x}, {"y": y},
                     {"mode": "AVGPOOL_INCLUDE_PADDING", "window": (1,) * nsp, "stride": tuple(stride),
                      "pre_padding": tuple(pre), "post_padding": (0,) * nsp, "nan_propagation": "PROPAGATE"})


class _Plan:
    """The phase ops of one transform and the data offsets of their views."""

    def __init__(self):
        self.ops, self.offsets = [], {}  # offsets: uid -> (which buffer 'src'|'dst', element offset)


def _fold_ops(sd, dd, td) -> _Plan:
    """FOLD: phase j of dest (a channel-strided view) = shifted, strided copy of padded src."""
    sdims, sstr, before, _, folds = _as_2d(sd.dims, sd.strides, td)
    ddims, dstr, _, _, _ = _as_2d(dd.dims, dd.strides, td)
    F_ = math.prod(folds)
    p = _Plan()
    src = Tensor(SRC, sdims, sstr, sd.dtype, name="src")
    for k, j in _phases(folds):
        out = Tensor(DST_PHASE[k], [ddims[0], sdims[1]] + ddims[2:], [dstr[0], dstr[1] * F_] + dstr[2:], dd.dtype,
                     name=f"dest_phase{k}")
        p.offsets[out.uid] = ("dst", k * dstr[1])
        p.ops.append(_resample(src, out, [b - jj for b, jj in zip(before, j)], folds))
    p.offsets[SRC] = ("src", 0)
    return p


def _unfold_ops(sd, dd, td, beta_zero: bool) -> _Plan:
    """UNFOLD: the dest positions of phase j (a strided, shifted view) = the source channels of
    phase j, cropped by the padding, blended with alpha/beta."""
    sdims, sstr, before, _, folds = _as_2d(sd.dims, sd.strides, td)
    ddims, dstr, _, _, _ = _as_2d(dd.dims, dd.strides, td)
    F_ = math.prod(folds)
    p = _Plan()
    for k, j in _phases(folds):
        h0 = [(jj - b) % f for jj, b, f in zip(j, before, folds)]
        n = [-(-(s - h) // f) for s, h, f in zip(ddims[2:], h0, folds)]
        if min(n) <= 0:
            continue
        start = [(h + b - jj) // f for h, b, jj, f in zip(h0, before, j, folds)]
        src = Tensor(SRC_PHASE[k], [sdims[0], ddims[1]] + sdims[2:], [sstr[0], sstr[1] * F_] + sstr[2:], sd.dtype,
                     name=f"src_phase{k}")
        out = Tensor(DST_PHASE[k], ddims[:2] + n, dstr[:2] + [s * f for s, f in zip(dstr[2:], folds)], dd.dtype,
                     name=f"dest_phase{k}")
        tmp = virtual(TMP_PHASE[k], out.dims, compute_dtype(dd.dtype), f"phase{k}")
        p.offsets[src.uid] = ("src", k * sstr[1])
        p.offsets[out.uid] = ("dst", sum(h * s for h, s in zip(h0, dstr[2:])))
        p.ops += [_resample(src, tmp, [-s for s in start], [1] * len(start)), blend(tmp, out, beta_zero)]
    return p


def _transform(h, td, alpha, sd, src, beta, dd, dst, names, fn: str) -> None:
    """TransformTensorEx / TransformFilter: validate, then run the transform's graph."""
    sn, dn = names
    check(sd.nbDims == dd.nbDims, dn, f"has {dd.nbDims} dims but {sn} has {sd.nbDims}")
    check(not same_buffer(src, dst), "destData", "must not overlap srcData (no in-place transforms)")
    want = dest_dims(td, sd.dims, sn)
    check(dd.dims == want, dn, f"dims {dd.dims} are not the transform of {sn} dims {sd.dims}: expected {want}")
    for d, n in ((sd, sn), (dd, dn)):
        if d.dataType in VECTOR_WIDTH:
            raise not_supported(n, "vector data types (NCHW_VECT_C) are not supported")
    dbl = dd.dtype == "float64"
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)
    reshaping = td.folding or td.padding
    if reshaping and not (td.nbDims - 2 in (1, 2, 3)):
        raise not_supported(sn, f"folding and padding support 1 to 3 spatial dims, got {td.nbDims - 2}")
    if reshaping and td.direction == FOLD and (a, b) != (1.0, 0.0):
        raise not_supported("alpha,beta", f"folding and padding need (alpha, beta) = (1, 0), got ({a}, {b})")
    full_src, full_dst = sd.ir(SRC, sn), dd.ir(DST, dn)
    bind(h, src, full_src, "srcData")  # the whole extents must be there before views are taken
    bind(h, dst, full_dst, "destData")

    def build():
        if not reshaping:
            return OperationGraph([blend(full_src, full_dst, b == 0)], fn)
        plan = _fold_ops(sd, dd, td) if td.direction == FOLD else _unfold_ops(sd, dd, td, b == 0)
        return OperationGraph(plan.ops, fn)

    if not reshaping:
        tensors = {SRC: (src, "srcData"), DST: (dst, "destData")}
    else:
        plan = _fold_ops(sd, dd, td) if td.direction == FOLD else _unfold_ops(sd, dd, td, b == 0)
        size = {"src": dtypes.itemsize(sd.dtype), "dst": dtypes.itemsize(dd.dtype)}
        data = {"src": (src, "srcData"), "dst": (dst, "destData")}
        tensors = {uid: (shifted(data[w][0], off * size[w]), data[w][1]) for uid, (w, off) in plan.offsets.items()}
    run(h, (fn, td.key(), sd.key(), dd.key(), b == 0), build, tensors, {ALPHA: a, BETA: b})


@legacy("cudnnInitTransformDest")
def initTransformDest(transformDesc, srcDesc, destDesc) -> int:
    """Set ``destDesc`` to the packed (destFormat) result of the transform of ``srcDesc`` and return
    its size in bytes (002 §3.2.64).  BAD_PARAM: nbDims differ from the transform's or the
    transform does not fit; NOT_SUPPORTED: not 4-d."""
    td = transform_desc(transformDesc, "transformDesc")
    sd = resolve(srcDesc, TensorDescriptor, "srcDesc")
    dd = resolve(destDesc, TensorDescriptor, "destDesc", need_set=False)
    check(sd.nbDims == td.nbDims, "srcDesc", f"has {sd.nbDims} dims but the transform has nbDims={td.nbDims}")
    if sd.nbDims != 4:
        raise not_supported("srcDesc", f"only 4-d tensors are supported, got {sd.nbDims} dims")
    dims = dest_dims(td, sd.dims)
    dd.set(sd.dataType, td.destFormat, dims, packed_strides(td.destFormat, dims))
    return extent_bytes(dd.ir(0, "destDesc"))


@legacy("cudnnTransformTensorEx")
def transformTensorEx(handle, transDesc, alpha, srcDesc, srcData, beta, destDesc, destData) -> None:
    """dest = fold/unfold/pad of src (module docstring), blended as 002 §3.2.101 allows.
    BAD_PARAM: nbDims differ, dest dims not the transform of src's, in place.  NOT_SUPPORTED:
    (alpha, beta) != (1, 0) when folding or padding, padding N or C."""
    h = get_handle(handle)
    td = transform_desc(transDesc)
    sd = resolve(srcDesc, TensorDescriptor, "srcDesc")
    dd = resolve(destDesc, TensorDescriptor, "destDesc")
    _transform(h, td, alpha, sd, srcData, beta, dd, destData, ("srcDesc", "destDesc"), "TransformTensorEx")


@legacy("cudnnTransformFilter")
def transformFilter(handle, transDesc, alpha, srcDesc, srcData, beta, destDesc, destData) -> None:
    """TransformTensorEx on filter descriptors (K, C, spatial...), 002 §3.2.99."""
    h = get_handle(handle)
    td = transform_desc(transDesc)
    sd = resolve(srcDesc, FilterDescriptor, "srcDesc")
    dd = resolve(destDesc, FilterDescriptor, "destDesc")
    _transform(h, td, alpha, sd, srcData, beta, dd, destData, ("srcDesc", "destDesc"), "TransformFilter")


# -- filter reordering ---------------------------------------------------------------

W, W_OUT, B, B_OUT = Uids().data(4)  # uids of the reordering graph: filter, reordered filter, bias, reordered bias


def _flat(uid, n, dtype, name) -> Tensor:
    return Tensor(uid, (n,), (1,), dtype, name=name)


@legacy("cudnnReorderFilterAndBias")
def reorderFilterAndBias(handle, filterDesc, reorderType, filterData, reorderedFilterData, reorderBias=0,
                         biasData=None, reorderedBiasData=None) -> None:
    """Copy the filter (and the bias when reorderBias > 0) into the layout our convolutions read
    (module docstring).  BAD_PARAM: invalid reorderType, NULL data."""
    h = get_handle(handle)
    wd = resolve(filterDesc, FilterDescriptor, "filterDesc")
    check(is_valid("cudnnReorderType_t", reorderType), "reorderType", f"{reorderType!r} is not a cudnnReorderType_t")
    for p, n in ((filterData, "filterData"), (reorderedFilterData, "reorderedFilterData")):
        check(p is not None and not (isinstance(p, int) and p == 0), n, "is NULL")
    with_bias = isinstance(reorderBias, numbers.Integral) and reorderBias > 0
    if with_bias:
        for p, n in ((biasData, "biasData"), (reorderedBiasData, "reorderedBiasData")):
            check(p is not None and not (isinstance(p, int) and p == 0), n, "is NULL")
    n = math.prod(wd.dims)  # filter descriptors are packed; vector types count scalars (C holds the lanes)
    dtype = wd.dtype  # INT8x4/INT8x32 -> int8, UINT8x4 -> uint8
    btype = "float32" if not dtypes.is_float(dtype) else dtype
    k = wd.dims[0]

    def build():
        ops = [Operation("Pointwise", {"x": _flat(W, n, dtype, "filter")}, {"y": _flat(W_OUT, n, dtype, "reordered_filter")},
                         {"mode": "IDENTITY"})]
        if with_bias:
            ops.append(Operation("Pointwise", {"x": _flat(B, k, btype, "bias")}, {"y": _flat(B_OUT, k, btype, "reordered_bias")},
                                 {"mode": "IDENTITY"}))
        return OperationGraph(ops, "ReorderFilterAndBias")

    tensors = {W: (filterData, "filterData"), W_OUT: (reorderedFilterData, "reorderedFilterData")}
    if with_bias:
        tensors.update({B: (biasData, "biasData"), B_OUT: (reorderedBiasData, "reorderedBiasData")})
    run(h, ("ReorderFilterAndBias", wd.key(), with_bias), build, tensors, {})
