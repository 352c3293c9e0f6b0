"""What LaneKeep's region misses about its stop detector: when each sign's detection begins.

    python benchmarks/lanekeep_stop_onsets.py --closed-loop DIR [DIR ...] [--why DIR --cache-dir CACHE]

Part 1 reads fidelity ground-truth folders (``benchmarks/fidelity_closed_loop.py``'s ``--out``: its
``fidelity_residuals.npz``, ``variants.json`` and ``closed_loop/<id>.json``) and prints, per stop-detector
variant, its confusion codes on the on-policy drives cut into sign events (runs of frames whose truth is
positive): the miss rate the region places it by, the false-alarm rate, how many frames late its first
detection of a sign comes, its miss rate on each sign's first ``--onset`` frames, and where the streak of
``--debounce`` detections the car acts on begins against the sign's first frame (negative: early, on false
alarms just before the sign is in range), beside the closed-loop verdicts of the configurations that change
only the detector.

Part 2 (``--why``: a folder whose ``closed_loop/<id>.json`` keep every QoS metric per run, as
``fidelity_closed_loop.py`` writes) prints which QoS metric failed each failing run of ``--config``, then
drives those runs' seeds and as many passing ones, with the reference NNs steering and with the configuration's,
and prints per sign where the detector variant's acted-on streak begins there: the states the closed loop
failed in.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from qaopt.app_spec.nn_errors import FALSE_ALARM, MISS, TRUE_NEGATIVE, TRUE_POSITIVE


def sign_events(positive: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of positive frames (a sign in view)."""
    edges = np.flatnonzero(np.diff(np.r_[0, positive.astype(int), 0]))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


EARLY = 10
"""Frames before each sign's first positive frame in which a detection streak counts too (it starts the stop early)."""


def acted_on(detected: np.ndarray, debounce: int) -> int:
    """Frames into a sign until the first streak of ``debounce`` detections in a row begins: where the car places
    the line it brakes for (LaneKeep's ``stack.debounce_frames``); the sign's length when there is none."""
    streak = np.convolve(detected.astype(int), np.ones(debounce, dtype=int), mode="valid") == debounce
    return int(np.argmax(streak)) if streak.any() else len(detected)


def onset_stats(sequences: list[np.ndarray], onset: int, debounce: int = 2) -> dict[str, float]:
    """A detector's confusion codes (one array per drive) summarised per sign event; ``offsets``: where the acted-on
    streak begins, in frames from the sign's first positive frame (negative: a false-alarm streak before it)."""
    misses = positives = false_alarms = negatives = onset_misses = onset_frames = 0
    leads, offsets = [], []
    for codes in sequences:
        positive = (codes == MISS) | (codes == TRUE_POSITIVE)
        misses += int((codes == MISS).sum())
        positives += int(positive.sum())
        false_alarms += int((codes == FALSE_ALARM).sum())
        negatives += int(((codes == FALSE_ALARM) | (codes == TRUE_NEGATIVE)).sum())
        detected = (codes == TRUE_POSITIVE) | (codes == FALSE_ALARM)
        for start, end in sign_events(positive):
            lead_in = min(EARLY, start)
            offsets.append(acted_on(detected[start - lead_in:end], debounce) - lead_in)
            missed = codes[start:end] == MISS
            leads.append(acted_on(~missed, 1))  # the first detection
            onset_misses += int(missed[:onset].sum())
            onset_frames += min(onset, end - start)
    return {"events": len(leads), "miss_rate": misses / max(positives, 1),
            "false_alarm_rate": false_alarms / max(negatives, 1), "late_frames_mean": float(np.mean(leads)),
            "late_frames_max": max(leads, default=0), "onset_miss_rate": onset_misses / max(onset_frames, 1),
            "offsets": offsets}


def variants_table(folders: list[Path], nn: str, onset: int, debounce: int) -> str:
    rows, verdicts = {}, {}
    for folder in folders:
        variants = json.loads((folder / "variants.json").read_text())
        nns = {meta["nn"] for meta in variants.values()}
        with np.load(folder / "fidelity_residuals.npz") as npz:
            for name, meta in variants.items():
                if meta.get("nn") != nn or name in rows:
                    continue
                count = sum(1 for k in npz.files if k.startswith(f"{name}/residual/"))
                rows[name] = onset_stats([npz[f"{name}/residual/{i}"] for i in range(count)], onset, debounce)
        for path in sorted((folder / "closed_loop").glob("*.json")):
            row = json.loads(path.read_text())
            if all(row[other].endswith("-ref") for other in nns - {nn}):
                verdicts.setdefault(row[nn], f"{row['failures']}/{row['runs']} failed, {row['verdict']}")
    out = [f"| {nn} variant | sign events | miss rate | false-alarm rate | first detection, frames late (mean, max) | "
           f"miss rate on each sign's first {onset} frames | acted-on streak, frames from each sign's start | "
           "closed loop, the other NNs the references |", "|---|---|---|---|---|---|---|---|"]
    for name, s in sorted(rows.items(), key=lambda kv: kv[1]["miss_rate"]):
        out.append(f"| {name} | {s['events']} | {s['miss_rate']:.4f} | {s['false_alarm_rate']:.4f} | "
                   f"{s['late_frames_mean']:.2f}, {s['late_frames_max']} | {s['onset_miss_rate']:.3f} | "
                   f"{' '.join(f'{o:+d}' for o in sorted(s['offsets']))} | {verdicts.get(name, '-')} |")
    return "\n".join(out)


