"""The fidelity benchmark's sets per application: LaneKeep's configurations beside CropFollow's, and a
set recorded before the scripts knew other applications scored as it was."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from qaopt.spec import load_spec
from qaopt.spec_adapter import acceptance_of, goal_of

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


closed_loop, fidelity = _script("fidelity_closed_loop"), _script("fidelity")


@pytest.mark.parametrize("example", ["cropfollow", "lanekeep"])
def test_each_configuration_names_a_built_variant_of_every_nn(example):
    spec = load_spec(REPO / "examples" / f"{example}.yaml")
    tables, configurations = closed_loop.configurations_of(spec)
    assert list(tables) == list(spec.nns)
    for config in configurations:
        assert list(config) == list(spec.nns) and all(config[nn] in tables[nn] for nn in config)
    # one reference configuration (every NN's variant with no knobs), and each NN varied while the others are not
    assert sum(all(not tables[nn][v] for nn, v in c.items()) for c in configurations) == 1
    for nn in spec.nns:
        assert any(tables[nn][c[nn]] and all(not tables[o][c[o]] for o in c if o != nn) for c in configurations)
    if example == "lanekeep":  # at least 12 configurations of its three NNs, the detector included
        assert len(configurations) >= 12 and spec.nns["stop"].error_metric.kind == "miss_rate"


def test_an_application_without_variants_is_named(tmp_path):
    text = (REPO / "examples" / "cropfollow.yaml").read_text().replace("name: cropfollow", "name: orchard", 1)
    (tmp_path / "orchard.yaml").write_text(text)
    with pytest.raises(SystemExit, match="'orchard': no variants for this application here"):
        closed_loop.configurations_of(load_spec(tmp_path / "orchard.yaml"))


def test_a_set_recorded_before_the_generalisation_scores_as_it_did():
    """cropfollow-seed0 (recorded with heading/distance hard-coded): the same points and pipeline score."""
    spec = load_spec(REPO / "examples" / "cropfollow.yaml")
    saved = json.loads((REPO / "docs" / "benchmarks" / "fidelity.json").read_text())["sets"]["cropfollow-seed0"]
    configs, reference = fidelity.merged([REPO / p for p in saved["closed_loop"]["sources"]],
                                         {nn: spec.nns[nn].error_metric.kind for nn in spec.nns})
    assert {c["id"]: c["points"] for c in configs} == {t["id"]: t["points"] for t in saved["truth"]}
    assert [c["id"] for c in configs if c["reference"]] == [0]
    assert fidelity.pipeline(configs, None, goal_of(spec), acceptance_of(spec)) == saved["pipeline"]["without_region"]


def test_when_a_detection_streak_begins_is_measured_both_ways_beside_the_miss_rate():
    """LaneKeep's stop detector at input 0.9 failed 9 of 48 runs at a miss rate inside the region: what fails a stop is
    when the acted-on streak begins against the sign's range entry, late (misses at its onset) or early (false alarms
    just before it), which the miss rate cannot show (benchmarks/lanekeep_stop_onsets.py)."""
    onsets = _script("lanekeep_stop_onsets")
    from qaopt.app_spec.nn_errors import FALSE_ALARM, MISS, TRUE_NEGATIVE, TRUE_POSITIVE

    def drive(missed_at: list[int]) -> np.ndarray:
        codes = np.full(100, TRUE_NEGATIVE)
        codes[20:60] = TRUE_POSITIVE  # one sign, 40 frames in view
        codes[missed_at] = MISS
        return codes

    late, early = onsets.onset_stats([drive([21, 23])], 5), onsets.onset_stats([drive([40, 50])], 5)
    assert late["miss_rate"] == early["miss_rate"] == 2 / 40 and late["events"] == 1
    assert late["onset_miss_rate"] == 2 / 5 and early["onset_miss_rate"] == 0
    assert late["late_frames_mean"] == 0, "its first detection is on time: only the debounced streak is late"
    detected = drive([21, 23])[20:60] == TRUE_POSITIVE
    assert onsets.acted_on(detected, 2) == 4 and onsets.acted_on(detected, 1) == 0  # frames 1 and 3 missed
    assert onsets.acted_on(np.zeros(5, dtype=bool), 2) == 5
    assert late["offsets"] == [4] and early["offsets"] == [0]
    ahead = drive([])
    ahead[17:20] = FALSE_ALARM  # it sees the sign three frames before it is in range: the stop starts early
    assert onsets.onset_stats([ahead], 5)["offsets"] == [-3]
