"""The memory-speed kernels of issue 14 item 4: batch-norm training forward/backward
(``cupy_engine/bn.py``), softmax rows in registers (``softmax_kernels.py``) and channel-vector
pooling (``stencil._pool_forward_vec``).

CPU (no GPU needed): the layout each benchmark shape gets (pattern, vector width, split, bounded
scratch) and the fallbacks to the generic kernels; every source of a grid of graphs (both
patterns, split and single-kernel, vector and scalar variants, every float type, the Ex
add/activation epilogue, beta != 0) compiles with NVRTC; and a few run on the CPU emulator
(``kernel_emu``) against the reference engine, each variant forced.

GPU (``gpu`` marker): through the legacy API on a GPU handle with the cupy engine forced, against
the reference engine on a CPU handle: odd and ResNet-like shapes, NCHW/NHWC, fp16/fp32 (and
bf16/fp64 once), alpha/beta, saved statistics or not, the scalar variants (alignment check
forced off), split and single-kernel geometries, and repeated calls (the ticket counters reset
themselves; the results repeat bit for bit).
"""
import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import dtypes
from cudnn_compat._backend.engines.base import EngineConfig, VariantPack
from cudnn_compat._backend.engines.cupy_engine import ENGINE, bn, runtime
from cudnn_compat._backend.engines.cupy_engine.rowops import BnRun, RowRun
from cudnn_compat._backend.engines.cupy_engine.steps import KernelRun
from cudnn_compat._backend.engines.reference import ReferencePlan
from cudnn_compat._backend.ir import Operation, OperationGraph
from test_kernel_sources import ALPHA, BETA, _host, _nvrtc, bn_graphs, one, ten

# -- CPU: layouts ---------------------------------------------------------------------------------


def _runs(g):
    g.finalize()
    return ENGINE.build(g, EngineConfig("cupy")).runs


def _bn_run(dt, layout, shape, which=0, axes=(0, 2, 3)):
    gs = list(bn_graphs(dt, layout, shape, axes))
    g = [gs[0], gs[2], gs[3]][which]  # forward training, backward (saved), backward (recomputed)
    return _runs(g)[0]


