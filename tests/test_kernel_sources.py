"""Every kernel source the cupy engine generates for a grid of graphs compiles with NVRTC
(``cuda.bindings.nvrtc``: no GPU needed), so a kernel that does not compile fails here, not
at a user's first call (issue 4).  A few of them also run on the CPU (``kernel_emu``: the
source compiled as C++ with a thread shim) against the reference engine.  The sources are
generated without CuPy: the engine's build step is pure Python."""
import functools

import numpy as np
import pytest

from cudnn_compat._backend import dtypes
from cudnn_compat._backend.engines.base import EngineConfig, VariantPack
from cudnn_compat._backend.engines.cupy_engine import ENGINE, kernel_sources
from cudnn_compat._backend.engines.cupy_engine.steps import KernelRun, PyRun
from cudnn_compat._backend.engines.reference import ReferencePlan
from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides, scalar, virtual
from cudnn_compat._backend.ops.convolution import output_dims

ALPHA, BETA = 9001, 9002


# -- the graph grid -----------------------------------------------------------------------------

def strides_of(dims, layout):
    if layout == "NHWC":
        n = len(dims)
        st, acc = [0] * n, 1
        for a in [1] + list(range(n - 1, 1, -1)) + [0]:
            st[a] = acc
            acc *= dims[a]
        return tuple(st)
    if layout == "strided":
        st, acc = [0] * len(dims), 1
        for a in reversed(range(len(dims))):
            st[a] = acc
            acc *= dims[a] + (2 if a == len(dims) - 1 else 0)
        return tuple(st)
    return packed_strides(dims)


def ten(uid, dims, dtype="float32", layout="NCHW"):
    return Tensor(uid, tuple(dims), strides_of(dims, layout), dtype)


def ct(dtype):
    return "float64" if dtype == "float64" else "float32"


def blend(tmp, y, beta_zero):
    """The legacy output blend: y = alpha*tmp (+ beta*y_prior)."""
    a = scalar(ALPHA, ct(y.dtype))
    if beta_zero:
        return Operation("Pointwise", {"x": tmp, "alpha1": a}, {"y": y}, {"mode": "IDENTITY"})
    prior = Tensor(y.uid + 5000, y.dims, y.strides, y.dtype)
    return Operation("Pointwise", {"x": tmp, "b": prior, "alpha1": a, "alpha2": scalar(BETA, ct(y.dtype))},
                     {"y": y}, {"mode": "ADD"})


def one(kind, ins, role, y, bz, attrs, tmp_dims=None):
    tmp = virtual(8001, tmp_dims or y.dims, ct(y.dtype))
    return OperationGraph([Operation(kind, ins, {role: tmp}, attrs), blend(tmp, y, bz)], kind)


FLOATS = ("float32", "float64", "float16", "bfloat16")
UNARY = ["IDENTITY", "SQRT", "NEG", "ABS", "EXP", "LOG", "RSQRT", "RECIPROCAL", "NOT", "RELU_FWD", "TANH_FWD",
         "SIGMOID_FWD", "ELU_FWD", "GELU_FWD", "SOFTPLUS_FWD", "SWISH_FWD", "CLIPPED_RELU_FWD"]
BINARY = ["ADD", "SUB", "MUL", "DIV", "MIN", "MAX", "POW", "CMP_GT", "CMP_GE", "CMP_LT", "CMP_LE", "CMP_EQ",
          "CMP_NEQ", "RELU_BWD", "TANH_BWD", "SIGMOID_BWD", "ELU_BWD", "CLIPPED_RELU_BWD", "TANH_BWD_Y",
          "SIGMOID_BWD_Y", "ELU_BWD_Y", "SWISH_BWD"]


def chain(modes, dt, prop, binary):
    """One graph: every mode applied in turn (one fused kernel exercising all of them)."""
    shape = (2, 8, 4, 6)
    cur, ops = ten(1, shape, dt), []
    for i, mode in enumerate(modes):
        attrs = {"mode": mode, "nan_propagation": prop, "relu_lower_clip": 0.0}
        if mode.startswith("CLIPPED"):
            attrs["relu_upper_clip"] = 0.5
        out = virtual(8100 + i, shape, ct(dt))
        ins = {"x": cur, "alpha1": scalar(11, ct(dt))}
        if binary:
            ins.update(b=ten(3, (1, 8, 1, 6), dt), alpha2=scalar(12, ct(dt)))
        ops.append(Operation("Pointwise", ins, {"y": out}, attrs))
        cur = out
    ops.append(blend(cur, ten(2, shape, dt), False))
    return OperationGraph(ops, "chain")


