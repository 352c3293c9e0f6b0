"""Fidelity: would a tail coordinate (a high quantile of an NN's per-frame error) or a persistence
coordinate (the error that stays once the frames are averaged) separate the configurations that fail the closed
loop from those that pass, where the mean error does not?

    .venv/bin/python benchmarks/fidelity_tails.py --closed-loop DIR [DIR ...] --set NAME
                                                  [--spec examples/cropfollow.yaml] [--quantiles 0.95,0.99]
                                                  [--windows 10,25] [--out docs/benchmarks/fidelity_tails.json]

``DIR`` is a fidelity ground-truth folder (``benchmarks/fidelity_closed_loop.py`` wrote it; the same folders
``benchmarks/fidelity.py`` scores): each NN variant's on-policy residual sequences
(``fidelity_residuals.npz``) and the configurations' closed-loop verdicts on 48 runs. Nothing is built or
run: every figure comes from those recorded residuals, so this asks only whether the on-policy error data
already holds the signal, in its tails rather than its mean.

For each NN with a continuous metric (L1; a detector's miss rate has no per-frame tail), each variant's
mean absolute residual and its quantiles; its bias, the absolute mean of its signed residuals; and for each
``--windows`` W its slow error ``slowW``, the mean absolute moving average of its signed residuals over W
consecutive frames of one drive (a filter between the NNs and the controller, such as CropFollow's EKF, averages
noise away but not an error that persists for W frames, which the mean absolute error cannot tell from noise);
and its attenuation ``atten``, ``1 / (1 + slope)`` of its signed residuals on the true value (a pruned NN that
flattens large values has one above the reference's). A folder whose residuals include the stress strata's drives
(recorded since the set ``cropfollow-seed2``) adds the same statistics on each stratum, ``<stratum>:<statistic>``.
Each statistic is taken over the reference variant's of the same folder (a folder
without the reference takes another folder's: the reference is not rebuilt). A configuration's statistic is
its worst NN's ratio, and each NN's ratio alone. The separation score of a statistic is the share of
(invalid, valid) pairs of configurations in which the invalid one has the larger statistic (the ROC area: 1.0 separates perfectly,
0.5 is chance); undecided configurations are left out. Writes ``sets.<--set>`` of ``--out`` (other sets
kept) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import REPO, read_closed_loop, reference_variants  # noqa: E402

MEAN = "mean"
BIAS = "bias"
ATTENUATION = "atten"


def _slow(drive: np.ndarray, window: int) -> np.ndarray:
    """The moving average of one drive's signed residuals over ``window`` consecutive frames (whole windows only)."""
    if len(drive) < window:
        return np.array([drive.mean()]) if len(drive) else drive
    return np.convolve(drive, np.ones(window) / window, mode="valid")


def _attenuation(signed: np.ndarray, truth: np.ndarray) -> float:
    """``1 / (1 + slope)`` of the signed residuals regressed on the true value: how much less the NN's output moves
    than the truth (1: it follows it; 2: half as much), the feature of a pruned NN that flattens large headings."""
    slope = np.polyfit(truth, signed, 1)[0] if np.ptp(truth) > 0 else 0.0
    return float(1.0 / max(1.0 + slope, 0.05))


def _statistics(drives: list[np.ndarray], truths: list[np.ndarray], quantiles: list[float],
                windows: list[int]) -> dict[str, float]:
    signed = np.concatenate(drives)
    frames = np.abs(signed)
    return {MEAN: float(frames.mean()), **{f"q{q}": float(np.quantile(frames, q)) for q in quantiles},
            BIAS: float(abs(signed.mean())), ATTENUATION: _attenuation(signed, np.concatenate(truths)),
            **{f"slow{w}": float(np.abs(np.concatenate([_slow(d, w) for d in drives])).mean()) for w in windows}}


def residual_tails(folder: Path, quantiles: list[float], windows: list[int]) -> dict[str, dict[str, float]]:
    """Each variant's statistics of its residuals over all its on-policy drives (the module docstring), and over
    each stress stratum's drives where the folder kept them (``<stratum>:<statistic>``)."""
    drives: dict[tuple[str, str], dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    with np.load(folder / "fidelity_residuals.npz") as npz:
        for key in sorted(npz.files, key=lambda k: (k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1]))):
            where, kind, _ = key.rsplit("/", 2)
            variant, _, stratum = where.partition("/")  # "<variant>/..." on-policy, "<variant>/<stratum>/..."
            drives[variant, stratum][kind].append(np.asarray(npz[key], dtype=float).ravel())
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (variant, stratum), kinds in drives.items():
        stats = _statistics(kinds["residual"], kinds["truth"], quantiles, windows)
        out[variant].update({(f"{stratum}:{k}" if stratum else k): v for k, v in stats.items()
                             if not (stratum and k.startswith("slow"))})
    return dict(out)


