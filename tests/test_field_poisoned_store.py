"""The field store cannot be poisoned for good: every value is checked before it is
written, a reader never fails because of one bad row, and a bad run can be set aside.

Each case is hit as a user hits it: the ``Run`` API on the robot, or ``qaopt field ...``
(exit code and message), and each checks that nothing already stored was lost.
"""

from __future__ import annotations

import io
import json
import math
import sqlite3

import pytest

from qaopt.cli import main
from qaopt.field import EXCLUDED, FieldDataWarning, FieldError, FieldValueError, Run, Store
from qaopt.field.summary import poisson_rate
from qaopt.field.transfer import import_file


def qaopt(capsys, *args: str, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    """``qaopt ARGS`` as the console script runs it: exit code, stdout, stderr."""
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _good_run(db, run_id="good") -> None:
    with Run(db, "cf", run_id=run_id, config={"hash": "A"}) as run:
        run.progress(40.0)
        run.event("collision", distance_m=41.0)
        run.end(100.0)


def _poison(db, run_id="bad") -> None:
    """Rows no checked writer stores: an end at -5 m with status 'bogus', and an
    event whose data holds NaN (the JSON text `NaN`). Written with sqlite3, not qaopt."""
    con = sqlite3.connect(db)
    cols = [r[1] for r in con.execute("PRAGMA table_info(field_runs)")]
    picked = ", ".join("?" if c == "id" else c for c in cols)
    con.execute(f"INSERT INTO field_runs ({', '.join(cols)}) SELECT {picked} FROM field_runs WHERE id = 'good'",
                (run_id,))
    con.execute("INSERT INTO field_events (run_id, seq, kind, distance_m, data) VALUES (?, 0, 'progress', 7.0, '{}')",
                (run_id,))
    con.execute("INSERT INTO field_events (run_id, seq, kind, data) VALUES (?, 1, 'note', '{\"x\": NaN}')", (run_id,))
    con.execute("INSERT INTO field_run_ends (run_id, ended_at, status, distance_m, message) "
                "VALUES (?, '2026-06-01 10:00:00', 'bogus', -5.0, '')", (run_id,))
    con.commit()
    con.close()


@pytest.fixture
def poisoned(tmp_path):
    """A store with a good run and a poisoned run ("bad")."""
    db = tmp_path / "f.db"
    _good_run(db)
    _poison(db)
    return db


def _stored(db):
    return {r.id: r for r in Store(db, on_problem=lambda _: None).runs(include_excluded=True)}


# ---- every value is checked before it is written --------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda run: run.end(distance_m=-5), "distance_m must be a finite number of metres >= 0, got -5"),
    (lambda run: run.end(distance_m=float("nan")), "got nan"),
    (lambda run: run.end(10.0, status="bogus"), "status 'bogus': a run ends as 'complete' or 'aborted'"),
    (lambda run: run.progress("12.5"), "must be a number of metres, got '12.5' \\(str\\)"),
    (lambda run: run.progress(float("inf")), "got inf"),
    (lambda run: run.event("collision", distance_m=True), "got True \\(bool\\)"),
    (lambda run: run.event("note", reading=float("nan")), "data: .*reading: nan is not a finite number"),
    (lambda run: run.event("note", nested={"a": [1.0, float("-inf")]}), "nested.a\\[1\\]: -inf"),
    (lambda run: run.event("note", blob=object()), "blob: a object is not JSON"),
    (lambda run: run.event(EXCLUDED), "kept for `qaopt field exclude`"),
])
def test_bad_value_is_refused_before_writing_and_the_run_goes_on(tmp_path, call, message):
    db = tmp_path / "f.db"
    with Run(db, "cf") as run:
        run.progress(3.0)
        with pytest.raises(FieldValueError, match=message):
            call(run)
        run.event("collision", distance_m=4.0)  # the run is still open and logs on
        run.end(10.0)
    rec = Store(db).run(run.id)
    assert (rec.status, rec.distance_m) == ("complete", 10.0)
    assert [(e.kind, e.distance_m) for e in rec.events] == [("progress", 3.0), ("collision", 4.0)]


def test_bad_free_form_values_are_refused_before_the_run_starts(tmp_path):
    with pytest.raises(FieldValueError, match="conditions: .*temp_c: nan"):
        Run(tmp_path / "f.db", "cf", conditions={"temp_c": float("nan")})
    with pytest.raises(FieldValueError, match="config: .*knobs.*prune: inf"):
        Run(tmp_path / "f.db", "cf", config={"knobs": {"heading": {"prune": float("inf")}}})
    assert not (tmp_path / "f.db").exists()


