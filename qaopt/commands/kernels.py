"""``qaopt kernels bench SPEC``: compile each NN of a spec for its target and time it on every backend."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from qaopt import kernels
from qaopt.spec import load_spec
from qaopt.app_spec.entrypoints import load_entry_point
from qaopt.app_spec.errors import QaoptError
from qaopt.app_spec.store import cache_root

app = typer.Typer(help="Compile, tune and time NNs on the target (torch, torch-compile, tvm, onnxruntime, auto).",
                  no_args_is_help=True)


@app.command()
def bench(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    nn: list[str] = typer.Option(None, "--nn", help="NNs to measure (default: all of the spec's)."),
    backend: str | None = typer.Option(None, help="Override target.backend (torch, torch[channels_last], torch-compile, "
                                                   "tvm, onnxruntime, auto, or a registered one)."),
    trials: int | None = typer.Option(None, help="Override target.tuning.trials (0: no tuning)."),
    threads: int | None = typer.Option(None, help="Override target.threads."),
) -> None:
    """Measure the spec's NNs (their reference architecture and weights) as the target would run them."""
    import torch

    app_spec = load_spec(spec, check_entry_points=True)
    names = nn or list(app_spec.nns)
    unknown = [n for n in names if n not in app_spec.nns]
    if unknown:
        raise QaoptError(f"--nn {', '.join(unknown)}: not in {spec}'s nns ({', '.join(app_spec.nns)})")
    overrides = {"backend": backend, "threads": threads}
    target = kernels.Target.from_spec(app_spec.target.model_copy(update={k: v for k, v in overrides.items() if v is not None}))
    if trials is not None:
        target = replace(target, tuning=replace(target.tuning, trials=trials))
    table = Table(title=f"{spec.name}: {target.device}, backend {target.backend}, {target.threads or 'all'} threads")
    for column in ("NN", "backend", "median ms", "IQR ms", "peak MiB", "note"):
        table.add_column(column)
    console = Console()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as progress:
        for name in names:
            task = progress.add_task(f"{name}: compiling and measuring", total=None)
            nn_spec = app_spec.nns[name]
            model = load_entry_point(nn_spec.model)(**nn_spec.args)
            example = torch.rand(*nn_spec.input_shape)
            compiled = kernels.compile(model, [example], target, cache_dir=cache_root(configured=app_spec.output.cache_dir))
            outcomes = compiled.outcomes if isinstance(compiled, kernels.AutoCompiled) else [
                kernels.Outcome(compiled.backend, compiled.measure())]
            for o in outcomes:
                m = o.measurement
                best = " (kept)" if isinstance(compiled, kernels.AutoCompiled) and o.backend == compiled.backend else ""
                table.add_row(name, escape(o.backend) + best, f"{m.median_ms:.2f}" if m else "-", f"{m.spread_ms:.2f}" if m else "-",
                              f"{m.peak_mem_bytes / 2**20:.1f}" if m and m.peak_mem_bytes else "-",
                              escape((o.error or "")[:120] or _tuning_note(o.tuning)))
            progress.remove_task(task)
    console.print(table)


def _tuning_note(tuning: dict | None) -> str:
    if not tuning:
        return ""
    return (f"tuned {tuning['trials']} trials in {tuning['tuning_s']:.0f} s, db hits {tuning['hits']}/{tuning['tasks']}, "
            f"{tuning['chosen']}; {tuning['stopped']}")
