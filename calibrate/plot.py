"""The error region as a PNG, every calibrated axis included, in the style of ApproxCaliper's figure.

One plotted axis gives the P(valid) curve; two give one panel; three or more give a
corner plot with one panel per pair of plotted axes. Each panel is a 2-D slice: every
axis it does not draw is held at a fixed level (default: the axis' minimum, the slice
with the least error elsewhere), and its title says which.

A panel draws only points whose verdict holds on its slice, because a projected point
lies: an invalid point with a large error on a third axis would land inside the
certified area. So a point is drawn when its other coordinates are within
:data:`SLICE_TOLERANCE` of the fixed levels, and faintly when it is valid with at
least the fixed levels' error on every other axis (monotonicity carries a valid
verdict down onto the slice). Every other point is left out of that panel.

:func:`layout` decides what each panel holds (pure, tested); :func:`plot_region` draws it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.image import AxesImage  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from qaopt.app_spec import store  # noqa: E402
from qaopt.calibrate.errors import CalibrationError  # noqa: E402
from qaopt.calibrate.space import ErrorSpace  # noqa: E402

if TYPE_CHECKING:
    from qaopt.calibrate.region import ErrorRegion, LabelledPoint

SLICE_TOLERANCE = 0.05
"""How far (a fraction of each axis' range) a point's other coordinates may be from a panel's fixed levels."""
FAINT = 0.3
"""Opacity of the valid points above a slice, drawn for the verdict they imply on it."""
MARKS = {  # label -> scatter style of the named error points (reference NNs, chosen configuration)
    "reference": dict(marker="X", s=140, c="white", edgecolors="k", linewidths=1.2, zorder=5),
    "chosen": dict(marker="D", s=80, c="magenta", edgecolors="k", linewidths=1.0, zorder=5),
}
MARK_TEXT = {"reference": "reference NNs", "chosen": "chosen configuration"}
VALID, INVALID, BORDERLINE = "valid", "invalid", "borderline (undecided)"
IMPLIED = "valid with more error on the held axes (so valid here)"
CERTIFIED, FIELD, OVERTURNED = "certified region (outline)", "field evidence", "overturned by the field"
LEGEND_ORDER = (CERTIFIED, VALID, INVALID, BORDERLINE, IMPLIED, FIELD, OVERTURNED)


@dataclass(frozen=True)
class PanelPoint:
    """An evaluated point drawn in a panel: on its slice, or (faint) a valid point above it."""

    point: LabelledPoint
    on_slice: bool


@dataclass(frozen=True)
class Panel:
    """One slice: ``x`` (and ``y``; ``None`` for the 1-axis curve) vary, every other axis is held fixed.

    ``levels`` holds each other axis' level and ``defaulted`` the ones left at the
    axis' minimum; ``row``/``col`` place the panel in the corner grid; ``marks``
    holds the named points (``reference``, ``chosen``) that have both coordinates.
    """

    x: str
    y: str | None
    levels: dict[str, float]
    defaulted: frozenset[str]
    row: int
    col: int
    points: tuple[PanelPoint, ...]
    marks: dict[str, tuple[float, float | None]]

    def title(self) -> str:
        """Which slice this is, e.g. ``at speed=0.3, heading.bias=0, heading.sigma=0 (their min)``."""
        given = [f"{n}={v:.3g}" for n, v in self.levels.items() if n not in self.defaulted]
        least = [f"{n}={v:.3g}" for n, v in self.levels.items() if n in self.defaulted]
        if least:
            given.append(", ".join(least) + (" (min)" if len(least) == 1 else " (their min)"))
        return "\n".join(textwrap.wrap("at " + ", ".join(given), 50)) if given else ""


def _ranges(space: ErrorSpace) -> str:
    return ", ".join(f"{a.name} in [{a.min:g}, {a.max:g}]" for a in space.axes)


def plotted_axes(space: ErrorSpace, axes: Sequence[str] | None) -> tuple[str, ...]:
    """The axes to draw, checked against the region: all of them (in the region's order) unless ``axes`` names some."""
    if axes is None:
        return space.names
    chosen = tuple(axes)
    if not chosen:
        raise CalibrationError(f"plot: no axes to plot; list at least one of this region's axes ({_ranges(space)}) "
                               "in --axes, or leave --axes out to plot them all")
    for name in chosen:
        if name not in space.names:
            raise CalibrationError(f"plot: axis '{name}' is not an axis of this region ({_ranges(space)}); "
                                   "name axes as in region.json, e.g. --axes " + ",".join(space.names[:2]))
        if chosen.count(name) > 1:
            raise CalibrationError(f"plot: axis '{name}' is listed twice in --axes; list it once")
    return chosen


def slice_levels(space: ErrorSpace, plotted: Sequence[str], fixed: Mapping[str, float] | None) -> dict[str, float]:
    """Every axis' level when it is not drawn: ``fixed`` for unplotted axes, else the axis' minimum.

    A level outside its axis' range, for an unknown axis, or for a plotted axis (its
    level would be ignored) is a :class:`CalibrationError` that names the axis and the fix.
    """
    fixed = dict(fixed or {})
    by_name = {a.name: a for a in space.axes}
    for name, value in fixed.items():
        axis = by_name.get(name)
        if axis is None:
            raise CalibrationError(f"plot: fixed level {name}={value:g} (--at) names no axis of this region "
                                   f"({_ranges(space)}); use one of those names")
        if name in plotted:
            raise CalibrationError(
                f"plot: axis '{name}' (range [{axis.min:g}, {axis.max:g}]) is plotted, so it cannot also be held at "
                f"{value:g}; drop it from --at, or leave it out of --axes to hold it fixed")
        if not axis.min <= value <= axis.max:
            raise CalibrationError(f"plot: fixed level {name}={value:g} (--at) is outside the axis' range "
                                   f"[{axis.min:g}, {axis.max:g}]; give a level within it")
    return {a.name: float(fixed.get(a.name, a.min)) for a in space.axes}


def _unit_levels(space: ErrorSpace, levels: Mapping[str, float]) -> np.ndarray:
    """Unit coordinates of ``levels``; an axis they leave out (a drawn one) sits at its minimum."""
    return space.to_unit({a.name: levels.get(a.name, a.min) for a in space.axes})


def _check_point(space: ErrorSpace, label: str, point: Mapping[str, float] | None) -> None:
    unknown = [n for n in point or {} if n not in space.names]
    if unknown:
        raise CalibrationError(f"plot: the {label} point names axis '{unknown[0]}', which this region lacks "
                               f"({_ranges(space)}); give the point in the region's axis names")


def slice_points(region: ErrorRegion, x: str, y: str | None, levels: Mapping[str, float]) -> tuple[PanelPoint, ...]:
    """The evaluated points the slice of ``x`` (by ``y``) at ``levels`` draws, each on the slice or faint.

    On the slice: every other coordinate within :data:`SLICE_TOLERANCE` of its level.
    Faint: valid with at least the levels' error on every other axis, so valid on the
    slice too. Invalid and borderline points off the slice are never drawn: projected,
    they would claim a failure where none was seen.
    """
    names = region.space.names
    others = [i for i, n in enumerate(names) if n not in (x, y)]
    level = _unit_levels(region.space, levels)[others]
    out = []
    for p in region.labelled():
        u = p.unit[others]
        if np.all(np.abs(u - level) <= SLICE_TOLERANCE + 1e-12):
            out.append(PanelPoint(p, True))
        elif p.valid and np.all(u >= level - 1e-12):
            out.append(PanelPoint(p, False))
    return tuple(out)


def _marks(x: str, y: str | None,
           named: Mapping[str, Mapping[str, float] | None]) -> dict[str, tuple[float, float | None]]:
    return {label: (float(point[x]), None if y is None else float(point[y]))
            for label, point in named.items() if point and x in point and (y is None or y in point)}


def layout(
    region: ErrorRegion,
    axes: Sequence[str] | None = None,
    fixed: Mapping[str, float] | None = None,
    reference: Mapping[str, float] | None = None,
    chosen: Mapping[str, float] | None = None,
) -> list[Panel]:
    """The panels :func:`plot_region` draws, with their points and marks (nothing drawn).

    One plotted axis: one curve panel; otherwise the lower triangle of a corner plot,
    the panel at (row ``i``, column ``j <= i``) drawing axis ``j`` against axis ``i + 1``.
    """
    space = region.space
    plotted = plotted_axes(space, axes)
    base = slice_levels(space, plotted, fixed)
    _check_point(space, "reference", reference)
    _check_point(space, "chosen", chosen)
    defaulted = frozenset(n for n in space.names if n not in (fixed or {}))
    named = {"reference": reference, "chosen": chosen}
    if len(plotted) == 1:
        pairs = [(0, 0, plotted[0], None)]
    else:
        pairs = [(i, j, plotted[j], plotted[i + 1]) for i in range(len(plotted) - 1) for j in range(i + 1)]
    panels = []
    for row, col, x, y in pairs:
        levels = {n: v for n, v in base.items() if n not in (x, y)}
        panels.append(Panel(x, y, levels, defaulted & levels.keys(), row, col, slice_points(region, x, y, levels),
                            _marks(x, y, named)))
    return panels


def plot_region(
    region: ErrorRegion,
    path: str | Path,
    axes: Sequence[str] | None = None,
    fixed: Mapping[str, float] | None = None,
    resolution: int = 64,
    reference: Mapping[str, float] | None = None,
    chosen: Mapping[str, float] | None = None,
) -> Path:
    """Write the region as a PNG at ``path``: P(valid) shaded, the certified region outlined, points marked.

    ``axes`` (default: all) are the axes drawn, pairwise; ``fixed`` holds axes not
    drawn at other levels than their minimum. Points: green valid, red invalid,
    orange borderline (undecided after the most runs), faint green valid above the
    slice; stars are field evidence, points the field overturned are ringed in blue.
    ``reference`` and ``chosen`` (axis name -> error) are marked where they have both
    coordinates. Returns ``path``.
    """
    if resolution < 2:
        raise CalibrationError(f"plot: resolution {resolution} is too coarse; give at least 2 grid points per axis")
    panels = layout(region, axes, fixed, reference, chosen)
    named = {label: point for label, point in (("reference", reference), ("chosen", chosen)) if point}
    if panels[0].y is None:
        fig = _curve(region, panels[0], resolution, named)
    else:
        fig = _grid(region, panels, resolution, named)
    fig.suptitle(f"{region.info.get('strategy', '')} · {region.evaluations} evaluations, {region.trials} runs",
                 fontsize=10)
    path = Path(path)
    with store.atomic_path(path) as tmp:  # a kill or a full disk never leaves half a picture
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def _unit_grid(region: ErrorRegion, panel: Panel, g: np.ndarray) -> np.ndarray:
    """Unit-cube rows covering the panel's slice: ``g`` along x (by ``g`` along y)."""
    names = region.space.names
    u0 = _unit_levels(region.space, panel.levels)
    ix = names.index(panel.x)
    if panel.y is None:
        U = np.repeat(u0[None], len(g), 0)
        U[:, ix] = g
        return U
    gx, gy = np.meshgrid(g, g)
    U = np.repeat(u0[None], gx.size, 0)
    U[:, ix], U[:, names.index(panel.y)] = gx.ravel(), gy.ravel()
    return U


def _mark_label(label: str, point: Mapping[str, float]) -> str:
    text = f"{MARK_TEXT[label]} ({', '.join(f'{n}={v:.3g}' for n, v in point.items())})"
    return "\n".join(textwrap.wrap(text, 60))


def _curve(region: ErrorRegion, panel: Panel, resolution: int, named: Mapping[str, Mapping[str, float]]) -> Figure:
    g = np.linspace(0, 1, resolution)
    U = _unit_grid(region, panel, g)
    axis = region.space.axes[region.space.names.index(panel.x)]
    xs = axis.min + g * (axis.max - axis.min)
    fig, ax = plt.subplots(figsize=(6, 4.5), layout="constrained")
    ax.plot(xs, region.model.predict_proba(U), color="k", label="P(valid)")
    ax.fill_between(xs, 0, 1, where=region.contains_unit(U, "certified"), color="tab:green", alpha=0.3,
                    label="certified")
    for label, (mx, _) in panel.marks.items():
        ax.axvline(mx, color=MARKS[label]["c"] if label == "chosen" else "k", linestyle="--",
                   label=_mark_label(label, named[label]))
    ax.set_xlabel(panel.x)
    ax.set_ylabel("P(valid)")
    ax.set_title(panel.title(), fontsize=8)
    ax.legend(fontsize=7, loc="best")
    return fig


def _grid(region: ErrorRegion, panels: list[Panel], resolution: int,
          named: Mapping[str, Mapping[str, float]]) -> Figure:
    cells = max(p.row for p in panels) + 1
    fig = plt.figure(figsize=(3.6 * cells + 1.4, 3.2 * cells + 1.0), layout="constrained")
    cell = fig.add_gridspec(cells, cells)
    shown: dict[str, Line2D] = {}
    axes = [fig.add_subplot(cell[p.row, p.col]) for p in panels]
    images = [_draw_panel(ax, region, p, resolution, shown) for ax, p in zip(axes, panels)]
    fig.colorbar(images[-1], ax=axes, label="P(valid)", shrink=0.8)
    handles = sorted(shown.values(), key=lambda h: LEGEND_ORDER.index(h.get_label())) + [
        Line2D([], [], linestyle="none", markersize=9, label=_mark_label(label, point),
               marker=MARKS[label]["marker"], markerfacecolor=MARKS[label]["c"], markeredgecolor="k")
        for label, point in named.items() if any(label in p.marks for p in panels)
    ]
    if cells > 1:  # the corner grid's empty top row, right of its first panel, holds the legend
        key = fig.add_subplot(cell[0, 1:])
        key.set_axis_off()
        key.legend(handles=handles, loc="upper left", fontsize=7, frameon=False)
    elif handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=7, frameon=False)
    return fig


