"""Writing ROS 2 bags (MCAP) without ROS: the message definitions and a writer for qaopt's topics.

``qaopt field import-bag`` reads what ``ros2 bag record -s mcap`` writes. To test it, to
benchmark it and to show it in the worked example without a robot, this module writes
the same thing: each schema is the ``ros2msg`` text that rosbag2 stores (the type's
definition followed by every type it uses, separated by ``=`` lines and ``MSG:``
headers), and each message is CDR-encoded by ``mcap_ros2``'s writer, as rosbag2 encodes
it. A team can use it too, to try a mapping before the robot records a real bag.

Only ``mcap`` and ``mcap-ros2-support`` are needed (imported when a writer is made).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

_SEPARATOR = "\n" + "=" * 80 + "\n"


def _with_dependencies(main: str, *deps: tuple[str, str]) -> str:
    """A definition as rosbag2 stores it: the type's text, then ``MSG: pkg/Type`` and each dependency's."""
    return main + "".join(f"{_SEPARATOR}MSG: {name}\n{text}" for name, text in deps)


_TIME = ("builtin_interfaces/Time", "int32 sec\nuint32 nanosec\n")
_HEADER = ("std_msgs/Header", "builtin_interfaces/Time stamp\nstring frame_id\n")
_POINT = ("geometry_msgs/Point", "float64 x\nfloat64 y\nfloat64 z\n")
_QUATERNION = ("geometry_msgs/Quaternion", "float64 x 0\nfloat64 y 0\nfloat64 z 0\nfloat64 w 1\n")
_VECTOR3 = ("geometry_msgs/Vector3", "float64 x\nfloat64 y\nfloat64 z\n")

MSGDEFS: dict[str, str] = {
    "nav_msgs/msg/Odometry": _with_dependencies(
        "# This represents an estimate of a position and velocity in free space.\n"
        "std_msgs/Header header\nstring child_frame_id\n"
        "geometry_msgs/PoseWithCovariance pose\ngeometry_msgs/TwistWithCovariance twist\n",
        _HEADER, _TIME,
        ("geometry_msgs/PoseWithCovariance", "Pose pose\nfloat64[36] covariance\n"),
        ("geometry_msgs/Pose", "Point position\nQuaternion orientation\n"),
        _POINT, _QUATERNION,
        ("geometry_msgs/TwistWithCovariance", "Twist twist\nfloat64[36] covariance\n"),
        ("geometry_msgs/Twist", "Vector3  linear\nVector3  angular\n"),
        _VECTOR3,
    ),
    "sensor_msgs/msg/CameraInfo": _with_dependencies(
        "std_msgs/Header header\nuint32 height\nuint32 width\nstring distortion_model\n"
        "float64[] d\nfloat64[9]  k\nfloat64[9]  r\nfloat64[12] p\nuint32 binning_x\nuint32 binning_y\n"
        "RegionOfInterest roi\n",
        _HEADER, _TIME,
        ("sensor_msgs/RegionOfInterest",
         "uint32 x_offset\nuint32 y_offset\nuint32 height\nuint32 width\nbool do_rectify\n"),
    ),
    "rcl_interfaces/msg/ParameterEvent": _with_dependencies(
        "# This message contains a parameter event.\n"
        "builtin_interfaces/Time stamp\nstring node\nParameter[] new_parameters\nParameter[] changed_parameters\n"
        "Parameter[] deleted_parameters\n",
        _TIME,
        ("rcl_interfaces/Parameter", "string name\nParameterValue value\n"),
        ("rcl_interfaces/ParameterValue",
         "uint8 type\nbool bool_value\nint64 integer_value\nfloat64 double_value\nstring string_value\n"
         "byte[] byte_array_value\nbool[] bool_array_value\nint64[] integer_array_value\n"
         "float64[] double_array_value\nstring[] string_array_value\n"),
    ),
    "std_msgs/msg/String": "string data\n",
    "std_msgs/msg/Bool": "bool data\n",
    "std_msgs/msg/Empty": "",
    "std_msgs/msg/Float64": "float64 data\n",
}
"""``ros2msg`` definitions of the types the tests, the benchmark and the example record."""

def stamp(t_ns: int) -> dict[str, int]:
    return {"sec": t_ns // 1_000_000_000, "nanosec": t_ns % 1_000_000_000}


class SyntheticBag:
    """An MCAP bag written as rosbag2 writes one: ``with SyntheticBag(path) as bag: bag.odometry(...)``.

    Times are nanoseconds since the Unix epoch (a message's log time, as rosbag2 records
    the time it received the message).
    """

    def __init__(self, path: str | Path, *, chunk_size: int = 1024 * 1024):
        from mcap_ros2.writer import Writer

        self.path = Path(path)
        self._file = open(self.path, "wb")
        self._writer = Writer(self._file, chunk_size=chunk_size)
        self._schemas: dict[str, Any] = {}

    def schema(self, datatype: str, definition: str | None = None) -> Any:
        """The schema of ``datatype`` (registered on first use, from :data:`MSGDEFS` by default)."""
        if datatype not in self._schemas:
            text = MSGDEFS[datatype] if definition is None else definition
            self._schemas[datatype] = self._writer.register_msgdef(datatype, text)
        return self._schemas[datatype]

    def write(self, topic: str, datatype: str, message: dict[str, Any], t_ns: int) -> None:
        self._writer.write_message(topic, self.schema(datatype), message, log_time=t_ns)

    # mcap_ros2's writer encodes every message it is given; what it cannot write (bytes as
    # they are, a topic without messages, another encoding) goes to the MCAP writer beneath it.

    def raw(self, topic: str, datatype: str, data: bytes, t_ns: int) -> None:
        """A message of ``topic`` whose bytes are written as given (a corrupt message, for the tests)."""
        self.channel(topic, datatype)
        self._writer._writer.add_message(channel_id=self._writer._channel_ids[topic], log_time=t_ns,
                                         publish_time=t_ns, sequence=0, data=data)

    def channel(self, topic: str, datatype: str) -> None:
        """Register ``topic`` with no message yet (rosbag2 does so for every topic it subscribes to)."""
        if topic not in self._writer._channel_ids:
            self._writer._channel_ids[topic] = self._writer._writer.register_channel(
                topic=topic, message_encoding="cdr", schema_id=self.schema(datatype).id)

    def foreign(self, topic: str, datatype: str, encoding: str, data: bytes, t_ns: int) -> None:
        """A message of a non-ROS 2 encoding (``json``, ``protobuf``): schema and messages as given."""
        inner = self._writer._writer
        schema_id = inner.register_schema(datatype, encoding, b"{}")
        channel_id = inner.register_channel(topic=topic, message_encoding=encoding, schema_id=schema_id)
        inner.add_message(channel_id=channel_id, log_time=t_ns, publish_time=t_ns, sequence=0, data=data)

    def metadata(self, name: str, data: dict[str, str]) -> None:
        """An MCAP metadata record (``mcap add metadata`` writes one into a recorded bag)."""
        self._writer.add_metadata(name, data)

    def odometry(self, t_ns: int, x: float, y: float, yaw: float, speed: float,
                 topic: str = "/odom", frame_id: str = "odom", child_frame_id: str = "base_link") -> None:
        self.write(topic, "nav_msgs/msg/Odometry", {
            "header": {"stamp": stamp(t_ns), "frame_id": frame_id}, "child_frame_id": child_frame_id,
            "pose": {"pose": {"position": {"x": x, "y": y, "z": 0.0},
                              "orientation": {"x": 0.0, "y": 0.0, "z": math.sin(yaw / 2), "w": math.cos(yaw / 2)}},
                     "covariance": [0.0] * 36},
            "twist": {"twist": {"linear": {"x": speed, "y": 0.0, "z": 0.0},
                                "angular": {"x": 0.0, "y": 0.0, "z": 0.0}},
                      "covariance": [0.0] * 36},
        }, t_ns)

    def camera_info(self, t_ns: int, topic: str = "/camera/camera_info") -> None:
        self.write(topic, "sensor_msgs/msg/CameraInfo", {
            "header": {"stamp": stamp(t_ns), "frame_id": "camera"}, "height": 480, "width": 640,
            "distortion_model": "plumb_bob", "d": [0.1, -0.25, 0.001, 0.0005, 0.1],
            "k": [525.0, 0.0, 319.5, 0.0, 525.0, 239.5, 0.0, 0.0, 1.0],
            "r": [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
            "p": [525.0, 0.0, 319.5, 0.0, 0.0, 525.0, 239.5, 0.0, 0.0, 0.0, 1.0, 0.0],
            "binning_x": 0, "binning_y": 0,
            "roi": {"x_offset": 0, "y_offset": 0, "height": 0, "width": 0, "do_rectify": False},
        }, t_ns)

    def parameter(self, node: str, name: str, value: str, t_ns: int, *, changed: bool = False) -> None:
        """A ``/parameter_events`` message: ``node``'s string parameter ``name`` declared (or ``changed``)."""
        parameter = {"name": name, "value": {
            "type": 4, "bool_value": False, "integer_value": 0, "double_value": 0.0, "string_value": value,
            "byte_array_value": [], "bool_array_value": [], "integer_array_value": [], "double_array_value": [],
            "string_array_value": []}}
        self.write("/parameter_events", "rcl_interfaces/msg/ParameterEvent", {
            "stamp": stamp(t_ns), "node": node, "new_parameters": [] if changed else [parameter],
            "changed_parameters": [parameter] if changed else [], "deleted_parameters": []}, t_ns)

    def string(self, topic: str, text: str, t_ns: int) -> None:
        self.write(topic, "std_msgs/msg/String", {"data": text}, t_ns)

    def json(self, topic: str, payload: dict[str, Any], t_ns: int) -> None:
        """A ``std_msgs/String`` holding ``payload`` as JSON (qaopt's recording convention)."""
        self.string(topic, json.dumps(payload), t_ns)

    def finish(self) -> None:
        self._writer.finish()
        self._file.close()

    def __enter__(self) -> SyntheticBag:
        return self

    def __exit__(self, *exc) -> None:
        self.finish()
