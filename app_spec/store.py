"""Where qaopt keeps what it computed, and how every file is written so that a kill never tears one.

Every component writes through this module, so one contract holds for every
artifact (a trained NN, a candidate, a tuning record, a region, a closed-loop
validation, ``result.json``):

- **Atomic.** A file is written to a temporary name in its own folder, flushed and
  fsynced, then renamed over its final name (``os.replace`` is atomic on POSIX).
  A reader therefore finds a file complete or not at all; a kill leaves at most a
  stray ``.*.tmp`` file, which nothing reads.
- **Versioned.** A JSON artifact is ``{"artifact": kind, "version": n, "data": ...}``.
  :func:`read_json` returns ``None`` for a file that is absent, unreadable, or of
  another kind or version, so a resumed run recomputes it instead of misreading it.
- **One cache location.** :func:`cache_root` is the only place that decides where
  the cache is: an explicit argument, else ``$QAOPT_CACHE_DIR``, else the spec's
  ``output.cache_dir``, else ``.qaopt-cache``.

- **Disk faults are one line.** A write that finds the disk full, the file system
  read-only or the folder not writable raises :class:`StorageError` naming the folder and
  the fix (:func:`writing_to`); the temporary file is removed, so nothing torn is left, and
  a later run with space resumes from what was written whole.
- **Reads are checked.** A JSON artifact carries a checksum of its data; one that does
  not decode or fails its checksum is damaged: it is moved aside
  (``<name>.damaged``, one warning line) and reads as absent, so its producer rebuilds it.

What a resumed run may assume: every artifact it finds was written whole by a run
with the same artifact version; anything else is recomputed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import QaoptError, warn

CACHE_ENV = "QAOPT_CACHE_DIR"
"""Environment variable that moves the cache (CI and tests point it at a shared folder)."""
DEFAULT_CACHE_DIR = Path(".qaopt-cache")

M = TypeVar("M", bound=BaseModel)


def cache_root(explicit: str | Path | None = None, configured: str | Path | None = None) -> Path:
    """The cache folder: ``explicit``, else ``$QAOPT_CACHE_DIR``, else ``configured`` (the spec's), else the default."""
    return Path(explicit or os.environ.get(CACHE_ENV) or configured or DEFAULT_CACHE_DIR)


class StorageError(QaoptError):
    """An artifact cannot be written: the disk is full, the file system read-only, or the folder not writable."""


_WHERE_ELSE = ("--out or output.dir for the run folder, output.cache_dir or $QAOPT_CACHE_DIR for the cache")
_STORAGE_FAULTS = {
    errno.ENOSPC: "no space left on its device: free space there (or point the run elsewhere: {where}), then run "
                  "again; finished work is kept and resumed",
    errno.EROFS: "it is on a read-only file system: give a writable folder ({where}), then run again",
    errno.EACCES: "no permission to write there: make it writable (chmod, chown) or give another folder ({where}), "
                  "then run again",
}
_STORAGE_FAULTS[errno.ENOTDIR] = ("a file of that name (or of a folder above it) is in the way: remove it or give "
                                  "another folder ({where}), then run again")
_STORAGE_FAULTS[errno.EEXIST] = _STORAGE_FAULTS[errno.ENOTDIR]
_STORAGE_FAULTS[errno.EDQUOT] = _STORAGE_FAULTS[errno.ENOSPC]
_STORAGE_FAULTS[errno.EPERM] = _STORAGE_FAULTS[errno.EACCES]
_TORCH_WRITE_FAILED = "inline_container"
"""What torch's file writer says when a write fails (a ``RuntimeError``, not an ``OSError``): on a full disk."""
_SQLITE_FAULTS = {"database or disk is full": errno.ENOSPC, "attempt to write a readonly database": errno.EROFS,
                  "unable to open database file": errno.EACCES}
"""What SQLite says (through SQLAlchemy, Optuna's storage) for the same three faults, as the error code it means."""
_STUDY_DATABASE = "the study database (study.db in the run folder, or search.storage / --storage)"


def storage_problem(exc: BaseException, path: str | Path) -> StorageError | None:
    """The one-line error for a failed write of ``path`` (folder and fix), or ``None`` when ``exc`` is not a disk fault."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and isinstance(exc, RuntimeError) and _TORCH_WRITE_FAILED in str(exc):
        code = errno.ENOSPC
    if code is None and type(exc).__module__.startswith("sqlalchemy"):
        code = next((c for marker, c in _SQLITE_FAULTS.items() if marker in str(exc)), None)
        if code is not None:
            return StorageError(f"cannot write {_STUDY_DATABASE}: "
                                f"{_STORAGE_FAULTS[code].format(where='search.storage or --storage')}")
    if code not in _STORAGE_FAULTS:
        return None
    path = Path(path)
    folder = path if path.is_dir() or not path.suffix else path.parent
    return StorageError(f"cannot write in {folder}: {_STORAGE_FAULTS[code].format(where=_WHERE_ELSE)}")


@contextlib.contextmanager
def writing_to(path: str | Path) -> Iterator[None]:
    """Writes under ``path`` whose disk is full, read-only or not writable raise :class:`StorageError` (one line)."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        problem = storage_problem(exc, path)
        if problem is None:
            raise
        raise problem from exc


def ensure_writable(folder: str | Path) -> Path:
    """Check that files can be written in ``folder``: a disk fault raises :class:`StorageError`; nothing is left.

    A probe file is written and removed in ``folder``, or, where it does not exist yet, in its nearest existing
    parent (the folder itself is made later, by the first write). A command checks every folder it will write (its
    run folder, the cache, a study database's folder) this way before any work, so a read-only, foreign or full
    folder is named with its fix at once, in the same words as a write that fails later, instead of after minutes
    of computation or in the storage library's own words.
    """
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    with writing_to(folder):
        if not probe.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe))
        fd, name = tempfile.mkstemp(prefix=".qaopt-write-check.", suffix=".tmp", dir=probe)
        os.close(fd)
        os.unlink(name)
    return folder


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write; it becomes ``path`` only if the block ends without error (nothing torn is left)."""
    path = Path(path)
    with writing_to(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with writing_to(path.parent):
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def checksum(data: Any) -> str:
    """The checksum a JSON artifact carries: SHA-256 of its data in canonical JSON (what reading it back gives)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_json(path: str | Path, kind: str, version: int, data: Any) -> Path:
    """Write ``data`` as a versioned artifact of ``kind``, with its checksum."""
    data = json.loads(json.dumps(data))  # what a reader will see: tuples as lists, keys as strings
    doc = {"artifact": kind, "version": version, "sha256": checksum(data), "data": data}
    return write_text(path, json.dumps(doc, indent=1))


