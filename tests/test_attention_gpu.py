"""Multi-head attention on the GPU place (issue 18 item 1; 002 §7.2.35 cudnnMultiHeadAttnForward,
§8.2.15 BackwardData, §8.2.16 BackwardWeights): the three calls run on the ``cupy`` engine, never
on the CPU reference engine (``CUDNN_COMPAT_CPU_FALLBACK=0`` turns a fallback into
NOT_SUPPORTED, and the engine that ran is asserted), against the reference engine on a CPU
handle with the same descriptors and data.

The defect (KeyError 19/32/37 at launch): a heavy step's epilogue (softmax * mask, the
smScaler-scaled softmax gradient) stored a virtual tensor that later steps read, and no run
allocated it.  ``test_every_buffer_a_kernel_reads_exists`` checks, for the attention graphs and
for every heavy kind with an epilogue, that each buffer a kernel takes is external or allocated
by an earlier or the same run; the emulated tests (``host_emu``: GPU place, kernels on the CPU
kernel emulator, cuBLAS replaced by NumPy) run the three calls end to end on the CPU.

``gpu`` tests: projections on/off, biases, beams (one-to-one and all-to-one), windows
(loWinIdx/hiWinIdx, empty windows), padded sequence lengths (including 0), residuals, every
layout of the sequence-data axes, currIdx inference steps, WGRAD ADD, HALF (TENSOR_OP_MATH and
DEFAULT_MATH), FLOAT and DOUBLE."""
import itertools
import sys

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat import attention as attn_mod
from cudnn_compat._backend.engines.base import EngineConfig
from cudnn_compat._backend.engines.cupy_engine import ENGINE, gemm
from cudnn_compat._backend.engines.cupy_engine.steps import COPY_DST, COPY_SRC, PyRun
from cudnn_compat.enums import name_of
from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides, virtual
from test_attention import B, BEAM, F16, F32, F64, NP, T, V, Setup

LAYOUTS = [tuple(p) + (V,) for p in itertools.permutations((T, B, BEAM))]

# name -> Setup keyword arguments (sizes qSize, kSize, vSize; proj qProj, kProj, vProj, oProj)
CONFIGS = {
    "all_projections_biases": dict(),
    "projections_no_biases": dict(biases=False),
    "no_projections": dict(nh=2, sizes=(4, 4, 2), proj=(0, 0, 0, 0), biases=False, axes=(T, B, BEAM, V)),
    "qk_projections_only": dict(nh=2, sizes=(4, 3, 3), proj=(2, 2, 0, 0), axes=(BEAM, B, T, V)),
    "kv_only_o_proj": dict(nh=3, sizes=(2, 2, 3), proj=(0, 0, 2, 2), axes=(BEAM, T, B, V)),
    "beam_one_to_one_padded": dict(nbeam=2, one_to_one=True, axes=(B, T, BEAM, V), len_q=[[3, 2], [1, 3]],
                                   len_k=[[4, 2], [3, 1]]),
    "beam_all_to_one_padded": dict(nbeam=2, axes=(T, BEAM, B, V), len_q=[[2, 3], [3, 0]], len_k=[[3], [4]]),
    "windows": dict(tq=4, tk=5, lo=[0, 1, 3, 2], hi=[2, 4, 3, 5], len_k=[5, 3]),
    "residual": dict(sizes=(6, 3, 5), proj=(3, 3, 2, 6)),
    "longer_rows": dict(nh=2, tq=9, tk=37, sizes=(8, 8, 8), proj=(4, 4, 4, 8), len_q=[9, 5], len_k=[37, 20]),
}


def _tol(dtype, want):
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    rel = {F64: 1e-9, F32: 5e-3, F16: 3e-2}[dtype]  # FLOAT: DEFAULT_MATH permits TF32 (math_policy)
    return dict(rtol=rel, atol=rel * max(scale, 1.0))


