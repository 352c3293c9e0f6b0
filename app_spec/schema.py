"""The application spec: one YAML file that describes a multi-NN application.

Every section is a frozen pydantic model that forbids unknown fields, so a typo
is caught (and named, with a suggestion) before hours of calibration or tuning
start. Paths are resolved against the spec's folder while validating; the base
folder arrives through pydantic's validation context (see :func:`qaopt.app_spec.load`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from .entrypoints import check_syntax
from .hashing import content_hash
from .nn_errors import CLASS_COMPONENTS, CLASS_METRICS, Component, MetricKind, axis_name
from .store import DEFAULT_CACHE_DIR

MAX_RELATIVE_TOLERANCE = 10.0
"""The largest ``nns.<name>.agnostic_tolerance``: a relative bound of 1000 % of the reference error is no baseline."""

DEFAULT_TIME_LIMIT_S = 1800.0
"""Seconds one simulator call (a block of seeded runs) may take: the shipped examples' slowest block (8 CropFollow
closed-loop runs on one core) takes well under a minute, so only a hung simulator reaches it."""

EntryPoint = Annotated[str, AfterValidator(check_syntax)]
"""A ``package.module:attribute`` reference to user code."""

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]*$"
"""What a name used as a key may hold: a letter or ``_``, then letters, digits, ``_`` and ``-``."""
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
"""A name used as a key in files, databases and CLI flags (an NN, a pass, a registered error model or strategy)."""

ModuleName = Annotated[str, Field(pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")]
"""A Python module, ``package.module``."""


def _finite(value: Any) -> Any:
    """``value`` unchanged if no number in it (nested lists and mappings included) is NaN or infinite."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{item} is not a finite number; numbers in a spec must be finite")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return value


Data = Annotated[Any, AfterValidator(_finite)]
"""A free-form value handed to user code (``params``, ``args``) or to a pass: any YAML, numbers finite."""


def Count(upper: int, unit: str, why: str) -> Any:  # noqa: N802 - a type, spelt like one
    """A positive integer of at most ``upper`` ``unit``; ``why`` says what a larger value would do."""

    def check(value: int) -> int:
        if value > upper:
            raise ValueError(f"at most {upper} {unit}: {why}")
        return value

    return Annotated[int, Field(gt=0), AfterValidator(check)]


def _base_dir(info: ValidationInfo) -> Path:
    context = info.context or {}
    return Path(context.get("base_dir", "."))


def _resolve(value: Path, info: ValidationInfo) -> Path:
    return value if value.is_absolute() else (_base_dir(info) / value).resolve()


def _existing_file(value: Path, info: ValidationInfo) -> Path:
    path = _resolve(value, info)
    if not path.is_file():
        raise ValueError(f"file not found: {path} (relative paths are read from the spec's folder)")
    return path


SpecPath = Annotated[Path, AfterValidator(_resolve)]
"""A path; relative ones are read from the spec's folder."""

ExistingFile = Annotated[Path, AfterValidator(_existing_file)]


def _resolve_url(url: str, info: ValidationInfo) -> str:
    """Resolve a relative SQLite path against the spec's folder; other URLs pass unchanged.

    A bare path (no ``://``) is taken to be a SQLite file, the common case on one machine.
    """
    if "://" not in url:
        url = f"sqlite:///{url}"
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and url != prefix + ":memory:":
        url = prefix + str(_resolve(Path(url[len(prefix) :]), info))
    return url


DatabaseURL = Annotated[str, AfterValidator(_resolve_url)]
"""A SQLAlchemy URL or a SQLite file path."""


