"""A self-contained HTML page to browse a built ILS dataset: per study the film (named by its path under the image
root) with every lesion mask overlaid, the chosen report section, how each reported finding was grounded (from the
study's unit record: grounded or why not, and what a zone guide did), how the film was read when not as stored
(inverted, turned upright, inside its borders; an inverted film is shown as read), and every instruction-answer pair
(positives with their mask's colour, negatives with their location).

The page scales to hundreds of studies: each thumbnail is composited at its shown size (film, translucent masks,
crisp outlines) and embedded once as a JPEG data URL (quality :data:`JPEG_QUALITY`, full colour resolution, so thin
coloured outlines stay sharp), about 30 KB a study in the page. Each study has an anchor (``#`` + study key) listed
in a table of contents, and a small inline script filters studies by split and by finding (without script every study is
shown). A mask that would hide an earlier mask of the study or be hidden by it (the same mask under two findings, one
inside another) is drawn as an outline just outside its edge rather than filled over it, so both stay visible, and
its pair rows say which mask it repeats, lies in or covers. No external assets, no server needed.

More studies than :data:`PER_PAGE` (``--per-page``) go on several such pages beside the first (``STEM.p2.html``, ...),
linked to each other, each with the contents of its own studies, the filter (whose choice goes with the links to
the other pages) and an index of every page's studies; the studies that could not be shown are listed on the
first."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

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
from cxrground.io.overlay import PALETTE, blend

__all__ = ["ALL_PAGE_LINKS", "JPEG_QUALITY", "NEAR_PAGES", "PER_PAGE", "GalleryResult", "grounding_lines",
           "reading_line", "render_gallery"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;background:#111;color:#ddd}a{color:#8cf}
.study{display:flex;gap:16px;border-bottom:1px solid #333;padding:12px 0;content-visibility:auto;
contain-intrinsic-size:auto 420px}
img{max-width:360px;height:auto;border:1px solid #444}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 6px;border-bottom:1px solid #2a2a2a;text-align:left}
.neg{color:#999}.sw{display:inline-block;width:10px;height:10px;margin-right:4px;box-sizing:border-box}
.sec{font-size:12px;color:#aaa;max-width:720px}.failed{color:#e88}h1{font-size:20px}h2{font-size:15px;margin:0 0 6px}
.film{font-size:12px;color:#bbb;margin:0 0 6px;word-break:break-all}.same{font-size:11px;color:#aaa}
.toc{font-size:12px;line-height:1.7}.toc div{max-height:6.8em;overflow:auto;margin-bottom:4px}.toc a{white-space:nowrap}
.toc b{margin-right:6px}
#filters{font-size:13px}[hidden]{display:none!important}
"""
#: Added to :data:`_CSS` on the pages of a gallery of several.
_PAGES_CSS = """.pages{font-size:14px;margin:10px 0}.pages a,.pages b,.pages span{margin:0 3px}.pages .off{color:#666}
ul.failed{font-size:12px}
"""

#: The filter: hides the studies (and their contents entries) whose split or findings do not match; added by the
#: script itself, so a page without script shows every study and no dead controls.
_FILTER_JS = """
(function(){
var f=document.getElementById('filters');f.hidden=false;
var s=document.getElementById('f-split'),l=document.getElementById('f-finding'),n=document.getElementById('f-count');
@READ@function apply(){var k=0,t=0;
document.querySelectorAll('[data-split]').forEach(function(e){
var ok=(s.value==='all'||e.dataset.split===s.value)&&(l.value==='all'||
(' '+e.dataset.findings+' ').indexOf(' '+l.value+' ')>=0);
e.hidden=!ok;if(e.classList.contains('study')){t++;if(ok){k++;}}});
document.querySelectorAll('.toc div').forEach(function(d){d.hidden=!d.querySelector('a:not([hidden])');});
n.textContent=k+' of '+t+' studies shown@WHERE@';@CARRY@}
s.addEventListener('change',apply);l.addEventListener('change',apply);apply();
})();
"""
_JS: Final[str] = _FILTER_JS.replace("@READ@", "").replace("@WHERE@", "").replace("@CARRY@", "")
#: The filter of a page of several: its choice comes from the page's address (``?split=...&finding=...``) and goes
#: with every link to another page, so it stays while paging; it also narrows the index of the other pages' studies.
_PAGED_JS: Final[str] = _FILTER_JS.replace("@READ@", """var q=new URLSearchParams(location.search);
function pick(e,v){if(v!==null&&[].some.call(e.options,function(o){return o.value===v;})){e.value=v;}}
pick(s,q.get('split'));pick(l,q.get('finding'));
function carry(){var p=new URLSearchParams();if(s.value!=='all'){p.set('split',s.value);}
if(l.value!=='all'){p.set('finding',l.value);}var c=p.toString();c=c?'?'+c:'';
document.querySelectorAll('a.pg').forEach(function(a){var h=a.getAttribute('href').replace(/\\?[^#]*/,''),
i=h.indexOf('#');a.setAttribute('href',i<0?h+c:h.slice(0,i)+c+h.slice(i));});}
""").replace("@WHERE@", " on this page").replace("@CARRY@", "carry();")

