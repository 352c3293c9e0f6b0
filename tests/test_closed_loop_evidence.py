"""Fidelity: closed-loop evidence during the search, the region's measured fidelity, NaN candidates.

- A configuration whose in-search closed-loop check fails shrinks the region the search uses:
  a later trial at a point dominating it is infeasible, validation skips it, and a resumed run
  (or one killed before it recorded the check) reuses the cached runs instead of running again;
  a round's checks run side by side on an executor; and when the evidence leaves even the
  reference outside the region, the error names the evidence, not the calibration, as the cause.
- ``Fidelity`` counts agreement and false-valid verdicts over validations and checks, each
  configuration once, with the error model named; an older ``result.json`` still loads.
- A candidate whose outputs hold NaN makes its trial infeasible with the reason, and the study goes on.

The closed-loop runs are replaced by scripted verdicts; the tiny application's region is calibrated once.
"""

from __future__ import annotations

import dataclasses
import io
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
import yaml
from rich.console import Console

import qaopt.stages.checks as checks_stage
import qaopt.stages.validation as validation_stage
from qaopt import optimize
from qaopt.app_spec import SpecError, content_hash
from qaopt.events import Events, Note, Trial
from qaopt.agnostic import OBJECTIVES as agnostic_objectives
from qaopt.agnostic import run_unit
from qaopt.plan import BoundApplication, build_plan
from qaopt.seeding import Unit
from qaopt.profiles import get_profile
from qaopt.report import write_report
from qaopt.result import Configuration, Fidelity, NNChoice, Result, Validation
from qaopt.search import (
    ATTR_CONFIGURATION,
    ATTR_FEASIBLE,
    OptimizeError,
    FixedRegion,
    SearchContext,
    open_storage,
    record_check,
    recorded_checks,
    run_study,
    summarize,
)
from qaopt.spec import load_spec
from qaopt.stages.checks import ClosedLoopChecks
from qaopt.stages.reference import reference_configuration
from qaopt.stages.region import (
    CLOSED_LOOP_FILE,
    CalibratedRegion,
    ClosedLoopEvidence,
    ClosedLoopRun,
    RegionChoice,
    calibrated_region,
)

APPS = Path(__file__).resolve().parent / "apps"
QUIET = Console(file=io.StringIO())
CHECKING = get_profile("quick").model_copy(update={"closed_loop_checks": None})
"""The quick profile with the in-search checks it leaves out."""
FAR = 3.0
"""How much more than the reference an approximation errs (on some NN) for the scripted closed loop to fail it."""
TRIALS = 10
"""The study budget the checks are told of: more than the scripted studies hold, so a round may run."""


def _spec(folder: Path, **search) -> Path:
    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    data["search"].update(search)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "tiny.yaml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny spec (checks every 3 trials, 2 per round) and its calibrated region (seconds)."""
    folder = tmp_path_factory.mktemp("tiny")
    spec = load_spec(_spec(folder, closed_loop={"every": 3, "configurations": 2}))
    return spec, calibrated_region(BoundApplication(spec), 12, folder / "calibrated").region


class Scripted:
    """Closed-loop runs replaced: configurations whose trial is in ``failing`` fail every run; counts the calls."""

    def __init__(self, failing: set[int | None]):
        self.failing, self.calls = failing, []

    def __call__(self, evaluator, nns, goal, test, runs, *, trial, region_predicted_valid, **_):
        self.calls.append(trial)
        fails = trial in self.failing
        return Validation(trial=trial, runs=runs, passes=0 if fails else runs, failures=runs if fails else 0,
                          verdict="invalid" if fails else "undecided", accepted=False,
                          region_predicted_valid=region_predicted_valid, qos_metric_mean=float(fails))


class _Unbuilt(SearchContext):
    """A search context whose NNs are never built: the checks only need their candidate keys."""

    def build(self, name, knobs, serves=()):
        return SimpleNamespace(key=name, nn=name, module=None, onnx_path=None, predict=None, columns=None)


def _context(spec, run_dir: Path, cache_dir: Path, profile=CHECKING, trials: int = TRIALS) -> SearchContext:
    plan = dataclasses.replace(build_plan(spec, profile, out=run_dir, trials=trials), cache_dir=cache_dir)
    return _Unbuilt(plan, {}, None)


