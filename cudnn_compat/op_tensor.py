"""Op-tensor descriptors and cudnnOpTensor (002 §3.1.2.18 cudnnOpTensorOp_t, §3.2.12
cudnnCreateOpTensorDescriptor, §3.2.84 cudnnSetOpTensorDescriptor, §3.2.49
cudnnGetOpTensorDescriptor, §3.2.27 cudnnDestroyOpTensorDescriptor, §3.2.68 cudnnOpTensor).

``C = op(alpha1*A, alpha2*B) + beta*C`` is one graph: a Pointwise op of mode ``OPS[op]``
writing a virtual result, blended into C.  SQRT and NOT read A only (B's descriptor is
still checked, its data never read).  NOT is ``1 - alpha1*A``: 002 calls it "negation";
libcudnn 9.19 on an H100 gave NOT(A) = 1 - alpha1*A for A = [1, 2, -1, 0, 0.5, NaN, -inf]
with alpha1 in {1, 2, -1} and B ignored, as does the GPU test ``test_not`` of
coreylowman/cudarc (src/cudnn/tensor_ops.rs): docs/graph_ops.md "CUDNN_OP_TENSOR_NOT is 1" has the evidence.

Rules (002 §3.2.68 Returns, with the statuses libcudnn 9.19 gave for the cases 002 leaves open):
  BAD_PARAM      A's dims differ from C's; B's are not C's-or-1; fewer than 4 dims; C's data
                 type unrecognised; A and B types differ; double data mixed with non-double;
                 B is C's buffer (full size) while A is not (C may be A)
  NOT_SUPPORTED  more than 5 dims; (compType, A, B, C) outside Table 7 (``TYPE_TABLE``)
"""
from __future__ import annotations

from cudnn_compat._backend.ir import Operation, OperationGraph, scalar as scalar_tensor, virtual
from ._core.call import ALPHA, BETA, blend, run
from ._core.data import same_buffer, scalar
from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.memo import Memo, call_site
from ._core.recipes import Recipe, steady
from ._core.registry import legacy
from .enums import ENUMS, is_valid, name_of
from .errors import check, not_supported
from .handle import get_handle
from .tensor import tensor_desc
from ._core.uids import SHARED, Uids

OP = ENUMS["cudnnOpTensorOp_t"]
D = ENUMS["cudnnDataType_t"]
NAN = ENUMS["cudnnNanPropagation_t"]

# cudnnOpTensorOp_t -> Pointwise mode; unary modes read A only
OPS = {
    OP["CUDNN_OP_TENSOR_ADD"]: "ADD", OP["CUDNN_OP_TENSOR_MUL"]: "MUL", OP["CUDNN_OP_TENSOR_MIN"]: "MIN",
    OP["CUDNN_OP_TENSOR_MAX"]: "MAX", OP["CUDNN_OP_TENSOR_SQRT"]: "SQRT", OP["CUDNN_OP_TENSOR_NOT"]: "NOT",
}
UNARY = {"SQRT", "NOT"}

# compute types a descriptor accepts (libcudnn 9.19: INT8/INT32/UINT8/INT64 give BAD_PARAM)
COMP_TYPES = {D["CUDNN_DATA_FLOAT"], D["CUDNN_DATA_DOUBLE"], D["CUDNN_DATA_HALF"], D["CUDNN_DATA_BFLOAT16"]}

# 002 §3.2.68 Table 7: (compType, A, B, C) in IR dtype names
_F, _D, _H, _B, _I8 = "float32", "float64", "float16", "bfloat16", "int8"
TYPE_TABLE = {
    (_F, _F, _F, _F), (_F, _I8, _I8, _F), (_F, _H, _H, _F), (_F, _B, _B, _F), (_D, _D, _D, _D),
    (_F, _F, _F, _H), (_F, _H, _H, _H), (_F, _I8, _I8, _I8), (_F, _F, _F, _I8), (_F, _F, _F, _B),
    (_F, _B, _B, _B),
}
KNOWN_DATA = {_F, _D, _H, _B, _I8}  # data types Table 7 names at all
MAX_DIMS, MIN_DIMS = 5, 4
UIDS = Uids(after=SHARED)  # this family's graph uids (ALPHA, BETA: the output blend's)
A_UID, C_UID, B_UID = UIDS.data(3)
ALPHA1, ALPHA2 = UIDS.scalar(2, at=9011)  # the numbers these graphs always had (persisted autotune keys)
RESULT = UIDS.virtual()


