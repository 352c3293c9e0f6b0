"""Reference dataset: shapes, labels, drives in time order, caching and determinism."""

from __future__ import annotations

import numpy as np
import pytest

from qaopt.approx.target import same_frames
from qaopt.simulators.cropfollow import CropFollowParamError, reference_dataset
from qaopt.simulators.frames import FrameArray

SMALL = {"n_train": 12, "val_drives": 2, "val_frames_per_drive": 6, "seed": 3}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return reference_dataset("distance", cache_dir=tmp_path_factory.mktemp("cache"), **SMALL)


def test_shapes_and_dtypes(data):
    assert data.x_train.shape == (12, 3, 240, 320) and data.x_val.shape == (12, 3, 240, 320)
    assert data.y_train.shape == (12, 1) and data.y_val.shape == (12, 1)
    assert data.y_train.dtype == np.float32
    x = data.x_train[[1, 4]]
    assert x.dtype == np.float32 and x.shape == (2, 3, 240, 320) and 0.0 <= x.min() and x.max() <= 1.0
    assert data.x_val[3].shape == (3, 240, 320)
    assert np.array_equal(np.asarray(data.x_train)[4], data.x_train[4])


def test_labels_and_drives(data, tmp_path):
    assert 0.0 < data.y_train.min() and data.y_train.max() < 1.0  # d_left / (d_left + d_right)
    assert len(data.val_sequences) == 2
    assert [list(s) for s in data.val_sequences] == [list(range(6)), list(range(6, 12))]
    # A drive changes smoothly: consecutive frames' ratios differ by far less than the spread of training poses.
    steps = np.abs(np.diff(data.y_val[data.val_sequences[0], 0]))
    assert steps.max() < 0.05 < data.y_train.std()
    heading = reference_dataset("heading", cache_dir=data.path.parents[2], **SMALL)
    assert heading.path == data.path  # one set of frames, two label columns
    assert not np.array_equal(heading.y_train, data.y_train)
    assert heading.fingerprint != data.fingerprint
    # ... which the approx layer tells apart from other frames without reading them
    assert same_frames(heading.x_train, data.x_train) and same_frames(heading.x_val, data.x_val)
    assert not same_frames(heading.x_train, data.x_val)
    assert not same_frames(FrameArray([data.x_train.uint8(slice(None))]), data.x_train), "frames in memory: no key"


def test_cached_and_deterministic(data, tmp_path):
    shard = data.path / "train-0000.npy"
    stamp = shard.stat().st_mtime_ns
    again = reference_dataset("distance", cache_dir=data.path.parents[2], **SMALL)
    assert shard.stat().st_mtime_ns == stamp  # reused, not regenerated
    fresh = reference_dataset("distance", cache_dir=tmp_path, **SMALL)
    assert np.array_equal(fresh.x_train.uint8(slice(None)), again.x_train.uint8(slice(None)))
    assert np.array_equal(fresh.y_val, again.y_val)
    other = reference_dataset("distance", cache_dir=tmp_path, **{**SMALL, "seed": 4})
    assert not np.array_equal(other.y_train, fresh.y_train)


def test_bad_arguments(tmp_path):
    with pytest.raises(CropFollowParamError, match="'target'"):
        reference_dataset("speed", cache_dir=tmp_path)
    with pytest.raises(CropFollowParamError, match="'n_train'"):
        reference_dataset("heading", cache_dir=tmp_path, n_train=0)
    with pytest.raises(CropFollowParamError, match="'field.row_spacing_m'"):
        reference_dataset("heading", cache_dir=tmp_path, field={"row_spacing_m": -1.0})
