"""The shared path of every legacy compute call (docs/architecture.md "One call,
end to end"): signature -> plan cache -> (on a miss) graph build -> plan -> bind the
variant pack -> execute.

Builders produce graphs with fixed uids per role; ``run`` binds each external uid of
the plan to the caller's buffer or scalar.  ``blend`` appends the output scaling of
002 "Scaling Parameters": y = alpha*result + beta*y, where beta == 0 adds no read of y
(the graph gets no y input at all, so NaN in y cannot leak).
"""
from __future__ import annotations

import functools
import threading

import numpy as np

from cudnn_compat._backend import planner
from cudnn_compat._backend import prepared as _prepared
from cudnn_compat._backend import steady as _steady
from . import fastbind as _fastbind
from .fastbind import program as _program
from cudnn_compat._backend.ir import GraphError, Operation, scalar as scalar_tensor, virtual
from .data import _CUPY_NDARRAY, WORKSPACE_TYPES, bind, cupy_ndarray, device_pointer, host_view
from .data import workspace_arg as _workspace_arg
from ..handle import on_device, wrong_device

from .uids import ALPHA, BETA, VIRTUAL, prior_uid  # uids of the output-blend scalars (uids.SHARED)
from .uids import PRIOR_OFFSET as Y_PRIOR_OFFSET  # uid of "y before the call" = uid(y) + this


def compute_dtype(dtype: str) -> str:
    """The arithmetic type legacy cuDNN uses for data of ``dtype`` (float, or double for double)."""
    return "float64" if dtype == "float64" else "float32"


def blend(result, y, beta_zero: bool, alpha_uid: int = ALPHA, beta_uid: int = BETA) -> Operation:
    """Pointwise op writing y = alpha*result (+ beta*y_prior); ``result`` is a virtual tensor."""
    ct = compute_dtype(y.dtype)
    alpha = scalar_tensor(alpha_uid, ct, "alpha")
    if beta_zero:
        return Operation("Pointwise", {"x": result, "alpha1": alpha}, {"y": y}, {"mode": "IDENTITY"})
    prior = type(y)(prior_uid(y.uid), y.dims, y.strides, y.dtype, name=(y.name or "y") + "_prior")
    return Operation("Pointwise", {"x": result, "b": prior, "alpha1": alpha, "alpha2": scalar_tensor(beta_uid, ct, "beta")},
                     {"y": y}, {"mode": "ADD"})


def blended(kind: str, inputs: dict, out_role: str, y, beta_zero: bool, attrs: dict, tmp_uid: int = VIRTUAL,
            alpha_uid: int = ALPHA, beta_uid: int = BETA) -> list:
    """[op computing a virtual result, blend into y]: the common one-op legacy graph."""
    tmp = virtual(tmp_uid, y.dims, compute_dtype(y.dtype), f"{out_role}_result")
    return [Operation(kind, inputs, {out_role: tmp}, attrs), blend(tmp, y, beta_zero, alpha_uid, beta_uid)]


def plan_for(handle, key: tuple, build):
    """The cached plan ``run`` would use for ``key`` (built on a miss), without executing it:
    for workspace-size queries and algorithm searches."""
    if handle.switch and wrong_device(handle):  # issue 17: plans are built on the handle's device
        return on_device(handle, plan_for, handle, key, build)
    return planner.get_plan((handle.place, handle.device) + key, build, handle.place)


def _given(workspace, workspace_size: int) -> int:
    """Bytes of workspace a call gave (NULL counts as 0)."""
    return 0 if workspace is None or (isinstance(workspace, int) and workspace == 0) else int(workspace_size)


def check_workspace(plan, workspace, workspace_size: int, argname: str = "workSpaceSizeInBytes") -> None:
    """BAD_PARAM when the caller's workspace is smaller than the plan needs (NULL counts as 0 bytes)."""
    need = int(plan.workspace_size)
    have = _given(workspace, workspace_size)
    if have < need:
        from ..errors import bad_param
        raise bad_param(argname, f"the plan needs {need} bytes of workspace, {have} were given")


WORKSPACE_LIMIT = "workspace_limit"  # marks the plan-cache key of a plan made for a call's workspace


