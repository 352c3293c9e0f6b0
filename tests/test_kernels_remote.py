"""Remote devices over TVM RPC, against a real RPC server started on loopback.

The server runs in its own process; killing it mid-measurement is what a board
dropping off the network looks like to the host.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from qaopt import kernels
from qaopt.kernels import MeasurementError, Protocol, RPCConfig, Target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RPCServer:
    def __init__(self, port: int):
        self.port = port
        self.proc: subprocess.Popen | None = None

    def start(self) -> RPCServer:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(self.port),
             "--port-end", str(self.port + 1)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TVM_NUM_THREADS": "1"},
            start_new_session=True)  # its own process group: the server forks a child per session
        from tvm import rpc

        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                rpc.connect("127.0.0.1", self.port, session_timeout=5)  # a real handshake, not just an open port
                return self
            except Exception:
                time.sleep(0.3)
        raise RuntimeError("TVM RPC server did not start")

    def kill(self) -> None:
        """Kill the server and its session processes, as when a board loses power."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None
            deadline = time.time() + 10
            while time.time() < deadline:  # until no process of it still holds the port
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    time.sleep(0.2)
                except OSError:
                    return


@pytest.fixture
def server():
    srv = RPCServer(_free_port()).start()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(8, 2)).eval()
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        return net, x, net(x).numpy()


def _target(port: int, retries: int = 2) -> Target:
    return Target(device="rpc", backend="tvm", threads=1, rpc=RPCConfig(port=port, retries=retries, timeout_s=30))


def test_build_on_host_run_and_time_on_remote(server, model, tmp_path):
    net, x, ref = model
    compiled = kernels.compile(net, [x], _target(server.port), cache_dir=tmp_path)
    np.testing.assert_allclose(compiled.run()[0], ref, rtol=1e-4, atol=1e-5)
    m = compiled.measure(Protocol(warmup=1, repeats=5, min_sample_ms=2))
    assert m.device == f"rpc 127.0.0.1:{server.port}" and len(m.samples_ms) == 5 and m.median_ms > 0
    assert m.energy_note.startswith("unavailable")


def test_disconnect_mid_measurement_is_retried_on_the_restarted_device(server, model, tmp_path):
    net, x, ref = model
    compiled = kernels.compile(net, [x], _target(server.port, retries=5), cache_dir=tmp_path)
    compiled.run()  # session open, library on the device

    def drop_and_come_back():
        time.sleep(0.5)
        server.kill()
        time.sleep(0.3)
        server.start()

    t = threading.Thread(target=drop_and_come_back)
    t.start()
    m = compiled.measure(Protocol(warmup=1, repeats=40, min_sample_ms=50))  # ~2 s: the kill lands inside it
    t.join()
    assert len(m.samples_ms) == 40 and m.median_ms > 0
    assert m.extra["rpc_failures"], "the server was killed mid-measurement: at least one retry must show"
    assert all(f.startswith("timing the model: ") for f in m.extra["rpc_failures"])


def test_device_that_stays_away_fails_cleanly_with_its_reason(server, model, tmp_path):
    net, x, _ = model
    compiled = kernels.compile(net, [x], _target(server.port, retries=2), cache_dir=tmp_path)
    compiled.run()
    killer = threading.Timer(0.5, server.kill)
    killer.start()
    start = time.perf_counter()
    with pytest.raises(MeasurementError) as err:
        compiled.measure(Protocol(warmup=1, repeats=40, min_sample_ms=50))
    killer.join()
    message = str(err.value)
    assert f"127.0.0.1:{server.port}" in message and "failed 3 times (1 try + 2 retries)" in message
    assert "last reason:" in message
    assert time.perf_counter() - start < 60


def test_tuning_on_a_remote_device_without_tracker_is_refused_clearly(model, tmp_path):
    net, x, _ = model
    target = Target(device="rpc", backend="tvm", rpc=RPCConfig(port=_free_port()),
                    tuning=kernels.TuningBudget(trials=8))
    with pytest.raises(kernels.KernelsError, match="target.rpc.tracker"):
        kernels.compile(net, [x], target, cache_dir=tmp_path)
