"""The result of calibration: which NN-error vectors keep the application's QoS.

An :class:`ErrorRegion` holds every observation (a point, its runs, its verdict,
its source) and answers ``contains(errors)`` in two modes:

- ``certified``: safe at the spec's confidence. How depends on the region's
  ``certifier`` (:mod:`qaopt.calibrate.certifiers`, an open registry): ``pooled``
  (the default) judges the region with one monotone statistical model of the
  failure probability fitted to every run at every point
  (:class:`~qaopt.calibrate.pooled.PooledCertifier`), so evidence near the boundary is
  shared and a point failing 2 % of the time can be certified where its own 96 runs
  never could; ``per-point`` certifies what is dominated by a point its own runs
  accepted (and dominates no rejected one), ApproxCaliper's rule.
- ``predicted``: the model's P(valid) is at least ``threshold``. Less conservative.

``margin`` (a fraction of each axis' range) asks for the point *plus* that
margin to be inside, leaving headroom for an NN's error measured on finite data.

Evidence from outside the simulator (field runs, labelled by source) joins the
simulator's observations. Where the two disagree the field wins: a field verdict
at a point replaces the simulator's there, and by monotonicity also overturns
simulator verdicts it contradicts (a field failure at q makes every simulator-valid
point above q invalid; a field success at q makes every simulator-invalid point
below q valid). Field runs are judged by one fixed-sample Clopper-Pearson test, with
either certifier: the ``pooled`` model is fitted to the injected runs alone and the
field's decided verdicts act on it the same way, while a point the field's runs leave
undecided changes nothing (:meth:`ErrorRegion.runs`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from scipy.stats import qmc

from qaopt.app_spec import store
from qaopt.app_spec.nn_errors import error_coordinate
from qaopt.calibrate.acceptance import AcceptanceTest, Verdict
from qaopt.calibrate.certifiers import CERTIFIERS, PER_POINT, POOLED, ValidityModel
from qaopt.calibrate.dominance import Dominance
from qaopt.calibrate.errors import CalibrationError
from qaopt.calibrate.space import ErrorSpace

SIMULATOR = "simulator"
FORMAT_VERSION = 2  # 2: the certifier is stored; a format-1 file (no certifier) is read as per-point


@dataclass(frozen=True)
class Observation:
    """One source's runs at one point. ``message`` says why a failed evaluation failed."""

    errors: dict[str, float]
    passes: int
    failures: int
    verdict: Verdict
    source: str = SIMULATOR
    message: str = ""

    @property
    def trials(self) -> int:
        return self.passes + self.failures

    def to_json(self) -> dict:
        return {**asdict(self), "verdict": self.verdict.value}

    @classmethod
    def from_json(cls, d: Mapping) -> Observation:
        return cls(**{**d, "errors": dict(d["errors"]), "verdict": Verdict(d["verdict"])})


@dataclass(frozen=True)
class Evidence:
    """Runs observed outside the simulator at one NN-error vector (e.g. field runs).

    ``errors`` uses the region's axis names (see :meth:`ErrorRegion.errors_of` to
    get them from an NN's measured residuals); ``source`` labels where the runs
    came from (``"field"``, ``"field:2026-11-20"``, ...). It must not be ``"simulator"``.
    """

    errors: Mapping[str, float]
    passes: int
    failures: int
    source: str = "field"
    note: str = ""

    def __post_init__(self) -> None:
        if self.source == SIMULATOR:
            raise CalibrationError("evidence: source 'simulator' is reserved; label field runs e.g. 'field'")
        if self.passes < 0 or self.failures < 0 or self.passes + self.failures == 0:
            raise CalibrationError(
                f"evidence from '{self.source}' at {dict(self.errors)}: passes and failures must be "
                ">= 0 with at least one run"
            )


@dataclass(frozen=True)
class LabelledPoint:
    """A point's final label after pooling its sources (what the region is built from)."""

    errors: dict[str, float]
    unit: np.ndarray = field(repr=False)
    valid: bool
    sources: tuple[str, ...]
    overturned: bool  # the field's verdict replaced the simulator's here
    borderline: bool = False  # the simulator's test ran out of runs undecided (counted as not valid)

    @property
    def simulator_only(self) -> bool:
        """Whether only simulator runs label the point (no field evidence).

        Asked of the point, so that the plot, which draws the two kinds apart, needs
        nothing of this module at run time (this module imports the plot).
        """
        return self.sources == (SIMULATOR,)