@pytest.mark.parametrize("dt, layout, inner, V, split", [
    ("float16", "NHWC", "kept", 8, True), ("float32", "NHWC", "kept", 4, True),
    ("float16", "NCHW", "reduced", 8, True), ("float32", "NCHW", "reduced", 4, True)])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_benchmark_shapes_take_the_fast_vector_layout(dt, layout, inner, V, split, which):
    run = _bn_run(dt, layout, (32, 256, 56, 56), which)
    assert isinstance(run, BnRun)
    vec, scal = run.variants
    L = vec[0].layout
    assert (L.inner, L.V, L.split) == (inner, V, split)
    assert len(vec) == 2 and vec[0].name.split("_")[2] == "s" and vec[1].name.split("_")[2] == "a"
    assert vec[0].aligned and not scal[0].aligned and scal[0].layout.V == 1
    blocks = L.grid[0] * L.grid[1]
    assert bn.MIN_BLOCKS <= blocks <= 4 * bn.TARGET_BLOCKS, L.grid
    # the last block's merge is short and the scratch small (partials are per block, not per element)
    assert -(-L.G // L.P) * L.nstate <= bn.COMBINE_LOADS or L.inner == "reduced"
    assert run.scratch["ws"] <= 4 * 1024 * 1024 and run.scratch["cnt"] >= 4 * L.ngroups  # the max over variants


@pytest.mark.parametrize("dt, C, HW, single", [
    ("float16", 2048, 7, True), ("float16", 1024, 14, True), ("float16", 512, 28, True), ("float16", 128, 28, True),
    ("float32", 256, 14, True), ("float16", 64, 56, False), ("float16", 64, 112, False)])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_batch_one_layers_take_one_kernel(dt, C, HW, single, which):
    """ResNet-50's layers at batch 1 (NHWC): where a block can walk its channels in FULL_TILES
    tiles, one kernel, no partials or counters (a launch less per call); 56x56 and up, and every
    layer at batch 32, keep the stats/apply pair."""
    for n, want in ((1, single), (32, False)):
        run = _bn_run(dt, "NHWC", (n, C, HW, HW), which)
        L = run.variants[0][0].layout
        assert L.split is not want and len(run.variants[0]) == (1 if want else 2), (n, L.grid)
        if want:
            assert L.NT <= bn.FULL_TILES and L.G == 1 and run.scratch["cnt"] == 0
            assert L.TX * L.V * L.CGI >= C and L.TY * L.NT >= n * HW * HW  # the grid covers every element


def test_many_channels_need_no_partials_and_few_elements_fall_back():
    run = _bn_run("float16", "NHWC", (8, 64, 56, 56), axes=(0,))  # per activation: 200k channels, one kernel
    assert isinstance(run, BnRun) and [len(v) for v in run.variants] == [1, 1]
    run = _bn_run("float32", "NCHW", (2, 64, 7, 7))  # 98 elements per channel: generic row kernels
    assert isinstance(run, RowRun)
    run = _bn_run("float32", "NCHW", (16, 8, 4, 4), axes=(0,))  # per activation: inner axis kept
    assert isinstance(run, BnRun) and run.variants[0][0].layout.inner == "kept"


def test_mixed_layouts_fall_back_to_the_generic_kernels():
    shape, pd = (8, 16, 8, 8), (1, 16, 1, 1)
    P = lambda uid: ten(uid, pd)  # noqa: E731
    ins = {"x": ten(1, shape, "float32", "NCHW"), "scale": P(10), "bias": P(11)}
    g = OperationGraph([Operation("NormForward", ins, {"y": ten(2, shape, "float32", "NHWC")},
                                  {"phase": "TRAINING", "axes": (0, 2, 3), "epsilon": 1e-5})], "mixed")
    assert isinstance(_runs(g)[0], RowRun)


def test_softmax_and_pool_variants():
    g = one("Softmax", {"x": ten(1, (8192, 1000, 1, 1))}, "y", ten(2, (8192, 1000, 1, 1)), False,
            {"algorithm": "ACCURATE", "axes": (1, 2, 3)})
    run = _runs(g)[0]
    assert isinstance(run, KernelRun) and len(run.variants) == 2
    assert run.variants[0].aligned and run.variants[0].grid == (1024, 1, 1)  # a warp per row, 8 rows per block
    g = one("Softmax", {"x": ten(1, (4, 5000, 1, 1))}, "y", ten(2, (4, 5000, 1, 1)), False,
            {"algorithm": "LOG", "axes": (1, 2, 3)})
    assert _runs(g)[0].variants[-1].block == (1024, 1, 1)  # scalar: 625 lanes -> 1024 threads
    g = one("Softmax", {"x": ten(1, (4, 50000, 1, 1))}, "y", ten(2, (4, 50000, 1, 1)), False,
            {"algorithm": "LOG", "axes": (1, 2, 3)})
    assert isinstance(_runs(g)[0], RowRun)  # too long for registers: the generic row kernel
    attrs = {"mode": "MAXPOOL", "window": (3, 3), "stride": (2, 2), "pre_padding": (1, 1), "post_padding": (1, 1),
             "nan_propagation": "NOT_PROPAGATE"}
    g = one("ResampleForward", {"x": ten(1, (2, 64, 12, 12), "float16", "NHWC")}, "y",
            ten(2, (2, 64, 6, 6), "float16", "NHWC"), False, attrs)
    run = _runs(g)[0]
    assert len(run.variants) == 2 and run.variants[0].aligned
    g = one("ResampleForward", {"x": ten(1, (2, 64, 12, 12), "float16")}, "y", ten(2, (2, 64, 6, 6), "float16"),
            False, attrs)
    assert len(_runs(g)[0].variants) == 1  # NCHW: the scalar kernel


# -- CPU: NVRTC compiles every source of a grid -------------------------------------------------------

def _grid():
    for dt, layout in (("float32", "NCHW"), ("float16", "NHWC"), ("bfloat16", "NHWC"), ("float64", "strided")):
        for shape in ((32, 64, 28, 28), (3, 5, 7, 9)):
            yield from bn_graphs(dt, layout, shape)
        yield from bn_graphs(dt, layout, (16, 8, 4, 4), axes=(0,))
        for algo in ("FAST", "ACCURATE", "LOG"):
            for shape, axes in (((64, 1000, 1, 1), (1, 2, 3)), ((3, 20, 4, 5), (1,)), ((2, 3000, 1, 1), (1, 2, 3))):
                attrs = {"algorithm": algo, "axes": axes}
                yield one("Softmax", {"x": ten(1, shape, dt, layout)}, "y", ten(2, shape, dt, layout), False, attrs)
                if algo != "FAST":
                    yield one("SoftmaxBackward", {"y": ten(1, shape, dt, layout), "dy": ten(3, shape, dt, layout)},
                              "dx", ten(2, shape, dt, layout), True, attrs)
        for mode, prop in (("MAXPOOL", "PROPAGATE"), ("MAXPOOL", "NOT_PROPAGATE"), ("AVGPOOL_EXCLUDE_PADDING", "PROPAGATE")):
            attrs = {"mode": mode, "window": (3, 3), "stride": (2, 2), "pre_padding": (1, 1), "post_padding": (1, 1),
                     "nan_propagation": prop}
            yield one("ResampleForward", {"x": ten(1, (2, 16, 9, 9), dt, layout)}, "y", ten(2, (2, 16, 5, 5), dt, layout),
                      False, attrs)


def test_every_fast_kernel_source_compiles_with_nvrtc():
    import concurrent.futures
    import os
    from test_kernel_sources import _compile_batch
    _nvrtc()
    srcs = {}
    for g in _grid():
        for r in _runs(g):
            for k in r.kernels():
                srcs.setdefault(k.name, k.source)
    fams = {n.split("_")[1] for n in srcs}
    assert {"bnfwd", "bnbwd", "softmax", "softmaxbwd", "poolfwd"} <= fams
    assert any("_s_" in n for n in srcs) and any("_a_" in n for n in srcs)
    items = sorted(srcs.items())
    batches = [items[i:i + 32] for i in range(0, len(items), 32)]
    with concurrent.futures.ProcessPoolExecutor(max(1, min(len(batches), os.cpu_count() or 1))) as pool:
        failures = [f for fs in pool.map(_compile_batch, batches) for f in fs]
    assert not failures, "\n\n".join(f"{n}: {lg}" for n, lg in failures[:3])


# -- CPU: emulated runs against the reference -------------------------------------------------------

def _emulated(g, variant, seed=3, nan=False):
    """Outputs of the reference plan and of the cupy plan run on the CPU emulator (``variant``:
    index of the kernel variant forced on every run that has several; ``nan``: a fifth of x's
    elements and the whole first 4x4 corner of every plane made NaN)."""
    import kernel_emu
    why = kernel_emu.available()
    if why:
        pytest.skip(why)
    g.finalize()
    rng = np.random.default_rng(seed)
    scalars = {ALPHA: 1.5, BETA: -0.5, 30: 1e-5, 31: 0.1}
    bases = {}
    for t in list(g.external_outputs()) + list(g.external_inputs()):
        if not t.is_by_value and t.uid not in bases and t.uid - 5000 not in bases:
            base = _host(t, rng)[0]
            if t.uid == 1:
                base += 3.0  # |mean| > std for x: the shifted sums matter
                if nan:
                    sd = dtypes.storage_dtype(t.dtype)
                    vals = dtypes.load(base.copy(), t.dtype)
                    view = np.ndarray(t.dims, dtype=np.float64, buffer=vals,
                                      strides=tuple(st * 8 for st in t.strides))
                    view[..., :4, :4] = np.nan
                    vals[rng.random(vals.size) < 0.2] = np.nan
                    base = dtypes.to_storage(vals, t.dtype).view(sd)
            bases[t.uid] = base
    envs = []
    for _ in range(2):
        env, mem = {}, {u: b.copy() for u, b in bases.items()}
        for t in list(g.external_outputs()) + list(g.external_inputs()):
            if t.is_by_value:
                env[t.uid] = scalars[t.uid]
                continue
            src = mem.get(t.uid, mem.get(t.uid - 5000))
            sd = dtypes.storage_dtype(t.dtype)
            env[t.uid] = np.ndarray(t.dims, dtype=sd, buffer=src, strides=tuple(s * sd.itemsize for s in t.strides))
        envs.append(env)
    ReferencePlan(g, EngineConfig("reference")).execute(VariantPack(envs[0]))
    plan = ENGINE.build(g, EngineConfig("cupy"))
    for r in plan.runs:
        for t in r.temps:
            envs[1].setdefault(t.uid, _host(t, None, 0.0)[1])
        if isinstance(r, BnRun):
            assert variant < len(r.variants)
            r.emulate(envs[1], kernel_emu, np, variant)
        else:
            assert isinstance(r, KernelRun)
            spec = r.variants[min(variant, len(r.variants) - 1)]
            vals = [envs[1][a[1]] for a in spec.args]
            assert all(envs[1][u].__array_interface__["data"][0] % 16 == 0 for u in spec.aligned)
            kernel_emu.launch(spec, vals)
    out = {}
    for t in g.external_outputs():
        want, got = dtypes.load(envs[0][t.uid], t.dtype), dtypes.load(envs[1][t.uid], t.dtype)
        assert np.array_equal(np.isnan(want), np.isnan(got)), t.name
        fin = np.isfinite(want)
        inf = ~fin & ~np.isnan(want)
        assert np.array_equal(want[inf], got[inf]), t.name
        out[t.uid] = np.linalg.norm(got[fin] - want[fin]) / max(np.linalg.norm(want[fin]), 1e-30)
    return out


EMU_BN = [  # dt, layout, shape, geometry, graph (0 forward, 2 backward saved, 3 recomputed), variant (0 vector, 1 scalar)
    ("float32", "NHWC", (16, 24, 6, 5), "split", 0, 0), ("float32", "NHWC", (16, 24, 6, 5), "split", 3, 1),
    ("float16", "NCHW", (4, 3, 16, 40), "split", 0, 1), ("float16", "NCHW", (4, 3, 16, 40), "split", 2, 0),
    ("float64", "strided", (4, 4, 6, 40), "single", 0, 0), ("float64", "strided", (4, 4, 6, 40), "single", 3, 1),
    ("float32", "NHWC", (16, 24, 6, 5), "single", 2, 0),
    # batch 1: one kernel by FULL_TILES, the knobs as shipped
    ("float16", "NHWC", (1, 64, 14, 14), "small", 0, 0), ("float16", "NHWC", (1, 64, 14, 14), "small", 2, 0),
    ("float32", "NHWC", (1, 40, 7, 7), "small", 3, 0), ("float32", "NHWC", (1, 40, 7, 7), "small", 0, 1)]


@pytest.mark.parametrize("dt, layout, shape, geometry, which, variant", EMU_BN)
def test_bn_kernels_on_the_cpu_emulator(monkeypatch, dt, layout, shape, geometry, which, variant):
    """Forward (running averages, ReLU, beta != 0) and backward (saved and recomputed statistics),
    vector and scalar variants, split into a stats/apply pair or one kernel (forced by the block
    targets, or a batch-1 shape's own geometry)."""
    split = geometry == "split"
    if geometry != "small":
        monkeypatch.setattr(bn, "TARGET_BLOCKS", 8 if split else 1)
        monkeypatch.setattr(bn, "MIN_BLOCKS", 4 if split else 1)
        monkeypatch.setattr(bn, "FULL_TILES", 0 if split else bn.FULL_TILES)
    run = _runs(list(bn_graphs(dt, layout, shape))[which])[0]
    assert isinstance(run, BnRun) and len(run.variants) == 2
    assert len(run.variants[variant]) == (2 if split else 1)
    errs = _emulated(list(bn_graphs(dt, layout, shape))[which], variant)
    assert max(errs.values()) <= (1e-2 if dt == "float16" else 1e-5), errs


EMU_ROWS = [((3, 20, 4, 5), (1,), "ACCURATE", 0), ((3, 20, 4, 5), (1,), "LOG", 1),
            ((2, 3000, 1, 1), (1, 2, 3), "FAST", 0), ((2, 3000, 1, 1), (1, 2, 3), "ACCURATE", 1),
            ((6, 40, 1, 1), (1, 2, 3), "LOG", 0), ((6, 40, 1, 1), (1, 2, 3), "ACCURATE", 1)]


@pytest.mark.parametrize("shape, axes, algo, variant", EMU_ROWS)
def test_softmax_kernels_on_the_cpu_emulator(shape, axes, algo, variant):
    """Sub-warp (LN < 32), one lane per row (channel mode) and block-wide rows (LN > 32), forward
    and backward, each variant."""
    layout = "NHWC" if axes == (1,) else "NCHW"
    attrs = {"algorithm": algo, "axes": axes}
    g = one("Softmax", {"x": ten(1, shape, "float32", layout)}, "y", ten(2, shape, "float32", layout), False, attrs)
    assert max(_emulated(g, variant).values()) <= 1e-5
    if variant == 1:
        g = one("SoftmaxBackward", {"y": ten(1, shape, "float32", layout), "dy": ten(3, shape, "float32", layout)},
                "dx", ten(2, shape, "float32", layout), False, attrs)
        assert max(_emulated(g, 0).values()) <= 1e-5


@pytest.mark.parametrize("dt, prop", [("float16", "PROPAGATE"), ("float16", "NOT_PROPAGATE"),
                                      ("float32", "PROPAGATE"), ("float32", "NOT_PROPAGATE")])
def test_vector_pool_kernel_on_the_cpu_emulator(dt, prop):
    """Max pooling with NaNs (a fifth of the elements, and windows that are all NaN): the packed
    half2 max (fp16) and the IEEE max (fp32) keep the scalar kernel's NaN rules, beta != 0."""
    attrs = {"mode": "MAXPOOL", "window": (3, 3), "stride": (2, 2), "pre_padding": (1, 1), "post_padding": (1, 1),
             "nan_propagation": prop}
    g = one("ResampleForward", {"x": ten(1, (2, 16, 9, 9), dt, "NHWC")}, "y", ten(2, (2, 16, 5, 5), dt, "NHWC"),
            False, attrs)
    run = _runs(g)[0]
    assert len(run.variants) == 2 and ("cc_hmax2" in run.variants[0].source) == (dt == "float16")
    assert max(_emulated(one("ResampleForward", {"x": ten(1, (2, 16, 9, 9), dt, "NHWC")}, "y",
                             ten(2, (2, 16, 5, 5), dt, "NHWC"), False, attrs), 0, nan=True).values()) <= 1e-2


# -- GPU: through the legacy API against the reference ------------------------------------------------

gpu = pytest.mark.gpu

from test_cupy_engine import NAN, T, _bn_params, compare, forced, fresh_plans, handles, out_tensor  # noqa: F401,E402

BN_SHAPES = [((32, 64, 28, 28), "float16", "NHWC"), ((32, 64, 28, 28), "float32", "NCHW"),
             ((3, 5, 7, 9), "float32", "NHWC"), ((3, 5, 7, 9), "float16", "NCHW"),
             ((8, 24, 14, 14), "float16", "NCHW"), ((8, 24, 14, 14), "float32", "NHWC"),
             ((4, 16, 10, 12), "bfloat16", "NHWC"), ((4, 16, 10, 12), "float64", "NCHW"),
             ((16, 40, 6, 6), "float32", "strided")]


def _bn_forward(handles, rng, mode, shape, dtype, layout, alpha, beta, repeat=1):
    mode = getattr(cc, mode)
    ps, pt, mk = _bn_params(rng, mode, shape, dtype)
    x = T(rng, shape, dtype, layout, scale=2.0)
    x.host = dtypes.to_storage(dtypes.load(x.host, dtype) + 3.0, dtype)
    y = out_tensor(rng, shape, dtype, layout, beta)
    scale, bias = mk(low=0.5), mk()
    rm, rv, sm, si = mk(), mk(low=0.5), mk(fill=NAN), mk(fill=NAN)

    def call(h, d):
        for _ in range(repeat):
            cc.cudnnBatchNormalizationForwardTraining(h, mode, alpha, beta, x.desc, d["x"], y.desc, d["y"], scale.desc,
                                                      d["scale"], d["bias"], 0.1, d["rm"], d["rv"], 1e-4, d["sm"], d["si"])
    return compare(handles, call, {"x": x, "y": y, "scale": scale, "bias": bias, "rm": rm, "rv": rv, "sm": sm, "si": si},
                   ["y", "rm", "rv", "sm", "si"], tol=1e-4 if dtype == "float32" else None)


def _bn_backward(handles, rng, mode, shape, dtype, layout, saved, ad=0.5, bd=0.25, ap=2.0, bp=-0.5):
    mode = getattr(cc, mode)
    ps, pt, mk = _bn_params(rng, mode, shape, dtype)
    x, dy = T(rng, shape, dtype, layout), T(rng, shape, dtype, layout)
    scale, sm, si = mk(low=0.5), mk(), mk()
    ysc, yb = T(rng, shape, dtype, layout), mk()
    cc.cudnnBatchNormalizationForwardTraining(handles[0], mode, 1.0, 0.0, x.desc, x.host, ysc.desc, ysc.host, scale.desc,
                                              scale.host, yb.host, 0.1, None, None, 1e-4, sm.host, si.host)
    dx = out_tensor(rng, shape, dtype, layout, bd)
    ds, db = mk(fill=NAN) if bp == 0 else mk(), mk(fill=NAN) if bp == 0 else mk()
    return compare(handles, lambda h, d: cc.cudnnBatchNormalizationBackward(
        h, mode, ad, bd, ap, bp, x.desc, d["x"], dy.desc, d["dy"], dx.desc, d["dx"], scale.desc, d["scale"], d["ds"],
        d["db"], 1e-4, d["sm"] if saved else None, d["si"] if saved else None),
        {"x": x, "dy": dy, "dx": dx, "scale": scale, "ds": ds, "db": db, "sm": sm, "si": si}, ["dx", "ds", "db"],
        tol=1e-4 if dtype == "float32" else None)


@gpu
@pytest.mark.parametrize("shape, dtype, layout", BN_SHAPES)
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, -0.25)])
def test_gpu_bn_forward_training(handles, rng, shape, dtype, layout, alpha, beta):
    _bn_forward(handles, rng, "CUDNN_BATCHNORM_SPATIAL", shape, dtype, layout, alpha, beta)


