"""A CuPy-13-style script: the high-level helpers of ``cupyx.cudnn`` (and the deprecated
``cupy.cudnn``) plus raw calls into ``cupy.cuda.cudnn`` with pointer arguments, as code written
for CuPy <= 13 did.  CuPy 14 removed those modules; run the script unchanged through the shim:

    python -m cudnn_compat.run examples/cupy13_script.py                # CuPy 14 with a GPU
    python -m cudnn_compat.run --allow-stub examples/cupy13_script.py   # no CuPy at all: NumPy, CPU
    python examples/cupy13_script.py --allow-stub                       # the same (the script installs the shim)

Without CuPy and without --allow-stub it says so in one line on stderr and exits with status 2.

The two helpers below are the only concession to running without a GPU: with no usable CUDA
device (or ``CUDNN_COMPAT_DEVICE=cpu``) cudnn-compat's handles run on the CPU reference engine,
which works on NumPy arrays, so the script builds its arrays with NumPy there.
"""
import os
import sys
import warnings

import numpy

if __name__ == "__main__" and "--allow-stub" in sys.argv[1:]:  # no CuPy: cudnn-compat's stand-in modules
    sys.argv.remove("--allow-stub")
    from cudnn_compat import install_cupy_shim
    install_cupy_shim(allow_stub=True)
try:
    import cupy
    import cupy.cuda.cudnn as libcudnn
    import cupyx.cudnn as cudnn
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


def to_host(a):
    return a.get() if hasattr(a, "get") else numpy.asarray(a)


