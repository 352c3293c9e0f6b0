"""The NNs a run validates are the ones its search measured: candidates carry a hash of their bytes.

A run resumed on another machine, or with a fresh cache folder, rebuilds its candidates; GPU
fine-tuning is not bitwise reproducible, so a rebuild may be other NNs under the same knobs.
Byte-identical rebuilds go on; other bytes are re-measured and re-placed in the region, and a
configuration they leave outside it is neither validated nor chosen.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console

import qaopt.approx.builder as builder
from qaopt import optimize

APPS = Path(__file__).resolve().parent / "apps"
QUIET = Console(file=io.StringIO())
TRIALS = 4


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A finished quick run of the tiny application: its spec, its result, and the run folder to copy."""
    folder = tmp_path_factory.mktemp("searched")
    spec = folder / "tiny.yaml"
    spec.write_text(yaml.safe_dump(yaml.safe_load((APPS / "tiny.yaml").read_text()), sort_keys=False))
    return spec, optimize(spec, profile="quick", trials=TRIALS, console=QUIET)


def _resume_elsewhere(spec: Path, tmp_path: Path, monkeypatch) -> tuple[object, list[str]]:
    """The finished run resumed from a copy of its run folder with a fresh cache folder (another machine)."""
    run = tmp_path / "runs"
    shutil.copytree(spec.parent / "runs", run)
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "fresh-cache"))
    said = io.StringIO()
    result = optimize(spec, profile="quick", trials=TRIALS, out=run,
                      console=Console(file=said, width=1000, log_time=False, log_path=False))
    return result, said.getvalue().splitlines()


def test_every_measured_nn_records_the_hash_of_its_bytes(searched):
    _, result = searched
    configs = [result.reference, result.aware, *(t.configuration for s in result.studies.values() for t in s.trials
                                                 if t.configuration is not None)]
    assert all(c.nns[n].bytes_hash for c in configs if c is not None for n in c.nns)


def test_a_resume_with_a_fresh_cache_validates_byte_identical_nns(searched, tmp_path, monkeypatch):
    """The tiny NNs train on a CPU, bit for bit alike: the rebuilt candidates pass the hash check unchanged."""
    spec, first = searched
    again, said = _resume_elsewhere(spec, tmp_path, monkeypatch)
    assert (tmp_path / "fresh-cache" / "approx" / "candidates").is_dir(), "the resume rebuilt its candidates"
    assert again.rebuilt == [] and not any("rebuilt with other bytes" in line for line in said)
    assert again.aware.trial == first.aware.trial
    assert {n: c.bytes_hash for n, c in again.aware.nns.items()} == {n: c.bytes_hash for n, c in first.aware.nns.items()}
    assert again.aware.errors == first.aware.errors


def test_a_rebuild_into_other_bytes_outside_the_region_is_not_validated(searched, tmp_path, monkeypatch):
    """The chosen configuration's NNs rebuilt on "another machine" (a fresh cache) come out other, noisy bytes: they
    are re-measured, fall outside the region, and the configuration is neither validated nor chosen; export and
    the side-by-side measurement refuse the unchecked bytes; the report names the rebuild."""
    import dataclasses

    import qaopt.stages.validation as validation_stage
    from qaopt.calibrate import ErrorRegion
    from qaopt.events import Events, Note
    from qaopt.plan import build_plan
    from qaopt.report import write_report
    from qaopt.search import OptimizeError, SearchContext
    from qaopt.spec import load_spec
    from qaopt.stages.region import CalibratedRegion, ClosedLoopEvidence, RegionChoice

    spec_path, first = searched
    original = builder._float_model

    def not_reproducible(nn_, knobs, recipe, store, *context):
        key, model = original(nn_, knobs, recipe, store, *context)
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 10)
        with store.writing("float", key) as tmp:  # what a rebuild of this key made on that machine
            store.save_module(model, tmp)
        return key, model

    monkeypatch.setattr(builder, "_float_model", not_reproducible)
    validated = []
    monkeypatch.setattr(validation_stage, "validate_closed_loop", lambda *a, trial, **k: validated.append(trial))
    plan = dataclasses.replace(build_plan(load_spec(spec_path), "quick"), cache_dir=tmp_path / "fresh-cache",
                               run_dir=tmp_path / "runs")
    region = ErrorRegion.load(first.region)
    ctx = SearchContext(plan, plan.application.target_nns(plan.cache_dir), region)
    calibrated = CalibratedRegion(RegionChoice(region, first.region, ""), ClosedLoopEvidence(), plan.application.key)
    said: list[str] = []
    events = Events()
    events.subscribe(lambda e: said.append(e.text) if isinstance(e, Note) else None)

    chosen = first.aware
    front = validation_stage.validate_front(ctx, [chosen], calibrated, ClosedLoopEvidence(), first.reference,
                                            events=events.for_stage("closed-loop validation"))
    assert validated == [] and front.validations == [] and front.chosen is None, "rebuilt NNs outside were validated"
    [rebuilt] = ctx.rebuilds
    assert rebuilt.trial == chosen.trial and not rebuilt.feasible and set(rebuilt.hashes) == set(chosen.nns)
    assert all(old == chosen.nns[n].bytes_hash and new != old for n, (old, new) in rebuilt.hashes.items())
    assert rebuilt.searched_errors == chosen.errors and not region.contains(rebuilt.errors)
    assert said == [rebuilt.line]
    assert f"trial {chosen.trial}: nns.a rebuilt with other bytes than searched" in rebuilt.line
    assert rebuilt.line.endswith("no longer inside the region: not validated or chosen")
    with pytest.raises(OptimizeError, match=r"nns\.a: candidate \w+ now has the bytes \w+, not the \w+ its "
                                            r"configuration \(trial \d+\) was checked with"):
        ctx.candidates(chosen)  # what export and the side-by-side measurement call

    result = first.model_copy(update={"aware": None, "acceptance": None, "validations": [], "artifacts": {},
                                   "rebuilt": ctx.rebuilds})
    assert not result.aware_accepted
    report = write_report(result, tmp_path).read_text()
    assert "### Rebuilt NNs" in report and f"- {rebuilt.line}" in report
    assert "configurations whose rebuilt NNs left the region were not validated" in report


