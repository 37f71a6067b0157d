"""``numpy`` engine kernel for ``Rng`` (the dropout keep-mask, cudnn_compat/_backend/ops/rnn.py; 002 §3.2.34
cudnnDropoutForward): the reference engine's Philox4x32-10 (reference/rnn.py ``rng``), which is
already integer arithmetic and bit-exact, so dropout graphs stay on this engine.  The int32
seed/offset words arrive as float64 (the plan's compute dtype for int32 data holds them exactly).
CTC loss and the spatial transformer sampler are not registered: the reference engine runs them.
Temporaries: the uint32 Philox words of the mask (4 bytes per element).
"""
from __future__ import annotations

from ..reference.rnn import rng as _reference_rng
from ._kernels import kernel


@kernel("Rng")
def rng(op, ins, dt, out):
    """y = keep mask (1 kept, 0 dropped), offset_out = offset + advance (ops/rnn.py Rng)."""
    return _reference_rng(op, ins)
