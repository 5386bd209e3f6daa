"""Segmentation benchmark: the shipped lung U-Net on the pack's evaluation rows, its CPU speed, and the
heart estimate against the synthetic phantoms' exact hearts.

Also the U-Net's lung Dice on synthetic phantoms (exact masks; seed 1000, never trained on).

Run: ``.venv/bin/python bench/segment.py [--phantoms 50] [--nc 0] [--synthetic 40] [--threads 2]``
(``--nc 0`` = all CC BY-NC-SA rows; ``--synthetic 0`` skips the phantom Dice).

``--real [--only-real] [--cache DIR] [--overlays DIR] [--weights FILE]``: the anatomy of every pack film (826: 621
NIH, 205 COVID-19 collection), on the working grid of the built-in segmenter (U-Net lungs; seen-border heart): the
films whose lungs fail the lung plausibility check, plausibility counts of the heart outline (top above the carina
level, any heart pixel below the lowest lung row, below its side's lung base (right of the mediastinal midline:
below the right lung's lowest row; left of it: below the left lung's; the films are named) or below the
hemidiaphragm line, outside the thorax, apex cut flat; the outlines whose floor
:func:`~cxrground.anatomy.segment.heart.floor_warning` calls uncertain, and the percentiles of
:func:`~cxrground.anatomy.segment.heart.floor_drop` on the pack's lung masks), the U-Net's lung-base coverage of the
pack's masks on the Brixia-scored films and its per-lung Dice on all 205 annotated films, the CTR AUROC of the NIH
Cardiomegaly label against all other NIH films (nothing tuned on them in this script) and the CTR distribution of
the No Finding films against adult PA norms. ``--cache`` keeps the U-Net's lungs per film (rerun is fast; the folder
is tied to the sha256 of the weights, and lungs of other weights are never reused); ``--overlays`` writes one
overlay PNG per film of fixed lists and their sheets (``overlays-20.png``, ``nih-random-10-and-high-tops.png``,
``heart-floor-bases.png``: films whose left cardiophrenic angle lies far below the right lung's base). Rows that
need the pack (``CXRGROUND_PACK`` or ``../shared/data/cxr-pack-v1``) are skipped with a note when it is missing.
Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

import numpy as np
from foundation import timed  # the bench scripts share one timing helper

#: Approximate level of the carina, as a fraction of the lung height (apex 0, lowest lung row 1): about the 5th
#: thoracic vertebra on an adult PA film. A heart top above it is the aortic knob or the hila, not the heart.
CARINA_FRACTION = 0.35


def heart_plausibility(heart: np.ndarray, right: np.ndarray, left: np.ndarray) -> dict[str, bool]:
    """The implausibilities of one heart outline (see the module docstring); True = the defect is present."""
    from cxrground.anatomy.segment.builtin import _mediastinal_midline
    from cxrground.anatomy.segment.heart import _hull_mask, diaphragm_line

    lungs = right | left
    rows = np.flatnonzero(lungs.any(axis=1))
    y0, y1 = int(rows[0]), int(rows[-1])
    ys, xs = np.nonzero(heart)
    tol = 0.01 * (y1 - y0)
    mid = _mediastinal_midline(right, left)
    mid = 0.5 * (xs.min() + xs.max()) if mid is None else mid
    base_r, base_l = (int(np.flatnonzero(m.any(axis=1))[-1]) for m in (right, left))
    floor = diaphragm_line(right, left)
    outside = int((heart & ~_hull_mask(lungs)).sum())
    x_far = xs.max()  # the apex side (patient's left = image right)
    apex_rows = ys[xs >= x_far - 1]
    return {
        "top above carina": bool(ys.min() < y0 + CARINA_FRACTION * (y1 - y0)),
        "below the lung bases": bool(ys.max() > y1 + tol),
        "below its side's base": bool(((ys > base_r + tol) & (xs < mid)).any()
                                      or ((ys > base_l + tol) & (xs >= mid)).any()),
        "below the hemidiaphragm": bool((ys > floor[xs] + tol).any()),
        "outside the thorax": bool(outside > 0.005 * ys.size),
        "apex cut flat": bool(apex_rows.max() >= ys.max() - 0.03 * (ys.max() - ys.min())),
    }


def _auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    allv = np.concatenate([pos, neg])
    ranks = np.argsort(np.argsort(allv, kind="mergesort"), kind="mergesort") + 1.0
    for v in np.unique(allv):  # mid-ranks for ties
        sel = allv == v
        ranks[sel] = ranks[sel].mean()
    return float((ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2) / (pos.size * neg.size))


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * int((a & b).sum()) / total


#: Films drawn by ``--overlays`` (image ids): normal, cardiomegaly, portable and consolidated-base films.
OVERLAY_FILMS = (
    "00000129_000", "00000427_000", "00000550_000", "00000679_000",  # NIH No Finding
    "00000075_000", "00000211_000", "00000442_000", "00003015_000", "00007164_000", "00025631_000",  # Cardiomegaly
    "covid-19-pneumonia-mild", "jkms-35-e79-g001-l-a", "covid-19-pneumonia-24-day12",  # portable AP
    "covid-19-pneumonia-evolution-over-a-week-1-day3",
    "covid-19-rapidly-progressive-acute-respiratory-distress-syndrome-ards-day-2",  # consolidated bases
    "covid-19-rapidly-progressive-acute-respiratory-distress-syndrome-ards-day-3",
    "covid-19-pneumonia-40", "covid-19-pneumonia-23-day3", "covid-19-pneumonia-58-day-9", "16708_4_1",
    "16708_5_1", "covid-19-pneumonia-30-PA",
)


#: Films of ``--overlays``' ``heart-floor-bases.png``: left cardiophrenic angles far below the right lung's base.
FLOOR_FILMS = (
    "00013553_000", "00025081_000", "00023007_000", "00020218_000",
    "covid-19-pneumonia-progression-and-regression-day24", "00001528_000", "00000282_000", "00009047_000",
    "16708_5_1", "covid-19-pneumonia-12", "covid-19-pneumonia-49-day8", "ee2d1bf6",
)


def below_base(pred: np.ndarray, gt: np.ndarray) -> float:
    """Share of the annotated lung's area that ``pred`` puts below it: predicted pixels under the annotation's
    lowest row in their column (the diaphragm / costophrenic angle), in the columns the annotation covers."""
    cols = gt.any(axis=0)
    if not cols.any():
        return 0.0
    rows = np.arange(gt.shape[0])[:, None]
    lowest = np.where(cols, gt.shape[0] - 1 - np.argmax(gt[::-1], axis=0), -1)
    return float((pred & (rows > lowest[None, :]) & cols[None, :]).sum() / max(1, int(gt.sum())))


def cached_lungs(seg, folder, src: str, rec):
    """The film on the working grid as the commands read it (``px``: its grey-level negative when
    ``segment_checked`` reads it so, ``inverted``), the U-Net's lungs (``R``, ``L``) and, for COVID-19 rows, the
    pack's lungs (``GR``, ``GL``), from ``folder/{src}_{id}.npz`` (written on first use)."""
    from cxrground.anatomy.segment.builtin import postprocess_lungs, work_box
    from cxrground.anatomy.segment.plausibility import segment_checked
    from cxrground.anatomy.segment.tilt import turn

    path = folder / f"{src}_{rec.image_id}.npz"
    if not path.is_file():
        im, masks, _ = segment_checked(seg, rec.read())  # the film the commands read: its negative when inverted
        box = work_box(im.shape)
        px = im.pixels if box is None else box.image_to_canvas(im.pixels)
        tilt = masks.extra.get("tilt") if masks.extra.get("tilt_kept") else None
        if tilt is None:  # the working-grid lungs (native -> working gives them back exactly: work_box)
            right, left = ((masks.right_lung, masks.left_lung) if box is None else
                           (box.mask_to_canvas(masks.right_lung), box.mask_to_canvas(masks.left_lung)))
        else:  # deskew: the film read upright, on the working grid (the pack's lungs turned with it)
            px = turn(px, tilt)
            right, left = postprocess_lungs(*seg.probabilities(dataclasses.replace(im, pixels=px))[:2],
                                            seg.threshold)
        data = {"px": px.astype(np.float32), "R": right, "L": left, "inverted": "polarity" in masks.extra,
                "tilt": np.nan if tilt is None else tilt}
        if src == "cohen":
            gr, gl = rec.lungs(im.shape)
            gr, gl = (gr, gl) if box is None else (box.mask_to_canvas(gr), box.mask_to_canvas(gl))
            data.update(GR=gr if tilt is None else turn(gr, tilt, mask=True),
                        GL=gl if tilt is None else turn(gl, tilt, mask=True))
        np.savez_compressed(path, **data)
    return np.load(path)


