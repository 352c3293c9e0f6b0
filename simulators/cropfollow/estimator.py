"""A state estimator between the perception NNs and the controller: an EKF with odometry and a gyro.

TerraSentia does not steer from raw per-frame CNN outputs: it fuses them with wheel
odometry and an IMU. ``estimator="ekf"`` does the same. Its state is

    x = (e_y [m], e_psi [rad], r [rad/s])

the lateral offset, the heading error, and the *heading drift rate* ``r = b + kappa v``:
the gyro's bias plus the rate at which the row turns under the robot. Both enter the
heading the same way (``e_psi' = gyro - b - kappa v``), so only their sum is observable;
one state for it lets the filter learn both the bias and the unknown curvature from the
heading NN. Without it, the heading prediction would be off by the bias plus curvature *
speed (up to about 0.9 deg/s at the defaults) between corrections.

Each perception period ``T`` the filter

1. *corrects* with the two NN estimates (heading in degrees -> radians; distance ratio
   -> ``e_y = (0.5 - ratio) * row_spacing``), one scalar update each. Each NN's noise
   variance ``R`` is a running estimate from its innovations (``E[nu^2] = P + R``, time
   constant ``noise_adaptation_s``, never below the configured one), so an NN that errs
   more than assumed is down-weighted rather than gated out. A measurement whose
   normalised innovation squared ``nu^2 / S`` exceeds ``gate_chi2`` is rejected; after
   ``rejections_before_inflation`` rejections of one NN in a row, each further one
   multiplies the variance of the state it measures by ``inflation_per_rejection``, so
   the gate widens until the NN is believed again (a filter that has lost the robot
   re-locks; a burst of bad frames is ridden out on the motion sensors);
2. hands its estimate of ``(e_y, e_psi)`` to the controller, which steers as it would from
   the raw NNs;
3. *predicts* over the period from the odometry speed ``v`` and the gyro rate ``g``::

       psi_m  = e_psi + T/2 (g - r)
       e_y'   = e_y + T v sin(psi_m)
       e_psi' = e_psi + T (g - r)
       r'     = r

   with process noise from the gyro's white noise, the odometry and slip error, a
   lateral walk and the drift rate's walk (the row's changing curvature, the bias drift).

When a person puts the robot back on the centre line (an intervention) the filter is
told: its pose restarts at the centre with its initial uncertainty; the drift rate is kept.

The simulated sensors draw their noise from the episode's counter-based stream
(:mod:`qaopt.simulators.hashrand`), so an episode is still a function of its seed alone. Everything runs
inside one compiled call per perception step over the whole batch, like the raw path.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import dynamics as dyn
from .config import EstimatorParams, SimConfig
from ..hashrand import gauss, mix64

# Columns of the per-episode estimator array (float64, one row per episode): the filter's
# estimate and covariance, its rejection counters, and the simulated gyro's true bias.
EY, EPSI, DRIFT = 0, 1, 2
N_X = 3
P0 = 3
"""Covariance entry (i, j) is column ``P0 + N_X * i + j``."""
HEADING_NN, DISTANCE_NN = 0, 1
NN_BLOCK, NN_COLUMNS = P0 + N_X * N_X, 4
RUN, REJECTED, ACCEPTED, NOISE = range(NN_COLUMNS)
"""Per NN: its rejections in a row now, its rejections and acceptances in the run, its noise variance estimate."""
RUN_HEADING, REJECTED_HEADING, ACCEPTED_HEADING, NOISE_HEADING = (NN_BLOCK + RUN + k for k in range(NN_COLUMNS))
RUN_DISTANCE, REJECTED_DISTANCE, ACCEPTED_DISTANCE, NOISE_DISTANCE = (NN_BLOCK + NN_COLUMNS + k for k in range(NN_COLUMNS))
GYRO_BIAS = NN_BLOCK + 2 * NN_COLUMNS
"""The simulated gyro's true bias (rad/s); the filter never reads it."""
N_ESTIMATOR = GYRO_BIAS + 1

