"""Reduce-tensor descriptors and cudnnReduceTensor (002 §3.1.2.20 cudnnReduceTensorIndices_t,
§3.1.2.21 cudnnReduceTensorOp_t, §3.1.2.11 cudnnIndicesType_t, §3.2.14/§3.2.29 Create/Destroy,
§3.2.87 cudnnSetReduceTensorDescriptor, §3.2.55 cudnnGetReduceTensorDescriptor, §3.2.56
cudnnGetReductionIndicesSize, §3.2.57 cudnnGetReductionWorkspaceSize, §3.2.71 cudnnReduceTensor).

``C = alpha * reduce_op(A) + beta * C`` is one graph: a Reduction op over the dims where C
is 1 and A is not, writing a virtual result (and the indices tensor when asked), blended
into C.  Indices (MIN, MAX, AMAX with FLATTENED_INDICES) are 32-bit, one per element of C,
each the position of the chosen element flattened row-major over the reduced dims only.

Rules (002 §3.2.71 Returns, with the statuses libcudnn 9.19 gave where 002 leaves them open):
  BAD_PARAM      C's rank differs from A's or a dim of C is neither A's nor 1; no dim is
                 reduced; double data mixed with non-double; indices asked for another op
  NOT_SUPPORTED  more than 8 dims; compType not DOUBLE for double data or not FLOAT for
                 the rest; A or C not FLOAT/HALF/INT8/DOUBLE; indices type not 32-bit
  INVALID_VALUE  indicesSizeInBytes or workspaceSizeInBytes below what the size queries
                 return (libcudnn 9 answers BAD_PARAM here; 002 names INVALID_VALUE)
The size queries check the descriptors and shapes only (libcudnn answers them even for a
shape that reduces nothing).  The workspace size is the plan's real need (0 for the
reference engine).
"""
from __future__ import annotations

from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides, virtual
from ._core.call import ALPHA, BETA, blend, cached_plan, plan_for, run
from ._core.data import scalar
from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.memo import Memo, call_site
from ._core.recipes import Recipe, steady
from ._core.registry import legacy
from .enums import CONSTANTS, ENUMS, is_valid, name_of
from .errors import CUDNN_STATUS_INVALID_VALUE, check, not_supported
from .handle import get_handle
from .tensor import DTYPE_NAME, tensor_desc
from ._core.uids import SHARED, Uids

R = ENUMS["cudnnReduceTensorOp_t"]
D = ENUMS["cudnnDataType_t"]
NAN = ENUMS["cudnnNanPropagation_t"]
IND = ENUMS["cudnnReduceTensorIndices_t"]
ITYPE = ENUMS["cudnnIndicesType_t"]

# cudnnReduceTensorOp_t -> Reduction mode (the enum names without the prefix)
MODES = {v: k[len("CUDNN_REDUCE_TENSOR_"):] for k, v in R.items()}
INDEX_MODES = ("MIN", "MAX", "AMAX")
COMP_TYPES = {D["CUDNN_DATA_FLOAT"], D["CUDNN_DATA_DOUBLE"], D["CUDNN_DATA_HALF"], D["CUDNN_DATA_BFLOAT16"]}
DATA_TYPES = ("float32", "float16", "int8", "float64")  # "HALF and INT8 may be mixed with FLOAT"
INDEX_BYTES = 4  # unsigned int
MAX_DIMS = CONSTANTS["CUDNN_DIM_MAX"]
UIDS = Uids(after=SHARED)  # this family's graph uids (ALPHA, BETA: the output blend's)
A_UID, C_UID, I_UID = UIDS.data(3)
RESULT = UIDS.virtual()


class ReduceTensorDescriptor(Descriptor):
    """cudnnReduceTensorDescriptor_t: op, compute type, NaN option, indices mode and type."""

    kind = "cudnnReduceTensorDescriptor_t"

    def __init__(self):
        super().__init__()
        self.op, self.compType, self.nanOpt = R["CUDNN_REDUCE_TENSOR_ADD"], D["CUDNN_DATA_FLOAT"], NAN["CUDNN_NOT_PROPAGATE_NAN"]
        self.indices, self.indicesType = IND["CUDNN_REDUCE_TENSOR_NO_INDICES"], ITYPE["CUDNN_32BIT_INDICES"]

    def _settings(self):
        return (self.op, self.compType, self.nanOpt, self.indices, self.indicesType)

    @property
    def mode(self) -> str:
        return MODES[self.op]

    @property
    def wants_indices(self) -> bool:
        return self.indices == IND["CUDNN_REDUCE_TENSOR_FLATTENED_INDICES"]


def reduce_desc(arg, argname: str = "reduceTensorDesc") -> ReduceTensorDescriptor:
    return resolve(arg, ReduceTensorDescriptor, argname)


createReduceTensorDescriptor, destroyReduceTensorDescriptor = pair(ReduceTensorDescriptor, __name__)


