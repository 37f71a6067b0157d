"""Make CuPy-13-era code import unchanged under CuPy 14 (which removed ``cupy.cuda.cudnn``,
``cupyx.cudnn`` and ``cupy.cudnn``).

``install_cupy_shim()`` registers, for each name CuPy lacks (and only then):

    cupy.cuda.cudnn, cupy_backends.cuda.libs.cudnn   -> cudnn_compat.cupy13.cupy_cudnn  (low level)
    cupyx.cudnn                                      -> cudnn_compat.cupy13.cupyx_cudnn (helpers)
    cupy.cudnn                                       -> the helpers, warning DeprecationWarning
                                                        on first use as CuPy 13 did
    cupy.cuda.cudnn_enabled = True                   (the flag Chainer-era code reads)
    cupyx.get_runtime_info()                         with CuPy 13's "cuDNN Build Version" and
                                                     "cuDNN Version" rows again

both in ``sys.modules`` and as attributes of the parent packages.  A name CuPy still provides
(CuPy 13 with a loadable libcudnn) is left alone.  Without CuPy at all, nothing is registered
unless ``allow_stub=True``: then a minimal stand-in namespace ``cupy`` / ``cupy.cuda`` /
``cupyx`` / ``cupy_backends...`` is created that holds only these modules,
``cupy.cuda.is_available()`` (False) and ``cupy.__cudnn_compat_stub__ = True`` -- enough for
scripts that import the cuDNN names and run on NumPy arrays on the CPU place; any other
``cupy`` attribute raises AttributeError naming the stand-in.

Code that cannot be edited:

* ``python -m cudnn_compat.run [--allow-stub] script.py args...`` installs the shim and runs the
  script as ``__main__``;
* opt-in at interpreter start: ``cudnn-compat install-shim`` writes ``cudnn_compat_shim.pth``
  into site-packages; from then on ``CUDNN_COMPAT_SHIM=1`` (``=stub`` to allow the stand-in)
  imports cudnn_compat and appends a lazy import hook at start-up, which registers the modules the
  first time one of the names is imported and no other finder has it (CuPy is not imported at
  start-up).  Without the variable the file does nothing.  ``cudnn-compat install-shim --remove``
  deletes it.

``uninstall_cupy_shim()`` undoes what the last install did (tests use it).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings

from cudnn_compat._backend import config as _config

LOW = ("cupy.cuda.cudnn", "cupy_backends.cuda.libs.cudnn")
HIGH = ("cupyx.cudnn",)
DEPRECATED = ("cupy.cudnn",)
NAMES = LOW + HIGH + DEPRECATED
STUB_PACKAGES = ("cupy", "cupy.cuda", "cupyx", "cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs")
ENV = "CUDNN_COMPAT_SHIM"
PTH_NAME = "cudnn_compat_shim.pth"
# runs at every interpreter start: one environment lookup unless the variable is set; its value is
# then parsed by _backend.config like every other (1|on|true|yes, stub; 0|off|false|no: nothing)
PTH_LINE = ("import os; os.environ.get('CUDNN_COMPAT_SHIM', '').strip() and "
            "__import__('cudnn_compat._backend.config')._backend.config.get('CUDNN_COMPAT_SHIM') != 'off' and "
            "__import__('cudnn_compat.cupy13.shim').cupy13.shim.install_import_hook()\n")

_installed: dict = {}  # what the last install changed: {"modules": {name: previous or None}, "attrs": [...]}


# -- the modules ------------------------------------------------------------------------------------

def _deprecated_module():
    """``cupy.cudnn``: the helpers of ``cupyx.cudnn``, with CuPy 13's DeprecationWarning on first use."""
    from . import cupyx_cudnn
    mod = types.ModuleType("cupy.cudnn", "Deprecated alias of cupyx.cudnn (cudnn-compat stand-in).")
    warned = []

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        if not warned:
            warned.append(True)
            warnings.warn("cupy.cudnn is deprecated. Use cupyx.cudnn instead", DeprecationWarning, stacklevel=2)
        try:
            return getattr(cupyx_cudnn, name)
        except AttributeError:
            raise AttributeError(f"module 'cupy.cudnn' has no attribute {name!r}") from None

    mod.__getattr__ = __getattr__
    mod.__dir__ = lambda: sorted(k for k in vars(cupyx_cudnn) if not k.startswith("__"))
    mod.__cudnn_compat__ = True
    return mod


