"""What ``qaopt optimize`` returns and writes as ``result.json``.

The Python API (:func:`qaopt.optimize`) returns a :class:`Result` with exactly the
content of ``result.json``, so a team can script runs and read old ones alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qaopt.app_spec import QaoptError, store
from qaopt.tolerance import PRACTICAL_DATA_FACTOR

Schedule = Literal["sequential", "parallel"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Latency(_Model):
    """A measured latency's uncertainty and whether the machine let it be trusted (qaopt.kernels.measure)."""

    ci_ms: tuple[float, float] = Field(description=(
        "95 % interval of the latency: of the median (order statistics) for one sample set, of the sum of medians "
        "(percentile bootstrap) for several"))
    samples_ms: list[list[float]] = Field(description=(
        "the sample sets whose medians add up to the latency: one per NN run in sequence, one for a parallel frame"))
    trusted: bool = Field(description="False when other processes disturbed the measurement or its median is uncertain")
    untrusted: str = Field("", description="why it is not trusted")
    epoch: str = Field(description="the process that measured it: decisions compare only figures of one epoch")

    @property
    def interval(self) -> str:
        """``[lo, hi]`` in ms, as tables show it."""
        return f"[{self.ci_ms[0]:.2f}, {self.ci_ms[1]:.2f}]"


class NNChoice(_Model):
    """One NN of a configuration: its knobs, the error they cost, and how fast it ran."""

    knobs: dict[str, Any]
    candidate: str = Field(description="the candidate's content hash (its cache key: of what it is built from)")
    bytes_hash: str | None = Field(None, description=(
        "the content hash of the candidate's bytes as measured (its tensors and ONNX graph): a rebuild of the same "
        "key that differs is re-checked against the region before it is used; None before it was recorded"))
    error: float = Field(description="NN error metric on validation data, in the output's unit")
    metric: str
    backend: str
    latency_ms: float
    memory_bytes: int | None
    macs: int
    params: int
    backends_measured: dict[str, float | str] = Field(
        default_factory=dict, description="every backend's median latency (ms), or why it could not run"
    )
    latency: Latency | None = Field(None, description="latency_ms's interval and trust; None before result version 5")
    serves: list[str] = Field(default_factory=list, description=(
        "the NNs the candidate serves when it is merged (one backbone, a head per NN); empty: this NN alone"))


class Configuration(_Model):
    """A per-NN choice of knobs and how the NNs share the cores, with its measured cost."""

    trial: int | None = Field(None, description="Optuna trial number; None for the reference")
    nns: dict[str, NNChoice]
    schedule: Schedule
    latency_ms: float = Field(description="measured time per perception frame under the schedule")
    memory_bytes: int | None
    errors: dict[str, float] = Field(description="the error vector in the region's axis names")
    in_region: bool
    latency: Latency | None = Field(None, description="latency_ms's interval and trust; None before result version 5")
    schedules_ms: dict[Schedule, float] = Field(default_factory=dict, description=(
        "each schedule's median frame (ms) as the side-by-side stage timed it, the frame's schedule the fastest; "
        "empty for a frame of one model, and in a result.json written before the stage timed every schedule"))

    def candidate_keys(self) -> dict[str, str]:
        """NN -> the key of the candidate it runs."""
        return {n: c.candidate for n, c in self.nns.items()}

    def same_nns(self, other: Configuration) -> bool:
        """Whether both run the same candidates under the same schedule (a speedup between them can only be noise)."""
        return self.schedule == other.schedule and self.candidate_keys() == other.candidate_keys()


