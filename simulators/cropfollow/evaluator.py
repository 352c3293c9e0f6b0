"""Closed-loop CropFollow runs and their QoS: the evaluator calibration calls.

A batch of episodes (one per seed) runs in lock-step: at every perception step the
two NNs' estimates for all unfinished episodes are produced at once, either as
ground truth plus an injected error (``evaluate``, no rendering: the hot path of
calibration) or by perception NNs reading rendered frames (``evaluate_perception``,
the check of real approximated NNs), and one compiled kernel call advances them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from qaopt.calibrate.protocols import Application, Injector, Perception, Recording

from . import dynamics as dyn
from . import estimator as state_estimation
from .config import NN_NAMES, RULES, EstimatorParams, SimConfig
from .control import build_control
from .errors import CropFollowParamError, PerceptionError
from .field import N_CURVATURE_MODES, Field
from ..frames import FrameArray, to_chw_float
from .render import Renderer, Scene, episode_style

Estimator = Callable[[int, "Batch"], tuple[np.ndarray, np.ndarray]]
"""``(step, batch) -> (heading_deg, distance_ratio)`` estimates, each shape (B,)."""


def physics(config: SimConfig) -> dyn.Physics:
    r, f = config.robot, config.field
    return dyn.Physics(
        dt=config.perception_period_s / config.physics_substeps,
        substeps=config.physics_substeps,
        cruise_speed=r.cruise_speed_mps,
        max_turn_rate=r.max_turn_rate_radps,
        row_spacing=f.row_spacing_m,
        half_width=r.body_width_m / 2,
        half_length=r.body_length_m / 2,
        row_clearance=f.row_spacing_m / 2 - f.stalk_radius_m,
        slip_std=r.speed_slip_std,
        turn_noise_std=r.turn_noise_std_radps,
        run_length=config.run_length_m,
    )


@dataclass
class Batch:
    """Episodes running in lock-step: their fields, state and current ground truth."""

    seeds: list[int]
    fields: list[Field]
    state: np.ndarray
    """(B, dynamics.N_STATE) float64; columns named in :mod:`.dynamics`."""
    curvature: np.ndarray
    """(B, 3, modes): amplitude, angular frequency, phase of each field's curvature."""
    keys: np.ndarray
    """(B,) uint64 process-noise stream of each episode."""
    truth: np.ndarray
    """(2, B): heading (deg) and distance ratio the NNs should output now (rows follow ``NN_NAMES``)."""
    ekf: np.ndarray | None = None
    """(B, estimator.N_ESTIMATOR) state of each episode's EKF (``estimator="ekf"``), else None."""

    @classmethod
    def start(cls, config: SimConfig, seeds: Sequence[int]) -> Batch:
        seeds = RULES.seeds(seeds)
        n = len(seeds)
        fields = [Field.from_seed(config.field, s) for s in seeds]
        curvature = np.empty((n, 3, N_CURVATURE_MODES))
        state = np.zeros((n, dyn.N_STATE))
        keys = np.empty(n, dtype=np.uint64)
        for i, (seed, f) in enumerate(zip(seeds, fields)):
            curvature[i] = f.curvature.amp, f.curvature.freq, f.curvature.phase
            seq = np.random.SeedSequence([seed, 0x5EED])
            keys[i] = seq.generate_state(1, np.uint64)[0]
            u = np.random.default_rng(seq).uniform(-1, 1, 2)
            state[i, dyn.EY] = u[0] * config.initial_lateral_m
            state[i, dyn.EPSI] = np.radians(u[1] * config.initial_heading_deg)
        truth = np.empty((2, n))
        dyn.observe(state, physics(config), truth)
        return cls(list(seeds), fields, state, curvature, keys, truth)

    @property
    def active(self) -> np.ndarray:
        return self.state[:, dyn.DONE] == 0.0

    def records(self, config: SimConfig) -> list[dict[str, float]]:
        out = []
        for row in self.state:
            distance = float(min(row[dyn.S], config.run_length_m))
            collisions = int(row[dyn.COLLISIONS])
            out.append(
                {
                    "distance_m": distance,
                    "collisions": collisions,
                    "interventions": int(row[dyn.INTERVENTIONS]),
                    "collisions_per_100m": 100.0 * collisions / distance if distance > 0 else (float("inf") if collisions else 0.0),
                }
            )
        return out


RAW_PERCEPTION = EstimatorParams()
"""No state estimator: the controller steers from the NNs' raw estimates."""


