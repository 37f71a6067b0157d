"""The reference engine's kernel table: ``KERNELS`` maps an op kind to ``fn(op, ins) -> {role:
float64 array}``; each kernel module of this package fills it with ``@kernel(kind)``.  Its own
module so that the kernel modules and the engine (``__init__``) import it without a cycle."""
from __future__ import annotations

KERNELS: dict = {}


def kernel(kind: str):
    def deco(fn):
        KERNELS[kind] = fn
        return fn
    return deco
