"""Data and scalar arguments of legacy calls (docs/conventions.md "Scalars"
and "Data"; 002 "Scaling Parameters": alpha/beta are host
pointers to float, or to double when the data type is DOUBLE).

The rule that nothing a caller can type crashes the interpreter:

* scalars (alpha, beta, ...): Python numbers (int, float, bool, NumPy scalars) are always
  values; a host pointer is a ``ctypes`` pointer (``c_void_p``, ``POINTER(T)``, ``byref``), a
  ctypes array or a NumPy array of one element (``scalar``);
* data on the CPU place: NumPy arrays, objects with ``__array_interface__``, the buffer protocol
  or ``__dlpack__`` (torch / JAX CPU tensors; read and written in place, through the same
  memory), or ctypes pointers (raw, unchecked as in C); a plain int is BAD_PARAM;
* data on the GPU place: CuPy arrays, ``__cuda_array_interface__`` / DLPack objects, or a
  device pointer int;
* a descriptor, handle or any other object of this library where a buffer or a scalar goes
  is BAD_PARAM naming the argument (descriptors are ints: never an address);
* an array that carries a dtype must match the descriptor's data type or be a byte view
  (``ACCEPTED``); untyped buffers (workspace, reserve space, dropout states) take any dtype.

``bind(handle, data, tensor, argname)`` makes the buffer an engine reads or writes: a NumPy
view with the descriptor's dims and strides over the caller's memory on the CPU place, a
strided CuPy array over the device memory on the GPU place.  The caller's buffer must hold
the descriptor's whole extent (BAD_PARAM otherwise, which cuDNN itself cannot check).
``preflight`` makes the same checks for every buffer of a call that runs several graphs (or
writes outside ``_core.call.run``) before the first one runs, so a rejected call writes nothing.
"""
from __future__ import annotations

import ctypes
import numbers
import weakref

import numpy as np

from cudnn_compat._backend import dtypes
from .descriptor import Descriptor
from ..errors import bad_param

# The smallest address a raw pointer may hold: NULL and the first page are never valid
# memory, so a tiny or negative pointer is BAD_PARAM instead of a fault.
POINTER_MIN = 4096

# -- the dtype table ------------------------------------------------------------------------------

# IR dtype name (the descriptor's data type) -> (cudnnDataType_t name, array dtypes accepted).
# Every type also accepts uint8 (a byte view); ml_dtypes.bfloat16 arrays match BFLOAT16 by name.
_U8 = np.dtype(np.uint8)
ACCEPTED = {
    "float32": ("CUDNN_DATA_FLOAT", ("float32",)),
    "float64": ("CUDNN_DATA_DOUBLE", ("float64",)),
    "float16": ("CUDNN_DATA_HALF", ("float16",)),
    "bfloat16": ("CUDNN_DATA_BFLOAT16", ("uint16", "bfloat16")),
    "int8": ("CUDNN_DATA_INT8", ("int8",)),
    "uint8": ("CUDNN_DATA_UINT8", ()),
    "int32": ("CUDNN_DATA_INT32", ("int32",)),
    "int64": ("CUDNN_DATA_INT64", ("int64",)),
    "bool": ("CUDNN_DATA_BOOLEAN", ("bool",)),
    # the vectorized INT8 types (their descriptors are NOT_SUPPORTED by the graph layer today)
    "int8x4": ("CUDNN_DATA_INT8x4", ("int8", "int32")),
    "uint8x4": ("CUDNN_DATA_UINT8x4", ("int8", "int32")),
    "int8x32": ("CUDNN_DATA_INT8x32", ("int8", "int32")),
}


def _accept_set(name: str) -> frozenset:
    return frozenset([_U8] + [np.dtype(n) for n in ACCEPTED[name][1] if n != "bfloat16"])


_ACCEPT = {name: _accept_set(name) for name in ACCEPTED}
# buffers typed by something other than a tensor descriptor, by IR tensor name -> (type, dtypes):
# cudnnReduceTensor's indices are CUDNN_32BIT_INDICES (unsigned int in libcudnn, int32 in the IR)
ROLE_ACCEPTED = {"indices": ("CUDNN_32BIT_INDICES", ("int32", "uint32"))}
_ROLE_ACCEPT = {role: frozenset([_U8] + [np.dtype(n) for n in names]) for role, (_t, names) in ROLE_ACCEPTED.items()}


def dtype_ok(dt, name: str, role: str = "") -> bool:
    """True when an array of dtype ``dt`` may hold data of IR dtype ``name`` (the table), or of
    the buffer role ``role`` (ROLE_ACCEPTED)."""
    if role in _ROLE_ACCEPT:
        return dt in _ROLE_ACCEPT[role]
    return dt in _ACCEPT[name] or (dt.name == "bfloat16" and dt.itemsize == 2 and "bfloat16" in ACCEPTED[name][1])


