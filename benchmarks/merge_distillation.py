"""How long a merged NN must be distilled before the closed loop keeps it.

    python benchmarks/merge_distillation.py [--steps 300 1200 3000] [--scale 1.0] [--adapt 0] [--align spec]
        [--prune 0.0] [--finetune 0] [--runs 48]
        [--seed-base 5000000] [--references] [--freeze spec] [--end-to-end spec] [--precision auto] [--device auto]
        [--order NN ...] [--workers 2]
        [--spec examples/cropfollow.yaml] [--cache-dir DIR] [--json docs/benchmarks/merge_distillation.json]

For each distillation length in ``--steps`` it builds the spec's first merge group (``search.merge``) distilled
that many steps from the reference NNs, exactly as ``qaopt optimize`` does (:func:`qaopt.approx.build_merged`,
the lead the product picks), in int8 at ``--scale`` (the input resolution, each side rounded to a multiple of
``--align``, by default the spec's ``resolution.align``), adapted ``--adapt`` steps to that scale once, as
``resolution.adapt_steps`` does, then pruned ``--prune`` of its channels and fine-tuned ``--finetune`` steps, as a
search trial's candidate is built (a kept row whose knobs name only ``finetune_steps``, not ``input_adapt_steps``,
was fine-tuned that many steps after the spec's own ``adapt_steps``), with ``--freeze`` kept as the lead trained
it while the rest distils (``spec``: the group's ``freeze``; ``none``: end to end) and then ``--end-to-end`` steps
of the whole merged NN (``spec``: the group's ``end_to_end_steps``), trained in ``--precision``
(``auto``: what ``qaopt optimize`` chooses on this machine, ``training.precision``; cache keys name no precision,
so give a cache that does not hold that merged NN yet) on ``--device`` (``auto``: where ``qaopt optimize`` trains,
``training.device``, so a GPU distils the ResNet-18 spec's merge), with its members in ``--order`` (default the
spec's; the first listed leads on equal MACs: ``docs/knobs.md``, "Which NN leads"); measures each member's error on its
own validation data against its reference NN's; and runs the merged NN in the closed loop: ``--runs`` seeded runs
of the spec's run length, the seeds ``qaopt optimize``'s validation draws (``--seed-base``: others, e.g. seeds that
neither the search's selection nor its fresh acceptance draws, so that choosing a design on them spends neither),
judged with the spec's acceptance test on the fixed set of runs. ``--references`` runs the reference NNs instead
(fp32, apart), for the failure rate that the application has before any approximation. Each finished variant is kept in ``<cache>/merge_distillation/`` and skipped on a re-run
(a lost machine costs one variant). Writes ``--json``: the machine, the date and one row per variant kept there
(the command that measured it, errors, ratios to the references, failed runs by index, verdict, build and loop seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from qaopt.approx import Knobs
from qaopt.closed_loop import VALIDATION_SEED_BASE

REPO = Path(__file__).resolve().parents[1]
BLOCK = 8
DEFAULT_ALIGN = Knobs().input_align
"""``input_align``'s default: a variant at another is named for it (files kept before the option keep their names)."""


def run_block(params: dict, nns: dict, seeds: list[int]) -> list[dict]:
    """One block of closed-loop runs on a worker, the simulator built there from the spec's entry point."""
    import torch

    from qaopt.app_spec import load_entry_point

    torch.set_num_threads(1)
    return load_entry_point(params["entry_point"])(**params["params"]).evaluate_perception(nns, seeds)


def merge_group(spec, cache: Path, steps: int, order: list[str] | None, recipe, device: str,
                freeze: str | None, end_to_end: int = 0):
    """The spec's first merge group as ``qaopt optimize`` builds it, its members in ``order`` (default the spec's),
    distilled ``steps`` with ``freeze`` frozen, then ``end_to_end`` steps whole; its lead's plain int8 knobs (the
    informed cheapest trial's); and each member's reference candidate (fp32, nothing approximated), built or read
    from ``cache``."""
    from qaopt import kernels
    from qaopt.approx import KnobSpace, build
    from qaopt.approx.merge import MergeGroup
    from qaopt.on_policy import target_nns

    order = order or spec.search.merge[0].nns
    # The members as qaopt optimize builds them: with on-policy error data (LaneKeep) their data, and so the merged
    # NN's cache key and distillation seed, are the recordings', not the dataset's.
    nns = target_nns(spec, Path(cache), order)
    group = MergeGroup(tuple(nns[n] for n in order), steps, freeze, end_to_end)
    lead = group.lead().name
    base = KnobSpace.from_section(spec.knobs_for(lead), nn=lead).base(dtype="int8")
    references = {n: build(t, base.model_copy(update={"dtype": "fp32"}), cache_dir=cache, recipe=recipe,
                           onnx=kernels.onnx, device=device) for n, t in nns.items()}
    return group, base, references


