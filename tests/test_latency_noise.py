"""Noise detection: a measurement the machine disturbed is measured again, and still disturbed, marked untrusted.

Interference is injected (a probe that reports it, a /proc/stat that shows it), never produced by loading
the machine and timing: no assertion here depends on how fast anything ran.
"""

from __future__ import annotations

import os

import pytest

from qaopt.kernels import CpuLoadProbe, Interference, Protocol, measure_callable, median_interval
from qaopt.kernels.measure import SpeedReference, read_proc_stat

FAST = Protocol(warmup=1, repeats=5, min_sample_ms=0.1, retries=2, retry_wait_s=0.0)


class ScriptedProbe:
    """Reports the interference of each attempt from a script (the last entry repeats)."""

    def __init__(self, *shares: float):
        self.shares = list(shares)
        self.attempts = 0

    def start(self) -> None:
        self.attempts += 1

    def stop(self) -> Interference:
        return Interference(others=self.shares[min(self.attempts, len(self.shares)) - 1], steal=0.0)


def _measure(probe: ScriptedProbe, folder, protocol: Protocol = FAST):
    """Measure with the interference the probe scripts and a machine at its best speed throughout.

    The speed reference is scripted too: the real one times a kernel on this machine, and a busy CI host
    would make it ask for retries these tests do not script.
    """
    return measure_callable(lambda: None, backend="test", device="cpu", device_key="test-noise", threads=1,
                            param_bytes=0, protocol=protocol, probe=probe, reference=ScriptedReference(folder, 1.0))


def test_a_measurement_beside_a_cpu_bound_process_is_retried_then_flagged(tmp_path):
    probe = ScriptedProbe(0.9)  # another process held 90 % of the measured cores in every attempt
    m = _measure(probe, tmp_path)
    assert probe.attempts == 1 + FAST.retries
    assert not m.trusted
    assert "other processes took 90%" in m.untrusted
    assert m.interference == pytest.approx(0.9)


def test_a_retry_on_a_quiet_machine_clears_the_flag(tmp_path):
    probe = ScriptedProbe(0.9, 0.0)
    m = _measure(probe, tmp_path)
    assert probe.attempts == 2
    assert "other processes" not in m.untrusted
    assert m.interference == 0.0


def test_a_quiet_measurement_is_taken_once(tmp_path):
    probe = ScriptedProbe(0.01)
    m = _measure(probe, tmp_path)
    assert probe.attempts == 1 and "other processes" not in m.untrusted
    assert m.ci_ms[0] <= m.median_ms <= m.ci_ms[1] and m.epoch


def test_the_hypervisor_stealing_the_cores_counts_as_interference(tmp_path):
    class Stolen(ScriptedProbe):
        def stop(self) -> Interference:
            return Interference(others=0.0, steal=0.5)

    m = _measure(Stolen(0.0), tmp_path)
    assert not m.trusted and "hypervisor 50%" in m.untrusted


def test_the_cpu_probe_counts_other_processes_time_on_the_measured_cores():
    # Over 1 s, cores 0 and 1 were busy 1.8 s together; this process used 0.2 s of it: others took 1.6 s of 2 s.
    stats = iter([{0: (100.0, 5.0), 1: (100.0, 5.0), 2: (0.0, 0.0)},
                  {0: (101.0, 5.1), 1: (100.8, 5.1), 2: (9.0, 0.0)}])
    own = iter([10.0, 10.2])
    clock = iter([50.0, 51.0])
    probe = CpuLoadProbe((0, 1), read=lambda: next(stats), own=lambda: next(own), clock=lambda: next(clock))
    probe.start()
    seen = probe.stop()
    assert seen.others == pytest.approx(0.8)  # core 2 (not measured) does not count
    assert seen.steal == pytest.approx(0.1)


def test_the_cpu_probe_reads_this_machine():
    times = read_proc_stat()
    assert times and all(busy >= 0 and steal >= 0 for busy, steal in times.values())


def test_the_median_interval_is_the_order_statistics_one():
    assert median_interval(list(range(1, 16))) == (4.0, 12.0)  # 96.5 % coverage with 15 samples
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few samples for 95 %: min and max


def test_pinning_moves_every_thread_of_the_process_and_restores_it():
    import os
    import threading

    from qaopt.kernels import pinned
    from qaopt.kernels.measure import _threads

    release = threading.Event()
    worker = threading.Thread(target=release.wait)  # stands for a runtime's pool thread
    worker.start()
    try:
        before = {tid: os.sched_getaffinity(tid) for tid in _threads()}
        first = min(os.sched_getaffinity(0))
        with pinned((first,)):
            assert all(os.sched_getaffinity(tid) == {first} for tid in before)
        assert {tid: os.sched_getaffinity(tid) for tid in before} == before
    finally:
        release.set()
        worker.join()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to narrow one thread to one")
def test_measurement_cores_are_the_process_cores_when_a_runtime_narrowed_the_calling_thread():
    """A runtime can bind the calling thread to one core natively (TVM's pool did); a 2-thread measurement read its
    cores from that thread and ran on one."""
    from qaopt.kernels.measure import PROCESS_CORES, measurement_cores

    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # what the runtime did
    try:
        assert measurement_cores(2) == PROCESS_CORES[:2]
        assert len(measurement_cores(2)) == 2
        assert measurement_cores(None) == PROCESS_CORES
    finally:
        os.sched_setaffinity(0, cores)


