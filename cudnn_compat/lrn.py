"""LRN descriptors, cross-channel LRN and divisive normalization (002 §3.2.11
cudnnCreateLRNDescriptor, §3.2.83 cudnnSetLRNDescriptor, §3.2.48 cudnnGetLRNDescriptor,
§3.2.26 cudnnDestroyLRNDescriptor, §3.2.65 cudnnLRNCrossChannelForward, §4.1.14
cudnnLRNCrossChannelBackward, §3.2.33 cudnnDivisiveNormalizationForward, §4.1.6
cudnnDivisiveNormalizationBackward, §3.1.2.8 cudnnDivNormMode_t).

One LRN descriptor (N, alpha, beta, K) serves both layers.  The formulas (reference kernel
docstring, cudnn_compat/_backend/engines/reference/lrn.py):
  LRN:     y = x / (K + (alpha/N) * sum_{window over channels} x^2)^beta
  DivNorm: y_i = x_i / (K + (alpha/N^d) * sum_{window over the d spatial dims} (x_j - m_i)^2)^beta
with the window [p - floor((N-1)/2), p + N - floor((N-1)/2) - 1] clipped to the tensor.
002 describes divisive normalization only as "x / max(c, sigma_x)"; the formula above is
the one its LRN parameter text implies (alpha over window^#spatialDims, NULL means =
spatial LRN), with the means of position i subtracted inside its window.  Its backward
gives the exact gradients dx and dMeans (means treated as independent inputs, §3.1.2.8).
temp and temp2 are scratch the caller provides; they are checked but not used.
"""
from __future__ import annotations

import math
import numbers

from cudnn_compat._backend.ir import Operation, OperationGraph, virtual
from ._core.call import ALPHA, BETA, blend, blended, compute_dtype, run
from ._core.data import same_buffer, scalar, unread
from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.recipes import Recipe, steady
from ._core.memo import Memo, arrays, call_site
from ._core.registry import legacy
from .activation import require_dtype
from .enums import CONSTANTS, is_valid
from .errors import check
from .handle import get_handle
from .tensor import tensor_desc
from ._core.uids import SHARED, Uids

MIN_N, MAX_N = CONSTANTS["CUDNN_LRN_MIN_N"], CONSTANTS["CUDNN_LRN_MAX_N"]
MIN_K, MIN_BETA = CONSTANTS["CUDNN_LRN_MIN_K"], CONSTANTS["CUDNN_LRN_MIN_BETA"]
NOT_SUPPORTED = 9  # CUDNN_STATUS_NOT_SUPPORTED
DTYPES = ("float32", "float64", "float16", "bfloat16")
UIDS = Uids(after=SHARED)  # this family's graph uids (ALPHA, BETA: the output blend's)
X, Y, DY, DX, MEANS, DMEANS = UIDS.data(6)
DX_RESULT, DMEANS_RESULT = UIDS.virtual(2)  # DivisiveNormalizationBackward's virtual outputs
LRN_DIM1 = 0  # CUDNN_LRN_CROSS_CHANNEL_DIM1, the one cudnnLRNMode_t


class LRNDescriptor(Descriptor):
    kind = "cudnnLRNDescriptor_t"

    def __init__(self):
        super().__init__()
        self.lrnN, self.lrnAlpha, self.lrnBeta, self.lrnK = 5, 1e-4, 0.75, 2.0  # 002 §3.2.83 defaults
        self.touched()

    def _settings(self):
        return (self.lrnN, self.lrnAlpha, self.lrnBeta, self.lrnK)

    def attrs(self) -> dict:
        return {"n": self.lrnN, "alpha": self.lrnAlpha, "beta": self.lrnBeta, "k": self.lrnK}


def _check_params(lrnN, lrnAlpha, lrnBeta, lrnK, argname: str = "normDesc") -> None:
    """BAD_PARAM outside CUDNN_LRN_MIN_N <= N <= CUDNN_LRN_MAX_N, K >= CUDNN_LRN_MIN_K,
    beta >= CUDNN_LRN_MIN_BETA; alpha must be a finite number."""
    check(isinstance(lrnN, numbers.Integral) and not isinstance(lrnN, bool) and MIN_N <= lrnN <= MAX_N, argname,
          f"lrnN must be an int in [CUDNN_LRN_MIN_N={MIN_N}, CUDNN_LRN_MAX_N={MAX_N}], got {lrnN!r}")
    for name, v in (("lrnAlpha", lrnAlpha), ("lrnBeta", lrnBeta), ("lrnK", lrnK)):
        check(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v), argname,
              f"{name} must be a finite number, got {v!r}")
    check(lrnK >= MIN_K, argname, f"lrnK must be >= CUDNN_LRN_MIN_K={MIN_K}, got {lrnK}")
    check(lrnBeta >= MIN_BETA, argname, f"lrnBeta must be >= CUDNN_LRN_MIN_BETA={MIN_BETA}, got {lrnBeta}")


