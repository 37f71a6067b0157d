"""The CPU place (issue 25): ours (the default ``numpy`` engine, through the legacy API on a CPU
handle) vs torch CPU vs the best plain NumPy expression, side by side in one process, float32 NCHW.

Rows ``{name, ours_ms, torch_ms, numpy_ms}`` (a column is null where it has no counterpart, and
torch's is null when torch is not installed; torch is never a dependency):
  * ``conv_*``: ConvolutionForward / BackwardData / BackwardFilter on ResNet-50 layer shapes at
    N=8 (3x3 64@56, 1x1 256->64 @56, 3x3 stride 2 128@56, the 1x1 stride-2 downsample 256->512)
    plus a depthwise and a grouped layer, against ``F.conv2d`` and the
    ``aten.convolution_backward`` calls its autograd makes;
  * memory-bound calls on N=8 C=64 56x56: ReLU, AddTensor, OpTensor ADD, batch norm training
    forward and backward, max pooling 2x2, softmax over channels, against one NumPy expression each
    (and torch's op);
  * ``demo``: the README's ``cudnn-compat demo`` network (its ops, warm) against the same ops in torch;
  * ``resnet50_step``: one training step of examples/resnet50_legacy.py (``--place cpu``, reduced
    width) against the same network in torch.
Times are medians of ``--reps`` runs (wall clock, after a warm-up), ours and torch back to back.
The JSON (``bench_cpu_<cpu>.json`` under benchmarks/results) holds the rows, the CPU model and
cores, the git commit and the UTC time.

    python benchmarks/bench_cpu.py [--quick] [--reps 5] [--out benchmarks/results] [--only SUBSTR]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import RESULTS, ROOT, meta, repo_on_path, write_json_file  # noqa: E402

repo_on_path()
import cudnn_compat as cc  # noqa: E402

try:  # for comparison only
    import torch  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
except ImportError:
    torch = F = None

FLOAT, NCHW = cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW


def timed(fn, reps: int, warm: int = 1) -> float:
    """Median wall milliseconds of ``fn()`` over ``reps`` runs after ``warm`` calls."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def machine() -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": cores, "torch_threads": torch.get_num_threads() if torch else None}


def git_commit() -> "str | None":
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def tdesc(shape):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensorNdDescriptorEx(d, NCHW, FLOAT, len(shape), list(shape))
    return d


