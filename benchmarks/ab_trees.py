"""Source trees against each other on one host (issue 26 item 8): the batch-1 fp16 ResNet-50
training step of examples/resnet50_legacy.py, its host issue time from an idle queue (the median of
``--steps`` steps, each after a device synchronize), per tree in a process of its own, the trees in
turn, ``--rounds`` times, with real launches and with the compiled launchers pointed at
``_steady``'s recording stubs (our call path and the example's script, without the driver).

The hosts lent for the GPU runs change speed by 2x between minutes, so two device checks of two
trees compare hosts as much as trees; this runs both trees within the same minutes, and each
process records ``py_calib`` (benchmarks/_common.py) after its steps to say how fast the host was.

    python benchmarks/ab_trees.py OLD_TREE NEW_TREE [--rounds 2] [--steps 40]

A tree is a folder holding cudnn_compat/ (``git worktree add /tmp/old <sha>``, or ``git archive``);
each is built in place first (setup.py build_ext), so each runs its own compiled steady path.
JSON: ab_trees_<device>.json under --out.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS, device_name, missing_gpu_stack, write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# one process: the step's issue time (ms) and py_calib (us) on the last line
CHILD = r'''
import os, sys, time, statistics
sys.path[:0] = [os.getcwd(), sys.argv[1]]
import cupy, cudnn_compat as cc
if os.environ.get("AB_STUB") == "1":  # the compiled launchers on the recording stubs, before any plan
    from cudnn_compat._backend import steady, _steady
    from cudnn_compat._backend.engines import graphs as G
    steady._LAUNCH[0] = _steady.stub(0)
    steady._LAUNCH[1] = _steady.graph_stub()
    ks = _steady.kernels_stub(0)
    G.Driver.addresses = lambda self: ks
import bench_programs as bp, _common
net, x, labels, step = bp.batch1_step(cc.cudnnCreate())  # net.step(x, labels, lr=1e-3, sync=False)
sync = cupy.cuda.runtime.deviceSynchronize
for _ in range(8):
    step()
out = []
for _ in range(int(sys.argv[2])):
    sync()
    t = time.perf_counter()
    step()
    out.append((time.perf_counter() - t) * 1e3)
sync()
print(statistics.median(out), _common.host_calib_us())
'''


def one(tree: str, stub: bool, steps: int) -> dict:
    """One process of ``tree``: {"issue_ms", "py_calib_us"} or {"error"}."""
    env = dict(os.environ, AB_STUB="1" if stub else "0", PYTHONPATH=os.path.abspath(tree))
    p = subprocess.run([sys.executable, "-c", CHILD, HERE, str(steps)], cwd=tree, env=env, capture_output=True,
                       text=True)
    try:
        ms, calib = map(float, p.stdout.strip().splitlines()[-1].split())
        return {"issue_ms": ms, "py_calib_us": calib}
    except (IndexError, ValueError):
        return {"error": (p.stderr or p.stdout)[-400:]}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="*", help="folders holding cudnn_compat/ (two or more)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40, help="timed steps per process")
    ap.add_argument("--quick", action="store_true", help="one round of 10 steps")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    try:
        import cupy  # noqa: F401
    except ImportError as e:
        sys.exit(missing_gpu_stack(__file__, e))
    trees = args.trees or [os.path.dirname(HERE)]
    rounds, steps = (1, 10) if args.quick else (args.rounds, args.steps)
    for t in trees:
        b = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=t, capture_output=True,
                           text=True)
        print(f"{t}: build_ext rc={b.returncode}", flush=True)
    rows = []
    for r in range(rounds):
        for stub in (False, True):
            for t in trees:
                row = dict(round=r, stub=stub, tree=t, **one(t, stub, steps))
                rows.append(row)
                print(f"round {r} {'stub' if stub else 'real':4s} {t:30s} "
                      + (f"issue {row['issue_ms']:7.3f} ms  py_calib {row['py_calib_us']:5.2f} us" if "issue_ms" in row
                         else f"error {row['error']}"), flush=True)
    print("wrote", write_json("ab_trees", {"device": device_name(), "rows": rows}, args.out))


if __name__ == "__main__":
    main()
