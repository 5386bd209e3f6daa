"""Lung-base completion by a shape prior: does it bring back the opacified bases the lung U-Net loses?

Reads the per-film cache written by ``bench/segment.py --only-real --cache DIR`` (working-grid pixels, the U-Net's
lungs and the pack's lung masks of the 205 annotated COVID-19 collection films) and measures three completions
of the U-Net's lungs, pre-registered in ``bench/records/lung_shape_prior_preregistration.md``:

* ``shape``: a template shape prior. Each template is the pair of annotated lungs of one shippable-licence film
  (CC BY 3.0 / CC BY 4.0 / "authorized for everyone"), stored as each lung's row extents at 96 levels in a frame
  of the lungs' top row, horizontal centre and width. A film's U-Net lungs are matched to every template by
  scale (21 steps, 0.7-1.5 x the U-Net lungs' width) and horizontal shift over the upper 55 % of each U-Net
  lung (apex aligned); the 7 best templates vote (pixel majority) for the complete lungs. A lung whose U-Net mask
  covers less than 90 % of the prior's lower third gets the prior's pixels below its own 55 % level added.
* ``shape+edge``: the same, except in columns where the U-Net lung ends on a visible dark-to-bright edge (the
  diaphragm): lung above the border within 40 % of the way from aerated lung to the added region's grey level,
  and at least 25 % of that range brighter below it.
* ``shape+lesion``: the prior's pixels below the 55 % level are added only where the shipped lesion segmenter
  ``lesion_unet_v1`` gives probability >= 0.4 and the component touches the U-Net lung (then closed within the
  prior).

On shippable films the film's own template is left out (leave-one-out); the CC BY-NC-SA films were never used
for training the U-Net or building the prior and are reported separately.

* ``hp``, ``hp@prior``, ``hp@prior+edge``: the U-Net run a second time on a high-pass copy of the film (slow
  density removed, :func:`highpass`), where dense basal opacity no longer looks like soft tissue; its lungs are
  united with the first ones: all of them (``hp``), only inside the shape prior (``hp@prior``), and not below a
  U-Net border on a diaphragm edge (``hp@prior+edge``).

* ``depth``, ``depth+edge``, ``depth-gated``, ``depth-gated+edge`` (``--depth-weights FILE``, rounds 3-5,
  ``bench/records/lung_depth_preregistration.md``): the ``shape`` prior with each lung stretched vertically about
  its top row to the lowest row a CNN predicts for that lung from the whole film (``bench/lung_depth_fit.py``),
  then the ``shape`` (``shape+edge``) rule; ``depth-gated`` completes only a lung whose predicted lowest row lies
  more than ``DEPTH_GATE`` of its height below the U-Net's (``+edge``: not in columns ending on a diaphragm edge).
  With ``--nih`` each variant is also applied to the NIH films' U-Net lungs and the heart outline built from them
  is measured (CTR AUROC for NIH Cardiomegaly, No Finding median, heart plausibility, films completed).

* ``hyst@L`` (``bench/records/lung_hysteresis_preregistration.md``): the U-Net's probabilities on the cached
  working-grid pixels, post-processed with hysteresis (pixels above ``L`` connected to the largest component above
  0.5 join it, :func:`cxrground.anatomy.segment.builtin.postprocess_lungs`); ``unet@px`` is the plain 0.5 rule on
  the same probabilities (the control).

Run: ``python bench/lung_shape_prior.py --cache /tmp/anatomy-cache`` (after ``bench/segment.py --only-real
--cache /tmp/anatomy-cache``; about 3 minutes per variant on one thread; ``--variants shape,shape+edge``).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np
from scipy import ndimage

LEVELS = 96  # row levels per lung in a template
RELIABLE = 0.55  # upper share of each U-Net lung's height used for matching and kept as is
NEIGHBOURS = 7  # templates that vote
SCALES = np.linspace(0.7, 1.5, 21)  # template scale, times the U-Net lungs' width
GATE = 0.9  # complete a lung whose U-Net mask covers less than this share of the prior's lower third
DEPTH_GATE = 0.12  # depth-gated: complete a lung whose predicted lowest row is this share of its height lower
EDGE_DARK, EDGE_STEP = 0.4, 0.25  # shape+edge: diaphragm edge below the U-Net border
LESION_THRESHOLD = 0.4  # shape+lesion: the lesion segmenter's pixel threshold (its sidecar's)
HIGHPASS_SIGMA = 0.08  # hp*: Gaussian sigma of the subtracted background, times the film's longest side


def highpass(pixels: np.ndarray) -> np.ndarray:
    """8-bit film with its slow density removed: 1-99 % rescale, minus a Gaussian blur (HIGHPASS_SIGMA), 1-99 %
    rescale again. Dense basal opacity loses its brightness; edges and texture stay."""
    x = pixels.astype(np.float64)
    lo, hi = np.percentile(x, [1, 99])
    x = np.clip((x - lo) / max(1.0, hi - lo), 0, 1)
    y = x - ndimage.gaussian_filter(x, HIGHPASS_SIGMA * max(x.shape))
    lo, hi = np.percentile(y, [1, 99])
    return np.clip(255 * (y - lo) / max(1e-6, hi - lo), 0, 255).astype(np.uint8)


def _extents(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of a mask from its top to its bottom row, with each row's first and last column (NaN if empty)."""
    rows = np.flatnonzero(mask.any(axis=1))
    ys = np.arange(rows[0], rows[-1] + 1)
    sub = mask[ys]
    has = sub.any(axis=1)
    first = np.where(has, np.argmax(sub, axis=1), np.nan)
    last = np.where(has, mask.shape[1] - 1 - np.argmax(sub[:, ::-1], axis=1), np.nan)
    return ys.astype(float), first.astype(float), last.astype(float)


