"""The binding of a cached call on the GPU place, generated per plan (issue 14 item 3).

``_core.call.run`` binds every external tensor of a plan to the caller's buffer.  For plans that take
raw device pointers (``plan.raw_pointers``: the cudnn engine, the cupy engine's launch records)
the common case is a contiguous CuPy array of the descriptor's dtype, big enough: its address is
the binding (a device pointer int above POINTER_MIN is its own binding, as ``device_pointer`` says).  ``binder(plan)`` generates, once per plan, a function unrolled over the plan's
tensors that makes exactly ``_core.call.run``'s fast-path test for each of them (``type(buf) is
cupy.ndarray``, dtype identity or membership in the accepted set, C or F contiguity, ``nbytes``
at least the span) and returns the variant-pack dict ``{uid: pointer or scalar}``; on the first
buffer that is anything else it returns None and ``_core.call.run``'s general loop binds the call
(and raises its errors).  Scalars reach it as the floats ``_core.data.scalar`` made of the caller's
alpha, beta or fill (the one place their rules apply, the host-address one included), so the
generated code passes them on unchecked.  A prior-output tensor (``uid + Y_PRIOR_OFFSET``) not given by the caller
takes the output's pointer, as the loop does.

``lane(plan)``: for a cupy plan with launch records, the same checks generated into one function
``lane(tensors, scalars, stream) -> bool`` that hands the pointers and scalars straight to the
record's ``fastp`` (no variant-pack dict, no ``planner.execute``): ``_core.call.run``'s cached lane.
False (nothing launched) on the first buffer the binder would refuse, or when the record cannot
launch (no record yet for the stream, a guarded overlap, a scalar that does not pack): the
general path then binds, checks and executes the call.
"""
from __future__ import annotations

from . import data as _data
from .data import layout
from .uids import PRIOR_OFFSET as Y_PRIOR_OFFSET  # uid of "y before the call" = uid(y) + this


# -- the binding program of a plan (what ``_core.call.run`` and the generated binders read) ---------

def externals(plan) -> dict:
    """uid -> tensor of the plan's external inputs and outputs (kept on the plan)."""
    ext = getattr(plan, "externals", None)
    if ext is None:
        ext = {t.uid: t for t in plan.graph.external_inputs()}
        ext.update({t.uid: t for t in plan.graph.external_outputs()})
        plan.externals = ext
    return ext


def written(plan) -> frozenset:
    """uids of the plan's external outputs (the buffers a call writes)."""
    out = getattr(plan, "written_uids", None)
    if out is None:
        out = plan.written_uids = frozenset(t.uid for t in plan.graph.external_outputs())
    return out


def program(plan) -> tuple:
    """What binding needs of each external tensor of ``plan``, computed once per plan:
    ((uid, tensor, is by-value scalar, is written, bytes spanned, storage dtype, accepted array
    dtypes), ...): the dtype table of _data.ACCEPTED is looked up here, so binding a buffer costs
    one dtype identity test (a set membership for byte views)."""
    prog = getattr(plan, "bind_program", None)
    if prog is None:
        outs = written(plan)
        prog = plan.bind_program = tuple(
            (uid, t, t.is_by_value, uid in outs) + ((0, None, None) if t.is_by_value else
                                                      (layout(t)[1], layout(t)[0], layout(t)[3]))
            for uid, t in externals(plan).items())
    return prog


# -- the generated binders and lanes ---------------------------------------------------------------

def _none(tensors, scalars):
    return None


def binder(plan):
    """The plan's generated binder (made on first use, kept on the plan)."""
    fn = plan.gpu_binder
    if fn is not None:
        return fn
    fn = _none
    if getattr(plan, "raw_pointers", False):
        nd = _data._CUPY_NDARRAY[0] if _data._CUPY_NDARRAY else _data.cupy_ndarray()
        fn = _generate(program(plan), nd, Y_PRIOR_OFFSET)
    plan.gpu_binder = fn
    return fn


def lane(plan):
    """The plan's generated lane (made on first use, kept on the plan), or None when the plan has
    no launch records (``plan._path``: records.FastPath) or takes no raw pointers."""
    if plan.gpu_lane is not False:  # made before (a function, or None)
        return plan.gpu_lane
    fn = None
    path = getattr(plan, "_path", None)
    if getattr(plan, "raw_pointers", False) and path is not None and hasattr(path, "order"):
        nd = _data._CUPY_NDARRAY[0] if _data._CUPY_NDARRAY else _data.cupy_ndarray()
        fn = _generate(program(plan), nd, Y_PRIOR_OFFSET, path)
    plan.gpu_lane = fn
    return fn


def _generate(prog, nd, prior_offset: int, path=None):
    """The binder of ``prog``; with ``path`` (a records.FastPath) the lane that launches it."""
    fail = "False" if path is not None else "None"
    tensors = [(e[0], e[4], e[5], e[6]) for e in prog if not e[2]]  # (uid, need, storage, accepted)
    scalars = [e[0] for e in prog if e[2]]
    uids = {u for u, *_ in tensors}
    # outputs before their priors, so a prior the caller did not pass can reuse the output's pointer
    tensors.sort(key=lambda e: (e[0] - prior_offset in uids, e[0]))
    need_of = {u: n for u, n, _s, _a in tensors}
    ns = {"ND": nd, "P": path}
    lines = ["def lane(tensors, scalars, stream):" if path is not None else "def bind(tensors, scalars):"]
    for k, (u, need, storage, acc) in enumerate(tensors):
        ns[f"S{k}"], ns[f"A{k}"] = storage, acc
        base = u - prior_offset
        check = ["        if type(b) is ND:",
                 f"            if (b.dtype is not S{k} and b.dtype not in A{k}) or not (b._c_contiguous or b._f_contiguous) "
                 f"or b.nbytes < {need}:",
                 f"                return {fail}",
                 f"            p{u} = b.data.ptr",
                 f"        elif type(b) is int and b >= {_data.POINTER_MIN}:",  # a device pointer (device_pointer)
                 f"            p{u} = b",
                 "        else:",
                 f"            return {fail}"]
        if base in uids and need_of[base] == need:
            lines += [f"    e = tensors.get({u})",
                      "    if e is None:",
                      f"        p{u} = p{base}",
                      "    else:",
                      "        b = e[0]"] + check
        else:
            lines += [f"    e = tensors.get({u})"]
            if base in uids:
                lines += ["    if e is None:", f"        e = tensors[{base}]"]
            lines += ["    if e is None:", f"        return {fail}", "    b = e[0]"]
            lines += [c[4:] for c in check]
    if path is not None:
        args = ", ".join(f"p{u}" if u in uids else f"scalars[{u}]" for u in path.order)
        lines += ["    f = P.fastp", "    if f is None:", "        return False", f"    return f(stream, {args})"]
    else:
        items = [f"{u}: p{u}" for u, *_ in tensors] + [f"{u}: scalars[{u}]" for u in scalars]
        lines.append(f"    return {{{', '.join(items)}}}")
    exec(compile("\n".join(lines) + "\n", "<gpu binder>", "exec"), ns)
    fn = ns["lane" if path is not None else "bind"]
    fn.source = "\n".join(lines)
    return fn
