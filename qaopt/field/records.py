"""What a field run records: the typed boundary shared by the robot API, import and export.

One model validates a run whether it comes from ``Run`` on the robot, from a team's
spreadsheet or from another store's export, so the three can never disagree on what
a valid record is.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from qaopt.app_spec.hashing import content_hash

from .errors import FieldValueError

COLLISION = "collision"
"""A collision with the crop (or any obstacle): the QoS failure CropFollow counts."""
INTERVENTION = "intervention"
"""An operator had to take over or reposition the robot."""
PROGRESS = "progress"
"""Odometry checkpoint: keeps the distance of a run that dies before it ends."""
NOTE = "note"
EXCLUDED = "excluded"
"""Appended by ``qaopt field exclude`` (:meth:`~qaopt.field.store.Store.exclude`): the run is
left out of summaries, evidence and plans, and stays in the store and its exports."""

RunStatus = Literal["complete", "aborted", "incomplete"]
"""``complete``: ended normally; ``aborted``: ended by an exception in the robot's code;
``incomplete``: never ended (still running, or its process died)."""
END_STATUSES = ("complete", "aborted")

_KIND_PATTERN = r"^[a-z][a-z0-9_]*$"
NonNegative = Annotated[float, Field(ge=0)]


def check_json(value: Any, path: str = "") -> Any:
    """``value`` when it is plain JSON with finite numbers, else ValueError naming where.

    Free-form data (event data, knobs, extra conditions) is stored as JSON: NaN and
    infinity are not JSON, and an object JSON cannot hold would not read back.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, Real):
        if not math.isfinite(value):
            raise ValueError(f"{_at(path)}{value!r} is not a finite number (NaN and infinity cannot be stored)")
        return value
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{_at(path)}key {k!r} is not a string")
            check_json(v, f"{path}.{k}" if path else k)
        return value
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_json(v, f"{path}[{i}]")
        return value
    raise ValueError(f"{_at(path)}a {type(value).__name__} is not JSON; use numbers, strings, lists and dicts")


JSON = AfterValidator(check_json)
"""Free-form values stored as JSON: checked by :func:`check_json`."""


def check_metres(value: Any, what: str, *, required: bool = False) -> float | None:
    """An odometer reading checked before it is written: a finite number of metres >= 0."""
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise FieldValueError(f"{what}: distance_m must be a number of metres, got {value!r} "
                              f"({type(value).__name__}); convert it first, e.g. float(reading)")
    if not math.isfinite(value) or value < 0:
        raise FieldValueError(f"{what}: distance_m must be a finite number of metres >= 0, got {value!r}")
    return float(value)


def _at(path: str) -> str:
    return f"{path}: " if path else ""


def error_fields(exc: ValidationError) -> list[tuple[str, str]]:
    """A pydantic error as ``(dotted field path, message)`` pairs."""
    return [(".".join(str(p) for p in err["loc"]), err["msg"]) for err in exc.errors()]


def describe(exc: ValidationError) -> str:
    """A pydantic error on one line: ``field: message; field: message``."""
    return "; ".join(f"{f}: {m}" if f else m for f, m in error_fields(exc))


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Configuration(_Record):
    """The deployed configuration: per-NN approximation knobs and the NN errors measured for it.

    ``hash`` identifies the configuration across runs (qaopt writes the candidate's content
    hash into its artifacts); when left out it is the content hash of ``knobs``, so two
    runs of the same knobs group together in summaries.
    """

    hash: str = ""
    knobs: Annotated[dict[str, dict[str, Any]], JSON] = Field(default_factory=dict)
    nn_errors: dict[str, NonNegative] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _default_hash(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("hash"):
            data = {**data, "hash": content_hash(data.get("knobs") or {})}
        return data


class Conditions(_Record):
    """Field conditions; teams may add their own keys (soil, row_width_m, ...)."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    crop: str | None = None
    growth_stage: str | None = None
    weather: str | None = None
    light: str | None = None

    @model_validator(mode="after")
    def _json_extra(self) -> Conditions:
        check_json(self.model_extra or {})
        return self


class Event(_Record):
    """Something that happened during a run, at a time and (when known) a place.

    ``at`` is the wall-clock time (None when a spreadsheet import only knows where); ``t_s`` is seconds since the run started (monotonic clock on the robot);
    ``distance_m`` the odometer along the row; ``position`` any coordinates the robot
    has (``{"x": .., "y": ..}``, ``{"lat": .., "lon": ..}``).
    """

    kind: str = Field(pattern=_KIND_PATTERN)
    at: AwareDatetime | None = None
    t_s: float | None = None
    distance_m: float | None = Field(default=None, ge=0)
    position: dict[str, float] | None = None
    data: Annotated[dict[str, Any], JSON] = Field(default_factory=dict)


class Attachment(_Record):
    """A file that belongs to a run (a video, a ROS bag), stored by path, never copied."""

    path: str = Field(min_length=1)
    kind: str = ""
    added_at: AwareDatetime | None = None


class RunRecord(_Record):
    """One field run with everything logged about it, as exported and imported."""

    id: str = Field(min_length=1, max_length=64)
    application: str = Field(min_length=1)
    config: Configuration = Field(default_factory=Configuration)
    error_point: dict[str, float] | None = None
    conditions: Conditions = Field(default_factory=Conditions)
    operator: str = ""
    notes: str = ""
    started_at: AwareDatetime
    ended_at: AwareDatetime | None = None
    status: RunStatus = "incomplete"
    distance_m: float | None = Field(default=None, ge=0)
    end_message: str = ""
    host: str = ""
    pid: int | None = None
    source: str = ""
    events: tuple[Event, ...] = ()
    attachments: tuple[Attachment, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> RunRecord:
        if self.status == "incomplete" and self.ended_at is not None:
            raise ValueError("an incomplete run has no ended_at; set status to complete or aborted")
        if self.status != "incomplete" and self.ended_at is None:
            raise ValueError(f"a {self.status} run needs ended_at (when it ended)")
        if self.ended_at is not None and self.ended_at < self.started_at:
            raise ValueError(f"ended_at {self.ended_at} is before started_at {self.started_at}")
        return self

    @property
    def error_space_point(self) -> dict[str, float] | None:
        """Where in the NN-error space this run is evidence: each injected error, and the
        deployed configuration's measured error for every NN not injected (None if neither)."""
        return {**self.config.nn_errors, **(self.error_point or {})} or None

    @property
    def exclusion(self) -> str | None:
        """Why the run was excluded (``qaopt field exclude``), or None when it counts."""
        found = [e for e in self.events if e.kind == EXCLUDED]
        return str(found[-1].data.get("reason", "")) if found else None

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e.kind == kind)

    @property
    def known_distance_m(self) -> float | None:
        """The distance driven: the recorded end distance, else the last odometer reading."""
        if self.distance_m is not None:
            return self.distance_m
        seen = [e.distance_m for e in self.events if e.distance_m is not None]
        return max(seen) if seen else None

