"""Graph uids of the legacy families, handed out here instead of numbered by hand (issue 15).

A legacy graph binds the caller's buffers by uid at every call (``_core.call.run``: ``tensors`` and
``scalars`` are keyed by uid), so a family's uids are module constants that its graph builder and
its calls share.  ``Uids`` assigns them in the order a module asks for them, from one range per
kind of tensor (every legacy graph has its own uid space; the ranges keep the kinds apart):

  data tensors      DATA, DATA + 1, ...        the caller's buffers       ``Uids.data``
  priors            uid + PRIOR_OFFSET         an output's value before the call, read by a beta
                                               blend or a running-average update and bound to the
                                               output's buffer when the caller gives none
                                               (``_core.call.run``, ``_core.fastbind``): ``prior_uid``
  virtual tensors   VIRTUAL, VIRTUAL + 1, ...  intermediates              ``Uids.virtual``
  by-value scalars  SCALAR, SCALAR + 1, ...    alpha, beta, epsilon, ...  ``Uids.scalar``

``SHARED`` holds the output blend's alpha and beta (``_core.call.ALPHA``, ``_core.call.BETA``); a family's
``Uids(after=...)`` continues every range after the families whose graphs or scalars it reuses,
so their uids cannot meet; ``at=`` starts a block where a family's numbers were before this
allocator (they stay in persisted keys), never below a uid already handed out.  The numbers
depend only on the order of the requests, never on import order: they are the same in every
process, which the cudnn engine's autotune signatures (persisted in the plan-cache file) need.
``_core.bound_graph.GraphBuilder`` numbers the graphs it builds itself (they are bound by name, not
by uid).
"""
from __future__ import annotations

DATA, PRIOR_OFFSET, VIRTUAL, SCALAR = 1, 5000, 8001, 9001
_LIMIT = {"data": VIRTUAL - PRIOR_OFFSET, "virtual": SCALAR, "scalar": None}  # first uid past each range


def prior_uid(uid: int) -> int:
    """The uid of data tensor ``uid``'s value before the call (bound to the same buffer)."""
    return uid + PRIOR_OFFSET


class Uids:
    """The uids of one family's graphs, assigned in the order asked for."""

    def __init__(self, after: "Uids | None" = None):
        self._next = dict(after._next) if after is not None else {"data": DATA, "virtual": VIRTUAL, "scalar": SCALAR}

    def _take(self, kind: str, n: "int | None", at: "int | None" = None):
        first = self._next[kind]
        if at is not None:  # a block whose numbers are kept from before: never below the next free uid
            if at < first:
                raise ValueError(f"{kind} uid {at} is taken (the next free one is {first})")
            first = self._next[kind] = at
        self._next[kind] = first + (1 if n is None else n)
        limit = _LIMIT[kind]
        if limit is not None and self._next[kind] > limit:
            raise ValueError(f"more {kind} uids than the range holds ({first}..{limit - 1})")
        return first if n is None else tuple(range(first, first + n))

    def data(self, n: "int | None" = None, at: "int | None" = None):
        """One data-tensor uid, or a tuple of ``n``; ``at``: starting there (numbers kept from before)."""
        return self._take("data", n, at)

    def virtual(self, n: "int | None" = None, at: "int | None" = None):
        """One virtual-tensor uid, or a tuple of ``n``; ``at`` as for ``data``."""
        return self._take("virtual", n, at)

    def scalar(self, n: "int | None" = None, at: "int | None" = None):
        """One by-value scalar uid, or a tuple of ``n``; ``at`` as for ``data``."""
        return self._take("scalar", n, at)


SHARED = Uids()
ALPHA, BETA = SHARED.scalar(2)  # the output blend's scalars (002 "Scaling Parameters")
