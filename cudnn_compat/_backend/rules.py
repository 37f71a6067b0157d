"""The named checks: every check name that a graph or backend-API error carries, defined once.

A check name (``CONV_OUTPUT_DIMS``, ``TENSOR_UNIQUE_ID``) is what ``GraphError.check`` and the
backend API's ``CuDNNError.check`` hold: the graph layer raises ``GraphError(check, message,
status)`` (``ir.py``, the per-kind rules through ``ops._common.fail``, ``planner.py``), and
``cudnn_compat``'s backend API raises ``graph_api.operations.fail(status, attribute, check, message)``.
Both helpers call ``require`` when they build the error (the error path only), so a name that is
not a row of ``RULES``, or a status its row does not give, is an internal error
(``UnknownRule``) instead of a new free-string rule.  ``tests/test_rule_names.py`` walks the
source and fails on a call site whose name is not a row and on a row that no call site raises;
``tools/gen_status_rules.py`` writes the check-name section of docs/status_rules.md "Check names"
from this table.

A row: name -> ``Rule(statuses, meaning, section)``: the cudnnStatus_t names (without
``CUDNN_STATUS_``) the check raises, the usual one first; what the check rejects, in one line;
the 002 section of the rule ("" where 002 gives none: a rule of this library).  Rows are grouped
by family (``FAMILIES``, in the order of the page); ``RULES`` is the flat view.

The legacy functions' own rules (``errors.check``/``bad_param``/``not_supported``) carry a
message, not a name: their contract is the per-function table of docs/status_rules.md, each row
proved by its test (``tests/test_status_rules.py``).
"""
from __future__ import annotations

from typing import NamedTuple


class Rule(NamedTuple):
    statuses: tuple
    meaning: str
    section: str = ""


class UnknownRule(AssertionError):
    """A check raised under a name that is not a row of ``RULES`` (or with a status its row does
    not give): a bug of the raising code, never a user error."""


B, N, BN, NB = ("BAD_PARAM",), ("NOT_SUPPORTED",), ("BAD_PARAM", "NOT_SUPPORTED"), ("NOT_SUPPORTED", "BAD_PARAM")

