"""The application protocol: what an application offers qaopt, and what calibration injects into it.

An application (a simulator, a field harness) is a black box to qaopt. It offers:

- ``nn_names``: the names of its NNs, as the spec's ``nns`` names them;
- ``evaluate(injectors, seeds)``: closed-loop runs in which each NN's output is
  replaced by ``injector(truth, rng, t)``, the runs calibration makes
  (:class:`QoSEvaluator`, all that ``qaopt calibrate`` needs);
- ``evaluate_perception(nns, seeds, render_threads=1)``: closed-loop runs in which
  real NNs read the application's sensor inputs, the runs that validate an
  approximated configuration (:class:`Application`, what ``qaopt optimize`` needs);
- optionally ``record_perception(nns, seeds, steps)``: drives steered by real NNs
  in the loop, with every input they read and its true output kept in time order
  (:class:`Recorder`): the on-policy frames on which qaopt measures how each
  candidate NN errs, so that a candidate's error is the error the application will
  see, not the error on data collected some other way.

Both report raw QoS metrics, one mapping per seed; qaopt decides pass or fail
against the spec's goal. The contracts are structural (``typing.Protocol``): an
application never needs to import qaopt to satisfy them, though it may subclass
:class:`Application` to say so. ``qaopt.check_application`` checks an object
against them, and ``qaopt validate`` runs that check on a spec's simulator.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

QoSRecord = dict[str, float]
"""One run's raw QoS metrics: metric name -> real number (e.g. ``{"collisions_per_100m": 0.0, "distance_m": 100.0}``)."""

Perception = Callable[[np.ndarray], np.ndarray]
"""An NN in the loop: a batch of inputs ``(B, *input_shape[1:])`` -> a batch of outputs ``(B,)`` or ``(B, 1)``."""


@runtime_checkable
class Injector(Protocol):
    """Turns one NN's ground-truth output into the erroneous estimate the app sees.

    ``truth`` has shape ``(B,)`` (or ``(B, k)`` for a k-output NN): one entry per
    episode of a batch that runs in lock-step; ``B == 1`` for a single episode.
    ``t`` is the perception step (0, 1, 2, ...), so stateful models (AR(1), residual
    bootstrap) can keep their time structure. An injector is created fresh for each
    ``evaluate`` call and may keep state between its calls within it.
    """

    def __call__(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray: ...


@runtime_checkable
class QoSEvaluator(Protocol):
    """Runs the application closed-loop under injected NN errors and reports its raw QoS metrics.

    ``injectors`` maps NN names (as in the spec's ``nns``) to injectors; an NN
    left out runs with perfect perception. One episode is run per seed; the result
    for a given ``(injectors, seeds)`` must be deterministic so it can be cached.
    Returns a list with one :data:`QoSRecord` per seed, in the seeds' order.
    """

    nn_names: tuple[str, ...]

    def evaluate(self, injectors: Mapping[str, Injector], seeds: Sequence[int]) -> list[QoSRecord]: ...


@runtime_checkable
class Application(QoSEvaluator, Protocol):
    """A :class:`QoSEvaluator` that can also run with real NNs in the loop.

    ``evaluate_perception(nns, seeds, render_threads=1)`` runs one episode per seed in
    which each NN of ``nns`` (a :data:`Perception` callable) reads the inputs the
    application produces for it (camera frames, ...); NNs left out get perfect
    perception. It returns one :data:`QoSRecord` per seed, with the same metrics as
    ``evaluate`` and deterministic for given ``(nns, seeds)``.

    ``render_threads`` is how many threads the application may use to produce the
    NNs' inputs (rendering frames, decoding logs); qaopt passes the target's thread
    count. It must never change the results, only how fast they come; an application
    that has nothing to parallelise may leave it out of its signature (it was added after
    the first release: :func:`declared_options`).
    """

    def evaluate_perception(
        self, nns: Mapping[str, Perception], seeds: Sequence[int], render_threads: int = 1
    ) -> list[QoSRecord]: ...


@dataclass(frozen=True)
class Recording:
    """One NN's on-policy data: what it read on drives steered by the NNs in the loop, and the truth.

    ``inputs`` is ``(N, *input_shape[1:])``, a numpy array or an array-like indexed by
    int, slice or index array (so a recording of camera frames can stay in a compact
    form); ``truth`` is ``(N, outputs)``, the outputs a perfect NN would give on each
    input; ``sequences`` holds one index array per drive, in time order, so residuals
    keep the time structure the controller feels. Recordings of several NNs may share
    one ``inputs`` object (NNs that read the same camera).
    """

    inputs: Any
    truth: np.ndarray
    sequences: tuple[np.ndarray, ...]


@runtime_checkable
class Recorder(Protocol):
    """An application that can record on-policy drives (optional, beside :class:`Application`).

    ``record_perception(nns, seeds, steps)`` runs one drive per seed for at most
    ``steps`` perception steps, steered by ``nns`` (:data:`Perception` callables; NNs
    left out are perfect), and returns a :class:`Recording` for every NN of the
    application (left-out NNs too: their inputs were produced, only not read).
    Deterministic for given ``(nns, seeds, steps)``: qaopt caches the result.
    """

    def record_perception(self, nns: Mapping[str, Perception], seeds: Sequence[int], steps: int) -> Mapping[str, Recording]: ...


def declared_options(fn: Callable[..., Any], **options: Any) -> dict[str, Any]:
    """The ``options`` (optional protocol parameters) that ``fn`` declares, by name or through ``**kwargs``.

    The compatibility promise of the protocol: a parameter added to a method after an
    application was written has a default and is passed only to methods that declare it,
    so an application written against an earlier release keeps working unchanged. A
    callable without a signature (a builtin) gets them all.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return dict(options)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(options)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in options.items() if k in names}


def is_qos_value(v: object) -> bool:
    """A real number (numpy scalars included); bools and strings are not QoS values."""
    if isinstance(v, bool):
        return False
    return isinstance(v, (int, float)) or (hasattr(v, "dtype") and getattr(v, "shape", None) == ())


def records_problem(records: object, seeds: Sequence[int], metric: str | None = None) -> str | None:
    """What is wrong with an evaluation's result for ``seeds``; ``None`` when it has one metrics mapping per seed
    and, when ``metric`` is given, that metric is a finite real number in each."""
    if not isinstance(records, Sequence) or isinstance(records, (str, bytes)):
        return f"a {type(records).__name__} instead of a list with one dict of metrics per seed"
    if len(records) != len(seeds):
        return f"{len(records)} results for {len(seeds)} seeds"
    for seed, r in zip(seeds, records):
        if not isinstance(r, Mapping):
            return f"a {type(r).__name__} for seed {seed} instead of a dict of metrics ({r!r:.200})"
        v = r.get(metric) if metric is not None else 0.0
        if not is_qos_value(v) or not math.isfinite(float(v)):
            return f"no finite {metric!r} for seed {seed} (got {r!r:.200})"
    return None
