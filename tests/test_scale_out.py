"""Scale out: seed blocks on a process pool or a Dask cluster give the serial result.

The Dask tests start a real cluster: a scheduler and a nanny with two worker processes,
each its own process, as a user would on several machines.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from qaopt.app_spec import load
from qaopt.calibrate import AcceptanceTest, Axis, Calibration, ErrorSpace, Gaussian, QoSGoal
from qaopt.calibrate.synthetic import SuperellipseApp
from qaopt.closed_loop import validate_closed_loop
from qaopt.spec_adapter import acceptance_of, goal_of
from qaopt import executor as executor_module
from qaopt.executor import ClusterExecutor, ExecutorError, LocalPool, open_executor, reserved_cores

APPS = Path(__file__).resolve().parent / "apps"
sys.path.insert(0, str(APPS))

from specs import CALIBRATE_SPEC  # noqa: E402
from flaky import DIE_MARKER, ScriptedPerceptionApp, killed_once  # noqa: E402

# The shared calibrate spec of tests/conftest.py on the flaky app; per-point, because the sequential
# per-point verdicts are what must not depend on the workers.
SPEC = (CALIBRATE_SPEC.replace("app: {name: synthetic}", "app: {name: flaky}")
        .replace("qaopt.calibrate.synthetic:SuperellipseApp", "flaky:FlakyApp")
        .replace("{LIMITS}", "{heading: 10.0, distance: 0.1}").replace("steps: 300", "steps: 100")
        .replace("  budget: 6\n", "  certifier: per-point\n  budget: 5\n")
        + "output: {dir: runs, cache_dir: cache}\n")


class ShuffledApp(SuperellipseApp):
    """Blocks finish in a scrambled order (random sleeps): the verdicts must not notice."""

    def evaluate(self, injectors, seeds):
        time.sleep(random.random() * 0.01)
        return super().evaluate(injectors, seeds)


def _calibration(cache: Path, executor=None, app=None) -> Calibration:
    app = app or ShuffledApp({"a": 1.0, "b": 1.0}, steps=60)
    return Calibration(app, ErrorSpace([Axis("a", 2.0), Axis("b", 2.0)]), {"a": Gaussian(), "b": Gaussian()},
                       QoSGoal("failed", max=0.0), AcceptanceTest(0.05, 0.9, 8, 96, block=8), cache, "app",
                       executor=executor)


def _points(region) -> list:
    return [(o.errors, o.passes, o.failures, o.verdict) for o in region.observations]


def test_calibration_gives_the_serial_region_for_any_number_of_workers(tmp_path):
    serial = _calibration(tmp_path / "serial").search("monotone", 6)
    for workers in (2, 5):
        with ThreadPoolExecutor(workers) as ex:
            cal = _calibration(tmp_path / f"w{workers}", ex)
            assert cal.workers == workers
            region = cal.search("monotone", 6)
        assert _points(region) == _points(serial)
        assert region.to_json() == serial.to_json()


def test_speculative_blocks_are_cached_and_reused(tmp_path):
    with ThreadPoolExecutor(4) as ex:
        first = _calibration(tmp_path, ex).search("monotone", 4)
    runs = len(list((tmp_path / "calibrate" / "trials").rglob("*.json")))
    assert runs * 8 >= first.trials  # every counted block is cached, and some past the decisions too
    app = ShuffledApp({"a": 1.0, "b": 1.0}, steps=60)
    again = _calibration(tmp_path, app=app).search("monotone", 4)
    assert app.calls == 0 and _points(again) == _points(first)


def test_local_pool_gives_the_serial_region(tmp_path):
    serial = _calibration(tmp_path / "serial", app=SuperellipseApp({"a": 1.0, "b": 1.0}, steps=60)).search("monotone", 5)
    with LocalPool(2) as pool:
        region = _calibration(tmp_path / "pool", pool, SuperellipseApp({"a": 1.0, "b": 1.0}, steps=60)).search(
            "monotone", 5)
    assert region.to_json() == serial.to_json()


def test_local_pool_runs_a_killed_workers_task_again(tmp_path):
    with LocalPool(2) as pool:
        futures = [pool.submit(killed_once, str(tmp_path / "marker"), 7)] + [
            pool.submit(pow, 2, i) for i in range(6)]
        assert [f.result(timeout=60) for f in futures] == [7, 1, 2, 4, 8, 16, 32]


def test_quiescing_a_local_pool_waits_for_its_tasks_and_ends_its_idle_workers():
    """What validation leaves running after its verdict ends before the side-by-side stage times frames, and the
    workers' processes end with it; a later task starts new ones."""
    with LocalPool(1) as pool:
        assert pool.quiesce() == 0
        running = pool.submit(os.getpid)
        first = running.result(timeout=60)
        slow = pool.submit(time.sleep, 1.5)
        assert executor_module.quiesce(pool) == 1
        assert slow.done() and pool.quiesce() == 0
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # the worker that ran them has ended
        assert pool.submit(os.getpid).result(timeout=60) not in (first, os.getpid())
    assert executor_module.quiesce(None) == 0


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")
def test_local_pool_workers_keep_off_the_reserved_cores():
    # Start from every core: in the full suite an earlier test can leave this thread pinned to one.
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count()))
    try:
        first, *rest = sorted(os.sched_getaffinity(0))
        with LocalPool(2, reserved=(first,)) as pool:
            seen = {c for f in [pool.submit(os.sched_getaffinity, 0) for _ in range(4)] for c in f.result(timeout=60)}
    finally:
        os.sched_setaffinity(0, before)
    assert seen == set(rest)
    assert "kept for measurement" in pool.where


