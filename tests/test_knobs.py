"""The knobs that spend an application's headroom: input resolution and merged NNs, built, measured and shipped."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from qaopt.approx import ErrorMetric, Knobs, TargetNN
from qaopt.approx.knobs import describe
from qaopt.approx.merge import MergeGroup, OutputColumns, build_merged
from qaopt.approx.resolution import InputResize
from qaopt.kernels import onnx as onnx_toolchain
from qaopt.seeding import Screening, Unit, cheapest_and_fallback, cheapest_precision, combinations, walk
from tests.test_approx_build import FAST, SHAPE, build, stripe_data, train_base

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pair() -> tuple[TargetNN, TargetNN]:
    """Two NNs that read the same frames: the stripe's offset (degrees) and a ratio derived from it."""
    data = stripe_data()
    ratio = SimpleNamespace(**{**vars(data), "y_train": 0.5 + data.y_train / 100, "y_val": 0.5 + data.y_val / 100})
    a = TargetNN("heading", train_base(data), data, SHAPE, ErrorMetric("l1", 0))
    b = TargetNN("distance", train_base(ratio), ratio, SHAPE, ErrorMetric("l1", 0))
    return a, b


def test_a_resolution_candidate_resizes_inside_its_graph_and_takes_the_full_frame(pair, tmp_path):
    heading = pair[0]
    fp32 = build(heading, Knobs(input_scale=0.5, input_align=4, finetune_steps=20), cache_dir=tmp_path)
    assert isinstance(fp32.module, InputResize) and fp32.module.size == (12, 16)
    assert fp32.input_shape == SHAPE, "the candidate still takes the application's full-size frame"
    assert fp32.macs < build(heading, Knobs(), cache_dir=tmp_path).macs / 3
    truth = heading.data.y_val
    assert fp32.error < 0.5 * np.abs(truth - truth.mean()).mean(), "distilled at the lower resolution, it still works"
    int8 = build(heading, Knobs(input_scale=0.5, input_align=4, finetune_steps=20, dtype="int8"), cache_dir=tmp_path)
    x = heading.data.x_val[:16]
    assert int8.predict(x).shape == (16, 1)
    np.testing.assert_allclose(int8.predict(x), fp32.predict(x), atol=0.3 * np.abs(fp32.predict(x)).max())


@pytest.mark.parametrize("frame, size, exact", [((240, 320), (180, 240), True), ((240, 320), (120, 160), True),
                                               ((24, 32), (18, 32), True), ((240, 320), (90, 120), False),
                                               ((240, 320), (176, 240), False)])
def test_a_block_resize_is_bilinear_interpolation_in_ordinary_layers(frame, size, exact, tmp_path):
    """Ratios of at most 4 pixels a block (3/4, 1/2) resize as a strided grouped convolution, the same function as
    ``F.interpolate`` (which rounds its sampling positions to float32), exported without ONNX ``Resize``; 3/8 and
    240 to 176 (11/15) fall back to it."""
    import onnx

    shape = (2, 3, *frame)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, 2, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    resized = InputResize(net, size, shape).eval()
    assert (resized.resize is not None) == exact
    x = torch.rand(shape)
    interpolated = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
    with torch.no_grad():
        inner = resized.resize(x) if exact else interpolated
        np.testing.assert_allclose(inner.numpy(), interpolated.numpy(), atol=5e-5)
        out = resized(x).numpy()
        forced = InputResize(net, size, shape, block=True).resize(x)  # any ratio is exact, only slower where not used
        np.testing.assert_allclose(forced.numpy(), interpolated.numpy(), atol=5e-5)
    path = onnx_toolchain.export_onnx(resized, [torch.zeros(shape)], tmp_path / "resized.onnx")
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert ("Resize" in ops) != exact and (("Conv" in ops) if exact else True)
    session = onnx_toolchain.ort_session(path)
    np.testing.assert_allclose(session.run(None, {"input": x.numpy()})[0], out, atol=1e-5)


