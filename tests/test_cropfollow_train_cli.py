"""``qaopt train``: trains, stores where reference_nn looks, reports validation errors."""

from __future__ import annotations

from typer.testing import CliRunner

from qaopt.cli import app
from qaopt.simulators.cropfollow import reference_nn, reference_report


def test_train_command_trains_and_reports(tmp_path):
    args = ["--target", "heading", "--epochs", "1", "--train-frames", "8", "--val-drives", "1", "--val-frames", "4", "--threads", "1"]
    result = CliRunner().invoke(app, ["train", *args, "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "compact-heading" in result.output and "val L1" in result.output
    recipe = {"epochs": 1, "dataset": {"n_train": 8, "val_drives": 1, "val_frames_per_drive": 4}}
    report = reference_report("heading", cache_dir=tmp_path, **recipe)
    assert report["n_train"] == 8 and report["n_val"] == 4
    assert reference_nn("heading", cache_dir=tmp_path, train_if_missing=False, **recipe).training is False


def test_train_command_rejects_bad_arguments(tmp_path):
    result = CliRunner().invoke(app, ["train", "--target", "speed", "--cache-dir", str(tmp_path)])
    assert result.exit_code != 0 and "'target'" in str(result.exception)
    result = CliRunner().invoke(app, ["train", "--package", "--epochs", "2", "--cache-dir", str(tmp_path)])
    assert result.exit_code != 0 and "'package'" in str(result.exception)