@legacy("cudnnSetReduceTensorDescriptor")
def setReduceTensorDescriptor(reduceTensorDesc, reduceTensorOp, reduceTensorCompType, reduceTensorNanOpt,
                              reduceTensorIndices, reduceTensorIndicesType) -> None:
    """002 §3.2.87: BAD_PARAM for an invalid enumerant."""
    d = resolve(reduceTensorDesc, ReduceTensorDescriptor, "reduceTensorDesc", need_set=False)
    for arg, value, enum in (("reduceTensorOp", reduceTensorOp, "cudnnReduceTensorOp_t"),
                             ("reduceTensorNanOpt", reduceTensorNanOpt, "cudnnNanPropagation_t"),
                             ("reduceTensorIndices", reduceTensorIndices, "cudnnReduceTensorIndices_t"),
                             ("reduceTensorIndicesType", reduceTensorIndicesType, "cudnnIndicesType_t")):
        check(is_valid(enum, value), arg, f"{value!r} is not a {enum}")
    check(is_valid("cudnnDataType_t", reduceTensorCompType) and int(reduceTensorCompType) in COMP_TYPES,
          "reduceTensorCompType", f"{reduceTensorCompType!r} is not a floating-point cudnnDataType_t")
    d.op, d.compType, d.nanOpt = int(reduceTensorOp), int(reduceTensorCompType), int(reduceTensorNanOpt)
    d.indices, d.indicesType = int(reduceTensorIndices), int(reduceTensorIndicesType)
    d.touched()


@legacy("cudnnGetReduceTensorDescriptor")
def getReduceTensorDescriptor(reduceTensorDesc) -> tuple:
    """002 §3.2.55: (reduceTensorOp, reduceTensorCompType, reduceTensorNanOpt, reduceTensorIndices,
    reduceTensorIndicesType)."""
    d = reduce_desc(reduceTensorDesc)
    return d.op, d.compType, d.nanOpt, d.indices, d.indicesType


# -- shared by the queries and the reduction --------------------------------------------

def _check_shapes(ad, cd):
    if not (cd.nbDims == ad.nbDims and all(c in (a, 1) for a, c in zip(ad.dims, cd.dims))):  # message on failure only
        check(False, "cDesc", f"each dim must equal aDesc's or be 1 (A {ad.dims}, C {cd.dims})")
    if ad.nbDims > MAX_DIMS:
        raise not_supported("aDesc", f"ReduceTensor supports up to {MAX_DIMS} dimensions, got {ad.nbDims}")


def _check_types(rd, ad, cd):
    check((ad.dtype == "float64") == (cd.dtype == "float64"), "cDesc",
          "A and C must both be double or neither (double cannot be mixed with other types)")
    for name, t in (("aDesc", ad), ("cDesc", cd)):
        if t.dtype not in DATA_TYPES:
            raise not_supported(name, f"data type {name_of('cudnnDataType_t', t.dataType)} is not FLOAT, HALF, INT8 or DOUBLE")
    want = D["CUDNN_DATA_DOUBLE"] if cd.dtype == "float64" else D["CUDNN_DATA_FLOAT"]
    if rd.compType != want:
        raise not_supported("reduceTensorDesc", f"reduceTensorCompType must be {name_of('cudnnDataType_t', want)} "
                            f"for {name_of('cudnnDataType_t', ad.dataType)} A and {name_of('cudnnDataType_t', cd.dataType)} C")


def _with_indices(rd) -> bool:
    return rd.wants_indices and rd.mode in INDEX_MODES


def _builder(rd, ad, cd, beta_zero: bool):
    def build():
        ct = DTYPE_NAME[rd.compType]
        c = cd.ir(C_UID, "C")
        tmp = virtual(RESULT, c.dims, ct, "reduced")
        outs = {"y": tmp}
        if _with_indices(rd):
            outs["indices"] = Tensor(I_UID, c.dims, packed_strides(c.dims), "int32", name="indices")
        nan = "PROPAGATE" if rd.nanOpt == NAN["CUDNN_PROPAGATE_NAN"] else "NOT_PROPAGATE"
        ops = [Operation("Reduction", {"x": ad.ir(A_UID, "A")}, outs, {"mode": rd.mode, "nan_propagation": nan}),
               blend(tmp, c, beta_zero)]
        return OperationGraph(ops, "ReduceTensor")
    return build


def _key(rd, ad, cd, beta_zero: bool) -> tuple:
    return ("ReduceTensor", rd.key(), ad.key(), cd.key(), beta_zero)


def _indices_bytes(rd, cd) -> int:
    if not rd.wants_indices:
        return 0
    n = 1
    for d in cd.dims:
        n *= d
    return n * INDEX_BYTES


def _workspace_need(h, rd, ad, cd) -> int:
    return max(plan_for(h, _key(rd, ad, cd, bz), _builder(rd, ad, cd, bz)).workspace_size for bz in (True, False))


