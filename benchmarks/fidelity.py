"""Fidelity, part 2: does each error model's region predict the real NNs' closed-loop verdicts?

    .venv/bin/python benchmarks/fidelity.py --closed-loop DIR [DIR ...] --set NAME [--spec examples/lanekeep.yaml]
                                            [--budget 20] [--models gaussian,ar1,empirical,shaped]
                                            [--calibration-seeds 8] [--out docs/benchmarks/fidelity.json]

``DIR`` holds what ``benchmarks/fidelity_closed_loop.py`` wrote on the machine that ran the real
approximated NNs closed-loop: ``variants.json`` or ``fidelity_log.txt`` (each NN variant's on-policy
and dataset L1),
``fidelity_residuals.npz`` (its on-policy residual sequences) and the configurations' closed-loop
records (``closed_loop/<id>.json``, or their concatenation ``*.jsonl``). Several DIRs are merged: a
configuration keeps the variant errors of the run that validated it (fine-tuning on a GPU is not
bitwise reproducible, so a variant rebuilt on another machine errs a little differently).

For each error model, the shipped example's calibration (its strategy, certifier and ``--budget``
evaluations, on this machine) charts a region in on-policy coordinates: each NN's L1 on the
on-policy drives (``calibration.error_data``; the fitted models are fitted to the reference's
on-policy residuals). A configuration's point is its NNs' on-policy errors, each NN's on its metric
(L1; a detector's miss rate, placed with its false alarms in the proportion the region's error model injected
them, as the product places it: ``qaopt.app_spec.nn_errors.class_coordinate``); the region says valid when it
certifies the point. ``ar1@dataset`` is
the product before on-policy error data: the ar1 region with each configuration placed at its
dataset-drive errors. The spec's application (``--spec``: CropFollow's by default, LaneKeep's) names
the NNs. Compared with the closed-loop verdicts (the spec's acceptance test on 48 runs): agreement on the decided
configurations, false-valid count (region valid, closed loop invalid), and the calibration's cost.
The spec's own error model (``ar1-profile`` for CropFollow) is added to ``--models`` and calibrated as the spec
says (on its error data, where a fitted model is fitted). The ar1 region and the spec's model's are also scored in
dataset coordinates and, where the variants carry stress-stratum errors (the spec's
``calibration.error_data.stress``), with the product's stressed coordinates on either base (``ar1+stress``,
``ar1@dataset+stress``, ``ar1-profile@dataset+stress``). A region of 20 evaluations moves with its calibration seed
(CropFollow's ar1 reach in heading 3.2-4.9 deg over eight seeds), so ``--calibration-seeds N`` calibrates every model
with N seeds from the spec's and reports the mean agreement and false-valid count (each seed's in ``per_seed``); the
pipeline replays the first seed's region. The pipeline score (:func:`pipeline`) replays the product's closed-loop path on the
recorded runs, with each model's region and without one. Writes ``sets.<--set>`` of ``--out`` (other sets kept)
and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOG_LINE = re.compile(r"\] (?P<name>[\w-]+): on-policy L1 (?P<on>[\d.e-]+), dataset L1 (?P<ds>[\d.e-]+)")
DATASET_COORDINATES = "@dataset"
STRESSED = "+stress"
DECLARED_RATE = "@miss-rate-alone"
"""The model name suffix of a region scored with each detector at its declared rate alone, beside the product's
placement by both error kinds (what the placement by both kinds gains over the declared rate alone)."""
BASES = ("on_policy", "dataset")
LOG_REFERENCE = {"heading": "h-ref", "distance": "d-ref"}
"""The reference variants of a CropFollow set recorded before ``variants.json`` (its log names no NN or knobs)."""


def read_closed_loop(folder: Path) -> tuple[dict, list[dict]]:
    """(variant -> {on_policy, dataset} L1 and stratum errors, closed-loop records) of one device run folder."""
    if (folder / "variants.json").exists():
        variants = {n: {"on_policy": v["on_policy_error"], "dataset": v["dataset_error"], "strata": v.get("strata", {}),
                        "macs": v.get("macs"), "nn": v.get("nn"), "knobs": v.get("knobs")}
                    for n, v in json.loads((folder / "variants.json").read_text()).items()}
    else:  # a run cut off before variants.json existed: its log has the same figures (but no MACs)
        variants = {m["name"]: {"on_policy": float(m["on"]), "dataset": float(m["ds"]), "strata": {}, "macs": None,
                                "nn": None, "knobs": None}
                    for m in LOG_LINE.finditer((folder / "fidelity_log.txt").read_text())}
    texts = [p.read_text() for p in sorted((folder / "closed_loop").glob("*.json"))] if (folder / "closed_loop").is_dir() \
        else [t for p in sorted(folder.glob("*.jsonl")) for t in p.read_text().replace("}{", "}\n{").splitlines()]
    return variants, [json.loads(t) for t in texts if t.strip()]


def reference_variants(variants: dict, metrics: dict[str, str]) -> dict[str, str]:
    """Each NN's reference variant in a folder: the one built with no knobs (a log-only CropFollow folder: by name)."""
    found = {v["nn"]: name for name, v in variants.items() if v["nn"] in metrics and v["knobs"] == {}}
    return found if found.keys() == metrics.keys() else {nn: LOG_REFERENCE.get(nn) for nn in metrics}


