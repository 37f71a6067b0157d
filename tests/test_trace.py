"""Record, replay, diff and explain (docs/tools.md "Record and replay" and "Explain"): what a trace
holds (checked against values computed here), a CPU run replayed on the reference engine with zero
difference, a perturbed output caught and the call named, explain naming a declining engine and its
reason, the CLI and the environment variables."""
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import heuristics
from cudnn_compat._backend.engines.base import REGISTRY
from cudnn_compat._backend.engines.reference import ReferenceEngine
from cudnn_compat._core import call as _call, registry as _registry
from cudnn_compat.tools import cli, explain, replay
from conftest import tdesc

F32, F64, F16 = cc.CUDNN_DATA_FLOAT, cc.CUDNN_DATA_DOUBLE, cc.CUDNN_DATA_HALF
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def workload(h, rng):
    """A few legacy calls of several families and types; returns {name: output array}."""
    n, c, hw = 2, 3, 4
    xd, bd = tdesc((n, c, hw, hw)), tdesc((1, c, 1, 1))
    x = rng.standard_normal(n * c * hw * hw).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    y = x.copy()
    cc.cudnnAddTensor(h, 1.0, bd, bias, 1.0, xd, y)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_TANH, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    t = np.zeros_like(y)
    alpha = np.array(0.5, np.float32)  # a host pointer scalar (ctypes.c_void_p: Python ints are values)
    cc.cudnnActivationForward(h, ad, ctypes.c_void_p(alpha.ctypes.data), xd, y, 0.0, xd, t)
    s = np.zeros_like(t)
    cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_LOG, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, xd, t, 0.0, xd, s)
    dd = tdesc((2, 5, 1, 1), F64)
    d = rng.standard_normal(10)
    cc.cudnnScaleTensor(h, dd, d, 3.0)
    hd = tdesc((1, 4, 2, 2), F16)
    hv = rng.standard_normal(16).astype(np.float16)
    cc.cudnnSetTensor(h, hd, hv, 0.25)
    return {"y": y, "t": t, "s": s, "d": d, "hv": hv}


def record(tmp_path, rng, handle, tensors=True, name="run.jsonl"):
    path = tmp_path / name
    with cc.trace(str(path), tensors=tensors) as rec:
        outs = workload(handle, rng)
    assert rec.closed and _registry.HOOKS == [] and _call.HOOKS == []
    return path, outs


def lines(path):
    with open(path) as f:
        return [json.loads(x) for x in f]


def test_trace_holds_arguments_digests_engine_and_time(tmp_path, rng, handle):
    path, outs = record(tmp_path, rng, handle)
    header, *calls = lines(path)
    assert header["trace"] == "cudnn-compat" and header["tensors"] == "run.npz"
    names = [c["function"] for c in calls]
    assert names[:2] == ["cudnnCreateTensorDescriptor", "cudnnSetTensorNdDescriptorEx"]
    add = calls[names.index("cudnnAddTensor")]
    assert add["status"] == "CUDNN_STATUS_SUCCESS" and add["time_s"] > 0
    assert add["args"]["cDesc"]["state"]["dims"] == [2, 3, 4, 4] and add["args"]["beta"] == 1.0
    assert add["args"]["A_data"] == {"array": [3], "dtype": "float32", "device": "host", "ref": f"c{add['seq']}.arg.A_data"}
    (run,) = add["runs"]
    assert run["engine"] == "numpy" and run["config"].startswith("numpy") and "graph" in run
    assert run["scalars"] == {"alpha": 1.0, "beta": 1.0}
    # the output digest is the one of the bytes this test holds (shape, then the raw elements)
    h = hashlib.blake2b(digest_size=10)
    h.update(str((2, 3, 4, 4)).encode())
    h.update(outs["y"].tobytes())
    assert run["outputs"]["C"]["digest"] == h.hexdigest()
    act = calls[names.index("cudnnActivationForward")]
    assert bytes.fromhex(act["args"]["alpha"]["host_scalar"])[:4] == np.float32(0.5).tobytes()
    assert act["args"]["activationDesc"]["state"]["mode"] == cc.CUDNN_ACTIVATION_TANH
    # the npz holds the inputs as they were before the call (y before the in-place add)
    with np.load(str(tmp_path / "run.npz")) as z:
        np.testing.assert_array_equal(z[f"c{add['seq']}.r0.C"].reshape(-1), outs["y"])
        assert not np.array_equal(z[f"c{add['seq']}.arg.C_data"], outs["y"])


