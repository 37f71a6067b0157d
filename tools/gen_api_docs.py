"""Write ``docs/api.md`` and ``cudnn_compat/_core/docstrings.py``: the API reference of every legacy
function, generated from the registry, as a page and as the functions' own docstrings.

For each function (grouped by family, the module that implements it) ``function_doc`` gathers, from
one set of tables: what it computes (the function's own docstring), its Python parameters with the C
parameter and kind they convert as (``_core.registry.CONVERSIONS``, from the cuDNN headers'
``_core.signatures.SIGNATURES``) and the Python forms each kind accepts (``FORMS``), what it returns
(the C out-parameters), the statuses it can raise and when (the rules of ``docs/status_rules.md``
plus the rules every function shares) and which engines run it (the graph operation kinds of
``OP_KINDS`` against what each engine declares).  ``markdown`` renders it for docs/api.md,
``docstring`` as plain text: ``_core.registry.legacy`` sets that text as each function's
``__doc__`` (from the generated ``DOCS`` table), and tools/gen_stubs.py writes it into the stub,
so ``help()``, editors and the page say the same.

Usage: ``python tools/gen_api_docs.py`` (rewrites both files) or ``--check`` (exit 1 when stale).
``tests/test_stubs.py`` fails when a checked-in file differs from ``render()`` /
``render_docstrings()``, and checks ``OP_KINDS`` against the graphs the functions really build.
"""
from __future__ import annotations

import inspect
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"
DOCSTRINGS = ROOT / "cudnn_compat" / "_core" / "docstrings.py"
RULES = ROOT / "docs" / "status_rules.md"
for p in (str(ROOT), str(ROOT / "tools")):
    if p not in sys.path:
        sys.path.insert(0, p)

import cudnn_compat  # noqa: E402
from cudnn_compat._backend.engines.base import REGISTRY  # noqa: E402
from cudnn_compat._core.registry import CONVERSIONS, CUPY_NAMES, INT_KINDS, LEGACY, PYTHON_ONLY, signature_text  # noqa: E402
from cudnn_compat.enums import ENUMS  # noqa: E402
from cudnn_compat._core.signatures import SIGNATURES  # noqa: E402
from gen_stubs import SCALARS, one_line, out_params, return_type  # noqa: E402

# Family (implementing module) -> title, in the order of the page.
FAMILIES = {
    "handle": "Handle and library", "tensor": "Tensor and filter descriptors", "tensor_ops": "Tensor arithmetic",
    "op_tensor": "Op-tensor", "reduce_tensor": "Tensor reduction", "transform": "Tensor transforms",
    "activation": "Activation", "softmax": "Softmax", "pooling": "Pooling",
    "lrn": "LRN and divisive normalization", "batchnorm": "Batch normalization",
    "normalization": "Normalization (cudnnNormalization*)", "dropout": "Dropout",
    "convolution.descriptor": "Convolution descriptors", "convolution.api": "Convolution",
    "convolution.bias_act": "Convolution with bias and activation",
    "convolution.legacy": "Convolution (cuDNN 7 algorithm queries)",
    "algorithm": "Algorithm descriptors (deprecated)", "fused_ops": "Fused ops", "spatial": "Spatial transformer",
    "rnn.desc": "RNN descriptors", "rnn.weights": "RNN weights", "rnn.v8": "RNN (cuDNN 8 API)",
    "rnn.legacy": "RNN (legacy API)", "rnn.find": "RNN algorithm search",
    "attention.descriptor": "Multi-head attention descriptors", "attention.compute": "Multi-head attention",
    "ctc": "CTC loss", "misc": "Miscellaneous", "graph_api.api": "Backend (graph) API",
}

