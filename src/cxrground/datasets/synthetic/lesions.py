"""Lesion sites (report phrase <-> ILS labels) and the painters that add each lesion's radiodensity.

Every lesion is drawn as *added density* (brighter on the image). Its mask is where its contribution is
substantial (``>= MASK_FRACTION`` of its peak), clipped to the lungs; an effusion is the fluid below its
meniscus inside the lung base of its side; cardiomegaly is the (enlarged) heart mask.

A :class:`Site` ties a report location phrase to the ILS labels the phrase maps to (the ILS.md §7.2
proposed lexicon: *reported location*) and to the labels the painter places the lesion in. The labels a
drawn lesion actually overlaps are computed afterwards with
:func:`cxrground.anatomy.ils_location_masks`, so truth and downstream geometry agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np

from cxrground.datasets.synthetic.fields import blur, ellipse_radius, grid, smooth_noise, soft_step
from cxrground.datasets.synthetic.phantom import SIDE_SIGN, Anatomy
from cxrground.vocab import HEART, SIDES
from cxrground.vocab.traits import is_diffuse, lesions_where, traits

#: A lung lesion's mask keeps the pixels where its density is at least this fraction of its peak.
MASK_FRACTION: Final[float] = 0.35
#: Focal lung lesions that may occur twice in a study (in different places).
LUNG_FOCAL: Final[tuple[str, ...]] = lesions_where(lambda t: t.anatomy == "lung" and t.extent == "focal")
#: Smallest accepted lesion mask, as a fraction of the image area (smaller draws are redrawn larger).
MIN_AREA_FRACTION: Final[float] = 0.0008


@dataclass(frozen=True)
class Site:
    """A location as written in a report and where the painter puts the lesion.

    ``labels``: the ILS labels the phrase maps to (reported location, ILS.md §7.2 lexicon).
    ``place``: ILS labels of the placement region (``()``: choose a zone at random, see ``spread``).
    ``adjs``: adjectival phrases (``right lower lobe`` in "right lower lobe pneumonia"); may be empty.
    ``nouns``: noun phrases used after ``prep`` (``in the right lower lobe``); may be empty.
    ``focus``: placement hint inside the region (``medial``, ``hilar``, ``lateral`` or empty).
    ``spread``: for whole-lung sites, ``focal`` (one random zone per side) or ``diffuse``.
    """

    key: str
    labels: tuple[str, ...]
    place: tuple[str, ...]
    adjs: tuple[str, ...]
    nouns: tuple[str, ...]
    prep: str = "in the"
    focus: str = ""
    spread: str = "focal"

    @property
    def sides(self) -> tuple[str, ...]:
        found = [s for s in SIDES if any(lab.startswith(s) for lab in (self.place or self.labels))]
        return tuple(found) if found else SIDES

    @property
    def plural(self) -> bool:
        """True when the site names both sides (``bibasilar``, ``bilateral``, ``perihilar regions``)."""
        return len(self.labels) > 1 and self.key != "heart"


def _s(key, labels, place, adjs, nouns, prep="in the", focus="", spread="focal") -> Site:
    def tup(v):
        return () if v is None else ((v,) if isinstance(v, str) else tuple(v))

    return Site(key, tuple(labels), tuple(place), tup(adjs), tup(nouns), prep, focus, spread)


RB, LB = "right lung base", "left lung base"
RM, LM = "right mid zone lung", "left mid zone lung"
RU, LU = "right upper zone lung", "left upper zone lung"
RA, LA = "right apical zone lung", "left apical zone lung"
RL, LL = "right lung", "left lung"

#: Every site a report can name. ``labels`` follow the ILS.md §7.2 proposed lexicon.
SITES: Final[dict[str, Site]] = {
    s.key: s
    for s in (
        _s("rll", [RB], [RB], "right lower lobe", "right lower lobe"),
        _s("lll", [LB], [LB], "left lower lobe", "left lower lobe"),
        _s("rbase", [RB], [RB], ["right basilar", "right basal"], ["right base", "right lung base"], "at the"),
        _s("lbase", [LB], [LB], ["left basilar", "left basal"], ["left base", "left lung base"], "at the"),
        _s("retrocardiac", [LB], [LB], "retrocardiac", "retrocardiac region", "in the", "medial"),
        _s("bibasilar", [RB, LB], [RB, LB], ["bibasilar", "bibasal"], ["lung bases", "bases"], "at the"),
        _s("rml", [RM], [RM], "right middle lobe", "right middle lobe", "in the", "medial"),
        _s("lingula", [LM], [LM], "lingular", "lingula", "in the", "medial"),
        _s("rul", [RU], [RU], "right upper lobe", "right upper lobe"),
        _s("lul", [LU], [LU], "left upper lobe", "left upper lobe"),
        _s("rapex", [RA], [RA], "right apical", "right apex", "at the"),
        _s("lapex", [LA], [LA], "left apical", "left apex", "at the"),
        _s("rmid", [RM], [RM], "right mid lung", "right mid lung"),
        _s("lmid", [LM], [LM], "left mid lung", "left mid lung"),
        _s("rperihilar", [RM], [RM], "right perihilar", "right perihilar region", "in the", "hilar"),
        _s("lperihilar", [LM], [LM], "left perihilar", "left perihilar region", "in the", "hilar"),
        _s("perihilar", [RM, LM], [RM, LM], ["bilateral perihilar", "perihilar"], "perihilar regions", "in the",
           "hilar"),
        _s("rlung", [RL], [], "right lung", "right lung"),
        _s("llung", [LL], [], "left lung", "left lung"),
        _s("bilateral", [RL, LL], [], ["bilateral", "multifocal bilateral"], "both lungs", "in", "", "focal"),
        _s("diffuse", [RL, LL], [], "diffuse bilateral", "both lungs", "in", "", "diffuse"),
        _s("unspecified", [RL, LL], [], None, None, "", "", "focal"),
        # pleural sites: a side word maps to the whole lung of that side (lexicon), the fluid lies at the base
        _s("eff_right", [RL], [RB], "right", None),
        _s("eff_left", [LL], [LB], "left", None),
        _s("eff_bilateral", [RL, LL], [RB, LB], "bilateral", None),
        _s("eff_rcpa", [RB], [RB], None, "right costophrenic angle", "at the"),
        _s("eff_lcpa", [LB], [LB], None, "left costophrenic angle", "at the"),
        _s("heart", [HEART], [], None, None, ""),
    )
}

#: Site weights per lesion (where each lesion is typically described).
SITE_WEIGHTS: Final[dict[str, dict[str, float]]] = {
    "pneumonia": {
        "rll": 0.2, "lll": 0.14, "rbase": 0.05, "lbase": 0.05, "rml": 0.1, "lingula": 0.07, "rul": 0.1,
        "lul": 0.05, "bibasilar": 0.08, "retrocardiac": 0.05, "rlung": 0.03, "bilateral": 0.05,
        "unspecified": 0.03,
    },
    "consolidation": {
        "rll": 0.2, "lll": 0.15, "rbase": 0.06, "lbase": 0.06, "rml": 0.1, "lingula": 0.06, "rul": 0.12,
        "lul": 0.07, "retrocardiac": 0.08, "bibasilar": 0.05, "rlung": 0.025, "llung": 0.025,
    },
    "opacity": {
        "rbase": 0.1, "lbase": 0.1, "retrocardiac": 0.1, "bibasilar": 0.1, "rmid": 0.07, "lmid": 0.06,
        "rul": 0.06, "lul": 0.05, "rapex": 0.06, "lapex": 0.05, "rperihilar": 0.04, "lperihilar": 0.03,
        "lingula": 0.04, "rml": 0.04, "bilateral": 0.06, "unspecified": 0.04,
    },
    "atelectasis": {
        "bibasilar": 0.34, "rbase": 0.14, "lbase": 0.16, "retrocardiac": 0.1, "rll": 0.04, "lll": 0.08,
        "lingula": 0.07, "rml": 0.04, "unspecified": 0.03,
    },
    "edema": {"unspecified": 0.45, "perihilar": 0.3, "diffuse": 0.25},
    "effusion": {
        "eff_right": 0.28, "eff_left": 0.27, "eff_bilateral": 0.33, "eff_rcpa": 0.06, "eff_lcpa": 0.06,
    },
    "cardiomegaly": {"heart": 1.0},
}

#: Severity words and their weights per lesion (used by the report and to scale the painters).
SEVERITIES: Final[dict[str, dict[str, float]]] = {
    "effusion": {"small": 0.5, "moderate": 0.35, "large": 0.15},
    "edema": {"mild": 0.5, "moderate": 0.38, "severe": 0.12},
    "cardiomegaly": {"mild": 0.45, "moderate": 0.4, "severe": 0.15},
    "pneumonia": {"": 1.0},
    "consolidation": {"": 1.0},
    "opacity": {"": 1.0},
    "atelectasis": {"mild": 0.4, "": 0.6},
}

#: CTR band of each cardiomegaly severity (always clearly above 0.5).
CARDIOMEGALY_CTR: Final[dict[str, tuple[float, float]]] = {
    "mild": (0.52, 0.56),
    "moderate": (0.56, 0.6),
    "severe": (0.6, 0.64),
}

#: Appearance choices per lesion (weights); site-dependent overrides are applied in :func:`choose_appearance`.
APPEARANCES: Final[dict[str, dict[str, float]]] = {
    "pneumonia": {"lobar": 0.5, "patchy": 0.5},
    "consolidation": {"lobar": 0.7, "segmental": 0.3},
    "opacity": {"patchy": 0.6, "hazy": 0.4},
    "atelectasis": {"plate-like": 0.7, "patchy": 0.3},
    "edema": {"perihilar": 1.0},
    "effusion": {"meniscus": 1.0},
    "cardiomegaly": {"enlarged heart": 1.0},
}


def choose(rng: np.random.Generator, weights: dict[str, float]) -> str:
    """Draw a key with probability proportional to its weight (deterministic key order)."""
    keys = list(weights)
    p = np.array([weights[k] for k in keys], dtype=float)
    return keys[int(rng.choice(len(keys), p=p / p.sum()))]


def choose_appearance(rng: np.random.Generator, lesion: str, site: Site) -> str:
    """Appearance of a lesion at a site (e.g. collapse behind the heart is a wedge, edema spreads)."""
    if lesion == "atelectasis" and site.key in ("retrocardiac", "lll", "rll") and rng.random() < 0.6:
        return "wedge"
    if lesion == "edema":
        return "diffuse" if site.key == "diffuse" else "perihilar"
    return choose(rng, APPEARANCES[lesion])


@dataclass
class LesionSpec:
    """The plan of one finding before drawing."""

    lesion: str
    site: Site
    certainty: str = "definitive"
    reported: bool = True
    severity: str = ""
    appearance: str = ""
    # per-side severity of a bilateral effusion ("left greater than right")
    side_severity: dict[str, str] = field(default_factory=dict)


@dataclass
class DrawnLesion:
    """A drawn finding: its added density (None for cardiomegaly), exact mask and placement labels."""

    spec: LesionSpec
    density: np.ndarray | None
    mask: np.ndarray
    placed: list[str]


# --- placement ------------------------------------------------------------------------------------

def _zone_for_side(rng: np.random.Generator, side: str, lesion: str) -> str:
    zones = {
        "pneumonia": {"lung base": 0.5, "mid zone lung": 0.3, "upper zone lung": 0.2},
        "consolidation": {"lung base": 0.5, "mid zone lung": 0.3, "upper zone lung": 0.2},
        "opacity": {"lung base": 0.4, "mid zone lung": 0.35, "upper zone lung": 0.25},
        "atelectasis": {"lung base": 0.85, "mid zone lung": 0.15},
    }.get(lesion, {"lung base": 0.4, "mid zone lung": 0.4, "upper zone lung": 0.2})
    zone = choose(rng, zones)
    return f"{side} {zone}"


def placement_labels(rng: np.random.Generator, spec: LesionSpec) -> list[str]:
    """ILS labels the painter places the lesion in (resolving whole-lung sites to zones)."""
    site = spec.site
    if site.place:
        return list(site.place)
    if site.key == "heart":
        return [HEART]
    if is_diffuse(spec.lesion) or site.spread == "diffuse":
        return [RL, LL]
    if site.key == "rlung":
        return [_zone_for_side(rng, "right", spec.lesion)]
    if site.key == "llung":
        return [_zone_for_side(rng, "left", spec.lesion)]
    if site.key == "bilateral":
        return [_zone_for_side(rng, "right", spec.lesion), _zone_for_side(rng, "left", spec.lesion)]
    # unspecified: one focus somewhere
    return [_zone_for_side(rng, str(rng.choice(list(SIDES))), spec.lesion)]


def _side_of_label(label: str) -> str:
    return "right" if label.startswith("right") else "left"


def _sample_center(rng, region: np.ndarray, focus: str, anatomy: Anatomy, side: str) -> tuple[float, float]:
    ys, xs = np.nonzero(region)
    if ys.size == 0:
        raise ValueError("empty placement region")
    sgn = SIDE_SIGN[side]
    d = sgn * (xs - anatomy.mid_x)  # lateral distance
    keep = np.ones(ys.size, dtype=bool)
    y_lo, y_hi = ys.min(), ys.max()
    d_lo, d_hi = d.min(), d.max()
    if focus == "medial":
        keep &= d <= d_lo + 0.45 * (d_hi - d_lo)
    elif focus == "lateral":
        keep &= d >= d_lo + 0.5 * (d_hi - d_lo)
    elif focus == "hilar":
        hy, hx = anatomy.hila[side]
        keep &= np.hypot(ys - hy, xs - hx) <= 0.12 * anatomy.width
    # stay away from the region border
    keep &= (ys >= y_lo + 0.15 * (y_hi - y_lo)) & (ys <= y_hi - 0.1 * (y_hi - y_lo))
    if not keep.any():
        keep = np.ones(ys.size, dtype=bool)
    idx = np.flatnonzero(keep)
    j = int(idx[int(rng.integers(idx.size))])
    return float(ys[j]), float(xs[j])


def _region_dims(region: np.ndarray) -> tuple[float, float]:
    ys, xs = np.nonzero(region)
    return float(ys.max() - ys.min() + 1), float(xs.max() - xs.min() + 1)


# --- painters -------------------------------------------------------------------------------------

def _cloud(rng, shape, cy, cx, ry, rx, angle, edge, rough, cell) -> np.ndarray:
    yy, xx = grid(*shape)
    r = ellipse_radius(yy, xx, cy, cx, ry, rx, angle)
    n = smooth_noise(rng, shape, cell)
    return soft_step(1.0 - r + rough * n, edge)


def _paint_focal(rng, spec: LesionSpec, anatomy: Anatomy, region: np.ndarray, side: str, scale: float) -> np.ndarray:
    """Pneumonia, consolidation, opacity and patchy atelectasis: cloud(s) inside ``region``."""
    shape = region.shape
    wf = float(anatomy.width)
    rh, rw = _region_dims(region)
    app = spec.appearance
    lesion = spec.lesion
    out = np.zeros(shape, dtype=np.float32)
    if app in ("lobar", "segmental", "hazy") or (lesion == "atelectasis" and app == "wedge"):
        cy, cx = _sample_center(rng, region, spec.site.focus, anatomy, side)
        big = {"lobar": 0.5, "segmental": 0.33, "hazy": 0.42, "wedge": 0.3}[app] * scale
        ry = max(rh * big * rng.uniform(0.85, 1.15), 0.03 * wf)
        rx = max(rw * big * rng.uniform(0.85, 1.15), 0.03 * wf)
        if app == "wedge":
            ry, rx = max(ry, 0.06 * wf), max(rx * 0.7, 0.03 * wf)
        edge = {"consolidation": 0.1, "pneumonia": 0.16, "opacity": 0.28, "atelectasis": 0.12}[lesion]
        rough = 0.2 if lesion == "consolidation" else 0.32
        angle = rng.uniform(-0.5, 0.5)
        cloud = _cloud(rng, shape, cy, cx, ry, rx, angle, edge, rough, 0.06 * wf)
        cloud *= 0.82 + 0.18 * np.clip(0.5 + 0.5 * smooth_noise(rng, shape, 0.025 * wf), 0.0, 1.0)
        if lesion in ("consolidation", "pneumonia") and app in ("lobar", "segmental"):
            cloud -= 0.3 * _bronchograms(rng, anatomy, side, cy, cx, ry, rx) * (cloud > 0.6)
        out = np.maximum(out, cloud)
    else:  # patchy: several smaller ill-defined foci
        n = int(rng.integers(3, 7))
        for _ in range(n):
            cy, cx = _sample_center(rng, region, spec.site.focus, anatomy, side)
            ry = max(rh * rng.uniform(0.14, 0.26) * scale, 0.025 * wf)
            rx = max(rw * rng.uniform(0.14, 0.26) * scale, 0.025 * wf)
            edge = 0.45 if lesion == "opacity" else 0.35
            f = _cloud(rng, shape, cy, cx, ry, rx, rng.uniform(-1, 1), edge, 0.45, 0.03 * wf)
            out = np.maximum(out, f * rng.uniform(0.7, 1.0))
        out *= 0.8 + 0.2 * np.clip(0.5 + 0.5 * smooth_noise(rng, shape, 0.02 * wf), 0.0, 1.0)
    return out


def _bronchograms(rng, anatomy: Anatomy, side: str, cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    """A few thin lucent branching lines (air-filled bronchi) running towards the hilum."""
    from cxrground.datasets.synthetic.fields import splat_polyline

    shape = (anatomy.height, anatomy.width)
    wf = float(anatomy.width)
    hy, hx = anatomy.hila[side]
    lines = np.zeros(shape, dtype=np.float32)
    base = np.arctan2(hy - cy, hx - cx)
    for _ in range(int(rng.integers(2, 5))):
        y = cy + rng.uniform(-0.4, 0.4) * ry
        x = cx + rng.uniform(-0.4, 0.4) * rx
        ang = base + rng.uniform(-0.6, 0.6)
        n = int(max(ry, rx) * rng.uniform(0.6, 1.1))
        pts = np.empty((max(n, 2), 2), dtype=np.float32)
        for i in range(pts.shape[0]):
            ang += rng.normal(0, 0.05)
            y += np.sin(ang)
            x += np.cos(ang)
            pts[i] = (y, x)
        splat_polyline(lines, pts, np.linspace(1.0, 0.4, pts.shape[0], dtype=np.float32))
    s = 0.003 * wf
    return np.clip(blur(lines, s) * s * 3.0, 0.0, 1.0)


def _paint_band(rng, anatomy: Anatomy, region: np.ndarray, side: str, scale: float) -> np.ndarray:
    """Plate-like (discoid) atelectasis: a thin, nearly horizontal band across the lower lung."""
    shape = region.shape
    wf = float(anatomy.width)
    ys, xs = np.nonzero(region)
    y_lo, y_hi = ys.min(), ys.max()
    yc = y_lo + rng.uniform(0.2, 0.65) * (y_hi - y_lo)
    row = np.flatnonzero(region[round(yc)])
    if row.size < 4:
        row = xs
    xa, xb = float(row.min()), float(row.max())
    span = xb - xa
    length = span * rng.uniform(0.45, 0.8) * min(scale, 1.2)
    x0 = xa + rng.uniform(0.05, 0.95) * max(span - length, 0.0)
    x1 = x0 + length
    xm = 0.5 * (x0 + x1)
    tilt = rng.uniform(-0.18, 0.18)
    curv = rng.uniform(-0.6, 0.6) / max(length, 1.0)
    half = wf * rng.uniform(0.009, 0.016) * scale
    yy, xx = grid(*shape)
    yline = yc + np.tan(tilt) * (xx - xm) + curv * (xx - xm) ** 2 / 2.0
    wobble = 1.0 + 0.25 * smooth_noise(rng, shape, 0.03 * wf)
    dist = np.abs(yy - yline) / (half * wobble)
    ends = soft_step(xx - x0, 0.02 * wf) * soft_step(x1 - xx, 0.02 * wf)
    return (np.exp(-(dist**2)) * ends).astype(np.float32)


def _paint_edema(rng, spec: LesionSpec, anatomy: Anatomy, scale: float) -> np.ndarray:
    """Bilateral perihilar (bat-wing) haze, or a more diffuse bilateral haze."""
    shape = (anatomy.height, anatomy.width)
    wf = float(anatomy.width)
    out = np.zeros(shape, dtype=np.float32)
    diffuse = spec.appearance == "diffuse"
    for side in SIDES:
        hy, hx = anatomy.hila[side]
        sgn = SIDE_SIGN[side]
        cy = hy + wf * rng.uniform(0.02, 0.05) * (2.0 if diffuse else 1.0)
        cx = hx + sgn * wf * rng.uniform(0.03, 0.06)
        rx = wf * (0.24 if diffuse else 0.16) * rng.uniform(0.9, 1.1) * scale
        ry = wf * (0.25 if diffuse else 0.13) * rng.uniform(0.9, 1.1) * scale
        f = _cloud(rng, shape, cy, cx, ry, rx, sgn * rng.uniform(0.1, 0.4), 0.3, 0.25, 0.08 * wf)
        out = np.maximum(out, f)
    fine = 1.0 + 0.08 * smooth_noise(rng, shape, 0.02 * wf)
    return (out * fine).astype(np.float32)


def _paint_effusion(rng, spec: LesionSpec, anatomy: Anatomy, side: str, severity: str) -> np.ndarray:
    """Pleural fluid at the base: fills the costophrenic angle, meniscus rising laterally."""
    shape = (anatomy.height, anatomy.width)
    wf = float(anatomy.width)
    lung = anatomy.lung(side)
    rows = np.flatnonzero(lung.any(axis=1))
    y0, y1 = float(rows[0]), float(rows[-1])
    lung_h = y1 - y0
    y_dome = float(anatomy.sides[side].y_dome)  # top of the hemidiaphragm
    if severity == "large":
        y_level = y_dome - rng.uniform(0.2, 0.32) * lung_h
    elif severity == "moderate":
        y_level = y_dome - rng.uniform(0.05, 0.14) * lung_h
    else:  # small: blunts the costophrenic angle
        y_level = y1 - rng.uniform(0.35, 0.65) * max(y1 - y_dome, 1.0)
    g = anatomy.sides[side]
    yy, xx = grid(*shape)
    d = SIDE_SIGN[side] * (xx - anatomy.mid_x)
    u = np.clip((g.lateral - d) / (rng.uniform(0.12, 0.2) * wf), 0.0, 1.0)  # 0 at the lateral wall
    rise = wf * rng.uniform(0.02, 0.045) * (1.0 + 0.8 * (severity == "large"))
    top = y_level - rise * (1.0 - u) ** 2
    depth = np.clip((yy - top) / (0.1 * wf), 0.0, 1.0)
    fluid = soft_step(yy - top, 0.012 * wf) * (0.6 + 0.4 * depth)
    if anatomy.view == "AP":  # layering fluid veils the lower hemithorax a little
        fluid = fluid + 0.18 * soft_step(yy - (top - 0.12 * wf), 0.06 * wf) * (1 - soft_step(yy - top, 0.006 * wf))
    return fluid.astype(np.float32)


#: Peak added density per lesion (definitive, reported); tentative and unreported findings are fainter.
DENSITY: Final[dict[str, tuple[float, float]]] = {
    "consolidation": (0.38, 0.48),
    "pneumonia": (0.3, 0.42),
    "opacity": (0.22, 0.32),
    "atelectasis": (0.3, 0.4),
    "edema": (0.3, 0.4),
    "effusion": (0.42, 0.52),
}
#: Blur of each lesion's field (fraction of the image width): consolidation is sharper than opacity.
SOFTNESS: Final[dict[str, float]] = {
    "consolidation": 0.005,
    "pneumonia": 0.009,
    "opacity": 0.013,
    "atelectasis": 0.005,
    "edema": 0.02,
}
#: Severity multiplies the size of a lesion (and the density of edema).
SEVERITY_SCALE: Final[dict[str, float]] = {"": 1.0, "mild": 0.85, "moderate": 1.05, "severe": 1.25,
                                           "small": 1.0, "large": 1.0}


def draw_lesion(
    rng: np.random.Generator,
    spec: LesionSpec,
    anatomy: Anatomy,
    locations: dict[str, np.ndarray],
) -> DrawnLesion:
    """Draw one finding; ``locations`` are the ILS location masks of the phantom's lungs."""
    if traits(spec.lesion).heart_mask:  # the lesion is the (enlarged) heart itself
        return DrawnLesion(spec, None, anatomy.heart.copy(), [HEART])
    shape = (anatomy.height, anatomy.width)
    lungs = anatomy.lungs
    lung_soft = blur(lungs.astype(np.float32), 0.6 * anatomy.width / 512)
    placed = placement_labels(rng, spec)
    lo, hi = DENSITY[spec.lesion]
    amp = rng.uniform(lo, hi)
    if spec.certainty == "tentative":
        amp *= 0.8
    if not spec.reported:
        amp *= 0.85
    if spec.lesion == "edema":
        amp *= {"mild": 0.8, "moderate": 1.0, "severe": 1.2}.get(spec.severity, 1.0)
    min_area = MIN_AREA_FRACTION * shape[0] * shape[1]
    scale = SEVERITY_SCALE.get(spec.severity, 1.0)
    field_ = np.zeros(shape, dtype=np.float32)
    mask = np.zeros(shape, dtype=bool)
    for _attempt in range(6):
        field_ = np.zeros(shape, dtype=np.float32)
        clip = np.zeros(shape, dtype=bool)
        if spec.lesion == "edema":
            field_ = _paint_edema(rng, spec, anatomy, scale)
            clip = lungs
        elif spec.lesion == "effusion":
            for label in placed:
                side = _side_of_label(label)
                sev = spec.side_severity.get(side, spec.severity)
                field_ = np.maximum(field_, _paint_effusion(rng, spec, anatomy, side, sev) * anatomy.lung(side))
                clip |= anatomy.lung(side)
        else:
            for label in placed:
                side = _side_of_label(label)
                region = locations[label]
                if not region.any():
                    continue
                if spec.lesion == "atelectasis" and spec.appearance == "plate-like":
                    f = _paint_band(rng, anatomy, region, side, scale)
                else:
                    f = _paint_focal(rng, spec, anatomy, region, side, scale)
                # keep the lesion essentially inside its region (soft fall-off at the zone borders)
                reg_soft = np.clip(blur(region.astype(np.float32), 0.015 * anatomy.width) * 1.8, 0.0, 1.0)
                field_ = np.maximum(field_, f * reg_soft)
            clip = lungs
        if spec.lesion != "effusion":
            field_ = blur(field_, SOFTNESS[spec.lesion] * anatomy.width)
            peak = float(field_.max())
            if peak > 0:
                field_ /= peak
        if spec.lesion == "effusion":
            density = field_ * amp
            mask = (field_ >= 0.45) & clip
        else:
            density = field_ * amp * lung_soft
            peak = float(density.max())
            mask = (density >= MASK_FRACTION * peak) & clip if peak > 0 else np.zeros(shape, dtype=bool)
        if mask.sum() >= min_area:
            break
        scale *= 1.3
    else:  # pragma: no cover - geometry guard
        raise RuntimeError(f"could not draw a visible {spec.lesion} at {spec.site.key}")
    return DrawnLesion(spec, density.astype(np.float32), mask, placed)


def overlapped_labels(mask: np.ndarray, locations: dict[str, np.ndarray], order: tuple[str, ...]) -> list[str]:
    """ILS labels (in ``order``) whose location mask shares at least one pixel with ``mask``."""
    return [lab for lab in order if (locations[lab] & mask).any()]