class Section(BaseModel):
    """Base of every spec section: unknown fields are errors, values never change."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # allow_inf_nan=False: every float field is finite; a field that needs inf or NaN says so itself.
    LEFT_OUT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ()
    """Fields added after specs were written: left out of the dump while at their default, so the content hashes
    of those specs (and the caches keyed by them) hold."""

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        data = handler(self)
        if isinstance(data, dict):
            for name in self.LEFT_OUT_AT_DEFAULT:
                if getattr(self, name) == type(self).model_fields[name].get_default(call_default_factory=True):
                    data.pop(name, None)
        return data


# ---------------------------------------------------------------- app, evaluator


class AppInfo(Section):
    name: Name
    description: str = ""


class SimulatorSource(Section):
    """A simulator that runs the whole application closed-loop.

    A Python entry point (a class or factory called with ``params``) that returns an
    object keeping the application protocol (:class:`qaopt.calibrate.Application`).
    A Gymnasium environment is wrapped in such a class (``docs/tutorial.md``).
    """

    entry_point: EntryPoint
    params: dict[str, Data] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _no_env_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and "env_id" in data:
            raise ValueError(
                "evaluator.simulator.env_id: removed (calibration never ran a bare Gymnasium environment); wrap "
                "the environment in a class that keeps the application protocol (nn_names, evaluate, "
                "evaluate_perception: docs/tutorial.md) and name it with entry_point: module:Class"
            )
        return data


def _pattern(regex: str, what: str, example: str) -> Any:
    """A string matching ``regex``; an error says it is not ``what`` and shows ``example``."""

    def check(value: str) -> str:
        if not re.fullmatch(regex, value):
            raise ValueError(f"{value!r} is not {what}; write e.g. {example}")
        return value

    return Annotated[str, AfterValidator(check)]


RosTopic = _pattern(r"/[A-Za-z0-9_/~]{0,254}[A-Za-z0-9_]", "a fully qualified ROS 2 topic", "/odom or /qaopt/events")
"""A ROS 2 topic as a bag names it: ``/odom``, ``/qaopt/events``."""

MessageField = _pattern(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*", "a dotted path into a ROS 2 message",
                        "pose.pose.position")
"""A dotted path into a ROS 2 message: ``pose.pose.position``, ``data``."""

EventKindName = _pattern(r"[a-z][a-z0-9_]*", "an event kind (lower case, digits and _)", "collision")

TopicPrefix = _pattern(r"/.*", "a topic prefix", "/qos/")

BAG_SECTION = "evaluator.field.bag"
"""Where a spec holds its :class:`BagMapping`; errors about the mapping name its fields under it."""

JSON_EVENTS = "json"
"""An event topic whose ``std_msgs/String`` messages carry qaopt's JSON events (``{"event": "collision"}``)."""


class BagDistance(Section):
    """Which topic of a bag says how far the robot drove, and how to read it."""

    topic: RosTopic = "/odom"
    source: Literal["position", "velocity", "odometer"] = Field("position", description=(
        "position: add up the distance between consecutive positions (x, y) of `field` (default "
        "pose.pose.position, as in nav_msgs/msg/Odometry); velocity: integrate the speed |(x, y)| of `field` "
        "(default twist.twist.linear) over time; odometer: `field` (default data, as in std_msgs/msg/Float64) "
        "reads metres driven, and a run's distance is its last reading minus its first"))
    field: MessageField | None = Field(None, description="the message field read (default: see source)")


