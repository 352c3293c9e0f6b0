"""What both example applications' Gymnasium environments share: one episode of the evaluator's batch, stepped by an agent.

An application's env is its evaluator's batch of one episode, advanced by the
agent's two-number action through the evaluator's own open-loop kernel. The
checks, the reset/step/render skeleton and the refusal of non-finite actions (a
NaN would poison the episode's state) are the same for every application, so they
live here; the application supplies how to start, advance, reward, observe and draw.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .errors import AppParamError


class LockstepEnv(gym.Env, ABC):
    """A one-episode env over an application's batch; a subclass implements the ``_`` hooks below."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    param_error: type[AppParamError]
    action_names: str
    """The action's two numbers as messages name them, e.g. ``"v m/s, w rad/s"``."""
    not_finite_hint: str
    """What a message about a non-finite action tells the agent to do."""

    def __init__(self, render_mode: str | None, observation: str):
        if render_mode not in (None, "rgb_array"):
            raise self.param_error("render_mode", f"{render_mode!r} is not supported; use 'rgb_array' or None")
        if observation not in ("image", "truth"):
            raise self.param_error("observation", f"{observation!r}: use 'image' or 'truth'")
        self.render_mode = render_mode
        self.observation = observation
        self._batch: Any = None

    def _spaces(self, config: Any, action: tuple[list[float], list[float]], truth: tuple[list[float], list[float]]) -> None:
        """Action box ``action`` (low, high); observation the camera frame or the truth box ``truth``."""
        self.metadata = {**self.metadata, "render_fps": config.perception_hz}
        self.action_space = spaces.Box(low=np.array(action[0], dtype=np.float32), high=np.array(action[1], dtype=np.float32))
        if self.observation == "image":
            cam = config.camera
            self.observation_space = spaces.Box(0, 255, (cam.height_px, cam.width_px, 3), dtype=np.uint8)
        else:
            self.observation_space = spaces.Box(low=np.array(truth[0], dtype=np.float32), high=np.array(truth[1], dtype=np.float32))

    @abstractmethod
    def _start(self, seed: int) -> Any:
        """The batch of episode ``seed`` alone."""

    @abstractmethod
    def _advance(self, action: np.ndarray) -> None:
        """Move the episode one perception period with the (clipped) ``action``."""

    @abstractmethod
    def _outcome(self, before: np.ndarray, after: np.ndarray) -> tuple[float, bool, bool]:
        """(reward, terminated, truncated) of a step from state row ``before`` to ``after``."""

    @abstractmethod
    def _frame(self) -> np.ndarray:
        """The episode's camera frame now, uint8 (H, W, 3)."""

    @abstractmethod
    def _truth(self) -> np.ndarray:
        """The NNs' true outputs now: the ``truth`` observation."""

    @abstractmethod
    def _info(self) -> dict[str, Any]:
        """The step's ``info``: the episode's QoS so far."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(0, 2**31 - 1)) if seed is None else int(seed)
        self._batch = self._start(episode_seed)
        self._scene = None
        self._step = 0
        return self._observe(), self._info()

    def step(self, action: Any):
        if self._batch is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        action = np.clip(self._finite_action(action), self.action_space.low, self.action_space.high)
        before = self._batch.state[0].copy()
        self._advance(action)
        self._step += 1
        reward, terminated, truncated = self._outcome(before, self._batch.state[0])
        return self._observe(), float(reward), terminated, truncated, self._info()

    def render(self) -> np.ndarray | None:
        if self.render_mode == "rgb_array" and self._batch is None:
            raise gym.error.ResetNeeded("call reset() before render(): there is no episode to draw yet")
        return self._frame() if self.render_mode == "rgb_array" else None

    def _observe(self) -> np.ndarray:
        return self._frame() if self.observation == "image" else self._truth()

    def _finite_action(self, action: Any) -> np.ndarray:
        """``action`` as two float64, refused unless it is two finite numbers."""
        try:
            a = np.asarray(action, dtype=np.float64)
        except (TypeError, ValueError):
            raise gym.error.InvalidAction(f"action {action!r}: give two numbers ({self.action_names})") from None
        if a.size != 2:
            raise gym.error.InvalidAction(f"action {action!r}: give two numbers ({self.action_names}), got {a.size}")
        if not np.all(np.isfinite(a)):
            raise gym.error.InvalidAction(f"action {action!r} is not finite: NaN or infinity would corrupt the episode; "
                                          f"{self.not_finite_hint}")
        return a.reshape(2)


def register(env_id: str, entry_point: str) -> None:
    """Register ``env_id`` with Gymnasium (idempotent)."""
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point)
