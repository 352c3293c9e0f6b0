"""A numpy/numba renderer of the car's front camera: road, markings, stop signs, the lead vehicle.

No OpenGL and no display. The road is flat, so the car-frame forward distance of
the ground a pixel sees depends only on its image row (the camera has no roll):
per row, the renderer finds where the lane's centre line is at that distance (the
centre line is laid out once per route in world coordinates), and each sample of
the row then knows its road coordinates (arc length, lateral offset), from which
asphalt, lane markings (solid edges, dashed centre), the stop line and the verge
get their colour and a texture that moves with the road. Above the horizon are
sky and a treeline. The stop sign (pole and red octagon with a white band) and the
lead vehicle's rear (body, rear window, wheels, red tail lights) are planar
polygons facing along the road, projected with the same pinhole model and drawn
far to near, so nearer ones hide farther ones. Each pixel averages
``camera.supersample``^2 samples: a sign 25 m ahead is 2-3 pixels wide at 160x120,
and its partial coverage is what tells a CNN how far it is.

Every episode has its own look (domain randomisation: light, asphalt and verge
colours, marking wear, the lead vehicle's paint, haze, white balance, sensor noise),
so a CNN must learn geometry, not a colour. Deterministic: a frame is a function of
(route, pose, look, frame number).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from .config import SimConfig
from ..frenet import centre_line
from ..hashrand import mix64, uniform, value_noise
from .world import Route

VIEW_RANGE_M = 120.0
"""The centre line is followed this far ahead; beyond, haze hides the road."""
BEHIND_M = 10.0
DS_M = 0.5
SIGN_LATERAL_M = 1.2
"""The stop sign's pole stands this far right of the road's right edge, at the line."""
SIGN_POLE_M = 2.0
SIGN_RADIUS_M = 0.375
LEAD_WIDTH_M = 1.8
LEAD_HEIGHT_M = 1.5


class Style(NamedTuple):
    """One episode's look (all float)."""

    brightness: float
    sky_r: float
    sky_g: float
    sky_b: float
    asphalt: float
    asphalt_contrast: float
    verge_r: float
    verge_g: float
    verge_b: float
    verge_contrast: float
    marking: float
    """Brightness of the paint (worn markings are darker)."""
    tree_r: float
    tree_g: float
    tree_b: float
    haze_m: float
    car_r: float
    car_g: float
    car_b: float
    noise_std: float
    tint_r: float
    tint_b: float
    key: float
    """Seed of the textures and the sensor noise (an integer below 2**52)."""


def draw_style(rng: np.random.Generator) -> Style:
    """A random look: overcast to sunny, fresh to worn asphalt, green to dry verges."""
    u = rng.uniform
    sky = np.array([0.55, 0.68, 0.85]) * u(0.75, 1.15) + u(-0.08, 0.08, 3)
    verge = np.array([0.30, 0.45, 0.18]) * u(0.6, 1.3) + np.array([u(-0.05, 0.2), u(-0.08, 0.05), u(-0.04, 0.06)])
    tree = np.array([0.12, 0.22, 0.10]) * u(0.6, 1.4)
    car = rng.choice(np.array([[0.08, 0.08, 0.09], [0.25, 0.26, 0.28], [0.15, 0.05, 0.05], [0.05, 0.08, 0.2], [0.55, 0.56, 0.58], [0.2, 0.22, 0.12]]))
    car = car * u(0.8, 1.2)
    return Style(
        brightness=u(0.65, 1.25),
        sky_r=sky[0], sky_g=sky[1], sky_b=sky[2],
        asphalt=u(0.22, 0.42), asphalt_contrast=u(0.05, 0.2),
        verge_r=verge[0], verge_g=verge[1], verge_b=verge[2], verge_contrast=u(0.1, 0.35),
        marking=u(0.6, 0.95),
        tree_r=tree[0], tree_g=tree[1], tree_b=tree[2],
        haze_m=u(80.0, 250.0),
        car_r=car[0], car_g=car[1], car_b=car[2],
        noise_std=u(0.0, 0.03),
        tint_r=u(0.92, 1.08), tint_b=u(0.92, 1.08),
        key=float(rng.integers(0, 2**52)),
    )