def _dtype_error(argname: str, dt, name: str, role: str = ""):
    cname, extra = ROLE_ACCEPTED.get(role) or ACCEPTED[name]
    ok = ", ".join(dict.fromkeys(list(extra) + ["uint8 (a byte view)"]))
    return bad_param(argname, f"array dtype {dt} does not match the descriptor's data type {cname}"
                              f"{'' if role in ROLE_ACCEPTED else f' ({name})'}; accepted: {ok}")


# -- layouts --------------------------------------------------------------------------------------

def extent_bytes(tensor) -> int:
    """Bytes spanned by a tensor with non-negative strides (002 GetTensorSizeInBytes)."""
    span = 1 + sum((d - 1) * s for d, s in zip(tensor.dims, tensor.strides))
    return span * dtypes.itemsize(tensor.dtype)


# id(IR tensor) -> its layout: a side table (the Tensor is frozen), an entry leaving with its tensor
_LAYOUTS: dict = {}


def layout(tensor) -> tuple:
    """(storage dtype, bytes spanned, byte strides, accepted array dtypes) of an IR tensor,
    computed once per tensor object: plans keep their tensors, so a cached call pays a dict
    lookup (``_LAYOUTS.get(id(tensor))``) and one dtype identity (or set membership) test per buffer."""
    spec = _LAYOUTS.get(id(tensor))
    if spec is None:
        storage = dtypes.storage_dtype(tensor.dtype)
        spec = (storage, extent_bytes(tensor), tuple(s * storage.itemsize for s in tensor.strides),
                _ROLE_ACCEPT.get(tensor.name) or _ACCEPT[tensor.dtype])
        weakref.finalize(tensor, _LAYOUTS.pop, id(tensor), None).atexit = False
        _LAYOUTS[id(tensor)] = spec
    return spec


# -- which `void *` parameter is what -------------------------------------------------------------
# The signature table (_core/signatures.py) calls every `void *` parameter "pointer"; these say which
# are not data buffers (bound by ``bind`` / ``preflight`` / ``buffer_at`` with one set of forms and
# errors).  tests/test_data_params.py walks every pointer parameter of every registered function by
# this table.  Pointers to one number (002 "Scaling Parameters", fill values), read by ``scalar``:
SCALAR_PARAMS = frozenset({"alpha", "beta", "alpha1", "alpha2", "alphaDataDiff", "betaDataDiff", "alphaParamDiff",
                           "betaParamDiff", "alphaDgrid", "betaDgrid", "paddingFill", "valuePtr"})
# (function, C parameter) -> role, for the pointers that are neither scalars nor data buffers
OTHER_POINTERS = {
    **{(f, p): "host ints" for f, p in (  # host int arrays (tools/gen_signatures.py DATA_ARRAYS)
        ("cudnnCTCLoss", "hostLabels"), ("cudnnCTCLoss", "hostLabelLengths"), ("cudnnCTCLoss", "hostInputLengths"),
        ("cudnnCTCLoss_v8", "labels"), ("cudnnCTCLoss_v8", "labelLengths"), ("cudnnCTCLoss_v8", "inputLengths"),
        ("cudnnGetCTCLossWorkspaceSize", "labels"), ("cudnnGetCTCLossWorkspaceSize", "labelLengths"),
        ("cudnnGetCTCLossWorkspaceSize", "inputLengths"), ("cudnnMultiHeadAttnForward", "loWinIdx"),
        ("cudnnMultiHeadAttnForward", "hiWinIdx"), ("cudnnMultiHeadAttnBackwardData", "loWinIdx"),
        ("cudnnMultiHeadAttnBackwardData", "hiWinIdx"), ("cudnnSetSeqDataDescriptor", "seqLengthArray"))},
    ("cudnnSaveAlgorithm", "algoSpace"): "host bytes", ("cudnnRestoreAlgorithm", "algoSpace"): "host bytes",
    # typed by another argument: attributeType (VOID_PTR data pointers are bound at cudnnBackendExecute),
    # the fused-ops label (pointers bound at cudnnFusedOpsExecute, scalars read by ``scalar``)
    ("cudnnBackendSetAttribute", "arrayOfElements"): "typed", ("cudnnBackendGetAttribute", "arrayOfElements"): "typed",
    ("cudnnSetFusedOpsConstParamPackAttribute", "param"): "typed",
    ("cudnnGetFusedOpsConstParamPackAttribute", "param"): "typed",
    ("cudnnSetFusedOpsVariantParamPackAttribute", "ptr"): "typed",
    ("cudnnSetCallback", "udata"): "opaque",  # handed back to the caller's callback, never read
}


