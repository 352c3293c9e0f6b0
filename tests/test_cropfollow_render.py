"""The camera: projection geometry, determinism, and what changes a frame."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qaopt.simulators.cropfollow.config import SimConfig
from qaopt.simulators.cropfollow.field import Field
from qaopt.simulators.cropfollow.render import Pose, Renderer, Scene, _project, draw_style


@pytest.fixture(scope="module")
def setup():
    config = SimConfig()
    renderer = Renderer(config.camera, config.field)
    scene = Scene.build(Field.from_seed(config.field, 2), 20.0)
    style = draw_style(np.random.default_rng(0))
    return config, renderer, scene, style


def test_projection_of_known_points(setup):
    config, *_ = setup
    cam = config.camera
    pitch = math.radians(cam.pitch_down_deg)
    pose = Pose(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    # The ground point on the optical axis lands at the image centre ...
    d = cam.mount_height_m / math.tan(pitch)
    u, v, depth = _project(pose, cam.focal_px, cam.mount_height_m, pitch, cam.width_px, cam.height_px, d, 0.0, 0.0)
    assert (u, v) == pytest.approx((cam.width_px / 2, cam.height_px / 2), abs=1e-6)
    assert depth == pytest.approx(math.hypot(d, cam.mount_height_m))
    # ... a point to the left lands left of centre, one behind the camera is not drawn.
    u, _, _ = _project(pose, cam.focal_px, cam.mount_height_m, pitch, cam.width_px, cam.height_px, d, 0.3, 0.0)
    assert u < cam.width_px / 2
    assert _project(pose, cam.focal_px, cam.mount_height_m, pitch, cam.width_px, cam.height_px, -1.0, 0.0, 0.0)[2] <= 0


def test_frames_are_deterministic_and_depend_on_pose(setup):
    config, renderer, scene, style = setup
    a = renderer.render(scene, 3.0, 0.0, 0.0, style)
    assert a.shape == (240, 320, 3) and a.dtype == np.uint8
    assert np.array_equal(a, renderer.render(scene, 3.0, 0.0, 0.0, style))
    left = renderer.render(scene, 3.0, 0.12, 0.0, style).astype(float)
    turned = renderer.render(scene, 3.0, 0.0, math.radians(15), style).astype(float)
    assert np.abs(left - a).mean() > 5 and np.abs(turned - a).mean() > 5
    assert a.std() > 10  # textured, not flat


def test_plants_occlude_by_depth(setup):
    """Moving toward the left row fills more of the left half of the image with plants (greenish)."""
    config, renderer, scene, style = setup

    def green_share(img: np.ndarray, half: slice) -> float:
        px = img[:, half].astype(float)
        return float(np.mean(px[..., 1] > px[..., 0] * 1.05))

    centred = renderer.render(scene, 6.0, 0.0, 0.0, style)
    near_left = renderer.render(scene, 6.0, 0.15, 0.0, style)
    assert green_share(near_left, slice(0, 160)) > green_share(centred, slice(0, 160))
