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


class StageClock:
    """Shows each stage while it runs and records its wall time (the report's cost table)."""

    def __init__(self, console: Console):
        self.console = console
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        with self.console.status(f"[bold]{name}[/bold]…"):
            yield
        self.seconds[name] = round(time.perf_counter() - start, 2)
        self.console.log(f"{name}: done in {self.seconds[name]:.1f} s")
