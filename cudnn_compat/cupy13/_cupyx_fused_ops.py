"""``cupyx.cudnn``'s fused-ops helpers: plans and parameter packs (cudnnMakeFusedOpsPlan
002 §6.2.17, cudnnFusedOpsExecute §6.2.11) and their attributes, scalar or descriptor."""
from __future__ import annotations

import ctypes as _ctypes

from . import cupy_cudnn as cudnn
from ._cupyx_descriptors import Descriptor
from ._cupyx_place import _on_device, get_handle


def _is_scalar_const_label(label) -> bool:
    from ..fused_ops import const_kind
    return const_kind(label) != "desc"


def create_fused_ops_plan(ops):
    return Descriptor(cudnn.createFusedOpsPlan(ops), cudnn.destroyFusedOpsPlan)


def create_fused_ops_const_param_pack(ops, list_attr_param):
    const_pack = Descriptor(cudnn.createFusedOpsConstParamPack(ops), cudnn.destroyFusedOpsConstParamPack)
    for attr, param in list_attr_param:
        set_fused_ops_const_param_pack_attribute(const_pack, attr, param)
    return const_pack


def make_fused_ops_plan(plan, const_pack):
    return cudnn.makeFusedOpsPlan(get_handle(), plan.value, const_pack.value)


def create_fused_ops_variant_param_pack(ops, list_attr_param):
    var_pack = Descriptor(cudnn.createFusedOpsVariantParamPack(ops), cudnn.destroyFusedOpsVariantParamPack)
    for attr, param in list_attr_param:
        set_fused_ops_variant_param_pack_attribute(var_pack, attr, param)
    return var_pack


def fused_ops_execute(plan, var_pack):
    cudnn.fusedOpsExecute(get_handle(), plan.value, var_pack.value)


def set_fused_ops_const_param_pack_attribute(const_pack, param_label, desc_or_scalar):
    if _is_scalar_const_label(param_label):
        scalar = _ctypes.c_int(int(desc_or_scalar))
        cudnn.setFusedOpsConstParamPackAttribute(const_pack.value, param_label, _ctypes.addressof(scalar))
    else:
        cudnn.setFusedOpsConstParamPackAttribute(const_pack.value, param_label, desc_or_scalar.value)


def get_fused_ops_const_param_pack_attribute(const_pack, param_label):
    """(int value, isNULL) for a scalar label, (a new descriptor filled from the pack, isNULL) else."""
    if _is_scalar_const_label(param_label):
        out = _ctypes.c_int(0)
        is_null = cudnn.getFusedOpsConstParamPackAttribute(const_pack.value, param_label, _ctypes.addressof(out))
        return out.value, is_null
    name = next((k for k, v in vars(cudnn).items() if k.startswith("CUDNN_PARAM_") and v == param_label), "")
    if name == "CUDNN_PARAM_ACTIVATION_DESC":
        desc = cudnn.createActivationDescriptor()
    elif name == "CUDNN_PARAM_CONV_DESC":
        desc = cudnn.createConvolutionDescriptor()
    elif name in ("CUDNN_PARAM_WDESC", "CUDNN_PARAM_DWDESC"):
        desc = cudnn.createFilterDescriptor()
    else:
        desc = cudnn.createTensorDescriptor()
    is_null = cudnn.getFusedOpsConstParamPackAttribute(const_pack.value, param_label, desc)
    return desc, is_null


_VARIANT_SCALARS = {"CUDNN_SCALAR_SIZE_T_WORKSPACE_SIZE_IN_BYTES": _ctypes.c_size_t,
                    "CUDNN_SCALAR_INT64_T_BN_ACCUMULATION_COUNT": _ctypes.c_int64,
                    "CUDNN_SCALAR_DOUBLE_BN_EPSILON": _ctypes.c_double,
                    "CUDNN_SCALAR_DOUBLE_BN_EXP_AVG_FACTOR": _ctypes.c_double}


def _variant_scalar_ctype(label):
    for name, ctype in _VARIANT_SCALARS.items():
        if getattr(cudnn, name) == label:
            return ctype
    return None


def set_fused_ops_variant_param_pack_attribute(var_pack, param_label, arr_or_scaler):
    ctype = _variant_scalar_ctype(param_label)
    if ctype is not None:
        value = ctype(arr_or_scaler)
        cudnn.setFusedOpsVariantParamPackAttribute(var_pack.value, param_label, _ctypes.addressof(value))
    else:
        ptr = arr_or_scaler.data.ptr if _on_device(arr_or_scaler) else arr_or_scaler
        cudnn.setFusedOpsVariantParamPackAttribute(var_pack.value, param_label, ptr)


def get_fused_ops_variant_param_pack_attribute(var_pack, param_label):
    ctype = _variant_scalar_ctype(param_label) or _ctypes.c_size_t
    out = ctype(0)
    cudnn.getFusedOpsVariantParamPackAttribute(var_pack, param_label, _ctypes.addressof(out))
    return out.value