#: Pages up to which each page's row links every page; a gallery of more links the first, the last, those up to
#: :data:`NEAR_PAGES` from the page shown, and every page in its index (``#pages``).
ALL_PAGE_LINKS: Final[int] = 9
NEAR_PAGES: Final[int] = 2
#: Studies shown on a page (``--per-page``): with thumbnails of about 30 KB, pages of about 3 MB, which a browser opens
#: at once; the studies after them go on further pages beside the first.
PER_PAGE: Final[int] = 100
#: The ``<meta>`` name by which each page of a gallery of several names its first page (:func:`_marker`).
_MARKER_NAME: Final[str] = "cxrground-gallery"
#: JPEG quality of the thumbnails (composited first, then encoded once; 4:4:4, so coloured edges stay sharp).
JPEG_QUALITY: Final[int] = 85
#: Names of the :data:`~cxrground.io.overlay.PALETTE` colours, for the swatches' and images' descriptions.
_COLOUR_NAMES: Final[tuple[str, ...]] = ("cyan", "red", "yellow", "green", "magenta", "blue", "orange", "mint")
#: Share of a mask's pixels that earlier masks of the study cover from which it is drawn as an outer outline.
_COVERED: Final[float] = 0.9
#: The finding filter's words for studies with no mask and for studies that could not be shown.
_NO_MASK: Final[str] = "no-mask"
_NOT_SHOWN: Final[str] = "not-shown"


def _jpeg_data_url(rgb: np.ndarray) -> str:
    """An RGB thumbnail as a JPEG data URL (:data:`JPEG_QUALITY`, no chroma subsampling)."""
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=JPEG_QUALITY, subsampling=0, optimize=True)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _thumb_size(shape: tuple[int, ...], width: int) -> tuple[int, int]:
    """(width, height) of a film's thumbnail: at most ``width`` wide, aspect kept, never enlarged."""
    h, w = shape[:2]
    if w <= width:
        return w, h
    return width, max(1, round(h * width / w))


