"""Knobs: each shipped application's NNs over input resolution x pruning x dtype, apart and merged.

For CropFollow (compact NavNets, heading and distance, 3x240x320) and LaneKeep (lane, stop
and lead, 3x120x160), every setting of input scale x prune ratio {0, 0.5} x dtype {fp32,
int8} is built with qaopt's own path (``qaopt.approx.build`` for each NN apart,
``qaopt.approx.build_merged`` for the spec's merge group: one backbone with a head per NN,
distilled from the references as ``search.merge`` says) and measured on ONNX Runtime,
OpenVINO and torch (fp32 only: int8 has no torch kernels), each latency cell in a fresh
process of its own (``qaopt.kernels.compile(...).measure()``, as ``latency_table.py``:
backends' thread pools left spinning by an earlier cell slow a later one).

A row holds each NN's error (a merged row: each member's error from its own view of the ONE
merged candidate), the reference NNs' errors, MACs, and per backend the median with its 95 %
interval and trust flag. ``frame_ms`` is what a frame of the application's NNs costs: for a
separate row, the sum over the app's NNs of the same setting, each on its best backend; for a
merged row, the merged model's best latency (it serves every member per frame).

Fine-tuning: 160 distillation steps for every candidate a pass damaged (pruning, or a scale
below 1), none otherwise. TVM is left out (untuned it takes about 480 ms a frame on this CPU).

    .venv/bin/python benchmarks/knobs.py            # the whole grid, into docs/benchmarks/knobs.json ("table")
    .venv/bin/python benchmarks/knobs.py --quick    # CropFollow, one scale, fp32: shows it works (temp file)

The JSON file is read, its ``table`` key replaced and every other key kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "knobs.json"
BACKENDS = ("onnxruntime", "openvino", "torch")
PRUNE_RATIOS = (0.0, 0.5)
DTYPES = ("fp32", "int8")
FINETUNE_STEPS = 160
CROPFOLLOW_SCALES = (1.0, 0.75, 0.5, 0.375)
APPS = {"cropfollow": ROOT / "examples" / "cropfollow.yaml", "lanekeep": ROOT / "examples" / "lanekeep.yaml"}


# --- one latency cell, in its own process ------------------------------------------------------------

def cell(model_path: str, backend: str, shape: tuple[int, ...], threads: int, cache: Path) -> dict[str, Any]:
    """One backend's figure for one model (run in the cell's own process), or why there is none."""
    import numpy as np
    import torch

    from qaopt import kernels

    model = model_path if model_path.endswith(".onnx") else torch.load(model_path, weights_only=False)
    example = np.zeros(shape, dtype=np.float32)  # what a candidate is compiled and timed on (Candidate.example)
    try:
        compiled = kernels.compile(model, [example], kernels.Target(threads=threads, backend=backend), cache_dir=cache)
        m = compiled.measure()
    except kernels.KernelsError as exc:
        return {"error": str(exc).splitlines()[0]}
    except Exception as exc:  # a crash in one backend is a cell's outcome, not the table's end
        return {"error": f"crashed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return {"median_ms": m.median_ms, "ci_ms": list(m.ci_ms) if m.ci_ms else None, "trusted": m.trusted,
            "untrusted": m.untrusted, "compile_s": round(compiled.compile_seconds, 2), "samples_ms": list(m.samples_ms)}


def cell_in_new_process(model: Path, backend: str, shape: tuple[int, ...], threads: int, cache: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", str(model), backend, ",".join(map(str, shape)), str(cache),
               "--threads", str(threads)]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:  # the process died (a segfault in a runtime, out of memory): the cell says so
        last = out.stderr.strip().splitlines()[-1:] or [f"exit status {out.returncode}"]
        return {"error": f"crashed: the cell's process exited with {out.returncode}: {last[0]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- building ----------------------------------------------------------------------------------------

def knobs_of(scale: float, prune: float, dtype: str):
    from qaopt.approx import Knobs

    damaged = prune > 0 or scale < 1.0
    return Knobs(prune_ratio=prune, prune_steps=1, input_scale=scale, input_align=8, dtype=dtype,
                 finetune_steps=FINETUNE_STEPS if damaged else 0)


def model_file(candidate, folder: Path) -> Path:
    """What the cells load: the int8 QDQ graph, else the candidate's torch module saved whole."""
    import torch

    if candidate.onnx_path is not None:
        return Path(candidate.onnx_path)
    path = folder / f"{candidate.key}.pt"
    if not path.exists():
        torch.save(candidate.module, path)
    return path


