"""The export stage: each chosen NN as files a robot team deploys, under ``artifacts/<nn>/``.

``state_dict.pt`` (the weights), ``model.onnx`` (the graph that ran: the int8 QDQ
graph for int8, else the float module exported by :func:`qaopt.kernels.export_onnx`)
and the compiled library of the backend that was measured. Each file is written
atomically, so a killed export never leaves a file a later run mistakes for whole.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from qaopt import kernels
from qaopt.app_spec import store
from qaopt.measuring import compile_choice
from qaopt.result import Configuration
from qaopt.search import SearchContext


def export_configuration(ctx: SearchContext, config: Configuration, folder: Path) -> dict[str, dict[str, Path]]:
    """Write every NN of ``config`` into ``folder``; returns NN -> kind -> path."""
    import torch

    out: dict[str, dict[str, Path]] = {}
    for name, choice in config.nns.items():
        candidate = ctx.build(name, choice.knobs)
        nn_dir = folder / name
        files = {"state_dict": nn_dir / "state_dict.pt", "onnx": nn_dir / "model.onnx"}
        with store.atomic_path(files["state_dict"]) as tmp:
            torch.save(candidate.module.state_dict(), tmp)
        with store.atomic_path(files["onnx"]) as tmp:
            if candidate.onnx_path is not None:
                shutil.copyfile(candidate.onnx_path, tmp)
            else:
                kernels.export_onnx(candidate.module.float(), [ctx.nns[name].example_input], tmp)
        compiled = compile_choice(candidate, ctx.examples()[name], choice, ctx.target, ctx.cache_dir)
        files["compiled"] = compiled.export(nn_dir / f"compiled-{choice.backend}")
        out[name] = files
    return out
