"""Training of CropFollow's reference perception NNs and their validation report.

A recipe (target, backbone, epochs, batch size, learning rate, seed, dataset
arguments) determines a trained NN; its content hash names the weights on disk.
Training regresses the normalised target with a smooth-L1 loss (AdamW, cosine
learning-rate decay) and mirrors half of each batch left-right, which negates the
heading and turns the distance ratio r into 1 - r: the same geometry seen from
the other side, so the NN cannot lean on one side's look.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from qaopt.app_spec import store
from qaopt.app_spec.hashing import content_hash

from .dataset import ReferenceDataset, dataset_recipe, reference_dataset
from .nets import NavNet
from ..perception import torch_perception

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


def predict(model: nn.Module, images: Any, batch_size: int = 64, device: str = "cpu") -> np.ndarray:
    """(N,) predictions of ``model`` on a float32 image array or :class:`.dataset.FrameArray`."""
    perceive = torch_perception(model, device, batch_size)
    out = [perceive(np.asarray(images[i : i + batch_size])) for i in range(0, len(images), batch_size)]
    return np.concatenate(out) if out else np.empty(0, dtype=np.float32)


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
    n = len(data.x_train)
    steps_per_epoch = math.ceil(n / recipe.batch_size)
    total = recipe.epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=recipe.lr, total_steps=total, pct_start=0.15)
    # The uint8 frames fit in memory (0.23 MB each); converting a batch on the device is cheap.
    images = torch.from_numpy(data.x_train.uint8(slice(None))).to(device)
    y_all = torch.from_numpy(data.y_train.reshape(-1).astype(np.float32)).to(device)
    mirror = (lambda y: -y) if recipe.target == "heading" else (lambda y: 1.0 - y)
    losses: list[float] = []
    step = 0
    for _ in range(recipe.epochs):
        model.train()
        epoch_loss = 0.0
        for idx in np.array_split(rng.permutation(n), steps_per_epoch):
            idx_t = torch.from_numpy(idx).to(device)
            x = images[idx_t].permute(0, 3, 1, 2).float().div_(255.0)
            y = y_all[idx_t]
            flip = torch.from_numpy(rng.random(len(idx)) < 0.5).to(device)
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
            y = torch.where(flip, mirror(y), y)
            pred = model(x).reshape(-1)
            loss = nn.functional.smooth_l1_loss((pred - offset) / scale, (y - offset) / scale, beta=0.5)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            epoch_loss += float(loss.detach()) / steps_per_epoch
            if progress is not None:
                progress("train", step, total)
        losses.append(epoch_loss)
    del images
    model.eval()
    val_pred = predict(model, data.x_val, device=device)
    sub = np.sort(np.random.default_rng(recipe.seed).choice(n, min(n, 500), replace=False))
    train_pred = predict(model, data.x_train[sub], device=device)
    report = Report(
        target=recipe.target,
        backbone=recipe.backbone,
        val_l1=float(np.mean(np.abs(val_pred - data.y_val.reshape(-1)))),
        train_l1=float(np.mean(np.abs(train_pred - data.y_train[sub].reshape(-1)))),
        unit=UNITS[recipe.target],
        n_train=n,
        n_val=len(data.x_val),
        seconds=time.perf_counter() - started,
        device=str(device),
        epoch_losses=[round(v, 5) for v in losses],
    )
    return model.cpu().eval(), report


def save(model: NavNet, recipe: Recipe, report: Report, path: Path) -> None:
    """Weights as ``<path>.pt`` and recipe + report as ``<path>.json`` (written last: it marks completion)."""
    with store.atomic_path(path.with_suffix(".pt")) as tmp:
        torch.save(model.state_dict(), tmp)
    meta = {"key": recipe.key(), "recipe": asdict(recipe), "report": asdict(report), "torch": torch.__version__}
    store.write_text(path.with_suffix(".json"), json.dumps(meta, indent=1) + "\n")


def load(path: Path, recipe: Recipe) -> NavNet:
    model = NavNet(recipe.target, recipe.backbone)
    model.load_state_dict(torch.load(path.with_suffix(".pt"), map_location="cpu", weights_only=True))
    return model.eval()
