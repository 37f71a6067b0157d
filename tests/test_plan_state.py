"""Declared state (issue 15 item 3): a plan carries only the fields ExecutionPlan and its engine's
plan class declare; nothing is written into frozen IR tensors; the cudnn engine's per-graph
state is a weakly keyed side table, not an attribute of the graph."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import cudnn_compat as cc
from cudnn_compat._core import call as _call, data as _data
from cudnn_compat._backend.engines import cudnn_engine
from cudnn_compat._backend.engines.base import EngineConfig, ExecutionPlan
from cudnn_compat._backend.engines.cudnn_engine.plan import CudnnPlan
from cudnn_compat._backend.engines.cupy_engine import CupyPlan
from cudnn_compat._backend.engines.numpy_engine import NumpyPlan
from cudnn_compat._backend.engines.reference import ReferencePlan
from cudnn_compat._backend.ir import Operation, OperationGraph, Tensor, packed_strides

PLAN_CLASSES = [ExecutionPlan, ReferencePlan, NumpyPlan, CupyPlan, CudnnPlan]


def _graph():
    x, y = (Tensor(u, (2, 3), packed_strides((2, 3)), "float32", name=n) for u, n in ((1, "x"), (2, "y")))
    return OperationGraph([Operation("Pointwise", {"x": x}, {"y": y}, {"mode": "IDENTITY"})])


@pytest.mark.parametrize("cls", PLAN_CLASSES, ids=lambda c: c.__name__)
def test_plan_classes_have_no_instance_dict(cls):
    """Every plan class of the package is slotted all the way up: no __dict__ to attach to."""
    assert all("__slots__" in vars(k) for k in cls.__mro__[:-1]), cls.__mro__
    assert "__dict__" not in dir(cls)


def test_an_undeclared_attribute_raises():
    plan = ReferencePlan(_graph(), EngineConfig("reference"))
    with pytest.raises(AttributeError):
        plan.some_cache = 1
    with pytest.raises(AttributeError):
        setattr(plan, "bind_programme", ())  # a misspelt field is an error, not a new attribute


def test_the_declared_fields_have_their_defaults():
    plan = ReferencePlan(_graph(), EngineConfig("reference"))
    assert plan.place is None and plan.declines == [] and plan.failures == [] and plan.cpu_fallback is False
    assert plan.last_time is None and plan._users == 0 and not plan.retired and not plan._released
    assert plan.annex == {}  # what the layers above keep per plan, under their module's name
    assert plan.raw_pointers is False and plan.launch_order == () and plan.launch((), None) is False


def test_a_legacy_call_leaves_only_declared_fields(handle):
    """A real call through planner, plan cache and _call fills the fields they own."""
    d = cc.createTensorDescriptor()
    cc.setTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, 1, 2, 3, 4)
    act = cc.createActivationDescriptor()
    cc.setActivationDescriptor(act, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    x, y = np.linspace(-1, 1, 24, dtype=np.float32), np.zeros(24, np.float32)
    cc.activationForward(handle, act, 1.0, d, x, 0.0, d, y)
    plan = _call.last_plan()
    assert isinstance(plan, NumpyPlan) and not hasattr(plan, "__dict__")  # the CPU default
    assert plan.place == "cpu" and plan.last_time is not None
    assert set(plan.annex) == {"cudnn_compat._core.fastbind"} and plan.annex["cudnn_compat._core.fastbind"].program
    assert np.array_equal(y, np.maximum(x, 0))
    cc.destroyActivationDescriptor(act)
    cc.destroyTensorDescriptor(d)


def test_tensor_layout_is_kept_beside_the_frozen_tensor():
    t = Tensor(7, (2, 3), packed_strides((2, 3)), "float16", name="x")
    spec = _data.layout(t)
    assert "_layout" not in vars(t) and _data._LAYOUTS[id(t)] is spec and _data.layout(t) is spec
    key = id(t)
    del t
    gc.collect()
    assert key not in _data._LAYOUTS  # the entry left with its tensor


def test_cudnn_engine_state_is_a_weak_side_table():
    g = _graph()
    st = cudnn_engine._state(g)
    assert cudnn_engine._state(g) is st and "_cudnn_state" not in vars(g)
    n = len(cudnn_engine._STATES)
    del g
    gc.collect()
    assert len(cudnn_engine._STATES) == n - 1


@pytest.fixture
def handle():
    h = cc.create("cpu")
    yield h
    cc.destroy(h)
