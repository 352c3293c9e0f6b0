"""The calibration errors a user can fix (bad spaces, budgets, NN names, residuals)."""

from __future__ import annotations

from qaopt.app_spec.errors import QaoptError


class CalibrationError(QaoptError):
    """A calibration cannot start or continue because of its input; the message says the fix."""
