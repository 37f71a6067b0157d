"""The v6/v7 RNN compute calls that cuDNN 8.0 deprecated and cuDNN 9 removed, translated to
the same core as the v8 calls (002 §7.2.33 cudnnGetRNNWorkspaceSize, §8.2.14
cudnnGetRNNTrainingReserveSize, §7.2.37/§7.2.38 cudnnRNNForwardInference[Ex], §8.2.23/§8.2.24
cudnnRNNForwardTraining[Ex], §8.2.17/§8.2.19 cudnnRNNBackwardData[Ex], §8.2.20/§8.2.22
cudnnRNNBackwardWeights[Ex]).

Non-Ex calls describe each time step with a tensor descriptor [batch_t, vectorSize, 1]
(batch_t non-increasing, data packed step after step): that is the SEQ_MAJOR_PACKED layout
with sequence lengths read off the batch sizes.  Descriptor arrays are Python sequences, or,
as CuPy passed them, a host pointer to an array of descriptor handles.  Weights are the
filter-described params buffer, the same bytes as the v8 weight space.  Legacy
BackwardWeights adds into dw, as CUDNN_WGRAD_MODE_ADD does.
"""
from __future__ import annotations

import ctypes
import math
import numbers

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import packed_strides
from .._core import bound_graph as bg
from .._core.registry import legacy
from .._core.data import library_object, raw_address, read_host
from ..errors import bad_param, check, not_supported
from ..handle import get_handle
from .core import Geometry, config_of, spaces
from .desc import PADDED_IO, check_call_types, rnn_desc
from .v8 import check_algo, check_sizes, check_state_desc, data_pair, dispatch
from .weights import DTYPE_CODE, check_wdesc
from ..tensor import VECTOR_WIDTH, tensor_desc


LEGACY_NAMES = {"w": "w", "dw": "dw"}  # the legacy calls' names of the weight buffers in messages


def desc_array(arr, n: int, argname: str) -> list:
    """``n`` tensor descriptors from a sequence, or from a host pointer to an array of handles."""
    check(isinstance(n, int) and n > 0, "seqLength", f"must be a positive int, got {n!r}")
    if library_object(arr):  # one descriptor is no array, and its id is no address
        raise bad_param(argname, f"is {arr!r}; an array of seqLength = {n} descriptors is expected "
                                 "(a sequence, or a host pointer to the handles)")
    addr = raw_address(arr)
    if addr is None and isinstance(arr, numbers.Integral) and not isinstance(arr, bool):
        addr = int(arr)  # CuPy 13's convention: a host pointer int to an array of handles
    if addr is not None:
        check(addr != 0, argname, "is NULL")
        raw = read_host(addr, n * ctypes.sizeof(ctypes.c_size_t))  # None, never a fault, for a bad address
        check(raw is not None, argname, f"{addr:#x} is not a readable host pointer to {n} descriptor handles")
        arr = list((ctypes.c_size_t * n).from_buffer_copy(raw))
    try:
        held = len(arr)
    except TypeError:
        held = -1
    check(held >= n, argname, f"must hold seqLength = {n} descriptors")
    return [tensor_desc(arr[t], f"{argname}[{t}]") for t in range(n)]


def step_geometry(d, seqLength, xDesc, argname="xDesc"):
    """(config, geometry) from per-step input descriptors; the batch may only shrink."""
    xds = desc_array(xDesc, seqLength, argname)
    x0 = xds[0]
    if x0.dtype not in DTYPE_CODE or x0.dataType in VECTOR_WIDTH:
        raise not_supported(f"{argname}[0]", f"data type {x0.dtype} is not HALF, FLOAT or DOUBLE")
    batches = []
    for t, xd in enumerate(xds):
        name = f"{argname}[{t}]"
        check(xd.nbDims >= 2 and all(v == 1 for v in xd.dims[2:]), name, f"must be [batch, vectorSize, 1], got {list(xd.dims)}")
        check(tuple(xd.strides) == packed_strides(xd.dims), name, "must be fully packed")
        check(xd.dataType == x0.dataType, name, f"data type must equal {argname}[0]'s")
        check(xd.dims[1] == x0.dims[1], name, f"vector size {xd.dims[1]} must equal {argname}[0]'s {x0.dims[1]}")
        check(not batches or xd.dims[0] <= batches[-1], name,
              f"batch {xd.dims[0]} is larger than step {t - 1}'s {batches[-1] if batches else 0}; batch sizes may not increase")
        batches.append(xd.dims[0])
    check_call_types(d, DTYPE_CODE[x0.dtype], x0.dims[1], argname)
    cfg = config_of(d, DTYPE_CODE[x0.dtype], x0.dims[1])
    B = batches[0]
    lengths = tuple(sum(1 for bt in batches if bt > b) for b in range(B))
    return cfg, Geometry("PACKED", seqLength, B, lengths), batches


