"""pareto.png: latency on a log axis, trials coloured by knob family, the reference and chosen configurations marked."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgba

from qaopt.report import knob_family, pareto_figure, plot_pareto
from qaopt.result import Configuration, Fidelity, NNChoice, Result, Speedups, StudySummary, TrialRecord


def _config(trial: int | None, ms: float, knobs: dict, serves: list[str] | None = None) -> Configuration:
    nns = {nn: NNChoice(knobs=knobs, candidate=f"{nn}-{trial}", error=0.0, metric="l1", backend="torch",
                        latency_ms=ms / 2, memory_bytes=2**20, macs=0, params=0, serves=serves or [])
           for nn in ("heading", "distance")}
    return Configuration(trial=trial, nns=nns, schedule="sequential", latency_ms=ms, memory_bytes=2 * 2**20,
                         errors={}, in_region=True)


def _trial(number: int, config: Configuration) -> TrialRecord:
    return TrialRecord(number=number, state="complete", params={}, feasible=True,
                       objectives={"latency": config.latency_ms, "memory": 2.0}, configuration=config)


def _result(tmp_path) -> Result:
    """A run whose trials span 0.5 ms to 624 ms, as one slow bf16 trial makes them."""
    reference = _config(None, 20.0, {})
    aware = _config(3, 0.5, {"input_scale": 0.5, "dtype": "int8"}, serves=["heading", "distance"])
    agnostic = _config(2, 8.0, {"dtype": "int8"})
    infeasible = [TrialRecord(number=4, state="complete", feasible=False, objectives={"latency": 3.0, "memory": 1.5},
                              params={"heading.dtype": "int8", "heading.input_scale": 0.25, "schedule": "parallel",
                                      "merge.heading+distance": False}),
                  TrialRecord(number=5, state="complete", feasible=False, objectives={"latency": 1.0, "memory": 0.5},
                              params={"heading.dtype": "int8", "distance.prune_ratio": 0.3, "schedule": "parallel",
                                      "merge.heading+distance": True})]
    trials = [_trial(0, reference.model_copy(update={"trial": 0})), _trial(1, _config(1, 624.0, {"dtype": "bf16"})),
              _trial(2, agnostic), _trial(3, aware), *infeasible]
    studies = {mode: StudySummary(name=mode, trials_complete=len(trials), trials_failed=0, trials_feasible=4,
                                  trials=trials) for mode in ("aware", "agnostic")}
    return Result(app="tiny", spec="tiny.yaml", spec_hash="0", profile="quick", run_dir=tmp_path, reference=reference,
                  aware=aware, agnostic=agnostic, agnostic_tolerance=0.02,
                  speedups=Speedups.of(reference, aware, agnostic), validations=[], fidelity=Fidelity.of(None, []),
                  studies=studies, region=tmp_path / "region.json", report=tmp_path / "report.md")


def test_knob_family_names_the_active_passes_in_pass_order():
    assert knob_family({"heading": {}, "distance": {"dtype": "fp32", "finetune_steps": 0}}) == "reference"
    assert knob_family({"heading": {"dtype": "int8"}, "distance": {}}) == "int8"
    assert knob_family({"heading": {"dtype": "int8"}, "distance": {"input_scale": 0.5}}) == "resolution+int8"
    assert knob_family({"heading": {"dtype": "int8", "prune_ratio": 0.5, "finetune_steps": 40},
                        "distance": {"input_scale": 0.5, "dtype": "bf16"}}) == "pruning+resolution+int8+bf16"
    both = ["heading", "distance"]
    assert knob_family({"heading": {"input_scale": 0.5, "dtype": "int8"}, "distance": {"dtype": "int8"}},
                       {"heading": both, "distance": both}) == "merged+resolution+int8"
    assert knob_family({"heading": {}}, {"heading": ["heading"]}) == "reference", "a candidate serving its NN alone"


def test_pareto_figure_puts_latency_on_a_log_axis_and_marks_the_chosen_configurations(tmp_path):
    result = _result(tmp_path)
    fig = pareto_figure(result)
    try:
        ax = fig.axes[0]
        assert ax.get_xscale() == "log"
        lo, hi = ax.get_xlim()
        assert lo < 0.5 and hi > 624.0
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels[:3] == ["reference: 20 ms", "application-agnostic, trial 2: 8 ms, 2.50x",
                              "application-aware, trial 3: 0.5 ms, 40.00x"]
        # Every trial has a family, the infeasible ones (no configuration) from their params.
        assert labels[-6:] == ["reference", "bf16", "int8", "resolution+int8", "merged+pruning+int8",
                               "merged+resolution+int8"]
        assert "aware study, infeasible" in labels and "agnostic study, feasible" in labels
        trials = ax.collections[0]  # the aware study's trials, in order: the infeasible ones (last) are hollow
        assert [tuple(c) == to_rgba("none") for c in trials.get_facecolors()] == [False] * 4 + [True] * 2
        assert all(c[3] > 0 for c in trials.get_edgecolors())
    finally:
        plt.close(fig)
    png = plot_pareto(result, tmp_path / "pareto.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_latency_axis_under_a_decade_wide_labels_its_ticks_as_plain_numbers(tmp_path):
    """The README's run spans 0.65 to 4.2 ms: matplotlib's default would label 6x10^-1 and 2x10^0 beside 1."""
    reference, aware = _config(None, 4.16, {}), _config(2, 0.655, {"dtype": "int8"}, serves=["heading", "distance"])
    agnostic = _config(None, 1.96, {"dtype": "bf16"})
    trials = [_trial(0, reference.model_copy(update={"trial": 0})), _trial(1, _config(1, 1.4, {"dtype": "int8"})),
              _trial(2, aware)]
    studies = {"aware": StudySummary(name="aware", trials_complete=3, trials_failed=0, trials_feasible=3,
                                     trials=trials)}
    result = Result(app="tiny", spec="tiny.yaml", spec_hash="0", profile="quick", run_dir=tmp_path,
                    reference=reference, aware=aware, agnostic=agnostic, agnostic_tolerance=0.02,
                    speedups=Speedups.of(reference, aware, agnostic), validations=[], fidelity=Fidelity.of(None, []),
                    studies=studies, region=tmp_path / "region.json", report=tmp_path / "report.md")
    fig = pareto_figure(result)
    try:
        fig.canvas.draw()
        lo, hi = fig.axes[0].get_xlim()
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels(which="both")
                  if t.get_text() and lo <= t.get_position()[0] <= hi]
        assert "1" in labels and len(labels) > 2, labels
        assert all(label.replace(".", "", 1).isdigit() for label in labels), labels
    finally:
        plt.close(fig)
