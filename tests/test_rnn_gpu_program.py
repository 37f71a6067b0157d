"""The cupy engine's RNN recurrence programs and Rng kernel, run on the CPU: every GEMM of a
program in NumPy from raw addresses (cuBLAS column-major semantics), every kernel through
kernel_emu (the CUDA source compiled as C++), against the reference engine's kernels on the same
op.  This checks the step sequencing, the scratch-state handling, the row maps of every layout
and each kernel's index math and arithmetic without a GPU; GPU behaviour itself is
test_rnn_gpu.py's.  The kernel sources also go through nvcc/NVRTC when one is installed."""
import ctypes
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import kernel_emu
from cudnn_compat._backend import dtypes
from cudnn_compat._backend.engines.cupy_engine import rnn as grnn
from cudnn_compat._backend.engines.reference import KERNELS
from cudnn_compat._backend.engines.reference.rnn import bernoulli_keep
from cudnn_compat._backend.ir import Operation, Tensor, packed_strides, scalar
from cudnn_compat._backend.ops import validate_op
from cudnn_compat._backend.ops.rnn import GATES, row_map, rows_of

pytestmark = pytest.mark.skipif(kernel_emu.available() is not None, reason=str(kernel_emu.available()))


# -- emulated execution -----------------------------------------------------------------------------

def _mat(ptr, dtype, rows, cols, ld):
    """Column-major rows x cols matrix at ``ptr`` (element (i, j) at i + j*ld), writable."""
    st = dtypes.storage_dtype(dtype)
    n = (cols - 1) * ld + rows
    arr = np.frombuffer((ctypes.c_char * (n * st.itemsize)).from_address(ptr), dtype=st, count=n)
    return np.lib.stride_tricks.as_strided(arr, (rows, cols), (st.itemsize, ld * st.itemsize))


def emu_gemm(gm, a, adt, b, bdt, c, cdt):
    isz = dtypes.itemsize
    for q in range(gm.batch):
        A = _mat(a + q * gm.sa * isz(adt), adt, gm.k if gm.transa else gm.m, gm.m if gm.transa else gm.k, gm.lda)
        B = _mat(b + q * gm.sb * isz(bdt), bdt, gm.n if gm.transb else gm.k, gm.k if gm.transb else gm.n, gm.ldb)
        C = _mat(c + q * gm.sc * isz(cdt), cdt, gm.m, gm.n, gm.ldc)
        opa = (A.T if gm.transa else A).astype(np.float64)
        opb = (B.T if gm.transb else B).astype(np.float64)
        res = opa @ opb
        if gm.beta:
            res = res + gm.beta * C.astype(np.float64)
        C[...] = res.astype(C.dtype)


def emulate(prog, views: dict, scalars: dict):
    """Run ``prog`` with role buffers ``views`` (strided NumPy views) and by-value ``scalars``."""
    keep = {}
    base = {role: v.__array_interface__["data"][0] for role, v in views.items()}
    for name, n in prog.scratch.items():  # scratch starts as garbage (NaN): reads before writes show
        arr = np.full(n, np.nan, dtypes.storage_dtype(prog.buffers[name]))
        keep[name] = arr
        base[name] = arr.ctypes.data
    for name, arr in prog.consts.items():
        keep[name] = np.ascontiguousarray(arr)
        base[name] = keep[name].ctypes.data

    def addr(buf, off):
        return base[buf] + off * dtypes.itemsize(prog.buffers[buf])
    for ins in prog.instrs:
        if isinstance(ins, grnn.Gemm):
            bt = prog.buffers
            emu_gemm(ins, addr(*ins.a), bt[ins.a[0]], addr(*ins.b), bt[ins.b[0]], addr(*ins.c), bt[ins.c[0]])
            continue
        if ins.skip_if_same and base[ins.skip_if_same[0]] == base[ins.skip_if_same[1]]:
            continue
        vals = []
        for a in ins.args:
            vals.append(addr(a[1], a[2]) if a[0] == "ref" else (a[1] if a[0] == "int" else float(scalars[a[1]])))
        launch(ins.spec, vals)


# -- every kernel the tests run, compiled as ONE C++ library (kernel_emu compiles one per kernel) -------

_BATCH: dict = {}


