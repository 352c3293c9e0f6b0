"""``report.md`` and its plots: what a robotics team reads after ``qaopt optimize``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.artist import Artist  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogFormatter  # noqa: E402

from qaopt.agnostic import AGNOSTIC_STUDY_PREFIX  # noqa: E402
from qaopt.app_spec import store  # noqa: E402
from qaopt.app_spec.nn_errors import is_class_metric  # noqa: E402
from qaopt.tolerance import Tolerance  # noqa: E402
from qaopt.approx import Knobs, describe  # noqa: E402
from qaopt.approx.passes import knob_owners, passes  # noqa: E402
from qaopt.result import (  # noqa: E402
    AgnosticRule,
    Configuration,
    ConvergenceCurve,
    Fidelity,
    InformedStart,
    Latency,
    Result,
    StudySummary,
    TrialRecord,
    Validation,
    format_errors,
)

MiB = 2**20
METRICS_NOTE = ("Counts (metrics reported as whole numbers per run, such as collisions or crashes) are totals over "
                "the runs; every other metric (distances, gaps, rates) is the mean per run, since a sum of them means "
                "nothing. In brackets: the value in the worst run, the run whose QoS metric is worst.")
MEASUREMENT_NOTE = (
    "Each latency is the median of its samples, with its 95 % interval in brackets: of the median (order statistics) "
    "for one NN, of the sum of medians (percentile bootstrap, each NN resampled on its own) for a sequential frame. "
    "Every measurement pins its threads to the target's cores and watches them: when other processes or the "
    "hypervisor took more than 10 % of them, it is measured again, and still disturbed (or too uncertain) it is "
    "marked *untrusted*. A speedup is the ratio of medians with a 95 % percentile-bootstrap interval; one whose "
    "interval includes 1.0, or whose two sides are the same NNs, is no measurable difference. A frame of several "
    "models was timed on each schedule the target allows (in sequence on all its cores, or in parallel on a share "
    "each) and runs on the faster, whichever its search chose: the schedule column, the other's figure in "
    "brackets.")
PARETO_NOTE = ("Every trial by its latency per frame (log scale: equal horizontal distances are equal speedups) "
               "and peak memory, coloured by its knob family (the approximations its NNs use; *merged*: one NN serves "
               "several); filled = feasible, hollow = infeasible. The reference, application-agnostic and "
               "application-aware configurations are marked, with their speedups in the legend.")
INFORMED_NOTE = ("Before sampling, each probe (a dtype, an input scale) was built alone on each unit's reference NN "
                 "(a unit: an NN alone, or a merge group's merged NN), without fine-tuning, and timed untuned; a "
                 "combination's frame latency is estimated from those factors. The walk then bisected over weights "
                 "(input scales, merged or apart) by their estimate at the cheapest precision, for the cheapest "
                 "inside the region, judging each weights at its cheapest precision first, then at its own; each "
                 "combination built as its trials build it (a damaged NN with the full fine-tuning budget, one only "
                 "quantized with none): the cheapest inside and a milder fallback became the first trials after the "
                 "reference. Estimates only order the walk; the trials below measure the real latency.")
CHECKS_NOTE = ("The front's configurations nearest the region's boundary, run closed-loop while the search went on "
               "(search.closed_loop); a failure corrected the region for the trials after it.")
SEEDS_NOTE = ("Seeds: *selection* runs (the checks during the search and the front's validation) chose the "
              "configuration; the chosen one then ran again on *fresh* seeds that nothing before used, and that "
              "verdict accepts it. The application-agnostic configuration ran on the fresh seeds too.")

REBUILT_NOTE = ("These configurations' NNs were rebuilt into other bytes than the search measured (the approximation "
                "cache is not part of a run's state, and fine-tuning on a GPU is not bitwise reproducible: a run "
                "resumed on another machine or with a fresh cache rebuilds them). Each was measured again on its "
                "validation data and placed in the region again; the tables above use the rebuilt NNs' errors, and "
                "one no longer inside the region was neither validated nor chosen.")


STRESS_NOTE = (
    "Coordinates include the spec's stress strata (docs/calibration.md, \"Stress strata\"): on each NN's metric axis a "
    "configuration sits at the larger of its NN's error and the reference's error times the NN's worst ratio to the "
    "reference on a stratum (rates: plus the difference in rate points), so the errors in the tables below may exceed "
    "the chosen NNs' own. The reference NNs err on the strata:")


DETECTOR_NOTE = (
    "A detector's coordinate counts both its error kinds (docs/calibration.md, \"Where a candidate detector sits\"): "
    "calibration injected the other kind at the reference's ratio to the declared one, so a detector sits at the larger "
    "of its declared rate and its other rate over that ratio, and may sit above its own {metric}.")


def _strata_table(strata: dict[str, dict[str, float]]) -> str:
    names = list(dict.fromkeys(s for errors in strata.values() for s in errors))
    rows = ["| NN | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    rows += [f"| {nn} | " + " | ".join(f"{errors[s]:.4g}" for s in names) + " |" for nn, errors in strata.items()]
    return "\n".join(rows)


def _cost_rows(result: Result) -> list[str]:
    """The cost table's rows: each stage's seconds when it was computed, and which stages this process read back."""
    rows = []
    for stage in [*result.seconds, *(s for s in result.read_back if s not in result.seconds)]:
        seconds = f"{result.seconds[stage]:.1f}" if stage in result.seconds else "not recorded"
        where = " (an earlier process of this run; read back here)" if stage in result.read_back else ""
        rows.append(f"| {stage} | {seconds}{where} |")
    return rows


def write_report(result: Result, run_dir: Path) -> Path:
    """Write ``report.md`` and ``pareto.png`` into ``run_dir`` from ``result`` alone; ``region.png`` comes from the region stage.

    A pure function of the result, so an old ``result.json`` gives the same report again.
    """
    pareto = plot_pareto(result, run_dir / "pareto.png")
    lines = [f"# qaopt report: {result.app}", ""]
    lines += [
        f"Spec `{result.spec}` (hash `{result.spec_hash}`), profile `{result.profile}`.",
        "",
        "## Outcome",
        "",
        _outcome(result),
        "",
        "| configuration | latency per frame (ms) [95 % interval] | memory (MiB) | speedup vs reference | schedule |",
        "|---|---|---|---|---|",
        _row("reference (no approximation)", result.reference, "1.00x"),
    ]
    if result.agnostic:
        lines.append(_row("application-agnostic (each NN within its agnostic tolerance)", result.agnostic,
                          result.speedups.describe("agnostic")))
    if result.agnostic_by_point:
        lines.append(_row("application-agnostic by point error (each NN inside its bound by its point error)",
                          result.agnostic_by_point,
                          f"{result.reference.latency_ms / result.agnostic_by_point.latency_ms:.2f}x (not validated)"))
    if result.aware:
        lines.append(_row("application-aware (inside the error region)", result.aware, result.speedups.describe("aware")))
    lines += ["", "### Measurement", "", MEASUREMENT_NOTE, "", _epochs(result), ""]
    if result.rebuilt:
        lines += ["### Rebuilt NNs", "", REBUILT_NOTE, ""] + [f"- {r.line}" for r in result.rebuilt] + [""]
    lines += ["## Chosen NNs", ""]
    for title, config in (("application-aware", result.aware), ("application-agnostic", result.agnostic),
                          ("application-agnostic by point error", result.agnostic_by_point),
                          ("reference", result.reference)):
        if config is not None:
            lines += [f"### {title}", "", _nn_table(config), ""]
    if result.agnostic_rule is not None:
        lines += ["### The application-agnostic tolerance", "", _agnostic_rule(result.agnostic_rule), ""]
    lines += ["## Error region", "", "![error region](region.png)", "",
              f"Region from `{result.region.name}`; the reference NNs sit at {format_errors(result.reference.errors)}.", ""]
    if result.region_note:
        lines += [f"Region: {result.region_note}.", ""]
    if result.stress_strata:
        lines += [STRESS_NOTE, "", _strata_table(result.stress_strata), ""]
    detectors = sorted({nn.metric for config in (result.aware, result.agnostic, result.reference) if config is not None
                        for nn in config.nns.values() if is_class_metric(nn.metric)})
    if detectors:
        lines += [DETECTOR_NOTE.format(metric=" or ".join(m.replace("_", " ") for m in detectors)), ""]
    finals = [*result.validations, *(v for v in (result.acceptance, result.agnostic_validation) if v is not None)]
    confidence = result.validation_power.confidence if result.validation_power is not None else 0.9
    lines += ["## Closed-loop validation", "", SEEDS_NOTE, "", _validation_table(finals, confidence), ""]
    if finals:
        lines += [METRICS_NOTE, ""]
    if result.validation_power is not None:
        lines += [result.validation_power.line, ""]
    checks = result.studies["aware"].closed_loop_checks
    if checks:
        lines += ["### Closed-loop checks during the search", "", CHECKS_NOTE, "", _validation_table(checks), ""]
    lines += ["### Region fidelity", "", _fidelity(result.fidelity), ""]
    lines += ["## Search", "", f"![Pareto front]({pareto.name})", "", PARETO_NOTE, ""]
    if result.agnostic_converged is not None:
        curve = plot_convergence(result.agnostic_converged, run_dir / CONVERGENCE_PLOT)
        lines += ["### Application-agnostic baseline", "", _convergence(result.agnostic_converged), "",
                  f"![agnostic convergence]({curve.name})", ""]
    if result.left_out:
        lines += ["Left out of the search (the target cannot run them):", ""] + [f"- {v}" for v in result.left_out] + [""]
    lines += ["| study | complete | feasible | failed |", "|---|---|---|---|"]
    for mode, s in result.studies.items():
        lines.append(f"| {mode} | {s.trials_complete} | {s.trials_feasible} | {s.trials_failed} |")
    skipped = [f"{mode}: {s.skipped}" for mode, s in result.studies.items() if s.skipped]
    if skipped:
        lines += ["", "Not searched:", ""] + [f"- {line}" for line in skipped]
    held = [f"{mode}: {knob}: {why}" for mode, s in result.studies.items() for knob, why in s.held.items()]
    if held:
        lines += ["", "Held at the reference's setting (what approximates more errs more):", ""] + [
            f"- {line}" for line in held]
    failures = [f for s in result.studies.values() for f in s.failures]
    if failures:
        lines += ["", "Failed trials (the search went on):", ""] + [f"- {f}" for f in failures]
    unusable = [f"{mode} trial {t.number}: {t.infeasible}" for mode, s in result.studies.items() for t in s.trials
                if t.infeasible]
    if unusable:
        lines += ["", "Infeasible whatever their errors (the search went on):", ""] + [f"- {u}" for u in unusable]
    if (start := result.studies["aware"].informed) is not None:
        lines += ["", "### How the search started (aware study)", "", INFORMED_NOTE, "", _informed_start(start)]
    lines += ["", "### Candidates (aware study, measured trials)", "", _candidate_table(result.studies["aware"]), ""]
    lines += ["## Cost", "", "| stage | seconds |", "|---|---|"]
    lines += _cost_rows(result)
    lines += ["", f"Kernel tuning per candidate: {result.tuning}.", ""]
    if result.search_backend is not None:
        lines += [f"Trials were timed on {result.search_backend} (target.search_backend); the reference and the chosen "
                  "configurations were then compiled on the target's backend, and their figures, the side-by-side "
                  "ratios and the exported NNs are from there (backend and backends measured, per NN).", ""]
    if result.artifacts:
        lines += ["## Artifacts", ""]
        for nn, files in result.artifacts.items():
            lines.append(f"- `{nn}`: " + ", ".join(f"{kind} `{Path(p).relative_to(run_dir.resolve())}`"
                                                   for kind, p in files.items()))
    return store.write_text(run_dir / "report.md", "\n".join(lines) + "\n")


CONVERGENCE_PLOT = "agnostic_convergence.png"
CONVERGENCE_NOTE = ("The agnostic constraint is per NN, so each NN (or merge group) was searched alone for its fastest "
                    "candidate within its tolerance, with the aware study's trial budget each; the curve is the fastest "
                    "layout's sum of its units' best latencies (each measured alone) after each round of unit trials. "
                    "The baseline's frame was then measured whole, like the aware side's.")


def _convergence(curve: ConvergenceCurve) -> str:
    """The curve in one line: where it ended and when it last improved."""
    found = [(t, ms) for t, ms in enumerate(curve.best_ms_by_trial) if ms is not None]
    if not found:
        return (f"{CONVERGENCE_NOTE} No layout had a candidate within tolerance for every unit in {curve.trials} trials "
                f"over {len(curve.units)} units ({', '.join(curve.units)}).")
    last = found[-1][1]
    settled = next(t for t, ms in found if ms == last)
    return (f"{CONVERGENCE_NOTE} Units: {', '.join(curve.units)}; {curve.trials} trials in all. Best sum "
            f"{last:.3g} ms, reached in round {settled + 1} of {len(curve.best_ms_by_trial)} and not improved after.")


def plot_convergence(curve: ConvergenceCurve, path: Path) -> Path:
    """The agnostic baseline's best-so-far by round of unit trials."""
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    rounds = [t + 1 for t, ms in enumerate(curve.best_ms_by_trial) if ms is not None]
    ax.step(rounds, [ms for ms in curve.best_ms_by_trial if ms is not None], where="post", color="black")
    ax.set_xlabel("trials per unit")
    ax.set_ylabel("best sum of unit latencies (ms)")
    ax.set_title("Application-agnostic baseline: best so far")
    ax.grid(alpha=0.3)
    with store.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)
    return path


