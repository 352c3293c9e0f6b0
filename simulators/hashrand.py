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
    return uniform_of_mixed(key, mix64(counter))


@njit(cache=True, inline="always")
def uniform_of_mixed(key, mixed):
    """``uniform(key, counter)`` given ``mixed = mix64(counter)``: a kernel that draws the same counters for every
    key (a frame's sensor noise, one number per pixel) hashes them once (:func:`mixed_counters`)."""
    return float(mix64(key ^ mixed) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def mixed_counters(n):
    """``mix64`` of the counters 0 .. n-1 (uint64), for :func:`uniform_of_mixed`."""
    out = np.empty(n, dtype=np.uint64)
    for i in range(n):
        out[i] = mix64(np.uint64(i))
    return out


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
    k = np.uint64(key)
    return _blend(x, y, ix, iy, _corner(k, ix, iy), _corner(k, ix + 1, iy), _corner(k, ix, iy + 1), _corner(k, ix + 1, iy + 1))


@njit(cache=True, inline="always")
def value_noise_memo(x, y, key, memo):
    """``value_noise(x, y, key)``, reusing the corners of the cell that the last call with this ``memo`` hashed.

    Neighbouring pixels mostly fall in one cell of a coarse noise, and hashing the four corners is most of the
    noise's cost. ``memo`` is a float64 array of 6 (the cell and its corners; start with NaN), used with one
    ``key`` only. The result is bit for bit ``value_noise``'s.
    """
    ix, iy = math.floor(x), math.floor(y)
    if ix != memo[0] or iy != memo[1]:
        k = np.uint64(key)
        memo[0], memo[1] = ix, iy
        memo[2], memo[3] = _corner(k, ix, iy), _corner(k, ix + 1, iy)
        memo[4], memo[5] = _corner(k, ix, iy + 1), _corner(k, ix + 1, iy + 1)
    return _blend(x, y, ix, iy, memo[2], memo[3], memo[4], memo[5])


@njit(cache=True, inline="always")
def _corner(k, ix, iy):
    """The noise's value at grid corner (ix, iy) of stream ``k``."""
    return uniform(k, np.uint64(np.int64(ix) * 73856093 ^ np.int64(iy) * 19349663))


@njit(cache=True, inline="always")
def _blend(x, y, ix, iy, c00, c10, c01, c11):
    """Smoothstep-weighted bilinear blend of a cell's corners at (x, y)."""
    fx, fy = x - ix, y - iy
    fx = fx * fx * (3.0 - 2.0 * fx)
    fy = fy * fy * (3.0 - 2.0 * fy)
    return (c00 * (1 - fx) + c10 * fx) * (1 - fy) + (c01 * (1 - fx) + c11 * fx) * fy
