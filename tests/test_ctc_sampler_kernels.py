"""The cupy engine's CTC loss and spatial-transformer sampler kernels (``cupy_engine/ctc.py``,
``cupy_engine/sampler.py``; issue 18 item 2), on the CPU: the graphs the legacy calls build are
supported and planned, every generated source compiles with NVRTC, and the kernels run on the CPU
kernel emulator (``kernel_emu``) against the reference engine (reference/adv.py): CTC in both
normalizations, both gradient modes, with and without gradients, unalignable samples, empty
labels, repeated labels, padded lengths and strided probabilities; the sampler forward and
backward in every float type, NCHW / NHWC / padded strides, beta 0 and not, grids partly or
wholly outside the image and non-finite grid points."""
import numpy as np
import pytest

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.engines.base import EngineConfig, VariantPack
from cudnn_compat._backend.engines.cupy_engine import ENGINE, IMPLS, ctc, kernel_sources, sampler
from cudnn_compat._backend.engines.reference import ReferencePlan
from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides, scalar, virtual
from test_kernel_sources import _compile, _nvrtc, strides_of

ALPHA, BETA, ALPHA2, BETA2 = 9001, 9002, 9003, 9004
PRIOR = 5000  # uid offset of an output's prior value (the same buffer)


def ten(uid, dims, dtype="float32", layout="NCHW"):
    return Tensor(uid, tuple(dims), strides_of(dims, layout), dtype)


def ct(dtype):
    return "float64" if dtype == "float64" else "float32"


# -- graphs as the legacy calls build them (cudnn_compat/ctc.py, cudnn_compat/spatial.py) --------

def ctc_graph(T, N, A, lmax, norm="SOFTMAX", grad_mode="NOT_PROPAGATE_NAN", grads=True, dtype="float32",
              layout="NCHW"):
    ins = {"probs": ten(1, (T, N, A), dtype, layout), "labels": ten(2, (N, lmax), "int32"),
           "label_lengths": ten(3, (N,), "int32"), "input_lengths": ten(4, (N,), "int32")}
    outs = {"costs": ten(5, (N,), dtype)}
    if grads:
        outs["gradients"] = ten(6, (T, N, A), dtype, layout)
        if grad_mode == "PROPAGATE_NAN":
            ins["gradients_prior"] = ten(6 + PRIOR, (T, N, A), dtype, layout)
    return OperationGraph([Operation("CTCLoss", ins, outs, {"normalization": norm, "grad_mode": grad_mode})],
                          "CTCLoss")


def _blend(tmp, y, alpha, beta, beta_zero):
    ins = {"x": tmp, "alpha1": scalar(alpha, ct(y.dtype))}
    if not beta_zero:
        ins["b"] = Tensor(y.uid + PRIOR, y.dims, y.strides, y.dtype)
        ins["alpha2"] = scalar(beta, ct(y.dtype))
    return Operation("Pointwise", ins, {"y": y}, {"mode": "IDENTITY" if beta_zero else "ADD"})


def sampler_graph(backward, n, c, hi, wi, h, w, dtype="float32", layout="NCHW", beta_zero=False, roles=("dx", "dgrid")):
    x, grid = ten(1, (n, c, hi, wi), dtype, layout), ten(2, (n, h, w, 2), dtype)
    if not backward:
        tmp = virtual(8001, (n, c, h, w), ct(dtype))
        y = ten(3, (n, c, h, w), dtype, layout)
        return OperationGraph([Operation("SpatialTfSamplerForward", {"x": x, "grid": grid}, {"y": tmp}),
                               _blend(tmp, y, ALPHA, BETA, beta_zero)], "SpatialTfSamplerForward")
    dy = ten(4, (n, c, h, w), dtype, layout)
    rx, rg = virtual(8001, x.dims, ct(dtype)), virtual(8002, grid.dims, ct(dtype))
    outs = {r: t for r, t in (("dx", rx), ("dgrid", rg)) if r in roles}
    ops = [Operation("SpatialTfSamplerBackward", {"x": x, "grid": grid, "dy": dy}, outs)]
    if "dx" in roles:
        ops.append(_blend(rx, ten(5, x.dims, dtype, layout), ALPHA, BETA, beta_zero))
    if "dgrid" in roles:
        ops.append(_blend(rg, ten(6, grid.dims, dtype), ALPHA2, BETA2, beta_zero))
    return OperationGraph(ops, "SpatialTfSamplerBackward")


# -- data -----------------------------------------------------------------------------------------

def _view(base, t):
    sd = dtypes.storage_dtype(t.dtype)
    return np.ndarray(t.dims, dtype=sd, buffer=base, strides=tuple(s * sd.itemsize for s in t.strides))


