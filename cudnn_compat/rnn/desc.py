"""RNN and RNN data descriptors, both API generations (002 §7.2.5/§7.2.6 Create, §7.2.10/
§7.2.11 Destroy, §7.2.49 SetRNNDescriptor_v8, §7.2.21 GetRNNDescriptor_v8, §7.2.48
SetRNNDescriptor_v6, §7.2.20 GetRNNDescriptor_v6, §7.2.47/§7.2.19 Set/GetRNNDataDescriptor,
§7.2.50/§7.2.26 MatrixMathType, §7.2.46/§7.2.18 BiasMode, §7.2.51/§7.2.27 PaddingMode,
§7.2.52/§7.2.29 ProjectionLayers, §7.2.41/§7.2.39/§7.2.42/§7.2.40 clip, §7.2.4/§7.2.44/§7.2.9
persistent plans, §7.2.2 BuildRNNDynamic).

One descriptor object serves both generations.  The v6 setter leaves ``dataType`` and
``inputSize`` open (legacy calls take them from xDesc); ``api`` records which setter ran,
because the v8 getters and size queries answer NOT_INITIALIZED for a v6 descriptor.
``RNNConfig`` (rnn/core.py) is derived from a descriptor at call time and is what plans key on.
"""
from __future__ import annotations

import ctypes
import math

import numpy as np

from .._core import data as _data
from .._core.descriptor import Descriptor, optional, resolve
from .._core.lifecycle import pair
from .._core.registry import legacy
from ..dropout import DropoutDescriptor
from ..enums import ENUMS, is_valid, name_of
from ..errors import (CUDNN_STATUS_NOT_INITIALIZED, CUDNN_STATUS_NOT_SUPPORTED, CuDNNArgumentError, CuDNNError,
                      bad_param, check, not_supported)
from ..handle import get_handle

E = {k: v for t in ("cudnnRNNMode_t", "cudnnRNNAlgo_t", "cudnnRNNBiasMode_t", "cudnnDirectionMode_t",
                     "cudnnRNNInputMode_t", "cudnnDataType_t", "cudnnRNNDataLayout_t", "cudnnRNNClipMode_t",
                     "cudnnMathType_t", "cudnnNanPropagation_t", "cudnnRNNPaddingMode_t") for k, v in ENUMS[t].items()}
PADDED_IO = E["CUDNN_RNN_PADDED_IO_ENABLED"]
RNN_DATA_TYPES = (E["CUDNN_DATA_HALF"], E["CUDNN_DATA_FLOAT"], E["CUDNN_DATA_DOUBLE"])
# 002 §7.2.49 mathPrec: FP16 data -> HALF or FLOAT, FP32 -> FLOAT, FP64 -> DOUBLE
MATH_PREC = {
    E["CUDNN_DATA_HALF"]: (E["CUDNN_DATA_HALF"], E["CUDNN_DATA_FLOAT"]),
    E["CUDNN_DATA_FLOAT"]: (E["CUDNN_DATA_FLOAT"],),
    E["CUDNN_DATA_DOUBLE"]: (E["CUDNN_DATA_DOUBLE"],),
}
PERSIST = (E["CUDNN_RNN_ALGO_PERSIST_STATIC"], E["CUDNN_RNN_ALGO_PERSIST_DYNAMIC"],
           E["CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H"])


class RNNDescriptor(Descriptor):
    kind = "cudnnRNNDescriptor_t"

    def __init__(self):
        super().__init__()
        self.api = None  # 'v8' or 'v6' once set
        self.algo = E["CUDNN_RNN_ALGO_STANDARD"]
        self.cellMode = E["CUDNN_RNN_RELU"]
        self.biasMode = E["CUDNN_RNN_DOUBLE_BIAS"]
        self.dirMode = E["CUDNN_UNIDIRECTIONAL"]
        self.inputMode = E["CUDNN_LINEAR_INPUT"]
        self.dataType = None
        self.mathPrec = E["CUDNN_DATA_FLOAT"]
        self.mathType = E["CUDNN_DEFAULT_MATH"]
        self.inputSize = None
        self.hiddenSize = 0
        self.projSize = 0
        self.numLayers = 0
        self.dropoutDesc = None
        self.auxFlags = 0
        self.clipMode = E["CUDNN_RNN_CLIP_NONE"]
        self.clipNanOpt = E["CUDNN_NOT_PROPAGATE_NAN"]
        self.lclip = 0.0
        self.rclip = 0.0
        self.plan = None

    def _settings(self):
        return (self.api, self.algo, self.cellMode, self.biasMode, self.dirMode, self.inputMode, self.dataType,
                self.mathPrec, self.mathType, self.inputSize, self.hiddenSize, self.projSize, self.numLayers,
                self.auxFlags, self.clipMode, self.clipNanOpt)


