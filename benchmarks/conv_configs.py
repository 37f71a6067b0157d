"""Engine configs of one convolution, inspected (issue 14 item 4): for each problem and direction,
every config that cuDNN's heuristics modes A, B, FALLBACK and INSTANT list for its backend graph (engine
global index, knobs, notes, workspace, measured time, the kernels it launches), which of them our
autotune times for each legacy algorithm (``configs.select`` + ``configs.tuning_order``), the config
each algorithm's plan got, our Find*Ex result, the real legacy cudnnFind result (with each
algorithm's kernels) and torch's choice (cudnn.benchmark on, TF32 off for fp32).

    python benchmarks/conv_configs.py [--case 3x3_64:bwd_filter ...] [--n 32] [--dtype float32]
                                      [--layout NCHW] [--math FMA_MATH] [--budget 60] [--json PATH]

Cases are LAYER:DIRECTION (LAYER a name of LAYERS or C,K,HW,R,PAD,STRIDE; DIRECTION fwd, bwd_data
or bwd_filter); the default list is the ResNet-50 layers of issue 14 in order of interest, run
until ``--budget`` seconds have passed.  Per config the ``algos`` column has one letter per legacy
algorithm of the direction: T timed by our autotune for that algorithm, c a candidate not timed,
. not a candidate.  Kernel names come from one torch.profiler session per case (marker kernels
between the runs); times are CUDA events on zero-filled scratch buffers (``autotune.time_plans``).
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (CCDT, conv_descriptors, cuda_time, device_name, meta, missing_gpu_stack,  # noqa: E402
                     strides, write_json_file)

try:  # guarded so that --help works without a GPU stack
    import torch  # noqa: E402  (first: its libcudnn is the one cuda.pathfinder then finds loaded)
    import cupy  # noqa: E402
except ImportError as _e:
    torch = cupy = None
    _MISSING = _e

LAYERS = {  # name: C, K, HW, R, pad, stride (ResNet-50 v1.5)
    "stem": (3, 64, 224, 7, 3, 2),
    "3x3_64": (64, 64, 56, 3, 1, 1),
    "1x1_256_64": (256, 64, 56, 1, 0, 1),
    "1x1_64_256": (64, 256, 56, 1, 0, 1),
    "3x3_128_s2": (128, 128, 56, 3, 1, 2),
    "3x3_256_14": (256, 256, 14, 3, 1, 1),
    "3x3_512_7": (512, 512, 7, 3, 1, 1),
    "1x1_1024_256": (1024, 256, 14, 1, 0, 1),
}
DEFAULT_CASES = ("3x3_64:bwd_filter", "3x3_64:bwd_data", "stem:bwd_filter", "1x1_256_64:bwd_filter",
                 "1x1_256_64:bwd_data", "3x3_64:fwd", "stem:fwd", "3x3_512_7:bwd_filter", "1x1_1024_256:bwd_data")
QUICK_CASES = ("3x3_64:bwd_filter",)
DIRS = {"fwd": ("FWD", "Forward"), "bwd_data": ("BWD_DATA", "BackwardData"),
        "bwd_filter": ("BWD_FILTER", "BackwardFilter")}
FIND_WORKSPACE = 256 << 20  # what examples/resnet50_legacy.py offers Find*Ex


class Case:
    def __init__(self, text, n, dtype, layout, math):
        layer, _, d = text.partition(":")
        if d not in DIRS:
            raise SystemExit(f"case {text!r}: direction must be one of {', '.join(DIRS)}")
        vals = LAYERS.get(layer) or tuple(int(v) for v in layer.split(","))
        c, k, hw, r, pad, stride = vals
        p = 1 + (hw + 2 * pad - r) // stride
        self.name, self.dir, self.dtype, self.layout, self.math, self.n = layer, d, dtype, layout, math, n
        self.xd, self.wd, self.yd = (n, c, hw, hw), (k, c, r, r), (n, k, p, p)
        self.pad, self.stride = (pad, pad), (stride, stride)
        self.flops = 2.0 * n * k * p * p * c * r * r

    def title(self):
        return (f"{self.dir} {self.name} x{self.xd} w{self.wd} y{self.yd} pad {self.pad[0]} stride {self.stride[0]} "
                f"{self.dtype} {self.layout} {self.math}")


def buffers(case):
    def rand(dims):
        return (cupy.random.standard_normal(dims, dtype=cupy.float32) * 0.5).astype(case.dtype)
    return rand(case.xd), rand(case.wd), rand(case.yd)


def kernel_names(fns):
    """[[kernel names] per fn] from one torch.profiler session (a marker kernel, bitwise_not on an
    int tensor, between the runs), or a string saying why not."""
    try:
        from torch.profiler import ProfilerActivity, profile
        marker = torch.zeros(1, device="cuda", dtype=torch.int32)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for fn in fns:
                marker.bitwise_not_()
                torch.cuda.synchronize()
                fn()
                torch.cuda.synchronize()
            marker.bitwise_not_()
            torch.cuda.synchronize()
        evs = sorted((e for e in prof.events() if "CUDA" in str(getattr(e, "device_type", ""))),
                     key=lambda e: e.time_range.start)
        out, cur = [], None
        for e in evs:
            if "bitwise_not" in e.name:
                if cur is not None:
                    out.append(cur)
                cur = []
            elif cur is not None:
                cur.append(e.name)
        return out if len(out) == len(fns) else f"{len(out)} marker intervals for {len(fns)} runs"
    except Exception as e:  # noqa: BLE001 - a diagnostic goes on without names
        return f"{type(e).__name__}: {e}"[:200]


def short_kernels(names, width=90):
    if not isinstance(names, list):
        return "?"
    seen = []
    for n in names:
        n = n.replace("void ", "").split("(")[0]
        if n not in seen:
            seen.append(n)
    return (" + ".join(seen) or "-")[:width]


# -- ours: Find*Ex and the plan each algorithm gets -------------------------------------------------------------

class Ours:
    def __init__(self, case, bufs):
        import cudnn_compat as cc
        self.cc, self.case = cc, case
        self.h = cc.cudnnCreate("gpu")
        self.xd, self.yd, self.wd, self.cd = conv_descriptors(case, "CUDNN_" + case.math)
        self.x, self.w, self.y = bufs
        self.ws = cupy.empty(FIND_WORKSPACE, cupy.uint8)

    def legacy_args(self):
        """(first desc, first, second desc, second, out desc, out) in the direction's legacy order."""
        d = self.case.dir
        if d == "fwd":
            return self.xd, self.x, self.wd, self.w, self.yd, self.y
        if d == "bwd_data":
            return self.wd, self.w, self.yd, self.y, self.xd, self.x
        return self.xd, self.x, self.yd, self.y, self.wd, self.w

    def find(self):
        cc = self.cc
        k = DIRS[self.case.dir][1]
        d1, a1, d2, a2, d3, a3 = self.legacy_args()
        n = getattr(cc, f"cudnnGetConvolution{k}AlgorithmMaxCount")(self.h)
        return getattr(cc, f"cudnnFindConvolution{k}AlgorithmEx")(self.h, d1, a1, d2, a2, self.cd, d3, a3, n,
                                                                   self.ws, FIND_WORKSPACE)

    def plans(self, maths):
        """{(algo short name, math value): plan or error string} for every supported algorithm."""
        from cudnn_compat.convolution import api as cnn
        from cudnn_compat.handle import get_handle
        dr = cnn.DIRECTIONS[DIRS[self.case.dir][0]]
        d1, _, d2, _, d3, _ = self.legacy_args()
        call = cnn._conv_call(dr, d1, d2, d3, self.cd)
        h = get_handle(self.h)
        out = {}
        for name in dr.algos():
            why = cnn.unsupported(dr.name, name, call.problem())
            for math in maths:
                if why:
                    out[(name, math)] = f"unsupported: {why}"[:80]
                    continue
                try:
                    out[(name, math)] = cnn._need(h, call, name, math)[1]
                except Exception as e:  # noqa: BLE001
                    out[(name, math)] = f"{type(e).__name__}: {e}"[:120]
        return dr, call, out


