"""Closed-loop LaneKeep runs and their QoS: the evaluator calibration calls.

A batch of episodes (one per seed) runs in lock-step: at every perception step the
three NNs' outputs for all episodes are produced at once, either as ground truth
plus an injected error (``evaluate``, no rendering: the hot path of calibration) or
by perception NNs reading rendered camera frames (``evaluate_perception``), and one
compiled kernel call advances them all by a perception period.

Beside each episode runs its ideal twin: the same route, start and process noise,
driven with perfect perception. Its time to the goal is the nominal time of
``time_ratio``, so the ratio measures what the NNs' errors cost (phantom stops,
hesitant following) and not how slow the route's lead vehicle or stops are; with
perfect perception it is exactly 1. The twins cost no NN calls, no injector calls
and no frames.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qaopt.calibrate.protocols import Injector

from . import dynamics as dyn
from .config import NN_NAMES, RULES, SimConfig
from .errors import PerceptionError
from .. import closed_loop
from .world import MAX_STOPS, N_LEAD, N_MODES, Route

Estimate = Callable[[int, "Batch"], np.ndarray]
"""``(step, batch) -> (3, B)`` outputs of the three NNs for the batch's B episodes (rows follow ``NN_NAMES``)."""

QOS_METRICS = ("violations", "collisions", "lane_departures", "missed_stops", "phantom_stops", "time_to_goal_s", "time_ratio", "distance_m")


@dataclass
class Batch:
    """Episodes running in lock-step: rows ``[0, B)`` are the runs, rows ``[B, 2B)`` their ideal twins."""

    seeds: list[int]
    routes: list[Route]
    state: np.ndarray
    """(2B, dynamics.N_STATE) float64; columns named in :mod:`.dynamics`."""
    curvature: np.ndarray
    stops: np.ndarray
    lead: np.ndarray
    keys: np.ndarray
    truth: np.ndarray
    """(3, 2B): lane offset (m), stop (0/1), lead distance (m) the NNs should output now."""

    @classmethod
    def start(cls, config: SimConfig, seeds: Sequence[int], twins: bool = True) -> Batch:
        seeds = RULES.seeds(seeds)
        routes = [Route.from_seed(config.road, config.route_m, s) for s in seeds]
        rows = routes + routes if twins else routes
        n = len(rows)
        curvature = np.empty((n, 3, N_MODES))
        stops = np.empty((n, MAX_STOPS))
        lead = np.empty((n, N_LEAD))
        state = np.zeros((n, dyn.N_STATE))
        keys = np.empty(n, dtype=np.uint64)
        for i, r in enumerate(rows):
            curvature[i], stops[i], lead[i] = r.curvature, r.stops, r.lead
            seq = np.random.SeedSequence([r.seed, 0x5EED])
            keys[i] = seq.generate_state(1, np.uint64)[0]
            u = np.random.default_rng(seq).uniform(-1, 1, 2)
            state[i, dyn.EY] = u[0] * config.initial_lateral_m
            state[i, dyn.EPSI] = np.radians(u[1] * config.initial_heading_deg)
            state[i, dyn.V] = config.car.set_speed_mps
        phys = dyn.physics(config)
        dyn.start(state, lead, phys)
        truth = np.empty((3, n))
        dyn.observe(state, curvature, stops, phys, truth)
        return cls(seeds, routes, state, curvature, stops, lead, keys, truth)

    @property
    def size(self) -> int:
        return len(self.seeds)

    @property
    def active(self) -> np.ndarray:
        """(B,) which runs (not twins) are unfinished."""
        return self.state[: self.size, dyn.DONE] == 0.0

    @property
    def runs_truth(self) -> np.ndarray:
        """(3, B) what perfect NNs would output now for the runs (not twins)."""
        return self.truth[:, : self.size]

    def records(self, config: SimConfig) -> list[dict[str, float]]:
        n = self.size
        out = []
        for b in range(n):
            row, twin = self.state[b], self.state[n + b] if len(self.state) > n else self.state[b]
            t = row[dyn.GOAL_T] if row[dyn.GOAL_T] >= 0 else row[dyn.TIME]
            t_ideal = twin[dyn.GOAL_T] if twin[dyn.GOAL_T] > 0 else max(twin[dyn.TIME], 1e-9)
            ratio = float(t / t_ideal)
            rec = {
                "collisions": float(row[dyn.COLLISIONS]),
                "lane_departures": float(row[dyn.DEPARTURES]),
                "missed_stops": float(row[dyn.MISSED]),
                "phantom_stops": float(row[dyn.PHANTOMS]),
                "time_to_goal_s": float(t),
                "time_ratio": ratio,
                "distance_m": float(min(row[dyn.S], config.route_m)),
            }
            late = 1.0 if (ratio > config.time_ratio_bound or row[dyn.S] < config.route_m) else 0.0
            rec["violations"] = rec["collisions"] + rec["lane_departures"] + rec["missed_stops"] + late
            out.append({k: rec[k] for k in QOS_METRICS})
        return out


