"""Stress strata (qaopt.stress): an NN's error where the application fails moves it in the error space."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import rareapp
import yaml

from qaopt.app_spec.errors import QaoptError
from qaopt.approx import Knobs, TargetNN, build
from qaopt.plan import build_plan
from qaopt.profiles import get_profile
from qaopt.search import SearchContext
from qaopt.spec import load_spec
from qaopt.stages.region import calibrated_region
from qaopt.stress import merged_params, record_stress, stressed_coordinate

APPS = Path(__file__).resolve().parent / "apps"


def _spec(tmp_path: Path, entry_point: str = "rareapp:RareEvaluator", stress: list | None = None):
    data = yaml.safe_load((APPS / "rare.yaml").read_text())
    data["evaluator"]["simulator"]["entry_point"] = entry_point
    if stress is not None:
        data["calibration"]["error_data"]["stress"] = stress
    path = tmp_path / "rare.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


@pytest.mark.timeout(300)
def test_an_nn_that_fails_only_in_a_rare_state_is_certified_without_strata_and_left_out_with_them(tmp_path, monkeypatch):
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    plan = build_plan(_spec(tmp_path), get_profile("quick"), out=tmp_path / "run")
    region = calibrated_region(plan.application, 8, tmp_path / "calibrated").region
    nns = plan.application.target_nns(plan.cache_dir)
    stressed = SearchContext(plan, nns, region, plan.application.stress_set(plan.cache_dir, nns))
    nominal = SearchContext(plan, nns, region)
    ref = nns["v"]
    fragile = build(TargetNN("v", rareapp.reader("right"), ref.data, ref.input_shape, ref.metric, "right half"),
                    Knobs(seed=plan.seed), cache_dir=plan.cache_dir)

    # The ground truth: the fragile NN crashes the runs that meet glare; the reference crashes none.
    app, seeds = rareapp.RareEvaluator(), list(range(5_000_000, 5_000_048))
    crashes = sum(r["crashes"] for r in app.evaluate_perception({"v": fragile.predict}, seeds))
    assert crashes >= 8 and sum(r["crashes"] for r in app.evaluate_perception({"v": stressed.reference["v"].predict},
                                                                               seeds)) == 0
    # On the nominal error data it errs little, so the nominal coordinates alone certify it: a false valid.
    assert region.contains(nominal.errors_of({"v": fragile}))
    # With the glare stratum its coordinate is the reference's error times its degradation under glare: outside.
    assert not region.contains(stressed.errors_of({"v": fragile}))
    assert stressed.stratum_errors(fragile)["glare"] > 10 * stressed.stratum_errors(stressed.reference["v"])["glare"]
    # The reference keeps its point.
    assert stressed.errors_of(stressed.reference) == nominal.errors_of(nominal.reference)
    assert region.contains(stressed.errors_of(stressed.reference))


def test_stress_recordings_are_deterministic_and_cached(tmp_path, monkeypatch):
    spec = _spec(tmp_path)
    models, prints = {"v": rareapp.reader()}, {"v": "left"}
    calls = []
    original = rareapp.RareEvaluator.record_perception
    monkeypatch.setattr(rareapp.RareEvaluator, "record_perception",
                        lambda self, *a: calls.append(self.glare_rate) or original(self, *a))
    first = record_stress(spec, models, prints, tmp_path / "a")
    assert calls == [0.3]  # the stratum's params reach the simulator
    again = record_stress(spec, models, prints, tmp_path / "a")
    assert calls == [0.3] and again.key == first.key  # read from the cache
    fresh = record_stress(spec, models, prints, tmp_path / "b")  # recorded again in another cache: the same drives
    np.testing.assert_array_equal(fresh.strata["glare"]["v"].inputs, first.strata["glare"]["v"].inputs)
    assert fresh.key == first.key
    assert record_stress(spec, models, {"v": "other weights"}, tmp_path / "a").key != first.key
    assert record_stress(_spec(tmp_path, stress=[]), models, prints, tmp_path / "a") is None


def test_a_stratum_that_makes_no_simulator_or_cannot_record_is_named(tmp_path):
    models, prints = {"v": rareapp.reader()}, {"v": "left"}
    bad = _spec(tmp_path, stress=[{"name": "glare", "params": {"glare_rate": "often"}}])
    with pytest.raises(QaoptError, match=r"calibration\.error_data\.stress\.0 \(glare\): its params do not make"):
        record_stress(bad, models, prints, tmp_path / "c")
    with pytest.raises(QaoptError, match=r"stress stratum 'glare' is listed twice"):
        _spec(tmp_path, stress=[{"name": "glare"}, {"name": "glare"}])


def test_merged_params_and_the_coordinate_rule():
    assert merged_params({"field": {"gap": 0.04, "rows": 3}, "speed": 1}, {"field": {"gap": 0.5}}) == {
        "field": {"gap": 0.5, "rows": 3}, "speed": 1}
    # as bad as the reference everywhere: the error itself; three times worse in a stratum: three reference errors
    assert stressed_coordinate("l1", 1.2, 1.0, {"gaps": 2.0}, {"gaps": 2.0}) == 1.2
    assert stressed_coordinate("l1", 1.2, 1.0, {"gaps": 6.0, "turns": 1.0}, {"gaps": 2.0, "turns": 1.0}) == 3.0
    # a rate adds rate points (a near-perfect reference would make any ratio explode)
    assert stressed_coordinate("miss_rate", 0.001, 0.001, {"night": 0.021}, {"night": 0.001}) == pytest.approx(0.021)


@pytest.mark.timeout(300)
def test_optimize_places_configurations_with_the_strata_and_the_report_says_so(tmp_path, monkeypatch):
    """End to end on the rare-state app: the reference's stratum errors reach result.json and the report explains
    why a configuration's coordinates may exceed its NNs' own errors."""
    from rich.console import Console

    from qaopt import optimize

    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    spec = _spec(tmp_path)
    result = optimize(spec.source, profile="quick", trials=2, console=Console(file=io.StringIO()))
    assert set(result.stress_strata) == {"v"} and set(result.stress_strata["v"]) == {"glare"}
    # the reference-shaped NN reads the glare-blind half: it errs under glare as it does elsewhere
    assert result.stress_strata["v"]["glare"] == pytest.approx(result.reference.nns["v"].error, rel=0.5)
    report = (spec.source.parent / "runs" / "report.md").read_text()
    assert "Coordinates include the spec's stress strata" in report and "| v | " in report


def test_a_merged_nns_views_run_it_once_on_the_frames_their_recordings_share():
    from qaopt.calibrate import Recording
    from qaopt.stress import StressSet

    frames = np.arange(12, dtype=np.float32).reshape(6, 2)  # one camera: both NNs' recordings hold this object
    drives = (np.arange(6),)
    stress = StressSet("key", {"gaps": {"a": Recording(frames, frames[:, [0]], drives),
                                        "b": Recording(frames, 2 * frames[:, [1]], drives)}})
    runs = []

    def merged(x):  # both members' columns, as a merged NN computes them
        runs.append(len(x))
        return np.stack([x[:, 0], 2 * x[:, 1]], axis=1)

    def l1(pred, truth):
        return float(np.abs(pred - truth).mean())

    shared: dict = {}
    assert stress.errors("a", merged, l1, columns=[0], shared=shared) == {"gaps": 0.0}
    assert stress.errors("b", merged, l1, columns=[1], shared=shared) == {"gaps": 0.0}
    assert runs == [6], "the second view read the first one's outputs"
    assert stress.errors("b", merged, l1, columns=[1]) == {"gaps": 0.0} and runs == [6, 6]
