"""The row-frame kinematics agree with a plain unicycle in the world frame."""

from __future__ import annotations

import math

import numpy as np

from qaopt.simulators.cropfollow import dynamics as dyn
from qaopt.simulators.cropfollow.config import SimConfig
from qaopt.simulators.cropfollow.evaluator import Batch, physics
from qaopt.simulators.cropfollow.field import Field
from qaopt.simulators.cropfollow.render import Scene


def test_frenet_motion_matches_world_frame_unicycle():
    config = SimConfig.from_params(
        robot={"speed_slip_std": 0.0, "turn_noise_std_radps": 0.0},
        field={"curvature_max_per_m": 0.05, "row_spacing_m": 3.0},  # wide: no intervention resets the pose
        initial_lateral_m=0.0,
        initial_heading_deg=0.0,
    )
    batch = Batch.start(config, [4])
    phys = physics(config)
    scene = Scene.build(Field.from_seed(config.field, 4), 30.0, ds=0.005)
    # World pose of the robot at the start (on the centre line, along it).
    x, y, yaw = scene.centre[np.searchsorted(scene.s_grid, 0.0)]
    v, w = 0.6, 0.02
    dt = config.perception_period_s / 200
    for step in range(100):  # 10 s, 6 m
        dyn.open_loop_step(np.array([v]), np.array([w]), batch.state, batch.curvature, batch.keys, step, phys, batch.truth)
        for _ in range(200):
            x, y, yaw = x + v * dt * math.cos(yaw + 0.5 * w * dt), y + v * dt * math.sin(yaw + 0.5 * w * dt), yaw + w * dt
    # Project the world pose onto the centre line: nearest point, then signed offset along the normal.
    d2 = (scene.centre[:, 0] - x) ** 2 + (scene.centre[:, 1] - y) ** 2
    i = int(np.argmin(d2))
    cx, cy, th = scene.centre[i]
    lateral = -(x - cx) * math.sin(th) + (y - cy) * math.cos(th)
    s, ey, epsi = batch.state[0, dyn.S], batch.state[0, dyn.EY], batch.state[0, dyn.EPSI]
    assert batch.state[0, dyn.INTERVENTIONS] == 0
    assert abs(lateral) > 0.05  # the test moves the robot off the centre line
    assert abs(s - scene.s_grid[i]) < 0.01
    assert abs(ey - lateral) < 0.003
    assert abs(epsi - (yaw - th)) < 0.002


def test_body_touching_a_row_counts_one_collision_then_an_intervention():
    config = SimConfig.from_params(robot={"speed_slip_std": 0.0, "turn_noise_std_radps": 0.0}, field={"curvature_max_per_m": 0.0})
    batch = Batch.start(config, [0])
    phys = physics(config)
    batch.state[0, dyn.EY] = 0.0
    batch.state[0, dyn.EPSI] = math.radians(10.0)  # drifting left: 0.6 m/s * sin 10 deg ~ 10 cm/s
    contact_at = None
    for step in range(60):
        dyn.open_loop_step(np.array([0.6]), np.array([0.0]), batch.state, batch.curvature, batch.keys, step, phys, batch.truth)
        if contact_at is None and batch.state[0, dyn.COLLISIONS] == 1:
            contact_at = batch.state[0, dyn.EY]
        if batch.state[0, dyn.INTERVENTIONS]:
            break
    reach = phys.half_width * math.cos(math.radians(10)) + phys.half_length * math.sin(math.radians(10))
    assert contact_at is not None and abs(contact_at + reach - phys.row_clearance) < 0.02
    assert batch.state[0, dyn.COLLISIONS] == 1
    assert batch.state[0, dyn.INTERVENTIONS] == 1
    assert batch.state[0, dyn.EY] == 0.0 and batch.state[0, dyn.EPSI] == 0.0  # put back on the centre line
