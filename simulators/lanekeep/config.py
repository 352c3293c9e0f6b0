"""Parameters of the LaneKeep world, car, driving stack and camera.

Every parameter has its unit in its name; the defaults describe a passenger car on
a two-lane rural road (3.5 m lanes, curves of 80 m radius or more, 12 m/s) with a
DonkeyCar-resolution camera (160x120). Parameters are checked when a config is
built, so a bad value fails at once with a message that names it and says what to
give instead, not as a silent violation count hours into a calibration.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..params import ParamRules
from .errors import LaneKeepParamError

NN_NAMES = ("lane", "stop", "lead")
"""LaneKeep's perception NNs, in the order of the evaluator's ground-truth rows."""
NN_OUTPUTS = {"lane": "offset", "stop": "stop", "lead": "distance"}
"""The one output of each NN."""


RULES = ParamRules(LaneKeepParamError)
_require = RULES.require


def check_nn(target: str) -> None:
    """Reject an unknown NN name, naming the argument."""
    _require(target in NN_NAMES, "target", f"{target!r} is not a LaneKeep NN; use 'lane', 'stop' or 'lead'")


def _pair(value: tuple[float, float], param: str, low: float = 0.0) -> None:
    lo, hi = value
    _require(low <= lo <= hi, param, f"{value} must be [min, max] with {low} <= min <= max")


@dataclass(frozen=True)
class RoadParams:
    """The road and what is on it: curvature, stop signs, the lead vehicle."""

    lane_width_m: float = 3.5
    min_radius_m: float = 80.0
    """Tightest curve: the curvature profile (a sum of sinusoids) never exceeds 1 / this."""
    curvature_wavelength_m: tuple[float, float] = (150.0, 500.0)
    """Range of the wavelengths of the curvature's sinusoids: long, smooth curves, as roads are built."""
    stop_signs: tuple[int, int] = (1, 2)
    """Range of the number of stop signs of a route (fewer where the route is too short for them)."""
    first_stop_m: float = 60.0
    """No stop line before this arc length: the car must be up to speed when it meets the first."""
    stop_spacing_m: float = 80.0
    """Least distance between two stop lines."""
    lead_vehicle: bool = True
    """Whether a lead vehicle drives in the ego lane on part of the route."""
    lead_gap_m: tuple[float, float] = (25.0, 40.0)
    """The lead vehicle appears (turns in from a side road) this far ahead of the ego's front ..."""
    lead_speed_mps: tuple[float, float] = (8.0, 11.0)
    """... and drives at this speed (slower than the ego's set speed, so the ego must follow it)."""
    lead_brake_mps2: tuple[float, float] = (3.0, 6.0)
    """It brakes hard at random moments at this deceleration ..."""
    lead_brake_to_mps: tuple[float, float] = (0.0, 4.0)
    """... down to this speed (0: a full stop; drawn as 0 with probability 0.4), holds 0.5-2 s, then re-accelerates."""
    lead_segment_m: tuple[float, float] = (90.0, 130.0)
    """How far along the route the lead vehicle drives before it turns off the road."""
    stop_approach_m: float = 50.0
    """The lead vehicle has left the road at least this far before a stop line, so the two never overlap."""

    def __post_init__(self) -> None:
        _require(2.5 <= self.lane_width_m <= 6.0, "road.lane_width_m", f"{self.lane_width_m} must be in [2.5, 6] m (e.g. 3.5)")
        _require(self.min_radius_m >= 20.0, "road.min_radius_m", f"{self.min_radius_m} must be >= 20 m (e.g. 80)")
        _pair(self.curvature_wavelength_m, "road.curvature_wavelength_m", 1.0)
        lo, hi = self.stop_signs
        _require(isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= 2, "road.stop_signs",
                 f"{self.stop_signs} must be [min, max] integers with 0 <= min <= max <= 2")
        _require(self.first_stop_m >= 30.0, "road.first_stop_m", f"{self.first_stop_m} must be >= 30 m (the car needs room to see the sign)")
        _require(self.stop_spacing_m >= 40.0, "road.stop_spacing_m", f"{self.stop_spacing_m} must be >= 40 m")
        _pair(self.lead_gap_m, "road.lead_gap_m", 5.0)
        _pair(self.lead_speed_mps, "road.lead_speed_mps", 1.0)
        _pair(self.lead_brake_mps2, "road.lead_brake_mps2", 0.1)
        _pair(self.lead_brake_to_mps, "road.lead_brake_to_mps", 0.0)
        _pair(self.lead_segment_m, "road.lead_segment_m", 10.0)
        _require(self.lead_brake_to_mps[1] < self.lead_speed_mps[0], "road.lead_brake_to_mps",
                 f"{self.lead_brake_to_mps} must stay below road.lead_speed_mps {self.lead_speed_mps}: a brake must slow the lead down")
        _require(self.stop_approach_m >= 0, "road.stop_approach_m", f"{self.stop_approach_m} must be >= 0")