NOISE_CLIP = 4.0
"""An innovation counts at most this many innovation variances (a 2-sigma clip) in an NN's
running noise estimate: a Gaussian NN's noise comes out about 7 % low, while a burst of
outliers grows the estimate at most e-fold every ``noise_adaptation_s`` / 3 seconds, so
the gate keeps rejecting the burst instead of learning it as noise. (Clipping at the gate
instead let the filter learn 4-8-frame bursts as noise and accept 60-80 % of their frames.)"""
SENSOR_STREAM = np.uint64(0x53E5C0DE0D0E7E21)
"""Mixed into an episode's process-noise key to give its sensors their own noise stream."""
INITIAL_BIAS_DRAW = np.uint64(0)
DRAWS_PER_STEP = 3
"""Sensor draws per perception step: odometry, gyro noise, gyro bias walk."""


FILTER = np.dtype([
    ("period", "f8"),                       # perception period T (s)
    ("row_spacing", "f8"),                  # m
    ("odometry_std", "f8"),                 # relative odometry speed error per period
    ("gyro_rate_std", "f8"),                # error of the gyro's mean rate over a period (rad/s)
    ("gyro_bias_step_std", "f8"),           # random-walk step of the true gyro bias per period (rad/s)
    ("initial_bias_std", "f8"),             # rad/s
    ("speed_rel_var", "f8"),                # relative variance of the ground speed given the odometry: odometry error + slip
    ("lateral_var", "f8"),                  # process noise on e_y per period (m^2)
    ("drift_var", "f8"),                    # process noise on the drift rate per period ((rad/s)^2)
    ("meas_var", "f8", (2,)),               # least noise variance of each NN (heading rad^2, lateral m^2), where its estimate starts
    ("noise_rate", "f8"),                   # weight of one innovation in the running noise estimate (0: fixed)
    ("initial_var", "f8", (N_X,)),          # initial variance of each state
    ("gate", "f8"),                         # chi-square gate on nu^2 / S
    ("rejections_before_inflation", "i8"),
    ("inflation", "f8"),                    # variance factor per further rejection
])
"""The compiled filter's sensor and filter constants (SI units, per perception period).

A one-element structured array, not a NamedTuple: numba unboxes an array argument in
~0.2 us against ~1.3 us for a 15-field tuple, and the kernel is called 1,667 times a run
(2 ms of a ~10 ms run)."""


def build_filter(params: EstimatorParams, config: SimConfig) -> np.ndarray:
    """The compiled filter's constants (a one-element :data:`FILTER` array) for ``params`` on ``config``."""
    T = config.perception_period_s
    slip_var_per_period = config.robot.speed_slip_std**2 / config.physics_substeps
    filt = np.zeros(1, dtype=FILTER)
    filt[0] = (
        T,
        config.field.row_spacing_m,
        params.odometry_speed_noise_std,
        math.radians(params.gyro_noise_density_degps_per_sqrt_hz) / math.sqrt(T),
        math.radians(params.gyro_bias_walk_degps_per_sqrt_s) * math.sqrt(T),
        math.radians(params.gyro_initial_bias_std_degps),
        params.odometry_speed_noise_std**2 + slip_var_per_period,
        params.lateral_walk_m_per_sqrt_s**2 * T,
        math.radians(params.heading_drift_walk_degps_per_sqrt_s) ** 2 * T,
        (math.radians(params.heading_std_deg) ** 2, (params.distance_std_ratio * config.field.row_spacing_m) ** 2),
        -math.expm1(-T / params.noise_adaptation_s) if params.noise_adaptation_s > 0 else 0.0,
        (params.initial_lateral_std_m**2, math.radians(params.initial_heading_std_deg) ** 2,
         math.radians(params.initial_heading_drift_std_degps) ** 2),
        params.gate_chi2,
        params.rejections_before_inflation,
        params.inflation_per_rejection,
    )
    return filt


