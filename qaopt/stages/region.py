"""The region stage: the calibrated error region, and the closed-loop evidence folded into it.

Two artifacts, each with one writer:

- ``region.json``: the region calibration charted with injected errors. Written by
  :func:`qaopt.region_calibration.calibrate_spec` alone (``qaopt calibrate``, or this
  stage when no compatible region exists); never changed afterwards. A run reuses it
  when it fits the spec (same simulator, QoS goal, error space and models, see
  :func:`differences`), holds the current field evidence and was calibrated with at
  least the run's budget; it replaces it otherwise, and says so (console and report).
- ``closed_loop.json``: what closed-loop runs observed with real approximated NNs in
  the loop, after the search (validation) or during it (:mod:`qaopt.stages.checks`).
  Its entries are made by :func:`qaopt.stages.validation.with_validation` alone; each
  carries the key of the application it was observed on, so entries of another
  simulator or goal are ignored rather than misapplied.

The region a run searches in is a new object built from both: the calibrated region
with the closed-loop evidence folded in, where each point's runs act by their verdict
(:meth:`~qaopt.calibrate.region.ErrorRegion.runs`). Nothing is mutated on disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from qaopt.app_spec import store
from qaopt.calibrate import Calibration, CalibrationError, ErrorRegion, Evidence, Progress, Verdict
from qaopt.calibrate.calibration import point_text
from qaopt.calibrate.region import SIMULATOR
from qaopt.events import Progress as ProgressEvent
from qaopt.pipeline import BaseStage, StageRun, register_stage
from qaopt.plan import BoundApplication

REGION_FILE = "region.json"
REGION_PLOT = "region.png"
PREVIOUS_REGION_FILE = "region.previous.json"
"""Where an incompatible ``region.json`` is kept when a run calibrates for its own spec."""
WRITER_INFO = "written_by"
"""The entry of the region's ``info`` that names the command that calibrated it (absent: ``qaopt calibrate``)."""
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


@dataclass(frozen=True)
class RegionChoice:
    """The calibrated region a run searches in, the file it lives in, and how it was obtained (console and report)."""

    region: ErrorRegion
    path: Path
    note: str


