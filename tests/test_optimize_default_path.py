"""`qaopt optimize` through the path the shipped example takes: backend ``auto`` on 2 threads, fp32/bf16/int8.

The tiny application (tests/apps/tinyapp.py) is edited to the shipped example's target
and dtypes, so every backend ``auto`` measures on a CPU runs, the parallel schedule is
searched beside the sequential one, and the report's tables are read row by row.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from rich.console import Console

from qaopt import kernels, optimize
from qaopt.approx import RUNNABLE_ON

APPS = Path(__file__).resolve().parent / "apps"
DTYPES = ["fp32", "bf16", "int8"]
SEARCHED = [d for d in DTYPES if d not in kernels.emulated_dtypes("cpu")]
"""What the search tries on this CPU: a 16-bit float it would only emulate is left out (docs/knobs.md)."""


def _assert_onnx_contract(path: Path, sample_shape: tuple[int, ...]) -> None:
    """Every exported NN: one input ``input``, one output ``output``, and a dynamic batch axis."""
    import onnx
    import onnxruntime as ort

    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}] == ["input"], path
    assert [o.name for o in graph.output] == ["output"], path
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param, f"{path}: the batch axis is fixed"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        out = session.run(["output"], {"input": np.zeros((batch, *sample_shape), np.float32)})[0]
        assert out.shape[0] == batch and np.isfinite(out).all()


def _table(report: str, heading: str) -> list[dict[str, str]]:
    """The first markdown table after ``heading``, as one dict per row."""
    lines = report[report.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    header, _, *body = rows
    return [dict(zip(header, row, strict=True)) for row in body]


@pytest.fixture(scope="module")
def default_path_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("default-path")
    data = yaml.safe_load((APPS / "tiny.yaml").read_text())
    data["target"] = {"device": "cpu", "backend": "auto", "threads": 2}
    data["approximations"]["all"]["quantization"] = {"dtypes": DTYPES}
    spec = folder / "tiny.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    # enough trials that some are sampled after the enqueued ones (the reference, informed and precision trials)
    result = optimize(spec, profile="quick", trials=10, console=Console(file=io.StringIO()))
    return result, (folder / "runs" / "report.md").read_text()


def test_every_dtype_runs_on_a_backend_that_has_its_kernels(default_path_run):
    result, report = default_path_run
    measured = [t.configuration for s in result.studies.values() for t in s.trials if t.configuration]
    backends = {c.knobs["dtype"]: c.backend for config in measured for c in config.nns.values()}
    assert set(backends) == set(SEARCHED), "the reference and each precision alone are trials of both studies"
    for dtype in set(SEARCHED) - {"fp32"}:  # auto picks the fastest of the backends with kernels for the dtype
        assert backends[dtype].split("[")[0] in RUNNABLE_ON[dtype], (dtype, backends[dtype])
    for config in measured:
        for choice in config.nns.values():
            assert choice.latency_ms > 0 and choice.backend in {str(b) for b in choice.backends_measured}
            # auto measured more than one backend wherever the dtype runs on several
            if choice.knobs["dtype"] == "fp32":
                assert len(choice.backends_measured) >= 3, choice.backends_measured


def test_both_schedules_are_searched(default_path_run):
    result, report = default_path_run
    # the aware study samples the schedule; the agnostic unit studies time one unit, and their combined frame is
    # measured on every schedule
    schedules = {t.params.get("schedule") for t in result.studies["aware"].trials}
    assert schedules == {"sequential", "parallel"}
    rows = _table(report, "### Candidates (aware study")
    assert len(rows) == result.studies["aware"].trials_complete
    assert {re.search(r"schedule=(\w+)", r["knobs"]).group(1) for r in rows} <= {"sequential", "parallel"}
    # the side-by-side stage timed the reference's two NNs on both schedules too, ran the frame on the faster, and
    # the report's outcome table names the other's figure
    reference = result.reference
    assert set(reference.schedules_ms) == {"sequential", "parallel"}
    assert reference.latency_ms == min(reference.schedules_ms.values())
    other = next(s for s in reference.schedules_ms if s != reference.schedule)
    row = next(r for r in _table(report, "## Outcome") if r["configuration"].startswith("reference"))
    assert row["schedule"] == f"{reference.schedule} ({other} {reference.schedules_ms[other]:.3g} ms)"


def test_report_tables_hold_the_measured_figures(default_path_run):
    result, report = default_path_run
    outcome = _table(report, "## Outcome")
    reference = next(r for r in outcome if r["configuration"].startswith("reference"))
    # each latency reads "median [interval]", optionally followed by "(untrusted)"
    assert float(reference["latency per frame (ms) [95 % interval]"].split()[0]) == pytest.approx(
        result.reference.latency_ms, abs=0.01)
    assert reference["speedup vs reference"] == "1.00x"
    if result.aware is not None:
        aware = next(r for r in outcome if r["configuration"].startswith("application-aware"))
        assert aware["speedup vs reference"] == result.speedups.describe("aware")
        chosen = _table(report, "### application-aware")
        assert [r["NN"] for r in chosen] == list(result.aware.nns)
        for row in chosen:
            nn = result.aware.nns[row["NN"]]
            assert row["dtype"] == nn.knobs["dtype"] and row["backend"] == nn.backend
            assert float(row["latency (ms) [95 % interval]"].split()[0]) == pytest.approx(nn.latency_ms, abs=0.01)
    validation = _table(report, "## Closed-loop validation")
    finals = [*result.validations, *(v for v in (result.acceptance, result.agnostic_validation) if v is not None)]
    assert [int(r["runs"]) for r in validation] == [v.runs for v in finals]
    assert [r["seeds"].split()[0] for r in validation][-1] == "fresh"  # the agnostic choice, on the fresh seeds


def test_the_report_says_how_the_search_started(default_path_run):
    """The screening's figures and every combination the informed walk built are in result.json and the report."""
    result, report = default_path_run
    aware = result.studies["aware"]
    start = aware.informed
    assert start is not None and set(start.reference_ms) == {"a", "b", "a+b"}
    assert start.reference_frame_ms == pytest.approx(start.reference_ms["a"] + start.reference_ms["b"])
    for unit, factors in start.factors.items():
        assert factors and set(factors) <= {f"dtype {d}" for d in SEARCHED if d != "fp32"}, unit  # fp32: the reference
        assert all(f > 0 for f in factors.values())
    assert start.walk, "the tiny app's NNs leave headroom: some combination is built"
    assert all(t.estimated_ms < start.reference_frame_ms for t in start.walk), "only what beats the reference"
    assert len({t.choice for t in start.walk}) == len(start.walk), "no combination is built twice"
    roles = [t.role for t in start.walk if t.role]
    assert roles in ([], ["cheapest"], ["cheapest", "fallback"], ["fallback", "cheapest"])
    assert all(t.inside for t in start.walk if t.role)
    if roles:  # the cheapest inside is the study's first trial after the reference
        assert aware.trials[1].params != aware.trials[0].params
    screening, walked = _table(report, "### How the search started"), _table(report, "The walk built:")
    assert [r["unit"] for r in screening] == list(start.reference_ms)
    assert [r["combination"] for r in walked] == [t.choice for t in start.walk]
    assert [r["became"] for r in walked] == [t.role or "" for t in start.walk]


