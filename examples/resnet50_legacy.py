"""ResNet-50 v1.5 training step written only in cuDNN's legacy v7 API, as a v7-era C program would
(issue 14, item 1): descriptors, Find-chosen convolution algorithms, workspaces from the
Get*WorkspaceSize queries, batch norm in training mode, and a plain SGD update.

    stem   conv 7x7/2 (pad 3) -> BN -> ReLU -> max pool 3x3/2 (pad 1)
    stages (3, 4, 6, 3) bottlenecks of 64/128/256/512 (x width) mid channels, 4x expansion; the
           3x3 conv carries the stride (v1.5); the first block of a stage has a 1x1 projection + BN
    head   global average pool -> FC as a 1x1 convolution + bias (AddTensor) -> LOG softmax

Legacy calls (002): cudnnConvolutionForward / BackwardData / BackwardFilter (algorithms from
cudnnFindConvolution*AlgorithmEx, §5.2.16, §5.2.14, §6.2.10; workspaces from
cudnnGetConvolution*WorkspaceSize, §5.2.24, §5.2.21, §6.2.14), cudnnConvolutionBackwardBias
(§6.2.1), cudnnBatchNormalizationForwardTraining / Backward (spatial, §4.1.4, §4.1.2),
cudnnActivationForward / Backward (ReLU, §3.2.1, §4.1.1), cudnnAddTensor (residual, residual
gradient, bias and SGD, §3.2.2), cudnnPoolingForward / Backward (§3.2.69, §4.1.18),
cudnnSoftmaxForward / Backward (CUDNN_SOFTMAX_LOG over channels, §3.2.79, §4.1.20).  The loss is
the mean negative log-likelihood of the labels; its value and its gradient with respect to the
log-probabilities (-onehot/N, an input to SoftmaxBackward) are computed with NumPy on the CPU place
and with one small CUDA kernel (a CuPy RawKernel, ``NLL_SOURCE``) on the GPU place: the legacy API
has no gather/scatter.

    python examples/resnet50_legacy.py --place cpu --batch 2 --size 32 --width 0.0625 --steps 2
    python examples/resnet50_legacy.py --place gpu --batch 32 --size 224 --dtype float16 --layout NHWC

``build(handle, N, H, W, dtype, layout, classes, width)`` returns a ``ResNet50`` whose ``step(x,
labels)`` runs forward, backward and (``lr`` > 0) the SGD update and returns the loss; ``params()``
and ``grads()`` give host copies by torch's parameter names (filters as K, C, R, S whatever the
layout), ``set_params()`` loads them.  ``build_basic_block`` is the 7-call ResNet basic block
(conv, BN train, ReLU, conv, BN train, add, ReLU) used by benchmarks/bench_programs.py.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np

try:
    import cudnn_compat as cc
except ModuleNotFoundError:  # run from a checkout that is not installed: the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import cudnn_compat as cc

STAGES = ((3, 64, 256), (4, 128, 512), (6, 256, 1024), (3, 512, 2048))  # (blocks, mid, out) at width 1
BN_EPS = 1e-5
BN_MOMENTUM = 0.1  # exponentialAverageFactor
DTYPES = {"float32": (np.float32, cc.CUDNN_DATA_FLOAT), "float16": (np.float16, cc.CUDNN_DATA_HALF),
          "float64": (np.float64, cc.CUDNN_DATA_DOUBLE)}
LAYOUTS = {"NCHW": cc.CUDNN_TENSOR_NCHW, "NHWC": cc.CUDNN_TENSOR_NHWC}
FIND_WORKSPACE_LIMIT = 256 << 20  # bytes offered to Find*Ex (a C program's workspace budget)


# The loss on the GPU place: mean NLL and its gradient -onehot/N in one launch of one block (labels
# outside [0, K) give a NaN loss and no gradient entry); T the log-probabilities' storage type.
NLL_BLOCK = 256
NLL_SOURCE = r"""
// storage loads and stores; float16 as its bits (unsigned short), converted by PTX (no header needed)
static __device__ __forceinline__ double ld(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
static __device__ __forceinline__ double ld(float x) { return x; }
static __device__ __forceinline__ double ld(double x) { return x; }
static __device__ __forceinline__ void st(unsigned short* p, double v) { unsigned short h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(v)); *p = h; }
static __device__ __forceinline__ void st(float* p, double v) { *p = (float)v; }
static __device__ __forceinline__ void st(double* p, double v) { *p = v; }