# -- convolutions -------------------------------------------------------------------------------------
# name, x dims, w dims, pad, stride, groups
CONVS = [
    ("3x3_64@56", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
    ("1x1_256to64@56", (8, 256, 56, 56), (64, 256, 1, 1), 0, 1, 1),
    ("3x3_s2_128@56", (8, 128, 56, 56), (128, 128, 3, 3), 1, 2, 1),
    ("1x1_s2_256to512@56", (8, 256, 56, 56), (512, 256, 1, 1), 0, 2, 1),
    ("depthwise3x3_64@56", (8, 64, 56, 56), (64, 1, 3, 3), 1, 1, 64),
    ("grouped3x3_g32_128@28", (8, 128, 28, 28), (128, 4, 3, 3), 1, 1, 32),
]


def conv_rows(h, reps, rng, only):
    rows = []
    for name, xs, ws, pad, stride, groups in CONVS:
        if only and only not in "conv_" + name:
            continue
        cd = cc.cudnnCreateConvolutionDescriptor()
        cc.cudnnSetConvolution2dDescriptor(cd, pad, pad, stride, stride, 1, 1, cc.CUDNN_CROSS_CORRELATION, FLOAT)
        cc.cudnnSetConvolutionGroupCount(cd, groups)
        wd = cc.cudnnCreateFilterDescriptor()
        cc.cudnnSetFilterNdDescriptor(wd, FLOAT, NCHW, 4, list(ws))
        xd = tdesc(xs)
        ys = tuple(cc.cudnnGetConvolutionNdForwardOutputDim(cd, xd, wd, 4))
        yd = tdesc(ys)
        x, w = rng.standard_normal(xs, np.float32), rng.standard_normal(ws, np.float32)
        dy = rng.standard_normal(ys, np.float32)
        y, dx, dw = np.empty(ys, np.float32), np.empty(xs, np.float32), np.empty(ws, np.float32)
        ours = {
            "fwd": lambda: cc.cudnnConvolutionForward(h, 1.0, xd, x, wd, w, cd, 0, None, 0, 0.0, yd, y),
            "bwd_data": lambda: cc.cudnnConvolutionBackwardData(h, 1.0, wd, w, yd, dy, cd, 0, None, 0, 0.0, xd, dx),
            "bwd_filter": lambda: cc.cudnnConvolutionBackwardFilter(h, 1.0, xd, x, yd, dy, cd, 0, None, 0, 0.0,
                                                                    wd, dw),
        }
        theirs = {}
        if torch is not None:
            tx, tw, tdy = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(dy)
            cb = torch.ops.aten.convolution_backward
            args = ([stride] * 2, [pad] * 2, [1, 1], False, [0, 0], groups)
            theirs = {
                "fwd": lambda: F.conv2d(tx, tw, None, stride, pad, 1, groups),
                "bwd_data": lambda: cb(tdy, tx, tw, None, *args, [True, False, False]),
                "bwd_filter": lambda: cb(tdy, tx, tw, None, *args, [False, True, False]),
            }
        for d in ("fwd", "bwd_data", "bwd_filter"):
            with torch.no_grad() if torch is not None else _null():
                row = {"name": f"conv_{name}_{d}", "ours_ms": timed(ours[d], reps),
                       "torch_ms": timed(theirs[d], reps) if theirs else None, "numpy_ms": None}
            rows.append(row)
            print(_fmt(row), flush=True)
        for dsc in (xd, yd):
            cc.cudnnDestroyTensorDescriptor(dsc)
        cc.cudnnDestroyFilterDescriptor(wd)
        cc.cudnnDestroyConvolutionDescriptor(cd)
    return rows


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# -- memory-bound calls -----------------------------------------------------------------------------

def memory_rows(h, reps, rng, only):
    shape = (8, 64, 56, 56)
    n, c = shape[:2]
    xd, pd, bd = tdesc(shape), tdesc((n, c, 28, 28)), tdesc((1, c, 1, 1))
    x, b = rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32)
    y, p = np.empty(shape, np.float32), np.empty((n, c, 28, 28), np.float32)
    dy, dx = rng.standard_normal(shape, np.float32), np.empty(shape, np.float32)
    scale, bias = np.ones((1, c, 1, 1), np.float32), np.zeros((1, c, 1, 1), np.float32)
    rm, rv, sm, siv = (np.zeros((1, c, 1, 1), np.float32) for _ in range(4))
    dsc, dbi = np.empty((1, c, 1, 1), np.float32), np.empty((1, c, 1, 1), np.float32)
    act = cc.cudnnCreateActivationDescriptor()
    cc.cudnnSetActivationDescriptor(act, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
    opd = cc.cudnnCreateOpTensorDescriptor()
    cc.cudnnSetOpTensorDescriptor(opd, cc.CUDNN_OP_TENSOR_ADD, FLOAT, cc.CUDNN_NOT_PROPAGATE_NAN)
    pool = cc.cudnnCreatePoolingDescriptor()
    cc.cudnnSetPooling2dDescriptor(pool, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
    spatial, eps = cc.CUDNN_BATCHNORM_SPATIAL, 1e-5

    def np_bn_fwd():
        m = x.mean(axis=(0, 2, 3), keepdims=True)
        v = x.var(axis=(0, 2, 3), keepdims=True)
        np.subtract(x, m, out=y)
        np.multiply(y, scale / np.sqrt(v + eps), out=y)
        np.add(y, bias, out=y)

    def np_bn_bwd():
        m = x.mean(axis=(0, 2, 3), keepdims=True)
        inv = 1 / np.sqrt(x.var(axis=(0, 2, 3), keepdims=True) + eps)
        cnt = x.size // c
        db = dy.sum(axis=(0, 2, 3), keepdims=True)
        np.subtract(x, m, out=dx)
        ds = np.einsum("nchw,nchw->c", dy, dx).reshape(1, c, 1, 1) * inv
        np.multiply(dx, ds * inv / cnt, out=dx)  # xhat * dscale / cnt, scaled by inv below
        np.subtract(dy, dx, out=dx)
        np.subtract(dx, db / cnt, out=dx)
        np.multiply(dx, scale * inv, out=dx)

    def np_maxpool():  # the four window taps as strided views, max-ed into p in place
        np.maximum(x[:, :, 0::2, 0::2], x[:, :, 0::2, 1::2], out=p)
        np.maximum(p, x[:, :, 1::2, 0::2], out=p)
        np.maximum(p, x[:, :, 1::2, 1::2], out=p)

    def np_softmax():
        np.subtract(x, x.max(axis=1, keepdims=True), out=y)
        np.exp(y, out=y)
        np.divide(y, y.sum(axis=1, keepdims=True), out=y)

    tx, tdy = (torch.from_numpy(a) for a in (x, dy)) if torch is not None else (None, None)
    tb = torch.from_numpy(b) if torch is not None else None
    tsc, tbi = (torch.ones(c), torch.zeros(c)) if torch is not None else (None, None)
    table = [
        ("relu", lambda: cc.cudnnActivationForward(h, act, 1.0, xd, x, 0.0, xd, y),
         lambda: torch.relu(tx), lambda: np.maximum(x, 0, out=y)),
        ("add_tensor", lambda: cc.cudnnAddTensor(h, 1.0, xd, x, 1.0, xd, y),
         lambda: tb.add_(tx), lambda: np.add(y, x, out=y)),
        ("op_tensor_add", lambda: cc.cudnnOpTensor(h, opd, 1.0, xd, x, 1.0, xd, b, 0.0, xd, y),
         lambda: torch.add(tx, tb), lambda: np.add(x, b, out=y)),
        ("bn_fwd_training", lambda: cc.cudnnBatchNormalizationForwardTraining(
            h, spatial, 1.0, 0.0, xd, x, xd, y, bd, scale, bias, 0.1, rm, rv, eps, sm, siv),
         lambda: F.batch_norm(tx, None, None, tsc, tbi, True, 0.1, eps), np_bn_fwd),
        ("bn_bwd", lambda: cc.cudnnBatchNormalizationBackward(
            h, spatial, 1.0, 0.0, 1.0, 0.0, xd, x, xd, dy, xd, dx, bd, scale, dsc, dbi, eps, sm, siv),
         None, np_bn_bwd),
        ("maxpool2x2", lambda: cc.cudnnPoolingForward(h, pool, 1.0, xd, x, 0.0, pd, p),
         lambda: F.max_pool2d(tx, 2, 2), np_maxpool),
        ("softmax_channel", lambda: cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_ACCURATE, cc.CUDNN_SOFTMAX_MODE_CHANNEL,
                                                           1.0, xd, x, 0.0, xd, y),
         lambda: torch.softmax(tx, 1), np_softmax),
    ]
    rows = []
    cc.cudnnBatchNormalizationForwardTraining(h, spatial, 1.0, 0.0, xd, x, xd, y, bd, scale, bias, 0.1, rm, rv,
                                              eps, sm, siv)  # saved mean / inverse std for the backward
    for name, ours, theirs, plain in table:
        if only and only not in name:
            continue
        with torch.no_grad() if torch is not None else _null():
            row = {"name": name, "ours_ms": timed(ours, reps),
                   "torch_ms": timed(theirs, reps) if torch is not None and theirs is not None else None,
                   "numpy_ms": timed(plain, reps)}
        rows.append(row)
        print(_fmt(row), flush=True)
    return rows


# -- the README demo and the ResNet-50 step -----------------------------------------------------------

def demo_row(reps):
    from cudnn_compat.tools import demo
    runs = [demo.run("cpu") for _ in range(reps)]
    ours = statistics.median(sum(r.seconds for r in rows) for rows in runs) * 1e3
    theirs = None
    if torch is not None:
        net = demo.Network()
        x = torch.from_numpy(net.x)
        w, bias = torch.from_numpy(net.w), torch.from_numpy(net.bias)

        def tdemo():
            y = torch.relu(F.conv2d(x, w, None, 1, 1) + bias)
            p = F.max_pool2d(y, 2, 2)
            z = F.batch_norm(p, None, None, torch.ones(p.shape[1]), torch.zeros(p.shape[1]), True, 0.1, 1e-5)
            return torch.softmax(z, 1)
        with torch.no_grad():
            theirs = timed(tdemo, reps * 20) * 1
    row = {"name": "demo", "ours_ms": ours, "torch_ms": theirs, "numpy_ms": None}
    print(_fmt(row), flush=True)
    return row


def torch_resnet(width, classes, depth, blocks):
    """The network of examples/resnet50_legacy.py in torch (bottlenecks, stride on the 3x3)."""
    nn = torch.nn
    ch = lambda c: max(1, int(round(c * width)))  # noqa: E731

    class Block(nn.Module):
        def __init__(self, cin, mid, out, stride):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                      nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                      nn.Conv2d(mid, out, 1, bias=False), nn.BatchNorm2d(out))
            self.down = None if stride == 1 and cin == out else nn.Sequential(
                nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, ch(64), 7, 2, 3, bias=False), nn.BatchNorm2d(ch(64)), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = ch(64)
    for s, (count, mid, out) in enumerate([(3, 64, 256), (4, 128, 512), (6, 256, 1024), (3, 512, 2048)][:depth]):
        for i in range(min(count, blocks) if blocks else count):
            layers.append(Block(cin, ch(mid), ch(out), 2 if s > 0 and i == 0 else 1))
            cin = ch(out)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def resnet_row(reps, batch=8, size=64, width=0.25, classes=100):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import resnet50_legacy as ex
    h = cc.cudnnCreate("cpu")
    model = ex.build(h, batch, size, size, "float32", "NCHW", classes, width, depth=4)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    x = model.input(xs)
    labels = rng.integers(0, classes, batch)
    ours = timed(lambda: model.step(x, labels, lr=0.01), reps)
    model.destroy()
    cc.cudnnDestroy(h)
    theirs = None
    if torch is not None:
        net = torch_resnet(width, classes, 4, None)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        tx, tl = torch.from_numpy(xs), torch.from_numpy(labels)

        def tstep():
            opt.zero_grad()
            loss = F.cross_entropy(net(tx), tl)
            loss.backward()
            opt.step()
        theirs = timed(tstep, reps)
    row = {"name": f"resnet50_step_N{batch}_{size}px_width{width}", "ours_ms": ours, "torch_ms": theirs,
           "numpy_ms": None}
    print(_fmt(row), flush=True)
    return row