def _shrink_mask(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A boolean mask at the thumbnail's ``size`` (area average, half covered or more is in)."""
    m = np.asarray(mask, dtype=bool)
    if (m.shape[1], m.shape[0]) == size:
        return m
    small = Image.fromarray(m.astype(np.uint8) * 255).resize(size, Image.Resampling.BOX)
    return np.asarray(small) >= 128


def _covering(arrays: list[np.ndarray]) -> list[tuple[int, str] | None]:
    """Per mask, None when it is drawn filled, else (the earlier mask it would hide or be hidden by, how): ``same``
    (the same pixels), ``inside`` (earlier masks cover at least :data:`_COVERED` of it) or ``contains`` (it covers
    at least :data:`_COVERED` of an earlier mask, whose fill and outline it would hide)."""
    bools = [np.asarray(m, dtype=bool) for m in arrays]
    areas = [int(m.sum()) for m in bools]
    out: list[tuple[int, str] | None] = []
    for j, m in enumerate(bools):
        same = next((i for i in range(j) if areas[i] == areas[j] and np.array_equal(bools[i], m)), None)
        if same is not None:
            out.append((same, "same"))
            continue
        if areas[j] == 0 or j == 0:
            out.append(None)
            continue
        overlaps = [int((bools[i] & m).sum()) for i in range(j)]
        union = np.zeros_like(m)
        for i in range(j):
            union |= bools[i]
        if int((union & m).sum()) >= _COVERED * areas[j]:
            out.append((int(np.argmax(overlaps)), "inside"))
            continue
        hidden = [i for i in range(j) if areas[i] and overlaps[i] >= _COVERED * areas[i]]
        out.append((hidden[0], "contains") if hidden else None)
    return out


#: How a pair row names the mask that its own mask repeats, lies in or covers (see :func:`_covering`).
_COVER_WORDS: Final[dict[str, str]] = {"same": "same mask as", "inside": "inside the mask of",
                                       "contains": "covers the mask of"}


def _composite(grey: np.ndarray, masks: list[np.ndarray], colours: list[tuple[float, float, float]],
               covering: list[tuple[int, str] | None], width: int) -> np.ndarray:
    """The study's thumbnail: the film shrunk to ``width`` first, then each filled mask blended on it, then every
    outline on top (1 px, just inside the mask); a covered mask is not filled but ringed 2 px wide just outside its
    edge (the k-th covered mask of the study 3·k px out), so the mask under it keeps its own colour and outline."""
    from scipy import ndimage

    size = _thumb_size(grey.shape, width)
    film = Image.fromarray(grey)
    if (film.width, film.height) != size:
        film = film.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    out = np.repeat(np.asarray(film)[..., None], 3, axis=2)
    small = [_shrink_mask(m, size) for m in masks]
    for m, colour, cover in zip(small, colours, covering, strict=True):
        if cover is None and m.any():
            out = blend(out, m, colour, 0.35)
    ringed = 0
    for m, colour, cover in zip(small, colours, covering, strict=True):
        if not m.any():
            continue
        rgb = np.clip(np.rint(np.asarray(colour) * 255), 0, 255).astype(np.uint8)
        if cover is None:
            out[m & ~ndimage.binary_erosion(m)] = rgb
        else:
            ringed += 1
            out[ndimage.binary_dilation(m, iterations=3 * ringed)
                & ~ndimage.binary_dilation(m, iterations=3 * ringed - 2)] = rgb
    return out


def _alt(key: str, names: list[str], colours: list[str], covering: list[tuple[int, str] | None]) -> str:
    """The image's description: the study and each mask's finding and colour."""
    if not names:
        return f"{key}: film without masks"
    items = [f"{name} ({colour}{'' if cover is None else ', outer outline'})"
             for name, colour, cover in zip(names, colours, covering, strict=True)]
    listed = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return f"{key}: film with {listed} mask{'s' if len(items) > 1 else ''}"


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
    (study key, why), listed in their place (and on the first page of several)."""

    shown: int
    failed: tuple[tuple[str, str], ...] = ()
    more: bool = False
    """True when the dataset (or the split) has studies besides those shown and listed."""
    drawn_from: int | None = None
    """For a sample, how many studies it was drawn from (None: the first studies in file order)."""
    pages: tuple[Path, ...] = ()
    """The pages written, the first at the path asked for."""
    removed: tuple[Path, ...] = ()
    """Pages after the last one that an earlier run of the gallery had written, removed."""


def render_gallery(dataset_dir: str | Path, images_root: str | Path, out_html: str | Path, limit: int = 50,
                   split: str | None = None, width: int = 360, sample: int | None = None,
                   per_page: int = PER_PAGE) -> GalleryResult:
    """Write the gallery of the first ``limit`` studies that can be shown (optionally of one split), or with
    ``sample`` = a seed, of ``limit`` studies drawn at random (reproducibly for the seed) from the split or from all
    splits, shown in file order; the page's folder is created when missing. A study whose film, masks or unit record
    cannot be read is listed on the page with the reason in its place (not counted in ``limit``: a sample draws
    another; the page stops after :data:`_MAX_FAILED` of them); when none can be shown, nothing is written and the
    first study's error is raised. The dataset JSON is read as a stream: in file order only as far as the studies
    shown; for a sample once for the study keys and once for the studies drawn.

    More than ``per_page`` studies shown go on several pages, each self-contained: the first at ``out_html``, then
    ``STEM.p2.html``, ``STEM.p3.html``, ... beside it, each with links to the others, its own table of contents and
    filter, an index of every page's studies, and on the first page the list of studies not shown. Each such page
    names its first page in a ``<meta>`` tag: a file of a page's name without it is not replaced (a
    :class:`ConfigError` before anything is written), and pages after the last that an earlier run wrote are
    removed."""
    if limit < 1:
        raise ConfigError(f"limit must be at least 1, got {limit}")
    if per_page < 1:
        raise ConfigError(f"per_page must be at least 1, got {per_page}")
    (root, json_path), images_root = dataset_location(dataset_dir), Path(images_root)
    out = Path(out_html)
    with _Spool(out.parent) as spool:
        return _render(root, json_path, images_root, out, spool, limit, split, width, sample, per_page)


def _render(root: Path, json_path: Path, images_root: Path, out: Path, spool: _Spool, limit: int, split: str | None,
            width: int, sample: int | None, per_page: int) -> GalleryResult:
    """:func:`render_gallery`, each study's HTML kept in ``spool`` from when it is made until its page is written."""
    splits = SPLITS if split is None else (split,)
    frame = read_frame(root)  # released-frame masks are mapped back to each film's grid
    panels: list[tuple[int, _Panel]] = []  # (file position, panel)
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
            panels.append((pos, _study_panel(root, images_root, key, split_name, study, width, frame, spool)))
            shown += 1
        except InputError as exc:
            first_error = first_error or exc
            failed.append((key, str(exc)))
            body = (f"<div><h2>{html.escape(key)} · {html.escape(split_name)}</h2>"
                    + (f"<div class='film'>film <code>{html.escape(str(study['image_path']))}</code></div>"
                       if study.get("image_path") else "") +
                    f"<div class='sec'>not shown: {html.escape(str(exc))}</div></div>")
            panels.append((pos, _Panel(key, split_name, (_NOT_SHOWN,),
                                       spool.add(_study_div(key, split_name, (_NOT_SHOWN,), "study failed", body)),
                                       str(exc))))
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
    intro = [f"<p class='film'>Films under <code>{html.escape(str(images_root))}</code> (<code>--images</code>); "
             "each study names its film by its path there.</p>"]
    of_split = f" of split {html.escape(split)}" if split else ""
    if sample is not None:
        intro.append(f"<p>{shown} studies{of_split} drawn at random (seed {sample}) from {total}, in file order"
                     f"{'' if split else ' (train, val, test)'}.</p>")
    elif more:
        intro.append(f"<p>The first {shown} studies{of_split} in file order (train, val, test); the dataset has more "
                     "(<code>--limit</code>, <code>--split</code>, <code>--sample</code>).</p>")
    ordered = [panel for _pos, panel in sorted(panels, key=lambda item: item[0])]
    pages = _paginate(ordered, per_page)
    paths = [_page_path(out, n) for n in range(1, len(pages) + 1)]
    for path in paths[1:]:  # before anything is written
        if path.exists() and not _is_page_of(path, out):
            raise ConfigError(f"{path} exists and is not a page of the gallery {out.name} (its page "
                              f"{paths.index(path) + 1} would replace it); nothing written: move the file or choose "
                              "another --html")
    out.parent.mkdir(parents=True, exist_ok=True)
    if len(pages) == 1:
        parts = [_head(root), *intro]
        if failed:
            parts.append(f"<p class='failed'>{len(failed)} of {shown + len(failed)} studies could not be shown; each "
                         "is listed in its place with the reason.</p>")
        parts.append(_contents(ordered))
        _write_page(out, [*parts, *ordered, f"<script>{_JS}</script>"], spool)
    for i, path in enumerate(paths if len(pages) > 1 else ()):
        _write_page(path, _paged(root, intro, pages, [p.name for p in paths], i, per_page, shown, len(failed)), spool)
    removed = _remove_stale(out, len(pages))
    return GalleryResult(shown, tuple(failed), more, total, tuple(paths), tuple(removed))