class BagRuns(Section):
    """Where one run of a bag ends and the next begins: a start/stop topic, or a pause in the distance topic."""

    topic: RosTopic | None = Field("/qaopt/run", description=(
        "a std_msgs/String of JSON ({\"run\": \"start\", ...} / {\"run\": \"end\", ...}) or a std_msgs/Bool "
        "(true: start, false: end)"))
    gap_s: float | None = Field(None, gt=0, description=(
        "instead of a topic: a silence of the distance topic longer than this many seconds ends a run"))

    @model_validator(mode="before")
    @classmethod
    def _gap_instead_of_topic(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("gap_s") is not None and "topic" not in data:
            data = {**data, "topic": None}  # `runs: {gap_s: 10}` replaces the default topic
        return data

    @model_validator(mode="after")
    def _one_way(self) -> BagRuns:
        if (self.topic is None) == (self.gap_s is None):
            raise ValueError("give runs.topic (a start/stop topic) or runs.gap_s (split on a pause of the "
                             "distance topic), not both; set `runs: null` for one run per bag")
        return self


PARAMETER_EVENTS = "/parameter_events"
"""Where ROS 2 publishes every node's parameter changes (``rcl_interfaces/msg/ParameterEvent``)."""


class BagParameter(Section):
    """A node's parameter that names the configuration, as recorded on ``/parameter_events``."""

    node: RosTopic = Field(description="the node's fully qualified name, e.g. /cropfollow")
    parameter: str = Field(min_length=1, description=(
        "a string parameter holding the configuration's hash or its JSON, e.g. qaopt_config"))


class BagMapping(Section):
    """How ``qaopt field import-bag`` turns a ROS 2 bag (MCAP) into field runs (docs/field.md, "ROS 2 bags").

    The defaults read qaopt's recording convention: odometry on ``/odom`` and ``std_msgs/String``
    topics of JSON on ``/qaopt/run``, ``/qaopt/events`` and ``/qaopt/config``.
    """

    distance: BagDistance = Field(default_factory=BagDistance)
    events: dict[RosTopic, EventKindName] = Field(
        default_factory=lambda: {"/qaopt/events": JSON_EVENTS}, description=(
            "topic -> event kind (collision, intervention, disengagement or one of your own): each message is one "
            "event, a std_msgs/Bool one each time it turns true; 'json': std_msgs/String messages of JSON events "
            "({\"event\": \"collision\", ...})"))
    config: RosTopic | BagParameter | None = Field("/qaopt/config", description=(
        "a latched std_msgs/String naming the configuration that ran: its hash, or JSON {\"hash\", \"knobs\", "
        "\"nn_errors\", \"error_point\"}; or {node, parameter}: a node's string parameter holding the same, read "
        "from /parameter_events (record that topic); the last one before a run starts is that run's"))
    runs: BagRuns | None = Field(default_factory=BagRuns, description="null: the whole bag is one run")
    metadata: str = Field("qaopt", min_length=1, description=(
        "the MCAP metadata record whose keys are the bag's conditions (weather, field, ...), operator and notes"))
    watch: list[TopicPrefix] = Field(default_factory=lambda: ["/qaopt/", "/qos/"], description=(
        "topic prefixes of QoS events: a topic of the bag under one of them that the mapping does not read is an "
        "error (an event that is never counted would make the field look better than it is)"))
    ignore: list[RosTopic] = Field(default_factory=list, description="topics under `watch` to leave out on purpose")

    @model_validator(mode="after")
    def _each_topic_once(self) -> BagMapping:
        uses = self.topic_fields()
        seen: dict[str, str] = {}
        for where, topic in uses:
            if topic in seen:
                raise ValueError(f"{BAG_SECTION}.{where}: topic {topic} is already read by {seen[topic]}; "
                                 "give each topic one role")
            seen[topic] = where
        for i, topic in enumerate(self.ignore):
            if topic in seen:
                raise ValueError(f"{BAG_SECTION}.ignore.{i}: topic {topic} is read by {seen[topic]}; "
                                 "remove it from ignore")
        return self

    def topic_fields(self) -> list[tuple[str, str]]:
        """``(field path, topic)`` of every topic the mapping reads, for errors that name the field to fix."""
        uses = [("distance.topic", self.distance.topic)]
        uses += [(f"events.{topic}", topic) for topic in self.events]
        if isinstance(self.config, BagParameter):
            uses.append(("config", PARAMETER_EVENTS))
        elif self.config is not None:
            uses.append(("config", self.config))
        if self.runs is not None and self.runs.topic is not None:
            uses.append(("runs.topic", self.runs.topic))
        return uses


class FieldSource(Section):
    """Where field-trial runs are logged; they are evidence for calibration."""

    store: DatabaseURL
    # How bags are read changes no computed result (the runs land in the store), so it keys no cache.
    bag: BagMapping | None = Field(None, exclude=True, description=(
        "how `qaopt field import-bag` reads a ROS 2 bag (default: qaopt's recording convention)"))


class EvaluatorSpec(Section):
    simulator: SimulatorSource | None = None
    field: FieldSource | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> EvaluatorSpec:
        if self.simulator is None and self.field is None:
            raise ValueError("give a 'simulator', a 'field' store, or both")
        return self


# ---------------------------------------------------------------- QoS


MAX_TRIALS = 1000
"""Upper bound of a point's runs (``qos.acceptance.*_trials``): the sequential test's tables grow
with it (1000 takes seconds to prepare; 10**12 ran calibrate out of memory)."""
Trials = Count(MAX_TRIALS, "runs per point", "the sequential test's tables grow with it; to decide points sooner, "
               "raise max_failure_rate or lower confidence")


class Acceptance(Section):
    """When an error point counts as valid: P(run passes) >= 1 - max_failure_rate at `confidence`."""

    max_failure_rate: float = Field(0.05, gt=0.0, lt=1.0)
    confidence: float = Field(0.9, gt=0.5, lt=1.0)
    min_trials: Trials = 8
    max_trials: Trials = 96

    @model_validator(mode="after")
    def _ordered(self) -> Acceptance:
        if self.min_trials > self.max_trials:
            raise ValueError(f"min_trials ({self.min_trials}) must not exceed max_trials ({self.max_trials})")
        return self


class QoSSpec(Section):
    """The application's quality-of-service goal: one metric, bounded above and/or below."""

    metric: str
    max: float | None = None
    min: float | None = None
    acceptance: Acceptance = Field(default_factory=Acceptance)

    @model_validator(mode="after")
    def _has_bound(self) -> QoSSpec:
        if self.max is None and self.min is None:
            raise ValueError(f"give the goal for {self.metric!r} as 'max' (pass when metric <= max) and/or 'min'")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max}): no run could pass")
        return self


# ---------------------------------------------------------------- NNs


class NNOutput(Section):
    name: Name
    unit: str = ""


