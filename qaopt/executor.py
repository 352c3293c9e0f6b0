"""One executor for independent runs: a local process pool, or a Dask cluster when given its address.

Calibration's seed blocks and closed-loop validation's blocks are independent runs:
each is a pure function of the application, what is injected (or which NNs drive)
and the seeds. They go through a :class:`concurrent.futures.Executor`:

- :class:`LocalPool`: processes on this machine (``--workers N``; default: the cores
  this process may use), started with ``spawn`` so a worker never inherits a parent's
  OpenMP or torch thread state. A worker that dies mid-task (killed, out of memory)
  breaks a stdlib pool; this one starts a new pool and runs the lost tasks again.
- :class:`ClusterExecutor`: a Dask ``distributed.Client`` connected to a scheduler
  (``--cluster tcp://host:8786`` or the spec's ``output.cluster``). The scheduler
  re-runs a task whose worker was lost. Connecting fails fast with the reason when the
  scheduler cannot be reached, and checks that every worker imports qaopt and the
  application's modules, naming the module a worker lacks.

Results never depend on which worker ran what or in which order: the callers
(:meth:`qaopt.calibrate.Calibration.evaluate`, :func:`qaopt.closed_loop.validate_closed_loop`)
dispatch whole seed blocks and consume their outcomes in block order.

Measurement stays out of the pools: candidates are timed in the process that runs
the search, under the target's device lock (:func:`qaopt.kernels.device_lock`).
Every task of either executor waits for that lock to be free before it starts
(:class:`Gated`), so no new run starts on a machine while a measurement holds it.
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, wait
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.app_spec import AppSpec, QaoptError
from qaopt.app_spec.errors import warn
from qaopt.calibrate.app_calls import Outcome, RunLimits, call_application
from qaopt.calibrate.protocols import records_problem

WORKERS_ENV = "QAOPT_WORKERS"
"""Overrides the default size of the local pool (``1``: everything runs in this process, no pool)."""
CONNECT_TIMEOUT_ENV = "QAOPT_CLUSTER_TIMEOUT"
"""Seconds to wait for a Dask scheduler (and its first worker) before giving up; default 10."""


def connect_timeout() -> float:
    try:
        return max(0.5, float(os.environ.get(CONNECT_TIMEOUT_ENV, "") or 10.0))
    except ValueError:
        return 10.0


class ExecutorError(QaoptError):
    """The cluster cannot be reached or used, or a worker cannot run the application."""


# --------------------------------------------------------------------------- sizing


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(reserved: int = 0) -> int:
    """The local pool's size: ``$QAOPT_WORKERS``, else this process's cores less the ``reserved`` ones."""
    text = os.environ.get(WORKERS_ENV, "").strip()
    if text:
        try:
            n = int(text)
        except ValueError:
            raise ExecutorError(f"${WORKERS_ENV}={text!r}: give a whole number of workers, at least 1") from None
        if n < 1:
            raise ExecutorError(f"${WORKERS_ENV}={text!r}: give a whole number of workers, at least 1")
        return n
    return max(1, machine_cores() - reserved)


RESERVE_FACTOR = 4
"""Measurement cores are kept free of pool workers only on machines with at least this many times as many cores."""


def reserved_cores(spec: AppSpec | None) -> tuple[int, ...]:
    """The cores a measurement on ``spec``'s target runs on, kept free of this machine's pool workers.

    A local CPU target with ``threads`` is measured pinned to the first ``threads`` cores
    (:func:`qaopt.kernels.measure.measurement_cores`). On a machine with many more cores
    (a 16-core workstation measuring a 2-thread robot), workers kept off those cores let a
    measurement run beside simulator runs, of this process or another, without the
    interference that makes it untrusted. On a small machine reserving them would idle a large
    share of it between measurements, so nothing is reserved and the device lock alone keeps
    new runs from starting while a measurement holds it.
    """
    if spec is None or spec.target.device != "cpu" or not spec.target.threads:
        return ()
    from qaopt.kernels.measure import measurement_cores

    cores = measurement_cores(spec.target.threads)
    return cores if machine_cores() >= RESERVE_FACTOR * len(cores) else ()


# --------------------------------------------------------------------------- the device lock


class Gated:
    """``fn`` run only once the device lock ``device_key`` is free: no run starts while a measurement holds it."""

    def __init__(self, fn: Callable[..., Any], device_key: str | None):
        self.fn, self.device_key = fn, device_key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.device_key:
            from qaopt.kernels.measure import device_lock

            with device_lock(self.device_key):
                pass
        return self.fn(*args, **kwargs)


def _init_worker(cores: tuple[int, ...] = ()) -> None:
    """One thread per worker for torch, OpenMP and numba: the pool's processes are the parallelism.

    With ``cores``, the worker (and every thread it starts) runs only on them. A worker
    ignores SIGINT: Ctrl-C at a terminal reaches the whole process group, and the parent
    decides (it prints one line and ends its workers, :func:`open_executor`) instead of every
    worker printing its ``KeyboardInterrupt`` traceback. Its library warnings go to the command's run log
    (:mod:`qaopt.run_log`).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    from qaopt.run_log import log_worker_output

    log_worker_output()  # library warnings of its runs go to the command's run.log, not the console
    if cores:
        os.sched_setaffinity(0, cores)


