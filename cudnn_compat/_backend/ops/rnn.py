"""The op kinds of dropout and RNN graphs, their spec rows, rules and shape functions (``row_map``,
``rows_of``, ``recurrence_shapes``): ``Rng`` (dropout masks) and the composite
``RNNRecurrence`` / ``RNNRecurrenceBackward`` (one op per layer: the recurrence over every time
step and every direction of that layer).

Why composite recurrence ops.  An RNN layer is an input projection over all time steps (one Matmul:
an op of its own, or inside the recurrence op in its ``x`` form) followed by a recurrence: per step
h_t = cell(Gx[t] + h_{t-1} R^T).  The IR has no slice or offset concept: a tensor is a whole buffer
view, so "row t of Gx" or "gate k of the (g*H)-wide pre-activation" can only be expressed as a
separate external tensor bound at an offset, and the step's gate product must be split into one
Matmul per gate so each gate's result is its own tensor.  A pure Matmul/Pointwise graph of a T=100,
2-layer bidirectional LSTM is therefore ~3,400 ops and ~5,000 bindings per call: slow to plan, slow
to bind, and it cannot reach cuDNN's speed (every step is ~15 launches).  The composite op keeps
the whole step loop inside one op whose tensors are whole buffers; a GPU engine runs each step as
ONE GEMM over all gates (and both directions, batched) plus ONE generated cell kernel, captured
once into a CUDA graph (engines/cupy_engine/rnn.py); the reference kernel is the same per-step loop
in NumPy (engines/reference/rnn.py).  Compare the backend API of cuDNN itself, which has no
per-step RNN graph either: its RNN is a legacy-only composite.

(002 §3.2.34 cudnnDropoutForward; the backend RNG operation of cuDNN 9 takes seed and offset the
same way, as tensors.)
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

``RNNRecurrence`` -- the forward recurrence of one layer, D directions (002 §7.1.2.8 equations)
  Shapes: D directions, N sequence rows, B batch, T max steps, H hidden, Ho output width
  (= projSize for an LSTM with projection, else H), g gates (RELU/TANH 1, LSTM 4, GRU 3).
  Every tensor has a leading direction dim (any stride); "rows" are the N vectors of a sequence
  buffer: vector (t, b) of direction d is row ``row_base(t) + b * row_bstride`` (``row_map``).
  inputs  ``gx``     (D, N, g*H)  input projection + biases (for GRU gate n: W_n x + bW_n only);
                     or, instead, the projection's operands, and ``gx`` an output:
          ``x``      (D, N, I)    the layer's input rows (direction stride 0: one buffer)
          ``w_in``   (D, g*H, I)  input weights W, the g gate matrices stacked (weight space)
          ``b_x``, ``b_h`` (D, 1, g*H) input and recurrent biases bW, bR (each optional)
                     gx = x W_in^T + b_x + b_h, GRU: b_h of gates r and z only (its gate n is b_rec)
          ``w_rec``  (D, g*H, Ho) recurrent weights R, the g gate matrices stacked (weight space)
          ``wr``     (D, Ho, H)   LSTM projection matrix (present iff projection)
          ``b_rec``  (D, 1, H)    GRU recurrent bias of gate n (bR_n, inside r * (R_n h + bR_n))
          ``hx``     (D, B, Ho), ``cx`` (D, B, H): initial states (absent = 0)
          ``y_in``   (D, N, Ho)   prior contents of y: padding rows of y are copied from it
          ``fill``   by value: padding rows of y are set to it (wins over y_in)
          ``lclip``, ``rclip`` by value: LSTM cell clip bounds (present iff attr clip)
  outputs ``y``      (D, N, Ho)   h_t at row (t, b) for t < length_b
          ``gx``     (D, N, g*H)  with ``x``: the projection above, computed first (the whole layer
                     one op, so a GPU engine runs it as one program: one CUDA graph per layer)
          ``hy`` (D, B, Ho), ``cy`` (D, B, H): state after each sequence's last step
          training (all or none, per mode): ``acts`` (D, N, g*H) gate activations (LSTM i f g o,
          GRU r z n); ``c_all`` (D, N, H) LSTM cell state after clipping; ``hpre`` (D, N, H)
          LSTM h before projection; ``grn`` (D, N, H) GRU R_n h + bR_n
  attrs   ``mode`` RELU | TANH | LSTM | GRU; ``layout`` SEQ | BATCH | PACKED; ``T``;
          ``lengths`` (B ints, 0..T; PACKED: non-increasing, N = sum, else N = T*B);
          ``directions`` tuple of D bools: True runs that direction from each sequence's last
          step to its first; ``clip`` None | 'PROPAGATE' | 'NOT_PROPAGATE' (NaN rule of the clip)
  Sequence b is active at step t iff t < length_b; inactive steps leave its state unchanged.
  Padding rows (SEQ/BATCH, t >= length_b) of y get ``fill`` or ``y_in``; a padded layout needs
  one of them.  Rows of the reserve outputs at padding positions are unspecified.
  Cell (pre_k = gx_k + R_k h): RELU/TANH h = act(pre_0); LSTM i,f,o = sigmoid, g = tanh,
  c = f c + i g, clipped to [lclip, rclip] (max then min, NaN per ``clip``), h = o tanh(c), then
  h = h Wr^T with projection; GRU r, z = sigmoid(pre), n = tanh(gx_n + r (R_n h + bR_n)),
  h = (1 - z) n + z h.  sigmoid(v) = (1 + tanh(v/2)) / 2.

``RNNRecurrenceBackward`` -- gradients of one layer's recurrence (002 §8.2.18), same shapes/attrs
  inputs  ``dy`` (D, N, Ho) and ``w_rec``; by mode: ``acts`` (LSTM, GRU), ``c_all`` (LSTM),
          ``grn`` and ``y`` (GRU), ``y`` (RELU, TANH); ``wr`` (projection); ``hx`` (GRU h_prev
          of the first step), ``cx`` (LSTM c_prev of the first step), ``dhy``, ``dcy`` (absent = 0);
          ``lclip``/``rclip`` with attr clip
  outputs ``dgates`` (D, N, g*H): d(pre-activation) of each gate (GRU gate n: d(n_pre)); padding
          rows are 0 (so the input-projection backward, one Matmul, reads clean rows);
          ``dgrn`` (D, N, H) GRU d(R_n h + bR_n) = d(n_pre) * r; ``dr`` (D, N, Ho) projection:
          dy + dh_next (the gradient of the projected h); ``dhx`` (D, B, Ho), ``dcx`` (D, B, H)
  Per step in reverse order: dh = dy_t + dh_next (times Wr with projection), the cell's
  derivative gives the gate gradients, dh_prev = sum_k dG_k R_k (GRU: dG_n replaced by dgrn,
  plus dh * z), dc_prev = dc * f.
"""
from __future__ import annotations

