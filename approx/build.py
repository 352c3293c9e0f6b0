"""Build a candidate NN from a trained NN and one setting of the knobs, or load it from the cache.

A candidate is a pure function of (base weights, data, knobs, fine-tuning recipe,
seed), so it is built once, stored under the hash of all of them, and reused by
every later run. The float stage (pruning + fine-tuning) is stored apart from the
dtype stage, so trying int8 or bf16 on a pruned NN never prunes it again.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch_pruning as tp
from torch import nn

from qaopt.app_spec.hashing import content_hash

from .cache import Store
from .candidate import Candidate
from .finetune import Distiller, FinetuneRecipe
from .knobs import Knobs, check_backend
from .lowrank import factorize
from .pruning import output_heads, prune
from .quantize import cast, ort_session, predict_onnx, predict_torch, quantize_int8
from .target import TargetNN

FORMAT = 1
"""Bumped when what a cache entry means changes, so old entries are never misread."""

CALIBRATION_SAMPLES = 64
"""Training images int8 calibration reads (ONNX Runtime MinMax ranges settle well before this)."""

Progress = Callable[[str], None]


def build(
    nn_: TargetNN,
    knobs: Knobs,
    *,
    cache_dir: str | Path | None = None,
    recipe: FinetuneRecipe = FinetuneRecipe(),
    backend: str | None = None,
    device: str = "cpu",
    progress: Progress = lambda message: None,
) -> Candidate:
    """The candidate ``knobs`` make of ``nn_``: built (pruned, fine-tuned, quantized, measured) or loaded.

    ``backend`` (optional) is the backend the candidate must run on: asking int8 of
    a backend without integer kernels fails at once, before anything is built.
    ``device`` is where fine-tuning runs (``"cuda"`` if there is one); it is not part
    of the cache key, so a candidate fine-tuned on a GPU serves a CPU-only run.
    ``progress`` receives one line per stage, for progress displays.
    """
    knobs.check(nn_.name)
    if backend is not None:
        check_backend(nn_.name, knobs, backend)
    store = Store(cache_dir)
    key = content_hash("approx.candidate", FORMAT, nn_.fingerprint, knobs.identity(), recipe.as_dict())
    with store.lock(key):
        folder = store.entry("candidates", key)
        if folder is not None:
            return _load(store, folder, nn_.name, knobs)
        start = time.perf_counter()
        float_key, model = _float_model(nn_, knobs, recipe, store, device, progress)
        d = nn_.data
        with store.writing("candidates", key) as tmp:
            if knobs.dtype == "int8":
                progress("quantizing to int8 (ONNX Runtime, static QDQ)")
                rng = np.random.default_rng(knobs.seed)
                calib = d.x_train[np.sort(rng.choice(len(d.x_train), min(CALIBRATION_SAMPLES, len(d.x_train)), replace=False))]
                quantize_int8(model, nn_.example_input, calib, tmp / "model.int8.onnx", nn_.name)
                progress("measuring the error metric")
                pred = predict_onnx(ort_session(tmp / "model.int8.onnx"), d.x_val)
            else:
                progress("measuring the error metric")
                pred = predict_torch(cast(copy.deepcopy(model), knobs.dtype), d.x_val)
            macs, params = tp.utils.count_ops_and_params(model, nn_.example_input)
            meta = {
                "nn": nn_.name,
                "knobs": knobs.model_dump(mode="json"),
                "float_key": float_key,
                "metric": nn_.metric.kind,
                "error": nn_.metric(pred, d.y_val),
                "macs": int(macs),
                "params": int(params),
                "build_seconds": time.perf_counter() - start,
            }
            np.savez(tmp / "residuals.npz", *nn_.metric.residuals(pred, d.y_val, d.val_sequences))
            store.save_json(meta, tmp / "candidate.json")
        return _load(store, store.entry("candidates", key), nn_.name, knobs, from_cache=False)


def _load(store: Store, folder: Path, nn_name: str, knobs: Knobs, from_cache: bool = True) -> Candidate:
    meta = store.load_json(folder / "candidate.json")
    with np.load(folder / "residuals.npz") as npz:
        residuals = tuple(npz[f"arr_{i}"] for i in range(len(npz.files)))
    onnx = folder / "model.int8.onnx"
    return Candidate(
        nn=nn_name,
        knobs=knobs,
        key=folder.name,
        module=cast(store.load_module(store.entry("float", meta["float_key"])), knobs.dtype),
        onnx_path=onnx if onnx.exists() else None,
        runnable_on=knobs.runnable_on,
        metric=meta["metric"],
        error=meta["error"],
        residuals=residuals,
        macs=meta["macs"],
        params=meta["params"],
        build_seconds=meta["build_seconds"],
        from_cache=from_cache,
    )


def _float_model(
    nn_: TargetNN, knobs: Knobs, recipe: FinetuneRecipe, store: Store, device: str, progress: Progress
) -> tuple[str, nn.Module]:
    """The pruned, fine-tuned fp32 module (cached apart from the dtype stage)."""
    key = content_hash("approx.float", FORMAT, nn_.fingerprint, knobs.float_part(), recipe.as_dict())
    with store.lock(key):
        folder = store.entry("float", key)
        if folder is not None:
            return key, store.load_module(folder)
        torch.manual_seed(knobs.seed)
        model = copy.deepcopy(nn_.model).float().eval()
        d = nn_.data
        distiller = Distiller(d.x_train, d.y_train, lambda: _teacher_outputs(nn_, store), recipe, knobs.seed, device)
        # The fine-tuning budget is shared evenly by the phases that damage the NN.
        phases = (knobs.prune_steps if knobs.prunes else 0) + knobs.factorizes
        total = knobs.finetune_steps
        shares = iter([total * (i + 1) // max(phases, 1) - total * i // max(phases, 1) for i in range(max(phases, 1))])
        if knobs.prunes:

            def after_step(step: int) -> None:
                steps = next(shares)
                progress(f"pruning step {step + 1}/{knobs.prune_steps}: fine-tuning {steps} steps")
                distiller.run(model, steps)

            progress(f"pruning {knobs.prune_ratio:.0%} of channels in {knobs.prune_steps} step(s)")
            prune(model, nn_.example_input, knobs, nn_.name, after_step=after_step, taylor_loss=lambda: distiller.loss(model, distiller.batch()))
        if knobs.factorizes:
            count = factorize(model, knobs.rank_ratio, knobs.round_to, keep=output_heads(model, nn_.example_input))
            steps = next(shares)
            progress(f"factorized {count} convolutions at rank ratio {knobs.rank_ratio}: fine-tuning {steps} steps")
            distiller.run(model, steps)
        if not phases and total:
            progress(f"fine-tuning {total} steps")
            distiller.run(model, total)
        with store.writing("float", key) as tmp:
            store.save_module(model, tmp)
        return key, model


def _teacher_outputs(nn_: TargetNN, store: Store) -> np.ndarray:
    outputs = store.teacher_outputs(nn_.fingerprint)
    if outputs is None:
        outputs = predict_torch(copy.deepcopy(nn_.model).float().eval(), nn_.data.x_train)
        store.save_teacher_outputs(nn_.fingerprint, outputs)
    return outputs
