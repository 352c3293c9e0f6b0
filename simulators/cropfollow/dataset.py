"""Labelled camera frames for CropFollow's two perception NNs.

Training frames come from many fields, poses and looks (lateral offset and
heading drawn over and beyond what a running robot meets, a random look per
frame). Validation frames are drives: each sequence follows one robot for a few
seconds through an unseen field, steered by noisy perception so it wanders, so
an NN's residuals on it keep the time structure an error model needs.

Frames are stored as uint8 shards (``.npy``) under a content hash of everything
that determines them, written shard by shard so a killed generation resumes, and
read back memory-mapped; ``x_train[i]`` converts to float32 on access, so a few
thousand frames never take gigabytes of memory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.store import atomic_path, cache_root

from .config import NN_NAMES, SimConfig, check_nn
from .errors import CropFollowParamError
from .evaluator import Batch, FrameSource, run_batch
from ..frames import FrameArray
from .field import Field
from .render import Renderer, Scene, draw_style

GENERATOR_VERSION = 1
"""Bump when the renderer or the sampling changes what a given seed produces."""
SHARD_FRAMES = 250


def default_cache_dir() -> Path:
    """The cache root when no folder is given (:func:`qaopt.app_spec.store.cache_root`)."""
    return cache_root()


@dataclass
class ReferenceDataset:
    """Frames and labels of one target: ``x_*`` float32 (N, 3, 240, 320), ``y_*`` float32 (N, 1)."""

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
        """Content hash of the recipe and target: identifies the data without hashing 0.8 GB of frames."""
        return content_hash(self.meta, self.target)


def _pose_grid(rng: np.random.Generator, n: int, config: SimConfig) -> np.ndarray:
    """(n, 3): arc position, lateral offset (m), heading (rad) of training frames."""
    clearance = config.field.row_spacing_m / 2 - config.field.stalk_radius_m - config.robot.body_width_m / 2
    lateral = rng.uniform(-1.25, 1.25, n) * clearance
    heading = np.where(rng.random(n) < 0.7, rng.normal(0, 10.0, n), rng.uniform(-35.0, 35.0, n))
    s = rng.uniform(0.0, config.run_length_m, n)
    return np.stack([s, lateral, np.radians(np.clip(heading, -40.0, 40.0))], axis=1)


def _train_shard(config: SimConfig, seed: int, shard: int, n: int, fields_per_shard: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 0x7EA1, shard])
    renderer = Renderer(config.camera, config.field)
    images = np.empty((n, config.camera.height_px, config.camera.width_px, 3), dtype=np.uint8)
    labels = np.empty((n, 2), dtype=np.float32)
    poses = _pose_grid(rng, n, config)
    scenes = [Scene.build(Field.from_seed(config.field, int(rng.integers(2**31))), config.run_length_m) for _ in range(fields_per_shard)]
    for i, (s, lateral, heading) in enumerate(poses):
        renderer.render(scenes[i % fields_per_shard], s, lateral, heading, draw_style(rng), frame=i, out=images[i])
        labels[i] = math.degrees(heading), 0.5 - lateral / config.field.row_spacing_m
    return images, labels


def _val_drives(config: SimConfig, seed: int, n_drives: int, frames: int) -> tuple[np.ndarray, np.ndarray]:
    """``n_drives`` drives of ``frames`` perception steps each, in unseen fields.

    The controller is fed ground truth plus AR(1) errors (correlation 0.9 per step,
    12 deg and 0.12 ratio stationary spread), so the robot wanders over the poses a
    running robot meets and consecutive frames are what a real NN sees in sequence.
    """
    drive_seeds = [10**6 + 10**4 * seed + d for d in range(n_drives)]
    rng = np.random.default_rng([seed, 0xD21FE])
    camera = FrameSource(config, drive_seeds)
    images = np.empty((n_drives, frames, config.camera.height_px, config.camera.width_px, 3), dtype=np.uint8)
    labels = np.empty((n_drives, frames, 2), dtype=np.float32)
    error = np.zeros((2, n_drives))
    spread = np.array([[12.0], [0.12]])
    everyone = np.arange(n_drives)

    def estimate(step: int, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        images[:, step] = camera.frames_uint8(batch, everyone, step)
        labels[:, step] = batch.truth.T
        error[:] = 0.9 * error + math.sqrt(1 - 0.81) * spread * rng.standard_normal(error.shape)
        est = batch.truth + error
        return est[0], est[1]

    run_batch(config, drive_seeds, estimate, max_steps=frames)
    return images.reshape(-1, *images.shape[2:]), labels.reshape(-1, 2)


def dataset_recipe(n_train: int = 3000, val_drives: int = 16, val_frames_per_drive: int = 40, seed: int = 0, **params: Any) -> dict[str, Any]:
    """Everything that determines the frames (its content hash names them on disk)."""
    for name, value, low in (("n_train", n_train, 1), ("val_drives", val_drives, 1), ("val_frames_per_drive", val_frames_per_drive, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise CropFollowParamError(name, f"{value!r} must be an integer >= {low}")
    return {
        "version": GENERATOR_VERSION,
        "n_train": int(n_train),
        "val_drives": int(val_drives),
        "val_frames_per_drive": int(val_frames_per_drive),
        "seed": int(seed),
        "config": SimConfig.from_params(**params).to_dict(),
    }


def reference_dataset(
    target: str = "heading",
    cache_dir: str | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    **recipe: Any,
) -> ReferenceDataset:
    """The labelled frames of ``target`` ("heading": degrees, "distance": d_left/(d_left+d_right)).

    ``recipe``: ``n_train`` (3000), ``val_drives`` (16), ``val_frames_per_drive`` (40),
    ``seed`` (0) and simulator params (``field``, ``camera``, ... as for
    :class:`CropFollowEvaluator`). Deterministic for a given recipe; generated once
    (about 6 ms a frame) and cached under ``cache_dir/cropfollow/dataset/<hash>``.
    ``progress``, if given, is called as ``progress(done_frames, total_frames)``.
    Both targets share the frames.
    """
    check_nn(target)
    recipe = dataset_recipe(**recipe)
    config = SimConfig.from_params(**_sim_params(recipe["config"]))
    n_train, val_drives, val_frames_per_drive, seed = (recipe[k] for k in ("n_train", "val_drives", "val_frames_per_drive", "seed"))
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "cropfollow" / "dataset" / content_hash(recipe)
    path.mkdir(parents=True, exist_ok=True)
    (path / "recipe.json").write_text(json.dumps(recipe, indent=1, default=str))
    n_shards = -(-n_train // SHARD_FRAMES)
    total = n_train + val_drives * val_frames_per_drive
    done = 0
    for k in range(n_shards):
        n = min(SHARD_FRAMES, n_train - k * SHARD_FRAMES)
        images_file, labels_file = path / f"train-{k:04d}.npy", path / f"train-{k:04d}-labels.npy"
        if not labels_file.exists():
            images, labels = _train_shard(config, seed, k, n, fields_per_shard=10)
            _save(images_file, images)
            _save(labels_file, labels)
        done += n
        if progress is not None:
            progress(done, total)
    if not (path / "val-labels.npy").exists():
        images, labels = _val_drives(config, seed, val_drives, val_frames_per_drive)
        _save(path / "val.npy", images)
        _save(path / "val-labels.npy", labels)
    if progress is not None:
        progress(total, total)
    column = NN_NAMES.index(target)
    train_labels = np.concatenate([np.load(path / f"train-{k:04d}-labels.npy") for k in range(n_shards)])
    val_labels = np.load(path / "val-labels.npy")
    return ReferenceDataset(
        target=target,
        x_train=FrameArray([np.load(path / f"train-{k:04d}.npy", mmap_mode="r") for k in range(n_shards)]),
        y_train=np.ascontiguousarray(train_labels[:, column : column + 1]),
        x_val=FrameArray([np.load(path / "val.npy", mmap_mode="r")]),
        y_val=np.ascontiguousarray(val_labels[:, column : column + 1]),
        val_sequences=[np.arange(d * val_frames_per_drive, (d + 1) * val_frames_per_drive) for d in range(val_drives)],
        path=path,
        meta=recipe,
    )


def _sim_params(config: dict[str, Any]) -> dict[str, Any]:
    """SimConfig.to_dict() back into the keyword form SimConfig.from_params takes."""
    params = dict(config)
    control = params.pop("control")
    params["controller"] = control.pop("kind")
    params["controller_params"] = control
    return params


def _save(path: Path, array: np.ndarray) -> None:
    """Write atomically, so a killed run never leaves a half shard that looks finished."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array)
