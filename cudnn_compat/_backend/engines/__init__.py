"""Engines that execute plans: each subpackage registers itself in ``base.REGISTRY`` on import,
with its priority per place (``REGISTRY.register(engine, priority={...})``), from which
``heuristics.ORDER`` is derived: adding an engine is adding its subpackage here (and its
package name in pyproject.toml's list)."""
import importlib as _importlib
import pkgutil as _pkgutil

from .base import REGISTRY, Engine, EngineConfig, EngineDeclined, ExecutionPlan, VariantPack  # noqa: F401
from . import reference  # noqa: F401  (always there)

for _found in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _found.ispkg or _found.name == "reference":
        continue
    try:  # the other engines register only when their module imports
        _importlib.import_module(f"{__name__}.{_found.name}")
    except ImportError:
        pass
