"""One TF32 rule (issue 13 item 10; 002 cudnnMathType_t): ``_backend.math_policy.allow_tf32`` decides
for every GEMM-like path of every engine: the cudnn engine's config filter, the cupy engine's cuBLAS
compute type for matmuls, convolution GEMMs and the RNN recurrence, and the legacy RNN layer's
stamps.  CPU tests check the rule and that every path of uni- and bidirectional LSTM/GRU/RNN graphs,
the spatial-transformer grid and convolutions gets the rule's answer; the GPU test measures the fp32
LSTM error against float64 for DEFAULT vs FMA math, uni- and bidirectional (docs/conventions.md
"Math policy"), and that NVIDIA_TF32_OVERRIDE=0 brings DEFAULT_MATH to FMA accuracy."""
import json
import os
import pathlib

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import math_policy
from cudnn_compat._backend.engines.base import EngineConfig
from cudnn_compat._backend.engines.cudnn_engine import configs as cfgsel
from cudnn_compat._backend.engines.cudnn_engine.graph import Decline, candidates
from cudnn_compat._backend.engines.cupy_engine import gemm as ggemm
from cudnn_compat._backend.engines.cupy_engine import rnn as grnn
from cudnn_compat.rnn import core as rnn_core
from cudnn_compat.rnn.desc import rnn_desc

MATHS = ("DEFAULT_MATH", "TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION", "FMA_MATH")
ROOT = pathlib.Path(__file__).resolve().parents[1]


# -- the rule -------------------------------------------------------------------------------------

@pytest.mark.parametrize("override", [None, "0", "1"])
def test_allow_tf32_truth_table(monkeypatch, override):
    if override is None:
        monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    else:
        monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", override)
    on = override != "0"
    for math in MATHS:
        assert math_policy.allow_tf32("float32", math) is (on and math != "FMA_MATH"), math
        for dt in ("float16", "bfloat16", "float64", "int8"):
            assert math_policy.allow_tf32(dt, math) is False, (dt, math)
        assert math_policy.allow_tf32("float32", math, 75) is False  # pre-Ampere: no TF32 at all
        assert math_policy.allow_tf32("float32", math, 90) is (on and math != "FMA_MATH")
    assert math_policy.allow_tf32("float32", None) is False  # an op with no math type: full FP32
    assert math_policy.gemm_compute("float32", "DEFAULT_MATH") == ("tf32" if on else "float32")
    assert math_policy.gemm_compute("float32", "FMA_MATH") == "float32"
    assert math_policy.gemm_compute("float64", "DEFAULT_MATH") == "float64"
    assert math_policy.gemm_compute("float16", "TENSOR_OP_MATH") == "float32"
    with pytest.raises(ValueError):
        math_policy.allow_tf32("float32", "CUDNN_DEFAULT_MATH")


def _code(path: pathlib.Path) -> str:
    """A module's code without docstrings and comments."""
    import ast
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def test_the_override_variable_is_read_in_one_place():
    """No module but math_policy decides TF32 from the environment (one policy, one function);
    cudnn_compat/_backend/config.py only lists it among the external variables the doctor shows."""
    hits = sorted(str(p.relative_to(ROOT)) for d in ("cudnn_compat",) for p in (ROOT / d).rglob("*.py")
                  if "NVIDIA_TF32_OVERRIDE" in p.read_text() and "NVIDIA_TF32_OVERRIDE" in _code(p))
    assert set(hits) - {"cudnn_compat/_backend/config.py"} == {"cudnn_compat/_backend/math_policy.py"}, hits


