"""The counter-based random numbers: the shortcuts kernels take give bit for bit the plain functions' numbers."""

from __future__ import annotations

import numpy as np
from numba import njit

from qaopt.simulators.hashrand import mixed_counters, uniform, uniform_of_mixed, value_noise, value_noise_memo


@njit(cache=False)
def _noise_along(xs, ys, key):
    """value_noise and value_noise_memo at each point in order, one memo for the whole path."""
    memo = np.full(6, np.nan)
    plain, memoised = np.empty(xs.size), np.empty(xs.size)
    for i in range(xs.size):
        plain[i] = value_noise(xs[i], ys[i], key)
        memoised[i] = value_noise_memo(xs[i], ys[i], key, memo)
    return plain, memoised


@njit(cache=False)
def _uniforms(key, n):
    mixed = mixed_counters(n)
    plain, shortcut = np.empty(n), np.empty(n)
    for i in range(n):
        plain[i] = uniform(key, np.uint64(i))
        shortcut[i] = uniform_of_mixed(key, mixed[i])
    return plain, shortcut


def test_memoised_noise_is_value_noise_bit_for_bit():
    rng = np.random.default_rng(0)
    # A path that stays in a cell for a while, jumps back to earlier cells and crosses negative coordinates.
    xs = np.concatenate([np.linspace(-3.2, 4.7, 700), rng.uniform(-50, 50, 300), np.linspace(4.7, -3.2, 700)])
    ys = np.concatenate([np.linspace(0.3, 0.9, 700), rng.uniform(-50, 50, 300), np.full(700, -2.5)])
    for key in (0.0, 12345.0, float(2**52 - 1)):
        plain, memoised = _noise_along(xs, ys, key)
        assert np.array_equal(plain, memoised)
        assert 0.0 <= plain.min() and plain.max() < 1.0 and plain.std() > 0.1


def test_uniform_from_precomputed_counters_is_uniform_bit_for_bit():
    for key in (np.uint64(0), np.uint64(0xDEADBEEF), np.uint64(2**63 + 5)):
        plain, shortcut = _uniforms(key, 5000)
        assert np.array_equal(plain, shortcut)
