"""What the target cannot run is refused or left out before anything runs (qaopt.target_fit, kernels.runnable).

The run that shows no trial fails for it is in tests/test_optimize.py (it reuses that file's run of the tiny app).
"""

from __future__ import annotations

import pytest
import torch
from specs import line_of, one_error, run_qaopt, tiny_spec

from qaopt import kernels
from qaopt.kernels import BackendRef, CpuInfo, Target

NO_FLOAT16 = CpuInfo("test CPU", (), frozenset())
"""A CPU with no 16-bit float arithmetic: bf16 and fp16 are only emulated on it."""
BF16_CPU = CpuInfo("test CPU", ("avx512_bf16",), frozenset({"avx512_bf16"}))
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no CUDA GPU")


@pytest.fixture
def toy_gpu():
    """A backend that declares int8 on CUDA only, as a plugin's TensorRT-like runtime would."""
    kernels.register_backend("toy-gpu", lambda **_: kernels.get_backend("torch"), dtypes=("fp32", "int8"),
                             devices=("cuda",))
    yield "toy-gpu"
    kernels.unregister_backend("toy-gpu")


def every_backend_serves(ref):  # as on a machine where every backend can serve the target
    return None


def test_a_dtype_is_runnable_where_a_backend_of_the_target_declares_it_on_its_device(toy_gpu):
    dtypes = ("fp32", "bf16", "fp16", "int8")
    # auto's CUDA backends: eager and Inductor run the float dtypes; ONNX Runtime's CUDA provider, where installed, int8
    assert kernels.unrunnable_dtypes(Target(device="cuda"), dtypes, unavailable=every_backend_serves) == {}
    eager = kernels.unrunnable_dtypes(Target(device="cuda", backend="torch"), dtypes, unavailable=every_backend_serves)
    assert set(eager) == {"int8"} and not eager["int8"].emulated
    assert eager["int8"].reason == "no backend here runs int8 on cuda (backends: torch)"
    # A variant is what its backend declares; a backend named in target.backend is the only one.
    channels_last = kernels.unrunnable_dtypes(Target(backend=BackendRef("torch", "channels_last")), dtypes, BF16_CPU)
    assert set(channels_last) == {"fp16", "int8"} and channels_last["fp16"].emulated
    assert "int8" not in kernels.unrunnable_dtypes(Target(device="cuda", backend=toy_gpu), dtypes,
                                                   unavailable=every_backend_serves)
    # toy-gpu declares cuda only: on a CPU it runs nothing, whatever its dtypes.
    assert set(kernels.unrunnable_dtypes(Target(backend=toy_gpu), dtypes)) == set(dtypes)
    # A CPU without 16-bit float arithmetic: declared, but only emulated.
    emulated = kernels.unrunnable_dtypes(Target(), dtypes, NO_FLOAT16)
    assert set(emulated) == {"bf16", "fp16"} and all(u.emulated for u in emulated.values())


def test_a_backend_that_cannot_serve_the_target_here_runs_nothing_it_declares():
    # ONNX Runtime declares int8 on cuda, but a build without its CUDA provider runs nothing there.
    def cpu_only_ort(ref):
        return "this onnxruntime build has no CUDA execution provider" if ref.name == "onnxruntime" else None

    on_cuda = kernels.unrunnable_dtypes(Target(device="cuda"), ("fp32", "int8"), unavailable=cpu_only_ort)
    assert set(on_cuda) == {"int8"}
    assert "onnxruntime: this onnxruntime build has no CUDA execution provider" in on_cuda["int8"].reason


@NO_GPU
@pytest.mark.parametrize("command", ["validate", "optimize"])
def test_a_cuda_target_without_a_gpu_is_refused_before_anything_runs(tmp_path, capsys, command):
    path = tiny_spec(tmp_path, lambda d: d["target"].update(device="cuda"))
    error = one_error(capsys, path, command, *(["--no-imports"] if command == "validate" else ["--profile", "quick"]))
    assert line_of(path, error).strip() == "device: cuda"
    assert error.endswith(f"target.device: 'cuda', but torch sees no CUDA GPU here (torch {torch.__version__}, "
                          "built without CUDA): run on a machine with an NVIDIA GPU or set target.device: cpu")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()  # nothing calibrated, nothing built


def test_validate_refuses_a_dtype_list_the_target_runs_nothing_of(tmp_path, capsys):
    def only_int8(d):  # the tiny app's target is torch on the CPU: no int8 kernels
        d["approximations"]["b"] = {"quantization": {"dtypes": ["int8"]}}

    path = tiny_spec(tmp_path, only_int8)
    error = one_error(capsys, path, "validate", "--no-imports")
    assert line_of(path, error).strip().startswith("dtypes:")
    assert ("approximations.b.quantization.dtypes: nothing listed runs on this target: no backend here runs int8 on "
            "cpu (backends: torch); list a dtype it runs (fp32") in error
    assert "or declare a backend that runs int8 (docs/extending.md, 'Adding a backend')" in error


def test_validate_passes_with_a_note_naming_what_is_left_out(tmp_path, capsys):
    path = tiny_spec(tmp_path, lambda d: d["approximations"]["all"]["quantization"].update(dtypes=["fp32", "int8"]))
    code, err, out = run_qaopt(capsys, "validate", "--no-imports", str(path))
    assert code is None or code == 0, err
    assert err == ["note: int8 left out of the search: no backend here runs int8 on cpu (backends: torch); declare one "
                   "(docs/extending.md, 'Adding a backend') or drop int8 from approximations.all.quantization.dtypes"]
    assert ": ok" in out


def test_a_search_backend_that_cannot_serve_the_device_is_refused_at_its_line(tmp_path, capsys, toy_gpu):
    path = tiny_spec(tmp_path, lambda d: d["target"].update(search_backend=toy_gpu))
    error = one_error(capsys, path, "validate", "--no-imports")
    assert line_of(path, error).strip() == f"search_backend: {toy_gpu}"
    assert error.endswith(f"target.search_backend: backend '{toy_gpu}' runs on cuda, not on cpu; choose another "
                          "target.search_backend (auto picks one for the device) or device")


def test_a_dtype_the_search_backend_cannot_run_is_left_out_though_the_target_backend_runs_it(tmp_path, capsys):
    """Trials run on target.search_backend: a dtype only target.backend runs would fail every trial that samples it."""
    def edit(d):
        d["target"].update(backend="onnxruntime", search_backend="torch")
        d["approximations"]["all"]["quantization"].update(dtypes=["fp32", "int8"])

    code, err, _ = run_qaopt(capsys, "validate", "--no-imports", str(tiny_spec(tmp_path, edit)))
    assert code is None or code == 0, err
    assert err == ["note: int8 left out of the search: no backend here runs int8 on cpu (backends: torch); declare one "
                   "(docs/extending.md, 'Adding a backend') or drop int8 from approximations.all.quantization.dtypes"]
