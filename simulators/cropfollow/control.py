"""Row-following controllers: a receding-horizon MPC and the Stanley law.

The MPC plans ``horizon_steps`` perception periods ahead on the linearised
error dynamics of the row (lateral error ``e_y``, heading error ``e_psi``, turn
rate ``w`` held over each period ``T`` at cruise speed ``v``)::

    e_y[k+1]   = e_y[k] + v T e_psi[k] + v T^2 / 2 w[k]
    e_psi[k+1] = e_psi[k] + T w[k]

minimising ``sum x' Q x + R w^2``. Re-planned at every perception step from the
NNs' estimates, its first move is ``w = -K x`` with ``K`` from the finite-horizon
Riccati recursion (the exact solution of the unconstrained quadratic program),
so the controller costs two multiplications per step; the turn-rate limit is
applied to that move.
"""

from __future__ import annotations

import numpy as np

from .config import SimConfig
from .dynamics import MPC, STANLEY, Control


def mpc_gain(config: SimConfig) -> np.ndarray:
    """First-move feedback gain ``K`` (shape (2,)) of the finite-horizon LQ problem."""
    c, v, T = config.control, config.robot.cruise_speed_mps, config.perception_period_s
    A = np.array([[1.0, v * T], [0.0, 1.0]])
    B = np.array([[v * T * T / 2.0], [T]])
    Q = np.diag([c.q_lateral, c.q_heading])
    R = np.array([[c.r_turn]])
    P = Q.copy()
    K = np.zeros((1, 2))
    for _ in range(c.horizon_steps):
        K = np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
        P = Q + A.T @ P @ (A - B @ K)
    return K[0]


def build_control(config: SimConfig) -> Control:
    """The numba-side controller description for ``config.control``."""
    c = config.control
    if c.kind == "mpc":
        k = mpc_gain(config)
        return Control(MPC, float(k[0]), float(k[1]))
    return Control(STANLEY, float(c.stanley_gain), float(c.stanley_heading_gain))
