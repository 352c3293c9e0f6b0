"""Backends by registry: typed references, clear errors, and a user's backend named from YAML."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from qaopt import kernels
from qaopt.app_spec import SpecError, load
from qaopt.app_spec.entrypoints import load_entry_point
from qaopt.kernels import BackendRef, Protocol, Target, registry

APPS = Path(__file__).resolve().parent / "apps"
QUICK = Protocol(warmup=1, repeats=3, min_sample_ms=1.0, max_seconds=5.0)


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_backend_ref_parses_prints_and_compares():
    ref = BackendRef.parse("torch[channels_last]")
    assert ref == BackendRef("torch", "channels_last") and (ref.name, ref.variant) == ("torch", "channels_last")
    assert str(ref) == "torch[channels_last]" and str(BackendRef.parse("tvm")) == "tvm"
    assert ref == "torch[channels_last]" and BackendRef("auto") == "auto" and ref != "torch"
    assert BackendRef.parse(ref) is ref and len({ref, BackendRef("torch", "channels_last")}) == 1
    for bad in ("", "tvm[", "[x]", "a b", "torch[channels last]"):
        with pytest.raises(kernels.BackendUnavailableError, match="is not a backend name"):
            BackendRef.parse(bad)


def test_registry_names_variants_and_refuses_unknown_ones():
    assert {"auto", "onnxruntime", "torch", "torch[channels_last]", "torch-compile", "tvm"} <= set(kernels.backend_names())
    assert kernels.get_backend("torch[channels_last]").channels_last
    assert kernels.get_backend(BackendRef("torch")).name == "torch"
    with pytest.raises(kernels.BackendUnavailableError, match=r"'torch' has no variant 'nhwc' \(its variants: channels_last, cuda_graph\)"):
        kernels.get_backend("torch[nhwc]")
    with pytest.raises(kernels.BackendUnavailableError, match="register the plain name"):
        kernels.register_backend("mine[fast]", lambda **_: None)


def test_a_backend_declares_its_dtypes_per_device(scratch_registry):
    """A runtime whose kernels differ by device (TVM: integer kernels on CPUs, fp16 on GPUs) declares each device's."""
    kernels.register_backend("split", lambda **_: None, dtypes={"cpu": ("fp32", "int8"), "cuda": ("fp32", "fp16")})
    assert kernels.backend_devices("split") == ("cpu", "cuda")
    assert kernels.backend_dtypes("split", "cuda") == ("fp32", "fp16") and kernels.backend_dtypes("split", "rpc") == ()
    assert kernels.backend_dtypes("split") == ("fp32", "int8", "fp16")  # on any device it serves
    assert "split" in kernels.backends_running("int8", "cpu") and "split" not in kernels.backends_running("int8", "cuda")
    assert "split" in kernels.backends_running("fp16") and "split" not in kernels.backends_running("fp16", "rpc")
    with pytest.raises(kernels.BackendUnavailableError, match="dtypes per device name the devices it serves"):
        kernels.register_backend("both", lambda **_: None, dtypes={"cpu": ("fp32",)}, devices=("cpu",))
    with pytest.raises(kernels.BackendUnavailableError, match="no device named 'npu'"):
        kernels.register_backend("npu", lambda **_: None, dtypes={"npu": ("int8",)})


def test_target_from_spec_checks_the_backend_is_registered():
    with pytest.raises(kernels.BackendUnavailableError) as err:
        Target.from_spec({"backend": "tensorrt"})
    message = str(err.value)
    assert "no backend named 'tensorrt'" in message and "torch, torch-compile" in message
    assert "register_backend" in message and "docs/extending.md" in message


class EagerTestBackend:
    """A user's backend: torch eager, under another name."""

    name = "eager-test"

    def unavailable_reason(self, target):
        return None

    def compile(self, model, example_inputs, target):
        compiled = kernels.get_backend("torch").compile(model, example_inputs, target)
        compiled.backend = self.name
        return compiled


def _tiny_spec(tmp_path: Path, backend: str) -> Path:
    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    data["target"]["backend"] = backend
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_registered_backend_is_named_in_yaml_and_measures(tmp_path, scratch_registry):
    kernels.register_backend("eager-test", lambda **_: EagerTestBackend())
    spec = load(_tiny_spec(tmp_path, "eager-test"))
    target = Target.from_spec(spec.target)
    assert target.backend == BackendRef("eager-test") and target.threads == 1

    nn = spec.nns["a"]
    model = load_entry_point(nn.model)(**nn.args).eval()
    x = torch.rand(*nn.input_shape)
    compiled = kernels.compile(model, [x], target, cache_dir=tmp_path / "cache")
    with torch.no_grad():
        np.testing.assert_allclose(compiled.run()[0], model(x).numpy(), rtol=1e-5, atol=1e-6)
    m = compiled.measure(QUICK)
    assert m.backend == "eager-test" and m.median_ms > 0 and m.threads == 1


def test_an_unregistered_backend_in_yaml_fails_at_target_not_at_load(tmp_path, scratch_registry):
    spec = load(_tiny_spec(tmp_path, "eager-test"))  # app_spec cannot see the registry: any sane name loads
    with pytest.raises(kernels.BackendUnavailableError, match="no backend named 'eager-test'.*register_backend"):
        Target.from_spec(spec.target)
    with pytest.raises(SpecError, match="target.backend"):
        load(_tiny_spec(tmp_path, "tvm[unclosed"))