@gpu
@pytest.mark.parametrize("shape, dtype, layout", BN_SHAPES)
@pytest.mark.parametrize("saved", [True, False])
def test_gpu_bn_backward(handles, rng, shape, dtype, layout, saved):
    _bn_backward(handles, rng, "CUDNN_BATCHNORM_SPATIAL", shape, dtype, layout, saved)
    _bn_backward(handles, rng, "CUDNN_BATCHNORM_SPATIAL", shape, dtype, layout, saved, 1.0, 0.0, 1.0, 0.0)


@gpu
@pytest.mark.parametrize("geometry", ["split", "single", "scalar"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gpu_bn_geometries_and_repeated_calls(monkeypatch, handles, rng, geometry, layout):
    """Each geometry; three calls in a row update the running averages three times (the
    counters reset themselves), and the same inputs give the same bits every time."""
    import cupy
    if geometry == "single":
        monkeypatch.setattr(bn, "TARGET_BLOCKS", 1)
        monkeypatch.setattr(bn, "MIN_BLOCKS", 1)
    if geometry == "scalar":
        monkeypatch.setattr(runtime, "aligned", lambda env, uids: False)
    shape = (16, 32, 20, 20)
    _bn_forward(handles, rng, "CUDNN_BATCHNORM_SPATIAL", shape, "float32", layout, 1.0, 0.0, repeat=3)
    _bn_backward(handles, rng, "CUDNN_BATCHNORM_SPATIAL", shape, "float16", layout, False)
    # bitwise repeatability
    x = cupy.asarray(rng.standard_normal(int(np.prod(shape))).astype(np.float32))
    xd = T(rng, shape, "float32", layout).desc
    pd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnDeriveBNTensorDescriptor(pd, xd, cc.CUDNN_BATCHNORM_SPATIAL)
    p = [cupy.asarray(rng.uniform(0.5, 1.5, shape[1]).astype(np.float32)) for _ in range(2)]
    outs = []
    with forced():
        for _ in range(3):
            y, sm, si = cupy.empty_like(x), cupy.empty(shape[1], np.float32), cupy.empty(shape[1], np.float32)
            cc.cudnnBatchNormalizationForwardTraining(handles[1], cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, xd, x, xd, y, pd,
                                                      p[0], p[1], 0.1, None, None, 1e-5, sm, si)
            outs.append([cupy.asnumpy(a) for a in (y, sm, si)])
    for o in outs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(o, outs[0]))


@gpu
def test_gpu_bn_per_activation_and_ex_relu(handles, rng):
    _bn_forward(handles, rng, "CUDNN_BATCHNORM_PER_ACTIVATION", (64, 8, 6, 6), "float32", "NHWC", 0.5, -0.25)
    _bn_backward(handles, rng, "CUDNN_BATCHNORM_PER_ACTIVATION", (300, 4, 3, 3), "float32", "NCHW", True)


@gpu
@pytest.mark.parametrize("mode", ["CUDNN_POOLING_MAX", "CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING"])
@pytest.mark.parametrize("xshape, dtype, layout", [((4, 64, 30, 31), "float16", "NHWC"), ((3, 16, 11, 9), "float32", "NHWC"),
                                                   ((2, 3, 12, 12), "float16", "NHWC"), ((4, 64, 30, 31), "float16", "NCHW")])
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, -0.25)])
def test_gpu_pooling_forward(handles, rng, mode, xshape, dtype, layout, alpha, beta):
    pd = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pd, getattr(cc, mode), cc.CUDNN_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2)
    x = T(rng, xshape, dtype, layout)
    yshape = tuple(cc.cudnnGetPoolingNdForwardOutputDim(pd, x.desc, 4))
    y = out_tensor(rng, yshape, dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnPoolingForward(h, pd, alpha, x.desc, d["x"], beta, y.desc, d["y"]),
            {"x": x, "y": y}, ["y"])