def pointer_role(c_name: str, c_param: str) -> str:
    """'scalar', 'data' (a buffer), or the OTHER_POINTERS role of a `void *` parameter."""
    if c_param in SCALAR_PARAMS:
        return "scalar"
    return OTHER_POINTERS.get((c_name, c_param), "data")


# -- what an argument is --------------------------------------------------------------------------

_CARG = type(ctypes.byref(ctypes.c_int()))  # what ctypes.byref() returns
_CT_POINTERS = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_wchar_p, ctypes._Pointer, _CARG)
_LIB_MODULES = frozenset({"cudnn_compat", "_backend"})


def library_object(value) -> bool:
    """True for descriptors, handles, plans, packs, ... (any object this library made)."""
    return isinstance(value, Descriptor) or type(value).__module__.partition(".")[0] in _LIB_MODULES


def _what(value) -> str:
    kind = getattr(value, "kind", None)
    return f"a {kind} ({value!r})" if isinstance(kind, str) else f"a {type(value).__module__}.{type(value).__name__}"


def _not_data(value, argname: str, expected: str):
    return bad_param(argname, f"is {_what(value)}, not {expected}")


def unread(handle, value, argname: str) -> None:
    """A data argument the call does not read (002 lets it go unread: x or y of an activation
    backward, divisive normalization's scratch temp/temp2, devSeqLengths on the CPU place): NULL
    passes (the callers apply their own NULL rule), anything else gets the checks of every buffer
    that need no descriptor, with the same errors (a plain int on the CPU place, a library object,
    a number, a list, device memory on the CPU place ...).  An array costs a type test or two."""
    t = type(value)
    if value is None or t is np.ndarray or (t is int and value == 0) or \
            (_CUPY_NDARRAY and t is _CUPY_NDARRAY[0] and handle.place != "cpu"):
        return
    if handle.place == "cpu":
        _host_source(value, argname)
    else:
        _device_source(value, argname, False)


def raw_address(value) -> "int | None":
    """The address a ctypes pointer (c_void_p, POINTER(T) instance, byref(), c_char_p) holds,
    0 for NULL; None for anything else."""
    if isinstance(value, ctypes.c_void_p):
        return value.value or 0
    if isinstance(value, _CT_POINTERS):
        return ctypes.cast(value, ctypes.c_void_p).value or 0
    param = getattr(type(value), "_as_parameter_", None)  # ctypes' protocol (NumPy's arr.ctypes)
    if param is not None and not isinstance(value, (np.ndarray, numbers.Number)) and not library_object(value):
        return raw_address(getattr(value, "_as_parameter_"))
    return None


def _checked_address(addr: int, argname: str, what: str = "host") -> int:
    if addr == 0:
        raise bad_param(argname, "is NULL")
    if addr < POINTER_MIN:  # rule: a pointer lies above the first page (tiny values fault)
        raise bad_param(argname, f"{addr} is not a {what} pointer (below {POINTER_MIN})")
    return addr


def _bf16_bits(data):
    """A torch bfloat16 tensor as an int16 tensor over the same memory (DLPack and the array
    interfaces have no bfloat16), else None; torch is never imported here."""
    torch = type(data).__module__.startswith("torch") and __import__("sys").modules.get("torch")
    if torch and getattr(data, "dtype", None) is torch.bfloat16 and hasattr(data, "view"):
        return data.view(torch.int16)
    return None


def _bf16_dtype() -> np.dtype:
    """ml_dtypes.bfloat16 where it is installed (messages then say bfloat16), else the uint16 bits."""
    try:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return np.dtype(np.uint16)


def _host_source(data, argname: str) -> "np.ndarray | int":
    """The caller's CPU-place buffer as a NumPy array over its memory, or the address a raw
    ctypes pointer holds.  BAD_PARAM for NULL, library objects, plain ints and non-buffers."""
    if isinstance(data, np.ndarray):
        return data
    if data is None:
        raise bad_param(argname, "is NULL")
    if library_object(data):
        raise _not_data(data, argname, "a data buffer")
    addr = raw_address(data)
    if addr is not None:
        return _checked_address(addr, argname)
    if isinstance(data, numbers.Integral) and not isinstance(data, bool):
        if data == 0:
            raise bad_param(argname, "is NULL")
        raise bad_param(argname, f"is the int {data}: on the CPU place a host pointer is passed as "
                                 f"ctypes.c_void_p(address), or pass the array itself")
    if isinstance(data, numbers.Number):
        raise bad_param(argname, f"is the number {data!r}, not a data buffer")
    if hasattr(data, "__cuda_array_interface__"):
        raise bad_param(argname, f"is device memory ({type(data).__name__}) but the handle is on the CPU place")
    try:
        if hasattr(data, "__array_interface__"):
            return np.asarray(data)
        if hasattr(data, "__dlpack__"):  # torch / JAX CPU tensors: a view of the same memory
            bits = _bf16_bits(data)  # torch bfloat16: DLPack cannot export it; its bits can
            return np.from_dlpack(data) if bits is None else np.from_dlpack(bits).view(_bf16_dtype())
        return np.asarray(memoryview(data))
    except Exception as e:  # noqa: BLE001 - anything that is not a readable buffer is a bad argument
        why = f" (DLPack export failed: {type(e).__name__}: {e})" if hasattr(data, "__dlpack__") else ""
        raise bad_param(argname, f"must be a NumPy array, an object with the buffer protocol, __array_interface__ "
                                 f"or __dlpack__, or a ctypes pointer on the CPU place, got {type(data).__name__}"
                                 f"{why}") from None