class RNNDataDescriptor(Descriptor):
    kind = "cudnnRNNDataDescriptor_t"

    def __init__(self):
        super().__init__()
        self.dataType = E["CUDNN_DATA_FLOAT"]
        self.layout = E["CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED"]
        self.maxSeqLength = self.batchSize = self.vectorSize = 0
        self.seqLengthArray = ()
        self.paddingFill = None

    def _settings(self):
        return (self.dataType, self.layout, self.maxSeqLength, self.batchSize, self.vectorSize, self.seqLengthArray,
                self.paddingFill is not None)


class PersistentRNNPlan(Descriptor):
    kind = "cudnnPersistentRNNPlan_t"

    def __init__(self, rnn, minibatch, dataType):
        super().__init__()
        self.minibatch, self.dataType = minibatch, dataType
        self.touched()


def rnn_desc(arg, argname: str = "rnnDesc", need_set: bool = True) -> RNNDescriptor:
    return resolve(arg, RNNDescriptor, argname, need_set)


def rnn_data_desc(arg, argname: str) -> RNNDataDescriptor:
    return resolve(arg, RNNDataDescriptor, argname)


def v8_desc(arg, argname: str = "rnnDesc") -> RNNDescriptor:
    """A descriptor set by cudnnSetRNNDescriptor_v8 (v8 getters and queries: NOT_INITIALIZED otherwise)."""
    d = rnn_desc(arg, argname)
    if d.api != "v8":
        raise CuDNNError(CUDNN_STATUS_NOT_INITIALIZED, argname,
                         "was configured with the legacy cudnnSetRNNDescriptor_v6; v8 calls need cudnnSetRNNDescriptor_v8")
    return d


def _enum(type_name, value, argname):
    check(is_valid(type_name, value), argname, f"{value!r} is not a {type_name}")
    return int(value)


def _positive(value, argname):
    check(isinstance(value, (int, np.integer)) and int(value) > 0, argname, f"must be a positive int, got {value!r}")
    return int(value)


def _check_proj_allowed(d_cell, d_algo, projSize, hiddenSize, argname="projSize"):
    check(int(projSize) > 0, argname, f"must be positive, got {projSize}")
    if projSize > hiddenSize:
        raise not_supported(argname, f"{projSize} is larger than hiddenSize {hiddenSize}")
    if projSize < hiddenSize:
        if d_cell != E["CUDNN_LSTM"]:
            raise not_supported(argname, "the recurrent projection exists for CUDNN_LSTM cells only")
        if d_algo != E["CUDNN_RNN_ALGO_STANDARD"]:
            raise not_supported(argname, "the recurrent projection needs CUDNN_RNN_ALGO_STANDARD")


def _check_bias_algo(biasMode, algo):
    if biasMode != E["CUDNN_RNN_DOUBLE_BIAS"] and algo != E["CUDNN_RNN_ALGO_STANDARD"]:
        raise not_supported("biasMode", f"{name_of('cudnnRNNBiasMode_t', biasMode)} needs CUDNN_RNN_ALGO_STANDARD")


def _check_math_prec(dataType, mathPrec, argname="mathPrec"):
    allowed = MATH_PREC[dataType]
    check(mathPrec in allowed, argname, f"{name_of('cudnnDataType_t', mathPrec)} is not allowed with "
          f"{name_of('cudnnDataType_t', dataType)} data (allowed: {', '.join(name_of('cudnnDataType_t', a) for a in allowed)})")


