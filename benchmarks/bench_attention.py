"""Multi-head attention (issue 18 item 1, issue 24 items 1 and 4): ours (cudnnMultiHeadAttnForward,
BackwardData, BackwardWeights through the legacy API on a GPU handle: the attention core through
cuDNN's fused flash-attention graph, projections on cuBLAS; CPU fallback forbidden) vs torch
``nn.MultiheadAttention`` (need_weights=False; its backward through autograd), fp16, every
projection and bias, CUDNN_TENSOR_OP_MATH, self-attention, smScaler 1/sqrt(head dim), at
``SHAPES`` (batch, tokens, embedding, heads): B32 T512 E512 8 heads (head 64), T128, T2048
(batch 8) and head dim 128.

CUDA events, medians over ``--reps`` of ``--iters`` back-to-back calls (host cost included),
inputs resident on the device.  Rows: forward inference (no reserve space; torch under no_grad),
forward_training (reserve space; torch with autograd recording), backward_data, backward_weights
and backward (both; torch: the autograd backward of the output to the inputs and every
parameter, which has no split).  ``ratio`` = ours / torch (< 1: ours faster);
``training_step`` = forward_training + backward.  ``torch_sdpa_kernel``: torch's
F.scaled_dot_product_attention alone on the shape's core.  Errors: ``err_torch`` = max |ours -
torch| / max |torch| of the forward output with the same weights, and ``err_reference`` of all
three calls against the reference engine (CPU handle) at a small shape.  The JSON records the
device, the git commit (``--commit`` where the tree has no git) and the UTC time.

    python benchmarks/bench_attention.py [--quick] [--iters 10] [--reps 5] [--commit SHA] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("CUDNN_COMPAT_CPU_FALLBACK", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_time, device_name, fmt_ms, git_commit, meta, missing_gpu_stack, rel_err, write_json  # noqa: E402

try:  # guarded so that --help works without a GPU stack; main() reports what is missing
    import torch  # noqa: E402
    import cupy  # noqa: E402
except ImportError as _e:
    torch = cupy = None
    _MISSING = _e

import cudnn_compat as cc  # noqa: E402

T_AX, B_AX, BEAM_AX, V_AX = 0, 1, 2, 3


class Attn:
    """One attention configuration on handle ``h`` (self-attention: q = k = v), batch-major
    sequence data [B, T, E], weights placed through cudnnGetMultiHeadAttnWeights."""

    def __init__(self, h, xp, batch, tokens, embed, heads, dtype=cc.CUDNN_DATA_HALF, seed=0):
        self.h, self.xp = h, xp
        self.npt = {cc.CUDNN_DATA_HALF: np.float16, cc.CUDNN_DATA_FLOAT: np.float32}[dtype]
        p = embed // heads
        self.sm = 1.0 / np.sqrt(p)
        math = cc.CUDNN_TENSOR_OP_MATH if dtype == cc.CUDNN_DATA_HALF else cc.CUDNN_DEFAULT_MATH
        self.attn = cc.cudnnCreateAttnDescriptor()
        cc.cudnnSetAttnDescriptor(self.attn, cc.CUDNN_ATTN_ENABLE_PROJ_BIASES, heads, self.sm, dtype, dtype, math,
                                  None, None, embed, embed, embed, p, p, p, embed, tokens, tokens, batch, 1)
        dims = [0] * 4
        dims[T_AX], dims[B_AX], dims[BEAM_AX], dims[V_AX] = tokens, batch, 1, embed
        self.sd = cc.cudnnCreateSeqDataDescriptor()
        cc.cudnnSetSeqDataDescriptor(self.sd, dtype, 4, dims, [B_AX, BEAM_AX, T_AX, V_AX], batch, [tokens] * batch, None)
        self.wsize, _, self.rsize = cc.cudnnGetMultiHeadAttnBuffers(h, self.attn)
        self.lo = np.zeros(tokens, np.int32)
        self.hi = np.full(tokens, tokens, np.int32)
        rng = np.random.default_rng(seed)
        e = embed
        self.host = {"x": rng.standard_normal((batch, tokens, e)).astype(self.npt),
                     "w_in": (rng.standard_normal((3 * e, e)) / np.sqrt(e)).astype(self.npt),
                     "b_in": (rng.standard_normal(3 * e) * 0.1).astype(self.npt),
                     "w_out": (rng.standard_normal((e, e)) / np.sqrt(e)).astype(self.npt),
                     "b_out": (rng.standard_normal(e) * 0.1).astype(self.npt),
                     "dy": rng.standard_normal((batch, tokens, e)).astype(self.npt)}
        self.shape = (batch, tokens, embed, heads)
        self.w = self._weights()
        self.x = xp.asarray(self.host["x"].reshape(-1))
        self.dy = xp.asarray(self.host["dy"].reshape(-1))
        self.out = xp.zeros(self.x.size, self.npt)
        self.reserve = xp.zeros(self.rsize, np.uint8)
        self.dx = [xp.zeros(self.x.size, self.npt) for _ in range(3)]
        self.dw = xp.zeros_like(self.w)

    def _weights(self):
        """torch's in_proj/out_proj as the attention weight buffer (002 §7.2.16 layout)."""
        b, t, e, nh = self.shape
        p = e // nh
        hw = self.host
        host = np.zeros(self.wsize // np.dtype(self.npt).itemsize, self.npt)
        desc = cc.cudnnCreateTensorDescriptor()
        base = host.ctypes.data
        parts = {cc.CUDNN_MH_ATTN_Q_WEIGHTS: hw["w_in"][:e], cc.CUDNN_MH_ATTN_K_WEIGHTS: hw["w_in"][e:2 * e],
                 cc.CUDNN_MH_ATTN_V_WEIGHTS: hw["w_in"][2 * e:],
                 cc.CUDNN_MH_ATTN_O_WEIGHTS: hw["w_out"].reshape(e, nh, p).transpose(1, 0, 2),
                 cc.CUDNN_MH_ATTN_Q_BIASES: hw["b_in"][:e], cc.CUDNN_MH_ATTN_K_BIASES: hw["b_in"][e:2 * e],
                 cc.CUDNN_MH_ATTN_V_BIASES: hw["b_in"][2 * e:], cc.CUDNN_MH_ATTN_O_BIASES: hw["b_out"]}
        for kind, value in parts.items():
            addr = cc.cudnnGetMultiHeadAttnWeights(self.h, self.attn, kind, self.wsize, host, desc)
            off = (addr - base) // host.itemsize
            flat = np.ascontiguousarray(value).reshape(-1)
            host[off:off + flat.size] = flat
        cc.cudnnDestroyTensorDescriptor(desc)
        return self.xp.asarray(host)

    def forward(self, training=False):
        res, rs = (self.reserve, self.rsize) if training else (None, 0)
        cc.cudnnMultiHeadAttnForward(self.h, self.attn, -1, self.lo, self.hi, None, None, self.sd, self.x, None,
                                     self.sd, self.x, self.sd, self.x, self.sd, self.out, self.wsize, self.w, 0, None,
                                     rs, res)

    def backward(self):
        self.backward_data()
        self.backward_weights()

    def backward_data(self):
        dq, dk, dv = self.dx
        cc.cudnnMultiHeadAttnBackwardData(self.h, self.attn, self.lo, self.hi, None, None, self.sd, self.dy, self.sd, dq,
                                          self.x, self.sd, dk, self.x, self.sd, dv, self.x, self.wsize, self.w, 0, None,
                                          self.rsize, self.reserve)

    def backward_weights(self):
        cc.cudnnMultiHeadAttnBackwardWeights(self.h, self.attn, cc.CUDNN_WGRAD_MODE_SET, self.sd, self.x, self.sd,
                                             self.x, self.sd, self.x, self.sd, self.dy, self.wsize, self.w, self.dw, 0,
                                             None, self.rsize, self.reserve)

    def results(self):
        get = (lambda a: a.get()) if self.xp is not np else (lambda a: a)
        return [get(self.out)] + [get(d) for d in self.dx] + [get(self.dw)]


def torch_mha(a: Attn):
    b, t, e, nh = a.shape
    m = torch.nn.MultiheadAttention(e, nh, bias=True, batch_first=True, device="cuda", dtype=torch.float16)
    hw = a.host
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.from_numpy(hw["w_in"]))
        m.in_proj_bias.copy_(torch.from_numpy(hw["b_in"]))
        m.out_proj.weight.copy_(torch.from_numpy(hw["w_out"]))
        m.out_proj.bias.copy_(torch.from_numpy(hw["b_out"]))
    x = torch.from_numpy(hw["x"]).cuda().requires_grad_(True)
    dy = torch.from_numpy(hw["dy"]).cuda()
    return m, x, dy


