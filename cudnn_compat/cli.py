"""The ``cudnn-compat`` command (architecture.md "cudnn-compat doctor / demo").

  cudnn-compat doctor [--json]   what is installed and usable here: Python, NumPy, CuPy, the GPU,
                                 libcudnn (located with cuda.pathfinder), and every engine
  cudnn-compat demo [--place P]  a small legacy-style network on the default place, checked
                                 against the CPU reference; exit 1 when an op is off
  cudnn-compat replay TRACE --engine reference|cupy|cudnn|legacy|default [--tol DTYPE[:MATH]=RTOL,ATOL]
                                 re-run a trace recorded with tensors (CUDNN_COMPAT_TRACE=path,
                                 CUDNN_COMPAT_TRACE_TENSORS=1) and compare every output with the
                                 recording; exit 1 over tolerance, 2 when it cannot replay
  cudnn-compat diff A B          compare two traces call by call; exit 1 when they differ
  cudnn-compat explain TRACE     per call signature: the graph, the engines in heuristics order
                                 with the reason each declined, the config chosen
  cudnn-compat bench [NAME...]   run the benchmark scripts under benchmarks/ (conv, memory_bound,
                                 fusion) on the GPU and print their tables; exit 2 without a GPU

``python -m cudnn_compat`` is the same command.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys


def _version_of(module: str):
    """(version, None) or (None, why the module is not importable)."""
    try:
        mod = __import__(module)
    except Exception as e:  # ImportError, or a broken install raising something else
        return None, f"{type(e).__name__}: {e}"
    return getattr(mod, "__version__", "?"), None


def _gpu():
    from ._place import gpu_reason
    why = gpu_reason()
    if why:
        return None, why
    try:
        import cupy
        dev = cupy.cuda.runtime.getDevice()
        name = cupy.cuda.runtime.getDeviceProperties(dev)["name"]
        return f"{name.decode() if isinstance(name, bytes) else name} (device {dev})", None
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


def _libcudnn():
    """{'path', 'version', 'found_via'} or {'reason'}: libcudnn located with cuda.pathfinder."""
    try:
        from cuda import pathfinder
    except Exception as e:
        return {"reason": f"cuda.pathfinder is not importable ({type(e).__name__}: {e}); "
                          "install cuda-pathfinder (or cuda-python) and nvidia-cudnn-cu12/-cu13"}
    try:
        loaded = pathfinder.load_nvidia_dynamic_lib("cudnn")
    except Exception as e:
        return {"reason": f"cuda.pathfinder could not load cudnn ({type(e).__name__}: {e})"}
    out = {"path": loaded.abs_path, "found_via": getattr(loaded, "found_via", "cuda.pathfinder")}
    try:
        lib = ctypes.CDLL(loaded.abs_path) if loaded.abs_path else None
        if lib is not None:
            lib.cudnnGetVersion.restype = ctypes.c_size_t
            out["version"] = int(lib.cudnnGetVersion())
    except Exception as e:
        out["version_error"] = f"{type(e).__name__}: {e}"
    return out


def _engines() -> list:
    from _backend import REGISTRY
    from ._place import default_place
    place = default_place()
    rows = []
    for name, eng in REGISTRY.engines.items():
        try:
            why = eng.available()
        except Exception as e:  # an engine's probe must not break the doctor
            why = f"{type(e).__name__}: {e}"
        if why is None and place not in eng.places:
            why = f"runs on the {'/'.join(eng.places)} place, the default place here is {place}"
        rows.append({"engine": name, "places": list(eng.places), "usable": why is None, "reason": why})
    return rows


def doctor_report() -> dict:
    import cudnn_compat as cc
    from ._place import default_place
    numpy_v, numpy_why = _version_of("numpy")
    cupy_v, cupy_why = _version_of("cupy")
    gpu, gpu_why = _gpu()
    return {
        "cudnn_compat": cc.__version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "numpy": {"version": numpy_v, "reason": numpy_why},
        "cupy": {"version": cupy_v, "reason": cupy_why},
        "gpu": {"name": gpu, "reason": gpu_why},
        "default_place": default_place(),
        "CUDNN_COMPAT_DEVICE": os.environ.get("CUDNN_COMPAT_DEVICE"),
        "CUDNN_COMPAT_ENGINE": os.environ.get("CUDNN_COMPAT_ENGINE"),
        "libcudnn": _libcudnn(),
        "legacy_functions": len(cc.LEGACY),
        "reported_version": cc.cudnnGetVersion(),
        "engines": _engines(),
    }


def _either(d: dict, key: str) -> str:
    return str(d[key]) if d.get(key) else f"absent: {d.get('reason')}"


def format_doctor(r: dict) -> str:
    lib = r["libcudnn"]
    if "path" in lib:
        libline = f"{lib['path']} (version {lib.get('version', lib.get('version_error', '?'))}, found via {lib['found_via']})"
    else:
        libline = f"absent: {lib['reason']}"
    lines = [
        f"cudnn-compat    {r['cudnn_compat']} ({r['legacy_functions']} legacy functions; reports cuDNN {r['reported_version']})",
        f"python          {r['python']['version']} ({r['python']['executable']})",
        f"numpy           {_either(r['numpy'], 'version')}",
        f"cupy            {_either(r['cupy'], 'version')}",
        f"gpu             {_either(r['gpu'], 'name')}",
        f"default place   {r['default_place']}"
        + (f" (CUDNN_COMPAT_DEVICE={r['CUDNN_COMPAT_DEVICE']})" if r["CUDNN_COMPAT_DEVICE"] else ""),
        f"libcudnn        {libline}",
        "engines" + (f" (CUDNN_COMPAT_ENGINE={r['CUDNN_COMPAT_ENGINE']} forces one)" if r["CUDNN_COMPAT_ENGINE"] else ""),
    ]
    for e in r["engines"]:
        state = "usable" if e["usable"] else f"not usable: {e['reason']}"
        lines.append(f"  {e['engine']:<12} [{', '.join(e['places'])}] {state}")
    return "\n".join(lines)


def doctor(args) -> int:
    report = doctor_report()
    print(json.dumps(report, indent=2) if args.json else format_doctor(report))
    return 0


def demo(args) -> int:
    from . import demo as net
    missing = net.missing_functions()
    if missing:
        print("cudnn-compat demo: cannot run yet; these legacy functions are not registered "
              f"(their families have not landed): {', '.join(missing)}", file=sys.stderr)
        return 2
    from ._place import default_place
    place = args.place or default_place()
    rows = net.run(place, seed=args.seed, rtol=args.rtol)
    print(net.format_table(rows, place))
    bad = [r.op for r in rows if not r.ok]
    if bad:
        print(f"cudnn-compat demo: {len(bad)} op(s) off the reference: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def replay_cmd(args) -> int:
    from . import replay as R
    try:
        trace = R.load(args.trace)
        overrides = R.parse_tolerances(args.tol)
    except (OSError, ValueError) as e:
        print(f"cudnn-compat replay: {e}", file=sys.stderr)
        return 2
    if trace.npz is None:
        print(f"cudnn-compat replay: {args.trace} was recorded without tensors; record it with "
              "CUDNN_COMPAT_TRACE_TENSORS=1 (or trace(path, tensors=True)) to replay it", file=sys.stderr)
        return 2
    try:
        results = R.replay(trace, args.engine, overrides)
    except RuntimeError as e:
        print(f"cudnn-compat replay: {e}", file=sys.stderr)
        return 2
    text = R.format_replay(results, args.engine)
    print(text.splitlines()[-1] if args.quiet else text)
    return R.exit_code(results)


def diff_cmd(args) -> int:
    from . import replay as R
    try:
        a, b = R.load(args.a), R.load(args.b)
        overrides = R.parse_tolerances(args.tol)
    except (OSError, ValueError) as e:
        print(f"cudnn-compat diff: {e}", file=sys.stderr)
        return 2
    text, code = R.diff(a, b, overrides)
    print(text)
    return code


def explain_cmd(args) -> int:
    from . import explain as E, replay as R
    try:
        trace = R.load(args.trace)
    except (OSError, ValueError) as e:
        print(f"cudnn-compat explain: {e}", file=sys.stderr)
        return 2
    print(E.explain(trace))
    return 0


BENCHMARKS = ("conv", "memory_bound", "fusion")


def bench_dir() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def bench(args) -> int:
    """Run benchmarks/bench_<name>.py for each name (default: every one that exists), streaming their
    tables; they write JSON to benchmarks/results/.  Exit 2 without a GPU, 1 when a script fails."""
    import subprocess
    from ._place import gpu_reason
    why = gpu_reason()
    if why:
        print(f"cudnn-compat bench: the benchmarks need a CUDA GPU with CuPy; here: {why}", file=sys.stderr)
        return 2
    root = bench_dir()
    names = args.names or [n for n in BENCHMARKS if os.path.exists(os.path.join(root, f"bench_{n}.py"))]
    if not names:
        print(f"cudnn-compat bench: no benchmark scripts under {root} (run from a source checkout)", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        script = os.path.join(root, f"bench_{name}.py")
        if not os.path.exists(script):
            print(f"cudnn-compat bench: no benchmark {name!r} ({script} does not exist)", file=sys.stderr)
            failed.append(name)
            continue
        cmd = [sys.executable, script] + (["--quick"] if args.quick else [])
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        rc = subprocess.call(cmd, cwd=os.path.dirname(root))
        if rc:
            print(f"cudnn-compat bench: {name} exited with {rc}", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cudnn-compat", description="cuDNN's legacy API on a graph layer: tools")
    sub = p.add_subparsers(dest="command", metavar="command")
    d = sub.add_parser("doctor", help="what is installed and usable here")
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.set_defaults(fn=doctor)
    m = sub.add_parser("demo", help="run a small legacy-style network and check it against the CPU reference")
    m.add_argument("--place", choices=("cpu", "gpu"), help="where to run it (default: the default place)")
    m.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights")
    m.add_argument("--rtol", type=float, default=5e-3,
                   help="an op fails when its max abs error exceeds rtol*max(1, max|reference|) (default 5e-3)")
    m.set_defaults(fn=demo)
    s = sub.add_parser("install-shim", help="write cudnn_compat_shim.pth: CUDNN_COMPAT_SHIM=1 then installs the "
                                            "cupy.cuda.cudnn / cupyx.cudnn shim at interpreter start (see shim.py)")
    s.add_argument("--remove", action="store_true", help="delete the .pth instead")
    s.add_argument("--dir", help="directory to write it to (default: the site-packages holding cudnn_compat)")
    s.set_defaults(fn=lambda args: __import__("cudnn_compat.shim").shim.cli_install_shim(args))
    _add_trace_commands(sub)
    return p


def _add_trace_commands(sub) -> None:
    """replay, diff, explain (record/replay tools, issue 9) and bench."""
    from .replay import ENGINES
    r = sub.add_parser("replay", help="re-run a recorded trace on an engine and compare with the recording")
    r.add_argument("trace", help="a trace written with CUDNN_COMPAT_TRACE (and CUDNN_COMPAT_TRACE_TENSORS=1)")
    r.add_argument("--engine", choices=ENGINES, default="reference",
                   help="reference (CPU), cupy or cudnn (GPU, forced), legacy (the real libcudnn function), "
                        "default (the recording's place and heuristics)")
    r.add_argument("--tol", action="append", metavar="DTYPE[:MATH]=RTOL,ATOL",
                   help="override a tolerance, e.g. float16=2e-2,2e-2 or float32:FMA_MATH=1e-6,1e-6")
    r.add_argument("--quiet", action="store_true", help="print the summary only")
    r.set_defaults(fn=replay_cmd)
    f = sub.add_parser("diff", help="compare two traces call by call")
    f.add_argument("a")
    f.add_argument("b")
    f.add_argument("--tol", action="append", metavar="DTYPE[:MATH]=RTOL,ATOL")
    f.set_defaults(fn=diff_cmd)
    e = sub.add_parser("explain", help="graphs, engine choices and decline reasons of a recorded trace")
    e.add_argument("trace")
    e.set_defaults(fn=explain_cmd)
    b = sub.add_parser("bench", help="run the GPU benchmark scripts under benchmarks/ and print their tables")
    b.add_argument("names", nargs="*", metavar="NAME", help=f"which: {', '.join(BENCHMARKS)} (default: all that exist)")
    b.add_argument("--quick", action="store_true", help="pass --quick to each script")
    b.set_defaults(fn=bench)


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not getattr(args, "fn", None):
        p.print_help(sys.stderr)
        return 2
    return args.fn(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
