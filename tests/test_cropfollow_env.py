"""The Gymnasium environment follows the API and shares the evaluator's physics."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import qaopt.simulators.cropfollow as cf
from qaopt.simulators.cropfollow.control import mpc_gain


def test_registered_and_passes_the_checker():
    assert cf.ENV_ID == "qaopt/CropFollow-v0" and cf.ENV_ID in gym.registry
    check_env(gym.make(cf.ENV_ID, observation="truth").unwrapped)
    env = gym.make(cf.ENV_ID, render_mode="rgb_array", run_length_m=5.0)
    obs, info = env.reset(seed=1)
    assert obs.shape == (240, 320, 3) and obs.dtype == np.uint8
    assert env.render().shape == (240, 320, 3)
    assert set(info) >= {"distance_m", "collisions", "interventions", "collisions_per_100m", "heading_deg", "distance_ratio"}


def test_mpc_in_the_env_drives_like_the_evaluator():
    env = gym.make(cf.ENV_ID, observation="truth", run_length_m=20.0)
    config = env.unwrapped.config
    k = mpc_gain(config)
    obs, _ = env.reset(seed=7)
    total, terminated, steps = 0.0, False, 0
    while not terminated:
        heading_deg, ratio = obs
        ey, epsi = (0.5 - ratio) * config.field.row_spacing_m, np.radians(heading_deg)
        w = float(np.clip(-(k[0] * ey + k[1] * epsi), -1.0, 1.0))
        obs, reward, terminated, truncated, info = env.step([config.robot.cruise_speed_mps, w])
        total += reward
        steps += 1
        assert not truncated
    assert info["collisions"] == 0 and info["distance_m"] == 20.0
    assert total == pytest.approx(info["distance_m"], abs=0.1)  # reward: metres gained, no penalties
    assert info == {**cf.CropFollowEvaluator(run_length_m=20.0).evaluate({}, [7])[0], **{k: info[k] for k in ("heading_deg", "distance_ratio", "seed")}}


def test_driving_straight_in_curved_rows_hits_them():
    env = gym.make(cf.ENV_ID, observation="truth", field={"curvature_max_per_m": 0.05})
    env.reset(seed=3)
    penalties = 0.0
    for _ in range(600):
        _, reward, terminated, truncated, info = env.step([0.6, 0.0])
        penalties += min(reward, 0.0)
        if terminated or truncated:
            break
    assert info["collisions"] > 0 and info["interventions"] > 0 and penalties < 0


def test_bad_env_arguments():
    with pytest.raises(cf.CropFollowParamError, match="'observation'"):
        gym.make(cf.ENV_ID, observation="lidar")
    with pytest.raises(cf.CropFollowParamError, match="'field.row_spacing_m'"):
        gym.make(cf.ENV_ID, field={"row_spacing_m": -0.5})


@pytest.mark.parametrize("action", [[np.nan, 0.0], [0.5, np.inf], [0.5, -np.inf]])
def test_non_finite_action_is_refused_and_the_episode_goes_on(action):
    env, twin = (gym.make(cf.ENV_ID, observation="truth", run_length_m=5.0) for _ in range(2))
    env.reset(seed=2)
    twin.reset(seed=2)
    with pytest.raises(gym.error.InvalidAction, match="not finite"):
        env.step(action)
    obs, reward, *_ = env.step([0.5, 0.0])
    assert env.observation_space.contains(obs) and np.isfinite(reward)
    assert np.array_equal(obs, twin.step([0.5, 0.0])[0])  # the refused action changed nothing


def test_render_before_reset_is_a_clear_error():
    env = cf.CropFollowEnv(render_mode="rgb_array")
    with pytest.raises(gym.error.ResetNeeded, match="call reset\\(\\) before render\\(\\)"):
        env.render()
    env.reset(seed=0)
    assert env.render().shape == (240, 320, 3)
    assert cf.CropFollowEnv().render() is None  # no render mode: nothing to draw, before reset too


def test_make_in_a_fresh_interpreter_without_importing_qaopt():
    """Gymnasium 1.x has no plugin entry points: ``module:id`` makes Gymnasium import the package."""
    script = textwrap.dedent("""
        import sys
        import gymnasium as gym
        assert not [m for m in sys.modules if m.startswith("qaopt")]
        env = gym.make("qaopt.simulators.cropfollow:qaopt/CropFollow-v0", observation="truth")
        obs, _ = env.reset(seed=1)
        print(env.spec.id, env.observation_space.contains(obs))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["qaopt/CropFollow-v0", "True"]
