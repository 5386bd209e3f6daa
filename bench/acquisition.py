"""How the anatomy holds up when the same real film is acquired or exported differently.

Run: ``CXRGROUND_PACK=... .venv/bin/python bench/acquisition.py [--limit N] [--only NAME ...] [--threads 1]
[--overlays DIR] [--content-box] [--deskew] [--polarity]``.

Films from another archive differ from the pack's in ways that have nothing to do with the patient: black or white
borders around the exposed field, burned-in markers and labels, windowing (gamma, contrast), compression, noise of
a portable detector, a few degrees of tilt, tight collimation, 16-bit files, MIMIC-size pixels, grey levels stored
inverted. Each *variation* below applies one of these to every COVID-19 collection film of the pack that has lung
masks (the pack's masks moved with the pixels where the geometry changes), and the shipped segmenter (U-Net lungs,
seen-border heart outline) reads the film as the commands do (``segment_checked``: a film whose lungs are
implausible is retried as its grey-level negative). Printed per variation:

- lung Dice against the pack's masks (per lung, median; lungs under 0.8), and its change from the unchanged film;
- films whose lungs fail the plausibility check even after the negative was tried;
- on the Brixia-scored films, films with a lung base (ILS "lung base" band of the pack's mask) under 70 % covered;
- heart outlines drawn, outlines below the lung bases or outside the thorax (``bench/segment.py``'s checks), and
  the median absolute change of the CTR from the unchanged film's.

The variations and their parameters are fixed here, chosen from what exported clinical films show, not from any
score. Nothing is fitted. ``--overlays`` writes a contact sheet per variation of the films whose Dice falls most.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from segment import _dice, add_reading_options, heart_plausibility

Masks = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Variation:
    """One acquisition difference: ``apply(pixels, (right, left)) -> (pixels, right, left)``; ``reader`` True when
    the variation is a file format and the film must go through the image reader (``apply`` then returns bytes)."""

    name: str
    what: str
    apply: Callable[..., tuple]
    reader: bool = False


def _pad(px: np.ndarray, masks: Masks, frac: float, value: int) -> tuple:
    h, w = px.shape
    py, pxx = round(frac * h), round(frac * w)
    out = np.pad(px, ((py, py), (pxx, pxx)), constant_values=value)
    return (out, *(np.pad(m, ((py, py), (pxx, pxx))) for m in masks))


def _crop(px: np.ndarray, masks: Masks, frac: float) -> tuple:
    h, w = px.shape
    cy, cx = round(frac * h), round(frac * w)
    sl = (slice(cy, h - cy), slice(cx, w - cx))
    return (px[sl], *(m[sl] for m in masks))


def _labels(px: np.ndarray, masks: Masks) -> tuple:
    """A bright "L" side marker at the top corner over the patient's left and a "PORTABLE  SEMI-UPRIGHT" label
    with a date at the top left, each in a box as on exported bedside films."""
    h, w = px.shape
    im = Image.fromarray(px)
    draw = ImageDraw.Draw(im)
    big = ImageFont.load_default(size=max(10, round(0.07 * w)))
    small = ImageFont.load_default(size=max(8, round(0.025 * w)))
    draw.text((round(0.86 * w), round(0.04 * h)), "L", fill=250, font=big)
    draw.rectangle((round(0.03 * w), round(0.02 * h), round(0.42 * w), round(0.09 * h)), fill=20)
    draw.text((round(0.04 * w), round(0.03 * h)), "PORTABLE  SEMI-UPRIGHT", fill=245, font=small)
    draw.text((round(0.04 * w), round(0.055 * h)), "03/12/2026 07:41", fill=245, font=small)
    return (np.asarray(im), *masks)


def _gamma(px: np.ndarray, masks: Masks, g: float) -> tuple:
    return (np.round(255.0 * (px / 255.0) ** g).astype(np.uint8), *masks)


def _contrast(px: np.ndarray, masks: Masks) -> tuple:
    """A flat window: the film's grey levels squeezed into 60–190."""
    return (np.round(60 + px.astype(np.float32) * (130 / 255)).astype(np.uint8), *masks)


def _jpeg(px: np.ndarray, masks: Masks, quality: int) -> tuple:
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "JPEG", quality=quality)
    return (buf.getvalue(), *masks)