def _checked_bytes(arr: np.ndarray, name: "str | None", need: int, argname: str, written: bool,
                   role: str = "") -> np.ndarray:
    """The checks of an array argument, in message order; its bytes as a flat uint8 array.
    ``name`` None: an untyped buffer (any dtype)."""
    flags = arr.flags
    if not (flags.c_contiguous or flags.f_contiguous):
        raise bad_param(argname, "must be a contiguous buffer (legacy calls take a pointer, not a strided array)")
    dt = arr.dtype
    if dt.hasobject:  # rule: raw memory only (writing floats over object pointers crashes)
        raise bad_param(argname, f"holds Python objects (dtype {dt}), not raw memory")
    if written and not flags.writeable:
        raise bad_param(argname, "is a read-only array but the call writes it")
    if name is not None and not dtype_ok(dt, name, role):
        raise _dtype_error(argname, dt, name, role)
    if arr.nbytes < need:
        raise bad_param(argname, f"buffer holds {arr.nbytes} bytes but the descriptor spans {need}")
    return arr.reshape(-1, order="A").view(np.uint8)


def _raw_bytes(addr: int, need: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * max(int(need), 1)).from_address(addr))


# -- binding --------------------------------------------------------------------------------------

def _host_view(data, tensor, argname: str, written: bool = False) -> np.ndarray:
    storage, need, strides, _ = layout(tensor)
    src = _host_source(data, argname)
    if type(src) is int:
        raw = _raw_bytes(src, need)  # a raw pointer: unchecked, as in C
    else:
        raw = _checked_bytes(src, tensor.dtype, need, argname, written, tensor.name)
    return np.ndarray(tensor.dims, dtype=storage, buffer=raw, offset=0, strides=strides)


def host_view(data, tensor, argname: str, written: bool = False) -> np.ndarray:
    """``bind`` on the CPU place for the legacy call path: also BAD_PARAM for a read-only array
    the call writes (``written``), before anything is written.  The common case (a C-contiguous
    array of the descriptor's dtype, big enough) costs a type test, two flag reads, one dtype
    identity test and a size compare; an array that already has the view's dtype, shape and strides
    (an array shaped like its descriptor) is its own view (no new array object: 1 us a buffer)."""
    if type(data) is np.ndarray:
        flags = data.flags
        if flags.c_contiguous and (flags.writeable or not written):
            spec = _LAYOUTS.get(id(tensor)) or layout(tensor)
            dt = data.dtype
            if (dt is spec[0] or dt in spec[3]) and data.nbytes >= spec[1]:
                if dt is spec[0] and data.shape == tensor.dims and data.strides == spec[2]:
                    return data
                return np.ndarray(tensor.dims, dtype=spec[0], buffer=data, offset=0, strides=spec[2])
    return _host_view(data, tensor, argname, written)  # every check, with its message


def _cai_info(iface) -> tuple:
    """(pointer, dtype, nbytes, contiguous, read-only) of a __cuda_array_interface__ dict."""
    dt = np.dtype(iface["typestr"])
    shape = tuple(int(s) for s in iface["shape"])
    n = 1
    for s in shape:
        n *= s
    strides = iface.get("strides")
    contiguous = True
    if strides is not None and n > 1:
        c, f = [], []
        acc = dt.itemsize
        for s in reversed(shape):
            c.append(acc)
            acc *= s
        acc = dt.itemsize
        for s in shape:
            f.append(acc)
            acc *= s
        keep = [i for i, s in enumerate(shape) if s != 1]
        st = tuple(strides)
        contiguous = all(st[i] == c[::-1][i] for i in keep) or all(st[i] == f[i] for i in keep)
    ptr, readonly = iface["data"]
    return int(ptr or 0), dt, n * dt.itemsize, contiguous, bool(readonly)


