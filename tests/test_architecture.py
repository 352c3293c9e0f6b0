"""The architecture as a test: dependencies point one way, no module imports itself in a circle,
and each concept of the ownership table in docs/architecture.md lives where the table says.

``app_spec`` <- ``calibrate``, ``approx``, ``kernels``, ``simulators`` <- ``qaopt``: the four
middle components never import each other (an example application in ``simulators``
may use ``calibrate``'s protocols), and ``app_spec`` imports none of them. Checked on
the source with :mod:`ast`, so a lazy import inside a function counts as well; so do
the package ``__init__`` files an import runs and the modules behind a lazily
re-exported name. Imports under ``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIDDLE = ("calibrate", "approx", "kernels", "simulators")
ALLOWED = {"app_spec": {"app_spec"}, **{m: {"app_spec", m} for m in MIDDLE}}
ALLOWED["simulators"] |= {"calibrate"}


def _folders() -> dict[str, Path]:
    """Import package -> source folder, as pyproject.toml maps them."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {pkg: ROOT / folder for pkg, folder in setup["package-dir"].items()}


@functools.cache
def _modules() -> dict[str, Path]:
    """Module name -> source file of every module of the package."""
    modules: dict[str, Path] = {}
    folders = _folders()
    for pkg, folder in folders.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            if pkg == "qaopt" and rel.parts[0] in {p.split(".")[1] for p in folders if p != "qaopt"}:
                continue
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("app_spec", *MIDDLE) else "qaopt"


def _lazy_exports(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package -> {name: the module that defines it} for the names a package loads on first use.

    A package built with :func:`qaopt.app_spec.lazy.lazy_exports` imports nothing when it
    is imported, so ``from qaopt.approx import TargetNN`` is, when it runs, an import of
    ``qaopt.approx.target``; without this map the edge would stop at the package and a
    circle through a re-exported name would go unseen. The map is read from the hook
    itself (importing these packages is light by design).
    """
    found: dict[str, dict[str, str]] = {}
    for module, path in modules.items():
        if path.name != "__init__.py" or "lazy_exports(" not in path.read_text():
            continue
        hook = vars(importlib.import_module(module))["__getattr__"]
        exports = inspect.getclosurevars(hook).nonlocals["exports"]
        found[module] = {name: _known(importlib.util.resolve_name(where, module), modules)
                         for name, where in exports.items()}
    return found


def _known(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of a dotted name that is a qaopt module ('' if none is)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _typing_only(tree: ast.Module) -> set[int]:
    """Ids of the nodes under ``if TYPE_CHECKING:`` (they never run)."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` statement in ``package`` imports from."""
    base = node.module or ""
    if not node.level:
        return base
    anchor = package.split(".")
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, base] if base else anchor)


