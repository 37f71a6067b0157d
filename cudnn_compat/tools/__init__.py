"""The tools around the legacy calls (docs/tools.md): ``trace`` (record), ``replay`` (replay,
diff), ``explain``, ``fuse`` (``cudnn_compat.fuse()``: fusion across calls), ``cli`` (the
``cudnn-compat`` command) and ``demo``."""