@njit(cache=True, inline="always")
def _sensor_key(key):
    return mix64(key ^ SENSOR_STREAM)


@njit(cache=True, inline="always")
def _p(i, j):
    """Column of covariance entry (i, j)."""
    return P0 + N_X * i + j


@njit(cache=True, inline="always")
def _nn(nn, what):
    """Column of NN ``nn``'s counter or noise estimate ``what``."""
    return NN_BLOCK + NN_COLUMNS * nn + what


@njit(cache=True)
def start(keys, filters):
    """The estimator array of a new batch: filter at the centre line, each gyro with its own bias."""
    filt = filters[0]
    kf = np.zeros((keys.shape[0], N_ESTIMATOR))
    for b in range(keys.shape[0]):
        for i in range(N_X):
            kf[b, _p(i, i)] = filt.initial_var[i]
        for nn in (HEADING_NN, DISTANCE_NN):
            kf[b, _nn(nn, NOISE)] = filt.meas_var[nn]
        kf[b, GYRO_BIAS] = filt.initial_bias_std * gauss(_sensor_key(keys[b]), INITIAL_BIAS_DRAW)
    return kf


@njit(cache=True)
def _correct(kf, b, nn, i, z, filt):
    """Scalar update of state ``i`` with NN ``nn``'s measurement ``z``, behind the innovation gate."""
    p_ii = kf[b, _p(i, i)]
    s = p_ii + kf[b, _nn(nn, NOISE)]
    nu = z - kf[b, i]
    gated = nu * nu > filt.gate * s
    # E[nu^2] = P_ii + R: a running mean of the innovations measures the NN's noise R.
    seen = min(nu * nu, NOISE_CLIP * s) - p_ii
    r = kf[b, _nn(nn, NOISE)] + filt.noise_rate * (seen - kf[b, _nn(nn, NOISE)])
    kf[b, _nn(nn, NOISE)] = max(r, filt.meas_var[nn])
    if gated:
        kf[b, _nn(nn, REJECTED)] += 1.0
        kf[b, _nn(nn, RUN)] += 1.0
        if kf[b, _nn(nn, RUN)] >= filt.rejections_before_inflation:
            _inflate(kf, b, i, filt.inflation)
        return
    kf[b, _nn(nn, RUN)] = 0.0
    kf[b, _nn(nn, ACCEPTED)] += 1.0
    gain = (kf[b, _p(0, i)] / s, kf[b, _p(1, i)] / s, kf[b, _p(2, i)] / s)
    for j in range(N_X):
        kf[b, j] += gain[j] * nu
        for k in range(N_X):
            kf[b, _p(j, k)] -= gain[j] * gain[k] * s


@njit(cache=True, inline="always")
def _inflate(kf, b, i, factor):
    """Multiply state ``i``'s variance by ``factor``, its covariances by sqrt(factor): P stays positive definite."""
    root = math.sqrt(factor)
    for j in range(N_X):
        kf[b, _p(i, j)] *= root
        kf[b, _p(j, i)] *= root


