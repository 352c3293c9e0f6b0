"""CropFollow's state estimator: an EKF with odometry and a gyro between the NNs and the MPC."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qaopt.simulators.cropfollow import CropFollowEnv, CropFollowEvaluator, CropFollowParamError
from qaopt.simulators.cropfollow import estimator as kf
from qaopt.simulators.cropfollow.evaluator import run_batch

SEEDS = list(range(16))
EKF = CropFollowEvaluator(estimator="ekf")
RAW = CropFollowEvaluator()


class OutlierBursts:
    """Perfect estimates, except bursts of wild ones: about every 3 s, 4-8 frames off by 25-45 deg / 0.25-0.4.

    What a perception NN does when a frame is blinded by sun or a leaf covers the camera.
    """

    def __init__(self, size: tuple[float, float], start_prob: float = 0.03):
        self.size, self.start_prob = size, start_prob

    def __call__(self, truth, rng, t):
        if t == 0:
            self.left = np.zeros(truth.shape, dtype=int)
            self.offset = np.zeros(truth.shape)
            self.frames = np.zeros(truth.shape, dtype=int)
        start = (self.left == 0) & (rng.random(truth.shape) < self.start_prob)
        self.left[start] = rng.integers(4, 9, int(start.sum()))
        self.offset[start] = rng.uniform(*self.size, int(start.sum())) * rng.choice([-1.0, 1.0], int(start.sum()))
        bursting = self.left > 0
        self.left[bursting] -= 1
        self.frames += bursting
        return truth + np.where(bursting, self.offset, 0.0)


def bursts() -> dict:
    return {"heading": OutlierBursts((25.0, 45.0)), "distance": OutlierBursts((0.25, 0.4))}


def tracking(evaluator: CropFollowEvaluator, seeds, truth_of, **kwargs):
    """Run with the NNs reading ``truth_of(truth)``; return the batch and the filter's errors (m, deg) before each step."""
    errors = []

    def estimate(step, batch):
        ekf = batch.ekf
        errors.append((ekf[:, kf.EY] - (0.5 - batch.truth[1]) * evaluator.config.field.row_spacing_m,
                       np.degrees(ekf[:, kf.EPSI]) - batch.truth[0]))
        out = truth_of(batch.truth, step)
        return out[0], out[1]

    batch = run_batch(evaluator.config, seeds, estimate, estimator=evaluator.estimator, **kwargs)
    return batch, np.array(errors)


def test_none_is_the_default():
    assert RAW.estimator.kind == "none"
    assert RAW.evaluate({}, [3, 4]) == CropFollowEvaluator(estimator="none").evaluate({}, [3, 4])


def test_with_perfect_perception_the_estimate_tracks_the_truth():
    batch, errors = tracking(EKF, SEEDS[:8], lambda truth, step: truth)
    settled = errors[10:]  # the first second: the filter starts at the centre, the robot within 4 cm / 3 deg of it
    assert np.sqrt(np.mean(settled[:, 0] ** 2)) < 0.01  # m
    assert np.sqrt(np.mean(settled[:, 1] ** 2)) < 1.0  # deg
    assert batch.ekf[:, kf.REJECTED_HEADING].sum() + batch.ekf[:, kf.REJECTED_DISTANCE].sum() <= 2
    assert all(r["collisions"] == 0 and r["distance_m"] == 100.0 for r in batch.records(EKF.config))


def test_the_gate_rejects_outlier_bursts_and_the_robot_collides_less():
    raw = RAW.evaluate(bursts(), SEEDS)
    ekf = EKF.evaluate(bursts(), SEEDS)
    assert sum(r["collisions"] for r in raw) >= 10
    assert sum(r["collisions"] for r in ekf) < sum(r["collisions"] for r in raw) / 5
    assert sum(r["interventions"] for r in ekf) <= sum(r["interventions"] for r in raw)

    injectors = bursts()
    rng = np.random.default_rng(0)
    batch = run_batch(EKF.config, SEEDS[:4], lambda step, b: (injectors["heading"](b.truth[0], rng, step),
                                                              injectors["distance"](b.truth[1], rng, step)),
                      estimator=EKF.estimator)
    # Nearly every burst frame is rejected (the running noise estimate lets the distance NN's
    # smallest offsets in late in a burst) and hardly any other frame.
    for nn, col, share in (("heading", kf.REJECTED_HEADING, 0.9), ("distance", kf.REJECTED_DISTANCE, 0.7)):
        frames = injectors[nn].frames
        assert np.all(batch.ekf[:, col] >= share * frames), (nn, batch.ekf[:, col], frames)
        assert np.all(batch.ekf[:, col] <= frames + 5), (nn, batch.ekf[:, col], frames)


def test_a_run_of_rejections_cannot_lock_the_filter_out():
    """The heading NN jumps to a lasting 8 deg offset (a knocked camera): the gate rejects it, then re-admits it."""
    def knocked(truth, step):
        return truth[0] + (8.0 if step >= 100 else 0.0), truth[1]

    def run(**params):
        evaluator = CropFollowEvaluator(estimator="ekf", run_length_m=30.0, estimator_params=params)
        return tracking(evaluator, SEEDS[:4], knocked)

    # Fixed NN noise: the inflation rule alone re-admits the NN.
    batch, errors = run(noise_adaptation_s=0.0)
    rejected = batch.ekf[:, kf.REJECTED_HEADING]
    assert np.all(rejected >= 20) and np.all(rejected < 60)
    assert np.all(batch.ekf[:, kf.RUN_HEADING] == 0)  # the NN is believed again ...
    # ... as far as the distance NN, which sees no sideways drift, lets it: the estimate settles between.
    assert np.all((errors[-1, 1] > 4.0) & (errors[-1, 1] < 8.0))

    batch, _ = run(noise_adaptation_s=0.0, rejections_before_inflation=10_000)
    assert np.all(batch.ekf[:, kf.RUN_HEADING] > 300)  # without the rule it never would be

    batch, _ = run()  # the running noise estimate widens the gate before the rule has to
    assert np.all(batch.ekf[:, kf.REJECTED_HEADING] < 20) and np.all(batch.ekf[:, kf.RUN_HEADING] == 0)


