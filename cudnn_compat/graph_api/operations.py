"""Finalize of the backend API's tensor, operator and operation descriptors (002 ch. 9
§9.2.1 CONVOLUTION, §9.2.10-§9.2.14 the operation descriptors, §9.2.16 TENSOR; the 8.2 header's
POINTWISE, MATMUL, REDUCTION and their operations): each becomes our graph layer's objects, a
``TensorObj`` (-> ``_backend.ir.Tensor``) or an ``OpNode`` whose ``lower(ctx)`` gives the IR
``Operation``s.  Every check raises ``fail(status, attribute, check, message)``.  The entry
points and the graph/engine/plan descriptors are in graph_api/api.py.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from cudnn_compat._backend.dtypes import itemsize
from cudnn_compat._backend.ir import GraphError, Operation, Tensor, scalar as scalar_tensor, virtual
from cudnn_compat._backend.ops import validate_op
from cudnn_compat._backend.ops.convolution import ROLES as CONV_ROLES
from cudnn_compat._backend.ops.pointwise import POINTWISE_BINARY, POINTWISE_UNARY
from . import attributes as A
from ..enums import ENUMS, name_of
from ..errors import CUDNN_STATUS_BAD_PARAM as BAD, CUDNN_STATUS_NOT_SUPPORTED as NOT_SUP
from ..errors import CuDNNError
from ..tensor import DTYPE_NAME, VECTOR_WIDTH

INTERNAL_UID_BASE = 2 ** 62  # uids we add (alpha/beta scalars, blend temporaries, in-place aliases)


def fail(status: int, attr: str, check: str, message: str) -> CuDNNError:
    """The error of a failed check: ``argument`` is the attribute, ``check`` the check's name
    (a row of ``cudnn_compat/_backend/rules.py``)."""
    from cudnn_compat._backend.rules import require
    e = CuDNNError(status, attr, f"check {check}: {message}")
    require(check, e.status_name[len("CUDNN_STATUS_"):])
    e.check = check
    return e


# -- finalize: tensors and operator descriptors ---------------------------------------------------

@dataclass(frozen=True)
class TensorObj:
    """A finalized CUDNN_BACKEND_TENSOR_DESCRIPTOR."""

    uid: int
    dims: tuple
    strides: tuple
    data_type: int
    dtype: str
    alignment: int
    is_virtual: bool
    is_by_value: bool

    def ir(self, dims=None, strides=None) -> Tensor:
        """The IR tensor (one name per uid, so every op sees the same tensor)."""
        return Tensor(self.uid, self.dims if dims is None else dims, self.strides if strides is None else strides,
                      self.dtype, self.is_virtual, self.is_by_value, f"uid{self.uid}")


def _fin_tensor(d):
    """002 §9.2.16: BAD_PARAM for non-positive dims/strides or an alignment that the data type
    size does not divide; NOT_SUPPORTED for the vector data types and vectorized tensors."""
    dims, strides = tuple(d.get("TENSOR_DIMENSIONS")), tuple(d.get("TENSOR_STRIDES"))
    dt, align = d.one("TENSOR_DATA_TYPE"), d.one("TENSOR_BYTE_ALIGNMENT")
    vec = d.one("TENSOR_VECTOR_COUNT", 1)
    virt, byval = d.one("TENSOR_IS_VIRTUAL", False), d.one("TENSOR_IS_BY_VALUE", False)
    if len(dims) != len(strides):
        raise fail(BAD, "CUDNN_ATTR_TENSOR_STRIDES", "TENSOR_STRIDES_COUNT",
                   f"has {len(strides)} elements but CUDNN_ATTR_TENSOR_DIMENSIONS has {len(dims)}")
    if any(x <= 0 for x in dims):
        raise fail(BAD, "CUDNN_ATTR_TENSOR_DIMENSIONS", "TENSOR_DIMENSIONS_POSITIVE", f"every dimension must be > 0, got {dims}")
    if any(x <= 0 for x in strides):
        raise fail(BAD, "CUDNN_ATTR_TENSOR_STRIDES", "TENSOR_STRIDES_POSITIVE", f"every stride must be > 0, got {strides}")
    if dt in VECTOR_WIDTH:
        raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_DATA_TYPE", "TENSOR_VECTOR_DATA_TYPE",
                   f"{name_of('cudnnDataType_t', dt)} is not supported; use CUDNN_DATA_INT8 with CUDNN_ATTR_TENSOR_VECTOR_COUNT")
    if dt not in DTYPE_NAME:
        raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_DATA_TYPE", "TENSOR_DATA_TYPE", f"{name_of('cudnnDataType_t', dt)} has no graph-layer type")
    dtype = DTYPE_NAME[dt]
    if align <= 0 or align % itemsize(dtype):
        raise fail(BAD, "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT", "TENSOR_ALIGNMENT",
                   f"{align} is not a positive multiple of the {itemsize(dtype)}-byte size of {name_of('cudnnDataType_t', dt)}")
    if vec != 1:
        if not d.has("TENSOR_VECTORIZED_DIMENSION"):
            raise fail(BAD, "CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION", "TENSOR_VECTORIZED_DIMENSION",
                       f"is required when CUDNN_ATTR_TENSOR_VECTOR_COUNT is {vec}")
        if dtype == "int8" and vec not in (4, 32):
            raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_VECTOR_COUNT", "TENSOR_VECTOR_COUNT", f"INT8 tensors take 1, 4 or 32, got {vec}")
        raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_VECTOR_COUNT", "TENSOR_VECTOR_COUNT",
                   f"vectorized tensors (count {vec}) are not supported by the graph layer")
    if virt and byval:
        raise fail(BAD, "CUDNN_ATTR_TENSOR_IS_BY_VALUE", "TENSOR_BY_VALUE", "a tensor cannot be both virtual and by-value")
    if byval and any(x != 1 for x in dims):
        raise fail(NOT_SUP, "CUDNN_ATTR_TENSOR_IS_BY_VALUE", "TENSOR_BY_VALUE", f"by-value tensors hold one element, dims are {dims}")
    return TensorObj(d.one("TENSOR_UNIQUE_ID"), dims, strides, dt, dtype, align, virt, byval)


# cudnnPointwiseMode_t -> IR Pointwise mode (docs/graph_ops.md); backward modes read (dy, x)
_PW_MODES = {v: k[len("CUDNN_POINTWISE_"):] for k, v in ENUMS["cudnnPointwiseMode_t"].items()}
_PW_BINARY = {"ADD", "MUL", "MIN", "MAX"}
_FLOAT_TYPES = {"float32", "float64", "float16", "bfloat16"}


def _compute_type(d, attr: str) -> str:
    dt = d.one(attr)
    name = DTYPE_NAME.get(dt) if dt not in VECTOR_WIDTH else None
    if name not in _FLOAT_TYPES | {"int32"}:
        raise fail(NOT_SUP, "CUDNN_ATTR_" + attr, "COMPUTE_TYPE",
                   f"{name_of('cudnnDataType_t', dt)} is not a compute type of the graph layer (FLOAT, DOUBLE, HALF, BFLOAT16, INT32)")
    return name


def _fin_pointwise(d):
    """CUDNN_BACKEND_POINTWISE_DESCRIPTOR (002 §5.1.3.1 attributes; 8.2 header for 5-8)."""
    mode = _PW_MODES[d.one("POINTWISE_MODE")]
    if mode not in POINTWISE_UNARY | POINTWISE_BINARY:
        raise fail(NOT_SUP, "CUDNN_ATTR_POINTWISE_MODE", "POINTWISE_MODE", f"CUDNN_POINTWISE_{mode} has no graph-layer kernel")
    prec = _compute_type(d, "POINTWISE_MATH_PREC")
    attrs = {"mode": mode}
    nan = d.one("POINTWISE_NAN_PROPAGATION")
    if nan is not None:
        attrs["nan_propagation"] = "PROPAGATE" if nan == ENUMS["cudnnNanPropagation_t"]["CUDNN_PROPAGATE_NAN"] else "NOT_PROPAGATE"
    lo, up = d.one("POINTWISE_RELU_LOWER_CLIP"), d.one("POINTWISE_RELU_UPPER_CLIP")
    if lo is not None:
        attrs["relu_lower_clip"] = lo
    if up is not None:
        attrs["relu_upper_clip"] = up
    if lo is not None and up is not None and lo > up:
        raise fail(BAD, "CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP", "POINTWISE_RELU_CLIP", f"upper clip {up} is below the lower clip {lo}")
    if d.one("POINTWISE_RELU_LOWER_CLIP_SLOPE", 0.0) != 0.0:
        raise fail(NOT_SUP, "CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE", "POINTWISE_RELU_SLOPE",
                   "a leaky ReLU slope is not supported by the graph layer's pointwise op")
    for attr, key in (("POINTWISE_ELU_ALPHA", "elu_alpha"), ("POINTWISE_SOFTPLUS_BETA", "softplus_beta"),
                      ("POINTWISE_SWISH_BETA", "swish_beta")):
        if d.has(attr):
            attrs[key] = d.one(attr)
    return {"mode": mode, "attrs": attrs, "math_prec": prec}


def _fin_convolution(d):
    """002 §9.2.1: BAD_PARAM when an array's element count differs from SPATIAL_DIMS (when
    SPATIAL_DIMS is not set, it is the arrays' common count), or a value is out of range."""
    arrays = {n: tuple(d.get(n)) for n in ("CONVOLUTION_PRE_PADDINGS", "CONVOLUTION_POST_PADDINGS",
                                           "CONVOLUTION_FILTER_STRIDES", "CONVOLUTION_DILATIONS")}
    nsp = d.one("CONVOLUTION_SPATIAL_DIMS")
    if nsp is None:
        nsp = len(arrays["CONVOLUTION_DILATIONS"])
        src = "CUDNN_ATTR_CONVOLUTION_DILATIONS's element count (CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS is not set)"
    else:
        src = "CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS"
        if not 1 <= nsp <= A.MAX_DIMS - 2:
            raise fail(BAD, "CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS", "CONV_SPATIAL_DIMS", f"must be in 1..{A.MAX_DIMS - 2}, got {nsp}")
    for n, vals in arrays.items():
        if len(vals) != nsp:
            raise fail(BAD, "CUDNN_ATTR_" + n, "CONV_SPATIAL_DIMS", f"has {len(vals)} elements but {src} is {nsp}")
    for n, lo in (("CONVOLUTION_PRE_PADDINGS", 0), ("CONVOLUTION_POST_PADDINGS", 0),
                  ("CONVOLUTION_FILTER_STRIDES", 1), ("CONVOLUTION_DILATIONS", 1)):
        if any(v < lo for v in arrays[n]):
            raise fail(BAD, "CUDNN_ATTR_" + n, "CONV_" + n.split("_", 1)[1], f"every element must be >= {lo}, got {arrays[n]}")
    mode = "CONVOLUTION" if d.one("CONVOLUTION_CONV_MODE") == ENUMS["cudnnConvolutionMode_t"]["CUDNN_CONVOLUTION"] else "CROSS_CORRELATION"
    comp = _compute_type(d, "CONVOLUTION_COMP_TYPE")
    if comp == "bfloat16":
        raise fail(NOT_SUP, "CUDNN_ATTR_CONVOLUTION_COMP_TYPE", "COMPUTE_TYPE", "BFLOAT16 is not a convolution compute type")
    return {"spatial_dims": nsp, "mode": mode, "compute_type": comp,
            "pre": arrays["CONVOLUTION_PRE_PADDINGS"], "post": arrays["CONVOLUTION_POST_PADDINGS"],
            "stride": arrays["CONVOLUTION_FILTER_STRIDES"], "dilation": arrays["CONVOLUTION_DILATIONS"]}


