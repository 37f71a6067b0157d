"""CTC loss (002 §8.2.2 cudnnCreateCTCLossDescriptor, §8.2.5 Destroy, §8.2.25-§8.2.27
SetCTCLossDescriptor/Ex/_v8, §8.2.9-§8.2.11 Get.../Ex/_v8, §8.2.12/§8.2.13
GetCTCLossWorkspaceSize(_v8), §8.2.3 cudnnCTCLoss, §8.2.4 cudnnCTCLoss_v8), each call one
graph of the composite ``CTCLoss`` op (cudnn_compat/_backend/ops/ctc_sampler.py says why it is one op).

probs is a [T, N, A] tensor (time, batch, alphabet); label 0 is the blank.  Labels are
concatenated per sample (sample n's hostLabelLengths[n] labels follow sample n-1's), as in
cuDNN; the call repacks them into the op's [N, Lmax] int32 input (Lmax = 256, the largest
label length cuDNN accepts, or the descriptor's maxLabelLength for _v8), so the plan does not
depend on the label values.  cudnnCTCLoss takes labels and lengths in host memory,
cudnnCTCLoss_v8 in device memory, which on the CPU place is host memory too (lists, NumPy
arrays or host pointer ints; CuPy arrays or device pointers on the GPU place).

Normalization (002 §8.1.1.1): NONE -- probs are softmax probabilities; SOFTMAX -- probs are
activations and softmax is taken over A inside.  Either way the gradient is with respect to
the unnormalized activations (002 calls NONE's interface "inconsistent").  gradMode
(§8.2.26): for a sample whose label cannot be aligned (L + R > T), NOT_PROPAGATE_NAN writes
a zero gradient, PROPAGATE_NAN leaves that sample's gradient untouched; its cost is +inf.

Workspace: the size a GPU implementation of the forward-backward recursion needs, alpha and
beta tables in float32 (2 * T * N * (2 Lmax + 1) * 4 bytes) plus the softmax probabilities
(T * N * A * 4 bytes) plus the plan's own need, rounded up to 256 bytes; Lmax is the largest
hostLabelLength (or maxLabelLength for _v8).  The reference engine does not use it, but the
size is the contract every engine is held to, so a too-small workspace is BAD_PARAM everywhere.
"""
from __future__ import annotations

import ctypes

import numpy as np

from cudnn_compat._backend import dtypes
from ._core import bound_graph as bg
from ._core.data import POINTER_MIN, extent_bytes, library_object, preflight, raw_address, read_host
from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.registry import CUPY_NAMES, legacy
from .enums import ENUMS, is_valid, name_of
from .errors import bad_param, check, not_supported
from .handle import get_handle
from .tensor import tensor_desc

D = ENUMS["cudnnDataType_t"]
NORM = {v: k[len("CUDNN_LOSS_NORMALIZATION_"):] for k, v in ENUMS["cudnnLossNormalizationMode_t"].items()}
NAN = {v: k[len("CUDNN_"):] for k, v in ENUMS["cudnnNanPropagation_t"].items()}  # -> PROPAGATE_NAN, NOT_PROPAGATE_NAN
MAX_LABEL_LENGTH = 256  # 002 §8.2.3: "The labelLengths is greater than 256" is BAD_PARAM
WS_ALIGN = 256


# -- host arrays and host-made constants (shared with attention/ and spatial.py) ------------------

