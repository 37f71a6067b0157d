"""Descriptor and handle objects usable as ints, as CuPy 13 passed them.

Every descriptor is an ``int`` subclass whose value is a unique id; functions take
the object or its id.  ``resolve`` turns an argument back into the live object and
rejects NULL, unknown, stale (destroyed) and wrong-type ids with BAD_PARAM.  A
descriptor's ``key()`` is the tuple of its settings, used in plan-cache signatures.

Copies (issue 13, item 6): a descriptor or handle is a reference to state of this process.
``copy``/``deepcopy`` return the object itself; ``pickle`` gives back the same live object in the
same process, and a dead one (BAD_PARAM in every call, saying why) when it was destroyed
meanwhile or when loaded in another process (a ``ProcessPoolExecutor`` worker).  Nothing brings
a destroyed descriptor back.
"""
from __future__ import annotations

import itertools
import os
import secrets
import threading
from collections import OrderedDict

from ..errors import CuDNNError, bad_param

_ids = itertools.count(0x1000)
_LIVE: dict = {}
_DEAD: OrderedDict = OrderedDict()  # recently destroyed ids -> why (None: destroyed), bounded so memory stays flat
_DEAD_MAX = 4096
_lock = threading.Lock()
_PROCESS_TOKEN = secrets.randbits(64)  # with os.getpid(): "made in this process" (a fork has another pid)
# EPOCH[0] takes a new value (never one it had) after any descriptor's or handle's settings change and
# after any destroy: what a call site resolved and checked from its descriptor arguments stays valid
# while EPOCH[0] is the value read before resolving them (_memo "call sites").  Changes first, then
# the new value, so a value read before a change never outlives it.
_EPOCHS = itertools.count(1)
EPOCH = [0]


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
        state = (" dead" if self.__dict__.get("dead") else " destroyed" if int(self) not in _LIVE
                 else "" if self.is_set else " unset")
        return f"<{type(self).__name__} {int(self):#x}{state}>"

    def touched(self):
        """Call after every setter: the settings changed."""
        self.is_set = True
        self._key = None
        EPOCH[0] = next(_EPOCHS)

    def changed(self):
        """Call after a setter that changes a setting without marking the descriptor set."""
        self._key = None
        EPOCH[0] = next(_EPOCHS)

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
            _mark_dead(int(self), None)
        EPOCH[0] = next(_EPOCHS)

    # -- copies: a descriptor is a reference to process-local state, like CuPy 13's int pointer ----
    # copy/deepcopy give the same object (a destroyed one stays destroyed).  pickle records the id,
    # the type and the process: unpickled in the same process while it lives, it is the same live
    # object; otherwise (destroyed meanwhile, or another process, a fork included) it is a dead
    # descriptor of the same type that never resolves: every call taking it is BAD_PARAM saying why.

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return (_unpickle, (type(self), int(self), os.getpid(), _PROCESS_TOKEN))


def _mark_dead(ident: int, why) -> None:
    """Record ``ident`` as never live again (caller holds ``_lock``)."""
    _DEAD[ident] = why
    if len(_DEAD) > _DEAD_MAX:
        _DEAD.popitem(last=False)


def _dead(cls, ident: int, why):
    """An object of ``cls`` with id ``ident`` that is not (and never becomes) live."""
    obj = int.__new__(cls, ident)
    obj.__dict__.update(_key=None, is_set=False, dead=why or "was destroyed")
    return obj


def _unpickle(cls, ident: int, pid: int, token: int):
    """Inverse of ``Descriptor.__reduce__`` (see the comment there)."""
    with _lock:
        if pid == os.getpid() and token == _PROCESS_TOKEN:
            obj = _LIVE.get(ident)
            if obj is not None and type(obj) is cls:
                return obj
            # destroyed before this copy was loaded; ids are never reused, so this one stays dead
            return _dead(cls, ident, _DEAD.get(ident))
        new = next(_ids)  # a fresh id: the sender's id may be a live descriptor here
        why = (f"is a pickled copy of {cls.kind} {ident:#x} of process {pid}; descriptors and handles are "
               f"process-local (create a new one in this process)")
        _mark_dead(new, why)
    return _dead(cls, new, why)


def resolve(arg, cls, argname: str, need_set: bool = True):
    """The live ``cls`` object for ``arg`` (object or int id), or BAD_PARAM."""
    try:
        obj = _LIVE.get(arg)
    except TypeError:  # unhashable (a list, an array...): not a descriptor, BAD_PARAM below (issue 13)
        obj = None
    if obj is not None and type(obj) is cls and (obj.is_set or not need_set):
        return obj  # the common case: a live, set descriptor of exactly this type
    if arg is None or (isinstance(arg, int) and int(arg) == 0):
        raise bad_param(argname, f"is NULL; a {cls.kind} is required")
    obj = arg if isinstance(arg, cls) else _LIVE.get(int(arg)) if isinstance(arg, int) else None
    if obj is None or int(obj) not in _LIVE:
        if isinstance(arg, int) and int(arg) in _DEAD:
            raise bad_param(argname, f"{cls.kind} {int(arg):#x} {_DEAD[int(arg)] or 'was destroyed'}")
        if getattr(arg, "dead", None):  # a dead copy whose id aged out of _DEAD
            raise bad_param(argname, f"{cls.kind} {int(arg):#x} {arg.dead}")
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
