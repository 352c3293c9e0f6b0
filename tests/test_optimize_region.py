"""Region reuse, as a user meets it: `qaopt calibrate` first, then `qaopt optimize` with a smaller profile.

A compatible region (same simulator, QoS goal, error space and models) calibrated with
at least the run's budget is reused, never overwritten; a smaller one is replaced and
the run says so (console and report); an incompatible one is kept beside the new one;
``--region FILE`` is used as given or rejected with the reason; ``--calibration-budget``
sets the budget of a new calibration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import qaopt.region_calibration as region_calibration
from qaopt.calibrate import CalibrationError
from qaopt.plan import BoundApplication
from qaopt.spec import load_spec
from qaopt.stages.region import PREVIOUS_REGION_FILE, REGION_FILE, calibrated_region

APPS = Path(__file__).resolve().parent / "apps"


def _spec(folder: Path, qos: dict | None = None) -> Path:
    """tiny.yaml in ``folder``, its ``qos`` section updated with ``qos``."""
    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    data["qos"].update(qos or {})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "tiny.yaml"


def _qaopt(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(APPS)}
    env.pop("QAOPT_DEBUG", None)
    return subprocess.run([str(Path(sys.executable).parent / "qaopt"), *args], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.timeout(900)
def test_optimize_reuses_the_region_calibrate_wrote_and_says_when_it_replaces_it(tmp_path):
    spec = _spec(tmp_path / "app")
    run = spec.parent / "runs"
    calibrated = _qaopt("calibrate", str(spec), "--budget", "14")
    assert calibrated.returncode == 0, calibrated.stderr[-3000:]
    written = (run / REGION_FILE).read_bytes()

    # The quick profile calibrates with 12 evaluations; the user's 14-evaluation region is better and is kept.
    quick = _qaopt("optimize", str(spec), "--profile", "quick", "--trials", "2")
    assert quick.returncode == 0, quick.stderr[-3000:]
    assert (run / REGION_FILE).read_bytes() == written, "optimize overwrote the region qaopt calibrate wrote"
    assert "reusing region.json (budget 14" in " ".join(quick.stderr.split())
    assert "Region: reusing region.json (budget 14" in (run / "report.md").read_text()
    result = json.loads((run / "result.json").read_text())
    assert result["region"] == str((run / REGION_FILE).resolve()) and "reusing" in result["region_note"]

    # A larger calibration budget replaces it, and says so; every finished trial is kept.
    trials_before = {m: s["trials"] for m, s in result["studies"].items()}
    larger = _qaopt("optimize", str(spec), "--profile", "quick", "--trials", "2", "--calibration-budget", "16")
    assert larger.returncode == 0, larger.stderr[-3000:]
    assert "replacing region.json (budget 14" in " ".join(larger.stderr.split())
    assert json.loads((run / REGION_FILE).read_text())["info"]["budget"] == 16
    again = json.loads((run / "result.json").read_text())
    assert "replacing region.json (budget 14" in (run / "report.md").read_text()
    assert [t["params"] for t in again["studies"]["aware"]["trials"]] == [t["params"] for t in trials_before["aware"]]


def test_a_smaller_region_is_replaced_with_a_note(tmp_path):
    spec = BoundApplication(load_spec(_spec(tmp_path / "app")))
    run = tmp_path / "run"
    small = calibrated_region(spec, 4, run)
    assert small.region.info["budget"] == 4 and "calibrated region.json (budget 4)" in small.note
    said: list[str] = []
    bigger = calibrated_region(spec, 8, run, say=said.append)
    assert bigger.region.info["budget"] == 8
    assert said == [bigger.note] and bigger.note.startswith("replacing region.json (budget 4")
    # A later, smaller request reuses the better region.
    reused = calibrated_region(spec, 4, run, say=said.append)
    assert reused.region.info["budget"] == 8 and reused.note.startswith("reusing region.json (budget 8")


def test_an_incompatible_region_is_kept_beside_the_new_one(tmp_path):
    run = tmp_path / "run"
    first = calibrated_region(BoundApplication(load_spec(_spec(tmp_path / "a"))), 4, run)
    old = (run / REGION_FILE).read_text()
    other = BoundApplication(load_spec(_spec(tmp_path / "b", {"acceptance": {"max_failure_rate": 0.1, "confidence": 0.9, "min_trials": 8,
                                                                  "max_trials": 32}})))
    said: list[str] = []
    second = calibrated_region(other, 4, run, say=said.append)
    assert "acceptance test differs" in second.note and PREVIOUS_REGION_FILE in second.note and said == [second.note]
    assert (run / PREVIOUS_REGION_FILE).read_text() == old, "the other spec's region is kept, not lost"
    assert second.region.acceptance.confidence == 0.9 and first.region.acceptance.confidence == 0.8


def test_region_option_uses_a_fitting_file_as_given(tmp_path, monkeypatch):
    spec = BoundApplication(load_spec(_spec(tmp_path / "app")))
    given = calibrated_region(spec, 6, tmp_path / "calibrated").path
    content = given.read_bytes()
    monkeypatch.setattr(region_calibration, "calibrate_spec", lambda *a, **k: pytest.fail("--region must not calibrate"))
    used = calibrated_region(spec, 12, tmp_path / "run", region_file=given)
    assert used.path == given.resolve() and given.read_bytes() == content
    assert "used as given" in used.note and "below this run's 12" in used.note
    assert not (tmp_path / "run" / REGION_FILE).exists()


def test_region_option_rejects_an_incompatible_file_with_the_reason(tmp_path):
    spec = BoundApplication(load_spec(_spec(tmp_path / "a")))
    given = calibrated_region(spec, 4, tmp_path / "calibrated").path
    other = _spec(tmp_path / "b", {"max": 1})
    with pytest.raises(CalibrationError, match="QoS goal differs"):
        calibrated_region(BoundApplication(load_spec(other)), 4, tmp_path / "run", region_file=given)
    proc = _qaopt("optimize", str(other), "--region", str(given), "--trials", "1")
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]  # before it: the stage log lines of a non-interactive run
    assert "Traceback" not in proc.stderr
    assert line.startswith(f"error: --region {given}: calibrated for other inputs") and "QoS goal differs" in line
    both = _qaopt("optimize", str(other), "--region", str(given), "--calibration-budget", "5")
    assert both.returncode == 2 and "give one of them" in both.stderr and "Traceback" not in both.stderr


def test_cached_simulator_runs_are_keyed_by_the_helpers_the_simulator_shares(tmp_path, monkeypatch):
    """Editing a helper module of the package above the simulator's (``from .. import``) must not reuse its runs."""
    import importlib
    from types import SimpleNamespace

    from qaopt.spec_adapter import simulator_key

    package = tmp_path / "robotsims"
    (package / "rows").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "shared.py").write_text("GAIN = 1.0\n")
    (package / "rows" / "__init__.py").write_text("")
    (package / "rows" / "evaluator.py").write_text("from .. import shared\n\nclass Evaluator:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    evaluator = importlib.import_module("robotsims.rows.evaluator").Evaluator()
    spec = SimpleNamespace(evaluator=SimpleNamespace(simulator={"entry_point": "robotsims.rows.evaluator:Evaluator"}))
    before = simulator_key(spec, evaluator)
    assert simulator_key(spec, evaluator) == before
    (package / "shared.py").write_text("GAIN = 2.0\n")
    assert simulator_key(spec, evaluator) != before


def test_a_scratch_script_beside_the_simulator_is_not_its_code(tmp_path, monkeypatch):
    """A user's scratch script in the simulator's folder made every run, recording and candidate error again (a
    third-party CarRacing application's, with a warning per study wrongly blaming the reference NNs); a helper the
    simulator imports, even inside a method, still keys its runs."""
    import importlib
    from types import SimpleNamespace

    from qaopt.spec_adapter import simulator_key, simulator_sources

    folder = tmp_path / "carsim"
    folder.mkdir()
    (folder / "track.py").write_text("WIDTH = 7.0\n")
    (folder / "physics.py").write_text("from track import WIDTH\n")
    (folder / "sim.py").write_text("import physics\n\nclass Sim:\n    def step(self):\n        import reward\n")
    (folder / "reward.py").write_text("SCALE = 1.0\n")
    monkeypatch.syspath_prepend(str(folder))
    evaluator = importlib.import_module("sim").Sim()
    spec = SimpleNamespace(evaluator=SimpleNamespace(simulator={"entry_point": "sim:Sim"}))
    assert [p.name for p in simulator_sources(folder / "sim.py")] == ["physics.py", "reward.py", "sim.py", "track.py"]
    before = simulator_key(spec, evaluator)
    (folder / "scratch.py").write_text("print('trying something')\n")
    assert simulator_key(spec, evaluator) == before
    for helper in ("track.py", "reward.py"):  # imported through another module; imported inside a method
        (folder / helper).write_text((folder / helper).read_text() + "# edited\n")
        assert simulator_key(spec, evaluator) != before
        before = simulator_key(spec, evaluator)
