"""Package attributes imported on first use (PEP 562), so importing a package stays light.

The field logger on a robot imports ``qaopt`` and ``qaopt.app_spec`` without PyYAML,
numpy or torch; reading a spec must not import torch; a simulator that subclasses
``qaopt.calibrate``'s protocols must not pay for scipy. Each package names what it
exports and where it lives; :func:`lazy_exports` gives it the module hooks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a name to the module (relative or absolute) holding it."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        namespace[name] = value  # the next access is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
