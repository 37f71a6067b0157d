"""The ``numpy`` engine's kernel table: ``KERNELS`` maps an op kind to
``fn(op, ins, dt, out) -> {role: ndarray}``; each kernel module of this package fills it with
``@kernel(kind)``.  Its own module so that the kernel modules and the engine (``__init__``)
import it without a cycle.

The protocol every kernel follows:

- ``dt``: the op's compute dtype as an ``np.dtype``: float32 (FLOAT compute; HALF and BFLOAT16
  data too) or float64 (DOUBLE compute; float64/int32/int64 data; int32 accumulation).
- ``ins``: role -> ndarray of ``dt``.  A float32 external input under float32 compute is the
  caller's strided view itself (no copy); by-value tensors are 0-d arrays of ``dt``.
  Kernels never modify ``ins`` arrays.
- ``out``: role -> a writable destination ndarray of ``dt`` with the output's dims, present
  when the output is external and its storage dtype is ``dt`` (the caller's buffer view);
  absent otherwise.  A kernel may write into ``out[role]`` and return it, or return any array
  (the plan stores it with rounding).  ``out`` may alias an input (y is read for beta
  blending): a kernel reads every input it needs before it writes ``out``.
- Temporary memory is bounded: each kernel states its bound in its docstring.
- ``SUPPORTS`` maps an op kind to an optional ``fn(op) -> None | reason`` that the engine's
  check_support calls: a kernel module registers one with ``@supports(kind)`` for attribute
  combinations it cannot run, so the reference engine runs them instead.
"""
from __future__ import annotations

KERNELS: dict = {}
SUPPORTS: dict = {}


def kernel(kind: str):
    def deco(fn):
        KERNELS[kind] = fn
        return fn
    return deco


def supports(kind: str):
    """Register ``fn(op) -> None | reason`` deciding whether this engine runs ``op``."""
    def deco(fn):
        SUPPORTS[kind] = fn
        return fn
    return deco
