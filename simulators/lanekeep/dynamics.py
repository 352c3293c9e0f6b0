"""The car, the lead vehicle, the driving stack and the QoS bookkeeping, as compiled kernels.

The ego car is a kinematic bicycle in the Frenet frame of its lane's centre line
(arc length ``s`` of the car's centre, lateral offset ``e_y`` positive to the left,
heading error ``e_psi``, lane curvature ``kappa(s)``)::

    s'     = v cos(e_psi) / (1 - kappa e_y)
    e_y'   = v sin(e_psi)
    e_psi' = v tan(delta) / wheelbase - kappa s'

integrated at the physics rate with a rate-limited steering actuator. At the
perception rate the stack reads the three NNs' outputs and updates its commands,
the way a production stack does it:

- lateral: pure pursuit to the lane centre point the ``lane`` NN reports at the
  look-ahead distance (the path curvature ``2 y / (L^2 + y^2)``);
- longitudinal: an alpha-beta filter tracks the ``lead`` NN's distance (giving the
  closing speed the NN does not output); adaptive cruise control holds a gap of
  standstill gap + time gap x speed; cruise control holds the set speed;
- stops: a state machine CRUISE -> STOPPING -> STOPPED -> CRUISE. A stop is acted
  on after ``debounce_frames`` positive ``stop`` frames in a row, which filters a
  sporadic false alarm and cannot undo persistent misses. The car does not know
  where the line is: it assumes it is at the detection range from where the first
  positive frame of the streak came and brakes (from odometry, at the physics rate)
  to stop ``stop_margin_m`` before it. A detection that comes late therefore makes it
  stop late, past the line: a missed stop. A false alarm streak makes a phantom stop.

The commanded acceleration is the lowest of cruise, ACC and stop braking, bounded
by the car's limits. Process noise (a wheel-angle disturbance) is a counter-based
hash of (episode key, physics step), so an episode's noise never depends on the
batch it runs in. One kernel call advances every episode of a batch by one
perception period.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from ..frenet import curvature_at, midpoint_step
from ..hashrand import gauss
from .world import LEAD_END, LEAD_EVENT0, LEAD_GAP, LEAD_SPEED, LEAD_START, MAX_STOPS, N_EVENTS

# Columns of the per-episode state array (float64, one row per episode).
(S, EY, EPSI, V, DELTA, TIME,
 LEAD_STATE, LEAD_S, LEAD_V, LEAD_MODE, LEAD_T, LEAD_TIMER, LEAD_EVENT,
 TRK_D, TRK_RATE, TRK_ON,
 STOP_MODE, STREAK, FIRST_S, TARGET_S, HOLD_T, IGNORE_S, NEXT_LINE, STOOD,
 STEER_CMD, ACCEL_CMD,
 COLLISIONS, CONTACT, DEPARTURES, OUT, MISSED, PHANTOMS, STOPS_MADE, DONE, GOAL_T, STEP) = range(36)
N_STATE = 36

CRUISE, STOPPING, STOPPED = 0, 1, 2
"""Modes of the stop state machine."""
LEAD_CRUISE, LEAD_BRAKE, LEAD_HOLD, LEAD_ACCEL = 0, 1, 2, 3
LEAD_REACCEL_MPS2 = 1.5
LANE, STOP, LEAD = 0, 1, 2
"""Rows of the truth and estimate arrays (the order of ``config.NN_NAMES``)."""
BAD_ESTIMATE = -1
"""Base of :func:`closed_loop_step`'s return code for a non-finite estimate: -1 - row."""


class Physics(NamedTuple):
    """Everything the kernels need, as plain floats (built by :func:`physics`)."""

    dt: float
    substeps: int
    wheelbase: float
    half_length: float
    half_width: float
    lane_width: float
    set_speed: float
    max_accel: float
    max_brake: float
    max_steer: float
    steer_rate: float
    steer_noise: float
    lookahead: float
    detect_range: float
    lead_max: float
    debounce: int
    stop_margin: float
    stop_hold: float
    ignore_after_stop: float
    standstill_gap: float
    time_gap: float
    acc_gap_gain: float
    acc_speed_gain: float
    speed_gain: float
    alpha: float
    beta: float
    route: float
    max_time: float
    stop_window: float
    stopped_speed: float
    phantom_slack: float
    camera_forward: float


