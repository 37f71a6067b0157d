"""Rules for ResampleForward/Backward (pooling) and NormForward/Backward (batch norm) (filled by their family)."""
