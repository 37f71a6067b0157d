"""A Chainer-style small CNN, forward and backward, written against ``cupy.cuda.cudnn`` calls the
way Chainer's ``Function.forward_gpu`` / ``backward_gpu`` were (descriptors from
``cupyx.cudnn``, raw ``libcudnn.*`` calls with ``.value`` descriptors, ``x.data.ptr`` pointers and
``numpy.array(1, dtype).ctypes.data`` scaling factors):

    x (N,1,8,8) -> Convolution2D(4, 3x3, pad 1) -> ReLU -> MaxPooling2D(2) -> Linear(3)
      -> softmax cross entropy with integer labels t -> loss (mean over the batch)

``main()`` returns the loss and the gradients of every parameter and of x.  Run it unchanged
under CuPy 14 through the shim:

    python -m cudnn_compat.run examples/chainer_style_cnn.py
    python -m cudnn_compat.run --allow-stub examples/chainer_style_cnn.py   # no CuPy: NumPy, CPU
    python examples/chainer_style_cnn.py --allow-stub                       # the same

Without CuPy and without --allow-stub it says so in one line on stderr and exits with status 2.

As in examples/cupy13_script.py, ``array_module()`` and ``ptr()`` let it run on NumPy arrays on
cudnn-compat's CPU place when there is no GPU.
"""
import os
import sys

import numpy

if __name__ == "__main__" and "--allow-stub" in sys.argv[1:]:  # no CuPy: cudnn-compat's stand-in modules
    sys.argv.remove("--allow-stub")
    from cudnn_compat import install_cupy_shim
    install_cupy_shim(allow_stub=True)
try:
    import cupy
    import cupy.cuda.cudnn as libcudnn
    import cupyx.cudnn as cudnn  # Chainer <= v5 spelled it ``from cupy import cudnn``
except ImportError:  # run as a script without CuPy 13's cuDNN modules: one line, exit status 2
    if __name__ != "__main__":
        raise
    from cudnn_compat.run import exit_without_cupy
    exit_without_cupy(sys.argv[0] or __file__)


def array_module():
    """CuPy when cuDNN calls run on a GPU here, else NumPy (cudnn-compat's CPU place)."""
    if cupy.cuda.is_available() and os.environ.get("CUDNN_COMPAT_DEVICE", "").lower() != "cpu":
        return cupy
    return numpy


def ptr(a):
    """``a.data.ptr`` of a CuPy array; the host address of a NumPy array on the CPU place."""
    return a.data.ptr if type(a).__module__.startswith("cupy") else a.ctypes.data


def _scalars(dtype):
    oz_dtype = "d" if dtype == numpy.float64 else "f"
    return numpy.array(1, dtype=oz_dtype).ctypes, numpy.array(0, dtype=oz_dtype).ctypes


def _workspace(xp, size):
    ws = xp.empty((max(size, 1),), dtype="b")
    return ws, (ptr(ws) if size else 0)