# -- the native lists ------------------------------------------------------------------------------------------

def native_configs(spec, device):
    """Every config of modes A, B, FALLBACK, INSTANT: [{cfg, key, modes {mode: rank}, ws, ok, ms, plan}], and the
    objects to release."""
    from cudnn_compat._backend.engines.cudnn_engine import autotune as AT
    from cudnn_compat._backend.engines.cudnn_engine import configs as C
    from cudnn_compat._backend.engines.cudnn_engine import lib as NL
    from cudnn_compat._backend.engines.cudnn_engine.graph import NativeGraph
    handle = NL.handle_for(device, 0)
    ng = NativeGraph(spec, handle)
    rows, by_key, keep = [], {}, []
    for mode in ("A", "B", "FALLBACK", "INSTANT"):
        try:
            listed = C._query(NL, ng.graph, mode)
        except NL.CudnnStatusError as e:
            print(f"  heuristics mode {mode} failed: {e}")
            continue
        for rank, (c, w) in enumerate(listed):
            key = (c.index, c.knobs)
            row = by_key.get(key)
            if row is None:
                row = by_key[key] = dict(cfg=c, key=key, modes={}, ws=w, ok=None, ms=None, plan=None, error=None)
                rows.append(row)
            row["modes"][mode] = rank
    for row in rows:
        try:
            plan, wsz, k = C.execution_plan(NL, handle, ng.graph, row["cfg"])
            keep.append(k)
            row.update(ok=True, plan=plan, plan_ws=wsz)
        except NL.CudnnStatusError as e:
            row.update(ok=False, error=str(e.detail or e)[:100])
            continue
        try:
            row["ms"] = AT.time_plans(spec, [(plan, wsz)], device)[0]
        except Exception as e:  # noqa: BLE001
            row["error"] = f"timing: {type(e).__name__}: {e}"[:100]
    return ng, rows, keep


