"""Parameters of the CropFollow world, robot, camera and controller.

Every parameter has a physical unit in its name and a default modelled on
TerraSentia in a maize field (CropFollow, ApproxCaliper). Parameters are checked
when a config is built, so a bad value fails at once with a message naming it,
not as a silent collision count hours later.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from ..params import ParamRules
from .errors import CropFollowParamError


NN_NAMES = ("heading", "distance")
"""CropFollow's perception NNs, in the order of the evaluator's ground-truth rows."""
BACKBONES = ("compact", "resnet18")


RULES = ParamRules(CropFollowParamError)
_require = RULES.require


def check_nn(target: str, backbone: str = "compact") -> None:
    """Reject an unknown NN target or backbone, naming the argument."""
    _require(target in NN_NAMES, "target", f"{target!r} is not a CropFollow NN; use 'heading' or 'distance'")
    _require(backbone in BACKBONES, "backbone", f"{backbone!r} is unknown; use 'compact' or 'resnet18'")


@dataclass(frozen=True)
class FieldParams:
    """The crop field: parallel rows (constant spacing, as a planter sows them) that curve."""

    row_spacing_m: float = 0.76
    """Distance between neighbouring plant rows (the corridor the robot drives in)."""
    curvature_max_per_m: float = 0.02
    """Largest row curvature (1/radius); 0 gives straight rows."""
    curvature_wavelength_m: tuple[float, float] = (20.0, 60.0)
    """Range of the wavelengths of the smooth random curvature profile."""
    plant_spacing_m: float = 0.17
    """Mean distance between neighbouring plants along a row."""
    plant_spacing_jitter: float = 0.35
    """Relative spread of the plant spacing (irregular sowing)."""
    missing_plant_prob: float = 0.1
    """Probability that a single plant is missing."""
    gap_prob_per_m: float = 0.04
    """Rate of longer gaps (several missing plants) per metre of row."""
    gap_length_m: float = 0.8
    """Mean length of such a gap."""
    plant_height_m: tuple[float, float] = (0.9, 1.8)
    """Range of plant heights."""
    leaf_spread_m: tuple[float, float] = (0.12, 0.3)
    """Range of how far leaves reach sideways from the stalk."""
    stalk_radius_m: float = 0.012
    """Radius of a stalk: the body touches the row when it comes this close to the row line."""

    def __post_init__(self) -> None:
        _require(self.row_spacing_m > 0, "field.row_spacing_m", f"{self.row_spacing_m} must be > 0 (e.g. 0.76)")
        _require(
            0 <= self.curvature_max_per_m < 0.5,
            "field.curvature_max_per_m",
            f"{self.curvature_max_per_m} must be in [0, 0.5) (a row radius above 2 m)",
        )
        lo, hi = self.curvature_wavelength_m
        _require(0 < lo <= hi, "field.curvature_wavelength_m", f"{self.curvature_wavelength_m} must be (min, max) with 0 < min <= max")
        _require(self.plant_spacing_m > 0, "field.plant_spacing_m", f"{self.plant_spacing_m} must be > 0")
        _require(0 <= self.plant_spacing_jitter < 1, "field.plant_spacing_jitter", f"{self.plant_spacing_jitter} must be in [0, 1)")
        _require(0 <= self.missing_plant_prob < 1, "field.missing_plant_prob", f"{self.missing_plant_prob} must be in [0, 1)")
        _require(self.gap_prob_per_m >= 0, "field.gap_prob_per_m", f"{self.gap_prob_per_m} must be >= 0")
        _require(self.gap_length_m > 0, "field.gap_length_m", f"{self.gap_length_m} must be > 0")
        lo, hi = self.plant_height_m
        _require(0 < lo <= hi, "field.plant_height_m", f"{self.plant_height_m} must be (min, max) with 0 < min <= max")
        lo, hi = self.leaf_spread_m
        _require(0 <= lo <= hi, "field.leaf_spread_m", f"{self.leaf_spread_m} must be (min, max) with 0 <= min <= max")
        _require(
            0 <= self.stalk_radius_m < self.row_spacing_m / 2,
            "field.stalk_radius_m",
            f"{self.stalk_radius_m} must be in [0, row_spacing_m / 2)",
        )


@dataclass(frozen=True)
class RobotParams:
    """A skid-steer unicycle (TerraSentia: 0.35 m wide, cruising at 0.6 m/s)."""

    cruise_speed_mps: float = 0.6
    max_speed_mps: float = 1.0
    max_turn_rate_radps: float = 1.0
    body_width_m: float = 0.35
    body_length_m: float = 0.5
    speed_slip_std: float = 0.03
    """Relative wheel-slip noise on the forward speed (per physics sub-step)."""
    turn_noise_std_radps: float = 0.05
    """Terrain noise on the turn rate (rad/s, per physics sub-step)."""

    def __post_init__(self) -> None:
        _require(self.cruise_speed_mps > 0, "robot.cruise_speed_mps", f"{self.cruise_speed_mps} must be > 0")
        _require(
            self.max_speed_mps >= self.cruise_speed_mps,
            "robot.max_speed_mps",
            f"{self.max_speed_mps} must be >= cruise_speed_mps ({self.cruise_speed_mps})",
        )
        _require(self.max_turn_rate_radps > 0, "robot.max_turn_rate_radps", f"{self.max_turn_rate_radps} must be > 0")
        _require(self.body_width_m > 0, "robot.body_width_m", f"{self.body_width_m} must be > 0")
        _require(self.body_length_m > 0, "robot.body_length_m", f"{self.body_length_m} must be > 0")
        _require(0 <= self.speed_slip_std < 1, "robot.speed_slip_std", f"{self.speed_slip_std} must be in [0, 1)")
        _require(self.turn_noise_std_radps >= 0, "robot.turn_noise_std_radps", f"{self.turn_noise_std_radps} must be >= 0")


@dataclass(frozen=True)
class CameraParams:
    """The front camera: 320x240 RGB, 0.28 m above ground, pitched down, ~60 deg wide."""

    width_px: int = 320
    height_px: int = 240
    focal_px: float = 277.0
    mount_height_m: float = 0.28
    pitch_down_deg: float = 18.0
    forward_offset_m: float = 0.2
    """Camera position ahead of the robot's centre (it sits at the front)."""

    @property
    def half_vfov_deg(self) -> float:
        return math.degrees(math.atan((self.height_px / 2) / self.focal_px))

    def __post_init__(self) -> None:
        _require(self.width_px >= 8 and self.height_px >= 8, "camera.width_px", "the image must be at least 8x8 pixels")
        _require(self.focal_px > 0, "camera.focal_px", f"{self.focal_px} must be > 0 (277 gives a 60 deg field of view)")
        _require(self.mount_height_m > 0, "camera.mount_height_m", f"{self.mount_height_m} must be > 0: the camera must sit above the ground")
        _require(
            self.pitch_down_deg + self.half_vfov_deg > 1.0,
            "camera.pitch_down_deg",
            f"{self.pitch_down_deg} leaves the ground out of view: the lowest image row looks "
            f"{self.pitch_down_deg + self.half_vfov_deg:.1f} deg below the horizon; pitch it down more "
            f"(above {1.0 - self.half_vfov_deg:.1f} deg)",
        )
        _require(self.pitch_down_deg < 89.0, "camera.pitch_down_deg", f"{self.pitch_down_deg} must be < 89 (looking straight down sees no rows ahead)")


