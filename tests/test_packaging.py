"""The components install as sub-packages of `qaopt`, never as top-level modules."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("app_spec", "calibrate", "approx", "kernels", "simulators")


def test_editable_install_maps_each_folder_into_qaopt():
    for name in COMPONENTS:
        module = importlib.import_module(f"qaopt.{name}")
        assert Path(module.__file__).parent == REPO / name
        assert importlib.util.find_spec(name) is None, f"a top-level module {name!r} is importable"


def test_built_package_imports_from_its_own_install(tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(REPO)],
        check=True,
        cwd=tmp_path,
    )
    installed = {p.name for p in site.iterdir()}
    assert "qaopt" in installed
    assert not installed & set(COMPONENTS), f"top-level modules installed: {installed & set(COMPONENTS)}"
    probe = (
        "import importlib, qaopt.kernels, qaopt.calibrate, qaopt.simulators.cropfollow;"
        "print(qaopt.kernels.__file__);"
        f"print([importlib.util.find_spec(n) for n in {COMPONENTS!r}])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    ).stdout.splitlines()
    assert out[0] == str(site / "qaopt" / "kernels" / "__init__.py")
    assert out[1] == str([None] * len(COMPONENTS))
