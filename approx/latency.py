"""Timing a candidate on this machine in the runtime its dtype runs in (reported beside MACs, never replaced by them).

The protocol follows ../shared/STACK.md: batch 1, a fixed thread count, warm-up
runs first, then the median of many runs; torch under ``inference_mode`` (without
it the same net ran 4x slower here).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from .candidate import Candidate
from .quantize import ort_session


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def samples_ms(run: Callable[[], object], warmup: int = 10, repeat: int = 50) -> list[float]:
    """Milliseconds of ``repeat`` calls of ``run`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(1e3 * (time.perf_counter() - start))
    return times


def median_ms(run: Callable[[], object], warmup: int = 10, repeat: int = 50) -> float:
    return statistics.median(samples_ms(run, warmup, repeat))


def interleaved_ms(runs: dict[str, Callable[[], object]], repeat: int = 50, rounds: int = 5) -> dict[str, float]:
    """Median ms of each of several runnables, timed in interleaved rounds.

    On a machine shared with other jobs the load changes from minute to minute;
    interleaving makes every runnable see the same mix, so their ratios hold even
    when absolute times drift. A runnable slower than 100 ms gets 3 runs a round.
    """
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            slow = bool(samples[name]) and statistics.median(samples[name]) > 100
            samples[name] += samples_ms(run, warmup=2, repeat=3 if slow else max(3, repeat // rounds))
    return {name: statistics.median(v) for name, v in samples.items()}


def latency_ms(candidate: Candidate, input_shape: tuple[int, ...], threads: int = 2, warmup: int = 10, repeat: int = 50) -> tuple[str, float]:
    """``(runtime, median milliseconds)`` of one inference: ONNX Runtime for int8, torch eager otherwise."""
    x = np.random.default_rng(0).standard_normal(input_shape, dtype=np.float32)
    if candidate.onnx_path is not None:
        session = ort_session(candidate.onnx_path, threads)
        return "onnxruntime", median_ms(lambda: session.run(None, {"input": x}), warmup, repeat)
    module = candidate.module
    xt = torch.from_numpy(x).to(next(module.parameters()).dtype)
    with torch_threads(threads), torch.inference_mode():
        return "torch", median_ms(lambda: module(xt), warmup, repeat)
