"""A tiny two-NN application for end-to-end tests of the optimize pipeline (seconds, not hours).

Each perception step shows an 8x8 grey image whose left half has brightness ``a``
and right half ``b``; NN ``a`` estimates ``a``, NN ``b`` estimates ``b``. The
application "crashes" in a run when the running mean of |error| over 5 steps
exceeds 0.35 for either NN: a monotone QoS, like a robot leaving its row.

:class:`TinyEvaluator` declares the application protocol (:class:`qaopt.calibrate.Application`)
by subclassing it, and ``qaopt.check_application`` passes on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from qaopt.calibrate.protocols import Application, Injector, Perception, Recording

STEPS = 30
WINDOW = 5
LIMIT = 0.35
NAMES = ("a", "b")


def _images(truth: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(N, 2) brightness pairs -> (N, 1, 8, 8) float32 images with sensor noise."""
    x = np.empty((len(truth), 1, 8, 8), np.float32)
    x[:, 0, :, :4] = truth[:, 0, None, None]
    x[:, 0, :, 4:] = truth[:, 1, None, None]
    return x + rng.normal(0, 0.05, x.shape).astype(np.float32)


def _drive(seed: int) -> np.ndarray:
    """One run's (STEPS, 2) true brightness, a smooth random walk in [0, 1]."""
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.normal(0, 0.08, (STEPS, 2)), axis=0) + rng.uniform(0.3, 0.7, 2)
    return np.clip(walk, 0.0, 1.0)


@dataclass
class TinyData:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    val_sequences: list[np.ndarray]


def tiny_data(target: str = "a", drives: int = 24) -> TinyData:
    column = NAMES.index(target)
    rng = np.random.default_rng(7)
    truth = np.concatenate([_drive(1000 + i) for i in range(drives)])
    x = _images(truth, rng)
    y = truth[:, column : column + 1].astype(np.float32)
    n_val = 6 * STEPS
    return TinyData(x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:],
                    [np.arange(i * STEPS, (i + 1) * STEPS) for i in range(6)])


class TinyNet(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def fit(model: nn.Module, data: TinyData, loss, lr: float, steps: int) -> nn.Module:
    """Train ``model`` on ``data``'s training split with Adam, batches of 64 drawn from a fixed seed; eval mode.

    On one thread, whatever the process set: torch's CPU kernels sum in another order on more, so the weights
    would depend on the process that loads the NN, and a run resumed in another process would find other
    reference NNs than its study began with (qaopt.search.open_study warns of that; the resume tests compare
    such runs trial by trial).
    """
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            idx = torch.randint(0, len(x), (64,), generator=g)
            value = loss(model(x[idx]), y[idx])
            opt.zero_grad()
            value.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def tiny_net(target: str = "a", steps: int = 150) -> TinyNet:
    """A trained TinyNet, the same weights in every process (a fixed seed, one thread: :func:`fit`)."""
    torch.manual_seed(0)
    return fit(TinyNet(), tiny_data(target), nn.functional.l1_loss, 1e-2, steps)


class TinyEvaluator(Application):
    """The application: QoS metric ``crashes`` (0 or 1 per run)."""

    nn_names: tuple[str, ...] = NAMES

    def __init__(self, steps: int = STEPS):
        self.steps = steps

    def _qos(self, errors: np.ndarray) -> list[dict[str, float]]:
        # errors: (B, STEPS, 2) signed errors
        kernel = np.ones(WINDOW) / WINDOW
        crashed = []
        for run in np.abs(errors):
            means = np.stack([np.convolve(run[:, k], kernel, mode="valid") for k in range(2)])
            crashed.append(float((means > LIMIT).any()))
        return [{"crashes": c, "steps": float(self.steps)} for c in crashed]

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[dict[str, float]]:
        truth = np.stack([_drive(s) for s in seeds])  # (B, STEPS, 2)
        rng = np.random.default_rng(list(seeds))
        est = truth.copy()
        for t in range(self.steps):
            for k, name in enumerate(NAMES):
                if name in injectors:
                    est[:, t, k] = np.asarray(injectors[name](truth[:, t, k].copy(), rng, t)).reshape(-1)
        return self._qos(est - truth)

    def evaluate_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int],
                            render_threads: int = 1) -> list[dict[str, float]]:
        """NNs read the runs' images; ``render_threads`` is accepted and unused (the images are cheap)."""
        truth = np.stack([_drive(s) for s in seeds])
        rng = np.random.default_rng(list(seeds))
        images = _images(truth.reshape(-1, 2), rng)
        est = truth.copy()
        for k, name in enumerate(NAMES):
            if name in nns:
                est[:, :, k] = np.asarray(nns[name](images)).reshape(len(seeds), self.steps)
        return self._qos(est - truth)


class RecordingTinyEvaluator(TinyEvaluator):
    """The tiny application that can also record on-policy drives (:class:`qaopt.calibrate.Recorder`).

    Its world does not react to the NNs, so a drive's images are those of
    ``evaluate_perception``; ``recorded`` counts the calls, so tests see the cache work.
    """

    recorded = 0

    def record_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int], steps: int) -> dict[str, Recording]:
        type(self).recorded += 1
        steps = min(steps, self.steps)
        truth = np.stack([_drive(s)[:steps] for s in seeds]).reshape(-1, 2)
        images = _images(truth, np.random.default_rng(list(seeds)))
        sequences = tuple(np.arange(i * steps, (i + 1) * steps) for i in range(len(seeds)))
        return {name: Recording(images, truth[:, k : k + 1].astype(np.float32), sequences)
                for k, name in enumerate(NAMES)}
