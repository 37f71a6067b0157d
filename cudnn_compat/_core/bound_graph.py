"""Graphs whose tensors live at byte offsets inside the caller's buffers (dropout states and
masks in reserve space, RNN weights inside one weight space, per-time-step slices of x, y,
workspace and reserve space).

The IR has no tensor offsets, so each external tensor is bound to ``buffer + offset``: a
``GraphBuilder`` records, for every external uid, the name of the buffer and the byte offset
of its first element; ``execute`` turns the caller's buffers into offset views (``at``) and
runs the graph through ``_core.call.run`` like any other legacy call.  Built graphs are finalized
at once and kept with their binding tables, keyed by the call signature, so a call whose
graphs are all built cannot fail half way through for a graph reason.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
from collections import OrderedDict

import numpy as np

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides
from . import call as _call
from .data import _CUPY_NDARRAY
from ..errors import bad_param


class GraphBuilder:
    """Accumulates ops; ``ext`` tensors are bound to (buffer name, byte offset)."""

    def __init__(self, name: str, cdtype: str = "float32"):
        self.name = name
        self.cdtype = cdtype
        self.ops: list = []
        self.bindings: dict = {}  # uid -> (buffer name, byte offset)
        self.scalar_names: dict = {}  # uid -> value name
        self._scalars: dict = {}  # value name -> Tensor
        self._uids = itertools.count(1)

    # -- tensors -------------------------------------------------------------------
    def ext(self, buf: str, offset: int, dims, strides=None, dtype=None, name: str = "") -> Tensor:
        """A tensor of the caller's buffer ``buf`` whose first element is ``offset`` elements in."""
        dtype = dtype or self.cdtype
        dims = tuple(int(d) for d in dims)
        strides = packed_strides(dims) if strides is None else tuple(int(s) for s in strides)
        t = Tensor(next(self._uids), dims, strides, dtype, name=name or buf)
        self.bindings[t.uid] = (buf, int(offset) * dtypes.itemsize(dtype))
        return t

    def virt(self, dims, dtype=None, name: str = "") -> Tensor:
        dims = tuple(int(d) for d in dims)
        return Tensor(next(self._uids), dims, packed_strides(dims), dtype or self.cdtype, is_virtual=True, name=name)

    def scalar(self, name: str, dtype=None) -> Tensor:
        """A by-value scalar whose value is looked up by ``name`` at execute time."""
        t = self._scalars.get(name)
        if t is None:
            t = Tensor(next(self._uids), (1,), (1,), dtype or self.cdtype, is_by_value=True, name=name)
            self._scalars[name] = t
            self.scalar_names[t.uid] = name
        return t

    # -- ops -----------------------------------------------------------------------
    def op(self, kind: str, inputs: dict, outputs: dict, attrs: "dict | None" = None):
        self.ops.append(Operation(kind, inputs, outputs, dict(attrs or {})))
        return outputs

    def pw(self, mode: str, x, b=None, out=None, alpha1=None, **attrs) -> Tensor:
        """Pointwise ``mode`` of x (and b); the result is ``out`` or a new virtual tensor."""
        if out is None:
            dims = x.dims if (b is None or b.is_by_value) else tuple(max(p, q) for p, q in zip(x.dims, b.dims))
            if x.is_by_value and b is not None and not b.is_by_value:
                dims = b.dims
            out = self.virt(dims)
        ins = {"x": x}
        if b is not None:
            ins["b"] = b
        if alpha1 is not None:
            ins["alpha1"] = alpha1
        attrs["mode"] = mode
        self.op("Pointwise", ins, {"y": out}, attrs)
        return out

    def mm(self, a: Tensor, b: Tensor, out=None) -> Tensor:
        if out is None:
            out = self.virt(a.dims[:-2] + (a.dims[-2], b.dims[-1]))
        self.op("Matmul", {"a": a, "b": b}, {"c": out})
        return out

    def add_all(self, terms: list, out=None) -> Tensor:
        """Sum of ``terms`` (a left-to-right chain of ADDs), the last one written to ``out``."""
        terms = [t for t in terms if t is not None]
        if len(terms) == 1:
            return terms[0] if out is None else self.pw("IDENTITY", terms[0], out=out)
        acc = terms[0]
        for i, t in enumerate(terms[1:]):
            acc = self.pw("ADD", acc, t, out=out if i == len(terms) - 2 else None)
        return acc

    def finish(self) -> "BoundGraph":
        graph = OperationGraph(self.ops, self.name).finalize()
        return BoundGraph(graph, dict(self.bindings), dict(self.scalar_names))