def _module_for(name: str):
    if name in LOW:
        from . import cupy_cudnn
        return cupy_cudnn
    if name in HIGH:
        from . import cupyx_cudnn
        return cupyx_cudnn
    return _deprecated_module()


def _is_ours(mod) -> bool:
    return getattr(mod, "__cudnn_compat__", False) or getattr(mod, "__name__", "").startswith("cudnn_compat.")


def _cupy_has(name: str) -> bool:
    """True when CuPy itself provides ``name`` (importable, and for the low-level module, usable)."""
    mod = sys.modules.get(name)
    if mod is None:
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - ImportError, or CuPy 13 failing to load libcudnn
            return False
    return not _is_ours(mod) and getattr(mod, "available", True) is not False


class _Stub(types.ModuleType):
    """A package of the stand-in ``cupy`` namespace (only when CuPy is not installed)."""

    __cudnn_compat_stub__ = True

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"{self.__name__}.{name}: cudnn-compat's stand-in CuPy namespace only holds the cuDNN "
                             f"modules (CuPy is not installed); install CuPy for arrays")


def _make_stub(name: str):
    mod = _Stub(name, "cudnn-compat stand-in (CuPy is not installed)")
    mod.__path__ = []  # a package: submodules resolve through sys.modules
    if name == "cupy.cuda":
        mod.is_available = lambda: False
    return mod


class CupyShimWarning(RuntimeWarning):
    """install_cupy_shim() registered nothing because CuPy cannot be imported (and no stand-in was asked for)."""


def _cupy_import_error() -> "str | None":
    """Why ``import cupy`` fails ("ModuleNotFoundError: ..."), None when it works."""
    if isinstance(sys.modules.get("cupy"), _Stub):
        return "cupy is the shim's stand-in namespace"
    try:
        importlib.import_module("cupy")
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    return None


def _cupy_importable() -> bool:
    return _cupy_import_error() is None


# -- cupyx.get_runtime_info(): CuPy 13's cuDNN rows -----------------------------------------------------
# CuPy 13's cupyx/_runtime.py printed, after "Jitify Build Version":
#     cuDNN Build Version : cudnn.get_build_version()
#     cuDNN Version       : _eval_or_error(cudnn.getVersion, cudnn.CuDNNError)  (repr of the error)
# with ``cudnn`` = ``cupy_backends.cuda.libs.cudnn``.  CuPy 14 dropped both rows; under the shim
# ``cupyx._runtime._RuntimeInfo`` becomes a subclass that has them again.

CUDNN_ROWS_BEFORE = ("NCCL Build Version", "cuTENSOR Version", "Device ")


def _cudnn_module():
    mod = sys.modules.get("cupy_backends.cuda.libs.cudnn")
    if mod is None:
        from . import cupy_cudnn as mod
    return mod


def cudnn_runtime_rows() -> list:
    """[(label, value)] of CuPy 13's two cuDNN rows, evaluated now as CuPy 13 did."""
    cudnn = _cudnn_module()
    build = cudnn.get_build_version()
    try:
        version = cudnn.getVersion()
    except cudnn.CuDNNError as e:  # CuPy 13's _eval_or_error(cudnn.getVersion, cudnn.CuDNNError)
        version = repr(e)
    return [("cuDNN Build Version", build), ("cuDNN Version", version)]


def insert_rows(text: str, rows: list) -> str:
    """``text`` (CuPy's ``'{:width}: {}\\n'`` records) with ``rows`` added in the same format, before
    the first of CUDNN_ROWS_BEFORE (else at the end); unchanged when the first label is there."""
    lines = text.splitlines(keepends=True)
    if any(ln.startswith(rows[0][0] + " ") or ln.startswith(rows[0][0] + ":") for ln in lines):
        return text
    width = max([ln.index(": ") for ln in lines if ": " in ln] + [0])
    if width < max(len(r[0]) + 2 for r in rows):  # a wider label: pad every record to it, as CuPy would
        width = max(len(r[0]) + 2 for r in rows)
        lines = [f"{ln[:ln.index(': ')].rstrip():{width}}{ln[ln.index(': '):]}" if ": " in ln else ln for ln in lines]
    new = [f"{label:{width}}: {value}\n" for label, value in rows]
    at = next((i for i, ln in enumerate(lines) if ln.startswith(CUDNN_ROWS_BEFORE)), len(lines))
    return "".join(lines[:at] + new + lines[at:])


