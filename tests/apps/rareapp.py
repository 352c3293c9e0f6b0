"""A one-NN application that fails only in a rare state: the case stress strata exist for.

Each step shows an 8x8 grey image of brightness ``v`` (a smooth random walk); NN ``v`` estimates it.
Now and then glare saturates the image's right half for :data:`GLARE_STEPS` steps (``glare_rate``
episodes a step, a simulator param). A run crashes when the mean |error| over :data:`WINDOW` steps
exceeds :data:`LIMIT`.

:class:`HalfMean` reads one half of the image: the left half (the reference) is blind to glare; the
right half (``fragile``) errs by ``1 - v`` under glare and is as good as the reference elsewhere. At the
nominal glare rate its average error is small, but glare meets a quarter of the runs, and each such run
crashes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from qaopt.calibrate.protocols import Application, Injector, Perception, Recording

STEPS = 30
WINDOW = 3
LIMIT = 0.3
GLARE_STEPS = 4
NOMINAL_GLARE_RATE = 0.01


def _world(seed: int, steps: int, glare_rate: float) -> tuple[np.ndarray, np.ndarray]:
    """One run's true brightness (steps,) in [0.2, 0.8] and its glare flags (steps,)."""
    rng = np.random.default_rng([seed, 0x61A4E])
    v = np.clip(np.cumsum(rng.normal(0, 0.05, steps)) + rng.uniform(0.3, 0.7), 0.2, 0.8)
    glare = np.zeros(steps, bool)
    for t in np.flatnonzero(rng.random(steps) < glare_rate):
        glare[t : t + GLARE_STEPS] = True
    return v, glare


def _images(v: np.ndarray, glare: np.ndarray, seed: Sequence[int]) -> np.ndarray:
    x = np.repeat(v.astype(np.float32)[:, None, None, None], 8, axis=2).repeat(8, axis=3)
    x = x + np.random.default_rng(list(seed)).normal(0, 0.05, x.shape).astype(np.float32)
    x[glare, :, :, 4:] = 1.0
    return x


class HalfMean(nn.Module):
    """Brightness read from the left (reference) or right (``fragile``) half of the image."""

    def __init__(self, side: str = "left"):
        super().__init__()
        self.cols = slice(0, 4) if side == "left" else slice(4, 8)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :, :, self.cols].mean(dim=(1, 2, 3)).unsqueeze(1) * self.scale


def reader(side: str = "left") -> HalfMean:
    return HalfMean(side).eval()


@dataclass
class RareData:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    val_sequences: list[np.ndarray]


def rare_data(drives: int = 8) -> RareData:
    worlds = [_world(100 + d, STEPS, NOMINAL_GLARE_RATE) for d in range(drives)]
    v = np.concatenate([w[0] for w in worlds])
    x = _images(v, np.concatenate([w[1] for w in worlds]), [7])
    y = v[:, None].astype(np.float32)
    return RareData(x, y, x, y, [np.arange(d * STEPS, (d + 1) * STEPS) for d in range(drives)])


class RareEvaluator(Application):
    """QoS metric ``crashes`` (0 or 1 per run); ``glare_rate``: glare episodes per step."""

    nn_names: tuple[str, ...] = ("v",)

    def __init__(self, glare_rate: float = NOMINAL_GLARE_RATE):
        self.glare_rate = float(glare_rate)

    def _worlds(self, seeds: Sequence[int], steps: int = STEPS) -> tuple[np.ndarray, np.ndarray]:
        worlds = [_world(s, steps, self.glare_rate) for s in seeds]
        return np.stack([w[0] for w in worlds]), np.stack([w[1] for w in worlds])

    @staticmethod
    def _qos(errors: np.ndarray) -> list[dict[str, float]]:
        kernel = np.ones(WINDOW) / WINDOW
        return [{"crashes": float((np.convolve(np.abs(run), kernel, mode="valid") > LIMIT).any())} for run in errors]

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[dict[str, float]]:
        truth, _ = self._worlds(seeds)
        rng = np.random.default_rng(list(seeds))
        est = truth.copy()
        if "v" in injectors:
            for t in range(STEPS):
                est[:, t] = np.asarray(injectors["v"](truth[:, t].copy(), rng, t)).reshape(-1)
        return self._qos(est - truth)

    def evaluate_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int],
                            render_threads: int = 1) -> list[dict[str, float]]:
        truth, glare = self._worlds(seeds)
        est = truth.copy()
        if "v" in nns:
            images = _images(truth.reshape(-1), glare.reshape(-1), seeds)
            est = np.asarray(nns["v"](images)).reshape(truth.shape)
        return self._qos(est - truth)

    def record_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int], steps: int) -> dict[str, Recording]:
        """The world does not react to the NN: a drive's frames are those ``evaluate_perception`` would show."""
        truth, glare = self._worlds(seeds, steps)
        images = _images(truth.reshape(-1), glare.reshape(-1), seeds)
        sequences = tuple(np.arange(i * steps, (i + 1) * steps) for i in range(len(seeds)))
        return {"v": Recording(images, truth.reshape(-1, 1).astype(np.float32), sequences)}
