"""C-style cuDNN v7 code, translated line by line to Python against cudnn-compat's C names.

The network: conv 3x3 (pad 1) + bias -> ReLU -> 2x2 max pooling -> softmax over channels, then
the convolution's backward passes (data, filter, bias) for an upstream gradient.  Each Python
statement follows the C line in the comment above it; the Python mapping is the one of
docs/conventions.md (out-parameters become return values, ``&alpha`` is a ``ctypes.c_void_p``).

    python examples/v7_c_style.py              # GPU when CuPy sees one, else the CPU reference
    CUDNN_COMPAT_DEVICE=cpu python examples/v7_c_style.py

No shim is needed: the C names are cudnn_compat's own.
"""
import ctypes

import numpy as np

from cudnn_compat import (  # #include <cudnn.h>: the C names and constants used below
    CUDNN_ACTIVATION_RELU, CUDNN_CROSS_CORRELATION, CUDNN_DATA_DOUBLE, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN,
    CUDNN_POOLING_MAX, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, CUDNN_TENSOR_NCHW,
    cudnnActivationForward, cudnnAddTensor, cudnnConvolutionBackwardBias, cudnnConvolutionBackwardData,
    cudnnConvolutionBackwardFilter, cudnnConvolutionForward, cudnnCreate, cudnnCreateActivationDescriptor,
    cudnnCreateConvolutionDescriptor, cudnnCreateFilterDescriptor, cudnnCreatePoolingDescriptor,
    cudnnCreateTensorDescriptor, cudnnDestroy, cudnnDestroyActivationDescriptor, cudnnDestroyConvolutionDescriptor,
    cudnnDestroyFilterDescriptor, cudnnDestroyPoolingDescriptor, cudnnDestroyTensorDescriptor,
    cudnnGetConvolution2dForwardOutputDim, cudnnGetConvolutionBackwardDataAlgorithm_v7,
    cudnnGetConvolutionBackwardDataWorkspaceSize, cudnnGetConvolutionBackwardFilterAlgorithm_v7,
    cudnnGetConvolutionBackwardFilterWorkspaceSize, cudnnGetConvolutionForwardAlgorithm_v7,
    cudnnGetConvolutionForwardWorkspaceSize, cudnnGetPooling2dForwardOutputDim, cudnnPoolingForward,
    cudnnSetActivationDescriptor, cudnnSetConvolution2dDescriptor, cudnnSetFilter4dDescriptor,
    cudnnSetPooling2dDescriptor, cudnnSetTensor4dDescriptor, cudnnSoftmaxForward)