def physics(config) -> Physics:
    c, k = config.car, config.stack
    return Physics(
        dt=1.0 / config.physics_hz, substeps=config.substeps, wheelbase=c.wheelbase_m, half_length=c.length_m / 2,
        half_width=c.width_m / 2, lane_width=config.road.lane_width_m, set_speed=c.set_speed_mps,
        max_accel=c.max_accel_mps2, max_brake=c.max_brake_mps2, max_steer=math.radians(c.max_steer_deg),
        steer_rate=math.radians(c.steer_rate_degps), steer_noise=math.radians(c.steer_noise_deg),
        lookahead=k.lookahead_m, detect_range=k.detect_range_m, lead_max=k.lead_max_m, debounce=k.debounce_frames,
        stop_margin=k.stop_margin_m, stop_hold=k.stop_hold_s, ignore_after_stop=k.ignore_after_stop_m,
        standstill_gap=k.standstill_gap_m, time_gap=k.time_gap_s, acc_gap_gain=k.acc_gap_gain,
        acc_speed_gain=k.acc_speed_gain, speed_gain=k.speed_gain, alpha=k.tracker_alpha, beta=k.tracker_beta,
        route=config.route_m, max_time=config.max_time_s, stop_window=config.stop_window_m,
        stopped_speed=config.stopped_speed_mps, phantom_slack=config.phantom_slack_m,
        camera_forward=config.camera.forward_offset_m,
    )


@njit(cache=True)
def start(st, lead, phys):
    """Initialise the stack's and bookkeeping's columns (pose and speed are set by the caller)."""
    for b in range(st.shape[0]):
        st[b, NEXT_LINE] = 0.0
        st[b, IGNORE_S] = -1e9
        st[b, GOAL_T] = -1.0
        st[b, LEAD_STATE] = 0.0
        _lead_update(st, b, lead, phys, 0.0)


@njit(cache=True)
def _lead_update(st, b, lead, phys, dt):
    """Advance the lead vehicle by ``dt``: appear, cruise, brake, hold, re-accelerate, turn off."""
    front = st[b, S] + phys.half_length
    if st[b, LEAD_STATE] == 0.0:
        if lead[b, LEAD_END] > lead[b, LEAD_START] and front >= lead[b, LEAD_START]:
            st[b, LEAD_STATE] = 1.0
            st[b, LEAD_S] = front + lead[b, LEAD_GAP]
            st[b, LEAD_V] = lead[b, LEAD_SPEED]
            st[b, LEAD_MODE] = LEAD_CRUISE
            st[b, LEAD_T] = 0.0
            st[b, LEAD_EVENT] = 0.0
        return
    if st[b, LEAD_STATE] != 1.0:
        return
    st[b, LEAD_T] += dt
    mode = st[b, LEAD_MODE]
    ev = int(st[b, LEAD_EVENT])
    v = st[b, LEAD_V]
    cruise = lead[b, LEAD_SPEED]
    if mode == LEAD_CRUISE:
        v = min(cruise, v + LEAD_REACCEL_MPS2 * dt)
        if ev < N_EVENTS and st[b, LEAD_T] >= lead[b, LEAD_EVENT0 + 4 * ev]:
            st[b, LEAD_MODE] = LEAD_BRAKE
    elif mode == LEAD_BRAKE:
        floor = lead[b, LEAD_EVENT0 + 4 * ev + 2]
        v -= lead[b, LEAD_EVENT0 + 4 * ev + 1] * dt
        if v <= floor:
            v = floor
            st[b, LEAD_MODE] = LEAD_HOLD
            st[b, LEAD_TIMER] = lead[b, LEAD_EVENT0 + 4 * ev + 3]
    elif mode == LEAD_HOLD:
        st[b, LEAD_TIMER] -= dt
        if st[b, LEAD_TIMER] <= 0.0:
            st[b, LEAD_MODE] = LEAD_ACCEL
            st[b, LEAD_EVENT] = ev + 1
    else:
        v += LEAD_REACCEL_MPS2 * dt
        if v >= cruise:
            v = cruise
            st[b, LEAD_MODE] = LEAD_CRUISE
    st[b, LEAD_V] = v
    st[b, LEAD_S] += v * dt
    if st[b, LEAD_S] >= lead[b, LEAD_END]:
        st[b, LEAD_STATE] = 2.0  # turned off the road


@njit(cache=True, inline="always")
def _next_line(st, b, stops):
    k = int(st[b, NEXT_LINE])
    return stops[b, k] if k < MAX_STOPS else np.inf


