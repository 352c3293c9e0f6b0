"""Pruning ladders: rungs pruned from the original widths, fine-tuned, stored, resumed, shared, and checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from qaopt.app_spec.errors import QaoptError
from qaopt.app_spec.schema import TrainingSpec
from qaopt.approx import ApproxError, FinetuneRecipe, Knobs, KnobSpace, SearchLimits, TargetNN, ladder_of
from qaopt.approx.passes import get_pass
from qaopt.approx.pruning import kept_channels
from qaopt.training import finetune_recipe, training_device
from tests.test_approx_build import FAST, SHAPE, TinyNavNet, build, stripe_data, train_base

LADDER = dict(prune_ratio=0.5, ladder_step=0.25, ladder_finetune_steps=40)


@pytest.fixture(scope="module")
def tiny_nn() -> TargetNN:
    data = stripe_data()
    return TargetNN("heading", train_base(data), data, SHAPE)


def _widths(module: nn.Module) -> dict[str, int]:
    return {n: m.out_channels for n, m in module.named_modules() if isinstance(m, nn.Conv2d)}


def test_rungs_keep_shares_of_the_original_widths_and_record_their_cost(tiny_nn, tmp_path):
    ladder = ladder_of(tiny_nn, Knobs(**LADDER), cache_dir=tmp_path, recipe=FAST)
    deep = ladder.model(2)
    original = _widths(tiny_nn.model)
    assert _widths(deep) == {n: kept_channels(c, 0.5, 8) for n, c in original.items()}
    rungs = ladder.rungs()
    assert [(r.rung, r.ratio, r.train_steps) for r in rungs] == [(1, 0.25, 40), (2, 0.5, 80)]
    assert rungs[0].macs > rungs[1].macs and rungs[0].params > rungs[1].params
    assert all(np.isfinite(r.error) for r in rungs)
    assert _widths(tiny_nn.model) == original, "the base NN is never modified"


def test_a_killed_ladder_resumes_to_the_same_rungs(tiny_nn, tmp_path):
    whole = ladder_of(tiny_nn, Knobs(**LADDER), cache_dir=tmp_path / "a", recipe=FAST)
    whole.model(2)
    resumed = ladder_of(tiny_nn, Knobs(**LADDER), cache_dir=tmp_path / "b", recipe=FAST)
    resumed.model(1)  # the run that was killed after its first rung
    again = ladder_of(tiny_nn, Knobs(**LADDER), cache_dir=tmp_path / "b", recipe=FAST)
    assert again.stored(1) is not None and again.stored(2) is None
    again.model(2)
    x = torch.from_numpy(tiny_nn.data.x_val[:8])
    with torch.inference_mode():
        np.testing.assert_allclose(again.model(2)(x).numpy(), whole.model(2)(x).numpy(), rtol=1e-4, atol=1e-4)
    assert again.stored(2).error == pytest.approx(whole.stored(2).error, rel=1e-4)


def test_candidates_take_their_rung_and_share_the_ladder(tiny_nn, tmp_path):
    deep = build(tiny_nn, Knobs(**LADDER), cache_dir=tmp_path, recipe=FAST)
    ladder = ladder_of(tiny_nn, Knobs(**LADDER), cache_dir=tmp_path, recipe=FAST)
    assert ladder.stored(2) is not None
    assert deep.error == pytest.approx(ladder.stored(2).error, rel=1e-5)
    shallow = build(tiny_nn, Knobs(**{**LADDER, "prune_ratio": 0.25}), cache_dir=tmp_path, recipe=FAST)
    assert shallow.error == pytest.approx(ladder.stored(1).error, rel=1e-5)
    int8 = build(tiny_nn, Knobs(**LADDER, dtype="int8"), cache_dir=tmp_path, recipe=FAST)
    assert int8.onnx_path is not None and int8.macs == deep.macs, "quantization applies on top of the rung"
    scratch = build(tiny_nn, Knobs(prune_ratio=0.5), cache_dir=tmp_path, recipe=FAST)
    assert scratch.key != deep.key, "a rung is not the candidate pruned from scratch"


def test_the_space_samples_rungs_and_the_reference_stays_the_reference():
    space = KnobSpace.from_section({"pruning": {"ratio": [0.02, 0.93], "ladder": {"step": 0.1, "finetune_steps": 50}}})
    d = get_pass("pruning").space(space.configs["pruning"], SearchLimits(), None)["prune_ratio"]
    assert (d.low, d.high, d.step) == (0.1, 0.9, 0.1)
    base = space.base(prune_ratio=0.3)
    assert (base.ladder_step, base.ladder_finetune_steps) == (0.1, 50)
    assert Knobs().identity() == space.base(prune_ratio=0.0).model_copy(update={"ladder_step": 0.0, "ladder_finetune_steps": 0}).identity()
    with pytest.raises(ApproxError, match="not a rung"):
        Knobs(prune_ratio=0.35, ladder_step=0.1, ladder_finetune_steps=50).check("heading")
    with pytest.raises(ApproxError, match="per_layer"):
        KnobSpace.from_section({"pruning": {"ladder": {}, "per_layer": {"backbone": 0.5}}}, nn="heading")


def test_a_recipe_that_breaks_the_nn_at_its_first_rung_stops_naming_nn_and_rung(tmp_path):
    data = stripe_data(n_train=64, n_val=32)
    untrained = TinyNavNet()
    untrained.head[-1].weight.data *= 1000.0  # outputs far off any label: what a broken NN predicts
    nn_ = TargetNN("heading", untrained, data, SHAPE)
    knobs = Knobs(prune_ratio=0.5, ladder_step=0.25, ladder_finetune_steps=1)
    with pytest.raises(ApproxError, match=r"NN 'heading'.*rung 1 \(pruning 25% of channels"):
        ladder_of(nn_, knobs, cache_dir=tmp_path, recipe=FinetuneRecipe(lr=0.0)).model(2)
    assert ladder_of(nn_, knobs, cache_dir=tmp_path).stored(1) is None, "a broken rung is not stored"


def test_training_device_falls_back_with_a_notice_or_fails_when_required(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    said = []
    assert training_device(TrainingSpec(device="cuda"), said.append) == "cpu"
    assert len(said) == 1 and "no CUDA device" in said[0]
    assert training_device(TrainingSpec(device="auto"), said.append) == "cpu" and len(said) == 1
    with pytest.raises(QaoptError, match=r"training.device: cuda is required .*training.device: auto"):
        training_device(TrainingSpec(device="cuda", required=True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert training_device(TrainingSpec(device="auto")) == "cuda"
    assert training_device(TrainingSpec(device="cpu")) == "cpu"


def test_the_specs_learning_rate_and_batch_size_train_ladders_and_candidates(tiny_nn, tmp_path):
    space = KnobSpace.from_section({"pruning": {"ladder": {"step": 0.25, "finetune_steps": 4}},
                                    "finetune": {"lr": 1e-4, "batch_size": 8}})
    knobs = space.base(prune_ratio=0.25)
    assert (knobs.finetune_lr, knobs.finetune_batch_size) == (1e-4, 8)
    assert ladder_of(tiny_nn, knobs, cache_dir=tmp_path).finetune == FinetuneRecipe(lr=1e-4, batch_size=8)
    default = Knobs(**{**knobs.model_dump(), "finetune_lr": 0.0, "finetune_batch_size": 0})
    assert ladder_of(tiny_nn, default, cache_dir=tmp_path).key != ladder_of(tiny_nn, knobs, cache_dir=tmp_path).key
    assert build(tiny_nn, knobs, cache_dir=tmp_path).key != build(tiny_nn, default, cache_dir=tmp_path).key


def test_optimize_builds_the_ladders_first_and_trials_take_their_rungs(tmp_path):
    """End to end on the tiny app: the ladders stage builds every rung, writes the run's table, and the
    studies' pruned candidates are rungs of it (no candidate pruned from scratch); a run resumed past its
    agnostic search does not build them again."""
    import io
    import json

    import yaml
    from rich.console import Console

    from qaopt import optimize
    from qaopt.stages.ladders import LADDERS_FILE
    from tests.test_optimize import _spec

    spec = _spec(tmp_path, **{"approximations.all.pruning": {"ratio": [0.0, 0.75], "round_to": 4,
                                                              "ladder": {"step": 0.25, "finetune_steps": 10}},
                           "search.merge": []})  # the ladders of the NNs apart are what this test is about
    result = optimize(spec, profile="quick", trials=4, console=Console(file=io.StringIO()))
    table = json.loads((spec.parent / "runs" / LADDERS_FILE).read_text())["data"]
    assert set(table) == {"a", "b"} and [r["ratio"] for r in table["a"]] == [0.25, 0.5, 0.75]
    configurations = [t.configuration for s in result.studies.values() for t in s.trials if t.configuration is not None]
    knobs = [c.knobs for config in configurations for c in config.nns.values()]
    pruned = [k for k in knobs if k["prune_ratio"] > 0]
    assert pruned and all(k["ladder_step"] == 0.25 and k["ladder_finetune_steps"] == 10 for k in pruned)

    # Resumed after both searches on a machine whose cache is empty (another cache folder): the ladders are not
    # built again (the stage reads its table back), and the run decides what it decided.
    data = yaml.safe_load(spec.read_text())
    data["output"]["cache_dir"] = "fresh-cache"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    resumed = optimize(spec, profile="quick", trials=4, console=Console(file=io.StringIO()))
    assert "pruning ladders" in resumed.read_back
    assert json.loads((spec.parent / "runs" / LADDERS_FILE).read_text())["data"] == table
    for mode in ("aware", "agnostic"):
        first, again = getattr(result, mode), getattr(resumed, mode)
        assert (first is None) == (again is None)
        if first is not None:
            assert {n: c.knobs for n, c in first.nns.items()} == {n: c.knobs for n, c in again.nns.items()}
    # Agnostic studies with trials left walk the ladders: they are built first again.
    more = optimize(spec, profile="quick", trials=5, console=Console(file=io.StringIO()))
    assert "pruning ladders" not in more.read_back
    assert sum(len(s.trials) for s in more.studies.values()) > sum(len(s.trials) for s in result.studies.values())


def test_the_ladder_command_tabulates_every_rung_and_names_a_missing_ladder(tmp_path, monkeypatch):
    import re
    import textwrap
    from pathlib import Path

    from typer.testing import CliRunner

    from qaopt.cli import app
    from tests.test_approx_cli import SPEC

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "220")
    spec = tmp_path / "app.yaml"
    laddered = SPEC.replace("steps: 1, per_layer: {PER_LAYER}", "ladder: {step: 0.25, finetune_steps: 5}")
    spec.write_text(textwrap.dedent(laddered))
    result = CliRunner().invoke(app, ["approx", "ladder", str(spec), "--nn", "heading", "--no-latency", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if re.match(r"^│\s+0\.(0|25|5)\s+│", line)]
    assert len(rows) == 3, result.output  # the reference and rungs 0.25 and 0.5
    bad = CliRunner().invoke(app, ["approx", "ladder", str(spec), "--nn", "heading", "--device", "tpu"])
    assert bad.exit_code != 0 and "--device tpu: use one of auto, cpu, cuda" in f"{bad.output}{bad.exception}"
    spec.write_text(textwrap.dedent(SPEC.replace("{PER_LAYER}", "{}")))
    missing = CliRunner().invoke(app, ["approx", "ladder", str(spec), "--nn", "heading"])
    assert missing.exit_code != 0 and "pruning has no ladder section" in f"{missing.output}{missing.exception}"


def test_training_precision_auto_takes_bf16_only_on_a_cpu_that_computes_it(monkeypatch):
    import qaopt.training as training

    said = []
    monkeypatch.setattr(training, "native_bf16", lambda device: True)
    assert finetune_recipe(TrainingSpec(), "cpu", said.append).precision == "bf16"
    assert len(said) == 1 and "bf16 mixed precision" in said[0] and "training.precision: fp32" in said[0]
    assert finetune_recipe(TrainingSpec(), "cuda", said.append).precision == "fp32", "GPUs: fp32 unless asked"
    assert finetune_recipe(TrainingSpec(precision="fp32"), "cpu", said.append).precision == "fp32"
    monkeypatch.setattr(training, "native_bf16", lambda device: False)
    assert finetune_recipe(TrainingSpec(), "cpu", said.append).precision == "fp32" and len(said) == 1
    assert finetune_recipe(TrainingSpec(precision="bf16"), "cpu", said.append).precision == "bf16"
    assert len(said) == 2 and "emulates it" in said[1]
