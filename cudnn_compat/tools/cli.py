"""The ``cudnn-compat`` command (docs/tools.md "The command line").

  cudnn-compat doctor [--json] [--ops]
                                 what is installed and usable here: Python, NumPy, CuPy, the GPU,
                                 libcudnn (located with cuda.pathfinder), and every engine; --ops:
                                 the op kinds each engine runs on this machine, and those it declines
  cudnn-compat demo [--place P]  a small legacy-style network on the default place, checked
                                 against the CPU reference; exit 1 when an op is off
  cudnn-compat replay TRACE --engine reference|cupy|cudnn|legacy|default [--tol DTYPE[:MATH]=RTOL,ATOL]
                                 re-run a trace recorded with tensors (CUDNN_COMPAT_TRACE=path,
                                 CUDNN_COMPAT_TRACE_TENSORS=1) and compare every output with the
                                 recording; exit 1 over tolerance, 2 when it cannot replay
  cudnn-compat diff A B          compare two traces call by call; exit 1 when they differ
  cudnn-compat explain TRACE     per call signature: the graph, the engines in heuristics order
                                 with the reason each declined, the config chosen
  cudnn-compat bench [NAME...] [--list] [--quick] [--dir D]
                                 run the benchmark scripts under benchmarks/ of a source checkout
                                 (conv, memory_bound, rnn, fusion, programs, host_overhead,
                                 launch_paths) and print their tables; exit 2 when they cannot run
                                 here (no checkout, no GPU: host_overhead alone runs on the CPU)

``python -m cudnn_compat`` is the same command.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys
import warnings
from dataclasses import dataclass

from ..errors import CuDNNError


def _version_of(module: str):
    """(version, None) or (None, why the module is not importable)."""
    try:
        mod = __import__(module)
    except Exception as e:  # ImportError, or a broken install raising something else
        return None, f"{type(e).__name__}: {e}"
    return getattr(mod, "__version__", "?"), None


def _gpu():
    from .._core.place import gpu_reason
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


# -- libcudnn and the CUDA major version -------------------------------------------------------------

CUDNN_WHEELS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11", "nvidia-cudnn")
EXTRAS = {12: "cuda12", 13: "cuda13"}  # pyproject.toml [project.optional-dependencies]


def _distributions() -> dict:
    """{normalised distribution name: version} of what is installed."""
    from importlib import metadata
    out = {}
    for d in metadata.distributions():
        name = (d.metadata.get("Name") or "").lower().replace("_", "-")
        if name:
            out.setdefault(name, d.version)
    return out


def _driver_version_ctypes() -> "int | None":
    """cuDriverGetVersion of libcuda itself: only when neither CuPy nor cuda-bindings is installed,
    the fresh machine the doctor must advise on (which CUDA extra to install) before either is."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        return v.value if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else None
    except (OSError, AttributeError):
        return None


def _driver_version() -> "int | None":
    """The CUDA version the installed driver supports (e.g. 13000): CuPy's
    ``cupy.cuda.runtime.driverGetVersion``, else cuda-bindings' ``cuDriverGetVersion``, else
    libcuda directly (no CUDA Python package installed yet); None when there is no driver."""
    try:
        import cupy
        return int(cupy.cuda.runtime.driverGetVersion())
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - CuPy present, no driver
        return None
    try:
        try:
            from cuda.bindings import driver
        except ImportError:
            from cuda import cuda as driver  # cuda-python < 12.6
        err, version = driver.cuDriverGetVersion()
        return int(version) if int(err) == 0 else None
    except ImportError:
        return _driver_version_ctypes()
    except Exception:  # noqa: BLE001
        return None


def _driver_cuda_major() -> "int | None":
    """The CUDA major version the installed driver supports, or None."""
    v = _driver_version()
    return v // 1000 if v and v > 0 else None


