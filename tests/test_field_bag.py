"""ROS 2 bags (MCAP) into the field store: bags written here with mcap_ros2's writer and the real
``ros2msg`` schemas rosbag2 stores (nothing downloaded), read back through the mapping."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest
import yaml

from qaopt.app_spec import SpecError, load
from qaopt.cli import main
from qaopt.app_spec.schema import BagMapping
from qaopt.field import BagMappingError, FieldError, ImportRowsError, Store, import_bag, read_bag, ros_events
from qaopt.field.bag import load_mapping
from qaopt.field.synthetic_bag import SyntheticBag

REPO = Path(__file__).resolve().parents[1]
S = 1_000_000_000
T0 = 1_780_000_000 * S  # 2026-05-28, nanoseconds since the epoch as rosbag2 logs them
ROW = 20.0  # m: straight along a row, a U-turn of radius 0.38 m, back down the next row


def on_path(s: float) -> tuple[float, float]:
    """The point at arc length ``s`` of a row, a headland U-turn and the next row."""
    r = 0.38
    if s <= ROW:
        return s, 0.0
    if s <= ROW + math.pi * r:
        a = (s - ROW) / r
        return ROW + r * math.sin(a), r - r * math.cos(a)
    return ROW - (s - ROW - math.pi * r), 2 * r


def drive(bag: SyntheticBag, start_ns: int, seconds: float, speed: float = 0.6, hz: int = 50,
          from_m: float = 0.0) -> float:
    """Odometry at ``hz`` along the path (from ``from_m`` on it) for ``seconds``; returns the simulated path length."""
    n = int(seconds * hz)
    for i in range(n + 1):
        t = i / hz
        x, y = on_path(from_m + speed * t)
        bag.odometry(start_ns + round(t * S), x, y, 0.0, speed)
    return speed * n / hz


def at(start_ns: int, seconds: float) -> int:
    return start_ns + round(seconds * S)


def three_runs(path: Path) -> dict:
    """Three runs split by /qaopt/run, events in each, a configuration change between the 2nd and 3rd."""
    truth = {"lengths": [], "starts": []}
    with SyntheticBag(path) as bag:
        bag.metadata("qaopt", {"weather": "dry", "field": "plot-A", "operator": "ana"})
        bag.json("/qaopt/config", ros_events_config("3f2a9c", {"heading": 4.1}), T0)
        bag.channel("/bumper", "std_msgs/msg/Bool")
        bag.channel("/qos/near_miss", "std_msgs/msg/Empty")
        for k, seconds in enumerate((60.0, 75.0, 45.0)):
            start = T0 + (10 + 120 * k) * S
            truth["starts"].append(start)
            if k == 2:
                bag.json("/qaopt/config", ros_events_config("b71e00", {"heading": 6.0}), start - S)
            bag.string("/qaopt/run", ros_events.run_start({"light": "overcast"} if k == 1 else {}), start)
            truth["lengths"].append(drive(bag, start, seconds))
            bag.string("/qaopt/run", ros_events.run_end(), at(start, seconds + 0.01))
            if k == 0:
                bag.string("/qaopt/events", ros_events.event("collision", note="stalk"), at(start, 20.005))
                for t, flag in ((30.0, True), (30.1, True), (30.2, False), (40.0, True)):
                    bag.write("/bumper", "std_msgs/msg/Bool", {"data": flag}, at(start, t))
            if k == 1:
                bag.write("/qos/near_miss", "std_msgs/msg/Empty", {}, at(start, 5.0))
                bag.string("/qaopt/events", ros_events.event("intervention", reason="drifted"), at(start, 50.0))
        bag.string("/qaopt/events", ros_events.event("collision"), T0 + 500 * S)  # after every run
    return truth


def ros_events_config(hash_: str, nn_errors: dict) -> dict:
    import json

    return json.loads(ros_events.config(hash_, nn_errors=nn_errors))


MAPPING = BagMapping(events={"/qaopt/events": "json", "/bumper": "collision", "/qos/near_miss": "near_miss"})


def test_odometry_distance_events_and_runs(tmp_path):
    bag = tmp_path / "day1.mcap"
    truth = three_runs(bag)
    store = Store(tmp_path / "f.db")
    done = import_bag(store, bag, MAPPING, application="cropfollow", conditions={"crop": "maize"})
    assert len(done.result.added) == 3 and done.result.already_present == []
    assert [n.split(": ", 2)[-1] for n in done.reading.notes] == ["collision outside any run, not imported"]
    runs = store.runs()
    assert [r.started_at.timestamp() for r in runs] == [s / S for s in truth["starts"]]
    for run, length in zip(runs, truth["lengths"]):
        assert run.status == "complete" and run.source == "bag:day1.mcap"
        assert run.distance_m == pytest.approx(length, rel=0.01)  # the U-turn included
        assert run.conditions.weather == "dry" and run.conditions.crop == "maize" and run.operator == "ana"
        assert run.conditions.model_extra["field"] == "plot-A"
    first, second, third = runs
    assert [(e.kind, e.data) for e in first.events] == [
        ("collision", {"note": "stalk"}), ("collision", {}), ("collision", {})]  # the bumper turned true twice
    assert first.events[0].distance_m == pytest.approx(0.6 * 20.0, abs=0.02)
    assert first.events[0].position == pytest.approx({"x": 12.0, "y": 0.0}, abs=0.02)
    assert first.events[0].t_s == pytest.approx(20.005)
    assert [e.kind for e in second.events] == ["near_miss", "intervention"]
    assert second.conditions.light == "overcast" and third.events == ()
    assert [r.config.hash for r in runs] == ["3f2a9c", "3f2a9c", "b71e00"]
    assert third.config.nn_errors == {"heading": 6.0}
    assert third.ended_at.timestamp() == pytest.approx(truth["starts"][2] / S + 45.01)


def test_reimporting_a_bag_adds_nothing_and_other_settings_are_refused(tmp_path):
    bag = tmp_path / "day1.mcap"
    three_runs(bag)
    store = Store(tmp_path / "f.db")
    import_bag(store, bag, MAPPING, application="cropfollow")
    again = import_bag(store, bag, MAPPING, application="cropfollow")
    assert again.result.added == [] and len(again.result.already_present) == 3
    with pytest.raises(ImportRowsError, match="imported from this bag before"):
        import_bag(store, bag, MAPPING, application="cropfollow", operator="bob")
    assert len(store.runs()) == 3


def test_split_on_a_pause_of_the_odometry(tmp_path):
    bag = tmp_path / "gaps.mcap"
    with SyntheticBag(bag) as b:
        first = drive(b, T0, 30.0)
        b.string("/qaopt/events", ros_events.event("collision"), T0 + 10 * S)
        b.string("/qaopt/events", ros_events.event("intervention"), T0 + 45 * S)  # in the pause
        second = drive(b, T0 + 90 * S, 20.0, speed=0.5)
        b.string("/qaopt/events", ros_events.event("collision"), T0 + 95 * S)
    mapping = BagMapping(runs={"gap_s": 5.0}, config=None)
    reading = read_bag(bag, mapping, application="cf")
    assert [r.distance_m for r in reading.runs] == [pytest.approx(first, rel=0.01), pytest.approx(second, rel=0.01)]
    assert [[e.kind for e in r.events] for r in reading.runs] == [["collision"], ["collision"]]
    assert len(reading.notes) == 1 and "intervention outside any run" in reading.notes[0]
    assert reading.runs[1].events[0].distance_m == pytest.approx(2.5, abs=0.02)


def test_velocity_and_odometer_sources_and_a_bag_without_run_topic(tmp_path):
    bag = tmp_path / "one.mcap"
    with SyntheticBag(bag) as b:
        length = drive(b, T0, 40.0, speed=0.7)
        for i in range(0, 401):  # a /qos/distance odometer at 10 Hz that starts at 100 m
            b.write("/qos/distance", "std_msgs/msg/Float64", {"data": 100.0 + 0.07 * i}, T0 + i * S // 10)
    common = dict(config=None, runs=None, events={})
    by_speed = read_bag(bag, BagMapping(distance={"source": "velocity"}, ignore=["/qos/distance"], **common),
                        application="cf")
    by_odometer = read_bag(bag, BagMapping(distance={"topic": "/qos/distance", "source": "odometer"}, **common),
                           application="cf")
    (a,), (b,) = by_speed.runs, by_odometer.runs
    assert a.distance_m == pytest.approx(length, rel=0.01) and b.distance_m == pytest.approx(length, rel=0.01)
    assert a.status == "complete" and a.started_at.timestamp() == T0 / S


def test_a_bad_message_imports_nothing_and_is_named_with_topic_time_and_reason(tmp_path):
    bag = tmp_path / "bad.mcap"
    with SyntheticBag(bag) as b:
        b.json("/qaopt/config", {"hash": "3f2a9c"}, T0)
        b.string("/qaopt/run", ros_events.run_start(), T0 + S)
        drive(b, T0 + S, 10.0)
        b.raw("/odom", "nav_msgs/msg/Odometry", b"\x00\x01\x00\x00\x07\x00", T0 + 5 * S + 1)
        b.odometry(T0 + 5 * S + 2, math.nan, 0.0, 0.0, 0.6)
        b.string("/qaopt/events", '{"event": "collision", "distance_m": -3}', T0 + 6 * S)
        b.string("/qaopt/run", ros_events.run_end(), T0 + 12 * S)
    store = Store(tmp_path / "f.db")
    with pytest.raises(ImportRowsError) as err:
        import_bag(store, bag, application="cf")
    lines = str(err.value).splitlines()
    assert lines[0] == "nothing imported: 3 bad message(s); fix them and import the bag again"
    assert lines[1].startswith(f"{bag}: /odom @ 2026-05-28T20:26:45.000000001Z: cannot decode as nav_msgs/msg/Odometry")
    assert lines[2] == f"{bag}: /odom @ 2026-05-28T20:26:45.000000002Z: pose.pose.position is not finite: (nan, 0.0)"
    assert lines[3] == (f"{bag}: /qaopt/events @ 2026-05-28T20:26:46.000000000Z: distance_m: "
                        "Input should be greater than or equal to 0")
    assert store.runs() == []
    done = import_bag(store, bag, application="cf", skip_bad=True)
    assert len(done.reading.skipped) == 3
    (run,) = store.runs()
    assert run.events == () and "3 bad bag message(s) left out" in run.notes
    assert run.distance_m == pytest.approx(6.0, rel=0.01)


def test_a_truncated_bag_is_one_line_naming_the_file(tmp_path):
    bag = tmp_path / "cut.mcap"
    three_runs(bag)
    data = bag.read_bytes()
    bag.write_bytes(data[: len(data) * 2 // 3])
    store = Store(tmp_path / "f.db")
    with pytest.raises(FieldError) as err:
        import_bag(store, bag, MAPPING, application="cf")
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{bag}: not a complete MCAP bag") and "mcap recover cut.mcap" in line
    assert store.runs() == []
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # one bad byte inside a compressed chunk
    bag.write_bytes(bytes(flipped))
    with pytest.raises(FieldError) as err:
        import_bag(store, bag, MAPPING, application="cf")
    assert _one_line(err).startswith(f"{bag}: not a complete MCAP bag") and store.runs() == []
    (tmp_path / "text.mcap").write_text("id,distance\n")
    with pytest.raises(FieldError, match=r"text.mcap: not a complete MCAP bag"):
        read_bag(tmp_path / "text.mcap", application="cf")


def _bag_with(tmp_path: Path, extra, name: str = "b.mcap", events: bool = True) -> Path:
    """One run in qaopt's convention (an event topic without events unless ``events`` is False), and ``extra``."""
    bag = tmp_path / name
    with SyntheticBag(bag) as b:
        if events:
            b.channel("/qaopt/events", "std_msgs/msg/String")
        b.json("/qaopt/config", {"hash": "x"}, T0)
        b.string("/qaopt/run", ros_events.run_start(), T0)
        drive(b, T0, 2.0)
        b.string("/qaopt/run", ros_events.run_end(), T0 + 3 * S)
        extra(b)
    return bag


