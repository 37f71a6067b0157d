"""Plan cache: an LRU of execution plans keyed by the call signature (architecture.md
"plan_cache").  Thread safe; size from ``CUDNN_COMPAT_PLAN_CACHE_SIZE`` (default 1024)."""
from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict, namedtuple

CacheInfo = namedtuple("CacheInfo", "hits misses maxsize currsize")


class PlanCache:
    """LRU of plans.  A hit takes no lock: ``OrderedDict.get``/``move_to_end`` are single C calls,
    atomic under the GIL, and the counters are ``itertools.count`` objects (``next`` is atomic
    too), so ``info()`` stays exact with many threads.  Inserts and evictions take the lock."""

    def __init__(self, maxsize: "int | None" = None):
        if maxsize is None:
            maxsize = int(os.environ.get("CUDNN_COMPAT_PLAN_CACHE_SIZE", "1024"))
        self.maxsize = max(0, maxsize)
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.RLock()
        self._hits = itertools.count()
        self._misses = itertools.count()

    @property
    def hits(self) -> int:
        return _count_of(self._hits)

    @property
    def misses(self) -> int:
        return _count_of(self._misses)

    def get(self, key):
        plan = self._d.get(key)
        if plan is None:
            next(self._misses)
            return None
        try:
            self._d.move_to_end(key)
        except KeyError:  # evicted by another thread since the lookup: still a valid plan for this call
            pass
        next(self._hits)
        return plan

    def put(self, key, plan) -> None:
        if self.maxsize == 0:
            return
        with self._lock:
            self._d[key] = plan
            self._d.move_to_end(key)
            while len(self._d) > self.maxsize:
                _, old = self._d.popitem(last=False)
                old.release()

    def evict(self, key) -> None:
        with self._lock:
            plan = self._d.pop(key, None)
        if plan is not None:
            plan.release()

    def clear(self) -> None:
        with self._lock:
            plans = list(self._d.values())
            self._d.clear()
            self._hits, self._misses = itertools.count(), itertools.count()
        for p in plans:
            p.release()

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self.hits, self.misses, self.maxsize, len(self._d))


def _count_of(counter) -> int:
    """The next value of an ``itertools.count`` without advancing it (its repr is 'count(N)')."""
    return int(repr(counter)[6:-1])


CACHE = PlanCache()
