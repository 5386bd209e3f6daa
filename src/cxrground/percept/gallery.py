"""``cxrground percept gallery``: one static HTML page to review a built benchmark.

Cases are grouped by lesion and path; each case shows its stages in question order with the images
(relative links to the benchmark's PNGs, so the page works from ``file://`` while it keeps its place relative to
the benchmark folder; with ``embed`` the images are inlined as base64 data URLs and the page stands alone), the
full question text, the options and the right answer highlighted. Two ``<select>`` filters (lesion, path) drive a
little inline script. No external URLs, and no link to a file outside the benchmark folder: an image path that is
absolute, has ``..`` or resolves outside (:mod:`cxrground.percept.paths`) is shown as refused, and an image file
the benchmark names but does not hold is shown as missing (and listed by :func:`write_gallery`). The reviewer
sees ``key_id`` (it reveals the Stage-1 answer; the gallery is for people who review the benchmark, never for
models).
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cxrground.percept.paths import unsafe_reason
from cxrground.percept.schema import Benchmark, Case, load_benchmark
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.percept_templates import PATH_ABBREVIATIONS, PATHS, POINT_RGB

__all__ = ["GalleryPage", "render_gallery", "write_gallery"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;background:#111;color:#ddd}
h1{font-size:20px}h2{font-size:17px;margin:18px 0 6px}.case{border-top:1px solid #333;padding:10px 0}
.stage{display:flex;gap:14px;margin:8px 0}.q{white-space:pre-wrap;font-size:13px;max-width:720px}
img{width:240px;height:auto;border:1px solid #444}.opts{display:flex;gap:6px;flex-wrap:wrap}
.opt{font-size:12px;text-align:center}.right{color:#7f7;font-weight:bold}.right img{border:3px solid #7f7}
ol{margin:4px 0;padding-left:22px;font-size:13px}.meta{font-size:12px;color:#999}
.sw{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:4px}
.missing{color:#f88}
"""

_JS = """
function applyFilter(){
  var l=document.getElementById('f-lesion').value, p=document.getElementById('f-path').value, n=0;
  document.querySelectorAll('.case').forEach(function(c){
    var show=(l==='all'||c.dataset.lesion===l)&&(p==='all'||c.dataset.path===p);
    c.style.display=show?'':'none'; if(show){n++;}
  });
  document.querySelectorAll('.group').forEach(function(g){
    var any=g.querySelector('.case:not([style*="none"])'); g.style.display=any?'':'none';
  });
  document.getElementById('count').textContent=n;
}
document.getElementById('f-lesion').addEventListener('change',applyFilter);
document.getElementById('f-path').addEventListener('change',applyFilter);
applyFilter();
"""


#: Prefix of a link that was refused (the rest is the reason shown instead of the image).
_REFUSED = "\0refused:"


@dataclass(frozen=True)
class GalleryPage:
    """What :func:`write_gallery` wrote: the number of cases shown and the benchmark-relative image paths that
    the benchmark names but does not hold (shown as missing on the page)."""

    cases: int
    missing: tuple[str, ...] = ()


def _hex(colour: tuple[float, float, float]) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in colour)


def _img(link: str, alt: str) -> str:
    if link.startswith(_REFUSED):
        return f"<span class='meta missing'>{html.escape(alt)}: {html.escape(link[len(_REFUSED):])}</span>"
    return f"<img loading='lazy' src='{html.escape(link)}' alt='{html.escape(alt)}'>"


def _options(texts: Sequence[str], answers: Sequence[int], swatches: Sequence[str | None] = ()) -> str:
    items = []
    for i, text in enumerate(texts, start=1):
        sw = swatches[i - 1] if i - 1 < len(swatches) and swatches[i - 1] else None
        dot = f"<span class='sw' style='background:{sw}'></span>" if sw else ""
        cls = " class='right'" if i in answers else ""
        items.append(f"<li{cls}>{dot}{html.escape(text)}{' ✓' if i in answers else ''}</li>")
    return "<ol>" + "".join(items) + "</ol>"


def _stage(title: str, question: str, options_html: str, images_html: str = "") -> str:
    return (f"<div class='stage'>{images_html}<div><b>{html.escape(title)}</b>"
            f"<div class='q'>{html.escape(question)}</div>{options_html}</div></div>")