# Graph operation kinds each computing legacy function builds (every graph it may build).  Functions
# absent here build no graph (descriptor setters, queries, sizes).  tests/test_stubs.py checks the
# rows against the graphs recorded while calling the functions.
_CONV = ("ConvolutionForward", "Pointwise")
_RNN_FWD = ("Matmul", "Pointwise", "RNNRecurrence")
_RNN_BWD = ("Matmul", "Pointwise", "RNNRecurrenceBackward", "Reduction")
_ATTN = ("Matmul", "Pointwise", "Reduction", "Softmax", "SoftmaxBackward")
OP_KINDS = {
    "cudnnAddTensor": ("Pointwise",), "cudnnOpTensor": ("Pointwise",), "cudnnSetTensor": ("Pointwise",),
    "cudnnScaleTensor": ("Pointwise",), "cudnnTransformTensor": ("Pointwise",),
    "cudnnTransformTensorEx": ("Pointwise", "ResampleForward"),
    "cudnnTransformFilter": ("Pointwise", "ResampleForward"),
    "cudnnReduceTensor": ("Pointwise", "Reduction"),
    "cudnnActivationForward": ("Pointwise",), "cudnnActivationBackward": ("Pointwise",),
    "cudnnSoftmaxForward": ("Pointwise", "Softmax"), "cudnnSoftmaxBackward": ("Pointwise", "SoftmaxBackward"),
    "cudnnPoolingForward": ("Pointwise", "ResampleForward"), "cudnnPoolingBackward": ("Pointwise", "ResampleBackward"),
    "cudnnLRNCrossChannelForward": ("LRNForward", "Pointwise"),
    "cudnnLRNCrossChannelBackward": ("LRNBackward", "Pointwise"),
    "cudnnDivisiveNormalizationForward": ("DivisiveNormalizationForward", "Pointwise"),
    "cudnnDivisiveNormalizationBackward": ("DivisiveNormalizationBackward", "Pointwise"),
    "cudnnBatchNormalizationForwardInference": ("NormForward", "Pointwise"),
    "cudnnBatchNormalizationForwardTraining": ("NormForward", "Pointwise"),
    "cudnnBatchNormalizationForwardTrainingEx": ("NormForward", "Pointwise"),
    "cudnnBatchNormalizationBackward": ("NormBackward", "Pointwise"),
    "cudnnBatchNormalizationBackwardEx": ("NormBackward", "Pointwise"),
    "cudnnNormalizationForwardInference": ("NormForward", "Pointwise"),
    "cudnnNormalizationForwardTraining": ("NormForward", "Pointwise"),
    "cudnnNormalizationBackward": ("NormBackward", "Pointwise"),
    "cudnnSetDropoutDescriptor": ("Pointwise", "Rng"), "cudnnRestoreDropoutDescriptor": ("Pointwise", "Rng"),
    "cudnnDropoutForward": ("Pointwise", "Rng"), "cudnnDropoutBackward": ("Pointwise",),
    "cudnnConvolutionForward": _CONV, "cudnnConvolutionBiasActivationForward": _CONV,
    "cudnnConvolutionBackwardData": ("ConvolutionBackwardData", "Pointwise"),
    "cudnnConvolutionBackwardFilter": ("ConvolutionBackwardFilter", "Pointwise"),
    "cudnnConvolutionBackwardBias": ("Pointwise", "Reduction"),
    "cudnnFindConvolutionForwardAlgorithm": _CONV, "cudnnFindConvolutionForwardAlgorithmEx": _CONV,
    "cudnnFindConvolutionBackwardDataAlgorithm": ("ConvolutionBackwardData", "Pointwise"),
    "cudnnFindConvolutionBackwardDataAlgorithmEx": ("ConvolutionBackwardData", "Pointwise"),
    "cudnnFindConvolutionBackwardFilterAlgorithm": ("ConvolutionBackwardFilter", "Pointwise"),
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": ("ConvolutionBackwardFilter", "Pointwise"),
    "cudnnIm2Col": ("ResampleForward",), "cudnnReorderFilterAndBias": ("Pointwise",),
    "cudnnFusedOpsExecute": ("ConvolutionBackwardFilter", "ConvolutionForward", "NormBackward", "Pointwise",
                             "Reduction"),
    "cudnnSpatialTfGridGeneratorForward": ("Matmul", "Pointwise"),
    "cudnnSpatialTfGridGeneratorBackward": ("Matmul", "Pointwise"),
    "cudnnSpatialTfSamplerForward": ("Pointwise", "SpatialTfSamplerForward"),
    "cudnnSpatialTfSamplerBackward": ("Pointwise", "SpatialTfSamplerBackward"),
    "cudnnRNNForward": _RNN_FWD, "cudnnRNNForwardInference": _RNN_FWD, "cudnnRNNForwardTraining": _RNN_FWD,
    "cudnnRNNForwardInferenceEx": _RNN_FWD, "cudnnRNNForwardTrainingEx": _RNN_FWD,
    "cudnnFindRNNForwardInferenceAlgorithmEx": _RNN_FWD, "cudnnFindRNNForwardTrainingAlgorithmEx": _RNN_FWD,
    "cudnnRNNBackwardData_v8": _RNN_BWD, "cudnnRNNBackwardWeights_v8": _RNN_BWD,
    "cudnnRNNBackwardData": _RNN_BWD, "cudnnRNNBackwardDataEx": _RNN_BWD,
    "cudnnRNNBackwardWeights": _RNN_BWD, "cudnnRNNBackwardWeightsEx": _RNN_BWD,
    "cudnnFindRNNBackwardDataAlgorithmEx": _RNN_BWD, "cudnnFindRNNBackwardWeightsAlgorithmEx": _RNN_BWD,
    "cudnnMultiHeadAttnForward": _ATTN, "cudnnMultiHeadAttnBackwardData": _ATTN,
    "cudnnMultiHeadAttnBackwardWeights": _ATTN,
    "cudnnCTCLoss": ("CTCLoss",), "cudnnCTCLoss_v8": ("CTCLoss",),
    "cudnnBackendExecute": ("ConvolutionBackwardData", "ConvolutionBackwardFilter", "ConvolutionForward", "Matmul",
                            "Pointwise", "Reduction"),
}



