"""A numpy/numba renderer of the front camera under the canopy.

No OpenGL and no display: the ground is ray-cast per pixel (its robot-frame
coordinates depend only on the camera mount, so they are computed once), then
every plant near enough is drawn far-to-near with a depth buffer: a stalk and
a few arching, tapering leaves, each a projected thick segment. The ground has
a two-octave soil texture in world coordinates (it moves with the robot, not
with the image), darker strips along the rows, and blotchy canopy shade; above
the horizon is a dark canopy with gaps of sky. Every frame has its own look
(domain randomisation: light, soil and leaf colours, shade, white balance,
sensor noise), so a CNN must learn the geometry of the rows, not a colour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from .config import CameraParams, FieldParams
from .field import Field, Plants
from ..frenet import centre_line
from ..hashrand import mix64, mixed_counters, uniform, uniform_of_mixed, value_noise_memo

VIEW_RANGE_M = 12.0
"""Plants farther ahead than this are not drawn (fog hides them)."""
LEAVES_PER_PLANT = 5
NEAR_M = 0.05


class Style(NamedTuple):
    """One frame's look (all float): light, colours, shade and noise."""

    brightness: float
    soil_r: float
    soil_g: float
    soil_b: float
    soil_contrast: float
    leaf_r: float
    leaf_g: float
    leaf_b: float
    leaf_variation: float
    stalk_r: float
    stalk_g: float
    stalk_b: float
    canopy_r: float
    canopy_g: float
    canopy_b: float
    sky_fraction: float
    shade: float
    row_darkening: float
    fog_m: float
    noise_std: float
    tint_r: float
    tint_b: float
    key: float
    """Seed of the frame's textures and sensor noise (an integer below 2**52)."""


def draw_style(rng: np.random.Generator) -> Style:
    """A random look; the ranges span dry and wet soil, young and ageing maize, sun and overcast."""
    u = rng.uniform
    soil = np.array([0.42, 0.32, 0.22]) * u(0.6, 1.35) + u(-0.05, 0.05, 3)
    leaf = np.array([0.18, 0.42, 0.10]) * u(0.7, 1.3) + np.array([u(-0.05, 0.15), u(-0.08, 0.08), u(-0.04, 0.06)])
    stalk = leaf * u(0.9, 1.3) + np.array([0.12, 0.1, 0.03]) * u(0, 1)
    canopy = leaf * u(0.35, 0.7)
    return Style(
        brightness=u(0.6, 1.3),
        soil_r=soil[0], soil_g=soil[1], soil_b=soil[2],
        soil_contrast=u(0.1, 0.35),
        leaf_r=leaf[0], leaf_g=leaf[1], leaf_b=leaf[2],
        leaf_variation=u(0.05, 0.25),
        stalk_r=stalk[0], stalk_g=stalk[1], stalk_b=stalk[2],
        canopy_r=canopy[0], canopy_g=canopy[1], canopy_b=canopy[2],
        sky_fraction=u(0.0, 0.35),
        shade=u(0.0, 0.5),
        row_darkening=u(0.1, 0.5),
        fog_m=u(6.0, 20.0),
        noise_std=u(0.0, 0.03),
        tint_r=u(0.92, 1.08),
        tint_b=u(0.92, 1.08),
        key=float(rng.integers(0, 2**52)),
    )


def episode_style(seed: int) -> Style:
    """The look of episode ``seed``, kept for the whole run (the sensor noise still changes per frame)."""
    return draw_style(np.random.default_rng([seed, 0x5717E]))


class Pose(NamedTuple):
    """The camera's world pose: position (m), yaw (rad), and the local row geometry."""

    x: float
    y: float
    yaw: float
    lateral: float
    """Lateral offset of the camera from the corridor's centre line (m, left positive)."""
    heading: float
    """Heading error relative to the row (rad)."""
    curvature: float