def episode_style(seed: int) -> Style:
    """The look of episode ``seed``, kept for the whole run (the sensor noise still changes per frame)."""
    return draw_style(np.random.default_rng([seed, 0x5717E]))


@dataclass(frozen=True)
class Scene:
    """A route laid out in world coordinates for drawing: its lane centre line and stop lines."""

    route: Route
    s_grid: np.ndarray
    centre: np.ndarray
    """(N, 3): x, y, tangent angle of the ego lane's centre line at ``s_grid``."""
    lane_width: float

    @classmethod
    def build(cls, route: Route, config: SimConfig) -> Scene:
        s = np.arange(-BEHIND_M, config.route_m + VIEW_RANGE_M + DS_M, DS_M)
        kappa = route.kappa(s)
        return cls(route, s, centre_line(s, kappa, DS_M), config.road.lane_width_m)

    def at(self, s: float, lateral: float = 0.0) -> tuple[float, float, float]:
        """World (x, y) of the point ``lateral`` m left of the lane centre at arc ``s``, and the road's direction there."""
        x = np.interp(s, self.s_grid, self.centre[:, 0])
        y = np.interp(s, self.s_grid, self.centre[:, 1])
        th = np.interp(s, self.s_grid, self.centre[:, 2])
        return float(x - lateral * math.sin(th)), float(y + lateral * math.cos(th)), float(th)