@dataclass(frozen=True)
class ControllerParams:
    """The row-following controller and its tuning.

    ``mpc`` is a receding-horizon linear-quadratic controller on the discretised
    lateral/heading error dynamics (horizon ``horizon_steps`` perception periods);
    without active constraints its optimal first move is a linear feedback, which
    is then limited to the robot's turn rate. ``stanley`` is the Stanley steering
    law adapted to a unicycle (turn rate toward a heading that closes the lateral
    error).
    """

    kind: Literal["mpc", "stanley"] = "mpc"
    horizon_steps: int = 20
    q_lateral: float = 40.0
    """MPC weight on lateral error (per m^2)."""
    q_heading: float = 2.0
    """MPC weight on heading error (per rad^2)."""
    r_turn: float = 1.0
    """MPC weight on the turn rate (per (rad/s)^2)."""
    stanley_gain: float = 1.5
    """Stanley cross-track gain (1/s at cruise speed)."""
    stanley_heading_gain: float = 1.2
    """Turn rate per radian of Stanley steering error (1/s)."""

    def __post_init__(self) -> None:
        _require(self.kind in ("mpc", "stanley"), "controller", f"{self.kind!r} is not a controller; use 'mpc' or 'stanley'")
        _require(self.horizon_steps >= 1, "controller_params.horizon_steps", f"{self.horizon_steps} must be >= 1")
        for name in ("q_lateral", "q_heading", "stanley_gain", "stanley_heading_gain"):
            _require(getattr(self, name) >= 0, f"controller_params.{name}", f"{getattr(self, name)} must be >= 0")
        _require(self.r_turn > 0, "controller_params.r_turn", f"{self.r_turn} must be > 0")


