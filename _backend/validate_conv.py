"""Rules for the convolution ops (filled by the convolution family)."""