def check_steps(cfg, batches, descs, argname, width):
    ds = desc_array(descs, len(batches), argname)
    for t, (sd, bt) in enumerate(zip(ds, batches)):
        name = f"{argname}[{t}]"
        check(tuple(sd.dims[:2]) == (bt, width) and all(v == 1 for v in sd.dims[2:]), name,
              f"must be [{bt}, {width}, 1], got {list(sd.dims)}")
        check(tuple(sd.strides) == packed_strides(sd.dims), name, "must be fully packed")
        check(sd.dtype == cfg.dtype, name, f"data type must be {cfg.dtype}")


def check_states(cfg, B, items) -> None:
    """items: (desc, data, argname, width); each descriptor checked (NULL only with NULL data)."""
    for desc, data, argname, width in items:
        check_state_desc(desc, argname, cfg, B, width, not bg.is_null(data))


def _wsize(cfg, wDesc, argname="wDesc"):
    wd = check_wdesc(cfg, wDesc, argname)
    return math.prod(wd.dims) * dtypes.itemsize(cfg.dtype)


def _hc(cfg, B, pairs, names):
    """State descriptor checks for (desc, data) pairs: cell states (c*, dc*) are LSTM-only and
    hiddenSize wide, hidden states projSize (or hiddenSize) wide."""
    items = []
    for (desc, data), name in zip(pairs, names):
        cell_state = name.lstrip("d").startswith("c")
        if cell_state and cfg.mode != "LSTM":
            continue
        items.append((desc, data, name + "Desc", cfg.H if cell_state else cfg.Hout))
    check_states(cfg, B, items)


def _no_attention(**kw):
    for name, v in kw.items():
        if not bg.is_null(v):
            raise not_supported(name, "is reserved for attention and must be NULL")


def _legacy_size_geometry(d, seqLength, xDesc):
    cfg, geo, batches = step_geometry(d, seqLength, xDesc)
    if d.auxFlags & PADDED_IO:  # padded IO: room for every (step, sequence) vector (002 §7.2.51)
        geo = Geometry("SEQ", seqLength, batches[0], (seqLength,) * batches[0])
    return cfg, geo


@legacy("cudnnGetRNNWorkspaceSize")
def getRNNWorkspaceSize(handle, rnnDesc, seqLength, xDesc) -> int:
    """Bytes of workspace the legacy RNN calls need (002 §7.2.33)."""
    get_handle(handle)
    cfg, geo = _legacy_size_geometry(rnn_desc(rnnDesc), seqLength, xDesc)
    return spaces(cfg, geo).ws_size


@legacy("cudnnGetRNNTrainingReserveSize")
def getRNNTrainingReserveSize(handle, rnnDesc, seqLength, xDesc) -> int:
    """Bytes of reserve space the legacy RNN training calls need (002 §8.2.14)."""
    get_handle(handle)
    cfg, geo = _legacy_size_geometry(rnn_desc(rnnDesc), seqLength, xDesc)
    return spaces(cfg, geo).rs_size


def _forward(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy, cyDesc, cy,
             workspace, workSpaceSizeInBytes, reserveSpace, reserveSpaceSizeInBytes, training, ex=False):
    h = get_handle(handle)
    d = rnn_desc(rnnDesc)
    fill = None
    if ex:
        cfg, geo, _, yd = data_pair(d, xDesc, yDesc)
        fill = yd.paddingFill if geo.padded else None
    else:
        cfg, geo, batches = step_geometry(d, seqLength, xDesc)
        check_steps(cfg, batches, yDesc, "yDesc", cfg.D * cfg.Hout)
        check_algo(d, geo, cfg)
    _hc(cfg, geo.B, [(hxDesc, hx), (cxDesc, cx), (hyDesc, hy), (cyDesc, cy)], ["hx", "cx", "hy", "cy"])
    check(not bg.is_null(x), "x", "is NULL")
    check(not bg.is_null(y), "y", "is NULL")
    check_sizes(cfg, geo, training, _wsize(cfg, wDesc), workSpaceSizeInBytes, reserveSpaceSizeInBytes, "wDesc")
    bufs = {"x": x, "y": y, "hx": hx, "hy": hy, "w": w, "ws": workspace}
    if cfg.mode == "LSTM":
        bufs.update(cx=cx, cy=cy)
    if training:
        bufs["rs"] = reserveSpace
    dispatch(h, d, cfg, geo, "forward", training, bufs, fill, LEGACY_NAMES)