def _paginate(panels: list[_Panel], per_page: int) -> list[list[_Panel]]:
    """The panels in pages of ``per_page`` studies shown; a study that could not be shown goes on the page of the
    shown study before it (the first page when none is)."""
    pages: list[list[_Panel]] = [[]]
    count = 0
    for panel in panels:
        if not panel.failed:
            if count == per_page:
                pages.append([])
                count = 0
            count += 1
        pages[-1].append(panel)
    return pages


def _page_path(out: Path, number: int) -> Path:
    """Where page ``number`` of the gallery whose first page is ``out`` goes: ``out`` itself, then beside it
    ``STEM.p2.html``, ``STEM.p3.html``, ..."""
    return out if number == 1 else out.with_name(f"{out.stem}.p{number}{out.suffix or '.html'}")


def _marker(out: Path) -> str:
    """The tag by which each page of a gallery of several names its first page (so a re-run replaces and removes only
    pages it wrote)."""
    return f"<meta name='{_MARKER_NAME}' content='{html.escape(out.name)}'>"


def _is_page_of(path: Path, out: Path) -> bool:
    """Whether ``path`` is a page the gallery whose first page is ``out`` wrote."""
    if not path.is_file():
        return False
    with path.open("rb") as fh:
        start = fh.read(512 + 6 * len(out.name.encode("utf-8")))
    return _marker(out).encode("utf-8") in start