def _checks(ctx: SearchContext, calibrated, evidence=None, executor=None, said=None) -> ClosedLoopChecks:
    """The checks of a run whose calibrated region is ``calibrated``, starting from ``evidence``."""
    events = Events()
    if said is not None:
        events.subscribe(lambda e: said.append(e.text) if isinstance(e, Note) else None)
    region = CalibratedRegion(RegionChoice(calibrated, ctx.plan.run_dir / "region.json", ""),
                              evidence or ClosedLoopEvidence(), ctx.plan.application.key)
    return ClosedLoopChecks(ctx, region, events.for_stage("aware search"), executor=executor)


def _config(trial: int, errors: dict[str, float], latency: float, mib: float = 1.0) -> Configuration:
    choice = NNChoice(knobs={}, candidate=f"candidate-{trial}", error=0.0, metric="l1", backend="torch",
                      latency_ms=latency, memory_bytes=None, macs=0, params=0)
    return Configuration(trial=trial, nns={"a": choice, "b": choice.model_copy(update={"candidate": f"b-{trial}"})},
                         schedule="sequential", latency_ms=latency, memory_bytes=int(mib * 2**20), errors=errors,
                         in_region=True)


def _study(configs: list[Configuration]) -> optuna.Study:
    """An in-memory study holding ``configs`` as finished feasible trials (objectives: latency, memory)."""
    study = optuna.create_study(directions=["minimize", "minimize"])
    for config in configs:
        study.add_trial(optuna.trial.create_trial(
            values=[config.latency_ms, config.memory_bytes / 2**20], params={}, distributions={},
            user_attrs={ATTR_FEASIBLE: True, ATTR_CONFIGURATION: config.model_dump(mode="json")}))
    return study


def _points(region):
    """Two certified points: ``low`` (least error of NN a) and ``high`` (most), and a point just above ``high``."""
    accepted = sorted((p.errors for p in region.labelled() if p.valid and region.contains(p.errors)),
                      key=lambda e: e["a"])
    low, high = accepted[0], accepted[-1]
    assert low["a"] < high["a"], "the tiny region needs two certified points"
    return low, high, {k: v * 1.01 for k, v in high.items()}


def test_a_failing_check_shrinks_the_region_later_trials_use(tiny, tmp_path, monkeypatch):
    spec, calibrated = tiny
    low, high, above = _points(calibrated)
    scripted = Scripted(failing={1})
    monkeypatch.setattr(validation_stage, "validate_closed_loop", scripted)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ctx = _context(spec, run_dir, tmp_path / "cache")
    said: list[str] = []
    checks = _checks(ctx, calibrated, said=said)
    slow, fast, beaten = _config(0, low, 2.0, 1.0), _config(1, high, 1.0, 2.0), _config(2, low, 3.0, 3.0)
    study = _study([slow, fast, beaten])
    assert checks.current().version == 0
    assert ctx.violation("aware", above, {}, checks.current().region) <= 0, \
        "before the check, the point above the failure is feasible"
    before = calibrated.to_json()

    checks(study, study.trials[-1])  # the third completed trial: a round (every: 3)

    assert sorted(scripted.calls) == [0, 1], "the front is checked; trial 2 (slower and larger than 0) is not on it"
    assert sorted(recorded_checks(study)) == [0, 1]
    assert all(v.runs == ctx.plan.closed_loop.runs == 6 for v in recorded_checks(study).values())  # 6 < 8
    assert checks.current().version == 1, "the failing check made the region's next version"
    assert ctx.violation("aware", above, {}, checks.current().region) > 0, \
        "a later trial dominating the failure must be infeasible"
    assert not checks.current().region.contains(high) and checks.current().region.contains(low)
    assert calibrated.to_json() == before, "the calibrated region is never changed"
    [run] = ClosedLoopEvidence.load(run_dir).runs
    assert run.errors == high and run.failures == 6 and run.candidates == {"a": "candidate-1", "b": "b-1"}
    assert any("closed-loop checks after 3 completed trials" in line for line in said)
    assert any("region refitted" in line and "trial 1 now outside it" in line for line in said)
    summary = summarize(study, spec.search.objectives)
    assert [v.trial for v in summary.closed_loop_checks] == [0, 1]

    # Validation never chooses the configuration its check refuted.
    scripted.calls.clear()
    front = validation_stage.validate_front(ctx, [fast, slow], checks.calibrated, checks.evidence, slow)
    assert [v.trial for v in front.validations] == [0] and front.chosen.trial == 0, "trial 1 is skipped"
    assert scripted.calls == [0], "trial 0's check was a quick-profile validation (6 runs), read from the cache; " \
        "only its fresh-seed runs ran"
    assert front.acceptance is not None and front.acceptance.trial == 0

    # A resumed run: the evidence file restores the region, and nothing checked is run again.
    scripted.calls.clear()
    resumed = _checks(ctx, calibrated, ClosedLoopEvidence.load(run_dir))
    assert ctx.violation("aware", above, {}, resumed.current().region) > 0
    assert resumed.round(study, "on resume") == [] and scripted.calls == []

    # Killed before the checks were recorded (a fresh study, no evidence file): the cached runs are read back.
    (run_dir / CLOSED_LOOP_FILE).unlink()
    killed = _checks(ctx, calibrated)
    again = killed.round(_study([slow, fast, beaten]), "after the kill")
    assert scripted.calls == [] and sorted(v.failures for v in again) == [0, 6]
    assert not killed.current().region.contains(high) and (run_dir / CLOSED_LOOP_FILE).exists()


