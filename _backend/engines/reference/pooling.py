"""Reference kernels: pooling (filled by its family)."""
from . import kernel  # noqa: F401
