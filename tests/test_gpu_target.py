"""The GPU target on a real GPU: every dtype compiles, runs, is timed and exports on each CUDA backend.

Skipped where torch sees no CUDA device (CI); run on the GPU machine (docs/BENCHMARKS.md, "GPU target").
The CPU-side guarantees these rest on (export traces on the module's device, compiling leaves the
caller's module where it was) are tested everywhere in ``test_kernels_backends.py``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from qaopt import kernels
from qaopt.kernels import Protocol, Target

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

QUICK = Protocol(warmup=3, repeats=5, min_sample_ms=1.0, max_seconds=5.0)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class Centred(torch.nn.Module):
    """Normalizes by a buffer, convolves, pools: the op (``x - mean``) that met two devices at export."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.full((1, 3, 1, 1), 0.5))
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x - self.mean)).mean((2, 3)))


@pytest.mark.parametrize("backend", ["torch", "torch[cuda_graph]", "torch-compile"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_each_dtype_compiles_runs_is_timed_and_exports_on_cuda(backend, dtype, tmp_path):
    torch.manual_seed(0)
    model = Centred().eval()
    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    expected = model(torch.from_numpy(x)).detach().numpy()
    candidate = model.to(DTYPES[dtype])
    compiled = kernels.compile(candidate, [x], Target(device="cuda", threads=1, backend=backend))
    assert next(candidate.parameters()).device.type == "cpu"  # the caller's candidate stays where it was
    out = compiled.run(x)[0]
    assert np.allclose(out.astype(np.float32), expected, atol=0.05 if dtype != "fp32" else 1e-3)
    m = compiled.measure(QUICK)
    assert m.device == "cuda" and 0 < m.median_ms < 50 and m.extra["attempts"] >= 1
    assert np.allclose(compiled.run(x)[0].astype(np.float32), out.astype(np.float32))  # a replay gives it again
    if backend == "torch":  # Inductor's ahead-of-time package takes a minute per dtype: exported once below
        assert compiled.export(tmp_path / "nn").exists()


def test_cuda_graphs_export_ahead_of_time(tmp_path):
    model = Centred().eval()
    x = np.zeros((1, 3, 32, 32), np.float32)
    compiled = kernels.compile(model, [x], Target(device="cuda", threads=1, backend="torch-compile"))
    assert compiled.backend == "torch-compile" and compiled.compile_seconds > 0
    assert compiled.export(tmp_path / "nn").suffix == ".pt2"


def test_auto_on_cuda_records_every_backend():
    model = Centred().eval()
    x = np.zeros((1, 3, 32, 32), np.float32)
    compiled = kernels.AutoBackend(protocol=QUICK).compile(model, [x], Target(device="cuda", threads=1))
    outcomes = {o.backend: o for o in compiled.outcomes}
    assert {"torch", "torch[cuda_graph]", "torch-compile", "onnxruntime"} <= set(outcomes)
    assert outcomes["torch"].measurement is not None and outcomes["torch-compile"].measurement is not None
    assert compiled.backend in ("torch", "torch[cuda_graph]", "torch-compile", "onnxruntime")


def test_a_shipped_nn_runs_in_the_loop_on_the_gpu_and_the_candidate_stays_on_the_cpu():
    """Closed-loop workers of a GPU target run the NN on the GPU (``RunPlan.loop_device``), placed once."""
    import pickle
    from types import SimpleNamespace

    from qaopt.executor import ShippedNN

    model = Centred().eval().half()
    shipped = pickle.loads(pickle.dumps(ShippedNN(SimpleNamespace(key="k", nn="heading", module=model, onnx_path=None, columns=None),
                                                  "cuda")))
    x = np.random.default_rng(0).random((2, 3, 16, 16), dtype=np.float32)
    first = shipped(x)
    assert next(shipped._placed.parameters()).device.type == "cuda"
    assert next(model.parameters()).device.type == "cpu"
    placed = shipped._placed
    np.testing.assert_allclose(shipped(x), first)
    assert shipped._placed is placed
    with torch.inference_mode():
        expected = model.float()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(first, expected, rtol=2e-2, atol=2e-2)


def test_a_run_searched_on_cuda_graphs_compares_and_exports_on_autos_fastest(tmp_path, monkeypatch):
    """The shipped GPU specs' scheme on the tiny app: trials timed on torch[cuda_graph] (target.search_backend), the
    reference and both chosen configurations compiled on auto, each NN on its fastest backend as measured there."""
    import io
    from pathlib import Path

    import yaml
    from rich.console import Console

    from qaopt import optimize

    apps = Path(__file__).resolve().parent / "apps"
    monkeypatch.syspath_prepend(str(apps))
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))
    data = yaml.safe_load((apps / "tiny.yaml").read_text())
    data["target"].update(device="cuda", backend="auto", search_backend="torch[cuda_graph]")
    data["output"]["dir"] = str(tmp_path / "run")
    spec = tmp_path / "tiny-gpu.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    result = optimize(spec, profile="quick", trials=3, console=Console(file=io.StringIO()))
    trials = [t.configuration for s in result.studies.values() for t in s.trials if t.configuration is not None]
    assert trials and all(c.backend == "torch[cuda_graph]" for config in trials for c in config.nns.values())
    chosen = [c for config in (result.reference, result.aware, result.agnostic) if config is not None
              for c in config.nns.values()]
    assert chosen and all({"torch", "torch[cuda_graph]", "torch-compile"} <= set(c.backends_measured) for c in chosen)
    for c in chosen:
        timed = {b: ms for b, ms in c.backends_measured.items() if isinstance(ms, float)}
        assert c.backend == min(timed, key=timed.get)
    assert result.search_backend == "torch[cuda_graph]"


