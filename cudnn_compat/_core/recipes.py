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
                 "distinct")

    def __init__(self, handle, keys, tensors: dict, scalars: dict, betas: tuple = (), bounds: "dict | None" = None,
                 unread: tuple = (), workspace: "tuple | None" = None, constants: "dict | None" = None,
                 distinct: tuple = ()):
        self.handle, self.tensors, self.scalars, self.betas = handle, tensors, scalars, betas
        self.keys = keys if betas else (keys,)
        self.bounds, self.unread, self.workspace = bounds or {}, unread, workspace
        self.constants, self.distinct = constants or {}, distinct

    @classmethod
    def blend(cls, handle, keys, tensors: dict, **kw) -> "Recipe":
        """The recipe of a call whose output blend is y = alpha*result + beta*y (``_core.call.blend``):
        alpha and beta its scalars, beta == 0 picking the key (``keys``: beta != 0, beta == 0)."""
        return cls(handle, keys, tensors, {"alpha": ALPHA, "beta": BETA}, ("beta",), **kw)

    def compiled(self, stamp, pos: dict) -> tuple:
        """The tuple ``_steady.Site`` replays (its docstring), parameter names made positions."""
        names = list(self.scalars)
        nd = _CUPY_NDARRAY[:1] if self.handle.place != "cpu" else []
        ws = None if self.workspace is None else \
            (pos[self.workspace[0]], pos[self.workspace[1]], self.workspace[1], bool(self.workspace[2:] and self.workspace[2]))
        return (stamp, self.handle, tuple(self.keys),
                tuple((pos[n],) + (t if type(t) is tuple else (t, n)) for n, t in self.tensors.items()),
                tuple((pos[n], uid, self.bounds.get(n)) for n, uid in self.scalars.items()),
                tuple(names.index(b) for b in self.betas),
                tuple(pos[n] for n in self.unread), tuple([np.ndarray] + nd), ws, tuple(self.constants.items()),
                tuple(tuple(pos[n] for n in d) for d in self.distinct))


def steady(wrapper, sites, key: tuple, recipe, site_key=None):
    """``wrapper`` (a ``registry.legacy`` function) with steady recipes in front of it, registered
    in its place; ``wrapper`` itself where the extension is not built.  ``sites``: the call-site
    memo the function's Python path fills; ``key``: the parameters of its site key, in order
    (``site_key(values)`` makes that key when it has more in it); ``recipe(*site value)``: a
    ``Recipe`` or None."""
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
            s = sites.get(site_key(ck) if site_key else ck)
        except TypeError:
            return None
        if s is None or s[0] is not EPOCH[0]:
            return None
        r = recipe(*s[1])
        return (s[0], None) if r is None else r.compiled(s[0], pos)

    site = mod.Site(wrapper, registry.HOOKS, EPOCH, len(params), kpos, wrapper.fast_tests, arm, _run, MAXSIZE)
    functools.update_wrapper(site, wrapper)
    site.arm = arm
    registry.LEGACY[wrapper.c_name] = site
    return site
