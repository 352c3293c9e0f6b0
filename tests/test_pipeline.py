"""The optimize pipeline's contract: stages ordered by their inputs, loaded or run, their events, and a stage
added by a plugin module that a spec names.

The runner's rules are checked on toy stages (no simulator, milliseconds); the plugin
stage runs after the real region stage of the tiny application, as a user's stage would.
"""

from __future__ import annotations

import io
import sys
import textwrap
from types import SimpleNamespace
from pathlib import Path

import pytest
import yaml
from rich.console import Console

import qaopt.stages  # noqa: F401 - the built-in stages
from qaopt import events as ev
from qaopt.console import ConsoleView
from qaopt.pipeline import (
    BaseStage,
    PipelineError,
    StageRun,
    order,
    register_stage,
    registered_stages,
    run_stages,
    unregister_stage,
)
from qaopt.plan import build_plan
from qaopt.report import _cost_rows
from qaopt.search import open_storage
from qaopt.spec import load_spec
from qaopt.stages.region import RegionStage
from qaopt.stages.report import STAGE_TIMES_FILE

TINY = Path(__file__).resolve().parent / "apps" / "tiny.yaml"

BUILTIN = ["calibration", "reference NNs", "pruning ladders", "agnostic search", "aware search",
           "closed-loop validation", "side-by-side measurement", "artifacts and report"]

STAGE_PLUGIN = '''
"""A user's stage: after calibration, write the region's certified share beside the run's files."""

import json

from qaopt.pipeline import BaseStage, register_stage


@register_stage
class RegionShare(BaseStage):
    name = "region share"
    inputs = ("calibration",)
    artifact = "region_share.json (run folder)"

    def run(self, run, inputs):
        region = inputs["calibration"].region
        share = sum(p.valid for p in region.labelled()) / max(1, len(region.labelled()))
        run.emitter(self.name).note(f"region share: {share:.2f}")
        path = run.plan.run_dir / "region_share.json"
        path.write_text(json.dumps({"share": share}))
        return share
'''


def _toy(name: str, inputs: tuple[str, ...] = (), stored=None, calls: list | None = None) -> type[BaseStage]:
    """A stage class that returns its name (or ``stored`` from ``load``) and records that it ran."""

    def run(self, run, given):
        if calls is not None:
            calls.append(name)
        return f"{name}({','.join(str(given[i]) for i in inputs)})"

    return type(name.title(), (BaseStage,), {"name": name, "inputs": inputs, "run": run,
                                             "load": lambda self, run, given: stored})


def _run(tmp_path: Path, events: ev.Events) -> StageRun:
    plan = build_plan(load_spec(TINY), "quick", out=tmp_path / "run")
    return StageRun(plan, events, ev.StageTimes(), None, open_storage(f"sqlite:///{tmp_path / 'study.db'}"))


def test_the_builtin_stages_run_in_their_order():
    assert [s.name for s in order(list(registered_stages().values()))] == BUILTIN


def test_stages_follow_their_inputs_whatever_the_registration_order():
    c, a, b = _toy("c", ("a", "b")), _toy("a"), _toy("b", ("a",))
    assert [s.name for s in order([c, a, b])] == ["a", "b", "c"]
    assert [s.name for s in order([b, a])] == ["a", "b"]


def test_a_missing_input_or_a_circle_is_refused_with_the_names():
    with pytest.raises(PipelineError, match="stage 'b' .* reads 'nowhere', which no registered stage makes"):
        order([_toy("a"), _toy("b", ("nowhere",))])
    with pytest.raises(PipelineError, match="circle"):
        order([_toy("a", ("b",)), _toy("b", ("a",))])
    with pytest.raises(PipelineError, match="registered already"):
        register_stage(_toy("calibration"))


def test_the_runner_loads_what_is_stored_runs_the_rest_and_brackets_each_with_events(tmp_path):
    calls: list[str] = []
    seen: list[ev.Event] = []
    events = ev.Events()
    events.subscribe(seen.append)
    times = events.subscribe(ev.StageTimes())
    stages = [_toy("a", calls=calls), _toy("b", ("a",), stored="b from disk", calls=calls),
              _toy("c", ("a", "b"), calls=calls)]
    artifacts = run_stages(_run(tmp_path, events), stages)
    assert artifacts == {"a": "a()", "b": "b from disk", "c": "c(a(),b from disk)"}
    assert calls == ["a", "c"], "a stage whose artifact loads is not run"
    started = [e.stage for e in seen if isinstance(e, ev.StageStarted)]
    finished = [(e.stage, e.resumed) for e in seen if isinstance(e, ev.StageFinished)]
    assert started == ["a", "b", "c"] and finished == [("a", False), ("b", True), ("c", False)]
    assert set(times.seconds) == {"a", "c"} and times.read_back == ["b"], "a stage read back cost nothing here"