def _runs(engine: str) -> frozenset:
    """The op kinds ``engine`` declares it runs (its ``op_kinds()``: the engines' one statement)."""
    return frozenset(k for k, why in REGISTRY.engines[engine].op_kinds().items() if why is None)


REFERENCE_KINDS, CUPY_KINDS = _runs("reference"), _runs("cupy")
CUDNN_MAIN = _runs("cudnn") - {"Pointwise"}  # a main op with pointwise epilogues

# Statuses every function shares (docs/status_rules.md, "Rules that hold for every function").
COMMON_BAD_PARAM = "an argument its C type cannot hold, or a NULL, destroyed or wrong-kind handle or descriptor"
COMPUTE_STATUSES = (
    ("NOT_SUPPORTED", "no engine can run the call's graph (every engine declined; the message lists why)"),
    ("ALLOC_FAILED", "GPU place: the engine's workspace could not be allocated"),
)
DOC_NAMES = {"handle": "handle", "desc": "descriptor", "desc[]": "descriptor array", "enum": "enum",
             "pointer": "buffer (pointer)", "out": "out-parameter", "opaque": "opaque", "stream": "stream"}


def engines_for(kinds) -> list:
    """[(engine, note)] of the engines that declare every kind of ``kinds``."""
    ks = set(kinds)
    out = []
    if ks <= REFERENCE_KINDS:
        out.append(("reference", "CPU and GPU places"))
    if ks <= CUPY_KINDS:
        out.append(("cupy", "GPU place"))
    mains = ks & CUDNN_MAIN
    if mains and ks <= CUDNN_MAIN | {"Pointwise"}:
        out.append(("cudnn", "GPU place; one convolution/matmul with a pointwise epilogue"))
    return out


def status_rules() -> dict:
    """function -> [(status, rule)] of the table in docs/status_rules.md."""
    out: dict = {}
    for line in RULES.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"cudnn\w+", cells[0]) and re.fullmatch(r"[A-Z_]+", cells[1]):
            out.setdefault(cells[0], []).append((cells[1], cells[2]))
    return out


def _kind_text(c_param, kind, name: str = "") -> str:
    if kind == "pointer" and name in SCALAR_POINTERS:
        return "scaling factor (a Python number; a host pointer in C)" if name in SCALARS else \
            "host scalar (a Python number; a host pointer in C)"
    if kind is None:
        return "Python only (extension)" if c_param is None else "-"
    base, _, ctype = kind.partition(":")
    name = DOC_NAMES.get(base, base)
    return f"{name} `{ctype}`" if ctype else name


# -- the Python forms each kind of parameter accepts (docs/conventions.md, "Arguments") -------------
# ``const void *`` parameters that C reads as one number; their Python form is the value.
SCALAR_POINTERS = SCALARS | {"alphaDgrid", "betaDgrid", "valuePtr", "paddingFill"}
# ``void *`` parameters read as host int arrays (CTC v7's labels and lengths, attention's windows).
HOST_ARRAYS = {"hostLabels", "hostLabelLengths", "hostInputLengths", "loWinIdx", "hiWinIdx"}
BUFFER = ("a buffer: on the CPU place a NumPy array, an object with the buffer protocol, __array_interface__ "
          "or DLPack, or a ctypes pointer (c_void_p, byref, arr.ctypes); on the GPU place a CuPy array, an object "
          "with __cuda_array_interface__ or DLPack, or a device pointer int; None or 0 for NULL where 002 allows it")
