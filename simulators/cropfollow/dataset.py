"""Labelled camera frames for CropFollow's two perception NNs.

Training frames come from many fields, poses and looks (lateral offset and
heading drawn over and beyond what a running robot meets, a random look per
frame). Validation frames are drives: each sequence follows one robot for a few
seconds through an unseen field, steered by noisy perception so it wanders, so
an NN's residuals on it keep the time structure an error model needs.

Frames are cached by :mod:`qaopt.simulators.dataset_store` under a content hash
of everything that determines them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import dataset_store
from ..dataset_store import ReferenceDataset
from .config import NN_NAMES, RULES, SimConfig, check_nn
from .evaluator import Batch, FrameSource, ar1_step, run_batch
from .field import Field
from .render import Renderer, Scene, draw_style

GENERATOR_VERSION = 1
"""Bump when the renderer or the sampling changes what a given seed produces."""
SHARD_FRAMES = 250


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
    innovation = math.sqrt(1 - 0.81) * np.array([[12.0], [0.12]])
    everyone = np.arange(n_drives)

    def estimate(step: int, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        images[:, step] = camera.frames_uint8(batch, everyone, step)
        labels[:, step] = batch.truth.T
        ar1_step(error, 0.9, innovation, rng)
        est = batch.truth + error
        return est[0], est[1]

    run_batch(config, drive_seeds, estimate, max_steps=frames)
    return images.reshape(-1, *images.shape[2:]), labels.reshape(-1, 2)


def dataset_recipe(n_train: int = 3000, val_drives: int = 16, val_frames_per_drive: int = 40, seed: int = 0, **params: Any) -> dict[str, Any]:
    """Everything that determines the frames (its content hash names them on disk)."""
    return dataset_store.dataset_recipe(RULES, GENERATOR_VERSION, lambda: SimConfig.from_params(**params).to_dict(),
                                        n_train, val_drives, val_frames_per_drive, seed)


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
    seed = recipe["seed"]
    return dataset_store.cached_dataset(
        "cropfollow", NN_NAMES.index(target), target, recipe, SHARD_FRAMES,
        lambda k, n: _train_shard(config, seed, k, n, fields_per_shard=10),
        lambda: _val_drives(config, seed, recipe["val_drives"], recipe["val_frames_per_drive"]),
        cache_dir, progress,
    )


def _sim_params(config: dict[str, Any]) -> dict[str, Any]:
    """SimConfig.to_dict() back into the keyword form SimConfig.from_params takes."""
    params = dict(config)
    control = params.pop("control")
    params["controller"] = control.pop("kind")
    params["controller_params"] = control
    return params

