"""Tuning-cost control: a shared database, survey tuning with an early stop, skipping cold candidates.

Why each piece (one MetaSchedule trial costs about a second on 2 cores, docs/BENCHMARKS.md):

* **One database per target** (:class:`TuningDatabase`), shared by every candidate
  and run: pruned NNs with channels rounded to 8 share layer shapes, so a task
  tuned once is looked up, not tuned again. The hit rate is reported.
* **Survey tuning** (Trimmer): all cold tasks are tuned together in short rounds
  of equal cost; after each round the *whole model* is built and measured, and
  tuning stops when each of the last two rounds improved it by less than
  ``min_gain`` (Trimmer also judges the rate over more than one round; the first
  round, which replaces default schedules, is never the reference), or when the
  budget is spent.
* **Skip cold candidates**: when even an optimistic bound of the tuned latency
  (FLOPs at a fraction of the machine's peak) cannot beat the incumbent, the
  candidate is measured untuned and tuning is skipped.
* **Never slower**: the tuned build is kept only if it beats the untuned one.
* **Build apart from profile** (RESONATOR): candidates are built in a persistent
  worker pool with no lock; only their timing takes the device lock.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.store import cache_root, set_aside

from .errors import BuildError
from .measure import device_lock
from .registry import backend_version
from .target import host_cpu_info
from .tvm_build import Prepared, host_cpu, is_cuda
from .tvm_int8 import load_tensor_intrinsics

# --------------------------------------------------------------------------- builder and runner


def _build_in_worker(mod: Any, target: Any) -> str:
    """Build one tuning candidate and export it for the runner (runs in a builder worker process).

    Unlike MetaSchedule's default build, it does not import ``tvm.s_tir.tensor_intrin``:
    parsing those TVMScript intrinsics costs 10-50 s per fresh process here, and the
    candidates arrive already tensorized, so the builder never needs them.
    """
    from tvm.driver import build as tvm_build
    from tvm.s_tir.meta_schedule.builder.local_builder import default_export
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return default_export(tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target))


def _pooled_builder(max_workers: int, timeout_s: float) -> Any:
    """A MetaSchedule builder whose worker processes live across batches.

    TVM's LocalBuilder starts a fresh process pool for every batch of candidates,
    and each fresh worker re-imports TVM (3 s) and its tensor intrinsics (10-50 s
    here): that, not compiling, is most of a trial's cost with fresh workers
    (docs/BENCHMARKS.md, "vendor backends against TVM, and tuning cost"). This builder keeps its pool, skips the intrinsics, and
    recycles the pool every ``recycle`` batches (upstream restarts it because
    long-lived workers leak slowly).
    """
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    @derived_object
    class PooledBuilder(PyBuilder):
        recycle = 50

        def __init__(self) -> None:
            super().__init__()
            self._pool: Any = None
            self._batches = 0

        def build(self, build_inputs: list[Any]) -> list[Any]:
            if self._pool is None or self._batches >= self.recycle:
                self.close()
                self._pool = PopenPoolExecutor(max_workers=max_workers, timeout=timeout_s)
                self._batches = 0
            self._batches += 1
            results = []
            for r in self._pool.map_with_error_catching(lambda b: _build_in_worker(*b),
                                                        [(b.mod, b.target) for b in build_inputs]):
                if r.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(r.value, None))
                elif r.status == StatusKind.TIMEOUT:
                    results.append(BuilderResult(None, f"build timed out after {timeout_s} s"))
                else:
                    results.append(BuilderResult(None, f"build failed: {r.value}"))
            return results

        def close(self) -> None:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None

    return PooledBuilder()


def _locked_runner(device_key: str, runner: Any) -> Any:
    """Wraps a (synchronous) MetaSchedule runner so each batch is timed under the device lock."""
    from tvm.s_tir.meta_schedule.runner import PyRunner
    from tvm.ir.utils import derived_object

    @derived_object
    class LockedRunner(PyRunner):
        def __init__(self) -> None:
            super().__init__()
            self.inner = runner

        def run(self, runner_inputs: list[Any]) -> list[Any]:
            with device_lock(device_key):
                futures = self.inner.run(runner_inputs)
                for f in futures:
                    f.result()  # finish every timing before the lock is let go
            return futures

    return LockedRunner()


def local_runner(device_key: str) -> Any:
    """Times tuning candidates on this machine, under the device lock."""
    from tvm.s_tir import meta_schedule as ms

    return _locked_runner(device_key, ms.runner.LocalRunner(
        timeout_sec=60.0, evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20)))


def rpc_runner(rpc: Any, device_key: str) -> Any:
    """Times tuning candidates on a remote device reached through a TVM RPC tracker."""
    from tvm.s_tir import meta_schedule as ms

    if not rpc.tracker:
        raise BuildError("target.rpc.tracker: tuning on a remote device needs a TVM RPC tracker (and rpc.key); "
                         "set target.rpc.tracker, or set target.tuning.trials to 0 to measure untuned")
    config = ms.runner.RPCConfig(tracker_host=rpc.host, tracker_port=rpc.port, tracker_key=rpc.key,
                                 session_timeout_sec=int(rpc.timeout_s))
    return _locked_runner(device_key, ms.runner.RPCRunner(
        rpc_config=config, evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20)))


# --------------------------------------------------------------------------- database


DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")
"""The files of MetaSchedule's JSON database in its folder: workloads, then the records that refer to them."""