def test_store_end_run_checks_its_values_too(tmp_path):
    store = Store(tmp_path / "f.db")
    run = Run(store, "cf").start()
    for kwargs, message in [({"status": "bogus", "distance_m": 1.0}, "status 'bogus'"),
                            ({"status": "incomplete", "distance_m": 1.0}, "never ended"),
                            ({"status": "complete", "distance_m": -5.0}, "got -5.0")]:
        with pytest.raises(FieldValueError, match=message):
            store.end_run(run.id, ended_at=None, **kwargs)
    run.end(12.0)
    assert store.run(run.id).distance_m == 12.0


def test_reused_run_id_is_a_clear_error_and_the_first_run_is_kept(tmp_path):
    db = tmp_path / "f.db"
    _good_run(db, "r1")
    with pytest.raises(FieldValueError, match="run id 'r1' is already in .*give each run its own id"):
        with Run(db, "cf", run_id="r1") as run:
            run.event("collision")
    (rec,) = Store(db).runs()
    assert (rec.id, rec.distance_m, rec.count("collision")) == ("r1", 100.0, 1)


def test_typing_end_minus_5_in_field_log_is_refused_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    db = tmp_path / "f.db"
    code, out, err = qaopt(capsys, "field", "log", "--store", str(db), "--app", "cf",
                           stdin="d 10\nend -5\nend nan\nd inf\nc 12\nend 30\n", monkeypatch=monkeypatch)
    assert code == 0, err
    assert err.count("not logged") == 3 and "got -5.0" in err and "got nan" in err and "got inf" in err
    (rec,) = Store(db).runs()
    assert (rec.status, rec.distance_m) == ("complete", 30.0)
    assert [(e.kind, e.distance_m) for e in rec.events] == [("progress", 10.0), ("collision", 12.0)]


def test_nan_in_an_import_file_names_the_line_and_imports_nothing(tmp_path):
    src = tmp_path / "runs.jsonl"
    ok = {"id": "a", "application": "cf", "started_at": "2026-06-01T10:00:00Z"}
    src.write_text(json.dumps(ok) + "\n" + json.dumps(
        {**ok, "id": "b", "events": [{"kind": "note", "data": {"x": math.nan}}]}) + "\n")
    with pytest.raises(FieldError, match=r"runs.jsonl:2: events.0.data: .*x: nan is not a finite number"):
        import_file(Store(tmp_path / "f.db"), src)
    assert Store(tmp_path / "f.db").runs() == []


# ---- readers never fail because of one bad row -----------------------------------------------

def test_store_runs_reports_bad_rows_and_returns_everything_else(poisoned):
    db = poisoned
    with pytest.warns(FieldDataWarning) as seen:
        runs = {r.id: r for r in Store(db).runs()}
    messages = "\n".join(str(w.message) for w in seen)
    assert "run bad: event 1 (note): data: " in messages and "that event is left out" in messages
    assert "run bad: end: status: " in messages and "distance_m: " in messages
    assert "the run reads as incomplete" in messages and "qaopt field exclude bad --reason" in messages
    assert (runs["good"].status, runs["good"].distance_m, runs["good"].count("collision")) == ("complete", 100.0, 1)
    bad = runs["bad"]
    assert bad.status == "incomplete" and [e.kind for e in bad.events] == ["progress"] and bad.known_distance_m == 7.0


def test_summary_and_export_go_on_past_a_bad_row(poisoned, tmp_path, capsys):
    db = poisoned
    code, out, err = qaopt(capsys, "field", "summary", "--store", str(db))
    assert code == 0, err
    assert "warning: skipped: " in err and "run bad: end: " in err and "Traceback" not in err
    row = next(line for line in out.splitlines() if "│ cf" in line)
    assert "100.0" in row and "1 [0.0253, 5.57]" in row  # the good run: 1 collision in 100 m
    dest = tmp_path / "out.json"
    code, _, err = qaopt(capsys, "field", "export", "--store", str(db), "-o", str(dest))
    assert code == 0 and "run bad: " in err
    exported = {r["id"]: r for r in json.loads(dest.read_text())}
    assert exported["good"]["distance_m"] == 100.0 and exported["bad"]["status"] == "incomplete"


