"""Errors of the field log, each naming what is wrong and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from qaopt.app_spec.errors import QaoptError


class FieldError(QaoptError):
    """Bad use of the field log (a closed run, an unknown run id, a bad store URL)."""


class FieldValueError(FieldError, ValueError):
    """A value the field log refuses before writing anything (a negative distance, NaN, a bad status)."""


class FieldDataWarning(UserWarning):
    """A stored row that does not read back as a valid record; it is left out and reported."""


class StoreVersionError(FieldError):
    """The store was written by a newer qaopt than the one reading it."""


@dataclass(frozen=True)
class RowProblem:
    """One bad record of an import file: ``file:line: field: message``."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: "
        return where + (f"{self.field}: {self.message}" if self.field else self.message)


@dataclass(frozen=True)
class MessageProblem:
    """One bad message of a bag: ``file: topic @ time: message`` (the time as the bag logged it, UTC)."""

    file: str
    topic: str
    log_time_ns: int
    message: str

    def __str__(self) -> str:
        at = datetime.fromtimestamp(self.log_time_ns // 1_000_000_000, timezone.utc)
        stamp = f"{at:%Y-%m-%dT%H:%M:%S}.{self.log_time_ns % 1_000_000_000:09d}Z"
        return f"{self.file}: {self.topic} @ {stamp}: {self.message}"


class ImportRowsError(FieldError):
    """An import file (or bag) with bad records; nothing of it was imported."""

    def __init__(self, problems: list[RowProblem | MessageProblem], *, unit: str = "record",
                 source: str = "file"):
        self.problems = list(problems)
        head = (f"nothing imported: {len(self.problems)} bad {unit}(s); fix them and import the "
                f"{source} again")
        super().__init__("\n".join([head, *(str(p) for p in self.problems)]))
