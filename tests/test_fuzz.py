"""Fuzzing the main legacy calls (issue 10): random descriptors, layouts, data types, settings,
scalars, buffers and faults, against oracles written here in plain NumPy.

Every call must end one of two ways:
  * it returns, and every output equals the independent NumPy computation of this file (rounded to
    the output's data type, within a tolerance per type), and no byte of an output buffer outside
    the elements its descriptor addresses changed;
  * it raises ``CuDNNError`` with a status 002 allows for that function (BAD_PARAM, NOT_SUPPORTED,
    INVALID_VALUE for ReduceTensor buffers), naming the function, and no output byte changed.
A crash, a hang, any other exception, a silently wrong number or a write on a rejected call fails.
A call the generator made valid (no fault, no ``must_reject`` reason) must succeed, unless a row of
the status table (docs/status_rules.md) that this property lists in ``MAY_REFUSE`` (rules the
generator does not model, like the convolution algorithm tables) matches the refusal; and each
property has a floor (``FLOORS``) on the share of its calls whose outputs reach the NumPy oracle,
checked when the property finishes: a function that refuses everything fails both ways.

Rules checked exactly (independently of the code under test):
  rule_setter_contract   a descriptor setter accepts exactly the specs 002 allows (dims > 0, strides
                         >= 0, 2^31 limits, enum values, vector types with NCHW_VECT_C) and a rejected
                         set leaves the descriptor unset
  rule_bad_handle_or_descriptor_is_bad_param   NULL, 0, destroyed, never-set, wrong-kind or junk
                         handles and descriptors give BAD_PARAM before anything else
  rule_bad_buffer_or_scalar_is_rejected        NULL, short, non-contiguous, object, foreign (CUDA
                         interface on the CPU place) or read-only output buffers and non-number
                         scalars are rejected
  rule_rejected_call_writes_nothing / rule_no_write_outside_descriptor
  plus per function the dims / data type / configuration rules that 002 states (must_reject below).

Size: a few thousand examples in CI (derandomized: the same examples each run); set
CUDNN_COMPAT_FUZZ_EXAMPLES=100000 for a full run (random), e.g. with benchmarks/fuzz_nightly.py,
which also prints the outcome counts gathered in ``STATS``.
"""
from __future__ import annotations

import collections
import ctypes
import functools
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import cudnn_compat as cc
from cudnn_compat.errors import CuDNNError

# -- size -------------------------------------------------------------------------------------------

FULL = int(os.environ.get("CUDNN_COMPAT_FUZZ_EXAMPLES", "0") or 0)  # total cases over the suite
BATCH = max(1, int(os.environ.get("CUDNN_COMPAT_FUZZ_BATCH", "1") or 1))  # cases per hypothesis example
CI_PER_WEIGHT = int(os.environ.get("CUDNN_COMPAT_FUZZ_CI", "40"))
WEIGHTS = {  # relative share of the examples per property
    "setters": 6, "lifecycle": 2, "add_tensor": 5, "op_tensor": 5, "reduce_tensor": 5, "transform_tensor": 4,
    "activation_forward": 5, "activation_backward": 5, "softmax_forward": 4, "pooling_forward": 5,
    "convolution_forward": 6, "convolution_backward_data": 5, "convolution_backward_filter": 5,
    "batchnorm_inference": 4, "batchnorm_training": 4, "lrn_forward": 4,
}
STATS: collections.Counter = collections.Counter()  # (property, outcome) -> count


