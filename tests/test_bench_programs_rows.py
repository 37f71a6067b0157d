"""benchmarks/bench_programs.py's rows without a GPU (issue 26 item 8): which rows ``--batches``
runs, and the N=1 row (``small_batch_row``) end to end on the CPU place with torch on the CPU: the
CUDA events of ``cuda_time`` replaced by a wall clock, the two CUDA-graph columns by stand-ins that
check their arguments, the legacy column off (it needs the real libcudnn).  What it checks: the
row's columns, the eager/captured ratio and its target, the numbers against torch, the JSON."""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import cudnn_compat as cc

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_programs_under_test", BENCH / "bench_programs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_batches_choose_the_rows(bench):
    configs = bench.CONFIGS
    jobs = bench.plan_jobs(None, configs, bench.batch_sizes("32,1"))
    got = [(fn.__name__, d, l, kw) for fn, d, l, kw in jobs]
    assert got == [("block_row", "float16", "NHWC", {}), ("block_row", "float32", "NCHW", {}),
                   ("resnet_row", "float16", "NHWC", {"batch": 32}), ("resnet_row", "float32", "NCHW", {"batch": 32}),
                   ("small_batch_row", "float16", "NHWC", {"N": 1}), ("small_batch_row", "float32", "NCHW", {"N": 1})]
    assert [fn.__name__ for fn, *_ in bench.plan_jobs("resnet", configs, [32])] == ["resnet_row"] * 2
    assert [kw for *_, kw in bench.plan_jobs("resnet", configs[:1], [1, 16])] == [{"N": 1}, {"batch": 16}]
    assert bench.batch_sizes(" 1 ,32,") == [1, 32]
    for bad in ("", "0", "x", "1,-2"):
        with pytest.raises(ValueError):
            bench.batch_sizes(bad)


def test_the_default_run_has_the_n1_rows(bench):
    args = bench.arg_parser().parse_args([])
    assert bench.batch_sizes(args.batches) == [32, 1]
    assert (args.small_iters, args.small_reps, args.small_legacy) == (20, 3, True)
    assert bench.batch_sizes(bench.arg_parser().parse_args(["--batches", "32"]).batches) == [32]
    assert not bench.arg_parser().parse_args(["--no-small-legacy"]).small_legacy


def test_autotune_limit_restores_the_environment(bench, monkeypatch):
    var = bench.AUTOTUNE_VAR
    monkeypatch.delenv(var, raising=False)
    with bench.autotune_limit(4) as k:
        assert k == "4" and os.environ[var] == "4"
    assert var not in os.environ
    with bench.autotune_limit(0) as k:
        assert k == "" and var not in os.environ
    monkeypatch.setenv(var, "2")  # the user's value wins
    with bench.autotune_limit(4) as k:
        assert k == "2" and os.environ[var] == "2"
    assert os.environ[var] == "2"
    with pytest.raises(RuntimeError), bench.autotune_limit(4):
        raise RuntimeError
    assert os.environ[var] == "2"


class _WallEvent:
    def record(self, *a):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