def separation(configs: list[dict], value) -> float | None:
    """The share of (invalid, valid) pairs where the invalid configuration's ``value(config)`` is larger (ties
    half)."""
    bad = [value(c) for c in configs if c["verdict"] == "invalid"]
    good = [value(c) for c in configs if c["verdict"] == "valid"]
    if not bad or not good:
        return None
    return sum(1.0 if b > g else 0.5 if b == g else 0.0 for b in bad for g in good) / (len(bad) * len(good))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--closed-loop", type=Path, nargs="+", required=True)
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "cropfollow.yaml")
    ap.add_argument("--quantiles", default="0.95,0.99")
    ap.add_argument("--windows", default="10,25", help="frames each slow error averages over (comma-separated)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "fidelity_tails.json")
    ap.add_argument("--set", required=True, help="the name this set is kept under in --out (sets.<name>)")
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    from qaopt.app_spec.nn_errors import is_class_metric
    from qaopt.spec import load_spec

    spec = load_spec(args.spec)
    metrics = {nn: spec.nns[nn].error_metric.kind for nn in spec.nns}
    continuous = [nn for nn, kind in metrics.items() if not is_class_metric(kind)]
    quantiles = [float(q) for q in args.quantiles.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    statistics = [MEAN, *(f"q{q}" for q in quantiles), BIAS, ATTENUATION, *(f"slow{w}" for w in windows)]

    folders = []
    for folder in args.closed_loop:
        variants, records = read_closed_loop(folder)
        folders.append((folder, records, reference_variants(variants, metrics),
                        residual_tails(folder, quantiles, windows)))
    reference_stats = {}
    for _, _, references, tails in folders:
        reference_stats.update({nn: tails[name] for nn, name in references.items() if name in tails})
    # statistics of the stress strata, where every folder's variants have them (sets recorded since cropfollow-seed2)
    strata = [k for k in next(iter(reference_stats.values()), {}) if ":" in k
              and all(k in t for _, _, _, tails in folders for t in tails.values())]
    statistics += strata
    missing = [nn for nn in continuous if nn not in reference_stats]
    if missing:
        raise SystemExit(f"no folder holds the reference variant's residuals of {', '.join(missing)}")

    configs: dict[str, dict] = {}  # a later folder's record of a configuration replaces an earlier one's
    for folder, records, _, tails in folders:
        for record in records:
            ratios = {nn: {s: tails[record[nn]][s] / reference_stats[nn][s] for s in statistics} for nn in continuous}
            configs[str(record["id"])] = {
                "id": record["id"], **{nn: record[nn] for nn in metrics}, "runs": record["runs"],
                "failures": record["failures"], "verdict": record["verdict"], "source": folder.name,
                "ratios": ratios, "worst": {s: max(r[s] for r in ratios.values()) for s in statistics},
            }
    rows = sorted(configs.values(), key=lambda c: int(c["id"]))
    scores = {"worst": {s: separation(rows, lambda c, s=s: c["worst"][s]) for s in statistics},
              **{nn: {s: separation(rows, lambda c, nn=nn, s=s: c["ratios"][nn][s]) for s in statistics}
                 for nn in continuous}}

    out = json.loads(args.out.read_text()) if args.out.exists() else {"sets": {}}
    out["sets"][args.set] = {
        **prov,
        "nns": continuous, "statistics": statistics, "separation": scores,
        "decided": sum(c["verdict"] != "undecided" for c in rows), "configurations": rows,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")

    print(f"{args.set}: {len(rows)} configurations, {out['sets'][args.set]['decided']} decided; each cell the "
          "variant's statistic over the reference's\n")
    header = " | ".join(f"{nn} {s}" for nn in continuous for s in statistics)
    print(f"| # | {' | '.join(metrics)} | closed loop | {header} |")
    print("|---|" + "---|" * len(metrics) + "---|" + "---|" * (len(continuous) * len(statistics)))
    for c in rows:
        cells = " | ".join(f"{c['ratios'][nn][s]:.2f}" for nn in continuous for s in statistics)
        print(f"| {c['id']} | {' | '.join(str(c[nn]) for nn in metrics)} | {c['failures']}/{c['runs']} "
              f"{c['verdict']} | {cells} |")
    print("\nseparation of invalid from valid (1.0 perfect, 0.5 chance), by the worst NN's ratio and by each NN's:")
    for by, row in scores.items():
        print(f"- {by}: " + ", ".join(f"{s} {v:.2f}" if v is not None else f"{s} -" for s, v in row.items()))


if __name__ == "__main__":
    main()
