"""Reading a spec file into an :class:`AppSpec`, with errors a person can act on.

pydantic reports *what* is wrong as a field path; a robotics engineer needs *where*
in the file. So the YAML is also composed into its node tree, which keeps the line
and column of every key, and each validation error is reported at the position of
the field it concerns (or of its parent, for a missing field), with the nearest
valid name for unknown fields.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .entrypoints import EntryPointError, add_import_path, load_entry_point
from .errors import Problem, SpecError
from .schema import AppSpec

Loc = tuple[str | int, ...]

MAX_NODES = 100_000
"""Most YAML nodes a spec may expand to, aliases (``*name``) counted at every use. A real spec has
hundreds; a "billion laughs" document, whose nested aliases expand exponentially, is rejected
before anything walks it."""


def load(path: str | Path, *, check_entry_points: bool = False) -> AppSpec:
    """Read and validate the spec at ``path``; relative paths in it resolve against its folder.

    With ``check_entry_points`` every ``module:attr`` reference is also imported, so a
    misspelt model or simulator is caught before any work starts. The spec's folder is
    put on the import path (:func:`~qaopt.app_spec.entrypoints.add_import_path`), so its
    entry points and plugins may name modules that sit beside it. Raises
    :class:`SpecError` listing every problem found.
    """
    path = Path(path)
    text = _read(path)
    data, positions = _parse(text, path)
    add_import_path(path.resolve().parent)
    try:
        spec = AppSpec.model_validate(data, context={"base_dir": path.resolve().parent})
    except ValidationError as exc:
        raise SpecError([_problem(path, positions, err) for err in exc.errors()]) from None
    spec = spec.model_copy(update={"source": path.resolve()})
    if check_entry_points:
        problems = [
            Problem(_where(path, positions, loc), _dotted(loc), str(exc))
            for loc, ref in entry_points(spec)
            for exc in _import_error(ref)
        ]
        if problems:
            raise SpecError(problems)
    return spec


def entry_points(spec: AppSpec) -> list[tuple[Loc, str]]:
    """Every ``module:attr`` reference in the spec, with its field path."""
    refs: list[tuple[Loc, str]] = []
    sim = spec.evaluator.simulator
    if sim is not None and sim.entry_point is not None:
        refs.append((("evaluator", "simulator", "entry_point"), sim.entry_point))
    for name, nn in spec.nns.items():
        refs.append((("nns", name, "model"), nn.model))
        refs.append((("nns", name, "data", "source"), nn.data.source))
    return refs


def _import_error(ref: str) -> list[EntryPointError]:
    try:
        load_entry_point(ref)
    except EntryPointError as exc:
        return [exc]
    return []


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([Problem(str(path), "", "spec file not found")]) from None
    except IsADirectoryError:
        raise SpecError([Problem(str(path), "", "is a folder; give the spec's YAML file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([Problem(str(path), "", f"cannot read the spec: {exc}")]) from None


def _parse(text: str, path: Path) -> tuple[Any, dict[Loc, tuple[int, int]]]:
    """YAML -> (plain data, position of every key and item), 1-based lines and columns."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_size(root, path)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise SpecError([Problem(where, "", f"YAML syntax error: {exc.problem or exc}")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([Problem(str(path), "", f"YAML error: {exc}")]) from None
    if not isinstance(data, dict):
        raise SpecError([Problem(str(path), "", "the spec must be a YAML mapping of sections (app, nns, qos, ...)")])
    positions: dict[Loc, tuple[int, int]] = {}
    duplicates: list[Problem] = []
    _walk(root, (), positions, duplicates, path)
    if duplicates:
        raise SpecError(duplicates)
    return data, positions


