"""``module:attr`` references: how a spec names user code (models, data, simulators).

A robotics team plugs its own NN, dataset or simulator into qaopt by naming it in
the spec; nothing is imported until it is needed, and a reference that does not
import says which part failed (the module or the attribute) and why.
"""

from __future__ import annotations

import importlib
import re
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


def load_entry_point(ref: str) -> Any:
    """Import ``package.module:attr`` (attr may be dotted) and return the object."""
    check_syntax(ref)
    module_name, attr_path = ref.split(":", 1)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise EntryPointError(
            f"entry point {ref!r}: module {module_name!r} does not import ({exc}); "
            "check the module name and that its package is installed"
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise EntryPointError(
                f"entry point {ref!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    return obj
