"""Fidelity ground truth, part 1: real approximated NNs in the closed loop.

    python benchmarks/fidelity_closed_loop.py [--spec examples/lanekeep.yaml] [--runs 48] [--workers 16]
                                              [--device cuda] --out DIR

For each configuration of the spec's application (:data:`CONFIGURATIONS`: one variant of each NN of
:data:`VARIANTS`, pruning 0-0.9, fp32/bf16/int8, input scales, short and long fine-tuning, mixes;
CropFollow's heading and distance NNs, LaneKeep's lane, stop-sign and lead NNs) it

1. builds each NN through ``qaopt.approx.build`` (fine-tuning on ``--device``) from the shipped
   example spec (``examples/cropfollow.yaml`` by default), every NN's reference among them whichever
   configurations run (the stressed coordinate compares a variant with the reference on the same recording);
2. measures each NN where the product measures it (``qaopt.on_policy.target_nns``: the example's
   on-policy drives, steered by the reference NNs), on its dataset's validation drives, and on each of
   the spec's stress strata (``calibration.error_data.stress``, :mod:`qaopt.stress`), keeping the
   on-policy residual and truth sequences;
3. runs the configuration closed-loop with its NNs reading the rendered frames: ``--runs`` seeded
   runs of the spec's simulator (the seeds ``qaopt optimize``'s validation uses), in blocks of 8 on a
   process pool, the NNs on the GPU (int8 graphs on ONNX Runtime, one CPU thread each), and judges
   them with the spec's acceptance test on the fixed set of runs.

Writes ``DIR/fidelity_truth.json`` (per configuration: knobs, errors, runs, failures, verdict, each run's
QoS metric in seed order), ``DIR/variants.json`` (each NN variant's errors, as soon as they are built) and
``DIR/fidelity_residuals.npz`` (per NN variant: on-policy residual and truth sequences, ``<variant>/residual/<drive>``
and ``<variant>/truth/<drive>``, and the same on each stress stratum, ``<variant>/<stratum>/residual/<drive>``). Resumable:
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
from collections.abc import Callable
from pathlib import Path

import numpy as np

from qaopt.executor import ShippedNN

REPO = Path(__file__).resolve().parents[1]
BLOCK = 8

# NN variants: knobs on top of the spec's fixed settings (importance, round_to, ...); no knobs: the reference NN.
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
    # the resolution knob, fine-tuned as the quick profile caps it
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
CROPFOLLOW = [
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


def _ladder(prefix: str) -> dict[str, dict]:
    """One LaneKeep NN's variants: the reference, each dtype, pruning with short and long fine-tuning, the input
    scale the spec allows (0.85: its flattened head takes no smaller frame)."""
    return {f"{prefix}-ref": {}, f"{prefix}-bf16": {"dtype": "bf16"}, f"{prefix}-int8": {"dtype": "int8"},
            f"{prefix}-p50-ft400": {"prune_ratio": 0.5, "finetune_steps": 400},
            f"{prefix}-p60-ft100": {"prune_ratio": 0.6, "finetune_steps": 100},
            f"{prefix}-p60-ft400": {"prune_ratio": 0.6, "finetune_steps": 400},
            f"{prefix}-p70-ft100": {"prune_ratio": 0.7, "finetune_steps": 100},
            f"{prefix}-p70-ft400": {"prune_ratio": 0.7, "finetune_steps": 400},
            f"{prefix}-p90-ft400": {"prune_ratio": 0.9, "finetune_steps": 400},
            f"{prefix}-s90-int8": {"input_scale": 0.9, "dtype": "int8", "finetune_steps": 160},
            f"{prefix}-s85-int8": {"input_scale": 0.85, "dtype": "int8", "finetune_steps": 160}}


LANE, STOP, LEAD = _ladder("l"), _ladder("s"), _ladder("ld")
# lane, stop, lead: the reference, each NN alone along its ladder beside the others' references, then all three alike
LANEKEEP = [
    ("l-ref", "s-ref", "ld-ref"), ("l-int8", "s-int8", "ld-int8"), ("l-bf16", "s-bf16", "ld-bf16"),
    ("l-p50-ft400", "s-ref", "ld-ref"), ("l-p70-ft100", "s-ref", "ld-ref"), ("l-p90-ft400", "s-ref", "ld-ref"),
    ("l-ref", "s-p50-ft400", "ld-ref"), ("l-ref", "s-p70-ft100", "ld-ref"), ("l-ref", "s-p90-ft400", "ld-ref"),
    ("l-ref", "s-ref", "ld-p50-ft400"), ("l-ref", "s-ref", "ld-p70-ft100"), ("l-ref", "s-ref", "ld-p90-ft400"),
    ("l-p50-ft400", "s-p50-ft400", "ld-p50-ft400"), ("l-p70-ft100", "s-p70-ft100", "ld-p70-ft100"),
    ("l-p90-ft400", "s-p90-ft400", "ld-p90-ft400"), ("l-s85-int8", "s-s85-int8", "ld-s85-int8"),
    # 16-24, near the first set's edges: the detector and the lead NN between their passing and failing rungs, the
    # input scale one NN at a time and at 0.9
    ("l-ref", "s-p60-ft100", "ld-ref"), ("l-ref", "s-p70-ft400", "ld-ref"), ("l-ref", "s-ref", "ld-p60-ft100"),
    ("l-ref", "s-ref", "ld-p70-ft400"), ("l-s85-int8", "s-ref", "ld-ref"), ("l-ref", "s-s85-int8", "ld-ref"),
    ("l-ref", "s-ref", "ld-s85-int8"), ("l-s90-int8", "s-s90-int8", "ld-s90-int8"),
    ("l-p50-ft400", "s-p60-ft400", "ld-p60-ft400"),
    # 25-27: each NN alone at input 0.9 (23 has all three there)
    ("l-s90-int8", "s-ref", "ld-ref"), ("l-ref", "s-s90-int8", "ld-ref"), ("l-ref", "s-ref", "ld-s90-int8"),
]

VARIANTS = {"cropfollow": {"heading": HEADING, "distance": DISTANCE},
            "lanekeep": {"lane": LANE, "stop": STOP, "lead": LEAD}}
"""Each application's NN variants by NN (the spec's ``app.name``; its NNs in the spec's order)."""
CONFIGURATIONS = {"cropfollow": CROPFOLLOW, "lanekeep": LANEKEEP}
"""Each application's configurations: one variant per NN, in the order of :data:`VARIANTS`' NNs."""