def _remove_stale(out: Path, count: int) -> list[Path]:
    """Remove the pages after page ``count`` that an earlier run of the gallery whose first page is ``out`` wrote
    (files of the same names that it did not write stay); the removed ones, in page order."""
    if not out.parent.is_dir():
        return []
    pattern = re.compile(re.escape(out.stem) + r"\.p([1-9][0-9]*)" + re.escape(out.suffix or ".html"))
    stale = sorted((int(m.group(1)), path) for path in out.parent.iterdir()
                   if (m := pattern.fullmatch(path.name)) and int(m.group(1)) > max(count, 1))
    removed = []
    for _number, path in stale:
        if _is_page_of(path, out):
            path.unlink()
            removed.append(path)
    return removed


def _href(name: str, anchor: str = "") -> str:
    """A link's target (attribute-escaped): the page ``name`` of the same folder, optionally a study's anchor on it
    (``name`` empty: on this page)."""
    return html.escape(quote(name) + (f"#{_anchor(anchor)}" if anchor else ""))


def _page_numbers(count: int, i: int) -> list[int | None]:
    """The pages (from 0) the page row of page ``i`` of ``count`` links, None for a gap: every page up to
    :data:`ALL_PAGE_LINKS` pages, else the first, the last and those up to :data:`NEAR_PAGES` from page ``i`` (a gap
    of one page shows that page)."""
    if count <= ALL_PAGE_LINKS:
        return list(range(count))
    out: list[int | None] = []
    before = -1
    for j in sorted({0, count - 1, *range(max(0, i - NEAR_PAGES), min(count, i + NEAR_PAGES + 1))}):
        if j - before == 2:
            out.append(before + 1)
        elif j - before > 2:
            out.append(None)
        out.append(j)
        before = j
    return out


def _page_link(names: list[str], j: int, text: str, rel: str = "") -> str:
    """A link to page ``j`` (from 0) that takes the filter's choice along."""
    return f"<a class='pg' href='{_href(names[j])}'{f' rel={rel!r}' if rel else ''}>{text}</a>"


def _nav(names: list[str], i: int, per_page: int, shown: int) -> str:
    """Which studies the page shows, and the page links: previous, the pages' numbers (this one in bold; more than
    :data:`ALL_PAGE_LINKS` pages: :func:`_page_numbers`, and a link to every page in the index), next."""
    def link(j: int, text: str, rel: str = "") -> str:
        return _page_link(names, j, text, rel)

    numbers = " ".join("<span class='off'>&hellip;</span>" if j is None else
                       f"<b aria-current='page'>{j + 1}</b>" if j == i else link(j, str(j + 1))
                       for j in _page_numbers(len(names), i))
    prev = link(i - 1, "&lsaquo; previous", "prev") if i else "<span class='off'>&lsaquo; previous</span>"
    nxt = link(i + 1, "next &rsaquo;", "next") if i + 1 < len(names) else "<span class='off'>next &rsaquo;</span>"
    every = f" &middot; <a href='#pages'>all {len(names)} pages</a>" if len(names) > ALL_PAGE_LINKS else ""
    first, last = i * per_page + 1, min((i + 1) * per_page, shown)
    studies = f"study {first}" if first == last else f"studies {first}&ndash;{last}"
    return (f"<nav class='pages'>Page {i + 1} of {len(names)}, {studies} of {shown} (<code>--per-page</code> "
            f"{per_page}): {prev} {numbers} {nxt}{every}</nav>")