class Renderer:
    """Draws uint8 RGB frames (H, W, 3) of a :class:`Scene` from a car pose."""

    def __init__(self, config: SimConfig):
        self.config = config
        cam = config.camera
        self.camera = cam
        self.focal = cam.focal_px
        self.pitch = math.radians(cam.pitch_down_deg)
        self._stop_ahead = config.stack.detect_range_m + 40.0

    def render(self, scene: Scene, state: np.ndarray, style: Style, frame: int = 0, out: np.ndarray | None = None) -> np.ndarray:
        """Frame number ``frame`` (it seeds the sensor noise) seen from the car of a :mod:`.dynamics` state row."""
        from . import dynamics as dyn

        lead_s = state[dyn.LEAD_S] if state[dyn.LEAD_STATE] == 1.0 else math.nan
        return self.draw(scene, state[dyn.S], state[dyn.EY], state[dyn.EPSI], lead_s, style, frame, out)

    def draw(self, scene: Scene, s: float, ey: float, epsi: float, lead_s: float, style: Style, frame: int = 0,
             out: np.ndarray | None = None) -> np.ndarray:
        """The frame of a car at arc ``s`` (centre), lateral ``ey`` (m, left +), heading error ``epsi`` (rad);
        ``lead_s``: arc of the lead vehicle's rear, NaN for none."""
        cam = self.camera
        if out is None:
            out = np.empty((cam.height_px, cam.width_px, 3), dtype=np.uint8)
        x, y, th = scene.at(s, ey)
        yaw = th + epsi
        cx, cy = x + cam.forward_offset_m * math.cos(yaw), y + cam.forward_offset_m * math.sin(yaw)
        lo, hi = np.searchsorted(scene.s_grid, [s - 2.0, s + VIEW_RANGE_M])
        polys, nverts, colours = self._objects(scene, s, lead_s, style, cx, cy, yaw)
        stops = scene.route.stops
        _render(out, cam.supersample, self.focal, cam.mount_height_m, self.pitch, cx, cy, yaw,
                scene.s_grid[lo:hi], scene.centre[lo:hi], scene.lane_width, stops[np.isfinite(stops)],
                polys, nverts, colours, style, np.uint64(frame))
        return out

    def frame_chw(self, scene: Scene, state: np.ndarray, style: Style, frame: int = 0) -> np.ndarray:
        """The frame as the NNs read it: float32 (3, H, W) in [0, 1]."""
        img = self.render(scene, state, style, frame)
        return np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32) * np.float32(1 / 255)

    def _objects(self, scene: Scene, s: float, lead_s: float, style: Style, cx: float, cy: float, yaw: float):
        """The stop signs' and lead vehicle's polygons in image coordinates, far to near (painter's order)."""
        items: list[tuple[float, np.ndarray, tuple[float, float, float]]] = []
        c, sn = math.cos(yaw), math.sin(yaw)
        hw = scene.lane_width / 2

        def face(arc: float, points: list[tuple[float, float]], colour, bias: float = 0.0) -> None:
            """A planar polygon across the road at ``arc``: points are (lateral from lane centre, height)."""
            x0, y0, th = scene.at(arc)
            nx, ny = -math.sin(th), math.cos(th)
            uv = []
            depth = 0.0
            for lat, z in points:
                dx, dy = x0 + lat * nx - cx, y0 + lat * ny - cy
                fwd, left = dx * c + dy * sn, -dx * sn + dy * c
                p = _project(self.focal, self.camera.mount_height_m, self.pitch, self.camera.width_px, self.camera.height_px, fwd, left, z)
                if p is None:
                    return
                uv.append(p[:2])
                depth = max(depth, p[2])
            items.append((depth - bias, np.array(uv), colour))

        b = style.brightness
        for line in scene.route.stops[np.isfinite(scene.route.stops)]:
            if not (s - 5.0 < line < s + self._stop_ahead):
                continue
            arc, lat = line + 0.3, -hw - SIGN_LATERAL_M
            face(arc, [(lat - 0.04, 0.0), (lat + 0.04, 0.0), (lat + 0.04, SIGN_POLE_M), (lat - 0.04, SIGN_POLE_M)], (0.5 * b, 0.5 * b, 0.52 * b))
            zc = SIGN_POLE_M + SIGN_RADIUS_M * 0.8
            octagon = [(lat + SIGN_RADIUS_M * math.cos(math.pi / 8 + k * math.pi / 4), zc + SIGN_RADIUS_M * math.sin(math.pi / 8 + k * math.pi / 4)) for k in range(8)]
            face(arc, octagon, (0.78 * b, 0.08 * b, 0.08 * b), bias=0.01)
            face(arc, [(lat - 0.27, zc - 0.08), (lat + 0.27, zc - 0.08), (lat + 0.27, zc + 0.08), (lat - 0.27, zc + 0.08)], (0.92 * b, 0.92 * b, 0.92 * b), bias=0.02)
        if math.isfinite(lead_s):
            w = LEAD_WIDTH_M / 2
            body = (style.car_r * b, style.car_g * b, style.car_b * b)
            tyre = (0.04 * b, 0.04 * b, 0.04 * b)
            for side in (-1.0, 1.0):
                face(lead_s + 0.6, [(side * (w - 0.35), 0.0), (side * (w - 0.05), 0.0), (side * (w - 0.05), 0.45), (side * (w - 0.35), 0.45)], tyre)
            face(lead_s, [(-w, 0.3), (w, 0.3), (w, 1.05), (w - 0.15, LEAD_HEIGHT_M), (-w + 0.15, LEAD_HEIGHT_M), (-w, 1.05)], body)
            face(lead_s, [(-w + 0.25, 1.08), (w - 0.25, 1.08), (w - 0.35, LEAD_HEIGHT_M - 0.06), (-w + 0.35, LEAD_HEIGHT_M - 0.06)], (0.1 * b, 0.12 * b, 0.15 * b), bias=0.01)
            face(lead_s, [(-w + 0.5, 0.32), (w - 0.5, 0.32), (w - 0.5, 0.45), (-w + 0.5, 0.45)], (0.06 * b, 0.06 * b, 0.06 * b), bias=0.01)
            for side in (-1.0, 1.0):
                face(lead_s, [(side * (w - 0.05), 0.8), (side * (w - 0.32), 0.8), (side * (w - 0.32), 0.98), (side * (w - 0.05), 0.98)], (0.95 * b, 0.06 * b, 0.05 * b), bias=0.02)
        items.sort(key=lambda it: -it[0])
        n = len(items)
        polys = np.zeros((max(n, 1), 8, 2))
        nverts = np.zeros(max(n, 1), dtype=np.int64)
        colours = np.zeros((max(n, 1), 3))
        for i, (_, uv, col) in enumerate(items):
            polys[i, : len(uv)] = uv
            nverts[i] = len(uv)
            colours[i] = col
        return polys, nverts, colours


