"""cudnnStatus_t and CuDNNError (002 §3.1.2.23 cudnnStatus_t, §3.2.43 cudnnGetErrorString).

Every rejected call raises ``CuDNNError`` before anything is written; the message
names the function, the argument and the rule it broke.  Helpers ``bad_param`` and
``not_supported`` build them; ``_core.registry.legacy`` fills in the function name.
"""
from __future__ import annotations

from .enums import ENUMS

STATUS = dict(ENUMS["cudnnStatus_t"])
STATUS_NAME = {v: k for k, v in STATUS.items()}
globals().update(STATUS)


def getErrorString(status: int) -> str:
    """002 §3.2.43: the enum name, or CUDNN_UNKNOWN_STATUS."""
    return STATUS_NAME.get(int(status), "CUDNN_UNKNOWN_STATUS")


class CuDNNError(RuntimeError):
    """A failed legacy call: ``.status`` (int), ``.status_name``, ``.function``, ``.argument``, ``.rule``
    and ``.message`` (the text: ``STATUS_NAME: function: argument: rule``, empty parts left out, so
    ``str(CuDNNError(3)) == "CUDNN_STATUS_BAD_PARAM"``).

    Errors cross process boundaries (``pickle``, ``copy.deepcopy``, ``ProcessPoolExecutor``): every
    field and any attribute set on the error (``check``, CuPy's ``add_info`` lines) come back."""

    def __init__(self, status: int, argument: str = "", rule: str = "", function: str = ""):
        self.status = int(status)
        self.argument = argument
        self.rule = rule
        self.function = function
        super().__init__(self._text())

    @property
    def status_name(self) -> str:
        return getErrorString(self.status)

    @property
    def message(self) -> str:
        return self._text()

    def _text(self) -> str:
        return ": ".join(p for p in (self.status_name, self.function, self.argument, self.rule) if p)

    def with_function(self, function: str) -> "CuDNNError":
        if not self.function:
            self.function = function
            self.args = (self._text(),)
        return self

    def __reduce__(self):
        # rebuilt through __init__ with every field, then any other attribute (``check``, ``_infos``)
        state = {k: v for k, v in self.__dict__.items() if k not in ("status", "argument", "rule", "function")}
        return (type(self), (self.status, self.argument, self.rule, self.function), state or None)


class CuDNNArgumentError(CuDNNError, TypeError):
    """A call that does not fit the function's Python signature (an unknown keyword, too many or
    too few arguments): ``CUDNN_STATUS_BAD_PARAM`` with ``argument`` ``"arguments"`` and a rule that
    names the bad keyword or count and shows the signature.  Also a ``TypeError``, so code written
    for Python's own call errors catches it too."""


def bad_param(argument: str, rule: str) -> CuDNNError:
    return CuDNNError(CUDNN_STATUS_BAD_PARAM, argument, rule)  # noqa: F821


def not_supported(argument: str, rule: str) -> CuDNNError:
    return CuDNNError(CUDNN_STATUS_NOT_SUPPORTED, argument, rule)  # noqa: F821


def check(cond: bool, argument: str, rule: str, status: int = 3) -> None:
    """Raise CuDNNError(status) naming ``argument`` and ``rule`` unless ``cond``."""
    if not cond:
        raise CuDNNError(status, argument, rule)