def _one_line(exc: pytest.ExceptionInfo) -> str:
    (line,) = str(exc.value).splitlines()
    return line


def test_an_unknown_message_type_is_one_line(tmp_path):
    bag = _bag_with(tmp_path, lambda b: b.foreign("/qaopt/events", "qaopt.Event", "json", b'{"event": 1}', T0 + S),
                    events=False)
    with pytest.raises(BagMappingError) as err:
        read_bag(bag, application="cf")
    assert _one_line(err) == (
        "evaluator.field.bag.events./qaopt/events: topic /qaopt/events of b.mcap carries qaopt.Event encoded as "
        "json/json; import-bag reads ROS 2 messages (cdr/ros2msg, as rosbag2 records them): map a topic of a "
        "ROS 2 type instead")


def test_a_qos_topic_the_mapping_does_not_read_is_one_line(tmp_path):
    bag = _bag_with(tmp_path, lambda b: b.write("/qos/near_miss", "std_msgs/msg/Empty", {}, T0 + S))
    store = Store(tmp_path / "f.db")
    with pytest.raises(BagMappingError) as err:
        import_bag(store, bag, application="cf")
    assert _one_line(err).startswith("evaluator.field.bag.events: topic /qos/near_miss of b.mcap looks like a QoS "
                                     "topic (under /qaopt/, /qos/) but the mapping does not read it")
    assert store.runs() == []
    assert len(import_bag(store, bag, BagMapping(ignore=["/qos/near_miss"]), application="cf").result.added) == 1


