"""The graph layer of cudnn-compat: IR, validation, heuristics, engines, plans, cache.
It never imports ``cudnn_compat``."""
from . import engines  # noqa: F401  (registers engines)
from .engines.base import REGISTRY, EngineConfig, EngineDeclined, ExecutionPlan, VariantPack  # noqa: F401
from .ir import GraphError, Operation, OperationGraph, Tensor, packed_strides, scalar, virtual  # noqa: F401
from .plan_cache import CACHE  # noqa: F401
from .planner import execute, get_plan, make_plan, run  # noqa: F401
