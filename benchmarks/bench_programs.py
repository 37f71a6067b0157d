"""Whole legacy programs (issue 14, item 2): the ResNet-50 v1.5 training step of
examples/resnet50_legacy.py (N=32, 224x224, forward + backward + SGD through AddTensor) and the
7-call ResNet basic block (conv, BN train, ReLU, conv, BN train, add, ReLU; N=32, 64@56x56,
forward), in fp16 NHWC and fp32 NCHW, one row each, each run

  ours_ms        (a) unchanged through cudnn-compat (CUDA events around repeated steps)
  ours_fused_ms  (b) the same with ``cudnn_compat.fuse()`` scopes around each block (and the stem
                     and the head)
  legacy_ms      (c) the same call sequence on the real legacy cuDNN: the legacy calls of one
                     step are recorded (the ``_core.registry`` call hook that tools/trace.py uses), their
                     descriptors translated as ``replay --engine legacy`` does
                     (``replay.LegacySession``), and the recorded calls replayed through ctypes on
                     the same buffers; convolution algorithms are chosen by the legacy
                     cudnnFind*Algorithm (per signature, the descriptor's math type), workspaces
                     by the legacy Get*WorkspaceSize (the program on the library it was written for)
  torch_ms       (d) the same network in torch eager (channels_last for NHWC, cudnn.benchmark on,
                     TF32 off: fp32 rows compare FMA math with FMA math; SGD with foreach)
  torch_graph_ms (e) ResNet rows: torch's step (forward, loss, backward, SGD) captured in one CUDA
                     graph (torch.cuda.graph, the whole-network recipe of torch's docs), replayed
  ours_graph_ms  (f) ResNet rows: our step captured the same way by the user: ``cudnnSetStream`` to
                     a CuPy stream, warm-up steps on it, ``Stream.begin_capture``/``end_capture``
                     around one step, the graph launched; ``ours_graph_loss_rel_err_vs_ours``: the
                     loss a replay computes from the initial weights against the eager step's

The legacy column runs the real library at its best: in NHWC its batch normalization calls use
CUDNN_BATCHNORM_SPATIAL_PERSISTENT (as torch does; plain SPATIAL costs milliseconds per NHWC
layer there), ``legacy_bn_mode`` says which mode ran.

and ``max_rel_err_vs_torch``: torch gets our weights and input; the block compares outputs, the
step the loss and the gradients of fc.weight, conv1.weight, bn1.weight and layer4's last conv
(max |ours - torch| / max |torch| over them).  ``rel_errs_vs_torch_fp32``: the same errors of ours,
of torch and of the legacy replay against torch in fp32 with FMA math (for fp16 rows: how far each
fp16 program is from the fp32 result).  ``legacy_rel_err_vs_ours``: the loss of the legacy replay
against ours from the same weights.  ``--diff`` adds ``per_call_diff`` to the step rows: every call
of one step run on the legacy library and on ours from the same buffers, the worst disagreements;
``--profile`` adds ``profile``: per legacy function, the calls, host microseconds and GPU
milliseconds of one step of ours and of the legacy replay (each call with the device idle before
it), and the top CUDA kernels of one torch step and of one ours step (torch.profiler).  ``host_us``: benchmarks/host_overhead.py's figures
(median microseconds of one cached call) when that file is there, merged in as it reports them.

N=1 rows (issue 26 item 8): ``--batches`` (default ``32,1``: the N=32 rows of every config, then
the N=1 rows; ``--batches 32`` skips them, any batch up to 4 gets this row) adds the same ResNet-50
step at batch 1 (``small_batch_row``), where the step's host cost shows: ``ours_ms``,
``ours_graph_ms`` (captured as in (f)), ``torch_ms``, ``torch_graph_ms`` and ``legacy_ms`` (the
recorded replay as in (c); off with ``--no-small-legacy``); ``--small-iters`` (20) steps per
repetition, ``--small-reps`` (3) repetitions, 3 warm-up steps.  ``eager_over_captured`` = ours_ms /
ours_graph_ms, against the issue's target ``target_eager_over_captured`` (2.0: the eager step at
most twice the captured one), ``eager_over_captured_ok``, and ``torch_eager_over_captured`` beside
it.  What bounds the eager step: ``ours_host_ms``, the host time that issues one step from an idle
launch queue (``_common.issue_time``, one step a repetition, so the queue never fills and no launch
waits for the device), and ``ours_floor_ms``, the device's time for one step whose launches were all
queued before it started (``_common.device_floor_ms``: behind a spin kernel; the gaps between
launches stay, the host's speed does not show); ``ours_ms`` is about the larger of the two.
``host_calib_us``, the host's Python speed (``_common.py_calib``, launch_paths' figure), compares
rows from other machines.  The driver's share of the host time: ``ours_launches`` (the step's kernels
and memsets, torch.profiler), ``driver_launch_us`` (one bare cuLaunchKernel on this host,
``_common.driver_launch_us``) and their product ``driver_floor_ms``, which no library issuing those
launches one by one goes below.  Checked
there: the loss and the four gradients above against torch's from the same weights
(``max_rel_err_vs_torch``, ``rel_errs_vs_torch``; in fp16 at batch 1 these gradients differ by O(1)
in max norm, and torch fp16 from torch fp32 as much, on the CPU at 64-128 px: there the loss is the
check), the captured step's loss (``ours_graph_loss_rel_err_vs_ours``), the legacy replay's loss
(``legacy_rel_err_vs_ours``); no fused column, no fp32 references, no ``--diff`` or ``--profile``.  Their plans are built with
CUDNN_COMPAT_CUDNN_AUTOTUNE=``--small-autotune`` (4: mode A's first 4 engine configs and 4 more
timed per convolution graph, where the N=32 rows time every config and its knob variants, again
for every new shape: their networks take 17-21 s to build on the H100); ``autotune`` says what was
in force (0, or the variable already set: the environment's).  The N=32 rows record
``eager_over_captured`` too.

    python benchmarks/bench_programs.py [--quick] [--iters 5] [--reps 3] [--out DIR] [--no-host]
                                        [--batches 32,1] [--small-iters 20] [--small-reps 3]

writes ``<out>/bench_programs_<device>.json`` (default benchmarks/results) after every row.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import inspect
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (ROOT, cuda_time, device_floor_ms, driver_launch_us, fmt_ms, host_calib_us,  # noqa: E402
                     issue_time, meta, missing_gpu_stack, rel_err, repo_on_path, write_json)

repo_on_path()
import cudnn_compat as cc  # noqa: E402

CONFIGS = (("float16", "NHWC"), ("float32", "NCHW"))
LR = 1e-3
CHECKED_GRADS = ("fc.weight", "conv1.weight", "bn1.weight", "layer4.2.conv3.weight")


def load_example():
    spec = importlib.util.spec_from_file_location("resnet50_legacy", os.path.join(ROOT, "examples", "resnet50_legacy.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def batch1_step(handle, dtype="float16", layout="NHWC", *, ex=None, algo_search="find", x_nchw=None, loss=True,
                lr=LR) -> tuple:
    """The batch-1 ResNet-50 training step that benchmarks/step_split.py, ab_trees.py and host_step.py
    time (issue 26 item 8): (net, x, labels, step).  ``net``: examples/resnet50_legacy.py's network
    (``ex``, default ``load_example()``) built on ``handle`` at N=1, 224x224, 1000 classes, width 1,
    ``seed=0`` and ``algo_search``; ``x``: ``x_nchw`` (a NumPy 1,3,224,224 batch; default
    ``default_rng(1)``'s standard normal) through ``net.input``; ``labels``: one class from the same
    generator, on the net's place.  ``step()``: ``net.step(x, labels, lr=lr, sync=False)`` (forward,
    loss, backward, SGD; the loss left on the device), or with ``loss=False`` forward, backward and
    ``sgd(lr)`` without the loss (the log-probabilities' gradient as it was)."""
    ex = ex or load_example()
    net = ex.build(handle, 1, 224, 224, dtype, layout, 1000, 1.0, seed=0, algo_search=algo_search)
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal((1, 3, 224, 224))
    x = net.input(x_host if x_nchw is None else x_nchw)
    labels = net.net.xp.asarray(rng.integers(0, 1000, 1))
    if loss:
        def step():
            net.step(x, labels, lr=lr, sync=False)
    else:
        def step():
            net.forward(x)
            net.backward()
            net.sgd(lr)
    return net, x, labels, step


# -- (c) the recorded call sequence on the real legacy cuDNN -------------------------------------------

RECORDED = frozenset({
    "cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter",
    "cudnnConvolutionBackwardBias", "cudnnAddTensor", "cudnnActivationForward", "cudnnActivationBackward",
    "cudnnPoolingForward", "cudnnPoolingBackward", "cudnnSoftmaxForward", "cudnnSoftmaxBackward",
    "cudnnBatchNormalizationForwardTraining", "cudnnBatchNormalizationBackward",
})
FIND = {"cudnnConvolutionForward": "cudnnFindConvolutionForwardAlgorithm",
        "cudnnConvolutionBackwardData": "cudnnFindConvolutionBackwardDataAlgorithm",
        "cudnnConvolutionBackwardFilter": "cudnnFindConvolutionBackwardFilterAlgorithm"}
DOUBLES = ("exponentialAverageFactor", "epsilon")


@contextlib.contextmanager
def recording(out: list):
    """Append (C name, {parameter: value}) for every outermost legacy compute call in RECORDED."""
    from cudnn_compat._core import registry as _registry
    depth = [0]

    def hook(proceed, c_name, args, kwargs):
        if depth[0] == 0 and c_name in RECORDED:
            bound = inspect.signature(cc.LEGACY[c_name]).bind(*args, **kwargs)
            out.append((c_name, dict(bound.arguments)))
        depth[0] += 1
        try:
            return proceed(args, kwargs)
        finally:
            depth[0] -= 1

    _registry.HOOKS.append(hook)
    try:
        yield out
    finally:
        _registry.HOOKS.remove(hook)


def _timed(stats: dict, name: str, call):
    """One call with the device idle before it: host microseconds until it returns, GPU
    milliseconds from an event before it to an event after it (its kernels and the gaps between
    their launches); accumulated per function in ``stats``."""
    import cupy
    dev = cupy.cuda.Device()
    dev.synchronize()
    a, b = cupy.cuda.Event(), cupy.cuda.Event()
    a.record()
    t0 = time.perf_counter()
    out = call()
    host = time.perf_counter() - t0
    b.record()
    b.synchronize()
    s = stats.setdefault(name, {"calls": 0, "host_us": 0.0, "gpu_ms": 0.0})
    s["calls"] += 1
    s["host_us"] += host * 1e6
    s["gpu_ms"] += cupy.cuda.get_elapsed_time(a, b)
    return out


@contextlib.contextmanager
def call_profile(stats: dict):
    """Per legacy function (outermost compute calls): count, host microseconds and GPU milliseconds
    of one step, each call run with the device idle before it."""
    from cudnn_compat._core import registry as _registry
    depth = [0]

    def hook(proceed, c_name, args, kwargs):
        if depth[0] or c_name not in RECORDED:
            return proceed(args, kwargs)
        depth[0] += 1
        try:
            return _timed(stats, c_name, lambda: proceed(args, kwargs))
        finally:
            depth[0] -= 1

    _registry.HOOKS.append(hook)
    try:
        yield stats
    finally:
        _registry.HOOKS.remove(hook)


def _rounded(stats: dict) -> dict:
    out = {k: {"calls": v["calls"], "host_us": round(v["host_us"], 1), "gpu_ms": round(v["gpu_ms"], 4)}
           for k, v in sorted(stats.items(), key=lambda kv: -kv[1]["gpu_ms"])}
    out["total"] = {"calls": sum(v["calls"] for v in stats.values()),
                    "host_us": round(sum(v["host_us"] for v in stats.values()), 1),
                    "gpu_ms": round(sum(v["gpu_ms"] for v in stats.values()), 4)}
    return out


def torch_kernels(step, top: int = 15) -> dict:
    """torch.profiler over one step: the top CUDA kernels by device time (ms) and their total."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        if t:
            rows.append((e.key, t / 1e3, e.count))
    rows.sort(key=lambda r: -r[1])
    return {"kernel_ms": round(sum(r[1] for r in rows), 4), "launches": sum(r[2] for r in rows),
            "top": [{"kernel": k[:120], "ms": round(ms, 4), "count": n} for k, ms, n in rows[:top]]}


BN_CALLS = frozenset({"cudnnBatchNormalizationForwardTraining", "cudnnBatchNormalizationBackward"})


def legacy_bn_mode(layout: str) -> "int | None":
    """The batch-norm mode the legacy column runs (None: the recorded one): SPATIAL_PERSISTENT in
    NHWC, where the legacy library's fast batch norm is (002 §3.1.2.2 cudnnBatchNormMode_t)."""
    return cc.CUDNN_BATCHNORM_SPATIAL_PERSISTENT if layout == "NHWC" else None


class LegacyProgram:
    """The recorded calls as ctypes calls on a real cudnnHandle_t: (function, C arguments);
    ``bn_mode`` replaces the mode of the batch-norm training calls."""

    def __init__(self, calls: list, bn_mode: "int | None" = None):
        import cupy
        from cudnn_compat._core.descriptor import Descriptor
        from cudnn_compat.tools.replay import LEGACY_FUNCTIONS, LegacySession
        self.sess = LegacySession().__enter__()
        L = self.L = self.sess.L
        self.lib = L.load()
        self.ds = L.Descs()
        self.keep, self.notes = [], {}
        descs, algos = {}, {}
        self.workspace, ws_size = None, 0
        seq = []
        for name, kw in calls:
            double = any(isinstance(v, Descriptor) and getattr(v, "dtype", None) == "float64" for v in kw.values())
            cargs = []
            for p, v in kw.items():
                if p == "handle":
                    cargs.append(ctypes.c_void_p(self.sess.lh.ptr))
                elif isinstance(v, Descriptor):
                    if id(v) not in descs:
                        descs[id(v)] = (v, self.sess._desc(v, self.ds))
                    cargs.append(ctypes.c_void_p(descs[id(v)][1]))
                elif p.startswith(("alpha", "beta")):
                    c = (ctypes.c_double if double else ctypes.c_float)(float(v))
                    self.keep.append(c)
                    cargs.append(ctypes.c_void_p(ctypes.addressof(c)))
                elif p in DOUBLES:
                    cargs.append(ctypes.c_double(float(v)))
                elif p == "workSpace":
                    cargs.append(None)  # patched below
                elif p == "workSpaceSizeInBytes":
                    cargs.append(ctypes.c_size_t(0))
                elif p == "mode" and name in BN_CALLS and bn_mode is not None:
                    cargs.append(ctypes.c_int(int(bn_mode)))
                elif isinstance(v, cupy.ndarray):
                    cargs.append(ctypes.c_void_p(v.data.ptr))
                elif v is None:
                    cargs.append(ctypes.c_void_p(None))
                elif isinstance(v, (int, np.integer)):
                    cargs.append(ctypes.c_int(int(v)))
                else:
                    raise TypeError(f"{name}: cannot pass {p}={v!r} to the legacy library")
            if name in FIND:
                query, names = LEGACY_FUNCTIONS[name]
                ptrs = [descs[id(kw[n])][1] for n in names]
                key = (name,) + tuple(kw[n].key() if hasattr(kw[n], "key") else id(kw[n]) for n in names)
                if key not in algos:
                    conv = kw["convDesc"]
                    perfs = L.perf_list(FIND[name], self.sess.lh, *ptrs, count=16)
                    same = [p for p in perfs if p["mathType"] == conv.mathType]
                    if not perfs:
                        raise RuntimeError(f"legacy {FIND[name]}: no algorithm for {key}")
                    pick = (same or perfs)[0]
                    if not same:
                        self.notes[str(key)[:200]] = f"math type {pick['mathType']} (no {conv.mathType})"
                    algos[key] = (pick["algo"], L.workspace_size(query, self.sess.lh, *ptrs, pick["algo"]))
                algo, need = algos[key]
                params = list(kw)
                cargs[params.index("algo")] = ctypes.c_int(algo)
                cargs[params.index("workSpaceSizeInBytes")] = ctypes.c_size_t(need)
                ws_size = max(ws_size, need)
            seq.append((name, cargs, list(kw)))
        self.workspace = cupy.empty(max(ws_size, 1), cupy.uint8)
        wp = ctypes.c_void_p(self.workspace.data.ptr)
        self.calls = []
        for name, cargs, params in seq:
            if name in FIND:
                cargs[params.index("workSpace")] = wp
            self.calls.append((name, getattr(self.lib, name), tuple(cargs)))
        self.algos = algos

    def run(self, start: int = 0, stop: "int | None" = None):
        for name, fn, args in self.calls[start:stop]:
            st = fn(*args)
            if st:
                raise self.L.LegacyError(name, st)

    def run_profiled(self, stats: dict, start: int = 0, stop: "int | None" = None):
        """``run`` with each call synchronized and timed (see ``call_profile``)."""
        for name, fn, args in self.calls[start:stop]:
            _timed(stats, name, lambda: fn(*args))

    def index_after(self, c_name: str) -> int:
        """Position just after the first call of ``c_name`` (where the program computes the loss)."""
        return next(i for i, (n, _f, _a) in enumerate(self.calls) if n == c_name) + 1

    def close(self):
        import cupy
        cupy.cuda.Device().synchronize()
        self.ds.destroy()
        self.sess.__exit__(None, None, None)


# -- (d) torch ------------------------------------------------------------------------------------------

def torch_resnet(model):
    """The example's network as a torch module, with the example's parameter names."""
    import torch.nn as nn

    def conv(c):
        k = c.wdims
        m = nn.Conv2d(k[1], k[0], k[2], c.geometry[2], c.geometry[3], bias=c.bias)
        return m

    def bn(b):
        return nn.BatchNorm2d(b.x.dims[1], eps=1e-5, momentum=0.1)

    class Bottleneck(nn.Module):
        def __init__(self, blk):
            super().__init__()
            self.conv1, self.bn1 = conv(blk.conv1), bn(blk.bn1)
            self.conv2, self.bn2 = conv(blk.conv2), bn(blk.bn2)
            self.conv3, self.bn3 = conv(blk.conv3), bn(blk.bn3)
            self.downsample = nn.Sequential(conv(blk.down_conv), bn(blk.down_bn)) if blk.project else None
            self.relu = nn.ReLU()

        def forward(self, x):
            r = self.relu
            y = self.bn3(self.conv3(r(self.bn2(self.conv2(r(self.bn1(self.conv1(x))))))))
            return r(y + (self.downsample(x) if self.downsample is not None else x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = conv(model.conv1), bn(model.bn1)
            self.relu, self.maxpool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            stages = {}
            for blk in model.blocks:
                stages.setdefault(blk.name.split(".")[0], []).append(Bottleneck(blk))
            for k, v in stages.items():
                setattr(self, k, nn.Sequential(*v))
            self.stages = list(stages)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = conv(model.fc)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            for k in self.stages:
                x = getattr(self, k)(x)
            return self.fc(self.avgpool(x)).flatten(1)

    return Net()


def torch_setup(net_params: dict, module, dtype: str, layout: str, device: str = "cuda"):
    """Copy our parameters in; conv weights in the data type, BN parameters in float32 (as ours)."""
    import torch
    sd = module.state_dict()
    with torch.no_grad():
        for k, v in net_params.items():
            sd[k].copy_(torch.from_numpy(np.asarray(v, np.float32)).reshape(sd[k].shape))
    module.to(device)
    if dtype == "float16":
        for m in module.modules():
            if isinstance(m, torch.nn.Conv2d):
                m.half()
    if layout == "NHWC":
        module.to(memory_format=torch.channels_last)
    module.train()
    return module


def torch_input(x_nchw: np.ndarray, dtype: str, layout: str, device: str = "cuda"):
    import torch
    t = torch.from_numpy(np.ascontiguousarray(x_nchw)).to(device).to(getattr(torch, dtype))
    return t.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else t.contiguous()


# -- rows ------------------------------------------------------------------------------------------------

def _safe(row: dict, key: str, fn):
    try:
        row[key] = fn()
    except Exception as e:  # noqa: BLE001 - a failing variant is reported, the others still run
        row[key] = None
        row.setdefault("errors", {})[key] = f"{type(e).__name__}: {e}"[:500]
        traceback.print_exc()


def block_row(ex, h, args, dtype, layout) -> dict:
    import cupy
    N, C, HW = (8, 64, 28) if args.quick else (32, 64, 56)
    name = f"basic_block {dtype} {layout} N={N} {C}@{HW}"
    row = {"name": name, "kind": "basic_block", "dtype": dtype, "layout": layout, "N": N, "C": C, "HW": HW}
    t0 = time.time()
    blk = ex.build_basic_block(h, N, C, HW, HW, dtype, layout)
    row["build_s"] = time.time() - t0
    row["algos"] = {k: c.algos for k, c in (("conv1", blk.conv1), ("conv2", blk.conv2))}
    it = dict(iters=args.iters * 4, reps=args.reps, warm=3)
    row["ours_ms"] = cuda_time(lambda: blk.forward(), **it)["ms"]
    ours_out = blk.net.get(blk.forward())

    def fused():
        blk.fused = True
        try:
            ms = cuda_time(lambda: blk.forward(), **it)["ms"]
            row["fused_rel_err_vs_ours"] = rel_err(blk.net.get(blk.forward()), ours_out)
            return ms
        finally:
            blk.fused = False
    _safe(row, "ours_fused_ms", fused)

    def legacy():
        calls = []
        with recording(calls):
            blk.forward()
        prog = LegacyProgram(calls)
        try:
            row["legacy_calls"] = len(prog.calls)
            prog.run()
            cupy.cuda.Device().synchronize()
            row["legacy_rel_err_vs_ours"] = rel_err(blk.net.get(blk.relu2.y.data), ours_out)
            return cuda_time(prog.run, **it)["ms"]
        finally:
            prog.close()
    _safe(row, "legacy_ms", legacy)

    def torch_block():
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        p = blk.params()
        m = nn.ModuleDict({"conv1": nn.Conv2d(C, C, 3, 1, 1, bias=False), "bn1": nn.BatchNorm2d(C),
                           "conv2": nn.Conv2d(C, C, 3, 1, 1, bias=False), "bn2": nn.BatchNorm2d(C)})
        m = torch_setup(p, m, dtype, layout)
        x = torch_input(blk.net.get(blk.x.data), dtype, layout)

        def fwd():
            with torch.no_grad():
                y = F.relu(m["bn1"](m["conv1"](x)))
                return F.relu(m["bn2"](m["conv2"](y)) + x)
        out = fwd().float().cpu().numpy()
        row["max_rel_err_vs_torch"] = rel_err(ours_out, out)
        return cuda_time(fwd, events="torch", **it)["ms"]
    _safe(row, "torch_ms", torch_block)
    blk.destroy()
    return row


def torch_grads(p0, net, x_host, labels_host, dtype, layout) -> tuple:
    """(loss, {name: gradient}) of one torch step from our weights, no update."""
    import torch
    import torch.nn.functional as F
    m = torch_setup(p0, torch_resnet(net), dtype, layout)
    xt = torch_input(x_host, dtype, layout)
    yt = torch.from_numpy(labels_host).cuda()
    loss = F.nll_loss(F.log_softmax(m(xt), 1), yt)
    loss.backward()
    g = {k: v.grad.float().cpu().numpy() for k, v in m.named_parameters()}
    out = float(loss.detach())
    del m, xt, loss
    torch.cuda.empty_cache()
    return out, g


def _errs(loss, grads, ref_loss, ref) -> dict:
    out = {"loss": abs(loss - ref_loss) / abs(ref_loss)}
    out.update({k: rel_err(grads[k].reshape(ref[k].shape), ref[k]) for k in CHECKED_GRADS if k in grads and k in ref})
    return out


def torch_graph_ms(m, opt, xt, yt, it: dict) -> float:
    """torch's training step captured in one CUDA graph and replayed (torch's whole-network
    recipe: warm-up on a side stream, grads set to None, forward + backward + step captured)."""
    import torch
    import torch.nn.functional as F

    def step():
        F.nll_loss(F.log_softmax(m(xt), 1), yt).backward()
        opt.step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    try:
        return cuda_time(g.replay, events="torch", **it)["ms"]
    finally:
        del g


def ours_graph_ms(net, h, x, labels, p0: dict, it: dict) -> tuple:
    """(ms per replay, the loss a replay computes from ``p0``) of our step captured by the user:
    the handle bound to a CuPy stream (cudnnSetStream), two warm-up steps on it (plans, per-stream
    workspaces), one step captured (relaxed mode), the graph launched on that stream."""
    import cupy
    s = cupy.cuda.Stream(non_blocking=True)
    cc.cudnnSetStream(h, s.ptr)
    try:
        with s:
            for _ in range(2):
                net.step(x, labels, lr=LR, sync=False)
            s.synchronize()
            s.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
            try:
                loss = net.step(x, labels, lr=LR, sync=False)
            finally:
                graph = s.end_capture()
            if hasattr(graph, "upload"):
                graph.upload(s)
            net.set_params(p0)
            s.synchronize()
            graph.launch(s)
            s.synchronize()
            first = float(loss)
            ms = cuda_time(lambda: graph.launch(s), **it)["ms"]
            s.synchronize()
        return ms, first
    finally:
        cc.cudnnSetStream(h, 0)


def legacy_step(net, x, labels, layout, p0: dict, loss0: float, row: dict) -> tuple:
    """The real legacy library's step: the calls of one of our steps recorded and replayed through
    libcudnn (``LegacyProgram``), the loss computed between forward and backward as ours computes
    it; the program's BN mode, call count, loss and its error against ours go in ``row``.  Returns
    (program, step function, index after the softmax); the caller closes the program."""
    net.set_params(p0)
    calls = []
    with recording(calls):
        net.step(x, labels, lr=LR)
    net.set_params(p0)
    mode = legacy_bn_mode(layout)
    prog = LegacyProgram(calls, mode)
    row["legacy_bn_mode"] = "SPATIAL_PERSISTENT" if mode is not None else "SPATIAL"
    try:
        row["legacy_calls"] = len(prog.calls)
        k = prog.index_after("cudnnSoftmaxForward")
        box = {}

        def step():
            prog.run(0, k)
            box["loss"] = net.nll(labels)  # the program's loss and -onehot/N, as ours computes them
            prog.run(k)
        step()
        row["legacy_loss"] = float(box["loss"])
        row["legacy_rel_err_vs_ours"] = abs(row["legacy_loss"] - loss0) / abs(loss0)
    except BaseException:
        prog.close()
        raise
    return prog, step, k


def ours_columns(row, net, h, x, labels, p0, loss0, it) -> None:
    """``ours_ms`` (eager steps) and ``ours_graph_ms`` (the same step captured into a CUDA graph,
    ``ours_graph_ms``), with the captured step's loss against the eager one's, into ``row``."""
    row["ours_ms"] = cuda_time(lambda: net.step(x, labels, lr=LR, sync=False), **it)["ms"]

    def ours_graph():
        ms, loss = ours_graph_ms(net, h, x, labels, p0, it)
        row["ours_graph_loss_rel_err_vs_ours"] = abs(loss - loss0) / abs(loss0)
        return ms
    _safe(row, "ours_graph_ms", ours_graph)


def torch_columns(row, m, opt, xt, yt, it, prof: "dict | None" = None) -> float:
    """The eager torch step's ms (returned) and ``torch_graph_ms`` (its kernels captured into a CUDA
    graph) into ``row``; with ``prof`` the eager step's kernels as ``prof["torch"]``."""
    import torch.nn.functional as F

    def step():
        opt.zero_grad(set_to_none=True)
        F.nll_loss(F.log_softmax(m(xt), 1), yt).backward()
        opt.step()
    ms = cuda_time(step, events="torch", **it)["ms"]
    if prof is not None:
        prof["torch"] = torch_kernels(step)
    _safe(row, "torch_graph_ms", lambda: torch_graph_ms(m, opt, xt, yt, it))
    return ms


def resnet_row(ex, h, args, dtype, layout, batch: int = 32) -> dict:
    import cupy
    N, S, width = (min(batch, 4), 64, 0.25) if args.quick else (batch, 224, 1.0)
    classes = 1000
    name = f"resnet50_step {dtype} {layout} N={N} {S}x{S}" + (f" width {width}" if width != 1 else "")
    row = {"name": name, "kind": "resnet50_step", "dtype": dtype, "layout": layout, "N": N, "size": S,
           "width": width, "lr": LR}
    t0 = time.time()
    net = ex.build(h, N, S, S, dtype, layout, classes, width, seed=0)
    row["build_s"] = time.time() - t0
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal((N, 3, S, S))
    labels_host = rng.integers(0, classes, N)
    x, labels = net.input(x_host), cupy.asarray(labels_host)
    p0 = net.params()
    if dtype == "float16":  # every side starts from the same fp16-representable weights and input
        p0 = {k: v.astype(np.float16).astype(np.float32) for k, v in p0.items()}
        x_host = x_host.astype(np.float16).astype(np.float64)
        net.set_params(p0)

    # numbers first, from the initial weights: ours (no update), torch in our dtype and in fp32 (FMA)
    loss0 = net.step(x, labels, lr=0.0)
    g0 = net.grads()
    row["loss"] = loss0
    it = dict(iters=args.iters, reps=args.reps, warm=2)
    ref = {}

    def references():
        tl, tg = torch_grads(p0, net, x_host, labels_host, dtype, layout)
        errs = _errs(loss0, g0, tl, tg)
        row["torch_loss"], row["rel_errs_vs_torch"] = tl, errs
        row["max_rel_err_vs_torch"] = max(errs.values())
        ref["fp32"] = torch_grads(p0, net, x_host, labels_host, "float32", "NCHW") if dtype != "float32" else (tl, tg)
        row["rel_errs_vs_torch_fp32"] = {"ours": _errs(loss0, g0, *ref["fp32"]), "torch": _errs(tl, tg, *ref["fp32"])}
        return True
    _safe(row, "torch_ok", references)

    def torch_step():
        import torch
        m = torch_setup(p0, torch_resnet(net), dtype, layout)
        xt = torch_input(x_host, dtype, layout)
        yt = torch.from_numpy(labels_host).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=LR)
        ms = torch_columns(row, m, opt, xt, yt, it, prof if args.profile else None)
        del m, opt
        torch.cuda.empty_cache()
        return ms
    prof = {}
    _safe(row, "torch_ms", torch_step)

    ours_columns(row, net, h, x, labels, p0, loss0, it)
    row["eager_over_captured"] = _ratio(row.get("ours_ms"), row.get("ours_graph_ms"))
    if args.profile:
        def ours_profile():
            stats = {}
            with call_profile(stats):
                net.step(x, labels, lr=LR)
            prof["ours_by_function"] = _rounded(stats)
            try:
                prof["ours_kernels"] = torch_kernels(lambda: net.step(x, labels, lr=LR, sync=False))
            except Exception as e:  # noqa: BLE001
                prof["ours_kernels"] = f"{type(e).__name__}: {e}"[:300]
            return True
        _safe(row, "profiled", ours_profile)

    def fused():
        net.set_params(p0)
        net.fused = True
        try:
            loss = net.step(x, labels, lr=0.0)
            row["fused_loss_rel_err_vs_ours"] = abs(loss - loss0) / abs(loss0)
            return cuda_time(lambda: net.step(x, labels, lr=LR, sync=False), **it)["ms"]
        finally:
            net.fused = False
    _safe(row, "ours_fused_ms", fused)

    def legacy():
        prog, step, k = legacy_step(net, x, labels, layout, p0, loss0, row)
        try:
            if "fp32" in ref:
                row["rel_errs_vs_torch_fp32"]["legacy"] = _errs(row["legacy_loss"], net.grads(), *ref["fp32"])
            if prog.notes:
                row["legacy_notes"] = prog.notes
            ms = cuda_time(step, **it)["ms"]
            if args.profile:
                stats = {}
                prog.run_profiled(stats, 0, k)
                net.nll(labels)
                prog.run_profiled(stats, k)
                prof["legacy_by_function"] = _rounded(stats)
            return ms
        finally:
            prog.close()
    _safe(row, "legacy_ms", legacy)
    if prof:
        row["profile"] = prof
        for side in ("ours_by_function", "legacy_by_function"):
            for fn_name, v in list(prof.get(side, {}).items())[:8]:
                print(f"profile {name} {side[:-12]:6s} {fn_name:40s} calls {v['calls']:4d} host {v['host_us']:9.1f} us"
                      f"  gpu {v['gpu_ms']:8.3f} ms", flush=True)
        for side in ("torch", "ours_kernels"):
            if isinstance(prof.get(side), dict):
                print(f"profile {name} {side} kernels {prof[side]['kernel_ms']:.3f} ms:", flush=True)
                for k in prof[side]["top"][:8]:
                    print(f"    {k['ms']:8.3f} ms x{k['count']:4d} {k['kernel'][:100]}", flush=True)
    if args.diff:
        def diff():
            net.set_params(p0)
            calls = []
            with recording(calls):
                net.step(x, labels, lr=0.0)
            return per_call_diff(net, labels, calls)
        _safe(row, "per_call_diff", diff)
    net.destroy()
    return row


# -- small batches (issue 26 item 8): the step's host cost, eager against captured --------------------

SMALL_BATCH = 4  # --batches values up to this get small_batch_row, larger ones resnet_row
TARGET_EAGER_OVER_CAPTURED = 2.0  # issue 26 item 8: at N=1 our eager step within 2x our captured step
AUTOTUNE_VAR = "CUDNN_COMPAT_CUDNN_AUTOTUNE"


def _ratio(num, den) -> "float | None":
    """num / den when both are positive numbers (two columns of a row), else None."""
    if isinstance(num, (int, float)) and isinstance(den, (int, float)) and num > 0 and den > 0:
        return num / den
    return None


@contextlib.contextmanager
def autotune_limit(k: int):
    """CUDNN_COMPAT_CUDNN_AUTOTUNE=k in the environment within the block (``k`` 0, or the variable
    already set: unchanged); yields the value in force ("" when unset: every config is timed).  Read
    when a plan is built only; the per-call paths do not look at it (no ``config.override``, which
    would turn their fast paths off while the timed steps run)."""
    before = os.environ.get(AUTOTUNE_VAR)
    if k <= 0 or (before or "").strip():
        yield before or ""
        return
    os.environ[AUTOTUNE_VAR] = str(int(k))
    try:
        yield os.environ[AUTOTUNE_VAR]
    finally:
        if before is None:
            os.environ.pop(AUTOTUNE_VAR, None)
        else:
            os.environ[AUTOTUNE_VAR] = before


def small_batch_row(ex, h, args, dtype, layout, N: int = 1) -> dict:
    """The ResNet-50 step at a small batch (N=1): the host cost of a step, our eager step against
    the same step captured into a CUDA graph (``ours_graph_ms``, as the N=32 rows capture it), with
    torch eager and captured and the legacy replay beside them; ``eager_over_captured`` (ours eager
    / ours captured) against the issue's target ``target_eager_over_captured``.  Checked: the loss
    and the CHECKED_GRADS gradients of our first step against torch's from the same weights (no
    float32 references, no fused column); --small-iters steps per repetition, --small-reps
    repetitions; plans built under CUDNN_COMPAT_CUDNN_AUTOTUNE=--small-autotune (``autotune``)."""
    S, width = (64, 0.25) if args.quick else (224, 1.0)
    classes = 1000
    name = f"resnet50_step {dtype} {layout} N={N} {S}x{S}" + (f" width {width}" if width != 1 else "")
    row = {"name": name, "kind": "resnet50_step", "dtype": dtype, "layout": layout, "N": N, "size": S,
           "width": width, "lr": LR, "iters": args.small_iters, "reps": args.small_reps,
           "target_eager_over_captured": TARGET_EAGER_OVER_CAPTURED}
    with autotune_limit(args.small_autotune) as tune:
        row["autotune"] = tune or "every config"
        t0 = time.time()
        net = ex.build(h, N, S, S, dtype, layout, classes, width, seed=0)
        row["build_s"] = time.time() - t0
        try:
            _small_batch_columns(row, net, h, args, dtype, layout, N, S, classes)
        except Exception as e:  # noqa: BLE001 - the row keeps the columns it has
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            net.destroy()
    ratio = row["eager_over_captured"] = _ratio(row.get("ours_ms"), row.get("ours_graph_ms"))
    row["eager_over_captured_ok"] = None if ratio is None else ratio <= TARGET_EAGER_OVER_CAPTURED
    row["torch_eager_over_captured"] = _ratio(row.get("torch_ms"), row.get("torch_graph_ms"))
    tr = row["torch_eager_over_captured"]
    host = row.get("ours_host_ms")
    print(f"{name}: ours eager / captured " + (f"{ratio:.2f}" if ratio is not None else "-")
          + f" (target <= {TARGET_EAGER_OVER_CAPTURED:g}); torch eager / captured "
          + (f"{tr:.2f}" if tr is not None else "-")
          + (f"; our eager step issued in {host:.2f} ms of host time from an idle queue, device floor "
             f"{fmt_ms(row.get('ours_floor_ms')).strip()} ms; driver floor {fmt_ms(row.get('driver_floor_ms')).strip()} ms "
             f"({row.get('ours_launches')} launches x {row.get('driver_launch_us')} us; py_calib "
             f"{row.get('host_calib_us')} us)"
             if host is not None else ""), flush=True)
    return row


def _small_batch_columns(row, net, h, args, dtype, layout, N, S, classes) -> None:
    """``small_batch_row``'s columns and checks, written into ``row`` (the caller builds and destroys
    ``net``)."""
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal((N, 3, S, S))
    labels_host = rng.integers(0, classes, N)
    x, labels = net.input(x_host), net.net.xp.asarray(labels_host)
    p0 = net.params()
    if dtype == "float16":  # every side starts from the same fp16-representable weights and input
        p0 = {k: v.astype(np.float16).astype(np.float32) for k, v in p0.items()}
        x_host = x_host.astype(np.float16).astype(np.float64)
        net.set_params(p0)
    loss0 = net.step(x, labels, lr=0.0)  # from the initial weights, no update (plans built here)
    g0 = {k: v for k, v in net.grads().items() if k in CHECKED_GRADS}
    row["loss"] = loss0
    it = dict(iters=args.small_iters, reps=args.small_reps, warm=3)

    def torch_step():
        import torch
        import torch.nn.functional as F
        m = torch_setup(p0, torch_resnet(net), dtype, layout)
        xt = torch_input(x_host, dtype, layout)
        yt = torch.from_numpy(labels_host).to(xt.device)
        opt = torch.optim.SGD(m.parameters(), lr=LR)
        loss = F.nll_loss(F.log_softmax(m(xt), 1), yt)  # torch's numbers from the same weights
        loss.backward()
        tl = float(loss.detach())
        tg = {k: v.grad.float().cpu().numpy() for k, v in m.named_parameters() if k in CHECKED_GRADS}
        errs = _errs(loss0, g0, tl, tg)
        row["torch_loss"], row["rel_errs_vs_torch"] = tl, errs
        row["max_rel_err_vs_torch"] = max(errs.values())
        del loss

        ms = torch_columns(row, m, opt, xt, yt, it)
        del m, opt
        torch.cuda.empty_cache()
        return ms
    _safe(row, "torch_ms", torch_step)

    ours_columns(row, net, h, x, labels, p0, loss0, it)
    # what bounds the eager step: the host issuing one step from an idle queue (ours_host_ms), or the
    # device running its launches queued up front (ours_floor_ms); the host's Python speed, to compare
    # runs on other machines
    step = lambda: net.step(x, labels, lr=LR, sync=False)  # noqa: E731
    row["ours_host_ms"] = issue_time(step, iters=1, reps=15, warm=2, sync=net.net.sync)
    row["host_calib_us"] = round(host_calib_us(), 3)
    if net.net.place == "gpu":
        _safe(row, "ours_floor_ms", lambda: device_floor_ms(step)["ms"])
        # the driver's share: the step's launches (kernels and memsets, counted by torch.profiler) times
        # this host's cost of one bare launch; no library issues those launches in less
        _safe(row, "ours_launches", lambda: torch_kernels(step)["launches"])
        _safe(row, "driver_launch_us", lambda: round(driver_launch_us(), 3))
        if row.get("ours_launches") and row.get("driver_launch_us"):
            row["driver_floor_ms"] = round(row["ours_launches"] * row["driver_launch_us"] / 1e3, 3)

    def legacy():
        prog, step, _k = legacy_step(net, x, labels, layout, p0, loss0, row)
        try:
            if prog.notes:
                row["legacy_notes"] = prog.notes
            return cuda_time(step, **it)["ms"]
        finally:
            prog.close()
    if args.small_legacy:
        _safe(row, "legacy_ms", legacy)


# -- per-call differential: each recorded call on the legacy library and on ours, from the same inputs --

OUTPUTS = {
    "cudnnConvolutionForward": ("y",), "cudnnConvolutionBackwardData": ("dx",),
    "cudnnConvolutionBackwardFilter": ("dw",), "cudnnConvolutionBackwardBias": ("db",),
    "cudnnAddTensor": ("C_data",), "cudnnActivationForward": ("y",), "cudnnActivationBackward": ("dx",),
    "cudnnPoolingForward": ("y",), "cudnnPoolingBackward": ("dx",), "cudnnSoftmaxForward": ("y",),
    "cudnnSoftmaxBackward": ("dx",),
    "cudnnBatchNormalizationForwardTraining": ("y", "resultRunningMean", "resultRunningVariance", "resultSaveMean",
                                               "resultSaveInvVariance"),
    "cudnnBatchNormalizationBackward": ("dx", "resultBnScaleDiff", "resultBnBiasDiff"),
}


def per_call_diff(net, labels, calls, top: int = 12) -> dict:
    """Run every call of one step twice from the same buffer state (the legacy call, outputs
    restored, then ours; the step goes on with ours) and compare the outputs: the calls where ours
    and the legacy library disagree most (max |ours - legacy| / max |legacy| per output)."""
    import cupy
    prog = LegacyProgram(calls)
    k = prog.index_after("cudnnSoftmaxForward")
    out = []
    try:
        for i, ((name, kw), (_n, fn, cargs)) in enumerate(zip(calls, prog.calls)):
            if i == k:
                net.nll(labels)
            outs = [kw[p] for p in OUTPUTS[name]]
            snap = [o.copy() for o in outs]
            st = fn(*cargs)
            cupy.cuda.Device().synchronize()
            if st:
                out.append({"i": i, "name": name, "legacy_status": st})
                continue
            leg = [o.astype(cupy.float64) for o in outs]
            for o, sv in zip(outs, snap):
                o[...] = sv
            cc.LEGACY[name](**kw)
            errs = {}
            for p, o, lv in zip(OUTPUTS[name], outs, leg):
                d = float(cupy.abs(o.astype(cupy.float64) - lv).max())
                scale = float(cupy.abs(lv).max())
                errs[p] = d / scale if scale else d
            desc = {p: list(getattr(v, "dims", ())) for p, v in kw.items() if p.endswith("Desc") and hasattr(v, "dims")}
            out.append({"i": i, "name": name, "errs": errs, "max": max(errs.values()), "dims": desc,
                        "algo": kw.get("algo")})
    finally:
        prog.close()
    ranked = sorted((r for r in out if "max" in r), key=lambda r: -r["max"])
    by_fn = {}
    for r in out:
        if "max" in r:
            by_fn[r["name"]] = max(by_fn.get(r["name"], 0.0), r["max"])
    for r in ranked[:top]:
        print(f"diff  #{r['i']:4d} {r['name']:40s} {r['max']:.3e} {r['errs']} algo={r['algo']} {r['dims']}", flush=True)
    return {"worst": ranked[:top], "max_by_function": by_fn, "failed": [r for r in out if "legacy_status" in r]}


def host_us(args) -> dict:
    """benchmarks/host_overhead.py's figures on the GPU place, merged in as that script reports them
    (its ``host_us()`` when it has one, else its ``main()``'s cases: median microseconds)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_overhead.py")
    if not os.path.exists(path):
        return {"note": "benchmarks/host_overhead.py is not there"}
    spec = importlib.util.spec_from_file_location("host_overhead", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if hasattr(mod, "host_us"):
        return mod.host_us()
    out = mod.main(["--place", "gpu", "--calls", str(args.host_calls)])
    cases = out.get("cases", out) if isinstance(out, dict) else {}
    res = {}
    for case, r in cases.items():
        if isinstance(r, dict) and "median_us" in r:
            res[case] = {k: r[k] for k in r if k != "profile"}
        else:
            res[case] = r
    return res


COLUMNS = ("ours_ms", "ours_fused_ms", "ours_graph_ms", "legacy_ms", "torch_ms", "torch_graph_ms")


def table(rows) -> str:
    lines = [f"{'name (ms per step / block)':46s} {'ours':>9s} {'fused':>9s} {'graph':>9s} {'legacy':>9s} "
             f"{'torch':>9s} {'t graph':>9s}  {'err vs torch':>12s} {'ours/graph':>10s}"]
    for r in rows:
        err = r.get("max_rel_err_vs_torch")
        err = f"{err:12.2e}" if isinstance(err, float) else f"{'-':>12s}"
        ratio = r.get("eager_over_captured")
        ratio = f"{ratio:10.2f}" if isinstance(ratio, float) else f"{'-':>10s}"
        lines.append(f"{r['name']:46s} " + " ".join(fmt_ms(r.get(c)) for c in COLUMNS) + "  " + err + " " + ratio)
    return "\n".join(lines)


def batch_sizes(text: str) -> list:
    """--batches: "32,1" -> [32, 1] (each a positive integer, in the order given)."""
    out = []
    for part in text.split(","):
        if part.strip():
            n = int(part)
            if n < 1:
                raise ValueError(f"batch size {n} is not positive")
            out.append(n)
    if not out:
        raise ValueError("no batch size")
    return out


def plan_jobs(only, configs, batches) -> list:
    """The rows in the order they run, as (row function, dtype, layout, its keyword arguments): the
    block rows, then per batch size (``--batches``) the ResNet-50 step rows of every config."""
    jobs = []
    if only in (None, "block"):
        jobs += [(block_row, d, l, {}) for d, l in configs]
    if only in (None, "resnet"):
        for n in batches:
            if n <= SMALL_BATCH:
                jobs += [(small_batch_row, d, l, {"N": n}) for d, l in configs]
            else:
                jobs += [(resnet_row, d, l, {"batch": n}) for d, l in configs]
    return jobs


def arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--iters", type=int, default=5, help="steps per timed repetition (x4 for the block)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", choices=("block", "resnet"), default=None)
    ap.add_argument("--configs", default=None, help="e.g. float16:NHWC (default: fp16 NHWC and fp32 NCHW)")
    ap.add_argument("--no-host", action="store_true", help="skip benchmarks/host_overhead.py")
    ap.add_argument("--diff", action="store_true", help="ResNet rows: per-call ours vs legacy differential")
    ap.add_argument("--profile", action="store_true",
                    help="ResNet rows: per-function host/GPU time of ours and legacy, torch's top kernels")
    ap.add_argument("--batches", default="32,1",
                    help="ResNet-50 step rows' batch sizes, in order (default 32,1): above "
                         f"{SMALL_BATCH} every column (--quick: at most 4), up to {SMALL_BATCH} the "
                         "small-batch row (ours eager and captured, torch eager and captured, legacy); "
                         "--batches 32 skips the N=1 rows")
    ap.add_argument("--small-iters", type=int, default=20, help="small-batch rows: steps per timed repetition")
    ap.add_argument("--small-reps", type=int, default=3, help="small-batch rows: timed repetitions")
    ap.add_argument("--small-autotune", type=int, default=4,
                    help="small-batch rows: CUDNN_COMPAT_CUDNN_AUTOTUNE while they run (engine configs timed "
                         "per convolution graph: mode A's first N and N more; 0: as the environment says, "
                         "unset: every config, as the N=32 rows)")
    ap.add_argument("--no-small-legacy", dest="small_legacy", action="store_false",
                    help="small-batch rows: skip the legacy column")
    ap.add_argument("--host-calls", type=int, default=10000)
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    return ap


def main(argv=None) -> dict:
    ap = arg_parser()
    args = ap.parse_args(argv)
    try:
        batches = batch_sizes(args.batches)
    except ValueError as e:
        ap.error(f"--batches {args.batches!r}: {e}")

    try:
        import torch
        import cupy  # noqa: F401 - needed by every row; checked here so a CPU machine gets one line
    except ImportError as e:
        sys.exit(missing_gpu_stack(__file__, e))
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    ex = load_example()
    h = cc.cudnnCreate("gpu")
    res = {"meta": meta(quick=args.quick, iters=args.iters, reps=args.reps, lr=LR, batches=batches,
                        small_iters=args.small_iters, small_reps=args.small_reps,
                        small_autotune=args.small_autotune, small_legacy=args.small_legacy,
                        target_eager_over_captured=TARGET_EAGER_OVER_CAPTURED,
                        math={"float32": "FMA (TF32 off in torch)", "float16": "TENSOR_OP"}), "rows": []}
    prefix = "bench_programs" + ("_quick" if args.quick else "")
    t0 = time.time()
    configs = [tuple(c.split(":")) for c in args.configs.split(",")] if args.configs else CONFIGS
    for fn, dtype, layout, kw in plan_jobs(args.only, configs, batches):
        try:
            row = fn(ex, h, args, dtype, layout, **kw)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row = {"name": f"{fn.__name__} {dtype} {layout}" + "".join(f" {k}={v}" for k, v in kw.items()),
                   "error": f"{type(e).__name__}: {e}"[:500]}
        row["elapsed_s"] = time.time() - t0
        res["rows"].append(row)
        print(table([row]).splitlines()[-1], flush=True)
        path = write_json(prefix, res, args.out)
    if not args.no_host:
        try:
            res["host_us"] = host_us(args)
        except Exception as e:  # noqa: BLE001
            res["host_us"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    res["seconds"] = time.time() - t0
    path = write_json(prefix, res, args.out)
    cc.cudnnDestroy(h)
    print(table(res["rows"]))
    print("wrote", path)
    return res


if __name__ == "__main__":
    main()