# family title -> {check name: Rule}
FAMILIES = {
    "Tensors": {
        "TENSOR_DATA_TYPE": Rule(NB, "a data type the graph layer has no type for", "§9.2.16"),
        "TENSOR_DIMENSIONS": Rule(B, "an IR tensor with a non-positive dim, or a different count of dims and strides", "§9.2.16"),
        "TENSOR_DIMENSIONS_POSITIVE": Rule(B, "CUDNN_ATTR_TENSOR_DIMENSIONS holds a dim <= 0", "§9.2.16"),
        "TENSOR_STRIDES_COUNT": Rule(B, "CUDNN_ATTR_TENSOR_STRIDES has another element count than the dimensions", "§9.2.16"),
        "TENSOR_STRIDES_POSITIVE": Rule(B, "CUDNN_ATTR_TENSOR_STRIDES holds a stride <= 0", "§9.2.16"),
        "TENSOR_ALIGNMENT": Rule(B, "the byte alignment is not a positive multiple of the data type's size", "§9.2.16"),
        "TENSOR_VECTORIZED_DIMENSION": Rule(B, "a vector count other than 1 without CUDNN_ATTR_TENSOR_VECTORIZED_DIMENSION", "§9.2.16"),
        "TENSOR_VECTOR_COUNT": Rule(N, "a vectorized tensor (vector count other than 1)", "§9.2.16"),
        "TENSOR_VECTOR_DATA_TYPE": Rule(N, "a vector data type (INT8x4, INT8x32, ...) instead of INT8 with a vector count", "§9.2.16"),
        "TENSOR_BY_VALUE": Rule(BN, "a by-value tensor that is virtual, an op output, or not of one element", "§9.2.16"),
        "COMPUTE_TYPE": Rule(N, "a compute type other than FLOAT, DOUBLE, HALF, BFLOAT16, INT32 (BFLOAT16 for a convolution)", "§9.2.1"),
    },
    "Operation graph": {
        "OPERATIONGRAPH_OPS": Rule(B, "the graph has no operations", "§9.2.15"),
        "OPERATION_KIND": Rule(N, "an operation kind the graph layer has no spec or lowering for", "§9.2.15"),
        "OPERATION_INPUTS": Rule(B, "a required input role is missing or an input role is unknown", "§9.2.15"),
        "OPERATION_OUTPUTS": Rule(B, "a required output role is missing or an output role is unknown", "§9.2.15"),
        "OPERATION_READ_WRITE": Rule(B, "an op reads and writes the same tensor", "§9.2.15"),
        "TENSOR_SINGLE_PRODUCER": Rule(B, "a tensor is written by two ops", "§9.2.15"),
        "TENSOR_UNIQUE_ID": Rule(B, "one uid names two different tensors", "§9.2.15"),
        "VIRTUAL_TENSOR_PRODUCER": Rule(B, "a virtual input that no op writes", "§9.2.15"),
        "VIRTUAL_TENSOR_CONSUMER": Rule(B, "a virtual output that no later op reads", "§9.2.15"),
        "OPERATIONGRAPH_ORDER": Rule(B, "an op reads a tensor before the op that writes it (a cycle or a wrong order)", "§9.2.15"),
        "OPERATIONGRAPH_CYCLE": Rule(N, "the backend graph's ops depend on each other in a cycle", "§9.2.15"),
        "OPERATIONGRAPH_IN_PLACE": Rule(N, "an in-place op (input uid = output uid) in a graph of several ops", "§9.2.15"),
        "GRAPH_HANDLE": Rule(B, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE is not a valid handle", "§9.2.15"),
    },
    "Backend descriptors and attributes": {
        "DESCRIPTOR_TYPE": Rule(BN, "not a cudnnBackendDescriptorType_t, one this version cannot create, or the wrong type here", "§5.2.1"),
        "DESCRIPTOR_SIZE": Rule(B, "sizeInBytes is not an int >= 0", "§5.2.6"),
        "DESCRIPTOR_DESTROYED": Rule(B, "a referenced descriptor was destroyed", "§5.2.4"),
        "DESCRIPTOR_NOT_FINALIZED": Rule(B, "a referenced descriptor is not finalized", "§5.2.4"),
        "DESCRIPTOR_READ_ONLY": Rule(N, "Finalize of a descriptor type obtained finalized from GetAttribute only", "§5.2.4"),
        "ATTRIBUTE_NAME": Rule(B, "not a cudnnBackendAttributeName_t, or not an attribute of this descriptor type", "§5.2.7"),
        "ATTRIBUTE_TYPE": Rule(B, "attributeType is not a type this attribute takes", "§5.2.7"),
        "ATTRIBUTE_READ_ONLY": Rule(B, "SetAttribute of a get-only attribute", "§5.2.7"),
        "ATTRIBUTE_VALUE": Rule(B, "an element that is not a valid value of the attribute's type", "§5.2.7"),
        "ATTRIBUTE_UNSUPPORTED": Rule(N, "SetAttribute of a placeholder attribute", "§5.2.7"),
        "ATTRIBUTE_REQUIRED": Rule(B, "Finalize with a required attribute not set", "§5.2.4"),
        "ELEMENT_COUNT": Rule(B, "an element count that is not an int >= 0 or outside the attribute's range", "§5.2.7"),
    },
    "Engines, plans and execution": {
        "ENGINE_GLOBAL_INDEX": Rule(N, "CUDNN_ATTR_ENGINE_GLOBAL_INDEX is outside the graph's engine count", "§9.2.2"),
        "ENGINE_SUPPORT": Rule(N, "no engine (or not the chosen one) can run the graph; the message has each engine's reason", "§9.2.5"),
        "KNOB_CHOICE_DUPLICATE": Rule(B, "a knob chosen twice in one engine config", "§9.2.3"),
        "KNOB_CHOICE_TYPE": Rule(N, "a knob the engine does not have", "§9.2.3"),
        "KNOB_CHOICE_VALUE": Rule(N, "a knob value outside the engine's range", "§9.2.3"),
        "PLAN_HANDLE": Rule(B, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE is not a valid handle", "§9.2.5"),
        "PLAN_HANDLE_PLACE": Rule(N, "the plan's handle and the operation graph's handle are on different places", "§9.2.5"),
        "HANDLE_PLACE": Rule(B, "cudnnBackendExecute with a handle of another place than the plan's", "§5.2.3"),
        "VARIANT_PACK_COUNT": Rule(B, "the variant pack has another number of data pointers than uids", "§9.2.17"),
        "VARIANT_PACK_UID": Rule(B, "a non-virtual tensor of the graph has no data pointer in the variant pack", "§9.2.17"),
        "VARIANT_PACK_UID_UNIQUE": Rule(B, "a uid appears twice in the variant pack", "§9.2.17"),
        "VARIANT_PACK_WORKSPACE": Rule(B, "NULL workspace for a plan that needs one", "§9.2.17"),
        "CPU_FALLBACK": Rule(N, "(this library) no GPU engine runs the graph and CUDNN_COMPAT_CPU_FALLBACK=0 forbids the CPU"),
        "WORKSPACE_ALLOCATION": Rule(("ALLOC_FAILED",), "(this library) the engine ran out of memory for its workspace"),
    },
    "Convolution": {
        "CONV_RANK": Rule(B, "x, w and y have different ranks or fewer than 3 dims", "§5.2.10"),
        "CONV_TENSOR_RANK": Rule(B, "a conv tensor without SPATIAL_DIMS+2 or +3 dims, or of another rank than x", "§9.2.10"),
        "CONV_MODE": Rule(B, "mode is not CROSS_CORRELATION or CONVOLUTION", "§5.2.10"),
        "CONV_ATTRS": Rule(B, "a required attribute (pre_padding, post_padding, stride) is missing", "§5.2.10"),
        "CONV_SPATIAL_DIMS": Rule(B, "spatial dims outside 1..CUDNN_DIM_MAX-2, or an array of another length", "§9.2.1"),
        "CONV_PRE_PADDING": Rule(B, "a pre-padding < 0", "§5.2.10"),
        "CONV_POST_PADDING": Rule(B, "a post-padding < 0", "§5.2.10"),
        "CONV_STRIDE": Rule(B, "a stride < 1", "§5.2.10"),
        "CONV_DILATION": Rule(B, "a dilation < 1", "§5.2.10"),
        "CONV_PRE_PADDINGS": Rule(B, "CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS holds a value < 0", "§9.2.1"),
        "CONV_POST_PADDINGS": Rule(B, "CUDNN_ATTR_CONVOLUTION_POST_PADDINGS holds a value < 0", "§9.2.1"),
        "CONV_FILTER_STRIDES": Rule(B, "CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES holds a value < 1", "§9.2.1"),
        "CONV_DILATIONS": Rule(B, "CUDNN_ATTR_CONVOLUTION_DILATIONS holds a value < 1", "§9.2.1"),
        "CONV_GROUPS": Rule(B, "groups < 1, or output channels not a multiple of the groups", "§5.2.10"),
        "CONV_GROUP_DIMS": Rule(B, "group, batch or per-group channel dims of the grouped tensors disagree", "§9.2.10"),
        "CONV_GROUP_STRIDE": Rule(N, "an unpacked group stride", "§9.2.10"),
        "CONV_CHANNELS": Rule(B, "x's channels are not w's channels per group times the groups", "§5.2.10"),
        "CONV_OUTPUT_CHANNELS": Rule(B, "y's channels differ from w's filter count", "§9.2.10"),
        "CONV_BATCH": Rule(B, "y's batch differs from x's", "§9.2.10"),
        "CONV_FILTER_SIZE": Rule(B, "the dilated filter is larger than the padded input", "§5.2.10"),
        "CONV_OUTPUT_DIMS": Rule(B, "y's dims differ from the convolution's output dims", "§5.2.28"),
        "CONV_DATA_TYPE": Rule(B, "w's data type differs from x's", "§9.2.10"),
        "CONV_COMPUTE_TYPE": Rule(N, "a compute_type the graph layer has no accumulation for", "§5.2.10"),
        "CONV_MATH_TYPE": Rule(B, "math_type is not a cudnnMathType_t", "§5.2.10"),
        "CONV_BETA_VIRTUAL": Rule(N, "beta != 0 with a virtual output: no prior output to blend", "§9.2.10"),
    },
    "Pointwise, reduction, matmul and statistics": {
        "POINTWISE_MODE": Rule(N, "a pointwise mode the graph layer has no kernel for", "§9.2.14"),
        "POINTWISE_B": Rule(B, "a binary mode without input b", "§9.2.14"),
        "POINTWISE_TENSORS": Rule(B, "a tensor the mode needs is missing, or one it takes none of is set", "§9.2.14"),
        "POINTWISE_RANK": Rule(B, "an input of another rank than the output", "§9.2.14"),
        "POINTWISE_BROADCAST": Rule(B, "an input dim neither equal to the output's nor 1", "§9.2.14"),
        "POINTWISE_ALPHA": Rule(B, "alpha1/alpha2 not by-value scalars", "§9.2.14"),
        "POINTWISE_NAN_PROPAGATION": Rule(B, "nan_propagation is not PROPAGATE or NOT_PROPAGATE", "§9.2.14"),
        "POINTWISE_RELU_CLIP": Rule(B, "the ReLU upper clip is below the lower clip", "§5.1.3.1"),
        "POINTWISE_RELU_SLOPE": Rule(N, "a leaky ReLU lower-clip slope", "§5.1.3.1"),
        "REDUCTION_MODE": Rule(N, "an unknown reduction mode", "§3.2.71"),
        "REDUCTION_RANK": Rule(B, "y of another rank than x", "§3.2.71"),
        "REDUCTION_DIMS": Rule(B, "a dim of y neither equal to x's nor 1", "§3.2.71"),
        "REDUCTION_NAN_PROPAGATION": Rule(B, "nan_propagation is not PROPAGATE or NOT_PROPAGATE", "§3.2.71"),
        "REDUCTION_INDICES": Rule(BN, "indices not of y's dims, not int32, or asked of a mode other than MIN/MAX/AMAX", "§3.2.71"),
        "MATMUL_RANK": Rule(B, "A, B and C without one rank >= 2"),
        "MATMUL_SHAPE": Rule(B, "A's columns differ from B's rows, or C is not rows(A) x columns(B)"),
        "MATMUL_BATCH": Rule(B, "a batch dim of A or B neither equal to C's nor 1"),
        "MATMUL_IRREGULAR_BATCH": Rule(N, "irregularly strided batches"),
        "GENSTATS_RANK": Rule(B, "a sum/sqsum tensor of another rank than x", "§9.2.13"),
        "GENSTATS_DIMS": Rule(B, "a sum/sqsum tensor not 1 in every dim but C (= x's)", "§9.2.13"),
    },
    "Softmax and LRN": {
        "SHAPE_MISMATCH": Rule(B, "the tensors of a softmax, LRN or divisive-normalization op differ in dims", "§3.2.96"),
        "SOFTMAX_ALGORITHM": Rule(B, "algorithm is not FAST, ACCURATE or LOG", "§3.2.96"),
        "SOFTMAX_AXES": Rule(B, "softmax axes empty, repeated or outside the tensor's dims", "§3.2.96"),
        "LRN_RANK": Rule(B, "too few dims (2 for LRN, 3 for divisive normalization)", "§3.2.65"),
        "LRN_N": Rule(B, "n outside [CUDNN_LRN_MIN_N, CUDNN_LRN_MAX_N]", "§3.2.83"),
        "LRN_ALPHA": Rule(B, "alpha not finite", "§3.2.83"),
        "LRN_BETA": Rule(B, "beta < CUDNN_LRN_MIN_BETA", "§3.2.83"),
        "LRN_K": Rule(B, "k < CUDNN_LRN_MIN_K", "§3.2.83"),
    },
    "Pooling (resample)": {
        "RESAMPLE_RANK": Rule(NB, "x not 4-d or 5-d, or y of another rank than x", "§3.2.69"),
        "RESAMPLE_NC": Rule(B, "N or C of x and y differ", "§3.2.69"),
        "RESAMPLE_MODE": Rule(N, "an unknown pooling mode", "§3.2.69"),
        "RESAMPLE_NAN": Rule(B, "nan_propagation is not PROPAGATE or NOT_PROPAGATE", "§3.2.69"),
        "RESAMPLE_ATTR": Rule(B, "a window/stride/padding attribute without one entry per spatial dim", "§3.2.69"),
        "RESAMPLE_WINDOW": Rule(B, "a window entry <= 0", "§3.2.69"),
        "RESAMPLE_STRIDE": Rule(B, "a stride entry <= 0", "§3.2.69"),
        "RESAMPLE_DTYPE": Rule(N, "a data type pooling does not support", "§3.2.69"),
        "RESAMPLE_DY": Rule(B, "dy's dims differ from y's", "§4.1.18"),
        "RESAMPLE_DX": Rule(B, "dx's dims differ from x's", "§4.1.18"),
    },
    "Normalization": {
        "NORM_RANK": Rule(B, "x not 4-d or 5-d", "§3.2.3"),
        "NORM_AXES": Rule(B, "reduced axes without the batch dim, with the channel dim, or repeated", "§3.2.3"),
        "NORM_PARAM_DIMS": Rule(B, "a parameter tensor not of x's dims with the reduced axes set to 1", "§3.2.3"),
        "NORM_PAIR": Rule(B, "one of a pair (saved mean/inv variance, running mean/var) without the other", "§4.1.4"),
        "NORM_Y_DIMS": Rule(B, "y's dims differ from x's", "§3.2.3"),
        "NORM_PHASE": Rule(B, "phase is not TRAINING or INFERENCE", "§3.2.3"),
        "NORM_INFERENCE_INPUTS": Rule(B, "inference without mean or inv_variance", "§3.2.3"),
        "NORM_INFERENCE_OUTPUTS": Rule(B, "inference asked for statistics outputs", "§3.2.3"),
        "NORM_EPSILON": Rule(B, "training, or backward without saved statistics, without epsilon", "§4.1.4"),
        "NORM_RUNNING": Rule(B, "a running-statistics input without its next_ output, or the reverse", "§4.1.4"),
        "NORM_FACTOR": Rule(B, "running statistics without exp_avg_factor", "§4.1.4"),
        "NORM_GRAD_DIMS": Rule(B, "dy or dx not of x's dims", "§4.1.2"),
    },
    "RNN and dropout": {
        "RNG_DISTRIBUTION": Rule(N, "an unknown random distribution", "§3.2.34"),
        "RNG_PROBABILITY": Rule(B, "drop probability not a number in [0, 1]", "§3.2.34"),
        "RNG_COUNTER": Rule(B, "seed or offset not a non-negative int", "§3.2.34"),
        "RNG_STATE": Rule(B, "a state tensor not int32 of dims (2,)", "§3.2.34"),
        "RNN_MODE": Rule(N, "an unknown cell mode", "§7.1.2.8"),
        "RNN_LAYOUT": Rule(B, "an unknown sequence layout", "§7.1.2.8"),
        "RNN_STEPS": Rule(B, "T not a positive int", "§7.1.2.8"),
        "RNN_LENGTHS": Rule(B, "sequence lengths outside [0, T], empty, or increasing in a PACKED layout", "§7.1.2.8"),
        "RNN_WEIGHTS": Rule(B, "w_rec not (D, gates*H, Ho)", "§7.1.2.8"),
        "RNN_DIRECTIONS": Rule(B, "directions not one bool per w_rec", "§7.1.2.8"),
        "RNN_CLIP": Rule(B, "a clip on a non-LSTM cell, or lclip/rclip without the clip attribute (or the reverse)", "§7.1.2.8"),
        "RNN_ROLES": Rule(B, "a role that does not apply to the cell mode", "§7.1.2.8"),
        "RNN_SCALARS": Rule(B, "a scalar role not by value", "§7.1.2.8"),
        "RNN_SHAPES": Rule(B, "a tensor not of the dims its role needs", "§7.1.2.8"),
        "RNN_PADDING": Rule(B, "a padded layout without fill or y_in", "§7.1.2.8"),
        "RNN_RESERVE": Rule(B, "training outputs not all or none, or a backward input the mode needs is missing", "§8.2.18"),
    },
    "CTC loss and spatial transformer sampler": {
        "CTC_PROBS_RANK": Rule(B, "probs not [T, N, A]", "§8.2.3"),
        "CTC_LABELS": Rule(B, "labels not [N, Lmax]", "§8.2.3"),
        "CTC_INT_INPUTS": Rule(B, "labels or lengths not int32", "§8.2.3"),
        "CTC_LENGTHS": Rule(B, "label or input lengths not of dims (N,)", "§8.2.3"),
        "CTC_COSTS": Rule(B, "costs not of dims (N,)", "§8.2.3"),
        "CTC_GRADIENTS": Rule(B, "gradients (or their prior) not of probs' dims", "§8.2.3"),
        "CTC_NORMALIZATION": Rule(B, "an unknown normalization mode", "§8.2.4"),
        "CTC_GRAD_MODE": Rule(B, "an unknown grad mode, or PROPAGATE_NAN without gradients_prior", "§8.2.4"),
        "SAMPLER_RANK": Rule(B, "x not [N, C, H, W] or grid not [N, H, W, 2]", "§3.2.98"),
        "SAMPLER_BATCH": Rule(B, "grid's batch differs from x's", "§3.2.98"),
        "SAMPLER_OUTPUT": Rule(B, "y (or dy) not [N, C, H_grid, W_grid]", "§3.2.98"),
        "SAMPLER_GRADIENT": Rule(B, "dx or dgrid not of x's or grid's dims", "§4.1.21"),
    },
}


def _flat(families: dict) -> dict:
    out: dict = {}
    for rows in families.values():
        for name, r in rows.items():
            assert name not in out, f"check name {name} is defined twice in cudnn_compat/_backend/rules.py"
            out[name] = r
    return out


RULES = _flat(FAMILIES)


def require(check: str, status: "str | None" = None) -> str:
    """``check`` when it is a row of ``RULES`` (and ``status``, a cudnnStatus_t name without
    ``CUDNN_STATUS_``, one of its statuses); else ``UnknownRule`` naming it.  Called by the raise
    helpers when they build an error, never on the success path."""
    r = RULES.get(check)
    if r is None:
        raise UnknownRule(f"check name {check!r} is not a row of cudnn_compat/_backend/rules.py RULES: add it there "
                          f"(status, meaning, 002 section) or raise an existing one")
    if status is not None and status not in r.statuses:
        raise UnknownRule(f"check {check} raised with status {status}, but its row in cudnn_compat/_backend/rules.py "
                          f"gives {'/'.join(r.statuses)}")
    return check