def lrn_desc(arg, argname: str = "normDesc") -> LRNDescriptor:
    d = resolve(arg, LRNDescriptor, argname)
    _check_params(*d._settings(), argname)
    return d


createLRNDescriptor, destroyLRNDescriptor = pair(LRNDescriptor, __name__)


@legacy("cudnnSetLRNDescriptor")
def setLRNDescriptor(normDesc, lrnN, lrnAlpha, lrnBeta, lrnK) -> None:
    """BAD_PARAM for a parameter outside its range (002 §3.2.83); nothing is changed then."""
    d = resolve(normDesc, LRNDescriptor, "normDesc", need_set=False)
    _check_params(lrnN, lrnAlpha, lrnBeta, lrnK, "lrnN/lrnAlpha/lrnBeta/lrnK")
    d.lrnN, d.lrnAlpha, d.lrnBeta, d.lrnK = int(lrnN), float(lrnAlpha), float(lrnBeta), float(lrnK)
    d.touched()


@legacy("cudnnGetLRNDescriptor")
def getLRNDescriptor(normDesc) -> tuple:
    """(lrnN, lrnAlpha, lrnBeta, lrnK)"""
    return resolve(normDesc, LRNDescriptor, "normDesc")._settings()


# -- checks shared by the compute calls ---------------------------------------------------

def _non_overlapping(desc) -> bool:
    """Every element has its own address (dims of 1 aside)."""
    span = 1
    for s, d in sorted((s, d) for s, d in zip(desc.strides, desc.dims) if d > 1):
        if s < span:
            return False
        span = s * d
    return True


def _ndhw_packed(desc) -> bool:
    h, w = desc.dims[3:]
    return desc.strides[2:] == (h * w, w, 1)


def _lrn_tensors(descs: dict) -> None:
    """002 §3.2.65/§4.1.14: BAD_PARAM for nbDims <= 2 and for a 5-d tensor not NCDHW
    DHW-packed; NOT_SUPPORTED for data types or dims that differ, other ranks and
    overlapping (or negative) strides."""
    first = next(iter(descs.values()))
    for name, t in descs.items():
        check(t.nbDims > 2, name, f"needs more than 2 dims, got {t.nbDims}")
        if t.nbDims == 5:
            check(_ndhw_packed(t), name, f"a 5-d tensor must be NCDHW with D, H, W packed (strides {t.strides})")
    for name, t in descs.items():
        check(t.dataType == first.dataType, name, "data types of x, y (dx, dy) must be equal", NOT_SUPPORTED)
        check(t.dims == first.dims, name, f"dims {t.dims} differ from {first.dims}", NOT_SUPPORTED)
        check(t.nbDims in (4, 5), name, f"only 4-d and 5-d tensors are supported, got {t.nbDims}", NOT_SUPPORTED)
        check(all(s >= 0 for s in t.strides), name, "strides must not be negative", NOT_SUPPORTED)
        check(_non_overlapping(t), name, f"overlapping strides {t.strides} are not supported", NOT_SUPPORTED)
        require_dtype(t, name, DTYPES)


def _is_null(data) -> bool:
    return data is None or (isinstance(data, int) and not isinstance(data, bool) and data == 0)


def _not_null(data: dict) -> None:
    for name, v in data.items():
        check(not _is_null(v), name, "is NULL")


def _lrn_mode(lrnMode) -> None:
    check(is_valid("cudnnLRNMode_t", lrnMode), "lrnMode", f"{lrnMode!r} is not a cudnnLRNMode_t (only CROSS_CHANNEL_DIM1)")


def _alpha_beta(alpha, beta, dtype) -> tuple:
    dbl = dtype == "float64"
    return scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)


# -- LRN --------------------------------------------------------------------------------

_FWD, _DESC_OK = Memo("cudnnLRNCrossChannelForward"), Memo("LRN descriptor settings")
_FWD_SITES = Memo("cudnnLRNCrossChannelForward sites")


def _lrn_desc_cached(normDesc) -> "LRNDescriptor":
    """``lrn_desc`` with the parameter check made once per descriptor settings (``_core.memo``)."""
    ld = resolve(normDesc, LRNDescriptor, "normDesc")
    k = id(ld._key or ld.key())
    if _DESC_OK.get(k) is None:
        _check_params(*ld._settings(), "normDesc")
        _DESC_OK.put(k, True, (ld.key(),))
    return ld


