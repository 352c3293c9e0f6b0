"""What both example applications' evaluators share: NN outputs for episodes that run in lock-step.

An application runs a batch of episodes (one per seed) through its compiled kernel
and asks, at every perception step, ``estimate(step, batch)`` for its NNs' outputs,
shape ``(len(nn_names), B)``. How those outputs are made is the same for every
application (ground truth plus an injected error; perception NNs reading the
rendered frames of the unfinished episodes; the same, keeping every frame for
on-policy recordings), so it lives here once. The application supplies its batch,
its kernel loop (:meth:`LockstepEvaluator._run`) and its renderer
(:class:`FrameSource`).

A batch offers ``state`` (one row per episode, what the renderer reads), ``active``
((B,) bool: which runs are unfinished) and ``runs_truth`` ((len(nn_names), B): what
perfect NNs would output now).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from qaopt.calibrate.protocols import Application, Injector, Perception, Recording

from .errors import AppPerceptionError
from .frames import FrameArray, to_chw_float
from .params import ParamRules

Estimate = Callable[[int, Any], np.ndarray]
"""``(step, batch) -> (len(nn_names), B)`` outputs of the NNs for the batch's B runs (rows follow ``nn_names``)."""


class FrameSource(ABC):
    """Renders the camera frames of a batch's runs; an application's subclass draws one frame (:meth:`_draw`)."""

    def __init__(self, n: int, height: int, width: int, threads: int = 1):
        self._pool = ThreadPoolExecutor(int(threads)) if threads > 1 else None
        self._buffer = np.empty((n, height, width, 3), dtype=np.uint8)

    @abstractmethod
    def _draw(self, b: int, state: np.ndarray, step: int, out: np.ndarray) -> None:
        """Draw run ``b`` (its state row ``state``) at perception step ``step`` into ``out``."""

    def frames_uint8(self, batch: Any, which: np.ndarray, step: int) -> np.ndarray:
        """uint8 (len(which), H, W, 3) frames of runs ``which`` now (a reused buffer: copy to keep)."""
        def draw(k: int) -> None:
            self._draw(which[k], batch.state[which[k]], step, self._buffer[k])

        if self._pool is None:
            for k in range(len(which)):
                draw(k)
        else:
            list(self._pool.map(draw, range(len(which))))
        return self._buffer[: len(which)]

    def frames(self, batch: Any, which: np.ndarray, step: int) -> np.ndarray:
        """Float32 (len(which), 3, H, W) in [0, 1]: what the NNs of those runs see now."""
        return to_chw_float(self.frames_uint8(batch, which, step))


