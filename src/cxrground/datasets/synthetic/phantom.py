"""Procedural frontal (PA/AP) chest radiograph phantom with exact lung and heart masks.

The phantom is built as a *density* field (arbitrary units, about 0 for air outside the body, 0.3 in
aerated lung, 0.9 for the mediastinum, more for bone) that is blurred and mapped to grey values by a
saturating film curve: denser is brighter, as on a radiograph. Lesion painters (:mod:`.lesions`) add
density to the same field before rendering.

Orientation: the patient's right lung is on the IMAGE LEFT, the heart is offset to the image right.
Every length is a fraction of the image width ``W``; vertical positions are anchored at the lung apex,
so taller images show more abdomen below the diaphragm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from cxrground.anatomy.ctr import cardiothoracic_ratio
from cxrground.datasets.synthetic.fields import (
    blur,
    curve_band,
    ellipse_radius,
    grid,
    largest_component,
    smooth_noise,
    soft_step,
    splat_polyline,
)

#: Image direction of each patient side: the right lung is drawn at smaller x (image left).
SIDE_SIGN: dict[str, float] = {"right": -1.0, "left": 1.0}


@dataclass
class SideGeometry:
    """Analytic outline of one hemithorax (distances ``d`` are measured from the midline outwards)."""

    side: str
    lateral: float  # widest lateral distance D
    y_apex: float
    y_dome: float
    y_cp: float  # costophrenic angle row
    dome_d: float  # lateral distance of the dome peak
    med_drop: float
    medial_base: float
    knob: float  # aortic knob bulge (left) / SVC bulge (right)
    y_knob: float
    apex_d: float  # lateral distance of the apex (highest lung point)

    def lateral_edge(self, yy: np.ndarray) -> np.ndarray:
        """Lateral border: a rounded cap from the apex down to the widest level, then vertical."""
        c0 = self.apex_d
        y_w = self.y_apex + 0.78 * (self.y_cp - self.y_apex)
        u = np.clip((y_w - yy) / max(y_w - self.y_apex, 1.0), 0.0, 1.0)
        return (c0 + (self.lateral - c0) * (1.0 - u**1.8) ** 0.55).astype(np.float32)

    def medial_edge(self, yy: np.ndarray, width: float) -> np.ndarray:
        """Medial border: the apical cap, then the mediastinum with the aortic knob / SVC bulge."""
        bump = self.knob * np.exp(-(((yy - self.y_knob) / (0.045 * width)) ** 2))
        c0 = self.apex_d
        y_m = self.y_apex + 0.09 * width
        u = np.clip((y_m - yy) / max(y_m - self.y_apex, 1.0), 0.0, 1.0)
        cap = c0 - (c0 - self.medial_base) * np.sqrt(np.clip(1.0 - u**2, 0.0, 1.0))
        return np.maximum(self.medial_base + bump, cap).astype(np.float32)

    def diaphragm(self, d: np.ndarray) -> np.ndarray:
        """Row of the diaphragm at lateral distance ``d`` (dome peak at ``dome_d``, steep laterally)."""
        d = np.asarray(d, dtype=np.float32)
        lat = np.clip((d - self.dome_d) / max(self.lateral - self.dome_d, 1.0), 0.0, None)
        med = np.clip((self.dome_d - d) / max(self.dome_d, 1.0), 0.0, 1.0)
        drop = self.y_cp - self.y_dome
        return (self.y_dome + np.where(d >= self.dome_d, drop * lat**2.0, self.med_drop * med**1.6)).astype(
            np.float32
        )


@dataclass
class Anatomy:
    """A rendered-ready phantom: exact masks, the lesion-free density and geometry for lesion placement."""

    height: int
    width: int
    view: str
    mid_x: float
    right_lung: np.ndarray
    left_lung: np.ndarray
    heart: np.ndarray
    body: np.ndarray
    density: np.ndarray
    sides: dict[str, SideGeometry]
    hila: dict[str, tuple[float, float]]
    floor: np.ndarray  # per column: row of the diaphragm / heart floor
    ctr: float
    heart_box: tuple[int, int, int, int]  # y0, x0, y1, x1 of the heart mask
    sternotomy: bool = False
    params: dict[str, float] = field(default_factory=dict)

    @property
    def lungs(self) -> np.ndarray:
        return self.right_lung | self.left_lung

    def lung(self, side: str) -> np.ndarray:
        return self.right_lung if side == "right" else self.left_lung


def _side_geometry(rng: np.random.Generator, side: str, w: float, y_apex: float, lung_h: float,
                   lateral: float, dome_offset: float, cp_drop: float) -> SideGeometry:
    y_dome = y_apex + lung_h + dome_offset
    knob = w * (rng.uniform(0.022, 0.04) if side == "left" else rng.uniform(0.004, 0.012))
    y_knob = y_apex + lung_h * (rng.uniform(0.24, 0.30) if side == "left" else rng.uniform(0.2, 0.35))
    return SideGeometry(
        side=side,
        lateral=lateral,
        y_apex=y_apex + (0.0 if side == "right" else w * rng.uniform(-0.006, 0.01)),
        y_dome=y_dome,
        y_cp=y_dome + cp_drop,
        dome_d=lateral * rng.uniform(0.5, 0.6),
        med_drop=cp_drop * rng.uniform(0.55, 0.8),
        medial_base=w * rng.uniform(0.034, 0.046),
        knob=knob,
        y_knob=y_knob,
        apex_d=lateral * rng.uniform(0.3, 0.38),
    )


def _cavity(geo: SideGeometry, yy: np.ndarray, xx: np.ndarray, mid: float, w: float) -> np.ndarray:
    d = SIDE_SIGN[geo.side] * (xx - mid)
    return (
        (d >= geo.medial_edge(yy, w))
        & (d <= geo.lateral_edge(yy))
        & (yy >= geo.y_apex)
        & (yy <= geo.diaphragm(d))
    )


def _floor(sides: dict[str, SideGeometry], xx: np.ndarray, mid: float, w: float) -> np.ndarray:
    """Per-column diaphragm row, blended across the midline."""
    x = xx[0]
    right = sides["right"].diaphragm(mid - x)
    left = sides["left"].diaphragm(x - mid)
    t = soft_step(x - mid, 0.03 * w)
    return ((1.0 - t) * right + t * left).astype(np.float32)


def _heart_mask(yy, xx, mid, floor, hw, shape_p, y_ht, y_hb) -> np.ndarray:
    r_frac, a_frac = shape_p
    x_min = mid - r_frac * hw
    a_r = a_frac * hw
    cx = x_min + a_r
    a_l = hw - a_r
    cy = y_ht + 0.66 * (y_hb - y_ht)
    b_t = cy - y_ht
    b_b = 1.3 * (y_hb - cy)
    ey = (yy - cy) / np.where(yy < cy, b_t, b_b)
    narrow = 1.0 - 0.2 * np.clip(-ey, 0.0, 1.0) ** 1.5  # the heart tapers towards the great vessels
    ex = (xx - cx) / (np.where(xx < cx, a_r, a_l) * narrow)
    return ((ex * ex + ey * ey) <= 1.0) & (yy <= floor[None, :])


def build_anatomy(
    rng: np.random.Generator,
    height: int,
    width: int,
    view: str,
    ctr_band: tuple[float, float],
    sternotomy: bool = False,
) -> Anatomy:
    """Draw a phantom whose measured CTR lies in ``ctr_band`` (inclusive)."""
    h, w = int(height), int(width)
    wf = float(w)
    yy, xx = grid(h, w)
    ap = view == "AP"
    mid = wf * (0.5 + rng.normal(0.0, 0.007))
    lung_h = wf * rng.uniform(0.52, 0.58) * (0.94 if ap else 1.0)
    y_apex = h * rng.uniform(0.065, 0.1) + (0.02 * wf if ap else 0.0)
    lat_r = wf * rng.uniform(0.355, 0.4)
    lat_l = lat_r * rng.uniform(0.97, 1.03)
    cp_drop = wf * rng.uniform(0.085, 0.115)
    sides = {
        "right": _side_geometry(rng, "right", wf, y_apex, lung_h, lat_r, 0.0, cp_drop),
        "left": _side_geometry(rng, "left", wf, y_apex, lung_h, lat_l, wf * rng.uniform(0.012, 0.03),
                               cp_drop * rng.uniform(0.9, 1.1)),
    }
    cav = {s: _cavity(g, yy, xx, mid, wf) for s, g in sides.items()}
    cols = np.flatnonzero((cav["right"] | cav["left"]).any(axis=0))
    thoracic = float(cols[-1] - cols[0] + 1)
    floor = _floor(sides, xx, mid, wf)

    # heart: iterate the width until the measured CTR falls in the requested band
    lo, hi = ctr_band
    target = rng.uniform(lo + 0.25 * (hi - lo), hi - 0.25 * (hi - lo))
    big = max(0.0, target - 0.45)
    shape_p = (rng.uniform(0.27, 0.35), rng.uniform(0.40, 0.47) - 0.4 * big)
    y_ht = y_apex + lung_h * (rng.uniform(0.34, 0.40) - 0.15 * big)
    x_c = mid + 0.1 * target * thoracic
    y_hb = float(sides["left"].diaphragm(np.float32(x_c - mid)))
    hw = target * thoracic
    heart = np.zeros((h, w), dtype=bool)
    ctr = 0.0
    for _ in range(6):
        heart = _heart_mask(yy, xx, mid, floor, hw, shape_p, y_ht, y_hb)
        hcols = np.flatnonzero(heart.any(axis=0))
        ctr = (hcols[-1] - hcols[0] + 1) / thoracic if hcols.size else 0.0
        if lo <= ctr <= hi:
            break
        hw *= target / max(ctr, 1e-3)
    right = largest_component(cav["right"] & ~heart)
    left = largest_component(cav["left"] & ~heart)
    ctr = cardiothoracic_ratio(heart, right, left)
    if not lo <= ctr <= hi:  # pragma: no cover - geometry guard
        raise RuntimeError(f"phantom CTR {ctr:.3f} outside {ctr_band}")
    rows, hcols = np.flatnonzero(heart.any(axis=1)), np.flatnonzero(heart.any(axis=0))
    heart_box = (int(rows[0]), int(hcols[0]), int(rows[-1]), int(hcols[-1]))

    hila = {}
    for s, g in sides.items():
        hy = g.y_apex + rng.uniform(0.38, 0.44) * (g.y_dome - g.y_apex) - (0.01 * wf if s == "left" else 0.0)
        hx = mid + SIDE_SIGN[s] * wf * rng.uniform(0.085, 0.11)
        hila[s] = (float(hy), float(hx))

    anatomy = Anatomy(
        height=h, width=w, view=view, mid_x=float(mid), right_lung=right, left_lung=left, heart=heart,
        body=np.zeros((h, w), dtype=bool), density=np.zeros((h, w), dtype=np.float32), sides=sides,
        hila=hila, floor=floor, ctr=float(ctr), heart_box=heart_box, sternotomy=sternotomy,
        params={"thoracic_width": thoracic, "lung_height": float(lung_h), "y_apex": float(y_apex)},
    )
    _paint_density(rng, anatomy, yy, xx)
    return anatomy


# --- density -------------------------------------------------------------------------------------

def _body_half_width(rng, anatomy: Anatomy, yy: np.ndarray) -> np.ndarray:
    w = float(anatomy.width)
    g_r, g_l = anatomy.sides["right"], anatomy.sides["left"]
    wall = max(g_r.lateral, g_l.lateral) + w * rng.uniform(0.055, 0.08)
    y_apex = min(g_r.y_apex, g_l.y_apex)
    neck = w * rng.uniform(0.11, 0.14)
    y_neck = y_apex - 0.05 * w
    y_sh = y_apex + 0.05 * w
    shoulders = w * 0.62
    y_arm = y_apex + rng.uniform(0.30, 0.45) * (g_r.y_dome - y_apex)
    y_wall = y_arm + 0.2 * w
    t1 = np.clip((yy - y_neck) / max(y_sh - y_neck, 1.0), 0, 1)
    up = neck + (shoulders - neck) * (0.5 - 0.5 * np.cos(np.pi * t1))
    t2 = np.clip((yy - y_arm) / max(y_wall - y_arm, 1.0), 0, 1)
    return (up + (wall - shoulders) * (0.5 - 0.5 * np.cos(np.pi * t2))).astype(np.float32)


def _paint_density(rng: np.random.Generator, a: Anatomy, yy: np.ndarray, xx: np.ndarray) -> None:
    h, w = a.height, a.width
    wf = float(w)
    mid = a.mid_x
    dx = xx - mid
    adx = np.abs(dx)

    # body and soft tissue
    half = _body_half_width(rng, a, yy)
    body_soft = soft_step(half - adx, 0.012 * wf)
    a.body = body_soft > 0.5
    thick = np.clip(1.0 - (adx / np.maximum(half, 1.0)) ** 2, 0.0, 1.0)
    dens = 0.04 + body_soft * (0.6 + 0.26 * thick**0.7)
    y_apex = min(a.sides["right"].y_apex, a.sides["left"].y_apex)
    # shoulder girdle muscles over the upper chest
    dens += body_soft * 0.12 * soft_step((y_apex + 0.16 * wf) - yy, 0.05 * wf) * soft_step(adx - 0.2 * wf, 0.06 * wf)

    # abdomen below the diaphragm (liver on the image left, stomach on the right)
    floor = a.floor[None, :]
    below = soft_step(yy - floor, 0.004 * wf)
    dens += below * body_soft * 0.05
    if rng.random() < 0.7:
        g = a.sides["left"]
        by = float(g.diaphragm(np.float32(g.dome_d))) + 0.035 * wf
        bx = mid + g.dome_d * rng.uniform(0.8, 1.1)
        r = ellipse_radius(yy, xx, by, bx, 0.028 * wf, rng.uniform(0.045, 0.07) * wf)
        bubble = soft_step(1.0 - r, 0.08) * soft_step(yy - (floor + 0.006 * wf), 0.003 * wf)
        dens -= 0.3 * bubble

    # lungs: aerated parenchyma removes density, less near the borders (chest wall, mediastinum)
    lungs = a.lungs
    edt = ndimage.distance_transform_edt(lungs).astype(np.float32)
    lung_soft = blur(lungs.astype(np.float32), 0.7 * wf / 512)
    depth = 1.0 - np.exp(-edt / (0.022 * wf))
    t = np.clip((yy - y_apex) / max(a.params["lung_height"], 1.0), 0, 1)
    vert = 0.86 + 0.14 * t
    tex = 1.0 + 0.05 * smooth_noise(rng, (h, w), 0.08 * wf) + 0.025 * smooth_noise(rng, (h, w), 0.02 * wf)
    air = rng.uniform(0.6, 0.68) * (0.25 + 0.75 * depth) * vert * tex
    dens -= lung_soft * air

    # heart and mediastinum: full soft-tissue thickness (not aerated) plus a little extra
    heart_soft = blur(a.heart.astype(np.float32), 0.7 * wf / 512)
    dens += 0.05 * heart_soft
    medi = soft_step(0.05 * wf - adx, 0.01 * wf) * soft_step(floor - yy, 0.01 * wf)
    dens += 0.05 * medi

    # hila and pulmonary vessels (inside the lungs, radiating from the hila)
    vessels = np.zeros((h, w), dtype=np.float32)
    tiers = [np.zeros((h, w), dtype=np.float32) for _ in range(3)]
    for side, (hy, hx) in a.hila.items():
        r = ellipse_radius(yy, xx, hy, hx, 0.05 * wf, 0.03 * wf)
        vessels += 0.16 * np.exp(-(r**2) * 1.5)
        _vessel_tree(rng, a, side, hy, hx, tiers)
    for tier, (sigma, amp) in enumerate(((0.006, 0.1), (0.0035, 0.07), (0.0022, 0.05))):
        sg = sigma * wf
        vessels += amp * np.clip(blur(tiers[tier], sg) * sg * 2.5, 0.0, 1.0)
    dens += vessels * (0.35 + 0.65 * lung_soft)

    # spine with vertebral bodies, pedicles, and the trachea
    spine_half = wf * rng.uniform(0.038, 0.046)
    vert_h = a.params["lung_height"] / rng.uniform(9.5, 11.0)
    phase = rng.uniform(0, vert_h)
    in_spine = soft_step(spine_half - adx, 0.006 * wf)
    cyc = ((yy - phase) % vert_h) / vert_h
    disc = soft_step(np.abs(cyc - 0.5) - 0.42, 0.02)  # 1 in disc spaces
    dens += in_spine * (0.11 - 0.05 * disc)
    for sgn in (-1.0, 1.0):
        pr = ellipse_radius(yy, xx, 0.0, mid + sgn * spine_half * 0.62, 1.0, 0.012 * wf)
        # pedicle ovals repeat with the vertebrae
        ped = np.exp(-((np.abs(cyc - 0.35) / 0.12) ** 2)) * np.exp(-((pr * 1.0) ** 2) * 0.6)
        dens += 0.07 * ped * (yy > y_apex)
    knob_y = a.sides["left"].y_knob
    trach_x = mid + wf * rng.uniform(-0.008, 0.004) - 0.01 * wf * np.exp(-(((yy - knob_y) / (0.06 * wf)) ** 2))
    y_carina = y_apex + a.params["lung_height"] * rng.uniform(0.27, 0.33)
    trach = soft_step(0.017 * wf - np.abs(xx - trach_x), 0.004 * wf) * soft_step(y_carina - yy, 0.01 * wf)
    dens -= 0.17 * trach
    bron = np.zeros((h, w), dtype=np.float32)
    for side, (hy, hx) in a.hila.items():
        ys = np.linspace(y_carina, hy - 0.01 * wf, 40)
        xs = np.linspace(mid, hx - SIDE_SIGN[side] * 0.015 * wf, 40)
        splat_polyline(bron, np.stack([ys, xs], 1), np.full(40, 1.0, dtype=np.float32))
    dens -= 0.10 * np.clip(blur(bron, 0.012 * wf) * 0.012 * wf * 2.5, 0, 1)

    # ribs (posterior arcs bright, anterior arcs faint) and clavicles
    bones = np.zeros((h, w), dtype=np.float32)
    for side, g in a.sides.items():
        sgn = SIDE_SIGN[side]
        n_post = 10
        y_first = g.y_apex - 0.025 * wf
        spacing = (g.y_cp - y_first) / (n_post - 0.3)
        dmax = g.lateral + 0.05 * wf
        d = np.arange(0.02 * wf, dmax, 1.0, dtype=np.float32)
        xs = np.round(mid + sgn * d).astype(np.int64)
        dn = d / g.lateral
        for k in range(n_post):
            y0 = y_first + k * spacing * rng.uniform(0.96, 1.04)
            arc = y0 + wf * (-0.16 * dn + 0.22 * dn**2) * (1.0 + 0.15 * k / n_post)
            half_t = wf * (0.011 + 0.005 * dn) * rng.uniform(0.9, 1.1)
            wall = g.lateral_edge(arc.astype(np.float32)) + 0.03 * wf
            wt = 0.10 * soft_step(dn - 0.05, 0.03) * soft_step(wall - d, 0.01 * wf)
            curve_band(bones, xs, arc, half_t, wt)
        for k in range(7):
            ya = g.y_apex + 0.04 * wf + k * spacing * 1.05
            arc = ya + wf * 0.13 * np.clip(1.0 - dn, 0.0, None) ** 1.4
            wall = g.lateral_edge(arc.astype(np.float32)) + 0.02 * wf
            wt = 0.05 * soft_step(dn - 0.28, 0.04) * soft_step(wall - d, 0.01 * wf)
            curve_band(bones, xs, arc, wf * 0.012 * np.ones_like(dn), wt, cortex=0.6)
        # clavicle: medial end low near the sternum, lateral end higher at the shoulder
        dc = np.arange(0.035 * wf, 0.44 * wf, 1.0, dtype=np.float32)
        u = (dc - dc[0]) / (dc[-1] - dc[0])
        yc0 = g.y_apex + (0.02 if a.view == "PA" else -0.01) * wf + rng.uniform(0.0, 0.03) * wf
        ycl = yc0 - u * wf * rng.uniform(0.02, 0.06) + 0.012 * wf * np.sin(2 * np.pi * u)
        half_c = wf * (0.02 + 0.007 * (1 - u) ** 2)
        curve_band(bones, np.round(mid + sgn * dc).astype(np.int64), ycl, half_c, 0.22, cortex=0.45)
    dens += bones * body_soft * (1.0 - 0.6 * below)

    if a.sternotomy:
        wires = np.zeros((h, w), dtype=np.float32)
        n = int(rng.integers(4, 7))
        y_top = y_apex + 0.22 * a.params["lung_height"]
        for k in range(n):
            cy = y_top + k * 0.05 * wf
            r = ellipse_radius(yy, xx, cy, mid + rng.normal(0, 0.004) * wf, 0.008 * wf, 0.014 * wf)
            wires += np.exp(-(((r - 1.0) / 0.18) ** 2))
        dens += 0.55 * np.clip(wires, 0, 1)

    a.density = dens.astype(np.float32)


def _vessel_tree(rng: np.random.Generator, a: Anatomy, side: str, hy: float, hx: float,
                 tiers: list[np.ndarray]) -> None:
    """Branching vessel markings fanning out of the hilum, splatted into ``tiers`` by branch order."""
    h, w = a.height, a.width
    wf = float(w)
    sgn = SIDE_SIGN[side]
    lung = a.lung(side)
    step = 1.0
    n_main = int(rng.integers(7, 10))
    angles = np.linspace(-1.25, 1.35, n_main) + rng.normal(0, 0.08, n_main)
    stack = [(hy, hx, float(a0), 0, 0.55 * wf * rng.uniform(0.8, 1.1)) for a0 in angles]
    while stack:
        y, x, ang, depth, length = stack.pop()
        n = int(length / step)
        if n < 4:
            continue
        pts = np.empty((n, 2), dtype=np.float32)
        cur_a = ang
        for i in range(n):
            cur_a += rng.normal(0.0, 0.03)
            # angle 0 points laterally, positive angles downwards
            y += step * np.sin(cur_a)
            x += step * np.cos(cur_a) * sgn
            pts[i] = (y, x)
        yi = np.clip(pts[:, 0].astype(np.int64), 0, h - 1)
        xi = np.clip(pts[:, 1].astype(np.int64), 0, w - 1)
        inside = lung[yi, xi] | (np.hypot(pts[:, 0] - hy, pts[:, 1] - hx) < 0.06 * wf)
        fade = np.linspace(1.0, 0.5, n, dtype=np.float32) * inside
        tier = min(depth, 2)
        splat_polyline(tiers[tier], pts, fade)
        if depth < 3:
            for frac in (0.35, 0.65):
                j = int(frac * n)
                if rng.random() < 0.8 and inside[j]:
                    turn = rng.choice([-1, 1]) * rng.uniform(0.3, 0.6)
                    stack.append((float(pts[j, 0]), float(pts[j, 1]), cur_a + turn, depth + 1,
                                  length * rng.uniform(0.35, 0.5)))


# --- rendering ------------------------------------------------------------------------------------

def render(rng: np.random.Generator, density: np.ndarray, width: int) -> np.ndarray:
    """Blur, film curve, bias field and noise: density field -> uint8 grey image."""
    wf = float(width)
    d = blur(density, 0.55 * wf / 512)
    c = rng.uniform(0.54, 0.6)
    s = rng.uniform(0.19, 0.23)

    def film(x):
        return 1.0 / (1.0 + np.exp(-(x - c) / s))

    lo, hi = film(0.0), film(1.4)
    img = (film(d) - lo) / (hi - lo)
    img *= 1.0 + 0.04 * smooth_noise(rng, density.shape, 0.4 * wf)
    img += rng.normal(0.0, 0.011, density.shape).astype(np.float32)
    img = blur(img, 0.35 * wf / 512)
    return np.clip(np.round(img * 255.0), 0, 255).astype(np.uint8)
