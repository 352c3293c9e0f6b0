"""The stages of ``qaopt optimize``, each with one owner, typed inputs and outputs, and a stated artifact.

Region (:mod:`.region`), reference (``SearchContext.reference``), studies
(:mod:`qaopt.search`), validation (:mod:`.validation`), export (:mod:`.export`) and
report (:mod:`qaopt.report`); ``docs/architecture.md`` tables each one's artifact and
the key it is recomputed under.

Every artifact is written through :mod:`qaopt.app_spec.store` (atomic, versioned), so
a run killed at any point resumes: a stage whose artifact exists under its key is
read back, anything torn or stale is recomputed. The calibrated region is never
rewritten by a later stage; what validation learns is its own artifact, folded in by
the region stage of the next build.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def stage_progress(label: str, console: Console, disable: bool = False) -> Progress:
    """The one look of qaopt's progress bars: label, bar, done of total, elapsed and time left, a status line."""
    return Progress(TextColumn(f"[bold]{label}[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.description}"), console=console,
                    transient=True, disable=disable)


class StageBar:
    """A stage's progress: done of total (``total=None``: unknown yet), with a line saying where it stands.

    Without a live display (``--quiet``, or the console is no terminal: a log file) it
    draws nothing; the stage's log lines are the record.
    """

    def __init__(self, progress: Progress | None, task: int | None):
        self._progress, self._task = progress, task

    def update(self, completed: float | None = None, total: float | None = None, description: str | None = None,
               advance: float | None = None) -> None:
        if self._progress is None or self._task is None:
            return
        kwargs = {k: v for k, v in {"completed": completed, "total": total, "description": description,
                                    "advance": advance}.items() if v is not None}
        self._progress.update(self._task, **kwargs)

    def reset(self, total: float | None, description: str = "") -> None:
        if self._progress is not None and self._task is not None:
            self._progress.reset(self._task, total=total, description=description)


class StageClock:
    """Shows each stage while it runs and records its wall time (the report's cost table).

    Each stage shows a progress bar (counts, elapsed and estimated time left) that the
    stage moves through the :class:`StageBar` it is given; ``quiet`` shows none, only the
    log lines (what an unattended run keeps in its log file).
    """

    def __init__(self, console: Console, quiet: bool = False):
        self.console = console
        self.quiet = quiet
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, total: float | None = None) -> Iterator[StageBar]:
        start = time.perf_counter()
        if self.quiet or not self.console.is_terminal:
            self.console.log(f"{name}…")
            yield StageBar(None, None)
        else:
            with stage_progress(name, self.console) as progress:
                yield StageBar(progress, progress.add_task("", total=total))
        self.seconds[name] = round(time.perf_counter() - start, 2)
        self.console.log(f"{name}: done in {self.seconds[name]:.1f} s")
