"""Our IR graph -> a cuDNN 9 backend operation graph (000 "Graph API", "Supported graph
patterns"; 002 ch. 9 for the descriptors).

Two steps.  ``candidates(graph)`` is pure Python (runs anywhere, tested on the CPU): it
pattern-matches the IR graph and returns ``Native`` specs, best first, or raises
``Decline`` with a plain-language reason.  ``NativeGraph(spec, handle, values)`` then
creates and finalizes the backend descriptors (tensors, operations, operation graph)
through ``lib``; ``values`` are the scalars the spec bakes into attributes (``Native.baked``).

Patterns
  conv_blend      one ConvolutionForward/BackwardData/BackwardFilter writing a virtual
                  result, then the legacy blend (``cudnn_compat._core.call.blend``): Pointwise
                  IDENTITY(alpha1) or ADD(b = prior y, alpha1, alpha2).  Fused into the
                  backend convolution's own alpha/beta (002 ch. 9: y = alpha*conv + beta*y),
                  writing y directly; prior y must be the same memory as y (checked at
                  execute).  Alpha/beta are attributes of the backend op, so the plan keeps
                  one native plan per (alpha, beta) value pair.  A convolution writing a
                  non-virtual tensor directly is the same pattern with alpha=1, beta=0.
  fusion          one main op (convolution of any direction, or Matmul) followed by a DAG
                  of Pointwise ops: one runtime-fusion graph ("g2" epilogue); virtual
                  tensors take the output's memory order.  ConvBiasAct is this pattern.
                  Pointwise alpha1/alpha2 scalars are first tried as the ops' ALPHA1/ALPHA2
                  attributes (baked like conv alpha/beta; an IDENTITY(alpha1) feeding an ADD
                  folds into that ADD, the ConvBiasAct shape of 000), then as MUL by by-value
                  backend tensors (values change per call without a new plan).
                  A conv_blend graph is also offered as a fusion graph, second.
Anything else declines (see ``DECLINED_KINDS``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

CONV_KINDS = {
    # IR kind -> (backend op descriptor, {IR role: backend attribute suffix}, output role, prefix)
    "ConvolutionForward": ("OPERATION_CONVOLUTION_FORWARD", {"x": "X", "w": "W", "y": "Y"}, "y",
                           "OPERATION_CONVOLUTION_FORWARD_"),
    "ConvolutionBackwardData": ("OPERATION_CONVOLUTION_BACKWARD_DATA", {"dy": "DY", "w": "W", "dx": "DX"}, "dx",
                                "OPERATION_CONVOLUTION_BWD_DATA_"),
    "ConvolutionBackwardFilter": ("OPERATION_CONVOLUTION_BACKWARD_FILTER", {"x": "X", "dy": "DY", "dw": "DW"}, "dw",
                                  "OPERATION_CONVOLUTION_BWD_FILTER_"),
}
MAIN_KINDS = set(CONV_KINDS) | {"Matmul"}

DECLINED_KINDS = {
    "NormForward": "batch normalization: cuDNN 9 runs batch norm only through its specialized runtime-fusion "
                   "engines (BnAddRelu / DReluForkDBn: NHWC-packed, per-channel FP32 statistics, C a multiple "
                   "of 8); this engine does not translate NormForward yet",
    "NormBackward": "batch normalization backward: cuDNN 9 runs it only through the DReluForkDBn specialized "
                    "runtime-fusion engine; this engine does not translate NormBackward yet",
    "ResampleForward": "pooling: cuDNN 9's resample operation is not translated by this engine",
    "ResampleBackward": "pooling backward: cuDNN 9's resample operation is not translated by this engine",
    "Reduction": "a Reduction runs in cuDNN 9 only as the exit node of a convolution/matmul epilogue; "
                 "this engine does not translate it",
    "Softmax": "softmax is a legacy-only operation with no cuDNN 9 backend operation",
    "SoftmaxBackward": "softmax backward is a legacy-only operation with no cuDNN 9 backend operation",
    "LRNForward": "LRN is a legacy-only operation with no cuDNN 9 backend operation",
    "LRNBackward": "LRN backward is a legacy-only operation with no cuDNN 9 backend operation",
    "DivisiveNormalizationForward": "divisive normalization is a legacy-only operation with no cuDNN 9 backend operation",
    "DivisiveNormalizationBackward": "divisive normalization backward is a legacy-only operation with no cuDNN 9 "
                                     "backend operation",
}

# IR pointwise mode -> backend mode; modes absent here decline.
PW_MODE = {m: m for m in (
    "IDENTITY", "ADD", "SUB", "MUL", "DIV", "MIN", "MAX", "POW", "SQRT", "NEG", "ABS", "EXP", "LOG", "RSQRT",
    "RECIPROCAL", "RELU_FWD", "TANH_FWD", "SIGMOID_FWD", "ELU_FWD", "GELU_FWD", "SOFTPLUS_FWD", "SWISH_FWD",
    "CMP_GT", "CMP_GE", "CMP_LT", "CMP_LE", "CMP_EQ", "CMP_NEQ",
    "RELU_BWD", "TANH_BWD", "SIGMOID_BWD", "ELU_BWD", "SWISH_BWD")}
PW_MODE.update({"CLIPPED_RELU_FWD": "RELU_FWD", "CLIPPED_RELU_BWD": "RELU_BWD"})
PW_BACKWARD = {"RELU_BWD", "TANH_BWD", "SIGMOID_BWD", "ELU_BWD", "SWISH_BWD", "CLIPPED_RELU_BWD"}
PW_COMMUTATIVE = {"ADD", "MUL", "MIN", "MAX", "CMP_EQ", "CMP_NEQ"}
PW_UNARY = {"IDENTITY", "SQRT", "NEG", "ABS", "EXP", "LOG", "RSQRT", "RECIPROCAL", "RELU_FWD", "TANH_FWD",
            "SIGMOID_FWD", "ELU_FWD", "GELU_FWD", "SOFTPLUS_FWD", "SWISH_FWD", "CLIPPED_RELU_FWD"}
FLOAT_MAX = 3.4028234663852886e38
ALIGNMENT = 16  # bytes promised for every data pointer; checked per call
_SCRATCH_UID = 1 << 40  # uids of tensors this translation adds (scaled operands)


class Decline(Exception):
    """The graph has no translation; ``reason`` says why in plain words."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class TSpec:
    uid: int
    dims: tuple
    strides: tuple
    dtype: str
    virtual: bool = False
    by_value: bool = False