class Rebuilt(_Model):
    """A configuration whose NNs a later stage rebuilt into other bytes than the search measured, re-checked.

    The approximation cache is not part of a run's state, and GPU fine-tuning is not bitwise
    reproducible: a run resumed on another machine or with a fresh cache builds other NNs under the
    same knobs. Their errors were measured again on the validation data and the configuration was
    placed in the region again; from then on it carries these errors, and when it is no longer
    feasible in its study (aware: outside the region) it is neither validated nor chosen.
    """

    study: Literal["aware", "agnostic"]
    trial: int | None
    hashes: dict[str, tuple[str, str]] = Field(description=(
        "each rebuilt NN: (the bytes hash the search measured, the rebuilt candidate's)"))
    nn_errors: dict[str, tuple[float, float]] = Field(description="each rebuilt NN's error: (searched, rebuilt)")
    searched_errors: dict[str, float] = Field(description="the error vector the search placed in the region")
    errors: dict[str, float] = Field(description="the error vector of the rebuilt NNs, the one used from then on")
    probability: float = Field(description="the region's P(valid) at the rebuilt errors")
    feasible: bool = Field(description="still feasible in its study (aware: inside the region)")

    @property
    def line(self) -> str:
        """What the console and the report say about it, in one line."""
        name = "the reference" if self.trial is None else f"{self.study} trial {self.trial}"
        nns = "; ".join(f"nns.{n} rebuilt with other bytes than searched ({old} -> {new}), error "
                        f"{self.nn_errors[n][0]:.4g} -> {self.nn_errors[n][1]:.4g}"
                        for n, (old, new) in self.hashes.items())
        verdict = ("still feasible: it goes on with the rebuilt NNs' errors" if self.feasible else
                   f"no longer {'inside the region' if self.study == 'aware' else 'within its tolerance'}: not "
                   "validated or chosen")
        return (f"{name}: {nns}; re-checked at {format_errors(self.errors)} (searched at "
                f"{format_errors(self.searched_errors)}), P(valid) {self.probability:.2f}, {verdict}")


def format_errors(errors: dict[str, float]) -> str:
    """An error vector as ``heading=1.48, distance=0.0354`` for messages and tables."""
    return ", ".join(f"{k}={v:.4g}" for k, v in errors.items())


class RunMetric(_Model):
    """One reported metric over a validation's closed-loop runs."""

    mean: float = Field(description="mean per run")
    worst_run: float | None = Field(
        None, description="its value in the worst run (the run whose QoS metric is worst); None when not recorded")
    total: float | None = Field(
        None, description="sum over the runs, for counts only (a sum of e.g. distances or gaps means nothing)")


class RanNN(_Model):
    """An NN as it ran in a closed-loop validation: which candidate, and which bytes of it."""

    candidate: str = Field(description="the candidate's key (the approximation cache's entry)")
    bytes_hash: str | None = Field(None, description="Candidate.bytes_hash of the NN that ran; None: not recorded")


class Validation(_Model):
    """Closed-loop runs of a configuration with its real approximated NNs in the loop."""

    trial: int | None
    runs: int
    passes: int
    failures: int
    verdict: Literal["valid", "invalid", "undecided"]
    accepted: bool
    region_predicted_valid: bool
    qos_metric_mean: float
    metrics: dict[str, RunMetric] = Field(
        default_factory=dict, description="each metric the evaluator reports: its mean per run, its value in the worst "
        "run, and for counts (collisions, crashes) its total over the runs")
    worst_seed: int | None = Field(None, description="the seed of the run with the worst QoS metric value")
    failed_seeds: list[int] = Field(default_factory=list, description=(
        "the seeds of the runs that missed the QoS goal: the scenes that decided a rejection; empty before it was "
        "recorded"))
    seed_base: int | None = Field(None, description=(
        "the first seed of the range its runs come from (seed_base, seed_base + 1, ..., in blocks, those holding a "
        "seed that failed an earlier configuration of the run first): the selection seeds of the checks and the "
        "front's validation, or the fresh acceptance seeds; None before it was recorded"))
    label: str | None = Field(None, description=(
        "what the configuration is when no trial of the aware study is (the application-agnostic baseline, "
        "combined from its per-NN studies); None: the trial, or the reference"))
    nns: dict[str, RanNN] = Field(default_factory=dict, description=(
        "each NN that ran: its candidate key and the hash of its bytes, the NNs this verdict is about (a rebuild "
        "of the same key into other bytes is validated again); empty before it was recorded"))

    @property
    def name(self) -> str:
        """How reports and notes name the configuration: ``trial 12``, the label, or ``the reference``."""
        if self.trial is not None:
            return f"trial {self.trial}"
        return self.label or "the reference"


FIDELITY_GUIDE = "docs/calibration.md, error models"
"""Where a user reads which error model fits NNs whose real errors the region's model missed."""