def main(seed=0, dtype=numpy.float32):
    xp = array_module()
    rng = numpy.random.default_rng(seed)
    x = xp.asarray(rng.standard_normal((2, 3, 8, 8)).astype(dtype))
    W = xp.asarray((rng.standard_normal((4, 3, 3, 3)) * 0.5).astype(dtype))
    b = xp.asarray(rng.standard_normal(4).astype(dtype))
    gamma = xp.asarray((1 + 0.1 * rng.standard_normal(4)).astype(dtype))
    beta = xp.asarray((0.1 * rng.standard_normal(4)).astype(dtype))
    gy = xp.asarray(rng.standard_normal((2, 4, 8, 8)).astype(dtype))
    out = {"x": to_host(x), "W": to_host(W), "b": to_host(b), "gamma": to_host(gamma), "beta": to_host(beta),
           "gy": to_host(gy), "version": libcudnn.getVersion()}

    # -- cupyx.cudnn: convolution with a bias, auto-tuned (Find), then heuristics (Get_v7) --
    y = xp.empty((2, 4, 8, 8), dtype)
    cudnn.convolution_forward(x, W, b, y, (1, 1), (1, 1), (1, 1), 1, auto_tune=True, tensor_core="auto")
    y2 = xp.empty_like(y)
    cudnn.convolution_forward(x, W, None, y2, (1, 1), (1, 1), (1, 1), 1, auto_tune=False, tensor_core="never")
    out["conv"], out["conv_nobias"] = to_host(y), to_host(y2)

    gx, gW = xp.empty_like(x), xp.empty_like(W)
    cudnn.convolution_backward_data(W, gy, None, gx, (1, 1), (1, 1), (1, 1), 1, deterministic=False,
                                    auto_tune=False, tensor_core="never")
    cudnn.convolution_backward_filter(x, gy, gW, (1, 1), (1, 1), (1, 1), 1, deterministic=True, auto_tune=False,
                                      tensor_core="never")
    out["conv_gx"], out["conv_gW"] = to_host(gx), to_host(gW)

    # -- activation, pooling, batch normalization, softmax --
    z = cudnn.activation_forward(y, libcudnn.CUDNN_ACTIVATION_RELU)
    p = xp.empty((2, 4, 4, 4), dtype)
    cudnn.pooling_forward(z, p, (2, 2), (2, 2), (0, 0), libcudnn.CUDNN_POOLING_MAX)
    running_mean, running_var = xp.zeros(4, dtype), xp.ones(4, dtype)
    bn, mean, inv_std = cudnn.batch_normalization_forward_training(
        p, gamma, beta, running_mean, running_var, None, None, 2e-5, 0.9, True, libcudnn.CUDNN_BATCHNORM_SPATIAL,
        False)
    probs = cudnn.softmax_forward(bn, 1, libcudnn.CUDNN_SOFTMAX_ACCURATE)
    out.update(relu=to_host(z), pool=to_host(p), bn=to_host(bn), bn_mean=to_host(mean), bn_inv_std=to_host(inv_std),
               running_mean=to_host(running_mean), running_var=to_host(running_var), softmax=to_host(probs))
    g_bn = xp.asarray(rng.standard_normal(bn.shape).astype(dtype))
    gbn, ggamma, gbeta = cudnn.batch_normalization_backward(
        p, gamma, g_bn, mean, inv_std, 2e-5, True, libcudnn.CUDNN_BATCHNORM_SPATIAL, False)
    out.update(bn_gy=to_host(g_bn), bn_gx=to_host(gbn), bn_ggamma=to_host(ggamma), bn_gbeta=to_host(gbeta))

    # -- raw cupy.cuda.cudnn calls with pointers, as CuPy 13 code wrote them --
    handle = cudnn.get_handle()
    one = numpy.array(1, dtype)
    half = numpy.array(0.5, dtype)
    y_desc = cudnn.create_tensor_descriptor(y)
    scaled = y.copy()
    libcudnn.scaleTensor(handle, y_desc.value, ptr(scaled), half.ctypes.data)  # scaled = 0.5 * y
    b4 = b.reshape(1, 4, 1, 1)
    b_desc = cudnn.create_tensor_descriptor(b4)
    libcudnn.addTensor_v3(handle, one.ctypes.data, b_desc.value, ptr(b4), one.ctypes.data, y_desc.value,
                          ptr(scaled))  # scaled += b
    dims = numpy.array(y.shape, numpy.int32)
    strides = numpy.array([s // y.itemsize for s in y.strides], numpy.int32)
    nd_desc = libcudnn.createTensorDescriptor()
    libcudnn.setTensorNdDescriptor(nd_desc, libcudnn.CUDNN_DATA_FLOAT if dtype == numpy.float32
                                   else libcudnn.CUDNN_DATA_DOUBLE, 4, dims.ctypes.data, strides.ctypes.data)
    out["nd_desc"] = libcudnn.getTensor4dDescriptor(nd_desc)
    libcudnn.destroyTensorDescriptor(nd_desc)
    out["scaled"] = to_host(scaled)

    # the algorithm queries return CuDNNAlgoPerf objects
    x_desc, w_desc = cudnn.create_tensor_descriptor(x), cudnn.create_filter_descriptor(W)
    conv_desc = cudnn.create_convolution_descriptor((1, 1), (1, 1), dtype)
    perfs = libcudnn.getConvolutionForwardAlgorithm_v7(handle, x_desc.value, w_desc.value, conv_desc.value,
                                                       y_desc.value, 4)
    out["algos"] = [(p.algo, p.status, p.memory) for p in perfs]

    # errors are cupy.cuda.cudnn.CuDNNError with the status
    try:
        libcudnn.setTensor4dDescriptor(nd_desc, libcudnn.CUDNN_TENSOR_NCHW, libcudnn.CUDNN_DATA_FLOAT, 1, 1, 1, 1)
    except libcudnn.CuDNNError as e:  # nd_desc was destroyed above
        out["error_status"] = e.status

    # -- the deprecated cupy.cudnn spelling still works --
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from cupy import cudnn as old_cudnn
        out["old_relu"] = to_host(old_cudnn.activation_forward(y, libcudnn.CUDNN_ACTIVATION_RELU))
    out["place"] = "gpu" if xp is not numpy else "cpu"
    return out


if __name__ == "__main__":
    res = main()
    print(f"cuDNN {res['version']} (cudnn-compat) on the {res['place']} place")
    print("conv algos (algo, status, workspace):", res["algos"])
    print("softmax sums (each 1):", numpy.round(res["softmax"].sum(axis=1).ravel()[:4], 6))
    print("running mean after one step:", res["running_mean"])
    print("stale descriptor error status:", res["error_status"], "(CUDNN_STATUS_BAD_PARAM = 3)")
