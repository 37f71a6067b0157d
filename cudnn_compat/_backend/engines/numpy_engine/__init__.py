"""The ``numpy`` engine: the default on the CPU place (issue 25).  NumPy in the op's compute type,
as cuDNN computes (FLOAT compute: float32, also for HALF and BFLOAT16 data; DOUBLE: float64), never
through a float64 copy of float32 data; convolutions and matmuls on the BLAS NumPy links with its
threads; element-wise ops through ``out=``.  The ``reference`` engine (float64) stays the oracle
and the fallback: this engine declines a graph with a kind or attribute combination it has no
kernel for (``SUPPORTS``), and ``CUDNN_COMPAT_ENGINE=reference`` selects the reference.

Kernels follow the protocol of ``_kernels.py`` (``fn(op, ins, dt, out)``).  The plan:
- loads each external input once per compute dtype: a view of the caller's buffer when its
  storage dtype is the compute dtype (no copy), else a converted copy;
- gives a kernel ``out[role]`` = the caller's buffer for an external output of the compute
  dtype, and stores other results into the caller's buffer right after the op, unless a later op
  reads an external input or a virtual value that may share its memory (then a copy of the
  result is stored after the last op);
- runs an ``op -> virtual -> Pointwise IDENTITY (alpha) -> y`` pair (every legacy call's
  beta == 0 blend) as the first op writing y directly when alpha == 1 at run time;
- rounds virtual tensors to their dtype as the reference does, and stored results to the
  storage dtype.
"""
from __future__ import annotations

import numpy as np

from ... import dtypes
from ..base import REGISTRY, Engine, EngineConfig, ExecutionPlan
from ._kernels import KERNELS, SUPPORTS, kernel, supports  # noqa: F401

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
_WIDE = ("float64", "int32", "int64")  # data that float32 arithmetic would not hold exactly


def compute_dtype(op) -> np.dtype:
    """The op's arithmetic dtype: float64 for a DOUBLE (or int32-accumulating) compute type or
    float64/int32/int64 data, else float32 (FLOAT compute; HALF and BFLOAT16 data compute in it)."""
    ct = op.attrs.get("compute_type")
    if ct in ("float64", "int32"):
        return F64
    tensors = list(op.inputs.values()) + [t for t in op.outputs.values() if t.dtype == "float64"]
    if any(t.dtype in _WIDE and not t.is_by_value for t in tensors):
        return F64
    return F32


def _load(t, buf, dt):
    if t.is_by_value:  # a scalar of the compute dtype (alpha, beta, epsilon: the floats the legacy layer passes)
        return dt.type(buf) if type(buf) is float else np.asarray(buf, dtype=dt).reshape(())
    a = buf if isinstance(buf, np.ndarray) else np.asarray(buf)
    if a.shape != t.dims:
        a = a.reshape(t.dims)
    if a.dtype == dt:
        return a
    if t.dtype == "bfloat16":
        return dtypes.bf16_to_f32(a).astype(dt, copy=False)
    return a.astype(dt)


def _round_virtual(val, t):
    """A virtual tensor holds its dtype's precision, as on a GPU (and in the reference)."""
    if t.dtype == "float32":
        return val if val.dtype == F32 else val.astype(F32)
    if t.dtype == "float64":
        return val
    return dtypes.load(dtypes.to_storage(val, t.dtype), t.dtype)


def store(buf, val, name) -> None:
    """Write ``val`` (broadcast to the buffer) into the caller's buffer, rounding to its dtype."""
    with np.errstate(all="ignore"):
        if dtypes.is_float(name) and name != "bfloat16":
            np.copyto(buf, np.broadcast_to(val, buf.shape), casting="unsafe")
        elif name == "bfloat16":
            buf[...] = dtypes.f32_to_bf16(np.broadcast_to(val, buf.shape))
        else:
            dtypes.store(buf, val, name)


class _Step:
    __slots__ = ("op", "fn", "dt", "ins", "outs", "targets", "direct", "later_ext", "later_virt", "fuse", "skip_alpha")

    def __init__(self, op, dt):
        self.op, self.fn, self.dt = op, KERNELS[op.kind], dt
        self.ins = tuple(op.inputs.items())
        self.outs = tuple(op.outputs.items())
        self.targets = dict(self.outs)  # role -> tensor written (a copy with the fused blend's y when it applies)
        # uid -> the tensor's storage dtype is the compute dtype (a kernel may write the caller's buffer)
        self.direct = {t.uid: dtypes.DTYPES[t.dtype][0] == dt for _r, t in self.outs}
        self.later_ext = ()  # uids of external inputs (not by value) that later ops read
        self.later_virt = ()  # uids of tensors produced in the graph (virtual or not) that later ops read
        self.fuse = None  # (role, the IDENTITY step's output tensor) when this op may write it directly
        self.skip_alpha = False  # this step is an IDENTITY blend taken over by the previous step
        # (the alpha1 tensor uid, checked == 1 at run time)


def _identity_blend(op):
    return (op.kind == "Pointwise" and op.attrs.get("mode") == "IDENTITY" and set(op.inputs) <= {"x", "alpha1"}
            and ("alpha1" not in op.inputs or op.inputs["alpha1"].is_by_value))


