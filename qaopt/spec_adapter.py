"""The one place where a spec's sections become :mod:`qaopt.calibrate`'s domain objects.

``app.yaml`` describes the application in the spec's terms (:mod:`qaopt.app_spec`:
plain, validated data with YAML locations for its errors); calibration, closed-loop
validation and the search work with objects that have behaviour (an
:class:`~qaopt.calibrate.ErrorSpace`, a :class:`~qaopt.calibrate.QoSGoal`, an
:class:`~qaopt.calibrate.AcceptanceTest`, error models, the simulator). Every
command builds them here, so the two can never drift apart:

========================================  ==========================================
spec                                      domain object
========================================  ==========================================
``evaluator.simulator``                   :func:`make_evaluator`: the application
``nns`` (model, data, shapes)             :func:`check_nn_shapes`: one sample through each NN
``calibration.space`` (``schema.Axis``)   :func:`space_of`: ``ErrorSpace`` of ``calibrate.Axis``
``qos`` (metric, max, min)                :func:`goal_of`: ``QoSGoal``
``qos.acceptance`` (``Acceptance``)       :func:`acceptance_of`: ``AcceptanceTest``
``evaluator.simulator`` + its code        :func:`simulator_key`: the key of its cached runs
``output.cache_dir``                      :func:`cache_dir_of`: the cache root
========================================  ==========================================
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from qaopt.app_spec import AppSpec, QaoptError, SpecError, content_hash, file_hash, load_entry_point, store
from qaopt.application import ApplicationError, check_application, check_methods
from qaopt.calibrate import (
    AcceptanceTest,
    Axis,
    ErrorSpace,
    QoSEvaluator,
    QoSGoal,
    RunLimits,
)
from qaopt.spec import located, problem


def cache_dir_of(spec: AppSpec) -> Path:
    """The cache root for this spec (see :func:`qaopt.app_spec.store.cache_root` for the precedence)."""
    return store.cache_root(configured=spec.output.cache_dir)


def space_of(spec: AppSpec) -> ErrorSpace:
    return ErrorSpace(Axis(a.nn, a.max, a.component, a.min) for a in spec.calibration.space)


def goal_of(spec: AppSpec) -> QoSGoal:
    return QoSGoal(spec.qos.metric, spec.qos.max, spec.qos.min)


def acceptance_of(spec: AppSpec) -> AcceptanceTest:
    """The spec's acceptance test; one seed block is ``min_trials`` runs (the first look)."""
    a = spec.qos.acceptance
    return AcceptanceTest(a.max_failure_rate, a.confidence, a.min_trials, a.max_trials, block=a.min_trials)


def limits_of(spec: AppSpec) -> RunLimits:
    """How long one simulator call may take and how often a failed one is tried again (``output.time_limit_s``,
    ``output.retries``): execution settings, so like the rest of ``output`` they key no cached result. A time limit
    the user set is used as given; the default one is the hard cap above a limit learnt from the run's own calls
    (:func:`qaopt.calibrate.app_calls.hang_limit`)."""
    given = "time_limit_s" in spec.output.model_fields_set
    return RunLimits(spec.output.time_limit_s, spec.output.retries, learnt=not given)


def written_folders(spec: AppSpec, *, out: str | Path | None = None, storage: str | None = None,
                    study: bool = True) -> list[Path]:
    """The folders a command on ``spec`` writes: its run folder (``out``, else ``output.dir``), the cache, and, for a
    command with a ``study``, an SQLite study database's folder (``storage``, else ``search.storage``)."""
    folders = [Path(out) if out is not None else Path(spec.output.dir), cache_dir_of(spec)]
    url = (storage or spec.search.storage) if study else None
    if url and url.startswith("sqlite:"):
        from sqlalchemy.engine import make_url

        database = make_url(url).database
        if database and database != ":memory:":
            folders.append(Path(database).parent)
    return list(dict.fromkeys(folders))


def with_time_limit(spec: AppSpec, seconds: float | None) -> AppSpec:
    """``spec`` with ``--time-limit SECONDS`` in place of its ``output.time_limit_s`` (``None``: the spec's own)."""
    if seconds is None:
        return spec
    if not seconds > 0:
        raise QaoptError(f"--time-limit {seconds:g}: give the seconds one simulator call may take, more than 0")
    return spec.model_copy(update={"output": spec.output.model_copy(update={"time_limit_s": float(seconds)})})


