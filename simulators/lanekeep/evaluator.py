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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from qaopt.calibrate.protocols import Application, Injector, Perception, Recording

from . import dynamics as dyn
from .config import NN_NAMES, RULES, SimConfig
from .errors import PerceptionError
from ..frames import FrameArray, to_chw_float
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


def _as_estimate(value: Any, nn: str, n: int) -> np.ndarray:
    out = np.asarray(value, dtype=np.float64)
    if out.shape != (n,):
        if out.size == n and out.ndim == 2:
            return out.reshape(n)
        raise PerceptionError(nn, f"returned shape {out.shape}; expected ({n},), one estimate per episode")
    return out


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


class LaneKeepEvaluator(Application):
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
    """

    nn_names: tuple[str, ...] = NN_NAMES

    def __init__(self, **params: Any):
        self.config = SimConfig.from_params(**params)
        self.params = params

    def __repr__(self) -> str:
        return f"LaneKeepEvaluator({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"

    def _check_names(self, names: Sequence[str], what: str) -> None:
        for name in names:
            if name not in self.nn_names:
                raise PerceptionError(name, f"not an NN of LaneKeep; {what} takes {', '.join(self.nn_names)}")

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[dict[str, float]]:
        """Error-injection runs: each NN outputs ``injector(truth, rng, step)``; NNs left out are perfect.

        The ``stop`` injector receives 0/1 truth and returns 0/1 decisions or
        probabilities (the stack thresholds at 0.5).
        """
        self._check_names(list(injectors), "evaluate")
        seeds = RULES.seeds(seeds)
        n = len(seeds)
        plan = []
        for i, name in enumerate(self.nn_names):
            rng = np.random.default_rng(np.random.SeedSequence([0x1A9E, *seeds], spawn_key=(i,)))
            plan.append((i, name, injectors.get(name), rng))
        out = np.empty((3, n))

        def estimate(step: int, batch: Batch) -> np.ndarray:
            for i, name, injector, rng in plan:
                truth = batch.truth[i, :n]
                out[i] = truth if injector is None else _as_estimate(injector(truth.copy(), rng, step), name, n)
            return out

        return run_batch(self.config, seeds, estimate).records(self.config)

    def evaluate_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int], render_threads: int = 1) -> list[dict[str, float]]:
        """Perception-in-the-loop runs: each NN in ``nns`` reads the rendered camera frames.

        All unfinished episodes' frames of a step go to each NN as one batch; NNs left
        out are perfect. ``render_threads`` > 1 renders a step's frames in parallel
        (the renderer releases the GIL); it never changes the results.
        """
        self._check_names(list(nns), "evaluate_perception")
        seeds = RULES.seeds(seeds)
        camera = FrameSource(self.config, seeds, render_threads)
        plan = [(i, nns.get(name), name) for i, name in enumerate(self.nn_names)]
        n = len(seeds)
        out = np.empty((3, n))

        def estimate(step: int, batch: Batch) -> np.ndarray:
            out[:] = batch.truth[:, :n]
            active = np.flatnonzero(batch.active)
            if active.size == 0 or all(nn is None for _, nn, _ in plan):
                return out
            images = camera.frames(batch, active, step)
            for i, nn, name in plan:
                if nn is not None:
                    out[i, active] = _as_estimate(_to_numpy(nn(images)), name, active.size)
            return out

        return run_batch(self.config, seeds, estimate).records(self.config)

    def record_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int], steps: int = 100,
                          render_threads: int = 1) -> dict[str, Recording]:
        """On-policy drives: ``nns`` drive (NNs left out are perfect) and every frame is kept with its truth.

        One drive per seed of at most ``steps`` perception steps; the frames are those
        ``evaluate_perception`` would render for the same seeds. The three NNs read the
        same camera, so their recordings share one uint8 :class:`~qaopt.simulators.frames.FrameArray`
        (160x120 frames: 58 kB each; 16 drives x 100 steps = 92 MB).
        """
        self._check_names(list(nns), "record_perception")
        seeds = RULES.seeds(seeds)
        RULES.integer(steps, "steps", 2, " (a drive needs consecutive frames)")
        camera = FrameSource(self.config, seeds, render_threads)
        cam = self.config.camera
        n = len(seeds)
        frames = np.empty((n, steps, cam.height_px, cam.width_px, 3), dtype=np.uint8)
        truth = np.empty((n, steps, 3))
        kept = np.zeros(n, dtype=int)
        plan = [(i, nns.get(name), name) for i, name in enumerate(self.nn_names)]
        out = np.empty((3, n))

        def estimate(step: int, batch: Batch) -> np.ndarray:
            out[:] = batch.truth[:, :n]
            active = np.flatnonzero(batch.active)
            frames[active, step] = camera.frames_uint8(batch, active, step)
            truth[active, step] = batch.truth[:, active].T
            kept[active] += 1
            images = to_chw_float(frames[active, step])
            for i, nn, name in plan:
                if nn is not None:
                    out[i, active] = _as_estimate(_to_numpy(nn(images)), name, active.size)
            return out

        run_batch(self.config, seeds, estimate, max_steps=steps)
        keep = np.arange(steps)[None, :] < kept[:, None]
        images = FrameArray([frames[keep]])
        starts = np.concatenate([[0], np.cumsum(kept)])
        sequences = tuple(np.arange(a, b) for a, b in zip(starts[:-1], starts[1:]))
        labels = truth[keep].astype(np.float32)
        return {name: Recording(images, labels[:, i : i + 1], sequences) for i, name in enumerate(self.nn_names)}


def run_episode(seed: int = 0, injectors: Mapping[str, Injector] | None = None, **params: Any) -> dict[str, float]:
    """One run's QoS (a convenience over :meth:`LaneKeepEvaluator.evaluate`)."""
    return LaneKeepEvaluator(**params).evaluate(dict(injectors or {}), [seed])[0]


class FrameSource:
    """Renders the camera frames of a batch's runs (one route and look per seed)."""

    def __init__(self, config: SimConfig, seeds: Sequence[int], threads: int = 1):
        from .render import Renderer, Scene, episode_style

        RULES.integer(threads, "render_threads", 1)
        self.config = config
        self._pool = ThreadPoolExecutor(int(threads)) if threads > 1 else None
        self.renderer = Renderer(config)
        self.scenes = [Scene.build(Route.from_seed(config.road, config.route_m, s), config) for s in seeds]
        self.styles = [episode_style(s) for s in seeds]
        cam = config.camera
        self._buffer = np.empty((len(seeds), cam.height_px, cam.width_px, 3), dtype=np.uint8)

    def frames_uint8(self, batch: Batch, which: np.ndarray, step: int) -> np.ndarray:
        """uint8 (len(which), H, W, 3) frames of runs ``which`` now (a reused buffer: copy to keep)."""
        def draw(k: int) -> None:
            b = which[k]
            self.renderer.render(self.scenes[b], batch.state[b], self.styles[b], frame=step, out=self._buffer[k])

        if self._pool is None:
            for k in range(len(which)):
                draw(k)
        else:
            list(self._pool.map(draw, range(len(which))))
        return self._buffer[: len(which)]

    def frames(self, batch: Batch, which: np.ndarray, step: int) -> np.ndarray:
        """Float32 (len(which), 3, H, W) in [0, 1]: what the NNs of those runs see now."""
        return to_chw_float(self.frames_uint8(batch, which, step))
