"""A tiny three-NN application with a detector, for tests of calibration over class metrics (seconds).

NNs ``a`` and ``b`` are tinyapp's brightness regressions (8x8 images, a crash when the
running mean of |error| over 5 steps exceeds 0.35). NN ``stop`` is a stop-sign
detector: one output, the probability that a sign is in view, which the application
treats as "present" when ``>= 0.5``. Signs are in view during two stretches of every
run; the car runs the sign (a failure) when the detector misses it on :data:`RUN_THROUGH`
consecutive frames in which it is in view: persistent misses fail, isolated ones do not.
QoS metric ``crashes`` (0 or 1 per run), monotone in every NN's error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from qaopt.calibrate.protocols import Application, Injector, Perception
from tinyapp import LIMIT, STEPS, WINDOW, TinyData, _drive, _images, fit, tiny_data, tiny_net
from torch import nn

NAMES = ("a", "b", "stop")
RUN_THROUGH = 4
"""Consecutive missed frames with a sign in view that make the car run the sign."""
SIGN_FRAMES = 9
"""How long a sign stays in view, in frames."""

__all__ = ["Detector3Evaluator", "detector_data", "detector_net", "tiny_data", "tiny_net"]


def _signs(seed: int, steps: int = STEPS) -> np.ndarray:
    """One run's 0/1 truth of the sign being in view: two stretches of :data:`SIGN_FRAMES` frames."""
    rng = np.random.default_rng(seed + 7919)
    truth = np.zeros(steps)
    first = int(rng.integers(0, 5))
    second = int(rng.integers(first + SIGN_FRAMES + 2, steps - SIGN_FRAMES + 1))
    truth[first : first + SIGN_FRAMES] = 1.0
    truth[second : second + SIGN_FRAMES] = 1.0
    return truth


def _sign_images(truth: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(N,) 0/1 truths -> (N, 1, 8, 8) images: a bright 3x3 patch when the sign is in view, and noise."""
    x = rng.normal(0.3, 0.1, (len(truth), 1, 8, 8)).astype(np.float32)
    x[:, 0, 2:5, 2:5] += 0.5 * truth[:, None, None].astype(np.float32)
    return x


def detector_data(drives: int = 24) -> TinyData:
    rng = np.random.default_rng(11)
    truth = np.concatenate([_signs(2000 + i) for i in range(drives)])
    x, y = _sign_images(truth, rng), truth[:, None].astype(np.float32)
    n_val = 6 * STEPS
    return TinyData(x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:],
                    [np.arange(i * STEPS, (i + 1) * STEPS) for i in range(6)])


class DetectorNet(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1),
                                      nn.Flatten())
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.head(self.features(x)))


def detector_net(steps: int = 100) -> DetectorNet:
    """A trained detector (deterministic), outputting the probability that a sign is in view."""
    torch.manual_seed(0)
    return fit(DetectorNet(), detector_data(), nn.functional.binary_cross_entropy, 2e-2, steps)


class Detector3Evaluator(Application):
    """The application: QoS metric ``crashes`` (0 or 1 per run)."""

    nn_names: tuple[str, ...] = NAMES

    def __init__(self, steps: int = STEPS):
        self.steps = steps

    def _truth(self, seeds: Sequence[int]) -> np.ndarray:
        return np.stack([np.column_stack([_drive(s)[: self.steps], _signs(s, self.steps)]) for s in seeds])

    def _qos(self, truth: np.ndarray, est: np.ndarray) -> list[dict[str, float]]:
        # truth, est: (B, steps, 3); columns a, b (brightness) and stop (0/1 truth, probability estimate)
        kernel = np.ones(WINDOW) / WINDOW
        out = []
        for t_run, e_run in zip(truth, est):
            err = np.abs(e_run[:, :2] - t_run[:, :2])
            crashed = any((np.convolve(err[:, k], kernel, mode="valid") > LIMIT).any() for k in range(2))
            missed, longest = 0, 0
            for present, said in zip(t_run[:, 2] >= 0.5, e_run[:, 2] >= 0.5):
                missed = missed + 1 if present and not said else (missed if not present else 0)
                longest = max(longest, missed)
            out.append({"crashes": float(crashed or longest >= RUN_THROUGH), "steps": float(self.steps)})
        return out

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[dict[str, float]]:
        truth = self._truth(seeds)
        rng = np.random.default_rng(list(seeds))
        est = truth.copy()
        for t in range(self.steps):
            for k, name in enumerate(NAMES):
                if name in injectors:
                    est[:, t, k] = np.asarray(injectors[name](truth[:, t, k].copy(), rng, t)).reshape(-1)
        return self._qos(truth, est)

    def evaluate_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int],
                            render_threads: int = 1) -> list[dict[str, float]]:
        truth = self._truth(seeds)
        rng = np.random.default_rng(list(seeds))
        flat = truth.reshape(-1, 3)
        images = {"a": _images(flat[:, :2], rng), "stop": _sign_images(flat[:, 2], rng)}
        images["b"] = images["a"]
        est = truth.copy()
        for k, name in enumerate(NAMES):
            if name in nns:
                est[:, :, k] = np.asarray(nns[name](images[name])).reshape(len(seeds), self.steps)
        return self._qos(truth, est)