class TuningDatabase:
    """The MetaSchedule database of one TVM target, on disk under ``<cache_dir>/tvm-tuning/<target hash>/``.

    Processes that tune into it hold its file lock; each tuning session re-reads
    the files, so records written by other processes (other search workers,
    earlier runs) are reused.
    """

    def __init__(self, path: Path, target: Any):
        self.path = path
        self.target = target
        path.mkdir(parents=True, exist_ok=True)
        self.lock = FileLock(str(path / "tuning.lock"))

    @classmethod
    def for_target(cls, target: Any, cache_dir: str | Path | None, database: str | Path | None = None,
                   machine: Mapping[str, Any] | None = None) -> TuningDatabase:
        """The database of a TVM target on one machine; ``database`` (``target.tuning.database``) names a folder
        shared beyond this cache.

        Keyed by the TVM target (LLVM CPU, cores), ``machine`` (:meth:`.target.Target.machine_key`: CPU model,
        ISA features and threads, or the remote device) and TVM's version: a schedule measured fastest on one
        CPU, or by another TVM, is not known to be fastest on another, so records never cross machines.
        """
        root = Path(database) if database else cache_root(cache_dir) / "tvm-tuning"
        return cls(root / content_hash(str(target), dict(machine or {}), backend_version("tvm")), target)

    def open(self) -> Any:
        """The database, with TVM's tensor intrinsics registered first when a record tensorizes.

        Loading a record replays its trace, and a trace that names an intrinsic not
        registered in this process fails the whole load ("TensorIntrin 'dot_16x4_vnni'
        is not registered"): an int8 candidate's records would break every later
        tuning run on the target. Parsing the intrinsics costs seconds, so it is paid
        only when a record needs them.
        """
        from tvm.s_tir import meta_schedule as ms

        records = self.path / DATABASE_FILES[1]
        try:
            if records.exists() and '"Tensorize"' in records.read_text(errors="replace"):
                load_tensor_intrinsics()
            return ms.database.JSONDatabase(work_dir=str(self.path))
        except Exception as exc:  # noqa: BLE001 - TVM's parse error on damaged records, whatever its class
            # Records are a cache of measurements: set the damaged files aside and tune again into fresh ones.
            why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:120] if str(exc).strip() else ''}"
            for name in DATABASE_FILES:
                if (self.path / name).exists():
                    set_aside(self.path / name, why)
            return ms.database.JSONDatabase(work_dir=str(self.path))

    def known(self, db: Any, task: Any) -> bool:
        """Whether ``db`` already holds a measured schedule for this task (its layer shape was tuned before)."""
        return db.query_tuning_record(task.dispatched[0], task.target, task.task_name) is not None


# --------------------------------------------------------------------------- survey tuning


@dataclass(frozen=True)
class Round:
    trials: int
    tuning_s: float
    latency_ms: float