class ErrorRegion:
    """Observations over an :class:`ErrorSpace`, judged by an :class:`AcceptanceTest`."""

    def __init__(
        self,
        space: ErrorSpace,
        acceptance: AcceptanceTest,
        observations: Sequence[Observation] = (),
        metrics: Mapping[str, str] | None = None,
        info: Mapping | None = None,
        certifier: str = POOLED,
    ):
        self._certifier = CERTIFIERS.lookup(certifier)
        self.space = space
        self.acceptance = acceptance
        self.observations: list[Observation] = list(observations)
        self.metrics = dict(metrics or {nn: "l1" for nn in space.nns})
        self.info = dict(info or {})
        self.certifier = certifier
        self._model: ValidityModel | None = None
        self._labelled: list[LabelledPoint] | None = None

    # -- building -------------------------------------------------------------------
    def add(self, observation: Observation) -> None:
        self.space.to_unit(observation.errors)  # rejects a vector of other axes
        self.observations.append(observation)
        self._model = self._labelled = None

    def add_evidence(self, evidence: Evidence | Sequence[Evidence]) -> None:
        """Fold externally observed runs into the region (field wins where it disagrees)."""
        for ev in [evidence] if isinstance(evidence, Evidence) else evidence:
            verdict = self.acceptance.decide_fixed(ev.failures, ev.passes + ev.failures)
            self.add(Observation(dict(ev.errors), ev.passes, ev.failures, verdict, ev.source, ev.note))

    def copy(self, observations: Sequence[Observation] | None = None) -> ErrorRegion:
        """The same region (space, test, metrics, info, certifier) with these observations (default: its own)."""
        return ErrorRegion(self.space, self.acceptance, list(self.observations if observations is None else observations),
                           self.metrics, self.info, self.certifier)

    # -- labels ---------------------------------------------------------------------
    def labelled(self) -> list[LabelledPoint]:
        """Each distinct point once, with its label after pooling sources and field overrides."""
        if self._labelled is not None:
            return self._labelled
        points, sim_label, field_label, borderline = [], [], [], []
        for key, obs in self._by_point(self.observations).items():
            sim = [o for o in obs if o.source == SIMULATOR and o.verdict is not Verdict.FAILED]
            fld = [o for o in obs if o.source != SIMULATOR]
            s = None if not sim else sim[-1].verdict is Verdict.VALID
            f = self._field_verdict(fld)
            if s is None and f is None:
                continue
            points.append((np.array(key), obs))
            borderline.append(bool(sim) and sim[-1].verdict is Verdict.UNDECIDED)
            sim_label.append(s)
            field_label.append(f)
        labels = [f if f is not None else s for s, f in zip(sim_label, field_label)]
        overturned = [f is not None and s is not None and f != s for s, f in zip(sim_label, field_label)]
        # a field verdict also overturns simulator verdicts that monotonicity says contradict it
        for i, (q, _) in enumerate(points):
            if field_label[i] is None:
                continue
            for j, (p, _) in enumerate(points):
                if field_label[j] is not None or labels[j] == field_label[i]:
                    continue
                if (field_label[i] is False and (q <= p + 1e-12).all()) or (
                    field_label[i] is True and (p <= q + 1e-12).all()
                ):
                    labels[j], overturned[j] = field_label[i], True
        self._labelled = [
            LabelledPoint(dict(obs[0].errors), self.space.to_unit(obs[0].errors), bool(lab),
                          tuple(dict.fromkeys(o.source for o in obs)), ov, b and not ov)
            for (_, obs), lab, ov, b in zip(points, labels, overturned, borderline)
        ]
        return self._labelled

    def _by_point(self, observations: Sequence[Observation]) -> dict[tuple, list[Observation]]:
        """``observations`` grouped by their point (its unit-cube coordinates, rounded so that one point is one key)."""
        groups: dict[tuple, list[Observation]] = {}
        for ob in observations:
            groups.setdefault(tuple(np.round(self.space.to_unit(ob.errors), 9)), []).append(ob)
        return groups

    def _field_verdict(self, observations: Sequence[Observation]) -> bool | None:
        """The fixed-sample verdict of one point's runs from outside the simulator (valid or not), pooled over
        sources; ``None`` when there are none or they decide nothing."""
        if not observations:
            return None
        v = self.acceptance.decide_fixed(sum(o.failures for o in observations), sum(o.trials for o in observations))
        return None if v is Verdict.UNDECIDED else v is Verdict.VALID

    def field_verdicts(self) -> tuple[np.ndarray, np.ndarray]:
        """Each point that evidence from outside the simulator decides (unit-cube rows), and its verdict (valid or not).

        What the ``pooled`` certifier takes from that evidence: a verdict at its point, carried by monotonicity,
        never its runs in the fitted model (see :meth:`runs`).
        """
        outside = self._by_point([o for o in self.observations if o.source != SIMULATOR])
        decided = [(self.space.to_unit(obs[0].errors), v) for obs in outside.values()
                   if (v := self._field_verdict(obs)) is not None]
        U = np.array([u for u, _ in decided]).reshape(-1, self.space.dim)
        return U, np.array([v for _, v in decided], dtype=bool)

    def unit_labels(self) -> tuple[np.ndarray, np.ndarray]:
        """Every labelled point in the unit cube (rows) and its label (valid or not): what monotonicity works on."""
        pts = self.labelled()
        X = np.array([p.unit for p in pts]).reshape(-1, self.space.dim)
        return X, np.array([p.valid for p in pts], dtype=bool)

    def dominance(self) -> Dominance:
        return Dominance.from_labels(*self.unit_labels())

    def runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every distinct point (unit cube) the simulator evaluated, with its runs pooled (failed evaluations left out).

        Only injected runs: at those the error vector is exactly the point's, by construction. A real NN run in
        the field or the closed loop errs in its own way (a bias, errors correlated over frames, one scene it
        fails), so its runs are a verdict about its point (:meth:`field_verdicts`), not data for a model of the
        failure rate over the space. Pooled with the injected runs, a few such failures at small errors once
        left CropFollow's refitted region holding not even the reference NNs' point (docs/calibration.md).
        """
        pooled: dict[tuple, list] = {}
        for ob in self.observations:
            if ob.source != SIMULATOR or ob.verdict is Verdict.FAILED or ob.trials == 0:
                continue
            u = self.space.to_unit(ob.errors)
            entry = pooled.setdefault(tuple(np.round(u, 9)), [u, 0, 0])
            entry[1] += ob.trials
            entry[2] += ob.failures
        rows = list(pooled.values())
        X = np.array([r[0] for r in rows]).reshape(-1, self.space.dim)
        return X, np.array([r[1] for r in rows], dtype=float), np.array([r[2] for r in rows], dtype=float)

    @property
    def model(self) -> ValidityModel:
        """P(valid) over the space (``predict_proba`` on unit-cube rows), as the region's certifier models it."""
        if self._model is None:
            self._model = self._certifier.model(self)
        return self._model

    # -- queries --------------------------------------------------------------------
    def _unit(self, errors: Mapping[str, float], margin: float) -> np.ndarray:
        return self.space.to_unit(errors) + margin

    def contains(
        self, errors: Mapping[str, float], mode: str = "certified", margin: float = 0.0, threshold: float = 0.5
    ) -> bool:
        """Whether an NN-error vector (axis name -> value, in the axes' units) keeps QoS."""
        return bool(self.contains_unit(self._unit(errors, margin)[None], mode, threshold)[0])

    def contains_unit(self, U: np.ndarray, mode: str = "certified", threshold: float = 0.5) -> np.ndarray:
        """Vectorized :meth:`contains` over unit-cube points (rows)."""
        if mode == "certified":
            return self._certifier.certified(self, U)
        if mode == "predicted":
            return self.model.predict_proba(U) >= threshold
        raise CalibrationError(f"region mode '{mode}' is unknown; use 'certified' or 'predicted'")

    def probability(self, errors: Mapping[str, float], margin: float = 0.0) -> float:
        """The classifier's P(valid), 1/0 where monotonicity decides."""
        return float(self.model.predict_proba(self._unit(errors, margin)[None])[0])

    def errors_of(self, residuals: Mapping[str, np.ndarray]) -> dict[str, float]:
        """The point of this space that NNs with these residuals (estimate - truth; confusion codes for a detector)
        sit at. A detector is placed by both its error kinds in the proportion its calibrated error model injected
        them (:func:`~qaopt.app_spec.nn_errors.class_coordinate`)."""
        out = {}
        for a in self.space.axes:
            if a.nn not in residuals:
                raise CalibrationError(f"residuals: NN '{a.nn}' is calibrated but has no residuals")
            out[a.name] = error_coordinate(a.component, self.metrics.get(a.nn, "l1"), residuals[a.nn],
                                           self.class_ratio(a.nn))
        return out

    def class_ratio(self, nn: str) -> float | None:
        """The other error kind's rate per declared one that calibration injected into detector ``nn`` (its confusion
        model's ``ratio``, as ``info["error_models"]`` records it); ``None`` for a regression NN or a region saved
        without its error models."""
        model = self.info.get("error_models", {}).get(nn) or {}
        return model.get("ratio") if model.get("model") == "confusion" else None

    def certified_share(self, samples: int = 4096) -> float:
        """The share of the error space (its unit cube, by a Sobol sample) that is certified valid."""
        U = qmc.Sobol(self.space.dim, scramble=True, seed=0).random(samples)
        return float(self.contains_unit(U).mean())

    def empty_reason(self) -> str | None:
        """Why nothing beyond the reference point is certified, naming the points tried; ``None`` when something is."""
        # The reference point (the origin) alone is no region: look everywhere else.
        grid = np.vstack([qmc.Sobol(self.space.dim, scramble=True, seed=0).random(1024), self.runs()[0]])
        grid = grid[grid.max(1) > 1e-9]
        if self.contains_unit(grid).any():
            return None
        sim = [o for o in self.observations if o.source == SIMULATOR]
        origin = self.space.from_unit(np.zeros(self.space.dim))
        first = next((o for o in sim if np.allclose(self.space.to_unit(o.errors), 0.0)), None)
        where = ", ".join(f"{k}={v:g}" for k, v in origin.items())
        if first is not None and first.verdict is Verdict.INVALID:
            return (f"the reference point ({where}, every axis at its minimum) fails the QoS goal: "
                    f"{first.failures} of {first.trials} runs failed, so no point with more error can be valid; "
                    "lower the axes' min, loosen qos, or improve the application")
        tried = "; ".join(f"({', '.join(f'{k}={v:.3g}' for k, v in o.errors.items())}): "
                          f"{o.failures}/{o.trials} failed" for o in sim[:12])
        more = f" and {len(sim) - 12} more" if len(sim) > 12 else ""
        return (f"no point is certified valid after {len(sim)} evaluations ({tried}{more}); the reference point "
                f"({where}) was {'not decided' if first is not None else 'not evaluated'}. Narrow the axes "
                "(calibration.space.*.max) so that more evaluations fall near the boundary, or raise the budget")

    @property
    def evaluations(self) -> int:
        return sum(o.source == SIMULATOR for o in self.observations)

    @property
    def trials(self) -> int:
        return sum(o.trials for o in self.observations if o.source == SIMULATOR)

    # -- persistence ----------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": FORMAT_VERSION,
            "axes": self.space.to_json(),
            "metrics": self.metrics,
            "acceptance": self.acceptance.to_json(),
            "info": self.info,
            "certifier": self.certifier,
            "observations": [o.to_json() for o in self.observations],
        }

    def save(self, path: str | Path) -> Path:
        """Write the region atomically (:func:`qaopt.app_spec.store.atomic_path`): a kill never leaves half a file."""
        return store.write_text(path, json.dumps(self.to_json(), indent=1))

    @classmethod
    def from_json(cls, data: Mapping) -> ErrorRegion:
        if data.get("format") not in (1, FORMAT_VERSION):
            raise CalibrationError(f"region file has format {data.get('format')!r}; this qaopt reads 1 and {FORMAT_VERSION}")
        return cls(
            ErrorSpace.from_json(data["axes"]),
            AcceptanceTest(**data["acceptance"]),
            [Observation.from_json(o) for o in data["observations"]],
            data.get("metrics"),
            data.get("info"),
            data.get("certifier", PER_POINT),
        )

    @classmethod
    def load(cls, path: str | Path) -> ErrorRegion:
        """Read a saved region; a missing, torn or malformed file raises :class:`CalibrationError`."""
        try:
            data = json.loads(Path(path).read_bytes().decode())
        except (OSError, ValueError) as e:  # ValueError: undecodable bytes (UnicodeDecodeError) or JSON
            raise CalibrationError(f"{path}: cannot read the region ({e}); run `qaopt calibrate` again") from e
        if not isinstance(data, Mapping):
            raise CalibrationError(f"{path}: not a region file; run `qaopt calibrate` again")
        try:
            return cls.from_json(data)
        except (KeyError, TypeError, ValueError) as e:
            raise CalibrationError(f"{path}: malformed region ({type(e).__name__}: {e}); run `qaopt calibrate` again") from e

    def plot(self, path: str | Path, axes: Sequence[str] | None = None, fixed: Mapping[str, float] | None = None,
             resolution: int = 64, reference: Mapping[str, float] | None = None,
             chosen: Mapping[str, float] | None = None) -> Path:
        """Write a PNG of every pair of ``axes``, other axes held at ``fixed`` (see :func:`qaopt.calibrate.plot.plot_region`).

        matplotlib is imported here, on first use: a region that is only queried never pays for it.
        """
        from qaopt.calibrate.plot import plot_region

        return plot_region(self, path, axes, fixed, resolution, reference, chosen)
