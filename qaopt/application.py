"""``check_application``: does an object keep the application protocol?

In the spirit of Gymnasium's ``check_env`` and scikit-learn's ``check_estimator``:
before hours of calibration and search are spent on a simulator, a few cheap
runs show that it offers what :class:`qaopt.calibrate.Application` declares. Each
failure raises :class:`ApplicationError` with a message that names the method and
what it did or returned. ``qaopt validate SPEC`` runs it on the spec's simulator.

What is checked, in order:

1. ``nn_names`` is a non-empty tuple or list of distinct strings, and, with a spec,
   holds every NN of the spec's ``nns``;
2. ``evaluate`` (and ``evaluate_perception`` when ``closed_loop``) can be called as
   the protocol declares them (the same arguments, by the same names); an optional
   parameter the protocol added later (``render_threads``) may be left out: such an
   application is supported, it is never passed one, and the check returns a note;
3. ``evaluate`` with no injected error and with an injector per NN returns one dict
   of real numbers per seed, holding the QoS metric (the spec's ``qos.metric``, or
   ``metric``) as a finite number, and calls each NN's injector;
4. ``evaluate_perception`` with perfect perception returns the same kind of records,
   and hands each NN in ``nns`` a batch of inputs (the check stops the run at that
   first call, so it costs one input, not an episode);
5. each run gives the same records when repeated with the same seeds.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from qaopt.app_spec.errors import QaoptError
from qaopt.calibrate.protocols import Application, QoSEvaluator, declared_options, is_qos_value, records_problem

if TYPE_CHECKING:
    from qaopt.app_spec import AppSpec

CHECK_SEEDS = (0, 1)
"""The seeds of the check's runs: two, so a batch of episodes is exercised, and few, so it is cheap."""


class ApplicationError(QaoptError):
    """An application (a spec's simulator, a user's evaluator) does not keep the application protocol."""


class _InputSeen(Exception):
    """Raised by the check's probe NN once it has seen its input: the run need not go on."""

    def __str__(self) -> str:
        return "the check's probe NN stopped the run after its first input"


def check_methods(app: object, protocol: type = Application) -> None:
    """Check that ``app`` has ``nn_names`` and every method ``protocol`` declares, callable as declared.

    No run is made. ``protocol`` is :class:`~qaopt.calibrate.Application` (everything) or
    :class:`~qaopt.calibrate.QoSEvaluator` (what calibration alone needs).
    """
    name = type(app).__name__
    names = getattr(app, "nn_names", None)
    if not isinstance(names, (tuple, list)) or not names or not all(isinstance(n, str) and n for n in names):
        raise ApplicationError(
            f"{name}.nn_names is {names!r}; declare the application's NNs as a tuple of their names, "
            "e.g. nn_names = ('heading', 'distance')"
        )
    if len(set(names)) != len(names):
        raise ApplicationError(f"{name}.nn_names {tuple(names)!r} names an NN twice")
    for method in _declared_methods(protocol):
        check_method(app, method, protocol)