def fit_workspace(handle, plan, key: tuple, build, workspace, workspace_size: int, argname: str) -> tuple:
    """(plan, its plan-cache key) for a call given ``workspace``/``workspace_size`` bytes: ``plan``
    (of ``key``) when that is enough, else the plan of the same graph made under that limit
    (``graph.workspace_limit``: each engine takes its fastest config whose plan fits, the planner no
    plan that needs more; cached under ``key`` + the limit).  So a call given at least what the
    workspace query answered for its descriptors and algo runs, whichever config the query's plan
    and the call's plan got (002 §5.2.24: that size is enough for the call).  BAD_PARAM
    (``check_workspace``) only when no engine has a plan that fits."""
    have = _given(workspace, workspace_size)
    if have >= int(plan.workspace_size):
        return plan, key
    if have >= 0:
        def limited():
            graph = build()
            graph.workspace_limit = have
            return graph
        lkey = key + ((WORKSPACE_LIMIT, have),)
        try:
            fit = planner.get_plan(lkey, limited, handle.place)
        except GraphError:  # no engine has a plan within ``have`` bytes
            fit = None
        if fit is not None and int(fit.workspace_size) <= have:
            return fit, lkey
    check_workspace(plan, workspace, workspace_size, argname)
    return plan, key


# -- interception point (cudnn_compat/tools/trace.py records, cudnn_compat/tools/fuse.py defers) ----------------
# HOOKS holds interceptors hook(proceed, handle, key, build, tensors, scalars, workspace, workspace_size,
# workspace_arg) -> plan | None; each calls ``proceed`` with the same arguments to go on (or defers).
# Empty in normal use: the only cost of this hook point is one truth test per call.
HOOKS: list = []


def _intercepted(i: int, *args):
    if i == len(HOOKS):
        return run(*args, _hooked=True)
    return HOOKS[i](lambda *a: _intercepted(i + 1, *a), *args)


def run(handle, key: tuple, build, tensors: dict, scalars: dict, workspace=None, workspace_size: int = 0,
        workspace_arg: "str | None" = None, _hooked: bool = False):
    """Execute the plan for ``key``.  ``tensors``: uid -> (data, argname); the prior-y uid of
    a blend is bound to the same buffer as y.  ``scalars``: uid -> float.  Returns the plan.
    With ``workspace_arg`` (the size argument's name) the workspace is checked first: a plan that
    needs more than the call gave is replaced by one made to fit it (``fit_workspace``).

    The steady path (issue 26 item 1): a key object that comes back call after call (the families
    keep theirs in their memo and call-site entries) finds its *prepared call*
    (``_backend.prepared``: the cached plan, the binder generated for it, its engine's
    launcher) by identity, and that call runs it: no hashing of the key, no variant-pack dict.
    Anything the prepared call does not take (a buffer of another form, no record yet for this
    stream, too little workspace) goes the general way: the plan-cache lookup, one pass over the
    plan's binding program (``program``: per tensor a buffer check and a view, or a raw device
    pointer for plans that take them), ``planner.execute``.  Every check runs before the engine
    writes."""
    if handle.switch and wrong_device(handle):  # issue 17: run on the handle's device (several GPUs only)
        return on_device(handle, run, handle, key, build, tensors, scalars, workspace, workspace_size, workspace_arg,
                         _hooked)
    if HOOKS and not _hooked:
        return _intercepted(0, handle, key, build, tensors, scalars, workspace, workspace_size, workspace_arg)
    place = handle.place
    if workspace is not None:
        workspace = _workspace(place, workspace)
    prep = _PREPARED[place].get(id(key))
    if prep is None or prep.owner is not key:
        prep = _by_value(place, key)
    if prep is not None and prep.device == handle.device and not prep.plan.retired \
            and not _OV and _K_ENGINE not in _ENVIRON and _K_FALLBACK not in _ENVIRON:  # _DEFAULTS(), inlined
        if workspace_arg is None or _given(workspace, workspace_size) >= int(prep.plan.workspace_size):
            plan = prep(tensors, scalars, handle.stream,
                        workspace if workspace is None else _engine_workspace(place, workspace), workspace_size)
            if plan is not None:
                _LAST.plan = plan
                return plan
    orig_key, key = key, (place, handle.device) + key
    full_key = key
    plan = planner.get_plan(key, build, place)
    if workspace_arg is not None:
        plan, key = fit_workspace(handle, plan, key, build, workspace, workspace_size, workspace_arg)
    workspace = _engine_workspace(place, workspace)
    data, staged = {}, None
    if place == "cpu":
        data = _host_data(_program(plan), tensors, scalars)
    else:
        # plans that take raw device pointers (the cudnn engine, launch records) skip building CuPy
        # views; a contiguous CuPy array big enough for the tensor is its pointer (device_pointer's fast path)
        raw = plan.raw_pointers
        nd = _CUPY_NDARRAY[0] if _CUPY_NDARRAY else cupy_ndarray()
        # the plan's generated binder (_fastbind) makes this loop's fast-path test for every tensor
        # at once; None when some buffer needs the loop (its checks and errors)
        bound = _fastbind.binder(plan)(tensors, scalars) if raw else None
        if bound is not None:
            data = bound
        for uid, t, by_value, written, need, st, acc in (_program(plan) if bound is None else ()):
            if by_value:
                data[uid] = scalars[uid]
                continue
            buf, argname = tensors.get(uid) or tensors[uid - Y_PRIOR_OFFSET]
            if raw and type(buf) is nd and (buf.dtype is st or buf.dtype in acc) and (buf._c_contiguous or buf._f_contiguous) \
                    and buf.nbytes >= need:
                data[uid] = buf.data.ptr
                continue
            if isinstance(buf, np.ndarray):
                host_view(buf, t, argname, written)  # every check of a host buffer (dtype, size, read-only) first
                staged = {} if staged is None else staged
                dev = staged.get(id(buf))
                if dev is None:
                    dev = staged[id(buf)] = stage_to_device(buf, argname)
                buf = dev
            data[uid] = device_pointer(buf, t, argname, written) if raw else bind(handle, buf, t, argname, written)
    plan = planner.execute(plan, data, workspace, workspace_size, handle.stream, key)
    if staged:
        copy_back(plan, tensors, staged)
    elif key is full_key:  # no prepared call for a fitted plan
        _remember(plan, orig_key, key, place, handle.device)
    _LAST.plan = plan  # for last_plan(): which engine ran (cudnn-compat demo, explain)
    return plan