def _study_link(panel: _Panel, names: list[str], j: int, i: int, filtered: bool) -> str:
    """A link from page ``i`` to a study on page ``j`` (from 0), with the filter's attributes when ``filtered``."""
    attrs = "" if j == i else " class='pg'"
    if filtered:
        attrs += (f" data-split='{html.escape(panel.split)}' "
                  f"data-findings='{html.escape(' '.join(panel.findings))}'")
    return f"<a href='{_href('' if j == i else names[j], panel.key)}'{attrs}>{html.escape(panel.key)}</a>"


def _index(pages: list[list[_Panel]], names: list[str], i: int) -> str:
    """Every study of the gallery by page, linked to its place (a study's key found with the browser's search), with
    the filter's attributes so the filter narrows it too."""
    rows = []
    for j, page in enumerate(pages):
        links = " ".join(_study_link(p, names, j, i, True) for p in page)
        rows.append(f"<div><b>page {j + 1}{' (this page)' if j == i else ''}</b> {links}</div>")
    total = sum(len(page) for page in pages)
    every = ""
    if len(pages) > ALL_PAGE_LINKS:  # the page row links some pages only: every page here, where it points
        every = ("<p class='pages' id='pages'>Pages: " + " ".join(
            f"<b aria-current='page'>{j + 1}</b>" if j == i else _page_link(names, j, str(j + 1))
            for j in range(len(pages))) + "</p>")
    return (f"<details class='toc' id='index'><summary>Index: the {total} studies of the {len(pages)} pages, by page"
            f"</summary>{every}{''.join(rows)}</details>")


def _failures(pages: list[list[_Panel]], names: list[str], i: int, studies: int) -> str:
    """The studies that could not be shown: on the first page each with a link to its place and the reason, on the
    others a link to that list."""
    where = [(j, p) for j, page in enumerate(pages) for p in page if p.failed]
    if not where:
        return ""
    if i:
        here = sum(1 for j, _p in where if j == i)
        return (f"<p class='failed'>{len(where)} of {studies} studies could not be shown"
                f"{f' ({here} on this page, each in its place with the reason)' if here else ''}: "
                f"<a class='pg' href='{_href(names[0])}#failed'>the list on page 1</a>.</p>")
    items = "".join(f"<li>{_study_link(p, names, j, 0, False)} (page {j + 1}): {html.escape(p.reason or '')}</li>"
                    for j, p in where)
    return (f"<p class='failed' id='failed'>{len(where)} of {studies} studies could not be shown; each is listed "
            f"in its place with the reason:</p><ul class='failed'>{items}</ul>")


def _head(root: Path, marker: str = "", page: str = "", css: str = "") -> str:
    """A page's start: its title, style and heading (``marker``, ``page`` and ``css`` for a page of several)."""
    return (f"<!doctype html><meta charset='utf-8'>{marker}<title>ILS dataset: {html.escape(root.name)}{page}</title>"
            f"<style>{_CSS}{css}</style><h1>ILS dataset {html.escape(str(root))}</h1>")


def _paged(root: Path, intro: list[str], pages: list[list[_Panel]], names: list[str], i: int, per_page: int,
           shown: int, failed: int) -> list[str | _Panel]:
    """Page ``i`` (from 0) of a gallery of several pages, in parts (a panel stands for its study's HTML): the
    navigation above and below, the failures (listed on the first page), the contents of this page with the filter
    (every finding of the gallery), the index of every page's studies, and the page's studies."""
    every = [p for page in pages for p in page]
    nav = _nav(names, i, per_page, shown)
    head = _head(root, _marker(Path(names[0])), f" · page {i + 1} of {len(pages)}", _PAGES_CSS)
    return [head, *intro, nav, _failures(pages, names, i, shown + failed),
            _contents(pages[i], every, f"Contents of page {i + 1}"), _index(pages, names, i),
            *pages[i], nav, f"<script>{_PAGED_JS}</script>"]


