"""A 2-D slice of an error region as a PNG, in the style of ApproxCaliper's figure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from qaopt.calibrate.errors import CalibrationError  # noqa: E402

if TYPE_CHECKING:
    from qaopt.calibrate.region import ErrorRegion


def plot_region(region: ErrorRegion, path: str | Path, x: str | None = None, y: str | None = None,
                fixed: Mapping[str, float] | None = None, resolution: int = 200) -> Path:
    """Colour P(valid) over axes ``x`` by ``y``, outline the certified region, mark the points.

    Other axes are held at ``fixed`` (default: their minimum, the slice with least
    error elsewhere). Points are drawn at their projection: green valid, red
    invalid, orange borderline (undecided after the most runs); stars are field
    evidence, and points the field overturned are ringed in blue.
    """
    names = region.space.names
    x = x or names[0]
    y = y or (names[1] if len(names) > 1 else None)
    for n in (x, y):
        if n is not None and n not in names:
            raise CalibrationError(f"plot: axis '{n}' is not one of {list(names)}")
    fixed = dict(fixed or {})
    base = {a.name: fixed.get(a.name, a.min) for a in region.space.axes}
    ix = names.index(x)
    g = np.linspace(0, 1, resolution)
    u0 = region.space.to_unit(base)
    if y is None:
        U = np.repeat(u0[None], resolution, 0)
        U[:, ix] = g
    else:
        iy = names.index(y)
        gx, gy = np.meshgrid(g, g)
        U = np.repeat(u0[None], gx.size, 0)
        U[:, ix], U[:, iy] = gx.ravel(), gy.ravel()
    prob = region.model.predict_proba(U)
    cert = region.contains_unit(U, "certified")
    ax_x = region.space.axes[ix]
    fig, ax = plt.subplots(figsize=(6, 5))
    if y is None:
        xs = ax_x.min + g * (ax_x.max - ax_x.min)
        ax.plot(xs, prob, color="k", label="P(valid)")
        ax.fill_between(xs, 0, 1, where=cert, color="tab:green", alpha=0.3, label="certified")
        ax.set_ylabel("P(valid)")
    else:
        ax_y = region.space.axes[iy]
        ext = (ax_x.min, ax_x.max, ax_y.min, ax_y.max)
        im = ax.imshow(prob.reshape(resolution, resolution), origin="lower", extent=ext, aspect="auto",
                       cmap="RdYlGn", vmin=0, vmax=1, alpha=0.75)
        fig.colorbar(im, ax=ax, label="P(valid)")
        ax.contour(np.linspace(*ext[:2], resolution), np.linspace(*ext[2:], resolution),
                   cert.reshape(resolution, resolution).astype(float), levels=[0.5], colors="k",
                   linewidths=1.5)
        ax.set_ylabel(y)
        for p in region.labelled():
            px, py = p.errors[x], p.errors[y]
            sim_only = p.sources == ("simulator",)
            ax.scatter(px, py, marker="o" if sim_only else "*", s=30 if sim_only else 120,
                       c="darkgreen" if p.valid else "orange" if p.borderline else "darkred",
                       edgecolors="k", linewidths=0.5, zorder=3)
            if p.overturned:
                ax.scatter(px, py, marker="o", s=160, facecolors="none", edgecolors="blue", zorder=3)
    ax.set_xlabel(x)
    others = ", ".join(f"{k}={v:g}" for k, v in base.items() if k not in (x, y))
    info = region.info
    ax.set_title(
        f"{info.get('strategy', '')} · {region.evaluations} evaluations, {region.trials} runs"
        + (f"\n({others})" if others else ""),
        fontsize=10,
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