_run_py = run  # the Python run: the whole path, and the compiled run's general path


def _compiled_run():
    """``run`` with its steady path compiled (``_backend/_steady.c`` Run: the prepared-call part of
    ``run`` and ``Prepared.__call__`` in one C call, the rest ``_run_py``), or ``_run_py`` where the
    extension is not built or CUDNN_COMPAT_COMPILED=0 (read once, at import)."""
    compiled = _steady.module()
    if compiled is None:
        return _run_py
    return compiled.Run(_run_py, HOOKS, _PREPARED, _BY_VALUE, _OV, _ENVIRON, (_K_ENGINE, _K_FALLBACK), _LAST,
                        _prepared.CACHE.hit, _prepared.CACHE.touch_or_raise, _prepared.TOUCH_EVERY, planner.launch_failed,
                        _CUPY_NDARRAY)


def _workspace(place: str, workspace):
    """A call's workspace argument after its rules: a library object or anything else that is no
    buffer is BAD_PARAM (``workspace_arg``), and so is a nonzero int on the CPU place (a host
    pointer is a ctypes.c_void_p there); NULL stays as given."""
    if type(workspace) not in WORKSPACE_TYPES:
        return _workspace_arg(place, workspace)
    if place == "cpu" and type(workspace) is int and workspace:
        _workspace_arg(place, workspace)  # raises
    return workspace


def _engine_workspace(place: str, workspace):
    """The workspace an engine gets: a host array on a GPU handle is none (the engine uses
    device scratch of its own); its size still counts as given (``fit_workspace``)."""
    return None if type(workspace) is np.ndarray and place != "cpu" else workspace


# -- prepared calls: id(key object) -> Prepared (owner: that object), and key -> Prepared -----------
# A family whose key tuple is the same object call after call (kept in its _memo entry) finds its
# prepared call by identity (no hashing); a family that makes its key anew per call (a convolution
# backward bias, SetTensor, the divisive normalization...) finds it by value (one hash of the key,
# still far less than the general way).  A plan is prepared on its key's second general-path call
# (``_SEEN``: keys seen once).  The key objects are held by the entries (``owner``, ``_SEEN``), so an
# id in the tables cannot name another tuple while its entry lives.
_PREPARED: dict = {"cpu": {}, "gpu": {}}  # per place (one key object serves both places' calls)
_BY_VALUE: dict = {"cpu": {}, "gpu": {}}  # per place: key -> Prepared
PREPARED_MAX = 1024
_SEEN: dict = {}  # (place, key) -> True: the keys of general-path calls not prepared yet
_DEFAULTS = planner.DEFAULTS_APPLY  # config.unset_fast: no forced engine, fallback on, no override
_ENVIRON, (_K_ENGINE, _K_FALLBACK), _OV = planner.DEFAULTS_PARTS  # the same test in pieces, for run's steady path


def _by_value(place: str, key: tuple):
    """The prepared call of a key equal to ``key`` on ``place`` (None if none)."""
    try:
        return _BY_VALUE[place].get(key)
    except TypeError:  # an unhashable item: no prepared call
        return None