class ValidationPower(_Model):
    """How strict closed-loop validation is at the spec's goal: the exact chance that its sequential test
    (:class:`qaopt.calibrate.SequentialTest`) accepts a configuration whose runs fail at a given rate, and the runs
    that costs. Where the reference NNs themselves fail some runs, a configuration as good as the reference is
    accepted only with this probability."""

    runs: int = Field(description="the most runs a configuration's validation may spend (its cap)")
    tolerated: int = Field(description="the most failures that can still be accepted within the cap (-1: none)")
    max_failure_rate: float
    confidence: float
    powered_rate: float | None = Field(None, description="the failure rate the test is powered at (half the goal's)")
    accept_probability: dict[str, float] = Field(description="true failure rate per run -> probability of acceptance")
    expected_runs: dict[str, float] = Field(default_factory=dict, description=(
        "true failure rate per run -> the runs a validation spends on average"))
    line: str = Field("", description="the report's sentence")


class Fidelity(_Model):
    """How well the region predicted closed-loop truth in one run.

    The region says valid or not from runs with *injected* errors; the closed loop runs the
    real approximated NNs. Every configuration of the aware study that went closed-loop
    (validated after the search, the reference included, or checked during it:
    ``search.closed_loop``) is one comparison, so a user sees whether the error model
    (``calibration.error_model``) can be trusted here. The agnostic configuration's
    validation is left out: it answers another question (is accuracy-preserving compression
    safe?), and its NNs may be the aware study's, counted already.
    """

    error_model: str | None = Field(description=(
        "calibration.error_model the region was charted with; None in a result.json of version 3 or older"))
    configurations: int = Field(description=(
        "configurations run closed-loop: validated after the search or checked during it, each counted once"))
    checked_during_search: int = Field(description="of them, those checked during the search only")
    decided: int = Field(description="of them, those whose closed-loop runs reached a verdict at the spec's confidence")
    agreement: float | None = Field(description=(
        "share of the decided ones whose closed-loop verdict matched the region's; None when none was decided"))
    false_valid: int = Field(description="decided configurations the region called valid that failed closed-loop")
    closed_loop_runs: int = Field(description="closed-loop runs behind these figures (cached runs included)")
    note: str = Field("", description="what the figures mean for this run, and what to do about a disagreement")

    @classmethod
    def of(cls, error_model: str | None, validations: Sequence[Validation],
           checks: Sequence[Validation] = ()) -> Fidelity:
        """The figures of a run's final ``validations`` and its in-search ``checks``.

        A configuration both checked and validated counts once, by its validation (more runs).
        """
        validated = {v.trial for v in validations}
        checked = [c for c in checks if c.trial not in validated]
        compared = [*validations, *checked]
        decided = [v for v in compared if v.verdict != "undecided"]
        wrong = [v for v in decided if v.region_predicted_valid and v.verdict == "invalid"]
        return cls(
            error_model=error_model,
            configurations=len(compared),
            checked_during_search=len(checked),
            decided=len(decided),
            agreement=sum(v.accepted == v.region_predicted_valid for v in decided) / len(decided) if decided else None,
            false_valid=len(wrong),
            closed_loop_runs=sum(v.runs for v in compared),
            note=_fidelity_note(error_model, compared, decided, wrong),
        )


def _fidelity_note(error_model: str | None, compared: Sequence[Validation], decided: Sequence[Validation],
                   wrong: Sequence[Validation]) -> str:
    if wrong:
        model = f" (error model '{error_model}')" if error_model else ""
        return (f"The region{model} called {len(wrong)} configuration(s) valid that failed closed-loop "
                f"({', '.join(v.name for v in wrong)}): the real NNs err differently from the injected errors (bias, "
                "correlation over frames, failures on particular scenes). Choose the error model that matches how "
                f"your NNs err: see {FIDELITY_GUIDE}.")
    if compared and not decided:
        return (f"None of the {len(compared)} closed-loop verdicts was decided at the spec's confidence (too few runs "
                "per configuration; the default profile runs more), so this run does not measure the region's fidelity.")
    return ""


NO_DIFFERENCE = "no measurable difference"
Verdict = Literal["faster", "slower", "no measurable difference", "not comparable"]


