"""The real result (issue "The real result"): `qaopt optimize` on the ResNet-18 spec, resumable across machines.

    python benchmarks/real_result.py --spec examples/cropfollow-resnet18.yaml --out DIR
        [--estimator ekf|none] [--set target.backends=[openvino,onnxruntime] ...] [--profile default]
        [--cache CACHE] [--state STATE.tar.gz]
        [--snapshot-every 30] [--json docs/benchmarks/real_result.json]
    python benchmarks/real_result.py --rungs STATE.tar.gz
    python benchmarks/real_result.py --figures RESULT.json [--estimator ekf] [--set ...] --json OUT.json

Runs ``qaopt optimize`` (the CLI, in a child process) on the spec with its estimator set to
``--estimator`` and each ``--set DOTTED.KEY=YAML`` applied (e.g. ``target.backend=auto``), its run folder in
``DIR/run`` and its cache in ``--cache`` (default ``DIR/cache``).
Two runs that differ only in the estimator can share one cache, started side by side: the
reference NNs, the ladders and every candidate's measurement are the same for both, so they are
built and measured once. A GPU machine is
lent for at most 30 minutes at a time and comes back bare, so the run is made resumable across
machines: every ``--snapshot-every`` seconds, and when the run ends, the state a resumed run needs
and cannot cheaply recompute is packed into ``--state`` (the Optuna study, the calibrated region,
closed-loop evidence and validations, calibration runs, measurements: a few MB); a later call
with the same ``--state`` unpacks it first and ``optimize`` resumes where it stopped. What is
cheap or large is rebuilt instead: the reference NNs (~20 s each on a GPU), their data, the
ladders' rungs (~100 s per NN) and candidates.

When the run has finished, the figures the issue names go to ``--json`` (default
``DIR/real_result.json``): the application-aware configuration's speedup over the reference and
over the application-agnostic one, both configurations' closed-loop validations, the aware one's
verdict on fresh seeds (``acceptance``, ``acceptance_seeds``), whether its validated NNs are inside
the region by their own errors (``validated_in_region``) and the agnostic baseline's best-so-far
curve (``agnostic_converged``) with any faster trial only the agnostic rule's resolution rejected
(``agnostic_unresolved``); the three frames in ms as timed side by side (``frames_ms``) and the
ratio on each backend that measured every NN of both sides (``per_backend``). ``--figures RESULT.json``
writes the same from a finished run's ``result.json`` (one collected from the device), given the spec
fields the run had, and stops.

``--rungs STATE.tar.gz`` reads a run's saved study instead and prints, per NN, every ladder rung
and dtype the two searches measured (error, MACs, the NN's latency on the target at the
threads its schedule gave it) and the fastest frames each search found: where the speedup stops
as the rungs get deeper, which is what limits the result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import yaml

STATE = {
    "run": ("study.db", "region.json", "region.png", "closed_loop.json", "ladders.json"),
    "cache": ("calibrate", "optimize", "kernels", "on_policy"),
}
"""What a resumed run needs from the run folder (files) and the cache (folders)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=Path("examples/cropfollow-resnet18.yaml"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--estimator", choices=["ekf", "none"], default=None, help="default: the spec's")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="set a spec field (dotted key, YAML value), e.g. target.backends=[openvino,onnxruntime]")
    ap.add_argument("--profile", default="default")
    ap.add_argument("--cache", type=Path, default=None, help="cache folder (default: OUT/cache); runs may share one")
    ap.add_argument("--state", type=Path, default=None, help="tar.gz to resume from and keep the state in")
    # Every 30 s: a state is a few hundred kB, and what a lent machine ran after the last one is lost with it (a
    # state two minutes old can miss several trials of the aware study).
    ap.add_argument("--snapshot-every", type=float, default=30.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rungs", type=Path, default=None, metavar="STATE", help="print the rungs a saved run measured, and stop")
    ap.add_argument("--figures", type=Path, default=None, metavar="RESULT",
                    help="write --json from a finished run's result.json, and stop")
    args = ap.parse_args()
    if args.rungs is not None:
        print(rung_tables(args.rungs))
        return
    if args.figures is not None:
        if args.json is None:
            ap.error("--figures needs --json (where the figures go)")
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            write_figures(args.figures, _spec_for(args.spec.resolve(), args.estimator, Path(tmp), args.overrides),
                          args.json)
        return
    if args.out is None:
        ap.error("--out is required (unless --rungs)")
    out = args.out.resolve()
    run, cache = out / "run", (args.cache or out / "cache").resolve()
    run.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    if args.state is not None and args.state.exists():
        _restore(args.state, run, cache)
        print(f"resumed from {args.state}")
    spec = _spec_for(args.spec.resolve(), args.estimator, out, args.overrides)
    env = {**os.environ, "QAOPT_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    # The CLI's entry function: a wheel installed with --target (as on the GPU machine) has no console script.
    command = [sys.executable, "-c", "import sys; from qaopt.cli import main; sys.argv[0] = 'qaopt'; main()", "optimize", str(spec), "--profile", args.profile, "--out", str(run),
               "--quiet"]
    print(" ".join(command), flush=True)
    child = subprocess.Popen(command, env=env)
    stop = threading.Event()
    if args.state is not None:
        threading.Thread(target=_snapshots, args=(run, cache, args.state, args.snapshot_every, stop), daemon=True).start()
    code = child.wait()
    stop.set()
    if args.state is not None:
        _snapshot(run, cache, args.state)
    if code != 0:
        raise SystemExit(f"qaopt optimize exited with {code}")
    write_figures(run / "result.json", spec, args.json or out / "real_result.json")


def write_figures(result: Path, spec: Path, target: Path) -> None:
    """The figures (:func:`real_result`) of a finished run's ``result.json`` and the spec it optimized, into
    ``target`` and printed, with where and when they were written (:func:`provenance.provenance`)."""
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records

    figures = {**provenance(), **real_result(json.loads(result.read_text()), yaml.safe_load(spec.read_text()))}
    target.write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures, indent=1))


def _spec_for(spec: Path, estimator: str | None, out: Path, overrides: tuple[str, ...] | list[str] = ()) -> Path:
    """The spec with the estimator and fields asked for, written into the run's folder (its entry points are
    module paths). An override is ``dotted.key=value``, the value read as YAML."""
    data = yaml.safe_load(spec.read_text())
    if estimator is not None:
        data["evaluator"]["simulator"]["params"]["estimator"] = estimator
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {override!r}: write it as dotted.key=value, e.g. target.backend=auto")
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    derived = out / f"{spec.stem}-{estimator or 'as-given'}.yaml"
    derived.write_text(yaml.safe_dump(data, sort_keys=False))
    return derived


def _snapshots(run: Path, cache: Path, state: Path, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        _snapshot(run, cache, state)


def _snapshot(run: Path, cache: Path, state: Path) -> None:
    """Pack the resumable state (written to a temporary name, then renamed: a kill never leaves half an archive)."""
    tmp = state.with_name(state.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for folder, names in (("run", STATE["run"]), ("cache", STATE["cache"])):
            root = run if folder == "run" else cache
            for name in names:
                if (root / name).exists():
                    tar.add(root / name, arcname=f"{folder}/{name}")
    os.replace(tmp, state)
    print(f"{time.strftime('%H:%M:%S')} state saved to {state} ({state.stat().st_size / 2**20:.1f} MiB)", flush=True)


def _restore(state: Path, run: Path, cache: Path) -> None:
    """Unpack a snapshot: its ``run/`` part into the run folder, its ``cache/`` part into the cache."""
    with tarfile.open(state) as tar:
        for member in tar.getmembers():
            folder, _, rest = member.name.partition("/")
            if folder in STATE and rest:
                member.name = rest
                tar.extract(member, run if folder == "run" else cache, filter="data")


def real_result(result: dict, spec: dict) -> dict:
    """The issue's figures from a finished run's ``result.json`` data.

    Beside the ratio and both sides' validations: the agnostic baseline's best-so-far curve (did it converge),
    whether the validated aware NNs are inside the region by their own errors (a configuration rebuilt into other
    bytes than searched by its rebuilt errors), and which seeds accepted it: ``fresh`` when the run validated it
    again on seeds no search-time check or validation used (``acceptance``), else ``selection``.
    """
    from qaopt.closed_loop import ACCEPTANCE_SEED_BASE

    aware, speedups = result.get("aware"), result["speedups"]
    chosen = next((v for v in result["validations"] if aware is not None and v["trial"] == aware.get("trial")), None)
    agnostic_validation = result.get("agnostic_validation")
    acceptance = result.get("acceptance")
    if acceptance is not None and (aware is None or acceptance["trial"] != aware.get("trial")):
        acceptance = None
    rebuilt = next((r for r in result.get("rebuilt", []) if aware is not None and r["trial"] == aware.get("trial")), None)
    params = spec["evaluator"]["simulator"].get("params", {})
    return {
        "aware_over_agnostic": speedups.get("aware_over_agnostic"),
        "aware_speedup": speedups.get("aware"),
        "agnostic_speedup": speedups.get("agnostic"),
        "intervals": speedups.get("intervals", {}),
        "validation_runs": chosen["runs"] if chosen else 0,
        "collision_free_runs": chosen["passes"] if chosen else 0,
        "agnostic_validation": {"runs": agnostic_validation["runs"] if agnostic_validation else 0,
                                "collision_free_runs": agnostic_validation["passes"] if agnostic_validation else 0},
        "acceptance": ({"runs": acceptance["runs"], "collision_free_runs": acceptance["passes"],
                        "verdict": acceptance["verdict"], "seed_base": acceptance.get("seed_base")}
                       if acceptance else None),
        "acceptance_seeds": ("fresh" if acceptance and acceptance.get("seed_base") == ACCEPTANCE_SEED_BASE
                             else "selection"),
        "validated_in_region": (rebuilt["feasible"] if rebuilt else bool(aware and aware.get("in_region"))),
        "rebuilt": bool(rebuilt),
        "agnostic_converged": result.get("agnostic_converged"),
        # Trials only the agnostic rule's resolution rejected: where present, the baseline is nearer the reference
        # than accuracy-preserving compression allows, and the ratio overstates the headroom's worth.
        "agnostic_unresolved": (result.get("agnostic_rule") or {}).get("unresolved", {}),
        "backbone": sorted({nn["args"].get("backbone") for nn in spec["nns"].values()}),
        "target": {k: spec.get("target", {}).get(k)
                   for k in ("device", "backend", "backends", "search_backend", "threads")},
        "estimator": params.get("estimator", "none"),
        "seconds": result.get("seconds"),
        "frames_ms": {side: ({"latency_ms": c["latency_ms"], "schedule": c["schedule"],
                              "schedules_ms": c.get("schedules_ms", {})} if c else None)
                      for side, c in (("reference", result.get("reference")), ("aware", aware),
                                      ("agnostic", result.get("agnostic")))},
        "per_backend": per_backend(aware, result.get("agnostic")),
    }


def per_backend(aware: dict | None, agnostic: dict | None) -> dict[str, dict[str, float]]:
    """Aware over agnostic on each backend that measured every NN of both configurations: each side's frame as the
    sum of its models' figures there (a merged NN once), from each NN's ``backends_measured`` (the figures the
    backend choice compared, untuned, taken when the configuration was measured on the target), so a sequential
    frame, not the side-by-side stage's. The issue asks for the ratio per backend: how much of the gain holds on a
    backend the deployment may be tied to."""
    if aware is None or agnostic is None:
        return {}

    def frame(config: dict, backend: str) -> float | None:
        models = {c["candidate"]: c.get("backends_measured", {}).get(backend) for c in config["nns"].values()}
        if not all(isinstance(ms, (int, float)) for ms in models.values()):
            return None  # a backend that could not run one of the NNs (its value says why)
        return float(sum(models.values()))

    backends = sorted({b for config in (aware, agnostic) for nn in config["nns"].values()
                       for b in nn.get("backends_measured", {})})
    out = {}
    for backend in backends:
        a, g = frame(aware, backend), frame(agnostic, backend)
        if a is not None and g is not None:
            out[backend] = {"aware_ms": a, "agnostic_ms": g, "aware_over_agnostic": g / a}
    return out


def rung_tables(state: Path) -> str:
    """Markdown tables of what a saved run's studies measured per NN and rung, and their fastest frames."""
    import tempfile

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        _restore(state, Path(tmp) / "run", Path(tmp) / "cache")
        url = f"sqlite:///{Path(tmp) / 'run' / 'study.db'}"
        studies = {s.study_name: optuna.load_study(study_name=s.study_name, storage=url)
                   for s in optuna.get_all_study_summaries(url)}
        trials = {name: [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE and "configuration" in t.user_attrs]
                  for name, st in studies.items()}
    rows: dict[str, dict[tuple, dict]] = {}
    frames = []
    for name, done in trials.items():
        for t in done:
            config = t.user_attrs["configuration"]
            threads = "1 (parallel)" if config["schedule"] == "parallel" else "2 (sequential)"
            for nn, c in config["nns"].items():
                rows.setdefault(nn, {}).setdefault(_rung(c), {
                    "error": c["error"], "macs": c["macs"], "params": c["params"]})[threads] = c["latency_ms"]
            kind = name.rsplit("-", 1)[-1].split(".")[0]  # aware, or agnostic (one study per unit: agnostic.<unit>)
            frames.append((config["latency_ms"], kind, t.number, config["schedule"],
                           {nn: _rung(c) for nn, c in config["nns"].items()}, t.user_attrs.get("feasible")))
    out = []
    for nn, by_rung in rows.items():
        out += [f"**{nn}**: every rung, dtype, input scale and merge the searches measured (latency in ms on the "
                "target, median; a merged NN's MACs, parameters and latency are the whole merged NN's, serving every "
                "NN of its group)", "",
                "| pruned | dtype | input scale | merged | MMACs | M params | error | ms, 2 threads (sequential) "
                "| ms, 1 thread (parallel) |", "|---|---|---|---|---|---|---|---|---|"]
        for (ratio, dtype, scale, merged), r in sorted(by_rung.items()):
            ms = [f"{r[k]:.2f}" if k in r else "-" for k in ("2 (sequential)", "1 (parallel)")]
            out.append(f"| {ratio:.2f} | {dtype} | {scale:g} | {merged or '-'} | {r['macs'] / 1e6:.0f} | "
                       f"{r['params'] / 1e6:.3f} | {r['error']:.4g} | {ms[0]} | {ms[1]} |")
        out.append("")
    out += ["Fastest frames each search measured (feasible: inside the region for `aware`, within the reference's "
            "error for `agnostic`):", "", "| search | trial | frame ms | schedule | rungs (pruned, dtype) | feasible |",
            "|---|---|---|---|---|---|"]
    for kind in ("aware", "agnostic"):
        for ms, k, number, schedule, knobs, feasible in sorted(f for f in frames if f[1] == kind)[:6]:
            rungs = ", ".join(f"{nn} {ratio:.2f} {dtype}" + (f" at {scale:g}" if scale != 1 else "")
                              + (f" merged ({merged})" if merged else "")
                              for nn, (ratio, dtype, scale, merged) in knobs.items())
            out.append(f"| {k} | {number} | {ms:.2f} | {schedule} | {rungs} | {feasible} |")
    return "\n".join(out)


def _rung(choice: dict) -> tuple[float, str, float, str]:
    """An NN choice's pruning ratio, dtype, input scale and the NNs its merged NN serves ('' when apart)."""
    knobs = choice["knobs"]
    return knobs["prune_ratio"], knobs["dtype"], knobs.get("input_scale", 1.0), "+".join(choice.get("serves") or [])


if __name__ == "__main__":
    main()
