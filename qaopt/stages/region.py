"""The region stage: the calibrated error region, and the closed-loop evidence folded into it.

Two artifacts, each with one writer:

- ``region.json``: the region calibration charted with injected errors. Written by
  calibration alone, under the key of everything that determines it (the simulator,
  QoS goal, calibration settings, NNs, the profile's budget and the field evidence);
  never changed afterwards.
- ``closed_loop.json``: what closed-loop validation observed with real approximated
  NNs in the loop. Written by the validation stage alone; each entry carries the key
  of the application it was observed on, so entries of another simulator or goal are
  ignored rather than misapplied.

The region a run searches in is a new object built from both: the calibrated region
with the closed-loop evidence folded in. Nothing is mutated on disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from qaopt.app_spec import AppSpec, content_hash, store
from qaopt.calibrate import CalibrationError, ErrorRegion, Evidence
from qaopt.field.evidence import spec_evidence
from qaopt.region_calibration import calibrate_spec

REGION_FILE = "region.json"
REGION_PLOT = "region.png"
KEY_INFO = "calibration_key"
"""The entry of the region's ``info`` that holds the key it was calibrated under."""
CLOSED_LOOP_FILE = "closed_loop.json"
CLOSED_LOOP_VERSION = 1
CLOSED_LOOP_SOURCE = "closed-loop"
"""The evidence source name closed-loop runs carry in the region (and its plot)."""


class ClosedLoopRun(BaseModel):
    """Closed-loop runs of one configuration, as evidence about its error point."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    application: str = Field(description="key of the simulator, QoS goal and NNs the runs were made with")
    candidates: dict[str, str] = Field(description="NN -> candidate key of the configuration that ran")
    errors: dict[str, float]
    passes: int
    failures: int
    note: str = ""

    def evidence(self) -> Evidence:
        return Evidence(self.errors, self.passes, self.failures, source=CLOSED_LOOP_SOURCE, note=self.note)


class ClosedLoopEvidence(BaseModel):
    """Every configuration's closed-loop runs of one run folder."""

    model_config = ConfigDict(extra="forbid")

    runs: list[ClosedLoopRun] = Field(default_factory=list)

    @classmethod
    def load(cls, run_dir: Path) -> ClosedLoopEvidence:
        """The folder's evidence; a missing, torn or older file is no evidence (validation re-derives it from its cache)."""
        return store.read_model(run_dir / CLOSED_LOOP_FILE, cls, CLOSED_LOOP_VERSION) or cls()

    def save(self, run_dir: Path) -> Path:
        return store.write_model(run_dir / CLOSED_LOOP_FILE, self, CLOSED_LOOP_VERSION)

    def with_run(self, run: ClosedLoopRun) -> ClosedLoopEvidence:
        """The evidence with ``run`` added, unless the same configuration's runs are already in it."""
        if any(r.application == run.application and r.candidates == run.candidates for r in self.runs):
            return self
        return ClosedLoopEvidence(runs=[*self.runs, run])

    def of(self, application: str) -> list[ClosedLoopRun]:
        return [r for r in self.runs if r.application == application]


def application_key(spec: AppSpec) -> str:
    """What closed-loop runs depend on: the simulator, the QoS goal and the NNs (their data defines the error axes)."""
    return spec.content_hash("evaluator", "qos", "nns")


def calibration_key(spec: AppSpec, budget: int | None, field_evidence: Sequence[Evidence]) -> str:
    """What the calibrated region depends on; a new field run changes it, so the region is recomputed from cached runs."""
    return content_hash(spec.content_hash("evaluator", "qos", "calibration", "nns"), budget,
                        [(dict(e.errors), e.passes, e.failures, e.source) for e in field_evidence])


def calibrated_region(spec: AppSpec, budget: int | None, run_dir: Path) -> ErrorRegion:
    """This spec's calibrated region: ``region.json`` when it was made from the same inputs, else calibrated now.

    Field runs logged in the spec's field store are evidence that confirms or overturns
    simulator verdicts; a new field run changes the key, so the region is recomputed
    (from cached simulator runs, in seconds).
    """
    field_evidence = spec_evidence(spec).evidence
    key = calibration_key(spec, budget, field_evidence)
    region = load_calibrated(run_dir, key)
    if region is None:
        region, _ = calibrate_spec(spec, budget=budget, out=run_dir, evidence=field_evidence, info={KEY_INFO: key})
    return region


def load_calibrated(run_dir: Path, key: str) -> ErrorRegion | None:
    """``region.json`` of this folder when it was calibrated under ``key``; else ``None`` (calibrate again)."""
    path = run_dir / REGION_FILE
    if not path.exists():
        return None
    try:
        region = ErrorRegion.load(path)
    except (CalibrationError, KeyError, TypeError, ValueError):  # a torn or older file is recomputed, never trusted
        return None
    return region if region.info.get(KEY_INFO) == key else None


def fold(calibrated: ErrorRegion, runs: Sequence[ClosedLoopRun]) -> ErrorRegion:
    """A new region: the calibrated one with closed-loop runs added as evidence (the calibrated object is untouched)."""
    region = ErrorRegion.from_json(calibrated.to_json())
    for run in runs:
        region.add_evidence(run.evidence())
    return region