def merged(folders: list[Path], metrics: dict[str, str]) -> tuple[list[dict], dict]:
    """Every configuration once (a later folder's record replaces an earlier one's), with its points, and the
    reference NNs' point in each base coordinate (from the last folder that built them). ``metrics`` are the
    spec's NNs and each one's error metric kind.

    Where the variants carry stress-stratum errors, each base coordinate gains a stressed one
    (``on_policy+stress``, ``dataset+stress``): the product's rule (:func:`qaopt.stress.stressed_coordinate`)
    against each NN's reference variant built in the same folder.
    """
    from qaopt.stress import stressed_coordinate

    nns = list(metrics)
    configs, reference = {}, {}
    for folder in folders:
        variants, records = read_closed_loop(folder)
        others = other_rates(folder, metrics)
        ref = reference_variants(variants, metrics)
        if all(ref[nn] in variants for nn in nns):
            reference = {kind: {nn: variants[ref[nn]][kind] for nn in nns} for kind in BASES}
        for rec in records:
            points = {kind: {nn: variants[rec[nn]][kind] for nn in nns} for kind in BASES}
            if all(variants[rec[nn]]["strata"] for nn in nns):
                for kind in BASES:
                    points[kind + STRESSED] = {nn: stressed_coordinate(
                        metrics[nn], variants[rec[nn]][kind], variants[ref[nn]][kind], variants[rec[nn]]["strata"],
                        variants[ref[nn]]["strata"]) for nn in nns}
            macs = [variants[rec[nn]]["macs"] for nn in nns]
            configs[rec["id"]] = {**rec, "points": points, "source": folder.name,
                                  "other_rates": {nn: others[rec[nn]] for nn in nns if rec[nn] in others},
                                  "macs": None if None in macs else sum(macs),
                                  "reference": all(rec[nn] == ref[nn] for nn in nns)}
    return [configs[i] for i in sorted(configs)], reference


def other_rates(folder: Path, metrics: dict[str, str]) -> dict[str, float]:
    """Each detector variant's rate of the error kind its metric does not declare (false alarms of a ``miss_rate``
    NN), from its on-policy confusion codes in the folder's residuals (variants of regression NNs have none)."""
    import numpy as np
    from qaopt.app_spec.nn_errors import class_rate, is_class_metric, other_class_metric

    detectors = {nn for nn, kind in metrics.items() if is_class_metric(kind)}
    if not detectors or not (folder / "fidelity_residuals.npz").exists():
        return {}
    variants, _ = read_closed_loop(folder)
    codes: dict[str, list] = {}
    with np.load(folder / "fidelity_residuals.npz") as npz:
        for key in npz.files:
            name, kind, _ = key.rsplit("/", 2)
            if kind == "residual" and variants.get(name, {}).get("nn") in detectors:
                codes.setdefault(name, []).append(np.ravel(npz[key]))
    return {name: class_rate(other_class_metric(metrics[variants[name]["nn"]]), np.concatenate(c))
            for name, c in codes.items()}


