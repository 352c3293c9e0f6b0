"""Camera frames as the NNs see them: stored as uint8 (H, W, 3), read as float32 (3, H, W) in [0, 1].

One place for the conversion, shared by the example applications, so that training data, validation drives, on-policy
recordings and the closed loop feed the NNs exactly the same numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np


def to_chw_float(images: np.ndarray) -> np.ndarray:
    """uint8 (N, H, W, 3) frames -> float32 (N, 3, H, W) in [0, 1], the NNs' input (scaled in place: one array
    written, not two)."""
    out = np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)
    out *= np.float32(1 / 255)
    return out


class FrameArray:
    """Read-only float32 view (N, 3, H, W) in [0, 1] of uint8 (N, H, W, 3) shards.

    Indexing (an int, a slice or an index array) returns a float32 ndarray;
    ``np.asarray`` of the whole array materialises it (N * 0.9 MB at 320x240, N * 0.23 MB at 160x120).
    """

    def __init__(self, shards: Sequence[np.ndarray], index: np.ndarray | None = None):
        self._shards = list(shards)
        self._starts = np.cumsum([0] + [len(s) for s in self._shards])
        n = int(self._starts[-1])
        self._index = np.arange(n) if index is None else np.asarray(index, dtype=np.int64)
        h, w = (self._shards[0].shape[1:3]) if self._shards else (0, 0)
        self.shape = (len(self._index), 3, h, w)
        self.dtype = np.dtype(np.float32)
        self.ndim = 4

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def frames_key(self) -> tuple | None:
        """What names these frames without reading them: the files of memory-mapped shards and the rows taken from
        them (``None`` for shards held in memory). Arrays with equal keys hold the same frames, so NNs whose data read
        one camera's frames (CropFollow's heading and distance) share the work done on them
        (``qaopt.approx.target.same_frames``)."""
        if not all(isinstance(s, np.memmap) and s.filename for s in self._shards):
            return None
        shards = tuple((str(s.filename), s.offset, s.shape) for s in self._shards)
        return shards, hashlib.sha256(self._index.tobytes()).hexdigest()

    def uint8(self, idx: Any) -> np.ndarray:
        """The stored frames (M, H, W, 3) uint8 at ``idx``."""
        rows = np.atleast_1d(self._index[idx])
        out = np.empty((rows.size, *self._shards[0].shape[1:]), dtype=np.uint8)
        shard = np.searchsorted(self._starts, rows, side="right") - 1
        for k in np.unique(shard):
            sel = shard == k
            out[sel] = self._shards[k][rows[sel] - self._starts[k]]
        return out

    def __getitem__(self, idx: Any) -> np.ndarray:
        if isinstance(idx, tuple):
            return self[idx[0]][(slice(None), *idx[1:])]
        single = np.ndim(self._index[idx]) == 0
        frames = to_chw_float(self.uint8(idx))
        return frames[0] if single else frames

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)