def _device_source(data, argname: str, written: bool):
    """(pointer, dtype or None, nbytes or None, owner) of a GPU-place data argument, after the
    checks that need no descriptor."""
    import cupy
    if isinstance(data, cupy.ndarray):
        if not (data.flags.c_contiguous or data.flags.f_contiguous):
            raise bad_param(argname, "must be a contiguous buffer")
        return data.data.ptr, data.dtype, data.nbytes, data
    if data is None:
        raise bad_param(argname, "is NULL")
    if library_object(data):
        raise _not_data(data, argname, "a data buffer")
    if isinstance(data, numbers.Integral) and not isinstance(data, bool):
        return _checked_address(int(data), argname, "device"), None, None, None
    addr = raw_address(data)
    if addr is not None:
        return _checked_address(addr, argname, "device"), None, None, None
    bits = _bf16_bits(data)
    if bits is not None:  # a torch bfloat16 tensor: no array interface exports it; its bits as BFLOAT16 data
        ptr, _dt, nbytes, _owner = _device_source(bits, argname, written)
        return ptr, _bf16_dtype(), nbytes, bits
    if hasattr(data, "__cuda_array_interface__"):
        ptr, dt, nbytes, contiguous, readonly = _cai_info(data.__cuda_array_interface__)
        if not contiguous:
            raise bad_param(argname, "must be a contiguous buffer")
        if written and readonly:
            raise bad_param(argname, "is a read-only array but the call writes it")
        return _checked_address(ptr, argname, "device"), dt, nbytes, data
    if hasattr(data, "__dlpack__"):
        return _device_source(cupy.from_dlpack(data), argname, written)
    raise bad_param(argname, f"must be a CuPy array, a device pointer int or a CUDA array on the GPU place, "
                             f"got {type(data).__name__}")


def _device_view(data, tensor, argname: str, written: bool = False):
    import cupy
    storage, need, strides, _ = layout(tensor)
    ptr, dt, nbytes, owner = _device_source(data, argname, written)
    if dt is not None and not dtype_ok(dt, tensor.dtype, tensor.name):
        raise _dtype_error(argname, dt, tensor.dtype, tensor.name)
    if nbytes is not None and nbytes < need:
        raise bad_param(argname, f"buffer holds {nbytes} bytes but the descriptor spans {need}")
    mem = cupy.cuda.UnownedMemory(ptr, need, owner)
    return cupy.ndarray(tensor.dims, dtype=storage, memptr=cupy.cuda.MemoryPointer(mem, 0), strides=strides)


_CUPY_NDARRAY = []  # [cupy.ndarray] once CuPy is imported (device_pointer's fast path)
# workspace types _call.run passes on without a check (one set lookup): CuPy's ndarray joins
# once imported; ints are checked on the CPU place only (there they are BAD_PARAM)
WORKSPACE_TYPES = {np.ndarray, int}


def cupy_ndarray():
    """``cupy.ndarray`` where it has the _c_contiguous/_f_contiguous attributes the fast paths read
    (else a class nothing is an instance of); imports CuPy on first use."""
    if not _CUPY_NDARRAY:
        import cupy
        # CuPy's ndarray exposes its contiguity as the attributes _c_contiguous/_f_contiguous
        # (cheaper than .flags); a CuPy without them takes the general path (_device_view)
        fast = hasattr(cupy.ndarray, "_c_contiguous") and hasattr(cupy.ndarray, "_f_contiguous")
        _CUPY_NDARRAY.append(cupy.ndarray if fast else type("_NoFastPath", (), {}))
        WORKSPACE_TYPES.add(cupy.ndarray)
    return _CUPY_NDARRAY[0]


def device_pointer(data, tensor, argname: str, written: bool = False) -> int:
    """The device address of ``data`` after the checks ``bind`` makes, without building a CuPy
    array: for GPU plans that take raw pointers (``plan.raw_pointers``, the cudnn engine).
    A contiguous CuPy array costs a type test, two flag reads, a dtype identity test and a
    size compare."""
    if type(data) is int:
        if data < POINTER_MIN:  # rule: NULL, or no device address
            raise bad_param(argname, "is NULL" if data == 0 else f"{data} is not a device pointer")
        return data
    nd = _CUPY_NDARRAY[0] if _CUPY_NDARRAY else cupy_ndarray()
    if type(data) is nd:
        spec = _LAYOUTS.get(id(tensor)) or layout(tensor)
        dt = data.dtype
        if (data._c_contiguous or data._f_contiguous) and (dt is spec[0] or dt in spec[3]) and data.nbytes >= spec[1]:
            return data.data.ptr
    return _device_view(data, tensor, argname, written).data.ptr