def main(seed=0, dtype=np.float32, N=2, C=3, H=8, W=8, K=4):
    rng = np.random.default_rng(seed)
    x_host = rng.standard_normal((N, C, H, W)).astype(dtype)
    w_host = (rng.standard_normal((K, C, 3, 3)) * 0.5).astype(dtype)
    b_host = rng.standard_normal((1, K, 1, 1)).astype(dtype)
    dy_host = rng.standard_normal((N, K, H, W)).astype(dtype)
    dt = CUDNN_DATA_DOUBLE if dtype == np.float64 else CUDNN_DATA_FLOAT

    # cudnnHandle_t handle;  cudnnCreate(&handle);
    handle = cudnnCreate()
    if handle.place == "gpu":  # cudaMalloc + cudaMemcpy(HostToDevice)
        import cupy as xp
    else:  # the CPU place works on host (NumPy) memory
        xp = np
    x, w, b, dy = (xp.asarray(a) for a in (x_host, w_host, b_host, dy_host))

    # float alpha = 1.0f, beta = 0.0f;   (double for double data)  -- passed as &alpha, &beta
    alpha, beta = np.array(1.0, dtype), np.array(0.0, dtype)
    p_alpha, p_beta = ctypes.c_void_p(alpha.ctypes.data), ctypes.c_void_p(beta.ctypes.data)

    # cudnnTensorDescriptor_t xDesc;  cudnnCreateTensorDescriptor(&xDesc);
    xDesc = cudnnCreateTensorDescriptor()
    # cudnnSetTensor4dDescriptor(xDesc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, H, W);
    cudnnSetTensor4dDescriptor(xDesc, CUDNN_TENSOR_NCHW, dt, N, C, H, W)
    # cudnnFilterDescriptor_t wDesc;  cudnnCreateFilterDescriptor(&wDesc);
    wDesc = cudnnCreateFilterDescriptor()
    # cudnnSetFilter4dDescriptor(wDesc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, K, C, 3, 3);
    cudnnSetFilter4dDescriptor(wDesc, dt, CUDNN_TENSOR_NCHW, K, C, 3, 3)
    # cudnnConvolutionDescriptor_t convDesc;  cudnnCreateConvolutionDescriptor(&convDesc);
    convDesc = cudnnCreateConvolutionDescriptor()
    # cudnnSetConvolution2dDescriptor(convDesc, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    cudnnSetConvolution2dDescriptor(convDesc, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, dt)
    # int n, c, h, wd;  cudnnGetConvolution2dForwardOutputDim(convDesc, xDesc, wDesc, &n, &c, &h, &wd);
    n, c, h, wd = cudnnGetConvolution2dForwardOutputDim(convDesc, xDesc, wDesc)
    # cudnnTensorDescriptor_t yDesc;  ...  cudnnSetTensor4dDescriptor(yDesc, NCHW, FLOAT, n, c, h, wd);
    yDesc = cudnnCreateTensorDescriptor()
    cudnnSetTensor4dDescriptor(yDesc, CUDNN_TENSOR_NCHW, dt, n, c, h, wd)
    # float *y;  cudaMalloc(&y, n*c*h*wd*sizeof(float));
    y = xp.empty((n, c, h, wd), dtype)

    # cudnnConvolutionFwdAlgoPerf_t perf[8];  int returned;
    # cudnnGetConvolutionForwardAlgorithm_v7(handle, xDesc, wDesc, convDesc, yDesc, 8, &returned, perf);
    perf = cudnnGetConvolutionForwardAlgorithm_v7(handle, xDesc, wDesc, convDesc, yDesc, 8)
    # cudnnConvolutionFwdAlgo_t algo = perf[0].algo;
    algo = perf[0].algo
    # size_t wsSize;  cudnnGetConvolutionForwardWorkspaceSize(handle, xDesc, wDesc, convDesc, yDesc, algo, &wsSize);
    ws_size = cudnnGetConvolutionForwardWorkspaceSize(handle, xDesc, wDesc, convDesc, yDesc, algo)
    # void *ws = NULL;  if (wsSize) cudaMalloc(&ws, wsSize);
    ws = xp.empty(ws_size, np.uint8) if ws_size else None
    # cudnnConvolutionForward(handle, &alpha, xDesc, x, wDesc, w, convDesc, algo, ws, wsSize, &beta, yDesc, y);
    cudnnConvolutionForward(handle, p_alpha, xDesc, x, wDesc, w, convDesc, algo, ws, ws_size, p_beta, yDesc, y)

    # cudnnTensorDescriptor_t bDesc;  ...  cudnnSetTensor4dDescriptor(bDesc, NCHW, FLOAT, 1, K, 1, 1);
    bDesc = cudnnCreateTensorDescriptor()
    cudnnSetTensor4dDescriptor(bDesc, CUDNN_TENSOR_NCHW, dt, 1, K, 1, 1)
    # cudnnAddTensor(handle, &alpha, bDesc, b, &alpha, yDesc, y);          /* y += b */
    cudnnAddTensor(handle, p_alpha, bDesc, b, p_alpha, yDesc, y)

    # cudnnActivationDescriptor_t actDesc;  cudnnCreateActivationDescriptor(&actDesc);
    actDesc = cudnnCreateActivationDescriptor()
    # cudnnSetActivationDescriptor(actDesc, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0);
    cudnnSetActivationDescriptor(actDesc, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0)
    # cudnnActivationForward(handle, actDesc, &alpha, yDesc, y, &beta, yDesc, y);   /* in place */
    cudnnActivationForward(handle, actDesc, p_alpha, yDesc, y, p_beta, yDesc, y)

    # cudnnPoolingDescriptor_t poolDesc;  cudnnCreatePoolingDescriptor(&poolDesc);
    poolDesc = cudnnCreatePoolingDescriptor()
    # cudnnSetPooling2dDescriptor(poolDesc, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2);
    cudnnSetPooling2dDescriptor(poolDesc, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2)
    # int pn, pc, ph, pw;  cudnnGetPooling2dForwardOutputDim(poolDesc, yDesc, &pn, &pc, &ph, &pw);
    pn, pc, ph, pw = cudnnGetPooling2dForwardOutputDim(poolDesc, yDesc)
    # cudnnTensorDescriptor_t pDesc;  ...  cudnnSetTensor4dDescriptor(pDesc, NCHW, FLOAT, pn, pc, ph, pw);
    pDesc = cudnnCreateTensorDescriptor()
    cudnnSetTensor4dDescriptor(pDesc, CUDNN_TENSOR_NCHW, dt, pn, pc, ph, pw)
    pooled = xp.empty((pn, pc, ph, pw), dtype)
    # cudnnPoolingForward(handle, poolDesc, &alpha, yDesc, y, &beta, pDesc, pooled);
    cudnnPoolingForward(handle, poolDesc, p_alpha, yDesc, y, p_beta, pDesc, pooled)

    prob = xp.empty_like(pooled)
    # cudnnSoftmaxForward(handle, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL,
    #                     &alpha, pDesc, pooled, &beta, pDesc, prob);
    cudnnSoftmaxForward(handle, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, p_alpha, pDesc, pooled, p_beta,
                        pDesc, prob)

    # -- the convolution's backward passes for an upstream gradient dy (shaped like y) --
    dx, dw, db = xp.empty_like(x), xp.empty_like(w), xp.empty_like(b)
    # cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, wDesc, yDesc, convDesc, xDesc, 8, &returned, dperf);
    dalgo = cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, wDesc, yDesc, convDesc, xDesc, 8)[0].algo
    # cudnnGetConvolutionBackwardDataWorkspaceSize(handle, wDesc, yDesc, convDesc, xDesc, dalgo, &dws);
    dws = cudnnGetConvolutionBackwardDataWorkspaceSize(handle, wDesc, yDesc, convDesc, xDesc, dalgo)
    dws_buf = xp.empty(dws, np.uint8) if dws else None
    # cudnnConvolutionBackwardData(handle, &alpha, wDesc, w, yDesc, dy, convDesc, dalgo, ws, dws, &beta, xDesc, dx);
    cudnnConvolutionBackwardData(handle, p_alpha, wDesc, w, yDesc, dy, convDesc, dalgo, dws_buf, dws, p_beta, xDesc,
                                 dx)
    # cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, xDesc, yDesc, convDesc, wDesc, 8, &returned, fperf);
    falgo = cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, xDesc, yDesc, convDesc, wDesc, 8)[0].algo
    fws = cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, xDesc, yDesc, convDesc, wDesc, falgo)
    fws_buf = xp.empty(fws, np.uint8) if fws else None
    # cudnnConvolutionBackwardFilter(handle, &alpha, xDesc, x, yDesc, dy, convDesc, falgo, ws, fws, &beta, wDesc, dw);
    cudnnConvolutionBackwardFilter(handle, p_alpha, xDesc, x, yDesc, dy, convDesc, falgo, fws_buf, fws, p_beta, wDesc,
                                   dw)
    # cudnnConvolutionBackwardBias(handle, &alpha, yDesc, dy, &beta, bDesc, db);
    cudnnConvolutionBackwardBias(handle, p_alpha, yDesc, dy, p_beta, bDesc, db)

    # cudaMemcpy(host, device, ..., cudaMemcpyDeviceToHost);
    host = {name: (a.get() if xp is not np else a.copy()) for name, a in
            (("prob", prob), ("dx", dx), ("dw", dw), ("db", db))}

    # cudnnDestroy*(...);  cudnnDestroy(handle);
    for d in (xDesc, yDesc, bDesc, pDesc):
        cudnnDestroyTensorDescriptor(d)
    cudnnDestroyFilterDescriptor(wDesc)
    cudnnDestroyConvolutionDescriptor(convDesc)
    cudnnDestroyActivationDescriptor(actDesc)
    cudnnDestroyPoolingDescriptor(poolDesc)
    cudnnDestroy(handle)
    return dict(x=x_host, w=w_host, b=b_host, dy=dy_host, place=handle.place, algo=algo, **host)


if __name__ == "__main__":
    out = main()
    print(f"ran on the {out['place']} place; conv forward algo {out['algo']}")
    print("softmax over channels, sample 0 at (0, 0):", np.round(out["prob"][0, :, 0, 0], 4))
    print("channel sums (each 1):", np.round(out["prob"].sum(axis=1).ravel()[:4], 6))
    print("|dx|, |dw|, db:", float(np.abs(out["dx"]).sum()), float(np.abs(out["dw"]).sum()), out["db"].ravel())