def cuda_major(dists: "dict | None" = None, driver=_driver_cuda_major) -> tuple:
    """(CUDA major, where it was found) of this environment, or (None, why not).  In order: the
    CUDA of an installed CuPy wheel (cupy-cuda12x), of NVIDIA's CUDA wheels (nvidia-*-cu12, or
    nvidia-cuda-* / cuda-bindings / cuda-python versioned 12.x or 13.x), then the driver's."""
    dists = _distributions() if dists is None else dists
    import re
    found = []
    for name, version in sorted(dists.items()):
        m = re.fullmatch(r"cupy-cuda(\d+)x", name)
        if m:
            found.append((0, int(m.group(1)), f"{name} {version}"))
            continue
        m = re.fullmatch(r"nvidia-.+-cu(\d+)", name)
        if m:
            found.append((1, int(m.group(1)), f"{name} {version}"))
            continue
        if name.startswith("nvidia-cuda-") or name in ("cuda-bindings", "cuda-python"):
            major = re.match(r"(\d+)\.", version or "")
            if major and int(major.group(1)) >= 11:
                found.append((2 if name.startswith("nvidia-") else 3, int(major.group(1)), f"{name} {version}"))
    if found:
        _, major, where = min(found)
        return major, where
    d = driver()
    if d:
        return d, "the NVIDIA driver (libcuda)"
    return None, "no CUDA wheel, CuPy or NVIDIA driver was found"


def install_hint(major: "int | None") -> str:
    if major in EXTRAS:
        return f"pip install 'cudnn-compat[{EXTRAS[major]}]'"
    return "pip install 'cudnn-compat[cuda12]' or 'cudnn-compat[cuda13]' (the one matching your CUDA driver)"


def _system_libcudnn() -> "str | None":
    import ctypes.util
    try:
        return ctypes.util.find_library("cudnn")
    except Exception:  # noqa: BLE001 - ldconfig/gcc missing or failing: nothing found
        return None


def _libcudnn(dists: "dict | None" = None, load=None, system=_system_libcudnn):
    """{'path', 'version', 'found_via'} or {'reason', ...}: libcudnn located with cuda.pathfinder.
    When it cannot be loaded the reason names the cause first: no nvidia-cudnn wheel installed (the
    loader's own complaint about a dependency, e.g. libcublasLt, comes from that) or the dependency
    of an installed wheel that is missing; 'install' is the extra to install for the CUDA found."""
    dists = _distributions() if dists is None else dists
    wheels = {n: dists[n] for n in CUDNN_WHEELS if n in dists}
    major, major_from = cuda_major(dists)
    hint = {"cudnn_wheels": [f"{n} {v}" for n, v in wheels.items()], "cuda_major": major,
            "cuda_major_from": major_from, "install": install_hint(major)}
    if load is None:
        try:
            from cuda import pathfinder
        except Exception as e:
            return {"reason": f"cuda.pathfinder is not importable ({type(e).__name__}: {e}); "
                              f"install the CUDA extra: {hint['install']}", "loader_error": str(e), **hint}
        load = pathfinder.load_nvidia_dynamic_lib
    try:
        loaded = load("cudnn")
    except Exception as e:
        detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        system = system()
        if system and not wheels:
            reason = (f"no nvidia-cudnn wheel is installed and the system {system} could not be loaded ({detail}); "
                      f"or install the wheels: {hint['install']}")
        elif not wheels:
            cuda = f"CUDA {major} (from {major_from})" if major else major_from
            reason = (f"no nvidia-cudnn wheel is installed ({' / '.join(CUDNN_WHEELS[:2])}) and no system libcudnn "
                      f"was found; {cuda}: {hint['install']}")
        else:
            reason = (f"{', '.join(hint['cudnn_wheels'])} is installed but libcudnn could not be loaded ({detail}); "
                      f"its CUDA libraries come with {hint['install']}")
        return {"reason": reason, "loader_error": detail, **hint}
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
    from cudnn_compat._backend import REGISTRY
    from .._core.place import default_place
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


def _configuration() -> list:
    """Every variable of ``_backend.config``: its raw value, the value used, whether it was understood."""
    from cudnn_compat._backend import config
    from cudnn_compat._backend import REGISTRY
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", config.ConfigWarning)  # the doctor reports them itself
        for st in config.report():
            var = config.TABLE[st.name]
            note = st.problem
            if st.name == "CUDNN_COMPAT_ENGINE" and st.value and st.value not in REGISTRY.engines:
                note = f"no engine named {st.value!r} (known: {', '.join(sorted(REGISTRY.engines))}): every graph is NOT_SUPPORTED"
            rows.append({"name": st.name, "scope": var.scope, "set": st.is_set, "raw": st.raw,
                         "value": st.value, "default": var.default, "understood": st.understood, "note": note,
                         "accepts": var.values})
    return rows


