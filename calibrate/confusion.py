"""The error model of a detector or binary classifier: misses and false alarms that persist over frames.

An NN whose spec declares a class metric (``miss_rate`` / ``false_alarm_rate``,
:data:`qaopt.app_spec.nn_errors.CLASS_METRICS`) outputs a score the application
thresholds; what matters to the application is whether it says "present" when the
object is there, and for how many frames in a row it gets that wrong (a missed
obstacle tends to stay missed while it looks the same). :class:`Confusion` injects
exactly that: per episode of the batch, two two-state Markov chains,

- a *miss* chain that advances on the frames whose truth is positive (>= 0.5), and
- a *false-alarm* chain that advances on the frames whose truth is negative.

A chain in its error state stays there with probability ``1 - 1/L`` (``L``: the mean
burst length in frames of that class) and enters it with the probability that makes
its stationary share equal the target rate; the first frame draws from the
stationary distribution, and the state restarts at ``t == 0``. The injected output is
the truth as a label, 1.0 or 0.0, flipped where the chain is in its error state.

A point's setting ``{"metric": m}`` sets the declared kind's rate to ``m`` exactly in
expectation; the other kind's rate is ``ratio * m`` (capped at 1), ``ratio`` being the
model's false alarms per miss (for a ``miss_rate`` NN; misses per false alarm for a
``false_alarm_rate`` NN).

The spec's one ``calibration.error_model`` serves regression and class NNs alike
(:func:`confusion_model`): each error model declares the bursts its detector errors
come in (``detector_bursts``, :class:`qaopt.calibrate.error_models.ErrorModelType`):

- ``gaussian``: independent flips per frame (:data:`INDEPENDENT`), ApproxCaliper's
  memoryless errors;
- ``ar1``: persistent flips, bursts of :data:`DEFAULT_BURST_STEPS` frames;
- ``empirical``, ``shaped`` (no declared length): the ratio and both burst lengths
  fitted to the reference NN's confusion codes (:meth:`Confusion.fit`), with the
  defaults, and the reason, where the reference makes no error of a kind.

Without a fit the ratio is :data:`DEFAULT_RATIO`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from qaopt.app_spec.nn_errors import CLASS_METRICS, CODES, LABEL_THRESHOLD, class_codes
from qaopt.calibrate.errors import CalibrationError
from qaopt.calibrate.protocols import Injector

INDEPENDENT = 1.0
"""A mean burst length of one frame: every frame flips independently of the one before."""

DEFAULT_BURST_STEPS = 5.0
"""Mean burst length, in frames of the class, of the ``ar1`` model and of a fit that saw no error of a kind.

The same 5 frames as the regression ``AR1`` model's default correlation time, so one
spec-wide ``ar1`` means the same persistence for every NN of a mixed application: about
half a second at a 10 Hz perception rate, the time over which a scene (a sign at the
roadside, an obstacle ahead) looks much the same to a camera and a real detector's
verdict on it rarely changes. It is a guess, not a measurement: fit the reference NN
(``empirical``) where its on-policy drives hold errors."""

DEFAULT_RATIO = 1.0
"""The other kind's rate per unit of the declared kind's, without a fit: equal miss and false-alarm rates.

