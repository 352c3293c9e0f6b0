"""Counter-based random numbers for compiled kernels.

A number is a pure function of (stream key, counter), so an episode's process
noise or a pixel's texture (a plant's leaf angles, a road's asphalt) never depend on what else is simulated or drawn,
and kernels need no generator state.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def mix64(x):
    """splitmix64 finaliser: a well-mixed 64-bit hash of a counter."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, inline="always")
def uniform(key, counter):
    """Uniform number in [0, 1) number ``counter`` of stream ``key`` (both uint64)."""
    return float(mix64(key ^ mix64(counter)) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, inline="always")
def gauss(key, counter):
    """Standard normal number ``counter`` of stream ``key`` (Box-Muller on two uniforms)."""
    c = np.uint64(2) * counter
    u1 = uniform(key, c) + 0.5 / 9007199254740992.0
    u2 = uniform(key, c + np.uint64(1))
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@njit(cache=True, inline="always")
def value_noise(x, y, key):
    """Smooth noise in [0, 1) on a unit grid (bilinear interpolation of hashed corners)."""
    ix, iy = math.floor(x), math.floor(y)
    fx, fy = x - ix, y - iy
    fx = fx * fx * (3.0 - 2.0 * fx)
    fy = fy * fy * (3.0 - 2.0 * fy)
    k = np.uint64(key)
    c00 = uniform(k, np.uint64(np.int64(ix) * 73856093 ^ np.int64(iy) * 19349663))
    c10 = uniform(k, np.uint64(np.int64(ix + 1) * 73856093 ^ np.int64(iy) * 19349663))
    c01 = uniform(k, np.uint64(np.int64(ix) * 73856093 ^ np.int64(iy + 1) * 19349663))
    c11 = uniform(k, np.uint64(np.int64(ix + 1) * 73856093 ^ np.int64(iy + 1) * 19349663))
    return (c00 * (1 - fx) + c10 * fx) * (1 - fy) + (c01 * (1 - fx) + c11 * fx) * fy
