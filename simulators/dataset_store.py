"""Labelled camera frames cached on disk: the reference NNs' training and validation data.

An application says how to render a shard of training frames and its validation
drives; this module keeps them as uint8 shards (``.npy``) under a content hash of the
recipe (everything that determines them), written shard by shard and atomically so a
killed generation resumes, and reads them back memory-mapped: ``x_train[i]`` converts
to float32 on access (:class:`~qaopt.simulators.frames.FrameArray`), so a few thousand
frames never take gigabytes of memory.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.store import atomic_path, cache_root

from .frames import FrameArray
from .params import ParamRules

Frames = tuple[np.ndarray, np.ndarray]
"""uint8 images (N, H, W, 3) and float32 labels (N, NNs), one column per NN."""


@dataclass
class ReferenceDataset:
    """Frames and labels of one target: ``x_*`` float32 (N, 3, H, W), ``y_*`` float32 (N, 1)."""

    target: str
    x_train: FrameArray
    y_train: np.ndarray
    x_val: FrameArray
    y_val: np.ndarray
    val_sequences: list[np.ndarray]
    """Index arrays into the validation set, one per drive, in time order."""
    path: Path
    meta: dict[str, Any]
    """The recipe that generated the frames (what their cache key hashes)."""

    @property
    def fingerprint(self) -> str:
        """Content hash of the recipe and target: identifies the data without hashing the frames."""
        return content_hash(self.meta, self.target)


def dataset_recipe(rules: ParamRules, version: int, config: Callable[[], dict[str, Any]], n_train: int, val_drives: int,
                   val_frames_per_drive: int, seed: int) -> dict[str, Any]:
    """Everything that determines the frames (its content hash names them on disk).

    ``config()`` builds the simulator's config as a dict; it is called after the sizes are checked.
    """
    for name, value, low in (("n_train", n_train, 1), ("val_drives", val_drives, 1), ("val_frames_per_drive", val_frames_per_drive, 2)):
        rules.integer(value, name, low)
    return {
        "version": version,
        "n_train": int(n_train),
        "val_drives": int(val_drives),
        "val_frames_per_drive": int(val_frames_per_drive),
        "seed": int(seed),
        "config": config(),
    }


def cached_dataset(
    app: str,
    target_column: int,
    target: str,
    recipe: dict[str, Any],
    shard_frames: int,
    train_shard: Callable[[int, int], Frames],
    val_drives: Callable[[], Frames],
    cache_dir: str | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReferenceDataset:
    """The frames of ``recipe`` under ``cache_dir/<app>/dataset/<hash>``, generating what is missing on one thread
    per core (the renderers draw with the GIL released; each shard and the validation drives draw from their own
    seeds, so the frames do not depend on the order they are drawn in).

    ``train_shard(k, n)`` renders training shard ``k`` of ``n`` frames (every shard holds
    ``shard_frames`` but the last); ``val_drives()`` renders the validation drives, each of
    ``recipe["val_frames_per_drive"]`` frames in time order. ``progress(done, total)`` is
    called as frames are ready.
    """
    n_train, n_drives, frames = recipe["n_train"], recipe["val_drives"], recipe["val_frames_per_drive"]
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    path = root / app / "dataset" / content_hash(recipe)
    path.mkdir(parents=True, exist_ok=True)
    (path / "recipe.json").write_text(json.dumps(recipe, indent=1, default=str))
    n_shards = -(-n_train // shard_frames)
    total = n_train + n_drives * frames
    missing = [k for k in range(n_shards) if not (path / f"train-{k:04d}-labels.npy").exists()]
    done = total - sum(min(shard_frames, n_train - k * shard_frames) for k in missing)
    val_missing = not (path / "val-labels.npy").exists()
    if val_missing:
        done -= n_drives * frames

    def write_shard(k: int) -> int:
        n = min(shard_frames, n_train - k * shard_frames)
        images, labels = train_shard(k, n)
        _save(path / f"train-{k:04d}.npy", images)
        _save(path / f"train-{k:04d}-labels.npy", labels)
        return n

    def write_val() -> int:
        images, labels = val_drives()
        _save(path / "val.npy", images)
        _save(path / "val-labels.npy", labels)
        return n_drives * frames

    jobs = [*([write_val] if val_missing else []), *(functools.partial(write_shard, k) for k in missing)]
    if jobs:
        with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
            for future in as_completed([pool.submit(job) for job in jobs]):
                done += future.result()
                if progress is not None:
                    progress(done, total)
    if progress is not None:
        progress(total, total)
    train_labels = np.concatenate([np.load(path / f"train-{k:04d}-labels.npy") for k in range(n_shards)])
    val_labels = np.load(path / "val-labels.npy")
    return ReferenceDataset(
        target=target,
        x_train=FrameArray([np.load(path / f"train-{k:04d}.npy", mmap_mode="r") for k in range(n_shards)]),
        y_train=np.ascontiguousarray(train_labels[:, target_column : target_column + 1]),
        x_val=FrameArray([np.load(path / "val.npy", mmap_mode="r")]),
        y_val=np.ascontiguousarray(val_labels[:, target_column : target_column + 1]),
        val_sequences=[np.arange(d * frames, (d + 1) * frames) for d in range(n_drives)],
        path=path,
        meta=recipe,
    )


def _save(path: Path, array: np.ndarray) -> None:
    """Write atomically, so a killed run never leaves a half shard that looks finished."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array)