@dataclass
class NOp:
    """One backend operation: ``desc`` the operation descriptor type, ``tensors`` backend
    attribute name -> uid, ``attrs`` the settings of its math descriptor."""
    kind: str  # 'conv', 'pointwise', 'matmul'
    desc: str
    tensors: dict
    attrs: dict = field(default_factory=dict)


@dataclass
class Native:
    pattern: str  # 'conv_blend' | 'fusion'
    main_kind: str
    tensors: dict  # uid -> TSpec
    ops: list  # [NOp]
    bind: list  # [(native uid, IR uid whose buffer/scalar it takes, is_scalar)]
    same_memory: list = field(default_factory=list)  # [(IR uid, IR uid)] that must share a pointer
    # scalars baked into the native graph as attributes: [(by-value IR uid or None, value when None)];
    # a plan keeps one native plan per tuple of their values (conv alpha/beta, pointwise alpha1/alpha2)
    baked: list = field(default_factory=list)
    scale_mode: str = ""  # fusion: 'attr' (pointwise ALPHA1/ALPHA2) or 'mul' (MUL by by-value tensors)
    math_type: str = "DEFAULT_MATH"
    compute_type: str = "float32"
    algo: "str | None" = None
    data_dtype: str = "float32"
    zero_workspace: bool = False  # conv attr: the legacy algo designated to need no workspace
    workspace_limit: "int | None" = None  # the graph's ``workspace_limit``: plans needing more are not built

    def representative(self) -> tuple:
        """Values baked into the native graph used for heuristics and the first plan: for a
        scalar that comes from the call 1.0 (conv alpha/beta: the common call) or 0.5
        (fusion alphas: a general value, so the engine chosen is not one special-cased for
        1), the fixed value otherwise."""
        call = 1.0 if self.pattern == "conv_blend" else 0.5
        return tuple(call if uid is not None else v for uid, v in self.baked)

    def describe(self) -> str:
        ops = ", ".join(f"{o.desc.replace('OPERATION_', '')}" + (f"[{o.attrs.get('mode')}]" if o.kind == "pointwise" else "")
                        for o in self.ops)
        return f"{self.pattern}: {ops}"