def _imports(module: str, path: Path, modules: dict[str, Path], lazy: dict[str, dict[str, str]]) -> set[str]:
    """The qaopt modules ``module`` imports by name, at module level or inside a function.

    Each imported name counts (``from . import a, b`` imports both); a name a lazy
    package re-exports counts as its defining module. Imports under ``if TYPE_CHECKING:``
    are left out: they never run.
    """
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    typing_only = _typing_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else lazy.get(base, {}).get(a.name, base)
                       for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        found |= {t for t in (_known(t, modules) for t in targets) if t and t != module}
    return found


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _run_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the qaopt modules that importing it (or calling into it) runs.

    Importing ``a.b.c`` first runs ``a/__init__`` and ``a/b/__init__``: an import of a
    module is also one of every package above it, except the packages the importer sits
    in (those are already being imported when it runs).
    """
    lazy = _lazy_exports(modules)
    graph = {}
    for module, path in modules.items():
        targets = _imports(module, path, modules, lazy)
        inits = {a for t in targets for a in _ancestors(t)} & set(modules)
        graph[module] = targets | (inits - _ancestors(module) - {module})
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module: each is one or more import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's algorithm
        index[m] = low[m] = len(index)
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            component = stack[stack.index(m):]
            del stack[stack.index(m):]
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return found


def test_components_depend_one_way():
    modules = _modules()
    lazy = _lazy_exports(modules)
    wrong = []
    for module, path in modules.items():
        component = _component(module)
        if component == "qaopt":
            continue
        for target in _imports(module, path, modules, lazy):
            if _component(target) not in ALLOWED[component]:
                wrong.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_circle():
    """No module runs itself through imports, lazy ones (inside functions) and package inits included.

    A circle closed only by a function-level import works until someone moves that
    import to the top, or calls the function while the first module is half
    initialized; the shared concept belongs in a module both can import.
    """
    graph = _run_graph(_modules())
    circles = [" <-> ".join(c) + "\n    " + "\n    ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c)
               for c in _circles(graph)]
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_circle_finder_can_fail():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _circles(graph) == [["a", "b", "c"]]  # a module importing itself is not a circle of modules


def test_the_checker_sees_imports():
    """Guard against a checker that passes because it finds nothing, or misses a kind of import."""
    modules = _modules()
    assert {"qaopt.kernels", "qaopt.approx", "qaopt.app_spec.hashing"} <= set(modules)
    graph = _run_graph(modules)
    assert any(graph[m] for m in modules if m.startswith("qaopt.kernels."))
    # every name of one import statement: `from . import pruning, lowrank, quantization, finetune`
    assert {f"qaopt.approx.passes.{p}" for p in ("pruning", "lowrank", "quantization", "finetune")} <= graph["qaopt.approx.passes"]
    assert "qaopt.calibrate.plot" in graph["qaopt.calibrate.region"]  # an import inside a method
    assert "qaopt.approx.target" in graph["qaopt.on_policy"]  # `from qaopt.approx import TargetNN`, a lazy re-export
    assert "qaopt.kernels" in graph["qaopt.executor"]  # `from qaopt.kernels.measure import ...` runs the package's __init__ first
    assert "qaopt.calibrate.region" not in graph["qaopt.calibrate.plot"]  # TYPE_CHECKING only


# ---------------------------------------------------------------- the ownership table

OWNERSHIP_HEADING = "## One owner for each concept"
VERBS = ("defines", "calls", "imports", "subclasses", "literal")


def _ownership_rows(text: str) -> list[tuple[str, str]]:
    """(concept, check cell) of each row of docs/architecture.md's ownership table."""
    section = text.split(OWNERSHIP_HEADING, 1)[1].split("\n## ", 1)[0]
    table = next(block for block in section.split("\n\n") if block.startswith("|"))
    header, _, *body = table.splitlines()
    assert len(header.strip("|").split("|")) == 3, f"the ownership table needs three columns: {header}"
    rows = []
    for line in body:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 3, f"row with {len(cells)} cells (a '|' in a cell?): {line}"
        rows.append((cells[0], cells[2]))
    return rows


Facts = dict[str, list[tuple[str, int]]]
"""What one module holds that a claim can name: verb -> (name, line) pairs."""


def _facts(path: str, tree: ast.Module, lazy: dict[str, dict[str, str]]) -> Facts:
    """The top-level names a module defines, the callables it calls, the bases of its classes, its
    string constants and the dotted names it imports (``from a import b``: ``a.b``, and
    ``m.b`` too when a lazy package ``a`` re-exports ``b`` from ``m``; under
    ``if TYPE_CHECKING:``: left out, they never run)."""
    module = {str(p.relative_to(ROOT)): m for m, p in _modules().items()}.get(path, path.removesuffix(".py").replace("/", "."))
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    typing_only = _typing_only(tree)
    facts: Facts = {verb: [] for verb in VERBS}
    body = list(tree.body)
    while body:  # the top level, also inside top-level ifs and trys
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            facts["defines"].append((node.name, node.lineno))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            facts["defines"] += [(t.id, node.lineno) for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)]
        elif isinstance(node, (ast.If, ast.Try)):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                     *(n for h in getattr(node, "handlers", []) for n in h.body)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            facts["calls"].append((ast.unparse(node.func), node.lineno))
        elif isinstance(node, ast.ClassDef):
            facts["subclasses"] += [(ast.unparse(b), node.lineno) for b in node.bases]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            facts["literal"].append((node.value, node.lineno))
        elif isinstance(node, ast.Import) and id(node) not in typing_only:
            facts["imports"] += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and id(node) not in typing_only:
            written = [f"{_from_base(node, package)}.{a.name}" for a in node.names]  # and the module a lazy package re-exports it from
            facts["imports"] += [(name, node.lineno) for name in {*written, *(_resolved(n, lazy) for n in written)}]
    return facts


def _resolved(name: str, lazy: dict[str, dict[str, str]]) -> str:
    """A dotted name with a lazily re-exported last part written as the module that defines it."""
    package, _, attr = name.rpartition(".")
    return f"{lazy[package][attr]}.{attr}" if attr in lazy.get(package, {}) else name


@functools.cache
def _package_facts() -> dict[str, Facts]:
    """Repository-relative path -> facts of every module of the package (tests, benchmarks and examples are not in it)."""
    lazy = _lazy_exports(_modules())
    return {str(p.relative_to(ROOT)): _facts(str(p.relative_to(ROOT)), ast.parse(p.read_text()), lazy)
            for p in _modules().values()}