def make_evaluator(spec: AppSpec, *, check_runs: bool = False) -> QoSEvaluator:
    """The spec's simulator: its entry point called with its params.

    Constructing it is the check of its params: an error it raises is placed at
    ``evaluator.simulator.params`` (at the parameter itself when the error names it in
    a ``param`` attribute, as CropFollow's does). Its methods are checked against
    :class:`~qaopt.calibrate.QoSEvaluator` (no run is made); ``check_runs`` checks the
    whole application protocol with a few short runs instead
    (:func:`qaopt.check_application`, what ``qaopt validate`` does). Every error is
    located like a spec error (``file:line:col: field: ...``). An
    :class:`~qaopt.calibrate.Application` is returned as it is, so closed-loop
    validation can use it.
    """
    sim = spec.evaluator.simulator
    if sim is None:
        raise problem(spec, ("evaluator",), (
            "evaluator.simulator is missing; calibration injects errors into a simulator (field runs refine a "
            "region, see `qaopt field`); add evaluator.simulator.entry_point"))
    at = ("evaluator", "simulator", "entry_point")
    try:
        factory = load_entry_point(sim.entry_point)
    except QaoptError as exc:
        raise problem(spec, at, str(exc)) from None
    try:
        evaluator = factory(**sim.params)
    except Exception as exc:  # noqa: BLE001 - whatever the user's constructor raises is a params problem
        param = getattr(exc, "param", None)
        loc = ("evaluator", "simulator", "params", *(param.split(".") if isinstance(param, str) else ()))
        told = str(exc) if isinstance(exc, QaoptError) else f"{type(exc).__name__}: {exc}"
        raise problem(spec, loc, f"{sim.entry_point}(**params) raised {told}; fix evaluator.simulator.params") from exc
    try:
        if check_runs:
            check_application(evaluator, spec)
        else:
            check_methods(evaluator, QoSEvaluator)
    except ApplicationError as exc:
        raise ApplicationError(str(located(spec, [{"loc": at, "msg": f"{sim.entry_point!r}: {exc}"}])[0])) from None
    return evaluator


SLOW_LOAD_S = 5.0
"""Seconds of loading the NNs and their data after which :func:`check_nn_shapes` says it is still at it."""


def check_nn_shapes(spec: AppSpec, progress: Callable[[str], None] = lambda message: None) -> None:
    """Load each NN and its data and run one sample through it: shapes must agree with ``input_shape`` and ``outputs``.

    Cheap (one forward pass per NN), but it calls the NNs' model and data entry points (the data's with
    ``data.more_validation`` too, so that a second split the source refuses stops a run before its searches),
    which may build or load their data the first time (CropFollow's ResNet-18 reference trains for
    about an hour on two CPU cores), so ``progress`` is told when that takes more than
    :data:`SLOW_LOAD_S` (a quick check stays silent). Raises :class:`SpecError` with one located
    problem per NN at fault.
    """
    from qaopt.approx import EntryPointFailed, TargetNN  # heavy (torch): only when asked to

    slow = threading.Timer(SLOW_LOAD_S, progress, [
        f"nns: still loading {', '.join(spec.nns)} with their data to run one sample each (an NN's entry point "
        "may build or train it the first time)"])
    slow.daemon = True
    slow.start()
    problems, targets = [], {}
    try:
        for name, nn in spec.nns.items():
            try:
                target = TargetNN.from_spec(name, nn)  # checks the data's shapes against input_shape
                _check_sample(target, nn.input_shape, len(nn.outputs))
                problems += _pass_problems(spec, name, target)
                targets[name] = target
                target.more_validation(nn)  # its second split: a bad one found now, not after the searches
            except (_ShapeError, EntryPointFailed) as exc:
                message = exc.detail if isinstance(exc, EntryPointFailed) else str(exc)
                problems += located(spec, [{"loc": ("nns", name, *exc.field.split(".")), "msg": message}])
            except QaoptError as exc:  # a message that starts with its field (nns.a.weights: ...) is placed there
                loc = ("nns", name, "input_shape") if "input_shape" in str(exc) else ("nns", name)
                problems += located(spec, [{"loc": loc, "msg": str(exc)}])
            except Exception as exc:  # noqa: BLE001 - the user's NN failed on its own data
                problems += located(spec, [{"loc": ("nns", name), "msg": f"running a sample of its data through the NN "
                                                                       f"raised {type(exc).__name__}: {exc}"}])
        problems += _merge_problems(spec, targets)
    finally:
        slow.cancel()
    if problems:
        raise SpecError(problems)