@legacy("cudnnRNNForwardInference", cupy="RNNForwardInference")
def RNNForwardInference(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy,
                        cyDesc, cy, workspace, workSpaceSizeInBytes) -> None:
    """Legacy RNN forward inference with packed per-step tensor descriptors (002 §7.2.37)."""
    _forward(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy, cyDesc, cy,
             workspace, workSpaceSizeInBytes, None, 0, False)


@legacy("cudnnRNNForwardTraining", cupy="RNNForwardTraining")
def RNNForwardTraining(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy,
                       cyDesc, cy, workspace, workSpaceSizeInBytes, reserveSpace, reserveSpaceSizeInBytes) -> None:
    """Legacy RNN forward training; fills reserveSpace for the backward calls (002 §8.2.23)."""
    _forward(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy, cyDesc, cy,
             workspace, workSpaceSizeInBytes, reserveSpace, reserveSpaceSizeInBytes, True)


@legacy("cudnnRNNForwardInferenceEx", cupy="RNNForwardInferenceEx")
def RNNForwardInferenceEx(handle, rnnDesc, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy, cyDesc, cy,
                          kDesc, keys, cDesc, cAttn, iDesc, iAttn, qDesc, queries, workSpace,
                          workSpaceSizeInBytes) -> None:
    """Legacy RNN forward inference with RNN data (padded) layouts (002 §7.2.38)."""
    _no_attention(kDesc=kDesc, keys=keys, cDesc=cDesc, cAttn=cAttn, iDesc=iDesc, iAttn=iAttn, qDesc=qDesc, queries=queries)
    _forward(handle, rnnDesc, None, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy, cyDesc, cy,
             workSpace, workSpaceSizeInBytes, None, 0, False, ex=True)


@legacy("cudnnRNNForwardTrainingEx", cupy="RNNForwardTrainingEx")
def RNNForwardTrainingEx(handle, rnnDesc, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy, cyDesc, cy,
                         kDesc, keys, cDesc, cAttn, iDesc, iAttn, qDesc, queries, workSpace, workSpaceSizeInBytes,
                         reserveSpace, reserveSpaceSizeInBytes) -> None:
    """Legacy RNN forward training with RNN data (padded) layouts (002 §8.2.24)."""
    _no_attention(kDesc=kDesc, keys=keys, cDesc=cDesc, cAttn=cAttn, iDesc=iDesc, iAttn=iAttn, qDesc=qDesc, queries=queries)
    _forward(handle, rnnDesc, None, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy, cyDesc, cy,
             workSpace, workSpaceSizeInBytes, reserveSpace, reserveSpaceSizeInBytes, True, ex=True)


def _backward_data(handle, rnnDesc, seqLength, yDesc, y, dyDesc, dy, dhyDesc, dhy, dcyDesc, dcy, wDesc, w, hxDesc, hx,
                   cxDesc, cx, dxDesc, dx, dhxDesc, dhx, dcxDesc, dcx, workspace, workSpaceSizeInBytes, reserveSpace,
                   reserveSpaceSizeInBytes, ex=False):
    h = get_handle(handle)
    d = rnn_desc(rnnDesc)
    if ex:
        cfg, geo, _, _ = data_pair(d, dxDesc, yDesc, "dxDesc", "yDesc")
        data_pair(d, dxDesc, dyDesc, "dxDesc", "dyDesc")
    else:
        cfg, geo, batches = step_geometry(d, seqLength, dxDesc, "dxDesc")
        check_steps(cfg, batches, yDesc, "yDesc", cfg.D * cfg.Hout)
        check_steps(cfg, batches, dyDesc, "dyDesc", cfg.D * cfg.Hout)
        check_algo(d, geo, cfg)
    _hc(cfg, geo.B, [(hxDesc, hx), (cxDesc, cx), (dhyDesc, dhy), (dcyDesc, dcy), (dhxDesc, dhx), (dcxDesc, dcx)],
        ["hx", "cx", "dhy", "dcy", "dhx", "dcx"])
    for name, v in (("y", y), ("dy", dy), ("dx", dx)):
        check(not bg.is_null(v), name, "is NULL")
    check_sizes(cfg, geo, True, _wsize(cfg, wDesc), workSpaceSizeInBytes, reserveSpaceSizeInBytes, "wDesc")
    bufs = {"y": y, "dy": dy, "dx": dx, "hx": hx, "dhy": dhy, "dhx": dhx, "w": w, "ws": workspace, "rs": reserveSpace}
    if cfg.mode == "LSTM":
        bufs.update(cx=cx, dcy=dcy, dcx=dcx)
    dispatch(h, d, cfg, geo, "backward_data", True, bufs, argnames=LEGACY_NAMES)