def test_measurement_cores_are_reserved_only_on_a_machine_with_many_more(monkeypatch):
    spec = load(APPS / "tiny.yaml")
    measured = spec.model_copy(update={"target": spec.target.model_copy(update={"device": "cpu", "threads": 1})})
    first = min(os.sched_getaffinity(0))
    monkeypatch.setattr(executor_module, "machine_cores", lambda: 16)
    monkeypatch.delenv("QAOPT_WORKERS", raising=False)
    assert reserved_cores(measured) == (first,)
    assert reserved_cores(measured.model_copy(update={"target": measured.target.model_copy(update={"threads": None})})) == ()
    assert executor_module.default_workers(1) == 15
    monkeypatch.setattr(executor_module, "machine_cores", lambda: 2)
    assert reserved_cores(measured) == ()


def _validation_spec():
    spec = load(APPS / "tiny.yaml")
    acceptance = spec.qos.acceptance.model_copy(update={"max_failure_rate": 0.05, "confidence": 0.9,
                                                        "max_trials": 400})
    return spec.model_copy(update={"qos": spec.qos.model_copy(update={"metric": "errors", "max": 0.0,
                                                                       "acceptance": acceptance})})


def test_a_shipped_int8_nn_runs_its_bytes_in_kernels_session(tmp_path):
    """A validation worker gets an int8 NN's ONNX bytes, not a path, and opens the session kernels' factory opens."""
    import pickle
    from types import SimpleNamespace

    import numpy as np
    import torch

    from qaopt import kernels

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).eval()
    path = kernels.export_onnx(model, [torch.rand(1, 3)], tmp_path / "nn.onnx")
    shipped = pickle.loads(pickle.dumps(executor_module.ShippedNN(
        SimpleNamespace(key="k", nn="heading", module=model, onnx_path=path, columns=None))))
    path.unlink()  # the worker has only the bytes
    x = np.random.default_rng(0).random((5, 3), dtype=np.float32)
    np.testing.assert_allclose(shipped(x), model(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    options = shipped._session.get_session_options()
    assert options.intra_op_num_threads == 1 and options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_a_shipped_torch_nn_keeps_its_device_and_leaves_the_candidate_where_it_was():
    """A GPU target's NNs run in the loop on its GPU (tests/test_gpu_target.py runs that); the device travels with
    the NN to the worker, and on the CPU the module runs in place."""
    import pickle
    from types import SimpleNamespace

    import numpy as np
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).eval()
    fake = SimpleNamespace(key="k", nn="heading", module=model, onnx_path=None, columns=[1])
    shipped = executor_module.ShippedNN(fake, "cuda")
    assert pickle.loads(pickle.dumps(shipped)).device == "cuda"
    on_cpu = pickle.loads(pickle.dumps(executor_module.ShippedNN(fake)))
    x = np.random.default_rng(0).random((5, 3), dtype=np.float32)
    np.testing.assert_allclose(on_cpu(x), model(torch.from_numpy(x)).detach().numpy()[:, [1]], rtol=1e-5, atol=1e-6)
    assert on_cpu._placed is on_cpu.module and next(model.parameters()).device.type == "cpu"


def test_the_views_of_a_merged_nn_run_its_backbone_once_per_frame_batch():
    """Each NN a merged NN serves reads its columns of one run on the batch, as the deployed NN does; a new batch,
    a batch changed in place, or a member reading the same batch again runs it again."""
    import pickle
    from types import SimpleNamespace

    import numpy as np
    import torch

    class Counting(torch.nn.Linear):
        calls = 0

        def forward(self, x):
            Counting.calls += 1
            return super().forward(x)

    torch.manual_seed(0)
    model = Counting(3, 2).eval()
    views = {nn: executor_module.ShippedNN(SimpleNamespace(key="merged", nn=nn, module=model, onnx_path=None,
                                                           columns=[i])) for i, nn in enumerate("ab")}
    assert pickle.loads(pickle.dumps(executor_module.ShippedNN(SimpleNamespace(
        key="merged", nn="b", module=torch.nn.Linear(3, 2), onnx_path=None, columns=[1])))).nn == "b"
    x = np.random.default_rng(0).random((5, 3), dtype=np.float32)
    whole = model(torch.from_numpy(x)).detach().numpy()
    changed = model(torch.full_like(torch.from_numpy(x), 0.5)).detach().numpy()
    Counting.calls = 0
    np.testing.assert_allclose(np.hstack([views["a"](x), views["b"](x)]), whole, rtol=1e-6)
    assert Counting.calls == 1
    views["a"](x)
    assert Counting.calls == 2, "a member reading the batch again is a new frame"
    views["b"](x.copy())
    assert Counting.calls == 3, "another batch"
    views["a"](x)
    x[:] = 0.5
    np.testing.assert_allclose(views["b"](x), changed[:, [1]], rtol=1e-6)
    assert Counting.calls == 5, "the batch changed in place"
    other = executor_module.ShippedNN(SimpleNamespace(key="other", nn="a", module=model, onnx_path=None, columns=[0]))
    other(x.copy())
    views["a"](x)
    assert set(executor_module._SHARED_FRAME) == {"merged"}, "only the batch being read is kept"


@pytest.mark.parametrize("failing", [(), (112,), (100, 140)])
def test_validation_gives_the_serial_verdict_for_any_number_of_workers(failing):
    spec, app = _validation_spec(), ScriptedPerceptionApp(failing)
    nns = {"a": len, "b": len}
    seen = []
    serial = validate_closed_loop(app, nns, goal_of(spec), acceptance_of(spec), 48, trial=1, region_predicted_valid=True, seed_base=100)
    for workers in (2, 6):
        with ThreadPoolExecutor(workers) as ex:
            v = validate_closed_loop(app, nns, goal_of(spec), acceptance_of(spec), 48, trial=1, region_predicted_valid=True, seed_base=100,
                                     executor=ex, on_block=seen.append)
        assert v == serial
    assert seen[-1].runs == serial.runs and seen[-1].planned == 48 and seen[-1].failures == serial.failures


class _HeldFirstRun(ScriptedPerceptionApp):
    """The first run of the oldest block waits (up to a timeout) until a run of a later block starts."""

    def __init__(self, held: int, waits_for: int):
        super().__init__()
        self.held, self.waits_for, self.started = held, waits_for, threading.Event()
        self.waited = None

    def evaluate_perception(self, nns, seeds, render_threads=1):
        if self.waits_for in seeds:
            self.started.set()
        if self.held in seeds:
            self.waited = self.started.wait(timeout=5)
        else:
            time.sleep(0.05)  # still running when the next blocks are considered
        return super().evaluate_perception(nns, seeds, render_threads)


def test_validation_tops_up_its_workers_while_the_oldest_block_is_still_running():
    # Blocks of 8 on 9 workers: blocks 0 and 1 go out (16 runs > 9 in flight). While run 100 of block 0
    # is held, the rest of both blocks finish; a free worker must take block 2's runs then, not after
    # block 0 has ended (which would leave 8 workers idle behind one slow run).
    spec, app = _validation_spec(), _HeldFirstRun(held=100, waits_for=116)
    torch_threads = _torch_threads()
    with ThreadPoolExecutor(9) as ex:
        v = validate_closed_loop(app, {"a": len, "b": len}, goal_of(spec), acceptance_of(spec), 24, trial=1,
                                 region_predicted_valid=True, seed_base=100, executor=ex)
    _torch_threads(torch_threads)
    assert app.waited is True
    assert v.runs == 24 and v.failures == 0


def _torch_threads(n: int | None = None) -> int | None:
    """torch's intra-op threads (a worker task sets them to 1; in a thread pool that is this process's)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def test_bad_worker_counts_and_unreachable_cluster_fail_fast(monkeypatch):
    with pytest.raises(ExecutorError, match="at least 1"):
        with open_executor(workers=0):
            pass
    monkeypatch.setenv("QAOPT_WORKERS", "many")
    with pytest.raises(ExecutorError, match="QAOPT_WORKERS"):
        with open_executor():
            pass
    monkeypatch.setenv("QAOPT_CLUSTER_TIMEOUT", "2")
    start = time.monotonic()
    with pytest.raises(ExecutorError, match=r"--cluster tcp://127.0.0.1:\d+: cannot reach the Dask scheduler"):
        with open_executor(cluster=f"tcp://127.0.0.1:{_free_port()}"):
            pass
    assert time.monotonic() - start < 15


# --------------------------------------------------------------------------- a real Dask cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and a nanny with two single-threaded workers, as separate processes; yields its address."""
    pytest.importorskip("distributed")
    from distributed import Client

    marker = tmp_path_factory.mktemp("die") / "worker-died"
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
           DIE_MARKER: str(marker), "QAOPT_WORKERS": "1"}
    common = ["--no-dashboard"]
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", str(port), *common], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "2",
                                       "--nthreads", "1", *common], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=90)
        yield address, marker
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def _region(folder: Path) -> dict:
    data = json.loads((folder / "region.json").read_text())
    data["info"].pop("spec", None)
    return data


