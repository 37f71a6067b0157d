"""libcudnn 9 through ctypes: the loader, the backend-API prototypes, and the cuDNN 9
enum values the engine needs (000 "Graph API"; 002 ch. 9 for the descriptor model).

The values are cuDNN 9's (``cudnn_graph.h``), not the 8.2 ones in ``cudnn_compat.enums``:
cuDNN 9 renumbered nothing in the backend enums, but added many members (attribute
names up to 2400, HEUR_MODE_A = 3, new numerical notes, knob types, descriptor types).

Nothing here runs at import: ``load()`` finds the library (``cuda.pathfinder`` first,
then the ``nvidia.cudnn`` wheel directory, then the system loader) and raises
``CudnnUnavailable`` with a plain reason when it cannot.
"""
from __future__ import annotations

import ctypes
import os
import threading

# --------------------------------------------------------------------------- enums (cudnn_graph.h, 9.x)


def _seq(start: int, names: str) -> dict:
    return {n: start + i for i, n in enumerate(names.split())}


STATUS = {
    "SUCCESS": 0, "NOT_INITIALIZED": 1001, "SUBLIBRARY_VERSION_MISMATCH": 1002,
    "SERIALIZATION_VERSION_MISMATCH": 1003, "DEPRECATED": 1004, "LICENSE_ERROR": 1005,
    "RUNTIME_IN_PROGRESS": 1006, "RUNTIME_FP_OVERFLOW": 1007, "SUBLIBRARY_LOADING_FAILED": 1008,
    "BAD_PARAM": 2000, "INVALID_VALUE": 2001, "BAD_PARAM_NULL_POINTER": 2002,
    "BAD_PARAM_MISALIGNED_POINTER": 2003, "BAD_PARAM_NOT_FINALIZED": 2004, "BAD_PARAM_OUT_OF_BOUND": 2005,
    "BAD_PARAM_SIZE_INSUFFICIENT": 2006, "BAD_PARAM_STREAM_MISMATCH": 2007, "BAD_PARAM_SHAPE_MISMATCH": 2008,
    "BAD_PARAM_DUPLICATED_ENTRIES": 2009, "BAD_PARAM_ATTRIBUTE_TYPE": 2010,
    "BAD_PARAM_CUDA_GRAPH_MISMATCH": 2011, "BAD_PARAM_DESCRIPTOR_TYPE": 2012,
    "NOT_SUPPORTED": 3000, "NOT_SUPPORTED_GRAPH_PATTERN": 3001, "NOT_SUPPORTED_SHAPE": 3002,
    "NOT_SUPPORTED_DATA_TYPE": 3003, "NOT_SUPPORTED_LAYOUT": 3004,
    "NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER": 3005, "NOT_SUPPORTED_INCOMPATIBLE_CUDART": 3006,
    "NOT_SUPPORTED_ARCH_MISMATCH": 3007, "NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING": 3008,
    "NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE": 3009, "NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT": 3010,
    "NOT_SUPPORTED_PADDING": 3011, "NOT_SUPPORTED_BAD_LAUNCH_PARAM": 3012,
    "NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API": 3013,
    "INTERNAL_ERROR": 4000, "INTERNAL_ERROR_COMPILATION_FAILED": 4001, "INTERNAL_ERROR_UNEXPECTED_VALUE": 4002,
    "INTERNAL_ERROR_HOST_ALLOCATION_FAILED": 4003, "INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED": 4004,
    "INTERNAL_ERROR_BAD_LAUNCH_PARAM": 4005, "INTERNAL_ERROR_TEXTURE_CREATION_FAILED": 4006,
    "EXECUTION_FAILED": 5000, "EXECUTION_FAILED_CUDA_DRIVER": 5001, "EXECUTION_FAILED_CUBLAS": 5002,
    "EXECUTION_FAILED_CUDART": 5003, "EXECUTION_FAILED_CURAND": 5004,
}
STATUS_NAME = {v: "CUDNN_STATUS_" + k for k, v in STATUS.items()}

# cudnnDataType_t, keyed by the IR dtype names of _backend.dtypes
DATA_TYPE = {"float32": 0, "float64": 1, "float16": 2, "int8": 3, "int32": 4, "uint8": 6,
             "bfloat16": 9, "int64": 10, "bool": 11}