def run_batch(config: SimConfig, seeds: Sequence[int], estimate: Estimator, max_steps: int | None = None,
              estimator: EstimatorParams = RAW_PERCEPTION) -> Batch:
    """Run one episode per seed to ``run_length_m`` (or the time limit); return the final batch.

    ``estimator`` says what turns the NNs' estimates into the controller's: nothing
    (``none``) or the EKF of :mod:`.estimator` (``ekf``).
    """
    batch = Batch.start(config, seeds)
    phys, ctrl = physics(config), build_control(config)
    if estimator.kind == "ekf":
        filt = state_estimation.build_filter(estimator, config)
        batch.ekf = state_estimation.start(batch.keys, filt)
    for step in range(config.max_steps if max_steps is None else max_steps):
        heading, distance = estimate(step, batch)
        if batch.ekf is None:
            active = dyn.closed_loop_step(heading, distance, batch.state, batch.curvature, batch.keys, step, phys, ctrl, batch.truth)
        else:
            active = state_estimation.closed_loop_step(heading, distance, batch.state, batch.curvature, batch.keys, step,
                                                       phys, ctrl, batch.truth, batch.ekf, filt)
        if active < 0:
            nn = "heading" if active == dyn.BAD_HEADING else "distance"
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


class CropFollowEvaluator(Application):
    """The CropFollow application; it keeps the application protocol, :class:`qaopt.calibrate.protocols.Application`.

    A perception NN (:data:`~qaopt.calibrate.protocols.Perception`) takes float32 images
    (B, 3, H, W) in [0, 1] and returns estimates (B,) or (B, 1), as torch or numpy.

    ``CropFollowEvaluator(run_length_m=100.0, controller="mpc", field={...}, robot={...},
    camera={...}, controller_params={...}, estimator="none", estimator_params={...})``; see
    :class:`.config.SimConfig` and :class:`.config.EstimatorParams` (``estimator="ekf"`` puts
    an EKF with wheel odometry and a gyro between the NNs and the controller). Each seed is
    one episode: its field, start pose and process noise come from the seed alone; the
    injectors' random generator comes from the whole seed list. Results are deterministic
    for given (injectors, seeds).
    """

    nn_names: tuple[str, ...] = NN_NAMES

    def __init__(self, **params: Any):
        sim = dict(params)
        self.estimator = EstimatorParams.from_params(sim.pop("estimator", "none"), sim.pop("estimator_params", None))
        self.config = SimConfig.from_params(**sim)
        self.params = params

    def __repr__(self) -> str:
        return f"CropFollowEvaluator({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"

    def _check_names(self, names: Sequence[str], what: str) -> None:
        for name in names:
            if name not in self.nn_names:
                raise PerceptionError(name, f"not an NN of CropFollow; {what} takes {', '.join(self.nn_names)}")

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[dict[str, float]]:
        """Error-injection runs: each NN outputs ``injector(truth, rng, step)``; NNs left out are perfect."""
        self._check_names(list(injectors), "evaluate")
        seeds = RULES.seeds(seeds)
        n = len(seeds)
        plan = []
        for i, name in enumerate(self.nn_names):
            rng = np.random.default_rng(np.random.SeedSequence([0x1A7EC7, *seeds], spawn_key=(i,)))
            plan.append((name, injectors.get(name), rng))

        def estimate(step: int, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
            out = []
            for truth, (name, injector, rng) in zip(batch.truth, plan):
                out.append(truth if injector is None else _as_estimate(injector(truth, rng, step), name, n))
            return out[0], out[1]

        return run_batch(self.config, seeds, estimate, estimator=self.estimator).records(self.config)

    def evaluate_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int], render_threads: int = 1) -> list[dict[str, float]]:
        """Perception-in-the-loop runs: each NN in ``nns`` reads the rendered camera frames.

        All unfinished episodes' frames of a step go to each NN as one batch; NNs left out
        are perfect. Each episode keeps one randomised look (light, colours) drawn from its seed.
        ``render_threads`` > 1 renders a step's frames in parallel (the renderer releases the GIL).
        """
        self._check_names(list(nns), "evaluate_perception")
        seeds = RULES.seeds(seeds)
        camera = FrameSource(self.config, seeds, render_threads)
        plan = [(name, nns.get(name)) for name in self.nn_names]

        def estimate(step: int, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
            active = np.flatnonzero(batch.active)
            images = camera.frames(batch, active, step) if any(nn is not None for _, nn in plan) else None
            out = []
            for truth, (name, nn) in zip(batch.truth, plan):
                if nn is None:
                    out.append(truth)
                    continue
                est = truth.copy()
                est[active] = _as_estimate(_to_numpy(nn(images)), name, active.size)
                out.append(est)
            return out[0], out[1]

        return run_batch(self.config, seeds, estimate, estimator=self.estimator).records(self.config)


    def record_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int], steps: int,
                          render_threads: int = 1) -> dict[str, Recording]:
        """On-policy drives: ``nns`` steer (NNs left out are perfect) and every frame is kept with its truth.

        One drive per seed of at most ``steps`` perception steps (fewer if it reaches
        the end of the row); the frames are those ``evaluate_perception`` would render
        for the same seeds, so a candidate measured on them errs as it will in the loop.
        Both NNs read the same camera, so their recordings share one uint8
        :class:`~qaopt.simulators.frames.FrameArray` (320x240 frames: 0.23 MB each).
        """
        self._check_names(list(nns), "record_perception")
        seeds = RULES.seeds(seeds)
        RULES.integer(steps, "steps", 2, " (a drive needs consecutive frames)")
        camera = FrameSource(self.config, seeds, render_threads)
        cam = self.config.camera
        frames = np.empty((len(seeds), steps, cam.height_px, cam.width_px, 3), dtype=np.uint8)
        truth = np.empty((len(seeds), steps, len(self.nn_names)))
        kept = np.zeros(len(seeds), dtype=int)
        plan = [(name, nns.get(name)) for name in self.nn_names]

        def estimate(step: int, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
            active = np.flatnonzero(batch.active)
            frames[active, step] = camera.frames_uint8(batch, active, step)
            truth[active, step] = batch.truth[:, active].T
            kept[active] += 1
            images = to_chw_float(frames[active, step])
            out = []
            for row, (name, nn) in zip(batch.truth, plan):
                est = row.copy()
                if nn is not None:
                    est[active] = _as_estimate(_to_numpy(nn(images)), name, active.size)
                out.append(est)
            return out[0], out[1]

        run_batch(self.config, seeds, estimate, max_steps=steps, estimator=self.estimator)
        # Episodes stay active until they end, so each drive's frames are its first kept[d] steps.
        keep = np.arange(steps)[None, :] < kept[:, None]
        images = FrameArray([frames[keep]])
        starts = np.concatenate([[0], np.cumsum(kept)])
        sequences = tuple(np.arange(a, b) for a, b in zip(starts[:-1], starts[1:]))
        labels = truth[keep].astype(np.float32)
        return {name: Recording(images, labels[:, i : i + 1], sequences) for i, name in enumerate(self.nn_names)}


class FrameSource:
    """Renders the camera frames of a batch of episodes (one scene and look per seed)."""

    def __init__(self, config: SimConfig, seeds: Sequence[int], threads: int = 1):
        RULES.integer(threads, "render_threads", 1)
        self.config = config
        self._pool = ThreadPoolExecutor(int(threads)) if threads > 1 else None
        self.renderer = Renderer(config.camera, config.field)
        self.scenes = [Scene.build(Field.from_seed(config.field, s), config.run_length_m + 1.0) for s in seeds]
        self.styles = [episode_style(s) for s in seeds]
        cam = config.camera
        self._buffer = np.empty((len(seeds), cam.height_px, cam.width_px, 3), dtype=np.uint8)

    def frames_uint8(self, batch: Batch, which: np.ndarray, step: int) -> np.ndarray:
        """uint8 (len(which), H, W, 3) frames of episodes ``which`` now (a reused buffer: copy to keep)."""
        def draw(k: int) -> None:
            b, st = which[k], batch.state[which[k]]
            self.renderer.render(self.scenes[b], st[dyn.S], st[dyn.EY], st[dyn.EPSI], self.styles[b], frame=step, out=self._buffer[k])

        if self._pool is None:
            for k in range(len(which)):
                draw(k)
        else:
            list(self._pool.map(draw, range(len(which))))
        return self._buffer[: len(which)]

    def frames(self, batch: Batch, which: np.ndarray, step: int) -> np.ndarray:
        """Float32 (len(which), 3, H, W) in [0, 1]: what the NNs of those episodes see now."""
        return to_chw_float(self.frames_uint8(batch, which, step))


def _to_numpy(value: Any) -> Any:
    if hasattr(value, "detach"):  # a torch tensor
        return value.detach().cpu().numpy()
    return value


def run_episode(
    seed: int,
    injectors: Mapping[str, Callable[..., np.ndarray]] | None = None,
    nns: Mapping[str, Perception] | None = None,
    **params: Any,
) -> dict[str, float]:
    """QoS record of one episode: errors injected (``injectors``) or NNs in the loop (``nns``)."""
    evaluator = CropFollowEvaluator(**params)
    if nns is not None:
        if injectors:
            raise CropFollowParamError("injectors", "give either injectors or nns, not both")
        return evaluator.evaluate_perception(nns, [seed])[0]
    return evaluator.evaluate(injectors or {}, [seed])[0]