@njit(cache=True)
def observe_one(st, b, curv, stops, phys, truth):
    """The three NNs' true outputs for episode ``b`` now, into ``truth[:, b]``."""
    d = phys.lookahead
    k_mid = curvature_at(curv, b, st[b, S] + 0.5 * d)
    epsi = st[b, EPSI]
    truth[LANE, b] = -d * math.sin(epsi) + (0.5 * k_mid * d * d - st[b, EY]) * math.cos(epsi)
    front = st[b, S] + phys.half_length
    line = _next_line(st, b, stops)
    truth[STOP, b] = 1.0 if line - front <= phys.detect_range else 0.0
    if st[b, LEAD_STATE] == 1.0:
        truth[LEAD, b] = min(max(st[b, LEAD_S] - front, 0.0), phys.lead_max)
    else:
        truth[LEAD, b] = phys.lead_max


@njit(cache=True)
def observe(st, curv, stops, phys, truth):
    for b in range(st.shape[0]):
        observe_one(st, b, curv, stops, phys, truth)


@njit(cache=True)
def decide(st, b, est_lane, est_stop, est_lead, stops, phys):
    """The stack's perception-rate update for episode ``b``: steering, ACC/cruise, the stop state machine."""
    period = phys.dt * phys.substeps
    y, la = est_lane, phys.lookahead
    curvature = 2.0 * y / (la * la + y * y)
    st[b, STEER_CMD] = min(max(math.atan(phys.wheelbase * curvature), -phys.max_steer), phys.max_steer)
    if est_lead < phys.lead_max - 0.5:
        if st[b, TRK_ON] == 0.0:
            st[b, TRK_D] = est_lead
            st[b, TRK_RATE] = 0.0
            st[b, TRK_ON] = 1.0
        else:
            pred = st[b, TRK_D] + st[b, TRK_RATE] * period
            r = est_lead - pred
            st[b, TRK_D] = pred + phys.alpha * r
            st[b, TRK_RATE] += phys.beta * r / period
    else:
        st[b, TRK_ON] = 0.0
    v = st[b, V]
    a = phys.speed_gain * (phys.set_speed - v)
    if st[b, TRK_ON] != 0.0:
        gap_error = st[b, TRK_D] - (phys.standstill_gap + phys.time_gap * v)
        a = min(a, phys.acc_gap_gain * gap_error + phys.acc_speed_gain * st[b, TRK_RATE])
    st[b, ACCEL_CMD] = min(max(a, -phys.max_brake), phys.max_accel)
    if st[b, STOP_MODE] == CRUISE:
        front = st[b, S] + phys.half_length
        if front >= st[b, IGNORE_S] and est_stop >= 0.5:
            st[b, STREAK] += 1.0
            if st[b, STREAK] == 1.0:
                st[b, FIRST_S] = front
            if st[b, STREAK] >= phys.debounce:
                st[b, STOP_MODE] = STOPPING
                st[b, TARGET_S] = st[b, FIRST_S] + phys.detect_range - phys.stop_margin
                if not (_next_line(st, b, stops) - front <= phys.detect_range + phys.phantom_slack):
                    st[b, PHANTOMS] += 1.0
        else:
            st[b, STREAK] = 0.0


@njit(cache=True)
def advance_one(st, b, curv, stops, lead, key, phys):
    """Move episode ``b`` one perception period (``substeps`` physics steps) under its current commands."""
    dt = phys.dt
    for j in range(phys.substeps):
        if st[b, DONE] != 0.0:
            return
        front = st[b, S] + phys.half_length
        v = st[b, V]
        a = st[b, ACCEL_CMD]
        mode = st[b, STOP_MODE]
        if mode == STOPPING:
            rem = st[b, TARGET_S] - front
            if v <= 0.05:
                st[b, STOP_MODE] = STOPPED
                st[b, HOLD_T] = phys.stop_hold
                st[b, STOPS_MADE] += 1.0
                a = -phys.max_brake
            elif rem <= 0.3:
                a = -phys.max_brake
            else:
                a = min(a, -min(phys.max_brake, v * v / (2.0 * rem)))
        elif mode == STOPPED:
            a = -phys.max_brake
            st[b, HOLD_T] -= dt
            if st[b, HOLD_T] <= 0.0:
                st[b, STOP_MODE] = CRUISE
                st[b, IGNORE_S] = front + phys.ignore_after_stop
                st[b, STREAK] = 0.0
        # Steering actuator: rate-limited toward the command, plus a disturbance.
        step = np.uint64(st[b, STEP])
        st[b, STEP] += 1.0
        delta = st[b, DELTA]
        ds = min(max(st[b, STEER_CMD] - delta, -phys.steer_rate * dt), phys.steer_rate * dt)
        delta += ds
        st[b, DELTA] = delta
        delta_eff = delta + phys.steer_noise * gauss(key, step)
        v_new = max(0.0, v + a * dt)
        v_mid = 0.5 * (v + v_new)
        yaw_rate = v_mid * math.tan(delta_eff) / phys.wheelbase
        st[b, S], st[b, EY], st[b, EPSI] = midpoint_step(curv, b, st[b, S], st[b, EY], st[b, EPSI], v_mid, yaw_rate, dt)
        st[b, V] = v_new
        st[b, TIME] += dt
        _lead_update(st, b, lead, phys, dt)
        _bookkeeping(st, b, stops, phys)


