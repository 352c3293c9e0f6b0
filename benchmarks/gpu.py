"""The GPU target, checked from outside qaopt: its chosen NNs timed independently, and the figures of docs/benchmarks/gpu.json.

Four steps, the first three run on the GPU machine:

``install --pip-log LOG --pip-status N --junit XML``
    What installing qaopt with plain pip beside the machine's CUDA torch gave (the pip command
    is the log's first line) and what the test suite's JUnit report says passed there.

``quick RUN_DIR --seconds S``
    Whether ``qaopt optimize --profile quick`` of a GPU spec finished: ``result.json``, the
    report and every NN's artifacts present, and no failed trial in its Optuna studies.

``default RUN_DIR --seconds S``
    A default-profile run of a GPU spec (compact or ResNet-18): whether it finished as the quick
    step checks, its aware-over-agnostic ratio with the interval of the side-by-side stage, each
    side's configuration (NNs, knobs, backend, ms) and closed-loop verdicts (selection and fresh
    acceptance seeds), and whether the aware NNs are inside the region by their measured errors.

``latency RUN_DIR``
    Each NN the run chose (``RUN_DIR/artifacts/<nn>/module.pt``, the bytes qaopt validated and
    measured; a merged NN once) is timed here in every way one would run it at batch 1, each
    in its own process (a compile can hang): eager, ``torch.compile`` default,
    ``torch.compile(mode="reduce-overhead")``, a CUDA graph captured by hand from eager,
    with ``--max-autotune`` Inductor's autotuning, and with ``--tvm-trials N`` TVM built by its
    own API, untuned and tuned by MetaSchedule with N trials (both replaying one CUDA graph). A frame is one call followed by a
    synchronize; a sample is 20 frames timed by CUDA events; the figure is the median of 30
    samples after at least 50 warm-up frames and 2 s of them (a GPU's clocks ramp up over
    hundreds of milliseconds of work: 50 frames of a sub-millisecond NN end before). The record
    compares the best of them with the latency qaopt reported for the NN (``result.json``): the
    issue's goal is qaopt within 1.2x of the best.
    It also times the artifact by qaopt's own path (``qaopt_on_artifact``: the backend the run
    chose, qaopt's protocol), which places a gap on the module or on the measurement.

``reference SPEC [--tvm-trials N]``
    The same comparison for the spec's reference NNs, each measured by qaopt's own path
    (``kernels.AutoBackend`` on the spec's target, the default protocol: what a search trial
    measures) and by the modes above, in one call on one machine: a check of the backends and
    the measurement that needs no optimize run. With ``--tvm-trials``, qaopt's path adds its
    ``tvm`` backend tuned with N trials per NN, and the modes add TVM built by TVM's own API,
    untuned (its generic GPU schedules) and tuned by MetaSchedule with N trials.

``assemble``
    Writes ``docs/benchmarks/gpu.json`` from the install check, the quick run and the latency
    step's JSON (each written by a command on the device machine; see docs/BENCHMARKS.md, "GPU target").

    python benchmarks/gpu.py install --pip-log pip.log --pip-status 0 --junit junit.xml --out $OUT/install.json
    python benchmarks/gpu.py quick examples/runs/cropfollow-gpu --seconds 512 --out $OUT/quick.json
    python benchmarks/gpu.py default examples/runs/cropfollow-resnet18-gpu --seconds 1500 --out $OUT/resnet18.json
    python benchmarks/gpu.py latency examples/runs/cropfollow-gpu --out $OUT/latency.json [--max-autotune] [--tvm-trials N]
    python benchmarks/gpu.py reference examples/cropfollow-gpu.yaml --out $OUT/reference.json [--tvm-trials N [--tvm-seconds S]]
    python benchmarks/gpu.py assemble --install install.json --quick quick.json --latency latency.json \
        --compact compact.json --resnet18 resnet18.json --resnet18-latency latency-resnet18.json \
        [--resnet18-best-backends resnet18.json --resnet18-best-backends-latency latency-resnet18.json]

A step left out of ``assemble`` keeps its section of the existing ``gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from provenance import provenance

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JSON = REPO / "docs" / "benchmarks" / "gpu.json"
MODES = ("eager", "compile-default", "compile-reduce-overhead", "cuda-graph")
AUTOTUNE = "compile-max-autotune"
TVM_MODES = ("tvm", "tvm-tuned")
"""TVM built by its own API (not qaopt's path): TVM's generic GPU schedules, and tuned by MetaSchedule's
``tune_relax`` with ``--tvm-trials`` trials; both replay the model as a CUDA graph (``--tvm-trials 0``: left out)."""
WARMUP, SAMPLES, FRAMES = 50, 30, 20
WARMUP_S = 2.0
MODE_TIMEOUT_S = 900
GOAL = 1.2

ONE = r"""
import json, sys, statistics, time
import torch

path, shape, mode = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
module = torch.load(path, weights_only=False, map_location="cuda").eval()
dtype = next(module.parameters()).dtype
x = torch.rand(*shape, device="cuda", dtype=dtype)
tuning_s = None

if mode.startswith("tvm"):
    # TVM by its own API. Its torch importer gives convolutions float32 outputs, so an fp16 NN is imported in fp32
    # and cast back by TVM's mixed-precision pass (fp16 arithmetic, fp32 accumulation).
    import tempfile
    import tvm
    from tvm import relax
    from tvm.relax import transform as T
    from tvm.relax.frontend.torch import from_exported_program
    from tvm.s_tir import meta_schedule as ms

    half = dtype == torch.float16
    dtype = dtype if half else torch.float32  # what TVM runs: fp16 mixed, else fp32 (a bf16 NN too: no bf16 here)
    host = torch.rand(*shape)
    program = torch.export.export(module.float().cpu(), (host,))
    mod = from_exported_program(program, keep_params_as_input=False)
    target = tvm.target.Target(tvm.target.Target.from_device(tvm.cuda(0)), host={"kind": "llvm"})
    with target:
        mod = tvm.transform.Sequential([T.DecomposeOpsForInference(), T.CanonicalizeBindings(),
                                        *([T.ConvertToDataflow(), T.ToMixedPrecision(out_dtype="float32")] if half else []),
                                        relax.get_pipeline("zero")])(mod)
    trials = int(sys.argv[4])
    if mode == "tvm-tuned":
        begin = time.perf_counter()
        with tempfile.TemporaryDirectory() as work:
            database = ms.relax_integration.tune_relax(mod, {}, target, work, max_trials_global=trials, seed=0)
            with target, database:
                mod = T.MetaScheduleApplyDatabase()(mod)
        tuning_s = round(time.perf_counter() - begin, 1)
    with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
        executable = tvm.compile(mod, target)
    device = tvm.cuda(0)
    vm = relax.VirtualMachine(executable, device)
    main, argument = vm["main"], tvm.runtime.tensor(host.numpy(), device)
    run = lambda: main(argument)
    torch.cuda.synchronize()

with torch.inference_mode():
    if mode.startswith("tvm"):
        pass
    elif mode == "eager":
        run = lambda: module(x)
    elif mode.startswith("compile-"):
        from torch._inductor import config
        if hasattr(config, "autotune_num_choices_displayed"):
            config.autotune_num_choices_displayed = 0
        compiled = torch.compile(module, mode=mode[len("compile-"):])
        run = lambda: compiled(x)
    else:  # a CUDA graph captured by hand from eager, replayed per frame
        static = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                module(static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = module(static)
        run = graph.replay
    warm_from, warm_frames = time.perf_counter(), 0
    while warm_frames < WARMUP or time.perf_counter() - warm_from < WARMUP_S:
        run()
        torch.cuda.synchronize()
        warm_frames += 1
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(SAMPLES):
        begin.record()
        for _ in range(FRAMES):
            run()
            torch.cuda.synchronize()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / FRAMES)
print(json.dumps({"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples),
                  "dtype": str(dtype).replace("torch.", ""), **({"tuning_s": tuning_s} if tuning_s else {})}))
""".replace("WARMUP_S", str(WARMUP_S)).replace("WARMUP", str(WARMUP)).replace("SAMPLES", str(SAMPLES)).replace("FRAMES", str(FRAMES))


def _time_mode(module_path: Path, shape: list[int], mode: str, tvm_trials: int = 0) -> dict:
    """One mode in a fresh process: its figure, or what went wrong (a timeout, a crash's last line)."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", ONE, str(module_path), json.dumps(shape), mode, str(tvm_trials)],
                              capture_output=True, text=True, timeout=MODE_TIMEOUT_S, cwd=module_path.parent)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {MODE_TIMEOUT_S} s"}
    seconds = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]
        return {"error": tail, "seconds": seconds}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_s": seconds}


