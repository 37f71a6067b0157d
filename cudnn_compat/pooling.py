"""Pooling (002 §3.2.13/§3.2.28 Create/Destroy, §3.2.85/§3.2.86 SetPooling2d/Nd,
§3.2.50/§3.2.52 GetPooling2d/Nd, §3.2.51/§3.2.53 Get*ForwardOutputDim, §3.2.69
cudnnPoolingForward, §4.1.18 cudnnPoolingBackward), each compute call one graph:
ResampleForward / ResampleBackward followed by the alpha/beta blend.

Window geometry: output index o of a spatial dim covers input indices o*stride - pad + k
(0 <= k < window); padding may be negative in Nd (002 §3.2.86).  yDesc may be smaller or
larger than the advised output size (002 §3.2.69): every window position outside the input
is padding.  MAX ignores padding (an all-padding window gives the type's lowest finite
value), AVERAGE_COUNT_INCLUDE_PADDING divides by the window volume,
AVERAGE_COUNT_EXCLUDE_PADDING by the number of input elements (0 for an empty window).
MAX and MAX_DETERMINISTIC backward route dy to the first maximal element in row-major
window order.  Details: cudnn_compat/_backend/engines/reference/pooling.py.

Backward NOT_SUPPORTED rule: 002 gives "the wStride of input tensor or output tensor is
not 1" as its example; 002 also says all formats are supported, so the rule is read as
"the innermost dim (W, or C in NHWC) must be unit-stride".
"""
from __future__ import annotations

import ctypes
import numbers

from cudnn_compat._backend.ir import OperationGraph
from ._core.call import ALPHA, BETA, blended, run
from ._core.data import POINTER_MIN, scalar
from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.memo import Memo, call_site
from ._core.recipes import Recipe, steady
from ._core.registry import CUPY_NAMES, legacy
from .enums import CONSTANTS, ENUMS, is_valid, name_of
from .errors import bad_param, check, not_supported
from .handle import get_handle
from .tensor import tensor_desc
from ._core.uids import SHARED, Uids

DIM_MAX = CONSTANTS["CUDNN_DIM_MAX"]
P = ENUMS["cudnnPoolingMode_t"]
NAN = ENUMS["cudnnNanPropagation_t"]

# cudnnPoolingMode_t -> the graph op's resample mode (MAX_DETERMINISTIC: the reference is deterministic)
RESAMPLE_MODE = {
    P["CUDNN_POOLING_MAX"]: "MAXPOOL",
    P["CUDNN_POOLING_MAX_DETERMINISTIC"]: "MAXPOOL",
    P["CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING"]: "AVGPOOL_INCLUDE_PADDING",
    P["CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING"]: "AVGPOOL_EXCLUDE_PADDING",
}
NAN_NAME = {NAN["CUDNN_PROPAGATE_NAN"]: "PROPAGATE", NAN["CUDNN_NOT_PROPAGATE_NAN"]: "NOT_PROPAGATE"}
FWD_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8")  # 002 §3.2.69: FLOAT, DOUBLE, HALF, INT8 (+BF16)
BWD_DTYPES = ("float32", "float64", "float16", "bfloat16")
UIDS = Uids(after=SHARED)  # this family's graph uids (ALPHA, BETA: the output blend's)
X, Y, DY, DX = UIDS.data(4)


class PoolingDescriptor(Descriptor):
    """cudnnPoolingDescriptor_t: mode, NaN option and per-spatial-dim window, padding, stride."""

    kind = "cudnnPoolingDescriptor_t"

    def __init__(self):
        super().__init__()
        self.mode, self.nanOpt = P["CUDNN_POOLING_MAX"], NAN["CUDNN_NOT_PROPAGATE_NAN"]
        self.window, self.padding, self.stride = (), (), ()

    def _settings(self):
        return (self.mode, self.nanOpt, self.window, self.padding, self.stride)

    @property
    def nbDims(self) -> int:
        return len(self.window)

    def attrs(self) -> dict:
        """ResampleForward/Backward attrs (legacy padding is symmetric)."""
        return {"mode": RESAMPLE_MODE[self.mode], "nan_propagation": NAN_NAME[self.nanOpt], "window": self.window,
                "stride": self.stride, "pre_padding": self.padding, "post_padding": self.padding}


def pooling_desc(arg, argname: str = "poolingDesc") -> PoolingDescriptor:
    return resolve(arg, PoolingDescriptor, argname)