# --------------------------------------------------------------------------- local pool


class LocalPool(Executor):
    """A process pool on this machine whose tasks survive a worker's death (``retries`` times each).

    ``reserved`` cores (:func:`reserved_cores`) are kept free of its workers.
    """

    def __init__(self, workers: int, device_key: str | None = None, retries: int = 2, reserved: Sequence[int] = ()):
        if workers < 1:
            raise ExecutorError(f"--workers {workers}: give at least 1")
        self.workers, self.device_key, self.retries = workers, device_key, retries
        allowed = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        self.cores = tuple(sorted(allowed - set(reserved))) if reserved and allowed - set(reserved) else ()
        self.where = f"local pool of {workers} worker(s)" + (
            f", off core(s) {', '.join(map(str, sorted(reserved)))} (kept for measurement)" if self.cores else "")
        self._lock = threading.Lock()
        self._pool = self._new_pool()
        self._closed = False
        self._in_flight: set[Future] = set()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(self.cores,))

    def _renew(self, broken: ProcessPoolExecutor) -> ProcessPoolExecutor:
        """A working pool in place of ``broken`` (once, whichever task noticed first), said in one warning line."""
        with self._lock:
            if self._pool is broken and not self._closed:
                broken.shutdown(wait=False, cancel_futures=True)
                self._pool = self._new_pool()
                warn(f"a worker of the {self.where} was lost (killed, or out of memory); its runs are run again")
            return self._pool

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        outer: Future = Future()
        with self._lock:
            self._in_flight.add(outer)
        outer.add_done_callback(self._forget)
        self._launch(outer, Gated(fn, self.device_key), args, kwargs, self.retries)
        return outer

    def _forget(self, outer: Future) -> None:
        with self._lock:
            self._in_flight.discard(outer)

    def quiesce(self) -> int:
        """Wait until no task of this pool runs, then end its idle workers; the number of tasks that were in flight.

        Validation stops a configuration after the block that decides it, and the blocks already running go on
        (their runs are cached for a longer validation of the same NNs), so its workers stay busy for up to a
        block's time after the verdict: a latency measured then is disturbed (1.5-1.8x slower in every run that
        timed its frames right after validation on a 2-core machine). The side-by-side stage quiesces the pool
        first; its workers' processes (each holding a simulator, NNs and thread pools) end too, so nothing of them
        shares the cores with the timing. A later task starts new workers.
        """
        with self._lock:
            pending = list(self._in_flight)
        wait(pending)
        with self._lock:
            if not self._in_flight and not self._closed:
                self._pool.shutdown(wait=True)
                self._pool = self._new_pool()  # spawns its workers only when a task comes
        return len(pending)

    def _launch(self, outer: Future, fn: Callable, args: tuple, kwargs: dict, left: int) -> None:
        pool = self._pool
        try:
            inner = pool.submit(fn, *args, **kwargs)
        except BrokenProcessPool:
            inner = self._renew(pool).submit(fn, *args, **kwargs)
        except RuntimeError as exc:  # shut down meanwhile
            outer.set_exception(exc)
            return

        def done(f: Future) -> None:
            if outer.done():
                return
            if f.cancelled():
                outer.cancel()
                return
            exc = f.exception()
            if isinstance(exc, BrokenProcessPool) and left > 0 and not self._closed:
                self._renew(pool)  # a worker died: its task (and every other task of that pool) runs again
                self._launch(outer, fn, args, kwargs, left - 1)
            elif isinstance(exc, BrokenProcessPool) and not self._closed:
                outer.set_exception(ExecutorError(
                    f"a worker of the {self.where} died {self.retries + 1} times running the same task: the "
                    "application crashes its process (a segfault, os._exit, out of memory); run with --workers 1 "
                    "to see its own error"))
            elif exc is not None:
                outer.set_exception(exc)
            else:
                outer.set_result(f.result())

        outer.add_done_callback(lambda o: inner.cancel() if o.cancelled() else None)
        inner.add_done_callback(done)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pool = self._pool
        pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def terminate(self) -> None:
        """End the pool now, its workers' runs in flight included: the command is stopping (Ctrl-C, an error)."""
        processes = list((getattr(self._pool, "_processes", None) or {}).values())  # shutdown forgets them
        self.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()