def calibrate(spec, model: str, budget: int, seed: int) -> tuple[object, dict]:
    from qaopt.region_calibration import build_calibration

    # The configurations' points are on-policy L1, so the fitted models (empirical, shaped) are fitted to the
    # reference's on-policy residuals too, whatever the spec measures on; the spec's own model is calibrated as the
    # spec says (its error data), as the product calibrates it.
    error_data = spec.calibration.error_data
    if model != spec.calibration.error_model:
        error_data = error_data.model_copy(update={"source": "on-policy"})
    spec = spec.model_copy(update={"calibration": spec.calibration.model_copy(
        update={"error_model": model, "error_data": error_data, "seed": seed})})
    start = time.perf_counter()
    cal = build_calibration(spec)
    region = cal.search(spec.calibration.strategy, budget, runs=spec.calibration.runs)
    return region, {"simulator_runs": int(region.trials), "evaluations": int(region.evaluations),
                    "seconds": round(time.perf_counter() - start, 1)}


def scored(regions: list, configs: list[dict], coordinates: str, both_kinds: bool = True) -> dict:
    """:func:`score` with each region (one per calibration seed): the mean agreement and false-valid count, each
    seed's, and the first region's verdicts (which the pipeline replays)."""
    runs = [score(region, configs, coordinates, both_kinds) for region in regions]
    agreements = [r["agreement"] for r in runs if r["agreement"] is not None]
    return {**runs[0],
            "agreement": round(sum(agreements) / len(agreements), 4) if agreements else None,
            "false_valid": round(sum(r["false_valid"] for r in runs) / len(runs), 2),
            "per_seed": [{k: r[k] for k in ("agreement", "false_valid")} for r in runs] if len(runs) > 1 else []}


def reach(region, reference: dict) -> dict:
    """How far the certified region reaches along each axis from the reference point (the others held there)."""
    import numpy as np

    out = {}
    for axis in region.space.axes:
        grid = np.linspace(reference[axis.name], axis.max, 400)
        inside = [v for v in grid if region.contains({**reference, axis.name: float(v)})]
        out[axis.name] = round(float(max(inside)), 4) if inside else None
    return out


def placed(region, config: dict, coordinates: str, both_kinds: bool = True) -> dict[str, float]:
    """The configuration's point in ``coordinates`` as the product places it in ``region``: a detector on on-policy
    codes by both its error kinds, in the proportion the region's error model injected them
    (:func:`qaopt.app_spec.nn_errors.class_coordinate`; ``both_kinds`` false: at its declared rate alone)."""
    from qaopt.app_spec.nn_errors import class_coordinate

    point = dict(config["points"][coordinates])
    if both_kinds and coordinates.startswith("on_policy"):
        for nn, other in config.get("other_rates", {}).items():
            point[nn] = class_coordinate(point[nn], other, region.class_ratio(nn))
    return point


def score(region, configs: list[dict], coordinates: str, both_kinds: bool = True) -> dict:
    decided = [c for c in configs if c["verdict"] != "undecided"]
    said = {c["id"]: bool(region.contains(placed(region, c, coordinates, both_kinds))) for c in configs}
    agree = [said[c["id"]] == (c["verdict"] == "valid") for c in decided]
    return {
        "decided": len(decided),
        "agreement": round(sum(agree) / len(agree), 4) if agree else None,
        "false_valid": sum(said[c["id"]] and c["verdict"] == "invalid" for c in decided),
        "region_valid": said,
    }


