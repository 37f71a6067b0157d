"""Compiling and launching generated kernels through CuPy (NVRTC underneath).

Modules are cached in-process by (device, kernel name), the name being a hash of the
source; CuPy's RawModule adds its own on-disk cache of the compiled code.
``CUDNN_COMPAT_DUMP_KERNELS=dir`` writes every source compiled to ``dir/<name>.cu``.
``LAUNCHES`` counts kernel launches (tests use it to check that a chain is one kernel).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading

import numpy as np

from ... import config as _config
from ..base import current_stream_function

_MODULES: dict = {}
_LOCK = threading.Lock()
_TRACE = threading.local()  # .tracer: the records.Tracer of the execute running on this thread
LAUNCHES = [0]
_DUMPED: set = set()
OPTIONS = ()
# a child of the ``cudnn_compat`` logger; the NullHandler keeps logging's last-resort printer quiet
# when the application configured no logging (a library does not print on its own)
log = logging.getLogger("cudnn_compat.cupy_engine")
log.addHandler(logging.NullHandler())


def cupy():
    import cupy as cp
    return cp


def dump(spec) -> None:
    """Write the source to $CUDNN_COMPAT_DUMP_KERNELS/<name>.cu (once per directory)."""
    where = _config.get("CUDNN_COMPAT_DUMP_KERNELS") or ""
    if where and (where, spec.name) not in _DUMPED:
        _DUMPED.add((where, spec.name))
        os.makedirs(where, exist_ok=True)
        path = os.path.join(where, spec.name + ".cu")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(spec.source)


def function(spec):
    """The compiled kernel of a KernelSpec on the current device."""
    cp = cupy()
    key = (cp.cuda.runtime.getDevice(), spec.name)
    dump(spec)
    fn = _MODULES.get(key)
    if fn is None:
        with _LOCK:
            fn = _MODULES.get(key)
            if fn is None:
                mod = cp.RawModule(code=spec.source, options=OPTIONS)
                fn = mod.get_function(spec.name)
                _MODULES[key] = fn
    return fn


def pointer(buf) -> int:
    if isinstance(buf, int):
        return buf
    data = getattr(buf, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return int(data.ptr)
    iface = getattr(buf, "__cuda_array_interface__", None) or getattr(buf, "__array_interface__", None)
    if iface is not None:
        return int(iface["data"][0])
    raise TypeError(f"not a device buffer: {type(buf).__name__}")


SCALAR_TYPES = {"float": np.float32, "double": np.float64, "int": np.int32, "long long": np.int64,
                "unsigned int": np.uint32, "unsigned long long": np.uint64}


def launch(spec, env: dict, extra: "dict | None" = None) -> None:
    """Launch ``spec`` on the current stream with buffers/scalars from ``env`` (uid -> value)."""
    args = []
    for a in spec.args:
        if a[0] == "buf":
            args.append(np.uint64(pointer(env[a[1]])))
        elif a[0] == "scalar":
            args.append(SCALAR_TYPES[a[2]](float(env[a[1]])))
        elif a[0] == "extra":  # ("extra", name, ctype): a value the step computes at run time
            v = extra[a[1]]
            args.append(np.uint64(pointer(v)) if a[2] == "ptr" else SCALAR_TYPES[a[2]](v))
        else:  # pragma: no cover
            raise ValueError(f"unknown kernel argument {a!r}")
    fn = function(spec)
    tracer = _TRACE.__dict__.get("tracer")
    if tracer is not None:  # a launch record is being made from this execute (records.py)
        tracer.launch(spec, env, extra, fn)
    fn(spec.grid, spec.block, tuple(args), shared_mem=spec.shared_mem)
    LAUNCHES[0] += 1


# -- the launch path of records (records.py) ----------------------------------------------------------
# LAUNCH[0](CUfunction, gx, gy, gz, bx, by, bz, shared mem, stream, kernelParams, extra): cuLaunchKernel
# through CuPy's Cython binding (cupy.cuda.driver.launchKernel: the cheapest call measured, see
# benchmarks/launch_paths.py); STREAM_PTR[0]() the current CuPy stream's handle (``engines/base.py``,
# the stream of a call whose handle has none).  Tests replace both.
LAUNCH: list = [None]


def launcher():
    if LAUNCH[0] is None:
        LAUNCH[0] = cupy().cuda.driver.launchKernel
    return LAUNCH[0]




def stream_ptr(stream) -> int:
    """The cudaStream_t of ``stream`` (a CuPy Stream/ExternalStream, a raw int, or None: CuPy's
    current stream)."""
    if stream is None:
        return current_stream_function()()
    if type(stream) is int:
        return stream
    return int(stream.ptr)


def aligned(env: dict, uids) -> bool:
    ok = all(pointer(env[u]) % 16 == 0 for u in uids)
    tracer = _TRACE.__dict__.get("tracer")
    if tracer is not None:
        tracer.aligned(uids, ok)
    return ok


@contextlib.contextmanager
def on_stream(stream):
    """Make ``stream`` (a cupy Stream/ExternalStream, a raw cudaStream_t int, or None for the
    current stream) current for the block."""
    if stream is None:
        yield
        return
    cp = cupy()
    if isinstance(stream, int):
        stream = cp.cuda.ExternalStream(stream)
    with stream:
        yield


def empty(tensor):
    """A device buffer for a (virtual) tensor: storage dtype, the tensor's strides."""
    from ... import dtypes
    cp = cupy()
    storage = dtypes.storage_dtype(tensor.dtype)
    span = 1 + sum((d - 1) * s for d, s in zip(tensor.dims, tensor.strides))
    base = cp.empty(span, dtype=storage)
    strides = tuple(s * storage.itemsize for s in tensor.strides)
    return cp.ndarray(tensor.dims, dtype=storage, memptr=base.data, strides=strides)


