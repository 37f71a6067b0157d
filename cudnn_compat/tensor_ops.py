"""Tensor arithmetic (002 §3.2.2 cudnnAddTensor, §3.2.88 cudnnSetTensor, §3.2.79 cudnnScaleTensor),
each one Pointwise graph."""
from __future__ import annotations

from _backend.ir import Operation, scalar as scalar_tensor
from ._call import ALPHA, BETA, blend, compute_dtype, run
from ._data import scalar
from ._registry import legacy
from .errors import check, not_supported
from .handle import get_handle
from .tensor import tensor_desc

A, C = 1, 2  # uids


@legacy("cudnnAddTensor")
def addTensor(handle, alpha, aDesc, A_data, beta, cDesc, C_data) -> None:
    """C = alpha*A + beta*C, A broadcast over dims where it is 1 (002 §3.2.2)."""
    h = get_handle(handle)
    ad, cd = tensor_desc(aDesc, "aDesc"), tensor_desc(cDesc, "cDesc")
    check(ad.dataType == cd.dataType, "aDesc", "data type must equal cDesc's")
    check(ad.nbDims == cd.nbDims and all(a in (c, 1) for a, c in zip(ad.dims, cd.dims)), "aDesc",
          f"each dim must equal cDesc's or be 1 (A {ad.dims}, C {cd.dims})")
    if cd.nbDims > 5:
        raise not_supported("cDesc", f"AddTensor supports up to 5 dimensions, got {cd.nbDims}")
    dbl = cd.dtype == "float64"
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)

    def build():
        from _backend.ir import OperationGraph
        at, ct = ad.ir(A, "A"), cd.ir(C, "C")
        return OperationGraph([blend(at, ct, b == 0)], "AddTensor")

    run(h, ("AddTensor", ad.key(), cd.key(), b == 0), build, {A: (A_data, "A"), C: (C_data, "C")}, {ALPHA: a, BETA: b})


@legacy("cudnnSetTensor")
def setTensor(handle, yDesc, y, valuePtr) -> None:
    """y[i] = value (002 §3.2.88)."""
    h = get_handle(handle)
    yd = tensor_desc(yDesc, "yDesc")
    v = scalar(valuePtr, "valuePtr", yd.dtype == "float64")

    def build():
        from _backend.ir import OperationGraph
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
        from _backend.ir import OperationGraph
        yt = yd.ir(C, "y")
        prior = type(yt)(A, yt.dims, yt.strides, yt.dtype, name="y_prior")
        alpha_t = scalar_tensor(ALPHA, compute_dtype(yd.dtype), "alpha")
        return OperationGraph([Operation("Pointwise", {"x": prior, "alpha1": alpha_t}, {"y": yt}, {"mode": "IDENTITY"})], "ScaleTensor")

    run(h, ("ScaleTensor", yd.key()), build, {C: (y, "y"), A: (y, "y")}, {ALPHA: a})