def test_a_scale_adapted_once_is_shared_by_every_candidate_at_it(pair, tmp_path, monkeypatch):
    """With ``input_adapt_steps`` the NN is adapted to its scale once: the int8 candidate and a pruned one at that
    scale start from the stored adaptation (no second adaptation run), the unpruned one is that NN exactly, and the
    pruned one's own fine-tuning only recovers its pruning."""
    from qaopt.approx.finetune import Distiller

    heading = pair[0]
    runs: list[int] = []
    real_run = Distiller.run
    monkeypatch.setattr(Distiller, "run", lambda self, model, steps, *a, **k: (runs.append(steps),
                                                                               real_run(self, model, steps, *a, **k))[1])
    adapted = Knobs(input_scale=0.5, input_align=4, input_adapt_steps=30)
    fp32 = build(heading, adapted, cache_dir=tmp_path)
    assert runs == [30], "the adaptation ran once, and no candidate fine-tuning after it"
    assert isinstance(fp32.module, InputResize) and fp32.module.size == (12, 16)
    shared = list((tmp_path / "approx" / "shared").iterdir())
    assert len([f for f in shared if f.is_dir() and not f.name.startswith(".")]) == 1
    build(heading, adapted.model_copy(update={"dtype": "int8"}), cache_dir=tmp_path)
    pruned = build(heading, adapted.model_copy(update={"prune_ratio": 0.5, "finetune_steps": 10}), cache_dir=tmp_path)
    assert runs == [30, 10], "the pruned candidate started from the stored adaptation; its budget recovered the pruning"
    assert isinstance(pruned.module, InputResize) and pruned.macs < fp32.macs
    truth = heading.data.y_val
    assert fp32.error < 0.5 * np.abs(truth - truth.mean()).mean(), "adapted at the lower resolution, it still works"
    own = build(heading, Knobs(input_scale=0.5, input_align=4, finetune_steps=30), cache_dir=tmp_path)
    assert own.key != fp32.key, "adapted by its own budget, a candidate is another candidate"
    assert describe(adapted)["input scale"] == "0.5, adapted 30 steps" and describe(own.knobs)["input scale"] == "0.5"


def test_adaptation_is_offered_only_at_a_lower_scale_and_leaves_nothing_to_fine_tune(pair):
    from qaopt.approx import KnobSpace
    from qaopt.approx.passes import SearchLimits

    section = {"resolution": {"scales": [1.0, 0.5], "adapt_steps": 1000}, "finetune": {"steps": [100, 400]}}
    space = KnobSpace.from_section(section, SearchLimits(max_adapt_steps=160))
    assert space.base(input_scale=0.5).input_adapt_steps == 160, "the profile caps the adaptation"
    assert not space.offers("finetune_steps", space.base(input_scale=0.5)), "nothing left to recover"
    assert space.offers("finetune_steps", Knobs(input_scale=0.5)), "adapted by the candidate's budget: it is searched"
    assert KnobSpace.from_section(section).base(input_scale=0.5).input_adapt_steps == 1000


def test_merged_views_carry_each_heads_own_error_on_its_own_data(pair, tmp_path):
    group = MergeGroup(pair, finetune_steps=150)
    views = build_merged(group, Knobs(), cache_dir=tmp_path, onnx=onnx_toolchain, recipe=FAST)
    assert set(views) == {"heading", "distance"}
    assert len({v.key for v in views.values()}) == 1, "one candidate serves both NNs"
    assert all(v.serves == ("heading", "distance") for v in views.values())
    assert views["heading"].columns == (0,) and views["distance"].columns == (1,)
    for nn_ in pair:
        view = views[nn_.name]
        with torch.inference_mode():
            whole = view.module(torch.from_numpy(nn_.data.x_val)).numpy()
        assert whole.shape == (len(nn_.data.x_val), 2)
        np.testing.assert_allclose(view.predict(nn_.data.x_val), whole[:, view.columns], rtol=1e-5, atol=1e-6)
        assert view.error == pytest.approx(np.abs(whole[:, view.columns] - nn_.data.y_val).mean(), rel=1e-5)
    # The new head learned its NN's outputs, in its own unit (a ratio's error, not the degrees').
    ratio = pair[1].data.y_val
    assert views["distance"].error < 0.5 * np.abs(ratio - ratio.mean()).mean()


