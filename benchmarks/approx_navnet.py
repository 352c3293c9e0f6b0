"""The stand-in NN for the approx benchmarks when CropFollow's reference NNs are not available.

A NavNet-shaped model (CropFollow's compact backbone and head, defined here so the
benchmarks do not depend on the simulator) trained on synthetic labelled images:
two crop rows drawn as slanted green bands whose slant is the heading (degrees)
and whose horizontal offset is the lateral distance ratio. Its weights are cached
under the cache dir by content hash.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from qaopt.app_spec.hashing import content_hash
from qaopt.approx import ErrorMetric, TargetNN

SHAPE = (1, 3, 240, 320)


def navnet_like(width: int = 16) -> nn.Module:
    """8 conv-BN-ReLU blocks (/32), then conv 512 + BN + ReLU, GAP, FC 512->64, ReLU, dropout, FC 64->1."""

    def cbr(i: int, o: int, s: int = 1) -> list[nn.Module]:
        return [nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]

    w = width
    chans = [(3, w, 2), (w, 2 * w, 2), (2 * w, 2 * w, 1), (2 * w, 4 * w, 2), (4 * w, 4 * w, 1), (4 * w, 8 * w, 2), (8 * w, 8 * w, 1), (8 * w, 8 * w, 2)]
    layers = [m for i, o, s in chans for m in cbr(i, o, s)]
    layers += [*cbr(8 * w, 512), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 1)]
    return nn.Sequential(*layers).eval()


def synthetic_rows(target: str, n_train: int = 768, n_val: int = 192, drive: int = 48, seed: int = 0) -> SimpleNamespace:
    """Images of two crop rows; drives are smooth random walks of heading and offset."""
    rng = np.random.default_rng(seed)
    h, w = SHAPE[2], SHAPE[3]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)

    def drives(n: int) -> tuple[np.ndarray, np.ndarray]:
        heading = np.cumsum(rng.normal(0, 1.5, n)).clip(-25, 25)
        offset = (0.5 + np.cumsum(rng.normal(0, 0.02, n))).clip(0.2, 0.8)
        return heading.astype(np.float32), offset.astype(np.float32)

    def render(heading: np.ndarray, offset: np.ndarray) -> np.ndarray:
        x = np.empty((len(heading), 3, h, w), np.float32)
        for i, (a, d) in enumerate(zip(heading, offset)):
            centre = w * d + (h - yy) * np.tan(np.radians(a))
            band = np.exp(-(((xx - centre + 70) ** 2) / 200.0)) + np.exp(-(((xx - centre - 70) ** 2) / 200.0))
            x[i, 0] = 0.35 + 0.1 * rng.random((h, w)) - 0.2 * band
            x[i, 1] = 0.35 + 0.1 * rng.random((h, w)) + 0.4 * band
            x[i, 2] = 0.30 + 0.1 * rng.random((h, w)) - 0.1 * band
        return x

    splits = {}
    for split, n in (("train", n_train), ("val", n_val)):
        heading, offset = drives(n)
        splits[f"x_{split}"] = render(heading, offset)
        splits[f"y_{split}"] = (heading if target == "heading" else offset)[:, None]
    return SimpleNamespace(**splits, val_sequences=[np.arange(i, min(i + drive, n_val)) for i in range(0, n_val, drive)])


def stand_in(target: str, cache_dir: Path, steps: int = 150) -> TargetNN:
    """A trained stand-in NN for ``target`` (heading or distance)."""
    data = synthetic_rows(target)
    path = Path(cache_dir) / "approx-bench" / f"navnet-{content_hash(target, steps, 'v1')}.pt"
    model = navnet_like()
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
    else:
        torch.manual_seed(0)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
        rng = np.random.default_rng(0)
        scale = float(data.y_train.std())
        model.train()
        for step in range(steps):
            idx = rng.choice(len(data.x_train), 16, replace=False)
            out = model(torch.from_numpy(data.x_train[idx]))
            loss = nn.functional.l1_loss(out / scale, torch.from_numpy(data.y_train[idx]) / scale)
            opt.zero_grad()
            loss.backward()
            opt.step()
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
    return TargetNN(target, model.eval(), data, SHAPE, ErrorMetric("l1", 0))