class ErrorMetric(Section):
    """The NN-level error: what calibration bounds and approx measures (``qaopt.app_spec.nn_errors``).

    A regression metric (``l1``, ``rmse``, ``mse``, ``max_abs``) is in the output's unit; a class
    metric (``miss_rate``, ``false_alarm_rate``) is a rate in [0, 1] of a detector's output thresholded
    at ``threshold`` against 0/1 labels (docs/calibration.md, "NNs with discrete outputs").
    """

    kind: MetricKind = Field("l1", description=(
        "l1 / rmse / mse / max_abs: of the residuals prediction - truth, in the output's unit; miss_rate: "
        "P(output < threshold | truth 1), false_alarm_rate: P(output >= threshold | truth 0), for a detector "
        "or binary classifier whose truth is a 0/1 label"))
    output: Name
    threshold: float = Field(0.5, gt=0.0, le=1.0, description=(
        "the decision threshold on the output, as the application applies it (output >= threshold means "
        "'present'); only meaningful for miss_rate / false_alarm_rate. The truth is positive when >= 0.5 "
        "(labels 0/1), and calibration injects the outputs 0.0 and 1.0, so 0 < threshold <= 1"))

    @model_validator(mode="after")
    def _threshold_for_classes(self) -> ErrorMetric:
        if self.kind not in CLASS_METRICS and self.threshold != 0.5:
            raise ValueError(f"threshold is only meaningful for the class metrics ({', '.join(CLASS_METRICS)}): "
                             f"a {self.kind!r} metric compares outputs with truths, not with a threshold; "
                             "remove error_metric.threshold")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        # A regression metric has no threshold (always the default): leaving it out keeps the content
        # hashes, and so the caches, of specs written before class metrics existed.
        data = handler(self)
        if self.kind not in CLASS_METRICS and isinstance(data, dict):
            data.pop("threshold", None)
        return data


class DataSpec(Section):
    """A callable returning the NN's training and time-ordered validation data."""

    source: EntryPoint
    args: dict[str, Data] = Field(default_factory=dict)
    LEFT_OUT_AT_DEFAULT = ("more_validation",)
    more_validation: dict[str, Data] | None = Field(None, description=(
        "args that, merged into args, make the source return another validation split (CropFollow: {seed: 1, "
        "n_train: 1, val_drives: 48}; its training split is not used). The application-agnostic tolerance test "
        "judges a trial that the validation split cannot decide (inside its bound by its point error, outside by its "
        "upper bound) again on both splits together, and only such trials (docs/knobs.md, 'A second look')"))

    @model_validator(mode="after")
    def _more_validation_changes_the_data(self) -> DataSpec:
        if self.more_validation is not None and {**self.args, **self.more_validation} == self.args:
            raise ValueError("more_validation: merged into args it changes nothing, so the source would return the "
                             "same validation split; give the args of other data (another seed, more drives), or "
                             "remove it")
        return self


class NNSpec(Section):
    model: EntryPoint
    args: dict[str, Data] = Field(default_factory=dict)
    weights: ExistingFile | None = None
    input_shape: list[Count(1 << 16, "per dimension", "no NN input is that large")] = Field(min_length=2, max_length=8)
    outputs: list[NNOutput] = Field(min_length=1, max_length=1024)
    error_metric: ErrorMetric
    data: DataSpec
    input: Name | None = Field(None, description=(
        "the input stream the NN reads (a camera, a lidar): NNs that name the same input read the same frame, "
        "and may share one backbone (search.merge)"))
    LEFT_OUT_AT_DEFAULT = ("agnostic_tolerance",)
    agnostic_tolerance: float | None = Field(None, ge=0.0, le=MAX_RELATIVE_TOLERANCE, description=(
        "how much worse than the reference this NN may err in the application-agnostic baseline, judged on the upper "
        "95 % confidence bound of the excess error (qaopt.tolerance, docs/knobs.md): for l1 / rmse / mse / max_abs "
        "a share of the reference error (default 0.02: 2 %); for miss_rate / false_alarm_rate an absolute bound in "
        "rate points (default 0.005: half a point)"))

    @model_validator(mode="after")
    def _metric_names_an_output(self) -> NNSpec:
        names = [o.name for o in self.outputs]
        if self.error_metric.output not in names:
            raise ValueError(f"error_metric.output {self.error_metric.output!r} is not one of the outputs {names}")
        bound = self.agnostic_tolerance
        if bound is not None and self.error_metric.kind in CLASS_METRICS and bound >= 1.0:
            raise ValueError(f"agnostic_tolerance: {bound} is in rate points for the {self.error_metric.kind} metric "
                             "(0.005 is half a point), and a bound of 1 or more accepts any detector; give a rate "
                             "below 1, e.g. 0.005")
        return self


# ---------------------------------------------------------------- calibration


