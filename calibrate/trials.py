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
import os
from collections.abc import Mapping
from pathlib import Path

from qaopt.app_spec.hashing import content_hash


def block_seeds(block: int, size: int, base: int = 0) -> list[int]:
    return list(range(base + block * size, base + (block + 1) * size))


class TrialCache:
    """JSON files under ``<cache_dir>/calibrate/trials/``; writes are atomic (a kill never leaves half a file)."""

    def __init__(self, cache_dir: str | Path):
        self.root = Path(cache_dir) / "calibrate" / "trials"

    @staticmethod
    def key(app_key: str, injection: Mapping, seeds: list[int]) -> str:
        return content_hash(app_key, injection, seeds, length=24)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> list[dict] | None:
        try:
            return json.loads(self._path(key).read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def put(self, key: str, records: list[dict]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(records))
        tmp.replace(path)