@dataclass(frozen=True)
class CarParams:
    """The ego car: a kinematic bicycle with bounded steering and acceleration."""

    wheelbase_m: float = 2.7
    length_m: float = 4.5
    width_m: float = 1.8
    set_speed_mps: float = 12.0
    max_accel_mps2: float = 2.0
    max_brake_mps2: float = 6.0
    max_steer_deg: float = 30.0
    steer_rate_degps: float = 60.0
    """How fast the steering actuator turns the wheels (a first-order, rate-limited actuator)."""
    steer_noise_deg: float = 0.3
    """Per-physics-step noise on the wheel angle (road camber, gusts, tyre slip): keeps the stack honest."""

    def __post_init__(self) -> None:
        for name in ("wheelbase_m", "length_m", "width_m", "set_speed_mps", "max_accel_mps2", "max_brake_mps2", "max_steer_deg", "steer_rate_degps"):
            _require(getattr(self, name) > 0, f"car.{name}", f"{getattr(self, name)} must be > 0")
        _require(self.length_m > self.wheelbase_m, "car.length_m", f"{self.length_m} must exceed car.wheelbase_m {self.wheelbase_m}")
        _require(self.max_steer_deg < 60, "car.max_steer_deg", f"{self.max_steer_deg} must be < 60 deg")
        _require(self.set_speed_mps <= 40, "car.set_speed_mps", f"{self.set_speed_mps} must be <= 40 m/s")
        _require(self.steer_noise_deg >= 0, "car.steer_noise_deg", f"{self.steer_noise_deg} must be >= 0")


@dataclass(frozen=True)
class StackParams:
    """The driving stack between the NNs and the actuators, and what each NN's output means.

    ``lookahead_m``, ``detect_range_m`` and ``lead_max_m`` define the NNs' outputs (the
    lane offset at the look-ahead, stop sign within range, lead distance clipped at the
    maximum), so changing them changes what the reference NNs must be trained on.
    """

    lookahead_m: float = 8.0
    """The lane NN reports the lane centre's lateral offset this far ahead; pure pursuit steers to it."""
    detect_range_m: float = 25.0
    """The stop NN says whether an unpassed stop line is within this distance of the front bumper."""
    lead_max_m: float = 40.0
    """The lead NN's distance is clipped here: this value means no vehicle visible."""
    debounce_frames: int = 2
    """A stop is acted on after this many positive frames in a row: one sporadic false alarm is ignored."""
    stop_margin_m: float = 3.0
    """The car aims to stop this far before where it believes the line is (first positive frame + detect range)."""
    stop_hold_s: float = 1.0
    ignore_after_stop_m: float = 15.0
    """After a stop the car ignores detections for this many metres (the sign it just obeyed)."""
    standstill_gap_m: float = 4.0
    time_gap_s: float = 1.5
    acc_gap_gain: float = 0.25
    """ACC acceleration per metre of gap error (1/s^2)."""
    acc_speed_gain: float = 0.7
    """ACC acceleration per m/s of closing speed (1/s)."""
    speed_gain: float = 0.5
    """Cruise acceleration per m/s below the set speed (1/s)."""
    tracker_alpha: float = 0.5
    tracker_beta: float = 0.15
    """Alpha-beta filter gains on the lead distance (position, rate)."""

    def __post_init__(self) -> None:
        for name in ("lookahead_m", "detect_range_m", "lead_max_m", "stop_hold_s", "time_gap_s", "acc_gap_gain", "acc_speed_gain", "speed_gain"):
            _require(getattr(self, name) > 0, f"stack.{name}", f"{getattr(self, name)} must be > 0")
        for name in ("stop_margin_m", "ignore_after_stop_m", "standstill_gap_m"):
            _require(getattr(self, name) >= 0, f"stack.{name}", f"{getattr(self, name)} must be >= 0")
        _require(isinstance(self.debounce_frames, int) and self.debounce_frames >= 1, "stack.debounce_frames",
                 f"{self.debounce_frames} must be an integer >= 1 (1 acts on every positive frame)")
        _require(self.stop_margin_m < self.detect_range_m, "stack.stop_margin_m", f"{self.stop_margin_m} must be below stack.detect_range_m")
        _require(0 < self.tracker_alpha <= 1, "stack.tracker_alpha", f"{self.tracker_alpha} must be in (0, 1]")
        _require(0 <= self.tracker_beta <= 2, "stack.tracker_beta", f"{self.tracker_beta} must be in [0, 2]")


