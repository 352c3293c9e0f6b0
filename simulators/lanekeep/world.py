"""One route per seed: the road's curvature, its stop lines and the lead vehicle's plan.

Everything a run meets is drawn from the seed alone, before the run starts, so the
same seed gives the same route whatever the NNs do and whichever other seeds share
the batch. The layout keeps the two situations the stack must handle apart: the
lead vehicle drives the first part of the route and turns off the road at least
``road.stop_approach_m`` before the first stop line, so a missed stop and a
rear-end collision each have one cause.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import RoadParams

N_MODES = 3
"""Sinusoids in the curvature profile."""
MAX_STOPS = 2
LEAD_START, LEAD_END, LEAD_GAP, LEAD_SPEED = range(4)
LEAD_EVENT0 = 4
"""Brake events start at this column, 4 numbers each: time after appearing (s), deceleration, speed to brake to, hold (s)."""
N_EVENTS = 2
N_LEAD = LEAD_EVENT0 + 4 * N_EVENTS
GOAL_MARGIN_M = 15.0
"""No stop line in the last metres of the route: the goal is not a stop."""


@dataclass(frozen=True)
class Route:
    """The seed's road and scenario (arrays in the form the compiled kernels take)."""

    seed: int
    curvature: np.ndarray
    """(3, N_MODES): amplitude (1/m), angular frequency (rad/m), phase of each sinusoid of kappa(s)."""
    stops: np.ndarray
    """(MAX_STOPS,) arc lengths of the stop lines, increasing, ``inf`` where there is none."""
    lead: np.ndarray
    """(N_LEAD,) the lead vehicle's plan; ``lead[LEAD_END] <= lead[LEAD_START]`` means no lead vehicle."""

    @classmethod
    def from_seed(cls, road: RoadParams, route_m: float, seed: int) -> Route:
        rng = np.random.default_rng([seed, 0x20AD])
        lam = rng.uniform(*road.curvature_wavelength_m, N_MODES)
        amp = rng.uniform(-1.0, 1.0, N_MODES) * (1.0 / road.min_radius_m) / N_MODES
        curvature = np.stack([amp, 2 * math.pi / lam, rng.uniform(0, 2 * math.pi, N_MODES)])
        n_stops = int(rng.integers(road.stop_signs[0], road.stop_signs[1] + 1))
        lead_start = rng.uniform(0.0, 15.0)
        lead_len = rng.uniform(*road.lead_segment_m) if road.lead_vehicle else 0.0
        end = route_m - GOAL_MARGIN_M
        lead_end = lead_start + lead_len
        u_first, u_second = rng.random(2)
        while True:
            need = max(n_stops - 1, 0) * road.stop_spacing_m
            first_min = max(road.first_stop_m, lead_end + road.stop_approach_m if lead_len > 0 else 0.0)
            if n_stops == 0 or first_min <= end - need:
                break
            shorter = end - need - road.stop_approach_m
            if lead_len > 0 and shorter - lead_start >= 40.0 and lead_end > shorter:
                lead_end = shorter  # the lead turns off sooner to make room for the stops
            else:
                n_stops -= 1
                lead_end = lead_start + lead_len
        stops = np.full(MAX_STOPS, np.inf)
        if n_stops >= 1:
            stops[0] = first_min + u_first * (end - need - first_min)
        if n_stops == 2:
            lo = stops[0] + road.stop_spacing_m
            stops[1] = lo + u_second * (end - lo)
        lead = np.zeros(N_LEAD)
        lead[LEAD_START], lead[LEAD_END] = lead_start, (min(lead_end, route_m) if lead_len > 0 else lead_start)
        lead[LEAD_GAP] = rng.uniform(*road.lead_gap_m)
        lead[LEAD_SPEED] = rng.uniform(*road.lead_speed_mps)
        t = 0.0
        for k in range(N_EVENTS):
            t += rng.uniform(3.0, 6.0) if k == 0 else rng.uniform(7.0, 11.0)
            to = 0.0 if rng.random() < 0.4 else rng.uniform(*road.lead_brake_to_mps)
            lead[LEAD_EVENT0 + 4 * k : LEAD_EVENT0 + 4 * k + 4] = t, rng.uniform(*road.lead_brake_mps2), to, rng.uniform(0.5, 2.0)
        return cls(int(seed), curvature, stops, lead)

    @property
    def n_stops(self) -> int:
        return int(np.isfinite(self.stops).sum())

    @property
    def has_lead(self) -> bool:
        return bool(self.lead[LEAD_END] > self.lead[LEAD_START])

    def kappa(self, s: np.ndarray | float) -> np.ndarray:
        a, w, p = self.curvature
        return np.sum(a[:, None] * np.sin(w[:, None] * np.atleast_1d(np.asarray(s, dtype=float))[None, :] + p[:, None]), axis=0)
