"""``report.md`` and its plots: what a robotics team reads after ``qaopt optimize``."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from qaopt.app_spec import store  # noqa: E402
from qaopt.approx import describe  # noqa: E402
from qaopt.result import Configuration, Fidelity, Latency, Result, StudySummary, Validation  # noqa: E402

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
    "interval includes 1.0, or whose two sides are the same NNs, is no measurable difference.")
CHECKS_NOTE = ("The front's configurations nearest the region's boundary, run closed-loop while the search went on "
               "(search.closed_loop); a failure corrected the region for the trials after it.")


def write_report(result: Result, run_dir: Path) -> Path:
    """Write ``report.md`` and ``pareto.png`` into ``run_dir`` from ``result`` alone; ``region.png`` comes from the region stage.

    A pure function of the result, so an old ``result.json`` gives the same report again.
    """
    pareto = plot_pareto(result.studies, run_dir / "pareto.png")
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
        lines.append(_row("application-agnostic (each NN within its reference error)", result.agnostic,
                          result.speedups.describe("agnostic")))
    if result.aware:
        lines.append(_row("application-aware (inside the error region)", result.aware, result.speedups.describe("aware")))
    lines += ["", "### Measurement", "", MEASUREMENT_NOTE, "", _epochs(result), ""]
    lines += ["## Chosen NNs", ""]
    for title, config in (("application-aware", result.aware), ("application-agnostic", result.agnostic),
                          ("reference", result.reference)):
        if config is not None:
            lines += [f"### {title}", "", _nn_table(config), ""]
    lines += ["## Error region", "", "![error region](region.png)", "",
              f"Region from `{result.region.name}`; the reference NNs sit at {format_errors(result.reference.errors)}.", ""]
    if result.region_note:
        lines += [f"Region: {result.region_note}.", ""]
    lines += ["## Closed-loop validation", "", _validation_table(result.validations), ""]
    if result.validations:
        lines += [METRICS_NOTE, ""]
    checks = result.studies["aware"].closed_loop_checks
    if checks:
        lines += ["### Closed-loop checks during the search", "", CHECKS_NOTE, "", _validation_table(checks), ""]
    lines += ["### Region fidelity", "", _fidelity(result.fidelity), ""]
    lines += ["## Search", "", f"![Pareto front]({pareto.name})", ""]
    lines += ["| study | complete | feasible | failed |", "|---|---|---|---|"]
    for mode, s in result.studies.items():
        lines.append(f"| {mode} | {s.trials_complete} | {s.trials_feasible} | {s.trials_failed} |")
    failures = [f for s in result.studies.values() for f in s.failures]
    if failures:
        lines += ["", "Failed trials (the search went on):", ""] + [f"- {f}" for f in failures]
    unusable = [f"{mode} trial {t.number}: {t.infeasible}" for mode, s in result.studies.items() for t in s.trials
                if t.infeasible]
    if unusable:
        lines += ["", "Infeasible whatever their errors (the search went on):", ""] + [f"- {u}" for u in unusable]
    lines += ["", "### Candidates (aware study, measured trials)", "", _candidate_table(result.studies["aware"]), ""]
    lines += ["## Cost", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {stage} | {seconds:.1f} |" for stage, seconds in result.seconds.items()]
    lines += ["", f"Kernel tuning per candidate: {result.tuning}.", ""]
    if result.artifacts:
        lines += ["## Artifacts", ""]
        for nn, files in result.artifacts.items():
            lines.append(f"- `{nn}`: " + ", ".join(f"{kind} `{Path(p).relative_to(run_dir.resolve())}`"
                                                   for kind, p in files.items()))
    return store.write_text(run_dir / "report.md", "\n".join(lines) + "\n")


def plot_pareto(studies: dict[str, StudySummary], path: Path) -> Path:
    """Latency vs memory of every measured trial; filled = feasible (tuned), hollow = infeasible (untuned)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for (mode, study), colour in zip(studies.items(), ("tab:green", "tab:blue"), strict=False):
        trials = [t for t in study.trials if t.state == "complete" and t.objectives]
        for feasible in (True, False):
            pts = [t for t in trials if t.feasible == feasible]
            if not pts:
                continue
            xs = [t.objectives.get("latency", 0.0) for t in pts]
            ys = [t.objectives.get("memory", 0.0) for t in pts]
            ax.scatter(xs, ys, s=36, label=f"{mode}, {'feasible' if feasible else 'infeasible'}",
                       facecolors=colour if feasible else "none", edgecolors=colour, marker="o" if feasible else "X")
    ax.set_xlabel("latency per frame (ms)")
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title("Search trials")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _outcome(result: Result) -> str:
    s = result.speedups
    if result.aware is None:
        return ("No application-aware configuration passed closed-loop validation; the reference NNs remain "
                "the deployable choice. See the validation table for what failed.")
    status = ("accepted: it met the QoS goal at the spec's confidence with the real NNs in the loop" if result.aware_accepted
              else "not yet accepted: its closed-loop runs were too few to prove the goal at the spec's confidence "
                   "(run the default profile)")
    text = (f"Application-aware configuration (trial {result.aware.trial}) against the reference: "
            f"{s.describe('aware')}; {status}.")
    if s.aware_over_agnostic is not None:
        text += (f" Application-agnostic compression against the reference: {s.describe('agnostic')}; application "
                 f"awareness over it: {s.describe('aware_over_agnostic')}, on the same backends and machine.")
    v = result.agnostic_validation
    if v is not None:
        text += (f" With its NNs in the loop, the application-agnostic configuration passed {v.passes} of {v.runs} "
                 f"closed-loop runs ({'accepted' if v.accepted else v.verdict}")
        text += ")." if v.accepted or not v.failures else "): accuracy-preserving compression did not preserve the QoS goal."
    return text


