"""The robot's light install (docs/field.md): qaopt without its dependencies, plus only the
field logger's (``requirements-field.txt``), in a fresh virtual environment.

The fresh environment never sees this one's packages (no ``--system-site-packages``). With
``QAOPT_TEST_LIGHT_INSTALL=1`` (CI, which has PyPI) it installs exactly as the docs say:
``pip install --no-deps`` of a qaopt wheel built from this checkout, then ``pip install -r
requirements-field.txt``. Offline, the same requirements are resolved against the
distributions installed here and only those are placed in the fresh environment, so the
test runs anywhere. Either way, torch, PyYAML, numpy and the rest must not be importable
there, and a field session through ``qaopt-field`` and the API must work, a ROS 2 bag included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "requirements-field.txt"
HEAVY = ("torch", "tvm", "onnxruntime", "onnx", "numba", "numpy", "scipy", "yaml", "optuna",
         "gymnasium", "sklearn", "matplotlib", "torch_pruning", "xgboost")
SPEC_MODULES = ("qaopt.app_spec.loader", "qaopt.app_spec.schema", "qaopt.spec", "qaopt.calibrate",
                "qaopt.approx", "qaopt.kernels", "qaopt.simulators")
ROBOT_MODULES = ("qaopt.field", "qaopt.field.summary", "qaopt.field.transfer", "qaopt.commands.field")
LOADER_MODULES = tuple(m for m in SPEC_MODULES if m != "qaopt.app_spec.schema")
"""What reading a bag must not load: its mapping is a section of the spec's schema (pydantic only), and
the YAML loader, the spec checks and the optimizer's components stay out."""
BAG_MODULES = ("qaopt.field.bag", "qaopt.field.ros_events", "qaopt.field.synthetic_bag")