def configurations_of(spec) -> tuple[dict[str, dict], list[dict[str, str]]]:
    """The spec's application's NN variants and configurations (NN -> variant), checked against its NNs."""
    app = spec.app.name
    if app not in VARIANTS:
        raise SystemExit(f"--spec {app!r}: no variants for this application here (known: {', '.join(VARIANTS)}); "
                         "add its NNs' variants to VARIANTS and CONFIGURATIONS in benchmarks/fidelity_closed_loop.py")
    if list(VARIANTS[app]) != list(spec.nns):
        raise SystemExit(f"--spec {app!r}: its NNs are {', '.join(spec.nns)}; this script's variants are for "
                         f"{', '.join(VARIANTS[app])}")
    return VARIANTS[app], [dict(zip(VARIANTS[app], config, strict=True)) for config in CONFIGURATIONS[app]]


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


def timestamped_log(path: Path) -> Callable[[str], None]:
    """A logger that prints each message with the time and appends it to ``path`` at once, so that a run cut off on a
    lent machine keeps every line it printed (``fidelity.py`` reads the variants' errors back from such a log)."""
    log_file = open(path, "a")

    def log(message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    return log


def run_block(entry_point: str, params: dict, nns: dict, seeds: list[int]) -> list[dict]:
    """One block of closed-loop runs on a worker (the spec's simulator built there from its entry point and params)."""
    import torch

    from qaopt.app_spec.entrypoints import load_entry_point

    torch.set_num_threads(1)
    return load_entry_point(entry_point)(**params).evaluate_perception(nns, seeds)


def build_variants(spec, tables: dict[str, dict], cache: Path, device: str, names: set[str], variant_seed: int,
                   log) -> tuple[dict, dict]:
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
    for nn, table in tables.items():
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
            predictions = {} if stress is None else stress.predictions(nn, shipped)
            strata = {s: float(target.metric(pred, np.asarray(stress.strata[s][nn].truth)))
                      for s, pred in predictions.items()}
            variants[name] = {"nn": nn, "knobs": knobs, "seed": variant_seed, "candidate": cand.key,
                              "on_policy_error": cand.error, "dataset_error": float(ds_error), "strata": strata,
                              "macs": cand.macs, "params": cand.params,
                              "build_s": round(time.perf_counter() - t, 1), "cand": cand}
            for i, (res, seq) in enumerate(zip(cand.residuals, target.data.val_sequences)):
                sequences[f"{name}/residual/{i}"] = np.asarray(res)
                sequences[f"{name}/truth/{i}"] = truth[np.asarray(seq)]
            for stratum, pred in predictions.items():  # the same per drive on each stratum: "<name>/<stratum>/..."
                rec = stress.strata[stratum][nn]
                for i, seq in enumerate(rec.sequences):
                    seq = np.asarray(seq)
                    sequences[f"{name}/{stratum}/residual/{i}"] = pred[seq, column] - rec.truth[seq, column]
                    sequences[f"{name}/{stratum}/truth/{i}"] = np.asarray(rec.truth)[seq, column]
            unit = "L1" if target.metric.kind == "l1" else target.metric.kind  # fidelity.py reads a log's L1 lines
            log(f"{name}: on-policy {unit} {cand.error:.4g}, dataset {unit} {ds_error:.4g}"
                + "".join(f", {k} {unit} {v:.4g}" for k, v in strata.items()) + f" ({variants[name]['build_s']} s)")
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
    ap.add_argument("--length", type=float, default=None,
                    help="override the run length, run_length_m or route_m of the spec's simulator (smoke tests only)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch  # noqa: F401 - imported before provenance(), which names the GPU torch sees
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    record = provenance()

    from qaopt.closed_loop import VALIDATION_SEED_BASE
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import acceptance_of, cache_dir_of, goal_of

    spec = load_spec(args.spec)
    cache = args.cache_dir or cache_dir_of(spec)
    args.out.mkdir(parents=True, exist_ok=True)
    done_dir = args.out / "closed_loop"
    done_dir.mkdir(exist_ok=True)
    log = timestamped_log(args.out / "fidelity_log.txt")

    tables, configurations = configurations_of(spec)
    chosen = range(len(configurations)) if args.only is None else [int(i) for i in args.only.split(",")]
    start = time.perf_counter()
    # Every NN's reference too: a configuration's stressed coordinate is its error on a stratum over the reference's
    # on the same recording, and a folder's strata are recorded on its own machine (fidelity.py reads both from it).
    names = {v for i in chosen for v in configurations[i].values()} | {
        name for table in tables.values() for name, knobs in table.items() if not knobs}
    variants, sequences = build_variants(spec, tables, cache, args.device, names, args.variant_seed, log)
    np.savez_compressed(args.out / "fidelity_residuals.npz", **sequences)
    (args.out / "variants.json").write_text(json.dumps(
        {n: {k: v for k, v in var.items() if k != "cand"} for n, var in variants.items()}, indent=1))
    build_s = time.perf_counter() - start

    simulator = spec.evaluator.simulator
    params = dict(simulator.params)
    length_key = next((k for k in ("run_length_m", "route_m") if k in params), "run_length_m")
    if args.length is not None:
        params[length_key] = args.length
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
            nns = {nn: shipped[variant] for nn, variant in configurations[i].items()}
            pending[i] = {}
            for b in range(0, len(seeds), BLOCK):
                futures[pool.submit(run_block, simulator.entry_point, params, nns, seeds[b : b + BLOCK])] = (i, b)
        for fut in as_completed(futures):
            i, b = futures[fut]
            pending[i][b] = fut.result()
            if len(pending[i]) * BLOCK >= len(seeds):
                records = [r for k in sorted(pending[i]) for r in pending[i][k]]
                failures = sum(not goal.passes(r[goal.metric]) for r in records)
                row = {"id": i, **configurations[i], "runs": len(records), "failures": failures,
                       "verdict": test.decide_fixed(failures, len(records)).value,
                       "mean_distance_m": float(np.mean([r["distance_m"] for r in records])),
                       "qos": [float(r[goal.metric]) for r in records],  # per run, in seed order: replayable
                       # every metric the simulator reports, per run: what made a run fail (a missed stop, a phantom)
                       "metrics": {m: [float(r[m]) for r in records] for m in records[0]
                                   if all(np.isscalar(r.get(m)) for r in records)}}
                (done_dir / f"{i}.json").write_text(json.dumps(row))
                log(f"configuration {i} {' + '.join(configurations[i].values())}: {failures}/{len(records)} failed "
                    f"-> {row['verdict']}")
    loop_s = time.perf_counter() - loop_start

    rows = [json.loads((done_dir / f"{i}.json").read_text()) for i in chosen if (done_dir / f"{i}.json").exists()]
    import torch

    out = {
        **record,
        "torch": torch.__version__,
        "spec": str(args.spec.relative_to(REPO)) if args.spec.is_relative_to(REPO) else str(args.spec),
        "runs_per_configuration": args.runs, length_key: params.get(length_key),
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