class OpTensorDescriptor(Descriptor):
    """cudnnOpTensorDescriptor_t: op, compute type, NaN option."""

    kind = "cudnnOpTensorDescriptor_t"

    def __init__(self):
        super().__init__()
        self.op, self.compType, self.nanOpt = OP["CUDNN_OP_TENSOR_ADD"], D["CUDNN_DATA_FLOAT"], NAN["CUDNN_NOT_PROPAGATE_NAN"]

    def _settings(self):
        return (self.op, self.compType, self.nanOpt)

    @property
    def comp_dtype(self) -> str:
        from .tensor import DTYPE_NAME
        return DTYPE_NAME[self.compType]


def op_tensor_desc(arg, argname: str = "opTensorDesc") -> OpTensorDescriptor:
    return resolve(arg, OpTensorDescriptor, argname)


createOpTensorDescriptor, destroyOpTensorDescriptor = pair(OpTensorDescriptor, __name__)


@legacy("cudnnSetOpTensorDescriptor")
def setOpTensorDescriptor(opTensorDesc, opTensorOp, opTensorCompType, opTensorNanOpt) -> None:
    """002 §3.2.84: BAD_PARAM for an invalid enumerant."""
    d = resolve(opTensorDesc, OpTensorDescriptor, "opTensorDesc", need_set=False)
    check(is_valid("cudnnOpTensorOp_t", opTensorOp), "opTensorOp", f"{opTensorOp!r} is not a cudnnOpTensorOp_t")
    check(is_valid("cudnnDataType_t", opTensorCompType) and int(opTensorCompType) in COMP_TYPES, "opTensorCompType",
          f"{opTensorCompType!r} is not a floating-point cudnnDataType_t (FLOAT, DOUBLE, HALF or BFLOAT16)")
    check(is_valid("cudnnNanPropagation_t", opTensorNanOpt), "opTensorNanOpt", f"{opTensorNanOpt!r} is not a cudnnNanPropagation_t")
    d.op, d.compType, d.nanOpt = int(opTensorOp), int(opTensorCompType), int(opTensorNanOpt)
    d.touched()


@legacy("cudnnGetOpTensorDescriptor")
def getOpTensorDescriptor(opTensorDesc) -> tuple:
    """002 §3.2.49: (opTensorOp, opTensorCompType, opTensorNanOpt)."""
    d = op_tensor_desc(opTensorDesc)
    return d.op, d.compType, d.nanOpt


def _check_shapes(ad, bd, cd):
    check(ad.nbDims == cd.nbDims and ad.dims == cd.dims, "aDesc", f"dims {ad.dims} must equal cDesc's {cd.dims}")
    check(bd.nbDims == cd.nbDims and all(b in (c, 1) for b, c in zip(bd.dims, cd.dims)), "bDesc",
          f"each dim must equal cDesc's or be 1 (B {bd.dims}, C {cd.dims})")
    check(cd.nbDims >= MIN_DIMS, "cDesc", f"OpTensor needs at least {MIN_DIMS} dimensions, got {cd.nbDims}")
    if cd.nbDims > MAX_DIMS:
        raise not_supported("cDesc", f"OpTensor supports up to {MAX_DIMS} dimensions, got {cd.nbDims}")


def _check_types(od, ad, bd, cd):
    check(cd.dtype in KNOWN_DATA, "cDesc", f"data type {name_of('cudnnDataType_t', cd.dataType)} is not one OpTensor knows")
    check(ad.dataType == bd.dataType, "bDesc", "data type must equal aDesc's")
    check((ad.dtype == _D) == (cd.dtype == _D), "cDesc", "double data cannot be mixed with other types")
    combo = (od.comp_dtype, ad.dtype, bd.dtype, cd.dtype)
    if combo not in TYPE_TABLE:
        names = ", ".join(name_of("cudnnDataType_t", v).replace("CUDNN_DATA_", "")
                          for v in (od.compType, ad.dataType, bd.dataType, cd.dataType))
        raise not_supported("opTensorDesc", f"(compType, A, B, C) = ({names}) is not in 002 Table 7")


