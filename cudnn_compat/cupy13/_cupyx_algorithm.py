"""``cupyx.cudnn``'s convolution algorithm selection and its per-shape caches (CuPy 13's
``_find_algorithm_*`` / ``_get_algorithm_*`` and their six caches): ``auto_tune`` times the
candidates with cudnnFind*AlgorithmEx (002 §5.2.16 and the backward ones), else the heuristics
of cudnnGet*Algorithm_v7 (002 §5.2.23, ...) choose.  One row of ``_DIRECTIONS`` per direction."""
from __future__ import annotations

import warnings as _warnings

from . import cupy_cudnn as cudnn
from ._cupyx_place import _alloc, _device_id, _mem, _mem_size, _performance_warning, _place


class _Algorithm:
    """A chosen algorithm: ``algo``, ``memory`` (workspace bytes) and ``mathType``."""

    __slots__ = ("algo", "memory", "mathType")

    def __init__(self, algo, memory, mathType=0):
        self.algo, self.memory, self.mathType = int(algo), int(memory), int(mathType)

    def __repr__(self):
        return f"_Algorithm(algo={self.algo}, memory={self.memory}, mathType={self.mathType})"


# keyed by (device, shapes, conv_param, max workspace): Find (auto_tune) and Get_v7 results
_get_algorithm_fwd_cache: dict = {}
_get_algorithm_bwd_filter_cache: dict = {}
_get_algorithm_bwd_data_cache: dict = {}
_algorithm_fwd_cache: dict = {}
_algorithm_bwd_filter_cache: dict = {}
_algorithm_bwd_data_cache: dict = {}


def _warn_tensor_core(kind, shapes, conv_param):
    _warnings.warn("Tensor Core mode is set but the selected convolution {} algorithm is not a Tensor Core "
                   "enabled algorithm. This might be due to lack of workspace memory. {}, pad:{}, stride:{}"
                   .format(kind, shapes, conv_param[0], conv_param[1]), _performance_warning())


class _Direction:
    """One row of ``_DIRECTIONS``: how CuPy 13 searches the algorithm of one convolution direction
    and runs it.  Its helpers take (a, b, c, conv_param, handle, a_desc, b_desc, conv_desc, c_desc,
    ...): the three arrays and descriptors in the order the Find*Ex_v7 function (and the direction's
    cudnnConvolution* call, 002 §3.2) takes them."""

    __slots__ = ("find", "get", "find_cache", "get_cache", "kind", "names", "shape_order", "x", "skip_warning",
                 "run", "w", "dilation_drops_tensor_core")

    def __init__(self, find, get, find_cache, get_cache, kind, names, shape_order, x, skip_warning, run, w,
                 dilation_drops_tensor_core):
        self.find, self.get = find, get  # cudnn.find*AlgorithmEx_v7, cudnn.get*Algorithm_v7 (by name: patchable)
        self.find_cache, self.get_cache = find_cache, get_cache  # CuPy 13's two caches of the direction
        self.kind, self.names = kind, names  # the warnings' words: "forward", and the arrays' names
        self.shape_order = shape_order  # the arrays whose shapes key the caches, in CuPy 13's key order
        self.x = x  # which array is x (its device keys the caches, its place gets the Find workspace)
        self.skip_warning = skip_warning  # Get warns of a skipped faster algorithm: "always" or "tensor_core"
        self.run = run  # the cudnn.convolution* function that runs the direction (by name: patchable)
        self.w = w  # which array is the filter (a filter descriptor; the other two get tensor descriptors)
        self.dilation_drops_tensor_core = dilation_drops_tensor_core  # CuPy 13: no Tensor Core math if dilated


_DIRECTIONS = {
    "fwd": _Direction("findConvolutionForwardAlgorithmEx_v7", "getConvolutionForwardAlgorithm_v7",
                      _algorithm_fwd_cache, _get_algorithm_fwd_cache, "forward", ("x", "W", "y"), (0, 1, 2), 0,
                      "always", "convolutionForward", 1, True),
    "bwd filter": _Direction("findConvolutionBackwardFilterAlgorithmEx_v7", "getConvolutionBackwardFilterAlgorithm_v7",
                             _algorithm_bwd_filter_cache, _get_algorithm_bwd_filter_cache, "backward filter",
                             ("x", "dy", "dW"), (0, 2, 1), 0, "tensor_core", "convolutionBackwardFilter_v3", 2,
                             False),
    "bwd data": _Direction("findConvolutionBackwardDataAlgorithmEx_v7", "getConvolutionBackwardDataAlgorithm_v7",
                           _algorithm_bwd_data_cache, _get_algorithm_bwd_data_cache, "backward data",
                           ("W", "x", "y"), (0, 1, 2), 1, "tensor_core", "convolutionBackwardData_v3", 0, True),
}


def _warn_algorithm(what, arrays, conv_param):
    d = _DIRECTIONS[what]
    _warn_tensor_core(d.kind, ", ".join("{}.shape:{}".format(n, a.shape) for n, a in zip(d.names, arrays)), conv_param)


def _warn_algorithm_fwd(x, W, y, conv_param):
    _warn_algorithm("fwd", (x, W, y), conv_param)


def _warn_algorithm_bwd_filter(x, dy, dW, conv_param):
    _warn_algorithm("bwd filter", (x, dy, dW), conv_param)


def _warn_algorithm_bwd_data(W, x, y, conv_param):
    _warn_algorithm("bwd data", (W, x, y), conv_param)