def _int_array(arg, n: int, argname: str) -> tuple:
    """An int[] argument: a sequence, or a host pointer int to C ints (CuPy 13 passed pointers)."""
    if isinstance(arg, int) and not isinstance(arg, bool):
        check(arg >= POINTER_MIN, argname, "is NULL or not a host pointer to an int array")
        return tuple((ctypes.c_int * n).from_address(arg))
    try:
        vals = [int(v) for v in list(arg)[:n]]
    except TypeError:
        raise bad_param(argname, f"must be a sequence of ints or a host pointer, got {type(arg).__name__}") from None
    check(len(vals) == n, argname, f"must hold nbDims={n} entries, got {len(vals)}")
    return tuple(vals)


def _check_mode_nan(mode, nanOpt):
    check(is_valid("cudnnPoolingMode_t", mode), "mode", f"{mode!r} is not a cudnnPoolingMode_t")
    check(is_valid("cudnnNanPropagation_t", nanOpt), "maxpoolingNanOpt", f"{nanOpt!r} is not a cudnnNanPropagation_t")


def _check_positive(vals, argname):
    for i, v in enumerate(vals):
        check(v > 0, argname, f"entry {i} is {v}; window and stride entries must be > 0")


# -- descriptor ----------------------------------------------------------------------

createPoolingDescriptor, destroyPoolingDescriptor = pair(PoolingDescriptor, __name__)


@legacy("cudnnSetPooling2dDescriptor")
def setPooling2dDescriptor(poolingDesc, mode, maxpoolingNanOpt, windowHeight, windowWidth,
                           verticalPadding, horizontalPadding, verticalStride, horizontalStride) -> None:
    """002 §3.2.85: BAD_PARAM for a non-positive window or stride or a bad enum; padding is free."""
    d = resolve(poolingDesc, PoolingDescriptor, "poolingDesc", need_set=False)
    _check_mode_nan(mode, maxpoolingNanOpt)
    _check_positive((windowHeight, windowWidth), "windowHeight,windowWidth")
    _check_positive((verticalStride, horizontalStride), "verticalStride,horizontalStride")
    d.mode, d.nanOpt = int(mode), int(maxpoolingNanOpt)
    d.window, d.padding = (int(windowHeight), int(windowWidth)), (int(verticalPadding), int(horizontalPadding))
    d.stride = (int(verticalStride), int(horizontalStride))
    d.touched()


@legacy("cudnnSetPoolingNdDescriptor")
def setPoolingNdDescriptor(poolingDesc, mode, maxpoolingNanOpt, nbDims, windowDimA, paddingA, strideA) -> None:
    """002 §3.2.86: nbDims > CUDNN_DIM_MAX-2 is NOT_SUPPORTED; nbDims <= 0, window or stride
    entries <= 0 and bad enums are BAD_PARAM; negative padding is allowed."""
    d = resolve(poolingDesc, PoolingDescriptor, "poolingDesc", need_set=False)
    check(isinstance(nbDims, numbers.Integral) and nbDims > 0, "nbDims", f"must be a positive int, got {nbDims!r}")
    nbDims = int(nbDims)
    if nbDims > DIM_MAX - 2:
        raise not_supported("nbDims", f"must be at most CUDNN_DIM_MAX-2={DIM_MAX - 2}, got {nbDims}")
    _check_mode_nan(mode, maxpoolingNanOpt)
    window = _int_array(windowDimA, nbDims, "windowDimA")
    padding = _int_array(paddingA, nbDims, "paddingA")
    stride = _int_array(strideA, nbDims, "strideA")
    _check_positive(window, "windowDimA")
    _check_positive(stride, "strideA")
    d.mode, d.nanOpt, d.window, d.padding, d.stride = int(mode), int(maxpoolingNanOpt), window, padding, stride
    d.touched()


@legacy("cudnnGetPooling2dDescriptor")
def getPooling2dDescriptor(poolingDesc) -> tuple:
    """(mode, maxpoolingNanOpt, windowHeight, windowWidth, verticalPadding, horizontalPadding,
    verticalStride, horizontalStride)"""
    d = pooling_desc(poolingDesc)
    check(d.nbDims == 2, "poolingDesc", f"is {d.nbDims}-d; cudnnGetPooling2dDescriptor needs a 2-d descriptor")
    return (d.mode, d.nanOpt) + d.window + d.padding + d.stride


@legacy("cudnnGetPoolingNdDescriptor")
def getPoolingNdDescriptor(poolingDesc, nbDimsRequested: int = DIM_MAX) -> tuple:
    """(mode, maxpoolingNanOpt, nbDims, windowDimA, paddingA, strideA): the first
    min(nbDimsRequested, nbDims) entries; nbDimsRequested > CUDNN_DIM_MAX is NOT_SUPPORTED."""
    d = pooling_desc(poolingDesc)
    check(isinstance(nbDimsRequested, numbers.Integral) and nbDimsRequested >= 0, "nbDimsRequested", "must be a non-negative int")
    if nbDimsRequested > DIM_MAX:
        raise not_supported("nbDimsRequested", f"must be at most CUDNN_DIM_MAX={DIM_MAX}, got {nbDimsRequested}")
    k = min(nbDimsRequested, d.nbDims)
    return d.mode, d.nanOpt, d.nbDims, list(d.window[:k]), list(d.padding[:k]), list(d.stride[:k])