def with_cudnn_rows(base: type) -> type:
    """A subclass of CuPy's ``_RuntimeInfo`` with CuPy 13's ``cudnn_build_version`` /
    ``cudnn_version`` attributes and rows."""
    class _RuntimeInfo(base):
        __cudnn_compat__ = True
        cudnn_build_version = None
        cudnn_version = None

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            (_, self.cudnn_build_version), (_, self.cudnn_version) = cudnn_runtime_rows()

        def __str__(self):
            return insert_rows(super().__str__(), [("cuDNN Build Version", self.cudnn_build_version),
                                                   ("cuDNN Version", self.cudnn_version)])
    _RuntimeInfo.__module__ = base.__module__
    _RuntimeInfo.__qualname__ = base.__qualname__
    return _RuntimeInfo


class _StubRuntimeInfo:
    """``cupyx.get_runtime_info()`` of the stand-in namespace (CuPy not installed)."""

    def __init__(self, *, full=True):
        import numpy
        self.cupy_version = "(not installed; cudnn-compat stand-in namespace)"
        self.numpy_version = numpy.version.full_version

    def __str__(self):
        import platform
        records = [("OS", platform.platform()), ("Python Version", platform.python_version()),
                   ("CuPy Version", self.cupy_version), ("NumPy Version", self.numpy_version)]
        width = max(len(r[0]) for r in records) + 2
        return "".join(f"{k:{width}}: {v}\n" for k, v in records)


def _patch_runtime_info(record, have_cupy: bool) -> None:
    """Give ``cupyx.get_runtime_info()`` CuPy 13's cuDNN rows (see above)."""
    rt = sys.modules.get("cupyx._runtime")
    if rt is None and have_cupy:
        try:
            rt = importlib.import_module("cupyx._runtime")
        except Exception:  # noqa: BLE001 - a CuPy without it: nothing to patch
            rt = None
    base = getattr(rt, "_RuntimeInfo", None) if rt is not None else None
    if isinstance(base, type) and not getattr(base, "__cudnn_compat__", False):
        _set_attr(record, "cupyx._runtime", "_RuntimeInfo", with_cudnn_rows(base))
    cupyx = sys.modules.get("cupyx")
    if isinstance(cupyx, _Stub) and "get_runtime_info" not in cupyx.__dict__:
        info = with_cudnn_rows(_StubRuntimeInfo)
        _set_attr(record, "cupyx", "get_runtime_info", lambda *, full=True: info(full=full))


def _remember(record, name):
    record["modules"].setdefault(name, sys.modules.get(name))


def _set_attr(record, parent: str, attr: str, value):
    pmod = sys.modules.get(parent)
    if pmod is None:
        return
    record["attrs"].append((pmod, attr, pmod.__dict__.get(attr, _MISSING)))
    setattr(pmod, attr, value)


_MISSING = object()