def op_report() -> dict:
    """``doctor --ops``: per engine (GPU heuristics order) the op kinds it runs on this machine and the
    reason for each kind it declines; the kinds no GPU engine runs here, and anywhere."""
    from cudnn_compat._backend import heuristics
    rows = heuristics.op_coverage("gpu")
    kinds = heuristics.all_op_kinds()
    gpu = [r for r in rows if "gpu" in r["places"] and r["engine"] != "reference" and r["kinds"] is not None]

    def uncovered(usable_only: bool) -> list:
        return [k for k in kinds if not any(r["kinds"].get(k, "") is None and not (usable_only and r["usable"])
                                            for r in gpu)]
    return {"engines": rows, "kinds": kinds, "without_gpu_engine": uncovered(False),
            "without_gpu_engine_here": uncovered(True)}


def format_ops(r: dict) -> str:
    from cudnn_compat._backend import heuristics
    lines = ["op kinds by engine on this machine (GPU heuristics order; on the CPU place the numpy engine runs "
             "what it has a kernel for, the reference engine the rest):"]
    lines += heuristics.format_op_coverage(r["engines"])
    lines.append("op kinds without a GPU engine (CPU fallback with a CpuFallbackWarning, or NOT_SUPPORTED under "
                 "CUDNN_COMPAT_CPU_FALLBACK=0; docs/not_supported.md): " + (", ".join(r["without_gpu_engine"]) or "none"))
    here = [k for k in r["without_gpu_engine_here"] if k not in r["without_gpu_engine"]]
    gpu = [e for e in r["engines"] if "gpu" in e["places"] and e["engine"] != "reference"]
    if gpu and all(e["usable"] for e in gpu):  # no GPU engine usable: say it once, with why
        lines.append("on this machine no GPU engine is usable (" + "; ".join(f"{e['engine']}: {e['usable']}" for e in gpu)
                     + "): every op kind runs on the CPU reference engine")
    elif here:
        lines.append("also without a usable GPU engine on this machine: " + ", ".join(here))
    return "\n".join(lines)


def doctor_report() -> dict:
    import cudnn_compat as cc
    from cudnn_compat._backend import config, steady
    from .._core.place import default_place
    numpy_v, numpy_why = _version_of("numpy")
    cupy_v, cupy_why = _version_of("cupy")
    gpu, gpu_why = _gpu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", config.ConfigWarning)
        place = default_place()
    return {
        "cudnn_compat": cc.__version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "numpy": {"version": numpy_v, "reason": numpy_why},
        "cupy": {"version": cupy_v, "reason": cupy_why},
        "gpu": {"name": gpu, "reason": gpu_why},
        "default_place": place,
        "CUDNN_COMPAT_DEVICE": config.setting("CUDNN_COMPAT_DEVICE").raw,
        "CUDNN_COMPAT_ENGINE": config.setting("CUDNN_COMPAT_ENGINE").raw,
        "libcudnn": _libcudnn(),
        "legacy_functions": len(cc.LEGACY),
        "compiled": steady.status(),  # the compiled steady path (README "Install"): built, used, why not
        "reported_version": cc.cudnnGetVersion(),
        "engines": _engines(),
        "configuration": _configuration(),
    }


def _either(d: dict, key: str) -> str:
    return str(d[key]) if d.get(key) else f"absent: {d.get('reason')}"


def _config_line(c: dict) -> str:
    default = "unset" if c["default"] is None else repr(c["default"])
    if not c["set"]:
        state = "unset" + ("" if c["default"] is None else f" -> {default}")
    elif not c["understood"]:
        state = f"{c['raw']!r} NOT UNDERSTOOD ({c['note']}) -> the default ({default})"
    else:
        state = f"{c['raw']!r} -> {c['value']!r}" + (f"  ({c['note']})" if c["note"] else "")
    return f"  {c['name']:<30} {state}"


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
        "compiled path   " + ("built, in use" if r["compiled"]["used"] else r["compiled"]["reason"]),
        "engines" + (f" (CUDNN_COMPAT_ENGINE={r['CUDNN_COMPAT_ENGINE']} forces one)" if r["CUDNN_COMPAT_ENGINE"] else ""),
    ]
    for e in r["engines"]:
        state = "usable" if e["usable"] else f"not usable: {e['reason']}"
        lines.append(f"  {e['engine']:<12} [{', '.join(e['places'])}] {state}")
    titles = {"library": "configuration (environment; README \"Environment\")", "tests": "test suite variables",
              "external": "external variables honoured (read-only)"}
    for scope, title in titles.items():
        rows = [c for c in r["configuration"] if c["scope"] == scope]
        if rows:
            lines.append(title)
            lines.extend(_config_line(c) for c in rows)
    bad = [c["name"] for c in r["configuration"] if not c["understood"]]
    if bad:
        lines.append(f"not understood (the default is used): {', '.join(bad)}")
    return "\n".join(lines)


