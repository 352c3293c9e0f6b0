"""A spec's ``plugins``: a user's backend or approximation pass, registered by a module beside the spec, named from YAML.

Run as a user would: ``qaopt validate`` on a spec in a folder of its own, whose
``plugins: [...]`` names a module in that folder (no ``PYTHONPATH``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from qaopt.approx.passes import unregister_pass
from qaopt.cli import main
from qaopt.kernels import registry

TINY = Path(__file__).resolve().parent / "apps" / "tiny.yaml"

# A plugin only has to register; what the backend and the pass do is tested in
# tests/test_kernels_registry.py and tests/test_approx_passes.py.
BACKEND_PLUGIN = """
from qaopt import kernels

kernels.register_backend("eager-plugin", lambda **options: kernels.get_backend("torch"), variants=("fast",))
"""

PASS_PLUGIN = """
from qaopt.approx.passes import ApproximationPass, PassConfig, PassKnobs, Range, register_pass


class Config(PassConfig):
    decimals: Range(int, 0, low_open=True) = (1, 3)


@register_pass
class RoundingPass(ApproximationPass):
    name, Config, Knobs = "plugin_rounding", Config, PassKnobs
"""


@pytest.fixture
def app_folder(tmp_path, monkeypatch):
    """A folder with a plugin module; registrations made through it vanish after the test."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    folder = tmp_path / "robot"
    folder.mkdir()
    (folder / "robot_backends.py").write_text(textwrap.dedent(BACKEND_PLUGIN))
    (folder / "robot_passes.py").write_text(textwrap.dedent(PASS_PLUGIN))
    yield folder
    unregister_pass("plugin_rounding")
    import sys

    for module in ("robot_backends", "robot_passes"):
        sys.modules.pop(module, None)


def _spec(folder: Path, edit) -> Path:
    data = yaml.safe_load(TINY.read_text())
    edit(data)
    path = folder / "app.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _validate(capsys, path: Path) -> tuple[int, str, list[str]]:
    with pytest.raises(SystemExit) as info:
        main(["validate", "--no-imports", str(path)])
    out = capsys.readouterr()
    return info.value.code, out.out, out.err.strip().splitlines()


def test_a_backend_registered_by_a_plugin_is_usable_from_yaml(app_folder, capsys):
    def edit(d):
        d["plugins"] = ["robot_backends"]
        d["target"]["backend"] = "eager-plugin[fast]"

    code, out, err = _validate(capsys, _spec(app_folder, edit))
    assert code == 0, err
    assert "target cpu/eager-plugin[fast]" in out


def test_a_misspelt_backend_is_a_located_error(app_folder, capsys):
    def edit(d):
        d["plugins"] = ["robot_backends"]
        d["target"]["backend"] = "eager-plugn"

    path = _spec(app_folder, edit)
    code, _, err = _validate(capsys, path)
    assert code == 2 and len(err) == 1, err
    (line,) = err
    assert line.startswith(f"error: {path.resolve()}:") and ": target.backend: no backend named 'eager-plugn'" in line
    assert "eager-plugin" in line and "plugins" in line  # the registered names, and how to add one
    where = int(line.removeprefix(f"error: {path.resolve()}:").split(":")[0])
    assert path.read_text().splitlines()[where - 1].strip() == "backend: eager-plugn"


def test_a_backend_without_its_plugin_is_unknown(app_folder, capsys):
    code, _, err = _validate(capsys, _spec(app_folder, lambda d: d["target"].update(backend="eager-plugin")))
    assert code == 2 and "target.backend: no backend named 'eager-plugin'" in err[0]


def test_a_pass_registered_by_a_plugin_is_checked_against_its_config(app_folder, capsys):
    def edit(d, decimals):
        d["plugins"] = ["robot_passes"]
        d["approximations"]["all"]["plugin_rounding"] = {"decimals": decimals}

    code, _, err = _validate(capsys, _spec(app_folder, lambda d: edit(d, [1, 3])))
    assert code == 0, err
    code, _, err = _validate(capsys, _spec(app_folder, lambda d: edit(d, [0, 3])))
    assert code == 2 and ": approximations.all.plugin_rounding.decimals: must be [lo, hi] with 0 < lo <= hi" in err[0]


def test_a_plugin_that_does_not_import_is_a_located_error(app_folder, capsys):
    (app_folder / "broken_plugin.py").write_text("raise RuntimeError('no licence for the compiler')\n")

    def edit(d):
        d["plugins"] = ["robot_backendz", "broken_plugin"]

    path = _spec(app_folder, edit)
    code, _, err = _validate(capsys, path)
    assert code == 2 and len(err) == 2, err
    assert ": plugins.0: plugin 'robot_backendz': module 'robot_backendz' does not import" in err[0]
    assert ": plugins.1: plugin 'broken_plugin': importing module 'broken_plugin' raised RuntimeError: " \
           "no licence for the compiler" in err[1]
