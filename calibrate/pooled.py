"""A pooled, monotone model of the failure probability over the whole error space.

A per-point test judges each point by its own runs alone: at <= 96 runs a point that
fails 1-5 % of the time can never be accepted at 90 % confidence, so the region it
certifies stops short of the true boundary however well the points are placed.
This model instead uses every run at every point. The failure probability is

    logit p(u) = b + (sum_j (a_j * u_j ** g_j) ** r) ** (1 / r)     (a_j, g_j, r > 0)

over the unit cube: monotone in every axis (more error never helps), with one
steepness ``a_j`` and one shape ``g_j`` per axis, so a sharp knee (large ``g``) and a
gradual rise (``g`` near 1) are both in the family, and one ``r`` for how errors on
several NNs combine: ``r = 1`` adds them on the logit scale, a large ``r`` lets the
worst NN alone decide (a box-shaped region), a small one makes small errors on many
NNs add up fast. Points near each other share strength through these few
parameters, so runs on both sides of the boundary pin it down.

Its confidence is the model's own: the posterior of ``(b, log a, log g, log r)`` under
weak priors, drawn by importance sampling, with the likelihood tempered by the
overdispersion of the runs (Pearson chi-square per degree of freedom, at least 1), so
that a shape the family cannot follow, or evaluations whose seeds were unusually easy
or hard, widen the uncertainty instead of passing unnoticed. A point is certified
valid when the posterior probability that ``p(u) <= max_failure_rate`` is at least
the spec's confidence; ``proba(U)`` is that posterior probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit
from scipy.stats import qmc

from qaopt.calibrate.dominance import above, below

PRIOR_MEAN_B, PRIOR_SD_B = -4.0, 4.0  # logit of P(fail) at zero error: failures unlikely, widely uncertain
PRIOR_MEAN_LOG_A, PRIOR_SD_LOG_A = np.log(10.0), 1.5  # logit rise across an axis: between ~0.5 and ~200
PRIOR_MEAN_LOG_G, PRIOR_SD_LOG_G = 0.0, 1.0  # shape: between ~0.14 (knee at once) and ~7 (knee late)
PRIOR_MEAN_LOG_R, PRIOR_SD_LOG_R = 0.0, 1.5  # combination: from ~0.05 (synergy) to ~20 (the worst NN decides)
DRAWS, DRAW_SEED, ROUNDS = 4000, 0, 2  # posterior draws per round; a fixed seed keeps a region's answers reproducible
CHUNK = 4096  # query points per block of draws x points, to bound memory
DROPPED_WEIGHT = 1e-4  # the least-weighted draws, worth this much posterior probability in all, are dropped
PROPOSAL_DF, PROPOSAL_SCALE = 4, 1.5  # heavy-tailed and wider than the Laplace approximation


def _bounds(d: int) -> list[tuple[float, float]]:
    """Keep the optimizer where ``exp`` cannot overflow; the priors make the edges improbable anyway."""
    return [(-30.0, 30.0)] + [(-8.0, 8.0)] * d + [(-4.0, 3.0)] * d + [(-4.0, 4.0)]


@dataclass(frozen=True)
class PooledFit:
    """The fitted posterior as weighted draws of ``theta = (b, log a, log g, log r)``.

    ``mode`` is the posterior mode; ``draws`` and ``weights`` (summing to 1) represent
    the posterior, ``dispersion`` is the overdispersion it was tempered with and
    ``effective_draws`` how many independent draws the weights are worth.
    """

    dim: int
    mode: np.ndarray
    draws: np.ndarray
    weights: np.ndarray
    dispersion: float
    points: int
    runs: int

    @property
    def effective_draws(self) -> float:
        return float(1.0 / np.sum(self.weights ** 2))

    def logit_draws(self, U: np.ndarray) -> np.ndarray:
        """``logit p`` at unit-cube points (columns) under each draw (rows)."""
        return _eta_draws(self.draws, self.dim, np.atleast_2d(np.asarray(U, dtype=float)))

    def failure_rate(self, U: np.ndarray) -> np.ndarray:
        """The posterior mean failure probability at each point."""
        return self.weights @ expit(self.logit_draws(U))

    def proba(self, U: np.ndarray, max_failure_rate: float) -> np.ndarray:
        """Posterior probability that each point's failure rate is at most ``max_failure_rate``."""
        limit = np.log(max_failure_rate / (1 - max_failure_rate))
        U = np.atleast_2d(np.asarray(U, dtype=float))
        return np.concatenate([self.weights @ (self.logit_draws(U[i:i + CHUNK]) <= limit)
                               for i in range(0, len(U), CHUNK)]) if len(U) else np.zeros(0)


