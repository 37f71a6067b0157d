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

The module is built from the registry (``cudnn_compat._core.registry``) when it is imported: every
legacy function under its CuPy name, wrapped so that

* compute calls bind the current CuPy stream to a GPU handle first (CuPy 13 called
  ``cudnnSetStream(handle, current stream)`` before each one);
* CuPy's pointer ints become this library's conventions before the C-named function sees them:
  an alpha/beta-like host scalar (alpha, beta, alpha1/2, alphaDataDiff, ..., valuePtr) of
  POINTER_MIN or more becomes ``ctypes.c_void_p`` in any place, a data pointer int on a CPU-place
  handle too (the C-named API takes Python ints as values: docs/conventions.md);
* errors are this module's ``CuDNNError`` (a subclass of ``cudnn_compat.CuDNNError``, so both
  ``except`` clauses catch them) with CuPy's ``add_info``/``add_infos`` and pickling
  (``str(CuDNNError(3)) == 'cuDNN Error: CUDNN_STATUS_BAD_PARAM'`` as in CuPy 13).

Every name of CuPy 13.6.0's cudnn.pyx is here (tests/data/cupy13_cudnn_names.txt); ``c_spellings``
gives the top level of ``cudnn_compat`` the ``cudnn``-prefixed spellings of the versioned ones
(``cudnnSetFilter4dDescriptor_v4``, ``cudnnGetConvolutionForwardAlgorithm_v6``).

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
import re as _re