def test_a_verdict_is_cached_for_the_bytes_that_ran(searched, tmp_path, monkeypatch):
    """A rebuild inside the region under the same knobs is validated again: the cached verdict was about other
    bytes. The same bytes again read it back; each verdict names the NNs (key and bytes) it is about."""
    import dataclasses
    from types import SimpleNamespace

    import qaopt.stages.validation as validation_stage
    from qaopt.calibrate import ErrorRegion
    from qaopt.plan import build_plan
    from qaopt.result import RanNN, Validation
    from qaopt.search import SearchContext
    from qaopt.spec import load_spec

    spec_path, first = searched
    plan = dataclasses.replace(build_plan(load_spec(spec_path), "quick"), cache_dir=tmp_path / "cache",
                               run_dir=tmp_path / "runs")
    ctx = SearchContext(plan, plan.application.target_nns(plan.cache_dir), ErrorRegion.load(first.region))
    monkeypatch.setattr(SearchContext, "candidates", lambda self, config: {n: SimpleNamespace(predict=None)
                                                                           for n in config.nns})
    ran = []

    def closed_loop(*args, trial, region_predicted_valid, **kwargs):
        ran.append(trial)
        return Validation(trial=trial, runs=6, passes=6, failures=0, verdict="valid", accepted=False,
                          region_predicted_valid=region_predicted_valid, qos_metric_mean=0.0)

    monkeypatch.setattr(validation_stage, "validate_closed_loop", closed_loop)
    searched_config = first.aware
    rebuilt = searched_config.model_copy(update={"nns": {
        n: c.model_copy(update={"bytes_hash": "0" * 16}) for n, c in searched_config.nns.items()}})

    verdicts = [validation_stage.validate_configuration(ctx, config, runs=6)
                for config in (searched_config, rebuilt, searched_config)]
    assert ran == [searched_config.trial] * 2, "the rebuild read the searched bytes' verdict, or a verdict ran twice"
    assert verdicts[0].nns == {n: RanNN(candidate=c.candidate, bytes_hash=c.bytes_hash)
                               for n, c in searched_config.nns.items()}
    assert {r.bytes_hash for r in verdicts[1].nns.values()} == {"0" * 16}
    assert verdicts[2] == verdicts[0]


HASH_IN_A_PROCESS = textwrap.dedent("""
    import sys
    from pathlib import Path

    import torch
    from qaopt.approx import Candidate, Knobs

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                 torch.nn.Linear(144, 2))
    if sys.argv[2] == "half":
        module = module.half()
    if sys.argv[2] == "nudged":
        with torch.no_grad():
            module[3].bias[0] += 1e-6
    onnx = Path(sys.argv[1])
    candidate = Candidate(nn="a", knobs=Knobs(), key="k", module=module, onnx_path=onnx, runnable_on=("torch",),
                          metric="l1", error=0.0, residuals=(), macs=0, params=0, build_seconds=0.0, from_cache=True)
    print(candidate.bytes_hash)
""")


def test_the_bytes_hash_is_the_same_in_every_process_and_tells_any_change(tmp_path):
    onnx = tmp_path / "graph.onnx"
    onnx.write_bytes(b"an int8 graph")

    def bytes_hash(variant: str, seed: str) -> str:
        out = subprocess.run([sys.executable, "-c", HASH_IN_A_PROCESS, str(onnx), variant], check=True,
                             capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed})
        return out.stdout.strip()

    first = bytes_hash("same", "1")
    assert first and bytes_hash("same", "2") == first, "the same bytes hash alike in another process"
    assert bytes_hash("nudged", "1") != first, "one weight's last bit tells a rebuild apart"
    assert bytes_hash("half", "1") != first
    onnx.write_bytes(b"another int8 graph")
    assert bytes_hash("same", "1") != first, "the ONNX graph's bytes are part of the hash"
