"""Import (all-or-nothing, bad rows named by line) and export (JSON round-trips exactly)."""

from __future__ import annotations

import io
import json

import pytest

from qaopt.field import ImportRowsError, Run, Store
from qaopt.field.transfer import import_file, read_records, write_records

HEADER = ("application,started_at,ended_at,distance_m,config.knobs,config.nn_errors.heading,"
          "error_point.heading,conditions.crop,collisions,collisions_at_m,interventions_at_m\n")
GOOD = ('cropfollow,2026-06-01T10:00:00Z,2026-06-01T10:06:00Z,100,"{""heading"": {""prune"": 0.5}}",'
        "3.5,10,corn,2,12.5,40\n")
GOOD2 = "cropfollow,2026-06-01T11:00:00Z,2026-06-01T11:07:00Z,100,,3.5,10,corn,,,\n"


def test_csv_import(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text(HEADER + GOOD + "\n" + GOOD2)
    store = Store(tmp_path / "f.db")
    result = import_file(store, f)
    assert len(result.added) == 2 and result.already_present == []
    first, second = store.runs()
    assert first.status == "complete" and first.distance_m == 100.0
    assert first.config.knobs == {"heading": {"prune": 0.5}} and first.config.nn_errors == {"heading": 3.5}
    assert first.error_point == {"heading": 10.0} and first.conditions.crop == "corn"
    # 2 collisions, one with a known place; 1 intervention at 40 m
    assert [(e.kind, e.distance_m) for e in first.events] == [
        ("collision", 12.5), ("collision", None), ("intervention", 40.0)]
    assert second.events == () and second.source == "csv:runs.csv"


def test_reimport_is_harmless(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text(HEADER + GOOD + GOOD2)
    store = Store(tmp_path / "f.db")
    import_file(store, f)
    again = import_file(store, f)
    assert again.added == [] and len(again.already_present) == 2
    assert len(store.runs()) == 2


def test_one_bad_row_imports_nothing_and_is_named(tmp_path):
    bad = "cropfollow,2026-06-01T12:00:00Z,2026-06-01T12:05:00Z,-5,,3.5,ten,corn,1,7;x,\n"
    f = tmp_path / "runs.csv"
    f.write_text(HEADER + GOOD + GOOD2 + bad)
    store = Store(tmp_path / "f.db")
    with pytest.raises(ImportRowsError) as err:
        import_file(store, f)
    msg = str(err.value)
    assert msg.startswith("nothing imported")
    assert f"{f}:4: collisions_at_m: 'x' is not a number" in msg
    assert store.runs() == []
    # once the row's conversion passes, field validation names the columns on that line
    f.write_text(HEADER + GOOD + GOOD2 + bad.replace("7;x", "7"))
    with pytest.raises(ImportRowsError) as err:
        import_file(store, f)
    lines = {(p.line, p.field) for p in err.value.problems}
    assert lines == {(4, "distance_m"), (4, "error_point.heading")}
    assert store.runs() == []


def test_line_numbers_follow_multiline_cells(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text("application,started_at,notes,ended_at\n"
                 'a,2026-06-01T10:00:00Z,"two\nlines",2026-06-01T10:05:00Z\n'
                 "a,2026-06-01T10:00:00,,2026-06-01T10:05:00Z\n")
    with pytest.raises(ImportRowsError) as err:
        read_records(f)
    (problem,) = err.value.problems
    assert (problem.line, problem.field) == (4, "started_at")  # naive time: needs a zone


def test_unknown_column_and_inconsistent_run(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text("application,started_at,colisions\na,2026-06-01T10:00:00Z,3\n"
                 "a,2026-06-01T10:00:00Z,\n")
    with pytest.raises(ImportRowsError, match=r"runs.csv:2: colisions: unknown column"):
        read_records(f)
    g = tmp_path / "runs.json"
    g.write_text('[{"application": "a", "started_at": "2026-06-01T10:00:00Z", "status": "complete"}]')
    with pytest.raises(ImportRowsError, match=r"runs.json:1: Value error, a complete run needs ended_at"):
        read_records(g)


def _sample_store(tmp_path) -> Store:
    store = Store(tmp_path / "src.db")
    with Run(store, "cropfollow", config={"knobs": {"heading": {"prune": 0.3}}, "nn_errors": {"heading": 2.0}},
             conditions={"crop": "soy", "light": "dusk", "row_width_m": 0.76}, operator="li") as run:
        run.progress(20.0)
        run.event("collision", distance_m=21.0, position={"x": 0.2, "y": 21.0}, note="stalk")
        run.attach(tmp_path / "bag.mcap", "rosbag")
    with pytest.raises(KeyError):
        with Run(store, "cropfollow", error_point={"heading": 12.0, "distance": 0.1}) as r2:
            r2.event("intervention", distance_m=3.0)
            raise KeyError("lost GPS")
    Run(store, "cropfollow", run_id="open-run").start().progress(7.0)  # never ends
    return store


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_json_export_round_trips_into_another_store(tmp_path, fmt):
    src = _sample_store(tmp_path)
    out = tmp_path / f"runs.{fmt}"
    with open(out, "w") as f:
        write_records(src.runs(), f, fmt)
    dst = Store(tmp_path / "dst.db")
    assert len(import_file(dst, out).added) == 3
    assert [r.model_dump() for r in dst.runs()] == [r.model_dump() for r in src.runs()]
    assert {r.status for r in dst.runs()} == {"complete", "aborted", "incomplete"}


def _exported(store: Store) -> list[dict]:
    buf = io.StringIO()
    write_records(store.runs(), buf, "json")
    return json.loads(buf.getvalue())


def test_json_lines_are_named(tmp_path):
    records = _exported(_sample_store(tmp_path))
    records[2]["distance_m"] = "far"
    f = tmp_path / "runs.json"
    f.write_text("[\n" + ",\n".join(json.dumps(r, indent=1) for r in records) + "\n]\n")
    starts = [n for n, line in enumerate(f.read_text().splitlines(), start=1) if line == "{"]
    start_of_third = starts[2]
    with pytest.raises(ImportRowsError) as err:
        read_records(f)
    assert [(p.line, p.field) for p in err.value.problems] == [(start_of_third, "distance_m")]
    f.write_text('[{"application": "a"},\n {"application": }]')
    with pytest.raises(ImportRowsError, match=r"runs.json:2: invalid JSON"):
        read_records(f)


def test_changed_run_with_same_id_is_refused(tmp_path):
    src = _sample_store(tmp_path)
    records = _exported(src)
    records[0]["notes"] = "edited afterwards"
    f = tmp_path / "edited.json"
    f.write_text(json.dumps(records))
    with pytest.raises(ImportRowsError, match="append-only"):
        import_file(src, f)


def test_csv_export_imports_back(tmp_path):
    src = _sample_store(tmp_path)
    out = tmp_path / "runs.csv"
    with open(out, "w", newline="") as f:
        write_records(src.runs(), f, "csv")
    header = out.read_text().splitlines()[0].split(",")
    assert {"conditions.row_width_m", "error_point.distance", "config.nn_errors.heading"} <= set(header)
    dst = Store(tmp_path / "dst.db")
    import_file(dst, out)
    for a, b in zip(src.runs(), dst.runs()):
        assert (a.id, a.status, a.distance_m, a.count("collision"), a.count("intervention")) == \
               (b.id, b.status, b.distance_m, b.count("collision"), b.count("intervention"))
        assert a.config == b.config and a.error_point == b.error_point
