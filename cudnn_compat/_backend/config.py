"""Every environment variable cudnn-compat reads, in one table (issue 13, item 11).

``VARIABLES`` declares each ``CUDNN_COMPAT_*`` variable (name, default, parser, doc), plus the
variables of the test suite and the external ones the library honours but does not own
(read through ``get`` like ours; shown by ``cudnn-compat doctor``).  Code reads a
setting with ``get(name)``: the parsed value, or the default when the variable is unset, empty
or not understood.  A value that is not understood never raises: it warns once
(``ConfigWarning``, through the ``warnings`` module) naming the variable, the value, the rule
and the default used instead, so ``import cudnn_compat`` and ``cudnn-compat doctor`` always run.

This is the only module that reads the process environment (``tests/test_config_only_reader.py``
walks the package and fails on any other reader); the external variables are read here too,
with ``get`` like ours.  Values are read from the environment at each ``get`` (the variable may
change at run time: ``monkeypatch.setenv``) but parsed and validated once per distinct value; an
unchanged variable costs two dict lookups.  ``override(name, value)`` is a scoped stand-in for
setting the variable (``cudnn-compat replay --engine``): ``get``, ``getter``, ``setting`` and
``unset_fast`` honour it, the environment is not touched.  ``unset_fast(*names)`` is the per-call
test of the hot paths (planner, prepared calls, launch records): True while none of the names is set
or overridden, so their defaults apply without a ``get``.  ``report()`` is what the doctor
prints: every variable, its raw value, the value used and whether it was understood.
``reload()`` forgets the parsed values and the warnings given (tests).

This module is part of ``_backend`` and imports nothing from ``cudnn_compat``.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable


class ConfigWarning(RuntimeWarning):
    """An environment variable of cudnn-compat has a value that is not understood; the default is used."""


# -- parsers: raw string (stripped, non-empty) -> value, or ValueError(the rule broken) -----------

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def boolean(raw: str) -> bool:
    v = raw.lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"must be one of {', '.join(_TRUE + _FALSE)}")


def int_at_least(lo: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            v = int(raw, 10)
        except ValueError:
            raise ValueError(f"must be an integer >= {lo}") from None
        if v < lo:
            raise ValueError(f"must be an integer >= {lo}")
        return v
    parse.__doc__ = f"an integer >= {lo}"
    return parse


def int_clipped(lo: int, hi: int) -> Callable[[str], int]:
    """An integer, clipped into [lo, hi] (cuDNN 9's CUDNN_LOGLEVEL_DBG: out-of-range values clip)."""
    def parse(raw: str) -> int:
        try:
            v = int(raw, 10)
        except ValueError:
            raise ValueError(f"must be an integer ({lo}..{hi}; others are clipped)") from None
        return min(max(v, lo), hi)
    parse.__doc__ = f"an integer clipped to {lo}..{hi}"
    return parse


def choice(*values: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        v = raw.lower()
        if v not in values:
            raise ValueError(f"must be one of {', '.join(values)}")
        return v
    parse.__doc__ = "|".join(values)
    return parse


def text(raw: str) -> str:
    return raw


def name(raw: str) -> str:
    if not all(c.isalnum() or c in "_-." for c in raw):
        raise ValueError("must be an engine name (letters, digits, '_', '-', '.')")
    return raw


def path(raw: str) -> str:
    return os.path.expanduser(raw)


def new_file(raw: str) -> str:
    """A file to create: its folder must exist and be writable."""
    p = os.path.abspath(os.path.expanduser(raw))
    folder = os.path.dirname(p)
    if not os.path.isdir(folder):
        raise ValueError(f"its folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"its folder {folder} is not writable")
    if os.path.isdir(p):
        raise ValueError(f"{p} is a folder, not a file")
    return p


def shim_mode(raw: str) -> str:
    v = raw.lower()
    if v == "stub":
        return "stub"
    try:
        return "on" if boolean(v) else "off"
    except ValueError:
        raise ValueError(f"must be stub or one of {', '.join(_TRUE + _FALSE)}") from None


def log_level(raw: str) -> str:
    return choice("debug", "info", "warning", "error", "critical")(raw)


# -- the table ------------------------------------------------------------------------------------

LIBRARY, TESTS, EXTERNAL = "library", "tests", "external"


@dataclass(frozen=True)
class Variable:
    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str
    values: str  # the accepted values, for the README and the doctor
    scope: str = LIBRARY  # library | tests (read by the test suite) | external (not ours; read-only here)


VARIABLES = (
    Variable("CUDNN_COMPAT_DEVICE", None, choice("cpu", "gpu"),
             "where new handles run (unset: the GPU when CuPy sees one, else the CPU)", "cpu|gpu"),
    Variable("CUDNN_COMPAT_ENGINE", None, name,
             "force one engine (reference, cupy, cudnn); a graph it declines, or an unknown name, is NOT_SUPPORTED",
             "engine name"),
    Variable("CUDNN_COMPAT_CPU_FALLBACK", True, boolean,
             "on a GPU handle, a graph no GPU engine runs goes to the CPU reference engine (one "
             "CpuFallbackWarning per call signature); 0: it is NOT_SUPPORTED, naming each engine's reason", "1|0"),
    Variable("CUDNN_COMPAT_PLAN_CACHE_SIZE", 1024, int_at_least(0), "plan cache bound (plans kept per process)",
             "N >= 0"),
    Variable("CUDNN_COMPAT_PLAN_CACHE_FILE", None, path,
             "JSON file where configs chosen by timing persist across processes (problems: PlanCacheFileWarning)",
             "path"),
    Variable("CUDNN_COMPAT_LOG", None, log_level,
             "log each new call signature's graph, the engines that declined it and why, the config chosen",
             "debug|info|warning|error|critical"),
    Variable("CUDNN_COMPAT_TRACE", None, new_file, "record every legacy call of the run to this JSON-lines file",
             "path (its folder must exist)"),
    Variable("CUDNN_COMPAT_TRACE_TENSORS", False, boolean,
             "with CUDNN_COMPAT_TRACE: also save every call's tensors (an .npz next to the trace) for replay",
             "1|0"),
    Variable("CUDNN_COMPAT_SHIM", "off", shim_mode,
             "with `cudnn-compat install-shim`'s .pth: install the CuPy 13 cuDNN modules at start-up "
             "(stub: also without CuPy)", "1|0|stub"),
    Variable("CUDNN_COMPAT_DUMP_KERNELS", None, path, "write every CUDA kernel the cupy engine compiles, and every "
             "generated Python function (legacy wrappers, plan binders), to this folder", "folder"),
    Variable("CUDNN_COMPAT_RNN_GRAPHS", True, boolean, "cupy engine: replay RNN recurrences as CUDA graphs", "1|0"),
    Variable("CUDNN_COMPAT_COMPILED", True, boolean, "the compiled steady path of prepared calls (_backend/_steady.c) "
             "where it is built; 0: its Python twins (the same checks and launches, more host time per call)", "1|0"),
    Variable("CUDNN_COMPAT_CUPY_GRAPHS", False, boolean, "cupy engine: replay cached launch records as CUDA graphs "
             "(less host time per call; off: at batch 32 the ResNet-50 step ran slower with it)", "1|0"),
    Variable("CUDNN_COMPAT_CUDNN_GRAPHS", True, boolean, "cudnn engine: replay cached plans as CUDA graphs", "1|0"),
    Variable("CUDNN_COMPAT_GRAPH_REPLAY", "kernels", choice("kernels", "graph"),
             "cudnn engine: on the legacy default stream, replay a captured call as the graph's kernel launches "
             "(a graph of at most 4 kernels and memsets, where _steady.c is built) or as one graph launch",
             "kernels|graph"),
    Variable("CUDNN_COMPAT_CUDNN_AUTOTUNE", None, int_at_least(1),
             "cudnn engine: configs timed per graph (unset: every config of a plain convolution, 3 for fused "
             "graphs; N: mode A's first N and N more)", "N >= 1"),
    Variable("CUDNN_COMPAT_FUZZ_EXAMPLES", 0, int_at_least(0),
             "test suite: total fuzz cases over the suite (0: the CI size, CUDNN_COMPAT_FUZZ_CI per weight)", "N >= 0",
             TESTS),
    Variable("CUDNN_COMPAT_FUZZ_BATCH", 1, int_at_least(1), "test suite: fuzz cases per hypothesis example", "N >= 1",
             TESTS),
    Variable("CUDNN_COMPAT_FUZZ_CI", 40, int_at_least(0), "test suite: fuzz cases per property weight in CI", "N >= 0",
             TESTS),
    Variable("CUDNN_COMPAT_FUZZ_PLACE", "cpu", choice("cpu", "gpu"), "test suite: the place the fuzz tests run on",
             "cpu|gpu", TESTS),
    Variable("CUDNN_COMPAT_LEAK_CYCLES", 2000, int_at_least(1), "test suite: create/destroy cycles per type of the "
             "leak tests", "N >= 1", TESTS),
    Variable("NVIDIA_TF32_OVERRIDE", None, choice("0", "1"),
             "NVIDIA's switch, honoured as cuDNN and cuBLAS do: 0 turns TF32 off everywhere", "0", EXTERNAL),
    Variable("CUDNN_LOGDEST_DBG", None, text, "cuDNN's log destination, honoured by the default callback "
             "(cudnnSetCallback; unset: silent); %i in a file name is the process id", "stdout|stderr|path",
             EXTERNAL),
    # cuDNN 9's nested level (0 off, 1 errors, 2 + warnings, 3 + API calls); when set it replaces
    # cuDNN 8's three variables below (cudnn_compat/_core/log.py)
    Variable("CUDNN_LOGLEVEL_DBG", None, int_clipped(0, 3), "cuDNN 9's log level, to CUDNN_LOGDEST_DBG: 0 off, "
             "1 errors, 2 warnings and errors, 3 also every legacy call (INFO); set, it replaces the "
             "CUDNN_LOG{INFO,WARN,ERR}_DBG variables", "0|1|2|3", EXTERNAL),
    # cuDNN 8's API logging levels (cudnn_compat/_core/log.py): with CUDNN_LOGDEST_DBG set, each
    # enables its severity on the cudnn_compat logger's built-in callback at import
    Variable("CUDNN_LOGINFO_DBG", False, boolean, "cuDNN's API logging: every legacy call and its status, "
             "at INFO, to CUDNN_LOGDEST_DBG", "1|0", EXTERNAL),
    Variable("CUDNN_LOGWARN_DBG", False, boolean, "cuDNN's warning log: the library's warnings, to "
             "CUDNN_LOGDEST_DBG", "1|0", EXTERNAL),
    Variable("CUDNN_LOGERR_DBG", False, boolean, "cuDNN's error log: each failed legacy call's message, to "
             "CUDNN_LOGDEST_DBG", "1|0", EXTERNAL),
)
TABLE = {v.name: v for v in VARIABLES}


# -- reading --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """One variable as read now: ``raw`` (None when unset), ``value`` (the one used),
    ``understood`` (False when the raw value was rejected and the default used), ``problem``."""
    name: str
    raw: "str | None"
    value: Any
    understood: bool
    problem: str = ""

    @property
    def is_set(self) -> bool:
        return self.raw is not None and self.raw.strip() != ""


_ENV = getattr(os.environ, "_data", None)  # POSIX: os.environ's own dict, updated by every os.environ write
_ENCODE = getattr(os.environ, "encodekey", None)
_DECODE = getattr(os.environ, "decodevalue", None)
if not (isinstance(_ENV, dict) and _ENCODE and _DECODE):  # pragma: no cover - not POSIX
    _ENV = None
_KEYS = {v.name: _ENCODE(v.name) for v in VARIABLES} if _ENV is not None else {}
_cache: dict = {}  # name -> (raw as stored in os.environ, Setting)
_overrides: dict = {}  # name -> raw value in force (None: as if unset) while an override() of it is active
_layers: dict = {}  # name -> [(token, raw)] of the active overrides, the last in force
_ocache: dict = {}  # (name, raw) -> Setting of an overridden value
_NONE = object()
_warned: set = set()
_lock = threading.Lock()


def _raw_now(name: str):
    """The variable's value as os.environ stores it (bytes on POSIX), or None."""
    if _ENV is not None:
        return _ENV.get(_KEYS[name])
    return os.environ.get(name)


def _decode(stored) -> "str | None":
    if stored is None or isinstance(stored, str):
        return stored
    return _DECODE(stored)


def _parse(var: Variable, stored) -> Setting:
    raw = _decode(stored)
    if raw is None or raw.strip() == "":
        return Setting(var.name, raw, var.default, True)
    try:
        return Setting(var.name, raw, var.parse(raw.strip()), True)
    except (ValueError, OSError) as e:
        problem = str(e) or type(e).__name__
        setting = Setting(var.name, raw, var.default, False, problem)
    with _lock:
        first = (var.name, raw) not in _warned
        _warned.add((var.name, raw))
    if first:
        default = "unset" if var.default is None else repr(var.default)
        warnings.warn(f"{var.name}={raw!r} is not understood ({problem}); using the default ({default})",
                      ConfigWarning, stacklevel=4)
    return setting


def _overridden(name: str):
    """The ``Setting`` of ``name`` under an active ``override``, or None when it has none."""
    raw = _overrides.get(name, _NONE)
    if raw is _NONE:
        return None
    key = (name, raw)
    s = _ocache.get(key)
    if s is None:
        s = _ocache[key] = _parse(TABLE[name], raw)
    return s


def setting(name: str) -> Setting:
    """The ``Setting`` of ``name`` (a name of VARIABLES) as the environment holds it now (or as an
    active ``override`` sets it)."""
    if _overrides:
        s = _overridden(name)
        if s is not None:
            return s
    stored = _raw_now(name)
    hit = _cache.get(name)
    if hit is not None and hit[0] is stored:
        return hit[1]
    s = _parse(TABLE[name], stored)
    _cache[name] = (stored, s)
    return s


def get(name: str):
    """The value of ``name`` to use: parsed, or the default when unset, empty or not understood."""
    if _overrides:
        return setting(name).value
    stored = _ENV.get(_KEYS[name]) if _ENV is not None else os.environ.get(name)
    hit = _cache.get(name)
    if hit is not None and hit[0] is stored:
        return hit[1].value
    return setting(name).value


def getter(name: str) -> Callable[[], Any]:
    """``get(name)`` as a closure with the lookups bound (for per-call paths)."""
    if _ENV is None:  # pragma: no cover - not POSIX
        return lambda: get(name)
    env, key, cache, ov = _ENV, _KEYS[name], _cache, _overrides
    TABLE[name]  # noqa: B018 - KeyError for an undeclared name, now rather than at the first call

    def read():
        if ov:
            return setting(name).value
        stored = env.get(key)
        hit = cache.get(name)
        if hit is not None and hit[0] is stored:
            return hit[1].value
        return setting(name).value
    return read


@contextlib.contextmanager
def override(name: str, value: "str | None"):
    """Within the block, read ``name`` as if the environment held ``value`` (a string, parsed and
    validated like the environment's; None: as if unset), without touching the environment.
    Process-wide, as the environment is.  Blocks nest and may overlap across threads: each one's
    exit removes its own value, and the latest value still active is in force."""
    TABLE[name]  # noqa: B018 - KeyError for an undeclared name
    if value is not None and not isinstance(value, str):
        raise TypeError(f"override({name!r}, ...): the value must be a string or None, got {type(value).__name__}")
    token = object()
    with _lock:
        _layers.setdefault(name, []).append((token, value))
        _overrides[name] = value
    try:
        yield
    finally:
        with _lock:
            stack = [e for e in _layers.get(name, ()) if e[0] is not token]
            if stack:
                _layers[name] = stack
                _overrides[name] = stack[-1][1]
            else:
                _layers.pop(name, None)
                _overrides.pop(name, None)


def unset_parts(*names: str) -> tuple:
    """(env, keys, overrides): ``unset_fast(*names)``'s test in pieces, for the one or two hottest
    paths that inline it rather than pay a call: ``not overrides and k not in env`` for every key
    in ``keys`` is the same test (never true off POSIX, where ``env`` holds every key)."""
    for n in names:
        TABLE[n]  # noqa: B018 - KeyError for an undeclared name, now rather than at the first call
    if _ENV is None:  # pragma: no cover - not POSIX
        return {n: None for n in names}, names, _overrides
    return _ENV, tuple(_KEYS[n] for n in names), _overrides


def unset_fast(*names: str) -> Callable[[], bool]:
    """A test for per-call paths: ``test()`` is True while none of ``names`` is in the environment
    and no ``override`` is active, i.e. each of them has its default and the caller may skip
    ``get``; False says nothing (read with ``get``).  One dict lookup per name (os.environ's own
    dict on POSIX); not POSIX: always False."""
    for n in names:
        TABLE[n]  # noqa: B018 - KeyError for an undeclared name, now rather than at the first call
    if _ENV is None:  # pragma: no cover - not POSIX
        return lambda: False
    lookup, ov, keys = _ENV.get, _overrides, tuple(_KEYS[n] for n in names)
    if len(keys) == 1:
        k1, = keys

        def test():
            return lookup(k1) is None and not ov
    elif len(keys) == 2:
        k1, k2 = keys

        def test():
            return lookup(k1) is None and lookup(k2) is None and not ov
    else:
        def test():
            return not ov and all(lookup(k) is None for k in keys)
    return test


def report(scopes=(LIBRARY, TESTS, EXTERNAL)) -> list:
    """Every declared variable's ``Setting`` (in table order), for the doctor."""
    return [setting(v.name) for v in VARIABLES if v.scope in scopes]


def validate() -> list:
    """Read every library variable now (warning for each value not understood); their Settings."""
    return report((LIBRARY,))


def reload() -> None:
    """Forget parsed values and the warnings already given (tests)."""
    with _lock:
        _cache.clear()
        _ocache.clear()
        _warned.clear()