def check_method(app: object, method: str, protocol: type = Application) -> None:
    """Check that ``app.method`` exists and accepts the arguments ``protocol`` declares for it (its optional ones
    only if it declares them: :func:`qaopt.calibrate.protocols.declared_options`)."""
    declared = _declared_call(protocol, method)
    name = type(app).__name__
    fn = getattr(app, method, None)
    if not callable(fn):
        raise ApplicationError(
            f"{name} has no method {method}{declared}; {_purpose(method)} (see qaopt.calibrate.{protocol.__name__})"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable without a signature: the runs will tell
    params = [p for p in inspect.signature(getattr(protocol, method)).parameters.values() if p.name != "self"]
    try:
        signature.bind(*[None for p in params if p.default is p.empty],
                       **declared_options(fn, **{p.name: None for p in params if p.default is not p.empty}))
    except TypeError as exc:
        raise ApplicationError(
            f"{name}.{method}{_call_form(signature)} cannot be called as the protocol declares it, "
            f"{method}{declared} ({exc})"
        ) from None


def check_application(
    app: object,
    spec: AppSpec | None = None,
    *,
    metric: str | None = None,
    seeds: Sequence[int] = CHECK_SEEDS,
    closed_loop: bool = True,
) -> list[str]:
    """Check that ``app`` keeps the application protocol; raise :class:`ApplicationError` naming what is wrong.

    Returns notes on what is supported but older than the protocol: a method that leaves out
    an optional parameter added later (``evaluate_perception(nns, seeds)`` without
    ``render_threads``) is called without it.

    ``spec`` (an :class:`~qaopt.app_spec.AppSpec`) supplies the QoS metric that must be
    in every record and the NN names the application must have; ``metric`` names the
    QoS metric without a spec. ``closed_loop=False`` checks only what calibration needs
    (``nn_names`` and ``evaluate``). The runs use ``seeds``: keep them few, they are
    run several times.
    """
    protocol = Application if closed_loop else QoSEvaluator
    check_methods(app, protocol)
    name = type(app).__name__
    nn_names = tuple(app.nn_names)  # type: ignore[attr-defined]
    if spec is not None:
        missing = [nn for nn in spec.nns if nn not in nn_names]
        if missing:
            raise ApplicationError(
                f"{name}.nn_names {nn_names!r} lacks the spec's NN {missing[0]!r}; "
                f"name the spec's nns as the application does"
            )
        metric = spec.qos.metric
    seeds = list(seeds)

    def describe(method: str, arg: Mapping[str, Any], options: Mapping[str, Any]) -> str:
        given = "".join(f", {k}={v!r}" for k, v in options.items())
        return f"{name}.{method}({{{', '.join(f'{k!r}: ...' for k in arg)}}}, seeds={seeds}{given})"

    def call(method: str, arg: Mapping[str, Any], **options: Any) -> object:
        options = declared_options(getattr(app, method), **options)
        try:
            return getattr(app, method)(dict(arg), list(seeds), **options)
        except Exception as exc:
            raise ApplicationError(f"{describe(method, arg, options)} raised {type(exc).__name__}: {exc}") from exc

    def run(method: str, arg: Mapping[str, Any], **options: Any) -> None:
        records = call(method, arg, **options)
        problem = records_problem(records, seeds, metric) or _non_numbers(records, seeds)
        if problem:
            raise ApplicationError(
                f"{describe(method, arg, options)} returned {problem}; it must return a list with one dict of QoS "
                f"metrics (name -> number) per seed" + (f", each with {metric!r}" if metric else "")
            )
        again = call(method, arg, **options)
        if not _same(records, again):
            raise ApplicationError(
                f"{describe(method, arg, options)} is not deterministic: called twice with the same seeds, "
                f"{_first_difference(records, again, seeds)} (it returned {records!r:.300}, then {again!r:.300}); "
                "derive every random draw from the seeds"
            )

    run("evaluate", {})
    calls = {nn: 0 for nn in nn_names}
    run("evaluate", {nn: _counting_injector(calls, nn) for nn in nn_names})
    silent = [nn for nn, n in calls.items() if n == 0]
    if silent:
        raise ApplicationError(
            f"{name}.evaluate never called the injector of NN {silent[0]!r}; each NN's output must come from "
            "injector(truth, rng, t) at every perception step"
        )
    if not closed_loop:
        return []
    run("evaluate_perception", {}, render_threads=1)
    for nn in nn_names:
        seen: list[object] = []
        try:
            call("evaluate_perception", {nn: _probe(seen)}, render_threads=1)
        except ApplicationError:
            if not seen:  # it failed before its NN saw any input
                raise
        if not seen:
            raise ApplicationError(
                f"{name}.evaluate_perception never called NN {nn!r} given in nns; each NN in nns must read the "
                "application's inputs and its outputs must replace the true values"
            )
        if not hasattr(seen[0], "shape") or not hasattr(seen[0], "__len__"):
            raise ApplicationError(
                f"{name}.evaluate_perception called NN {nn!r} with a {type(seen[0]).__name__}; an NN takes a "
                "batch of inputs, an array of shape (batch, ...)"
            )
        if spec is not None and nn in spec.nns:
            problem = input_problem(tuple(seen[0].shape), tuple(spec.nns[nn].input_shape), nn)
            if problem:
                raise ApplicationError(f"{name}.evaluate_perception {problem}")
    return older_signatures(app, protocol)


def input_problem(given: tuple[int, ...], declared: tuple[int, ...], nn: str) -> str | None:
    """What is wrong with a batch of shape ``given`` handed to NN ``nn`` whose spec declares ``declared`` (batch
    first), with the fix; ``None`` when it fits.

    A camera hands height x width x channels; torch's convolutions read channels first. An application that passes
    its frames as they come runs until the NN's first convolution, in ``qaopt optimize`` after calibration has
    spent minutes, and fails there with torch's own words about channels.
    """
    want = tuple(declared[1:])
    have = tuple(given[1:])
    if have == want:
        return None
    expected = f"(batch, {', '.join(map(str, want))})"
    where = f"nns.{nn}.input_shape is {list(declared)}"
    if len(have) == len(want) == 3 and have == (want[1], want[2], want[0]):
        return (f"hands NN {nn!r} a batch of shape {given}, channels last, but {where}: channels first; hand it "
                f"{expected}, e.g. frames.transpose(0, 3, 1, 2) (numpy) or frames.permute(0, 3, 1, 2) (torch)")
    if len(have) == len(want) - 1 and have == want[1:] and want[0] == 1:
        return (f"hands NN {nn!r} a batch of shape {given} without its channel axis, but {where}; hand it {expected}, "
                "e.g. frames[:, None]")
    return f"hands NN {nn!r} a batch of shape {given}, but {where}: hand it {expected} or correct input_shape"


def older_signatures(app: object, protocol: type = Application) -> list[str]:
    """A note per method of ``app`` that leaves out optional parameters of ``protocol``: supported, never passed."""
    notes = []
    for method in _declared_methods(protocol):
        fn = getattr(app, method)
        optional = [p.name for p in inspect.signature(getattr(protocol, method)).parameters.values()
                    if p.default is not p.empty]
        left_out = [n for n in optional if n not in declared_options(fn, **{n: None for n in optional})]
        if left_out:
            notes.append(
                f"{type(app).__name__}.{method} does not declare {', '.join(left_out)} (an optional parameter "
                f"added to the protocol after it was written): supported, qaopt calls it without "
                f"{'them' if len(left_out) > 1 else 'it'}; declare {method}{_declared_call(protocol, method)} "
                "to use it")
    return notes


def _declared_methods(protocol: type) -> list[str]:
    return [m for m in ("evaluate", "evaluate_perception") if hasattr(protocol, m)]


def _declared_call(protocol: type, method: str) -> str:
    return _call_form(inspect.signature(getattr(protocol, method)))


def _call_form(signature: inspect.Signature) -> str:
    """``(nns, seeds, render_threads=1)``: a signature's parameters without annotations or ``self``."""
    params = [p.replace(annotation=p.empty) for p in signature.parameters.values() if p.name != "self"]
    return str(signature.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _purpose(method: str) -> str:
    return {
        "evaluate": "calibration runs the application with injected NN errors through it",
        "evaluate_perception": "closed-loop validation (qaopt optimize) runs the application with the approximated "
                               "NNs in the loop through it",
    }[method]


def _non_numbers(records: Sequence[Mapping], seeds: Sequence[int]) -> str | None:
    for seed, r in zip(seeds, records):
        for k, v in r.items():
            if not isinstance(k, str) or not is_qos_value(v):
                return f"metric {k!r} = {v!r:.100} for seed {seed}, not a real number"
    return None


def _same(a: Sequence[Mapping], b: object) -> bool:
    if not isinstance(b, Sequence) or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if not isinstance(y, Mapping) or set(x) != set(y):
            return False
        for k in x:
            u, v = float(x[k]), y[k]
            if not is_qos_value(v) or not (u == float(v) or (math.isnan(u) and math.isnan(float(v)))):
                return False
    return True


def _first_difference(a: Sequence[Mapping], b: object, seeds: Sequence[int]) -> str:
    """Where two results for the same seeds first differ: ``seed 0's 'm' was 0.1, then 0.2``."""
    if not isinstance(b, Sequence) or len(a) != len(b):
        return f"it returned {len(a)} records, then {len(b) if isinstance(b, Sequence) else type(b).__name__}"
    for seed, x, y in zip(seeds, a, b):
        if not isinstance(y, Mapping) or set(x) != set(y):
            return f"seed {seed}'s record had the metrics {sorted(x)}, then {sorted(y) if isinstance(y, Mapping) else y!r:.100}"
        for k in x:
            if not _same([{k: x[k]}], [{k: y[k]}]):
                return f"seed {seed}'s {k!r} was {x[k]!r}, then {y[k]!r}"
    return "its records differ"


def _counting_injector(calls: dict[str, int], nn: str) -> Callable[[np.ndarray, np.random.Generator, int], np.ndarray]:
    """An injector that adds no error (it still draws from ``rng``, as error models do) and counts its calls."""
    def inject(truth: np.ndarray, rng: np.random.Generator, t: int) -> np.ndarray:
        calls[nn] += 1
        truth = np.asarray(truth, dtype=float)
        return truth + 0.0 * rng.standard_normal(truth.shape)

    return inject


def _probe(seen: list[object]) -> Callable[[np.ndarray], np.ndarray]:
    def nn(inputs: np.ndarray) -> np.ndarray:
        seen.append(inputs)
        raise _InputSeen

    return nn
