"""CuPy 13's low-level cuDNN module (``cupy.cuda.cudnn``, i.e. ``cupy_backends/cuda/libs/cudnn.pyx``)
on cudnn-compat: what ``install_cupy_shim()`` registers as ``cupy.cuda.cudnn`` and
``cupy_backends.cuda.libs.cudnn`` when CuPy 14 no longer has them.

The surface is CuPy 13's (built against cuDNN 8): the same function names and positional
argument order, int handles and descriptors, data and workspaces as pointer ints (device
pointers on the GPU place; host pointers, or NumPy arrays, on the CPU place), alpha/beta as
host pointer ints (``np.array(1, np.float32).ctypes.data``; plain numbers work too), int[]
arguments as host pointers to C ints (``<size_t>vector.data()`` in CuPy; sequences work too),
every ``CUDNN_*`` constant, ``CuDNNError(status)``, ``CuDNNAlgoPerf`` results, ``available``,
``getVersion()`` and ``get_build_version()`` (both 8907: the 8.x version old callers check).

The module is built from the registry (``cudnn_compat._registry``) when it is imported: every
legacy function under its CuPy name, wrapped so that

* compute calls bind the current CuPy stream to a GPU handle first (CuPy 13 called
  ``cudnnSetStream(handle, current stream)`` before each one);
* errors are this module's ``CuDNNError`` (a subclass of ``cudnn_compat.CuDNNError``, so both
  ``except`` clauses catch them) with CuPy's ``add_info``/``add_infos`` and pickling.

Where CuPy 13's Python signature differs from the C one, an adapter in ``_ADAPTERS`` below
translates (pointer arguments, out-parameters written through host pointers, the list-of-dicts
result of the non-Ex Find, ...), and ``_ALIASES`` adds the names CuPy spelled differently.
A family registered after this module was imported is still found (module ``__getattr__``).
"""
from __future__ import annotations

import ctypes as _ctypes
import functools as _functools
import inspect as _inspect
import numbers as _numbers

from . import enums as _enums
from ._conv_algos import CuDNNAlgoPerf
from ._data import POINTER_MIN as _POINTER_MIN
from ._registry import CUPY_NAMES as _CUPY_NAMES, LEGACY as _LEGACY
from .errors import STATUS as _STATUS, CuDNNError as _BaseError, getErrorString as _error_string
from ._descriptor import _LIVE
from .handle import COMPAT_VERSION as _COMPAT_VERSION, Handle as _Handle

available = True  # CuPy 13: False when libcudnn could not be loaded
_DATA_TYPE = _enums.ENUMS["cudnnDataType_t"]

# -- constants: every cuDNN enum value, the status codes, and CuPy 13's extras ----------------------
globals().update({k: v for k, v in vars(_enums).items() if k.startswith("CUDNN_") and isinstance(v, _numbers.Number)})
globals().update({k: v for _vals in _enums.ENUMS.values() for k, v in _vals.items() if k.startswith("CUDNN_")})
globals().update({k: v for k, v in getattr(_enums, "CONSTANTS", {}).items() if k.startswith("CUDNN_")})
globals().update(_STATUS)
# cudnnAddMode_t of cuDNN v2, still in CuPy 13's constant block
CUDNN_ADD_IMAGE = CUDNN_ADD_SAME_HW = 0
CUDNN_ADD_FEATURE_MAP = CUDNN_ADD_SAME_CHW = 1
CUDNN_ADD_SAME_C = 2
CUDNN_ADD_FULL_TENSOR = 3


class CuDNNError(_BaseError):
    """CuPy 13's ``CuDNNError``: a RuntimeError with ``.status``, ``add_info``/``add_infos`` and
    pickling by status; also a ``cudnn_compat.CuDNNError`` (``.status_name``, ``.function``,
    ``.argument``, ``.rule``).  ``str(e)`` starts with ``"cuDNN Error: CUDNN_STATUS_..."`` as CuPy's did."""

    def __init__(self, status: int, argument: str = "", rule: str = "", function: str = ""):
        super().__init__(status, argument, rule, function)
        self._infos = []

    @classmethod
    def of(cls, e: _BaseError) -> "CuDNNError":
        if isinstance(e, cls):
            return e
        out = cls(e.status, e.argument, e.rule, e.function)
        out.__traceback__ = e.__traceback__
        return out

    def add_info(self, info):
        assert isinstance(info, str)
        self._infos.append(info)

    def add_infos(self, infos):
        assert isinstance(infos, list)
        self._infos.extend(infos)

    def __str__(self):
        return "cuDNN Error: " + super().__str__() + "".join("\n  " + i for i in self._infos)

    def __reduce__(self):
        return (type(self), (self.status, self.argument, self.rule, self.function))


