"""The measurement protocol: robust statistics, a device lock that holds across processes, targets from the spec."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from qaopt.kernels import KernelsError, MeasurementError, Protocol, RPCConfig, Target, TuningBudget
from qaopt.kernels.measure import energy_meter, measure_callable


def _measure(call, **kw):
    return measure_callable(call, backend="test", device="cpu", device_key=kw.pop("key", "test-cpu"), threads=1,
                            param_bytes=100, protocol=kw.pop("protocol", Protocol(warmup=1, repeats=7, min_sample_ms=5)), **kw)


def test_median_and_spread_of_a_known_workload(monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    m = _measure(lambda: time.sleep(0.002))
    assert 2.0 <= m.median_ms < 20.0  # a 2 ms sleep: never shorter, longer only on a loaded machine
    assert len(m.samples_ms) == 7 and m.number >= 2  # 5 ms samples of 2 ms calls
    assert m.spread_ms < m.median_ms
    assert m.peak_mem_bytes is not None and m.peak_mem_bytes >= 100


def test_peak_memory_sees_the_model_allocating(monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    import numpy as np

    def allocate():
        # 64 MiB touched per call: above glibc's largest mmap threshold (32 MiB), so the pages are
        # mapped fresh on every call and not served from memory an earlier test freed.
        a = np.ones(64 << 20, dtype=np.uint8)
        return a.sum()

    m = _measure(allocate)
    assert m.peak_mem_bytes >= 48 << 20


def test_crash_while_measuring_is_a_measurement_error(monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))

    def crash():
        raise RuntimeError("illegal instruction")

    with pytest.raises(MeasurementError, match="backend 'test'.*illegal instruction"):
        _measure(crash)


def test_device_lock_serializes_measurements_across_processes(monkeypatch, tmp_path):
    monkeypatch.setenv("QAOPT_LOCK_DIR", str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time, sys; from qaopt.kernels.measure import device_lock\n"
        "with device_lock('cpu-x'):\n    print('held', flush=True); time.sleep(1.5)\n")],
        stdout=subprocess.PIPE, text=True, env={**__import__("os").environ, "QAOPT_LOCK_DIR": str(tmp_path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.perf_counter()
        _measure(lambda: None, key="cpu-x", protocol=Protocol(warmup=0, repeats=1, min_sample_ms=0.1, retries=0))
        waited = time.perf_counter() - start
        assert waited > 0.8, "measured while another process held the device"
        start = time.perf_counter()
        _measure(lambda: None, key="cpu-y", protocol=Protocol(warmup=0, repeats=1, min_sample_ms=0.1, retries=0))
        assert time.perf_counter() - start < 0.5, "another device must not wait"
    finally:
        holder.wait(timeout=10)


def test_energy_is_reported_or_explained():
    meter, note = energy_meter("cpu")
    if meter is None:
        assert note.startswith("unavailable: ")
    else:
        before = meter.joules()
        sum(i * i for i in range(200_000))
        assert meter.joules() >= before
    assert energy_meter("rpc")[1].startswith("unavailable")


def test_target_from_spec_section():
    from qaopt.app_spec.schema import TargetSpec

    spec = TargetSpec.model_validate({"device": "rpc", "backend": "tvm", "threads": 4, "mcpu": "cortex-a72",
                                      "tuning": {"trials": 32, "seconds": 120},
                                      "rpc": {"host": "10.0.0.7", "port": 9190, "key": "pi4", "tracker": True}})
    target = Target.from_spec(spec)
    assert target == Target(device="rpc", backend="tvm", threads=4, mcpu="cortex-a72",
                            tuning=TuningBudget(trials=32, seconds=120.0),
                            rpc=RPCConfig(host="10.0.0.7", port=9190, key="pi4", tracker=True))
    assert target.device_key == "rpc-10.0.0.7-9190-pi4"
    # A mapping is read with the spec's own schema and defaults (64 tuning trials).
    assert Target.from_spec({"threads": 2}) == Target(threads=2, tuning=TuningBudget(trials=64))


@pytest.mark.parametrize("bad, field", [
    ({"device": "tpu"}, r"target\.device"),
    ({"device": "rpc"}, r"target: .*'rpc' section"),
    ({"threads": 0}, r"target\.threads"),
    ({"device": "rpc", "rpc": {"host": "h", "tracker": True}}, r"target\.rpc: .*key"),
    ({"backend": "torch[bad variant]"}, r"target\.backend"),
])
def test_bad_target_names_the_field(bad, field):
    with pytest.raises(KernelsError, match=field):
        Target.from_spec(bad)
    with pytest.raises(KernelsError, match=r"target\.device"):
        Target(device="tpu")
