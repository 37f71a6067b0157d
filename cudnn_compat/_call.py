"""The shared path of every legacy compute call (architecture.md "Data flow of one
legacy call"): signature -> plan cache -> (on a miss) graph build -> plan -> bind the
variant pack -> execute.

Builders produce graphs with fixed uids per role; ``run`` binds each external uid of
the plan to the caller's buffer or scalar.  ``blend`` appends the output scaling of
002 "Scaling Parameters": y = alpha*result + beta*y, where beta == 0 adds no read of y
(the graph gets no y input at all, so NaN in y cannot leak).
"""
from __future__ import annotations

from _backend import planner
from _backend.ir import Operation, scalar as scalar_tensor, virtual
from ._data import bind

ALPHA, BETA = 9001, 9002  # uids of the output-blend scalars
Y_PRIOR_OFFSET = 5000  # uid of "y before the call" = uid(y) + this


def compute_dtype(dtype: str) -> str:
    """The arithmetic type legacy cuDNN uses for data of ``dtype`` (float, or double for double)."""
    return "float64" if dtype == "float64" else "float32"


def blend(result, y, beta_zero: bool, alpha_uid: int = ALPHA, beta_uid: int = BETA) -> Operation:
    """Pointwise op writing y = alpha*result (+ beta*y_prior); ``result`` is a virtual tensor."""
    ct = compute_dtype(y.dtype)
    alpha = scalar_tensor(alpha_uid, ct, "alpha")
    if beta_zero:
        return Operation("Pointwise", {"x": result, "alpha1": alpha}, {"y": y}, {"mode": "IDENTITY"})
    prior = type(y)(y.uid + Y_PRIOR_OFFSET, y.dims, y.strides, y.dtype, name=(y.name or "y") + "_prior")
    return Operation("Pointwise", {"x": result, "b": prior, "alpha1": alpha, "alpha2": scalar_tensor(beta_uid, ct, "beta")},
                     {"y": y}, {"mode": "ADD"})


def blended(kind: str, inputs: dict, out_role: str, y, beta_zero: bool, attrs: dict, tmp_uid: int = 8001,
            alpha_uid: int = ALPHA, beta_uid: int = BETA) -> list:
    """[op computing a virtual result, blend into y]: the common one-op legacy graph."""
    tmp = virtual(tmp_uid, y.dims, compute_dtype(y.dtype), f"{out_role}_result")
    return [Operation(kind, inputs, {out_role: tmp}, attrs), blend(tmp, y, beta_zero, alpha_uid, beta_uid)]


def _externals(plan) -> dict:
    ext = getattr(plan, "externals", None)
    if ext is None:
        ext = {t.uid: t for t in plan.graph.external_inputs()}
        ext.update({t.uid: t for t in plan.graph.external_outputs()})
        plan.externals = ext
    return ext


def run(handle, key: tuple, build, tensors: dict, scalars: dict, workspace=None, workspace_size: int = 0):
    """Execute the plan for ``key``.  ``tensors``: uid -> (data, argname); the prior-y uid of
    a blend is bound to the same buffer as y.  ``scalars``: uid -> float.  Returns the plan."""
    key = (handle.place, handle.device) + key
    plan = planner.get_plan(key, build, handle.place)
    data = {}
    for uid, t in _externals(plan).items():
        if t.is_by_value:
            data[uid] = scalars[uid]
        else:
            buf, argname = tensors[uid] if uid in tensors else tensors[uid - Y_PRIOR_OFFSET]
            data[uid] = bind(handle, buf, t, argname)
    return planner.execute(plan, data, workspace, workspace_size, handle.stream, key)
