"""Multi-head attention through cuDNN's fused flash attention (issue 24 item 1; 000 "Fused
Flash Attention fprop/bprop").

On a GPU handle the three compute calls of ``attention.compute`` first ask ``core(...)``
whether the call fits the fused engine.  It does when the data is HALF, Q, K and V are
projected with head sizes that are multiples of 8 up to 128, every query time step runs
(currIdx < 0), K/V beams match the Q beam (or both are 1), the attention windows form no mask,
a causal band (lo = 0, hi = t + 1) or a causal sliding window (lo = t - w + 1, hi = t + 1),
no valid query row has an empty window, and cuDNN's SDPA engines finalize the graph
(``_backend.engines.cudnn_engine.sdpa``).  Otherwise ``core`` returns the reason, the graph
path of ``attention.compute`` runs, and the reason is recorded as the decline of
``cudnn:sdpa`` in that plan's declines (``CUDNN_COMPAT_LOG=info``, ``cudnn-compat explain``).

The fused path (CuPy on the handle's stream, fp16 throughout, fp32 accumulation):
  Qp = X_q W_Q^T + b_Q as one [rows, H*P] GEMM (rows = batch * beam * time): the heads stay
  interleaved (BSHD), which the SDPA graph reads through strides; likewise Kp, Vp;
  O = SDPA(Qp, Kp, Vp) with the padding mask from the sequence lengths and the band;
  out = O W_O^T (+ b_O, + residuals), padding rows written 0.
Training (a reserve space) keeps Qp, Kp, Vp, O and the softmax statistics in the reserve space
after the window mask the graph path keeps there (``descriptor.fused_regions``), and records
the reserve space's address with the call's signature.  BackwardData (same reserve space,
signature, lengths and windows) runs the SDPA bprop graph into dQp, dKp, dVp, kept in the
reserve space too, then dX = dXp W; BackwardWeights after it reads them: dW = dXp^T X,
db = sum of dXp rows, dW_O from dout and O (002 §8.2.16's contract: BackwardData first, with
the same reserve space and dout).  A reserve space filled by the graph path runs the graph path.
"""
from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from cudnn_compat._backend.engines.base import current_stream

from .._core import bound_graph as bg
from .descriptor import BATCH, BEAM, TIME, WKIND, fused_regions, weight_layout

ENGINE = "cudnn:sdpa"  # the name declines are recorded under
HEAD_MAX = 128


@dataclass(frozen=True)
class Band:
    """The attention window as a mask: none, causal (key j <= query i), and a sliding window
    of ``window`` keys (j > i - window; 0: unbounded)."""
    causal: bool = False
    window: int = 0


def band_of(lo: np.ndarray, hi: np.ndarray, tk: int) -> "Band | str":
    """The Band that the windows [lo[t], hi[t]) of query steps t = 0.. give over tk keys, or the
    reason they form none (clipped to [0, tk] first: the window is an index range)."""
    t = np.arange(len(lo))
    lo_c, hi_c = np.clip(lo, 0, tk), np.clip(hi, 0, tk)
    if np.all(lo_c == 0) and np.all(hi_c == tk):
        return Band()
    if not np.all(hi_c == np.minimum(t + 1, tk)):
        return "the attention windows (hiWinIdx) are neither all full nor causal (hiWinIdx[t] = t + 1)"
    if np.all(lo_c == 0):
        return Band(causal=True)
    first = int(np.argmax(lo_c > 0))
    w = int(first - lo_c[first] + 1)
    if w >= 1 and np.all(lo_c == np.clip(t - w + 1, 0, tk)):
        return Band(causal=True, window=w)
    return "the attention windows (loWinIdx) are not a sliding window (loWinIdx[t] = t - w + 1) nor 0"


def empty_rows(band: Band, len_q: np.ndarray, len_k: np.ndarray) -> bool:
    """Whether some valid query row (t < len_q) has no key in its window and below len_k."""
    valid = len_q > 0
    if np.any(valid & (len_k <= 0)):
        return True
    if band.window:
        return bool(np.any(valid & (len_q - band.window >= len_k)))
    return False


