"""Each NN variant of a fidelity set, measured on the closed loop's own scenes and on fresh looks.

    python benchmarks/fidelity_scene_errors.py --closed-loop docs/benchmarks/fidelity_device/seed2 \
        [--spec examples/cropfollow.yaml] [--device cuda] [--steps 200] [--looks 48] [--workers 16] --out DIR

A fidelity set (``benchmarks/fidelity_closed_loop.py``) ran each configuration on validation's 48 selection seeds,
and its failures fall on a few of them whatever the knobs (``benchmarks/fidelity_scenes.py``: one seed failed by 18
of 19 failing configurations). A seed is a scene: its field, its look (light, soil, leaves) and its start. This
script asks whether a variant's error *on a scene* says whether it fails that scene, and so whether drives through
many looks could give a coordinate that sees it:

1. it rebuilds the set's NN variants (the knobs and ``--variant-seed`` of its ``variants.json``) as
   ``fidelity_closed_loop.py`` built them, and says for each whether the rebuild is the bytes that ran closed-loop
   (the same candidate key and on-policy error: only then do the set's verdicts belong to it);
2. records drives steered by the reference NNs (``record_perception``, the frames the product's strata are made
   of) through the set's closed-loop seeds (``selection``: 5,000,000 on) and through ``--looks`` fresh seeds
   (``looks``: :data:`LOOK_SEED_BASE` on, which nothing else uses), ``--steps`` perception steps each, on a
   process pool;
3. predicts every variant on those frames and keeps its per-frame residuals;
4. with ``--steered IDS``, drives again the whole closed-loop run of each of those configurations on the seeds it
   failed and on ``--controls`` seeds it passed, its own NNs steering (``evaluate_perception`` for the verdict,
   ``record_perception`` for the frames: the same run), and keeps its NNs' and the reference NNs' outputs on every
   frame of it: what the NNs read wrong on the way to a failure.

Writes ``DIR/scene_errors.json`` (the machine, the date, the command, each variant's rebuild check and mean
absolute error per drive in seed order) and ``DIR/scene_residuals.npz`` (``<variant>/<scenes>/residual/<seed>`` and
``<variant>/<scenes>/truth/<seed>``), and with ``--steered`` ``DIR/steered.npz`` (``<id>/<seed>/<nn>/<model>`` with
``model`` one of ``variant``, ``reference`` and ``truth``). ``benchmarks/fidelity_scenes.py --scene-errors DIR`` scores them against the
set's per-run verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from fidelity_closed_loop import (  # noqa: E402
    InLoopNN,
    build_variants,
    configurations_of,
    timestamped_log,
)

LOOK_SEED_BASE = 13_000_000
"""Fresh looks' seeds: disjoint from validation's (5,000,000), on-policy's (7,000,000), the strata's (8,000,000),
acceptance's (10,000,000) and the self-steered benchmark's (12,000,000)."""
SEEDS_PER_TASK = 2
SAME_TOLERANCE = 1e-9
"""Relative difference of a rebuilt variant's on-policy error below which it is taken for the same bytes."""


def record_chunk(spec_path: str, seeds: list[int], steps: int, cache: str) -> str:
    """Drives on ``seeds`` steered by the spec's reference NNs, pickled under ``cache`` (one worker, one thread)."""
    import torch

    from qaopt.app_spec.hashing import content_hash
    from qaopt.approx import TargetNN
    from qaopt.approx.quantize import predict_torch
    from qaopt.on_policy import RECORDING_VERSION, recorded
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import make_evaluator, simulator_key

    torch.set_num_threads(1)
    spec = load_spec(Path(spec_path))
    evaluator = make_evaluator(spec)
    refs = {n: TargetNN.from_spec(n, spec.nns[n]) for n in spec.nns}
    key = content_hash(RECORDING_VERSION, simulator_key(spec, evaluator),
                       dict(sorted((n, t.fingerprint) for n, t in refs.items())), seeds, steps)
    path = Path(cache) / "scenes" / f"{key}.pkl"
    recorded(spec, evaluator, {n: partial(predict_torch, t.model) for n, t in refs.items()}, seeds, steps, path,
             f"scene drives {seeds[0]}-{seeds[-1]}")
    return str(path)