def test_summary_row_without_distance_prints_no_nan(tmp_path, capsys):
    db = tmp_path / "f.db"
    run = Run(db, "cf", config={"hash": "B"}).start()  # never ends, never moves: nothing to count
    run.event("collision")
    code, out, _ = qaopt(capsys, "field", "summary", "--store", str(db))
    row = next(line for line in out.splitlines() if "│ cf" in line)
    assert code == 0 and "nan" not in row and "inf" not in row and "- (no distance)" in row
    assert str(poisson_rate(0, 0.0)) == "- (no distance)"


# ---- a documented way to set a bad run aside ----------------------------------------------------

def test_exclude_sets_a_bad_run_aside_and_keeps_every_other_record(poisoned, tmp_path, capsys):
    db = poisoned
    code, out, err = qaopt(capsys, "field", "exclude", "bad", "--reason", "odometer reset", "--store", str(db))
    assert code == 0 and "run bad excluded: odometer reset" in out, err
    code, out, err = qaopt(capsys, "field", "summary", "--store", str(db))
    assert code == 0 and err == ""  # the bad rows are no longer read, so no warning
    assert [line for line in out.splitlines() if "│ cf" in line][0].split("│")[4].strip() == "1"  # runs
    # nothing was deleted: the good run is whole, the bad run is still in the store and in exports
    stored = _stored(db)
    assert stored["good"].distance_m == 100.0 and stored["good"].exclusion is None
    assert stored["bad"].exclusion == "odometer reset" and [e.kind for e in stored["bad"].events] == [EXCLUDED, "progress"]
    code, out, _ = qaopt(capsys, "field", "export", "--store", str(db))
    assert {r["id"] for r in json.loads(out)} == {"good", "bad"}
    # a second exclusion, an unknown run, no reason: one clear line, exit 2, nothing written
    for args, message in [(["bad", "--reason", "again"], "already excluded (odometer reset)"),
                          (["nope", "--reason", "x"], "no run 'nope'"),
                          (["good", "--reason", " "], "give a reason")]:
        code, _, err = qaopt(capsys, "field", "exclude", *args, "--store", str(db))
        assert code == 2 and err.startswith("error: ") and message in err and len(err.splitlines()) == 1
    assert _stored(db) == stored


def test_excluding_a_live_run_never_blocks_its_logging(tmp_path):
    db = tmp_path / "f.db"
    with Run(db, "cf") as run:
        run.progress(1.0)
        Store(db).exclude(run.id, "test drive")
        run.progress(2.0)  # the exclusion's sequence number is negative: no clash with the run's
    rec = Store(db).run(run.id)
    assert rec.exclusion == "test drive" and rec.status == "complete" and rec.distance_m == 2.0
    assert Store(db).runs() == []


def test_an_excluded_run_round_trips_through_export_and_import(tmp_path):
    from qaopt.field.transfer import write_records

    db, other = tmp_path / "f.db", tmp_path / "g.db"
    _good_run(db)
    _good_run(db, "second")
    Store(db).exclude("second", "wrong crop")
    dump = tmp_path / "all.json"
    with open(dump, "w") as f:
        write_records(Store(db).runs(include_excluded=True), f, "json")
    import_file(Store(other), dump)
    assert [r.id for r in Store(other).runs()] == ["good"]
    assert Store(other).run("second").exclusion == "wrong crop"


def test_the_documented_repair_exclude_export_edit_import(poisoned, tmp_path, capsys):
    """docs/field.md: exclude the bad run, export, fix a copy under a new id, import the file back."""
    db, dump = poisoned, tmp_path / "all.json"
    assert qaopt(capsys, "field", "exclude", "bad", "--reason", "end distance lost", "--store", str(db))[0] == 0
    assert qaopt(capsys, "field", "export", "--store", str(db), "-o", str(dump))[0] == 0
    records = json.loads(dump.read_text())
    bad = next(r for r in records if r["id"] == "bad")
    fixed = dict(bad, id="bad-fixed", status="complete", ended_at=bad["started_at"], distance_m=50.0)
    fixed["events"] = [e for e in fixed["events"] if e["kind"] != EXCLUDED]
    dump.write_text(json.dumps([*records, fixed]))
    code, out, err = qaopt(capsys, "field", "import", str(dump), "--store", str(db))
    assert code == 0 and "1 run(s) imported, 2 already present" in out, err
    runs = {r.id: r for r in Store(db).runs()}
    assert sorted(runs) == ["bad-fixed", "good"] and runs["bad-fixed"].distance_m == 50.0
    assert _stored(db)["bad"].exclusion == "end distance lost"
