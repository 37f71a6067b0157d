"""Reference kernels: lrn (filled by its family)."""
from . import kernel  # noqa: F401
