"""``qaopt.check_application``: the shipped and the tiny application keep the protocol; broken ones are named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

import qaopt
from qaopt.app_spec import load
from qaopt.application import ApplicationError
from qaopt.calibrate import Application
from qaopt.calibrate.synthetic import SuperellipseApp
from qaopt.cli import main
from qaopt.simulators.cropfollow import CropFollowEvaluator
from tinyapp import TinyEvaluator

TINY = Path(__file__).resolve().parent / "apps" / "tiny.yaml"


@pytest.fixture(scope="module")
def tiny_spec():
    return load(TINY)


def test_cropfollow_keeps_the_protocol(example_spec_path):
    evaluator = CropFollowEvaluator(run_length_m=100.0, controller="mpc")
    assert isinstance(evaluator, Application)
    qaopt.check_application(evaluator, load(example_spec_path))


def test_tiny_app_keeps_the_protocol(tiny_spec):
    qaopt.check_application(TinyEvaluator(), tiny_spec)


def test_calibration_only_evaluator_passes_without_closed_loop():
    app = SuperellipseApp({"heading": 1.0}, steps=20)
    qaopt.check_application(app, metric="failed", closed_loop=False)
    with pytest.raises(ApplicationError, match=r"SuperellipseApp has no method evaluate_perception\(nns, seeds, "
                                               r"render_threads=1\); closed-loop validation"):
        qaopt.check_application(app, metric="failed")


class NoPerception:
    nn_names = ("a", "b")

    def evaluate(self, injectors, seeds):
        return TinyEvaluator().evaluate(injectors, seeds)


class ReturnsADict(TinyEvaluator):
    def evaluate(self, injectors, seeds):
        return {s: r for s, r in zip(seeds, super().evaluate(injectors, seeds))}


class MissesTheMetric(TinyEvaluator):
    def evaluate(self, injectors, seeds):
        return [{"crash": r["crashes"]} for r in super().evaluate(injectors, seeds)]


class ReturnsAString(TinyEvaluator):
    def evaluate_perception(self, nns, seeds, render_threads=1):
        return [{**r, "weather": "rain"} for r in super().evaluate_perception(nns, seeds, render_threads)]


class Noisy(TinyEvaluator):
    """Draws from a generator that is not seeded by the seeds."""

    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng()

    def evaluate(self, injectors, seeds):
        return [{**r, "crashes": self.rng.random()} for r in super().evaluate(injectors, seeds)]


class IgnoresInjectors(TinyEvaluator):
    def evaluate(self, injectors, seeds):
        return super().evaluate({}, seeds)


class IgnoresNNs(TinyEvaluator):
    def evaluate_perception(self, nns, seeds, render_threads=1):
        return super().evaluate_perception({}, seeds)


class Raises(TinyEvaluator):
    def evaluate(self, injectors, seeds):
        raise ValueError("the physics diverged")


class NoNames(TinyEvaluator):
    nn_names = None


class OtherNames(TinyEvaluator):
    nn_names = ("a", "c")


@pytest.mark.parametrize("app,message", [
    (NoPerception(), r"NoPerception has no method evaluate_perception\(nns, seeds, render_threads=1\)"),
    (ReturnsADict(), r"ReturnsADict.evaluate\(\{\}, seeds=\[0, 1\]\) returned a dict instead of a list"),
    (MissesTheMetric(), r"MissesTheMetric.evaluate\(\{\}, seeds=\[0, 1\]\) returned no finite 'crashes' for seed 0"),
    (ReturnsAString(), r"ReturnsAString.evaluate_perception\(\{\}, seeds=\[0, 1\], render_threads=1\) returned "
                       r"metric 'weather' = 'rain' for seed 0, not a real number"),
    (Noisy(), r"Noisy.evaluate\(\{\}, seeds=\[0, 1\]\) is not deterministic"),
    (IgnoresInjectors(), r"IgnoresInjectors.evaluate never called the injector of NN 'a'"),
    (IgnoresNNs(), r"IgnoresNNs.evaluate_perception never called NN 'a' given in nns"),
    (Raises(), r"Raises.evaluate\(\{\}, seeds=\[0, 1\]\) raised ValueError: the physics diverged"),
    (NoNames(), r"NoNames.nn_names is None; declare the application's NNs"),
    (OtherNames(), r"OtherNames.nn_names \('a', 'c'\) lacks the spec's NN 'b'"),
])
def test_broken_applications_are_named(tiny_spec, app, message):
    with pytest.raises(ApplicationError, match=message):
        qaopt.check_application(app, tiny_spec)


def test_validate_checks_the_simulator(capsys):
    with pytest.raises(SystemExit) as info:
        main(["validate", str(TINY)])
    assert info.value.code == 0
    assert "simulator TinyEvaluator keeps the application protocol" in capsys.readouterr().out


def test_validate_exits_2_naming_a_simulator_that_breaks_the_protocol(tmp_path, monkeypatch, capsys):
    (tmp_path / "brokenapp.py").write_text(textwrap.dedent("""
        from tinyapp import TinyEvaluator

        class Broken(TinyEvaluator):
            def evaluate(self, injectors, seeds):
                return [{"crash": r["crashes"]} for r in super().evaluate(injectors, seeds)]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    data = yaml.safe_load(TINY.read_text())
    data["evaluator"]["simulator"]["entry_point"] = "brokenapp:Broken"
    spec = tmp_path / "broken.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SystemExit) as info:
        main(["validate", str(spec)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {spec}:5:5: evaluator.simulator.entry_point: 'brokenapp:Broken': Broken.evaluate(")
    assert "returned no finite 'crashes' for seed 0" in err and "Traceback" not in err
    # --no-application skips the runs
    with pytest.raises(SystemExit) as info:
        main(["validate", "--no-application", str(spec)])
    assert info.value.code == 0


class ChannelsLast(TinyEvaluator):
    """Hands its NNs the frames as a camera gives them, height x width x channels."""

    def evaluate_perception(self, nns, seeds, render_threads=1):
        return super().evaluate_perception({n: (lambda x, f=f: f(np.moveaxis(x, 1, -1))) for n, f in nns.items()},
                                           seeds, render_threads)


class Flattened(TinyEvaluator):
    def evaluate_perception(self, nns, seeds, render_threads=1):
        return super().evaluate_perception({n: (lambda x, f=f: f(x.reshape(len(x), -1))) for n, f in nns.items()},
                                           seeds, render_threads)


def test_what_the_application_hands_its_nns_is_checked_against_their_input_shape(tiny_spec):
    # A third-party CarRacing application passed HxWxC frames; validate passed and optimize failed minutes in, in
    # torch's words ("expected input[8, 96, 96, 3] to have 3 channels, but got 96 channels").
    with pytest.raises(ApplicationError) as info:
        qaopt.check_application(ChannelsLast(), tiny_spec)
    message = str(info.value)
    assert message.startswith("ChannelsLast.evaluate_perception hands NN 'a' a batch of shape (")
    assert ", 8, 8, 1), channels last, but nns.a.input_shape is [1, 1, 8, 8]: channels first; hand it (batch, 1, 8, " \
           "8), e.g. frames.transpose(0, 3, 1, 2) (numpy) or frames.permute(0, 3, 1, 2) (torch)" in message
    with pytest.raises(ApplicationError, match=r"hands NN 'a' a batch of shape \(\d+, 64\), but nns\.a\.input_shape "
                                               r"is \[1, 1, 8, 8\]: hand it \(batch, 1, 8, 8\) or correct input_shape"):
        qaopt.check_application(Flattened(), tiny_spec)
    qaopt.check_application(ChannelsLast())  # without a spec there is no shape to hold it to