class Axis(Section):
    """One dimension of the error space: an NN's error metric, or its bias or sigma."""

    nn: Name
    component: Component = "metric"
    min: float = Field(0.0, ge=0.0)
    max: float = Field(gt=0.0)

    @model_validator(mode="after")
    def _non_empty(self) -> Axis:
        if self.max <= self.min:
            raise ValueError(f"empty error range: max ({self.max}) must be above min ({self.min})")
        return self

    @property
    def key(self) -> str:
        """The axis' name in regions and reports: ``heading`` or ``heading.sigma``."""
        return axis_name(self.nn, self.component)


class StressStratum(Section):
    """One stress stratum: drives of the application's simulator with some of its params changed.

    The params are merged into ``evaluator.simulator.params`` (nested mappings key by key), so a stratum names
    only what it stresses: ``{field: {gap_prob_per_m: 0.5}}`` for rows full of gaps, ``{initial_lateral_m:
    0.2}`` for drives that start off-centre and recover.
    """

    name: Name
    params: dict[str, Data] = Field(default_factory=dict, description=(
        "simulator params for these drives, merged into evaluator.simulator.params"))
    drives: Count(10_000, "drives", "recording that many drives would take hours") = Field(8, description=(
        "drives of this stratum (one seed each)"))
    steps: Count(100_000, "steps", "a drive that long would not fit in memory") = Field(100, ge=2, description=(
        "perception steps per drive"))


class ErrorDataSpec(Section):
    """Where each NN's error is measured: the frames that give a candidate its point in the error space."""

    source: Literal["auto", "on-policy", "dataset"] = Field("auto", description=(
        "on-policy: drives steered by the reference NNs in the simulator's loop, recorded once and cached (the "
        "frames the application really sees); dataset: the validation split of each NN's data; auto: on-policy "
        "when the simulator can record drives (record_perception), else dataset"))
    drives: Count(10_000, "drives", "recording that many drives would take hours") = Field(16, description=(
        "on-policy drives (one seed each)"))
    steps: Count(100_000, "steps", "a drive that long would not fit in memory") = Field(100, ge=2, description=(
        "perception steps per on-policy drive"))
    LEFT_OUT_AT_DEFAULT = ("stress",)
    stress: list[StressStratum] = Field(default_factory=list, max_length=16, description=(
        "stress strata: drives in the states where the application fails (gaps, curves, off-centre starts), "
        "recorded with the reference NNs steering; a candidate's coordinate on an NN's metric axis is its error, "
        "or the reference's error scaled by the candidate's worst degradation on a stratum, whichever is larger "
        "(docs/calibration.md, 'Stress strata')"))

    @model_validator(mode="after")
    def _distinct_strata(self) -> ErrorDataSpec:
        names = [s.name for s in self.stress]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"stress stratum {dup[0]!r} is listed twice; give each stratum its own name")
        return self


class CalibrationSpec(Section):
    """``calibration``: the error space, and how its region is searched and judged.

    ``strategy``, ``certifier`` and ``error_model`` name entries of calibration's open
    registries, which this package cannot see: any sane name loads here, and
    ``qaopt.spec.load_spec`` checks it against the registry (after importing the
    spec's ``plugins``), placing a misspelt one at its line.
    """

    strategy: Name = Field("boundary", description=(
        "a registered region strategy (boundary, bisect, monotone, active, or one added with "
        "qaopt.calibrate.register_strategy): how the next point (and, for boundary, its number of runs) is chosen"))
    certifier: Name = Field("pooled", description=(
        "a registered certifier: pooled, one monotone model of P(fail) over every run certifies the region; "
        "per-point, only points dominated by a point its own runs accepted (ApproxCaliper's rule); or one added "
        "with qaopt.calibrate.register_certifier"))
    budget: Count(100_000, "evaluations", "a region search that long would run for weeks") = 20
    runs: Count(10_000_000, "simulator runs", "a region search that long would run for weeks") | None = Field(
        None, description="at most this many simulator runs in all (default: no limit beyond the budget)")
    seed: int = Field(0, ge=0, lt=2**32, description=(
        "seeds the calibration's runs: each point draws its own seeds from it; 0 <= seed < 2**32"))
    error_model: Name = Field("gaussian", description=(
        "a registered error model (gaussian, ar1, ar1-profile, empirical, shaped, or one added with "
        "qaopt.calibrate.register_error_model): how an NN's injected errors look"))
    error_data: ErrorDataSpec = Field(default_factory=ErrorDataSpec)
    space: list[Axis] = Field(min_length=1, max_length=32)

    @model_validator(mode="after")
    def _consistent(self) -> CalibrationSpec:
        keys = [a.key for a in self.space]
        if len(set(keys)) != len(keys):
            raise ValueError(f"an axis appears twice in space: {keys}")
        return self


# ---------------------------------------------------------------- approximations

PassSections = dict[Name, dict[str, Data] | None]
"""One ``approximations.<nn>`` section: approximation pass name -> its settings (``None``: off).

The passes and their settings are declared by :mod:`qaopt.approx`'s registry, which
app_spec does not import: a section is validated against its pass there, by the
loader every qaopt command uses (``qaopt.spec.load_spec``).
"""


