"""A built candidate NN: what runs, on which backends, and what it costs in error and size."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import nn

from qaopt.app_spec.hashing import content_hash

from .knobs import Knobs
from .passes import OnnxToolchain
from .quantize import predict_onnx, predict_torch

BYTES_HASH_KIND = "approx.candidate.bytes"
"""The first part of every :attr:`Candidate.bytes_hash`, so it never equals a hash of anything else."""


@dataclass(frozen=True, eq=False)
class Candidate:
    """One approximated NN, as the search and the kernels see it.

    ``module`` is the pruned, fine-tuned torch module in the knobs' float dtype
    (fp32 for int8: the module the int8 graph was quantized from, for backends
    that import torch). ``onnx_path`` is the int8 QDQ ONNX file when the dtype is
    int8, else ``None``; ``onnx`` is the toolchain that opens it. ``runnable_on``
    names the backends (as in the spec's ``target.backend``) with kernels for this
    candidate. ``error`` is the NN's error metric (``metric``, in the output's unit)
    on its validation data, and ``residuals`` are the signed errors along each
    validation drive, in time order. MACs and parameters are counted on the pruned
    model: reported beside latency, never in its place. ``key`` is the content hash
    the candidate is cached under: of what it is built from, so two builds of one key
    (GPU fine-tuning is not bitwise reproducible) share it; :attr:`bytes_hash` tells them apart.

    A candidate carries its own input: ``input_shape`` (batch included) is what its module
    takes, which a knob may change (a lower input resolution), so measuring and exporting
    read it here, never from the spec. ``serves`` names the spec's NNs whose outputs it
    computes: the NN itself, or several when one module replaces them (a shared backbone);
    a frame runs such a module once for all of them. Such a candidate's module outputs every
    served NN's columns; ``columns`` are this NN's (``None``: all of them), and :meth:`predict`
    returns only those.
    """

    nn: str
    knobs: Knobs
    key: str
    module: nn.Module
    onnx_path: Path | None
    runnable_on: tuple[str, ...]
    metric: str
    error: float
    residuals: tuple[np.ndarray, ...]
    macs: int
    params: int
    build_seconds: float
    from_cache: bool
    input_shape: tuple[int, ...] = ()
    serves: tuple[str, ...] = ()
    onnx: OnnxToolchain | None = None
    columns: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.serves:
            object.__setattr__(self, "serves", (self.nn,))

    @property
    def dtype(self) -> str:
        return self.knobs.dtype

    def example(self) -> np.ndarray:
        """A zero input of the candidate's own shape: what it is compiled and timed on."""
        return np.zeros(self.input_shape, dtype=np.float32)

    @property
    def nonfinite_outputs(self) -> str | None:
        """``"NaN"`` or ``"inf"`` when the candidate's outputs on its validation data hold such values, else ``None``.

        A fine-tuning that diverged or a dtype that overflows makes them; the error metric of
        such outputs is NaN or infinite and places the candidate nowhere in an error space.
        """
        values = np.concatenate([np.ravel(r) for r in self.residuals] + [np.array([self.error], dtype=np.float64)])
        if np.isnan(values).any():
            return "NaN"
        if np.isinf(values).any():
            return "inf"
        return None

    @cached_property
    def bytes_hash(self) -> str:
        """The content hash of what runs: the module's tensors (name, dtype, shape, bytes) and the ONNX graph's file.

        A run records it with each measured configuration, so a later stage (or a run resumed on another
        machine, with another cache) can tell whether it holds the NN the search measured or a rebuild of
        its key. Tensors are hashed rather than the pickled file, whose bytes vary with torch's version.
        """
        parts: list[object] = [BYTES_HASH_KIND]
        for name, tensor in self.module.state_dict().items():
            t = tensor.detach().cpu().contiguous()
            parts += [name, str(t.dtype), list(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes()]
        if self.onnx_path is not None:
            parts.append(Path(self.onnx_path).read_bytes())
        return content_hash(*parts)

    @cached_property
    def _session(self):
        if self.onnx is None:
            raise RuntimeError(f"candidate {self.key} of NN {self.nn!r} runs as ONNX but was loaded without an ONNX toolchain")
        return self.onnx.ort_session(self.onnx_path)

    def outputs(self, x: np.ndarray) -> np.ndarray:
        """The module's whole output for a batch of inputs (every member's columns of a merged NN), computed in its
        own dtype."""
        return predict_onnx(self._session, x) if self.onnx_path is not None else predict_torch(self.module, x)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The candidate's outputs (this NN's columns) for a batch of inputs, computed in its own dtype."""
        out = self.outputs(x)
        return out if self.columns is None else out[:, list(self.columns)]
