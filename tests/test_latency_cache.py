"""One measurement per configuration: a configuration the run already measured is answered from the cache."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from qaopt import search
from qaopt.measuring import MeasuredConfiguration
from qaopt.result import Latency


def _latency(ms: float) -> Latency:
    return Latency(ci_ms=(ms, ms), samples_ms=[[ms]], trusted=True, epoch="test")


@pytest.fixture
def ctx(monkeypatch):
    """A search context whose measurements are counted instead of timed."""
    calls = {"full": 0, "quick": 0}

    def full(candidates, schedule, target, cache_dir, incumbent_ms=None):
        calls["full"] += 1
        return MeasuredConfiguration({}, 1.0 + calls["full"], 100, _latency(1.0 + calls["full"]))

    def quick(candidates, target, cache_dir):
        calls["quick"] += 1
        return 10.0 + calls["quick"], 200

    monkeypatch.setattr(search, "measure_configuration", full)
    monkeypatch.setattr(search, "quick_latency", quick)
    plan = SimpleNamespace(target=None, search_target=None, cache_dir=None)
    context = search.SearchContext(plan, {}, None)
    return context, calls


def _config(*keys: str) -> dict:
    return {f"nn{i}": SimpleNamespace(key=k) for i, k in enumerate(keys)}


def test_a_repeated_configuration_is_measured_once(ctx):
    context, calls = ctx
    first = context.measure(_config("a", "b"), "sequential")
    again = context.measure(_config("a", "b"), "sequential", incumbent_ms=5.0)
    assert calls["full"] == 1
    assert again is first  # the same figure, not a second, different one


def test_another_schedule_or_candidate_is_another_configuration(ctx):
    context, calls = ctx
    context.measure(_config("a", "b"), "sequential")
    context.measure(_config("a", "b"), "parallel")
    context.measure(_config("a", "c"), "sequential")
    assert calls["full"] == 3


def test_quick_figures_are_cached_too(ctx):
    context, calls = ctx
    assert context.quick(_config("x", "y")) == context.quick(_config("x", "y")) == (11.0, 200)
    assert calls["quick"] == 1


def test_a_configuration_measured_in_full_answers_the_quick_question_with_that_figure(ctx):
    context, calls = ctx
    frame = context.measure(_config("a", "b"), "sequential")
    assert context.quick(_config("a", "b")) == (frame.latency_ms, frame.memory_bytes)
    assert calls["quick"] == 0