def run_all(h, s, dev, host, residual=False, add=False, dout=None):
    """Training forward, BackwardData and BackwardWeights (SET, or ADD onto a prior) on handle ``h``;
    ``dev``/``host`` move NumPy arrays to the handle's place and back.  Returns the results as
    NumPy arrays and the engine each call ran on."""
    npt = NP[s.dtype]
    rng = np.random.default_rng(7)
    dout = rng.standard_normal(int(np.prod(s.out_shape))).astype(npt) if dout is None else dout
    prior = (rng.standard_normal(s.wbuf.size) * 0.1).astype(npt)
    d = {n: dev(s.bufs[n]) for n in s.bufs}
    w, res, dd = dev(s.wbuf), dev(np.zeros(s.rsize, np.uint8)), dev(dout)
    out = dev(np.zeros(int(np.prod(s.out_shape)), npt))
    engines = []
    cc.cudnnMultiHeadAttnForward(h, s.attn, -1, s.lo, s.hi, None, None, s.qd, d["q"], d["r"] if residual else None,
                                 s.kd, d["k"], s.vd, d["v"], s.od, out, s.wsize, w, 0, None, s.rsize, res)
    engines.append(cc._core.call.last_plan().engine)
    g = {n: dev(np.zeros(s.bufs[n].size, npt)) for n in "qkv"}
    cc.cudnnMultiHeadAttnBackwardData(h, s.attn, s.lo, s.hi, None, None, s.od, dd, s.qd, g["q"], d["q"], s.kd, g["k"],
                                      d["k"], s.vd, g["v"], d["v"], s.wsize, w, 0, None, s.rsize, res)
    engines.append(cc._core.call.last_plan().engine)
    dw = dev(prior if add else np.zeros_like(s.wbuf))
    cc.cudnnMultiHeadAttnBackwardWeights(h, s.attn, cc.CUDNN_WGRAD_MODE_ADD if add else cc.CUDNN_WGRAD_MODE_SET,
                                         s.qd, d["q"], s.kd, d["k"], s.vd, d["v"], s.od, dd, s.wsize, w, dw, 0, None,
                                         s.rsize, res)
    if s.wsize:  # no projections: nothing is trainable and no graph runs
        engines.append(cc._core.call.last_plan().engine)
    result = {"out": host(out), "dq": host(g["q"]), "dk": host(g["k"]), "dv": host(g["v"]), "dw": host(dw)}
    return result, engines


def compare(got, want, dtype):
    for name in want:
        np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64),
                                   err_msg=name, **_tol(dtype, want[name].astype(np.float64)))


# -- CPU: every buffer a kernel launch reads exists (the KeyError class) -------------------------------

def _graphs_of_calls(dtype=F32, math=cc.CUDNN_DEFAULT_MATH, **kw):
    """The graphs of the three calls (as a CPU handle builds them) for one configuration."""
    h = cc.cudnnCreate("cpu")
    s = Setup(h, np.random.default_rng(0), dtype=dtype, math=math, **kw)
    graphs = []
    res = np.zeros(s.rsize, np.uint8)
    s.forward(reserve=res)
    graphs.append(cc._core.call.last_plan().graph)
    npt = NP[dtype]
    dout = np.ones(int(np.prod(s.out_shape)), npt)
    g = [np.zeros(s.bufs[n].size, npt) for n in "qkv"]
    cc.cudnnMultiHeadAttnBackwardData(h, s.attn, s.lo, s.hi, None, None, s.od, dout, s.qd, g[0], s.bufs["q"], s.kd, g[1],
                                      s.bufs["k"], s.vd, g[2], s.bufs["v"], s.wsize, s.wbuf, 0, None, s.rsize, res)
    graphs.append(cc._core.call.last_plan().graph)
    if s.wsize:
        cc.cudnnMultiHeadAttnBackwardWeights(h, s.attn, cc.CUDNN_WGRAD_MODE_SET, s.qd, s.bufs["q"], s.kd, s.bufs["k"],
                                             s.vd, s.bufs["v"], s.od, dout, s.wsize, s.wbuf, np.zeros_like(s.wbuf),
                                             0, None, s.rsize, res)
        graphs.append(cc._core.call.last_plan().graph)
    cc.cudnnDestroy(h)
    return graphs


