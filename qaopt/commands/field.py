"""``qaopt field ...``: log field runs live, import, export and summarize them, plan the next.

The store is ``--store`` (a SQLite file or a SQLAlchemy URL; env ``QAOPT_FIELD_STORE``)
or the ``evaluator.field.store`` of ``--spec``. The same commands run alone as
``qaopt-field ...`` (:func:`main`), which needs only the field log's light dependencies
(the robot's install, ``docs/field.md``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from qaopt.commands import runner
from qaopt.field import FieldError, Run, Store
from qaopt.field.records import COLLISION, INTERVENTION

app = typer.Typer(name="field", help="Field trials: log runs, import/export, summarize, plan.",
                  no_args_is_help=True)

StoreOpt = typer.Option(None, "--store", envvar="QAOPT_FIELD_STORE",
                        help="Field store: a SQLite file or a SQLAlchemy URL.")
SpecOpt = typer.Option(None, "--spec", help="Use the spec's evaluator.field.store.")


def _report(problem: str) -> None:
    """A stored row that does not read back: named on stderr, the command goes on."""
    typer.echo(f"warning: skipped: {problem}", err=True)


def open_store(store: str | None, spec: Path | None) -> Store:
    """The store named on the command line, else the spec's ``evaluator.field.store``."""
    if store:
        return Store(store, on_problem=_report)
    if spec is not None:
        from qaopt.spec import load_spec

        field = load_spec(spec, check_entry_points=False).evaluator.field
        if field is None:
            raise FieldError(f"{spec}: evaluator.field is not set; add `evaluator: {{field: "
                             "{store: field.db}}}` or pass --store")
        return Store(field.store, on_problem=_report)
    raise FieldError("no field store given; pass --store FILE_OR_URL, --spec SPEC, "
                     "or set QAOPT_FIELD_STORE")


def _pairs(items: list[str], option: str, numeric: bool) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise FieldError(f"{option} {item!r}: write KEY=VALUE, e.g. {option} heading=3.5")
        if numeric:
            try:
                out[key] = float(value)
            except ValueError:
                raise FieldError(f"{option} {item!r}: {value!r} is not a number") from None
        else:
            out[key] = value
    return out


_LIVE_HELP = """\
Type one command per line (Ctrl-D or `end` ends the run, Ctrl-C aborts it):
  c [M] [NOTE]   collision at odometer M metres      i [M] [NOTE]  intervention
  d M            odometer reading (keeps the distance if the laptop dies)
  ev KIND [M]    an event of your own kind           n TEXT        note
  a PATH [KIND]  attach a file (video, bag)          end [M]       end the run (distance M)"""


@app.command("log")
def log(
    application: str = typer.Option(..., "--app", help="Application name (as in the spec)."),
    store: Optional[str] = StoreOpt,
    spec: Optional[Path] = SpecOpt,
    config_hash: str = typer.Option("", "--config-hash", help="Deployed configuration's hash."),
    knobs: str = typer.Option("", "--knobs", help='Per-NN knobs as JSON: {"heading": {"prune": 0.5}}.'),
    nn_error: list[str] = typer.Option([], "--nn-error", help="Measured NN error, NN=VALUE (repeat)."),
    error_point: list[str] = typer.Option([], "--error-point", help="Injected error, AXIS=VALUE (repeat)."),
    condition: list[str] = typer.Option([], "--condition", help="crop=corn, growth_stage=V6, ... (repeat)."),
    operator: str = typer.Option("", "--operator"),
    notes: str = typer.Option("", "--notes"),
) -> None:
    """Log one run live from the keyboard: each line is stored the moment you press Enter."""
    try:
        knob_dict = json.loads(knobs) if knobs else {}
    except json.JSONDecodeError as exc:
        raise FieldError(f"--knobs is not JSON ({exc.msg}); e.g. --knobs '{{\"heading\": {{\"prune\": 0.5}}}}'") from None
    console = Console(stderr=True, soft_wrap=True)
    config = {"hash": config_hash, "knobs": knob_dict, "nn_errors": _pairs(nn_error, "--nn-error", True)}
    with open_store(store, spec) as st, Run(
        st, application, config=config, error_point=_pairs(error_point, "--error-point", True) or None,
        conditions=_pairs(condition, "--condition", False), operator=operator, notes=notes, source="cli",
    ) as run:
        console.print(f"run [bold]{run.id}[/] started in {st.display_url}")
        console.print(_LIVE_HELP, markup=False)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            try:
                if _live_command(run, words, console):
                    break
            except (FieldError, ValueError) as exc:  # a typo must not end the run
                console.print(f"[red]not logged:[/] {str(exc).splitlines()[0]}")
    console.print(f"run {run.id} ended: {run.status}, {run.distance_m} m")


