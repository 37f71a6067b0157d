"""Softmax forward and backward (002 §3.2.96 cudnnSoftmaxForward, §4.1.19 cudnnSoftmaxBackward,
§3.1.2.25 cudnnSoftmaxAlgorithm_t, §3.1.2.26 cudnnSoftmaxMode_t), each one graph
Softmax / SoftmaxBackward op.

Algorithms: FAST (straight exp/sum), ACCURATE (max subtracted first), LOG (log-softmax).
Modes: INSTANCE reduces over every dim but N (C, H, W... per image), CHANNEL over C only
(per n, h, w...).  Backward takes the forward output y and dy; for LOG, y is the log-softmax.
"""
from __future__ import annotations

from cudnn_compat._backend.ir import OperationGraph
from ._core.call import ALPHA, BETA, blended, run
from ._core.data import same_buffer, scalar
from ._core.memo import Memo, call_site
from ._core.recipes import Recipe, steady
from ._core.registry import legacy
from .activation import require_dtype, require_spatial_packed
from .enums import ENUMS, is_valid
from .errors import check
from .handle import get_handle
from .tensor import tensor_desc
from ._core.uids import SHARED, Uids

ALGORITHMS = {v: k[len("CUDNN_SOFTMAX_"):] for k, v in ENUMS["cudnnSoftmaxAlgorithm_t"].items()}  # -> FAST, ACCURATE, LOG
MODE_AXES = {  # cudnnSoftmaxMode_t -> dims reduced, given the rank
    ENUMS["cudnnSoftmaxMode_t"]["CUDNN_SOFTMAX_MODE_INSTANCE"]: lambda nd: tuple(range(1, nd)),
    ENUMS["cudnnSoftmaxMode_t"]["CUDNN_SOFTMAX_MODE_CHANNEL"]: lambda nd: (1,),
}
DTYPES = ("float32", "float64", "float16", "bfloat16")
UIDS = Uids(after=SHARED)  # this family's graph uids (ALPHA, BETA: the output blend's)
X, Y, DY, DX = UIDS.data(4)


def _settings(algorithm, mode) -> tuple:
    """(algorithm name, axes function); BAD_PARAM for an invalid enumerant."""
    check(is_valid("cudnnSoftmaxAlgorithm_t", algorithm), "algorithm", f"{algorithm!r} is not a cudnnSoftmaxAlgorithm_t")
    check(is_valid("cudnnSoftmaxMode_t", mode), "mode", f"{mode!r} is not a cudnnSoftmaxMode_t")
    return ALGORITHMS[int(algorithm)], MODE_AXES[int(mode)]


def _supported(desc, argname: str) -> None:
    require_dtype(desc, argname, DTYPES)
    require_spatial_packed(desc, argname)


_FWD, _BWD = Memo("cudnnSoftmaxForward"), Memo("cudnnSoftmaxBackward")
_FWD_SITES, _BWD_SITES = Memo("cudnnSoftmaxForward sites"), Memo("cudnnSoftmaxBackward sites")


def _enums(algorithm, mode) -> tuple:
    """(algorithm, mode) as plain ints; BAD_PARAM (``_settings``) for an invalid enumerant."""
    if type(algorithm) is not int or type(mode) is not int or algorithm not in ALGORITHMS or mode not in MODE_AXES:
        _settings(algorithm, mode)
        algorithm, mode = int(algorithm), int(mode)
    return algorithm, mode


@legacy("cudnnSoftmaxForward")
def softmaxForward(handle, algorithm, mode, alpha, xDesc, x, beta, yDesc, y) -> None:
    """y = alpha*softmax(x) + beta*y (002 §3.2.96).  BAD_PARAM: x/y dims or data type differ,
    invalid algorithm or mode.  The descriptor checks run once per combination (``_core.memo``)."""
    sk = (handle, algorithm, mode, xDesc, yDesc)
    h, xd, yd, m = _fwd_site(sk, handle, algorithm, mode, xDesc, x, yDesc, y)
    dbl, attrs, same_strides, keys = m
    if not same_strides:
        check(not same_buffer(x, y), "yDesc", f"in-place (x == y) needs equal strides (x {xd.strides}, y {yd.strides})")
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        return OperationGraph(blended("Softmax", {"x": xd.ir(X, "x")}, "y", yd.ir(Y, "y"), b == 0, dict(attrs)), "SoftmaxForward")

    run(h, keys[b == 0], build, {X: (x, "x"), Y: (y, "y")}, {ALPHA: a, BETA: b})