def _check_size(root: yaml.Node | None, path: Path) -> None:
    """Reject a document that expands past :data:`MAX_NODES` or refers to itself, without expanding it.

    Composing keeps one node per anchor however often it is used, so the expanded size
    is summed over the node graph with each node's size computed once.
    """
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)] if root is not None else []
    open_: set[int] = set()
    while stack:
        node, done = stack.pop()
        children = _children(node)
        if done:
            open_.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), MAX_NODES + 1)
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_:
            mark = node.start_mark
            raise SpecError([Problem(f"{path}:{mark.line + 1}:{mark.column + 1}", "",
                                     "an alias refers to a node that contains it; a spec cannot be recursive")])
        open_.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    if root is not None and sizes[id(root)] > MAX_NODES:
        raise SpecError([Problem(str(path), "", f"the YAML expands to more than {MAX_NODES} values through its "
                                 "aliases (*name), as a 'billion laughs' document does; write the values out "
                                 "or use fewer nested aliases")])


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _walk(node: yaml.Node, loc: Loc, positions: dict, duplicates: list[Problem], path: Path) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            mark = key_node.start_mark
            if key in seen:
                duplicates.append(
                    Problem(f"{path}:{mark.line + 1}:{mark.column + 1}", _dotted(loc + (key,)), "duplicate key; keep one")
                )
            seen.add(key)
            positions[loc + (key,)] = (mark.line + 1, mark.column + 1)
            _walk(value_node, loc + (key,), positions, duplicates, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            positions[loc + (i,)] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _walk(item, loc + (i,), positions, duplicates, path)


def _dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)


def _where(path: Path, positions: dict[Loc, tuple[int, int]], loc: Loc) -> str:
    """The file position of ``loc``, or of its nearest ancestor present in the file."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in positions:
            line, col = positions[loc[:n]]
            return f"{path}:{line}:{col}"
    return str(path)


def located_problems(path: Path | None, errors: Iterable[dict[str, Any]], fields: Callable[[Loc], list[str]]) -> list[Problem]:
    """Problems in a part of the spec that another component validates (an approximation pass's settings).

    ``errors`` are pydantic-style (``loc`` from the spec's root, ``type``, ``msg``, ``input``); each is
    placed at its line in ``path`` like the loader's own. ``fields(loc)`` names the valid fields of the
    section at ``loc``, for 'did you mean'.
    """
    if path is None or not Path(path).is_file():
        return [_problem(Path(str(path or "spec")), {}, err, fields) for err in errors]
    path = Path(path)
    positions = _parse(_read(path), path)[1]
    return [_problem(path, positions, err, fields) for err in errors]


def _problem(path: Path, positions: dict[Loc, tuple[int, int]], err: dict[str, Any],
             fields: Callable[[Loc], list[str]] | None = None) -> Problem:
    # pydantic appends validator names (e.g. 'function-after[...]') to locs of annotated types.
    loc: Loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
    kind = err["type"]
    loc, err = _field_named_in_message(loc, err)
    if kind == "extra_forbidden":
        known = fields(loc[:-1]) if fields is not None else fields_at(AppSpec, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; valid fields: {', '.join(known)}" if known else "")
        message = f"unknown field{hint}"
    elif kind == "missing":
        message = "required field is missing"
    else:
        message = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        shown = repr(value) in message or f"got {value}" in message
        if "input" in err and kind not in ("model_type", "dict_type") and not isinstance(value, (dict, list)) and not shown:
            message += f" (got {value!r})"
    return Problem(_where(path, positions, loc), _dotted(loc), message)


def _field_named_in_message(loc: Loc, err: dict[str, Any]) -> tuple[Loc, dict[str, Any]]:
    """A check of a whole section that names the field at fault first (``calibration.space.0.nn: ...``)
    is placed at that field: ``loc`` extended, the prefix taken off the message."""
    msg = err["msg"].removeprefix("Value error, ")
    head, sep, rest = msg.partition(": ")
    parts = head.split(".")
    if not sep or " " in head or tuple(parts[: len(loc)]) != tuple(str(p) for p in loc):
        return loc, err
    named: Loc = tuple(int(p) if p.isdigit() else p for p in parts)
    return named, {**err, "msg": rest, "type": "value_error", "input": {}}


def fields_at(model: type[BaseModel], loc: Loc) -> list[str]:
    """Field names of the section at ``loc`` (for 'did you mean'); empty if not a section."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return []
            annotation = field.annotation
        else:  # dict[...] or list[...]: step into the value type
            args = typing.get_args(annotation)
            if not args:
                return []
            annotation = args[-1]
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [n for n, f in annotation.model_fields.items() if not f.exclude]
    return []


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> ``X``; ``Annotated[X, ...]`` -> ``X``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation
