"""Descriptor lifecycle: the plain ``cudnnCreate*`` / ``cudnnDestroy*`` pairs, from one table.

A plain pair allocates a descriptor that is not yet set (Create takes no argument and returns it)
and frees it (Destroy takes the descriptor or its id).  Destroy's rules are ``_core.descriptor.resolve``'s:
BAD_PARAM when the argument is NULL, not a descriptor, already destroyed, or a descriptor of another
type (a filter descriptor is not a tensor descriptor, though the class derives from it); a row with
``null_ok`` makes NULL a no-op instead, as 002 says for that type.

Each family module defines its pair where the hand-written functions used to be, right after its
class::

    createActivationDescriptor, destroyActivationDescriptor = pair(ActivationDescriptor, __name__)

so both are attributes of the family module (``__module__`` included: tools/gen_api_docs.py groups
by it), registered in the same order under the C name and the CuPy 13 name (``_core.registry.legacy``),
with the Python parameter named as the C header names it (``_core.signatures``, keyword calls) and the
docstrings of ``TABLE`` (tools/gen_stubs.py and tools/gen_api_docs.py read them).

Hand-written, because Create takes arguments or Destroy does more than free one descriptor:
``cudnnCreate``/``cudnnDestroy`` (handle.py: the place, the device, the handle's streams),
``cudnnCreate/DestroyAlgorithmPerformance`` (algorithm.py: a count, lists of objects),
``cudnnCreateFusedOps{ConstParamPack,VariantParamPack,Plan}`` (fused_ops.py: the ``ops`` pattern,
checked) and their Destroys, ``cudnnCreate/DestroyPersistentRNNPlan`` (rnn/desc.py: rnnDesc,
minibatch, dataType, checked against the RNN's algo).
"""
from __future__ import annotations

from typing import NamedTuple

from . import generated as _generated
from .descriptor import resolve
from .registry import LEGACY, cupy_name, legacy
from ..errors import bad_param


class Row(NamedTuple):
    create: str  # C name of Create; "cudnnCreate" + the descriptor class's name
    destroy: str  # C name of Destroy
    arg: str  # Destroy's parameter, named as in the C header
    create_doc: str
    destroy_doc: str
    null_ok: bool = False  # Destroy(NULL) is a no-op (else BAD_PARAM)


