"""CropFollow speed on one core: error-injection runs (single and batched) and rendering.

    python benchmarks/cropfollow_speed.py

Pins itself to one CPU core. Timings are medians after a warm-up (the first call
compiles the numba kernels, or loads them from the on-disk cache).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time

import numpy as np

from qaopt.simulators.cropfollow import CropFollowEvaluator
from qaopt.simulators.cropfollow.config import SimConfig
from qaopt.simulators.cropfollow.field import Field
from qaopt.simulators.cropfollow.render import Renderer, Scene, draw_style


def gaussian(sigma: float):
    def inject(truth, rng, t):
        return truth + rng.normal(0.0, sigma, truth.shape)

    return inject


def median_times(fn, repeat: int) -> tuple[float, float]:
    """Medians of wall time and of this process's CPU time (what an idle core would take)."""
    wall, cpu = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    evaluator = CropFollowEvaluator(run_length_m=100.0, controller="mpc")
    injectors = lambda: {"heading": gaussian(10.0), "distance": gaussian(0.1)}  # noqa: E731
    evaluator.evaluate(injectors(), [0])  # warm-up: compile or load the kernels
    rows = []
    seed = iter(range(10**6))
    wall, cpu = median_times(lambda: evaluator.evaluate(injectors(), [next(seed)]), 31)
    rows.append(("one 100 m run, Gaussian errors on both NNs", f"{wall * 1e3:.1f} ms", f"{cpu * 1e3:.1f} ms", "<= 20 ms"))
    wall, cpu = median_times(lambda: evaluator.evaluate({}, [next(seed)]), 31)
    rows.append(("one 100 m run, perfect perception", f"{wall * 1e3:.1f} ms", f"{cpu * 1e3:.1f} ms", ""))
    wall, cpu = median_times(lambda: evaluator.evaluate(injectors(), list(range(1000))), 3)
    rows.append(("1,000 runs of 100 m in one batched call", f"{wall:.2f} s", f"{cpu:.2f} s", "< 10 s"))

    config = SimConfig()
    renderer = Renderer(config.camera, config.field)
    scene = Scene.build(Field.from_seed(config.field, 0), 100.0)
    rng = np.random.default_rng(0)
    poses = [(float(s), float(lat), math.radians(float(hd)), draw_style(rng)) for s, lat, hd in zip(rng.uniform(0, 90, 200), rng.uniform(-0.15, 0.15, 200), rng.normal(0, 10, 200))]
    out = np.empty((240, 320, 3), dtype=np.uint8)
    renderer.render(scene, *poses[0][:3], poses[0][3], out=out)
    frames = iter(enumerate(poses))

    def render_next() -> None:
        i, (s, lat, hd, style) = next(frames)
        renderer.render(scene, s, lat, hd, style, frame=i, out=out)

    wall, cpu = median_times(render_next, len(poses))
    rows.append(("render one 320x240 frame (200 random poses and looks)", f"{wall * 1e3:.2f} ms ({1 / wall:.0f} frames/s)", f"{cpu * 1e3:.2f} ms ({1 / cpu:.0f} frames/s)", ">= 100 frames/s"))

    print(f"{platform.machine()}, pinned to 1 core; load average {os.getloadavg()[0]:.1f} at the end (other jobs share the cores)\n")
    print("| what | median wall time | median CPU time | goal |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {' | '.join(row)} |")


if __name__ == "__main__":
    main()
