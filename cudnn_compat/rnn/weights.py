"""Where the RNN weights live (002 §7.2.32 cudnnGetRNNWeightSpaceSize, §7.2.31
cudnnGetRNNWeightParams, §7.2.28 cudnnGetRNNParamsSize, §7.2.25
cudnnGetRNNLinLayerMatrixParams, §7.2.24 cudnnGetRNNLinLayerBiasParams).

The v8 weight space and the legacy params buffer are the same bytes (layout in rnn/core.py), so
weights filled through LinLayer pointers give the same results under both APIs.  Addresses
come back as what the caller passed: an int for a pointer, an array view (dims of the
returned descriptor) for a NumPy or CuPy array.
"""
from __future__ import annotations

import numpy as np

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import packed_strides
from .._core import bound_graph as bg
from .._core.data import address, buffer_at
from ..errors import CUDNN_STATUS_INVALID_VALUE, bad_param, check, not_supported
from ..handle import get_handle
from .._core.descriptor import resolve
from .._core.registry import legacy
from ..enums import ENUMS
from .core import GATES, RNN_MODES, config_of, lin_layer, weight_space_size
from .desc import check_call_types, rnn_desc, v8_desc
from ..tensor import VECTOR_WIDTH, FilterDescriptor, TensorDescriptor, filter_desc, tensor_desc

_DT = ENUMS["cudnnDataType_t"]
_NCHW = ENUMS["cudnnTensorFormat_t"]["CUDNN_TENSOR_NCHW"]
DTYPE_CODE = {"float16": _DT["CUDNN_DATA_HALF"], "float32": _DT["CUDNN_DATA_FLOAT"], "float64": _DT["CUDNN_DATA_DOUBLE"]}




def _check_ids(cfg, pseudoLayer, linLayerID, bias_only=False):
    check(0 <= int(pseudoLayer) < cfg.pseudo_layers, "pseudoLayer",
          f"{pseudoLayer} is out of range [0, {cfg.pseudo_layers}) (numLayers x directions)")
    g = GATES[cfg.mode]
    n = 2 * g + (1 if cfg.mode == "LSTM" and not bias_only else 0)
    check(0 <= int(linLayerID) < n, "linLayerID", f"{linLayerID} is out of range [0, {n}) for {cfg.mode} cells")


def _check_fits(cfg, size_bytes, argname):
    need = weight_space_size(cfg)
    check(int(size_bytes) >= need, argname, f"{size_bytes} bytes hold less than the {need} the weights need "
          "(some weight/bias elements are outside the buffer)", CUDNN_STATUS_INVALID_VALUE)


@legacy("cudnnGetRNNWeightSpaceSize")
def getRNNWeightSpaceSize(handle, rnnDesc) -> int:
    """Bytes of the weight space of a v8 RNN descriptor (002 §7.2.32)."""
    get_handle(handle)
    return weight_space_size(config_of(v8_desc(rnnDesc)))


@legacy("cudnnGetRNNWeightParams")
def getRNNWeightParams(handle, rnnDesc, pseudoLayer, weightSpaceSize, weightSpace, linLayerID, mDesc, bDesc) -> tuple:
    """(mAddr, bAddr); mDesc/bDesc get dims {1, rows, cols} / {1, rows, 1}, or nbDims 0 and None
    when the matrix or bias does not exist (SKIP_INPUT layer 0, no projection, bias mode)."""
    h = get_handle(handle)
    cfg = config_of(v8_desc(rnnDesc))
    _check_ids(cfg, pseudoLayer, linLayerID)
    md = resolve(mDesc, TensorDescriptor, "mDesc", need_set=False) if not bg.is_null(mDesc) else None
    bd = resolve(bDesc, TensorDescriptor, "bDesc", need_set=False) if not bg.is_null(bDesc) else None
    _check_fits(cfg, weightSpaceSize, "weightSpaceSize")
    check(not bg.is_null(weightSpace), "weightSpace", "is NULL")
    need = weight_space_size(cfg)
    mat, bias = lin_layer(cfg, int(pseudoLayer), int(linLayerID))
    out = []
    for blk, desc, bias_like in ((mat, md, False), (bias, bd, True)):
        if blk is None:
            if desc is not None:
                desc.set(DTYPE_CODE[cfg.dtype], _NCHW, (), ())
            out.append(None)
            continue
        dims = (1, blk.rows, 1 if bias_like else blk.cols)
        if desc is not None:
            desc.set(DTYPE_CODE[cfg.dtype], _NCHW, dims, packed_strides(dims))
        out.append(buffer_at(h, weightSpace, "weightSpace", need, blk.offset * dtypes.itemsize(cfg.dtype), dims,
                             cfg.dtype))
    return tuple(out)