def install_cupy_shim(allow_stub: bool = False, force: bool = False) -> list:
    """Register the CuPy 13 cuDNN modules CuPy lacks; returns the names registered (empty when
    CuPy has them all).  ``allow_stub``: without CuPy, create the stand-in ``cupy`` namespace
    (otherwise nothing is registered).  ``force``: replace CuPy's own modules too."""
    record = {"modules": {}, "attrs": []}
    why = _cupy_import_error()
    have_cupy = why is None
    if not have_cupy and not isinstance(sys.modules.get("cupy"), _Stub):
        if not allow_stub:
            warnings.warn(f"install_cupy_shim(): CuPy cannot be imported ({why}), so no module was registered; "
                          "install CuPy (pip install 'cudnn-compat[cuda12]' or '[cuda13]'), or pass allow_stub=True "
                          "(CUDNN_COMPAT_SHIM=stub) for the CuPy 13 modules on a stand-in cupy namespace (CPU place)",
                          CupyShimWarning, stacklevel=2)
            return []
        for pkg in STUB_PACKAGES:
            if pkg not in sys.modules:
                _remember(record, pkg)
                sys.modules[pkg] = _make_stub(pkg)
                parent, _, child = pkg.rpartition(".")
                if parent:
                    _set_attr(record, parent, child, sys.modules[pkg])
    else:
        for pkg in ("cupyx", "cupy_backends.cuda.libs"):
            try:
                importlib.import_module(pkg)
            except ImportError:
                pass
    done = []
    for name in NAMES:
        if not force and (_is_ours(sys.modules.get(name)) or (have_cupy and _cupy_has(name))):
            continue
        parent, _, child = name.rpartition(".")
        if parent not in sys.modules:
            continue
        mod = _module_for(name)
        _remember(record, name)
        sys.modules[name] = mod
        _set_attr(record, parent, child, mod)
        done.append(name)
    if "cupy.cuda.cudnn" in done:
        _set_attr(record, "cupy.cuda", "cudnn_enabled", True)
        _patch_runtime_info(record, have_cupy)
    if record["modules"] or record["attrs"]:
        _installed.setdefault("stack", []).append(record)
    return done


def uninstall_cupy_shim() -> None:
    """Undo every install (modules restored to what they were, attributes removed or restored)."""
    for record in reversed(_installed.pop("stack", [])):
        for pmod, attr, old in reversed(record["attrs"]):
            if old is _MISSING:
                pmod.__dict__.pop(attr, None)
            else:
                setattr(pmod, attr, old)
        for name, old in record["modules"].items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def is_stub() -> bool:
    """True when ``cupy`` in this process is the stand-in namespace."""
    return isinstance(sys.modules.get("cupy"), _Stub)


# -- the lazy import hook (.pth opt-in) ---------------------------------------------------------------

class _Finder(importlib.abc.MetaPathFinder):
    """Answers an import of one of NAMES that no other finder resolved: installs the shim (which
    registers the modules) and hands back ours.  Appended last, so CuPy's own modules win."""

    def __init__(self, allow_stub: bool):
        self.allow_stub = allow_stub
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if self.busy or (fullname not in NAMES and not (self.allow_stub and fullname in STUB_PACKAGES)):
            return None
        self.busy = True
        try:
            install_cupy_shim(allow_stub=self.allow_stub)
        finally:
            self.busy = False
        mod = sys.modules.get(fullname)
        if mod is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Present(mod), is_package=hasattr(mod, "__path__"))


class _Present(importlib.abc.Loader):
    """Loader of a module the shim already created."""

    def __init__(self, mod):
        self.mod = mod

    def create_module(self, spec):
        return self.mod

    def exec_module(self, module):
        return None


def install_import_hook(allow_stub: "bool | None" = None) -> None:
    """Append the lazy finder (once).  ``allow_stub`` None: from ``CUDNN_COMPAT_SHIM=stub``."""
    if allow_stub is None:
        allow_stub = _config.get(ENV) == "stub"
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder(allow_stub))


def remove_import_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


# -- the .pth file --------------------------------------------------------------------------------

def site_dir() -> str:
    """Where ``install-shim`` writes the .pth: the site-packages holding cudnn_compat."""
    import sysconfig
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    purelib = sysconfig.get_paths()["purelib"]
    return here if os.path.basename(here) in ("site-packages", "dist-packages") else purelib


def install_pth(directory: "str | None" = None) -> str:
    path = os.path.join(directory or site_dir(), PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


def remove_pth(directory: "str | None" = None) -> "str | None":
    path = os.path.join(directory or site_dir(), PTH_NAME)
    if os.path.exists(path):
        os.remove(path)
        return path
    return None


def cli_install_shim(args) -> int:
    """``cudnn-compat install-shim [--remove] [--dir D]``."""
    if getattr(args, "remove", False):
        path = remove_pth(args.dir)
        print(f"removed {path}" if path else "no cudnn_compat_shim.pth to remove")
        return 0
    path = install_pth(args.dir)
    print(f"wrote {path}\nSet {ENV}=1 (or {ENV}=stub to allow a stand-in cupy namespace without CuPy) to "
          f"install the cupy.cuda.cudnn / cupyx.cudnn shim at interpreter start; unset, it does nothing.")
    return 0
