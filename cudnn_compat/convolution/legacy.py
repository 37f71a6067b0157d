"""Convolution calls v7 code still makes and the convolution helper queries (002 Table 5: the
removed cudnnGetConvolutionForwardAlgorithm, ...BackwardDataAlgorithm, ...BackwardFilterAlgorithm
and their preference enums; §5.2.31 cudnnIm2Col; §5.2.30 cudnnGetFoldedConvBackwardDataDescriptors;
inventory §2.4).  Descriptors come from ``convolution.descriptor``, validation and the algorithm
ranking from ``convolution.api``.

Get*Algorithm (v7): the first algorithm of cnn's heuristic ranking (cudnnGet*Algorithm_v7) that
can run the problem and meets the preference: NO_WORKSPACE needs 0 bytes, PREFER_FASTEST takes
the top one, SPECIFY_WORKSPACE_LIMIT needs at most memoryLimitInBytes.  BAD_PARAM for an
invalid preference or a negative limit; NOT_SUPPORTED when no algorithm qualifies.  The
preference enums, removed in 8.0, keep their v7 values; they are registered with ``enums`` so
they are also package constants.

Im2Col: the A matrix of GEMM convolution, rows (n, y spatial...) and columns (c, filter
spatial...), both row-major, fully packed:
    A[(n, o1, o2), (c, r1, r2)] = x[n, c, o1*u1 + r1'*d1 - p1, o2*u2 + r2'*d2 - p2]  (0 outside x)
with r' = r for CROSS_CORRELATION and R-1-r for CONVOLUTION, so that A @ w.reshape(K, -1).T is
the convolution in either mode.  One graph: a ResampleForward per filter position (window 1,
the conv stride, pre-padding p - r'*d) writing a strided view of the matrix.  NOT_SUPPORTED
for INT8 / INT8x4 / INT8x32 data or compute type and for groupCount > 1 (002).

GetFoldedConvBackwardDataDescriptors: a strided backward-data convolution as a stride-1 one
on folded tensors.  Per spatial dim (stride u, padding p, filter R, dx size H, dy size Ho),
with e = -p mod u (zeros put before the filter so the padding becomes a multiple of u):
    folded filter   fold(pad(w, before e, after to a multiple of u), u)   Rf = ceil((R+e)/u)
    folded dx       fold(pad(dx, after to a multiple of u), u)            Hf = ceil(H/u)
    padded dy       pad(dy, before d, after a) with d = max(0, Ho + Rf - 1 - Hf - 2P), P = (p+e)/u
    folded conv     stride 1, padding P + d, dilation 1; a chosen so dy's size is its output's
Then unfold(BackwardData(folded filter, padded dy)) equals BackwardData(w, dy) (the folded
channel c*F + j holds phase j of channel c, see ``transform``).  BAD_PARAM for NULL arguments
and tensors over 4 dims (002), the shape rules of cnn; NOT_SUPPORTED for group counts above 1,
dilation, CONVOLUTION mode, and a transformFormat other than NCHW or NHWC.
"""
from __future__ import annotations

import itertools
import math
import numbers

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import OperationGraph, Tensor
from . import api as cnn, descriptor as conv
from .. import tensor, transform
from .._core.call import run
from .._core.data import bind
from .._core.descriptor import resolve
from .._core.registry import legacy
from ..enums import ENUMS, name_of
from ..errors import STATUS, check, not_supported
from ..handle import get_handle
from ..tensor import D, FilterDescriptor, TensorDescriptor

# -- the v7 preference enums (removed in 8.0) ----------------------------------------

PREFERENCES = {
    "cudnnConvolutionFwdPreference_t": {
        "CUDNN_CONVOLUTION_FWD_NO_WORKSPACE": 0, "CUDNN_CONVOLUTION_FWD_PREFER_FASTEST": 1,
        "CUDNN_CONVOLUTION_FWD_SPECIFY_WORKSPACE_LIMIT": 2},
    "cudnnConvolutionBwdDataPreference_t": {
        "CUDNN_CONVOLUTION_BWD_DATA_NO_WORKSPACE": 0, "CUDNN_CONVOLUTION_BWD_DATA_PREFER_FASTEST": 1,
        "CUDNN_CONVOLUTION_BWD_DATA_SPECIFY_WORKSPACE_LIMIT": 2},
    "cudnnConvolutionBwdFilterPreference_t": {
        "CUDNN_CONVOLUTION_BWD_FILTER_NO_WORKSPACE": 0, "CUDNN_CONVOLUTION_BWD_FILTER_PREFER_FASTEST": 1,
        "CUDNN_CONVOLUTION_BWD_FILTER_SPECIFY_WORKSPACE_LIMIT": 2},
}
for _t, _vals in PREFERENCES.items():
    ENUMS.setdefault(_t, dict(_vals))
    globals().update(_vals)