def _eta_draws(thetas: np.ndarray, d: int, U: np.ndarray) -> np.ndarray:
    """``logit p`` for every draw (rows of ``thetas``) at every point (rows of ``U``): shape (draws, points)."""
    a, g, r = np.exp(thetas[:, 1:1 + d]), np.exp(thetas[:, 1 + d:1 + 2 * d]), np.exp(thetas[:, -1])
    logu = np.log(np.clip(U, 1e-300, None))  # (N, d); u = 0 gives t = 0 below
    logt = np.log(a)[:, None, :] + g[:, None, :] * logu[None]  # (S, N, d)
    rl = r[:, None, None] * logt
    m = rl.max(2, keepdims=True)
    log_l = (m + np.log(np.exp(rl - m).sum(2, keepdims=True)))[..., 0]  # log sum_j t_j^r, stably
    S = np.exp(np.minimum(log_l / r[:, None], 700.0))
    return thetas[:, :1] + S


def _eta(theta: np.ndarray, d: int, U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``logit p`` at each row of ``U`` and its Jacobian in ``theta = (b, log a, log g, log r)``."""
    a, g, r = np.exp(theta[1:1 + d]), np.exp(theta[1 + d:1 + 2 * d]), float(np.exp(theta[-1]))
    Uc = np.clip(U, 0.0, None)
    pos = Uc > 0
    logu = np.log(np.where(pos, Uc, 1.0))
    t = np.where(pos, a * np.exp(g * logu), 0.0)  # a_j u_j^g_j
    logt = np.log(np.where(t > 0, t, 1.0))
    tr = np.where(t > 0, np.exp(r * logt), 0.0)  # t_j^r
    L = tr.sum(1)
    some = L > 0
    logL = np.log(np.where(some, L, 1.0))
    S = np.where(some, np.exp(logL / r), 0.0)
    # dS / dlog t_j = S^(1-r) t_j^r, in logs so that neither factor overflows
    w = np.where(tr > 0, np.exp(np.minimum(((1 - r) * logL / r)[:, None] + r * logt, 700.0)), 0.0)
    dr = np.where(some, S * (-logL / r + (tr * logt).sum(1) / np.where(some, L, 1.0)), 0.0)
    J = np.hstack([np.ones((len(U), 1)), w, w * logu * g, dr[:, None]])
    return theta[0] + S, J


def fit_pooled(U: np.ndarray, runs: np.ndarray, failures: np.ndarray) -> PooledFit:
    """Fit the model to ``runs[i]`` runs with ``failures[i]`` failures at unit-cube point ``U[i]``."""
    U = np.atleast_2d(np.asarray(U, dtype=float))
    n, k = np.asarray(runs, dtype=float), np.asarray(failures, dtype=float)
    d = U.shape[1]
    mean = np.concatenate([[PRIOR_MEAN_B], np.full(d, PRIOR_MEAN_LOG_A), np.full(d, PRIOR_MEAN_LOG_G),
                           [PRIOR_MEAN_LOG_R]])
    sd = np.concatenate([[PRIOR_SD_B], np.full(d, PRIOR_SD_LOG_A), np.full(d, PRIOR_SD_LOG_G), [PRIOR_SD_LOG_R]])

    lo, hi = np.array(_bounds(d)).T

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        # The likelihood sees theta clipped to where exp cannot overflow; the prior pulls it back.
        clipped = np.clip(theta, lo, hi)
        eta, J = _eta(clipped, d, U)
        nll = -(k * log_expit(eta) + (n - k) * log_expit(-eta)).sum()
        grad = np.where(clipped == theta, (n * expit(eta) - k) @ J, 0.0)  # d nll / d eta = n p - k
        z = (theta - mean) / sd
        return float(nll + 0.5 * (z ** 2).sum()), grad + z / sd

    best = None
    for b0 in (PRIOR_MEAN_B, -8.0, 0.0):  # a few starts: the likelihood of a steep knee is not convex
        start = mean.copy()
        start[0] = b0
        res = minimize(objective, start, jac=True, method="BFGS")
        if best is None or res.fun < best.fun:
            best = res
    mode = np.clip(best.x, lo, hi)
    dispersion = _dispersion(expit(_eta(mode, d, U)[0]), n, k, len(mode))
    # Importance sampling from a wide Student-t around the mode: the posterior of a steep
    # knee is far from Gaussian (flat along the steepness), where a Laplace approximation
    # is overconfident exactly at the boundary.
    # The curvature at the mode, floored at the prior's (a mode on a bound or a saddle of the
    # likelihood must not give a proposal narrower than the prior along that direction).
    curv, axes = np.linalg.eigh(_hessian(lambda t: objective(t)[1], mode))
    scale = PROPOSAL_SCALE * np.sqrt(dispersion / np.maximum(curv, 1.0 / sd.max() ** 2))
    rng = np.random.default_rng(DRAW_SEED)

    def log_posterior(draws: np.ndarray) -> np.ndarray:
        eta = _eta_draws(draws, d, U)
        loglik = (k * log_expit(eta) + (n - k) * log_expit(-eta)).sum(1) / dispersion
        inside = ((draws >= lo) & (draws <= hi)).all(1)
        return np.where(inside, loglik - 0.5 * (((draws - mean) / sd) ** 2).sum(1), -np.inf)

    # Adaptive importance sampling: the second round proposes from the moments of the first
    # round's weighted draws, which follow a curved or skewed posterior far better than the
    # curvature at the mode does (several times the effective draws).
    center, basis = mode, axes * scale  # draws = center + t @ basis.T
    for _ in range(ROUNDS):
        draws, logprop = _student_t(rng, center, basis)
        logw = log_posterior(draws) - logprop
        w = np.exp(logw - logw.max())
        w /= w.sum()
        if 1.0 / np.sum(w ** 2) < 2 * len(mode):
            break  # too few effective draws to estimate a covariance from: keep this round
        center = w @ draws
        cov = ((draws - center) * w[:, None]).T @ (draws - center) + 1e-9 * np.eye(len(mode))
        basis = np.linalg.cholesky(cov) * PROPOSAL_SCALE
    # Draws with negligible weight change no probability by more than DROPPED_WEIGHT; dropping them makes
    # every later query (plots of 40,000 points, the joint threshold) many times cheaper.
    order = np.argsort(-w)
    kept = order[: int(np.searchsorted(np.cumsum(w[order]), 1 - DROPPED_WEIGHT)) + 1]
    return PooledFit(d, mode, draws[kept], w[kept] / w[kept].sum(), dispersion, len(U), int(n.sum()))


def _student_t(rng: np.random.Generator, center: np.ndarray, basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``DRAWS`` multivariate Student-t draws ``center + t @ basis.T`` and their log density (up to a constant)."""
    q = len(center)
    t = rng.standard_normal((DRAWS, q)) / np.sqrt(rng.chisquare(PROPOSAL_DF, DRAWS) / PROPOSAL_DF)[:, None]
    logdet = np.linalg.slogdet(basis)[1]
    return center + t @ basis.T, -0.5 * (PROPOSAL_DF + q) * np.log1p((t ** 2).sum(1) / PROPOSAL_DF) - logdet


def _hessian(grad, theta: np.ndarray, h: float = 1e-4) -> np.ndarray:
    """Central differences of the analytic gradient."""
    m = len(theta)
    H = np.empty((m, m))
    for i in range(m):
        e = np.zeros(m)
        e[i] = h
        H[i] = (grad(theta + e) - grad(theta - e)) / (2 * h)
    return (H + H.T) / 2


def _dispersion(p: np.ndarray, n: np.ndarray, k: np.ndarray, params: int) -> float:
    """Pearson chi-square per residual degree of freedom, at least 1.

    Points with almost no expected failures are pooled into one cell first (a single
    failure where the model expects 0.001 would otherwise dominate the sum), and too
    few points to estimate it from leave it at 1.
    """
    p = np.clip(p, 1e-9, 1 - 1e-9)
    expected, var = n * p, n * p * (1 - p)
    small = expected < 1.0
    cells = [(k[~small], expected[~small], var[~small])]
    if small.any():
        cells.append((np.array([k[small].sum()]), np.array([expected[small].sum()]),
                      np.array([max(var[small].sum(), expected[small].sum(), 0.5)])))
    chi2 = sum(float((((kk - e) ** 2) / v).sum()) for kk, e, v in cells)
    count = sum(len(kk) for kk, _, _ in cells)
    dof = count - params
    return max(1.0, chi2 / dof) if dof >= 2 else 1.0


SUPPORT_FACTOR = 2.0
"""An evaluated point supports the certification of the points below it while its observed
failure rate is at most this many times the goal's (see :class:`PooledCertifier`)."""

REFERENCE_POINTS = 1024
"""Sobol points of the unit cube on which the region's joint confidence is computed."""


class PooledCertifier:
    """The region a :class:`PooledFit` certifies, with a confidence that holds for the region as a whole.

    A point-by-point rule (posterior P(valid) >= confidence at each point) is right at
    each point 90 % of the time but wrong *somewhere* along a long boundary far more
    often. Here the certified set is ``{u : P(valid at u) >= t}`` with the smallest
    ``t`` at which the posterior probability that *every* point of the set is valid is
    at least the confidence (computed jointly over the posterior draws on a Sobol set
    of the cube and the evaluated points).

    Two guards keep a wrong model shape from certifying what no run supports: nothing
    is certified that dominates an evaluated point whose observed failure rate is above
    ``SUPPORT_FACTOR`` times the goal, and everything certified is dominated by an
    evaluated point whose rate is at most that (interpolation between runs, never
    extrapolation beyond them).

    Verdicts from outside the model (``field``: points, and whether each was decided
    valid) win over it, by monotonicity: a point below one decided valid is certified,
    and a point above one decided invalid is not, whatever the fit says (the invalid
    side wins where both apply).
    """

    def __init__(self, U: np.ndarray, runs: np.ndarray, failures: np.ndarray,
                 max_failure_rate: float, confidence: float,
                 field: tuple[np.ndarray, np.ndarray] | None = None):
        U = np.atleast_2d(np.asarray(U, dtype=float))
        points, valid = field if field is not None else (np.zeros((0, U.shape[1])), np.zeros(0, bool))
        self.vouched, self.vetoed = points[valid], points[~valid]
        runs, failures = np.asarray(runs, dtype=float), np.asarray(failures, dtype=float)
        self.max_failure_rate, self.confidence = max_failure_rate, confidence
        self.fit = fit_pooled(U, runs, failures)
        rate = failures / np.maximum(runs, 1)
        self.support = U[rate <= SUPPORT_FACTOR * max_failure_rate]
        self.refuted = U[rate > SUPPORT_FACTOR * max_failure_rate]
        Q = np.vstack([qmc.Sobol(U.shape[1], scramble=True, seed=0).random(REFERENCE_POINTS), U])
        Q = Q[self._guard(Q)]
        self.threshold = self._joint_threshold(Q)

    def _guard(self, U: np.ndarray) -> np.ndarray:
        return below(U, self.support) & ~above(U, self.refuted)

    def _joint_threshold(self, Q: np.ndarray) -> float:
        if not len(Q):
            return 1.0
        limit = np.log(self.max_failure_rate / (1 - self.max_failure_rate))
        valid = self.fit.logit_draws(Q) <= limit  # draws x points
        w = self.fit.weights
        marginal = w @ valid
        lo, hi = self.confidence, 1.0  # the joint statement needs at least the point-wise one
        if w @ valid[:, marginal >= lo].all(1) >= self.confidence:
            return lo
        for _ in range(24):
            t = (lo + hi) / 2
            inside = marginal >= t
            if not inside.any() or w @ valid[:, inside].all(1) >= self.confidence:
                hi = t
            else:
                lo = t
        return hi

    def predict_proba(self, U: np.ndarray) -> np.ndarray:
        """Posterior probability that each point's failure rate is within the goal; 1 or 0 where a verdict from
        outside the model decides it."""
        U = np.atleast_2d(np.asarray(U, dtype=float))
        p = self.fit.proba(U, self.max_failure_rate)
        return np.where(above(U, self.vetoed), 0.0, np.where(below(U, self.vouched), 1.0, p))

    def certified(self, U: np.ndarray) -> np.ndarray:
        U = np.atleast_2d(np.asarray(U, dtype=float))
        fitted = (self.fit.proba(U, self.max_failure_rate) >= self.threshold) & self._guard(U)
        return (fitted | below(U, self.vouched)) & ~above(U, self.vetoed)
