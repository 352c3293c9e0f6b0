"""Open registries: an error model, a region strategy and a backend's dtypes, each added by a plugin named from a spec.

The plugins are tests/plugins/*.py, named in a copy of tests/apps/tiny.yaml under
``plugins:`` exactly as a user names a module beside their spec; each test then uses
what its plugin registered (a calibration with the toy error model, a search with the
toy strategy, the quantization pass's knob space on the toy backend). Registrations
end with the test, so no other test sees them.
"""

from __future__ import annotations

import pickle
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from qaopt.app_spec import SpecError
from qaopt.approx import RUNNABLE_ON, ApproxError, KnobSpace, Knobs, SearchLimits
from qaopt.calibrate import (
    CERTIFIERS,
    ERROR_MODELS,
    STRATEGIES,
    AcceptanceTest,
    Axis,
    CalibrationError,
    ErrorRegion,
    ErrorSpace,
    Verdict,
    make_error_model,
    register_certifier,
    register_error_model,
    unregister_certifier,
    unregister_error_model,
    unregister_strategy,
)
from qaopt.calibrate.region import Observation
from qaopt.kernels import Target, backend_devices, backends_running, unregister_backend
from qaopt.region_calibration import build_calibration, calibrate_spec
from qaopt.spec import load_spec
from qaopt.target_fit import fit_target

TESTS = Path(__file__).resolve().parent
TINY = TESTS / "apps" / "tiny.yaml"
PLUGINS = TESTS / "plugins"
REGISTERED = {"toy_error_model": lambda: unregister_error_model("uniform"),
              "toy_strategy": lambda: unregister_strategy("diagonal"),
              "toy_backend": lambda: unregister_backend("toy-npu")}
"""Each plugin module, and how to undo what it registers."""


@pytest.fixture
def plugins(monkeypatch, tmp_path):
    """The plugins importable (as if beside the spec); whatever they register is gone after the test."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    yield
    for module, undo in REGISTERED.items():
        undo()
        sys.modules.pop(module, None)  # the next test's import registers again


def _spec(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(TINY.read_text())
    edit(data)
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _located(path: Path, field: str, edit) -> str:
    """The one problem ``load_spec`` reports for the spec ``edit`` makes at ``path``, found at ``field``'s line."""
    with pytest.raises(SpecError) as err:
        load_spec(_spec(path.parent, edit))
    (problem,) = err.value.problems
    text = str(problem)
    line = int(re.search(r":(\d+):\d+: ", text)[1])
    assert path.read_text().splitlines()[line - 1].strip().startswith(f"{field}:"), text
    return text


# ------------------------------------------------------------------ error model


def test_an_error_model_registered_by_a_plugin_calibrates(plugins, tmp_path):
    def edit(d):
        d["plugins"] = ["toy_error_model"]
        d["calibration"].update(error_model="uniform", budget=2)

    spec = load_spec(_spec(tmp_path, edit))
    cal = build_calibration(spec, cache_dir=tmp_path / "cache")
    assert {nn: m.config() for nn, m in cal.models.items()} == {nn: {"model": "uniform", "metric": "l1"}
                                                                for nn in ("a", "b")}
    # The toy's injectors are what the simulator runs: uniform errors of the point's L1, within [-a, a].
    inject = cal.injectors({"a": 0.2, "b": 0.1})["a"]
    truth = np.zeros(20_000)
    errors = inject(truth, np.random.default_rng(0), 0)
    assert np.abs(errors).mean() == pytest.approx(0.2, rel=0.02) and np.abs(errors).max() <= 0.4
    assert pickle.loads(pickle.dumps(inject)) == inject  # a process pool's workers receive it pickled
    # A detector under the toy model flips independently per frame, as the model declares (detector_bursts).
    detector = make_error_model("uniform", "miss_rate")
    assert (detector.error_model, detector.miss_burst_steps, detector.false_alarm_burst_steps) == ("uniform", 1.0, 1.0)
    region, _ = calibrate_spec(spec, out=tmp_path / "out", calibration=cal)
    assert region.evaluations == 2 and region.info["error_models"]["a"]["model"] == "uniform"
    assert region.observations[0].verdict is Verdict.VALID  # the reference point: no error