def measure_candidate(candidate, folder: Path, args: argparse.Namespace, label: str) -> dict[str, Any]:
    """Every backend's cell for one candidate (or why it cannot run there)."""
    cells: dict[str, Any] = {}
    for backend in BACKENDS:
        if backend not in candidate.runnable_on:
            cells[backend] = {"error": f"{candidate.dtype} has no kernels on {backend}; it runs on "
                                       f"{', '.join(candidate.runnable_on)}"}
        else:
            cells[backend] = cell_in_new_process(model_file(candidate, folder), backend, tuple(candidate.input_shape),
                                                 args.threads, args.cache / "kernels")
        print(f"    {label} {backend}: {show(cells[backend])}"
              + (f" ({cells[backend]['error']})" if "error" in cells[backend] else ""), flush=True)
    return cells


def best(cells: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    ran = [(b, c) for b, c in cells.items() if "error" not in c]
    return min(ran, key=lambda bc: bc[1]["median_ms"]) if ran else None


def app_grid(app: str, spec, args: argparse.Namespace) -> tuple[list[float], list[float], list[str]]:
    if args.quick:
        return [0.5], list(PRUNE_RATIOS), ["fp32"]
    if app == "cropfollow":
        scales = list(CROPFOLLOW_SCALES)
    else:  # the spec's scales: the flattened head takes only 0.9 and 0.85 below 1
        first = next(iter(spec.nns))
        scales = sorted(spec.knobs_for(first)["resolution"]["scales"], reverse=True)
    prunes = [0.0] if (app == "lanekeep" and args.skip_lanekeep_pruning) else list(PRUNE_RATIOS)
    return scales, prunes, list(DTYPES)


def run_app(app: str, args: argparse.Namespace, folder: Path, t0: float) -> list[dict[str, Any]]:
    from qaopt import kernels
    from qaopt.approx import ApproxError, TargetNN, build
    from qaopt.approx.merge import MergeGroup, build_merged
    from qaopt.spec import load_spec

    spec = load_spec(APPS[app])
    names = list(spec.nns)
    print(f"{app}: loading the reference NNs and their data ({', '.join(names)})", flush=True)
    nns = {n: TargetNN.from_spec(n, spec.nns[n]) for n in names}
    group = MergeGroup.from_section(spec.search.merge[0], nns)
    reference = {n: build(nns[n], knobs_of(1.0, 0.0, "fp32"), cache_dir=args.cache, onnx=kernels.onnx).error
                 for n in names}
    print(f"{app}: reference errors " + ", ".join(f"{n} {e:.4g}" for n, e in reference.items()), flush=True)
    scales, prunes, dtypes = app_grid(app, spec, args)
    progress = (lambda message: print(f"      {message}", flush=True))
    rows = []
    for dtype in dtypes:
        for scale in scales:
            for prune in prunes:
                knobs = knobs_of(scale, prune, dtype)
                setting = {"app": app, "input_scale": scale, "prune_ratio": prune, "dtype": dtype,
                           "finetune_steps": knobs.finetune_steps}
                print(f"[{time.perf_counter() - t0:6.0f} s] {app} scale {scale:g} prune {prune:g} {dtype}", flush=True)
                setting_rows = []
                for unit in [*names, group.name]:
                    row: dict[str, Any] = {**setting, "unit": unit, "merged": unit == group.name}
                    start = time.perf_counter()
                    try:
                        if unit == group.name:
                            views = build_merged(group, knobs, cache_dir=args.cache, onnx=kernels.onnx, progress=progress)
                            candidate = views[group.names[0]]
                            row["error"] = {n: views[n].error for n in group.names}
                            row["merge_finetune_steps"] = group.finetune_steps
                        else:
                            candidate = build(nns[unit], knobs, cache_dir=args.cache, onnx=kernels.onnx, progress=progress)
                            row["error"] = {unit: candidate.error}
                    except Exception as exc:  # noqa: BLE001 - a unit that cannot be built is a row's outcome
                        kind = "" if isinstance(exc, ApproxError) else f"{type(exc).__name__}: "
                        row["build_error"] = kind + (str(exc).splitlines() or [""])[0]
                        print(f"    {unit}: cannot build: {row['build_error']}", flush=True)
                        rows.append(row)
                        continue
                    row["reference_error"] = {n: reference[n] for n in row["error"]}
                    row["metric"] = candidate.metric if unit != group.name else {n: views[n].metric for n in group.names}
                    row.update(macs=candidate.macs, params=candidate.params, key=candidate.key,
                               from_cache=candidate.from_cache, build_s=round(time.perf_counter() - start, 1))
                    print(f"    {unit}: error " + ", ".join(f"{n} {e:.4g}" for n, e in row["error"].items())
                          + f", {candidate.macs / 1e6:.1f} MMACs ({'cached' if candidate.from_cache else 'built'} "
                            f"in {row['build_s']:.0f} s)", flush=True)
                    row["latency"] = measure_candidate(candidate, folder, args, unit)
                    setting_rows.append(row)
                    rows.append(row)
                frame(setting_rows, names)
    for row in rows:  # the samples served the frame intervals; the table keeps medians and intervals
        for c in row.get("latency", {}).values():
            c.pop("samples_ms", None)
    return rows


def frame(rows: list[dict[str, Any]], names: list[str]) -> None:
    """Set each row's ``frame_ms``: the separate NNs' best latencies added, or the merged model's best."""
    from qaopt import kernels

    apart = {r["unit"]: r for r in rows if not r["merged"]}
    choice = {n: best(apart[n]["latency"]) if n in apart else None for n in names}
    for r in rows:
        if r["merged"]:
            b = best(r["latency"])
            if b is not None:
                r.update(frame_ms=b[1]["median_ms"], frame_ci_ms=b[1]["ci_ms"], frame_backends={r["unit"]: b[0]},
                         frame_trusted=b[1]["trusted"])
        elif all(choice.values()):
            r.update(frame_ms=sum(c[1]["median_ms"] for c in choice.values()),
                     frame_ci_ms=list(kernels.sum_interval([c[1]["samples_ms"] for c in choice.values()])),
                     frame_backends={n: c[0] for n, c in choice.items()},
                     frame_trusted=all(c[1]["trusted"] for c in choice.values()))


# --- output ------------------------------------------------------------------------------------------

def show(c: dict[str, Any]) -> str:
    if "error" in c:
        return "n/a"
    ci = c.get("ci_ms") or [c["median_ms"], c["median_ms"]]
    return f"{c['median_ms']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" + ("" if c["trusted"] else "*")


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| app | unit | scale | prune | dtype | error (reference) | MMACs | "
            + " | ".join(BACKENDS) + " | frame ms (backends) |")
    lines = [head, "|---" * (8 + len(BACKENDS)) + "|"]
    for r in rows:
        base = f"| {r['app']} | {r['unit']} | {r['input_scale']:g} | {r['prune_ratio']:g} | {r['dtype']} |"
        if "build_error" in r:
            lines.append(base + f" cannot build: {r['build_error']} |" + " |" * (2 + len(BACKENDS)))
            continue
        err = "; ".join((f"{n} " if r["merged"] else "") + f"{e:.3g} ({r['reference_error'][n]:.3g})"
                        for n, e in r["error"].items())
        fr = "n/a"
        if "frame_ms" in r:
            used = sorted(set(r["frame_backends"].values()))
            fr = f"{r['frame_ms']:.2f}{'' if r['frame_trusted'] else '*'} ({', '.join(used)})"
        lines.append(base + f" {err} | {r['macs'] / 1e6:.1f} | "
                     + " | ".join(show(r["latency"][b]) for b in BACKENDS) + f" | {fr} |")
    return "\n".join(lines)