def _live_command(run: Run, words: list[str], console: Console) -> bool:
    """Apply one typed command; True when it ended the run."""
    cmd, args = words[0].lower(), words[1:]

    def metres(i: int) -> float | None:
        return float(args[i]) if len(args) > i else None

    if cmd in ("c", "i"):
        kind = COLLISION if cmd == "c" else INTERVENTION
        note = {"note": " ".join(args[1:])} if len(args) > 1 else {}
        run.event(kind, distance_m=metres(0), **note)
        console.print(f"{kind} logged")
    elif cmd == "d" and args:
        run.progress(float(args[0]))
    elif cmd == "ev" and args:
        run.event(args[0], distance_m=metres(1))
    elif cmd == "n" and args:
        run.note(" ".join(args))
    elif cmd == "a" and args:
        run.attach(args[0], args[1] if len(args) > 1 else "")
    elif cmd == "end":
        run.end(metres(0))
        return True
    else:
        console.print(f"unknown command {' '.join(words)!r}", markup=False)
        console.print(_LIVE_HELP, markup=False)
    return False


@app.command("import")
def import_(
    file: Path = typer.Argument(..., help="A .csv, .json or .jsonl file of runs."),
    store: Optional[str] = StoreOpt,
    spec: Optional[Path] = SpecOpt,
    fmt: Optional[str] = typer.Option(None, "--format", help="csv | json | jsonl (default: the suffix)."),
) -> None:
    """Import runs: the whole file or nothing; bad records are named with their line numbers."""
    from qaopt.field.transfer import import_file

    with open_store(store, spec) as st:
        result = import_file(st, file, fmt)
    typer.echo(f"{file}: {len(result.added)} run(s) imported, "
               f"{len(result.already_present)} already present")


@app.command("import-bag")
def import_bag(
    bag: Path = typer.Argument(..., help="A ROS 2 bag: the folder `ros2 bag record -s mcap` wrote (every split file), or one .mcap file."),
    store: Optional[str] = StoreOpt,
    spec: Optional[Path] = typer.Option(
        None, "--spec", help="Read the bag with the spec's evaluator.field.bag, for its app, into its store."),
    application: Optional[str] = typer.Option(None, "--app", help="Application name (default: the spec's)."),
    mapping: Optional[Path] = typer.Option(
        None, "--mapping", help="A JSON file holding an evaluator.field.bag section (the robot's light install)."),
    condition: list[str] = typer.Option([], "--condition", help="weather=dry, field=plot-A, ... for every run (repeat)."),
    operator: Optional[str] = typer.Option(None, "--operator", help="Who drove (over the bag's own)."),
    skip_bad: bool = typer.Option(
        False, "--skip-bad", help="Leave bad messages out (each named, and noted in its run) instead of importing nothing."),
) -> None:
    """Import the runs of a ROS 2 bag (MCAP): the whole bag or nothing; bad messages are named with topic and time."""
    from qaopt.field import bag as bags

    path = bag
    conditions = _pairs(condition, "--condition", False)
    options = dict(conditions=conditions, operator=operator, skip_bad=skip_bad)
    if spec is not None:
        if mapping is not None:
            raise FieldError("import-bag: --mapping replaces a spec's evaluator.field.bag; give --spec or --mapping")
        done = bags.import_spec_bag(spec, path, store=store, application=application, **options)
    else:
        if application is None:
            raise FieldError("import-bag: name the application with --app NAME (or give --spec SPEC)")
        with open_store(store, None) as st:
            try:
                done = bags.import_bag(st, path, bags.load_mapping(mapping) if mapping else None,
                                       application=application, **options)
            except bags.BagMappingError as exc:  # named in the mapping file, when there is one
                if mapping is None:
                    raise
                raise FieldError("\n".join(f"{mapping}: {where}: {message}"
                                           for where, message in exc.problems)) from None
    for note in done.reading.notes:
        typer.echo(f"note: {note}", err=True)
    for problem in done.reading.skipped:
        typer.echo(f"warning: left out: {problem}", err=True)
    added = set(done.result.added)
    table = Table(title=f"{path.name}: {len(done.reading.runs)} run(s)")
    for col in ("run", "started", "min", "status", "config", "distance m", "collisions", "interventions",
                "other events", ""):
        table.add_column(col)
    for r in done.reading.runs:
        minutes = "-" if r.ended_at is None else f"{(r.ended_at - r.started_at).total_seconds() / 60:.1f}"
        others = len(r.events) - r.count(COLLISION) - r.count(INTERVENTION)
        table.add_row(r.id, f"{r.started_at:%Y-%m-%d %H:%M:%S}", minutes, r.status, r.config.hash,
                      f"{r.distance_m:.1f}", str(r.count(COLLISION)), str(r.count(INTERVENTION)), str(others),
                      "new" if r.id in added else "already present")
    Console(width=200).print(table)
    typer.echo(f"{path}: {len(done.result.added)} run(s) imported, "
               f"{len(done.result.already_present)} already present")


