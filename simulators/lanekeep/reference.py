"""The reference perception NNs, ready to use: committed weights, else cached, else trained.

``reference_nn(target)`` is what a spec names as each NN's model. The package ships
the three NNs' weights (``weights/<target>.pt``, with their recipe key and
validation report beside them as JSON); any other recipe is trained on first use
and cached under its content hash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qaopt.app_spec.store import cache_root

from .config import check_nn
from .errors import LaneKeepParamError

PACKAGE_WEIGHTS = Path(__file__).parent / "weights"


def weights_path(target: str, cache_dir: str | Path | None = None, **recipe: Any) -> Path:
    """Where the weights of this recipe are (or will be): the package's if they match, else the cache's."""
    from .train import Recipe

    r = Recipe(target=target, **recipe)
    packaged = PACKAGE_WEIGHTS / target
    meta = packaged.with_suffix(".json")
    if meta.exists() and json.loads(meta.read_text()).get("key") == r.key():
        return packaged
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / "lanekeep" / "weights" / f"{target}-{r.key()}"


def reference_nn(target: str = "lane", cache_dir: str | Path | None = None, device: str = "auto", train_if_missing: bool = True, **recipe: Any):
    """The trained :class:`.nets.LaneKeepNet` for ``target`` ("lane", "stop" or "lead"), in eval mode.

    Input float32 (B, 3, 120, 160) RGB in [0, 1]; output (B, 1). ``recipe`` overrides
    :class:`.train.Recipe` fields. Without stored weights it trains (on ``device``;
    ``"auto"``: the GPU when torch sees one; a few minutes on two CPU cores) unless
    ``train_if_missing`` is False.
    """
    import torch

    from . import train as training

    check_nn(target)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    path = weights_path(target, cache_dir, **recipe)
    if not path.with_suffix(".json").exists():
        if not train_if_missing:
            raise LaneKeepParamError("target", f"no trained weights for {target} at {path}; call reference_nn({target!r}) with train_if_missing=True to train them")
        train_reference(target, cache_dir=cache_dir, device=device, **recipe)
    return training.load(path, training.Recipe(target=target, **recipe))


def train_reference(target: str, cache_dir: str | Path | None = None, device: str = "cpu", out: Path | None = None, log: Any = None, **recipe: Any):
    """Train a reference NN from scratch and store it (at ``out``, else where :func:`reference_nn` looks); return its report."""
    from . import train as training

    check_nn(target)
    r = training.Recipe(target=target, **recipe)
    model, report = training.train(r, device=device, cache_dir=cache_dir, log=log)
    training.save(model, r, report, out if out is not None else weights_path(target, cache_dir, **recipe))
    return report


def reference_report(target: str = "lane", cache_dir: str | Path | None = None, **recipe: Any) -> dict[str, Any] | None:
    """The stored validation report of a trained reference NN, or None if it is not trained yet."""
    meta = weights_path(target, cache_dir, **recipe).with_suffix(".json")
    return json.loads(meta.read_text())["report"] if meta.exists() else None
