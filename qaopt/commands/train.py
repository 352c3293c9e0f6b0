"""``qaopt train SPEC``: make every reference NN of a spec ready, and report its validation error.

A spec's ``nns.<name>.model`` entry point returns the trained reference NN: the
shipped examples load committed weights, else cached ones, else train on first use
from their simulator's data (a user's application may do the same, or name a
``weights`` file). Training inside a later command would hide minutes of work
behind a calibration's progress bar; ``qaopt train`` does it up front, one NN at a
time, and then measures each NN's declared error metric on its validation split,
so a team sees the reference quality calibration and search start from.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from qaopt.app_spec import QaoptError
from qaopt.app_spec.nn_errors import CLASS_METRICS


def train(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    nn: list[str] = typer.Option(None, "--nn", help="Only this NN (repeat for several); default: every NN of the spec."),
    threads: int = typer.Option(2, "--threads", min=1, help="CPU threads for torch (training and evaluation)."),
) -> None:
    """Train (on first use) and load each reference NN of SPEC, and print its validation error.

    Each NN comes from its model entry point, which loads or trains it (the shipped
    examples train on the GPU when torch sees one); its error is the spec's
    ``error_metric`` on the validation split of its ``data``. Run it again and the
    NNs load from where the first run stored them.
    """
    import torch

    from qaopt.approx import TargetNN
    from qaopt.approx.quantize import predict_torch
    from qaopt.spec import load_spec

    app_spec = load_spec(spec)
    names = list(nn or app_spec.nns)
    unknown = [n for n in names if n not in app_spec.nns]
    if unknown:
        raise QaoptError(f"--nn {unknown[0]}: {spec} has no NN of that name; its nns are {', '.join(app_spec.nns)}")
    torch.set_num_threads(threads)
    console = Console(stderr=True)
    table = Table(title=f"{app_spec.app.name}: reference NNs on their validation data")
    for column in ("NN", "error metric", "validation", "unit", "val samples", "MMACs", "seconds"):
        table.add_column(column)
    for name in names:
        nn_spec = app_spec.nns[name]
        start = time.perf_counter()
        with console.status(f"nns.{name}: {nn_spec.model} (loads its weights, or trains them on first use)"):
            try:
                target = TargetNN.from_spec(name, nn_spec)
            except QaoptError:
                raise
            except Exception as exc:  # noqa: BLE001 - the user's model or data code failed
                raise QaoptError(f"{spec}: nns.{name}: loading or training the NN raised {type(exc).__name__}: {exc}") from exc
            pred = predict_torch(target.model, target.data.x_val)
        error = target.metric(pred, target.data.y_val)
        unit = "rate" if nn_spec.error_metric.kind in CLASS_METRICS else next(
            (o.unit for o in nn_spec.outputs if o.name == nn_spec.error_metric.output), "")
        table.add_row(name, f"{nn_spec.error_metric.kind} of {nn_spec.error_metric.output}", f"{error:.4g}",
                      unit, str(len(target.data.x_val)),
                      f"{_macs(target) / 1e6:.1f}", f"{time.perf_counter() - start:.0f}")
        console.print(f"nns.{name}: ready ({time.perf_counter() - start:.0f} s)")
    Console().print(table)


def _macs(target) -> int:
    import torch_pruning as tp

    macs, _ = tp.utils.count_ops_and_params(target.model, target.example_input)
    return int(macs)
