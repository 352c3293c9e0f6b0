"""What monotonicity alone implies: more error never helps the application.

Every point dominated by a valid point (all coordinates ``<=``) is valid, every
point dominating an invalid one is invalid. Where noisy verdicts contradict each
other (a valid point above an invalid one) nothing is implied, so a contradiction
can only shrink the certified region, never grow it.
"""

from __future__ import annotations

import numpy as np


def below(X: np.ndarray, P: np.ndarray) -> np.ndarray:
    """``[i]``: some row of P is >= X[i] in every coordinate (X[i] is dominated)."""
    if len(P) == 0:
        return np.zeros(len(X), dtype=bool)
    return (X[:, None, :] <= P[None, :, :] + 1e-12).all(axis=2).any(axis=1)


def above(X: np.ndarray, P: np.ndarray) -> np.ndarray:
    """``[i]``: some row of P is <= X[i] in every coordinate (X[i] dominates it)."""
    if len(P) == 0:
        return np.zeros(len(X), dtype=bool)
    return (X[:, None, :] >= P[None, :, :] - 1e-12).all(axis=2).any(axis=1)


class Dominance:
    """Labelled points in unit coordinates and the labels they imply elsewhere."""

    def __init__(self, valid: np.ndarray, invalid: np.ndarray, dim: int):
        self.valid = np.asarray(valid, dtype=float).reshape(-1, dim)
        self.invalid = np.asarray(invalid, dtype=float).reshape(-1, dim)

    @classmethod
    def from_labels(cls, X: np.ndarray, y: np.ndarray) -> Dominance:
        X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=bool)
        return cls(X[y], X[~y], X.shape[1])

    def labels(self, X: np.ndarray) -> np.ndarray:
        """+1 implied valid, -1 implied invalid, 0 unresolved (or contradicted)."""
        X = np.atleast_2d(np.asarray(X, dtype=float))
        v, r = below(X, self.valid), above(X, self.invalid)
        return np.where(v & ~r, 1, np.where(r & ~v, -1, 0))

    def implied(self, x: np.ndarray) -> bool | None:
        lab = int(self.labels(x)[0])
        return None if lab == 0 else lab > 0