CONVOLUTION_MODE = {"CONVOLUTION": 0, "CROSS_CORRELATION": 1}
NAN_PROPAGATION = {"NOT_PROPAGATE": 0, "PROPAGATE": 1}

POINTWISE_MODE = {
    "ADD": 0, "MUL": 1, "MIN": 2, "MAX": 3, "SQRT": 4, "ADD_SQUARE": 5, "DIV": 6, "MOD": 7, "POW": 8, "SUB": 9,
    "ABS": 10, "CEIL": 11, "COS": 12, "EXP": 13, "FLOOR": 14, "LOG": 15, "NEG": 16, "RSQRT": 17, "SIN": 18,
    "TAN": 19, "ERF": 20, "IDENTITY": 21, "RECIPROCAL": 22, "ATAN2": 23,
    "RELU_FWD": 100, "TANH_FWD": 101, "SIGMOID_FWD": 102, "ELU_FWD": 103, "GELU_FWD": 104,
    "SOFTPLUS_FWD": 105, "SWISH_FWD": 106, "GELU_APPROX_TANH_FWD": 107,
    "RELU_BWD": 200, "TANH_BWD": 201, "SIGMOID_BWD": 202, "ELU_BWD": 203, "GELU_BWD": 204,
    "SOFTPLUS_BWD": 205, "SWISH_BWD": 206, "GELU_APPROX_TANH_BWD": 207,
    "CMP_EQ": 300, "CMP_NEQ": 301, "CMP_GT": 302, "CMP_GE": 303, "CMP_LT": 304, "CMP_LE": 305,
    "LOGICAL_AND": 400, "LOGICAL_OR": 401, "LOGICAL_NOT": 402, "GEN_INDEX": 501, "BINARY_SELECT": 601,
}

# cudnnBackendAttributeName_t: the names the engine uses, from the one table of names and values
from ...attribute_names import V9 as _V9, names as _attribute_names  # noqa: E402

ATTR: dict = _attribute_names(_V9)

# cudnnBackendAttributeType_t (consecutive from CUDNN_TYPE_HANDLE = 0)
TYPE = _seq(0, "HANDLE DATA_TYPE BOOLEAN INT64 FLOAT DOUBLE VOID_PTR CONVOLUTION_MODE HEUR_MODE KNOB_TYPE "
               "NAN_PROPOGATION NUMERICAL_NOTE LAYOUT_TYPE ATTRIB_NAME POINTWISE_MODE BACKEND_DESCRIPTOR "
               "GENSTATS_MODE BN_FINALIZE_STATS_MODE REDUCTION_OPERATOR_TYPE BEHAVIOR_NOTE "
               "TENSOR_REORDERING_MODE RESAMPLE_MODE PADDING_MODE INT32 CHAR SIGNAL_MODE FRACTION NORM_MODE "
               "NORM_FWD_PHASE RNG_DISTRIBUTION")

# cudnnBackendDescriptorType_t (consecutive from CUDNN_BACKEND_POINTWISE_DESCRIPTOR = 0)
DESC = _seq(0, "POINTWISE CONVOLUTION ENGINE ENGINECFG ENGINEHEUR EXECUTION_PLAN INTERMEDIATE_INFO KNOB_CHOICE "
               "KNOB_INFO LAYOUT_INFO OPERATION_CONVOLUTION_FORWARD OPERATION_CONVOLUTION_BACKWARD_FILTER "
               "OPERATION_CONVOLUTION_BACKWARD_DATA OPERATION_POINTWISE OPERATION_GEN_STATS OPERATIONGRAPH "
               "VARIANT_PACK TENSOR MATMUL OPERATION_MATMUL OPERATION_BN_FINALIZE_STATISTICS REDUCTION "
               "OPERATION_REDUCTION OPERATION_BN_BWD_WEIGHTS RESAMPLE OPERATION_RESAMPLE_FWD "
               "OPERATION_RESAMPLE_BWD OPERATION_CONCAT OPERATION_SIGNAL OPERATION_NORM_FORWARD "
               "OPERATION_NORM_BACKWARD OPERATION_RESHAPE RNG OPERATION_RNG KERNEL_CACHE "
               "OPERATION_PAGED_CACHE_LOAD")