def bind(handle, data, tensor, argname: str, written: bool = False):
    """The engine-side buffer for ``data`` described by IR ``tensor``."""
    if data is None:
        raise bad_param(argname, "is NULL")
    if handle.place == "cpu":
        return _host_view(data, tensor, argname, written)
    return _device_view(data, tensor, argname, written)


# -- untyped buffers and the checks of a multi-graph call -----------------------------------------

def _host_checked(data, name: "str | None", need: int, argname: str, written: bool):
    src = _host_source(data, argname)
    if type(src) is int:
        return _raw_bytes(src, need)  # raw pointers are unchecked, as in C
    raw = _checked_bytes(src, name, need, argname, written)
    return src if name is not None else raw


def _device_checked(data, name: "str | None", need: int, argname: str, written: bool, pointers: bool = False):
    import cupy
    if isinstance(data, np.ndarray):  # staged to the device by _call.run, graph by graph
        return _host_checked(data, name, need, argname, written)
    ptr, dt, nbytes, owner = _device_source(data, argname, written)
    if dt is not None and name is not None and not dtype_ok(dt, name):
        raise _dtype_error(argname, dt, name)
    if nbytes is not None and nbytes < need:
        raise bad_param(argname, f"buffer holds {nbytes} bytes but {need} are needed")
    if isinstance(owner, cupy.ndarray):
        if pointers:
            return ptr
        return owner if name is not None else owner.reshape(-1, order="A").view(cupy.uint8)
    return data if (owner is not None and name is not None) else ptr


def preflight(handle, items, pointers: bool = False) -> list:
    """Check every buffer of a call before any graph of it runs, so that a rejected call writes
    nothing (issue 13 item 5).  ``items``: (data, spec, argname, written) where ``spec`` is an IR
    tensor, or (IR dtype name, bytes needed) with a None dtype for untyped buffers (workspace,
    reserve space, dropout states); never a descriptor (descriptors change).  The checks are
    ``bind``'s: NULL, library objects, ints on the CPU place, contiguity, writability of written
    buffers, dtype, size.  Returns the
    buffers ready to be bound at byte offsets: NumPy arrays on the CPU place (a raw pointer
    becomes a byte array of the needed size, an untyped buffer a byte view), CuPy arrays or
    pointer ints on the GPU place (with ``pointers``: the address of a CuPy array, no view)."""
    gpu = handle.place != "cpu"
    if gpu and pointers:
        out = _pointers(items)
        if out is not None:
            return out
    out = []
    for data, spec, argname, written in items:
        if isinstance(spec, tuple):
            name, need = spec
        else:
            name, need = spec.dtype, layout(spec)[1]
        if gpu:
            out.append(_device_checked(data, name, int(need), argname, written, pointers))
        else:
            out.append(_host_checked(data, name, int(need), argname, written))
    return out


def _pointers(items) -> "list | None":
    """``preflight(..., pointers=True)``'s result on the GPU place when every buffer is in a common
    form: a contiguous CuPy array of an accepted dtype (any dtype for an untyped buffer) holding the
    bytes needed, or a device pointer int above POINTER_MIN; None for anything else (the general
    loop then checks each buffer and raises what it raises).  The same addresses, without a call
    per buffer."""
    nd = _CUPY_NDARRAY[0] if _CUPY_NDARRAY else cupy_ndarray()
    out = []
    for data, spec, _argname, _written in items:
        if type(data) is nd:
            name, need = spec if type(spec) is tuple else (spec.dtype, layout(spec)[1])
            if not (data._c_contiguous or data._f_contiguous) or data.nbytes < need \
                    or (name is not None and data.dtype not in _ACCEPT[name]):
                return None
            out.append(data.data.ptr)
        elif type(data) is int and data >= POINTER_MIN:
            out.append(data)
        else:
            return None
    return out


def buffer_at(handle, data, argname: str, need: int, offset: int, dims: tuple, dtype: str):
    """The block ``offset`` bytes into a caller's buffer (the weight-space queries: RNN weight
    params, attention weights), after ``preflight``'s checks of the buffer (untyped, ``need``
    bytes, the forms and errors of every data argument).  In the form the caller passed: a ctypes
    pointer gives a ``ctypes.c_void_p``, a device pointer int an int, an array (or any buffer
    object) a view of ``dims`` elements of ``dtype`` (an IR dtype name)."""
    checked, = preflight(handle, [(data, (None, int(need)), argname, False)])
    addr = raw_address(data)
    if addr is not None:
        return ctypes.c_void_p(addr + offset)
    if type(checked) is int:
        return checked + offset
    storage = dtypes.storage_dtype(dtype)
    n = storage.itemsize
    for d in dims:
        n *= int(d)
    return checked[offset:offset + n].view(storage).reshape(dims)