def _spec(t, dims=None, strides=None, virtual=None) -> TSpec:
    return TSpec(t.uid, tuple(dims or t.dims), tuple(strides or t.strides), t.dtype,
                 t.is_virtual if virtual is None else virtual, t.is_by_value)


def _rank_up(t: TSpec, rank: int) -> TSpec:
    """Prepend unit dims (matmul wants rank >= 3; pointwise operands need equal ranks)."""
    if len(t.dims) >= rank:
        return t
    k = rank - len(t.dims)
    outer = (t.dims[0] * t.strides[0]) if t.dims else 1
    return TSpec(t.uid, (1,) * k + t.dims, (max(outer, 1),) * k + t.strides, t.dtype, t.virtual, t.by_value)


def _check_kinds(graph) -> None:
    for op in graph.ops:
        if op.kind in DECLINED_KINDS:
            raise Decline(DECLINED_KINDS[op.kind])
        if op.kind not in MAIN_KINDS and op.kind != "Pointwise":
            raise Decline(f"no cuDNN backend translation for operation kind {op.kind}")
    mains = [i for i, op in enumerate(graph.ops) if op.kind in MAIN_KINDS]
    if not mains:
        raise Decline("pointwise-only graphs: cuDNN 9's runtime-fusion engines need a convolution or matmul "
                      "to fuse into (no pure pointwise fusion on support surface 90); the cupy engine runs these")
    if len(mains) > 1:
        raise Decline("more than one convolution/matmul in one graph: no cuDNN 9 fusion pattern covers it")
    if mains[0] != 0:
        raise Decline("pointwise ops before the convolution/matmul (mainloop 'g1' fusion) are not translated")


def candidates(graph) -> list:
    """Backend specs for ``graph`` (finalized IR), best first, or raise Decline.  A conv +
    blend graph is first the conv_blend pattern, then the same as a fusion graph; a fusion
    graph with scaled operands is first tried with pointwise ALPHA1/ALPHA2 attributes (the
    ConvBiasAct pattern of 000), then with MUL by by-value tensors (generic runtime fusion)."""
    _check_kinds(graph)
    main = graph.ops[0]
    for t in graph.tensors().values():
        if t.dtype not in ("float32", "float16", "bfloat16", "float64") and not t.is_by_value:
            raise Decline(f"tensor {t.uid} has data type {t.dtype}; this engine translates float data only")
    out = []
    if main.kind in CONV_KINDS:
        native = _conv_blend(graph)
        if native is not None:
            out.append(native)
    try:
        attr = _fusion(graph, "attr")
        out.append(attr)
        if attr.baked:
            out.append(_fusion(graph, "mul"))
    except Decline:
        if not out:
            raise
    limit = getattr(graph, "workspace_limit", None)  # planned for a call given this many bytes (_core/call.py)
    for native in out:
        native.workspace_limit = limit
    return out


def translate(graph) -> Native:
    """The first candidate spec for ``graph``, or raise Decline."""
    return candidates(graph)[0]


def _conv_attrs(op) -> dict:
    a = op.attrs
    x_like = {"ConvolutionForward": "x", "ConvolutionBackwardData": "dx", "ConvolutionBackwardFilter": "x"}[op.kind]
    t = op.inputs.get(x_like) or op.outputs.get(x_like)
    nsp = t.ndim - 2
    return {
        "mode": a.get("mode", "CROSS_CORRELATION"),
        "pre_padding": tuple(int(v) for v in a["pre_padding"]),
        "post_padding": tuple(int(v) for v in a["post_padding"]),
        "stride": tuple(int(v) for v in a["stride"]),
        "dilation": tuple(int(v) for v in (a.get("dilation") or (1,) * nsp)),
        "compute_type": a.get("compute_type", "float32"),
    }


def _conv_op(op, out_uid: int, alpha_ref=None, beta_ref=None) -> NOp:
    """The backend conv op; ``alpha_ref``/``beta_ref`` index the spec's baked scalars (None: 1 and 0)."""
    desc, roles, out_role, prefix = CONV_KINDS[op.kind]
    tensors = {}
    for role, suffix in roles.items():
        t = op.inputs.get(role)
        tensors[prefix + suffix] = t.uid if t is not None else out_uid
    attrs = _conv_attrs(op)
    attrs.update(alpha_ref=alpha_ref, beta_ref=beta_ref)
    return NOp("conv", desc, tensors, attrs)