NO_WORKSPACE, PREFER_FASTEST, SPECIFY_WORKSPACE_LIMIT = 0, 1, 2
_PREF_TYPE = {"FWD": "cudnnConvolutionFwdPreference_t", "BWD_DATA": "cudnnConvolutionBwdDataPreference_t",
              "BWD_FILTER": "cudnnConvolutionBwdFilterPreference_t"}


def _choose(dr, handle, first, second, convDesc, out, preference, memoryLimitInBytes) -> int:
    type_name = _PREF_TYPE[dr.name]
    check(isinstance(preference, numbers.Integral) and int(preference) in PREFERENCES[type_name].values(), "preference",
          f"{preference!r} is not a {type_name}")
    if preference == SPECIFY_WORKSPACE_LIMIT:
        check(isinstance(memoryLimitInBytes, numbers.Integral) and not isinstance(memoryLimitInBytes, bool)
              and memoryLimitInBytes >= 0, "memoryLimitInBytes", f"must be a non-negative int, got {memoryLimitInBytes!r}")
    ranked = cnn._get_v7(dr, handle, first, second, convDesc, out, 1 << 16)
    ok = [p for p in ranked if p.status == STATUS["CUDNN_STATUS_SUCCESS"]]
    if preference == NO_WORKSPACE:
        ok = [p for p in ok if p.memory == 0]
    elif preference == SPECIFY_WORKSPACE_LIMIT:
        ok = [p for p in ok if p.memory <= memoryLimitInBytes]
    if not ok:
        raise not_supported("preference", f"no {dr.enum} algorithm meets {name_of(type_name, preference)}"
                                          + (f" with {memoryLimitInBytes} bytes" if preference == SPECIFY_WORKSPACE_LIMIT else ""))
    return ok[0].algo


@legacy("cudnnGetConvolutionForwardAlgorithm")
def getConvolutionForwardAlgorithm(handle, xDesc, wDesc, convDesc, yDesc, preference, memoryLimitInBytes=0) -> int:
    """The cudnnConvolutionFwdAlgo_t the v7 heuristics would pick (module docstring)."""
    return _choose(cnn.FWD, handle, xDesc, wDesc, convDesc, yDesc, preference, memoryLimitInBytes)


@legacy("cudnnGetConvolutionBackwardDataAlgorithm")
def getConvolutionBackwardDataAlgorithm(handle, wDesc, dyDesc, convDesc, dxDesc, preference,
                                        memoryLimitInBytes=0) -> int:
    """The cudnnConvolutionBwdDataAlgo_t the v7 heuristics would pick (module docstring)."""
    return _choose(cnn.BWD_DATA, handle, wDesc, dyDesc, convDesc, dxDesc, preference, memoryLimitInBytes)


@legacy("cudnnGetConvolutionBackwardFilterAlgorithm")
def getConvolutionBackwardFilterAlgorithm(handle, xDesc, dyDesc, convDesc, dwDesc, preference,
                                          memoryLimitInBytes=0) -> int:
    """The cudnnConvolutionBwdFilterAlgo_t the v7 heuristics would pick (module docstring)."""
    return _choose(cnn.BWD_FILTER, handle, xDesc, dyDesc, convDesc, dwDesc, preference, memoryLimitInBytes)


# -- im2col --------------------------------------------------------------------------

INT8_TYPES = (D["CUDNN_DATA_INT8"], D["CUDNN_DATA_INT8x4"], D["CUDNN_DATA_INT8x32"], D["CUDNN_DATA_UINT8"],
              D["CUDNN_DATA_UINT8x4"])
SRC, COL = 1, 1000  # uids: the source, the matrix view of filter position k is COL + k