def test_replay_on_reference_gives_zero_difference(tmp_path, rng, handle, capsys, monkeypatch):
    monkeypatch.setenv("CUDNN_COMPAT_ENGINE", "reference")  # recorded on the engine it replays on
    path, _ = record(tmp_path, rng, handle)
    monkeypatch.delenv("CUDNN_COMPAT_ENGINE")
    results = replay.replay(replay.load(path), "reference")
    assert [r.function for r in results] == ["cudnnAddTensor", "cudnnActivationForward", "cudnnSoftmaxForward",
                                            "cudnnScaleTensor", "cudnnSetTensor"]
    assert all(r.state == "ok" for r in results)
    for r in results:
        for _k, _role, _dtype, cmp, _tol in r.outputs:
            assert cmp["max_abs"] == 0.0 and cmp["max_ulp"] == 0 and cmp["max_rel"] == 0.0
    assert cli.main(["replay", str(path), "--engine", "reference"]) == 0
    out = capsys.readouterr().out
    assert "5 ok, 0 over tolerance" in out and "cudnnSoftmaxForward" in out


def _perturb(npz_path, key, index, delta):
    with np.load(npz_path) as z:
        arrays = {k: z[k] for k in z.files}
    arr = arrays[key].copy()
    flat = arr.reshape(-1)
    flat[index] = flat[index] + delta
    arrays[key] = arr
    np.savez(npz_path, **arrays)


def test_perturbed_output_is_caught_and_the_call_named(tmp_path, rng, handle, capsys):
    path, _ = record(tmp_path, rng, handle)
    calls = lines(path)[1:]
    soft = next(c for c in calls if c["function"] == "cudnnSoftmaxForward")
    _perturb(str(tmp_path / "run.npz"), f"c{soft['seq']}.r0.y", 5, 1e-3)
    results = replay.replay(replay.load(path), "reference")
    bad = [r for r in results if r.state == "fail"]
    assert [(r.seq, r.function) for r in bad] == [(soft["seq"], "cudnnSoftmaxForward")]
    (_k, role, dtype, cmp, _tol), = bad[0].outputs
    assert role == "y" and dtype == "float32" and cmp["bad"] == 1 and cmp["worst"]["index"] == [0, 0, 1, 1]
    assert cmp["max_abs"] == pytest.approx(1e-3, rel=1e-3) and cmp["max_ulp"] > 1000
    assert cli.main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"failed: #{soft['seq']} cudnnSoftmaxForward" in out
    # a looser tolerance for float32 (given on the command line) lets it pass
    assert cli.main(["replay", str(path), "--tol", "float32=0,1e-2", "--quiet"]) == 0


def test_replay_needs_tensors_and_diff_compares_traces(tmp_path, rng, handle, capsys):
    a, _ = record(tmp_path, np.random.default_rng(1), handle, tensors=False, name="a.jsonl")
    assert cli.main(["replay", str(a)]) == 2 and "CUDNN_COMPAT_TRACE_TENSORS=1" in capsys.readouterr().err
    b, _ = record(tmp_path, np.random.default_rng(1), handle, tensors=False, name="b.jsonl")
    assert cli.main(["diff", str(a), str(b)]) == 0
    c, _ = record(tmp_path, np.random.default_rng(2), handle, tensors=True, name="c.jsonl")
    assert cli.main(["diff", str(a), str(c)]) == 1
    out = capsys.readouterr().out
    assert "cudnnAddTensor C: contents differ" in out
    d, _ = record(tmp_path, np.random.default_rng(2), handle, tensors=True, name="d.jsonl")
    add = next(x for x in lines(d)[1:] if x["function"] == "cudnnAddTensor")
    _perturb(str(tmp_path / "d.npz"), f"c{add['seq']}.r0.C", 0, 1e-6)  # within float32 tolerance
    text, code = replay.diff(replay.load(c), replay.load(d))
    assert code == 0 and "within tolerance" in text


def test_error_calls_are_recorded_and_replayed_with_their_status(tmp_path, handle):
    path = tmp_path / "err.jsonl"
    d3, d4 = tdesc((1, 3, 1, 1)), tdesc((1, 4, 1, 1))
    with cc.trace(str(path), tensors=True):
        with pytest.raises(cc.CuDNNError):
            cc.cudnnAddTensor(handle, 1.0, d3, np.zeros(3, np.float32), 1.0, d4, np.zeros(4, np.float32))
    call = lines(path)[-1]
    assert call["status"] == "CUDNN_STATUS_BAD_PARAM" and "aDesc" in call["error"]
    (r,) = replay.replay(replay.load(path), "reference")
    assert r.state == "ok" and "as recorded" in r.note
    text = explain.explain(replay.load(path))
    assert "failed calls:" in text and "CUDNN_STATUS_BAD_PARAM" in text