@dataclass(frozen=True)
class CameraParams:
    """The front camera: a pinhole behind the windscreen, pitched down a little."""

    width_px: int = 160
    height_px: int = 120
    hfov_deg: float = 85.0
    mount_height_m: float = 1.3
    pitch_down_deg: float = 7.0
    forward_offset_m: float = 0.8
    """Camera position ahead of the car's centre."""
    supersample: int = 2
    """Samples per pixel along each axis (2: 4 samples): distant signs and cars cover fractions of a pixel."""

    def __post_init__(self) -> None:
        _require(isinstance(self.width_px, int) and 16 <= self.width_px <= 1920, "camera.width_px", f"{self.width_px} must be an integer in [16, 1920]")
        _require(isinstance(self.height_px, int) and 16 <= self.height_px <= 1440, "camera.height_px", f"{self.height_px} must be an integer in [16, 1440]")
        _require(10.0 <= self.hfov_deg <= 150.0, "camera.hfov_deg", f"{self.hfov_deg} must be in [10, 150] deg")
        _require(0.3 <= self.mount_height_m <= 4.0, "camera.mount_height_m", f"{self.mount_height_m} must be in [0.3, 4] m")
        _require(-10.0 <= self.pitch_down_deg <= 30.0, "camera.pitch_down_deg", f"{self.pitch_down_deg} must be in [-10, 30] deg")
        _require(isinstance(self.supersample, int) and 1 <= self.supersample <= 4, "camera.supersample", f"{self.supersample} must be an integer in [1, 4]")

    @property
    def focal_px(self) -> float:
        return (self.width_px / 2) / math.tan(math.radians(self.hfov_deg) / 2)


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a LaneKeep run, apart from the seed and the NNs."""

    route_m: float = 300.0
    physics_hz: float = 50.0
    perception_hz: float = 10.0
    max_time_factor: float = 3.0
    """A run that has not reached the goal after this many times its nominal time (plus 30 s) stops."""
    time_ratio_bound: float = 1.3
    """``violations`` counts one more when the run took longer than this times the ideal driver's time."""
    stop_window_m: float = 8.0
    """A stop counts when the car stood still (below ``stopped_speed_mps``) within this distance before the line."""
    stopped_speed_mps: float = 0.3
    phantom_slack_m: float = 15.0
    """A stop the car starts with no stop line within the detect range plus this is a phantom stop."""
    initial_lateral_m: float = 0.2
    initial_heading_deg: float = 2.0
    road: RoadParams = dataclasses.field(default_factory=RoadParams)
    car: CarParams = dataclasses.field(default_factory=CarParams)
    stack: StackParams = dataclasses.field(default_factory=StackParams)
    camera: CameraParams = dataclasses.field(default_factory=CameraParams)

    def __post_init__(self) -> None:
        _require(20.0 <= self.route_m <= 5000.0, "route_m", f"{self.route_m} must be in [20, 5000] m (e.g. 300)")
        _require(1.0 <= self.perception_hz <= 100.0, "perception_hz", f"{self.perception_hz} must be in [1, 100] Hz")
        ratio = self.physics_hz / self.perception_hz
        _require(abs(ratio - round(ratio)) < 1e-9 and round(ratio) >= 1, "physics_hz",
                 f"{self.physics_hz} must be a whole multiple of perception_hz {self.perception_hz}")
        _require(self.max_time_factor >= 1, "max_time_factor", f"{self.max_time_factor} must be >= 1")
        _require(self.time_ratio_bound > 1, "time_ratio_bound", f"{self.time_ratio_bound} must be > 1 (the ideal driver's ratio is 1)")
        _require(self.stop_window_m > 0, "stop_window_m", f"{self.stop_window_m} must be > 0")
        _require(self.stopped_speed_mps > 0, "stopped_speed_mps", f"{self.stopped_speed_mps} must be > 0")
        _require(self.phantom_slack_m >= 0, "phantom_slack_m", f"{self.phantom_slack_m} must be >= 0")
        lane_half = self.road.lane_width_m / 2 - self.car.width_m / 2
        _require(lane_half > 0, "car.width_m", f"{self.car.width_m} does not fit in a lane of {self.road.lane_width_m} m")
        _require(0 <= self.initial_lateral_m < lane_half, "initial_lateral_m", f"{self.initial_lateral_m} must leave the car inside its lane (< {lane_half:.2f} m)")
        _require(0 <= self.initial_heading_deg < 20, "initial_heading_deg", f"{self.initial_heading_deg} must be in [0, 20) deg")

    @property
    def substeps(self) -> int:
        return int(round(self.physics_hz / self.perception_hz))

    @property
    def perception_period_s(self) -> float:
        return 1.0 / self.perception_hz

    @property
    def max_time_s(self) -> float:
        return self.max_time_factor * self.route_m / self.car.set_speed_mps + 30.0

    @property
    def max_steps(self) -> int:
        return int(math.ceil(self.max_time_s * self.perception_hz))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (the cache key of everything computed from this config)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_params(cls, **params: Any) -> SimConfig:
        """Build from the spec's ``params``: top-level fields, and ``road``, ``car``, ``stack``, ``camera`` as mappings."""
        nested = {"road": RoadParams, "car": CarParams, "stack": StackParams, "camera": CameraParams}
        return RULES.build_config(cls, params, nested)
