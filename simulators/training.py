"""Training of an application's reference perception NNs: the loop, the validation errors, the stored weights.

Both example applications train their NNs the same way (AdamW with one-cycle
learning-rate decay over shuffled batches of a :class:`~.dataset_store.ReferenceDataset`,
uint8 frames held on the device and converted a batch at a time) and store them the same
way; what differs (the model, the loss, the augmentation, the schedule's warm-up) each
application passes in. Imports torch: only an application's ``train`` module imports this.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from qaopt.app_spec import store

from .dataset_store import ReferenceDataset
from .perception import torch_perception


def fit(
    model: nn.Module,
    data: ReferenceDataset,
    recipe: Any,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    rng: np.random.Generator,
    pct_start: float,
    device: str = "cpu",
    channels_last: bool = False,
    on_step: Callable[[int, int], None] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``model`` in place on ``data``'s training frames; return each epoch's mean loss.

    ``recipe`` gives ``epochs``, ``batch_size``, ``lr`` and ``weight_decay``; ``rng`` shuffles
    (and may augment, inside ``loss``). ``loss(x, y)`` takes a batch of float32 frames
    (B, 3, H, W) in [0, 1] and their labels (B,). ``on_step(step, total)`` follows each
    optimiser step, ``on_epoch(epoch, loss)`` each epoch.
    """
    n = len(data.x_train)
    steps_per_epoch = math.ceil(n / recipe.batch_size)
    total = recipe.epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=recipe.lr, total_steps=total, pct_start=pct_start)
    # The uint8 frames fit in memory (0.23 MB at most); converting a batch on the device is cheap.
    images = torch.from_numpy(data.x_train.uint8(slice(None))).to(device)
    y_all = torch.from_numpy(data.y_train.reshape(-1).astype(np.float32)).to(device)
    losses: list[float] = []
    step = 0
    for epoch in range(recipe.epochs):
        model.train()
        epoch_loss = 0.0
        for idx in np.array_split(rng.permutation(n), steps_per_epoch):
            idx_t = torch.from_numpy(idx).to(device)
            x = images[idx_t].permute(0, 3, 1, 2).float().div_(255.0)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            value = loss(x, y_all[idx_t])
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
            schedule.step()
            step += 1
            epoch_loss += float(value.detach()) / steps_per_epoch
            if on_step is not None:
                on_step(step, total)
        losses.append(epoch_loss)
        if on_epoch is not None:
            on_epoch(epoch, epoch_loss)
    return losses


def predict(model: nn.Module, images: Any, batch_size: int = 64, device: str = "cpu") -> np.ndarray:
    """(N,) predictions of ``model`` on a float32 image array or :class:`~.frames.FrameArray`."""
    perceive = torch_perception(model, device, batch_size)
    out = [perceive(np.asarray(images[i : i + batch_size])) for i in range(0, len(images), batch_size)]
    return np.concatenate(out) if out else np.empty(0, dtype=np.float32)


def validate(model: nn.Module, data: ReferenceDataset, seed: int, device: str = "cpu") -> tuple[np.ndarray, float, float]:
    """Validation predictions, validation L1 and training L1 (on 500 frames drawn with ``seed``)."""
    n = len(data.x_train)
    val_pred = predict(model, data.x_val, device=device)
    sub = np.sort(np.random.default_rng(seed).choice(n, min(n, 500), replace=False))
    train_pred = predict(model, data.x_train[sub], device=device)
    val_l1 = float(np.mean(np.abs(val_pred - data.y_val.reshape(-1))))
    return val_pred, val_l1, float(np.mean(np.abs(train_pred - data.y_train[sub].reshape(-1))))


def save(model: nn.Module, recipe: Any, report: Any, path: Path) -> None:
    """Weights as ``<path>.pt`` and recipe + report as ``<path>.json`` (written last: it marks completion)."""
    with store.atomic_path(path.with_suffix(".pt")) as tmp:
        torch.save(model.state_dict(), tmp)
    meta = {"key": recipe.key(), "recipe": asdict(recipe), "report": asdict(report), "torch": torch.__version__}
    store.write_text(path.with_suffix(".json"), json.dumps(meta, indent=1) + "\n")


def load_weights(model: nn.Module, path: Path) -> nn.Module:
    """``model`` with the weights stored at ``<path>.pt``, in eval mode."""
    model.load_state_dict(torch.load(path.with_suffix(".pt"), map_location="cpu", weights_only=True))
    return model.eval()