createRNNDescriptor, destroyRNNDescriptor = pair(RNNDescriptor, __name__)


@legacy("cudnnSetRNNDescriptor_v8")
def setRNNDescriptor_v8(rnnDesc, algo, cellMode, biasMode, dirMode, inputMode, dataType, mathPrec, mathType,
                        inputSize, hiddenSize, projSize, numLayers, dropoutDesc, auxFlags) -> None:
    """Set a v8 RNN descriptor: algorithm, cell, bias, direction, input mode, types and sizes (002 §7.2.49)."""
    d = rnn_desc(rnnDesc, need_set=False)
    algo = _enum("cudnnRNNAlgo_t", algo, "algo")
    cellMode = _enum("cudnnRNNMode_t", cellMode, "cellMode")
    biasMode = _enum("cudnnRNNBiasMode_t", biasMode, "biasMode")
    dirMode = _enum("cudnnDirectionMode_t", dirMode, "dirMode")
    inputMode = _enum("cudnnRNNInputMode_t", inputMode, "inputMode")
    dataType = _enum("cudnnDataType_t", dataType, "dataType")
    mathPrec = _enum("cudnnDataType_t", mathPrec, "mathPrec")
    mathType = _enum("cudnnMathType_t", mathType, "mathType")
    if dataType not in RNN_DATA_TYPES:
        raise not_supported("dataType", f"RNN data must be HALF, FLOAT or DOUBLE, not {name_of('cudnnDataType_t', dataType)}")
    _check_math_prec(dataType, mathPrec)
    inputSize, hiddenSize, numLayers = (_positive(v, n) for v, n in
                                        ((inputSize, "inputSize"), (hiddenSize, "hiddenSize"), (numLayers, "numLayers")))
    check(isinstance(projSize, (int, np.integer)), "projSize", f"must be an int, got {projSize!r}")
    _check_proj_allowed(cellMode, algo, int(projSize), hiddenSize)
    if inputMode == E["CUDNN_SKIP_INPUT"]:
        check(inputSize == hiddenSize, "inputSize", f"must equal hiddenSize ({hiddenSize}) with CUDNN_SKIP_INPUT, got {inputSize}")
    _check_bias_algo(biasMode, algo)
    check(int(auxFlags) & ~PADDED_IO == 0, "auxFlags", f"unknown flag bits {int(auxFlags) & ~PADDED_IO:#x}")
    drop = optional(dropoutDesc, DropoutDescriptor, "dropoutDesc")
    d.api = "v8"
    d.algo, d.cellMode, d.biasMode, d.dirMode, d.inputMode = algo, cellMode, biasMode, dirMode, inputMode
    d.dataType, d.mathPrec, d.mathType = dataType, mathPrec, mathType
    d.inputSize, d.hiddenSize, d.projSize, d.numLayers = inputSize, hiddenSize, int(projSize), numLayers
    d.dropoutDesc, d.auxFlags = drop, int(auxFlags)
    d.touched()


@legacy("cudnnGetRNNDescriptor_v8")
def getRNNDescriptor_v8(rnnDesc) -> tuple:
    """(algo, cellMode, biasMode, dirMode, inputMode, dataType, mathPrec, mathType, inputSize,
    hiddenSize, projSize, numLayers, dropoutDesc, auxFlags)"""
    d = v8_desc(rnnDesc)
    return (d.algo, d.cellMode, d.biasMode, d.dirMode, d.inputMode, d.dataType, d.mathPrec, d.mathType,
            d.inputSize, d.hiddenSize, d.projSize, d.numLayers, d.dropoutDesc, d.auxFlags)


