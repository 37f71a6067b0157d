"""Plan cache: an LRU of execution plans keyed by the call signature (docs/architecture.md
"One call, end to end").  Thread safe; size from ``CUDNN_COMPAT_PLAN_CACHE_SIZE`` (default 1024).

Chosen engine configs persist across processes (issue 5): with ``CUDNN_COMPAT_PLAN_CACHE_FILE``
set, an engine that picks a config by timing (the cudnn engine's autotuning) records it with
``remember_config`` and finds it with ``chosen_config`` in a later process, which then skips
the timing; the compiled plans themselves are rebuilt.  See ``ConfigFile``.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import tempfile
import threading
import warnings
from collections import OrderedDict, namedtuple

from . import config as _config

try:  # the writers' lock (_FileLock): filelock where installed (the GPU extras bring it), every OS
    import filelock
except ImportError:
    filelock = None
try:  # without filelock: POSIX flock (the same lock filelock takes there), else none
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: rename alone keeps the file whole
    fcntl = None

CacheInfo = namedtuple("CacheInfo", "hits misses maxsize currsize")


class PlanCache:
    """LRU of plans.  A hit takes no lock: ``OrderedDict.get``/``move_to_end`` are single C calls,
    atomic under the GIL, and the counters are ``itertools.count`` objects (``next`` is atomic
    too), so ``info()`` stays exact with many threads.  Inserts and evictions take the lock."""

    def __init__(self, maxsize: "int | None" = None):
        if maxsize is None:
            maxsize = _config.get("CUDNN_COMPAT_PLAN_CACHE_SIZE")
        self.maxsize = max(0, maxsize)
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.RLock()
        self._hits = itertools.count()
        self._misses = itertools.count()
        self._zero = (0, 0)  # the counts at the last clear()
        # Count a hit that skipped the lookup (a prepared call of a cached plan): the counter's own
        # C method, so the prepared call's count is no Python frame of its own
        self.hit = self._hits.__next__
        # ``touch`` without its Python frame (the compiled prepared call's): KeyError once evicted
        self.touch_or_raise = self._d.move_to_end

    @property
    def hits(self) -> int:
        return _count_of(self._hits) - self._zero[0]

    @property
    def misses(self) -> int:
        return _count_of(self._misses) - self._zero[1]

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

    def touch(self, key) -> None:
        """Mark ``key``'s plan most recently used (nothing when it was evicted since)."""
        try:
            self._d.move_to_end(key)
        except KeyError:
            pass

    def holds(self, key, plan) -> bool:
        """True when ``plan`` is the cached plan of ``key``."""
        return self._d.get(key) is plan

    def put(self, key, plan) -> None:
        if self.maxsize == 0:
            return
        gone = []
        with self._lock:
            old = self._d.get(key)
            if old is not None and old is not plan:  # two threads built this signature: keep the newer
                gone.append(old)
            self._d[key] = plan
            self._d.move_to_end(key)
            while len(self._d) > self.maxsize:
                gone.append(self._d.popitem(last=False)[1])
        for old in gone:
            retire(old)

    def evict(self, key) -> None:
        with self._lock:
            plan = self._d.pop(key, None)
        if plan is not None:
            retire(plan)

    def clear(self) -> None:
        with self._lock:
            plans = list(self._d.values())
            self._d.clear()
            self._zero = (_count_of(self._hits), _count_of(self._misses))
        for p in plans:
            retire(p)

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self.hits, self.misses, self.maxsize, len(self._d))


def _count_of(counter) -> int:
    """The next value of an ``itertools.count`` without advancing it (its repr is 'count(N)')."""
    return int(repr(counter)[6:-1])


# -- plans in use (planner.execute): an evicted plan is released by its last running call ----------------
# Another thread's eviction must not free a plan under a running call (a native plan would crash).
_USE = threading.Lock()


def acquire(plan) -> bool:
    """One more call runs ``plan``; False when it was already released (the caller rebuilds it)."""
    with _USE:
        if plan._released:
            return False
        plan._users += 1
        return True