def _missing_buffers(graph) -> list:
    """(run index, uid) of every kernel buffer argument that no earlier or current run provides."""
    runs = ENGINE.build(graph, EngineConfig("cupy")).runs
    have = {t.uid for t in list(graph.external_inputs()) + list(graph.external_outputs())}
    have |= {COPY_SRC, COPY_DST}
    missing = []
    for i, r in enumerate(runs):
        have |= {t.uid for t in getattr(r, "temps", ())}
        if isinstance(r, PyRun):  # a GEMM: its Writer puts the product's uid in env
            have |= {t.uid for op in graph.ops if op.kind in ("Matmul",) for t in op.outputs.values()}
            continue
        for spec in r.kernels():
            missing += [(i, a[1]) for a in spec.args if a[0] == "buf" and a[1] not in have]
    return missing


def _heavy_with_virtual_epilogue(kind):
    """``kind`` -> MUL by a mask (the epilogue, a virtual result) -> a Reduction reading it: the
    attention pattern (softmax * M read by the next GEMM) for each heavy kind with epilogues."""
    shape = (2, 3, 5, 6)
    x, m, y = Tensor(1, shape, packed_strides(shape), "float32"), Tensor(2, shape, packed_strides(shape), "float32"), \
        Tensor(3, (2, 3, 1, 1), packed_strides((2, 3, 1, 1)), "float32")
    t1, t2 = virtual(10, shape), virtual(11, shape)
    if kind == "Softmax":
        heavy = Operation("Softmax", {"x": x}, {"y": t1}, {"algorithm": "ACCURATE", "axes": (3,)})
    elif kind == "SoftmaxBackward":
        heavy = Operation("SoftmaxBackward", {"y": x, "dy": m}, {"dx": t1}, {"algorithm": "ACCURATE", "axes": (3,)})
    else:
        xin = Tensor(4, (2, 3, 10, 12), packed_strides((2, 3, 10, 12)), "float32")
        heavy = Operation("ResampleForward", {"x": xin}, {"y": t1},
                          {"mode": "MAXPOOL", "window": (2, 2), "stride": (2, 2), "pre_padding": (0, 0),
                           "post_padding": (0, 0), "nan_propagation": "PROPAGATE"})
    ops = [heavy, Operation("Pointwise", {"x": t1, "b": m}, {"y": t2}, {"mode": "MUL"}),
           Operation("Reduction", {"x": t2}, {"y": y}, {"mode": "ADD"})]
    return OperationGraph(ops, kind).finalize()


@pytest.mark.parametrize("kind", ["Softmax", "SoftmaxBackward", "ResampleForward"])
def test_heavy_epilogue_results_read_later_are_allocated(kind):
    g = _heavy_with_virtual_epilogue(kind)
    assert _missing_buffers(g) == []


@pytest.mark.parametrize("name", ["all_projections_biases", "no_projections", "beam_one_to_one_padded", "residual"])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_every_buffer_a_kernel_reads_exists(name, dtype):
    math = cc.CUDNN_TENSOR_OP_MATH if dtype == F16 else cc.CUDNN_DEFAULT_MATH
    for graph in _graphs_of_calls(dtype, math, **CONFIGS[name]):
        assert _missing_buffers(graph) == [], graph.name


@pytest.mark.parametrize("math, direct", [(cc.CUDNN_TENSOR_OP_MATH, True), (cc.CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, True),
                                          (cc.CUDNN_DEFAULT_MATH, False)])
def test_half_gemms_take_the_tensor_core_path_under_tensor_op_math(math, direct):
    """Every Matmul of the three graphs carries the descriptor's math type; with HALF data its
    operands and product are fp16, so under TENSOR_OP_MATH cuBLAS runs fp16 tensor-core GEMMs
    (gemm.half_direct), under DEFAULT_MATH the widened FP32 path (math_policy)."""
    name = name_of("cudnnMathType_t", math)[len("CUDNN_"):]
    graphs = _graphs_of_calls(F16, math, **CONFIGS["residual"])
    assert len(graphs) == 3
    for g in graphs:
        mms = [op for op in g.ops if op.kind == "Matmul"]
        assert mms, g.name
        for op in mms:
            assert op.attrs["math_type"] == name
            assert all(t.dtype == "float16" for t in (op.inputs["a"], op.inputs["b"], op.outputs["c"])), g.name
            assert gemm.half_direct(op) is direct


