"""Write ``cudnn_compat/__init__.pyi``: the type stub of every public name of ``cudnn_compat``.

The legacy functions are injected into the package with ``globals().update`` (``_core.registry.legacy``),
so editors and type checkers see none of them without this stub.  It is generated from the
registry, never written by hand:

* every legacy function under its C name, its CuPy 13 name and any cudnn-prefixed CuPy 13
  spelling (``cudnnAddTensor_v3``), with its Python parameters typed from the C parameter kinds of
  ``_core.signatures.SIGNATURES`` as ``_core.registry.CONVERSIONS`` matched them (table ``KIND_TYPES``);
* its return type: the C out-parameters the function returns (one value, or a tuple when several);
* its docstring: the function's entry of the API reference, the text ``help()`` shows
  (``_core.docstrings.DOCS``, written by tools/gen_api_docs.py);
* the enum values and constants (``int`` / ``float``), ``CuDNNError``, ``CuDNNAlgoPerf`` and the
  helpers (``fuse``, ``trace``, ``plan_cache_info``, ...).

Type aliases of the stub (private: they exist for type checkers only):

``_Buffer``   a data or workspace buffer: a NumPy array or any object with ``__array_interface__``
              or DLPack on the CPU place; a CuPy array, a device pointer (int) or a
              ``cupy.cuda.MemoryPointer`` on the GPU place; None for NULL.  An ``Any``-based union.
``_IntArray`` a C int array: a sequence of ints, a NumPy integer array, a ctypes pointer, or None.
``_Stream``   a stream: a ``cupy.cuda.Stream``, a ``cudaStream_t`` int, or 0/None.

Usage: ``python tools/gen_stubs.py`` (rewrites the stub) or ``--check`` (exit 1 when stale).
``tests/test_stubs.py`` fails when the checked-in stub differs from ``render()``.
"""
from __future__ import annotations

import inspect
import pathlib
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[1]
STUB = ROOT / "cudnn_compat" / "__init__.pyi"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import cudnn_compat  # noqa: E402
from cudnn_compat._core.descriptor import Descriptor  # noqa: E402
from cudnn_compat._core.registry import CONVERSIONS, LEGACY  # noqa: E402
from cudnn_compat._core.signatures import SIGNATURES  # noqa: E402

# C parameter kind -> Python type of the stub (descriptors and handles: see _desc_type).
KIND_TYPES = {
    "int": "int", "int64": "int", "uint32": "int", "uint64": "int", "size_t": "int",
    "double": "float", "float": "float",
    "int[]": "_IntArray", "uint32[]": "_IntArray",
    "stream": "_Stream",
    "pointer": "_Buffer",
    "opaque": "Any",
    "out": "Any",
}
# Scaling factors are 'pointer' in C (host pointers to a float or double) and numbers in Python.
SCALARS = {"alpha", "beta", "alpha1", "alpha2", "alphaDataDiff", "betaDataDiff", "alphaParamDiff", "betaParamDiff"}
# Out-parameters returned as Python values: their type by C parameter name (default int).
OUT_FLOAT = {"coef", "lrnAlpha", "lrnBeta", "lrnK", "dropout", "lclip", "rclip", "smScaler", "time"}
OUT_LIST = {"dimA", "strideA", "filterDimA", "padA", "dilationA", "windowDimA", "paddingA", "seqLengthArray",
            "axes", "padBeforeA", "padAfterA", "foldA", "tensorOuputDimA", "outputTensorDimA"}
OUT_DESC = {"dropoutDesc": "cudnnDropoutDescriptor_t", "attnDropoutDesc": "cudnnDropoutDescriptor_t",
            "postDropoutDesc": "cudnnDropoutDescriptor_t", "algoDesc": "cudnnAlgorithmDescriptor_t"}
OUT_ANY = {"states", "udata", "fptr", "mAddr", "bAddr", "linLayerMat", "linLayerBias", "perfResults", "algoPerf"}
# Functions whose Python return value differs from their C out-parameters (extra values, CuPy forms).
RETURN_OVERRIDES = {
    "cudnnGetFusedOpsConstParamPackAttribute": "tuple[Any, int]",  # (value, isNULL)
    "cudnnBackendGetAttribute": "tuple[int, list[Any]]",  # (elementCount, values)
    "cudnnGetRNNDataDescriptor": "tuple[int, int, int, int, int, list[int], float | None]",  # + paddingFill
    "cudnnGetSeqDataDescriptor": "tuple[int, int, list[int], list[int], int, list[int], float | None]",  # + paddingFill
}
# Return annotations of the Python functions that are already a stub type.
PLAIN_RETURNS = {"None": "None", "int": "int", "float": "float", "str": "str", "bool": "bool",
                 "dict": "dict[str, Any]", "list": "list[Any]", "'str | None'": "str | None",
                 "str | None": "str | None"}


def descriptor_classes() -> dict:
    """C type name (``cudnnTensorDescriptor_t``) -> (module, class name) of its descriptor class."""
    out, todo = {}, [Descriptor]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("cudnn_compat.") and not sub.__name__.startswith("_"):
                out.setdefault(sub.kind, (sub.__module__, sub.__name__))
    return dict(sorted(out.items()))