def read_json(path: str | Path, kind: str, version: int) -> Any | None:
    """The data of a versioned artifact, or ``None`` when it is absent, another kind or version, or damaged.

    A damaged file (bytes that do not decode as JSON, a checksum that does not match) is
    moved aside (:func:`set_aside`) so its producer rebuilds it. A file without a checksum
    (written before artifacts carried one) is read as it is.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_bytes().decode())
    except OSError:  # absent, or unreadable here: recomputed
        return None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError alike
        set_aside(path, f"it does not decode ({type(exc).__name__})")
        return None
    if not isinstance(doc, dict) or doc.get("artifact") != kind or doc.get("version") != version or "data" not in doc:
        return None  # stale: an older format, kind or version, recomputed in place
    if "sha256" in doc and doc["sha256"] != checksum(doc["data"]):
        set_aside(path, "its checksum does not match its content")
        return None
    return doc["data"]


def set_aside(path: str | Path, why: str) -> None:
    """Move a damaged artifact (a file or a folder) to ``<name>.damaged`` with one warning line; it is rebuilt.

    One that cannot be moved (a read-only folder) is only reported; its producer's write replaces it.
    """
    path = Path(path)
    aside = path.with_name(path.name + ".damaged")
    try:
        if aside.is_dir():
            shutil.rmtree(aside)
        os.replace(path, aside)
    except OSError:
        warn(f"{path} is damaged ({why}); it is rebuilt, but could not be moved aside: delete it")
        return
    warn(f"{path} is damaged ({why}); moved aside to {aside.name} and rebuilt")


def write_model(path: str | Path, model: BaseModel, version: int) -> Path:
    """Write a pydantic model as a versioned artifact (its class name is its kind)."""
    return write_json(path, type(model).__name__, version, model.model_dump(mode="json"))


def read_model(path: str | Path, cls: type[M], version: int) -> M | None:
    """A pydantic model written by :func:`write_model`, or ``None`` when absent, torn, stale or invalid."""
    data = read_json(path, cls.__name__, version)
    if data is None:
        return None
    try:
        return cls.model_validate(data)
    except ValidationError:
        return None
