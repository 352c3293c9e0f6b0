"""Which scenes the real NNs failed in a run's validation, and whether injected errors fail them too.

    python benchmarks/scene_failures.py --state STATE.tar.gz --spec SPEC.yaml [--set DOTTED.KEY=YAML ...]
        [--estimator ekf] [--workers 2] [--reference] [--json docs/benchmarks/scene_failures_resnet18.json]

``--state`` is a run's resumable state as ``benchmarks/real_result.py`` saves it (its ``run/`` with the studies and
its ``cache/`` with the validations and their blocks); ``--spec`` with ``--estimator`` and each ``--set`` is the
spec that run optimized, derived as ``real_result.py`` derives it, so the cache keys match. For every validation
on the selection seeds it reads which seeds failed: from the validation where it recorded them, else from its
stored blocks of runs. Then it runs the spec's simulator on every selection seed those validations ran, in the
same blocks: once with perfect NNs (the scenes themselves), and once with the spec's error model injecting each
validated configuration's errors as the search measured them (the region's view of that configuration). A seed that
the real NNs fail while perfect and injected perception pass it is a scene on which the NNs err far more than their
average, which no region charted with injected errors can show. With ``--reference`` the spec's reference NNs, as
qaopt builds them on this machine (trained on first use), also run on each seed block that held a real failure: a
scene the reference fails too is the application's, not the approximation's.

Writes ``--json``: the machine, the date, the command, the seeds, the perfect NNs' failures and one row per
validated configuration (its trial, runs, errors, the seeds its real NNs failed, those its injected errors failed).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from real_result import _restore, _spec_for  # noqa: E402  (the run's state and spec, derived alike)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", type=Path, required=True, help="the run's state.tar.gz (real_result.py)")
    ap.add_argument("--spec", type=Path, required=True, help="the spec the run derived its own from")
    ap.add_argument("--estimator", choices=["ekf", "none"], default=None, help="as given to real_result.py")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="as given to real_result.py")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes running seed blocks")
    ap.add_argument("--reference", action="store_true", help="run the reference NNs on the failing seeds' blocks")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    from qaopt.app_spec import load, store
    from qaopt.closed_loop import VALIDATION_SEED_BASE, ValidationBlocks, validation_blocks
    from qaopt.spec_adapter import goal_of
    from qaopt.result import Validation
    from qaopt.stages.validation import VALIDATION_VERSION

    work = Path(tempfile.mkdtemp(prefix="scene-failures-"))
    run, cache = work / "run", work / "cache"
    _restore(args.state, run, cache)
    spec = load(_spec_for(args.spec.resolve(), args.estimator, work, args.overrides))
    goal, block = goal_of(spec), spec.qos.acceptance.min_trials
    evaluation = spec.content_hash("evaluator", "qos")
    searched = _searched_errors(run / "study.db")

    rows, seeds = [], set()
    for path in sorted((cache / "optimize" / "validation").glob("*.json")):
        v = store.read_model(path, Validation, VALIDATION_VERSION)
        if v is None or v.seed_base != VALIDATION_SEED_BASE or not v.nns:
            continue
        ran = {n: c.candidate if c.bytes_hash is None else f"{c.candidate}:{c.bytes_hash}" for n, c in v.nns.items()}
        blocks = ValidationBlocks.of(cache, ran, evaluation, goal)
        ran_seeds, failed = [], list(v.failed_seeds)
        for seed_block in validation_blocks(v.runs, block, v.seed_base):
            records = blocks.get(seed_block)
            if records is None:
                continue
            ran_seeds += seed_block
            if not v.failed_seeds:
                failed += [s for s, r in zip(seed_block, records) if not goal.passes(r[goal.metric])]
        seeds.update(ran_seeds)
        rows.append({"trial": v.trial, "runs": v.runs, "verdict": v.verdict, "nns": ran,
                     "errors_searched": searched.get(v.trial), "real_failed_seeds": sorted(failed)})

    seed_blocks = validation_blocks(max(seeds) - VALIDATION_SEED_BASE + 1, block, VALIDATION_SEED_BASE) if seeds else []
    print(f"{len(rows)} validations, {len(seeds)} seeds in {len(seed_blocks)} blocks; perfect NNs...", flush=True)
    with ProcessPoolExecutor(args.workers) as pool:
        perfect = _failed(pool, spec.source, None, seed_blocks)
        for row in rows:
            if row["errors_searched"] is not None:
                row["injected_failed_seeds"] = _failed(pool, spec.source, row["errors_searched"], seed_blocks)
                print(f"trial {row['trial']}: real NNs failed {row['real_failed_seeds']}, injected errors "
                      f"{row['injected_failed_seeds']}", flush=True)
    reference = _reference(spec, seed_blocks, {s for row in rows for s in row["real_failed_seeds"]}) if args.reference \
        else None
    shared: dict[int, int] = {}
    for row in rows:
        for s in row["real_failed_seeds"]:
            shared[s] = shared.get(s, 0) + 1
    out = {
        **prov,
        "spec": spec.app.name, "error_model": spec.calibration.error_model, "seed_base": VALIDATION_SEED_BASE,
        "seeds": len(seeds), "perfect_failed_seeds": perfect,
        "real_failures_by_seed": {str(s): n for s, n in sorted(shared.items())},
        "configurations": rows, "reference": reference,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


def _searched_errors(study_db: Path) -> dict[int, dict[str, float]]:
    """Each aware trial's errors as the search measured them (the trial's ``errors`` attribute)."""
    with sqlite3.connect(study_db) as db:
        rows = db.execute(
            "SELECT t.number, a.value_json FROM trials t JOIN trial_user_attributes a ON a.trial_id = t.trial_id "
            "JOIN studies s ON s.study_id = t.study_id WHERE s.study_name LIKE '%-aware' AND a.key = 'errors'").fetchall()
    return {number: json.loads(value) for number, value in rows}


def _reference(spec, seed_blocks: list[list[int]], failed: set[int]) -> dict:
    """The reference NNs in the closed loop on every block holding a seed in ``failed``, in this process."""
    import torch

    from qaopt.approx import TargetNN
    from qaopt.approx.quantize import predict_torch
    from qaopt.spec_adapter import goal_of, make_evaluator

    torch.set_num_threads(os.cpu_count() or 1)
    nns = {n: TargetNN.from_spec(n, nn) for n, nn in spec.nns.items()}
    evaluator, goal = make_evaluator(spec), goal_of(spec)
    seeds = [s for block in seed_blocks if failed & set(block) for s in block]
    records = evaluator.evaluate_perception({n: partial(predict_torch, t.model) for n, t in nns.items()}, seeds)
    failed_here = [s for s, r in zip(seeds, records) if not goal.passes(r[goal.metric])]
    print(f"reference NNs: {len(seeds)} runs, failed {failed_here}", flush=True)
    return {"nns": {n: t.fingerprint for n, t in nns.items()}, "seeds": seeds, "failed_seeds": failed_here}


def _failed(pool: ProcessPoolExecutor, spec_path: str, errors: dict[str, float] | None,
            seed_blocks: list[list[int]]) -> list[int]:
    """The seeds that miss the goal with perfect NNs (``errors`` None) or with ``errors`` injected, block by block."""
    failed = []
    for seeds, passed in zip(seed_blocks, pool.map(_run_block, [spec_path] * len(seed_blocks),
                                                   [errors] * len(seed_blocks), seed_blocks)):
        failed += [s for s, ok in zip(seeds, passed) if not ok]
    return failed


def _run_block(spec_path: str, errors: dict[str, float] | None, seeds: list[int]) -> list[bool]:
    """One block on a worker: the spec's calibration (its simulator and error model) runs the seeds."""
    from qaopt.app_spec import load
    from qaopt.region_calibration import build_calibration

    spec = load(spec_path)
    calibration = build_calibration(spec, cache_dir=Path(tempfile.gettempdir()) / "scene-failures-cache")
    if errors is None:
        records = calibration.evaluator.evaluate({}, seeds)
        return [calibration.goal.passes(r[calibration.goal.metric]) for r in records]
    return calibration.run_seeds(errors, seeds)


if __name__ == "__main__":
    main()
