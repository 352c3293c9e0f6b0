"""``module:attr`` references: how a spec names user code (models, data, simulators).

A robotics team plugs its own NN, dataset or simulator into qaopt by naming it in
the spec; nothing is imported until it is needed, and a reference that does not
import says which part failed (the module or the attribute) and why. Loading a spec
puts its folder on the import path (:func:`add_import_path`), so a module beside
the spec imports without ``PYTHONPATH``, as a script's own folder does for it.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import QaoptError

_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class EntryPointError(QaoptError):
    """A ``module:attr`` reference that is malformed or does not import."""


def check_syntax(ref: str) -> str:
    """Return ``ref`` unchanged if it reads ``package.module:attr``; raise ``ValueError`` otherwise."""
    if not _REF.match(ref):
        raise ValueError(f"expected an entry point 'package.module:attribute', got {ref!r}")
    return ref


def add_import_path(folder: str | Path) -> None:
    """Put ``folder`` (a spec's) first on the import path, once, as Python does for a script's folder."""
    folder = str(Path(folder).resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
        importlib.invalidate_caches()


def import_module(name: str, what: str) -> ModuleType:
    """Import module ``name``; ``what`` (``entry point 'm:f'``, ``plugin 'm'``) starts the error's message."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise EntryPointError(
            f"{what}: module {name!r} does not import ({exc}); check the module name, that it sits beside "
            "the spec or its package is installed"
        ) from exc
    except Exception as exc:  # its own code failed: a syntax error, an exception at import
        raise EntryPointError(f"{what}: importing module {name!r} raised {type(exc).__name__}: {exc}") from exc


def load_entry_point(ref: str) -> Any:
    """Import ``package.module:attr`` (attr may be dotted) and return the object."""
    check_syntax(ref)
    module_name, attr_path = ref.split(":", 1)
    obj: Any = import_module(module_name, f"entry point {ref!r}")
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise EntryPointError(
                f"entry point {ref!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    return obj
