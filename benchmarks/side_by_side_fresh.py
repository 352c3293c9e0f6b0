"""A run's side-by-side frames timed again in a fresh process: does the run's own process time them as their parts?

    python benchmarks/side_by_side_fresh.py RUN_DIR --spec examples/cropfollow.yaml --cache-dir DIR [--repeats 3]

``qaopt optimize``'s side-by-side stage times the reference, aware and agnostic frames in the run's process, after
calibration, training and closed-loop validation ran there. This script rebuilds the same candidates from the
cache (each NN's recorded knobs; merged NNs as merged), compiles each on the backend the run recorded, and, in
``--repeats`` fresh processes, times each model alone and the three frames side by side with the stage's own
function (:func:`qaopt.kernels.compare_frames`, three interleaved rounds). It prints one JSON line per process and
a last line comparing with the run's ``result.json``: each frame's figure there, here, and the sum of its models'.
A frame of two models should cost about the sum of its models; where the run's frame costs more and this one does
not, the run's process added it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SIDES = ("reference", "aware", "agnostic")


def run_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments that name a run and where its NNs are: the run folder, its spec and its cache."""
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--cache-dir", type=Path, required=True)


def rebuilt(spec, result: dict, cache_dir: Path) -> dict[str, dict[str, tuple[object, dict]]]:
    """Each side's candidates as the run (its loaded ``result.json``) chose them, rebuilt from the cache: side -> NN
    -> (candidate, its choice in ``result``); the NNs a merged NN serves each get its view."""
    from qaopt import kernels
    from qaopt.approx import FinetuneRecipe, Knobs, TargetNN, build
    from qaopt.approx.merge import MergeGroup, build_merged

    nns = {n: TargetNN.from_spec(n, spec.nns[n]) for n in spec.nns}
    groups = {tuple(g.nns): g for g in spec.search.merge}
    recipe = FinetuneRecipe(**result.get("finetune", {}))  # the bytes the run chose, not a retrained NN
    sides = {}
    for side in SIDES:
        models = {}
        for name, choice in result[side]["nns"].items():
            knobs = Knobs.model_validate(choice["knobs"])
            serves = choice.get("serves") or []
            if serves:
                group = MergeGroup.from_section(groups[tuple(serves)], nns)
                candidate = build_merged(group, knobs, cache_dir=cache_dir, recipe=recipe, onnx=kernels.onnx)[name]
            else:
                candidate = build(nns[name], knobs, cache_dir=cache_dir, recipe=recipe, onnx=kernels.onnx)
            models[name] = (candidate, choice)
        sides[side] = models
    return sides


def measure(run_dir: Path, spec_path: Path, cache_dir: Path) -> dict:
    from qaopt import kernels
    from qaopt.measuring import workload_of
    from qaopt.spec import load_spec

    spec = load_spec(spec_path)
    result = json.loads((run_dir / "result.json").read_text())
    target = kernels.Target.from_spec(spec.target)
    frames, alone = {}, {}
    for side, built in rebuilt(spec, result, cache_dir).items():
        models, seen = {}, set()
        for name, (candidate, choice) in built.items():
            if candidate.key in seen:  # a merged NN runs once for all it serves
                continue
            seen.add(candidate.key)
            work = workload_of(candidate)
            models[name] = kernels.compile(work.model, work.example_inputs, target.with_backend(choice["backend"]))
        alone[side] = {n: round(c.measure().median_ms, 3) for n, c in models.items()}
        frames[side] = (models, result[side]["schedule"])
    side_by_side = kernels.compare_frames(frames, target, rounds=3)
    return {"alone": alone, "frames": {s: round(m.median_ms, 3) for s, m in side_by_side.items()},
            "trusted": {s: m.trusted for s, m in side_by_side.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    run_arguments(ap)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single fresh process's measurement
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.run_dir, args.spec, args.cache_dir)))
        return
    rows = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, __file__, str(args.run_dir), "--spec", str(args.spec), "--cache-dir",
                              str(args.cache_dir), "--one"], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    result = json.loads((args.run_dir / "result.json").read_text())
    summary = {side: {"run_frame_ms": round(result[side]["latency_ms"], 3),
                      "fresh_frame_ms": statistics.median(r["frames"][side] for r in rows),
                      "fresh_sum_of_models_ms": statistics.median(sum(r["alone"][side].values()) for r in rows)}
               for side in SIDES}
    fresh = summary["agnostic"]["fresh_frame_ms"] / summary["aware"]["fresh_frame_ms"]
    run = summary["agnostic"]["run_frame_ms"] / summary["aware"]["run_frame_ms"]
    print(json.dumps({"frames": summary, "aware_over_agnostic": {"run": round(run, 2), "fresh": round(fresh, 2)}}))


if __name__ == "__main__":
    main()