def static_reason(a, place: str, forced: "str | None", bq: int, bk: int, one_step: bool) -> "str | None":
    """Why a call with attention descriptor ``a`` cannot run fused, from its settings alone
    (None: it may)."""
    if place != "gpu":
        return "the handle is on the CPU place"
    if forced and forced != "cudnn":
        return f"CUDNN_COMPAT_ENGINE forces the {forced} engine"
    if a.dtype != "float16":
        return f"{a.dtype} data: cuDNN's fused flash attention takes fp16/bf16 data only"
    if not (a.qProjSize and a.kProjSize and a.vProjSize):
        return "Q, K or V without a projection (every head would read the whole input vector)"
    for name, d in (("qProjSize", a.qProjSize), ("vProjSize", a.vProjSize)):
        if d % 8 or d > HEAD_MAX:
            return f"head size {name}={d}: the fused engine takes multiples of 8 up to {HEAD_MAX}"
    if one_step:
        return "a single time step (currIdx >= 0)"
    if bk != bq:
        return f"K/V beam {bk} with Q beam {bq} (QUERYMAP_ALL_TO_ONE with beams)"
    return None


@dataclass(frozen=True)
class Core:
    """What the fused path needs of one call: the SDPA problem and the sizes."""
    sdpa: object  # sdpa.Sdpa
    b: int  # batch * beam
    tq: int
    tk: int
    band: Band
    padding: bool
    lengths: bytes = b""  # lengths_key(q, k)


def lengths_key(q, k) -> bytes:
    return q.lengths().tobytes() + b"/" + k.lengths().tobytes()


_CORES: OrderedDict = OrderedDict()  # everything core() reads -> its answer (a repeated call decides once)


def core(h, a, q, k, lo, hi, one_step: bool) -> "Core | str":
    """The fused plan of a call (the Core), or the reason it runs the graph path."""
    from cudnn_compat._backend.heuristics import forced_engine
    forced = forced_engine()
    key = (h.place, forced, a.key(), q.key(), k.key(), q.seqLengths.tobytes(), k.seqLengths.tobytes(), lo.tobytes(),
           hi.tobytes(), one_step)
    got = _CORES.get(key)
    if got is None:
        got = _core(h, a, q, k, lo, hi, one_step, forced)
        with _LOCK:
            _CORES[key] = got
            while len(_CORES) > 64:
                _CORES.popitem(last=False)
    return got


def _core(h, a, q, k, lo, hi, one_step: bool, forced) -> "Core | str":
    bq, bk = q.dimA[BEAM], k.dimA[BEAM]
    why = static_reason(a, h.place, forced, bq, bk, one_step)
    if why:
        return why
    tq, tk = q.dimA[TIME], k.dimA[TIME]
    band = band_of(lo, hi, tk)
    if isinstance(band, str):
        return band
    len_q = q.lengths().reshape(-1)
    len_k = np.broadcast_to(k.lengths(), q.lengths().shape).reshape(-1)
    if empty_rows(band, len_q, len_k):
        return "a valid query row has no key in its window (the fused softmax has no empty rows)"
    padding = bool(np.any(len_q < tq) or np.any(len_k < tk))
    from cudnn_compat._backend.engines.cudnn_engine.sdpa import Sdpa
    n, hh, p, pv = q.dimA[BATCH] * bq, a.nHeads, a.qProjSize, a.vProjSize
    sq = (tq * hh * p, p, hh * p, 1)
    sk = (tk * hh * p, p, hh * p, 1)
    sv = (tk * hh * pv, pv, hh * pv, 1)
    so = (tq * hh * pv, pv, hh * pv, 1)
    spec = Sdpa(n, hh, tq, tk, p, pv, sq, sk, sv, so, "float16", padding, band.causal, band.window)
    return Core(spec, n, tq, tk, band, padding, lengths_key(q, k))


# -- native plans, device constants --------------------------------------------------------------

_PLANS: dict = {}  # (device, 'fprop'|'bprop', Sdpa) -> SdpaPlan or the reason it failed
_CONST: OrderedDict = OrderedDict()  # (device, what, bytes) -> device array
_LOCK = threading.Lock()
_RESERVES: dict = {}  # (device, reserve address) -> [signature, gradients kept]