@legacy("cudnnLRNCrossChannelForward", cupy="LRNCrossChannelForward")
def lrnCrossChannelForward(handle, normDesc, lrnMode, alpha, xDesc, x, beta, yDesc, y) -> None:
    """y = alpha*LRN(x) + beta*y across channels (002 §3.2.65).  The descriptor checks run once
    per combination of settings (``_core.memo``)."""
    sk = (handle, normDesc, lrnMode, xDesc, yDesc)
    h, ld, xd, yd, m = _fwd_site(sk, handle, normDesc, lrnMode, xDesc, x, yDesc, y)
    if not arrays((x, y)):  # on a site hit (a first call checked them in order, before the descriptors' rules)
        _not_null({"x": x, "y": y})
    dtype, keys = m
    a, b = _alpha_beta(alpha, beta, dtype)

    def build():
        return OperationGraph(blended("LRNForward", {"x": xd.ir(X, "x")}, "y", yd.ir(Y, "y"), b == 0, ld.attrs()),
                              "LRNCrossChannelForward")

    run(h, keys[b == 0], build, {X: (x, "x"), Y: (y, "y")}, {ALPHA: a, BETA: b})


@call_site(_FWD_SITES)
def _fwd_site(handle, normDesc, lrnMode, xDesc, x, yDesc, y):
    """lrnCrossChannelForward's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    ld = _lrn_desc_cached(normDesc)
    if type(lrnMode) is not int or lrnMode != LRN_DIM1:
        _lrn_mode(lrnMode)
    xd, yd = tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, "yDesc")
    if not arrays((x, y)):
        _not_null({"x": x, "y": y})
    mk, m = _FWD.lookup((), (ld, xd, yd))
    if m is None:
        _lrn_tensors({"xDesc": xd, "yDesc": yd})
        keys = tuple(("LRNCrossChannelForward", ld.key(), xd.key(), yd.key(), bz) for bz in (False, True))
        m = _FWD.put(mk, (xd.dtype, keys), (ld.key(), xd.key(), yd.key()))
    return h, ld, xd, yd, m


lrnCrossChannelForward = steady(
    lrnCrossChannelForward, _FWD_SITES, ("handle", "normDesc", "lrnMode", "xDesc", "yDesc"),
    lambda h, ld, xd, yd, m: Recipe.blend(h, m[1], {"x": X, "y": Y}))


@legacy("cudnnLRNCrossChannelBackward", cupy="LRNCrossChannelBackward")
def lrnCrossChannelBackward(handle, normDesc, lrnMode, alpha, yDesc, y, dyDesc, dy, xDesc, x, beta, dxDesc, dx) -> None:
    """dx = alpha*LRN'(x)·dy + beta*dx, from the forward x and y (002 §4.1.14)."""
    h = get_handle(handle)
    ld = lrn_desc(normDesc)
    _lrn_mode(lrnMode)
    yd, dyd = tensor_desc(yDesc, "yDesc"), tensor_desc(dyDesc, "dyDesc")
    xd, dxd = tensor_desc(xDesc, "xDesc"), tensor_desc(dxDesc, "dxDesc")
    _not_null({"x": x, "y": y})
    _lrn_tensors({"yDesc": yd, "dyDesc": dyd, "xDesc": xd, "dxDesc": dxd})
    a, b = _alpha_beta(alpha, beta, xd.dtype)

    def build():
        ins = {"x": xd.ir(X, "x"), "y": yd.ir(Y, "y"), "dy": dyd.ir(DY, "dy")}
        return OperationGraph(blended("LRNBackward", ins, "dx", dxd.ir(DX, "dx"), b == 0, ld.attrs()),
                              "LRNCrossChannelBackward")

    run(h, ("LRNCrossChannelBackward", ld.key(), yd.key(), dyd.key(), xd.key(), dxd.key(), b == 0), build,
        {X: (x, "x"), Y: (y, "y"), DY: (dy, "dy"), DX: (dx, "dx")}, {ALPHA: a, BETA: b})


# -- divisive normalization -------------------------------------------------------------------