def _draw_panel(ax: Axes, region: ErrorRegion, panel: Panel, resolution: int, shown: dict[str, Line2D]) -> AxesImage:
    """Shade P(valid), outline the certified region, draw the panel's points and marks; returns the image."""
    g = np.linspace(0, 1, resolution)
    U = _unit_grid(region, panel, g)
    names = region.space.names
    ax_x, ax_y = region.space.axes[names.index(panel.x)], region.space.axes[names.index(panel.y)]
    ext = (ax_x.min, ax_x.max, ax_y.min, ax_y.max)
    image = ax.imshow(region.model.predict_proba(U).reshape(resolution, resolution), origin="lower", extent=ext,
                      aspect="auto", cmap="RdYlGn", vmin=0, vmax=1, alpha=0.75, interpolation="bilinear")
    cert = region.contains_unit(U, "certified").reshape(resolution, resolution)
    if cert.any() and not cert.all():  # a uniform slice has no outline to draw
        ax.contour(np.linspace(*ext[:2], resolution), np.linspace(*ext[2:], resolution), cert.astype(float),
                   levels=[0.5], colors="k", linewidths=1.5)
        shown.setdefault(CERTIFIED, Line2D([], [], color="k", linewidth=1.5, label=CERTIFIED))
    for pp in panel.points:
        p = pp.point
        px, py = p.errors[panel.x], p.errors[panel.y]
        sim_only = p.simulator_only
        colour = "darkgreen" if p.valid else "orange" if p.borderline else "darkred"
        alpha = 1.0 if pp.on_slice else FAINT
        ax.scatter(px, py, marker="o" if sim_only else "*", s=30 if sim_only else 120, c=colour, alpha=alpha,
                   edgecolors="k", linewidths=0.5, zorder=3)
        kind = (VALID if p.valid else BORDERLINE if p.borderline else INVALID) if pp.on_slice else IMPLIED
        shown.setdefault(kind, Line2D([], [], linestyle="none", marker="o", markerfacecolor=colour,
                                      markeredgecolor="k", alpha=alpha, label=kind))
        if not sim_only:
            shown.setdefault(FIELD, Line2D([], [], linestyle="none", marker="*", markersize=10,
                                           markerfacecolor="grey", markeredgecolor="k", label=FIELD))
        if p.overturned:
            ax.scatter(px, py, marker="o", s=160, facecolors="none", edgecolors="blue", alpha=alpha, zorder=3)
            shown.setdefault(OVERTURNED, Line2D([], [], linestyle="none", marker="o", markersize=10,
                                                markerfacecolor="none", markeredgecolor="blue", label=OVERTURNED))
    for label, (mx, my) in panel.marks.items():
        ax.scatter(mx, my, **MARKS[label])
    ax.set_xlabel(panel.x)
    ax.set_ylabel(panel.y)
    ax.set_title(panel.title(), fontsize=8)
    return image
