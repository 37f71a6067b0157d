"""Array helpers shared by the ``numpy`` engine's kernels: destinations in the memory order of an
input (so that NHWC data gives NHWC results and the ufunc loops stay contiguous), destinations
that never overlap the inputs a multi-pass kernel still reads, and blocks along one axis that
bound a kernel's temporaries.
"""
from __future__ import annotations

import numpy as np

BLOCK_ELEMENTS = 1 << 18  # a block temporary holds about this many elements (1 MiB of float32)


def empty_like_layout(like: np.ndarray, shape, dt) -> np.ndarray:
    """An uninitialized array of ``shape`` and ``dt`` whose axes lie in memory in the order of
    ``like``'s strides (largest first); ``shape`` has ``like``'s rank."""
    order = sorted(range(like.ndim), key=lambda k: (-abs(like.strides[k]), k))
    buf = np.empty([shape[k] for k in order], dtype=dt)
    return buf.transpose(np.argsort(order))


def zeros_like_layout(like: np.ndarray, shape, dt) -> np.ndarray:
    buf = empty_like_layout(like, shape, dt)
    buf.fill(0)
    return buf


def dest(out: dict, role: str, like: np.ndarray, shape, dt, reads=()) -> np.ndarray:
    """``out[role]`` when the caller gave it and it shares no memory with ``reads`` (the inputs
    the kernel reads after it starts writing), else a fresh array laid out like ``like``."""
    buf = out.get(role)
    if buf is not None and not any(np.may_share_memory(buf, r) for r in reads):
        return buf
    return empty_like_layout(like, shape, dt)


def blocks(n: int, per_item: int):
    """Slices of ``range(n)`` whose items hold at most BLOCK_ELEMENTS elements together (at
    least one item per block)."""
    step = max(1, BLOCK_ELEMENTS // max(1, per_item))
    return [slice(i, min(n, i + step)) for i in range(0, n, step)]