@pytest.mark.parametrize("override", [None, "0"])
def test_native_config_filter_follows_the_rule(monkeypatch, override):
    if override is None:
        monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    else:
        monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", override)
    tc, conv_tc, plain = {"TENSOR_CORE"}, {"TENSOR_CORE", "DOWN_CONVERT_INPUTS"}, set()
    for math in MATHS + (None,):
        assert cfgsel.allowed_by_math(tc, math, "float32") is math_policy.allow_tf32("float32", math), math
        assert cfgsel.allowed_by_math(plain, math, "float32")
        # fp16 data: tensor cores are not TF32; only FMA_MATH forbids them
        assert cfgsel.allowed_by_math(tc, math, "float16") is (math != "FMA_MATH")
        # down-conversion to fp16 only where the math type allows conversion
        assert cfgsel.allowed_by_math(conv_tc, math, "float32") is (math == "TENSOR_OP_MATH_ALLOW_CONVERSION")


# -- every path of the RNN, the grid generator and the convolutions gets the rule's answer ---------------

def _graphs(run) -> list:
    from cudnn_compat._backend import planner
    graphs, orig = [], planner.make_plan

    def spy(graph, *a, **k):
        graphs.append(graph)
        return orig(graph, *a, **k)
    planner.make_plan = spy
    cc.plan_cache_clear()
    try:
        run()
    finally:
        planner.make_plan = orig
        cc.plan_cache_clear()
    return graphs


