"""The spec held against its target on this machine, before anything runs: what cannot run is refused or left out.

``qaopt validate`` and ``qaopt optimize`` (through :func:`qaopt.plan.build_plan`) both
ask :func:`fit_target` before calibration, so that:

- ``target.device: cuda`` on a machine where torch sees no CUDA GPU fails at once, in
  one line naming the field, instead of minutes later in a trial;
- a dtype of ``approximations.<nn>.quantization.dtypes`` that no backend of the target
  runs on its device (as the backends declare it, :func:`qaopt.kernels.unrunnable_dtypes`),
  or that the device would only emulate, is left out of the search, said once on the
  console and in the report, and never reaches a trial;
- an NN's dtype list with nothing left is refused at its line.

With ``target.search_backend`` a dtype must run on it (the trials) and on ``target.backend`` (the chosen
configurations, compiled again there before they are compared and exported).
"""

from __future__ import annotations

from dataclasses import dataclass

from qaopt import kernels
from qaopt.app_spec import AppSpec, SpecError
from qaopt.spec import located, problem

DTYPES_FIELD = ("quantization", "dtypes")
"""Where a section of ``approximations`` lists the dtypes it searches."""


@dataclass(frozen=True)
class LeftOut:
    """A dtype the spec asks to search that the target cannot run: why, and the spec fields that list it.

    ``str()`` is the line the console and the report show.
    """

    dtype: str
    reason: str
    emulated: bool
    fields: tuple[str, ...]

    def __str__(self) -> str:
        where = " and ".join(self.fields)
        fix = (f"search it on a CPU that has them, or drop {self.dtype} from {where}" if self.emulated else
               f"declare one (docs/extending.md, 'Adding a backend') or drop {self.dtype} from {where}")
        return f"{self.dtype} left out of the search: {self.reason}; {fix}"


def fit_target(spec: AppSpec) -> tuple[LeftOut, ...]:
    """The dtypes the spec's search leaves out on its target; raises :class:`SpecError` when the target's device is
    missing here, or when an NN's dtype list keeps nothing the target runs."""
    device = spec.target.device
    missing = kernels.missing_device(device)
    if missing is not None:
        raise problem(spec, ("target", "device"), f"{device!r}, but {missing}: run on a machine with an NVIDIA GPU "
                                                  "or set target.device: cpu")
    target = kernels.Target.from_spec(spec.target)
    listed = _listed_dtypes(spec)
    unrunnable: dict[str, kernels.Unrunnable] = {}
    for on in dict.fromkeys((searched_on(spec, target), target)):  # a trial runs on the first, the chosen on both
        for dtype, why in kernels.unrunnable_dtypes(on, [d for dtypes in listed.values() for d in dtypes]).items():
            unrunnable.setdefault(dtype, why)
    empty = {key: dtypes for key, dtypes in listed.items() if all(d in unrunnable for d in dtypes)}
    if empty:
        raise SpecError(located(spec, [{"loc": ("approximations", key, *DTYPES_FIELD),
                                        "msg": _nothing_runs(target, dtypes, unrunnable)} for key, dtypes in empty.items()]))
    return tuple(LeftOut(u.dtype, u.reason, u.emulated,
                         tuple(_field(key) for key, dtypes in listed.items() if u.dtype in dtypes))
                 for u in unrunnable.values())


def searched_on(spec: AppSpec, target: kernels.Target) -> kernels.Target:
    """``target`` as the search times its trials: on ``target.search_backend`` where the spec names one."""
    name = spec.target.search_backend
    return target if name is None else target.with_backend(kernels.resolve(name))


def _listed_dtypes(spec: AppSpec) -> dict[str, list[str]]:
    """Each ``approximations`` section an NN searches (its own, else ``all``) -> the dtypes it lists, in spec order."""
    used = {nn if nn in spec.approximations else "all" for nn in spec.nns}
    return {key: list(section[DTYPES_FIELD[0]][DTYPES_FIELD[1]]) for key, section in spec.approximations.items()
            if key in used and section.get(DTYPES_FIELD[0])}


def _field(key: str) -> str:
    return ".".join(("approximations", key, *DTYPES_FIELD))


def _nothing_runs(target: kernels.Target, dtypes: list[str], unrunnable: dict[str, kernels.Unrunnable]) -> str:
    from qaopt.approx import DTYPES  # light: no torch

    runs = [d for d in DTYPES if d not in kernels.unrunnable_dtypes(target, [d])]
    return (f"nothing listed runs on this target: {'; '.join(unrunnable[d].reason for d in dtypes)}; list a dtype "
            f"it runs ({', '.join(runs) or 'none'}) or declare a backend that runs {' or '.join(dtypes)} "
            "(docs/extending.md, 'Adding a backend')")