def view(ptr: int, tensor):
    """A strided device array over ``ptr`` for ``tensor`` (a raw pointer a plan took, made into
    the array the generic steps and the next engine expect)."""
    from ... import dtypes
    cp = cupy()
    storage = dtypes.storage_dtype(tensor.dtype)
    span = (1 + sum((d - 1) * s for d, s in zip(tensor.dims, tensor.strides))) * storage.itemsize
    mem = cp.cuda.UnownedMemory(ptr, span, None)
    return cp.ndarray(tensor.dims, dtype=storage, memptr=cp.cuda.MemoryPointer(mem, 0),
                      strides=tuple(s * storage.itemsize for s in tensor.strides))


def _span(buf) -> tuple:
    """[lo, hi) bytes a strided device array covers."""
    lo = pointer(buf)
    return lo, lo + buf.itemsize + sum((d - 1) * st for d, st in zip(buf.shape, buf.strides))


def unalias(env: dict, guard, stored) -> dict:
    """``env`` with every ``guard`` input that overlaps a ``stored`` output replaced by a copy
    (same strides): kernels that read an input at other elements than the one they write
    (windows, a row's first element across blocks) then never see half-written output."""
    tracer = _TRACE.__dict__.get("tracer")
    if tracer is not None:
        tracer.guard(env, guard, stored)
    out = env
    for u in guard:
        buf = env.get(u)
        if buf is None or not hasattr(buf, "strides"):
            continue
        lo, hi = _span(buf)
        for s in stored:
            o = env.get(s)
            if o is None or not hasattr(o, "strides"):
                continue
            olo, ohi = _span(o)
            if lo < ohi and olo < hi:
                cp = cupy()
                base = cp.empty(hi - lo, dtype=cp.uint8)
                copy = cp.ndarray(buf.shape, dtype=buf.dtype, memptr=base.data, strides=buf.strides)
                copy[...] = buf
                if tracer is not None:  # the copy is per call: no record of this execute
                    tracer.invalid(f"input {u} overlaps output {s}")
                if out is env:
                    out = dict(env)
                out[u] = copy
                break
    return out
