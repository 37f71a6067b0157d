"""One implementation, two spellings: every legacy function is registered under its C
name (``cudnnConvolutionForward``) and CuPy 13's ``cupy.cuda.cudnn`` name
(``convolutionForward``).  The wrapper converts the arguments to their C types, turns
graph-layer errors into CuDNNError and names the function in every error message.

Argument conversion (issue 13 items 3 and 4).  ``_core.signatures.SIGNATURES`` (generated from the
cuDNN headers by tools/gen_signatures.py) gives each function's C parameters and their kinds;
at decoration time every Python parameter is matched to its C parameter (by name, case
ignored, or through ``PARAM_ALIASES``) and gets the converter of its kind.  A call then
converts only its number and int-array arguments, before any hook or the function sees them:

=================== ==============================================================================
kind                accepted (normalised to a plain Python int / float / list of ints)
=================== ==============================================================================
int, int64, uint32, Python ints and bools, NumPy integers and 0-d integer arrays, and integral floats
uint64, size_t      (``2.0``: CuPy 13, built with Cython 3.0, accepted them too); in the C type's
                    range (int: int32, size_t/uint64: 0..2**64-1, uint32: 0..2**32-1).
enum:<type>         ints, NumPy integers, 0-d integer arrays, int32 range.  Not bool, not float
                    (an enum is a named constant; ``dataType=0.9`` was silently FLOAT).  Whether
                    the value is a member stays the function's check (BAD_PARAM or NOT_SUPPORTED
                    as 002 says).
double, float       real numbers (ints, floats, NumPy reals, 0-d real arrays); float: finite
                    values must fit a C float.  Not str/None/complex.
int[], uint32[]     a sequence or NumPy array of integral values, each in the element's range;
                    None or 0 (NULL) pass through for the function's own NULL rule, a ctypes
                    pointer as its address (read as in C).  A plain int is a number, never a host
                    pointer here (that is the cupy.cuda.cudnn convention, which its adapters keep).
stream              None, a non-negative int, or a stream object (``.ptr``); not str/float.
handle, desc:*,     untouched: ``_core.descriptor.resolve`` and ``_core.data`` own those rules.
desc[]:*, pointer,
opaque, out
=================== ==============================================================================

Anything else is BAD_PARAM naming the argument and the rule.  Safety net: a TypeError,
ValueError, OverflowError, IndexError or KeyError that still escapes a legacy function is our
bug, reported as CUDNN_STATUS_INTERNAL_ERROR naming the function, with the original chained.
A call that does not fit the Python signature (an unknown keyword, too many or too few
arguments) is ``CuDNNArgumentError``: BAD_PARAM and a TypeError, naming the keyword or the count
and showing the signature (``call_mismatch``; bound only once the call has failed).
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
import operator

import numpy as np

from cudnn_compat._backend.ir import GraphError
from .descriptor import Descriptor
from .signatures import SIGNATURES
from ..errors import STATUS, CuDNNArgumentError, CuDNNError, bad_param

LEGACY: dict = {}  # C name -> function
CUPY_NAMES: dict = {}  # CuPy name -> C name
CONVERSIONS: dict = {}  # C name -> {Python parameter: (C parameter, kind)}, for tests and docs

_INTERNAL_ERROR = STATUS["CUDNN_STATUS_INTERNAL_ERROR"]
_BARE = (TypeError, ValueError, OverflowError, IndexError, KeyError)

# Python parameter names that differ from the header's (matched by name otherwise, case ignored).
PARAM_ALIASES = {
    "cudnnAddTensor": {"A_data": "A", "C_data": "C"},
    "cudnnBatchNormalizationBackward": {"bnScaleBiasDiffDesc": "dBnScaleBiasDesc", "resultBnScaleDiff": "dBnScaleResult",
                                        "resultBnBiasDiff": "dBnBiasResult"},
    "cudnnBatchNormalizationForwardTrainingEx": {"bnScaleData": "bnScale", "bnBiasData": "bnBias",
                                                 "resultRunningMeanData": "resultRunningMean",
                                                 "resultRunningVarianceData": "resultRunningVariance",
                                                 "saveMean": "resultSaveMean", "saveInvVariance": "resultSaveInvVariance"},
    "cudnnDestroyAlgorithmDescriptor": {"algorithmDesc": "algoDesc"},
    "cudnnSetAlgorithmDescriptor": {"algorithmDesc": "algoDesc"},
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": {"dy": "y"},  # the header's name for dy
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": {"dwDesc": "gradDesc"},
    "cudnnGetPooling2dForwardOutputDim": {"inputDesc": "inputTensorDesc"},
    "cudnnGetPoolingNdForwardOutputDim": {"inputDesc": "inputTensorDesc"},
    "cudnnGetRNNTempSpaceSizes": {"fMode": "fwdMode"},
    "cudnnIm2Col": {"srcDesc": "xDesc", "srcData": "x", "filterDesc": "wDesc"},
    "cudnnSetRNNDescriptor_v6": {"mode": "cellMode"},
    "cudnnSoftmaxForward": {"algorithm": "algo"},
    "cudnnSoftmaxBackward": {"algorithm": "algo"},
    "cudnnSetStream": {"stream": "streamId"},
}

# Python parameters with no C counterpart in the header the table was generated from: the kind
# to convert them as (None: the function validates them itself), and why.
PYTHON_ONLY = {
    ("cudnnCreate", "place"): (None, "extension: 'cpu' or 'gpu', checked by cudnnCreate"),
    ("cudnnBackendInitialize", "descriptorType"): ("enum:cudnnBackendDescriptorType_t", "cuDNN 8.x's 3-argument form"),
    ("cudnnBackendInitialize", "sizeInBytes"): ("size_t", "cuDNN 8.x's 3-argument form"),
}

# Registered functions that get no per-parameter conversion, and why (the safety net still applies).
NO_CONVERSION = {
    "cudnnSetRNNDescriptor": "takes *args (8 or 10) and calls the cudnnSetRNNDescriptor_v5/_v6 wrappers, which convert",
}

# (C type name in messages, lo, hi) of the integer kinds
INT_KINDS = {
    "int": ("int", -2 ** 31, 2 ** 31 - 1),
    "int64": ("int64_t", -2 ** 63, 2 ** 63 - 1),
    "uint32": ("uint32_t", 0, 2 ** 32 - 1),
    "uint64": ("unsigned long long", 0, 2 ** 64 - 1),
    "size_t": ("size_t", 0, 2 ** 64 - 1),
}
ENUM_RANGE = (-2 ** 31, 2 ** 31 - 1)
FLT_MAX = float(np.finfo(np.float32).max)
PASS_KINDS = ("handle", "desc:", "desc[]:", "pointer", "opaque", "out")


def cupy_name(c_name: str) -> str:
    base = c_name[len("cudnn"):]
    return base[0].lower() + base[1:]


def graph_error(e: GraphError, function: str = "") -> CuDNNError:
    return CuDNNError(STATUS["CUDNN_STATUS_" + e.status], f"graph check {e.check}", str(e), function)


# -- converters: conv(value, argname) -> normalised value, or raise BAD_PARAM ------------------------

def _describe(v) -> str:
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _is_library_object(v) -> bool:
    return isinstance(v, Descriptor)


def _bound(x: int) -> str:
    """2**31 - 1 as '2^31-1', -2**31 as '-2^31', else the number."""
    for e in (31, 32, 63, 64):
        for v, text in ((2 ** e - 1, f"2^{e}-1"), (-2 ** e, f"-2^{e}")):
            if x == v:
                return text
    return str(x)


def _as_int(v, name: str, ctype: str, lo: int, hi: int, enum: "str | None" = None, elem: str = "") -> int:
    """``v`` as a Python int in [lo, hi]; the rules of the table above.  ``elem``: 'element i: '
    when ``v`` is an entry of the int array ``name``."""
    t = type(v)
    if t is int or t in _NP_INTS or (t is not bool and isinstance(v, (int, np.integer)) and not isinstance(v, Descriptor)):
        v = int(v)
    elif isinstance(v, (bool, np.bool_)) and not enum:
        v = int(v)
    elif isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "biuf":
        return _as_int(v[()], name, ctype, lo, hi, enum, elem)
    elif isinstance(v, (float, np.floating)) and not enum and math.isfinite(v) and float(v).is_integer():
        v = int(v)
    elif hasattr(type(v), "__index__") and not isinstance(v, (bool, np.bool_, Descriptor, float, np.floating, np.ndarray)):
        try:  # an object that says it is an integer
            v = operator.index(v)
        except Exception as e:  # noqa: BLE001 - its __index__ failed: not an integer
            raise bad_param(name, f"{_int_rule(ctype, enum, elem)}; __index__ of {type(v).__name__} raised "
                                  f"{type(e).__name__}") from None
    else:
        raise bad_param(name, f"{_int_rule(ctype, enum, elem)}, got {_int_got(v, enum)}")
    if not lo <= v <= hi:
        raise bad_param(name, f"{elem}{v} is out of range for {('a ' + enum) if enum else 'a C ' + ctype} "
                              f"[{_bound(lo)}, {_bound(hi)}]")
    return v


_NP_INTS = frozenset({np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64})


def _int_rule(ctype: str, enum, elem: str) -> str:
    return f"{elem}must be {f'a {enum} value (an int)' if enum else f'an integer (C {ctype})'}"


def _int_got(v, enum=None) -> str:
    if isinstance(v, Descriptor):
        return f"{v.kind} {int(v):#x}"
    if not enum and isinstance(v, (float, np.floating)) and math.isfinite(v) and not float(v).is_integer():
        return f"{v!r}, which has a fractional part"
    return _describe(v)


def _as_real(v, name: str, single: bool) -> float:
    what = f"must be a number (a real, C {'float' if single else 'double'})"
    t = type(v)
    if t is not float:
        if isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "biuf":
            v = v[()]
        if v is None or isinstance(v, (str, bytes, complex, np.complexfloating)) or \
                not isinstance(v, (numbers.Real, np.number, np.bool_)):
            raise bad_param(name, f"{what}, got {_describe(v)}")
        if _is_library_object(v):
            raise bad_param(name, f"{what}, got {v.kind} {int(v):#x}")
        try:
            v = float(v)
        except (OverflowError, ValueError, TypeError):
            raise bad_param(name, f"{what}; {v} does not fit one") from None
    if single and math.isfinite(v) and abs(v) > FLT_MAX:
        raise bad_param(name, f"{v!r} is out of range for a C float (|v| <= {FLT_MAX:.6g})")
    return v


def _as_int_array(v, name: str, ctype: str, lo: int, hi: int):
    """A const int array: a list of Python ints.  None / 0 (NULL) pass through for the function's
    NULL rule, a ctypes pointer as its address (read by the function, unchecked as in C)."""
    if v is None or (type(v) is int and v == 0):
        return v
    if isinstance(v, np.ndarray):
        if v.ndim == 0:
            raise bad_param(name, f"must be an array of {ctype} values, got a 0-d array")
        flat = v.reshape(-1)
        if flat.dtype.kind in "iu" and flat.size:
            low, high = int(flat.min()), int(flat.max())
            if low < lo or high > hi:
                i = int(np.argmax(flat == (low if low < lo else high)))
                raise bad_param(name, f"element {i}: {flat[i]} is out of range for a C {ctype} "
                                      f"[{_bound(lo)}, {_bound(hi)}]")
            return flat.tolist()
        items = flat.tolist() if flat.dtype.kind != "O" else list(flat)
    else:
        from .data import raw_address
        addr = raw_address(v)
        if addr is not None:
            return addr or None
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and not _is_library_object(v):
            raise bad_param(name, f"is the int {v}: an int array is a sequence, a NumPy array or a ctypes pointer "
                                  f"(host pointers as plain ints are the cupy.cuda.cudnn convention)")
        if isinstance(v, (str, bytes, dict, set, frozenset)) or _is_library_object(v) or not hasattr(v, "__iter__"):
            raise bad_param(name, f"must be a sequence of {ctype} values (a C array), got {_describe(v)}")
        try:
            items = list(v)
        except Exception as e:  # noqa: BLE001 - an iterable that fails to iterate is not an array
            raise bad_param(name, f"could not be read as an array ({type(e).__name__}: {e})") from None
    out = []
    for i, x in enumerate(items):
        if type(x) is int and lo <= x <= hi:
            out.append(x)
        else:
            out.append(_as_int(x, name, ctype, lo, hi, elem=f"element {i}: "))
    return out


def _as_stream(v, name: str):
    if v is None:
        return v
    if isinstance(v, (str, bytes, float, complex, bool, np.floating, np.bool_)) or _is_library_object(v):
        raise bad_param(name, f"must be a stream (a cupy.cuda.Stream, a cudaStream_t int or 0/None), got {_describe(v)}")
    if isinstance(v, (int, np.integer)):
        return _as_int(v, name, "cudaStream_t", 0, 2 ** 64 - 1)
    return v


def converter(kind: str):
    """(fast type, lo, hi, conv) for a kind, or None when arguments of that kind pass untouched.
    The wrapper keeps a value as it is when ``type(v) is fast type and lo <= v <= hi``."""
    if kind in INT_KINDS:
        ctype, lo, hi = INT_KINDS[kind]
        return int, lo, hi, lambda v, n: _as_int(v, n, ctype, lo, hi)
    if kind.startswith("enum:"):
        enum = kind[5:]
        return int, ENUM_RANGE[0], ENUM_RANGE[1], lambda v, n: _as_int(v, n, "int", *ENUM_RANGE, enum=enum)
    if kind in ("double", "float"):
        lim = FLT_MAX if kind == "float" else math.inf
        return float, -lim, lim, lambda v, n: _as_real(v, n, kind == "float")
    if kind in ("int[]", "uint32[]"):
        ctype, lo, hi = INT_KINDS[kind[:-2]]
        return _Never, 0, 0, lambda v, n: _as_int_array(v, n, ctype, lo, hi)
    if kind == "stream":
        return int, 0, 2 ** 64 - 1, _as_stream
    if kind.startswith(PASS_KINDS):
        return None
    raise ValueError(f"unknown parameter kind {kind!r}")


class _Never:
    """A type no argument has: the kinds whose every value goes through the converter."""


def c_kind(c_name: str, c_param: str, kind: str) -> str:
    if kind == "opaque" and c_param == "streamId":
        return "stream"
    return kind


def match_parameters(c_name: str, fn) -> "dict | None":
    """{Python parameter: (C parameter or None, kind or None)} for ``fn`` registered as ``c_name``;
    None when the table has no entry or the function takes *args."""
    sig = SIGNATURES.get(c_name)
    if sig is None or c_name in NO_CONVERSION:
        return None
    params = inspect.signature(fn).parameters
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values()):
        return None
    by_name = {n.lower(): (n, k) for n, k in sig}
    aliases = PARAM_ALIASES.get(c_name, {})
    out = {}
    for p in params:
        c = aliases.get(p)
        hit = by_name.get((c or p).lower())
        if hit is not None:
            out[p] = (hit[0], c_kind(c_name, hit[0], hit[1]))
        elif (c_name, p) in PYTHON_ONLY:
            out[p] = (None, PYTHON_ONLY[(c_name, p)][0])
        else:
            out[p] = (None, None)  # unmatched: tests/test_arg_conversion.py reports it
    return out


def _plan(c_name: str, fn):
    """(positional converters, keyword converters) for the wrapper; empty when nothing converts."""
    matched = match_parameters(c_name, fn) or {}
    CONVERSIONS[c_name] = matched
    pos, kw = [], {}
    for i, (p, (_, kind)) in enumerate(matched.items()):
        conv = converter(kind) if kind else None
        if conv is not None:
            fast, lo, hi, f = conv
            pos.append((i, p, fast, lo, hi, f))
            kw[p] = f
    return tuple(pos), kw


# REJECTED holds listeners rejected(c_name, error, args, kwargs) of calls refused while their
# arguments are converted, before any HOOKS entry sees the call (cudnn_compat/_core/log.py logs them).
REJECTED: list = []


def _convert(pos, kw, args, kwargs, c_name: str = ""):
    """The slow path: convert every convertible argument (a CuDNNError names the bad one)."""
    try:
        return _convert_all(pos, kw, args, kwargs)
    except CuDNNError as e:
        if REJECTED:
            e.with_function(c_name)
            for listener in tuple(REJECTED):
                listener(c_name, e, args, kwargs)
        raise


def _convert_all(pos, kw, args, kwargs):
    if pos and args:
        args = list(args)
        n = len(args)
        for i, p, fast, lo, hi, f in pos:
            if i >= n:
                break
            v = args[i]
            if type(v) is not fast or not lo <= v <= hi:
                args[i] = f(v, p)
        args = tuple(args)
    if kwargs:
        kwargs = {k: (kw[k](v, k) if k in kw else v) for k, v in kwargs.items()}
    return args, kwargs


# -- interception point (cudnn_compat/tools/trace.py records calls, cudnn_compat/tools/fuse.py flushes) --------
# HOOKS holds interceptors hook(proceed, c_name, args, kwargs) -> result; each calls proceed(args,
# kwargs) to go on.  Empty in normal use: the only cost is one truth test per call.
HOOKS: list = []


def _intercepted(i: int, c_name: str, fn, args, kwargs):
    if i == len(HOOKS):
        return fn(*args, **kwargs)
    return HOOKS[i](lambda a, k: _intercepted(i + 1, c_name, fn, a, k), c_name, args, kwargs)


def _bare_error(e: BaseException, c_name: str, fn, args, kwargs) -> CuDNNError:
    """A bare Python exception out of a legacy function: ``CuDNNArgumentError`` (BAD_PARAM, also a
    TypeError) when the call does not fit the Python signature, else INTERNAL_ERROR (our bug), the
    original chained by the caller.  Only failed calls get here: the signature is bound on this
    path alone, so a call that fits costs nothing more."""
    if isinstance(e, TypeError):
        rule = call_mismatch(fn, c_name, args, kwargs)
        if rule is not None:
            return CuDNNArgumentError(STATUS["CUDNN_STATUS_BAD_PARAM"], "arguments", rule, c_name)
    return CuDNNError(_INTERNAL_ERROR, "", f"internal error (a cudnn-compat bug, please report it): "
                                           f"{type(e).__name__}: {e}", c_name)


def signature_text(c_name: str, fn) -> str:
    """``cudnnSetTensor4dDescriptor(tensorDesc, format, dataType, n, c, h, w)``: the Python
    parameters by name (defaults shown), as error messages and docstrings give them."""
    parts, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            if p.kind is p.KEYWORD_ONLY and not star:
                parts.append("*")
                star = True
            parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return f"{c_name}({', '.join(parts)})"


def call_mismatch(fn, c_name: str, args, kwargs) -> "str | None":
    """Why ``fn(*args, **kwargs)`` does not fit ``fn``'s signature (the unknown keyword first, then
    the count), with the signature; None when it fits."""
    import difflib
    sig = inspect.signature(fn)
    try:
        sig.bind(*args, **kwargs)
        return None
    except TypeError as bind_error:
        why = str(bind_error)
    params = sig.parameters
    shown = signature_text(c_name, fn)
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        names = [n for n, p in params.items() if p.kind is not p.VAR_POSITIONAL]
        unknown = [k for k in kwargs if k not in names or params[k].kind is inspect.Parameter.POSITIONAL_ONLY]
        if unknown:
            hints = [difflib.get_close_matches(k, names, 1) for k in unknown]
            hint = "".join(f" (did you mean {h[0]!r}?)" for h in hints if h)
            return (f"unknown keyword argument{'s' * (len(unknown) > 1)} "
                    f"{', '.join(repr(k) for k in unknown)}{hint}; the signature is {shown}")
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not any(p.kind is p.VAR_POSITIONAL for p in params.values()) and len(args) > len(positional):
        return f"takes {len(positional)} positional argument{'s' * (len(positional) != 1)} but " \
               f"{len(args)} {'was' if len(args) == 1 else 'were'} given; the signature is {shown}"
    given = {p.name for p in positional[:len(args)]} | set(kwargs)
    missing = [p.name for p in params.values() if p.default is p.empty and p.name not in given
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing and not set(kwargs) & {p.name for p in positional[:len(args)]}:
        return f"missing {len(missing)} required argument{'s' * (len(missing) > 1)} " \
               f"{', '.join(repr(m) for m in missing)}; the signature is {shown}"
    return f"{why}; the signature is {shown}"


_WRAPPER = """
def make(fn, c_name, pos, kw):
    def wrapper(*args, **kwargs):
        try:
{convert}            if HOOKS:
                return _intercepted(0, c_name, fn, args, kwargs)
            return fn(*args, **kwargs)
        except CuDNNError as e:
            raise e.with_function(c_name) from None
        except GraphError as e:
            raise graph_error(e, c_name) from None
        except _BARE as e:
            raise _bare_error(e, c_name, fn, args, kwargs) from e
    return wrapper
