"""The cuDNN backend API over the graph layer (002 §5.2.1-§5.2.7 cudnnBackendCreateDescriptor,
DestroyDescriptor, Execute, Finalize, GetAttribute, Initialize, SetAttribute; 002 ch. 9
"cuDNN Backend API"; 000 "Graph API"), so graph-API code written against cuDNN runs on our
engines, the CPU reference included.

One table-driven implementation: ``graph_api.attributes.DESCRIPTORS`` says, per descriptor type,
which attributes exist, their types, element counts and whether they are required;
``SetAttribute`` and ``GetAttribute`` apply it generically; ``FINALIZE[type]`` turns a
descriptor into our objects: tensors into ``_backend.ir.Tensor``, operation descriptors into
IR ``Operation``s (conv forward/backward data/backward filter with the alpha/beta blend of
002, pointwise, matmul, reduction, gen-stats; those live in graph_api/operations.py), here the
operation graph into an ``OperationGraph``, ENGINEHEUR into ``_backend.heuristics.get_engine_configs`` results, an
ENGINECFG into an ``EngineConfig``, an EXECUTION_PLAN into an engine's ``ExecutionPlan``,
and ``cudnnBackendExecute`` binds the VARIANT_PACK and runs ``_backend.planner.execute``.

Statuses (002 §5.2, inventory §2.18): SetAttribute NOT_INITIALIZED on a finalized descriptor,
BAD_PARAM for a wrong attribute name, type, element count or value, NOT_SUPPORTED for a
placeholder attribute; GetAttribute BAD_PARAM for a wrong name/type, NOT_INITIALIZED before
finalize; Finalize BAD_PARAM for missing, invalid or inconsistent attributes, NOT_SUPPORTED
for what the graph layer cannot do.  Every Finalize error names the attribute and the check
that failed (``CuDNNError.argument`` / ``.check``), seed 004's complaint.
docs/backend_api.md documents the Python mapping and every deviation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cudnn_compat._backend import planner
from cudnn_compat._backend.engines.base import EngineDeclined
from cudnn_compat._backend.heuristics import get_engine_configs
from cudnn_compat._backend.ir import GraphError, OperationGraph
from . import attributes as A
from . import operations as O
from .operations import INTERNAL_UID_BASE, Lowering, fail
from .._core.data import bind, device_pointer, scalar as host_scalar, workspace_arg
from .._core.descriptor import Descriptor, resolve
from .._core.registry import legacy
from ..enums import ENUMS, name_of
from ..errors import CUDNN_STATUS_BAD_PARAM as BAD, CUDNN_STATUS_NOT_INITIALIZED, CUDNN_STATUS_NOT_SUPPORTED as NOT_SUP
from ..errors import CuDNNError
from ..handle import Handle, on_device, wrong_device

globals().update(A.ATTRIBUTE_NAMES)
globals().update(A.EXTRA_CONSTANTS)

# -- the descriptor object -------------------------------------------------------------------

class BackendDescriptor(Descriptor):
    """cudnnBackendDescriptor_t: a type, the attributes set so far, and after Finalize the
    object it stands for (``obj``)."""

    kind = "cudnnBackendDescriptor_t"

    def __init__(self, descriptor_type: int):
        super().__init__()
        self.reset(descriptor_type)
        self.touched()

    destroyed = False

    def destroy(self):
        super().destroy()
        self.destroyed = True

    def reset(self, descriptor_type: int) -> None:
        self.type = int(descriptor_type)
        self.type_name = A.DESC_NAME[self.type]
        self.values: dict = {}  # Attr.name -> list of values
        self.finalized = False
        self.obj = None

    def __repr__(self):
        state = "finalized" if getattr(self, "finalized", False) else "not finalized"
        return f"<cudnnBackendDescriptor_t CUDNN_BACKEND_{getattr(self, 'type_name', '?')}_DESCRIPTOR {int(self):#x} {state}>"

    # accessors used by the finalize functions
    def get(self, name: str, default=None):
        vals = self.values.get(name)
        return default if vals is None else vals

    def one(self, name: str, default=None):
        vals = self.values.get(name)
        return default if not vals else vals[0]

    def has(self, name: str) -> bool:
        return name in self.values

    def sub(self, name: str):
        """The finalized object of the descriptor stored in attribute ``name``."""
        d = self.one(name)
        return _finalized_obj(d, "CUDNN_ATTR_" + name)


def _finalized_obj(d, attr: str, what: str = ""):
    if d.destroyed:
        raise fail(BAD, attr, "DESCRIPTOR_DESTROYED", f"{what or 'the descriptor'} {int(d):#x} was destroyed")
    if not d.finalized:
        raise fail(BAD, attr, "DESCRIPTOR_NOT_FINALIZED",
                   f"{what or 'the'} CUDNN_BACKEND_{d.type_name}_DESCRIPTOR {int(d):#x} is not finalized")
    return d.obj


def _desc(arg, argname: str = "descriptor") -> BackendDescriptor:
    return resolve(arg, BackendDescriptor, argname, need_set=False)


def _attr(d: BackendDescriptor, attributeName) -> A.Attr:
    try:
        value = int(attributeName)
    except (TypeError, ValueError):
        raise fail(BAD, "attributeName", "ATTRIBUTE_NAME", f"{attributeName!r} is not a cudnnBackendAttributeName_t")
    spec = A.DESCRIPTORS[d.type_name].get(value)
    if spec is None:
        owner = A.OWNER.get(value)
        where = f"it belongs to CUDNN_BACKEND_{owner}_DESCRIPTOR" if owner else "no descriptor type has it"
        raise fail(BAD, "attributeName", "ATTRIBUTE_NAME",
                   f"{A.ATTR_NAME_OF.get(value, value)} is not an attribute of CUDNN_BACKEND_{d.type_name}_DESCRIPTOR ({where})")
    return spec


def _check_type(spec: A.Attr, attributeType) -> str:
    tname = A.TYPE_NAME.get(attributeType) if isinstance(attributeType, int) else None
    if tname not in spec.types:
        got = f"CUDNN_TYPE_{tname}" if tname else repr(attributeType)
        want = " or ".join("CUDNN_TYPE_" + t for t in spec.types)
        raise fail(BAD, spec.full, "ATTRIBUTE_TYPE", f"attributeType is {got}; this attribute takes {want}")
    return tname


# -- entry points ------------------------------------------------------------------------------

@legacy("cudnnBackendCreateDescriptor")
def backendCreateDescriptor(descriptorType) -> BackendDescriptor:
    """002 §5.2.1: a new descriptor of ``descriptorType`` (the C out-parameter is returned).
    NOT_SUPPORTED for a value that is not a cudnnBackendDescriptorType_t."""
    if isinstance(descriptorType, bool) or not isinstance(descriptorType, int) or int(descriptorType) not in A.DESC_NAME:
        raise fail(NOT_SUP, "descriptorType", "DESCRIPTOR_TYPE",
                   f"{descriptorType!r} is not a cudnnBackendDescriptorType_t this version can create (0..{max(A.DESC_NAME)})")
    return BackendDescriptor(int(descriptorType))


@legacy("cudnnBackendDestroyDescriptor")
def backendDestroyDescriptor(descriptor) -> None:
    """002 §5.2.2.  Descriptors that used this one keep what they took from it at their Finalize."""
    d = _desc(descriptor)
    d.values.clear()
    d.obj = None
    d.destroy()


@legacy("cudnnBackendInitialize")
def backendInitialize(descriptor, descriptorType=None, sizeInBytes=None) -> None:
    """002 §5.2.6 (3 arguments) or the 8.2 header's 1-argument form: the descriptor is reset to
    ``descriptorType`` (its own type when omitted) with no attributes and finalized = false.
    Our descriptors need no caller memory, so any ``sizeInBytes`` >= 0 is enough."""
    d = _desc(descriptor)
    if descriptorType is None:
        descriptorType = d.type
    if isinstance(descriptorType, bool) or not isinstance(descriptorType, int) or int(descriptorType) not in A.DESC_NAME:
        raise fail(BAD, "descriptorType", "DESCRIPTOR_TYPE", f"{descriptorType!r} is not a cudnnBackendDescriptorType_t")
    if sizeInBytes is not None and (not isinstance(sizeInBytes, int) or sizeInBytes < 0):
        raise fail(BAD, "sizeInBytes", "DESCRIPTOR_SIZE", f"must be an int >= 0, got {sizeInBytes!r}")
    d.reset(int(descriptorType))


@legacy("cudnnBackendSetAttribute")
def backendSetAttribute(descriptor, attributeName, attributeType, elementCount, arrayOfElements) -> None:
    """002 §5.2.7.  ``arrayOfElements``: a sequence, or a single value (a descriptor object for
    CUDNN_TYPE_BACKEND_DESCRIPTOR, a handle for CUDNN_TYPE_HANDLE, a data pointer / array for
    CUDNN_TYPE_VOID_PTR); the first ``elementCount`` elements are read."""
    d = _desc(descriptor)
    if d.finalized:
        raise CuDNNError(CUDNN_STATUS_NOT_INITIALIZED, "descriptor",
                         f"CUDNN_BACKEND_{d.type_name}_DESCRIPTOR {int(d):#x} is already finalized; attributes cannot change")
    spec = _attr(d, attributeName)
    if spec.need == "G":
        raise fail(BAD, spec.full, "ATTRIBUTE_READ_ONLY", "is a read-only attribute (get only)")
    tname = _check_type(spec, attributeType)
    if isinstance(elementCount, bool) or not isinstance(elementCount, int) or elementCount < 0:
        raise fail(BAD, spec.full, "ELEMENT_COUNT", f"elementCount must be an int >= 0, got {elementCount!r}")
    lo, hi = spec.count
    if elementCount < lo or (hi is not None and elementCount > hi):
        rng = f"exactly {lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'n'}"
        raise fail(BAD, spec.full, "ELEMENT_COUNT", f"takes {rng} element(s), elementCount is {elementCount}")
    try:
        raw = A.elements(arrayOfElements, elementCount, tname)
        parse = spec.parse or tname
        if parse == "HANDLE":
            values = [_handle_element(v, i) for i, v in enumerate(raw)]
        elif parse == "BACKEND_DESCRIPTOR":
            values = [_descriptor_element(v, i, spec) for i, v in enumerate(raw)]
        else:
            values = [A.parse_value(v, i, parse) for i, v in enumerate(raw)]
    except A.BadValue as e:
        raise fail(BAD, spec.full, "ATTRIBUTE_VALUE", e.rule) from None
    if spec.need == "P" and values:
        raise fail(NOT_SUP, spec.full, "ATTRIBUTE_UNSUPPORTED",
                   "is a placeholder that this version does not support setting (002 ch. 9)")
    d.values[spec.name] = values


def _handle_element(v, i):
    if isinstance(v, Handle):
        return v
    try:
        return resolve(v, Handle, f"element {i}")
    except CuDNNError as e:
        raise A.BadValue(i, f"element {i} is not a live cudnnHandle_t ({e.rule})") from None


def _descriptor_element(v, i, spec):
    try:
        d = _desc(v, f"element {i}")
    except CuDNNError as e:
        raise A.BadValue(i, f"element {i} is not a live backend descriptor ({e.rule})") from None
    if d.type_name not in spec.kinds:
        want = " or ".join(f"CUDNN_BACKEND_{k}_DESCRIPTOR" for k in spec.kinds)
        raise A.BadValue(i, f"element {i} is a CUDNN_BACKEND_{d.type_name}_DESCRIPTOR; this attribute takes {want}")
    return d


@legacy("cudnnBackendGetAttribute")
def backendGetAttribute(descriptor, attributeName, attributeType, requestedElementCount, arrayOfElements=None) -> tuple:
    """002 §5.2.5: ``(elementCount, values)``: the attribute's element count and its first
    ``requestedElementCount`` values.  For CUDNN_TYPE_BACKEND_DESCRIPTOR results (ENGINEHEUR
    RESULTS, ENGINE KNOB_INFO, ...) pass the caller's descriptors in ``arrayOfElements`` to
    have them filled, as in C; without it new descriptors are returned."""
    d = _desc(descriptor)
    spec = _attr(d, attributeName)
    tname = _check_type(spec, attributeType)
    if isinstance(requestedElementCount, bool) or not isinstance(requestedElementCount, int) or requestedElementCount < 0:
        raise fail(BAD, spec.full, "ELEMENT_COUNT", f"requestedElementCount must be an int >= 0, got {requestedElementCount!r}")
    if not d.finalized:
        raise CuDNNError(CUDNN_STATUS_NOT_INITIALIZED, "descriptor",
                         f"CUDNN_BACKEND_{d.type_name}_DESCRIPTOR {int(d):#x} is not finalized; "
                         "attributes are readable after cudnnBackendFinalize")
    getter = GETTERS.get(spec.name)
    if getter is not None:
        values = getter(d, requestedElementCount, arrayOfElements)
    else:
        values = list(d.values.get(spec.name, spec.default))
    if tname in ("FLOAT", "DOUBLE"):
        values = [float(v) for v in values]
    return len(values), values[:requestedElementCount]


@legacy("cudnnBackendFinalize")
def backendFinalize(descriptor) -> None:
    """002 §5.2.4 and each type's "Finalization" in ch. 9."""
    d = _desc(descriptor)
    if d.finalized:
        return
    if d.type_name in A.READ_ONLY_TYPES:
        raise fail(NOT_SUP, "descriptor", "DESCRIPTOR_READ_ONLY",
                   f"CUDNN_BACKEND_{d.type_name}_DESCRIPTOR is read-only: it is obtained finalized from GetAttribute, "
                   "never finalized by the user")
    for spec in A.DESCRIPTORS[d.type_name].values():
        if spec.need == "R" and spec.name not in d.values:
            raise fail(BAD, spec.full, "ATTRIBUTE_REQUIRED", f"is required by CUDNN_BACKEND_{d.type_name}_DESCRIPTOR and was not set")
    d.obj = FINALIZE[d.type_name](d)
    d.finalized = True