NUMERICAL_NOTE = _seq(0, "TENSOR_CORE DOWN_CONVERT_INPUTS REDUCED_PRECISION_REDUCTION FFT NONDETERMINISTIC "
                         "WINOGRAD WINOGRAD_TILE_4x4 WINOGRAD_TILE_6x6 WINOGRAD_TILE_13x13 STRICT_NAN_PROP")
BEHAVIOR_NOTE = {"RUNTIME_COMPILATION": 0, "REQUIRES_FILTER_INT8x32_REORDER": 1,
                 "REQUIRES_BIAS_INT8x32_REORDER": 2, "SUPPORTS_CUDA_GRAPH_NATIVE_API": 3}
KNOB_TYPE = {
    "SPLIT_K": 0, "SWIZZLE": 1, "TILE_SIZE": 2, "USE_TEX": 3, "EDGE": 4, "KBLOCK": 5, "LDGA": 6, "LDGB": 7,
    "CHUNK_K": 8, "SPLIT_H": 9, "WINO_TILE": 10, "MULTIPLY": 11, "SPLIT_K_BUF": 12, "TILEK": 13, "STAGES": 14,
    "REDUCTION_MODE": 15, "CTA_SPLIT_K_MODE": 16, "SPLIT_K_SLC": 17, "IDX_MODE": 18, "SLICED": 19,
    "SPLIT_RS": 20, "SINGLEBUFFER": 21, "LDGC": 22, "SPECFILT": 23, "KERNEL_CFG": 24, "WORKSPACE": 25,
    "TILE_CGA": 26, "TILE_CGA_M": 27, "TILE_CGA_N": 28, "BLOCK_SIZE": 29, "OCCUPANCY": 30,
    "ARRAY_SIZE_PER_THREAD": 31, "NUM_C_PER_BLOCK": 32, "SPLIT_COLS": 33, "TILE_ROWS": 34, "TILE_COLS": 35,
    "LOAD_SIZE": 36,
}
KNOB_TYPE_COUNTS = 37
HEUR_MODE = {"INSTANT": 0, "B": 1, "FALLBACK": 2, "A": 3}
NORM_MODE = {"LAYER_NORM": 0, "INSTANCE_NORM": 1, "BATCH_NORM": 2, "GROUP_NORM": 3, "RMS_NORM": 4}
NORM_FWD_PHASE = {"INFERENCE": 0, "TRAINING": 1}

NOTE_NAME = {v: k for k, v in NUMERICAL_NOTE.items()}
BEHAVIOR_NAME = {v: k for k, v in BEHAVIOR_NOTE.items()}
KNOB_NAME = {v: k for k, v in KNOB_TYPE.items()}

# ctypes element type of each attribute type (enums are C ints)
_CTYPE = {TYPE["HANDLE"]: ctypes.c_void_p, TYPE["BOOLEAN"]: ctypes.c_bool, TYPE["INT64"]: ctypes.c_int64,
          TYPE["FLOAT"]: ctypes.c_float, TYPE["DOUBLE"]: ctypes.c_double, TYPE["VOID_PTR"]: ctypes.c_void_p,
          TYPE["BACKEND_DESCRIPTOR"]: ctypes.c_void_p, TYPE["INT32"]: ctypes.c_int32, TYPE["CHAR"]: ctypes.c_char}


def ctype_of(attr_type: int):
    return _CTYPE.get(attr_type, ctypes.c_int)


# --------------------------------------------------------------------------- errors


class CudnnUnavailable(Exception):
    """libcudnn 9 cannot be used here; the message says why."""


class CudnnStatusError(Exception):
    """A libcudnn call returned a status other than SUCCESS."""

    def __init__(self, func: str, status: int, detail: str = ""):
        self.func, self.status, self.detail = func, status, detail
        name = STATUS_NAME.get(status, f"status {status}")
        super().__init__(f"{func} returned {name}" + (f": {detail}" if detail else ""))


# --------------------------------------------------------------------------- loading

