"""The convolution family (002 §5.2.8-§5.2.37 cudnn_cnn_infer, §6.2 cudnn_cnn_train): ``descriptor``
(the convolution descriptor and the forward output dims), ``api`` (forward, backward and the
algorithm queries), ``bias_act`` (ConvolutionBiasActivationForward), ``legacy``
(the cuDNN 7 calls removed in 8: Get*Algorithm, Im2Col, folded descriptors) and ``algos``
(which problems each algorithm supports, the perf structs).  The algorithm descriptor
family, shared with RNN and CTC, is ``cudnn_compat.algorithm``."""
