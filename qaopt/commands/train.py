"""``qaopt train``: train the example application's reference perception NNs.

Trains CropFollow's heading and distance NNs from the simulator's own labelled
frames (generated and cached on first use), stores the weights under the content
hash of their recipe, where ``reference_nn`` finds them, and prints the
validation report. ``--package`` regenerates the weights shipped in the package.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

TARGETS = ("heading", "distance")


def train(
    target: str = typer.Option("all", "--target", help="heading, distance or all."),
    backbone: str = typer.Option("compact", "--backbone", help="compact or resnet18."),
    device: str = typer.Option("cpu", "--device", help="torch device to train on (cpu, cuda)."),
    threads: int = typer.Option(2, "--threads", min=1, help="CPU threads for torch."),
    epochs: int | None = typer.Option(None, "--epochs", min=1, help="Override the recipe's epochs (16)."),
    train_frames: int | None = typer.Option(None, "--train-frames", min=1, help="Override the number of training frames (3000)."),
    val_drives: int | None = typer.Option(None, "--val-drives", min=1, help="Override the number of validation drives (16)."),
    val_frames: int | None = typer.Option(None, "--val-frames", min=2, help="Override the frames per validation drive (40)."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Cache root (default $QAOPT_CACHE_DIR or .qaopt-cache)."),
    package: bool = typer.Option(False, "--package", help="Write the weights into the installed package (maintainers)."),
) -> None:
    """Train CropFollow's reference NNs and report their validation L1 error.

    The default recipe is the one behind the shipped compact weights; training is
    deterministic for a given device and torch build. Overrides make another recipe,
    stored under its own hash (``reference_nn`` with the same overrides loads it).
    """
    import torch

    from qaopt.simulators.cropfollow.errors import CropFollowParamError
    from qaopt.simulators.cropfollow.reference import PACKAGE_WEIGHTS, train_reference

    if target not in (*TARGETS, "all"):
        raise CropFollowParamError("target", f"{target!r}: use heading, distance or all")
    dataset = {k: v for k, v in (("n_train", train_frames), ("val_drives", val_drives), ("val_frames_per_drive", val_frames)) if v is not None}
    recipe = {k: v for k, v in (("epochs", epochs), ("dataset", dataset)) if v}
    if package and recipe:
        raise CropFollowParamError("package", "the packaged weights use the default recipe; drop --epochs/--train-frames/--val-* or --package")
    torch.set_num_threads(threads)
    console = Console(stderr=True)
    reports = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bars:
        for name in TARGETS if target == "all" else (target,):
            tasks: dict[str, int] = {}

            def progress(phase: str, done: int, total: int, name: str = name) -> None:
                if phase not in tasks:
                    label = "frames" if phase == "data" else "steps"
                    tasks[phase] = bars.add_task(f"{backbone}-{name} {phase} ({label})", total=total)
                bars.update(tasks[phase], completed=done)

            out = PACKAGE_WEIGHTS / f"{backbone}-{name}" if package else None
            reports.append(train_reference(name, backbone, cache_dir=cache_dir, device=device, out=out, progress=progress, **recipe))
    table = Table(title="validation")
    for col in ("NN", "val L1", "train L1", "unit", "train frames", "val frames", "seconds"):
        table.add_column(col)
    for r in reports:
        table.add_row(f"{r.backbone}-{r.target}", f"{r.val_l1:.4f}", f"{r.train_l1:.4f}", r.unit, str(r.n_train), str(r.n_val), f"{r.seconds:.0f}")
    Console().print(table)
