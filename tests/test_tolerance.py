"""The application-agnostic tolerance as a test (qaopt.tolerance): paired block-bootstrap upper bounds, and the spec's
per-NN bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from qaopt.app_spec import SpecError, load
from qaopt.app_spec.nn_errors import FALSE_ALARM, MISS, TRUE_NEGATIVE, TRUE_POSITIVE
from qaopt.plan import BoundApplication
from qaopt.tolerance import RATE_TOLERANCE, RELATIVE_TOLERANCE, Judgement, Tolerance, judge

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SEQUENCE = 250


def _sequences(values: np.ndarray) -> list[np.ndarray]:
    return [values[i:i + SEQUENCE] for i in range(0, values.size, SEQUENCE)]


def _one_percent_worse(frames: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Reference residuals and a candidate's on the same frames: its L1 exactly 1 % above the reference's, with per-frame
    noise (each frame's |error| scaled by 1.01 + 0.2 z, z centred so the point excess is exactly 1 %)."""
    rng = np.random.default_rng(3)
    reference = rng.normal(size=frames)
    z = rng.normal(size=frames)
    z -= np.average(z, weights=np.abs(reference))
    candidate = reference * (1.01 + 0.2 * z)
    return _sequences(candidate), _sequences(reference)


def test_a_noisy_one_percent_excess_is_rejected_on_few_frames_and_accepted_on_many():
    tolerance = Tolerance.default("l1")
    assert tolerance.bound == RELATIVE_TOLERANCE == 0.02
    few = judge(tolerance, *_one_percent_worse(500))
    assert few.excess == pytest.approx(0.01 * few.reference)
    assert few.excess < few.allowed < few.ucb and not few.within, "1 % on the point, but the upper bound passes 2 %"
    many = judge(tolerance, *_one_percent_worse(50_000))
    assert many.excess == pytest.approx(0.01 * many.reference)
    assert many.ucb <= many.allowed and many.within
    assert many.violation(tolerance) <= 0 < few.violation(tolerance)


def test_an_unresolved_candidate_says_how_much_more_data_would_decide_it():
    """1 % on the point against a 2 % bound, undecidable on 500 frames: the factor it names (the half-width shrinking as
    one over the square root of the data) is enough data, and half of it is not."""
    tolerance = Tolerance.default("l1")
    few = judge(tolerance, *_one_percent_worse(500))
    assert few.unresolved and few.frames == 500 and few.blocks == 20
    factor = few.data_needed()
    assert 1 < factor < 100
    assert judge(tolerance, *_one_percent_worse(round(500 * factor * 1.3))).within
    assert not judge(tolerance, *_one_percent_worse(round(500 * factor / 2))).within
    outside = Judgement(reference=1.0, candidate=1.03, excess=0.03, ucb=0.05, allowed=0.02)
    assert not outside.unresolved and outside.data_needed() == float("inf"), "no data brings a 3 % excess inside 2 %"


def test_the_bound_is_paired_so_frames_both_find_hard_cancel():
    """Blocks of very unequal hardness move both errors alike: paired on the same frames, a 1.5 % excess is within 2 %;
    the same errors compared unpaired (measured on different frames, as far as the rule can tell) are not."""
    rng = np.random.default_rng(0)
    reference = rng.normal(size=5_000) * np.repeat(rng.uniform(0.1, 10.0, 200), 25)
    candidate = reference * 1.015
    paired = judge(Tolerance.default("l1"), _sequences(candidate), _sequences(reference))
    unpaired = judge(Tolerance.default("l1"), [candidate], _sequences(reference))
    assert paired.excess == pytest.approx(unpaired.excess) == pytest.approx(0.015 * paired.reference)
    assert paired.within and not unpaired.within


def _detector(frames: int, reference_misses: int, extra_misses: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Confusion codes of a near-perfect detector (every other frame positive) and a candidate that misses
    ``extra_misses`` more positive frames, spread over the drive."""
    truth = np.arange(frames) % 2 == 0
    reference = np.where(truth, TRUE_POSITIVE, TRUE_NEGATIVE).astype(np.float64)
    positives = np.flatnonzero(truth)
    reference[positives[np.linspace(0, positives.size - 1, reference_misses).astype(int)]] = MISS
    candidate = reference.copy()
    hits = np.flatnonzero(candidate == TRUE_POSITIVE)
    candidate[hits[np.linspace(0, hits.size - 1, extra_misses).astype(int)]] = MISS
    candidate[np.flatnonzero(~truth)[:3]] = FALSE_ALARM  # false alarms do not count in a miss rate
    return _sequences(candidate), _sequences(reference)


@pytest.mark.parametrize(("extra_points", "within"), [(0.3, True), (0.8, False)])
def test_a_rate_is_held_to_an_absolute_bound_in_rate_points(extra_points, within):
    positives = 20_000
    tolerance = Tolerance.default("miss_rate")
    assert tolerance.absolute and tolerance.bound == RATE_TOLERANCE == 0.005
    judged = judge(tolerance, *_detector(2 * positives, 22, round(extra_points / 100 * positives)))
    assert judged.reference == pytest.approx(0.0011), "a near-perfect detector: a 2 % relative bound is no extra miss"
    assert judged.excess == pytest.approx(extra_points / 100)
    assert judged.allowed == 0.005 and judged.within is within


def test_max_abs_is_judged_on_its_point_difference():
    candidate, reference = _one_percent_worse(500)
    judged = judge(Tolerance.default("max_abs"), candidate, reference)
    assert judged.ucb == judged.excess


def _spec_with(tmp_path: Path, example: str, nn: str, bound) -> Path:
    data = yaml.safe_load((EXAMPLES / example).read_text())
    data["nns"][nn]["agnostic_tolerance"] = bound
    path = tmp_path / example
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(("example", "nn", "bound", "expected"), [
    ("lanekeep.yaml", "stop", 1.5, "agnostic_tolerance: 1.5 is in rate points"),
    ("cropfollow.yaml", "heading", -0.1, "nns.heading.agnostic_tolerance"),
    ("cropfollow.yaml", "heading", 50.0, "nns.heading.agnostic_tolerance"),
])
def test_a_bad_agnostic_tolerance_names_the_field(tmp_path, example, nn, bound, expected):
    with pytest.raises(SpecError) as info:
        load(_spec_with(tmp_path, example, nn, bound))
    problems = [str(p) for p in info.value.problems]
    assert any(expected in p and f"nns.{nn}" in p for p in problems), problems


def test_a_tolerance_keys_the_search_but_not_the_closed_loop_evidence(tmp_path):
    plain = load(EXAMPLES / "cropfollow.yaml")
    widened = load(_spec_with(tmp_path, "cropfollow.yaml", "heading", 0.1))
    assert "agnostic_tolerance" not in plain.nns["heading"].model_dump(), "specs without it keep their hashes"
    assert widened.content_hash() != plain.content_hash()
    assert BoundApplication(widened).key == BoundApplication(plain).key == plain.content_hash("evaluator", "qos", "nns")
