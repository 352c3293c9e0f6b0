"""Field runs from the robot's own recordings: ROS 2 bags (MCAP) into the field store.

A robot already records everything with ``ros2 bag record -s mcap``; this module reads
such a bag without a ROS installation (``mcap`` and ``mcap-ros2-support`` decode its CDR
messages from the ``ros2msg`` schemas the bag carries) and turns it into
:class:`~qaopt.field.records.RunRecord` objects through a
:class:`~qaopt.app_spec.schema.BagMapping` (the spec's ``evaluator.field.bag``): which
topic gives the distance, which topics are QoS events, which names the configuration,
where runs start and end.

The guarantees are the file import's (:mod:`qaopt.field.transfer`), whose write step it
shares: the whole bag or nothing; every bad message named with its topic, time and
reason; re-importing the same bag adds nothing. A bag is read as a stream, in log-time
order, one chunk at a time: memory does not grow with the bag, only with its runs and
events. Only the mapped topics are decoded; a camera stream in the same bag costs its
decompression and nothing more.
"""

from __future__ import annotations

import heapq
import json
import math
import re
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qaopt.app_spec.hashing import content_hash, file_hash
from qaopt.app_spec.schema import BAG_SECTION, JSON_EVENTS, BagMapping, BagParameter

from .errors import FieldError, ImportRowsError, MessageProblem
from .records import NonNegative, RunRecord, check_json, describe
from .store import Store
from .transfer import ImportResult, add_new

if TYPE_CHECKING:
    from qaopt.app_spec import AppSpec

STRING, BOOL, ODOMETRY = "std_msgs/msg/String", "std_msgs/msg/Bool", "nav_msgs/msg/Odometry"
PARAMETER_EVENT = "rcl_interfaces/msg/ParameterEvent"
PARAMETER_STRING = 4  # rcl_interfaces/msg/ParameterType.PARAMETER_STRING
DEFAULT_FIELDS = {"position": "pose.pose.position", "velocity": "twist.twist.linear", "odometer": "data"}
"""The message field each distance source reads unless ``distance.field`` says otherwise."""


class BagMappingError(FieldError):
    """A mapping that does not fit the bag (a topic it names is absent, a topic it should read is not
    mapped, a type it cannot read); each problem names the field of ``evaluator.field.bag`` to fix."""

    def __init__(self, bag: Path, problems: list[tuple[str, str]]):
        self.bag = bag
        self.problems = list(problems)  # (field path under evaluator.field.bag, message)
        super().__init__("\n".join(f"{BAG_SECTION}.{where}: {message}" for where, message in self.problems))


# ---- qaopt's recording convention: JSON on std_msgs/String topics (docs/field.md) -------------

class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RunMessage(_Message):
    """``/qaopt/run``: ``{"run": "start", "conditions": {...}, "operator": ..., "notes": ...}`` or
    ``{"run": "end", "status": "complete" | "aborted", "message": ...}``."""

    run: Literal["start", "end"]
    conditions: dict[str, Any] = Field(default_factory=dict)
    operator: str = ""
    notes: str = ""
    status: Literal["complete", "aborted"] = "complete"
    message: str = ""


class EventMessage(_Message):
    """``/qaopt/events``: ``{"event": "collision", "position": {"x": .., "y": ..}, ...}``; keys
    other than ``event``, ``distance_m`` and ``position`` are kept as the event's data."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    event: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    distance_m: NonNegative | None = None
    position: dict[str, float] | None = None


class ConfigMessage(_Message):
    """``/qaopt/config``: the configuration that runs, ``{"hash", "knobs", "nn_errors", "error_point"}``
    (a plain string is taken as the hash alone)."""

    hash: str = ""
    knobs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    nn_errors: dict[str, NonNegative] = Field(default_factory=dict)
    error_point: dict[str, float] | None = None


class _BadMessage(Exception):
    """One message that cannot be used; reported with its topic and time."""


def _json_message(model: type[BaseModel], text: str) -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _BadMessage(f"not JSON ({exc.msg}): {text[:80]!r}") from None
    if not isinstance(data, dict):
        raise _BadMessage(f"a JSON object is expected, got {text[:80]!r}")
    try:
        msg = model.model_validate(data)
        check_json(data)
    except (ValidationError, ValueError) as exc:
        raise _BadMessage(describe(exc) if isinstance(exc, ValidationError) else str(exc)) from None
    return msg


# ---- reading a bag ------------------------------------------------------------------------

@dataclass
class BagReading:
    """The runs of a bag, ready to store, and what was read but belongs to no run."""

    bag: Path
    runs: list[RunRecord]
    notes: list[str] = field(default_factory=list)
    skipped: list[MessageProblem] = field(default_factory=list)


@dataclass
class BagImport:
    """What :func:`import_bag` did: the store's result and the reading it came from."""

    result: ImportResult
    reading: BagReading


