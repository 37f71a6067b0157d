"""docs/architecture.md "Where to add things", done (issue 26 item 7): an op kind, a legacy
function and an engine are added the way the page says, in this process, and a call of the new
function runs the new kind on the new engine and gives the numbers of a formula written here.
Everything added is taken out again by monkeypatch."""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._backend import config, heuristics, ir, ops
from cudnn_compat._backend.engines import base
from cudnn_compat._backend.engines.reference import KERNELS
from cudnn_compat._backend.ir import Operation, OperationGraph
from cudnn_compat._backend.ops import OpSpec
from cudnn_compat._core import registry, signatures
from cudnn_compat._core.call import ALPHA, BETA, blended, last_plan, run
from cudnn_compat._core.data import scalar
from cudnn_compat._core.uids import Uids
from cudnn_compat.handle import get_handle
from cudnn_compat.tensor import tensor_desc

KIND = "ToyAffine"  # y = slope*x + 1


@pytest.fixture
def recipes(monkeypatch):
    # -- an op kind: a row in a family's KINDS (OP_SPECS reassembled as at import), a reference kernel --
    def rule(index, op):
        if op.inputs["x"].dims != op.outputs["y"].dims:
            ops.fail(index, op, "SHAPE_MISMATCH", "x and y dims differ")  # a row of rules.py
    family = type("toy_family", (), {"KINDS": {KIND: OpSpec(("x",), (), ("y",), rule=rule)}})
    specs = ops._assemble(ops.FAMILIES + (family,))
    monkeypatch.setattr(ops, "OP_SPECS", specs)
    monkeypatch.setattr(ir, "OP_SPECS", specs)

    def reference(op, ins):
        return {"y": op.attrs["slope"] * ins["x"] + 1.0}
    monkeypatch.setitem(KERNELS, KIND, reference)

    # -- an engine: a subpackage's REGISTRY.register(engine, priority=...), its op_kinds() --
    class ToyPlan(base.ExecutionPlan):
        __slots__ = ("runs",)

        def __init__(self, graph, config):
            super().__init__(graph, config)
            self.runs = 0

        def execute(self, pack, stream=None):
            self.runs += 1
            env = {}
            for t in self.graph.external_inputs():
                v = pack.data[t.uid]
                env[t.uid] = np.float32(v) if t.is_by_value else v.astype(np.float32)
            for op in self.graph.ops:
                xs = {r: env[t.uid] for r, t in op.inputs.items()}
                if op.kind == KIND:
                    y = np.float32(op.attrs["slope"]) * xs["x"] + np.float32(1)
                elif op.attrs["mode"] == "IDENTITY":
                    y = xs["alpha1"] * xs["x"]
                else:
                    y = xs["alpha1"] * xs["x"] + xs["alpha2"] * xs["b"]
                t = op.outputs["y"]
                if t.is_virtual:
                    env[t.uid] = y
                else:
                    pack.data[t.uid][...] = y

    class ToyEngine(base.Engine):
        name, places = "toy", ("cpu",)

        def op_kinds(self):
            return {k: None if k in (KIND, "Pointwise") else "not a toy" for k in sorted(ops.OP_SPECS)}

        def check_support(self, graph, place):
            kinds = {op.kind for op in graph.ops}
            if KIND not in kinds or not kinds <= {KIND, "Pointwise"}:
                return "the toy engine runs ToyAffine graphs only"
            return None

        def build(self, graph, config):
            return ToyPlan(graph, config)

    reg = base.REGISTRY
    saved = (dict(reg.engines), dict(reg.priorities), dict(reg.order))
    engine = reg.register(ToyEngine(), priority={"cpu": 300})

    # -- a legacy function: @legacy, its C parameters in _core/signatures.py --
    sig = (("handle", "handle"), ("alpha", "pointer"), ("xDesc", "desc:cudnnTensorDescriptor_t"), ("x", "pointer"),
           ("slope", "double"), ("beta", "pointer"), ("yDesc", "desc:cudnnTensorDescriptor_t"), ("y", "pointer"))
    monkeypatch.setitem(signatures.SIGNATURES, "cudnnToyAffine", sig)
    X, Y = Uids().data(2)

    @registry.legacy("cudnnToyAffine")
    def toyAffine(handle, alpha, xDesc, x, slope, beta, yDesc, y) -> None:
        """y = alpha*(slope*x + 1) + beta*y."""
        h = get_handle(handle)
        xd, yd = tensor_desc(xDesc, "xDesc"), tensor_desc(yDesc, "yDesc")
        a, b = scalar(alpha, "alpha", False), scalar(beta, "beta", False)

        def build():
            return OperationGraph(blended(KIND, {"x": xd.ir(X, "x")}, "y", yd.ir(Y, "y"), b == 0,
                                          {"slope": float(slope)}), "ToyAffine")
        run(h, ("ToyAffine", xd.key(), yd.key(), float(slope), b == 0), build, {X: (x, "x"), Y: (y, "y")},
            {ALPHA: a, BETA: b})
    try:
        yield toyAffine, engine
    finally:
        registry.LEGACY.pop("cudnnToyAffine", None)
        registry.CUPY_NAMES.pop("toyAffine", None)
        reg.engines.clear(), reg.engines.update(saved[0])
        reg.priorities.clear(), reg.priorities.update(saved[1])
        reg.order.clear(), reg.order.update(saved[2])
        cc.plan_cache_clear()


def _desc(n):
    d = cc.createTensorDescriptor()
    cc.setTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 1, 1, n)
    return d


def test_the_three_recipes_run_a_call_end_to_end(recipes):
    toy, engine = recipes
    assert heuristics.ORDER["cpu"][0] == "toy"  # the priority made it the first CPU engine
    assert heuristics.engine_op_kinds("toy")[KIND] is None  # its op_kinds is what explain reads
    h = cc.cudnnCreate("cpu")
    d = _desc(6)
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    y = np.full(6, 3.0, np.float32)
    toy(h, 2.0, d, x, 0.5, 0.25, d, y)
    np.testing.assert_allclose(y, 2.0 * (0.5 * x + 1.0) + 0.25 * 3.0, rtol=1e-6)
    plan = last_plan()
    assert plan.engine == "toy" and plan.runs == 1
    # both spellings are registered (the package exports them at import); beta == 0 never reads y
    names = registry.exported()
    assert names["cudnnToyAffine"] is names["toyAffine"] is toy
    y[...] = np.nan
    names["toyAffine"](h, 1.0, d, x, 3.0, 0.0, d, y)
    np.testing.assert_allclose(y, 3.0 * x + 1.0, rtol=1e-6)
    # the reference engine runs the kind too (CUDNN_COMPAT_ENGINE, as replay --engine does)
    with config.override("CUDNN_COMPAT_ENGINE", "reference"):
        y2 = np.zeros(6, np.float32)
        toy(h, 1.0, d, x, 3.0, 0.0, d, y2)
    assert last_plan().engine == "reference"
    np.testing.assert_allclose(y2, y, rtol=1e-6)
    # a rule of the kind is a BAD_PARAM of the call, before anything is written
    d2 = _desc(5)
    y3 = np.full(5, 7.0, np.float32)
    with pytest.raises(cc.CuDNNError) as e:
        toy(h, 1.0, d, x, 3.0, 0.0, d2, y3)
    assert e.value.status == cc.CUDNN_STATUS_BAD_PARAM and (y3 == 7.0).all()
