"""Which backends run a dtype: declared by qaopt.kernels' backends, asked by qaopt.approx's quantization pass.

The two components never import each other, so the question cannot be asked
directly: ``qaopt``, which composes them, installs the answer here when it is
imported (:func:`provide`: the backends' own ``dtypes`` declarations,
:func:`qaopt.kernels.backends_running`), and the quantization pass asks
:func:`backends_running`. The slot sits in app_spec, below both, so that installing
it costs ``import qaopt`` nothing: the robot's light install imports neither
component, and every use of ``qaopt.approx`` comes after ``qaopt`` itself is imported.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import QaoptError

BackendsRunning = Callable[[str], tuple[str, ...]]
"""``dtype -> the backends (plain names, as in target.backend) with kernels for it``."""

_provider: BackendsRunning | None = None


def provide(provider: BackendsRunning) -> None:
    """Install where the answer comes from (``qaopt`` does, on import)."""
    global _provider
    _provider = provider


def backends_running(dtype: str) -> tuple[str, ...]:
    """The backends that declare kernels for ``dtype``."""
    if _provider is None:
        raise QaoptError("which backends run a dtype is declared by qaopt.kernels' backends, and nothing "
                         "provides it: import qaopt (its import installs qaopt.kernels.backends_running)")
    return _provider(dtype)
