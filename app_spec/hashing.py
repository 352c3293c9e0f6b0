"""Content hashes: the cache keys of every expensive result.

A trained NN, a pruned candidate, a QoS evaluation and a tuning record are each
stored under the hash of everything that determines them, so a later run (or a
killed one, resumed) finds and reuses them. Hashes are computed over canonical
JSON so that dict order and float formatting never change a key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def _canonical(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):  # pydantic models
        return _canonical(obj.model_dump(mode="json"))
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, float):
        return float(repr(obj)) if obj == obj else "nan"
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return _canonical(obj.tolist())
    return obj


def content_hash(*parts: Any, length: int = 16) -> str:
    """Hash JSON-able parts (dicts, lists, numbers, strings, bytes, pydantic models).

    Bytes are hashed as they are, so a weights file's content can be a part.
    """
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, (bytes, bytearray, memoryview)):
            h.update(b"b:")
            h.update(bytes(part))
        else:
            h.update(b"j:")
            h.update(json.dumps(_canonical(part), sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\x00")
    return h.hexdigest()[:length]


def file_hash(path: str | Path, length: int = 16) -> str:
    """Hash a file's bytes (weights, datasets): a renamed copy keeps its key."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:length]
