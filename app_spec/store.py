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

What a resumed run may assume: every artifact it finds was written whole by a run
with the same artifact version; anything else is recomputed.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

CACHE_ENV = "QAOPT_CACHE_DIR"
"""Environment variable that moves the cache (CI and tests point it at a shared folder)."""
DEFAULT_CACHE_DIR = Path(".qaopt-cache")

M = TypeVar("M", bound=BaseModel)


def cache_root(explicit: str | Path | None = None, configured: str | Path | None = None) -> Path:
    """The cache folder: ``explicit``, else ``$QAOPT_CACHE_DIR``, else ``configured`` (the spec's), else the default."""
    return Path(explicit or os.environ.get(CACHE_ENV) or configured or DEFAULT_CACHE_DIR)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write; it becomes ``path`` only if the block ends without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
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


def write_json(path: str | Path, kind: str, version: int, data: Any) -> Path:
    """Write ``data`` as a versioned artifact of ``kind``."""
    return write_text(path, json.dumps({"artifact": kind, "version": version, "data": data}, indent=1))


def read_json(path: str | Path, kind: str, version: int) -> Any | None:
    """The data of a versioned artifact, or ``None`` when it is absent, unreadable, or another kind or version."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("artifact") != kind or doc.get("version") != version:
        return None
    return doc.get("data")


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