@legacy("cudnnIm2Col")
def im2Col(handle, srcDesc, srcData, filterDesc, convDesc, colBuffer) -> None:
    """Write the im2col matrix of x (module docstring) into colBuffer (002 §5.2.31)."""
    h = get_handle(handle)
    xd = resolve(srcDesc, TensorDescriptor, "srcDesc")
    wd = resolve(filterDesc, FilterDescriptor, "filterDesc")
    cd = conv.conv_desc(convDesc)
    for p, n in ((srcData, "srcData"), (colBuffer, "colBuffer")):
        check(p is not None and not (isinstance(p, int) and p == 0), n, "is NULL")
    for t, n in ((xd.dataType, "srcDesc"), (wd.dataType, "filterDesc"), (cd.computeType, "convDesc")):
        if t in INT8_TYPES:
            raise not_supported(n, f"data type {name_of('cudnnDataType_t', t)} is not supported by cudnnIm2Col")
    if cd.groupCount > 1:
        raise not_supported("convDesc", f"groupCount {cd.groupCount} > 1 is not supported by cudnnIm2Col")
    out = conv._output_dims(cd, xd, wd, ("srcDesc", "filterDesc"))
    if xd.nbDims not in (4, 5):
        raise not_supported("srcDesc", f"im2col takes 4-d or 5-d tensors, got {xd.nbDims} dims")
    n, c, osp, fsp = xd.dims[0], xd.dims[1], out[2:], wd.dims[2:]
    width = c * math.prod(fsp)
    rows = n * math.prod(osp)
    flip = cd.mode == ENUMS["cudnnConvolutionMode_t"]["CUDNN_CONVOLUTION"]
    col_full = Tensor(COL, (rows, width), (width, 1), xd.dtype, name="colBuffer")
    bind(h, colBuffer, col_full, "colBuffer")
    # strides of the matrix seen as (N, C, O...) for one filter position
    ostr, acc = [], width
    for o in reversed(osp):
        ostr.insert(0, acc)
        acc *= o
    view_strides = (acc, math.prod(fsp)) + tuple(ostr)
    positions = list(itertools.product(*[range(r) for r in fsp]))

    def build():
        x = xd.ir(SRC, "srcData")
        ops = []
        for k, r in enumerate(positions):
            rr = [R - 1 - ri if flip else ri for ri, R in zip(r, fsp)]
            view = Tensor(COL + k, (n, c) + tuple(osp), view_strides, xd.dtype, name=f"col_position{k}")
            ops.append(transform._resample(x, view, [p - ri * d for p, ri, d in zip(cd.pad, rr, cd.dilation)], cd.stride))
        return OperationGraph(ops, "Im2Col")

    size = dtypes.itemsize(xd.dtype)
    tensors = {SRC: (srcData, "srcData")}
    for k in range(len(positions)):
        tensors[COL + k] = (transform.shifted(colBuffer, k * size), "colBuffer")
    run(h, ("Im2Col", xd.key(), wd.key(), cd.key()), build, tensors, {})


# -- folded backward data ------------------------------------------------------------

def _folded_geometry(u, p, R, H, Ho) -> dict:
    """The per-dim numbers of the module docstring."""
    e = (-p) % u
    P = (p + e) // u
    aw = (-(R + e)) % u
    Rf = (R + e + aw) // u
    g = (-H) % u
    Hf = (H + g) // u
    d = max(0, Ho + Rf - 1 - Hf - 2 * P)
    a = Hf + 2 * (P + d) - Rf + 1 - Ho - d
    return dict(e=e, aw=aw, Rf=Rf, g=g, Hf=Hf, pad=P + d, d=d, a=a)