def versions() -> dict[str, str]:
    from importlib import metadata

    from qaopt import kernels

    out = {b: kernels.backend_version(b) for b in BACKENDS}
    out["python"] = sys.version.split()[0]
    for package in ("numpy", "torch-pruning"):
        try:
            out[package] = f"{package}=={metadata.version(package)}"
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out["qaopt"] = commit.stdout.strip() or "unknown"
    return out


def write(out: Path, key: str, value: dict[str, Any]) -> None:
    """Replace ``key`` in ``out``, keeping every other key the file has (each key is written by its own step)."""
    data = json.loads(out.read_text()) if out.exists() else {}
    data[key] = value
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CropFollow only, scale 0.5, fp32; writes a temp file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/knobs-bench-cache"), help="candidates and kernels")
    parser.add_argument("--skip-lanekeep-pruning", action="store_true",
                        help="leave LaneKeep's prune-0.5 rows out (recorded in the JSON's skipped)")
    parser.add_argument("--note", action="append", default=[], help="a line for the JSON's notes (repeatable)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "BACKEND", "SHAPE", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, backend, shape, cache = args.child
        print(json.dumps(cell(model, backend, tuple(int(s) for s in shape.split(",")), args.threads, Path(cache))))
        return

    from qaopt import kernels

    out = args.out or (Path(tempfile.gettempdir()) / "knobs.quick.json" if args.quick else OUT)
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    prov = provenance()
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    print(f"load average before: {' / '.join(f'{x:.2f}' for x in load_before)}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="qaopt-knobs-") as tmp:
        for app in (["cropfollow"] if args.quick else list(APPS)):
            rows += run_app(app, args, Path(tmp), t0)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    cpu = kernels.host_cpu_info()
    skipped = []
    if args.skip_lanekeep_pruning and not args.quick:
        skipped.append("lanekeep prune_ratio 0.5 (every scale, dtype and unit): left out to shorten the run "
                       "(on request)")
    load = lambda xs: " / ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    notes = [
        f"load average (1 / 5 / 15 min) {load(load_before)} before, {load(load_after)} after (the run's own builds "
        "and cells load up to its threads; more means something else ran beside it); a cell marked * is untrusted "
        "by its own spread: compare within a column and within the run",
        "TVM left out: untuned it takes about 480 ms a frame on this CPU, far from every other backend",
        "torch runs fp32 only: int8 candidates are QDQ ONNX graphs with kernels on onnxruntime, openvino and tvm",
        f"fine-tuning: {FINETUNE_STEPS} distillation steps for every candidate pruning or a scale below 1 damaged, "
        "0 otherwise; merged candidates are first distilled search.merge's finetune_steps from the references",
        "each latency cell ran in a fresh process (qaopt.kernels.compile(...).measure(), untuned, default protocol), "
        "on the candidate's full-size input: the resize runs inside the graph",
        "frame_ms: a separate row's is the sum over the app's NNs of the same setting, each NN on its own best "
        "backend (frame_backends); a merged row's is the merged model's best latency (one model serves every "
        "member per frame)",
        "merged rows: error per member from its own view of the one merged candidate, on its own validation data; "
        "MACs and latency are the merged model's",
        "lanekeep scales come from its spec (approximations.all.resolution.scales): the flattened head takes "
        "nothing below 0.85",
        *args.note,
    ]
    table = {
        **prov,
        "threads": args.threads,
        "wall_s": round(wall, 1),
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "versions": versions(),
        "notes": notes,
        "skipped": skipped,
        "rows": rows,
    }
    print(f"\n{cpu.model}, {args.threads} threads; ms per inference, median [95 % interval], * untrusted; "
          f"error: the NN's metric on its validation data (reference NN's in brackets); wall {wall / 60:.1f} min\n")
    print(markdown(rows))
    write(out, "table", table)
    print(f"\nwrote {out} (key 'table')")


if __name__ == "__main__":
    main()