def err_reference(batch=2, tokens=48, embed=64, heads=4) -> float:
    """max over the three calls' results of rel_err(ours on the GPU, the reference engine on the CPU)."""
    gpu, cpu = cc.cudnnCreate("gpu"), cc.cudnnCreate("cpu")
    ours, ref = Attn(gpu, cupy, batch, tokens, embed, heads), Attn(cpu, np, batch, tokens, embed, heads)
    engine = None
    for a in (ours, ref):
        a.forward(training=True)
        a.backward()
        engine = engine or cc._core.call.last_plan().engine  # ours'
    errs = [rel_err(g, w) for g, w in zip(ours.results(), ref.results())]
    return max(errs), errs, engine


SHAPES = [(32, 512, 512, 8), (32, 128, 512, 8), (8, 2048, 512, 8), (32, 512, 1024, 8)]  # head dims 64, 64, 64, 128


def torch_sdpa_ms(shape, iters, reps) -> dict:
    """torch's own fused attention kernel (F.scaled_dot_product_attention) at the shape's core."""
    b, t, e, nh = shape
    q, k, v = (torch.randn(b, nh, t, e // nh, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    g = torch.randn(b, nh, t, e // nh, device="cuda", dtype=torch.float16)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def fwd():
        with torch.no_grad():
            sdpa(q, k, v)

    def fwd_bwd():
        torch.autograd.grad(sdpa(q, k, v), (q, k, v), g)

    f = cuda_time(fwd, iters, reps, warm=2, events="torch", before=torch.cuda.synchronize)
    fb = cuda_time(fwd_bwd, iters, reps, warm=2, events="torch", before=torch.cuda.synchronize)
    return {"forward_ms": f["ms"], "forward_backward_ms": fb["ms"]}


def bench_shape(shape, iters, reps) -> dict:
    h = cc.cudnnCreate("gpu")
    a = Attn(h, cupy, *shape)
    m, x, dy = torch_mha(a)
    a.forward()
    engine = cc._core.call.last_plan().engine
    config = str(cc._core.call.last_plan().config)
    with torch.no_grad():
        ref_y = m(x, x, x, need_weights=False)[0]
    torch.cuda.synchronize()
    err_torch = rel_err(a.out.get().reshape(ref_y.shape), ref_y.float().cpu().numpy())

    def t_fwd():
        with torch.no_grad():
            m(x, x, x, need_weights=False)

    def t_fwd_train():
        m(x, x, x, need_weights=False)

    y = m(x, x, x, need_weights=False)[0]
    params = [x] + list(m.parameters())

    def t_bwd():
        torch.autograd.grad(y, params, dy, retain_graph=True)

    a.forward(training=True)
    a.backward()
    engines = {}
    for name, fn in (("forward", lambda: a.forward()), ("forward_training", lambda: a.forward(training=True)),
                     ("backward_data", a.backward_data), ("backward_weights", a.backward_weights)):
        fn()
        engines[name] = (cc._core.call.last_plan().engine, str(cc._core.call.last_plan().config))
    rows = {}
    ours = {"forward": lambda: a.forward(), "forward_training": lambda: a.forward(training=True),
            "backward_data": a.backward_data, "backward_weights": a.backward_weights, "backward": a.backward}
    theirs = {"forward": t_fwd, "forward_training": t_fwd_train, "backward": t_bwd}
    a.forward(training=True)
    for name in ours:
        o = cuda_time(ours[name], iters, reps, warm=2)
        row = {"ours_ms": o["ms"], "ours_min_ms": o["min_ms"], "engine": engines.get(name, engines["backward_data"])}
        if name in theirs:
            t = cuda_time(theirs[name], iters, reps, warm=2, events="torch", before=torch.cuda.synchronize)
            row.update(torch_ms=t["ms"], torch_min_ms=t["min_ms"], ratio=o["ms"] / t["ms"])
        rows[name] = row
    train_ours = rows["forward_training"]["ours_ms"] + rows["backward"]["ours_ms"]
    train_torch = rows["forward_training"]["torch_ms"] + rows["backward"]["torch_ms"]
    cc.cudnnDestroy(h)
    return {"shape": {"batch": shape[0], "tokens": shape[1], "embed": shape[2], "heads": shape[3],
                      "head_dim": shape[2] // shape[3]},
            "rows": rows, "training_step": {"ours_ms": train_ours, "torch_ms": train_torch,
                                            "ratio": train_ours / train_torch},
            "torch_sdpa_kernel": torch_sdpa_ms(shape, iters, reps), "engine": engine, "config": config,
            "err_torch": err_torch}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_attention.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: a small shape, few iterations")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--commit", default=None, help="git commit to record (default: git rev-parse HEAD)")
    ap.add_argument("--out", default=None, help="folder for the JSON (default benchmarks/results)")
    args = ap.parse_args(argv)
    if torch is None:
        return missing_gpu_stack(__file__, _MISSING)
    shapes = [(4, 128, 256, 8)] if args.quick else SHAPES
    iters, reps = (3, 3) if args.quick else (args.iters, args.reps)
    results = [bench_shape(s, iters, reps) for s in shapes]
    err_ref, errs, ref_engine = err_reference()
    print(f"device: {device_name()}   fp16, TENSOR_OP_MATH, every projection and bias; ms (ours / torch)")
    for r in results:
        sh = r["shape"]
        print(f"B{sh['batch']} T{sh['tokens']} E{sh['embed']} H{sh['heads']} (head {sh['head_dim']}), "
              f"engine {r['engine']} [{r['config']}], err vs torch {r['err_torch']:.2e}")
        for name, row in r["rows"].items():
            t = f"{fmt_ms(row['torch_ms'])} {row['ratio']:7.2f}" if "torch_ms" in row else ""
            print(f"  {name:18s} {fmt_ms(row['ours_ms'])} {t}")
        ts, k = r["training_step"], r["torch_sdpa_kernel"]
        print(f"  {'fwd_train+bwd':18s} {fmt_ms(ts['ours_ms'])} {fmt_ms(ts['torch_ms'])} {ts['ratio']:7.2f}"
              f"   (torch SDPA kernel alone: fwd {k['forward_ms']:.3f}, fwd+bwd {k['forward_backward_ms']:.3f})")
    print(f"err vs reference (fwd, dq, dk, dv, dw at a small shape, engine {ref_engine}): {err_ref:.2e}")
    payload = meta(benchmark="attention", dtype="float16", math="TENSOR_OP_MATH", quick=args.quick, iters=iters,
                   reps=reps, shapes=results, err_reference=err_ref, err_reference_each=errs,
                   git_commit=args.commit or git_commit(),
                   utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    path = write_json("bench_attention" + ("_quick" if args.quick else ""), payload, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