@dataclass(frozen=True)
class Scene:
    """A field laid out in world coordinates for drawing: its centre line and its plants."""

    field: Field
    s_grid: np.ndarray
    centre: np.ndarray
    """(N, 3): x, y, tangent angle of the corridor's centre line at ``s_grid``."""
    plants_xy: np.ndarray
    """(P, 2) world positions, sorted by arc length."""
    plants: Plants
    leaf_yaw: np.ndarray
    """(P,) tangent angle of the row at each plant (leaves orient relative to it)."""

    @classmethod
    def build(cls, field: Field, length_m: float, ds: float = 0.05) -> Scene:
        behind = 2.0
        s = np.arange(-behind - 1.0, length_m + VIEW_RANGE_M + 1.0, ds)
        kappa = field.curvature(s)
        centre = centre_line(s, kappa, ds)
        plants = field.plants(length_m + VIEW_RANGE_M, behind_m=behind)
        order = np.argsort(plants.s, kind="stable")
        plants = Plants(*(getattr(plants, f)[order] for f in Plants.__dataclass_fields__))
        th = np.interp(plants.s, s, centre[:, 2])
        px = np.interp(plants.s, s, centre[:, 0]) - plants.lateral * np.sin(th)
        py = np.interp(plants.s, s, centre[:, 1]) + plants.lateral * np.cos(th)
        return cls(field, s, centre, np.stack([px, py], axis=1), plants, th)

    def pose(self, s: float, lateral: float, heading: float, forward_offset: float) -> Pose:
        """Camera pose for the robot at arc ``s`` with errors (lateral m, heading rad)."""
        x = np.interp(s, self.s_grid, self.centre[:, 0])
        y = np.interp(s, self.s_grid, self.centre[:, 1])
        th = np.interp(s, self.s_grid, self.centre[:, 2])
        yaw = th + heading
        cx = x - lateral * math.sin(th) + forward_offset * math.cos(yaw)
        cy = y + lateral * math.cos(th) + forward_offset * math.sin(yaw)
        cam_lateral = lateral + forward_offset * math.sin(heading)
        return Pose(float(cx), float(cy), float(yaw), float(cam_lateral), float(heading), float(self.field.curvature(s)))