ESTIMATORS = ("none", "ekf")
"""State estimators between the perception NNs and the controller (``estimator`` parameter)."""


@dataclass(frozen=True)
class EstimatorParams:
    """What sits between the NNs and the controller, and the robot's motion sensors.

    ``none`` (the default) hands the NNs' raw per-frame estimates to the controller.
    ``ekf`` fuses them with wheel odometry and a gyro in an extended Kalman filter
    (:mod:`.estimator`), as TerraSentia fuses perception with odometry and an IMU.

    The sensor fields describe the simulated sensors; the filter assumes the same
    (datasheet) values, as a robot's filter is tuned from its sensors' datasheets.
    Gyro defaults are those of a consumer MEMS IMU such as the Bosch BMI088 or
    TDK ICM-20948, the class that small field robots carry. The NN noise defaults
    come from the shipped compact reference NNs' validation L1 errors
    (``weights/compact-*.json``: 1.484 deg, 0.0354) as the standard deviation of a
    zero-mean Gaussian with that L1 (L1 * sqrt(pi / 2)).
    """

    kind: Literal["none", "ekf"] = "none"
    gyro_noise_density_degps_per_sqrt_hz: float = 0.014
    """Gyro white noise (BMI088 datasheet: 0.014 deg/s/sqrt(Hz)); the mean rate over a
    perception period T errs by this / sqrt(T)."""
    gyro_initial_bias_std_degps: float = 0.2
    """Spread of the gyro's bias at the start of a run. MEMS turn-on offsets are up to
    about 1 deg/s; a standstill calibration before the run leaves a few tenths (thermal
    drift since). Uncorrected, 0.2 deg/s turns the heading by 20 deg in a 100 m run."""
    gyro_bias_walk_degps_per_sqrt_s: float = 0.002
    """Random walk of the bias during the run (in-run drift of about 0.03 deg/s over 100 m)."""
    odometry_speed_noise_std: float = 0.01
    """Relative error of the wheel-odometry speed over a perception period (encoder
    quantisation, wheel-radius jitter). Wheel slip comes on top: the wheels turn at the
    commanded speed while the ground speed slips by ``robot.speed_slip_std``."""
    heading_std_deg: float = 1.86
    """Measurement noise the filter assumes for the heading NN (compact NN: L1 1.484 deg)."""
    distance_std_ratio: float = 0.0443
    """Measurement noise the filter assumes for the distance NN, in its ratio (compact NN: L1 0.0354)."""
    noise_adaptation_s: float = 2.0
    """Time constant of each NN's running noise estimate (from its innovations);
    ``heading_std_deg`` and ``distance_std_ratio`` are where it starts and its floor; 0 keeps
    them fixed. An NN that errs more than the filter assumes would otherwise have many of its
    frames rejected by the gate, and the filter would coast on the motion sensors until it lost
    the robot: with fixed noise, white errors of L1 6 deg and 0.09 on both NNs made 11 of 16
    runs collide, with 2 s none. Shorter lets outlier bursts pass as noise (0.5 s: 44 % of the
    distance NN's burst frames rejected, against 84 % at 2 s)."""
    lateral_walk_m_per_sqrt_s: float = 0.005
    """Process noise on the lateral offset: sideways skid and the part of the slip the model misses."""
    heading_drift_walk_degps_per_sqrt_s: float = 0.05
    """Process noise on the heading drift rate, i.e. the gyro bias plus curvature * speed.
    The robot does not know the row's curvature: rows bending by up to 0.02 /m over 5 m
    change curvature * speed by up to ~0.002 rad/s^2, a walk of ~0.04 deg/s/sqrt(s) at 10 Hz."""
    initial_lateral_std_m: float = 0.05
    """Filter's initial uncertainty of the lateral offset (the run starts within +-0.04 m)."""
    initial_heading_std_deg: float = 3.0
    """Filter's initial uncertainty of the heading error (the run starts within +-3 deg)."""
    initial_heading_drift_std_degps: float = 1.0
    """Filter's initial uncertainty of the drift rate (bias 0.2 deg/s plus up to 0.7 deg/s of curvature * speed)."""
    gate_chi2: float = 10.83
    """Innovation gate: a measurement whose normalised innovation squared exceeds this is
    rejected. 10.83 is the chi-square (1 degree of freedom) quantile of 0.999, so a
    measurement that fits the filter's model is rejected once in 1,000 frames."""
    rejections_before_inflation: int = 20
    """After this many rejections of one NN in a row (2 s at 10 Hz) the filter stops trusting itself ..."""
    inflation_per_rejection: float = 1.5
    """... and each further rejection multiplies the variance of the measured state by this, so the
    gate widens until the NN is accepted again: a run of rejections cannot lock the filter out (a
    filter 20 deg off re-locks about 1.5 s after inflating starts). Inflating sooner or faster
    throws the filter back onto a noisy NN's next frame: with fixed NN noise
    (``noise_adaptation_s=0``), 10 and 2.0 let white heading errors of L1 16 deg make 7 of 40
    runs collide, 20 and 1.5 none."""

    def __post_init__(self) -> None:
        _require(self.kind in ESTIMATORS, "estimator", f"{self.kind!r} is not an estimator; use 'none' (raw NN estimates) or 'ekf'")
        for name in ("gyro_noise_density_degps_per_sqrt_hz", "gyro_initial_bias_std_degps", "gyro_bias_walk_degps_per_sqrt_s",
                     "noise_adaptation_s", "lateral_walk_m_per_sqrt_s", "heading_drift_walk_degps_per_sqrt_s"):
            _require(getattr(self, name) >= 0, f"estimator_params.{name}", f"{getattr(self, name)} must be >= 0")
        _require(0 <= self.odometry_speed_noise_std < 1, "estimator_params.odometry_speed_noise_std",
                 f"{self.odometry_speed_noise_std} must be in [0, 1) (a relative error, e.g. 0.01)")
        for name in ("heading_std_deg", "distance_std_ratio", "initial_lateral_std_m", "initial_heading_std_deg",
                     "initial_heading_drift_std_degps"):
            _require(getattr(self, name) > 0, f"estimator_params.{name}", f"{getattr(self, name)} must be > 0 (a standard deviation the filter divides by)")
        _require(self.gate_chi2 > 0, "estimator_params.gate_chi2", f"{self.gate_chi2} must be > 0 (10.83 rejects 1 in 1,000 good measurements)")
        _require(self.rejections_before_inflation >= 1, "estimator_params.rejections_before_inflation",
                 f"{self.rejections_before_inflation} must be >= 1 (e.g. 20)")
        _require(self.inflation_per_rejection > 1, "estimator_params.inflation_per_rejection",
                 f"{self.inflation_per_rejection} must be > 1, or a run of rejections locks the filter out (e.g. 1.5)")

    @classmethod
    def from_params(cls, estimator: Any = "none", estimator_params: Any = None) -> EstimatorParams:
        """Build from the evaluator's ``estimator`` and ``estimator_params`` parameters."""
        _require(isinstance(estimator, str) and estimator in ESTIMATORS, "estimator",
                 f"{estimator!r} is not an estimator; use 'none' (raw NN estimates) or 'ekf'")
        values = dict(RULES.mapping({} if estimator_params is None else estimator_params, "estimator_params"))
        _require(not values or estimator == "ekf", "estimator_params",
                 f"given, but estimator is {estimator!r}; set estimator: ekf or drop estimator_params")
        return RULES.build(cls, {**values, "kind": estimator}, "estimator_params")


