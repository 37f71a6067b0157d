"""``cudnn-compat explain TRACE``: after the fact, what ``CUDNN_COMPAT_LOG=info`` says live
(docs/tools.md "Explain"; cuDNN 8 users' complaint that the backend API is hard to debug).

For each call signature (plan-cache key) of a trace recorded by ``tools/trace.py``: the functions that
used it and how often, the graph built, the engines in heuristics order with the plain-language
reason each one declined, the engine config chosen and its workspace.  Failed calls are listed
with their status and message (graph finalize errors name the check that failed), and calls a
``fuse()`` block deferred are counted.  A GPU call that ran on the CPU reference engine is marked
as a CPU fallback (``CUDNN_COMPAT_CPU_FALLBACK``), an engine that failed at execute is named with
its error (the traceback is in the ``cudnn_compat`` log), and the op kinds of the trace's GPU-place
calls are listed per engine as this machine runs them (``cudnn-compat doctor --ops`` lists every kind).
"""
from __future__ import annotations

import re
from collections import OrderedDict


def _engine_of(name: str) -> str:
    """'cudnn#45[...]' / 'cudnn' -> 'cudnn'."""
    m = re.match(r"[^#\[]+", name)
    return m.group(0) if m else name


def signatures(trace) -> "OrderedDict":
    """sig -> {'first': run with graph/declines, 'calls': [(seq, function)], 'configs': {config: n}}."""
    out: OrderedDict = OrderedDict()
    for c in trace.calls:
        for run in c.get("runs", []):
            sig = run.get("sig")
            if sig is None:
                continue
            s = out.setdefault(sig, {"first": None, "calls": [], "configs": OrderedDict()})
            if s["first"] is None and "graph" in run:
                s["first"] = run
            s["calls"].append((c["seq"], c["function"]))
            cfg = run.get("config", "?")
            s["configs"][cfg] = s["configs"].get(cfg, 0) + 1
    return out


def explain_signature(sig: str, s: dict) -> list:
    first = s["first"] or {}
    fns = OrderedDict()
    for _seq, fn in s["calls"]:
        fns[fn] = fns.get(fn, 0) + 1
    calls = ", ".join(f"{fn} x{n}" for fn, n in fns.items())
    lines = [f"signature {sig}: {calls} (first at call #{s['calls'][0][0]}, place {first.get('place', '?')})"]
    graph = first.get("graph")
    if graph:
        lines += ["  " + ln for ln in graph.splitlines()]
    else:
        lines.append("  (the graph was recorded under another signature line of this trace)")
    order = list(first.get("order") or [])
    declines = first.get("declines") or []
    chosen = first.get("config", "?")
    by_engine: OrderedDict = OrderedDict()
    for name, reason in declines:
        by_engine.setdefault(_engine_of(name), []).append((name, reason))
    for eng in by_engine:
        if eng not in order:
            order.append(eng)
    chosen_engine = first.get("engine", _engine_of(chosen))
    if chosen_engine not in order:
        order.append(chosen_engine)
    lines.append(f"  engines in heuristics order ({', '.join(order)}):")
    seen_chosen = False
    for k, eng in enumerate(order, 1):
        entries = by_engine.get(eng, [])
        for name, reason in entries:
            label = name if name != eng else eng
            lines.append(f"    {k}. {eng:<10} declined" + (f" ({label})" if label != eng else "") + f": {reason}")
        if eng == chosen_engine and not seen_chosen:
            seen_chosen = True
            lines.append(f"    {k}. {eng:<10} chosen: {chosen} (workspace {first.get('workspace', 0)} bytes)")
        elif not entries and not seen_chosen:
            lines.append(f"    {k}. {eng:<10} (no decline recorded)")
        elif not entries:
            lines.append(f"    {k}. {eng:<10} not tried: an earlier engine was chosen")
    lines.append(f"  config chosen: {chosen}" + (f", math type {first['math_type']}" if first.get("math_type") else ""))
    failed = [(_engine_of(n), r) for n, r in declines if str(r).startswith("failed at execute")]
    for eng, reason in failed:
        lines.append(f"  ENGINE FAILURE: {eng} {reason} (a bug: the traceback is in the cudnn_compat log)")
    if first.get("place") == "gpu" and chosen_engine == "reference" \
            and any(e != "reference" for e in first.get("order") or ()):  # not forced by CUDNN_COMPAT_ENGINE
        lines.append(f"  CPU FALLBACK: no GPU engine ran op kinds {', '.join(graph_kinds(graph or '')) or '?'}; the "
                     f"call ran on the CPU reference engine (a CpuFallbackWarning; CUDNN_STATUS_NOT_SUPPORTED under "
                     f"CUDNN_COMPAT_CPU_FALLBACK=0)")
    if len(s["configs"]) > 1:
        lines.append("  configs over the trace: " + ", ".join(f"{c} x{n}" for c, n in s["configs"].items())
                     + " (an engine failed at execute and the planner fell back)")
    return lines


def graph_kinds(graph_text: str) -> list:
    """The op kinds of a graph as ``OperationGraph.describe`` wrote it."""
    return list(dict.fromkeys(re.findall(r"^\s*\[\d+\] (\w+)\(", graph_text, re.M)))


def op_kinds_section(kinds) -> list:
    """Per engine, which of ``kinds`` it runs on this machine and why it declines the others."""
    try:
        from cudnn_compat._backend import heuristics
        rows = heuristics.op_coverage("gpu")
    except Exception as e:  # noqa: BLE001 - explain still prints the trace
        return [f"op kinds by engine: cannot be listed here ({type(e).__name__}: {e})"]
    return [f"op kinds of this trace by engine, on this machine ({', '.join(kinds)}):"] + \
        heuristics.format_op_coverage(rows, set(kinds))


def explain(trace) -> str:
    sigs = signatures(trace)
    n_calls = len(trace.calls)
    errors = [c for c in trace.calls if c.get("status") not in (None, "CUDNN_STATUS_SUCCESS")]
    deferred = [c for c in trace.calls if c.get("deferred")]
    lines = [f"trace {trace.path}: {n_calls} legacy call(s), {len(sigs)} graph signature(s)"
             + (f", {len(errors)} failed" if errors else "") + (f", {len(deferred)} deferred by fuse()" if deferred else "")]
    for sig, s in sigs.items():
        lines.append("")
        lines += explain_signature(sig, s)
    # GPU-place signatures: which engine runs their op kinds here (a CPU trace runs on the reference engine)
    kinds = list(dict.fromkeys(k for s in sigs.values() if (s["first"] or {}).get("place") == "gpu"
                               for k in graph_kinds((s["first"] or {}).get("graph") or "")))
    if kinds:
        lines.append("")
        lines += op_kinds_section(kinds)
    if errors:
        lines.append("")
        lines.append("failed calls:")
        for c in errors:
            lines.append(f"  #{c['seq']} {c['function']}: {c.get('error') or c.get('status')}")
    return "\n".join(lines)