def pointwise_graphs():
    shape = (2, 8, 4, 6)
    for dt in ("float32", "float64"):
        for prop in ("PROPAGATE", "NOT_PROPAGATE"):
            yield chain(UNARY, dt, prop, False)
            yield chain(BINARY, dt, prop, True)
    for dt in FLOATS:
        for layout in ("NCHW", "NHWC", "strided"):
            yield one("Pointwise", {"x": ten(1, shape, dt, layout)}, "y", ten(2, shape, dt, layout), True,
                      {"mode": "RELU_FWD", "relu_lower_clip": 0.0})
            yield OperationGraph([blend(ten(1, (1, 8, 1, 1), dt), ten(2, shape, dt, layout), False)], "AddTensor")
        yield OperationGraph([Operation("Pointwise", {"x": scalar(ALPHA, ct(dt))}, {"y": ten(2, shape, dt)},
                                        {"mode": "IDENTITY"})], "SetTensor")
    for dt in ("int8", "uint8", "int32"):
        yield OperationGraph([Operation("Pointwise", {"x": ten(1, shape), "alpha1": scalar(ALPHA)},
                                        {"y": ten(2, shape, dt)}, {"mode": "IDENTITY"})], "ToInt")


def reduction_graphs():
    cases = [(mode, (1, 8, 1, 1), "NCHW", "float32") for mode in
             ("ADD", "MUL", "MIN", "MAX", "AMAX", "AVG", "NORM1", "NORM2", "MUL_NO_ZEROS")]
    cases += [(mode, yd, lay, dt) for mode in ("MAX", "NORM2") for yd in ((2, 1, 4, 6), (2, 8, 4, 1), (1, 1, 1, 1))
              for lay, dt in (("NHWC", "float32"), ("strided", "float64"))]
    for mode, ydims, layout, dt in cases:
        outs = {"y": virtual(8001, ydims, ct(dt))}
        if mode in ("MIN", "MAX", "AMAX"):
            outs["indices"] = ten(3, ydims, "int32")
        yield OperationGraph([Operation("Reduction", {"x": ten(1, (2, 8, 4, 6), dt, layout)}, outs,
                                        {"mode": mode, "nan_propagation": "PROPAGATE"}),
                              blend(outs["y"], ten(2, ydims, dt), False)], "ReduceTensor")


def heavy_graphs():
    for dt, layout in (("float32", "NCHW"), ("float32", "NHWC"), ("float64", "strided"), ("float16", "NHWC"),
                       ("bfloat16", "NCHW")):
        shape = (4, 16, 6, 5)
        full = dt == "float32"
        for algo in ("FAST", "ACCURATE", "LOG") if full else ("ACCURATE",):
            for axes in ((1, 2, 3), (1,)):
                attrs = {"algorithm": algo, "axes": axes}
                yield one("Softmax", {"x": ten(1, shape, dt, layout)}, "y", ten(2, shape, dt, layout), False, attrs)
                yield one("SoftmaxBackward", {"y": ten(1, shape, dt, layout), "dy": ten(3, shape, dt, layout)}, "dx",
                          ten(2, shape, dt, layout), True, attrs)
        for mode in ("MAXPOOL", "AVGPOOL_INCLUDE_PADDING", "AVGPOOL_EXCLUDE_PADDING") if full else ("MAXPOOL",):
            for xd, win, st, pad, yd in (((2, 3, 9, 9), (3, 3), (2, 2), (1, 1), (2, 3, 5, 5)),
                                         ((1, 2, 4, 5, 6), (2, 2, 3), (2, 1, 2), (1, 0, 1), (1, 2, 3, 4, 3))):
                attrs = {"mode": mode, "window": win, "stride": st, "pre_padding": pad, "post_padding": pad,
                         "nan_propagation": "PROPAGATE"}
                lay = layout if len(xd) == 4 else "NCHW"
                yield one("ResampleForward", {"x": ten(1, xd, dt, lay)}, "y", ten(2, yd, dt, lay), False, attrs)
                yield one("ResampleBackward", {"x": ten(1, xd, dt, lay), "y": ten(3, yd, dt, lay),
                                               "dy": ten(4, yd, dt, lay)}, "dx", ten(2, xd, dt, lay), False, attrs)
        lrn = {"n": 5, "alpha": 1e-4, "beta": 0.75, "k": 2.0}
        yield one("LRNForward", {"x": ten(1, shape, dt, layout)}, "y", ten(2, shape, dt, layout), False, lrn)
        yield one("LRNBackward", {"x": ten(1, shape, dt, layout), "y": ten(3, shape, dt, layout),
                                  "dy": ten(4, shape, dt, layout)}, "dx", ten(2, shape, dt, layout), False, lrn)
        yield one("DivisiveNormalizationForward", {"x": ten(1, shape, dt), "means": ten(3, shape, dt)}, "y",
                  ten(2, shape, dt), False, dict(lrn, n=3))
        t1, t2 = virtual(8001, shape, ct(dt)), virtual(8002, shape, ct(dt))
        yield OperationGraph([Operation("DivisiveNormalizationBackward", {"x": ten(1, shape, dt), "means": ten(3, shape, dt),
                                                                          "dy": ten(4, shape, dt)}, {"dx": t1, "dmeans": t2},
                                        dict(lrn, n=3)), blend(t1, ten(2, shape, dt), False),
                              blend(t2, ten(5, shape, dt), False)], "DivisiveNormalizationBackward")
        yield from bn_graphs(dt, layout, shape)
        if full:
            yield from bn_graphs(dt, layout, (64, 16, 32, 32))  # few rows: the split two-kernel path


