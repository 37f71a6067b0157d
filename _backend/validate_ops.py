"""Rules for Softmax, LRN and divisive normalization ops (filled by their family)."""