def test_models_side_by_side_are_pinned_to_the_cores_of_all_of_them(monkeypatch):
    import contextlib
    import os

    import numpy as np
    import torch

    from qaopt import kernels
    from qaopt.kernels import measure

    seen = []

    @contextlib.contextmanager
    def record(cores):
        seen.append(tuple(cores))
        yield

    monkeypatch.setattr(measure, "pinned", record)
    x = np.zeros((1, 4), np.float32)
    compiled = [kernels.compile(torch.nn.Linear(4, 2).eval(), [x], kernels.Target(threads=1, backend="torch"))
                for _ in range(2)]
    kernels.measure_concurrent(compiled, kernels.Target(threads=1), FAST)
    assert seen == [tuple(sorted(os.sched_getaffinity(0))[:2])]


class ScriptedReference(SpeedReference):
    """A speed reference whose kernel times come from a script (the last entry repeats)."""

    def __init__(self, folder, *ms: float):
        self.times, self.calls = list(ms), 0
        super().__init__([0], kernel=self._next, folder=folder)

    def _next(self) -> float:
        self.calls += 1
        return self.times[min(self.calls, len(self.times)) - 1]


def test_a_machine_slower_than_its_best_is_flagged_though_no_process_disturbed_it(tmp_path):
    ScriptedReference(tmp_path, 1.0).slowdown()  # an earlier measurement of this boot: the best so far
    reference = ScriptedReference(tmp_path, 1.4)  # before and after each attempt's samples: slow throughout
    m = measure_callable(lambda: None, backend="test", device="cpu", device_key="test-noise", threads=1,
                         param_bytes=0, protocol=FAST, probe=ScriptedProbe(0.0), reference=reference)
    assert reference.calls == 2 * (1 + FAST.retries)  # measured again while the machine stayed slow
    assert m.extra["attempts"] == 1 + FAST.retries
    assert not m.trusted
    assert "reference kernel 40% slower than its best since boot (limit 25%)" in m.untrusted
    assert "other processes" not in m.untrusted
    assert m.extra["slowdown"] == pytest.approx(0.4)


def test_a_machine_back_at_its_best_speed_clears_the_flag_on_a_retry(tmp_path):
    ScriptedReference(tmp_path, 1.0).slowdown()
    reference = ScriptedReference(tmp_path, 1.6, 1.5, 1.05, 1.0)  # slow around the first attempt, fast around the second
    m = measure_callable(lambda: None, backend="test", device="cpu", device_key="test-noise", threads=1,
                         param_bytes=0, protocol=FAST, probe=ScriptedProbe(0.0), reference=reference)
    assert reference.calls == 4 and m.extra["attempts"] == 2
    assert "reference kernel" not in m.untrusted and m.extra["slowdown"] == pytest.approx(0.05)


def test_a_machine_at_its_usual_speed_is_not_flagged(tmp_path):
    ScriptedReference(tmp_path, 1.0).slowdown()
    m = measure_callable(lambda: None, backend="test", device="cpu", device_key="test-noise", threads=1,
                         param_bytes=0, protocol=FAST, probe=ScriptedProbe(0.0),
                         reference=ScriptedReference(tmp_path, 1.1))
    assert "reference kernel" not in m.untrusted and m.extra["slowdown"] == pytest.approx(0.1)


def test_the_best_reference_time_is_kept_across_processes_and_lowered_when_beaten(tmp_path):
    assert ScriptedReference(tmp_path, 2.0).slowdown() == 0.0  # the first figure is the best
    assert ScriptedReference(tmp_path, 3.0).slowdown() == pytest.approx(0.5)
    assert ScriptedReference(tmp_path, 1.0).slowdown() == 0.0  # faster: the new best
    assert ScriptedReference(tmp_path, 2.0).slowdown() == pytest.approx(1.0)
    other = SpeedReference([0, 0], kernel=lambda: 5.0, folder=tmp_path)  # another core count: its own best
    assert other.slowdown() == 0.0


def test_the_slowest_measured_core_sets_the_slowdown(tmp_path):
    """One slowed core slows a parallel NN by as much; the fastest core still lowers the kept best."""
    allowed = sorted(os.sched_getaffinity(0))
    cores = [allowed[0], allowed[-1]]  # two cores where the machine has them (CI may pin the suite to one)
    seen: list[set[int]] = []

    def kernel() -> float:
        seen.append(os.sched_getaffinity(0))
        return 1.0 if len(seen) == 1 else 1.5

    mask = os.sched_getaffinity(0)
    assert SpeedReference(cores, kernel=kernel, folder=tmp_path).slowdown() == pytest.approx(0.5)
    assert seen == [{cores[0]}, {cores[1]}]  # each timed on its own core
    assert os.sched_getaffinity(0) == mask  # and the thread's cores restored


def test_an_unreadable_best_is_replaced_not_fatal(tmp_path):
    reference = ScriptedReference(tmp_path, 2.0)
    reference.path.write_text("{not json")
    assert reference.slowdown() == 0.0
    assert ScriptedReference(tmp_path, 4.0).slowdown() == pytest.approx(1.0)
