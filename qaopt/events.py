"""The typed event stream of a run: what the stages say, and who listens.

A stage never prints, draws a progress bar or counts by reading its own log text: it
emits events, and the console, the progress bars, the log and the report's cost table
are subscribers (:mod:`qaopt.console`, :class:`StageTimes`). A new view of a run (a
JSON log, a dashboard) is one more subscriber; a new kind of progress is one more event.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from qaopt.app_spec.store import atomic_path


@dataclass(frozen=True)
class StageStarted:
    """A stage began; ``total`` is how many steps it expects (``None``: not known yet)."""

    stage: str
    total: float | None = None


@dataclass(frozen=True)
class StageFinished:
    """A stage ended after ``seconds`` of wall time; ``resumed`` when its artifact was read back, not computed."""

    stage: str
    seconds: float
    resumed: bool = False


@dataclass(frozen=True)
class Progress:
    """Where a stage stands: ``completed`` of ``total`` steps (``None`` keeps the last), and a line saying what it does."""

    stage: str
    completed: float | None = None
    total: float | None = None
    description: str = ""


@dataclass(frozen=True)
class Note:
    """One line for the console and the log (what ran, what was reused, what changed)."""

    stage: str
    text: str


@dataclass(frozen=True)
class Warning:  # noqa: A001 - the event's name; Python's builtin is never needed here
    """A line that needs the user's attention (a knob value the target cannot run, a region replaced)."""

    stage: str
    text: str


TrialPhase = Literal["building", "measuring", "infeasible", "finished"]


@dataclass(frozen=True)
class Trial:
    """A search trial of study ``mode`` reached ``phase``; ``detail`` says why when it is infeasible."""

    stage: str
    mode: str
    number: int
    phase: TrialPhase
    detail: str = ""


@dataclass(frozen=True)
class RunBlock:
    """A block of closed-loop runs of configuration ``name`` ended: ``runs`` of ``planned`` done, the verdict so far."""

    stage: str
    name: str
    runs: int
    planned: int
    failures: int
    verdict: str


@dataclass(frozen=True)
class Measured:
    """A configuration of study ``mode`` compiled and timed on the target (``trusted``: no disturbance seen)."""

    stage: str
    mode: str
    trial: int
    latency_ms: float
    trusted: bool


Event: TypeAlias = StageStarted | StageFinished | Progress | Note | Warning | Trial | RunBlock | Measured
Subscriber: TypeAlias = Callable[[Event], None]


@dataclass
class Events:
    """The run's event stream: every subscriber sees every event, in the order emitted."""

    subscribers: list[Subscriber] = field(default_factory=list)

    def subscribe(self, subscriber: Subscriber) -> Subscriber:
        self.subscribers.append(subscriber)
        return subscriber

    def emit(self, event: Event) -> None:
        for subscriber in self.subscribers:
            subscriber(event)

    def for_stage(self, stage: str) -> StageEvents:
        """The emitter a stage uses: every event it makes carries the stage's name."""
        return StageEvents(self, stage)


@dataclass(frozen=True)
class StageEvents:
    """A stage's side of the stream: shorthand for the events stages emit most."""

    events: Events
    stage: str

    def emit(self, event: Event) -> None:
        self.events.emit(event)

    def note(self, text: str) -> None:
        self.events.emit(Note(self.stage, text))

    def warn(self, text: str) -> None:
        self.events.emit(Warning(self.stage, text))

    def progress(self, completed: float | None = None, total: float | None = None, description: str = "") -> None:
        self.events.emit(Progress(self.stage, completed, total, description))


@dataclass
class StageTimes:
    """The wall time of each stage that computed its artifact (the report's cost table), as a subscriber.

    Kept in a file (:meth:`kept_in`), the times outlive the process: a resumed run reads its finished stages back
    in a moment, and the table still says what each cost when it was computed; ``read_back`` names those stages.
    """

    seconds: dict[str, float] = field(default_factory=dict)
    read_back: list[str] = field(default_factory=list)
    path: Path | None = None

    @classmethod
    def kept_in(cls, path: Path) -> StageTimes:
        """Times kept in ``path`` (JSON), starting from those an earlier process of the run wrote there."""
        try:
            stored = json.loads(path.read_text())
            seconds = {str(stage): float(s) for stage, s in stored.items()}
        except (OSError, ValueError, AttributeError, TypeError):  # none yet, or unreadable: they only inform
            seconds = {}
        return cls(seconds=seconds, path=path)

    def __call__(self, event: Event) -> None:
        if not isinstance(event, StageFinished):
            return
        if event.resumed:  # its cost is the earlier process's, kept in the file where there was one
            self.read_back.append(event.stage)
            return
        self.seconds[event.stage] = round(event.seconds, 2)
        if self.path is not None:
            with atomic_path(self.path) as tmp:
                tmp.write_text(json.dumps(self.seconds, indent=1))