def test_float_gemms_carry_the_math_type():
    for g in _graphs_of_calls(F32, cc.CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION):
        assert {op.attrs.get("math_type") for op in g.ops if op.kind == "Matmul"} == {"TENSOR_OP_MATH_ALLOW_CONVERSION"}
        assert all(op.outputs["c"].dtype == "float32" for op in g.ops if op.kind == "Matmul")


# -- CPU: the three calls on the emulated GPU place ------------------------------------------------------

@pytest.fixture
def emu(monkeypatch):
    import host_emu
    import kernel_emu
    why = kernel_emu.available()
    if why:
        pytest.skip(why)
    e = host_emu.Emu("emulate")
    mod = sys.modules["cupy"]

    class _Meta(type):  # cupy.ndarray as the legacy layer's general binding path uses it
        def __instancecheck__(cls, obj):
            return isinstance(obj, host_emu.EmuArray)

        def __call__(cls, shape, dtype=None, memptr=None, strides=None):
            return host_emu._ndarray(shape, dtype, memptr, strides)

    monkeypatch.setattr(mod, "asarray", lambda a: host_emu.EmuArray(np.ascontiguousarray(a)), raising=False)
    monkeypatch.setattr(mod, "ndarray", _Meta("ndarray", (), {}), raising=False)
    monkeypatch.setattr(mod, "cuda", host_emu.runtime.cupy().cuda, raising=False)

    def matmul(a, b, compute):  # cuBLAS stand-in: fp32 (or fp64) accumulation, the operands' type out
        acc = np.float64 if a.dtype == np.float64 else np.float32
        return np.ascontiguousarray(np.matmul(a.astype(acc), b.astype(acc)).astype(a.dtype))  # packed, as cuBLAS's C

    monkeypatch.setattr(gemm, "matmul", matmul)
    monkeypatch.setenv("CUDNN_COMPAT_CPU_FALLBACK", "0")
    attn_mod._MASKS.clear()
    try:
        yield e
    finally:
        attn_mod._MASKS.clear()  # device masks of the emulated place must not outlive it
        e.restore()


@pytest.mark.parametrize("name, dtype, math", [("beam_all_to_one_padded", F16, cc.CUDNN_TENSOR_OP_MATH)])
def test_three_calls_on_the_emulated_gpu_place(emu, name, dtype, math, monkeypatch):
    import host_emu
    cpu = cc.cudnnCreate("cpu")
    kw = dict(CONFIGS[name])
    with monkeypatch.context() as m:  # the oracle: the reference engine (the CPU place's default is numpy)
        m.setenv("CUDNN_COMPAT_ENGINE", "reference")
        want, engines = run_all(cpu, Setup(cpu, np.random.default_rng(3), dtype=dtype, math=math, **kw),
                                lambda x: x.copy(), lambda x: x)
    assert engines == ["reference"] * 3
    s = Setup(cpu, np.random.default_rng(3), dtype=dtype, math=math, **kw)
    got, engines = run_all(emu.handle(), s, lambda x: host_emu.EmuArray(x.copy()), lambda x: x.host)
    assert engines == ["cupy"] * 3
    compare(got, want, dtype)
    cc.cudnnDestroy(cpu)


# -- GPU -------------------------------------------------------------------------------------------------

@pytest.fixture
def gpu(monkeypatch):
    cupy = pytest.importorskip("cupy")
    monkeypatch.setenv("CUDNN_COMPAT_CPU_FALLBACK", "0")
    h = cc.cudnnCreate("gpu")
    yield h, cupy
    cc.cudnnDestroy(h)