def _data_dtype(op) -> str:
    for t in list(op.inputs.values()) + list(op.outputs.values()):
        if not t.is_virtual and not t.is_by_value:
            return t.dtype
    return "float32"


def _conv_blend(graph) -> "Native | None":
    """The conv + legacy-blend pattern, or None when the graph is something else."""
    main = graph.ops[0]
    out_role = CONV_KINDS[main.kind][2]
    out = main.outputs[out_role]
    tensors = {t.uid: _spec(t) for t in main.inputs.values()}
    common = dict(main_kind=main.kind, math_type=main.attrs.get("math_type"),  # None: no TF32 (math_policy)
                  zero_workspace=bool(main.attrs.get("zero_workspace")),
                  compute_type=main.attrs.get("compute_type", "float32"), algo=main.attrs.get("algo"),
                  data_dtype=_data_dtype(main))
    if len(graph.ops) == 1:
        if out.is_virtual:
            return None
        tensors[out.uid] = _spec(out)
        bind = [(u, u, False) for u in tensors]
        return Native("conv_blend", tensors=tensors, ops=[_conv_op(main, out.uid, 0, 1)], bind=bind,
                      baked=[(None, 1.0), (None, 0.0)], **common)
    if len(graph.ops) != 2:
        return None
    pw = graph.ops[1]
    mode = pw.attrs.get("mode")
    if pw.kind != "Pointwise" or mode not in ("IDENTITY", "ADD") or pw.inputs["x"].uid != out.uid:
        return None
    if not out.is_virtual or any(k.startswith("relu") for k in pw.attrs):
        return None
    y = pw.outputs["y"]
    if y.dims != out.dims:
        return None
    same = []
    beta_default = 0.0
    if mode == "ADD":
        prior = pw.inputs["b"]
        if prior.is_virtual or prior.dims != y.dims or prior.strides != y.strides or prior.dtype != y.dtype:
            return None
        same.append((prior.uid, y.uid))
        beta_default = 1.0
    alpha, beta = pw.inputs.get("alpha1"), pw.inputs.get("alpha2") if mode == "ADD" else None
    tensors[y.uid] = _spec(y)
    bind = [(u, u, False) for u in tensors]
    baked = [(alpha.uid if alpha is not None else None, 1.0), (beta.uid if beta is not None else None, beta_default)]
    return Native("conv_blend", tensors=tensors, ops=[_conv_op(main, y.uid, 0, 1)], bind=bind, same_memory=same,
                  baked=baked, **common)


def _like(dims, ref_strides) -> tuple:
    """Packed strides for ``dims`` in the memory order of ``ref_strides`` (NHWC stays NHWC)."""
    order = sorted(range(len(dims)), key=lambda i: (-ref_strides[i], i))
    st, acc = [0] * len(dims), 1
    for ax in reversed(order):
        st[ax] = acc
        acc *= dims[ax]
    return tuple(st)


