"""CropFollow as a Gymnasium environment: ``gymnasium.make("qaopt/CropFollow-v0")``.

The agent commands (v, w) at the perception rate and observes the camera frame
(``observation="image"``, uint8 240x320x3) or the two NNs' ground truth
(``observation="truth"``: heading deg, distance ratio; no rendering). The reward
is the metres gained along the row, less 1 per collision and 10 per intervention.
An episode terminates at ``run_length_m`` and is truncated at the time limit. The
physics and the QoS bookkeeping are the evaluator's own kernels. An action that is
not two finite numbers raises ``gymnasium.error.InvalidAction`` (it would poison the
episode's state); finite actions outside the box are clipped to it.

Gymnasium 1.x has no plugin entry points, so the id is registered when this package is
imported; ``gymnasium.make("qaopt.simulators.cropfollow:qaopt/CropFollow-v0")`` imports
it for you (Gymnasium's ``module:id`` form).
"""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from . import dynamics as dyn
from .config import SimConfig
from .errors import CropFollowParamError
from .evaluator import Batch, physics
from .render import Renderer, Scene, episode_style

ENV_ID = "qaopt/CropFollow-v0"
COLLISION_PENALTY = 1.0
INTERVENTION_PENALTY = 10.0


class CropFollowEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = None, observation: Literal["image", "truth"] = "image", **params: Any):
        if render_mode not in (None, "rgb_array"):
            raise CropFollowParamError("render_mode", f"{render_mode!r} is not supported; use 'rgb_array' or None")
        if observation not in ("image", "truth"):
            raise CropFollowParamError("observation", f"{observation!r}: use 'image' or 'truth'")
        if "estimator" in params or "estimator_params" in params:
            raise CropFollowParamError("estimator", "the Gymnasium env has no state estimator: its agent reads the "
                                       "observation and commands (v, w) itself; estimator is a CropFollowEvaluator parameter")
        self.config = SimConfig.from_params(**params)
        self.render_mode = render_mode
        self.observation = observation
        self.metadata = {**self.metadata, "render_fps": self.config.perception_hz}
        r, cam = self.config.robot, self.config.camera
        self.action_space = spaces.Box(
            low=np.array([0.0, -r.max_turn_rate_radps], dtype=np.float32),
            high=np.array([r.max_speed_mps, r.max_turn_rate_radps], dtype=np.float32),
        )
        if observation == "image":
            self.observation_space = spaces.Box(0, 255, (cam.height_px, cam.width_px, 3), dtype=np.uint8)
        else:
            self.observation_space = spaces.Box(
                low=np.array([-90.0, 0.0], dtype=np.float32), high=np.array([90.0, 1.0], dtype=np.float32)
            )
        self._phys = physics(self.config)
        self._renderer = Renderer(cam, self.config.field)
        self._batch: Batch | None = None
        self._scene: Scene | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(0, 2**31 - 1)) if seed is None else int(seed)
        self._batch = Batch.start(self.config, [episode_seed])
        self._scene = None
        self._style = episode_style(episode_seed)
        self._step = 0
        return self._observe(), self._info()

    def step(self, action: Any):
        if self._batch is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        action = np.clip(_finite_action(action), self.action_space.low, self.action_space.high)
        b = self._batch
        before = b.state[0].copy()
        dyn.open_loop_step(action[:1], action[1:], b.state, b.curvature, b.keys, self._step, self._phys, b.truth)
        self._step += 1
        after = b.state[0]
        reward = (
            after[dyn.S] - before[dyn.S]
            - COLLISION_PENALTY * (after[dyn.COLLISIONS] - before[dyn.COLLISIONS])
            - INTERVENTION_PENALTY * (after[dyn.INTERVENTIONS] - before[dyn.INTERVENTIONS])
        )
        terminated = bool(after[dyn.DONE])
        truncated = not terminated and self._step >= self.config.max_steps
        return self._observe(), float(reward), terminated, truncated, self._info()

    def render(self) -> np.ndarray | None:
        if self.render_mode == "rgb_array" and self._batch is None:
            raise gym.error.ResetNeeded("call reset() before render(): there is no episode to draw yet")
        return self._frame() if self.render_mode == "rgb_array" else None

    def _frame(self) -> np.ndarray:
        b = self._batch
        if self._scene is None:
            self._scene = Scene.build(b.fields[0], self.config.run_length_m + 1.0)
        st = b.state[0]
        return self._renderer.render(self._scene, st[dyn.S], st[dyn.EY], st[dyn.EPSI], self._style, frame=self._step)

    def _observe(self) -> np.ndarray:
        if self.observation == "image":
            return self._frame()
        return self._batch.truth[:, 0].astype(np.float32)

    def _info(self) -> dict[str, Any]:
        b = self._batch
        return {
            **b.records(self.config)[0],
            "heading_deg": float(b.truth[0, 0]),
            "distance_ratio": float(b.truth[1, 0]),
            "seed": b.seeds[0],
        }


def _finite_action(action: Any) -> np.ndarray:
    """``action`` as (v m/s, w rad/s), refused unless it is two finite numbers."""
    try:
        a = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError):
        raise gym.error.InvalidAction(f"action {action!r}: give two numbers (v m/s, w rad/s)") from None
    if a.size != 2:
        raise gym.error.InvalidAction(f"action {action!r}: give two numbers (v m/s, w rad/s), got {a.size}")
    if not np.all(np.isfinite(a)):
        raise gym.error.InvalidAction(f"action {action!r} is not finite: NaN or infinity would corrupt "
                                      "the episode; the state is unchanged, pass finite (v, w)")
    return a.reshape(2)


def register() -> None:
    """Register ``qaopt/CropFollow-v0`` with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="qaopt.simulators.cropfollow.env:CropFollowEnv")
