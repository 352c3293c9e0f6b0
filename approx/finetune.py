"""Fine-tuning by distillation: the pruned student learns the unpruned teacher's outputs and the labels.

The teacher's outputs carry what it learned beyond the labels (and are free of
label noise), so the student recovers faster than from labels alone; the labels
keep it from copying the teacher's mistakes. Budgets are in optimizer steps so a
candidate's cost is known before it is built; the defaults fit a CPU.

On a GPU, training runs with deterministic kernels (:func:`reproducible`): a candidate's cache key
names what it is built from, and a run resumed on another machine of the same kind (or with a fresh
cache) rebuilds it; only bytes equal to the searched ones keep the search's measurements and the
closed-loop verdicts, which are cached for the bytes that ran.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .cache import Store
from .quantize import predict_torch
from .target import TargetNN

CUBLAS_WORKSPACE_CONFIG = ":4096:8"
"""cuBLAS is deterministic only with a fixed workspace, read when a process first uses it: set (unless the
environment sets it) when this module is imported, before any training, so a run's first cuBLAS call sees it."""
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)

REPORT_EVERY_S = 120.0
"""How often a long phase says how far it is: a merged NN's 3000 steps take 7 minutes on a 2-core CPU with bf16
instructions and about 18 on one without (docs/BENCHMARKS.md), too long to pass in silence."""

Report = Callable[[int, int, float], None]
"""``report(done, steps, seconds)``: a phase has run ``done`` of its ``steps`` in ``seconds``."""


@contextlib.contextmanager
def reproducible(device: torch.device) -> Iterator[None]:
    """Deterministic kernels while computing on a GPU what NNs are trained from or with (nothing changes on a CPU,
    whose kernels already are): cuDNN's deterministic algorithms, no autotuned choice, torch's deterministic
    implementations where it has them, and TF32 at torch's defaults (on for convolutions, off for matrix products),
    so that what the process set before (a run's timing, a user's ``set_float32_matmul_precision``) does not move a
    build. An operation without a deterministic implementation (AdaptiveAvgPool2d's CUDA backward) runs as it is,
    without torch's warning; whether a whole build then comes out the same bytes is what
    ``tests/test_gpu_target.py`` checks on a GPU. The settings are put back after."""
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.use_deterministic_algorithms(True, warn_only=True)
    cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32 = True, False, True
    torch.set_float32_matmul_precision("highest")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation")
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32 = before[2:5]
        torch.set_float32_matmul_precision(before[5])


@dataclass(frozen=True)
class FinetuneRecipe:
    """How fine-tuning runs (part of every candidate's cache key).

    ``distill_weight`` weighs the teacher term against the label term; the loss is
    Huber with ``delta = huber_scale * std(labels)``, near L1 (the usual error
    metric) for large errors and smooth near zero so Adam settles.

    ``precision`` ``bf16`` trains in mixed precision: the forward pass's convolutions and
    matrix products in bf16 under torch's autocast, the weights, gradients, optimizer and loss
    in fp32. On a CPU with bf16 instructions a step of CropFollow's compact NN takes less than
    half the time, and a merged NN distilled so errs as in fp32 (:func:`native_bf16`; docs/pruning.md).
    """

    batch_size: int = 16
    lr: float = 5e-4
    weight_decay: float = 0.0
    distill_weight: float = 0.5
    huber_scale: float = 0.1
    precision: Literal["fp32", "bf16"] = "fp32"

    def as_dict(self) -> dict:
        """What keys every NN trained with this recipe: its hyperparameters, not its arithmetic. Like the device
        that trains (qaopt's ``training`` section), the precision is left out, so a ladder built in fp32 on a GPU
        serves a run on a CPU that would train in bf16, and an NN trained before the recipe had a precision keeps
        its key; what differs between two such builds is their bytes, which a run's measurements and verdicts
        are kept for."""
        fields = asdict(self)
        del fields["precision"]
        return fields


