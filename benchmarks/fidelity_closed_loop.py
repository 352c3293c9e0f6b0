"""Fidelity ground truth (issue #13), part 1: real approximated CropFollow NNs in the closed loop.

    python benchmarks/fidelity_closed_loop.py [--runs 48] [--workers 16] [--device cuda] --out DIR

For each of CONFIGURATIONS (a heading and a distance NN variant: pruning 0-0.9, fp32/bf16/int8,
short and long fine-tuning, pairs that mix) it

1. builds both NNs through ``qaopt.approx.build`` (fine-tuning on ``--device``) from the shipped
   example spec (``examples/cropfollow.yaml``);
2. measures each NN where the product measures it (``qaopt.on_policy.target_nns``: the example's
   on-policy drives, steered by the reference NNs), on its dataset's validation drives, and on each of
   the spec's stress strata (``calibration.error_data.stress``, :mod:`qaopt.stress`), keeping the
   on-policy residual and truth sequences;
3. runs the configuration closed-loop with its NNs reading the rendered frames: ``--runs`` seeded
   runs of the spec's 100 m (the seeds ``qaopt optimize``'s validation uses), in blocks of 8 on a
   process pool, the NNs on the GPU (int8 graphs on ONNX Runtime, one CPU thread each), and judges
   them with the spec's acceptance test on the fixed set of runs.

Writes ``DIR/fidelity_truth.json`` (per configuration: knobs, errors, runs, failures, verdict, each run's
QoS metric in seed order), ``DIR/variants.json`` (each NN variant's errors, as soon as they are built) and
``DIR/fidelity_residuals.npz`` (per NN variant: on-policy residual and truth sequences). Resumable:
each finished configuration is kept in ``DIR/closed_loop/<id>.json`` and skipped on a re-run.
``benchmarks/fidelity.py`` reads these files and compares the error models' regions with them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from qaopt.executor import ShippedNN

REPO = Path(__file__).resolve().parents[1]
BLOCK = 8

# NN variants: knobs on top of the spec's fixed settings (importance, round_to, ...).
HEADING = {
    "h-ref": {},
    "h-bf16": {"dtype": "bf16"},
    "h-int8": {"dtype": "int8"},
    "h-p30-ft100": {"prune_ratio": 0.3, "finetune_steps": 100},
    "h-p50-ft100": {"prune_ratio": 0.5, "finetune_steps": 100},
    "h-p50-ft400": {"prune_ratio": 0.5, "finetune_steps": 400},
    "h-p70-ft100": {"prune_ratio": 0.7, "finetune_steps": 100},
    "h-p70-ft400": {"prune_ratio": 0.7, "finetune_steps": 400},
    "h-p90-ft400": {"prune_ratio": 0.9, "finetune_steps": 400},
    "h-p30-ft100-int8": {"prune_ratio": 0.3, "finetune_steps": 100, "dtype": "int8"},
    "h-p50-ft400-int8": {"prune_ratio": 0.5, "finetune_steps": 400, "dtype": "int8"},
    # the resolution knob (issue 30), fine-tuned as the quick profile caps it
    "h-s75-int8": {"input_scale": 0.75, "dtype": "int8", "finetune_steps": 160},
    "h-s50-int8": {"input_scale": 0.5, "dtype": "int8", "finetune_steps": 160},
    "h-s375-int8": {"input_scale": 0.375, "dtype": "int8", "finetune_steps": 160},
}
DISTANCE = {
    "d-ref": {},
    "d-bf16": {"dtype": "bf16"},
    "d-int8": {"dtype": "int8"},
    "d-p30-ft100": {"prune_ratio": 0.3, "finetune_steps": 100},
    "d-p50-ft100": {"prune_ratio": 0.5, "finetune_steps": 100},
    "d-p50-ft400": {"prune_ratio": 0.5, "finetune_steps": 400},
    "d-p70-ft100": {"prune_ratio": 0.7, "finetune_steps": 100},
    "d-p70-ft400": {"prune_ratio": 0.7, "finetune_steps": 400},
    "d-p90-ft400": {"prune_ratio": 0.9, "finetune_steps": 400},
    "d-p50-ft400-int8": {"prune_ratio": 0.5, "finetune_steps": 400, "dtype": "int8"},
    "d-s75-int8": {"input_scale": 0.75, "dtype": "int8", "finetune_steps": 160},
    "d-s50-int8": {"input_scale": 0.5, "dtype": "int8", "finetune_steps": 160},
    "d-s375-int8": {"input_scale": 0.375, "dtype": "int8", "finetune_steps": 160},
}
CONFIGURATIONS = [
    ("h-ref", "d-ref"), ("h-bf16", "d-bf16"), ("h-int8", "d-int8"), ("h-int8", "d-ref"), ("h-ref", "d-int8"),
    ("h-p30-ft100", "d-ref"), ("h-p50-ft100", "d-ref"), ("h-p50-ft400", "d-ref"), ("h-p70-ft100", "d-ref"),
    ("h-p70-ft400", "d-ref"), ("h-p90-ft400", "d-ref"), ("h-p50-ft400-int8", "d-ref"),
    ("h-ref", "d-p30-ft100"), ("h-ref", "d-p50-ft100"), ("h-ref", "d-p50-ft400"), ("h-ref", "d-p70-ft100"),
    ("h-ref", "d-p70-ft400"), ("h-ref", "d-p90-ft400"), ("h-ref", "d-p50-ft400-int8"),
    ("h-p30-ft100", "d-p30-ft100"), ("h-p50-ft100", "d-p50-ft100"), ("h-p50-ft400", "d-p50-ft400"),
    ("h-p70-ft400", "d-p70-ft400"), ("h-p30-ft100-int8", "d-p50-ft400-int8"), ("h-p50-ft400-int8", "d-int8"),
    # 25-31: the resolution knob, both NNs scaled alike, then one NN at a time beside the other's plain int8
    ("h-s75-int8", "d-s75-int8"), ("h-s50-int8", "d-s50-int8"), ("h-s375-int8", "d-s375-int8"),
    ("h-s50-int8", "d-int8"), ("h-int8", "d-s50-int8"), ("h-s75-int8", "d-int8"), ("h-int8", "d-s75-int8"),
]


class InLoopNN(ShippedNN):
    """A candidate as a picklable perception callable, its torch module on ``device`` (int8 graphs stay on
    ONNX Runtime on one CPU thread, as :class:`qaopt.executor.ShippedNN` runs them)."""

    def __init__(self, candidate, device: str):
        super().__init__(candidate)
        self.device = device

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "device": self.device}

    def __call__(self, x):
        if self.module is None:
            return super().__call__(x)
        import torch

        module = self.module.to(self.device)
        with torch.inference_mode():
            x = torch.from_numpy(np.asarray(x, dtype=np.float32)).to(self.device, next(module.parameters()).dtype)
            return module(x).float().cpu().numpy()


def cpu_model() -> str:
    """The host CPU's model name (its cores run the simulator and, for int8, the NNs)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                platform.processor())


