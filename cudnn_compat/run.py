"""``python -m cudnn_compat.run [--allow-stub] script.py [args...]``: install the CuPy 13 cuDNN
shim (``cudnn_compat.cupy13.shim.install_cupy_shim``) and run ``script.py`` as ``__main__`` with
``sys.argv = [script.py, args...]``, so CuPy-13 / Chainer-era code that imports
``cupy.cuda.cudnn``, ``cupyx.cudnn`` or ``cupy.cudnn`` runs unedited under CuPy 14.

``--allow-stub`` (or ``CUDNN_COMPAT_SHIM=stub``): when CuPy is not installed, provide the
stand-in ``cupy`` namespace holding only the cuDNN modules (the script then works on NumPy
arrays on the CPU place).  ``-m module`` runs a module instead of a file, like ``python -m``.
"""
from __future__ import annotations

from typing import NoReturn

import os
import runpy
import sys
import warnings

from cudnn_compat._backend import config as _config

USAGE = "usage: python -m cudnn_compat.run [--allow-stub] (script.py | -m module) [args...]"


def exit_without_cupy(script: str) -> "NoReturn":
    """What a CuPy 13-style script says when ``cupy.cuda.cudnn`` cannot be imported: one line on
    stderr naming the way out (the CUDA extras, ``cudnn_compat.run``, ``--allow-stub``), exit status 2."""
    script = os.path.basename(script)
    try:
        import cupy
        why = (f"CuPy {getattr(cupy, '__version__', '?')} has no cupy.cuda.cudnn "
               f"(CuPy 14 removed it): run it as `python -m cudnn_compat.run {script}`, or pass --allow-stub")
    except ImportError:
        why = ("CuPy is not installed: install cudnn-compat with a CUDA extra, `pip install 'cudnn-compat[cuda12]'` "
               "or `pip install 'cudnn-compat[cuda13]'`, or pass --allow-stub to run it on the CPU with NumPy")
    print(f"{script}: {why}", file=sys.stderr)
    raise SystemExit(2)


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
    from .cupy13.shim import CupyShimWarning, install_cupy_shim
    with warnings.catch_warnings():  # without CuPy the script's own import of cupy gets the runner's line
        warnings.simplefilter("ignore", CupyShimWarning)
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