def _frame(right: np.ndarray, left: np.ndarray) -> tuple[float, float, float]:
    """Top row, horizontal centre and width of both lungs."""
    lungs = right | left
    rows, cols = np.flatnonzero(lungs.any(axis=1)), np.flatnonzero(lungs.any(axis=0))
    return float(rows[0]), (cols[0] + cols[-1]) / 2.0, float(cols[-1] - cols[0])


def template(right: np.ndarray, left: np.ndarray) -> np.ndarray:
    """(2 lungs, 3, LEVELS): normalised row, first and last column of each lung at LEVELS rows."""
    top, centre, width = _frame(right, left)
    out = []
    for mask in (right, left):
        ys, first, last = _extents(mask)
        t = np.linspace(ys[0], ys[-1], LEVELS)
        ok_f, ok_l = ~np.isnan(first), ~np.isnan(last)
        out.append(np.stack([(t - top) / width, (np.interp(t, ys[ok_f], first[ok_f]) - centre) / width,
                             (np.interp(t, ys[ok_l], last[ok_l]) - centre) / width]))
    return np.stack(out)


def _render(tmpl: np.ndarray, top: float, centre: float, scale: float, shape: tuple[int, int]) -> list[np.ndarray]:
    """The template's two lungs drawn at ``scale`` pixels per unit, apex row ``top``, centre column ``centre``."""
    masks = []
    for lung in tmpl:
        y, a, b = top + scale * lung[0], centre + scale * lung[1], centre + scale * lung[2]
        mask = np.zeros(shape, bool)
        rows = np.arange(max(0, int(np.ceil(y[0]))), min(shape[0], int(np.floor(y[-1])) + 1))
        if rows.size:
            xs = np.arange(shape[1])[None, :]
            lo, hi = np.round(np.interp(rows, y, a)), np.round(np.interp(rows, y, b))
            mask[rows] = (xs >= lo[:, None]) & (xs <= hi[:, None])
        masks.append(mask)
    return masks