def _rnn_call(h, mode, D, dtype, math):
    L, I, H, T, B = 2, 3, 4, 3, 2
    DT = {"float32": cc.CUDNN_DATA_FLOAT, "float64": cc.CUDNN_DATA_DOUBLE, "float16": cc.CUDNN_DATA_HALF}[dtype]
    npd = {"float32": np.float32, "float64": np.float64, "float16": np.float16}[dtype]
    drop = cc.cudnnCreateDropoutDescriptor()
    cc.cudnnSetDropoutDescriptor(drop, h, 0.0, None, 0, 0)
    d = cc.cudnnCreateRNNDescriptor()
    cc.cudnnSetRNNDescriptor_v8(d, cc.CUDNN_RNN_ALGO_STANDARD, getattr(cc, f"CUDNN_{mode}"), cc.CUDNN_RNN_DOUBLE_BIAS,
                                cc.CUDNN_BIDIRECTIONAL if D == 2 else cc.CUDNN_UNIDIRECTIONAL, cc.CUDNN_LINEAR_INPUT, DT,
                                cc.CUDNN_DATA_DOUBLE if dtype == "float64" else cc.CUDNN_DATA_FLOAT,
                                getattr(cc, f"CUDNN_{math}"), I, H, H, L, drop, cc.CUDNN_RNN_PADDED_IO_ENABLED)
    xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
    seq = cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
    cc.cudnnSetRNNDataDescriptor(xd, DT, seq, T, B, I, [T] * B, None)
    cc.cudnnSetRNNDataDescriptor(yd, DT, seq, T, B, D * H, [T] * B, None)
    hd = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptor(hd, DT, 3, [L * D, B, H], [B * H, H, 1])
    size = cc.cudnnGetRNNWeightSpaceSize(h, d)
    w = np.zeros(size // np.dtype(npd).itemsize, npd)
    ws, rs = cc.cudnnGetRNNTempSpaceSizes(h, d, cc.CUDNN_FWD_MODE_TRAINING, xd)
    wsb, rsb = np.zeros(max(ws, 1), np.uint8), np.zeros(max(rs, 1), np.uint8)
    x, hx = np.zeros((T, B, I), npd), np.zeros((L * D, B, H), npd)
    y, hy, cy = np.zeros((T, B, D * H), npd), np.zeros_like(hx), np.zeros_like(hx)
    lens = np.full(B, T, np.int32)
    lstm = mode == "LSTM"
    cc.cudnnRNNForward(h, d, cc.CUDNN_FWD_MODE_TRAINING, lens, xd, x, yd, y, hd, hx, hy, hd if lstm else None,
                       hx if lstm else None, cy if lstm else None, size, w, ws, wsb, rs, rsb)
    dx, dhx = np.zeros_like(x), np.zeros_like(hx)
    cc.cudnnRNNBackwardData_v8(h, d, lens, yd, y, y, xd, dx, hd, hx, hx, dhx, hd if lstm else None,
                               hx if lstm else None, hx if lstm else None, np.zeros_like(hx) if lstm else None,
                               size, w, ws, wsb, rs, rsb)
    cc.cudnnRNNBackwardWeights_v8(h, d, cc.CUDNN_WGRAD_MODE_ADD, lens, xd, x, hd, hx, yd, y, size, np.zeros_like(w),
                                  ws, wsb, rs, rsb)
    return d


def _native_keeps_tf32(graph):
    """Whether the cudnn engine's filter keeps a float32 TENSOR_CORE config for ``graph`` (None
    when the engine does not translate it)."""
    try:
        specs = candidates(graph.finalize() if not graph.finalized else graph)
    except Decline:
        return None
    tc, plain = EngineConfig("cudnn", (), frozenset({"TENSOR_CORE"}), 1), EngineConfig("cudnn", (), frozenset(), 2)
    kept = cfgsel.select([tc, plain], specs[0], {tc: 0, plain: 0})
    return tc in kept


@pytest.mark.parametrize("override", [None, "0"])
@pytest.mark.parametrize("math", ["DEFAULT_MATH", "TENSOR_OP_MATH", "FMA_MATH"])
@pytest.mark.parametrize("mode, D", [("LSTM", 1), ("LSTM", 2), ("GRU", 1), ("GRU", 2), ("RNN_TANH", 2)])
def test_every_rnn_gemm_path_gets_the_rules_answer(handle, monkeypatch, mode, D, math, override):
    """Projection and weight-gradient Matmuls (cudnn engine filter, cupy engine cuBLAS compute) and the
    recurrence (cuBLAS compute), forward and backward, uni- and bidirectional: one answer."""
    if override is None:
        monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    else:
        monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", override)
    want = math_policy.allow_tf32("float32", math)
    holder = {}
    graphs = _graphs(lambda: holder.setdefault("d", _rnn_call(handle, mode, D, "float32", math)))
    assert rnn_core.config_of(rnn_desc(holder["d"])).tf32 is want
    seen = {"Matmul": 0, "RNNRecurrence": 0, "RNNRecurrenceBackward": 0, "native": 0}
    for g in graphs:
        for op in g.ops:
            if op.kind == "Matmul":
                seen["Matmul"] += 1
                ts = list(op.inputs.values()) + list(op.outputs.values())
                assert ggemm._compute(op, "float32", ts) == ("tf32" if want else "float32"), g.name
            elif op.kind in ("RNNRecurrence", "RNNRecurrenceBackward"):
                seen[op.kind] += 1
                assert grnn._Geo(op).compute == ("tf32" if want else "float32"), g.name
        if any(op.kind == "Matmul" for op in g.ops):
            keeps = _native_keeps_tf32(g)
            if keeps is not None:
                seen["native"] += 1
                assert keeps is want, g.name
    assert seen["Matmul"] and seen["RNNRecurrence"] and seen["RNNRecurrenceBackward"], seen
    if D == 1:  # bidirectional graphs hold two matmuls: the cudnn engine declines them, the cupy engine runs them
        assert seen["native"], "no RNN graph was translated by the cudnn engine's pure-Python layer"


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_rnn_on_other_data_types_never_uses_tf32(handle, dtype):
    graphs = _graphs(lambda: _rnn_call(handle, "LSTM", 2, dtype, "DEFAULT_MATH"))
    comps = {grnn._Geo(op).compute for g in graphs for op in g.ops if op.kind.startswith("RNNRecurrence")}
    assert comps == {"float64" if dtype == "float64" else "float32"}


def test_grid_generator_matmul_has_no_math_type_so_no_tf32(handle, monkeypatch):
    """The cause of issue 13 item 7: the grid generator's Matmul ran on a TF32 (TENSOR_CORE) native
    config under the default math type; an op without a math type now never gets TF32."""
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    st = cc.cudnnCreateSpatialTransformerDescriptor()
    cc.cudnnSetSpatialTransformerNdDescriptor(st, cc.CUDNN_SAMPLER_BILINEAR, cc.CUDNN_DATA_FLOAT, 4, [2, 3, 4, 3])
    theta, grid = np.zeros((2, 2, 3), np.float32), np.zeros((2, 4, 3, 2), np.float32)
    graphs = _graphs(lambda: (cc.cudnnSpatialTfGridGeneratorForward(handle, st, theta, grid),
                              cc.cudnnSpatialTfGridGeneratorBackward(handle, st, grid, theta)))
    mms = [(g, op) for g in graphs for op in g.ops if op.kind == "Matmul"]
    assert len(mms) == 2
    for g, op in mms:
        assert op.attrs.get("math_type") is None
        assert ggemm._compute(op, "float32", list(op.inputs.values()) + list(op.outputs.values())) == "float32"
        assert _native_keeps_tf32(g) in (False, None)


@pytest.mark.parametrize("math", MATHS)
def test_convolutions_get_the_rules_answer_in_both_engines(handle, monkeypatch, math):
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    from conv_util import cdesc, fdesc
    from conftest import tdesc
    cd = cdesc((1, 1), math=getattr(cc, f"CUDNN_{math}"))
    xd, wd = tdesc((2, 3, 5, 5)), fdesc((4, 3, 3, 3))
    yd = tdesc(tuple(cc.cudnnGetConvolutionNdForwardOutputDim(cd, xd, wd, 4)))
    x, w, y = np.ones((2, 3, 5, 5), np.float32), np.ones((4, 3, 3, 3), np.float32), np.zeros((2, 4, 5, 5), np.float32)
    graphs = _graphs(lambda: cc.cudnnConvolutionForward(handle, 1.0, xd, x, wd, w, cd, 0, None, 0, 0.0, yd, y))
    want = math_policy.allow_tf32("float32", math)
    convs = [(g, op) for g in graphs for op in g.ops if op.kind == "ConvolutionForward"]
    assert convs
    for g, op in convs:
        ts = list(op.inputs.values()) + list(op.outputs.values())
        assert ggemm._compute(op, "float32", ts) == ("tf32" if want else "float32")
        if math != "TENSOR_OP_MATH_ALLOW_CONVERSION":
            assert _native_keeps_tf32(g) is want


# -- GPU: measured errors -----------------------------------------------------------------------------

def _lstm_errors(gpu, cpu, D, math, rng_seed=5):
    """fp32 LSTM on the GPU handle vs the float64 result of the same weights/inputs (CPU handle):
    norm-wise relative error of y."""
    import cupy
    mode, L, I, H, T, B = "LSTM", 2, 64, 128, 12, 16
    rng = np.random.default_rng(rng_seed)
    out = {}
    for dtype, h, arr in (("float64", cpu, np), ("float32", gpu, cupy)):
        npd = np.float64 if dtype == "float64" else np.float32
        DT = cc.CUDNN_DATA_DOUBLE if dtype == "float64" else cc.CUDNN_DATA_FLOAT
        drop = cc.cudnnCreateDropoutDescriptor()
        cc.cudnnSetDropoutDescriptor(drop, h, 0.0, None, 0, 0)
        d = cc.cudnnCreateRNNDescriptor()
        cc.cudnnSetRNNDescriptor_v8(d, cc.CUDNN_RNN_ALGO_STANDARD, cc.CUDNN_LSTM, cc.CUDNN_RNN_DOUBLE_BIAS,
                                    cc.CUDNN_BIDIRECTIONAL if D == 2 else cc.CUDNN_UNIDIRECTIONAL,
                                    cc.CUDNN_LINEAR_INPUT, DT, DT, getattr(cc, f"CUDNN_{math}") if dtype == "float32"
                                    else cc.CUDNN_DEFAULT_MATH, I, H, H, L, drop, cc.CUDNN_RNN_PADDED_IO_ENABLED)
        xd, yd = cc.cudnnCreateRNNDataDescriptor(), cc.cudnnCreateRNNDataDescriptor()
        seq = cc.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
        cc.cudnnSetRNNDataDescriptor(xd, DT, seq, T, B, I, [T] * B, None)
        cc.cudnnSetRNNDataDescriptor(yd, DT, seq, T, B, D * H, [T] * B, None)
        hd = cc.cudnnCreateTensorDescriptor()
        cc.cudnnSetTensorNdDescriptor(hd, DT, 3, [L * D, B, H], [B * H, H, 1])
        size = cc.cudnnGetRNNWeightSpaceSize(h, d)
        r = np.random.default_rng(rng_seed)
        w = arr.asarray((r.uniform(-1, 1, size // np.dtype(npd).itemsize) / np.sqrt(H)).astype(np.float32).astype(npd))
        x = arr.asarray(r.uniform(-1, 1, (T, B, I)).astype(np.float32).astype(npd))
        hx = arr.asarray(r.uniform(-1, 1, (L * D, B, H)).astype(np.float32).astype(npd))
        ws, rs = cc.cudnnGetRNNTempSpaceSizes(h, d, cc.CUDNN_FWD_MODE_INFERENCE, xd)
        y, hy, cy = arr.zeros((T, B, D * H), npd), arr.zeros_like(hx), arr.zeros_like(hx)
        cc.cudnnRNNForward(h, d, cc.CUDNN_FWD_MODE_INFERENCE, arr.asarray(np.full(B, T, np.int32)), xd, x, yd, y, hd, hx,
                           hy, hd, hx, cy, size, w, ws, arr.zeros(max(ws, 1), np.uint8), rs,
                           arr.zeros(max(rs, 1), np.uint8))
        out[dtype] = np.asarray(y if arr is np else y.get(), np.float64)
    del rng
    return float(np.linalg.norm(out["float32"] - out["float64"]) / np.linalg.norm(out["float64"]))


@pytest.mark.gpu
def test_fp32_lstm_errors_follow_one_policy(monkeypatch):
    """The measured table of docs/conventions.md "Math policy": FMA_MATH is at fp32 accuracy for
    uni- and bidirectional networks alike, DEFAULT_MATH is in one class for both (TF32 permitted on
    both paths), and NVIDIA_TF32_OVERRIDE=0 brings DEFAULT_MATH back to FMA accuracy."""
    gpu, cpu = cc.cudnnCreate("gpu"), cc.cudnnCreate("cpu")
    errs = {}
    try:
        for override in (None, "0"):
            if override is None:
                monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
            else:
                monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", override)
            cc.plan_cache_clear()
            for D in (1, 2):
                for math in ("DEFAULT_MATH", "FMA_MATH"):
                    errs[f"{'uni' if D == 1 else 'bi'} {math}{' override=0' if override else ''}"] = _lstm_errors(
                        gpu, cpu, D, math)
    finally:
        cc.cudnnDestroy(gpu)
        cc.cudnnDestroy(cpu)
        cc.plan_cache_clear()
    report = os.environ.get("CC_MATH_REPORT")
    if report:
        pathlib.Path(report).write_text(json.dumps(errs, indent=1))
    print(json.dumps(errs, indent=1))
    for k, v in errs.items():
        if "FMA" in k or "override" in k:
            assert v < 2e-5, (k, v)
    uni, bi = errs["uni DEFAULT_MATH"], errs["bi DEFAULT_MATH"]
    assert max(uni, bi) < 2e-3, errs  # TF32 class at worst, never fp16's rounding of the whole result
    assert max(uni, bi) / min(uni, bi) < 30, errs  # one class for both paths (before: 4e-4 vs 2e-7)