@legacy("cudnnBackendExecute")
def backendExecute(handle, executionPlan, variantPack) -> None:
    """002 §5.2.3: run the finalized plan on the variant pack's data pointers and workspace."""
    h = resolve(handle, Handle, "handle")
    if wrong_device(h):  # issue 17: the plan runs on the handle's device, the caller's is restored
        return on_device(h, _execute, h, executionPlan, variantPack)
    return _execute(h, executionPlan, variantPack)


def _execute(h, executionPlan, variantPack) -> None:
    plan_d, pack_d = _desc(executionPlan, "executionPlan"), _desc(variantPack, "variantPack")
    for d, arg, tname in ((plan_d, "executionPlan", "EXECUTION_PLAN"), (pack_d, "variantPack", "VARIANT_PACK")):
        if d.type_name != tname:
            raise fail(BAD, arg, "DESCRIPTOR_TYPE", f"is a CUDNN_BACKEND_{d.type_name}_DESCRIPTOR, not CUDNN_BACKEND_{tname}_DESCRIPTOR")
        if not d.finalized:
            raise fail(BAD, arg, "DESCRIPTOR_NOT_FINALIZED", f"CUDNN_BACKEND_{tname}_DESCRIPTOR {int(d):#x} is not finalized")
    plan, pack = plan_d.obj, pack_d.obj
    if h.place != plan.place:
        raise fail(BAD, "handle", "HANDLE_PLACE", f"the plan was built for the {plan.place} place, the handle is on the {h.place} place")
    g = plan.graph
    ptrs = dict(zip(pack.uids, pack.pointers))
    if plan.plan.workspace_size > 0 and (pack.workspace is None or (isinstance(pack.workspace, int) and pack.workspace == 0)):
        raise fail(BAD, "CUDNN_ATTR_VARIANT_PACK_WORKSPACE", "VARIANT_PACK_WORKSPACE",
                   f"is NULL but the plan needs {plan.plan.workspace_size} bytes of workspace")
    put = device_pointer if (h.place == "gpu" and getattr(plan.plan, "raw_pointers", False)) else None
    data = {}
    for uid, t in g.externals.items():
        if uid in g.scalars:
            data[uid] = g.scalars[uid]
            continue
        user_uid = g.aliases.get(uid, uid)
        if user_uid not in ptrs:
            raise fail(BAD, "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS", "VARIANT_PACK_UID",
                       f"has no data pointer for tensor uid {user_uid}, a non-virtual tensor of the operation graph")
        ptr, argname = ptrs[user_uid], f"CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS (uid {user_uid})"
        if t.is_by_value:
            data[uid] = host_scalar(ptr, argname, t.dtype == "float64")
        else:
            data[uid] = put(ptr, t, argname) if put else bind(h, ptr, t, argname)
    # the workspace is a buffer like any other: the forms and errors of every data argument
    workspace = workspace_arg(h.place, pack.workspace, "CUDNN_ATTR_VARIANT_PACK_WORKSPACE")
    plan.plan = planner.execute(plan.plan, data, workspace, plan.plan.workspace_size, h.stream)