# Untyped buffers (bound as bytes, any dtype); every other buffer's dtype must match its descriptor's.
UNTYPED = {"workSpace", "workspace", "reserveSpace", "states", "algoSpace"}
FORMS = {
    "int": "an integer: a Python int or bool, a NumPy integer, a 0-d integer array or an integral float (2.0), "
           "in the range of a C {ctype} [{lo}, {hi}]",
    "enum": "a {ctype} value: an int, normally a module constant ({members}); NumPy integers and 0-d integer "
            "arrays too, never a float or a bool",
    "real": "a real number: a Python or NumPy int or float, or a 0-d real array{single}",
    "int[]": "a C array of {ctype}: a sequence or NumPy array of integers, each in range; a ctypes pointer "
             "(read as in C); None or 0 for NULL",
    "stream": "a stream: a cupy.cuda.Stream (or any object with .ptr), a cudaStream_t int, or 0/None for the "
              "default stream",
    "handle": "a handle: the object cudnnCreate returned, or its int value",
    "desc": "a {ctype}: the object its cudnnCreate* function returned, or its int value",
    "desc[]": "a sequence of {ctype} (the objects, or their int values), one per entry",
    "scalar": "a number, read as the value: a Python int (of magnitude below 2**31: a larger int looks like a host "
              "address and is BAD_PARAM), float or bool, a NumPy scalar, a 0-d array "
              "or ctypes number; or a host pointer to it (ctypes.c_void_p(addr), ctypes.byref(c), arr.ctypes), "
              "read as float, or double for double data, as C does",
    "host[]": "a host int array: a sequence or NumPy array of ints, a ctypes pointer, or a host pointer int "
              "(CuPy 13's form, probed before it is read)",
    "buffer": BUFFER + "; its dtype must be the descriptor's data type (or uint8)",
    "bytes": BUFFER + "; untyped (any dtype, sized in bytes)",
    "opaque": "passed through as C passes it (see the description)",
    "out": "an object the call fills (see the description)",
}


def _bound_text(v: int) -> str:
    for e in (31, 32, 63, 64):
        if v == 2 ** e - 1:
            return f"2^{e}-1"
        if v == -2 ** e:
            return f"-2^{e}"
    return str(v)


def forms(c_name: str, name: str, c_param, kind) -> str:
    """The Python forms the parameter ``name`` of ``c_name`` accepts, in one sentence."""
    if kind is None:
        extension = PYTHON_ONLY.get((c_name, name))
        return extension[1] if extension else "see the description"
    base, _, ctype = kind.partition(":")
    if base in INT_KINDS:
        ct, lo, hi = INT_KINDS[base]
        return FORMS["int"].format(ctype=ct, lo=_bound_text(lo), hi=_bound_text(hi))
    if base == "enum":
        names = list(ENUMS.get(ctype, {}))
        members = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return FORMS["enum"].format(ctype=ctype, members=members or "see its 002 section")
    if base in ("double", "float"):
        return FORMS["real"].format(single="; it must fit a C float" if base == "float" else "")
    if base in ("int[]", "uint32[]"):
        return FORMS["int[]"].format(ctype=INT_KINDS[base[:-2]][0])
    if base == "pointer":
        if name in SCALAR_POINTERS:
            return FORMS["scalar"]
        if name in HOST_ARRAYS or (c_name in ("cudnnCTCLoss", "cudnnGetCTCLossWorkspaceSize")
                                   and name in ("labels", "labelLengths", "inputLengths")):
            return FORMS["host[]"]
        return FORMS["bytes" if name in UNTYPED else "buffer"]
    return FORMS[base].format(ctype=ctype)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


ARGUMENT_ERROR = ("the call does not fit the Python signature (an unknown keyword, too many or too few "
                  "arguments): CuDNNArgumentError, also a TypeError")