def doctor(args) -> int:
    report = doctor_report()
    if getattr(args, "ops", False):
        report["ops"] = op_report()
    text = format_doctor(report) + ("\n" + format_ops(report["ops"]) if "ops" in report else "")
    print(json.dumps(report, indent=2, default=str) if args.json else text)
    return 0


def demo(args) -> int:
    from . import demo as net
    missing = net.missing_functions()
    if missing:
        print("cudnn-compat demo: cannot run yet; these legacy functions are not registered "
              f"(their families have not landed): {', '.join(missing)}", file=sys.stderr)
        return 2
    from .._core.place import default_place, gpu_reason
    place = args.place or default_place()
    why = gpu_reason() if place == "gpu" else None
    if why:
        how = "--place gpu" if args.place else "the default place (CUDNN_COMPAT_DEVICE=gpu)"
        print(f"cudnn-compat demo: {how} needs a CUDA GPU with CuPy; here: {why} (try --place cpu)", file=sys.stderr)
        return 2
    try:
        rows = net.run(place, seed=args.seed, rtol=args.rtol)
    except CuDNNError as e:  # the setup failed (creating the handle, the descriptors): one line, no traceback
        print(f"cudnn-compat demo: cannot run on the {place} place: {e}", file=sys.stderr)
        return 2
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


@dataclass(frozen=True)
class Benchmark:
    """A script under benchmarks/ that ``cudnn-compat bench`` runs."""
    name: str
    script: str
    what: str
    quick: tuple = ("--quick",)  # the arguments of a --quick run
    gpu: tuple = ()  # arguments on a GPU machine
    cpu: "tuple | None" = None  # arguments without a GPU; None: needs a GPU


BENCHMARKS = (
    Benchmark("conv", "bench_conv.py", "ResNet-50 convolutions: ours vs the real legacy libcudnn vs torch"),
    Benchmark("conv_zoo", "bench_conv_zoo.py", "convolution layer classes (stem, depthwise, grouped, dilated, strided, "
              "1x1): ours vs legacy Find vs torch", quick=("--modes", "fp16", "--budget", "20")),
    Benchmark("memory_bound", "bench_memory_bound.py", "memory-bound calls (tensor ops, BN, pooling, softmax, LRN)"),
    Benchmark("rnn", "bench_rnn.py", "LSTM forward, training and inference"),
    Benchmark("ctc_sampler", "bench_ctc_sampler.py", "CTC loss and the spatial-transformer sampler vs torch and the real legacy calls"),
    Benchmark("fusion", "bench_fusion.py", "a ResNet block: legacy calls one by one vs cudnn_compat.fuse()"),
    Benchmark("fuse_profile", "fuse_profile.py", "a ResNet basic block plain vs fuse(): host time, kernels, the graphs"),
    Benchmark("programs", "bench_programs.py", "whole programs: the ResNet-50 training step and a ResNet block"),
    Benchmark("attention", "bench_attention.py", "multi-head attention forward and backward vs torch nn.MultiheadAttention"),
    Benchmark("host_overhead", "host_overhead.py", "host cost of a cached legacy call, every compute family",
              quick=("--calls", "2000"), gpu=("--place", "gpu"), cpu=("--place", "cpu")),
    Benchmark("launch_paths", "launch_paths.py", "host cost of the ways Python can launch a CUDA kernel",
              quick=("--calls", "2000")),
    Benchmark("cpu", "bench_cpu.py", "the CPU place: ours (the numpy engine) vs torch CPU vs plain NumPy (issue 25)",
              cpu=()),
    Benchmark("conv_configs", "conv_configs.py", "one convolution's native engine configs (modes A/B/FALLBACK) "
              "timed, our autotune's choice, legacy Find and torch"),
    Benchmark("host_step", "host_step.py", "our host cost of the batch-1 ResNet-50 step without a GPU (the emulated "
              "GPU place, stub launches): ms per step, us per call", cpu=()),
    Benchmark("step_split", "step_split.py", "the batch-1 ResNet-50 step's host time on a GPU: the driver's launch "
              "calls (timed by a shim) against the rest (our path, the script)"),
    Benchmark("ab_trees", "ab_trees.py", "source trees against each other on one host: the batch-1 ResNet-50 "
              "step's host issue time, interleaved (default: this checkout alone)"),
)
BENCH_BY_NAME = {b.name: b for b in BENCHMARKS}


