"""Drone altitude hold: the application of docs/tutorial.md, written from that tutorial alone.

A drone holds 2 m above a landing pad. Two tiny CNNs read 16x16 camera frames:
``altitude`` sees the pad from above (the closer, the larger) and ``gust`` sees a
windsock (the stronger the vertical gust, the further its streak leans). A PD
controller with gust feed-forward sets the thrust. QoS: the run's worst altitude
deviation, ``max_deviation_m``; the spec asks for at most 0.5 m.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from qaopt.calibrate import Application, Injector, Perception

NN_NAMES = ("altitude", "gust")
TARGET_M, DT, KP, KD = 2.0, 0.1, 4.0, 3.0
SIZE = 16
_YY, _XX = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) - (SIZE - 1) / 2


# ---------------------------------------------------------------- the world and its cameras


def render(name: str, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(B,) true altitudes (m) or gusts (m/s^2) -> (B, 1, 16, 16) float32 camera frames with sensor noise."""
    v = np.asarray(values, np.float32)[:, None, None]
    if name == "altitude":  # the landing pad, a disk of radius 10 px at 1 m
        frame = 1.0 / (1.0 + np.exp(2.0 * (np.hypot(_XX, _YY) - 10.0 / np.maximum(v, 0.3))))
    else:  # the windsock's streak, a column that leans with the gust
        frame = np.exp(-0.5 * (_XX - 5.0 * v) ** 2)
    frame = frame + rng.normal(0.0, 0.05, frame.shape)
    return frame[:, None].astype(np.float32)


class Drone(Application):
    """One episode per seed: ``steps`` control steps of 0.1 s, episodes of a call run in lock-step."""

    nn_names = NN_NAMES

    def __init__(self, steps: int = 50, gust_std: float = 0.3):
        if not 2 <= steps <= 10_000:
            raise ValueError(f"steps must be in [2, 10000], got {steps}")
        self.steps, self.gust_std = steps, gust_std

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[dict[str, float]]:
        """Calibration's runs: NN ``name`` outputs ``injectors[name](truth, rng, t)``; a missing NN is perfect."""
        rng = np.random.default_rng([7, *seeds])  # the injectors' draws, from the seeds too

        def perceive(t, truth):
            return {name: np.asarray(injectors[name](truth[name], rng, t), float).reshape(-1)
                    if name in injectors else truth[name] for name in NN_NAMES}

        return self._fly(seeds, perceive)

    def evaluate_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int],
                            render_threads: int = 1) -> list[dict[str, float]]:
        """Closed-loop validation: NN ``name`` reads a batch of camera frames; ``render_threads`` is ignored."""
        cameras = [np.random.default_rng([11, s]) for s in seeds]  # sensor noise, one stream per episode

        def perceive(t, truth):
            out = {}
            for name in NN_NAMES:
                if name not in nns:
                    out[name] = truth[name]
                    continue
                frames = np.concatenate([render(name, truth[name][i : i + 1], cam) for i, cam in enumerate(cameras)])
                out[name] = np.asarray(nns[name](frames), float).reshape(-1)
            return out

        return self._fly(seeds, perceive)

    def _fly(self, seeds: Sequence[int], perceive: Callable[[int, dict], dict]) -> list[dict[str, float]]:
        worlds = [np.random.default_rng(s) for s in seeds]  # everything random about episode i comes from seeds[i]
        h = np.array([w.uniform(1.8, 2.2) for w in worlds])
        v, gust = np.zeros(len(seeds)), np.zeros(len(seeds))
        worst = np.abs(h - TARGET_M)
        for t in range(self.steps):
            gust = np.clip(0.9 * gust + np.array([w.normal(0.0, self.gust_std) for w in worlds]), -1.5, 1.5)
            seen = perceive(t, {"altitude": h.copy(), "gust": gust.copy()})
            thrust = KP * (TARGET_M - seen["altitude"]) - KD * v - seen["gust"]
            v = v + (thrust + gust) * DT
            h = h + v * DT
            worst = np.maximum(worst, np.abs(h - TARGET_M))
        return [{"max_deviation_m": float(d), "final_altitude_m": float(a)} for d, a in zip(worst, h)]


# ---------------------------------------------------------------- the NNs and their data


@dataclass
class FlightData:
    """What qaopt reads of an NN's data (qaopt.approx.NNData)."""

    x_train: np.ndarray  # (N, 1, 16, 16) float32
    y_train: np.ndarray  # (N, 1) float32
    x_val: np.ndarray
    y_val: np.ndarray
    val_sequences: list[np.ndarray]  # one index array into the validation split per flight, in time order


def flight_data(target: str = "altitude", samples: int = 3000, flights: int = 8) -> FlightData:
    """Training frames at random states; validation frames from ``flights`` flights of 50 steps each."""
    rng = np.random.default_rng(0)
    low, high = (1.0, 3.0) if target == "altitude" else (-1.5, 1.5)
    y_train = rng.uniform(low, high, samples)
    truth = []
    for seed in range(10_000, 10_000 + flights):  # the true values of a flight, in time order
        seen: list[np.ndarray] = []
        Drone()._fly([seed], lambda t, truth: seen.append(truth[target]) or truth)
        truth.append(np.concatenate(seen))
    y_val = np.concatenate(truth)
    sequences = [np.arange(i * 50, (i + 1) * 50) for i in range(flights)]
    return FlightData(render(target, y_train, rng), y_train[:, None].astype(np.float32),
                      render(target, y_val, rng), y_val[:, None].astype(np.float32), sequences)


class CameraNet(nn.Module):
    """Two 3x3 convolutions and a linear head: 1,177 parameters at width 8."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Linear(width * (SIZE // 2) ** 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def camera_net(target: str = "altitude", width: int = 8, steps: int = 400) -> CameraNet:
    """The trained NN for ``target``: trained on first use (seconds on a CPU), then read from weights/."""
    recipe = f"{target}-{width}-{steps}"
    path = Path(__file__).with_name("weights") / f"{recipe}-{hashlib.sha256(recipe.encode()).hexdigest()[:8]}.pt"
    model = CameraNet(width)
    if not path.exists():
        torch.manual_seed(0)
        data = flight_data(target)
        x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        batches = torch.Generator().manual_seed(0)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the same weights whatever the machine's cores
        try:
            for _ in range(steps):
                idx = torch.randint(0, len(x), (64,), generator=batches)
                loss = nn.functional.l1_loss(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        finally:
            torch.set_num_threads(threads)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # write, then rename: parallel workers never read half a file
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, path)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()