def pipeline(configs: list[dict], region_valid: dict | None, goal, test) -> dict:
    """The product's closed-loop path replayed on the recorded runs: how many runs it spends before a configuration
    is accepted, and how many configurations reach validation only to fail there.

    The model of the path: the configurations other than the reference pair are taken cheapest first (frame MACs, a
    latency proxy that needs no target), those the region rejects skipped (``region_valid`` ``None``: no region, every
    one is run); each runs closed-loop as the product runs it, its check during the search one block and the rest
    validation on the same seeds (:func:`qaopt.closed_loop.replay`, the product's stop rule, on the recorded runs),
    until one is valid. The check runs the first block of seeds; validation then runs first the blocks holding a seed
    an earlier configuration failed (the product's ``first_seeds``). A configuration whose check passed and whose validation then did not end valid reached validation and failed
    there. Acceptance on fresh seeds, the same for every path, is not counted. Needs per-run records and MACs
    (``benchmarks/fidelity_closed_loop.py`` writes both since the set ``cropfollow-seed1``); an older set says so
    instead.
    """
    from qaopt.calibrate import Verdict
    from qaopt.closed_loop import replay, validation_blocks

    lacking = [c["id"] for c in configs if "qos" not in c or c["macs"] is None]
    if lacking:
        return {"scored": False, "why": f"configurations {lacking} have no per-run records or MACs (recorded before "
                                        "the closed-loop script kept them)"}
    order = sorted((c for c in configs if not c["reference"]), key=lambda c: (c["macs"], c["id"]))
    spent, failed_in_validation, accepted, failed_seeds = 0, [], None, {}
    for c in order:
        if region_valid is not None and not region_valid[c["id"]]:
            continue
        passed = [goal.passes(q) for q in c["qos"]]
        first = [0, *failed_seeds]  # the check's block, then the failed scenes' blocks
        blocks = validation_blocks(len(passed), test.min_trials, 0, first=first)
        runs, _, verdict = replay(passed, test, len(passed), first=first)
        spent += runs
        failed_seeds.update(dict.fromkeys(i for i in [i for b in blocks for i in b][:runs] if not passed[i]))
        check = blocks[0]
        if verdict == Verdict.VALID:
            accepted = c
            break
        if all(passed[i] for i in check):
            failed_in_validation.append(c["id"])
    cheaper_valid_skipped = [c["id"] for c in order if accepted is not None and c["macs"] < accepted["macs"]
                             and c["verdict"] == "valid" and region_valid is not None and not region_valid[c["id"]]]
    return {"scored": True, "runs_to_accept": spent if accepted is not None else None, "runs_spent": spent,
            "accepted": None if accepted is None else accepted["id"],
            "accepted_macs": None if accepted is None else accepted["macs"],
            "false_valid_reaching_validation": len(failed_in_validation),
            "reached_validation_and_failed": failed_in_validation,
            "valid_and_cheaper_but_screened_out": cheaper_valid_skipped}