@dataclass
class TuningReport:
    """What tuning one candidate cost and gave; ``chosen`` is 'tuned' or 'untuned' (never the slower)."""

    tasks: int = 0
    hits: int = 0
    untuned_ms: float = float("nan")
    rounds: list[Round] = field(default_factory=list)
    tuning_s: float = 0.0
    trials: int = 0
    stopped: str = ""
    chosen: str = "untuned"
    flops: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.tasks if self.tasks else float("nan")

    @property
    def best_ms(self) -> float:
        return min([self.untuned_ms] + [r.latency_ms for r in self.rounds])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": self.hit_rate, "best_ms": self.best_ms}


def model_flops(prepared_mod: Any) -> float:
    """FLOPs of one inference, summed over the model's TIR functions (TVM's own estimate)."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    total = 0.0
    for gvar, fn in prepared_mod.functions.items():
        if isinstance(fn, tvm.tirx.PrimFunc):
            try:
                total += float(estimate_tir_flops(tvm.IRModule({gvar: fn})))
            except Exception:  # functions TVM cannot estimate (opaque externs) add nothing
                pass
    return total


INT8_PEAK_FACTOR = 4
"""How much faster than fp32 FMA the integer convolutions may run: ``vpdpbusd`` does 64 uint8 x int8 multiply-adds
per instruction where an FMA does 16 fp32 ones. An upper bound, so the skip test below stays optimistic."""


def cpu_peak_gflops(threads: int | None = None) -> float:
    """fp32 peak of the host CPU: cores x clock x FMA lanes x 2.

    Lanes per cycle per core: 32 (2 FMA units x 16 fp32 lanes) with AVX-512 on a
    full 512-bit datapath (Zen 5, Intel server cores), 16 with a 256-bit datapath
    (Zen 4 runs AVX-512 as 2 x 256; AVX2 machines), 8 otherwise. The clock is the
    nominal frequency /proc/cpuinfo reports; boost clocks exceed it, so the true peak
    is higher and a share of this peak overstates efficiency (it can pass 100 %).
    """
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    mhz = [float(line.split(":")[1]) for line in cpuinfo.splitlines() if line.startswith("cpu MHz")]
    flags = host_cpu_info().flags
    cpu = host_cpu()
    if "avx512f" in flags and cpu not in ("znver4",):
        lanes = 32
    elif "avx2" in flags or "avx512f" in flags:
        lanes = 16
    else:
        lanes = 8
    cores = threads or os.cpu_count() or 1
    ghz = (max(mhz) if mhz else 2000.0) / 1e3
    return cores * ghz * lanes * 2


@contextmanager
def _meta_schedule_console(level: int) -> Iterator[None]:
    """Show only ``level`` and above of MetaSchedule's console log while tuning, and let it set up its loggers.

    MetaSchedule gives its console handler the level its global logger has when a
    tuning session starts (DEBUG when unset) and prints a task table per trial batch;
    the full per-task logs still go to ``<database>/logs``. Its logger set-up lists
    the handlers already on its global logger by name and fails on one without a
    name ("'NoneType' object has no attribute 'format'"): an application's own handler,
    or pytest's log capture, would end the tuning run. Those are set aside meanwhile.
    """
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    saved = ms_logger.level
    unnamed = [h for h in ms_logger.handlers if h.get_name() is None]
    for handler in unnamed:
        ms_logger.removeHandler(handler)
    ms_logger.setLevel(level)
    try:
        yield
    finally:
        ms_logger.setLevel(saved)
        for handler in unnamed:
            ms_logger.addHandler(handler)


NATIVE_LOG = "native.log"
"""Where, in the tuning database's ``logs`` folder, TVM's native warnings of a tuning session go."""


@contextmanager
def native_log(path: Path) -> Iterator[None]:
    """Send what native code writes to standard error meanwhile to ``path``, and what Python writes to the console.

    TVM's C++ passes log warnings straight to file descriptor 2: a default-profile
    CropFollow run printed 323 lines of ``rewrite_tensorize.cc: Warning: Tensorize failed``
    into ``qaopt optimize``'s console, harmless (MetaSchedule tries tensor intrinsics on
    every block and keeps the schedules where they apply) but burying the run's own
    lines. Descriptor 2 goes to ``path``; ``sys.stderr`` (what rich's console and Python's
    warnings write to) is pointed at a copy of the original descriptor, so the console is
    unchanged. The log is appended to, so a session's warnings stay readable after it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    console = os.dup(2)
    previous = sys.stderr
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
        encoding = getattr(previous, "encoding", None) or "utf-8"
        sys.stderr = os.fdopen(os.dup(console), "w", buffering=1, encoding=encoding)
        try:
            yield
        finally:
            sys.stderr.flush()
            sys.stderr.close()
            sys.stderr = previous
            os.dup2(console, 2)
            os.close(console)