# ---------------------------------------------------------------- target, search, output


class RPCSpec(Section):
    """A remote device reached over TVM RPC, directly or through a tracker."""

    host: str
    port: int = Field(9090, ge=1, le=65535)
    key: str | None = None
    tracker: bool = False
    retries: int = Field(2, ge=0, le=100, description="reconnects after a device drops mid-measurement")
    timeout_s: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _tracker_needs_key(self) -> RPCSpec:
        if self.tracker and not self.key:
            raise ValueError("a tracker needs the device 'key' to request")
        return self

    def __str__(self) -> str:
        return f"tracker {self.host}:{self.port} key '{self.key}'" if self.tracker else f"{self.host}:{self.port}"


class TuningSpec(Section):
    trials: int = Field(64, ge=0, le=100_000, description="MetaSchedule trials per NN (at most 100000)")
    seconds: float | None = Field(None, gt=0)
    database: SpecPath | None = None


BACKEND_REF_PATTERN = r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)(?:\[(?P<variant>[A-Za-z0-9_.=-]+)\])?$"
"""A backend reference: a name, optionally a variant in brackets. Whether it is registered is
checked by :meth:`qaopt.kernels.Target.from_spec` (this package cannot see the registry)."""


Device = Literal["cpu", "cuda", "rpc"]
"""Where a target runs: this machine's CPU, its CUDA GPU, or a remote device over TVM RPC."""
DEVICES: tuple[str, ...] = get_args(Device)


class TargetSpec(Section):
    device: Device = "cpu"
    backend: str = Field("auto", pattern=BACKEND_REF_PATTERN, description=(
        "a registered backend (torch, torch-compile, tvm, onnxruntime, auto, or one added with "
        "qaopt.kernels.register_backend), with an optional variant in brackets, e.g. torch[channels_last]"))
    backends: list[Annotated[str, Field(pattern=BACKEND_REF_PATTERN)]] | None = Field(None, min_length=1, description=(
        "with backend auto: the backends it measures and chooses among (default: each device's own list, "
        "docs/latency.md), e.g. [torch[cuda_graph], torch-compile, tvm] to race TVM on a GPU"))
    search_backend: str | None = Field(None, pattern=BACKEND_REF_PATTERN, description=(
        "the backend the search times its trials on, when building every candidate on 'backend' costs too much "
        "(auto compiles each with Inductor too, 20-30 s apiece on a GPU): the reference and the configurations "
        "the studies choose, aware and agnostic, are compiled again on 'backend' before they are timed side by "
        "side and exported, so both sides of the comparison get its fastest. Default: 'backend' itself"))
    threads: Count(1024, "threads", "no target has that many cores") | None = None
    mcpu: str | None = Field(None, description="LLVM CPU for TVM; default: this host's")
    mtriple: str | None = Field(None, description="LLVM target triple when cross-compiling, e.g. aarch64-linux-gnu")
    cc: str | None = Field(None, description="cross compiler that links TVM's library, e.g. aarch64-linux-gnu-g++")
    tuning: TuningSpec = Field(default_factory=TuningSpec)
    rpc: RPCSpec | None = None

    @model_validator(mode="after")
    def _backends_for_auto(self) -> TargetSpec:
        if self.backends is not None and self.backend != "auto":
            raise ValueError(f"'backends' lists what backend 'auto' measures, but backend is {self.backend!r}; "
                             "set backend: auto or drop backends")
        if self.backends is not None and "auto" in self.backends:
            raise ValueError("'backends' lists the backends auto measures; 'auto' is not one of them")
        return self

    @model_validator(mode="after")
    def _rpc_when_remote(self) -> TargetSpec:
        if self.device == "rpc" and self.rpc is None:
            raise ValueError("device 'rpc' needs an 'rpc' section with the device's host and port")
        if self.device != "rpc" and self.rpc is not None:
            raise ValueError(f"an 'rpc' section is given but device is {self.device!r}; set device: rpc")
        return self


TrainingDevice = Literal["auto", "cpu", "cuda"]
TRAINING_DEVICES: tuple[str, ...] = get_args(TrainingDevice)
TrainingPrecision = Literal["auto", "fp32", "bf16"]