def shipped_model(spec, models: dict) -> str:
    """The model and coordinates the spec ships (``ar1@dataset+stress`` for CropFollow), or the nearest the set has."""
    data = spec.calibration.error_data
    name = spec.calibration.error_model + (DATASET_COORDINATES if data.source == "dataset" else "")
    stressed = name + STRESSED
    return stressed if data.stress and stressed in models else name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--closed-loop", type=Path, nargs="+", required=True)
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "cropfollow.yaml")
    ap.add_argument("--budget", type=int, default=None, help="calibration evaluations (default: the spec's)")
    ap.add_argument("--models", default="gaussian,ar1,empirical,shaped",
                    help="error models calibrated on on-policy error data (the spec's own is added, calibrated as the "
                         "spec says)")
    ap.add_argument("--calibration-seeds", type=int, default=1,
                    help="calibrate each model with this many seeds from the spec's: scores are their means (a region "
                         "of 20 evaluations moves with its seed), each seed's under per_seed")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "fidelity.json")
    ap.add_argument("--set", required=True,
                    help="the name this set of configurations is kept under in --out (sets.<name>)")
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    record = provenance()

    from qaopt.spec import load_spec
    from qaopt.spec_adapter import acceptance_of, goal_of

    spec = load_spec(args.spec)
    budget = args.budget or spec.calibration.budget
    metrics = {nn: spec.nns[nn].error_metric.kind for nn in spec.nns}
    configs, reference = merged(args.closed_loop, metrics)
    models, regions = {}, {}
    seeds = [spec.calibration.seed + i for i in range(args.calibration_seeds)]
    names = args.models.split(",")
    names += [spec.calibration.error_model] if spec.calibration.error_model not in names else []
    for model in names:
        calibrated = [calibrate(spec, model, budget, seed) for seed in seeds]
        regions[model] = [region for region, _ in calibrated]
        cost = {k: sum(c[k] for _, c in calibrated) for k in ("simulator_runs", "evaluations")}
        cost["seconds"] = round(sum(c["seconds"] for _, c in calibrated), 1)
        models[model] = {**scored(regions[model], configs, "on_policy"), **cost, "closed_loop_runs": 0,
                         "reach": reach(regions[model][0], reference["on_policy"])}
        print(f"{model}: {models[model]['agreement']} agreement, {models[model]['false_valid']} false-valid, "
              f"{cost['simulator_runs']} simulator runs, {cost['seconds']} s", flush=True)
    if "ar1" in regions and any(c.get("other_rates") for c in configs):  # detectors at their declared rate alone
        models["ar1" + DECLARED_RATE] = {**scored(regions["ar1"], configs, "on_policy", both_kinds=False),
                                         **{k: models["ar1"][k] for k in ("simulator_runs", "evaluations", "seconds",
                                                                          "closed_loop_runs", "reach")}}
    stressed = all("on_policy" + STRESSED in c["points"] for c in configs)
    for model in dict.fromkeys(m for m in ("ar1", spec.calibration.error_model) if m in regions):
        # the same regions in other coordinates: dataset drives (the shipped example's), stress strata
        for name, coordinates in ((model + DATASET_COORDINATES, "dataset"), (model + STRESSED, "on_policy" + STRESSED),
                                  (model + DATASET_COORDINATES + STRESSED, "dataset" + STRESSED)):
            if coordinates.endswith(STRESSED) and not stressed:
                continue
            models[name] = {**scored(regions[model], configs, coordinates),
                            **{k: models[model][k] for k in ("simulator_runs", "evaluations", "seconds",
                                                             "closed_loop_runs")},
                            "reach": reach(regions[model][0], reference[coordinates.removesuffix(STRESSED)])}
    best = max(models, key=lambda m: ((models[m]["agreement"] or 0.0), -models[m]["false_valid"],
                                      -models[m]["simulator_runs"]))
    goal, test = goal_of(spec), acceptance_of(spec)
    for m in models:
        models[m]["pipeline"] = pipeline(configs, models[m]["region_valid"], goal, test)
    shipped = shipped_model(spec, models)
    scores = {"model": shipped, **models[shipped]["pipeline"],
              "without_region": pipeline(configs, None, goal, test)}
    out = {
        **record,
        "configurations": len(configs),
        "models": models,
        "best": best,
        "pipeline": scores,
        "budget": budget,
        "spec": str(args.spec.relative_to(REPO)) if args.spec.is_relative_to(REPO) else str(args.spec),
        "closed_loop": {"runs": sum(c["runs"] for c in configs), "sources": [str(p) for p in args.closed_loop],
                        "verdicts": {c["id"]: c["verdict"] for c in configs}},
        "truth": [{k: c[k] for k in ("id", *metrics, "runs", "failures", "verdict", "points", "other_rates", "macs",
                                     "source")} for c in configs],
    }
    # One file, one entry per set of configurations (each scored on its own); other sets' entries are kept.
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    sets = previous.get("sets", {})
    sets[args.set] = out
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sets": dict(sorted(sets.items()))}, indent=1) + "\n")

    params = spec.evaluator.simulator.params
    print(f"\n{len(configs)} configurations, {out['closed_loop']['runs']} closed-loop runs of "
          f"{params.get('run_length_m', params.get('route_m', '?'))} m; calibration budget {budget}\n")
    print("| error model | decided | agreement | false-valid | simulator runs | calibration s | certified up to "
          "(other NN at the reference) |")
    print("|---|---|---|---|---|---|---|")
    for m, r in models.items():
        agreement = f"{100 * r['agreement']:.0f} %" if r["agreement"] is not None else "-"
        up_to = ", ".join(f"{nn} {v:g}" if v is not None else f"{nn} -" for nn, v in r["reach"].items())
        print(f"| {m} | {r['decided']} | {agreement} | {r['false_valid']} | {r['simulator_runs']} | {r['seconds']} "
              f"| {up_to} |")
    print(f"\nbest: {best}\n")
    if scores["scored"]:
        plain = scores["without_region"]
        print(f"pipeline ({shipped} region, then closed-loop checks and validation, cheapest first): "
              f"{scores['runs_to_accept']} runs to accept configuration {scores['accepted']}, "
              f"{scores['false_valid_reaching_validation']} reaching validation and failing there; without the region: "
              f"{plain['runs_to_accept']} runs to accept {plain['accepted']}, "
              f"{plain['false_valid_reaching_validation']} failing in validation\n")
    else:
        print(f"pipeline: not scored: {scores['why']}\n")
    names = list(models)
    print("| # | " + " | ".join(metrics) + " | closed loop | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(metrics) + "---|" + "---|" * len(names))
    for c in configs:
        p = c["points"]["on_policy"]
        nn_cells = " | ".join(f"{c[nn]} ({p[nn]:.3g})" for nn in metrics)
        cells = " | ".join("valid" if models[m]["region_valid"][c["id"]] else "-" for m in names)
        print(f"| {c['id']} | {nn_cells} | {c['failures']}/{c['runs']} {c['verdict']} | {cells} |")


if __name__ == "__main__":
    main()