def plot_pareto(result: Result, path: Path) -> Path:
    """Write :func:`pareto_figure` of ``result`` to ``path``."""
    fig = pareto_figure(result)
    with store.atomic_path(path) as tmp:  # a kill or a full disk never leaves half a picture
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)
    return path


STUDY_MARKERS = ("o", "^")
"""Trial markers of the studies in ``Result.studies`` order (aware, agnostic): colour tells the knob family."""
FAMILY_PALETTE = plt.get_cmap("tab20")
FAMILY_COLOURS = (*range(0, 20, 2), *range(1, 20, 2))
"""The knob families' colours: tab20's ten strong colours first, its ten pale ones after, so no two of the first ten
families look alike."""
CHOSEN_STYLES: dict[str, dict[str, Any]] = {
    "reference": {"marker": "X", "s": 150, "facecolors": "black", "edgecolors": "white", "linewidths": 0.8},
    "application-agnostic": {"marker": "D", "s": 170, "facecolors": "none", "edgecolors": "black", "linewidths": 2.0},
    "application-aware": {"marker": "*", "s": 300, "facecolors": "gold", "edgecolors": "black", "linewidths": 1.0},
}
"""The marked configurations' markers: the agnostic diamond is hollow, so an agnostic choice that is the aware one
(or the reference) still shows around it."""