@legacy("cudnnRNNBackwardData", cupy="RNNBackwardData")
def RNNBackwardData(handle, rnnDesc, seqLength, yDesc, y, dyDesc, dy, dhyDesc, dhy, dcyDesc, dcy, wDesc, w, hxDesc, hx,
                    cxDesc, cx, dxDesc, dx, dhxDesc, dhx, dcxDesc, dcx, workspace, workSpaceSizeInBytes, reserveSpace,
                    reserveSpaceSizeInBytes) -> None:
    """Legacy RNN backward data: dx, dhx, dcx from dy and reserveSpace (002 §8.2.17)."""
    _backward_data(handle, rnnDesc, seqLength, yDesc, y, dyDesc, dy, dhyDesc, dhy, dcyDesc, dcy, wDesc, w, hxDesc, hx,
                   cxDesc, cx, dxDesc, dx, dhxDesc, dhx, dcxDesc, dcx, workspace, workSpaceSizeInBytes, reserveSpace,
                   reserveSpaceSizeInBytes)


@legacy("cudnnRNNBackwardDataEx", cupy="RNNBackwardDataEx")
def RNNBackwardDataEx(handle, rnnDesc, yDesc, y, dyDesc, dy, dcDesc, dcAttn, dhyDesc, dhy, dcyDesc, dcy, wDesc, w,
                      hxDesc, hx, cxDesc, cx, dxDesc, dx, dhxDesc, dhx, dcxDesc, dcx, dkDesc, dkeys, workSpace,
                      workSpaceSizeInBytes, reserveSpace, reserveSpaceSizeInBytes) -> None:
    """Legacy RNN backward data with RNN data (padded) layouts (002 §8.2.19)."""
    _no_attention(dcDesc=dcDesc, dcAttn=dcAttn, dkDesc=dkDesc, dkeys=dkeys)
    _backward_data(handle, rnnDesc, None, yDesc, y, dyDesc, dy, dhyDesc, dhy, dcyDesc, dcy, wDesc, w, hxDesc, hx,
                   cxDesc, cx, dxDesc, dx, dhxDesc, dhx, dcxDesc, dcx, workSpace, workSpaceSizeInBytes, reserveSpace,
                   reserveSpaceSizeInBytes, ex=True)


def _backward_weights(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, yDesc, y, workspace, workSpaceSizeInBytes,
                      dwDesc, dw, reserveSpace, reserveSpaceSizeInBytes, ex=False):
    h = get_handle(handle)
    d = rnn_desc(rnnDesc)
    if ex:
        cfg, geo, _, _ = data_pair(d, xDesc, yDesc)
    else:
        cfg, geo, batches = step_geometry(d, seqLength, xDesc)
        check_steps(cfg, batches, yDesc, "yDesc", cfg.D * cfg.Hout)
        check_algo(d, geo, cfg)
    check_states(cfg, geo.B, [(hxDesc, hx, "hxDesc", cfg.Hout)])
    for name, v in (("x", x), ("y", y), ("dw", dw)):
        check(not bg.is_null(v), name, "is NULL")
    check_sizes(cfg, geo, True, _wsize(cfg, dwDesc, "dwDesc"), workSpaceSizeInBytes, reserveSpaceSizeInBytes, "dwDesc")
    bufs = {"x": x, "hx": hx, "y": y, "dw": dw, "ws": workspace, "rs": reserveSpace}
    dispatch(h, d, cfg, geo, "backward_weights", True, bufs, argnames=LEGACY_NAMES)


@legacy("cudnnRNNBackwardWeights", cupy="RNNBackwardWeights")
def RNNBackwardWeights(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, yDesc, y, workspace, workSpaceSizeInBytes,
                       dwDesc, dw, reserveSpace, reserveSpaceSizeInBytes) -> None:
    """Legacy RNN weight gradients, added into dw (002 §8.2.20)."""
    _backward_weights(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, yDesc, y, workspace, workSpaceSizeInBytes,
                      dwDesc, dw, reserveSpace, reserveSpaceSizeInBytes)


@legacy("cudnnRNNBackwardWeightsEx", cupy="RNNBackwardWeightsEx")
def RNNBackwardWeightsEx(handle, rnnDesc, xDesc, x, hxDesc, hx, yDesc, y, workSpace, workSpaceSizeInBytes, dwDesc, dw,
                         reserveSpace, reserveSpaceSizeInBytes) -> None:
    """Legacy RNN weight gradients with RNN data layouts, added into dw (002 §8.2.22)."""
    _backward_weights(handle, rnnDesc, None, xDesc, x, hxDesc, hx, yDesc, y, workSpace, workSpaceSizeInBytes, dwDesc,
                      dw, reserveSpace, reserveSpaceSizeInBytes, ex=True)
