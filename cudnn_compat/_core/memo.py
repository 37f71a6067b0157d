"""What a legacy call's descriptors fix, worked out once per combination of their settings (issue 14
item 3: no re-derivation per call of what the signature already fixed).

A compute function validates its descriptors against 002's rules, derives the graph attributes,
the data type of alpha/beta and the plan-cache key.  All of that depends only on the descriptors'
settings (and enum arguments), so a ``Memo`` keeps the result keyed by the identities of the
descriptors' ``key()`` tuples (``key``): a descriptor's key tuple is made anew whenever a setter
changes it (``Descriptor.touched`` drops it), and every entry holds the tuples it was made from
(``keep``), so an id in a live entry can only name that tuple.  The first call with a combination
runs the function's full checks in their usual order (data-dependent ones included) and stores
the entry; later calls make only the checks that depend on the data (in-place pointer rules) and
use the entry.  Descriptors are still resolved on every call (NULL, destroyed, wrong type:
BAD_PARAM), and a full memo is cleared rather than trimmed (ids of dropped tuples may be reused).

    mk = (mode, id(xd._key or xd.key()), id(yd._key or yd.key()))
    m = MEMO.get(mk)
    if m is None:
        mk, m = MEMO.canonical((mode,), (xd, yd))
    if m is None:
        ... the full checks ...
        m = MEMO.put(mk, (values...), keep=(xd.key(), yd.key()))

Call sites.  A program calls a function with the same handle and descriptor arguments over and
over; a ``Memo`` used as a *site* memo maps that argument tuple (the objects or ids as passed, with
the enum arguments) to ``(EPOCH[0], (resolved objects, memo entry))``.  ``_descriptor.EPOCH[0]``
takes a new value whenever any descriptor or handle is set, changed or destroyed, so an entry whose
stamp ``is`` the current value was made from exactly the settings the descriptors have now: the
call skips resolving them and the memo lookup (the checks whose inputs they are), and still makes
every check that depends on the data.  ``call_site(SITES)`` makes a family's resolver (resolve,
memo lookup, the first call's checks) into the function the call makes, with the lookup in front:

    @call_site(SITES)
    def _site(handle, mode, xDesc, x, yDesc, y):  # called as _site(sk, handle, mode, xDesc, x, yDesc, y)
        h, xd, yd = get_handle(handle), tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, "yDesc")
        mk, m = MEMO.lookup((mode,), (xd, yd))
        if m is None:
            ... the full checks (above) ...
        return h, xd, yd, m

    sk = (handle, mode, xDesc, yDesc)
    h, xd, yd, m = _site(sk, handle, mode, xDesc, x, yDesc, y)

The stamp is read before resolving, so a change racing with the first call leaves a stale stamp,
never a stale entry; an unhashable argument gets no entry (resolving it says what it is); a value
whose last item (the memo entry) is None is returned but not remembered (a call that must take
the general way, as a batch-norm call of settings not seen yet).
"""
from __future__ import annotations

import functools
import inspect

from . import generated as _generated
from .descriptor import EPOCH  # the call sites' validity stamp (see "Call sites" above)

MAXSIZE = 512  # entries per function
MEMOS: list = []


def key(prefix: tuple, descs) -> tuple:
    """The memo key of enum arguments ``prefix`` and descriptors ``descs``: the identities of the
    descriptors' current key tuples.  The families' cached paths inline this expression (a call
    per lookup costs more than the lookup)."""
    return prefix + tuple(id(d._key or d.key()) for d in descs)