def test_a_long_merge_distillation_says_how_far_it_is(pair, tmp_path, monkeypatch):
    """A merged NN's distillation runs for minutes once per cache: it reports its steps and the time left, not
    silence (a log showed 31 minutes without a line on a CPU without bf16)."""
    import qaopt.approx.finetune as finetune
    from qaopt.approx.merge import merged_target

    monkeypatch.setattr(finetune, "REPORT_EVERY_S", 0.0)
    said: list[str] = []
    merged_target(MergeGroup(pair, finetune_steps=4), cache_dir=tmp_path, recipe=FAST, progress=said.append)
    assert said[0] == "merging heading, distance into one backbone: distilling 4 steps (once per cache)"
    steps = [line for line in said[1:] if " of 4 steps in " in line]
    assert [line.split(": ")[1].split(" of")[0] for line in steps] == ["1", "2", "3"], said
    assert all(line.endswith("min left") for line in steps)
    said.clear()
    merged_target(MergeGroup(pair, finetune_steps=4), cache_dir=tmp_path, recipe=FAST, progress=said.append)
    assert said == [], "read back from the cache, it has nothing to report"


def test_a_merged_nn_is_the_same_bytes_whatever_ran_before_it(pair, tmp_path):
    """Its cache key names what it is built from, so two builds under one key must be one NN: the widened output
    layer's new rows are drawn after seeding, not from whatever state earlier work left torch's generator in."""
    from qaopt.approx.merge import merged_target

    built = []
    for i, draws in enumerate((0, 7)):
        torch.randn(draws)  # earlier work in the process
        target = merged_target(MergeGroup(pair, finetune_steps=4), cache_dir=tmp_path / str(i), recipe=FAST)
        built.append(target.model.state_dict())
    assert built[0].keys() == built[1].keys() and all(torch.equal(built[0][k], built[1][k]) for k in built[0])


def test_a_frozen_backbone_stays_the_leads_and_the_new_head_learns_on_its_features(pair, tmp_path):
    """A group that freezes its lead's backbone distils only what reads it, on features computed once: the backbone
    comes out bit for bit the lead's, the widened head still learns the other NN's outputs in its unit, and the
    merged NN is keyed apart from the one distilled end to end."""
    from qaopt.approx.merge import merged_target

    frozen = MergeGroup(pair, finetune_steps=150, freeze="backbone")
    target = merged_target(frozen, cache_dir=tmp_path, recipe=FAST)
    lead = pair[0]  # equal MACs: the first listed leads
    kept, trained = target.model.model.backbone.state_dict(), lead.model.backbone.state_dict()
    assert kept.keys() == trained.keys() and all(torch.equal(kept[k], trained[k]) for k in kept)
    end_to_end = merged_target(MergeGroup(pair, finetune_steps=150), cache_dir=tmp_path, recipe=FAST)
    assert target.architecture != end_to_end.architecture
    views = build_merged(frozen, Knobs(), cache_dir=tmp_path, onnx=onnx_toolchain, recipe=FAST)
    ratio = pair[1].data.y_val
    assert views["distance"].error < 0.5 * np.abs(ratio - ratio.mean()).mean()


def test_end_to_end_steps_after_a_frozen_distillation_adapt_the_backbone_and_key_the_nn_apart(pair, tmp_path):
    """End-to-end steps continue from the frozen distillation: the head it learned is where they start (the same
    seeded frozen phase), the backbone leaves the lead's weights, and the NN is keyed apart from the frozen one,
    whose key stays what it was."""
    from qaopt.approx.merge import merged_target

    frozen = merged_target(MergeGroup(pair, finetune_steps=40, freeze="backbone"), cache_dir=tmp_path, recipe=FAST)
    polished = merged_target(MergeGroup(pair, finetune_steps=40, freeze="backbone", end_to_end_steps=20),
                             cache_dir=tmp_path, recipe=FAST)
    assert polished.architecture != frozen.architecture
    lead, kept = pair[0].model.backbone.state_dict(), polished.model.model.backbone.state_dict()
    assert any(not torch.equal(kept[k], lead[k]) for k in kept if kept[k].is_floating_point())
    again = merged_target(MergeGroup(pair, finetune_steps=40, freeze="backbone"), cache_dir=tmp_path, recipe=FAST)
    assert again.architecture == frozen.architecture


def test_end_to_end_steps_without_a_frozen_part_are_refused(pair):
    from qaopt.approx import ApproxError

    with pytest.raises(ApproxError, match="without freeze every step is end to end"):
        MergeGroup(pair, finetune_steps=40, end_to_end_steps=20)


