"""Runnable steps of a cupy plan and the helpers heavy ops share (pure Python at build time;
CuPy is imported only when a step runs).

A ``KernelRun`` launches one generated kernel (the first variant whose 16-byte-aligned
pointers are aligned); a ``PyRun`` calls a function on CuPy arrays (cuBLAS GEMMs,
im2col).  ``temps`` are virtual tensors the step writes that later steps read: they are
allocated from CuPy's memory pool (on the plan's stream) before the step runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...ir import Operation, Tensor, packed_strides
from . import runtime
from .codegen import FusedGroup, group_kernels

COPY_SRC, COPY_DST = 10 ** 9 + 1, 10 ** 9 + 2  # uids of the copy kernel's own tensors


@dataclass
class KernelRun:
    variants: list  # KernelSpec, preferred first
    temps: list = field(default_factory=list)
    extra: "object | None" = None  # fn(env) -> dict of ("extra", ...) argument values

    def kernels(self) -> list:
        return list(self.variants)

    def run(self, env, ctx) -> None:
        for t in self.temps:
            if t.uid not in env:
                env[t.uid] = runtime.empty(t)
        extra = self.extra(env, ctx) if self.extra is not None else None
        for spec in self.variants:
            guard = getattr(spec, "guard", ())
            if guard:
                env = runtime.unalias(env, guard, spec.stored)
            if not spec.aligned or runtime.aligned(env, spec.aligned):
                runtime.launch(spec, env, extra)
                return
        raise RuntimeError("no kernel variant fits")  # pragma: no cover - the last has no alignment need


@dataclass
class PyRun:
    fn: object  # fn(env, ctx)
    sources: list = field(default_factory=list)  # KernelSpecs it may launch (for kernel_sources)
    pointers: bool = False  # fn takes the op's external tensors as device addresses (ints) too
    launcher: object = None  # launcher(order) -> the plan's launch(values, stream, ...), or None

    def kernels(self) -> list:
        return list(self.sources)

    def run(self, env, ctx) -> None:
        self.fn(env, ctx)

    def release(self) -> None:
        """Free what the function keeps (a ProgramRun's CUDA graphs) when the plan is released."""
        free = getattr(getattr(self.fn, "__self__", None), "release", None)
        if free is not None:
            free()


class ScratchRun:
    """Kernels launched in order with scratch buffers kept per (device, stream) and zeroed once
    (``scratch``: name -> (element count, NumPy dtype name)); a traceable run (records.py): its
    device work is exactly its launches.  ``launch_all`` is what runs once the temps, the unaliased
    inputs and the scratch are there (``rowops.BnRun`` picks a kernel variant there).  ``emulate``
    runs it on the CPU kernel emulator (tests)."""

    traceable = True

    def __init__(self, specs, scratch: dict, temps, guard=(), stored=()):
        self.specs, self.temps = list(specs), list(temps)
        self.scratch = self._buffers = dict(scratch)  # _buffers: what ``_extra`` allocates (a subclass may describe its scratch otherwise)
        self.guard, self.stored = tuple(guard), tuple(stored)
        self._bufs: dict = {}

    def kernels(self) -> list:
        return list(self.specs)

    def _extra(self) -> dict:
        cp = runtime.cupy()
        key = (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr)
        bufs = self._bufs.get(key)
        if bufs is None:
            bufs = self._bufs[key] = {k: cp.zeros(max(1, n), dtype=dt) for k, (n, dt) in self._buffers.items()}
        return bufs

    def run(self, env, ctx) -> None:
        for t in self.temps:
            if t.uid not in env:
                env[t.uid] = runtime.empty(t)
        if self.guard:
            env = runtime.unalias(env, self.guard, self.stored)
        self.launch_all(env, self._extra())

    def launch_all(self, env, extra) -> None:
        for spec in self.specs:
            runtime.launch(spec, env, extra)

    def emulate(self, env, emu, np) -> None:
        extra = {k: np.zeros(max(1, n) + 8, dtype=dt) for k, (n, dt) in self._buffers.items()}
        for spec in self.specs:
            emu.launch(spec, [extra[a[1]] if a[0] == "extra" else env[a[1]] for a in spec.args])


def group_run(group: FusedGroup) -> KernelRun:
    return KernelRun(group_kernels(group), [t for t in group.stores.values() if t.is_virtual])


def copy_kernels(dims, src_dtype: str, dst: Tensor) -> list:
    """Kernels copying a packed ``src_dtype`` array of ``dims`` into tensor ``dst`` (its strides,
    its dtype, rounded as a GPU stores)."""
    src = Tensor(COPY_SRC, tuple(dims), packed_strides(dims), src_dtype)
    out = Tensor(COPY_DST, dst.dims, dst.strides, dst.dtype)
    op = Operation("Pointwise", {"x": src}, {"y": out}, {"mode": "IDENTITY"})
    return group_kernels(FusedGroup([op], None, [], {COPY_SRC: src}, {COPY_DST: out}))


class Writer:
    """Stores a computed CuPy array into an op's output tensor: hands the array itself to
    later steps when the output is a packed virtual tensor of that dtype, else launches a
    generated copy kernel (strides, rounding to half/bfloat16/ints)."""

    def __init__(self, t: Tensor, compute: str):
        self.t, self.compute = t, compute
        self.direct = t.is_virtual and t.dtype == compute and t.strides == packed_strides(t.dims)
        self.kernels = [] if self.direct else copy_kernels(t.dims, compute, t)

    def __call__(self, env, values) -> None:
        if self.direct:
            env[self.t.uid] = values
            return
        if self.t.uid not in env:
            env[self.t.uid] = runtime.empty(self.t)
        cp = runtime.cupy()
        src = cp.ascontiguousarray(values)
        sub = {COPY_SRC: src, COPY_DST: env[self.t.uid]}
        for spec in self.kernels:
            if not spec.aligned or runtime.aligned(sub, spec.aligned):
                runtime.launch(spec, sub)
                return


def compute_of(*tensors) -> str:
    """float64 when a tensor is float64 or an integer type (exact int8 products), else float32."""
    return "float64" if any(t.dtype not in ("float32", "float16", "bfloat16") for t in tensors) else "float32"


def read(env, t: Tensor, compute: str):
    """A tensor's buffer as a CuPy array of the compute dtype (bfloat16 widened by a shift)."""
    cp = runtime.cupy()
    buf = env[t.uid]
    if t.dtype == "bfloat16":
        return (buf.astype(cp.uint32) << cp.uint32(16)).view(cp.float32).astype(compute, copy=False)
    return buf.astype(compute, copy=False)
