"""The multi-head attention family (002 §7.2.3-§7.2.53 cudnn_adv_infer, §8.2.15-§8.2.16
cudnn_adv_train): ``descriptor`` (the attention and sequence data descriptors, the weight and
buffer queries) and ``compute`` (cudnnMultiHeadAttnForward, BackwardData, BackwardWeights)."""
from .descriptor import (AttnDescriptor, SeqDataDescriptor, attn_desc, createAttnDescriptor,  # noqa: F401
                         createSeqDataDescriptor, destroyAttnDescriptor, destroySeqDataDescriptor,
                         getAttnDescriptor, getMultiHeadAttnBuffers, getMultiHeadAttnWeights, getSeqDataDescriptor,
                         seq_desc, setAttnDescriptor, setSeqDataDescriptor, weight_layout)
from .compute import (_MASKS, multiHeadAttnBackwardData, multiHeadAttnBackwardWeights,  # noqa: F401
                      multiHeadAttnForward)