@dataclass(frozen=True)
class DisturbanceParams:
    """A disturbance on what the controller reads: AR(1) errors added to the NNs' estimates.

    Off by default. A stress stratum (``calibration.error_data.stress``) sets it so that drives
    steered by the reference NNs wander as a disturbed robot does (a gust, a wheel in a rut, an
    upstream fault), keeping the heading and offset large for seconds at a time; the NNs are
    measured on the frames of those drives. Steady large headings are where an NN that
    attenuates its output errs most, and short off-centre starts do not hold them.
    """

    heading_deg: float = 0.0
    """Stationary spread (standard deviation) of the error on the heading estimate, degrees."""
    distance_ratio: float = 0.0
    """Stationary spread of the error on the distance estimate (its ratio)."""
    correlation: float = 0.9
    """Correlation of each error from one perception step to the next (0.9 at 10 Hz: about a second)."""

    def __post_init__(self) -> None:
        _require(self.heading_deg >= 0, "disturbance.heading_deg", f"{self.heading_deg} must be >= 0 (e.g. 12.0)")
        _require(self.distance_ratio >= 0, "disturbance.distance_ratio", f"{self.distance_ratio} must be >= 0 (e.g. 0.12)")
        _require(0 <= self.correlation < 1, "disturbance.correlation", f"{self.correlation} must be in [0, 1) (e.g. 0.9)")

    @property
    def active(self) -> bool:
        return self.heading_deg > 0 or self.distance_ratio > 0


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a CropFollow run, apart from the seed and the NNs."""

    run_length_m: float = 100.0
    perception_hz: float = 10.0
    physics_substeps: int = 4
    max_time_factor: float = 3.0
    """A run that has not covered ``run_length_m`` after this many times its nominal duration stops."""
    initial_lateral_m: float = 0.04
    """Start offsets are drawn uniformly within +-this (lateral, m) ..."""
    initial_heading_deg: float = 3.0
    """... and +-this (heading, degrees)."""
    field: FieldParams = dataclasses.field(default_factory=FieldParams)
    robot: RobotParams = dataclasses.field(default_factory=RobotParams)
    camera: CameraParams = dataclasses.field(default_factory=CameraParams)
    control: ControllerParams = dataclasses.field(default_factory=ControllerParams)
    disturbance: DisturbanceParams = dataclasses.field(default_factory=DisturbanceParams)

    def __post_init__(self) -> None:
        _require(self.run_length_m > 0, "run_length_m", f"{self.run_length_m} must be > 0 (e.g. 100.0)")
        _require(0 < self.perception_hz <= 1000, "perception_hz", f"{self.perception_hz} must be in (0, 1000] Hz")
        _require(self.physics_substeps >= 1, "physics_substeps", f"{self.physics_substeps} must be >= 1")
        _require(self.max_time_factor >= 1, "max_time_factor", f"{self.max_time_factor} must be >= 1")
        corridor = self.field.row_spacing_m / 2 - self.field.stalk_radius_m
        _require(
            self.robot.body_width_m / 2 < corridor,
            "robot.body_width_m",
            f"{self.robot.body_width_m} does not fit between rows {self.field.row_spacing_m} m apart",
        )
        _require(0 <= self.initial_lateral_m < corridor - self.robot.body_width_m / 2, "initial_lateral_m", f"{self.initial_lateral_m} must leave the body inside the corridor")
        _require(0 <= self.initial_heading_deg < 45, "initial_heading_deg", f"{self.initial_heading_deg} must be in [0, 45)")

    @property
    def perception_period_s(self) -> float:
        return 1.0 / self.perception_hz

    @property
    def max_steps(self) -> int:
        nominal = self.run_length_m / (self.robot.cruise_speed_mps * self.perception_period_s)
        return int(math.ceil(nominal * self.max_time_factor))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (the cache key of everything computed from this config).

        ``disturbance`` is left out while it is off: it came after datasets and recordings were
        cached under keys made of this form, and an undisturbed config is what they were made with.
        """
        out = dataclasses.asdict(self)
        if not self.disturbance.active:
            del out["disturbance"]
        return out

    @classmethod
    def from_params(cls, **params: Any) -> SimConfig:
        """Build from the spec's flat-or-nested ``params``.

        Top-level keys are this class's fields; ``field``, ``robot``, ``camera``, ``disturbance``
        take mappings of their fields; ``controller`` is ``"mpc"`` or ``"stanley"`` and
        ``controller_params`` a mapping of :class:`ControllerParams` fields.
        """
        def controller(params: dict[str, Any]) -> dict[str, Any]:
            control = dict(RULES.mapping(params.pop("controller_params", {}), "controller_params"))
            if "controller" in params:
                control["kind"] = params.pop("controller")
            return {"control": RULES.build(ControllerParams, control, "controller_params")}

        nested = {"field": FieldParams, "robot": RobotParams, "camera": CameraParams, "disturbance": DisturbanceParams}
        return RULES.build_config(cls, params, nested, controller, ("controller", "controller_params"))


RULES.kind_params.update({ControllerParams: "controller", EstimatorParams: "estimator"})
"""The top-level parameter that sets each nested dataclass's ``kind`` field."""