def _claim_cache(folder, weights, content_box: bool = False, deskew: bool = False) -> None:
    """Tie a ``--cache`` folder to one weights file and border rule (its sha256, ``content_box=on|off`` and the
    polarity check in ``weights.sha256``): lungs cached with other weights or the other rule are never reused; a
    folder holding lungs but no record is refused too (its weights are unknown)."""
    import hashlib

    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    record = f"{digest}  {weights.name}  content_box={'on' if content_box else 'off'}  polarity=checked"
    record += "  deskew=on" if deskew else ""
    mark = folder / "weights.sha256"
    if mark.is_file():
        if mark.read_text().strip() != record:
            raise SystemExit(f"{folder}: cached lungs of other weights or borders ({mark.read_text().strip()}); "
                             "use a new --cache")
    elif any(folder.glob("*.npz")):
        raise SystemExit(f"{folder}: cached lungs without a weights record; use a new --cache")
    else:
        mark.write_text(record + "\n")


def monotone_lateral_border(mask: np.ndarray, side: str, anchor: str = "widest") -> np.ndarray:
    """``mask`` (one lung; ``side`` ``right`` = image left, or ``left``) without what lies lateral to its lateral
    border above its widest row, where the border may only move medially going up (a lung narrows towards its
    apex; a blob over the shoulder does not); then the largest 8-connected component, holes filled."""
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    m = np.asarray(mask, bool).copy()
    rows = np.flatnonzero(m.any(axis=1))
    if not len(rows):
        return m
    flip = side == "left"
    work = m[:, ::-1] if flip else m  # the lateral side on the left of ``work``
    lateral = np.array([int(np.argmax(work[y])) if work[y].any() else work.shape[1] for y in range(work.shape[0])])
    candidates = rows if anchor == "widest" else rows[rows > (rows[0] + rows[-1]) // 2]  # "lower": lower half
    widest = int(candidates[np.flatnonzero(lateral[candidates] == lateral[candidates].min())[-1]])
    limit = int(lateral[widest])
    for y in range(widest - 1, int(rows[0]) - 1, -1):
        if work[y].any():
            limit = max(limit, int(lateral[y]))
            work[y, :limit] = False
    out = work[:, ::-1] if flip else work
    from scipy import ndimage

    from cxrground.anatomy.percept_regions import largest_component

    return ndimage.binary_fill_holes(largest_component(out))


def real_films(threads: int, cache: str | None, overlays: str | None, weights: str | None = None,
               repair_apex: str | None = None, heart_params=None, content_box: bool = False,
               deskew: bool = False) -> None:
    """The ``--real`` rows (module docstring); ``heart_params``: the heart outline's
    :class:`~cxrground.anatomy.segment.heart.HeartEstimateParams` (None: the defaults)."""
    import tempfile

    from cxrground.anatomy.ils_locations import lung_zone_bands
    from cxrground.anatomy.segment import UNetLungSegmenter
    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.anatomy.segment.heart import floor_drop
    from cxrground.anatomy.segment.plausibility import lung_problems
    from cxrground.datasets.pack import Pack

    pack = Pack()
    seg = UNetLungSegmenter(weights, threads=threads, content_box=content_box, deskew=deskew)
    folder = Path(cache or tempfile.mkdtemp(prefix="cxrground-real-anatomy-"))
    folder.mkdir(parents=True, exist_ok=True)
    _claim_cache(folder, seg.weights, seg.content_box, seg.deskew)
    recs = [("nih", r) for r in pack.nih()] + [("cohen", r) for r in pack.cohen()]
    start = time.perf_counter()
    rows = []
    for src, rec in recs:
        d = cached_lungs(seg, folder, src, rec)
        right, left = d["R"].astype(bool), d["L"].astype(bool)
        if repair_apex:  # bench/records/lung_apex_preregistration.md
            right = monotone_lateral_border(right, "right", repair_apex)
            left = monotone_lateral_border(left, "left", repair_apex) & ~right
        heart, info = heart_from_lungs(right, left, heart_params, pixels=d["px"])
        row = {"src": src, "rec": rec, "ctr": info.get("ctr", np.nan), "heart": heart is not None,
               "inverted": bool(d["inverted"]), "tilt": None if np.isnan(d["tilt"]) else float(d["tilt"]),
               "lung_problems": lung_problems(right, left),
               "rctr": info.get("ctr_radiological", np.nan),
               "plaus": heart_plausibility(heart, right, left) if heart is not None else {},
               "floor_warning": bool(info.get("floor_warning"))}
        if src == "cohen":
            gr, gl = d["GR"].astype(bool), d["GL"].astype(bool)
            row["dice"] = (_dice(right, gr), _dice(left, gl))
            row["base"] = tuple(float((pred & lung_zone_bands(gt)["lung base"] & gt).sum() /
                                      max(1, (lung_zone_bands(gt)["lung base"] & gt).sum()))
                                for pred, gt in ((right, gr), (left, gl)))
            row["below"] = (below_base(right, gr), below_base(left, gl))
            row["drop_annotated"] = floor_drop(gr, gl) if gr.any() and gl.any() else None
        if overlays and rec.image_id in OVERLAY_FILMS:
            _overlay(Path(overlays) / f"{rec.image_id}.png", d["px"], right, left, heart, info)
        if overlays and rec.image_id in FLOOR_FILMS:
            _overlay(Path(overlays) / "floor-panels" / f"{rec.image_id}.png", d["px"], right, left, heart, info)
        rows.append(row)
    if overlays:
        _overlay_sheet(Path(overlays))
        _floor_sheet(Path(overlays))
        _random_sheet(seg, folder, Path(overlays), rows, heart_params)
    print(f"\n## Real films: {len(rows)} pack films ({time.perf_counter() - start:.0f} s; lungs cached in {folder})")
    lungs_bad = [r for r in rows if r["lung_problems"]]
    n_bad_nih = sum(r["src"] == "nih" for r in lungs_bad)
    print(f"implausible lungs (anatomy.segment.plausibility): {len(lungs_bad)} of {len(rows)} films (NIH {n_bad_nih}, "
          f"COVID-19 collection {len(lungs_bad) - n_bad_nih}): {', '.join(r['rec'].image_id for r in lungs_bad)}")
    if deskew:
        upright = [r["rec"].image_id for r in rows if r["tilt"] is not None]
        print(f"films read upright (deskew; measured on the upright working grid, the pack's lungs turned with the "
              f"film): {len(upright)}")
    negatives = [r["rec"].image_id for r in rows if r["inverted"]]
    print(f"films read as their grey-level negative (segment_checked, as the commands read them): {len(negatives)} "
          f"{negatives}")
    hearts = [r for r in rows if r["heart"]]
    print(f"heart outline on {len(hearts)} of {len(rows)} films; implausible outlines:")
    for key in ("top above carina", "below the lung bases", "below its side's base", "below the hemidiaphragm",
                "outside the thorax", "apex cut flat"):
        n_nih = sum(r["plaus"][key] for r in hearts if r["src"] == "nih")
        n_all = sum(r["plaus"][key] for r in hearts)
        print(f"  {key:<26} {n_all:4d} of {len(hearts)}  (NIH {n_nih}, COVID-19 collection {n_all - n_nih})")
        if key == "below its side's base":
            print(f"    {[r['rec'].image_id for r in hearts if r['plaus'][key]]}")
    floor = [r["rec"].image_id for r in hearts if r["floor_warning"]]
    print(f"heart floor uncertain (floor_warning): {len(floor)} of {len(hearts)} {floor}")
    cohen = [r for r in rows if r["src"] == "cohen"]
    drops = np.asarray([r["drop_annotated"] for r in cohen if r["drop_annotated"] is not None])
    print(f"left cardiophrenic angle below the right lung base (floor_drop, share of the lung height) on the pack's "
          f"lung masks, {drops.size} films: 50th/95th/99th percentile "
          f"{' / '.join(f'{v:.3f}' for v in np.percentile(drops, [50, 95, 99]))}")
    dice = np.asarray([d for r in cohen for d in r["dice"]])
    print(f"lung U-Net vs the pack's masks, {len(cohen)} films (per lung, working grid, no ignore region): Dice median "
          f"{np.median(dice):.4f} mean {dice.mean():.4f}, lungs < 0.8: {int((dice < 0.8).sum())}")
    brixia = [r for r in cohen if r["rec"].brixia is not None]
    base = np.asarray([r["base"] for r in brixia])
    low = [(r["rec"].image_id, round(min(r["base"]), 2)) for r in brixia if min(r["base"]) < 0.7]
    print(f"lung-base coverage of the pack's masks on the {len(brixia)} Brixia-scored films: median right "
          f"{np.median(base[:, 0]):.3f} left {np.median(base[:, 1]):.3f}; films with a base < 70 % covered: "
          f"{len(low)} {low}")
    below = np.asarray([b for r in cohen for b in r["below"]])
    leaks = sorted(((r["rec"].image_id, round(max(r["below"]), 3)) for r in cohen if max(r["below"]) > 0.05),
                   key=lambda t: -t[1])
    print(f"lung below the pack mask's base (share of the annotated lung's area, per lung, {len(cohen)} films): "
          f"median {np.median(below):.4f}, 95th percentile {np.percentile(below, 95):.4f}; films with a lung > 5 %: "
          f"{len(leaks)}, the worst {leaks[:8]}")
    nih = [r for r in hearts if r["src"] == "nih"]
    ctr = np.asarray([r["ctr"] for r in nih])
    cm = np.asarray(["Cardiomegaly" in r["rec"].labels for r in nih])
    normal = np.asarray([r["rec"].labels == ("No Finding",) for r in nih])
    print(f"CTR AUROC, NIH Cardiomegaly vs all other NIH films: {_auroc(ctr[cm], ctr[~cm]):.3f} "
          f"(n+ {int(cm.sum())}, n- {int((~cm).sum())}); vs No Finding only {_auroc(ctr[cm], ctr[normal]):.3f}")
    q = np.percentile(ctr[normal], [25, 50, 75])
    print(f"  No Finding films (n {int(normal.sum())}): median CTR {q[1]:.3f} (IQR {q[0]:.3f}-{q[2]:.3f}); "
          f"{100 * np.mean((ctr[normal] >= 0.42) & (ctr[normal] <= 0.48)):.0f} % in 0.42-0.48, "
          f"{100 * np.mean(ctr[normal] >= 0.5):.0f} % at or above 0.50 (adult PA norm: < 0.50, typical 0.42-0.48)")
    views = np.asarray([r["rec"].view for r in nih])
    for view in ("PA", "AP"):  # the adult norms are PA norms; an AP film magnifies the heart
        v = views == view
        if (v & normal).any() and (v & cm).any() and (v & ~cm).any():
            q = np.percentile(ctr[v & normal], [25, 50, 75])
            print(f"  {view} films only (n {int(v.sum())}): No Finding (n {int((v & normal).sum())}) median CTR "
                  f"{q[1]:.3f} (IQR {q[0]:.3f}-{q[2]:.3f}); AUROC Cardiomegaly (n {int((v & cm).sum())}) vs all other "
                  f"{view} films {_auroc(ctr[v & cm], ctr[v & ~cm]):.3f}")
    q = np.percentile(ctr[cm], [25, 50, 75])
    print(f"  Cardiomegaly films (n {int(cm.sum())}): median CTR {q[1]:.3f} (IQR {q[0]:.3f}-{q[2]:.3f}); "
          f"{100 * np.mean(ctr[cm] <= 0.45):.0f} % pass the ILS negative rule CTR <= 0.45")
    rctr = np.asarray([r["rctr"] for r in nih])
    ok = np.isfinite(rctr)
    print(f"radiological CTR (MRD + MLD over the maximal internal thoracic diameter), {int(ok.sum())} NIH films: "
          f"AUROC Cardiomegaly vs all other {_auroc(rctr[cm & ok], rctr[~cm & ok]):.3f}")
    q = np.percentile(rctr[normal & ok], [25, 50, 75])
    print(f"  No Finding: median {q[1]:.3f} (IQR {q[0]:.3f}-{q[2]:.3f}); "
          f"{100 * np.mean((rctr[normal & ok] >= 0.42) & (rctr[normal & ok] <= 0.48)):.0f} % in 0.42-0.48, "
          f"{100 * np.mean(rctr[normal & ok] >= 0.5):.0f} % at or above 0.50; Cardiomegaly: median "
          f"{np.median(rctr[cm & ok]):.3f}, {100 * np.mean(rctr[cm & ok] <= 0.45):.0f} % at or below 0.45")


def _overlay_sheet(folder: Path, count: int = 20, columns: int = 5) -> None:
    """``folder/overlays-20.png``: the first ``count`` overlays of :data:`OVERLAY_FILMS` in a grid (the anatomy
    benchmark page's figure)."""
    from PIL import Image

    from cxrground.io.overlay import contact_sheet

    panels = [np.asarray(Image.open(folder / f"{name}.png").convert("RGB")) for name in OVERLAY_FILMS[:count]
              if (folder / f"{name}.png").is_file()]
    if panels:
        Image.fromarray(contact_sheet(panels, columns=columns)).save(folder / f"overlays-{count}.png", optimize=True)


def _floor_sheet(folder: Path, columns: int = 4) -> None:
    """``folder/heart-floor-bases.png``: the overlays of :data:`FLOOR_FILMS` in a grid."""
    from PIL import Image

    from cxrground.io.overlay import contact_sheet

    panels = [np.asarray(Image.open(folder / "floor-panels" / f"{name}.png").convert("RGB")) for name in FLOOR_FILMS
              if (folder / "floor-panels" / f"{name}.png").is_file()]
    if panels:
        Image.fromarray(contact_sheet(panels, columns=columns)).save(folder / "heart-floor-bases.png", optimize=True)


def _random_sheet(seg, folder: Path, out: Path, rows: list[dict], heart_params=None, seed: int = 1) -> None:
    """``out/nih-random-10-and-high-tops.png``: overlays of ten NIH films drawn at random (``seed``) and of the
    first five NIH films whose heart outline starts above the carina level (rows of five)."""
    from PIL import Image

    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.io.overlay import contact_sheet

    nih = [r for r in rows if r["src"] == "nih" and r["heart"]]
    drawn = [nih[i] for i in sorted(np.random.default_rng(seed).choice(len(nih), 10, replace=False))]
    high = [r for r in nih if r["plaus"].get("top above carina")][:5]
    panels = []
    for r in drawn + high:
        d = cached_lungs(seg, folder, "nih", r["rec"])
        right, left = d["R"].astype(bool), d["L"].astype(bool)
        heart, info = heart_from_lungs(right, left, heart_params, pixels=d["px"])
        path = out / "sheet-panels" / f"{r['rec'].image_id}.png"
        _overlay(path, d["px"], right, left, heart, info)
        panels.append(np.asarray(Image.open(path).convert("RGB")))
    Image.fromarray(contact_sheet(panels, columns=5)).save(out / "nih-random-10-and-high-tops.png", optimize=True)


def _overlay(path, px: np.ndarray, right: np.ndarray, left: np.ndarray, heart: np.ndarray | None,
             info: dict) -> None:
    """A small RGB overlay: lungs blue/green outlines, heart red outline, the CTR's diameters (heart orange,
    thorax magenta), CTR written in the corner."""
    from PIL import Image, ImageDraw
    from scipy import ndimage

    from cxrground.anatomy.ctr import measure_ctr
    from cxrground.anatomy.segment.output import DIAMETER_COLOURS
    from cxrground.io.overlay import draw_rows

    g = px.astype(np.float64)
    g = np.clip(255 * (g - np.percentile(g, 1)) / max(1e-6, np.percentile(g, 99) - np.percentile(g, 1)), 0, 255)
    rgb = np.repeat(g.astype(np.uint8)[:, :, None], 3, axis=2)
    for mask, colour in ((right, (60, 140, 255)), (left, (60, 220, 90)), (heart, (255, 60, 60))):
        if mask is None:
            continue
        edge = mask & ~ndimage.binary_erosion(mask, iterations=2)
        rgb[edge] = colour
    if heart is not None:  # the two diameters of ``ctr``: heart orange, thorax magenta
        m = measure_ctr(heart, right, left)
        rgb = draw_rows(rgb, [(d.y, d.x0, d.x1) for d in (m.cardiac, m.thoracic)], DIAMETER_COLOURS)
    im = Image.fromarray(rgb)
    if max(im.size) > 384:
        im = im.resize((round(im.width * 384 / max(im.size)), round(im.height * 384 / max(im.size))))
    ImageDraw.Draw(im).text((4, 4), f"{path.stem}  CTR {info.get('ctr', float('nan')):.2f}", fill=(255, 255, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path, optimize=True)


def add_reading_options(parser: argparse.ArgumentParser, scope: str = "") -> None:
    """``--content-box`` and ``--deskew``: the built-in segmenter's options for films in frames or turned (the
    bench scripts that read pack films share them)."""
    parser.add_argument("--content-box", action="store_true",
                        help=f"{scope}the U-Net reads inside the film's uniform borders (unet content_box=true)")
    parser.add_argument("--deskew", action="store_true",
                        help=f"{scope}a film the lungs say is tilted is read upright (unet deskew=true)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--phantoms", type=int, default=50, help="synthetic phantoms for the heart estimate")
    parser.add_argument("--nc", type=int, default=0, help="NC evaluation rows to use (0 = all)")
    parser.add_argument("--synthetic", type=int, default=40, help="phantoms (seed 1000) for the U-Net lung Dice")
    parser.add_argument("--synthetic-seed", type=int, default=1000, help="seed of those phantoms")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the U-Net")
    parser.add_argument("--real", action="store_true", help="the real-film anatomy rows (all 826 pack films)")
    parser.add_argument("--only-real", action="store_true", help="only the real-film anatomy rows")
    parser.add_argument("--cache", default=None, help="folder keeping the U-Net lungs of each film (--real)")
    parser.add_argument("--overlays", default=None, help="folder for the overlays of OVERLAY_FILMS and their sheet "
                        "overlays-20.png (--real)")
    parser.add_argument("--weights", default=None, help="U-Net .safetensors (default: the shipped lung weights)")
    parser.add_argument("--repair-apex", nargs="?", const="widest", choices=("widest", "lower"), default=None,
                        help="measure the lateral-border repair of bench/records/lung_apex_preregistration.md "
                             "(anchor: the widest row, or the widest row of the lower half)")
    parser.add_argument("--ctr-calibration", action="store_true",
                        help="real films: heart outlines with OUTLINE_CALIBRATION (the unet ctr_calibration option)")
    add_reading_options(parser, "real films: ")
    args = parser.parse_args()

    import torch

    heart_params = None
    if args.ctr_calibration:
        from cxrground.anatomy.segment.heart import OUTLINE_CALIBRATION, HeartEstimateParams

        heart_params = HeartEstimateParams(outline_calibration=OUTLINE_CALIBRATION)

    if args.real or args.only_real:
        torch.set_num_threads(args.threads)
        real_films(args.threads, args.cache, args.overlays, args.weights, args.repair_apex, heart_params,
                   content_box=args.content_box, deskew=args.deskew)
        if args.only_real:
            return

    from cxrground.anatomy import cardiothoracic_ratio
    from cxrground.anatomy.segment import UNetLungSegmenter, score_heart_estimates
    from cxrground.anatomy.segment.builtin import heart_from_lungs
    from cxrground.anatomy.segment.unet import predict_logits
    from cxrground.datasets.pack import Pack, PackMissingError
    from cxrground.datasets.synthetic import SynthConfig, generate_study
    from cxrground.models.lung_unet import evaluate_records, evaluate_synthetic

    torch.set_num_threads(args.threads)
    seg = UNetLungSegmenter(args.weights, threads=args.threads)
    model, meta = seg._ensure()
    print(f"model {meta['name']}  sha256 {meta['sha256'][:16]}...  params {meta['parameters']:,}  "
          f"torch threads {torch.get_num_threads()}")

    # --- speed ------------------------------------------------------------------------------------
    size = int(meta["input"]["size"])
    canvas = np.random.default_rng(0).normal(size=(1, size, size)).astype(np.float32)
    for threads in sorted({1, args.threads}):
        t = timed(lambda threads=threads: predict_logits(model, canvas, threads=threads), 20)
        print(f"{f'U-Net forward, 1 image at {size}x{size}, {threads} thread(s)':<58} {t * 1000:9.1f} ms/image")
    print(f"  (load average now {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs: other processes inflate these)")

    # --- real lungs -------------------------------------------------------------------------------
    try:
        pack = Pack()
    except PackMissingError as exc:
        pack = None
        print(f"pack rows skipped: {exc}")
    if pack is not None:
        nc = [r for r in pack.cohen() if not r.shippable]
        if args.nc:
            nc = nc[: args.nc]
        im = nc[0].read()
        t = timed(lambda: seg.segment(im), 5)
        print(f"{f'segment() incl. mapping + heart, {im.shape[1]}x{im.shape[0]} image':<58} {t * 1000:9.1f} ms/image")
        start = time.perf_counter()
        res = evaluate_records(seg, nc)
        dt = time.perf_counter() - start
        print(f"NC evaluation rows (CC BY-NC-SA, never trained on): n={res['n']}  ({dt:.0f} s)")
        print(f"  Dice mean {res['dice_mean']:.4f}   right {res['dice_right_mean']:.4f}   "
              f"left {res['dice_left_mean']:.4f}")
        print(f"  Dice median {res['dice_median']:.4f}   right {res['dice_right_median']:.4f}   "
              f"left {res['dice_left_median']:.4f}   min {res['dice_min']:.4f}   images < 0.8: {res['below_0_8']}")

        # heart estimate on real lungs: no truth exists; report the CTR it implies
        ctr_truth, ctr_unet = [], []
        for rec in pack.cohen()[:: max(1, len(pack.cohen()) // 60)]:
            image = rec.read()
            r, lft = rec.lungs(image.shape)
            heart, info = heart_from_lungs(r, lft)
            ctr_truth.append(info.get("ctr", 0.0) if heart is not None else 0.0)
            m = seg.segment(image)
            ctr_unet.append(cardiothoracic_ratio(m.heart, m.right_lung, m.left_lung) if m.heart is not None else 0.0)
        for label, vals in (("pack lung masks", ctr_truth), ("U-Net lungs", ctr_unet)):
            a = np.asarray(vals)
            print(f"heart estimate on real {label} (n={a.size}, no heart truth): CTR median {np.median(a):.3f} "
                  f"IQR {np.percentile(a, 25):.3f}-{np.percentile(a, 75):.3f}, below 0.30: {(a < 0.3).mean():.0%}")

    # --- lungs on synthetic phantoms -----------------------------------------------------------------
    if args.synthetic:
        start = time.perf_counter()
        res = evaluate_synthetic(seg, args.synthetic, args.synthetic_seed)
        dt = time.perf_counter() - start
        trained = (meta.get("data", {}).get("synthetic_train") or {}).get("seed")
        note = f"training phantoms: seed {trained}" if trained is not None else "no phantoms in training"
        print(f"synthetic phantoms (seed {args.synthetic_seed}, {note}): n={res['n']}  ({dt:.0f} s)")
        print(f"  Dice mean {res['dice_mean']:.4f}   right {res['dice_right_mean']:.4f}   "
              f"left {res['dice_left_mean']:.4f}   min {res['dice_min']:.4f}   images < 0.8: {res['below_0_8']}")

    # --- heart estimate vs phantom hearts ----------------------------------------------------------
    cfg = SynthConfig(prevalence={"cardiomegaly": 0.5})
    cases, status = [], []
    start = time.perf_counter()
    for i in range(args.phantoms):
        s = generate_study(0, i, cfg)
        m = s.anatomy_masks
        cases.append((m["right_lung"], m["left_lung"], m["heart"]))
        status.append(s.truth.heart_status)
    score = score_heart_estimates(cases)
    per = np.asarray(score.per_case)
    st = np.asarray(status)
    print(f"heart estimate vs phantom hearts (seed 0, n={score.n}, {time.perf_counter() - start:.0f} s): "
          f"Dice mean {score.dice_mean:.4f} median {score.dice_median:.4f}; CTR MAE {score.ctr_mae:.4f} "
          f"bias {score.ctr_bias:+.4f} Pearson r {score.ctr_pearson:.4f}")
    for group in ("normal", "borderline", "enlarged"):
        sel = st == group
        if sel.any():
            err = np.abs(per[sel, 2] - per[sel, 1])
            print(f"  {group:<10} n={int(sel.sum()):3d}  Dice {per[sel, 0].mean():.4f}  CTR MAE {err.mean():.4f}  "
                  f"true CTR {per[sel, 1].mean():.3f}  estimated {per[sel, 2].mean():.3f}")


if __name__ == "__main__":
    main()
