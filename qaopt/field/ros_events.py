"""The robot's side of ``qaopt field import-bag``: publish a run's start, end, events and configuration.

Copy this one file into the robot's ROS 2 package: it needs neither qaopt nor anything
beyond the standard library and ``rclpy`` (which the robot has). It publishes qaopt's
recording convention, JSON on ``std_msgs/msg/String`` topics, which the default mapping
of ``import-bag`` reads (docs/field.md, "ROS 2 bags")::

    /qaopt/run     {"run": "start", "conditions": {"weather": "dry"}, "operator": "ana", "notes": ""}
                   {"run": "end", "status": "complete", "message": ""}
    /qaopt/events  {"event": "collision", "position": {"x": 3.1, "y": 12.4}, ...your own keys}
    /qaopt/config  {"hash": "3f2a9c", "knobs": {...}, "nn_errors": {"heading": 4.1}, "error_point": {...}}

and is recorded with the odometry::

    ros2 bag record -s mcap /odom /qaopt/run /qaopt/events /qaopt/config

In a node::

    recorder = Recorder(self)                      # self: an rclpy Node
    recorder.configuration(hash="3f2a9c", nn_errors={"heading": 4.1})
    recorder.start(conditions={"crop": "maize", "weather": "dry"}, operator="ana")
    recorder.event("collision")                    # when the bumper fires
    recorder.end()

``/qaopt/config`` is latched (transient local): a bag whose recording starts after the
configuration was published still holds it. The payload functions below are plain: a
robot that publishes through another layer sends their strings on those topics.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

RUN_TOPIC = "/qaopt/run"
EVENTS_TOPIC = "/qaopt/events"
CONFIG_TOPIC = "/qaopt/config"
RECORD_COMMAND = f"ros2 bag record -s mcap /odom {RUN_TOPIC} {EVENTS_TOPIC} {CONFIG_TOPIC}"


def _dumps(payload: dict[str, Any]) -> str:
    """JSON that import-bag accepts: NaN or infinity is refused here, on the robot, not at import."""
    try:
        return json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except ValueError:
        raise ValueError(f"not finite: {payload!r}; send finite numbers (NaN and infinity are not JSON)") from None


def run_start(conditions: dict[str, Any] | None = None, operator: str = "", notes: str = "") -> str:
    """The ``/qaopt/run`` message that starts a run (conditions: crop, weather, light, field, ...)."""
    return _dumps({"run": "start", "conditions": conditions or {}, "operator": operator, "notes": notes})


def run_end(status: str = "complete", message: str = "") -> str:
    """The ``/qaopt/run`` message that ends a run: ``complete``, or ``aborted`` with why."""
    if status not in ("complete", "aborted"):
        raise ValueError(f"status {status!r}: a run ends 'complete' or 'aborted'")
    return _dumps({"run": "end", "status": status, "message": message})


def event(kind: str, *, position: dict[str, float] | None = None, distance_m: float | None = None,
          **data: Any) -> str:
    """An ``/qaopt/events`` message: ``collision``, ``intervention``, ``disengagement`` or a kind of
    your own (lower case); without ``distance_m`` import-bag uses the odometry at that moment."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", kind):
        raise ValueError(f"event kind {kind!r}: use lower case letters, digits and _, e.g. 'collision'")
    payload: dict[str, Any] = {"event": kind, **data}
    if position is not None:
        payload["position"] = position
    if distance_m is not None:
        if not math.isfinite(distance_m) or distance_m < 0:
            raise ValueError(f"distance_m {distance_m!r}: a finite number of metres >= 0")
        payload["distance_m"] = distance_m
    return _dumps(payload)


def config(hash: str = "", *, knobs: dict[str, dict[str, Any]] | None = None,
           nn_errors: dict[str, float] | None = None, error_point: dict[str, float] | None = None) -> str:
    """The ``/qaopt/config`` message naming the deployed configuration (qaopt's artifacts carry its hash)."""
    payload: dict[str, Any] = {"hash": hash, "knobs": knobs or {}, "nn_errors": nn_errors or {}}
    if error_point is not None:
        payload["error_point"] = error_point
    return _dumps(payload)


class Recorder:
    """Publishes the convention from an ``rclpy`` node; each call sends one message."""

    def __init__(self, node: Any):
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from std_msgs.msg import String

        reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self._string = String
        self._run = node.create_publisher(String, RUN_TOPIC, reliable)
        self._events = node.create_publisher(String, EVENTS_TOPIC, reliable)
        self._config = node.create_publisher(String, CONFIG_TOPIC, latched)

    def _send(self, publisher: Any, text: str) -> None:
        message = self._string()
        message.data = text
        publisher.publish(message)

    def configuration(self, hash: str = "", **fields: Any) -> None:
        self._send(self._config, config(hash, **fields))

    def start(self, conditions: dict[str, Any] | None = None, operator: str = "", notes: str = "") -> None:
        self._send(self._run, run_start(conditions, operator, notes))

    def event(self, kind: str, **fields: Any) -> None:
        self._send(self._events, event(kind, **fields))

    def end(self, status: str = "complete", message: str = "") -> None:
        self._send(self._run, run_end(status, message))