def test_no_checks_in_the_quick_profile_when_every_is_0_or_after_the_last_trial(tiny, tmp_path):
    spec, calibrated = tiny
    study = _study([_config(n, _points(calibrated)[0], 1.0 + n, 3.0 - n) for n in range(3)])
    quick = _context(spec, tmp_path, tmp_path, profile=get_profile("quick"))
    off_spec = spec.model_copy(update={"search": spec.search.model_copy(
        update={"closed_loop": spec.search.closed_loop.model_copy(update={"every": 0})})})
    off = _context(off_spec, tmp_path, tmp_path)
    last = _context(spec, tmp_path, tmp_path, trials=3)  # 3: the study's last trial just ended
    for context in (quick, off, last):
        checks = _checks(context, calibrated)
        checks(study, study.trials[-1])
        assert recorded_checks(study) == {}
    assert _checks(quick, calibrated).every == 0


def test_a_rounds_checks_run_at_once_on_an_executor(tiny, tmp_path, monkeypatch):
    """Each check is one block of runs: on an executor with several workers, a round's checks run side by side."""
    spec, calibrated = tiny
    low, high, _ = _points(calibrated)
    both = threading.Barrier(2, timeout=30)  # broken unless the two checks run at the same time
    scripted = Scripted(failing={1})

    def side_by_side(*args, **kwargs):
        both.wait()
        return scripted(*args, **kwargs)

    monkeypatch.setattr(validation_stage, "validate_closed_loop", side_by_side)
    ctx = _context(spec, tmp_path, tmp_path / "cache")
    study = _study([_config(0, low, 2.0, 1.0), _config(1, high, 1.0, 2.0)])
    with ThreadPoolExecutor(2) as executor:
        checks = _checks(ctx, calibrated, executor=executor)
        ran = checks.round(study, "now")
    assert sorted((v.trial, v.failures) for v in ran) == [(0, 0), (1, 6)]
    assert not checks.current().region.contains(high)


def test_a_check_recorded_by_another_worker_is_folded_in(tiny, tmp_path, monkeypatch):
    spec, calibrated = tiny
    _, high, above = _points(calibrated)
    study = _study([_config(0, high, 1.0)])
    record_check(study, Validation(trial=0, runs=6, passes=0, failures=6, verdict="invalid", accepted=False,
                                   region_predicted_valid=True, qos_metric_mean=1.0))
    ctx = _context(spec, tmp_path, tmp_path / "cache")
    checks = _checks(ctx, calibrated)
    checks.absorb(study)
    assert ctx.violation("aware", above, {}, checks.current().region) > 0 and len(checks.evidence.runs) == 1
    assert (tmp_path / CLOSED_LOOP_FILE).exists()


