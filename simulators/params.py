"""Checked parameters: a spec's plain mappings made into an application's frozen config dataclasses.

Both example applications take their parameters from a spec as nested mappings and
fail at once, naming the parameter, on a bad one; this is that machinery, in one
place, raising each application's own error type (its message names the application).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def is_real(value: Any) -> bool:
    """A finite int or float, not a bool (a range check on it then means what it says)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class ParamRules:
    """The checks of one application, raising ``error(param, message)``.

    ``kind_params`` names, for a dataclass whose ``kind`` field a top-level parameter
    sets (``controller: mpc``), that parameter, so a bad kind is reported under the name
    the user wrote.
    """

    def __init__(self, error: Callable[[str, str], Exception], kind_params: Mapping[type, str] | None = None):
        self.error = error
        self.kind_params = dict(kind_params or {})

    def require(self, ok: bool, param: str, message: str) -> None:
        if not ok:
            raise self.error(param, message)

    def mapping(self, value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.error(where, f"must be a mapping of parameters, got {type(value).__name__}")
        return value

    def build(self, kind: type, value: Any, where: str) -> Any:
        """``kind`` from a mapping of its fields (lists become tuples), or ``value`` if it already is one."""
        if isinstance(value, kind):
            return value
        value = dict(self.mapping(value, where))
        names = {f.name for f in dataclasses.fields(kind)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise self.error(f"{where}.{unknown[0]}", f"unknown parameter; valid ones: {', '.join(sorted(names))}")
        for name, v in value.items():
            if isinstance(v, list):
                value[name] = tuple(v)
        self.check_types(kind, value, f"{where}.")
        return kind(**value)

    def build_config(self, cls: type, params: Mapping[str, Any], nested: Mapping[str, type],
                     special: Callable[[dict[str, Any]], dict[str, Any]] | None = None, special_names: Sequence[str] = ()) -> Any:
        """``cls`` from flat-or-nested ``params``: top-level fields, and each ``nested`` key as a mapping of its dataclass.

        ``special(params)``, if given, pops the parameters that are neither (``controller``) from
        ``params`` and returns the fields it builds of them; ``special_names`` lists those parameters
        for the message on an unknown one.
        """
        params = dict(params)
        kwargs = {key: self.build(kind, params.pop(key), key) for key, kind in nested.items() if key in params}
        if special is not None:
            kwargs.update(special(params))
        top = {f.name for f in dataclasses.fields(cls)} - set(nested) - set(kwargs)
        unknown = sorted(set(params) - top)
        if unknown:
            raise self.error(unknown[0], f"unknown parameter; valid ones: {', '.join(sorted(top | set(nested) | set(special_names)))}")
        self.check_types(cls, params, "")
        return cls(**params, **kwargs)

    def check_types(self, kind: type, values: Mapping[str, Any], prefix: str) -> None:
        """Each value has its field's type: a finite number for ``float``, an integer for ``int``, a pair for ranges.

        The range checks in ``__post_init__`` compare numbers; a string there ('not-a-number')
        would fail with a bare ``TypeError`` that names no parameter, and an infinite run
        length would never end.
        """
        types = {f.name: f.type for f in dataclasses.fields(kind)}
        for name, value in values.items():
            expected = types[name]
            param = self.kind_params[kind] if (kind in self.kind_params and name == "kind") else prefix + name
            if expected == "float":
                self.require(is_real(value), param, f"{value!r} is not a finite number")
            elif expected == "int":
                self.require(isinstance(value, int) and not isinstance(value, bool), param, f"{value!r} is not an integer")
            elif expected == "bool":
                self.require(isinstance(value, bool), param, f"{value!r} is not true or false")
            elif expected.startswith("tuple[float"):
                self.require(isinstance(value, (tuple, list)) and len(value) == 2 and all(map(is_real, value)), param,
                             f"{value!r} is not a pair of finite numbers [min, max]")
            elif expected.startswith("tuple[int"):
                self.require(isinstance(value, (tuple, list)) and len(value) == 2
                             and all(isinstance(v, int) and not isinstance(v, bool) for v in value), param,
                             f"{value!r} is not a pair of integers [min, max]")

    def integer(self, value: Any, param: str, low: int, why: str = "") -> int:
        """``value`` as an int, if it is an integer (numpy's too, not a bool) of at least ``low``."""
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise self.error(param, f"{value!r} must be an integer >= {low}{why}")
        return int(value)

    def seeds(self, seeds: Sequence[int]) -> list[int]:
        """The episodes' seeds as ints: at least one, each a non-negative integer."""
        out = []
        for seed in seeds:
            if isinstance(seed, (bool, float)) or not isinstance(seed, (int, np.integer)) or seed < 0:
                raise self.error("seeds", f"{seed!r} is not a non-negative integer")
            out.append(int(seed))
        if not out:
            raise self.error("seeds", "at least one seed is needed")
        return out
