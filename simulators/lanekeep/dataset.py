"""Labelled camera frames for LaneKeep's three perception NNs.

Training frames are poses drawn over many routes and looks, chosen so that each NN
sees what it must tell apart: the car off-centre and turned (lateral offset and
heading error over and beyond what a running car meets), stop lines from behind
the car to well past the detection range (about 40 % of the frames within it, and
many just beyond it, where the decision is made), and a lead vehicle at every
distance from touching to past the clipping distance on about half the frames.
Validation frames are drives: each follows one car for a few seconds through an
unseen route, toward a stop line or behind the lead vehicle, steered by a driver
whose lane estimate carries AR(1) errors so it wanders, so an NN's residuals on it
keep the time structure an error model needs.

Frames are cached by :mod:`qaopt.simulators.dataset_store` under a content hash
of everything that determines them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import dataset_store
from ..dataset_store import ReferenceDataset
from . import dynamics as dyn
from .config import NN_NAMES, RULES, SimConfig, check_nn
from .evaluator import Batch, FrameSource
from .render import Renderer, Scene, draw_style
from .world import LEAD_END, LEAD_START, Route

GENERATOR_VERSION = 1
"""Bump when the renderer or the sampling changes what a given seed produces."""
SHARD_FRAMES = 500


def _labels(config: SimConfig, route: Route, s: float, ey: float, epsi: float, lead_s: float) -> np.ndarray:
    """The three NNs' truth for a pose (the kernels' own definition, so labels match the closed loop)."""
    phys = dyn.physics(config)
    st = np.zeros((1, dyn.N_STATE))
    st[0, dyn.S], st[0, dyn.EY], st[0, dyn.EPSI] = s, ey, epsi
    front = s + phys.half_length
    st[0, dyn.NEXT_LINE] = float(np.sum(route.stops < front))
    if math.isfinite(lead_s):
        st[0, dyn.LEAD_STATE], st[0, dyn.LEAD_S] = 1.0, lead_s
    truth = np.empty((3, 1))
    dyn.observe(st, route.curvature[None], route.stops[None], phys, truth)
    return truth[:, 0]


def _train_shard(config: SimConfig, seed: int, shard: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 0x7EA1, shard])
    renderer = Renderer(config)
    cam = config.camera
    images = np.empty((n, cam.height_px, cam.width_px, 3), dtype=np.uint8)
    labels = np.empty((n, 3), dtype=np.float32)
    half = config.car.length_m / 2
    rng_max = config.stack.detect_range_m
    lane_room = config.road.lane_width_m / 2 - config.car.width_m / 2
    scenes: list[Scene] = []
    for i in range(n):
        if i % 25 == 0:
            road = config.road
            route = Route.from_seed(road, config.route_m, int(rng.integers(2**31)))
            if route.n_stops == 0:
                route = Route(route.seed, route.curvature, np.array([config.route_m * 0.6, np.inf]), route.lead)
            scenes = [Scene.build(route, config)]
        route = scenes[0].route
        line = route.stops[int(rng.integers(route.n_stops))]
        u = rng.random()
        if u < 0.4:
            dist = rng.uniform(-0.4, rng_max)  # within the detection range
        elif u < 0.65:
            dist = rng.uniform(rng_max, rng_max + 20.0)  # just beyond it
        else:
            dist = rng.uniform(-30.0, 120.0)
        s = min(max(line - dist - half, 0.0), config.route_m)
        ey = float(np.clip(rng.normal(0.0, 0.45), -1.3, 1.3)) * (lane_room / 0.85)
        epsi = math.radians(float(np.clip(rng.normal(0.0, 3.0), -10.0, 10.0)))
        lead_s = s + half + rng.uniform(0.2, config.stack.lead_max_m + 8.0) if rng.random() < 0.5 else math.nan
        renderer.draw(scenes[0], s, ey, epsi, lead_s, draw_style(rng), frame=i, out=images[i])
        labels[i] = _labels(config, route, s, ey, epsi, lead_s)
    return images, labels


def _val_drives(config: SimConfig, seed: int, n_drives: int, frames: int) -> tuple[np.ndarray, np.ndarray]:
    """``n_drives`` closed-loop drives of ``frames`` perception steps on unseen routes.

    Even drives start 45-70 m before a stop line, odd ones where the lead vehicle
    turns in; the driver's lane estimate carries AR(1) errors (correlation 0.9 per
    step, 0.3 m stationary spread), the other NNs are perfect.
    """
    drive_seeds = [10**6 + 10**4 * seed + d for d in range(n_drives)]
    rng = np.random.default_rng([seed, 0xD21FE])
    batch = Batch.start(config, drive_seeds, twins=False)
    phys = dyn.physics(config)
    for d, route in enumerate(batch.routes):
        if d % 2 == 0 and route.n_stops:
            batch.state[d, dyn.S] = max(route.stops[0] - rng.uniform(45.0, 70.0), 0.0)
            batch.lead[d, LEAD_END] = batch.lead[d, LEAD_START]
        elif route.has_lead:
            start = rng.uniform(route.lead[LEAD_START], max(route.lead[LEAD_START], route.lead[LEAD_END] - 60.0))
            batch.lead[d, LEAD_START] = start
            batch.state[d, dyn.S] = start
    dyn.start(batch.state, batch.lead, phys)
    dyn.observe(batch.state, batch.curvature, batch.stops, phys, batch.truth)
    camera = FrameSource(config, drive_seeds)
    images = np.empty((n_drives, frames, config.camera.height_px, config.camera.width_px, 3), dtype=np.uint8)
    labels = np.empty((n_drives, frames, 3), dtype=np.float32)
    error = np.zeros(n_drives)
    everyone = np.arange(n_drives)
    for step in range(frames):
        images[:, step] = camera.frames_uint8(batch, everyone, step)
        labels[:, step] = batch.truth.T
        error[:] = 0.9 * error + math.sqrt(1 - 0.81) * 0.3 * rng.standard_normal(n_drives)
        est = batch.truth.copy()
        est[dyn.LANE] += error
        dyn.closed_loop_step(est, batch.state, batch.curvature, batch.stops, batch.lead, batch.keys, phys, batch.truth)
    return images.reshape(-1, *images.shape[2:]), labels.reshape(-1, 3)


def dataset_recipe(n_train: int = 3000, val_drives: int = 12, val_frames_per_drive: int = 40, seed: int = 0, **params: Any) -> dict[str, Any]:
    """Everything that determines the frames (its content hash names them on disk)."""
    return dataset_store.dataset_recipe(RULES, GENERATOR_VERSION, lambda: SimConfig.from_params(**params).to_dict(),
                                        n_train, val_drives, val_frames_per_drive, seed)


def reference_dataset(target: str = "lane", cache_dir: str | Path | None = None, **recipe: Any) -> ReferenceDataset:
    """The labelled frames of ``target`` ("lane": offset m, "stop": 0/1, "lead": distance m).

    ``recipe``: ``n_train`` (3000), ``val_drives`` (12), ``val_frames_per_drive`` (40),
    ``seed`` (0) and simulator params (``road``, ``camera``, ... as for
    :class:`LaneKeepEvaluator`). Deterministic for a given recipe; generated once
    (about 6 ms a frame) and cached under ``cache_dir/lanekeep/dataset/<hash>``. The
    three targets share the frames.
    """
    check_nn(target)
    recipe = dataset_recipe(**recipe)
    config = SimConfig.from_params(**recipe["config"])
    seed = recipe["seed"]
    return dataset_store.cached_dataset(
        "lanekeep", NN_NAMES.index(target), target, recipe, SHARD_FRAMES,
        lambda k, n: _train_shard(config, seed, k, n),
        lambda: _val_drives(config, seed, recipe["val_drives"], recipe["val_frames_per_drive"]),
        cache_dir,
    )