@njit(cache=True)
def _predict(kf, b, v, gyro, filt):
    """Propagate episode ``b``'s estimate and covariance over one period with odometry ``v`` and gyro rate ``gyro``."""
    T = filt.period
    rate = gyro - kf[b, DRIFT]
    psi_m = kf[b, EPSI] + 0.5 * T * rate
    cos_m, sin_m = math.cos(psi_m), math.sin(psi_m)
    kf[b, EY] += T * v * sin_m
    kf[b, EPSI] += T * rate
    # P <- F P F' with F = [[1, a, c], [0, 1, -T], [0, 0, 1]]: row 0 gains a row 1 + c row 2 and
    # row 1 loses T row 2, in that order in place (each reads rows not yet changed); then the columns.
    a = T * v * cos_m
    c = -0.5 * a * T
    for k in range(N_X):
        kf[b, _p(EY, k)] += a * kf[b, _p(EPSI, k)] + c * kf[b, _p(DRIFT, k)]
        kf[b, _p(EPSI, k)] -= T * kf[b, _p(DRIFT, k)]
    for j in range(N_X):
        kf[b, _p(j, EY)] += a * kf[b, _p(j, EPSI)] + c * kf[b, _p(j, DRIFT)]
        kf[b, _p(j, EPSI)] -= T * kf[b, _p(j, DRIFT)]
    # Gyro noise moves the state by (-c, T, 0) per rad/s, as the rate itself does; an error in
    # the ground speed moves e_y by T sin(psi_m) per m/s.
    q = filt.gyro_rate_std**2
    kf[b, _p(EY, EY)] += c * c * q + (T * v * sin_m) ** 2 * filt.speed_rel_var + filt.lateral_var
    kf[b, _p(EY, EPSI)] -= c * T * q
    kf[b, _p(EPSI, EY)] -= c * T * q
    kf[b, _p(EPSI, EPSI)] += T * T * q
    kf[b, _p(DRIFT, DRIFT)] += filt.drift_var


@njit(cache=True, inline="always")
def _read_sensors(kf, b, key, step, v, true_rate, filt):
    """Odometry speed and gyro rate over the period just driven; advances the gyro's bias."""
    sensor_key = _sensor_key(key)
    c = np.uint64(1 + DRAWS_PER_STEP * step)
    odometry = v * (1.0 + filt.odometry_std * gauss(sensor_key, c))
    gyro = true_rate + kf[b, GYRO_BIAS] + filt.gyro_rate_std * gauss(sensor_key, c + np.uint64(1))
    kf[b, GYRO_BIAS] += filt.gyro_bias_step_std * gauss(sensor_key, c + np.uint64(2))
    return odometry, gyro


@njit(cache=True)
def _restart_pose(kf, b, filt):
    """A person put the robot back on the centre line: pose known to the initial uncertainty, drift rate kept."""
    for i in (EY, EPSI):
        kf[b, i] = 0.0
        for j in range(N_X):
            kf[b, _p(i, j)] = 0.0
            kf[b, _p(j, i)] = 0.0
        kf[b, _p(i, i)] = filt.initial_var[i]
    for nn in (HEADING_NN, DISTANCE_NN):
        kf[b, _nn(nn, RUN)] = 0.0


@njit(cache=True)
def closed_loop_step(est_heading, est_distance, st, curv, keys, step, phys, ctrl, truth, kf, filters):
    """One perception period of every unfinished episode with the EKF between the NNs and the controller.

    Same contract as :func:`.dynamics.closed_loop_step`; ``kf`` (B, :data:`N_ESTIMATOR`)
    carries each episode's filter from step to step; ``filters`` is :func:`build_filter`'s.
    """
    bad = dyn.check_estimates(est_heading, est_distance, st)
    if bad != 0:
        return bad
    filt = filters[0]
    active = 0
    for b in range(st.shape[0]):
        if st[b, dyn.DONE] != 0.0:
            continue
        _correct(kf, b, HEADING_NN, EPSI, math.radians(est_heading[b]), filt)
        _correct(kf, b, DISTANCE_NN, EY, (0.5 - est_distance[b]) * filt.row_spacing, filt)
        v, w = dyn.command(ctrl, phys, kf[b, EY], kf[b, EPSI])
        st[b, dyn.OMEGA] = w
        interventions = st[b, dyn.INTERVENTIONS]
        true_rate = dyn.advance_one(st, b, curv, keys[b], step, phys, v, w)
        dyn.observe_one(st, b, phys, truth)
        odometry, gyro = _read_sensors(kf, b, keys[b], step, v, true_rate, filt)
        if st[b, dyn.INTERVENTIONS] != interventions:
            _restart_pose(kf, b, filt)
        else:
            _predict(kf, b, odometry, gyro, filt)
        if st[b, dyn.DONE] == 0.0:
            active += 1
    return active
