"""``qaopt approx sweep SPEC --nn heading --knob pruning``: build one NN's candidates along one knob and tabulate them;
``qaopt approx ladder SPEC --nn heading``: build one NN's pruning ladder and tabulate its rungs."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from qaopt.spec import load_spec
from qaopt.app_spec.errors import QaoptError
from qaopt.app_spec.store import cache_root

app = typer.Typer(help="Build and measure approximated NNs (pruning, quantization, fine-tuning).", no_args_is_help=True)

def _default_values(knob: str, space) -> list:
    """Values to sweep when none are given: the spec's range for the knob."""
    from qaopt.approx import knob_names

    if knob in knob_names() and knob != "seed" and len(points := space.choices(knob)) > 1:
        return points
    raise QaoptError(f"--knob {knob}: give the values to sweep with --values")


def _parse(text: str) -> list:
    values = []
    for item in text.split(","):
        item = item.strip()
        try:
            values.append(float(item) if "." in item or "e" in item.lower() else int(item))
        except ValueError:
            values.append(item)
    return values


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    nn: str = typer.Option(..., "--nn", help="The NN to approximate (a key of the spec's nns)."),
    knob: str = typer.Option("pruning", "--knob", help="an approximation pass (pruning, quantization, finetune, lowrank, ...) "
                             "to sweep its first knob, or a knob's name."),
    values: str | None = typer.Option(None, "--values", help="Comma-separated values (default: the spec's range)."),
    dtype: str | None = typer.Option(None, help="Fixed dtype while another knob is swept (default fp32)."),
    prune_ratio: float | None = typer.Option(None, help="Fixed prune ratio while another knob is swept."),
    finetune_steps: int | None = typer.Option(None, help="Fine-tuning budget (default: the top of the spec's range)."),
    latency: bool = typer.Option(True, "--latency/--no-latency", help="Time each candidate on this machine."),
    threads: int | None = typer.Option(None, help="Threads for timing (default: the spec's target.threads, else 2)."),
    device: str | None = typer.Option(None, "--device", help="Where to fine-tune: auto, cpu or cuda (default: the "
                                      "spec's training.device)."),
) -> None:
    """Build (or load from the cache) one candidate per value and print error, MACs, parameters and latency."""
    app_spec = _spec_with_nn(spec, nn)
    from qaopt.approx import KnobSpace
    from qaopt.approx.passes import passes

    knob = {p.name: next(iter(p.Knobs.model_fields)) for p in passes()}.get(knob, knob)
    space = KnobSpace.from_section(app_spec.knobs_for(nn), nn=nn)
    fixed = {k: v for k, v in {"dtype": dtype, "prune_ratio": prune_ratio}.items() if v is not None}
    fixed["finetune_steps"] = finetune_steps if finetune_steps is not None else space.choices("finetune_steps")[-1]
    points = _parse(values) if values else _default_values(knob, space)
    _tabulate(app_spec, nn, knob, points, space.base(**fixed), latency=latency, threads=threads, device=device)


@app.command()
def ladder(
    spec: Path = typer.Argument(..., help="The application spec (YAML); approximations.<nn>.pruning.ladder sets the recipe."),
    nn: str = typer.Option(..., "--nn", help="The NN whose pruning ladder to build (a key of the spec's nns)."),
    latency: bool = typer.Option(True, "--latency/--no-latency", help="Time each rung on this machine."),
    threads: int | None = typer.Option(None, help="Threads for timing (default: the spec's target.threads, else 2)."),
    device: str | None = typer.Option(None, "--device", help="Where to train: auto, cpu or cuda (default: the spec's "
                                      "training.device)."),
) -> None:
    """Build (or resume) one NN's pruning ladder and print each rung's error, MACs, parameters and latency.

    The rungs are cached by content: build them where the compute is (``--device cuda``, ``--no-latency``),
    carry the cache folder, and every later run, sweep or search takes its rungs from it.
    """
    app_spec = _spec_with_nn(spec, nn)
    from qaopt.approx import KnobSpace
    from qaopt.approx.passes.pruning import PruningConfig

    space = KnobSpace.from_section(app_spec.knobs_for(nn), nn=nn)
    config = space.configs.get("pruning")
    if not isinstance(config, PruningConfig) or config.ladder is None:
        raise QaoptError(f"{spec}: approximations.{nn}.pruning has no ladder section; add e.g. "
                         "ladder: {step: 0.05, finetune_steps: 160} under it (docs/pruning.md)")
    lo, hi = config.ratios()
    step = config.ladder.step
    rungs = [0.0, *(round(k * step, 6) for k in range(max(1, round(lo / step)), round(hi / step) + 1))]
    _tabulate(app_spec, nn, "prune_ratio", rungs, space.base(), latency=latency, threads=threads, device=device)


