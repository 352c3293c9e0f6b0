"""`qaopt field ...` end to end through the real entry point (exit codes, messages)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from qaopt.calibrate import AcceptanceTest, Axis, ErrorRegion, ErrorSpace, Observation, Verdict
from qaopt.calibrate.region import PER_POINT
from qaopt.cli import app, main
from qaopt.field import Run, Store
from qaopt.field.plan import plan

REPO = Path(__file__).resolve().parents[1]


def qaopt(*args: str, input: str | None = None) -> tuple[int, str]:
    """Run `qaopt ARGS` as the console script does: exit code and all output."""
    runner = CliRunner()
    result = runner.invoke(app, list(args), input=input, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # what main() does with a QaoptError: print it, exit 2
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        return exc.value.code, result.output
    return result.exit_code, result.output


def test_log_live_session(tmp_path):
    db = tmp_path / "f.db"
    typed = "d 10\nc 12.5 hit a stalk\ni 20\nbogus\nd abc\nn windy\na cam.mp4 video\nend 55\n"
    code, out = qaopt("field", "log", "--store", str(db), "--app", "cropfollow", "--nn-error", "heading=3.5",
                      "--error-point", "distance=0.1", "--condition", "crop=corn", "--operator", "ana",
                      input=typed)
    assert code == 0, out
    assert "unknown command 'bogus'" in out and "not logged" in out and "ended: complete, 55.0 m" in out
    (rec,) = Store(db).runs()
    assert rec.source == "cli" and rec.operator == "ana" and rec.conditions.crop == "corn"
    assert rec.config.nn_errors == {"heading": 3.5} and rec.error_point == {"distance": 0.1}
    assert [(e.kind, e.distance_m) for e in rec.events] == [
        ("progress", 10.0), ("collision", 12.5), ("intervention", 20.0), ("note", None)]
    assert rec.events[1].data == {"note": "hit a stalk"} and rec.attachments[0].kind == "video"
    assert rec.distance_m == 55.0


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["field", "summary"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: no field store given; pass --store FILE_OR_URL, --spec SPEC, or set QAOPT_FIELD_STORE")
    bad = tmp_path / "runs.csv"
    bad.write_text("application,started_at,ended_at,distance_m\n"
                   "a,2026-06-01T10:00:00Z,2026-06-01T10:05:00Z,100\n"
                   "a,2026-06-01T11:00:00Z,2026-06-01T11:05:00Z,far\n")
    with pytest.raises(SystemExit) as exc:
        main(["field", "import", str(bad), "--store", str(tmp_path / "f.db")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "nothing imported" in err and f"{bad}:3: distance_m:" in err
    assert Store(tmp_path / "f.db").runs() == []


def test_import_export_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("QAOPT_FIELD_STORE", str(tmp_path / "f.db"))
    src = tmp_path / "runs.csv"
    src.write_text("application,started_at,ended_at,distance_m,config.hash,collisions\n"
                   "cf,2026-06-01T10:00:00Z,2026-06-01T10:05:00Z,100,A,0\n"
                   "cf,2026-06-01T11:00:00Z,2026-06-01T11:05:00Z,200,A,3\n")
    code, out = qaopt("field", "import", str(src))
    assert code == 0 and "2 run(s) imported, 0 already present" in out
    code, out = qaopt("field", "import", str(src))
    assert "0 run(s) imported, 2 already present" in out
    code, out = qaopt("field", "summary")
    assert code == 0
    row = next(line for line in out.splitlines() if "│ cf" in line)
    assert "300.0" in row and "1 [0.206, 2.92]" in row  # 3 collisions in 300 m, exact 95 % interval
    dest = tmp_path / "out.json"
    code, out = qaopt("field", "export", "--output", str(dest))
    assert code == 0 and len(json.loads(dest.read_text())) == 2
    code, out = qaopt("field", "export", "--format", "csv", "--app", "nope")
    assert out.splitlines()[0].startswith("id,application,status")


def _spec(tmp_path: Path) -> Path:
    data = yaml.safe_load((REPO / "examples" / "cropfollow.yaml").read_text())
    data["evaluator"]["field"] = {"store": "field.db"}
    spec = tmp_path / "app.yaml"
    spec.write_text(yaml.safe_dump(data))
    return spec


def _region(tmp_path: Path) -> Path:
    region = ErrorRegion(ErrorSpace([Axis("heading", 30.0), Axis("distance", 0.25)]), AcceptanceTest(), certifier=PER_POINT)
    for h, d, ok in [(15, 0.15, True), (18, 0.05, False), (5, 0.18, False), (20, 0.2, False)]:
        region.add(Observation({"heading": h, "distance": d}, 8 if ok else 0, 0 if ok else 8,
                               Verdict.VALID if ok else Verdict.INVALID))
    return region.save(tmp_path / "region.json")


def test_evidence_and_plan_from_a_spec(tmp_path):
    spec, region = _spec(tmp_path), _region(tmp_path)
    with Run(tmp_path / "field.db", "cropfollow", error_point={"heading": 9.0, "distance": 0.09}) as run:
        run.event("collision", distance_m=40.0)
        run.end(100.0)
    code, out = qaopt("field", "evidence", str(spec), "--region", str(region), "-o", str(tmp_path / "r2.json"))
    assert code == 0, out
    assert "field overturns the simulator" in out and "heading=15, distance=0.15" in out
    assert "0 passes" not in out and "invalid" in out
    assert not ErrorRegion.load(tmp_path / "r2.json").contains({"heading": 12.0, "distance": 0.12})
    code, out = qaopt("field", "plan", str(spec), "--region", str(region), "--top", "2")
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith("│ ")]
    assert len(rows) == 2 and "inject error point" in rows[0] and "4.5 km" in rows[0]


def test_plan_refuses_a_region_of_other_axes(tmp_path):
    spec = _spec(tmp_path)
    other = ErrorRegion(ErrorSpace([Axis("heading", 30.0)]), AcceptanceTest()).save(tmp_path / "o.json")
    code, _ = qaopt("field", "plan", str(spec), "--region", str(other))
    assert code == 2


def test_plan_finds_the_region_where_calibrate_writes_it(tmp_path):
    spec = _spec(tmp_path)
    code, out = qaopt("field", "plan", str(spec))
    assert code == 0 and "no region at" in out and "using the field evidence alone" in out
    calibrated = _region(tmp_path)
    (tmp_path / "runs" / "cropfollow").mkdir(parents=True)
    default = tmp_path / "runs" / "cropfollow" / "region.json"  # the spec's output.dir
    calibrated.rename(default)
    code, out = qaopt("field", "plan", str(spec), "--top", "1")
    assert code == 0 and "no region at" not in out
    best = plan(ErrorRegion.load(default), top=1)[0].candidate.errors
    assert ", ".join(f"{k}={v:.4g}" for k, v in best.items()) in out