# -- finalize: operation graph, engines, plans -----------------------------------------------------

@dataclass
class GraphObj:
    """A finalized operation graph: the IR graph, its handle and place, the uids added by the
    lowering, and the engine list that ENGINE_GLOBAL_INDEX counts (built on first use)."""

    handle: Handle
    ir: OperationGraph
    externals: dict  # uid -> IR tensor the variant pack must bind (or a scalar uid)
    scalars: dict
    aliases: dict
    _engines: list = None
    unusable: list = field(default_factory=list)

    @property
    def place(self) -> str:
        return self.handle.place

    def engines(self) -> list:
        """[(engine, config)]: every config heuristics mode B knows for this graph, in order;
        configs other modes return are appended when first seen."""
        if self._engines is None:
            cfgs, self.unusable = get_engine_configs(self.ir, self.place, "B")
            self._engines = list(cfgs)
        return self._engines

    def index_of(self, eng, cfg) -> int:
        lst = self.engines()
        for i, (e, c) in enumerate(lst):
            if e.name == eng.name and c == cfg:
                return i
        lst.append((eng, cfg))
        return len(lst) - 1


def _fin_graph(d):
    """002 §9.2.15 and 000 "Finalizing the operation graph": BAD_PARAM for an op that is not
    finalized, an invalid handle, a uid naming two different tensors or written twice;
    NOT_SUPPORTED for in-place ops in a multi-op graph or a cycle.  The op order of OPS does not
    matter (000): ops are sorted by dataflow.  Then the IR graph's own checks run."""
    attr = "CUDNN_ATTR_OPERATIONGRAPH_OPS"
    try:
        handle = resolve(d.one("OPERATIONGRAPH_HANDLE"), Handle, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE")
    except CuDNNError as e:
        raise fail(BAD, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE", "GRAPH_HANDLE", e.rule) from None
    nodes = [_finalized_obj(op, attr, f"OPS[{i}]") for i, op in enumerate(d.get("OPERATIONGRAPH_OPS"))]
    seen, producer = {}, {}
    for i, n in enumerate(nodes):
        for a, t in n.tensors.items():
            prev = seen.setdefault(t.uid, (i, a, t))
            if prev[2].key != t.key:
                raise fail(BAD, attr, "TENSOR_UNIQUE_ID",
                           f"uid {t.uid} names different tensors in OPS[{prev[0]}] ({prev[1]}, dims {prev[2].dims}) "
                           f"and OPS[{i}] ({a}, dims {t.dims})")
        for uid in n.uids(n.writes):
            if uid in producer:
                raise fail(BAD, attr, "TENSOR_SINGLE_PRODUCER", f"tensor uid {uid} is written by OPS[{producer[uid]}] and OPS[{i}]")
            producer[uid] = i
    inplace = [i for i, n in enumerate(nodes) if n.uids(n.reads) & n.uids(n.writes)]
    if inplace and len(nodes) > 1:
        raise fail(NOT_SUP, attr, "OPERATIONGRAPH_IN_PLACE",
                   f"OPS[{inplace[0]}] reads and writes the same uid; in-place ops are supported in single-op graphs only (000)")
    order, done, pending = [], set(), list(range(len(nodes)))
    while pending:  # Kahn: an op is ready when every op producing one of its inputs has run
        ready = [i for i in pending
                 if all(producer.get(u) in (None, i) or producer[u] in done for u in nodes[i].uids(nodes[i].reads))]
        if not ready:
            raise fail(NOT_SUP, attr, "OPERATIONGRAPH_CYCLE", f"OPS{sorted(pending)} depend on each other in a cycle")
        order += ready
        done.update(ready)
        pending = [i for i in pending if i not in done]
    user_uids = [t.uid for n in nodes for t in n.tensors.values()]
    in_place = nodes[0].uids(nodes[0].reads) & nodes[0].uids(nodes[0].writes) if inplace else set()
    ctx = Lowering(max(INTERNAL_UID_BASE, max(user_uids) + 1), frozenset(in_place))
    ops, origin = [], []
    for i in order:
        lowered = nodes[i].lower(ctx)
        ops += lowered
        origin += [i] * len(lowered)
    g = OperationGraph(ops, "backend")
    try:
        g.finalize()
    except GraphError as e:
        where = "; ".join(f"op {k} is from OPS[{i}] (CUDNN_BACKEND_{nodes[i].type_name}_DESCRIPTOR)" for k, i in enumerate(origin))
        raise fail(NOT_SUP if e.status == "NOT_SUPPORTED" else BAD, attr, e.check, f"{O.graph_message(e)} [{where}]") from None
    externals = {t.uid: t for t in g.external_inputs()}
    externals.update({t.uid: t for t in g.external_outputs()})
    return GraphObj(handle, g, externals, ctx.scalars, ctx.aliases)


@dataclass
class EngineObj:
    graph_desc: BackendDescriptor
    graph: GraphObj
    index: int
    engine: object
    config: object


def _fin_engine(d):
    """002 §9.2.2: BAD_PARAM when the graph is not finalized, NOT_SUPPORTED when GLOBAL_INDEX is
    out of range or the engine cannot run the graph (the reason is in the message)."""
    gd = d.one("ENGINE_OPERATION_GRAPH")
    g = _finalized_obj(gd, "CUDNN_ATTR_ENGINE_OPERATION_GRAPH", "the operation graph")
    idx, lst = d.one("ENGINE_GLOBAL_INDEX"), g.engines()
    if not 0 <= idx < len(lst):
        extra = "; unusable here: " + "; ".join(f"{n}: {r}" for n, r in g.unusable) if g.unusable else ""
        raise fail(NOT_SUP, "CUDNN_ATTR_ENGINE_GLOBAL_INDEX", "ENGINE_GLOBAL_INDEX",
                   f"{idx} is outside 0..{len(lst) - 1} (CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT is {len(lst)}){extra}")
    eng, cfg = lst[idx]
    why = eng.check_support(g.ir, g.place)
    if why:
        raise fail(NOT_SUP, "CUDNN_ATTR_ENGINE_GLOBAL_INDEX", "ENGINE_SUPPORT", f"engine {idx} ({cfg}) cannot run this graph: {why}")
    return EngineObj(gd, g, idx, eng, cfg)


_KNOB_TYPES = ENUMS["cudnnBackendKnobType_t"]


def _knob_enum(name: str):
    v = _KNOB_TYPES.get("CUDNN_KNOB_TYPE_" + name)
    return None if v is None or name == "COUNTS" else v


@dataclass
class CfgObj:
    engine_desc: BackendDescriptor
    engine: EngineObj
    config: object


def _fin_enginecfg(d):
    """002 §9.2.3: the engine plus knob choices; NOT_SUPPORTED for a knob the engine does not
    have or a value outside its KNOB_INFO range (ours: the config's own value)."""
    ed = d.one("ENGINECFG_ENGINE")
    e = _finalized_obj(ed, "CUDNN_ATTR_ENGINECFG_ENGINE", "the engine")
    attr = "CUDNN_ATTR_ENGINECFG_KNOB_CHOICES"
    have = {_knob_enum(n): (n, v) for n, v in e.config.knobs if _knob_enum(n) is not None}
    chosen = set()
    for i, kd in enumerate(d.get("ENGINECFG_KNOB_CHOICES", [])):
        ktype, kval = _finalized_obj(kd, attr, f"KNOB_CHOICES[{i}]")
        kname = name_of("cudnnBackendKnobType_t", ktype)
        if ktype in chosen:
            raise fail(BAD, attr, "KNOB_CHOICE_DUPLICATE", f"{kname} is chosen twice")
        chosen.add(ktype)
        if ktype not in have:
            raise fail(NOT_SUP, attr, "KNOB_CHOICE_TYPE", f"engine {e.index} ({e.config}) has no knob {kname}")
        if kval != have[ktype][1]:
            raise fail(NOT_SUP, attr, "KNOB_CHOICE_VALUE",
                       f"{kname} = {kval} is outside engine {e.index}'s range [{have[ktype][1]}, {have[ktype][1]}]")
    return CfgObj(ed, e, e.config)


@dataclass
class PlanObj:
    handle: Handle
    cfg: CfgObj
    plan: object

    @property
    def graph(self) -> GraphObj:
        return self.cfg.engine.graph

    @property
    def place(self) -> str:
        return self.handle.place


def _fin_plan(d):
    """002 §9.2.5: configuring the engine builds the plan (000); NOT_SUPPORTED with the engine's
    reason when it declines."""
    try:
        h = resolve(d.one("EXECUTION_PLAN_HANDLE"), Handle, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE")
    except CuDNNError as e:
        raise fail(BAD, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE", "PLAN_HANDLE", e.rule) from None
    attr = "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG"
    c = _finalized_obj(d.one("EXECUTION_PLAN_ENGINE_CONFIG"), attr, "the engine config")
    g, eng = c.engine.graph, c.engine.engine
    if h.place != g.place:
        raise fail(NOT_SUP, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE", "PLAN_HANDLE_PLACE",
                   f"the handle runs on the {h.place} place but the operation graph's handle on the {g.place} place")
    why = eng.check_support(g.ir, g.place)
    if why is None:
        try:
            plan = eng.build(g.ir, c.config)
        except EngineDeclined as e:
            why = e.reason
    if why is not None:
        raise fail(NOT_SUP, attr, "ENGINE_SUPPORT", f"engine {c.engine.index} ({c.config}) declined the graph: {why}")
    plan.place, plan.declines = g.place, []
    return PlanObj(h, c, plan)


@dataclass
class HeurObj:
    graph_desc: BackendDescriptor
    graph: GraphObj
    results: list  # [(global index, engine, config)]


def _fin_heur(d):
    """002 §9.2.4 / 000 "Heuristics": INSTANT and A -> mode A, B -> B, FALLBACK -> FALLBACK."""
    gd = d.one("ENGINEHEUR_OPERATION_GRAPH")
    g = _finalized_obj(gd, "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH", "the operation graph")
    cfgs, _unusable = get_engine_configs(g.ir, g.place, A.HEUR_MODE_PLANNER[d.one("ENGINEHEUR_MODE")])
    return HeurObj(gd, g, [(g.index_of(e, c), e, c) for e, c in cfgs])


@dataclass
class PackObj:
    uids: list
    pointers: list
    workspace: object


def _fin_variant_pack(d):
    """002 §9.2.17: one data pointer per uid, uids distinct."""
    uids, ptrs = d.get("VARIANT_PACK_UNIQUE_IDS"), d.get("VARIANT_PACK_DATA_POINTERS")
    if len(uids) != len(ptrs):
        raise fail(BAD, "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS", "VARIANT_PACK_COUNT",
                   f"has {len(ptrs)} pointers but CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS has {len(uids)} uids")
    dup = sorted({u for u in uids if uids.count(u) > 1})
    if dup:
        raise fail(BAD, "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS", "VARIANT_PACK_UID_UNIQUE", f"uid(s) {dup} appear more than once")
    return PackObj(list(uids), list(ptrs), d.one("VARIANT_PACK_WORKSPACE"))


FINALIZE = dict(O.FINALIZE, OPERATIONGRAPH=_fin_graph, ENGINE=_fin_engine, ENGINECFG=_fin_enginecfg,
                EXECUTION_PLAN=_fin_plan, ENGINEHEUR=_fin_heur, VARIANT_PACK=_fin_variant_pack)
assert set(FINALIZE) | set(A.READ_ONLY_TYPES) == set(A.DESCRIPTORS)


# -- get-only attributes ------------------------------------------------------------------------------

def _made(type_name: str, values: dict, obj, targets, i: int) -> BackendDescriptor:
    """A finalized descriptor holding ``values``: the caller's ``targets[i]`` when given (as C
    fills a caller-created array), else a new one."""
    t = A.DESC_TYPES[f"CUDNN_BACKEND_{type_name}_DESCRIPTOR"]
    if targets is not None and i < len(targets):
        d = _desc(targets[i], f"arrayOfElements[{i}]")
        if d.type_name != type_name:
            raise fail(BAD, "arrayOfElements", "DESCRIPTOR_TYPE",
                       f"element {i} is a CUDNN_BACKEND_{d.type_name}_DESCRIPTOR, not CUDNN_BACKEND_{type_name}_DESCRIPTOR")
        d.reset(t)
    else:
        d = BackendDescriptor(t)
    d.values.update(values)
    d.obj, d.finalized = obj, True
    return d


def _heur_results(d, n, targets):
    h, out = d.obj, []
    for i, (idx, eng, cfg) in enumerate(h.results[:n]):
        ed = _made("ENGINE", {"ENGINE_OPERATION_GRAPH": [h.graph_desc], "ENGINE_GLOBAL_INDEX": [idx]},
                   EngineObj(h.graph_desc, h.graph, idx, eng, cfg), None, 0)
        knobs = [_made("KNOB_CHOICE", {"KNOB_CHOICE_KNOB_TYPE": [_knob_enum(k)], "KNOB_CHOICE_KNOB_VALUE": [v]},
                       (_knob_enum(k), v), None, 0) for k, v in cfg.knobs if _knob_enum(k) is not None]
        out.append(_made("ENGINECFG", {"ENGINECFG_ENGINE": [ed], "ENGINECFG_KNOB_CHOICES": knobs},
                         CfgObj(ed, ed.obj, cfg), targets, i))
    return out + [None] * (len(h.results) - len(out))  # the count is the full number of results


_NOTES = ENUMS["cudnnBackendNumericalNote_t"]


def _numerical_notes(d, n, targets):
    notes = d.obj.config.notes
    out = [v for k, v in _NOTES.items() if k != "CUDNN_NUMERICAL_NOTE_TYPE_COUNT" and k[len("CUDNN_NUMERICAL_NOTE_"):] in notes]
    if _NOTES["CUDNN_NUMERICAL_NOTE_WINOGRAD"] not in out and any(s.startswith("WINOGRAD") for s in notes):
        out.append(_NOTES["CUDNN_NUMERICAL_NOTE_WINOGRAD"])
    return out


def _behavior_notes(d, n, targets):
    rc = ENUMS["cudnnBackendBehaviorNote_t"]["CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION"]
    return [rc] if "RUNTIME_COMPILATION" in d.obj.config.notes else []


def _knob_infos(d, n, targets):
    knobs = [(k, v) for k, v in d.obj.config.knobs if _knob_enum(k) is not None]
    out = []
    for i, (k, v) in enumerate(knobs[:n]):
        vals = {"KNOB_INFO_TYPE": [_knob_enum(k)], "KNOB_INFO_MAXIMUM_VALUE": [v], "KNOB_INFO_MINIMUM_VALUE": [v],
                "KNOB_INFO_STRIDE": [1]}
        out.append(_made("KNOB_INFO", vals, (k, v), targets, i))
    return out + [None] * (len(knobs) - len(out))


GETTERS = {
    "OPERATIONGRAPH_ENGINE_GLOBAL_COUNT": lambda d, n, t: [len(d.obj.engines())],
    "ENGINEHEUR_RESULTS": _heur_results,
    "ENGINE_NUMERICAL_NOTE": _numerical_notes,
    "ENGINE_BEHAVIOR_NOTE": _behavior_notes,
    "ENGINE_KNOB_INFO": _knob_infos,
    "ENGINE_LAYOUT_INFO": lambda d, n, t: [],  # no layout preference: every engine takes any strides
    "ENGINECFG_INTERMEDIATE_INFO": lambda d, n, t: [],  # 002: placeholder
    "EXECUTION_PLAN_WORKSPACE_SIZE": lambda d, n, t: [int(d.obj.plan.workspace_size)],
    "CONVOLUTION_SPATIAL_DIMS": lambda d, n, t: [d.obj["spatial_dims"]],
}