class _Point(NamedTuple):
    latency: float
    memory: float
    family: str
    feasible: bool


class _PlainLogFormatter(LogFormatter):
    """The minor ticks a log axis labels (where it spans less than a decade or two), as plain numbers: 0.6 and 2,
    not 6x10^-1 and 2x10^0."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def pareto_figure(result: Result) -> Figure:
    """Latency (log axis) vs memory of every measured trial, coloured by knob family, with the reference and the two
    chosen configurations marked and their speedups in the legend.

    Log latency, because one slow trial (a bf16 NN on a CPU without bf16 kernels) would otherwise press every other
    trial against 0 ms; on a log axis the gap between the reference and a chosen configuration is its speedup.
    Filled = feasible (tuned), hollow = infeasible (untuned).
    """
    # The agnostic baseline's unit studies time one NN (or merged group) alone, not a frame: the convergence plot shows them.
    points = {mode: [p for t in study.trials if t.state == "complete" and (p := _point(t)) is not None]
              for mode, study in result.studies.items() if not mode.startswith(AGNOSTIC_STUDY_PREFIX)}
    families = sorted({p.family for pts in points.values() for p in pts},
                      key=lambda f: (f != "reference", f.count("+"), f))
    colours = {f: FAMILY_PALETTE(FAMILY_COLOURS[i % len(FAMILY_COLOURS)], alpha=0.85) for i, f in enumerate(families)}
    fig, ax = plt.subplots(figsize=(8.4, 4.8))
    study_handles: list[Artist] = []
    for (mode, pts), marker in zip(points.items(), STUDY_MARKERS, strict=False):
        if pts:
            # No alpha= here: it would fill the hollow (infeasible) markers; the colours carry it instead.
            ax.scatter([p.latency for p in pts], [p.memory for p in pts], s=34, marker=marker, linewidths=1.0,
                       edgecolors=[colours[p.family] for p in pts],
                       facecolors=[colours[p.family] if p.feasible else "none" for p in pts])
        study_handles += [Line2D([], [], linestyle="", marker=marker, color="dimgrey",
                                 markerfacecolor="dimgrey" if feasible else "none",
                                 label=f"{mode} study, {'feasible' if feasible else 'infeasible'}")
                          for feasible in (True, False)]
    speedups = {"application-agnostic": result.speedups.agnostic, "application-aware": result.speedups.aware}
    marked: list[Artist] = []
    for name, config in (("reference", result.reference), ("application-agnostic", result.agnostic),
                         ("application-aware", result.aware)):
        if config is None:
            continue
        latency, memory = _figures(config)
        label = f"{name}{'' if config.trial is None else f', trial {config.trial}'}: {latency:.3g} ms"
        if speedups.get(name) is not None:
            label += f", {speedups[name]:.2f}x"
        marked.append(ax.scatter([latency], [memory], zorder=3, label=label, **CHOSEN_STYLES[name]))
    handles = marked + study_handles + [Patch(color=colours[f], label=f) for f in families]
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False))
    ax.set_xlabel("latency per frame (ms, log scale)")
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title("Search trials by knob family")
    ax.grid(alpha=0.3, which="both")
    ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return fig


def _point(trial: TrialRecord) -> _Point | None:
    """Where a trial sits: its measured configuration's figures, else (unmeasured) its quick objective values; None
    without a latency (a study that minimised memory alone) to place it by."""
    if trial.configuration is not None:
        latency, memory = _figures(trial.configuration)
    else:
        latency, memory = trial.objectives.get("latency"), trial.objectives.get("memory", 0.0)
    return None if latency is None else _Point(latency, memory, _trial_family(trial), trial.feasible)


def _figures(config: Configuration) -> tuple[float, float]:
    """A measured configuration's (latency ms, memory MiB), as the studies' objectives give them."""
    return config.latency_ms, (config.memory_bytes or 0) / MiB


def knob_family(nns: Mapping[str, Mapping[str, Any]], serves: Mapping[str, Sequence[str]] | None = None) -> str:
    """The approximations a configuration uses, e.g. ``merged+resolution+int8``; ``reference`` when none.

    ``nns`` maps each NN to its knobs (``NNChoice.knobs``; a knob left out keeps its default), ``serves`` each NN to
    the NNs its candidate serves (``NNChoice.serves``): two or more is a merged candidate. The passes come from the
    registry, in its order, so a new pass names its own family. Quantization is named by its dtype (``int8``,
    ``bf16``), which is what sets its trials apart; fine-tuning is left out, as it only wins back what the other
    passes cost.
    """
    knobs = [Knobs.model_validate(dict(k)) for k in nns.values()]
    merged = ["merged"] if any(len(names) > 1 for names in (serves or {}).values()) else []
    active = [k.dtype if p.name == "quantization" else p.name for p in passes() if p.name != "finetune"
              for k in knobs if p.active(k)]
    return "+".join(dict.fromkeys(merged + active)) or "reference"


def _trial_family(trial: TrialRecord) -> str:
    """A trial's knob family: from its measured configuration, else (infeasible, never measured) from its params."""
    if trial.configuration is not None:
        nns = trial.configuration.nns
        return knob_family({n: c.knobs for n, c in nns.items()}, {n: c.serves for n, c in nns.items()})
    return knob_family(*_knobs_of_params(trial.params))