def function_doc(c_name: str, rules: dict) -> dict:
    """Everything the page and the docstring say about ``c_name``, from the tables."""
    fn = inspect.unwrap(LEGACY[c_name])
    conv = CONVERSIONS.get(c_name) or {}
    params = []
    for p in inspect.signature(fn).parameters.values():
        c_param, kind = conv.get(p.name, (None, None))
        star = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        default = "" if p.default is p.empty else f" = {p.default!r}"
        params.append((f"{star}{p.name}{default}", c_param, _kind_text(c_param, kind, p.name),
                       forms(c_name, p.name, c_param, kind) if not star else "see the description"))
    outs = out_params(c_name)
    ret = re.sub(r"\b_([A-Z])", r"\1", return_type(c_name, fn))  # the stub's private class aliases
    st = [("BAD_PARAM", COMMON_BAD_PARAM)] if SIGNATURES.get(c_name) else []
    st += rules.get(c_name, [])
    kinds = OP_KINDS.get(c_name)
    if kinds:
        st += list(COMPUTE_STATUSES)
    st.append(("BAD_PARAM", ARGUMENT_ERROR))
    if kinds:
        eng = engines_for(kinds)
        engines = (f"Graph operations: {', '.join(kinds)}.  Engines: "
                   + ("; ".join(f"{e} ({n})" for e, n in eng) if eng else "none declares all of them") + ".")
    else:
        engines = "Engines: none; runs no graph (descriptor, query or size function)."
    return {"name": c_name, "signature": signature_text(c_name, fn), "purpose": inspect.cleandoc(fn.__doc__ or ""),
            "cupy": [k for k, v in CUPY_NAMES.items() if v == c_name], "params": params, "returns": ret,
            "outs": outs if ret != "None" else [], "statuses": st, "engines": engines}


def _returns_text(d: dict) -> str:
    if d["outs"]:
        return f"{d['returns']}: the C out-parameter{'s' * (len(d['outs']) > 1)} {', '.join(d['outs'])}."
    if d["returns"] == "None":
        return "None" + (": the outputs are written in place." if "Graph operations" in d["engines"] else ".")
    return f"{d['returns']}."


def markdown(d: dict) -> str:
    """The section of docs/api.md."""
    lines = [f"### {d['name']}", "", f"`{d['signature']}`", ""]
    purpose = " ".join(d["purpose"].split("\n\n")[0].split())
    lines.append(purpose + ("" if not d["cupy"] else f" CuPy 13 name: `{'`, `'.join(d['cupy'])}`."))
    rest = d["purpose"].split("\n\n")[1:]
    for para in rest:
        lines += ["", " ".join(para.split())]
    lines.append("")
    if d["params"]:
        lines += ["| Parameter | C parameter | Kind | Accepts |", "|---|---|---|---|"]
        for name, c_param, kind, accepts in d["params"]:
            lines.append(f"| `{name}` | {c_param or '-'} | {_cell(kind)} | {_cell(accepts)} |")
        lines.append("")
    else:
        lines += ["No parameters.", ""]
    ret = _returns_text(d)
    lines.append(f"**Returns** `{d['returns']}`" + ret[len(d["returns"]):])
    lines += ["", "**Statuses**", ""]
    lines += [f"- `CUDNN_STATUS_{status}`: {rule}" for status, rule in d["statuses"]]
    lines += ["", re.sub(r"^(Graph operations|Engines):", r"**\1**", d["engines"]).replace(
        ".  Engines:", ". **Engines**"), ""]
    return "\n".join(lines)


def _wrap(text: str, indent: str = "    ", more: "str | None" = None) -> list:
    return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=indent if more is None else more,
                         break_long_words=False, break_on_hyphens=False) or [indent.rstrip()]


def docstring(d: dict) -> str:
    """The function's ``__doc__``: what it computes, its parameters with the forms they accept, what
    it returns and the statuses it raises (numpydoc sections, so help() and editors lay it out)."""
    out = [d["purpose"] or d["name"], ""]
    if d["cupy"]:
        out += [f"CuPy 13 name: {', '.join(d['cupy'])}.", ""]
    out += ["Parameters", "----------"]
    if not d["params"]:
        out.append("None.")
    for name, c_param, kind, accepts in d["params"]:
        head = f"{name} : {kind.replace('`', '')}"
        out.append(head + (f" (C {c_param})" if c_param and c_param != name.split(" ")[0].lstrip("*") else ""))
        out += _wrap(accepts[0].upper() + accepts[1:] + ("" if accepts.endswith(".") else "."))
    out += ["", "Returns", "-------"]
    out += _wrap(_returns_text(d), "")
    out += ["", "Raises", "------", "CuDNNError"]
    for status, rule in d["statuses"]:
        out += _wrap(f"CUDNN_STATUS_{status}: {rule}.".replace("..", "."), "    ", "        ")
    out += ["", "Notes", "-----"]
    out += _wrap(d["engines"] + "  A rejected call writes nothing.  Reference: docs/api.md, "
                 "docs/conventions.md (cudnn-compat).", "")
    return "\n".join(out) + "\n"