def test_an_error_model_without_its_plugin_is_a_located_error(plugins, tmp_path):
    path = tmp_path / "app.yaml"
    text = _located(path, "error_model", lambda d: d["calibration"].update(error_model="uniform"))
    assert "calibration.error_model: no error model named 'uniform'; registered: gaussian, ar1, ar1-profile, empirical, shaped" \
        in text and "plugins: [module]" in text


def test_an_error_model_class_must_declare_what_it_needs():
    class Incomplete:
        name = "incomplete"

    with pytest.raises(CalibrationError, match="Incomplete does not declare needs_residuals, detector_bursts, fit"):
        register_error_model(Incomplete)
    assert "incomplete" not in ERROR_MODELS


# ------------------------------------------------------------------ region strategy


def test_a_strategy_registered_by_a_plugin_charts_the_region(plugins, tmp_path):
    def edit(d):
        d["plugins"] = ["toy_strategy"]
        d["calibration"].update(strategy="diagonal", budget=4)

    spec = load_spec(_spec(tmp_path, edit))
    region, _ = calibrate_spec(spec, out=tmp_path / "out")
    assert region.info["strategy"] == "diagonal" and "diagonal" in STRATEGIES
    units = [region.space.to_unit(o.errors) for o in region.observations]
    assert len(units) >= 2 and all(np.allclose(u, u[0]) for u in units)  # every point on the diagonal
    assert [u[0] for u in units] == sorted(u[0] for u in units)  # asked from the reference up


def test_a_misspelt_strategy_lists_the_registered_ones_at_its_line(plugins, tmp_path):
    path = tmp_path / "app.yaml"

    def edit(d):
        d["plugins"] = ["toy_strategy"]
        d["calibration"]["strategy"] = "diagonl"

    text = _located(path, "strategy", edit)
    assert "calibration.strategy: no region strategy named 'diagonl'; registered: bisect, monotone, active, " \
           "boundary, diagonal" in text


def test_a_registered_certifier_judges_the_region():
    class Nothing:
        """Certifies nothing: the most cautious certifier there is."""

        def model(self, region):
            return region

        def certified(self, region, U):
            return np.zeros(len(U), dtype=bool)

    space = ErrorSpace([Axis("a", 1.0)])
    try:
        register_certifier("nothing", Nothing())
        region = ErrorRegion(space, AcceptanceTest(), [Observation({"a": 0.5}, 32, 0, Verdict.VALID)],
                             certifier="nothing")
        assert not region.contains({"a": 0.1})
        assert ErrorRegion(space, AcceptanceTest(), region.observations, certifier="per-point").contains({"a": 0.1})
    finally:
        unregister_certifier("nothing")
    assert list(CERTIFIERS) == ["pooled", "per-point"]
    with pytest.raises(CalibrationError, match="calibration.certifier: no certifier named 'nothing'; registered: "
                                               "pooled, per-point"):
        ErrorRegion(space, AcceptanceTest(), certifier="nothing")


# ------------------------------------------------------------------ backend dtypes


OLD_TABLE = {
    "fp32": ("torch", "torch-compile", "onnxruntime", "openvino", "tvm"),
    "bf16": ("torch", "torch-compile", "openvino"),
    "fp16": ("torch", "torch-compile", "tvm"),  # TVM's on a GPU only (tests/test_tvm_cuda.py)
    "int8": ("onnxruntime", "openvino", "tvm"),
}
"""Which built-in backends ran each dtype when approx listed them by name: the declarations must give the same."""


def test_the_built_in_backends_declare_the_old_table():
    # Other tests' backends (registered for the whole session, declaring the default fp32) are left out.
    builtin = {name for names in OLD_TABLE.values() for name in names} | {"auto"}

    def builtins_running(dtype: str) -> tuple[str, ...]:
        return tuple(b for b in backends_running(dtype) if b in builtin)

    assert {d: tuple(b for b in RUNNABLE_ON[d] if b in builtin) for d in OLD_TABLE} == OLD_TABLE
    assert {d: builtins_running(d) for d in OLD_TABLE} == OLD_TABLE
    assert builtins_running("fp8") == ()