def bn_graphs(dt, layout, shape, axes=(0, 2, 3)):
    pdims = tuple(1 if a in axes else d for a, d in enumerate(shape))
    pt = ct(dt)
    P = lambda uid: ten(uid, pdims, pt)  # noqa: E731
    x, y = ten(1, shape, dt, layout), ten(2, shape, dt, layout)
    rm, rv = P(20), P(21)
    ins = {"x": x, "scale": P(10), "bias": P(11), "epsilon": scalar(30, "float64"), "exp_avg_factor": scalar(31, "float64"),
           "running_mean": Tensor(5020, pdims, rm.strides, pt), "running_var": Tensor(5021, pdims, rv.strides, pt)}
    cur = virtual(8001, shape, pt)
    outs = {"y": cur, "saved_mean": P(22), "saved_inv_variance": P(23), "next_running_mean": rm, "next_running_var": rv}
    act = virtual(8002, shape, pt)
    yield OperationGraph([Operation("NormForward", ins, outs, {"phase": "TRAINING", "axes": axes}),
                          Operation("Pointwise", {"x": cur}, {"y": act}, {"mode": "RELU_FWD"}), blend(act, y, False)],
                         "BatchNormForwardTraining")
    inv = virtual(8003, pdims, pt)
    sh = virtual(8004, pdims, pt)
    yield OperationGraph([Operation("Pointwise", {"x": P(21), "b": scalar(30, "float64")}, {"y": sh}, {"mode": "ADD"}),
                          Operation("Pointwise", {"x": sh}, {"y": inv}, {"mode": "RSQRT"}),
                          Operation("NormForward", {"x": x, "scale": P(10), "bias": P(11), "mean": P(20),
                                                    "inv_variance": inv}, {"y": cur}, {"phase": "INFERENCE", "axes": axes}),
                          blend(cur, y, True)], "BatchNormForwardInference")
    for saved in (True, False):
        bins = {"x": x, "dy": ten(3, shape, dt, layout), "scale": P(10)}
        bins.update({"saved_mean": P(22), "saved_inv_variance": P(23)} if saved else {"epsilon": scalar(30, "float64")})
        vdx, vds, vdb = virtual(8002, shape, pt), virtual(8003, pdims, pt), virtual(8004, pdims, pt)
        yield OperationGraph([Operation("NormBackward", bins, {"dx": vdx, "dscale": vds, "dbias": vdb}, {"axes": axes}),
                              blend(vdx, ten(4, shape, dt, layout), False), blend(vds, P(40), False),
                              blend(vdb, P(41), True)], "BatchNormBackward")