def _merge_problems(spec: AppSpec, targets: dict) -> list:
    """Each merge group's ``freeze`` that its lead's model cannot take, at its line (groups whose NNs all loaded)."""
    from qaopt.approx import ApproxError
    from qaopt.approx.merge import MergeGroup, frozen_part

    errors = []
    for i, group in enumerate(spec.search.merge):
        if group.freeze is None or not all(n in targets for n in group.nns):
            continue
        merge = MergeGroup.from_section(group, targets)
        try:
            frozen_part(merge, merge.lead())
        except ApproxError as exc:
            errors.append({"loc": ("search", "merge", i, "freeze"), "msg": str(exc)})
    return located(spec, errors)


def _pass_problems(spec: AppSpec, name: str, target) -> list:
    """What a pass's section asks of NN ``name`` that its model cannot take, at the section's line (all or the NN's)."""
    from qaopt.approx import KnobSpace, get_pass

    key = name if name in spec.approximations else "all"
    errors = []
    for pass_name, config in KnobSpace.from_section(spec.knobs_for(name), nn=name).configs.items():
        errors += [{"loc": ("approximations", key, pass_name, *loc), "msg": f"nns.{name}: {message}"}
                   for loc, message in get_pass(pass_name).model_problems(config, target)]
    return located(spec, errors)


class _ShapeError(QaoptError):
    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def _check_sample(target, input_shape: list[int], outputs: int) -> None:
    import torch

    with torch.no_grad():
        try:
            target.model(torch.zeros(input_shape))
        except Exception as exc:  # noqa: BLE001 - the model rejects the declared shape
            raise _ShapeError("input_shape", f"the model does not take an input of shape {tuple(input_shape)}: "
                                             f"{type(exc).__name__}: {exc}") from exc
        sample = torch.as_tensor(np.asarray(target.data.x_val[:1], dtype=np.float32))
        out = target.model(sample)
    shape = tuple(out.shape)
    if shape != (1, outputs):  # what approx compares with the data's labels, (N, outputs)
        raise _ShapeError("outputs", f"one sample of the data gives an output of shape {shape}; the spec's "
                                     f"{outputs} output(s) need shape (1, {outputs})")


def simulator_sources(src: Path) -> list[Path]:
    """The code a simulator's runs depend on: its evaluator's module and the modules of its folder (and, when that
    folder is a subpackage, of the package above: the helpers several simulators share, ``from .. import``) that
    it imports, directly or through one another, at a module's top or inside a function.

    Imports are read from the source (:mod:`ast`), not from what happens to be loaded, so a helper imported only
    when a run needs it counts too; a name that may be a module counts where a file of that name is in those
    folders (a superset: a file counted in vain only costs cached runs, one left out would reuse stale ones). A
    script that nothing imports (a scratch file beside the simulator) is not the simulator's code. A module imported
    by a computed name (``importlib.import_module(name)``) is not seen: import it by name, or keep it elsewhere.
    """
    folder = src.parent
    here = {f.stem: f for f in folder.glob("*.py")}
    above: dict[str, Path] = {}
    if (folder / "__init__.py").exists() and (folder.parent / "__init__.py").exists():
        above = {f.stem: f for f in folder.parent.glob("*.py")}
    inits = [p["__init__"] for p in (here, above) if "__init__" in p]  # run by every import of the package
    found: dict[Path, None] = dict.fromkeys([src, *inits])
    todo = list(found)
    while todo:
        for level, names in _imported_names(todo.pop()):
            pools = {0: (here, above), 1: (here,), 2: (above,)}.get(level, ())
            for name in names:
                for pool in pools:
                    f = pool.get(name)
                    if f is not None and f not in found:
                        found[f] = None
                        todo.append(f)
    return sorted(found)


def _imported_names(module: Path) -> list[tuple[int, list[str]]]:
    """Each import statement of ``module`` as (relative level, every dotted component and imported name)."""
    import ast

    try:
        tree = ast.parse(module.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(0, alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, [*(node.module or "").split("."), *(a.name for a in node.names)]))
    return found


def simulator_key(spec: AppSpec, evaluator: object) -> str:
    """The key of the simulator's cached runs: its spec section and the hash of its sources (:func:`simulator_sources`).

    Editing the simulator, or a helper it shares with other simulators, never reuses stale runs, while changing the
    QoS threshold, the acceptance test, the strategy or the budget reuses every run already made.
    """
    src = inspect.getsourcefile(type(evaluator))
    code = "unknown"
    if src is not None:
        own = Path(src).parent  # named relative to it, so moving the project folder keeps its cached runs
        code = content_hash([[f.name if f.parent == own else f"../{f.name}", file_hash(f)]
                             for f in simulator_sources(Path(src))])
    return content_hash(spec.evaluator.simulator, code)