def _fin_matmul(d):
    return {"compute_type": _compute_type(d, "MATMUL_COMP_TYPE")}


_REDUCE_MODES = {v: k[len("CUDNN_REDUCE_TENSOR_"):] for k, v in ENUMS["cudnnReduceTensorOp_t"].items()}


def _fin_reduction(d):
    return {"mode": _REDUCE_MODES[d.one("REDUCTION_OPERATOR")], "compute_type": _compute_type(d, "REDUCTION_COMP_TYPE")}


def _fin_knob_choice(d):
    return (d.one("KNOB_CHOICE_KNOB_TYPE"), d.one("KNOB_CHOICE_KNOB_VALUE"))


# -- finalize: operations ---------------------------------------------------------------------------

class Lowering:
    """Allocates the uids a lowering adds and records their meaning: ``scalars`` (uid -> value
    of an alpha/beta by-value tensor), ``aliases`` (uid -> the user uid whose buffer it reads:
    y before a beta blend, or an in-place input)."""

    def __init__(self, base: int = INTERNAL_UID_BASE, inplace=frozenset()):
        self._uids = itertools.count(base)
        self.scalars: dict = {}
        self.aliases: dict = {}
        self.inplace = inplace
        self._read = {}

    def scalar(self, value: float, dtype: str, name: str) -> Tensor:
        t = scalar_tensor(next(self._uids), dtype, name)
        self.scalars[t.uid] = float(value)
        return t

    def virtual(self, dims, dtype: str, name: str) -> Tensor:
        return virtual(next(self._uids), dims, dtype, name)

    def alias(self, t: Tensor, name: str) -> Tensor:
        a = Tensor(next(self._uids), t.dims, t.strides, t.dtype, name=name)
        self.aliases[a.uid] = t.uid
        return a

    def read(self, t: Tensor) -> Tensor:
        """An op input: an alias of ``t`` when the single-op graph writes ``t`` in place."""
        if t.uid not in self.inplace:
            return t
        if t.uid not in self._read:
            self._read[t.uid] = self.alias(t, (t.name or "x") + "_in_place")
        return self._read[t.uid]


@dataclass
class OpNode:
    """A finalized operation descriptor: its IR tensors by attribute name, which of them it
    reads and writes, and ``lower(ctx)`` -> the IR operations."""

    type_name: str
    tensors: dict  # attribute full name -> IR Tensor
    reads: tuple  # attribute full names
    writes: tuple
    lower: object
    roles: dict = field(default_factory=dict)  # IR role -> attribute full name (for error messages)

    def uids(self, which) -> set:
        return {self.tensors[a].uid for a in which}


def _node(d, type_name, tensors, reads, writes, lower, roles):
    node = OpNode(type_name, tensors, tuple(reads), tuple(writes), lower, roles)
    ctx = Lowering()
    for i, op in enumerate(lower(ctx)):  # the per-kind rules of cudnn_compat/_backend/ops/, now
        try:
            validate_op(i, op)
        except GraphError as e:
            legend = ", ".join(f"{r}={a}" for r, a in roles.items())
            raise fail(NOT_SUP if e.status == "NOT_SUPPORTED" else BAD, f"CUDNN_BACKEND_{type_name}_DESCRIPTOR", e.check,
                       f"{graph_message(e)} (roles: {legend})") from None
    return node


def graph_message(e: GraphError) -> str:
    text = str(e)
    return text[len(e.check) + 2:] if text.startswith(e.check + ": ") else text


def _conv_group_merge(t: TensorObj, axis: int, attr: str):
    """dims/strides with dims ``axis`` (group) and ``axis+1`` merged; NOT_SUPPORTED when the group
    stride is not dims[axis+1] * strides[axis+1] (the graph layer needs packed groups)."""
    dims, st = list(t.dims), list(t.strides)
    if dims[axis] > 1 and st[axis] != dims[axis + 1] * st[axis + 1]:
        raise fail(NOT_SUP, attr, "CONV_GROUP_STRIDE",
                   f"group stride {st[axis]} is not {dims[axis + 1]}*{st[axis + 1]}: "
                   "unpacked group strides are not supported by the graph layer")
    dims[axis:axis + 2] = [dims[axis] * dims[axis + 1]]
    st[axis:axis + 2] = [st[axis + 1]]
    return tuple(dims), tuple(st)


_CONV_OPS = {  # descriptor type -> (IR kind, attribute prefix, {IR role: attribute suffix})
    "OPERATION_CONVOLUTION_FORWARD": ("ConvolutionForward", "OPERATION_CONVOLUTION_FORWARD_", {"x": "X", "w": "W", "y": "Y"}),
    "OPERATION_CONVOLUTION_BACKWARD_DATA": ("ConvolutionBackwardData", "OPERATION_CONVOLUTION_BWD_DATA_",
                                            {"dx": "DX", "w": "W", "dy": "DY"}),
    "OPERATION_CONVOLUTION_BACKWARD_FILTER": ("ConvolutionBackwardFilter", "OPERATION_CONVOLUTION_BWD_FILTER_",
                                              {"x": "X", "dw": "DW", "dy": "DY"}),
}