def _set_v6(d, hiddenSize, numLayers, dropoutDesc, inputMode, direction, mode, algo, mathPrec):
    hiddenSize, numLayers = _positive(hiddenSize, "hiddenSize"), _positive(numLayers, "numLayers")
    inputMode = _enum("cudnnRNNInputMode_t", inputMode, "inputMode")
    direction = _enum("cudnnDirectionMode_t", direction, "direction")
    mode = _enum("cudnnRNNMode_t", mode, "mode")
    algo = _enum("cudnnRNNAlgo_t", algo, "algo")
    mathPrec = _enum("cudnnDataType_t", mathPrec, "mathPrec")
    check(mathPrec in RNN_DATA_TYPES, "mathPrec", f"must be HALF, FLOAT or DOUBLE, got {name_of('cudnnDataType_t', mathPrec)}")
    _check_bias_algo(d.biasMode, algo)
    drop = resolve(dropoutDesc, DropoutDescriptor, "dropoutDesc")
    d.api = "v6"
    d.hiddenSize, d.numLayers, d.dropoutDesc = hiddenSize, numLayers, drop
    d.inputMode, d.dirMode, d.cellMode, d.algo, d.mathPrec = inputMode, direction, mode, algo, mathPrec
    d.projSize, d.dataType, d.inputSize = hiddenSize, None, None
    d.touched()


@legacy("cudnnSetRNNDescriptor_v6")
def setRNNDescriptor_v6(handle, rnnDesc, hiddenSize, numLayers, dropoutDesc, inputMode, direction, mode, algo,
                        mathPrec) -> None:
    """002 §7.2.48.  dataType and inputSize come from xDesc at call time."""
    get_handle(handle)
    _set_v6(rnn_desc(rnnDesc, need_set=False), hiddenSize, numLayers, dropoutDesc, inputMode, direction, mode, algo,
            mathPrec)


@legacy("cudnnSetRNNDescriptor_v5")
def setRNNDescriptor_v5(rnnDesc, hiddenSize, numLayers, dropoutDesc, inputMode, direction, mode, dataType) -> None:
    """cuDNN 5's cudnnSetRNNDescriptor (removed in 8.0): v6 with ALGO_STANDARD and mathPrec = dataType."""
    _set_v6(rnn_desc(rnnDesc, need_set=False), hiddenSize, numLayers, dropoutDesc, inputMode, direction, mode,
            E["CUDNN_RNN_ALGO_STANDARD"], dataType)


@legacy("cudnnSetRNNDescriptor")
def setRNNDescriptor(*args) -> None:
    """The removed unsuffixed name: cuDNN 5's 8-argument signature (rnnDesc, hiddenSize, numLayers,
    dropoutDesc, inputMode, direction, mode, dataType) or cuDNN 6/7's 10-argument one (handle first,
    algo and mathPrec last)."""
    if len(args) == 8:
        return setRNNDescriptor_v5(*args)
    if len(args) == 10:
        return setRNNDescriptor_v6(*args)
    raise CuDNNArgumentError(3, "arguments", f"takes 8 (v5) or 10 (v6/v7) arguments but {len(args)} were given; the "
                             "signature is cudnnSetRNNDescriptor(rnnDesc, hiddenSize, numLayers, dropoutDesc, "
                             "inputMode, direction, mode, dataType) or cudnnSetRNNDescriptor(handle, rnnDesc, "
                             "hiddenSize, numLayers, dropoutDesc, inputMode, direction, mode, algo, mathPrec)")


@legacy("cudnnGetRNNDescriptor_v6")
def getRNNDescriptor_v6(handle, rnnDesc) -> tuple:
    """(hiddenSize, numLayers, dropoutDesc, inputMode, direction, mode, algo, mathPrec)"""
    get_handle(handle)
    d = rnn_desc(rnnDesc)
    return (d.hiddenSize, d.numLayers, d.dropoutDesc, d.inputMode, d.dirMode, d.cellMode, d.algo, d.mathPrec)


@legacy("cudnnGetRNNDescriptor")
def getRNNDescriptor(handle, rnnDesc) -> tuple:
    """cuDNN 7's name for cudnnGetRNNDescriptor_v6 (removed in 8.0)."""
    return getRNNDescriptor_v6(handle, rnnDesc)


# -- single-setting setters and getters (002: deprecated in favour of the v8 pair) ------------

def _changed(d):
    """Settings changed; a descriptor never set by a full setter stays unset."""
    if d.api:
        d.touched()


