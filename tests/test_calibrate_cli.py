"""``qaopt calibrate SPEC``: region.json + region.png, resumption, one-line errors, and the real CropFollow.

The small synthetic spec (``spec_file``) is in ``conftest.py``, shared with ``test_calibrate_plot.py``.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from qaopt.app_spec import load
from qaopt.calibrate import ErrorRegion, Verdict
from qaopt.region_calibration import build_calibration, calibrate_spec
from qaopt.cli import app, main

def test_calibrate_writes_region_and_resumes(spec_file, tmp_path):
    spec, out = spec_file(), tmp_path / "out"
    first = CliRunner().invoke(app, ["calibrate", str(spec), "--out", str(out)])
    assert first.exit_code == 0, first.output
    assert "6 evaluations" in first.output
    region = ErrorRegion.load(out / "region.json")
    assert region.evaluations == 6 and region.info["strategy"] == "monotone"
    assert (out / "region.png").read_bytes()[:4] == b"\x89PNG"
    assert region.contains({"heading": 0.5, "distance": 0.005})
    cached = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*.json")}

    again = CliRunner().invoke(app, ["calibrate", str(spec), "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*.json")} == cached  # nothing re-run
    assert json.loads((out / "region.json").read_text())["observations"] == \
        [o.to_json() for o in region.observations]

    other = CliRunner().invoke(app, ["calibrate", str(spec), "--out", str(out), "--strategy", "bisect", "--budget", "4"])
    assert other.exit_code == 0, other.output
    assert ErrorRegion.load(out / "region.json").info["strategy"] == "bisect"


@pytest.mark.parametrize("args,message", [
    (["--budget", "0"], "error: calibration.budget: 0 evaluations; give at least 1"),
    (["--strategy", "grid"], "error: calibration.strategy: no region strategy named 'grid'; registered: bisect, "
                              "monotone, active, boundary"),
])
def test_bad_options_are_one_line_errors(spec_file, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        main(["calibrate", str(spec_file()), "--out", str(tmp_path / "out"), *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1


def test_an_nn_the_simulator_lacks_is_named(spec_file, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["calibrate", str(spec_file("{heading: 10.0}")), "--out", str(tmp_path / "out")])
    assert "NN 'distance' is not one of the evaluator's NNs (heading)" in capsys.readouterr().err


def test_real_cropfollow_calibrates(example_spec_path, tmp_path, monkeypatch):
    """Two evaluations of the shipped spec with the real simulator: a clear valid and a clear invalid point."""
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    spec = load(example_spec_path)
    cal = build_calibration(spec)
    assert cal.evaluate({"heading": 30.0, "distance": 0.25}).verdict is Verdict.INVALID
    region, folder = calibrate_spec(spec, "bisect", 2, tmp_path / "out", calibration=cal)
    verdicts = [o.verdict for o in region.observations]
    assert verdicts[0] is Verdict.VALID  # the reference point (no error) comes first
    assert verdicts[1] is Verdict.INVALID  # the box centre fails often
    assert (folder / "region.json").exists() and (folder / "region.png").exists()
    assert region.info["app"] == "cropfollow"


def test_spec_error_models_reach_the_injectors(spec_file):
    import numpy as np

    text = spec_file().read_text()
    for model, expect in [("ar1", "ar1"), ("empirical", "empirical")]:
        path = spec_file()
        path.write_text(text.replace("strategy: monotone", f"strategy: monotone\n  error_model: {model}"))
        rng = np.random.default_rng(0)
        residuals = {nn: [rng.standard_normal(200).cumsum() * 0.01 for _ in range(3)] for nn in ("heading", "distance")}
        cal = build_calibration(load(path), residuals=residuals)
        assert {nn: m.config()["model"] for nn, m in cal.models.items()} == {"heading": expect, "distance": expect}
        assert cal.evaluate({"heading": 0.1, "distance": 0.001}).verdict is Verdict.VALID
        assert cal.evaluate({"heading": 14.0, "distance": 0.14}).verdict is Verdict.INVALID