def _fusion(graph, scale_mode: str = "attr") -> Native:
    """Main op + pointwise epilogue as one runtime-fusion graph."""
    main = graph.ops[0]
    all_t = graph.tensors()
    if any(t.dtype == "float64" for t in all_t.values() if not t.is_by_value):
        raise Decline("double-precision data in a fused graph: cuDNN 9's runtime fusion computes in FP32 only "
                      "(a single double convolution is translated)")
    rank = max(3, max(t.ndim for t in all_t.values() if not t.is_by_value))
    tensors: dict = {}
    bind: list = []
    baked: list = []
    scratch = [_SCRATCH_UID]
    outs = [t for t in graph.external_outputs() if t.ndim == max(x.ndim for x in all_t.values())]
    layout = _rank_up(_spec(outs[-1]), rank).strides if outs else None

    alias: dict = {}  # uid of a collapsed virtual IDENTITY output -> the uid it equals

    def add_tensor(t) -> int:
        if t.uid in alias:
            return alias[t.uid]
        if t.uid not in tensors:
            if t.is_by_value:
                tensors[t.uid] = TSpec(t.uid, (1,) * rank, (1,) * rank, "float32", False, True)
                bind.append((t.uid, t.uid, True))
            else:
                spec = _rank_up(_spec(t), rank)
                if t.is_virtual and layout is not None and len(spec.dims) == len(layout):
                    spec.strides = _like(spec.dims, layout)
                tensors[t.uid] = spec
                if not t.is_virtual:
                    bind.append((t.uid, t.uid, False))
        return t.uid

    def new_virtual(like: TSpec) -> int:
        scratch[0] += 1
        tensors[scratch[0]] = TSpec(scratch[0], like.dims, _like(like.dims, layout or like.strides), "float32",
                                    True, False)
        return scratch[0]

    def bake(alpha) -> "int | None":
        """Index of a by-value scalar in ``baked`` (attr mode)."""
        if alpha is None:
            return None
        for i, (u, _) in enumerate(baked):
            if u == alpha.uid:
                return i
        baked.append((alpha.uid, 1.0))
        return len(baked) - 1

    ops: list = []
    if main.kind == "Matmul":
        for t in list(main.inputs.values()) + list(main.outputs.values()):
            add_tensor(t)
        ops.append(NOp("matmul", "OPERATION_MATMUL", {"OPERATION_MATMUL_ADESC": main.inputs["a"].uid,
                                                      "OPERATION_MATMUL_BDESC": main.inputs["b"].uid,
                                                      "OPERATION_MATMUL_CDESC": main.outputs["c"].uid},
                       {"compute_type": "float32"}))
    else:
        for t in list(main.inputs.values()) + list(main.outputs.values()):
            add_tensor(t)
        out = main.outputs[CONV_KINDS[main.kind][2]]
        ops.append(_conv_op(main, out.uid))

    def scaled(t, alpha) -> int:
        """uid of alpha * t (a MUL by the by-value scalar), or t itself."""
        uid = add_tensor(t)
        if alpha is None:
            return uid
        s = add_tensor(alpha)
        v = new_virtual(tensors[uid])
        ops.append(NOp("pointwise", "OPERATION_POINTWISE", {"OPERATION_POINTWISE_XDESC": uid,
                                                            "OPERATION_POINTWISE_BDESC": s,
                                                            "OPERATION_POINTWISE_YDESC": v}, {"mode": "MUL"}))
        return v

    readers: dict = {}  # uid -> [(op, role)]
    for op in graph.ops:
        for role, t in op.inputs.items():
            readers.setdefault(t.uid, []).append((op, role))
    carried: dict = {}  # uid of a folded IDENTITY output -> its alpha1 scalar (attr mode)

    def foldable(op, y) -> bool:
        """IDENTITY(alpha1 * x) read only as the unscaled x of one ADD/SUB: fold alpha1 into it."""
        r = readers.get(y.uid, [])
        return (len(r) == 1 and r[0][1] == "x" and r[0][0].kind == "Pointwise"
                and r[0][0].attrs.get("mode") in ("ADD", "SUB") and "alpha1" not in r[0][0].inputs)

    for op in graph.ops[1:]:
        mode = op.attrs.get("mode")
        if mode not in PW_MODE:
            raise Decline(f"pointwise mode {mode} has no cuDNN backend equivalent")
        y = op.outputs["y"]
        if mode == "IDENTITY" and y.is_virtual and "b" not in op.inputs:
            if scale_mode == "mul" or "alpha1" not in op.inputs:
                alias[y.uid] = scaled(op.inputs["x"], op.inputs.get("alpha1"))  # no op needed
                continue
            if foldable(op, y):
                alias[y.uid] = add_tensor(op.inputs["x"])
                carried[y.uid] = op.inputs["alpha1"]
                continue
        add_tensor(y)
        attrs = {"mode": PW_MODE[mode], "nan_propagation": op.attrs.get("nan_propagation", "PROPAGATE")}
        for k in ("relu_lower_clip", "relu_upper_clip", "elu_alpha", "softplus_beta", "swish_beta"):
            if k in op.attrs:
                attrs[k] = float(op.attrs[k])
        if mode in PW_BACKWARD:
            if "alpha1" in op.inputs or "alpha2" in op.inputs:
                raise Decline(f"scaled operands of backward activation {mode} are not translated")
            ops.append(NOp("pointwise", "OPERATION_POINTWISE", {
                "OPERATION_POINTWISE_DYDESC": add_tensor(op.inputs["x"]),
                "OPERATION_POINTWISE_XDESC": add_tensor(op.inputs["b"]),
                "OPERATION_POINTWISE_DXDESC": y.uid}, attrs))
            continue
        x, b = op.inputs["x"], op.inputs.get("b")
        a1, a2 = op.inputs.get("alpha1", carried.get(x.uid)), op.inputs.get("alpha2")
        if b is not None and x.dims != y.dims and b.dims == y.dims:
            if mode not in PW_COMMUTATIVE:
                raise Decline(f"pointwise {mode} with a broadcast first operand: cuDNN needs the full-size "
                              "tensor first and the op is not commutative")
            x, b, a1, a2 = b, x, a2, a1
        if x.dims != y.dims:
            raise Decline(f"pointwise {mode} whose first operand {x.dims} is broadcast to {y.dims}: "
                          "broadcast tensors cannot be the first pointwise input in cuDNN runtime fusion")
        if scale_mode == "attr":
            t = {"OPERATION_POINTWISE_XDESC": add_tensor(x), "OPERATION_POINTWISE_YDESC": y.uid}
            attrs["alpha1_ref"] = bake(a1)
            if b is not None:
                t["OPERATION_POINTWISE_BDESC"] = add_tensor(b)
                attrs["alpha2_ref"] = bake(a2)
        else:
            t = {"OPERATION_POINTWISE_XDESC": scaled(x, a1), "OPERATION_POINTWISE_YDESC": y.uid}
            if b is not None:
                t["OPERATION_POINTWISE_BDESC"] = scaled(b, a2)
        ops.append(NOp("pointwise", "OPERATION_POINTWISE", t, attrs))
    return Native("fusion", main_kind=main.kind, tensors=tensors, ops=ops, bind=bind, baked=baked,
                  scale_mode=scale_mode if baked or scale_mode == "mul" else "",
                  math_type=main.attrs.get("math_type"), zero_workspace=bool(main.attrs.get("zero_workspace")),
                  compute_type=main.attrs.get("compute_type", "float32"), algo=main.attrs.get("algo"),
                  data_dtype=_data_dtype(main))


