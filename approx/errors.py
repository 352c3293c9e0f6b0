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
