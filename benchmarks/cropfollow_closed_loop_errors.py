"""How approximated CropFollow NNs err *in the closed loop*, and whether the robot then stays collision-free.

Calibration injects synthetic errors; this measures what real NNs do when their own
estimates steer the robot: the closed-loop L1, bias, spread, largest error and lag-1
autocorrelation of their residuals at the 10 Hz perception rate, beside the share of
collision-free 100 m runs. It is the ground truth an error model must reproduce.

Two steps, so that the expensive one can run on a machine with many cores:

    # here: export candidates from the approx cache (one ONNX file per NN configuration)
    .venv/bin/python benchmarks/cropfollow_closed_loop_errors.py export --cache examples/.qaopt-cache --out DIR
    # anywhere qaopt is installed: run each configuration in its own process
    python benchmarks/cropfollow_closed_loop_errors.py run --models DIR --seeds 16 --jobs 8 --render-threads 2

The other NN runs as its reference while one is approximated; ``mix`` pairs a pruned
heading NN with a pruned distance NN. Seeds start at 2,000,000, disjoint from the NNs'
training and validation drives and from ``qaopt optimize``'s validation seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

SEED_BASE = 2_000_000
REFERENCE = {"heading": "heading-p0.00-fp32-ft0", "distance": "distance-p0.00-fp32-ft0"}
CONFIGS = {  # name: (heading model, distance model)
    "reference": (REFERENCE["heading"], REFERENCE["distance"]),
    "heading p0.10 int8 ft20": ("heading-p0.10-int8-ft20", REFERENCE["distance"]),
    "heading p0.50 fp32 ft20": ("heading-p0.50-fp32-ft20", REFERENCE["distance"]),
    "heading p0.50 fp32 ft0": ("heading-p0.50-fp32-ft0", REFERENCE["distance"]),
    "distance p0.40 fp32 ft30": (REFERENCE["heading"], "distance-p0.40-fp32-ft30"),
    "distance p0.05 int8 ft10": (REFERENCE["heading"], "distance-p0.05-int8-ft10"),
    "distance p0.60 int8 ft10": (REFERENCE["heading"], "distance-p0.60-int8-ft10"),
    "mix: heading p0.50 ft20 + distance p0.40 ft30": ("heading-p0.50-fp32-ft20", "distance-p0.40-fp32-ft30"),
}


def export(cache: Path, out: Path) -> None:
    """The cached candidates that CONFIGS names, as ONNX (int8: its QDQ graph), with their dataset L1 in index.json."""
    import shutil

    from qaopt import kernels
    from qaopt.app_spec.store import read_json
    from qaopt.approx import Knobs, TargetNN, build
    from qaopt.approx.cache import META_KIND, META_VERSION
    from qaopt.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "examples" / "cropfollow.yaml")
    nns = {n: TargetNN.from_spec(n, spec.nns[n]) for n in spec.nns}
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for meta_file in sorted((cache / "approx" / "candidates").glob("*/candidate.json")):
        meta = read_json(meta_file, META_KIND, META_VERSION)
        if meta is None:  # an entry of an older qaopt: rebuilt by the next build of it
            continue
        k = meta["knobs"]
        name = f'{meta["nn"]}-p{k["prune_ratio"]:.2f}-{k["dtype"]}-ft{k["finetune_steps"]}'
        if name in index or not any(name in pair for pair in CONFIGS.values()):
            continue
        c = build(nns[meta["nn"]], Knobs(**k), cache_dir=cache, onnx=kernels.onnx)
        path = out / f"{name}.onnx"
        if c.onnx_path is not None:
            shutil.copyfile(c.onnx_path, path)
        else:
            kernels.export_onnx(c.module.float().eval(), [nns[meta["nn"]].example_input], path)
        index[name] = {"nn": meta["nn"], "knobs": k, "dataset_l1": meta["error"]}
    (out / "index.json").write_text(json.dumps(index, indent=1))
    print(f"exported {len(index)} candidates to {out}")


def _stats(seqs: list[np.ndarray]) -> dict[str, float]:
    r = np.concatenate(seqs)
    centred = [s - r.mean() for s in seqs]
    den = sum(float(np.dot(c, c)) for c in centred)
    lag1 = sum(float(np.dot(c[:-1], c[1:])) for c in centred) / den if den else 0.0
    return {"l1": float(np.abs(r).mean()), "bias": float(r.mean()), "std": float(r.std()),
            "max_abs": float(np.abs(r).max()), "lag1": lag1}


def _run_config(job: tuple[str, Path, str, str, int, int]) -> dict:
    name, models, heading, distance, seeds, render_threads = job
    from qaopt.kernels.onnx import ort_session
    from qaopt.simulators.cropfollow import CropFollowEvaluator
    from qaopt.simulators.cropfollow.evaluator import FrameSource, run_batch

    files = {"heading": heading, "distance": distance}
    sessions = {t: ort_session(models / f"{f}.onnx", threads=1) for t, f in files.items()}
    evaluator = CropFollowEvaluator(run_length_m=100.0, controller="mpc")
    seed_list = list(range(SEED_BASE, SEED_BASE + seeds))
    camera = FrameSource(evaluator.config, seed_list, render_threads)
    residuals: dict[str, list[list[float]]] = {t: [[] for _ in seed_list] for t in files}

    def estimate(step, batch):
        active = np.flatnonzero(batch.active)
        images = camera.frames(batch, active, step)
        out = []
        for row, t in enumerate(("heading", "distance")):
            s = sessions[t]
            values = s.run(None, {s.get_inputs()[0].name: images})[0].reshape(-1)
            est = batch.truth[row].copy()
            est[active] = values
            for j, i in enumerate(active):
                residuals[t][i].append(float(values[j] - batch.truth[row][i]))
            out.append(est)
        return out[0], out[1]

    start = time.perf_counter()
    records = run_batch(evaluator.config, seed_list, estimate).records(evaluator.config)
    return {"name": name, "heading": heading, "distance": distance, "runs": len(records),
            "collision_free": sum(r["collisions"] == 0 for r in records),
            "collisions": [r["collisions"] for r in records], "wall_s": time.perf_counter() - start,
            **{f"{t}_stats": _stats([np.asarray(s) for s in residuals[t]]) for t in files}}


def run(models: Path, seeds: int, jobs: int, render_threads: int, out: Path) -> None:
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # one process per configuration; no nested thread pools
    index = json.loads((models / "index.json").read_text())
    work = [(name, models, h, d, seeds, render_threads) for name, (h, d) in CONFIGS.items()]
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with ProcessPoolExecutor(jobs) as pool:
        for r in pool.map(_run_config, work):
            results.append(r)
            with open(out / "closed_loop_errors.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
    print(f"{seeds} seeds (from {SEED_BASE}), 100 m runs, MPC; residual statistics over every perception step (10 Hz)\n")
    print("| configuration | collision-free | heading dataset L1 | heading closed-loop L1 / bias / std / max / lag-1 "
          "| distance dataset L1 | distance closed-loop L1 / bias / std / max / lag-1 |")
    print("|---|---|---|---|---|---|")
    for r in results:
        cells = []
        for t in ("heading", "distance"):
            s = r[f"{t}_stats"]
            cells.append(f"{index[r[t]]['dataset_l1']:.3g}")
            cells.append(f"{s['l1']:.3g} / {s['bias']:+.2g} / {s['std']:.3g} / {s['max_abs']:.3g} / {s['lag1']:.2f}")
        print(f"| {r['name']} | {r['collision_free']}/{r['runs']} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export")
    e.add_argument("--cache", type=Path, default=Path("examples/.qaopt-cache"))
    e.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--models", type=Path, required=True)
    r.add_argument("--seeds", type=int, default=16)
    r.add_argument("--jobs", type=int, default=len(CONFIGS))
    r.add_argument("--render-threads", type=int, default=1)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = parser.parse_args()
    if args.command == "export":
        export(args.cache, args.out)
    else:
        run(args.models, args.seeds, args.jobs, args.render_threads, args.out)


if __name__ == "__main__":
    main()