class SpeedupInterval(_Model):
    """What a speedup (a ratio of latencies) may claim, given both sides' samples."""

    ci: tuple[float, float] | None = Field(description=(
        "95 % percentile-bootstrap interval of the ratio of medians, each side resampled from its own samples"))
    verdict: Verdict = Field(description=(
        "faster/slower when the interval excludes 1.0; 'no measurable difference' when it includes 1.0 or both sides "
        "are the same NNs; 'not comparable' when they were measured in different epochs"))
    note: str = ""

    @classmethod
    def of(cls, slow: Configuration, fast: Configuration) -> SpeedupInterval:
        """The interval of ``slow.latency_ms / fast.latency_ms``."""
        from qaopt.kernels import ratio_interval

        if slow.same_nns(fast):
            return cls(ci=None, verdict=NO_DIFFERENCE, note="the same NNs on both sides")
        if slow.latency is None or fast.latency is None:
            return cls(ci=None, verdict="not comparable", note="no samples recorded (result version 4 or older)")
        if slow.latency.epoch != fast.latency.epoch:
            return cls(ci=None, verdict="not comparable", note=(
                f"measured in different processes (epochs {slow.latency.epoch} and {fast.latency.epoch}), whose "
                "machine load may differ; measure both in one run to compare them"))
        lo, hi = ratio_interval(slow.latency.samples_ms, fast.latency.samples_ms)
        untrusted = [c.latency.untrusted for c in (slow, fast) if not c.latency.trusted]
        note = f"from untrusted measurements: {'; '.join(untrusted)}" if untrusted else ""
        verdict: Verdict = "faster" if lo > 1.0 else "slower" if hi < 1.0 else NO_DIFFERENCE
        return cls(ci=(lo, hi), verdict=verdict, note=note)


class Speedups(_Model):
    aware: float | None = Field(None, description="reference latency / application-aware latency")
    agnostic: float | None = Field(None, description="reference latency / application-agnostic latency")
    aware_over_agnostic: float | None = Field(None, description="agnostic latency / aware latency")
    aware_over_agnostic_by_point: float | None = Field(None, description=(
        "agnostic_by_point latency / aware latency: the gain over a baseline whose NNs need only err inside their "
        "bounds by their point errors (None where that baseline is the agnostic one)"))
    intervals: dict[str, SpeedupInterval] = Field(default_factory=dict, description=(
        "each ratio's interval and verdict by its field name (aware, agnostic, aware_over_agnostic, "
        "aware_over_agnostic_by_point); empty before result version 5"))

    @classmethod
    def of(cls, reference: Configuration, aware: Configuration | None, agnostic: Configuration | None,
           agnostic_by_point: Configuration | None = None) -> Speedups:
        """The ratios of a run, each with its interval and verdict."""
        pairs = {"aware": (reference, aware), "agnostic": (reference, agnostic),
                 "aware_over_agnostic": (agnostic, aware), "aware_over_agnostic_by_point": (agnostic_by_point, aware)}
        values = {name: slow.latency_ms / fast.latency_ms for name, (slow, fast) in pairs.items()
                  if slow is not None and fast is not None}
        intervals = {name: SpeedupInterval.of(slow, fast) for name, (slow, fast) in pairs.items()
                     if slow is not None and fast is not None}
        return cls(**values, intervals=intervals)

    def describe(self, name: str) -> str:
        """A ratio as the report says it: ``1.19x (95 % interval 1.15-1.23)``, or why it is no gain."""
        return self._said(name, brief=False)

    def brief(self, name: str) -> str:
        """A ratio in a verdict's sentence: ``1.19x (1.15-1.23, untrusted)``; :meth:`describe` says why."""
        return self._said(name, brief=True)

    def _said(self, name: str, brief: bool) -> str:
        value: float | None = getattr(self, name)
        if value is None:
            return "n/a"
        interval = self.intervals.get(name)
        if interval is None:
            return f"{value:.2f}x"
        ci = f"{interval.ci[0]:.2f}-{interval.ci[1]:.2f}" if interval.ci else ""
        if brief:
            parts = (ci, "untrusted" if "untrusted" in interval.note else "")
        else:
            parts = (f"95 % interval {ci}" if ci else "", interval.note)
        note = ("; " if not brief else ", ").join(x for x in parts if x)
        if interval.verdict in (NO_DIFFERENCE, "not comparable"):
            return f"{interval.verdict} ({value:.2f}x" + (f"; {note})" if note and not brief else ")")
        return f"{value:.2f}x" + (f" ({note})" if note else "")