def native_bf16(device: str) -> bool:
    """Whether ``device`` computes bf16 in hardware: a GPU that supports it, or a CPU with AVX-512 BF16 or AMX
    instructions. Elsewhere torch emulates bf16, slower than fp32."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's, absent from older torch
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def tuned(recipe: FinetuneRecipe, knobs) -> FinetuneRecipe:
    """``recipe`` with the knobs' learning rate and batch size where they set one (the recipe a candidate is built with).

    It lives with the recipe, not with the fine-tuning pass that declares those knobs: the
    ladder and the builder need it, and the pass registry must not be imported from there.
    """
    return replace(recipe, lr=knobs.finetune_lr or recipe.lr, batch_size=knobs.finetune_batch_size or recipe.batch_size)


class Distiller:
    """Fine-tunes one student in phases, one per pruning step.

    Each phase gets a fresh optimizer (parameters change shape when pruned) and its
    own cosine learning-rate cycle: a pruning step damages the NN as much late in
    the run as early, so every phase needs the full learning rate to recover.
    The batch stream continues across phases.
    """

    def __init__(
        self,
        x: np.ndarray,
        labels: np.ndarray,
        teacher: Callable[[], np.ndarray],
        recipe: FinetuneRecipe,
        seed: int,
        device: str = "cpu",
    ):
        self.x, self.recipe, self.device = x, recipe, torch.device(device)
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.float32))
        self._teacher_outputs = teacher
        self.delta = max(float(self.labels.std()) * recipe.huber_scale, 1e-6)
        # Outputs in different units (a merged NN's heads: degrees beside a ratio) are each put on the scale of
        # their own spread, so that no output's unit decides what the student learns.
        self.column_scale = (self.labels.std(dim=0).clamp_min(1e-6) if self.labels.shape[1] > 1 else None)
        self.rng = np.random.default_rng(seed)

    @cached_property
    def teacher(self) -> torch.Tensor:
        """The teacher's outputs on the training data, computed on first use (a budget of 0 steps never needs them)."""
        return torch.from_numpy(np.asarray(self._teacher_outputs(), dtype=np.float32))

    def batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx = np.sort(self.rng.choice(len(self.x), size=min(self.recipe.batch_size, len(self.x)), replace=False))
        return torch.from_numpy(np.asarray(self.x[idx], dtype=np.float32)), self.labels[idx], self.teacher[idx]

    def loss(self, student: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        device = next(student.parameters()).device
        x, labels, teacher = (t.to(device) for t in batch)
        if x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.recipe.precision == "bf16"):
            out = student(x).float()
        w, delta = self.recipe.distill_weight, self.delta
        if self.column_scale is not None:
            scale = self.column_scale.to(device)
            out, teacher, labels, delta = out / scale, teacher / scale, labels / scale, self.recipe.huber_scale
        return w * F.huber_loss(out, teacher, delta=delta) + (1 - w) * F.huber_loss(out, labels, delta=delta)

    def run(self, student: nn.Module, steps: int, report: Report | None = None) -> None:
        """Train ``student`` for one phase of ``steps`` optimizer steps (on the device; it ends on the CPU);
        ``report``, if given, hears how far it is every :data:`REPORT_EVERY_S` seconds.

        The phase trains in the channels-last layout, the same arithmetic in another memory order: a step of
        CropFollow's compact NN at batch 16 was 1.04-1.24x faster on a 2-core x86 CPU
        (``benchmarks/finetune_layout.py``, docs/BENCHMARKS.md); LaneKeep's reference training gained 4x from it.
        The student leaves in the default layout, which pruning, export and the backends expect.
        """
        if steps <= 0:
            return
        r = self.recipe
        student.to(self.device, memory_format=torch.channels_last)
        opt = torch.optim.AdamW(student.parameters(), lr=r.lr, weight_decay=r.weight_decay)
        student.train()
        start = reported = time.monotonic()
        with reproducible(self.device):
            for step in range(steps):
                for group in opt.param_groups:
                    group["lr"] = r.lr * 0.5 * (1 + math.cos(math.pi * step / steps))
                opt.zero_grad(set_to_none=True)
                self.loss(student, self.batch()).backward()
                opt.step()
                now = time.monotonic()
                if report is not None and now - reported >= REPORT_EVERY_S and step + 1 < steps:
                    report(step + 1, steps, now - start)
                    reported = now
        student.to("cpu", memory_format=torch.contiguous_format).eval()


def teacher_outputs(nn_: TargetNN, store: Store, device: str = "cpu") -> np.ndarray:
    """The unpruned NN's outputs on its training data: what every student of it distils from (computed once, cached)."""
    outputs = store.teacher_outputs(nn_.fingerprint)
    if outputs is None:
        with reproducible(torch.device(device)):
            outputs = predict_torch(copy.deepcopy(nn_.model).float().eval(), nn_.data.x_train, device=device)
        store.save_teacher_outputs(nn_.fingerprint, outputs)
    return outputs