def tuned_sets(spec, rows, dr, call, math_name):
    """{algo short name: (candidates, timed)} as configs.select + tuning_order decide for our autotune."""
    from cudnn_compat.convolution import api as cnn
    from cudnn_compat._backend.engines.cudnn_engine import autotune as AT
    from cudnn_compat._backend.engines.cudnn_engine import configs as C
    found = [(r["cfg"], r["ws"]) for r in rows if "A" in r["modes"]]
    found = sorted(found, key=lambda cw: next(r["modes"]["A"] for r in rows if r["cfg"] == cw[0]))
    for src in C.TUNE_SOURCES:  # as configs.query(tune=True)
        more = [(r["cfg"], r["ws"]) for r in rows if src in r["modes"]]
        found = C.merge(found, sorted(more, key=lambda cw: next(r["modes"][src] for r in rows if r["cfg"] == cw[0])),
                        any_workspace=True)
    ws = {c: w for c, w in found if w is not None}
    ok = {r["key"]: (r["ok"], r.get("plan_ws", 0)) for r in rows}
    zero = cnn.zero_workspace_algo(dr.name, call.problem())
    out = {}
    for name in dr.algos():
        if cnn.unsupported(dr.name, name, call.problem()):
            continue
        s2 = dataclasses.replace(spec, algo=dr.enum_name(name), zero_workspace=(name == zero), math_type=math_name)
        cands = C.select([c for c, _ in found], s2, ws)
        k = AT.top_k(s2)

        def fin(c, extra):
            good, w = ok.get((c.index, c.knobs), (False, 0))
            if extra and (w > AT.EXTRA_WORKSPACE_CAP or not AT.extra_ok(c)):
                return None
            return True if good else None
        if k is None:  # every config (the default for a plain convolution)
            timed = [c for c, _ in C.tuning_order(cands, AT.FIRST_K, len(cands), fin, every=True)]
        else:
            timed = [c for c, _ in C.tuning_order(cands, k, AT.extra_k(s2, k), fin)] if k > 1 else cands[:1]
        out[name] = ({(c.index, c.knobs) for c in cands}, {(c.index, c.knobs) for c in timed})
    return out