def stop_reason(latencies_ms: list[float], min_gain: float) -> str:
    """Survey tuning's early stop: why to stop after these rounds' whole-model latencies ('' to go on).

    Stops when each of the last two rounds improved the best latency by less than
    ``min_gain``: one slow round is often followed by a good one (the evolutionary
    search and the cost model catch up), two in a row rarely are. The first round,
    which replaces TVM's default schedules and always gains a lot, is never the
    reference, so a stop needs three rounds.
    """
    best = [min(latencies_ms[: i + 1]) for i in range(len(latencies_ms))]
    if len(best) < 3:
        return ""
    gains = [(best[i - 1] - best[i]) / best[i - 1] for i in (-2, -1)]
    if max(gains) < min_gain:
        return (f"early stop: rounds {len(best) - 1} and {len(best)} improved {gains[0]:.1%} and {gains[1]:.1%}, "
                f"each < {min_gain:.0%}")
    return ""


class SurveyTuner:
    """Tunes one candidate's cold tasks in rounds into the shared database (see the module docstring).

    ``round_trials_per_task`` trials per cold task make one round; tuning stops
    when two rounds in a row each gain less than ``min_gain`` (relative latency).
    ``population`` is the evolutionary search's population (MetaSchedule's default
    is 512): each round re-runs the search for every task, and with a handful of
    trials per round a large population costs more than the trials it picks
    (Felix's point: time to good code is what counts). ``attainable`` is the share
    of peak FLOP/s assumed for the optimistic bound that decides whether tuning
    can win at all.
    """

    def __init__(self, database: TuningDatabase, *, round_trials_per_task: int = 8, min_gain: float = 0.05,
                 attainable: float = 0.6, population: int = 64, builder_workers: int | None = None, seed: int = 0):
        self.database = database
        self.round_trials_per_task = round_trials_per_task
        self.min_gain = min_gain
        self.attainable = attainable
        self.builder_workers = builder_workers or max(1, (os.cpu_count() or 2))
        self.population = population
        self.seed = seed

    def tune(self, prepared: Prepared, evaluate: Callable[[Any], float], *, trials: int, seconds: float | None,
             runner: Any, threads: int | None, incumbent_ms: float | None = None) -> tuple[TuningReport, Any]:
        """Tune, and return the report and the database to build with (``None``: the untuned build is faster).

        ``evaluate(db)`` builds the model with ``db`` (``None``: default schedules)
        and returns its measured latency in ms; ``runner`` times tuning candidates
        on the device (:func:`local_runner` or :func:`rpc_runner`).
        """
        from tvm.s_tir import meta_schedule as ms

        report = TuningReport(flops=model_flops(prepared.mod))
        report.untuned_ms = evaluate(None)
        with self.database.lock:
            db = self.database.open()
            tasks = ms.relax_integration.extract_tasks(prepared.mod, prepared.target)
            tunable = [t for t in tasks if not t.mod.attrs.get("tirx.is_scheduled", False)]
            cold = [t for t in tunable if not self.database.known(db, t)]
            report.tasks, report.hits = len(tunable), len(tunable) - len(cold)
            optimistic_ms = self._optimistic_ms(prepared, report.flops, threads)
            if incumbent_ms is not None and optimistic_ms is not None and optimistic_ms >= incumbent_ms:
                report.stopped = (f"skipped: even at {self.attainable:.0%} of peak ({optimistic_ms:.2f} ms) "
                                  f"it cannot beat the incumbent {incumbent_ms:.2f} ms")
            elif not cold:
                report.stopped = "all tasks found in the shared database"
            else:
                self._survey(cold, db, evaluate, report, trials, seconds, runner)
        if report.hits and not report.rounds:  # nothing tuned now, but the database knows some tasks: free to try
            report.rounds.append(Round(0, 0.0, evaluate(db)))
        best_tuned = min([r.latency_ms for r in report.rounds], default=float("inf"))
        if best_tuned < report.untuned_ms:
            report.chosen = "tuned"
            return report, db
        return report, None

    def _search_threads(self, cold: list[Any]) -> int:
        """Threads of the evolutionary search. One on a CPU target, whose cores the builders and the timed runs
        need. On a GPU every sampled schedule is also lowered and checked against the GPU's limits
        (``VerifyGPUCode``), and the tuning process's one busy thread, not the builders or the GPU, set the pace:
        90 % of a core through the 25 minutes of a compact NN's first 262 trials on the GPU host, its 16 builder
        processes near 10 % each (docs/BENCHMARKS.md, "TVM's CUDA target"). The host's cores are idle while the search
        runs, so on a GPU it gets the builders' share."""
        return self.builder_workers if is_cuda(cold[0].target) else 1

    def _optimistic_ms(self, prepared: Prepared, flops: float, threads: int | None) -> float | None:
        """The latency tuning could reach at best: FLOPs at ``attainable`` of the CPU's peak. ``None`` on a GPU,
        where a batch-1 NN is bound by its kernel launches, not its arithmetic, so FLOPs bound nothing useful."""
        if is_cuda(prepared.target):
            return None
        peak = cpu_peak_gflops(threads) * (INT8_PEAK_FACTOR if prepared.integer_convolutions else 1)
        return flops / (self.attainable * peak * 1e9) * 1e3

    def _survey(self, cold: list[Any], db: Any, evaluate: Callable[[Any], float], report: TuningReport,
                trials: int, seconds: float | None, runner: Any) -> None:
        from tvm.s_tir import meta_schedule as ms

        load_tensor_intrinsics()
        per_round = self.round_trials_per_task * len(cold)
        builder = _pooled_builder(self.builder_workers, timeout_s=60.0)
        cost_model = ms.cost_model.XGBModel(extractor=ms.feature_extractor.PerStoreFeature(), adaptive_training=True)
        work_dir = str(self.database.path / "logs")
        try:
            while True:
                budget_left = trials - report.trials if trials else per_round
                if budget_left <= 0:
                    report.stopped = f"trial budget of {trials} spent"
                    return
                if seconds is not None and report.tuning_s >= seconds:
                    report.stopped = f"time budget of {seconds:.0f} s spent"
                    return
                n = min(per_round, budget_left)
                per_task = min(self.round_trials_per_task, max(1, n // len(cold)))  # every cold task gets a share
                strategy = ms.search_strategy.EvolutionarySearch(
                    population_size=self.population, init_min_unmeasured=max(8, self.population // 4), genetic_num_iters=2)
                start = time.perf_counter()
                try:
                    with _meta_schedule_console(logging.WARNING), native_log(Path(work_dir) / NATIVE_LOG):
                        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                            cold, work_dir, strategy=strategy, seed=self.seed + len(report.rounds),
                            num_threads=self._search_threads(cold))
                        ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work_dir, max_trials_global=n,
                                      max_trials_per_task=n, num_trials_per_iter=per_task,
                                      builder=builder, runner=runner, database=db, cost_model=cost_model,
                                      task_scheduler="round-robin")
                except Exception as exc:
                    raise BuildError(f"MetaSchedule tuning failed: {type(exc).__name__}: {exc}") from exc
                report.trials += n
                report.tuning_s += time.perf_counter() - start
                report.rounds.append(Round(report.trials, round(report.tuning_s, 2), evaluate(db)))
                reason = stop_reason([r.latency_ms for r in report.rounds], self.min_gain)
                if reason:
                    report.stopped = reason
                    return
                if not trials and seconds is None:
                    report.stopped = "one round (no budget given)"
                    return
        finally:
            builder.close()