def shape_prior(right: np.ndarray, left: np.ndarray, templates: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Complete right and left lungs voted by the NEIGHBOURS templates that best match the U-Net's upper lungs."""
    top, centre, width = _frame(right, left)
    obs = []
    for mask in (right, left):
        ys, first, last = _extents(mask)
        sel = np.linspace(0, int(RELIABLE * len(ys)) - 1, 20).astype(int)
        obs.append((ys[sel], first[sel], last[sel]))
    fits = []
    for i, tmpl in enumerate(templates):
        best = (np.inf, 0.0, 0.0)
        for s in SCALES:
            scale, res, outside = s * width, [], 0
            for lung, (ys, first, last) in zip(tmpl, obs, strict=True):
                yn = (ys - top) / scale
                inside = (yn >= lung[0][0]) & (yn <= lung[0][-1])
                outside += int((~inside).sum())
                res += [(first - centre - scale * np.interp(yn, lung[0], lung[1]))[inside],
                        (last - centre - scale * np.interp(yn, lung[0], lung[2]))[inside]]
            r = np.concatenate(res)
            r = r[~np.isnan(r)]
            shift = float(np.median(r)) if r.size else 0.0
            cost = float(np.sqrt(np.mean((r - shift) ** 2))) / width + 0.1 * outside / 80 if r.size else np.inf
            if cost < best[0]:
                best = (cost, scale, shift)
        fits.append((best[0], i, best[1], best[2]))
    fits.sort()
    votes = np.zeros((2, *right.shape))
    for _, i, scale, shift in fits[:NEIGHBOURS]:
        votes += np.stack(_render(templates[i], top, centre + shift, scale, right.shape))
    return votes[0] >= NEIGHBOURS / 2, votes[1] >= NEIGHBOURS / 2


def stretch_to(mask: np.ndarray, bottom: float) -> np.ndarray:
    """``mask`` stretched or compressed vertically about its top row so that its lowest row is ``bottom``
    (nearest-row resampling; rows past the canvas are dropped)."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size < 2:
        return mask
    top, low = int(rows[0]), int(rows[-1])
    new_low = int(np.clip(round(bottom), top + 1, mask.shape[0] - 1))
    ys = np.arange(top, new_low + 1)
    src = np.clip(np.rint(top + (ys - top) * (low - top) / (new_low - top)).astype(int), top, low)
    out = np.zeros_like(mask)
    out[ys] = mask[src]
    return out


class DepthModel:
    """The lung-depth regressor of ``bench/lung_depth_fit.py``: each lung's lowest canvas row for a film."""

    def __init__(self, path: str) -> None:
        import torch
        from lung_depth_fit import build_net

        blob = torch.load(path, map_location="cpu", weights_only=False)
        self.net = build_net()
        self.net.load_state_dict(blob["state_dict"])
        self.net.eval()
        self.size = int(blob["size"])

    def bottoms(self, pixels: np.ndarray) -> tuple[float, float]:
        """Predicted lowest rows (canvas pixels) of the right and left lung of a 0-255 canvas."""
        import torch
        from lung_depth_fit import square_resize

        x = square_resize(np.asarray(pixels, dtype=np.float32), self.size) / 255.0
        with torch.no_grad():
            pred = self.net(torch.from_numpy(x[None, None].astype(np.float32)))[0].numpy()
        n = max(pixels.shape)
        y0 = (n - pixels.shape[0]) // 2
        return float(pred[1] * n - y0 - 1), float(pred[3] * n - y0 - 1)


def _largest_filled(mask: np.ndarray) -> np.ndarray:
    mask = ndimage.binary_fill_holes(mask)
    lab, n = ndimage.label(mask)
    if n > 1:
        mask = lab == 1 + int(np.argmax(ndimage.sum(mask, lab, range(1, n + 1))))
    return mask


def complete(variant: str, right: np.ndarray, left: np.ndarray, pixels: np.ndarray, templates: list[np.ndarray],
             lesion: np.ndarray | None = None, depth: tuple[float, float] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """The lungs completed by ``variant`` (module docstring); ``depth``: the predicted lowest rows (``depth*``)."""
    priors = shape_prior(right, left, templates)
    if variant.startswith("depth"):
        priors = (stretch_to(priors[0], depth[0]), stretch_to(priors[1], depth[1]))
    if variant.startswith("hp"):
        return _with_highpass(variant, right, left, pixels, priors, lesion)
    out = []
    for side, (mask, prior, other) in enumerate(((right, priors[0], left), (left, priors[1], right))):
        rows = np.flatnonzero(mask.any(axis=1))
        keep = int(rows[0] + RELIABLE * (rows[-1] - rows[0]))
        add = prior & ~mask & ~other
        add[:keep] = False
        if variant == "shape+lesion":
            cand = add & (lesion >= LESION_THRESHOLD)
            lab, _ = ndimage.label(cand)
            touch = np.unique(lab[ndimage.binary_dilation(mask, iterations=2) & cand])
            new = mask | np.isin(lab, touch[touch > 0])
            out.append(_largest_filled(ndimage.binary_closing(new, iterations=3) & (prior | mask) & ~other))
            continue
        if variant in ("depth-gated", "depth-gated+edge"):
            bottom = depth[side]
            if bottom - rows[-1] > DEPTH_GATE * (rows[-1] - rows[0] + 1):
                if variant == "depth-gated+edge":
                    _spare_diaphragm_columns(add, mask, pixels, keep)
                out.append(_largest_filled(mask | add))
            else:
                out.append(mask)
            continue
        prow = np.flatnonzero(prior.any(axis=1))
        base = prior.copy()
        base[: int(prow[0] + 2 / 3 * (prow[-1] - prow[0]))] = False
        if (mask & base).sum() >= GATE * max(1, base.sum()):
            out.append(mask)
            continue
        if variant in ("shape+edge", "depth+edge"):
            _spare_diaphragm_columns(add, mask, pixels, keep)
        out.append(_largest_filled(mask | add))
    return out[0], out[1] & ~out[0]


def _spare_diaphragm_columns(add: np.ndarray, mask: np.ndarray, pixels: np.ndarray, keep: int) -> None:
    """Clear ``add`` (in place) in every column whose U-Net border lies on a visible diaphragm edge."""
    if add.any():
        for c, _ in _diaphragm_edge_columns(add, mask, pixels, keep, lowest_row=keep):
            add[:, c] = False


def _diaphragm_edge_columns(add: np.ndarray, mask: np.ndarray, pixels: np.ndarray, keep: int,
                            lowest_row: int) -> list[tuple[int, int]]:
    """``(column, lowest lung row)`` of the columns of ``add`` where the lung ``mask`` ends (at or below
    ``lowest_row``) on a diaphragm edge: dark aerated lung just above, a step up in brightness just below (air
    level from the lung above row ``keep``)."""
    h = mask.shape[0]
    air = np.percentile(pixels[mask & (np.arange(h)[:, None] < keep)], 20)
    span = max(1.0, float(np.median(pixels[add]) - air))
    w = max(2, int(0.015 * h))
    out = []
    for c in np.flatnonzero(add.any(axis=0)):
        if not mask[:, c].any():
            continue
        yb = h - 1 - int(np.argmax(mask[::-1, c]))
        if yb < lowest_row:
            continue
        above = (pixels[max(0, yb - 5 * w): yb - w + 1, c].mean() - air) / span
        below = (pixels[yb + w: yb + 3 * w + 1, c].mean() - air) / span if yb + w < h else above
        if above < EDGE_DARK and below - above > EDGE_STEP:
            out.append((int(c), yb))
    return out


def _with_highpass(variant: str, right: np.ndarray, left: np.ndarray, pixels: np.ndarray,
                   priors: tuple[np.ndarray, np.ndarray], hp_lungs: tuple[np.ndarray, np.ndarray]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``hp``: the U-Net's lungs united with its lungs on the high-pass film; ``hp@prior``: only the high-pass lungs'
    pixels inside the shape prior are added; ``hp@prior+edge``: and none in columns where the U-Net lung ends on a
    diaphragm edge (as ``shape+edge``)."""
    out = []
    for mask, prior, extra in ((right, priors[0], hp_lungs[0]), (left, priors[1], hp_lungs[1])):
        add = extra & ~mask
        if variant != "hp":
            add &= prior
        if variant == "hp@prior+edge" and add.any():
            rows = np.flatnonzero(mask.any(axis=1))
            keep = int(rows[0] + RELIABLE * (rows[-1] - rows[0]))
            for c, yb in _diaphragm_edge_columns(add, mask, pixels, keep, lowest_row=0):
                add[yb + 1:, c] = False
        out.append(_largest_filled(mask | add))
    return out[0], out[1] & ~out[0]


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * int((a & b).sum()) / total


def _base_coverage(pred: np.ndarray, truth: np.ndarray) -> float:
    from cxrground.anatomy.ils_locations import lung_zone_bands

    band = lung_zone_bands(truth)["lung base"] & truth
    return float((pred & band).sum() / max(1, band.sum()))


def _below(pred: np.ndarray, truth: np.ndarray) -> float:
    cols = truth.any(axis=0)
    rows = np.arange(truth.shape[0])[:, None]
    lowest = np.where(cols, truth.shape[0] - 1 - np.argmax(truth[::-1], axis=0), -1)
    return float((pred & (rows > lowest[None, :]) & cols[None, :]).sum() / max(1, int(truth.sum())))


def _report(name: str, rows: list[dict]) -> None:
    for label, sel in (("all 205", rows), ("CC BY-NC-SA only (never trained or fitted on)",
                                           [r for r in rows if not r["shippable"]])):
        dice = np.asarray([d for r in sel for d in r["dice"]])
        below = np.asarray([b for r in sel for b in r["below"]])
        brixia = [r for r in sel if r["brixia"]]
        low = [(r["id"], round(min(r["base"]), 2)) for r in brixia if min(r["base"]) < 0.7]
        print(f"{name:<13} {label}: Dice median {np.median(dice):.4f} mean {dice.mean():.4f} lungs < 0.8 "
              f"{int((dice < 0.8).sum())}; below base median {np.median(below):.4f} films with a lung > 5 % "
              f"{sum(max(r['below']) > 0.05 for r in sel)}; Brixia films {len(brixia)}, bases < 70 %: {len(low)} {low}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", required=True, help="folder written by bench/segment.py --only-real --cache")
    parser.add_argument("--variants", default="unet,shape,shape+edge,shape+lesion,hp,hp@prior,hp@prior+edge")
    parser.add_argument("--depth-weights", default=None, help="lung-depth regressor of bench/lung_depth_fit.py")
    parser.add_argument("--nih", action="store_true", help="also apply the variants to the NIH films (heart, CTR)")
    args = parser.parse_args()

    import torch

    from cxrground.datasets.pack import Pack

    torch.set_num_threads(1)
    recs = Pack().cohen()
    films = {r.image_id: np.load(Path(args.cache) / f"cohen_{r.image_id}.npz") for r in recs}
    templates = {r.image_id: template(films[r.image_id]["GR"].astype(bool), films[r.image_id]["GL"].astype(bool))
                 for r in recs if r.shippable}
    print(f"shape prior: {len(templates)} templates (shippable-licence rows; leave-one-out on those rows)")
    variants = args.variants.split(",")
    hp_lungs: dict = {}
    lesions: dict = {}
    if any(v.startswith("hp") for v in variants):
        from cxrground.anatomy.segment import UNetLungSegmenter
        from cxrground.anatomy.segment.builtin import postprocess_lungs
        from cxrground.io.cxr_image import CXRImage

        unet = UNetLungSegmenter(threads=1)
        for i, f in films.items():
            p_r, p_l, _ = unet.probabilities(CXRImage(highpass(f["px"])))
            hp_lungs[i] = postprocess_lungs(p_r, p_l, unet.threshold)
    if "shape+lesion" in variants:
        from cxrground.lesions.segmenter import LesionSegmenter

        seg = LesionSegmenter(threads=1)
        lesions = {i: seg.probability(np.clip(f["px"], 0, 255).astype(np.uint8)) for i, f in films.items()}
    wants_depth = any(v.startswith("depth") for v in variants)
    if wants_depth and not args.depth_weights:
        raise SystemExit("the depth variants need --depth-weights")
    depth = DepthModel(args.depth_weights) if wants_depth else None
    bottoms = {} if depth is None else {i: depth.bottoms(f["px"]) for i, f in films.items()}
    if bottoms:
        err = []
        for rec in recs:
            if rec.shippable:
                continue
            f = films[rec.image_id]
            for k, truth in enumerate((f["GR"], f["GL"])):
                rows = np.flatnonzero(truth.any(axis=1))
                err.append(abs(bottoms[rec.image_id][k] - rows[-1]) / (rows[-1] - rows[0] + 1))
        e = 100 * np.asarray(err)
        print(f"depth regressor on the CC BY-NC-SA films: lowest-row error median {np.median(e):.1f} %, 90th "
              f"percentile {np.percentile(e, 90):.1f} % of the annotated lung's height ({e.size} lungs)")
    probs: dict = {}
    if any(_is_prob_variant(v) for v in variants):
        probs = {i: _lung_probabilities(f["px"]) for i, f in films.items()}
    for variant in variants:
        rows = []
        for rec in recs:
            f = films[rec.image_id]
            right, left, gr, gl = (f[k].astype(bool) for k in ("R", "L", "GR", "GL"))
            if _is_prob_variant(variant):
                right, left = _from_probabilities(variant, *probs[rec.image_id])
            elif variant != "unet":
                tm = [t for k, t in templates.items() if k != rec.image_id]
                right, left = complete(variant, right, left, f["px"].astype(float), tm,
                                       (hp_lungs if variant.startswith("hp") else lesions).get(rec.image_id),
                                       bottoms.get(rec.image_id))
            rows.append({"id": rec.image_id, "shippable": rec.shippable, "brixia": rec.brixia is not None,
                         "dice": (_dice(right, gr), _dice(left, gl)), "below": (_below(right, gr), _below(left, gl)),
                         "base": (_base_coverage(right, gr), _base_coverage(left, gl))})
        _report(variant, rows)
        if args.nih:
            _nih_report(variant, Path(args.cache), list(templates.values()), depth)


def _is_prob_variant(variant: str) -> bool:
    return variant == "unet@px" or variant.startswith("hyst@")


@functools.cache
def _shipped_unet():
    """The shipped lung U-Net (one thread), loaded once."""
    from cxrground.anatomy.segment import UNetLungSegmenter

    return UNetLungSegmenter(threads=1)


def _lung_probabilities(px: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The shipped lung U-Net's right and left probabilities on working-grid pixels."""
    from cxrground.io.cxr_image import CXRImage

    p_r, p_l, _ = _shipped_unet().probabilities(CXRImage(np.clip(px, 0, 255).astype(np.uint8)))
    return p_r, p_l


def _from_probabilities(variant: str, p_r: np.ndarray, p_l: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``unet@px``: the plain 0.5 rule; ``hyst@L``: hysteresis down to ``L``."""
    from cxrground.anatomy.segment.builtin import postprocess_lungs

    low = None if variant == "unet@px" else float(variant.split("@", 1)[1])
    return postprocess_lungs(p_r, p_l, 0.5, low)


def _nih_report(variant: str, cache: Path, templates: list[np.ndarray], depth: DepthModel | None) -> None:
    """The heart outline on the NIH films with ``variant``'s lungs: CTR AUROC, No Finding median, plausibility."""
    from segment import _auroc, heart_plausibility

    from cxrground.anatomy.ctr import cardiothoracic_ratio
    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.datasets.pack import Pack

    ctr, cm, nf, changed, bad = [], [], [], 0, {}
    for rec in Pack().nih():
        f = np.load(cache / f"nih_{rec.image_id}.npz")
        right, left = f["R"].astype(bool), f["L"].astype(bool)
        if not right.any() or not left.any():
            continue
        if _is_prob_variant(variant):
            new_r, new_l = _from_probabilities(variant, *_lung_probabilities(f["px"]))
            changed += int(not (np.array_equal(new_r, right) and np.array_equal(new_l, left)))
            right, left = new_r, new_l
        elif variant != "unet":
            b = depth.bottoms(f["px"]) if depth is not None else None
            new_r, new_l = complete(variant, right, left, f["px"].astype(float), templates, None, b)
            changed += int(not (np.array_equal(new_r, right) and np.array_equal(new_l, left)))
            right, left = new_r, new_l
        heart, _ = heart_from_lungs(right, left, pixels=f["px"])
        if heart is None:
            continue
        for k, v in heart_plausibility(heart, right, left).items():
            bad[k] = bad.get(k, 0) + int(v)
        ctr.append(cardiothoracic_ratio(heart, right, left))
        cm.append("Cardiomegaly" in rec.labels)
        nf.append(rec.labels == ("No Finding",))
    c, cm_a, nf_a = np.asarray(ctr), np.asarray(cm), np.asarray(nf)
    print(f"{variant:<13} NIH: {len(c)} films with a heart, {changed} with a lung completed; CTR AUROC Cardiomegaly "
          f"vs all other {_auroc(c[cm_a], c[~cm_a]):.3f}; No Finding median {np.median(c[nf_a]):.3f}; "
          f"implausible outlines {bad}", flush=True)


if __name__ == "__main__":
    main()