def steered_run(entry_point: str, params: dict, nns: dict, references: dict, seed: int, steps: int) -> dict:
    """One closed-loop run with ``nns`` steering, then the same run recorded: its QoS record, and on every frame
    each NN's output, the reference NN's and the truth (one worker, one thread)."""
    import torch

    from qaopt.app_spec.entrypoints import load_entry_point

    torch.set_num_threads(1)
    evaluator = load_entry_point(entry_point)(**params)
    [record] = evaluator.evaluate_perception(nns, [seed])
    drives = evaluator.record_perception(nns, [seed], steps=steps)
    out = {}
    for name, drive in drives.items():
        frames = drive.inputs
        outputs = {model: np.concatenate([np.asarray(nn(frames[i : i + 64]), dtype=np.float64)[:, 0]
                                          for i in range(0, len(frames), 64)])
                   for model, nn in (("variant", nns.get(name)), ("reference", references[name])) if nn is not None}
        out[name] = {**outputs, "truth": np.asarray(drive.truth, dtype=np.float64)[:, 0]}
    return {"record": record, "nns": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--closed-loop", type=Path, required=True, help="a fidelity set's folder (its variants.json)")
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "cropfollow.yaml")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=200, help="perception steps per drive (0: no scene drives, steps 2-3)")
    ap.add_argument("--looks", type=int, default=48, help="fresh scenes beside the set's closed-loop seeds")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--steered", default="", help="comma-separated configuration ids to drive again (step 4)")
    ap.add_argument("--controls", type=int, default=3, help="passed seeds driven again beside the failed ones")
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: the spec's cache")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch  # noqa: F401 - imported before provenance(), which names the GPU torch sees
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    import pickle

    from qaopt.closed_loop import VALIDATION_SEED_BASE
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import cache_dir_of

    spec = load_spec(args.spec)
    cache = args.cache_dir or cache_dir_of(spec)
    args.out.mkdir(parents=True, exist_ok=True)
    recorded_variants = json.loads((args.closed_loop / "variants.json").read_text())
    truth = json.loads((args.closed_loop / "fidelity_truth.json").read_text())
    seeds_of = {"selection": [VALIDATION_SEED_BASE + i for i in range(truth["runs_per_configuration"])],
                "looks": [LOOK_SEED_BASE + i for i in range(args.looks)]}
    log = timestamped_log(args.out / "scene_errors_log.txt")

    start = time.perf_counter()
    tables, _ = configurations_of(spec)
    seed = {v["seed"] for v in recorded_variants.values()}
    if len(seed) != 1:
        raise SystemExit(f"{args.closed_loop}/variants.json: variants of several seeds {sorted(seed)}; one set at a time")
    variants, _ = build_variants(spec, tables, cache, args.device, set(recorded_variants), seed.pop(), log)
    checks = {}
    for name, v in variants.items():
        was = recorded_variants[name]
        same = v["candidate"] == was["candidate"] and \
            abs(v["on_policy_error"] - was["on_policy_error"]) <= SAME_TOLERANCE * abs(was["on_policy_error"])
        checks[name] = {"same": same, "candidate": v["candidate"], "on_policy_error": v["on_policy_error"],
                        "recorded_on_policy_error": was["on_policy_error"]}
        log(f"{name}: {'the same bytes' if same else 'NOT the same bytes'} as the set's "
            f"(on-policy {v['on_policy_error']:.6g} against {was['on_policy_error']:.6g})")
    build_s = time.perf_counter() - start

    t0 = time.perf_counter()
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # the workers' renderers: one core each
    tasks = [(kind, seeds[i : i + SEEDS_PER_TASK]) for kind, seeds in seeds_of.items()
             for i in range(0, len(seeds), SEEDS_PER_TASK)] if args.steps else []
    with ProcessPoolExecutor(args.workers, mp_context=__import__("multiprocessing").get_context("spawn")) as pool:
        paths = [pool.submit(record_chunk, str(args.spec), s, args.steps, str(cache)) for _, s in tasks]
        paths = [p.result() for p in paths]
    record_s = time.perf_counter() - t0
    if tasks:
        log(f"{sum(len(s) for s in seeds_of.values())} drives of {args.steps} steps recorded/read in {record_s:.0f} s")

    t0 = time.perf_counter()
    shipped = {n: InLoopNN(v["cand"], args.device) for n, v in variants.items()}
    sequences, per_drive = {}, {n: {k: [] for k in seeds_of} for n in variants}
    for (kind, seeds), path in zip(tasks, paths):
        with open(path, "rb") as f:
            recordings = pickle.load(f)
        for name, v in variants.items():
            rec = recordings[v["nn"]]
            column = [o.name for o in spec.nns[v["nn"]].outputs].index(spec.nns[v["nn"]].error_metric.output)
            pred = np.concatenate([np.asarray(shipped[name](rec.inputs[i : i + 64]), dtype=np.float64)
                                   for i in range(0, len(rec.inputs), 64)])
            for s, seq in zip(seeds, rec.sequences):
                seq = np.asarray(seq)
                res = pred[seq, column] - np.asarray(rec.truth)[seq, column]
                sequences[f"{name}/{kind}/residual/{s}"] = res
                sequences[f"{name}/{kind}/truth/{s}"] = np.asarray(rec.truth)[seq, column]
                per_drive[name][kind].append(float(np.mean(np.abs(res))))
    predict_s = time.perf_counter() - t0
    if tasks:
        log(f"{len(variants)} variants predicted in {predict_s:.0f} s")

    np.savez_compressed(args.out / "scene_residuals.npz", **sequences)
    steered, steered_s = {}, 0.0
    if args.steered:
        t0 = time.perf_counter()
        steered = drive_again(args, spec, truth, shipped, variants)
        steered_s = time.perf_counter() - t0
        log(f"{len(steered)} runs driven again in {steered_s:.0f} s")

    import torch

    (args.out / "scene_errors.json").write_text(json.dumps({
        **prov, "torch": torch.__version__,
        "set": str(args.closed_loop), "steps": args.steps, "seeds": seeds_of,
        "seconds": {"build_and_measure": round(build_s, 1), "record": round(record_s, 1), "predict": round(predict_s, 1),
                    "steered": round(steered_s, 1)},
        "steered": steered,
        "variants": {n: {**checks[n], "nn": v["nn"], "knobs": v["knobs"], "per_drive_l1": per_drive[n]}
                     for n, v in variants.items()},
    }, indent=1))
    log("done")


