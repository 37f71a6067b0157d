"""The REAL cudnnRNNForward of libcudnn 9 (the v8 RNN API, 002 §7.2.49 SetRNNDescriptor_v8,
§7.2.47 SetRNNDataDescriptor, §7.2.30 GetRNNTempSpaceSizes, §7.2.31 GetRNNWeightParams, §7.2.36
RNNForward) through ctypes: the ground truth of the RNN GPU tests and benchmark.  Not used by
any engine.  Prototypes are in legacy_cudnn.PROTOTYPES; buffers are CuPy arrays it owns, or
device pointers.

``RealRNN`` owns one network's descriptors and buffers; ``load_weights`` copies host matrices
and biases into its weight space at the addresses cudnnGetRNNWeightParams gives, so both sides
of a comparison hold the same numbers whatever each one's weight layout is.
"""
from __future__ import annotations

import ctypes

import numpy as np

from . import legacy_cudnn as L

MODE = {"RELU": 0, "TANH": 1, "LSTM": 2, "GRU": 3}
GATES = {"RELU": 1, "TANH": 1, "LSTM": 4, "GRU": 3}
BIAS = {"NONE": 0, "INP": 1, "DOUBLE": 2, "REC": 3}
LAYOUT = {"SEQ": 0, "PACKED": 1, "BATCH": 2}
FWD_INFERENCE, FWD_TRAINING = 0, 1
WGRAD_ADD = 0  # cudnnWgradMode_t CUDNN_WGRAD_MODE_ADD
ALGO_STANDARD, LINEAR_INPUT, PADDED_IO_ENABLED = 0, 0, 1


def _ptr(a) -> int:
    if a is None:
        return 0
    if isinstance(a, int):
        return a
    return int(a.data.ptr)


