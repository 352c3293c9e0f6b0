"""The NN being approximated: a trained torch module, its data and its error metric.

:func:`qaopt.approx.build` needs only these pieces, not the whole application spec,
so a team can approximate an NN from a notebook as easily as from a spec
(:meth:`TargetNN.from_spec` reads one ``nns.<name>`` entry).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from qaopt.app_spec.entrypoints import load_entry_point
from qaopt.app_spec.errors import QaoptError
from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.nn_errors import MetricKind, error_metric, frame_errors, is_class_metric

from .errors import EntryPointFailed

if TYPE_CHECKING:
    from qaopt.app_spec.schema import NNSpec

@runtime_checkable
class NNData(Protocol):
    """Training data and time-ordered validation drives of one NN (float32).

    ``x_*`` has shape ``(N, *input_shape[1:])``: a numpy array or any array-like
    with ``shape``, ``len`` and indexing by int, slice or index array (so that a
    memory-mapped image set is never loaded whole); ``y_*`` is a numpy array of
    shape ``(N, outputs)``. ``val_sequences`` holds index arrays into the validation
    set, one per drive in time order, so residuals keep their time structure for
    the empirical injector. An optional ``fingerprint`` string attribute, a content
    hash of all the data (or of the recipe that generates it), saves hashing the
    images, and keeps a candidate's key the same on machines whose floating point
    differs in the last bit. The ``x_*`` array-likes may carry a ``frames_key`` (any
    comparable value, ``None`` for unknown): two with equal keys hold the same frames,
    so work on them is shared between NNs that read one camera (:func:`same_frames`).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    val_sequences: Sequence[np.ndarray]


def same_frames(a: object, b: object) -> bool:
    """Whether the array-likes ``a`` and ``b`` hold the same frames: the same object, or equal ``frames_key``s
    (:class:`NNData`), which name the frames without reading them."""
    if a is b:
        return True
    key = getattr(a, "frames_key", None)
    return key is not None and key == getattr(b, "frames_key", None)