def drive_again(args, spec, truth: dict, shipped: dict, variants: dict) -> dict:
    """Step 4: the ``--steered`` configurations' failed runs and ``--controls`` passed ones, driven again; their
    per-frame outputs into ``steered.npz``, each run's replayed and recorded verdicts returned."""
    from qaopt.closed_loop import VALIDATION_SEED_BASE
    from qaopt.spec_adapter import goal_of, make_evaluator

    goal = goal_of(spec)
    simulator = spec.evaluator.simulator
    steps = make_evaluator(spec).config.max_steps  # a whole run
    references = {v["nn"]: shipped[name] for name, v in variants.items() if v["knobs"] == {}}
    rows = {c["id"]: c for c in truth["configurations"]}
    jobs = []
    for cid in (int(i) for i in args.steered.split(",")):
        config = rows[cid]
        nns = {nn: shipped[config[nn]] for nn in spec.nns}
        qos = config["qos"]
        failed = [VALIDATION_SEED_BASE + i for i, q in enumerate(qos) if not goal.passes(q)]
        passed = [VALIDATION_SEED_BASE + i for i, q in enumerate(qos) if goal.passes(q)][: args.controls]
        jobs += [(cid, seed, nns, seed in failed) for seed in failed + passed]
    arrays, out = {}, {}
    with ProcessPoolExecutor(args.workers, mp_context=__import__("multiprocessing").get_context("spawn")) as pool:
        futures = [pool.submit(steered_run, simulator.entry_point, dict(simulator.params), nns, references, seed, steps)
                   for _, seed, nns, _ in jobs]
        for (cid, seed, _, failed), fut in zip(jobs, futures):
            result = fut.result()
            for nn, models in result["nns"].items():
                for model, values in models.items():
                    arrays[f"{cid}/{seed}/{nn}/{model}"] = values
            out[f"{cid}/{seed}"] = {"failed_in_set": failed, "replayed": result["record"],
                                    "replayed_failed": not goal.passes(result["record"][goal.metric])}
    np.savez_compressed(args.out / "steered.npz", **arrays)
    return out


if __name__ == "__main__":
    main()
