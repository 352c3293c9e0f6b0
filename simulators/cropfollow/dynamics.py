"""Robot motion in the row's frame, contacts with the rows, and the closed loop step.

The robot is a skid-steer unicycle (x' = v cos th, y' = v sin th, th' = w). In the
Frenet frame of the corridor's centre line (arc length ``s``, lateral error ``e_y``
positive to the left, heading error ``e_psi`` positive counter-clockwise, row
curvature ``kappa(s)``) the same motion is, exactly::

    s'     = v cos(e_psi) / (1 - kappa e_y)
    e_y'   = v sin(e_psi)
    e_psi' = w - kappa(s) s'

Plant rows lie at ``e_y = +-row_spacing/2``. The body (a ``width x length``
rectangle) reaches ``half_width |cos e_psi| + half_length |sin e_psi|`` sideways; it
touches a row when that reaches the row line less the stalk radius, and each new
contact is one collision. When the robot's centre crosses a row line, or it turns
across the corridor (``|e_psi| >= 90 deg``), it has left its corridor: a person
puts it back on the centre line (an intervention) and the run continues.

These kernels are compiled with numba and loop over a batch of episodes, so one
perception step of any batch size is one call: a 100 m run at 10 Hz is 1,667
calls. Process noise is a counter-based hash of (episode key, step, sub-step), so
an episode's noise does not depend on which other episodes share its batch.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from ..frenet import midpoint_step
from ..hashrand import gauss

# Columns of the per-episode state array (float64, one row per episode).
S, EY, EPSI, OMEGA, CONTACT, COLLISIONS, INTERVENTIONS, DONE = range(8)
N_STATE = 8

MPC, STANLEY = 0, 1
BAD_HEADING, BAD_DISTANCE = -1, -2
"""Return codes of :func:`closed_loop_step` for a non-finite estimate."""


class Physics(NamedTuple):
    dt: float
    """Physics sub-step (s)."""
    substeps: int
    cruise_speed: float
    max_turn_rate: float
    row_spacing: float
    half_width: float
    half_length: float
    row_clearance: float
    """Lateral distance from the corridor centre at which the body touches a row."""
    slip_std: float
    turn_noise_std: float
    run_length: float


class Control(NamedTuple):
    kind: int
    k_lateral: float
    """Turn rate per metre of lateral error (MPC), or Stanley's cross-track gain."""
    k_heading: float
    """Turn rate per radian of heading error (MPC), or per radian of Stanley steering error."""


@njit(cache=True)
def advance_one(st, b, curv, key, step, phys, v, w):
    """Move episode ``b`` one perception period with commands (v, w); count contacts.

    Returns the mean turn rate the body really had over the sub-steps it moved (what a
    gyro measures: the commanded rate plus terrain noise).
    """
    turned, moved = 0.0, 0
    for j in range(phys.substeps):
        counter = np.uint64(2) * (np.uint64(step) * np.uint64(phys.substeps) + np.uint64(j))
        v_eff = v * (1.0 + phys.slip_std * gauss(key, counter))
        w_eff = w + phys.turn_noise_std * gauss(key, counter + np.uint64(1))
        turned += w_eff
        moved += 1
        st[b, S], st[b, EY], st[b, EPSI] = midpoint_step(curv, b, st[b, S], st[b, EY], st[b, EPSI], v_eff, w_eff, phys.dt)
        ey, epsi = st[b, EY], st[b, EPSI]
        if abs(ey) >= 0.5 * phys.row_spacing or abs(epsi) >= 0.5 * math.pi:
            st[b, INTERVENTIONS] += 1.0
            st[b, EY] = 0.0
            st[b, EPSI] = 0.0
            st[b, OMEGA] = 0.0
            st[b, CONTACT] = 0.0
            continue
        reach = phys.half_width * abs(math.cos(epsi)) + phys.half_length * abs(math.sin(epsi))
        touching = abs(ey) + reach >= phys.row_clearance
        if touching and st[b, CONTACT] == 0.0:
            st[b, COLLISIONS] += 1.0
        st[b, CONTACT] = 1.0 if touching else 0.0
        if st[b, S] >= phys.run_length:
            st[b, DONE] = 1.0
            break
    return turned / moved


@njit(cache=True, inline="always")
def observe_one(st, b, phys, truth):
    truth[0, b] = math.degrees(st[b, EPSI])
    truth[1, b] = 0.5 - st[b, EY] / phys.row_spacing


@njit(cache=True)
def observe(st, phys, truth):
    """Ground truth of the two NNs into ``truth`` (2, B): heading (deg) and d_left / (d_left + d_right)."""
    for b in range(st.shape[0]):
        observe_one(st, b, phys, truth)


@njit(cache=True, inline="always")
def _turn_rate(ctrl, ey_hat, epsi_hat, v):
    if ctrl.kind == MPC:
        return -(ctrl.k_lateral * ey_hat + ctrl.k_heading * epsi_hat)
    # Stanley: steer toward a heading that closes the cross-track error.
    return -ctrl.k_heading * (epsi_hat + math.atan2(ctrl.k_lateral * ey_hat, v))


@njit(cache=True)
def check_estimates(est_heading, est_distance, st):
    """0, or :data:`BAD_HEADING` / :data:`BAD_DISTANCE` when an unfinished episode's estimate is not finite."""
    for b in range(st.shape[0]):
        if st[b, DONE] == 0.0:
            if not math.isfinite(est_heading[b]):
                return BAD_HEADING
            if not math.isfinite(est_distance[b]):
                return BAD_DISTANCE
    return 0


@njit(cache=True, inline="always")
def command(ctrl, phys, ey_hat, epsi_hat):
    """The controller's (v, w) for estimated lateral (m) and heading (rad) errors, w limited to the turn rate."""
    v = phys.cruise_speed
    w = _turn_rate(ctrl, ey_hat, epsi_hat, v)
    return v, min(max(w, -phys.max_turn_rate), phys.max_turn_rate)


@njit(cache=True)
def closed_loop_step(est_heading, est_distance, st, curv, keys, step, phys, ctrl, truth):
    """One perception period of every unfinished episode, controller in the loop.

    ``est_*`` are the NNs' estimates (degrees, distance ratio) of ``truth``. Returns
    the number of unfinished episodes, or :data:`BAD_HEADING` / :data:`BAD_DISTANCE`
    (nothing moved) when an estimate of an unfinished episode is not finite.
    """
    bad = check_estimates(est_heading, est_distance, st)
    if bad != 0:
        return bad
    active = 0
    for b in range(st.shape[0]):
        if st[b, DONE] != 0.0:
            continue
        v, w = command(ctrl, phys, (0.5 - est_distance[b]) * phys.row_spacing, math.radians(est_heading[b]))
        st[b, OMEGA] = w
        advance_one(st, b, curv, keys[b], step, phys, v, w)
        observe_one(st, b, phys, truth)
        if st[b, DONE] == 0.0:
            active += 1
    return active


@njit(cache=True)
def open_loop_step(v, w, st, curv, keys, step, phys, truth):
    """One perception period with commanded (v, w) per episode (the Gymnasium env's step)."""
    for b in range(st.shape[0]):
        if st[b, DONE] == 0.0:
            st[b, OMEGA] = w[b]
            advance_one(st, b, curv, keys[b], step, phys, v[b], w[b])
            observe_one(st, b, phys, truth)
