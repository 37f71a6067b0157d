"""The RNN family (002 ch. 7 adv_infer and ch. 8 adv_train, RNN parts): importing this module
registers every RNN function of both API generations.

  desc         RNN, RNN data and persistent-plan descriptors, all setters and getters
  weights      weight space / params sizes, cudnnGetRNNWeightParams, LinLayer pointers
  v8           cudnnRNNForward, cudnnRNNBackwardData_v8, cudnnRNNBackwardWeights_v8, temp sizes
  legacy       the v6/v7 calls (per-step descriptor arrays) and their Ex variants
  find         the deprecated algorithm search (Find*AlgorithmEx, *MaxCount, SetRNNAlgorithmDescriptor)
  core         the one implementation underneath: layouts and the translation into graphs
"""
from __future__ import annotations

from . import desc, weights, v8, legacy, find  # noqa: F401  (registration)