@legacy("cudnnSetRNNMatrixMathType")
def setRNNMatrixMathType(rnnDesc, mType) -> None:
    """Set the math type (Tensor Core policy) of an RNN descriptor (002 §7.2.50)."""
    d = rnn_desc(rnnDesc, need_set=False)
    d.mathType = _enum("cudnnMathType_t", mType, "mType")
    _changed(d)


@legacy("cudnnGetRNNMatrixMathType")
def getRNNMatrixMathType(rnnDesc) -> int:
    """The math type of an RNN descriptor (002 §7.2.26)."""
    return rnn_desc(rnnDesc, need_set=False).mathType


@legacy("cudnnSetRNNBiasMode")
def setRNNBiasMode(rnnDesc, biasMode) -> None:
    """Set the bias mode of an RNN descriptor (002 §7.2.46)."""
    d = rnn_desc(rnnDesc, need_set=False)
    biasMode = _enum("cudnnRNNBiasMode_t", biasMode, "biasMode")
    _check_bias_algo(biasMode, d.algo)
    d.biasMode = biasMode
    _changed(d)


@legacy("cudnnGetRNNBiasMode")
def getRNNBiasMode(rnnDesc) -> int:
    """The bias mode of an RNN descriptor (002 §7.2.18)."""
    return rnn_desc(rnnDesc, need_set=False).biasMode


@legacy("cudnnSetRNNPaddingMode")
def setRNNPaddingMode(rnnDesc, paddingMode) -> None:
    """Enable or disable padded input/output of an RNN descriptor (002 §7.2.51)."""
    d = rnn_desc(rnnDesc, need_set=False)
    mode = _enum("cudnnRNNPaddingMode_t", paddingMode, "paddingMode")
    d.auxFlags = (d.auxFlags & ~PADDED_IO) | (PADDED_IO if mode == PADDED_IO else 0)
    _changed(d)


@legacy("cudnnGetRNNPaddingMode")
def getRNNPaddingMode(rnnDesc) -> int:
    """The padding mode of an RNN descriptor (002 §7.2.27)."""
    return PADDED_IO if rnn_desc(rnnDesc, need_set=False).auxFlags & PADDED_IO else E["CUDNN_RNN_PADDED_IO_DISABLED"]


@legacy("cudnnSetRNNProjectionLayers")
def setRNNProjectionLayers(handle, rnnDesc, recProjSize, outProjSize) -> None:
    """002 §7.2.52: recProjSize < hiddenSize enables the LSTM recurrent projection; outProjSize must be 0."""
    get_handle(handle)
    d = rnn_desc(rnnDesc)
    check(int(recProjSize) >= 0 and int(outProjSize) >= 0, "recProjSize/outProjSize", "must not be negative")
    if int(outProjSize) != 0:
        raise not_supported("outProjSize", "the output projection is not implemented (it must be 0)")
    _check_proj_allowed(d.cellMode, d.algo, int(recProjSize), d.hiddenSize, "recProjSize")
    d.projSize = int(recProjSize)
    d.touched()


@legacy("cudnnGetRNNProjectionLayers")
def getRNNProjectionLayers(handle, rnnDesc) -> tuple:
    """(recProjSize, outProjSize): recProjSize = hiddenSize when the projection is disabled."""
    get_handle(handle)
    d = rnn_desc(rnnDesc)
    return d.projSize, 0


def _set_clip(d, clipMode, clipNanOpt, lclip, rclip):
    clipMode = _enum("cudnnRNNClipMode_t", clipMode, "clipMode")
    clipNanOpt = _enum("cudnnNanPropagation_t", clipNanOpt, "clipNanOpt")
    lclip, rclip = float(lclip), float(rclip)
    check(not (math.isnan(lclip) or math.isnan(rclip)), "lclip/rclip", "must not be NaN")
    check(lclip <= rclip, "lclip", f"{lclip} is larger than rclip {rclip}")
    d.clipMode, d.clipNanOpt, d.lclip, d.rclip = clipMode, clipNanOpt, lclip, rclip
    d.touched()