def conv_graphs():
    for dt, layout in (("float32", "NCHW"), ("float16", "NHWC"), ("bfloat16", "NCHW"), ("float64", "NCHW")):
        xd, wd, pad, st, dil, g = (2, 4, 7, 6), (6, 2, 3, 3), (1, 1), (1, 2), (1, 1), 2
        yd = output_dims(xd, wd, pad, pad, st, dil)
        attrs = {"mode": "CROSS_CORRELATION", "pre_padding": pad, "post_padding": pad, "stride": st, "dilation": dil,
                 "groups": g}
        x, w, y = ten(1, xd, dt, layout), ten(2, wd, dt, layout), ten(3, yd, dt, layout)
        yield one("ConvolutionForward", {"x": x, "w": w}, "y", y, False, attrs)
        yield one("ConvolutionBackwardData", {"dy": y, "w": w}, "dx", x, False, attrs)
        yield one("ConvolutionBackwardFilter", {"x": x, "dy": y}, "dw", w, False, attrs)
        yield one("Matmul", {"a": ten(1, (3, 4, 5), dt), "b": ten(2, (1, 5, 6), dt)}, "c", ten(3, (3, 4, 6), dt), False, {})


def dropout_graphs():
    """cudnnDropoutForward's graph (cudnn_compat/dropout.py): Rng drawing the mask, y = (x * scale) * mask
    (the cupy engine: one kernel for both and the offset advance), every data type, packed and strided x."""
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        for layout in ("NCHW", "strided"):
            dims = (2, 3, 4, 5)
            mask = Tensor(3, dims, packed_strides(dims), "uint8")
            x, y = Tensor(5, dims, strides_of(dims, layout), dtype), Tensor(6, dims, strides_of(dims, layout), dtype)
            rng = Operation("Rng", {"seed": Tensor(1, (2,), (1,), "int32"), "offset": Tensor(2, (2,), (1,), "int32")},
                            {"y": mask, "offset_out": Tensor(4, (2,), (1,), "int32")},
                            {"distribution": "BERNOULLI", "drop_probability": 0.25})
            cdt = "float64" if dtype == "float64" else "float32"
            yield OperationGraph([rng, Operation("Pointwise", {"x": x, "b": mask, "alpha1": scalar(7, cdt, "scale")},
                                                 {"y": y}, {"mode": "MUL"})], "DropoutForward")


def all_graphs():
    for gen in (pointwise_graphs, reduction_graphs, heavy_graphs, conv_graphs, dropout_graphs):
        yield from gen()


@functools.lru_cache(maxsize=None)
def all_sources() -> dict:
    """name -> source of every distinct kernel the grid generates."""
    out = {}
    for g in all_graphs():
        g.finalize()
        assert ENGINE.check_support(g, "gpu") is None, g.describe()
        plan = ENGINE.build(g, EngineConfig("cupy"))
        for spec in plan.kernels():
            out.setdefault(spec.name, spec.source)
    return out


def test_every_kind_of_the_grid_is_supported_and_generates_kernels():
    srcs = all_sources()
    families = {name.split("_")[1] for name in srcs}
    assert {"ew", "ewv4", "red", "softmax", "softmaxbwd", "bnfwd", "bnbwd", "poolfwd", "poolbwd", "lrnfwd", "lrnbwd1",
            "lrnbwd2", "divnfwd", "divnbwd1", "divnbwd2", "rngapply"} <= families, families
    assert all(src.count('extern "C" __global__') >= 1 for src in srcs.values())


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # cuda-bindings or the NVRTC library missing
        pytest.skip(f"NVRTC is not usable here: {type(e).__name__}: {e}")
    if int(err) != 0:
        pytest.skip(f"NVRTC is not usable here: {err}")
    return nvrtc


def _compile(nvrtc, name, src, arch=b"compute_90"):
    """(status, log) of compiling ``src``: to PTX, or with an sm_ ``arch`` to machine code (the
    inline PTX of the half-precision conversions assembled too)."""
    err, prog = nvrtc.nvrtcCreateProgram(src.encode(), (name + ".cu").encode(), 0, [], [])
    assert int(err) == 0
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, 3, [b"--gpu-architecture=" + arch, b"-std=c++17",
                                                      b"-diag-suppress=177,550"])
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, log)
        return int(err), log.decode(errors="replace").strip("\x00 \n")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _batch_source(items) -> str:
    """Kernels of one batch in one translation unit: the shared preamble once, each kernel's own
    part in a namespace of its own (its helper structs cannot collide; the kernels are extern "C"
    with unique names)."""
    from cudnn_compat._backend.engines.cupy_engine.codegen import PREAMBLE
    parts = [PREAMBLE]
    for i, (name, src) in enumerate(items):
        assert src.startswith(PREAMBLE), name
        parts.append(f"namespace cc_k{i} {{\n{src[len(PREAMBLE):]}\n}}\n")
    return "\n".join(parts)


