"""LaneKeep as a Gymnasium environment: ``gymnasium.make("qaopt/LaneKeep-v0")``.

The agent commands (wheel angle rad, acceleration m/s^2) at the perception rate
and observes the camera frame (``observation="image"``, uint8 120x160x3) or the
three NNs' ground truth (``observation="truth"``: lane offset m, stop 0/1, lead
distance m; no rendering). The agent is the whole driving stack here: the
evaluator's pure pursuit, ACC and stop logic are not in the loop. The reward is the
metres gained along the route, less 10 per collision, 5 per lane departure and 10
per missed stop. An episode terminates at the goal or on a collision or a lane
departure, and is truncated at the time limit. The physics, the lead vehicle and
the QoS bookkeeping are the evaluator's own kernels. An action that is not two
finite numbers raises ``gymnasium.error.InvalidAction``; finite actions outside the
box are clipped to it.

Gymnasium 1.x has no plugin entry points, so the id is registered when this package
is imported; ``gymnasium.make("qaopt.simulators.lanekeep:qaopt/LaneKeep-v0")``
imports it for you.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from . import dynamics as dyn
from .config import SimConfig
from .errors import LaneKeepParamError
from .evaluator import Batch

ENV_ID = "qaopt/LaneKeep-v0"
COLLISION_PENALTY = 10.0
DEPARTURE_PENALTY = 5.0
MISSED_STOP_PENALTY = 10.0


class LaneKeepEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = None, observation: Literal["image", "truth"] = "image", **params: Any):
        if render_mode not in (None, "rgb_array"):
            raise LaneKeepParamError("render_mode", f"{render_mode!r} is not supported; use 'rgb_array' or None")
        if observation not in ("image", "truth"):
            raise LaneKeepParamError("observation", f"{observation!r}: use 'image' or 'truth'")
        self.config = SimConfig.from_params(**params)
        self.render_mode = render_mode
        self.observation = observation
        self.metadata = {**self.metadata, "render_fps": self.config.perception_hz}
        car, cam, stack = self.config.car, self.config.camera, self.config.stack
        steer = math.radians(car.max_steer_deg)
        self.action_space = spaces.Box(
            low=np.array([-steer, -car.max_brake_mps2], dtype=np.float32),
            high=np.array([steer, car.max_accel_mps2], dtype=np.float32),
        )
        if observation == "image":
            self.observation_space = spaces.Box(0, 255, (cam.height_px, cam.width_px, 3), dtype=np.uint8)
        else:
            self.observation_space = spaces.Box(
                low=np.array([-50.0, 0.0, 0.0], dtype=np.float32), high=np.array([50.0, 1.0, stack.lead_max_m], dtype=np.float32)
            )
        self._phys = dyn.physics(self.config)
        self._batch: Batch | None = None
        self._renderer = None
        self._scene = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(0, 2**31 - 1)) if seed is None else int(seed)
        self._batch = Batch.start(self.config, [episode_seed], twins=False)
        self._scene = None
        self._step = 0
        return self._observe(), self._info()

    def step(self, action: Any):
        if self._batch is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        action = np.clip(_finite_action(action), self.action_space.low, self.action_space.high)
        b = self._batch
        before = b.state[0].copy()
        dyn.open_loop_step(action[:1], action[1:], b.state, b.curvature, b.stops, b.lead, b.keys, self._phys, b.truth)
        self._step += 1
        after = b.state[0]
        collided = after[dyn.COLLISIONS] - before[dyn.COLLISIONS]
        departed = after[dyn.DEPARTURES] - before[dyn.DEPARTURES]
        missed = after[dyn.MISSED] - before[dyn.MISSED]
        reward = (after[dyn.S] - before[dyn.S]) - COLLISION_PENALTY * collided - DEPARTURE_PENALTY * departed - MISSED_STOP_PENALTY * missed
        terminated = bool(after[dyn.S] >= self.config.route_m or collided > 0 or departed > 0)
        truncated = not terminated and bool(after[dyn.DONE] or self._step >= self.config.max_steps)
        return self._observe(), float(reward), terminated, truncated, self._info()

    def render(self) -> np.ndarray | None:
        if self.render_mode == "rgb_array" and self._batch is None:
            raise gym.error.ResetNeeded("call reset() before render(): there is no episode to draw yet")
        return self._frame() if self.render_mode == "rgb_array" else None

    def _frame(self) -> np.ndarray:
        from .render import Renderer, Scene, episode_style

        b = self._batch
        if self._renderer is None:
            self._renderer = Renderer(self.config)
        if self._scene is None:
            self._scene = Scene.build(b.routes[0], self.config)
            self._style = episode_style(b.seeds[0])
        return self._renderer.render(self._scene, b.state[0], self._style, frame=self._step)

    def _observe(self) -> np.ndarray:
        if self.observation == "image":
            return self._frame()
        return np.clip(self._batch.truth[:, 0], self.observation_space.low, self.observation_space.high).astype(np.float32)

    def _info(self) -> dict[str, Any]:
        st = self._batch.state[0]
        return {
            "distance_m": float(min(st[dyn.S], self.config.route_m)),
            "speed_mps": float(st[dyn.V]),
            "collisions": float(st[dyn.COLLISIONS]),
            "lane_departures": float(st[dyn.DEPARTURES]),
            "missed_stops": float(st[dyn.MISSED]),
            "lane_offset_m": float(self._batch.truth[dyn.LANE, 0]),
            "stop": float(self._batch.truth[dyn.STOP, 0]),
            "lead_distance_m": float(self._batch.truth[dyn.LEAD, 0]),
            "seed": self._batch.seeds[0],
        }


def _finite_action(action: Any) -> np.ndarray:
    """``action`` as (wheel angle rad, acceleration m/s^2), refused unless it is two finite numbers."""
    try:
        a = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError):
        raise gym.error.InvalidAction(f"action {action!r}: give two numbers (steer rad, accel m/s^2)") from None
    if a.size != 2:
        raise gym.error.InvalidAction(f"action {action!r}: give two numbers (steer rad, accel m/s^2), got {a.size}")
    if not np.all(np.isfinite(a)):
        raise gym.error.InvalidAction(f"action {action!r} is not finite: NaN or infinity would corrupt the episode; pass finite numbers")
    return a.reshape(2)


def register() -> None:
    """Register ``qaopt/LaneKeep-v0`` with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="qaopt.simulators.lanekeep.env:LaneKeepEnv")
