"""LaneKeep's renderer and its Gymnasium environment."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env

import qaopt.simulators.lanekeep as lk
from qaopt.simulators.lanekeep.config import SimConfig
from qaopt.simulators.lanekeep.evaluator import Batch
from qaopt.simulators.lanekeep.render import Renderer, Scene, episode_style


def _frame(seed, lead_gap=np.nan, at_stop=False):
    config = SimConfig()
    batch = Batch.start(config, [seed], twins=False)
    route = batch.routes[0]
    scene = Scene.build(route, config)
    s = route.stops[0] - 15.0 if at_stop else 20.0
    return Renderer(config).draw(scene, s, 0.1, 0.01, s + 2.25 + lead_gap, episode_style(seed))


def test_frames_have_the_camera_shape_and_range_and_are_deterministic():
    config = SimConfig()
    batch = Batch.start(config, [4], twins=False)
    renderer, scene, style = Renderer(config), Scene.build(batch.routes[0], config), episode_style(4)
    chw = renderer.frame_chw(scene, batch.state[0], style, frame=3)
    assert chw.shape == (3, 120, 160) and chw.dtype == np.float32
    assert 0.0 <= chw.min() and chw.max() <= 1.0 and chw.std() > 0.05
    assert np.array_equal(chw, renderer.frame_chw(scene, batch.state[0], style, frame=3))


def test_the_lead_vehicle_and_the_stop_sign_are_drawn():
    empty, lead = _frame(2), _frame(2, lead_gap=10.0)
    changed = np.any(empty != lead, axis=-1)
    rows, cols = np.nonzero(changed)
    assert changed.sum() > 100 and abs(cols.mean() - 80) < 20  # the car is ahead, in the ego lane
    red = lambda img: np.sum((img[..., 0] > 120) & (img[..., 1] < 60) & (img[..., 2] < 60))  # noqa: E731
    assert red(lead) > red(empty)  # tail lights
    assert red(_frame(2, at_stop=True)) > red(empty)  # the stop sign's panel


def test_env_is_registered_and_passes_the_checker():
    assert lk.ENV_ID == "qaopt/LaneKeep-v0" and lk.ENV_ID in gym.registry
    check_env(gym.make(lk.ENV_ID, observation="truth").unwrapped)
    env = gym.make(lk.ENV_ID, render_mode="rgb_array", route_m=30.0)
    obs, info = env.reset(seed=1)
    assert obs.shape == (120, 160, 3) and obs.dtype == np.uint8
    assert env.render().shape == (120, 160, 3)
    assert set(info) >= {"distance_m", "collisions", "lane_departures", "missed_stops", "lead_distance_m"}
    check_env(gym.make(lk.ENV_ID, route_m=30.0).unwrapped, skip_render_check=True)


def test_env_is_deterministic_per_seed():
    def drive(seed):
        env = gym.make(lk.ENV_ID, observation="truth", route_m=40.0)
        obs, _ = env.reset(seed=seed)
        out = [obs]
        for _ in range(30):
            obs, reward, terminated, truncated, _ = env.step([-0.2 * float(obs[0]) / 8.0, 0.0])
            out.append(obs)
            if terminated or truncated:
                break
        return np.array(out)

    assert np.array_equal(drive(5), drive(5))
    assert not np.array_equal(drive(5), drive(6))
