"""The spec of the two knobs that spend the headroom (docs/knobs.md): input resolution and merged NNs.

``qaopt validate`` refuses each bad input at its line with its reason: a merge group of
NNs that read different inputs, or an NN that declares none, or an unknown NN; a
resolution scale outside (0, 1]; and, with its NN check on, a scale the architecture
cannot take (a fixed-size layer after a flatten). A spec with ``input:``,
``search.merge`` and a resolution section validates, and so do the shipped examples'.
Every case runs on the tiny application (8x8 frames) in seconds.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from qaopt.app_spec import load
from specs import line_of, one_error, run_qaopt, tiny_spec

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = ("cropfollow.yaml", "cropfollow-resnet18.yaml", "lanekeep.yaml")


def _reading(a: str | None = "camera", b: str | None = "camera", merge: list[str] | None = None):
    """An edit of the tiny spec: NN ``a`` reads input ``a``, NN ``b`` reads ``b`` (``None``: declares none),
    and the search may merge the NNs ``merge`` (default: both)."""

    def edit(d):
        for name, source in (("a", a), ("b", b)):
            if source is None:
                d["nns"][name].pop("input", None)
            else:
                d["nns"][name]["input"] = source
        d["search"]["merge"] = [{"nns": merge or ["a", "b"], "finetune_steps": 300}]

    return edit


@pytest.mark.parametrize(("edit", "field", "message", "line"), [
    (_reading("camera", "lidar"), "search.merge.0.nns",
     "these NNs read different inputs (a reads 'camera', b reads 'lidar'); only NNs that read the same input can "
     "share a backbone", "- nns:"),
    (_reading("camera", None), "search.merge.0.nns",
     "b declares no input; NNs are merged only when they read the same input: give each nns.<name>.input the same "
     "name (e.g. camera)", "- nns:"),
    (_reading(merge=["a", "c"]), "search.merge.0.nns.1", "no NN named 'c'; the spec's NNs are ['a', 'b']", "- c"),
    (lambda d: (_reading()(d), d["search"]["merge"].append({"nns": ["b", "a"]})), "search.merge.1.nns.0",
     "NN 'b' is already in merge group 0; an NN can be merged with one group only", "- b"),
    (lambda d: (_reading()(d), d["nns"]["b"].update(input_shape=[1, 1, 8, 16])), "search.merge.0.nns",
     "these NNs take inputs of different shapes", "- nns:"),
])
def test_a_bad_merge_group_is_refused_at_its_line(tmp_path, capsys, edit, field, message, line):
    path = tiny_spec(tmp_path, edit)
    error = one_error(capsys, path, "validate", "--no-imports")
    assert f": {field}: {message}" in error
    assert line_of(path, error).strip() == line


@pytest.mark.parametrize("scale", [1.5, 0.0])
def test_a_resolution_scale_outside_0_1_is_refused_at_its_line(tmp_path, capsys, scale):
    path = tiny_spec(tmp_path, lambda d: d["approximations"]["all"].update(resolution={"scales": [1.0, scale]}))
    error = one_error(capsys, path, "validate", "--no-imports")
    assert f": approximations.all.resolution.scales: every scale must be in (0, 1], got {scale}" in error
    assert line_of(path, error).strip() == "scales:"


FIXED_NET = '''
"""A conv and a linear layer sized for 8x8 frames (after a flatten): a smaller frame cannot pass."""

import torch
from torch import nn


def fixed_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Flatten(), nn.Linear(2 * 8 * 8, 1)).eval()
'''


@pytest.mark.parametrize("key", ["all", "a"])
def test_a_scale_the_architecture_cannot_take_is_found_by_validate(tmp_path, capsys, key):
    (tmp_path / "fixednet.py").write_text(textwrap.dedent(FIXED_NET))

    def edit(d):
        d["nns"]["a"].update(model="fixednet:fixed_net", args={})
        d["approximations"].setdefault(key, {})["resolution"] = {"scales": [1.0, 0.5], "align": 4}

    path = tiny_spec(tmp_path, edit)
    error = one_error(capsys, path, "validate", "--no-application")
    # NN b (global average pooling) takes 4x4 frames: only NN a is named
    assert (f": approximations.{key}.resolution.scales.1: nns.a: scale 0.5 resizes the input to 4x4, which the "
            "architecture cannot take (RuntimeError: ") in error
    assert "drop it or choose another" in error
    assert line_of(path, error).strip() == "- 0.5"


def test_inputs_merge_groups_and_resolution_validate(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("qaopt.spec_adapter.SLOW_LOAD_S", 600.0)  # a loaded machine's "still loading" line is not ok's

    def edit(d):
        _reading()(d)
        d["search"]["merge"][0]["freeze"] = "features"
        d["approximations"]["all"]["resolution"] = {"scales": [1.0, 0.5], "align": 4}

    path = tiny_spec(tmp_path, edit)
    code, err, out = run_qaopt(capsys, "validate", "--no-application", str(path))
    assert code == 0, err
    assert out.startswith(f"{path}: ok — app 'tiny', NNs a, b") and "each NN runs a sample of its data" in out
    spec = load(path)
    assert [(g.nns, g.finetune_steps, g.freeze) for g in spec.search.merge] == [(["a", "b"], 300, "features")]
    assert spec.knobs_for("b")["resolution"] == {"scales": [1.0, 0.5], "align": 4}


@pytest.mark.parametrize(("freeze", "message"), [
    ("trunk", "NN 'a' (the group's lead) has no submodule 'trunk'; its top-level submodules are ['features', "
              "'head']: name the one that computes the features its output layer reads"),
    ("head", "'head' holds NN 'a''s output layer, which the merged NN widens to every member's outputs and must "
             "learn; name the part before the output layer (its backbone)"),
])
def test_a_freeze_the_leads_model_cannot_take_is_found_by_validate(tmp_path, capsys, freeze, message):
    path = tiny_spec(tmp_path, lambda d: (_reading()(d), d["search"]["merge"][0].update(freeze=freeze)))
    error = one_error(capsys, path, "validate", "--no-application")
    assert f": search.merge.0.freeze: NN 'a+b', knob 'freeze': {message}" in error
    assert line_of(path, error).strip() == f"freeze: {freeze}"


def test_a_freeze_that_is_no_attribute_path_is_refused_at_its_line(tmp_path, capsys):
    path = tiny_spec(tmp_path, lambda d: (_reading()(d), d["search"]["merge"][0].update(freeze="features[0]")))
    error = one_error(capsys, path, "validate", "--no-imports")
    assert ": search.merge.0.freeze: " in error and "should match pattern" in error
    assert line_of(path, error).strip() == "freeze: features[0]"


def test_end_to_end_steps_without_freeze_are_refused_at_their_group(tmp_path, capsys):
    path = tiny_spec(tmp_path, lambda d: (_reading()(d), d["search"]["merge"][0].update(end_to_end_steps=500)))
    error = one_error(capsys, path, "validate", "--no-imports")
    assert ": search.merge.0: " in error and "set freeze (e.g. backbone) or drop end_to_end_steps" in error


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_examples_merge_their_nns_on_one_input_and_search_resolution(name):
    spec = load(REPO / "examples" / name)
    assert [sorted(g.nns) for g in spec.search.merge] == [sorted(spec.nns)]
    assert {nn.input for nn in spec.nns.values()} == {"camera"}
    assert 1.0 in spec.knobs_for(next(iter(spec.nns)))["resolution"]["scales"]


def test_the_quick_profile_keeps_a_merged_nn_as_its_frozen_distillation_left_it():
    """End-to-end steps cost CropFollow minutes once per cache; the quick profile (the README's first run) skips them
    and the default one keeps the spec's."""
    from qaopt.plan import MergePlan
    from qaopt.profiles import get_profile

    group = load(REPO / "examples" / "cropfollow.yaml").search.merge[0]
    assert group.end_to_end_steps == 1000
    assert MergePlan.of(group, get_profile("quick")).end_to_end_steps == 0
    assert MergePlan.of(group, get_profile("default")).end_to_end_steps == 1000


def test_validate_says_so_when_loading_the_nns_is_slow_and_keeps_quiet_otherwise(tmp_path, capsys, monkeypatch):
    """An entry point may train its NN the first time (an hour for a ResNet-18 on two cores): validate says what it is
    doing once loading outlasts SLOW_LOAD_S, on stdout, so that an error stays the one line on stderr."""
    from qaopt import spec_adapter

    path = tiny_spec(tmp_path)
    code, err, out = run_qaopt(capsys, "validate", str(path), "--no-application")
    assert code == 0 and not err and "still loading" not in out
    check_sample = spec_adapter._check_sample
    monkeypatch.setattr(spec_adapter, "_check_sample", lambda *a: (time.sleep(0.3), check_sample(*a)))  # a slow NN
    monkeypatch.setattr(spec_adapter, "SLOW_LOAD_S", 0.05)
    code, err, out = run_qaopt(capsys, "validate", str(path), "--no-application")
    assert code == 0 and not err
    assert "nns: still loading a, b with their data to run one sample each" in out and "--no-shapes skips this" in out
