"""`qaopt optimize` end to end on the tiny test application (tests/apps/tinyapp.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from optuna.trial import TrialState
from rich.console import Console

import qaopt.region_calibration as region_calibration
import qaopt.search as search_module
import qaopt.stages.validation as validation_stage
from qaopt import optimize
from qaopt.result import Result
from qaopt.search import ATTR_SKIPPED, OptimizeError

APPS = Path(__file__).resolve().parent / "apps"
QUIET = Console(file=io.StringIO())


def _spec(folder: Path, **edits) -> Path:
    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    for dotted, value in edits.items():
        *parents, leaf = dotted.split(".")
        node = data
        for p in parents:
            node = node[p]
        node[leaf] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(APPS)}


def _qaopt() -> str:
    return str(Path(sys.executable).parent / "qaopt")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    spec = _spec(tmp_path_factory.mktemp("tiny"))
    return spec, optimize(spec, profile="quick", trials=4, console=QUIET)


def test_end_to_end_outputs(tiny_run):
    spec, result = tiny_run
    run = spec.parent / "runs"
    assert Result.load(run / "result.json") == result
    assert result.studies["aware"].trials_complete + result.studies["aware"].trials_failed == 4
    # The agnostic baseline: a study per NN and per merge group, each with the aware study's budget; the toy's merged
    # NN is outside a member's tolerance before any knob, so its group is not searched, and the report says why.
    assert {m: s.trials_complete for m, s in result.studies.items() if m != "aware"} == {
        "agnostic.a": 4, "agnostic.b": 4, "agnostic.a+b": 0}
    assert "already outside tolerance" in result.studies["agnostic.a+b"].skipped
    # Distilling the merged NN takes minutes on a real application: the search's log says so when it starts.
    assert "into one backbone: distilling" in QUIET.file.getvalue()
    assert result.agnostic_converged is not None and result.agnostic_converged.trials == 8
    assert result.agnostic_rule is not None and set(result.agnostic_rule.nns) == {"a", "b"}
    # The reference configuration is the first trial of each study, measured once.
    assert result.reference.latency_ms > 0 and result.reference.errors.keys() == {"a", "b"}
    assert result.aware is not None and result.aware.in_region
    assert result.speedups.aware == pytest.approx(result.reference.latency_ms / result.aware.latency_ms)
    # Each NN's latency of a sequential frame was taken beside its frame's, in the side-by-side stage's process.
    for config in (result.reference, result.aware, result.agnostic):
        if config.schedule == "sequential":
            assert {c.latency.epoch for c in config.nns.values()} == {config.latency.epoch}
    assert result.validations and result.validations[0].runs == 6
    # The quick profile's 6 runs cannot accept at the tiny app's goal; the report says how strict validation is.
    assert result.validation_power is not None and result.validation_power.runs == 6
    assert result.agnostic_validation is not None and 1 <= result.agnostic_validation.runs <= 6
    report = (run / "report.md").read_text()
    assert "the application-agnostic configuration passed" in report
    assert "Not searched:\n\n- agnostic.a+b: the merged NN, unpruned" in report
    assert result.validation_power.line in report
    for section in ("## Outcome", "## Error region", "## Closed-loop validation", "## Search", "region.png", "pareto.png",
                    "### The application-agnostic tolerance", "agnostic_convergence.png"):
        assert section in report
    assert (run / "pareto.png").stat().st_size > 0 and (run / "region.png").stat().st_size > 0


def test_artifacts_are_deployable(tiny_run):
    import onnxruntime as ort

    _, result = tiny_run
    for nn, files in result.artifacts.items():
        assert set(files) == {"module", "state_dict", "onnx", "compiled", "form"}
        form = json.loads(Path(files["form"]).read_text())["data"]
        serves = result.aware.nns[nn].serves or [nn]
        columns = None if len(serves) == 1 else [serves.index(nn)]
        assert form == {"runs": "torch", "input_shape": [1, 1, 8, 8], "serves": serves, "columns": columns}, (
            "the tiny app's NNs are fp32; a merged one serves both NNs, each from its own output column")
        session = ort.InferenceSession(str(files["onnx"]), providers=["CPUExecutionProvider"])
        out = session.run(None, {"input": np.zeros((1, 1, 8, 8), np.float32)})[0]
        assert out.shape == (1, 1) and np.isfinite(out).all()
        assert all(Path(p).exists() for p in files.values()), nn


def test_load_artifacts_rebuilds_each_validated_nn(tiny_run, tmp_path):
    """One call rebuilds every chosen NN (pruned architecture included) with the chosen NN's outputs.

    The tiny NNs run in ~0.1 ms, where pruning saves no measurable time, so which pair a run chooses is
    down to timing: the run folder is copied and its choice replaced by a pruned pair, exported as
    ``optimize`` exports its choice.
    """
    import shutil

    import torch

    import qaopt
    from qaopt import kernels
    from qaopt.approx import Knobs, TargetNN, build
    from qaopt.calibrate import ErrorRegion
    from qaopt.plan import build_plan
    from qaopt.result import Result
    from qaopt.search import SearchContext
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import cache_dir_of
    from qaopt.stages.export import ARTIFACTS, export_configuration

    spec_path, result = tiny_run
    spec = load_spec(spec_path)
    run = tmp_path / "runs"
    shutil.copytree(spec_path.parent / "runs", run)
    plan = build_plan(spec, result.profile)
    ctx = SearchContext(plan, plan.application.target_nns(plan.cache_dir), ErrorRegion.load(result.region))
    nns = {}
    for name, choice in result.reference.nns.items():
        knobs = {**choice.knobs, "prune_ratio": 0.5, "finetune_steps": 10}
        candidate = ctx.build(name, knobs)
        nns[name] = choice.model_copy(update={"knobs": knobs, "bytes_hash": candidate.bytes_hash,
                                              "params": sum(p.numel() for p in candidate.module.parameters())})
    chosen = result.reference.model_copy(update={"nns": nns})
    export_configuration(ctx, chosen, run / ARTIFACTS)
    Result.load(run / "result.json").model_copy(update={"aware": chosen}).save(run / "result.json")

    modules = qaopt.load_artifacts(run)
    assert set(modules) == set(chosen.nns)
    assert all(c.params < result.reference.nns[n].params for n, c in chosen.nns.items())
    for name, choice in chosen.nns.items():
        target = TargetNN.from_spec(name, spec.nns[name])
        candidate = build(target, Knobs.model_validate(choice.knobs), cache_dir=cache_dir_of(spec), onnx=kernels.onnx)
        module = modules[name]
        assert sum(p.numel() for p in module.parameters()) == choice.params, "the pruned architecture was not rebuilt"
        x = np.asarray(target.data.x_val, np.float32)
        with torch.inference_mode():
            loaded = module(torch.from_numpy(x)).float().numpy()
        np.testing.assert_allclose(loaded, candidate.predict(x), rtol=1e-5, atol=1e-6)


def test_exported_merged_and_resized_nns_reload_with_the_same_outputs(tiny_run, tmp_path):
    """A merged, resized configuration exported as optimize exports it: load_artifacts gives each NN its head."""
    import shutil

    import torch

    import qaopt
    from qaopt.approx import Knobs
    from qaopt.calibrate import ErrorRegion
    from qaopt.plan import MergePlan, build_plan
    from qaopt.result import Result
    from qaopt.search import SearchContext
    from qaopt.spec import load_spec
    from qaopt.stages.export import ARTIFACTS, export_configuration

    spec_path, result = tiny_run
    spec = load_spec(spec_path)
    run = tmp_path / "runs"
    shutil.copytree(spec_path.parent / "runs", run)
    plan = build_plan(spec, result.profile)
    plan = type(plan)(**{**vars(plan), "merge_groups": (MergePlan(("a", "b"), 30),)})
    ctx = SearchContext(plan, plan.application.target_nns(plan.cache_dir), ErrorRegion.load(result.region))
    knobs = Knobs(input_scale=0.5, input_align=4, finetune_steps=10)
    views = ctx.build_merged(plan.merge_groups[0], knobs)
    nns = {n: c.model_copy(update={"knobs": knobs.model_dump(mode="json"), "candidate": views[n].key,
                                   "bytes_hash": views[n].bytes_hash, "serves": ["a", "b"]})
           for n, c in result.reference.nns.items()}
    chosen = result.reference.model_copy(update={"nns": nns})
    assert ctx.candidates(chosen)["b"].columns == (1,), "a stored configuration rebuilds its merged NN"
    export_configuration(ctx, chosen, run / ARTIFACTS)
    Result.load(run / "result.json").model_copy(update={"aware": chosen}).save(run / "result.json")

    modules = qaopt.load_artifacts(run)
    for name, view in views.items():
        x = np.asarray(ctx.nns[name].data.x_val, np.float32)
        assert x.shape[1:] == tuple(spec.nns[name].input_shape[1:]), "the artifact takes the full-size input"
        with torch.inference_mode():
            loaded = modules[name](torch.from_numpy(x)).float().numpy()
        np.testing.assert_allclose(loaded, view.predict(x), rtol=1e-5, atol=1e-6)


def test_the_chosen_configuration_is_accepted_on_seeds_that_did_not_choose_it(tiny_run):
    from qaopt.closed_loop import ACCEPTANCE_SEED_BASE, VALIDATION_SEED_BASE

    spec_path, result = tiny_run
    checks = result.studies["aware"].closed_loop_checks
    selecting = [*result.validations, *checks]
    assert selecting and all(v.seed_base == VALIDATION_SEED_BASE for v in selecting)
    acceptance = result.acceptance
    assert acceptance is not None and acceptance.trial == result.aware.trial
    assert acceptance.seed_base == ACCEPTANCE_SEED_BASE and result.agnostic_validation.seed_base == ACCEPTANCE_SEED_BASE
    # The runs of every selecting validation and those of the acceptance share no seed.
    selection_seeds = {v.seed_base + i for v in selecting for i in range(v.runs)}
    assert not selection_seeds & set(range(acceptance.seed_base, acceptance.seed_base + acceptance.runs))
    assert result.aware_accepted == acceptance.accepted
    report = (spec_path.parent / "runs" / "report.md").read_text()
    assert f"| {acceptance.trial} | fresh ({ACCEPTANCE_SEED_BASE}+) | {acceptance.runs} |" in report
    assert f"| {result.validations[0].trial} | selection ({VALIDATION_SEED_BASE}+) |" in report
    # The agnostic baseline is combined from per-NN studies, so no trial names it: its label does.
    assert result.agnostic_validation.name == "application-agnostic"
    assert f"| application-agnostic | fresh ({ACCEPTANCE_SEED_BASE}+) |" in report


def test_validation_table_shows_means_worst_runs_and_counts(tiny_run):
    spec_path, result = tiny_run
    v = result.validations[0]
    # tiny's QoS metric `crashes` (0/1 per run) is a count; `steps` (a length per run) is averaged.
    assert v.metrics["crashes"].total == v.failures and v.metrics["steps"].total is None
    assert v.metrics["steps"].mean == pytest.approx(30.0) and v.metrics["steps"].worst_run == pytest.approx(30.0)
    assert v.worst_seed is not None
    report = (spec_path.parent / "runs" / "report.md").read_text()
    assert "| crashes: total (worst run) | steps: mean (worst run) |" in report
    assert "total steps" not in report and "are totals over the runs" in report


def test_rerun_resumes_without_repeating_work(tiny_run, monkeypatch):
    spec, first = tiny_run

    def no_calibration(*args, **kwargs):
        raise AssertionError("the region of this spec exists and must be reused")

    monkeypatch.setattr(region_calibration, "calibrate_spec", no_calibration)
    again = optimize(spec, profile="quick", trials=4, console=QUIET)
    assert again.studies == first.studies
    # The same choice and validations; its latencies are measured again, side by side with the others, in every run.
    timed = {"latency_ms", "latency"}
    assert again.aware.trial == first.aware.trial
    assert ({n: c.model_dump(exclude=timed) for n, c in again.aware.nns.items()}
            == {n: c.model_dump(exclude=timed) for n, c in first.aware.nns.items()})
    assert again.validations == first.validations
    assert again.aware.latency.samples_ms != first.aware.latency.samples_ms
    assert again.speedups.intervals["aware"].verdict != "not comparable"


def test_a_dtype_no_backend_of_the_target_runs_is_left_out_not_a_failed_trial(tiny_run, monkeypatch):
    """As int8 on a CUDA target, whose auto backends (torch, torch-compile) run none: the CPU's auto list is cut to
    torch here. Left in, such trials would die as Optuna 'Trial failed' tracebacks."""
    from qaopt.kernels import BackendRef, auto

    spec, first = tiny_run
    monkeypatch.setitem(auto.DEVICE_BACKENDS, "cpu", (BackendRef("torch"),))
    data = yaml.safe_load(spec.read_text())
    data["target"]["backend"] = "auto"
    data["approximations"]["all"]["quantization"]["dtypes"] = ["fp32", "int8"]
    data["output"]["dir"] = "runs-int8"
    path = spec.with_name("int8.yaml")  # beside the module's spec: its cache serves the reference NNs
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    said = io.StringIO()
    result = optimize(path, profile="quick", trials=4, region=first.region, quiet=True,
                      console=Console(file=said, width=1000, log_time=False, log_path=False))
    line = ("int8 left out of the search: no backend here runs int8 on cpu (backends: torch); declare one "
            "(docs/extending.md, 'Adding a backend') or drop int8 from approximations.all.quantization.dtypes")
    assert line in [said_line.rstrip() for said_line in said.getvalue().splitlines()]
    assert result.left_out == [line] and f"- {line}" in result.report.read_text()
    assert all(s.trials_failed == 0 for s in result.studies.values()), [s.failures for s in result.studies.values()]
    assert not any(v == "int8" for s in result.studies.values() for t in s.trials for v in t.params.values())


def test_trials_timed_on_a_search_backend_are_compared_and_exported_on_the_targets_own(tiny_run, monkeypatch):
    """target.search_backend: the trials time every candidate on a backend that is quick to build; the reference and
    the chosen configurations are then compiled on target.backend (auto: every backend, the fastest kept), so both
    sides of the ratio, and the exported NNs, run on their own best backend (a GPU's Inductor costs 20-30 s a
    candidate)."""
    from qaopt.kernels import BackendRef, auto

    spec, first = tiny_run
    monkeypatch.setitem(auto.DEVICE_BACKENDS, "cpu", (BackendRef("torch"), BackendRef("onnxruntime")))
    data = yaml.safe_load(spec.read_text())
    data["target"].update(backend="auto", search_backend="torch")
    data["output"]["dir"] = "runs-search-backend"
    path = spec.with_name("search-backend.yaml")  # beside the module's spec: its cache serves the reference NNs
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = optimize(path, profile="quick", trials=4, region=first.region, quiet=True, console=QUIET)
    trials = [t.configuration for s in result.studies.values() for t in s.trials if t.configuration is not None]
    assert trials and all(c.backend == "torch" and set(c.backends_measured) <= {"torch"}
                          for config in trials for c in config.nns.values())
    chosen = [c for config in (result.reference, result.aware, result.agnostic) if config is not None
              for c in config.nns.values()]
    assert chosen and all(set(c.backends_measured) == {"torch", "onnxruntime"} for c in chosen)
    for c in chosen:  # each NN on the faster of the two, as measured
        assert c.backend == min(c.backends_measured, key=lambda b: c.backends_measured[b])
    assert result.search_backend == "torch"
    assert "Trials were timed on torch (target.search_backend)" in result.report.read_text()
    for nn, files in result.artifacts.items():
        assert Path(files["compiled"]).name.startswith(f"compiled-{result.aware.nns[nn].backend}")


def test_the_report_says_why_the_aware_choice_is_the_reference_nns(tiny_run, tmp_path):
    """A 1.00x "same NNs on both sides" must not leave a reader guessing: the faster configurations failed validation."""
    from qaopt.report import write_report

    _, result = tiny_run
    failed = result.validations[0].model_copy(update={"trial": 99, "failures": 2, "passes": 4, "accepted": False})
    same = result.model_copy(update={
        "aware": result.reference.model_copy(update={"trial": 7}), "validations": [failed, *result.validations],
        "run_dir": tmp_path, "artifacts": {}})
    text = write_report(same, tmp_path).read_text()
    assert ("It runs the reference NNs unchanged: each of the 1 faster configuration(s) validation tried failed "
            "closed-loop runs (the validation table).") in text


def test_the_report_says_how_a_detector_is_placed_only_where_one_is_calibrated(tiny_run, tmp_path):
    """A detector's coordinate may exceed its miss rate (its false alarms count too): the report says so where one is."""
    from qaopt.report import write_report

    _, result = tiny_run
    plain = write_report(result.model_copy(update={"run_dir": tmp_path, "artifacts": {}}), tmp_path).read_text()
    assert "A detector's coordinate counts both its error kinds" not in plain
    nn = next(iter(result.reference.nns))
    detector = result.reference.model_copy(update={"nns": {
        **result.reference.nns, nn: result.reference.nns[nn].model_copy(update={"metric": "miss_rate"})}})
    text = write_report(result.model_copy(update={"reference": detector, "run_dir": tmp_path, "artifacts": {}}),
                        tmp_path).read_text()
    assert "A detector's coordinate counts both its error kinds" in text and "its own miss rate." in text


