"""``python -m cudnn_compat.run [--allow-stub] script.py [args...]``: install the CuPy 13 cuDNN
shim (``cudnn_compat.shim.install_cupy_shim``) and run ``script.py`` as ``__main__`` with
``sys.argv = [script.py, args...]``, so CuPy-13 / Chainer-era code that imports
``cupy.cuda.cudnn``, ``cupyx.cudnn`` or ``cupy.cudnn`` runs unedited under CuPy 14.

``--allow-stub`` (or ``CUDNN_COMPAT_SHIM=stub``): when CuPy is not installed, provide the
stand-in ``cupy`` namespace holding only the cuDNN modules (the script then works on NumPy
arrays on the CPU place).  ``-m module`` runs a module instead of a file, like ``python -m``.
"""
from __future__ import annotations

import os
import runpy
import sys

from cudnn_compat._backend import config as _config

USAGE = "usage: python -m cudnn_compat.run [--allow-stub] (script.py | -m module) [args...]"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    allow_stub = _config.get("CUDNN_COMPAT_SHIM") == "stub"
    while argv and argv[0] in ("--allow-stub", "-h", "--help"):
        if argv[0] != "--allow-stub":
            print(USAGE)
            return 0
        allow_stub = True
        argv.pop(0)
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    from .shim import install_cupy_shim
    install_cupy_shim(allow_stub=allow_stub)
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