def host_ints(arg, count: int, argname: str, device: bool = False) -> np.ndarray:
    """An int array argument as int32[count]: a list/tuple, a NumPy array, a host pointer int,
    or a CuPy / CUDA array; with ``device`` (a device-memory argument on the GPU place) a
    pointer int is a device pointer, copied to the host."""
    if library_object(arg):  # a descriptor id is no address: never dereference it
        raise bad_param(argname, f"is {arg!r}, not an int array or a pointer")
    addr = raw_address(arg)  # a ctypes pointer: its address, as a pointer int
    arg = arg if addr is None else addr
    if arg is None or (isinstance(arg, int) and not isinstance(arg, bool) and arg == 0):
        if count == 0:
            return np.zeros(0, np.int32)
        raise bad_param(argname, "is NULL")
    if isinstance(arg, int) and not isinstance(arg, bool):
        check(arg >= POINTER_MIN, argname, f"{arg} is not a valid pointer")
        if count == 0:
            return np.zeros(0, np.int32)
        if device:
            import cupy
            mem = cupy.cuda.UnownedMemory(arg, 4 * count, None)
            return cupy.ndarray((count,), cupy.int32, cupy.cuda.MemoryPointer(mem, 0)).get()
        raw = read_host(arg, 4 * count)  # None, never a fault, for an address that is not readable
        check(raw is not None, argname, f"{arg:#x} is not a readable host pointer to {count} ints")
        return np.frombuffer(raw, np.int32).copy()
    if hasattr(arg, "__cuda_array_interface__"):  # CuPy or another CUDA array
        import cupy
        arg = cupy.asarray(arg).get()
    try:
        arr = np.asarray(arg)
    except Exception:  # noqa: BLE001 - anything NumPy cannot read is a bad argument
        raise bad_param(argname, f"must be an int array or a pointer, got {type(arg).__name__}") from None
    if not (arr.dtype.kind in "iu" or arr.size == 0):  # messages built only on failure (per-call path)
        raise bad_param(argname, f"must hold integers, got dtype {arr.dtype}")
    arr = arr.reshape(-1)
    if arr.size < count:
        raise bad_param(argname, f"holds {arr.size} values but {count} are needed")
    arr = arr[:count]
    if arr.dtype.itemsize > 4 or arr.dtype == np.uint32:  # rule: values a C int holds (never wrapped)
        bad = (arr < -2**31) | (arr > 2**31 - 1)
        check(not bad.any(), argname, f"value {arr[bad][0] if bad.any() else 0} does not fit a C int")
    return arr.astype(np.int32)


def on_place(handle, array: np.ndarray):
    """A host-made constant input (masks, base grids, repacked labels) where ``handle`` runs."""
    if handle.place == "cpu":
        return np.ascontiguousarray(array)
    import cupy
    return cupy.asarray(array)


# -- descriptor ----------------------------------------------------------------------------

class CTCLossDescriptor(Descriptor):
    """cudnnCTCLossDescriptor_t: compType, normMode, gradMode, maxLabelLength (set by _v8)."""

    kind = "cudnnCTCLossDescriptor_t"

    def __init__(self):
        super().__init__()
        self.compType = D["CUDNN_DATA_FLOAT"]
        self.normMode = ENUMS["cudnnLossNormalizationMode_t"]["CUDNN_LOSS_NORMALIZATION_NONE"]
        self.gradMode = ENUMS["cudnnNanPropagation_t"]["CUDNN_NOT_PROPAGATE_NAN"]
        self.maxLabelLength = 0
        self.v8 = False

    def _settings(self):
        return (self.compType, self.normMode, self.gradMode, self.maxLabelLength, self.v8)


def ctc_desc(arg, argname: str = "ctcLossDesc") -> CTCLossDescriptor:
    return resolve(arg, CTCLossDescriptor, argname)


createCTCLossDescriptor, destroyCTCLossDescriptor = pair(CTCLossDescriptor, __name__)


def _set(ctcLossDesc, compType, normMode, gradMode, maxLabelLength, v8: bool) -> None:
    d = resolve(ctcLossDesc, CTCLossDescriptor, "ctcLossDesc", need_set=False)
    check(is_valid("cudnnDataType_t", compType), "compType", f"{compType!r} is not a cudnnDataType_t")
    check(is_valid("cudnnLossNormalizationMode_t", normMode), "normMode", f"{normMode!r} is not a cudnnLossNormalizationMode_t")
    check(is_valid("cudnnNanPropagation_t", gradMode), "gradMode", f"{gradMode!r} is not a cudnnNanPropagation_t")
    if v8:
        check(isinstance(maxLabelLength, (int, np.integer)) and int(maxLabelLength) > 0, "maxLabelLength",
              f"must be a positive int, got {maxLabelLength!r}")
    d.compType, d.normMode, d.gradMode = int(compType), int(normMode), int(gradMode)
    d.maxLabelLength, d.v8 = int(maxLabelLength), v8
    d.touched()


@legacy("cudnnSetCTCLossDescriptor")
def setCTCLossDescriptor(ctcLossDesc, compType) -> None:
    """= SetCTCLossDescriptorEx(compType, NORMALIZATION_NONE, NOT_PROPAGATE_NAN) (002 §8.2.25)."""
    _set(ctcLossDesc, compType, ENUMS["cudnnLossNormalizationMode_t"]["CUDNN_LOSS_NORMALIZATION_NONE"],
         ENUMS["cudnnNanPropagation_t"]["CUDNN_NOT_PROPAGATE_NAN"], 0, False)


