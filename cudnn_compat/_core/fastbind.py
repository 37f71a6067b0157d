"""The binding of a call to a plan's tensors: the binding program of each plan and, on the GPU
place, its generated binders (issue 14 item 3; issue 26 item 2: the one code generator).

``_core.call.run`` binds every external tensor of a plan to the caller's buffer.  ``program(plan)``
is what that needs of each tensor, computed once per plan.  For plans that take raw device
pointers (``plan.raw_pointers``: the cudnn engine, the cupy engine's launch records) the common
case is a contiguous CuPy array of the descriptor's dtype, big enough: its address is the binding
(a device pointer int above POINTER_MIN is its own binding, as ``device_pointer`` says).

Two binders are generated per plan, each a function unrolled over the plan's tensors making
exactly ``_core.call.run``'s fast-path test for each (``type(buf) is cupy.ndarray``, dtype
identity or membership in the accepted set, C or F contiguity, ``nbytes`` at least the span):

  binder(plan)  ``bind(tensors, scalars) -> {uid: pointer or scalar}``: the variant pack of the
                general path (``_core.call.run``)
  values(plan)  ``values(tensors, scalars) -> (value, ...)`` in ``plan.launch_order``: the binder
                of the plan's prepared call (``_backend/prepared.py``), whose launcher the engine
                supplies

Both return None on the first buffer that is anything else; ``_core.call.run``'s general loop then
binds the call (and raises its errors).  Scalars reach them as the floats ``_core.data.scalar``
made of the caller's alpha, beta or fill (the one place their rules apply, the host-address one
included), so the generated code passes them on unchecked.  A prior-output tensor (``uid +
Y_PRIOR_OFFSET``) not given by the caller takes the output's pointer, as the loop does.

The source is compiled by ``_core.generated`` (the package's one place for generated Python) under
the file name ``<cudnn_compat binder N: engine config>`` (``values`` for the second kind): kept
in ``linecache`` for tracebacks, as each function's ``source``, and dumped by ``generated.dump``.
"""
from __future__ import annotations

import itertools

from . import data as _data
from . import generated as _generated
from cudnn_compat._backend import steady as _steady
from .data import layout
from .uids import PRIOR_OFFSET as Y_PRIOR_OFFSET  # uid of "y before the call" = uid(y) + this


class _Binding:
    """What this module keeps per plan (``plan.annex[__name__]``), each made on first use."""

    __slots__ = ("externals", "written", "program", "binder", "values")

    def __init__(self):
        self.externals = self.written = self.program = self.binder = self.values = None


def _of(plan) -> _Binding:
    b = plan.annex.get(__name__)
    if b is None:
        b = plan.annex[__name__] = _Binding()
    return b


# -- the binding program of a plan (what ``_core.call.run`` and the generated binders read) ---------

def externals(plan) -> dict:
    """uid -> tensor of the plan's external inputs and outputs (kept on the plan)."""
    b = _of(plan)
    ext = b.externals
    if ext is None:
        ext = {t.uid: t for t in plan.graph.external_inputs()}
        ext.update({t.uid: t for t in plan.graph.external_outputs()})
        b.externals = ext
    return ext


def written(plan) -> frozenset:
    """uids of the plan's external outputs (the buffers a call writes)."""
    b = _of(plan)
    out = b.written
    if out is None:
        out = b.written = frozenset(t.uid for t in plan.graph.external_outputs())
    return out


def program(plan) -> tuple:
    """What binding needs of each external tensor of ``plan``, computed once per plan:
    ((uid, tensor, is by-value scalar, is written, bytes spanned, storage dtype, accepted array
    dtypes), ...): the dtype table of _data.ACCEPTED is looked up here, so binding a buffer costs
    one dtype identity test (a set membership for byte views)."""
    b = _of(plan)
    prog = b.program
    if prog is None:
        outs = written(plan)
        prog = b.program = tuple(
            (uid, t, t.is_by_value, uid in outs) + ((0, None, None) if t.is_by_value else
                                                      (layout(t)[1], layout(t)[0], layout(t)[3]))
            for uid, t in externals(plan).items())
    return prog


# -- the generated binders ---------------------------------------------------------------------------

def _none(tensors, scalars):
    return None


def _nd():
    return _data._CUPY_NDARRAY[0] if _data._CUPY_NDARRAY else _data.cupy_ndarray()


def binder(plan):
    """The plan's generated variant-pack binder (made on first use, kept on the plan); ``_none``
    for a plan that takes no raw pointers."""
    b = _of(plan)
    fn = b.binder
    if fn is None:
        fn = b.binder = _generate(plan, program(plan), _nd(), Y_PRIOR_OFFSET) if plan.raw_pointers else _none
    return fn