def test_a_frozen_backbones_distillation_needs_no_batch_converted_only_its_rows(pair, tmp_path, monkeypatch):
    """Each step replays the frozen part's outputs for the batch's rows, so the frames the student reads before it
    are one stand-in batch converted once: the merged NN comes out bit for bit the one trained on each batch's own
    frames."""
    from qaopt.approx import merge
    from qaopt.approx.merge import merged_target

    frozen = MergeGroup(pair, finetune_steps=30, freeze="backbone")
    stand_in = merged_target(frozen, cache_dir=tmp_path / "stand-in", recipe=FAST).model.state_dict()

    def own_frames(self, rows):
        self.replay.rows = np.arange(len(self.frames))[rows]
        return self.frames[rows]

    monkeypatch.setattr(merge._ReplayedFrames, "__getitem__", own_frames)
    own = merged_target(frozen, cache_dir=tmp_path / "own", recipe=FAST).model.state_dict()
    assert stand_in.keys() == own.keys() and all(torch.equal(stand_in[k], own[k]) for k in own)


def test_a_frozen_distillation_keeps_the_merged_nns_outputs_as_its_students_teacher(pair, tmp_path):
    """Distilling on the frozen part's replayed outputs leaves the merged NN's outputs on its training frames where
    its students' distillation reads them: the numbers the whole NN computes, to the bit."""
    import copy

    from qaopt.approx.cache import Store
    from qaopt.approx.merge import merged_target
    from qaopt.approx.quantize import predict_torch

    target = merged_target(MergeGroup(pair, finetune_steps=30, freeze="backbone"), cache_dir=tmp_path, recipe=FAST)
    kept = Store(tmp_path).teacher_outputs(target.fingerprint)
    assert kept is not None
    whole = predict_torch(copy.deepcopy(target.model).float().eval(), target.data.x_train)
    assert np.array_equal(kept, whole)


@pytest.mark.parametrize(("pre", "stand_in"), [
    (torch.nn.Identity(), (3, 1, 1)),
    (torch.nn.BatchNorm2d(3), None),  # a training step would move its running statistics
    (torch.nn.Conv2d(3, 3, 5), None),  # needs at least 5x5 pixels
])
def test_the_frozen_phase_reads_one_value_per_channel_where_nothing_before_the_frozen_part_needs_the_frame(
        pre, stand_in):
    from qaopt.approx.merge import _Replay, _small_stand_in

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pre, self.backbone, self.head = pre, torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.backbone(self.pre(x)).mean((2, 3)))

    net, frames = Net(), np.random.default_rng(0).random((6, 3, 12, 16), dtype=np.float32)
    net.backbone = _Replay(torch.randn(6, 4, 6, 8))
    assert _small_stand_in(net, net.backbone, frames) == stand_in
    assert net.training, "the probe leaves the model in the mode it found it in"


@pytest.mark.parametrize(("freeze", "message"), [
    ("trunk", "has no submodule 'trunk'; its top-level submodules are ['backbone', 'head']"),
    ("head", "'head' holds NN 'heading''s output layer"),
])
def test_a_freeze_the_lead_cannot_take_is_refused_before_any_step(pair, tmp_path, freeze, message):
    from qaopt.approx import ApproxError
    from qaopt.approx.merge import merged_target

    with pytest.raises(ApproxError, match=re.escape(message)):
        merged_target(MergeGroup(pair, finetune_steps=150, freeze=freeze), cache_dir=tmp_path, recipe=FAST)
    assert not list((tmp_path / "merged").glob("*/*")), "nothing half-trained is stored"


def test_a_merged_int8_graph_keeps_the_small_unit_head_accurate(pair, tmp_path):
    """The output's columns are in different units: a single int8 scale on the output would erase the ratio."""
    group = MergeGroup(pair, finetune_steps=150)
    fp32 = build_merged(group, Knobs(), cache_dir=tmp_path, onnx=onnx_toolchain, recipe=FAST)
    int8 = build_merged(group, Knobs(dtype="int8"), cache_dir=tmp_path, onnx=onnx_toolchain, recipe=FAST)
    assert int8["distance"].error < 1.5 * fp32["distance"].error + 1e-3


def test_merging_refuses_nns_of_different_inputs(pair):
    a, b = pair
    other = TargetNN("other", b.model, SimpleNamespace(**{**vars(b.data)}), SHAPE, ErrorMetric("l1", 0))
    object.__setattr__(other, "input_shape", (1, 3, 12, 16))
    with pytest.raises(Exception, match="inputs of different shapes"):
        MergeGroup((a, other), finetune_steps=1)


def test_output_columns_select_one_members_outputs():
    merged = torch.nn.Linear(3, 4)
    x = torch.randn(5, 3)
    assert torch.equal(OutputColumns(merged, [1, 3])(x), merged(x)[:, [1, 3]])