def measure(steps: int, args: argparse.Namespace, spec, recipe, pool) -> dict:
    from qaopt import kernels
    from qaopt.approx.merge import build_merged
    from qaopt.executor import ShippedNN
    from qaopt.spec_adapter import acceptance_of, cache_dir_of, goal_of

    cache = args.cache_dir or cache_dir_of(spec)
    group, base, references = merge_group(spec, cache, steps, args.order, recipe, args.device, args.freeze,
                                          args.end_to_end)
    lead = group.lead().name
    reference = {n: c.error for n, c in references.items()}
    knobs = Knobs.model_validate({**base.model_dump(), "input_scale": args.scale, "input_align": args.align,
                                  "input_adapt_steps": args.adapt, "prune_ratio": args.prune,
                                  "finetune_steps": args.finetune})
    start = time.perf_counter()
    views = references if args.references else build_merged(
        group, knobs, cache_dir=cache, recipe=recipe, onnx=kernels.onnx, device=args.device,
        progress=lambda message: print(f"  {message}", flush=True))
    build_s = time.perf_counter() - start
    print(f"{steps} steps: " + ", ".join(f"{n} {v.error:.4g} ({v.error / reference[n]:.3f}x)" for n, v in views.items())
          + f" ({build_s:.0f} s)", flush=True)
    shipped = {n: ShippedNN(v) for n, v in views.items()}
    params = {"entry_point": spec.evaluator.simulator.entry_point, "params": dict(spec.evaluator.simulator.params)}
    seeds = [args.seed_base + i for i in range(args.runs)]
    start = time.perf_counter()
    blocks = [pool.submit(run_block, params, shipped, seeds[b : b + BLOCK]) for b in range(0, len(seeds), BLOCK)]
    records = [r for f in blocks for r in f.result()]
    goal, test = goal_of(spec), acceptance_of(spec)
    failed = [i for i, r in enumerate(records) if not goal.passes(r[goal.metric])]
    row = {"steps": steps, "lead": lead, "freeze": args.freeze, "end_to_end_steps": args.end_to_end,
           "command": " ".join(["python", *sys.argv]),
           "knobs": ({"dtype": "fp32", "input_scale": 1.0, "finetune_steps": 0} if args.references else
                     {"dtype": "int8", **{k: v for k, v in knobs.model_dump().items()
                                          if k in ("input_scale", "input_align", "input_adapt_steps", "prune_ratio",
                                                   "finetune_steps") and (v or k == "finetune_steps")}}),
           "merged": not args.references,
           "precision": recipe.precision,
           "error": {n: v.error for n, v in views.items()}, "reference_error": reference,
           "error_ratio": {n: round(v.error / reference[n], 4) for n, v in views.items()},
           "seed_base": args.seed_base, "runs": len(records), "failures": len(failed), "failed_runs": failed,
           "verdict": test.decide_fixed(len(failed), len(records)).value,
           "build_s": round(build_s, 1), "loop_s": round(time.perf_counter() - start, 1)}
    print(f"{steps} steps: {len(failed)}/{len(records)} runs failed {failed} -> {row['verdict']}", flush=True)
    return row