@gpu
@pytest.mark.parametrize("algo", ["CUDNN_SOFTMAX_FAST", "CUDNN_SOFTMAX_ACCURATE", "CUDNN_SOFTMAX_LOG"])
@pytest.mark.parametrize("mode, shape, dtype, layout", [
    ("CUDNN_SOFTMAX_MODE_INSTANCE", (64, 1000, 1, 1), "float32", "NCHW"),
    ("CUDNN_SOFTMAX_MODE_INSTANCE", (33, 1000, 1, 1), "float16", "NCHW"),
    ("CUDNN_SOFTMAX_MODE_INSTANCE", (5, 3, 7, 9), "float32", "strided"),
    ("CUDNN_SOFTMAX_MODE_INSTANCE", (3, 6000, 1, 1), "float32", "NCHW"),
    ("CUDNN_SOFTMAX_MODE_CHANNEL", (4, 37, 5, 3), "float32", "NHWC")])
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, -0.25)])
def test_gpu_softmax(handles, rng, algo, mode, shape, dtype, layout, alpha, beta):
    x = T(rng, shape, dtype, layout, scale=3.0)
    y = out_tensor(rng, shape, dtype, layout, beta)
    A, M = getattr(cc, algo), getattr(cc, mode)
    compare(handles, lambda h, d: cc.cudnnSoftmaxForward(h, A, M, alpha, x.desc, d["x"], beta, y.desc, d["y"]),
            {"x": x, "y": y}, ["y"])
    yv = T(rng, shape, dtype, layout)
    cc.cudnnSoftmaxForward(handles[0], A, M, 1.0, x.desc, x.host, 0.0, yv.desc, yv.host)
    dy, dx = T(rng, shape, dtype, layout), out_tensor(rng, shape, dtype, layout, beta)
    compare(handles, lambda h, d: cc.cudnnSoftmaxBackward(h, A, M, alpha, yv.desc, d["y"], dy.desc, d["dy"], beta,
                                                           dx.desc, d["dx"]), {"y": yv, "dy": dy, "dx": dx}, ["dx"])


@gpu
def test_gpu_scalar_variants_of_softmax_and_pooling(monkeypatch, handles, rng):
    monkeypatch.setattr(runtime, "aligned", lambda env, uids: False)
    test_gpu_softmax(handles, rng, "CUDNN_SOFTMAX_ACCURATE", "CUDNN_SOFTMAX_MODE_INSTANCE", (64, 1000, 1, 1), "float32",
                     "NCHW", 0.5, -0.25)
    test_gpu_pooling_forward(handles, rng, "CUDNN_POOLING_MAX", (4, 64, 30, 31), "float16", "NHWC", 0.5, -0.25)
