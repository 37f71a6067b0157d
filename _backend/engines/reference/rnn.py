"""Reference kernels: rnn and dropout (filled by the RNN family)."""
from . import kernel  # noqa: F401
