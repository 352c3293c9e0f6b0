"""One shape for calibration's open registries: error models, region strategies and certifiers.

Each is a :class:`Registry`: a name a spec can write (``calibration.error_model``,
``calibration.strategy``, ``calibration.certifier``) mapped to what builds the thing
it names. The built-ins register themselves in the module that defines them; a
plugin module (a spec's ``plugins:``) registers its own the same way, so a new
error model or strategy is one new file and the lists are never repeated
elsewhere. A lookup of a name nobody registered is an error that names the spec
field, lists what is registered and says how to add one, as the backend registry
of :mod:`qaopt.kernels.registry` does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from qaopt.app_spec.schema import NAME_PATTERN
from qaopt.calibrate.errors import CalibrationError

T = TypeVar("T")

_NAME = re.compile(NAME_PATTERN)


class Registry(Mapping[str, T], Generic[T]):
    """Names -> entries, in registration order; read like a mapping, looked up with :meth:`lookup`.

    ``what`` names the kind of entry (``"error model"``), ``field`` the spec field
    that names one (``"calibration.error_model"``), ``how`` how to add one; the three
    make every error of the registry say where and what to fix.
    """

    def __init__(self, what: str, field: str, how: str):
        self.what, self.field, self.how = what, field, how
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        """Add (or replace: re-importing a plugin is harmless) ``entry`` under ``name``; returns ``entry``."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise CalibrationError(f"registering a {self.what}: {name!r} is not a name a spec can write in "
                                   f"{self.field} (a letter or '_', then letters, digits, '_' or '-')")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (nothing happens if it is not registered): a test's registrations end with it."""
        self._entries.pop(name, None)

    def lookup(self, name: str) -> T:
        """The entry registered under ``name``; an unknown name is a :class:`CalibrationError` listing the others."""
        try:
            return self._entries[name]
        except KeyError:
            raise CalibrationError(self.unknown(name)) from None

    def unknown(self, name: str) -> str:
        """The message for a name nobody registered: the field, the registered names, how to add one."""
        return (f"{self.field}: no {self.what} named {name!r}; registered: {', '.join(self._entries)}. "
                f"To use another, {self.how}")

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