def _gpu_vs_reference(gpu, dtype, math, residual=False, add=False, **kw):
    h, cupy = gpu
    cpu = cc.cudnnCreate("cpu")
    s = Setup(cpu, np.random.default_rng(11), dtype=dtype, math=math, **kw)
    want, engines = run_all(cpu, s, lambda x: x.copy(), lambda x: x, residual=residual, add=add)
    got, engines = run_all(h, s, cupy.asarray, lambda x: x.get(), residual=residual, add=add)
    assert set(engines) == {"cupy"}, engines
    compare(got, want, dtype)
    cc.cudnnDestroy(cpu)


DTYPES = [(F32, cc.CUDNN_DEFAULT_MATH), (F16, cc.CUDNN_TENSOR_OP_MATH)]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype, math", DTYPES, ids=["float", "half_tensor_op"])
def test_gpu_configs(gpu, name, dtype, math):
    _gpu_vs_reference(gpu, dtype, math, residual=name == "residual", add=name == "windows", **CONFIGS[name])


@pytest.mark.gpu
@pytest.mark.parametrize("axes", LAYOUTS, ids=lambda a: "".join("TBMV"[i] for i in a))
@pytest.mark.parametrize("one_to_one", [False, True])
def test_gpu_every_layout(gpu, axes, one_to_one):
    _gpu_vs_reference(gpu, F32, cc.CUDNN_DEFAULT_MATH, nbeam=2, one_to_one=one_to_one, axes=axes,
                      len_q=[[3, 1], [2, 3]], len_k=[[4, 2], [1, 3]] if one_to_one else [[4], [2]])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, math", [(F64, cc.CUDNN_DEFAULT_MATH), (F16, cc.CUDNN_DEFAULT_MATH),
                                         (F16, cc.CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION),
                                         (F32, cc.CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)])
def test_gpu_other_types_and_math(gpu, dtype, math):
    _gpu_vs_reference(gpu, dtype, math, residual=True, **CONFIGS["residual"])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, math", DTYPES, ids=["float", "half_tensor_op"])
def test_gpu_inference_steps(gpu, dtype, math):
    """currIdx >= 0 (one query step, inference) and currIdx = -1 without a reserve space."""
    h, cupy = gpu
    cpu = cc.cudnnCreate("cpu")
    s = Setup(cpu, np.random.default_rng(5), dtype=dtype, math=math, **CONFIGS["windows"])
    npt = NP[dtype]
    d = {n: cupy.asarray(x) for n, x in s.bufs.items()}
    w = cupy.asarray(s.wbuf)
    for curr in [-1] + list(range(s.out_shape[2])):
        want = s.forward(curr=curr)
        out = cupy.zeros(want.size, npt)
        cc.cudnnMultiHeadAttnForward(h, s.attn, curr, s.lo, s.hi, None, None, s.qd, d["q"], None, s.kd, d["k"], s.vd,
                                     d["v"], s.od, out, s.wsize, w, 0, None, 0, None)
        assert cc._core.call.last_plan().engine == "cupy"
        np.testing.assert_allclose(out.get().astype(np.float64), want.astype(np.float64), **_tol(dtype, want))
    cc.cudnnDestroy(cpu)


@pytest.mark.gpu
def test_gpu_fallback_forbidden_is_not_a_silent_cpu_run(gpu):
    """The issue's shape class (fp16, TENSOR_OP_MATH, every projection) at a small size runs on
    the cupy engine with the CPU fallback forbidden; repeated calls reuse the device mask."""
    h, cupy = gpu
    cpu = cc.cudnnCreate("cpu")
    s = Setup(cpu, np.random.default_rng(9), dtype=F16, math=cc.CUDNN_TENSOR_OP_MATH, nh=4, sizes=(32, 32, 32),
              proj=(6, 6, 6, 32), nb=3, tq=16, tk=16)  # head size 6: not the fused path
    for _ in range(2):
        got, engines = run_all(h, s, cupy.asarray, lambda x: x.get())
        assert engines == ["cupy"] * 3
    assert len(attn_mod._MASKS) >= 1
    cc.cudnnDestroy(cpu)
