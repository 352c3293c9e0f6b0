"""The export stage: each chosen NN as files a robot team deploys, under ``artifacts/<nn>/``.

- ``module.pt``: the whole torch module that was validated (pruned architecture and
  fine-tuned weights, in its float dtype; for int8, the float module the int8 graph
  was quantized from). :func:`load_artifacts` rebuilds every NN from it in one call.
- ``state_dict.pt``: its weights alone (they load into the module of ``module.pt``,
  not into the unpruned class).
- ``model.onnx``: the graph that ran: the int8 QDQ graph for int8, else the float
  module exported by :func:`qaopt.kernels.export_onnx`. Every one has the input
  ``input``, the output ``output`` and a dynamic batch axis 0.
- the compiled library of the backend that was measured;
- ``artifact.json``: what the NN runs (its ONNX graph or its torch module), its input
  shape, the spec's NNs it serves and, for a merged NN (one backbone, a head per NN), the
  columns of its output that are this NN's, as the candidate says, so :func:`load_artifacts`
  never infers them from a knob's value. Each member of a merged NN gets the whole merged
  module and graph in its folder; a robot runs it once per frame for all the NNs it serves.

Each file is written atomically, so a killed export never leaves a file a later run
mistakes for whole.
"""

from __future__ import annotations

import copy
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from qaopt import kernels
from qaopt.app_spec import QaoptError, store
from qaopt.approx.merge import OutputColumns
from qaopt.measuring import compile_choice
from qaopt.result import Configuration, Result
from qaopt.search import SearchContext

ARTIFACTS = "artifacts"
MODULE_FILE = "module.pt"
STATE_DICT_FILE = "state_dict.pt"
ONNX_FILE = "model.onnx"
FORM_FILE = "artifact.json"
FORM_KIND, FORM_VERSION = "qaopt.artifact", 1
RUNS_ONNX, RUNS_TORCH = "onnx", "torch"
"""What a deployed NN runs: its ONNX graph (a candidate whose form is an ONNX file, e.g. int8), or its torch module."""


def export_configuration(ctx: SearchContext, config: Configuration, folder: Path) -> dict[str, dict[str, Path]]:
    """Write every NN of ``config`` into ``folder``; returns NN -> kind -> path."""
    out: dict[str, dict[str, Path]] = {}
    for name, candidate in ctx.candidates(config).items():
        choice = config.nns[name]
        nn_dir = folder / name
        files = {"module": nn_dir / MODULE_FILE, "state_dict": nn_dir / STATE_DICT_FILE, "onnx": nn_dir / ONNX_FILE}
        with store.atomic_path(files["module"]) as tmp:
            torch.save(candidate.module, tmp)
        with store.atomic_path(files["state_dict"]) as tmp:
            torch.save(candidate.module.state_dict(), tmp)
        with store.atomic_path(files["onnx"]) as tmp:
            if candidate.onnx_path is not None:
                shutil.copyfile(candidate.onnx_path, tmp)
            else:  # a float copy: the candidate's own module keeps its dtype for the compiled export below
                kernels.export_onnx(copy.deepcopy(candidate.module).float(), [torch.from_numpy(candidate.example())],
                                    tmp)
        compiled = compile_choice(candidate, choice, ctx.plan.target, ctx.cache_dir)
        files["compiled"] = compiled.export(nn_dir / f"compiled-{choice.backend}")
        # What load_artifacts needs to rebuild it, read from the candidate, not from its knobs.
        files["form"] = store.write_json(nn_dir / FORM_FILE, FORM_KIND, FORM_VERSION, {
            "runs": RUNS_ONNX if candidate.onnx_path is not None else RUNS_TORCH,
            "input_shape": list(candidate.input_shape), "serves": list(candidate.serves),
            "columns": None if candidate.columns is None else list(candidate.columns)})
        out[name] = files
    return out


def load_artifacts(run_dir: str | Path, threads: int | None = None, device: str = "cpu") -> dict[str, nn.Module]:
    """Every chosen NN of a finished ``qaopt optimize`` run, rebuilt from ``run_dir/artifacts`` in one call.

    Returns NN name -> torch module in eval mode, computing what closed-loop validation
    ran: fp32 and bf16 NNs are the pruned, fine-tuned modules themselves, in their dtype
    (cast a bf16 or fp16 NN's inputs to its dtype) on ``device`` (``"cuda"`` for a GPU target's NNs);
    an int8 NN is an :class:`OnnxModule` that runs its int8 graph ``model.onnx`` with ONNX Runtime on
    ``threads`` CPU threads (its float origin is ``.float_module``). ``module.pt`` is a pickle: the NN's class must import (the spec's
    folder is put on the import path, as for its entry points), and load only runs you trust.
    """
    run_dir = Path(run_dir).resolve()
    result = Result.load(run_dir / "result.json")
    if result.aware is None:
        raise QaoptError(f"{run_dir}: this run chose no configuration, so it exported no NN")
    folder = str(Path(result.spec).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    modules: dict[str, nn.Module] = {}
    for name, choice in result.aware.nns.items():
        nn_dir = run_dir / ARTIFACTS / name
        if not (nn_dir / MODULE_FILE).exists():
            raise QaoptError(f"{nn_dir / MODULE_FILE}: missing; this run's artifacts predate it: run `qaopt optimize` "
                             "again (it resumes from the cache and writes them)")
        try:
            module = torch.load(nn_dir / MODULE_FILE, weights_only=False, map_location=device).eval()
        except ImportError:  # the NN's class does not import here: not damage, the user's import path
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged pickle raises anything from EOFError to RuntimeError
            raise QaoptError(f"{nn_dir / MODULE_FILE}: damaged ({type(exc).__name__}); run `qaopt optimize` again "
                             "(it resumes from the cache and exports the NNs anew)") from None
        form = _form(nn_dir)
        if _runs(form, choice.knobs) == RUNS_ONNX:
            module = OnnxModule(nn_dir / ONNX_FILE, module, threads)
        if form.get("columns") is not None:  # a merged NN: its module computes every member's outputs
            module = OutputColumns(module, form["columns"]).eval()
        modules[name] = module
    return modules


def _form(nn_dir: Path) -> dict:
    """What export recorded about the NN in ``nn_dir`` (empty for artifacts exported before the record existed)."""
    form = store.read_json(nn_dir / FORM_FILE, FORM_KIND, FORM_VERSION)
    return form if isinstance(form, dict) else {}


def _runs(form: dict, knobs: dict) -> str:
    """What an exported NN runs (:data:`RUNS_ONNX` or :data:`RUNS_TORCH`), as export recorded it.

    Artifacts exported before the record existed ran their ONNX graph exactly when they were int8.
    """
    if form.get("runs") in (RUNS_ONNX, RUNS_TORCH):
        return form["runs"]
    return RUNS_ONNX if knobs.get("dtype") == "int8" else RUNS_TORCH


class OnnxModule(torch.nn.Module):
    """An exported int8 NN as a torch module: ``forward`` runs its ONNX graph (``input`` -> ``output``) with ONNX Runtime."""

    def __init__(self, path: Path, float_module: torch.nn.Module, threads: int | None = None):
        super().__init__()
        self.path = Path(path)
        self.session = kernels.ort_session(self.path, threads)
        self.float_module = float_module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = np.ascontiguousarray(x.detach().cpu().float().numpy())
        return torch.from_numpy(self.session.run([kernels.OUTPUT_NAME], {kernels.INPUT_NAME: x})[0])