# --------------------------------------------------------------------------- native descriptors


def tensor_descriptor(lib, d, t: TSpec):
    """Backend TENSOR descriptor ``d`` (created by the caller, who owns it) set to ``t``, finalized."""
    d.set("TENSOR_DATA_TYPE", "DATA_TYPE", lib.DATA_TYPE[t.dtype])
    d.set("TENSOR_DIMENSIONS", "INT64", list(t.dims))
    d.set("TENSOR_STRIDES", "INT64", list(t.strides))
    d.set("TENSOR_UNIQUE_ID", "INT64", t.uid)
    d.set("TENSOR_BYTE_ALIGNMENT", "INT64", ALIGNMENT)
    if t.virtual:
        d.set("TENSOR_IS_VIRTUAL", "BOOLEAN", True)
    if t.by_value:
        d.set("TENSOR_IS_BY_VALUE", "BOOLEAN", True)
    return d.finalize()


class NativeGraph:
    """The finalized backend tensors, operations and operation graph of a ``Native`` spec.
    ``alpha``/``beta`` are baked into the convolution of a conv_blend spec."""

    def __init__(self, spec: Native, handle: int, values: "tuple | None" = None):
        from . import lib
        self.descs = []
        self.spec = spec
        values = spec.representative() if values is None else tuple(values)
        try:
            tds = {uid: self._tensor(lib, t) for uid, t in spec.tensors.items()}
            ops = [self._op(lib, o, tds, spec, values) for o in spec.ops]
            g = self._new(lib, "OPERATIONGRAPH")
            g.set("OPERATIONGRAPH_HANDLE", "HANDLE", handle)
            g.set("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", ops)
            g.finalize()
            self.graph = g
        except Exception:
            self.destroy()
            raise

    def _new(self, lib, kind):
        d = lib.Descriptor(kind)
        self.descs.append(d)
        return d

    def _tensor(self, lib, t: TSpec):
        return tensor_descriptor(lib, self._new(lib, "TENSOR"), t)

    def _op(self, lib, o: NOp, tds, spec, values):
        def val(ref, default):
            return default if ref is None else float(values[ref])

        if o.kind == "conv":
            a = o.attrs
            c = self._new(lib, "CONVOLUTION")
            c.set("CONVOLUTION_COMP_TYPE", "DATA_TYPE", lib.DATA_TYPE[a["compute_type"]])
            c.set("CONVOLUTION_CONV_MODE", "CONVOLUTION_MODE", lib.CONVOLUTION_MODE[a["mode"]])
            c.set("CONVOLUTION_SPATIAL_DIMS", "INT64", len(a["stride"]))
            c.set("CONVOLUTION_PRE_PADDINGS", "INT64", list(a["pre_padding"]))
            c.set("CONVOLUTION_POST_PADDINGS", "INT64", list(a["post_padding"]))
            c.set("CONVOLUTION_DILATIONS", "INT64", list(a["dilation"]))
            c.set("CONVOLUTION_FILTER_STRIDES", "INT64", list(a["stride"]))
            c.finalize()
            op = self._new(lib, o.desc)
            prefix = [p for k, (_, _, _, p) in CONV_KINDS.items() if CONV_KINDS[k][0] == o.desc][0]
            for name, uid in o.tensors.items():
                op.set(name, "BACKEND_DESCRIPTOR", tds[uid])
            op.set(prefix + "CONV_DESC", "BACKEND_DESCRIPTOR", c)
            scalar_t = "DOUBLE" if spec.data_dtype == "float64" else "FLOAT"
            op.set(prefix + "ALPHA", scalar_t, val(a.get("alpha_ref"), 1.0))
            op.set(prefix + "BETA", scalar_t, val(a.get("beta_ref"), 0.0))
            return op.finalize()
        if o.kind == "matmul":
            m = self._new(lib, "MATMUL")
            m.set("MATMUL_COMP_TYPE", "DATA_TYPE", lib.DATA_TYPE[o.attrs["compute_type"]])
            m.finalize()
            op = self._new(lib, o.desc)
            for name, uid in o.tensors.items():
                op.set(name, "BACKEND_DESCRIPTOR", tds[uid])
            op.set("OPERATION_MATMUL_DESC", "BACKEND_DESCRIPTOR", m)
            return op.finalize()
        a = o.attrs
        p = self._new(lib, "POINTWISE")
        p.set("POINTWISE_MODE", "POINTWISE_MODE", lib.POINTWISE_MODE[a["mode"]])
        p.set("POINTWISE_MATH_PREC", "DATA_TYPE", lib.DATA_TYPE["float32"])
        if a["mode"] in ("RELU_FWD", "RELU_BWD"):
            p.set("POINTWISE_NAN_PROPAGATION", "NAN_PROPOGATION", lib.NAN_PROPAGATION.get(a["nan_propagation"], 1))
            p.set("POINTWISE_RELU_LOWER_CLIP", "DOUBLE", a.get("relu_lower_clip", 0.0))
            p.set("POINTWISE_RELU_UPPER_CLIP", "DOUBLE", min(a.get("relu_upper_clip", FLOAT_MAX), FLOAT_MAX))
            p.set("POINTWISE_RELU_LOWER_CLIP_SLOPE", "DOUBLE", 0.0)
        elif a["mode"] in ("ELU_FWD", "ELU_BWD"):
            p.set("POINTWISE_ELU_ALPHA", "DOUBLE", a.get("elu_alpha", 1.0))
        elif a["mode"] in ("SOFTPLUS_FWD",):
            p.set("POINTWISE_SOFTPLUS_BETA", "DOUBLE", a.get("softplus_beta", 1.0))
        elif a["mode"] in ("SWISH_FWD", "SWISH_BWD"):
            p.set("POINTWISE_SWISH_BETA", "DOUBLE", a.get("swish_beta", 1.0))
        p.finalize()
        op = self._new(lib, o.desc)
        op.set("OPERATION_POINTWISE_PW_DESCRIPTOR", "BACKEND_DESCRIPTOR", p)
        for name, uid in o.tensors.items():
            op.set(name, "BACKEND_DESCRIPTOR", tds[uid])
        if a.get("alpha1_ref") is not None:
            op.set("OPERATION_POINTWISE_ALPHA1", "FLOAT", val(a["alpha1_ref"], 1.0))
        if a.get("alpha2_ref") is not None:
            op.set("OPERATION_POINTWISE_ALPHA2", "FLOAT", val(a["alpha2_ref"], 1.0))
        return op.finalize()

    def destroy(self) -> None:
        for d in reversed(self.descs):
            d.destroy()
        self.descs = []