from ._common import OpSpec, fail


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


# -- RNN recurrence -------------------------------------------------------------------------------

GATES = {"RELU": 1, "TANH": 1, "LSTM": 4, "GRU": 3}
LAYOUTS = ("SEQ", "BATCH", "PACKED")


def row_map(layout: str, T: int, lengths) -> tuple:
    """(row_base per step t, row_bstride): vector (t, b) is row row_base[t] + b * row_bstride."""
    B = len(lengths)
    if layout == "SEQ":
        return tuple(t * B for t in range(T)), 1
    if layout == "BATCH":
        return tuple(range(T)), T
    base, acc = [], 0
    for t in range(T):
        base.append(acc)
        acc += sum(1 for n in lengths if n > t)
    return tuple(base), 1


def rows_of(layout: str, T: int, lengths) -> int:
    return sum(lengths) if layout == "PACKED" else T * len(lengths)


def is_padded(layout: str, T: int, lengths) -> bool:
    return layout != "PACKED" and any(n < T for n in lengths)


def recurrence_shapes(op) -> dict:
    """Expected dims of every role of an RNNRecurrence[Backward] op, from its w_rec, gates and attrs."""
    a = op.attrs
    D, gH, Ho = op.inputs["w_rec"].dims
    H = gH // GATES[a["mode"]]
    N, B = rows_of(a["layout"], a["T"], a["lengths"]), len(a["lengths"])
    I = op.inputs["w_in"].dims[2] if "w_in" in op.inputs else 0
    seq = {"x": I, "gx": gH, "acts": gH, "dgates": gH, "y": Ho, "y_in": Ho, "dy": Ho, "dr": Ho,
           "c_all": H, "hpre": H, "grn": H, "dgrn": H}
    out = {r: (D, N, w) for r, w in seq.items()}
    out.update({r: (D, B, Ho) for r in ("hx", "hy", "dhy", "dhx")})
    out.update({r: (D, B, H) for r in ("cx", "cy", "dcy", "dcx")})
    out.update(w_rec=(D, gH, Ho), wr=(D, Ho, H), b_rec=(D, 1, H), w_in=(D, gH, I), b_x=(D, 1, gH), b_h=(D, 1, gH))
    return out


# roles an op of each mode may have beyond the common ones: (forward, backward)
_MODE_ROLES = {
    "RELU": (set(), {"y"}),
    "TANH": (set(), {"y"}),
    "LSTM": ({"cx", "cy", "acts", "c_all", "hpre", "wr", "lclip", "rclip"},
             {"acts", "c_all", "cx", "dcy", "dcx", "wr", "dr", "lclip", "rclip"}),
    "GRU": ({"b_rec", "acts", "grn"}, {"acts", "grn", "y", "hx", "dgrn"}),
}
_COMMON = ({"gx", "x", "w_in", "b_x", "b_h", "w_rec", "hx", "y_in", "fill", "y", "hy"}, {"dy", "w_rec", "dhy", "dgates", "dhx"})


