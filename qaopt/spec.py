"""Loading a spec for a qaopt command: app_spec's checks, then what only qaopt can see.

app_spec validates the whole file but cannot see the other components (they sit
above it). :func:`check_spec` imports the spec's ``plugins`` (each registers
approximation passes, backends, error models, region strategies or certifiers),
then validates each ``approximations.<nn>.<pass>`` section against the registered
pass's config model, ``target.backend`` against the backend registry (and
``target.device`` against the devices the backend declares),
``calibration.error_model``, ``strategy`` and ``certifier`` against calibration's
registries, and the error metric of every calibrated NN against what calibration
can inject, with errors placed at ``file:line:col`` like app_spec's own. It returns the spec with every section in
full (defaults filled), so that its content hash does not depend on how a setting
was spelt. Every command reads its spec through :func:`load_spec`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qaopt.app_spec import AppSpec, Problem, QaoptError, SpecError, load
from qaopt.app_spec.entrypoints import add_import_path, import_module
from qaopt.app_spec.loader import located_problems


def load_spec(path: str | Path, *, check_entry_points: bool = False) -> AppSpec:
    """:func:`qaopt.app_spec.load` and :func:`check_spec`: raises :class:`SpecError` listing every problem."""
    return check_spec(load(path, check_entry_points=check_entry_points))


def check_spec(spec: AppSpec) -> AppSpec:
    """``spec`` with its plugins imported and each section only qaopt can check validated and written in full."""
    from qaopt.approx import canonical_section, section_fields, validate_section  # light: no torch

    problems = import_plugins(spec)
    if problems:  # whatever a missing plugin registers would be reported as unknown too
        raise SpecError(problems)
    sections = {}
    for nn, section in spec.approximations.items():
        configs, errors = validate_section(section)
        problems += located(spec, [{**e, "loc": ("approximations", nn, *e["loc"])} for e in errors],
                            lambda loc: section_fields(loc[2:]))
        sections[nn] = canonical_section(configs)
    problems += _backend_problems(spec) + _calibration_problems(spec) + _metric_problems(spec)
    if problems:
        raise SpecError(problems)
    return spec.model_copy(update={"approximations": sections})


def located(spec: AppSpec, errors: list[dict[str, Any]], fields=lambda loc: []) -> list[Problem]:
    """Problems (pydantic-style dicts: ``loc`` from the spec's root, ``msg``, ``type``) at their ``file:line:col``.

    The file is shown relative to the working folder when it lies below it, as a user types it.
    """
    source = spec.source
    if source is not None and not os.path.relpath(source).startswith(".."):
        source = Path(os.path.relpath(source))
    return located_problems(source, [{"type": "value_error", **e} for e in errors], fields)


def problem(spec: AppSpec, loc: tuple, message: str) -> SpecError:
    """One located problem of ``spec`` as an error to raise."""
    return SpecError(located(spec, [{"loc": loc, "msg": message}]))


def import_plugins(spec: AppSpec) -> list[Problem]:
    """Import the spec's ``plugins`` (its folder on the import path); one problem per module that fails."""
    if spec.source is not None:
        add_import_path(spec.source.parent)
    errors = []
    for i, module in enumerate(spec.plugins):
        try:
            import_module(module, f"plugin {module!r}")
        except QaoptError as exc:
            errors.append({"loc": ("plugins", i), "msg": str(exc)})
    return located(spec, errors)


def _backend_problems(spec: AppSpec) -> list[Problem]:
    """``target.backend``, ``target.search_backend`` and ``target.backends`` that no registry holds, or that do not
    run on the device."""
    from qaopt.kernels.registry import backend_devices, resolve  # light: no torch

    named = [(("target", field), getattr(spec.target, field)) for field in ("backend", "search_backend")]
    named += [(("target", "backends", i), name) for i, name in enumerate(spec.target.backends or ())]
    errors = []
    for loc, name in named:
        if name is None:
            continue
        try:
            ref = resolve(name)
        except QaoptError as exc:
            message = str(exc).removeprefix("target.backend: ")
            if "no backend named" in message:
                message += "; or name a module that registers it in the spec's plugins: [module]"
            errors.append({"loc": loc, "msg": message})
            continue
        devices = backend_devices(ref)
        if spec.target.device not in devices:
            fix = ("drop it from target.backends" if loc[1] == "backends" else
                   f"choose another target.{loc[1]} (auto picks one for the device) or device")
            errors.append({"loc": loc if loc[1] != "backend" else ("target", "device"), "msg": (
                f"backend '{ref}' runs on {', '.join(devices)}, not on {spec.target.device}; {fix}")})
    return located(spec, errors)


def _calibration_problems(spec: AppSpec) -> list[Problem]:
    """``calibration.error_model``, ``strategy`` and ``certifier`` that no registry (plugins included) holds."""
    from qaopt.calibrate.certifiers import CERTIFIERS
    from qaopt.calibrate.error_models import ERROR_MODELS
    from qaopt.calibrate.strategies import STRATEGIES

    errors = []
    for field, registry in (("error_model", ERROR_MODELS), ("strategy", STRATEGIES), ("certifier", CERTIFIERS)):
        name = getattr(spec.calibration, field)
        if name not in registry:
            message = registry.unknown(name).removeprefix(f"{registry.field}: ")
            errors.append({"loc": ("calibration", field), "msg": message})
    return located(spec, errors)


def _metric_problems(spec: AppSpec) -> list[Problem]:
    """A calibrated NN whose error metric no error model can inject (each NN's model is built in its metric)."""
    from qaopt.calibrate.error_models import CALIBRATED_METRICS

    errors = []
    for nn in dict.fromkeys(a.nn for a in spec.calibration.space):
        kind = spec.nns[nn].error_metric.kind
        if kind not in CALIBRATED_METRICS:
            errors.append({"loc": ("nns", nn, "error_metric", "kind"), "msg": (
                f"'{kind}' cannot be calibrated: an episode's largest error grows with its length, so no error "
                f"model injects a given value of it; use one of {', '.join(CALIBRATED_METRICS)}")})
    return located(spec, errors)
