"""Why a fused basic block is slower than the plain one (issue 14 item 5): host time per block
(no sync), CUDA-event time, the graphs the fuse scope ran per engine, and the top kernels of one
block of each through torch.profiler.

    python benchmarks/fuse_profile.py [--dtype float16 --layout NHWC] [--n 32]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ROOT, cuda_time, missing_gpu_stack, repo_on_path  # noqa: E402

repo_on_path()
import cudnn_compat as cc  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--layout", default="NHWC")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="N=8")
    args = ap.parse_args(argv)
    try:
        import cupy
        import torch
    except ImportError as e:
        sys.exit(missing_gpu_stack(__file__, e))
    if args.quick:
        args.n = 8
    spec = importlib.util.spec_from_file_location("resnet50_legacy", os.path.join(ROOT, "examples", "resnet50_legacy.py"))
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    h = cc.cudnnCreate("gpu")
    blk = ex.build_basic_block(h, args.n, 64, 56, 56, args.dtype, args.layout)
    scopes = []
    real_fuse = cc.fuse

    class Spy(real_fuse):
        def __enter__(self):
            s = super().__enter__()
            scopes.append(s)
            return s
    ex.cc.fuse = Spy
    for fused in (False, True):
        blk.fused = fused
        for _ in range(5):
            blk.forward()
        cupy.cuda.Device().synchronize()
        n = 50
        t0 = time.perf_counter()
        for _ in range(n):
            blk.forward()
        host = (time.perf_counter() - t0) / n * 1e6
        cupy.cuda.Device().synchronize()
        ms = cuda_time(lambda: blk.forward(), iters=20, reps=3, warm=2)["ms"]
        line = f"{'fused' if fused else 'plain'}: host {host:.1f} us/block (no sync), {ms:.3f} ms/block (events)"
        if fused and scopes:
            s = scopes[-1]
            line += f"; last scope: graphs {s.graphs}, deferred {s.deferred}, flushes {s.flushes}"
        print(line, flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                blk.forward()
            cupy.cuda.Device().synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=90), flush=True)
    if scopes:
        from cudnn_compat.tools import fuse as fusion
        for r in list(fusion._RECIPES.values())[:8]:
            print("recipe", r.id, [(seg.calls, None if seg.graph is None else [op.kind for op in seg.graph.ops])
                                   for seg in r.segments])
    ex.cc.fuse = real_fuse


if __name__ == "__main__":
    main()