class Memo(dict):
    """key -> value; ``put`` also keeps the descriptors' key tuples the key's ids name."""

    __slots__ = ("name", "_keep")

    def __init__(self, name: str = ""):
        super().__init__()
        self.name = name
        self._keep: dict = {}
        MEMOS.append(self)

    def put(self, key, value, keep: tuple):
        if len(self) >= MAXSIZE:
            self.clear()
        self[key] = value
        self._keep[key] = keep
        return value

    def clear(self) -> None:
        super().clear()
        self._keep.clear()

    def canonical(self, prefix: tuple, descs: tuple):
        """(memo key, entry or None) after interning the descriptors' key tuples: descriptors
        made anew with settings seen before (a program that creates its descriptors per call)
        then share one key tuple, hence one entry, and the memo does not grow with them."""
        for d in descs:
            k = d.key()
            c = _INTERN.get(k)
            if c is None:
                if len(_INTERN) >= INTERN_MAX:
                    _INTERN.clear()
                c = _INTERN[k] = k
            d._key = c
        mk = prefix + tuple(id(d._key) for d in descs)
        return mk, self.get(mk)

    def lookup(self, prefix: tuple, descs: tuple):
        """(memo key, entry or None) of enum arguments ``prefix`` and descriptors ``descs``: the
        lookup above as one call (``key``, then ``canonical`` on a miss), for the paths a call
        site entry skips."""
        mk = prefix + tuple([id(d._key or d.key()) for d in descs])
        m = self.get(mk)
        if m is None:
            mk, m = self.canonical(prefix, descs)
        return mk, m


def call_site(sites: "Memo"):
    """Decorator: the call-site resolver ``resolve(p1, p2, ...) -> value`` (plain positional
    parameters; ``value`` a tuple, its last item the memo entry) becomes ``site(sk, p1, p2, ...)``:
    ``value`` as remembered in ``sites`` for the arguments ``sk`` while its stamp is EPOCH[0],
    else ``resolve(p1, p2, ...)``, remembered as of the EPOCH[0] read before it ran unless ``sk``
    is unhashable or the value's last item is None (see "Call sites" above).  The wrapper is the
    one function a hit calls, made (``_SITE``) with the resolver's own parameters: a ``*args``
    wrapper builds a tuple per call (+40 ns a hit on a 2.4 GHz core; this one costs what the
    ``site_get`` call it replaced did).  ``__wrapped__`` is the resolver, ``sites`` the memo."""
    def wrap(resolve):
        params = inspect.signature(resolve).parameters
        names = tuple(params)
        if any(p.kind is not p.POSITIONAL_OR_KEYWORD or p.default is not p.empty for p in params.values()) \
                or set(names) & _SITE_NAMES:
            raise TypeError(f"call_site: {resolve.__qualname__} needs plain positional parameters "
                            f"other than {sorted(_SITE_NAMES)}")
        ns = {"get": sites.get, "put": sites.put, "EPOCH": EPOCH, "resolve": resolve}
        site = _generated.define(f"<call_site {resolve.__qualname__}>", _SITE.format(args=", ".join(names)), ns, "site")
        site = functools.update_wrapper(site, resolve)
        site.sites = sites
        return site
    return wrap


_SITE = """
def site(sk, {args}):
    try:
        s = get(sk)
    except TypeError:  # an unhashable argument: no entry (resolving it says what it is)
        return resolve({args})
    if s is not None and s[0] is EPOCH[0]:
        return s[1]
    stamp = EPOCH[0]  # before resolving: a change racing with this call leaves a stale stamp
    value = resolve({args})
    if value[-1] is not None:
        put(sk, (stamp, value), ())
    return value
"""
_SITE_NAMES = frozenset(("sk", "s", "stamp", "value", "get", "put", "resolve", "EPOCH"))


INTERN_MAX = 4096
_INTERN: dict = {}  # descriptor key tuple -> the one equal tuple descriptors of those settings share


def clear_all() -> None:
    """Forget every entry (tests)."""
    for m in MEMOS:
        m.clear()


# -- data arguments that are not NULL --------------------------------------------------------------

_ARRAY_TYPES: set = set()


def arrays(args) -> bool:
    """True when no data argument in ``args`` is NULL (None or the int 0, as the families'
    ``_null`` says), so the per-argument NULL checks of a call can be skipped; arrays (NumPy,
    CuPy) are recognised by type in one C call."""
    t = _ARRAY_TYPES
    if t.issuperset(map(type, args)):
        return True
    from .data import _CUPY_NDARRAY
    import numpy as np
    t |= {np.ndarray} | set(_CUPY_NDARRAY[:1])
    for a in args:
        if a is None or (isinstance(a, int) and not isinstance(a, bool) and a == 0):
            return False
    return True