def test_a_resumed_run_reports_what_its_stages_cost_when_they_were_computed(tmp_path):
    """The first process computes a and b and is killed in c; the second reads a and b back and computes c: its
    cost table has a's and b's seconds from the first process, marked read back, and c's own."""
    path = tmp_path / "run" / STAGE_TIMES_FILE
    first = ev.Events()
    kept = first.subscribe(ev.StageTimes.kept_in(path))
    first.emit(ev.StageFinished("a", 12.3))
    first.emit(ev.StageFinished("b", 60.0))
    second = ev.Events()
    times = second.subscribe(ev.StageTimes.kept_in(path))
    for stage in ("a", "b"):
        second.emit(ev.StageFinished(stage, 0.01, resumed=True))
    second.emit(ev.StageFinished("c", 7.0))
    assert kept.seconds == {"a": 12.3, "b": 60.0}
    assert times.seconds == {"a": 12.3, "b": 60.0, "c": 7.0} and times.read_back == ["a", "b"]
    rows = _cost_rows(SimpleNamespace(seconds=times.seconds, read_back=times.read_back + ["d"]))
    assert rows == ["| a | 12.3 (an earlier process of this run; read back here) |",
                    "| b | 60.0 (an earlier process of this run; read back here) |", "| c | 7.0 |",
                    "| d | not recorded (an earlier process of this run; read back here) |"]
    path.write_text("not json")
    assert ev.StageTimes.kept_in(path).seconds == {}, "unreadable times only inform: the run goes on"


def test_the_console_counts_trials_by_their_numbers_not_their_text():
    out = io.StringIO()
    view = ConsoleView(Console(file=out, width=200), quiet=True)
    for event in (ev.StageStarted("aware search", 2), ev.Trial("aware search", "aware", 0, "building"),
                  ev.Trial("aware search", "aware", 0, "infeasible", "nns.a: outputs NaN"),
                  ev.Trial("aware search", "aware", 0, "finished"), ev.Warning("aware search", "dtype bf16 left out"),
                  ev.StageFinished("aware search", 1.5)):
        view(event)
    text = out.getvalue()
    assert "aware search…" in text and "aware trial 0: building candidates" in text
    assert "aware trial 0: infeasible: nns.a: outputs NaN" in text and "warning: dtype bf16 left out" in text
    assert "aware search: done in 1.5 s" in text


def test_the_console_prints_brackets_in_a_line_as_they_are():
    """Backend variants are written in brackets (torch[cuda_graph]), which rich would take for markup and drop."""
    out = io.StringIO()
    view = ConsoleView(Console(file=out, width=200), quiet=True)
    for event in (ev.Note("side-by-side measurement", "trials were timed on torch[cuda_graph]"),
                  ev.Warning("aware search", "torch[channels_last] cannot serve cuda"),
                  ev.Trial("aware search", "aware", 3, "infeasible", "backend [bold] failed")):
        view(event)
    text = out.getvalue()
    assert "trials were timed on torch[cuda_graph]" in text and "warning: torch[channels_last] cannot" in text
    assert "aware trial 3: infeasible: backend [bold] failed" in text


@pytest.fixture
def stage_plugin(tmp_path):
    """The tiny application in a folder of its own, with a plugin module registering a stage; undone after."""
    folder = tmp_path / "robot"
    folder.mkdir()
    (folder / "robot_stages.py").write_text(textwrap.dedent(STAGE_PLUGIN))
    data = yaml.safe_load(TINY.read_text())
    data["plugins"] = ["robot_stages"]
    (folder / "app.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    yield folder / "app.yaml"
    unregister_stage("region share")
    sys.modules.pop("robot_stages", None)


def test_a_stage_from_a_plugin_named_in_the_spec_runs_in_its_place(stage_plugin, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TINY.parent))
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec(stage_plugin, check_entry_points=True)  # imports the plugin: the stage registers
    stages = registered_stages()
    assert "region share" in stages
    names = [s.name for s in order(list(stages.values()))]
    assert names.index("region share") > names.index("calibration") and names[-1] == "region share", \
        "a plugin's stage runs after its inputs, and after the built-in stages it does not depend on"

    notes: list[str] = []
    events = ev.Events()
    events.subscribe(lambda e: notes.append(e.text) if isinstance(e, ev.Note) else None)
    plan = build_plan(spec, "quick", out=tmp_path / "run", calibration_budget=4)
    run = StageRun(plan, events, ev.StageTimes(), None, open_storage(f"sqlite:///{tmp_path / 'study.db'}"))
    artifacts = run_stages(run, [RegionStage, stages["region share"]])
    assert 0 < artifacts["region share"] <= 1
    assert (plan.run_dir / "region_share.json").exists() and any(n.startswith("region share: ") for n in notes)
