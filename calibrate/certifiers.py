"""Region certifiers: how an :class:`~qaopt.calibrate.region.ErrorRegion` decides which points are certified valid.

A certifier gives a region two things: its model of P(valid) over the error space
(``predict_proba`` on unit-cube rows: the ``predicted`` mode, plots, the field plan),
and the set it certifies at the spec's confidence (the ``certified`` mode). The
built-ins:

- ``pooled`` (the default): one monotone model of the failure probability fitted to
  every injected run at every point (:class:`~qaopt.calibrate.pooled.PooledCertifier`),
  with a confidence that holds for the region as a whole; the field's decided verdicts
  overrule it by monotonicity;
- ``per-point``: what is dominated by a point its own runs accepted (and dominates no
  rejected one), ApproxCaliper's rule; its P(valid) is a monotone classifier
  (:class:`~qaopt.calibrate.classifier.MonotoneProbability`).

The names a spec may write in ``calibration.certifier`` are those of
:data:`CERTIFIERS`, an open registry: a plugin module adds one with
:func:`register_certifier` (docs/extending.md, "Adding a region strategy or certifier").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from qaopt.calibrate.classifier import MonotoneProbability
from qaopt.calibrate.errors import CalibrationError
from qaopt.calibrate.pooled import PooledCertifier
from qaopt.calibrate.registry import Registry

if TYPE_CHECKING:
    from qaopt.calibrate.region import ErrorRegion

POOLED, PER_POINT = "pooled", "per-point"


class ValidityModel(Protocol):
    """P(valid) over the error space: ``predict_proba(U)`` for unit-cube points (rows)."""

    def predict_proba(self, U: np.ndarray) -> np.ndarray: ...


class Certifier(Protocol):
    """How a region judges its points; it reads the region's observations, never changes them.

    ``model(region)`` is fitted once per set of observations (the region caches it and
    drops it when an observation is added); ``certified(region, U)`` says, for
    unit-cube points (rows), which are certified valid at the region's confidence.
    """

    def model(self, region: ErrorRegion) -> ValidityModel: ...

    def certified(self, region: ErrorRegion, U: np.ndarray) -> np.ndarray: ...


CERTIFIERS: Registry[Certifier] = Registry(
    "certifier", "calibration.certifier",
    "register one with qaopt.calibrate.register_certifier(name, certifier) in a module the spec names in "
    "plugins: [module] (see docs/extending.md, 'Adding a region strategy or certifier')")
"""Every certifier a spec may name, in registration order (the built-ins first)."""


def register_certifier(name: str, certifier: Certifier) -> Certifier:
    """Make ``name`` a certifier a spec (``calibration.certifier``) can use."""
    return CERTIFIERS.register(name, certifier)


def unregister_certifier(name: str) -> None:
    """Remove the certifier ``name`` (a test's, a plugin's); unknown names are ignored."""
    CERTIFIERS.unregister(name)


class Pooled:
    """The pooled model of every run certifies the region as a whole (:class:`PooledCertifier`)."""

    def model(self, region: ErrorRegion) -> PooledCertifier:
        X, n, k = region.runs()
        if not len(X):
            raise CalibrationError("the region has no simulator runs yet; it cannot judge any point")
        return PooledCertifier(X, n, k, region.acceptance.max_failure_rate, region.acceptance.confidence,
                               region.field_verdicts())

    def certified(self, region: ErrorRegion, U: np.ndarray) -> np.ndarray:
        return region.model.certified(U)


class PerPoint:
    """ApproxCaliper's rule: certified where a point its own runs accepted dominates (monotonicity alone)."""

    def model(self, region: ErrorRegion) -> MonotoneProbability:
        return MonotoneProbability().fit(*region.unit_labels())

    def certified(self, region: ErrorRegion, U: np.ndarray) -> np.ndarray:
        return region.dominance().labels(U) > 0


register_certifier(POOLED, Pooled())
register_certifier(PER_POINT, PerPoint())
