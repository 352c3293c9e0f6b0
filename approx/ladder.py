"""Pruning ladders: one progressive pruning trajectory per NN, a fine-tuned snapshot at every rung.

Pruning a network once, deeply, and fine-tuning it briefly loses most of what it
knew; pruning it a little at a time, fine-tuning after every step, keeps it
(ApproxCaliper pruned its NavNets this way: L1 filter pruning in 40 steps, each
followed by fine-tuning with the learning rate rewound; Renda et al., 2020, show
that rewinding the learning rate recovers as well as rewinding the weights). The
trajectory is built once per NN and recipe and every rung is kept: a search trial
then picks a rung instead of pruning from scratch, so the deepest candidates carry
the fine-tuning of every rung above them at no cost to the trial.

Rung ``k`` keeps ``1 - k * step`` of every prunable layer's *original* channels
(rounded to ``round_to``, output heads never pruned), so a rung is the same model
whichever rung the ladder was resumed from. Each rung is pruned from the one above
and distilled from the unpruned NN (:class:`~qaopt.approx.finetune.Distiller`) for
``finetune_steps`` steps with the learning rate rewound to its peak (a fresh cosine
cycle), seeded by the rung, and then stored: a killed ladder resumes at its last
stored rung, and two processes asking for one rung wait for each other (one lock
per ladder) instead of training it twice.

Layout under the approx store: ``ladders/<key>/rung-<k>/model.pt`` and
``ladders/<key>/rung-<k>/rung.json`` (the rung's ratio, error, MACs, parameters,
training steps and seconds).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch_pruning as tp
from torch import nn

from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.nn_errors import LABEL_THRESHOLD, is_class_metric
from qaopt.app_spec.store import read_json, write_json

from .cache import Store
from .errors import ApproxError
from .finetune import Distiller, FinetuneRecipe, teacher_outputs, tuned
from .pruning import channel_counts, kept_channels, output_heads, prune_to
from .quantize import predict_torch
from .target import TargetNN

FORMAT = 1
"""Bumped when what a stored rung means changes, so old rungs are never misread."""
RUNG_KIND, RUNG_VERSION = "approx.ladder.rung", 1
SANITY_SHARE = 1.0
"""A first rung whose error reaches this share of a constant prediction's error has lost what the NN learned."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LadderRecipe:
    """Everything that determines a ladder's rungs besides the NN and the fine-tuning recipe."""

    step: float
    """Share of the original channels each rung removes (0.05: rungs at 5 %, 10 %, ... pruned)."""
    finetune_steps: int
    """Distillation steps after each rung's pruning, the learning rate rewound to its peak."""
    importance: str = "l1"
    round_to: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.step < 1.0:
            raise ValueError(f"ladder step must be in (0, 1), got {self.step}")

    @classmethod
    def of(cls, knobs) -> LadderRecipe:
        """The recipe of the ladder a :class:`~qaopt.approx.Knobs` on one takes its rung from."""
        return cls(knobs.ladder_step, knobs.ladder_finetune_steps, knobs.importance, knobs.round_to, knobs.seed)

    def rung_of(self, ratio: float) -> int:
        """The rung that prunes ``ratio`` of the channels; the ratio must lie on the ladder's grid."""
        k = round(ratio / self.step)
        if not math.isclose(k * self.step, ratio, abs_tol=1e-6):
            raise ValueError(f"prune ratio {ratio} is not a rung of a ladder with step {self.step}")
        return k

    def ratio_of(self, rung: int) -> float:
        return round(rung * self.step, 6)


@dataclass(frozen=True)
class Rung:
    """One stored rung: its place on the ladder and what it cost and kept."""

    rung: int
    ratio: float
    error: float
    """The NN's error metric on its validation data."""
    macs: int
    params: int
    train_steps: int
    """Fine-tuning steps of this rung and every rung above it: what the snapshot cost."""
    seconds: float