def _write_page(path: Path, parts: list[str | _Panel], spool: _Spool) -> None:
    """Write a page from its parts, each panel's HTML read back from ``spool`` as its turn comes (one study's HTML
    in memory at a time)."""
    with path.open("w", encoding="utf-8") as fh:
        for part in parts:
            fh.write(spool.read(part.place) if isinstance(part, _Panel) else part)


class _Spool:
    """The studies' HTML (each with its thumbnail, about 30 KB) from when it is made until its page is written, in an
    unnamed temporary file (in the page's folder, or the nearest folder above it that exists; the system's
    temporary folder when that cannot be written), so that a gallery of thousands of studies holds one study's HTML
    in memory, not every page's. The file has no name: it is gone when closed, or when the process ends however."""

    def __init__(self, folder: Path) -> None:
        self.folder = next((f for f in (folder, *folder.parents) if f.is_dir()), None)
        self.fh: Any = None

    def __enter__(self) -> _Spool:
        try:
            self.fh = tempfile.TemporaryFile(dir=self.folder)
        except OSError:  # a folder that cannot be written: the page's own write names it
            self.fh = tempfile.TemporaryFile()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()

    def add(self, text: str) -> tuple[int, int]:
        """Keep ``text``; its place (offset, length in bytes) to read it back by."""
        data = text.encode("utf-8")
        offset = self.fh.seek(0, os.SEEK_END)
        self.fh.write(data)
        return offset, len(data)

    def read(self, place: tuple[int, int]) -> str:
        """The text kept at ``place``."""
        offset, length = place
        self.fh.seek(offset)
        return self.fh.read(length).decode("utf-8")


@dataclass(frozen=True)
class _Panel:
    """One study's place on the page: its key and split, the findings it has masks for (the filter's words) and
    where its HTML is kept (:class:`_Spool`)."""

    key: str
    split: str
    findings: tuple[str, ...]
    place: tuple[int, int]
    reason: str | None = None
    """Why the study could not be shown (None: it is)."""

    @property
    def failed(self) -> bool:
        return self.reason is not None


def _token(name: str) -> str:
    """A finding as one word of a ``data-findings`` list."""
    return "_".join(name.split())