_OP, _OP_SITES = Memo("cudnnOpTensor"), Memo("cudnnOpTensor sites")


@legacy("cudnnOpTensor")
def opTensor(handle, opTensorDesc, alpha1, aDesc, A, alpha2, bDesc, B, beta, cDesc, C) -> None:
    """C = op(alpha1*A, alpha2*B) + beta*C (002 §3.2.68).  The descriptor checks run once per
    combination of settings (``_core.memo``)."""
    sk = (handle, opTensorDesc, aDesc, bDesc, cDesc)
    h, od, ad, bd, cd, m = _op_site(sk, handle, opTensorDesc, aDesc, A, bDesc, B, cDesc, C)
    dbl, mode, b_like_c, keys = m
    if b_like_c:
        _b_not_c(A, B, C, bd, cd)
    a1, a2, b = scalar(alpha1, "alpha1", dbl), scalar(alpha2, "alpha2", dbl), scalar(beta, "beta", dbl)
    beta_zero = b == 0

    def build():
        ct = od.comp_dtype
        inputs = {"x": ad.ir(A_UID, "A"), "alpha1": scalar_tensor(ALPHA1, ct, "alpha1")}
        if mode not in UNARY:
            inputs.update(b=bd.ir(B_UID, "B"), alpha2=scalar_tensor(ALPHA2, ct, "alpha2"))
        c = cd.ir(C_UID, "C")
        tmp = virtual(RESULT, c.dims, ct, "op_result")
        nan = "PROPAGATE" if od.nanOpt == NAN["CUDNN_PROPAGATE_NAN"] else "NOT_PROPAGATE"
        ops = [Operation("Pointwise", inputs, {"y": tmp}, {"mode": mode, "nan_propagation": nan}), blend(tmp, c, beta_zero)]
        return OperationGraph(ops, "OpTensor")

    if mode in UNARY:
        tensors = {A_UID: (A, "A"), C_UID: (C, "C")}
    else:
        tensors = {A_UID: (A, "A"), C_UID: (C, "C"), B_UID: (B, "B")}
    run(h, keys[beta_zero], build, tensors, {ALPHA: 1.0, BETA: b, ALPHA1: a1, ALPHA2: a2})


@call_site(_OP_SITES)
def _op_site(handle, opTensorDesc, aDesc, A, bDesc, B, cDesc, C):
    """opTensor's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    od = op_tensor_desc(opTensorDesc)
    ad, bd, cd = tensor_desc(aDesc, "aDesc"), tensor_desc(bDesc, "bDesc"), tensor_desc(cDesc, "cDesc")
    mk, m = _OP.lookup((), (od, ad, bd, cd))
    if m is None:
        _check_shapes(ad, bd, cd)
        _check_types(od, ad, bd, cd)
        _b_not_c(A, B, C, bd, cd)
        keys = tuple(("OpTensor", od.key(), ad.key(), bd.key(), cd.key(), bz) for bz in (False, True))
        m = _OP.put(mk, (od.compType == D["CUDNN_DATA_DOUBLE"], OPS[od.op], bd.dims == cd.dims, keys),
                    (od.key(), ad.key(), bd.key(), cd.key()))
    return h, od, ad, bd, cd, m


def _op_recipe(h, od, ad, bd, cd, m):
    """opTensor's recipe; with B shaped like C, the per-call rule "B is not C unless C is A" as data."""
    _dbl, mode, b_like_c, keys = m
    tensors = {"A": A_UID, "C": C_UID} if mode in UNARY else {"A": A_UID, "C": C_UID, "B": B_UID}
    return Recipe(h, keys, tensors, {"alpha1": ALPHA1, "alpha2": ALPHA2, "beta": BETA}, ("beta",),
                  constants={ALPHA: 1.0}, distinct=(("B", "C", "A"),) if b_like_c else ())


opTensor = steady(opTensor, _OP_SITES, ("handle", "opTensorDesc", "aDesc", "bDesc", "cDesc"), _op_recipe)


def _b_not_c(A, B, C, bd, cd) -> None:
    """BAD_PARAM when B is the output buffer C (with B's dims) and C is not A (002 §3.2.68)."""
    check(not (same_buffer(B, C) and bd.dims == cd.dims and not same_buffer(A, C)), "B",
          "B may not be the output buffer C (C may be A)")