def plan_for(device: int, which: str, spec) -> "object | str":
    """The SdpaPlan (or the reason none finalizes, cached) of ``spec``."""
    key = (device, which, spec)
    got = _PLANS.get(key)
    if got is not None:
        return got
    from cudnn_compat._backend.engines.cudnn_engine import lib, sdpa
    try:
        handle = lib.handle_for(device, 0)
        got = sdpa.SdpaPlan(sdpa.fprop_graph(spec) if which == "fprop" else sdpa.bprop_graph(spec), handle)
    except Exception as e:  # noqa: BLE001 - any failure to build is a decline with its text
        got = f"{type(e).__name__}: {e}"
    if isinstance(got, str):
        got = f"cuDNN's SDPA engines did not finalize the {which} graph ({got[:1500]})"
    with _LOCK:
        _PLANS[key] = got
    return got


def _const(device: int, what: str, array: np.ndarray):
    import cupy
    key = (device, what, array.dtype.str, array.shape, array.tobytes())
    with _LOCK:
        hit = _CONST.get(key)
        if hit is not None:
            _CONST.move_to_end(key)
            keep = getattr(_CAPTURE, "keep", None)
            if keep is not None:  # a graph being captured reads it: it lives with the graph
                keep.append(hit)
            return hit
    if getattr(_CAPTURE, "stream", None) is not None:  # no host-to-device copy inside a capture
        raise RuntimeError(f"device constant {what!r} not cached before the capture")
    with cupy.cuda.Device(device):
        hit = cupy.asarray(array)
    with _LOCK:
        _CONST[key] = hit
        while len(_CONST) > 16:
            _CONST.popitem(last=False)
    return hit