def variant(steps: int, args: argparse.Namespace, precision: str) -> str:
    """The file name a variant is kept under (a full-resolution fp32 one in the spec's order as before the scale,
    precision and order existed: ``<steps>.json``)."""
    if args.references:
        return f"references-seeds{args.seed_base}x{args.runs}.json"
    # "-once": adapted as resolution.adapt_steps does; the rows kept before fine-tuned --adapt steps instead
    name = f"{steps}" if args.scale == 1.0 and args.adapt == 0 else f"{steps}-scale{args.scale:g}-adapt{args.adapt}-once"
    name += f"-{'+'.join(args.order)}" if args.order else ""
    name += f"-frozen-{args.freeze}" if args.freeze else ""
    name += f"-e2e{args.end_to_end}" if args.end_to_end else ""
    name += f"-align{args.align}" if args.scale < 1.0 and args.align != DEFAULT_ALIGN else ""
    name += f"-prune{args.prune:g}" if args.prune else ""
    name += f"-ft{args.finetune}" if args.finetune else ""
    name += f"-seeds{args.seed_base}x{args.runs}" if args.seed_base != VALIDATION_SEED_BASE else ""
    return f"{name}.json" if precision == "fp32" else f"{name}-{precision}.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "cropfollow.yaml")
    ap.add_argument("--steps", type=int, nargs="+", default=[300, 1200, 3000])
    ap.add_argument("--scale", type=float, default=1.0, help="the merged NN's input scale (1.0: full resolution)")
    ap.add_argument("--adapt", type=int, default=0, help="steps adapting the NN to that scale once")
    ap.add_argument("--align", default="spec", help="what each scaled side is rounded to a multiple of (spec: "
                    "approximations' resolution.align, else 8)")
    ap.add_argument("--prune", type=float, default=0.0, help="share of the merged NN's channels pruned after the "
                    "scale's adaptation (0: none)")
    ap.add_argument("--finetune", type=int, default=0, help="the candidate's own fine-tuning steps (after pruning)")
    ap.add_argument("--runs", type=int, default=48)
    ap.add_argument("--seed-base", type=int, default=VALIDATION_SEED_BASE,
                    help="the first closed-loop seed (default: the first that qaopt optimize's validation draws)")
    ap.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                    help="training arithmetic (auto: what qaopt optimize chooses on this machine)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="where to distil (auto: where qaopt optimize trains, training.device)")
    ap.add_argument("--order", nargs="+", default=None,
                    help="the merge group's members in this order (default: the spec's search.merge[0].nns)")
    ap.add_argument("--freeze", default="spec", help="the lead's submodule kept as trained while the merged NN "
                    "distils (spec: search.merge[0].freeze; none: end to end)")
    ap.add_argument("--end-to-end", default="spec", help="steps of the whole merged NN after a frozen distillation "
                    "(spec: search.merge[0].end_to_end_steps)")
    ap.add_argument("--references", action="store_true",
                    help="run the reference NNs (fp32, apart) instead of a merged NN, on the same seeds")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: the spec's cache")
    ap.add_argument("--json", type=Path, default=REPO / "docs" / "benchmarks" / "merge_distillation.json")
    args = ap.parse_args()
    import torch  # noqa: F401 - imported before provenance(), which names the GPU torch sees
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    import torch

    from qaopt import kernels
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import cache_dir_of
    from qaopt.training import finetune_recipe, training_device

    spec = load_spec(args.spec)
    if not spec.search.merge:
        sys.exit(f"{args.spec}: search.merge: the spec has no merge group to distil")
    if args.order is not None and sorted(args.order) != sorted(spec.search.merge[0].nns):
        sys.exit(f"--order {' '.join(args.order)}: list the members of search.merge[0]: "
                 f"{', '.join(spec.search.merge[0].nns)}")
    if args.device == "auto":
        args.device = training_device(spec.training)
    args.freeze = {"spec": spec.search.merge[0].freeze, "none": None}.get(args.freeze, args.freeze)
    args.end_to_end = spec.search.merge[0].end_to_end_steps if args.end_to_end == "spec" else int(args.end_to_end)
    lead_sections = spec.knobs_for(spec.search.merge[0].nns[0])
    args.align = (lead_sections.get("resolution", {}).get("align", DEFAULT_ALIGN) if args.align == "spec"
                  else int(args.align))
    if args.end_to_end and args.freeze is None:
        sys.exit(f"--end-to-end {args.end_to_end}: end-to-end steps follow a frozen distillation; give --freeze too")
    recipe = finetune_recipe(spec.training.model_copy(update={"precision": args.precision}), args.device)
    done = (args.cache_dir or cache_dir_of(spec)) / "merge_distillation"
    done.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        for steps in args.steps:
            path = done / variant(steps, args, recipe.precision)
            if not path.exists():
                path.write_text(json.dumps(measure(steps, args, spec, recipe, pool), indent=1))
    rows = sorted((json.loads(p.read_text()) for p in done.glob("*.json")),
                  key=lambda r: (r.get("seed_base", VALIDATION_SEED_BASE), -r["knobs"]["input_scale"],
                                 r["knobs"].get("finetune_steps", 0), r["steps"]))
    out = {**prov, "torch": torch.__version__,  # this run's command; a row that records a command keeps its own
           "spec": str(args.spec.relative_to(REPO)) if args.spec.is_relative_to(REPO) else str(args.spec),
           "acceptance": spec.qos.acceptance.model_dump(), "rows": rows}
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
