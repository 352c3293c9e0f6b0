"""ErrorRegion: both containment modes, margins, persistence, plots and field evidence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qaopt.calibrate import AcceptanceTest, Axis, CalibrationError, ErrorRegion, ErrorSpace, Evidence, Observation, Verdict
from qaopt.calibrate.region import PER_POINT

SPACE = ErrorSpace([Axis("heading", 30.0), Axis("distance", 0.25)])


def sim(h: float, d: float, valid: bool) -> Observation:
    return Observation({"heading": h, "distance": d}, 64 if valid else 4, 0 if valid else 4,
                       Verdict.VALID if valid else Verdict.INVALID)


@pytest.fixture
def region() -> ErrorRegion:
    # a staircase: valid up to (10, 0.1) and (5, 0.15); invalid from (20, 0.05) and (12, 0.2) up
    obs = [sim(10, 0.1, True), sim(5, 0.15, True), sim(20, 0.05, False), sim(12, 0.2, False)]
    return ErrorRegion(SPACE, AcceptanceTest(), obs, info={"strategy": "monotone"}, certifier=PER_POINT)


def test_certified_is_the_down_set_of_accepted_points(region):
    assert region.contains({"heading": 9.0, "distance": 0.09})
    assert region.contains({"heading": 4.0, "distance": 0.15})
    assert not region.contains({"heading": 11.0, "distance": 0.05})  # beyond every accepted point
    assert not region.contains({"heading": 25.0, "distance": 0.1})
    assert not region.contains({"heading": 9.0, "distance": 0.09}, margin=0.05)  # 1.5 deg / 0.0125 more: outside


def test_predicted_extends_between_the_staircases_and_stays_monotone(region):
    assert region.contains({"heading": 11.0, "distance": 0.05}, mode="predicted")  # between valid and invalid
    assert not region.contains({"heading": 25.0, "distance": 0.1}, mode="predicted")
    h = np.linspace(0, 30, 31)
    p = [region.probability({"heading": x, "distance": 0.05}) for x in h]
    assert p[0] == 1.0 and p[-1] == 0.0
    assert region.probability({"heading": 9.0, "distance": 0.09}) == 1.0
    with pytest.raises(CalibrationError, match="mode"):
        region.contains({"heading": 1.0, "distance": 0.0}, mode="sure")


def test_error_vectors_must_match_the_axes(region):
    with pytest.raises(CalibrationError, match="missing.*distance"):
        region.contains({"heading": 1.0})
    with pytest.raises(CalibrationError, match="unknown.*steer"):
        region.contains({"heading": 1.0, "distance": 0.0, "steer": 1.0})


def test_save_load_round_trip(region, tmp_path):
    region.add_evidence(Evidence({"heading": 2.0, "distance": 0.02}, 3, 0, "field:plot-A", note="3 runs"))
    path = region.save(tmp_path / "region.json")
    loaded = ErrorRegion.load(path)
    assert [o.to_json() for o in loaded.observations] == [o.to_json() for o in region.observations]
    assert loaded.info == region.info
    rng = np.random.default_rng(0)
    for _ in range(50):
        e = {"heading": rng.uniform(0, 30), "distance": rng.uniform(0, 0.25)}
        assert loaded.contains(e) == region.contains(e)
        assert loaded.probability(e) == pytest.approx(region.probability(e))
    data = json.loads(path.read_text())
    data["format"] = 99
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="format"):
        ErrorRegion.load(tmp_path / "bad.json")
    with pytest.raises(CalibrationError, match="cannot read"):
        ErrorRegion.load(tmp_path / "missing.json")
    (tmp_path / "torn.json").write_text(path.read_text()[: len(path.read_text()) // 2])
    with pytest.raises(CalibrationError, match="cannot read"):
        ErrorRegion.load(tmp_path / "torn.json")
    del data["observations"]
    data["format"] = 1
    (tmp_path / "stale.json").write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="malformed region"):
        ErrorRegion.load(tmp_path / "stale.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "region.json", "stale.json", "torn.json"]


def test_field_failure_overturns_simulator_points_above_it(region):
    region.add_evidence(Evidence({"heading": 8.0, "distance": 0.08}, passes=0, failures=2))
    labelled = {tuple(p.errors.values()): p for p in region.labelled()}
    assert labelled[(10, 0.1)].overturned and not labelled[(10, 0.1)].valid
    assert labelled[(5, 0.15)].valid and not labelled[(5, 0.15)].overturned  # not above the field failure
    assert not region.contains({"heading": 9.0, "distance": 0.09})
    assert region.contains({"heading": 4.0, "distance": 0.15})


def test_field_success_overturns_simulator_rejections_below_it(region):
    region.add_evidence(Evidence({"heading": 21.0, "distance": 0.06}, passes=60, failures=0))
    labelled = {tuple(p.errors.values()): p for p in region.labelled()}
    assert labelled[(20, 0.05)].valid and labelled[(20, 0.05)].overturned
    assert region.contains({"heading": 20.5, "distance": 0.055})


def test_undecided_field_evidence_changes_nothing(region):
    before = [p.valid for p in region.labelled()]
    region.add_evidence(Evidence({"heading": 8.0, "distance": 0.08}, passes=3, failures=0))
    assert [p.valid for p in region.labelled()] == before  # no label at the field point yet ...
    assert region.observations[-1].source == "field"  # ... but its runs are kept to pool with later ones
    assert not region.contains({"heading": 11.0, "distance": 0.09})


def test_field_and_simulator_at_one_point_pool_per_source(region):
    region.add_evidence([Evidence({"heading": 10.0, "distance": 0.1}, 1, 0), Evidence({"heading": 10.0, "distance": 0.1}, 0, 1)])
    p = next(p for p in region.labelled() if p.errors == {"heading": 10, "distance": 0.1})
    assert p.sources == ("simulator", "field") and not p.valid and p.overturned


def test_bad_evidence_is_refused():
    with pytest.raises(CalibrationError, match="reserved"):
        Evidence({"heading": 1.0, "distance": 0.0}, 1, 0, source="simulator")
    with pytest.raises(CalibrationError, match="at least one run"):
        Evidence({"heading": 1.0, "distance": 0.0}, 0, 0)


def test_errors_of_measures_each_axis():
    space = ErrorSpace([Axis("heading", 20.0, "bias"), Axis("heading", 30.0, "sigma"), Axis("distance", 0.3)])
    region = ErrorRegion(space, AcceptanceTest(), metrics={"heading": "l1", "distance": "rmse"})
    r_h = np.array([1.0, 3.0, -1.0, 5.0])
    r_d = np.array([0.1, -0.1, 0.1, -0.1])
    e = region.errors_of({"heading": r_h, "distance": r_d})
    assert e == pytest.approx({"heading.bias": 2.0, "heading.sigma": float(r_h.std()), "distance": 0.1})
    with pytest.raises(CalibrationError, match="no residuals"):
        region.errors_of({"heading": r_h})


def test_plot_writes_a_png(region, tmp_path):
    region.add_evidence(Evidence({"heading": 8.0, "distance": 0.08}, passes=0, failures=2))
    path = region.plot(tmp_path / "region.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    with pytest.raises(CalibrationError, match="axis 'speed'"):
        region.plot(tmp_path / "x.png", axes=["speed"])


def test_undecided_points_are_borderline_and_never_certify(region):
    region.add(Observation({"heading": 15.0, "distance": 0.02}, 91, 5, Verdict.UNDECIDED))
    p = next(p for p in region.labelled() if p.errors == {"heading": 15.0, "distance": 0.02})
    assert p.borderline and not p.valid
    assert not region.contains({"heading": 14.0, "distance": 0.01})


@pytest.fixture
def pooled() -> ErrorRegion:
    """A pooled region on a 5 x 5 grid of the unit cube: every run passes where u_heading + u_distance <= 0.8,
    three in four fail beyond."""
    obs = []
    for uh in (0.1, 0.3, 0.5, 0.7, 0.9):
        for ud in (0.1, 0.3, 0.5, 0.7, 0.9):
            valid = uh + ud <= 0.8 + 1e-9
            obs.append(Observation(SPACE.from_unit(np.array([uh, ud])), 64 if valid else 2, 0 if valid else 6,
                                   Verdict.VALID if valid else Verdict.INVALID))
    return ErrorRegion(SPACE, AcceptanceTest(), obs, info={"strategy": "monotone"})


def _certified(region: ErrorRegion) -> np.ndarray:
    return region.contains_unit(np.array([[h, d] for h in np.linspace(0, 1, 21) for d in np.linspace(0, 1, 21)]))


def test_undecided_closed_loop_failures_leave_the_pooled_region_as_calibrated(pooled):
    """Real NNs failing once in 8-48 runs inside the region (what the 5 % goal allows) are no evidence about the
    space: pooled into the model, such runs once left CropFollow's refitted region without the reference NNs' point."""
    before = _certified(pooled)
    reference = SPACE.from_unit(np.array([0.1, 0.1]))
    assert pooled.contains(reference) and before.sum() > 50
    for (uh, ud), passes in zip([(0.15, 0.12), (0.25, 0.2), (0.3, 0.15), (0.35, 0.3), (0.2, 0.35)], (7, 47, 39, 15, 7)):
        pooled.add_evidence(Evidence(SPACE.from_unit(np.array([uh, ud])), passes, 1, "closed-loop"))
    assert pooled.field_verdicts()[0].shape == (0, 2)
    assert (_certified(pooled) == before).all() and pooled.contains(reference)


def test_a_decided_field_verdict_overrules_the_pooled_model_by_monotonicity(pooled):
    before = _certified(pooled)
    failed = SPACE.from_unit(np.array([0.3, 0.2]))
    pooled.add_evidence(Evidence(failed, 5, 3, "closed-loop"))  # 3 of 8: invalid at 90 %
    after = _certified(pooled)
    grid = np.array([[h, d] for h in np.linspace(0, 1, 21) for d in np.linspace(0, 1, 21)])
    above = (grid >= np.array([0.3, 0.2]) - 1e-12).all(1)
    assert before[above].any() and not after[above].any()  # nothing dominating the failure stays certified
    assert (after[~above] == before[~above]).all()  # and nothing else moves
    assert pooled.probability(failed) == 0.0

    passed = SPACE.from_unit(np.array([0.35, 0.6]))
    pooled.add_evidence(Evidence(passed, 60, 0, "field"))  # 60 of 60: valid at 90 %
    below = SPACE.from_unit(np.array([0.25, 0.6]))
    assert not pooled.copy(pooled.observations[:-1]).contains(below) and pooled.contains(below)
    assert pooled.probability(below) == 1.0
    # below the success and above the failure: the failure wins, at the success's own point too
    assert not pooled.contains(SPACE.from_unit(np.array([0.32, 0.5]))) and not pooled.contains(passed)
