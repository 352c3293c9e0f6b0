"""Stress strata: each NN's error measured in the states where the application fails, not only where it drives.

A candidate's point in the error space is its error on some frames (:mod:`qaopt.on_policy`), and the
region says which error *levels* the application tolerates when the error is spread like the reference's
over every state. Real approximated NNs break that assumption where it matters: on CropFollow, pruned
NNs failed the closed loop at errors below the reference's own, because what they do wrong they do in
states the error data hardly visits (a gap in the row, a large heading while recovering), which a
100 m run meets a few times and 6 m of on-policy driving almost never (docs/BENCHMARKS.md, Fidelity).

So the spec may list *stress strata* (``calibration.error_data.stress``): drives of the same simulator
with some of its params changed so that those states are common (rows full of gaps, off-centre starts),
recorded once with the reference NNs steering, cached, and shared by every candidate. Each candidate's
error is measured on each stratum, and its coordinate on an NN's metric axis becomes

    max(error on the error data, reference error x worst stratum ratio)

where a stratum's ratio is the candidate's error there over the reference's (for a rate metric, the
difference in rate points is added instead: a near-perfect reference would make any ratio explode). A
candidate that errs like the reference everywhere keeps its old coordinate; one that is as good on
average but several times worse in gaps sits where an error process several times the reference's
would, which is what the region has calibrated. Bias and sigma axes keep their coordinates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.app_spec import AppSpec, store
from qaopt.app_spec.errors import QaoptError
from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.nn_errors import is_class_metric
from qaopt.app_spec.schema import StressStratum
from qaopt.calibrate import Recorder, Recording
from qaopt.on_policy import RECORDING_VERSION, recorded
from qaopt.spec_adapter import make_evaluator, simulator_key

STRESS_SEED_BASE = 8_000_000
"""Stress drives' seeds: disjoint from on-policy drives (7,000,000 + drive < 100,000), acceptance's (10,000,000 on), validation's and
calibration's; each stratum takes its own block of :data:`STRATUM_SEED_STRIDE`."""
STRATUM_SEED_STRIDE = 100_000
ERRORS_KIND, ERRORS_VERSION = "stress.errors", 1
PREDICT_CHUNK = 64
"""Frames per prediction call: a stratum of camera frames never materialises whole."""
_FIELD = "calibration.error_data.stress"

Predict = Callable[[Any], np.ndarray]
"""Outputs of an NN (its own columns) for a batch of inputs."""