def _batch_library():
    if "lib" not in _BATCH:
        rng = np.random.default_rng(0)
        specs = {}
        for _, kind, kw, _ in PROGRAM_CASES:
            specs.update({sp.name: sp for sp in _program(Case(rng, kind, **kw)).kernels()})
        for args in RNG_CASES:
            specs.update({sp.name: sp for sp in grnn.rng_specs(rng_op(*args))})
        parts = [kernel_emu.SHIM]
        for i, sp in enumerate(specs.values()):
            wrap = kernel_emu._wrapper(sp).replace("cc_launch(", f"cc_launch_{sp.name}(")
            parts.append(f"namespace cc_ns{i} {{\n{sp.source}\n{wrap}\n}}\n")
        d = tempfile.mkdtemp(prefix="cc_rnn_emu_")
        cpp, so = f"{d}/k.cpp", f"{d}/k.so"
        with open(cpp, "w") as f:
            f.write("\n".join(parts))
        r = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-w", "-o", so, cpp, "-lpthread"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[:4000]
        _BATCH["lib"], _BATCH["names"] = ctypes.CDLL(so), set(specs)
    return _BATCH["lib"], _BATCH["names"]


def launch(spec, values):
    """kernel_emu.launch, from the batch library when the kernel is in it."""
    lib, names = _batch_library()
    if spec.name not in names:
        return kernel_emu.launch(spec, values)
    keep, ptrs = [], []
    for p, v in zip(spec.params, values):
        typ = p.rpartition(" ")[0].strip()
        if "*" in typ:
            ptrs.append(ctypes.c_void_p(v if isinstance(v, int) else v.__array_interface__["data"][0]))
        else:
            arr = np.array(v, dtype=kernel_emu.SCALAR[typ.replace("const ", "")])
            keep.append(arr)
            ptrs.append(ctypes.c_void_p(arr.ctypes.data))
    argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
    getattr(lib, f"cc_launch_{spec.name}")(argv, *[ctypes.c_uint(v) for v in spec.grid],
                                           *[ctypes.c_uint(v) for v in spec.block])


# -- ops ---------------------------------------------------------------------------------------------

SHAPES = {"gx": "gH", "acts": "gH", "dgates": "gH", "y": "Ho", "y_in": "Ho", "dy": "Ho", "dr": "Ho",
          "c_all": "H", "hpre": "H", "grn": "H", "dgrn": "H"}