def why(folder: Path, config: int, spec_path: Path, cache: Path, nn: str, passing: int, debounce: int) -> str:
    """Part 2: the failing runs' QoS metrics, and the variant's first detections on their seeds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fidelity_closed_loop import InLoopNN, build_variants, configurations_of

    from qaopt.closed_loop import VALIDATION_SEED_BASE
    from qaopt.spec import load_spec
    from qaopt.spec_adapter import make_evaluator

    row = json.loads((folder / "closed_loop" / f"{config}.json").read_text())
    metrics = row["metrics"]
    failing = [i for i, v in enumerate(row["qos"]) if v > 0]
    ok = [i for i, v in enumerate(row["qos"]) if v == 0][:passing]
    out = [f"Configuration {config} ({', '.join(f'{k} {v}' for k, v in row.items() if isinstance(v, str) and k != 'verdict')}): "
           f"{row['failures']}/{row['runs']} runs failed", "",
           "| run | " + " | ".join(m for m in metrics if m != "violations") + " |",
           "|---|" + "---|" * (len(metrics) - 1)]
    out += [f"| {i} | " + " | ".join(f"{metrics[m][i]:.3g}" for m in metrics if m != "violations") + " |" for i in failing]
    spec = load_spec(spec_path)
    tables, _ = configurations_of(spec)
    variant = row[nn]
    reference = {n: next(k for k in tables[n] if k.endswith("-ref")) for n in tables}
    configured = {n: row[n] for n in tables}
    built, _ = build_variants(spec, tables, cache, "cpu", {*configured.values(), *reference.values()}, 0,
                              lambda _: None)
    steerings = {"the references": {n: InLoopNN(built[v]["cand"], "cpu") for n, v in reference.items()},
                 "the configuration": {n: InLoopNN(built[v]["cand"], "cpu") for n, v in configured.items()}}
    detector, theirs = steerings["the configuration"][nn], steerings["the references"][nn]
    evaluator = make_evaluator(spec)
    out += ["", f"Each run's seed driven 450 steps with the reference NNs steering, and again with the configuration's "
            f"(the closed loop's own drive, up to the sign), and {variant} on the frames: how many frames into each "
            f"sign its first {debounce} detections in a row begin, the streak the car acts on (negative: that many frames "
            f"before the sign is in range, counted from {EARLY} before; the reference detector's in brackets)", "",
            "| run | closed loop | signs | acted-on streak, references steering | the configuration steering |",
            "|---|---|---|---|---|"]
    for label, runs in (("failed", failing), ("passed", ok)):
        cells: dict[int, list[str]] = {run: [] for run in runs}
        for steering in steerings.values():
            recording = evaluator.record_perception(steering, [VALIDATION_SEED_BASE + i for i in runs], 450)[nn]
            x, truth = np.asarray(recording.inputs), np.asarray(recording.truth)[:, 0] >= 0.5
            detected = [np.asarray(f(x)).reshape(-1) >= 0.5 for f in (detector, theirs)]
            for run, seq in zip(runs, recording.sequences, strict=True):
                seq = np.asarray(seq)
                late = []
                for a, b in sign_events(truth[seq]):
                    # From EARLY frames before the sign is in range: a streak there places the line too soon.
                    lead_in = min(EARLY, a)
                    ours_at, reference_at = (acted_on(d[seq][a - lead_in:b], debounce) - lead_in for d in detected)
                    late.append(f"{ours_at:+d} ({reference_at:+d})")
                cells[run].append(", ".join(late) or "no sign")
        out += [f"| {run} | {label} | {cells[run][0].count('(')} | {cells[run][0]} | {cells[run][1]} |" for run in runs]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--closed-loop", type=Path, nargs="+", required=True)
    ap.add_argument("--nn", default="stop")
    ap.add_argument("--onset", type=int, default=5, help="frames at each sign's start the onset miss rate counts")
    ap.add_argument("--why", type=Path, default=None)
    ap.add_argument("--config", type=int, default=26)
    ap.add_argument("--spec", type=Path, default=Path("examples/lanekeep.yaml"))
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--passing", type=int, default=10, help="passing runs to drive beside the failing ones")
    ap.add_argument("--debounce", type=int, default=2, help="detections in a row the car acts on (the spec's "
                    "evaluator.simulator.params.stack.debounce_frames; LaneKeep's default 2)")
    args = ap.parse_args()
    print(variants_table(args.closed_loop, args.nn, args.onset, args.debounce))
    if args.why is not None:
        if args.cache_dir is None:
            ap.error("--why needs --cache-dir (the ground truth's cache, where its variants are built)")
        print()
        print(why(args.why, args.config, args.spec, args.cache_dir, args.nn, args.passing, args.debounce))


if __name__ == "__main__":
    main()