def merged_params(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged in, nested mappings key by key (a stratum names only what it changes)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged_params(out[key], value)
        else:
            out[key] = value
    return out


def stratum_seeds(index: int, drives: int) -> list[int]:
    """The drive seeds of the ``index``-th stratum."""
    return [STRESS_SEED_BASE + index * STRATUM_SEED_STRIDE + d for d in range(drives)]


@dataclass(frozen=True)
class StressSet:
    """Every stratum's recordings (stratum -> NN -> :class:`~qaopt.calibrate.Recording`) and their content key."""

    key: str
    strata: Mapping[str, Mapping[str, Recording]]

    def predictions(self, nn: str, predict: Predict, shared: dict | None = None) -> dict[str, np.ndarray]:
        """What an NN that computes ``predict`` outputs on each stratum's frames of NN ``nn``, in recording order
        (beside ``strata[name][nn].truth``: the per-frame errors a fidelity study looks into).

        ``shared`` (one dict per module, kept by the caller) keeps each stratum's outputs by the frames they were
        computed on: the recordings of NNs that read one camera hold one frames object, so a merged NN serving
        them runs once on a stratum's frames for all its views, not once per view."""
        out = {}
        for name, recordings in self.strata.items():
            inputs = recordings[nn].inputs
            key = (name, id(inputs))  # the recordings live as long as this set, so their ids name them
            if shared is None or key not in shared:
                outputs = np.concatenate([np.asarray(predict(inputs[i : i + PREDICT_CHUNK]), dtype=np.float64)
                                          for i in range(0, len(inputs), PREDICT_CHUNK)])
                if shared is None:
                    out[name] = outputs
                    continue
                shared[key] = outputs
            out[name] = shared[key]
        return out

    def errors(self, nn: str, predict: Predict, metric: Callable[[np.ndarray, np.ndarray], float],
               columns: Sequence[int] | None = None, shared: dict | None = None) -> dict[str, float]:
        """NN ``nn``'s error metric on each stratum, for an NN that computes ``predict`` (its ``columns`` of it,
        where given: a merged NN's view; ``shared`` as for :meth:`predictions`)."""
        return {name: float(metric(pred if columns is None else pred[:, list(columns)],
                                   np.asarray(self.strata[name][nn].truth)))
                for name, pred in self.predictions(nn, predict, shared).items()}


def record_stress(spec: AppSpec, models: Mapping[str, Any], fingerprints: Mapping[str, str],
                  cache_dir: Path) -> StressSet | None:
    """The spec's stress strata, recorded with ``models`` (the reference torch modules) steering; ``None`` without strata.

    Read from ``cache_dir/stress`` when the simulator, its params, the steering NNs
    (``fingerprints``) and the strata are those of a recording made before.
    """
    from qaopt.approx.quantize import predict_torch  # heavy (torch): only when strata are recorded

    if not spec.calibration.error_data.stress:
        return None
    steering = {n: partial(predict_torch, m) for n, m in models.items()}
    strata: dict[str, Mapping[str, Recording]] = {}
    keys = []
    for i, (stratum, stressed, evaluator) in enumerate(stratum_simulators(spec)):
        where = f"{spec.source}: {_FIELD}.{i} ({stratum.name})"
        seeds = stratum_seeds(i, stratum.drives)
        key = content_hash(RECORDING_VERSION, simulator_key(stressed, evaluator), dict(sorted(fingerprints.items())),
                           seeds, stratum.steps)
        nns = {n: p for n, p in steering.items() if n in evaluator.nn_names}
        strata[stratum.name] = recorded(spec, evaluator, nns, seeds, stratum.steps, cache_dir / "stress" / f"{key}.pkl",
                                        f"stress drives ({where})")
        keys.append(key)
    return StressSet(content_hash(keys), strata)


def stratum_simulators(spec: AppSpec) -> list[tuple[StressStratum, AppSpec, Recorder]]:
    """Each stress stratum with its spec and its simulator, constructed (which checks its params; what
    ``qaopt validate`` runs too); an error names the stratum and the fix."""
    sim = spec.evaluator.simulator
    if spec.calibration.error_data.stress and sim is None:
        raise QaoptError(f"{spec.source}: {_FIELD} needs evaluator.simulator to record drives in; remove the strata "
                         "or add the simulator")
    out = []
    for i, stratum in enumerate(spec.calibration.error_data.stress):
        where = f"{spec.source}: {_FIELD}.{i} ({stratum.name})"
        stressed = _with_params(spec, merged_params(sim.params, stratum.params))
        try:
            evaluator = make_evaluator(stressed)
        except QaoptError as exc:
            raise QaoptError(f"{where}: its params do not make a simulator: {exc}") from None
        if not isinstance(evaluator, Recorder):
            raise QaoptError(f"{where}: the simulator {type(evaluator).__name__} cannot record drives (it has no "
                             "record_perception method; see docs/extending.md); remove the strata")
        out.append((stratum, stressed, evaluator))
    return out


def _with_params(spec: AppSpec, params: dict[str, Any]) -> AppSpec:
    sim = spec.evaluator.simulator.model_copy(update={"params": params})
    return spec.model_copy(update={"evaluator": spec.evaluator.model_copy(update={"simulator": sim})})


def cached_errors(stress: StressSet, cache_dir: Path, nn: str, candidate_key: str, compute: Callable[[], dict[str, float]]
                  ) -> dict[str, float]:
    """A candidate's stratum errors, computed once per (strata, NN, candidate) and kept in the cache."""
    path = cache_dir / "stress" / "errors" / stress.key / f"{nn}-{candidate_key}.json"
    found = store.read_json(path, ERRORS_KIND, ERRORS_VERSION)
    if isinstance(found, dict) and set(found) == set(stress.strata):
        return {k: float(v) for k, v in found.items()}
    errors = compute()
    store.write_json(path, ERRORS_KIND, ERRORS_VERSION, errors)
    return errors


def stressed_coordinate(kind: str, error: float, reference_error: float, strata: Mapping[str, float],
                        reference_strata: Mapping[str, float]) -> float:
    """An NN's coordinate on its metric axis with stress strata (see the module docstring).

    ``error`` is its coordinate on the error data, ``reference_error`` the reference NN's;
    ``strata`` and ``reference_strata`` their errors on each stratum.
    """
    worst = error
    for name, value in strata.items():
        ref = reference_strata[name]
        if is_class_metric(kind) or ref <= 0.0:
            worst = max(worst, reference_error + (value - ref))
        else:
            worst = max(worst, reference_error * value / ref)
    return float(worst)
