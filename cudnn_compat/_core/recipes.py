"""Steady recipes: a legacy call made again without its Python front (issue 26 item 8).

A program calls a compute function with the same handle and descriptors over and over.  Once the
function's call site has settled (``_core.memo``: its entry is stamped with the current EPOCH[0]),
everything its Python path does with those arguments is fixed until a descriptor or handle changes:
the handle it resolves, the plan-cache key objects it picks by which betas are zero, which argument
goes to which graph uid under which name.  ``steady`` writes that down once per argument tuple (a
*recipe*, made by the family's ``recipe`` function from its site entry) and puts the compiled
``_steady.Site`` in front of the function's wrapper: a call with those arguments builds the tensors
and scalars dicts in C and runs the prepared call (``_core.call.run``'s steady part).  Anything else
goes to the wrapper, the whole Python path, from its first line:

- keywords, another argument count, a legacy hook (``registry.HOOKS``: trace, fuse, the API log);
- an argument the wrapper would convert (the wrapper's own fast test, ``registry.fast_tests``);
- a scalar that is not a float or an int of magnitude < 2**31 (``data.scalar``'s first two forms),
  an epsilon below the family's bound, an unread buffer that is not None, 0 or an array;
- a stale recipe (EPOCH[0] changed: the call re-resolves, and the recipe is made again after it);
- a prepared call that is not taken (no prepared call yet, a buffer of another form, too little
  workspace, a forced engine, a hook of ``_core.call``): nothing has run or written then.

The families' recipe functions take their site entry's value and return ``Recipe(...)`` or None
(no recipe while these settings last: a per-call check the recipe cannot make, such as in-place
buffers with different strides).  Without the compiled extension (``_backend.steady.module()``
None) ``steady`` returns the wrapper unchanged: the recipe is an accelerator, the Python path its
twin, and tests/test_recipes.py checks the two against each other.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np

from cudnn_compat._backend import steady as _steady
from . import registry
from .call import run as _run
from .data import _CUPY_NDARRAY
from .descriptor import EPOCH
from .uids import ALPHA, BETA

MAXSIZE = 512  # recipes per function (a full table is cleared)


class Recipe:
    """What a settled call site's Python path does, by parameter name.

    keys:      one key object, or 2**len(betas) of them, index sum((beta_j == 0) << j)
    tensors:   {parameter: uid, or (uid, the argname messages use where it is not the parameter's)}
    scalars:   {parameter: uid}
    betas:     parameters of ``scalars`` whose being zero picks the key
    bounds:    {parameter: lower bound}: a float >= it (epsilon), no int
    unread:    parameters of buffers the call does not read (None, 0 or an array passes)
    workspace: (workspace parameter, size parameter[, True: a NULL workspace passes size 0]): passed
               to run with the size's name (the prepared call checks it is enough)
    constants: {uid: value}: scalars the family passes as constants
    distinct:  ((p, q, r), ...): parameters p and q must not be one buffer unless r is it too
    """

    __slots__ = ("handle", "keys", "tensors", "scalars", "betas", "bounds", "unread", "workspace", "constants",
                 "distinct", "bound")

    def __init__(self, handle, keys, tensors: dict, scalars: dict, betas: tuple = (), bounds: "dict | None" = None,
                 unread: tuple = (), workspace: "tuple | None" = None, constants: "dict | None" = None,
                 distinct: tuple = (), bound: "Bound | None" = None):
        self.handle, self.tensors, self.scalars, self.betas = handle, tensors, scalars, betas
        self.keys = keys if betas else (keys,)
        self.bounds, self.unread, self.workspace = bounds or {}, unread, workspace
        self.constants, self.distinct, self.bound = constants or {}, distinct, bound

    @classmethod
    def of_bound(cls, handle, bound: "Bound", unread: tuple = (), distinct: tuple = ()) -> "Recipe":
        """The recipe of a call that runs bound graphs (``Bound``) and nothing else."""
        return cls(handle, None, {}, {}, unread=unread, distinct=distinct, bound=bound)

    @classmethod
    def blend(cls, handle, keys, tensors: dict, **kw) -> "Recipe":
        """The recipe of a call whose output blend is y = alpha*result + beta*y (``_core.call.blend``):
        alpha and beta its scalars, beta == 0 picking the key (``keys``: beta != 0, beta == 0)."""
        return cls(handle, keys, tensors, {"alpha": ALPHA, "beta": BETA}, ("beta",), **kw)

    def compiled(self, stamp, pos: dict) -> tuple:
        """The tuple ``_steady.Site`` replays (its docstring), parameter names made positions; None
        when a bound part has nothing to replay."""
        bound = None if self.bound is None else self.bound.compiled(pos)
        if self.bound is not None and bound is None:
            return None
        names = list(self.scalars)
        nd = _CUPY_NDARRAY[:1] if self.handle.place != "cpu" else []
        ws = None if self.workspace is None else \
            (pos[self.workspace[0]], pos[self.workspace[1]], self.workspace[1], bool(self.workspace[2:] and self.workspace[2]))
        return (stamp, self.handle, tuple(self.keys),
                tuple((pos[n],) + (t if type(t) is tuple else (t, n)) for n, t in self.tensors.items()),
                tuple((pos[n], uid, self.bounds.get(n)) for n, uid in self.scalars.items()),
                tuple(names.index(b) for b in self.betas),
                tuple(pos[n] for n in self.unread), tuple([np.ndarray] + nd), ws, tuple(self.constants.items()),
                tuple(tuple(pos[n] for n in d) for d in self.distinct),
                bound, [None] * len(self.keys))  # per key: the replay's Settled (_steady.c), made by the replay


class Bound:
    """A call made of graphs whose tensors sit at byte offsets inside the caller's buffers
    (``_core.bound_graph``: dropout, the RNN stages), as its Python path runs it on the GPU place
    with every buffer preflighted as a pointer (``data.preflight(..., pointers=True)``):

    buffers: {buffer name: (parameter, or None with ``constant`` the buffer, bytes needed, IR dtype
             name or None for untyped)}: a contiguous device array of an accepted dtype with the
             bytes needed, or a device pointer int, bound as its address; bytes needed None: bound
             as it is (the prepared call's binder checks it; only at offset 0)
    stages:  ((plan-cache key, BoundGraph or None, {value name: value}), ...): run in order as
             ``bound_graph.execute`` runs them (a None graph: nothing to run)
    nulls:   parameters that must be NULL (None or 0): the buffers the call site was not given
    minimum: {parameter: n}: an int >= n (the size arguments)
    """

    __slots__ = ("buffers", "stages", "nulls", "minimum")

    def __init__(self, buffers: dict, stages: tuple, nulls: tuple = (), minimum: "dict | None" = None):
        self.buffers, self.stages, self.nulls, self.minimum = buffers, stages, nulls, minimum or {}

    def compiled(self, pos: dict) -> "tuple | None":
        """``_steady.c`` replay_bound's tuple, parameter names made positions; None when no stage has
        a graph or a graph binds a buffer not listed (the Python path runs such calls)."""
        from .data import _ACCEPT
        nd = _CUPY_NDARRAY[0] if _CUPY_NDARRAY else None
        index = {name: i for i, name in enumerate(self.buffers)}
        bufs = tuple((-1 if p is None else pos[p], const, -1 if need is None else int(need),
                      None if dt is None else _ACCEPT[dt], nd)
                     for p, const, need, dt in self.buffers.values())
        graphs = [(key, bound, vals) for key, bound, vals in self.stages if bound is not None]
        if not graphs or any(buf not in index for _k, bound, _v in graphs for buf, _off in bound.bindings.values()):
            return None
        stages = tuple((key, (lambda g=bound.graph: g),
                        tuple((uid, index[buf], off, buf) for uid, (buf, off) in bound.bindings.items()),
                        tuple((uid, float(vals[name])) for uid, name in bound.scalar_names.items()),
                        [None] * 5)  # the stage's last buffers, dicts, Settled and as-is buffers: replay_bound's memo
                       for key, bound, vals in graphs)
        return (bufs, tuple(pos[n] for n in self.nulls), tuple((pos[n], int(v)) for n, v in self.minimum.items()),
                stages, [None] * len(bufs))  # per buffer: the last array that passed (replay_bound's memo)


def steady(wrapper, sites, key: tuple, recipe, site_key=None, arm_key=None):
    """``wrapper`` (a ``registry.legacy`` function) with steady recipes in front of it, registered
    in its place; ``wrapper`` itself where the extension is not built.  ``sites``: the call-site
    memo the function's Python path fills; ``key``: the parameters of its site key, in order
    (``site_key(values)`` makes that key when it has more in it, ``arm_key(args)`` when it depends
    on other arguments too); ``recipe(*site value)``: a ``Recipe`` or None."""
    mod = _steady.module()
    if mod is None or type(_run) is not mod.Run:
        return wrapper
    params = list(inspect.signature(inspect.unwrap(wrapper)).parameters)
    pos = {n: i for i, n in enumerate(params)}
    kpos = tuple(pos[n] for n in key)

    def arm(*args):
        """The recipe of ``args`` after the wrapper ran them: None while the site entry is missing
        or stale (a later call tries again), (stamp, None) when the family has none."""
        ck = tuple([args[i] for i in kpos])
        try:
            s = sites.get(arm_key(args) if arm_key else site_key(ck) if site_key else ck)
        except TypeError:
            return None
        if s is None or s[0] is not EPOCH[0]:
            return None
        r = recipe(*s[1])
        c = None if r is None else r.compiled(s[0], pos)
        return (s[0], None) if c is None else c

    site = mod.Site(wrapper, registry.HOOKS, EPOCH, len(params), kpos, wrapper.fast_tests, arm, _run, MAXSIZE)
    functools.update_wrapper(site, wrapper)
    site.arm = arm
    registry.LEGACY[wrapper.c_name] = site
    return site
