"""The reference perception NNs, ready to use: committed weights, else cached, else trained.

``reference_nn(target, backbone)`` is what the example spec names as each NN's
model. The package ships the compact NNs' weights (``weights/compact-*.pt``,
with their recipe and validation report beside them as JSON); any other recipe is
trained on first use and cached under its content hash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qaopt.app_spec.store import cache_root

from .config import check_nn
from .errors import CropFollowParamError

PACKAGE_WEIGHTS = Path(__file__).parent / "weights"


def weights_path(target: str, backbone: str, cache_dir: str | Path | None = None, **recipe: Any) -> Path:
    """Where the weights of this recipe are (or will be): the package's if they match, else the cache's."""
    from .train import Recipe

    r = Recipe(target=target, backbone=backbone, **recipe)
    packaged = PACKAGE_WEIGHTS / f"{backbone}-{target}"
    meta = packaged.with_suffix(".json")
    if meta.exists() and json.loads(meta.read_text()).get("key") == r.key():
        return packaged
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / "cropfollow" / "weights" / f"{backbone}-{target}-{r.key()}"


def reference_nn(
    target: str = "heading",
    backbone: str = "compact",
    cache_dir: str | Path | None = None,
    device: str = "auto",
    train_if_missing: bool = True,
    **recipe: Any,
):
    """The trained NavNet for ``target`` ("heading" in deg, "distance" ratio), in eval mode.

    Input float32 (B, 3, 240, 320) RGB in [0, 1] (normalised inside); output (B, 1).
    ``recipe`` overrides :class:`.train.Recipe` fields (epochs, lr, dataset, ...).
    Without stored weights it trains (on ``device``; ``"auto"``: the GPU when torch sees one, since a
    ResNet-18 takes ~20 s there and about an hour on two CPU cores) unless ``train_if_missing`` is False.
    """
    import torch

    from . import train as training

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_nn(target, backbone)
    path = weights_path(target, backbone, cache_dir, **recipe)
    if not path.with_suffix(".json").exists():
        if not train_if_missing:
            raise CropFollowParamError("backbone", f"no trained weights for {backbone}-{target} at {path}; train them with `qaopt train SPEC` on a spec "
                                                   f"that names this NN (examples/cropfollow-resnet18.yaml for resnet18), or "
                                                   f"`python benchmarks/cropfollow_train_reference.py --backbone {backbone} --target {target}`")
        train_reference(target, backbone, cache_dir=cache_dir, device=device, **recipe)
    return training.load(path, training.Recipe(target=target, backbone=backbone, **recipe))


def train_reference(
    target: str,
    backbone: str = "compact",
    cache_dir: str | Path | None = None,
    device: str = "cpu",
    out: Path | None = None,
    progress: Any = None,
    **recipe: Any,
):
    """Train a reference NN from scratch and store it (at ``out``, else where :func:`reference_nn` looks).

    Returns the validation :class:`.train.Report`. ``progress(phase, done, total)`` follows
    the data generation and the training steps.
    """
    from . import train as training

    check_nn(target, backbone)
    r = training.Recipe(target=target, backbone=backbone, **recipe)
    model, report = training.train(r, device=device, progress=progress, cache_dir=cache_dir)
    training.save(model, r, report, out if out is not None else weights_path(target, backbone, cache_dir, **recipe))
    return report


def reference_report(target: str = "heading", backbone: str = "compact", cache_dir: str | Path | None = None, **recipe: Any) -> dict[str, Any] | None:
    """The stored validation report of a trained reference NN, or None if it is not trained yet."""
    meta = weights_path(target, backbone, cache_dir, **recipe).with_suffix(".json")
    return json.loads(meta.read_text())["report"] if meta.exists() else None
