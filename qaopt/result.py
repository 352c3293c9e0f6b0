"""What ``qaopt optimize`` returns and writes as ``result.json``.

The Python API (:func:`qaopt.optimize`) returns a :class:`Result` with exactly the
content of ``result.json``, so a team can script runs and read old ones alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from qaopt.app_spec import store

Schedule = Literal["sequential", "parallel"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NNChoice(_Model):
    """One NN of a configuration: its knobs, the error they cost, and how fast it ran."""

    knobs: dict[str, Any]
    candidate: str = Field(description="the candidate's content hash (its cache key)")
    error: float = Field(description="NN error metric on validation data, in the output's unit")
    metric: str
    backend: str
    latency_ms: float
    memory_bytes: int | None
    macs: int
    params: int
    backends_measured: dict[str, float | str] = Field(
        default_factory=dict, description="every backend's median latency (ms), or why it could not run"
    )


class Configuration(_Model):
    """A per-NN choice of knobs and how the NNs share the cores, with its measured cost."""

    trial: int | None = Field(None, description="Optuna trial number; None for the reference")
    nns: dict[str, NNChoice]
    schedule: Schedule
    latency_ms: float = Field(description="measured time per perception frame under the schedule")
    memory_bytes: int | None
    errors: dict[str, float] = Field(description="the error vector in the region's axis names")
    in_region: bool


class RunMetric(_Model):
    """One reported metric over a validation's closed-loop runs."""

    mean: float = Field(description="mean per run")
    worst_run: float | None = Field(
        None, description="its value in the worst run (the run whose QoS metric is worst); None when not recorded")
    total: float | None = Field(
        None, description="sum over the runs, for counts only (a sum of e.g. distances or gaps means nothing)")


class Validation(_Model):
    """Closed-loop runs of a configuration with its real approximated NNs in the loop."""

    trial: int | None
    runs: int
    passes: int
    failures: int
    verdict: Literal["valid", "invalid", "undecided"]
    accepted: bool
    region_predicted_valid: bool
    qos_metric_mean: float
    metrics: dict[str, RunMetric] = Field(
        default_factory=dict, description="each metric the evaluator reports: its mean per run, its value in the worst "
        "run, and for counts (collisions, crashes) its total over the runs")
    worst_seed: int | None = Field(None, description="the seed of the run with the worst QoS metric value")


class Speedups(_Model):
    aware: float | None = Field(None, description="reference latency / application-aware latency")
    agnostic: float | None = Field(None, description="reference latency / application-agnostic latency")
    aware_over_agnostic: float | None = Field(None, description="agnostic latency / aware latency")


class TrialRecord(_Model):
    """One finished trial of a study: what it sampled, where it fell, and what it measured."""

    number: int
    state: Literal["complete", "failed"]
    params: dict[str, Any] = Field(description="the knobs and schedule Optuna sampled")
    feasible: bool = Field(description="inside the region (aware) or within the reference errors (agnostic)")
    objectives: dict[str, float] = Field(
        default_factory=dict, description="the study's objective values by name (latency in ms, memory in MiB)")
    errors: dict[str, float] = Field(default_factory=dict, description="the error vector in the region's axis names")
    configuration: Configuration | None = Field(None, description="the compiled, tuned configuration (feasible trials)")
    error: str | None = Field(None, description="why the trial failed")


class StudySummary(_Model):
    name: str
    trials_complete: int
    trials_failed: int
    trials_feasible: int
    failures: list[str] = Field(default_factory=list, description="why each failed trial failed")
    trials: list[TrialRecord] = Field(default_factory=list, description="every finished trial, in order")

    def feasible_configurations(self) -> list[Configuration]:
        """Every feasible, measured configuration, fastest first (the latency end of the Pareto front leads).

        Not only the front: when closed-loop validation rules the fastest out, the next fastest is the one to try.
        """
        configs = [t.configuration for t in self.trials if t.feasible and t.configuration is not None]
        return sorted(configs, key=lambda c: (c.latency_ms, c.memory_bytes or 0))


RESULT_VERSION = 3
"""Bumped when ``result.json`` changes meaning; 2 added the trials tables, 3 per-metric means, worst runs and
counts' totals in place of every metric's sum, and the region's provenance."""


class Result(_Model):
    """The outcome of one ``qaopt optimize`` run: everything the report shows, so the report needs nothing else."""

    version: int = RESULT_VERSION
    app: str
    spec: str
    spec_hash: str
    profile: str
    run_dir: Path
    reference: Configuration
    aware: Configuration | None = Field(None, description="the accepted application-aware configuration")
    agnostic: Configuration | None = Field(None, description="the best accuracy-preserving configuration")
    agnostic_tolerance: float
    speedups: Speedups
    validations: list[Validation]
    agnostic_validation: Validation | None = Field(
        None, description="the agnostic configuration run closed-loop too: is accuracy-preserving compression safe here?")
    fidelity: float | None = Field(None, description="share of validated configurations whose closed-loop verdict matched the region")
    fidelity_note: str = ""
    studies: dict[str, StudySummary]
    tuning: dict[str, Any] = Field(default_factory=dict)
    region: Path
    region_note: str = Field("", description="how the region was obtained: reused, calibrated, or what it replaced")
    report: Path
    artifacts: dict[str, dict[str, Path]] = Field(default_factory=dict)
    seconds: dict[str, float] = Field(default_factory=dict, description="wall time of each stage")

    @property
    def aware_accepted(self) -> bool:
        """Whether the aware configuration passed closed-loop validation (else it is only the best unrefuted one)."""
        return self.aware is not None and any(v.accepted and v.trial == self.aware.trial for v in self.validations)

    def save(self, path: str | Path) -> Path:
        return store.write_text(path, self.model_dump_json(indent=2))

    @classmethod
    def load(cls, path: str | Path) -> Result:
        return cls.model_validate_json(Path(path).read_text())
