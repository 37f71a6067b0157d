"""Op kinds and rules for RNN and dropout graphs (filled by the RNN family)."""