class TrainingSpec(Section):
    """Where NNs are trained (pruning ladders, fine-tuning), apart from the target their latency is measured on.

    Training belongs where the compute is (a workstation's GPU), measurement where the
    robot is (``target``): a candidate fine-tuned on a GPU is cached like one fine-tuned
    on the CPU and serves runs on either.
    """

    device: TrainingDevice = Field("auto", description=(
        "torch device that trains: auto (cuda when torch sees a GPU, else cpu), cpu or cuda"))
    required: bool = Field(False, description=(
        "with device: cuda, fail when there is no GPU instead of training on the CPU with a notice"))
    precision: TrainingPrecision = Field("auto", description=(
        "arithmetic of fine-tuning and distillation: auto (bf16 mixed precision on a CPU with bf16 instructions, "
        "fp32 elsewhere), fp32, or bf16 (mixed precision: weights and optimizer stay fp32)"))


MAX_CHECKS_PER_ROUND = 100
"""Upper bound of ``search.closed_loop.configurations``: a front rarely holds more, and each costs a block of runs."""


class ClosedLoopChecksSpec(Section):
    """Closed-loop checks during the application-aware search (see docs/calibration.md).

    Real approximated NNs run the application where the region is least sure of a
    configuration that may become the result; a failure corrects the region for the
    trials that follow.
    """

    every: int = Field(10, ge=0, le=100_000, description=(
        "after every this many completed trials of the application-aware study, check the front's unchecked "
        "configurations closed-loop; 0: no checks during the search (validation still runs after it)"))
    configurations: int = Field(2, ge=1, le=MAX_CHECKS_PER_ROUND, description=(
        "at most this many configurations per round: feasible ones on the current Pareto front that were not "
        "checked yet, nearest the region's boundary first; each costs qos.acceptance.min_trials closed-loop runs"))


class MergeSpec(Section):
    """One group of NNs the search may merge into one backbone with a head per NN (or keep apart)."""

    nns: list[Name] = Field(min_length=2, max_length=16, description=(
        "NNs that read the same input (nns.<name>.input): merged, the largest one's backbone serves them all"))
    finetune_steps: Count(1_000_000, "steps", "distilling that long would take days") = Field(300, description=(
        "distillation steps that teach the merged NN every member's outputs, once per group, before any other knob"))
    freeze: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_0-9]+)*$", description=(
        "a submodule of the lead NN (its attribute path, e.g. backbone) kept as trained: its outputs on the training "
        "frames are computed once and only what reads them distils, several times faster per step; unset: the "
        "whole merged NN distils end to end"))
    end_to_end_steps: Count(1_000_000, "steps", "distilling that long would take days") = Field(0, description=(
        "with freeze: after the frozen distillation, this many steps distil the whole merged NN end to end, so the "
        "backbone adapts to every head; 0: the frozen part stays as the lead trained it"))

    @model_validator(mode="after")
    def _end_to_end_needs_freeze(self) -> MergeSpec:
        if self.end_to_end_steps and self.freeze is None:
            raise ValueError("end_to_end_steps follows a frozen distillation; without freeze the finetune_steps "
                             "already distil end to end: set freeze (e.g. backbone) or drop end_to_end_steps")
        return self


class SearchSpec(Section):
    trials: Count(100_000, "trials", "each builds, fine-tunes and measures a candidate NN") = 40
    objectives: list[Literal["latency", "memory"]] = Field(default_factory=lambda: ["latency", "memory"], min_length=1)
    storage: DatabaseURL | None = None
    seed: int = Field(0, ge=0, lt=2**32, description="seeds Optuna's sampler: 0 <= seed < 2**32")
    closed_loop: ClosedLoopChecksSpec = Field(default_factory=ClosedLoopChecksSpec, description=(
        "closed-loop checks with the real NNs during the search, correcting the region as it goes"))
    merge: list[MergeSpec] = Field(default_factory=list, description=(
        "groups of NNs that read the same input; each trial searches each group merged (one shared backbone, "
        "one head per NN) or apart"))


class OutputSpec(Section):
    """Where runs write their results, and where expensive results are cached across runs."""

    dir: SpecPath = Path("runs")
    cache_dir: SpecPath = DEFAULT_CACHE_DIR  # the one default, app_spec.store's
    cluster: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9+.-]*://\S+$", max_length=500, description=(
        "address of a Dask scheduler (tcp://host:8786) that runs calibration's and closed-loop validation's "
        "simulator runs; --cluster overrides it; without it they run in a local process pool"))
    time_limit_s: float = Field(default=DEFAULT_TIME_LIMIT_S, gt=0, le=7 * 24 * 3600, description=(
        "wall-clock seconds one call of the simulator (a block of seeded runs) may take before it counts as hung: "
        "the run then stops with an application error naming the seeds. Unset, a call counts as hung sooner, past "
        "ten times the median of the run's earlier calls (at least 60 s, docs/faults.md); set, it is the limit; "
        "--time-limit overrides it"))
    retries: int = Field(default=0, ge=0, le=10, description=(
        "how often a simulator call that raised or hung is tried again before the run stops with its error "
        "(for transient failures: a license server, a socket); a deterministic bug fails every attempt"))