DESCRIPTORS = descriptor_classes()


def _desc_type(ctype: str) -> str:
    hit = DESCRIPTORS.get(ctype)
    return f"_{hit[1]} | int" if hit else "int"


def param_type(kind: "str | None", name: str) -> str:
    if kind is None:
        return "Any"
    if kind == "handle":
        return _desc_type("cudnnHandle_t")
    if kind.startswith("desc[]:"):
        return f"Sequence[{_desc_type(kind[7:])}]"
    if kind.startswith("desc:"):
        return _desc_type(kind[5:])
    if kind.startswith("enum:"):
        return "int"
    if kind == "pointer" and name in SCALARS:
        return "float"
    return KIND_TYPES.get(kind, "Any")


def out_params(c_name: str) -> list:
    """The C out-parameters a legacy function returns (those not taken as Python arguments)."""
    taken = {c for c, _ in CONVERSIONS.get(c_name, {}).values()}
    return [n for n, k in SIGNATURES.get(c_name, ()) if k == "out" and n not in taken]


def _out_type(name: str) -> str:
    if name in OUT_FLOAT:
        return "float"
    if name in OUT_LIST:
        return "list[int]"
    if name in OUT_DESC:
        return _desc_type(OUT_DESC[name]).split(" | ")[0]
    if name in OUT_ANY:
        return "Any"
    return "int"


def return_type(c_name: str, fn) -> str:
    if c_name in RETURN_OVERRIDES:
        return RETURN_OVERRIDES[c_name]
    ann = inspect.signature(inspect.unwrap(fn)).return_annotation
    ann = ann if isinstance(ann, str) else getattr(ann, "__name__", "")
    outs = out_params(c_name)
    if ann == "tuple":
        return "tuple[" + ", ".join(_out_type(n) for n in outs) + "]" if outs else "tuple[Any, ...]"
    if ann == "list":
        if len(outs) == 1 and outs[0] in OUT_LIST:
            return "list[int]"
        if outs and outs[-1] == "perfResults" and "Convolution" in c_name:
            return "list[CuDNNAlgoPerf]"
        return "list[Any]"
    if ann in PLAIN_RETURNS:
        return PLAIN_RETURNS[ann]
    for ctype, (_, cls) in DESCRIPTORS.items():
        if ann == cls:
            return f"_{cls}"
    return "Any"


def one_line(doc: "str | None") -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    text = " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())
    for stop in (". ", ".  "):
        i = text.find(stop)
        if 0 < i < len(text) - 2 and i >= 20:
            text = text[:i + 1]
            break
    return text.replace("\\", "\\\\").replace('"""', "'''")


def _params(c_name: str, fn) -> str:
    conv = CONVERSIONS.get(c_name) or {}
    parts, star = [], False
    for p in inspect.signature(inspect.unwrap(fn)).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}: Any")
            star = True
            continue
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}: Any")
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.name in conv and conv[p.name][1] is not None:
            t = param_type(conv[p.name][1], p.name)
        elif p.annotation is not p.empty and p.annotation in PLAIN_RETURNS:
            t = PLAIN_RETURNS[p.annotation]
        else:
            t = "Any"
        if p.default is not p.empty and p.default is None and "None" not in t and t != "Any":
            t += " | None"
        parts.append(f"{p.name}: {t}" + (" = ..." if p.default is not p.empty else ""))
    return ", ".join(parts)


def doc_literal(doc: str) -> str:
    """``doc`` as the docstring literal of a stub function body, indented (``ast.get_docstring``
    gives back ``inspect.cleandoc(doc)``)."""
    text = inspect.cleandoc(doc).replace("\\", "\\\\").replace('"""', "'''")
    first, *rest = text.split("\n")
    if not rest:
        return f'"""{first}"""'
    return '"""' + "\n".join([first] + [f"    {ln}" if ln else "" for ln in rest]) + '\n    """'


def legacy_def(name: str, c_name: str) -> str:
    """The stub of a legacy function under ``name``, its docstring the generated reference entry
    (``_core.docstrings.DOCS``, what ``help()`` shows)."""
    fn = LEGACY[c_name]
    doc = fn.__doc__ or ""
    body = doc_literal(doc) if doc.strip() else "..."
    return f"def {name}({_params(c_name, fn)}) -> {return_type(c_name, fn)}:\n    {body}\n"


def helper_def(name: str, fn) -> str:
    sig = inspect.signature(fn)
    parts = []
    for p in sig.parameters.values():
        t = PLAIN_RETURNS.get(p.annotation, "Any") if p.annotation is not p.empty else "Any"
        parts.append(f"{p.name}: {t}" + (" = ..." if p.default is not p.empty else ""))
    ret = sig.return_annotation
    ret = "tuple[int, int, int, int]" if name == "plan_cache_info" else \
        PLAIN_RETURNS.get(ret, "Any") if ret is not sig.empty else "Any"
    if name == "exported":
        ret = "dict[str, Callable[..., Any]]"
    doc = one_line(fn.__doc__)
    return f"def {name}({', '.join(parts)}) -> {ret}:\n    \"\"\"{doc}\"\"\"\n" if doc else \
        f"def {name}({', '.join(parts)}) -> {ret}: ...\n"


