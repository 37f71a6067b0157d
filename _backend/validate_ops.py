"""Rules for resample, softmax, LRN, divisive and batch normalization ops (filled by their families)."""