def _spec_with_nn(spec: Path, nn: str):
    app_spec = load_spec(spec, check_entry_points=True)
    if nn not in app_spec.nns:
        raise QaoptError(f"--nn {nn}: the spec has no NN named {nn!r}; its NNs are {', '.join(app_spec.nns)}")
    return app_spec


def _tabulate(app_spec, nn: str, knob: str, points: list, base, *, latency: bool, threads: int | None,
              device: str | None) -> None:
    """Build (or load) the candidate of each point along ``knob`` and print the table."""
    from qaopt import kernels
    from qaopt.app_spec.schema import TRAINING_DEVICES
    from qaopt.approx import sweep as sweep_candidates
    from qaopt.measuring import untuned_latency
    from qaopt.on_policy import target_nns
    from qaopt.training import finetune_recipe, training_device

    if device not in (None, *TRAINING_DEVICES):
        raise QaoptError(f"--device {device}: use one of {', '.join(TRAINING_DEVICES)}")
    cache_dir = cache_root(configured=app_spec.output.cache_dir)
    console = Console(width=max(Console().width, 120))  # a narrower table wraps every cell
    training = app_spec.training if device is None else app_spec.training.model_copy(update={"device": device})
    train_on = training_device(training, console.print)
    recipe = finetune_recipe(training, train_on, console.print)
    console.print(f"loading NN {nn!r} and its data")
    target = target_nns(app_spec, cache_dir, [nn])[nn]

    rows = []
    with Progress(
        TextColumn("[bold]{task.fields[point]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=console, transient=True,
    ) as bar:
        task = bar.add_task("", total=len(points), point="")
        candidates = sweep_candidates(
            target, base, knob, points, cache_dir=cache_dir, recipe=recipe,
            backend=kernels.BackendRef.parse(app_spec.target.backend).name, onnx=kernels.onnx, device=train_on,
            progress=lambda m: bar.update(task, description=m),
        )
        for point in points:
            bar.update(task, point=f"{knob}={point}", description="building")
            cand = next(candidates)
            timing = None
            if latency:
                bar.update(task, description="timing")
                timing = untuned_latency(cand, kernels.Target.from_spec(
                    app_spec.target.model_copy(update={"threads": threads or app_spec.target.threads or 2})), cache_dir)
            rows.append((point, cand, timing))
            bar.advance(task)
    console.print(_table(nn, knob, rows))


def _table(nn: str, knob: str, rows: list) -> Table:
    """error ratio, speedup and ideal speedup (MACs ratio) are relative to the first row."""
    first, ref = rows[0][1], rows[0][2]
    table = Table(title=f"{nn}: {knob} sweep (ratios vs the first row)")
    show_dtype = knob != "dtype"
    for col in (knob, *(["dtype"] if show_dtype else []), f"{first.metric} error", "x err", "MMACs", "kparams", "ms", "runtime", "speedup", "ideal", "built"):
        table.add_column(col, justify="right")
    for point, cand, timing in rows:
        runtime, ms = timing if timing else ("-", None)
        table.add_row(
            str(point),
            *([cand.dtype] if show_dtype else []),
            f"{cand.error:.4g}",
            f"{cand.error / first.error:.2f}" if first.error else "-",
            f"{cand.macs / 1e6:.1f}",
            f"{cand.params / 1e3:.1f}",
            f"{ms:.2f}" if ms else "-",
            runtime,
            f"{ref[1] / ms:.2f}x" if ms and ref else "-",
            f"{first.macs / cand.macs:.2f}x",
            "cache" if cand.from_cache else f"{cand.build_seconds:.0f}s",
        )
    return table

