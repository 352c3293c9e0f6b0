"""The run plan: everything one ``qaopt optimize`` run decides before its first stage, read from the spec once.

:func:`build_plan` is the one reader of the spec and the profile in the optimize
pipeline. It resolves every budget (profile caps over spec values over options), the
target, each NN's knob space, the run and cache folders, and binds the spec's
application (simulator, QoS goal, field store, NNs) into :class:`BoundApplication`,
whose typed methods are all the stages ask of it. Stages receive the frozen
:class:`RunPlan` and typed artifacts, never the spec, so what a stage depends on is
visible in the plan's fields, and a test builds a plan (or a part of one) without a
YAML file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qaopt import kernels
from qaopt.app_spec import AppSpec, content_hash
from qaopt.calibrate import (
    AcceptanceTest,
    Application,
    Calibration,
    ErrorRegion,
    Evidence,
    Progress,
    QoSGoal,
    RunLimits,
)
from qaopt.profiles import Profile, get_profile
from qaopt.spec_adapter import acceptance_of, cache_dir_of, goal_of, limits_of, make_evaluator
from qaopt.stress import StressSet, record_stress
from qaopt.target_fit import LeftOut, fit_target, searched_on
from qaopt.tolerance import Tolerance

if TYPE_CHECKING:
    from qaopt.approx import FinetuneRecipe


@dataclass(frozen=True)
class ClosedLoopPlan:
    """The closed-loop checks during the aware search: every ``every`` completed trials (0: none), at most
    ``per_round`` configurations a round and ``cap`` in all (``None``: no cap), ``runs`` runs each."""

    every: int
    per_round: int
    cap: int | None
    runs: int


@dataclass(frozen=True)
class BoundApplication:
    """The spec's application as the stages use it: its simulator, QoS goal, field evidence and NNs.

    Built by :func:`build_plan`; it keeps the spec to itself and answers typed questions,
    so no stage reads a spec section.
    """

    _spec: AppSpec = field(repr=False)

    @property
    def source(self) -> Path | None:
        """The spec file, for messages that tell the user what to edit."""
        return self._spec.source

    @property
    def plugins(self) -> tuple[str, ...]:
        """The spec's plugin modules: another process that compiles the NNs imports them for the backends they
        register."""
        return tuple(self._spec.plugins)

    @property
    def key(self) -> str:
        """What closed-loop runs depend on: the simulator, the QoS goal and the NNs (their data defines the axes)."""
        spec = self._spec
        # The agnostic tolerance judges the search's baseline, not what a closed-loop run does: it keys nothing here.
        nns = {name: nn.model_copy(update={"agnostic_tolerance": None}) for name, nn in spec.nns.items()}
        return content_hash({"evaluator": spec.evaluator, "qos": spec.qos, "nns": nns})

    @property
    def evaluation_key(self) -> str:
        """What one closed-loop run's outcome depends on besides its NNs: the simulator and the QoS goal."""
        return self._spec.content_hash("evaluator", "qos")

    @property
    def error_model(self) -> str:
        return self._spec.calibration.error_model

    @property
    def goal(self) -> QoSGoal:
        return goal_of(self._spec)

    @property
    def acceptance(self) -> AcceptanceTest:
        return acceptance_of(self._spec)

    def evaluator(self) -> Application:
        """A new instance of the application's simulator (this process)."""
        return make_evaluator(self._spec)

    @property
    def limits(self) -> RunLimits:
        """How long one simulator call may take and how often a failed one is tried again."""
        return limits_of(self._spec)

    def remote(self) -> Callable[[], Application]:
        """A picklable factory a pool worker builds the application with."""
        from qaopt.executor import SpecEvaluator

        return SpecEvaluator(self._spec)

    def calibration(self, executor: Executor | None) -> Calibration:
        from qaopt.region_calibration import build_calibration

        return build_calibration(self._spec, executor=executor)

    def calibrate(self, calibration: Calibration, budget: int, out: Path, evidence: Sequence[Evidence],
                  info: Mapping[str, Any], progress: Callable[[Progress], None] | None) -> ErrorRegion:
        """Chart the region with ``budget`` evaluations and write ``out/region.json`` (its one writer)."""
        from qaopt.region_calibration import calibrate_spec

        region, _ = calibrate_spec(self._spec, budget=budget, out=out, evidence=evidence, calibration=calibration,
                                   info=info, progress=progress)
        return region

    def field_evidence(self) -> list[Evidence]:
        from qaopt.field.evidence import spec_evidence

        return list(spec_evidence(self._spec).evidence)

    def target_nns(self, cache_dir: Path) -> dict[str, Any]:
        """The spec's NNs as :class:`qaopt.approx.TargetNN`, their errors measured where the spec says."""
        from qaopt.on_policy import target_nns

        return target_nns(self._spec, cache_dir)

    def more_validation(self, nn: Any) -> Any:
        """NN ``nn``'s (a TargetNN's) second validation split (``nns.<name>.data.more_validation``), or ``None``."""
        return nn.more_validation(self._spec.nns[nn.name])

    def stress_set(self, cache_dir: Path, nns: Mapping[str, Any]) -> StressSet | None:
        """The spec's stress strata recorded with the reference ``nns`` (TargetNNs) steering, or ``None`` without strata."""
        return record_stress(self._spec, {n: t.model for n, t in nns.items()},
                             {n: t.fingerprint for n, t in nns.items()}, cache_dir)