from .._core import data as _data
from .. import enums as _enums
from ..convolution.algos import CuDNNAlgoPerf
from .._core.data import POINTER_MIN as _POINTER_MIN
from .._core.registry import CUPY_NAMES as _CUPY_NAMES, LEGACY as _LEGACY
from .._core import registry as _registry
from ..errors import STATUS as _STATUS, CuDNNError as _BaseError
from .._core.descriptor import Descriptor as _Descriptor, _LIVE
from ..handle import COMPAT_VERSION as _COMPAT_VERSION, Handle as _Handle

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
    pickling; also a ``cudnn_compat.CuDNNError`` (``.status_name``, ``.function``, ``.argument``,
    ``.rule``).  ``str(CuDNNError(3))`` is CuPy 13's ``'cuDNN Error: CUDNN_STATUS_BAD_PARAM'``
    (``'cuDNN Error: ' + cudnnGetErrorString(status)``); our function, argument and rule follow
    when there are some, then the ``add_info`` lines.  Unlike CuPy 13's (pickled by status only),
    a pickled or deep-copied error keeps every field and its infos."""

    def __init__(self, status: int, argument: str = "", rule: str = "", function: str = ""):
        self._infos = []
        super().__init__(status, argument, rule, function)

    @classmethod
    def of(cls, e: _BaseError) -> "CuDNNError":
        if isinstance(e, cls):
            return e
        out = cls(e.status, e.argument, e.rule, e.function)
        out.__dict__.update({k: v for k, v in e.__dict__.items() if k not in out.__dict__})
        out.__traceback__ = e.__traceback__
        return out

    def _text(self) -> str:
        return "cuDNN Error: " + super()._text()

    def add_info(self, info):
        assert isinstance(info, str)
        self._infos.append(info)

    def add_infos(self, infos):
        assert isinstance(infos, list)
        self._infos.extend(infos)

    def __str__(self):
        return super().__str__() + "".join("\n  " + i for i in self._infos)


def check_status(status: int) -> None:
    """CuPy 13: raise ``CuDNNError(status)`` unless ``status`` is CUDNN_STATUS_SUCCESS."""
    if status != 0:
        raise CuDNNError(status)


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


# -- CuPy 13's pointer ints -> this library's conventions ---------------------------------------------
# CuPy 13 passed every void* as an int (``size_t alpha``: ``np.array(1.0).ctypes.data``).  The
# C-named API takes Python numbers as values and host pointers as ctypes pointers
# (docs/conventions.md), so before calling it an int of POINTER_MIN or more becomes
# ``ctypes.c_void_p`` (``_core.data.host_pointer``) where it is
#   * a host scalar (alpha, beta, alpha1/2, alphaDataDiff, ..., valuePtr), in any place;
#   * a data buffer on a CPU-place handle (x, y, workSpace, reserveSpace, ...; a GPU handle's
#     ints are device pointers and stay ints);
# smaller ints stay values (``alpha=1, beta=0``: no pointer lies in the first page).  Parameters
# the families read as host int arrays themselves (CTC labels, attention windows, algoSpace) and
# the pointer out-parameters handled by adapters below are left as they are.

_SCALAR_PARAM = _re.compile(r"(alpha|beta)(\d+|[A-Z]\w*)?|valuePtr")
_HOST_READ = frozenset({"hostLabels", "hostLabelLengths", "hostInputLengths", "labels", "labelLengths",
                        "inputLengths", "algoSpace", "loWinIdx", "hiWinIdx", "devSeqLengthsQO",
                        "devSeqLengthsKV", "devSeqLengthsDQDO", "devSeqLengthsDKDV", "devSeqLengths"})
_CONVERSIONS = getattr(_registry, "CONVERSIONS", {})  # C name -> {Python parameter: (C parameter, kind)}
_host_pointer = getattr(_data, "host_pointer", None) or (
    lambda v: _ctypes.c_void_p(int(v)) if _is_ptr(v) and not isinstance(v, _Descriptor) else v)


def _pointer_params(c_name: str, fn) -> "tuple | None":
    """(scalar positions, data positions, handle position) of ``fn``'s parameters, from the
    registry's C parameter kinds (``_core.registry.CONVERSIONS``); None when nothing converts."""
    try:
        params = list(_inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    names = [p.name for p in params]
    kinds = _CONVERSIONS.get(c_name) or {}

    def kind(p):
        return (kinds.get(p) or (None, None))[1]
    scalars = tuple(i for i, p in enumerate(names) if _SCALAR_PARAM.fullmatch(p) and kind(p) in ("pointer", None))
    handle = next((i for i, p in enumerate(names) if kind(p) == "handle" or p == "handle"), None)
    data = () if handle is None else tuple(
        i for i, p in enumerate(names) if kind(p) == "pointer" and i not in scalars and p not in _HOST_READ)
    if not scalars and not data:
        return None
    return scalars, data, handle, {names[i]: i for i in scalars + data}


def _on_cpu(handle) -> bool:
    h = handle if isinstance(handle, _Handle) else _LIVE.get(handle) if isinstance(handle, int) else None
    return isinstance(h, _Handle) and h.place == "cpu"


def _converter(plan):
    """``convert(args, kwargs)`` applying a ``_pointer_params`` plan."""
    scalars, data, handle, by_name = plan

    def convert(args, kwargs):
        n = len(args)
        cpu = None
        if data:
            h = args[handle] if handle < n else kwargs.get("handle")
            cpu = _on_cpu(h)
        if scalars or cpu:
            args = list(args)
            for i in scalars:
                if i < n and type(args[i]) is int:
                    args[i] = _host_pointer(args[i])
            if cpu:
                for i in data:
                    if i < n and type(args[i]) is int:
                        args[i] = _host_pointer(args[i])
        if kwargs:
            for k, i in by_name.items():
                if k in kwargs and type(kwargs[k]) is int and (i in scalars or cpu):
                    kwargs[k] = _host_pointer(kwargs[k])
        return args, kwargs
    return convert


def _wrap(fn, name: str, stream: "bool | None" = None, convert=None):
    """``fn`` raising this module's CuDNNError, binding the current stream to GPU handles first
    when it is a call on a handle (``stream`` overrides the signature rule), its pointer ints
    converted first by ``convert`` (see ``_converter``)."""
    if stream is None:
        stream = name not in _NO_STREAM and _takes_handle(fn)

    @_functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            if stream and args:
                _bind_current_stream(args[0])
            if convert is not None:
                args, kwargs = convert(args, kwargs)
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
    if isinstance(region, _ctypes.c_void_p):  # what a ctypes pointer (a CPU-place int, converted) gives back
        return region.value or 0
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


_FILL_CTYPES = {_DATA_TYPE["CUDNN_DATA_DOUBLE"]: _ctypes.c_double, _DATA_TYPE["CUDNN_DATA_FLOAT"]: _ctypes.c_float}


def _rnn_data_set(base):
    """setRNNDataDescriptor(desc, dataType, layout, maxSeqLength, batchSize, vectorSize,
    seqLengthArray, paddingFill): seqLengthArray a host pointer to batchSize C ints, paddingFill a
    host pointer to one value of dataType (half, float or double; 0 is NULL), as CuPy 13 passed
    them; the value is read here and passed as a number."""
    ints = _int_arrays({6: 4})(base)

    def fn(RNNDataDesc, dataType, layout, maxSeqLength, batchSize, vectorSize, seqLengthArray, paddingFill=0):
        if _is_ptr(paddingFill):
            if dataType == _DATA_TYPE["CUDNN_DATA_HALF"]:
                import numpy as np
                paddingFill = float(np.frombuffer((_ctypes.c_uint8 * 2).from_address(paddingFill), np.float16)[0])
            elif dataType in _FILL_CTYPES:
                paddingFill = float(_FILL_CTYPES[dataType].from_address(paddingFill).value)
            # another data type: passed on for the legacy call to reject it
        return ints(RNNDataDesc, dataType, layout, maxSeqLength, batchSize, vectorSize, seqLengthArray, paddingFill)
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
    from .. import fused_ops
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


def _fused_const_set(base):
    """setFusedOpsConstParamPackAttribute(constPack, label, param): for a value label ``param`` is a
    host pointer to the C int (CuPy 13 passed ``numpy.array(v).ctypes.data``); a descriptor label's
    ``param`` is the descriptor."""
    def fn(constPack, paramLabel, param):
        const_kind, _ = _fused_kinds()
        try:
            kind = const_kind(paramLabel)
        except Exception:  # noqa: BLE001 - an invalid label: let the legacy call reject it
            kind = "desc"
        if kind != "desc" and type(param) is int:
            param = _host_pointer(param)
        return base(constPack, paramLabel, param)
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
    "setRNNDataDescriptor": _rnn_data_set,
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
    "setFusedOpsConstParamPackAttribute": _fused_const_set,
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
    plan = _pointer_params(c_name, base)  # adapters keep the positions of the pointer arguments
    convert = _converter(plan) if plan else None
    if adapter is not None:
        adapted = adapter(base)
        adapted.__doc__ = f"CuPy 13 ``{name}`` over ``{c_name}``: {adapter.__doc__ or ''}".strip()
        fn = _wrap(adapted, name, stream=_takes_handle(base) and name not in _NO_STREAM, convert=convert)
    else:
        fn = _wrap(base, name, convert=convert)
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


# -- CuPy 13's names in C spelling, for the top level of cudnn_compat ----------------------------------

def c_spelling(name: str) -> str:
    """``addTensor_v3`` -> ``cudnnAddTensor_v3`` (the inverse of ``_core.registry.cupy_name``)."""
    return "cudnn" + name[0].upper() + name[1:]


def _c_not_supported(c_name: str, rule: str):
    def fn(*args, **kwargs):
        raise _BaseError(_STATUS["CUDNN_STATUS_NOT_SUPPORTED"], "", rule, c_name)
    fn.__name__ = fn.__qualname__ = c_name
    fn.__doc__ = f"{c_name}: CUDNN_STATUS_NOT_SUPPORTED, as in CuPy 13 (built on cuDNN 8). {rule}"
    return fn


# CuPy 13 names that never reach a legacy function (an adapter that always fails)
_NOT_SUPPORTED_NAMES = {"setConvolution2dDescriptor_v4"}


def c_spellings() -> dict:
    """Names ``cudnn_compat`` adds to its top level so that every CuPy 13 ``cupy.cuda.cudnn`` name is
    there with the ``cudnn`` prefix: the versioned names CuPy 13 mapped onto the current functions
    with ``#define`` in cupy_cudnn.h (``cudnnAddTensor_v3``, ``cudnnSetFilter4dDescriptor_v4``,
    ``cudnnActivationForward_v4``, ``cudnnFindConvolutionForwardAlgorithmEx_v7``,
    ``cudnnGetConvolutionForwardAlgorithm_v6`` -> the cuDNN 7 ``cudnnGetConvolutionForwardAlgorithm``,
    same argument order) and CuPy's own spellings (``cudnnGetDropoutReserveSpaceSize``), each the
    C-named legacy function itself (C conventions: sequences for int arrays, numbers for alpha/beta);
    ``cudnnSetConvolution2dDescriptor_v4`` is NOT_SUPPORTED as in CuPy 13 on cuDNN >= 7.  Also the
    module-level helpers and classes of CuPy 13 (``check_status``, ``get_build_version``,
    ``CuDNNAlgoPerf``) and its cuDNN v2 ``CUDNN_ADD_*`` constants, under their own names."""
    out = {}
    for name in list(_CUPY_NAMES) + list(_ALIASES):
        c_name, target = c_spelling(name), _target(name)
        if c_name in _LEGACY or target not in _LEGACY:
            continue
        if name in _NOT_SUPPORTED_NAMES:
            out[c_name] = _c_not_supported(c_name, f"{c_name} does not exist since cuDNN 7; use "
                                                   "cudnnSetConvolution2dDescriptor(..., mode, computeType)")
        else:
            out[c_name] = _LEGACY[target]
    out.update(check_status=check_status, get_build_version=get_build_version, CuDNNAlgoPerf=CuDNNAlgoPerf)
    out.update({k: v for k, v in globals().items() if k.startswith("CUDNN_ADD_")})
    return out


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
