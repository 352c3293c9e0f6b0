"""Seed blocks: the unit of evaluation and of caching.

Each evaluated point draws its own seeds: a stream of consecutive seeds that starts at
a number derived from the calibration's seed and the point (:func:`point_seed_start`),
taken in blocks that the simulator runs in lock-step. No two points share seeds, so a
run of easy (or hard) seeds cannot make every point look easy (or hard) at once, and
neighbouring verdicts are independent evidence that a pooled model may combine.

Calibration seeds live at and above :data:`CALIBRATION_SEED_FLOOR`, far above the
seeds applications use for training data, validation drives and closed-loop
validation (all below 10**8), so a calibration run never replays one of those.

Each block's raw metrics are stored on disk under the hash of everything that
determines them: the application (``app_key``), the error injected into each NN
(model and setting) and the seeds. A killed calibration replays its cached blocks
for free and resumes where it stopped; another strategy, budget or QoS threshold
reuses the same runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qaopt.app_spec import store
from qaopt.app_spec.hashing import content_hash
from qaopt.calibrate.protocols import records_problem

CALIBRATION_SEED_FLOOR = 2**33
"""The lowest seed a calibration uses; everything below is left to applications and to validation."""

STREAM_LENGTH = 2**16
"""Seeds reserved for one point: no point is ever run that many times."""


def point_seed_start(seed: int, injection: Mapping) -> int:
    """The first seed of a point's stream, from the calibration's ``seed`` and what is injected there.

    Deterministic (a re-run, or another strategy visiting the same point, gets the same
    seeds and therefore the cached runs) and different for every point and every ``seed``.
    """
    slot = int(content_hash(seed, injection, length=10), 16)  # 40 bits
    return CALIBRATION_SEED_FLOOR + slot * STREAM_LENGTH


def block_seeds(start: int, block: int, size: int) -> list[int]:
    """Seeds of the ``block``-th block of ``size`` runs of a stream starting at ``start``."""
    if (block + 1) * size > STREAM_LENGTH:
        raise ValueError(f"block {block} of {size} runs leaves the point's stream of {STREAM_LENGTH} seeds")
    return list(range(start + block * size, start + (block + 1) * size))


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


@dataclass(frozen=True)
class PointTrials:
    """One point's blocks in a :class:`TrialCache`: the seed-block engine's cache (:class:`~qaopt.calibrate.blocks.BlockCache`).

    A stored block that does not hold one record with a finite ``metric`` per seed (stale,
    edited) reads as absent, so the block is run again.
    """

    cache: TrialCache
    app_key: str
    injection: Mapping
    metric: str

    def get(self, seeds: Sequence[int]) -> list[dict] | None:
        records = self.cache.get(TrialCache.key(self.app_key, self.injection, list(seeds)))
        return None if records is None or records_problem(records, seeds, self.metric) else records

    def put(self, seeds: Sequence[int], result: list[dict]) -> None:
        self.cache.put(TrialCache.key(self.app_key, self.injection, list(seeds)), result)