_vp, _i64, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
PROTOTYPES = {
    "cudnnGetVersion": (ctypes.c_size_t, []),
    "cudnnGetErrorString": (ctypes.c_char_p, [_int]),
    "cudnnGetLastErrorString": (None, [ctypes.c_char_p, ctypes.c_size_t]),
    "cudnnCreate": (_int, [ctypes.POINTER(_vp)]),
    "cudnnDestroy": (_int, [_vp]),
    "cudnnSetStream": (_int, [_vp, _vp]),
    "cudnnBackendCreateDescriptor": (_int, [_int, ctypes.POINTER(_vp)]),
    "cudnnBackendDestroyDescriptor": (_int, [_vp]),
    "cudnnBackendFinalize": (_int, [_vp]),
    "cudnnBackendSetAttribute": (_int, [_vp, _int, _int, _i64, _vp]),
    "cudnnBackendGetAttribute": (_int, [_vp, _int, _int, _i64, ctypes.POINTER(_i64), _vp]),
    "cudnnBackendExecute": (_int, [_vp, _vp, _vp]),
}

_lock = threading.Lock()
_state: dict = {}


def _candidates():
    """Paths to try, best first, with how each was found."""
    out = []
    try:
        from cuda import pathfinder  # cuda-pathfinder, shipped with cuda-bindings/cuda-python
        loaded = pathfinder.load_nvidia_dynamic_lib("cudnn")
        if getattr(loaded, "abs_path", None):
            out.append((loaded.abs_path, "cuda.pathfinder"))
    except Exception as e:  # not installed, or the library was not found
        out.append((None, f"cuda.pathfinder: {type(e).__name__}: {e}"))
    try:
        import nvidia.cudnn as _nv  # the nvidia-cudnn-cu12/cu13 wheel
        base = os.path.dirname(_nv.__file__) if getattr(_nv, "__file__", None) else list(_nv.__path__)[0]
        out.append((os.path.join(base, "lib", "libcudnn.so.9"), "nvidia.cudnn wheel"))
    except Exception as e:
        out.append((None, f"nvidia.cudnn: {type(e).__name__}"))
    out.append(("libcudnn.so.9", "system loader"))
    return out


def load():
    """The loaded ``ctypes.CDLL`` with prototypes set; raises CudnnUnavailable."""
    if "lib" in _state:
        return _state["lib"]
    if "error" in _state:
        raise CudnnUnavailable(_state["error"])
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        tried = []
        for path, how in _candidates():
            if path is None:
                tried.append(how)
                continue
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                tried.append(f"{how} ({path}): {e}")
                continue
            try:
                for name, (res, args) in PROTOTYPES.items():
                    fn = getattr(lib, name)
                    fn.restype, fn.argtypes = res, args
            except AttributeError as e:
                tried.append(f"{how} ({path}): missing symbol {e}")
                continue
            version = int(lib.cudnnGetVersion())
            if version < 90000:
                tried.append(f"{how} ({path}): libcudnn {version} is older than 9.0")
                continue
            _state.update(lib=lib, path=path, version=version, found_via=how)
            return lib
        _state["error"] = "libcudnn 9 not found: " + "; ".join(tried)
        raise CudnnUnavailable(_state["error"])


def info() -> dict:
    """{'path', 'version', 'found_via'} of the loaded library (loads it)."""
    load()
    return {k: _state[k] for k in ("path", "version", "found_via")}


def last_error() -> str:
    lib = load()
    buf = ctypes.create_string_buffer(1024)
    try:
        lib.cudnnGetLastErrorString(buf, 1024)
    except Exception:  # pragma: no cover - very old 9.0 builds
        return ""
    return buf.value.decode(errors="replace").strip()


def check(func: str, status: int) -> None:
    if status:
        raise CudnnStatusError(func, status, last_error())


# --------------------------------------------------------------------------- backend descriptors


