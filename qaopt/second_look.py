"""A second look for the application-agnostic tolerance test: another validation split, for the trials the first cannot decide.

The agnostic rule (:mod:`qaopt.tolerance`) judges a candidate's excess error on the upper
bound of its confidence interval, so a candidate whose point error is inside its bound may
still be rejected because the validation split is too small to show it
(:attr:`~qaopt.tolerance.Judgement.unresolved`). Then the baseline stops short of what
accuracy-preserving compression would reach, and "aware over agnostic" overstates what the
application's headroom buys: a CropFollow default run chose bf16 heading at full input where
heading at input 0.5 in int8, more accurate than its reference by its point error, needed
1.24x the frames to be shown so (docs/benchmarks/knobs_default/cropfollow-session45/result.json,
``agnostic_rule.unresolved.heading.data_needed``).

A spec that names ``nns.<name>.data.more_validation`` (args that make its data source return
another validation split) lets the agnostic study decide such trials: each is judged again on
**both splits together** (the candidate and the reference paired on the same frames, as the
rule always pairs them), and only such trials, so the other trials cost nothing more. Frames
the first split already held count again in the second look, which is a second test of the
same bound: a candidate whose true excess sits at the bound passes one of two looks more often
than one of one, by at most the rule's 5 % again; the study records both looks.

What the candidates err on the second split is measured once per (NN, candidate) and kept in
the cache under the split's fingerprint (when its data gives one), so a resumed run looks again
for free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.store import atomic_path
from qaopt.approx import Candidate, TargetNN
from qaopt.tolerance import Judgement, Tolerance, judge

CACHE_FOLDER = "second_look"
"""Where, under the run's cache, each candidate's residuals on a second split are kept."""
FORMAT = 1
"""Bumped when what a kept residual file means changes."""


@dataclass
class SecondLook:
    """Each NN's second validation split (loaded on first use) and the residuals candidates err on it.

    ``load`` returns an NN's split (an :class:`~qaopt.approx.NNData`) or ``None`` when its spec names none.
    """

    nns: Mapping[str, TargetNN]
    load: Callable[[TargetNN], Any]
    cache_dir: Path
    _data: dict[str, Any] = field(default_factory=dict, repr=False)
    _residuals: dict[tuple[str, str], tuple[np.ndarray, ...]] = field(default_factory=dict, repr=False)

    def split(self, name: str) -> Any:
        """NN ``name``'s second validation split, or ``None``."""
        if name not in self._data:
            self._data[name] = self.load(self.nns[name])
        return self._data[name]

    def available(self, name: str) -> bool:
        return self.split(name) is not None

    def residuals(self, name: str, candidate: Candidate) -> tuple[np.ndarray, ...]:
        """``candidate``'s per-frame errors on NN ``name``'s second split, one array per sequence."""
        key = (name, candidate.key)
        if key not in self._residuals:
            self._residuals[key] = self._kept(name, candidate)
        return self._residuals[key]

    def judge(self, tolerance: Tolerance, name: str, candidate: Candidate, reference: Candidate) -> Judgement | None:
        """``candidate`` against ``reference`` by the agnostic rule on both splits together; ``None`` when NN ``name``
        has no second split."""
        if not self.available(name):
            return None
        return judge(tolerance, (*candidate.residuals, *self.residuals(name, candidate)),
                     (*reference.residuals, *self.residuals(name, reference)))

    def _kept(self, name: str, candidate: Candidate) -> tuple[np.ndarray, ...]:
        data = self.split(name)
        fingerprint = getattr(data, "fingerprint", None)
        path = (self.cache_dir / CACHE_FOLDER / content_hash(CACHE_FOLDER, FORMAT, fingerprint, self.nns[name].metric.key)
                / f"{name}-{candidate.key}.npz") if isinstance(fingerprint, str) else None
        if path is not None and path.exists():
            with np.load(path) as npz:
                return tuple(npz[f"arr_{i}"] for i in range(len(npz.files)))
        found = self.nns[name].metric.residuals(candidate.predict(data.x_val), np.asarray(data.y_val),
                                                data.val_sequences)
        if path is not None:
            with atomic_path(path) as tmp, open(tmp, "wb") as f:
                np.savez(f, *found)
        return found
