"""docs/tutorial.md, followed step by step on its application (tests/tutorial_app), so the tutorial cannot rot.

The tutorial's code listings must be the files of tests/tutorial_app, verbatim; its steps
(check_application, `qaopt validate`, `qaopt calibrate`, `qaopt optimize --profile quick`)
run in a copy of that folder, as a user runs them in theirs; and the three broken variants of
tests/tutorial_app/broken.py are caught by check_application and by `qaopt validate` with the
messages its troubleshooting section shows, as are section 8's merge group and resolution
scales that the drone's NNs cannot take.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "docs" / "tutorial.md"
APP = REPO / "tests" / "tutorial_app"
FILES = ("drone.py", "app.yaml", "broken.py")
LISTING = re.compile(r"<!-- listing: tests/tutorial_app/(?P<file>[\w.]+) -->\n```\w*\n(?P<code>.*?)```\n", re.S)


def _qaopt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A qaopt command in ``cwd``, as the tutorial types it (one worker: the test machine has 2 cores)."""
    return subprocess.run([str(Path(sys.executable).parent / "qaopt"), *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "QAOPT_WORKERS": "1"}, timeout=300)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The user's folder: the tutorial's files, nothing else (the NNs train on first use)."""
    folder = tmp_path_factory.mktemp("drone")
    for name in FILES:
        shutil.copy(APP / name, folder / name)
    return folder


def test_listings_are_the_tutorial_app():
    text = TUTORIAL.read_text()
    listings: dict[str, str] = {}
    for m in LISTING.finditer(text):
        listings[m["file"]] = listings.get(m["file"], "") + m["code"]
    assert set(listings) == {"drone.py", "app.yaml"}, sorted(listings)
    for name, code in listings.items():
        assert code == (APP / name).read_text(), f"docs/tutorial.md's listings of {name} differ from tests/tutorial_app/{name}"


def test_check_application_passes(folder, monkeypatch):
    monkeypatch.syspath_prepend(str(folder))
    import qaopt
    from qaopt.app_spec import load

    from drone import Drone

    qaopt.check_application(Drone(), load(folder / "app.yaml"))
    qaopt.check_application(Drone(), metric="max_deviation_m", closed_loop=False)


def test_validate_calibrate_optimize(folder):
    """The tutorial's commands, in its order, in the user's folder."""
    validate = _qaopt("validate", "app.yaml", cwd=folder)
    assert validate.returncode == 0, validate.stderr
    # After the line that says it is still loading the NNs, when that takes over SLOW_LOAD_S (a slow machine).
    assert re.search(r"^app\.yaml: ok — app 'drone-altitude', NNs altitude, gust", validate.stdout, re.M), validate.stdout
    assert "simulator Drone keeps the application protocol; each NN runs a sample of its data" in validate.stdout

    calibrate = _qaopt("calibrate", "app.yaml", cwd=folder)
    assert calibrate.returncode == 0, calibrate.stderr
    assert "certified (pooled):" in calibrate.stdout
    region = json.loads((folder / "runs" / "region.json").read_text())
    assert (folder / "runs" / "region.png").stat().st_size > 0
    assert "altitude" in json.dumps(region) and "gust" in json.dumps(region)

    optimize = _qaopt("optimize", "app.yaml", "--profile", "quick", "--quiet", cwd=folder)
    assert optimize.returncode == 0, optimize.stderr
    run = folder / "runs"
    result = json.loads((run / "result.json").read_text())
    assert result["app"] == "drone-altitude" and result["profile"] == "quick"
    assert "reusing region.json" in result["region_note"]  # the region of `qaopt calibrate`, as the tutorial says
    assert {"aware", "agnostic", "reference", "validations", "speedups"} <= set(result)
    assert (run / "report.md").read_text().startswith("# qaopt report: drone-altitude")
    for name in ("report.md", "pareto.png", "region.png", "study.db"):
        assert (run / name).is_file(), name
    for nn in ("altitude", "gust"):
        for name in ("module.pt", "state_dict.pt", "model.onnx"):
            assert (run / "artifacts" / nn / name).is_file(), (nn, name)


BROKEN = {  # class in broken.py -> what the tutorial's troubleshooting section shows (after the spec's location)
    "ReturnsADict": "ReturnsADict.evaluate({}, seeds=[0, 1]) returned a dict instead of a list with one dict of "
                    "metrics per seed; it must return a list with one dict of QoS metrics (name -> number) per "
                    "seed, each with 'max_deviation_m'",
    "Unseeded": "Unseeded.evaluate({}, seeds=[0, 1]) is not deterministic: called twice with the same seeds, "
                "seed 0's 'max_deviation_m' was ",
    "RenamedMetric": "RenamedMetric.evaluate({}, seeds=[0, 1]) returned no finite 'max_deviation_m' for seed 0 "
                     "(got {'max_dev': ",
}


def _broken_spec(folder: Path, cls: str) -> Path:
    text = (folder / "app.yaml").read_text()
    spec = folder / f"broken-{cls}.yaml"
    spec.write_text(text.replace("entry_point: drone:Drone   ", f"entry_point: broken:{cls}", 1))
    assert f"broken:{cls}" in spec.read_text()
    return spec


@pytest.mark.parametrize("cls", sorted(BROKEN))
def test_broken_variants_are_named_by_check_application(folder, monkeypatch, cls):
    monkeypatch.syspath_prepend(str(folder))
    import qaopt
    from qaopt.app_spec import load
    from qaopt.application import ApplicationError

    import broken

    with pytest.raises(ApplicationError) as info:
        qaopt.check_application(getattr(broken, cls)(), load(folder / "app.yaml"))
    assert str(info.value).startswith(BROKEN[cls])
    assert BROKEN[cls] in TUTORIAL.read_text()


@pytest.mark.parametrize("cls", sorted(BROKEN))
def test_broken_variants_are_named_by_validate(folder, capsys, cls):
    from qaopt.cli import main

    spec = _broken_spec(folder, cls)
    with pytest.raises(SystemExit) as info:
        main(["validate", "--no-shapes", str(spec)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {spec}:8:5: evaluator.simulator.entry_point: 'broken:{cls}': {BROKEN[cls]}"), err
    assert "Traceback" not in err


KNOB_VARIANTS = {  # section 8's variants of app.yaml: (after this line, add these, validate's options, the field at fault)
    "merge": ("search:\n  trials: 12\n", "  merge:\n    - {nns: [altitude, gust]}\n", "--no-imports", "search.merge."),
    "resolution": ("    finetune: {steps: [0, 40]}\n", "    resolution: {scales: [1.0, 0.5]}\n", "--no-application",
                   "approximations.all.resolution."),
}


@pytest.mark.parametrize("variant", sorted(KNOB_VARIANTS))
def test_knob_variants_are_refused_as_the_tutorial_shows(folder, capsys, variant):
    from qaopt.cli import main

    after, added, option, field = KNOB_VARIANTS[variant]
    text, tutorial = (folder / "app.yaml").read_text(), TUTORIAL.read_text()
    assert text.count(after) == 1 and added.strip() in tutorial
    spec = folder / f"knobs-{variant}.yaml"
    spec.write_text(text.replace(after, after + added))
    with pytest.raises(SystemExit) as info:
        main(["validate", option, str(spec)])
    assert info.value.code == 2
    shown = [line.replace("error: app.yaml:", f"error: {spec}:", 1) for line in tutorial.splitlines()
             if line.startswith("error: app.yaml:") and f": {field}" in line]
    assert shown and capsys.readouterr().err.splitlines() == shown
