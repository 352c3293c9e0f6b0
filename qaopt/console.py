"""What a person sees of a run: log lines and one progress bar per stage, drawn from the event stream.

:class:`ConsoleView` subscribes to a run's :class:`~qaopt.events.Events`. On a terminal each
stage shows a bar (done of total, elapsed, time left, a status line); with ``quiet``, or when
the console is no terminal (a log file), it draws nothing and the log lines are the record.
Trials move the bar by their numbers (:class:`~qaopt.events.Trial`), never by parsing text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from qaopt import events as ev

TRIAL_LINES: dict[str, str] = {
    "building": "building candidates",
    "measuring": "compiling and measuring on the target",
    "infeasible": "infeasible",
    "finished": "finished",
}
"""How each trial phase reads in the log."""


def stage_progress(label: str, console: Console, disable: bool = False) -> Progress:
    """The one look of qaopt's progress bars: label, bar, done of total, elapsed and time left, a status line."""
    return Progress(TextColumn(f"[bold]{label}[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.description}"), console=console,
                    transient=True, disable=disable)


@dataclass
class ConsoleView:
    """A subscriber that logs every line-worthy event and keeps the running stage's bar up to date."""

    console: Console
    quiet: bool = False
    _bar: Progress | None = field(default=None, init=False, repr=False)
    _task: TaskID | None = field(default=None, init=False, repr=False)
    _trials: dict[str, set[int]] = field(default_factory=dict, init=False, repr=False)

    @property
    def live(self) -> bool:
        return not self.quiet and self.console.is_terminal

    def __call__(self, event: ev.Event) -> None:
        match event:
            case ev.StageStarted(stage=stage, total=total):
                if self.live:
                    self._bar = stage_progress(stage, self.console)
                    self._bar.start()
                    self._task = self._bar.add_task("", total=total)
                else:
                    self.console.log(f"{stage}…")
            case ev.StageFinished(stage=stage, seconds=seconds, resumed=resumed):
                if self._bar is not None:
                    self._bar.stop()
                    self._bar = self._task = None
                self.console.log(f"{stage}: done in {seconds:.1f} s" + (" (read back)" if resumed else ""))
            case ev.Progress(completed=completed, total=total, description=description):
                self._update(completed=completed, total=total, description=description or None)
            case ev.Note(text=text):
                self.console.log(escape(text))
            case ev.Warning(text=text):
                self.console.log(f"[yellow]warning:[/yellow] {escape(text)}")
            case ev.Trial(stage=stage, mode=mode, number=number, phase=phase, detail=detail):
                line = escape(f"{mode} trial {number}: {TRIAL_LINES[phase]}" + (f": {detail}" if detail else ""))
                if phase != "finished":
                    self.console.log(line)
                started = self._trials.setdefault(stage, set())
                started.add(number)
                done = len(started) - (0 if phase == "finished" else 1)
                self._update(completed=max(0, done), description=line)
            case ev.RunBlock(name=name, runs=runs, planned=planned, failures=failures, verdict=verdict):
                self._update(completed=runs, total=planned,
                             description=escape(f"{name}: {runs}/{planned} runs, {failures} failed, {verdict}"))
            case ev.Measured():
                pass  # the trial's own lines say it; the report tables the figures

    def _update(self, **fields) -> None:
        if self._bar is None or self._task is None:
            return
        self._bar.update(self._task, **{k: v for k, v in fields.items() if v is not None})