def _compile_batch(items):
    """Failures of a batch: [] or [(name, log)] (a failing batch is retried one kernel at a time)."""
    from cuda.bindings import nvrtc
    err, log = _compile(nvrtc, "batch", _batch_source(items))
    if not err:
        return []
    out = []
    for name, src in items:
        e, lg = _compile(nvrtc, name, src)
        if e:
            out.append((name, lg[:2000]))
    return out or [("batch", log[:2000])]


def test_every_generated_kernel_compiles_with_nvrtc():
    import concurrent.futures
    import os
    _nvrtc()
    items = sorted(all_sources().items())
    batches = [items[i:i + 24] for i in range(0, len(items), 24)]
    workers = max(1, min(len(batches), os.cpu_count() or 1))
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        failures = [f for fs in pool.map(_compile_batch, batches) for f in fs]
    assert not failures, "\n\n".join(f"{n}: {lg}" for n, lg in failures[:5])


def test_half_conversions_assemble_to_machine_code():
    """The preamble's inline PTX (f16 <-> f32, f64 -> f16) and bfloat16 rounding assemble for the
    oldest and the newest target, and a generated half kernel does too."""
    from cudnn_compat._backend.engines.cupy_engine.codegen import PREAMBLE
    nvrtc = _nvrtc()
    probe = PREAMBLE + '''extern "C" __global__ void probe(unsigned short* h, double* d, float* f) {
  h[0] = cc_f2h(cc_h2f(h[1]) + f[0]); h[2] = cc_d2h(d[0]); h[3] = cc_f2b(cc_b2f(h[4]) * f[1]); }'''
    srcs = all_sources()
    half = next(s for n, s in sorted(srcs.items()) if "cc_f2h(" in s.split("#endif", 1)[1])
    for arch in (b"sm_75", b"sm_90"):
        for name, src in (("probe", probe), ("half", half)):
            err, log = _compile(nvrtc, name, src, arch)
            assert not err, log


def test_64_bit_indexing_past_two_giga_elements():
    """Element counts or offsets past 2^31 switch the index type to 64 bits (no data needed:
    only the sources are built and compiled)."""
    big = (2, 4, 32768, 10000)  # 2.6e9 elements
    graphs = [one("Pointwise", {"x": ten(1, big)}, "y", ten(2, big), True, {"mode": "RELU_FWD"}),
              OperationGraph([Operation("Reduction", {"x": ten(1, big)}, {"y": virtual(8001, (1, 4, 1, 1))},
                                        {"mode": "ADD"}), blend(virtual(8001, (1, 4, 1, 1)), ten(2, (1, 4, 1, 1)),
                                                                True)], "ReduceTensor"),
              one("Softmax", {"x": ten(1, big)}, "y", ten(2, big), True, {"algorithm": "LOG", "axes": (1,)}),
              one("ResampleForward", {"x": ten(1, big)}, "y", ten(2, (2, 4, 16384, 5000)), True,
                  {"mode": "MAXPOOL", "window": (2, 2), "stride": (2, 2), "pre_padding": (0, 0),
                   "post_padding": (0, 0)})]
    small = one("Pointwise", {"x": ten(1, (2, 3, 4, 5))}, "y", ten(2, (2, 3, 4, 5)), True, {"mode": "RELU_FWD"})
    assert all("long long" not in src.split("#endif", 1)[1] for src in kernel_sources(ENGINE.build(small.finalize(), EngineConfig("cupy"))))
    nvrtc = None
    for g in graphs:
        srcs = kernel_sources(ENGINE.build(g.finalize(), EngineConfig("cupy")))
        assert srcs and all("long long" in src.split("#endif", 1)[1] for src in srcs), g.name
        try:
            nvrtc = nvrtc or _nvrtc()
        except pytest.skip.Exception:
            continue
        for src in srcs:
            err, log = _compile(nvrtc, "big", src)
            assert not err, log


def test_a_broken_source_fails_to_compile():
    """The check above can fail: a kernel with a type error does not compile."""
    nvrtc = _nvrtc()
    err, log = _compile(nvrtc, "broken", 'extern "C" __global__ void k(float* p) { p[0] = undefined_name; }')
    assert err != 0 and "undefined_name" in log