# ------------------------------------------------------------ informed first trials


def test_combinations_take_at_most_one_probe_per_family():
    probes = [{"dtype": "int8"}, {"dtype": "bf16"}, {"input_scale": 0.5}]
    combos = combinations(probes)
    assert () in combos and ({"dtype": "int8"}, {"input_scale": 0.5}) in combos
    assert len(combos) == 3 * 2
    assert not any(len([p for p in c if "dtype" in p]) > 1 for c in combos)


def test_the_walk_bisects_for_the_cheapest_feasible_option_within_its_budget():
    tried = []

    def feasible(option):
        tried.append(option)
        return option >= 6

    options = [(float(o), o) for o in (9, 1, 4, 2, 3, 5, 6, 7, 8, 10, 11)]
    accepted = walk(options, feasible)
    assert accepted[-1] == (6.0, 6) and accepted == sorted(accepted, reverse=True), "each accepted option cheaper"
    assert len(tried) <= 4 and tried[0] == 6, "bisection starts in the middle"
    assert walk(options, feasible, budget=1) == [(6.0, 6)] and walk(options, lambda o: False) == []


def test_informed_trials_walk_the_cheaper_layout_first_and_keep_a_milder_fallback():
    tried = []

    def judge(option, bound):
        tried.append(option)
        # An option: (layout, aggressiveness); the milder, the more likely inside.
        return (float(option[1]), option) if 4 <= option[1] < bound else None

    merged = [(float(k), ("merged", k)) for k in range(1, 13)]
    apart = [(float(k), ("apart", k)) for k in range(10, 30)]
    chosen = cheapest_and_fallback([apart, merged], judge)
    assert chosen[0] == (4.0, ("merged", 4)), "the cheapest the walks found"
    assert chosen[1][0] > chosen[0][0] and chosen[1][1][0] == "merged", "the dearest they found: a milder fallback"
    assert all(layout == "merged" for layout, _ in tried), "no apart option is estimated below the merged find"
    assert [o[1] for o in tried][:3] == [6, 3, 4]
    # One layout, one option inside: no fallback; nothing inside: no informed trial.
    assert cheapest_and_fallback([[(1.0, ("m", 1)), (5.0, ("m", 5))]],
                                 lambda o, bound: (5.0, o) if o[1] == 5 else None) == [(5.0, ("m", 5))]
    assert cheapest_and_fallback([merged], lambda o, bound: None) == []
    # Nothing estimated as slow as the reference is walked: a fallback must be faster than the reference trial.
    tried.clear()
    assert cheapest_and_fallback([apart, merged], judge, ceiling=5.0) == [(4.0, ("merged", 4))]
    assert all(o[1] < 5 for o in tried)
    # A later walk's weights are judged only in precisions estimated below what an earlier walk found.
    seen = []

    def judge_bounded(weights, bound):
        seen.append((weights, bound))
        return (4.0, weights) if weights == "merged" else None

    assert cheapest_and_fallback([[(2.0, "merged")], [(3.0, "apart")]], judge_bounded, ceiling=9.0) == [
        (4.0, "merged")]
    assert seen == [("merged", 9.0), ("apart", 4.0)]


def test_the_fallback_runs_other_weights_than_the_cheapest_not_another_precision_of_them():
    """On CropFollow's hard seeds the merged NN at a reduced input fails the same closed-loop run in fp32 and in int8:
    one weights errs alike in every precision. A fallback of the same weights is no fallback: the dearest
    find with other weights is, else the cheapest's layout with no knob but precisions (the merged NN at full
    resolution)."""
    # Weights: an input scale; judged, each weights becomes (scale, its cheapest precision inside).
    precision = {0.5: "int8", 0.75: "fp32", 1.0: "int8"}

    def judge_of(inside, estimates):
        return lambda scale, bound: ((estimates[scale], (scale, precision[scale]))
                                     if scale in inside and estimates[scale] < bound else None)

    options = [(1.0, 0.5), (3.0, 0.75)]
    estimates = {0.5: 1.0, 0.75: 3.0, 1.0: 4.0}
    chosen = cheapest_and_fallback([options], judge_of({0.5, 1.0}, estimates), relaxed=lambda scale: 1.0)
    assert chosen == [(1.0, (0.5, "int8")), (4.0, (1.0, "int8"))], "the relaxed weights: input 1.0"
    # The relaxed weights are enqueued only inside the region and below the reference, and only when they differ.
    assert cheapest_and_fallback([options], judge_of({0.5}, estimates), relaxed=lambda scale: 1.0) == [
        (1.0, (0.5, "int8"))]
    assert cheapest_and_fallback([options], judge_of({0.5, 1.0}, estimates), ceiling=3.5,
                                 relaxed=lambda scale: 1.0) == [(1.0, (0.5, "int8"))]
    assert cheapest_and_fallback([[(4.0, 1.0)]], judge_of({1.0}, estimates), relaxed=lambda scale: 1.0) == [
        (4.0, (1.0, "int8"))]
    # A find with other weights is preferred to the relaxed weights.
    precision[0.9], estimates[0.9] = "int8", 3.5
    assert cheapest_and_fallback([[*options, (3.5, 0.9)]], judge_of({0.5, 0.75, 1.0}, estimates),
                                 relaxed=lambda scale: 1.0) == [(1.0, (0.5, "int8")), (3.0, (0.75, "fp32"))]


