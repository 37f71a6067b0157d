"""Data-parallel training of a small CNN written in cuDNN's legacy calls, one process per GPU
(issue 17; docs/multi_gpu.md).  The network and its backward pass are legacy calls only:

    x (n,3,S,S) -> conv 3x3 pad 1 (8 filters) -> batch norm (training) -> ReLU -> max pool 2x2
      -> fully connected as a convolution over the whole (S/2)x(S/2) map (+ bias, cudnnAddTensor)
      -> log-softmax (CUDNN_SOFTMAX_LOG, channel mode) -> mean NLL over the global batch

Each process binds its GPU (``cupy.cuda.Device(LOCAL_RANK).use()`` before ``cudnnCreate``: the
handle is tied to the device current when it is created), computes the gradients of its shard of
the global batch into one flat buffer, and all-reduces that buffer through ``torch.distributed``
(NCCL on the GPU, gloo on the CPU place) on the CuPy/NumPy array itself, shared with torch through
DLPack (no copy).  The NLL is divided by the global batch size, so the summed gradients are those
of the global batch, and every process takes the same SGD step (cudnnAddTensor, alpha = -lr).

    torchrun --nproc-per-node 2 examples/multi_gpu_data_parallel.py --check   # 2 GPUs, checked
    python examples/multi_gpu_data_parallel.py --single --shards 2            # one GPU, same batch
    python examples/multi_gpu_data_parallel.py --place cpu --batch 4 --size 8 --steps 2   # CPU

``--check`` (under torchrun): rank 0 then runs ``--single`` on its own GPU with the same data and
seed and compares every parameter and loss (rtol 1e-4); exit status 1 when they differ.  Batch
normalization in data-parallel training normalizes each process's shard with that shard's
statistics (as torch's DDP does without SyncBatchNorm), so the single-GPU reference runs the global
batch as ``--shards`` = world-size shards of the same size, accumulating the gradients in place
(beta = 1 in the backward calls); every other quantity is the global batch's.  With
``--save out.npz`` the final parameters and the losses are written (rank 0), for comparing runs.

Without torch, or outside torchrun, it runs as one process (world size 1: the all-reduce is the
identity).  Under torchrun with one process it runs the same code through the process group.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:
    import cudnn_compat as cc
except ModuleNotFoundError:  # run from a checkout that is not installed: the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import cudnn_compat as cc
from cudnn_compat._core.place import default_place  # noqa: E402

K1, CLASSES, C_IN = 8, 10, 3
BN_EPS, BN_MOMENTUM = 1e-5, 0.1
FWD = cc.CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
BWD_DATA = cc.CUDNN_CONVOLUTION_BWD_DATA_ALGO_1  # the deterministic algorithms (no atomics in cuDNN)
BWD_FILTER = cc.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1
ALIGN = 64  # elements: every gradient view of the flat buffer starts 256-byte aligned


def tensor_desc(n, c, h, w):
    d = cc.cudnnCreateTensorDescriptor()
    cc.cudnnSetTensor4dDescriptor(d, cc.CUDNN_TENSOR_NCHW, cc.CUDNN_DATA_FLOAT, n, c, h, w)
    return d


def filter_desc(k, c, r, s):
    d = cc.cudnnCreateFilterDescriptor()
    cc.cudnnSetFilter4dDescriptor(d, cc.CUDNN_DATA_FLOAT, cc.CUDNN_TENSOR_NCHW, k, c, r, s)
    return d


def conv_desc(pad):
    d = cc.cudnnCreateConvolutionDescriptor()
    cc.cudnnSetConvolution2dDescriptor(d, pad, pad, 1, 1, 1, 1, cc.CUDNN_CROSS_CORRELATION, cc.CUDNN_DATA_FLOAT)
    cc.cudnnSetConvolutionMathType(d, cc.CUDNN_FMA_MATH)  # full FP32 (no TF32): the runs compare tightly
    return d


def init_params(seed: int, size: int) -> dict:
    """The initial parameters (host float32), the same in every process (seeded)."""
    rng = np.random.default_rng(seed)
    q = size // 2
    return {"conv1.w": (rng.standard_normal((K1, C_IN, 3, 3)) * (2.0 / (C_IN * 9)) ** 0.5).astype(np.float32),
            "bn.scale": np.ones((1, K1, 1, 1), np.float32),
            "bn.bias": np.zeros((1, K1, 1, 1), np.float32),
            "fc.w": (rng.standard_normal((CLASSES, K1, q, q)) * (1.0 / (K1 * q * q)) ** 0.5).astype(np.float32),
            "fc.b": np.zeros((1, CLASSES, 1, 1), np.float32)}


def global_batch(seed: int, batch: int, size: int):
    """The global batch (host): every process draws the same and takes its shard.  The same batch
    every step (random labels: the loss falls as the network fits them)."""
    rng = np.random.default_rng([seed, 1000])
    x = rng.standard_normal((batch, C_IN, size, size)).astype(np.float32)
    labels = rng.integers(0, CLASSES, batch)
    return x, labels


class CNN:
    """The network on ``handle`` for shards of ``n`` samples of a global batch of ``n_global``."""

    def __init__(self, handle, xp, n: int, n_global: int, size: int, params: dict):
        self.h, self.xp, self.n, self.n_global, self.size = handle, xp, n, n_global, size
        q = size // 2
        self.q = q
        # parameters (device copies) and their gradients: views of one flat buffer (one all-reduce)
        self.p = {k: xp.asarray(v) for k, v in params.items()}
        offs, total = {}, 0
        for k, v in params.items():
            offs[k] = total
            total += -(-v.size // ALIGN) * ALIGN
        self.gflat = xp.zeros(total, np.float32)
        self.g = {k: self.gflat[offs[k]:offs[k] + v.size].reshape(v.shape) for k, v in params.items()}
        self.loss = xp.zeros(1, np.float32)  # this process's share of the loss (all-reduced with the gradients)
        self.descs = []
        own = self.descs.append
        # descriptors
        self.xd, self.c1d, self.pd, self.logd = (tensor_desc(n, C_IN, size, size), tensor_desc(n, K1, size, size),
                                                 tensor_desc(n, K1, q, q), tensor_desc(n, CLASSES, 1, 1))
        self.w1d, self.wfd = filter_desc(K1, C_IN, 3, 3), filter_desc(CLASSES, K1, q, q)
        self.cv1, self.cvf = conv_desc(1), conv_desc(0)
        self.bnd = cc.cudnnCreateTensorDescriptor()
        cc.cudnnDeriveBNTensorDescriptor(self.bnd, self.c1d, cc.CUDNN_BATCHNORM_SPATIAL)
        self.bd = tensor_desc(1, CLASSES, 1, 1)
        # each parameter as a tensor (filters: the same bytes as a K,C,R,S tensor), for the SGD step
        self.pdesc = {"conv1.w": tensor_desc(K1, C_IN, 3, 3), "bn.scale": self.bnd, "bn.bias": self.bnd,
                      "fc.w": tensor_desc(CLASSES, K1, q, q), "fc.b": self.bd}
        self.relu = cc.cudnnCreateActivationDescriptor()
        cc.cudnnSetActivationDescriptor(self.relu, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)
        self.pool = cc.cudnnCreatePoolingDescriptor()
        cc.cudnnSetPooling2dDescriptor(self.pool, cc.CUDNN_POOLING_MAX, cc.CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
        for d in (self.xd, self.c1d, self.pd, self.logd, self.bnd, self.bd, self.pdesc["conv1.w"], self.pdesc["fc.w"]):
            own((d, cc.cudnnDestroyTensorDescriptor))
        own((self.w1d, cc.cudnnDestroyFilterDescriptor))
        own((self.wfd, cc.cudnnDestroyFilterDescriptor))
        own((self.cv1, cc.cudnnDestroyConvolutionDescriptor))
        own((self.cvf, cc.cudnnDestroyConvolutionDescriptor))
        own((self.relu, cc.cudnnDestroyActivationDescriptor))
        own((self.pool, cc.cudnnDestroyPoolingDescriptor))
        assert tuple(cc.cudnnGetConvolution2dForwardOutputDim(self.cv1, self.xd, self.w1d)) == (n, K1, size, size)
        assert tuple(cc.cudnnGetConvolution2dForwardOutputDim(self.cvf, self.pd, self.wfd)) == (n, CLASSES, 1, 1)
        # activations and their gradients
        z = lambda *s: xp.zeros(s, np.float32)  # noqa: E731
        self.x, self.c1, self.bn, self.r = z(n, C_IN, size, size), z(n, K1, size, size), z(n, K1, size, size), z(n, K1, size, size)
        self.pl, self.fc, self.logp = z(n, K1, q, q), z(n, CLASSES, 1, 1), z(n, CLASSES, 1, 1)
        self.dlogp, self.dfc, self.dpl = z(n, CLASSES, 1, 1), z(n, CLASSES, 1, 1), z(n, K1, q, q)
        self.dr, self.dbn, self.dc1 = z(n, K1, size, size), z(n, K1, size, size), z(n, K1, size, size)
        self.run_mean, self.run_var = z(1, K1, 1, 1), xp.ones((1, K1, 1, 1), np.float32)
        self.save_mean, self.save_inv = z(1, K1, 1, 1), z(1, K1, 1, 1)
        # one workspace for every convolution call
        h = handle
        sizes = [cc.cudnnGetConvolutionForwardWorkspaceSize(h, self.xd, self.w1d, self.cv1, self.c1d, FWD),
                 cc.cudnnGetConvolutionForwardWorkspaceSize(h, self.pd, self.wfd, self.cvf, self.logd, FWD),
                 cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(h, self.xd, self.c1d, self.cv1, self.w1d, BWD_FILTER),
                 cc.cudnnGetConvolutionBackwardFilterWorkspaceSize(h, self.pd, self.logd, self.cvf, self.wfd, BWD_FILTER),
                 cc.cudnnGetConvolutionBackwardDataWorkspaceSize(h, self.wfd, self.logd, self.cvf, self.pd, BWD_DATA)]
        self.wss = max(int(s) for s in sizes)
        self.ws = xp.empty(max(self.wss, 1), np.uint8)

    def forward_backward(self, x_host, labels, accumulate: bool) -> None:
        """Forward and backward of one shard; gradients written (``accumulate``: added, beta = 1)
        into the flat buffer, the shard's loss (sum of NLL / global batch) into ``self.loss``."""
        h, xp, n, p, g = self.h, self.xp, self.n, self.p, self.g
        ws, wss = self.ws, self.wss
        beta_g = 1.0 if accumulate else 0.0
        self.x[...] = xp.asarray(x_host)
        # forward
        cc.cudnnConvolutionForward(h, 1.0, self.xd, self.x, self.w1d, p["conv1.w"], self.cv1, FWD, ws, wss, 0.0,
                                   self.c1d, self.c1)
        cc.cudnnBatchNormalizationForwardTraining(
            h, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, self.c1d, self.c1, self.c1d, self.bn, self.bnd, p["bn.scale"],
            p["bn.bias"], BN_MOMENTUM, self.run_mean, self.run_var, BN_EPS, self.save_mean, self.save_inv)
        cc.cudnnActivationForward(h, self.relu, 1.0, self.c1d, self.bn, 0.0, self.c1d, self.r)
        cc.cudnnPoolingForward(h, self.pool, 1.0, self.c1d, self.r, 0.0, self.pd, self.pl)
        cc.cudnnConvolutionForward(h, 1.0, self.pd, self.pl, self.wfd, p["fc.w"], self.cvf, FWD, ws, wss, 0.0,
                                   self.logd, self.fc)
        cc.cudnnAddTensor(h, 1.0, self.bd, p["fc.b"], 1.0, self.logd, self.fc)
        cc.cudnnSoftmaxForward(h, cc.CUDNN_SOFTMAX_LOG, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, self.logd, self.fc, 0.0,
                               self.logd, self.logp)
        # loss: sum over the shard of -log p[label], over the global batch size; its gradient -onehot/N
        rows, lab = xp.arange(n), xp.asarray(labels)
        shard_loss = -self.logp.reshape(n, CLASSES)[rows, lab].sum() / self.n_global
        self.loss[...] = (self.loss if accumulate else 0) + shard_loss
        self.dlogp[...] = 0
        self.dlogp.reshape(n, CLASSES)[rows, lab] = -1.0 / self.n_global
        # backward
        cc.cudnnSoftmaxBackward(h, cc.CUDNN_SOFTMAX_LOG, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, self.logd, self.logp,
                                self.logd, self.dlogp, 0.0, self.logd, self.dfc)
        cc.cudnnConvolutionBackwardBias(h, 1.0, self.logd, self.dfc, beta_g, self.bd, g["fc.b"])
        cc.cudnnConvolutionBackwardFilter(h, 1.0, self.pd, self.pl, self.logd, self.dfc, self.cvf, BWD_FILTER, ws, wss,
                                          beta_g, self.wfd, g["fc.w"])
        cc.cudnnConvolutionBackwardData(h, 1.0, self.wfd, p["fc.w"], self.logd, self.dfc, self.cvf, BWD_DATA, ws, wss,
                                        0.0, self.pd, self.dpl)
        cc.cudnnPoolingBackward(h, self.pool, 1.0, self.pd, self.pl, self.pd, self.dpl, self.c1d, self.r, 0.0,
                                self.c1d, self.dr)
        cc.cudnnActivationBackward(h, self.relu, 1.0, self.c1d, self.r, self.c1d, self.dr, self.c1d, self.bn, 0.0,
                                   self.c1d, self.dbn)
        cc.cudnnBatchNormalizationBackward(
            h, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, 1.0, beta_g, self.c1d, self.c1, self.c1d, self.dbn, self.c1d,
            self.dc1, self.bnd, p["bn.scale"], g["bn.scale"], g["bn.bias"], BN_EPS, self.save_mean, self.save_inv)
        cc.cudnnConvolutionBackwardFilter(h, 1.0, self.xd, self.x, self.c1d, self.dc1, self.cv1, BWD_FILTER, ws, wss,
                                          beta_g, self.w1d, g["conv1.w"])

    def sgd(self, lr: float) -> None:
        """p -= lr * g for every parameter (cudnnAddTensor, alpha = -lr, beta = 1)."""
        for k, v in self.p.items():
            d = self.pdesc[k]
            cc.cudnnAddTensor(self.h, -float(lr), d, self.g[k], 1.0, d, v)

    def host_params(self) -> dict:
        return {k: (v.get() if hasattr(v, "get") else np.array(v)) for k, v in self.p.items()}

    def destroy(self) -> None:
        for d, destroy in reversed(self.descs):
            destroy(d)