@pytest.mark.timeout(300)
def test_optimize_checks_the_front_during_the_search(tmp_path, monkeypatch):
    """End to end on the tiny app: checks after 2 and 4 of 5 trials, every approximation that errs far more than the
    reference on some NN fails closed-loop; a re-run runs none.

    Those close to the reference pass: failures next to it (or below it: fine-tuning can err less) would rightly
    leave the reference itself uncertified, and the re-run would stop on it (the next test's case).
    """
    spec = _spec(tmp_path / "app", closed_loop={"every": 2, "configurations": 1})
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    plan = build_plan(load_spec(spec), CHECKING)
    ctx = SearchContext(plan, plan.application.target_nns(plan.cache_dir), calibrated_region(
        plan.application, 4, tmp_path / "reference-region").region)
    reference = ctx.errors_of(ctx.reference)
    errors_of: dict[int | None, dict[str, float]] = {}
    real = validation_stage.validate_configuration

    def remember(ctx, config, **options):
        errors_of[config.trial] = config.errors
        return real(ctx, config, **options)

    monkeypatch.setattr(validation_stage, "validate_configuration", remember)
    monkeypatch.setattr(checks_stage, "validate_configuration", remember)

    class AboveReferenceFails(Scripted):
        def __call__(self, *args, trial, **kwargs):
            errs = errors_of[trial]
            far = trial is not None and any(errs[k] > FAR * reference[k] for k in errs)
            self.failing = {trial} if far else set()
            return super().__call__(*args, trial=trial, **kwargs)

    scripted = AboveReferenceFails(set())
    monkeypatch.setattr(validation_stage, "validate_closed_loop", scripted)
    first = optimize(spec, profile=CHECKING, trials=5, console=QUIET)
    checks = first.studies["aware"].closed_loop_checks
    assert len(checks) >= 1 and all(v.runs == 6 for v in checks)
    run = spec.parent / "runs"
    failed = [v.trial for v in checks if v.failures]
    if failed:  # a failing check is evidence, and validation never chooses it
        saved = {tuple(sorted(r.errors.items())) for r in ClosedLoopEvidence.load(run).runs}
        assert all(tuple(sorted(t.errors.items())) in saved for t in first.studies["aware"].trials if t.number in failed)
        assert first.aware is None or first.aware.trial not in failed
    assert first.fidelity.error_model == "gaussian"
    assert first.fidelity.configurations == len({v.trial for v in [*first.validations, *checks]})
    report = (run / "report.md").read_text()
    assert "### Closed-loop checks during the search" in report and "### Region fidelity" in report
    assert Result.load(run / "result.json") == first

    scripted.calls.clear()
    again = optimize(spec, profile=CHECKING, trials=5, console=QUIET)
    assert scripted.calls == [], "a re-run reuses every cached closed-loop run"
    assert again.studies == first.studies and again.fidelity == first.fidelity


def test_the_spec_section_has_defaults_and_names_a_bad_setting(tmp_path):
    spec = load_spec(_spec(tmp_path / "default"))
    assert (spec.search.closed_loop.every, spec.search.closed_loop.configurations) == (10, 2)
    with pytest.raises(SpecError) as info:
        load_spec(_spec(tmp_path / "bad", closed_loop={"every": -1, "configuration": 2}))
    problems = str(info.value)
    assert "search.closed_loop.every: Input should be greater than or equal to 0" in problems
    assert "search.closed_loop.configuration: unknown field; did you mean 'configurations'?" in problems


def _validation(trial: int | None, verdict: str, predicted: bool = True, runs: int = 8) -> Validation:
    failures = {"valid": 0, "invalid": 3, "undecided": 1}[verdict]
    return Validation(trial=trial, runs=runs, passes=runs - failures, failures=failures, verdict=verdict,
                      accepted=verdict == "valid", region_predicted_valid=predicted, qos_metric_mean=0.0)


def test_fidelity_counts_agreement_and_false_valid_once_per_configuration():
    validations = [_validation(3, "invalid"), _validation(5, "valid"), _validation(None, "valid")]
    checks = [_validation(3, "invalid", runs=6), _validation(7, "invalid", runs=6), _validation(9, "undecided", runs=6),
              _validation(11, "valid", predicted=False, runs=6)]
    f = Fidelity.of("ar1", validations, checks)
    assert (f.configurations, f.checked_during_search, f.decided) == (6, 3, 5)
    assert f.false_valid == 2  # trials 3 and 7: the region said valid, the closed loop proved them invalid
    assert f.agreement == pytest.approx(2 / 5)  # 5 and the reference agree; 3, 7 and 11 do not
    assert f.closed_loop_runs == 3 * 8 + 3 * 6
    assert "error model 'ar1'" in f.note and "trial 3, trial 7" in f.note
    assert "docs/calibration.md, error models" in f.note and "empirical" not in f.note

    undecided = Fidelity.of("gaussian", [_validation(1, "undecided")])
    assert undecided.agreement is None and undecided.decided == 0 and "does not measure" in undecided.note
    assert Fidelity.of("gaussian", []).note == ""