class NNTolerance(_Model):
    """One NN's application-agnostic bound, and where the chosen agnostic configuration's NN sits against it."""

    metric: str
    bound: float = Field(description=(
        "nns.<name>.agnostic_tolerance or its metric's default: a share of the reference error, or rate points"))
    absolute: bool = Field(description="True: the bound is in rate points (a rate metric); False: relative")
    reference_error: float = Field(description="the reference NN's error on its validation data")
    allowed_excess: float = Field(description="the excess over the reference error the bound allows, in the metric's unit")
    chosen_error: float | None = Field(None, description="the agnostic configuration's NN's error (None: none chosen)")
    chosen_excess_ucb: float | None = Field(None, description=(
        "the upper confidence bound of its excess error over the reference's, the figure the rule judges"))
    chosen_frames: int | None = Field(None, description=(
        "the validation frames it was judged on: both splits where a second look decided it, and then "
        "reference_error and allowed_excess are on both too (None: none chosen, or a result before this field)"))


class ExcessJudged(_Model):
    """One NN's excess error over its reference, as the agnostic rule judged it (:class:`qaopt.tolerance.Judgement`)."""

    excess: float = Field(description="candidate error - reference error, on the same validation frames")
    ucb: float = Field(description="the upper confidence bound of that excess, the figure the rule judges")
    allowed: float = Field(description="the excess the bound allows")
    frames: int = Field(description="validation frames both errors were measured on")
    blocks: int = Field(description="resampling blocks those frames make")


class SecondLookTrial(_Model):
    """A unit's trial the first validation split left unresolved, judged again on both splits together
    (:mod:`qaopt.second_look`)."""

    unit: str = Field(description="the unit (an NN, or a merge group's NNs joined by '+')")
    trial: int = Field(description="the trial's number in the unit's study (agnostic.<unit>)")
    params: dict[str, Any] = Field(description="the trial's knobs, as the study sampled them")
    within: bool = Field(description="whether every NN it serves is within tolerance on both splits")
    judged: dict[str, ExcessJudged] = Field(description="NN -> its excess on both splits (on the first alone where "
                                            "the NN has no second split)")
    latency_ms: float | None = Field(None, description="its measured latency, when within (the unit alone)")

    def describe(self) -> str:
        excesses = "; ".join(f"{n}: excess {j.excess:+.4g}, upper bound {j.ucb:+.4g}, allowed {j.allowed:.4g}, on "
                             f"{j.frames} frames" for n, j in self.judged.items())
        verdict = (f"within tolerance, {self.latency_ms:.3g} ms measured" if self.within and self.latency_ms is not None
                   else "within tolerance" if self.within else "still not within tolerance")
        return f"agnostic {self.unit}: trial {self.trial} judged again on both validation splits ({excesses}): {verdict}"


