"""CropFollow's error-injection path: QoS with perfect and erroneous perception."""

from __future__ import annotations

import numpy as np
import pytest

from qaopt.app_spec.errors import QaoptError
from qaopt.calibrate.protocols import QoSEvaluator
from qaopt.simulators.cropfollow import CropFollowEvaluator, CropFollowParamError, PerceptionError

SEEDS = list(range(20))


def gaussian(sigma: float):
    def inject(truth, rng, t):
        return truth + rng.normal(0.0, sigma, truth.shape)

    return inject


def mean_rate(records) -> float:
    return float(np.mean([r["collisions_per_100m"] for r in records]))


@pytest.fixture(scope="module")
def evaluator() -> CropFollowEvaluator:
    return CropFollowEvaluator(run_length_m=100.0, controller="mpc")


def test_is_a_qos_evaluator(evaluator):
    assert isinstance(evaluator, QoSEvaluator)
    assert evaluator.nn_names == ("heading", "distance")


@pytest.mark.parametrize("controller", ["mpc", "stanley"])
def test_perfect_perception_never_collides(controller):
    records = CropFollowEvaluator(controller=controller).evaluate({}, SEEDS)
    assert len(records) == len(SEEDS)
    for r in records:
        assert r == {"distance_m": 100.0, "collisions": 0, "interventions": 0, "collisions_per_100m": 0.0}


def test_large_heading_error_makes_most_runs_collide(evaluator):
    records = evaluator.evaluate({"heading": gaussian(30.0)}, SEEDS)
    assert sum(r["collisions"] > 0 for r in records) >= 15
    assert all(r["distance_m"] == 100.0 for r in records)


@pytest.mark.parametrize(("nn", "sigmas"), [("heading", [0.0, 20.0, 30.0, 45.0]), ("distance", [0.0, 0.25, 0.35, 0.5])])
def test_qos_degrades_as_error_grows(evaluator, nn, sigmas):
    rates = [mean_rate(evaluator.evaluate({nn: gaussian(s)}, SEEDS)) for s in sigmas]
    assert rates[0] == 0.0
    assert all(a < b for a, b in zip(rates, rates[1:])), rates


def test_deterministic_and_missing_nn_is_perfect(evaluator):
    a = evaluator.evaluate({"heading": gaussian(20.0), "distance": gaussian(0.2)}, SEEDS[:6])
    b = evaluator.evaluate({"heading": gaussian(20.0), "distance": gaussian(0.2)}, SEEDS[:6])
    assert a == b
    perfect = evaluator.evaluate({"heading": lambda truth, rng, t: truth}, [3, 4])
    assert perfect == evaluator.evaluate({}, [3, 4])


def test_a_disturbance_makes_perfect_perception_wander_and_stays_out_of_cache_keys_while_off():
    """A disturbance is what a stress stratum steers by; off, it leaves runs and cache keys as they were."""
    plain = CropFollowEvaluator()
    off = CropFollowEvaluator(disturbance={"heading_deg": 0.0, "distance_ratio": 0.0})
    on = CropFollowEvaluator(disturbance={"heading_deg": 12.0, "distance_ratio": 0.12})
    assert off.evaluate({}, SEEDS[:6]) == plain.evaluate({}, SEEDS[:6])
    assert off.config.to_dict() == plain.config.to_dict() and "disturbance" not in plain.config.to_dict()
    assert on.config.to_dict()["disturbance"]["heading_deg"] == 12.0
    disturbed = on.evaluate({}, SEEDS[:6])
    assert disturbed == on.evaluate({}, SEEDS[:6])
    assert sum(r["collisions"] > 0 for r in disturbed) >= 4


def test_episode_does_not_depend_on_its_batch():
    """With perfect perception an episode is a function of its seed alone (process noise included)."""
    ev = CropFollowEvaluator(robot={"turn_noise_std_radps": 0.6, "speed_slip_std": 0.2}, run_length_m=30.0)
    alone = [ev.evaluate({}, [s])[0] for s in (5, 9)]
    assert ev.evaluate({}, [1, 5, 7, 9]) == [ev.evaluate({}, [1])[0], alone[0], ev.evaluate({}, [7])[0], alone[1]]


def test_injector_sees_truth_of_each_episode(evaluator):
    seen = []

    def spy(truth, rng, t):
        seen.append((t, truth.copy()))
        return truth

    evaluator.evaluate({"distance": spy}, [0, 1, 2])
    assert seen[0][0] == 0 and seen[1][0] == 1
    assert all(t.shape == (3,) for _, t in seen)
    values = np.concatenate([t for _, t in seen])
    assert 0.3 < values.min() and values.max() < 0.7  # d_left / (d_left + d_right) near 0.5 when on course
    assert len(seen) == pytest.approx(100.0 / 0.6 * 10, rel=0.1)


def test_nan_from_an_injector_names_the_nn(evaluator):
    def nan_later(truth, rng, t):
        return truth + (np.nan if t == 7 else 0.0)

    with pytest.raises(PerceptionError, match=r"'distance'.*step 7.*not finite"):
        evaluator.evaluate({"distance": nan_later}, [0, 1])


def test_bad_injector_output_and_names(evaluator):
    with pytest.raises(PerceptionError, match=r"'heading'.*shape"):
        evaluator.evaluate({"heading": lambda truth, rng, t: truth[:1]}, [0, 1])
    with pytest.raises(PerceptionError, match=r"'speed'"):
        evaluator.evaluate({"speed": gaussian(1.0)}, [0])
    with pytest.raises(CropFollowParamError, match="seeds"):
        evaluator.evaluate({}, [-1])


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"field": {"row_spacing_m": -0.76}}, "field.row_spacing_m"),
        ({"camera": {"pitch_down_deg": -40.0}}, "camera.pitch_down_deg"),
        ({"camera": {"mount_height_m": 0.0}}, "camera.mount_height_m"),
        ({"run_length_m": 0.0}, "run_length_m"),
        ({"controller": "pid"}, "controller"),
        ({"robot": {"body_width_m": 0.8}}, "robot.body_width_m"),
        ({"field": {"row_width": 1.0}}, "field.row_width"),
        ({"speed": 1.0}, "speed"),
        ({"disturbance": {"heading_deg": -1.0}}, "disturbance.heading_deg"),
        ({"disturbance": {"correlation": 1.0}}, "disturbance.correlation"),
        ({"disturbance": {"heading": 12.0}}, "disturbance.heading"),
    ],
)
def test_bad_parameters_name_the_parameter(params, name):
    with pytest.raises(CropFollowParamError) as info:
        CropFollowEvaluator(**params)
    assert isinstance(info.value, QaoptError)
    assert f"'{name}'" in str(info.value)