def _is_bench_dir(root: str) -> bool:
    return os.path.isfile(os.path.join(root, "_common.py")) and any(
        os.path.isfile(os.path.join(root, b.script)) for b in BENCHMARKS)


def _installed_from() -> "str | None":
    """The source folder ``pip install PATH`` installed the package from (PEP 610's
    direct_url.json of the distribution: a ``file://`` URL), or None."""
    try:
        from importlib import metadata
        from urllib.parse import unquote, urlparse
        info = json.loads(metadata.distribution("cudnn-compat").read_text("direct_url.json") or "{}")
        url = urlparse(info.get("url", ""))
        return unquote(url.path) if url.scheme == "file" and "dir_info" in info else None
    except Exception:  # noqa: BLE001 - not installed, no record, an unreadable record: not known
        return None


def bench_places() -> list:
    """Where ``cudnn-compat bench`` looks for benchmarks/ when --dir is not given, in order: beside
    the package (a source checkout, or an editable install), the current directory's benchmarks/,
    the checkout ``pip install .`` installed the package from."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    places = [os.path.join(here, "benchmarks"), os.path.join(os.getcwd(), "benchmarks")]
    source = _installed_from()
    if source:
        places.append(os.path.join(source, "benchmarks"))
    return list(dict.fromkeys(places))


def bench_dir(explicit: "str | None" = None) -> "str | None":
    """The benchmarks/ folder as an absolute path: ``explicit`` (``--dir``, relative to the current
    directory), else the first of ``bench_places()`` that holds the scripts; None when there is
    none (a wheel has no benchmarks: they are not part of the package)."""
    for root in [explicit] if explicit else bench_places():
        root = os.path.abspath(os.path.expanduser(root))
        if _is_bench_dir(root):
            return root
    return None


def _bench_lookup(name: str) -> "Benchmark | None":
    """A benchmark by its name (conv), its script (bench_conv.py) or the script's stem (bench_conv)."""
    key = name[:-3] if name.endswith(".py") else name
    for b in BENCHMARKS:
        if key in (b.name, b.script[:-3]):
            return b
    return None


def bench(args) -> int:
    """Run the benchmarks named (default: all), streaming their tables; they write JSON to
    benchmarks/results/.  Exit 2 when they cannot run here (no benchmarks/ folder, an unknown
    name, a GPU benchmark without a GPU), 1 when a script fails."""
    import subprocess
    from .._core.place import gpu_reason
    root = bench_dir(args.dir)
    if root is None:
        where = f"--dir {args.dir} holds no benchmark scripts" if args.dir else \
            f"no benchmarks/ folder in {', '.join(bench_places())}"
        print(f"cudnn-compat bench: {where}; the benchmark scripts are not installed with the package: run this "
              "in a source checkout of cudnn-compat or pass --dir PATH/TO/benchmarks", file=sys.stderr)
        return 2
    if args.list:
        print(f"benchmarks under {root}:")
        for b in BENCHMARKS:
            found = os.path.isfile(os.path.join(root, b.script))
            need = "GPU" if b.cpu is None else "GPU or CPU"
            print(f"  {b.name:<14} {b.script:<22} {need:<11} {'' if found else '(missing) '}{b.what}")
        return 0
    chosen = []
    for name in args.names or [b.name for b in BENCHMARKS]:
        b = _bench_lookup(name)
        if b is None:
            print(f"cudnn-compat bench: no benchmark {name!r}; known: {', '.join(BENCH_BY_NAME)} "
                  "(cudnn-compat bench --list)", file=sys.stderr)
            return 2
        chosen.append(b)
    why = gpu_reason()
    if why:
        cpu_ok = [b for b in chosen if b.cpu is not None]
        if not args.names or len(cpu_ok) < len(chosen):
            need = [b.name for b in chosen if b.cpu is None]
            print(f"cudnn-compat bench: {', '.join(need)} need{'s' if len(need) == 1 else ''} a CUDA GPU with CuPy; "
                  f"here: {why} (runs on the CPU: "
                  f"{', '.join(b.name for b in BENCHMARKS if b.cpu is not None)})", file=sys.stderr)
            return 2
    failed = []
    for b in chosen:
        script = os.path.join(root, b.script)
        if not os.path.exists(script):
            print(f"cudnn-compat bench: {b.name}: {script} does not exist", file=sys.stderr)
            failed.append(b.name)
            continue
        cmd = [sys.executable, script] + list(b.cpu if why else b.gpu) + (list(b.quick) if args.quick else [])
        print(f"== {b.name}: {' '.join([b.script] + cmd[2:])}", flush=True)
        rc = subprocess.call(cmd, cwd=os.path.dirname(root))
        if rc:
            print(f"cudnn-compat bench: {b.name} exited with {rc}", file=sys.stderr)
            failed.append(b.name)
    return 1 if failed else 0


