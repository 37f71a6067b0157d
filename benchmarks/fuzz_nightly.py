"""Nightly-size fuzz run (issue 10): the properties of tests/test_fuzz.py at full size, each in its own
process, with the outcome counts per legacy function and the total.

    python benchmarks/fuzz_nightly.py [--examples 100000] [--jobs 2] [--batch 10] [--only conv,pooling]
                                      [--place cpu|gpu] [--json out.json]

``--examples`` is the total over all properties (split by the weights in tests/test_fuzz.py, the
same split CUDNN_COMPAT_FUZZ_EXAMPLES gives under pytest); the examples are random (not the
derandomized CI set).  Exit status 1 when any property found a failure; its falsifying example
(with hypothesis' reproduce blob) is printed.  A failure includes a valid call refused without a rule
the property may hit, and a share of calls reaching the oracle under the property's floor
(``FLOORS`` of tests/test_fuzz.py; the ``oracle`` column shows each share).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_property(name: str, examples: int, batch: int, place: str) -> dict:
    """Run one property in this (worker) process; returns its counts, time and failure text."""
    os.environ["CUDNN_COMPAT_FUZZ_EXAMPLES"] = str(examples)
    os.environ["CUDNN_COMPAT_FUZZ_BATCH"] = str(batch)
    os.environ["CUDNN_COMPAT_FUZZ_PLACE"] = place
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import test_fuzz  # noqa: E402  (reads the size at import)
    t0 = time.perf_counter()
    failure = None
    try:
        getattr(test_fuzz, name)()
    except BaseException as e:  # hypothesis re-raises the falsifying example's error
        failure = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:]
    prop = name[len("test_fuzz_"):].replace("descriptor_", "")
    counts = {k[1]: v for k, v in test_fuzz.STATS.items() if k[0] == prop}
    return {"property": name, "seconds": round(time.perf_counter() - t0, 1), "counts": counts, "failure": failure,
            "planned": max(1, examples * test_fuzz.WEIGHTS[prop] // sum(test_fuzz.WEIGHTS.values()))}


def examples_of(r: dict) -> int:
    c = r["counts"]
    if "examples" in c:
        return c["examples"]
    return sum(v for k, v in c.items() if k == "ok" or k.startswith("CUDNN_STATUS_"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100_000, help="total examples over all properties")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch", type=int, default=10, help="cases per hypothesis example (see tests/test_fuzz.py cases)")
    ap.add_argument("--only", default="", help="comma-separated substrings of property names")
    ap.add_argument("--place", default="cpu", choices=("cpu", "gpu"),
                    help="the handle the calls go through (gpu: the GPU engines, against the same oracles)")
    ap.add_argument("--json", default="", help="write the results here too")
    args = ap.parse_args(argv)

    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import test_fuzz  # noqa: E402
    names = sorted(n for n in dir(test_fuzz) if n.startswith("test_fuzz_") and n != "test_fuzz_on_the_gpu")
    if args.only:
        names = [n for n in names if any(s in n for s in args.only.split(","))]
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: each reads the size at import
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=ctx) as pool:
        results = list(pool.map(run_property, names, [args.examples] * len(names), [args.batch] * len(names),
                                [args.place] * len(names)))
    wall = time.perf_counter() - t0

    statuses = sorted({k for r in results for k in r["counts"] if k.startswith("CUDNN_STATUS_") or k == "ok"})
    print(f"{'property':40s} {'examples':>9s} {'secs':>7s} {'oracle':>7s}  "
          + "  ".join(s.replace("CUDNN_STATUS_", "") for s in statuses))
    total = 0
    for r in results:
        n = examples_of(r)
        total += n
        cells = "  ".join(f"{r['counts'].get(s, 0):>{len(s.replace('CUDNN_STATUS_', ''))}d}" for s in statuses)
        flag = "  FAILED" if r["failure"] else ""
        share = f"{r['counts'].get('oracle', 0) / n:7.0%}" if n and "examples" not in r["counts"] else f"{'':7s}"
        print(f"{r['property']:40s} {n:9d} {r['seconds']:7.1f} {share}  {cells}{flag}")
    failed = [r for r in results if r["failure"]]
    print(f"\ntotal examples: {total} in {wall:.0f} s wall ({args.jobs} jobs, {args.place} place); "
          f"properties failed: {len(failed)}")
    for r in failed:
        print(f"\n=== {r['property']} ===\n{r['failure']}")
    if args.json:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _common import write_json_file  # the run's commit and UTC time, as every benchmark JSON
        write_json_file(args.json, {"total": total, "wall_seconds": round(wall, 1), "jobs": args.jobs,
                                    "place": args.place, "results": results})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