def _knobs_of_params(params: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Each NN's sampled knobs (``<nn>.<knob>``) and the merged groups (``merge.<a>+<b>`` set true) of a trial's
    params, as :func:`knob_family` takes them; the other params (the schedule) are no knobs and are passed over."""
    owned = knob_owners()
    knobs: dict[str, dict[str, Any]] = {}
    serves: dict[str, list[str]] = {}
    for key, value in params.items():
        prefix, _, name = key.partition(".")
        if prefix == "merge" and value is True:
            group = name.split("+")
            serves.update({nn: group for nn in group})
        elif name in owned:
            knobs.setdefault(prefix, {})[name] = value
    return knobs, serves


def unchanged_note(result: Result) -> str | None:
    """Why the aware choice runs the reference NNs unchanged (a 1.00x a reader would otherwise have to decode), or
    ``None`` when it does not."""
    if result.aware is None or not result.aware.same_nns(result.reference):
        return None
    failed = [v for v in result.validations if v.trial != result.aware.trial and v.failures]
    return "It runs the reference NNs unchanged: " + (
        f"each of the {len(failed)} faster configuration(s) validation tried failed closed-loop runs (the "
        "validation table)" if failed else "no other configuration the search found feasible measured faster") + "."


def without_aware(result: Result) -> str:
    """What a run that accepted no application-aware configuration leaves to deploy: the application-agnostic
    configuration where it passed its fresh-seed runs (it is then validated and faster than the reference), else
    the reference NNs."""
    v = result.agnostic_validation
    if result.agnostic is not None and v is not None and v.accepted:
        return (f"the application-agnostic configuration passed {v.passes} of {v.runs} closed-loop runs on fresh "
                f"seeds, {result.speedups.describe('agnostic')} faster than the reference: the fastest validated "
                "choice")
    return "the reference NNs remain the deployable choice"


def failure_rate(validation: Validation, confidence: float = 0.9) -> str:
    """``2/160 failed, 1.2 % [0.2, 3.9]``: the runs' failures and their rate with its two-sided exact (Clopper-Pearson)
    interval at ``confidence``."""
    from scipy.stats import binomtest

    if not validation.runs:
        return "no runs"
    ci = binomtest(validation.failures, validation.runs).proportion_ci(confidence_level=confidence, method="exact")
    return (f"{validation.failures}/{validation.runs} failed, {validation.failures / validation.runs:.1%} "
            f"[{ci.low:.1%}, {ci.high:.1%}]")


def _named(config: Configuration, validation: Validation | None) -> str:
    if validation is not None and validation.label:
        return f"the {validation.label} configuration"
    return "the reference NNs" if config.trial is None else f"trial {config.trial}"


def verdict(result: Result) -> str:
    """The run's verdict in one sentence, leading with it: what to deploy, on what evidence, and only then its
    speedup (an unaccepted configuration's ratio is never the headline). The console's last line and the report's
    first sentence."""
    s = result.speedups
    confidence = result.validation_power.confidence if result.validation_power is not None else 0.9
    if result.aware is None:
        return f"Not accepted: no application-aware configuration passed closed-loop validation; {without_aware(result)}."
    a = result.acceptance
    name = _named(result.aware, a)
    over = (f", aware over agnostic {s.brief('aware_over_agnostic')}" if s.aware_over_agnostic is not None else "")
    agnostic = result.agnostic_validation
    beside = (f"; the application-agnostic configuration {failure_rate(agnostic, confidence)} on the same seeds "
              f"({'accepted' if agnostic.accepted else agnostic.verdict})" if agnostic is not None else "")
    if result.aware_accepted:
        runs = f" on fresh seeds, {failure_rate(a, confidence)}" if a is not None else ""
        return (f"Accepted: {name} met the QoS goal{runs}{beside}. Application-aware speedup {s.brief('aware')}"
                f"{over}.")
    if a is not None and a.failures:
        why = f"was rejected on fresh seeds ({failure_rate(a, confidence)})"
    elif a is not None:
        why = f"had too few runs to decide ({failure_rate(a, confidence)} on fresh seeds; more runs can accept)"
    else:
        why = "was not run on fresh seeds"
    return (f"Not accepted: {name}, the fastest configuration no closed-loop run refuted, {why}{beside}; "
            f"unaccepted, it would be {s.brief('aware')} faster than the reference{over}.")


def _outcome(result: Result) -> str:
    s = result.speedups
    if result.aware is None:
        rebuilt = ("; configurations whose rebuilt NNs left the region were not validated (Rebuilt NNs)"
                   if any(r.study == "aware" and not r.feasible for r in result.rebuilt) else "")
        return (f"**{verdict(result)}** See the validation table for what failed{rebuilt}.")
    a = result.acceptance
    if result.aware_accepted:
        status = "accepted: it met the QoS goal at the spec's confidence with the real NNs in the loop"
        status += f", on {a.runs} fresh seeds that no check or validation had used" if a is not None else ""
    elif a is not None and a.failures:
        status = (f"rejected on fresh seeds: {a.failures} of {a.runs} closed-loop runs failed the QoS goal on seeds "
                  "that did not choose it, and no slower configuration of the front was accepted (the failures are "
                  "evidence in closed_loop.json)")
    else:
        status = ("not yet accepted: its closed-loop runs were too few to prove the goal at the spec's confidence "
                  "(run the default profile)")
    text = (f"**{verdict(result)}** Application-aware configuration ({_named(result.aware, a)}) against the "
            f"reference: {s.describe('aware')}; {status}.")
    note = unchanged_note(result)
    if note:
        text += f" {note}"
    if s.aware_over_agnostic is not None:
        text += (f" Application-agnostic compression against the reference: {s.describe('agnostic')}; application "
                 f"awareness over it: {s.describe('aware_over_agnostic')}, timed side by side on this machine, each NN on the "
                 "backend its measurement chose (the configuration table).")
    if s.aware_over_agnostic_by_point is not None:
        text += (" Its tolerance test held some NN back for want of validation data (The application-agnostic "
                 "tolerance, below); with every NN inside its bound by its point error admitted, as compression that "
                 "trusts its validation estimate would ship it (not run closed-loop), awareness gains "
                 f"{s.describe('aware_over_agnostic_by_point')}.")
    v = result.agnostic_validation
    if v is not None:
        fresh = " on the fresh seeds" if seeds_of(v).startswith("fresh") else ""
        text += (f" With its NNs in the loop, the application-agnostic configuration passed {v.passes} of {v.runs} "
                 f"closed-loop runs{fresh} ({'accepted' if v.accepted else v.verdict}")
        text += ")." if v.accepted or not v.failures else "): accuracy-preserving compression did not preserve the QoS goal."
    return text


def _row(name: str, config: Configuration, speedup: str) -> str:
    mem = f"{config.memory_bytes / MiB:.2f}" if config.memory_bytes is not None else "n/a"
    others = ", ".join(f"{s} {ms:.3g} ms" for s, ms in config.schedules_ms.items() if s != config.schedule)
    schedule = f"{config.schedule} ({others})" if others else config.schedule
    return f"| {name} | {format_latency(config.latency_ms, config.latency)} | {mem} | {speedup} | {schedule} |"


def format_latency(ms: float, latency: Latency | None) -> str:
    """``3.20 [3.11, 3.30]``, with ``(untrusted)`` after a figure the machine disturbed; the bare figure before v5."""
    if latency is None:
        return f"{ms:.2f}"
    return f"{ms:.2f} {latency.interval}" + ("" if latency.trusted else " (untrusted)")


def _epochs(result: Result) -> str:
    """Which measurement epochs the compared figures come from, and which figures are untrusted and why."""
    compared = {"reference": result.reference, "application-agnostic": result.agnostic,
                "application-agnostic by point error": result.agnostic_by_point, "application-aware": result.aware}
    latencies = {name: c.latency for name, c in compared.items() if c is not None and c.latency is not None}
    if not latencies:
        return "This result predates latency intervals (result version 4 or older): its figures carry none."
    epochs = {latency.epoch for latency in latencies.values()}
    text = (f"The configurations compared were all measured in one epoch (process `{epochs.pop()}`), so their "
            "ratios are not skewed by load that changed between runs." if len(epochs) == 1 else
            "The configurations compared were measured in different epochs (processes): "
            + ", ".join(f"{name} in `{latency.epoch}`" for name, latency in latencies.items())
            + "; ratios between them are not made.")
    untrusted = [f"{name}: {latency.untrusted}" for name, latency in latencies.items() if not latency.trusted]
    trials = [t for s in result.studies.values() for t in s.trials
              if t.configuration is not None and t.configuration.latency is not None]
    flagged = sum(not t.configuration.latency.trusted for t in trials)
    if untrusted:
        text += " Untrusted: " + "; ".join(untrusted) + "."
    if trials:
        text += f" Of the {len(trials)} measured trials, {flagged} were untrusted."
    return text


def _nn_table(config: Configuration) -> str:
    """One row per NN: its knobs (a column per knob of every registered approximation pass) and its figures."""
    knobs = {name: describe(c.knobs) for name, c in config.nns.items()}
    columns = list(dict.fromkeys(label for k in knobs.values() for label in k))
    rows = ["| NN | " + " | ".join(columns) + " | error | backend | latency (ms) [95 % interval] | MACs (M) | params (k) "
            "| backends measured (ms, or why not) |",
            "|---|" + "---|" * len(columns) + "---|---|---|---|---|---|"]
    for name, c in config.nns.items():
        backends = ", ".join(f"{b} {v:.2f}" if isinstance(v, float) else f"{b}: {v}" for b, v in c.backends_measured.items())
        rows.append(f"| {name} | " + " | ".join(knobs[name].get(col, "") for col in columns) +
                    f" | {c.error:.4g} ({c.metric}) | {c.backend} | {format_latency(c.latency_ms, c.latency)} | "
                    f"{c.macs / 1e6:.1f} | {c.params / 1e3:.1f} | {backends} |")
    return "\n".join(rows)


def _agnostic_rule(rule: AgnosticRule) -> str:
    """The rule in words, then per NN its reference error, its bound and the agnostic choice's error and upper bound."""
    rows = [f"The application-agnostic baseline keeps each NN's error at its reference's: {rule.rule}.", "",
            f"| NN | metric | reference error | bound | allowed excess | chosen error | excess, upper {rule.confidence:.0%} "
            "bound |", "|---|---|---|---|---|---|---|"]
    for name, t in rule.nns.items():
        bound = Tolerance(t.metric, t.bound).describe()
        chosen = "n/a" if t.chosen_error is None else f"{t.chosen_error:.4g}"
        ucb = "n/a" if t.chosen_excess_ucb is None else f"{t.chosen_excess_ucb:+.4g}"
        ucb += f" ({t.chosen_frames} frames)" if t.chosen_frames else ""
        rows.append(f"| {name} | {t.metric} | {t.reference_error:.4g} | {bound} | {t.allowed_excess:.4g} | {chosen} | "
                    f"{ucb} |")
    if rule.unresolved:
        rows += ["", "Where the test, not the NN, decided (a faster trial inside the bound by its point error, rejected on "
                 "its upper bound; the baseline is then nearer the reference than accuracy-preserving compression "
                 "would allow, and aware over agnostic overstates what the application's headroom buys):", ""]
        rows += [f"- {u.describe()}." for u in rule.unresolved.values()]
    if rule.second_looks:
        rows += ["", "Judged again on a second validation split (`nns.<name>.data.more_validation`), each trial the first "
                 "left unresolved, fastest first:", ""]
        rows += [f"- {t.describe()}." for t in rule.second_looks]
    return "\n".join(rows)


def _fidelity(fidelity: Fidelity) -> str:
    """The region's agreement with closed-loop truth, with the error model it was charted with."""
    model = f"error model `{fidelity.error_model}`" if fidelity.error_model else "error model not recorded"
    if not fidelity.configurations:
        return f"No configuration ran closed-loop, so the region ({model}) was not compared with closed-loop truth."
    text = (f"The region ({model}) against closed-loop truth: {fidelity.configurations} configuration(s) ran closed-loop "
            f"({fidelity.checked_during_search} checked during the search only), {fidelity.closed_loop_runs} runs; "
            f"{fidelity.decided} reached a verdict")
    if fidelity.agreement is not None:
        text += (f", and the region agreed with {fidelity.agreement:.0%} of them; {fidelity.false_valid} that it called "
                 "valid failed closed-loop (false valid)")
    return text + "." + (f" {fidelity.note}" if fidelity.note else "")


def seeds_of(validation: Validation) -> str:
    """Which seeds a validation ran: ``selection`` (they chose), ``fresh`` (they accept), with the first seed."""
    from qaopt.closed_loop import ACCEPTANCE_SEED_BASE, VALIDATION_SEED_BASE

    base = validation.seed_base
    role = {VALIDATION_SEED_BASE: "selection", ACCEPTANCE_SEED_BASE: "fresh"}.get(base, "")
    return "" if base is None else f"{role} ({base}+)" if role else f"{base}+"


def _validation_table(validations: list[Validation], confidence: float = 0.9) -> str:
    if not validations:
        return "No configuration was validated."
    names = list(dict.fromkeys(k for v in validations for k in v.metrics))
    counted = {n for v in validations for n, m in v.metrics.items() if m.total is not None}
    heads = [f"{n}: {'total' if n in counted else 'mean'} (worst run)" for n in names]
    rows = [f"| trial | seeds | runs | passes | failures | failure rate [{confidence:.0%} interval] | verdict | "
            "region said valid | " + " | ".join(heads) + " |", "|---|---|---|---|---|---|---|---|" + "---|" * len(names)]
    for v in validations:
        cells = []
        for n in names:
            m = v.metrics.get(n)
            if m is None:
                cells.append("")
                continue
            shown = m.total if n in counted and m.total is not None else m.mean
            cells.append(f"{shown:.4g}" + (f" ({m.worst_run:.4g})" if m.worst_run is not None else ""))
        failed = f"{v.failures}" + (f" (seeds {', '.join(map(str, v.failed_seeds))})" if v.failed_seeds else "")
        rate = failure_rate(v, confidence).split(", ", 1)[-1]
        rows.append(f"| {v.trial if v.trial is not None else v.label or 'reference'} | {seeds_of(v)} | {v.runs} | "
                    f"{v.passes} | {failed} | {rate} | {v.verdict} | "
                    f"{v.region_predicted_valid} | "
                    + " | ".join(cells) + " |")
    return "\n".join(rows)


def _informed_start(start: InformedStart) -> str:
    rows = ["| unit | reference (ms, untuned) | each probe's latency factor |", "|---|---|---|"]
    for unit, ms in start.reference_ms.items():
        factors = ", ".join(f"{probe} {f:.2f}x" for probe, f in start.factors.get(unit, {}).items()) or "none"
        rows.append(f"| {unit} | {ms:.3f} | {factors} |")
    rows += ["", f"The reference frame is estimated at {start.reference_frame_ms:.3f} ms. The walk built:", "",
             "| # | combination | estimated frame (ms) | inside the region | became |", "|---|---|---|---|---|"]
    rows += [f"| {i} | {t.choice} | {t.estimated_ms:.3f} | {'yes' if t.inside else 'no'} | {t.role or ''} |"
             for i, t in enumerate(start.walk, 1)]
    if not start.walk:
        rows.append("| | nothing: no combination was estimated faster than the reference | | | |")
    return "\n".join(rows) + "\n"


def _candidate_table(study: StudySummary) -> str:
    rows = ["| trial | feasible | latency (ms) | errors | knobs |", "|---|---|---|---|---|"]
    for t in study.trials:
        if t.state != "complete":
            continue
        knobs = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items())
        latency = (format_latency(t.configuration.latency_ms, t.configuration.latency) if t.configuration
                   else f"{t.objectives.get('latency', float('nan')):.2f} (quick, untuned)")
        rows.append(f"| {t.number} | {t.feasible} | {latency} | {format_errors(t.errors)} | {knobs} |")
    return "\n".join(rows)
