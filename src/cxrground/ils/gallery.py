"""A self-contained HTML page to browse a built ILS dataset: per study the image with every lesion mask
overlaid, the chosen report section, how each reported finding was grounded (from the study's unit record: grounded
or why not, and what a zone guide did), how the film was read when not as stored (inverted, turned upright, inside
its borders; an inverted film is shown as read), and every instruction-answer pair (positives with their mask's
colour, negatives with their location). Images are embedded as PNG data URLs; no server needed."""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from PIL import Image

from cxrground.errors import ConfigError, InputError
from cxrground.ils.card import READING_NOTES
from cxrground.ils.frames import MaskFrame, mask_on_image, read_frame
from cxrground.ils.layout import MASK_DIR, UNITS_DIR
from cxrground.ils.schema import SPLITS, dataset_location, iter_dataset
from cxrground.ils.zone_guide import guide_outcome
from cxrground.io.image import read_image
from cxrground.io.masks import read_mask_png
from cxrground.io.overlay import PALETTE, overlay_masks

__all__ = ["GalleryResult", "grounding_lines", "reading_line", "render_gallery"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;background:#111;color:#ddd}
.study{display:flex;gap:16px;border-bottom:1px solid #333;padding:12px 0}
img{max-width:360px;height:auto;border:1px solid #444}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 6px;border-bottom:1px solid #2a2a2a;text-align:left}
.neg{color:#999}.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
.sec{font-size:12px;color:#aaa;max-width:720px}.failed{color:#e88}h1{font-size:20px}h2{font-size:15px;margin:0 0 6px}
"""


def _png_data_url(rgb: np.ndarray, width: int) -> str:
    im = Image.fromarray(rgb)
    if im.width > width:
        im = im.resize((width, max(1, round(im.height * width / im.width))), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _hex(colour: tuple[float, float, float]) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in colour)


def grounding_lines(unit_file: Path) -> list[str]:
    """One line per reported positive finding of a study's unit record: lesion, outcome (grounded, or the reason it
    got no mask) and, with a zone guide, the guided and filled zones; none without the record."""
    return _grounding_lines(_unit_object(unit_file), unit_file)


def _grounding_lines(unit: dict[str, Any], unit_file: Path) -> list[str]:
    """:func:`grounding_lines` of a unit record read from ``unit_file``."""
    lines = []
    for g in _unit_grounding(unit, unit_file):
        outcome = guide_outcome(g)
        if outcome is None:
            outcome = "grounded" if g.get("status") == "grounded" else f"no mask: {g.get('reason') or g.get('status')}"
        guide = g.get("zone_guide") or {}
        if "zones" in guide:
            filled = f"; filled {' '.join(guide['filled'])}" if guide.get("filled") else ""
            outcome += f" (flagged zones {' '.join(guide['zones']) or 'none'}{filled})"
        lines.append(f"{g.get('lesion')}: {outcome}")
    return lines


def reading_line(unit_file: Path) -> str | None:
    """How a study's film was read when not as stored (the unit record's :data:`READING_NOTES`, with the tilt's
    angle and the borders cut), e.g. ``"film read turned upright (...): 4.0°"``; None when read as stored or
    without the record."""
    return _reading_line(_unit_object(unit_file))


def _reading_line(unit: dict[str, Any]) -> str | None:
    """:func:`reading_line` of a unit record."""
    parts = []
    for key, words in READING_NOTES:
        value = unit.get(key)
        if not value:
            continue
        if key == "tilt" and isinstance(value, (int, float)):
            parts.append(f"{words}: {value:g}°")
        elif key == "content_box" and isinstance(value, list):
            parts.append(f"{words}: {', '.join(str(v) for v in value)} px [top, bottom, left, right]")
        else:
            parts.append(words)
    return "film " + "; ".join(parts) if parts else None


def _unit_object(unit_file: Path) -> dict[str, Any]:
    """A unit file's JSON object; empty without the file, an :class:`InputError` naming it when it is no object."""
    if not unit_file.is_file():
        return {}
    unit = _unit_record(unit_file)
    if not isinstance(unit, dict):
        raise InputError("unit record is not a JSON object", unit_file)
    return unit


def _unit_record(unit_file: Path) -> Any:
    """A unit file's JSON; an unreadable file is an :class:`InputError` naming it."""
    try:
        return json.loads(unit_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"unit record is not valid JSON ({exc})", unit_file) from exc


def _unit_grounding(unit: dict[str, Any], unit_file: Path) -> list[dict[str, Any]]:
    """The ``grounding`` records of a unit record; a malformed one is an :class:`InputError` naming its file."""
    grounding = unit.get("grounding", [])
    if not isinstance(grounding, list) or not all(isinstance(g, dict) for g in grounding):
        raise InputError("unit record has no list of grounding records", unit_file)
    return grounding


#: Studies that cannot be shown after which a gallery stops looking (a wrong image root fails every study).
_MAX_FAILED: Final[int] = 200
#: Study fields the gallery shows (strings).
_SHOWN_FIELDS = ("image_path", "section_name", "section_content")


@dataclass(frozen=True)
class GalleryResult:
    """What :func:`render_gallery` wrote: the studies shown with their film, and those it could not show
    (study key, why), listed on the page in their place."""

    shown: int
    failed: tuple[tuple[str, str], ...] = ()
    more: bool = False
    """True when the dataset (or the split) has studies besides those shown and listed."""
    drawn_from: int | None = None
    """For a sample, how many studies it was drawn from (None: the first studies in file order)."""


def render_gallery(dataset_dir: str | Path, images_root: str | Path, out_html: str | Path, limit: int = 50,
                   split: str | None = None, width: int = 360, sample: int | None = None) -> GalleryResult:
    """Write the gallery of the first ``limit`` studies that can be shown (optionally of one split), or with
    ``sample`` = a seed, of ``limit`` studies drawn at random (reproducibly for the seed) from the split or from all
    splits, shown in file order; the page's folder is created when missing. A study whose film, masks or unit record
    cannot be read is listed on the page with the reason in its place (not counted in ``limit``: a sample draws
    another; the page stops after :data:`_MAX_FAILED` of them); when none can be shown, nothing is written and the
    first study's error is raised. The dataset JSON is read as a stream: in file order only as far as the studies
    shown; for a sample once for the study keys and once for the studies drawn."""
    if limit < 1:
        raise ConfigError(f"limit must be at least 1, got {limit}")
    (root, json_path), images_root = dataset_location(dataset_dir), Path(images_root)
    splits = SPLITS if split is None else (split,)
    frame = read_frame(root)  # released-frame masks are mapped back to each film's grid
    panels: list[tuple[int, str]] = []  # (file position, panel html)
    failed: list[tuple[str, str]] = []
    shown, first_error, more, total = 0, None, False, None
    stream = iter_dataset(json_path, _SHOWN_FIELDS, splits=splits)
    if sample is None:
        studies: Iterator[tuple[int, tuple[str, str, dict[str, Any]]]] = enumerate(stream)
    else:
        keys = [(name, key) for name, key, _study in iter_dataset(json_path, (), splits=splits)]
        total = len(keys)
        order = np.random.default_rng(sample).permutation(total)[: limit + _MAX_FAILED]
        drawn = {keys[i]: rank for rank, i in enumerate(order.tolist())}
        picked = {drawn[(name, key)]: (pos, (name, key, study)) for pos, (name, key, study) in enumerate(stream)
                  if (name, key) in drawn}
        studies = iter(picked[rank] for rank in sorted(picked))
    for pos, (split_name, key, study) in studies:
        if shown >= limit or len(failed) >= _MAX_FAILED:
            more = True
            break
        try:
            panels.append((pos, _study_panel(root, images_root, key, split_name, study, width, frame)))
            shown += 1
        except InputError as exc:
            first_error = first_error or exc
            failed.append((key, str(exc)))
            panels.append((pos, f"<div class='study failed'><h2>{html.escape(key)} · {html.escape(split_name)}</h2>"
                                f"<div class='sec'>not shown: {html.escape(str(exc))}</div></div>"))
    stream.close()
    if total is not None:
        more = total > shown + len(failed)
    if first_error is not None and not shown:
        raise first_error
    if not shown:
        counts = Counter(name for name, _key, _study in iter_dataset(json_path, ()))
        have = ", ".join(f"{name} ({n})" for name, n in counts.items()) or "none"
        raise ConfigError(f"no study to show{f' in split {split}' if split else ''} of {json_path} (its "
                          f"splits with studies: {have}); nothing written")
    parts = [f"<!doctype html><meta charset='utf-8'><title>ILS dataset: {html.escape(root.name)}</title>"
             f"<style>{_CSS}</style><h1>ILS dataset {html.escape(str(root))}</h1>"]
    of_split = f" of split {html.escape(split)}" if split else ""
    if sample is not None:
        parts.append(f"<p>{shown} studies{of_split} drawn at random (seed {sample}) from {total}, in file order"
                     f"{'' if split else ' (train, val, test)'}.</p>")
    elif more:
        parts.append(f"<p>The first {shown} studies{of_split} in file order (train, val, test); the dataset has more "
                     "(<code>--limit</code>, <code>--split</code>, <code>--sample</code>).</p>")
    if failed:
        parts.append(f"<p class='failed'>{len(failed)} of {shown + len(failed)} studies could not be shown; each "
                     "is listed in its place with the reason.</p>")
    parts.extend(panel for _pos, panel in sorted(panels, key=lambda item: item[0]))
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(parts), encoding="utf-8")
    return GalleryResult(shown, tuple(failed), more, total)


def _study_panel(root: Path, images_root: Path, key: str, split_name: str, study: dict[str, Any],
                 width: int, frame: MaskFrame) -> str:
    """One study's panel: the film with its masks, the section, the groundings and the pairs; an
    :class:`InputError` naming the file when the film, a mask or the unit record cannot be read."""
    try:
        image = read_image(images_root / study["image_path"])
    except InputError as exc:
        raise exc.with_reason(f"image of study {key}: {exc.reason} (is {images_root} the root the "
                              "dataset's image_path values are relative to?)") from exc
    unit_file = root / UNITS_DIR / f"{key}.json"
    unit = _unit_object(unit_file)
    read = _reading_line(unit)
    pixels = 255 - image.pixels if unit.get("image_note") else image.pixels
    pairs = study["instruction_answer_pairs"]
    masks: dict[str, int] = {}
    for p in pairs["positive_pairs"]:
        masks.setdefault(p["seg_mask_path"], len(masks))
    arrays = [mask_on_image(read_mask_png(root / MASK_DIR / path), image.shape, frame, root / MASK_DIR / path)
              for path in masks]
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(arrays))]
    rgb = overlay_masks(pixels, arrays, colours, alpha=0.35) if arrays else np.repeat(pixels[..., None], 3, -1)
    rows = []
    for p in pairs["positive_pairs"]:
        c = _hex(colours[masks[p["seg_mask_path"]]])
        rows.append(f"<tr><td><span class='sw' style='background:{c}'></span>{html.escape(p['type'])}</td>"
                    f"<td>{html.escape(p['instruction'])}</td><td>{html.escape(p['answer'])}</td>"
                    f"<td>{html.escape(p['target'])}</td></tr>")
    for n in pairs["negative_pairs"]:
        rows.append(f"<tr class='neg'><td>{html.escape(n['type'])}</td><td>{html.escape(n['instruction'])}"
                    f"</td><td>{html.escape(n['answer'])}</td><td>{html.escape(n['target'])}</td></tr>")
    grounding = "".join(f"<li>{html.escape(line)}</li>" for line in _grounding_lines(unit, unit_file))
    return (f"<div class='study'><img alt='{html.escape(key)}' src='{_png_data_url(rgb, width)}'>"
            f"<div><h2>{html.escape(key)} · {html.escape(split_name)} · {html.escape(study['section_name'])}</h2>"
            + (f"<div class='sec read'>{html.escape(read)}</div>" if read else "") +
            f"<div class='sec'>{html.escape(study['section_content'])}</div>"
            + (f"<ul class='sec grounding'>{grounding}</ul>" if grounding else "") +
            "<table><tr><th>type</th><th>instruction</th><th>answer</th><th>target</th></tr>"
            + "".join(rows) + "</table></div></div>")