# -- the real legacy library and torch -------------------------------------------------------------------------

class Legacy:
    def __init__(self, case, bufs):
        from cudnn_compat._backend import legacy_cudnn as L
        self.L, self.case = L, case
        self.lh, self.ds = L.Handle(), L.Descs()
        self.tx = self.ds.tensor(case.xd, strides(case.xd, case.layout), case.dtype)
        self.ty = self.ds.tensor(case.yd, strides(case.yd, case.layout), case.dtype)
        self.tw = self.ds.filter(case.wd, case.dtype, nhwc=case.layout == "NHWC")
        self.tc = self.ds.conv(case.pad, case.stride, (1, 1), "CROSS_CORRELATION", "float32", 1, case.math)
        self.x, self.w, self.y = bufs
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._keep = []

    def args(self):
        d = self.case.dir
        return {"fwd": ((self.tx, self.x), (self.tw, self.w), (self.ty, self.y)),
                "bwd_data": ((self.tw, self.w), (self.ty, self.y), (self.tx, self.x)),
                "bwd_filter": ((self.tx, self.x), (self.ty, self.y), (self.tw, self.w))}[d]

    def find(self):
        (d1, _), (d2, _), (d3, _) = self.args()
        k = DIRS[self.case.dir][1]
        return self.L.perf_list(f"cudnnFindConvolution{k}Algorithm", self.lh, d1, d2, self.tc, d3, 16)

    def run_fn(self, algo):
        L = self.L
        (d1, a1), (d2, a2), (d3, a3) = self.args()
        k = DIRS[self.case.dir][1]
        ws = L.workspace_size(f"cudnnGetConvolution{k}WorkspaceSize", self.lh, d1, d2, self.tc, d3, algo)
        buf = cupy.empty(max(ws, 1), cupy.uint8)
        self._keep.append(buf)
        fn = getattr(L.load(), f"cudnnConvolution{k}")
        args = (self.lh.ptr, ctypes.addressof(self.one), d1, a1.data.ptr, d2, a2.data.ptr, self.tc, algo,
                buf.data.ptr, ws, ctypes.addressof(self.zero), d3, a3.data.ptr)
        return lambda: fn(*args)

    def close(self):
        self.ds.destroy()
        self.lh.destroy()


def torch_fn(case):
    import torch.nn.functional as F
    dt = getattr(torch, case.dtype)
    mf = torch.channels_last if case.layout == "NHWC" else torch.contiguous_format
    x = (torch.randn(case.xd, device="cuda", dtype=dt) * 0.5).to(memory_format=mf)
    w = (torch.randn(case.wd, device="cuda", dtype=dt) * 0.5).to(memory_format=mf)
    dy = (torch.randn(case.yd, device="cuda", dtype=dt) * 0.5).to(memory_format=mf)
    if case.dir == "fwd":
        return lambda: F.conv2d(x, w, None, case.stride, case.pad)
    mask = [case.dir == "bwd_data", case.dir == "bwd_filter", False]
    return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, list(case.stride), list(case.pad), [1, 1],
                                                       False, [0, 0], 1, mask)


# -- one case ---------------------------------------------------------------------------------------------------

def ms_str(v):
    return "   -   " if v is None else ("   inf " if v == float("inf") else f"{v:7.3f}")