def quiesce(executor: Executor | None) -> int:
    """Wait until no task of ``executor`` runs on this machine and end its idle local workers; the number of tasks
    that were in flight.

    Only a local pool's workers share this machine's cores (:meth:`LocalPool.quiesce`); a cluster's run elsewhere.
    """
    return executor.quiesce() if isinstance(executor, LocalPool) else 0


# --------------------------------------------------------------------------- Dask


class ClusterExecutor(Executor):
    """Tasks on a Dask cluster through ``distributed.Client``; a lost worker's tasks are run again by the scheduler."""

    def __init__(self, address: str, *, spec: AppSpec | None = None, device_key: str | None = None,
                 timeout: float | None = None, workers: int | None = None):
        try:
            from distributed import Client
        except ImportError as exc:
            raise ExecutorError(f"--cluster {address}: the Dask client is not installed ({exc}); "
                                "pip install 'dask[distributed]'") from None
        self.address, self.device_key = address, device_key
        timeout = connect_timeout() if timeout is None else timeout
        try:
            self.client = Client(address, timeout=timeout, set_as_default=False)
        except Exception as exc:  # noqa: BLE001 - OSError, TimeoutError, ValueError for a bad address, ...
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExecutorError(f"--cluster {address}: cannot reach the Dask scheduler: {reason}") from None
        try:
            info = self.client.scheduler_info()
            if not info.get("workers"):
                self.client.wait_for_workers(1, timeout=timeout)
                info = self.client.scheduler_info()
            threads = sum(int(w.get("nthreads", 1)) for w in info["workers"].values())
            self.workers = min(workers, threads) if workers else threads
            check_workers(self.client, spec)
        except ExecutorError:
            self.client.close()
            raise
        except Exception as exc:  # noqa: BLE001 - no worker came, the scheduler went away
            self.client.close()
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExecutorError(f"--cluster {address}: the cluster has no usable worker: {reason}") from None
        self.where = f"Dask cluster {address} ({self.workers} worker thread(s))"
        self._executor = self.client.get_executor(pure=False)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return self._executor.submit(Gated(fn, self.device_key), *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        try:
            self._executor.shutdown(wait=wait)
        finally:
            self.client.close()


def application_modules(spec: AppSpec | None) -> list[str]:
    """The modules a worker must import to run ``spec``'s application: its plugins and its simulator's module."""
    if spec is None:
        return []
    modules = list(spec.plugins)
    sim = spec.evaluator.simulator
    if sim is not None and sim.entry_point:
        modules.append(sim.entry_point.split(":", 1)[0])
    return modules


def _probe_code(module: str, folder: str | None) -> str:
    """Source run on a worker (by the stdlib's ``exec``, which any worker can unpickle): import ``module``."""
    path = f"import sys\nsys.path.insert(0, {folder!r}) if {folder!r} not in sys.path else None\n" if folder else ""
    return f"{path}import importlib\nimportlib.import_module({module!r})\n"


def check_workers(client: Any, spec: AppSpec | None) -> None:
    """Every worker imports qaopt and the application's modules, else an error naming the worker and the module."""
    folder = str(Path(spec.source).resolve().parent) if spec is not None and spec.source else None
    for module in ["qaopt", "qaopt.executor", *application_modules(spec)]:
        answers = client.run(exec, _probe_code(module, folder), {}, on_error="return")
        for worker, answer in sorted(answers.items()):
            if isinstance(answer, BaseException):
                raise ExecutorError(_worker_problem(worker, module, answer))


def _worker_problem(worker: str, module: str, exc: BaseException) -> str:
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing:
        return (f"worker {worker} cannot import {module!r}: it lacks the module {missing!r}; install qaopt and the "
                f"application's package on every worker (same versions as here)")
    return f"worker {worker} cannot import {module!r}: {type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- choosing one


@contextlib.contextmanager
def open_executor(
    *, cluster: str | None = None, workers: int | None = None, spec: AppSpec | None = None,
    device_key: str | None = None,
) -> Iterator[Executor | None]:
    """The executor a command runs its independent runs on; ``None`` when one worker suffices (run in-process).

    ``cluster`` (else the spec's ``output.cluster``) is a Dask scheduler's address; ``workers``
    caps the runs in flight on it. Without a cluster, a local pool of ``workers`` processes
    (default :func:`default_workers`); one worker runs in this process, as before pools existed.
    Every task waits for the device lock ``device_key`` (default: the spec's target's,
    :func:`lock_key`) before it starts. On a machine with many cores, the local pool's workers
    keep off the cores the spec's target is measured on (:func:`reserved_cores`).
    """
    address = cluster or (getattr(spec.output, "cluster", None) if spec is not None else None)
    if device_key is None and spec is not None:
        device_key = lock_key(spec)
    if workers is not None and workers < 1:
        raise ExecutorError(f"--workers {workers}: give at least 1")
    if address:
        ex: Executor = ClusterExecutor(address, spec=spec, device_key=device_key, workers=workers)
    else:
        reserved = reserved_cores(spec)
        n = workers if workers is not None else default_workers(len(reserved))
        if n == 1:
            yield None
            return
        ex = LocalPool(n, device_key=device_key, reserved=reserved)
    try:
        yield ex
    except BaseException:
        if isinstance(ex, LocalPool):  # stopping: runs in flight are not waited for (finished blocks are cached)
            ex.terminate()
        raise
    finally:
        ex.shutdown(wait=False, cancel_futures=True)


def lock_key(spec: AppSpec) -> str | None:
    """The device lock pool tasks wait for: the spec's target's, when it is this machine's (not a remote one)."""
    from qaopt import kernels

    target = kernels.Target.from_spec(spec.target)
    return None if target.device == "rpc" else target.device_key


# --------------------------------------------------------------------------- what workers run


_EVALUATORS: dict[str, Any] = {}


class SpecEvaluator:
    """Builds a spec's application on a worker (once per process): ships as the spec, not as the simulator.

    A worker that lacks the application's package (or qaopt's dependencies) raises
    :class:`ExecutorError` naming the module and the worker.
    """

    def __init__(self, spec: AppSpec):
        self.spec = spec
        self.key = spec.content_hash("evaluator")

    def __call__(self) -> Any:
        evaluator = _EVALUATORS.get(self.key)
        if evaluator is None:
            from qaopt.app_spec.entrypoints import add_import_path
            from qaopt.spec_adapter import make_evaluator

            if self.spec.source:
                add_import_path(Path(self.spec.source).resolve().parent)
            try:
                evaluator = make_evaluator(self.spec)
            except Exception as exc:  # noqa: BLE001 - find the module a worker lacks in the chain of causes
                missing = _missing_module(exc)
                if missing is None:
                    raise
                raise ExecutorError(
                    f"worker {socket.gethostname()} (pid {os.getpid()}) cannot build the application "
                    f"{self.spec.evaluator.simulator.entry_point!r}: it lacks the module {missing!r}; install the "
                    "application's package on every worker") from None
            _EVALUATORS[self.key] = evaluator
        return evaluator


def _missing_module(exc: BaseException | None) -> str | None:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return exc.name
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


_SHARED_FRAME: dict[str, tuple[Any, np.ndarray, np.ndarray, set[str]]] = {}
"""Per merged candidate (its key) that ran on the frame batch being read: the batch, a sample of its values, the
whole output, and the members that have read it."""


def _frame_sample(x: Any) -> np.ndarray:
    return np.asarray(x).flat[:: 4099].copy()


class ShippedNN:
    """A candidate NN as a picklable perception callable: its torch module, or its int8 ONNX file's bytes.

    Built from a :class:`qaopt.approx.Candidate` here and sent to workers by value, so
    they need no shared cache to run it. A torch module runs on ``device``: a GPU target's
    NNs run in the loop on the GPU, with the kernels and numerics they are deployed with
    (fp16 is a GPU dtype) and at a GPU's speed (a ResNet-18 costs ~47 ms a frame on one
    CPU core, ~1 ms on the GPU); the module is placed there once, on its first frame, as
    a copy, so the candidate itself stays on the CPU where export and timing expect it.
    The torch module travels as the bytes of ``torch.save``: a pool pickles tensors
    otherwise by handing their file descriptors over
    from a server thread of this process, which prints a ``ConnectionResetError`` traceback
    when a worker is lost mid-transfer. Its ONNX Runtime session is opened on first
    call in the worker, with one thread, by the session factory every other session
    comes from (:func:`qaopt.kernels.onnx.ort_session`).

    The views of one merged NN (one per NN it serves, each its output columns) run its backbone once per frame
    batch, as the deployed NN does: a view called with the batch its merged NN last ran on, which it has not read
    yet, takes its columns of that output (the batch is the same array object with the same values: an
    application calls each NN of a step with one batch). A 100 m closed-loop run of CropFollow's merged NN
    took 23.1 s instead of 30.3 on one core (``benchmarks/closed_loop_speed.py``, docs/BENCHMARKS.md).
    """

    def __init__(self, candidate: Any, device: str = "cpu"):
        self.key, self.device, self.nn = candidate.key, device, candidate.nn
        self.module = candidate.module if candidate.onnx_path is None else None
        self.onnx = Path(candidate.onnx_path).read_bytes() if candidate.onnx_path is not None else None
        self.columns = None if candidate.columns is None else list(candidate.columns)
        self._session = None
        self._placed = None
        self._module_bytes: bytes | None = None

    def __getstate__(self) -> dict:
        if self.module is not None and self._module_bytes is None:
            import io

            import torch

            buffer = io.BytesIO()
            torch.save(self.module, buffer)
            self._module_bytes = buffer.getvalue()
        return {"key": self.key, "device": self.device, "nn": self.nn, "module": self._module_bytes,
                "onnx": self.onnx, "columns": self.columns}

    def __setstate__(self, state: dict) -> None:
        module = state.pop("module")
        self.__dict__.update(state, _session=None, _placed=None, _module_bytes=module, module=None)
        if module is not None:
            import io

            import torch

            self.module = torch.load(io.BytesIO(module), weights_only=False)

    def __call__(self, x: Any) -> Any:
        if self.columns is None:
            return self._run(x)
        shared = _SHARED_FRAME.get(self.key)
        if (shared is not None and shared[0] is x and self.nn not in shared[3]
                and np.array_equal(shared[1], _frame_sample(x))):
            shared[3].add(self.nn)
            return shared[2][:, self.columns]
        out = self._run(x)
        for key in [key for key, entry in _SHARED_FRAME.items() if entry[0] is not x]:
            del _SHARED_FRAME[key]  # only the batch being read is kept: a worker runs many candidates
        _SHARED_FRAME[self.key] = (x, _frame_sample(x), out, {self.nn})
        return out[:, self.columns]

    def _run(self, x: Any) -> np.ndarray:
        """The whole output of the NN (every column of a merged one) on the frame batch ``x``."""
        from qaopt.approx.quantize import predict_onnx, predict_torch

        if self.onnx is None:
            if self._placed is None:
                self._placed = self.module if self.device == "cpu" else copy.deepcopy(self.module).to(self.device)
            out = predict_torch(self._placed, x, device=self.device)
        else:
            if self._session is None:
                from qaopt.kernels.onnx import ort_session

                self._session = ort_session(self.onnx, threads=1)
            out = predict_onnx(self._session, x)
        return out


def run_perception_seeds(app: Any, nns: Mapping[str, Callable], limits: RunLimits, metric: str,
                         seeds: Sequence[int], render_threads: int = 1) -> Outcome:
    """Closed-loop runs of ``seeds`` with ``nns`` in the loop, within ``limits``: their records, or the failure."""
    return call_application(app, "evaluate_perception", dict(nns), list(seeds), limits,
                            check=partial(records_problem, seeds=list(seeds), metric=metric),
                            render_threads=render_threads)


def run_perception_block(make: Callable[[], Any], nns: Mapping[str, Callable], limits: RunLimits, metric: str,
                         seeds: Sequence[int], render_threads: int = 1) -> Outcome:
    """One closed-loop validation block on a worker: the application built there, the NNs shipped to it."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    return run_perception_seeds(make(), nns, limits, metric, seeds, render_threads=render_threads)
