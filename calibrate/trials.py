"""Seed blocks: the unit of evaluation and of caching.

A point is evaluated in blocks of consecutive seeds (0..7, 8..15, ...) that the
simulator runs in lock-step. Each block's raw metrics are stored on disk under
the hash of everything that determines them: the application (``app_key``), the
error injected into each NN (model and setting) and the seeds. A killed
calibration replays its cached blocks for free and resumes where it stopped;
another strategy, budget or QoS threshold reuses the same runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from qaopt.app_spec import store
from qaopt.app_spec.hashing import content_hash


def block_seeds(block: int, size: int, base: int = 0) -> list[int]:
    return list(range(base + block * size, base + (block + 1) * size))


class TrialCache:
    """JSON files under ``<cache_dir>/calibrate/trials/``.

    Writes are atomic (:func:`qaopt.app_spec.store.atomic_path`); a file that cannot be
    read back as a list of records (torn by a crash of an older version, edited) is a
    cache miss, so its block is run again.
    """

    def __init__(self, cache_dir: str | Path):
        self.root = Path(cache_dir) / "calibrate" / "trials"

    @staticmethod
    def key(app_key: str, injection: Mapping, seeds: list[int]) -> str:
        return content_hash(app_key, injection, seeds, length=24)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> list[dict] | None:
        try:
            records = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            return None
        return records

    def put(self, key: str, records: list[dict]) -> None:
        store.write_text(self._path(key), json.dumps(records))