def done(plan) -> None:
    """The call that acquired ``plan`` finished; release it now if it was evicted meanwhile."""
    with _USE:
        plan._users -= 1
        free = plan._users == 0 and plan.retired and not plan._released
        if free:
            plan._released = True
    if free:
        plan.release()


def retire(plan) -> None:
    """A plan left the cache: release it now, or when its last running call is done (once)."""
    with _USE:
        if plan._released:
            return
        plan.retired = True
        if plan._users > 0:
            return
        plan._released = True
    plan.release()


CACHE = PlanCache()


# -- chosen configs that persist across processes ------------------------------------------------

FILE_ENV = "CUDNN_COMPAT_PLAN_CACHE_FILE"
FILE_FORMAT, FILE_VERSION = "cudnn-compat-plan-cache", 1
MAX_ENTRIES = 20000  # per engine; the oldest are dropped beyond it
log = logging.getLogger("cudnn_compat")


class PlanCacheFileWarning(RuntimeWarning):
    """The plan-cache file could not be read or written; it is ignored (configs are chosen again)."""


class ConfigFile:
    """The JSON file of ``CUDNN_COMPAT_PLAN_CACHE_FILE`` (read again from the environment at each
    use; unset or empty: nothing persists)::

        {"format": "cudnn-compat-plan-cache", "version": 1,
         "entries": {engine: {sha256 of the signature: {"index": int, "knobs": [[name, value], ...],
                                                        "config": str, "note": str, ...}}}}

    Robustness: a missing file is an empty cache; an unreadable, corrupt or foreign file is
    ignored with a ``PlanCacheFileWarning`` (once per version of the file) and replaced at the
    next write.  Writes are atomic (a temporary file in the same folder, then ``os.replace``), so
    a reader never sees half a file; writers from several processes serialize on an advisory
    lock (``<file>.lock``: ``filelock``, else POSIX ``flock``) and merge into what is on disk, so none loses
    another's entries (the writer reads the file again under the lock, whatever its stamp).  The
    file is read again when its inode, size or mtime changed.

    Several GPUs (issue 17, docs/multi_gpu.md): one file may serve every process of a multi-GPU job
    (one process per GPU under torchrun), concurrently.  Entries are valid per kind of GPU: the
    cudnn engine's signatures include the device name, compute capability and libcudnn version
    (``cudnn_engine.autotune.signature``), and each value records them as ``"device"``, so a file
    shared by GPUs of two kinds keeps a choice per kind, and the GPUs of one kind share theirs."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seen: dict = {}  # path -> (_stamp of the file, entries)
        self._warned: set = set()

    @staticmethod
    def path() -> "str | None":
        p = (_config.get(FILE_ENV) or "").strip()
        return os.path.abspath(os.path.expanduser(p)) if p else None

    def _warn(self, what: str, tag) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(f"{FILE_ENV}: {what}; ignoring it", PlanCacheFileWarning, stacklevel=4)
            log.warning("%s: %s; ignoring it", FILE_ENV, what)

    def _read(self, path: str, fresh: bool = False) -> dict:
        """The file's entries ({engine: {key: value}}); {} when missing, unreadable or corrupt.
        ``fresh``: read it even when its stamp is unchanged (a writer, under the lock: another
        process may have replaced it within the file system's timestamp granularity with a file
        of the same size, and merging into a stale copy would drop that process's entry)."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return {}
        except OSError as e:
            self._warn(f"cannot stat {path} ({e})", (path, "stat"))
            return {}
        stamp = _stamp(st)
        seen = self._seen.get(path)
        if seen is not None and seen[0] == stamp and not fresh:
            return seen[1]
        try:
            with open(path, "r", encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            self._warn(f"cannot read {path} ({type(e).__name__}: {e})", (path, stamp))
            doc = None
        entries = {}
        if doc is not None:
            if not (isinstance(doc, dict) and doc.get("format") == FILE_FORMAT and doc.get("version") == FILE_VERSION
                    and isinstance(doc.get("entries"), dict)):
                self._warn(f"{path} is not a version-{FILE_VERSION} {FILE_FORMAT} file", (path, stamp))
            else:
                entries = {e: v for e, v in doc["entries"].items() if isinstance(v, dict)}
        self._seen[path] = (stamp, entries)
        return entries

    def get(self, engine: str, signature: str) -> "dict | None":
        path = self.path()
        if path is None:
            return None
        with self._lock:
            value = self._read(path).get(engine, {}).get(_digest(signature))
        return value if isinstance(value, dict) else None

    def put(self, engine: str, signature: str, value: dict) -> bool:
        """Record ``value`` (JSON-able) for ``signature``; False (with a warning) when the file
        cannot be written."""
        path = self.path()
        if path is None:
            return False
        with self._lock:
            try:
                with _FileLock(path + ".lock"):
                    entries = self._read(path, fresh=True)
                    mine = dict(entries.get(engine, {}))
                    mine.pop(_digest(signature), None)
                    mine[_digest(signature)] = value
                    while len(mine) > MAX_ENTRIES:
                        mine.pop(next(iter(mine)))
                    entries = dict(entries, **{engine: mine})
                    _atomic_write(path, {"format": FILE_FORMAT, "version": FILE_VERSION, "entries": entries})
                    self._seen[path] = (_stamp(os.stat(path)), entries)
            except OSError as e:
                self._warn(f"cannot write {path} ({type(e).__name__}: {e})", (path, "write"))
                return False
        return True

    def forget(self) -> None:
        """Drop what was read (tests: behave like a new process)."""
        with self._lock:
            self._seen.clear()
            self._warned.clear()


def _stamp(st) -> tuple:
    """What says the file changed: every write is a new file (``os.replace``), so a new inode."""
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _digest(signature: str) -> str:
    return hashlib.sha256(signature.encode("utf-8")).hexdigest()


def _atomic_write(path: str, doc: dict) -> None:
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=0, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class _FileLock:
    """An exclusive lock on ``path`` (created when missing): ``filelock.FileLock`` where filelock
    is installed (a dependency of the GPU extras: flock on POSIX, LockFileEx on Windows, so no
    writer loses another's entry on either); without it POSIX ``flock`` directly (the same lock,
    so processes with and without filelock exclude each other), else none (Windows without
    filelock: ``os.replace`` alone keeps the file whole, a concurrent writer may lose an entry,
    which is only timed again).  No default location (``platformdirs``): the file is opt-in, at
    the path ``CUDNN_COMPAT_PLAN_CACHE_FILE`` names, so nothing is written to a disk unasked."""

    def __init__(self, path: str):
        self.path, self.fd, self.lock = path, None, None

    def __enter__(self):
        if filelock is not None:
            folder = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(folder):  # filelock would create it: nothing is written where not asked
                raise FileNotFoundError(2, "No such file or directory", folder)
            self.lock = filelock.FileLock(self.path)
            self.lock.acquire()
        elif fcntl is not None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


CONFIG_FILE = ConfigFile()


def chosen_config(engine: str, signature: str, candidates) -> "object | None":
    """The config recorded for ``signature`` in the plan-cache file, as the matching member of
    ``candidates`` (EngineConfigs: same engine global index and knob choices); None when there
    is no file, no entry, or the entry names none of the candidates (stale)."""
    value = CONFIG_FILE.get(engine, signature)
    if value is None:
        return None
    try:
        index = int(value["index"])
        knobs = tuple(sorted((str(n), int(v)) for n, v in value.get("knobs", ())))
    except (KeyError, TypeError, ValueError):
        return None
    for cfg in candidates:
        if cfg.index == index and tuple(sorted(cfg.knobs)) == knobs:
            return cfg
    return None


def remember_config(engine: str, signature: str, cfg, **extra) -> bool:
    """Record ``cfg`` (an EngineConfig) as the choice for ``signature``; ``extra``: JSON-able
    notes kept with it (timings, a description).  False when nothing was written."""
    value = {"index": int(cfg.index), "knobs": [[str(n), int(v)] for n, v in cfg.knobs], "config": str(cfg)}
    value.update(extra)
    return CONFIG_FILE.put(engine, signature, value)
