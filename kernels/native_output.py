"""What native libraries print while qaopt works, sent to a logger instead of the user's console.

TVM's C++ runtime writes its own warnings straight to file descriptor 2 (saving a VM
executable prints one ``executable.cc:276: Warning: Scope Saving:`` line per function,
34 lines for one exported NN), where Python's ``warnings`` and ``logging`` never see them.
:func:`native_stderr_logged` points descriptor 2 at a temporary file for the length of one
such call and hands each line to the :data:`NATIVE_LOGGER` logger at WARNING: a qaopt run
writes it to its run folder's log (:mod:`qaopt.run_log`); a caller of this package that
configured no logging still sees the lines on stderr, through logging's last resort.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator

NATIVE_LOGGER = "qaopt.native"


@contextlib.contextmanager
def native_stderr_logged(what: str) -> Iterator[None]:
    """Lines native code writes to stderr inside the block go to :data:`NATIVE_LOGGER`, prefixed with ``what``."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 (an embedded interpreter): nothing to redirect
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            log = logging.getLogger(NATIVE_LOGGER)
            for line in captured.read().decode(errors="replace").splitlines():
                if line.strip():
                    log.warning("%s: %s", what, line.rstrip())
