"""How a merged NN errs along a whole closed-loop run, against the reference NNs on the same frames.

    python benchmarks/scene_errors.py [--spec examples/cropfollow.yaml] --seeds 5000001 5000002 ...
        [--steps 800] [--json docs/benchmarks/scene_errors.json]

A region's coordinate is each NN's mean error on its validation data; closed-loop validation fails configurations on
particular scenes (``benchmarks/scene_failures.py``). This script looks inside such runs. It builds the spec's first
merge group exactly as ``qaopt optimize``'s informed cheapest trial does (int8, full resolution, distilled
``search.merge``'s steps, or ``--steps``; read from the cache when that run built it) and the reference NNs, then,
for each seed, drives the whole run with the merged NN steering (``record_perception``, the frames and the truth
``evaluate_perception`` sees for that seed) and evaluates the reference NNs on the very same frames. Per seed and NN:
the run's QoS record with the merged NN in the loop, and each model's mean, 99th-percentile and largest absolute error
over the run with the step of the largest. A scene where the merged NN's tail error is far above the reference's on
the same frames, while its mean is not, is what a mean-error coordinate cannot see.

Writes ``--json``: the machine, the date, the command, the models' validation errors and one row per seed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from merge_distillation import merge_group  # noqa: E402  (the group and references as qaopt optimize builds them)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "cropfollow.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", required=True, help="closed-loop seeds (5000000 on: selection)")
    ap.add_argument("--steps", type=int, default=None, help="distillation steps (default: the spec's merge group's)")
    ap.add_argument("--json", type=Path, default=REPO / "docs" / "benchmarks" / "scene_errors.json")
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    from qaopt import kernels
    from qaopt.approx.merge import build_merged
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import cache_dir_of, goal_of, make_evaluator
    from qaopt.training import finetune_recipe

    spec = load_spec(args.spec)
    if not spec.search.merge:
        sys.exit(f"{args.spec}: search.merge: the spec has no merge group")
    cache, merge = cache_dir_of(spec), spec.search.merge[0]
    recipe = finetune_recipe(spec.training, "cpu")
    group, base, reference = merge_group(spec, cache, args.steps or merge.finetune_steps, None, recipe, "cpu",
                                         merge.freeze, merge.end_to_end_steps)
    merged = build_merged(group, base, cache_dir=cache, recipe=recipe, onnx=kernels.onnx,
                          progress=lambda message: print(f"  {message}", flush=True))
    evaluator, goal = make_evaluator(spec), goal_of(spec)
    steps = evaluator.config.max_steps
    order = list(evaluator.nn_names)

    rows = []
    for seed in args.seeds:
        started = time.time()
        [record] = evaluator.evaluate_perception({n: v.predict for n, v in merged.items()}, [seed])
        drives = evaluator.record_perception({n: v.predict for n, v in merged.items()}, [seed], steps=steps)
        row = {"seed": seed, "passed": goal.passes(record[goal.metric]), "record": record, "nns": {}}
        for name in merge.nns:
            drive = drives[name]
            truth = np.asarray(drive.truth, dtype=np.float64)[:, 0]
            frames = drive.inputs
            row["nns"][name] = {model: _errors(_outputs(nn.predict, frames) - truth)
                                for model, nn in (("merged", merged[name]), ("reference", reference[name]))}
        row["frames"], row["seconds"] = int(len(truth)), round(time.time() - started, 1)
        print(f"seed {seed}: {'passed' if row['passed'] else 'FAILED'} ({record[goal.metric]:g}); "
              + "; ".join(f"{n}: merged p99 {v['merged']['p99']:.4g} max {v['merged']['max']:.4g}, reference p99 "
                          f"{v['reference']['p99']:.4g} max {v['reference']['max']:.4g}" for n, v in row["nns"].items()),
              flush=True)
        rows.append(row)

    out = {
        **prov,
        "spec": spec.app.name, "merge": {"nns": list(merge.nns), "steps": group.finetune_steps, "knobs": "int8, full resolution"},
        "nn_order": order,
        "validation_error": {n: {"merged": merged[n].error, "reference": reference[n].error} for n in merge.nns},
        "seeds": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


def _outputs(predict, frames, chunk: int = 256) -> np.ndarray:
    """``predict`` over a whole run's frames, ``chunk`` at a time (the run's float frames would take gigabytes)."""
    return np.concatenate([np.asarray(predict(frames[i : i + chunk]), dtype=np.float64).reshape(-1)
                           for i in range(0, len(frames), chunk)])


def _errors(residual: np.ndarray) -> dict:
    """Mean, 99th percentile and largest absolute error of one run, and the step of the largest."""
    err = np.abs(residual)
    return {"mean": float(err.mean()), "p99": float(np.quantile(err, 0.99)), "max": float(err.max()),
            "max_step": int(err.argmax())}


if __name__ == "__main__":
    main()
