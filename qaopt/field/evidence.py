"""Field runs as calibration evidence: the glue between the field store and ``qaopt.calibrate``.

A field run is evidence at a point of the NN-error space: the injected error point of
a deliberate calibration trial, else the measured NN errors of the deployed
configuration. Each complete run passes or fails the spec's QoS goal on the metrics
the field measures (distance, collisions, interventions and their rates per 100 m);
runs at one point become one :class:`qaopt.calibrate.Evidence`, which
:class:`qaopt.calibrate.ErrorRegion` weighs against the simulator (the field wins
where they disagree).

This module imports calibrate (numpy, scipy, scikit-learn): it runs on the
workstation, never on the robot.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from qaopt.app_spec import AppSpec
from qaopt.calibrate import Evidence, ErrorRegion, ErrorSpace, QoSGoal
from qaopt.calibrate.region import SIMULATOR
from qaopt.spec_adapter import goal_of, space_of

from .errors import FieldError
from .records import COLLISION, INTERVENTION, RunRecord
from .store import Store

FIELD_SOURCE = "field"


def run_metrics(rec: RunRecord) -> dict[str, float] | None:
    """The QoS metrics one field run measures; None without a positive distance."""
    distance = rec.known_distance_m
    if not distance:
        return None
    collisions, interventions = rec.count(COLLISION), rec.count(INTERVENTION)
    return {
        "distance_m": distance,
        "collisions": float(collisions),
        "interventions": float(interventions),
        "collisions_per_100m": collisions / distance * 100.0,
        "interventions_per_100m": interventions / distance * 100.0,
    }


@dataclass(frozen=True)
class UnusedRun:
    run_id: str
    reason: str


@dataclass
class FieldEvidence:
    """Evidence per point, the runs behind each, and the runs that could not be used (and why)."""

    evidence: list[Evidence] = field(default_factory=list)
    runs: dict[int, list[str]] = field(default_factory=dict)  # index in ``evidence`` -> run ids
    unused: list[UnusedRun] = field(default_factory=list)


def collect_evidence(records: Iterable[RunRecord], space: ErrorSpace, goal: QoSGoal,
                     source: str = FIELD_SOURCE) -> FieldEvidence:
    """Turn field runs into calibration evidence.

    Only ``complete`` runs count: an aborted or incomplete run did not drive its
    course, so its pass would overstate the QoS. A run counts at its error point
    when it gives a value for every axis of ``space``.
    """
    groups: dict[tuple, list[tuple[RunRecord, bool]]] = defaultdict(list)
    out = FieldEvidence()
    for rec in records:
        if rec.status != "complete":
            out.unused.append(UnusedRun(rec.id, f"{rec.status} run (only complete runs are evidence)"))
            continue
        point = rec.error_space_point or {}
        missing = [a for a in space.names if a not in point]
        if missing:
            out.unused.append(UnusedRun(rec.id, "no error point or measured NN error for "
                                        + ", ".join(missing)))
            continue
        metrics = run_metrics(rec)
        if metrics is None:
            out.unused.append(UnusedRun(rec.id, "no distance recorded"))
            continue
        if goal.metric not in metrics:
            raise FieldError(f"qos.metric {goal.metric!r} is not measured by field runs; they give "
                             f"{', '.join(metrics)}: use one of them as the spec's qos.metric")
        key = tuple(round(float(point[a]), 9) for a in space.names)
        groups[key].append((rec, goal.passes(metrics[goal.metric])))
    for key, runs in sorted(groups.items()):
        passes = sum(ok for _, ok in runs)
        out.runs[len(out.evidence)] = [r.id for r, _ in runs]
        out.evidence.append(Evidence(dict(zip(space.names, key)), passes, len(runs) - passes, source,
                                     note=f"{len(runs)} field run(s)"))
    return out


def spec_evidence(spec: AppSpec, store: Store | None = None) -> FieldEvidence:
    """The field evidence for a spec's calibration: its application's runs in its field
    store (``evaluator.field.store``, or ``store``); none when it has no store."""
    if store is None:
        if spec.evaluator.field is None:
            return FieldEvidence()
        with Store(spec.evaluator.field.store) as own:
            return spec_evidence(spec, own)
    return collect_evidence(store.runs(application=spec.app.name), space_of(spec), goal_of(spec))


@dataclass(frozen=True)
class Change:
    """A labelled point of the region whose label field evidence decided or changed."""

    errors: dict[str, float]
    before: bool | None  # None: the point had no label before
    after: bool
    overturned: bool  # the field verdict replaced the simulator's


def apply_evidence(region: ErrorRegion, evidence: Iterable[Evidence]) -> list[Change]:
    """Fold evidence into ``region`` (in place) and return the points whose label it set or changed."""
    before = {_key(p.unit): p.valid for p in region.labelled()}
    region.add_evidence(list(evidence))
    return [Change(p.errors, before.get(_key(p.unit)), p.valid, p.overturned)
            for p in region.labelled() if before.get(_key(p.unit)) != p.valid or p.overturned]


def certified_fraction(region: ErrorRegion, resolution: int = 64) -> float:
    """Share of the error space (unit cube, on a grid) that the region certifies valid."""
    return float(region.contains_unit(unit_grid(region.space.dim, resolution)).mean())


def unit_grid(dim: int, resolution: int) -> np.ndarray:
    axes = [np.linspace(0.0, 1.0, resolution)] * dim
    return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, dim)


def field_only(region: ErrorRegion) -> ErrorRegion:
    """The same region with only its non-simulator observations (what the field has shown)."""
    return region.copy([o for o in region.observations if o.source != SIMULATOR])


def observed_at(region: ErrorRegion, errors: Mapping[str, float]) -> tuple[int, int]:
    """Field passes and failures already logged at a point."""
    key = _key(region.space.to_unit(errors))
    obs = [o for o in region.observations if o.source != SIMULATOR and _key(region.space.to_unit(o.errors)) == key]
    return sum(o.passes for o in obs), sum(o.failures for o in obs)


def _key(unit: np.ndarray) -> tuple:
    return tuple(np.round(np.asarray(unit, dtype=float), 9))