@dataclass(frozen=True)
class MergePlan:
    """A group of NNs each trial searches merged (one backbone, a head per NN) or apart (``search.merge``)."""

    nns: tuple[str, ...]
    finetune_steps: int
    freeze: str | None = None
    """The lead's submodule kept as trained while the merged NN distils (``search.merge[].freeze``)."""
    end_to_end_steps: int = 0
    """Steps of the whole merged NN after the frozen ones (``search.merge[].end_to_end_steps``, the profile's cap)."""

    @classmethod
    def of(cls, group, profile: Profile) -> MergePlan:
        """The plan of a spec's ``search.merge`` entry under ``profile``'s cap on end-to-end steps."""
        cap = profile.max_merge_end_to_end_steps
        steps = group.end_to_end_steps if cap is None else min(group.end_to_end_steps, cap)
        return cls(tuple(group.nns), group.finetune_steps, group.freeze, steps)

    @property
    def param(self) -> str:
        """The trial parameter that says whether the group is merged: ``merge.heading+distance``."""
        return f"{MERGE_PARAM_PREFIX}{'+'.join(self.nns)}"


MERGE_PARAM_PREFIX = "merge."


@dataclass(frozen=True)
class RunPlan:
    """One run's decisions, frozen: budgets, folders, the target, the knob spaces and the bound application."""

    app: str
    spec_hash: str
    profile: Profile
    application: BoundApplication
    run_dir: Path
    cache_dir: Path
    storage_url: str
    trials: int
    objectives: tuple[str, ...]
    seed: int
    calibration_budget: int
    region_file: Path | None
    target: kernels.Target
    """Where the chosen NNs run: the reference and the chosen configurations are timed side by side and exported on
    its backend."""
    search_target: kernels.Target
    """Where the trials are timed: ``target`` on ``target.search_backend`` when the spec names one, else ``target``."""
    left_out: tuple[LeftOut, ...]
    """Dtypes the spec lists that the target cannot run, left out of every knob space (each says why)."""
    train_device: str
    finetune: FinetuneRecipe
    """How every NN of the run is fine-tuned and distilled (its precision from ``training.precision``)."""
    knob_spaces: Mapping[str, Any]
    """NN -> its :class:`qaopt.approx.KnobSpace` under the profile's caps, less what the target cannot run."""
    merge_groups: tuple[MergePlan, ...]
    closed_loop: ClosedLoopPlan
    validation_runs: int
    validate_top: int
    tolerances: Mapping[str, Tolerance]
    """NN -> its application-agnostic bound (``nns.<name>.agnostic_tolerance`` or its metric's default)."""

    @property
    def source(self) -> Path | None:
        return self.application.source

    @property
    def backend_name(self) -> str | None:
        """The backend every trial's candidate must run on, or ``None`` when ``auto`` picks one per candidate."""
        return None if self.search_target.backend == "auto" else self.search_target.backend.name

    @property
    def search_backend(self) -> str | None:
        """The stand-in backend the trials are timed on (``target.search_backend``), or ``None`` when it is the
        target's own."""
        return str(self.search_target.backend) if self.search_target.backend != self.target.backend else None

    def study_name(self, mode: str) -> str:
        return f"{self.app}-{self.spec_hash}-{mode}"

    @property
    def threads(self) -> int:
        """The threads the target runs on (the in-process closed-loop runs render with as many)."""
        return self.target.threads or 1

    @property
    def loop_device(self) -> str:
        """Where the candidate NNs run in closed-loop runs: the target's GPU for a CUDA target (the kernels and
        numerics they are deployed with), else this machine's CPU (a remote board's loop runs here)."""
        return "cuda" if self.target.device == "cuda" else "cpu"


