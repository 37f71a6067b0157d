"""RNN algorithm search, deprecated in 8.0 and kept for v7 code (002 §7.2.13
cudnnFindRNNForwardInferenceAlgorithmEx, §8.2.8 ...ForwardTraining..., §8.2.6 ...BackwardData...,
§8.2.7 ...BackwardWeights..., §7.2.22/§7.2.23/§7.2.17 Get*AlgorithmMaxCount, §7.2.45
cudnnSetRNNAlgorithmDescriptor).

Every cudnnRNNAlgo_t runs on the same engines here (the persistent algos exist only to
change what 002 declares NOT_SUPPORTED), so a search has one candidate: each Find* runs the
call once (its outputs are written, as cuDNN's did), times it, and returns one
cudnnAlgorithmPerformance_t for CUDNN_RNN_ALGO_STANDARD with the time in ms and the
workspace bytes.  ``findIntensity`` is accepted and has nothing to tune.
"""
from __future__ import annotations

import time

from . import legacy as L
from .._core.registry import legacy
from ..algorithm import AlgorithmDescriptor, AlgorithmPerformance, algorithm_desc
from ..enums import ENUMS, is_valid
from ..errors import STATUS, check
from ..handle import get_handle
from .desc import _check_bias_algo, rnn_desc

STANDARD = ENUMS["cudnnRNNAlgo_t"]["CUDNN_RNN_ALGO_STANDARD"]


def _max_count(handle, rnnDesc) -> int:
    get_handle(handle)
    rnn_desc(rnnDesc)
    return 1


@legacy("cudnnGetRNNForwardInferenceAlgorithmMaxCount")
def getRNNForwardInferenceAlgorithmMaxCount(handle, rnnDesc) -> int:
    """The largest number of results cudnnFindRNNForwardInferenceAlgorithmEx returns (002 §7.2.22)."""
    return _max_count(handle, rnnDesc)


@legacy("cudnnGetRNNForwardTrainingAlgorithmMaxCount")
def getRNNForwardTrainingAlgorithmMaxCount(handle, rnnDesc) -> int:
    """The largest number of results cudnnFindRNNForwardTrainingAlgorithmEx returns (002 §7.2.23)."""
    return _max_count(handle, rnnDesc)


@legacy("cudnnGetRNNBackwardDataAlgorithmMaxCount")
def getRNNBackwardDataAlgorithmMaxCount(handle, rnnDesc) -> int:
    """The largest number of results cudnnFindRNNBackwardDataAlgorithmEx returns (002 §7.2.17)."""
    return _max_count(handle, rnnDesc)


@legacy("cudnnGetRNNBackwardWeightsAlgorithmMaxCount")
def getRNNBackwardWeightsAlgorithmMaxCount(handle, rnnDesc) -> int:
    """The largest number of results cudnnFindRNNBackwardWeightsAlgorithmEx returns (002 Table 4, deprecated)."""
    return _max_count(handle, rnnDesc)


@legacy("cudnnSetRNNAlgorithmDescriptor")
def setRNNAlgorithmDescriptor(handle, rnnDesc, algoDesc) -> None:
    """The algorithm held by ``algoDesc`` (a cudnnRNNAlgo_t) becomes rnnDesc's algo."""
    get_handle(handle)
    d = rnn_desc(rnnDesc)
    algo = algorithm_desc(algoDesc).algorithm
    check(is_valid("cudnnRNNAlgo_t", algo), "algoDesc", f"holds {algo}, which is not a cudnnRNNAlgo_t")
    _check_bias_algo(d.biasMode, algo)
    d.algo = algo
    d.touched()


def _find(handle, requestedAlgoCount, workspace_size, fn, *args) -> list:
    h = get_handle(handle)
    check(isinstance(requestedAlgoCount, int) and requestedAlgoCount >= 1, "requestedAlgoCount",
          f"must be a positive int, got {requestedAlgoCount!r}")
    sync = _synchronizer(h)
    sync()
    t0 = time.perf_counter()
    fn.__wrapped__(handle, *args)  # errors name the Find function
    sync()
    ms = (time.perf_counter() - t0) * 1e3
    desc = AlgorithmDescriptor()
    desc.algorithm = STANDARD
    desc.touched()
    perf = AlgorithmPerformance()
    perf.algoDesc, perf.status, perf.time, perf.memory = desc, STATUS["CUDNN_STATUS_SUCCESS"], ms, int(workspace_size)
    perf.touched()
    return [perf]