def _alloc(t, values=None, rng=None):
    span = 1 + sum((d - 1) * s for d, s in zip(t.dims, t.strides))
    base = dtypes.to_storage(rng.standard_normal(span) if values is None else np.zeros(span), t.dtype)
    v = _view(base, t)
    if values is not None:
        dtypes.store(v, values, t.dtype)
    return base


def ctc_data(g, rng, lab_len, in_len, norm, repeat=True):
    """uid -> host base array: probs (activations, or softmax probabilities for NONE), labels
    [N, Lmax] with some repeated neighbours, the lengths, NaN-filled outputs."""
    op = g.ops[0]
    T, N, A = op.inputs["probs"].dims
    lmax = op.inputs["labels"].dims[1]
    u = rng.standard_normal((T, N, A)) * 2
    if norm == "NONE":
        e = np.exp(u - u.max(axis=2, keepdims=True))
        u = e / e.sum(axis=2, keepdims=True)
    labels = rng.integers(1, A, (N, lmax))
    if repeat and lmax > 2:
        labels[:, 2] = labels[:, 1]  # a repeated label: the skip transition is barred there
    bases = {1: _alloc(op.inputs["probs"], u), 2: _alloc(op.inputs["labels"], labels),
             3: _alloc(op.inputs["label_lengths"], np.asarray(lab_len)),
             4: _alloc(op.inputs["input_lengths"], np.asarray(in_len))}
    for role, t in op.outputs.items():
        bases[t.uid] = _alloc(t, np.full(t.dims, np.nan if role == "costs" else 7.0))
    return bases


def envs_of(g, bases, scalars=None):
    """Two independent envs (reference, emulated) over copies of ``bases``; prior uids share
    their output's buffer."""
    out = []
    for _ in range(2):
        mem = {u: b.copy() for u, b in bases.items()}
        env = {}
        for t in list(g.external_inputs()) + list(g.external_outputs()):
            if t.is_by_value:
                env[t.uid] = scalars[t.uid]
            else:
                env[t.uid] = _view(mem[t.uid if t.uid in mem else t.uid - PRIOR], t)
        out.append(env)
    return out


def run_both(g, env_ref, env_emu):
    import kernel_emu
    why = kernel_emu.available()
    if why:
        pytest.skip(why)
    g.finalize()
    assert ENGINE.check_support(g, "gpu") is None
    ReferencePlan(g, EngineConfig("reference")).execute(VariantPack(env_ref))
    plan = ENGINE.build(g, EngineConfig("cupy"))
    assert kernel_sources(plan)
    for r in plan.runs:
        for t in r.temps:
            env_emu.setdefault(t.uid, _view(_alloc(t, np.zeros(t.dims)), t))
        if hasattr(r, "emulate"):
            r.emulate(env_emu, kernel_emu, np)
        else:
            kernel_emu.launch(r.variants[-1], [env_emu[a[1]] for a in r.variants[-1].args])
    return plan


def close(g, env_ref, env_emu, tol):
    for t in g.external_outputs():
        want, got = dtypes.load(env_ref[t.uid], t.dtype), dtypes.load(env_emu[t.uid], t.dtype)
        assert np.array_equal(np.isnan(want), np.isnan(got)), t.uid
        assert np.array_equal(np.isinf(want), np.isinf(got)), (t.uid, want, got)
        fin = np.isfinite(want)
        err = np.abs(got[fin] - want[fin]).max(initial=0.0)
        assert err <= tol * max(1.0, np.abs(want[fin]).max(initial=0.0)), (t.uid, err)


# -- support and sources --------------------------------------------------------------------------

def test_registered_with_the_blend_as_epilogue():
    assert IMPLS["CTCLoss"] is ctc
    assert IMPLS["SpatialTfSamplerForward"] is sampler and IMPLS["SpatialTfSamplerBackward"] is sampler
    for bw in (False, True):
        g = sampler_graph(bw, 2, 3, 5, 6, 4, 4).finalize()
        plan = ENGINE.build(g, EngineConfig("cupy"))
        assert len(plan.runs) == 1  # the blends are the kernels' epilogues, not kernels of their own
        assert [k.family for k in plan.kernels()] == (["stbwd", "stbwdx"] if bw else ["stfwd"])
    g = ctc_graph(10, 3, 6, 4).finalize()
    assert [k.family for k in ENGINE.build(g, EngineConfig("cupy")).kernels()] == ["ctclse", "ctcab", "ctcgrad"]
    g = ctc_graph(10, 3, 6, 4, norm="NONE", grads=False).finalize()
    assert [k.family for k in ENGINE.build(g, EngineConfig("cupy")).kernels()] == ["ctcab"]