class UnresolvedTrial(_Model):
    """A unit's trial faster than its agnostic winner that erred inside every bound by its point excess, yet was
    rejected because the validation data cannot show it at the rule's confidence: the test, not the candidate, decided.
    """

    unit: str = Field(description="the unit (an NN, or a merge group's NNs joined by '+')")
    trial: int = Field(description="the trial's number in the unit's study (agnostic.<unit>)")
    params: dict[str, Any] = Field(description="the trial's knobs, as the study sampled them")
    quick_ms: float = Field(description="its untuned latency estimate (rejected trials are not tuned)")
    baseline_ms: float | None = Field(description="the unit's fastest latency within tolerance (None: none)")
    judged: dict[str, ExcessJudged] = Field(description="NN -> its excess as judged")
    data_needed: float = Field(description=(
        "how many times the validation data would resolve it (the interval's half-width shrinks as one over the square "
        "root of the data): more validation sequences in nns.<name>.data, or a wider nns.<name>.agnostic_tolerance"))

    def describe(self) -> str:
        """One sentence a user can act on: what the test could not decide, and the two ways to let it."""
        excesses = "; ".join(f"{n}: excess {j.excess:+.4g}, upper bound {j.ucb:+.4g}, allowed {j.allowed:.4g}, on "
                             f"{j.frames} validation frames in {j.blocks} blocks" for n, j in self.judged.items())
        baseline = (f"its winner's {self.baseline_ms:.3g} ms" if self.baseline_ms is not None
                    else "no candidate within tolerance")
        where = " and ".join(f"nns.{n}" for n in self.judged)
        head = (f"agnostic {self.unit}: trial {self.trial} (about {self.quick_ms:.3g} ms untuned, against {baseline}) "
                f"erred inside the bound by its point error, but the validation data cannot show it at the rule's "
                f"confidence ({excesses}); about {self.data_needed:.3g}x the validation frames would decide it")
        if self.data_needed <= PRACTICAL_DATA_FACTOR:
            return (f"{head}: more validation sequences in {where}.data, a second split there (more_validation: the "
                    "study then judges such trials again on both), or a wider agnostic_tolerance there")
        return (f"{head}, more than any practical amount (its point error sits at the bound): only a wider "
                f"agnostic_tolerance in {where} would admit it")


class AgnosticRule(_Model):
    """The rule that made the application-agnostic baseline, and its numbers (:mod:`qaopt.tolerance`)."""

    rule: str = Field(description="the rule in words")
    confidence: float = Field(description="the one-sided confidence of the upper bounds")
    nns: dict[str, NNTolerance]
    unresolved: dict[str, UnresolvedTrial] = Field(default_factory=dict, description=(
        "unit -> its unresolved trial the least data would decide, where its study has one faster than its winner"))
    second_looks: list[SecondLookTrial] = Field(default_factory=list, description=(
        "the trials the first validation split left unresolved, judged again on both splits (nns.<name>.data."
        "more_validation), fastest first until one was within"))


class ConvergenceCurve(_Model):
    """The converged agnostic baseline's best-so-far (:mod:`qaopt.agnostic`): did its per-unit studies run long enough?"""

    trials: int = Field(description="trials spent in all, over every unit's study")
    units: list[str] = Field(default_factory=list, description="the units searched, each in a study of its own")
    best_ms_by_trial: list[float | None] = Field(description=(
        "entry t: the fastest layout's sum of its units' best latencies within tolerance (each measured alone) after "
        "the first t + 1 trials of every unit; None while some unit has none"))


class TrialRecord(_Model):
    """One finished trial of a study: what it sampled, where it fell, and what it measured."""

    number: int
    state: Literal["complete", "failed"]
    params: dict[str, Any] = Field(description="the knobs and schedule Optuna sampled")
    feasible: bool = Field(description="inside the region (aware) or within the reference errors (agnostic)")
    objectives: dict[str, float] = Field(
        default_factory=dict, description="the study's objective values by name (latency in ms, memory in MiB)")
    errors: dict[str, float] = Field(default_factory=dict, description="the error vector in the region's axis names")
    configuration: Configuration | None = Field(None, description="the compiled, tuned configuration (feasible trials)")
    error: str | None = Field(None, description="why the trial failed")
    infeasible: str | None = Field(None, description=(
        "why the trial is infeasible whatever its errors, e.g. an NN that outputs NaN on its validation data"))


class WalkTry(_Model):
    """One combination the informed walk built, with the run's full fine-tuning budget, and judged (:mod:`qaopt.seeding`)."""

    choice: str = Field(description="each unit's knobs, e.g. 'heading+distance: dtype int8, input_scale 0.75'")
    estimated_ms: float = Field(description="the frame's untuned latency as the screening's factors estimate it")
    inside: bool = Field(description="whether the built NNs were inside the study's bounds (the region)")
    role: Literal["cheapest", "fallback"] | None = Field(None, description="the informed trial it became, if any")


