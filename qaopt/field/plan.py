"""``qaopt field plan``: which field trial to run next, and for how long.

A field trial at a point ``x`` ends, when decisive, in one of two ways. Valid: by
monotonicity every point below ``x`` is valid in the field. Invalid: every point
above ``x`` is invalid. So the trial resolves the uncertainty of the cone below
``x`` with probability ``P(valid at x)`` and of the cone above with the rest; the
plan proposes the points with the largest expected resolved uncertainty::

    score(x) = p(x) * sum_{u <= x} H(u) + (1 - p(x)) * sum_{u >= x} H(u)

over a grid ``u`` of the error space, where ``H`` is the binary entropy of ``p``.
``p`` is the calibrated region's P(valid) (the simulator's model, the field's
decided verdicts winning), clipped to ``[doubt, 1 - doubt]``: the simulator is not the field, so
what only the simulator certifies keeps some uncertainty, and points the field
itself has decided keep none. The first trials thus test the edge of the
simulator's region, where a pass certifies most of it in the field and a failure
moves the edge in: a binary search that needs few field days.

How long: the runs (of the spec's run length) the region's acceptance test needs
to certify the point valid if none fails, counting runs already logged there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qaopt.calibrate import ErrorRegion, Verdict
from qaopt.calibrate.region import PER_POINT

from .evidence import field_only, observed_at, unit_grid

MAX_GRID_POINTS = 4096
MAX_RUNS = 10_000


@dataclass(frozen=True)
class Candidate:
    """A point that could be tested: an error point to inject, or a configuration's NN errors."""

    errors: dict[str, float]
    label: str = ""  # e.g. "config 3f2a..." for a deployable configuration


@dataclass(frozen=True)
class Proposal:
    """One proposed field trial."""

    candidate: Candidate
    p_valid: float
    score: float
    """Expected share of the region's remaining uncertainty this trial resolves (0..1)."""
    logged: tuple[int, int]
    """Field passes and failures already logged at the point."""
    runs: int | None
    """More runs needed to certify the point valid if none of them fails (None: cannot)."""
    reject_failures: int | None
    """Failures among those runs that would reject the point instead."""
    distance_m: float | None

    @property
    def kind(self) -> str:
        return "configuration" if self.candidate.label else "error point"


def binary_entropy(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def grid_resolution(dim: int) -> int:
    return int(max(3, min(41, np.floor(MAX_GRID_POINTS ** (1 / dim) + 1e-9))))


def monotone_prior(U: np.ndarray) -> np.ndarray:
    """P(valid) before anything is learned: each axis' tolerance uniform on its range,
    ``prod(1 - u_i)``; certain at zero error, falling with every error (monotone)."""
    return np.prod(1.0 - U, axis=1)


def field_probability(region: ErrorRegion, U: np.ndarray, doubt: float) -> np.ndarray:
    """P(valid in the field) on unit points: certain where field evidence decides by
    monotonicity, the region's probability clipped to ``[doubt, 1 - doubt]`` elsewhere
    (:func:`monotone_prior` where the region has not learned one)."""
    p = monotone_prior(U)
    if region.labelled():
        lab = region.dominance().labels(U)
        model = region.model
        # a per-point classifier that saw one outcome only has learned nothing beyond monotonicity
        learned = p if region.certifier == PER_POINT and model.model_ is None else model.predict_proba(U)
        p = np.where(lab > 0, 1.0, np.where(lab < 0, 0.0, learned))
    p = np.clip(p, doubt, 1 - doubt)
    seen = field_only(region)
    if seen.labelled():
        lab = seen.dominance().labels(U)
        p = np.where(lab > 0, 1.0, np.where(lab < 0, 0.0, p))
    return p


def runs_needed(region: ErrorRegion, passes: int, failures: int) -> tuple[int | None, int | None]:
    """(more runs to certify valid if all pass, failures among them that reject) at a point."""
    test = region.acceptance
    done = passes + failures
    more = next((n for n in range(0, MAX_RUNS) if test.decide_fixed(failures, done + n) is Verdict.VALID), None)
    if more is None:
        return None, None
    total = done + more
    reject = next((f for f in range(failures, total + 1) if test.decide_fixed(f, total) is Verdict.INVALID), None)
    return more, None if reject is None else reject - failures


def plan(
    region: ErrorRegion,
    candidates: Sequence[Candidate] = (),
    *,
    top: int = 3,
    doubt: float = 0.1,
    run_length_m: float | None = None,
    grid_points: bool = True,
    separation: float = 0.15,
    min_p_valid: float = 0.5,
) -> list[Proposal]:
    """The ``top`` field trials that most reduce the region's uncertainty, best first.

    Candidates are the grid's error points (to inject, when ``grid_points``) and the
    given ``candidates`` (deployable configurations at their measured NN errors).
    Proposals are at least ``separation`` apart on some axis (a share of its range),
    so that the runner-up is a different trial, not the best one moved by a grid step.
    Grid points are proposed only where ``P(valid) >= min_p_valid``.
    """
    if not 0 <= doubt < 0.5:
        raise ValueError(f"doubt {doubt} must be in [0, 0.5)")
    space = region.space
    U = unit_grid(space.dim, grid_resolution(space.dim))
    h = binary_entropy(grid_p := field_probability(region, U, doubt))
    h[h < 1e-9] = 0.0
    total = float(h.sum())
    # Grid points only where the robot is expected to cope: a field trial where the region
    # predicts failure risks crops and robot, and informs only the part the optimizer never uses.
    keep = (h > 0) & (grid_p >= min_p_valid)
    cands = [Candidate(space.from_unit(u)) for u in U[keep]] if grid_points else []
    cands += list(candidates)
    if not cands or total == 0.0:
        return []
    X = np.stack([space.to_unit(c.errors) for c in cands])
    px = field_probability(region, X, doubt)
    below = np.empty(len(X))
    above = np.empty(len(X))
    for start in range(0, len(X), 256):  # bounded memory: 256 x |grid| x dim booleans per chunk
        chunk = X[start:start + 256, None, :]
        below[start:start + 256] = ((U[None] <= chunk + 1e-12).all(axis=2) * h).sum(axis=1)
        above[start:start + 256] = ((U[None] >= chunk - 1e-12).all(axis=2) * h).sum(axis=1)
    score = (px * below + (1 - px) * above) / total
    order = np.lexsort((np.arange(len(X)), -np.round(score, 12)))
    chosen: list[int] = []
    for i in order:  # best first, skipping near-duplicates of a better proposal
        if len(chosen) == top:
            break
        if all(np.abs(X[i] - X[j]).max() >= separation for j in chosen):
            chosen.append(int(i))
    out = []
    for i in chosen:
        logged = observed_at(region, cands[i].errors)
        runs, reject = runs_needed(region, *logged)
        out.append(Proposal(cands[i], float(px[i]), float(score[i]), logged, runs, reject,
                            None if runs is None or run_length_m is None else runs * run_length_m))
    return out


def configuration_candidates(points: Mapping[str, Mapping[str, float]], names: Sequence[str]) -> list[Candidate]:
    """Configurations (label -> NN errors) that give a value on every axis, as candidates."""
    return [Candidate({n: float(errs[n]) for n in names}, label)
            for label, errs in points.items() if all(n in errs for n in names)]
