"""Heuristics: ordered engine configs for a graph (000 "Heuristics"; 002 ch. 9
CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR with CUDNN_HEUR_MODE_INSTANT / B / FALLBACK).

Mode A is rule based and instant: on the GPU place the native cuDNN engine first,
then the generated-kernel CuPy engine, then the reference engine; on the CPU place
the reference engine.  Mode B asks each engine for all its configs (more of them,
for autotuning by Find*).  FALLBACK keeps only configs noted FALLBACK (functional,
always able to run).  ``CUDNN_COMPAT_ENGINE`` forces one engine.
"""
from __future__ import annotations

from . import config as _config
from .engines.base import REGISTRY

MODES = ("A", "B", "FALLBACK")
ORDER = {"gpu": ("cudnn", "cupy", "reference"), "cpu": ("reference",)}


def forced_engine() -> "str | None":
    name = _config.get("CUDNN_COMPAT_ENGINE") or ""
    return name or None


def engine_order(place: str, forced: "str | None" = None) -> list:
    names = [forced] if forced else list(ORDER[place])
    return [REGISTRY.engines[n] for n in names if n in REGISTRY.engines]


def get_engine_configs(graph, place: str, mode: str = "A", forced: "str | None" = None):
    """Ordered [(engine, config)], and [(engine name, reason)] for engines that are unusable here."""
    if mode not in MODES:
        raise ValueError(f"heuristics mode must be one of {MODES}, got {mode!r}")
    forced = forced if forced is not None else forced_engine()
    if forced and forced not in REGISTRY.engines:
        return [], [(forced, f"no engine named {forced!r} (known: {', '.join(sorted(REGISTRY.engines))})")]
    out, unusable = [], []
    for eng in engine_order(place, forced):
        if place not in eng.places:
            unusable.append((eng.name, f"does not run on the {place} place"))
            continue
        why = eng.available()
        if why:
            unusable.append((eng.name, why))
            continue
        cfgs = eng.configs(graph, place, mode)
        if mode == "A":
            cfgs = cfgs[:1]
        elif mode == "FALLBACK":
            cfgs = [c for c in cfgs if "FALLBACK" in c.notes]
        out.extend((eng, c) for c in cfgs)
    return out, unusable
