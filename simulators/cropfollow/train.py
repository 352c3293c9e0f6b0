"""Training of CropFollow's reference perception NNs and their validation report.

A recipe (target, backbone, epochs, batch size, learning rate, seed, dataset
arguments) determines a trained NN; its content hash names the weights on disk.
Training regresses the normalised target with a smooth-L1 loss (AdamW, cosine
learning-rate decay) and mirrors half of each batch left-right, which negates the
heading and turns the distance ratio r into 1 - r: the same geometry seen from
the other side, so the NN cannot lean on one side's look.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from qaopt.app_spec.hashing import content_hash

from .. import training
from ..training import predict, save
from .dataset import ReferenceDataset, dataset_recipe, reference_dataset
from .nets import NavNet

Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: phase is "data", "train" or "validate"."""


@dataclass(frozen=True)
class Recipe:
    """Everything that determines a trained reference NN."""

    target: str = "heading"
    backbone: str = "compact"
    epochs: int = 16
    batch_size: int = 32
    lr: float = 5e-4
    weight_decay: float = 1e-4
    seed: int = 0
    dataset: dict[str, Any] = field(default_factory=dict)
    """Arguments of :func:`reference_dataset` besides the target (sizes, seed, simulator params)."""

    def key(self) -> str:
        return content_hash({"kind": "cropfollow-navnet", "version": 1, **asdict(self), "dataset": dataset_recipe(**self.dataset)})


@dataclass
class Report:
    """Validation of a trained NN: mean absolute error in the target's unit."""

    target: str
    backbone: str
    val_l1: float
    train_l1: float
    unit: str
    n_train: int
    n_val: int
    seconds: float
    device: str
    epoch_losses: list[float]
    """Mean training loss of each epoch (smooth L1 on the normalised target)."""


UNITS = {"heading": "deg", "distance": "ratio"}


def train(
    recipe: Recipe,
    data: ReferenceDataset | None = None,
    device: str = "cpu",
    progress: Progress | None = None,
    cache_dir: str | Path | None = None,
) -> tuple[NavNet, Report]:
    """Train the NN of ``recipe`` from scratch; deterministic on a given device and torch build."""
    started = time.perf_counter()
    if data is None:
        data = reference_dataset(
            recipe.target, cache_dir=cache_dir, progress=None if progress is None else lambda d, t: progress("data", d, t), **recipe.dataset
        )
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    model = NavNet(recipe.target, recipe.backbone).to(device)
    offset, scale = float(model.out_offset), float(model.out_scale)
    mirror = (lambda y: -y) if recipe.target == "heading" else (lambda y: 1.0 - y)

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        flip = torch.from_numpy(rng.random(len(y)) < 0.5).to(device)
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        y = torch.where(flip, mirror(y), y)
        pred = model(x).reshape(-1)
        return nn.functional.smooth_l1_loss((pred - offset) / scale, (y - offset) / scale, beta=0.5)

    losses = training.fit(model, data, recipe, loss, rng, pct_start=0.15, device=device,
                          on_step=None if progress is None else lambda step, total: progress("train", step, total))
    model.eval()
    _, val_l1, train_l1 = training.validate(model, data, recipe.seed, device=device)
    report = Report(
        target=recipe.target,
        backbone=recipe.backbone,
        val_l1=val_l1,
        train_l1=train_l1,
        unit=UNITS[recipe.target],
        n_train=len(data.x_train),
        n_val=len(data.x_val),
        seconds=time.perf_counter() - started,
        device=str(device),
        epoch_losses=[round(v, 5) for v in losses],
    )
    return model.cpu().eval(), report


def load(path: Path, recipe: Recipe) -> NavNet:
    return training.load_weights(NavNet(recipe.target, recipe.backbone), path)


__all__ = ["Progress", "Recipe", "Report", "UNITS", "load", "predict", "save", "train"]