def workspace_arg(place: str, workspace, argname: str = "workSpace"):
    """An untyped workspace handed to an engine: NULL (None, 0) as is, else checked like data
    (library objects, CPU-place ints, non-buffers are BAD_PARAM); c_void_p becomes an int on
    the GPU place."""
    if workspace is None or (type(workspace) is int and workspace == 0) or raw_address(workspace) == 0:
        return None
    if place == "cpu":
        src = _host_source(workspace, argname)
        return src if type(src) is not int else ctypes.c_void_p(src)
    if type(workspace) is int or type(workspace) is np.ndarray:
        return workspace
    ptr, _dt, _n, owner = _device_source(workspace, argname, True)
    return owner if owner is not None else ptr


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_READER: list = []  # [read(addr, nbytes) -> bytes | None], chosen on first use


def _libc_fn(name, argtypes, restype):
    fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


def _vm_reader():
    """process_vm_readv on this process (Linux): EFAULT for unreadable memory; None if refused."""
    import os
    try:
        vm = _libc_fn("process_vm_readv", [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                                           ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong], ctypes.c_ssize_t)
    except (OSError, AttributeError):
        return None

    def read(addr, n):
        buf = ctypes.create_string_buffer(n)
        local, remote = _IOVec(ctypes.addressof(buf), n), _IOVec(addr, n)
        got = vm(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)  # this process (forks too)
        return buf.raw if got == n else None

    probe = ctypes.c_int64(0x5EED)
    return read if read(ctypes.addressof(probe), 8) == bytes(probe) else None  # seccomp may refuse it


def _pipe_reader():
    """write() of the memory into a pipe (EFAULT for an unreadable buffer), read back; a pipe per process."""
    import os
    import threading
    try:
        write = _libc_fn("write", [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t], ctypes.c_ssize_t)
    except (OSError, AttributeError):
        return None
    lock, pipes = threading.Lock(), {}

    def read(addr, n):
        out = []
        with lock:
            pipe = pipes.get(os.getpid()) or pipes.setdefault(os.getpid(), os.pipe())
            for off in range(0, n, 4096):
                k = min(4096, n - off)
                got = write(pipe[1], addr + off, k)
                if got != k:
                    if got > 0:
                        os.read(pipe[0], got)  # a partial copy before the fault: leave the pipe empty
                    return None
                out.append(os.read(pipe[0], k))
        return b"".join(out)
    return read


def _make_reader():
    """A reader of this process's memory that reports unreadable addresses instead of faulting;
    a plain read where neither way exists (no safe way on that platform)."""
    return _vm_reader() or _pipe_reader() or (lambda addr, n: ctypes.string_at(addr, n))


def read_host(addr: int, nbytes: int) -> "bytes | None":
    """``nbytes`` of host memory at ``addr``, or None when that memory is not readable: for the
    few host pointers the API still takes as ints (CuPy 13's arrays of descriptor handles and of
    labels), so that no int a caller types can fault the interpreter."""
    if addr < POINTER_MIN:
        return None
    if not _READER:
        _READER.append(_make_reader())
    return _READER[0](int(addr), int(nbytes)) if nbytes > 0 else b""


def host_bytes(data):
    """For ``_core.bound_graph.at`` (a buffer advanced by a byte offset): a ctypes pointer as
    ``c_void_p``, a contiguous buffer-protocol or ``__array_interface__`` object as a flat uint8
    NumPy view; anything else unchanged, for binding to reject with its message."""
    addr = raw_address(data)
    if addr is not None:
        return ctypes.c_void_p(addr) if addr else data
    if data is None or library_object(data) or isinstance(data, numbers.Number):
        return data
    try:
        src = _host_source(data, "data")
    except Exception:  # noqa: BLE001 - not a host buffer: binding reports it
        return data
    if type(src) is int or not (src.flags.c_contiguous or src.flags.f_contiguous) or src.dtype.hasobject:
        return data
    return src.reshape(-1, order="A").view(np.uint8)


# -- addresses ------------------------------------------------------------------------------------

def address(data) -> "int | None":
    """The address a data argument points at (None when it cannot be told)."""
    if _CUPY_NDARRAY and type(data) is _CUPY_NDARRAY[0]:  # a CuPy array: no __cuda_array_interface__ dict
        return data.data.ptr
    if isinstance(data, np.ndarray):
        return data.__array_interface__["data"][0]
    if isinstance(data, int) and not isinstance(data, bool):
        return None if isinstance(data, Descriptor) else int(data)
    addr = raw_address(data)
    if addr is not None:
        return addr
    iface = getattr(data, "__cuda_array_interface__", None) or getattr(data, "__array_interface__", None)
    if isinstance(iface, dict):
        return int(iface["data"][0])
    if hasattr(data, "__dlpack__") and not library_object(data):  # a host DLPack tensor (torch/JAX on the CPU)
        try:
            return int(np.from_dlpack(_bf16_bits(data) or data).__array_interface__["data"][0])
        except Exception:  # noqa: BLE001 - device memory, or not exportable: cannot be told
            return None
    return None


