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

import numpy as np

from . import dynamics as dyn
from .config import SimConfig
from .errors import LaneKeepParamError
from .evaluator import Batch
from .. import gym_env

ENV_ID = "qaopt/LaneKeep-v0"
COLLISION_PENALTY = 10.0
DEPARTURE_PENALTY = 5.0
MISSED_STOP_PENALTY = 10.0


class LaneKeepEnv(gym_env.LockstepEnv):
    param_error = LaneKeepParamError
    action_names = "steer rad, accel m/s^2"
    not_finite_hint = "pass finite numbers"

    def __init__(self, render_mode: str | None = None, observation: Literal["image", "truth"] = "image", **params: Any):
        super().__init__(render_mode, observation)
        self.config = SimConfig.from_params(**params)
        car, stack = self.config.car, self.config.stack
        steer = math.radians(car.max_steer_deg)
        self._spaces(self.config, ([-steer, -car.max_brake_mps2], [steer, car.max_accel_mps2]), ([-50.0, 0.0, 0.0], [50.0, 1.0, stack.lead_max_m]))
        self._phys = dyn.physics(self.config)
        self._renderer = None

    def _start(self, seed: int) -> Batch:
        return Batch.start(self.config, [seed], twins=False)

    def _advance(self, action: np.ndarray) -> None:
        b = self._batch
        dyn.open_loop_step(action[:1], action[1:], b.state, b.curvature, b.stops, b.lead, b.keys, self._phys, b.truth)

    def _outcome(self, before: np.ndarray, after: np.ndarray) -> tuple[float, bool, bool]:
        collided = after[dyn.COLLISIONS] - before[dyn.COLLISIONS]
        departed = after[dyn.DEPARTURES] - before[dyn.DEPARTURES]
        missed = after[dyn.MISSED] - before[dyn.MISSED]
        reward = (after[dyn.S] - before[dyn.S]) - COLLISION_PENALTY * collided - DEPARTURE_PENALTY * departed - MISSED_STOP_PENALTY * missed
        terminated = bool(after[dyn.S] >= self.config.route_m or collided > 0 or departed > 0)
        return reward, terminated, not terminated and bool(after[dyn.DONE] or self._step >= self.config.max_steps)

    def _frame(self) -> np.ndarray:
        from .render import Renderer, Scene, episode_style

        b = self._batch
        if self._renderer is None:
            self._renderer = Renderer(self.config)
        if self._scene is None:
            self._scene = Scene.build(b.routes[0], self.config)
            self._style = episode_style(b.seeds[0])
        return self._renderer.render(self._scene, b.state[0], self._style, frame=self._step)

    def _truth(self) -> np.ndarray:
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


def register() -> None:
    """Register ``qaopt/LaneKeep-v0`` with Gymnasium (idempotent)."""
    gym_env.register(ENV_ID, "qaopt.simulators.lanekeep.env:LaneKeepEnv")