# ---------------------------------------------------------------- the spec


class AppSpec(Section):
    """A whole application: what it is, how its QoS is measured, its NNs, and what to search."""

    app: AppInfo
    plugins: list[ModuleName] = Field(default_factory=list, description=(
        "modules imported (the spec's folder on the import path) before the approximations, target.backend and "
        "calibration's error model, strategy and certifier are checked: each registers approximation passes, "
        "backends, error models, region strategies or certifiers"))
    evaluator: EvaluatorSpec
    qos: QoSSpec
    nns: dict[Name, NNSpec] = Field(min_length=1)
    calibration: CalibrationSpec
    approximations: dict[str, PassSections] = Field(default_factory=dict)
    target: TargetSpec = Field(default_factory=TargetSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    source: Path | None = Field(None, exclude=True, description="the YAML file this spec was read from")

    @field_validator("approximations")
    @classmethod
    def _approximation_keys(cls, value: dict[str, PassSections], info: ValidationInfo) -> dict[str, PassSections]:
        nns = info.data.get("nns") or {}
        for key in value:
            if key != "all" and key not in nns:
                raise ValueError(f"approximations.{key}: no NN named {key!r}; use 'all' or one of {sorted(nns)}")
        return value

    @model_validator(mode="after")
    def _axes_name_nns(self) -> AppSpec:
        for i, axis in enumerate(self.calibration.space):
            if axis.nn not in self.nns:
                raise ValueError(
                    f"calibration.space.{i}.nn: no NN named {axis.nn!r}; the spec's NNs are {sorted(self.nns)}"
                )
            kind = self.nns[axis.nn].error_metric.kind
            if kind in CLASS_METRICS and axis.component not in CLASS_COMPONENTS:
                raise ValueError(
                    f"calibration.space.{i}.component: {axis.component!r} means nothing for NN {axis.nn!r}, whose "
                    f"error metric {kind!r} is a rate of misses or false alarms (its per-frame errors are confusion "
                    f"codes, which have no bias or sigma); use component: metric (the {kind}), or leave it out"
                )
        self._check_merge_groups()
        runs, first = self.calibration.runs, self.qos.acceptance.min_trials
        if runs is not None and runs < first:
            raise ValueError(f"calibration.runs: {runs} simulator runs cannot judge even the reference point, which "
                             f"needs qos.acceptance.min_trials = {first}; raise calibration.runs or leave it out")
        return self

    def _check_merge_groups(self) -> None:
        grouped: dict[str, int] = {}
        for i, group in enumerate(self.search.merge):
            for j, name in enumerate(group.nns):
                if name not in self.nns:
                    raise ValueError(f"search.merge.{i}.nns.{j}: no NN named {name!r}; the spec's NNs are {sorted(self.nns)}")
                if name in grouped:
                    raise ValueError(f"search.merge.{i}.nns.{j}: NN {name!r} is already in merge group {grouped[name]}; "
                                     "an NN can be merged with one group only")
                grouped[name] = i
            inputs = {name: self.nns[name].input for name in group.nns}
            undeclared = [name for name, source in inputs.items() if source is None]
            if undeclared:
                verb = "declares" if len(undeclared) == 1 else "declare"
                raise ValueError(f"search.merge.{i}.nns: {', '.join(undeclared)} {verb} no input; NNs are merged only "
                                 f"when they read the same input: give each nns.<name>.input the same name (e.g. camera)")
            if len(set(inputs.values())) > 1:
                reads = ", ".join(f"{name} reads {source!r}" for name, source in inputs.items())
                raise ValueError(f"search.merge.{i}.nns: these NNs read different inputs ({reads}); only NNs that read "
                                 "the same input can share a backbone")
            shapes = {name: tuple(self.nns[name].input_shape) for name in group.nns}
            if len(set(shapes.values())) > 1:
                raise ValueError(f"search.merge.{i}.nns: these NNs take inputs of different shapes ({shapes}); NNs that "
                                 "read the same input take the same input_shape")

    def knobs_for(self, nn: str) -> PassSections:
        """The approximations searched for ``nn``: its own section, else ``all``, else none."""
        return self.approximations[nn] if nn in self.approximations else self.approximations.get("all", {})

    def content_hash(self, *sections: str) -> str:
        """Hash of the named sections (all but ``output`` by default): the key of cached results.

        Calibration keys on ``evaluator``, ``qos`` and ``calibration`` so that changing the
        search budget never invalidates a region.
        """
        # Where NNs train does not change what they are (candidates are keyed without it), so it keys nothing.
        names = sections or tuple(n for n in type(self).model_fields if n not in ("output", "source", "plugins", "training"))
        return content_hash({n: getattr(self, n) for n in names})