def install(pip_log: Path, pip_status: int, junit: Path, out: Path) -> dict:
    """The install check: plain pip (no --no-deps, no --ignore-requires-python) and the tests that passed there."""
    import xml.etree.ElementTree as ET

    command = pip_log.read_text().splitlines()[0]
    cases = ET.parse(junit).getroot().iter("testcase")
    outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome["failed"].append(name)
        elif case.find("skipped") is not None:
            outcome["skipped"].append(name)
        else:
            outcome["passed"].append(name)
    import torch

    record = {**provenance(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "torch": torch.__version__, "install_command": command, "plain_pip": pip_status == 0 and "--no-deps" not in command
              and "--ignore-requires-python" not in command,
              "tests_passed": len(outcome["passed"]), "tests_failed": len(outcome["failed"]),
              "tests_skipped": len(outcome["skipped"]), "failed": outcome["failed"]}
    _write(out, record)
    return record


def quick(run_dir: Path, seconds: float, out: Path) -> dict:
    """Whether the quick run finished with its result, report and artifacts, and how many trials failed."""
    record = {**_machine(), **_completion(run_dir, seconds)}
    _write(out, record)
    return record


def _machine() -> dict:
    """When and where a run's record was written (:func:`provenance.provenance`), and the GPU."""
    import torch

    return {**provenance(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _completion(run_dir: Path, seconds: float) -> dict:
    """A run's completion: result, report and artifacts present, trials and failed trials, speedups, acceptance."""
    import optuna

    result_file = run_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    storage = f"sqlite:///{run_dir / 'study.db'}"
    failed, trials = 0, 0
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials += len(study.trials)
        failed += sum(t.state == optuna.trial.TrialState.FAIL for t in study.trials)
    chosen = list(result["aware"]["nns"]) if result and result.get("aware") else []
    artifacts = all((run_dir / "artifacts" / nn / "module.pt").exists() for nn in chosen) and bool(chosen)
    record = {"completed": bool(result) and (run_dir / "report.md").exists() and artifacts,
              "failed_trials": failed, "trials": trials, "minutes": round(seconds / 60, 1),
              "speedups": {k: v for k, v in result["speedups"].items() if k != "intervals"} if result else None,
              "aware_accepted": _accepted(result)}
    return record


def _accepted(result: dict | None) -> bool:
    """Whether the run accepted its aware configuration: its verdict on the fresh acceptance seeds (as
    ``Result.aware_accepted``), not its selection verdict, which only chose it."""
    aware, acceptance = (result or {}).get("aware"), (result or {}).get("acceptance")
    return bool(aware and acceptance and acceptance["accepted"] and acceptance["trial"] == aware["trial"])


def _side(config: dict | None) -> dict | None:
    """One side of the comparison as the record keeps it: each NN's knobs, backend and ms, the frame's ms."""
    if not config:
        return None
    return {"trial": config.get("trial"), "frame_ms": config["latency_ms"], "in_region": config.get("in_region"),
            "errors": config.get("errors"), "schedule": config.get("schedule"),
            "nns": {nn: {"knobs": c["knobs"], "backend": c["backend"], "ms": c["latency_ms"],
                         "backends_measured": c.get("backends_measured", {}), "serves": c.get("serves", [])}
                    for nn, c in config["nns"].items()}}


def default(run_dir: Path, seconds: float, out: Path) -> dict:
    """A default-profile GPU run: completion (as :func:`quick`), the ratio with its interval, both sides' verdicts."""
    record = {**_machine(), **_completion(run_dir, seconds)}
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").exists() else None
    if result:
        intervals = result["speedups"].get("intervals", {})
        fresh = {v.get("label") or f"trial {v['trial']}": v for v in [result.get("acceptance"),
                                                                      result.get("agnostic_validation")] if v}
        record.update({
            "aware_over_agnostic": result["speedups"]["aware_over_agnostic"],
            "interval": intervals.get("aware_over_agnostic", {}).get("ci"),
            "interval_note": intervals.get("aware_over_agnostic", {}).get("note"),
            "aware": _side(result.get("aware")), "agnostic": _side(result.get("agnostic")),
            "reference_frame_ms": result["reference"]["latency_ms"],
            "search_backend": result.get("search_backend"),
            "selection": [{k: v[k] for k in ("trial", "runs", "failures", "verdict")} for v in result["validations"]],
            "acceptance_fresh_seeds": {name: {k: v[k] for k in ("runs", "failures", "verdict", "seed_base")}
                                       for name, v in fresh.items()},
            "agnostic_converged": result.get("agnostic_converged"),
            # Configurations whose NNs this run rebuilt into other bytes than its search measured (a resume
            # without the approximation cache): their verdicts and figures are of the rebuilt bytes.
            "rebuilt": [{"trial": r["trial"], "feasible": r["feasible"],
                         "hashes": r["hashes"]} for r in result.get("rebuilt", [])],
        })
    _write(out, record)
    return record


def _write(out: Path, record: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")


def _qaopt_on_artifact(module_path: Path, shape: list[int], backend: str) -> dict:
    """The artifact timed by qaopt's own path (its backend, protocol and zero input, in a fresh process), so that a
    gap between ``qaopt_ms`` and the modes can be placed: on the module qaopt held in memory (this figure agrees
    with the modes) or on qaopt's measurement (this figure agrees with ``qaopt_ms``)."""
    code = (
        "import json, sys, numpy as np, torch\n"
        "from qaopt import kernels\n"
        "module = torch.load(sys.argv[1], weights_only=False, map_location='cuda').eval()\n"
        "compiled = kernels.compile(module, [np.zeros(json.loads(sys.argv[2]), np.float32)],\n"
        "                           kernels.Target(device='cuda', backend=sys.argv[3]))\n"
        "m = compiled.measure()\n"
        "print(json.dumps({'median_ms': m.median_ms, 'trusted': m.trusted}))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(module_path.resolve()), json.dumps(shape), backend],
                              capture_output=True, text=True, timeout=MODE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {MODE_TIMEOUT_S} s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def latency(run_dir: Path, out: Path, max_autotune: bool, tvm_trials: int = 0) -> dict:
    """Every chosen NN of ``run_dir`` timed in every mode, against the latency qaopt reported for it."""
    import torch  # noqa: F401 - imported before provenance(), which names the GPU torch sees

    prov = provenance()
    result = json.loads((run_dir / "result.json").read_text())
    aware = result["aware"]
    modes = (*MODES, *((AUTOTUNE,) if max_autotune else ()), *(TVM_MODES if tvm_trials else ()))
    rows, seen = {}, {}
    for name, choice in aware["nns"].items():
        if choice["candidate"] in seen:  # a merged NN runs once per frame for all it serves
            rows[name] = {**rows[seen[choice["candidate"]]], "same_as": seen[choice["candidate"]]}
            continue
        seen[choice["candidate"]] = name
        nn_dir = run_dir / "artifacts" / name
        form = json.loads((nn_dir / "artifact.json").read_text())
        shape = form.get("input_shape") or form.get("data", {}).get("input_shape")
        figures = {mode: _time_mode((nn_dir / "module.pt").resolve(), shape, mode, tvm_trials) for mode in modes}
        timed = {m: f["median_ms"] for m, f in figures.items() if "median_ms" in f}
        best_mode = min(timed, key=timed.get) if timed else None
        rows[name] = {"knobs": choice["knobs"], "serves": choice.get("serves", []), "qaopt_backend": choice["backend"],
                      "qaopt_ms": choice["latency_ms"],
                      "qaopt_on_artifact": _qaopt_on_artifact(nn_dir / "module.pt", shape, choice["backend"]),
                      "modes": figures, "best_mode": best_mode,
                      "best_ms": timed.get(best_mode), "latency_vs_best": (round(choice["latency_ms"] / timed[best_mode], 3)
                                                                           if best_mode else None)}
        print(f"{name}: qaopt {choice['backend']} {choice['latency_ms']:.3f} ms; "
              + ", ".join(f"{m} {t:.3f}" for m, t in timed.items()), flush=True)
    import torch

    record = {**prov, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "protocol": {"warmup_frames": WARMUP, "warmup_s": WARMUP_S, "samples": SAMPLES, "frames_per_sample": FRAMES,
                           "frame": "one call, then torch.cuda.synchronize; CUDA events around each sample"},
              "goal": f"qaopt's reported latency within {GOAL}x of the best mode", "nns": rows}
    _write(out, record)
    return record


def reference(spec_path: Path, out: Path, tvm_trials: int = 0, tvm_seconds: float | None = None) -> dict:
    """The spec's reference NNs: qaopt's measurement on its target against the best independent mode.

    With ``tvm_trials``, qaopt's path also measures its ``tvm`` backend, survey-tuned with at most that many trials
    and ``tvm_seconds`` of tuning per NN (``target.tuning``), and the independent modes gain TVM built by its own
    API (:data:`TVM_MODES`, tuned with ``tvm_trials`` trials).
    """
    import dataclasses
    import tempfile

    import numpy as np
    import torch

    from qaopt import kernels
    from qaopt.app_spec.entrypoints import load_entry_point
    from qaopt.spec import load_spec

    prov = provenance()
    spec = load_spec(spec_path)
    target = kernels.Target.from_spec(spec.target)
    if tvm_trials:
        target = dataclasses.replace(target, tuning=kernels.TuningBudget(trials=tvm_trials, seconds=tvm_seconds),
                                     backends=(*kernels.auto.raced(target), kernels.BackendRef("tvm")))
    modes = (*MODES, *TVM_MODES) if tvm_trials else MODES
    rows = {}
    with tempfile.TemporaryDirectory(prefix="qaopt-gpu-ref-") as tmp:
        for name, nn in spec.nns.items():
            module = load_entry_point(nn.model)(**nn.args).eval()
            path = Path(tmp) / f"{name}.pt"
            torch.save(module, path)
            x = np.random.default_rng(0).random(tuple(nn.input_shape), dtype=np.float32)
            compiled = kernels.AutoBackend(cache_dir=Path(tmp)).compile(module, [x], target)
            measured = {o.backend: (round(o.measurement.median_ms, 4) if o.measurement else o.error)
                        for o in compiled.outcomes}
            tuning = {o.backend: o.tuning for o in compiled.outcomes if o.tuning}
            qaopt_ms = compiled.best_outcome.measurement.median_ms
            figures = {mode: _time_mode(path, list(nn.input_shape), mode, tvm_trials) for mode in modes}
            timed = {m: f["median_ms"] for m, f in figures.items() if "median_ms" in f}
            best_mode = min(timed, key=timed.get)
            rows[name] = {"qaopt_backend": compiled.backend, "qaopt_ms": qaopt_ms, "backends_measured": measured,
                          **({"qaopt_tuning": tuning} if tuning else {}), "modes": figures, "best_mode": best_mode, "best_ms": timed[best_mode],
                          "latency_vs_best": round(qaopt_ms / timed[best_mode], 3)}
            print(f"{name}: qaopt {compiled.backend} {qaopt_ms:.3f} ms; "
                  + ", ".join(f"{m} {t:.3f}" for m, t in timed.items()), flush=True)
    record = {**prov, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "nns": rows}
    _write(out, record)
    return record


DEFAULT_RUNS = {
    "compact": "the compact spec's default run",
    "resnet18": "the ResNet-18 spec's default run",
    "resnet18_best_backends": "the ResNet-18 spec's default run whose side-by-side compiles each side on its best "
                              "backend (target.backend: auto) rather than the search's",
}
"""The default-profile runs ``gpu.json`` keeps, each under its key (``--<key>`` and ``--<key>-latency``)."""


def assemble(out: Path, install: Path | None = None, quick: Path | None = None, latency_json: Path | None = None,
             reference_json: Path | None = None, runs: dict[str, Path] | None = None,
             run_latencies: dict[str, Path] | None = None) -> dict:
    """``gpu.json``: the keys the GPU issue asks for, each from the step that measured it, with its machine and date.

    A step not given keeps its section from the existing file (each section says when and where it was
    measured), so one step re-run on a later machine updates only what it measured. ``runs`` are default steps'
    records by key (:data:`DEFAULT_RUNS`), ``run_latencies`` the latency step on those runs' chosen NNs. A run's
    ``aware_accepted`` is read again from the fresh-seed verdicts its record holds, so that the summary cannot
    disagree with them (records written before :func:`_accepted` read the selection verdict).
    """
    runs, run_latencies = runs or {}, run_latencies or {}
    previous = json.loads(out.read_text()) if out.exists() else {}

    def section(path: Path | None, key: str) -> dict:
        if path is not None:
            return json.loads(path.read_text())
        if key not in previous:
            raise SystemExit(f"{out} has no '{key}' section to keep; give --{key} (the {key} step's JSON)")
        return previous[key]

    inst, q, lat = section(install, "install"), section(quick, "quick"), section(latency_json, "latency")
    reference = json.loads(reference_json.read_text()) if reference_json else previous.get("reference")
    record = {
        "device": lat["gpu"],
        "install": inst,
        "quick": q,
        "latency_vs_best": {nn: row["latency_vs_best"] for nn, row in lat["nns"].items()},
        "latency": lat,
        **({"reference": reference} if reference else {}),
    }
    for key in DEFAULT_RUNS:  # the default-profile runs, kept when not given
        if key in runs or key in previous:
            run = json.loads(runs[key].read_text()) if key in runs else previous[key]
            record[key] = {**run, "aware_accepted": _accepted_on_fresh_seeds(run)}
    for key, path in run_latencies.items():  # a run's chosen NNs timed by the latency step
        if key not in record:
            flag = key.replace("_", "-")
            raise SystemExit(f"--{flag}-latency needs that run's record: give --{flag}")
        lat = json.loads(path.read_text())
        record[key] = {**record[key], "latency": lat,
                       "latency_vs_best": {nn: row["latency_vs_best"] for nn, row in lat["nns"].items()}}
    _write(out, record)
    return record


def _accepted_on_fresh_seeds(run: dict) -> bool:
    """A default step's record: whether its aware trial's verdict on the fresh seeds was valid."""
    aware = run.get("aware")
    verdict = (run.get("acceptance_fresh_seeds") or {}).get(f"trial {aware['trial']}") if aware else None
    return bool(verdict and verdict["verdict"] == "valid")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True)
    i = sub.add_parser("install", help="the install check's record")
    i.set_defaults(step=lambda args: install(args.pip_log, args.pip_status, args.junit, args.out))
    i.add_argument("--pip-log", type=Path, required=True)
    i.add_argument("--pip-status", type=int, required=True)
    i.add_argument("--junit", type=Path, required=True)
    i.add_argument("--out", type=Path, required=True)
    q = sub.add_parser("quick", help="the quick run's record")
    q.set_defaults(step=lambda args: quick(args.run_dir, args.seconds, args.out))
    q.add_argument("run_dir", type=Path)
    q.add_argument("--seconds", type=float, required=True)
    q.add_argument("--out", type=Path, required=True)
    d = sub.add_parser("default", help="a default-profile run's record: completion, ratio, verdicts")
    d.set_defaults(step=lambda args: default(args.run_dir, args.seconds, args.out))
    d.add_argument("run_dir", type=Path)
    d.add_argument("--seconds", type=float, required=True)
    d.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("latency", help="time the run's chosen NNs in every mode")
    p.set_defaults(step=lambda args: latency(args.run_dir, args.out, args.max_autotune, args.tvm_trials))
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-autotune", action="store_true", help="also Inductor's max-autotune (minutes per NN)")
    p.add_argument("--tvm-trials", type=int, default=0, help="also TVM by its own API, tuned with this many trials")
    r = sub.add_parser("reference", help="the spec's reference NNs: qaopt's measurement against the modes")
    r.set_defaults(step=lambda args: reference(args.spec, args.out, args.tvm_trials, args.tvm_seconds))
    r.add_argument("spec", type=Path)
    r.add_argument("--tvm-trials", type=int, default=0,
                   help="also TVM: qaopt's backend tuned with this many trials per NN, and TVM by its own API")
    r.add_argument("--tvm-seconds", type=float, default=None,
                   help="cap on qaopt's TVM tuning per NN, in seconds (a survey round in progress finishes)")
    r.add_argument("--out", type=Path, required=True)
    a = sub.add_parser("assemble", help="write docs/benchmarks/gpu.json")
    a.set_defaults(step=lambda args: assemble(
        args.json, args.install, args.quick, args.latency, args.reference,
        {key: getattr(args, key) for key in DEFAULT_RUNS if getattr(args, key)},
        {key: getattr(args, f"{key}_latency") for key in DEFAULT_RUNS if getattr(args, f"{key}_latency")}))
    a.add_argument("--install", type=Path, help="the install step's JSON (default: keep the file's section)")
    a.add_argument("--quick", type=Path, help="the quick step's JSON (default: keep the file's section)")
    a.add_argument("--latency", type=Path, help="the latency step's JSON (default: keep the file's section)")
    a.add_argument("--reference", type=Path, help="the reference step's JSON, kept under 'reference'")
    for key, what in DEFAULT_RUNS.items():
        flag = key.replace("_", "-")
        a.add_argument(f"--{flag}", type=Path, help=f"{what} (the default step's JSON)")
        a.add_argument(f"--{flag}-latency", type=Path, help=f"the latency step's JSON on {what}")
    a.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    args.step(args)

if __name__ == "__main__":
    main()