REBUILD = textwrap.dedent("""
    import sys

    sys.path.insert(0, sys.argv[2])
    from test_approx_build import FAST, SHAPE, build, stripe_data, train_base

    from qaopt.approx import ErrorMetric, Knobs, TargetNN

    data = stripe_data()
    nn_ = TargetNN("heading", train_base(data), data, SHAPE, ErrorMetric("l1", 0))
    candidate = build(nn_, Knobs(prune_ratio=0.5, finetune_steps=40), cache_dir=sys.argv[1], recipe=FAST, device="cuda")
    print(candidate.bytes_hash)
""")


def test_a_candidate_fine_tuned_on_the_gpu_is_rebuilt_into_the_same_bytes(tmp_path):
    """Two processes, two empty caches: a pruned NN (batch norm, dropout, adaptive pooling) fine-tuned on the GPU
    comes out bit for bit the same, so a run resumed elsewhere keeps its measurements and closed-loop verdicts (a
    resumed ResNet-18 run rebuilt its ladders bit for bit on another H200 host:
    docs/benchmarks/gpu_device/resnet18-sessions22-23/optimize.log)."""
    hashes = [subprocess.run([sys.executable, "-c", REBUILD, str(tmp_path / f"cache{i}"), str(Path(__file__).parent)],
                             capture_output=True, text=True, check=True, timeout=600).stdout.split()[-1]
              for i in range(2)]
    assert hashes[0] == hashes[1]


REBUILD_MERGED = textwrap.dedent("""
    import sys

    import torch

    sys.path.insert(0, sys.argv[2])
    from test_approx_build import FAST, SHAPE, stripe_data, train_base

    from qaopt.approx import ErrorMetric, Knobs, TargetNN
    from qaopt.approx.merge import MergeGroup, build_merged

    if sys.argv[3] == "after-timing":  # as a run's process is after its measurements: cuDNN autotunes, Inductor ran
        torch.backends.cudnn.benchmark = True
        conv = torch.compile(torch.nn.Conv2d(3, 16, 3).cuda(), mode="reduce-overhead")
        for _ in range(3):
            conv(torch.randn(1, 3, 64, 64, device="cuda"))
    data = stripe_data()  # two NNs that read the same frames, as tests/test_knobs.py's pair
    ratio = data.__class__(**{**vars(data), "y_train": 0.5 + data.y_train / 100, "y_val": 0.5 + data.y_val / 100})
    pair = (TargetNN("heading", train_base(data), data, SHAPE, ErrorMetric("l1", 0)),
            TargetNN("distance", train_base(ratio), ratio, SHAPE, ErrorMetric("l1", 0)))
    views = build_merged(MergeGroup(pair, finetune_steps=60), Knobs(prune_ratio=0.5, finetune_steps=40),
                         cache_dir=sys.argv[1], recipe=FAST, device="cuda")
    print(views["heading"].bytes_hash)
""")


def test_a_merged_nn_is_rebuilt_into_the_same_bytes_whatever_the_process_ran_before(tmp_path):
    """A merged NN distils from its members' outputs on the lead's frames. Computed outside deterministic kernels,
    they follow whatever cuDNN settings the process has, and a resumed run rebuilds every merged candidate into
    other bytes (``rebuilt`` in docs/benchmarks/gpu_device/resnet18-sessions22-23/result.json); computed so, this
    test sees two hashes. A quiet process and one that autotuned and compiled first must build the same."""
    hashes = [subprocess.run([sys.executable, "-c", REBUILD_MERGED, str(tmp_path / state), str(Path(__file__).parent),
                              state], capture_output=True, text=True, check=True, timeout=600).stdout.split()[-1]
              for state in ("quiet", "after-timing")]
    assert hashes[0] == hashes[1]