class Case:
    """An op with host buffers: row tensors interleave their directions (as y does) with a gap."""

    def __init__(self, rng, kind, mode, D, layout, lengths, T, H, P=None, dtype="float64", train=True, clip=None,
                 states=True, fill=None, cdtype=None, project=None):
        self.rng, self.kind, self.mode = rng, kind, mode
        g = GATES[mode]
        Ho = P or H
        self.sizes = {"gH": g * H, "H": H, "Ho": Ho}
        B, N = len(lengths), rows_of(layout, T, lengths)
        self.N, self.B = N, B
        cdtype = cdtype or dtype
        self.bufs, self.views, self.tensors = {}, {}, {}
        self._uid = iter(range(1, 1000))
        fwd = kind == "RNNRecurrence"
        ins, outs = {}, {}
        ins["w_rec"] = self.tensor("w_rec", (D, g * H, Ho), dtype, gap=3)
        if P:
            ins["wr"] = self.tensor("wr", (D, Ho, H), dtype, gap=2)
        if fwd and project is not None:  # the x form: gx = x W_in^T + biases, computed by the op
            I = 5
            ins["x"] = self._alloc("x", (D, N, I), (0, I + 2, 1), dtype)  # one buffer for every direction
            ins["w_in"] = self.tensor("w_in", (D, g * H, I), dtype, gap=4)
            for role in project:
                ins[role] = self.tensor(role, (D, 1, g * H), dtype, gap=1)
            outs["gx"] = self.rows("gx", D, g * H, cdtype, interleave=False)
        elif fwd:
            ins["gx"] = self.rows("gx", D, g * H, cdtype, interleave=False)
        if fwd:
            if mode == "GRU":
                ins["b_rec"] = self.tensor("b_rec", (D, 1, H), dtype, gap=5)
            if states:
                ins["hx"] = self.tensor("hx", (D, B, Ho), dtype)
                if mode == "LSTM":
                    ins["cx"] = self.tensor("cx", (D, B, H), dtype)
            outs["y"] = self.rows("y", D, Ho, dtype)
            if layout != "PACKED" and any(n < T for n in lengths):
                if fill is not None:
                    ins["fill"] = scalar(next(self._uid), "float64", "fill")
                else:
                    ins["y_in"] = Tensor(next(self._uid), outs["y"].dims, outs["y"].strides, dtype, name="y_in")
                    self.views["y_in"] = self.views["y"]
            if states:
                outs["hy"] = self.tensor("hy", (D, B, Ho), dtype)
                if mode == "LSTM":
                    outs["cy"] = self.tensor("cy", (D, B, H), dtype)
            if train and mode == "LSTM":
                outs.update(acts=self.rows("acts", D, g * H, cdtype), c_all=self.rows("c_all", D, H, cdtype))
                if P:
                    outs["hpre"] = self.rows("hpre", D, H, cdtype)
            if train and mode == "GRU":
                outs.update(acts=self.rows("acts", D, g * H, cdtype), grn=self.rows("grn", D, H, cdtype))
        else:
            ins["dy"] = self.rows("dy", D, Ho, dtype)
            if mode != "LSTM":
                ins["y"] = self.rows("y", D, Ho, dtype)
            if mode in ("LSTM", "GRU"):
                ins["acts"] = self.rows("acts", D, g * H, cdtype, lo=0.05, hi=0.95)
            if mode == "LSTM":
                ins["c_all"] = self.rows("c_all", D, H, cdtype)
            if mode == "GRU":
                ins["grn"] = self.rows("grn", D, H, cdtype)
            if states:
                if mode == "GRU":
                    ins["hx"] = self.tensor("hx", (D, B, Ho), dtype)
                if mode == "LSTM":
                    ins["cx"] = self.tensor("cx", (D, B, H), dtype)
                    ins["dcy"] = self.tensor("dcy", (D, B, H), dtype)
                ins["dhy"] = self.tensor("dhy", (D, B, Ho), dtype)
            outs["dgates"] = self.rows("dgates", D, g * H, cdtype, interleave=False)
            if mode == "GRU":
                outs["dgrn"] = self.rows("dgrn", D, H, cdtype)
            if P:
                outs["dr"] = self.rows("dr", D, Ho, cdtype)
            if states:
                outs["dhx"] = self.tensor("dhx", (D, B, Ho), dtype)
                if mode == "LSTM":
                    outs["dcx"] = self.tensor("dcx", (D, B, H), dtype)
        if clip:
            ins["lclip"], ins["rclip"] = scalar(next(self._uid), "float64"), scalar(next(self._uid), "float64")
        self.scalars = {"fill": fill, "lclip": -0.4, "rclip": 0.45}
        attrs = {"mode": mode, "layout": layout, "T": T, "lengths": tuple(lengths),
                 "directions": tuple(d == 1 for d in range(D)), "clip": clip}
        self.op = Operation(kind, ins, outs, attrs)
        validate_op(0, self.op)
        self.inputs = set(ins)

    def _alloc(self, role, dims, strides, dtype, lo=-0.8, hi=0.8):
        span = 1 + sum((d - 1) * s for d, s in zip(dims, strides)) + 7
        st = dtypes.storage_dtype(dtype)
        buf = self.rng.uniform(lo, hi, span).astype(st)
        self.bufs[role] = buf
        self.views[role] = np.lib.stride_tricks.as_strided(buf, dims, tuple(s * st.itemsize for s in strides))
        t = Tensor(next(self._uid), dims, strides, dtype, name=role)
        self.tensors[role] = t
        return t

    def tensor(self, role, dims, dtype, gap=0):
        st = packed_strides(dims)
        return self._alloc(role, dims, (st[0] + gap,) + st[1:], dtype)

    def rows(self, role, D, W, dtype, interleave=True, **kw):
        N = self.N
        strides = (W, D * W + 1, 1) if interleave else (N * W + 9, W, 1)
        return self._alloc(role, (D, N, W), strides, dtype, **kw)

    def reference(self):
        ins = {}
        for role, t in self.op.inputs.items():
            ins[role] = np.float64(self.scalars[role]) if t.is_by_value else dtypes.load(self.views[role], t.dtype).copy()
        return KERNELS[self.kind](self.op, ins)

    def emulated(self):
        prog = grnn.forward_program(self.op) if self.kind == "RNNRecurrence" else grnn.backward_program(self.op)
        emulate(prog, self.views, self.scalars)
        return {role: dtypes.load(self.views[role], t.dtype).copy() for role, t in self.op.outputs.items()}


