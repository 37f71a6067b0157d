"""Reference kernel for ``Rng`` (dropout masks; the exact definition is in
_backend/validate_rnn.py).  RNN graphs need no kernel of their own: they are Matmul and
Pointwise ops.

``philox4x32_10(counter, key)`` is Random123's Philox4x32-10, vectorized over counters:
``counter`` is a uint32 array of shape (n, 4), ``key`` a pair of uint32; it returns the
(n, 4) uint32 words.  Every engine must reproduce ``bernoulli_keep`` bit for bit.
"""
from __future__ import annotations

import math

import numpy as np

from . import kernel

PHILOX_M0, PHILOX_M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def philox4x32_10(counter: np.ndarray, key) -> np.ndarray:
    c = np.asarray(counter, dtype=np.uint64).reshape(-1, 4)
    c0, c1, c2, c3 = (c[:, j].copy() for j in range(4))
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & 0xFFFFFFFF, (k1 + PHILOX_W1) & 0xFFFFFFFF
        p0 = PHILOX_M0 * c0  # both < 2**32, the product fits in 64 bits
        p1 = PHILOX_M1 * c2
        hi0, lo0 = p0 >> _SHIFT, p0 & _MASK32
        hi1, lo1 = p1 >> _SHIFT, p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def keep_threshold(p: float) -> int:
    """An element is kept when its 32-bit word is >= ceil(p * 2**32) (p = 1 keeps none)."""
    return int(math.ceil(float(p) * 4294967296.0))


def bernoulli_keep(seed: int, block: int, numel: int, p: float) -> np.ndarray:
    """The keep mask (bool, length ``numel``) for elements 0..numel-1 starting at ``block``."""
    nblocks = -(-numel // 4)
    blocks = (np.arange(nblocks, dtype=np.uint64) + np.uint64(block & 0xFFFFFFFFFFFFFFFF))
    ctr = np.zeros((nblocks, 4), dtype=np.uint64)
    ctr[:, 0] = blocks & _MASK32
    ctr[:, 1] = blocks >> _SHIFT
    threshold = keep_threshold(p)
    if threshold >= 2 ** 32:
        return np.zeros(numel, bool)
    words = philox4x32_10(ctr, (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)).reshape(-1)[:numel]
    return words >= np.uint32(threshold)


def _word_pair(v) -> int:
    """int32 words [lo, hi] (as loaded, float64) -> the unsigned 64-bit value."""
    lo, hi = (int(x) & 0xFFFFFFFF for x in np.asarray(v).reshape(-1)[:2])
    return lo | (hi << 32)


def _to_words(value: int) -> np.ndarray:
    """unsigned 64-bit value -> int32 words [lo, hi] in two's complement (as float64 for the store)."""
    value &= 0xFFFFFFFFFFFFFFFF
    words = np.array([value & 0xFFFFFFFF, value >> 32], dtype=np.uint64).astype(np.uint32).view(np.int32)
    return words.astype(np.float64)


@kernel("Rng")
def rng(op, ins):
    a = op.attrs
    y = op.outputs["y"]
    numel = int(np.prod(y.dims))
    seed, offset = _word_pair(ins["seed"]), _word_pair(ins["offset"])
    keep = bernoulli_keep(seed, offset + int(a.get("block_offset", 0)), numel, float(a["drop_probability"]))
    out = {"y": keep.astype(np.float64).reshape(y.dims)}
    if "offset_out" in op.outputs:
        out["offset_out"] = _to_words(offset + int(a.get("advance", -(-numel // 4))))
    return out