class NumpyPlan(ExecutionPlan):
    __slots__ = ("steps", "ext_in")

    def __init__(self, graph, config):
        super().__init__(graph, config, workspace_size=0)
        self.ext_in = {t.uid: t for t in graph.external_inputs()}
        steps = [_Step(op, compute_dtype(op)) for op in graph.ops]
        readers = {}
        for op in graph.ops:
            for t in op.inputs.values():
                readers[t.uid] = readers.get(t.uid, 0) + 1
        later, later_virt = set(), set()
        for s in reversed(steps):
            s.later_ext, s.later_virt = tuple(later), tuple(later_virt)
            later |= {t.uid for t in s.op.inputs.values() if t.uid in self.ext_in and not t.is_by_value}
            later_virt |= {t.uid for t in s.op.inputs.values() if t.uid not in self.ext_in}
        for a, b in zip(steps, steps[1:]):
            v = b.op.inputs.get("x")
            if not _identity_blend(b.op) or v is None or not v.is_virtual or readers.get(v.uid) != 1:
                continue
            y = b.op.outputs["y"]
            role = next((r for r, t in a.outs if t.uid == v.uid), None)
            if (role is not None and not y.is_virtual and y.dims == v.dims
                    and dtypes.DTYPES[v.dtype][0] == a.dt and b.dt == a.dt):
                a.fuse = (role, y, b.op.inputs.get("alpha1"))
                a.direct[y.uid] = dtypes.DTYPES[y.dtype][0] == a.dt
                b.skip_alpha = True
        self.steps = steps

    def execute(self, pack, stream=None):
        data = pack.data
        ext_in = self.ext_in
        env = {}  # uid -> value of a virtual tensor or an output
        loaded = {}  # (uid, dtype) -> loaded external input
        pending = []  # (tensor, value) stored after every op ran
        with np.errstate(all="ignore"):
            skip_next = False
            for s in self.steps:
                if skip_next:
                    skip_next = False
                    continue
                dt = s.dt
                ins = {}
                for role, t in s.ins:
                    if t.uid in ext_in:
                        key = (t.uid, dt)
                        v = loaded.get(key)
                        if v is None:
                            v = loaded[key] = _load(t, data[t.uid], dt)
                    else:
                        v = env[t.uid]
                        if v.dtype != dt:
                            v = v.astype(dt)
                    ins[role] = v
                out = {}
                targets = s.targets
                if s.fuse is not None:
                    role, y, alpha = s.fuse
                    if alpha is None or _is_one(data[alpha.uid]):
                        targets = dict(targets)
                        targets[role] = y
                        skip_next = True
                later = s.later_ext or s.later_virt
                safe = {}  # external output uid -> no later read can see its buffer change
                for role, t in targets.items():
                    if not t.is_virtual:
                        buf = data[t.uid]
                        ok = isinstance(buf, np.ndarray) and (not later or _unread_later(buf, s, data, env))
                        safe[t.uid] = ok
                        if ok and s.direct[t.uid] and buf.flags.writeable and buf.shape == t.dims:
                            out[role] = buf
                res = s.fn(s.op, ins, dt, out)
                for role, t in targets.items():
                    val = res[role]
                    if t.is_virtual:
                        env[t.uid] = _round_virtual(np.asarray(val), t)
                        continue
                    env[t.uid] = val
                    if role in out and val is out[role]:
                        continue
                    if safe[t.uid]:
                        store(data[t.uid], val, t.dtype)
                    else:  # a later op reads memory this buffer shares: stored after the last op
                        pending.append((t, np.array(val)))
            for t, val in pending:
                store(data[t.uid], val, t.dtype)


def _is_one(v) -> bool:
    """A by-value alpha is 1 (a Python float, as the legacy layer passes it, or anything NumPy reads)."""
    return v == 1.0 if type(v) is float else float(np.asarray(v)) == 1.0


def _unread_later(buf, step, data, env) -> bool:
    """No op after ``step`` reads an external input or a produced value that may share ``buf``'s memory."""
    return not (any(np.may_share_memory(buf, data[u]) for u in step.later_ext)
                or any(u in env and np.may_share_memory(buf, env[u]) for u in step.later_virt))


class NumpyEngine(Engine):
    name = "numpy"
    places = ("cpu",)

    def configs(self, graph, place, mode):
        return [EngineConfig(self.name, notes=frozenset({"DETERMINISTIC"}), index=0)]

    def op_kinds(self) -> dict:
        from ...ops import OP_SPECS
        return {k: None if k in KERNELS else "no numpy kernel (the reference engine runs it)" for k in sorted(OP_SPECS)}

    def check_support(self, graph, place):
        if place != "cpu":
            return "runs on the CPU place only"
        missing = sorted({op.kind for op in graph.ops if op.kind not in KERNELS})
        if missing:
            return f"no numpy kernel for {', '.join(missing)}"
        for op in graph.ops:
            rule = SUPPORTS.get(op.kind)
            why = rule(op) if rule is not None else None
            if why:
                return f"{op.kind}: {why}"
        return None

    def build(self, graph, config):
        return NumpyPlan(graph, config)


REGISTRY.register(NumpyEngine(), priority={"cpu": 200})  # before the reference engine (cpu 100)

import importlib as _importlib  # noqa: E402
import pkgutil as _pkgutil  # noqa: E402

for _found in _pkgutil.iter_modules(__path__):  # every kernel module of the package registers its kinds
    if not _found.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_found.name}")