def values(plan):
    """The plan's generated values binder for its prepared call (made on first use, kept on the
    plan), or None when the plan has no launcher (``launch_order`` empty) or takes no raw pointers."""
    b = _of(plan)
    fn = b.values
    if fn is None:
        order = plan.launch_order
        ok = plan.raw_pointers and order and set(order) <= set(externals(plan))
        fn = b.values = _generate(plan, program(plan), _nd(), Y_PRIOR_OFFSET, tuple(order)) if ok else False
    return fn or None


_SERIAL = itertools.count(1)


def _entries(prog, prior_offset: int) -> tuple:
    """The tensors a binder of ``prog`` binds, in binding order: (uid, mode, alt, need, storage,
    accepted), mode 0 a tensor the caller must give, mode 1 a prior output the caller may omit that
    then takes entry ``alt``'s pointer (the output's, of the same span), mode 2 one that then takes
    the caller's ``tensors[alt]`` (checked for its own span).  Outputs come before their priors."""
    tensors = [(e[0], e[4], e[5], e[6]) for e in prog if not e[2]]  # (uid, need, storage, accepted)
    uids = {u for u, *_ in tensors}
    tensors.sort(key=lambda e: (e[0] - prior_offset in uids, e[0]))
    index = {u: k for k, (u, *_r) in enumerate(tensors)}
    need_of = {u: n for u, n, _s, _a in tensors}
    out = []
    for u, need, storage, acc in tensors:
        base = u - prior_offset
        if base in uids and need_of[base] == need:
            out.append((u, 1, index[base], need, storage, acc))
        elif base in uids:
            out.append((u, 2, base, need, storage, acc))
        else:
            out.append((u, 0, -1, need, storage, acc))
    return tuple(out)


def _generate(plan, prog, nd, prior_offset: int, order=None):
    """The variant-pack binder of ``prog``; with ``order`` (uids) the values binder: the compiled one
    (``_backend/_steady.c`` Values) where it is built, else its Python twin generated here."""
    entries = _entries(prog, prior_offset)
    uids = {e[0] for e in entries}
    compiled = _steady.module() if order is not None else None
    if compiled is not None:
        at = {e[0]: k for k, e in enumerate(entries)}
        return compiled.Values(entries, tuple((0, at[u]) if u in uids else (1, u) for u in order), nd, _data.POINTER_MIN)
    scalars = [e[0] for e in prog if e[2]]
    ns = {"ND": nd}
    lines = ["def values(tensors, scalars):" if order is not None else "def bind(tensors, scalars):"]
    for k, (u, mode, alt, need, storage, acc) in enumerate(entries):
        ns[f"S{k}"], ns[f"A{k}"] = storage, acc
        check = ["        if type(b) is ND:",
                 f"            if (b.dtype is not S{k} and b.dtype not in A{k}) or not (b._c_contiguous or b._f_contiguous) "
                 f"or b.nbytes < {need}:",
                 "                return None",
                 f"            p{u} = b.data.ptr",
                 f"        elif type(b) is int and b >= {_data.POINTER_MIN}:",  # a device pointer (device_pointer)
                 f"            p{u} = b",
                 "        else:",
                 "            return None"]
        if mode == 1:
            lines += [f"    e = tensors.get({u})",
                      "    if e is None:",
                      f"        p{u} = p{entries[alt][0]}",
                      "    else:",
                      "        b = e[0]"] + check
        elif mode == 2:
            lines += [f"    e = tensors.get({u})",
                      "    if e is None:",
                      f"        e = tensors[{alt}]",
                      "    b = e[0]"] + [c[4:] for c in check]
        else:  # a tensor the caller must give (a missing one: KeyError, below)
            lines += [f"    b = tensors[{u}][0]"] + [c[4:] for c in check]
    if order is not None:
        items = [f"p{u}" if u in uids else f"scalars[{u}]" for u in order]
        lines.append(f"    return ({', '.join(items)}{',' if len(items) == 1 else ''})")
    else:
        items = [f"{u}: p{u}" for u, *_ in entries] + [f"{u}: scalars[{u}]" for u in scalars]
        lines.append(f"    return {{{', '.join(items)}}}")
    # a tensor or scalar the call did not give: None (the general binding raises what it raises)
    lines = [lines[0], "  try:"] + ["  " + ln for ln in lines[1:]] + ["  except KeyError:", "    return None"]
    name = f"<cudnn_compat {'values' if order is not None else 'binder'} {next(_SERIAL)}: {plan.config}>"
    return _generated.define(name, "\n".join(lines), ns, "values" if order is not None else "bind")