@pytest.mark.parametrize("dtype,layout", [("float32", "NCHW"), ("float16", "NHWC")])
def test_small_batch_row_on_the_cpu(bench, monkeypatch, tmp_path, dtype, layout):
    common = bench.cuda_time.__globals__  # benchmarks/_common.py as bench_programs imported it
    monkeypatch.setitem(common, "_events", lambda kind: (_WallEvent, lambda: None,
                                                         lambda a, b: (b.t - a.t) * 1e3))
    real_setup, real_input = bench.torch_setup, bench.torch_input
    monkeypatch.setattr(bench, "torch_setup", lambda *a, **k: real_setup(*a, **k, device="cpu"))
    monkeypatch.setattr(bench, "torch_input", lambda *a, **k: real_input(*a, **k, device="cpu"))
    calls = {}

    def torch_graph(m, opt, xt, yt, it):
        inspect.signature(real_torch_graph).bind(m, opt, xt, yt, it)
        assert isinstance(m, torch.nn.Module) and isinstance(opt, torch.optim.SGD)
        assert xt.shape[0] == yt.shape[0] == 1 and it == {"iters": 2, "reps": 1, "warm": 3}
        calls["torch_graph"] = True
        return 4.0

    def ours_graph(net, h, x, labels, p0, it):
        inspect.signature(real_ours_graph).bind(net, h, x, labels, p0, it)
        assert net.N == 1 and set(p0) == set(net.params())
        net.set_params(p0)  # what a replay computes from the initial weights: the eager step's loss
        calls["ours_graph"] = True
        return 2.0, net.step(x, labels, lr=0.0)
    real_torch_graph, real_ours_graph = bench.torch_graph_ms, bench.ours_graph_ms
    monkeypatch.setattr(bench, "torch_graph_ms", torch_graph)
    monkeypatch.setattr(bench, "ours_graph_ms", ours_graph)
    monkeypatch.delenv(bench.AUTOTUNE_VAR, raising=False)

    args = SimpleNamespace(quick=True, small_iters=2, small_reps=1, small_autotune=4, small_legacy=False)
    ex = bench.load_example()
    h = cc.cudnnCreate("cpu")
    try:
        row = bench.small_batch_row(ex, h, args, dtype, layout, N=1)
    finally:
        cc.cudnnDestroy(h)
    assert "error" not in row and "errors" not in row, (row.get("error"), row.get("errors"))
    assert calls == {"torch_graph": True, "ours_graph": True}
    assert row["name"] == f"resnet50_step {dtype} {layout} N=1 64x64 width 0.25"
    assert row["kind"] == "resnet50_step" and row["N"] == 1 and row["autotune"] == "4"
    assert bench.AUTOTUNE_VAR not in os.environ
    for col in ("ours_ms", "torch_ms", "ours_host_ms", "host_calib_us"):
        assert isinstance(row[col], float) and row[col] > 0, col
    assert not {"ours_floor_ms", "ours_launches", "driver_launch_us", "driver_floor_ms"} & set(row)  # GPU only
    assert row["ours_graph_ms"] == 2.0 and row["torch_graph_ms"] == 4.0
    assert row["eager_over_captured"] == pytest.approx(row["ours_ms"] / 2.0)
    assert row["target_eager_over_captured"] == 2.0
    assert row["eager_over_captured_ok"] is (row["eager_over_captured"] <= 2.0)
    assert row["torch_eager_over_captured"] == pytest.approx(row["torch_ms"] / 4.0)
    assert "legacy_ms" not in row
    assert row["ours_graph_loss_rel_err_vs_ours"] <= 1e-6
    assert set(row["rel_errs_vs_torch"]) == {"loss", *bench.CHECKED_GRADS}
    # wiring, not precision: the loss close; in fp32 the gradients of a batch of 1 (sums that cancel,
    # max-norm errors) within 10%, where a layout or naming mistake is off by O(1).  In fp16 a batch of
    # 1 moves them by O(1) (torch fp16 against torch fp32 as much): the loss only.
    errs = row["rel_errs_vs_torch"]
    assert row["max_rel_err_vs_torch"] == max(errs.values()) and all(np.isfinite(v) for v in errs.values())
    assert errs["loss"] <= (1e-4 if dtype == "float32" else 1e-2), errs
    if dtype == "float32":
        assert row["max_rel_err_vs_torch"] <= 0.1, errs
    assert np.isfinite(row["loss"])
    path = common["write_json_file"](str(tmp_path / "rows.json"), {"rows": [row]})
    back = json.loads(Path(path).read_text())["rows"][0]
    assert back["eager_over_captured"] == pytest.approx(row["eager_over_captured"])
    assert bench.table([row]).splitlines()[-1].startswith(row["name"])
