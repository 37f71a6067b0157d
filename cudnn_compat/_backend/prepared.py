"""Prepared calls (issue 26 item 1): a cached plan with the binder and launcher of its steady
path, so that a repeated legacy call is one lookup and one call (docs/architecture.md "One call,
end to end").

A ``Prepared`` holds the plan of one call signature, its plan-cache key, and two functions:

  bind(tensors, scalars) -> values | None
        supplied by the legacy layer (``cudnn_compat._core.fastbind``, generated once per plan):
        every check of the caller's buffers that the general binding makes, for the common forms
        (a contiguous CuPy array of the tensor's data type, big enough; a device pointer), giving
        the values in ``plan.launch_order``; None for anything else (the general binding then
        binds, and raises what it raises)
  plan.launch(values, stream, workspace, workspace_size) -> bool
        supplied by the engine: the cupy engine's launch records (patch, launch or replay a CUDA
        graph), the cudnn engine's cached variant pack (execute, or replay its CUDA graph); False
        when it cannot run the call from the cache (no record for this stream yet, a pack not made
        yet, a capture in progress...), having done nothing

A plan whose engine has no launcher (``launch_order`` empty: the CPU place's engines, the cupy
engine's plans with Python steps) is prepared too: ``bind`` then gives the variant pack's dict
(the CPU place: strided NumPy views, every check of the general binding; the GPU place, for
plans that take raw pointers: the generated variant-pack binder's addresses) and the call is
``planner.execute`` (fallback on failure included), without the plan-cache lookup by key.

``prepared(tensors, scalars, stream, workspace, workspace_size)`` returns the plan that ran, or
None when the general path must run the call (the caller then plans, binds and executes it
through ``planner.execute``, which makes what the launcher lacked).  A call that ran counts as a
plan-cache hit; every ``TOUCH_EVERY + 1``-th call moves the plan to the LRU end (hashing the key
costs half a call), so a plan in use stays among the recently used unless over
CUDNN_COMPAT_PLAN_CACHE_SIZE other signatures are planned between two moves.  A prepared call
whose plan left the cache (``plan.retired``) is stale: the caller drops it.
"""
from __future__ import annotations

from .plan_cache import CACHE
from .planner import execute, launch_failed

TOUCH_EVERY = 63  # a mask: every 64th call moves the plan
_HIT = CACHE.hit


class Prepared:
    """A plan ready to run from the caller's buffers (see the module docstring).  ``owner``: what
    the caller finds it by (the legacy layer's key object); ``place``, ``device``: where it runs."""

    __slots__ = ("plan", "key", "bind", "calls", "owner", "place", "device", "via_execute")

    def __init__(self, plan, key, bind, owner=None, device=None):
        self.plan, self.key, self.bind, self.owner = plan, key, bind, owner
        self.place, self.device = plan.place, device
        self.via_execute = not plan.launch_order  # no launcher: ``bind`` gives the variant pack's dict
        self.calls = 0

    def __call__(self, tensors: dict, scalars: dict, stream, workspace=None, workspace_size: int = 0):
        values = self.bind(tensors, scalars)
        if values is None:
            return None
        plan = self.plan
        if self.via_execute:  # a plan without a launcher: the variant pack's dict to planner.execute
            plan = execute(plan, values, workspace, workspace_size, stream, self.key)
        else:
            try:
                if not plan.launch(values, stream, workspace, workspace_size):
                    return None
            except Exception as e:  # noqa: BLE001 - the general path decides
                return launch_failed(plan, e) or None
        _HIT()
        self.calls += 1
        if not self.calls & TOUCH_EVERY:
            CACHE.touch(self.key)
        return plan

    def __repr__(self):
        return f"Prepared({self.plan.config}, calls={self.calls})"


def prepare(plan, key, bind, owner=None, device=None) -> "Prepared | None":
    """The prepared call of ``plan`` (cached under ``key``) with the legacy layer's ``bind``; None
    when there is no binder or ``plan`` is not the cached plan of ``key`` (a forced engine, a fitted
    workspace plan: the general path runs)."""
    if bind is None or not CACHE.holds(key, plan):
        return None
    return Prepared(plan, key, bind, owner, device)
