"""The Softmax, SoftmaxBackward, LRNForward/Backward and DivisiveNormalizationForward/Backward
op kinds: spec rows and rules (002 §3.2.96/§4.1.19 softmax, §3.2.65/§4.1.14
LRN, §3.2.33/§4.1.6 divisive normalization, §3.2.83 the LRN parameter ranges).

Attributes:
- Softmax / SoftmaxBackward: ``algorithm`` 'FAST' | 'ACCURATE' | 'LOG' and ``axes``, the
  dims reduced over (INSTANCE: every dim but 0; CHANNEL: dim 1 only).
- LRN* / DivisiveNormalization*: ``n`` (window width), ``alpha``, ``beta``, ``k``, in the
  ranges of cudnn.h's CUDNN_LRN_MIN_N/MAX_N/MIN_K/MIN_BETA.  LRN windows run over dim 1,
  divisive normalization windows over every dim after 1.
Every role of one op has the same dims (the legacy calls share one shape).
"""
from __future__ import annotations

import math

from ._common import OpSpec, fail

SOFTMAX_ALGORITHMS = ("FAST", "ACCURATE", "LOG")
LRN_MIN_N, LRN_MAX_N, LRN_MIN_K, LRN_MIN_BETA = 1, 16, 1e-5, 0.01  # cudnn.h CUDNN_LRN_*


def _same_dims(i, op):
    tensors = {**op.inputs, **op.outputs}
    first_role, first = next(iter(tensors.items()))
    for role, t in tensors.items():
        if t.dims != first.dims:
            fail(i, op, "SHAPE_MISMATCH", f"{role} dims {t.dims} differ from {first_role} dims {first.dims}")
    return first.ndim


def _softmax(i, op):
    nd = _same_dims(i, op)
    if op.attrs.get("algorithm") not in SOFTMAX_ALGORITHMS:
        fail(i, op, "SOFTMAX_ALGORITHM", f"algorithm must be one of {SOFTMAX_ALGORITHMS}, got {op.attrs.get('algorithm')!r}")
    axes = tuple(op.attrs.get("axes", ()))
    if not axes or len(set(axes)) != len(axes) or not all(isinstance(a, int) and 0 <= a < nd for a in axes):
        fail(i, op, "SOFTMAX_AXES", f"axes must be distinct dims in [0, {nd}), got {axes}")


def _lrn_params(i, op, min_ndim: int):
    nd = _same_dims(i, op)
    if nd < min_ndim:
        fail(i, op, "LRN_RANK", f"needs at least {min_ndim} dims, got {nd}")
    a = op.attrs
    n = a.get("n")
    if not (isinstance(n, int) and LRN_MIN_N <= n <= LRN_MAX_N):
        fail(i, op, "LRN_N", f"n must be an int in [{LRN_MIN_N}, {LRN_MAX_N}], got {n!r}")
    if not math.isfinite(a.get("alpha", math.nan)):
        fail(i, op, "LRN_ALPHA", f"alpha must be finite, got {a.get('alpha')!r}")
    if not a.get("beta", math.nan) >= LRN_MIN_BETA:
        fail(i, op, "LRN_BETA", f"beta must be >= {LRN_MIN_BETA}, got {a.get('beta')!r}")
    if not a.get("k", math.nan) >= LRN_MIN_K:
        fail(i, op, "LRN_K", f"k must be >= {LRN_MIN_K}, got {a.get('k')!r}")


def _lrn(i, op):
    _lrn_params(i, op, 2)


def _divnorm(i, op):
    _lrn_params(i, op, 3)


KINDS = {
    # attrs: algorithm ('FAST'|'ACCURATE'|'LOG'), axes (reduced dims)
    "Softmax": OpSpec(("x",), (), ("y",), rule=_softmax),
    "SoftmaxBackward": OpSpec(("y", "dy"), (), ("dx",), rule=_softmax),
    # attrs: n, alpha, beta, k
    "LRNForward": OpSpec(("x",), (), ("y",), rule=_lrn),
    "LRNBackward": OpSpec(("x", "y", "dy"), (), ("dx",), rule=_lrn),
    "DivisiveNormalizationForward": OpSpec(("x",), ("means",), ("y",), rule=_divnorm),
    "DivisiveNormalizationBackward": OpSpec(("x", "dy"), ("means",), ("dx",), ("dmeans",), rule=_divnorm),
}
