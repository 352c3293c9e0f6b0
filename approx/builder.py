"""Build a candidate NN from a trained NN and one setting of the knobs, or load it from the cache.

A candidate is a pure function of (base weights, data, knobs, fine-tuning recipe,
seed), so it is built once, stored under the hash of all of them, and reused by
every later run. The registered passes do the work: the ``float`` passes (pruning,
factorization, fine-tuning) make the fp32 model, stored apart from what the
``export`` passes (quantization) make of it, so trying int8 or bf16 on a pruned NN
never prunes it again. A float pass whose change is shared (a resolution adapted to
its scale once: :meth:`~qaopt.approx.passes.ApproximationPass.shared`) is applied
alone to the NN and stored under ``shared/<key>/``; the other passes, a pruning
ladder included, start from that NN, the reference still their teacher.
"""

from __future__ import annotations

import copy
import functools
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
from .finetune import Distiller, FinetuneRecipe, teacher_outputs, tuned
from .knobs import Knobs
from .ladder import Ladder
from .passes import BuildContext, OnnxToolchain, Runnable, passes
from .quantize import predict_onnx, predict_torch
from .target import TargetNN

FORMAT = 1
"""Bumped when what a cache entry means changes, so old entries are never misread."""

Progress = Callable[[str], None]


def build(
    nn_: TargetNN,
    knobs: Knobs,
    *,
    cache_dir: str | Path | None = None,
    recipe: FinetuneRecipe = FinetuneRecipe(),
    backend: str | None = None,
    onnx: OnnxToolchain | None = None,
    device: str = "cpu",
    progress: Progress = lambda message: None,
) -> Candidate:
    """The candidate ``knobs`` make of ``nn_``: built (pruned, fine-tuned, quantized, measured) or loaded.

    ``backend`` (optional) is the backend the candidate must run on: asking int8 of
    a backend without integer kernels fails at once, before anything is built.
    ``onnx`` exports and runs ONNX graphs (``qaopt.kernels.onnx``); int8 needs it.
    ``device`` is where fine-tuning (and the error of a torch candidate) runs (``"cuda"`` if
    there is one); it is not part of the cache key, so a candidate built on a GPU serves a
    CPU-only run.
    ``progress`` receives one line per stage, for progress displays.
    """
    knobs.check(nn_.name, backend)
    recipe = tuned(recipe, knobs)
    store = Store(cache_dir)
    key = content_hash("approx.candidate", FORMAT, nn_.fingerprint, knobs.identity(), recipe.as_dict())
    with store.lock(key):
        folder = store.entry("candidates", key)
        meta = store.load_meta(folder)
        if meta is not None and store.entry("float", meta["float_key"]) is not None:  # both intact: else rebuilt
            return _load(store, folder, meta, nn_, knobs, onnx)
        start = time.perf_counter()
        context = functools.partial(_context, nn_, knobs, recipe, store, device, onnx, progress)
        float_key, model = _float_model(nn_, knobs, recipe, store, context)
        ctx = context(nn_)
        d = nn_.data
        with store.writing("candidates", key) as tmp:
            runnable = Runnable(copy.deepcopy(model))
            for p in passes("export"):
                runnable = p.export(runnable, knobs, ctx, tmp)
            progress("measuring the error metric")
            pred = _predict(runnable, onnx, d.x_val, device)
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
            store.save_meta(meta, tmp)
        return _load(store, store.entry("candidates", key), meta, nn_, knobs, onnx, from_cache=False)


def _predict(runnable: Runnable, onnx: OnnxToolchain | None, x: np.ndarray, device: str) -> np.ndarray:
    """The candidate's outputs on ``x``: an ONNX graph on ONNX Runtime's CPU, a torch module on the training device."""
    if runnable.onnx_path is not None:
        return predict_onnx(onnx.ort_session(runnable.onnx_path), x)
    return predict_torch(runnable.module, x, device=device)