class BoundGraph:
    def __init__(self, graph, bindings, scalar_names):
        self.graph = graph
        self.bindings = bindings
        self.scalar_names = scalar_names


_CACHE: OrderedDict = OrderedDict()
_CACHE_MAX = 128
_lock = threading.Lock()


_EMPTY = object()


def prepare(key: tuple, build) -> "BoundGraph | None":
    """The finalized graph for ``key``; ``build()`` returns a GraphBuilder on a miss.
    None when the builder made no op (nothing to do for this call)."""
    with _lock:
        bound = _CACHE.get(key)
        if bound is not None:
            _CACHE.move_to_end(key)
            return None if bound is _EMPTY else bound
    builder = build()
    bound = builder.finish() if builder.ops else _EMPTY
    with _lock:
        _CACHE[key] = bound
        while len(_CACHE) > _CACHE_MAX:
            _CACHE.popitem(last=False)
    return None if bound is _EMPTY else bound


def execute(handle, key: tuple, bound: BoundGraph, buffers: dict, values: "dict | None" = None):
    """Run ``bound`` with ``buffers`` (name -> caller data) and scalar ``values`` (name -> float)."""
    if bound is None:
        return None
    tensors = {}
    for uid, (buf, off) in bound.bindings.items():
        data = buffers[buf]
        # a device pointer (``preflight(..., pointers=True)``'s form on the GPU place): the sum is ``at``'s
        tensors[uid] = ((data + off) if type(data) is int else at(data, off), buf)
    scalars = {uid: float(values[name]) for uid, name in bound.scalar_names.items()}
    return _call.run(handle, key, lambda: bound.graph, tensors, scalars)


# -- buffers -------------------------------------------------------------------------

def byte_view(data):
    """``data`` as a flat uint8 array (NumPy or CuPy), or its address for pointer ints and
    other CUDA arrays."""
    if isinstance(data, int) and not isinstance(data, bool):
        return data
    if isinstance(data, np.ndarray):
        return data.reshape(-1, order="A").view(np.uint8)
    if type(data).__module__.split(".")[0] == "cupy":
        import cupy
        return data.reshape(-1, order="A").view(cupy.uint8)
    if hasattr(data, "__cuda_array_interface__"):
        return int(data.__cuda_array_interface__["data"][0])
    if hasattr(data, "__dlpack__"):
        import cupy
        return byte_view(cupy.from_dlpack(data))
    from .data import host_bytes  # ctypes pointers, buffer-protocol / __array_interface__ objects
    return host_bytes(data)


def at(data, nbytes: int):
    """``data`` advanced by ``nbytes`` bytes: a view for arrays, an address for pointer ints."""
    if nbytes == 0 or data is None:
        return data
    raw = byte_view(data)
    if isinstance(raw, int):
        return raw + nbytes
    if isinstance(raw, ctypes.c_void_p):  # a raw host pointer (docs/conventions.md "Data")
        return ctypes.c_void_p(raw.value + nbytes)
    if raw is data:  # not an array type: bind() rejects it with a clear message
        return data
    return raw[nbytes:]


def address(data):
    """A comparable identity of the memory ``data`` starts at (for in-place checks)."""
    if isinstance(data, int) and not isinstance(data, bool):
        return int(data)
    if isinstance(data, np.ndarray):
        return data.__array_interface__["data"][0]
    iface = getattr(data, "__cuda_array_interface__", None)
    if iface is not None:
        return int(iface["data"][0])
    return id(data)


def nbytes_of(data) -> "int | None":
    """Size of an array buffer in bytes, None for raw pointers."""
    n = getattr(data, "nbytes", None)
    return int(n) if n is not None else None


def check_buffer(data, argname: str, need: int) -> None:
    """The checks ``bind`` makes, made up front so that nothing is written when one fails."""
    if data is None or (isinstance(data, int) and not isinstance(data, bool) and data == 0):
        raise bad_param(argname, "is NULL")
    flags = getattr(data, "flags", None)
    if flags is not None and not (flags.c_contiguous or flags.f_contiguous):
        raise bad_param(argname, "must be a contiguous buffer")
    n = nbytes_of(data)
    if n is not None and n < need:
        raise bad_param(argname, f"buffer holds {n} bytes but {need} are needed")


def is_null(data) -> bool:
    t = type(data)
    if t is np.ndarray or (_CUPY_NDARRAY and t is _CUPY_NDARRAY[0]):  # arrays (CuPy's once imported)
        return False
    return data is None or (isinstance(data, int) and not isinstance(data, bool) and data == 0) or \
        (isinstance(data, ctypes.c_void_p) and not data.value)
