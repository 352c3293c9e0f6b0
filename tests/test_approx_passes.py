"""Approximation passes, registered: the spec section, the search space, the cache key and the report
columns all come from the registry, so a new pass is one class (and a test registers one here)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import torch
import yaml

from qaopt.app_spec import SpecError, content_hash
from qaopt.approx import (
    ApproximationPass,
    Knobs,
    KnobSpace,
    PassConfig,
    PassKnobs,
    SearchLimits,
    TargetNN,
    build,
    describe,
    register_pass,
    unregister_pass,
)
from qaopt.approx.passes import Range, passes, span
from qaopt.cli import main
from qaopt.kernels import onnx as onnx_toolchain
from qaopt.profiles import get_profile
from qaopt.seeding import most_finetuned
from qaopt.plan import build_plan
from qaopt.spec import load_spec

APPS = Path(__file__).resolve().parent / "apps"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cropfollow.yaml"


def _tiny(tmp_path: Path, approximations: dict | None = None, text: str | None = None) -> Path:
    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    if approximations is not None:
        data["approximations"] = approximations
    path = tmp_path / "tiny.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False))
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return [str(p) for p in info.value.problems]


def _line(path: Path, problem: str) -> str:
    return path.read_text().splitlines()[int(problem.split(":")[1]) - 1]


def test_builtin_passes_in_order_with_their_knobs():
    assert [p.name for p in passes()] == ["pruning", "lowrank", "resolution", "quantization", "finetune"]
    assert [p.name for p in passes("export")] == ["quantization"]
    assert set(Knobs().model_dump()) == {"prune_ratio", "importance", "round_to", "prune_steps", "per_layer",
                                          "ladder_step", "ladder_finetune_steps", "rank_ratio", "input_scale", "input_adapt_steps",
                                          "input_align", "dtype",
                                          "finetune_steps", "finetune_lr", "finetune_batch_size", "seed"}


@pytest.mark.parametrize(("knobs", "key"), [
    ({}, "f292207af6ee01c0"),
    ({"prune_ratio": 0.5, "prune_steps": 2, "finetune_steps": 200}, "17f8507c79f29ffc"),
    ({"prune_ratio": 0.35, "dtype": "int8", "finetune_steps": 130, "prune_steps": 2}, "be080f867cfa20c6"),
    ({"rank_ratio": 0.5, "dtype": "bf16"}, "fd06dfd59d97e59f"),
    ({"dtype": "int8", "importance": "taylor", "per_layer": {"x": 0.0}}, "16735bad234f6dcc"),
])
def test_candidate_identity_is_the_one_cached_entries_were_written_under(knobs, key):
    """Keys from before the passes were registered: the existing caches stay valid."""
    assert content_hash(Knobs(**knobs).identity()) == key


def test_a_setting_that_changes_nothing_is_not_in_the_key():
    assert Knobs(importance="taylor", prune_steps=3, round_to=4).identity() == Knobs().identity()
    assert Knobs(prune_ratio=0.5).identity() != Knobs(prune_ratio=0.5, prune_steps=3).identity()
    assert "dtype" not in Knobs(dtype="int8").float_part()


def test_spec_section_is_validated_against_its_pass_with_file_positions(tmp_path):
    path = _tiny(tmp_path, {"all": {"pruning": {"ratio": [0.0, 1.0]}, "lowrank": {"rank": [0.0, 0.5]},
                                    "prunning": {}, "finetune": {"stesp": [0, 20]}}})
    problems = _problems(path)
    ratio = next(p for p in problems if "approximations.all.pruning.ratio:" in p)
    assert "0 <= lo <= hi < 1" in ratio and _line(path, ratio).strip().startswith("ratio:")
    assert any("approximations.all.lowrank.rank:" in p and "0 < lo <= hi <= 1" in p for p in problems)
    assert any("approximations.all.prunning: unknown field; did you mean 'pruning'?" in p for p in problems)
    assert any("approximations.all.finetune.stesp: unknown field; did you mean 'steps'?" in p for p in problems)
    assert all(p.startswith(f"{path}:") for p in problems)


def test_qaopt_validate_reports_a_bad_pass_setting_in_one_line(tmp_path, capsys):
    path = _tiny(tmp_path, {"all": {"quantization": {"dtypes": ["int4"]}}})
    with pytest.raises(SystemExit) as exit_:
        main(["validate", str(path), "--no-imports"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "approximations.all.quantization.dtypes.0:" in err[0], err


def test_the_spec_hash_does_not_depend_on_spelling_out_defaults(tmp_path):
    short = load_spec(_tiny(tmp_path, {"all": {"pruning": {"ratio": [0, 0.75]}}}))
    (tmp_path / "full").mkdir()
    full = load_spec(_tiny(tmp_path / "full", {"all": {"pruning": {"ratio": [0.0, 0.75], "importance": "l1", "round_to": 8,
                                                                   "steps": 1}, "lowrank": None}}))
    assert short.content_hash() == full.content_hash()
    assert short.knobs_for("a")["pruning"]["round_to"] == 8


def test_sampling_follows_the_spec_and_the_profile_caps():
    spec = load_spec(EXAMPLE)
    space = KnobSpace.from_section(spec.knobs_for("heading"), SearchLimits(max_prune_steps=2, max_finetune_steps=160))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):
        trial = study.ask()
        k = space.sample(trial, "heading", seed=3)
        assert k.seed == 3 and k.prune_ratio == round(round(k.prune_ratio * 20) / 20, 6)  # on the 0.05 grid, rounded
        assert k.dtype in ("fp32", "bf16", "int8") and k.round_to == 8 and k.input_scale in (1.0, 0.75, 0.5, 0.375)
        assert k.prune_steps == (2 if k.prune_ratio > 0 else 1)
        assert k.input_adapt_steps == (1000 if k.input_scale < 1 else 0), "a scale is adapted once, uncapped here"
        if k.prune_ratio > 0:  # pruned: fine-tuned
            assert 100 <= k.finetune_steps <= 160 and "heading.finetune_steps" in trial.params
        else:  # nothing damaged in the candidate (a scale comes adapted): nothing to fine-tune, no budget sampled
            assert k.finetune_steps == 0 and "heading.finetune_steps" not in trial.params
        study.tell(trial, 0.0)
    assert space.params_of(Knobs(), "heading") == {"heading.prune_ratio": 0.0, "heading.input_scale": 1.0,
                                                   "heading.dtype": "fp32"}
    scales = [{"input_scale": s} for s in (0.75, 0.5, 0.375)]  # each smaller input is tried alone, as each dtype is
    assert space.probes() == scales + [{"dtype": "fp32"}, {"dtype": "bf16"}, {"dtype": "int8"}]
    # What the target cannot run (qaopt.target_fit decides it) is neither sampled nor probed.
    no_bf16 = KnobSpace.from_section(spec.knobs_for("heading"), SearchLimits(excluded_dtypes=("bf16",)))
    assert no_bf16.probes() == scales + [{"dtype": "fp32"}, {"dtype": "int8"}]
    assert no_bf16.choices("dtype") == ["fp32", "int8"]


def test_a_walk_judges_an_nn_with_the_fine_tuning_its_trial_runs():
    """The informed walk and the agnostic checks build what a trial of the same knobs builds: the most fine-tuning
    the space samples for a damaged NN, none for one only quantized (a trial of it fine-tunes nothing, and a
    merged NN distilled 160 steps more once fell outside the region where the trials' own was inside)."""
    spec = load_spec(EXAMPLE)
    space = KnobSpace.from_section(spec.knobs_for("heading"), SearchLimits(max_finetune_steps=160))
    for damaged in (space.base(prune_ratio=0.5), space.base(input_scale=0.5, dtype="int8", input_adapt_steps=0)):
        assert space.offers("finetune_steps", damaged) and most_finetuned(space, damaged).finetune_steps == 160
    adapted = space.base(input_scale=0.5, dtype="int8")  # the example adapts each scale once: nothing to recover
    assert adapted.input_adapt_steps == 1000 and most_finetuned(space, adapted).finetune_steps == 0
    quantized = space.base(dtype="int8")
    assert not space.offers("finetune_steps", quantized)
    assert most_finetuned(space, quantized).finetune_steps == 0 == most_finetuned(space, space.base()).finetune_steps
    assert most_finetuned(space, quantized).model_dump() == {**quantized.model_dump(), "finetune_steps": 0}


def test_describe_gives_the_report_one_column_per_knob():
    assert describe({"prune_ratio": 0.5, "dtype": "int8", "finetune_steps": 160, "prune_steps": 2}) == {
        "prune ratio": "0.50", "rank ratio": "1.00", "input scale": "1", "dtype": "int8", "fine-tune steps": "160"}


# ------------------------------------------------------------ a pass registered by a test


class RoundingConfig(PassConfig):
    """``approximations.<nn>.rounding``: how many decimals weights keep, searched over [lo, hi]."""

    decimals: Range(int, 0, low_open=True) = (1, 3)


class RoundingKnobs(PassKnobs):
    round_decimals: int = 0
    """0: weights are left as they are."""


class RoundingPass(ApproximationPass):
    """Rounds every weight to ``round_decimals`` decimals (a stand-in for a real weight-sharing pass)."""

    name = "rounding"
    Config = RoundingConfig
    Knobs = RoundingKnobs

    def space(self, config, limits, chosen):
        return {} if config is None else {"round_decimals": span(*config.decimals)}

    def apply(self, model, knobs, ctx):
        if knobs.round_decimals:
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(torch.round(p, decimals=knobs.round_decimals))
        return model


@pytest.fixture
def rounding():
    before = content_hash(Knobs().identity())
    register_pass(RoundingPass)
    try:
        yield
    finally:
        unregister_pass("rounding")
    assert content_hash(Knobs().identity()) == before


def test_a_pass_registered_from_a_test_is_validated_sampled_and_keyed(tmp_path, monkeypatch, rounding):
    monkeypatch.syspath_prepend(str(APPS))
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    (problem,) = _problems(_tiny(tmp_path, {"all": {"rounding": {"decimals": [0, 2]}}}))
    assert "approximations.all.rounding.decimals: must be [lo, hi] with 0 < lo <= hi, got [0, 2]" in problem
    path = _tiny(tmp_path, {"all": {"pruning": {"ratio": [0.0, 0.5], "round_to": 4}, "rounding": {"decimals": [1, 2]}}})
    spec = load_spec(path)
    assert spec.knobs_for("a")["rounding"] == {"decimals": [1, 2]}

    # Sampled by the search, after the built-in passes, under the NN's name.
    plan = build_plan(spec, get_profile("quick"))
    trial = optuna.trial.FixedTrial({"a.prune_ratio": 0.0, "a.dtype": "fp32", "a.round_decimals": 1})
    knobs = plan.knob_spaces["a"].sample(trial, "a")
    assert knobs.round_decimals == 1 and describe(knobs)["round decimals"] == "1"

    # Part of the candidate's identity only when it changes the model, and really applied.
    assert "round_decimals" not in Knobs().identity() and knobs.identity()["round_decimals"] == 1
    nn_ = TargetNN.from_spec("a", spec.nns["a"])
    plain = build(nn_, Knobs(), onnx=onnx_toolchain)
    rounded = build(nn_, knobs, onnx=onnx_toolchain)
    assert rounded.key != plain.key and not rounded.from_cache
    weights = torch.cat([p.flatten() for p in rounded.module.parameters()])
    assert torch.allclose(weights * 10, torch.round(weights * 10), atol=1e-4)
    assert build(nn_, knobs, onnx=onnx_toolchain).from_cache


def test_knob_names_are_unique_across_passes():
    class Clash(ApproximationPass):
        name = "clash"
        Config = PassConfig
        Knobs = type("ClashKnobs", (PassKnobs,), {"__annotations__": {"dtype": str}, "dtype": "fp32"})

    with pytest.raises(ValueError, match="already belong"):
        register_pass(Clash)
    assert "clash" not in [p.name for p in passes()]