@legacy("cudnnGetFoldedConvBackwardDataDescriptors")
def getFoldedConvBackwardDataDescriptors(handle, filterDesc, diffDesc, convDesc, gradDesc, transformFormat,
                                         foldedFilterDesc, paddedDiffDesc, foldedConvDesc, foldedGradDesc,
                                         filterFoldTransDesc, diffPadTransDesc, gradFoldTransDesc,
                                         gradUnfoldTransDesc) -> None:
    """Fill the eight output descriptors (created beforehand) as the module docstring describes."""
    get_handle(handle)
    outs = [resolve(foldedFilterDesc, FilterDescriptor, "foldedFilterDesc", need_set=False),
            resolve(paddedDiffDesc, TensorDescriptor, "paddedDiffDesc", need_set=False),
            conv.conv_desc(foldedConvDesc, "foldedConvDesc", need_set=False),
            resolve(foldedGradDesc, TensorDescriptor, "foldedGradDesc", need_set=False)]
    trans = [resolve(t, transform.TensorTransformDescriptor, n, need_set=False) for t, n in (
        (filterFoldTransDesc, "filterFoldTransDesc"), (diffPadTransDesc, "diffPadTransDesc"),
        (gradFoldTransDesc, "gradFoldTransDesc"), (gradUnfoldTransDesc, "gradUnfoldTransDesc"))]
    for d, n in ((resolve(filterDesc, FilterDescriptor, "filterDesc"), "filterDesc"),
                 (resolve(diffDesc, TensorDescriptor, "diffDesc"), "diffDesc"),
                 (resolve(gradDesc, TensorDescriptor, "gradDesc"), "gradDesc")):
        check(d.nbDims <= 4, n, f"has {d.nbDims} dims; folding supports 4-d tensors only")
    call = cnn._conv_call(cnn.BWD_DATA, filterDesc, diffDesc, gradDesc, convDesc)
    xd, wd, yd, cd = call.xd, call.wd, call.yd, call.cd
    if cd.groupCount != 1:
        raise not_supported("convDesc", f"folding supports groupCount 1, got {cd.groupCount}")
    if any(dl != 1 for dl in cd.dilation):
        raise not_supported("convDesc", f"folding supports dilation 1, got {cd.dilation}")
    if cd.mode != ENUMS["cudnnConvolutionMode_t"]["CUDNN_CROSS_CORRELATION"]:
        raise not_supported("convDesc", "folding supports CUDNN_CROSS_CORRELATION only")
    if transformFormat not in transform.DEST_FORMATS:
        raise not_supported("transformFormat", f"must be CUDNN_TENSOR_NCHW or CUDNN_TENSOR_NHWC, got "
                                               f"{name_of('cudnnTensorFormat_t', transformFormat)}")
    geo = [_folded_geometry(u, p, R, H, Ho) for u, p, R, H, Ho in
           zip(cd.stride, cd.pad, wd.dims[2:], xd.dims[2:], yd.dims[2:])]
    fold = [int(u) for u in cd.stride]
    F_ = math.prod(fold)
    n, c, k = xd.dims[0], xd.dims[1], wd.dims[0]
    fmt = int(transformFormat)
    ff, pdiff, fconv, fgrad = outs
    tensor.setFilterNdDescriptor.__wrapped__(ff, wd.dataType, fmt, 4, [k, c * F_] + [g["Rf"] for g in geo])
    tensor.setTensorNdDescriptorEx.__wrapped__(pdiff, fmt, yd.dataType, 4, [n, k] + [Ho + g["d"] + g["a"] for Ho, g in
                                                                                   zip(yd.dims[2:], geo)])
    conv.setConvolutionNdDescriptor.__wrapped__(fconv, 2, [g["pad"] for g in geo], [1, 1], [1, 1], cd.mode, cd.computeType)
    fconv.groupCount, fconv.mathType, fconv.reorderType = 1, cd.mathType, cd.reorderType
    fconv.changed()
    tensor.setTensorNdDescriptorEx.__wrapped__(fgrad, fmt, xd.dataType, 4, [n, c * F_] + [g["Hf"] for g in geo])
    zero = [0, 0]
    settings = [
        (zero + [g["e"] for g in geo], zero + [g["aw"] for g in geo], fold, transform.FOLD),  # filter fold
        (zero + [g["d"] for g in geo], zero + [g["a"] for g in geo], [1, 1], transform.FOLD),  # diff pad
        ([0] * 4, zero + [g["g"] for g in geo], fold, transform.FOLD),  # grad fold
        ([0] * 4, zero + [g["g"] for g in geo], fold, transform.UNFOLD),  # grad unfold
    ]
    for t, (before, after, fa, direction) in zip(trans, settings):
        transform.setTensorTransformDescriptor.__wrapped__(t, 4, fmt, before, after, fa, direction)
