"""Applications with one fault each, switched on by ``$QAOPT_TEST_FAULT`` (tests/test_faults.py).

:class:`FaultyApp` is the synthetic superellipse application; where ``$QAOPT_TEST_FAULT`` is
``raise`` its third ``evaluate`` call in a process raises (a bug in the controller), where it
is ``hang`` that call sleeps for an hour (a deadlocked simulator); where it is ``slow`` the
first call of all (the one that creates the file ``$QAOPT_TEST_STARTED`` names) takes ten
seconds: a run to press Ctrl-C in, while the other workers finish theirs and wait idle. Without the variable it is the plain application, the same bug "fixed". Pool workers
inherit the variables.
:class:`OldStyleTiny` is the tiny application as the previous release documented the
protocol: ``evaluate_perception(nns, seeds)``, without ``render_threads``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

from qaopt.calibrate.synthetic import SuperellipseApp
from tinyapp import TinyEvaluator

FAULT = "QAOPT_TEST_FAULT"
STARTED = "QAOPT_TEST_STARTED"
FAULTY_CALL = 3


class FaultyApp(SuperellipseApp):
    def evaluate(self, injectors, seeds: Sequence[int]) -> list[dict[str, float]]:
        records = super().evaluate(injectors, seeds)
        if self.calls == FAULTY_CALL and os.environ.get(FAULT) == "raise":
            raise ZeroDivisionError("float division by zero in the controller")
        if self.calls == FAULTY_CALL and os.environ.get(FAULT) == "hang":
            time.sleep(3600)
        if os.environ.get(FAULT) == "slow" and _first(os.environ[STARTED]):
            time.sleep(10)
        return records


def _first(marker: str) -> bool:
    """Whether this call created ``marker`` (it is the first call of all, in any process)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class OldStyleTiny(TinyEvaluator):
    def evaluate_perception(self, nns: Mapping, seeds: Sequence[int]) -> list[dict[str, float]]:
        return super().evaluate_perception(nns, seeds)
