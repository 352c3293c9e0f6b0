"""The architecture as a test: dependencies point one way, and no module imports itself in a circle.

``app_spec`` <- ``calibrate``, ``approx``, ``kernels``, ``simulators`` <- ``qaopt``: the four
middle components never import each other (an example application in ``simulators``
may use ``calibrate``'s protocols), and ``app_spec`` imports none of them. Checked on
the source with :mod:`ast`, so a lazy import inside a function counts as well.
"""

from __future__ import annotations

import ast
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


def _modules() -> dict[str, Path]:
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


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The qaopt modules ``module`` imports (resolved to the longest known module name).

    Imports under ``if TYPE_CHECKING:`` are left out: they never run.
    """
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    nodes = [n for n in ast.walk(tree) if id(n) not in typing_only]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
                break
    return found


def test_components_depend_one_way():
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        component = _component(module)
        if component == "qaopt":
            continue
        for target in _imports(module, path, modules):
            if _component(target) not in ALLOWED[component]:
                wrong.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_import_circle():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    # A package's __init__ re-exports its modules; an edge into it from its own modules is not a circle of logic.
    graph = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                circles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not circles, "\n".join(circles)


def test_the_checker_sees_imports():
    """Guard against a checker that passes because it finds nothing."""
    modules = _modules()
    assert {"qaopt.kernels", "qaopt.approx", "qaopt.app_spec.hashing"} <= set(modules)
    assert any(_imports(m, p, modules) for m, p in modules.items() if m.startswith("qaopt.kernels."))
