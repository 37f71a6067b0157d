"""The GPU tests of test_cupy_engine.py take their expectation from the CPU handle, whose default
engine is numpy (issue 25): each of them runs here on the CPU as well, with its own parametrization
(geometries, layouts, dtypes, alpha/beta), the numpy engine (the default) against the reference
engine (forced), through the same public calls and the same comparison (``assert_outputs_match``).
Every ``test_*`` of that module is re-collected here except the GPU_ONLY rows, so a new GPU test
gets its CPU twin without a line here; one that needs CuPy in its body needs a GPU_ONLY row."""
import pytest

import cudnn_compat as cc
import test_cupy_engine as gpu

GPU_ONLY = {  # test -> why it has no CPU twin
    "test_fused_chain_is_one_kernel": "cupy kernel counts and sources",
    "test_streams_are_honoured": "CUDA streams",
    "test_device_pointers_and_kernel_dump": "device pointers, cupy kernel files",
    "test_deterministic_bitwise": "cupy BN run twice; the numpy engine's is covered by the twins' comparisons",
    "test_engine_declines_are_not_supported_when_forced": "forces the cupy engine",
}
DECLINED = {  # test -> (its parameters -> whether the numpy engine declines every call of it, why)
    "test_divisive_normalization": (lambda p: p["means"], "precomputed means: numpy_engine/lrn.py's supports"),
}
RAN: list = []  # the engines that ran the default (expected) side of each comparison of a test

for _name, _fn in vars(gpu).items():
    if _name.startswith("test_") and callable(_fn) and _name not in GPU_ONLY:
        globals()[_name] = _fn


@pytest.fixture(scope="module")
def handles():
    h = cc.cudnnCreate("cpu")
    yield h, h
    cc.cudnnDestroy(h)


def compare_engines(handles, call, args: dict, outs, tol=None, equal_nan=True):
    """``gpu.compare`` for the CPU: ``call`` with the reference engine forced gives the expectation,
    the default CPU engine (numpy) the result; both from copies of the same host memory."""
    h = handles[0]
    want = {k: v.host.copy() if isinstance(v, gpu.T) else v for k, v in args.items()}
    with gpu.forced("reference"):
        call(h, want)
    assert cc.last_engine() == "reference"
    got = {k: v.host.copy() if isinstance(v, gpu.T) else v for k, v in args.items()}
    call(h, got)
    RAN.append(cc.last_engine())
    gpu.assert_outputs_match(args, outs, want, {name: got[name] for name in outs}, tol)
    return want, got


@pytest.fixture(autouse=True)
def cpu_twin(monkeypatch, request):
    """The GPU test body with ``compare`` swapped; at least one of its calls ran on the numpy engine
    unless DECLINED says why not."""
    cc.plan_cache_clear()
    monkeypatch.delenv("CUDNN_COMPAT_ENGINE", raising=False)
    monkeypatch.setattr(gpu, "compare", compare_engines)
    RAN.clear()
    yield
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    declined = DECLINED.get(request.node.originalname, (lambda p: False,))[0](params)
    if not declined:
        assert "numpy" in RAN, f"no comparison ran the numpy engine: {RAN}"
