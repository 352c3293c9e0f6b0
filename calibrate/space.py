"""The error space: one axis per calibrated quantity, and the unit cube the searches work in.

An axis is one NN's declared error metric (``component="metric"``), or the bias or
standard deviation of its error (``"bias"``, ``"sigma"``) when a Gaussian's two
parameters are calibrated separately (e.g. heading bias x heading sigma x distance).
Searches work in ``[0, 1]^d`` so that no axis dominates by its unit; the region
reports and accepts errors in each axis' own unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from qaopt.app_spec.nn_errors import COMPONENTS, axis_name
from qaopt.calibrate.errors import CalibrationError


@dataclass(frozen=True)
class Axis:
    """One dimension of the error space, ``[min, max]`` in the NN output's unit.

    Larger values are assumed never to help the application (monotonicity), which is
    what lets a single accepted point certify everything below it.
    """

    nn: str
    max: float
    component: str = "metric"
    min: float = 0.0

    def __post_init__(self) -> None:
        if self.component not in COMPONENTS:
            raise CalibrationError(
                f"calibration.space: axis for NN '{self.nn}' has component '{self.component}'; "
                f"use one of {', '.join(COMPONENTS)}"
            )
        if not (np.isfinite(self.min) and np.isfinite(self.max)) or self.min < 0:
            raise CalibrationError(
                f"calibration.space: axis '{self.name}' needs finite bounds with min >= 0 "
                f"(got min={self.min}, max={self.max})"
            )
        if self.max <= self.min:
            raise CalibrationError(
                f"calibration.space: axis '{self.name}' has an empty error range "
                f"[{self.min}, {self.max}]; set max above min"
            )

    @property
    def name(self) -> str:
        """``heading`` for the NN's metric, ``heading.bias`` / ``heading.sigma`` otherwise."""
        return axis_name(self.nn, self.component)


class ErrorSpace:
    """An ordered set of axes with the maps between errors and unit-cube coordinates."""

    def __init__(self, axes: Iterable[Axis]):
        self.axes: tuple[Axis, ...] = tuple(axes)
        if not self.axes:
            raise CalibrationError("calibration.space: no axes; list at least one {nn, max} entry")
        names = [a.name for a in self.axes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise CalibrationError(f"calibration.space: axis {dup[0]!r} is listed twice; keep one")
        for a in self.axes:
            if a.component == "metric" and any(b.nn == a.nn and b.component != "metric" for b in self.axes):
                raise CalibrationError(
                    f"calibration.space: NN '{a.nn}' has both a metric axis and a bias/sigma axis; "
                    "calibrate either its metric or its (bias, sigma), not both"
                )
        self._lo = np.array([a.min for a in self.axes], dtype=float)
        self._span = np.array([a.max - a.min for a in self.axes], dtype=float)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def nns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.nn for a in self.axes))

    @property
    def dim(self) -> int:
        return len(self.axes)

    def check_nns(self, known: Sequence[str], where: str = "the evaluator") -> None:
        """Fail early, naming the NN, when an axis refers to an NN the application lacks."""
        for a in self.axes:
            if a.nn not in known:
                raise CalibrationError(
                    f"calibration.space: NN '{a.nn}' is not one of {where}'s NNs "
                    f"({', '.join(known) or 'none'}); fix the axis' nn name"
                )

    def to_unit(self, errors: Mapping[str, float]) -> np.ndarray:
        missing = [n for n in self.names if n not in errors]
        extra = [k for k in errors if k not in self.names]
        if missing or extra:
            raise CalibrationError(
                f"error vector {dict(errors)} does not match the calibrated axes {list(self.names)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {extra}" if extra else "")
            )
        x = np.array([float(errors[n]) for n in self.names])
        return (x - self._lo) / self._span

    def from_unit(self, u: np.ndarray) -> dict[str, float]:
        x = self._lo + np.asarray(u, dtype=float) * self._span
        return {n: float(v) for n, v in zip(self.names, x)}

    def settings(self, errors: Mapping[str, float]) -> dict[str, dict[str, float]]:
        """Group a point's coordinates per NN: ``{"heading": {"bias": 2.0, "sigma": 3.0}}``."""
        out: dict[str, dict[str, float]] = {}
        for a in self.axes:
            out.setdefault(a.nn, {})[a.component] = float(errors[a.name])
        return out

    def to_json(self) -> list[dict]:
        return [asdict(a) for a in self.axes]

    @classmethod
    def from_json(cls, data: list[dict]) -> ErrorSpace:
        return cls(Axis(**d) for d in data)