class Renderer:
    """Draws 320x240 (by default) uint8 RGB frames of a :class:`Scene` from a pose."""

    def __init__(self, camera: CameraParams, field: FieldParams):
        self.camera = camera
        self.field_params = field
        h, w, f = camera.height_px, camera.width_px, camera.focal_px
        v, u = np.mgrid[0:h, 0:w].astype(np.float64)
        a, b = (u + 0.5 - w / 2) / f, (v + 0.5 - h / 2) / f
        phi = math.radians(camera.pitch_down_deg)
        d_fwd = math.cos(phi) - b * math.sin(phi)
        d_left = -a
        d_up = -math.sin(phi) - b * math.cos(phi)
        hit = d_up < -1e-6
        t = np.where(hit, camera.mount_height_m / np.where(hit, -d_up, 1.0), np.inf)
        # Robot-frame ground point of each pixel (camera-relative), its depth, and its ray direction.
        self._ground = np.stack([np.where(hit, t * d_fwd, 0.0), np.where(hit, t * d_left, 0.0), np.where(hit, t, np.inf)], axis=-1)
        self._ray = np.stack([np.arctan2(d_left, d_fwd), np.arctan2(d_up, np.hypot(d_fwd, d_left))], axis=-1)
        self._noise_counters = mixed_counters(h * w * 3)  # the sensor noise's counters, one per pixel and channel

    def render(
        self, scene: Scene, s: float, lateral: float, heading: float, style: Style, frame: int = 0, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Frame number ``frame`` (it seeds the sensor noise) seen by the robot at arc ``s`` with lateral (m) and heading (rad) errors."""
        cam = self.camera
        if out is None:
            out = np.empty((cam.height_px, cam.width_px, 3), dtype=np.uint8)
        pose = scene.pose(s, lateral, heading, cam.forward_offset_m)
        lo, hi = np.searchsorted(scene.plants.s, [s - 1.5, s + VIEW_RANGE_M])
        p = scene.plants
        _render(
            out, self._ground, self._ray, pose, style, self.field_params.row_spacing_m,
            cam.focal_px, cam.mount_height_m, math.radians(cam.pitch_down_deg),
            scene.plants_xy[lo:hi], p.height[lo:hi], p.spread[lo:hi], p.seed[lo:hi], scene.leaf_yaw[lo:hi],
            self.field_params.stalk_radius_m, frame, self._noise_counters,
        )
        return out


@njit(cache=True)
def _project(pose, focal, h_cam, pitch, w, h, x, y, z):
    """World point -> (u, v, depth); depth <= 0 when behind the camera."""
    dx, dy = x - pose.x, y - pose.y
    c, s = math.cos(pose.yaw), math.sin(pose.yaw)
    fwd = dx * c + dy * s
    left = -dx * s + dy * c
    up = z - h_cam
    zc = fwd * math.cos(pitch) - up * math.sin(pitch)
    yc = -fwd * math.sin(pitch) - up * math.cos(pitch)
    if zc <= NEAR_M:
        return 0.0, 0.0, zc
    return w / 2 + focal * (-left) / zc, h / 2 + focal * yc / zc, zc


@njit(cache=True)
def _segment(img, zbuf, u0, v0, z0, r0, u1, v1, z1, r1, cr, cg, cb, shade0, shade1):
    """Draw a tapered thick segment (radii r0 -> r1 px) with depth test and shading along it."""
    h, w = zbuf.shape
    umin = int(max(0.0, math.floor(min(u0 - r0, u1 - r1))))
    umax = int(min(w - 1.0, math.ceil(max(u0 + r0, u1 + r1))))
    vmin = int(max(0.0, math.floor(min(v0 - r0, v1 - r1))))
    vmax = int(min(h - 1.0, math.ceil(max(v0 + r0, v1 + r1))))
    du, dv = u1 - u0, v1 - v0
    L2 = du * du + dv * dv
    for v in range(vmin, vmax + 1):
        pv = v + 0.5 - v0
        for u in range(umin, umax + 1):
            pu = u + 0.5 - u0
            t = 0.0 if L2 < 1e-12 else min(1.0, max(0.0, (pu * du + pv * dv) / L2))
            eu, ev = pu - t * du, pv - t * dv
            r = r0 + t * (r1 - r0)
            if eu * eu + ev * ev > r * r:
                continue
            z = z0 + t * (z1 - z0)
            if z >= zbuf[v, u]:
                continue
            zbuf[v, u] = z
            k = shade0 + t * (shade1 - shade0)
            img[v, u, 0] = cr * k
            img[v, u, 1] = cg * k
            img[v, u, 2] = cb * k


@njit(cache=True)
def _line3d(img, zbuf, pose, focal, h_cam, pitch, x0, y0, z0, x1, y1, z1, rad0, rad1, cr, cg, cb, sh0, sh1):
    """Draw a world-space segment with world radii (m), clipped at the near plane."""
    h, w = zbuf.shape
    u0, v0, d0 = _project(pose, focal, h_cam, pitch, w, h, x0, y0, z0)
    u1, v1, d1 = _project(pose, focal, h_cam, pitch, w, h, x1, y1, z1)
    if d0 <= NEAR_M and d1 <= NEAR_M:
        return
    if d0 <= NEAR_M or d1 <= NEAR_M:
        # Move the hidden end toward the visible one until it is in front of the near plane.
        a = (2 * NEAR_M - d0) / (d1 - d0) if d0 <= NEAR_M else (2 * NEAR_M - d1) / (d0 - d1)
        if d0 <= NEAR_M:
            x0, y0, z0 = x0 + a * (x1 - x0), y0 + a * (y1 - y0), z0 + a * (z1 - z0)
            sh0 = sh0 + a * (sh1 - sh0)
            rad0 = rad0 + a * (rad1 - rad0)
            u0, v0, d0 = _project(pose, focal, h_cam, pitch, w, h, x0, y0, z0)
        else:
            x1, y1, z1 = x1 + a * (x0 - x1), y1 + a * (y0 - y1), z1 + a * (z0 - z1)
            sh1 = sh1 + a * (sh0 - sh1)
            rad1 = rad1 + a * (rad0 - rad1)
            u1, v1, d1 = _project(pose, focal, h_cam, pitch, w, h, x1, y1, z1)
    r0 = max(0.6, focal * rad0 / d0)
    r1 = max(0.6, focal * rad1 / d1)
    if max(u0, u1) + max(r0, r1) < 0 or min(u0, u1) - max(r0, r1) > w or max(v0, v1) + max(r0, r1) < 0 or min(v0, v1) - max(r0, r1) > h:
        return
    _segment(img, zbuf, u0, v0, d0, r0, u1, v1, d1, r1, cr, cg, cb, sh0, sh1)


@njit(cache=True, nogil=True)
def _render(out, ground, ray, pose, st, spacing, focal, h_cam, pitch, pxy, height, spread, pseed, pyaw, stalk_r, frame,
            noise_counters):
    h, w = out.shape[0], out.shape[1]
    memo = np.full((4, 6), np.nan)  # one per noise layer: neighbouring pixels share cells (value_noise_memo)
    key = np.uint64(st.key)
    img = np.empty((h, w, 3))
    zbuf = np.empty((h, w))
    c, s = math.cos(pose.yaw), math.sin(pose.yaw)
    for v in range(h):
        for u in range(w):
            gf, gl, depth = ground[v, u, 0], ground[v, u, 1], ground[v, u, 2]
            if math.isfinite(depth):
                wx = pose.x + gf * c - gl * s
                wy = pose.y + gf * s + gl * c
                tex = (0.65 * value_noise_memo(wx * 7.0, wy * 7.0, key, memo[0])
                       + 0.35 * value_noise_memo(wx * 31.0, wy * 31.0, key + 1, memo[1]))
                # Lateral position of this ground point relative to the corridor centre line.
                lat = pose.lateral + gf * math.sin(pose.heading) + gl * math.cos(pose.heading)
                lat -= 0.5 * pose.curvature * (gf * math.cos(pose.heading)) ** 2
                to_row = (0.5 - abs(((lat / spacing + 0.5) % 1.0) - 0.5)) * spacing
                dark = 1.0 - st.row_darkening * math.exp(-((to_row / 0.12) ** 2))
                sh = 1.0 - st.shade * value_noise_memo(wx * 1.3 + 100.0, wy * 1.3, key + 2, memo[2])
                k = (1.0 + st.soil_contrast * (2.0 * tex - 1.0)) * dark * sh
                fog = math.exp(-gf / st.fog_m)
                cr = st.soil_r * k * fog + st.canopy_r * (1 - fog)
                cg = st.soil_g * k * fog + st.canopy_g * (1 - fog)
                cb = st.soil_b * k * fog + st.canopy_b * (1 - fog)
                zbuf[v, u] = depth
            else:
                az, el = ray[v, u, 0] + pose.yaw, ray[v, u, 1]
                leafy = value_noise_memo(az * 25.0, el * 25.0, key + 3, memo[3])
                sky = 1.0 if leafy < st.sky_fraction * (0.5 + 2.0 * el) else 0.0
                k = 0.7 + 0.6 * leafy
                cr = st.canopy_r * k * (1 - sky) + 0.85 * sky
                cg = st.canopy_g * k * (1 - sky) + 0.9 * sky
                cb = st.canopy_b * k * (1 - sky) + 0.95 * sky
                zbuf[v, u] = 1e9
            img[v, u, 0], img[v, u, 1], img[v, u, 2] = cr, cg, cb
    # Plants, in any order: the depth buffer resolves occlusion.
    for i in range(pxy.shape[0]):
        x, y = pxy[i, 0], pxy[i, 1]
        dx, dy = x - pose.x, y - pose.y
        fwd = dx * c + dy * s
        if fwd < -0.6 or fwd > VIEW_RANGE_M:
            continue
        pk = np.uint64(pseed[i])
        var = st.leaf_variation * (2.0 * uniform(pk, np.uint64(0)) - 1.0)
        fog = math.exp(-max(fwd, 0.0) / st.fog_m)
        lr = (st.leaf_r * (1 + var)) * fog + st.canopy_r * (1 - fog)
        lg = (st.leaf_g * (1 + 0.5 * var)) * fog + st.canopy_g * (1 - fog)
        lb = st.leaf_b * fog + st.canopy_b * (1 - fog)
        sr = st.stalk_r * fog + st.canopy_r * (1 - fog)
        sg = st.stalk_g * fog + st.canopy_g * (1 - fog)
        sb = st.stalk_b * fog + st.canopy_b * (1 - fog)
        H = height[i]
        _line3d(img, zbuf, pose, focal, h_cam, pitch, x, y, 0.0, x, y, H, stalk_r * 1.3, stalk_r * 0.8, sr, sg, sb, 0.55, 1.0)
        for j in range(LEAVES_PER_PLANT):
            q = np.uint64(8 * j + 1)
            za = H * (0.15 + 0.75 * uniform(pk, q))
            side = 1.0 if uniform(pk, q + np.uint64(1)) < 0.5 else -1.0
            ang = pyaw[i] + side * (0.5 * math.pi + 0.9 * (uniform(pk, q + np.uint64(2)) - 0.5))
            L = spread[i] * (0.7 + 0.6 * uniform(pk, q + np.uint64(3)))
            wid = 0.025 + 0.02 * uniform(pk, q + np.uint64(4))
            ca, sa = math.cos(ang), math.sin(ang)
            mx, my, mz = x + 0.5 * L * ca, y + 0.5 * L * sa, za + 0.18 * L
            tx, ty, tz = x + L * ca, y + L * sa, za - 0.2 * L
            lit = 0.75 + 0.35 * za / H
            _line3d(img, zbuf, pose, focal, h_cam, pitch, x, y, za, mx, my, mz, wid * 0.6, wid, lr, lg, lb, lit * 0.8, lit)
            _line3d(img, zbuf, pose, focal, h_cam, pitch, mx, my, mz, tx, ty, tz, wid, wid * 0.2, lr, lg, lb, lit, lit * 0.85)
    # Exposure, white balance, sensor noise, quantisation.
    n = 0
    noise_key = key ^ mix64(np.uint64(frame) + np.uint64(0x7E57))
    for v in range(h):
        for u in range(w):
            for ch in range(3):
                val = img[v, u, ch] * st.brightness
                if ch == 0:
                    val *= st.tint_r
                elif ch == 2:
                    val *= st.tint_b
                if st.noise_std > 0:
                    val += st.noise_std * (2.0 * uniform_of_mixed(noise_key, noise_counters[n]) - 1.0) * 1.7
                n += 1
                out[v, u, ch] = np.uint8(min(255.0, max(0.0, val * 255.0 + 0.5)))