class Ladder:
    """The pruning ladder of one NN and recipe, in a :class:`~qaopt.approx.cache.Store`.

    ``ladder.model(k)`` is rung ``k``'s pruned, fine-tuned fp32 module (rung 0 is
    the NN itself), built from the deepest stored rung above it when missing;
    ``ladder.rungs()`` lists the stored rungs.
    """

    def __init__(
        self,
        nn_: TargetNN,
        recipe: LadderRecipe,
        finetune: FinetuneRecipe,
        store: Store,
        teacher: Callable[[], np.ndarray],
        *,
        device: str = "cpu",
        progress: Progress = lambda message: None,
    ):
        self.nn, self.recipe, self.finetune, self.store = nn_, recipe, finetune, store
        self.teacher, self.device, self.progress = teacher, device, progress
        self.key = content_hash("approx.ladder", FORMAT, nn_.fingerprint, asdict(recipe), finetune.as_dict())
        self.folder = store.root / "ladders" / self.key

    # ---- reading
    def _rung_folder(self, k: int) -> Path:
        return self.folder / f"rung-{k:03d}"

    def stored(self, k: int) -> Rung | None:
        folder = self._rung_folder(k)
        if not folder.is_dir() or not self.store.intact(folder):  # a damaged rung is set aside and built again
            return None
        data = read_json(folder / "rung.json", RUNG_KIND, RUNG_VERSION)
        return None if data is None else Rung(**data)

    def rungs(self) -> list[Rung]:
        """The stored rungs, top (least pruned) first."""
        found = [self.stored(k) for k in range(1, round(1 / self.recipe.step) + 1)]
        return [r for r in found if r is not None]

    # ---- building
    def model(self, k: int) -> nn.Module:
        """Rung ``k``'s fp32 module, building every missing rung down to it."""
        if k <= 0:
            return self.model_at(0)
        with self.store.lock(f"ladder-{self.key}"):
            if self.stored(k) is None:
                self._build_to(k)
            return self.store.load_module(self._rung_folder(k))

    def _build_to(self, k: int) -> None:
        top = max((j for j in range(k - 1, 0, -1) if self.stored(j) is not None), default=0)
        model = self.model_at(top)
        widths = channel_counts(self.nn.model)
        head_modules = output_heads(self.nn.model, self.nn.example_input)
        heads = {name for name, m in self.nn.model.named_modules() if any(m is h for h in head_modules)}
        steps_above = 0 if top == 0 else self.stored(top).train_steps
        for j in range(top + 1, k + 1):
            started = time.perf_counter()
            ratio = self.recipe.ratio_of(j)
            self.progress(f"ladder rung {j}: pruning {ratio:.0%} of channels, fine-tuning {self.recipe.finetune_steps} steps")
            target = {n: kept_channels(c, ratio, self.recipe.round_to) for n, c in widths.items() if n not in heads}
            seed = int(content_hash(self.recipe.seed, j)[:8], 16)
            torch.manual_seed(seed)  # dropout: a rung is the same whichever rung the ladder resumed from
            distiller = self._distiller(seed)
            prune_to(model, self.nn.example_input, target, self.recipe.importance, self.nn.name,
                     taylor_loss=lambda: distiller.loss(model, distiller.batch()))
            distiller.run(model, self.recipe.finetune_steps)
            steps_above += self.recipe.finetune_steps
            rung = self._measure(model, j, ratio, steps_above, time.perf_counter() - started)
            if j == 1:
                self._check_sane(rung)
            self._store(model, rung)

    def model_at(self, k: int) -> nn.Module:
        """A stored rung's module (rung 0: a copy of the NN), no building."""
        return copy.deepcopy(self.nn.model).float().eval() if k == 0 else self.store.load_module(self._rung_folder(k))

    def _distiller(self, seed: int) -> Distiller:
        d = self.nn.data
        return Distiller(d.x_train, d.y_train, self.teacher, self.finetune, seed, self.device)

    def _measure(self, model: nn.Module, k: int, ratio: float, steps: int, seconds: float) -> Rung:
        d = self.nn.data
        error = self.nn.metric(predict_torch(model, d.x_val, device=self.device), np.asarray(d.y_val))
        macs, params = tp.utils.count_ops_and_params(model, self.nn.example_input)
        return Rung(k, ratio, float(error), int(macs), int(params), steps, seconds)

    def _check_sane(self, rung: Rung) -> None:
        """Stop a recipe that breaks the NN at its first rung: every deeper rung would only be worse."""
        d = self.nn.data
        y_val = np.asarray(d.y_val)
        metric = self.nn.metric
        if is_class_metric(metric.kind):
            # A constant output has rate 0 or 1 (always or never "present"); the uninformed detector says
            # "present" at random with the training labels' prevalence p: miss rate 1 - p, false-alarm rate p.
            p = float(np.mean(np.asarray(d.y_train)[:, metric.column] >= LABEL_THRESHOLD))
            constant = 1.0 - p if metric.kind == "miss_rate" else p
        else:
            constant = metric(np.broadcast_to(np.median(np.asarray(d.y_train), axis=0), y_val.shape), y_val)
        if not math.isfinite(rung.error) or rung.error >= SANITY_SHARE * constant:
            raise ApproxError(
                self.nn.name,
                "pruning.ladder",
                f"rung 1 (pruning {rung.ratio:.0%} of channels, {self.recipe.finetune_steps} fine-tuning steps) has error "
                f"{rung.error:.4g}, no better than predicting the training median for every input ({constant:.4g}; for a "
                "detector: guessing at the labels' prevalence): the "
                "recipe breaks the NN at its first rung; lower pruning.ladder.step, raise pruning.ladder.finetune_steps, "
                "or check the NN and its data",
            )

    def _store(self, model: nn.Module, rung: Rung) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.store.writing(f"ladders/{self.key}", self._rung_folder(rung.rung).name) as tmp:
            self.store.save_module(model, tmp)
            write_json(tmp / "rung.json", RUNG_KIND, RUNG_VERSION, asdict(rung))


def ladder_of(
    nn_: TargetNN,
    knobs,
    *,
    cache_dir: str | Path | None = None,
    recipe: FinetuneRecipe = FinetuneRecipe(),
    device: str = "cpu",
    progress: Progress = lambda message: None,
) -> Ladder:
    """The pruning ladder a :class:`~qaopt.approx.Knobs` takes its rung from (it must be on one: ``ladder_step > 0``).

    ``ladder_of(nn, knobs).model(k)`` builds every missing rung down to ``k`` (on ``device``),
    so a run can build its ladders up front, before any trial asks for a rung; ``.rungs()``
    lists what is stored, for a ladder table.
    """
    if knobs.ladder_step <= 0:
        raise ValueError("these knobs prune from scratch (ladder_step 0): they take no rung of a ladder")
    store = Store(cache_dir)
    return Ladder(nn_, LadderRecipe.of(knobs), tuned(recipe, knobs), store, lambda: teacher_outputs(nn_, store, device), device=device, progress=progress)