@legacy("cudnnSetCTCLossDescriptorEx")
def setCTCLossDescriptorEx(ctcLossDesc, compType, normMode, gradMode) -> None:
    """Set a CTC loss descriptor: compute type, normalization mode and gradient mode (002 §8.2.26)."""
    _set(ctcLossDesc, compType, normMode, gradMode, 0, False)


@legacy("cudnnSetCTCLossDescriptor_v8")
def setCTCLossDescriptor_v8(ctcLossDesc, compType, normMode, gradMode, maxLabelLength) -> None:
    """Set a CTC loss descriptor with a maximum label length (002 §8.2.27)."""
    _set(ctcLossDesc, compType, normMode, gradMode, maxLabelLength, True)


@legacy("cudnnGetCTCLossDescriptor")
def getCTCLossDescriptor(ctcLossDesc) -> int:
    """compType"""
    return ctc_desc(ctcLossDesc).compType


@legacy("cudnnGetCTCLossDescriptorEx")
def getCTCLossDescriptorEx(ctcLossDesc) -> tuple:
    """(compType, normMode, gradMode)"""
    d = ctc_desc(ctcLossDesc)
    return d.compType, d.normMode, d.gradMode


@legacy("cudnnGetCTCLossDescriptor_v8")
def getCTCLossDescriptor_v8(ctcLossDesc) -> tuple:
    """(compType, normMode, gradMode, maxLabelLength); maxLabelLength is 0 unless set by _v8."""
    d = ctc_desc(ctcLossDesc)
    return d.compType, d.normMode, d.gradMode, d.maxLabelLength


# -- checks shared by the size queries and the loss -----------------------------------------------

def _check_config(algo, d: CTCLossDescriptor, probsDesc, gradientsDesc):
    """(probs desc, gradients desc): the 002 §8.2.3 descriptor rules."""
    pd, gd = tensor_desc(probsDesc, "probsDesc"), tensor_desc(gradientsDesc, "gradientsDesc")
    if not is_valid("cudnnCTCLossAlgo_t", algo):
        raise not_supported("algo", f"{algo!r} is not a known cudnnCTCLossAlgo_t")
    check(pd.nbDims == 3, "probsDesc", f"must be a 3-d [T, N, A] tensor, got {pd.nbDims} dims")
    check(gd.dims == pd.dims, "gradientsDesc", f"dims {gd.dims} must equal probsDesc's {pd.dims}")
    if d.compType != D["CUDNN_DATA_FLOAT"]:
        raise not_supported("ctcLossDesc", f"compType {name_of('cudnnDataType_t', d.compType)}: only CUDNN_DATA_FLOAT is supported")
    for name, t in (("probsDesc", pd), ("gradientsDesc", gd)):
        if t.dataType != D["CUDNN_DATA_FLOAT"]:
            raise not_supported(name, f"data type {name_of('cudnnDataType_t', t.dataType)}: only CUDNN_DATA_FLOAT is supported")
    return pd, gd