def _noise(px: np.ndarray, masks: Masks, sigma: float, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    return (np.clip(px + rng.normal(0.0, sigma, px.shape), 0, 255).round().astype(np.uint8), *masks)


def _rotate(px: np.ndarray, masks: Masks, degrees: float) -> tuple:
    im = Image.fromarray(px).rotate(degrees, Image.Resampling.BILINEAR, fillcolor=0)
    rot = [np.asarray(Image.fromarray(m.astype(np.uint8) * 255).rotate(degrees, Image.Resampling.NEAREST)) > 127
           for m in masks]
    return (np.asarray(im), *rot)


def _mimic_size(px: np.ndarray, masks: Masks, longest: int = 2800) -> tuple:
    h, w = px.shape
    s = longest / max(h, w)
    size = (round(w * s), round(h * s))
    im = np.asarray(Image.fromarray(px).resize(size, Image.Resampling.BICUBIC))
    up = [np.asarray(Image.fromarray(m.astype(np.uint8) * 255).resize(size, Image.Resampling.NEAREST)) > 127
          for m in masks]
    return (im, *up)


def _bit16(px: np.ndarray, masks: Masks) -> tuple:
    """A 16-bit PNG holding 12-bit data (0–4080), as a detector export without windowing."""
    buf = io.BytesIO()
    Image.fromarray(px.astype(np.uint16) * 16).save(buf, "PNG")
    return (buf.getvalue(), *masks)


def _inverted(px: np.ndarray, masks: Masks) -> tuple:
    return (255 - px, *masks)


VARIATIONS: tuple[Variation, ...] = (
    Variation("unchanged", "the film as stored in the pack", lambda px, m: (px, *m)),
    Variation("black-border", "a black border of 10 % of each side", lambda px, m: _pad(px, m, 0.10, 0)),
    Variation("white-border", "a white border of 5 % of each side (scanned film)",
              lambda px, m: _pad(px, m, 0.05, 255)),
    Variation("tight-crop", "6 % cut from each side (tight collimation)", lambda px, m: _crop(px, m, 0.06)),
    Variation("labels", "burned-in side marker and label box", _labels),
    Variation("gamma-0.6", "gamma 0.6 (lungs lighter)", lambda px, m: _gamma(px, m, 0.6)),
    Variation("gamma-1.6", "gamma 1.6 (lungs darker)", lambda px, m: _gamma(px, m, 1.6)),
    Variation("flat-window", "grey levels squeezed into 60-190", _contrast),
    Variation("jpeg-q40", "JPEG quality 40", lambda px, m: _jpeg(px, m, 40), reader=True),
    Variation("noise", "Gaussian noise, SD 8 grey levels", lambda px, m: _noise(px, m, 8.0, 0)),
    Variation("tilt+7", "turned 7 degrees (anticlockwise)", lambda px, m: _rotate(px, m, 7.0)),
    Variation("tilt-7", "turned 7 degrees (clockwise)", lambda px, m: _rotate(px, m, -7.0)),
    Variation("mimic-size", "resized to 2,800 px on the longest side", _mimic_size),
    Variation("16-bit", "16-bit PNG of 12-bit data, read by the image reader", _bit16, reader=True),
    Variation("inverted", "grey levels stored inverted", _inverted),
)


def _read(variation: Variation, rec):
    """The varied film as a CXRImage and the pack's lung masks moved with it."""
    from cxrground.io.image import CXRImage, read_image_bytes

    im = rec.read()
    out = variation.apply(im.pixels, rec.lungs(im.shape))
    if variation.reader:
        image = read_image_bytes(out[0], name=f"{rec.image_id}.{variation.name}")
    else:
        image = CXRImage(np.ascontiguousarray(out[0]), path=str(rec.image_path), view=im.view)
    return image, out[1].astype(bool), out[2].astype(bool)


def _base_cover(pred: np.ndarray, gt: np.ndarray) -> float:
    from cxrground.anatomy.ils_locations import lung_zone_bands

    band = lung_zone_bands(gt)["lung base"] & gt
    return float((pred & band).sum() / max(1, int(band.sum())))


def run(variations: list[Variation], limit: int | None, threads: int, overlays: Path | None,
        content_box: bool = False, deskew: bool = False) -> None:
    """Score every variation on the pack's films with lung masks; one block of lines per variation."""
    from tqdm.auto import tqdm

    from cxrground.anatomy.segment import UNetLungSegmenter
    from cxrground.anatomy.segment.plausibility import segment_checked
    from cxrground.datasets.pack import Pack

    recs = list(Pack().cohen())[:limit]
    seg = UNetLungSegmenter(threads=threads, content_box=content_box, deskew=deskew)
    baseline: dict[str, dict] = {}
    reference: dict[str, dict] = {}
    if deskew:  # the unchanged films read as stored, the reference of "losing" with the option off
        plain = UNetLungSegmenter(threads=threads, content_box=content_box)
        for rec in tqdm(recs, desc="unchanged, as stored", leave=False):
            image, gr, gl = _read(VARIATIONS[0], rec)
            masks = segment_checked(plain, image)[1]
            reference[rec.image_id] = {"dice": (_dice(masks.right_lung.astype(bool), gr),
                                                _dice(masks.left_lung.astype(bool), gl))}
    print(f"{len(recs)} COVID-19 collection films with lung masks ({sum(r.brixia is not None for r in recs)} "
          f"Brixia-scored); shipped segmenter {seg.identity()['name']}, "
          f"{'inside the uniform borders' if content_box else 'whole film'}, "
          f"{'tilted films read upright' if deskew else 'as stored'}, {threads} thread(s)")
    for variation in ["unchanged"] + [v.name for v in variations if v.name != "unchanged"]:
        var = next(v for v in VARIATIONS if v.name == variation)
        start = time.perf_counter()
        rows = []
        for rec in tqdm(recs, desc=var.name, leave=False):
            image, gr, gl = _read(var, rec)
            read_as, masks, problems = segment_checked(seg, image)
            r, lft = masks.right_lung.astype(bool), masks.left_lung.astype(bool)
            row = {"id": rec.image_id, "dice": (_dice(r, gr), _dice(lft, gl)), "problems": problems,
                   "inverted": "polarity" in masks.extra, "heart": masks.heart is not None,
                   "upright": bool(masks.extra.get("tilt_kept")),
                   "ctr": (masks.extra.get("heart_estimate") or {}).get("ctr", np.nan),
                   "base": (_base_cover(r, gr), _base_cover(lft, gl)) if rec.brixia is not None else None,
                   "plaus": heart_plausibility(masks.heart, r, lft) if masks.heart is not None and r.any() and lft.any()
                   else {}}
            if var.name == "unchanged":
                baseline[rec.image_id] = row
            row["thumb"] = _thumb(read_as.pixels, r, lft, masks.heart) if overlays else None
            rows.append(row)
        _report(var, rows, baseline, time.perf_counter() - start, reference)
        if overlays:
            _sheet(overlays / f"{var.name}.png", rows, baseline)


def _report(var: Variation, rows: list[dict], baseline: dict[str, dict], seconds: float,
            reference: dict[str, dict] | None = None) -> None:
    dice = np.asarray([d for r in rows for d in r["dice"]])
    base_dice = np.asarray([d for r in rows for d in baseline[r["id"]]["dice"]])
    bad = [r["id"] for r in rows if r["problems"]]
    low = [r["id"] for r in rows if r["base"] is not None and min(r["base"]) < 0.7]
    hearts = [r for r in rows if r["heart"]]
    out = sum(bool(r["plaus"].get("below the lung bases") or r["plaus"].get("outside the thorax")) for r in hearts)
    dctr = np.asarray([abs(r["ctr"] - baseline[r["id"]]["ctr"]) for r in hearts
                       if np.isfinite(r["ctr"]) and np.isfinite(baseline[r["id"]]["ctr"])])
    drop = dice - base_dice
    print(f"\n{var.name}: {var.what} ({seconds:.0f} s)")
    print(f"  lung Dice median {np.median(dice):.3f} (unchanged film {np.median(base_dice):.3f}); lungs < 0.8: "
          f"{int((dice < 0.8).sum())} of {dice.size}; lungs losing > 0.05 Dice: {int((drop < -0.05).sum())}")
    if reference:  # deskew on: also against the unchanged film read as stored (the option off)
        ref = np.asarray([d for r in rows for d in reference[r["id"]]["dice"]])
        print(f"  against the unchanged film read as stored: lungs losing > 0.05 Dice: "
              f"{int((dice - ref < -0.05).sum())}; read upright: {sum(r['upright'] for r in rows)} films")
    print(f"  implausible lungs: {len(bad)}; read as the negative: {sum(r['inverted'] for r in rows)}; Brixia films "
          f"with a base < 70 % covered: {len(low)}")
    print(f"  heart outlines {len(hearts)} of {len(rows)}; below the lung bases or outside the thorax: {out}; CTR "
          f"change from the unchanged film: median {np.median(dctr) if dctr.size else float('nan'):.3f}, "
          f"90th percentile {np.percentile(dctr, 90) if dctr.size else float('nan'):.3f}")


def _thumb(pixels: np.ndarray, right: np.ndarray, left: np.ndarray, heart: np.ndarray | None) -> Image.Image:
    """The film with its lungs and heart outlined (palette colours), at most 256 px a side."""
    from cxrground.io.overlay import overlay_masks

    s = max(1, int(np.ceil(max(pixels.shape) / 256)))
    layers = [m[::s, ::s] for m in (right, left, heart) if m is not None]
    return Image.fromarray(overlay_masks(pixels[::s, ::s], layers)).convert("RGB")


def _sheet(path: Path, rows: list[dict], baseline: dict[str, dict], count: int = 8) -> None:
    """The ``count`` films whose mean lung Dice falls most (lungs and heart outlined), four a row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    worst = sorted(rows, key=lambda r: np.mean(r["dice"]) - np.mean(baseline[r["id"]]["dice"]))[:count]
    tiles = []
    for r in worst:
        tile = r["thumb"]
        canvas = Image.new("RGB", (256, 272), "black")
        canvas.paste(tile, (0, 16))
        ImageDraw.Draw(canvas).text((2, 2), f"{r['id'][:30]} {np.mean(r['dice']):.2f}", fill="white")
        tiles.append(canvas)
    sheet = Image.new("RGB", (256 * 4, 272 * ((len(tiles) + 3) // 4)), "black")
    for i, t in enumerate(tiles):
        sheet.paste(t, ((i % 4) * 256, (i // 4) * 272))
    sheet.save(path)


def polarity(threads: int, content_box: bool, limit: int | None) -> None:
    """``--polarity``: of every pack film (NIH and COVID-19 collection, no mask needed), stored and with its grey
    levels inverted, how many ``segment_checked`` reads as the negative (the stored films so read are listed)."""
    import dataclasses

    from tqdm.auto import tqdm

    from cxrground.anatomy.segment import UNetLungSegmenter
    from cxrground.anatomy.segment.plausibility import segment_checked
    from cxrground.datasets.pack import Pack

    pack = Pack()
    recs = (list(pack.nih()) + list(pack.cohen()))[:limit]
    seg = UNetLungSegmenter(threads=threads, content_box=content_box)
    stored, inverted = [], 0
    start = time.perf_counter()
    for rec in tqdm(recs, desc="polarity", leave=False):
        im = rec.read()
        if "polarity" in segment_checked(seg, im)[1].extra:
            stored.append(rec.image_id)
        neg = dataclasses.replace(im, pixels=255 - im.pixels)
        inverted += "polarity" in segment_checked(seg, neg)[1].extra
    print(f"polarity, {len(recs)} pack films ({time.perf_counter() - start:.0f} s): stored films read as the "
          f"negative {len(stored)} {stored}; inverted films read as the negative (the right way round) {inverted} "
          f"({100 * inverted / len(recs):.1f} %)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="only the first N films (exploration)")
    parser.add_argument("--only", nargs="+", default=None, choices=[v.name for v in VARIATIONS],
                        help="these variations (the unchanged film is always read, as the reference)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--overlays", type=Path, default=None)
    add_reading_options(parser)
    parser.add_argument("--polarity", action="store_true",
                        help="only count, on every pack film stored and inverted, the films read as the negative")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.polarity:
        polarity(args.threads, args.content_box, args.limit)
        return
    chosen = [v for v in VARIATIONS if args.only is None or v.name in args.only]
    run(chosen, args.limit, args.threads, args.overlays, args.content_box, args.deskew)


if __name__ == "__main__":
    main()