def test_report_and_older_result_files_show_fidelity(tmp_path):
    """The report states the figures with the error model; a version-3 result.json loads with them recomputed."""
    reference = _config(0, {"a": 0.01, "b": 0.01}, 1.0).model_copy(update={"trial": None})
    validations = [_validation(4, "invalid"), _validation(None, "valid")]
    result = Result(
        app="tiny", spec="tiny.yaml", spec_hash="0", profile="quick", run_dir=tmp_path, reference=reference,
        agnostic_tolerance=0.02, speedups={}, validations=validations, fidelity=Fidelity.of("ar1", validations),
        studies={"aware": {"name": "aware", "trials_complete": 0, "trials_failed": 0, "trials_feasible": 0}},
        region=tmp_path / "region.json", report=tmp_path / "report.md")
    report = write_report(result, tmp_path).read_text()
    assert "The region (error model `ar1`) against closed-loop truth: 2 configuration(s) ran closed-loop" in report
    assert "agreed with 50% of them; 1 that it called valid failed closed-loop (false valid)" in report

    old = json.loads(result.model_dump_json())
    old.update(version=3, fidelity=0.5, fidelity_note="consider error_model: empirical.")
    (tmp_path / "result.json").write_text(json.dumps(old))
    loaded = Result.load(tmp_path / "result.json")
    assert loaded.fidelity == Fidelity.of(None, validations) and loaded.version == result.version


def test_a_candidate_that_outputs_nan_makes_its_trial_infeasible(tmp_path, monkeypatch):
    """Approximated NN a outputs NaN on its validation data whenever it is approximated: infeasible, with the reason."""
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec(_spec(tmp_path / "app"))
    calibrated = calibrated_region(BoundApplication(spec), 4, tmp_path / "run").region
    plan = build_plan(spec, get_profile("quick"), trials=3)

    class NaNForA(SearchContext):
        def build(self, name, knobs):
            if name == "a" and knobs != self.reference_knobs["a"]:  # the reference NN stands in for every candidate
                reference = self.reference["a"]
                nan = tuple(np.full_like(r, np.nan) for r in reference.residuals)
                return dataclasses.replace(reference, key=f"nan-{content_hash(knobs)}", error=float("nan"),
                                           residuals=nan)
            return super().build(name, self.reference_knobs[name])

    ctx = NaNForA(plan, plan.application.target_nns(plan.cache_dir), calibrated)
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    said: list[str] = []
    events = Events()
    events.subscribe(lambda e: said.append(f"{e.phase}: {e.detail}") if isinstance(e, Trial) else None)
    aware = run_study(ctx, storage, FixedRegion(calibrated), events.for_stage("aware search"))
    agnostic = run_unit(ctx, Unit("a"), storage, events.for_stage("agnostic search"), [0])
    for study, objectives in ((aware, spec.search.objectives), (agnostic, agnostic_objectives)):
        summary = summarize(study, objectives)
        assert summary.trials_complete == 3 and summary.trials_failed == 0, "the study goes on"
        unusable = [t for t in summary.trials if t.infeasible]
        assert unusable and all(not t.feasible and t.errors == {} and t.configuration is None for t in unusable)
        assert all(t.infeasible.startswith("nns.a: candidate nan-") and
                   t.infeasible.endswith(" outputs NaN on its validation data") for t in unusable)
        assert summary.model_validate_json(summary.model_dump_json()) == summary, "nothing NaN reaches result.json"
    assert any("infeasible: nns.a: candidate nan-" in line for line in said)


def test_evidence_that_leaves_the_reference_outside_is_named_as_the_cause(tmp_path, monkeypatch):
    """When closed-loop failures, not the calibration, moved the boundary below the reference, the error says so."""
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec(_spec(tmp_path / "app"))
    app = BoundApplication(spec)
    calibrated = calibrated_region(app, 12, tmp_path / "run").region
    plan = build_plan(spec, get_profile("quick"), out=tmp_path / "run")
    ctx = SearchContext(plan, app.target_nns(plan.cache_dir), calibrated)
    point = ctx.errors_of(ctx.reference)
    assert calibrated.contains(point)
    failed = ClosedLoopRun(application=app.key, candidates={"a": "x", "b": "y"}, errors=point, passes=0, failures=8)
    region = CalibratedRegion(RegionChoice(calibrated, tmp_path / "run" / "region.json", ""),
                              ClosedLoopEvidence(runs=[failed]), app.key)
    with pytest.raises(OptimizeError, match=r"the closed-loop evidence in closed_loop.json .* though the calibrated "
                                            r"region alone certifies them: the error model 'gaussian' misses how"):
        reference_configuration(ctx, region)