@njit(cache=True)
def _bookkeeping(st, b, stops, phys):
    """Count collisions, lane departures and missed stops; end the run at the goal or the time limit."""
    front = st[b, S] + phys.half_length
    ey = st[b, EY]
    if st[b, LEAD_STATE] == 1.0 and abs(ey) < phys.lane_width:
        gap = st[b, LEAD_S] - front
        if gap <= 0.0:
            if st[b, CONTACT] == 0.0:
                st[b, COLLISIONS] += 1.0
            st[b, CONTACT] = 1.0
            # The cars do not pass through each other: the ego ends up against the lead's rear at its speed.
            st[b, S] = st[b, LEAD_S] - phys.half_length
            st[b, V] = min(st[b, V], st[b, LEAD_V])
        elif gap > 0.5:
            st[b, CONTACT] = 0.0
    out = abs(ey) > 0.5 * phys.lane_width - phys.half_width
    if out and st[b, OUT] == 0.0:
        st[b, DEPARTURES] += 1.0
    st[b, OUT] = 1.0 if out else 0.0
    if abs(ey) > phys.lane_width or abs(st[b, EPSI]) > 0.8:
        # Off the road or across it: a safety driver puts the car back in its lane (already counted).
        st[b, EY] = 0.0
        st[b, EPSI] = 0.0
        st[b, DELTA] = 0.0
    line = _next_line(st, b, stops)
    if st[b, V] < phys.stopped_speed and line - phys.stop_window <= front <= line:
        st[b, STOOD] = 1.0
    if front > line:
        if st[b, STOOD] == 0.0:
            st[b, MISSED] += 1.0
        st[b, NEXT_LINE] += 1.0
        st[b, STOOD] = 0.0
    if st[b, S] >= phys.route:
        st[b, DONE] = 1.0
        st[b, GOAL_T] = st[b, TIME]
    elif st[b, TIME] >= phys.max_time:
        st[b, DONE] = 1.0
        st[b, GOAL_T] = st[b, TIME]


@njit(cache=True)
def check_estimates(est, st):
    """0, or ``BAD_ESTIMATE - row`` when an unfinished episode's estimate of NN ``row`` is not finite."""
    for b in range(st.shape[0]):
        if st[b, DONE] == 0.0:
            for r in range(est.shape[0]):
                if not math.isfinite(est[r, b]):
                    return BAD_ESTIMATE - r
    return 0


@njit(cache=True)
def closed_loop_step(est, st, curv, stops, lead, keys, phys, truth):
    """One perception period of every unfinished episode, stack in the loop.

    ``est`` (3, B) are the NNs' outputs (lane offset m, stop score, lead distance m).
    Returns the number of unfinished episodes, or ``BAD_ESTIMATE - row`` (nothing
    moved) when an unfinished episode's estimate is not finite.
    """
    bad = check_estimates(est, st)
    if bad != 0:
        return bad
    active = 0
    for b in range(st.shape[0]):
        if st[b, DONE] != 0.0:
            continue
        decide(st, b, est[LANE, b], est[STOP, b], est[LEAD, b], stops, phys)
        advance_one(st, b, curv, stops, lead, keys[b], phys)
        observe_one(st, b, curv, stops, phys, truth)
        if st[b, DONE] == 0.0:
            active += 1
    return active


@njit(cache=True)
def open_loop_step(steer, accel, st, curv, stops, lead, keys, phys, truth):
    """One perception period with commanded (wheel angle rad, acceleration m/s^2) per episode (the Gymnasium env)."""
    for b in range(st.shape[0]):
        if st[b, DONE] == 0.0:
            st[b, STEER_CMD] = min(max(steer[b], -phys.max_steer), phys.max_steer)
            st[b, ACCEL_CMD] = min(max(accel[b], -phys.max_brake), phys.max_accel)
            advance_one(st, b, curv, stops, lead, keys[b], phys)
            observe_one(st, b, curv, stops, phys, truth)