def test_the_filter_learns_how_much_an_nn_errs():
    """An NN noisier than the filter assumes (6 deg against 1.86) is measured from the innovations, not rejected."""
    rng = np.random.default_rng(3)
    batch, _ = tracking(EKF, SEEDS[:4], lambda truth, step: (truth[0] + rng.normal(0.0, 6.0, truth[0].shape), truth[1]))
    learned = np.degrees(np.sqrt(batch.ekf[:, kf.NOISE_HEADING]))
    assert np.all(np.abs(learned - 6.0) < 1.5), learned
    steps = batch.ekf[:, kf.REJECTED_HEADING] + batch.ekf[:, kf.ACCEPTED_HEADING]
    assert np.all(batch.ekf[:, kf.REJECTED_HEADING] < 0.02 * steps)


def test_deterministic_per_seed_and_independent_of_the_batch():
    noisy = CropFollowEvaluator(estimator="ekf", run_length_m=30.0, robot={"turn_noise_std_radps": 0.6, "speed_slip_std": 0.2},
                                estimator_params={"gyro_initial_bias_std_degps": 1.0, "odometry_speed_noise_std": 0.1})
    assert noisy.evaluate(bursts(), SEEDS[:6]) == noisy.evaluate(bursts(), SEEDS[:6])
    def perfect(truth, step):
        return truth

    together, _ = tracking(noisy, [1, 5, 7, 9], perfect)
    for row, seed in enumerate([1, 5, 7, 9]):
        alone, _ = tracking(noisy, [seed], perfect)
        assert np.array_equal(alone.ekf[0], together.ekf[row])
        assert np.array_equal(alone.state[0], together.state[row])


def test_sensors_err_as_configured():
    """Each episode's gyro starts with its own bias, spread as ``gyro_initial_bias_std_degps`` says."""
    filt = kf.build_filter(EKF.estimator, EKF.config)
    keys = np.random.default_rng(1).integers(0, 2**63, 4000, dtype=np.uint64)
    bias = np.degrees(kf.start(keys, filt)[:, kf.GYRO_BIAS])
    assert abs(bias.std() - 0.2) < 0.01 and abs(bias.mean()) < 0.01


def test_the_nns_in_the_loop_feed_the_filter():
    """A heading NN stuck at 60 deg throws the raw robot out of its corridor; the EKF gates it out."""
    def stuck(images):
        return np.full(len(images), 60.0)

    params = {"run_length_m": 1.0}
    raw = CropFollowEvaluator(**params).evaluate_perception({"heading": stuck}, [0])
    ekf = CropFollowEvaluator(estimator="ekf", **params).evaluate_perception({"heading": stuck}, [0])
    assert raw[0]["interventions"] >= 1
    assert ekf[0]["interventions"] == 0 and ekf[0]["collisions"] == 0


@pytest.mark.parametrize(
    ("params", "name", "fix"),
    [
        ({"estimator": "kalman"}, "estimator", "'ekf'"),
        ({"estimator": None}, "estimator", "'none'"),
        ({"estimator_params": {"gate_chi2": 9.0}}, "estimator_params", "estimator: ekf"),
        ({"estimator": "ekf", "estimator_params": "tight"}, "estimator_params", "mapping"),
        ({"estimator": "ekf", "estimator_params": {"gate": 9.0}}, "estimator_params.gate", "gate_chi2"),
        ({"estimator": "ekf", "estimator_params": {"gate_chi2": -1.0}}, "estimator_params.gate_chi2", "> 0"),
        ({"estimator": "ekf", "estimator_params": {"heading_std_deg": 0.0}}, "estimator_params.heading_std_deg", "> 0"),
        ({"estimator": "ekf", "estimator_params": {"distance_std_ratio": "small"}}, "estimator_params.distance_std_ratio", "finite number"),
        ({"estimator": "ekf", "estimator_params": {"gyro_bias_walk_degps_per_sqrt_s": math.nan}}, "estimator_params.gyro_bias_walk_degps_per_sqrt_s", "finite"),
        ({"estimator": "ekf", "estimator_params": {"odometry_speed_noise_std": 1.5}}, "estimator_params.odometry_speed_noise_std", "[0, 1)"),
        ({"estimator": "ekf", "estimator_params": {"rejections_before_inflation": 2.5}}, "estimator_params.rejections_before_inflation", "integer"),
        ({"estimator": "ekf", "estimator_params": {"inflation_per_rejection": 1.0}}, "estimator_params.inflation_per_rejection", "locks the filter out"),
    ],
)
def test_bad_parameters_name_the_parameter_and_the_fix(params, name, fix):
    with pytest.raises(CropFollowParamError) as err:
        CropFollowEvaluator(**params)
    assert err.value.param == name
    assert fix in str(err.value)


def test_the_env_says_it_has_no_estimator():
    with pytest.raises(CropFollowParamError, match="agent") as err:
        CropFollowEnv(observation="truth", estimator="ekf")
    assert err.value.param == "estimator"