@dataclass
class _Run:
    """A run being read: its boundaries, distance so far, configuration and events."""

    start_ns: int
    topic: str
    meta: dict[str, Any]
    config: ConfigMessage | None
    distance_m: float = 0.0
    last_ns: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    status: str = "incomplete"
    end_message: str = ""
    ended_ns: int | None = None
    skipped: list[str] = field(default_factory=list)


def read_bag(path: str | Path, mapping: BagMapping | None = None, *, application: str,
             conditions: dict[str, Any] | None = None, operator: str | None = None,
             skip_bad: bool = False) -> BagReading:
    """The field runs recorded in the bag at ``path``, read through ``mapping``.

    ``path`` is an MCAP file or the folder ``ros2 bag record -o NAME`` writes; a bag split into
    several files (``--max-bag-size``, ``--max-bag-duration``) is read as one recording, so a
    run may span files. ``conditions`` and ``operator`` apply to every run (over the bag's
    metadata and its start messages). Raises :class:`~qaopt.field.FieldError` for a bag that
    cannot be read (cut short, not MCAP), :class:`BagMappingError` for a mapping that does not
    fit it, and :class:`~qaopt.field.ImportRowsError` listing every bad message (``skip_bad``
    leaves them out instead, noting each in :attr:`BagReading.skipped` and in its run's notes).
    """
    path = Path(path)
    mapping = mapping or BagMapping()
    files = bag_files(path)
    channels: dict[str, tuple[Any, Any]] = {}  # topic -> (channel, schema), from the first file holding it
    meta: dict[str, Any] = {"conditions": {}, "operator": "", "notes": ""}
    identity = []
    for file in files:
        with _opened(file) as (_, reader, summary):
            for channel in summary.channels.values():
                channels.setdefault(channel.topic, (channel, summary.schemas.get(channel.schema_id)))
            found = _metadata(reader, mapping.metadata, file)
            meta = {"conditions": {**meta["conditions"], **found["conditions"]},
                    "operator": found["operator"] or meta["operator"], "notes": found["notes"] or meta["notes"]}
            stats = summary.statistics
            identity.append([stats.message_start_time, stats.message_end_time, stats.message_count]
                            if stats is not None else file_hash(file))
    roles = _roles(mapping, channels, path)
    overrides = {"conditions": conditions or {}, "operator": operator}
    builder = _Builder(path, mapping, application, meta, overrides,
                       identity[0] if len(identity) == 1 else identity, skip_bad)
    for file in files:
        builder.path = file  # bad messages and notes name the file they are in
        with _opened(file) as (stream, reader, summary):
            for topic, log_time, data in _messages(stream, reader, summary, file, list(roles)):
                builder.take(roles[topic], topic, log_time, data)
    return builder.finish()


def bag_files(path: Path) -> list[Path]:
    """The MCAP files of a bag in recording order: the file itself, or those of a rosbag2 folder
    (``NAME_0.mcap``, ``NAME_1.mcap``, ...)."""
    if not path.is_dir():
        return [path]
    files = sorted(path.glob("*.mcap"), key=lambda f: (int(m.group(1)) if (m := re.search(r"_(\d+)$", f.stem))
                                                        else -1, f.name))
    if not files:
        raise FieldError(f"{path}: no .mcap file in this folder; record with `ros2 bag record -s mcap`")
    return files