def _divnorm_checks(mode, xd, outd, outname: str, data: dict) -> None:
    """002 §3.2.33/§4.1.6: BAD_PARAM for NULL tensors, nbDims outside [4, 5], dims that
    differ, in-place x == y with other strides, negative strides; NOT_SUPPORTED for strides
    that differ between input and output (002 prints "CUDNN_STATUS_UNSUPPORTED"), other
    data types, overlapping strides."""
    check(is_valid("cudnnDivNormMode_t", mode), "mode", f"{mode!r} is not a cudnnDivNormMode_t (only PRECOMPUTED_MEANS)")
    _not_null(data)
    for name, t in (("xDesc", xd), (outname, outd)):
        check(t.nbDims in (4, 5), name, f"must have 4 or 5 dims, got {t.nbDims}")
        check(all(s >= 0 for s in t.strides), name, "strides must not be negative")
    check(outd.dims == xd.dims, outname, f"dims {outd.dims} must equal xDesc's {xd.dims}")
    if outname == "yDesc":
        check(not same_buffer(data["x"], data["y"]) or outd.strides == xd.strides, outname,
              f"in-place (x == y) needs equal strides (x {xd.strides}, y {outd.strides})")
    check(outd.strides == xd.strides, outname, f"strides {outd.strides} must equal xDesc's {xd.strides}", NOT_SUPPORTED)
    check(outd.dataType == xd.dataType, outname, "data type must equal xDesc's", NOT_SUPPORTED)
    check(_non_overlapping(xd), "xDesc", f"overlapping strides {xd.strides} are not supported", NOT_SUPPORTED)
    require_dtype(xd, "xDesc", DTYPES)


@legacy("cudnnDivisiveNormalizationForward")
def divisiveNormalizationForward(handle, normDesc, mode, alpha, xDesc, x, means, temp, temp2, beta, yDesc, y) -> None:
    """y = alpha*DivNorm(x, means) + beta*y (002 §3.2.33); means NULL counts as zeros; xDesc
    describes x, means, temp and temp2."""
    h = get_handle(handle)
    ld = lrn_desc(normDesc)
    xd, yd = tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, "yDesc")
    _divnorm_checks(mode, xd, yd, "yDesc", {"x": x, "y": y, "temp": temp, "temp2": temp2})
    unread(h, temp, "temp")  # scratch this implementation does not use: still a buffer
    unread(h, temp2, "temp2")
    a, b = _alpha_beta(alpha, beta, xd.dtype)
    has_means = not _is_null(means)

    def build():
        ins = {"x": xd.ir(X, "x")}
        if has_means:
            ins["means"] = xd.ir(MEANS, "means")
        return OperationGraph(blended("DivisiveNormalizationForward", ins, "y", yd.ir(Y, "y"), b == 0, ld.attrs()),
                              "DivisiveNormalizationForward")

    run(h, ("DivisiveNormalizationForward", ld.key(), xd.key(), yd.key(), has_means, b == 0), build,
        {X: (x, "x"), MEANS: (means, "means"), Y: (y, "y")}, {ALPHA: a, BETA: b})


@legacy("cudnnDivisiveNormalizationBackward")
def divisiveNormalizationBackward(handle, normDesc, mode, alpha, xDesc, x, means, dy, temp, temp2, beta,
                                  dXdMeansDesc, dx, dMeans) -> None:
    """dx = alpha*dDivNorm/dx·dy + beta*dx and, when dMeans is not NULL, dMeans likewise
    (002 §4.1.6).  xDesc describes x, means, dy, temp, temp2; dXdMeansDesc dx and dMeans."""
    h = get_handle(handle)
    ld = lrn_desc(normDesc)
    xd, dxd = tensor_desc(xDesc, "xDesc"), tensor_desc(dXdMeansDesc, "dXdMeansDesc")
    _divnorm_checks(mode, xd, dxd, "dXdMeansDesc", {"x": x, "dy": dy, "temp": temp, "temp2": temp2, "dx": dx})
    unread(h, temp, "temp")  # scratch this implementation does not use: still a buffer
    unread(h, temp2, "temp2")
    a, b = _alpha_beta(alpha, beta, xd.dtype)
    has_means = not _is_null(means)
    has_dmeans = not _is_null(dMeans)

    def build():
        ct = compute_dtype(dxd.dtype)
        ins = {"x": xd.ir(X, "x"), "dy": xd.ir(DY, "dy")}
        if has_means:
            ins["means"] = xd.ir(MEANS, "means")
        outs = {"dx": virtual(DX_RESULT, dxd.dims, ct, "dx_result")}
        ops = [blend(outs["dx"], dxd.ir(DX, "dx"), b == 0)]
        if has_dmeans:
            outs["dmeans"] = virtual(DMEANS_RESULT, dxd.dims, ct, "dmeans_result")
            ops.append(blend(outs["dmeans"], dxd.ir(DMEANS, "dMeans"), b == 0))
        op = Operation("DivisiveNormalizationBackward", ins, outs, ld.attrs())
        return OperationGraph([op] + ops, "DivisiveNormalizationBackward")

    run(h, ("DivisiveNormalizationBackward", ld.key(), xd.key(), dxd.key(), has_means, has_dmeans, b == 0), build,
        {X: (x, "x"), MEANS: (means, "means"), DY: (dy, "dy"), DX: (dx, "dx"), DMEANS: (dMeans, "dMeans")},
        {ALPHA: a, BETA: b})