def same_buffer(a, b) -> bool:
    """True when two data arguments are the same pointer (the in-place rules of 002)."""
    if a is b:
        return a is not None
    if a is None or b is None:
        return False
    if _CUPY_NDARRAY and type(a) is type(b) is _CUPY_NDARRAY[0]:  # the steady path's common case
        return a.data.ptr == b.data.ptr
    pa = address(a)
    return pa is not None and pa == address(b)


def host_pointer(value):
    """CuPy 13's int-pointer convention (``cupy.cuda.cudnn``) turned into this API's: a plain int
    of POINTER_MIN or more (``np.array(1.0, np.float32).ctypes.data``) becomes
    ``ctypes.c_void_p``; smaller ints (``alpha=1, beta=0``) and everything else are returned
    unchanged (library objects stay what they are, so the legacy call rejects them)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and not isinstance(value, Descriptor) \
            and value >= POINTER_MIN:
        return ctypes.c_void_p(int(value))
    return value


host_scalar_pointer = host_pointer  # for alpha/beta of cupy.cuda.cudnn; host data ints on the CPU place too


# -- scalars --------------------------------------------------------------------------------------

def _number(value, argname: str) -> float:
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        raise bad_param(argname, f"{value!r} is not representable as a double") from None


# An integer of this magnitude where C takes a pointer to one number is a host address typed as
# an int (``a.ctypes.data``), never a sensible alpha, beta or fill value (issue 23 item 1).
HOST_ADDRESS_MIN = 2 ** 31


def host_address_int(value, argname: str, how: str = ""):
    """BAD_PARAM for an int that looks like a host address where a value goes: names the
    argument and says how a pointer is passed (``how`` overrides the ways listed)."""
    if not -2 ** 64 < value < 2 ** 64:  # beyond any address: too large for an int scaling value
        return bad_param(argname, f"is the int {value}, out of range for a value given as an int (|value| >= 2^31 "
                                  f"looks like a host address); pass a float")
    how = how or ("pass the number itself, a host pointer as ctypes.c_void_p(addr) or ctypes.byref(c_value), "
                  "or the 0-d array itself (a, not a.ctypes.data)")
    return bad_param(argname, f"is the int {value}, which looks like a host address, not a value "
                              f"(|value| >= 2^31); {how}")


def scalar(value, argname: str, double: bool = False) -> float:
    """alpha/beta and other host scalars: a Python number or NumPy scalar is the value; a NumPy
    (or ctypes) array of one element holds it; a ctypes pointer points to a float (a double when
    ``double``), read as C would.  BAD_PARAM for NULL, library objects, an int of magnitude
    2^31 or more (a host address typed as an int) and anything else."""
    t = type(value)
    if t is float:
        return value
    if t is int:
        if -HOST_ADDRESS_MIN < value < HOST_ADDRESS_MIN:  # the one compare a value costs
            return float(value)
        raise host_address_int(value, argname)
    if value is None:
        raise bad_param(argname, "is NULL")
    if isinstance(value, numbers.Real):  # bool, NumPy scalars, int subclasses
        if isinstance(value, Descriptor):  # descriptors and handles are ints: never a value, never an address
            raise _not_data(value, argname, "a scalar")
        if isinstance(value, numbers.Integral) and not -HOST_ADDRESS_MIN < value < HOST_ADDRESS_MIN:
            raise host_address_int(value, argname)
        return _number(value, argname)
    if isinstance(value, np.ndarray):
        if value.size == 1 and value.dtype.kind in "biuf":  # rule: a real number
            return _number(value.reshape(-1)[0], argname)
        raise bad_param(argname, f"must hold one real number, got an array of {value.size} {value.dtype}")
    addr = raw_address(value)
    if addr is not None:
        _checked_address(addr, argname)
        ctype = ctypes.c_double if double else ctypes.c_float
        return float(ctype.from_address(addr).value)
    if isinstance(value, ctypes._SimpleCData) and isinstance(value.value, (int, float)):
        return scalar(value.value, argname)  # c_float(2.0), c_double(...): the value it holds
    if isinstance(value, ctypes.Array):
        return scalar(np.asarray(memoryview(value)), argname, double)
    if library_object(value):
        raise _not_data(value, argname, "a scalar")
    raise bad_param(argname, f"must be a number, a NumPy scalar or one-element array, or a ctypes pointer "
                             f"to a {'double' if double else 'float'}, got {type(value).__name__}")