class UsageError(Exception):
    """A command line argparse refused: one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors raised (main prints them as one line), for every sub-command."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message} ({self.prog} -h)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cudnn-compat", description="cuDNN's legacy API on a graph layer: tools")
    p.add_argument("--traceback", action="store_true", help="show the Python traceback of an error "
                                                           "(default: one line)")
    from .._version import __version__  # the one version (pyproject reads it from there)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", metavar="command")
    d = sub.add_parser("doctor", help="what is installed and usable here")
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.add_argument("--ops", action="store_true", help="also list the op kinds each engine runs on this machine "
                                                      "and the reason for each kind it declines")
    d.set_defaults(fn=doctor)
    m = sub.add_parser("demo", help="run a small legacy-style network and check it against the CPU reference")
    m.add_argument("--place", choices=("cpu", "gpu"), help="where to run it (default: the default place)")
    m.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights")
    m.add_argument("--rtol", type=float, default=None,
                   help="an op fails when its max abs error exceeds rtol*max(1, max|reference|) "
                        "(default 1e-5 on the CPU, 5e-3 on a GPU)")
    m.set_defaults(fn=demo)
    s = sub.add_parser("install-shim", help="write cudnn_compat_shim.pth: CUDNN_COMPAT_SHIM=1 then installs the "
                                            "cupy.cuda.cudnn / cupyx.cudnn shim at interpreter start (see cupy13/shim.py)")
    s.add_argument("--remove", action="store_true", help="delete the .pth instead")
    s.add_argument("--dir", help="directory to write it to (default: the site-packages holding cudnn_compat)")
    s.set_defaults(fn=lambda args: __import__("cudnn_compat.cupy13.shim").cupy13.shim.cli_install_shim(args))
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
    b = sub.add_parser("bench", help="run the benchmark scripts under benchmarks/ (a source checkout) and print "
                                     "their tables")
    b.add_argument("names", nargs="*", metavar="NAME",
                   help=f"which: {', '.join(BENCH_BY_NAME)} or a script name (default: all)")
    b.add_argument("--list", action="store_true", help="list the benchmarks and whether they are found here")
    b.add_argument("--quick", action="store_true", help="a short run of each (--quick, or fewer calls)")
    b.add_argument("--dir", help="the benchmarks/ folder (default: the one beside the package in a checkout)")
    b.set_defaults(fn=bench)


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `yes | head` reports for yes


def _quiet_stdout() -> None:
    """The reader of stdout went away (``cudnn-compat explain t | head``): send whatever is still
    buffered, and anything printed later, to /dev/null so the exit flush raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (captured): drop the stream
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit


def main(argv=None) -> int:
    """The command; every error is one line on stderr and a non-zero status: 2 for a command line
    or input that cannot be used, 1 for an unexpected failure (``--traceback`` shows it whole)."""
    p = parser()
    try:
        args = p.parse_args(argv)
    except UsageError as e:
        print(e, file=sys.stderr)
        return 2
    if not getattr(args, "fn", None):
        print(f"cudnn-compat: a command is required: {', '.join(_commands(p))} (cudnn-compat -h)", file=sys.stderr)
        return 2
    try:
        code = args.fn(args)
        sys.stdout.flush()  # a closed pipe shows up here at the latest
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"cudnn-compat {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the command's own failure: one line, not a traceback
        if args.traceback:
            raise
        usable = isinstance(e, (OSError, ValueError, LookupError, CuDNNError))
        print(f"cudnn-compat {args.command}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
              f"{'' if usable else ' (--traceback shows where)'}", file=sys.stderr)
        return 2 if usable else 1


def _commands(p: argparse.ArgumentParser) -> list:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