CLASSES = {
    "CuDNNError": '''class CuDNNError(RuntimeError):
    """{doc}"""
    status: int
    argument: str
    rule: str
    function: str
    def __init__(self, status: int, argument: str = ..., rule: str = ..., function: str = ...) -> None: ...
    @property
    def status_name(self) -> str: ...
    @property
    def message(self) -> str: ...
    def with_function(self, function: str) -> CuDNNError: ...
''',
    "CuDNNArgumentError": '''class CuDNNArgumentError(CuDNNError, TypeError):
    """{doc}"""
''',
    "CuDNNAlgoPerf": '''class CuDNNAlgoPerf:
    """{doc}"""
    algo: int
    status: int
    time: float
    memory: int
    determinism: int
    mathType: int
    def __init__(self, algo: int, status: int, time: float, memory: int, determinism: int, mathType: int) -> None: ...
    def __getitem__(self, name: str) -> Any: ...
    def keys(self) -> tuple[str, ...]: ...
''',
    "CpuFallbackWarning": '''class CpuFallbackWarning(RuntimeWarning):
    """{doc}"""
''',
    "fuse": '''class fuse:
    """{doc}"""
    def __init__(self, handle: _Handle | int) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any: ...
''',
}

TRACE = '''class _TraceModule:
    """{doc}"""
    def __call__(self, path: str | os.PathLike[str], tensors: bool = ...) -> ContextManager[Any]: ...
    def __getattr__(self, name: str) -> Any: ...

trace: _TraceModule
'''

HEADER = '''"""Type stub of cudnn_compat, generated by tools/gen_stubs.py from the registry; do not edit.

{doc}

Aliases used below (for type checkers only, not importable at run time):
_Buffer   a data or workspace buffer: a NumPy array or an object with __array_interface__ or DLPack
          (CPU place), a CuPy array, a device pointer (int) or a MemoryPointer (GPU place), None for NULL.
_IntArray a C int array: a sequence of ints, a NumPy integer array, a ctypes pointer, or None.
_Stream   a stream: a cupy.cuda.Stream, a cudaStream_t int, or 0/None.
"""
import os
from typing import Any, Callable, ContextManager, Sequence, Union

import numpy

{imports}

_Buffer = Union[numpy.ndarray, int, None, Any]
_IntArray = Union[Sequence[int], numpy.ndarray, None, Any]
_Stream = Union[int, None, Any]

__version__: str
'''


def public_names() -> dict:
    """name -> value of every public name of cudnn_compat (what ``from cudnn_compat import *`` and
    attribute access see), modules left out but the callable ``trace``."""
    out = {}
    for k, v in vars(cudnn_compat).items():
        if k.startswith("_") or k == "annotations":
            continue
        if isinstance(v, types.ModuleType) and not callable(v):
            continue
        out[k] = v
    return dict(sorted(out.items()))


def render() -> str:
    names = public_names()
    imports = "\n".join(f"from {mod} import {cls} as _{cls}" for mod, cls in sorted(set(DESCRIPTORS.values())))
    out = [HEADER.format(doc=one_line(cudnn_compat.__doc__), imports=imports)]
    consts, dicts, funcs, classes = [], [], [], []
    for k, v in names.items():
        c_name = getattr(v, "c_name", None)
        if c_name in LEGACY and callable(v):
            funcs.append(legacy_def(k, c_name))
        elif k in CLASSES:
            classes.append(CLASSES[k].format(doc=one_line(v.__doc__)))
        elif k == "trace":
            classes.append(TRACE.format(doc=one_line(type(v).__doc__)))
        elif isinstance(v, type):
            raise SystemExit(f"gen_stubs: public class {k} has no stub template in CLASSES")
        elif callable(v):
            funcs.append(helper_def(k, v))
        elif isinstance(v, bool):
            consts.append(f"{k}: bool")
        elif isinstance(v, int):
            consts.append(f"{k}: int")
        elif isinstance(v, float):
            consts.append(f"{k}: float")
        elif isinstance(v, str):
            consts.append(f"{k}: str")
        elif isinstance(v, dict):
            dicts.append(f"{k}: dict[str, Any]")
        else:
            raise SystemExit(f"gen_stubs: public name {k} of type {type(v).__name__} has no stub rule")
    out.append("\n# -- constants and enum values (their C values) --\n" + "\n".join(consts) + "\n")
    out.append("\n# -- tables --\n" + "\n".join(dicts) + "\n")
    out.append("\n# -- classes and helpers --\n" + "\n".join(classes))
    out.append("\n# -- functions (legacy functions under every spelling, then helpers) --\n" + "\n".join(funcs))
    return "".join(out)


def main(argv=None) -> int:
    import _generated
    return _generated.main(STUB, render, __doc__.split("\n")[0], argv)

if __name__ == "__main__":
    sys.exit(main())