def run_block(params: dict, nns: dict, seeds: list[int]) -> list[dict]:
    """One block of closed-loop runs on a worker (the simulator built there from the spec's params)."""
    import torch

    from qaopt.simulators.cropfollow import CropFollowEvaluator

    torch.set_num_threads(1)
    return CropFollowEvaluator(**params).evaluate_perception(nns, seeds)


def build_variants(spec, cache: Path, device: str, names: set[str], variant_seed: int, log) -> tuple[dict, dict]:
    """The NN variants ``names`` built (fine-tuned under ``variant_seed``), with their on-policy, dataset and
    stress-stratum errors and on-policy sequences."""
    from qaopt import kernels
    from qaopt.approx import KnobSpace, TargetNN, build
    from qaopt.on_policy import target_nns
    from qaopt.stress import record_stress

    t0 = time.perf_counter()
    recording = spec.calibration.error_data.model_copy(update={"source": "on-policy"})  # whatever the spec says
    on_policy = target_nns(spec.model_copy(update={"calibration": spec.calibration.model_copy(
        update={"error_data": recording})}), cache)
    log(f"on-policy drives recorded/read in {time.perf_counter() - t0:.0f} s")
    dataset = {n: TargetNN.from_spec(n, spec.nns[n]) for n in spec.nns}
    t0 = time.perf_counter()
    stress = record_stress(spec, {n: t.model for n, t in dataset.items()}, {n: t.fingerprint for n, t in dataset.items()},
                           cache)
    if stress is not None:
        log(f"stress strata {', '.join(stress.strata)} recorded/read in {time.perf_counter() - t0:.0f} s")
    variants, sequences = {}, {}
    for nn, table in (("heading", HEADING), ("distance", DISTANCE)):
        space = KnobSpace.from_section(spec.knobs_for(nn), nn=nn)
        target = on_policy[nn]
        column = target.metric.column
        truth = np.asarray(target.data.y_val)[:, column]
        for name, knobs in table.items():
            if name not in names:
                continue
            t = time.perf_counter()
            cand = build(target, space.base(**knobs, seed=variant_seed), cache_dir=cache, device=device,
                         onnx=kernels.onnx)
            shipped = InLoopNN(cand, device)
            pred = np.asarray(shipped(dataset[nn].data.x_val))
            ds_error = dataset[nn].metric(pred, np.asarray(dataset[nn].data.y_val))
            strata = {} if stress is None else stress.errors(nn, shipped, target.metric)
            variants[name] = {"nn": nn, "knobs": knobs, "seed": variant_seed, "candidate": cand.key,
                              "on_policy_error": cand.error, "dataset_error": float(ds_error), "strata": strata,
                              "macs": cand.macs, "params": cand.params,
                              "build_s": round(time.perf_counter() - t, 1), "cand": cand}
            for i, (res, seq) in enumerate(zip(cand.residuals, target.data.val_sequences)):
                sequences[f"{name}/residual/{i}"] = np.asarray(res)
                sequences[f"{name}/truth/{i}"] = truth[np.asarray(seq)]
            log(f"{name}: on-policy L1 {cand.error:.4g}, dataset L1 {ds_error:.4g}"
                + "".join(f", {k} L1 {v:.4g}" for k, v in strata.items()) + f" ({variants[name]['build_s']} s)")
    return variants, sequences


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "cropfollow.yaml")
    ap.add_argument("--runs", type=int, default=48)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu", help="where fine-tuning and the float NNs in the loop run")
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: the spec's cache")
    ap.add_argument("--only", default=None, help="comma-separated configuration indices")
    ap.add_argument("--variant-seed", type=int, default=0,
                    help="fine-tuning seed of every variant (0: the first set; another: a new set of the same knobs)")
    ap.add_argument("--length", type=float, default=None, help="override the run length (smoke tests only)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from qaopt.closed_loop import VALIDATION_SEED_BASE
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import acceptance_of, cache_dir_of, goal_of

    spec = load_spec(args.spec)
    cache = args.cache_dir or cache_dir_of(spec)
    args.out.mkdir(parents=True, exist_ok=True)
    done_dir = args.out / "closed_loop"
    done_dir.mkdir(exist_ok=True)
    log_file = open(args.out / "fidelity_log.txt", "a")

    def log(message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    chosen = range(len(CONFIGURATIONS)) if args.only is None else [int(i) for i in args.only.split(",")]
    start = time.perf_counter()
    variants, sequences = build_variants(spec, cache, args.device, {v for i in chosen for v in CONFIGURATIONS[i]},
                                         args.variant_seed, log)
    np.savez_compressed(args.out / "fidelity_residuals.npz", **sequences)
    (args.out / "variants.json").write_text(json.dumps(
        {n: {k: v for k, v in var.items() if k != "cand"} for n, var in variants.items()}, indent=1))
    build_s = time.perf_counter() - start

    params = dict(spec.evaluator.simulator.params)
    if args.length is not None:
        params["run_length_m"] = args.length
    goal, test = goal_of(spec), acceptance_of(spec)
    seeds = [VALIDATION_SEED_BASE + i for i in range(args.runs)]
    pending = {}
    shipped = {n: InLoopNN(v["cand"], args.device) for n, v in variants.items()}
    loop_start = time.perf_counter()
    with ProcessPoolExecutor(args.workers, mp_context=__import__("multiprocessing").get_context("spawn")) as pool:
        futures = {}
        for i in chosen:
            if (done_dir / f"{i}.json").exists():
                continue
            h, d = CONFIGURATIONS[i]
            nns = {"heading": shipped[h], "distance": shipped[d]}
            pending[i] = {}
            for b in range(0, len(seeds), BLOCK):
                futures[pool.submit(run_block, params, nns, seeds[b : b + BLOCK])] = (i, b)
        for fut in as_completed(futures):
            i, b = futures[fut]
            pending[i][b] = fut.result()
            if len(pending[i]) * BLOCK >= len(seeds):
                records = [r for k in sorted(pending[i]) for r in pending[i][k]]
                failures = sum(not goal.passes(r[goal.metric]) for r in records)
                h, d = CONFIGURATIONS[i]
                row = {"id": i, "heading": h, "distance": d, "runs": len(records), "failures": failures,
                       "verdict": test.decide_fixed(failures, len(records)).value,
                       "mean_distance_m": float(np.mean([r["distance_m"] for r in records])),
                       "qos": [float(r[goal.metric]) for r in records]}  # per run, in seed order: replayable
                (done_dir / f"{i}.json").write_text(json.dumps(row))
                log(f"configuration {i} {h} + {d}: {failures}/{len(records)} failed -> {row['verdict']}")
    loop_s = time.perf_counter() - loop_start

    rows = [json.loads((done_dir / f"{i}.json").read_text()) for i in chosen if (done_dir / f"{i}.json").exists()]
    import torch

    out = {
        "machine": {"cpu_count": os.cpu_count(), "cpu": cpu_model(), "platform": platform.platform(),
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "date": time.strftime("%Y-%m-%d"),
        "spec": str(args.spec.relative_to(REPO)) if args.spec.is_relative_to(REPO) else str(args.spec),
        "runs_per_configuration": args.runs, "run_length_m": params["run_length_m"],
        "acceptance": spec.qos.acceptance.model_dump(), "qos": {"metric": goal.metric, "max": goal.max},
        "on_policy": spec.calibration.error_data.model_dump(), "variant_seed": args.variant_seed,
        "seconds": {"build_and_measure": round(build_s, 1), "closed_loop": round(loop_s, 1)},
        "variants": {n: {k: v for k, v in var.items() if k != "cand"} for n, var in variants.items()},
        "configurations": rows,
    }
    (args.out / "fidelity_truth.json").write_text(json.dumps(out, indent=1))
    log(f"done: {len(rows)} configurations, build {build_s:.0f} s, closed loop {loop_s:.0f} s")


if __name__ == "__main__":
    main()