def _row(name: str, config: Configuration, speedup: str) -> str:
    mem = f"{config.memory_bytes / MiB:.2f}" if config.memory_bytes is not None else "n/a"
    return f"| {name} | {format_latency(config.latency_ms, config.latency)} | {mem} | {speedup} | {config.schedule} |"


def format_latency(ms: float, latency: Latency | None) -> str:
    """``3.20 [3.11, 3.30]``, with ``(untrusted)`` after a figure the machine disturbed; the bare figure before v5."""
    if latency is None:
        return f"{ms:.2f}"
    return f"{ms:.2f} {latency.interval}" + ("" if latency.trusted else " (untrusted)")


def _epochs(result: Result) -> str:
    """Which measurement epochs the compared figures come from, and which figures are untrusted and why."""
    compared = {"reference": result.reference, "application-agnostic": result.agnostic,
                "application-aware": result.aware}
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


def _validation_table(validations: list[Validation]) -> str:
    if not validations:
        return "No configuration was validated."
    names = list(dict.fromkeys(k for v in validations for k in v.metrics))
    counted = {n for v in validations for n, m in v.metrics.items() if m.total is not None}
    heads = [f"{n}: {'total' if n in counted else 'mean'} (worst run)" for n in names]
    rows = ["| trial | runs | passes | failures | verdict | region said valid | " + " | ".join(heads) + " |",
            "|---|---|---|---|---|---|" + "---|" * len(names)]
    for v in validations:
        cells = []
        for n in names:
            m = v.metrics.get(n)
            if m is None:
                cells.append("")
                continue
            shown = m.total if n in counted and m.total is not None else m.mean
            cells.append(f"{shown:.4g}" + (f" ({m.worst_run:.4g})" if m.worst_run is not None else ""))
        rows.append(f"| {v.trial} | {v.runs} | {v.passes} | {v.failures} | {v.verdict} | {v.region_predicted_valid} | "
                    + " | ".join(cells) + " |")
    return "\n".join(rows)


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


def format_errors(errors: dict[str, float]) -> str:
    """An error vector as ``heading=1.48, distance=0.0354`` for messages and tables."""
    return ", ".join(f"{k}={v:.4g}" for k, v in errors.items())