@legacy("cudnnRNNSetClip_v8", cupy="RNNSetClip_v8")
def RNNSetClip_v8(rnnDesc, clipMode, clipNanOpt, lclip, rclip) -> None:
    """LSTM cell clipping to [lclip, rclip] (002 §7.2.42); other cell types ignore it."""
    _set_clip(rnn_desc(rnnDesc), clipMode, clipNanOpt, lclip, rclip)


@legacy("cudnnRNNSetClip", cupy="RNNSetClip")
def RNNSetClip(handle, rnnDesc, clipMode, clipNanOpt, lclip, rclip) -> None:
    """Set the LSTM cell clipping of an RNN descriptor, legacy form taking a handle (002 §7.2.41)."""
    get_handle(handle)
    _set_clip(rnn_desc(rnnDesc), clipMode, clipNanOpt, lclip, rclip)


@legacy("cudnnRNNGetClip_v8", cupy="RNNGetClip_v8")
def RNNGetClip_v8(rnnDesc) -> tuple:
    """(clipMode, clipNanOpt, lclip, rclip)"""
    d = rnn_desc(rnnDesc)
    return d.clipMode, d.clipNanOpt, d.lclip, d.rclip


@legacy("cudnnRNNGetClip", cupy="RNNGetClip")
def RNNGetClip(handle, rnnDesc) -> tuple:
    """The LSTM cell clipping of an RNN descriptor, legacy form taking a handle (002 §7.2.39)."""
    get_handle(handle)
    return RNNGetClip_v8(rnnDesc)


# -- persistent plans: accepted; every algo runs on the engines' RNN graphs ---------------------

@legacy("cudnnCreatePersistentRNNPlan")
def createPersistentRNNPlan(rnnDesc, minibatch, dataType) -> PersistentRNNPlan:
    """Create a persistent RNN plan for a minibatch size (002 §7.2.4)."""
    d = rnn_desc(rnnDesc)
    _positive(minibatch, "minibatch")
    dataType = _enum("cudnnDataType_t", dataType, "dataType")
    if d.algo != E["CUDNN_RNN_ALGO_PERSIST_DYNAMIC"]:
        raise CuDNNError(CUDNN_STATUS_NOT_SUPPORTED, "rnnDesc", "persistent plans go with CUDNN_RNN_ALGO_PERSIST_DYNAMIC")
    return PersistentRNNPlan(d, int(minibatch), dataType)


@legacy("cudnnSetPersistentRNNPlan")
def setPersistentRNNPlan(rnnDesc, plan) -> None:
    """Attach a persistent RNN plan to an RNN descriptor (002 §7.2.44)."""
    d = rnn_desc(rnnDesc)
    p = resolve(plan, PersistentRNNPlan, "plan")
    check(d.algo == E["CUDNN_RNN_ALGO_PERSIST_DYNAMIC"], "rnnDesc", "its algo is not CUDNN_RNN_ALGO_PERSIST_DYNAMIC")
    d.plan = p


@legacy("cudnnDestroyPersistentRNNPlan")
def destroyPersistentRNNPlan(plan) -> None:
    """Free a persistent RNN plan (002 §7.2.9)."""
    resolve(plan, PersistentRNNPlan, "plan").destroy()


@legacy("cudnnBuildRNNDynamic")
def buildRNNDynamic(handle, rnnDesc, miniBatch) -> None:
    """002 §7.2.2: nothing to compile here; the engines' plans are built per call signature."""
    get_handle(handle)
    rnn_desc(rnnDesc)
    _positive(miniBatch, "miniBatch")


# -- RNN data descriptors ----------------------------------------------------------------------

createRNNDataDescriptor, destroyRNNDataDescriptor = pair(RNNDataDescriptor, __name__)


def _int_array(arr, n, argname):
    """A host int array: a sequence, a NumPy array or a host pointer int (to int32)."""
    if isinstance(arr, int) and not isinstance(arr, bool):
        if arr == 0:
            raise bad_param(argname, "is NULL")
        return [int(v) for v in (ctypes.c_int32 * n).from_address(arr)]
    try:
        vals = [int(v) for v in np.asarray(arr).reshape(-1)]
    except (TypeError, ValueError):
        raise bad_param(argname, f"must be an int array, got {type(arr).__name__}") from None
    check(len(vals) >= n, argname, f"holds {len(vals)} values; batchSize = {n} are needed")
    return vals[:n]


