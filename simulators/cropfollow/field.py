"""The crop field of one episode, drawn from its seed alone.

The corridor's centre line is a smooth curve of arc length ``s`` whose curvature
is a sum of a few random sinusoids; plant rows are its exact offset curves at
``(k + 1/2) * row_spacing`` (a planter sows rows a constant distance apart), so the
robot's lateral and heading errors in the row's (Frenet) frame are exact and the
error-injection path never needs the plants. The plants (positions, heights,
leaves) are drawn only for rendering.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import FieldParams

N_CURVATURE_MODES = 3
ROWS_EACH_SIDE = 3
"""Rows drawn on each side of the corridor (the renderer sees the neighbours through gaps)."""


@dataclass(frozen=True)
class Curvature:
    """Curvature profile ``kappa(s) = sum_j amp_j * sin(freq_j * s + phase_j)`` (1/m)."""

    amp: np.ndarray
    freq: np.ndarray
    phase: np.ndarray

    @classmethod
    def draw(cls, params: FieldParams, rng: np.random.Generator) -> Curvature:
        lo, hi = params.curvature_wavelength_m
        wavelength = rng.uniform(lo, hi, N_CURVATURE_MODES)
        weights = rng.dirichlet(np.ones(N_CURVATURE_MODES))
        amp = params.curvature_max_per_m * weights * rng.choice([-1.0, 1.0], N_CURVATURE_MODES)
        return cls(amp=amp, freq=2 * np.pi / wavelength, phase=rng.uniform(0, 2 * np.pi, N_CURVATURE_MODES))

    def __call__(self, s: np.ndarray) -> np.ndarray:
        s = np.asarray(s, dtype=np.float64)
        return np.sum(self.amp * np.sin(np.multiply.outer(s, self.freq) + self.phase), axis=-1)


@dataclass(frozen=True)
class Plants:
    """All plants of a field: row ``k`` (nominal lateral offset ``(k - 1/2) * spacing``: 1 is the corridor's left row, 0 its right), arc position, lateral offset (m, left positive), size."""

    row: np.ndarray
    s: np.ndarray
    lateral: np.ndarray
    height: np.ndarray
    spread: np.ndarray
    seed: np.ndarray
    """Per-plant integer that the renderer turns into leaf angles and colours."""


@dataclass(frozen=True)
class Field:
    """One episode's field: its curvature profile and, on demand, its plants."""

    params: FieldParams
    seed: int
    curvature: Curvature

    @classmethod
    def from_seed(cls, params: FieldParams, seed: int) -> Field:
        rng = np.random.default_rng([seed, 0xF1E1D])
        curvature = Curvature.draw(params, rng)
        return cls(params=params, seed=seed, curvature=curvature)

    def plants(self, length_m: float, behind_m: float = 2.0) -> Plants:
        """Plants of all drawn rows from ``s = -behind_m`` to ``s = length_m`` (the episode starts at 0)."""
        p = self.params
        rng = np.random.default_rng([self.seed, 0x91A27])
        rows, ss, lats, heights, spreads = [], [], [], [], []
        s0, s1 = -behind_m, length_m
        for k in range(-ROWS_EACH_SIDE + 1, ROWS_EACH_SIDE + 1):
            lateral = (k - 0.5) * p.row_spacing_m
            n = int((s1 - s0) / p.plant_spacing_m * 1.3) + 8
            steps = p.plant_spacing_m * (1 + p.plant_spacing_jitter * rng.uniform(-1, 1, n))
            s = s0 + rng.uniform(0, p.plant_spacing_m) + np.cumsum(steps)
            s = s[s < s1]
            keep = rng.random(s.size) >= p.missing_plant_prob
            n_gaps = rng.poisson(p.gap_prob_per_m * (s1 - s0))
            for start, length in zip(rng.uniform(s0, s1, n_gaps), rng.exponential(p.gap_length_m, n_gaps)):
                keep &= (s < start) | (s > start + length)
            s = s[keep]
            rows.append(np.full(s.size, k, dtype=np.int32))
            ss.append(s)
            lats.append(lateral + rng.normal(0, 0.015, s.size))
            heights.append(rng.uniform(*p.plant_height_m, s.size))
            spreads.append(rng.uniform(*p.leaf_spread_m, s.size))
        return Plants(
            row=np.concatenate(rows),
            s=np.concatenate(ss),
            lateral=np.concatenate(lats),
            height=np.concatenate(heights),
            spread=np.concatenate(spreads),
            seed=rng.integers(0, 2**31 - 1, sum(r.size for r in rows)).astype(np.int64),
        )