def _workspace_size(dims, lmax: int) -> int:
    t, n, a = dims
    need = 4 * (2 * t * n * (2 * lmax + 1) + t * n * a)
    return -(-need // WS_ALIGN) * WS_ALIGN


def _lengths(d, dims, labels, labelLengths, inputLengths, lmax_limit: int, names, device: bool = False):
    """(packed labels [N, lmax_limit], label lengths, input lengths) after the 002 §8.2.3 checks;
    ``device``: the arrays are in device memory (cudnnCTCLoss_v8 on the GPU place)."""
    t, n, a = dims
    lab_len = host_ints(labelLengths, n, names[1], device)
    in_len = host_ints(inputLengths, n, names[2], device)
    # vectorized (a per-sample Python loop cost ~200 us at N = 32): the first failing sample is
    # then checked rule by rule, so the message is the one a loop over the samples gives
    bad_len = (lab_len < 0) | (lab_len > min(MAX_LABEL_LENGTH, lmax_limit)) | (in_len < 1) | (in_len > t)
    if bad_len.any():
        i = int(np.argmax(bad_len))
        check(0 <= lab_len[i] <= MAX_LABEL_LENGTH, names[1],
              f"labelLengths[{i}] = {lab_len[i]}; label lengths must be in [0, {MAX_LABEL_LENGTH}]")
        check(lab_len[i] <= lmax_limit, names[1],
              f"labelLengths[{i}] = {lab_len[i]} exceeds the descriptor's maxLabelLength {lmax_limit}")
        check(1 <= in_len[i] <= t, names[2],
              f"inputLengths[{i}] = {in_len[i]} does not agree with probsDesc's first dim T = {t} (must be in [1, T])")
    flat = host_ints(labels, int(lab_len.sum()), names[0], device)
    bad = np.nonzero((flat < 1) | (flat >= a))[0]
    check(bad.size == 0, names[0], f"labels must be in [1, A={a}) (0 is the blank), labels[{bad[0] if bad.size else 0}] is not")
    width = max(lmax_limit, 1)
    packed = np.zeros((n, width), np.int32)
    packed[np.arange(width)[None, :] < lab_len[:, None]] = flat  # row-major: sample i's labels in order
    return packed, lab_len, in_len


# -- size queries ---------------------------------------------------------------------------

@legacy("cudnnGetCTCLossWorkspaceSize")
def getCTCLossWorkspaceSize(handle, probsDesc, gradientsDesc, labels, labelLengths, inputLengths, algo, ctcLossDesc) -> int:
    """Workspace bytes for cudnnCTCLoss (002 §8.2.12); labels and lengths in host memory."""
    get_handle(handle)
    d = ctc_desc(ctcLossDesc)
    pd, _ = _check_config(algo, d, probsDesc, gradientsDesc)
    _, lab_len, _ = _lengths(d, pd.dims, labels, labelLengths, inputLengths, MAX_LABEL_LENGTH,
                             ("labels", "labelLengths", "inputLengths"))
    return _workspace_size(pd.dims, int(lab_len.max(initial=0)))


@legacy("cudnnGetCTCLossWorkspaceSize_v8")
def getCTCLossWorkspaceSize_v8(handle, algo, ctcLossDesc, probsDesc, gradientsDesc) -> int:
    """Workspace bytes for cudnnCTCLoss_v8 (002 §8.2.13), from the descriptor's maxLabelLength."""
    get_handle(handle)
    d = ctc_desc(ctcLossDesc)
    pd, _ = _check_config(algo, d, probsDesc, gradientsDesc)
    _require_v8(d)
    return _workspace_size(pd.dims, d.maxLabelLength)


def _require_v8(d):
    check(d.v8, "ctcLossDesc", "must be set with cudnnSetCTCLossDescriptor_v8 (it carries maxLabelLength)")
    check(d.maxLabelLength <= MAX_LABEL_LENGTH, "ctcLossDesc",
          f"maxLabelLength {d.maxLabelLength} is greater than {MAX_LABEL_LENGTH}")


# -- the loss -------------------------------------------------------------------------------------

def _run(h, algo, d, pd, gd, probs, packed, lab_len, in_len, costs, gradients, workspace, workSpaceSizeInBytes, need):
    check(int(workSpaceSizeInBytes) >= need, "workSpaceSizeInBytes",
          f"{workSpaceSizeInBytes} is less than the {need} bytes cudnnGetCTCLossWorkspaceSize reports")
    check(need == 0 or not bg.is_null(workspace), "workspace", f"is NULL but {need} bytes are needed")
    check(not bg.is_null(costs), "costs", "is NULL")
    check(not bg.is_null(probs), "probs", "is NULL")
    t, n, a = pd.dims
    norm, grad_mode = NORM[d.normMode], NAN[d.gradMode]
    with_grads = not bg.is_null(gradients)
    keep_prior = with_grads and grad_mode == "PROPAGATE_NAN"
    lmax = packed.shape[1]

    def build():
        b = bg.GraphBuilder("CTCLoss", "float32")
        ins = {
            "probs": b.ext("probs", 0, pd.dims, pd.strides, pd.dtype),
            "labels": b.ext("labels", 0, (n, lmax), None, "int32"),
            "label_lengths": b.ext("labelLengths", 0, (n,), None, "int32"),
            "input_lengths": b.ext("inputLengths", 0, (n,), None, "int32"),
        }
        outs = {"costs": b.ext("costs", 0, (n,), None, pd.dtype)}
        if with_grads:
            outs["gradients"] = b.ext("gradients", 0, gd.dims, gd.strides, gd.dtype)
            if keep_prior:
                ins["gradients_prior"] = b.ext("gradients", 0, gd.dims, gd.strides, gd.dtype, "gradients_prior")
        b.op("CTCLoss", ins, outs, {"normalization": norm, "grad_mode": grad_mode})
        return b

    key = ("CTCLoss", pd.key(), gd.key(), lmax, norm, grad_mode, with_grads)
    bound = bg.prepare(key, build)
    items = [(probs, (pd.dtype, extent_bytes(pd)), "probs", False),
             (costs, (pd.dtype, n * dtypes.itemsize(pd.dtype)), "costs", True)]
    if with_grads:
        items.append((gradients, (gd.dtype, extent_bytes(gd)), "gradients", True))
    if not bg.is_null(workspace):
        items.append((workspace, (None, need), "workspace", True))
    checked = preflight(h, items)  # every buffer before the graph runs (docs/conventions.md "Data")
    probs, costs = checked[:2]
    if with_grads:
        gradients = checked[2]
    # the three int inputs in one host-to-device copy (views of one array on the GPU place)
    blob = on_place(h, np.concatenate([packed.reshape(-1), lab_len, in_len]))
    m = packed.size
    buffers = {"probs": probs, "labels": blob[:m].reshape(packed.shape), "labelLengths": blob[m:m + n],
               "inputLengths": blob[m + n:], "costs": costs, "gradients": gradients}
    bg.execute(h, key, bound, buffers)


@legacy("cudnnCTCLoss", cupy="CTCLoss")
def CTCLoss(handle, probsDesc, probs, hostLabels, hostLabelLengths, hostInputLengths, costs, gradientsDesc, gradients,
            algo, ctcLossDesc, workspace, workSpaceSizeInBytes) -> None:
    """CTC costs [N] and gradients [T, N, A] (002 §8.2.3); labels and lengths in host memory.
    BAD_PARAM: probs/gradients dims differ, inputLengths disagree with T, workspace too small,
    a label length > 256; NOT_SUPPORTED: non-FLOAT compute or data type, unknown algo."""
    h = get_handle(handle)
    d = ctc_desc(ctcLossDesc)
    pd, gd = _check_config(algo, d, probsDesc, gradientsDesc)
    packed, lab_len, in_len = _lengths(d, pd.dims, hostLabels, hostLabelLengths, hostInputLengths, MAX_LABEL_LENGTH,
                                       ("hostLabels", "hostLabelLengths", "hostInputLengths"))
    need = _workspace_size(pd.dims, int(lab_len.max(initial=0)))
    _run(h, algo, d, pd, gd, probs, packed, lab_len, in_len, costs, gradients, workspace, workSpaceSizeInBytes, need)


@legacy("cudnnCTCLoss_v8", cupy="CTCLoss_v8")
def CTCLoss_v8(handle, algo, ctcLossDesc, probsDesc, probs, labels, labelLengths, inputLengths, costs, gradientsDesc,
               gradients, workSpaceSizeInBytes, workspace) -> None:
    """cudnnCTCLoss with labels and lengths in device memory (002 §8.2.4); the descriptor must be
    set with cudnnSetCTCLossDescriptor_v8, whose maxLabelLength bounds every label length."""
    h = get_handle(handle)
    d = ctc_desc(ctcLossDesc)
    pd, gd = _check_config(algo, d, probsDesc, gradientsDesc)
    _require_v8(d)
    packed, lab_len, in_len = _lengths(d, pd.dims, labels, labelLengths, inputLengths, d.maxLabelLength,
                                       ("labels", "labelLengths", "inputLengths"), device=h.place == "gpu")
    need = _workspace_size(pd.dims, d.maxLabelLength)
    _run(h, algo, d, pd, gd, probs, packed, lab_len, in_len, costs, gradients, workspace, workSpaceSizeInBytes, need)


# the C-derived spellings as well (cupy_name would give "cTCLoss")
CUPY_NAMES["cTCLoss"] = "cudnnCTCLoss"
CUPY_NAMES["cTCLoss_v8"] = "cudnnCTCLoss_v8"