def _fmt(row) -> str:
    f = lambda v: "-" if v is None else f"{v:9.2f}"  # noqa: E731
    ratio = f"  ours/torch {row['ours_ms'] / row['torch_ms']:.2f}" if row["torch_ms"] else ""
    ratio += f"  ours/numpy {row['ours_ms'] / row['numpy_ms']:.2f}" if row["numpy_ms"] else ""
    return f"{row['name']:<34} ours {f(row['ours_ms'])}  torch {f(row['torch_ms'])}  numpy {f(row['numpy_ms'])}{ratio}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_cpu.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 repetitions, no ResNet-50 step")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="", help="only the rows whose name contains this")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    reps = 2 if args.quick else args.reps
    rng = np.random.default_rng(0)
    h = cc.cudnnCreate("cpu")
    rows = conv_rows(h, reps, rng, args.only) + memory_rows(h, reps, rng, args.only)
    engine = cc.last_engine()
    cc.cudnnDestroy(h)
    if not args.only or args.only in "demo":
        rows.append(demo_row(reps))
    if not args.quick and (not args.only or args.only in "resnet50_step"):
        rows.append(resnet_row(max(2, reps // 2)))
    payload = meta(machine=machine(), commit=git_commit(), utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   engine=engine, quick=args.quick, rows=rows)
    tag = "".join(ch if ch.isalnum() else "_" for ch in payload["machine"]["cpu"]).strip("_")[:40] or "cpu"
    path = write_json_file(os.path.join(args.out, f"bench_cpu_{tag}{'_quick' if args.quick else ''}.json"), payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
