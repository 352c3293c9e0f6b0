"""Three ways to break the application protocol (tests/test_tutorial.py; docs/tutorial.md, "Troubleshooting")."""

import numpy as np

from drone import Drone


class ReturnsADict(Drone):
    """Returns {seed: record} instead of a list with one record per seed."""

    def evaluate(self, injectors, seeds):
        return dict(zip(seeds, super().evaluate(injectors, seeds)))


class Unseeded(Drone):
    """Adds sensor noise from a generator that the seeds do not seed."""

    rng = np.random.default_rng()

    def evaluate(self, injectors, seeds):
        return [{**r, "max_deviation_m": r["max_deviation_m"] + self.rng.normal(0, 0.01)}
                for r in super().evaluate(injectors, seeds)]


class RenamedMetric(Drone):
    """Reports the QoS metric under another name than the spec's qos.metric."""

    def evaluate(self, injectors, seeds):
        return [{"max_dev": r["max_deviation_m"]} for r in super().evaluate(injectors, seeds)]