# -- a few kernels run on the CPU against the reference engine ------------------------------------

def _host(t, rng, fill=None):
    span = 1 + sum((d - 1) * s for d, s in zip(t.dims, t.strides))
    base = dtypes.to_storage(np.full(span, fill) if fill is not None else rng.standard_normal(span), t.dtype)
    sd = dtypes.storage_dtype(t.dtype)
    return base, np.ndarray(t.dims, dtype=sd, buffer=base, strides=tuple(s * sd.itemsize for s in t.strides))


def _emulate(plan, env, emu):
    for r in plan.runs:
        assert not isinstance(r, PyRun)
        for t in r.temps:
            env.setdefault(t.uid, _host(t, None, 0.0)[1])
        if hasattr(r, "emulate"):  # runs with their own scratch (rowops.BnRun)
            r.emulate(env, emu, np)
            continue
        specs = r.kernels()
        extra = {"ws": np.zeros(specs[0].ws_bytes // 4 + 8)} if len(specs) > 1 and not isinstance(r, KernelRun) else {}
        for spec in specs:
            if spec.aligned and not all(env[u].__array_interface__["data"][0] % 16 == 0 for u in spec.aligned):
                continue
            emu.launch(spec, [extra[a[1]] if a[0] == "extra" else env[a[1]] for a in spec.args])
            if isinstance(r, KernelRun):
                break


EMULATED = [
    lambda: one("Pointwise", {"x": ten(1, (2, 8, 4, 6), "float16")}, "y", ten(2, (2, 8, 4, 6), "float16"), False,
                {"mode": "GELU_FWD"}),
    lambda: OperationGraph([blend(ten(1, (1, 8, 1, 1), "bfloat16"), ten(2, (2, 8, 4, 6), "bfloat16", "NHWC"), False)], "Add"),
    lambda: next(g for g in reduction_graphs() if g.ops[0].attrs["mode"] == "MAX"),
    lambda: one("Softmax", {"x": ten(1, (3, 20, 4, 5), "float32", "NHWC")}, "y", ten(2, (3, 20, 4, 5), "float32", "NHWC"),
                False, {"algorithm": "LOG", "axes": (1,)}),
    lambda: list(bn_graphs("float32", "NHWC", (64, 3, 16, 20)))[0],
    lambda: next(g for g in heavy_graphs() if g.ops[0].kind == "ResampleBackward"),
    lambda: next(g for g in heavy_graphs() if g.ops[0].kind == "LRNBackward"),
]


@pytest.mark.parametrize("make", EMULATED)
def test_generated_kernels_match_the_reference_on_the_cpu(make):
    import kernel_emu
    why = kernel_emu.available()
    if why:
        pytest.skip(why)
    g = make().finalize()
    rng = np.random.default_rng(7)
    scalars = {ALPHA: 1.5, BETA: -0.5, 30: 1e-5, 31: 0.1, 11: 2.0, 12: 0.5}
    bases = {}
    for t in list(g.external_outputs()) + list(g.external_inputs()):
        if not t.is_by_value and t.uid not in bases and t.uid - 5000 not in bases:
            bases[t.uid] = _host(t, rng)[0]
    envs = []
    for _ in range(2):
        env = {}
        mem = {u: b.copy() for u, b in bases.items()}
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
    assert kernel_sources(plan)
    _emulate(plan, envs[1], kernel_emu)
    for t in g.external_outputs():
        want, got = dtypes.load(envs[0][t.uid], t.dtype), dtypes.load(envs[1][t.uid], t.dtype)
        tol = 1e-2 if t.dtype in ("float16", "bfloat16") else 1e-5
        assert np.array_equal(np.isnan(want), np.isnan(got))
        fin = np.isfinite(want)
        assert np.linalg.norm((got - want)[fin]) <= tol * max(np.linalg.norm(want[fin]), 1e-30), t.name


@pytest.mark.parametrize("arch", [b"compute_90", b"sm_90", b"sm_80"])
def test_fused_attention_bias_kernel_compiles(arch):
    """The fused attention path's row-bias kernel (attention/fused.py BIAS_SRC: inline PTX
    add.rn.f16x2) compiles and, with an sm_ arch, assembles."""
    from cudnn_compat.attention import fused
    err, log = _compile(_nvrtc(), fused.BIAS_KERNEL, fused.BIAS_SRC, arch)
    assert err == 0, log