def _fin_conv_op(d):
    """002 §9.2.10-§9.2.12: out = alpha * conv(...) + beta * out.  Tensors have SPATIAL_DIMS+2
    dims ([N, G*C, ...], [G*K, C, ...], [N, G*K, ...]) or SPATIAL_DIMS+3 dims ([N, G, C, ...],
    [G, K, C, ...], [N, G, K, ...]); n, g, c, k must agree (BAD_PARAM naming the tensor)."""
    kind, prefix, role_attr = _CONV_OPS[d.type_name]
    xr, wr, yr = CONV_ROLES[kind]
    out_role = {"ConvolutionForward": "y", "ConvolutionBackwardData": "dx", "ConvolutionBackwardFilter": "dw"}[kind]
    full = {r: "CUDNN_ATTR_" + prefix + s for r, s in role_attr.items()}
    conv = d.sub(prefix + "CONV_DESC")
    t = {r: d.sub(prefix + s) for r, s in role_attr.items()}
    nsp = conv["spatial_dims"]
    rank = len(t[xr].dims)
    for r in (xr, wr, yr):
        n = len(t[r].dims)
        if n not in (nsp + 2, nsp + 3):
            raise fail(BAD, full[r], "CONV_TENSOR_RANK",
                       f"has {n} dims; with CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS {nsp} conv tensors have {nsp + 2} or {nsp + 3}")
        if n != rank:
            raise fail(BAD, full[r], "CONV_TENSOR_RANK", f"has {n} dims but {full[xr]} has {rank}")
    X, W, Y = t[xr], t[wr], t[yr]
    if rank == nsp + 3:  # [N, G, C, ...], [G, K, C, ...], [N, G, K, ...]
        (n, g, c), (gw, k, cw), (ny, gy, ky) = X.dims[:3], W.dims[:3], Y.dims[:3]
        for ok, r, what in ((gw == g, wr, f"group count {gw} differs from {full[xr]}'s {g}"),
                            (cw == c, wr, f"per-group input channels {cw} differ from {full[xr]}'s {c}"),
                            (ny == n, yr, f"batch {ny} differs from {full[xr]}'s {n}"),
                            (gy == g, yr, f"group count {gy} differs from {full[xr]}'s {g}"),
                            (ky == k, yr, f"per-group output channels {ky} differ from {full[wr]}'s {k}")):
            if not ok:
                raise fail(BAD, full[r], "CONV_GROUP_DIMS", what)
        groups = g
        ir_dims = {xr: _conv_group_merge(X, 1, full[xr]), wr: _conv_group_merge(W, 0, full[wr]), yr: _conv_group_merge(Y, 1, full[yr])}
    else:  # [N, G*C, ...], [G*K, C, ...], [N, G*K, ...]
        if X.dims[1] % W.dims[1]:
            raise fail(BAD, full[xr], "CONV_CHANNELS",
                       f"has {X.dims[1]} channels, not a multiple of {full[wr]}'s {W.dims[1]} channels per group")
        groups = X.dims[1] // W.dims[1]
        if W.dims[0] % groups:
            raise fail(BAD, full[wr], "CONV_GROUPS", f"has {W.dims[0]} output channels, not a multiple of the {groups} groups "
                                                     f"that {full[xr]}'s {X.dims[1]} channels imply")
        if Y.dims[1] != W.dims[0]:
            raise fail(BAD, full[yr], "CONV_OUTPUT_CHANNELS", f"has {Y.dims[1]} channels but {full[wr]} has {W.dims[0]} filters")
        if Y.dims[0] != X.dims[0]:
            raise fail(BAD, full[yr], "CONV_BATCH", f"batch {Y.dims[0]} differs from {full[xr]}'s {X.dims[0]}")
        ir_dims = {r: (t[r].dims, t[r].strides) for r in (xr, wr, yr)}
    xs, ws, ys = ir_dims[xr][0][2:], ir_dims[wr][0][2:], ir_dims[yr][0][2:]
    want = []
    for i in range(nsp):
        span = (ws[i] - 1) * conv["dilation"][i] + 1
        padded = xs[i] + conv["pre"][i] + conv["post"][i]
        if span > padded:
            raise fail(BAD, full[wr], "CONV_FILTER_SIZE",
                       f"dilated filter extent {span} in spatial dim {i} exceeds the padded input {padded}")
        want.append(1 + (padded - span) // conv["stride"][i])
    if tuple(want) != tuple(ys):
        raise fail(BAD, full[yr], "CONV_OUTPUT_DIMS",
                   f"spatial dims {tuple(ys)} differ from the convolution's {tuple(want)} "
                   f"(1 + (input + pre + post - dilated filter) // stride)")
    if X.dtype != W.dtype:
        raise fail(BAD, full[wr], "CONV_DATA_TYPE", f"data type {W.dtype} differs from {full[xr]}'s {X.dtype}")
    alpha, beta = d.one(prefix + "ALPHA"), d.one(prefix + "BETA")
    out = t[out_role]
    if beta != 0 and out.is_virtual:
        raise fail(NOT_SUP, "CUDNN_ATTR_" + prefix + "BETA", "CONV_BETA_VIRTUAL",
                   f"beta is {beta} but {full[out_role]} is virtual: there is no prior output to blend")
    attrs = {"mode": conv["mode"], "pre_padding": conv["pre"], "post_padding": conv["post"], "stride": conv["stride"],
             "dilation": conv["dilation"], "groups": groups, "compute_type": conv["compute_type"],
             "math_type": "DEFAULT_MATH", "algo": None}
    tensors = {full[r]: t[r].ir(*ir_dims[r]) for r in (xr, wr, yr)}
    ins = [r for r in (xr, wr, yr) if r != out_role]

    def lower(ctx):
        inputs = {r: ctx.read(tensors[full[r]]) for r in ins}
        y = tensors[full[out_role]]
        if alpha == 1 and beta == 0:
            return [Operation(kind, inputs, {out_role: y}, attrs)]
        ct = "float64" if y.dtype == "float64" else "float32"
        tmp = ctx.virtual(y.dims, ct, out_role + "_result")
        blend_in = {"x": tmp, "alpha1": ctx.scalar(alpha, ct, "alpha")}
        if beta != 0:
            blend_in.update(b=ctx.alias(y, out_role + "_prior"), alpha2=ctx.scalar(beta, ct, "beta"))
        return [Operation(kind, inputs, {out_role: tmp}, attrs),
                Operation("Pointwise", blend_in, {"y": y}, {"mode": "ADD" if beta != 0 else "IDENTITY"})]

    return _node(d, d.type_name, tensors, [full[r] for r in ins], [full[out_role]], lower,
                 {r: full[r] for r in (xr, wr, yr)})


def _check_rank_broadcast(out: TensorObj, out_attr: str, inputs: dict, check: str):
    """Inputs have the output's rank and each dim equal to it or 1 (002 §9.2.14 broadcasting)."""
    for attr, tt in inputs.items():
        if tt.is_by_value:
            continue
        if len(tt.dims) != len(out.dims):
            raise fail(BAD, attr, check + "_RANK", f"has {len(tt.dims)} dims but {out_attr} has {len(out.dims)}")
        if any(a not in (b, 1) for a, b in zip(tt.dims, out.dims)):
            raise fail(BAD, attr, check + "_BROADCAST", f"dims {tt.dims} neither equal nor broadcast (1) to {out_attr}'s {out.dims}")


def _fin_pointwise_op(d):
    """002 §9.2.14: y = op(alpha1 * x [, alpha2 * b]); backward activation modes (8.2) compute
    dx from dy (DYDESC) and the forward input (XDESC)."""
    P = "OPERATION_POINTWISE_"
    full = {k: "CUDNN_ATTR_" + P + k for k in ("XDESC", "BDESC", "YDESC", "DXDESC", "DYDESC", "ALPHA2")}
    pw = d.sub(P + "PW_DESCRIPTOR")
    mode = pw["mode"]
    bwd = mode.endswith("_BWD")
    need = ("XDESC", "DYDESC", "DXDESC") if bwd else (("XDESC", "BDESC", "YDESC") if mode in _PW_BINARY else ("XDESC", "YDESC"))
    for k in need:
        if not d.has(P + k):
            raise fail(BAD, full[k], "POINTWISE_TENSORS", f"is required for CUDNN_POINTWISE_{mode}")
    for k in ("XDESC", "BDESC", "YDESC", "DXDESC", "DYDESC", "ALPHA2"):
        if k not in need and d.has(P + k) and not (k == "ALPHA2" and mode in _PW_BINARY):
            raise fail(BAD, full[k], "POINTWISE_TENSORS", f"must not be set for CUDNN_POINTWISE_{mode}")
    tt = {k: d.sub(P + k) for k in need}
    out_k = "DXDESC" if bwd else "YDESC"
    in_ks = [k for k in need if k != out_k]
    _check_rank_broadcast(tt[out_k], full[out_k], {full[k]: tt[k] for k in in_ks}, "POINTWISE")
    tensors = {full[k]: tt[k].ir() for k in need}
    role_of = {"DYDESC": "x", "XDESC": "b"} if bwd else {"XDESC": "x", "BDESC": "b"}
    alpha1, alpha2 = d.one(P + "ALPHA1", 1.0), d.one(P + "ALPHA2", 1.0)

    def lower(ctx):
        ins = {role_of[k]: ctx.read(tensors[full[k]]) for k in in_ks}
        ct = "float64" if pw["math_prec"] == "float64" else "float32"
        if alpha1 != 1:
            ins["alpha1"] = ctx.scalar(alpha1, ct, "alpha1")
        if alpha2 != 1 and "b" in ins:
            ins["alpha2"] = ctx.scalar(alpha2, ct, "alpha2")
        return [Operation("Pointwise", ins, {"y": tensors[full[out_k]]}, dict(pw["attrs"]))]

    roles = {role_of[k]: full[k] for k in in_ks}
    roles["y"] = full[out_k]
    return _node(d, d.type_name, tensors, [full[k] for k in in_ks], [full[out_k]], lower, roles)


def _fin_matmul_op(d):
    """C = A @ B over the last two dims, batch dims broadcast (000 MatMul; 8.2 header attributes)."""
    P = "OPERATION_MATMUL_"
    full = {k: "CUDNN_ATTR_" + P + k for k in ("ADESC", "BDESC", "CDESC")}
    d.sub(P + "DESC")
    if d.has(P + "IRREGULARLY_STRIDED_BATCH_COUNT"):
        raise fail(NOT_SUP, "CUDNN_ATTR_" + P + "IRREGULARLY_STRIDED_BATCH_COUNT", "MATMUL_IRREGULAR_BATCH",
                   "irregularly strided batches are not supported by the graph layer")
    a, b, c = (d.sub(P + k) for k in ("ADESC", "BDESC", "CDESC"))
    for k, tt in (("ADESC", a), ("BDESC", b), ("CDESC", c)):
        if len(tt.dims) < 2 or len(tt.dims) != len(c.dims):
            raise fail(BAD, full[k], "MATMUL_RANK", f"has {len(tt.dims)} dims; A, B and C need the same rank >= 2")
    if a.dims[-1] != b.dims[-2]:
        raise fail(BAD, full["BDESC"], "MATMUL_SHAPE", f"has {b.dims[-2]} rows but A has {a.dims[-1]} columns")
    if c.dims[-2:] != (a.dims[-2], b.dims[-1]):
        raise fail(BAD, full["CDESC"], "MATMUL_SHAPE", f"is {c.dims[-2:]} per batch but A @ B is {(a.dims[-2], b.dims[-1])}")
    for k, tt in (("ADESC", a), ("BDESC", b)):
        if any(x not in (y, 1) for x, y in zip(tt.dims[:-2], c.dims[:-2])):
            raise fail(BAD, full[k], "MATMUL_BATCH", f"batch dims {tt.dims[:-2]} neither equal nor broadcast to C's {c.dims[:-2]}")
    tensors = {full[k]: tt.ir() for k, tt in (("ADESC", a), ("BDESC", b), ("CDESC", c))}

    def lower(ctx):
        return [Operation("Matmul", {"a": ctx.read(tensors[full["ADESC"]]), "b": ctx.read(tensors[full["BDESC"]])},
                          {"c": tensors[full["CDESC"]]})]

    return _node(d, d.type_name, tensors, [full["ADESC"], full["BDESC"]], [full["CDESC"]], lower,
                 {"a": full["ADESC"], "b": full["BDESC"], "c": full["CDESC"]})


def _fin_reduction_op(d):
    """y = reduce(x) over the dims where y is 1 (8.2 header REDUCTION attributes; IR Reduction)."""
    P = "OPERATION_REDUCTION_"
    xa, ya = "CUDNN_ATTR_" + P + "XDESC", "CUDNN_ATTR_" + P + "YDESC"
    red = d.sub(P + "DESC")
    x, y = d.sub(P + "XDESC"), d.sub(P + "YDESC")
    if len(x.dims) != len(y.dims):
        raise fail(BAD, ya, "REDUCTION_RANK", f"has {len(y.dims)} dims but the input has {len(x.dims)}")
    if any(b not in (a, 1) for a, b in zip(x.dims, y.dims)):
        raise fail(BAD, ya, "REDUCTION_DIMS", f"dims {y.dims} must equal the input's {x.dims} or be 1")
    tensors = {xa: x.ir(), ya: y.ir()}

    def lower(ctx):
        return [Operation("Reduction", {"x": ctx.read(tensors[xa])}, {"y": tensors[ya]}, {"mode": red["mode"]})]

    return _node(d, d.type_name, tensors, [xa], [ya], lower, {"x": xa, "y": ya})


def _fin_genstats_op(d):
    """002 §9.2.13 CUDNN_GENSTATS_SUM_SQSUM: per-channel sum and sum of squares of x; outputs
    are 1 in every dim but C, which equals x's.  Lowered to Reduction ADD of x and of x*x."""
    P = "OPERATION_GENSTATS_"
    xa, sa, qa = ("CUDNN_ATTR_" + P + k for k in ("XDESC", "SUMDESC", "SQSUMDESC"))
    _compute_type(d, P + "MATH_PREC")
    x, s, q = d.sub(P + "XDESC"), d.sub(P + "SUMDESC"), d.sub(P + "SQSUMDESC")
    for attr, tt in ((sa, s), (qa, q)):
        if len(tt.dims) != len(x.dims):
            raise fail(BAD, attr, "GENSTATS_RANK", f"has {len(tt.dims)} dims but {xa} has {len(x.dims)}")
        want = tuple(x.dims[1] if i == 1 else 1 for i in range(len(x.dims)))
        if tt.dims != want:
            raise fail(BAD, attr, "GENSTATS_DIMS", f"dims {tt.dims} must be {want}: 1 except C, which equals the input's")
    tensors = {xa: x.ir(), sa: s.ir(), qa: q.ir()}

    def lower(ctx):
        xi = ctx.read(tensors[xa])
        sq = ctx.virtual(x.dims, "float32", "x_squared")
        return [Operation("Reduction", {"x": xi}, {"y": tensors[sa]}, {"mode": "ADD"}),
                Operation("Pointwise", {"x": xi, "b": xi}, {"y": sq}, {"mode": "MUL"}),
                Operation("Reduction", {"x": sq}, {"y": tensors[qa]}, {"mode": "ADD"})]

    return _node(d, d.type_name, tensors, [xa], [sa, qa], lower, {"x": xa, "sum": sa, "sqsum": qa})


def _fin_unlowered_op(d):
    """BN_FINALIZE_STATISTICS and BN_BWD_WEIGHTS (8.2 header): their semantics are not
    specified in the seeds, so the graph layer has no lowering for them."""
    raise fail(NOT_SUP, f"CUDNN_BACKEND_{d.type_name}_DESCRIPTOR", "OPERATION_KIND",
               "this operation has no graph-layer lowering (its formulas are not specified in 002)")


FINALIZE = {
    "TENSOR": _fin_tensor, "POINTWISE": _fin_pointwise, "CONVOLUTION": _fin_convolution, "MATMUL": _fin_matmul,
    "REDUCTION": _fin_reduction, "KNOB_CHOICE": _fin_knob_choice,
    "OPERATION_CONVOLUTION_FORWARD": _fin_conv_op, "OPERATION_CONVOLUTION_BACKWARD_DATA": _fin_conv_op,
    "OPERATION_CONVOLUTION_BACKWARD_FILTER": _fin_conv_op, "OPERATION_POINTWISE": _fin_pointwise_op,
    "OPERATION_MATMUL": _fin_matmul_op, "OPERATION_REDUCTION": _fin_reduction_op, "OPERATION_GEN_STATS": _fin_genstats_op,
    "OPERATION_BN_FINALIZE_STATISTICS": _fin_unlowered_op, "OPERATION_BN_BWD_WEIGHTS": _fin_unlowered_op,
}
