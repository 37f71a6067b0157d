"""Dropout (002 §3.2.9 cudnnCreateDropoutDescriptor, §3.2.24 Destroy, §3.2.36
DropoutGetStatesSize, §3.2.35 DropoutGetReserveSpaceSize, §3.2.80 SetDropoutDescriptor,
§3.2.43 GetDropoutDescriptor, §3.2.73 RestoreDropoutDescriptor, §3.2.34 DropoutForward,
§4.1.7 DropoutBackward).

The mask is a pure function of (seed, offset, shape): an ``Rng`` op (Philox4x32-10, exact
definition in cudnn_compat/_backend/ops/rnn.py) draws it, so every engine, CPU or GPU, gives the
same mask for the same seed.  The random-number *state* lives in the caller's ``states``
buffer, as cuRAND's did, so RestoreDropoutDescriptor re-attaches it without re-seeding:

    states (int32 words):  [0] seed lo  [1] seed hi  [2] offset lo  [3] offset hi
    (offset = Philox blocks of 4 words consumed so far; each forward advances it)

Forward: y = x * mask * scale with mask = 1 where kept and scale = 1 / (1 - p) computed in
float32 (0 when p = 1).  The mask is kept in reserveSpace, one uint8 per element in the
logical (row-major N, C, ...) order of the tensor, whatever its strides; element i of that
order uses Philox block offset + i // 4, lane i % 4.  Backward: dx = dy * mask * scale.
"""
from __future__ import annotations

import math

import numpy as np

from cudnn_compat._backend.ir import Tensor, packed_strides
from ._core import bound_graph as bg
from ._core.call import run
from ._core.data import _CUPY_NDARRAY, preflight
from ._core.lifecycle import pair
from ._core.memo import Memo, call_site
from ._core.recipes import Bound, Recipe, steady
from ._core.descriptor import Descriptor, resolve
from ._core.registry import CUPY_NAMES, legacy
from .errors import CUDNN_STATUS_INVALID_VALUE, bad_param, check, not_supported  # noqa: F401
from .handle import get_handle
from .tensor import tensor_desc

STATE_WORDS = 4
STATES_SIZE = 64  # bytes reported by DropoutGetStatesSize; the first 16 are used
MASK_ALIGN = 16


class DropoutDescriptor(Descriptor):
    """cudnnDropoutDescriptor_t: probability, the states buffer (or None) and the seed."""

    kind = "cudnnDropoutDescriptor_t"

    def __init__(self):
        super().__init__()
        self.dropout = 0.0
        self.states = None
        self.stateSizeInBytes = 0
        self.seed = 0

    def _settings(self):
        return (self.dropout, self.states is not None)

    @property
    def scale(self) -> float:
        """1 / (1 - p) in float32 arithmetic (p is a C float), and 0 when p = 1 (all dropped)."""
        if self.dropout >= 1.0:
            return 0.0
        one = np.float32(1.0)
        return float(one / (one - np.float32(self.dropout)))


def dropout_desc(arg, argname: str = "dropoutDesc") -> DropoutDescriptor:
    return resolve(arg, DropoutDescriptor, argname)


def _check_probability(dropout) -> float:
    try:
        p = float(dropout)
    except (TypeError, ValueError):
        raise bad_param("dropout", f"must be a number, got {dropout!r}") from None
    if not 0.0 <= p <= 1.0:  # each message is made only when its check fails
        check(False, "dropout", f"must be a probability in [0, 1], got {p}")
    return float(np.float32(p))  # the C argument is a float


def _check_states_size(h, states, stateSizeInBytes):
    if bg.is_null(states):
        return None
    if int(stateSizeInBytes) < STATES_SIZE:
        check(False, "stateSizeInBytes", f"{stateSizeInBytes} is less than cudnnDropoutGetStatesSize() = {STATES_SIZE}",
              CUDNN_STATUS_INVALID_VALUE)
    preflight(h, [(states, (None, STATES_SIZE), "states", True)])  # the checks of every buffer (dropout writes it)
    return states


createDropoutDescriptor, destroyDropoutDescriptor = pair(DropoutDescriptor, __name__)


@legacy("cudnnDropoutGetStatesSize")
def dropoutGetStatesSize(handle) -> int:
    """Bytes of the random-number state buffer dropout needs (002 §3.2.36)."""
    get_handle(handle)
    return STATES_SIZE


