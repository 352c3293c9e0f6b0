"""Applications for the scale-out tests (tests/test_scale_out.py), importable by pool and Dask workers.

:class:`FlakyApp` is the synthetic superellipse application, except that a worker
process started with ``$QAOPT_TEST_DIE_MARKER`` dies (``os._exit``) in the middle of
the first block it runs, once per marker file: the lost worker whose task must be
run again. In a process without the variable (the test itself) it never dies.
:class:`ScriptedPerceptionApp` fails exactly the listed closed-loop seeds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from qaopt.calibrate.synthetic import SuperellipseApp

DIE_MARKER = "QAOPT_TEST_DIE_MARKER"


def die_once() -> None:
    """End this process abruptly, once per marker file (only where ``$QAOPT_TEST_DIE_MARKER`` is set)."""
    marker = os.environ.get(DIE_MARKER)
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os._exit(1)


class FlakyApp(SuperellipseApp):
    def evaluate(self, injectors, seeds: Sequence[int]) -> list[dict[str, float]]:
        records = super().evaluate(injectors, seeds)
        die_once()
        return records


class ScriptedPerceptionApp:
    """Closed-loop runs fail exactly at ``failing`` seeds; the NNs are called once per run on a dummy frame."""

    nn_names = ("a", "b")

    def __init__(self, failing: Sequence[int] = ()):
        self.failing = set(failing)

    def evaluate(self, injectors, seeds):
        return [{"errors": 0.0} for _ in seeds]

    def evaluate_perception(self, nns: Mapping, seeds: Sequence[int], render_threads: int = 1):
        die_once()
        for nn in nns.values():
            nn([[0.0]])
        return [{"errors": float(s in self.failing)} for s in seeds]


def killed_once(marker: str, value: int) -> int:
    """``value``, after killing the process that first runs it (a lost worker), whatever its environment."""
    if not Path(marker).exists():
        Path(marker).touch()
        os._exit(1)
    return value
