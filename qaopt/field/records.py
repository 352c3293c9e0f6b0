"""What a field run records: the typed boundary shared by the robot API, import and export.

One model validates a run whether it comes from ``Run`` on the robot, from a team's
spreadsheet or from another store's export, so the three can never disagree on what
a valid record is.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from qaopt.app_spec.hashing import content_hash

COLLISION = "collision"
"""A collision with the crop (or any obstacle): the QoS failure CropFollow counts."""
INTERVENTION = "intervention"
"""An operator had to take over or reposition the robot."""
PROGRESS = "progress"
"""Odometry checkpoint: keeps the distance of a run that dies before it ends."""
NOTE = "note"

RunStatus = Literal["complete", "aborted", "incomplete"]
"""``complete``: ended normally; ``aborted``: ended by an exception in the robot's code;
``incomplete``: never ended (still running, or its process died)."""

_KIND_PATTERN = r"^[a-z][a-z0-9_]*$"
NonNegative = Annotated[float, Field(ge=0)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Configuration(_Record):
    """The deployed configuration: per-NN approximation knobs and the NN errors measured for it.

    ``hash`` identifies the configuration across runs (qaopt writes the candidate's content
    hash into its artifacts); when left out it is the content hash of ``knobs``, so two
    runs of the same knobs group together in summaries.
    """

    hash: str = ""
    knobs: dict[str, dict[str, Any]] = Field(default_factory=dict)
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
    data: dict[str, Any] = Field(default_factory=dict)


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

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e.kind == kind)

    @property
    def known_distance_m(self) -> float | None:
        """The distance driven: the recorded end distance, else the last odometer reading."""
        if self.distance_m is not None:
            return self.distance_m
        seen = [e.distance_m for e in self.events if e.distance_m is not None]
        return max(seen) if seen else None

