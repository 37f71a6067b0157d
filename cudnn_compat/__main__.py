"""``python -m cudnn_compat``: the ``cudnn-compat`` command (see cli.py)."""
import sys

from .cli import main

sys.exit(main())
