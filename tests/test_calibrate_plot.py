"""Region plots over N axes: one panel per pair, only the points true of each slice, the marks, and the CLI.

A projected point lies: an invalid point with a large error on a third axis would be
drawn inside the certified area of the (axis1, axis2) slice, so these tests pin down
which points each panel holds (:func:`qaopt.calibrate.plot.layout`, no drawing) and
that ``qaopt calibrate SPEC --plot`` redraws without running the simulator.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from qaopt.calibrate import AcceptanceTest, Axis, CalibrationError, ErrorRegion, ErrorSpace, Observation, Verdict
from qaopt.calibrate.plot import SLICE_TOLERANCE, layout, plot_region
from qaopt.cli import app, main

SPACE = ErrorSpace([Axis("heading", 30.0), Axis("distance", 0.25), Axis("speed", 1.0)])
REFERENCE = {"heading": 1.0, "distance": 0.01, "speed": 0.1}
CHOSEN = {"heading": 4.0, "distance": 0.05, "speed": 0.2}


def point(h: float, d: float, s: float, valid: bool) -> Observation:
    return Observation({"heading": h, "distance": d, "speed": s}, 64 if valid else 4, 0 if valid else 4,
                       Verdict.VALID if valid else Verdict.INVALID)


@pytest.fixture
def region() -> ErrorRegion:
    return ErrorRegion(SPACE, AcceptanceTest(), [
        point(5, 0.15, 0.0, True),  # on the speed=min slice
        point(10, 0.1, 0.5, True),  # valid with more speed error: valid on the slice too (faint)
        point(20, 0.05, 0.0, False),  # invalid on the slice
        point(2, 0.02, 0.9, False),  # invalid only with a large speed error: inside the slice's certified area
    ], info={"strategy": "monotone"})


def drawn(panel) -> dict[tuple[float, float, float], bool]:
    """Each drawn point's (heading, distance, speed) -> whether it is on the slice (False: faint)."""
    return {tuple(pp.point.errors.values()): pp.on_slice for pp in panel.points}


def test_three_axes_give_one_panel_per_pair_held_at_the_minimum(region, tmp_path):
    panels = layout(region)
    assert [(p.x, p.y) for p in panels] == [("heading", "distance"), ("heading", "speed"), ("distance", "speed")]
    assert [p.levels for p in panels] == [{"speed": 0.0}, {"distance": 0.0}, {"heading": 0.0}]
    assert panels[0].title() == "at speed=0 (min)"
    path = plot_region(region, tmp_path / "region.png", resolution=30)
    assert path == tmp_path / "region.png" and path.read_bytes()[:4] == b"\x89PNG"


def test_a_panel_draws_only_the_points_true_of_its_slice(region):
    first = drawn(layout(region)[0])
    assert (2, 0.02, 0.9) not in first  # invalid far off the slice: never drawn there
    assert region.contains({"heading": 2, "distance": 0.02, "speed": 0.0})  # ... where it would look certified
    assert first == {(5, 0.15, 0.0): True, (20, 0.05, 0.0): True, (10, 0.1, 0.5): False}

    at_high_speed = drawn(layout(region, axes=["heading", "distance"], fixed={"speed": 0.9})[0])
    assert at_high_speed == {(2, 0.02, 0.9): True}  # the valid points have less speed error: nothing to say here

    near = ErrorRegion(SPACE, AcceptanceTest(), [point(3, 0.03, SLICE_TOLERANCE * 0.9, False)])
    assert drawn(layout(near)[0]) == {(3, 0.03, SLICE_TOLERANCE * 0.9): True}  # within the tolerance: on the slice


