"""On-policy error data: each NN's error measured on the frames the application sees when its NNs drive it.

A candidate's point in the error space is its error on some frames. On frames
collected some other way (drives steered by an artificial noise process, a
labelled photo set), the robot is elsewhere than it will be under its own NNs:
measured on CropFollow, a pruned heading NN's L1 was 3.25 deg on such drives and
1.77 deg in the loop, and an int8 NN ranked the other way round. So by default the
frames are *on-policy*: drives steered by the spec's reference NNs in the
simulator's own loop (:class:`qaopt.calibrate.Recorder`), recorded once per
simulator, NNs and drive plan, cached, and shared by the reference and every
candidate. Each NN keeps its own training data; only its validation split (the
frames its error and residual sequences are measured on) is replaced, in time
order, so the error models see the residual *sequences* a controller feels.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.app_spec import AppSpec, load_entry_point, store
from qaopt.app_spec.errors import QaoptError
from qaopt.app_spec.hashing import content_hash
from qaopt.calibrate import Recorder, Recording
from qaopt.calibrate.app_calls import ApplicationFault, call_application
from qaopt.executor import machine_cores
from qaopt.spec_adapter import limits_of, make_evaluator, simulator_key

ON_POLICY_SEED_BASE = 7_000_000
"""Drive seeds are disjoint from calibration's, validation's (5,000,000 + ...) and those of simulators' own
datasets (CropFollow's validation drives use 1,000,000 + ...)."""
ON_POLICY, DATASET, AUTO = "on-policy", "dataset", "auto"
RECORDING_VERSION = 1
"""Bump when what a recording holds changes, so that stale recordings are made again."""
_SOURCE_FIELD = "calibration.error_data.source"


@dataclass
class OnPolicyData:
    """An NN's data with its validation split replaced by an on-policy :class:`~qaopt.calibrate.Recording`.

    Satisfies :class:`qaopt.approx.NNData`: training frames are the NN's own; ``x_val``,
    ``y_val`` and ``val_sequences`` are the recording's.
    """

    base: Any
    recording: Recording
    key: str
    """Content hash of what determined the recording (simulator, reference NNs, drive plan)."""

    @property
    def x_train(self) -> Any:
        return self.base.x_train

    @property
    def y_train(self) -> np.ndarray:
        return self.base.y_train

    @property
    def x_val(self) -> Any:
        return self.recording.inputs

    @property
    def y_val(self) -> np.ndarray:
        return self.recording.truth

    @property
    def val_sequences(self) -> list[np.ndarray]:
        return list(self.recording.sequences)

    @property
    def fingerprint(self) -> str | None:
        """The base data's fingerprint with the recording's key (``None``: the base has none, hash the arrays)."""
        base = getattr(self.base, "fingerprint", None)
        return content_hash(base, self.key) if isinstance(base, str) else None


def error_data_source(spec: AppSpec) -> str:
    """``on-policy`` or ``dataset``: the spec's ``calibration.error_data.source`` with ``auto`` resolved.

    ``auto`` looks at the simulator's entry point without building it (a class whose
    instances record drives); building a simulator can cost seconds, and commands
    that only measure NNs on their data should not need one that works.
    """
    source = spec.calibration.error_data.source
    if source != AUTO:
        return source
    sim = spec.evaluator.simulator
    if sim is None or sim.entry_point is None:
        return DATASET
    return ON_POLICY if callable(getattr(load_entry_point(sim.entry_point), "record_perception", None)) else DATASET


def _recorder(spec: AppSpec) -> Recorder:
    """The spec's simulator, which must record drives since its error data are on-policy."""
    if spec.evaluator.simulator is None:
        raise QaoptError(f"{spec.source}: {_SOURCE_FIELD} is on-policy, but the spec has no evaluator.simulator to "
                         "record drives in; set it to 'dataset'")
    evaluator = make_evaluator(spec)
    if not isinstance(evaluator, Recorder):
        raise QaoptError(
            f"{spec.source}: {_SOURCE_FIELD} is on-policy, but the simulator {type(evaluator).__name__} cannot record "
            "drives (it has no record_perception method; see docs/extending.md). Set it to 'dataset' to measure each "
            "NN's error on its data's validation split, or add record_perception to the simulator.")
    return evaluator


def drive_seeds(spec: AppSpec) -> list[int]:
    """The seeds of the on-policy drives (disjoint from every other run's; see :data:`ON_POLICY_SEED_BASE`)."""
    return [ON_POLICY_SEED_BASE + i for i in range(spec.calibration.error_data.drives)]


def record(spec: AppSpec, evaluator: Recorder, nns: Mapping[str, Any], simulator: str, cache_dir: Path,
           fingerprints: Mapping[str, str]) -> tuple[dict[str, Recording], str]:
    """The on-policy recordings of every NN and their key: read from the cache, or recorded and cached.

    ``nns`` are the reference NNs as :data:`~qaopt.calibrate.Perception` callables;
    ``fingerprints`` identify them (their weights and data), ``simulator`` the simulator.
    """
    plan = spec.calibration.error_data
    key = content_hash(RECORDING_VERSION, simulator, dict(sorted(fingerprints.items())), drive_seeds(spec), plan.steps)
    return recorded(spec, evaluator, nns, drive_seeds(spec), plan.steps, cache_dir / "on_policy" / f"{key}.pkl",
                    "on-policy drives with the reference NNs"), key


def recorded(spec: AppSpec, evaluator: Recorder, nns: Mapping[str, Any], seeds: Sequence[int], steps: int,
             path: Path, what: str) -> dict[str, Recording]:
    """Drives of ``steps`` steps on ``seeds``, ``nns`` steering: read from ``path``, or recorded, checked and kept
    there (on-policy drives and stress strata alike). ``what`` names the drives in an application fault."""
    if path.exists():
        try:
            with open(path, "rb") as f:
                return _unpacked(pickle.load(f))
        except Exception as exc:  # noqa: BLE001 - a damaged pickle raises anything from EOFError to KeyError
            store.set_aside(path, f"it does not load: {type(exc).__name__}")
    # Nothing else runs meanwhile: the drives' frames of a step render on every core (a simulator that declares
    # render_threads; the frames are the same on any number)
    outcome = call_application(evaluator, "record_perception", nns, seeds, limits_of(spec), extra=(steps,),
                               render_threads=machine_cores())
    if outcome.failure is not None:
        raise ApplicationFault.raised(outcome.failure, what)
    recordings = dict(outcome.result)
    _check(spec, recordings, nns)
    path.parent.mkdir(parents=True, exist_ok=True)
    with store.atomic_path(path) as tmp, open(tmp, "wb") as f:
        pickle.dump(_packed(recordings), f, protocol=pickle.HIGHEST_PROTOCOL)  # shared inputs are stored once
    return recordings


@dataclass(frozen=True)
class _EightBit:
    """Float frames that are 8-bit pixels, stored as those bytes: a quarter of float32's, restored bit for bit."""

    pixels: np.ndarray
    dtype: str
    scaled: bool
    """Whether the frames are the pixels divided by 255 (else the pixels themselves, as floats)."""

    def frames(self) -> np.ndarray:
        x = self.pixels.astype(self.dtype)
        return x / x.dtype.type(255) if self.scaled else x

    @classmethod
    def of(cls, x: Any) -> _EightBit | None:
        """``x`` as 8-bit pixels where it is a float array that they give back exactly (a camera's frames, ``/ 255``
        or not), else ``None``."""
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f" or not x.size:
            return None
        for scaled in (True, False):
            level = np.rint(x * 255 if scaled else x)
            if level.min() < 0 or level.max() > 255:
                continue
            packed = cls(level.astype(np.uint8), x.dtype.str, scaled)
            if np.array_equal(packed.frames(), x):
                return packed
        return None


def _packed(recordings: Mapping[str, Recording]) -> dict[str, Recording]:
    """``recordings`` with float frames of 8-bit pixels as :class:`_EightBit`: an application that hands its NNs
    float32 frames made from a camera's bytes stored four times their size. Recordings that share one ``inputs``
    share its packed form."""
    packed: dict[int, Any] = {}
    out = {}
    for name, rec in recordings.items():
        key = id(rec.inputs)
        if key not in packed:
            packed[key] = _EightBit.of(rec.inputs) or rec.inputs
        out[name] = Recording(packed[key], rec.truth, rec.sequences)
    return out


def _unpacked(recordings: Mapping[str, Recording]) -> dict[str, Recording]:
    frames: dict[int, Any] = {}
    out = {}
    for name, rec in recordings.items():
        key = id(rec.inputs)
        if key not in frames:
            frames[key] = rec.inputs.frames() if isinstance(rec.inputs, _EightBit) else rec.inputs
        out[name] = Recording(frames[key], rec.truth, rec.sequences)
    return out


def _check(spec: AppSpec, recordings: Mapping[str, Recording], nns: Sequence[str]) -> None:
    """A recording for every NN, with truth rows for every input and sequences inside them."""
    for name in nns:
        rec = recordings.get(name)
        where = f"{spec.source}: the simulator's record_perception, NN {name!r}"
        if not isinstance(rec, Recording):
            raise QaoptError(f"{where}: returned {type(rec).__name__} instead of a Recording")
        truth = np.asarray(rec.truth)
        if truth.ndim != 2 or len(truth) != len(rec.inputs):
            raise QaoptError(f"{where}: truth has shape {truth.shape} for {len(rec.inputs)} inputs; "
                             "it must be (inputs, outputs)")
        if not np.isfinite(truth).all():
            raise QaoptError(f"{where}: the truth holds NaN or infinite values")
        for i, seq in enumerate(rec.sequences):
            seq = np.asarray(seq)
            if seq.size < 2 or seq.min() < 0 or seq.max() >= len(truth):
                raise QaoptError(f"{where}: sequences[{i}] must index at least two of the {len(truth)} inputs")


def target_nns(spec: AppSpec, cache_dir: Path, names: Sequence[str] | None = None) -> dict[str, Any]:
    """The spec's NNs as :class:`qaopt.approx.TargetNN`, their errors measured where ``calibration.error_data`` says.

    On-policy, all the spec's reference NNs drive the recording (each NN's error then
    reflects the others' too, as in the loop); ``names`` picks which to return.
    """
    from qaopt.approx import TargetNN  # heavy (torch): only when NNs are built
    from qaopt.approx.quantize import predict_torch

    names = list(spec.nns) if names is None else list(names)
    if error_data_source(spec) == DATASET:
        return {n: TargetNN.from_spec(n, spec.nns[n]) for n in names}
    evaluator = _recorder(spec)
    steering = {n: TargetNN.from_spec(n, nn) for n, nn in spec.nns.items() if n in evaluator.nn_names}
    recordings, key = record(spec, evaluator, {n: partial(predict_torch, t.model) for n, t in steering.items()},
                             simulator_key(spec, evaluator), cache_dir, {n: t.fingerprint for n, t in steering.items()})
    out = {}
    for n in names:
        t = steering.get(n) or TargetNN.from_spec(n, spec.nns[n])
        if n not in recordings:
            raise QaoptError(f"{spec.source}: nns.{n}: the simulator's record_perception returned no recording for "
                             f"this NN (it recorded {', '.join(recordings)}); set {_SOURCE_FIELD} to 'dataset'")
        out[n] = TargetNN(n, t.model, OnPolicyData(t.data, recordings[n], key), t.input_shape, t.metric,
                          t.architecture)
    return out


def reference_residuals(spec: AppSpec, nn: str, cache_dir: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The spec's reference NN's residual sequences and the true values beside them, where its error is measured
    (``calibration.error_data``: on-policy drives or its validation data; built and cached by approx)."""
    from qaopt.approx import Knobs, build  # heavy (torch): only for the fitted models

    target = target_nns(spec, cache_dir, [nn])[nn]
    truth = np.asarray(target.data.y_val)[:, target.metric.column]
    return list(build(target, Knobs(), cache_dir=cache_dir).residuals), [truth[np.asarray(s)] for s in
                                                                           target.data.val_sequences]