def fuzz(name: str):
    """Hypothesis settings for property ``name``: CI size, or its share of CUDNN_COMPAT_FUZZ_EXAMPLES;
    the property then checks its floor (``FLOORS``) on the share of calls that reached the oracle."""
    w = WEIGHTS[name]
    n = max(1, FULL * w // sum(WEIGHTS.values()) // (BATCH if name not in ("setters", "lifecycle") else 1)) \
        if FULL else CI_PER_WEIGHT * w
    s = settings(max_examples=n, deadline=None, database=None, derandomize=not FULL, print_blob=True,
                 suppress_health_check=list(HealthCheck))

    def deco(test):
        inner = s(test)
        if name not in FLOORS:
            return inner

        def run():
            before = _calls(name)
            inner()
            check_floor(name, before)
        run.__name__ = run.__qualname__ = inner.__name__
        run.__doc__, run.__module__, run.hypothesis = inner.__doc__, inner.__module__, inner.hypothesis
        return run
    return deco


# the least share of a property's calls (faulted ones included) whose outputs are checked against the
# oracle: about 30% of the share the derandomized CI examples reach (measured 2026-11-28: add 60%,
# op 44%, reduce 29%, transform 46%, activation 34/27%, softmax 51%, pooling 44%, convolution 21/19/12%,
# batch norm 31%, LRN 32%).  A GPU or nightly run draws other examples, and its --batch cases share one
# injected fault, so its share swings widely (batch norm training: 42% and 18% in two H100/H200 runs of
# 160 calls); the floor catches a function that refuses what it should run, not a few points' drift
FLOORS = {
    "add_tensor": 0.175, "op_tensor": 0.125, "reduce_tensor": 0.085, "transform_tensor": 0.135,
    "activation_forward": 0.1, "activation_backward": 0.075, "softmax_forward": 0.15, "pooling_forward": 0.125,
    "convolution_forward": 0.06, "convolution_backward_data": 0.05, "convolution_backward_filter": 0.03,
    "batchnorm_inference": 0.09, "batchnorm_training": 0.09, "lrn_forward": 0.09,
}
# per property: rules of docs/status_rules.md (the Rule column) that may refuse a call the generator
# made valid, because the generator does not model them; any other refusal of a valid call fails
MAY_REFUSE = {
    "convolution_forward": ("the algo does not support the parameters (tables 17-22)",),
    "convolution_backward_data": ("the algo does not support the parameters",),
    "convolution_backward_filter": ("the algo does not support the parameters",),
}


def _calls(prop) -> tuple:
    """(calls made, calls whose outputs reached the oracle) of property ``prop`` so far."""
    n = sum(v for (p, k), v in STATS.items() if p == prop and (k == "ok" or k.startswith("CUDNN_STATUS_")))
    return n, STATS[prop, "oracle"]


def check_floor(prop, before) -> None:
    (n0, o0), (n1, o1) = before, _calls(prop)
    n, o = n1 - n0, o1 - o0
    assert n > 0, f"{prop}: no call was made"
    assert o / n >= FLOORS[prop], (f"{prop}: only {o} of {n} calls ({o / n:.0%}) reached the oracle, under its floor "
                                   f"{FLOORS[prop]:.0%}: the function refuses calls it should run")


@functools.lru_cache(maxsize=None)
def status_table() -> dict:
    """docs/status_rules.md: function -> [(status name, rule, match)] (the per-function rows)."""
    doc = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs", "status_rules.md")
    rows: dict = {}
    with open(doc, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| cudnn") and len(cells) == 5 and cells[3].startswith("`"):
                rows.setdefault(cells[0], []).append((cells[1], cells[2], cells[3].strip("`")))
    return rows


def explain_refusal(prop, fname, e) -> None:
    """A refused call the generator made valid: a row of the status table that ``MAY_REFUSE`` lists for
    ``prop`` must match it (its status, and its match text in the message), else it is a failure."""
    rules = MAY_REFUSE.get(prop, ())
    rows = [r for r in status_table().get(fname, []) if r[1] in rules]
    assert len(rows) == len(rules), f"{prop}: MAY_REFUSE names rules that docs/status_rules.md lacks for {fname}"
    text = str(e)
    hit = [rule for status, rule, match in rows if "CUDNN_STATUS_" + status == e.status_name and match in text]
    assert hit, (f"{fname} refused a valid call ({e}); no rule this property may hit matches "
                 f"(allowed: {list(rules) or 'none: the call must succeed'})")
    STATS[prop, "refused by rule"] += 1


# -- constants ----------------------------------------------------------------------------------------

BAD, NS, INVALID = cc.CUDNN_STATUS_BAD_PARAM, cc.CUDNN_STATUS_NOT_SUPPORTED, cc.CUDNN_STATUS_INVALID_VALUE
F32, F64, F16, BF16 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_HALF, cc.CUDNN_DATA_BFLOAT16
I8, U8, I32, I64 = cc.CUDNN_DATA_INT8, cc.CUDNN_DATA_UINT8, cc.CUDNN_DATA_INT32, cc.CUDNN_DATA_INT64
I8x4, U8x4, I8x32 = cc.CUDNN_DATA_INT8x4, cc.CUDNN_DATA_UINT8x4, cc.CUDNN_DATA_INT8x32
NCHW, NHWC, VECT_C = cc.CUDNN_TENSOR_NCHW, cc.CUDNN_TENSOR_NHWC, cc.CUDNN_TENSOR_NCHW_VECT_C
STORAGE = {F32: np.float32, F64: np.float64, F16: np.float16, BF16: np.uint16, I8: np.int8, U8: np.uint8,
           I32: np.int32, I64: np.int64, I8x4: np.int8, U8x4: np.uint8, I8x32: np.int8}
FLOATS = {F32, F64, F16, BF16}
VECTOR = {I8x4: 4, U8x4: 4, I8x32: 32}
VALID_DTYPES = set(STORAGE)
LIMIT = 2 ** 31
DIM_MAX = 8
# relative tolerance per output data type (after rounding the oracle to that type)
RTOL = {F64: 1e-9, F32: 2e-5, F16: 4e-3, BF16: 3e-2}
RTOL_GPU = {F64: 1e-9, F32: 5e-3, F16: 1e-2, BF16: 3e-2}  # TF32 under DEFAULT_MATH, float accumulation

# The handle every property calls through: the CPU reference engine, or the GPU engines with
# CUDNN_COMPAT_FUZZ_PLACE=gpu (NumPy buffers are staged to the device and back; test_fuzz_on_the_gpu).
PLACE = os.environ.get("CUDNN_COMPAT_FUZZ_PLACE", "cpu")
H = cc.cudnnCreate(PLACE)
_DEAD_HANDLE = cc.cudnnCreate("cpu")
cc.cudnnDestroy(_DEAD_HANDLE)


class FakeDeviceArray:
    """A foreign (device) buffer: ``__cuda_array_interface__`` only; the CPU place must refuse it."""

    def __init__(self, nbytes):
        self.__cuda_array_interface__ = {"data": (0xDEAD000, False), "shape": (max(nbytes, 1),), "typestr": "|u1",
                                         "version": 3}


# -- own layout and number helpers (independent of cudnn_compat) --------------------------------------

def packed(dims, fmt=NCHW) -> tuple:
    """Element strides of a packed tensor: NCHW (W innermost) or NHWC (C innermost)."""
    n = len(dims)
    order = [0] + list(range(2, n)) + [1] if fmt == NHWC and n >= 2 else list(range(n))
    strides, acc = [0] * n, 1
    for ax in reversed(order):
        strides[ax] = acc
        acc *= dims[ax]
    return tuple(strides)


def spatially_unpacked(info) -> bool:
    """Over 5 dims, activation and softmax take only tensors packed in their spatial dims (w stride 1,
    each spatial stride the next one's times its dim; 002 §3.2.1, §3.2.96): NOT_SUPPORTED otherwise."""
    d, s = info.dims, info.strides
    return len(d) > 5 and not (s[-1] == 1 and all(s[i] == s[i + 1] * d[i + 1] for i in range(2, len(d) - 1)))


def prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


class Info:
    """What a set descriptor describes: data type, dims, element strides."""

    def __init__(self, dtype, dims, strides):
        self.dtype, self.dims, self.strides = int(dtype), tuple(int(d) for d in dims), tuple(int(s) for s in strides)

    @property
    def nb(self) -> int:
        return len(self.dims)

    @property
    def item(self) -> int:
        return np.dtype(STORAGE[self.dtype]).itemsize

    @property
    def extent(self) -> int:
        return 1 + sum((d - 1) * s for d, s in zip(self.dims, self.strides))

    def offsets(self) -> np.ndarray:
        off = np.zeros(self.dims, np.int64)
        for ax, (d, s) in enumerate(zip(self.dims, self.strides)):
            shape = [1] * self.nb
            shape[ax] = d
            off = off + (np.arange(d, dtype=np.int64) * s).reshape(shape)
        return off

    def overlapping(self) -> bool:
        off = self.offsets()
        return np.unique(off).size < off.size

    def __repr__(self):
        return f"Info(dtype={self.dtype}, dims={self.dims}, strides={self.strides})"


def bf16_bits_to_f64(u16) -> np.ndarray:
    return (np.asarray(u16, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f64_to_bf16_bits(v) -> np.ndarray:
    f = np.asarray(v, np.float64).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), r)


def load(raw: np.ndarray, info: Info) -> np.ndarray:
    """The described elements of byte buffer ``raw`` as float64."""
    st_ = STORAGE[info.dtype]
    base = raw[:info.extent * info.item].view(st_)
    v = np.lib.stride_tricks.as_strided(base, info.dims, tuple(s * info.item for s in info.strides))
    return bf16_bits_to_f64(v) if info.dtype == BF16 else v.astype(np.float64)


def rounded(values, dtype) -> np.ndarray:
    """float64 values as the output type stores them (round to nearest even; integers saturate)."""
    v = np.asarray(values, np.float64)
    with np.errstate(all="ignore"):
        if dtype == BF16:
            return bf16_bits_to_f64(f64_to_bf16_bits(v))
        if dtype in FLOATS:
            return v.astype(STORAGE[dtype]).astype(np.float64)
        info = np.iinfo(STORAGE[dtype])
        return np.clip(np.rint(np.nan_to_num(v)), info.min, info.max)


def touched_bytes(info: Info, nbytes: int) -> np.ndarray:
    mask = np.zeros(nbytes, bool)
    off = np.unique(info.offsets()) * info.item
    for b in range(info.item):
        mask[off + b] = True
    return mask


def fill(raw: np.ndarray, info: Info, rng, scale=2.0, positive=False) -> None:
    """Random values in the whole buffer (valid numbers of the descriptor's type)."""
    st_ = STORAGE[info.dtype]
    n = raw.nbytes // info.item
    typed = raw[:n * info.item].view(st_)
    if info.dtype in FLOATS:
        v = rng.standard_normal(n) * scale
        if positive:
            v = np.abs(v) + 0.25
        typed[...] = f64_to_bf16_bits(v) if info.dtype == BF16 else v.astype(st_)
    else:
        lo, hi = (0, 12) if positive or st_ == np.uint8 else (-12, 12)
        typed[...] = rng.integers(lo, hi, n).astype(st_)


# -- outcome of one call -------------------------------------------------------------------------------

class Out:
    """An output buffer: its bytes before the call, the descriptor info, the expected values."""

    def __init__(self, name, raw, info):
        self.name, self.raw, self.info = name, raw, info
        self.before = raw.copy()
        self.want = None  # float64 array of info.dims, set by the oracle
        self.mag = None  # magnitude bound for the tolerance (scalar or array)


def check_outputs(outs, fname):
    for o in outs:
        if o.info is None:
            continue
        # rule_no_write_outside_descriptor
        mask = touched_bytes(o.info, o.raw.nbytes)
        changed = np.nonzero((o.raw != o.before) & ~mask)[0]
        assert changed.size == 0, f"{fname}: {o.name} bytes {changed[:8]} outside the descriptor were written"
        if o.want is None or o.info.overlapping():
            continue  # several elements share an address: which write lands is unspecified
        got = load(o.raw, o.info)
        want = rounded(o.want, o.info.dtype)
        mag = np.maximum(1.0, np.abs(o.mag if o.mag is not None else o.want))
        if o.info.dtype in FLOATS:
            tol = (RTOL_GPU if H.place == "gpu" else RTOL)[o.info.dtype] * mag
        else:
            tol = np.full(got.shape, 1.0)
        with np.errstate(invalid="ignore"):
            ok = (np.isnan(got) & np.isnan(want)) | (got == want) | (np.abs(got - want) <= tol)
        if not ok.all():
            idx = tuple(int(i) for i in np.argwhere(~ok)[0])
            raise AssertionError(f"{fname}: {o.name}{list(idx)} = {got[idx]!r}, want {want[idx]!r} "
                                 f"(tol {np.broadcast_to(tol, got.shape)[idx]:.3g}; {o.info}); "
                                 f"{int((~ok).sum())} of {ok.size} differ")


def invoke(prop, fn, args, outs, allowed, must_reject=(), must_bad=(), oracle=None):
    """Call ``fn(*args)`` and hold it to the contract of the module docstring.  ``must_reject``: reasons
    (rules) the call has to be refused for; ``must_bad``: reasons that make it BAD_PARAM exactly.
    ``oracle()`` fills each Out's ``want`` when the call succeeded.  Returns 'ok' or the status name."""
    try:
        fn(*args)
    except CuDNNError as e:
        STATS[prop, e.status_name] += 1
        assert e.status in allowed, f"{fn.__name__}: status {e.status_name} is not one 002 gives here: {e}"
        if must_bad:
            assert e.status == BAD, f"{fn.__name__}: {must_bad} must give BAD_PARAM, got {e}"
        assert e.function == fn.__name__, f"error names {e.function!r}, not {fn.__name__}: {e}"
        for o in outs:  # rule_rejected_call_writes_nothing
            assert np.array_equal(o.raw, o.before), f"{fn.__name__} rejected ({e}) but wrote {o.name}"
        if not (list(must_bad) + list(must_reject)):  # a call the generator made valid
            explain_refusal(prop, fn.__name__, e)
        return e.status_name
    reasons = list(must_bad) + list(must_reject)
    assert not reasons, f"{fn.__name__} accepted a call it must refuse: {reasons}"
    STATS[prop, "ok"] += 1
    if oracle is not None:
        oracle()
        STATS[prop, "oracle"] += 1
    check_outputs(outs, fn.__name__)
    return "ok"


# -- random choices ---------------------------------------------------------------------------------------
# Hypothesis drives each example (seed and injected fault, derandomized in CI, shrunk on failure); the
# many small choices of an example come from a NumPy generator on that seed, which costs microseconds
# where a hypothesis draw costs a few hundred (100,000 examples must fit in minutes).

SEEDS = st.integers(0, 2 ** 64 - 1)
FAULTS = st.tuples(st.sampled_from([False, False, False, True]), st.integers(0, 2 ** 16), st.integers(0, 2 ** 16))


_CUMULATIVE: dict = {}


def cases(body):
    """Run an example's body on BATCH derived seeds (1 in CI; benchmarks/fuzz_nightly.py raises it to
    spread hypothesis' own per-example cost, a few milliseconds, over several cases).  A failing case
    names its seed and fault, so ``body(seed, fault)`` reproduces it alone."""
    @functools.wraps(body)
    def run(seed, fault):
        for k in range(BATCH):
            s = (seed + k * 0x9E3779B97F4A7C15) % 2 ** 64
            f = (fault[0], fault[1] + k, fault[2] + k)
            try:
                body(s, f)
            except Exception as e:
                e.add_note(f"failing case: {body.__name__}.hypothesis.inner_test.__wrapped__({s}, {f})")
                raise
    return run


class Rand:
    def __init__(self, seed):
        self.g = np.random.default_rng(seed)

    def int(self, lo, hi):
        return int(self.g.integers(lo, hi + 1))

    def chance(self, p=0.5) -> bool:
        return bool(self.g.random() < p)

    def coin(self) -> bool:
        return self.chance(0.5)

    def pick(self, seq):
        seq = list(seq)
        return seq[int(self.g.integers(len(seq)))]

    def pick_w(self, pairs):
        """A value from ((value, weight), ...)."""
        cum = _CUMULATIVE.get(pairs)
        if cum is None:
            cum = _CUMULATIVE[pairs] = (tuple(v for v, _ in pairs), np.cumsum([w for _, w in pairs], dtype=float))
        values, c = cum
        return values[int(np.searchsorted(c, self.g.random() * c[-1], side="right"))]

    def perm(self, n):
        return [int(i) for i in self.g.permutation(n)]

    def value(self):
        """A scalar value: a round one or a uniform float32."""
        if self.chance(0.6):
            return self.pick([0.0, 1.0, -1.0, 0.5, 2.0, -1.5, 0.25])
        return float(np.float32(self.g.uniform(-3, 3)))


DTYPE_CHOICE = ((F32, 12), (F64, 4), (F16, 4), (BF16, 2), (I8, 2), (I32, 1), (U8, 1), (I64, 1), (I8x4, 1), (99, 1),
                (-1, 1))
STRIDE_KINDS = (("packed", 12), ("nhwc", 4), ("gapped", 4), ("permuted", 3), ("zero", 1), ("overlap", 1),
                ("negative", 1), ("huge", 1))
HUGE = [LIMIT - 1, LIMIT, 2 ** 40, 2 ** 63, 2 ** 70]


def draw_strides(R, dims, kind=None):
    """(kind, strides): packed NCHW/NHWC, gapped or permuted, or broken on purpose (zero, overlapping,
    negative, over 2^31)."""
    kind = kind or R.pick_w(STRIDE_KINDS)
    n = len(dims)
    if kind == "nhwc":
        return kind, packed(dims, NHWC)
    if kind in ("gapped", "permuted"):
        order = R.perm(n) if kind == "permuted" else list(range(n))
        strides, acc = [0] * n, 1
        for ax in reversed(order):
            acc += R.int(0, 2) if kind == "gapped" else 0
            strides[ax] = acc
            acc *= max(dims[ax], 1)
        return kind, tuple(strides)
    s = list(packed(dims))
    if kind == "packed" or n == 0:
        return kind, tuple(s)
    ax = R.int(0, n - 1)
    if kind == "zero":
        s[ax] = 0
    elif kind == "overlap":
        s[ax] = max(1, s[ax] // 2) if s[ax] > 1 else 0
    elif kind == "negative":
        s[ax] = -max(1, s[ax])
    else:
        s[ax] = R.pick(HUGE)
    return kind, tuple(s)


def draw_dims(R, nb, lo=1, hi=4, fault=0.02):
    """nb dims in [lo, hi]; now and then a zero or negative one (a setter fault)."""
    dims = [R.int(lo, hi) for _ in range(nb)]
    if nb and R.chance(fault):
        dims[R.int(0, nb - 1)] = R.pick([0, -1, -7])
    return tuple(dims)


def draw_tensor_spec(R, dims, dtype=None, fault=0.02, stride_kind=None):
    """A recipe for a tensor descriptor: which setter, data type, format, dims, strides."""
    dtype = R.pick_w(DTYPE_CHOICE) if dtype is None else dtype
    if R.chance(fault):
        dtype = R.pick_w(DTYPE_CHOICE)
    kind, strides = draw_strides(R, dims, stride_kind)
    fmt = NHWC if kind == "nhwc" else NCHW
    if dtype in VECTOR:
        fmt = VECT_C
    if kind in ("packed", "nhwc"):
        hows = ["nd", "ndex"] + (["4d"] if len(dims) == 4 else [])
    else:
        hows = ["nd"] + (["4dex"] if len(dims) == 4 else [])
    return {"how": R.pick(hows), "dtype": dtype, "fmt": fmt, "dims": tuple(dims), "strides": strides}


def setter_violations(spec) -> set:
    """The statuses 002 gives for a tensor/filter setter spec (empty: it must be accepted)."""
    how, dtype, fmt, dims, strides = spec["how"], spec["dtype"], spec["fmt"], spec["dims"], spec["strides"]
    if any(not -LIMIT <= x < LIMIT for x in list(dims) + (list(strides) if how in ("nd", "4dex") else [])):
        return {BAD}  # issue 13: a value no C int holds is BAD_PARAM (argument conversion) before any rule
    v = set()
    if dtype not in VALID_DTYPES:
        v.add(BAD)
    if how in ("4d", "ndex", "filter") and fmt not in (NCHW, NHWC, VECT_C):
        v.add(BAD)
    if how in ("nd", "4dex") and dtype in VECTOR:
        v.add(BAD)  # vector types need a format
    if how in ("4d", "ndex", "filter") and dtype in VALID_DTYPES:
        if (fmt == VECT_C) != (dtype in VECTOR):
            v.add(BAD)
        elif dtype in VECTOR and len(dims) > 1 and dims[1] > 0 and dims[1] % VECTOR[dtype]:
            v.add(BAD)
    if how in ("nd", "ndex", "filter") and not 3 <= len(dims) <= DIM_MAX:
        v.add(NS)
        if not dims:
            v.add(BAD)  # nbDims <= 0 is not a rank at all
    if any(d <= 0 for d in dims):
        v.add(BAD)
    elif prod(dims) >= LIMIT:
        v.add(NS)
    if how in ("nd", "4dex"):
        if any(s < 0 for s in strides):
            v.add(BAD)
        if any(s >= LIMIT for s in strides):
            v.add(NS)
        if all(d > 0 for d in dims) and all(s >= 0 for s in strides) and \
                1 + sum((d - 1) * s for d, s in zip(dims, strides)) >= LIMIT:
            v.add(NS)
    return v


class Scope:
    """Descriptors made for one example, destroyed at its end (memory stays flat over 100k examples)."""

    def __init__(self):
        self.items = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for d, destroy in reversed(self.items):
            try:
                destroy(d)
            except CuDNNError:
                pass  # destroyed on purpose (a stale-descriptor fault)
        return False

    def add(self, d, destroy):
        self.items.append((d, destroy))
        return d


BAD_DESC_KINDS = (("null", 2), ("zero", 1), ("stale", 3), ("unset", 2), ("wrong", 2), ("junk", 1))


def bad_descriptor(scope, kind, create, destroy):
    """A descriptor argument that must give BAD_PARAM: NULL, 0, destroyed (object or plain id), never
    set, a descriptor of another kind, junk."""
    if kind == "null":
        return None
    if kind == "zero":
        return 0
    if kind == "stale":
        d = create()
        destroy(d)
        return int(d) if int(d) % 2 else d
    if kind == "unset":
        return scope.add(create(), destroy)
    if kind == "wrong":
        if create is cc.cudnnCreateActivationDescriptor:
            return scope.add(cc.cudnnCreateTensorDescriptor(), cc.cudnnDestroyTensorDescriptor)
        return scope.add(cc.cudnnCreateActivationDescriptor(), cc.cudnnDestroyActivationDescriptor)
    return "junk"


def make_tensor(scope, spec, filter_=False):
    """Create and set a tensor (or filter) descriptor from ``spec``, checking rule_setter_contract.
    Returns (descriptor, Info or None when the setter refused it)."""
    create, destroy = ((cc.cudnnCreateFilterDescriptor, cc.cudnnDestroyFilterDescriptor) if filter_ else
                       (cc.cudnnCreateTensorDescriptor, cc.cudnnDestroyTensorDescriptor))
    d = scope.add(create(), destroy)
    how, dtype, fmt, dims, strides = spec["how"], spec["dtype"], spec["fmt"], spec["dims"], spec["strides"]
    viol = setter_violations(dict(spec, how="filter") if filter_ else spec)
    try:
        if filter_:
            if len(dims) == 4 and spec.get("four"):
                cc.cudnnSetFilter4dDescriptor(d, dtype, fmt, *dims)
            else:
                cc.cudnnSetFilterNdDescriptor(d, dtype, fmt, len(dims), list(dims))
        elif how == "4d":
            cc.cudnnSetTensor4dDescriptor(d, fmt, dtype, *dims)
        elif how == "4dex":
            cc.cudnnSetTensor4dDescriptorEx(d, dtype, *dims, *strides)
        elif how == "ndex":
            cc.cudnnSetTensorNdDescriptorEx(d, fmt, dtype, len(dims), list(dims))
        else:
            cc.cudnnSetTensorNdDescriptor(d, dtype, len(dims), list(dims), list(strides))
    except CuDNNError as e:
        assert viol, f"setter refused a valid spec {spec}: {e}"
        assert e.status in viol, f"setter gave {e.status_name} for {spec}; 002 says {viol}: {e}"
        assert e.function.startswith("cudnnSet" + ("Filter" if filter_ else "Tensor")), f"error names {e.function}"
        with pytest.raises(CuDNNError) as e2:  # a refused set leaves the descriptor unset
            (cc.cudnnGetFilterNdDescriptor if filter_ else cc.cudnnGetTensorNdDescriptor)(d)
        assert e2.value.status == BAD
        return d, None
    assert not viol, f"setter accepted {spec} although 002 gives {viol}"
    if filter_ or how in ("4d", "ndex"):
        strides = packed(dims, NHWC if fmt == NHWC else NCHW)
    if filter_:
        got = cc.cudnnGetFilterNdDescriptor(d)
        assert (got[0], tuple(got[3])) == (dtype, tuple(dims)), f"filter getter {got} != {spec}"
    else:
        got = cc.cudnnGetTensorNdDescriptor(d)
        assert (got[0], got[1], tuple(got[2]), tuple(got[3])) == (dtype, len(dims), tuple(dims), tuple(strides)), \
            f"tensor getter {got} != {spec} (strides {strides})"
    return d, Info(dtype, dims, strides)


class TArg:
    """A tensor argument as passed: descriptor, data, its Info and byte buffer, and its fault if any."""

    def __init__(self, desc, info, raw=None, data=None, fault=None):
        self.desc, self.info, self.raw, self.data, self.fault = desc, info, raw, data, fault


BUF_FAULTS = (("none", 2), ("short", 3), ("list", 1), ("noncontig", 1), ("object", 1), ("device", 1), ("str", 1),
              ("readonly", 1), ("tinyint", 1))
BUF_KINDS = (("typed", 8), ("bytes", 2), ("column", 1))
# faults of an unread buffer that no data argument accepts (_core/data.py ``unread``: the form checks of every
# buffer that need no descriptor); a short, non-contiguous, read-only or object array is still an array
UNREAD_REJECTED = frozenset({"list", "device", "str", "tinyint"})


def make_buffer(R, info, fault=None, positive=False, nan=False):
    """(raw bytes, the argument passed): a buffer spanning the descriptor plus slack bytes, passed as a
    typed array, raw bytes or a column; or a faulty argument."""
    if info is None:  # descriptor refused: still pass a plausible buffer
        raw = np.zeros(64, np.uint8)
        return raw, raw.view(np.float32)
    item = info.item
    raw = np.zeros((info.extent + R.int(0, 3)) * item, np.uint8)
    fill(raw, info, R.g, positive=positive)
    if nan and info.dtype in FLOATS:  # NaN garbage: beta == 0 must never read it
        raw.view(STORAGE[info.dtype])[...] = 0x7FC0 if info.dtype == BF16 else np.nan
    if fault is None:
        typed = raw.view(STORAGE[info.dtype])
        return raw, {"typed": typed, "bytes": raw, "column": typed.reshape(-1, 1)}[R.pick_w(BUF_KINDS)]
    if fault == "none":
        return raw, None
    if fault == "short":
        need = info.extent * item
        return raw, raw[:need - R.int(1, min(need, 2 * item))]
    if fault == "device" and H.place == "gpu":
        fault = "list"  # a bogus device address cannot be checked on the GPU place (C would fault too)
    if fault == "readonly":
        ro = raw.view()
        ro.flags.writeable = False
        return raw, ro
    return raw, {"list": [0.0] * 4, "noncontig": np.zeros(2 * raw.nbytes + 2, np.uint8)[::2],
                 "object": np.zeros(raw.nbytes, object), "device": FakeDeviceArray(raw.nbytes), "str": "buffer",
                 "tinyint": R.pick([-5, 1, 17])}[fault]


SCALAR_KINDS = (("float", 8), ("int", 1), ("np32", 1), ("np64", 1), ("array", 1), ("pointer", 2))
SCALAR_FAULTS = (("none", 1), ("str", 1), ("list", 1), ("complex", 1), ("strarray", 1))
_KEEP = []  # arrays whose pointers were passed as scalars (kept alive past the call)


def draw_scalar(R, double, fault=None, nonzero=False):
    """(argument, value it stands for): float, small int, NumPy scalar or 1-element array, or a host
    pointer to a float (double for double data); or a faulty scalar (value None)."""
    if fault:
        return {"none": None, "str": "1.0", "list": [1.0], "complex": np.array([1 + 2j]),
                "strarray": np.array(["a"])}[fault], None
    kind = R.pick_w(SCALAR_KINDS)
    if kind == "int":
        v = R.pick([1, 2, -1] if nonzero else [0, 1, 2, -1])
        return v, float(v)
    v = R.value()
    if nonzero and v == 0:
        v = 1.0
    if kind == "np32":
        return np.float32(v), float(np.float32(v))
    if kind == "np64":
        return np.float64(v), v
    if kind == "array":
        return np.array([v]), v
    if kind == "pointer":
        arr = np.array(v, np.float64 if double else np.float32)
        _KEEP.append(arr)
        del _KEEP[:-64]
        return ctypes.c_void_p(arr.ctypes.data), float(arr)  # a host pointer: Python ints are values
    return v, v


HANDLE_FAULTS = (("none", 1), ("zero", 1), ("destroyed", 2), ("descriptor", 1), ("junk", 1))


def handle_arg(fault, scope):
    if fault is None:
        return H
    if fault == "descriptor":
        return scope.add(cc.cudnnCreateTensorDescriptor(), cc.cudnnDestroyTensorDescriptor)
    return {"none": None, "zero": 0, "destroyed": _DEAD_HANDLE, "junk": "handle"}[fault]


class Faults:
    """The injected fault of one example (one argument made bad), queried per argument slot.
    ``draw`` = (inject?, slot index, kind index) from hypothesis; slots look like 'buf:x', 'desc:x',
    'scalar:alpha', 'handle'."""

    KINDS = {"handle": HANDLE_FAULTS, "desc": BAD_DESC_KINDS, "buf": BUF_FAULTS, "scalar": SCALAR_FAULTS}

    def __init__(self, draw, slots):
        self.fault = None
        on, i, j = draw
        if on:
            slot = slots[i % len(slots)]
            kinds = self.KINDS[slot.split(":")[0]]
            self.fault = (slot, kinds[j % len(kinds)][0])

    def at(self, slot):
        return self.fault[1] if self.fault and self.fault[0] == slot else None

    @property
    def bad_param(self) -> list:
        """Faults that must give BAD_PARAM exactly (handle or descriptor)."""
        if self.fault and self.fault[0].split(":")[0] in ("handle", "desc"):
            return [f"rule_bad_handle_or_descriptor_is_bad_param: {self.fault}"]
        return []

    def rejected(self, read=(), written=(), unread=()) -> list:
        """Faults that must make the call fail: scalars, buffers the call reads or writes (read-only
        only matters for a written one), and a buffer it does not read passed in a form no data
        argument takes (``UNREAD_REJECTED``: the one binder checks every data argument's form)."""
        if not self.fault:
            return []
        slot, kind = self.fault
        if slot.startswith("buf"):
            name = slot.split(":")[1]
            if (kind == "readonly" and name in written) or (kind != "readonly" and name in set(read) | set(written)) \
                    or (name in unread and kind in UNREAD_REJECTED):
                return [f"rule_bad_buffer_or_scalar_is_rejected: {self.fault}"]
            return []
        if slot.startswith("scalar"):
            return [f"rule_bad_buffer_or_scalar_is_rejected: {self.fault}"]
        return []


def tensor(R, scope, faults, name, spec, positive=False, nan=False, filter_=False):
    """A full tensor argument: descriptor (or a descriptor fault) and buffer (or a buffer fault)."""
    dk = faults.at("desc:" + name)
    if dk:
        create, destroy = ((cc.cudnnCreateFilterDescriptor, cc.cudnnDestroyFilterDescriptor) if filter_ else
                           (cc.cudnnCreateTensorDescriptor, cc.cudnnDestroyTensorDescriptor))
        desc, info = bad_descriptor(scope, dk, create, destroy), None
    else:
        desc, info = make_tensor(scope, spec, filter_)
    bk = faults.at("buf:" + name)
    raw, arg = make_buffer(R, info, bk, positive=positive, nan=nan)
    return TArg(desc, info, raw, arg, dk or bk)


def nbdims_choice(R, choices=((4, 10), (5, 3), (3, 1), (6, 1))):
    return R.pick_w(choices)


def same_or(R, spec, p_same=0.8, **kw):
    """``spec`` again (same layout) with probability p_same, else a fresh layout of the same dims."""
    if R.chance(p_same):
        return dict(spec)
    return draw_tensor_spec(R, spec["dims"], spec["dtype"], **kw)


def slots(*names, scalars=("alpha", "beta"), descs=()):
    return (["handle"] + [f"desc:{n}" for n in tuple(names) + tuple(descs)] + [f"buf:{n}" for n in names]
            + [f"scalar:{s}" for s in scalars])


def scalars(R, faults, names, double):
    return {n: draw_scalar(R, double, faults.at("scalar:" + n)) for n in names}


def blend(out, r, alpha, beta, r_mag=None):
    """out.want = alpha*r + beta*prior (prior not read when beta == 0), with its magnitude bound."""
    prior = load(out.before, out.info)
    with np.errstate(all="ignore"):
        out.want = alpha * r + (beta * prior if beta != 0 else 0.0)
        out.mag = abs(alpha) * (np.abs(r) if r_mag is None else r_mag) + (abs(beta) * np.abs(prior) if beta else 0.0)


# == descriptor setters and lifecycles ===================================================================

@fuzz("setters")
@given(SEEDS)
def test_fuzz_descriptor_setters(seed):
    """rule_setter_contract for tensor and filter descriptors, over every setter and wild values
    (ranks 0-10, dims up to 2^31, zero and negative dims, every stride kind, bad enums)."""
    R = Rand(seed)
    nb = R.int(0, 10)
    big = R.coin()
    dims = tuple(R.pick([1, 2, 3, 2 ** 16, 2 ** 31, 0, -2]) if big else R.int(1, 4) for _ in range(nb))
    spec = draw_tensor_spec(R, dims, fault=0.3)
    if R.coin():
        spec["fmt"] = R.pick([NCHW, NHWC, VECT_C, 3, -1])
    with Scope() as scope:
        STATS["setters", "examples"] += 1
        if R.coin():
            spec["four"] = R.coin()
            _, info = make_tensor(scope, spec, filter_=True)
        else:
            _, info = make_tensor(scope, spec)
        STATS["setters", "accepted" if info else "refused"] += 1


def _descriptor_kinds():
    """(create, destroy, setter(desc) or None) for every descriptor type of the legacy API."""
    setters = {
        "Tensor": lambda d: cc.cudnnSetTensor4dDescriptor(d, NCHW, F32, 1, 2, 3, 4),
        "Filter": lambda d: cc.cudnnSetFilter4dDescriptor(d, F32, NCHW, 2, 2, 3, 3),
        "Convolution": lambda d: cc.cudnnSetConvolution2dDescriptor(d, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32),
        "Pooling": lambda d: cc.cudnnSetPooling2dDescriptor(d, cc.CUDNN_POOLING_MAX, 0, 2, 2, 0, 0, 1, 1),
        "Activation": lambda d: cc.cudnnSetActivationDescriptor(d, cc.CUDNN_ACTIVATION_RELU, 0, 0.0),
        "LRN": lambda d: cc.cudnnSetLRNDescriptor(d, 5, 1e-4, 0.75, 2.0),
        "OpTensor": lambda d: cc.cudnnSetOpTensorDescriptor(d, cc.CUDNN_OP_TENSOR_ADD, F32, 0),
        "ReduceTensor": lambda d: cc.cudnnSetReduceTensorDescriptor(d, cc.CUDNN_REDUCE_TENSOR_ADD, F32, 0, 0, 0),
    }
    out = []
    for name in sorted(n[len("cudnnCreate"):-len("Descriptor")] for n in cc.LEGACY
                       if n.startswith("cudnnCreate") and n.endswith("Descriptor")):
        destroy = cc.LEGACY.get(f"cudnnDestroy{name}Descriptor")
        if destroy is not None:
            out.append((name, cc.LEGACY[f"cudnnCreate{name}Descriptor"], destroy, setters.get(name)))
    return out


DESCRIPTOR_KINDS = _descriptor_kinds()


@fuzz("lifecycle")
@given(st.lists(st.tuples(st.integers(0, len(DESCRIPTOR_KINDS) - 1), st.sampled_from(
    ["create", "set", "destroy", "destroy_again", "use_stale", "use_as_other"]), st.integers(0, 7)), max_size=30))
def test_fuzz_descriptor_lifecycle(ops):
    """Random create/set/destroy sequences over every descriptor type: destroying twice, setting or
    using a destroyed descriptor, or passing one type for another is BAD_PARAM, never a crash; ids are
    never reused while alive; every created descriptor is destroyed (live count back to the start)."""
    from cudnn_compat._core.descriptor import live_count
    STATS["lifecycle", "examples"] += 1
    start = live_count()
    live, dead = [], []
    try:
        for kind, op, pick in ops:
            name, create, destroy, setter = DESCRIPTOR_KINDS[kind]
            STATS["lifecycle", op] += 1
            if op == "create" or not live:
                d = create()
                assert int(d) not in {int(x) for _, x in live}, "id reused while alive"
                live.append((kind, d))
                continue
            k, d = live[pick % len(live)]
            name, create, destroy, setter = DESCRIPTOR_KINDS[k]
            if op == "set" and setter is not None:
                setter(d)
            elif op in ("destroy", "destroy_again", "use_stale"):
                destroy(d)
                live.remove((k, d))
                dead.append((k, d))
                with pytest.raises(CuDNNError) as e:
                    if op == "destroy_again":
                        destroy(d)
                    elif setter is not None:
                        setter(int(d))
                    else:
                        destroy(int(d))
                assert e.value.status == BAD, e.value
            elif op == "use_as_other":
                ok = [x for x in DESCRIPTOR_KINDS if x[3] is not None and x[0] != name]
                other = ok[pick % len(ok)]
                with pytest.raises(CuDNNError) as e:
                    other[3](d)
                assert e.value.status == BAD and "not a" in str(e.value), e.value
    finally:
        for k, d in live:
            DESCRIPTOR_KINDS[k][2](d)
    assert live_count() == start


# == tensor arithmetic =====================================================================================

def _same_rank_dims_ok(small, big) -> bool:
    return small.nb == big.nb and all(a in (c, 1) for a, c in zip(small.dims, big.dims))


@fuzz("add_tensor")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_add_tensor(seed, fault):
    """cudnnAddTensor: C = alpha*A + beta*C, A broadcast where its dim is 1 (002 §3.2.2).
    must_reject: A dims not C's-or-1 or ranks differ (BAD_PARAM), data types differ (BAD_PARAM),
    more than 5 dims (NOT_SUPPORTED)."""
    R = Rand(seed)
    faults = Faults(fault, slots("A", "C"))
    cdims = draw_dims(R, nbdims_choice(R))
    adims = tuple(d if R.coin() else 1 for d in cdims)
    if R.chance(0.05):
        adims = draw_dims(R, nbdims_choice(R))
    dtype = R.pick_w(((F32, 6), (F64, 2), (F16, 2), (BF16, 1), (I8, 1), (I32, 1)))
    cspec, aspec = draw_tensor_spec(R, cdims, dtype), draw_tensor_spec(R, adims, dtype)
    with Scope() as scope:
        A = tensor(R, scope, faults, "A", aspec)
        C = tensor(R, scope, faults, "C", cspec, nan=R.chance(0.3))
        sc = scalars(R, faults, ("alpha", "beta"), C.info is not None and C.info.dtype == F64)
        out = Out("C", C.raw, C.info)
        must = []
        if A.info and C.info:
            if not _same_rank_dims_ok(A.info, C.info):
                must.append("dims of A must equal C's or be 1")
            if A.info.dtype != C.info.dtype:
                must.append("data types differ")
            if C.info.nb > 5:
                must.append("more than 5 dims")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")

        def oracle():
            blend(out, np.broadcast_to(load(A.raw, A.info), C.info.dims), sc["alpha"][1], sc["beta"][1])

        invoke("add_tensor", cc.cudnnAddTensor,
               (handle_arg(faults.at("handle"), scope), sc["alpha"][0], A.desc, A.data, sc["beta"][0], C.desc, C.data),
               [out], {BAD, NS}, must + faults.rejected(("A",), ("C",)), faults.bad_param, oracle)


OP_TABLE7 = {  # 002 §3.2.68 Table 7: (compType, A, B, C)
    (F32, F32, F32, F32), (F32, I8, I8, F32), (F32, F16, F16, F32), (F32, BF16, BF16, F32), (F64, F64, F64, F64),
    (F32, F32, F32, F16), (F32, F16, F16, F16), (F32, I8, I8, I8), (F32, F32, F32, I8), (F32, F32, F32, BF16),
    (F32, BF16, BF16, BF16),
}
OPS = {cc.CUDNN_OP_TENSOR_ADD: lambda a, b: a + b, cc.CUDNN_OP_TENSOR_MUL: lambda a, b: a * b,
       cc.CUDNN_OP_TENSOR_MIN: np.minimum, cc.CUDNN_OP_TENSOR_MAX: np.maximum,
       cc.CUDNN_OP_TENSOR_SQRT: lambda a, b: np.sqrt(a), cc.CUDNN_OP_TENSOR_NOT: lambda a, b: 1.0 - a}
UNARY_OPS = {cc.CUDNN_OP_TENSOR_SQRT, cc.CUDNN_OP_TENSOR_NOT}
ANY_DTYPE = ((F32, 5), (F64, 2), (F16, 2), (BF16, 1), (I8, 2), (I32, 1), (U8, 1))


def _compute(v, comp):
    """A value held in the compute type (float for FLOAT, double for DOUBLE)."""
    return rounded(v, comp) if comp != F64 else np.asarray(v, np.float64)


@fuzz("op_tensor")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_op_tensor(seed, fault):
    """cudnnOpTensor: C = op(alpha1*A, alpha2*B) + beta*C (002 §3.2.68).  must_reject: A dims differ
    from C's, B dims not C's-or-1, fewer than 4 dims (BAD_PARAM), over 5 dims or (compType, A, B, C)
    outside Table 7 (NOT_SUPPORTED); B is C's buffer while A is not (BAD_PARAM); a refused op
    descriptor (bad op or compute type: BAD_PARAM)."""
    R = Rand(seed)
    faults = Faults(fault, slots("A", "B", "C", scalars=("alpha1", "alpha2", "beta"), descs=("op",)))
    nb = nbdims_choice(R)
    cdims = draw_dims(R, nb)
    bdims = tuple(d if R.coin() else 1 for d in cdims)
    adims = cdims if R.chance(0.9) else draw_dims(R, nb)
    comp, ta, tb, tc = R.pick(sorted(OP_TABLE7)) if R.chance(0.8) else tuple(R.pick_w(ANY_DTYPE) for _ in range(4))
    op = R.pick(sorted(OPS)) if R.chance(0.95) else 99
    cspec = draw_tensor_spec(R, cdims, tc, fault=0.0)
    aspec = dict(same_or(R, cspec, 0.6), dtype=ta) if adims == cdims else draw_tensor_spec(R, adims, ta, fault=0.0)
    bspec = draw_tensor_spec(R, bdims, tb, fault=0.0)
    alias = R.pick_w(((None, 8), ("A", 1), ("B", 1)))
    with Scope() as scope:
        od_fault = faults.at("desc:op")
        if od_fault:
            od = bad_descriptor(scope, od_fault, cc.cudnnCreateOpTensorDescriptor, cc.cudnnDestroyOpTensorDescriptor)
        else:
            od = scope.add(cc.cudnnCreateOpTensorDescriptor(), cc.cudnnDestroyOpTensorDescriptor)
            valid = op in OPS and comp in (F32, F64, F16, BF16)
            try:
                cc.cudnnSetOpTensorDescriptor(od, op, comp, R.pick([0, 1]))
                assert valid, "cudnnSetOpTensorDescriptor accepted a bad op or compute type"
            except CuDNNError as e:
                assert e.status == BAD and not valid, e
                od_fault = "refused"
        A = tensor(R, scope, faults, "A", aspec)
        B = tensor(R, scope, faults, "B", bspec)
        C = tensor(R, scope, faults, "C", cspec)
        src = {"A": A, "B": B}.get(alias)
        if src is not None and C.info and src.info and not (src.fault or C.fault) and src.info.dims == C.info.dims \
                and src.info.dtype == C.info.dtype and src.info.strides == C.info.strides:
            src.raw, src.data = C.raw, C.data  # C is A's buffer (allowed) or B's (refused)
        else:
            alias = None
        sc = scalars(R, faults, ("alpha1", "alpha2", "beta"), comp == F64)
        out = Out("C", C.raw, C.info)
        must = []
        if od_fault == "refused":
            must.append("op descriptor was refused")
        elif A.info and B.info and C.info:
            if A.info.dims != C.info.dims:
                must.append("A dims differ from C's")
            if not _same_rank_dims_ok(B.info, C.info):
                must.append("B dims not C's or 1")
            if not 4 <= C.info.nb <= 5:
                must.append("rank outside [4, 5]")
            if (comp, A.info.dtype, B.info.dtype, C.info.dtype) not in OP_TABLE7:
                must.append("types outside Table 7")
            if alias == "B" and B.info.dims == C.info.dims:
                must.append("B is the output buffer")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")
        read = ("A",) if op in UNARY_OPS else ("A", "B")

        def oracle():
            a1, a2, b = sc["alpha1"][1], sc["alpha2"][1], sc["beta"][1]
            x = _compute(a1 * load(out.before if alias == "A" else A.raw, A.info), comp)
            y = _compute(a2 * load(B.raw, B.info), comp) if op not in UNARY_OPS else 0.0
            with np.errstate(invalid="ignore"):
                r = _compute(np.broadcast_to(OPS[op](x, y), C.info.dims), comp)
            blend(out, r, 1.0, b, np.abs(r) + np.abs(x) + np.abs(np.broadcast_to(y, C.info.dims)))

        invoke("op_tensor", cc.cudnnOpTensor,
               (handle_arg(faults.at("handle"), scope), od, sc["alpha1"][0], A.desc, A.data, sc["alpha2"][0], B.desc,
                B.data, sc["beta"][0], C.desc, C.data),
               [out], {BAD, NS}, must + faults.rejected(read, ("C",)), faults.bad_param, oracle)


REDUCE = {
    cc.CUDNN_REDUCE_TENSOR_ADD: lambda x, ax: np.sum(x, ax, keepdims=True),
    cc.CUDNN_REDUCE_TENSOR_MUL: lambda x, ax: np.prod(x, ax, keepdims=True),
    cc.CUDNN_REDUCE_TENSOR_MIN: lambda x, ax: np.min(x, ax, keepdims=True),
    cc.CUDNN_REDUCE_TENSOR_MAX: lambda x, ax: np.max(x, ax, keepdims=True),
    cc.CUDNN_REDUCE_TENSOR_AMAX: lambda x, ax: np.max(np.abs(x), ax, keepdims=True),
    cc.CUDNN_REDUCE_TENSOR_AVG: lambda x, ax: np.mean(x, ax, keepdims=True),
    cc.CUDNN_REDUCE_TENSOR_NORM1: lambda x, ax: np.sum(np.abs(x), ax, keepdims=True),
    cc.CUDNN_REDUCE_TENSOR_NORM2: lambda x, ax: np.sqrt(np.sum(x * x, ax, keepdims=True)),
    cc.CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS: lambda x, ax: np.prod(np.where(x == 0, 1.0, x), ax, keepdims=True),
}
INDEXED = {cc.CUDNN_REDUCE_TENSOR_MIN, cc.CUDNN_REDUCE_TENSOR_MAX, cc.CUDNN_REDUCE_TENSOR_AMAX}


@fuzz("reduce_tensor")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_reduce_tensor(seed, fault):
    """cudnnReduceTensor: C = alpha*reduce(A) + beta*C over the dims where C is 1 (002 §3.2.71), with
    flattened indices for MIN/MAX/AMAX.  must_reject: C dims not A's-or-1, nothing reduced, double mixed
    with other types, indices asked for another op (BAD_PARAM); over 8 dims, compType not FLOAT (DOUBLE
    for double data), data types other than FLOAT/HALF/INT8/DOUBLE, non-32-bit indices (NOT_SUPPORTED);
    indices buffer smaller than cudnnGetReductionIndicesSize (INVALID_VALUE)."""
    R = Rand(seed)
    faults = Faults(fault, slots("A", "C", descs=("reduce",)))
    nb = nbdims_choice(R, ((4, 8), (5, 3), (3, 2), (6, 1), (8, 1), (9, 1)))
    adims = draw_dims(R, nb, hi=3)
    cdims = tuple(1 if R.coin() else d for d in adims) if R.chance(0.95) else draw_dims(R, nb, hi=3)
    big = [i for i, (a, c) in enumerate(zip(adims, cdims)) if a > 1 and c == a]
    if cdims == adims and big and R.chance(0.9):  # mostly reduce something
        cdims = tuple(1 if i == big[0] else d for i, d in enumerate(cdims))
    ta = R.pick_w(((F32, 6), (F64, 2), (F16, 2), (I8, 1), (BF16, 1)))
    tc = ta if R.chance(0.85) else R.pick_w(ANY_DTYPE)
    op = R.pick(sorted(REDUCE))
    comp = R.pick_w(((F64 if tc == F64 else F32, 10), (F16, 1), (F64 if tc != F64 else F32, 1)))
    idx_mode = int(R.chance(0.3))
    idx_type = R.pick_w(((cc.CUDNN_32BIT_INDICES, 10), (cc.CUDNN_64BIT_INDICES, 1), (cc.CUDNN_16BIT_INDICES, 1)))
    cspec, aspec = draw_tensor_spec(R, cdims, tc, fault=0.0), draw_tensor_spec(R, adims, ta, fault=0.0)
    with Scope() as scope:
        rd_fault = faults.at("desc:reduce")
        if rd_fault:
            rd = bad_descriptor(scope, rd_fault, cc.cudnnCreateReduceTensorDescriptor,
                                cc.cudnnDestroyReduceTensorDescriptor)
        else:
            rd = scope.add(cc.cudnnCreateReduceTensorDescriptor(), cc.cudnnDestroyReduceTensorDescriptor)
            cc.cudnnSetReduceTensorDescriptor(rd, op, comp, R.pick([0, 1]), idx_mode, idx_type)
        A = tensor(R, scope, faults, "A", aspec)
        C = tensor(R, scope, faults, "C", cspec)
        n_out = prod(cdims) if all(d > 0 for d in cdims) else 1
        idx_short = bool(idx_mode) and R.chance(0.1)
        idx_raw = np.full(n_out - (1 if idx_short else 0) + 2, -7, np.int32).view(np.uint8)
        idx_size = idx_raw.nbytes - 8
        sc = scalars(R, faults, ("alpha", "beta"), C.info is not None and C.info.dtype == F64)
        out = Out("C", C.raw, C.info)
        outs, iout, must = [out], None, []
        if A.info and C.info and not rd_fault:
            if C.info.nb != A.info.nb or any(c not in (a, 1) for a, c in zip(A.info.dims, C.info.dims)):
                must.append("C dims not A's or 1")
            elif A.info.dims == C.info.dims:
                must.append("no dim reduced")
            if (A.info.dtype == F64) != (C.info.dtype == F64):
                must.append("double mixed with other types")
            if A.info.nb > 8:
                must.append("more than 8 dims")
            if any(t not in (F32, F16, I8, F64) for t in (A.info.dtype, C.info.dtype)):
                must.append("data type not FLOAT/HALF/INT8/DOUBLE")
            if comp != (F64 if C.info.dtype == F64 else F32):
                must.append("compType")
            if idx_mode and op not in INDEXED:
                must.append("indices for a non-index op")
            if idx_mode and idx_type != cc.CUDNN_32BIT_INDICES:
                must.append("indices type not 32-bit")
            if idx_short:
                must.append("indices buffer too small")
            if idx_mode and op in INDEXED:
                iout = Out("indices", idx_raw, Info(I32, cdims, packed(cdims)))
                outs.append(iout)
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")

        def oracle():
            x = load(A.raw, A.info)
            ax = tuple(i for i, (p, q) in enumerate(zip(A.info.dims, C.info.dims)) if q == 1 and p != 1)
            r = _compute(REDUCE[op](x, ax), comp)
            mag = REDUCE[cc.CUDNN_REDUCE_TENSOR_NORM1](x, ax)
            if op in (cc.CUDNN_REDUCE_TENSOR_MUL, cc.CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS):
                mag = np.prod(np.maximum(np.abs(x), 1), ax, keepdims=True)
            blend(out, r, sc["alpha"][1], sc["beta"][1], mag)
            if iout is not None:  # each index names an element holding the reduced value
                got = load(iout.raw, iout.info).astype(np.int64)
                keep = [i for i in range(x.ndim) if i not in ax]
                moved = np.transpose(x, keep + list(ax)).reshape([x.shape[i] for i in keep] + [-1])
                flat = got.reshape([x.shape[i] for i in keep])
                assert flat.min() >= 0 and flat.max() < moved.shape[-1], f"indices out of range: {flat}"
                pick = np.take_along_axis(moved, flat[..., None], -1)[..., 0]
                if op == cc.CUDNN_REDUCE_TENSOR_AMAX:
                    pick = np.abs(pick)
                np.testing.assert_array_equal(pick.reshape(-1), REDUCE[op](x, ax).reshape(-1))

        invoke("reduce_tensor", cc.cudnnReduceTensor,
               (handle_arg(faults.at("handle"), scope), rd, idx_raw.view(np.int32) if idx_mode else None,
                idx_size if idx_mode else 0, None, 0, sc["alpha"][0], A.desc, A.data, sc["beta"][0], C.desc, C.data),
               outs, {BAD, NS, INVALID}, must + faults.rejected(("A",), ("C",)), faults.bad_param, oracle)


@fuzz("transform_tensor")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_transform_tensor(seed, fault):
    """cudnnTransformTensor: y = alpha*x + beta*y between layouts (002 §3.2.100).  must_reject: dims or
    data types differ, or x and y are one buffer (BAD_PARAM)."""
    R = Rand(seed)
    faults = Faults(fault, slots("x", "y"))
    dims = draw_dims(R, nbdims_choice(R))
    ydims = dims if R.chance(0.9) else draw_dims(R, nbdims_choice(R))
    dtype = R.pick_w(((F32, 6), (F64, 2), (F16, 2), (BF16, 1), (I8, 1), (I32, 1)))
    xspec, yspec = draw_tensor_spec(R, dims, dtype), draw_tensor_spec(R, ydims, dtype)
    with Scope() as scope:
        X = tensor(R, scope, faults, "x", xspec)
        Y = tensor(R, scope, faults, "y", yspec, nan=R.chance(0.3))
        same = R.chance(0.05) and not (X.fault or Y.fault)
        if same:
            X.raw, X.data = Y.raw, Y.data
        sc = scalars(R, faults, ("alpha", "beta"), Y.info is not None and Y.info.dtype == F64)
        out = Out("y", Y.raw, Y.info)
        must = []
        if X.info and Y.info:
            if X.info.dims != Y.info.dims:
                must.append("dims differ")
            if X.info.dtype != Y.info.dtype:
                must.append("data types differ")
            if same:
                must.append("in place")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")

        def oracle():
            blend(out, load(X.raw, X.info), sc["alpha"][1], sc["beta"][1])

        invoke("transform_tensor", cc.cudnnTransformTensor,
               (handle_arg(faults.at("handle"), scope), sc["alpha"][0], X.desc, X.data, sc["beta"][0], Y.desc, Y.data),
               [out], {BAD, NS}, must + faults.rejected(("x",), ("y",)), faults.bad_param, oracle)


# == activation and softmax ================================================================================

def _relu(x, lo=0.0, hi=None, propagate=True):
    """max(x, lo) [min hi]: NaN stays NaN under PROPAGATE_NAN, becomes the bound under NOT_PROPAGATE."""
    mx, mn = (np.maximum, np.minimum) if propagate else (np.fmax, np.fmin)
    y = mx(x, lo)
    return y if hi is None else mn(y, hi)


ACT = {  # mode -> (forward y(x, coef, swish_beta), backward dx(dy, y, x, coef', swish_beta)); NaN option apart
    cc.CUDNN_ACTIVATION_SIGMOID: (lambda x, c, b: 1 / (1 + np.exp(-x)), lambda dy, y, x, c, b: dy * y * (1 - y)),
    cc.CUDNN_ACTIVATION_RELU: (lambda x, c, b: _relu(x), lambda dy, y, x, c, b: np.where(y > 0, dy, 0.0)),
    cc.CUDNN_ACTIVATION_TANH: (lambda x, c, b: np.tanh(x), lambda dy, y, x, c, b: dy * (1 - y * y)),
    cc.CUDNN_ACTIVATION_CLIPPED_RELU: (lambda x, c, b: _relu(x, 0.0, c),
                                       lambda dy, y, x, c, b: np.where((y > 0) & (y < c), dy, 0.0)),
    cc.CUDNN_ACTIVATION_ELU: (lambda x, c, b: np.where(x > 0, x, c * np.expm1(np.minimum(x, 0))),
                              lambda dy, y, x, c, b: dy * np.where(y > 0, 1.0, y + c)),
    cc.CUDNN_ACTIVATION_SWISH: (lambda x, c, b: x / (1 + np.exp(-b * x)),
                                lambda dy, y, x, c, b: dy * (lambda s: s + b * x * s * (1 - s))(1 / (1 + np.exp(-b * x)))),
}
ACT_MODES = sorted(ACT) + [cc.CUDNN_ACTIVATION_IDENTITY]


def make_activation(R, scope, faults):
    """(descriptor, mode, coef, swish beta, NaN option, fault): a set activation descriptor, or a bad one."""
    kind = faults.at("desc:act")
    if kind:
        return bad_descriptor(scope, kind, cc.cudnnCreateActivationDescriptor,
                              cc.cudnnDestroyActivationDescriptor), None, 0.0, 1.0, 0, kind
    d = scope.add(cc.cudnnCreateActivationDescriptor(), cc.cudnnDestroyActivationDescriptor)
    mode = R.pick(ACT_MODES) if R.chance(0.97) else R.pick([7, -1])
    nan = R.pick([0, 1]) if R.chance(0.97) else 5
    coef = R.pick([0.0, 0.5, 1.0, 2.5, 6.0]) if R.coin() else float(np.float32(R.g.uniform(0, 4)))
    try:
        cc.cudnnSetActivationDescriptor(d, mode, nan, coef)
        assert mode in ACT_MODES and nan in (0, 1), "cudnnSetActivationDescriptor accepted a bad enum"
    except CuDNNError as e:
        assert e.status == BAD and (mode not in ACT_MODES or nan not in (0, 1)), e
        return d, None, coef, 1.0, nan, "refused"
    beta = 1.0
    if R.chance(0.3):
        beta = R.pick([0.5, 1.0, 2.0])
        cc.cudnnSetActivationDescriptorSwishBeta(d, beta)
    return d, mode, coef, beta, nan, None


@fuzz("activation_forward")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_activation_forward(seed, fault):
    """cudnnActivationForward: y = alpha*act(x) + beta*y (002 §3.2.1).  must_reject: IDENTITY or a bad
    mode, x/y dims or data types differ, in place with other strides (BAD_PARAM); data types other than
    FLOAT/DOUBLE/HALF/BFLOAT16/INT8 (NOT_SUPPORTED)."""
    R = Rand(seed)
    faults = Faults(fault, slots("x", "y", descs=("act",)))
    dims = draw_dims(R, nbdims_choice(R))
    dtype = R.pick_w(((F32, 6), (F64, 2), (F16, 2), (BF16, 1), (I8, 1), (I32, 1)))
    xspec = draw_tensor_spec(R, dims, dtype)
    yspec = same_or(R, xspec, 0.6) if R.chance(0.95) else draw_tensor_spec(R, draw_dims(R, len(dims)), dtype)
    with Scope() as scope:
        ad, mode, coef, sbeta, nan_opt, afault = make_activation(R, scope, faults)
        X = tensor(R, scope, faults, "x", xspec)
        Y = tensor(R, scope, faults, "y", yspec, nan=R.chance(0.3))
        inplace = R.chance(0.15) and not (X.fault or Y.fault) and X.info and Y.info and X.info.dtype == Y.info.dtype \
            and X.info.extent <= Y.info.extent
        if inplace:
            X.raw, X.data = Y.raw, Y.data
        sc = scalars(R, faults, ("alpha", "beta"), X.info is not None and X.info.dtype == F64)
        out = Out("y", Y.raw, Y.info)
        must = []
        if afault == "refused" or mode == cc.CUDNN_ACTIVATION_IDENTITY:
            must.append("mode is not a legacy activation")
        if X.info and Y.info:
            if X.info.dims != Y.info.dims:
                must.append("dims differ")
            if X.info.dtype != Y.info.dtype:
                must.append("data types differ")
            if inplace and X.info.strides != Y.info.strides:
                must.append("in place with other strides")
            if X.info.dtype not in (F32, F64, F16, BF16, I8):
                must.append("data type not supported")
            if spatially_unpacked(X.info) or spatially_unpacked(Y.info):
                must.append("over 5 dims, not packed in the spatial dims")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")

        def oracle():
            x = load(out.before if inplace else X.raw, X.info)  # in place over NaN garbage: NaN inputs
            if mode in (cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_ACTIVATION_CLIPPED_RELU):
                y = _relu(x, 0.0, coef if mode == cc.CUDNN_ACTIVATION_CLIPPED_RELU else None,
                          nan_opt == cc.CUDNN_PROPAGATE_NAN)
            else:
                y = ACT[mode][0](x, coef, sbeta)
            r = _compute(y, F64 if X.info.dtype == F64 else F32)
            blend(out, r, sc["alpha"][1], sc["beta"][1], np.abs(r) + np.abs(x))

        invoke("activation_forward", cc.cudnnActivationForward,
               (handle_arg(faults.at("handle"), scope), ad, sc["alpha"][0], X.desc, X.data, sc["beta"][0], Y.desc,
                Y.data), [out], {BAD, NS}, must + faults.rejected(("x",), ("y",)), faults.bad_param, oracle)


@fuzz("activation_backward")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_activation_backward(seed, fault):
    """cudnnActivationBackward: dx = alpha*act'(.)*dy + beta*dx (002 §4.1.1), from y (x for SWISH).
    must_reject: IDENTITY or a bad mode, in-place dy == dx with other strides (BAD_PARAM); dims or data
    types of y, dy, x, dx differ, y/dy or x/dx strides differ, data types other than FLOAT/DOUBLE/HALF/
    BFLOAT16 (NOT_SUPPORTED)."""
    R = Rand(seed)
    faults = Faults(fault, slots("y", "dy", "x", "dx", descs=("act",)))
    dims = draw_dims(R, nbdims_choice(R))
    dtype = R.pick_w(((F32, 6), (F64, 2), (F16, 2), (BF16, 1), (I8, 1)))
    yspec = draw_tensor_spec(R, dims, dtype)
    xspec = same_or(R, yspec, 0.7)
    specs = {"y": yspec, "dy": same_or(R, yspec, 0.9), "x": xspec, "dx": same_or(R, xspec, 0.9)}
    if R.chance(0.05):
        k = R.pick(sorted(specs))
        specs[k] = draw_tensor_spec(R, draw_dims(R, len(dims)), dtype)
    with Scope() as scope:
        ad, mode, coef, sbeta, nan_opt, afault = make_activation(R, scope, faults)
        T = {k: tensor(R, scope, faults, k, specs[k], nan=(k == "dx" and R.chance(0.3))) for k in ("y", "dy", "x", "dx")}
        inplace = R.chance(0.15) and not (T["dy"].fault or T["dx"].fault) and T["dy"].info and T["dx"].info \
            and T["dy"].info.dtype == T["dx"].info.dtype and T["dy"].info.extent <= T["dx"].info.extent
        if inplace:
            T["dy"].raw, T["dy"].data = T["dx"].raw, T["dx"].data
        infos = {k: t.info for k, t in T.items()}
        sc = scalars(R, faults, ("alpha", "beta"), infos["y"] is not None and infos["y"].dtype == F64)
        out = Out("dx", T["dx"].raw, infos["dx"])
        must = []
        if afault == "refused" or mode == cc.CUDNN_ACTIVATION_IDENTITY:
            must.append("mode is not a legacy activation")
        if all(infos.values()):
            y, dy, x, dx = (infos[k] for k in ("y", "dy", "x", "dx"))
            if len({t.dims for t in infos.values()}) > 1:
                must.append("dims differ")
            if len({t.dtype for t in infos.values()}) > 1:
                must.append("data types differ")
            if y.strides != dy.strides or x.strides != dx.strides:
                must.append("y/dy or x/dx strides differ")
            if inplace and dy.strides != dx.strides:
                must.append("in place with other strides")
            if y.dtype not in (F32, F64, F16, BF16):
                must.append("data type not supported")
            if any(spatially_unpacked(t) for t in infos.values()):
                must.append("over 5 dims, not packed in the spatial dims")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")
        reads = ("dy", "x" if mode == cc.CUDNN_ACTIVATION_SWISH else "y")

        def oracle():
            y, dy, x = (load(T[k].raw, infos[k]) for k in ("y", "dy", "x"))
            if inplace:
                dy = load(out.before, infos["dy"])
            c = coef
            if mode == cc.CUDNN_ACTIVATION_CLIPPED_RELU:
                c = float(rounded(coef, infos["y"].dtype))  # the clip as a saturated y holds it
            r = _compute(ACT[mode][1](dy, y, x, c, sbeta), F64 if infos["y"].dtype == F64 else F32)
            blend(out, r, sc["alpha"][1], sc["beta"][1], np.abs(r) + np.abs(dy) * (1 + np.abs(y) + np.abs(x)))

        invoke("activation_backward", cc.cudnnActivationBackward,
               (handle_arg(faults.at("handle"), scope), ad, sc["alpha"][0], T["y"].desc, T["y"].data, T["dy"].desc,
                T["dy"].data, T["x"].desc, T["x"].data, sc["beta"][0], T["dx"].desc, T["dx"].data),
               [out], {BAD, NS}, must + faults.rejected(reads, ("dx",), ({"x", "y"} - set(reads))), faults.bad_param,
               oracle)


@fuzz("softmax_forward")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_softmax_forward(seed, fault):
    """cudnnSoftmaxForward: y = alpha*softmax(x) + beta*y, FAST/ACCURATE/LOG over C,H,W (INSTANCE) or C
    (CHANNEL) (002 §3.2.96).  must_reject: x/y dims or data types differ, bad algorithm or mode, in place
    with other strides (BAD_PARAM); data types other than FLOAT/DOUBLE/HALF/BFLOAT16 (NOT_SUPPORTED)."""
    R = Rand(seed)
    faults = Faults(fault, slots("x", "y"))
    dims = draw_dims(R, nbdims_choice(R))
    dtype = R.pick_w(((F32, 6), (F64, 2), (F16, 2), (BF16, 1), (I8, 1)))
    xspec = draw_tensor_spec(R, dims, dtype)
    yspec = same_or(R, xspec, 0.6) if R.chance(0.95) else draw_tensor_spec(R, draw_dims(R, len(dims)), dtype)
    algo = R.pick([0, 1, 2]) if R.chance(0.97) else R.pick([3, -1])
    mode = R.pick([0, 1]) if R.chance(0.97) else 2
    with Scope() as scope:
        X = tensor(R, scope, faults, "x", xspec)
        Y = tensor(R, scope, faults, "y", yspec, nan=R.chance(0.3))
        inplace = R.chance(0.1) and not (X.fault or Y.fault) and X.info and Y.info and X.info.dtype == Y.info.dtype \
            and X.info.extent <= Y.info.extent
        if inplace:
            X.raw, X.data = Y.raw, Y.data
        sc = scalars(R, faults, ("alpha", "beta"), X.info is not None and X.info.dtype == F64)
        out = Out("y", Y.raw, Y.info)
        must = [] if algo in (0, 1, 2) and mode in (0, 1) else ["bad algorithm or mode"]
        if X.info and Y.info:
            if X.info.dims != Y.info.dims:
                must.append("dims differ")
            if X.info.dtype != Y.info.dtype:
                must.append("data types differ")
            if inplace and X.info.strides != Y.info.strides:
                must.append("in place with other strides")
            if X.info.dtype not in (F32, F64, F16, BF16):
                must.append("data type not supported")
            if spatially_unpacked(X.info) or spatially_unpacked(Y.info):
                must.append("over 5 dims, not packed in the spatial dims")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")

        def oracle():
            x = load(out.before if inplace else X.raw, X.info)
            ax = tuple(range(1, x.ndim)) if mode == cc.CUDNN_SOFTMAX_MODE_INSTANCE else (1,)
            z = x - x.max(axis=ax, keepdims=True)
            lse = np.log(np.exp(z).sum(axis=ax, keepdims=True))
            r = z - lse if algo == cc.CUDNN_SOFTMAX_LOG else np.exp(z - lse)
            r = _compute(r, F64 if X.info.dtype == F64 else F32)
            blend(out, r, sc["alpha"][1], sc["beta"][1], np.abs(r) + (np.abs(x) if algo == cc.CUDNN_SOFTMAX_LOG else 0))

        invoke("softmax_forward", cc.cudnnSoftmaxForward,
               (handle_arg(faults.at("handle"), scope), algo, mode, sc["alpha"][0], X.desc, X.data, sc["beta"][0],
                Y.desc, Y.data), [out], {BAD, NS}, must + faults.rejected(("x",), ("y",)), faults.bad_param, oracle)


# == pooling ===============================================================================================

POOL_MODES = [cc.CUDNN_POOLING_MAX, cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
              cc.CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, cc.CUDNN_POOLING_MAX_DETERMINISTIC]


def pool_reference(x, mode, window, pad, stride, ydims, lowest):
    """Direct pooling over windows o*stride - pad + k, positions outside x are padding."""
    out = np.empty(ydims)
    for o in np.ndindex(*ydims[2:]):
        idx = [np.arange(w) + oi * s - p for w, oi, s, p in zip(window, o, stride, pad)]
        keep = [i[(i >= 0) & (i < n)] for i, n in zip(idx, x.shape[2:])]
        count = prod(len(k) for k in keep)
        sel = (slice(None), slice(None)) + o
        if count == 0:
            out[sel] = lowest if mode in (cc.CUDNN_POOLING_MAX, cc.CUDNN_POOLING_MAX_DETERMINISTIC) else 0.0
            continue
        sub = x[(slice(None), slice(None)) + np.ix_(*keep)].reshape(x.shape[0], x.shape[1], -1)
        if mode in (cc.CUDNN_POOLING_MAX, cc.CUDNN_POOLING_MAX_DETERMINISTIC):
            out[sel] = sub.max(-1)
        elif mode == cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING:
            out[sel] = sub.sum(-1) / prod(window)
        else:
            out[sel] = sub.sum(-1) / count
    return out


@fuzz("pooling_forward")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_pooling_forward(seed, fault):
    """cudnnPoolingForward: y = alpha*pool(x) + beta*y (002 §3.2.69) with windows, paddings (negative
    in Nd) and strides at random, yDesc of the advised size or not.  Setter rules: window or stride <= 0,
    bad mode or NaN option, nbDims <= 0 (BAD_PARAM), nbDims > CUDNN_DIM_MAX-2 (NOT_SUPPORTED).
    must_reject: n, c, rank or data type of x and y differ, spatial dims of poolingDesc and x differ
    (BAD_PARAM); x not 4-d or 5-d, data types other than FLOAT/DOUBLE/HALF/BFLOAT16/INT8 (NOT_SUPPORTED)."""
    R = Rand(seed)
    faults = Faults(fault, slots("x", "y", descs=("pool",)))
    nsp = R.pick_w(((2, 8), (3, 2), (1, 1), (4, 1)))
    window = tuple(R.int(1, 3) for _ in range(nsp))
    stride = tuple(R.int(1, 3) for _ in range(nsp))
    nd = R.chance(0.5) or nsp != 2
    pad = tuple(R.int(-1 if nd else 0, 2) for _ in range(nsp))
    if R.chance(0.05):
        (window if R.coin() else stride)  # noqa: B018
        window = tuple(R.pick([0, -1]) if i == 0 else w for i, w in enumerate(window))
    mode = R.pick(POOL_MODES) if R.chance(0.97) else 9
    nan_opt = R.pick([0, 1]) if R.chance(0.97) else 4
    xnb = nsp + 2 if R.chance(0.95) else R.pick([3, 4, 5, 6])
    xdims = draw_dims(R, xnb)
    ydims = list(xdims)
    for i in range(2, xnb):
        k = i - 2
        if k < nsp:
            adv = 1 + (xdims[i] + 2 * pad[k] - window[k]) // stride[k]
            ydims[i] = max(1, adv + (R.pick([-1, 1]) if R.chance(0.2) else 0))
    if R.chance(0.05):
        ydims[R.int(0, 1)] += 1
    dtype = R.pick_w(((F32, 6), (F64, 2), (F16, 2), (BF16, 1), (I8, 1), (I32, 1)))
    xspec = draw_tensor_spec(R, xdims, dtype)
    yspec = draw_tensor_spec(R, tuple(ydims), dtype if R.chance(0.97) else R.pick_w(ANY_DTYPE))
    with Scope() as scope:
        pfault = faults.at("desc:pool")
        if pfault:
            pd = bad_descriptor(scope, pfault, cc.cudnnCreatePoolingDescriptor, cc.cudnnDestroyPoolingDescriptor)
        else:
            pd = scope.add(cc.cudnnCreatePoolingDescriptor(), cc.cudnnDestroyPoolingDescriptor)
            want = set()
            if any(w <= 0 for w in window) or any(s <= 0 for s in stride) or mode not in POOL_MODES or nan_opt not in (0, 1):
                want.add(BAD)
            if nd and nsp > DIM_MAX - 2:
                want.add(NS)
            try:
                if nd:
                    cc.cudnnSetPoolingNdDescriptor(pd, mode, nan_opt, nsp, list(window), list(pad), list(stride))
                else:
                    cc.cudnnSetPooling2dDescriptor(pd, mode, nan_opt, *window, *pad, *stride)
                assert not want, f"pooling setter accepted a bad setting {mode, nan_opt, window, pad, stride}"
            except CuDNNError as e:
                assert e.status in want, e
                pfault = "refused"
        X = tensor(R, scope, faults, "x", xspec)
        Y = tensor(R, scope, faults, "y", yspec, nan=R.chance(0.3))
        sc = scalars(R, faults, ("alpha", "beta"), X.info is not None and X.info.dtype == F64)
        out = Out("y", Y.raw, Y.info)
        must = ["pooling descriptor was refused"] if pfault == "refused" else []
        if X.info and Y.info:
            if X.info.nb != Y.info.nb or X.info.dims[:2] != Y.info.dims[:2]:
                must.append("n, c or rank differ")
            if X.info.dtype != Y.info.dtype:
                must.append("data types differ")
            if X.info.nb not in (4, 5):
                must.append("x not 4-d or 5-d")
            if X.info.nb != nsp + 2:
                must.append("poolingDesc spatial dims differ from x's")
            if X.info.dtype not in (F32, F64, F16, BF16, I8):
                must.append("data type not supported")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")

        def oracle():
            x = load(X.raw, X.info)
            lowest = np.finfo(np.float64 if X.info.dtype == F64 else np.float32).min
            r = _compute(pool_reference(x, mode, window, pad, stride, Y.info.dims, lowest),
                         F64 if X.info.dtype == F64 else F32)
            blend(out, r, sc["alpha"][1], sc["beta"][1], np.maximum(np.abs(r), np.abs(x).max(initial=0)))

        invoke("pooling_forward", cc.cudnnPoolingForward,
               (handle_arg(faults.at("handle"), scope), pd, sc["alpha"][0], X.desc, X.data, sc["beta"][0], Y.desc,
                Y.data), [out], {BAD, NS}, must + faults.rejected(("x",), ("y",)), faults.bad_param, oracle)


# == convolution ===========================================================================================

CONV_CONFIGS = (  # (x, w, y, compute) data-type configurations (002 §5.2.10 table 17), and some that are not
    ((F32, F32, F32, F32), 10), ((F64, F64, F64, F64), 3), ((F16, F16, F16, F16), 2), ((F16, F16, F16, F32), 3),
    ((BF16, BF16, BF16, F32), 2), ((I8, I8, I8, I32), 1), ((I8, I8, F32, I32), 1), ((U8, I8, I8, I32), 1),
    ((F32, F32, F32, F64), 1), ((F32, F64, F32, F32), 1), ((F16, F32, F16, F32), 1), ((I8, I8, I8, F32), 1),
)
FWD_ALGOS, BWD_DATA_ALGOS, BWD_FILTER_ALGOS = range(8), range(6), range(7)


CONV_STRIDES = (("packed", 12), ("nhwc", 6), ("gapped", 3), ("permuted", 1), ("zero", 1), ("negative", 1))


def conv_problem(R, direction="fwd"):
    """Random geometry and descriptor specs in forward terms: x (N, C, *S), w (K, C/g, *R), y (N, K, *O);
    mostly valid (a filter that fits, a configuration of the direction), now and then not."""
    nsp = R.pick_w(((2, 8), (3, 2), (1, 1)))
    g = R.pick_w(((1, 6), (2, 3), (3, 1)))
    cg, kg = R.int(1, 2), R.int(1, 2)
    c, k = cg * g, kg * g
    if R.chance(0.05):
        c += 1  # channels per group disagree
    if R.chance(0.05):
        k += 1  # K not a multiple of the group count
    n = R.int(1, 2)
    F = [R.int(1, 3) for _ in range(nsp)]
    pad = [R.int(0, 2) for _ in range(nsp)]
    stride = [R.int(1, 3) for _ in range(nsp)]
    dil = [R.pick([1, 1, 2]) for _ in range(nsp)]
    S = [max(1, (f - 1) * d + 1 - 2 * p) + R.int(0, 3) if R.chance(0.95) else R.int(1, 5)
         for f, d, p in zip(F, dil, pad)]
    if R.chance(0.03):
        pad[0] = -1
    if R.chance(0.03):
        stride[0] = 0
    types = R.pick_w(CONV_CONFIGS[:5] if direction != "fwd" and R.chance(0.9) else CONV_CONFIGS)
    eff = [(f - 1) * d + 1 for f, d in zip(F, dil)]
    O = [max(1, 1 + (s + 2 * p - e) // u) if u > 0 else 1 for s, p, e, u in zip(S, pad, eff, stride)]
    if R.chance(0.05):
        i = R.int(0, nsp - 1)
        O[i] += R.pick([-1, 1]) if O[i] > 1 else 1
    xdims, wdims, ydims = (n, c) + tuple(S), (k, cg) + tuple(F), (n, k) + tuple(O)
    wfmt = R.pick_w(((NCHW, 4), (NHWC, 1)))
    xspec = draw_tensor_spec(R, xdims, types[0], fault=0.01, stride_kind=R.pick_w(CONV_STRIDES))
    yspec = draw_tensor_spec(R, ydims, types[2], fault=0.01, stride_kind=R.pick_w(CONV_STRIDES))
    wspec = {"how": "filter", "dtype": types[1], "fmt": wfmt, "dims": wdims, "strides": None, "four": R.coin()}
    return dict(nsp=nsp, g=g, pad=pad, stride=stride, dil=dil, types=types, mode=R.pick([0, 1]),
                math=R.pick([0, 1, 2, 3]), xspec=xspec, wspec=wspec, yspec=yspec, nd=R.chance(0.5) or nsp != 2)


def make_conv(R, scope, faults, P):
    """(convolution descriptor, 'refused'/fault or None) set from problem P."""
    kind = faults.at("desc:conv")
    if kind:
        return bad_descriptor(scope, kind, cc.cudnnCreateConvolutionDescriptor, cc.cudnnDestroyConvolutionDescriptor), kind
    d = scope.add(cc.cudnnCreateConvolutionDescriptor(), cc.cudnnDestroyConvolutionDescriptor)
    bad = any(p < 0 for p in P["pad"]) or any(u <= 0 for u in P["stride"]) or any(x <= 0 for x in P["dil"])
    try:
        if P["nd"]:
            cc.cudnnSetConvolutionNdDescriptor(d, P["nsp"], P["pad"], P["stride"], P["dil"], P["mode"], P["types"][3])
        else:
            cc.cudnnSetConvolution2dDescriptor(d, *P["pad"], *P["stride"], *P["dil"], P["mode"], P["types"][3])
        assert not bad, f"convolution setter accepted {P['pad'], P['stride'], P['dil']}"
    except CuDNNError as e:
        assert bad and e.status == BAD, e
        return d, "refused"
    cc.cudnnSetConvolutionGroupCount(d, P["g"])
    cc.cudnnSetConvolutionMathType(d, P["math"])
    return d, None


def _tap_slices(tap, dil, stride, O):
    return tuple(slice(t * d, t * d + u * (o - 1) + 1, u) for t, d, u, o in zip(tap, dil, stride, O))


def conv_forward_ref(x, w, pad, stride, dil, g, flip):
    """y[n, k, o] = sum_{c in k's group, taps} x_padded[n, c, o*stride + tap*dil] * w[k, c, tap]."""
    nsp = x.ndim - 2
    if flip:
        w = w[(slice(None), slice(None)) + (slice(None, None, -1),) * nsp]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    K, Cg = w.shape[:2]
    Kg = K // g
    O = [1 + (s + 2 * p - ((f - 1) * d + 1)) // u for s, f, p, u, d in zip(x.shape[2:], w.shape[2:], pad, stride, dil)]
    y = np.zeros((x.shape[0], K) + tuple(O))
    for tap in np.ndindex(*w.shape[2:]):
        xs = xp[(slice(None), slice(None)) + _tap_slices(tap, dil, stride, O)]
        for j in range(g):
            y[:, j * Kg:(j + 1) * Kg] += np.einsum("nc...,kc->nk...", xs[:, j * Cg:(j + 1) * Cg],
                                                   w[(slice(j * Kg, (j + 1) * Kg), slice(None)) + tap])
    return y


def conv_backward_data_ref(dy, w, xdims, pad, stride, dil, g, flip):
    """The adjoint of conv_forward_ref in x: scatter dy through every tap, crop the padding."""
    nsp = dy.ndim - 2
    if flip:
        w = w[(slice(None), slice(None)) + (slice(None, None, -1),) * nsp]
    K, Cg = w.shape[:2]
    Kg = K // g
    O = dy.shape[2:]
    dxp = np.zeros(tuple(xdims[:2]) + tuple(s + 2 * p for s, p in zip(xdims[2:], pad)))
    for tap in np.ndindex(*w.shape[2:]):
        sl = _tap_slices(tap, dil, stride, O)
        for j in range(g):
            dxp[(slice(None), slice(j * Cg, (j + 1) * Cg)) + sl] += np.einsum(
                "nk...,kc->nc...", dy[:, j * Kg:(j + 1) * Kg], w[(slice(j * Kg, (j + 1) * Kg), slice(None)) + tap])
    return dxp[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(pad, xdims[2:]))]


def conv_backward_filter_ref(x, dy, wdims, pad, stride, dil, g, flip):
    """The adjoint of conv_forward_ref in w: dw[k, c, tap] = sum_{n, o} dy[n, k, o] * x_padded[...]."""
    nsp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    K, Cg = wdims[:2]
    Kg = K // g
    O = dy.shape[2:]
    dw = np.zeros(wdims)
    for tap in np.ndindex(*wdims[2:]):
        xs = xp[(slice(None), slice(None)) + _tap_slices(tap, dil, stride, O)]
        for j in range(g):
            sp = "xyz"[:nsp]
            dw[(slice(j * Kg, (j + 1) * Kg), slice(None)) + tap] = np.einsum(
                f"nk{sp},nc{sp}->kc", dy[:, j * Kg:(j + 1) * Kg], xs[:, j * Cg:(j + 1) * Cg])
    if flip:
        dw = dw[(slice(None), slice(None)) + (slice(None, None, -1),) * nsp]
    return dw


def conv_must_reject(P, xi, wi, yi, direction) -> list:
    """The rules 002 gives for a convolution call (forward terms x, w, y whatever the direction)."""
    m = []
    if not (xi.nb == wi.nb == yi.nb):
        m.append("ranks of x, w, y differ")
    if xi.nb != P["nsp"] + 2:
        m.append("x nbDims != arrayLength + 2")
    if xi.nb not in (4, 5):
        m.append("not 4-d or 5-d")
    types = (xi.dtype, wi.dtype, yi.dtype, P["types"][3])
    float_cfg = {(F32, F32, F32, F32), (F64, F64, F64, F64), (F16, F16, F16, F16), (F16, F16, F16, F32),
                 (BF16, BF16, BF16, F32)}
    int_cfg = {(I8, I8, I8, I32), (I8, I8, F32, I32), (U8, I8, I8, I32), (U8, I8, F32, I32)}
    if types not in float_cfg and not (direction == "fwd" and types in int_cfg):
        m.append(f"data type configuration {types}")
    if m:
        return m
    g = P["g"]
    if xi.dims[1] != wi.dims[1] * g:
        m.append("input channels per group differ")
    if wi.dims[0] % g:
        m.append("K not a multiple of groupCount")
    eff = [(f - 1) * d + 1 for f, d in zip(wi.dims[2:], P["dil"])]
    if any(e > s + 2 * p for e, s, p in zip(eff, xi.dims[2:], P["pad"])):
        m.append("filter larger than the padded input")
    else:
        want = (xi.dims[0], wi.dims[0]) + tuple(1 + (s + 2 * p - e) // u for s, p, e, u in
                                                 zip(xi.dims[2:], P["pad"], eff, P["stride"]))
        if yi.dims != want:
            m.append(f"y dims {yi.dims} != {want}")
    return m


def _conv_case(R, fault, direction):
    """Shared body of the three convolution properties: build the problem, call, check."""
    names = {"fwd": ("x", "w", "y"), "bwd_data": ("dx", "w", "dy"), "bwd_filter": ("x", "dw", "dy")}[direction]
    faults = Faults(fault, slots(*names, descs=("conv",)))
    P = conv_problem(R, direction)
    algos = {"fwd": FWD_ALGOS, "bwd_data": BWD_DATA_ALGOS, "bwd_filter": BWD_FILTER_ALGOS}[direction]
    algo = R.pick_w(((0, 6), (R.pick(algos), 6), (R.pick([len(algos), -1, 99]), 1)))
    with Scope() as scope:
        cd, cfault = make_conv(R, scope, faults, P)
        out_name = {"fwd": "y", "bwd_data": "dx", "bwd_filter": "dw"}[direction]
        X = tensor(R, scope, faults, names[0], P["xspec"], nan=out_name == "dx" and R.chance(0.3))
        W = tensor(R, scope, faults, names[1], P["wspec"], filter_=True, nan=out_name == "dw" and R.chance(0.3))
        Y = tensor(R, scope, faults, names[2], P["yspec"], nan=out_name == "y" and R.chance(0.3))
        outT = {"y": Y, "dx": X, "dw": W}[out_name]
        ins = [t for t in (X, W, Y) if t is not outT]
        dbl = Y.info is not None and Y.info.dtype == F64
        sc = scalars(R, faults, ("alpha", "beta"), dbl)
        out = Out(out_name, outT.raw, outT.info)
        must = []
        if cfault == "refused":
            must.append("convolution descriptor was refused")
        elif X.info and W.info and Y.info and not cfault:
            must += conv_must_reject(P, X.info, W.info, Y.info, direction)
            if algo not in algos:
                must.append("algo is not an enum value")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")
        comp = P["types"][3]
        flip = P["mode"] == cc.CUDNN_CONVOLUTION
        geo = (P["pad"], P["stride"], P["dil"], P["g"])

        def oracle():
            x, w, y = (load(t.raw, t.info) if t is not outT else None for t in (X, W, Y))
            if direction == "fwd":
                r, mag = conv_forward_ref(x, w, *geo, flip), conv_forward_ref(np.abs(x), np.abs(w), *geo, flip)
            elif direction == "bwd_data":
                r = conv_backward_data_ref(y, w, X.info.dims, *geo, flip)
                mag = conv_backward_data_ref(np.abs(y), np.abs(w), X.info.dims, *geo, flip)
            else:
                r = conv_backward_filter_ref(x, y, W.info.dims, *geo, flip)
                mag = conv_backward_filter_ref(np.abs(x), np.abs(y), W.info.dims, *geo, flip)
            blend(out, _compute(r, comp) if comp != I32 else r, sc["alpha"][1], sc["beta"][1],
                  mag * (1 + 8 * (comp == F16)))

        fn = {"fwd": cc.cudnnConvolutionForward, "bwd_data": cc.cudnnConvolutionBackwardData,
              "bwd_filter": cc.cudnnConvolutionBackwardFilter}[direction]
        first, second = ins
        ws = R.pick([(None, 0), (None, 64), (np.zeros(256, np.uint8), 256)])
        args = (handle_arg(faults.at("handle"), scope), sc["alpha"][0], first.desc, first.data, second.desc,
                second.data, cd, algo, ws[0], ws[1], sc["beta"][0], outT.desc, outT.data)
        # an algorithm the 002 tables exclude for this problem is NOT_SUPPORTED: allowed, never required
        invoke("convolution_" + {"fwd": "forward", "bwd_data": "backward_data", "bwd_filter": "backward_filter"}[
            direction], fn, args, [out], {BAD, NS}, must + faults.rejected([n for n in names if n != out_name],
                                                                           (out_name,)), faults.bad_param, oracle)


@fuzz("convolution_forward")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_convolution_forward(seed, fault):
    """cudnnConvolutionForward (002 §5.2.10) over groups, paddings, strides, dilations, both modes, every
    algo and data-type configuration.  must_reject: rank, channel, group, data type and filter-size rules
    (BAD_PARAM); ranks other than 4/5, y dims other than the output dims (NOT_SUPPORTED)."""
    _conv_case(Rand(seed), fault, "fwd")


@fuzz("convolution_backward_data")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_convolution_backward_data(seed, fault):
    """cudnnConvolutionBackwardData (002 §5.2.8), checked against the adjoint written here.  must_reject:
    as forward, dy dims other than the output dims (BAD_PARAM), K not a multiple of the group count
    (NOT_SUPPORTED), INT8 configurations."""
    _conv_case(Rand(seed), fault, "bwd_data")


@fuzz("convolution_backward_filter")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_convolution_backward_filter(seed, fault):
    """cudnnConvolutionBackwardFilter (002 §6.2.2), checked against the adjoint written here."""
    _conv_case(Rand(seed), fault, "bwd_filter")


# == batch normalization and LRN ============================================================================

BN_MODES = [cc.CUDNN_BATCHNORM_PER_ACTIVATION, cc.CUDNN_BATCHNORM_SPATIAL, cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT]


def bn_axes(mode, nb):
    return (0,) if mode == cc.CUDNN_BATCHNORM_PER_ACTIVATION else (0,) + tuple(range(2, nb))


def bn_problem(R, infer):
    nb = R.pick_w(((4, 8), (5, 3), (3, 1), (6, 1)))
    mode = R.pick(BN_MODES) if R.chance(0.97) else 7
    xdims = draw_dims(R, nb)
    dtype = R.pick_w(((F32, 6), (F64, 2), (F16, 2), (BF16, 1), (I8, 1 if infer else 0), (I32, 1)))
    xspec = draw_tensor_spec(R, xdims, dtype)
    yspec = same_or(R, xspec, 0.6) if R.chance(0.95) else draw_tensor_spec(R, draw_dims(R, nb), dtype)
    ax = bn_axes(mode, nb) if mode in BN_MODES else (0,)
    pdims = tuple(1 if i in ax else d for i, d in enumerate(xdims))
    if R.chance(0.05):
        pdims = draw_dims(R, nb)
    ptype = F64 if dtype == F64 else F32
    if R.chance(0.05):
        ptype = R.pick([F16, F64, F32])
    pspec = draw_tensor_spec(R, pdims, ptype, fault=0.0, stride_kind=R.pick_w((("packed", 10), ("gapped", 1))))
    eps = R.pick([1e-5, 1e-3, 0.0, 0.1]) if R.chance(0.95) else R.pick([-1e-3, "eps"])
    return dict(nb=nb, mode=mode, dtype=dtype, xspec=xspec, yspec=yspec, pspec=pspec, eps=eps, ax=ax)


def bn_must_reject(P, xi, yi, pi) -> list:
    m = []
    if P["mode"] not in BN_MODES:
        m.append("bad mode")
    if not isinstance(P["eps"], float) or P["eps"] < cc.CUDNN_BN_MIN_EPSILON:
        m.append("epsilon below CUDNN_BN_MIN_EPSILON")
    if xi.nb not in (4, 5):
        m.append("x not 4-d or 5-d")
    if yi.dims != xi.dims or yi.dtype != xi.dtype:
        m.append("x/y dims or data types differ")
    if not m and pi.dims != tuple(1 if i in P["ax"] else d for i, d in enumerate(xi.dims)):
        m.append("parameter dims wrong for the mode")
    if pi.dtype != (F64 if xi.dtype == F64 else F32):
        m.append("parameter data type")
    return m


@fuzz("batchnorm_inference")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_batchnorm_inference(seed, fault):
    """cudnnBatchNormalizationForwardInference: y = alpha*(bias + scale*(x - mean)/sqrt(eps + var)) +
    beta*y (002 §3.2.3).  must_reject: NULL pointers, rank not 4/5, parameter dims wrong for the mode,
    epsilon < CUDNN_BN_MIN_EPSILON, x/y dims or data types differ (BAD_PARAM); parameter or data types
    outside 002 Table 6 (NOT_SUPPORTED)."""
    R = Rand(seed)
    P = bn_problem(R, infer=True)
    names = ("x", "y", "bnScale", "bnBias", "estimatedMean", "estimatedVariance")
    faults = Faults(fault, slots(*names[:2], descs=("param",)) + [f"buf:{n}" for n in names[2:]])
    with Scope() as scope:
        X = tensor(R, scope, faults, "x", P["xspec"])
        Y = tensor(R, scope, faults, "y", P["yspec"], nan=R.chance(0.3))
        pk = faults.at("desc:param")
        if pk:
            pd, pinfo = bad_descriptor(scope, pk, cc.cudnnCreateTensorDescriptor, cc.cudnnDestroyTensorDescriptor), None
        else:
            pd, pinfo = make_tensor(scope, P["pspec"])
        prm = {n: make_buffer(R, pinfo, faults.at("buf:" + n), positive=(n == "estimatedVariance")) for n in names[2:]}
        sc = scalars(R, faults, ("alpha", "beta"), X.info is not None and X.info.dtype == F64)
        out = Out("y", Y.raw, Y.info)
        must = []
        if X.info and Y.info and pinfo:
            must += bn_must_reject(P, X.info, Y.info, pinfo)
            if X.info.dtype not in (F32, F64, F16, BF16, I8):
                must.append("data type not supported")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")

        def oracle():
            x = load(X.raw, X.info)
            sc_, bi, mu, var = (load(prm[n][0], pinfo) for n in names[2:])
            inv = _compute(1 / np.sqrt(_compute(var + P["eps"], pinfo.dtype)), pinfo.dtype)
            r = _compute(bi + sc_ * (x - mu) * inv, F64 if X.info.dtype == F64 else F32)
            blend(out, r, sc["alpha"][1], sc["beta"][1], np.abs(bi) + np.abs(sc_) * (np.abs(x) + np.abs(mu)) * inv)

        invoke("batchnorm_inference", cc.cudnnBatchNormalizationForwardInference,
               (handle_arg(faults.at("handle"), scope), P["mode"], sc["alpha"][0], sc["beta"][0], X.desc, X.data,
                Y.desc, Y.data, pd, *(prm[n][1] for n in names[2:]), P["eps"]),
               [out], {BAD, NS}, must + faults.rejected(("x",) + names[2:], ("y",)), faults.bad_param, oracle)


@fuzz("batchnorm_training")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_batchnorm_training(seed, fault):
    """cudnnBatchNormalizationForwardTraining (002 §4.1.4): y from the batch mean and biased variance;
    running mean/variance (1-f)*old + f*new with the unbiased variance; saved mean and 1/sqrt(var + eps).
    must_reject: as inference, exactly one of a running or saved pair NULL (BAD_PARAM), a running update
    from one value per channel (NOT_SUPPORTED: no unbiased variance), INT8 data (NOT_SUPPORTED)."""
    R = Rand(seed)
    P = bn_problem(R, infer=False)
    pnames = ("bnScale", "bnBias", "resultRunningMean", "resultRunningVariance", "resultSaveMean",
              "resultSaveInvVariance")
    faults = Faults(fault, slots("x", "y", descs=("param",)) + [f"buf:{n}" for n in pnames[:2]])
    running = R.pick_w((("both", 4), ("none", 2), ("one", 1)))
    saved = R.pick_w((("both", 4), ("none", 2), ("one", 1)))
    factor = R.pick([0.0, 0.1, 0.5, 1.0])
    with Scope() as scope:
        X = tensor(R, scope, faults, "x", P["xspec"])
        Y = tensor(R, scope, faults, "y", P["yspec"], nan=R.chance(0.3))
        pk = faults.at("desc:param")
        if pk:
            pd, pinfo = bad_descriptor(scope, pk, cc.cudnnCreateTensorDescriptor, cc.cudnnDestroyTensorDescriptor), None
        else:
            pd, pinfo = make_tensor(scope, P["pspec"])
        prm = {n: make_buffer(R, pinfo, faults.at("buf:" + n), positive=(n == "resultRunningVariance")) for n in pnames}
        args = {n: prm[n][1] for n in pnames}
        for pair, mode in (((pnames[2], pnames[3]), running), ((pnames[4], pnames[5]), saved)):
            if mode == "none":
                args[pair[0]] = args[pair[1]] = None
            elif mode == "one":
                args[pair[R.int(0, 1)]] = None
        sc = scalars(R, faults, ("alpha", "beta"), X.info is not None and X.info.dtype == F64)
        out = Out("y", Y.raw, Y.info)
        outs = [out] + [Out(n, prm[n][0], pinfo) for n in pnames[2:] if args[n] is not None]
        must = []
        if "one" in (running, saved):
            must.append("exactly one of a NULL pair is NULL")
        if X.info and Y.info and pinfo:
            must += bn_must_reject(P, X.info, Y.info, pinfo)
            if X.info.dtype not in (F32, F64, F16, BF16):
                must.append("data type not supported")
            if running == "both" and not must and prod(X.info.dims[a] for a in P["ax"]) < 2:
                must.append("running variance from one value per channel")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")

        def oracle():
            x = load(X.raw, X.info)
            ax = P["ax"]
            m = prod(X.info.dims[a] for a in ax)
            mean, var = x.mean(axis=ax, keepdims=True), x.var(axis=ax, keepdims=True)
            s_, b_ = load(prm["bnScale"][0], pinfo), load(prm["bnBias"][0], pinfo)
            with np.errstate(all="ignore"):  # var == eps == 0: 0 * inf, NaN as on the device
                inv = 1 / np.sqrt(var + P["eps"])
                r = _compute(s_ * (x - mean) * inv + b_, F64 if X.info.dtype == F64 else F32)
            blend(out, r, sc["alpha"][1], sc["beta"][1], np.abs(b_) + np.abs(s_) * (np.abs(x) + np.abs(mean)) * inv)
            want = {"resultSaveMean": mean, "resultSaveInvVariance": inv}
            if running == "both":
                rm, rv = (load(o.before, pinfo) for o in outs if o.name in pnames[2:4])
                want["resultRunningMean"] = (1 - factor) * rm + factor * mean
                want["resultRunningVariance"] = (1 - factor) * rv + factor * var * m / (m - 1)
            for o in outs[1:]:
                o.want = np.broadcast_to(want[o.name], pinfo.dims)
                o.mag = np.abs(o.want) * 4 + 1

        invoke("batchnorm_training", cc.cudnnBatchNormalizationForwardTraining,
               (handle_arg(faults.at("handle"), scope), P["mode"], sc["alpha"][0], sc["beta"][0], X.desc, X.data,
                Y.desc, Y.data, pd, args["bnScale"], args["bnBias"], factor, args["resultRunningMean"],
                args["resultRunningVariance"], P["eps"], args["resultSaveMean"], args["resultSaveInvVariance"]),
               outs, {BAD, NS}, must + faults.rejected(("x", "bnScale", "bnBias"), ("y",)), faults.bad_param, oracle)


@fuzz("lrn_forward")
@given(SEEDS, FAULTS)
@cases
def test_fuzz_lrn_forward(seed, fault):
    """cudnnLRNCrossChannelForward: y = alpha * x / (K + (lrnAlpha/N) * sum_window x^2)^lrnBeta + beta*y
    over the channel window [c - (N-1)//2, c + N - (N-1)//2 - 1] (002 §3.2.65).  Setter rules: N outside
    [CUDNN_LRN_MIN_N, CUDNN_LRN_MAX_N], K < CUDNN_LRN_MIN_K, beta < CUDNN_LRN_MIN_BETA (BAD_PARAM).
    must_reject: rank <= 2, 5-d not NCDHW DHW-packed, bad lrnMode (BAD_PARAM); data types or dims of x
    and y differ, rank not 4/5, overlapping strides, unsupported data types (NOT_SUPPORTED)."""
    R = Rand(seed)
    faults = Faults(fault, slots("x", "y", descs=("lrn",)))
    lrnN = R.int(1, 16) if R.chance(0.95) else R.pick([0, 17])
    lalpha = R.pick([1e-4, 0.5, 1.0, 2.0])
    lbeta = R.pick([0.75, 0.5, 1.0, 0.01]) if R.chance(0.95) else 0.005
    lk = R.pick([2.0, 1.0, 1e-5, 0.5]) if R.chance(0.95) else 1e-6
    lrn_mode = 0 if R.chance(0.97) else 3
    dims = draw_dims(R, nbdims_choice(R, ((4, 8), (5, 3), (3, 1), (6, 1))))
    dtype = R.pick_w(((F32, 6), (F64, 2), (F16, 2), (BF16, 1), (I8, 1)))
    xspec = draw_tensor_spec(R, dims, dtype)
    yspec = same_or(R, xspec, 0.6) if R.chance(0.95) else draw_tensor_spec(R, draw_dims(R, len(dims)), dtype)
    with Scope() as scope:
        lk_fault, ld = faults.at("desc:lrn"), None
        if lk_fault == "unset":  # 002 §3.2.11: a created LRN descriptor holds the defaults; it is usable
            faults.fault, lk_fault = None, None
            lrnN, lalpha, lbeta, lk = 5, 1e-4, 0.75, 2.0
            ld = scope.add(cc.cudnnCreateLRNDescriptor(), cc.cudnnDestroyLRNDescriptor)
        elif lk_fault:
            ld = bad_descriptor(scope, lk_fault, cc.cudnnCreateLRNDescriptor, cc.cudnnDestroyLRNDescriptor)
        if not lk_fault and ld is None:
            ld = scope.add(cc.cudnnCreateLRNDescriptor(), cc.cudnnDestroyLRNDescriptor)
            bad = not (cc.CUDNN_LRN_MIN_N <= lrnN <= cc.CUDNN_LRN_MAX_N) or lk < cc.CUDNN_LRN_MIN_K or \
                lbeta < cc.CUDNN_LRN_MIN_BETA
            try:
                cc.cudnnSetLRNDescriptor(ld, lrnN, lalpha, lbeta, lk)
                assert not bad, f"cudnnSetLRNDescriptor accepted {lrnN, lalpha, lbeta, lk}"
            except CuDNNError as e:
                assert bad and e.status == BAD, e
                lrnN, lalpha, lbeta, lk = 5, 1e-4, 0.75, 2.0  # the descriptor keeps its defaults
        X = tensor(R, scope, faults, "x", xspec)
        Y = tensor(R, scope, faults, "y", yspec, nan=R.chance(0.3))
        sc = scalars(R, faults, ("alpha", "beta"), X.info is not None and X.info.dtype == F64)
        out = Out("y", Y.raw, Y.info)
        must = [] if lrn_mode == 0 else ["bad lrnMode"]
        if X.info and Y.info:
            for t in (X.info, Y.info):
                if t.nb <= 2 or t.nb not in (4, 5):
                    must.append("rank not 4/5")
                elif t.nb == 5 and t.strides[2:] != (t.dims[3] * t.dims[4], t.dims[4], 1):
                    must.append("5-d not DHW-packed")
                if t.overlapping():
                    must.append("overlapping strides")
            if X.info.dims != Y.info.dims or X.info.dtype != Y.info.dtype:
                must.append("x/y dims or data types differ")
            if X.info.dtype not in (F32, F64, F16, BF16):
                must.append("data type not supported")
        else:  # a descriptor its setter refused (or a faulted one): the call must be refused
            must.append("a descriptor was refused")

        def oracle():
            x = load(X.raw, X.info)
            lb = (lrnN - 1) // 2
            C = x.shape[1]
            sq = np.zeros_like(x)
            for c in range(C):
                lo, hi = max(0, c - lb), min(C, c + lrnN - lb)
                sq[:, c] = (x[:, lo:hi] ** 2).sum(axis=1)
            r = _compute(x / (lk + lalpha / lrnN * sq) ** lbeta, F64 if X.info.dtype == F64 else F32)
            blend(out, r, sc["alpha"][1], sc["beta"][1], np.abs(r) * 4)

        invoke("lrn_forward", cc.cudnnLRNCrossChannelForward,
               (handle_arg(faults.at("handle"), scope), ld, lrn_mode, sc["alpha"][0], X.desc, X.data, sc["beta"][0],
                Y.desc, Y.data), [out], {BAD, NS}, must + faults.rejected(("x",), ("y",)), faults.bad_param, oracle)


# == the same properties on the GPU engines ==================================================================

COMPUTE_PROPERTIES = [n for n in sorted(globals()) if n.startswith("test_fuzz_") and "descriptor" not in n]


@pytest.mark.gpu
@pytest.mark.parametrize("name", COMPUTE_PROPERTIES)
def test_fuzz_on_the_gpu(name, monkeypatch):
    """Every compute property at CI size through a GPU handle, against the same NumPy oracles
    (benchmarks/fuzz_nightly.py --place gpu runs them at full size)."""
    gpu = cc.cudnnCreate("gpu")
    try:
        monkeypatch.setattr(sys.modules[__name__], "H", gpu)
        globals()[name]()
    finally:
        cc.cudnnDestroy(gpu)