class Convolution2DFunction:
    """Chainer's Convolution2DFunction (cuDNN path), stride 1."""

    def __init__(self, pad):
        self.pad = pad

    def forward(self, x, W, b):
        xp = cupy if type(x).__module__.startswith("cupy") else numpy
        n, _, h, w = x.shape
        out_c, _, kh, kw = W.shape
        y = xp.empty((n, out_c, h + 2 * self.pad - kh + 1, w + 2 * self.pad - kw + 1), dtype=x.dtype)
        handle = cudnn.get_handle()
        x_desc = cudnn.create_tensor_descriptor(x)
        y_desc = cudnn.create_tensor_descriptor(y)
        self.filter_desc = cudnn.create_filter_descriptor(W)
        self.conv_desc = cudnn.create_convolution_descriptor((self.pad, self.pad), (1, 1), x.dtype)
        self.bias_desc = cudnn.create_tensor_descriptor(b[None, :, None, None])
        perf = libcudnn.getConvolutionForwardAlgorithm_v7(handle, x_desc.value, self.filter_desc.value,
                                                          self.conv_desc.value, y_desc.value, 8)[0]
        ws, ws_ptr = _workspace(xp, perf.memory)
        one, zero = _scalars(x.dtype)
        libcudnn.convolutionForward(handle, one.data, x_desc.value, ptr(x), self.filter_desc.value, ptr(W),
                                    self.conv_desc.value, perf.algo, ws_ptr, perf.memory, zero.data, y_desc.value,
                                    ptr(y))
        cudnn.add_tensor(handle, one.data, self.bias_desc.value, ptr(b), one.data, y_desc.value, ptr(y))
        return y

    def backward(self, x, W, b, gy):
        xp = cupy if type(x).__module__.startswith("cupy") else numpy
        handle = cudnn.get_handle()
        gy = xp.ascontiguousarray(gy)
        x_desc = cudnn.create_tensor_descriptor(x)
        gy_desc = cudnn.create_tensor_descriptor(gy)
        one, zero = _scalars(x.dtype)
        gx, gW, gb = xp.empty_like(x), xp.empty_like(W), xp.empty_like(b)

        perf = libcudnn.getConvolutionBackwardFilterAlgorithm_v7(handle, x_desc.value, gy_desc.value,
                                                                 self.conv_desc.value, self.filter_desc.value, 8)[0]
        ws, ws_ptr = _workspace(xp, perf.memory)
        libcudnn.convolutionBackwardFilter_v3(handle, one.data, x_desc.value, ptr(x), gy_desc.value, ptr(gy),
                                              self.conv_desc.value, perf.algo, ws_ptr, perf.memory, zero.data,
                                              self.filter_desc.value, ptr(gW))

        perf = libcudnn.getConvolutionBackwardDataAlgorithm_v7(handle, self.filter_desc.value, gy_desc.value,
                                                               self.conv_desc.value, x_desc.value, 8)[0]
        ws, ws_ptr = _workspace(xp, perf.memory)
        libcudnn.convolutionBackwardData_v3(handle, one.data, self.filter_desc.value, ptr(W), gy_desc.value, ptr(gy),
                                            self.conv_desc.value, perf.algo, ws_ptr, perf.memory, zero.data,
                                            x_desc.value, ptr(gx))

        libcudnn.convolutionBackwardBias(handle, one.data, gy_desc.value, ptr(gy), zero.data, self.bias_desc.value,
                                         ptr(gb))
        return gx, gW, gb


class ReLU:
    """Chainer's ReLU (cuDNN path): activationForward_v4 / activationBackward_v4."""

    def forward(self, x):
        xp = cupy if type(x).__module__.startswith("cupy") else numpy
        y = xp.empty_like(x)
        handle = cudnn.get_handle()
        self.desc = cudnn.create_tensor_descriptor(x)
        self.act = cudnn.create_activation_descriptor(libcudnn.CUDNN_ACTIVATION_RELU)
        one, zero = _scalars(x.dtype)
        libcudnn.activationForward_v4(handle, self.act.value, one.data, self.desc.value, ptr(x), zero.data,
                                      self.desc.value, ptr(y))
        return y

    def backward(self, x, y, gy):
        xp = cupy if type(x).__module__.startswith("cupy") else numpy
        gx = xp.empty_like(x)
        one, zero = _scalars(x.dtype)
        libcudnn.activationBackward_v4(cudnn.get_handle(), self.act.value, one.data, self.desc.value, ptr(y),
                                       self.desc.value, ptr(gy), self.desc.value, ptr(x), zero.data, self.desc.value,
                                       ptr(gx))
        return gx