def _synchronizer(h):
    if h.place != "gpu":
        return lambda: None
    import cupy
    return lambda: cupy.cuda.Device(h.device).synchronize()


@legacy("cudnnFindRNNForwardInferenceAlgorithmEx")
def findRNNForwardInferenceAlgorithmEx(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc,
                                       y, hyDesc, hy, cyDesc, cy, findIntensity, requestedAlgoCount, workspace,
                                       workSpaceSizeInBytes) -> list:
    """[cudnnAlgorithmPerformance_t] (one, for CUDNN_RNN_ALGO_STANDARD); y, hy, cy are written."""
    return _find(handle, requestedAlgoCount, workSpaceSizeInBytes, L.RNNForwardInference, rnnDesc, seqLength, xDesc,
                 x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy, cyDesc, cy, workspace, workSpaceSizeInBytes)


@legacy("cudnnFindRNNForwardTrainingAlgorithmEx")
def findRNNForwardTrainingAlgorithmEx(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc,
                                      y, hyDesc, hy, cyDesc, cy, findIntensity, requestedAlgoCount, workspace,
                                      workSpaceSizeInBytes, reserveSpace, reserveSpaceSizeInBytes) -> list:
    """Time the RNN forward-training algorithms on the given buffers (002 §8.2.8)."""
    return _find(handle, requestedAlgoCount, workSpaceSizeInBytes, L.RNNForwardTraining, rnnDesc, seqLength, xDesc,
                 x, hxDesc, hx, cxDesc, cx, wDesc, w, yDesc, y, hyDesc, hy, cyDesc, cy, workspace, workSpaceSizeInBytes,
                 reserveSpace, reserveSpaceSizeInBytes)


@legacy("cudnnFindRNNBackwardDataAlgorithmEx")
def findRNNBackwardDataAlgorithmEx(handle, rnnDesc, seqLength, yDesc, y, dyDesc, dy, dhyDesc, dhy, dcyDesc, dcy, wDesc,
                                   w, hxDesc, hx, cxDesc, cx, dxDesc, dx, dhxDesc, dhx, dcxDesc, dcx, findIntensity,
                                   requestedAlgoCount, workspace, workSpaceSizeInBytes, reserveSpace,
                                   reserveSpaceSizeInBytes) -> list:
    """Time the RNN backward-data algorithms on the given buffers (002 §8.2.6)."""
    return _find(handle, requestedAlgoCount, workSpaceSizeInBytes, L.RNNBackwardData, rnnDesc, seqLength, yDesc, y,
                 dyDesc, dy, dhyDesc, dhy, dcyDesc, dcy, wDesc, w, hxDesc, hx, cxDesc, cx, dxDesc, dx, dhxDesc, dhx,
                 dcxDesc, dcx, workspace, workSpaceSizeInBytes, reserveSpace, reserveSpaceSizeInBytes)


@legacy("cudnnFindRNNBackwardWeightsAlgorithmEx")
def findRNNBackwardWeightsAlgorithmEx(handle, rnnDesc, seqLength, xDesc, x, hxDesc, hx, yDesc, y, findIntensity,
                                      requestedAlgoCount, workspace, workSpaceSizeInBytes, dwDesc, dw, reserveSpace,
                                      reserveSpaceSizeInBytes) -> list:
    """dw is accumulated into, as cudnnRNNBackwardWeights does."""
    return _find(handle, requestedAlgoCount, workSpaceSizeInBytes, L.RNNBackwardWeights, rnnDesc, seqLength, xDesc, x,
                 hxDesc, hx, yDesc, y, workspace, workSpaceSizeInBytes, dwDesc, dw, reserveSpace,
                 reserveSpaceSizeInBytes)
