"""Descriptor and handle objects usable as ints, as CuPy 13 passed them.

Every descriptor is an ``int`` subclass whose value is a unique id; functions take
the object or its id.  ``resolve`` turns an argument back into the live object and
rejects NULL, unknown, stale (destroyed) and wrong-type ids with BAD_PARAM.  A
descriptor's ``key()`` is the tuple of its settings, used in plan-cache signatures.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict

from .errors import CuDNNError, bad_param

_ids = itertools.count(0x1000)
_LIVE: dict = {}
_DEAD: OrderedDict = OrderedDict()  # recently destroyed ids, bounded so memory stays flat
_DEAD_MAX = 4096
_lock = threading.Lock()


class Descriptor(int):
    kind = "descriptor"

    def __new__(cls, *args, **kwargs):
        with _lock:
            obj = int.__new__(cls, next(_ids))
            _LIVE[int(obj)] = obj
        return obj

    def __init__(self):
        self._key = None
        self.is_set = False

    def __repr__(self):
        return f"<{type(self).__name__} {int(self):#x}{'' if self.is_set else ' unset'}>"

    def touched(self):
        """Call after every setter: the settings changed."""
        self.is_set = True
        self._key = None

    def key(self) -> tuple:
        if self._key is None:
            self._key = (type(self).__name__,) + tuple(self._settings())
        return self._key

    def _settings(self):  # pragma: no cover - overridden
        return ()

    def destroy(self):
        with _lock:
            if _LIVE.pop(int(self), None) is None:
                raise bad_param(self.kind, "was already destroyed")
            _DEAD[int(self)] = None
            if len(_DEAD) > _DEAD_MAX:
                _DEAD.popitem(last=False)


def resolve(arg, cls, argname: str, need_set: bool = True):
    """The live ``cls`` object for ``arg`` (object or int id), or BAD_PARAM."""
    obj = _LIVE.get(arg)
    if obj is not None and type(obj) is cls and (obj.is_set or not need_set):
        return obj  # the common case: a live, set descriptor of exactly this type
    if arg is None or (isinstance(arg, int) and int(arg) == 0):
        raise bad_param(argname, f"is NULL; a {cls.kind} is required")
    obj = arg if isinstance(arg, cls) else _LIVE.get(int(arg)) if isinstance(arg, int) else None
    if obj is None or int(obj) not in _LIVE:
        if isinstance(arg, int) and int(arg) in _DEAD:
            raise bad_param(argname, f"{cls.kind} {int(arg):#x} was destroyed")
        raise bad_param(argname, f"is not a {cls.kind} (got {arg!r})")
    if not isinstance(obj, cls):
        raise bad_param(argname, f"is a {obj.kind}, not a {cls.kind}")
    if need_set and not obj.is_set:
        raise bad_param(argname, f"{cls.kind} was created but never set")
    return obj


def optional(arg, cls, argname: str):
    """Like ``resolve`` but None/0 gives None (a NULL descriptor that the call allows)."""
    if arg is None or (isinstance(arg, int) and int(arg) == 0):
        return None
    return resolve(arg, cls, argname)


def live_count() -> int:
    return len(_LIVE)


__all__ = ["Descriptor", "resolve", "optional", "CuDNNError"]
