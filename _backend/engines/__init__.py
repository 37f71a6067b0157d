"""Engines that execute plans; each registers itself in ``base.REGISTRY`` on import."""
from .base import REGISTRY, Engine, EngineConfig, EngineDeclined, ExecutionPlan, VariantPack  # noqa: F401
from . import reference  # noqa: F401  (always there)

for _optional in ("cupy_engine", "cudnn_engine"):
    try:  # GPU engines register only when their module exists and imports
        __import__(f"{__name__}.{_optional}")
    except ImportError:
        pass
