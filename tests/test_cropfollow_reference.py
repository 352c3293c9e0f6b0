"""The shipped reference NNs: they load without training, read rendered frames, and steer the robot."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from qaopt.simulators.cropfollow import CropFollowEvaluator, reference_nn, reference_report, torch_perception
from qaopt.simulators.cropfollow.config import SimConfig
from qaopt.simulators.frames import to_chw_float
from qaopt.simulators.cropfollow.field import Field
from qaopt.simulators.cropfollow.reference import PACKAGE_WEIGHTS, reference_nn as load_nn, train_reference
from qaopt.simulators.cropfollow.render import Renderer, Scene, draw_style


@pytest.fixture(scope="module")
def nns():
    return {t: reference_nn(t, "compact", train_if_missing=False) for t in ("heading", "distance")}


def test_packaged_weights_are_small_and_reported():
    for target in ("heading", "distance"):
        assert (PACKAGE_WEIGHTS / f"compact-{target}.pt").stat().st_size < 8e6
        report = reference_report(target)
        assert report is not None and report["n_train"] == 3000
    assert reference_report("heading")["val_l1"] < 3.0  # degrees
    assert reference_report("distance")["val_l1"] < 0.06  # ratio


def test_nns_read_the_geometry_of_fresh_frames(nns):
    """Frames of an unseen field at known poses: the NNs' errors are small."""
    config = SimConfig()
    renderer = Renderer(config.camera, config.field)
    scene = Scene.build(Field.from_seed(config.field, 987654), 40.0)
    rng = np.random.default_rng(1)
    poses = [(float(s), float(lat), float(hd)) for s, lat, hd in zip(np.linspace(2, 35, 12), rng.uniform(-0.15, 0.15, 12), rng.uniform(-20, 20, 12))]
    frames = np.stack([renderer.render(scene, s, lat, math.radians(hd), draw_style(rng)) for s, lat, hd in poses])
    images = to_chw_float(frames)
    heading = torch_perception(nns["heading"])(images)
    distance = torch_perception(nns["distance"])(images)
    true_heading = np.array([hd for _, _, hd in poses])
    true_distance = np.array([0.5 - lat / config.field.row_spacing_m for _, lat, _ in poses])
    assert heading.shape == (12,)
    assert np.mean(np.abs(heading - true_heading)) < 4.0
    assert np.mean(np.abs(distance - true_distance)) < 0.08
    assert np.corrcoef(heading, true_heading)[0, 1] > 0.9 and np.corrcoef(distance, true_distance)[0, 1] > 0.8


def test_perception_in_the_loop(nns):
    evaluator = CropFollowEvaluator(run_length_m=8.0)
    good = evaluator.evaluate_perception({n: torch_perception(m) for n, m in nns.items()}, [0, 1])
    assert all(r["collisions"] == 0 and r["distance_m"] == 8.0 for r in good)
    # An NN that always reports a 25 deg heading drives the robot into the row.
    stuck = evaluator.evaluate_perception({"heading": lambda images: np.full(len(images), 25.0)}, [0])
    assert stuck[0]["collisions"] > 0


def test_train_reference_stores_weights_reference_nn_loads(tmp_path):
    torch.manual_seed(0)
    recipe = {"epochs": 1, "batch_size": 4, "dataset": {"n_train": 8, "val_drives": 1, "val_frames_per_drive": 4}}
    report = train_reference("distance", cache_dir=tmp_path, **recipe)
    assert report.n_train == 8 and report.n_val == 4 and report.val_l1 >= 0
    stored = list((tmp_path / "cropfollow" / "weights").glob("compact-distance-*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["report"]["val_l1"] == report.val_l1
    model = load_nn("distance", cache_dir=tmp_path, train_if_missing=False, **recipe)
    assert model(torch.rand(1, 3, 240, 320)).shape == (1, 1)
    with pytest.raises(Exception, match="qaopt train"):
        load_nn("distance", cache_dir=tmp_path, train_if_missing=False, epochs=2)