def run_case(case, out):
    import cudnn_compat as cc
    rec = dict(case=case.name, dir=case.dir, x=case.xd, w=case.wd, y=case.yd, pad=case.pad, stride=case.stride,
               dtype=case.dtype, layout=case.layout, math=case.math)
    print(f"\n=== {case.title()}  ({case.flops / 1e9:.1f} GFLOP)", flush=True)
    bufs = buffers(case)
    ours = Ours(case, bufs)
    mathv = getattr(cc, "CUDNN_" + case.math)
    default = cc.CUDNN_DEFAULT_MATH
    # our Find*Ex, as the example program calls it
    t0 = time.time()
    perfs = ours.find()
    find_s = time.time() - t0
    dr, call, plans = ours.plans(sorted({mathv, default}))
    names = {v: k for k, v in dr.algos().items()}
    rec["ours_find"] = [dict(algo=names.get(p.algo, p.algo), status=p.status, ms=p.time, memory=p.memory,
                             determinism=p.determinism, mathType=p.mathType) for p in perfs]
    print(f"ours Find*Ex ({find_s:.1f} s): " + "; ".join(
        f"{names.get(p.algo, p.algo)} {p.time:.3f} ms ws {p.memory >> 10} KiB math {p.mathType}"
        f"{' ND' if p.determinism == 0 else ''}" for p in perfs if p.status == 0))
    bad = [f"{names.get(p.algo, p.algo)} status {p.status}" for p in perfs if p.status != 0]
    if bad:
        print("  not run: " + ", ".join(bad))
    # the plan (config) each algorithm gets, under the descriptor's math type and DEFAULT_MATH
    rec["ours_plans"] = {}
    spec = None
    print("ours per algorithm (math: chosen config, its tuned ms, configs timed):")
    for (name, math), plan in sorted(plans.items()):
        if isinstance(plan, str):
            line = plan
        else:
            tuned = getattr(plan, "autotune", None) or []
            ms = dict(tuned).get(str(plan.config))
            line = (f"{plan.engine} {plan.config} {sorted(plan.config.notes)} ws {plan.workspace_size >> 10} KiB "
                    f"tuned {ms_str(ms)} ms of {len(tuned)}")
            if spec is None and plan.engine == "cudnn":
                spec = plan.spec
            rec["ours_plans"][f"{name}/{math}"] = dict(engine=plan.engine, config=str(plan.config), ms=ms,
                                                       timed=len(tuned), notes=sorted(plan.config.notes))
        print(f"  {name:18s} math {math}: {line}")
    # the native lists
    device = cupy.cuda.runtime.getDevice()
    rows, ng, keep = [], None, []
    if spec is not None:
        ng, rows, keep = native_configs(spec, device)
        sets = tuned_sets(spec, rows, dr, call, case.math)
        algos = [a for a in dr.algos() if a in sets]
    else:
        print("  no cudnn-engine plan: no native lists")
        sets, algos = {}, []
    # kernels: native configs that ran, legacy algorithms, torch
    leg = Legacy(case, bufs)
    try:
        lperf = leg.find()
    except Exception as e:  # noqa: BLE001
        lperf, rec["legacy_error"] = [], f"{type(e).__name__}: {e}"[:200]
    tf = torch_fn(case)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = case.math != "FMA_MATH"
    try:
        t_ms = cuda_time(tf, iters=10, reps=3, warm=3, events="torch")["ms"]
    except Exception as e:  # noqa: BLE001
        t_ms, rec["torch_error"] = None, f"{type(e).__name__}: {e}"[:200]
    fns, labels = [], []
    from cudnn_compat._backend.engines.cudnn_engine import lib as NL
    handle = NL.handle_for(device, 0)
    for r in rows:
        if r["ok"] and r["ms"] not in (None, float("inf")):
            fns.append(_native_exec(spec, r["plan"], r.get("plan_ws", 0), handle))
            labels.append(("cfg", r["key"]))
    for p in lperf:
        fns.append(leg.run_fn(p["algo"]))
        labels.append(("legacy", p["algo"]))
    fns.append(tf)
    labels.append(("torch", None))
    kn = kernel_names(fns)
    knames = dict(zip(labels, kn)) if isinstance(kn, list) else {}
    if not isinstance(kn, list):
        print(f"  kernel names unavailable: {kn}")
    # the table
    if rows:
        short = {a: a.replace("ALGO_", "").replace("WINOGRAD_NONFUSED", "WN").replace("WINOGRAD", "W")
                 .replace("FFT_TILING", "FT").replace("IMPLICIT_PRECOMP_GEMM", "IPG").replace("IMPLICIT_GEMM", "IG")
                 for a in algos}
        print(f"native configs ({len(rows)}: A {sum('A' in r['modes'] for r in rows)}, B "
              f"{sum('B' in r['modes'] for r in rows)}, FALLBACK {sum('FALLBACK' in r['modes'] for r in rows)}); "
              f"algos column: {' '.join(short[a] for a in algos)}")
        width = max(len(algos), 5)
        print(f"  {'config':34s} {'A':>3s} {'B':>3s} {'FB':>3s} {'ws KiB':>9s} {'ms':>7s} {'algos':{width}s} "
              f"notes | kernels")
        for r in sorted(rows, key=lambda r: (r["ms"] is None, r["ms"] if r["ms"] is not None else 0)):
            c = r["cfg"]
            flags = "".join("T" if r["key"] in sets[a][1] else ("c" if r["key"] in sets[a][0] else ".")
                            for a in algos)
            notes = ",".join(sorted(n for n in c.notes if n not in ("FALLBACK",)))
            ws = r.get("plan_ws", r["ws"])
            wtxt = "?" if ws is None else str(ws >> 10)
            mode = [str(r["modes"].get(m, "")) for m in ("A", "B", "FALLBACK")]
            tail = r["error"] or short_kernels(knames.get(("cfg", r["key"])))
            print(f"  {str(c)[:34]:34s} {mode[0]:>3s} {mode[1]:>3s} {mode[2]:>3s} {wtxt:>9s} {ms_str(r['ms'])} "
                  f"{flags:{width}s} {notes} | {tail}")
            rec.setdefault("native", []).append(dict(config=str(c), modes=r["modes"], ws=ws, ms=r["ms"],
                                                     notes=sorted(c.notes), algos=flags, error=r["error"],
                                                     kernels=knames.get(("cfg", r["key"]))))
    # legacy and torch
    lnames = {v: k for k, v in dr.algos().items()}
    print("legacy cudnnFind: " + ("; ".join(
        f"{lnames.get(p['algo'], p['algo'])} {p['time']:.3f} ms ws {p['memory'] >> 10} KiB math {p['mathType']}"
        f"{' ND' if p['determinism'] == 0 else ''} [{short_kernels(knames.get(('legacy', p['algo'])), 60)}]"
        for p in lperf) or rec.get("legacy_error", "nothing")))
    rec["legacy_find"] = [dict(p, algo=lnames.get(p["algo"], p["algo"]),
                               kernels=knames.get(("legacy", p["algo"]))) for p in lperf]
    print(f"torch (benchmark): {ms_str(t_ms)} ms [{short_kernels(knames.get(('torch', None)))}]")
    rec["torch_ms"], rec["torch_kernels"] = t_ms, knames.get(("torch", None))
    # summary: what each side would pick
    ok_rows = [r for r in rows if r["ms"] not in (None, float("inf"))]
    from cudnn_compat._backend.engines.cudnn_engine import configs as C
    allowed = [r for r in ok_rows if C.allowed_by_math(r["cfg"].notes, case.math, case.dtype)]
    best_nat = min(allowed, key=lambda r: r["ms"], default=None)
    best_ours = min((p for p in perfs if p.status == 0), key=lambda p: p.time, default=None)
    same = [p for p in perfs if p.status == 0 and p.mathType == mathv]
    best_same = min(same, key=lambda p: p.time, default=None)
    best_leg = min(lperf, key=lambda p: p["time"], default=None)
    summ = dict(
        torch_ms=t_ms,
        legacy_best=(lnames.get(best_leg["algo"]), best_leg["time"]) if best_leg else None,
        ours_find_best=(names.get(best_ours.algo), best_ours.time, best_ours.mathType) if best_ours else None,
        ours_find_best_same_math=(names.get(best_same.algo), best_same.time) if best_same else None,
        native_best_allowed=(str(best_nat["cfg"]), best_nat["ms"]) if best_nat else None)
    rec["summary"] = summ
    print("SUMMARY " + f"{case.dir} {case.name}: torch {ms_str(t_ms)} | legacy best "
          + (f"{summ['legacy_best'][0]} {summ['legacy_best'][1]:.3f}" if best_leg else "-")
          + " | ours Find best " + (f"{summ['ours_find_best'][0]} {best_ours.time:.3f} (math {best_ours.mathType})"
                                    if best_ours else "-")
          + f" | ours best with math {mathv} (what the example keeps) "
          + (f"{best_same.time:.3f} {names.get(best_same.algo)}" if best_same else "-")
          + " | best native config allowed by the math "
          + (f"{best_nat['cfg']} {best_nat['ms']:.3f}" if best_nat else "-"), flush=True)
    out.append(rec)
    for k in keep:
        for d in reversed(k):
            d.destroy()
    if ng is not None:
        ng.destroy()
    leg.close()
    cc.plan_cache_clear()


