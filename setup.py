"""The one compiled module, optional: cudnn_compat/_backend/_steady.c (the steady path of a prepared
call; docs/architecture.md).  Where it does not build (no C compiler) the install goes on and the
Python twins run: everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("cudnn_compat._backend._steady", ["cudnn_compat/_backend/_steady.c"], optional=True,
                             extra_compile_args=["-O2"])])
