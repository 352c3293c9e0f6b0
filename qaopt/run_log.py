"""The run's log file: what libraries say while qaopt runs, kept in the run folder instead of the user's console.

A user's console carries qaopt's own lines only: progress, ``warning:`` lines for faults qaopt
recovered from, ``error:`` lines. Third-party warnings (a Python ``warnings.warn`` of torch,
Optuna or ONNX Runtime; TVM's native lines, :mod:`qaopt.kernels.native_output`) say nothing a
user of qaopt can act on, yet they are what someone debugging a run wants, so
:func:`library_output_logged` appends them to ``run.log`` in the run folder, each with its
time and source, for as long as a command runs. Pool workers started meanwhile find the file
in :data:`RUN_LOG_ENV` and append theirs to it (:func:`log_worker_output`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

from qaopt.kernels.native_output import NATIVE_LOGGER

LIBRARY_LINE = re.compile(r"Warning\b|warnings\.warn|\[W:onnxruntime|/project/src/|^\s*warn\(|Traceback")
"""What a library's line on a console looks like, as opposed to qaopt's: Python's ``UserWarning: ...``
(``FutureWarning``, ``ExperimentalWarning``) and its ``warnings.warn(`` source line, ONNX Runtime's
``[W:onnxruntime:...]``, TVM's ``/project/src/...: Warning:``, a traceback. qaopt's own recovered faults print
``warning: ...`` in lower case. The tests and ``benchmarks/console_lines.py`` hold a run's console to it."""
RUN_LOG = "run.log"
RUN_LOG_ENV = "QAOPT_RUN_LOG"
"""The log file of the command that started this process (set for its pool workers, which inherit it)."""
_LOGGERS = ("py.warnings", NATIVE_LOGGER)


class _RunLogHandler(logging.FileHandler):
    """Appends to the run log, opened (and its folder made) at the first line: a run that warns of nothing has none."""

    def _open(self):  # type: ignore[override]
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def _handler(path: Path) -> logging.Handler:
    handler = _RunLogHandler(path, mode="a", encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter(f"%(asctime)s pid {os.getpid()} %(name)s: %(message)s"))
    return handler


@contextlib.contextmanager
def library_output_logged(run_dir: str | Path) -> Iterator[Path]:
    """Library warnings of this process and of the pool workers it starts go to ``run_dir/run.log`` inside the block."""
    path = Path(run_dir) / RUN_LOG
    handler = _handler(path)
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    kept = [(lg.handlers[:], lg.propagate) for lg in loggers]
    previous_env = os.environ.get(RUN_LOG_ENV)
    os.environ[RUN_LOG_ENV] = str(path.resolve())
    _route_to(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # each distinct warning once per place, not hidden by an earlier filter
            yield path
    finally:
        logging.captureWarnings(False)
        for lg, (handlers, propagate) in zip(loggers, kept):
            lg.handlers, lg.propagate = handlers, propagate
        handler.close()
        if previous_env is None:
            os.environ.pop(RUN_LOG_ENV, None)
        else:
            os.environ[RUN_LOG_ENV] = previous_env


def log_worker_output() -> None:
    """In a pool worker of a command with a run log: its library warnings go to that file too (for its lifetime)."""
    path = os.environ.get(RUN_LOG_ENV)
    if not path:
        return
    _route_to(_handler(Path(path)))


def _route_to(handler: logging.Handler) -> None:
    """Python's warnings and the native lines go to ``handler`` alone (nothing reaches logging's last resort)."""
    for name in _LOGGERS:
        lg = logging.getLogger(name)
        lg.handlers, lg.propagate = [handler], False
    logging.captureWarnings(True)
