"""The seed-block engine (:mod:`qaopt.calibrate.blocks`): block order, decisions, closing, caching, failures."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

import pytest

from qaopt.calibrate.blocks import run_blocks, workers_of

BLOCKS = [list(range(10 * b, 10 * b + 4)) for b in range(8)]
"""Runs' results are their seeds' squares; the cumulative sums after each block are 14, 548, 2402, 6376, ..."""
STOP_ABOVE = 2000
"""The sequential decision below stops once the sum exceeds this: after the third block."""
FAILING_SEED = 13
"""A seed of the second block whose block some tests make fail."""


class Log:
    """Tasks run (their seeds) and a scrambled finish order: block order must not depend on it."""

    def __init__(self, sleep: float = 0.01):
        self.sleep, self.ran, self.lock = sleep, [], threading.Lock()

    def __call__(self, seeds: list[int]) -> list[int]:
        time.sleep(random.random() * self.sleep)
        with self.lock:
            self.ran.append(list(seeds))
        return [s * s for s in seeds]


def squares(seeds: list[int]) -> list[int]:
    return [s * s for s in seeds]


def joined(_seeds: list[int], tasks: list[list[int]]) -> list[int]:
    return [x for task in tasks for x in task]


class DictCache:
    def __init__(self, content: dict[tuple[int, ...], list[int]] | None = None):
        self.content = dict(content or {})

    def get(self, seeds: Sequence[int]) -> list[int] | None:
        return self.content.get(tuple(seeds))

    def put(self, seeds: Sequence[int], result: list[int]) -> None:
        self.content[tuple(seeds)] = result


def decide(blocks) -> list[list[int]]:
    """A sequential decision: stop after the block that takes the sum above :data:`STOP_ABOVE` (closing the blocks)."""
    seen, total = [], 0
    with closing(blocks):
        for block in blocks:
            seen.append(block)
            total += sum(block)
            if total > STOP_ABOVE:
                break
    return seen


@pytest.mark.parametrize("chunk", [None, 1, 3])
def test_any_number_of_workers_gives_the_serial_blocks_and_decision(chunk):
    serial = decide(run_blocks(BLOCKS, Log(), joined, chunk=chunk))
    assert serial == [squares(b) for b in BLOCKS[:3]]
    for workers in (1, 2, 4):
        with ThreadPoolExecutor(workers) as ex:
            log = Log()
            got = decide(run_blocks(BLOCKS, log, joined, executor=ex, width=workers_of(ex), chunk=chunk))
        assert got == serial
        split = {tuple(b[i:i + (chunk or len(b))]) for b in BLOCKS for i in range(0, len(b), chunk or len(b))}
        assert {tuple(task) for task in log.ran} <= split  # the caller's split, not the workers'


def test_serial_runs_only_the_blocks_it_consumes():
    log = Log(sleep=0)
    decide(run_blocks(BLOCKS, log, joined))
    assert log.ran == BLOCKS[:3]


def test_closing_cancels_blocks_not_started_and_caches_those_that_finish_late():
    release, started = threading.Event(), threading.Semaphore(0)

    def held(seeds: list[int]) -> list[int]:
        if seeds != BLOCKS[0]:
            started.release()
            assert release.wait(10)
        return squares(seeds)

    cache = DictCache()
    with ThreadPoolExecutor(2) as ex:
        blocks = run_blocks(BLOCKS, held, joined, executor=ex, width=4, cache=cache)
        assert next(blocks) == squares(BLOCKS[0])  # blocks 1-4 dispatched: 1 and 2 run on the two workers, 3 and 4 wait
        assert started.acquire(timeout=10) and started.acquire(timeout=10)
        blocks.close()
        release.set()
    assert cache.content == {tuple(b): squares(b) for b in BLOCKS[:3]}  # 1 and 2 finished past the decision: cached
    assert not started.acquire(timeout=0)  # 3 and 4 never started


@pytest.mark.parametrize("workers", [1, 3])
def test_a_cached_block_is_not_run_again(workers):
    cache = DictCache({tuple(BLOCKS[1]): [-1]})
    with ThreadPoolExecutor(workers) as ex:
        log = Log()
        got = list(run_blocks(BLOCKS[:4], log, joined, executor=ex, width=workers, cache=cache))
    assert got == [squares(BLOCKS[0]), [-1], squares(BLOCKS[2]), squares(BLOCKS[3])]
    assert sorted(log.ran) == [BLOCKS[0], BLOCKS[2], BLOCKS[3]]
    assert cache.content[tuple(BLOCKS[1])] == [-1] and cache.content[tuple(BLOCKS[3])] == squares(BLOCKS[3])


class BlockFailed(Exception):
    """What a caller's ``finish`` raises for a block whose runs it cannot use."""


def refused(seeds: list[int], tasks: list[list[int]]) -> list[int]:
    if FAILING_SEED in seeds:
        raise BlockFailed(f"seed {FAILING_SEED} is unusable")
    return joined(seeds, tasks)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_a_failed_block_raises_in_order_and_is_not_cached(workers):
    cache, seen = DictCache(), []
    with ThreadPoolExecutor(workers) as ex:
        with pytest.raises(BlockFailed, match="seed 13"):
            for block in run_blocks(BLOCKS, Log(), refused, executor=ex, width=workers, cache=cache):
                seen.append(block)
    assert seen == [squares(BLOCKS[0])]  # block 0 consumed, block 1 failed, nothing after it
    assert tuple(BLOCKS[1]) not in cache.content and tuple(BLOCKS[0]) in cache.content


@pytest.mark.parametrize("workers", [1, 3])
def test_a_task_that_raises_propagates_as_it_is(workers):
    def broken(seeds: list[int]) -> list[int]:
        if FAILING_SEED in seeds:
            raise RuntimeError("the worker cannot build the application")
        return squares(seeds)

    with ThreadPoolExecutor(workers) as ex:
        blocks = run_blocks(BLOCKS, broken, joined, executor=ex, width=workers)
        assert next(blocks) == squares(BLOCKS[0])
        with pytest.raises(RuntimeError, match="cannot build"):
            next(blocks)


def test_remote_runs_on_the_executor_and_run_in_this_process():
    here, there = Log(sleep=0), Log(sleep=0)
    with ThreadPoolExecutor(2) as ex:
        got = list(run_blocks(BLOCKS[:3], here, joined, executor=ex, remote=there, width=2))
    assert got == [squares(b) for b in BLOCKS[:3]]
    assert here.ran == [] and sorted(there.ran) == BLOCKS[:3]
    assert list(run_blocks(BLOCKS[:3], here, joined, executor=ex, remote=there, width=1)) == got
    assert here.ran == BLOCKS[:3]  # one worker: everything in this process, as without an executor


def test_empty_blocks_and_workers_of():
    with pytest.raises(ValueError, match="at least one seed"):
        next(run_blocks([[1], []], Log(), joined))
    assert workers_of(None, 8) == 1
    with ThreadPoolExecutor(3) as ex:
        assert workers_of(ex) == 3 and workers_of(ex, 5) == 5
