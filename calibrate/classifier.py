"""P(valid) over the error space: certain where monotonicity decides, learned in between.

A scikit-learn probabilistic classifier (a Gaussian-process classifier by
default; any estimator with ``fit``/``predict_proba`` will do) is trained on the
evaluated points plus pseudo-labelled points that monotonicity already decides,
so a dozen evaluations still teach it the shape of the staircase. Its
probability is then overridden by the certain labels: 1 wherever a valid point
dominates, 0 wherever an invalid point is dominated. The result is monotone
wherever the evidence is, and smooth between.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.stats import qmc
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessClassifier
from sklearn.gaussian_process.kernels import RBF, ConstantKernel

from qaopt.calibrate.dominance import Dominance


def default_estimator() -> GaussianProcessClassifier:
    kernel = ConstantKernel(4.0, (1e-2, 1e3)) * RBF(0.3, (0.03, 3.0))
    return GaussianProcessClassifier(kernel, random_state=0)


class MonotoneProbability:
    """``fit(X, y)`` on unit-cube points with boolean labels; ``predict_proba(X)`` -> P(valid).

    With only one outcome seen, nothing is learned beyond monotonicity: unresolved
    points get probability 0 (no evidence that they are valid).
    """

    def __init__(self, estimator=None, n_pseudo: int = 64, seed: int = 0):
        self.estimator = estimator
        self.n_pseudo = n_pseudo
        self.seed = seed

    def fit(self, X: np.ndarray, y: np.ndarray) -> MonotoneProbability:
        X = np.atleast_2d(np.asarray(X, dtype=float))
        y = np.asarray(y, dtype=bool)
        self.dim_ = X.shape[1]
        self.dominance_ = Dominance.from_labels(X, y)
        if self.n_pseudo:
            P = qmc.Sobol(self.dim_, scramble=True, seed=self.seed).random(self.n_pseudo)
            lab = self.dominance_.labels(P)
            X = np.vstack([X, P[lab != 0]])
            y = np.concatenate([y, lab[lab != 0] > 0])
        self.model_ = None
        if len(np.unique(y)) == 2:
            self.model_ = clone(self.estimator) if self.estimator is not None else default_estimator()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                self.model_.fit(X, y.astype(int))
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=float))
        lab = self.dominance_.labels(X)
        if self.model_ is None:
            p = np.zeros(len(X))
        else:
            p = self.model_.predict_proba(X)[:, list(self.model_.classes_).index(1)]
        return np.where(lab > 0, 1.0, np.where(lab < 0, 0.0, p))
