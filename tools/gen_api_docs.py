"""Write ``docs/api.md``: the API reference of every legacy function, generated from the registry.

For each function (grouped by family, the module that implements it): its one-line purpose, its
Python parameters with the C parameter and kind they convert as (``_core.registry.CONVERSIONS``, from the
cuDNN headers' ``_core.signatures.SIGNATURES``), what it returns (the C out-parameters), the statuses it
can raise (the rules of ``docs/status_rules.md`` plus the rules every function shares) and which
engines run it (the graph operation kinds of ``OP_KINDS`` against what each engine declares).

Usage: ``python tools/gen_api_docs.py`` (rewrites docs/api.md) or ``--check`` (exit 1 when stale).
``tests/test_stubs.py`` fails when the checked-in page differs from ``render()``, and checks
``OP_KINDS`` against the graphs the functions really build.
"""
from __future__ import annotations

import inspect
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"
RULES = ROOT / "docs" / "status_rules.md"
for p in (str(ROOT), str(ROOT / "tools")):
    if p not in sys.path:
        sys.path.insert(0, p)

import cudnn_compat  # noqa: E402
from cudnn_compat._backend.engines.cudnn_engine import graph as _cudnn_graph  # noqa: E402
from cudnn_compat._backend.engines.cupy_engine import IMPLS as _CUPY_IMPLS  # noqa: E402
from cudnn_compat._backend.engines.reference import KERNELS as _REF_KERNELS  # noqa: E402
from cudnn_compat._core.registry import CONVERSIONS, CUPY_NAMES, LEGACY  # noqa: E402
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

# What each engine declares it runs (read from the engines, not restated).
REFERENCE_KINDS = frozenset(_REF_KERNELS)
CUPY_KINDS = frozenset(_CUPY_IMPLS) | {"Pointwise", "Reduction"}
CUDNN_MAIN = frozenset(_cudnn_graph.MAIN_KINDS)

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
    if kind == "pointer" and name in SCALARS:
        return "scaling factor (a Python number; a host pointer in C)"
    if kind is None:
        return "Python only (extension)" if c_param is None else "-"
    base, _, ctype = kind.partition(":")
    name = DOC_NAMES.get(base, base)
    return f"{name} `{ctype}`" if ctype else name


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def function_section(c_name: str, rules: dict) -> str:
    fn = LEGACY[c_name]
    cupy = [k for k, v in CUPY_NAMES.items() if v == c_name]
    lines = [f"### {c_name}", ""]
    doc = one_line(fn.__doc__)
    lines.append(doc + ("" if not cupy else f" CuPy 13 name: `{'`, `'.join(cupy)}`."))
    lines.append("")
    conv = CONVERSIONS.get(c_name) or {}
    params = list(inspect.signature(inspect.unwrap(fn)).parameters.values())
    if params:
        lines += ["| Parameter | C parameter | Kind |", "|---|---|---|"]
        for p in params:
            c_param, kind = conv.get(p.name, (None, None))
            star = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
            default = "" if p.default is p.empty else f" = {p.default!r}"
            text = _cell(_kind_text(c_param, kind, p.name))
            lines.append(f"| `{star}{p.name}{default}` | {c_param or '-'} | {text} |")
        lines.append("")
    else:
        lines += ["No parameters.", ""]
    outs = out_params(c_name)
    ret = re.sub(r"\b_([A-Z])", r"\1", return_type(c_name, fn))  # the stub's private class aliases
    lines.append(f"**Returns** `{ret}`" + (f": {', '.join(outs)}." if outs and ret != "None" else "."))
    lines.append("")
    st = [("BAD_PARAM", COMMON_BAD_PARAM)] if SIGNATURES.get(c_name) else []
    st += rules.get(c_name, [])
    kinds = OP_KINDS.get(c_name)
    if kinds:
        st += list(COMPUTE_STATUSES)
    if st:
        lines.append("**Statuses**")
        lines.append("")
        for status, rule in st:
            lines.append(f"- `CUDNN_STATUS_{status}`: {rule}")
        lines.append("")
    if kinds:
        eng = engines_for(kinds)
        lines.append(f"**Graph operations** {', '.join(kinds)}. **Engines** "
                     + ("; ".join(f"`{e}` ({n})" for e, n in eng) if eng else "none declares all of them") + ".")
    else:
        lines.append("**Engines** none: runs no graph (descriptor, query or size function).")
    lines.append("")
    return "\n".join(lines)


def families() -> dict:
    """family module -> [C names] in registration order."""
    out: dict = {k: [] for k in FAMILIES}
    for c_name, fn in LEGACY.items():
        mod = inspect.unwrap(fn).__module__.split(".", 1)[-1]
        out.setdefault(mod, []).append(c_name)
    return {k: v for k, v in out.items() if v}


HEADER = """# API reference

Generated by `tools/gen_api_docs.py` from the function registry; do not edit (run
`python tools/gen_api_docs.py`).  Every legacy cuDNN function cudnn-compat implements, grouped by
family: its purpose, its parameters, what it returns, the statuses it can raise and the engines that
run it.  Section numbers such as "002 §5.2.10" refer to the cuDNN 8.0 API Reference, the
specification this library follows.

* **Parameters**: the Python parameter, the C parameter of the cuDNN header it stands for, and its
  kind: an integer type, an `enum` (pass the module constant, e.g. `CUDNN_DATA_FLOAT`), a `handle`
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


def main(argv=None) -> int:
    import _generated
    return _generated.main(PAGE, render, __doc__.split("\n")[0], argv)

if __name__ == "__main__":
    sys.exit(main())