class RealRNN:
    """A network on the real legacy API: descriptors, weight space, work and reserve space."""

    def __init__(self, handle, mode: str, D: int, layers: int, I: int, H: int, T: int, lengths, dtype="float32",
                 math="DEFAULT_MATH", math_prec=None, bias="DOUBLE", P=None, layout="SEQ"):
        import cupy
        L.load()
        self.handle = handle.ptr if isinstance(handle, L.Handle) else int(handle)
        self.mode, self.D, self.L, self.I, self.H, self.T = mode, D, layers, I, H, T
        self.P = P or H
        self.B = len(lengths)
        self.lengths = list(lengths)
        self.dtype = dtype
        self.descs = L.Descs()
        self._own = []
        dt = L.DATA_TYPE[dtype]
        prec = L.DATA_TYPE[math_prec or ("float64" if dtype == "float64" else "float32")]
        size = ctypes.c_size_t()
        self.drop = self._create("Dropout")
        L.call("cudnnDropoutGetStatesSize", self.handle, ctypes.byref(size))
        self.states = cupy.empty(max(int(size.value), 1), cupy.uint8)
        L.call("cudnnSetDropoutDescriptor", self.drop, self.handle, 0.0, _ptr(self.states), int(size.value), 0)
        self.rnn = self._create("RNN")
        L.call("cudnnSetRNNDescriptor_v8", self.rnn, ALGO_STANDARD, MODE[mode], BIAS[bias], int(D == 2), LINEAR_INPUT,
               dt, prec, L.MATH[math], I, H, self.P, layers, self.drop, PADDED_IO_ENABLED)
        lens = (ctypes.c_int * self.B)(*self.lengths)
        self.xd, self.yd = self._create("RNNData"), self._create("RNNData")
        L.call("cudnnSetRNNDataDescriptor", self.xd, dt, LAYOUT[layout], T, self.B, I, lens, None)
        L.call("cudnnSetRNNDataDescriptor", self.yd, dt, LAYOUT[layout], T, self.B, D * self.P, lens, None)
        n = layers * D
        self.hd = self.descs.tensor((n, self.B, self.P), (self.B * self.P, self.P, 1), dtype)
        self.cd = self.descs.tensor((n, self.B, H), (self.B * H, H, 1), dtype)
        L.call("cudnnGetRNNWeightSpaceSize", self.handle, self.rnn, ctypes.byref(size))
        self.wsize = int(size.value)
        self.weights = cupy.zeros(max(self.wsize, 1), cupy.uint8)
        sizes = {}
        for mode_, name in ((FWD_INFERENCE, "inference"), (FWD_TRAINING, "training")):
            ws, rs = ctypes.c_size_t(), ctypes.c_size_t()
            L.call("cudnnGetRNNTempSpaceSizes", self.handle, self.rnn, mode_, self.xd, ctypes.byref(ws), ctypes.byref(rs))
            sizes[name] = (int(ws.value), int(rs.value))
        self.sizes = sizes
        self.work = cupy.empty(max(max(v[0] for v in sizes.values()), 1), cupy.uint8)
        self.reserve = cupy.empty(max(sizes["training"][1], 1), cupy.uint8)
        self.dev_lengths = cupy.asarray(np.asarray(self.lengths, np.int32))
        self.md, self.bd = self._create("Tensor"), self._create("Tensor")

    def _create(self, kind: str) -> int:
        p = ctypes.c_void_p()
        L.call(f"cudnnCreate{kind}Descriptor", ctypes.byref(p))
        self._own.append((kind, p.value))
        return p.value

    def weight_params(self, pseudo: int, lin: int):
        """((address, dims) of the matrix, (address, dims) of the bias); None where absent."""
        m, b = ctypes.c_void_p(), ctypes.c_void_p()
        L.call("cudnnGetRNNWeightParams", self.handle, self.rnn, pseudo, self.wsize, _ptr(self.weights), lin, self.md,
               ctypes.byref(m), self.bd, ctypes.byref(b))
        return (self._dims(m.value, self.md), self._dims(b.value, self.bd))

    def _dims(self, addr, desc):
        if not addr:
            return None
        dt, nb = ctypes.c_int(), ctypes.c_int()
        dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
        L.call("cudnnGetTensorNdDescriptor", desc, 8, ctypes.byref(dt), ctypes.byref(nb), dims, strides)
        return int(addr), tuple(dims[: nb.value])

    def load_weights(self, values: dict) -> None:
        """``values[(pseudo, lin)] = (matrix or None, bias or None)`` (host arrays, [rows, cols] and
        [rows]) -> this network's weight space; shapes must match what cuDNN reports."""
        import cupy
        st = np.dtype({"float16": np.float16, "float32": np.float32, "float64": np.float64}[self.dtype])
        for (p, lin), (mat, vec) in values.items():
            m, b = self.weight_params(p, lin)
            for host, got, what in ((mat, m, "matrix"), (vec, b, "bias")):
                if host is None and got is None:
                    continue
                if host is None or got is None:
                    raise ValueError(f"pseudo-layer {p} linLayerID {lin}: {what} present on one side only")
                host = np.ascontiguousarray(host, st)
                if int(np.prod(got[1])) != host.size:
                    raise ValueError(f"pseudo-layer {p} linLayerID {lin}: {what} dims {got[1]} vs {host.shape}")
                cupy.cuda.runtime.memcpy(got[0], host.ctypes.data, host.nbytes, 1)  # host to device

    def forward(self, training: bool, x, y, hx=None, hy=None, cx=None, cy=None) -> None:
        ws, rs = self.sizes["training" if training else "inference"]
        L.call("cudnnRNNForward", self.handle, self.rnn, FWD_TRAINING if training else FWD_INFERENCE,
               _ptr(self.dev_lengths), self.xd, _ptr(x), self.yd, _ptr(y), self.hd, _ptr(hx), _ptr(hy), self.cd,
               _ptr(cx), _ptr(cy), self.wsize, _ptr(self.weights), ws, _ptr(self.work), rs if training else 0,
               _ptr(self.reserve) if training else None)

    def backward_data(self, y, dy, dx, hx=None, dhy=None, dhx=None, cx=None, dcy=None, dcx=None) -> None:
        """cudnnRNNBackwardData_v8 (002 §8.2.18) after ``forward(True, ...)`` (its reserve space)."""
        ws, rs = self.sizes["training"]
        L.call("cudnnRNNBackwardData_v8", self.handle, self.rnn, _ptr(self.dev_lengths), self.yd, _ptr(y), _ptr(dy),
               self.xd, _ptr(dx), self.hd, _ptr(hx), _ptr(dhy), _ptr(dhx), self.cd, _ptr(cx), _ptr(dcy), _ptr(dcx),
               self.wsize, _ptr(self.weights), ws, _ptr(self.work), rs, _ptr(self.reserve))

    def backward_weights(self, x, y, dweights, hx=None) -> None:
        """cudnnRNNBackwardWeights_v8 (002 §8.2.21), CUDNN_WGRAD_MODE_ADD into ``dweights`` (wsize bytes),
        after ``backward_data``."""
        ws, rs = self.sizes["training"]
        L.call("cudnnRNNBackwardWeights_v8", self.handle, self.rnn, WGRAD_ADD, _ptr(self.dev_lengths), self.xd,
               _ptr(x), self.hd, _ptr(hx), self.yd, _ptr(y), self.wsize, _ptr(dweights), ws, _ptr(self.work), rs,
               _ptr(self.reserve))

    def read_params(self, space) -> dict:
        """``{(pseudo, lin): (matrix, bias)}`` as host arrays, read from ``space`` (a CuPy uint8 buffer in this
        network's weight-space layout: the weights or their gradients) at cudnnGetRNNWeightParams' offsets."""
        st = np.dtype({"float16": np.float16, "float32": np.float32, "float64": np.float64}[self.dtype])
        base, out = _ptr(self.weights), {}
        for p in range(self.L * self.D):
            for lin in range(2 * GATES[self.mode]):
                parts = []
                for i, got in enumerate(self.weight_params(p, lin)):  # matrix [rows, cols], bias [rows]
                    if got is None:
                        parts.append(None)
                        continue
                    off, n = got[0] - base, int(np.prod(got[1])) * st.itemsize
                    parts.append(space[off:off + n].view(st).get().reshape(got[1][-2:] if i == 0 else (-1,)))
                out[(p, lin)] = tuple(parts)
        return out

    def destroy(self) -> None:
        for kind, p in reversed(self._own):
            L.call(f"cudnnDestroy{kind}Descriptor", p)
        self._own = []
        self.descs.destroy()