def output_dims(pd: PoolingDescriptor, xd, argname: str = "inputDesc") -> tuple:
    """N, C and outputDim = 1 + (inputDim + 2*padding - windowDim) // stride per spatial dim."""
    check(xd.nbDims == pd.nbDims + 2, argname,
          f"is {xd.nbDims}-d but poolingDesc has {pd.nbDims} spatial dims (needs {pd.nbDims + 2})")
    out = list(xd.dims[:2])
    for i, (n, w, p, s) in enumerate(zip(xd.dims[2:], pd.window, pd.padding, pd.stride)):
        check(n + 2 * p >= w, argname, f"spatial dim {i}: window {w} exceeds the padded input {n} + 2*{p}")
        out.append(1 + (n + 2 * p - w) // s)
    return tuple(out)


@legacy("cudnnGetPooling2dForwardOutputDim")
def getPooling2dForwardOutputDim(poolingDesc, inputDesc) -> tuple:
    """(n, c, h, w); 002 §3.2.51: BAD_PARAM unless poolingDesc is 2-d and inputDesc 4-d."""
    pd, xd = pooling_desc(poolingDesc), tensor_desc(inputDesc, "inputDesc")
    check(pd.nbDims == 2, "poolingDesc", f"is {pd.nbDims}-d; a 2-d pooling descriptor is required")
    return output_dims(pd, xd)


@legacy("cudnnGetPoolingNdForwardOutputDim")
def getPoolingNdForwardOutputDim(poolingDesc, inputDesc, nbDims) -> list:
    """outDimA (nbDims entries); 002 §3.2.53: BAD_PARAM when nbDims disagrees with the descriptors."""
    pd, xd = pooling_desc(poolingDesc), tensor_desc(inputDesc, "inputDesc")
    check(nbDims == xd.nbDims, "nbDims", f"is {nbDims} but inputDesc is {xd.nbDims}-d")
    return list(output_dims(pd, xd))


# -- compute -------------------------------------------------------------------------

def _check_spatial(pd, xd, dtypes, argname="xDesc"):
    if xd.nbDims not in (4, 5):
        raise not_supported(argname, f"only 2 and 3 spatial dims are supported (4-d or 5-d tensors), got {xd.nbDims}-d")
    check(pd.nbDims + 2 == xd.nbDims, "poolingDesc",
          f"has {pd.nbDims} spatial dims but {argname} is {xd.nbDims}-d (needs {pd.nbDims + 2})")
    if xd.dtype not in dtypes:
        raise not_supported(argname, f"data type {name_of('cudnnDataType_t', xd.dataType)} is not supported "
                                     f"(supported: {', '.join(dtypes)})")


_FWD, _BWD = Memo("cudnnPoolingForward"), Memo("cudnnPoolingBackward")
_FWD_SITES, _BWD_SITES = Memo("cudnnPoolingForward sites"), Memo("cudnnPoolingBackward sites")


@legacy("cudnnPoolingForward")
def poolingForward(handle, poolingDesc, alpha, xDesc, x, beta, yDesc, y) -> None:
    """y = alpha*pool(x) + beta*y (002 §3.2.69).  BAD_PARAM: n, c or data type of x and y differ.
    The descriptor checks run once per combination of settings (``_core.memo``)."""
    sk = (handle, poolingDesc, xDesc, yDesc)
    h, pd, xd, yd, m = _fwd_site(sk, handle, poolingDesc, xDesc, yDesc)
    dbl, keys = m
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        yt = yd.ir(Y, "y")
        return OperationGraph(blended("ResampleForward", {"x": xd.ir(X, "x")}, "y", yt, b == 0, pd.attrs()), "PoolingForward")

    run(h, keys[b == 0], build, {X: (x, "x"), Y: (y, "y")}, {ALPHA: a, BETA: b})


@call_site(_FWD_SITES)
def _fwd_site(handle, poolingDesc, xDesc, yDesc):
    """poolingForward's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    pd = pooling_desc(poolingDesc)
    xd, yd = tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, "yDesc")
    mk, m = _FWD.lookup((), (pd, xd, yd))
    if m is None:
        check(xd.nbDims == yd.nbDims, "yDesc", f"is {yd.nbDims}-d but xDesc is {xd.nbDims}-d")
        check(xd.dims[:2] == yd.dims[:2], "yDesc", f"n, c {yd.dims[:2]} differ from xDesc's {xd.dims[:2]}")
        check(xd.dataType == yd.dataType, "yDesc", "data type must equal xDesc's")
        _check_spatial(pd, xd, FWD_DTYPES)
        keys = tuple(("PoolingForward", pd.key(), xd.key(), yd.key(), bz) for bz in (False, True))
        m = _FWD.put(mk, (xd.dtype == "float64", keys), (pd.key(), xd.key(), yd.key()))
    return h, pd, xd, yd, m


poolingForward = steady(poolingForward, _FWD_SITES, ("handle", "poolingDesc", "xDesc", "yDesc"),
                        lambda h, pd, xd, yd, m: Recipe.blend(h, m[1], {"x": X, "y": Y}))


def _innermost_unit_stride(d) -> bool:
    return d.dims[-1] == 1 or d.strides[-1] == 1 or d.strides[1] == 1


@legacy("cudnnPoolingBackward")
def poolingBackward(handle, poolingDesc, alpha, yDesc, y, dyDesc, dy, xDesc, x, beta, dxDesc, dx) -> None:
    """dx = alpha*pool'(dy) + beta*dx (002 §4.1.18).  BAD_PARAM: y/dy or x/dx dims or strides
    differ, data types of the four differ; NOT_SUPPORTED: non-unit innermost stride."""
    sk = (handle, poolingDesc, yDesc, dyDesc, xDesc, dxDesc)
    h, pd, yd, dyd, xd, dxd, m = _bwd_site(sk, handle, poolingDesc, yDesc, dyDesc, xDesc, dxDesc)
    dbl, keys = m
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        ins = {"dy": dyd.ir(DY, "dy"), "x": xd.ir(X, "x"), "y": yd.ir(Y, "y")}
        return OperationGraph(blended("ResampleBackward", ins, "dx", dxd.ir(DX, "dx"), b == 0, pd.attrs()), "PoolingBackward")

    run(h, keys[b == 0], build, {Y: (y, "y"), DY: (dy, "dy"), X: (x, "x"), DX: (dx, "dx")}, {ALPHA: a, BETA: b})


@call_site(_BWD_SITES)
def _bwd_site(handle, poolingDesc, yDesc, dyDesc, xDesc, dxDesc):
    """poolingBackward's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    pd = pooling_desc(poolingDesc)
    yd, dyd = tensor_desc(yDesc, "yDesc"), tensor_desc(dyDesc, "dyDesc")
    xd, dxd = tensor_desc(xDesc, "xDesc"), tensor_desc(dxDesc, "dxDesc")
    mk, m = _BWD.lookup((), (pd, yd, dyd, xd, dxd))
    if m is None:
        check(yd.dims == dyd.dims, "dyDesc", f"dims {dyd.dims} differ from yDesc's {yd.dims}")
        check(yd.strides == dyd.strides, "dyDesc", f"strides {dyd.strides} differ from yDesc's {yd.strides}")
        check(xd.dims == dxd.dims, "dxDesc", f"dims {dxd.dims} differ from xDesc's {xd.dims}")
        check(xd.strides == dxd.strides, "dxDesc", f"strides {dxd.strides} differ from xDesc's {xd.strides}")
        check(len({yd.dataType, dyd.dataType, xd.dataType, dxd.dataType}) == 1, "dxDesc",
              "the data types of y, dy, x and dx must be equal")
        check(xd.nbDims == yd.nbDims and xd.dims[:2] == yd.dims[:2], "yDesc",
              f"dims {yd.dims} must have xDesc's rank and n, c {xd.dims[:2]}")
        _check_spatial(pd, xd, BWD_DTYPES)
        for name, d in (("xDesc", xd), ("yDesc", yd)):
            if not _innermost_unit_stride(d):
                raise not_supported(name, f"strides {d.strides}: the innermost dim (W, or C for NHWC) must have stride 1")
        keys = tuple(("PoolingBackward", pd.key(), yd.key(), xd.key(), bz) for bz in (False, True))
        m = _BWD.put(mk, (xd.dtype == "float64", keys), (pd.key(), yd.key(), dyd.key(), xd.key(), dxd.key()))
    return h, pd, yd, dyd, xd, dxd, m


poolingBackward = steady(
    poolingBackward, _BWD_SITES, ("handle", "poolingDesc", "yDesc", "dyDesc", "xDesc", "dxDesc"),
    lambda h, pd, yd, dyd, xd, dxd, m: Recipe.blend(h, m[1], {"y": Y, "dy": DY, "x": X, "dx": DX}))


# CuPy 13 spelled the descriptor setters with cuDNN 5's _v4 suffix.
CUPY_NAMES["setPooling2dDescriptor_v4"] = "cudnnSetPooling2dDescriptor"
CUPY_NAMES["setPoolingNdDescriptor_v4"] = "cudnnSetPoolingNdDescriptor"