@dataclass(frozen=True)
class ErrorMetric:
    """How the NN's error is measured: ``kind`` over output column ``column`` (see :mod:`qaopt.app_spec.nn_errors`).

    ``threshold`` is a detector's decision threshold on the output (class metrics ``miss_rate`` /
    ``false_alarm_rate`` only; truths are 0/1 labels): its per-frame errors are then confusion codes and its
    metric a rate. Regression metrics ignore it.
    """

    kind: MetricKind = "l1"
    column: int = 0
    threshold: float = 0.5

    def __call__(self, pred: np.ndarray, truth: np.ndarray) -> float:
        return error_metric(self.kind, frame_errors(self.kind, pred, truth, self.column, self.threshold))

    def residuals(self, pred: np.ndarray, truth: np.ndarray, sequences: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        """Per-frame errors of the metric's output, one float32 array per drive: signed errors (prediction - truth)
        for a regression metric, confusion codes (:func:`qaopt.app_spec.nn_errors.confusion_codes`) for a class one."""
        diff = frame_errors(self.kind, pred, truth, self.column, self.threshold).astype(np.float32)
        return tuple(diff[np.asarray(s)] for s in sequences)

    @property
    def key(self) -> tuple:
        """What identifies the measurement in cache keys (the threshold only where it counts, so that regression
        NNs keep the keys they had before class metrics existed)."""
        return (self.kind, self.column, self.threshold) if is_class_metric(self.kind) else (self.kind, self.column)


def _array_digest(h: hashlib._Hash, array, chunk: int = 256) -> None:
    """Hash an array, or an array-like in chunks of ``chunk`` rows (an image set may not fit in memory)."""
    if isinstance(array, np.ndarray):
        h.update(f"{array.shape}{array.dtype}".encode())
        h.update(memoryview(np.ascontiguousarray(array)).cast("B"))
        return
    h.update(f"{tuple(array.shape)}float32".encode())
    for start in range(0, len(array), chunk):
        block = np.ascontiguousarray(array[start : start + chunk], dtype=np.float32)
        h.update(memoryview(block).cast("B"))


@dataclass
class TargetNN:
    """A trained NN with its data: everything a candidate is built from.

    ``model`` is never modified (candidates prune a copy). ``input_shape`` includes
    the batch dimension (``[1, 3, 240, 320]``); it is the shape pruning traces with
    and MACs are counted for. ``architecture`` names the code that builds the model
    (:meth:`from_spec` uses the entry point and its arguments); without it the
    model's class and ``repr`` stand in, which change between torch versions.
    """

    name: str
    model: nn.Module
    data: NNData
    input_shape: tuple[int, ...]
    metric: ErrorMetric = ErrorMetric()
    architecture: str | None = None
    _fingerprint: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(d) for d in self.input_shape)
        self.model.eval()
        self._check_data()

    @classmethod
    def from_spec(cls, name: str, spec: NNSpec) -> TargetNN:
        """Load the model (and its ``weights`` file, if given) and the data an ``nns.<name>`` entry names."""
        model = _called(name, "model", spec.model, spec.args)
        if not isinstance(model, nn.Module):
            raise QaoptError(f"nns.{name}.model: {spec.model} returned {type(model).__name__}, not a torch.nn.Module")
        if spec.weights is not None:
            try:
                model.load_state_dict(torch.load(spec.weights, map_location="cpu", weights_only=True))
            except (RuntimeError, OSError) as exc:
                raise QaoptError(f"nns.{name}.weights: {spec.weights} does not fit {spec.model}: {exc}") from exc
        data = _called(name, "data", spec.data.source, spec.data.args)
        column = [o.name for o in spec.outputs].index(spec.error_metric.output)
        architecture = content_hash(spec.model, spec.args)
        return cls(name, model, data, tuple(spec.input_shape), ErrorMetric(spec.error_metric.kind, column, spec.error_metric.threshold),
                   architecture)

    @property
    def example_input(self) -> torch.Tensor:
        return torch.zeros(self.input_shape)

    @property
    def fingerprint(self) -> str:
        """Content hash of the base weights, the architecture, the data and the metric.

        Computed once per object: hashing a large training set takes a second or two.
        """
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update((self.architecture or f"{type(self.model).__module__}.{type(self.model).__qualname__}\n{self.model}").encode())
            for key, tensor in self.model.state_dict().items():
                h.update(key.encode())
                _array_digest(h, tensor.detach().cpu().float().numpy())
            d = self.data
            data_key = getattr(d, "fingerprint", None)
            if isinstance(data_key, str):
                h.update(data_key.encode())
            else:
                for array in (d.x_train, d.x_val, d.y_train, d.y_val, *d.val_sequences):
                    _array_digest(h, array if hasattr(array, "shape") else np.asarray(array))
            self._fingerprint = content_hash(h.hexdigest(), self.input_shape, *self.metric.key)
        return self._fingerprint

    def more_validation(self, spec: NNSpec) -> NNData | None:
        """The validation split ``nns.<name>.data.more_validation`` names (the data source called with those args
        merged into its own), checked as this NN's data is; ``None`` when the entry names none."""
        data_spec = spec.data
        if data_spec.more_validation is None:
            return None
        data = _called(self.name, "data.more_validation", data_spec.source,
                       {**data_spec.args, **data_spec.more_validation})
        _check_data(data, self.input_shape, self.metric.column, f"NN {self.name!r}, data.more_validation", ("val",))
        return data

    def _check_data(self) -> None:
        _check_data(self.data, self.input_shape, self.metric.column, f"NN {self.name!r}, data")


def _check_data(d: NNData, input_shape: tuple[int, ...], column: int, where: str,
                splits: Sequence[str] = ("train", "val")) -> None:
    """Shapes of ``d``'s ``splits`` against the NN's input and outputs, and its drives' indices."""
    for split in splits:
        x, y = getattr(d, f"x_{split}"), np.asarray(getattr(d, f"y_{split}"))
        if tuple(x.shape[1:]) != input_shape[1:]:
            raise QaoptError(f"{where}: x_{split} has samples of shape {tuple(x.shape[1:])}, input_shape says {input_shape[1:]}")
        if y.ndim != 2 or len(y) != len(x):
            raise QaoptError(f"{where}: y_{split} must have shape ({len(x)}, outputs), got {y.shape}")
        if y.shape[1] <= column:
            raise QaoptError(f"{where}: y_{split} has {y.shape[1]} outputs, the error metric reads output {column}")
    n_val = len(d.x_val)
    for i, seq in enumerate(d.val_sequences):
        seq = np.asarray(seq)
        if seq.size and (seq.min() < 0 or seq.max() >= n_val):
            raise QaoptError(f"{where}: val_sequences[{i}] indexes outside the {n_val} validation samples")


def _called(nn_name: str, field: str, entry_point: str, args: dict) -> object:
    """``entry_point(**args)`` of ``nns.<nn_name>.<field>``; what the user's code raises is :class:`EntryPointFailed`."""
    factory = load_entry_point(entry_point)
    try:
        return factory(**args)
    except QaoptError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: named with its NN and entry point
        raise EntryPointFailed(nn_name, field, entry_point, exc) from exc
