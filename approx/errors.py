"""The errors a user can fix when building candidate NNs.

Each names the NN and the knob at fault and says what to change, so a search that
runs for hours fails in its first second on a bad spec, not in its third hour.
"""

from __future__ import annotations

from qaopt.app_spec.errors import QaoptError


class ApproxError(QaoptError):
    """A candidate NN that cannot be built as asked."""

    def __init__(self, nn: str, knob: str, problem: str):
        self.nn, self.knob = nn, knob
        super().__init__(f"NN {nn!r}, knob {knob!r}: {problem}")


class EntryPointFailed(QaoptError):
    """An NN's ``model`` or ``data`` entry point raised: the user's code, named with the NN and the field."""

    def __init__(self, nn: str, field: str, entry_point: str, exc: BaseException):
        self.nn, self.field = nn, field
        self.detail = (f"{entry_point} raised {type(exc).__name__}: {exc}; fix that entry point (`qaopt validate SPEC` "
                       "runs it)")
        super().__init__(f"nns.{nn}.{field}: {self.detail}")