def function_section(c_name: str, rules: dict) -> str:
    return markdown(function_doc(c_name, rules))


def families() -> dict:
    """family module -> [C names] in registration order."""
    out: dict = {k: [] for k in FAMILIES}
    for c_name, fn in LEGACY.items():
        mod = inspect.unwrap(fn).__module__.split(".", 1)[-1]
        out.setdefault(mod, []).append(c_name)
    return {k: v for k, v in out.items() if v}


HEADER = """# API reference

Generated by `tools/gen_api_docs.py` from the function registry; do not edit (run
`python tools/gen_api_docs.py`).  Each function's docstring (`help(cudnn_compat.cudnnConvolutionForward)`)
and the type stub `cudnn_compat/__init__.pyi` carry the same text.  Every legacy cuDNN function cudnn-compat implements, grouped by
family: its purpose, its parameters, what it returns, the statuses it can raise and the engines that
run it.  Section numbers such as "002 §5.2.10" refer to the cuDNN 8.0 API Reference, the
specification this library follows.

* **Parameters**: the Python parameter, the C parameter of the cuDNN header it stands for, its
  kind and the Python forms it accepts (docs/conventions.md says more): an integer type, an `enum` (pass the module constant, e.g. `CUDNN_DATA_FLOAT`), a `handle`
  or `descriptor` (the object a `cudnnCreate*` call returned, or its int), a `buffer` (a NumPy array
  or any `__array_interface__`/DLPack object on the CPU place; a CuPy array or device pointer on the
  GPU place), `double`/`float` (a Python number).  Scaling factors `alpha`/`beta` are Python numbers.
* **Returns**: C out-parameters are returned, not passed (a tuple when there are several), as CuPy's
  `cupy.cuda.cudnn` did.  Every function also has its CuPy 13 name (`cudnnConvolutionForward` is
  `convolutionForward`).
* **Statuses**: raised as `cudnn_compat.CuDNNError` (`.status`, `.argument`, `.rule`); the rows come
  from [status_rules.md](status_rules.md), where each rule names the test that proves it.  A
  rejected call writes nothing.
* **Engines**: the graph operations a call builds, and the engines that declare all of them:
  `reference` (NumPy, float64, CPU and GPU places), `cupy` (generated CUDA kernels, GPU place),
  `cudnn` (libcudnn 9's graph API, GPU place: one convolution or matmul plus a pointwise epilogue).
  An engine may still decline a particular call (data type, layout); the planner then tries the next
  one; `CUDNN_COMPAT_LOG=info`, or `cudnn-compat explain` on a recorded trace, says why.

Families: {toc}

"""


def render() -> str:
    rules = status_rules()
    fams = families()
    toc = ", ".join(f"[{FAMILIES.get(m, m)}](#{_anchor(FAMILIES.get(m, m))})" for m in fams)
    out = [HEADER.format(toc=toc)]
    for mod, names in fams.items():
        out.append(f"## {FAMILIES.get(mod, mod)}\n\n")
        out.append("\n".join(function_section(n, rules) for n in names))
        out.append("\n")
    return "".join(out).rstrip("\n") + "\n"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


DOCS_HEADER = '''"""Generated by tools/gen_api_docs.py from the registry; do not edit (python tools/gen_api_docs.py).

The docstring of every legacy function, by C name: ``_core.registry.legacy`` sets it as the
function's ``__doc__`` (the same text as docs/api.md and the stub cudnn_compat/__init__.pyi).
"""
# flake8: noqa
DOCS = {
'''


def docstrings() -> dict:
    """C name -> the generated docstring."""
    rules = status_rules()
    return {c: docstring(function_doc(c, rules)) for c in sorted(LEGACY)}


def render_docstrings() -> str:
    out = [DOCS_HEADER]
    for c_name, text in docstrings().items():
        out.append(f"    {c_name!r}: (\n")
        out += [f"        {line!r}\n" for line in text.splitlines(keepends=True)]
        out.append("    ),\n")
    out.append("}\n")
    return "".join(out)


def main(argv=None) -> int:
    import _generated
    return max(_generated.main(PAGE, render, __doc__.split("\n")[0], argv),
               _generated.main(DOCSTRINGS, render_docstrings, __doc__.split("\n")[0], argv))


if __name__ == "__main__":
    sys.exit(main())
