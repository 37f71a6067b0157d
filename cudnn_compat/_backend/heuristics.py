"""Heuristics: ordered engine configs for a graph (000 "Heuristics"; 002 ch. 9
CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR with CUDNN_HEUR_MODE_INSTANT / B / FALLBACK).

Mode A is rule based and instant: on the GPU place the native cuDNN engine first,
then the generated-kernel CuPy engine, then the reference engine; on the CPU place
the reference engine.  That order is not written here: each engine registers itself
with a priority per place (``REGISTRY.register(engine, priority={...})``) and ``ORDER``
is the registry's order (place -> engine names, highest priority first; tests patch it).  Mode B asks each engine for all its configs (more of them,
for autotuning by Find*).  FALLBACK keeps only configs noted FALLBACK (functional,
always able to run).  ``CUDNN_COMPAT_ENGINE`` forces one engine.
"""
from __future__ import annotations

from . import config as _config
from .engines.base import REGISTRY

MODES = ("A", "B", "FALLBACK")
ORDER = REGISTRY.order  # the same dict: {"gpu": ("cudnn", "cupy", "reference"), "cpu": ("reference",)}


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


# -- which op kinds each engine runs (cudnn-compat doctor --ops, explain, tests/test_op_coverage.py) --

def all_op_kinds() -> list:
    """Every op kind of the graph IR (``ops.OP_SPECS``, assembled from the family modules)."""
    from .ops import OP_SPECS
    return sorted(OP_SPECS)


def engine_op_kinds(eng) -> "dict | None":
    """{op kind: None | reason} for ``eng`` (an Engine or its name): its ``op_kinds()``."""
    from .engines.base import REGISTRY as _reg
    if isinstance(eng, str):
        eng = _reg.engines[eng]
    kinds = eng.op_kinds()
    return None if kinds is None else dict(kinds)


def op_coverage(place: str = "gpu") -> list:
    """One row per engine of ``ORDER[place]`` then the others registered: name, places, ``usable``
    (None, or why not on this machine), ``kinds`` {kind: None | reason} (None when undeclared)."""
    names = list(ORDER.get(place, ())) + [n for n in REGISTRY.engines if n not in ORDER.get(place, ())]
    rows = []
    for n in names:
        eng = REGISTRY.engines.get(n)
        if eng is None:
            continue
        try:
            why = eng.available()
        except Exception as e:  # noqa: BLE001 - an engine's probe must not break a report
            why = f"{type(e).__name__}: {e}"
        if why is None and place not in eng.places:
            why = f"runs on the {'/'.join(eng.places)} place only"
        try:
            kinds = engine_op_kinds(eng)
        except Exception as e:  # noqa: BLE001
            kinds, why = None, why or f"its op kinds cannot be listed ({type(e).__name__}: {e})"
        rows.append({"engine": n, "places": list(eng.places), "usable": why, "kinds": kinds})
    return rows


def format_op_coverage(rows, kinds=None) -> list:
    """Text lines: per engine, the op kinds it runs on this machine and those it declines, with why."""
    lines = []
    for r in rows:
        head = f"  {r['engine']:<10} [{', '.join(r['places'])}]"
        ks = r["kinds"]
        if ks is None:
            lines.append(head + " does not declare its op kinds")
            continue
        if kinds is not None:
            ks = {k: v for k, v in ks.items() if k in kinds}
        runs = [k for k, v in ks.items() if v is None]
        if r["usable"]:
            lines.append(head + f" runs no op kind here ({r['usable']}); where usable it runs: "
                         + (", ".join(runs) or "none"))
        else:
            lines.append(head + " runs: " + (", ".join(runs) or "none"))
        for k, v in ks.items():
            if v is not None:
                lines.append(f"      declines {k}: {v}")
    return lines