"""


def _fast_test(pos) -> str:
    """Python source of the test that lets a call skip conversion: every converted positional
    argument is already a plain int / float in range (constants inlined: ~30 ns an argument)."""
    if not pos:
        return ""
    terms = []
    for i, _, fast, lo, hi, _ in pos:
        a = f"args[{i}]"
        if fast is int:
            terms.append(f"type({a}) is int and {lo} <= {a} <= {hi}")
        elif fast is float:
            terms.append(f"type({a}) is float" + ("" if hi == math.inf else f" and {lo!r} <= {a} <= {hi!r}"))
        else:
            terms = ["False"]  # int arrays: always converted
            break
    need = pos[-1][0] + 1
    return (f"            if kwargs or len(args) < {need} or not ({' and '.join(terms)}):\n"
            f"                args, kwargs = _convert(pos, kw, args, kwargs, c_name)\n")


def legacy(c_name: str, cupy: "str | None" = None):
    def deco(fn):
        pos, kw = _plan(c_name, fn)
        ns: dict = {}
        exec(compile(_WRAPPER.format(convert=_fast_test(pos)), f"<legacy wrapper {c_name}>", "exec"), globals(), ns)
        wrapper = functools.wraps(fn)(ns["make"](fn, c_name, pos, kw))
        wrapper.__name__ = c_name
        wrapper.c_name = c_name
        LEGACY[c_name] = wrapper
        CUPY_NAMES[cupy or cupy_name(c_name)] = c_name
        return wrapper
    return deco


def exported() -> dict:
    """All names, both spellings -> function."""
    out = dict(LEGACY)
    out.update({k: LEGACY[v] for k, v in CUPY_NAMES.items()})
    return out