def test_declines_with_reasons():
    g = ctc_graph(10, 2, 6, 600).finalize()
    assert "label capacity 600" in ENGINE.check_support(g, "gpu")
    op = Operation("SpatialTfSamplerForward", {"x": ten(1, (1, 1, 2, 2), "int8"), "grid": ten(2, (1, 2, 2, 2))},
                   {"y": ten(3, (1, 1, 2, 2))})
    assert "x data type int8" in sampler.supports(op)


def _grid_sources():
    out = {}
    for g in [ctc_graph(12, 3, 7, 5, n, m, gr, dt) for n in ("SOFTMAX", "NONE") for m in ("NOT_PROPAGATE_NAN", "PROPAGATE_NAN")
              for gr in (True, False) for dt in ("float32", "float64", "float16")] + [
              ctc_graph(50, 4, 30, 256)] + [
              sampler_graph(bw, 2, 3, 5, 6, 4, 7, dt, lay, bz, roles) for bw in (False, True)
              for dt in ("float32", "float64", "float16", "bfloat16") for lay in ("NCHW", "NHWC") for bz in (True, False)
              for roles in (("dx", "dgrid"),)]:
        for k in ENGINE.build(g.finalize(), EngineConfig("cupy")).kernels():
            out.setdefault(k.name, k.source)
    return out


def test_every_source_compiles_with_nvrtc():
    nvrtc = _nvrtc()
    for name, src in sorted(_grid_sources().items()):
        err, log = _compile(nvrtc, name, src, b"sm_90")  # machine code: the inline bar.sync and atomics too
        assert not err, f"{name}: {log}"


# -- the emulator against the reference engine ---------------------------------------------------

CTC_CASES = [
    # T, N, A, lmax, label lengths, input lengths
    (12, 4, 6, 4, [3, 0, 4, 2], [12, 9, 12, 5]),
    (9, 3, 5, 5, [5, 2, 1], [4, 9, 1]),  # sample 0 cannot be aligned (L + R > T); T_n = 1
    (20, 2, 40, 8, [8, 7], [20, 16]),
    (6, 2, 3, 3, [3, 3], [6, 6]),  # a tiny alphabet: labels repeat a lot
]


@pytest.mark.parametrize("case, norm, grad_mode", [
    (0, "SOFTMAX", "NOT_PROPAGATE_NAN"), (0, "NONE", "PROPAGATE_NAN"), (1, "SOFTMAX", "PROPAGATE_NAN"),
    (1, "NONE", "NOT_PROPAGATE_NAN"), (2, "SOFTMAX", "NOT_PROPAGATE_NAN"), (3, "NONE", "PROPAGATE_NAN")])
def test_ctc_matches_the_reference(case, norm, grad_mode):
    T, N, A, lmax, ll, il = CTC_CASES[case]
    rng = np.random.default_rng(case)
    g = ctc_graph(T, N, A, lmax, norm, grad_mode, layout="strided" if case == 2 else "NCHW")
    er, ee = envs_of(g, ctc_data(g, rng, ll, il, norm))
    run_both(g, er, ee)
    close(g, er, ee, 2e-4)
    costs = dtypes.load(ee[5], "float32")
    assert np.all(np.isfinite(costs) | (np.asarray(ll) + 1 > np.asarray(il)))


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_ctc_other_types_and_costs_only(dtype):  # float16 with gradients, float64 costs only
    rng = np.random.default_rng(3)
    T, N, A, lmax, ll, il = CTC_CASES[0]
    for grads in ((True,) if dtype == "float16" else (False,)):
        g = ctc_graph(T, N, A, lmax, "SOFTMAX", "NOT_PROPAGATE_NAN", grads, dtype)
        er, ee = envs_of(g, ctc_data(g, rng, ll, il, "SOFTMAX"))
        run_both(g, er, ee)
        close(g, er, ee, 1e-10 if dtype == "float64" else 3e-3)


def test_ctc_unalignable_keeps_the_prior_gradient_bit_for_bit():
    rng = np.random.default_rng(5)
    g = ctc_graph(9, 3, 5, 5, "SOFTMAX", "PROPAGATE_NAN")
    bases = ctc_data(g, rng, [5, 2, 1], [4, 9, 1], "SOFTMAX")
    _view(bases[6], g.ops[0].outputs["gradients"])[:, 0] = np.arange(9 * 5, dtype=np.float32).reshape(9, 5)
    er, ee = envs_of(g, bases)
    run_both(g, er, ee)
    assert np.array_equal(ee[6][:, 0], np.arange(9 * 5, dtype=np.float32).reshape(9, 5))
    assert np.isinf(ee[5][0]) and np.all(ee[6][1:, 2] == 0)  # T_n = 1 for sample 2: later rows are 0


