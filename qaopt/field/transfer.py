"""Import and export of field runs: JSON (full fidelity) and CSV (one row per run).

Import is all-or-nothing: every record of the file is validated first, every bad
one is reported with its line number, and only a file without problems is written,
in one transaction. Re-importing a file is harmless: a run already in the store
with the same content is skipped, one with the same id but other content is an error.

CSV columns are the dotted paths of :class:`~qaopt.field.records.RunRecord`, so an
error message names the column to fix::

    id, application, status, started_at, ended_at, distance_m, operator, notes,
    config.hash, config.knobs (JSON), config.nn_errors.<nn>, error_point.<nn>,
    conditions.<key>, collisions, collisions_at_m, interventions,
    interventions_at_m, attachments

``collisions_at_m`` lists the odometer readings (``12.4;55``) of collisions whose
place is known; ``collisions`` is the total count (it may exceed that list). Other
event kinds, event times and attachments' kinds travel only in JSON.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from qaopt.app_spec.hashing import content_hash

from .errors import FieldError, ImportRowsError, MessageProblem, RowProblem
from .records import COLLISION, INTERVENTION, RunRecord
from .store import Store

FORMATS = ("json", "jsonl", "csv")
_BASE_COLUMNS = ("id", "application", "status", "started_at", "ended_at", "distance_m",
                 "operator", "notes", "config.hash", "config.knobs")
_TAIL_COLUMNS = ("collisions", "collisions_at_m", "interventions", "interventions_at_m",
                 "attachments")
_SOURCE_FREE = {"source"}  # provenance, not content: ignored when comparing a re-import


@dataclass(frozen=True)
class Located:
    """A record of an import file and the line it starts on."""

    line: int
    record: RunRecord


@dataclass
class ImportResult:
    added: list[str] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)


def format_of(path: str | Path, fmt: str | None = None) -> str:
    fmt = (fmt or Path(path).suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise FieldError(f"{path}: unknown format {fmt!r}; use a .json, .jsonl or .csv file "
                         "(or --format json|jsonl|csv)")
    return fmt


# ---- reading ------------------------------------------------------------------------------

def read_records(path: str | Path, fmt: str | None = None) -> list[Located]:
    """Parse and validate every record of a file; raise :class:`ImportRowsError` listing all
    bad ones (with line numbers) if any is bad."""
    path = Path(path)
    fmt = format_of(path, fmt)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise FieldError(f"cannot read {path}: {exc.strerror}") from None
    name = str(path)
    problems: list[RowProblem] = []
    raw = {"json": _json_items, "jsonl": _jsonl_items, "csv": _csv_items}[fmt](text, name, problems)
    out: list[Located] = []
    seen: dict[str, int] = {}
    for line, obj in raw:
        if fmt == "csv":
            obj = _csv_to_record(obj, line, name, problems)
            if obj is None:
                continue
        if not isinstance(obj, dict):
            problems.append(RowProblem(name, line, "", "a record must be a JSON object"))
            continue
        obj.setdefault("source", f"{fmt}:{path.name}")
        if not obj.get("id"):
            # A stable id: re-importing the same file finds its runs already present.
            obj["id"] = f"{fmt}-" + content_hash({k: v for k, v in obj.items() if k != "source"})
        try:
            rec = RunRecord.model_validate(obj)
        except ValidationError as exc:
            problems.extend(RowProblem(name, line, ".".join(str(p) for p in err["loc"]),
                                       err["msg"]) for err in exc.errors())
            continue
        if rec.id in seen:
            problems.append(RowProblem(name, line, "id", f"run {rec.id} already appears on line "
                                       f"{seen[rec.id]}; give each run its own id"))
            continue
        seen[rec.id] = line
        out.append(Located(line, rec))
    if problems:
        raise ImportRowsError(problems)
    return out


def import_file(store: Store, path: str | Path, fmt: str | None = None) -> ImportResult:
    """Import a file into ``store``: all of its new runs, or nothing."""
    located = read_records(path, fmt)
    return add_new(store, [loc.record for loc in located],
                   lambda i, message: RowProblem(str(path), located[i].line, "id", message))


def add_new(store: Store, records: Sequence[RunRecord],
            problem_at: Callable[[int, str], RowProblem | MessageProblem], *,
            unit: str = "record", source: str = "file") -> ImportResult:
    """Write the validated ``records`` that ``store`` lacks, in one transaction, or nothing.

    Every importer (a file, a bag) ends here, so re-importing is harmless the same way for
    all: a run already stored with the same content is skipped; one stored under the same id
    with other content is refused (records are append-only), reported at
    ``problem_at(index of the record, message)``, and nothing is written.
    """
    existing = {r.id: r for r in store.runs(ids=[r.id for r in records], include_excluded=True)}
    result = ImportResult()
    problems = []
    new = []
    for i, rec in enumerate(records):
        old = existing.get(rec.id)
        if old is None:
            new.append(rec)
        elif _content(old) == _content(rec):
            result.already_present.append(rec.id)
        else:
            problems.append(problem_at(i, f"run {rec.id} is already in {store.display_url} "
                                          "with other content; records are append-only: give the "
                                          "corrected run a new id"))
    if problems:
        raise ImportRowsError(problems, unit=unit, source=source)
    store.add_records(new)
    result.added = [r.id for r in new]
    return result


def _content(rec: RunRecord) -> dict:
    return rec.model_dump(mode="json", exclude=_SOURCE_FREE)


def _json_items(text: str, name: str, problems: list[RowProblem]) -> list[tuple[int, Any]]:
    """The elements of a top-level JSON array, each with the line it starts on."""
    decoder = json.JSONDecoder()
    items: list[tuple[int, Any]] = []

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def line_of(i: int) -> int:
        return text.count("\n", 0, i) + 1

    i = skip(0)
    if i >= len(text) or text[i] != "[":
        problems.append(RowProblem(name, line_of(i), "", "expected a JSON array of runs "
                                   "(as `qaopt field export --format json` writes)"))
        return items
    i = skip(i + 1)
    if i < len(text) and text[i] == "]":
        return items
    while True:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            problems.append(RowProblem(name, exc.lineno, "", f"invalid JSON: {exc.msg}"))
            return items
        items.append((line_of(i), obj))
        i = skip(end)
        if i < len(text) and text[i] == ",":
            i = skip(i + 1)
        elif i < len(text) and text[i] == "]":
            if skip(i + 1) != len(text):
                problems.append(RowProblem(name, line_of(i), "", "text after the closing ]"))
            return items
        else:
            problems.append(RowProblem(name, line_of(i), "", "invalid JSON: expected , or ]"))
            return items


def _jsonl_items(text: str, name: str, problems: list[RowProblem]) -> list[tuple[int, Any]]:
    items = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                items.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                problems.append(RowProblem(name, n, "", f"invalid JSON: {exc.msg}"))
    return items


def _csv_items(text: str, name: str, problems: list[RowProblem]) -> list[tuple[int, Any]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if not header:
        problems.append(RowProblem(name, 1, "", "empty file; the first line names the columns"))
        return []
    items = []
    while True:
        line = reader.line_num + 1  # a quoted cell may span lines: a record starts here
        try:
            cells = next(reader)
        except StopIteration:
            return items
        except csv.Error as exc:
            problems.append(RowProblem(name, line, "", f"unreadable CSV: {exc}"))
            return items
        if not any(c.strip() for c in cells):
            continue
        if len(cells) > len(header):
            problems.append(RowProblem(name, line, "", f"{len(cells)} cells for {len(header)} columns"))
            continue
        items.append((line, dict(zip(header, cells))))


def _csv_to_record(row: dict[str, str], line: int, name: str,
                   problems: list[RowProblem]) -> dict | None:
    """A CSV row as a RunRecord-shaped dict (pydantic then checks types and values)."""
    obj: dict[str, Any] = {}
    bad = False

    def fail(column: str, message: str) -> None:
        nonlocal bad
        problems.append(RowProblem(name, line, column, message))
        bad = True

    events: list[dict] = []
    for column, cell in row.items():
        cell = (cell or "").strip()
        if not cell:
            continue
        head, _, rest = column.partition(".")
        if column == "config.knobs":
            try:
                obj.setdefault("config", {})["knobs"] = json.loads(cell)
            except json.JSONDecodeError as exc:
                fail(column, f"not a JSON object ({exc.msg}), e.g. {{\"heading\": {{\"prune\": 0.5}}}}")
        elif column == "config.hash":
            obj.setdefault("config", {})["hash"] = cell
        elif head == "config" and rest.startswith("nn_errors."):
            obj.setdefault("config", {}).setdefault("nn_errors", {})[rest.split(".", 1)[1]] = cell
        elif head in ("error_point", "conditions") and rest:
            obj.setdefault(head, {})[rest] = cell
        elif column == "attachments":
            obj["attachments"] = [{"path": p.strip()} for p in cell.split(";") if p.strip()]
        elif column in _BASE_COLUMNS:
            obj[column] = cell
        elif column not in _TAIL_COLUMNS:
            fail(column, "unknown column; see `qaopt field export --format csv` for the columns")
    for kind, plural in ((COLLISION, "collisions"), (INTERVENTION, "interventions")):
        places = []
        for part in (row.get(f"{plural}_at_m") or "").split(";"):
            if part.strip():
                try:
                    places.append(float(part))
                except ValueError:
                    fail(f"{plural}_at_m", f"{part.strip()!r} is not a number; write odometer "
                         "readings in metres separated by ';'")
        count_cell = (row.get(plural) or "").strip()
        count = len(places)
        if count_cell:
            try:
                count = int(count_cell)
            except ValueError:
                fail(plural, f"{count_cell!r} is not a whole number")
            if count < len(places):
                fail(plural, f"count {count} is below the {len(places)} places in {plural}_at_m")
        events += [{"kind": kind, "distance_m": d} for d in places]
        events += [{"kind": kind}] * max(0, count - len(places))
    obj["events"] = events
    if "status" not in obj and "ended_at" in obj:
        obj["status"] = "complete"  # a spreadsheet row with an end time is a finished run
    return None if bad else obj


# ---- writing ------------------------------------------------------------------------------

def write_records(records: Sequence[RunRecord], out: TextIO, fmt: str) -> None:
    """Write runs as ``json`` (an array), ``jsonl`` or ``csv``; JSON round-trips exactly."""
    if fmt == "json":
        out.write("[\n")
        for i, rec in enumerate(records):
            out.write(("" if i == 0 else ",\n") + rec.model_dump_json())
        out.write("\n]\n")
    elif fmt == "jsonl":
        for rec in records:
            out.write(rec.model_dump_json() + "\n")
    elif fmt == "csv":
        rows = [_csv_row(rec) for rec in records]
        writer = csv.DictWriter(out, fieldnames=_csv_columns(rows), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    else:
        raise FieldError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")


def _csv_columns(rows: Iterable[dict[str, str]]) -> list[str]:
    dynamic = sorted({c for row in rows for c in row
                      if c not in _BASE_COLUMNS and c not in _TAIL_COLUMNS})
    return [*_BASE_COLUMNS, *dynamic, *_TAIL_COLUMNS]


def _csv_row(rec: RunRecord) -> dict[str, str]:
    def num(x: float | None) -> str:
        return "" if x is None else repr(float(x))

    row = {
        "id": rec.id, "application": rec.application, "status": rec.status,
        "started_at": rec.started_at.isoformat(),
        "ended_at": rec.ended_at.isoformat() if rec.ended_at else "",
        "distance_m": num(rec.distance_m), "operator": rec.operator, "notes": rec.notes,
        "config.hash": rec.config.hash,
        "config.knobs": json.dumps(rec.config.knobs, sort_keys=True) if rec.config.knobs else "",
        "attachments": ";".join(a.path for a in rec.attachments),
    }
    row |= {f"config.nn_errors.{k}": num(v) for k, v in rec.config.nn_errors.items()}
    row |= {f"error_point.{k}": num(v) for k, v in (rec.error_point or {}).items()}
    row |= {f"conditions.{k}": str(v) for k, v in rec.conditions.model_dump(exclude_none=True).items()}
    for kind, plural in ((COLLISION, "collisions"), (INTERVENTION, "interventions")):
        evs = [e for e in rec.events if e.kind == kind]
        row[plural] = str(len(evs))
        row[f"{plural}_at_m"] = ";".join(num(e.distance_m) for e in evs if e.distance_m is not None)
    return row