def _load(store: Store, folder: Path, meta: dict, nn_: TargetNN, knobs: Knobs, onnx: OnnxToolchain | None,
          from_cache: bool = True) -> Candidate:
    with np.load(folder / "residuals.npz") as npz:
        residuals = tuple(npz[f"arr_{i}"] for i in range(len(npz.files)))
    runnable = Runnable(store.load_module(store.entry("float", meta["float_key"])))
    for p in passes("export"):
        runnable = p.restore(runnable, knobs, folder)
    return Candidate(
        nn=nn_.name,
        knobs=knobs,
        key=folder.name,
        module=runnable.module,
        onnx_path=runnable.onnx_path,
        runnable_on=knobs.runnable_on,
        metric=meta["metric"],
        error=meta["error"],
        residuals=residuals,
        macs=meta["macs"],
        params=meta["params"],
        build_seconds=meta["build_seconds"],
        from_cache=from_cache,
        input_shape=nn_.input_shape,
        onnx=onnx,
    )


def _context(nn_: TargetNN, knobs: Knobs, recipe: FinetuneRecipe, store: Store, device: str,
             onnx: OnnxToolchain | None, progress: Progress, start: TargetNN) -> BuildContext:
    """What the passes build with: ``start`` is the NN the float passes start from (``nn_``, or what a shared pass
    made of it), ladders included; ``nn_``'s outputs teach them."""
    teacher = lambda: teacher_outputs(nn_, store, device)  # noqa: E731
    distiller = Distiller(nn_.data.x_train, nn_.data.y_train, teacher, recipe, knobs.seed, device)
    phases = sum(p.damage_phases(knobs) for p in passes("float"))
    return BuildContext(nn=start, knobs=knobs, distiller=distiller, progress=progress, phases=phases, onnx=onnx,
                        ladder=lambda ladder: Ladder(start, ladder, recipe, store, teacher, device=device, progress=progress))


def _shared_start(nn_: TargetNN, knobs: Knobs, recipe: FinetuneRecipe, store: Store, ctx: BuildContext) -> TargetNN:
    """The NN the float passes start from: ``nn_``, or ``nn_`` changed by the passes whose change is shared,
    built once (seeded, as a candidate is) and stored, keyed by what those passes set."""
    shared = [p for p in passes("float") if p.shared(knobs)]
    if not shared:
        return nn_
    key = content_hash("approx.shared", FORMAT, nn_.fingerprint, {p.name: p.identity(knobs) for p in shared},
                       recipe.as_dict(), knobs.seed)
    (store.root / "shared").mkdir(exist_ok=True)
    with store.lock(f"shared-{key}"):
        folder = store.entry("shared", key)
        if folder is not None:
            model = store.load_module(folder)
        else:
            torch.manual_seed(knobs.seed)
            model = copy.deepcopy(nn_.model).float().eval()
            for p in shared:
                model = p.apply(model, knobs, ctx)
            with store.writing("shared", key) as tmp:
                store.save_module(model, tmp)
    return TargetNN(nn_.name, model, nn_.data, nn_.input_shape, nn_.metric, architecture=key)


def _float_model(nn_: TargetNN, knobs: Knobs, recipe: FinetuneRecipe, store: Store,
                 context: Callable[[TargetNN], BuildContext]) -> tuple[str, nn.Module]:
    """The fp32 module the float passes make (cached apart from the export stage); ``context(start)`` is what
    passes that start from ``start`` (``nn_``, or what a shared pass made of it) build with."""
    key = content_hash("approx.float", FORMAT, nn_.fingerprint, knobs.float_part(), recipe.as_dict())
    with store.lock(key):
        folder = store.entry("float", key)
        if folder is not None:
            return key, store.load_module(folder)
        ctx = context(nn_)
        start = _shared_start(nn_, knobs, recipe, store, ctx)
        if start is not nn_:
            ctx = context(start)
        torch.manual_seed(knobs.seed)
        model = copy.deepcopy(start.model).float().eval()
        float_passes = [p for p in passes("float") if not p.shared(knobs)]
        for p in float_passes:
            p.prepare(knobs, ctx)
        for p in float_passes:
            model = p.apply(model, knobs, ctx)
        with store.writing("float", key) as tmp:
            store.save_module(model, tmp)
        return key, model