def _native_exec(spec, plan, wsz, handle):
    """One execute of a finalized native plan on scratch buffers (for the kernel names)."""
    from cudnn_compat._backend.engines.cudnn_engine import autotune as AT
    from cudnn_compat._backend.engines.cudnn_engine import lib as NL
    bufs, uids, ptrs = AT.scratch_bindings(spec)
    ws = cupy.empty(max(wsz, 1), cupy.uint8)
    execute = NL.load().cudnnBackendExecute

    def run():
        vp = NL.Descriptor("VARIANT_PACK")
        try:
            vp.set("VARIANT_PACK_UNIQUE_IDS", "INT64", uids)
            vp.set("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", ptrs)
            vp.set("VARIANT_PACK_WORKSPACE", "VOID_PTR", ws.data.ptr)
            vp.finalize()
            execute(handle, plan.ptr, vp.ptr)
        finally:
            vp.destroy()
    run.keep = (bufs, ws)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", help="LAYER:DIRECTION (repeatable; default: issue 14's list)")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=sorted(CCDT))
    ap.add_argument("--layout", default="NCHW", choices=("NCHW", "NHWC"))
    ap.add_argument("--math", default="FMA_MATH",
                    choices=("DEFAULT_MATH", "TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION", "FMA_MATH"))
    ap.add_argument("--budget", type=float, default=120.0, help="seconds: no new case starts after this")
    ap.add_argument("--quick", action="store_true", help="one case")
    ap.add_argument("--json", default=None, help="write the records to this file")
    args = ap.parse_args()
    if cupy is None:
        sys.exit(missing_gpu_stack(__file__, _MISSING))
    cases = args.case or (QUICK_CASES if args.quick else DEFAULT_CASES)
    print(f"{device_name()}; cases: {', '.join(cases)}", flush=True)
    t0, out = time.time(), []
    for text in cases:
        if time.time() - t0 > args.budget:
            print(f"\n(budget of {args.budget:.0f} s spent: {text} and later cases not run)")
            break
        try:
            run_case(Case(text, args.n, args.dtype, args.layout, args.math), out)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            import traceback
            print(f"case {text} failed: {type(e).__name__}: {e}")
            traceback.print_exc(limit=4)
    print(f"\n{len(out)} cases in {time.time() - t0:.1f} s", flush=True)
    if args.json:
        write_json_file(args.json, dict(meta=meta(n=args.n, dtype=args.dtype, layout=args.layout, math=args.math),
                                        cases=out))
        print("wrote", args.json)


if __name__ == "__main__":
    main()
