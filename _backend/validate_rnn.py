"""Op kinds and rules for dropout and RNN graphs.

RNN calls are translated into Matmul + Pointwise graphs (cudnn_compat/rnn_core.py), so
the only new kind is ``Rng``, the counter-based random generator behind dropout masks
(002 §3.2.34 cudnnDropoutForward; the backend RNG operation of cuDNN 9 takes seed and
offset the same way, as tensors).

``Rng`` -- Bernoulli keep-mask from Philox4x32-10, a pure function of (seed, offset, dims)
  inputs  ``seed``   int32 dims (2,): the 64-bit seed as words [lo, hi] (two's complement)
          ``offset`` int32 dims (2,): the 64-bit block counter base as words [lo, hi]
  outputs ``y``          the mask, any dtype: 1 where the element is kept, 0 where dropped
          ``offset_out`` (optional) int32 dims (2,): offset + ``advance``, words [lo, hi];
                         may be bound to the same memory as ``offset`` (engines load
                         inputs before storing outputs)
  attrs   ``distribution`` 'BERNOULLI' (the only one)
          ``drop_probability`` p in [0, 1] (a float32 value, compared in float64)
          ``block_offset`` int >= 0 added to the offset (default 0)
          ``advance`` int >= 0 blocks added for ``offset_out`` (default ceil(numel(y) / 4))

  Element n of y (row-major linear index over y's dims, whatever y's strides) uses
  block = offset + block_offset + n // 4 and lane n % 4:
      (r0, r1, r2, r3) = philox4x32_10(counter=(lo32(block), hi32(block), 0, 0),
                                       key=(lo32(seed), hi32(seed)))
      y[n] = 1 if r[n % 4] >= ceil(p * 2**32) else 0
  philox4x32_10 is Random123's (Salmon et al., SC'11): 10 rounds, multipliers
  0xD2511F53 / 0xCD9E8D57, key bumps 0x9E3779B9 / 0xBB67AE85; the counter layout is
  cuRAND's curand_init(seed, subsequence=0, offset=4*block), so a GPU engine may use
  curand4() with that state and get the same words.
"""
from __future__ import annotations

from .ir import OP_SPECS, OpSpec
from .validate import fail, rule

OP_SPECS["Rng"] = OpSpec(("seed", "offset"), (), ("y",), ("offset_out",))


@rule("Rng")
def _rng(i, op):
    a = op.attrs
    if a.get("distribution", "BERNOULLI") != "BERNOULLI":
        fail(i, op, "RNG_DISTRIBUTION", f"unknown distribution {a.get('distribution')!r}", "NOT_SUPPORTED")
    p = a.get("drop_probability")
    if not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        fail(i, op, "RNG_PROBABILITY", f"drop_probability must be a number in [0, 1], got {p!r}")
    for name in ("block_offset", "advance"):
        v = a.get(name, 0)
        if not isinstance(v, int) or v < 0:
            fail(i, op, "RNG_COUNTER", f"{name} must be a non-negative int, got {v!r}")
    roles = dict(op.inputs)
    if "offset_out" in op.outputs:
        roles["offset_out"] = op.outputs["offset_out"]
    for role, t in roles.items():
        if t.dtype != "int32" or t.dims != (2,) or t.is_by_value:
            fail(i, op, "RNG_STATE", f"{role} must be an int32 tensor of dims (2,) (words lo, hi), got {t.dtype}{list(t.dims)}")
