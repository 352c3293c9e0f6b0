"""Paths given by their curvature, and motion along them in Frenet coordinates (arc length, lateral offset, heading error).

Both example applications lay their corridor or lane out as a curvature that is a
sum of sines of arc length, ``curv[b] = (amplitude, angular frequency, phase)`` per
mode; the compiled kernels move bodies along it and the renderers draw its centre
line. One place for each, so a kernel and the frames it is drawn in agree.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def curvature_at(curv, b, s):
    """Curvature (1/m) of episode ``b``'s path at arc ``s``; ``curv`` is (B, 3, modes)."""
    k = 0.0
    for j in range(curv.shape[2]):
        k += curv[b, 0, j] * math.sin(curv[b, 1, j] * s + curv[b, 2, j])
    return k


@njit(cache=True, inline="always")
def midpoint_step(curv, b, s, ey, epsi, v, yaw_rate, dt):
    """(s, ey, epsi) after ``dt`` at speed ``v`` and yaw rate ``yaw_rate``: midpoint (RK2) integration of the Frenet kinematics."""
    kappa = curvature_at(curv, b, s)
    s_dot = v * math.cos(epsi) / (1.0 - kappa * ey)
    h = 0.5 * dt
    s_m = s + h * s_dot
    ey_m = ey + h * v * math.sin(epsi)
    epsi_m = epsi + h * (yaw_rate - kappa * s_dot)
    kappa = curvature_at(curv, b, s_m)
    s_dot = v * math.cos(epsi_m) / (1.0 - kappa * ey_m)
    return s + dt * s_dot, ey + dt * v * math.sin(epsi_m), epsi + dt * (yaw_rate - kappa * s_dot)


def centre_line(s: np.ndarray, kappa: np.ndarray, ds: float) -> np.ndarray:
    """(N, 3) world x, y and tangent angle of the path at the even arc grid ``s`` (step ``ds``), whose curvature there is ``kappa``.

    Trapezoid integration; the origin and heading 0 are at arc 0.
    """
    theta = np.concatenate([[0.0], np.cumsum(0.5 * (kappa[1:] + kappa[:-1]) * ds)])
    theta -= np.interp(0.0, s, theta)
    x = np.concatenate([[0.0], np.cumsum(0.5 * (np.cos(theta[1:]) + np.cos(theta[:-1])) * ds)])
    y = np.concatenate([[0.0], np.cumsum(0.5 * (np.sin(theta[1:]) + np.sin(theta[:-1])) * ds)])
    x -= np.interp(0.0, s, x)
    y -= np.interp(0.0, s, y)
    return np.stack([x, y, theta], axis=1)
