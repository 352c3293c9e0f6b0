"""LaneKeep's reference NNs: the committed weights load (no training here) and drive the loop."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from qaopt.simulators.lanekeep import LaneKeepEvaluator, LaneKeepParamError, reference_nn, reference_report, torch_perception  # noqa: E402
from qaopt.simulators.lanekeep.nets import LaneKeepNet, macs  # noqa: E402
from qaopt.simulators.lanekeep.reference import PACKAGE_WEIGHTS, weights_path  # noqa: E402


@pytest.mark.parametrize("target", ["lane", "stop", "lead"])
def test_committed_weights_load_without_training(target, tmp_path):
    assert weights_path(target) == PACKAGE_WEIGHTS / target
    assert (PACKAGE_WEIGHTS / f"{target}.pt").stat().st_size < 1_000_000
    model = reference_nn(target, cache_dir=tmp_path, train_if_missing=False)
    assert isinstance(model, LaneKeepNet) and not model.training
    out = model(torch.rand(2, 3, 120, 160))
    assert out.shape == (2, 1) and torch.isfinite(out).all()
    if target == "stop":
        assert ((out >= 0) & (out <= 1)).all()
    report = reference_report(target)
    assert report["n_train"] > 0 and json.loads((PACKAGE_WEIGHTS / f"{target}.json").read_text())["report"] == report
    assert 5e6 < macs(model) < 4e7


def test_another_recipe_is_not_trained_when_told_not_to(tmp_path):
    with pytest.raises(LaneKeepParamError, match="no trained weights"):
        reference_nn("lane", cache_dir=tmp_path, train_if_missing=False, epochs=1)


def test_reference_nns_drive_a_short_route():
    nns = {t: torch_perception(reference_nn(t, train_if_missing=False)) for t in ("lane", "stop", "lead")}
    app = LaneKeepEvaluator(route_m=110.0)
    records = app.evaluate_perception(nns, [0, 1])
    assert all(r["distance_m"] == 110.0 for r in records)
    assert sum(r["collisions"] + r["lane_departures"] for r in records) == 0