def _prepared_of(place: str, key: tuple):
    """The prepared call of ``key`` on ``place``: by identity, else by value; None if none."""
    prep = _PREPARED[place].get(id(key))
    return prep if prep is not None and prep.owner is key else _by_value(place, key)


def _remember(plan, key_obj: tuple, full_key: tuple, place: str, device) -> None:
    """Prepare ``plan`` for ``key_obj`` when an equal key came with an earlier general-path call
    too and ``plan`` is the cached plan of ``full_key`` (no forced engine in the environment)."""
    seen = (place,) + full_key
    try:
        if seen not in _SEEN:
            if len(_SEEN) >= PREPARED_MAX:
                _SEEN.clear()
            _SEEN[seen] = True
            return
    except TypeError:  # an unhashable key: never prepared
        return
    if not _DEFAULTS():
        return
    if place == "cpu":
        bind = _host_binder(plan)
    elif plan.launch_order:
        bind = _fastbind.values(plan)
    else:  # no launcher: the generated variant-pack binder (raw-pointer plans), the dict to planner.execute
        bind = _fastbind.binder(plan) if plan.raw_pointers else None
    prep = _prepared.prepare(plan, full_key, bind, key_obj, device)
    if prep is None or prep.place != place:
        return
    table, byval = _PREPARED.setdefault(place, {}), _BY_VALUE.setdefault(place, {})
    if len(table) >= PREPARED_MAX or len(byval) >= PREPARED_MAX:
        table.clear()
        byval.clear()
    table[id(key_obj)] = prep
    byval[key_obj] = prep
    _SEEN.pop(seen, None)
    _steady.bump()  # the compiled replays' resolved prepared calls are stale


def _host_data(prog: tuple, tensors: dict, scalars: dict) -> dict:
    """The CPU place's variant pack of a plan's binding program ``prog``: a strided NumPy view per
    tensor (every check of ``host_view``), the scalars as given."""
    data = {}
    for uid, t, by_value, written, _need, _st, _acc in prog:
        if by_value:
            data[uid] = scalars[uid]
            continue
        buf, argname = tensors.get(uid) or tensors[uid - Y_PRIOR_OFFSET]
        data[uid] = host_view(buf, t, argname, written)
    return data


def _host_binder(plan):
    """The CPU place's binder of ``plan``'s prepared call: ``_host_data`` over its program."""
    return functools.partial(_host_data, _program(plan))  # no Python frame of its own


def cached_plan(handle, key: tuple, build):
    """``plan_for``, or the plan of ``key``'s prepared call when it has a valid one (no hashing of
    the key; not counted as a plan-cache hit: the call that runs it next counts one)."""
    prep = _prepared_of(handle.place, key)
    if prep is not None and prep.device == handle.device and not prep.plan.retired and _DEFAULTS():
        return prep.plan
    return plan_for(handle, key, build)


def clear_prepared() -> None:
    """Forget every prepared call (tests)."""
    for table in list(_PREPARED.values()) + list(_BY_VALUE.values()):
        table.clear()
    _SEEN.clear()
    _steady.bump()  # the compiled replays' resolved prepared calls are stale


def _read_only(argname: str):
    from ..errors import bad_param  # rule: an output buffer must be writable (checked before any write)
    return bad_param(argname, "is a read-only array but the call writes it")


def stage_to_device(host: np.ndarray, argname: str):
    """A NumPy argument on a GPU handle: its bytes go to a device copy (docs/conventions.md
    "Data"); outputs are copied back after the call."""
    import cupy
    if not (host.flags.c_contiguous or host.flags.f_contiguous) or host.dtype.hasobject:
        from ..errors import bad_param  # rule: raw, contiguous memory only
        raise bad_param(argname, "must be a contiguous buffer of raw memory (legacy calls take a pointer)")
    return cupy.asarray(host.reshape(-1, order="A").view(np.uint8))


def copy_back(plan, tensors: dict, staged: dict) -> None:
    for t in plan.graph.external_outputs():
        if t.uid in tensors:
            host = tensors[t.uid][0]
            dev = staged.get(id(host))
            if dev is not None:
                host.reshape(-1, order="A").view(np.uint8)[...] = dev.get()


# per thread: the plan of the thread's last call (``_steady.ThreadLast`` where the extension is built:
# the compiled run's store is one dict store; else a threading.local)
_LAST = _steady.module().ThreadLast() if _steady.module() is not None else threading.local()
run = _compiled_run()


def last_plan():
    """The plan the last legacy call on this thread executed (None before any)."""
    return getattr(_LAST, "plan", None)


def set_last_plan(plan) -> None:
    """What a call that ran outside ``run`` (attention's fused path) reports to ``last_plan``."""
    _LAST.plan = plan