def _at(path: str, place: str) -> bool:
    return path == place or (place.endswith("/") and path.startswith(place))


def _names(text: str) -> list[str]:
    return [n.strip().strip('"') for n in text.split(",") if n.strip()]


def _matches(verb: str, text: str, name: str) -> bool:
    """Calls and bases match on the end of the dotted name (``InferenceSession`` is also ``ort.InferenceSession``)."""
    return text == name or (verb in ("calls", "subclasses") and text.endswith("." + name))


def _check_claim(claim: str, facts: dict[str, Facts]) -> list[str]:
    """The problems with one claim, ``VERB NAMES only in PLACES`` (a place: a file, or a folder ending in '/').

    Every occurrence of the names must be in the places, and every place must hold
    one (so a stale owner fails too); for ``defines``, every name must be defined there.
    """
    verb, _, rest = claim.partition(" ")
    if verb not in VERBS:
        return [f"`{claim}`: not `VERB NAMES only in PLACES` with VERB one of {', '.join(VERBS)}"]
    what, places = (_names(part) for part in rest.split(" only in ", 1))
    problems = [f"`{claim}`: {p} is not a module of the package" for p in places if not any(_at(f, p) for f in facts)]
    hits = {path: [line for text, line in f[verb] if any(_matches(verb, text, n) for n in what)] for path, f in facts.items()}
    problems += [f"`{claim}`: also {path}:{', '.join(map(str, lines))}" for path, lines in sorted(hits.items())
                 if lines and not any(_at(path, p) for p in places)]
    problems += [f"`{claim}`: none in {p}" for p in places if not any(hits[f] for f in facts if _at(f, p))]
    if verb == "defines":
        owned = {text for path, f in facts.items() if any(_at(path, p) for p in places) for text, _ in f["defines"]}
        problems += [f"`{claim}`: {n} is not defined in {', '.join(places)}" for n in what if n not in owned]
    return problems


def _check_row(concept: str, cell: str, facts: dict[str, Facts]) -> list[str]:
    """A row's claims are its code spans that say `only in` (other code spans are prose), or `unchecked` with a reason."""
    spans = cell.split("`")[1::2]
    claims = [c for c in spans if " only in " in c]
    if "unchecked" in spans:
        reason = cell.replace("`unchecked`", "").strip(" :;.-")
        return [] if reason and not claims else [f"{concept}: `unchecked` needs a reason, and no claims beside it"]
    if not claims:
        return [f"{concept}: no claim to check; add one, or `unchecked` and why"]
    return [f"{concept}: {p}" for c in claims for p in _check_claim(c, facts)]


def test_each_concept_lives_where_the_ownership_table_says():
    """docs/architecture.md's "One owner for each concept": every row's claims hold in the code, or it says why it is not checked."""
    rows = _ownership_rows((ROOT / "docs" / "architecture.md").read_text())
    assert len(rows) >= 12, "the ownership table was not found whole"
    facts = _package_facts()
    problems = [p for concept, cell in rows for p in _check_row(concept, cell, facts)]
    assert not problems, "the ownership table does not hold:\n" + "\n".join(problems)


def test_the_ownership_checker_can_fail():
    """A second session factory, a second cache_root, a stale owner, a typing-only import and an unreasoned skip."""
    facts, lazy = _package_facts(), _lazy_exports(_modules())
    rogue = "import onnxruntime as ort\nS = ort.InferenceSession('m.onnx')\n\ndef cache_root():\n    return '.'\n"
    with_rogue = {**facts, "qaopt/rogue.py": _facts("qaopt/rogue.py", ast.parse(rogue), lazy)}
    claim = "calls InferenceSession only in kernels/onnx.py"
    assert _check_claim(claim, facts) == []
    assert _check_claim(claim, with_rogue) == [f"`{claim}`: also qaopt/rogue.py:2"]
    assert _check_claim("defines cache_root only in app_spec/store.py", with_rogue)
    assert _check_claim("calls InferenceSession only in kernels/onnx.py, qaopt/report.py", facts)  # report.py opens none
    assert _check_claim("imports qaopt.app_spec.load only in qaopt/spec.py", facts) == []  # app_spec's own is typing-only
    assert _check_claim("imports qaopt.app_spec.load only in qaopt/report.py", facts)
    assert _check_claim("cals InferenceSession only in kernels/onnx.py", facts)
    assert _check_row("x", "`unchecked`", facts) and _check_row("x", "prose only", facts)
    assert _check_row("x", "`unchecked`: moving to `kernels`", facts) == []