def valid_rows(layout, T, lengths):
    base, bs = row_map(layout, T, lengths)
    return np.array(sorted(base[t] + b * bs for b, n in enumerate(lengths) for t in range(n)), int)


def compare(case, tol):
    want = case.reference()
    got = case.emulated()
    a = case.op.attrs
    rows = valid_rows(a["layout"], a["T"], a["lengths"])
    for role, w in want.items():
        g_ = got[role]
        if role in ("acts", "c_all", "hpre", "grn", "dgrn", "dr"):  # padding rows unspecified
            w, g_ = w[:, rows], g_[:, rows]
        np.testing.assert_allclose(g_, w, rtol=tol, atol=tol, err_msg=f"{case.kind} {case.mode} {role}")


CASES = [  # mode, D, layout, lengths, T, P, clip
    ("LSTM", 2, "SEQ", (3, 4, 1, 4), 4, None, None),
    ("LSTM", 1, "PACKED", (4, 3, 3, 1), 4, 2, "NOT_PROPAGATE"),
    ("LSTM", 2, "BATCH", (2, 4, 4, 0), 4, None, "PROPAGATE"),
    ("GRU", 2, "SEQ", (3, 4, 1, 4), 4, None, None),
    ("GRU", 1, "BATCH", (2, 3), 3, None, None),
    ("TANH", 2, "PACKED", (3, 2, 2), 3, None, None),
    ("RELU", 1, "SEQ", (2, 3, 3), 3, None, None),
]
KINDS = ("RNNRecurrence", "RNNRecurrenceBackward")
# (id, kind, Case keyword arguments, tolerance)
PROGRAM_CASES = [
    (f"{kind[3:]}-{mode}-{D}-{layout}{'-P' if P else ''}{'-' + clip if clip else ''}", kind,
     dict(mode=mode, D=D, layout=layout, lengths=lengths, T=T, H=3, P=P, clip=clip, states=layout != "BATCH",
          fill=0.25 if (layout == "SEQ" and kind == "RNNRecurrence") else None), 1e-12)
    for mode, D, layout, lengths, T, P, clip in CASES for kind in KINDS]
PROGRAM_CASES += [
    (f"{kind[3:]}-{dtype}", kind, dict(mode="LSTM", D=2, layout="SEQ", lengths=(3, 3, 2), T=3, H=4, dtype=dtype,
                                       cdtype="float32"), tol)
    for dtype, tol in (("float32", 2e-5), ("float16", 3e-2)) for kind in KINDS]
PROGRAM_CASES += [  # the x form (the input projection inside the op): one bias kernel and one GEMM first
    (f"x-form-{mode}-{D}-{layout}-{'+'.join(project) or 'nobias'}-{dtype}", "RNNRecurrence",
     dict(mode=mode, D=D, layout=layout, lengths=lengths, T=T, H=3, dtype=dtype, cdtype="float32" if dtype != "float64"
          else None, project=project, fill=0.25 if layout == "SEQ" else None), tol)
    for mode, D, layout, lengths, T, project, dtype, tol in (
        ("LSTM", 2, "SEQ", (3, 4, 1, 4), 4, ("b_x", "b_h"), "float64", 1e-12),
        ("GRU", 2, "BATCH", (2, 4, 4, 1), 4, ("b_x", "b_h"), "float64", 1e-12),
        ("GRU", 1, "PACKED", (3, 2), 3, ("b_h",), "float64", 1e-12),
        ("TANH", 2, "PACKED", (3, 2, 2), 3, ("b_x",), "float64", 1e-12),
        ("RELU", 1, "SEQ", (2, 3, 3), 3, (), "float64", 1e-12),
        ("LSTM", 2, "SEQ", (3, 3, 2), 3, ("b_x", "b_h"), "float16", 3e-2))]
PROGRAM_CASES.append(("inference-GRU-no-states", "RNNRecurrence",
                      dict(mode="GRU", D=2, layout="PACKED", lengths=(3, 1), T=3, H=2, train=False, states=False), 1e-12))


def _program(case):
    return grnn.forward_program(case.op) if case.kind == "RNNRecurrence" else grnn.backward_program(case.op)


@pytest.mark.parametrize("kind, kw, tol", [c[1:] for c in PROGRAM_CASES], ids=[c[0] for c in PROGRAM_CASES])
def test_program_matches_reference(rng, kind, kw, tol):
    compare(Case(rng, kind, **kw), tol)


def test_program_size_is_one_gemm_and_one_kernel_per_step(rng):
    """T=100 bidirectional LSTM layer: 100 batched GEMMs and 100 cell launches (+ state copies)."""
    case = Case(rng, "RNNRecurrence", "LSTM", 2, "SEQ", (100,) * 2, 100, H=2)
    prog = grnn.forward_program(case.op)
    gemms = [i for i in prog.instrs if isinstance(i, grnn.Gemm)]
    launches = [i for i in prog.instrs if isinstance(i, grnn.Launch)]
    assert len(gemms) == 100 and all(g.batch == 2 for g in gemms)
    assert len(launches) == 100 + 4  # cell per step; hx, cx in; hy, cy out


# -- Rng ----------------------------------------------------------------------------------------------

# (3, 700): 525 Philox blocks, 3 thread blocks: the offset advance is the last of them to finish
RNG_CASES = [("uint8", (3, 7), None, 0.3, 0), ("float32", (2, 3, 5), (40, 1, 3), 0.5, 7),
             ("float16", (9,), None, 1.0, 0), ("uint8", (5,), None, 0.0, 2), ("uint8", (3, 700), None, 0.4, 0)]


def _rng_args(spec, bufs: dict, scale=None) -> list:
    """The launch values of an Rng kernel: ``bufs`` by uid (4 is ``offset_out``), the ticket counter
    as ``bufs["cnt"]``, a by-value ``scale``."""
    return [bufs[a[1]] if a[0] in ("buf", "extra") else scale for a in spec.args]


def rng_op(dtype, dims, strides, p, block_offset):
    y = Tensor(3, dims, strides or packed_strides(dims), dtype)
    return Operation("Rng", {"seed": Tensor(1, (2,), (1,), "int32"), "offset": Tensor(2, (2,), (1,), "int32")},
                     {"y": y, "offset_out": Tensor(4, (2,), (1,), "int32")},
                     {"distribution": "BERNOULLI", "drop_probability": p, "block_offset": block_offset})


@pytest.mark.parametrize("dtype, dims, strides, p, block_offset", RNG_CASES)
def test_rng_kernel_bit_identical_to_reference(dtype, dims, strides, p, block_offset):
    op = rng_op(dtype, dims, strides, p, block_offset)
    validate_op(0, op)
    y = op.outputs["y"]
    seed_words = np.array([0x7fff1234, -5], np.int32)
    off_words = np.array([-3, 1], np.int32)  # offset lo word 0xfffffffd: the block counter carries into hi
    specs = grnn.rng_specs(op)
    assert len(specs) == 1 and specs[0].grid[0] == -(-int(np.prod(dims)) // (4 * grnn.BLOCK))
    st = dtypes.storage_dtype(dtype)
    span = 1 + sum((d - 1) * s for d, s in zip(dims, y.strides))
    buf = np.full(span, 7, st)
    offset = off_words.copy()
    cnt = np.zeros(1, np.uint32)
    view = np.lib.stride_tricks.as_strided(buf, dims, tuple(s * st.itemsize for s in y.strides))
    seed = int(seed_words.view(np.uint32)[0]) | (int(seed_words.view(np.uint32)[1]) << 32)
    base = int(off_words.view(np.uint32)[0]) | (int(off_words.view(np.uint32)[1]) << 32)
    n = int(np.prod(dims))
    for call in range(2):  # the second launch draws from where the first left the offset (and the counter)
        launch(specs[0], _rng_args(specs[0], {1: seed_words, 2: offset, 3: buf, 4: offset, "cnt": cnt}))  # offset_out aliases offset, as dropout binds it
        want = bernoulli_keep(seed, base + call * -(-n // 4) + block_offset, n, p).reshape(dims)
        np.testing.assert_array_equal(view.astype(np.float64), want.astype(np.float64))
        adv = (base + (call + 1) * -(-n // 4)) % (1 << 64)
        assert int(offset.view(np.uint32)[0]) | (int(offset.view(np.uint32)[1]) << 32) == adv
        assert cnt[0] == 0  # the last block set its ticket counter back


# dropout's graph (cudnn_compat/dropout.py): Rng, then y = (x * scale) * mask; the cupy engine runs both in the Rng kernel (the mask
# still stored): x of another layout than the mask, fp16 data in place or not, a uint8 or float mask
APPLY_CASES = [("float32", "uint8", (2, 3, 5), (1, 2, 6), 0.3, False), ("float16", "uint8", (4, 9), None, 0.5, True),
               ("float32", "float32", (7,), None, 0.0, False), ("float16", "float16", (3, 5), (1, 3), 1.0, False)]


@pytest.mark.parametrize("dtype, mask_dtype, dims, x_strides, p, in_place", APPLY_CASES)
def test_rng_applies_its_epilogue_in_one_kernel(dtype, mask_dtype, dims, x_strides, p, in_place):
    from cudnn_compat._backend.engines.cupy_engine.grouping import HeavyStep, partition
    from cudnn_compat._backend.ir import OperationGraph
    mask = Tensor(3, dims, packed_strides(dims), mask_dtype)
    x = Tensor(5, dims, x_strides or packed_strides(dims), dtype)
    y = Tensor(6, dims, x.strides, dtype)  # in place: another tensor bound to x's memory, as dropout's x == y
    scale = scalar(7, "float32", "scale")
    rng = Operation("Rng", {"seed": Tensor(1, (2,), (1,), "int32"), "offset": Tensor(2, (2,), (1,), "int32")},
                    {"y": mask, "offset_out": Tensor(4, (2,), (1,), "int32")},
                    {"distribution": "BERNOULLI", "drop_probability": p})
    ops = [rng, Operation("Pointwise", {"x": x, "b": mask, "alpha1": scale}, {"y": y}, {"mode": "MUL"})]
    steps = partition(OperationGraph(ops, "DropoutForward"))
    assert len(steps) == 1 and isinstance(steps[0], HeavyStep) and set(steps[0].epilogues) == {"y"}
    specs = grnn.rng_specs(rng, steps[0].epilogues["y"])
    assert len(specs) == 1 and specs[0].family == "rngapply"  # mask, y and the offset advance in one kernel
    st, mst = dtypes.storage_dtype(dtype), dtypes.storage_dtype(mask_dtype)
    n = int(np.prod(dims))
    span = 1 + sum((d - 1) * s for d, s in zip(dims, x.strides))
    g = np.random.default_rng(3)
    xbuf = g.standard_normal(span).astype(np.float32).astype(st)
    x_in = xbuf.copy()
    ybuf = xbuf if in_place else np.full(span, 9, st)
    mbuf = np.full(n, 5, mst)
    seed_words, offset = np.array([99, 0], np.int32), np.array([11, 0], np.int32)
    bufs = {1: seed_words, 2: offset, 3: mbuf, 5: xbuf, 6: ybuf}
    bufs.update({4: offset, "cnt": np.zeros(1, np.uint32)})
    launch(specs[0], _rng_args(specs[0], bufs, 1.25))
    keep = bernoulli_keep(99, 11, n, p).reshape(dims)
    np.testing.assert_array_equal(mbuf.reshape(dims).astype(np.float64), keep.astype(np.float64))
    view = lambda b: np.lib.stride_tricks.as_strided(b, dims, tuple(s * st.itemsize for s in x.strides))  # noqa: E731
    want = ((view(x_in).astype(np.float32) * np.float32(1.25)) * keep.astype(np.float32)).astype(st)
    np.testing.assert_array_equal(view(ybuf), want)
    assert int(offset[0]) == 11 + -(-n // 4)


# -- the sources compile for the GPU ---------------------------------------------------------------------

def _all_sources(rng):
    out = {}
    for _, kind, kw, _ in PROGRAM_CASES:
        for dtype in ("float64", "float32", "float16"):
            kw = dict(kw, dtype=dtype, cdtype="float32" if dtype == "float16" else dtype)
            out.update({sp.name: sp.source for sp in _program(Case(rng, kind, **kw)).kernels()})
    for args in RNG_CASES:
        out.update({sp.name: sp.source for sp in grnn.rng_specs(rng_op(*args))})
    return out


def test_sources_compile_for_sm90(rng, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    srcs = _all_sources(rng)
    from cudnn_compat._backend.engines.cupy_engine.codegen import PREAMBLE
    body = PREAMBLE + "\n".join(f"namespace k{i} {{\n{s[len(PREAMBLE):]}\n}}" for i, s in enumerate(srcs.values()))
    path = tmp_path / "rnn_kernels.cu"
    path.write_text(body)
    r = subprocess.run([nvcc, "-arch=sm_90", "-c", "-o", str(tmp_path / "k.o"), str(path)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[:4000]
