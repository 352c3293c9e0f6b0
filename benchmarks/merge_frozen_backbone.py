"""A merged CropFollow NN trained on its lead's frozen backbone: how close it gets, and at what cost.

    python benchmarks/merge_frozen_backbone.py [--cache-dir .qaopt-cache] [--shared-steps 3000] [--own-steps 1500]
        [--batch 16] [--threads 2] [--runs 0] [--spec examples/cropfollow.yaml] [--workers 2]
        --json docs/benchmarks/merge_frozen_backbone.json

The product distils a merged NN end to end (:func:`qaopt.approx.merge.merged_target`): every step runs the whole
NN forward and backward on 240x320 frames, 3000 steps for the shipped example, about 7 minutes on a 2-core CPU with
bf16 instructions and 18 on one without. When the lead's backbone is frozen, its features on the training frames can
be computed once, and each step trains only what reads them. This script measures two such designs on the compact
references (distance leads, as in the example's merge group):

- ``shared``: the lead's head with its output layer widened to both NNs' outputs (the product's merged NN, the
  same graph and MACs), trained on the frozen features with the Distiller's loss (half teacher, half label, Huber,
  each output on its own spread), ``--shared-steps`` steps;
- ``own``: the lead's head untouched (distance's outputs are its reference's) and a copy of the heading
  reference's own head reading the lead's features (one backbone, a head per NN: more MACs), ``--own-steps``.

Each reports every member's L1 error on its validation data against its reference's, at checkpoints of its cosine
schedule, and the seconds spent on the features and on training. With ``--runs N`` each design's merged NN (fp32,
full resolution) then drives ``--spec``'s simulator in the closed loop on the N seeds validation draws (those of
``merge_distillation.json``'s rows), judged with the spec's acceptance test on that fixed set. Writes ``--json``:
the machine, the date, the command and both designs' rows.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from merge_distillation import BLOCK, run_block  # noqa: E402  (the same closed-loop blocks as its rows)


class FrozenMerged(nn.Module):
    """The lead's backbone and one or more heads reading its features; ``members`` maps each NN to (head, column,
    scale, shift): its output is ``heads[head](features)[:, column] * scale + shift``, in its own unit."""

    def __init__(self, lead: nn.Module, heads: list[nn.Module], members: dict[str, tuple[int, int, float, float]]):
        super().__init__()
        self.backbone, self.heads, self.members = lead.backbone, nn.ModuleList(heads), members
        self.register_buffer("image_mean", lead.image_mean.clone())
        self.register_buffer("image_std", lead.image_std.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.backbone((x - self.image_mean) / self.image_std)
        outs = [head(features) for head in self.heads]
        return torch.stack([outs[h][:, c] * s + b for h, c, s, b in self.members.values()], dim=1)


def _predict(module: nn.Module, column: int, x):
    from qaopt.approx.quantize import predict_torch

    return predict_torch(module, x)[:, [column]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", type=Path, default=Path("examples/.qaopt-cache"))
    ap.add_argument("--shared-steps", type=int, default=3000)
    ap.add_argument("--own-steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=0, help="closed-loop runs of each design's merged NN (0: none)")
    ap.add_argument("--spec", type=Path, default=Path("examples/cropfollow.yaml"), help="its simulator and QoS goal")
    ap.add_argument("--workers", type=int, default=2, help="processes running the closed-loop runs")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    import numpy as np

    from qaopt.simulators.cropfollow.dataset import reference_dataset
    from qaopt.simulators.cropfollow.reference import reference_nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lead = reference_nn("distance", "compact", cache_dir=args.cache_dir).eval()
    other = reference_nn("heading", "compact", cache_dir=args.cache_dir).eval()
    data = {n: reference_dataset(n, cache_dir=args.cache_dir) for n in ("distance", "heading")}
    frames_train, frames_val = data["heading"].x_train, data["heading"].x_val  # both targets share the frames
    y = {n: {s: torch.from_numpy(np.asarray(getattr(d, f"y_{s}"), np.float32))[:, 0] for s in ("train", "val")}
         for n, d in data.items()}

    def batched(fn, frames) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([fn(torch.from_numpy(np.asarray(frames[i:i + 64], np.float32)))
                              for i in range(0, len(frames), 64)])

    start = time.perf_counter()
    backbone = lambda x: lead.backbone((x - lead.image_mean) / lead.image_std)  # noqa: E731
    feats = {"train": batched(backbone, frames_train), "val": batched(backbone, frames_val)}
    features_s = time.perf_counter() - start
    teacher = {"distance": batched(lead, frames_train)[:, 0], "heading": batched(other, frames_train)[:, 0]}
    reference = {"distance": batched(lead, frames_val)[:, 0], "heading": batched(other, frames_val)[:, 0]}
    ref_l1 = {n: float((reference[n] - y[n]["val"]).abs().mean()) for n in y}
    print(f"features {tuple(feats['train'].shape)} in {features_s:.1f} s; references' L1 {ref_l1}", flush=True)

    def shared_head():
        head = copy.deepcopy(lead.head)
        old, new = head[-1], torch.nn.Linear(head[-1].in_features, 2)
        with torch.no_grad():
            new.weight[0], new.bias[0] = old.weight[0], old.bias[0]
        head[-1] = new
        spread = float(y["heading"]["train"].std())

        def outputs(f):
            out = head(f)
            return {"distance": out[:, 0] * lead.out_scale + lead.out_offset, "heading": out[:, 1] * spread}
        merged = FrozenMerged(lead, [head], {"distance": (0, 0, float(lead.out_scale), float(lead.out_offset)),
                                             "heading": (0, 1, spread, 0.0)})
        return head, outputs, merged

    def own_head():
        head = copy.deepcopy(other.head)

        def outputs(f):
            with torch.no_grad():
                distance = lead.head(f)[:, 0] * lead.out_scale + lead.out_offset
            return {"distance": distance, "heading": head(f)[:, 0] * other.out_scale + other.out_offset}
        merged = FrozenMerged(lead, [lead.head, head], {
            "distance": (0, 0, float(lead.out_scale), float(lead.out_offset)),
            "heading": (1, 0, float(other.out_scale), float(other.out_offset))})
        return head, outputs, merged

    rows = []
    for design, steps, make in (("shared", args.shared_steps, shared_head), ("own", args.own_steps, own_head)):
        torch.manual_seed(0)
        head, outputs, merged = make()
        rows.append(train(design, head, outputs, feats, y, teacher, ref_l1, steps, args.batch))
        if args.runs:
            rows[-1]["closed_loop"] = closed_loop(merged.eval(), args)

    out = {
        **prov, "torch": torch.__version__, "threads": args.threads,
        "lead": "distance", "frames": {"train": len(frames_train), "val": len(frames_val)},
        "features_s": round(features_s, 1), "reference_l1": ref_l1, "designs": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


def closed_loop(merged: nn.Module, args: argparse.Namespace) -> dict:
    """``args.runs`` closed-loop runs of ``merged`` serving both NNs, on the seeds validation draws."""
    from qaopt.app_spec import load
    from qaopt.closed_loop import VALIDATION_SEED_BASE
    from qaopt.spec_adapter import acceptance_of, goal_of

    spec = load(args.spec)
    params = {"entry_point": spec.evaluator.simulator.entry_point, "params": dict(spec.evaluator.simulator.params)}
    nns = {name: partial(_predict, merged, i) for i, name in enumerate(merged.members)}
    seeds = [VALIDATION_SEED_BASE + i for i in range(args.runs)]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        blocks = [pool.submit(run_block, params, nns, seeds[b:b + BLOCK]) for b in range(0, len(seeds), BLOCK)]
        records = [r for f in blocks for r in f.result()]
    goal = goal_of(spec)
    failed = [i for i, r in enumerate(records) if not goal.passes(r[goal.metric])]
    verdict = acceptance_of(spec).decide_fixed(len(failed), len(records)).value
    print(f"closed loop: {len(failed)}/{len(records)} runs failed {failed} -> {verdict}", flush=True)
    return {"runs": len(records), "failures": len(failed), "failed_runs": failed, "verdict": verdict,
            "loop_s": round(time.perf_counter() - start, 1)}


def train(design, head, outputs, feats, y, teacher, ref_l1, steps: int, batch: int) -> dict:
    """``steps`` AdamW steps of the Distiller's loss on the frozen features, evaluated at five checkpoints."""
    import torch.nn.functional as F

    names = ("distance", "heading")
    spread = {n: float(y[n]["train"].std()) for n in names}
    opt = torch.optim.AdamW(head.parameters(), lr=5e-4)
    generator = torch.Generator().manual_seed(0)
    checkpoints, start, n = [], time.perf_counter(), len(feats["train"])
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = 5e-4 * 0.5 * (1 + math.cos(math.pi * step / steps))
        head.train()
        idx = torch.randint(0, n, (batch,), generator=generator)
        out = outputs(feats["train"][idx])
        loss = sum(0.5 * F.huber_loss(out[m] / spread[m], teacher[m][idx] / spread[m], delta=0.1)
                   + 0.5 * F.huber_loss(out[m] / spread[m], y[m]["train"][idx] / spread[m], delta=0.1)
                   for m in names if out[m].requires_grad)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % max(1, steps // 5) == 0 or step + 1 == steps:
            head.eval()
            with torch.no_grad():
                pred = outputs(feats["val"])
            l1 = {m: float((pred[m] - y[m]["val"]).abs().mean()) for m in names}
            checkpoints.append({"step": step + 1, "seconds": round(time.perf_counter() - start, 1), "l1": l1,
                                "over_reference": {m: round(l1[m] / ref_l1[m], 3) for m in names}})
            print(f"{design} step {step + 1}/{steps}: {checkpoints[-1]}", flush=True)
    return {"design": design, "steps": steps, "batch": batch, "checkpoints": checkpoints}


def _cpu() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
        name = next(line for line in open("/proc/cpuinfo") if line.startswith("model name")).split(":", 1)[1].strip()
    except (OSError, StopIteration):
        return platform.processor()
    return f"{name} ({', '.join(f for f in ('avx2', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'amx_bf16') if f in flags)})"


if __name__ == "__main__":
    main()
