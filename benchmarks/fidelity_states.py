"""Fidelity diagnosis: in which states real NNs fail the closed loop, and two ideas tried on it.

    .venv/bin/python benchmarks/fidelity_states.py --closed-loop docs/benchmarks/fidelity_device/seed2 \
        --scenes docs/benchmarks/fidelity_device/seed2-scenes [--spec examples/cropfollow.yaml] \
        [--band heading:0:8 distance:0.5:0.1] [--score seed0=run1,run2 seed2=seed2 knobs=knobs-seed0] \
        [--json docs/benchmarks/fidelity_states.json]

``--closed-loop`` is a fidelity set (``benchmarks/fidelity_closed_loop.py``: per-run verdicts, each variant's residuals
on the on-policy drives and the stress strata); ``--scenes`` is what ``benchmarks/fidelity_scene_errors.py`` measured
on the same variants, rebuilt as the same bytes: their errors on reference-steered drives through each closed-loop
seed (``scene_residuals.npz``) and the configurations' runs driven again with every frame's outputs kept
(``steered.npz``, ``steered.json``). The script reports

1. ``scenes``: whether a variant's error on a seed's scene (the first steps of a drive through it, the reference NNs
   steering) says whether it fails that seed: per failing configuration and approximated NN, the AUC of the
   per-seed error ratio (variant over reference on the same frames) of the failed seeds against the passed ones;
2. ``excursions``: how far from the row's centre each driven-again run went (``--band`` names each NN's centre), and
   how each NN and the reference NN erred in the ``WINDOW`` steps up to the farthest point;
3. ``reference_by_state``: the reference NNs' error and bias by how far the true value is from the centre, over every
   frame of those runs;
4. ``band``: each configuration's error ratio to the reference on the frames of the on-policy drives and strata whose
   true value is at least ``--band``'s offset from the centre, beside the ratio on all frames (an error conditioned
   on the true value), with how well each separates the invalid configurations from the valid ones;
5. ``profiled``: an error model conditioned on the true value (:class:`Profiled`: the reference's bias and spread per
   truth bin, fitted to the spec's error data; a level scales the spread and keeps the bias profile, so the reference's
   own blindness far from the centre is always injected), calibrated as the spec's calibration runs and scored on
   each ``--score`` set (``name=folder,folder`` of ``docs/benchmarks/fidelity_device``) beside the spec's model.

Writes ``--json`` and prints the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import REPO, merged, reach, read_closed_loop, reference_variants, score  # noqa: E402

from qaopt.calibrate import register_error_model  # noqa: E402
from qaopt.calibrate.error_features import lag1_autocorrelation  # noqa: E402
from qaopt.calibrate.errors import CalibrationError  # noqa: E402

WINDOW = 30
"""Perception steps (3 s at CropFollow's 10 Hz) up to a run's farthest point from the centre."""
BIN_QUANTILES = (0.0, 0.01, 0.03, 0.1, 0.25, 0.5, 0.75, 0.9, 0.97, 0.99, 1.0)
"""Truth bins of :class:`Profiled`: finer where the true value is rare, since that is where real NNs err most."""
STATE_BINS = {"heading": (0, 2, 4, 6, 8, 10, 15, 20, 30, 45), "distance": (0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)}
"""Bins of the distance from the centre in ``reference_by_state`` (CropFollow's units: degrees, ratio)."""
DEVIATION_SAMPLE = 400
"""True values kept in a :class:`Profiled` model to map a target level to its spread factor."""


@dataclass
class ProfiledInjector:
    """``truth + bias(truth) + factor * spread(truth) * z_t``, ``z_t`` a unit AR(1); state per episode, restarts at 0."""

    model: Profiled
    factor: float
    _z: np.ndarray | None = field(default=None, repr=False)

    def __call__(self, truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        truth = np.asarray(truth, dtype=float)
        m, fresh = self.model, rng.standard_normal(np.shape(truth))
        if t == 0 or self._z is None or self._z.shape != truth.shape:
            self._z = fresh
        else:
            self._z = m.rho * self._z + math.sqrt(1 - m.rho**2) * fresh
        return truth + np.interp(truth, m.centres, m.bias) + self.factor * np.interp(truth, m.centres, m.spread) * self._z


@register_error_model
@dataclass(frozen=True)
class Profiled:
    """Errors conditioned on the true value: the reference's bias and spread per truth bin (see the module's 5.)."""

    metric: str
    centres: tuple[float, ...]
    bias: tuple[float, ...]
    spread: tuple[float, ...]
    rho: float
    truths: tuple[float, ...]

    name: ClassVar[str] = "profiled"
    needs_residuals: ClassVar[bool] = True
    detector_bursts: ClassVar[float | None] = None
    components = frozenset({"metric"})

    def level(self, factor: float) -> float:
        """The expected L1 on the fitted truths with the spread scaled by ``factor`` (folded normal means)."""
        x = np.asarray(self.truths)
        b, s = np.interp(x, self.centres, self.bias), factor * np.interp(x, self.centres, self.spread)
        return float(np.mean(s * math.sqrt(2 / math.pi) * np.exp(-(b**2) / (2 * s**2)) + b * (1 - 2 * norm.cdf(-b / s))))

    def injector(self, setting) -> ProfiledInjector:
        lo, hi = 1e-3, 1e3  # level() grows with the factor: bisect it on a log scale
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if self.level(mid) < setting["metric"] else (lo, mid)
        return ProfiledInjector(self, math.sqrt(lo * hi))

    def config(self) -> dict:
        return {"model": self.name, "metric": self.metric, "centres": list(self.centres), "bias": list(self.bias),
                "spread": list(self.spread), "rho": self.rho, "truths": list(self.truths)}

    @classmethod
    def fit(cls, residuals, metric: str = "l1", truths=None) -> Profiled:
        if metric != "l1" or truths is None:
            raise CalibrationError("the profiled error model needs an l1 NN's residuals with their true values")
        seqs = [np.asarray(r, dtype=float).ravel() for r in residuals]
        tseqs = [np.asarray(t, dtype=float).ravel() for t in truths]
        e, x = np.concatenate(seqs), np.concatenate(tseqs)
        edges = np.quantile(x, BIN_QUANTILES)
        idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
        rows = [(float(np.median(x[idx == i])), float(e[idx == i].mean()), float(e[idx == i].std()))
                for i in range(len(edges) - 1) if (idx == i).sum() >= 3]
        centres, bias, spread = (np.array(c) for c in zip(*rows))
        rho = lag1_autocorrelation([(r - np.interp(t, centres, bias)) / np.interp(t, centres, spread)
                                    for r, t in zip(seqs, tseqs)])
        return cls(metric=metric, centres=tuple(map(float, centres)), bias=tuple(map(float, bias)),
                   spread=tuple(map(float, spread)), rho=float(rho),
                   truths=tuple(map(float, x[:: max(1, x.size // DEVIATION_SAMPLE)])))


def auc(positive: np.ndarray, negative: np.ndarray) -> float | None:
    """P(a positive scores above a negative), ties half: 0.5 is no association."""
    if not len(positive) or not len(negative):
        return None
    p, n = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float(np.mean((p > n) + 0.5 * (p == n)))


def scene_association(folder: Path, scenes: Path, references: dict[str, str], goal) -> dict:
    """1.: per failing configuration and approximated NN, the AUC of its per-seed error ratio, failed against passed."""
    errors = json.loads((scenes / "scene_errors.json").read_text())
    seeds = errors["seeds"]["selection"]
    drive = {n: np.asarray(v["per_drive_l1"]["selection"]) for n, v in errors["variants"].items()}
    rows = []
    for rec in sorted(read_closed_loop(folder)[1], key=lambda r: r["id"]):
        failed = np.array([not goal.passes(q) for q in rec["qos"]])
        if not failed.any():
            continue
        for nn, ref in references.items():
            if rec[nn] == ref:
                continue
            ratio = drive[rec[nn]] / drive[ref]
            rows.append({"id": rec["id"], "nn": nn, "variant": rec[nn], "failed_seeds": int(failed.sum()),
                         "auc": auc(ratio[failed], ratio[~failed])})
    values = [r["auc"] for r in rows if r["auc"] is not None]
    return {"steps_per_drive": errors["steps"], "seeds": len(seeds), "rows": rows,
            "mean_auc": round(float(np.mean(values)), 3) if values else None}


def excursions(scenes: Path, band: dict[str, tuple[float, float]]) -> dict:
    """2. and 3.: each driven-again run's farthest point (where some NN's true value is farthest from its centre, in
    units of its band's offset) and its window's errors; the reference by state."""
    centres = {nn: c for nn, (c, _) in band.items()}
    runs = json.loads((scenes / "steered.json").read_text())["steered"]
    out, by_state = [], {nn: ([], []) for nn in centres}
    with np.load(scenes / "steered.npz") as z:
        for key, run in runs.items():
            row = {"run": key, "failed_in_set": run["failed_in_set"], "failed": run["replayed_failed"], "nns": {}}
            far = {nn: np.abs(z[f"{key}/{nn}/truth"] - c) for nn, c in centres.items()}
            end = int(np.argmax(np.max([far[nn] / band[nn][1] for nn in far], axis=0)))
            window = slice(max(0, end - WINDOW), end + 1)
            for nn in centres:
                truth = z[f"{key}/{nn}/truth"]
                variant, reference = z[f"{key}/{nn}/variant"] - truth, z[f"{key}/{nn}/reference"] - truth
                row["nns"][nn] = {"farthest": round(float(far[nn].max()), 4),
                                  "window_l1": round(float(np.abs(variant[window]).mean()), 4),
                                  "window_reference_l1": round(float(np.abs(reference[window]).mean()), 4),
                                  "run_l1": round(float(np.abs(variant).mean()), 4),
                                  "run_reference_l1": round(float(np.abs(reference).mean()), 4)}
                by_state[nn][0].append(far[nn])
                by_state[nn][1].append(reference)
            out.append(row)
    states = {}
    for nn, (far, err) in by_state.items():
        far, err = np.concatenate(far), np.concatenate(err)
        edges = STATE_BINS.get(nn, tuple(np.quantile(far, np.linspace(0, 1, 9))))
        states[nn] = [{"from": a, "to": b, "frames": int(m.sum()), "l1": round(float(np.abs(err[m]).mean()), 4),
                       "bias": round(float(err[m].mean()), 4)}
                      for a, b in zip(edges[:-1], edges[1:]) if (m := (far >= a) & (far < b)).sum() >= 20]
    failed = [r for r in out if r["failed"]]
    passed = [r for r in out if not r["failed"]]
    return {"runs": out, "reference_by_state": states, "window_steps": WINDOW,
            "farthest": {nn: {"failed_min": min(r["nns"][nn]["farthest"] for r in failed) if failed else None,
                              "passed_max": max(r["nns"][nn]["farthest"] for r in passed) if passed else None}
                         for nn in centres},
            "replayed_as_recorded": sum(r["failed"] == r["failed_in_set"] for r in out)}


def band_ratios(folder: Path, band: dict[str, tuple[float, float]], references: dict[str, str]) -> dict:
    """4.: each configuration's error ratio to the reference in the band and on all frames of its drives and strata."""
    frames: dict[str, tuple[list, list]] = {}
    with np.load(folder / "fidelity_residuals.npz") as z:
        for key in z.files:
            parts = key.split("/")
            if parts[-2] == "residual":
                r, t = frames.setdefault(parts[0], ([], []))
                r.append(z[key])
                t.append(z["/".join(parts[:-2] + ["truth", parts[-1]])])
    pooled = {v: (np.concatenate(r), np.concatenate(t)) for v, (r, t) in frames.items()}
    rows = []
    for rec in sorted(read_closed_loop(folder)[1], key=lambda r: r["id"]):
        ratios = {}
        for nn, (centre, offset) in band.items():
            (r, t), (rr, _) = pooled[rec[nn]], pooled[references[nn]]
            inside = np.abs(t - centre) >= offset
            ratios[nn] = {"all": round(float(np.abs(r).mean() / np.abs(rr).mean()), 3),
                          "band": round(float(np.abs(r[inside]).mean() / np.abs(rr[inside]).mean()), 3),
                          "band_frames": int(inside.sum())}
        rows.append({"id": rec["id"], "verdict": rec["verdict"], **{nn: rec[nn] for nn in band}, "ratios": ratios})
    decided = [r for r in rows if r["verdict"] != "undecided"]
    separation = {}
    for kind in ("all", "band"):
        worst = {r["id"]: max(r["ratios"][nn][kind] for nn in band) for r in decided}
        separation[kind] = auc([worst[r["id"]] for r in decided if r["verdict"] == "invalid"],
                               [worst[r["id"]] for r in decided if r["verdict"] == "valid"])
        for nn in band:
            separation[f"{kind}:{nn}"] = auc([r["ratios"][nn][kind] for r in decided if r["verdict"] == "invalid"],
                                             [r["ratios"][nn][kind] for r in decided if r["verdict"] == "valid"])
    return {"band": {nn: {"centre": c, "offset": o} for nn, (c, o) in band.items()}, "configurations": rows,
            "separation_auc": {k: (round(v, 3) if v is not None else None) for k, v in separation.items()}}


def profiled_scores(spec, sets: dict[str, list[Path]], folder: Path, bands: dict) -> dict:
    """5.: the spec's error model and :class:`Profiled` calibrated as the spec says, scored on each set; and the spec's
    model scored on ``folder`` with 4.'s band ratio as a stratum (``dataset+stress+band``: each NN at the larger of its
    stressed coordinate and the reference's dataset error times its band ratio)."""
    from qaopt.region_calibration import build_calibration

    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])
    metrics = {nn: spec.nns[nn].error_metric.kind for nn in spec.nns}
    out = {}
    for model in (spec.calibration.error_model, Profiled.name):
        calibrated = spec.model_copy(update={
            "plugins": [*spec.plugins, Path(__file__).stem],
            "calibration": spec.calibration.model_copy(update={"error_model": model})})
        start = time.perf_counter()
        cal = build_calibration(calibrated)
        region = cal.search(spec.calibration.strategy, spec.calibration.budget, runs=spec.calibration.runs)
        row = {"seconds": round(time.perf_counter() - start, 1), "simulator_runs": int(region.trials), "sets": {}}
        if model == Profiled.name:
            row["fitted"] = {nn: {k: cal.models[nn].config()[k] for k in ("centres", "bias", "spread", "rho")}
                             for nn in metrics}
        for name, folders in sets.items():
            configs, reference = merged(folders, metrics)
            row["reach"] = reach(region, reference["dataset"])
            for coordinates in ("dataset", "dataset+stress"):
                if all(coordinates in c["points"] for c in configs):
                    s = score(region, configs, coordinates)
                    row["sets"][f"{name}@{coordinates}"] = {k: s[k] for k in ("decided", "agreement", "false_valid")}
        if model == spec.calibration.error_model:
            configs, reference = merged([folder], metrics)
            ratios = {r["id"]: r["ratios"] for r in bands["configurations"]}
            for c in configs:
                c["points"]["band"] = {nn: max(c["points"]["dataset+stress"][nn],
                                               reference["dataset"][nn] * ratios[c["id"]][nn]["band"]) for nn in metrics}
            s = score(region, configs, "band")
            row["sets"][f"{folder.name}@dataset+stress+band"] = {k: s[k] for k in ("decided", "agreement", "false_valid")}
        out[model] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--closed-loop", type=Path, required=True)
    ap.add_argument("--scenes", type=Path, required=True)
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "cropfollow.yaml")
    ap.add_argument("--band", nargs="+", default=["heading:0:8", "distance:0.5:0.1"], metavar="NN:CENTRE:OFFSET")
    ap.add_argument("--score", nargs="*", default=["seed0=run1,run2", "seed2=seed2", "knobs=knobs-seed0"],
                    metavar="NAME=FOLDER,FOLDER")
    ap.add_argument("--json", type=Path, default=REPO / "docs" / "benchmarks" / "fidelity_states.json")
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()

    from qaopt.spec import load_spec
    from qaopt.spec_adapter import goal_of

    spec = load_spec(args.spec)
    goal = goal_of(spec)
    band = {nn: (float(c), float(o)) for nn, c, o in (b.split(":") for b in args.band)}
    metrics = {nn: spec.nns[nn].error_metric.kind for nn in spec.nns}
    references = reference_variants(read_closed_loop(args.closed_loop)[0], metrics)
    scenes = scene_association(args.closed_loop, args.scenes, references, goal)
    print(f"1. scenes: mean AUC {scenes['mean_auc']} over {len(scenes['rows'])} (configuration, NN) pairs "
          f"(0.5: the error on a seed's scene says nothing of failing it)")
    excursion = excursions(args.scenes, band)
    print(f"2. excursions: {excursion['replayed_as_recorded']} of {len(excursion['runs'])} runs replayed as recorded; "
          f"farthest from the centre: {excursion['farthest']}")
    for nn, rows in excursion["reference_by_state"].items():
        print(f"3. reference {nn} by distance from the centre: "
              + "; ".join(f"{r['from']}-{r['to']}: L1 {r['l1']:.3g} bias {r['bias']:+.3g} ({r['frames']})" for r in rows))
    bands = band_ratios(args.closed_loop, band, references)
    print(f"4. band ratios: separation AUC {bands['separation_auc']}")
    for r in bands["configurations"]:
        print(f"   {r['id']:>3} {r['verdict']:<10} " + " | ".join(
            f"{r[nn]}: all {v['all']:.2f} band {v['band']:.2f}" for nn, v in r["ratios"].items()))
    folders = {name: [REPO / "docs" / "benchmarks" / "fidelity_device" / f for f in spec_.split(",")]
               for name, spec_ in (s.split("=") for s in args.score)}
    profiled = profiled_scores(spec, folders, args.closed_loop, bands) if folders else {}
    for model, row in profiled.items():
        print(f"5. {model}: reach {row['reach']}, " + "; ".join(
            f"{k} {v['agreement']} / {v['false_valid']} FV of {v['decided']}" for k, v in row["sets"].items()))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        **prov,
        "scenes": scenes, "excursions": excursion, "band": bands, "profiled": profiled,
    }, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