def _flat(buf, nbytes: int, dtype):
    """A flat CuPy array of ``dtype`` over ``nbytes`` of the device buffer ``buf``."""
    import cupy
    if isinstance(buf, cupy.ndarray):
        return buf.reshape(-1, order="A").view(cupy.uint8)[:nbytes].view(dtype)
    ptr = bg.address(buf)
    mem = cupy.cuda.UnownedMemory(int(ptr), nbytes, None)
    return cupy.ndarray((nbytes // np.dtype(dtype).itemsize,), dtype, cupy.cuda.MemoryPointer(mem, 0))


def _view(buf, dims, strides, dtype=np.float16, offset_bytes: int = 0):
    """A strided CuPy view (element strides) of the device buffer ``buf`` from ``offset_bytes``."""
    import cupy
    item = np.dtype(dtype).itemsize
    span = offset_bytes + (1 + sum((d - 1) * s for d, s in zip(dims, strides))) * item
    flat = _flat(buf, span, np.uint8)[offset_bytes:]
    return cupy.ndarray(tuple(dims), dtype, flat.data, strides=tuple(s * item for s in strides))


def _regions(a, c, reserve) -> dict:
    """The reserve space's fused regions (``descriptor.fused_regions``) as flat CuPy views."""
    return {name: _view(reserve, (n,), (1,), np.float32 if name == "stats" else np.float16, off)
            for name, (off, n) in fused_regions(a, c.b, c.tq, c.tk).items()}


def _seq(buf, d, vec: int):
    """[batch, beam, time, vec] view of a sequence buffer laid out as descriptor ``d``."""
    st = d.strides()
    return _view(buf, (d.dimA[BATCH], d.dimA[BEAM], d.dimA[TIME], vec), (st[BATCH], st[BEAM], st[TIME], 1))


class Weights:
    """The projection weights and biases of the weight buffer as CuPy views."""

    def __init__(self, a, buf):
        layout, _ = weight_layout(a)
        self.a, self.buf, self.layout = a, buf, layout

    def w(self, which):  # [H*P, S]
        off, (hh, p, s) = self.layout[WKIND[f"CUDNN_MH_ATTN_{which}_WEIGHTS"]]
        return _view(self.buf, (hh * p, s), (s, 1), offset_bytes=off)

    def wo3(self):  # [H, Po, Pv]
        off, (hh, p, s) = self.layout[WKIND["CUDNN_MH_ATTN_O_WEIGHTS"]]
        return _view(self.buf, (hh, p, s), (p * s, s, 1), offset_bytes=off)

    def b(self, which):  # [H*P] or None
        e = self.layout.get(WKIND[f"CUDNN_MH_ATTN_{which}_BIASES"])
        if e is None:
            return None
        off, (hh, p, _) = e
        return _view(self.buf, (hh * p,), (1,), offset_bytes=off)

    def has_o(self) -> bool:
        return WKIND["CUDNN_MH_ATTN_O_WEIGHTS"] in self.layout


@dataclass
class Ran:
    """What ``cudnn_compat.last_engine()`` / ``last_plan()`` report after a fused call."""
    engine: str
    config: str
    graph: object = None
    workspace_size: int = 0
    declines: tuple = ()
    place: str = "gpu"


def _stream(h):
    """The stream the call's device work goes to: the handle's, or the capture stream while a
    repeated call is being captured (``_replayed``)."""
    cap = getattr(_CAPTURE, "stream", None)
    if cap is not None:
        import cupy
        return cupy.cuda.ExternalStream(cap)
    return h.stream if h.stream is not None else contextlib.nullcontext()


def _handle_stream(h) -> int:
    """The handle's stream, or (none set) the one every engine runs such a call on."""
    return int(h.stream.ptr) if h.stream is not None else current_stream()


def _stream_ptr(h) -> int:
    """``_stream(h)``'s stream as a pointer."""
    cap = getattr(_CAPTURE, "stream", None)
    return cap if cap is not None else _handle_stream(h)


# -- CUDA graphs of repeated calls ---------------------------------------------------------------
# A fused call's device work is a dozen launches (projection GEMMs, bias adds, the SDPA plan,
# copies) whose host cost (~0.5 ms) exceeds its device time at the shapes.  A call is
# keyed by everything its launches depend on (its signature and every device address it reads
# or writes, the stream); the second call with a key captures its launches into a CUDA graph
# (``_backend.engines.graphs``, the one capture implementation) and every later one replays it.  The
# scratch it allocates comes from one block sized by the first call's allocations (nothing is
# allocated while capturing) and lives with the graph.  A call made while the caller's stream
# is itself being captured runs its launches into the caller's capture instead.

REPLAY = True  # tests switch it off to compare
_GRAPHS: OrderedDict = OrderedDict()  # key -> bytes the work allocated (seen once) | _Graph | "failed"
_GRAPHS_MAX = 8
_CAPTURE = threading.local()  # .stream: the capture stream; .keep: device arrays the graph reads


def _rounded(size) -> int:
    """Bytes a scratch allocation takes in the capture block (512-byte slices)."""
    return -(-int(size) // 512) * 512


class _Graph:
    __slots__ = ("exe", "keep")

    def __init__(self, exe, keep):
        self.exe, self.keep = exe, keep


def _allocator(sizes: "list | None" = None, block=None):
    """A CuPy allocator that records the sizes asked of the current one (``sizes``), or hands
    out 512-byte aligned slices of ``block`` (MemoryError past its end)."""
    import cupy
    get = getattr(cupy.cuda, "get_allocator", None)
    base = get() if get is not None else cupy.get_default_memory_pool().malloc
    if block is None:
        def record(size):
            sizes.append(int(size))
            return base(size)
        return record
    used = [0]

    def bump(size):
        start, used[0] = used[0], used[0] + _rounded(size)
        if used[0] > block.mem.size:
            raise MemoryError("fused attention capture: more scratch than the first call used")
        return block + start
    return bump


def _replayed(h, key: tuple, work, held=()) -> None:
    """Run ``work()`` (the call's device work, on ``_stream(h)``), or replay its CUDA graph."""
    import cupy
    from cudnn_compat._backend.engines import graphs as _graphs
    sptr = _handle_stream(h)
    graphs = _graphs.graphs()
    if not REPLAY or graphs.capturing(sptr):
        work()
        return
    key = (h.device, sptr) + key
    got = _GRAPHS.get(key)
    if got is None:  # first call: run it, measuring its scratch
        sizes: list = []
        with cupy.cuda.using_allocator(_allocator(sizes)):
            work()
        with _LOCK:
            _GRAPHS[key] = sum(_rounded(s) for s in sizes)
            _evict()
        return
    if isinstance(got, int):  # second call: capture, then replay
        got = _capture(h, work, got, held, graphs)
        with _LOCK:
            _GRAPHS[key] = got
    if isinstance(got, _Graph):
        with cupy.cuda.Device(h.device):
            graphs.launch(got.exe, sptr)
        with _LOCK:
            _GRAPHS.move_to_end(key)
    else:
        work()


def _capture(h, work, nbytes: int, held, graphs) -> "_Graph | str":
    import cupy
    from cudnn_compat._backend.engines.cudnn_engine import lib
    keep = list(held)
    try:
        with cupy.cuda.Device(h.device):
            lib.handle_for(h.device, graphs.capture_stream(h.device))  # made before capturing (cudnnCreate allocates)
            block = cupy.empty(max(nbytes, 512), cupy.uint8).data
            keep.append(block)

            def launch_all(cap):
                _CAPTURE.stream, _CAPTURE.keep = cap, keep
                try:
                    with cupy.cuda.using_allocator(_allocator(block=block)):
                        work()
                finally:
                    _CAPTURE.stream = _CAPTURE.keep = None
            return _Graph(graphs.capture(launch_all, h.device), keep)
    except Exception as e:  # noqa: BLE001 - the call runs without a graph, and the failure is logged
        from cudnn_compat._backend.engines.graphs import capture_failed
        capture_failed("fused attention", e)
        return "failed"


def _evict() -> None:
    """Keep ``_GRAPHS_MAX`` keys (under _LOCK): a dropped graph is destroyed after the device
    finished what was launched (its scratch goes back to the pool)."""
    while len(_GRAPHS) > _GRAPHS_MAX:
        _, got = _GRAPHS.popitem(last=False)
        if isinstance(got, _Graph):
            import cupy
            from cudnn_compat._backend.engines import graphs as _graphs
            cupy.cuda.runtime.deviceSynchronize()
            _graphs.graphs().destroy(got.exe)


def _call_key(kind: str, head: tuple, descs: tuple, *bufs) -> tuple:
    """What a fused call's launches depend on besides the handle's device and stream: the call,
    ``head`` (its signature, plan...), the sequence descriptors' settings and every buffer address."""
    addresses = tuple(None if b is None else bg.address(b) for b in bufs)
    return (kind,) + head + tuple(d.key() for d in descs) + addresses


def _sdpa_run(h, a, c: Core, q, k, plan, ptrs: dict):
    """Execute SDPA ``plan`` with the data pointers ``ptrs`` (uid -> address), adding the sequence
    lengths (padding) and the by-value scalars, on the handle's stream."""
    import cupy
    from cudnn_compat._backend.engines.cudnn_engine import lib, sdpa
    from cudnn_compat._backend.engines.cudnn_engine.plan import _device_lock
    if c.padding:
        len_q, len_k = _lengths(h, c, q, k)
        ptrs[sdpa.SEQ_Q] = _const(h.device, "lq", len_q).data.ptr
        ptrs[sdpa.SEQ_KV] = _const(h.device, "lk", len_k).data.ptr
    values = {sdpa.SCALE: a.smScaler, sdpa.NEG: float("-inf"), sdpa.WIN: float(c.band.window), sdpa.ONE: 1.0}
    ws = cupy.empty(max(plan.workspace, 1), cupy.uint8)
    sptr = _stream_ptr(h)
    with _device_lock(h.device):
        plan.execute(lib.handle_for(h.device, sptr), ptrs, values, ws.data.ptr)


def _lengths(h, c: Core, q, k):
    len_q = q.lengths().reshape(-1).astype(np.int32)
    len_k = np.broadcast_to(k.lengths(), q.lengths().shape).reshape(-1).astype(np.int32)
    return len_q, len_k


def _row_masks(h, c: Core, q, k):
    """(rows of Q valid [n, tq, 1], rows of K valid [n, tk, 1]) as device bool arrays."""
    len_q, len_k = _lengths(h, c, q, k)
    rq = np.arange(c.tq)[None, :, None] < len_q[:, None, None]
    rk = np.arange(c.tk)[None, :, None] < len_k[:, None, None]
    return _const(h.device, "rowq", rq), _const(h.device, "rowk", rk)


def _mm(a, b, out=None):
    """a @ b (into ``out``) on cuBLAS, fp16 x fp16 -> fp16 with fp32 accumulation (tensor cores):
    the cupy engine's GEMM (cublasGemmStridedBatchedEx; CuPy's own matmul is not used, as there)."""
    from cudnn_compat._backend.engines.cupy_engine.gemm import matmul
    return matmul(a, b, "float32", out)


def _project(x4, w, b, out=None):
    """x [.., S] (any strides) -> x W^T (+ b) as [rows, H*P] (into ``out``: a 2-d view)."""
    import cupy
    x2 = x4.reshape(-1, x4.shape[-1]) if x4.flags.c_contiguous else cupy.ascontiguousarray(x4).reshape(-1, x4.shape[-1])
    y = _mm(x2, w.T, out)  # straight into ``out`` (the reserve space) when it is contiguous
    _add_bias(y, b)
    return y


# y += b over the rows of a C-contiguous fp16 [rows, n] matrix, 8 halves (16 bytes) a thread, the
# add as PTX add.rn.f16x2 (correctly rounded, as CuPy's fp16 add; no header needed): CuPy's
# broadcast add, and an element-per-thread kernel, ran at a third of the memory bandwidth (41 us
# of the forward's 287 at B32 T512 E512 on the H100).
BIAS_KERNEL = "cudnn_compat_add_row_bias_h8"
BIAS_SRC = r"""
extern "C" __global__ void cudnn_compat_add_row_bias_h8(uint4* y, const uint4* b, unsigned int total,
                                                        unsigned int n8) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    uint4 v = y[i];
    const uint4 w = b[i % n8];
    asm("add.rn.f16x2 %0, %0, %1;" : "+r"(v.x) : "r"(w.x));
    asm("add.rn.f16x2 %0, %0, %1;" : "+r"(v.y) : "r"(w.y));
    asm("add.rn.f16x2 %0, %0, %1;" : "+r"(v.z) : "r"(w.z));
    asm("add.rn.f16x2 %0, %0, %1;" : "+r"(v.w) : "r"(w.w));
    y[i] = v;
}
"""
_BIAS: list = [None]


def _add_bias(y, b) -> None:
    """y += b over the rows of ``y`` (BIAS_SRC where it applies: fp16, contiguous, n a multiple
    of 8, 16-byte aligned; else CuPy's broadcast add)."""
    if b is None:
        return
    import cupy
    n = b.shape[0] if b.ndim == 1 else -1
    total = y.size // 8
    if (y.dtype != cupy.float16 or b.dtype != cupy.float16 or not y.flags.c_contiguous or not b.flags.c_contiguous
            or n != y.shape[-1] or n % 8 or y.data.ptr % 16 or b.data.ptr % 16 or total >= 2 ** 31):
        y += b
        return
    if _BIAS[0] is None:
        _BIAS[0] = cupy.RawKernel(BIAS_SRC, BIAS_KERNEL)
    if total:
        _BIAS[0](((total + 255) // 256,), (256,), (y, b, np.uint32(total), np.uint32(n // 8)))


def _col_sum(g2):
    """Column sums of [rows, C] as fp16 (a ones-row GEMM: fp32 accumulation, coalesced)."""
    import cupy
    return _mm(cupy.ones((1, g2.shape[0]), g2.dtype), g2)[0]


def signature(a, c: Core, q, k, lo, hi) -> tuple:
    """What a fused BackwardData must share with the forward that filled the reserve space."""
    return (a.key(), c.sdpa, c.lengths, lo.tobytes(), hi.tobytes())


def forward(h, a, c: Core, plan, q, k, v, o, queries, keys, values, out, residuals, weights, reserve, mask,
            sig) -> Ran:
    """The fused forward (see the module docstring); ``reserve``: the reserve space or None."""
    import cupy
    from cudnn_compat._backend.engines.cudnn_engine import sdpa
    hh, p, pv = a.nHeads, a.qProjSize, a.vProjSize

    def work():
        with cupy.cuda.Device(h.device), _stream(h):
            wt = Weights(a, weights)
            if reserve is not None:
                r = _regions(a, c, reserve)
                qp, kp, vp = r["qp"].reshape(-1, hh * p), r["kp"].reshape(-1, hh * p), r["vp"].reshape(-1, hh * pv)
                oh, stats = r["o"].reshape(-1, hh * pv), r["stats"]
                mview = _flat(reserve, mask.nbytes, mask.dtype)
                mview[...] = mask.reshape(-1)  # the graph path's BackwardWeights reads the window mask here
            else:
                qp = kp = vp = None
                oh = cupy.empty((c.b * c.tq, hh * pv), cupy.float16)
                stats = cupy.empty(c.b * hh * c.tq, cupy.float32)
            qp = _project(_seq(queries, q, a.qSize), wt.w("Q"), wt.b("Q"), qp)
            kp = _project(_seq(keys, k, a.kSize), wt.w("K"), wt.b("K"), kp)
            vp = _project(_seq(values, v, a.vSize), wt.w("V"), wt.b("V"), vp)
            ptrs = {sdpa.Q: qp.data.ptr, sdpa.K: kp.data.ptr, sdpa.V: vp.data.ptr, sdpa.O: oh.data.ptr,
                    sdpa.STATS: stats.data.ptr}
            _sdpa_run(h, a, c, q, k, plan, ptrs)
            if wt.has_o():
                y = _mm(oh, cupy.ascontiguousarray(wt.wo3().transpose(0, 2, 1)).reshape(hh * pv, -1))
                _add_bias(y, wt.b("O"))
            else:
                y = oh.copy() if reserve is not None else oh
            y = y.reshape(c.b, c.tq, -1)
            if residuals is not None:
                y += _seq(residuals, q, a.qSize).reshape(c.b, c.tq, -1)
            if c.padding:
                y = cupy.where(_row_masks(h, c, q, k)[0], y, 0)
            _seq(out, o, a.o_size)[...] = y.reshape(o.dimA[BATCH], o.dimA[BEAM], c.tq, -1)

    training = reserve is not None
    _replayed(h, _call_key("fwd", (sig, id(plan)), (q, k, v, o), queries, keys, values, out, residuals, weights,
                           reserve, mask if training else None), work, held=(mask,) if training else ())
    if training:
        with _LOCK:
            _RESERVES[(h.device, bg.address(reserve))] = [sig, False, c]
            while len(_RESERVES) > 64:  # reserve spaces of earlier steps, long freed
                _RESERVES.pop(next(iter(_RESERVES)))
    return Ran("cudnn", f"sdpa fprop {plan.config}", workspace_size=plan.workspace)


def forget(h, reserve) -> None:
    """The graph path filled ``reserve``: it holds no fused state any more."""
    with _LOCK:
        _RESERVES.pop((h.device, bg.address(reserve)), None)


def reserve_state(h, reserve, sig, weights: bool = False) -> "Core | str":
    """The Core of the fused forward (BackwardData: of signature ``sig``) whose state ``reserve``
    holds (BackwardWeights, ``weights``: with the gradients of a fused BackwardData; its ``sig``
    has no windows), else the reason the fused backward cannot run."""
    got = _RESERVES.get((h.device, bg.address(reserve)))
    if got is None:
        return "the reserve space was not filled by a fused forward training call"
    if got[0][:len(sig)] != sig:
        return "the reserve space holds a fused forward of other descriptors, lengths or windows"
    if weights and not got[1]:
        return "no fused BackwardData ran with this reserve space since its forward"
    return got[2]


def backward_data(h, a, c: Core, plan, q, k, v, o, dout, dqueries, dkeys, dvalues, weights, reserve) -> Ran:
    import cupy
    from cudnn_compat._backend.engines.cudnn_engine import sdpa
    hh, p, pv = a.nHeads, a.qProjSize, a.vProjSize

    def work():
        with cupy.cuda.Device(h.device), _stream(h):
            wt = Weights(a, weights)
            r = _regions(a, c, reserve)
            dy = _seq(dout, o, a.o_size).reshape(c.b, c.tq, -1)
            if c.padding:
                rq, rk = _row_masks(h, c, q, k)
                dy = cupy.where(rq, dy, 0)
            dy = cupy.ascontiguousarray(dy).reshape(c.b * c.tq, -1)
            if wt.has_o():
                dh = _mm(dy, cupy.ascontiguousarray(wt.wo3().transpose(1, 0, 2)).reshape(-1, hh * pv))
            else:
                dh = dy
            dq_acc = cupy.zeros(c.b * hh * c.tq * p, cupy.float32)
            ssum = cupy.empty(c.b * hh * c.tq, cupy.float32)
            ptrs = {sdpa.Q: r["qp"].data.ptr, sdpa.K: r["kp"].data.ptr, sdpa.V: r["vp"].data.ptr,
                    sdpa.O: r["o"].data.ptr, sdpa.STATS: r["stats"].data.ptr, sdpa.DO: dh.data.ptr,
                    sdpa.DQ: r["dqp"].data.ptr, sdpa.DK: r["dkp"].data.ptr, sdpa.DV: r["dvp"].data.ptr,
                    sdpa.SSUM: ssum.data.ptr, sdpa.DQ_ACC: dq_acc.data.ptr}
            _sdpa_run(h, a, c, q, k, plan, ptrs)
            dqp, dkp, dvp = (r[n].reshape(c.b, -1, r[n].size // (c.b * (c.tq if n == "dqp" else c.tk)))
                             for n in ("dqp", "dkp", "dvp"))
            if c.padding:  # rows past the lengths: no gradient (the kernel leaves them unwritten)
                dqp[...] = cupy.where(rq, dqp, 0)
                dkp[...] = cupy.where(rk, dkp, 0)
                dvp[...] = cupy.where(rk, dvp, 0)
            for grad, buf, d, size, which in ((dqp, dqueries, q, a.qSize, "Q"), (dkp, dkeys, k, a.kSize, "K"),
                                              (dvp, dvalues, v, a.vSize, "V")):
                x = _mm(grad.reshape(-1, grad.shape[-1]), wt.w(which))
                _seq(buf, d, size)[...] = x.reshape(d.dimA[BATCH], d.dimA[BEAM], d.dimA[TIME], size)

    sig = _RESERVES[(h.device, bg.address(reserve))][0]
    _replayed(h, _call_key("bwd_data", (sig, id(plan)), (q, k, v, o), dout, dqueries, dkeys, dvalues, weights,
                           reserve), work)
    with _LOCK:
        _RESERVES[(h.device, bg.address(reserve))][1] = True
    return Ran("cudnn", f"sdpa bprop {plan.config}", workspace_size=plan.workspace)


def backward_weights(h, a, c: Core, q, k, v, o, queries, keys, values, dout, dweights, reserve, add: bool) -> Ran:
    import cupy
    hh, pv = a.nHeads, a.vProjSize

    def work():
        with cupy.cuda.Device(h.device), _stream(h):
            dw = Weights(a, dweights)
            r = _regions(a, c, reserve)

            def put(dst, val):
                if add:
                    dst += val.astype(dst.dtype)
                else:
                    dst[...] = val

            for which, grad, buf, d, size in (("Q", r["dqp"], queries, q, a.qSize), ("K", r["dkp"], keys, k, a.kSize),
                                              ("V", r["dvp"], values, v, a.vSize)):
                w = dw.w(which)
                g2 = grad.reshape(-1, w.shape[0])
                x2 = cupy.ascontiguousarray(_seq(buf, d, size)).reshape(-1, size)
                put(w, _mm(g2.T, x2))
                bias = dw.b(which)
                if bias is not None:
                    put(bias, _col_sum(g2))
            if dw.has_o():
                dy = _seq(dout, o, a.o_size).reshape(c.b, c.tq, -1)
                if c.padding:
                    dy = cupy.where(_row_masks(h, c, q, k)[0], dy, 0)
                dy = cupy.ascontiguousarray(dy).reshape(c.b * c.tq, -1)
                g = _mm(dy.T, r["o"].reshape(-1, hh * pv))  # [Po, H*Pv]
                put(dw.wo3(), g.reshape(-1, hh, pv).transpose(1, 0, 2))
                bias = dw.b("O")
                if bias is not None:
                    put(bias, _col_sum(dy))

    sig = _RESERVES[(h.device, bg.address(reserve))][0]
    _replayed(h, _call_key("bwd_weights", (sig, add), (q, k, v, o), queries, keys, values, dout, dweights, reserve),
              work)
    return Ran("cudnn", "sdpa weight gradients (cuBLAS)")