def _project(focal, h_cam, pitch, w, h, fwd, left, z):
    """Car-frame point (camera-relative forward, left; height above ground) -> (u, v, depth), None when behind."""
    up = z - h_cam
    zc = fwd * math.cos(pitch) - up * math.sin(pitch)
    yc = -fwd * math.sin(pitch) - up * math.cos(pitch)
    if zc <= 0.3:
        return None
    return w / 2 + focal * (-left) / zc, h / 2 + focal * yc / zc, zc


@njit(cache=True, inline="always")
def _inside(polys, i, n, px, py):
    """Whether (px, py) is inside convex polygon ``i`` (either winding)."""
    pos, neg = False, False
    for k in range(n):
        x0, y0 = polys[i, k, 0], polys[i, k, 1]
        x1, y1 = polys[i, (k + 1) % n, 0], polys[i, (k + 1) % n, 1]
        cr = (x1 - x0) * (py - y0) - (y1 - y0) * (px - x0)
        if cr > 0:
            pos = True
        elif cr < 0:
            neg = True
        if pos and neg:
            return False
    return True


@njit(cache=True)
def _road_rows(hs, ss, focal, h_cam, pitch, cx, cy, yaw, s_grid, centre):
    """Per sample row: forward ground distance, and the lane centre's arc, lateral and relative angle there."""
    rows = np.full((hs, 4), np.nan)
    c, sn = math.cos(yaw), math.sin(yaw)
    n = s_grid.shape[0]
    fwd = np.empty(n)
    left = np.empty(n)
    for i in range(n):
        dx, dy = centre[i, 0] - cx, centre[i, 1] - cy
        fwd[i] = dx * c + dy * sn
        left[i] = -dx * sn + dy * c
    f_ss = focal * ss
    j = 0
    for r in range(hs - 1, -1, -1):  # bottom rows are nearest: march the centre line outward
        b = (r + 0.5 - hs / 2) / f_ss
        d_fwd = math.cos(pitch) - b * math.sin(pitch)
        d_up = -math.sin(pitch) - b * math.cos(pitch)
        if d_up >= -1e-6:
            continue
        t = h_cam / -d_up
        gf = t * d_fwd
        rows[r, 0] = gf
        while j < n - 2 and fwd[j + 1] < gf:
            j += 1
        if fwd[j] <= gf <= fwd[j + 1]:
            a = (gf - fwd[j]) / max(fwd[j + 1] - fwd[j], 1e-9)
            rows[r, 1] = s_grid[j] + a * (s_grid[j + 1] - s_grid[j])
            rows[r, 2] = left[j] + a * (left[j + 1] - left[j])
            rows[r, 3] = math.atan2(left[j + 1] - left[j], fwd[j + 1] - fwd[j])
    return rows