def test_a_mapping_naming_a_topic_absent_from_the_bag_is_one_line(tmp_path):
    bag = _bag_with(tmp_path, lambda b: None)
    with pytest.raises(BagMappingError) as err:
        read_bag(bag, BagMapping(events={"/qaopt/events": "json", "/bumper": "collision"}), application="cf")
    assert _one_line(err) == (
        "evaluator.field.bag.events./bumper: topic /bumper is not in b.mcap (its topics: /odom, /qaopt/config, "
        "/qaopt/events, /qaopt/run); record it (`ros2 bag record ... /bumper`) or change the mapping")
    speed = _bag_with(tmp_path, lambda b: b.write("/speed", "std_msgs/msg/Float64", {"data": 1.0}, T0), "s.mcap",
                      events=False)
    with pytest.raises(BagMappingError) as err:
        read_bag(speed, BagMapping(distance={"topic": "/speed"}, events={}), application="cf")
    assert _one_line(err).startswith("evaluator.field.bag.distance.field: std_msgs/msg/Float64 on /speed has no "
                                     "x, y at 'pose.pose.position'")


def _spec(tmp_path: Path, bag_section: str | None) -> Path:
    data = yaml.safe_load((REPO / "examples" / "cropfollow.yaml").read_text())
    text = yaml.safe_dump(data, sort_keys=False).replace(
        "evaluator:\n", "evaluator:\n  field:\n    store: field.db\n" + (bag_section or ""), 1)
    spec = tmp_path / "app.yaml"
    spec.write_text(text)
    return spec


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_spec_mapping_errors_are_located(tmp_path):
    spec = _spec(tmp_path, "    bag:\n      distance: {topic: odom}\n")
    line = _line_of(spec, "distance: {topic: odom}")
    with pytest.raises(SpecError) as err:
        load(spec)
    assert _one_line(err) == (f"{spec}:{line}:18: evaluator.field.bag.distance.topic: 'odom' is not a fully "
                              "qualified ROS 2 topic; write e.g. /odom or /qaopt/events")
    spec = _spec(tmp_path, "    bag:\n      events:\n        /odom: collision\n")
    with pytest.raises(SpecError) as err:
        load(spec)
    assert _one_line(err) == (f"{spec}:{_line_of(spec, '/odom: collision')}:9: evaluator.field.bag.events./odom: "
                              "topic /odom is already read by distance.topic; give each topic one role")
    assert load(_spec(tmp_path, None)).evaluator.field.bag is None