class InformedStart(_Model):
    """Why the application-aware study started where it did: what the screening timed and what the walk built.

    The walk's estimates only order it; the trials measure the real latency. A combination the walk never built
    is not here: bisection skips every option cheaper than one it found outside the region.
    """

    reference_ms: dict[str, float] = Field(description=(
        "each unit's untuned reference latency in ms (a unit: an NN alone, or a merge group's merged NN)"))
    factors: dict[str, dict[str, float]] = Field(description=(
        "each probe's untuned latency over its unit's reference (a merged unit takes its lead's factors)"))
    reference_frame_ms: float = Field(description="the reference frame's estimate: no walked combination is dearer")
    walk: list[WalkTry] = Field(default_factory=list, description="every combination built, in the order tried")


class StudySummary(_Model):
    name: str
    trials_complete: int
    trials_failed: int
    trials_feasible: int
    failures: list[str] = Field(default_factory=list, description="why each failed trial failed")
    trials: list[TrialRecord] = Field(default_factory=list, description="every finished trial, in order")
    closed_loop_checks: list[Validation] = Field(default_factory=list, description=(
        "the closed-loop checks run during the search (search.closed_loop), by trial"))
    skipped: str | None = Field(None, description=(
        "why the study ran no trial: an agnostic merge group whose merged NN is outside a member's tolerance before "
        "any other knob"))
    informed: InformedStart | None = Field(None, description=(
        "how the aware study chose its informed first trials (None: the space has no probe, or another study)"))
    held: dict[str, str] = Field(default_factory=dict, description=(
        "knob -> why an agnostic unit's study held it at the reference's setting: its least damaging setting was "
        "already outside tolerance"))

    def feasible_configurations(self) -> list[Configuration]:
        """Every feasible, measured configuration, fastest first (the latency end of the Pareto front leads).

        Not only the front: when closed-loop validation rules the fastest out, the next fastest is the one to try.
        """
        configs = [t.configuration for t in self.trials if t.feasible and t.configuration is not None]
        return sorted(configs, key=lambda c: (c.latency_ms, c.memory_bytes or 0))


RESULT_VERSION = 6
"""Bumped when ``result.json`` changes meaning; 2 added the trials tables, 3 per-metric means, worst runs and
counts' totals in place of every metric's sum, and the region's provenance, 4 the fidelity figures
(:class:`Fidelity`), the closed-loop checks during the search and why a trial is infeasible, 5 each latency's
interval, trust flag and epoch (:class:`Latency`) and each speedup's interval and verdict (:class:`SpeedupInterval`),
6 the agnostic baseline's rule on upper confidence bounds (:class:`AgnosticRule`) and its per-unit search's
convergence (:class:`ConvergenceCurve`). Version-4 files load as they are: the new fields are empty in them."""
FIDELITY_VERSION = 4
"""The first version with :class:`Fidelity`; an older (version-3) file is read with its fidelity recomputed."""


