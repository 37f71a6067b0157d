"""The RNN family (002 ch. 7 adv_infer and ch. 8 adv_train, RNN parts): importing this module
registers every RNN function of both API generations.

  rnn_desc     RNN, RNN data and persistent-plan descriptors, all setters and getters
  rnn_weights  weight space / params sizes, cudnnGetRNNWeightParams, LinLayer pointers
  rnn_v8       cudnnRNNForward, cudnnRNNBackwardData_v8, cudnnRNNBackwardWeights_v8, temp sizes
  rnn_legacy   the v6/v7 calls (per-step descriptor arrays) and their Ex variants
  rnn_find     the deprecated algorithm search (Find*AlgorithmEx, *MaxCount, SetRNNAlgorithmDescriptor)
  rnn_core     the one implementation underneath: layouts and the translation into graphs
"""
from __future__ import annotations

from . import rnn_desc, rnn_weights, rnn_v8, rnn_legacy, rnn_find  # noqa: F401  (registration)
