"""Per-configuration summaries of field runs: distance and event rates with exact intervals.

Collisions along a run are rare, so a rate is reported with the exact (Garwood)
Poisson interval for the count over the distance driven: with 0 collisions in
300 m the rate is 0 per 100 m, but the data only say it is below about 1.2 per
100 m (95 %). A normal approximation would claim [0, 0].

Only the standard library is used (the interval's incomplete gamma function is computed
here), so that ``qaopt field summary`` runs on the robot's light install.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from .records import COLLISION, INTERVENTION, RunRecord


@dataclass(frozen=True)
class Rate:
    """``count`` events over ``distance_m``, as a rate per ``per_m`` with its interval."""

    count: int
    distance_m: float
    low: float
    high: float
    per_m: float = 100.0
    confidence: float = 0.95

    @property
    def value(self) -> float:
        return self.count / self.distance_m * self.per_m if self.distance_m > 0 else float("nan")

    def __str__(self) -> str:
        if self.distance_m <= 0:
            return "- (no distance)"
        return f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}]"


def poisson_rate(count: int, distance_m: float, *, confidence: float = 0.95,
                 per_m: float = 100.0) -> Rate:
    """Exact two-sided Poisson interval for a rate: ``count`` events over ``distance_m``.

    The bounds of the mean are the Garwood quantiles ``Gamma^-1(k, a/2)`` and
    ``Gamma^-1(k+1, 1-a/2)`` (equivalently ``chi2(2k)/2`` and ``chi2(2k+2)/2``), scaled
    to events per ``per_m`` metres.
    """
    if count < 0 or distance_m < 0:
        raise ValueError(f"count {count} and distance {distance_m} must be non-negative")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} must be in (0, 1)")
    if distance_m == 0:
        return Rate(count, 0.0, 0.0, float("inf"), per_m, confidence)
    alpha = 1.0 - confidence
    low = gamma_p_inverse(count, alpha / 2) if count > 0 else 0.0
    high = gamma_p_inverse(count + 1, 1 - alpha / 2)
    scale = per_m / distance_m
    return Rate(count, distance_m, low * scale, high * scale, per_m, confidence)


def gamma_p(a: float, x: float) -> float:
    """The regularized lower incomplete gamma function P(a, x), for a > 0 and x >= 0.

    Its series below ``a + 1`` and Lentz's continued fraction for ``Q = 1 - P`` above,
    each to double precision (Numerical Recipes, section 6.2).
    """
    if x <= 0.0:
        return 0.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-17:
            n += 1.0
            term *= x / n
            total += term
        return min(1.0, total * math.exp(log_prefix))
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return max(0.0, 1.0 - math.exp(log_prefix) * h)


def gamma_p_inverse(a: float, p: float) -> float:
    """The x with P(a, x) = p (scipy's ``gammaincinv``), by bisection to double precision."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability {p} must be in (0, 1)")
    low, high = 0.0, max(1.0, a)
    while gamma_p(a, high) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        if gamma_p(a, mid) < p:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


@dataclass(frozen=True)
class ConfigSummary:
    """The runs of one configuration (and injected error point, for calibration trials)."""

    application: str
    config_hash: str
    error_point: dict[str, float] | None
    nn_errors: dict[str, float]
    runs: int
    left_out: int
    """Runs not counted: incomplete (unless asked for) or with no known distance."""
    distance_m: float
    collisions: Rate
    interventions: Rate

    @property
    def point_label(self) -> str:
        point = self.error_point or {}
        return ", ".join(f"{k}={v:g}" for k, v in sorted(point.items())) or "-"


def summarize(records: Iterable[RunRecord], *, confidence: float = 0.95,
              include_incomplete: bool = False) -> list[ConfigSummary]:
    """Group runs by (application, configuration, error point) and total them.

    Complete and aborted runs count with their recorded distance. Incomplete runs
    (never ended) are left out by default: their distance is only the last odometer
    reading; ``include_incomplete`` counts them with it. A run with no known distance
    cannot count towards a rate and is left out.
    """
    groups: dict[tuple, list[RunRecord]] = defaultdict(list)
    for rec in records:
        groups[(rec.application, rec.config.hash,
                tuple(sorted((rec.error_point or {}).items())))].append(rec)
    out = []
    for key in sorted(groups):
        members = groups[key]
        runs = [r for r in members if r.known_distance_m is not None
                and (r.status != "incomplete" or include_incomplete)]
        distance = sum(r.known_distance_m for r in runs)
        nn_errors = next((r.config.nn_errors for r in members if r.config.nn_errors), {})
        out.append(ConfigSummary(
            application=key[0], config_hash=key[1], error_point=dict(key[2]) or None,
            nn_errors=dict(nn_errors), runs=len(runs), left_out=len(members) - len(runs),
            distance_m=distance,
            collisions=poisson_rate(sum(r.count(COLLISION) for r in runs), distance,
                                    confidence=confidence),
            interventions=poisson_rate(sum(r.count(INTERVENTION) for r in runs), distance,
                                       confidence=confidence),
        ))
    return out