@contextmanager
def _opened(file: Path) -> Iterator[tuple[Any, Any, Any]]:
    """``(stream, reader, summary)`` of one MCAP file, closed afterwards."""
    try:
        stream = open(file, "rb")
    except OSError as exc:
        raise FieldError(f"cannot read bag {file}: {exc.strerror}") from None
    with stream:
        reader, summary = _open(stream, file)
        yield stream, reader, summary


def import_bag(store: Store, path: str | Path, mapping: BagMapping | None = None, *, application: str,
               conditions: dict[str, Any] | None = None, operator: str | None = None,
               skip_bad: bool = False) -> BagImport:
    """Import the runs of a bag into ``store``: all of its new runs, or nothing (see :func:`read_bag`)."""
    reading = read_bag(path, mapping, application=application, conditions=conditions,
                       operator=operator, skip_bad=skip_bad)
    topic = _boundary_topic(mapping or BagMapping())

    def conflict(i: int, _: str) -> MessageProblem:
        run = reading.runs[i]
        return MessageProblem(str(path), topic, _ns(run.started_at), (
            f"run {run.id} was imported from this bag before, with other conditions, operator, configuration "
            "or mapping; records are append-only, so a bag's runs are imported once: to correct them, export "
            "them, edit them under new ids and import that file (docs/field.md, 'A bad record')"))

    result = add_new(store, reading.runs, conflict, unit="run", source="bag")
    return BagImport(result, reading)


def import_spec_bag(spec: AppSpec | str | Path, path: str | Path, *, store: str | Path | Store | None = None,
                    application: str | None = None, conditions: dict[str, Any] | None = None,
                    operator: str | None = None, skip_bad: bool = False) -> BagImport:
    """:func:`import_bag` with the spec's ``evaluator.field.bag`` mapping, ``app.name`` and store
    (``store`` and ``application`` override them); a mapping that does not fit the bag is reported
    at its ``file:line:col`` in the spec. Needs the full install (the spec loader)."""
    from qaopt.app_spec import SpecError
    from qaopt.spec import load_spec, located

    if not isinstance(spec, BaseModel):
        spec = load_spec(spec, check_entry_points=False)
    source = spec.evaluator.field
    if store is None and source is None:
        raise FieldError(f"{spec.source}: evaluator.field is not set; add `evaluator: {{field: "
                         "{store: field.db}}}` or give a store")
    mapping = (source.bag if source is not None else None) or BagMapping()
    own = not isinstance(store, Store)
    st = store if isinstance(store, Store) else Store(store if store is not None else source.store)
    try:
        return import_bag(st, path, mapping, application=application or spec.app.name, conditions=conditions,
                          operator=operator, skip_bad=skip_bad)
    except BagMappingError as exc:  # placed at the mapping's field, or at evaluator.field when it is the default
        raise SpecError(located(spec, [{"loc": ("evaluator", "field", "bag", *_loc(where)), "msg": message}
                                       for where, message in exc.problems])) from None
    finally:
        if own:
            st.close()


