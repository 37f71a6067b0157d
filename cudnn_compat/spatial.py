"""Spatial transformer (002 §3.2.15 cudnnCreateSpatialTransformerDescriptor, §3.2.30 Destroy,
§3.2.88 SetSpatialTransformerNdDescriptor, §3.2.97 cudnnSpatialTfGridGeneratorForward,
§4.1.20 GridGeneratorBackward, §3.2.98 SamplerForward, §4.1.21 SamplerBackward).

Coordinate convention (002 does not state it; seed_inventory §2.15): normalized coordinates
in [-1, 1], -1 and +1 being the centres of the first and last pixel, as the cuDNN-backed and
NumPy paths of Chainer agree (chainer/functions/array/spatial_transformer_grid.py builds the
grid from linspace(-1, 1, W) and linspace(-1, 1, H); spatial_transformer_sampler.py maps
x to column (x + 1) * (W - 1) / 2 and samples a zero-padded image; Chainer's tests hold the
cuDNN path to those NumPy formulas):

    grid[n, h, w] = theta[n] @ [x_w, y_h, 1],   x_w = -1 + 2 w / (W - 1),  y_h = -1 + 2 h / (H - 1)
    (x_w = -1 when W = 1, as linspace gives);  grid[..., 0] is x, grid[..., 1] is y.

Graphs: the grid generator is one Matmul of a constant base grid [1, H*W, 3] (rows
[x_w, y_h, 1]) with theta^T, a strided view of theta; its backward is dgrid^T @ base.  The
sampler is the composite SpatialTfSamplerForward/Backward op (bilinear, zero outside the
image; cudnn_compat/_backend/ops/ctc_sampler.py) followed by the output blend: y = alpha*sample + beta*y,
dx = alpha*dx_sample + beta*dx, dgrid = alphaDgrid*dgrid_sample + betaDgrid*dgrid, a beta
of 0 never reading the output.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from cudnn_compat._backend.ir import Operation
from ._core import bound_graph as bg
from ._core.call import compute_dtype
from ._core.data import scalar
from ._core.descriptor import Descriptor, resolve
from ._core.lifecycle import pair
from ._core.registry import CUPY_NAMES, legacy
from .ctc import on_place
from .enums import CONSTANTS, ENUMS, is_valid, name_of
from .errors import check, not_supported
from .handle import get_handle
from .tensor import DTYPE_NAME, tensor_desc

D = ENUMS["cudnnDataType_t"]
DTYPES = (D["CUDNN_DATA_FLOAT"], D["CUDNN_DATA_DOUBLE"], D["CUDNN_DATA_HALF"])


class SpatialTransformerDescriptor(Descriptor):
    """cudnnSpatialTransformerDescriptor_t: sampler type, data type and the output dims n, c, h, w."""

    kind = "cudnnSpatialTransformerDescriptor_t"

    def __init__(self):
        super().__init__()
        self.samplerType, self.dataType, self.dims = 0, D["CUDNN_DATA_FLOAT"], ()

    def _settings(self):
        return (self.samplerType, self.dataType, self.dims)

    @property
    def dtype(self) -> str:
        return DTYPE_NAME[self.dataType]


def st_desc(arg, argname: str = "stDesc") -> SpatialTransformerDescriptor:
    """The descriptor of a compute call; NOT_SUPPORTED unless it describes a 2-d transform."""
    d = resolve(arg, SpatialTransformerDescriptor, argname)
    if len(d.dims) != 4:
        raise not_supported(argname, f"only 2-d transformations (nbDims = 4: n, c, h, w) are supported, got nbDims {len(d.dims)}")
    if d.dataType not in DTYPES:
        raise not_supported(argname, f"data type {name_of('cudnnDataType_t', d.dataType)} is not supported (HALF, FLOAT, DOUBLE)")
    return d


createSpatialTransformerDescriptor, destroySpatialTransformerDescriptor = pair(SpatialTransformerDescriptor, __name__)


@legacy("cudnnSetSpatialTransformerNdDescriptor")
def setSpatialTransformerNdDescriptor(stDesc, samplerType, dataType, nbDims, dimA) -> None:
    """BAD_PARAM: NULL stDesc or dimA, an invalid samplerType or dataType enumerant, nbDims not in
    [1, CUDNN_DIM_MAX], a dim <= 0 (002 §3.2.88).  nbDims other than 4 is accepted here and is
    NOT_SUPPORTED in the compute calls, as 002 lists it."""
    d = resolve(stDesc, SpatialTransformerDescriptor, "stDesc", need_set=False)
    check(is_valid("cudnnSamplerType_t", samplerType), "samplerType", f"{samplerType!r} is not a cudnnSamplerType_t")
    check(is_valid("cudnnDataType_t", dataType), "dataType", f"{dataType!r} is not a cudnnDataType_t")
    check(dimA is not None and not bg.is_null(dimA), "dimA", "is NULL")
    check(isinstance(nbDims, (int, np.integer)) and 1 <= int(nbDims) <= CONSTANTS["CUDNN_DIM_MAX"], "nbDims",
          f"must be in [1, CUDNN_DIM_MAX={CONSTANTS['CUDNN_DIM_MAX']}], got {nbDims!r}")
    dims = [int(v) for v in np.asarray(dimA).reshape(-1)[:int(nbDims)]]
    check(len(dims) == int(nbDims), "dimA", f"must hold nbDims={nbDims} entries")
    check(all(v > 0 for v in dims), "dimA", f"every dim must be positive, got {dims}")
    d.samplerType, d.dataType, d.dims = int(samplerType), int(dataType), tuple(dims)
    d.touched()


# -- grid generator ---------------------------------------------------------------------------

@lru_cache(maxsize=64)
def base_grid(h: int, w: int, dtype: str) -> np.ndarray:
    """[1, H*W, 3] rows (x_w, y_h, 1), h-major, in the compute type."""
    xs = np.linspace(-1.0, 1.0, w) if w > 1 else np.array([-1.0])
    ys = np.linspace(-1.0, 1.0, h) if h > 1 else np.array([-1.0])
    base = np.stack(np.broadcast_arrays(xs[None, :], ys[:, None], 1.0), axis=-1).reshape(1, h * w, 3)
    arr = base.astype(np.float64 if dtype == "float64" else np.float32)
    arr.setflags(write=False)
    return arr


def _grid_call(handle, stDesc, src, src_name, dst, dst_name, forward: bool):
    h = get_handle(handle)
    d = st_desc(stDesc)
    check(not bg.is_null(src), src_name, "is NULL")
    check(not bg.is_null(dst), dst_name, "is NULL")
    n, _, hh, ww = d.dims
    ct = compute_dtype(d.dtype)

    def build():
        b = bg.GraphBuilder("SpatialTfGridGenerator" + ("Forward" if forward else "Backward"), ct)
        base = b.ext("base", 0, (1, hh * ww, 3), None, ct)
        if forward:  # grid [N, HW, 2] = base [1, HW, 3] @ theta^T [N, 3, 2]
            theta_t = b.ext("theta", 0, (n, 3, 2), (6, 1, 3), d.dtype)
            b.op("Matmul", {"a": base, "b": theta_t}, {"c": b.ext("grid", 0, (n, hh * ww, 2), None, d.dtype)})
        else:  # dtheta [N, 2, 3] = dgrid^T [N, 2, HW] @ base [1, HW, 3]
            dgrid_t = b.ext("dgrid", 0, (n, 2, hh * ww), (2 * hh * ww, 1, 2), d.dtype)
            b.op("Matmul", {"a": dgrid_t, "b": base}, {"c": b.ext("dtheta", 0, (n, 2, 3), None, d.dtype)})
        return b

    key = ("SpatialTfGridGenerator", forward, d.key())
    bound = bg.prepare(key, build)
    bg.execute(h, key, bound, {"base": on_place(h, base_grid(hh, ww, ct)), src_name: src, dst_name: dst})


@legacy("cudnnSpatialTfGridGeneratorForward")
def spatialTfGridGeneratorForward(handle, stDesc, theta, grid) -> None:
    """grid [n, h, w, 2] from theta [n, 2, 3] (002 §3.2.97); BAD_PARAM for NULL theta or grid,
    NOT_SUPPORTED unless stDesc is 4-d."""
    _grid_call(handle, stDesc, theta, "theta", grid, "grid", True)


@legacy("cudnnSpatialTfGridGeneratorBackward")
def spatialTfGridGeneratorBackward(handle, stDesc, dgrid, dtheta) -> None:
    """dtheta [n, 2, 3] = sum over h, w of dgrid[n, h, w]^T [x_w, y_h, 1] (002 §4.1.20)."""
    _grid_call(handle, stDesc, dgrid, "dgrid", dtheta, "dtheta", False)


# -- sampler ----------------------------------------------------------------------------------

def _blend(b, result, buf: str, desc_dims, strides, dtype, beta_zero: bool, alpha: str, beta: str) -> None:
    """buf = alpha*result (+ beta*buf): the 002 "Scaling Parameters" blend; beta 0 reads nothing."""
    out = b.ext(buf, 0, desc_dims, strides, dtype)
    ins = {"x": result, "alpha1": b.scalar(alpha)}
    if not beta_zero:
        ins["b"] = b.ext(buf, 0, desc_dims, strides, dtype, buf + "_prior")
        ins["alpha2"] = b.scalar(beta)
    b.ops.append(Operation("Pointwise", ins, {"y": out}, {"mode": "IDENTITY" if beta_zero else "ADD"}))


def _sampler_descs(d, xDesc, outDesc, out_name):
    xd, od = tensor_desc(xDesc, "xDesc"), tensor_desc(outDesc, out_name)
    n, c, hh, ww = d.dims
    check(xd.nbDims == 4 and xd.dims[:2] == (n, c), "xDesc", f"must be 4-d with n, c = {(n, c)} of stDesc, got {xd.dims}")
    check(od.dims == d.dims, out_name, f"dims {od.dims} must equal stDesc's {d.dims}")
    for name, t in (("xDesc", xd), (out_name, od)):
        check(t.dataType == d.dataType, name, f"data type {name_of('cudnnDataType_t', t.dataType)} must equal stDesc's")
    return xd, od


@legacy("cudnnSpatialTfSamplerForward")
def spatialTfSamplerForward(handle, stDesc, alpha, xDesc, x, grid, beta, yDesc, y) -> None:
    """y = alpha*bilinear(x, grid) + beta*y (002 §3.2.98).  BAD_PARAM: NULL x, y or grid, yDesc
    dims other than stDesc's, x's n, c or data types differing; NOT_SUPPORTED: stDesc not 4-d."""
    h = get_handle(handle)
    d = st_desc(stDesc)
    xd, yd = _sampler_descs(d, xDesc, yDesc, "yDesc")
    for name, v in (("x", x), ("grid", grid), ("y", y)):
        check(not bg.is_null(v), name, "is NULL")
    n, c, hh, ww = d.dims
    dbl = d.dtype == "float64"
    a, bt = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)
    ct = compute_dtype(d.dtype)

    def build():
        b = bg.GraphBuilder("SpatialTfSamplerForward", ct)
        res = b.virt(yd.dims)
        b.op("SpatialTfSamplerForward", {"x": b.ext("x", 0, xd.dims, xd.strides, xd.dtype),
                                         "grid": b.ext("grid", 0, (n, hh, ww, 2), None, d.dtype)}, {"y": res})
        _blend(b, res, "y", yd.dims, yd.strides, yd.dtype, bt == 0, "alpha", "beta")
        return b

    key = ("SpatialTfSamplerForward", d.key(), xd.key(), yd.key(), bt == 0)
    bound = bg.prepare(key, build)
    bg.execute(h, key, bound, {"x": x, "grid": grid, "y": y}, {"alpha": a, "beta": bt})


@legacy("cudnnSpatialTfSamplerBackward")
def spatialTfSamplerBackward(handle, stDesc, alpha, xDesc, x, beta, dxDesc, dx, alphaDgrid, dyDesc, dy, grid,
                             betaDgrid, dgrid) -> None:
    """dx = alpha*dx_sample + beta*dx and dgrid = alphaDgrid*dgrid_sample + betaDgrid*dgrid
    (002 §4.1.21).  BAD_PARAM: NULL x, dx, dy, grid or dgrid; dyDesc dims other than stDesc's;
    dxDesc other than xDesc's dims; data types differing.  NOT_SUPPORTED: stDesc not 4-d."""
    h = get_handle(handle)
    d = st_desc(stDesc)
    xd, dyd = _sampler_descs(d, xDesc, dyDesc, "dyDesc")
    dxd = tensor_desc(dxDesc, "dxDesc")
    check(dxd.dims == xd.dims, "dxDesc", f"dims {dxd.dims} must equal xDesc's {xd.dims}")
    check(dxd.dataType == d.dataType, "dxDesc", "data type must equal stDesc's")
    for name, v in (("x", x), ("dx", dx), ("dy", dy), ("grid", grid), ("dgrid", dgrid)):
        check(not bg.is_null(v), name, "is NULL")
    n, c, hh, ww = d.dims
    dbl = d.dtype == "float64"
    a, bt = scalar(alpha, "alpha", dbl), scalar(beta, "beta", dbl)
    ag, bg_ = scalar(alphaDgrid, "alphaDgrid", dbl), scalar(betaDgrid, "betaDgrid", dbl)
    ct = compute_dtype(d.dtype)
    gdims = (n, hh, ww, 2)

    def build():
        b = bg.GraphBuilder("SpatialTfSamplerBackward", ct)
        rx, rg = b.virt(xd.dims), b.virt(gdims)
        b.op("SpatialTfSamplerBackward", {"x": b.ext("x", 0, xd.dims, xd.strides, xd.dtype),
                                          "grid": b.ext("grid", 0, gdims, None, d.dtype),
                                          "dy": b.ext("dy", 0, dyd.dims, dyd.strides, dyd.dtype)},
             {"dx": rx, "dgrid": rg})
        _blend(b, rx, "dx", dxd.dims, dxd.strides, dxd.dtype, bt == 0, "alpha", "beta")
        _blend(b, rg, "dgrid", gdims, None, d.dtype, bg_ == 0, "alphaDgrid", "betaDgrid")
        return b

    key = ("SpatialTfSamplerBackward", d.key(), xd.key(), dxd.key(), dyd.key(), bt == 0, bg_ == 0)
    bound = bg.prepare(key, build)
    bg.execute(h, key, bound, {"x": x, "dx": dx, "dy": dy, "grid": grid, "dgrid": dgrid},
               {"alpha": a, "beta": bt, "alphaDgrid": ag, "betaDgrid": bg_})


# CuPy 13 spelled the setter without "Nd" (cupy/cuda/cudnn.pyx setSpatialTransformerDescriptor)
CUPY_NAMES["setSpatialTransformerDescriptor"] = "cudnnSetSpatialTransformerNdDescriptor"