SAMPLER_CASES = [
    # n, c, hi, wi, h, w, dtype, layout, beta_zero, grid scale
    (2, 3, 5, 6, 4, 7, "float32", "NCHW", False, 1.0),
    (1, 4, 7, 3, 5, 5, "float64", "NHWC", True, 1.3),  # partly outside
    (2, 2, 4, 4, 3, 6, "float16", "strided", False, 0.9),
    (1, 3, 6, 5, 4, 4, "bfloat16", "NCHW", True, 1.0),
    (2, 2, 1, 6, 3, 3, "float32", "NHWC", False, 3.0),  # a single row; mostly outside
]


def sampler_data(g, rng, scale, special=True):
    bases = {}
    for t in list(g.external_inputs()) + list(g.external_outputs()):
        if t.is_by_value or t.uid in bases or t.uid - PRIOR in bases:
            continue
        if t.uid == 2:
            vals = rng.uniform(-1, 1, t.dims) * scale
            if special:
                vals[0, 0, 0] = (np.nan, 0.1)
                vals[0, 0, -1] = (0.2, np.inf)
                vals[-1, -1, 0] = (1.0, -1.0)  # exactly on the last column and the first row
                vals[-1, 0, -1] = (0.0, 0.0)  # the centre (integer coordinates when the size is odd)
            bases[t.uid] = _alloc(t, vals)
        else:
            bases[t.uid] = _alloc(t, None, rng)
    return bases


SCALARS = {ALPHA: 1.5, BETA: -0.5, ALPHA2: 0.75, BETA2: 2.0}


@pytest.mark.parametrize("case", range(len(SAMPLER_CASES)))
@pytest.mark.parametrize("backward", [False, True])
def test_sampler_matches_the_reference(case, backward):
    n, c, hi, wi, h, w, dt, lay, bz, scale = SAMPLER_CASES[case]
    g = sampler_graph(backward, n, c, hi, wi, h, w, dt, lay, bz)
    er, ee = envs_of(g, sampler_data(g, np.random.default_rng(case), scale), SCALARS)
    run_both(g, er, ee)
    close(g, er, ee, {"float64": 1e-12, "float32": 2e-5}.get(dt, 2e-2))


def test_sampler_accumulator_is_zero_again_after_the_call():
    """The dx accumulator is scratch kept per stream: the second kernel zeroes what it read, so a
    second call gives the same dx."""
    import kernel_emu
    if kernel_emu.available():
        pytest.skip(kernel_emu.available())
    g = sampler_graph(True, 2, 3, 5, 6, 4, 4, "float32", "NCHW", True).finalize()
    run = ENGINE.build(g, EngineConfig("cupy")).runs[0]
    bases = sampler_data(g, np.random.default_rng(2), 1.0, special=False)
    env = envs_of(g, bases, SCALARS)[0]
    acc = np.zeros(run.scratch["acc"][0], np.float32)
    for _ in range(2):
        for spec in run.specs:
            kernel_emu.launch(spec, [acc if a[0] == "extra" else env[a[1]] for a in spec.args])
        assert not acc.any()
        first = env[5].copy() if _ == 0 else first
    assert np.array_equal(env[5], first) and np.abs(first).max() > 0


# -- the legacy calls on an emulated GPU handle (tests/host_emu.py): raw pointers, launch records --

@pytest.fixture
def emu():
    import kernel_emu
    if kernel_emu.available():
        pytest.skip(kernel_emu.available())
    import host_emu
    import cudnn_compat as cc
    from cudnn_compat._core import memo as _memo
    cc.plan_cache_clear()
    e = host_emu.Emu("emulate")
    yield e
    e.restore()
    _memo.clear_all()
    cc._core.call.clear_prepared()