def _recurrence(i, op, backward: bool):
    a = op.attrs
    mode = a.get("mode")
    if mode not in GATES:
        fail(i, op, "RNN_MODE", f"mode must be one of {sorted(GATES)}, got {mode!r}", "NOT_SUPPORTED")
    if a.get("layout") not in LAYOUTS:
        fail(i, op, "RNN_LAYOUT", f"layout must be one of {LAYOUTS}, got {a.get('layout')!r}")
    T, lengths, dirs = a.get("T"), a.get("lengths"), a.get("directions")
    if not isinstance(T, int) or T < 1:
        fail(i, op, "RNN_STEPS", f"T must be a positive int, got {T!r}")
    if not isinstance(lengths, tuple) or not lengths or any(not isinstance(n, int) or not 0 <= n <= T for n in lengths):
        fail(i, op, "RNN_LENGTHS", f"lengths must be a non-empty tuple of ints in [0, T={T}], got {lengths!r}")
    if a["layout"] == "PACKED" and any(p < q for p, q in zip(lengths, lengths[1:])):
        fail(i, op, "RNN_LENGTHS", "the PACKED layout needs non-increasing lengths")
    w = op.inputs["w_rec"]
    if w.ndim != 3 or w.dims[1] % GATES[mode]:
        fail(i, op, "RNN_WEIGHTS", f"w_rec must be (D, gates*H, Ho), got {list(w.dims)}")
    if not isinstance(dirs, tuple) or len(dirs) != w.dims[0] or any(not isinstance(v, bool) for v in dirs):
        fail(i, op, "RNN_DIRECTIONS", f"directions must be a tuple of {w.dims[0]} bools (one per w_rec), got {dirs!r}")
    clip = a.get("clip")
    if clip not in (None, "PROPAGATE", "NOT_PROPAGATE") or (clip and mode != "LSTM"):
        fail(i, op, "RNN_CLIP", f"clip must be None or a NaN mode, and only for LSTM, got {clip!r}")
    allowed = _COMMON[backward] | _MODE_ROLES[mode][backward]
    roles = {**op.inputs, **op.outputs}
    for role, t in roles.items():
        if role not in allowed:
            fail(i, op, "RNN_ROLES", f"role {role!r} does not apply to mode {mode}")
    if not backward:
        fused = "x" in op.inputs
        if fused != ("w_in" in op.inputs) or fused != ("gx" in op.outputs) or ("gx" in op.inputs) == fused \
                or (not fused and ({"b_x", "b_h"} & set(op.inputs))):
            fail(i, op, "RNN_ROLES", "gx is an input, or an output with inputs x and w_in (and the biases "
                                     "b_x, b_h only then)")
    shapes = recurrence_shapes(op)
    for role, t in roles.items():
        if role in ("fill", "lclip", "rclip"):
            if not t.is_by_value:
                fail(i, op, "RNN_SCALARS", f"{role} must be a by-value scalar")
            continue
        if t.is_by_value or t.dims != shapes[role]:
            fail(i, op, "RNN_SHAPES", f"{role} must have dims {list(shapes[role])}, got {list(t.dims)}")
    if bool(clip) != ("lclip" in roles and "rclip" in roles):
        fail(i, op, "RNN_CLIP", "lclip and rclip are given exactly when attr clip is set")
    proj = "wr" in roles
    _need(i, op, roles, proj, backward)
    if not backward and is_padded(a["layout"], T, lengths) and not ({"fill", "y_in"} & set(roles)):
        fail(i, op, "RNN_PADDING", "a padded layout needs fill or y_in (the padding rows of y)")


def _need(i, op, roles, proj, backward):
    mode = op.attrs["mode"]
    if not backward:
        want = {"LSTM": {"acts", "c_all"} | ({"hpre"} if proj else set()), "GRU": {"acts", "grn"}}.get(mode, set())
        have = want & set(roles)
        if have and have != want:
            fail(i, op, "RNN_RESERVE", f"training outputs must be all of {sorted(want)} or none, got {sorted(have)}")
        return
    want = {"LSTM": {"acts", "c_all"} | ({"dr"} if proj else set()), "GRU": {"acts", "grn", "y", "dgrn"}}.get(mode, {"y"})
    missing = want - set(roles)
    if missing:
        fail(i, op, "RNN_RESERVE", f"mode {mode} needs {sorted(missing)}")


def _rnn_recurrence(i, op):
    _recurrence(i, op, False)


def _rnn_recurrence_backward(i, op):
    _recurrence(i, op, True)


KINDS = {
    "Rng": OpSpec(("seed", "offset"), (), ("y",), ("offset_out",), rule=_rng),
    "RNNRecurrence": OpSpec(
        ("w_rec",), ("gx", "x", "w_in", "b_x", "b_h", "wr", "b_rec", "hx", "cx", "y_in", "fill", "lclip", "rclip"),
        ("y",), ("gx", "hy", "cy", "acts", "c_all", "hpre", "grn"), rule=_rnn_recurrence),
    "RNNRecurrenceBackward": OpSpec(
        ("dy", "w_rec"), ("y", "acts", "c_all", "grn", "wr", "hx", "cx", "dhy", "dcy", "lclip", "rclip"),
        ("dgates",), ("dgrn", "dr", "dhx", "dcx"), rule=_rnn_recurrence_backward),
}
