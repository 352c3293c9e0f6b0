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

import numpy as np

from . import dynamics as dyn
from .config import SimConfig
from .errors import CropFollowParamError
from .evaluator import Batch, physics
from .. import gym_env
from .render import Renderer, Scene, episode_style

ENV_ID = "qaopt/CropFollow-v0"
COLLISION_PENALTY = 1.0
INTERVENTION_PENALTY = 10.0


class CropFollowEnv(gym_env.LockstepEnv):
    param_error = CropFollowParamError
    action_names = "v m/s, w rad/s"
    not_finite_hint = "the state is unchanged, pass finite (v, w)"

    def __init__(self, render_mode: str | None = None, observation: Literal["image", "truth"] = "image", **params: Any):
        super().__init__(render_mode, observation)
        if "estimator" in params or "estimator_params" in params:
            raise CropFollowParamError("estimator", "the Gymnasium env has no state estimator: its agent reads the "
                                       "observation and commands (v, w) itself; estimator is a CropFollowEvaluator parameter")
        self.config = SimConfig.from_params(**params)
        r = self.config.robot
        self._spaces(self.config, ([0.0, -r.max_turn_rate_radps], [r.max_speed_mps, r.max_turn_rate_radps]), ([-90.0, 0.0], [90.0, 1.0]))
        self._phys = physics(self.config)
        self._renderer = Renderer(self.config.camera, self.config.field)

    def _start(self, seed: int) -> Batch:
        return Batch.start(self.config, [seed])

    def _advance(self, action: np.ndarray) -> None:
        b = self._batch
        dyn.open_loop_step(action[:1], action[1:], b.state, b.curvature, b.keys, self._step, self._phys, b.truth)

    def _outcome(self, before: np.ndarray, after: np.ndarray) -> tuple[float, bool, bool]:
        reward = (
            after[dyn.S] - before[dyn.S]
            - COLLISION_PENALTY * (after[dyn.COLLISIONS] - before[dyn.COLLISIONS])
            - INTERVENTION_PENALTY * (after[dyn.INTERVENTIONS] - before[dyn.INTERVENTIONS])
        )
        terminated = bool(after[dyn.DONE])
        return reward, terminated, not terminated and self._step >= self.config.max_steps

    def _frame(self) -> np.ndarray:
        b = self._batch
        if self._scene is None:
            self._scene = Scene.build(b.fields[0], self.config.run_length_m + 1.0)
            self._style = episode_style(b.seeds[0])
        st = b.state[0]
        return self._renderer.render(self._scene, st[dyn.S], st[dyn.EY], st[dyn.EPSI], self._style, frame=self._step)

    def _truth(self) -> np.ndarray:
        return self._batch.truth[:, 0].astype(np.float32)

    def _info(self) -> dict[str, Any]:
        b = self._batch
        return {
            **b.records(self.config)[0],
            "heading_deg": float(b.truth[0, 0]),
            "distance_ratio": float(b.truth[1, 0]),
            "seed": b.seeds[0],
        }


def register() -> None:
    """Register ``qaopt/CropFollow-v0`` with Gymnasium (idempotent)."""
    gym_env.register(ENV_ID, "qaopt.simulators.cropfollow.env:CropFollowEnv")