def _requirements() -> list[str]:
    lines = (line.split("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return [line for line in lines if line]


def test_importing_the_robot_side_loads_no_heavy_module_and_no_spec_loader():
    script = textwrap.dedent(f"""
        import json, sys
        for name in {ROBOT_MODULES!r}:
            __import__(name)
        print(json.dumps(sorted(m for m in sys.modules  # the bag reader loads when a bag is imported
                                if m.split(".")[0] in {HEAVY + ("mcap", "mcap_ros2")!r}
                                or m.startswith({SPEC_MODULES!r}))))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_reading_bags_loads_no_heavy_module_and_no_spec_loader():
    script = textwrap.dedent(f"""
        import json, sys
        for name in {BAG_MODULES!r}:
            __import__(name)
        import mcap.reader, mcap_ros2.decoder, mcap_ros2.writer
        print(json.dumps(sorted(m for m in sys.modules
                                if m.split(".")[0] in {HEAVY!r} or m.startswith({LOADER_MODULES!r}))))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_requirements_file_lists_pyproject_requirements_only():
    """One source of truth for versions: every line is a dependency of pyproject.toml, verbatim."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert set(_requirements()) <= set(project["dependencies"])
    assert {canonicalize_name(Requirement(r).name) for r in _requirements()} == {
        "pydantic", "sqlalchemy", "typer", "rich", "mcap", "mcap-ros2-support"}
    assert project["scripts"]["qaopt-field"] == "qaopt.commands.field:main"


def _closure(requirements: list[str]) -> list[metadata.Distribution]:
    """The installed distributions that ``requirements`` need here (markers evaluated, no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        dist = metadata.distribution(req.name)
        assert dist.version in req.specifier, f"{req.name} {dist.version} installed, {req} required"
        found[name] = dist
        todo += [Requirement(r) for r in dist.requires or []]
    return list(found.values())


def _place(dists: list[metadata.Distribution], site: Path) -> None:
    """Put exactly these installed distributions (their RECORD files) into ``site``."""
    for dist in dists:
        for rel in dist.files or []:
            if rel.parts[0] == ".." or rel.suffix == ".pyc":
                continue
            dest = site / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                dest.symlink_to(Path(dist.locate_file(rel)).resolve())


def _wheel(tmp: Path) -> Path:
    """A qaopt wheel built from a copy of this checkout (the tree itself is left untouched)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pt")
    for folder in sorted({f for f in project["package-dir"].values()}):
        shutil.copytree(REPO / folder, src / folder, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(tmp / "wheels"), str(src)], check=True, timeout=300)
    (wheel,) = (tmp / "wheels").glob("qaopt-*.whl")
    return wheel


def test_a_field_session_runs_in_a_fresh_venv_with_only_the_light_set(tmp_path):
    wheel = _wheel(tmp_path)
    venv = tmp_path / "robot"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py, bindir = venv / "bin" / "python", venv / "bin"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps"]
    if os.environ.get("QAOPT_TEST_LIGHT_INSTALL") == "1":  # the documented commands, from PyPI
        subprocess.run([*pip, str(wheel)], check=True, timeout=300)
        subprocess.run([*pip[:-1], "-r", str(REQUIREMENTS)], check=True, timeout=600)
    else:  # offline: the same requirements, from the distributions installed here
        subprocess.run([*pip, "--no-index", str(wheel)], check=True, timeout=300)
        site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                            text=True).strip())
        _place(_closure(_requirements()), site)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QAOPT_FIELD_STORE")}
    db = str(tmp_path / "field.db")

    def run(*args: str, stdin: str | None = None) -> str:
        out = subprocess.run(list(args), input=stdin, capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout + out.stderr

    missing = run(str(py), "-c", f"import importlib.util; print([m for m in {HEAVY!r} if importlib.util.find_spec(m)])")
    assert missing.strip() == "[]"
    logged = run(str(bindir / "qaopt-field"), "log", "--store", db, "--app", "cf", "--condition", "crop=corn",
                 stdin="d 10\nc 12.5\nend -5\nend 40\n")
    assert "not logged" in logged and "ended: complete, 40.0 m" in logged
    run(str(py), "-c", textwrap.dedent(f"""
        from qaopt.field import Run
        with Run({db!r}, "cf") as run:
            run.progress(20.0)
            run.event("collision", distance_m=21.0)
            run.end(60.0)
    """))
    summary = run(str(bindir / "qaopt-field"), "summary", "--store", db)
    row = next(line for line in summary.splitlines() if "│ cf" in line)
    assert "100.0" in row and "2 [0.242, 7.22]" in row  # 2 collisions in 100 m, exact 95 % interval
    exported = json.loads(run(str(bindir / "qaopt-field"), "export", "--store", db))
    assert sorted(r["distance_m"] for r in exported) == [40.0, 60.0]
    leaked = run(str(py), "-c", textwrap.dedent(f"""
        import sys, qaopt.commands.field, qaopt.field.summary, qaopt.field.transfer
        print(sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r} or m.startswith({SPEC_MODULES!r})))
    """))
    assert leaked.strip() == "[]"
    # A ROS 2 bag, written there as rosbag2 writes one (two runs, odometry, a collision), then imported.
    bag = str(tmp_path / "day.mcap")
    run(str(py), "-c", textwrap.dedent(f"""
        from qaopt.field import ros_events
        from qaopt.field.synthetic_bag import SyntheticBag
        t0 = 1_780_000_000 * 10**9
        with SyntheticBag({bag!r}) as bag:
            bag.string("/qaopt/config", ros_events.config("3f2a9c", nn_errors={{"heading": 4.1}}), t0)
            for k in range(2):
                start = t0 + (1 + 100 * k) * 10**9
                bag.string("/qaopt/run", ros_events.run_start({{"weather": "dry"}}), start)
                for i in range(50 * 40 + 1):  # 40 s at 50 Hz and 0.5 m/s: 20 m
                    bag.odometry(start + i * 20_000_000, 0.01 * i, 0.0, 0.0, 0.5)
                bag.string("/qaopt/events", ros_events.event("collision"), start + 10**10)
                bag.string("/qaopt/run", ros_events.run_end(), start + 41 * 10**9)
    """))
    imported = run(str(bindir / "qaopt-field"), "import-bag", bag, "--store", db, "--app", "bagged")
    assert imported.strip().endswith("day.mcap: 2 run(s) imported, 0 already present"), imported
    again = run(str(bindir / "qaopt-field"), "import-bag", bag, "--store", db, "--app", "bagged")
    assert again.strip().endswith("0 run(s) imported, 2 already present"), again
    summary = run(str(bindir / "qaopt-field"), "summary", "--store", db, "--app", "bagged")
    row = next(line for line in summary.splitlines() if "│ bagged" in line)
    assert "3f2a9c" in row and "40.0" in row and "│          2 │" in row, summary
    leaked = run(str(py), "-c", textwrap.dedent(f"""
        import sys, qaopt.field.bag, qaopt.commands.field
        print(sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r} or m.startswith({LOADER_MODULES!r})))
    """))
    assert leaked.strip() == "[]"