@legacy("cudnnGetReductionIndicesSize")
def getReductionIndicesSize(handle, reduceTensorDesc, aDesc, cDesc) -> int:
    """002 §3.2.56: bytes of the indices buffer, 4 per element of C when the descriptor asks
    for FLATTENED_INDICES (whatever the indices type, as libcudnn answers), else 0."""
    get_handle(handle)
    rd = reduce_desc(reduceTensorDesc)
    ad, cd = tensor_desc(aDesc, "aDesc"), tensor_desc(cDesc, "cDesc")
    _check_shapes(ad, cd)
    return _indices_bytes(rd, cd)


@legacy("cudnnGetReductionWorkspaceSize")
def getReductionWorkspaceSize(handle, reduceTensorDesc, aDesc, cDesc) -> int:
    """002 §3.2.57: the workspace the reduction's plan needs on this handle's place."""
    h = get_handle(handle)
    rd = reduce_desc(reduceTensorDesc)
    ad, cd = tensor_desc(aDesc, "aDesc"), tensor_desc(cDesc, "cDesc")
    _check_shapes(ad, cd)
    return _workspace_need(h, rd, ad, cd)


_REDUCE, _REDUCE_SITES = Memo("cudnnReduceTensor"), Memo("cudnnReduceTensor sites")


@legacy("cudnnReduceTensor")
def reduceTensor(handle, reduceTensorDesc, indices, indicesSizeInBytes, workspace, workspaceSizeInBytes,
                 alpha, aDesc, A, beta, cDesc, C) -> None:
    """C = alpha * reduce_op(A) + beta * C over the dims where C is 1 (002 §3.2.71).  The
    descriptor checks run once per combination of settings (``_core.memo``)."""
    sk = (handle, reduceTensorDesc, aDesc, cDesc)
    h, rd, ad, cd, m = _reduce_site(sk, handle, reduceTensorDesc, aDesc, cDesc)
    dbl, need, with_indices, plans = m
    if need is not None:
        have = 0 if indices is None or (isinstance(indices, int) and indices == 0) else int(indicesSizeInBytes)
        if have < need:  # the message is made only on failure (a per-call check)
            check(False, "indicesSizeInBytes", f"the indices need {need} bytes, {have} were given",
                  CUDNN_STATUS_INVALID_VALUE)
    a, b = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)
    key, build = plans[b == 0]
    ws_need = cached_plan(h, key, build).workspace_size  # the plan run() takes from the cache next
    ws_have = 0 if workspace is None or (isinstance(workspace, int) and workspace == 0) else int(workspaceSizeInBytes)
    if ws_have < ws_need:
        check(False, "workspaceSizeInBytes", f"the reduction needs {ws_need} bytes of workspace, {ws_have} were given",
              CUDNN_STATUS_INVALID_VALUE)
    tensors = {A_UID: (A, "A"), C_UID: (C, "C")}
    if with_indices:
        tensors[I_UID] = (indices, "indices")
    run(h, key, build, tensors, {ALPHA: a, BETA: b}, workspace, ws_have)


@call_site(_REDUCE_SITES)
def _reduce_site(handle, reduceTensorDesc, aDesc, cDesc):
    """reduceTensor's descriptor resolving and checks (once per combination of settings)."""
    h = get_handle(handle)
    rd = reduce_desc(reduceTensorDesc)
    ad, cd = tensor_desc(aDesc, "aDesc"), tensor_desc(cDesc, "cDesc")
    mk, m = _REDUCE.lookup((), (rd, ad, cd))
    if m is None:
        _check_shapes(ad, cd)
        check(ad.dims != cd.dims, "cDesc", f"no dimension is reduced (A and C are both {ad.dims})")
        _check_types(rd, ad, cd)
        if rd.wants_indices:
            check(rd.mode in INDEX_MODES, "reduceTensorDesc",
                  f"indices are computed for MIN, MAX and AMAX only, not {name_of('cudnnReduceTensorOp_t', rd.op)}")
            if rd.indicesType != ITYPE["CUDNN_32BIT_INDICES"]:
                raise not_supported("reduceTensorDesc", f"indices type {name_of('cudnnIndicesType_t', rd.indicesType)}: "
                                    "only CUDNN_32BIT_INDICES is supported")
        plans = tuple((_key(rd, ad, cd, bz), _builder(rd, ad, cd, bz)) for bz in (False, True))
        m = _REDUCE.put(mk, (cd.dtype == "float64", _indices_bytes(rd, cd) if rd.wants_indices else None,
                             _with_indices(rd), plans), (rd.key(), ad.key(), cd.key()))
    return h, rd, ad, cd, m


def _reduce_recipe(h, rd, ad, cd, m):
    """reduceTensor's recipe: the workspace check is the prepared call's; none when indices are wanted
    (their size is a per-call check)."""
    _dbl, need, with_indices, plans = m
    if need is not None:
        return None
    tensors = {"A": A_UID, "C": C_UID, **({"indices": I_UID} if with_indices else {})}
    return Recipe.blend(h, tuple(key for key, _build in plans), tensors,
                        workspace=("workspace", "workspaceSizeInBytes", True))


reduceTensor = steady(reduceTensor, _REDUCE_SITES, ("handle", "reduceTensorDesc", "aDesc", "cDesc"), _reduce_recipe)
