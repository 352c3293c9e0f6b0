"""Closed-loop runs per CPU-second: one run per call against a block of runs in lock-step (as validation runs them).

    python benchmarks/closed_loop_throughput.py [RUN_DIR] [--runs 8] [--length 20]

Times, in this process pinned to one core with torch on one thread, the CropFollow reference pair in torch eager
fp32 (as validation runs a float NN) and, given a run folder, that run's aware choice from its exported artifacts
(``RUN_DIR/artifacts``: the bytes the run validated), each NN shipped as validation ships it
(:class:`qaopt.executor.ShippedNN`: an int8 NN's ONNX graph on ONNX Runtime, a merged NN's views sharing one
backbone run per frame batch, a float NN's torch module). Each configuration runs the same
``--runs`` seeded episodes of ``--length`` metres twice: once as one ``evaluate_perception`` call per seed, once as
one call for all of them, the drives in lock-step and each NN reading one batch of frames per step. It also splits a
step's cost: rendering one frame, and each NN on one frame and on a batch of ``--runs`` frames. Writes
``docs/benchmarks/closed_loop_throughput.json``: per configuration the runs per CPU-second of both paths, their
ratio, whether both paths gave every seed the same outcome, and the split; ``speedup`` is the smaller ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from provenance import provenance

ROOT = Path(__file__).resolve().parent.parent


def _cpu(call) -> float:
    started = time.process_time()
    call()
    return time.process_time() - started


def _split(app, nns: dict, seeds: list[int], repeats: int = 20) -> dict:
    """Median CPU milliseconds of rendering one frame and of each NN on one frame and on a batch of len(seeds)."""
    from qaopt.simulators.cropfollow.evaluator import Batch

    camera = app._camera(seeds, 1)
    batch = Batch.start(app.config, seeds)
    which = np.arange(len(seeds))
    render = [_cpu(lambda: camera.frames(batch, which[:1], 0)) for _ in range(repeats)]
    frames = camera.frames(batch, which, 0).copy()
    split = {"render_ms_per_frame": round(1e3 * statistics.median(render), 3)}
    for name, nn in nns.items():
        nn(frames[:1])  # warm-up: session opened, kernels chosen
        one = [_cpu(lambda: nn(frames[:1].copy())) for _ in range(repeats)]
        many = [_cpu(lambda: nn(frames.copy())) for _ in range(max(3, repeats // 4))]
        split[name] = {"ms_batch_1": round(1e3 * statistics.median(one), 3),
                       f"ms_per_frame_batch_{len(seeds)}": round(1e3 * statistics.median(many) / len(seeds), 3)}
    return split


def from_artifacts(run_dir: Path) -> dict:
    """The aware choice of the run in ``run_dir`` as validation ships it, from the artifacts the run exported."""
    import hashlib
    from types import SimpleNamespace

    import torch

    from qaopt.executor import ShippedNN

    nns = {}
    for folder in sorted((run_dir / "artifacts").iterdir()):
        data = json.loads((folder / "artifact.json").read_text())["data"]
        onnx = folder / "model.onnx" if data["runs"] == "onnx" else None
        module = None if onnx is not None else torch.load(folder / "module.pt", weights_only=False).eval()
        # The views of one merged NN share its backbone's run when their keys match: the key is the graph's bytes.
        key = hashlib.sha256(onnx.read_bytes()).hexdigest() if onnx is not None else folder.name
        nns[folder.name] = ShippedNN(SimpleNamespace(key=key, nn=folder.name, module=module, onnx_path=onnx,
                                                     columns=data.get("columns")))
    return nns


def measure(app, nns: dict, seeds: list[int]) -> dict:
    app.evaluate_perception(nns, [seeds[0] - 1])  # warm-up: kernels compiled, sessions opened
    single: list[dict] = []
    old = _cpu(lambda: single.extend(app.evaluate_perception(nns, [s])[0] for s in seeds))
    batched: list[dict] = []
    new = _cpu(lambda: batched.extend(app.evaluate_perception(nns, seeds)))
    return {
        "old_runs_per_cpu_s": round(len(seeds) / old, 4),
        "new_runs_per_cpu_s": round(len(seeds) / new, 4),
        "old_cpu_s": round(old, 2),
        "new_cpu_s": round(new, 2),
        "speedup": round(old / new, 3),
        "same_outcomes": single == batched,
        "split": _split(app, nns, seeds),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, nargs="?")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--length", type=float, default=20.0, help="metres per run")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "closed_loop_throughput.json")
    args = ap.parse_args()
    before = provenance()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    import torch

    from qaopt.closed_loop import VALIDATION_SEED_BASE
    from qaopt.simulators.cropfollow import CropFollowEvaluator, reference_nn
    from qaopt.simulators.perception import torch_perception

    torch.set_num_threads(1)
    app = CropFollowEvaluator(run_length_m=args.length)
    seeds = [VALIDATION_SEED_BASE + i for i in range(args.runs)]
    configurations = {"reference": {t: torch_perception(reference_nn(t, "compact", train_if_missing=False), "cpu",
                                                        args.runs) for t in ("heading", "distance")}}
    if args.run_dir is not None:
        configurations["aware"] = from_artifacts(args.run_dir)
    rows = {}
    for name, nns in configurations.items():
        rows[name] = measure(app, nns, seeds)
        print(name, json.dumps(rows[name]), flush=True)
    out = {
        **before,
        "runs": args.runs,
        "length_m": args.length,
        "configurations": rows,
        "speedup": min(r["speedup"] for r in rows.values()),
        "goal": 5.0,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"speedup {out['speedup']:.2f} (goal {out['goal']:g}) -> {args.out}")


if __name__ == "__main__":
    main()