def test_a_weights_is_judged_at_its_cheapest_precision_then_its_own_then_between():
    """The precisions of one weights barely move its error: the cheapest mix first (one build where it is inside),
    the weights' own precision next (outside there, outside at any), then bisection between."""
    options = [(1.0, "int8+int8"), (1.5, "int8+bf16"), (2.0, "bf16+bf16"), (2.5, "fp32+bf16"), (3.0, "fp32+fp32")]

    def judged(inside):
        tried = []

        def feasible(option):
            tried.append(option)
            return option in inside
        return feasible, tried

    feasible, tried = judged(set(o for _, o in options))
    assert cheapest_precision(options, feasible) == (1.0, "int8+int8") and tried == ["int8+int8"]
    feasible, tried = judged(set())
    assert cheapest_precision(options, feasible) is None and tried == ["int8+int8", "fp32+fp32"]
    feasible, tried = judged({"bf16+bf16", "fp32+bf16", "fp32+fp32"})
    assert cheapest_precision(options, feasible) == (2.0, "bf16+bf16")
    assert tried == ["int8+int8", "fp32+fp32", "bf16+bf16", "int8+bf16"]
    feasible, tried = judged({"fp32+fp32"})
    assert cheapest_precision(options, feasible, budget=1) == (3.0, "fp32+fp32"), "its own precision, inside"
    assert cheapest_precision([], feasible) is None


def test_each_precision_alone_is_a_trial_apart_and_then_on_each_merged_nn():
    from qaopt.plan import MergePlan
    from qaopt.seeding import precision_trials

    group = MergePlan(("heading", "distance"), 300)
    reference = {"heading.dtype": "fp32", "distance.dtype": "fp32", "lane.dtype": "fp32", group.param: False}
    knobs = {nn: Knobs() for nn in ("heading", "distance", "lane")}
    dtypes = [{"dtype": "bf16"}, {"dtype": "int8"}]
    probes = {"heading": dtypes, "distance": dtypes, "lane": [{"dtype": "int8"}, {"input_scale": 0.5}]}
    trials = precision_trials(reference, knobs, probes, {group: "heading"})
    assert trials == [
        {**reference, "heading.dtype": "bf16", "distance.dtype": "bf16"},
        {**reference, "heading.dtype": "int8", "distance.dtype": "int8", "lane.dtype": "int8"},
        {**reference, "lane.input_scale": 0.5},
        # then the merged NN at each of its lead's probes: merging at full resolution, no other knob
        {**reference, group.param: True, "heading.dtype": "bf16"},
        {**reference, group.param: True, "heading.dtype": "int8"},
    ]
    assert precision_trials(reference, knobs, {**probes, "heading": []}, {group: "heading"})[-1] == {
        **reference, "lane.input_scale": 0.5}, "a lead without probes adds no merged trial"


def test_estimates_multiply_the_probes_factors_and_slow_probes_are_flagged():
    unit = Unit("heading")
    screening = Screening({unit: 10.0}, {unit: {(("dtype", "int8"),): 0.3, (("input_scale", 0.5),): 0.25,
                                                (("dtype", "bf16"),): 40.0}})
    assert screening.estimate(unit, ({"dtype": "int8"}, {"input_scale": 0.5})) == pytest.approx(0.75)
    assert screening.slower_everywhere({"dtype": "bf16"}) and not screening.slower_everywhere({"dtype": "int8"})
