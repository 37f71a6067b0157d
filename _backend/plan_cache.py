"""Plan cache: an LRU of execution plans keyed by the call signature (architecture.md
"plan_cache").  Thread safe; size from ``CUDNN_COMPAT_PLAN_CACHE_SIZE`` (default 1024)."""
from __future__ import annotations

import os
import threading
from collections import OrderedDict, namedtuple

CacheInfo = namedtuple("CacheInfo", "hits misses maxsize currsize")


class PlanCache:
    def __init__(self, maxsize: "int | None" = None):
        if maxsize is None:
            maxsize = int(os.environ.get("CUDNN_COMPAT_PLAN_CACHE_SIZE", "1024"))
        self.maxsize = max(0, maxsize)
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0

    def get(self, key):
        with self._lock:
            plan = self._d.get(key)
            if plan is None:
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
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
            self.hits = self.misses = 0
        for p in plans:
            p.release()

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self.hits, self.misses, self.maxsize, len(self._d))


CACHE = PlanCache()