@njit(cache=True, nogil=True)
def _render(out, ss, focal, h_cam, pitch, cx, cy, yaw, s_grid, centre, lane_width, stops, polys, nverts, colours, st, frame):
    h, w = out.shape[0], out.shape[1]
    hs = h * ss
    key = np.uint64(st.key)
    rows = _road_rows(hs, ss, focal, h_cam, pitch, cx, cy, yaw, s_grid, centre)
    hw = 0.5 * lane_width
    npoly = nverts.shape[0]
    noise_key = mix64(key ^ mix64(frame + np.uint64(77)))
    inv = 1.0 / (ss * ss)
    for v in range(h):
        for u in range(w):
            acc_r, acc_g, acc_b = 0.0, 0.0, 0.0
            for sv in range(ss):
                r = v * ss + sv
                py = v + (sv + 0.5) / ss
                for su in range(ss):
                    px = u + (su + 0.5) / ss
                    a = (px - w / 2) / focal
                    b = (py - h / 2) / focal
                    d_fwd = math.cos(pitch) - b * math.sin(pitch)
                    d_up = -math.sin(pitch) - b * math.cos(pitch)
                    if d_up < -1e-6 and math.isfinite(rows[r, 0]):
                        t = h_cam / -d_up
                        gl = -a * t
                        gf = rows[r, 0]
                        haze = math.exp(-gf / st.haze_m)
                        if math.isfinite(rows[r, 1]):
                            ca = math.cos(rows[r, 3])
                            e = (gl - rows[r, 2]) * ca
                            sa = rows[r, 1] + (gl - rows[r, 2]) * math.sin(rows[r, 3])
                        else:
                            e, sa = 1e3, 0.0
                        if -hw - 0.4 <= e <= 3 * hw + 0.4:
                            tex = 0.6 * value_noise(sa * 3.0, e * 3.0, key) + 0.4 * value_noise(sa * 13.0, e * 13.0, key + np.uint64(1))
                            g = st.asphalt * (1.0 + st.asphalt_contrast * (2.0 * tex - 1.0))
                            cr, cg, cb = g, g, g * 1.03
                            paint = False
                            if abs(e - (-hw + 0.12)) < 0.075 or abs(e - (3 * hw - 0.12)) < 0.075:
                                paint = True
                            elif abs(e - hw) < 0.06 and (sa % 9.0) < 3.0:
                                paint = True
                            else:
                                for k in range(stops.shape[0]):
                                    if stops[k] <= sa <= stops[k] + 0.5 and -hw <= e <= hw:
                                        paint = True
                            if paint:
                                m = st.marking * (0.9 + 0.1 * tex)
                                cr, cg, cb = m, m, m * 0.97
                        else:
                            tex = 0.55 * value_noise(sa * 0.7, e * 0.7, key + np.uint64(2)) + 0.45 * value_noise(sa * 6.0, e * 6.0, key + np.uint64(3))
                            k = 1.0 + st.verge_contrast * (2.0 * tex - 1.0)
                            cr, cg, cb = st.verge_r * k, st.verge_g * k, st.verge_b * k
                        cr = cr * st.brightness * haze + st.sky_r * (1 - haze)
                        cg = cg * st.brightness * haze + st.sky_g * (1 - haze)
                        cb = cb * st.brightness * haze + st.sky_b * (1 - haze)
                    else:
                        el = math.atan2(d_up, math.sqrt(d_fwd * d_fwd + a * a))
                        az = math.atan2(-a, d_fwd) + yaw
                        tree = 0.015 + 0.035 * value_noise(az * 12.0, 0.0, key + np.uint64(4)) + 0.01 * value_noise(az * 60.0, 0.0, key + np.uint64(5))
                        if el < tree:
                            k = 0.7 + 0.5 * value_noise(az * 80.0, el * 80.0, key + np.uint64(6))
                            cr, cg, cb = st.tree_r * k * st.brightness, st.tree_g * k * st.brightness, st.tree_b * k * st.brightness
                        else:
                            k = 1.0 - 0.6 * min(el, 0.5)
                            cr, cg, cb = st.sky_r * k, st.sky_g * k, st.sky_b * k
                    for i in range(npoly):
                        if nverts[i] > 0 and _inside(polys, i, nverts[i], px, py):
                            cr, cg, cb = colours[i, 0], colours[i, 1], colours[i, 2]
                    acc_r += cr
                    acc_g += cg
                    acc_b += cb
            idx = np.uint64(v * w + u)
            n0 = st.noise_std * (2.0 * uniform(noise_key, idx) - 1.0) * 1.7
            vals = (acc_r * inv * st.tint_r + n0, acc_g * inv + n0, acc_b * inv * st.tint_b + n0)
            for ch in range(3):
                x = vals[ch]
                out[v, u, ch] = np.uint8(min(max(x, 0.0), 1.0) * 255.0 + 0.5)
