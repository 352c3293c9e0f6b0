"""The application spec: schema, path resolution, and a clear error for every class of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from qaopt.app_spec import SpecError, load, load_entry_point
from qaopt.app_spec.entrypoints import EntryPointError
from qaopt.cli import main

EXAMPLE_SPEC = Path(__file__).resolve().parents[1] / "examples" / "cropfollow.yaml"


def _example() -> dict:
    return yaml.safe_load(EXAMPLE_SPEC.read_text())


def _write(tmp_path: Path, data: dict | str, name: str = "app.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _problems(path: Path, **kwargs) -> list[str]:
    with pytest.raises(SpecError) as info:
        load(path, **kwargs)
    return [str(p) for p in info.value.problems]


def test_example_spec_is_complete():
    spec = load(EXAMPLE_SPEC)
    assert spec.app.name == "cropfollow"
    assert set(spec.nns) == {"heading", "distance"}
    assert spec.nns["heading"].error_metric.kind == "l1"
    assert [a.key for a in spec.calibration.space] == ["heading", "distance"]
    assert spec.knobs_for("distance")["pruning"]["round_to"] == 8
    assert (spec.qos.metric, spec.qos.max, spec.qos.min) == ("collisions_per_100m", 0.0, None)
    assert spec.source == EXAMPLE_SPEC.resolve()


def test_relative_paths_resolve_against_the_spec_folder(tmp_path, monkeypatch):
    data = _example()
    (tmp_path / "w" / "models").mkdir(parents=True)
    (tmp_path / "w" / "models" / "heading.pt").write_bytes(b"weights")
    data["nns"]["heading"]["weights"] = "models/heading.pt"
    data["search"]["storage"] = "studies/optuna.db"
    data["output"] = {"dir": "out", "cache_dir": "cache"}
    data["target"]["tuning"]["database"] = "tuning"
    path = _write(tmp_path / "w", data)
    monkeypatch.chdir("/")
    spec = load(path)
    base = (tmp_path / "w").resolve()
    assert spec.nns["heading"].weights == base / "models" / "heading.pt"
    assert spec.search.storage == f"sqlite:///{base / 'studies' / 'optuna.db'}"
    assert spec.output.dir == base / "out"
    assert spec.output.cache_dir == base / "cache"
    assert spec.target.tuning.database == base / "tuning"


def test_absolute_and_server_urls_are_kept(tmp_path):
    data = _example()
    data["search"]["storage"] = "postgresql+psycopg://u:p@db.example/qaopt"
    spec = load(_write(tmp_path, data))
    assert spec.search.storage == "postgresql+psycopg://u:p@db.example/qaopt"


def test_content_hash_ignores_output_but_not_knobs(tmp_path):
    data = _example()
    base = load(_write(tmp_path, data, "a.yaml")).content_hash()
    data["output"]["dir"] = "elsewhere"
    assert load(_write(tmp_path, data, "b.yaml")).content_hash() == base
    data["approximations"]["all"]["pruning"]["ratio"] = [0.0, 0.5]
    assert load(_write(tmp_path, data, "c.yaml")).content_hash() != base


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    path = _write(tmp_path, "app:\n  name: x\n nns: [\n")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:3:2: YAML syntax error")


def test_not_a_mapping(tmp_path):
    (problem,) = _problems(_write(tmp_path, "- just\n- a list\n"))
    assert "must be a YAML mapping" in problem


def test_missing_file_and_folder(tmp_path):
    assert "spec file not found" in _problems(tmp_path / "nope.yaml")[0]
    assert "is a folder" in _problems(tmp_path)[0]


def test_unknown_field_suggests_the_nearest_name(tmp_path):
    data = _example()
    data["calibration"]["budgt"] = data["calibration"].pop("budget")
    data["nns"]["heading"]["eror_metric"] = data["nns"]["heading"].pop("error_metric")
    problems = _problems(_write(tmp_path, data))
    assert any("calibration.budgt: unknown field; did you mean 'budget'?" in p for p in problems)
    assert any("nns.heading.eror_metric: unknown field; did you mean 'error_metric'?" in p for p in problems)
    assert any("nns.heading.error_metric: required field is missing" in p for p in problems)


def test_wrong_type_and_out_of_range_name_the_dotted_path_and_line(tmp_path):
    data = _example()
    data["qos"]["acceptance"]["confidence"] = 1.5
    data["nns"]["distance"]["input_shape"] = [1, 3, "wide", 320]
    data["calibration"]["strategy"] = "bisect search"  # no name at all; a misspelt one is qaopt.spec's to find
    path = _write(tmp_path, data)
    problems = _problems(path)
    text = path.read_text().splitlines()
    confidence = next(p for p in problems if "qos.acceptance.confidence" in p)
    line = int(confidence.split(":")[1])
    assert text[line - 1].strip().startswith("confidence:")
    assert "less than 1" in confidence and "(got 1.5)" in confidence
    assert any("nns.distance.input_shape.2" in p and "'wide'" in p for p in problems)
    assert any("calibration.strategy" in p and "should match pattern" in p for p in problems)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["calibration"]["space"][1].update(nn="distanse"), "no NN named 'distanse'"),
        (lambda d: d["calibration"]["space"][0].update(min=40.0), "empty error range"),
        (lambda d: d["calibration"].update(budget=0), "calibration.budget: Input should be greater than 0"),
        (lambda d: d["approximations"].update(steering={}), "approximations.steering: no NN named 'steering'"),
        (lambda d: d["nns"]["heading"]["error_metric"].update(output="yaw"), "'yaw' is not one of the outputs"),
        (lambda d: d["qos"].pop("max"), "give the goal for 'collisions_per_100m'"),
        (lambda d: d["qos"]["acceptance"].update(min_trials=500), "min_trials (500) must not exceed max_trials"),
        (lambda d: d["target"].update(device="rpc"), "needs an 'rpc' section"),
        (lambda d: d["evaluator"]["simulator"].update(env_id="CropFollow-v0"), "evaluator.simulator.env_id: removed"),
        (lambda d: d["nns"]["heading"].update(model="not an entry point"), "expected an entry point"),
        (lambda d: d["app"].update(name="crop follow"), "app.name: String should match pattern"),
        (lambda d: d["calibration"]["space"].append({"nn": "heading", "max": 5.0}), "an axis appears twice"),
        (lambda d: d.update(training={"precision": "fp16"}), "training.precision: Input should be 'auto', 'fp32' or"),
    ],
)
def test_bad_values_are_named(tmp_path, edit, expected):
    data = _example()
    edit(data)
    problems = _problems(_write(tmp_path, data))
    assert any(expected in p for p in problems), problems


def test_missing_weights_file(tmp_path):
    data = _example()
    data["nns"]["heading"]["weights"] = "weights/heading.pt"
    (problem,) = _problems(_write(tmp_path, data))
    assert "nns.heading.weights: file not found" in problem and str(tmp_path / "weights" / "heading.pt") in problem


def test_duplicate_keys_are_reported(tmp_path):
    text = EXAMPLE_SPEC.read_text().replace("  budget: 20", "  budget: 20\n  budget: 30")
    (problem,) = _problems(_write(tmp_path, text))
    assert "calibration.budget: duplicate key" in problem


def test_entry_points_name_module_and_attribute(tmp_path):
    data = _example()
    data["nns"]["heading"]["model"] = "qaopt.no_such_module:net"
    data["nns"]["distance"]["model"] = "qaopt.app_spec:no_such_net"
    problems = _problems(_write(tmp_path, data), check_entry_points=True)
    assert any("nns.heading.model" in p and "module 'qaopt.no_such_module' does not import" in p for p in problems)
    assert any("nns.distance.model" in p and "has no attribute 'no_such_net'" in p for p in problems)


def test_load_entry_point():
    assert load_entry_point("qaopt.app_spec:load") is load
    assert load_entry_point("qaopt.app_spec.schema:AppSpec.model_validate")
    with pytest.raises(EntryPointError, match="has no attribute 'nope'"):
        load_entry_point("qaopt.app_spec:nope")


def test_cli_validate_ok(capsys):
    with pytest.raises(SystemExit) as info:
        main(["validate", str(EXAMPLE_SPEC)])
    assert info.value.code == 0
    assert "ok" in capsys.readouterr().out


def test_cli_validate_bad_spec_exits_2_with_one_line_per_problem(tmp_path, capsys):
    data = _example()
    data["calibration"]["budgt"] = data["calibration"].pop("budget")
    data["qos"]["acceptance"]["confidence"] = 2
    path = _write(tmp_path, data)
    with pytest.raises(SystemExit) as info:
        main(["validate", "--no-imports", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith(f"error: {path}:") for line in err)
    assert "Traceback" not in "\n".join(err)


def test_cli_debug_shows_the_traceback(tmp_path):
    with pytest.raises(SpecError):
        main(["--debug", "validate", str(tmp_path / "missing.yaml")])


def test_removed_env_id_is_placed_at_its_line_and_says_what_to_do(tmp_path):
    """`evaluator.simulator.env_id` was removed: a spec that still has it is told to wrap the environment."""
    data = _example()
    data["evaluator"]["simulator"] = {"env_id": "CropFollow-v0"}
    path = _write(tmp_path, data)
    (problem,) = _problems(path)
    line = int(problem.split(":")[1])
    assert path.read_text().splitlines()[line - 1].strip().startswith("env_id:")
    assert "evaluator.simulator.env_id: removed" in problem
    assert "entry_point: module:Class" in problem and "docs/tutorial.md" in problem
    assert "unknown field" not in problem and "required field" not in problem
