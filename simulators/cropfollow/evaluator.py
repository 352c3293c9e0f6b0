"""Closed-loop CropFollow runs and their QoS: the evaluator calibration calls.

A batch of episodes (one per seed) runs in lock-step: at every perception step the
two NNs' estimates for all unfinished episodes are produced at once, either as
ground truth plus an injected error (``evaluate``, no rendering: the hot path of
calibration) or by perception NNs reading rendered frames (``evaluate_perception``,
the check of real approximated NNs), and one compiled kernel call advances them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qaopt.calibrate.protocols import Perception

from . import dynamics as dyn
from . import estimator as state_estimation
from .config import NN_NAMES, RULES, EstimatorParams, SimConfig
from .control import build_control
from .errors import CropFollowParamError, PerceptionError
from .field import N_CURVATURE_MODES, Field
from .. import closed_loop
from .render import Renderer, Scene, episode_style

Estimate = Callable[[int, "Batch"], Sequence[np.ndarray]]
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

    @property
    def runs_truth(self) -> np.ndarray:
        return self.truth

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


DISTURBANCE_SALT = 0xD157
"""Mixed with the seed list into the disturbance's random generator."""
RAW_PERCEPTION = EstimatorParams()
"""No state estimator: the controller steers from the NNs' raw estimates."""


def ar1_step(error: np.ndarray, correlation: float, innovation: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Advance AR(1) errors one perception step, in place: ``correlation * error + innovation * N(0, 1)``, where
    ``innovation`` is the stationary spread times sqrt(1 - correlation^2). The dataset's wandering validation
    drives and a disturbance both steer by it."""
    error[:] = correlation * error + innovation * rng.standard_normal(error.shape)
    return error


def _disturbance(config: SimConfig, seeds: Sequence[int]) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(heading, distance) -> (heading, distance)`` as the controller reads them: with ``config.disturbance``'s
    AR(1) errors added (one stream per seed list, as the injectors'), or unchanged when it is off."""
    d = config.disturbance
    if not d.active:
        return lambda heading, distance: (heading, distance)
    rng = np.random.default_rng(np.random.SeedSequence([DISTURBANCE_SALT, *seeds]))
    innovation = np.array([[d.heading_deg], [d.distance_ratio]]) * np.sqrt(1 - d.correlation**2)
    error = np.zeros((2, len(seeds)))

    def disturbed(heading: np.ndarray, distance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ar1_step(error, d.correlation, innovation, rng)
        return heading + error[0], distance + error[1]

    return disturbed


def run_batch(config: SimConfig, seeds: Sequence[int], estimate: Estimate, max_steps: int | None = None,
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
    disturb = _disturbance(config, seeds)
    for step in range(config.max_steps if max_steps is None else max_steps):
        heading, distance = disturb(*estimate(step, batch))
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


class CropFollowEvaluator(closed_loop.LockstepEvaluator):
    """The CropFollow application; it keeps the application protocol, :class:`qaopt.calibrate.protocols.Application`.

    A perception NN (:data:`~qaopt.calibrate.protocols.Perception`) takes float32 images
    (B, 3, H, W) in [0, 1] and returns estimates (B,) or (B, 1), as torch or numpy.

    ``CropFollowEvaluator(run_length_m=100.0, controller="mpc", field={...}, robot={...},
    camera={...}, controller_params={...}, estimator="none", estimator_params={...})``; see
    :class:`.config.SimConfig` and :class:`.config.EstimatorParams` (``estimator="ekf"`` puts
    an EKF with wheel odometry and a gyro between the NNs and the controller). Each seed is
    one episode: its field, start pose and process noise come from the seed alone; the
    injectors' random generator comes from the whole seed list. Results are deterministic
    for given (injectors, seeds). Recorded frames are 320x240 (0.23 MB each as uint8).
    """

    nn_names: tuple[str, ...] = NN_NAMES
    title = "CropFollow"
    rules = RULES
    perception_error = PerceptionError
    injector_salt = 0x1A7EC7

    def __init__(self, **params: Any):
        sim = dict(params)
        self.estimator = EstimatorParams.from_params(sim.pop("estimator", "none"), sim.pop("estimator_params", None))
        self.config = SimConfig.from_params(**sim)
        self.params = params

    def _run(self, seeds: list[int], estimate: Estimate, max_steps: int | None = None) -> Batch:
        return run_batch(self.config, seeds, estimate, max_steps, self.estimator)

    def _camera(self, seeds: list[int], render_threads: int) -> FrameSource:
        return FrameSource(self.config, seeds, render_threads)


class FrameSource(closed_loop.FrameSource):
    """Renders the camera frames of a batch of episodes (one scene and look per seed)."""

    def __init__(self, config: SimConfig, seeds: Sequence[int], threads: int = 1):
        RULES.integer(threads, "render_threads", 1)
        super().__init__(len(seeds), config.camera.height_px, config.camera.width_px, threads)
        self.renderer = Renderer(config.camera, config.field)
        self.scenes = [Scene.build(Field.from_seed(config.field, s), config.run_length_m + 1.0) for s in seeds]
        self.styles = [episode_style(s) for s in seeds]

    def _draw(self, b: int, state: np.ndarray, step: int, out: np.ndarray) -> None:
        self.renderer.render(self.scenes[b], state[dyn.S], state[dyn.EY], state[dyn.EPSI], self.styles[b], frame=step, out=out)


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
