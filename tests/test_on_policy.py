"""On-policy error data (qaopt.on_policy): each NN's error measured on drives its reference NNs steered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tinyapp
import yaml

from qaopt.app_spec.errors import QaoptError
from qaopt.on_policy import OnPolicyData, target_nns
from qaopt.spec import load_spec

APPS = Path(__file__).resolve().parent / "apps"


def _spec(tmp_path: Path, entry_point: str = "tinyapp:RecordingTinyEvaluator", **error_data):
    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    data["evaluator"]["simulator"]["entry_point"] = entry_point
    data["calibration"]["error_data"] = {"drives": 3, "steps": 12, **error_data}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


def test_a_recording_simulator_gives_on_policy_validation_frames_recorded_once(tmp_path):
    spec = _spec(tmp_path)
    before = tinyapp.RecordingTinyEvaluator.recorded
    targets = target_nns(spec, tmp_path / "cache")
    assert tinyapp.RecordingTinyEvaluator.recorded == before + 1
    a = targets["a"]
    assert isinstance(a.data, OnPolicyData)
    assert len(a.data.x_val) == 3 * 12 and [len(s) for s in a.data.val_sequences] == [12, 12, 12]
    np.testing.assert_array_equal(a.data.x_train, tinyapp.tiny_data("a").x_train)  # training data stays the NN's own
    # truth in the NN's output layout, and the two NNs read the same frames
    assert a.data.y_val.shape == (36, 1)
    assert targets["b"].data.x_val is a.data.x_val
    # recorded once: a second run reads the cache, and the candidates' key sees the new frames
    again = target_nns(spec, tmp_path / "cache", ["a"])
    assert tinyapp.RecordingTinyEvaluator.recorded == before + 1
    np.testing.assert_array_equal(again["a"].data.y_val, a.data.y_val)
    dataset = target_nns(_spec(tmp_path, source="dataset"), tmp_path / "cache", ["a"])["a"]
    assert not isinstance(dataset.data, OnPolicyData)
    assert dataset.fingerprint != again["a"].fingerprint


def test_auto_falls_back_to_the_dataset_when_the_simulator_cannot_record(tmp_path):
    targets = target_nns(_spec(tmp_path, "tinyapp:TinyEvaluator"), tmp_path / "cache")
    assert not isinstance(targets["a"].data, OnPolicyData)


def test_on_policy_asked_of_a_simulator_that_cannot_record_names_the_field_and_the_fix(tmp_path):
    with pytest.raises(QaoptError, match=r"calibration\.error_data\.source is on-policy.*TinyEvaluator.*'dataset'"):
        target_nns(_spec(tmp_path, "tinyapp:TinyEvaluator", source="on-policy"), tmp_path / "cache")


def test_a_broken_recording_is_named(tmp_path, monkeypatch):
    original = tinyapp.RecordingTinyEvaluator.record_perception

    def short(self, nns, seeds, steps):
        rec = original(self, nns, seeds, steps)
        return {n: type(r)(r.inputs, r.truth[:-1], r.sequences) for n, r in rec.items()}

    monkeypatch.setattr(tinyapp.RecordingTinyEvaluator, "record_perception", short)
    with pytest.raises(QaoptError, match=r"record_perception, NN 'a': truth has shape \(35, 1\) for 36 inputs"):
        target_nns(_spec(tmp_path), tmp_path / "cache")


@pytest.mark.parametrize("residuals, reason", [
    ([np.zeros(200)], "all 200 residuals equal 0"),
    ([np.ones(10) * 0.1], "50"),
    ([np.r_[np.full(100, np.nan), np.linspace(0, 1, 100)]], "NaN"),
])
def test_an_error_model_that_cannot_be_fitted_names_the_nn_and_the_reason(tmp_path, residuals, reason):
    from qaopt.calibrate import CalibrationError
    from qaopt.region_calibration import error_models_of

    spec = _spec(tmp_path)
    spec = spec.model_copy(update={"calibration": spec.calibration.model_copy(update={"error_model": "shaped"})})
    with pytest.raises(CalibrationError, match=rf"calibration\.error_model shaped for nns\.a: .*{reason}"):
        error_models_of(spec, {"a": residuals, "b": residuals}, tmp_path / "cache")


def test_float_frames_of_8_bit_pixels_are_stored_as_bytes_and_read_back_bit_for_bit(tmp_path):
    """A third-party pixel application handed its NNs float32 frames made from the camera's bytes; its recordings
    were stored at four times their size."""
    import pickle

    from qaopt.calibrate import Recording
    from qaopt.on_policy import _packed, _unpacked

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (64, 3, 24, 32), dtype=np.uint8)
    truth = rng.normal(size=(64, 1))
    seqs = (np.arange(32), np.arange(32, 64))
    for frames in (pixels.astype(np.float32) / 255, (pixels / 255.0).astype(np.float32), pixels.astype(np.float32)):
        camera = Recording(frames, truth, seqs)
        recordings = {"heading": camera, "distance": Recording(frames, truth[:, ::-1], seqs)}  # one camera, two NNs
        plain, packed = pickle.dumps(recordings), pickle.dumps(_packed(recordings))
        assert len(packed) <= len(plain) / 3.5
        back = _unpacked(pickle.loads(packed))
        assert back["heading"].inputs is back["distance"].inputs  # still one camera
        assert back["heading"].inputs.dtype == frames.dtype and np.array_equal(back["heading"].inputs, frames)
        assert np.array_equal(back["distance"].truth, recordings["distance"].truth)
    noisy = Recording(pixels.astype(np.float32) / 255 + 1e-3, truth, seqs)  # not 8-bit: stored as it is
    assert _packed({"heading": noisy})["heading"].inputs is noisy.inputs
