"""Loading a spec for a qaopt command: app_spec's checks, then each approximation section against its pass.

app_spec validates the whole file but cannot see the approximation passes (they
are registered in :mod:`qaopt.approx`, above it); :func:`check_spec` validates each
``approximations.<nn>.<pass>`` section against the registered pass's config model,
with errors placed at ``file:line:col`` like app_spec's own, and returns the spec
with every section in full (defaults filled), so that its content hash does not
depend on how a setting was spelt. Every command reads its spec through :func:`load_spec`.
"""

from __future__ import annotations

from pathlib import Path

from qaopt.app_spec import AppSpec, SpecError, load
from qaopt.app_spec.loader import located_problems


def load_spec(path: str | Path, *, check_entry_points: bool = False) -> AppSpec:
    """:func:`qaopt.app_spec.load` and :func:`check_spec`: raises :class:`SpecError` listing every problem."""
    return check_spec(load(path, check_entry_points=check_entry_points))


def check_spec(spec: AppSpec) -> AppSpec:
    """``spec`` with each approximation section validated against its registered pass and written in full."""
    from qaopt.approx import canonical_section, section_fields, validate_section  # light: no torch

    problems, sections = [], {}
    for nn, section in spec.approximations.items():
        configs, errors = validate_section(section)
        problems += located_problems(
            spec.source,
            [{**e, "loc": ("approximations", nn, *e["loc"])} for e in errors],
            lambda loc: section_fields(loc[2:]),
        )
        sections[nn] = canonical_section(configs)
    if problems:
        raise SpecError(problems)
    return spec.model_copy(update={"approximations": sections})
