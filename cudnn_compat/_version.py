"""The version of cudnn-compat: the one place it is written (pyproject reads it statically;
``cudnn_compat.__version__``, ``cudnn-compat --version`` and traces take it from here)."""
__version__ = "0.1.0"
