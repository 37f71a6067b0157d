"""``python -m cudnn_compat``: the ``cudnn-compat`` command (see tools/cli.py)."""
import sys

from .tools.cli import main

sys.exit(main())