class Picky(ReferenceEngine):
    """An engine that declines activation graphs, with a reason."""
    name = "picky"
    places = ("cpu",)

    def check_support(self, graph, place):
        if any(op.attrs.get("mode") == "TANH_FWD" for op in graph.ops):
            return "picky: no tanh kernel"
        return None


def test_explain_names_the_declining_engine_and_reason(tmp_path, rng, handle, monkeypatch, capsys):
    monkeypatch.setitem(REGISTRY.engines, "picky", Picky())
    monkeypatch.setitem(heuristics.ORDER, "cpu", ("picky", "reference"))
    cc.plan_cache_clear()
    path, _ = record(tmp_path, rng, handle)
    text = explain.explain(replay.load(path))
    block = text.split("signature ")
    act = next(b for b in block if b.split("\n")[0].count("cudnnActivationForward"))
    assert "1. picky      declined" in act and "picky: no tanh kernel" in act
    assert "2. reference  chosen: reference#0" in act and "TANH_FWD" in act
    add = next(b for b in block if b.split("\n")[0].count("cudnnAddTensor"))
    assert "1. picky      chosen: picky#0" in add and "not tried" in add
    assert cli.main(["explain", str(path)]) == 0
    assert "picky: no tanh kernel" in capsys.readouterr().out
    cc.plan_cache_clear()


def test_fused_block_is_traced_as_deferred_calls_and_flushed_graphs(tmp_path, handle):
    d = tdesc((1, 2, 2, 2))
    y = np.zeros(8, np.float32)
    path = tmp_path / "fused.jsonl"
    with cc.trace(str(path)):
        with cc.fuse(handle):
            cc.cudnnSetTensor(handle, d, y, 2.0)
            cc.cudnnScaleTensor(handle, d, y, 3.0)
    calls = lines(path)[1:]
    assert [c.get("deferred") for c in calls if c["function"] in ("cudnnSetTensor", "cudnnScaleTensor")] == [True, True]
    fused = [c for c in calls if c.get("fused")]
    assert len(fused) == 1 and fused[0]["calls"] == ["cudnnSetTensor", "cudnnScaleTensor"]
    assert "graph" in fused[0]["runs"][0] and np.all(y == 6.0)
    assert "fuse x1" in explain.explain(replay.load(path))


def test_ulp_distance():
    f32 = np.array([1.0, -1.0, 0.0], np.float32)
    nxt = np.nextafter(f32, np.float32(2))
    assert replay.compare(nxt, f32, "float32", 0, 1)["max_ulp"] == 1
    tiny = np.array([np.finfo(np.float32).smallest_subnormal], np.float32)
    assert replay.compare(-tiny, tiny, "float32", 0, 1)["max_ulp"] == 2  # across zero
    h = np.array([1.0], np.float16)
    assert replay.compare(h + np.float16(2 ** -10), h, "float16", 0, 1)["max_ulp"] == 1
    bf = np.array([0x3F80, 0x3F80], np.uint16)  # 1.0 in bfloat16
    r = replay.compare(bf + np.array([0, 3], np.uint16), bf, "bfloat16", 0, 1)
    assert r["max_ulp"] == 3 and r["max_abs"] == pytest.approx(3 * 2 ** -7)
    nan = np.array([np.nan, 1.0], np.float32)
    assert replay.compare(nan, nan, "float32", 0, 0)["ok"]
    assert not replay.compare(np.array([np.nan, 1.0], np.float32), np.array([0.0, 1.0], np.float32),
                              "float32", 1, 1)["ok"]
    assert replay.tolerance("float32", "FMA_MATH") == (1e-5, 1e-5)
    assert replay.tolerance("float32", "DEFAULT_MATH") > replay.tolerance("float32", None)
    assert replay.tolerance("float16", "DEFAULT_MATH", {("float16", None): (0.5, 0.5)}) == (0.5, 0.5)