def test_reference_and_chosen_are_marked_where_they_have_coordinates(region, tmp_path):
    panels = layout(region, reference=REFERENCE, chosen=CHOSEN)
    assert [p.marks for p in panels] == [
        {"reference": (1.0, 0.01), "chosen": (4.0, 0.05)},
        {"reference": (1.0, 0.1), "chosen": (4.0, 0.2)},
        {"reference": (0.01, 0.1), "chosen": (0.05, 0.2)},
    ]
    partial = layout(region, reference={"heading": 1.0, "distance": 0.01})
    assert [p.marks for p in partial] == [{"reference": (1.0, 0.01)}, {}, {}]
    one_axis = layout(region, axes=["heading"], fixed={"speed": 0.2}, chosen=CHOSEN)
    assert [(p.x, p.y, p.levels, p.marks) for p in one_axis] == [
        ("heading", None, {"distance": 0.0, "speed": 0.2}, {"chosen": (4.0, None)})]
    assert one_axis[0].title() == "at speed=0.2, distance=0 (min)"
    for axes in (None, ["heading", "distance"], ["heading"]):
        path = region.plot(tmp_path / "marked.png", axes, resolution=20, reference=REFERENCE, chosen=CHOSEN)
        assert path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("options,message", [
    (dict(axes=["speeed"]), "axis 'speeed' is not an axis of this region (heading in [0, 30], distance in [0, 0.25], "
                            "speed in [0, 1]); name axes as in region.json"),
    (dict(axes=["heading", "heading"]), "axis 'heading' is listed twice in --axes; list it once"),
    (dict(axes=[]), "no axes to plot"),
    (dict(axes=["heading", "distance"], fixed={"speed": 2.0}),
     "fixed level speed=2 (--at) is outside the axis' range [0, 1]; give a level within it"),
    (dict(axes=["heading", "distance"], fixed={"speed": -0.1}), "outside the axis' range [0, 1]"),
    (dict(axes=["heading", "speed"], fixed={"heading": 1.0}),
     "axis 'heading' (range [0, 30]) is plotted, so it cannot also be held at 1; drop it from --at"),
    (dict(axes=["heading", "distance"], fixed={"sped": 0.1}),
     "fixed level sped=0.1 (--at) names no axis of this region"),
    (dict(reference={"heading": 1.0, "steer": 0.1}), "the reference point names axis 'steer', which this region lacks"),
])
def test_bad_axes_and_levels_name_the_axis_and_the_fix(region, tmp_path, options, message):
    with pytest.raises(CalibrationError) as error:
        region.plot(tmp_path / "x.png", **options)
    assert message in str(error.value)
    assert not (tmp_path / "x.png").exists()


def _flat(output: str) -> str:
    """The CLI's boxed error message on one line."""
    return " ".join(output.replace("│", " ").split())


@pytest.mark.parametrize("args,message", [
    (["--at", "heading"], "Invalid value for '--at': 'heading' is not NAME=VALUE; hold an axis at a level with e.g. "
                          "--at heading=2.5"),
    (["--at", "heading=fast"], "Invalid value for '--at': 'heading=fast': 'fast' is not a finite number"),
    (["--at", "heading=1", "--at", "heading=2"], "axis 'heading' is given twice"),
    (["--axes", "heading,,distance"], "Invalid value for '--axes': 'heading,,distance' has an empty axis name"),
    (["--plot", "--budget", "3"], "Invalid value for '--plot': --plot redraws the existing region and runs nothing"),
])
def test_bad_plot_options_name_the_option(spec_file, tmp_path, args, message):
    result = CliRunner().invoke(app, ["calibrate", str(spec_file()), "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2
    assert message in _flat(result.output)
    assert not (tmp_path / "cache").exists()  # nothing ran


def test_plot_without_a_region_says_to_calibrate_first(spec_file, tmp_path, capsys):
    spec = spec_file()
    with pytest.raises(SystemExit) as exit_:
        main(["calibrate", str(spec), "--plot", "--out", str(tmp_path / "empty")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'empty' / 'region.json'}: no region to plot; run `qaopt calibrate {spec}` first" in err


def test_plot_redraws_the_saved_region_without_running_the_simulator(spec_file, region, tmp_path, monkeypatch,
                                                                     capsys):
    spec, out = spec_file(), tmp_path / "out"
    region.save(out / "region.json")  # --plot draws the folder's region, whichever axes it has
    saved = (out / "region.json").read_bytes()

    def no_simulator(*args, **kwargs):
        raise AssertionError("--plot constructed the simulator")

    monkeypatch.setattr("qaopt.calibrate.synthetic.SuperellipseApp.__init__", no_simulator)
    result = CliRunner().invoke(app, ["calibrate", str(spec), "--plot", "--out", str(out),
                                      "--axes", "heading,distance", "--at", "speed=0.3"])
    assert result.exit_code == 0, result.output
    assert (out / "region.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "region.json").read_bytes() == saved
    assert not (tmp_path / "cache").exists()

    with pytest.raises(SystemExit):
        main(["calibrate", str(spec), "--plot", "--out", str(out), "--axes", "heading,distance", "--at", "speed=3"])
    assert "error: plot: fixed level speed=3 (--at) is outside the axis' range [0, 1]" in capsys.readouterr().err


def test_calibrate_checks_the_plot_options_before_any_run_and_uses_them(spec_file, tmp_path, capsys):
    spec, out = spec_file(), tmp_path / "out"
    with pytest.raises(SystemExit):
        main(["calibrate", str(spec), "--out", str(out), "--axes", "heading", "--at", "speed=0.1"])
    assert "fixed level speed=0.1 (--at) names no axis of this region (heading in [0, 15], distance in [0, 0.15])" \
        in capsys.readouterr().err
    assert not (tmp_path / "cache").exists() and not out.exists()

    result = CliRunner().invoke(app, ["calibrate", str(spec), "--out", str(out), "--axes", "heading",
                                      "--at", "distance=0.05"])
    assert result.exit_code == 0, result.output
    assert (out / "region.png").read_bytes()[:4] == b"\x89PNG"