def _case_html(key: str, case: Case, link: Any) -> str:
    lesion, path = case.lesion_of(key), case.path(key)
    det = case.detection_qa
    parts = [f"<div class='case' data-lesion='{html.escape(lesion)}' data-path='{html.escape(path)}'>",
             f"<div class='meta'>{html.escape(key)} · {html.escape(case.case_id or '')} · "
             f"{PATH_ABBREVIATIONS.get(path, path)} · dicom {html.escape(case.dicom_id)}</div>",
             _stage("Stage 1 · detection", det.question, _options(det.answer_options, [det.answer_index]),
                    _img(link(det.relative_path), "stage 1") if det.relative_path else "")]
    cq = case.contour_qa
    if cq is not None:
        ev = cq.contour_eval_qa
        parts.append(_stage("Stage 2 · contour evaluation", ev.question,
                            _options(ev.answer_options, [ev.answer_index]), _img(link(ev.relative_path), "stage 2")))
        exp, con = cq.contour_revision_qa_expansion, cq.contour_revision_qa_contraction
        note = "" if not cq.no_deformation else " (carried, not asked on this path)"
        if exp is not None and con is not None:
            texts = [f"{o.color} point" if o.point is not None else o.color for o in exp.answer_options]
            sw = [_hex(POINT_RGB[o.color]) if o.color in POINT_RGB else None for o in exp.answer_options]
            pts = _img(link(exp.relative_path), "stage 3 points") if exp.relative_path else ""
            parts.append(_stage("Stage 3a · expansion" + note, cq.initial_context + "\n\n" + exp.question,
                                _options(texts, exp.answer_index, sw), pts))
            parts.append(_stage("Stage 3b · contraction" + note, con.question,
                                _options(texts, con.answer_index, sw)))
        rev = cq.contour_revision_qa_revision_result
        if rev is not None:
            imgs = "".join(
                f"<div class='opt{' right' if k == rev.answer_index else ''}'>"
                f"{_img(link(o.relative_path), f'option {k}') if o.relative_path else 'not rendered'}<br>({k})"
                f"{' ✓' if k == rev.answer_index else ''}</div>"
                for k, o in enumerate(rev.answer_options, start=1))
            parts.append(_stage("Stage 3c · revision result" + note, rev.question,
                                f"<div class='opts'>{imgs}</div>"))
    attrs = case.attribute_extraction_qa
    if attrs is not None:
        for name, qa in (("distribution", attrs.distribution), ("location", attrs.location),
                         ("severity", attrs.severity), ("comparison", attrs.comparison)):
            answers = qa.answer_index if isinstance(qa.answer_index, list) else [qa.answer_index]
            parts.append(_stage(f"Stage 4 · {name}", qa.question, _options(qa.answer_options, answers)))
    parts.append("</div>")
    return "".join(parts)


def render_gallery(bench: str | Path | Benchmark, out_html: str | Path) -> int:
    """Write the gallery page of a benchmark folder; returns the number of cases shown."""
    return write_gallery(bench, out_html).cases


#: MIME types of the image files a page inlines (by suffix); others are inlined as PNG.
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}


def write_gallery(bench: str | Path | Benchmark, out_html: str | Path, embed: bool = False) -> GalleryPage:
    """Write the gallery page of a benchmark folder; returns the cases shown and the missing image files. The
    images are linked relatively (move the page together with the benchmark folder), or with ``embed`` inlined as
    base64 data URLs (a page that works on its own, e.g. mailed; several times the size of the PNGs' total)."""
    benchmark = bench if isinstance(bench, Benchmark) else load_benchmark(bench)
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    root = benchmark.root or Path(".")
    missing: dict[str, None] = {}

    def link(rel: str | None) -> str:
        if rel is None:
            return ""
        reason = unsafe_reason(root.resolve(), rel)
        if reason is not None:
            return f"{_REFUSED}image path {rel!r} {reason}; not shown"
        if not (root / rel).is_file():
            missing[rel] = None
            return f"{_REFUSED}image {rel} is missing from the benchmark folder"
        if embed:
            data = base64.b64encode((root / rel).read_bytes()).decode("ascii")
            return f"data:{_MIME.get(Path(rel).suffix.lower(), 'image/png')};base64,{data}"
        return Path(os.path.relpath((root / rel).resolve(), out.parent.resolve())).as_posix()

    lesions = [lesion for lesion in LESIONS if any(c.lesion_of(k) == lesion for k, c in benchmark.cases.items())]
    sel_l = "".join(f"<option value='{x}'>{x}</option>" for x in lesions)
    sel_p = "".join(f"<option value='{p}'>{PATH_ABBREVIATIONS[p]} ({p})</option>" for p in PATHS)
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>CheXpercept benchmark: {html.escape(root.name)}</title><style>{_CSS}</style></head><body>",
             f"<h1>CheXpercept benchmark {html.escape(root.name)} · <span id='count'>{len(benchmark.cases)}</span>"
             " cases shown</h1>",
             "<p>Lesion <select id='f-lesion'><option value='all'>all</option>" + sel_l + "</select> "
             "Path <select id='f-path'><option value='all'>all</option>" + sel_p + "</select> "
             "<span class='meta'>right answers are green and marked ✓</span></p>"]
    for lesion in lesions:
        for path in PATHS:
            keys = sorted(k for k, c in benchmark.cases.items() if c.lesion_of(k) == lesion and c.path(k) == path)
            if not keys:
                continue
            parts.append(f"<div class='group'><h2>{html.escape(lesion)} · {PATH_ABBREVIATIONS[path]} "
                         f"({len(keys)})</h2>")
            parts += [_case_html(k, benchmark.cases[k], link) for k in keys]
            parts.append("</div>")
    parts.append(f"<script>{_JS}</script></body></html>")
    out.write_text("".join(parts), encoding="utf-8")
    return GalleryPage(len(benchmark.cases), tuple(missing))