@app.command("export")
def export(
    store: Optional[str] = StoreOpt,
    spec: Optional[Path] = SpecOpt,
    fmt: str = typer.Option("json", "--format", help="json (full) | jsonl | csv (one row per run)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="File to write (default: stdout)."),
    application: Optional[str] = typer.Option(None, "--app", help="Only this application's runs."),
) -> None:
    """Export runs (excluded ones too, with their exclusion); JSON exports import back unchanged."""
    from qaopt.app_spec import store as store_files
    from qaopt.field.transfer import write_records

    with open_store(store, spec) as st:
        records = st.runs(application=application, include_excluded=True)
    if output is None:
        write_records(records, sys.stdout, fmt)
        return
    # Never leave a half-written export under the real name.
    with store_files.atomic_path(output) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        write_records(records, f, fmt)
    typer.echo(f"{len(records)} run(s) written to {output}", err=True)


@app.command("summary")
def summary(
    store: Optional[str] = StoreOpt,
    spec: Optional[Path] = SpecOpt,
    application: Optional[str] = typer.Option(None, "--app", help="Only this application's runs."),
    confidence: float = typer.Option(0.95, "--confidence", min=0.5, max=0.999),
    include_incomplete: bool = typer.Option(
        False, "--include-incomplete", help="Count runs that never ended, up to their last odometer reading."),
) -> None:
    """Per configuration: runs, distance, collisions and interventions per 100 m (exact Poisson CI)."""
    from qaopt.field.summary import summarize

    with open_store(store, spec) as st:
        rows = summarize(st.runs(application=application), confidence=confidence,
                         include_incomplete=include_incomplete)
    pct = f"{confidence:.0%}"
    table = Table(title=f"field runs per configuration (rates per 100 m, {pct} exact Poisson interval)")
    for col in ("app", "config", "error point", "runs", "left out", "distance m",
                "collisions", f"collisions/100 m [{pct}]", "interventions", f"interventions/100 m [{pct}]"):
        table.add_column(col, justify="right" if col not in ("app", "config", "error point") else "left")
    for r in rows:
        table.add_row(r.application, r.config_hash, r.point_label, str(r.runs), str(r.left_out),
                      f"{r.distance_m:.1f}", str(r.collisions.count), str(r.collisions),
                      str(r.interventions.count), str(r.interventions))
    Console(width=200).print(table)


@app.command("exclude")
def exclude(
    run_id: str = typer.Argument(..., help="The run to set aside (its id, as `export` shows it)."),
    reason: str = typer.Option(..., "--reason", help="Why, kept with the run (e.g. 'odometer reset')."),
    store: Optional[str] = StoreOpt,
    spec: Optional[Path] = SpecOpt,
) -> None:
    """Leave a bad run out of summary, evidence and plan; it stays in the store and in exports."""
    with open_store(store, spec) as st:
        st.exclude(run_id, reason)
    typer.echo(f"run {run_id} excluded: {reason.strip()}")


def _spec_region(spec_path: Path, region_path: Path | None, store: str | None, console: Console):
    """The spec, its calibrated region (or an empty one) and the field evidence folded into it.

    The region defaults to ``<output.dir>/region.json``, where ``qaopt calibrate`` writes it.
    """
    from qaopt.spec import load_spec
    from qaopt.calibrate import ErrorRegion
    from qaopt.spec_adapter import acceptance_of, space_of
    from qaopt.field.evidence import apply_evidence, spec_evidence

    spec = load_spec(spec_path, check_entry_points=False)
    space = space_of(spec)
    default = Path(spec.output.dir) / "region.json"
    if region_path is None and default.exists():
        region_path = default
    if region_path is not None:
        region = ErrorRegion.load(region_path)
        if region.space.names != space.names:
            raise FieldError(f"{region_path}: region axes {list(region.space.names)} differ from "
                             f"{spec_path}'s calibration.space {list(space.names)}; calibrate again")
    else:
        console.print(f"no region at {default} (run `qaopt calibrate {spec_path}`, or pass --region): "
                      "using the field evidence alone", markup=False)
        region = ErrorRegion(space, acceptance_of(spec))
    before = region.copy()
    records = []
    if store or spec.evaluator.field is not None:
        with open_store(store, spec_path) as st:
            records = st.runs(application=spec.app.name)
            found = spec_evidence(spec, st)
    else:
        found = spec_evidence(spec)
    changes = apply_evidence(region, found.evidence)
    return spec, before, region, records, found, changes


def _point(errors: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in errors.items())


RegionOpt = typer.Option(None, "--region", help="The calibrated region (default: <output.dir>/region.json).")


@app.command("evidence")
def evidence(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    region: Optional[Path] = RegionOpt,
    store: Optional[str] = StoreOpt,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the region with the field evidence."),
) -> None:
    """Field runs as calibration evidence: verdict per point, and where the field overturns the simulator."""
    from qaopt.field.evidence import certified_fraction

    console = Console(width=200)
    _, before, after, records, found, changes = _spec_region(spec, region, store, console)
    table = Table(title=f"field evidence from {len(records)} run(s)")
    for col in ("error point", "runs", "passes", "failures", "field verdict"):
        table.add_column(col)
    for ev in found.evidence:
        verdict = after.acceptance.decide_fixed(ev.failures, ev.passes + ev.failures).value
        table.add_row(_point(dict(ev.errors)), str(ev.passes + ev.failures), str(ev.passes),
                      str(ev.failures), verdict)
    console.print(table)
    for u in found.unused:
        console.print(f"not evidence: run {u.run_id}: {u.reason}", markup=False)
    overturned = [c for c in changes if c.overturned]
    if overturned:
        t2 = Table(title="field overturns the simulator")
        for col in ("error point", "simulator", "field"):
            t2.add_column(col)
        for c in overturned:
            t2.add_row(_point(c.errors), "valid" if not c.after else "invalid", "valid" if c.after else "invalid")
        console.print(t2)
    console.print(f"certified valid share of the error space: {certified_fraction(before):.1%} "
                  f"(before field evidence) -> {certified_fraction(after):.1%} (after); "
                  f"{len(overturned)} simulator verdict(s) overturned")
    if output is not None:
        after.save(output)
        console.print(f"region with field evidence written to {output}")


@app.command("plan")
def plan(
    spec: Path = typer.Argument(..., help="The application spec (YAML)."),
    region: Optional[Path] = RegionOpt,
    store: Optional[str] = StoreOpt,
    top: int = typer.Option(3, "--top", min=1, help="How many proposals to show."),
    doubt: float = typer.Option(0.1, "--doubt", min=0.0, max=0.49,
                                help="How far a simulator-only verdict is from certain in the field."),
    run_length_m: Optional[float] = typer.Option(
        None, "--run-length-m", help="Length of one field run (default: the simulator's run_length_m)."),
    candidates: Optional[Path] = typer.Option(
        None, "--candidates", help='JSON {"label": {"heading": 3.1, ...}}: configurations you could deploy.'),
) -> None:
    """Propose the next field trials (error point or configuration, and how many runs) that most
    reduce the uncertainty of the region."""
    from qaopt.field.plan import configuration_candidates
    from qaopt.field.plan import plan as make_plan

    console = Console(width=200)
    app_spec, _, reg, records, _, _ = _spec_region(spec, region, store, console)
    configs = {f"config {r.config.hash}": r.config.nn_errors for r in records if r.config.nn_errors}
    if candidates is not None:
        try:
            configs |= json.loads(candidates.read_text())
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            raise FieldError(f"{candidates}: not a JSON object of label -> NN errors ({exc})") from None
    if run_length_m is None and app_spec.evaluator.simulator is not None:
        run_length_m = app_spec.evaluator.simulator.params.get("run_length_m")
    proposals = make_plan(reg, configuration_candidates(configs, reg.space.names), top=top,
                          doubt=doubt, run_length_m=run_length_m)
    if not proposals:
        console.print("nothing left to test: the field has decided every point of the error space")
        return
    table = Table(title="next field trials (best first)")
    for col in ("#", "test", "at", "P(valid)", "uncertainty resolved", "logged pass/fail",
                "runs to certify", "rejected if failures >=", "distance"):
        table.add_column(col)
    for i, p in enumerate(proposals, 1):
        table.add_row(str(i), p.candidate.label or "inject error point", _point(p.candidate.errors),
                      f"{p.p_valid:.2f}", f"{p.score:.1%}", f"{p.logged[0]}/{p.logged[1]}",
                      "-" if p.runs is None else str(p.runs),
                      "-" if p.reject_failures is None else str(p.reject_failures),
                      "-" if p.distance_m is None else f"{p.distance_m / 1000:.1f} km")
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    """``qaopt-field``: the field commands alone, for the robot's light install.

    As ``qaopt`` does, bad input prints ``error: ...`` lines and exits 2 (a traceback
    only with ``QAOPT_DEBUG=1``), and Ctrl-C ends with one line and status 130.
    """
    runner.run(app, argv, "qaopt-field", debug=lambda: bool(os.environ.get("QAOPT_DEBUG")))
