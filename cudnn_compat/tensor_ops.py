"""Tensor arithmetic (002 §3.2.2 cudnnAddTensor, §3.2.88 cudnnSetTensor, §3.2.79 cudnnScaleTensor,
§3.2.100 cudnnTransformTensor), each one Pointwise graph.  cudnnOpTensor lives in op_tensor.py,
cudnnReduceTensor in reduce_tensor.py (imported at the end, so this family registers all three)."""
from __future__ import annotations

from cudnn_compat._backend.ir import Operation, scalar as scalar_tensor
from ._core.call import ALPHA, BETA, blend, compute_dtype, run
from ._core.data import same_buffer, scalar
from ._core.memo import Memo, call_site
from ._core.recipes import Recipe, steady
from ._core.registry import CUPY_NAMES, legacy
from .errors import check, not_supported
from .handle import get_handle
from .tensor import tensor_desc
from ._core.uids import SHARED, Uids

UIDS = Uids(after=SHARED)  # this family's graph uids (ALPHA, BETA: the output blend's)
A, C = UIDS.data(2)


_ADD, _ADD_SITES = Memo("cudnnAddTensor"), Memo("cudnnAddTensor sites")


@legacy("cudnnAddTensor")
def addTensor(handle, alpha, aDesc, A_data, beta, cDesc, C_data) -> None:
    """C = alpha*A + beta*C, A broadcast over dims where it is 1 (002 §3.2.2).  The descriptor
    checks run once per combination of settings (``_core.memo``)."""
    sk = (handle, aDesc, cDesc)
    h, ad, cd, m = _add_site(sk, handle, aDesc, cDesc)
    dbl, keys = m
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        from cudnn_compat._backend.ir import OperationGraph
        at, ct = ad.ir(A, "A"), cd.ir(C, "C")
        return OperationGraph([blend(at, ct, b == 0)], "AddTensor")

    run(h, keys[b == 0], build, {A: (A_data, "A"), C: (C_data, "C")}, {ALPHA: a, BETA: b})


@call_site(_ADD_SITES)
def _add_site(handle, aDesc, cDesc):
    """addTensor's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    ad, cd = tensor_desc(aDesc, "aDesc"), tensor_desc(cDesc, "cDesc")
    mk, m = _ADD.lookup((), (ad, cd))
    if m is None:
        check(ad.dataType == cd.dataType, "aDesc", "data type must equal cDesc's")
        check(ad.nbDims == cd.nbDims and all(a in (c, 1) for a, c in zip(ad.dims, cd.dims)), "aDesc",
              f"each dim must equal cDesc's or be 1 (A {ad.dims}, C {cd.dims})")
        if cd.nbDims > 5:
            raise not_supported("cDesc", f"AddTensor supports up to 5 dimensions, got {cd.nbDims}")
        keys = tuple(("AddTensor", ad.key(), cd.key(), bz) for bz in (False, True))
        m = _ADD.put(mk, (cd.dtype == "float64", keys), (ad.key(), cd.key()))
    return h, ad, cd, m


addTensor = steady(addTensor, _ADD_SITES, ("handle", "aDesc", "cDesc"),
                   lambda h, ad, cd, m: Recipe.blend(h, m[1], {"A_data": (A, "A"), "C_data": (C, "C")}))


@legacy("cudnnSetTensor")
def setTensor(handle, yDesc, y, valuePtr) -> None:
    """y[i] = value (002 §3.2.88)."""
    h = get_handle(handle)
    yd = tensor_desc(yDesc, "yDesc")
    v = scalar(valuePtr, "valuePtr", yd.dtype == "float64")

    def build():
        from cudnn_compat._backend.ir import OperationGraph
        val = scalar_tensor(ALPHA, compute_dtype(yd.dtype), "value")
        return OperationGraph([Operation("Pointwise", {"x": val}, {"y": yd.ir(C, "y")}, {"mode": "IDENTITY"})], "SetTensor")

    run(h, ("SetTensor", yd.key()), build, {C: (y, "y")}, {ALPHA: v})


@legacy("cudnnScaleTensor")
def scaleTensor(handle, yDesc, y, alpha) -> None:
    """y[i] = alpha * y[i] (002 §3.2.79)."""
    h = get_handle(handle)
    yd = tensor_desc(yDesc, "yDesc")
    a = scalar(alpha, "alpha", yd.dtype == "float64")

    def build():
        from cudnn_compat._backend.ir import OperationGraph
        yt = yd.ir(C, "y")
        prior = type(yt)(A, yt.dims, yt.strides, yt.dtype, name="y_prior")
        alpha_t = scalar_tensor(ALPHA, compute_dtype(yd.dtype), "alpha")
        return OperationGraph([Operation("Pointwise", {"x": prior, "alpha1": alpha_t}, {"y": yt}, {"mode": "IDENTITY"})], "ScaleTensor")

    run(h, ("ScaleTensor", yd.key()), build, {C: (y, "y"), A: (y, "y")}, {ALPHA: a})


@legacy("cudnnTransformTensor")
def transformTensor(handle, alpha, xDesc, x, beta, yDesc, y) -> None:
    """y = alpha*x + beta*y between two layouts of the same dims and data type (002 §3.2.100):
    one Pointwise IDENTITY (ADD with the prior y when beta != 0).  BAD_PARAM when the dims or
    the data types differ, or when x and y are the same buffer (002: "tensors cannot be
    transformed in place"; libcudnn 9.19 also converts between data types, 002 does not)."""
    h = get_handle(handle)
    xd, yd = tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, "yDesc")
    check(xd.nbDims == yd.nbDims and xd.dims == yd.dims, "yDesc", f"dims {yd.dims} must equal xDesc's {xd.dims}")
    check(xd.dataType == yd.dataType, "yDesc", "data type must equal xDesc's")
    check(not same_buffer(x, y), "y", "must not overlap x (tensors cannot be transformed in place)")
    dbl = yd.dtype == "float64"
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        from cudnn_compat._backend.ir import OperationGraph
        return OperationGraph([blend(xd.ir(A, "x"), yd.ir(C, "y"), b == 0)], "TransformTensor")

    run(h, ("TransformTensor", xd.key(), yd.key(), b == 0), build, {A: (x, "x"), C: (y, "y")}, {ALPHA: a, BETA: b})


# CuPy 13 spelled cudnnAddTensor as addTensor_v3 (the plain name works too).
CUPY_NAMES["addTensor_v3"] = "cudnnAddTensor"

from . import op_tensor, reduce_tensor  # noqa: E402,F401  (registration of the rest of the family)