def reserve_size(numel: int) -> int:
    return -(-int(numel) // MASK_ALIGN) * MASK_ALIGN


@legacy("cudnnDropoutGetReserveSpaceSize", cupy="getDropoutReserveSpaceSize")
def dropoutGetReserveSpaceSize(xDesc) -> int:
    """One byte of mask per element, rounded up to 16 bytes (CuPy 13 spelled it
    getDropoutReserveSpaceSize; dropoutGetReserveSpaceSize works too)."""
    return reserve_size(math.prod(tensor_desc(xDesc, "xDesc").dims))


CUPY_NAMES.setdefault("dropoutGetReserveSpaceSize", "cudnnDropoutGetReserveSpaceSize")


def _words(value: int) -> list:
    """Unsigned 64-bit value -> two int32 words (two's complement), lo first."""
    out = []
    for w in (value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF):
        out.append(w - (1 << 32) if w >= (1 << 31) else w)
    return out


def write_states(handle, states, seed: int, offset: int = 0) -> None:
    """Seed a states buffer (the cuRAND init of legacy cuDNN): one graph of sixteen IDENTITY ops,
    each writing one byte of the four little-endian int32 words from a by-value scalar.  Bytes,
    not words: a value below 256 is exact in every engine's arithmetic (a GPU engine computing
    in float would round a 32-bit word)."""
    nbytes = 4 * STATE_WORDS

    def build():
        b = bg.GraphBuilder("DropoutStatesInit", "float64")
        for k in range(nbytes):
            b.pw("IDENTITY", b.scalar(f"b{k}", "float64"), out=b.ext("states", k, (1,), (1,), "uint8"))
        return b
    key = ("DropoutStatesInit", "bytes")
    bound = bg.prepare(key, build)
    raw = np.array(_words(seed) + _words(offset), "<i4").view(np.uint8)
    states, = preflight(handle, [(states, (None, STATES_SIZE), "states", True)])  # untyped: any dtype
    bg.execute(handle, key, bound, {"states": states}, {f"b{k}": int(raw[k]) for k in range(nbytes)})


@legacy("cudnnSetDropoutDescriptor")
def setDropoutDescriptor(dropoutDesc, handle, dropout, states, stateSizeInBytes, seed) -> None:
    """states NULL: only the probability is set; otherwise the states are seeded (offset 0)."""
    d = resolve(dropoutDesc, DropoutDescriptor, "dropoutDesc", need_set=False)
    h = get_handle(handle)
    p = _check_probability(dropout)
    states = _check_states_size(h, states, stateSizeInBytes)
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    d.dropout = p
    if states is not None:  # 002 §3.2.80: NULL states leave the generator (and its states) as they were
        write_states(h, states, seed)
        d.states, d.stateSizeInBytes, d.seed = states, int(stateSizeInBytes), seed
    d.touched()


@legacy("cudnnRestoreDropoutDescriptor")
def restoreDropoutDescriptor(dropoutDesc, handle, dropout, states, stateSizeInBytes, seed) -> None:
    """Re-attach states seeded earlier, without touching them (002: the seed is ignored)."""
    d = resolve(dropoutDesc, DropoutDescriptor, "dropoutDesc", need_set=False)
    h = get_handle(handle)
    p = _check_probability(dropout)
    states = _check_states_size(h, states, stateSizeInBytes)
    d.dropout, d.states, d.stateSizeInBytes, d.seed = p, states, int(stateSizeInBytes), int(seed) & 0xFFFFFFFFFFFFFFFF
    d.touched()


@legacy("cudnnGetDropoutDescriptor")
def getDropoutDescriptor(dropoutDesc, handle) -> tuple:
    """(dropout, states, seed)"""
    d = dropout_desc(dropoutDesc)
    get_handle(handle)
    return d.dropout, d.states, d.seed


# -- graph pieces shared with the RNN family ------------------------------------------

def rng_op(b: "bg.GraphBuilder", mask: Tensor, p: float, states_buf: str = "states") -> Tensor:
    """Append the Rng op drawing ``mask`` from the states buffer and advancing its offset."""
    seed = b.ext(states_buf, 0, (2,), (1,), "int32", "seed")
    offset = b.ext(states_buf, 2, (2,), (1,), "int32", "offset")
    offset_out = b.ext(states_buf, 2, (2,), (1,), "int32", "offset_out")
    b.op("Rng", {"seed": seed, "offset": offset}, {"y": mask, "offset_out": offset_out},
         {"distribution": "BERNOULLI", "drop_probability": float(p)})
    return mask


def require_states(d: DropoutDescriptor, argname: str = "dropoutDesc") -> None:
    check(d.states is not None, argname,
          "cudnnSetDropoutDescriptor was never called on it with a non-NULL states buffer")


# -- forward and backward -----------------------------------------------------------------

def _check_pair(ad, bd, a, b, an, bn):
    """002 §3.2.34 BAD_PARAM rules for an (input, output) pair; returns flat dims or None."""
    na, nb = math.prod(ad.dims), math.prod(bd.dims)
    check(na == nb, bn, f"has {nb} elements but {an} has {na}; the element counts must be equal")
    check(ad.dataType == bd.dataType, bn, "data type must equal the input's")
    if ad.dtype not in ("float32", "float64", "float16", "bfloat16"):
        raise not_supported(an, f"dropout supports floating-point data, not {ad.dtype}")
    if bg.address(a) == bg.address(b):
        check(ad.strides == bd.strides, bn, "strides must equal the input's when the operation is in place (x == y)")
    if ad.dims == bd.dims:
        return None
    packed = all(tuple(d.strides) == packed_strides(d.dims) for d in (ad, bd))
    if not packed:
        raise not_supported(bn, f"dims {bd.dims} differ from {an}'s {ad.dims}; that needs both tensors fully packed")
    return (na,)


_MASKED = Memo("cudnnDropoutForward/Backward")


def _run_masked(h, name, d, ad, a, an, bd, bout, bn, reserveSpace, reserveSpaceSizeInBytes, forward: bool):
    """The descriptor checks and the graph, once per combination of settings (``_core.memo``,
    ``_masked_entry``); then every check that depends on the data, and the run.  On the GPU place
    with CuPy reserve space and states the graph's tensors are bound as device pointers (the
    buffers' checks are made here first), else ``_core.bound_graph`` makes byte views."""
    mk, m = _masked_lookup(name, d, ad, bd)
    if m is None:
        m = _masked_entry(mk, name, d, ad, a, an, bd, bout, bn, forward)
    dims, need, key, bound, graph, same_strides, scale, prog, scale_uid = m
    if not same_strides and bg.address(a) == bg.address(bout):
        check(False, bn, "strides must equal the input's when the operation is in place (x == y)")
    if int(reserveSpaceSizeInBytes) < need:
        check(False, "reserveSpaceSizeInBytes",
              f"{reserveSpaceSizeInBytes} is less than cudnnDropoutGetReserveSpaceSize() = {need}")
    nd = _CUPY_NDARRAY[0] if _CUPY_NDARRAY else None
    states = d.states
    res_dev = type(reserveSpace) is nd and (reserveSpace._c_contiguous or reserveSpace._f_contiguous) \
        and reserveSpace.nbytes >= need  # a contiguous CuPy array big enough passes check_buffer
    if not res_dev:
        bg.check_buffer(reserveSpace, "reserveSpace", need)
    if states is None:
        require_states(d)
    st_dev = type(states) is nd and (states._c_contiguous or states._f_contiguous) and states.nbytes >= STATES_SIZE
    if forward and not st_dev:
        bg.check_buffer(states, "dropoutDesc.states", STATES_SIZE)
    if res_dev and type(states) is nd and h.place == "gpu":
        # reserve space and states are untyped (any dtype) and were checked above (NULL, contiguity, size):
        # their graph tensors are bound as device pointers at their byte offsets
        base = (a, bout, reserveSpace.data.ptr, states.data.ptr)
        run(h, key, graph, {uid: ((base[i] + off) if off else base[i], buf) for uid, i, buf, off in prog},
            {scale_uid: scale})
        return
    # reserve space and states are untyped (any dtype, docs/conventions.md "Data"): bound as bytes
    reserveSpace, states = preflight(h, [(reserveSpace, (None, need), "reserveSpace", forward),
                                         (states, (None, STATES_SIZE), "dropoutDesc.states", forward)])
    buffers = {an: a, bn: bout, "reserveSpace": reserveSpace, "states": states}
    bg.execute(h, key, bound, buffers, {"scale": scale})


def _masked_lookup(name, d, ad, bd) -> tuple:
    """(memo key, the masked entry or None) of ``name`` for these descriptors (``_MASKED``)."""
    mk = (name, id(d._key or d.key()), id(ad._key or ad.key()), id(bd._key or bd.key()))
    m = _MASKED.get(mk)
    return (mk, m) if m is not None else _MASKED.canonical((name,), (d, ad, bd))


_BUFFER_INDEX = {"reserveSpace": 2, "states": 3}  # (input, output, reserveSpace, states): the GPU binding's order


def _masked_entry(mk, name, d, ad, a, an, bd, bout, bn, forward: bool) -> tuple:
    """The memo entry of dropout forward (``forward``) or backward for these descriptors: the
    descriptor checks of 002 §3.2.34 / §4.1.7 (``_check_pair``), then the graph (Rng drawing the
    mask into reserveSpace, forward only; out = in * mask * scale) and its binding program:
    (dims, reserve bytes needed, plan key, bound graph, its graph as ``run``'s build function, same
    strides, scale, ((uid, buffer index, buffer name, byte offset), ...), the scale's uid)."""
    flat = _check_pair(ad, bd, a, bout, an, bn)
    dims = bd.dims if flat is None else flat
    need = reserve_size(math.prod(dims))

    def build():
        b = bg.GraphBuilder(name, "float64" if bd.dtype == "float64" else "float32")
        src = b.ext(an, 0, dims if flat else ad.dims, None if flat else ad.strides, ad.dtype)
        dst = b.ext(bn, 0, dims if flat else bd.dims, None if flat else bd.strides, bd.dtype)
        mask = b.ext("reserveSpace", 0, dims, None, "uint8", "mask")
        if forward:
            rng_op(b, mask, d.dropout)
        b.pw("MUL", src, mask, out=dst, alpha1=b.scalar("scale"))
        return b

    key = (name, ad.key(), bd.key(), d.dropout if forward else None)
    bound = bg.prepare(key, build)
    index = {an: 0, bn: 1, **_BUFFER_INDEX}
    prog = tuple((uid, index[buf], buf, off) for uid, (buf, off) in bound.bindings.items())
    scale_uid, = bound.scalar_names
    return _MASKED.put(mk, (dims, need, key, bound, lambda: bound.graph, ad.strides == bd.strides, d.scale, prog,
                            scale_uid),
                       (d.key(), ad.key(), bd.key()))


_FWD_SITES, _BWD_SITES = Memo("cudnnDropoutForward sites"), Memo("cudnnDropoutBackward sites")


def _resolve(handle, dropoutDesc, aDesc, an, bDesc, bn):
    """(handle, dropout descriptor, input and output tensor descriptors, True): once per combination
    of settings (``_core.memo`` call sites)."""
    return get_handle(handle), dropout_desc(dropoutDesc), tensor_desc(aDesc, an), tensor_desc(bDesc, bn), True


_FWD_SITE, _BWD_SITE = call_site(_FWD_SITES)(_resolve), call_site(_BWD_SITES)(_resolve)


@legacy("cudnnDropoutForward")
def dropoutForward(handle, dropoutDesc, xDesc, x, yDesc, y, reserveSpace, reserveSpaceSizeInBytes) -> None:
    """Dropout forward: zero about a fraction p of x, scale the rest by 1/(1-p), mask kept in reserveSpace
    (002 §3.2.34)."""
    h, d, xd, yd, _ = _FWD_SITE((handle, dropoutDesc, xDesc, yDesc), handle, dropoutDesc, xDesc, "xDesc", yDesc,
                                "yDesc")
    _run_masked(h, "DropoutForward", d, xd, x, "x", yd, y, "y", reserveSpace, reserveSpaceSizeInBytes, True)


def _masked_recipe(name: str, an: str, bn: str):
    """The steady recipe (``_core.recipes``) of dropout forward (``name``) or backward on the GPU
    place: the masked entry's graph bound as ``_run_masked``'s device-pointer branch binds it (the
    data as given, reserve space and the descriptor's states as addresses); none when that branch
    would not run (the CPU place, states that are not a contiguous CuPy array) or when an in-place
    call would need a per-call stride check."""
    def recipe(h, d, ad, bd, _):
        nd = _CUPY_NDARRAY[0] if _CUPY_NDARRAY else None
        states = d.states
        if h.place != "gpu" or type(states) is not nd or not (states._c_contiguous or states._f_contiguous) \
                or states.nbytes < STATES_SIZE:
            return None
        _mk, m = _masked_lookup(name, d, ad, bd)
        if m is None or not m[5]:  # not yet made; in place with other strides: the Python path checks
            return None
        _dims, need, key, bound, _graph, _same, scale, _prog, _uid = m
        buffers = {an: (an, None, None, None), bn: (bn, None, None, None),
                   "reserveSpace": ("reserveSpace", None, need, None), "states": (None, states, STATES_SIZE, None)}
        return Recipe.of_bound(h, Bound(buffers, ((key, bound, {"scale": scale}),),
                                        minimum={"reserveSpaceSizeInBytes": need}))
    return recipe


dropoutForward = steady(dropoutForward, _FWD_SITES, ("handle", "dropoutDesc", "xDesc", "yDesc"),
                        _masked_recipe("DropoutForward", "x", "y"))


@legacy("cudnnDropoutBackward")
def dropoutBackward(handle, dropoutDesc, dyDesc, dy, dxDesc, dx, reserveSpace, reserveSpaceSizeInBytes) -> None:
    """Dropout backward: dx from dy and the mask saved in reserveSpace (002 §4.1.7)."""
    h, d, dyd, dxd, _ = _BWD_SITE((handle, dropoutDesc, dyDesc, dxDesc), handle, dropoutDesc, dyDesc, "dyDesc",
                                  dxDesc, "dxDesc")
    _run_masked(h, "DropoutBackward", d, dyd, dy, "dy", dxd, dx, "dx", reserveSpace, reserveSpaceSizeInBytes, False)


dropoutBackward = steady(dropoutBackward, _BWD_SITES, ("handle", "dropoutDesc", "dyDesc", "dxDesc"),
                         _masked_recipe("DropoutBackward", "dy", "dx"))