def test_every_dtype_exports_one_onnx_contract_and_loads_back(default_path_run, tmp_path):
    """fp32, bf16 and int8 NNs export ``model.onnx`` with ``input``/``output`` and a dynamic batch, and
    :func:`qaopt.load_artifacts` gives back modules computing what the validated candidates computed."""
    import torch

    import qaopt
    from qaopt.calibrate import ErrorRegion
    from qaopt.plan import build_plan
    from qaopt.search import SearchContext
    from qaopt.spec import load_spec
    from qaopt.stages.export import export_configuration

    result, _ = default_path_run
    plan = build_plan(load_spec(result.spec), "quick")
    ctx = SearchContext(plan, plan.application.target_nns(plan.cache_dir), ErrorRegion.load(result.region))
    measured = [t.configuration for s in result.studies.values() for t in s.trials if t.configuration]
    for dtype in SEARCHED:
        config = next(c for c in measured if any(n.knobs["dtype"] == dtype for n in c.nns.values()))
        run_dir = tmp_path / dtype
        files = export_configuration(ctx, config, run_dir / "artifacts")
        result.model_copy(update={"aware": config, "run_dir": run_dir, "artifacts": files}).save(run_dir / "result.json")
        modules = qaopt.load_artifacts(run_dir)
        for name, choice in config.nns.items():
            _assert_onnx_contract(files[name]["onnx"], (1, 8, 8))
            x = np.asarray(ctx.nns[name].data.x_val, np.float32)
            module = modules[name]
            dtype_of = next(module.parameters()).dtype if choice.knobs["dtype"] != "int8" else torch.float32
            with torch.inference_mode():
                loaded = module(torch.from_numpy(x).to(dtype_of)).float().numpy()
            np.testing.assert_allclose(loaded, ctx.build(name, choice.knobs).predict(x), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} ({choice.knobs['dtype']})")
