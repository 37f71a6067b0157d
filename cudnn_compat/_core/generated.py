"""Generated Python, compiled in one place (issue 26 item 2): the legacy wrappers
(``_core.registry``: one per legacy function, its fast argument test unrolled), the Create/Destroy
pairs of ``_core.lifecycle``'s table, the call-site
wrappers (``_core.memo.call_site``: the resolver's own parameters, no ``*args`` tuple per call)
and the binders of plans (``_core.fastbind``: per plan, its buffer checks unrolled; 1.1 us against
1.5 us for the same checks as a loop over 6 tensors).  Nothing else in the package runs ``exec``
(tests/test_import_graph.py); the launch records of the cupy engine are closures.

``define(name, source, namespace, function)`` compiles ``source`` under the file name ``name``
(``<legacy wrapper cudnnX>``, ``<cudnn_compat binder N: config>``), puts its lines in
``linecache`` so a traceback through it shows them, keeps it in ``SOURCES`` and returns the
function ``function`` it defines, with ``.source`` and ``.filename``.  ``dump(directory)`` writes
every source made in this process, one .py file each; ``CUDNN_COMPAT_DUMP_KERNELS=dir`` writes
each as it is made, beside the CUDA kernels of the cupy engine.
"""
from __future__ import annotations

import __future__
import linecache
import os

from cudnn_compat._backend import config as _config

_ANNOTATIONS = __future__.annotations.compiler_flag
SOURCES: dict = {}  # file name -> source of every function generated in this process
SOURCES_MAX = 8192


def define(name: str, source: str, namespace: dict, function: str, globals_: "dict | None" = None):
    """The function ``function`` that ``source`` defines, compiled under the file name ``name``."""
    if not source.endswith("\n"):
        source += "\n"
    code = compile(source, name, "exec", flags=_ANNOTATIONS, dont_inherit=True)  # annotations stay strings
    if globals_ is None:
        exec(code, namespace)
    else:
        exec(code, globals_, namespace)
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)  # mtime None: kept by checkcache
    if len(SOURCES) >= SOURCES_MAX:
        for old in list(SOURCES)[:SOURCES_MAX // 2]:
            SOURCES.pop(old, None)
            linecache.cache.pop(old, None)
    SOURCES[name] = source
    where = _config.get("CUDNN_COMPAT_DUMP_KERNELS") or ""
    if where:
        try:
            _write(where, name, source)
        except OSError:  # a folder that cannot be written: the function still runs
            pass
    fn = namespace[function]
    try:
        fn.source, fn.filename = source, name
    except AttributeError:  # pragma: no cover - not a plain function
        pass
    return fn


def dump(directory: str) -> list:
    """Write every generated source of this process to ``directory``; returns the paths."""
    return [_write(directory, name, src) for name, src in list(SOURCES.items())]


def _write(directory: str, name: str, source: str) -> str:
    os.makedirs(directory, exist_ok=True)
    stem = "".join(c if c.isalnum() else "_" for c in name.strip("<>")).strip("_")[:120]
    path = os.path.join(directory, stem + ".py")
    with open(path, "w") as f:
        f.write(f"# {name}\n" + source)
    return path