class LockstepEvaluator(Application):
    """The application protocol's three runs, for an application whose episodes run in lock-step.

    A subclass sets the class attributes below and ``self.config`` (with ``camera.height_px``
    / ``width_px``) and ``self.params``, and implements :meth:`_run` and :meth:`_camera`.
    """

    nn_names: tuple[str, ...]
    title: str
    """The application's name in messages (``"not an NN of <title>"``)."""
    rules: ParamRules
    perception_error: type[AppPerceptionError]
    injector_salt: int
    """Mixed with the seed list into the injectors' random generators (one stream per NN)."""

    @abstractmethod
    def _run(self, seeds: list[int], estimate: Estimate, max_steps: int | None = None) -> Any:
        """Run one episode per seed with the NNs' outputs from ``estimate``; return the final batch."""

    @abstractmethod
    def _camera(self, seeds: list[int], render_threads: int) -> FrameSource:
        """The renderer of these runs' frames, drawing on ``render_threads`` threads."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"

    def _check_names(self, names: Sequence[str], what: str) -> None:
        for name in names:
            if name not in self.nn_names:
                raise self.perception_error(name, f"not an NN of {self.title}; {what} takes {', '.join(self.nn_names)}")

    def _as_estimate(self, value: Any, nn: str, n: int) -> np.ndarray:
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().numpy()
        out = np.asarray(value, dtype=np.float64)
        if out.shape != (n,):
            if out.size == n and out.ndim == 2:
                return out.reshape(n)
            raise self.perception_error(nn, f"returned shape {out.shape}; expected ({n},), one estimate per episode")
        return out

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[dict[str, float]]:
        """Error-injection runs: each NN outputs ``injector(truth, rng, step)``; NNs left out are perfect."""
        self._check_names(list(injectors), "evaluate")
        seeds = self.rules.seeds(seeds)
        n = len(seeds)
        plan = []
        for i, name in enumerate(self.nn_names):
            rng = np.random.default_rng(np.random.SeedSequence([self.injector_salt, *seeds], spawn_key=(i,)))
            plan.append((i, name, injectors.get(name), rng))
        out = np.empty((len(self.nn_names), n))

        def estimate(step: int, batch: Any) -> np.ndarray:
            for i, name, injector, rng in plan:
                truth = batch.runs_truth[i]
                out[i] = truth if injector is None else self._as_estimate(injector(truth.copy(), rng, step), name, n)
            return out

        return self._run(seeds, estimate).records(self.config)

    def evaluate_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int], render_threads: int = 1) -> list[dict[str, float]]:
        """Perception-in-the-loop runs: each NN in ``nns`` reads the rendered camera frames.

        All unfinished episodes' frames of a step go to each NN as one batch; NNs left
        out are perfect. Each episode keeps one randomised look drawn from its seed.
        ``render_threads`` > 1 renders a step's frames in parallel (the renderer
        releases the GIL); it never changes the results.
        """
        self._check_names(list(nns), "evaluate_perception")
        seeds = self.rules.seeds(seeds)
        camera = self._camera(seeds, render_threads)
        perceive = self._perceive(nns, len(seeds))

        def estimate(step: int, batch: Any) -> np.ndarray:
            active = np.flatnonzero(batch.active)
            images = camera.frames(batch, active, step) if active.size and any(nn is not None for nn in nns.values()) else None
            return perceive(batch, active, images)

        return self._run(seeds, estimate).records(self.config)

    def record_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int], steps: int = 100,
                          render_threads: int = 1) -> dict[str, Recording]:
        """On-policy drives: ``nns`` steer (NNs left out are perfect) and every frame is kept with its truth.

        One drive per seed of at most ``steps`` perception steps (fewer if it ends);
        the frames are those ``evaluate_perception`` would render for the same seeds,
        so a candidate measured on them errs as it will in the loop. The NNs read the
        same camera, so their recordings share one uint8
        :class:`~qaopt.simulators.frames.FrameArray`.
        """
        self._check_names(list(nns), "record_perception")
        seeds = self.rules.seeds(seeds)
        self.rules.integer(steps, "steps", 2, " (a drive needs consecutive frames)")
        camera = self._camera(seeds, render_threads)
        cam, n = self.config.camera, len(seeds)
        frames = np.empty((n, steps, cam.height_px, cam.width_px, 3), dtype=np.uint8)
        truth = np.empty((n, steps, len(self.nn_names)))
        kept = np.zeros(n, dtype=int)
        perceive = self._perceive(nns, n)

        def estimate(step: int, batch: Any) -> np.ndarray:
            active = np.flatnonzero(batch.active)
            frames[active, step] = camera.frames_uint8(batch, active, step)
            truth[active, step] = batch.runs_truth[:, active].T
            kept[active] += 1
            return perceive(batch, active, to_chw_float(frames[active, step]))

        self._run(seeds, estimate, max_steps=steps)
        # Runs stay active until they end, so each drive's frames are its first kept[d] steps.
        keep = np.arange(steps)[None, :] < kept[:, None]
        images = FrameArray([frames[keep]])
        starts = np.concatenate([[0], np.cumsum(kept)])
        sequences = tuple(np.arange(a, b) for a, b in zip(starts[:-1], starts[1:]))
        labels = truth[keep].astype(np.float32)
        return {name: Recording(images, labels[:, i : i + 1], sequences) for i, name in enumerate(self.nn_names)}

    def _perceive(self, nns: Mapping[str, Perception], n: int) -> Callable[[Any, np.ndarray, np.ndarray | None], np.ndarray]:
        """``(batch, active, images) -> outputs``: the NNs' estimates for the ``active`` runs, truth elsewhere."""
        plan = [(i, name, nns.get(name)) for i, name in enumerate(self.nn_names)]
        out = np.empty((len(self.nn_names), n))

        def perceive(batch: Any, active: np.ndarray, images: np.ndarray | None) -> np.ndarray:
            out[:] = batch.runs_truth
            if images is not None:
                for i, name, nn in plan:
                    if nn is not None:
                        out[i, active] = self._as_estimate(nn(images), name, active.size)
            return out

        return perceive