def test_legacy_calls_on_a_gpu_handle_take_the_kernels_and_records(emu, monkeypatch):
    """cudnnCTCLoss, cudnnCTCLoss_v8 and the sampler on a GPU-place handle (kernels emulated) with
    the CPU fallback forbidden: the cupy engine runs them, a launch record is made at the first
    call and replayed (CUDA graph from the third), and every call gives the CPU handle's numbers."""
    import host_emu
    import cudnn_compat as cc
    from conftest import tdesc
    monkeypatch.setenv("CUDNN_COMPAT_CPU_FALLBACK", "0")
    monkeypatch.setenv("CUDNN_COMPAT_CUPY_GRAPHS", "1")
    import sys
    monkeypatch.setattr(sys.modules["cupy"], "asarray", lambda a: host_emu.EmuArray(np.ascontiguousarray(a)),
                        raising=False)  # the repacked labels and lengths (ctc.on_place)
    gpu, cpu = emu.handle(), cc.cudnnCreate("cpu")
    rng = np.random.default_rng(8)
    T, N, A = 10, 3, 6
    lab_len, in_len = np.array([3, 1, 4], np.int32), np.array([10, 7, 9], np.int32)
    labels = rng.integers(1, A, int(lab_len.sum())).astype(np.int32)
    pd = tdesc((T, N, A))
    us = [rng.standard_normal((T, N, A)).astype(np.float32) for _ in range(2)]
    us.append(us[1])  # the third call repeats the second (a CUDA graph replay)
    for v8 in (False, True):
        d = cc.cudnnCreateCTCLossDescriptor()
        if v8:
            cc.cudnnSetCTCLossDescriptor_v8(d, cc.CUDNN_DATA_FLOAT, cc.CUDNN_LOSS_NORMALIZATION_SOFTMAX,
                                            cc.CUDNN_NOT_PROPAGATE_NAN, 4)
        else:
            cc.cudnnSetCTCLossDescriptorEx(d, cc.CUDNN_DATA_FLOAT, cc.CUDNN_LOSS_NORMALIZATION_SOFTMAX,
                                           cc.CUDNN_NOT_PROPAGATE_NAN)
        out = []
        for h, wrap in ((cpu, lambda a: a), (gpu, host_emu.EmuArray)):
            res = []
            for call in range(3):
                u = us[call]
                costs, grads = np.zeros(N, np.float32), np.zeros((T, N, A), np.float32)
                if v8:
                    ws = cc.cudnnGetCTCLossWorkspaceSize_v8(h, cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC, d, pd, pd)
                    work = np.zeros(ws, np.uint8)
                    cc.cudnnCTCLoss_v8(h, cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC, d, pd, wrap(u), labels, lab_len, in_len,
                                       wrap(costs), pd, wrap(grads), ws, wrap(work))
                else:
                    ws = cc.cudnnGetCTCLossWorkspaceSize(h, pd, pd, labels, lab_len, in_len,
                                                         cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC, d)
                    work = np.zeros(ws, np.uint8)
                    cc.cudnnCTCLoss(h, pd, wrap(u), labels, lab_len, in_len, wrap(costs), pd, wrap(grads),
                                    cc.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC, d, wrap(work), ws)
                res.append((costs, grads, u))
            out.append(res)
        plan = cc._core.call.last_plan()
        assert plan.engine == "cupy" and plan.launch_mode == "record"
        for (wc, wg, _), (gc, gg, _) in zip(*out):
            np.testing.assert_allclose(gc, wc, rtol=1e-5)
            np.testing.assert_allclose(gg, wg, rtol=1e-4, atol=1e-6)
        cc.cudnnDestroyCTCLossDescriptor(d)
    xdims, ydims = (2, 3, 6, 5), (2, 3, 4, 4)
    st = cc.cudnnCreateSpatialTransformerDescriptor()
    cc.cudnnSetSpatialTransformerNdDescriptor(st, cc.CUDNN_SAMPLER_BILINEAR, cc.CUDNN_DATA_FLOAT, 4, list(ydims))
    x = rng.standard_normal(xdims).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (2, 4, 4, 2)).astype(np.float32)
    dy = rng.standard_normal(ydims).astype(np.float32)
    outs = []
    for h, wrap in ((cpu, lambda a: a), (gpu, host_emu.EmuArray)):
        res = []
        for call in range(3):
            y, dx, dg = np.full(ydims, 2.0, np.float32), np.full(xdims, 2.0, np.float32), np.full(grid.shape, 2.0, np.float32)
            cc.cudnnSpatialTfSamplerForward(h, st, 1.5, tdesc(xdims), wrap(x), wrap(grid), 0.5, tdesc(ydims), wrap(y))
            cc.cudnnSpatialTfSamplerBackward(h, st, 1.5, tdesc(xdims), wrap(x), 0.5, tdesc(xdims), wrap(dx), 0.25,
                                             tdesc(ydims), wrap(dy), wrap(grid), -1.0, wrap(dg))
            res.append((y, dx, dg))
        outs.append(res)
    plan = cc._core.call.last_plan()
    assert plan.engine == "cupy" and plan.launch_mode == "record"
    for want, got in zip(*outs):
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    cc.cudnnDestroy(cpu)