def test_environment_records_the_whole_run(tmp_path):
    script = ("import numpy as np, cudnn_compat as cc\n"
              "h = cc.cudnnCreate('cpu')\n"
              "d = cc.cudnnCreateTensorDescriptor()\n"
              "cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 2, 1, 1)\n"
              "y = np.zeros(2, np.float32)\n"
              "cc.cudnnSetTensor(h, d, y, 4.0)\n")
    env = dict(os.environ, CUDNN_COMPAT_TRACE=str(tmp_path / "env.jsonl"), CUDNN_COMPAT_TRACE_TENSORS="1",
               CUDNN_COMPAT_DEVICE="cpu", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    calls = lines(tmp_path / "env.jsonl")[1:]
    assert [c["function"] for c in calls] == ["cudnnCreate", "cudnnCreateTensorDescriptor",
                                              "cudnnSetTensor4dDescriptor", "cudnnSetTensor"]
    assert zipfile.ZipFile(tmp_path / "env.npz").namelist() == ["c3.arg.y.npy", "c3.r0.y.npy"]
    results = replay.replay(replay.load(tmp_path / "env.jsonl"), "reference")
    assert [r.state for r in results] == ["ok"]


@pytest.mark.gpu
def test_gpu_trace_replays_on_every_engine(tmp_path, rng):
    """A GPU run (device pointers and CuPy arrays) replayed on reference, cupy, cudnn and legacy."""
    import cupy
    h = cc.cudnnCreate("gpu")
    n, c, k, hw = 2, 8, 8, 6
    xd, yd, bd = tdesc((n, c, hw, hw)), tdesc((n, k, hw, hw)), tdesc((1, k, 1, 1))
    wd = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(wd, F32, cc.CUDNN_TENSOR_NCHW, k, c, 3, 3)
    cd = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, F32)
    cc.cudnnSetConvolutionMathType(cd, cc.CUDNN_FMA_MATH)
    ad = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(ad, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    x = cupy.asarray(rng.standard_normal(n * c * hw * hw).astype(np.float32))
    w = cupy.asarray(rng.standard_normal(k * c * 9).astype(np.float32))
    b = cupy.asarray(rng.standard_normal(k).astype(np.float32))
    y = cupy.zeros(n * k * hw * hw, np.float32)
    algo = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
    ws = cc.cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, algo)
    wbuf = cupy.empty(max(ws, 1), np.uint8)
    path = tmp_path / "gpu.jsonl"
    with cc.trace(str(path), tensors=True):
        cc.cudnnConvolutionForward(h, 1.0, xd, x.data.ptr, wd, w, cd, algo, wbuf, ws, 0.0, yd, y.data.ptr)
        cc.cudnnAddTensor(h, 1.0, bd, b, 1.0, yd, y)
        cc.cudnnActivationForward(h, ad, 1.0, yd, y, 0.0, yd, y)
    trace = replay.load(path)
    for engine in ("reference", "cupy", "cudnn", "legacy", "default"):
        results = replay.replay(trace, engine)
        states = [r.state for r in results]
        if engine == "cudnn":  # pointwise-only graphs: the native engine declines them (skipped, not failed)
            assert states == ["ok", "skip", "skip"], (engine, replay.format_replay(results, engine))
            assert "NOT_SUPPORTED" in results[1].note
        else:
            assert states == ["ok"] * 3, (engine, replay.format_replay(results, engine))
    cc.cudnnDestroy(h)


def test_tensors_file_is_compressed_and_loads_with_numpy(tmp_path, handle):
    """issue 23 item 7: the .npz is deflated as np.savez_compressed writes it (an uncompressed one
    was 151 MB for one small ResNet-50 step); np.load reads it back exactly."""
    import zipfile
    path = tmp_path / "z.jsonl"
    x = np.zeros((4, 64, 16, 16), np.float32)  # compressible: mostly zeros
    x[0, 0, 0, :5] = [1, 2, 3, 4, 5]
    d = tdesc(x.shape)
    with cc.trace(str(path), tensors=True):
        cc.cudnnScaleTensor(handle, d, x, 2.0)
    with zipfile.ZipFile(tmp_path / "z.npz") as z:
        infos = z.infolist()
        assert infos and all(i.compress_type == zipfile.ZIP_DEFLATED for i in infos)
        big = max(infos, key=lambda i: i.file_size)
        assert big.file_size >= x.nbytes and big.compress_size < big.file_size / 20
    with np.load(tmp_path / "z.npz") as npz:
        seq = lines(path)[-1]["seq"]
        before = npz[f"c{seq}.arg.data"] if f"c{seq}.arg.data" in npz else next(
            npz[k] for k in npz.files if k.startswith(f"c{seq}.arg."))
        expect = np.zeros_like(x)
        expect[0, 0, 0, :5] = [1, 2, 3, 4, 5]
        np.testing.assert_array_equal(before, expect)  # as it was before the call
    np.testing.assert_array_equal(x[0, 0, 0, :5], [2, 4, 6, 8, 10])