class Descriptor:
    """One cudnnBackendDescriptor_t: create, set, finalize, get, destroy."""

    __slots__ = ("ptr", "kind", "_keep")

    def __init__(self, kind: str):
        lib = load()
        p = ctypes.c_void_p()
        check(f"cudnnBackendCreateDescriptor({kind})", lib.cudnnBackendCreateDescriptor(DESC[kind], ctypes.byref(p)))
        self.ptr, self.kind, self._keep = p.value, kind, []

    def set(self, attr: str, attr_type: str, values) -> "Descriptor":
        """Set ``attr`` to one value or a list; descriptors may be given as Descriptor objects."""
        if not isinstance(values, (list, tuple)):
            values = [values]
        t = TYPE[attr_type]
        ct = ctype_of(t)
        vals = [v.ptr if isinstance(v, Descriptor) else v for v in values]
        arr = (ct * max(len(vals), 1))(*vals)
        self._keep.append(arr)
        st = load().cudnnBackendSetAttribute(self.ptr, ATTR[attr], t, len(vals), ctypes.cast(arr, ctypes.c_void_p))
        check(f"cudnnBackendSetAttribute({self.kind}, {attr})", st)
        return self

    def finalize(self) -> "Descriptor":
        check(f"cudnnBackendFinalize({self.kind})", load().cudnnBackendFinalize(self.ptr))
        return self

    def get(self, attr: str, attr_type: str, count: int = 1) -> list:
        """Up to ``count`` values of a scalar-typed attribute."""
        t = TYPE[attr_type]
        arr = (ctype_of(t) * max(count, 1))()
        n = ctypes.c_int64(0)
        st = load().cudnnBackendGetAttribute(self.ptr, ATTR[attr], t, count, ctypes.byref(n),
                                             ctypes.cast(arr, ctypes.c_void_p))
        check(f"cudnnBackendGetAttribute({self.kind}, {attr})", st)
        return list(arr[: min(n.value, count)])

    def count(self, attr: str, attr_type: str) -> int:
        n = ctypes.c_int64(0)
        st = load().cudnnBackendGetAttribute(self.ptr, ATTR[attr], TYPE[attr_type], 0, ctypes.byref(n), None)
        check(f"cudnnBackendGetAttribute({self.kind}, {attr}, count)", st)
        return int(n.value)

    def all_descriptors(self, attr: str, kind: str, cap: int) -> list:
        """Every element of a descriptor-array attribute.  The element-count query (a
        GetAttribute with no array) is not reliable for every attribute: libcudnn 9.19 answers 0,
        with success, for ENGINECFG_KNOB_CHOICES and ENGINE_KNOB_INFO, which silently dropped the
        heuristics' knob choices (an SDPA bprop config with its defaults does not finalize, and a
        convolution config ran the engine's default tiling).  So a count of 0 (or a failed count)
        asks for ``cap`` elements, and cuDNN says how many it filled."""
        try:
            n = self.count(attr, "BACKEND_DESCRIPTOR")
        except CudnnStatusError:
            n = 0
        return self.get_descriptors(attr, kind, n if n > 0 else cap)

    def get_descriptors(self, attr: str, kind: str, count: int) -> list:
        """Descriptor-typed attribute: pre-created ``kind`` descriptors filled by cuDNN."""
        outs = [Descriptor(kind) for _ in range(max(count, 0))]
        if not outs:
            return []
        arr = (ctypes.c_void_p * len(outs))(*[d.ptr for d in outs])
        n = ctypes.c_int64(0)
        st = load().cudnnBackendGetAttribute(self.ptr, ATTR[attr], TYPE["BACKEND_DESCRIPTOR"], len(outs),
                                             ctypes.byref(n), ctypes.cast(arr, ctypes.c_void_p))
        if st:
            for d in outs:
                d.destroy()
            check(f"cudnnBackendGetAttribute({self.kind}, {attr})", st)
        for d in outs[n.value:]:
            d.destroy()
        return outs[: n.value]

    def destroy(self) -> None:
        if self.ptr:
            lib = _state.get("lib")
            if lib is not None:
                lib.cudnnBackendDestroyDescriptor(self.ptr)
            self.ptr = None
            self._keep = []


# --------------------------------------------------------------------------- native handles


_handles: dict = {}  # device id -> [handle ptr, stream ptr currently set]


def handle_for(device: int, stream_ptr: int = 0) -> int:
    """The native cudnnHandle_t kept for ``device``, bound to ``stream_ptr`` (cudnnSetStream
    only when the stream changes)."""
    h = _handles.get(device)
    if h is None:
        lib = load()
        import cupy
        with cupy.cuda.Device(device):
            p = ctypes.c_void_p()
            check("cudnnCreate", lib.cudnnCreate(ctypes.byref(p)))
        h = _handles[device] = [p.value, 0]
    if h[1] != stream_ptr:
        check("cudnnSetStream", load().cudnnSetStream(h[0], stream_ptr or None))
        h[1] = stream_ptr
    return h[0]