def _search(what, auto_tune, arrays, conv_param, handle, descs, max_workspace_size, use_tensor_core,
            deterministic=False):
    """The algorithm of direction ``what`` (a ``_DIRECTIONS`` key) for CuPy 13's six helpers:
    ``auto_tune``: the fastest measured one (Find*Ex_v7 with a max_workspace_size workspace, cached
    in the direction's Find cache), else the heuristics' first within max_workspace_size (Get_v7,
    its Get cache).  ``arrays``: (a, b, c); ``descs``: (a_desc, b_desc, conv_desc, c_desc)."""
    d = _DIRECTIONS[what]
    x = arrays[d.x]
    key = (_device_id(x),) + tuple(arrays[i].shape for i in d.shape_order) + (conv_param, max_workspace_size)
    da, db, dconv, dc = descs
    (a, b, c) = arrays
    if auto_tune:
        algo = _find(d.find_cache, key, lambda n, ws, size: getattr(cudnn, d.find)(
            handle, da, a, db, b, dconv, dc, c, n, ws, size), max_workspace_size, _place(x), deterministic)
    else:
        algo = _get(d.get_cache, key, lambda n: getattr(cudnn, d.get)(handle, da, db, dconv, dc, n),
                    max_workspace_size, what, deterministic,
                    warn_skip=True if d.skip_warning == "always" else use_tensor_core)
    if use_tensor_core and algo.mathType != cudnn.CUDNN_TENSOR_OP_MATH:
        _warn_algorithm(what, arrays, conv_param)
    return algo


def _find(cache, key, find, max_workspace_size, place, deterministic=False):
    """auto_tune: the fastest measured algorithm (Find*Ex_v7 with a max_workspace_size workspace)."""
    algo = cache.get(key)
    if algo is not None:
        return algo
    workspace = _alloc(max_workspace_size, place)
    ret = find(10 if deterministic else 1, _mem(workspace), _mem_size(workspace))
    if deterministic:
        ret = [p for p in ret if p.determinism]
        if not ret:
            raise RuntimeError("No conv bwd filter algo available with workspace size less equal {}"
                               .format(max_workspace_size))
    perf = ret[0]
    if perf.status != cudnn.CUDNN_STATUS_SUCCESS:
        raise RuntimeError("No available algorithm found.")
    algo = cache[key] = _Algorithm(perf.algo, perf.memory, perf.mathType)
    return algo


def _get(cache, key, get_v7, max_workspace_size, what, deterministic=False, warn_skip=True):
    """Heuristics: the first Get_v7 result within max_workspace_size (and deterministic if asked)."""
    algo = cache.get(key)
    if algo is not None:
        return algo
    skip = False
    for perf in get_v7(10):
        if perf.status != cudnn.CUDNN_STATUS_SUCCESS or (deterministic and not perf.determinism):
            continue
        if perf.memory <= max_workspace_size:
            break
        skip = True
    else:
        raise RuntimeError("No conv {} algo available with workspace size less equal {}"
                           .format(what, max_workspace_size))
    if skip and warn_skip:
        _warnings.warn("The best algo of conv {} might not be selected due to lack of workspace size ({})"
                       .format(what, max_workspace_size), _performance_warning())
    algo = cache[key] = _Algorithm(perf.algo, perf.memory, perf.mathType)
    return algo


# CuPy 13's six helpers (their names and signatures), each one row of _DIRECTIONS through _search
def _find_algorithm_fwd(x, W, y, conv_param, handle, x_desc, filter_desc, conv_desc, y_desc, max_workspace_size,
                        use_tensor_core):
    return _search("fwd", True, (x, W, y), conv_param, handle, (x_desc, filter_desc, conv_desc, y_desc),
                   max_workspace_size, use_tensor_core)


def _get_algorithm_fwd(x, W, y, conv_param, handle, x_desc, filter_desc, conv_desc, y_desc, max_workspace_size,
                       use_tensor_core):
    return _search("fwd", False, (x, W, y), conv_param, handle, (x_desc, filter_desc, conv_desc, y_desc),
                   max_workspace_size, use_tensor_core)


def _find_algorithm_bwd_filter(x, dy, dW, conv_param, handle, x_desc, dy_desc, conv_desc, filter_desc,
                               max_workspace_size, use_tensor_core, deterministic):
    return _search("bwd filter", True, (x, dy, dW), conv_param, handle, (x_desc, dy_desc, conv_desc, filter_desc),
                   max_workspace_size, use_tensor_core, deterministic)


def _get_algorithm_bwd_filter(x, dy, dW, conv_param, handle, x_desc, gy_desc, conv_desc, filter_desc,
                              max_workspace_size, use_tensor_core, deterministic):
    return _search("bwd filter", False, (x, dy, dW), conv_param, handle, (x_desc, gy_desc, conv_desc, filter_desc),
                   max_workspace_size, use_tensor_core, deterministic)


def _find_algorithm_bwd_data(W, x, y, conv_param, handle, filter_desc, x_desc, conv_desc, y_desc,
                             max_workspace_size, use_tensor_core, deterministic):
    return _search("bwd data", True, (W, x, y), conv_param, handle, (filter_desc, x_desc, conv_desc, y_desc),
                   max_workspace_size, use_tensor_core, deterministic)


def _get_algorithm_bwd_data(W, x, y, conv_param, handle, filter_desc, x_desc, conv_desc, y_desc,
                            max_workspace_size, use_tensor_core, deterministic):
    return _search("bwd data", False, (W, x, y), conv_param, handle, (filter_desc, x_desc, conv_desc, y_desc),
                   max_workspace_size, use_tensor_core, deterministic)
