"""The on-disk store of built candidates, keyed by content hash.

Layout under ``<cache root>/approx/`` (the root is :func:`qaopt.app_spec.store.cache_root`'s):
``float/<key>/`` holds a pruned, fine-tuned fp32 module (shared by the fp32, bf16,
fp16 and int8 candidates made from it), ``candidates/<key>/`` a candidate's metrics
(a versioned ``candidate.json``), residuals and int8 ONNX file, ``teacher/<key>.npy``
the base NN's outputs on its training data. Entries are written to a temporary
folder and renamed into place, so a killed run leaves no half-written entry; a
lock per key stops two processes from building the same candidate twice.

Every entry carries a manifest (``files.json``: the SHA-256 of each of its files). An
entry whose files no longer match it (a damaged disk, an edit, garbage bytes) is set
aside (``<key>.damaged``, one warning line) and reads as absent, so it is rebuilt instead
of failing in a torch or ONNX loader; so is a teacher-output file that does not load.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock
from torch import nn

from qaopt.app_spec.hashing import file_hash
from qaopt.app_spec.store import atomic_path, cache_root, read_json, set_aside, write_json, writing_to

META_KIND, META_VERSION = "approx.candidate", 1
MANIFEST, MANIFEST_KIND, MANIFEST_VERSION = "files.json", "approx.files", 1


class Store:
    def __init__(self, cache_dir: str | Path | None):
        self.root = cache_root(cache_dir) / "approx"
        with writing_to(self.root):
            for sub in ("float", "candidates", "teacher", "locks"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        with FileLock(self.root / "locks" / f"{key}.lock"):
            yield

    def entry(self, kind: str, key: str) -> Path | None:
        """The entry's folder, or ``None`` when it is absent or damaged (then set aside, to be rebuilt)."""
        path = self.root / kind / key
        return path if path.is_dir() and self.intact(path) else None

    @staticmethod
    def intact(folder: Path) -> bool:
        """Whether ``folder``'s files match its manifest; a damaged entry is set aside. One written before entries
        carried a manifest is taken as it is."""
        if not (folder / MANIFEST).exists():
            return True
        files = read_json(folder / MANIFEST, MANIFEST_KIND, MANIFEST_VERSION)
        bad = "its manifest is unreadable" if not isinstance(files, dict) else next(
            (f"{name} does not match its checksum" for name, digest in files.items()
             if not (folder / name).is_file() or file_hash(folder / name, length=64) != digest), None)
        if bad is not None:
            set_aside(folder, bad)
        return bad is None

    @contextlib.contextmanager
    def writing(self, kind: str, key: str) -> Iterator[Path]:
        """A fresh folder to fill; it becomes ``<kind>/<key>``, with its manifest, only if the block ends without error.

        A stale entry (one written in an older format) is replaced; callers hold the key's lock.
        """
        with writing_to(self.root / kind):
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.root / kind))
        try:
            with writing_to(self.root / kind):  # a full disk while the entry is filled is one line too
                yield tmp
                files = {p.relative_to(tmp).as_posix(): file_hash(p, length=64)
                         for p in sorted(tmp.rglob("*")) if p.is_file()}
                write_json(tmp / MANIFEST, MANIFEST_KIND, MANIFEST_VERSION, files)
                shutil.rmtree(self.root / kind / key, ignore_errors=True)
                os.replace(tmp, self.root / kind / key)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # Pruned modules have shapes the model's own code does not build, so they are
    # stored whole (pickled by torch); the cache holds only files qaopt wrote itself.
    @staticmethod
    def save_module(module: nn.Module, folder: Path) -> None:
        torch.save(module, folder / "model.pt")

    @staticmethod
    def load_module(folder: Path) -> nn.Module:
        return torch.load(folder / "model.pt", map_location="cpu", weights_only=False).eval()

    @staticmethod
    def save_meta(meta: dict[str, Any], folder: Path) -> None:
        write_json(folder / "candidate.json", META_KIND, META_VERSION, meta)

    @staticmethod
    def load_meta(folder: Path | None) -> dict[str, Any] | None:
        """A candidate's metrics, or ``None`` when there is no entry or it is of another format (then it is rebuilt)."""
        return None if folder is None else read_json(folder / "candidate.json", META_KIND, META_VERSION)

    def teacher_outputs(self, key: str) -> np.ndarray | None:
        """The stored teacher outputs, or ``None`` when absent or damaged (then set aside, to be computed again)."""
        path = self.root / "teacher" / f"{key}.npy"
        if not path.exists():
            return None
        try:
            return np.load(path)
        except (ValueError, OSError, EOFError) as exc:
            set_aside(path, f"it does not load: {type(exc).__name__}")
            return None

    def save_teacher_outputs(self, key: str, outputs: np.ndarray) -> None:
        with atomic_path(self.root / "teacher" / f"{key}.npy") as tmp, open(tmp, "wb") as f:
            np.save(f, outputs)