def build_plan(
    spec: AppSpec, profile: str | Profile = "default", *, out: str | Path | None = None, storage: str | None = None,
    trials: int | None = None, region: str | Path | None = None, calibration_budget: int | None = None,
    say: Callable[[str], None] = print,
) -> RunPlan:
    """The plan of a run of ``spec`` under ``profile`` with the command's options (``None``: the spec's own).

    ``say`` gets the notices: the spec's training device missing here, dtypes the target cannot run
    (:func:`qaopt.target_fit.fit_target`, which refuses a target this machine lacks before anything runs).
    """
    from qaopt.approx import KnobSpace, SearchLimits
    from qaopt.training import finetune_recipe, training_device

    prof = profile if isinstance(profile, Profile) else get_profile(profile)
    if trials is not None:
        prof = prof.model_copy(update={"trials": trials})
    if calibration_budget is not None:
        prof = prof.model_copy(update={"calibration_budget": calibration_budget})
    run_dir = (Path(out) if out is not None else Path(spec.output.dir)).resolve()
    left_out = fit_target(spec)
    for value in left_out:
        say(str(value))
    limits = SearchLimits(prof.max_prune_steps, prof.max_finetune_steps, prof.max_adapt_steps,
                          tuple(v.dtype for v in left_out))
    checks = spec.search.closed_loop
    return RunPlan(
        app=spec.app.name,
        spec_hash=spec.content_hash(),
        profile=prof,
        application=BoundApplication(spec),
        run_dir=run_dir,
        cache_dir=cache_dir_of(spec),
        storage_url=storage or spec.search.storage or f"sqlite:///{run_dir / 'study.db'}",
        trials=prof.trials or spec.search.trials,
        objectives=tuple(spec.search.objectives),
        seed=spec.search.seed,
        calibration_budget=spec.calibration.budget if prof.calibration_budget is None else prof.calibration_budget,
        region_file=Path(region).resolve() if region is not None else None,
        target=(target := _target(spec, prof)),
        validation_runs=(validation_runs := min(spec.qos.acceptance.max_trials,
                                                prof.validation_runs or spec.qos.acceptance.max_trials)),
        search_target=searched_on(spec, target),
        left_out=left_out,
        train_device=(device := training_device(spec.training, say)),
        finetune=finetune_recipe(spec.training, device, say),
        knob_spaces={name: KnobSpace.from_section(spec.knobs_for(name), limits, nn=name) for name in spec.nns},
        merge_groups=tuple(MergePlan.of(g, prof) for g in spec.search.merge),
        closed_loop=ClosedLoopPlan(
            every=0 if prof.closed_loop_checks == 0 else checks.every,
            per_round=checks.configurations,
            cap=prof.closed_loop_checks,
            runs=min(spec.qos.acceptance.min_trials, validation_runs),
        ),
        validate_top=prof.validate_top,
        tolerances={name: Tolerance.default(nn.error_metric.kind, nn.agnostic_tolerance) for name, nn in spec.nns.items()},
    )


def _target(spec: AppSpec, prof: Profile) -> kernels.Target:
    """The spec's target with the profile's cap on kernel tuning."""
    target = kernels.Target.from_spec(spec.target)
    if prof.tuning_trials is None:
        return target
    tuning = target.tuning
    capped = (kernels.TuningBudget(0, None, tuning.database) if prof.tuning_trials == 0 else
              kernels.TuningBudget(min(tuning.trials or prof.tuning_trials, prof.tuning_trials), tuning.seconds,
                                   tuning.database))
    return replace(target, tuning=capped)
