"""Errors a user can fix.

Every component raises a subclass of :class:`QaoptError` for bad input: the CLI
prints its message (never a traceback unless ``--debug``) and exits with status 2.
The message names the file, field or knob at fault and says how to fix it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


class QaoptError(Exception):
    """Bad input or an unusable environment, reported without a traceback."""


def warn(text: str) -> None:
    """One ``warning:`` line on stderr for a fault qaopt recovered from (a lost worker's runs redone, a damaged
    file set aside and rebuilt): the run goes on, and the user learns what happened without a traceback."""
    print(f"warning: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an application spec.

    ``location`` is where a person looks: ``file:line:column`` when the YAML
    position is known, else the file alone; ``path`` is the dotted field path
    (``nns.heading.error_metric.kind``), empty for file-level problems.
    """

    location: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.location}: {self.path}: " if self.path else f"{self.location}: "
        return where + self.message


class SpecError(QaoptError):
    """A spec with one or more problems; each is printed on its own line."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