class Result(_Model):
    """The outcome of one ``qaopt optimize`` run: everything the report shows, so the report needs nothing else."""

    version: int = RESULT_VERSION
    app: str
    spec: str
    spec_hash: str
    profile: str
    run_dir: Path
    reference: Configuration
    aware: Configuration | None = Field(None, description="the accepted application-aware configuration")
    agnostic: Configuration | None = Field(None, description="the best accuracy-preserving configuration")
    agnostic_by_point: Configuration | None = Field(None, description=(
        "the agnostic baseline with every trial inside its bounds by its point errors admitted (qaopt.agnostic): what "
        "the tolerance test's validation data could not show within; not run closed-loop. None where it is the "
        "agnostic configuration's NNs"))
    agnostic_tolerance: float | None = Field(None, description=(
        "before result version 6, the one relative bound every NN's point error was held to; now agnostic_rule"))
    agnostic_rule: AgnosticRule | None = Field(None, description=(
        "the agnostic baseline's rule, each NN's bound, and the chosen agnostic NNs' errors and upper bounds"))
    agnostic_converged: ConvergenceCurve | None = Field(None, description=(
        "the agnostic per-unit searches' best-so-far by trial (None before result version 6)"))
    speedups: Speedups
    validations: list[Validation]
    agnostic_validation: Validation | None = Field(
        None, description="the agnostic configuration run closed-loop too, on the fresh acceptance seeds: is "
        "accuracy-preserving compression safe here?")
    acceptance: Validation | None = Field(None, description=(
        "the chosen aware configuration run again on fresh seeds that no check or validation of the run used: "
        "the verdict that accepts it (None before runs recorded one)"))
    fidelity: Fidelity = Field(description="the region's agreement with closed-loop truth in this run")
    validation_power: ValidationPower | None = Field(None, description=(
        "how often validation accepts a configuration by its true failure rate (None before it was recorded)"))
    rebuilt: list[Rebuilt] = Field(default_factory=list, description=(
        "configurations whose NNs were rebuilt into other bytes than the search measured, each re-checked against "
        "the region (empty when every NN used was the one searched)"))
    studies: dict[str, StudySummary]
    finetune: dict[str, Any] = Field(default_factory=dict, description=(
        "the recipe the run fine-tuned and distilled the NNs it built with (qaopt.approx.FinetuneRecipe's fields), "
        "so that a tool that rebuilds a candidate into an empty cache trains it as the run did; empty before it "
        "was recorded (fp32)"))
    tuning: dict[str, Any] = Field(default_factory=dict)
    search_backend: str | None = Field(None, description=(
        "the backend the trials were timed on when the spec named a stand-in (target.search_backend); the "
        "configurations above were then compiled and timed on the target's own backend. None: the same backend"))
    left_out: list[str] = Field(default_factory=list, description=(
        "knob values the spec lists that the target cannot run, left out of the search before its first trial, "
        "each with why and the fix"))
    region: Path
    region_note: str = Field("", description="how the region was obtained: reused, calibrated, or what it replaced")
    stress_strata: dict[str, dict[str, float]] = Field(default_factory=dict, description=(
        "the spec's stress strata (calibration.error_data.stress): each reference NN's error metric on each "
        "stratum, the figures a candidate's stratum errors are compared with; empty without strata"))
    report: Path
    artifacts: dict[str, dict[str, Path]] = Field(default_factory=dict)
    seconds: dict[str, float] = Field(default_factory=dict, description=(
        "wall time of each stage when it computed its artifact, in this process or an earlier one of the run"))
    read_back: list[str] = Field(default_factory=list, description=(
        "stages whose artifact this process read back from an earlier process of the run (their seconds are that "
        "process's; none where it kept no times)"))

    @model_validator(mode="before")
    @classmethod
    def _from_version_3(cls, data: Any) -> Any:
        """A version-3 ``result.json`` (a fidelity share and a note) is read with its :class:`Fidelity` recomputed
        from its validations, so ``qaopt.load_artifacts`` and scripts still read older run folders."""
        if not isinstance(data, dict) or data.get("version") != FIDELITY_VERSION - 1:
            return data
        upgraded = {k: v for k, v in data.items() if k not in ("fidelity", "fidelity_note")}
        validations = [Validation.model_validate(v) for v in data.get("validations", [])]
        return {**upgraded, "version": RESULT_VERSION, "fidelity": Fidelity.of(None, validations)}

    @property
    def aware_accepted(self) -> bool:
        """Whether the aware configuration passed closed-loop validation on the fresh acceptance seeds (else it is only
        the best unrefuted one); for runs recorded before acceptance had its own seeds, the front's validation."""
        if self.aware is None:
            return False
        if self.acceptance is not None:
            return self.acceptance.accepted and self.acceptance.trial == self.aware.trial
        return any(v.accepted and v.trial == self.aware.trial for v in self.validations)

    def save(self, path: str | Path) -> Path:
        return store.write_text(path, self.model_dump_json(indent=2))

    @classmethod
    def load(cls, path: str | Path) -> Result:
        """A run's result; a missing or damaged file is a :class:`QaoptError` naming it and the fix."""
        try:
            return cls.model_validate_json(Path(path).read_bytes())
        except (OSError, ValueError) as exc:  # ValueError: pydantic's ValidationError, undecodable bytes
            why = exc.strerror if isinstance(exc, OSError) else f"{type(exc).__name__}, {str(exc).splitlines()[0]}"
            raise QaoptError(f"{path}: cannot read the run's result ({why}); run `qaopt optimize SPEC` again: it "
                             "resumes from the cache and writes it anew") from None
