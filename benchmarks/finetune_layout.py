"""Fine-tuning steps in the default and the channels-last memory layout (what :class:`qaopt.approx.finetune.Distiller`
trains in).

    python benchmarks/finetune_layout.py [--backbone compact] [--batch 16] [--steps 20] [--repeats 3] [--threads 2]

For CropFollow's NavNet (``--backbone``) with a widened two-output head, as a merged NN is, the script times
``--steps`` distillation steps (AdamW, the Distiller's Huber loss, random frames of 240x320) in the default layout
(a loop written here, what the Distiller did before) and through the product's own ``Distiller.run`` (channels-last),
each in ``--repeats`` fresh processes, interleaved, on ``--threads`` torch threads. Prints one JSON line per process
and a summary: the median ms per step of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

LAYOUTS = ("default", "distiller")


def one(layout: str, backbone: str, batch: int, steps: int, threads: int) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from qaopt.approx.finetune import Distiller, FinetuneRecipe
    from qaopt.simulators.cropfollow.nets import NavNet

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = NavNet("heading", backbone)
    model.head[-1] = torch.nn.Linear(64, 2)  # one output per NN of the merged pair
    n = 4 * batch
    x = np.random.default_rng(0).random((n, 3, 240, 320), dtype=np.float32)
    labels = np.random.default_rng(1).random((n, 2), dtype=np.float32)
    recipe = FinetuneRecipe(batch_size=batch)
    distiller = Distiller(x, labels, lambda: labels, recipe, seed=0)
    warmup = 3
    if layout == "distiller":
        distiller.run(model, warmup)
        start = time.perf_counter()
        distiller.run(model, steps)
    else:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr)

        def step() -> None:
            xb, yb, tb = distiller.batch()
            out = model(xb)
            loss = 0.5 * F.huber_loss(out, tb, delta=0.1) + 0.5 * F.huber_loss(out, yb, delta=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        for _ in range(warmup):
            step()
        start = time.perf_counter()
        for _ in range(steps):
            step()
    return {"layout": layout, "ms_per_step": round((time.perf_counter() - start) * 1000 / steps, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="compact", choices=("compact", "resnet18"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", choices=LAYOUTS, help=argparse.SUPPRESS)  # a single fresh process's measurement
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.backbone, args.batch, args.steps, args.threads)))
        return
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    rows: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for _ in range(args.repeats):
        for layout in LAYOUTS:
            out = subprocess.run([sys.executable, __file__, "--one", layout, "--backbone", args.backbone, "--batch",
                                  str(args.batch), "--steps", str(args.steps), "--threads", str(args.threads)],
                                 capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows[layout].append(row["ms_per_step"])
            print(json.dumps(row), flush=True)
    medians = {layout: statistics.median(v) for layout, v in rows.items()}
    print(json.dumps({**prov, "backbone": args.backbone,
                      "batch": args.batch, "threads": args.threads, "median_ms_per_step": medians,
                      "default_over_distiller": round(medians["default"] / medians["distiller"], 2)}))


if __name__ == "__main__":
    main()