def check_status(status: int) -> None:
    if status != 0:
        raise CuDNNError(status, rule=_error_string(status))


def get_build_version() -> int:
    """CUDNN_VERSION of the header CuPy was built against; here the compat version (8907)."""
    return _COMPAT_VERSION


# -- wrapping -----------------------------------------------------------------------------------------

_NO_STREAM = frozenset({"setStream", "getStream", "destroy"})


def _bind_current_stream(handle) -> None:
    """CuPy 13's ``_setStream(handle)``: a GPU handle runs on the current CuPy stream."""
    h = handle if isinstance(handle, _Handle) else _LIVE.get(handle) if isinstance(handle, int) else None
    if isinstance(h, _Handle) and h.place == "gpu":
        import cupy
        s = cupy.cuda.get_current_stream()
        h.stream = s if s.ptr else None


def _takes_handle(fn) -> bool:
    try:
        params = list(_inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == "handle"


def _wrap(fn, name: str, stream: "bool | None" = None):
    """``fn`` raising this module's CuDNNError, binding the current stream to GPU handles first
    when it is a call on a handle (``stream`` overrides the signature rule)."""
    if stream is None:
        stream = name not in _NO_STREAM and _takes_handle(fn)

    @_functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            if stream and args:
                _bind_current_stream(args[0])
            return fn(*args, **kwargs)
        except CuDNNError:
            raise
        except _BaseError as e:
            raise CuDNNError.of(e) from None
    call.__name__ = call.__qualname__ = name
    call.__wrapped_c_name__ = getattr(fn, "c_name", name)
    return call


# -- helpers of the adapters --------------------------------------------------------------------------

_MAX_ARRAY = 1 << 24  # never read more ints than this through a pointer


def _is_ptr(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= _POINTER_MIN


def _count(v) -> "int | None":
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return n if 0 < n <= _MAX_ARRAY else None


def _ints_at(ptr, n):
    """``n`` C ints at host pointer ``ptr``; anything else (a sequence, NULL, a bad count) is passed
    through for the legacy function to accept or reject."""
    if _is_ptr(ptr) and n is not None:
        return tuple((_ctypes.c_int * n).from_address(ptr))
    return ptr


def _int_arrays(spec):
    """Adapter: arguments at the indices of ``spec`` (index -> index of their count argument) are
    host pointers to C int arrays, as CuPy 13 passed ``<size_t>vector.data()``."""
    def adapt(base):
        def fn(*args):
            args = list(args)
            for i, ni in spec.items():
                if i < len(args) and ni < len(args):
                    args[i] = _ints_at(args[i], _count(args[ni]))
            return base(*args)
        return fn
    return adapt


def _write(ptr, ctype, value) -> None:
    """Store an out-parameter through a host pointer (skipped for NULL)."""
    if _is_ptr(ptr):
        ctype.from_address(ptr).value = value


def _address(region) -> int:
    """The address of a sub-buffer the legacy call returned (a pointer int or an array view)."""
    if region is None:
        return 0
    if isinstance(region, int):
        return int(region)
    iface = getattr(region, "__cuda_array_interface__", None) or getattr(region, "__array_interface__", None)
    return int(iface["data"][0]) if iface else 0


def _lin_layer(base):
    """getRNNLinLayer{Matrix,Bias}Params(..., linLayerDesc, linLayerPtr): CuPy 13 passed a host pointer
    to a ``void*`` that receives the block's address (``<size_t>&ptr``); returns the address too."""
    def fn(handle, rnnDesc, layer, xDesc, wDesc, w, linLayerID, linLayerDesc, linLayerPtr=0):
        addr = _address(base(handle, rnnDesc, layer, xDesc, wDesc, w, linLayerID, linLayerDesc))
        _write(linLayerPtr, _ctypes.c_size_t, addr)
        return addr
    return fn


def _rnn_data_get(base):
    """getRNNDataDescriptor(desc, dataType*, layout*, maxSeqLength*, batchSize*, vectorSize*,
    arrayLengthRequested, seqLengthArray*, paddingFill*): every result through a host pointer."""
    def fn(RNNDataDesc, dataType, layout, maxSeqLength, batchSize, vectorSize, arrayLengthRequested,
           seqLengthArray, paddingFill):
        dt, lay, mx, bs, vs, lengths, fill = base(RNNDataDesc, arrayLengthRequested)
        for ptr, val in ((dataType, dt), (layout, lay), (maxSeqLength, mx), (batchSize, bs), (vectorSize, vs)):
            _write(ptr, _ctypes.c_int, int(val))
        if _is_ptr(seqLengthArray):
            arr = (_ctypes.c_int * len(lengths)).from_address(seqLengthArray)
            arr[:] = [int(v) for v in lengths]
        if _is_ptr(paddingFill) and fill is not None:
            if dt == _DATA_TYPE["CUDNN_DATA_HALF"]:
                import numpy as np
                (_ctypes.c_uint16).from_address(paddingFill).value = int(np.float16(fill).view(np.uint16))
            else:
                double = dt == _DATA_TYPE["CUDNN_DATA_DOUBLE"]
                _write(paddingFill, _ctypes.c_double if double else _ctypes.c_float, float(fill))
        return None
    return fn


def _filter_nd_get(base):
    """getFilterNdDescriptor(wDesc, nbDimsRequested) -> (dataType, format, nbDims, filterDimA) with
    filterDimA a tuple of nbDimsRequested ints (zeros past nbDims), as CuPy 13's vector was."""
    def fn(wDesc, nbDimsRequested):
        dt, fmt, nb, dims = base(wDesc, nbDimsRequested)
        n = max(int(nbDimsRequested), 0)
        dims = list(dims)[:n]
        return dt, fmt, nb, tuple(dims + [0] * (n - len(dims)))
    return fn


def _find_plain(base):
    """The non-Ex Find: CuPy 13 returned the perf structs converted by Cython, i.e. dicts with
    keys algo, status, time, memory."""
    def fn(*args):
        return [{"algo": p.algo, "status": p.status, "time": p.time, "memory": p.memory} for p in base(*args)]
    return fn


def _find_ex_v6(base):
    """FindEx without _v7: CuDNNAlgoPerf with determinism and mathType -1, as CuPy 13 filled them."""
    def fn(*args):
        return [CuDNNAlgoPerf(p.algo, p.status, p.time, p.memory, -1, -1) for p in base(*args)]
    return fn


def _not_supported(rule):
    def adapt(base):
        def fn(*args):
            raise CuDNNError(_STATUS["CUDNN_STATUS_NOT_SUPPORTED"], "", rule)
        return fn
    return adapt


def _fused_kinds():
    from . import fused_ops
    return fused_ops.const_kind, fused_ops.variant_kind


def _fused_const_get(base):
    """getFusedOpsConstParamPackAttribute(constPack, label, param) -> isNULL; an int label's value
    is written through ``param`` (a host pointer to int), a descriptor label's into the
    descriptor ``param``."""
    def fn(constPack, paramLabel, param):
        const_kind, _ = _fused_kinds()
        if const_kind(paramLabel) == "desc":
            return int(base(constPack, paramLabel, param)[1])
        value, is_null = base(constPack, paramLabel)
        _write(param, _ctypes.c_int, int(value or 0))
        return int(is_null)
    return fn


_SCALAR_CTYPES = {"size_t": _ctypes.c_size_t, "int64": _ctypes.c_int64, "double": _ctypes.c_double}


def _fused_variant_set(base):
    """setFusedOpsVariantParamPackAttribute(varPack, label, ptr): a scalar label's ``ptr`` is a host
    pointer to the size_t / int64_t / double (CuPy 13 passed ``<size_t>&scalar``)."""
    def fn(varPack, paramLabel, ptr):
        _, variant_kind = _fused_kinds()
        try:
            kind = variant_kind(paramLabel)
        except Exception:  # noqa: BLE001 - an invalid label: let the legacy call reject it
            kind = "ptr"
        if kind != "ptr" and _is_ptr(ptr):
            ptr = _SCALAR_CTYPES[kind].from_address(ptr).value
        return base(varPack, paramLabel, ptr)
    return fn


def _fused_variant_get(base):
    """getFusedOpsVariantParamPackAttribute(varPack, label, ptr): the value is written through the
    host pointer ``ptr`` (a void* for pointer labels); also returned."""
    def fn(varPack, paramLabel, ptr=0):
        _, variant_kind = _fused_kinds()
        value = base(varPack, paramLabel)
        kind = variant_kind(paramLabel)
        if kind == "ptr":
            value = _address(value)
        _write(ptr, _SCALAR_CTYPES.get(kind, _ctypes.c_size_t), value if kind == "double" else int(value or 0))
        return value
    return fn


# CuPy 13 name -> C name, where CuPy spelled it differently from the registry's derived name
_ALIASES = {
    "setFilter4dDescriptor_v4": "cudnnSetFilter4dDescriptor",
    "setFilterNdDescriptor_v4": "cudnnSetFilterNdDescriptor",
    "setSpatialTransformerDescriptor": "cudnnSetSpatialTransformerNdDescriptor",
    "getConvolutionForwardAlgorithm_v6": "cudnnGetConvolutionForwardAlgorithm",
    "getConvolutionBackwardFilterAlgorithm_v6": "cudnnGetConvolutionBackwardFilterAlgorithm",
    "getConvolutionBackwardDataAlgorithm_v6": "cudnnGetConvolutionBackwardDataAlgorithm",
    "setConvolution2dDescriptor_v4": "cudnnSetConvolution2dDescriptor",
    "getDropoutReserveSpaceSize": "cudnnDropoutGetReserveSpaceSize",
}

# CuPy 13 name -> adapter(base function) where its Python signature differs from the C mapping
_ADAPTERS = {
    "setTensorNdDescriptor": _int_arrays({3: 2, 4: 2}),
    "setTensorNdDescriptorEx": _int_arrays({4: 3}),
    "setFilterNdDescriptor_v4": _int_arrays({4: 3}),
    "setFilterNdDescriptor": _int_arrays({4: 3}),
    "getFilterNdDescriptor": _filter_nd_get,
    "setConvolutionNdDescriptor_v3": _int_arrays({2: 1, 3: 1, 4: 1}),
    "setConvolutionNdDescriptor": _int_arrays({2: 1, 3: 1, 4: 1}),
    "setPoolingNdDescriptor_v4": _int_arrays({4: 3, 5: 3, 6: 3}),
    "setPoolingNdDescriptor": _int_arrays({4: 3, 5: 3, 6: 3}),
    "setSpatialTransformerDescriptor": _int_arrays({4: 3}),
    "setSpatialTransformerNdDescriptor": _int_arrays({4: 3}),
    "setRNNDataDescriptor": _int_arrays({6: 4}),
    "getRNNDataDescriptor": _rnn_data_get,
    "getRNNLinLayerMatrixParams": _lin_layer,
    "getRNNLinLayerBiasParams": _lin_layer,
    "findConvolutionForwardAlgorithm": _find_plain,
    "findConvolutionBackwardDataAlgorithm": _find_plain,
    "findConvolutionBackwardFilterAlgorithm": _find_plain,
    "findConvolutionForwardAlgorithmEx": _find_ex_v6,
    "findConvolutionBackwardDataAlgorithmEx": _find_ex_v6,
    "findConvolutionBackwardFilterAlgorithmEx": _find_ex_v6,
    # cuDNN >= 7 has no v4 2-d convolution setter; CuPy 13's stub returned NOT_SUPPORTED
    "setConvolution2dDescriptor_v4": _not_supported(
        "cudnnSetConvolution2dDescriptor_v4 does not exist since cuDNN 7 (CuPy 13 returned NOT_SUPPORTED); "
        "use setConvolution2dDescriptor_v5(..., mode, computeType)"),
    "getFusedOpsConstParamPackAttribute": _fused_const_get,
    "setFusedOpsVariantParamPackAttribute": _fused_variant_set,
    "getFusedOpsVariantParamPackAttribute": _fused_variant_get,
}

_EXPORTED: dict = {}


def _target(name: str) -> "str | None":
    return _CUPY_NAMES.get(name) or _ALIASES.get(name)


def _make(name: str):
    c_name = _target(name)
    base = _LEGACY.get(c_name) if c_name else None
    if base is None:
        return None
    adapter = _ADAPTERS.get(name)
    if adapter is not None:
        adapted = adapter(base)
        adapted.__doc__ = f"CuPy 13 ``{name}`` over ``{c_name}``: {adapter.__doc__ or ''}".strip()
        fn = _wrap(adapted, name, stream=_takes_handle(base) and name not in _NO_STREAM)
    else:
        fn = _wrap(base, name)
    fn.__module__ = __name__
    return fn


def refresh() -> list:
    """Wrap every legacy function registered so far (both the registry's CuPy names and the
    aliases); returns the names added by this call."""
    added = []
    for name in list(_CUPY_NAMES) + list(_ALIASES):
        if name in _EXPORTED:
            continue
        fn = _make(name)
        if fn is not None:
            _EXPORTED[name] = fn
            globals()[name] = fn
            added.append(name)
    return added


def __getattr__(name: str):
    """A function whose family registered after this module was built."""
    if not name.startswith("_") and _target(name):
        refresh()
        if name in _EXPORTED:
            return _EXPORTED[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    refresh()
    return sorted(globals())


refresh()