def _fill_value(paddingFill, dataType):
    if paddingFill is None or (isinstance(paddingFill, int) and not isinstance(paddingFill, bool) and paddingFill == 0):
        return None
    addr = _data.raw_address(paddingFill)  # a ctypes pointer to a half (Python numbers are values)
    if addr and addr >= _data.POINTER_MIN and dataType == E["CUDNN_DATA_HALF"]:
        return float(np.frombuffer((ctypes.c_uint8 * 2).from_address(addr), np.float16)[0])
    return _data.scalar(paddingFill, "paddingFill", dataType == E["CUDNN_DATA_DOUBLE"])


@legacy("cudnnSetRNNDataDescriptor")
def setRNNDataDescriptor(RNNDataDesc, dataType, layout, maxSeqLength, batchSize, vectorSize, seqLengthArray,
                         paddingFill=None) -> None:
    """002 §7.2.47.  paddingFill: None/0 (NULL), a number, or a host pointer to a value of dataType."""
    d = resolve(RNNDataDesc, RNNDataDescriptor, "RNNDataDesc", need_set=False)
    dataType = _enum("cudnnDataType_t", dataType, "dataType")
    if dataType not in RNN_DATA_TYPES:
        raise not_supported("dataType", f"must be HALF, FLOAT or DOUBLE, got {name_of('cudnnDataType_t', dataType)}")
    layout = _enum("cudnnRNNDataLayout_t", layout, "layout")
    maxSeqLength, batchSize, vectorSize = (_positive(v, n) for v, n in
                                           ((maxSeqLength, "maxSeqLength"), (batchSize, "batchSize"), (vectorSize, "vectorSize")))
    lengths = _int_array(seqLengthArray, batchSize, "seqLengthArray")
    for i, n in enumerate(lengths):
        check(0 <= n <= maxSeqLength, "seqLengthArray", f"element {i} is {n}; each must be in [0, maxSeqLength={maxSeqLength}]")
    fill = _fill_value(paddingFill, dataType)
    d.dataType, d.layout, d.maxSeqLength, d.batchSize, d.vectorSize = dataType, layout, maxSeqLength, batchSize, vectorSize
    d.seqLengthArray, d.paddingFill = tuple(lengths), fill
    d.touched()


@legacy("cudnnGetRNNDataDescriptor")
def getRNNDataDescriptor(RNNDataDesc, arrayLengthRequested) -> tuple:
    """(dataType, layout, maxSeqLength, batchSize, vectorSize, seqLengthArray[:arrayLengthRequested],
    paddingFill (None when unset))"""
    d = rnn_data_desc(RNNDataDesc, "RNNDataDesc")
    check(int(arrayLengthRequested) >= 0, "arrayLengthRequested", "must not be negative")
    return (d.dataType, d.layout, d.maxSeqLength, d.batchSize, d.vectorSize,
            list(d.seqLengthArray[:int(arrayLengthRequested)]), d.paddingFill)


def check_call_types(d, dataType, inputSize, argname) -> None:
    """A call's data type and input size against the descriptor (v6 descriptors leave them open)."""
    if d.api == "v8":
        check(dataType == d.dataType, argname, f"data type {name_of('cudnnDataType_t', dataType)} must be the RNN "
              f"descriptor's {name_of('cudnnDataType_t', d.dataType)}")
        check(inputSize == d.inputSize, argname, f"vector size {inputSize} must equal inputSize {d.inputSize}")
    else:
        _check_math_prec(dataType, d.mathPrec, "rnnDesc.mathPrec")
        if d.inputMode == E["CUDNN_SKIP_INPUT"]:
            check(inputSize == d.hiddenSize, argname, f"vector size {inputSize} must equal hiddenSize {d.hiddenSize} "
                  "with CUDNN_SKIP_INPUT")