def legacy_config(d, xDesc, argname="xDesc"):
    """Config of a descriptor for a legacy call whose input is described by tensor ``xDesc``
    ([batch, inputSize, 1], fully packed)."""
    xd = tensor_desc(xDesc, argname)
    check(xd.nbDims >= 2 and all(v == 1 for v in xd.dims[2:]), argname,
          f"must be [batch, inputSize, 1], got {list(xd.dims)}")
    check(tuple(xd.strides) == packed_strides(xd.dims), argname, "must be fully packed")
    if xd.dtype not in DTYPE_CODE or xd.dataType in VECTOR_WIDTH:
        raise not_supported(argname, f"data type {xd.dtype} is not HALF, FLOAT or DOUBLE")
    check_call_types(d, DTYPE_CODE[xd.dtype], xd.dims[1], argname)
    return config_of(d, DTYPE_CODE[xd.dtype], xd.dims[1]), xd


@legacy("cudnnGetRNNParamsSize")
def getRNNParamsSize(handle, rnnDesc, xDesc, dataType) -> int:
    """Bytes of the legacy weight buffer for an RNN descriptor and input descriptor (002 §7.2.28)."""
    get_handle(handle)
    cfg, xd = legacy_config(rnn_desc(rnnDesc), xDesc)
    check(int(dataType) == DTYPE_CODE[cfg.dtype], "dataType", "must be the data type of xDesc")
    return weight_space_size(cfg)


def check_wdesc(cfg, wDesc, argname="wDesc"):
    wd = filter_desc(wDesc, argname)
    check(wd.dtype == cfg.dtype, argname, f"data type {wd.dtype} must be the RNN's {cfg.dtype}")
    return wd


def _lin_layer_params(handle, rnnDesc, pseudoLayer, xDesc, wDesc, w, linLayerID, outDesc, bias: bool, argname):
    h = get_handle(handle)
    cfg, _ = legacy_config(rnn_desc(rnnDesc), xDesc)
    wd = check_wdesc(cfg, wDesc)
    _check_ids(cfg, pseudoLayer, linLayerID, bias_only=bias)
    od = resolve(outDesc, FilterDescriptor, argname, need_set=False)
    check(not bg.is_null(w), "w", "is NULL")
    need = int(np.prod(wd.dims)) * dtypes.itemsize(cfg.dtype)
    _check_fits(cfg, need, "wDesc")
    buffer_at(h, w, "w", need, 0, (0,), cfg.dtype)  # the checks of every data argument, before the address
    addr = address(w)
    if addr is not None and addr % dtypes.itemsize(cfg.dtype):
        raise bad_param("w", f"address {addr:#x} is not aligned to the {dtypes.itemsize(cfg.dtype)}-byte data type")
    mat, bvec = lin_layer(cfg, int(pseudoLayer), int(linLayerID))
    blk = bvec if bias else mat
    if blk is None:  # 002: a zeroed descriptor and NULL
        od.set(0, 0, (0, 0, 0), (0, 0, 0))
        return None
    dims = (1, blk.rows, 1 if bias else blk.cols)
    od.set(DTYPE_CODE[cfg.dtype], _NCHW, dims, packed_strides(dims))
    return buffer_at(h, w, "w", need, blk.offset * dtypes.itemsize(cfg.dtype), dims, cfg.dtype)


@legacy("cudnnGetRNNLinLayerMatrixParams")
def getRNNLinLayerMatrixParams(handle, rnnDesc, pseudoLayer, xDesc, wDesc, w, linLayerID, linLayerMatDesc):
    """linLayerMat (pointer or view); linLayerMatDesc gets {1, rows, cols}.  IDs (002): RELU/TANH
    0 W, 1 R; LSTM 0-3 W and 4-7 R (input, forget, new cell, output), 8 projection; GRU 0-2 W and
    3-5 R (reset, update, new)."""
    return _lin_layer_params(handle, rnnDesc, pseudoLayer, xDesc, wDesc, w, linLayerID, linLayerMatDesc, False,
                             "linLayerMatDesc")


@legacy("cudnnGetRNNLinLayerBiasParams")
def getRNNLinLayerBiasParams(handle, rnnDesc, pseudoLayer, xDesc, wDesc, w, linLayerID, linLayerBiasDesc):
    """linLayerBias (pointer or view); linLayerBiasDesc gets {1, rows, 1}; IDs as for the matrices
    (input-side biases 0..g-1, recurrent-side g..2g-1), absent ones give NULL."""
    return _lin_layer_params(handle, rnnDesc, pseudoLayer, xDesc, wDesc, w, linLayerID, linLayerBiasDesc, True,
                             "linLayerBiasDesc")


__all__ = ["region", "legacy_config", "check_wdesc", "RNN_MODES"]