class MaxPooling2D:
    """Chainer's MaxPooling2D (cuDNN path), window = stride = k."""

    def __init__(self, k):
        self.k = k

    def forward(self, x):
        xp = cupy if type(x).__module__.startswith("cupy") else numpy
        n, c, h, w = x.shape
        y = xp.empty((n, c, h // self.k, w // self.k), dtype=x.dtype)
        handle = cudnn.get_handle()
        self.x_desc = cudnn.create_tensor_descriptor(x)
        self.y_desc = cudnn.create_tensor_descriptor(y)
        self.pool = cudnn.create_pooling_descriptor((self.k, self.k), (self.k, self.k), (0, 0),
                                                    libcudnn.CUDNN_POOLING_MAX)
        one, zero = _scalars(x.dtype)
        libcudnn.poolingForward(handle, self.pool.value, one.data, self.x_desc.value, ptr(x), zero.data,
                                self.y_desc.value, ptr(y))
        return y

    def backward(self, x, y, gy):
        xp = cupy if type(x).__module__.startswith("cupy") else numpy
        gx = xp.empty_like(x)
        gy = xp.ascontiguousarray(gy)
        one, zero = _scalars(x.dtype)
        libcudnn.poolingBackward(cudnn.get_handle(), self.pool.value, one.data, self.y_desc.value, ptr(y),
                                 self.y_desc.value, ptr(gy), self.x_desc.value, ptr(x), zero.data, self.x_desc.value,
                                 ptr(gx))
        return gx


class SoftmaxCrossEntropy:
    """Chainer's softmax_cross_entropy: log-softmax over classes with cuDNN (CUDNN_SOFTMAX_LOG on
    an (N, classes, 1, 1) view), mean of -log p[t]; backward (softmax - onehot) / N."""

    def forward(self, x, t):
        xp = cupy if type(x).__module__.startswith("cupy") else numpy
        x4 = xp.ascontiguousarray(x).reshape(x.shape[0], x.shape[1], 1, 1)
        log_y = xp.empty_like(x4)
        desc = cudnn.create_tensor_descriptor(x4)
        one, zero = _scalars(x.dtype)
        libcudnn.softmaxForward(cudnn.get_handle(), libcudnn.CUDNN_SOFTMAX_LOG, libcudnn.CUDNN_SOFTMAX_MODE_CHANNEL,
                                one.data, desc.value, ptr(x4), zero.data, desc.value, ptr(log_y))
        self.log_y = log_y.reshape(x.shape)
        return -self.log_y[xp.arange(t.size), t].mean()

    def backward(self, t):
        xp = cupy if type(t).__module__.startswith("cupy") else numpy
        gx = xp.exp(self.log_y)
        gx[xp.arange(t.size), t] -= 1
        return gx / t.size


def init_params(seed=0, dtype=numpy.float32, n=4, classes=3):
    rng = numpy.random.default_rng(seed)
    return {
        "x": rng.standard_normal((n, 1, 8, 8)).astype(dtype),
        "t": rng.integers(0, classes, n).astype(numpy.int32),
        "W1": (rng.standard_normal((4, 1, 3, 3)) * 0.5).astype(dtype),
        "b1": (rng.standard_normal(4) * 0.1).astype(dtype),
        "W2": (rng.standard_normal((classes, 64)) * 0.2).astype(dtype),
        "b2": (rng.standard_normal(classes) * 0.1).astype(dtype),
    }


def main(seed=0, dtype=numpy.float32):
    """Loss and gradients (host arrays) of one forward/backward pass, with the inputs."""
    xp = array_module()
    params = init_params(seed, dtype)
    x, t, W1, b1, W2, b2 = (xp.asarray(params[k]) for k in ("x", "t", "W1", "b1", "W2", "b2"))

    conv, relu, pool, loss_fn = Convolution2DFunction(pad=1), ReLU(), MaxPooling2D(2), SoftmaxCrossEntropy()
    h1 = conv.forward(x, W1, b1)
    h2 = relu.forward(h1)
    h3 = pool.forward(h2)
    flat = h3.reshape(h3.shape[0], -1)
    logits = flat @ W2.T + b2  # Chainer's Linear (cuBLAS)
    loss = loss_fn.forward(logits, t)

    g_logits = loss_fn.backward(t)
    gW2, gb2 = g_logits.T @ flat, g_logits.sum(axis=0)
    g_h3 = (g_logits @ W2).reshape(h3.shape)
    g_h2 = pool.backward(h2, h3, g_h3)
    g_h1 = relu.backward(h1, h2, g_h2)
    gx, gW1, gb1 = conv.backward(x, W1, b1, g_h1)

    host = (lambda a: a.get()) if xp is not numpy else numpy.asarray
    grads = {"gx": gx, "gW1": gW1, "gb1": gb1, "gW2": gW2, "gb2": gb2}
    return dict(params, loss=float(loss), place="gpu" if xp is not numpy else "cpu",
                **{k: host(v) for k, v in grads.items()})


if __name__ == "__main__":
    out = main()
    print(f"place: {out['place']}  loss: {out['loss']:.6f}")
    for k in ("gW1", "gb1", "gW2", "gb2", "gx"):
        print(f"  |{k}|_1 = {numpy.abs(out[k]).sum():.6f}")