extern "C" __global__ void nll_loss(const T* logp, const long long* labels, int n, int k, T* grad, double* loss) {
    __shared__ double part[NLL_BLOCK];
    const long long total = (long long)n * k;
    for (long long i = threadIdx.x; i < total; i += blockDim.x) st(grad + i, 0.0);
    __syncthreads();
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const long long c = labels[i];
        if (c < 0 || c >= k) { s = __longlong_as_double(0x7ff8000000000000LL); continue; }
        st(grad + (long long)i * k + c, -1.0 / n);
        s -= ld(logp[(long long)i * k + c]);
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *loss = part[0] / n;
}
"""
_NLL_KERNELS: dict = {}


def nll_kernel(xp, dtype):
    """The compiled NLL kernel for log-probabilities of ``dtype`` (CuPy RawKernel, made once)."""
    if np.dtype(dtype).name not in _NLL_KERNELS:
        _NLL_KERNELS[np.dtype(dtype).name] = xp.RawKernel(nll_source(dtype), "nll_loss")
    return _NLL_KERNELS[np.dtype(dtype).name]


def nll_source(dtype) -> str:
    """NLL_SOURCE for log-probabilities of ``dtype`` (float16, float32 or float64)."""
    t = {"float16": "unsigned short", "float32": "float", "float64": "double"}[np.dtype(dtype).name]
    return NLL_SOURCE.replace("NLL_BLOCK", str(NLL_BLOCK)).replace("T*", f"{t}*")


class Buf:
    """One activation tensor: its descriptor, its data and (allocated on demand) its gradient."""

    def __init__(self, net, n, c, h, w, data=None):
        self.net, self.dims = net, (n, c, h, w)
        self.desc = net.tensor_desc(n, c, h, w)
        self.data = net.empty(self.dims) if data is None else data
        self._grad = None

    @property
    def grad(self):
        if self._grad is None:
            self._grad = self.net.empty(self.dims)
        return self._grad


class Net:
    """A handle, a data type and a layout; owns every descriptor and buffer it creates."""

    def __init__(self, handle, dtype="float32", layout="NCHW", seed=0, algo_search="find"):
        self.handle = handle
        self.place = handle.place
        if self.place == "gpu":
            import cupy
            self.xp = cupy
        else:
            self.xp = np
        self.np_dtype, self.dt = DTYPES[dtype]
        self.dtype_name, self.layout, self.fmt = dtype, layout, LAYOUTS[layout]
        # FP32: FMA math (no TF32), as the comparisons with torch need; FP16: Tensor Core math
        self.math = cc.CUDNN_TENSOR_OP_MATH if dtype == "float16" else cc.CUDNN_FMA_MATH
        self.compute = cc.CUDNN_DATA_DOUBLE if dtype == "float64" else cc.CUDNN_DATA_FLOAT
        self.rng = np.random.default_rng(seed)
        self.algo_search = algo_search
        self._owned = []  # (destroy function, descriptor)
        self._find_cache = {}  # (direction, geometry) -> (algo, workspace bytes): Find once per signature
        self.workspace, self.workspace_size = None, 0
        self.relu = self.own(cc.cudnnCreateActivationDescriptor(), cc.cudnnDestroyActivationDescriptor)
        cc.cudnnSetActivationDescriptor(self.relu, cc.CUDNN_ACTIVATION_RELU, cc.CUDNN_NOT_PROPAGATE_NAN, 0.0)

    # -- resources ------------------------------------------------------------------------------
    def own(self, desc, destroy):
        self._owned.append((destroy, desc))
        return desc

    def tensor_desc(self, n, c, h, w, dt=None, fmt=None):
        d = self.own(cc.cudnnCreateTensorDescriptor(), cc.cudnnDestroyTensorDescriptor)
        cc.cudnnSetTensor4dDescriptor(d, self.fmt if fmt is None else fmt, self.dt if dt is None else dt, n, c, h, w)
        return d

    def stored_shape(self, dims):
        n, c, h, w = dims
        return (n, h, w, c) if self.layout == "NHWC" else (n, c, h, w)

    def empty(self, dims, dtype=None):
        return self.xp.zeros(self.stored_shape(dims), dtype or self.np_dtype)

    def put(self, logical, dtype=None):
        """A host array of logical N,C,H,W dims (or 1-d per-channel) on the place, in the layout."""
        a = np.asarray(logical, dtype or self.np_dtype)
        if a.ndim == 4 and self.layout == "NHWC":
            a = a.transpose(0, 2, 3, 1)
        return self.xp.asarray(np.ascontiguousarray(a))

    def get(self, a, logical_4d=True) -> np.ndarray:
        """A host copy in logical N,C,H,W order."""
        h = a.get() if self.place == "gpu" else np.array(a, copy=True)
        if h.ndim == 4 and logical_4d and self.layout == "NHWC":
            h = h.transpose(0, 3, 1, 2)
        return np.ascontiguousarray(h)

    def find_workspace(self):
        """The workspace offered to Find*Ex while building (freed by release_find_workspace)."""
        if getattr(self, "_probe", None) is None:
            self._probe = self.xp.empty(FIND_WORKSPACE_LIMIT if self.place == "gpu" else 1 << 20, np.uint8)
        return self._probe

    def release_find_workspace(self):
        self._probe = None

    def ensure_workspace(self, size):
        if size > self.workspace_size:
            self.workspace, self.workspace_size = self.xp.empty(size, np.uint8), size

    def sync(self):
        if self.place == "gpu":
            self.xp.cuda.get_current_stream().synchronize()

    def destroy(self):
        """cudnnDestroy*Descriptor for everything created (the handle is the caller's)."""
        self.sync()
        for destroy, d in reversed(self._owned):
            destroy(d)
        self._owned = []


# -- layers --------------------------------------------------------------------------------------

class Conv:
    """A convolution without bias (BN follows); ``bias=True`` adds one through cudnnAddTensor."""

    def __init__(self, net: Net, name: str, x: Buf, k: int, r: int, stride: int = 1, pad: int = 0, bias=False):
        self.net, self.name, self.x = net, name, x
        n, c, h, w = x.dims
        self.wdims = (k, c, r, r)
        self.wDesc = net.own(cc.cudnnCreateFilterDescriptor(), cc.cudnnDestroyFilterDescriptor)
        cc.cudnnSetFilter4dDescriptor(self.wDesc, net.dt, net.fmt, k, c, r, r)
        self.wtDesc = net.tensor_desc(k, c, r, r)  # the filter's memory as a tensor, for AddTensor (SGD)
        self.convDesc = net.own(cc.cudnnCreateConvolutionDescriptor(), cc.cudnnDestroyConvolutionDescriptor)
        cc.cudnnSetConvolution2dDescriptor(self.convDesc, pad, pad, stride, stride, 1, 1, cc.CUDNN_CROSS_CORRELATION,
                                           net.compute)
        cc.cudnnSetConvolutionMathType(self.convDesc, net.math)
        on, oc, oh, ow = cc.cudnnGetConvolution2dForwardOutputDim(self.convDesc, x.desc, self.wDesc)
        self.y = Buf(net, on, oc, oh, ow)
        self.geometry = (x.dims, self.wdims, stride, pad)
        std = np.sqrt(2.0 / (c * r * r))  # He (fan in)
        self.w = net.put(net.rng.standard_normal(self.wdims) * std)
        self.dw = net.empty(self.wdims)
        self.bias = bias
        if bias:
            self.bDesc = net.tensor_desc(1, k, 1, 1)
            self.b = net.put(net.rng.uniform(-0.1, 0.1, (1, k, 1, 1)))
            self.db = net.empty((1, k, 1, 1))
        self.need_dx = True
        self.dx = None  # where BackwardData writes (default: x.grad)
        self.algos = None

    def params(self):
        out = {self.name + ".weight": (self.w, self.dw, self.wtDesc, self.wdims)}
        if self.bias:
            out[self.name + ".bias"] = (self.b, self.db, self.bDesc, None)
        return out

    # algorithms: Find*Ex on the real buffers (outputs are overwritten), once per signature
    def choose_algos(self):
        net, h = self.net, self.net.handle
        x, y = self.x, self.y
        probe = net.find_workspace() if net.algo_search == "find" else None
        limit = 0 if probe is None else probe.nbytes
        searches = (
            ("fwd", cc.cudnnFindConvolutionForwardAlgorithmEx, cc.cudnnGetConvolutionForwardAlgorithm_v7,
             cc.cudnnGetConvolutionForwardAlgorithmMaxCount, cc.cudnnGetConvolutionForwardWorkspaceSize,
             lambda ws, n: (h, x.desc, x.data, self.wDesc, self.w, self.convDesc, y.desc, y.data, n, ws, limit),
             (h, x.desc, self.wDesc, self.convDesc, y.desc)),
            ("bwd_data", cc.cudnnFindConvolutionBackwardDataAlgorithmEx,
             cc.cudnnGetConvolutionBackwardDataAlgorithm_v7, cc.cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
             cc.cudnnGetConvolutionBackwardDataWorkspaceSize,
             lambda ws, n: (h, self.wDesc, self.w, y.desc, y.grad, self.convDesc, x.desc, x.grad, n, ws, limit),
             (h, self.wDesc, y.desc, self.convDesc, x.desc)),
            ("bwd_filter", cc.cudnnFindConvolutionBackwardFilterAlgorithmEx,
             cc.cudnnGetConvolutionBackwardFilterAlgorithm_v7, cc.cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
             cc.cudnnGetConvolutionBackwardFilterWorkspaceSize,
             lambda ws, n: (h, x.desc, x.data, y.desc, y.grad, self.convDesc, self.wDesc, self.dw, n, ws, limit),
             (h, x.desc, y.desc, self.convDesc, self.wDesc)),
        )
        self.algos = {}
        for direction, find_ex, get_v7, max_count, ws_size, find_args, descs in searches:
            if direction == "bwd_data" and not self.need_dx:
                continue
            key = (direction,) + self.geometry
            if key not in net._find_cache:
                n = max_count(h)
                perfs = find_ex(*find_args(probe, n)) if net.algo_search == "find" else get_v7(*descs, n)
                ok = [p for p in perfs if p.status == cc.CUDNN_STATUS_SUCCESS]
                same_math = [p for p in ok if p.mathType == net.math]
                if not ok:
                    raise RuntimeError(f"{self.name} {direction}: no algorithm runs ({perfs})")
                algo = (same_math or ok)[0].algo
                net._find_cache[key] = (algo, ws_size(*descs, algo))
            self.algos[direction] = net._find_cache[key]
            net.ensure_workspace(self.algos[direction][1])

    def forward(self, x_data):
        net = self.net
        algo, wss = self.algos["fwd"]
        cc.cudnnConvolutionForward(net.handle, 1.0, self.x.desc, x_data, self.wDesc, self.w, self.convDesc, algo,
                                   net.workspace, wss, 0.0, self.y.desc, self.y.data)
        if self.bias:
            cc.cudnnAddTensor(net.handle, 1.0, self.bDesc, self.b, 1.0, self.y.desc, self.y.data)

    def backward(self, x_data):
        net = self.net
        dy = self.y.grad
        if self.bias:
            cc.cudnnConvolutionBackwardBias(net.handle, 1.0, self.y.desc, dy, 0.0, self.bDesc, self.db)
        algo, wss = self.algos["bwd_filter"]
        cc.cudnnConvolutionBackwardFilter(net.handle, 1.0, self.x.desc, x_data, self.y.desc, dy, self.convDesc, algo,
                                          net.workspace, wss, 0.0, self.wDesc, self.dw)
        if self.need_dx:
            algo, wss = self.algos["bwd_data"]
            cc.cudnnConvolutionBackwardData(net.handle, 1.0, self.wDesc, self.w, self.y.desc, dy, self.convDesc, algo,
                                            net.workspace, wss, 0.0, self.x.desc,
                                            self.x.grad if self.dx is None else self.dx)


class BN:
    """Spatial batch normalization in training mode; y may be given (AddTensor writes into it later)."""

    def __init__(self, net: Net, name: str, x: Buf):
        self.net, self.name, self.x = net, name, x
        c = x.dims[1]
        self.y = Buf(net, *x.dims)
        self.pDesc = net.own(cc.cudnnCreateTensorDescriptor(), cc.cudnnDestroyTensorDescriptor)
        cc.cudnnDeriveBNTensorDescriptor(self.pDesc, x.desc, cc.CUDNN_BATCHNORM_SPATIAL)
        pdt = np.float64 if net.dtype_name == "float64" else np.float32  # FLOAT for HALF data (002 §3.2.18)
        z = lambda: net.xp.zeros((1, c, 1, 1), pdt)  # noqa: E731
        self.scale, self.bias = net.xp.ones((1, c, 1, 1), pdt), z()
        self.dscale, self.dbias = z(), z()
        self.running_mean, self.running_var = z(), net.xp.ones((1, c, 1, 1), pdt)
        self.save_mean, self.save_inv_var = z(), z()

    def params(self):
        return {self.name + ".weight": (self.scale, self.dscale, self.pDesc, None),
                self.name + ".bias": (self.bias, self.dbias, self.pDesc, None)}

    def forward(self):
        net = self.net
        cc.cudnnBatchNormalizationForwardTraining(
            net.handle, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, self.x.desc, self.x.data, self.y.desc, self.y.data,
            self.pDesc, self.scale, self.bias, BN_MOMENTUM, self.running_mean, self.running_var, BN_EPS,
            self.save_mean, self.save_inv_var)

    def backward(self):
        net = self.net
        cc.cudnnBatchNormalizationBackward(
            net.handle, cc.CUDNN_BATCHNORM_SPATIAL, 1.0, 0.0, 1.0, 0.0, self.x.desc, self.x.data, self.y.desc,
            self.y.grad, self.x.desc, self.x.grad, self.pDesc, self.scale, self.dscale, self.dbias, BN_EPS,
            self.save_mean, self.save_inv_var)


class ReLU:
    def __init__(self, net: Net, x: Buf):
        self.net, self.x = net, x
        self.y = Buf(net, *x.dims)

    def forward(self):
        n = self.net
        cc.cudnnActivationForward(n.handle, n.relu, 1.0, self.x.desc, self.x.data, 0.0, self.y.desc, self.y.data)

    def backward(self):
        n = self.net
        cc.cudnnActivationBackward(n.handle, n.relu, 1.0, self.y.desc, self.y.data, self.y.desc, self.y.grad,
                                   self.x.desc, self.x.data, 0.0, self.x.desc, self.x.grad)


class Pool:
    def __init__(self, net: Net, x: Buf, mode, window, pad, stride):
        self.net, self.x = net, x
        self.desc = net.own(cc.cudnnCreatePoolingDescriptor(), cc.cudnnDestroyPoolingDescriptor)
        cc.cudnnSetPooling2dDescriptor(self.desc, mode, cc.CUDNN_NOT_PROPAGATE_NAN, window, window, pad, pad, stride,
                                       stride)
        self.y = Buf(net, *cc.cudnnGetPooling2dForwardOutputDim(self.desc, x.desc))

    def forward(self):
        n = self.net
        cc.cudnnPoolingForward(n.handle, self.desc, 1.0, self.x.desc, self.x.data, 0.0, self.y.desc, self.y.data)

    def backward(self):
        n = self.net
        cc.cudnnPoolingBackward(n.handle, self.desc, 1.0, self.y.desc, self.y.data, self.y.desc, self.y.grad,
                                self.x.desc, self.x.data, 0.0, self.x.desc, self.x.grad)


class Bottleneck:
    """1x1 -> BN -> ReLU -> 3x3/stride -> BN -> ReLU -> 1x1 -> BN, + shortcut (identity or 1x1/stride + BN),
    ReLU.  The residual add writes into bn3's output (AddTensor, beta 1); the gradient of the block
    input is conv1's BackwardData plus the shortcut's gradient (AddTensor)."""

    def __init__(self, net: Net, name: str, x: Buf, mid: int, out: int, stride: int):
        self.net, self.name, self.x = net, name, x
        self.conv1 = Conv(net, name + ".conv1", x, mid, 1)
        self.bn1 = BN(net, name + ".bn1", self.conv1.y)
        self.relu1 = ReLU(net, self.bn1.y)
        self.conv2 = Conv(net, name + ".conv2", self.relu1.y, mid, 3, stride, 1)
        self.bn2 = BN(net, name + ".bn2", self.conv2.y)
        self.relu2 = ReLU(net, self.bn2.y)
        self.conv3 = Conv(net, name + ".conv3", self.relu2.y, out, 1)
        self.bn3 = BN(net, name + ".bn3", self.conv3.y)
        self.project = stride != 1 or x.dims[1] != out
        if self.project:
            self.down_conv = Conv(net, name + ".downsample.0", x, out, 1, stride)
            self.down_bn = BN(net, name + ".downsample.1", self.down_conv.y)
            self.down_bn.y._grad = self.bn3.y.grad  # the same d(sum) reaches the shortcut
            self.down_conv.dx = net.empty(x.dims)  # the shortcut's gradient of x, added to conv1's
        self.relu3 = ReLU(net, self.bn3.y)  # x: bn3.y after the residual add
        self.y = self.relu3.y

    def layers(self):
        out = [self.conv1, self.bn1, self.conv2, self.bn2, self.conv3, self.bn3]
        return out + ([self.down_conv, self.down_bn] if self.project else [])

    def forward(self):
        net = self.net
        x = self.x.data
        self.conv1.forward(x)
        self.bn1.forward()
        self.relu1.forward()
        self.conv2.forward(self.relu1.y.data)
        self.bn2.forward()
        self.relu2.forward()
        self.conv3.forward(self.relu2.y.data)
        self.bn3.forward()
        if self.project:
            self.down_conv.forward(x)
            self.down_bn.forward()
            short = self.down_bn.y
        else:
            short = self.x
        cc.cudnnAddTensor(net.handle, 1.0, short.desc, short.data, 1.0, self.bn3.y.desc, self.bn3.y.data)
        self.relu3.forward()

    def backward(self):
        net = self.net
        self.relu3.backward()  # d(sum) -> bn3.y.grad
        self.bn3.backward()
        self.conv3.backward(self.relu2.y.data)
        self.relu2.backward()
        self.bn2.backward()
        self.conv2.backward(self.relu1.y.data)
        self.relu1.backward()
        self.bn1.backward()
        self.conv1.backward(self.x.data)  # writes x.grad (beta 0)
        if self.project:
            self.down_bn.backward()
            self.down_conv.backward(self.x.data)
        short_grad = self.down_conv.dx if self.project else self.bn3.y.grad
        cc.cudnnAddTensor(net.handle, 1.0, self.x.desc, short_grad, 1.0, self.x.desc, self.x.grad)


class ResNet50:
    """The network on one handle: descriptors, weights, activations and gradients."""

    def __init__(self, handle, N, H, W, dtype="float32", layout="NCHW", classes=1000, width=1.0, depth=4,
                 blocks=None, seed=0, algo_search="find"):
        self.net = net = Net(handle, dtype, layout, seed, algo_search)
        self.handle, self.N, self.classes = handle, N, classes
        self._sgd_params = None  # (p, dp, desc) of every parameter (sgd, made once)
        ch = lambda c: max(1, int(round(c * width)))  # noqa: E731
        self.x = Buf(net, N, 3, H, W, data=net.empty((N, 3, H, W)))
        self.conv1 = Conv(net, "conv1", self.x, ch(64), 7, 2, 3)
        self.conv1.need_dx = False  # no gradient for the input image
        self.bn1 = BN(net, "bn1", self.conv1.y)
        self.relu1 = ReLU(net, self.bn1.y)
        self.maxpool = Pool(net, self.relu1.y, cc.CUDNN_POOLING_MAX, 3, 1, 2)
        cur = self.maxpool.y
        self.blocks = []
        counts = [b for b, _m, _o in STAGES[:depth]]
        if blocks is not None:
            counts = [min(c, blocks) for c in counts] if isinstance(blocks, int) else list(blocks)
        for s, ((_b, mid, out), count) in enumerate(zip(STAGES[:depth], counts)):
            for i in range(count):
                stride = 2 if (s > 0 and i == 0) else 1
                blk = Bottleneck(net, f"layer{s + 1}.{i}", cur, ch(mid), ch(out), stride)
                self.blocks.append(blk)
                cur = blk.y
        n, c, h, w = cur.dims
        self.avgpool = Pool(net, cur, cc.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, h, 0, 1)
        if w != h:
            raise ValueError("square images only")
        self.fc = Conv(net, "fc", self.avgpool.y, classes, 1, bias=True)
        self.fc.w = net.put(net.rng.uniform(-1, 1, self.fc.wdims) / np.sqrt(c))
        self.logp = Buf(net, N, classes, 1, 1)
        self.convs = [self.conv1] + [c for b in self.blocks for c in b.layers() if isinstance(c, Conv)] + [self.fc]
        self.bns = [self.bn1] + [c for b in self.blocks for c in b.layers() if isinstance(c, BN)]
        for conv in self.convs:
            conv.choose_algos()
        net.release_find_workspace()
        self.fused = False
        self.last_loss = None

    # -- parameters ------------------------------------------------------------------------------
    def _param_table(self) -> dict:
        out = {}
        for layer in [self.conv1, self.bn1] + [l for b in self.blocks for l in b.layers()] + [self.fc]:
            out.update(layer.params())
        return out

    def params(self) -> dict:
        """{torch name: host array}: filters K,C,R,S (fc: classes,C,1,1); BN scale/bias and fc.bias 1-d."""
        return {k: self._host(p, shape) for k, (p, _g, _d, shape) in self._param_table().items()}

    def grads(self) -> dict:
        """The gradients of the last step, named and shaped as ``params()``."""
        return {k: self._host(g, shape) for k, (_p, g, _d, shape) in self._param_table().items()}

    def _host(self, a, filter_shape):
        return self.net.get(a) if filter_shape else self.net.get(a, logical_4d=False).reshape(-1)

    def set_params(self, values: dict) -> None:
        """Load host arrays named as ``params()`` (any missing name keeps its value)."""
        for k, (p, _g, _d, shape) in self._param_table().items():
            if k in values:
                v = np.asarray(values[k], np.float64)
                p[...] = self.net.put(v.reshape(shape), p.dtype) if shape else self.net.xp.asarray(
                    v.reshape(p.shape).astype(p.dtype))

    def input(self, x_nchw):
        """A NumPy N,C,H,W batch as an array on the place, in the layout and data type."""
        return self.net.put(x_nchw)

    # -- the step ----------------------------------------------------------------------------------
    def _scope(self):
        return cc.fuse(self.handle) if self.fused else contextlib.nullcontext()

    def forward(self, x):
        """Forward through the log-probabilities (net.logp)."""
        self.x.data = x
        with self._scope():
            self.conv1.forward(x)
            self.bn1.forward()
            self.relu1.forward()
            self.maxpool.forward()
        for blk in self.blocks:
            with self._scope():
                blk.forward()
        n = self.net
        with self._scope():
            self.avgpool.forward()
            self.fc.forward(self.avgpool.y.data)
            cc.cudnnSoftmaxForward(n.handle, cc.CUDNN_SOFTMAX_LOG, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, self.fc.y.desc,
                                   self.fc.y.data, 0.0, self.logp.desc, self.logp.data)

    def nll(self, labels):
        """Mean NLL from the log-probabilities (a device scalar on the GPU) and its gradient -onehot/N
        written to logp.grad."""
        xp, N, K = self.net.xp, self.N, self.classes
        labels = xp.asarray(labels)
        if self.net.place == "gpu":  # one kernel, as a C program would write it (not eight CuPy launches)
            logp, g = self.logp.data, self.logp.grad
            loss = xp.empty((), xp.float64)
            nll_kernel(xp, logp.dtype)((1,), (NLL_BLOCK,), (logp, labels.astype(xp.int64, copy=False), np.int32(N),
                                                            np.int32(K), g, loss))
            return loss
        rows = xp.arange(N)
        logp = self.logp.data.reshape(N, K)  # (N, K, 1, 1): NCHW and NHWC are the same memory
        loss = -logp[rows, labels].astype(xp.float64).mean()
        g = self.logp.grad.reshape(N, K)
        g[...] = 0
        g[rows, labels] = -1.0 / N
        return loss

    def backward(self):
        n = self.net
        with self._scope():
            cc.cudnnSoftmaxBackward(n.handle, cc.CUDNN_SOFTMAX_LOG, cc.CUDNN_SOFTMAX_MODE_CHANNEL, 1.0, self.logp.desc,
                                    self.logp.data, self.logp.desc, self.logp.grad, 0.0, self.fc.y.desc,
                                    self.fc.y.grad)
            self.fc.backward(self.avgpool.y.data)
            self.avgpool.backward()
        for blk in reversed(self.blocks):
            with self._scope():
                blk.backward()
        with self._scope():
            self.maxpool.backward()
            self.relu1.backward()
            self.bn1.backward()
            self.conv1.backward(self.x.data)

    def sgd(self, lr: float) -> None:
        """p -= lr * dp for every parameter: cudnnAddTensor(alpha=-lr, dp, beta=1, p)."""
        h, alpha = self.handle, -float(lr)
        if self._sgd_params is None:  # the buffers are fixed once built (set_params writes into them)
            self._sgd_params = [(p, g, desc) for p, g, desc, _shape in self._param_table().values()]
        for p, g, desc in self._sgd_params:
            cc.cudnnAddTensor(h, alpha, desc, g, 1.0, desc, p)

    def step(self, x, labels, lr: float = 0.0, sync: bool = True):
        """Forward, loss, backward and (lr > 0) SGD; the loss before the update (a float, or a device
        scalar with ``sync=False``)."""
        self.forward(x)
        loss = self.nll(labels)
        self.backward()
        if lr:
            self.sgd(lr)
        self.last_loss = loss
        return float(loss) if sync else loss

    def loss(self, x, labels) -> float:
        self.forward(x)
        return float(self.nll(labels))

    def destroy(self):
        self.net.destroy()


def build(handle, N, H, W, dtype="float32", layout="NCHW", classes=1000, width=1.0, **kw) -> ResNet50:
    """The network on ``handle`` (descriptors, weights, buffers, Find-chosen algorithms); keyword
    options: depth (stages, 1-4), blocks (cap per stage, or a list), seed, algo_search ('find' or
    'get': Get*Algorithm_v7 heuristics instead of timing)."""
    return ResNet50(handle, N, H, W, dtype, layout, classes, width, **kw)


# -- the basic block benchmarked on its own ---------------------------------------------------------

class BasicBlock:
    """conv 3x3 -> BN train -> ReLU -> conv 3x3 -> BN train -> add x -> ReLU: 7 legacy calls."""

    def __init__(self, handle, N, C, H, W, dtype="float32", layout="NCHW", seed=0, algo_search="find"):
        self.net = net = Net(handle, dtype, layout, seed, algo_search)
        self.handle = handle
        self.x = Buf(net, N, C, H, W)
        self.x.data = net.put(net.rng.standard_normal((N, C, H, W)))
        self.conv1 = Conv(net, "conv1", self.x, C, 3, 1, 1)
        self.bn1 = BN(net, "bn1", self.conv1.y)
        self.relu1 = ReLU(net, self.bn1.y)
        self.conv2 = Conv(net, "conv2", self.relu1.y, C, 3, 1, 1)
        self.bn2 = BN(net, "bn2", self.conv2.y)
        self.relu2 = ReLU(net, self.bn2.y)
        for c in (self.conv1, self.conv2):
            c.need_dx = False
            c.choose_algos()
        self.fused = False

    def forward(self, x=None):
        x = self.x.data if x is None else x
        h = self.handle
        with (cc.fuse(h) if self.fused else contextlib.nullcontext()):
            self.conv1.forward(x)
            self.bn1.forward()
            self.relu1.forward()
            self.conv2.forward(self.relu1.y.data)
            self.bn2.forward()
            cc.cudnnAddTensor(h, 1.0, self.x.desc, x, 1.0, self.bn2.y.desc, self.bn2.y.data)
            self.relu2.forward()
        return self.relu2.y.data

    def params(self) -> dict:
        g = lambda a: self.net.get(a)  # noqa: E731
        return {"conv1.weight": g(self.conv1.w), "conv2.weight": g(self.conv2.w),
                "bn1.weight": g(self.bn1.scale).reshape(-1), "bn1.bias": g(self.bn1.bias).reshape(-1),
                "bn2.weight": g(self.bn2.scale).reshape(-1), "bn2.bias": g(self.bn2.bias).reshape(-1)}

    def destroy(self):
        self.net.destroy()


def build_basic_block(handle, N=32, C=64, H=56, W=56, dtype="float32", layout="NCHW", **kw) -> BasicBlock:
    return BasicBlock(handle, N, C, H, W, dtype, layout, **kw)


# -- command line ------------------------------------------------------------------------------------

def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--place", choices=("cpu", "gpu"), default=None, help="default: the best available")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    ap.add_argument("--layout", choices=("NCHW", "NHWC"), default="NCHW")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--width", type=float, default=0.0625, help="channel multiplier (1.0: ResNet-50)")
    ap.add_argument("--depth", type=int, default=4, choices=(1, 2, 3, 4), help="stages kept")
    ap.add_argument("--blocks", type=int, default=None, help="at most this many blocks per stage")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--algo", choices=("find", "get"), default="find")
    args = ap.parse_args(argv)

    handle = cc.cudnnCreate(args.place)  # cudnnCreate(&handle)
    t0 = time.perf_counter()
    model = build(handle, args.batch, args.size, args.size, args.dtype, args.layout, args.classes, args.width,
                  depth=args.depth, blocks=args.blocks, seed=args.seed, algo_search=args.algo)
    t_build = time.perf_counter() - t0
    rng = np.random.default_rng(args.seed + 1)
    x = model.input(rng.standard_normal((args.batch, 3, args.size, args.size)))
    labels = rng.integers(0, args.classes, args.batch)
    losses, times = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(model.step(x, labels, lr=args.lr))
        times.append(time.perf_counter() - t0)
    print(f"place {handle.place}, {args.dtype} {args.layout}, N={args.batch} {args.size}x{args.size}, width "
          f"{args.width}, {len(model.blocks)} blocks, {len(model.convs)} convolutions; build {t_build:.2f} s")
    for i, (loss, t) in enumerate(zip(losses, times)):
        print(f"step {i}: loss {loss:.6f}  ({t * 1e3:.1f} ms)")
    grads = model.grads()
    out = dict(place=handle.place, losses=losses, times=times, fc_grad_norm=float(np.linalg.norm(grads["fc.weight"])))
    model.destroy()
    cc.cudnnDestroy(handle)  # cudnnDestroy(handle)
    return out


if __name__ == "__main__":
    main()