TABLE = (
    Row("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor", "tensorDesc",
        "Allocate a tensor descriptor, not yet set (002 §3.2.16).", "Free a tensor descriptor (002 §3.2.31)."),
    Row("cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor", "filterDesc",
        "Allocate a filter descriptor (002 §3.2.10).", "Free a filter descriptor (002 §3.2.25)."),
    Row("cudnnCreateOpTensorDescriptor", "cudnnDestroyOpTensorDescriptor", "opTensorDesc",
        "002 §3.2.12.", "Free an op-tensor descriptor (002 §3.2.27)."),
    Row("cudnnCreateReduceTensorDescriptor", "cudnnDestroyReduceTensorDescriptor", "reduceTensorDesc",
        "002 §3.2.14.", "Free a reduce-tensor descriptor (002 §3.2.29)."),
    Row("cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor", "convDesc",
        "Allocate a convolution descriptor (002 §5.2.11).", "Free a convolution descriptor (002 §5.2.12)."),
    Row("cudnnCreateActivationDescriptor", "cudnnDestroyActivationDescriptor", "activationDesc",
        "Allocate an activation descriptor (002 §3.2.6).", "Free an activation descriptor (002 §3.2.21)."),
    Row("cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor", "poolingDesc",
        "Allocate a pooling descriptor (002 §3.2.13).", "Free a pooling descriptor (002 §3.2.28)."),
    Row("cudnnCreateLRNDescriptor", "cudnnDestroyLRNDescriptor", "lrnDesc",
        "A descriptor holding the defaults N=5, alpha=1e-4, beta=0.75, K=2.0.",
        "Free an LRN descriptor (002 §3.2.26)."),
    Row("cudnnCreateDropoutDescriptor", "cudnnDestroyDropoutDescriptor", "dropoutDesc",
        "Allocate a dropout descriptor (002 §3.2.9).", "Free a dropout descriptor (002 §3.2.24)."),
    Row("cudnnCreateRNNDescriptor", "cudnnDestroyRNNDescriptor", "rnnDesc",
        "Allocate an RNN descriptor (002 §7.2.6).", "Free an RNN descriptor (002 §7.2.11)."),
    Row("cudnnCreateRNNDataDescriptor", "cudnnDestroyRNNDataDescriptor", "RNNDataDesc",
        "Allocate an RNN data descriptor (002 §7.2.5).", "Free an RNN data descriptor (002 §7.2.10)."),
    Row("cudnnCreateAttnDescriptor", "cudnnDestroyAttnDescriptor", "attnDesc",
        "Allocate a multi-head attention descriptor (002 §7.2.3).", "NULL is a no-op (002 §7.2.8).", null_ok=True),
    Row("cudnnCreateSeqDataDescriptor", "cudnnDestroySeqDataDescriptor", "seqDataDesc",
        "Allocate a sequence data descriptor (002 §7.2.7).", "NULL is a no-op (002 §7.2.12).", null_ok=True),
    Row("cudnnCreateCTCLossDescriptor", "cudnnDestroyCTCLossDescriptor", "ctcLossDesc",
        "Allocate a CTC loss descriptor (002 §8.2.2).", "Free a CTC loss descriptor (002 §8.2.5)."),
    Row("cudnnCreateSpatialTransformerDescriptor", "cudnnDestroySpatialTransformerDescriptor", "stDesc",
        "Allocate a spatial transformer descriptor (002 §3.2.15).",
        "Free a spatial transformer descriptor (002 §3.2.30)."),
    Row("cudnnCreateTensorTransformDescriptor", "cudnnDestroyTensorTransformDescriptor", "transformDesc",
        "Allocate a tensor transform (fold, pad, format) descriptor (002 §3.2.17).",
        "Free a tensor-transform descriptor (002 §3.2.32)."),
    Row("cudnnCreateAlgorithmDescriptor", "cudnnDestroyAlgorithmDescriptor", "algorithmDesc",
        "Allocate an algorithm descriptor (002 §3.2.7, deprecated).",
        "Free an algorithm descriptor (002 §3.2.22, deprecated)."),
)
ROWS = {row.create[len("cudnnCreate"):]: row for row in TABLE}  # descriptor class name -> row

_SOURCE = '''
def {create}() -> {cls}:
    return {cls}()


def {destroy}({arg}) -> None:
    {guard}_destroy({arg}, {cls}, {arg!r})
'''


def _destroy(arg, cls, argname: str) -> None:
    d = resolve(arg, cls, argname, need_set=False)
    if type(d) is not cls:  # rule: Destroy takes its own C type (a filter is not a tensor descriptor)
        raise bad_param(argname, f"is a {d.kind}, not a {cls.kind}")
    d.destroy()


def pair(cls, module: str) -> tuple:
    """(Create, Destroy) of ``cls``'s row, defined as functions of ``module`` and registered."""
    row = ROWS[cls.__name__]
    ns = {"__name__": module, cls.__name__: cls, "_destroy": _destroy}
    guard = ""
    if row.null_ok:
        from .bound_graph import is_null
        ns["is_null"], guard = is_null, f"if not is_null({row.arg}):\n        "
    src = _SOURCE.format(create=cupy_name(row.create), destroy=cupy_name(row.destroy), cls=cls.__name__,
                         arg=row.arg, guard=guard)
    _generated.define(f"<lifecycle {cls.__name__}>", src, ns, cupy_name(row.create))  # it defines both
    out = []
    for c_name, doc in ((row.create, row.create_doc), (row.destroy, row.destroy_doc)):
        fn = ns[cupy_name(c_name)]
        fn.__doc__ = doc
        out.append(legacy(c_name)(fn))
    return tuple(out)


def undefined() -> list:
    """C names of the table that no family module has defined (empty once the package is imported)."""
    return [name for row in TABLE for name in (row.create, row.destroy) if name not in LEGACY]