def _study_panel(root: Path, images_root: Path, key: str, split_name: str, study: dict[str, Any],
                 width: int, frame: MaskFrame, spool: _Spool) -> _Panel:
    """One study's panel: the film (named by its path under the image root) with its masks, the section, the
    groundings and the pairs; an :class:`InputError` naming the file when the film, a mask or the unit record cannot
    be read."""
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
    names: list[str] = []  # per mask, the finding of its first pair
    for p in pairs["positive_pairs"]:
        if p["seg_mask_path"] not in masks:
            masks[p["seg_mask_path"]] = len(masks)
            names.append(str(p.get("target") or p["type"]))
    arrays = [mask_on_image(read_mask_png(root / MASK_DIR / path), image.shape, frame, root / MASK_DIR / path)
              for path in masks]
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(arrays))]
    colour_names = [_COLOUR_NAMES[i % len(_COLOUR_NAMES)] for i in range(len(arrays))]
    covering = _covering(arrays)
    rgb = _composite(np.asarray(pixels, dtype=np.uint8), arrays, colours, covering, width)
    rows = []
    for p in pairs["positive_pairs"]:
        i = masks[p["seg_mask_path"]]
        c, cover = _hex(colours[i]), covering[i]
        if cover is None:
            swatch, note = f"background:{c}", ""
        else:
            under = f"{names[cover[0]]} ({colour_names[cover[0]]})"
            swatch = f"border:2px solid {c}"
            note = (f"<br><span class='same'>{_COVER_WORDS[cover[1]]} {html.escape(under)}: drawn as an outer "
                    "outline</span>")
        rows.append(f"<tr><td><span class='sw' style='{swatch}'></span>{html.escape(p['type'])}{note}</td>"
                    f"<td>{html.escape(p['instruction'])}</td><td>{html.escape(p['answer'])}</td>"
                    f"<td>{html.escape(p['target'])}</td></tr>")
    for n in pairs["negative_pairs"]:
        rows.append(f"<tr class='neg'><td>{html.escape(n['type'])}</td><td>{html.escape(n['instruction'])}"
                    f"</td><td>{html.escape(n['answer'])}</td><td>{html.escape(n['target'])}</td></tr>")
    grounding = "".join(f"<li>{html.escape(line)}</li>" for line in _grounding_lines(unit, unit_file))
    findings = tuple(dict.fromkeys(_token(name) for name in names)) or (_NO_MASK,)
    alt = _alt(key, names, colour_names, covering)
    body = (f"<img loading='lazy' decoding='async' alt='{html.escape(alt)}' src='{_jpeg_data_url(rgb)}'>"
            f"<div><h2>{html.escape(key)} · {html.escape(split_name)} · {html.escape(study['section_name'])}</h2>"
            f"<div class='film'>film <code>{html.escape(study['image_path'])}</code></div>"
            + (f"<div class='sec read'>{html.escape(read)}</div>" if read else "") +
            f"<div class='sec'>{html.escape(study['section_content'])}</div>"
            + (f"<ul class='sec grounding'>{grounding}</ul>" if grounding else "") +
            "<table><tr><th>type</th><th>instruction</th><th>answer</th><th>target</th></tr>"
            + "".join(rows) + "</table></div>")
    return _Panel(key, split_name, findings, spool.add(_study_div(key, split_name, findings, "study", body)))


def _anchor(key: str) -> str:
    """The page anchor of a study (its key; a key with characters an id cannot hold has them replaced)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key) or "_"


def _study_div(key: str, split_name: str, findings: tuple[str, ...], cls: str, body: str) -> str:
    """A study's block with its anchor and the filter's attributes."""
    return (f"<div class='{cls}' id='{html.escape(_anchor(key))}' data-split='{html.escape(split_name)}' "
            f"data-findings='{html.escape(' '.join(findings))}'>{body}</div>")


def _contents(panels: list[_Panel], every: list[_Panel] | None = None, summary: str = "Contents") -> str:
    """The table of contents: per split, a link to each study (its findings as the link's title), and the filter
    (hidden until the script shows it) with the splits and findings of ``every`` study of the gallery (default: of
    ``panels``)."""
    every = panels if every is None else every
    splits = list(dict.fromkeys(p.split for p in every))
    special = {_NO_MASK: "no mask", _NOT_SHOWN: "not shown"}
    findings = sorted({f for p in every for f in p.findings if f not in special})
    opts_s = "".join(f"<option value='{html.escape(x)}'>{html.escape(x)}</option>" for x in splits)
    opts_f = "".join(f"<option value='{html.escape(x)}'>{html.escape(x.replace('_', ' '))}</option>"
                     for x in findings)
    opts_f += "".join(f"<option value='{word}'>{label}</option>" for word, label in special.items()
                      if any(p.findings == (word,) for p in every))
    parts = ["<p id='filters' hidden>Split <select id='f-split'><option value='all'>all</option>"
             f"{opts_s}</select> Finding <select id='f-finding'><option value='all'>all</option>{opts_f}</select> "
             f"<span id='f-count'></span></p><details class='toc' open><summary>{summary}</summary>"]
    for split_name in dict.fromkeys(p.split for p in panels):
        links = " ".join(
            f"<a href='#{html.escape(_anchor(p.key))}' data-split='{html.escape(p.split)}' "
            f"data-findings='{html.escape(' '.join(p.findings))}' "
            f"title='{html.escape(', '.join(f.replace('_', ' ') for f in p.findings))}'>{html.escape(p.key)}</a>"
            for p in panels if p.split == split_name)
        parts.append(f"<div><b>{html.escape(split_name)}</b> {links}</div>")
    parts.append("</details>")
    return "".join(parts)