def test_killed_run_resumes_without_repeating_finished_trials(tmp_path, monkeypatch):
    spec = _spec(tmp_path / "killed")
    db = tmp_path / "killed" / "runs" / "study.db"
    proc = subprocess.Popen([_qaopt(), "optimize", str(spec), "--profile", "quick", "--trials", "3"],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            if _complete_trials(db) >= 1:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before = _trials(db)
    assert before, "no finished trial recorded before the kill"
    # The killed process's running trial is failed by heartbeat and retried.
    monkeypatch.setattr(search_module, "HEARTBEAT_S", 1)
    monkeypatch.setattr(search_module, "GRACE_S", 1)
    time.sleep(1.5)
    optimize(spec, profile="quick", trials=3, console=QUIET)
    after = _trials(db)
    for key, params in before.items():
        assert after[key] == params, "a finished trial was changed or repeated"
    aware = [k for k in after if k[0].endswith("-aware")]
    assert len(aware) == 3


def _complete_trials(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as con:
            return con.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.Error:
        return 0


def _trials(db: Path) -> dict[tuple[str, int], dict]:
    """Completed trials of every study in the storage: (study, number) -> params."""
    storage = f"sqlite:///{db}"
    out = {}
    for summary in optuna.study.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            out[(summary.study_name, t.number)] = t.params
    return out


def test_empty_region_ends_with_a_clear_message_and_the_plot(tmp_path):
    spec = _spec(tmp_path / "empty", **{"qos.max": -1})
    with pytest.raises(OptimizeError, match="the region is empty: the reference point .* fails the QoS goal: "
                                            r"\d+ of \d+ runs failed") as info:
        optimize(spec, profile="quick", trials=2, console=QUIET)
    assert "region.png" in str(info.value)
    assert (tmp_path / "empty" / "runs" / "region.png").stat().st_size > 0
    assert not (tmp_path / "empty" / "runs" / "report.md").exists()


def test_unreachable_storage_fails_fast(tmp_path):
    spec = _spec(tmp_path / "storage")
    start = time.perf_counter()
    with pytest.raises(OptimizeError, match=r"search.storage: cannot open postgresql\+psycopg://qaopt:\*\*\*@127.0.0.1:9/"):
        optimize(spec, storage="postgresql+psycopg://qaopt:secret@127.0.0.1:9/qaopt", console=QUIET)
    assert time.perf_counter() - start < 30
    assert not (tmp_path / "storage" / "runs" / "region.json").exists()


def test_cli_reports_bad_profile(tmp_path, capsys):
    from qaopt.cli import main

    with pytest.raises(SystemExit) as info:
        main(["optimize", str(_spec(tmp_path)), "--profile", "fast"])
    assert info.value.code == 2
    assert "--profile: no profile named 'fast'" in capsys.readouterr().err


def test_a_worker_that_loses_the_race_to_create_the_tables_opens_them(monkeypatch):
    """Two workers on a new PostgreSQL database both create Optuna's tables; the one whose CREATE TABLE meets the
    other's committed table (duplicate_table) opens the storage on retry; any other database error is named."""
    import sqlalchemy

    from qaopt import search

    class PgError(Exception):
        def __init__(self, sqlstate):
            super().__init__(f"sqlstate {sqlstate}")
            self.sqlstate = sqlstate

    outcomes = [sqlalchemy.exc.ProgrammingError("CREATE TABLE studies", {}, PgError("42P07")), "storage"]

    def storage(url, **_):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(search, "RDBStorage", storage)
    monkeypatch.setattr(search.time, "sleep", lambda s: None)
    assert search.open_storage("postgresql://qaopt@db.example/qaopt") == "storage"
    assert not outcomes

    outcomes[:] = [sqlalchemy.exc.ProgrammingError("CREATE TABLE studies", {}, PgError("42501"))]  # no privilege
    with pytest.raises(search.OptimizeError, match=r"search.storage: cannot open postgresql://qaopt:\*\*\*@db.example/qaopt: .*42501"):
        search.open_storage("postgresql://qaopt@db.example/qaopt")


OPEN_AT = """
import sys, time
from qaopt.search import open_storage
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
open_storage(sys.argv[1]).engine.dispose()
"""
"""A worker process's storage opening at the wall-clock moment argv[2] (its imports done before)."""


@pytest.mark.postgres
@pytest.mark.skipif(not os.environ.get("QAOPT_TEST_POSTGRES_URL"), reason="QAOPT_TEST_POSTGRES_URL is not set")
def test_workers_starting_together_on_a_new_postgres_database_all_open_it():
    """The race itself, as `qaopt optimize --storage` workers meet it: six processes open a database that has no
    tables yet at the same moment, on four new databases (without the retry on duplicate_table, about one round in
    four loses a worker to it; the test above decides the logic deterministically)."""
    import sqlalchemy

    url = sqlalchemy.engine.make_url(os.environ["QAOPT_TEST_POSTGRES_URL"])
    admin = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        for _ in range(4):
            name = f"qaopt_race_{uuid.uuid4().hex[:8]}"
            with admin.connect() as db:
                db.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
            try:
                fresh = url.set(database=name).render_as_string(hide_password=False)
                at = str(time.time() + 6.0)
                workers = [subprocess.Popen([sys.executable, "-c", OPEN_AT, fresh, at], env=_env(),
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                           for _ in range(6)]
                outputs = [w.communicate(timeout=120)[0] for w in workers]
                assert [w.returncode for w in workers] == [0] * 6, outputs
            finally:
                with admin.connect() as db:
                    db.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    finally:
        admin.dispose()


@pytest.mark.postgres
@pytest.mark.skipif(not os.environ.get("QAOPT_TEST_POSTGRES_URL"), reason="QAOPT_TEST_POSTGRES_URL is not set")
def test_two_workers_share_one_study_on_postgres(tmp_path):
    url = os.environ["QAOPT_TEST_POSTGRES_URL"]
    spec = _spec(tmp_path, **{"app.name": f"tiny-{uuid.uuid4().hex[:8]}"})
    # Calibrate once, so both workers start from the same region.
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    workers = [
        subprocess.Popen([_qaopt(), "optimize", str(spec), "--profile", "quick", "--trials", "6", "--storage", url,
                          "--out", str(tmp_path / f"worker{i}")], env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    outputs = [w.communicate(timeout=900)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    searched = 0
    for summary in optuna.study.get_all_study_summaries(url):
        if not summary.study_name.startswith(yaml.safe_load(spec.read_text())["app"]["name"]):
            continue
        trials = optuna.load_study(study_name=summary.study_name, storage=url).get_trials(deepcopy=False)
        if ATTR_SKIPPED in summary.user_attrs:  # an agnostic merge group outside tolerance before any knob
            assert trials == [], "a study marked not searched ran trials"
            continue
        searched += 1
        assert all(t.state == TrialState.COMPLETE for t in trials), [t.state for t in trials]
        assert 6 <= len(trials) <= 7  # both workers may start the last trial at once
        assert len({t.number for t in trials}) == len(trials)
        # The sampler may draw the reference's values itself (a one-dtype NN at pruning 0.0): find the enqueued
        # reference by the fixed parameters Optuna records on an enqueued trial, not by the values a trial ran.
        enqueued = [t.system_attrs["fixed_params"] for t in trials if "fixed_params" in t.system_attrs]
        reference = [p for p in enqueued if all(v in (0.0, "fp32", "sequential") for v in p.values())]
        assert len(reference) == 1, "the enqueued reference trial ran more than once"
        assert len({t._trial_id for t in trials}) == len(trials)
    assert searched >= 2, "the aware study and at least one agnostic study"


def _validation_ctx(spec_path: Path, cache_dir: Path, monkeypatch, fake_validation):
    """What the validation stage needs of a run, with closed-loop runs replaced by ``fake_validation``."""
    import dataclasses
    from types import SimpleNamespace

    from qaopt.plan import build_plan
    from qaopt.search import SearchContext
    from qaopt.spec import load_spec

    class Unbuilt(SearchContext):
        def _built(self, config):  # the bytes the configuration records: no rebuild to re-check
            return {n: SimpleNamespace(predict=None, bytes_hash=c.bytes_hash) for n, c in config.nns.items()}

    monkeypatch.setattr(validation_stage, "validate_closed_loop", fake_validation)
    plan = dataclasses.replace(build_plan(load_spec(spec_path), "quick"), cache_dir=cache_dir)
    return Unbuilt(plan, {}, None)


def _inside(result, region, trials):
    """One configuration per trial, at the region's first certified point, its latency the trial's number (trial 1
    the fastest), each with NNs of its own."""
    inside = [p.errors for p in region.labelled() if p.valid][0]
    return [result.reference.model_copy(update={
        "trial": t, "errors": inside, "latency_ms": float(t),
        "nns": {n: c.model_copy(update={"candidate": f"{c.candidate}-{t}"}) for n, c in result.reference.nns.items()}})
        for t in trials]


def _calibrated(region, ctx):
    """The region stage's artifact for ``region``, no closed-loop evidence yet."""
    from qaopt.stages.region import CalibratedRegion, ClosedLoopEvidence, RegionChoice

    return CalibratedRegion(RegionChoice(region, ctx.plan.run_dir / "region.json", ""), ClosedLoopEvidence(),
                            ctx.plan.application.key)


def test_closed_loop_failure_rules_out_dominated_configurations(tiny_run, monkeypatch, tmp_path):
    from qaopt.calibrate import ErrorRegion
    from qaopt.result import Configuration, Validation
    from qaopt.stages.region import ClosedLoopEvidence

    spec_path, result = tiny_run
    region = ErrorRegion.load(result.region)
    calibrated = region.to_json()
    base = result.reference

    def config(trial: int, a: float, b: float, latency: float) -> Configuration:
        nns = {n: c.model_copy(update={"candidate": f"{c.candidate}-{trial}"}) for n, c in base.nns.items()}
        return base.model_copy(update={"trial": trial, "nns": nns, "errors": {"a": a, "b": b}, "latency_ms": latency})

    # Fail at the accepted point with the largest error of NN a; another accepted point with
    # less error on a stays valid, while a point just above the failure is ruled out.
    accepted = sorted((p.errors for p in region.labelled() if p.valid), key=lambda e: e["a"])
    low, high = accepted[0], accepted[-1]
    assert low["a"] < high["a"], "the tiny region needs two accepted points"
    fastest = config(1, high["a"], high["b"], 1.0)
    dominated = config(2, high["a"] * 1.01, high["b"] * 1.01, 1.1)
    other = config(3, low["a"], low["b"], 1.2)
    assert region.contains(fastest.errors) and region.contains(other.errors)
    validated = []

    def fake_validation(evaluator, nns, goal, test, runs, *, trial, region_predicted_valid, threads, **_):
        validated.append(trial)
        fails = trial == 1
        return Validation(trial=trial, runs=runs, passes=0 if fails else runs, failures=runs if fails else 0,
                          verdict="invalid" if fails else "valid", accepted=not fails,
                          region_predicted_valid=region_predicted_valid, qos_metric_mean=float(fails))

    ctx = _validation_ctx(spec_path, tmp_path, monkeypatch, fake_validation)
    front = validation_stage.validate_front(ctx, [fastest, dominated, other], _calibrated(region, ctx),
                                            ClosedLoopEvidence(), base)
    assert validated == [1, 3, 3], "the configuration dominating a closed-loop failure must be skipped (3: selection, fresh)"
    assert front.chosen.trial == 3
    assert region.to_json() == calibrated, "the calibrated region is never changed by validation"
    [run] = front.evidence.runs
    assert run.errors == fastest.errors and run.failures == 6
    grown = _calibrated(region, ctx).searched(front.evidence)
    assert not grown.contains(dominated.errors) and any(o.source == "closed-loop" for o in grown.observations)


def test_a_quick_validation_stops_at_the_fastest_unrefuted_configuration(tiny_run, monkeypatch, tmp_path):
    """Where the plan's runs cannot accept anything, the fastest configuration with no failing run is the choice, so
    the slower ones are not validated; a plan whose runs can accept goes on looking for an accepted one."""
    import dataclasses

    from qaopt.calibrate import ErrorRegion, SequentialTest
    from qaopt.result import Validation
    from qaopt.stages.region import ClosedLoopEvidence

    spec_path, result = tiny_run
    region = ErrorRegion.load(result.region)
    configs = _inside(result, region, (1, 2))
    validated = []

    def fake_validation(evaluator, nns, goal, test, runs, *, trial, region_predicted_valid, threads, **_):
        validated.append(trial)
        return Validation(trial=trial, runs=runs, passes=runs, failures=0, verdict="undecided", accepted=False,
                          region_predicted_valid=region_predicted_valid, qos_metric_mean=0.0)

    ctx = _validation_ctx(spec_path, tmp_path / "quick", monkeypatch, fake_validation)
    assert not SequentialTest.of(ctx.plan.application.acceptance, ctx.plan.validation_runs).can_accept, "quick can't"
    front = validation_stage.validate_front(ctx, configs, _calibrated(region, ctx), ClosedLoopEvidence(),
                                            result.reference)
    assert validated == [1, 1] and front.chosen.trial == 1  # its fresh-seed runs follow

    validated.clear()
    ctx = type(ctx)(dataclasses.replace(ctx.plan, validation_runs=32, cache_dir=tmp_path / "default"), {}, None)
    assert SequentialTest.of(ctx.plan.application.acceptance, 32).can_accept
    front = validation_stage.validate_front(ctx, configs, _calibrated(region, ctx), ClosedLoopEvidence(),
                                            result.reference)
    assert validated == [1, 2, 1] and front.chosen.trial == 1


def test_a_rejection_on_fresh_seeds_moves_on_to_the_next_configuration(tiny_run, monkeypatch, tmp_path, capsys):
    """Trial 1 passes its selection runs and fails fresh ones: the run goes on, and trial 2, accepted on both, is the
    choice of the same pass; the console's last line leads with that verdict."""
    import dataclasses

    from qaopt.calibrate import ErrorRegion
    from qaopt.closed_loop import ACCEPTANCE_SEED_BASE
    from qaopt.result import Validation
    from qaopt.stages.region import ClosedLoopEvidence

    spec_path, result = tiny_run
    region = ErrorRegion.load(result.region)
    configs = _inside(result, region, (1, 2, 3))
    ran = []

    def fake_validation(evaluator, nns, goal, test, runs, *, trial, region_predicted_valid, threads, seed_base, **_):
        fresh = seed_base == ACCEPTANCE_SEED_BASE
        ran.append((trial, fresh))
        fails = 4 if trial == 1 and fresh else 0
        return Validation(trial=trial, runs=24, passes=24 - fails, failures=fails,
                          verdict="invalid" if fails else "valid", accepted=not fails,
                          region_predicted_valid=region_predicted_valid, qos_metric_mean=float(fails),
                          seed_base=seed_base)

    ctx = _validation_ctx(spec_path, tmp_path, monkeypatch, fake_validation)
    ctx = type(ctx)(dataclasses.replace(ctx.plan, validation_runs=32), {}, None)
    front = validation_stage.validate_front(ctx, configs, _calibrated(region, ctx), ClosedLoopEvidence(),
                                            result.reference)
    assert ran == [(1, False), (1, True), (2, False), (2, True)]
    assert front.chosen.trial == 2 and front.acceptance.accepted and front.acceptance.trial == 2
    assert [(v.trial, v.failures) for v in front.validations] == [(1, 0), (1, 4), (2, 0)]
    assert front.evidence.runs and front.evidence.runs[0].failures == 4  # the rejection is evidence

    from qaopt.commands import optimize as command

    accepted = result.model_copy(update={"aware": front.chosen, "acceptance": front.acceptance})
    monkeypatch.setattr("qaopt.optimizer.optimize", lambda *a, **k: accepted)
    command.optimize(spec_path, profile="quick", out=None, storage=None, trials=None, region=None,
                     calibration_budget=None, cluster=None, workers=None, quiet=True, time_limit=None)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("Accepted: trial 2 met the QoS goal on fresh seeds, 0/24 failed")
    rejected = accepted.model_copy(update={"acceptance": front.validations[1], "aware": configs[0]})
    monkeypatch.setattr("qaopt.optimizer.optimize", lambda *a, **k: rejected)
    command.optimize(spec_path, profile="quick", out=None, storage=None, trials=None, region=None,
                     calibration_budget=None, cluster=None, workers=None, quiet=True, time_limit=None)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("Not accepted: trial 1") and "rejected on fresh seeds (4/24 failed" in last
    assert last.index("Not accepted") < last.index("unaccepted, it would be")


def test_a_configuration_a_failure_put_outside_is_validated_once_the_region_holds_it_again(tiny_run, monkeypatch,
                                                                                            tmp_path):
    """The region is refitted after each validation and need not be monotone in the runs (a certifier is a
    plugin): trial 2, outside it after trial 1 failed once, is back inside after trial 3 failed, and is validated
    then (passed for good, it would leave the run to end on the reference)."""
    import dataclasses
    from types import SimpleNamespace

    from qaopt.calibrate import ErrorRegion
    from qaopt.result import Validation
    from qaopt.stages.region import ClosedLoopEvidence

    spec_path, result = tiny_run
    inside = [p.errors for p in ErrorRegion.load(result.region).labelled() if p.valid][0]
    configs = [result.reference.model_copy(update={
        "trial": t, "errors": {k: v + t * 1e-6 for k, v in inside.items()}, "latency_ms": float(t),
        "nns": {n: c.model_copy(update={"candidate": f"{c.candidate}-{t}"}) for n, c in result.reference.nns.items()}})
        for t in (1, 2, 3)]
    validated = []

    def fake_validation(evaluator, nns, goal, test, runs, *, trial, region_predicted_valid, threads, **_):
        validated.append(trial)
        fails = 0 if trial == 2 else 1  # 1 of the runs: undecided, and evidence against the point
        return Validation(trial=trial, runs=runs, passes=runs - fails, failures=fails,
                          verdict="undecided" if fails else "valid", accepted=not fails,
                          region_predicted_valid=region_predicted_valid, qos_metric_mean=0.0,
                          failed_seeds=[5_000_027] if fails else [])

    class Refitted:  # the region after n closed-loop runs: only the first failure puts trial 2 outside
        def __init__(self, n: int):
            self.n = n

        def contains(self, errors) -> bool:
            return not (self.n == 1 and errors == configs[1].errors)

    ctx = _validation_ctx(spec_path, tmp_path, monkeypatch, fake_validation)
    ctx = type(ctx)(dataclasses.replace(ctx.plan, validation_runs=50, validate_top=3), {}, None)
    calibrated = SimpleNamespace(application=ctx.plan.application.key,
                                 searched=lambda evidence: Refitted(len(evidence.runs)))
    front = validation_stage.validate_front(ctx, configs, calibrated, ClosedLoopEvidence(), result.reference)
    assert validated == [1, 3, 2, 2] and front.chosen.trial == 2
    assert [run.errors for run in front.evidence.runs] == [configs[0].errors, configs[2].errors]


def test_the_same_nns_in_another_schedule_are_not_validated_again_nor_counted(tiny_run, monkeypatch, tmp_path):
    """The closed loop does not see the schedule: a configuration whose NNs already ran in this pass has their
    verdict, and the profile's validation slots go to configurations with other NNs."""
    import dataclasses
    from types import SimpleNamespace

    from qaopt.calibrate import ErrorRegion
    from qaopt.result import Validation
    from qaopt.stages.region import ClosedLoopEvidence

    spec_path, result = tiny_run
    region = ErrorRegion.load(result.region)
    inside = [p.errors for p in region.labelled() if p.valid][0]

    def config(trial: int, nns: int, schedule: str):
        return result.reference.model_copy(update={
            "trial": trial, "errors": inside, "latency_ms": float(trial), "schedule": schedule,
            "nns": {n: c.model_copy(update={"candidate": f"{c.candidate}-{nns}"}) for n, c in result.reference.nns.items()}})

    front = [config(1, 1, "sequential"), config(2, 1, "parallel"), config(3, 3, "sequential")]
    validated = []

    def fake_validation(evaluator, nns, goal, test, runs, *, trial, region_predicted_valid, threads, **_):
        validated.append(trial)
        fails = int(trial == 1)  # the fastest NNs fail one run, wherever they run
        return Validation(trial=trial, runs=runs, passes=runs - fails, failures=fails,
                          verdict="undecided" if fails else "valid", accepted=not fails,
                          region_predicted_valid=region_predicted_valid, qos_metric_mean=0.0)

    ctx = _validation_ctx(spec_path, tmp_path, monkeypatch, fake_validation)
    ctx = type(ctx)(dataclasses.replace(ctx.plan, validation_runs=50, validate_top=2), {}, None)
    notes = []
    chosen = validation_stage.validate_front(ctx, front, _calibrated(region, ctx), ClosedLoopEvidence(),
                                             result.reference, events=SimpleNamespace(note=notes.append, emit=lambda event: None,
                                                                                      stage="validation"))
    assert validated == [1, 3, 3] and chosen.chosen.trial == 3
    assert [v.trial for v in chosen.validations] == [1, 3]
    assert any("trial 2: the NNs of trial 1" in line for line in notes)


def test_reference_is_validated_when_every_approximation_fails(tiny_run, monkeypatch, tmp_path):
    from qaopt.calibrate import ErrorRegion
    from qaopt.result import Validation
    from qaopt.stages.region import ClosedLoopEvidence

    spec_path, result = tiny_run
    region = ErrorRegion.load(result.region)
    reference = result.reference.model_copy(update={"trial": None})
    approximated = result.reference.model_copy(update={
        "trial": 1, "nns": {n: c.model_copy(update={"candidate": f"{c.candidate}-1"}) for n, c in result.reference.nns.items()}})
    validated, first = [], []

    def fake_validation(evaluator, nns, goal, test, runs, *, trial, region_predicted_valid, threads, first_seeds, **_):
        validated.append(trial)
        first.append(list(first_seeds))
        fails = int(trial is not None)  # the approximation fails once; the reference never
        return Validation(trial=trial, runs=runs, passes=runs - fails, failures=fails, verdict="undecided", accepted=False,
                          region_predicted_valid=region_predicted_valid, qos_metric_mean=0.0,
                          failed_seeds=[5_000_029] * fails)

    ctx = _validation_ctx(spec_path, tmp_path, monkeypatch, fake_validation)
    front = validation_stage.validate_front(ctx, [approximated], _calibrated(region, ctx), ClosedLoopEvidence(),
                                            reference)
    assert validated == [1, None] and front.chosen is None, "a configuration that failed a run is never the result"
    assert [v.trial for v in front.validations] == [1, None]
    assert first == [[], [5_000_029]], "the reference runs the scene its approximation failed first"

    # A second run reads both from the cache, labelled with this run's trial numbers, and adds no evidence twice.
    validated.clear()
    again = validation_stage.validate_front(ctx, [approximated.model_copy(update={"trial": 7})],
                                            _calibrated(region, ctx), front.evidence, reference)
    assert validated == [] and [v.trial for v in again.validations] == [7, None]
    assert again.evidence == front.evidence and len(again.evidence.runs) == 1


def test_a_validation_cached_by_an_earlier_version_is_read_not_rerun(tmp_path):
    """Closed-loop runs are dear: a version-1 cache entry (every metric summed) is read back as means."""
    from qaopt.app_spec import store

    path = tmp_path / "v1.json"
    store.write_json(path, "Validation", 1, {
        "trial": 3, "runs": 4, "passes": 4, "failures": 0, "verdict": "undecided", "accepted": False,
        "region_predicted_valid": True, "qos_metric_mean": 0.0, "totals": {"collisions": 2.0, "final_gap_cm": 10.0}})
    old = validation_stage._read_version_1(path)
    assert old is not None and old.runs == 4
    assert old.metrics["final_gap_cm"].mean == 2.5 and old.metrics["final_gap_cm"].total is None
    assert old.metrics["collisions"].worst_run is None


def test_a_run_without_an_aware_configuration_names_the_validated_agnostic_one(tiny_run):
    """No aware configuration accepted: the report and the console point at the agnostic configuration where it
    passed its fresh-seed runs (validated, faster than the reference), and at the reference NNs where it did not."""
    from qaopt.report import _outcome

    _, result = tiny_run
    assert result.agnostic is not None and result.agnostic_validation is not None
    passed = result.agnostic_validation.model_copy(update={"accepted": True, "passes": 50, "runs": 50, "failures": 0})
    failed = passed.model_copy(update={"accepted": False, "passes": 49, "failures": 1})
    none_aware = result.model_copy(update={"aware": None, "agnostic_validation": passed})
    text = _outcome(none_aware)
    assert "application-agnostic configuration passed 50 of 50 closed-loop runs on fresh seeds" in text
    assert "fastest validated choice" in text and "reference NNs remain" not in text
    text = _outcome(none_aware.model_copy(update={"agnostic_validation": failed}))
    assert "the reference NNs remain the deployable choice" in text