def calibrated_region(
    app: BoundApplication, budget: int, run_dir: Path, region_file: Path | None = None,
    say: Callable[[str], None] = lambda line: None,
    executor: Executor | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> RegionChoice:
    """The application's calibrated region: an existing compatible one, reused; else calibrated now with ``budget``.

    ``region_file`` (``--region``) is used as given, never rewritten: an incompatible one
    is an error. Otherwise ``run_dir/region.json`` (written by ``qaopt calibrate`` or an
    earlier run) is reused when it is compatible (:func:`differences`) and was calibrated
    with at least ``budget`` evaluations: a larger budget makes a better region, so a
    quick profile never replaces it. A smaller, stale (field evidence changed) or
    incompatible one is replaced by a new calibration (simulator runs come from the
    cache), and ``say`` tells so; an incompatible one is first kept as ``region.previous.json``.
    ``executor`` runs a new calibration's seed blocks (:mod:`qaopt.executor`); ``progress``
    sees each of its blocks and points.
    """
    wanted = budget
    field_evidence = app.field_evidence()
    cal = app.calibration(executor)
    if region_file is not None:
        path = Path(region_file).resolve()
        region = ErrorRegion.load(path)  # a CalibrationError names the file
        problems = differences(region, cal)
        if problems:
            raise CalibrationError(f"--region {path}: calibrated for other inputs than {app.source} ("
                                   f"{'; '.join(problems)}); run `qaopt calibrate {app.source}` or leave --region out")
        note = f"region from --region {path} ({_budget_text(region)}), used as given"
        if _budget(region) < wanted:
            note += f"; its budget is below this run's {wanted}"
        new_evidence = _missing(field_evidence, region)
        if new_evidence:
            note += f"; {len(new_evidence)} newer field evidence point(s) folded in"
            region = _with_evidence(region, new_evidence)
        say(note)
        return RegionChoice(region, path, note)

    path = run_dir / REGION_FILE
    existing, unreadable = _read(path)
    if existing is None:
        if unreadable:
            store.set_aside(path, unreadable)
        note = f"{REGION_FILE} was unreadable ({unreadable}); calibrating anew" if unreadable else ""
        calibrate_with = wanted
    else:
        problems = differences(existing, cal)
        if problems:
            kept = path.with_name(PREVIOUS_REGION_FILE)
            os.replace(path, kept)  # nothing computed is lost: the other inputs' region stays readable
            note = (f"{REGION_FILE} was calibrated for other inputs ({'; '.join(problems)}); kept as {kept.name}, "
                    f"calibrating for this spec")
            calibrate_with = wanted
        elif _missing(field_evidence, existing) or len(_field(existing)) != len(field_evidence):
            calibrate_with = max(wanted, _budget(existing))
            note = (f"field evidence changed since {REGION_FILE} ({_budget_text(existing)}) was calibrated; "
                    f"calibrating again with budget {calibrate_with} (simulator runs come from the cache)")
        elif _budget(existing) >= wanted:
            note = f"reusing {REGION_FILE} ({_budget_text(existing)}; this run asks for {wanted})"
            say(note)
            return RegionChoice(existing, path, note)
        else:
            calibrate_with = wanted
            note = (f"replacing {REGION_FILE} ({_budget_text(existing)}) with a budget-{wanted} calibration "
                    f"(its simulator runs come from the cache)")
    if note:
        say(note)
    region = app.calibrate(cal, calibrate_with, run_dir, field_evidence, {WRITER_INFO: "qaopt optimize"}, progress)
    return RegionChoice(region, path, note or f"calibrated {REGION_FILE} (budget {calibrate_with})")


def differences(region: ErrorRegion, cal: Calibration) -> list[str]:
    """What makes ``region`` unusable for the calibration ``cal`` describes; empty when compatible.

    Compatible means the same simulator (its params and code), QoS goal and acceptance test,
    error space (the NNs and their axes), NN error metrics, error models and certifier, and no point
    recorded as an application error (as releases before the run stopped on one did). The strategy
    and the budget may differ: they decide how well the region is charted, not what it means.
    """
    info = region.info
    expected = {
        "simulator": (info.get("app_key"), cal.app_key),
        "QoS goal": (info.get("goal"), cal.goal.to_json()),
        "acceptance test": (region.acceptance.to_json(), cal.acceptance.to_json()),
        "error space": (region.space.to_json(), cal.space.to_json()),
        "NN error metrics": (region.metrics, {nn: m.config()["metric"] for nn, m in cal.models.items()
                                              if nn in cal.space.nns}),
        "error model": (info.get("error_models"), {nn: cal.models[nn].config() for nn in cal.space.nns}),
        "certifier": (region.certifier, cal.certifier),
    }
    problems = [f"{what} differs" for what, (have, want) in expected.items() if _canonical(have) != _canonical(want)]
    failed = sum(o.verdict is Verdict.FAILED for o in region.observations)
    if failed:  # an earlier release recorded an application error as a point; such a region is not a measurement
        problems.append(f"{failed} of its points ended in an application error instead of a verdict")
    return problems


def _canonical(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _read(path: Path) -> tuple[ErrorRegion | None, str]:
    if not path.exists():
        return None, ""
    try:
        return ErrorRegion.load(path), ""
    except CalibrationError as exc:  # a torn or older file is recomputed, never trusted
        return None, str(exc).splitlines()[0]


def _budget(region: ErrorRegion) -> int:
    budget = region.info.get("budget")
    return budget if isinstance(budget, int) else region.evaluations


def _budget_text(region: ErrorRegion) -> str:
    by = region.info.get(WRITER_INFO) or ("qaopt optimize" if "calibration_key" in region.info else "qaopt calibrate")
    return f"budget {_budget(region)}, {region.evaluations} evaluations, by {by}"


def _field(region: ErrorRegion) -> list[tuple]:
    return [_evidence_key(o.errors, o.passes, o.failures, o.source) for o in region.observations if o.source != SIMULATOR]


def _evidence_key(errors: Mapping[str, float], passes: int, failures: int, source: str) -> tuple:
    return (tuple(sorted((k, round(float(v), 9)) for k, v in errors.items())), passes, failures, source)


def _missing(evidence: Sequence[Evidence], region: ErrorRegion) -> list[Evidence]:
    """The field evidence ``region`` was not calibrated with."""
    have = set(_field(region))
    return [e for e in evidence if _evidence_key(e.errors, e.passes, e.failures, e.source) not in have]


def _with_evidence(region: ErrorRegion, evidence: Sequence[Evidence]) -> ErrorRegion:
    copy = region.copy()
    copy.add_evidence(list(evidence))
    return copy


def fold(calibrated: ErrorRegion, runs: Sequence[ClosedLoopRun]) -> ErrorRegion:
    """A new region: the calibrated one with closed-loop runs added as evidence (the calibrated object is untouched)."""
    return _with_evidence(calibrated, [run.evidence() for run in runs])


@dataclass(frozen=True)
class CalibratedRegion:
    """The region stage's artifact: the calibrated region as chosen, and the run folder's closed-loop evidence."""

    choice: RegionChoice
    evidence: ClosedLoopEvidence
    application: str
    """The key the evidence of this application is filed under (:attr:`BoundApplication.key`)."""

    @property
    def region(self) -> ErrorRegion:
        return self.choice.region

    def searched(self, evidence: ClosedLoopEvidence | None = None) -> ErrorRegion:
        """The region a search judges by: the calibrated one with ``evidence`` (default: the folder's) folded in."""
        return fold(self.region, (evidence or self.evidence).of(self.application))


@register_stage
class RegionStage(BaseStage):
    """Calibrate the error region, or reuse a compatible one; fold in the closed-loop evidence of earlier runs."""

    name = "calibration"
    artifact = f"{REGION_FILE}, {REGION_PLOT} (run folder)"

    def total(self, run: StageRun, inputs) -> float | None:
        return run.plan.calibration_budget

    def run(self, run: StageRun, inputs) -> CalibratedRegion:
        plan, events = run.plan, run.emitter(self.name)
        if run.executor is not None:
            events.note(f"simulator runs on {getattr(run.executor, 'where', type(run.executor).__name__)}")

        def calibrating(step: Progress) -> None:
            point = point_text(step.errors)
            done = step.evaluation if step.observation is not None else step.evaluation - 1
            state = step.observation.verdict.value if step.observation is not None else f"{step.trials} runs"
            events.emit(ProgressEvent(self.name, done, step.budget, f"{point}: {state}"))

        choice = calibrated_region(plan.application, plan.calibration_budget, plan.run_dir, plan.region_file,
                                   say=events.note, executor=run.executor, progress=calibrating)
        if choice.path != plan.run_dir / REGION_FILE or not (plan.run_dir / REGION_PLOT).exists():
            choice.region.plot(plan.run_dir / REGION_PLOT)  # the report shows the run folder's plot
        return CalibratedRegion(choice, ClosedLoopEvidence.load(plan.run_dir), plan.application.key)