A detector whose threshold sits at its equal-error point errs as often both ways; with
no evidence about the NN, calibration favours neither direction, and a candidate that
loses accuracy loses it on both sides. A reference whose errors lean one way is
fitted instead (``empirical``/``shaped``)."""


def chain_probabilities(rate: float, burst_steps: float) -> tuple[float, float]:
    """``(start, stay)`` of a two-state chain whose stationary error share is ``rate`` and mean burst length ``L``.

    ``stay = 1 - 1/L``, ``start = rate / (L (1 - rate))``. The burst length used is
    ``max(burst_steps, 1 / (1 - rate))``: independent frames at that rate already make
    bursts that long (``stay == start == rate``), a chain less persistent than that
    would alternate, and this bound keeps ``start <= 1`` for every rate below 1. So
    ``burst_steps = 1`` gives independent flips at any rate.
    """
    rate = min(max(float(rate), 0.0), 1.0)
    if rate >= 1.0:
        return 1.0, 1.0
    length = max(float(burst_steps), 1.0 / (1.0 - rate))
    return rate / (length * (1.0 - rate)), 1.0 - 1.0 / length


class ConfusionInjector:
    """Flips 0/1 truths with a miss chain (positive frames) and a false-alarm chain (negative frames).

    State is elementwise over the truth's shape (``(B,)`` episodes, or ``(B, k)``) and
    restarts at ``t == 0`` in the chains' stationary distributions; each frame draws one
    uniform per element (only the chain of the frame's class advances), so the outputs
    are a function of the rng's stream.
    """

    def __init__(self, miss_rate: float, false_alarm_rate: float, miss_burst_steps: float,
                 false_alarm_burst_steps: float):
        self.miss_rate, self.false_alarm_rate = float(miss_rate), float(false_alarm_rate)
        self.miss_start, self.miss_stay = chain_probabilities(miss_rate, miss_burst_steps)
        self.fa_start, self.fa_stay = chain_probabilities(false_alarm_rate, false_alarm_burst_steps)
        self._miss: np.ndarray | None = None
        self._fa: np.ndarray | None = None

    def __call__(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        truth = np.asarray(truth, dtype=float)
        positive = truth >= LABEL_THRESHOLD
        if t == 0 or self._miss is None or self._miss.shape != truth.shape:
            self._miss = rng.random(truth.shape) < self.miss_rate
            self._fa = rng.random(truth.shape) < self.false_alarm_rate
        else:
            u = rng.random(truth.shape)
            miss = u < np.where(self._miss, self.miss_stay, self.miss_start)
            fa = u < np.where(self._fa, self.fa_stay, self.fa_start)
            self._miss = np.where(positive, miss, self._miss)
            self._fa = np.where(positive, self._fa, fa)
        said = np.where(positive, ~self._miss, self._fa)
        return said.astype(float)


@dataclass(frozen=True)
class BurstStatistics:
    """Errors of one kind in confusion-code sequences: how many, out of how many frames of the class, in how many bursts.

    Bursts are counted along the frames of the class alone (the frames the kind's chain
    advances on): a miss, a negative frame, then a miss again is one burst of two.
    """

    errors: int
    frames: int
    bursts: int

    @property
    def rate(self) -> float:
        return self.errors / self.frames if self.frames else 0.0

    @property
    def mean_burst(self) -> float:
        return self.errors / self.bursts if self.bursts else math.nan


def burst_statistics(codes: Sequence[np.ndarray], kind: str) -> BurstStatistics:
    """The :class:`BurstStatistics` of ``kind`` (``miss_rate`` / ``false_alarm_rate``) in time-ordered code sequences."""
    err, ok = class_codes(kind)
    errors = frames = bursts = 0
    for seq in codes:
        c = np.asarray(seq, dtype=float).ravel()
        flags = c[(c == err) | (c == ok)] == err
        errors += int(flags.sum())
        frames += int(flags.size)
        bursts += int(np.count_nonzero(flags[1:] & ~flags[:-1])) + int(flags[:1].sum())
    return BurstStatistics(errors, frames, bursts)


def _other(kind: str) -> str:
    return "false_alarm_rate" if kind == "miss_rate" else "miss_rate"


def _word(kind: str, plural: bool = False) -> str:
    word = "miss" if kind == "miss_rate" else "false alarm"
    return word + ("es" if word == "miss" else "s") if plural else word


@dataclass(frozen=True)
class Confusion:
    """A detector's errors: misses and false alarms in bursts (see the module's docstring).

    ``metric`` is the declared class metric, the one a point's ``{"metric": m}`` sets;
    ``ratio`` the other kind's rate per unit of it; ``miss_burst_steps`` and
    ``false_alarm_burst_steps`` the chains' mean burst lengths in frames of their class
    (``1``: independent frames). ``error_model`` is the spec's ``calibration.error_model``
    this model stands for, and ``note`` says why a fit used a default.
    """

    metric: str = "miss_rate"
    ratio: float = DEFAULT_RATIO
    miss_burst_steps: float = 1.0
    false_alarm_burst_steps: float = 1.0
    error_model: str = "gaussian"
    note: str = ""

    components = frozenset({"metric"})

    def __post_init__(self) -> None:
        if self.metric not in CLASS_METRICS:
            raise CalibrationError(f"the confusion error model injects a class metric ({', '.join(CLASS_METRICS)}), "
                                   f"not {self.metric!r}")
        if not (math.isfinite(self.ratio) and self.ratio >= 0):
            raise CalibrationError(f"confusion error model: ratio must be finite and >= 0, got {self.ratio}")
        for name in ("miss_burst_steps", "false_alarm_burst_steps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 1):
                raise CalibrationError(f"confusion error model: {name} must be >= 1 frame, got {value}")

    def rates(self, setting: Mapping[str, float]) -> tuple[float, float]:
        """``(miss_rate, false_alarm_rate)`` at a point's setting ``{"metric": m}``."""
        if set(setting) != {"metric"}:
            raise CalibrationError(
                f"calibration: an NN with the class metric {self.metric!r} is calibrated on its rate only; use "
                f"component 'metric' (got {', '.join(sorted(setting))})"
            )
        m = float(setting["metric"])
        if not 0.0 <= m <= 1.0:
            raise CalibrationError(f"calibration: a {self.metric} of {m:g} is not a rate in [0, 1]; set the axis' "
                                   "max to at most 1")
        other = min(1.0, self.ratio * m)
        return (m, other) if self.metric == "miss_rate" else (other, m)

    def injector(self, setting: Mapping[str, float]) -> Injector:
        miss, fa = self.rates(setting)
        return ConfusionInjector(miss, fa, self.miss_burst_steps, self.false_alarm_burst_steps)

    def config(self) -> dict:
        return {"model": "confusion", "error_model": self.error_model, "metric": self.metric, "ratio": self.ratio,
                "miss_burst_steps": self.miss_burst_steps,
                "false_alarm_burst_steps": self.false_alarm_burst_steps, "note": self.note}

    @classmethod
    def fit(cls, codes: Sequence[np.ndarray], metric: str = "miss_rate", error_model: str = "empirical",
            fit_bursts: bool = True, burst_steps: float = DEFAULT_BURST_STEPS) -> Confusion:
        """The model of a real detector's time-ordered confusion-code sequences (one per drive).

        The ratio is the codes' other rate over their declared rate, and (``fit_bursts``)
        each chain's burst length the mean length of that kind's bursts. A kind with no
        error at all in the codes cannot be measured: a declared kind without errors
        leaves the ratio at :data:`DEFAULT_RATIO` and its burst length at ``burst_steps``,
        the other kind without errors gets ratio 0 (the reference makes none) and
        ``burst_steps``; :attr:`note` says which.
        """
        seqs = [np.asarray(c, dtype=float).ravel() for c in codes]
        if not seqs or not sum(c.size for c in seqs):
            raise CalibrationError("residuals: no confusion code to fit the confusion error model to")
        if not all(np.isin(c, CODES).all() for c in seqs):
            raise CalibrationError("residuals: a class metric's per-frame errors are confusion codes (0 true negative, "
                                   "1 true positive, 2 miss, 3 false alarm), but these hold other values; measure the "
                                   "NN with qaopt.app_spec.nn_errors.frame_errors")
        declared, other = burst_statistics(seqs, metric), burst_statistics(seqs, _other(metric))
        notes, lengths = [], {}
        if declared.errors:
            ratio = other.rate / declared.rate
        else:
            ratio = DEFAULT_RATIO
            notes.append(f"the reference NN makes no {_word(metric)} on its {declared.frames} frames of that class, so "
                         f"the ratio of {_word(_other(metric), True)} to {_word(metric, True)} cannot be measured: using "
                         f"{DEFAULT_RATIO:g}")
        for stats, kind in ((declared, metric), (other, _other(metric))):
            if not fit_bursts:
                lengths[kind] = burst_steps
            elif stats.errors:
                lengths[kind] = max(1.0, stats.mean_burst)
            else:
                lengths[kind] = burst_steps
                notes.append(f"no {_word(kind)} to measure its bursts on: {burst_steps:g} frames")
        return cls(metric=metric, ratio=float(ratio), miss_burst_steps=float(lengths["miss_rate"]),
                   false_alarm_burst_steps=float(lengths["false_alarm_rate"]), error_model=error_model,
                   note="; ".join(notes))


def confusion_model(name: str, metric: str, burst_steps: float | None,
                    codes: Sequence[np.ndarray] | None = None) -> Confusion:
    """The :class:`Confusion` model the spec's ``calibration.error_model`` ``name`` means for a class NN.

    ``burst_steps`` is the model's declared burst length (``detector_bursts``): both
    chains keep it, and the ratio is the reference's when given its ``codes``
    (:data:`DEFAULT_RATIO` otherwise). ``None``: ratio and burst lengths are fitted to
    ``codes``, which are then needed.
    """
    if burst_steps is not None:
        if codes is None:
            return Confusion(metric=metric, miss_burst_steps=burst_steps, false_alarm_burst_steps=burst_steps,
                             error_model=name)
        return Confusion.fit(codes, metric, name, fit_bursts=False, burst_steps=burst_steps)
    if codes is None:
        raise CalibrationError(
            f"calibration.error_model: '{name}' needs the NN's confusion codes measured on its error data "
            "(the reference NN's on-policy drives or validation split) to fit its bursts to"
        )
    return Confusion.fit(codes, metric, name)