def test_cli_imports_a_bag_through_the_spec_and_reports_one_located_line(tmp_path, capsys):
    bag = tmp_path / "day1.mcap"
    three_runs(bag)
    spec = _spec(tmp_path, "    bag:\n      events:\n        /qaopt/events: json\n        /bumper: collision\n"
                           "        /qos/near_miss: near_miss\n")
    with pytest.raises(SystemExit) as exc:
        main(["field", "import-bag", str(bag), "--spec", str(spec)])
    out = capsys.readouterr()
    assert exc.value.code == 0, out.err
    assert out.out.strip().endswith(f"{bag}: 3 run(s) imported, 0 already present")
    assert "note: day1.mcap: /qaopt/events @" in out.err
    assert len(Store(tmp_path / "field.db").runs(application="cropfollow")) == 3
    spec = _spec(tmp_path, "    bag:\n      events:\n        /qaopt/events: json\n        /bumper: collision\n")
    with pytest.raises(SystemExit) as exc:
        main(["field", "import-bag", str(bag), "--spec", str(spec)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith(f"error: {spec}:{_line_of(spec, 'events:')}:7: evaluator.field.bag.events: topic "
                           "/qos/near_miss of day1.mcap looks like a QoS topic")


def test_cli_light_path_with_a_json_mapping(tmp_path, capsys):
    bag = tmp_path / "rec"
    bag.mkdir()
    three_runs(bag / "rec_0.mcap")
    mapping = tmp_path / "bag.json"
    mapping.write_text('{"events": {"/qaopt/events": "json", "/bumper": "collision", "/qos/near_miss": "json"}}')
    with pytest.raises(SystemExit) as exc:
        main(["field", "import-bag", str(bag), "--store", str(tmp_path / "f.db"), "--app", "cf",
              "--mapping", str(mapping)])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.strip() == (f"error: {mapping}: events./qos/near_miss: topic /qos/near_miss carries "
                           "std_msgs/msg/Empty; this role reads std_msgs/msg/String (or map the topic to an event "
                           "kind instead of 'json')")
    mapping.write_text('{"events": {"/qaopt/events": "json"}, "ignore": ["/bumper"], "distance": {"source": "gps"}}')
    with pytest.raises(FieldError) as e:
        load_mapping(mapping)
    assert str(e.value).startswith(f"{mapping}: distance.source: Input should be 'position', 'velocity' or")


def test_the_robot_helper_publishes_what_import_bag_reads(tmp_path, monkeypatch):
    """ros_events.Recorder on an rclpy node (stand-ins for rclpy and std_msgs, which need ROS)."""
    sent: list[tuple[str, str, object]] = []

    class String:
        data = ""

    class Node:
        def create_publisher(self, msg_type, topic, qos):
            assert msg_type is String
            return types.SimpleNamespace(publish=lambda m: sent.append((topic, m.data, qos)))

    qos = types.ModuleType("rclpy.qos")
    qos.QoSProfile = lambda **kw: kw
    qos.ReliabilityPolicy = types.SimpleNamespace(RELIABLE="reliable")
    qos.DurabilityPolicy = types.SimpleNamespace(TRANSIENT_LOCAL="transient_local")
    msg = types.ModuleType("std_msgs.msg")
    msg.String = String
    for name, module in {"rclpy": types.ModuleType("rclpy"), "rclpy.qos": qos,
                         "std_msgs": types.ModuleType("std_msgs"), "std_msgs.msg": msg}.items():
        monkeypatch.setitem(sys.modules, name, module)
    recorder = ros_events.Recorder(Node())
    recorder.configuration("3f2a9c", nn_errors={"heading": 4.1}, error_point={"distance": 0.1})
    recorder.start({"crop": "maize"}, operator="ana")
    recorder.event("disengagement", position={"x": 1.0, "y": 2.0}, reason="gps lost")
    recorder.end("aborted", "battery")
    assert [q["durability"] for t, _, q in sent if t == ros_events.CONFIG_TOPIC] == ["transient_local"]
    with pytest.raises(ValueError, match="lower case"):
        ros_events.event("Collision")
    with pytest.raises(ValueError, match="not finite"):
        ros_events.event("collision", speed=math.nan)
    bag = tmp_path / "robot.mcap"
    with SyntheticBag(bag) as b:
        for i, (topic, text, _) in enumerate(sent):
            b.string(topic, text, T0 + i * 10 * S)
            if i == 1:
                drive(b, T0 + 10 * S + 1, 15.0)
    (run,) = read_bag(bag, application="cf").runs
    assert run.status == "aborted" and run.end_message == "battery" and run.operator == "ana"
    assert run.config.hash == "3f2a9c" and run.error_point == {"distance": 0.1}
    assert run.conditions.crop == "maize"
    (event,) = run.events
    assert event.kind == "disengagement" and event.position == {"x": 1.0, "y": 2.0}
    assert event.data == {"reason": "gps lost"}


def test_a_bool_run_topic_is_a_state_repeated_while_driving(tmp_path):
    """A std_msgs/Bool 'autonomy engaged' published at 1 Hz: a run from each turn to true to the turn to false."""
    bag = tmp_path / "engaged.mcap"
    with SyntheticBag(bag) as b:
        for k, start in enumerate((T0, T0 + 60 * S)):
            drive(b, start, 20.0)
            for second in range(21):
                b.write("/engaged", "std_msgs/msg/Bool", {"data": second < 20}, start + second * S)
    mapping = BagMapping(runs={"topic": "/engaged"}, config=None, events={})
    reading = read_bag(bag, mapping, application="cf")
    assert [(r.status, r.started_at.timestamp()) for r in reading.runs] == [
        ("complete", T0 / S), ("complete", T0 / S + 60)]
    assert [r.distance_m for r in reading.runs] == [pytest.approx(0.6 * 20, rel=0.01)] * 2
    assert reading.notes == []


def test_the_fast_odometry_reader_agrees_with_the_decoder_and_refuses_what_it_cannot_read(tmp_path):
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory

    from qaopt.field.bag import _odometry_fast

    bag = tmp_path / "odom.mcap"
    with SyntheticBag(bag) as b:
        b.odometry(T0, 12.5, -3.25, 0.3, 0.6)
        b.odometry(T0 + 1, 1.0, 2.0, 0.0, 0.4, frame_id="map", child_frame_id="robot_base_footprint")  # other padding
    with open(bag, "rb") as f:
        messages = list(make_reader(f, decoder_factories=[DecoderFactory()]).iter_decoded_messages())
    for _, _, raw, decoded in messages:
        position, linear = decoded.pose.pose.position, decoded.twist.twist.linear
        assert _odometry_fast(raw.data) == (position.x, position.y, linear.x, linear.y)
        assert _odometry_fast(raw.data[:-8]) is None  # cut short
        assert _odometry_fast(raw.data + b"\x00" * 8) is None  # longer than an Odometry
        assert _odometry_fast(b"\x00\x00" + raw.data[2:]) is None  # big-endian: left to the decoder
        assert _odometry_fast(raw.data[:16]) is None


def test_a_configuration_that_changes_during_a_run_is_a_bad_message(tmp_path):
    bag = tmp_path / "swap.mcap"
    with SyntheticBag(bag) as b:
        b.channel("/qaopt/events", "std_msgs/msg/String")
        b.string("/qaopt/config", "3f2a9c", T0)  # the hash alone, as plain text
        b.string("/qaopt/run", ros_events.run_start(), T0 + S)
        drive(b, T0 + S, 10.0)
        b.string("/qaopt/config", "3f2a9c", T0 + 3 * S)  # the same one again (latched, re-sent): fine
        b.string("/qaopt/config", "b71e00", T0 + 5 * S)
        b.string("/qaopt/run", ros_events.run_end(), T0 + 12 * S)
    with pytest.raises(ImportRowsError) as err:
        read_bag(bag, application="cf")
    (problem,) = err.value.problems
    assert (problem.topic, problem.log_time_ns) == ("/qaopt/config", T0 + 5 * S)
    assert problem.message.startswith("the configuration changed during the run that started at 2026-05-28T20:26:41")


def test_the_configuration_from_a_node_parameter_on_parameter_events(tmp_path):
    bag = tmp_path / "params.mcap"
    with SyntheticBag(bag) as b:
        b.channel("/qaopt/events", "std_msgs/msg/String")
        b.parameter("/cropfollow", "qaopt_config", '{"hash": "3f2a9c", "nn_errors": {"heading": 4.1}}', T0)
        b.parameter("/camera_driver", "qaopt_config", "not ours", T0 + 1)
        for k in range(2):
            start = T0 + (10 + 60 * k) * S
            if k == 1:
                b.parameter("/cropfollow", "qaopt_config", "b71e00", start - S, changed=True)
            b.string("/qaopt/run", ros_events.run_start(), start)
            drive(b, start, 5.0)
            b.string("/qaopt/run", ros_events.run_end(), start + 6 * S)
    mapping = BagMapping(config={"node": "/cropfollow", "parameter": "qaopt_config"})
    runs = read_bag(bag, mapping, application="cf").runs
    assert [(r.config.hash, r.config.nn_errors) for r in runs] == [("3f2a9c", {"heading": 4.1}), ("b71e00", {})]
    with SyntheticBag(tmp_path / "no-params.mcap") as b:  # /parameter_events not recorded
        b.channel("/qaopt/events", "std_msgs/msg/String")
        b.string("/qaopt/run", ros_events.run_start(), T0)
        drive(b, T0, 1.0)
    with pytest.raises(BagMappingError) as err:
        read_bag(tmp_path / "no-params.mcap", mapping, application="cf")
    assert _one_line(err).startswith("evaluator.field.bag.config: topic /parameter_events is not in no-params.mcap")


def test_a_bag_split_into_files_is_one_recording(tmp_path):
    """`ros2 bag record --max-bag-duration`: a run that starts in one file and ends in the next."""
    folder = tmp_path / "day"
    folder.mkdir()
    with SyntheticBag(folder / "day_0.mcap") as b:
        b.channel("/qaopt/events", "std_msgs/msg/String")
        b.metadata("qaopt", {"weather": "dry"})
        b.json("/qaopt/config", {"hash": "3f2a9c"}, T0)
        b.string("/qaopt/run", ros_events.run_start(), T0 + S)
        first = drive(b, T0 + S, 30.0)
    with SyntheticBag(folder / "day_1.mcap") as b:
        b.channel("/qaopt/config", "std_msgs/msg/String")
        b.channel("/qaopt/run", "std_msgs/msg/String")
        second = drive(b, T0 + 31 * S + S // 50, 20.0, from_m=first + 0.6 / 50)
        b.string("/qaopt/events", ros_events.event("collision"), T0 + 40 * S)
        b.string("/qaopt/run", ros_events.run_end(), T0 + 52 * S)
    store = Store(tmp_path / "f.db")
    done = import_bag(store, folder, application="cf")
    (run,) = store.runs()
    assert run.status == "complete" and run.config.hash == "3f2a9c" and run.conditions.weather == "dry"
    assert run.distance_m == pytest.approx(first + 0.6 / 50 + second, rel=0.01)
    assert [e.kind for e in run.events] == ["collision"] and run.source == "bag:day"
    assert done.reading.notes == []
    assert import_bag(store, folder, application="cf").result.already_present == [run.id]