def load_mapping(path: str | Path) -> BagMapping:
    """A mapping from a JSON file holding an ``evaluator.field.bag`` section (the robot's light
    install has no YAML spec loader); errors name the file and the field."""
    path = Path(path)
    try:
        return BagMapping.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FieldError(f"cannot read mapping {path}: {exc.strerror}") from None
    except ValidationError as exc:
        raise FieldError("\n".join(
            f"{path}: {'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors())) from None


def _loc(where: str) -> tuple[str, ...]:
    """``events./qaopt/events`` -> ``("events", "/qaopt/events")``: topics hold no dots."""
    head, _, rest = where.partition(".")
    return (head, rest) if rest else (head,)


def _boundary_topic(mapping: BagMapping) -> str:
    return mapping.runs.topic if mapping.runs is not None and mapping.runs.topic else mapping.distance.topic


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _ns(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(microseconds=1) * 1000


def _time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // 1_000_000_000, timezone.utc).replace(microsecond=(ns % 1_000_000_000) // 1000)


# ---- the container: open, check against the mapping, stream ----------------------------

def _unreadable(path: Path, exc: BaseException) -> FieldError:
    reason = f"{type(exc).__name__}: {exc}"[:120]
    return FieldError(f"{path}: not a complete MCAP bag ({reason}); a recording that was "
                      "cut short (killed, power lost) has no summary: repair it with `mcap recover "
                      f"{path.name} -o repaired.mcap` and import the repaired file")


def _open(stream, path: Path):
    """The bag's reader and summary; a file cut short, or not MCAP at all, is one clear error."""
    from mcap.reader import SeekingReader

    try:
        reader = SeekingReader(stream)
        summary = reader.get_summary()
    except Exception as exc:  # a cut file surfaces as any error of the record parser (struct, EOF, magic)
        raise _unreadable(path, exc) from None
    if summary is None:
        raise _unreadable(path, FieldError("the file has no summary section"))
    return reader, summary


def _messages(stream, reader, summary, path: Path, topics: list[str]) -> Iterator[tuple[str, int, bytes]]:
    """``(topic, log time, CDR bytes)`` of the messages of ``topics``, in log-time order.

    Corruption of the container (a bad chunk, a CRC mismatch) is one error naming the file.
    """
    it = _ordered(stream, reader, summary, topics)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception as exc:  # a corrupt chunk: decompression, CRC or record errors alike
            raise _unreadable(path, exc) from None
        yield item


_RECORD = struct.Struct("<BQ")  # opcode, length
_MESSAGE = struct.Struct("<HIQQ")  # channel id, sequence, log time, publish time
_MESSAGE_OPCODE = 0x05


def _ordered(stream, reader, summary, topics: list[str]) -> Iterator[tuple[str, int, bytes]]:
    """The wanted messages merged into log-time order one chunk at a time.

    mcap's reader orders messages through a heap of objects compared in Python, which took
    most of an import's time (docs/BENCHMARKS.md, "Field runs from ROS 2 bags"). Here chunks are taken in the order of their first message
    and their wanted messages pushed as plain tuples (compared in C); a message is released
    once no chunk still to be read can hold an earlier one, so memory holds only the chunks
    that overlap in time (rosbag2 writes them one after another).
    """
    from mcap.data_stream import ReadDataStream
    from mcap.records import Chunk
    from mcap.stream_reader import get_chunk_data_stream

    wanted = {cid: c.topic for cid, c in summary.channels.items() if c.topic in topics}
    if not summary.chunk_indexes:  # an unchunked file: mcap's reader, which holds it whole to sort it
        for _, channel, message in reader.iter_messages(topics=topics, log_time_order=True):
            yield channel.topic, message.log_time, message.data
        return
    chunks = sorted((c for c in summary.chunk_indexes
                     if not c.message_index_offsets or wanted.keys() & c.message_index_offsets.keys()),
                    key=lambda c: (c.message_start_time, c.chunk_start_offset))
    heap: list[tuple[int, int, int, bytes]] = []
    seq = 0
    for i, index in enumerate(chunks):
        stream.seek(index.chunk_start_offset + _RECORD.size)
        records, length = get_chunk_data_stream(Chunk.read(ReadDataStream(stream)), validate_crc=True)
        raw = records.read(length)
        offset = 0
        while offset < length:
            opcode, size = _RECORD.unpack_from(raw, offset)
            offset += _RECORD.size
            if opcode == _MESSAGE_OPCODE:
                channel_id, _, log_time, _ = _MESSAGE.unpack_from(raw, offset)
                if channel_id in wanted:
                    heapq.heappush(heap, (log_time, seq, channel_id, raw[offset + _MESSAGE.size:offset + size]))
                    seq += 1
            offset += size
        if offset != length:
            raise ValueError(f"a chunk's records overrun it ({offset} of {length} bytes)")
        until = chunks[i + 1].message_start_time if i + 1 < len(chunks) else math.inf
        while heap and heap[0][0] < until:
            log_time, _, channel_id, data = heapq.heappop(heap)
            yield wanted[channel_id], log_time, data


def _metadata(reader, name: str, path: Path) -> dict[str, Any]:
    """The bag-wide conditions, operator and notes from the MCAP metadata record ``name``."""
    out: dict[str, Any] = {"conditions": {}, "operator": "", "notes": ""}
    try:
        records = [m for m in reader.iter_metadata() if m.name == name]
    except Exception as exc:
        raise _unreadable(path, exc) from None
    for record in records:
        for key, value in record.metadata.items():
            if key in ("operator", "notes"):
                out[key] = value
            else:
                out["conditions"][key.removeprefix("conditions.")] = value
    return out


@dataclass(frozen=True)
class _Role:
    """What a mapped topic is read as, with its decoder."""

    kind: Literal["distance", "event", "config", "runs"]
    datatype: str
    decode: Callable[[bytes], Any]
    event_kind: str | None = None


def _roles(mapping: BagMapping, channels: dict[str, tuple[Any, Any]], path: Path) -> dict[str, _Role]:
    """Each mapped topic's role and decoder, after checking the mapping against the bag's topics."""
    from mcap_ros2.decoder import DecoderFactory

    problems: list[tuple[str, str]] = []
    used = mapping.topic_fields()
    names = {t for _, t in used}
    for where, topic in used:
        if topic not in channels:
            problems.append((where, f"topic {topic} is not in {path.name} (its topics: "
                                    f"{', '.join(sorted(channels)) or 'none'}); record it "
                                    f"(`ros2 bag record ... {topic}`) or change the mapping"))
    for topic in sorted(channels):
        if topic not in names and topic not in mapping.ignore and any(topic.startswith(p) for p in mapping.watch):
            problems.append(("events", f"topic {topic} of {path.name} looks like a QoS topic (under "
                                       f"{', '.join(mapping.watch)}) but the mapping does not read it; add "
                                       f"`{topic}: <event kind>` to events, or list it in ignore"))
    if problems:
        raise BagMappingError(path, problems)
    factory = DecoderFactory()
    roles: dict[str, _Role] = {}
    for where, topic in used:
        channel, schema = channels[topic]
        datatype = schema.name if schema is not None else "(no schema)"
        try:
            decode = factory.decoder_for(channel.message_encoding, schema)
        except Exception as exc:  # a ros2msg text the parser rejects
            decode, why = None, f": its schema does not parse ({exc})"
        else:
            why = ""
        if decode is None:
            encoding = f"{channel.message_encoding}/{schema.encoding if schema is not None else '-'}"
            problems.append((where, f"topic {topic} of {path.name} carries {datatype} encoded as {encoding}{why}; "
                                    "import-bag reads ROS 2 messages (cdr/ros2msg, as rosbag2 records them): "
                                    "map a topic of a ROS 2 type instead"))
            continue
        kind = ("distance" if where == "distance.topic" else "config" if where == "config"
                else "runs" if where == "runs.topic" else "event")
        need = {"config": (PARAMETER_EVENT if isinstance(mapping.config, BagParameter) else STRING,),
                "runs": (STRING, BOOL)}.get(kind)
        event_kind = mapping.events.get(topic) if kind == "event" else None
        if event_kind == JSON_EVENTS:
            need = (STRING,)
        if need is not None and datatype not in need:
            problems.append((where, f"topic {topic} carries {datatype}; this role reads {' or '.join(need)}"
                                    + (f" (or map the topic to an event kind instead of {JSON_EVENTS!r})"
                                       if event_kind == JSON_EVENTS else "")))
            continue
        roles[topic] = _Role(kind, datatype, decode, event_kind)
    if problems:
        raise BagMappingError(path, problems)
    return roles


# ---- turning messages into runs -----------------------------------------------------------

_ODOMETRY_TAIL = 8 * 85  # pose (3 + 4 + 36 float64) and twist (3 + 3 + 36 float64)
_U32 = struct.Struct("<I")
_XY = struct.Struct("<2d")


def _odometry_fast(data: bytes) -> tuple[float, float, float, float] | None:
    """``(x, y, vx, vy)`` of a little-endian CDR nav_msgs/msg/Odometry, or None if it is not one.

    The generic decoder builds the whole message (two 36-float covariances included) for
    two numbers; at 50 Hz that is most of an import's time. Odometry's layout is fixed by
    its type: a stamp, two strings, then 85 float64s. Any doubt (big-endian, a string
    without its terminator, a wrong size) returns None and the generic decoder decides.
    Offsets count from byte 4, after the encapsulation header, as CDR aligns them.
    """
    size = len(data)
    if size < 16 or data[1] != 1:
        return None
    offset = 12  # after the stamp: header.frame_id, then child_frame_id, each length + text + NUL
    for _ in range(2):
        offset = ((offset - 4 + 3) & ~3) + 4
        if offset + 4 > size:
            return None
        n = _U32.unpack_from(data, offset)[0]
        offset += 4 + n
        if n == 0 or offset > size or data[offset - 1] != 0:
            return None
    offset = ((offset - 4 + 7) & ~7) + 4
    if not 0 <= size - (offset + _ODOMETRY_TAIL) < 8:
        return None
    return _XY.unpack_from(data, offset) + _XY.unpack_from(data, offset + 8 * 43)


def _field(message: Any, path: str) -> Any:
    for part in path.split("."):
        message = getattr(message, part)
    return message


class _Builder:
    """Reads messages in log-time order and assembles runs; memory holds only the open runs' events."""

    def __init__(self, path: Path, mapping: BagMapping, application: str, meta: dict[str, Any],
                 overrides: dict[str, Any], identity: Any, skip_bad: bool):
        self.bag, self.path, self.mapping, self.application, self.meta = path, path, mapping, application, meta
        self.overrides = overrides
        self.identity, self.skip_bad = identity, skip_bad
        self.source = mapping.distance.source
        self.field = mapping.distance.field or DEFAULT_FIELDS[self.source]
        self.gap_ns = (round(mapping.runs.gap_s * 1e9) if mapping.runs is not None and mapping.runs.gap_s
                       else None)
        self.single = mapping.runs is None
        self.fast: dict[str, bool] = {}  # per distance topic: does the fast odometry reader agree?
        self.config: ConfigMessage | None = None
        self.last: tuple[float, ...] | None = None  # the latest distance reading, in or out of a run
        self.last_distance_ns: int | None = None
        self.bool_state: dict[str, bool] = {}
        self.run: _Run | None = None
        self.done: list[_Run] = []
        self.problems: list[MessageProblem] = []
        self.skipped: list[MessageProblem] = []
        self.notes: list[str] = []

    # -- dispatch --

    def take(self, role: _Role, topic: str, t_ns: int, data: bytes) -> None:
        try:
            if role.kind == "distance":
                self._distance(role, topic, t_ns, data)
                return
            if self.single and self.run is None:
                self._open(t_ns, topic, {})
            if role.kind == "event":
                self._event(role, topic, t_ns, self._decode(role, data))
            elif role.kind == "config":
                self._config_message(role, topic, t_ns, self._decode(role, data))
            else:
                self._boundary(role, topic, t_ns, self._decode(role, data))
        except _BadMessage as exc:
            problem = MessageProblem(str(self.path), topic, t_ns, str(exc))
            if not self.skip_bad:
                self.problems.append(problem)
                return
            self.skipped.append(problem)
            if self.run is not None:
                self.run.skipped.append(str(problem).removeprefix(f"{self.path}: "))

    def _decode(self, role: _Role, data: bytes) -> Any:
        try:
            return role.decode(data)
        except Exception as exc:  # CDR that does not fit its schema fails in struct, index or text decoding
            what = "malformed CDR" if isinstance(exc, (struct.error, IndexError)) else type(exc).__name__
            raise _BadMessage(f"cannot decode as {role.datatype} ({what}: {exc})") from None

    # -- distance --

    def _reading(self, role: _Role, topic: str, data: bytes) -> tuple[float, ...]:
        if self.source != "odometer" and role.datatype == ODOMETRY and self.mapping.distance.field is None:
            fast = _odometry_fast(data)
            if topic not in self.fast:  # the first message decides: the fast path must agree with the decoder
                generic = self._generic(role, topic, data)
                mine = None if fast is None else fast[:2] if self.source == "position" else fast[2:]
                self.fast[topic] = mine is not None and all(
                    math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12) for a, b in zip(mine, generic))
                return generic
            if fast is not None and self.fast[topic]:
                reading = fast[:2] if self.source == "position" else fast[2:]
                if math.isfinite(reading[0]) and math.isfinite(reading[1]):
                    return reading  # else the generic path names the message
        return self._generic(role, topic, data)

    def _generic(self, role: _Role, topic: str, data: bytes) -> tuple[float, ...]:
        message = self._decode(role, data)
        try:
            value = _field(message, self.field)
            reading = (float(value),) if self.source == "odometer" else (float(value.x), float(value.y))
        except (AttributeError, TypeError, ValueError):
            raise BagMappingError(self.path, [("distance.field", (
                f"{role.datatype} on {topic} has no {'number' if self.source == 'odometer' else 'x, y'} at "
                f"{self.field!r}; set distance.field to the message field to read (e.g. pose.position for a "
                "geometry_msgs/msg/PoseStamped) or distance.source to what the topic gives"))]) from None
        if not all(math.isfinite(v) for v in reading):
            raise _BadMessage(f"{self.field} is not finite: {reading}")
        return reading

    def _distance(self, role: _Role, topic: str, t_ns: int, data: bytes) -> None:
        reading = self._reading(role, topic, data)
        if self.gap_ns is not None and self.run is not None and t_ns - self.last_distance_ns > self.gap_ns:
            self._close(self.run.last_ns, "complete", "")
        if self.run is None and (self.single or self.gap_ns is not None):
            self._open(t_ns, topic, {})
        run = self.run
        if self.source == "position":
            step = math.hypot(reading[0] - self.last[0], reading[1] - self.last[1]) if self.last else 0.0
        elif self.source == "velocity":
            speed = math.hypot(*reading)
            step = ((self.last[0] + speed) / 2 * (t_ns - self.last[1]) / 1e9 if self.last else 0.0)
            reading = (speed, t_ns)
        elif self.last is None:
            step = 0.0
        else:  # an odometer that went back was reset: count on from its new reading
            step = reading[0] - self.last[0] if reading[0] >= self.last[0] else reading[0]
        if run is not None:
            run.distance_m += step
            run.last_ns = t_ns
        self.last = reading
        self.last_distance_ns = t_ns

    # -- events, configuration, boundaries --

    def _event(self, role: _Role, topic: str, t_ns: int, message: Any) -> None:
        if role.event_kind == JSON_EVENTS:
            msg = _json_message(EventMessage, message.data)
            event = {"kind": msg.event, "distance_m": msg.distance_m, "position": msg.position,
                     "data": dict(msg.model_extra or {})}
        elif role.datatype == BOOL:
            was, self.bool_state[topic] = self.bool_state.get(topic, False), bool(message.data)
            if was or not message.data:
                return  # an event each time the flag turns true, not each time it is repeated
            event = {"kind": role.event_kind, "data": {}}
        else:
            text = getattr(message, "data", None) if role.datatype == STRING else None
            event = {"kind": role.event_kind, "data": {"text": text} if text else {}}
        run = self.run
        if run is None or (self.gap_ns is not None and t_ns - self.last_distance_ns > self.gap_ns):
            self.notes.append(f"{self.path.name}: {topic} @ {_time(t_ns).isoformat()}: {event['kind']} "
                              "outside any run, not imported")
            return
        if event.get("distance_m") is None:
            event["distance_m"] = run.distance_m
        if event.get("position") is None and self.source == "position" and self.last is not None:
            event["position"] = {"x": self.last[0], "y": self.last[1]}
        event |= {"at": _time(t_ns), "t_s": (t_ns - run.start_ns) / 1e9}
        run.events.append(event)
        run.last_ns = max(run.last_ns, t_ns)

    def _config_message(self, role: _Role, topic: str, t_ns: int, message: Any) -> None:
        if role.datatype == STRING:
            self._config(message.data)
            return
        wanted = self.mapping.config  # a node's parameter, among every node's parameter events
        if message.node != wanted.node:
            return
        for parameter in [*message.new_parameters, *message.changed_parameters]:
            if parameter.name == wanted.parameter:
                if parameter.value.type != PARAMETER_STRING:
                    raise _BadMessage(f"parameter {wanted.parameter} of {wanted.node} is of ROS parameter type "
                                      f"{parameter.value.type}, not a string (4) holding a hash or JSON")
                self._config(parameter.value.string_value)

    def _config(self, text: str) -> None:
        config = (_json_message(ConfigMessage, text) if text.lstrip().startswith("{")
                  else ConfigMessage(hash=text.strip()))
        run = self.run
        if run is not None and run.config is not None and run.config != config:
            raise _BadMessage(f"the configuration changed during the run that started at "
                              f"{_time(run.start_ns).isoformat()}; end the run before deploying another")
        if run is not None:
            run.config = config
        self.config = config

    def _boundary(self, role: _Role, topic: str, t_ns: int, message: Any) -> None:
        if role.datatype == BOOL:  # a state: a run starts when it turns true and ends when it turns false
            if bool(message.data) == (self.run is not None):
                return
            msg = RunMessage(run="start" if message.data else "end")
        else:
            msg = _json_message(RunMessage, message.data)
        if msg.run == "start":
            if self.run is not None:
                self.notes.append(f"{self.path.name}: {topic} @ {_time(t_ns).isoformat()}: a run started "
                                  "before the previous one ended; that one is imported as incomplete")
                self._close(None, "incomplete", "")
            self._open(t_ns, topic, {"conditions": msg.conditions, "operator": msg.operator,
                                     "notes": msg.notes})
        elif self.run is None:
            self.notes.append(f"{self.path.name}: {topic} @ {_time(t_ns).isoformat()}: an end without a "
                              "start, ignored")
        else:
            self._close(t_ns, msg.status, msg.message)

    def _open(self, t_ns: int, topic: str, own: dict[str, Any]) -> None:
        """Start a run; its conditions are the bag's metadata, then its start message's, then the caller's."""
        over = self.overrides
        meta = {"conditions": {**self.meta["conditions"], **own.get("conditions", {}), **over["conditions"]},
                "operator": over["operator"] or own.get("operator") or self.meta["operator"],
                "notes": own.get("notes") or self.meta["notes"]}
        self.run = _Run(start_ns=t_ns, topic=topic, meta=meta, config=self.config, last_ns=t_ns)
        # Distance counts from the run's first reading: between runs the robot may have been
        # carried back, or its odometry reset.
        self.last = None

    def _close(self, t_ns: int | None, status: str, message: str) -> None:
        run = self.run
        run.status, run.end_message = status, message
        run.ended_ns = None if status == "incomplete" else max(t_ns, run.last_ns)
        self.done.append(run)
        self.run = None

    # -- the result --

    def finish(self) -> BagReading:
        if self.run is not None:
            if self.single or self.gap_ns is not None:
                self._close(self.run.last_ns, "complete", "")
            else:
                self.notes.append(f"{self.path.name}: the run that started at "
                                  f"{_time(self.run.start_ns).isoformat()} never ended in the bag; "
                                  "imported as incomplete")
                self._close(None, "incomplete", "")
        problems = list(self.problems)
        records = []
        for run in self.done:
            try:
                records.append(self._record(run))
            except ValidationError as exc:
                problems.append(MessageProblem(str(self.path), run.topic, run.start_ns, describe(exc)))
        if problems:
            raise ImportRowsError(problems, unit="message", source="bag")
        return BagReading(self.bag, records, self.notes, self.skipped)

    def _record(self, run: _Run) -> RunRecord:
        config = run.config or ConfigMessage()
        conditions = run.meta["conditions"]
        notes = run.meta["notes"]
        if run.skipped:
            notes = "; ".join(filter(None, [notes, f"{len(run.skipped)} bad bag message(s) left out: "
                                                   + "; ".join(run.skipped)]))
        return RunRecord.model_validate({
            # The id is the bag's and the run's start: importing the bag again finds the run stored.
            "id": "bag-" + content_hash(self.application, self.identity, run.start_ns, length=24),
            "application": self.application,
            "config": {"hash": config.hash, "knobs": config.knobs, "nn_errors": config.nn_errors},
            "error_point": config.error_point,
            "conditions": conditions, "operator": run.meta["operator"], "notes": notes,
            "started_at": _time(run.start_ns),
            "ended_at": _time(run.ended_ns) if run.ended_ns is not None else None,
            "status": run.status, "distance_m": round(run.distance_m, 6), "end_message": run.end_message,
            "source": f"bag:{self.bag.name}", "events": run.events,
        })
