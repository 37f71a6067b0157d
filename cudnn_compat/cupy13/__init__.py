"""CuPy 13's cuDNN modules on cudnn-compat: ``cupy_cudnn`` (``cupy.cuda.cudnn``), ``cupyx_cudnn``
(``cupyx.cudnn``) and ``shim`` (installs them under CuPy 14; ``python -m cudnn_compat.run``)."""