def test_cluster_calibration_survives_a_killed_worker_and_matches_the_local_runs(cluster, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from qaopt.cli import app

    address, marker = cluster
    spec = tmp_path / "app.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    runner = CliRunner()
    results = {}
    for name, options in {"serial": ["--workers", "1"], "cluster": ["--cluster", address]}.items():
        monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / f"cache-{name}"))  # no run is shared between them
        out = tmp_path / name
        result = runner.invoke(app, ["calibrate", str(spec), "--out", str(out), "--quiet", *options])
        assert result.exit_code == 0, result.output
        results[name] = _region(out)
    assert marker.exists()  # a worker was killed in the middle of a block ...
    assert results["cluster"] == results["serial"]  # ... and the region is the same


def test_cluster_validation_matches_the_local_runs(cluster):
    address, _ = cluster
    spec, app = _validation_spec(), ScriptedPerceptionApp((130,))
    nns = {"a": len, "b": len}
    serial = validate_closed_loop(app, nns, goal_of(spec), acceptance_of(spec), 48, trial=3, region_predicted_valid=True, seed_base=100)
    with open_executor(cluster=address) as ex:
        assert isinstance(ex, ClusterExecutor) and ex.workers == 2
        v = validate_closed_loop(app, nns, goal_of(spec), acceptance_of(spec), 48, trial=3, region_predicted_valid=True, seed_base=100, executor=ex)
    assert v == serial and v.failures == 1


