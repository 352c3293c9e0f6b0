"""Train CropFollow's reference NNs (default recipe) and print their validation L1 errors.

    python benchmarks/cropfollow_train_reference.py --backbone compact --device cpu
    python benchmarks/cropfollow_train_reference.py --backbone compact resnet18 --device cuda --out DIR

Without ``--out`` the weights go to the cache (``QAOPT_CACHE_DIR``), where
``reference_nn`` finds them; ``--out simulators/cropfollow/weights`` regenerates the
committed compact weights. Needs no CLI dependencies, so it also runs on a bare GPU box.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from qaopt.simulators.cropfollow.reference import train_reference
from qaopt.simulators.cropfollow.train import Recipe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", nargs="+", default=["compact"], choices=["compact", "resnet18"])
    ap.add_argument("--target", nargs="+", default=["heading", "distance"], choices=["heading", "distance"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=None, help="override the recipe's epochs (changes the weights' key)")
    ap.add_argument("--out", type=Path, default=None, help="write <backbone>-<target>.pt/.json here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for backbone in args.backbone:
        for target in args.target:
            overrides = {} if args.epochs is None else {"epochs": args.epochs}
            last = [0.0]

            def progress(phase: str, done: int, total: int) -> None:
                if time.monotonic() - last[0] > 30 or done == total:
                    last[0] = time.monotonic()
                    print(f"  {backbone}-{target} {phase} {done}/{total}", file=sys.stderr, flush=True)

            out = args.out / f"{backbone}-{target}" if args.out else None
            rows.append(train_reference(target, backbone, device=args.device, out=out, progress=progress, **overrides))
    print(f"torch {torch.__version__}, device {args.device}, {args.threads} CPU threads\n")
    print("| backbone | target | val L1 | train L1 (500 frames) | unit | train frames | val frames | epochs | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        epochs = args.epochs or Recipe().epochs
        print(f"| {r.backbone} | {r.target} | {r.val_l1:.4f} | {r.train_l1:.4f} | {r.unit} | {r.n_train} | {r.n_val} | {epochs} | {r.seconds:.0f} |")


if __name__ == "__main__":
    main()
