"""Partition an operation graph into steps (pure Python).

Element-wise ops (Pointwise, NormForward INFERENCE) that follow each other become one
``FusedGroup``; a Reduction joins the element-wise run before it as its prologue and the
element-wise ops on its result as its epilogue, so a chain plus a trailing reduction plus
the output blend is one kernel.  Every other op is a ``HeavyStep``; the element-wise ops
that consume its result (the alpha/beta blend, the bias, add and activation of the
BN Ex variants; dropout's scaling by the mask it draws) become that op's epilogue when its
kernel can apply them per output element.  Virtual tensors that cross steps are materialized
by the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .codegen import FusedGroup, is_elementwise, space_dims


@dataclass
class HeavyStep:
    """A non-element-wise op; ``epilogues``: output role -> FusedGroup applied to that output
    per element (its ``loads``/``stores`` exclude the op's own output, which is in registers)."""

    op: object
    epilogues: dict = field(default_factory=dict)

    @property
    def ops(self) -> list:
        return [self.op] + [o for g in self.epilogues.values() for o in g.prologue]


def _consumers(ops) -> dict:
    out = {}
    for i, op in enumerate(ops):
        for t in op.inputs.values():
            out.setdefault(t.uid, []).append(i)
    return out


def _loads_stores(members, consumers, index_of, provided=()):
    """(loads, stores) of a set of ops: inputs produced outside (minus ``provided``), and
    outputs that are external or read outside the set."""
    inside = {index_of[id(op)] for op in members}
    produced = {t.uid for op in members for t in op.outputs.values()}
    loads, stores = {}, {}
    for op in members:
        for t in op.inputs.values():
            if t.is_by_value or t.uid in produced or t.uid in provided:
                continue
            loads.setdefault(t.uid, t)
    for op in members:
        for t in op.outputs.values():
            if not t.is_virtual or any(c not in inside for c in consumers.get(t.uid, ())):
                stores[t.uid] = t
    return loads, stores


def _broadcasts(small, big) -> bool:
    return len(small) == len(big) and all(s == b or s == 1 for s, b in zip(small, big))


def _elementwise_group(run, consumers, index_of):
    loads, stores = _loads_stores(run, consumers, index_of)
    space = space_dims(run)
    if any(t.dims != space for t in stores.values()):
        return None
    if any(not _broadcasts(t.dims, space) for t in loads.values()):
        return None
    return FusedGroup(list(run), None, [], loads, stores)


def _reduction_group(pro, red, epi, consumers, index_of):
    members = pro + [red] + epi
    loads, stores = _loads_stores(members, consumers, index_of)
    x, y = red.inputs["x"], red.outputs["y"]
    pro_out = {t.uid for op in pro for t in op.outputs.values()}
    if pro and (x.uid not in pro_out or any(u in stores for u in pro_out)):
        return None
    if x.is_by_value:
        return None
    if any(not _broadcasts(op.outputs["y"].dims, x.dims) for op in pro):
        return None
    red_out = {t.uid for t in red.outputs.values()}
    epi_out = set()
    for op in epi:
        if op.outputs["y"].dims != y.dims:
            return None
        for t in op.inputs.values():
            if t.uid in pro_out:
                return None
            if t.uid in loads and not _broadcasts(t.dims, y.dims):
                return None
        epi_out |= {t.uid for t in op.outputs.values()}
    for t in stores.values():
        if t.uid not in red_out | epi_out or t.dims != y.dims:
            return None
    for op in pro:
        for t in op.inputs.values():
            if t.uid in loads and not _broadcasts(t.dims, x.dims):
                return None
    return FusedGroup(list(pro), red, list(epi), loads, stores)


def _heavy_epilogues(op, follow, consumers, index_of, outputs):
    """Epilogue groups for ``op``'s outputs among the element-wise ops ``follow`` that come
    right after it.  Returns ({role: group}, number of ops used)."""
    taken, groups = 0, {}
    roles = {t.uid: r for r, t in op.outputs.items() if r in outputs}
    owner = {}  # uid -> role whose epilogue computes it
    members = {r: [] for r in roles.values()}
    for nxt in follow:
        srcs = {owner.get(t.uid) or roles.get(t.uid) for t in nxt.inputs.values()} - {None}
        if len(srcs) != 1:
            break
        role = srcs.pop()
        if nxt.outputs["y"].dims != op.outputs[role].dims:
            break
        members[role].append(nxt)
        owner[nxt.outputs["y"].uid] = role
        taken += 1
    # drop everything if some epilogue is not a valid group (keep it simple and correct)
    for role, run in members.items():
        if not run:
            continue
        out = op.outputs[role]
        if not out.is_virtual and op.kind not in STORED_EPILOGUE_KINDS:
            return {}, 0
        group_ops = run
        all_inside = {index_of[id(o)] for o in group_ops}
        if any(c not in all_inside for c in consumers.get(out.uid, ())):
            return {}, 0
        loads, stores = _loads_stores(group_ops, consumers, index_of, provided={out.uid})
        if any(t.dims != out.dims for t in stores.values()) or any(not _broadcasts(t.dims, out.dims) for t in loads.values()):
            return {}, 0
        groups[role] = FusedGroup(list(group_ops), None, [], loads, stores)
    return groups, taken


# op kind -> output roles whose epilogue the kind's kernel applies per element
EPILOGUE_ROLES = {
    "Softmax": ("y",), "SoftmaxBackward": ("dx",),
    "ResampleForward": ("y",), "ResampleBackward": ("dx",),
    "NormForward": ("y",), "NormBackward": ("dx", "dscale", "dbias"),
    "LRNForward": ("y",), "LRNBackward": ("dx",),
    "DivisiveNormalizationForward": ("y",), "DivisiveNormalizationBackward": ("dx", "dmeans"),
    "Rng": ("y",),
}


# kinds whose kernel stores an output and applies its epilogue too (dropout: the mask is kept in the
# reserve space and y = x * scale * mask computed from it in the same kernel); every other kind's
# epilogue output must be virtual
STORED_EPILOGUE_KINDS = frozenset({"Rng"})


def partition(graph) -> list:
    """Steps in execution order: FusedGroup or HeavyStep."""
    ops = graph.ops
    consumers = _consumers(ops)
    index_of = {id(op): i for i, op in enumerate(ops)}
    steps, i, n = [], 0, len(ops)
    while i < n:
        op = ops[i]
        if is_elementwise(op) or op.kind == "Reduction":
            j = i
            while j < n and is_elementwise(ops[j]):
                j += 1
            run = ops[i:j]
            if j < n and ops[j].kind == "Reduction":
                red = ops[j]
                g = _reduction_group(run, red, [], consumers, index_of)
                if g is not None:
                    e = j + 1
                    while e < n and is_elementwise(ops[e]):
                        g2 = _reduction_group(run, red, ops[j + 1:e + 1], consumers, index_of)
                        if g2 is None:
                            break
                        g, e = g2, e + 1
                    steps.append(g)
                    i = e
                    continue
            if not run:  # a Reduction whose element-wise run could not be its prologue
                g = _reduction_group([], op, [], consumers, index_of)
                e = i + 1
                while e < n and is_elementwise(ops[e]):
                    g2 = _reduction_group([], op, ops[i + 1:e + 1], consumers, index_of)
                    if g2 is None:
                        break
                    g, e = g2, e + 1
                if g is None:
                    raise ValueError("reduction cannot be grouped")
                steps.append(g)
                i = e
                continue
            # element-wise run alone: the longest valid prefix
            for k in range(len(run), 0, -1):
                g = _elementwise_group(run[:k], consumers, index_of)
                if g is not None:
                    steps.append(g)
                    i += k
                    break
            else:  # pragma: no cover - a single op is always a valid group
                raise ValueError(f"op {i} cannot be grouped")
            continue
        follow = []
        j = i + 1
        while j < n and is_elementwise(ops[j]):
            follow.append(ops[j])
            j += 1
        epis, used = _heavy_epilogues(op, follow, consumers, index_of, EPILOGUE_ROLES.get(op.kind, ()))
        steps.append(HeavyStep(op, epis))
        i += 1 + used
    return steps