def test_a_backend_registered_by_a_plugin_runs_the_dtypes_it_declares(plugins, tmp_path):
    def edit(d):
        d["plugins"] = ["toy_backend"]
        d["target"]["backend"] = "toy-npu"
        d["approximations"]["all"]["quantization"] = {"dtypes": ["fp32", "bf16", "int8"]}

    spec = load_spec(_spec(tmp_path, edit))
    assert "toy-npu" in RUNNABLE_ON["int8"] and "toy-npu" not in RUNNABLE_ON["bf16"]
    assert backend_devices("toy-npu") == ("cpu",)
    # The search on the toy backend keeps int8 and leaves out bf16, which it does not run.
    (left_out,) = fit_target(spec)
    assert str(left_out).startswith("bf16 left out of the search: no backend here runs bf16 on cpu (backends: toy-npu)")
    space = KnobSpace.from_section(spec.knobs_for("a"), SearchLimits(excluded_dtypes=(left_out.dtype,)))
    assert space.choices("dtype") == ["fp32", "int8"]
    Knobs(dtype="int8").check("a", "toy-npu")
    with pytest.raises(ApproxError, match="bf16 has no kernels on backend 'toy-npu'"):
        Knobs(dtype="bf16").check("a", "toy-npu")
    # On torch, which declares no int8, int8 is left out instead.
    on_torch = spec.model_copy(update={"target": spec.target.model_copy(update={"backend": "torch"})})
    assert "int8" in {v.dtype for v in fit_target(on_torch)}


def test_a_device_the_backend_does_not_declare_is_a_located_error(tmp_path):
    path = tmp_path / "app.yaml"
    text = _located(path, "device", lambda d: d["target"].update(backend="openvino", device="cuda"))
    assert "target.device: backend 'openvino' runs on cpu, not on cuda" in text


def test_target_backends_lists_what_auto_races_and_is_checked_at_its_line(tmp_path):
    path = tmp_path / "app.yaml"

    def racing(*names, backend="auto", device="cpu"):
        return lambda d: d["target"].update(backend=backend, backends=list(names), device=device)

    def item_problem(edit) -> str:
        """The one problem of the spec ``edit`` makes, which must sit at a line of target.backends' list."""
        with pytest.raises(SpecError) as err:
            load_spec(_spec(tmp_path, edit))
        (problem,) = err.value.problems
        line = int(re.search(r":(\d+):\d+: ", str(problem))[1])
        assert path.read_text().splitlines()[line - 1].strip().startswith("- "), problem
        return str(problem)

    target = Target.from_spec(load_spec(_spec(tmp_path, racing("torch", "onnxruntime"))).target)
    assert target.backends == ("torch", "onnxruntime") and target.to_dict()["backends"] == ["torch", "onnxruntime"]
    # A target without the list keeps the cache keys it had.
    assert "backends" not in Target.from_spec(load_spec(_spec(tmp_path, lambda d: None)).target).to_dict()
    # What the race cannot run is left out of the search: among torch alone, nothing runs int8.
    (left_out,) = fit_target(load_spec(_spec(tmp_path, lambda d: (
        racing("torch")(d), d["approximations"]["all"].update(quantization={"dtypes": ["fp32", "int8"]})))))
    assert str(left_out).startswith("int8 left out of the search: no backend here runs int8 on cpu (backends: torch)")
    assert "'backends' lists what backend 'auto' measures, but backend is 'torch'" in _located(
        path, "target", racing("onnxruntime", backend="torch"))
    assert "target.backends.1: no backend named 'tensorrt'" in item_problem(racing("torch", "tensorrt"))
    assert "target.backends.1: backend 'openvino' runs on cpu, not on cuda; drop it from target.backends" in (
        item_problem(racing("torch", "openvino", device="cuda")))
