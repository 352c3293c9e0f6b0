"""benchmarks/real_result.py's figures: which seeds accepted the aware configuration, and whether its validated NNs
are inside the region by their own errors (a rebuilt configuration by its rebuilt ones)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from qaopt.closed_loop import ACCEPTANCE_SEED_BASE, VALIDATION_SEED_BASE

_path = Path(__file__).resolve().parents[1] / "benchmarks" / "real_result.py"
_spec = importlib.util.spec_from_file_location("real_result", _path)
real_result = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(real_result)

SPEC = {"nns": {"heading": {"args": {"backbone": "resnet18"}}}, "target": {"device": "cpu", "threads": 2},
        "evaluator": {"simulator": {"params": {"estimator": "ekf"}}}}


def _validation(trial, seed_base, passes=50):
    return {"trial": trial, "runs": 50, "passes": passes, "verdict": "valid" if passes == 50 else "invalid",
            "seed_base": seed_base}


def _result(**extra):
    aware = {"trial": 7, "in_region": True, "latency_ms": 1.0, "schedule": "sequential", "nns": {}}
    return {"aware": aware, "speedups": {"aware_over_agnostic": 3.0},
            "validations": [_validation(7, VALIDATION_SEED_BASE)],
            "agnostic_converged": {"trials": 40, "units": ["heading"], "best_ms_by_trial": [2.0, 1.5]}, **extra}


def test_fresh_seeds_accept_only_the_chosen_configuration():
    fresh = real_result.real_result(_result(acceptance=_validation(7, ACCEPTANCE_SEED_BASE)), SPEC)
    assert fresh["acceptance_seeds"] == "fresh" and fresh["acceptance"]["collision_free_runs"] == 50
    assert fresh["agnostic_converged"]["best_ms_by_trial"] == [2.0, 1.5]
    other = real_result.real_result(_result(acceptance=_validation(3, ACCEPTANCE_SEED_BASE)), SPEC)
    assert other["acceptance_seeds"] == "selection" and other["acceptance"] is None
    assert real_result.real_result(_result(), SPEC)["acceptance_seeds"] == "selection"


def test_a_baseline_the_tolerance_test_could_not_resolve_is_named_in_the_figures():
    assert real_result.real_result(_result(), SPEC)["agnostic_unresolved"] == {}
    unresolved = {"distance": {"trial": 30, "data_needed": 3.4}}
    figures = real_result.real_result(_result(agnostic_rule={"unresolved": unresolved}), SPEC)
    assert figures["agnostic_unresolved"] == unresolved


def test_a_rebuilt_configuration_is_in_the_region_only_by_its_rebuilt_errors():
    assert real_result.real_result(_result(), SPEC)["validated_in_region"] is True
    left = real_result.real_result(_result(rebuilt=[{"trial": 7, "feasible": False}]), SPEC)
    assert left["validated_in_region"] is False and left["rebuilt"] is True
    kept = real_result.real_result(_result(rebuilt=[{"trial": 2, "feasible": False}]), SPEC)
    assert kept["validated_in_region"] is True and kept["rebuilt"] is False


def _nn(candidate, **backends):
    return {"candidate": candidate, "backends_measured": backends}


def test_the_ratio_on_each_backend_counts_a_merged_nn_once_and_skips_a_backend_that_could_not_run_an_nn():
    aware = {"trial": 7, "in_region": True, "latency_ms": 2.5, "schedule": "sequential",
             "nns": {"heading": _nn("m", openvino=2.0, onnxruntime=3.0, torch="bf16: not on this CPU"),
                     "distance": _nn("m", openvino=2.0, onnxruntime=3.0, torch="bf16: not on this CPU")}}
    agnostic = {"latency_ms": 11.5, "schedule": "parallel", "schedules_ms": {"sequential": 7.7, "parallel": 11.5},
                "nns": {"heading": _nn("h", openvino=4.0, onnxruntime=14.0, torch=20.0),
                        "distance": _nn("d", openvino=5.0, onnxruntime=16.0, torch=21.0)}}
    figures = real_result.real_result(_result(aware=aware, agnostic=agnostic), SPEC)
    assert figures["per_backend"] == {
        "onnxruntime": {"aware_ms": 3.0, "agnostic_ms": 30.0, "aware_over_agnostic": 10.0},
        "openvino": {"aware_ms": 2.0, "agnostic_ms": 9.0, "aware_over_agnostic": 4.5}}
    assert figures["frames_ms"]["agnostic"] == {"latency_ms": 11.5, "schedule": "parallel",
                                                "schedules_ms": {"sequential": 7.7, "parallel": 11.5}}
    assert figures["frames_ms"]["reference"] is None
    assert real_result.real_result(_result(), SPEC)["per_backend"] == {}


def test_spec_overrides_set_dotted_fields_and_a_malformed_one_names_the_form(tmp_path):
    """The device run's spec: the estimator, and fields such as the backends raced on the device host's CPU."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "target": {"device": "cpu", "backend": "onnxruntime", "threads": 2}}))
    derived = real_result._spec_for(spec, "none", tmp_path, ["target.backend=auto",
                                                              "target.backends=[openvino, onnxruntime]"])
    data = yaml.safe_load(derived.read_text())
    assert data["target"] == {"device": "cpu", "backend": "auto", "threads": 2, "backends": ["openvino", "onnxruntime"]}
    assert data["evaluator"]["simulator"]["params"]["estimator"] == "none"
    with pytest.raises(SystemExit, match="dotted.key=value"):
        real_result._spec_for(spec, None, tmp_path, ["target.backend"])
