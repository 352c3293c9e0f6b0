"""The side-by-side stage: each configuration is compared on the schedule that runs it fastest in that epoch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from qaopt import kernels
from qaopt.kernels import Target
from qaopt.result import Configuration, Latency, NNChoice
from qaopt.stages import comparison

# Each model's median alone on all the target's cores, and each pair's frame in parallel (a core each). The agnostic
# pair is the real result's case: parallel when its search combined it, slower in parallel here.
ALONE_MS = {"ref.a": 20.0, "ref.b": 22.0, "agn.a": 3.8, "agn.b": 3.9, "merged": 2.5}
PARALLEL_MS = {("agn.a", "agn.b"): 11.5, ("ref.a", "ref.b"): 48.0}


def _config(schedule: str, candidates: dict[str, str], ms: float) -> Configuration:
    latency = Latency(ci_ms=(ms, ms), samples_ms=[[ms]], trusted=True, untrusted="", epoch="search")
    nns = {n: NNChoice(knobs={}, candidate=c, error=0.1, metric="l1", backend="openvino", latency_ms=ms / 2,
                       memory_bytes=None, macs=1, params=1, latency=latency) for n, c in candidates.items()}
    return Configuration(nns=nns, schedule=schedule, latency_ms=ms, memory_bytes=None, errors={}, in_region=True,
                         latency=latency)


@pytest.fixture
def timed(monkeypatch):
    """The frames :func:`comparison.side_by_side` asked for, by label, timed from the tables above."""
    asked: dict[str, tuple[tuple[str, ...], str]] = {}

    def compare_frames_fresh(frames, target, **_):
        out = {}
        for label, (models, schedule) in frames.items():
            names = tuple(sorted(m.workload for m in models.values()))
            asked[label] = (names, schedule)
            ms = PARALLEL_MS[names] if schedule == "parallel" else sum(ALONE_MS[n] for n in names)
            out[label] = kernels.Measurement(backend="openvino", device="cpu", median_ms=ms, spread_ms=0.0,
                                             samples_ms=(ms,), number=1, threads=2, peak_mem_bytes=None,
                                             energy_mj=None, energy_note="", epoch="side by side")
        return out

    monkeypatch.setattr(kernels, "compare_frames_fresh", compare_frames_fresh)
    monkeypatch.setattr(comparison, "workload_of", lambda candidate: candidate.key)
    return asked


def _context(threads: int) -> SimpleNamespace:
    plan = SimpleNamespace(target=Target(threads=threads), application=SimpleNamespace(plugins=()))
    return SimpleNamespace(plan=plan, cache_dir=None, candidates=lambda config: {
        n: SimpleNamespace(key=c.candidate) for n, c in config.nns.items()})


def test_each_side_runs_on_its_fastest_schedule_now_whichever_its_search_chose(timed):
    configurations = {"reference": _config("sequential", {"a": "ref.a", "b": "ref.b"}, 45.0),
                      "aware": _config("sequential", {"a": "merged", "b": "merged"}, 1.3),
                      "agnostic": _config("parallel", {"a": "agn.a", "b": "agn.b"}, 7.0),
                      "none": None}
    notes: list[str] = []
    out = comparison.side_by_side(_context(threads=2), configurations, note=notes.append)

    assert out["none"] is None
    # The agnostic pair ran faster in sequence here (7.7 ms) than in parallel (11.5 ms), as the search had it.
    agnostic = out["agnostic"]
    assert (agnostic.schedule, agnostic.latency_ms) == ("sequential", pytest.approx(7.7))
    assert {n: c.latency_ms for n, c in agnostic.nns.items()} == {"a": 3.8, "b": 3.9}
    assert {c.latency.epoch for c in agnostic.nns.values()} == {agnostic.latency.epoch} == {"side by side"}
    assert agnostic.schedules_ms == {"sequential": pytest.approx(7.7), "parallel": 11.5}
    assert notes == ["agnostic: sequential here, not parallel as when it was searched (sequential 7.7 ms, parallel "
                     "11.5 ms): each side is compared on the schedule that runs it fastest now"]
    # The reference's pair was timed in parallel too, and kept its sequence; the merged NN is one model, one schedule.
    assert (out["reference"].schedule, out["reference"].latency_ms) == ("sequential", 42.0)
    assert (out["aware"].schedule, out["aware"].latency_ms) == ("sequential", 2.5)
    assert out["aware"].schedules_ms == {}
    assert sorted(schedule for names, schedule in timed.values() if names == ("merged",)) == ["sequential"]
    assert sorted(s for names, s in timed.values() if names == ("agn.a", "agn.b")) == ["parallel", "sequential"]


def test_a_target_with_fewer_threads_than_models_times_one_schedule(timed):
    configurations = {"agnostic": _config("sequential", {"a": "agn.a", "b": "agn.b"}, 7.0)}
    out = comparison.side_by_side(_context(threads=1), configurations)
    assert out["agnostic"].schedule == "sequential"
    assert all(schedule == "sequential" for _, schedule in timed.values())
