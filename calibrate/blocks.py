"""The seed-block engine: seeded runs in blocks, serially or on an executor, consumed in block order.

Calibration (:meth:`qaopt.calibrate.Calibration.evaluate`) and closed-loop validation
(:func:`qaopt.closed_loop.validate_closed_loop`) both run an application over blocks of
seeds and decide after each block whether to go on: a sequential test cannot look at a
block before the ones preceding it without changing its error rates. :func:`run_blocks`
is that loop, once for both:

- **Block order.** Results are yielded strictly in block order, whatever order the
  workers finish in, so the caller's decisions, the runs it counts and its verdict are
  those of one worker. The caller decides after each block by going on iterating or by
  closing the generator (``break`` inside ``with contextlib.closing(...)``).
- **Dispatch ahead.** On an executor, whole blocks go out while fewer than ``width``
  of the dispatched tasks are unfinished, topped up whenever any task ends (not only
  when the oldest block is complete), so no worker idles behind one slow run. A block
  may be split into tasks of ``chunk`` seeds (closed-loop validation sends single runs,
  so that blocks of 8 keep 16 workers busy); the split never depends on the workers.
- **Closing.** Tasks not yet started are cancelled. A block whose tasks all started
  still enters the cache when it finishes: runs already paid for are never lost.
- **Caching.** A block found in the cache is not run; a block that ran is cached once
  its result is accepted, whether it was consumed or finished after the decision.
- **Failures.** A block whose runs are unusable raises from the caller's ``finish``
  (calibration and validation raise :class:`~qaopt.calibrate.app_calls.ApplicationFault`)
  when it is consumed, and is not cached; an exception of a task itself (an executor or a
  worker that cannot run the application) propagates as it is.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")
"""What one task returns (the runs of some of a block's seeds)."""
R = TypeVar("R")
"""What a block yields and the cache stores."""


class BlockCache(Protocol[R]):
    """Where finished blocks are kept, keyed by the caller's context and a block's seeds."""

    def get(self, seeds: Sequence[int]) -> R | None:
        """The block's stored result, ``None`` when it must run (absent, torn or stale)."""

    def put(self, seeds: Sequence[int], result: R) -> None:
        """Store a block's accepted result."""


class Given(Generic[T]):
    """An object itself, as the picklable zero-argument factory a worker calls to get it (shipped with each task)."""

    def __init__(self, value: T):
        self.value = value

    def __call__(self) -> T:
        return self.value


def workers_of(executor: Executor | None, workers: int | None = None) -> int:
    """How many tasks to keep in flight: ``workers`` when given, else the executor's own count; 1 without one.

    The count is the executor's ``workers`` attribute (:class:`qaopt.executor.LocalPool`, a
    Dask cluster's threads) or a stdlib pool's ``_max_workers``.
    """
    if executor is None:
        return 1
    return max(1, int(workers or getattr(executor, "workers", None) or getattr(executor, "_max_workers", None) or 1))


def run_blocks(
    blocks: Sequence[Sequence[int]],
    run: Callable[[list[int]], T],
    finish: Callable[[list[int], list[T]], R],
    *,
    executor: Executor | None = None,
    remote: Callable[[list[int]], T] | None = None,
    width: int = 1,
    chunk: int | None = None,
    cache: BlockCache[R] | None = None,
) -> Iterator[R]:
    """Each block's result, in block order; close the generator to stop (the caller's sequential decision).

    ``blocks`` are the seeds of each block. A block runs as tasks of ``chunk`` seeds each
    (``None``: one task per block): ``run(seeds)`` in this process, or, with an ``executor``
    and ``width`` above 1, ``remote(seeds)`` (picklable; default ``run``) on a worker, up to
    ``width`` tasks in flight. ``finish(seeds, task_results)`` turns a block's task results,
    in seed order, into its result, or raises (the block is then not cached). ``cache`` stores results.
    """
    seeds = [list(b) for b in blocks]
    if not all(seeds):
        raise ValueError("run_blocks: every block needs at least one seed")
    if executor is None or width <= 1:
        yield from _serial(seeds, run, finish, chunk, cache)
        return
    yield from _dispatched(seeds, remote if remote is not None else run, finish, executor, width, chunk, cache)


def _tasks(seeds: list[int], chunk: int | None) -> list[list[int]]:
    """A block's seeds cut into tasks of ``chunk`` seeds (the last may be shorter)."""
    step = chunk or len(seeds)
    return [seeds[i:i + step] for i in range(0, len(seeds), step)]


def _serial(blocks: list[list[int]], run: Callable[[list[int]], T], finish: Callable[[list[int], list[T]], R],
            chunk: int | None, cache: BlockCache[R] | None) -> Iterator[R]:
    for seeds in blocks:
        result = cache.get(seeds) if cache is not None else None
        if result is None:
            result = finish(seeds, [run(task) for task in _tasks(seeds, chunk)])
            if cache is not None:
                cache.put(seeds, result)
        yield result


class _Pending(Generic[T, R]):
    """A dispatched block. It settles once, as soon as its last task ends (in the thread that ends it):
    ``finish`` and the cache then run whether or not the caller still wants the block, so a block that
    finishes past the decision is cached and a killed caller loses only the runs still in flight."""

    def __init__(self, seeds: list[int], futures: list[Future], finish: Callable[[list[int], list[T]], R],
                 cache: BlockCache[R] | None, cached: R | None = None):
        self.seeds, self.futures, self._finish, self._cache = seeds, futures, finish, cache
        self._settled = threading.Event()
        self._result: R | None = cached
        self._error: BaseException | None = None
        self._left = len(futures)
        self._lock = threading.Lock()
        if cached is not None:
            self._settled.set()
        for f in futures:
            f.add_done_callback(self._one_done)

    def unfinished(self) -> list[Future]:
        return [f for f in self.futures if not f.done()]

    def _one_done(self, _: Future) -> None:
        with self._lock:
            self._left -= 1
            if self._left:
                return
        try:  # a cancelled task, a task's exception or finish's: no result, nothing cached
            self._result = self._finish(self.seeds, [f.result() for f in self.futures])
            if self._cache is not None:
                self._cache.put(self.seeds, self._result)
        except BaseException as e:  # noqa: BLE001 - kept for the caller, who sees it when it reaches this block
            self._error = e
        finally:
            self._settled.set()

    def result(self) -> R | None:
        """The block's result once it has settled; its failure (a task's exception, finish's) is raised."""
        self._settled.wait()
        if self._error is not None:
            raise self._error
        return self._result


def _dispatched(blocks: list[list[int]], remote: Callable[[list[int]], T], finish: Callable[[list[int], list[T]], R],
                executor: Executor, width: int, chunk: int | None, cache: BlockCache[R] | None) -> Iterator[R]:
    window: deque[_Pending[T, R]] = deque()
    submitted = 0

    def busy() -> list[Future]:
        return [f for pending in window for f in pending.unfinished()]

    def dispatch(seeds: list[int]) -> _Pending[T, R]:
        cached = cache.get(seeds) if cache is not None else None
        if cached is not None:
            return _Pending(seeds, [], finish, cache, cached)
        return _Pending(seeds, [executor.submit(remote, task) for task in _tasks(seeds, chunk)], finish, cache)

    try:
        while submitted < len(blocks) or window:
            while True:
                while submitted < len(blocks) and len(busy()) < width:
                    window.append(dispatch(blocks[submitted]))
                    submitted += 1
                if not window[0].unfinished():
                    break
                wait(busy(), return_when=FIRST_COMPLETED)
            yield window.popleft().result()
    finally:
        for pending in window:  # blocks not started are dropped; running ones settle (and are cached) when done
            for f in pending.futures:
                f.cancel()