def run_batch(config: SimConfig, seeds: Sequence[int], estimate: Estimate, max_steps: int | None = None) -> Batch:
    """Run one episode per seed (and its ideal twin) to the goal or the time limit; return the final batch."""
    batch = Batch.start(config, seeds)
    phys = dyn.physics(config)
    n = batch.size
    est = np.empty_like(batch.truth)
    for step in range(config.max_steps if max_steps is None else max_steps):
        est[:, n:] = batch.truth[:, n:]
        est[:, :n] = estimate(step, batch)
        active = dyn.closed_loop_step(est, batch.state, batch.curvature, batch.stops, batch.lead, batch.keys, phys, batch.truth)
        if active < 0:
            nn = NN_NAMES[dyn.BAD_ESTIMATE - active]
            raise PerceptionError(nn, f"estimate at perception step {step} is not finite (NaN or inf); an injector or NN must return finite numbers")
        if active == 0:
            break
    return batch


class LaneKeepEvaluator(closed_loop.LockstepEvaluator):
    """The LaneKeep application; it keeps the application protocol, :class:`qaopt.calibrate.protocols.Application`.

    Three NNs read one front camera: ``lane`` (lateral offset of the lane centre at
    the look-ahead, m), ``stop`` (probability that an unpassed stop line is within
    the detection range; the stack decides "present" at >= 0.5) and ``lead``
    (distance to the lead vehicle's rear, m, clipped at ``stack.lead_max_m``). A
    perception NN (:data:`~qaopt.calibrate.protocols.Perception`) takes float32 images
    (B, 3, H, W) in [0, 1] and returns (B,) or (B, 1), as torch or numpy.

    ``LaneKeepEvaluator(route_m=300.0, road={...}, car={...}, stack={...}, camera={...}, ...)``;
    see :class:`.config.SimConfig`. Each seed is one episode: its route, start pose and
    process noise come from the seed alone; the injectors' random generators come
    from the whole seed list. Results are deterministic for given (injectors, seeds).

    QoS per run: ``collisions`` (with the lead vehicle), ``lane_departures`` (the body
    leaves its lane; events), ``missed_stops`` (a stop line crossed without standing
    still within ``stop_window_m`` before it), ``phantom_stops`` (stops begun with no
    stop line near), ``time_to_goal_s``, ``time_ratio`` (over the ideal driver's time),
    ``distance_m``, and the pass/fail count ``violations`` = collisions + departures +
    missed stops + 1 if the run was more than ``time_ratio_bound`` times slower than the
    ideal driver (or never reached the goal).

    The ``stop`` injector receives 0/1 truth and returns 0/1 decisions or
    probabilities (the stack thresholds at 0.5). Recorded frames are 160x120 (58 kB
    each as uint8; 16 drives x 100 steps = 92 MB).
    """

    nn_names: tuple[str, ...] = NN_NAMES
    title = "LaneKeep"
    rules = RULES
    perception_error = PerceptionError
    injector_salt = 0x1A9E

    def __init__(self, **params: Any):
        self.config = SimConfig.from_params(**params)
        self.params = params

    def _run(self, seeds: list[int], estimate: Estimate, max_steps: int | None = None) -> Batch:
        return run_batch(self.config, seeds, estimate, max_steps)

    def _camera(self, seeds: list[int], render_threads: int) -> FrameSource:
        return FrameSource(self.config, seeds, render_threads)


def run_episode(seed: int = 0, injectors: Mapping[str, Injector] | None = None, **params: Any) -> dict[str, float]:
    """One run's QoS (a convenience over :meth:`LaneKeepEvaluator.evaluate`)."""
    return LaneKeepEvaluator(**params).evaluate(dict(injectors or {}), [seed])[0]


class FrameSource(closed_loop.FrameSource):
    """Renders the camera frames of a batch's runs (one route and look per seed)."""

    def __init__(self, config: SimConfig, seeds: Sequence[int], threads: int = 1):
        from .render import Renderer, Scene, episode_style

        RULES.integer(threads, "render_threads", 1)
        super().__init__(len(seeds), config.camera.height_px, config.camera.width_px, threads)
        self.renderer = Renderer(config)
        self.scenes = [Scene.build(Route.from_seed(config.road, config.route_m, s), config) for s in seeds]
        self.styles = [episode_style(s) for s in seeds]

    def _draw(self, b: int, state: np.ndarray, step: int, out: np.ndarray) -> None:
        self.renderer.render(self.scenes[b], state, self.styles[b], frame=step, out=out)