class Comm:
    """torch.distributed over the processes torchrun started (None outside torchrun)."""

    def __init__(self, place: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.dist = None
        self.torch = None
        if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
            import torch
            import torch.distributed as dist
            self.torch, self.dist = torch, dist
            backend = "nccl" if place == "gpu" else "gloo"
            if place == "gpu":
                torch.cuda.set_device(self.local_rank)
                dist.init_process_group(backend=backend, device_id=torch.device("cuda", self.local_rank))
            else:
                dist.init_process_group(backend=backend)
            self.backend = backend

    def all_reduce(self, arrays, place: str) -> None:
        """Sum ``arrays`` (CuPy or NumPy) over the processes, in place, through DLPack views."""
        if self.dist is None:
            return
        if place == "gpu":
            import cupy
            cupy.cuda.get_current_stream().synchronize()  # the legacy calls' results are complete
        for a in arrays:
            self.dist.all_reduce(self.torch.from_dlpack(a), op=self.dist.ReduceOp.SUM)
        if place == "gpu":
            self.torch.cuda.current_stream().synchronize()  # the sums are in place before CuPy reads them

    def barrier(self) -> None:
        if self.dist is not None:
            self.dist.barrier()

    def close(self) -> None:
        if self.dist is not None:
            self.dist.destroy_process_group()


def train(handle, xp, args, shards: int, rank: int, world: int, comm=None, place="cpu", log=print):
    """``args.steps`` SGD steps on the global batch; this process computes shards ``rank``,
    ``rank + world``, ... of ``shards`` (the all-reduce sums over the processes).  Returns
    (losses, host parameters)."""
    if args.batch % shards:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the number of shards ({shards})")
    n = args.batch // shards
    net = CNN(handle, xp, n, args.batch, args.size, init_params(args.seed, args.size))
    losses = []
    try:
        x, labels = global_batch(args.seed, args.batch, args.size)
        for step in range(args.steps):
            mine = list(range(rank, shards, world))
            for i, s in enumerate(mine):
                net.forward_backward(x[s * n:(s + 1) * n], labels[s * n:(s + 1) * n], accumulate=i > 0)
            if comm is not None:
                comm.all_reduce([net.gflat, net.loss], place)
            loss = float(net.loss[0])
            losses.append(loss)
            log(f"step {step + 1}: loss {loss:.6f}")
            net.sgd(args.lr)
        return losses, net.host_params()
    finally:
        net.destroy()


def compare(a: tuple, b: tuple, rtol: float = 1e-4, atol: float = 1e-5) -> float:
    """The largest |difference| / (atol + rtol * |reference|) over the losses and parameters."""
    worst = 0.0
    pairs = [(np.asarray(a[0]), np.asarray(b[0]))] + [(a[1][k], b[1][k]) for k in b[1]]
    for got, want in pairs:
        worst = max(worst, float(np.max(np.abs(got - want) / (atol + rtol * np.abs(want)))))
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--place", choices=("gpu", "cpu"), default=None, help="default: the GPU when there is one")
    ap.add_argument("--batch", type=int, default=32, help="the global batch (over every process)")
    ap.add_argument("--size", type=int, default=16, help="image side (even)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--single", action="store_true", help="run the global batch in this one process")
    ap.add_argument("--shards", type=int, default=None,
                    help="--single: shards of the global batch (batch-norm statistics per shard; default 1)")
    ap.add_argument("--check", action="store_true", help="under torchrun: rank 0 compares with --single")
    ap.add_argument("--save", default=None, help="write the losses and final parameters (rank 0) to this .npz")
    args = ap.parse_args(argv)
    place = args.place or default_place()
    if args.size % 2:
        raise SystemExit("--size must be even")

    comm = None if args.single else Comm(place)
    world, rank = (1, 0) if comm is None else (comm.world, comm.rank)
    if place == "gpu":
        import cupy as xp
        xp.cuda.Device(0 if comm is None else comm.local_rank).use()  # before cudnnCreate: the handle's device
    else:
        xp = np
    handle = cc.cudnnCreate(place)
    say = print if rank == 0 else (lambda *a, **k: None)
    try:
        shards = (args.shards or 1) if args.single else world
        mode = f"single process, {shards} shard(s)" if args.single else \
            f"{world} process(es)" + (f", {comm.backend}" if comm.dist is not None else "")
        say(f"place: {place}; {mode}; global batch {args.batch} of {C_IN}x{args.size}x{args.size}")
        result = train(handle, xp, args, shards, rank, 1 if comm is None else world, comm, place, say)
        status = 0
        if args.check and not args.single:
            if rank == 0:
                ref = train(handle, xp, args, world, 0, 1, None, place, lambda *a: None)
                worst = compare(result, ref)
                ok = worst <= 1.0
                say(f"check: {world} process(es) and one process ({world} shards) "
                    f"{'agree' if ok else 'DIFFER'} (worst |diff| / (1e-5 + 1e-4 |ref|) = {worst:.3g})")
                status = 0 if ok else 1
            if comm is not None:
                comm.barrier()
        if args.save and rank == 0:
            np.savez(args.save, losses=np.asarray(result[0]), **result[1])
        return status
    finally:
        if place == "gpu":
            xp.cuda.get_current_stream().synchronize()
        cc.cudnnDestroy(handle)
        if comm is not None:
            comm.close()


if __name__ == "__main__":
    sys.exit(main())