def test_a_worker_lacking_the_application_is_named(cluster, tmp_path, monkeypatch):
    address, _ = cluster
    here = tmp_path / "only_here"
    here.mkdir()
    (here / "localonly_app.py").write_text("from flaky import FlakyApp as App\n")
    monkeypatch.syspath_prepend(str(here))
    (tmp_path / "spec").mkdir()
    path = tmp_path / "spec" / "app.yaml"
    path.write_text(textwrap.dedent(SPEC).replace("flaky:FlakyApp", "localonly_app:App"))
    with pytest.raises(ExecutorError, match=r"worker tcp://.* lacks the module 'localonly_app'"):
        ClusterExecutor(address, spec=load(path))


def test_optimize_command_fails_fast_on_an_unreachable_cluster(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from qaopt.cli import app

    monkeypatch.setenv("QAOPT_CLUSTER_TIMEOUT", "1")
    spec = Path(__file__).resolve().parents[1] / "examples" / "cropfollow.yaml"
    address = f"tcp://127.0.0.1:{_free_port()}"
    result = CliRunner().invoke(app, ["optimize", str(spec), "--out", str(tmp_path), "--cluster", address])
    assert isinstance(result.exception, ExecutorError)  # the `qaopt` runner prints it as one line, exit 2
    assert f"--cluster {address}: cannot reach the Dask scheduler" in str(result.exception)