@call_site(_FWD_SITES)
def _fwd_site(handle, algorithm, mode, xDesc, x, yDesc, y):
    """softmaxForward's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    algorithm, mode = _enums(algorithm, mode)
    xd, yd = tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, "yDesc")
    mk, m = _FWD.lookup((algorithm, mode), (xd, yd))
    if m is None:
        algo, axes = _settings(algorithm, mode)
        check(xd.dims == yd.dims, "yDesc", f"dims {yd.dims} must equal xDesc's {xd.dims}")
        check(xd.dataType == yd.dataType, "yDesc", "data type must equal xDesc's")
        check(not same_buffer(x, y) or xd.strides == yd.strides, "yDesc",
              f"in-place (x == y) needs equal strides (x {xd.strides}, y {yd.strides})")
        _supported(xd, "xDesc")
        _supported(yd, "yDesc")
        attrs = {"algorithm": algo, "axes": axes(xd.nbDims)}
        keys = tuple(("SoftmaxForward", algo, attrs["axes"], xd.key(), yd.key(), bz) for bz in (False, True))
        m = _FWD.put(mk, (xd.dtype == "float64", attrs, xd.strides == yd.strides, keys), (xd.key(), yd.key()))
    return h, xd, yd, m


softmaxForward = steady(  # the recipe: no per-call check left when the in-place pair has equal strides
    softmaxForward, _FWD_SITES, ("handle", "algorithm", "mode", "xDesc", "yDesc"),
    lambda h, xd, yd, m: Recipe.blend(h, m[3], {"x": X, "y": Y}) if m[2] else None)


@legacy("cudnnSoftmaxBackward")
def softmaxBackward(handle, algorithm, mode, alpha, yDesc, y, dyDesc, dy, beta, dxDesc, dx) -> None:
    """dx = alpha*softmax'(y)·dy + beta*dx (002 §4.1.19).  BAD_PARAM: dims of y, dy, dx differ;
    y/dy strides differ; data types differ; in-place (dy == dx) with different strides;
    invalid algorithm or mode."""
    sk = (handle, algorithm, mode, yDesc, dyDesc, dxDesc)
    h, yd, dyd, dxd, m = _bwd_site(sk, handle, algorithm, mode, yDesc, dyDesc, dy, dxDesc, dx)
    dbl, attrs, same_strides, keys = m
    if not same_strides:
        check(not same_buffer(dy, dx), "dxDesc", f"in-place (dy == dx) needs equal strides (dy {dyd.strides}, dx {dxd.strides})")
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        ins = {"y": yd.ir(Y, "y"), "dy": dyd.ir(DY, "dy")}
        return OperationGraph(blended("SoftmaxBackward", ins, "dx", dxd.ir(DX, "dx"), b == 0, dict(attrs)), "SoftmaxBackward")

    run(h, keys[b == 0], build, {Y: (y, "y"), DY: (dy, "dy"), DX: (dx, "dx")}, {ALPHA: a, BETA: b})


@call_site(_BWD_SITES)
def _bwd_site(handle, algorithm, mode, yDesc, dyDesc, dy, dxDesc, dx):
    """softmaxBackward's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    algorithm, mode = _enums(algorithm, mode)
    yd, dyd, dxd = tensor_desc(yDesc, "yDesc"), tensor_desc(dyDesc, "dyDesc"), tensor_desc(dxDesc, "dxDesc")
    mk, m = _BWD.lookup((algorithm, mode), (yd, dyd, dxd))
    if m is None:
        algo, axes = _settings(algorithm, mode)
        for name, t in (("dyDesc", dyd), ("dxDesc", dxd)):
            check(t.dims == yd.dims, name, f"dims {t.dims} must equal yDesc's {yd.dims}")
            check(t.dataType == yd.dataType, name, "data type must equal yDesc's")
        check(dyd.strides == yd.strides, "dyDesc", f"strides {dyd.strides} must equal yDesc's {yd.strides}")
        check(not same_buffer(dy, dx) or dyd.strides == dxd.strides, "dxDesc",
              f"in-place (dy == dx) needs equal strides (dy {dyd.strides}, dx {dxd.strides})")
        for name, t in (("yDesc", yd), ("dxDesc", dxd)):
            _supported(t, name)
        attrs = {"algorithm": algo, "axes": axes(yd.nbDims)}
        keys = tuple(("SoftmaxBackward", algo, attrs["axes"], yd.key(), dyd.key(), dxd.key(), bz) for bz in (False, True))
        m = _BWD.put(mk, (yd.dtype == "float64", attrs, dyd.strides == dxd.strides, keys), (yd.key(), dyd.key(), dxd.key()))
    return h, yd, dyd, dxd, m


softmaxBackward = steady(  # the recipe: no per-call check left when the in-place pair has equal strides
    softmaxBackward, _BWD_SITES, ("handle", "algorithm", "mode", "yDesc", "dyDesc", "dxDesc"),
    lambda h, yd, dyd, dxd, m: Recipe.blend(h, m[3], {"y": Y, "dy": DY, "dx": DX}) if m[2] else None)
