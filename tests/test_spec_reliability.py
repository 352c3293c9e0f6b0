"""Specs with one thing wrong must fail ``qaopt validate`` at once, not break or hang later, hit as a user would.

Each case runs the command a user runs (``qaopt validate``, ``qaopt calibrate``) on a
copy of the tiny test application's spec with one thing wrong, and checks the one
clear line it prints (``file:line:col: field: ...``), the exit status 2, and that no
work was started.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from specs import TINY, line_of, one_error, run_qaopt, tiny_spec


@pytest.mark.parametrize(("edit", "field", "message"), [
    (lambda d: d["qos"].update(max=float("nan")), "qos.max", "Input should be a finite number (got nan)"),
    (lambda d: d["calibration"]["space"][0].update(max=float("inf")), "calibration.space.0.max",
     "Input should be a finite number (got inf)"),
    (lambda d: d["qos"]["acceptance"].update(confidence=float("nan")), "qos.acceptance.confidence",
     "finite number"),
    (lambda d: d["evaluator"]["simulator"].update(params={"steps": float("nan")}), "evaluator.simulator.params.steps",
     "nan is not a finite number"),
    (lambda d: d["nns"]["a"]["data"]["args"].update(scale=[1.0, float("-inf")]), "nns.a.data.args.scale",
     "-inf is not a finite number"),
    (lambda d: d["approximations"]["all"]["pruning"].update(ratio=[0.0, float("nan")]),
     "approximations.all.pruning.ratio", "finite"),
])
def test_nan_and_inf_anywhere_are_rejected_at_their_line(tmp_path, capsys, edit, field, message):
    path = tiny_spec(tmp_path, edit)
    error = one_error(capsys, path, "validate", "--no-imports")
    assert f": {field}: " in error and message in error, error
    assert field.split(".")[-1] in line_of(path, error)


@pytest.mark.parametrize(("edit", "field", "message"), [
    (lambda d: d["qos"]["acceptance"].update(max_trials=10**12), "qos.acceptance.max_trials",
     "at most 1000 runs per point"),
    (lambda d: d["calibration"].update(budget=10**9), "calibration.budget", "at most 100000 evaluations"),
    (lambda d: d["search"].update(trials=10**9), "search.trials", "at most 100000 trials"),
    (lambda d: d["target"].update(threads=10**6), "target.threads", "at most 1024 threads"),
    (lambda d: d["target"].update(tuning={"trials": 10**9}), "target.tuning.trials", "less than or equal to 100000"),
    (lambda d: d["nns"]["a"].update(input_shape=[1, 1, 8, 10**7]), "nns.a.input_shape.3", "at most 65536"),
])
def test_sizes_have_an_upper_bound(tmp_path, capsys, edit, field, message):
    error = one_error(capsys, tiny_spec(tmp_path, edit), "validate", "--no-imports")
    assert f": {field}: " in error and message in error, error
    assert error.count(str(10**12)) <= 1 and error.count(str(10**9)) <= 1  # the value once


def test_calibrate_with_a_huge_max_trials_is_a_spec_error_not_a_memory_error(tmp_path, capsys):
    path = tiny_spec(tmp_path, lambda d: d["qos"]["acceptance"].update(max_trials=10**12))
    error = one_error(capsys, path, "calibrate")
    assert "qos.acceptance.max_trials: at most 1000 runs per point" in error
    assert not (tmp_path / "cache").exists()  # nothing started


def test_a_billion_laughs_document_is_rejected_fast(tmp_path, capsys):
    lines = ["laughs:", "  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]  # 10**10 values
    path = tmp_path / "laughs.yaml"
    path.write_text(TINY.read_text() + "\n".join(lines) + "\n")
    start = time.monotonic()
    code, err, _ = run_qaopt(capsys, "validate", "--no-imports", str(path))
    assert time.monotonic() - start < 5
    assert code == 2 and err == [f"error: {path}: the YAML expands to more than 100000 values through its aliases "
                                 "(*name), as a 'billion laughs' document does; write the values out or use fewer "
                                 "nested aliases"]


def test_a_recursive_alias_is_rejected(tmp_path, capsys):
    path = tmp_path / "loop.yaml"
    path.write_text(TINY.read_text() + "loop: &loop [1, *loop]\n")
    error = one_error(capsys, path, "validate", "--no-imports")
    assert "an alias refers to a node that contains it" in error


def test_small_aliases_still_work(tmp_path, capsys):
    text = TINY.read_text().replace("args: {target: a}\n    input_shape", "args: &args {target: a}\n    input_shape")
    text = text.replace("data: {source: tinyapp:tiny_data, args: {target: a}}", "data: {source: tinyapp:tiny_data, args: *args}")
    path = tmp_path / "aliases.yaml"
    path.write_text(text)
    code, err, _ = run_qaopt(capsys, "validate", "--no-imports", str(path))
    assert code == 0, err


def test_cropfollow_params_are_checked_by_validate_without_running(example_spec_path, tmp_path, capsys):
    text = example_spec_path.read_text().replace("run_length_m: 100.0", "run_length_m: not-a-number")
    path = tmp_path / "cropfollow.yaml"
    path.write_text(text)
    error = one_error(capsys, path, "validate", "--no-application", "--no-shapes")
    assert ": evaluator.simulator.params.run_length_m: " in error
    assert "cropfollow parameter 'run_length_m': 'not-a-number' is not a finite number" in error
    assert line_of(path, error).strip() == "run_length_m: not-a-number"
    assert error.count("not-a-number") == 1


def test_calibrate_imports_every_entry_point_first_and_locates_its_errors(tmp_path, capsys):
    path = tiny_spec(tmp_path, lambda d: d["nns"]["b"].update(model="tinyapp:tiny_nett"))
    error = one_error(capsys, path, "calibrate")
    assert ": nns.b.model: entry point 'tinyapp:tiny_nett': module 'tinyapp' has no attribute 'tiny_nett'" in error
    assert line_of(path, error).strip() == "model: tinyapp:tiny_nett"
    assert not (tmp_path / "cache").exists()


def test_calibrate_locates_a_simulator_params_error(tmp_path, capsys):
    path = tiny_spec(tmp_path, lambda d: d["evaluator"]["simulator"].update(params={"stepz": 3}))
    error = one_error(capsys, path, "calibrate")
    assert ": evaluator.simulator.params: tinyapp:TinyEvaluator(**params) raised TypeError: " in error
    assert "'stepz'" in error


def test_an_axis_naming_an_unknown_nn_is_reported_with_its_line(tmp_path, capsys):
    path = tiny_spec(tmp_path, lambda d: d["calibration"]["space"][1].update(nn="c"))
    error = one_error(capsys, path, "validate", "--no-imports")
    assert error.endswith(": calibration.space.1.nn: no NN named 'c'; the spec's NNs are ['a', 'b']")
    assert "nn: c" in line_of(path, error)


def test_a_bad_value_is_printed_once(tmp_path, capsys):
    error = one_error(capsys, tiny_spec(tmp_path, lambda d: d["nns"]["a"].update(model="x")), "validate", "--no-imports")
    assert error.endswith("nns.a.model: expected an entry point 'package.module:attribute', got 'x'")


def test_modules_beside_the_spec_import_without_pythonpath(tmp_path, capsys):
    (tmp_path / "agvsim").mkdir()
    (tmp_path / "agvsim" / "__init__.py").write_text("")
    (tmp_path / "agvsim" / "sim.py").write_text("from tinyapp import TinyEvaluator as AGVEvaluator\n")
    path = tiny_spec(tmp_path, lambda d: d["evaluator"]["simulator"].update(entry_point="agvsim.sim:AGVEvaluator"))
    code, err, out = run_qaopt(capsys, "validate", "--no-shapes", str(path))
    assert code == 0, err
    assert "simulator TinyEvaluator keeps the application protocol" in out


def test_an_error_metric_that_cannot_be_calibrated_is_rejected_with_the_reason(tmp_path, capsys):
    path = tiny_spec(tmp_path, lambda d: d["nns"]["b"]["error_metric"].update(kind="max_abs"))
    error = one_error(capsys, path, "validate", "--no-imports")
    assert ": nns.b.error_metric.kind: 'max_abs' cannot be calibrated: an episode's largest error grows with its length" in error
    assert "use one of l1, rmse, mse" in error and "kind: max_abs" in line_of(path, error)


def test_an_input_shape_that_disagrees_with_the_data_is_found_by_validate(tmp_path, capsys):
    def three_channels(d):  # and not merged: NNs of one merge group must take one shape, a check of its own
        d["nns"]["b"].update(input_shape=[1, 3, 8, 8])
        d["search"].pop("merge")

    error = one_error(capsys, tiny_spec(tmp_path, three_channels), "validate", "--no-application")
    assert ": nns.b.input_shape: " in error and "(1, 8, 8)" in error and "(3, 8, 8)" in error


def test_outputs_that_disagree_with_the_nn_are_found_by_validate(tmp_path, capsys):
    def two_outputs(d):
        d["nns"]["a"]["outputs"] = [{"name": "a"}, {"name": "a2"}]

    error = one_error(capsys, tiny_spec(tmp_path, two_outputs), "validate", "--no-application")
    assert ": nns.a.outputs: one sample of the data gives an output of shape (1, 1)" in error
    assert "need shape (1, 2)" in error


def test_the_application_check_still_runs_in_validate(tmp_path, capsys):
    (tmp_path / "halfapp.py").write_text(textwrap.dedent("""
        from tinyapp import TinyEvaluator

        class Half(TinyEvaluator):
            nn_names = ("a",)
    """))
    path = tiny_spec(tmp_path, lambda d: d["evaluator"]["simulator"].update(entry_point="halfapp:Half"))
    error = one_error(capsys, path, "validate", "--no-shapes")
    assert ": evaluator.simulator.entry_point: 'halfapp:Half': Half.nn_names ('a',) lacks the spec's NN 'b'" in error
